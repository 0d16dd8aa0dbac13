// SPDX-License-Identifier: Apache-2.0
/// @file
/// Who holds which tensor of a save or a load. Each device passes the tensors it holds: every
/// device the same list (the usual case), or each device its own (a pipeline stage's devices hold
/// their stage's layers only). The devices all-gather their lists; every device then knows the
/// union of the names and, for each, the devices that hold it, with a record each holder adds
/// (its block, its shape...). Every device computes the same plan from the same records, so the
/// checks made on them throw alike everywhere.
#pragma once
#include <shardlib/collectives/communicator.hpp>
#include <shardlib/sharding/block.hpp>
#include <shardlib/sharding/reshard.hpp>

#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlib::io::detail {

/// Byte-level serialisation of the metadata the devices exchange.
struct Writer {
  std::vector<unsigned char> bytes;
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void box(const ShardBox& b) {
    u64(static_cast<std::uint64_t>(b.rank));
    for (int d = 0; d < b.rank; ++d) {
      u64(static_cast<std::uint64_t>(b.offset[static_cast<std::size_t>(d)]));
      u64(static_cast<std::uint64_t>(b.extent[static_cast<std::size_t>(d)]));
    }
  }
  void shape(const std::vector<std::int64_t>& s) {
    u64(s.size());
    for (auto x : s) u64(static_cast<std::uint64_t>(x));
  }
};
struct Reader {
  const unsigned char* data;
  std::size_t size;
  std::size_t at = 0;
  explicit Reader(const std::vector<unsigned char>& v) : data(v.data()), size(v.size()) {}
  explicit Reader(const std::string& s) : data(reinterpret_cast<const unsigned char*>(s.data())), size(s.size()) {}
  std::uint64_t u64() {
    if (size - at < 8) throw std::length_error("shardlib::io: a truncated metadata record");
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{data[at++]} << (8 * i);
    return v;
  }
  std::string str() {
    const auto n = static_cast<std::size_t>(u64());
    if (n > size - at) throw std::length_error("shardlib::io: a truncated metadata record");
    std::string s(reinterpret_cast<const char*>(data + at), n);
    at += n;
    return s;
  }
  ShardBox box() {
    ShardBox b;
    b.rank = static_cast<int>(u64());
    for (int d = 0; d < b.rank; ++d) {
      b.offset[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(u64());
      b.extent[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(u64());
    }
    return b;
  }
  std::vector<std::int64_t> shape() {
    std::vector<std::int64_t> s(static_cast<std::size_t>(u64()));
    for (auto& x : s) x = static_cast<std::int64_t>(u64());
    return s;
  }
};

/// The tensors of one save or load over all devices.
struct Holding {
  int devices = 0;
  std::vector<std::string> names;                      ///< the union: device 0's names, then device 1's new ones, ...
  std::vector<int> local;                              ///< union index -> this device's index in its own list, or -1
  std::vector<std::vector<int>> holders;               ///< union index -> the devices that hold it, ascending
  std::vector<std::vector<std::string>> records;       ///< union index -> each holder's record (holders' order)
  /// Whether every device holds tensor i (then the usual replica rules apply to it).
  bool everywhere(std::size_t i) const { return static_cast<int>(holders[i].size()) == devices; }
  bool any_partial() const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (!everywhere(i)) return true;
    return false;
  }
};

/// All-gathers every device's (name, record) list (collective over `world`).
inline Holding gather_holding(coll::Communicator& world, const std::vector<std::string>& names,
                              const std::vector<std::string>& records) {
  Writer w;
  w.u64(names.size());
  for (std::size_t k = 0; k < names.size(); ++k) w.str(names[k]), w.str(records[k]);
  const int n = world.size();
  std::uint64_t mine = w.bytes.size();
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(n));
  world.all_gather(&mine, sizes.data(), 1, coll::DType::u64);
  std::vector<std::size_t> counts(sizes.begin(), sizes.end());
  std::size_t total = 0;
  for (auto c : counts) total += c;
  std::vector<unsigned char> all(total);
  world.all_gather(w.bytes.data(), all.data(), std::span<const std::size_t>(counts), coll::DType::u8);

  Holding h;
  h.devices = n;
  std::map<std::string, std::size_t> index;
  std::size_t at = 0;
  for (int d = 0; d < n; ++d) {
    Reader r{all};
    r.at = at;
    at += counts[static_cast<std::size_t>(d)];
    const auto count = r.u64();
    for (std::uint64_t k = 0; k < count; ++k) {
      std::string name = r.str(), record = r.str();
      auto [it, fresh] = index.try_emplace(name, h.names.size());
      if (fresh) {
        h.names.push_back(name);
        h.local.push_back(-1);
        h.holders.emplace_back();
        h.records.emplace_back();
      }
      h.holders[it->second].push_back(d);
      h.records[it->second].push_back(std::move(record));
      if (d == world.rank()) h.local[it->second] = static_cast<int>(k);
    }
  }
  return h;
}

/// For the holders' blocks `boxes` of one tensor: 1 for the first holder of each distinct
/// non-empty block (the one that writes it, or whose read counts towards its checksum), else 0.
inline std::vector<char> first_of_each_block(const std::vector<ShardBox>& boxes) {
  std::vector<char> first(boxes.size(), 0);
  for (std::size_t k = 0; k < boxes.size(); ++k) {
    if (boxes[k].num_elements() == 0) continue;
    bool seen = false;
    for (std::size_t j = 0; j < k && !seen; ++j) seen = first[j] && boxes[j] == boxes[k];
    first[k] = !seen;
  }
  return first;
}

}  // namespace shardlib::io::detail
