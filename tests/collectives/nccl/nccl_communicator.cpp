// SPDX-License-Identifier: Apache-2.0
// The nccl backend, run under mpirun (one process per GPU).
//
//   nccl_communicator_tests          the suites that need no GPU: the helpers (device choice,
//                                    types, the timeout setting) and, on a machine without a GPU,
//                                    the error world() gives there
//   nccl_communicator_tests --gpu    the collectives on GPU memory, checked against values every
//                                    rank computes (functions of rank and index); exits 77
//                                    (skipped) when this process sees no GPU
//
// Every rank runs the same collectives whatever its checks find (CHECK, never REQUIRE, around
// collectives), so a failure on one rank does not leave the others waiting.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <shardlib/collectives/nccl.hpp>
#include <shardlib/runtime/runtime.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace coll = shardlib::coll;
using coll::Blocks;
using coll::CollectiveError;
using coll::DType;
using coll::NcclCommunicator;
using coll::Op;
using coll::Region;

namespace {

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

/// `n` elements of T in GPU memory, filled from and read back to the host.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }
  T* data() const noexcept { return static_cast<T*>(p_); }
  void put(const std::vector<T>& v) {
    if (cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy to the GPU");
  }
  std::vector<T> get() const {
    std::vector<T> v(n_);
    if (cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy from the GPU");
    return v;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_;
};

/// What rank r holds at index i in the tests.
double value(int r, std::size_t i) { return 1000.0 * r + static_cast<double>(i) * 0.5 + 1; }

template <class T>
std::vector<T> values(int r, std::size_t n, std::size_t from = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value(r, from + i));
  return v;
}

std::unique_ptr<NcclCommunicator>& world() {
  static std::unique_ptr<NcclCommunicator> w;
  return w;
}

}  // namespace

TEST_SUITE("nccl_host") {
  TEST_CASE("nccl: a process takes GPU local rank % GPUs, and two processes on one GPU are found") {
    CHECK(coll::detail::nccl::device_for(0, 1) == 0);
    CHECK(coll::detail::nccl::device_for(5, 8) == 5);
    CHECK(coll::detail::nccl::device_for(9, 8) == 1);
    CHECK(coll::detail::nccl::device_for(0, 0) == -1);
    using P = std::pair<int, int>;
    CHECK(coll::detail::nccl::shared_gpu({"0000:01:00.0", "0000:02:00.0"}) == P{-1, -1});
    CHECK(coll::detail::nccl::shared_gpu({"0000:01:00.0", "0000:02:00.0", "0000:01:00.0"}) == P{0, 2});
    CHECK(coll::detail::nccl::shared_gpu({}) == P{-1, -1});
  }

  TEST_CASE("nccl: every DType has an NCCL type of its size; 16-bit integers move but do not reduce") {
    const DType all[] = {DType::i8, DType::u8, DType::i16, DType::u16, DType::i32, DType::u32,
                         DType::i64, DType::u64, DType::f16, DType::bf16, DType::f32, DType::f64};
    auto nccl_size = [](ncclDataType_t t) -> std::size_t {
      switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
      }
    };
    for (DType t : all) {
      INFO(coll::name(t));
      CHECK(nccl_size(coll::detail::nccl::datatype(t)) == coll::size_of(t));
      CHECK(coll::detail::nccl::reducible(t) == (t != DType::i16 && t != DType::u16));
    }
    CHECK(coll::detail::nccl::datatype(DType::bf16) == ncclBfloat16);
    CHECK(coll::detail::nccl::datatype(DType::f16) == ncclFloat16);
    CHECK(coll::detail::nccl::redop(Op::sum) == ncclSum);
    CHECK(coll::detail::nccl::redop(Op::prod) == ncclProd);
    CHECK(coll::detail::nccl::redop(Op::max) == ncclMax);
    CHECK(coll::detail::nccl::redop(Op::min) == ncclMin);
  }

  TEST_CASE("nccl: SHARDLIB_NCCL_TIMEOUT gives the watchdog's timeout; a bad value is refused by name") {
    ::unsetenv("SHARDLIB_NCCL_TIMEOUT");
    CHECK(coll::detail::nccl::timeout_from_environment() == 600.0);
    ::setenv("SHARDLIB_NCCL_TIMEOUT", "2.5", 1);
    CHECK(coll::detail::nccl::timeout_from_environment() == 2.5);
    ::setenv("SHARDLIB_NCCL_TIMEOUT", "0", 1);
    CHECK(coll::detail::nccl::timeout_from_environment() == 0.0);
    for (const char* bad : {"soon", "-1", "10s"}) {
      ::setenv("SHARDLIB_NCCL_TIMEOUT", bad, 1);
      const std::string want = "SHARDLIB_NCCL_TIMEOUT=\"" + std::string(bad) + "\" is not a number of seconds";
      CHECK_THROWS_WITH_AS(coll::detail::nccl::timeout_from_environment(), doctest::Contains(want.c_str()), CollectiveError);
    }
    ::unsetenv("SHARDLIB_NCCL_TIMEOUT");
  }
}

TEST_SUITE("nccl_no_gpu") {
  TEST_CASE("nccl: without a GPU, world() names the CUDA call, its error and the rank, on every rank") {
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const std::string want = "nccl backend, rank " + std::to_string(rank) + " of " + std::to_string(size) + ": cudaGetDeviceCount: ";
    CHECK_THROWS_WITH_AS(NcclCommunicator::world(), doctest::Contains(want.c_str()), CollectiveError);
    CHECK_THROWS_WITH_AS(NcclCommunicator::world(), doctest::Contains("this process sees no usable GPU"), CollectiveError);
  }
  TEST_CASE("nccl: without a GPU, the nccl backend (from_args --backend nccl) refuses to start with world()'s error") {
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    static_assert(shardlib::has_nccl());
    const std::string want = "nccl backend, rank " + std::to_string(rank) + " of " + std::to_string(size) + ": cudaGetDeviceCount: ";
    std::string arg0 = "prog", arg1 = "--backend", arg2 = "nccl";
    char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
    int argc = 3;
    // Once per process: the Runtime starts Kokkos, which cannot start again after it finished.
    CHECK_THROWS_WITH_AS(shardlib::Runtime::from_args(argc, argv), doctest::Contains(want.c_str()), CollectiveError);
  }
}

TEST_SUITE("nccl_gpu") {
  TEST_CASE("nccl: world() binds a GPU and a stream") {
    auto& w = *world();
    int dev = -1;
    cudaGetDevice(&dev);
    CHECK(w.device() == dev);
    CHECK(w.stream() != nullptr);
    CHECK(w.backend() == "nccl");
    CHECK(w.accepts_device_memory());
    CHECK(w.name() == "world");
  }

  TEST_CASE("nccl: all_reduce, every op, in place and not, f32 f64 i32 bf16") {
    auto& w = *world();
    const int n = w.size();
    const std::size_t count = 1000;
    for (Op op : {Op::sum, Op::max, Op::min, Op::prod}) {
      INFO(shardlib::to_string(op));
      DeviceBuffer<double> in(count), out(count);
      in.put(values<double>(w.rank(), count));
      w.all_reduce(in.data(), out.data(), count, DType::f64, op);
      w.synchronize();
      const auto got = out.get();
      bool all = true;
      for (std::size_t i = 0; i < count; ++i) {
        double want = value(0, i);
        for (int r = 1; r < n; ++r) {
          const double v = value(r, i);
          want = op == Op::sum ? want + v : op == Op::max ? std::max(want, v) : op == Op::min ? std::min(want, v) : want * v;
        }
        all = all && got[i] == doctest::Approx(want).epsilon(1e-12);
      }
      CHECK(all);
    }
    DeviceBuffer<float> f(count);
    f.put(values<float>(w.rank(), count));
    w.all_reduce(f.data(), f.data(), count, DType::f32, Op::sum);  // in place
    DeviceBuffer<std::int32_t> i32(count);
    i32.put(std::vector<std::int32_t>(count, w.rank() + 1));
    w.all_reduce(i32.data(), i32.data(), count, DType::i32, Op::sum);
    // bf16: 1.0 (0x3f80) from every rank sums to n exactly.
    DeviceBuffer<std::uint16_t> b(count);
    b.put(std::vector<std::uint16_t>(count, 0x3f80));
    w.all_reduce(b.data(), b.data(), count, DType::bf16, Op::sum);
    w.synchronize();
    const auto fg = f.get();
    CHECK(fg[7] == doctest::Approx(static_cast<double>(n) * value(0, 7) + 1000.0 * n * (n - 1) / 2).epsilon(1e-5));
    CHECK(i32.get()[3] == n * (n + 1) / 2);
    std::uint32_t bits = static_cast<std::uint32_t>(b.get()[9]) << 16;
    float bsum = 0;
    std::memcpy(&bsum, &bits, 4);
    CHECK(bsum == static_cast<float>(n));
  }

  TEST_CASE("nccl: all_gather, even and uneven, in place") {
    auto& w = *world();
    const int n = w.size(), me = w.rank();
    const std::size_t count = 37;
    DeviceBuffer<float> in(count), out(count * static_cast<std::size_t>(n));
    in.put(values<float>(me, count));
    w.all_gather(in.data(), out.data(), count, DType::f32);
    w.synchronize();
    auto got = out.get();
    bool all = true;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) all = all && got[static_cast<std::size_t>(r) * count + i] == static_cast<float>(value(r, i));
    CHECK(all);
    // Uneven (rank r gives r + 2 elements), in place: this rank's block already sits in recv.
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(r) + 2;
    const Blocks blocks{std::span<const std::size_t>(counts)};
    DeviceBuffer<float> all_in(blocks.total());
    std::vector<float> host(blocks.total(), -1.0f);
    const auto mine = values<float>(me, counts[static_cast<std::size_t>(me)]);
    std::copy(mine.begin(), mine.end(), host.begin() + static_cast<std::ptrdiff_t>(blocks.offset(me)));
    all_in.put(host);
    w.all_gather(all_in.data() + blocks.offset(me), all_in.data(), counts, DType::f32);
    w.synchronize();
    got = all_in.get();
    all = true;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
        all = all && got[blocks.offset(r) + i] == static_cast<float>(value(r, i));
    CHECK(all);
  }

  TEST_CASE("nccl: reduce_scatter, even and uneven") {
    auto& w = *world();
    const int n = w.size(), me = w.rank();
    const std::size_t count = 11;
    DeviceBuffer<double> in(count * static_cast<std::size_t>(n)), out(count);
    in.put(values<double>(me, count * static_cast<std::size_t>(n)));
    w.reduce_scatter(in.data(), out.data(), count, DType::f64, Op::sum);
    w.synchronize();
    auto got = out.get();
    bool all = true;
    for (std::size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += value(r, static_cast<std::size_t>(me) * count + i);
      all = all && got[i] == doctest::Approx(want);
    }
    CHECK(all);
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(3 * r + 1);
    const Blocks blocks{std::span<const std::size_t>(counts)};
    DeviceBuffer<double> uin(blocks.total()), uout(counts[static_cast<std::size_t>(me)]);
    uin.put(values<double>(me, blocks.total()));
    w.reduce_scatter(uin.data(), uout.data(), counts, DType::f64, Op::max);
    w.synchronize();
    got = uout.get();
    all = true;
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(me)]; ++i)
      all = all && got[i] == value(n - 1, blocks.offset(me) + i);
    CHECK(all);
  }

  TEST_CASE("nccl: all_to_all and exchange of strided boxes against the host copy") {
    auto& w = *world();
    const int n = w.size(), me = w.rank();
    const std::size_t count = 5;
    const auto nn = static_cast<std::size_t>(n);
    DeviceBuffer<std::int64_t> in(count * nn), out(count * nn);
    std::vector<std::int64_t> send(count * nn);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::int64_t>(me * 1000 + static_cast<int>(i));
    in.put(send);
    w.all_to_all(in.data(), out.data(), count, DType::i64);
    w.synchronize();
    auto got = out.get();
    bool all = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < count; ++i)
        all = all && got[static_cast<std::size_t>(p) * count + i] == p * 1000 + me * static_cast<int>(count) + static_cast<int>(i);
    CHECK(all);
    // exchange: rank me sends to p the box of rows [p*2, p*2+2) x columns [me, me+3) of its 8n x 8
    // matrix (strided), and receives from p, contiguously, 6 elements at p*6 of a row-major buffer.
    const std::size_t cols = 8, rows = 2 * nn;
    DeviceBuffer<float> m(rows * cols), r(6 * nn);
    std::vector<float> hm(rows * cols);
    for (std::size_t i = 0; i < hm.size(); ++i) hm[i] = static_cast<float>(value(me, i));
    m.put(hm);
    r.put(std::vector<float>(6 * nn, -1.0f));
    std::vector<Region> sr(nn), rr(nn);
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      sr[pu] = Region::strided(pu * 2 * cols + static_cast<std::size_t>(me % 6), {2, 3}, {cols, 1});
      rr[pu] = Region::contiguous(pu * 6, 6);
    }
    w.exchange(m.data(), sr, r.data(), rr, DType::f32);
    w.synchronize();
    const auto rg = r.get();
    all = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 3; ++j)
          all = all && rg[static_cast<std::size_t>(p) * 6 + i * 3 + j] ==
                           static_cast<float>(value(p, (static_cast<std::size_t>(me) * 2 + i) * cols + static_cast<std::size_t>(p % 6) + j));
    CHECK(all);
    // And back, into a strided box on the receiving side (unpacked from scratch).
    DeviceBuffer<float> back(rows * cols);
    back.put(std::vector<float>(rows * cols, 0.0f));
    std::vector<Region> sr2(nn), rr2(nn);
    for (int p = 0; p < n; ++p) {
      const auto pu = static_cast<std::size_t>(p);
      sr2[pu] = rr[pu];
      rr2[pu] = sr[pu];
    }
    w.exchange(r.data(), sr2, back.data(), rr2, DType::f32);
    w.synchronize();
    const auto bg = back.get();
    all = true;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 3; ++j) {
          const std::size_t at = (static_cast<std::size_t>(p) * 2 + i) * cols + static_cast<std::size_t>(me % 6) + j;
          all = all && bg[at] == hm[at];
        }
    CHECK(all);
  }

  TEST_CASE("nccl: broadcast, permute around the ring, send and recv, barrier") {
    auto& w = *world();
    const int n = w.size(), me = w.rank();
    DeviceBuffer<float> b(64);
    b.put(values<float>(me, 64));
    w.broadcast(b.data(), 64, DType::f32, n - 1);
    w.synchronize();
    CHECK(b.get()[10] == static_cast<float>(value(n - 1, 10)));
    DeviceBuffer<float> s(16), rcv(16);
    s.put(values<float>(me, 16));
    w.permute(s.data(), 16, (me + 1) % n, rcv.data(), 16, (me + n - 1) % n, DType::f32);
    w.synchronize();
    CHECK(rcv.get()[3] == static_cast<float>(value((me + n - 1) % n, 3)));
    if (n > 1) {
      if (me == 0) w.send(s.data(), 16, DType::f32, 1);
      if (me == 1) {
        w.recv(rcv.data(), 16, DType::f32, 0);
        w.synchronize();
        CHECK(rcv.get()[5] == static_cast<float>(value(0, 5)));
      }
    }
    w.barrier();
    CHECK_THROWS_WITH_AS(w.send(s.data(), 16, DType::f32, me), doctest::Contains("a send to itself"), CollectiveError);
  }

  TEST_CASE("nccl: split into sub-groups on the same stream; a negative color is left out") {
    auto& w = *world();
    auto half = w.split(w.rank() % 2, w.rank(), "half");
    REQUIRE(half != nullptr);
    CHECK(half->backend() == "nccl");
    CHECK(half->size() == (w.size() + 1 - w.rank() % 2) / 2);
    CHECK(static_cast<NcclCommunicator&>(*half).stream() == w.stream());
    DeviceBuffer<std::int32_t> x(4);
    x.put(std::vector<std::int32_t>(4, 1));
    half->all_reduce(x.data(), x.data(), 4, DType::i32, Op::sum);
    w.synchronize();
    CHECK(x.get()[0] == half->size());
    auto none = w.split(-1, 0, "none");
    CHECK(none == nullptr);
  }

  TEST_CASE("nccl: host buffers, 16-bit integer reductions and dry runs") {
    auto& w = *world();
    std::vector<float> host(8, 1.0f);
    CHECK_THROWS_WITH_AS(w.all_reduce(host.data(), host.data(), 8, DType::f32, Op::sum),
                         doctest::Contains("a buffer is in host memory; the nccl backend moves GPU memory"), CollectiveError);
    DeviceBuffer<std::int16_t> s16(8);
    CHECK_THROWS_WITH_AS(w.all_reduce(s16.data(), s16.data(), 8, DType::i16, Op::sum),
                         doctest::Contains("NCCL cannot reduce i16"), CollectiveError);
    // 16-bit integers still move.
    DeviceBuffer<std::int16_t> g(8 * static_cast<std::size_t>(w.size()));
    s16.put(std::vector<std::int16_t>(8, static_cast<std::int16_t>(-3 - w.rank())));
    w.all_gather(s16.data(), g.data(), 8, DType::i16);
    w.synchronize();
    CHECK(g.get()[0] == -3);
    // A dry run moves nothing: an all_gather keeps this rank's block, zeros around it.
    DeviceBuffer<float> in(4), out(4 * static_cast<std::size_t>(w.size()));
    in.put(std::vector<float>(4, 7.0f));
    out.put(std::vector<float>(4 * static_cast<std::size_t>(w.size()), 9.0f));
    {
      coll::DryRun dry;
      w.all_gather(in.data(), out.data(), 4, DType::f32);
    }
    w.synchronize();
    const auto got = out.get();
    for (int r = 0; r < w.size(); ++r) CHECK(got[static_cast<std::size_t>(r) * 4] == (r == w.rank() ? 7.0f : 0.0f));
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool gpu_run = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gpu") == 0) gpu_run = true;
    else args.push_back(argv[i]);
  }
  const bool gpu = have_gpu();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (gpu_run && !gpu) {
    if (rank == 0) std::printf("skipped: this process sees no GPU (the nccl_gpu suite needs one GPU per process)\n");
    MPI_Finalize();
    return 77;
  }
  doctest::Context ctx(static_cast<int>(args.size()), args.data());
  ctx.setOption("test-suite", gpu_run ? "nccl_gpu" : gpu ? "nccl_host" : "nccl_host,nccl_no_gpu");
  int failed = 0;
  try {
    if (gpu_run) world() = NcclCommunicator::world();
    failed = ctx.run();
    world().reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    failed = 1;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
