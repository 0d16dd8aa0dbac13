// SPDX-License-Identifier: Apache-2.0
// Checkpoint benchmark: save and load bandwidth of <shardlib/io.hpp> next to writing and reading
// the same bytes with plain write()/read() of one file by one thread (this disk's limit as a
// program would reach it). One JSON record per case on stdout, progress on stderr.
// Driven by `benchmarks/run io`; run alone as
//   bench_io --backend threads --devices 8 [--bytes 268435456] [--reps 5] [--cold] [--dir DIR]
//   mpirun -np 8 bench_io --backend mpi
// Cases (a float tensor of --bytes, 1024 columns):
//   save S0            Spec<"d", none> saved (durable: fsync)  | plain write + fsync of one file
//   load S0->S0        loaded with the spec it was saved with  | plain read of one file
//   load S0->S1        loaded split by columns (strided reads) | plain read of one file
//   load S0->R         loaded replicated (one read, broadcast) | plain read of one file
// Loads read from the page cache when the file is in it (as after a save); with --cold, both
// files' cached pages are dropped (posix_fadvise DONTNEED) before every save, load, plain write
// and plain read, so each starts from the same page-cache state. Medians of --reps (5).
#include <shardlib/io.hpp>
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;
using M1 = sl::Mesh<"d">;
using S0 = sl::Spec<"d", none>;
using S1 = sl::Spec<none, "d">;
using Rep = sl::Spec<none, none>;
template <class S>
using Tensor = sl::DistributedTensor<float, M1, S>;

namespace {

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The baseline: one thread writes (and fsyncs) or reads `n` bytes of one file.
void plain_write(const std::string& path, const char* buf, std::size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("bench_io: cannot create " + path);
  for (std::size_t done = 0; done < n;) {
    const ssize_t w = ::write(fd, buf + done, n - done);
    if (w <= 0) throw std::runtime_error("bench_io: write failed on " + path);
    done += static_cast<std::size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
}
void plain_read(const std::string& path, char* buf, std::size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("bench_io: cannot open " + path);
  for (std::size_t done = 0; done < n;) {
    const ssize_t r = ::read(fd, buf + done, n - done);
    if (r <= 0) throw std::runtime_error("bench_io: read failed on " + path);
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--bytes", bench::Takes::integer},
                     {"--reps", bench::Takes::integer},
                     {"--dir", bench::Takes::word},
                     {"--cold"}});
  auto rt = sl::Runtime::from_args(argc, argv, 8);
  const long long bytes = bench::arg(argc, argv, "--bytes", 256ll << 20);
  const int reps = static_cast<int>(bench::arg(argc, argv, "--reps", 5));
  const bool cold = bench::has_flag(argc, argv, "--cold");
  const std::string dir = bench::text_arg(argc, argv, "--dir", "/tmp");

  rt.spmd([&](sl::Context& ctx) {
    auto& world = ctx.world();
    std::int64_t pid = ::getpid();  // device 0's: the same file names on every device
    world.broadcast(&pid, 1, bench::DType::i64, 0);
    const std::string ck = dir + "/bench_io_" + std::to_string(pid) + ".h5";
    const std::string plain = dir + "/bench_io_" + std::to_string(pid) + ".bin";
    bench::warm_up(world);
    const int n = ctx.num_devices();
    const bool mpi = ctx.backend() == "mpi";
    const std::int64_t cols = 1024, rows = std::max<long long>(bytes / 4 / cols / n, 1) * n;
    const auto total = static_cast<std::size_t>(rows * cols) * sizeof(float);
    M1 mesh(ctx, {n});
    auto t = Tensor<S0>::random(mesh, {rows, cols}, 1);
    std::vector<char> buf(ctx.device() == 0 ? total : 0);
    if (ctx.device() == 0) std::memset(buf.data(), 1, buf.size());

    // Seconds of `f` on all devices (the slowest), median of `reps`; `before` runs untimed.
    auto timed = [&](auto&& f, auto&& before) {
      std::vector<double> ts;
      for (int r = 0; r < reps; ++r) {
        before();
        world.barrier();
        const auto t0 = bench::Clock::now();
        f();
        double s = std::chrono::duration<double>(bench::Clock::now() - t0).count();
        world.all_reduce(&s, &s, 1, bench::DType::f64, bench::Op::max);
        ts.push_back(s);
      }
      return bench::median(ts);
    };
    auto drop = [&] {
      if (cold && ctx.device() == 0) {
        drop_cache(ck);
        drop_cache(plain);
      }
    };
    auto report = [&](const char* part, const std::string& name, double ours, const char* base, double base_s) {
      if (ctx.device() != 0) return;
      const double gbps = static_cast<double>(total) / ours / 1e9, base_gbps = static_cast<double>(total) / base_s / 1e9;
      std::printf(
          "{\"bench\": \"io\", \"part\": \"%s\", \"name\": \"%s\", \"backend\": \"%s\", \"devices\": %d, "
          "\"bytes\": %zu, \"seconds\": %.6g, \"GBps\": %.4g, \"baseline\": \"%s\", \"baseline_seconds\": %.6g, "
          "\"baseline_GBps\": %.4g, \"fraction_of_baseline\": %.4g, \"cache\": \"%s\"}\n",
          part, name.c_str(), mpi ? "mpi" : "threads", n, total, ours, gbps, base, base_s, base_gbps, base_s / ours,
          cold ? "cold" : "warm");
      std::fflush(stdout);
      std::fprintf(stderr, "  %-14s %-7s %d devices %6.0f MiB  %8.1f ms %6.2f GB/s  (%s: %8.1f ms %6.2f GB/s)  x%.2f\n",
                   name.c_str(), mpi ? "mpi" : "threads", n, static_cast<double>(total) / (1 << 20), ours * 1e3, gbps, base,
                   base_s * 1e3, base_gbps, base_s / ours);
    };

    const double base_w = timed([&] { if (ctx.device() == 0) plain_write(plain, buf.data(), total); }, drop);
    const double save = timed([&] { sl::io::save(ck, {{"t", t}}); }, drop);
    report("save", "save S0", save, "plain write+fsync, 1 thread", base_w);

    const double base_r = timed([&] { if (ctx.device() == 0) plain_read(plain, buf.data(), total); }, drop);
    const double l0 = timed([&] { auto x = sl::io::load<Tensor<S0>>(mesh, ck, "t"); }, drop);
    report("load", "load S0->S0", l0, "plain read, 1 thread", base_r);
    const double l1 = timed([&] { auto x = sl::io::load<Tensor<S1>>(mesh, ck, "t"); }, drop);
    report("load", "load S0->S1", l1, "plain read, 1 thread", base_r);
    const double lr = timed([&] { auto x = sl::io::load<Tensor<Rep>>(mesh, ck, "t"); }, drop);
    report("load", "load S0->R", lr, "plain read, 1 thread", base_r);
    world.barrier();
    if (ctx.device() == 0) {
      ::unlink(ck.c_str());
      ::unlink(plain.c_str());
    }
  });
  return 0;
}
