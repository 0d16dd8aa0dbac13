// SPDX-License-Identifier: Apache-2.0
// The gpt example's own data: a corpus of tokens read from files, split into a training and a
// validation part, served as batches laid out by a recipe's token spec.
//
// - A text file (any name but *.bin): its bytes are the tokens (byte level, vocabulary 256).
// - A *.bin file: little-endian uint16 tokens, as nanoGPT's prepare.py writes them (vocabulary:
//   the largest token + 1, unless the caller says more).
// - A directory: its *.md and *.txt files in name order, concatenated (the project's docs/ is
//   the corpus the example trains on by default).
//
// A file is mapped (mmap), not read: each device reads the tokens of the sequences of its own
// block of each batch, so each touches only those pages.
#pragma once

#include "gpt.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gpt {

/// The tokens of a file or a directory of text files (see the file comment). Copies share the
/// mapping. Throws std::runtime_error naming the path when it is missing, empty or unreadable,
/// and when a *.bin file has an odd number of bytes.
class Corpus {
 public:
  static Corpus open(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec || !fs::exists(status)) throw std::runtime_error("gpt: --data '" + path + "': no such file or directory");
    Corpus c;
    c.path_ = path;
    if (fs::is_directory(status)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(path))
        if (e.is_regular_file() && (e.path().extension() == ".md" || e.path().extension() == ".txt")) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      auto bytes = std::make_shared<std::vector<std::uint8_t>>();
      for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        if (!in) throw std::runtime_error("gpt: --data '" + path + "': cannot read '" + f.string() + "'");
        bytes->insert(bytes->end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      if (bytes->empty())
        throw std::runtime_error("gpt: --data '" + path + "': the directory has no non-empty *.md or *.txt file");
      c.data_ = std::shared_ptr<const std::uint8_t>(bytes, bytes->data());
      c.bytes_ = static_cast<std::int64_t>(bytes->size());
      c.width_ = 1;
      c.what_ = std::to_string(files.size()) + " text files of " + path + ", bytes as tokens";
    } else {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw std::runtime_error("gpt: --data '" + path + "': " + std::strerror(errno));
      struct stat st {};
      if (::fstat(fd, &st) != 0 || st.st_size == 0) {
        ::close(fd);
        throw std::runtime_error("gpt: --data '" + path + "': the file is empty");
      }
      void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) throw std::runtime_error("gpt: --data '" + path + "': mmap: " + std::strerror(err));
      const auto n = static_cast<std::size_t>(st.st_size);
      c.data_ = std::shared_ptr<const std::uint8_t>(static_cast<const std::uint8_t*>(p), [n](const std::uint8_t* q) {
        ::munmap(const_cast<std::uint8_t*>(q), n);
      });
      c.bytes_ = static_cast<std::int64_t>(st.st_size);
      c.width_ = fs::path(path).extension() == ".bin" ? 2 : 1;
      if (c.width_ == 2 && c.bytes_ % 2 != 0)
        throw std::runtime_error("gpt: --data '" + path + "': a .bin file holds uint16 tokens, but it has an odd number of bytes (" +
                                 std::to_string(c.bytes_) + ")");
      c.what_ = c.width_ == 2 ? "uint16 tokens of " + path : "the bytes of " + path;
    }
    c.vocab_ = 256;
    if (c.width_ == 2) {  // the largest token + 1 (one pass over the file, once)
      std::int64_t top = 0;
      for (std::int64_t i = 0; i < c.size(); ++i) top = std::max(top, c.token(i));
      c.vocab_ = top + 1;
    }
    return c;
  }

  /// Tokens in the corpus.
  std::int64_t size() const noexcept { return bytes_ / width_; }
  /// Token `i` (0 <= i < size()).
  std::int64_t token(std::int64_t i) const noexcept {
    const std::uint8_t* p = data_.get() + i * width_;
    return width_ == 1 ? p[0] : static_cast<std::int64_t>(p[0] | (p[1] << 8));
  }
  /// The vocabulary the tokens need: 256 for bytes, the largest token + 1 for uint16.
  std::int64_t vocab() const noexcept { return vocab_; }
  const std::string& path() const noexcept { return path_; }
  /// What the tokens are, for the program's first lines ("the bytes of input.txt").
  const std::string& description() const noexcept { return what_; }

 private:
  std::shared_ptr<const std::uint8_t> data_;
  std::int64_t bytes_ = 0, width_ = 1, vocab_ = 256;
  std::string path_, what_;
};

/// Batches of a Corpus for a model of sequences of `seq` tokens: the first 90 % of the tokens
/// train, the last 10 % validate. Training sequence n of batch `step` (of B sequences) is
/// sequence step·B + n of the stream, which starts at a position drawn from (seed, step·B + n)
/// in the training part (so a pipeline's micro-batch k of b sequences, batch k, holds the
/// global batch's sequences [k b, (k + 1) b)); validation batch k holds the
/// consecutive sequences [k B, (k + 1) B) of the validation part. The same sequences on any
/// mesh: each device fills its block of [B, S] inputs and targets (the next tokens).
class CorpusStream {
 public:
  /// Throws std::invalid_argument when either part is shorter than one sequence (S + 1 tokens).
  CorpusStream(Corpus corpus, std::int64_t seq, std::uint64_t seed) : c_(std::move(corpus)), seq_(seq), seed_(seed) {
    split_ = c_.size() - std::max<std::int64_t>(c_.size() / 10, seq + 1);
    if (split_ < seq + 1)
      throw std::invalid_argument("gpt: --data '" + c_.path() + "' has " + std::to_string(c_.size()) +
                                  " tokens: too few for one sequence of --seq " + std::to_string(seq) +
                                  " tokens (and its next token) in each of its training and validation parts (" +
                                  std::to_string(2 * (seq + 1)) + " at least)");
  }
  const Corpus& corpus() const noexcept { return c_; }
  std::int64_t train_tokens() const noexcept { return split_; }
  std::int64_t val_tokens() const noexcept { return c_.size() - split_; }
  /// Validation batches of `batch` sequences (at least 1; the last may repeat the first sequences).
  std::int64_t val_batches(std::int64_t batch) const noexcept {
    return std::max<std::int64_t>(1, (val_tokens() - 1) / seq_ / batch);
  }

  /// The inputs and targets of training batch `step` ([B, S] each), laid out by `Tensor`'s spec.
  template <class Tensor, class Mesh>
  std::pair<Tensor, Tensor> batch(const Mesh& mesh, std::int64_t batch, std::int64_t step) const {
    const std::int64_t span = split_ - seq_;  // start positions 0 .. span - 1 (a target inside the part)
    const std::uint64_t seed = seed_;
    return fill<Tensor>(mesh, batch, [=](std::int64_t n) {  // keyed on the sequence's index in the stream
      return static_cast<std::int64_t>(mix(seed, static_cast<std::uint64_t>(step * batch + n)) % static_cast<std::uint64_t>(span));
    });
  }
  /// The inputs and targets of validation batch `k` (0 <= k < val_batches(B)).
  template <class Tensor, class Mesh>
  std::pair<Tensor, Tensor> val_batch(const Mesh& mesh, std::int64_t batch, std::int64_t k) const {
    const std::int64_t first = split_, count = (val_tokens() - 1) / seq_, seq = seq_;
    return fill<Tensor>(mesh, batch, [=](std::int64_t n) { return first + ((k * batch + n) % count) * seq; });
  }

 private:
  template <class Tensor, class Mesh, class Start>
  std::pair<Tensor, Tensor> fill(const Mesh& mesh, std::int64_t batch, Start start) const {
    Tensor ids = Tensor::uninitialized(mesh, {batch, seq_});
    Tensor targets = Tensor::uninitialized(mesh, {batch, seq_});
    const Corpus c = c_;
    shardlib::parallel_for(ids, targets, [c, start](const shardlib::Index<2>& i, std::int64_t& x, std::int64_t& y) {
      const std::int64_t at = start(i[0]) + i[1];
      x = c.token(at);
      y = c.token(at + 1);
    });
    return {ids, targets};
  }
  static std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
    std::uint64_t z = a * 0x9E3779B97F4A7C15ull + (b + 1) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  Corpus c_;
  std::int64_t seq_ = 0, split_ = 0;
  std::uint64_t seed_ = 0;
};

/// The example's data, whichever the command line chose: the synthetic TokenStream (no
/// validation part) or a CorpusStream; one type, so that each recipe's training compiles once.
class DataStream {
 public:
  /// The synthetic token stream.
  explicit DataStream(TokenStream synthetic) : synthetic_(std::make_shared<TokenStream>(std::move(synthetic))) {}
  explicit DataStream(CorpusStream corpus) : corpus_(std::make_shared<CorpusStream>(std::move(corpus))) {}
  /// The corpus, or null for the synthetic stream.
  const CorpusStream* corpus() const noexcept { return corpus_.get(); }

  /// The inputs and targets of training batch `step` ([B, S] each), laid out by `Tensor`'s spec.
  template <class Tensor, class Mesh>
  std::pair<Tensor, Tensor> batch(const Mesh& mesh, std::int64_t batch, std::int64_t step) const {
    if (corpus_) return corpus_->template batch<Tensor>(mesh, batch, step);
    return synthetic_->template batch<Tensor>(mesh, batch, step);
  }
  /// Validation batches of `batch` sequences: 0 for the synthetic stream.
  std::int64_t val_batches(std::int64_t batch) const noexcept { return corpus_ ? corpus_->val_batches(batch) : 0; }
  template <class Tensor, class Mesh>
  std::pair<Tensor, Tensor> val_batch(const Mesh& mesh, std::int64_t batch, std::int64_t k) const {
    if (!corpus_) throw std::logic_error("gpt: the synthetic stream has no validation part");
    return corpus_->template val_batch<Tensor>(mesh, batch, k);
  }

 private:
  std::shared_ptr<TokenStream> synthetic_;
  std::shared_ptr<CorpusStream> corpus_;
};

}  // namespace gpt
