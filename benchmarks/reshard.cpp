// SPDX-License-Identifier: Apache-2.0
// Reshard benchmark: one JSON record per (transition, size) on stdout, progress on stderr.
// Driven by `benchmarks/run reshard`; run alone as
//   bench_reshard --backend threads --devices 8 [--min-bytes 1048576] [--max-bytes 67108864]
//   mpirun -np 8 bench_reshard --backend mpi
//
// A float tensor of rows × 1024 (`bytes` is the global tensor) goes through the common
// transitions, `sl::reshard<To>(t)` (the result made anew each call, the source made once), each
// next to the hand-written call that does the same move on pre-laid-out contiguous buffers of the
// same sizes (`baseline`: the bare Communicator call under threads, the raw MPI call under mpi):
//   S0->R    Spec<"x", none> -> Spec<none, none>              all_gather of the local block
//   S1->R    Spec<none, "x"> -> Spec<none, none>              all_gather of the column blocks into a
//            staging buffer, then an unpack into rows (what a hand-written S1->R must do); the bare
//            all_gather of the same bytes is reported too (`bare_call`)
//   R->S0    Spec<none, none> -> Spec<"x", none>              memcpy of the local block (no communication)
//   P->R     Spec<none, none, partial_sum<"x">> -> replicated all_reduce of the whole buffer
//   P->S0    Spec<none, none, partial_sum<"x">> -> S0         reduce_scatter
//   S0->S1   Spec<"x", none> -> Spec<none, "x">               a pack of the local block into n column
//            pieces, then all_to_all (the received pieces are already rows of the new block); the
//            bare all_to_all is reported too (`bare_call`)
//   XY->YX   Spec<axes<"x","y">, none> -> Spec<axes<"y","x">, none> on mesh {n/2, 2}: permute of the
//            block to the device that needs it
//   S0->R uneven  S0->R at the largest size with rows not divisible by n (all_gather with counts)
// bytes_moved: what one reshard makes a device receive (a CommRecorder around one call), the most
// over devices; lower_bound: the most over devices of what it must receive (elements of its new
// block it did not hold × 4; P->R: 2(n-1)/n × buffer, as all_reduce; P->S0: own block × (n-1)).
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {

using M1 = sl::Mesh<"x">;
using M2 = sl::Mesh<"x", "y">;
using S0 = sl::Spec<"x", none>;
using S1 = sl::Spec<none, "x">;
using Rep = sl::Spec<none, none>;
using PSum = sl::Spec<none, none, sl::partial_sum<"x">>;
using XY = sl::Spec<sl::axes<"x", "y">, none>;
using YX = sl::Spec<sl::axes<"y", "x">, none>;

enum class Base { all_gather, all_reduce, reduce_scatter, all_to_all, permute, memcpy };

const char* base_name(Base b, bool mpi, bool uniform) {
  switch (b) {
    case Base::all_gather: return !mpi ? "all_gather" : uniform ? "raw_mpi_allgather" : "raw_mpi_allgatherv";
    case Base::all_reduce: return mpi ? "raw_mpi_allreduce" : "all_reduce";
    case Base::reduce_scatter: return mpi ? "raw_mpi_reduce_scatter" : "reduce_scatter";
    case Base::all_to_all: return mpi ? "raw_mpi_alltoall" : "all_to_all";
    case Base::permute: return mpi ? "raw_mpi_sendrecv" : "permute";
    case Base::memcpy: return "memcpy";
  }
  return "?";
}

// The hand-written move: `count` elements (per rank, or per rank in `counts` for an uneven
// all_gather) from `send` to `recv`.
struct Move {
  Base kind = Base::memcpy;
  const float* send = nullptr;
  float* recv = nullptr;
  std::size_t count = 0;
  std::vector<std::size_t> counts;  // all_gather: per rank; empty when uniform
  int dest = -1, source = -1;       // permute
  // Layout work a hand-written version needs around the call (S1->R, S0->S1), on `rows` × `cols`
  // (global rows for unpack, local rows for pack) in `n` column pieces, through a staging buffer.
  enum Layout { none, unpack_cols, pack_cols } layout = none;
  std::size_t rows = 0, cols = 0, n = 1;
};

// Column piece p of a rows × cols row-major matrix, packed contiguously (and back).
void pack_cols(const float* src, float* dst, std::size_t rows, std::size_t cols, std::size_t n) {
  const std::size_t w = cols / n;
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t i = 0; i < rows; ++i) std::memcpy(dst + (p * rows + i) * w, src + i * cols + p * w, w * sizeof(float));
}
void unpack_cols(const float* src, float* dst, std::size_t rows, std::size_t cols, std::size_t n) {
  const std::size_t w = cols / n;
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t i = 0; i < rows; ++i) std::memcpy(dst + i * cols + p * w, src + (p * rows + i) * w, w * sizeof(float));
}

void call(sl::coll::Communicator& comm, const Move& m) {
  using sl::coll::DType;
  switch (m.kind) {
    case Base::all_gather:
      if (m.counts.empty()) comm.all_gather(m.send, m.recv, m.count, DType::f32);
      else comm.all_gather(m.send, m.recv, m.counts, DType::f32);
      break;
    case Base::all_reduce: comm.all_reduce(m.send, m.recv, m.count, DType::f32, sl::coll::Op::sum); break;
    case Base::reduce_scatter: comm.reduce_scatter(m.send, m.recv, m.count, DType::f32, sl::coll::Op::sum); break;
    case Base::all_to_all: comm.all_to_all(m.send, m.recv, m.count, DType::f32); break;
    case Base::permute: comm.permute(m.send, m.count, m.dest, m.recv, m.count, m.source, DType::f32); break;
    case Base::memcpy: std::memcpy(m.recv, m.send, m.count * sizeof(float)); break;
  }
}

#if defined(SHARDLIB_HAVE_MPI)
void raw_mpi(const Move& m) {
  const int c = static_cast<int>(m.count);
  switch (m.kind) {
    case Base::all_gather:
      if (m.counts.empty()) {
        MPI_Allgather(m.send, c, MPI_FLOAT, m.recv, c, MPI_FLOAT, MPI_COMM_WORLD);
      } else {
        std::vector<int> counts(m.counts.begin(), m.counts.end()), displs(counts.size());
        for (std::size_t r = 1; r < counts.size(); ++r) displs[r] = displs[r - 1] + counts[r - 1];
        MPI_Allgatherv(m.send, c, MPI_FLOAT, m.recv, counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
      }
      break;
    case Base::all_reduce: MPI_Allreduce(m.send, m.recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case Base::reduce_scatter: {  // (as the mpi backend: MPI_Reduce_scatter_block is slower in Open MPI 4.1)
      static const int ranks = [] {
        int r = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &r);
        return r;
      }();
      static std::vector<int> counts;  // (assigned in place: no allocation inside the timed call after the first)
      counts.assign(static_cast<std::size_t>(ranks), c);
      MPI_Reduce_scatter(m.send, m.recv, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    }
    case Base::all_to_all: MPI_Alltoall(m.send, c, MPI_FLOAT, m.recv, c, MPI_FLOAT, MPI_COMM_WORLD); break;
    case Base::permute:
      MPI_Sendrecv(m.send, c, MPI_FLOAT, m.dest, 0, m.recv, c, MPI_FLOAT, m.source, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      break;
    case Base::memcpy: std::memcpy(m.recv, m.send, m.count * sizeof(float)); break;
  }
}
#endif

// Times reshard From -> To of a rows × cols tensor against `kind` (with the layout work a
// hand-written version needs, if any), and prints its record.
template <class From, class To, class MeshT>
void run_case(sl::Context& ctx, const MeshT& mesh, const std::string& name, std::int64_t rows, std::int64_t cols,
              Base kind, Move::Layout layout = Move::none) {
  using Src = sl::DistributedTensor<float, MeshT, From>;
  using Dst = sl::DistributedTensor<float, MeshT, To>;
  auto& comm = ctx.world();
  const int me = ctx.device(), n = ctx.num_devices();
  const bool mpi = ctx.backend() == "mpi";
  const typename Src::Shape shape{rows, cols};
  const sl::MeshShape& ms = mesh.shape();
  const Src src = Src::full(mesh, shape, 1.0f);
  const sl::ShardBox before = src.block(), after = sl::shard_box(Dst::sharding, ms, shape, me);
  const auto own = static_cast<std::size_t>(before.num_elements()), want = static_cast<std::size_t>(after.num_elements());

  // The hand-written move on contiguous buffers of the same sizes.
  Move m;
  m.kind = kind;
  m.send = src.local().data();
  std::size_t recv_size = want;
  switch (kind) {
    case Base::all_gather:
      m.count = own;
      for (int d = 0; d < n; ++d) m.counts.push_back(static_cast<std::size_t>(sl::shard_box(Src::sharding, ms, shape, d).num_elements()));
      if (std::all_of(m.counts.begin(), m.counts.end(), [&](std::size_t c) { return c == m.counts[0]; })) m.counts.clear();
      break;
    case Base::all_reduce: m.count = own; break;
    case Base::reduce_scatter: m.count = want; break;
    case Base::all_to_all: m.count = own / static_cast<std::size_t>(n); break;
    case Base::permute:
      m.count = own;
      for (int d = 0; d < n; ++d) {
        if (sl::shard_box(Dst::sharding, ms, shape, d) == before) m.dest = d;
        if (sl::shard_box(Src::sharding, ms, shape, d) == after) m.source = d;
      }
      break;
    case Base::memcpy:  // the new block is rows of the old one
      m.send += (after.offset[0] - before.offset[0]) * before.extent[1];
      m.count = want;
      break;
  }
  std::vector<float> recv(recv_size, 0.0f);
  m.recv = recv.data();
  m.layout = layout;
  m.n = static_cast<std::size_t>(n);
  m.cols = static_cast<std::size_t>(cols);
  m.rows = static_cast<std::size_t>(layout == Move::pack_cols ? before.extent[0] : rows);
  std::vector<float> staging(layout != Move::none ? std::max(own, want) : 0, 0.0f);

  auto bare = [&] {
#if defined(SHARDLIB_HAVE_MPI)
    if (mpi) return raw_mpi(m);
#endif
    call(comm, m);
  };
  auto by_hand = [&] {  // the bare call with the layout work around it
    Move h = m;
    if (layout == Move::pack_cols) {
      pack_cols(m.send, staging.data(), m.rows, m.cols, m.n);
      h.send = staging.data();
    } else if (layout == Move::unpack_cols) {
      h.recv = staging.data();
    }
#if defined(SHARDLIB_HAVE_MPI)
    if (mpi) raw_mpi(h);
    else
#endif
      call(comm, h);
    if (layout == Move::unpack_cols) unpack_cols(staging.data(), m.recv, m.rows, m.cols, m.n);
  };
  auto ours = [&] { Dst r = sl::reshard<To>(src); };
  double t_ours = 0, t_base = 0, t_bare = 0;
  if (layout == Move::none) {
    std::tie(t_ours, t_base) = bench::time_ops(comm, ours, &bare);
    t_bare = t_base;
  } else {
    std::tie(t_ours, t_base) = bench::time_ops(comm, ours, &by_hand);
    t_bare = bench::time_ops(comm, bare, static_cast<decltype(bare)*>(nullptr)).first;
  }

  // Bytes: what one reshard receives, and what it must (see the file comment); max over devices.
  double bytes[2];
  {
    sl::coll::CommRecorder rec;
    Dst r = sl::reshard<To>(src);
    bytes[0] = static_cast<double>(rec.total_bytes_received());
  }
  const double e = sizeof(float);
  if (kind == Base::all_reduce)
    bytes[1] = n > 1 ? 2.0 * static_cast<double>(own) * e * (n - 1) / n : 0.0;
  else if (kind == Base::reduce_scatter)
    bytes[1] = static_cast<double>(want) * e * (n - 1);
  else
    bytes[1] = static_cast<double>(after.num_elements() - sl::intersect(before, after).num_elements()) * e;
  comm.all_reduce(bytes, bytes, 2, sl::coll::DType::f64, sl::coll::Op::max);

  // The steps the reshard takes (the kinds describe_reshard lists).
  const sl::ReshardSchedule sched = sl::schedule_reshard(sl::plan_reshard(Src::sharding, Dst::sharding), ms, shape);
  std::string steps;
  for (int i = 0; i < sched.num_steps; ++i)
    steps += (i ? "+" : "") + std::string(sl::to_string(sched.steps[static_cast<std::size_t>(i)].kind));
  if (steps.empty()) steps = "none";

  if (me != 0) return;
  const double total = static_cast<double>(rows * cols) * e;
  const double over = bytes[1] > 0 ? bytes[0] / bytes[1] : bytes[0] > 0 ? 0.0 : 1.0;
  const std::string bare_name = base_name(kind, mpi, m.counts.empty());
  const std::string bname = layout == Move::pack_cols ? "pack+" + bare_name
                            : layout == Move::unpack_cols ? bare_name + "+unpack" : bare_name;
  std::printf(
      "{\"name\": \"%s\", \"backend\": \"%s\", \"devices\": %d, \"rows\": %lld, \"cols\": %lld, \"bytes\": %.0f, "
      "\"seconds\": %.9g, \"baseline\": \"%s\", \"baseline_seconds\": %.9g, \"fraction_of_baseline\": %.4f, "
      "\"ratio_to_baseline\": %.4f, \"bytes_moved\": %.0f, \"lower_bound\": %.0f, \"bytes_over_bound\": %.4f, "
      "\"steps\": \"%s\", \"bare_call\": \"%s\", \"bare_call_seconds\": %.9g, \"ratio_to_bare_call\": %.4f}\n",
      name.c_str(), mpi ? "mpi" : "threads", n, static_cast<long long>(rows), static_cast<long long>(cols), total, t_ours,
      bname.c_str(), t_base, t_base / t_ours, t_ours / t_base, bytes[0], bytes[1], over, steps.c_str(), bare_name.c_str(),
      t_bare, t_ours / t_bare);
  std::fflush(stdout);
  std::fprintf(stderr, "  %-22s %-7s %d devices %10.0f B  %10.1f us  (%s: %.1f us, x%.2f)  moved/bound %.2f  [%s]\n",
               name.c_str(), mpi ? "mpi" : "threads", n, total, t_ours * 1e6, bname.c_str(), t_base * 1e6, t_ours / t_base, over,
               steps.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::answered_backends_query(argc, argv, sl::has_mpi())) return 0;
  bench::check_args(argc, argv,
                    {{"--min-bytes", bench::Takes::integer},
                     {"--max-bytes", bench::Takes::integer}});
  auto rt = sl::Runtime::from_args(argc, argv, 8);
  const long long min_bytes = bench::arg(argc, argv, "--min-bytes", 1ll << 20),
                  max_bytes = bench::arg(argc, argv, "--max-bytes", 64ll << 20);
  std::vector<long long> sizes;
  for (long long s = min_bytes; s <= max_bytes; s *= 4) sizes.push_back(s);
  if (sizes.empty() || sizes.back() != max_bytes) sizes.push_back(max_bytes);

  rt.spmd([&](sl::Context& ctx) {
    bench::warm_up(ctx.world());
    const int n = ctx.num_devices();
    const std::int64_t cols = std::max<std::int64_t>(n, 1024 / n * n);  // columns split evenly too
    // Rows for `bytes`, a multiple of n (even blocks).
    auto rows_for = [&](long long bytes) { return std::max<std::int64_t>(bytes / 4 / cols / n, 1) * n; };
    M1 mesh(ctx, {n});
    auto each_size = [&](auto&& f) {
      for (long long s : sizes) f(rows_for(s));
    };
    each_size([&](std::int64_t r) { run_case<S0, Rep>(ctx, mesh, "reshard S0->R", r, cols, Base::all_gather); });
    each_size([&](std::int64_t r) { run_case<S1, Rep>(ctx, mesh, "reshard S1->R", r, cols, Base::all_gather, Move::unpack_cols); });
    each_size([&](std::int64_t r) { run_case<Rep, S0>(ctx, mesh, "reshard R->S0", r, cols, Base::memcpy); });
    each_size([&](std::int64_t r) { run_case<PSum, Rep>(ctx, mesh, "reshard P->R", r, cols, Base::all_reduce); });
    each_size([&](std::int64_t r) { run_case<PSum, S0>(ctx, mesh, "reshard P->S0", r, cols, Base::reduce_scatter); });
    each_size([&](std::int64_t r) { run_case<S0, S1>(ctx, mesh, "reshard S0->S1", r, cols, Base::all_to_all, Move::pack_cols); });
    if (n % 2 == 0) {
      M2 grid(ctx, {n / 2, 2});
      each_size([&](std::int64_t r) { run_case<XY, YX>(ctx, grid, "reshard XY->YX", r, cols, Base::permute); });
    }
    // One uneven case: the largest size with rows not divisible by n (the last block is short).
    if (n > 1) run_case<S0, Rep>(ctx, mesh, "reshard S0->R uneven", rows_for(max_bytes) - 1, cols, Base::all_gather);
  });
  return 0;
}
