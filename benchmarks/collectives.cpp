// SPDX-License-Identifier: Apache-2.0
// Collectives benchmark: one JSON record per (collective, size) on stdout, progress on stderr.
// Driven by `benchmarks/run collectives`; run alone as
//   bench_collectives --backend threads --devices 8 [--min-bytes 8] [--max-bytes 67108864]
//   mpirun -np 4 bench_collectives --backend mpi
//
// Sizes follow nccl-tests: `bytes` is the whole buffer (all_gather: the output; reduce_scatter:
// the input; all_reduce: the buffer). algbw = bytes / time; busbw = algbw × (n-1)/n for
// all_gather and reduce_scatter, × 2(n-1)/n for all_reduce.
//
// Baselines, measured in the same run:
// - threads: memcpy over all cores (one thread per core copying its share), the physical limit
//   of a shared-memory copy, for the bytes that must move: (n-1) × bytes for all_gather and
//   reduce_scatter, 2(n-1) × bytes for all_reduce, summed over the devices.
// - mpi: the raw MPI call (MPI_Allgather, MPI_Reduce_scatter, MPI_Allreduce) on the same
//   buffers, alternated with ours.
#include <shardlib/runtime/runtime.hpp>

#include "common.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace sl = shardlib;
using sl::coll::DType;
using sl::coll::Op;
using bench::Clock;
using bench::median;

namespace {

enum class Coll { all_gather, reduce_scatter, all_reduce };
const char* coll_name(Coll c) {
  return c == Coll::all_gather ? "all_gather" : c == Coll::reduce_scatter ? "reduce_scatter" : "all_reduce";
}
double bus_factor(Coll c, int n) {
  return c == Coll::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}
// Bytes that must cross between devices, summed over all devices.
double must_move(Coll c, int n, double bytes) { return c == Coll::all_reduce ? 2.0 * (n - 1) * bytes : (n - 1) * bytes; }

// memcpy over all cores: `volume` bytes copied in total, each core copying `chunk`-byte blocks
// between its own buffers (the working set of the collective it stands for). Median of 5.
double memcpy_seconds(double volume, std::size_t chunk) {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  chunk = std::max<std::size_t>(chunk, 64);
  std::vector<std::vector<char>> src(cores, std::vector<char>(chunk, 1)), dst(cores, std::vector<char>(chunk, 0));
  const auto per_core = static_cast<std::size_t>(volume / cores);
  // Thread start-up is not timed: each thread times its own copies after a common start.
  auto run = [&] {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> took(cores);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < cores; ++t)
      ts.emplace_back([&, t] {
        ++ready;
        while (!go.load()) std::this_thread::yield();
        auto t0 = Clock::now();
        for (std::size_t done = 0; done < per_core; done += chunk)
          std::memcpy(dst[t].data(), src[t].data(), std::min(chunk, per_core - done));
        took[t] = std::chrono::duration<double>(Clock::now() - t0).count();
      });
    while (ready.load() != static_cast<int>(cores)) std::this_thread::yield();
    go.store(true);
    for (auto& t : ts) t.join();
    return *std::max_element(took.begin(), took.end());
  };
  run();
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) times.push_back(run());
  return median(times);
}

struct Buffers {
  std::vector<float> send, recv;
};

// One call of collective `c` over `bytes` (the nccl-tests size) on float buffers.
void call(sl::coll::Communicator& comm, Coll c, Buffers& b, std::size_t elems) {
  const auto n = static_cast<std::size_t>(comm.size());
  switch (c) {
    case Coll::all_gather: comm.all_gather(b.send.data(), b.recv.data(), elems / n, DType::f32); break;
    case Coll::reduce_scatter: comm.reduce_scatter(b.send.data(), b.recv.data(), elems / n, DType::f32, Op::sum); break;
    case Coll::all_reduce: comm.all_reduce(b.send.data(), b.recv.data(), elems, DType::f32, Op::sum); break;
  }
}

#if defined(SHARDLIB_HAVE_MPI)
void raw_mpi(Coll c, Buffers& b, std::size_t elems, int n) {
  const int per = static_cast<int>(elems / static_cast<std::size_t>(n));
  switch (c) {
    case Coll::all_gather: MPI_Allgather(b.send.data(), per, MPI_FLOAT, b.recv.data(), per, MPI_FLOAT, MPI_COMM_WORLD); break;
    case Coll::reduce_scatter: {  // (MPI_Reduce_scatter_block: up to 2.6x slower in Open MPI 4.1, see mpi.hpp)
      static std::vector<int> counts;  // (assigned in place: no allocation inside the timed call after the first)
      counts.assign(static_cast<std::size_t>(n), per);
      MPI_Reduce_scatter(b.send.data(), b.recv.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    }
    case Coll::all_reduce: MPI_Allreduce(b.send.data(), b.recv.data(), static_cast<int>(elems), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--min-bytes", bench::Takes::integer},
                     {"--max-bytes", bench::Takes::integer}});
  auto rt = sl::Runtime::from_args(argc, argv, 2);
  const long long min_bytes = bench::arg(argc, argv, "--min-bytes", 8), max_bytes = bench::arg(argc, argv, "--max-bytes", 64ll << 20);
  const int n = rt.num_devices();
  const bool threads = rt.backend() == sl::Backend::threads;
  std::vector<long long> sizes;
  for (long long s = min_bytes; s <= max_bytes; s *= 8) sizes.push_back(s);
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  const Coll colls[] = {Coll::all_gather, Coll::reduce_scatter, Coll::all_reduce};

  // threads baseline: memcpy over all cores, measured before the devices start.
  std::vector<double> memcpy_s;
  if (threads)
    for (Coll c : colls)
      for (long long s : sizes) memcpy_s.push_back(memcpy_seconds(must_move(c, n, static_cast<double>(s)), static_cast<std::size_t>(s)));

  rt.spmd([&](sl::Context& ctx) {
    auto& comm = ctx.world();
    const bool report = ctx.device() == 0;
    bench::warm_up(comm);
    std::size_t k = 0;
    for (Coll c : colls)
      for (long long s : sizes) {
        // Whole buffer in floats, a multiple of n (so blocks are equal), at least n.
        std::size_t elems = std::max<std::size_t>(static_cast<std::size_t>(s) / 4 / static_cast<std::size_t>(n), 1) * static_cast<std::size_t>(n);
        const double bytes = static_cast<double>(elems) * 4;
        Buffers b;
        b.send.assign(c == Coll::all_gather ? elems / static_cast<std::size_t>(n) : elems, 1.0f);
        b.recv.assign(c == Coll::reduce_scatter ? elems / static_cast<std::size_t>(n) : elems, 0.0f);
        auto ours_op = [&] { call(comm, c, b, elems); };
        double ours = 0, base = 0;
        std::string base_name;
        if (threads) {
          ours = bench::time_ops(comm, ours_op, static_cast<decltype(ours_op)*>(nullptr)).first;
          base = memcpy_s[k];
          base_name = "memcpy_all_cores";
        } else {
#if defined(SHARDLIB_HAVE_MPI)
          auto raw_op = [&] { raw_mpi(c, b, elems, n); };
          std::tie(ours, base) = bench::time_ops(comm, ours_op, &raw_op);
          base_name = "raw_mpi";
#endif
        }
        ++k;
        if (report) {
          double algbw = bytes / ours / 1e9;
          std::printf(
              "{\"name\": \"%s\", \"backend\": \"%s\", \"devices\": %d, \"bytes\": %.0f, \"seconds\": %.9g, "
              "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"bytes_must_move\": %.0f, \"baseline\": \"%s\", "
              "\"baseline_seconds\": %.9g, \"fraction_of_baseline\": %.4f}\n",
              coll_name(c), threads ? "threads" : "mpi", n, bytes, ours, algbw, algbw * bus_factor(c, n),
              must_move(c, n, bytes), base_name.c_str(), base, base / ours);
          std::fflush(stdout);
          std::fprintf(stderr, "  %-14s %-7s %d devices %10.0f B  %10.3f us  (%s: %.3f us)\n", coll_name(c),
                       threads ? "threads" : "mpi", n, bytes, ours * 1e6, base_name.c_str(), base * 1e6);
        }
      }
  });
  return 0;
}
