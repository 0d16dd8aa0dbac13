// SPDX-License-Identifier: Apache-2.0
// DistributedTensor: creation, host round trips, loops, typed reshards and their errors. Every
// body runs on 1..8 threads devices and under mpirun; results are compared with values computed
// here from the global index (the one-device oracle).
#include <doctest/doctest.h>
#include <shardlib/ops/reduce.hpp>
#include <shardlib/tensor.hpp>

#include "../collectives/harness.hpp"

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace sl = shardlib;
using sl::none;

namespace {
using M2 = sl::Mesh<"x", "y">;
// A mesh of the run's devices: {n, 1} when n has no factor 2, else {n/2, 2}.
M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}
template <class S, class T = float>
using Tensor = sl::DistributedTensor<T, M2, S>;

using Rows = sl::Spec<"x", none>;
using Cols = sl::Spec<none, "x">;
using Rep = sl::Spec<none, none>;
using Grid = sl::Spec<"x", "y">;
using Both = sl::Spec<sl::axes<"x", "y">, none>;
using PSum = sl::Spec<none, none, sl::partial_sum<"x", "y">>;
using PMax = sl::Spec<none, "x", sl::partial_max<"y">>;

std::vector<float> iota_vec(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}
}  // namespace

TEST_SUITE("tensor") {
TEST_CASE("blocks, local views and shape queries follow the block distribution") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    auto t = Tensor<Grid>::zeros(mesh, {7, 5});
    const sl::ShardBox b = sl::shard_box(Tensor<Grid>::sharding, mesh.shape(), t.shape(), ctx.device());
    CHECK(t.block() == b);
    CHECK(t.local_shape() == std::array<std::int64_t, 2>{b.extent[0], b.extent[1]});
    CHECK(t.local_offset() == std::array<std::int64_t, 2>{b.offset[0], b.offset[1]});
    CHECK(t.local().extent(0) == static_cast<std::size_t>(b.extent[0]));
    CHECK(t.local().extent(1) == static_cast<std::size_t>(b.extent[1]));
    CHECK(t.size() == 35);
    CHECK(t.extent(1) == 5);
    static_assert(Tensor<Grid>::rank == 2);
    static_assert(std::is_same_v<Tensor<Grid>::local_view_type::array_layout, Kokkos::LayoutRight>);
  });
}

TEST_CASE("full, zeros, iota and random give the same global tensor for any spec and mesh") {
  std::vector<float> one_device;
  sl::Runtime::threads(1).spmd([&](sl::Context& ctx) {
    one_device = Tensor<Rep>::random(M2(ctx, {1, 1}), {9, 4}, 7).to_host();
  });
  REQUIRE(one_device.size() == 36);
  for (float v : one_device) CHECK((v >= 0.0f && v < 1.0f));
  sl::test::for_each_run([&](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    CHECK(Tensor<Grid>::random(mesh, {9, 4}, 7).to_host() == one_device);
    CHECK(Tensor<Both>::random(mesh, {9, 4}, 7).to_host() == one_device);
    CHECK(Tensor<Cols>::random(mesh, {9, 4}, 7).to_host() == one_device);
    CHECK(Tensor<PSum>::random(mesh, {9, 4}, 7).to_host() == one_device);  // partial: addends sum to it
    CHECK(Tensor<Grid>::random(mesh, {9, 4}, 8).to_host() != one_device);
    CHECK(Tensor<Rows>::iota(mesh, {3, 5}).to_host() == iota_vec(15));
    CHECK(Tensor<PMax>::iota(mesh, {3, 5}).to_host() == iota_vec(15));
    CHECK(Tensor<Grid>::full(mesh, {2, 3}, 2.5f).to_host() == std::vector<float>(6, 2.5f));
    CHECK(Tensor<PSum>::full(mesh, {2, 3}, 2.5f).to_host() == std::vector<float>(6, 2.5f));
    CHECK(Tensor<Grid>::zeros(mesh, {0, 3}).to_host().empty());
    // Integers: [0, 100) by default, or a given range.
    auto ints = sl::DistributedTensor<std::int32_t, M2, Grid>::random(mesh, {6, 6}, 3, -5, 5).to_host();
    for (auto v : ints) CHECK((v >= -5 && v < 5));
    CHECK_THROWS_WITH_AS(Tensor<Grid>::random(mesh, {2, 2}, 1, 1.0f, 1.0f), doctest::Contains("is empty"),
                         std::invalid_argument);
  });
}

TEST_CASE("from_host, scatter_from, to_host and gather_to round-trip") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    const std::vector<float> g = iota_vec(30);
    CHECK(Tensor<Grid>::from_host(mesh, {6, 5}, g).to_host() == g);
    CHECK(Tensor<PSum>::from_host(mesh, {6, 5}, g).to_host() == g);
    const int root = ctx.num_devices() - 1;
    const std::vector<float> none_here;
    auto s = Tensor<Both>::scatter_from(mesh, {6, 5}, ctx.device() == root ? std::span<const float>(g) : none_here, root);
    CHECK(s.to_host() == g);
    auto p = Tensor<PSum>::scatter_from(mesh, {6, 5}, ctx.device() == root ? std::span<const float>(g) : none_here, root);
    CHECK(p.to_host() == g);
    for (int r : {0, root}) {
      CHECK(s.gather_to(r) == (ctx.device() == r ? g : none_here));
      CHECK(p.gather_to(r) == (ctx.device() == r ? g : none_here));
      CHECK(Tensor<Rep>::from_host(mesh, {6, 5}, g).gather_to(r) == (ctx.device() == r ? g : none_here));
    }
    // Bad input names the tensor.
    CHECK_THROWS_WITH_AS(Tensor<Grid>::from_host(mesh, {6, 4}, g),
                         "shardlib: from_host: a host array of 30 elements for a tensor of shape [6, 4] with "
                         "Spec<\"x\", \"y\"> (24 elements)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Tensor<Grid>::zeros(mesh, {-1, 4}), doctest::Contains("dim 0 has a negative extent"),
                         std::invalid_argument);
    CHECK_THROWS_AS(s.gather_to(ctx.num_devices()), std::out_of_range);
  });
}

TEST_CASE("item(): the number of a scalar tensor on every device, partial (all-reduced) or not") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    const auto t = Tensor<Grid>::from_host(mesh, {6, 5}, iota_vec(30));
    const auto total = sl::sum<0>(sl::sum<0>(t));  // partial over the axes that split the dims
    static_assert(decltype(total)::rank == 0);
    CHECK(total.item() == 435.0f);
    const auto max = sl::max<0>(sl::max<0>(t));
    CHECK(max.item() == 29.0f);
  });
}

TEST_CASE("a shape that differs between devices is refused on every device, naming both; root's bad array too") {
  sl::test::for_each_run(
      [](sl::Context& ctx) {
        const M2 mesh = mesh_of(ctx);
        const int last = ctx.num_devices() - 1;
        // One device is given a 33-row batch where the others have 32 (a data loader's bug).
        const std::int64_t rows = ctx.device() == last ? 33 : 32;
        const std::string both = "device 0 [32, 4], device " + std::to_string(last) + " [33, 4]";
        const std::vector<float> data(static_cast<std::size_t>(rows * 4), 1.0f);
        CHECK_THROWS_WITH_AS(Tensor<Rows>::from_host(mesh, {rows, 4}, data),
                             doctest::Contains(("shardlib: from_host: the devices passed different shapes for a f32 "
                                                "tensor Spec<\"x\", none> on mesh " + mesh.to_string() + ": " + both)
                                                   .c_str()),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(Tensor<Grid>::uninitialized(mesh, {rows, 4}), doctest::Contains(both.c_str()),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(Tensor<Rep>::zeros(mesh, {rows, 4}), doctest::Contains(both.c_str()), std::invalid_argument);
        CHECK_THROWS_WITH_AS(Tensor<Both>::random(mesh, {rows, 4}, 1), doctest::Contains(both.c_str()),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS((Tensor<Cols, std::int64_t>::iota(mesh, {rows, 4})), doctest::Contains(both.c_str()),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(Tensor<Both>::scatter_from(mesh, {rows, 4}, ctx.device() == 0 ? data : std::vector<float>(), 0),
                             doctest::Contains(both.c_str()), std::invalid_argument);
        // Root's array of the wrong size: every device throws, none is left in the scatter.
        const std::vector<float> short_array(5, 1.0f);
        CHECK_THROWS_WITH_AS(
            Tensor<Both>::scatter_from(mesh, {6, 4}, ctx.device() == last ? short_array : std::vector<float>(), last),
            doctest::Contains(("scatter_from from device " + std::to_string(last) +
                               ": a host array of 5 elements for a tensor of shape [6, 4]")
                                  .c_str()),
            std::invalid_argument);
        // The same shape everywhere: made, and the run goes on.
        CHECK(Tensor<Rows>::full(mesh, {32, 4}, 2.0f).to_host() == std::vector<float>(128, 2.0f));
      },
      {2, 3, 4});
  // A scalar's shape cannot differ: its factories make no round trip (backward's seed of a loss is
  // one per step), so one device may make one alone.
  sl::Runtime::threads(2, std::chrono::milliseconds(2000)).spmd([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    using Scalar = sl::DistributedTensor<float, M2, sl::Spec<>>;
    if (ctx.device() == 0) CHECK(Scalar::full(mesh, {}, 2.0f).local().data()[0] == 2.0f);
    ctx.world().barrier();
  });
  // A lone device's bad array (nothing to compare with: its own word says it).
  sl::Runtime::threads(1).spmd([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    CHECK_THROWS_WITH_AS(Tensor<Both>::scatter_from(mesh, {6, 4}, std::vector<float>(5, 1.0f), 0),
                         doctest::Contains("scatter_from from device 0: a host array of 5 elements"), std::invalid_argument);
  });
}

TEST_CASE("parallel_for hands out global indices; parallel_reduce counts each element once") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    auto t = Tensor<Cols, double>::zeros(mesh, {5, 7});
    sl::parallel_for(t, [](const sl::Index<2>& i, double& v) { v = static_cast<double>(i[0] * 7 + i[1]); });
    std::vector<double> want(35);
    std::iota(want.begin(), want.end(), 0.0);
    CHECK(t.to_host() == want);
    // Replicated over y (and over x for Rep): replicas must not add their copies.
    CHECK(sl::parallel_reduce(t, [](const sl::Index<2>&, double v) { return v; }) == doctest::Approx(595.0));
    auto r = Tensor<Rep, double>::iota(mesh, {5, 7});
    CHECK(sl::parallel_reduce(r, [](const sl::Index<2>&, double v) { return v; }) == doctest::Approx(595.0));
    CHECK(sl::parallel_reduce(r, [](const sl::Index<2>&, double) { return 1L; }) == 35L);
    CHECK(sl::parallel_reduce<sl::ReduceOp::max>(t, [](const sl::Index<2>&, double v) { return v; }) == 34.0);
    CHECK(sl::parallel_reduce<sl::ReduceOp::min>(t, [](const sl::Index<2>& i, double v) { return v - static_cast<double>(i[1]); }) == 0.0);
    auto sq = sl::map(t, [](double v) { return static_cast<float>(v * v); });
    static_assert(std::is_same_v<decltype(sq), Tensor<Cols, float>>);
    auto host = sq.to_host();
    for (std::size_t k = 0; k < host.size(); ++k) CHECK(host[k] == static_cast<float>(k * k));
    auto idx = sl::map(t, [](const sl::Index<2>& i, double v) { return static_cast<std::int64_t>(v) - i[0] * 7; });
    auto ih = idx.to_host();
    for (std::size_t k = 0; k < ih.size(); ++k) CHECK(ih[k] == static_cast<std::int64_t>(k % 7));
    // Empty blocks reduce to the identity.
    auto e = Tensor<Grid, double>::zeros(mesh, {0, 3});
    CHECK(sl::parallel_reduce(e, [](const sl::Index<2>&, double v) { return v; }) == 0.0);
  });
}

TEST_CASE("typed reshards: reshard<>, converting construction, assignment, describe") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const M2 mesh = mesh_of(ctx);
    const std::vector<float> g = iota_vec(77);
    auto rows = Tensor<Rows>::from_host(mesh, {11, 7}, g);
    auto cols = sl::reshard<Cols>(rows);
    static_assert(std::is_same_v<decltype(cols), Tensor<Cols>>);
    CHECK(cols.to_host() == g);
    Tensor<Rep> rep = cols;  // converting construction
    CHECK(rep.to_host() == g);
    Tensor<Grid> grid = Tensor<Grid>::zeros(mesh, {11, 7});
    grid = rep;  // assignment
    CHECK(grid.to_host() == g);
    Tensor<PSum> partial = grid;  // to partial sum: masked copies
    CHECK(partial.to_host() == g);
    Tensor<Both> back = partial;  // reduce_scatter
    CHECK(back.to_host() == g);
    CHECK(back.block() == sl::shard_box(Tensor<Both>::sharding, mesh.shape(), back.shape(), ctx.device()));
    // The same spec: a shallow copy.
    auto same = sl::reshard<Rows>(rows);
    CHECK(same.local().data() == rows.local().data());
    // The source is never written.
    CHECK(rows.to_host() == g);
    // Counters: rows -> replicated is one all_gather; partial -> rows a reduce_scatter over x and
    // an all_reduce over y (none over an axis of size 1).
    {
      sl::coll::CommRecorder rec;
      Tensor<Rep> r2 = rows;
      CHECK(rec[sl::coll::Kind::all_gather].calls == (mesh.size(0) > 1 ? 1u : 0u));
      CHECK(rec.total_calls() == rec[sl::coll::Kind::all_gather].calls);
    }
    {
      sl::coll::CommRecorder rec;
      Tensor<Rows> r3 = partial;
      CHECK(rec[sl::coll::Kind::reduce_scatter].calls == (mesh.size(0) > 1 ? 1u : 0u));
      CHECK(rec[sl::coll::Kind::all_reduce].calls == (mesh.size(1) > 1 ? 1u : 0u));
      CHECK(rec.total_calls() == rec[sl::coll::Kind::reduce_scatter].calls + rec[sl::coll::Kind::all_reduce].calls);
      CHECK(r3.to_host() == g);
    }
    const std::string text = rows.describe_reshard<Rep>();
    CHECK(text.find("reshard Spec<\"x\", none> -> Spec<none, none> on mesh") == 0);
    if (mesh.size(0) > 1) CHECK(text.find("all_gather over {x}") != std::string::npos);
    // Clone owns its block.
    auto c = rows.clone();
    if (rows.block().num_elements() > 0) CHECK(c.local().data() != rows.local().data());
    CHECK(c.to_host() == g);
  });
}

TEST_CASE("large blocks come back from the device's block cache") {
  sl::test::for_each_run([](sl::Context& ctx) {
    sl::Mesh<"x"> mesh(ctx, {ctx.num_devices()});
    using T1 = sl::DistributedTensor<float, sl::Mesh<"x">, sl::Spec<"x">>;
    const std::int64_t n = std::int64_t{1} << 19;  // 2 MiB per device
    auto& cache = sl::detail::block_cache<Kokkos::HostSpace>(ctx);
    const float* first = nullptr;
    {
      auto t = T1::zeros(mesh, {n * ctx.num_devices()});
      first = t.local().data();
      CHECK(cache.cached_bytes() == 0);
    }
    CHECK(cache.cached_bytes() == static_cast<std::size_t>(n) * sizeof(float));
    auto u = T1::full(mesh, {n * ctx.num_devices()}, 1.0f);  // same size: the same block
    CHECK(u.local().data() == first);
    CHECK(cache.cached_bytes() == 0);
    auto v = T1::full(mesh, {4 * n * ctx.num_devices()}, 1.0f);  // larger: a new one
    CHECK(v.local().data() != first);
    CHECK(sl::parallel_reduce(u, [](const sl::Index<1>&, float x) { return static_cast<double>(x); }) ==
          static_cast<double>(n * ctx.num_devices()));
  });
}

/// Host memory that refuses to hold more than `limit` bytes at once (std::bad_alloc, as Kokkos'
/// spaces throw), for the block cache's out-of-memory path.
struct LimitedSpace : Kokkos::HostSpace {
  static inline std::size_t live = 0, limit = 0, refused = 0;
  void* allocate(std::size_t bytes) const {
    if (live + bytes > limit) {
      ++refused;
      throw std::bad_alloc();
    }
    live += bytes;
    return Kokkos::HostSpace::allocate(bytes);
  }
  void deallocate(void* p, std::size_t bytes) const {
    live -= bytes;
    Kokkos::HostSpace::deallocate(p, bytes);
  }
};

TEST_CASE("the block cache evicts the blocks released longest ago, and gives its blocks back when memory runs out") {
  constexpr std::size_t mib = std::size_t{1} << 20;
  LimitedSpace::limit = 64 * mib;
  {
    auto cache = std::make_shared<sl::detail::BlockCache<LimitedSpace>>(4 * mib);
    { auto stale = cache->allocate(3 * mib); }  // released first, never asked for again
    CHECK(cache->cached_bytes() == 3 * mib);
    void* first = nullptr;
    for (int step = 0; step < 3; ++step) {  // a loop that uses 2 MiB blocks: they stay cached
      auto b = cache->allocate(2 * mib);
      if (step == 0) first = b.get();
      CHECK(b.get() == first);
    }
    CHECK(cache->cached_bytes() == 2 * mib);  // the stale 3 MiB went back to the space
    CHECK(LimitedSpace::live == 2 * mib);
    {  // 1.5 MiB does not fit beside the 2 and the 1 MiB blocks: the 2 MiB one, released first, goes
      auto a = cache->allocate(mib), c = cache->allocate(mib + mib / 2);
      void* pa = a.get();
      a.reset();
      CHECK(cache->cached_bytes() == 3 * mib);
      c.reset();
      CHECK(cache->cached_bytes() == 5 * mib / 2);
      CHECK(LimitedSpace::live == 2 * mib + mib / 2);
      auto again = cache->allocate(mib);  // the 1 MiB block stayed
      CHECK(again.get() == pa);
    }
    { auto huge = cache->allocate(5 * mib); }  // larger than the cap: straight back
    CHECK(cache->cached_bytes() == 5 * mib / 2);
    // Out of memory: the free blocks go back to the space and the allocation is tried again.
    LimitedSpace::limit = LimitedSpace::live + 6 * mib;
    LimitedSpace::refused = 0;
    {
      auto big = cache->allocate(7 * mib);
      CHECK(LimitedSpace::refused == 1);
      CHECK(cache->cached_bytes() == 0);
      CHECK(LimitedSpace::live == 7 * mib);
      // Nothing left to give back: the space's error reaches the caller, and the cache still works.
      CHECK_THROWS_AS(cache->allocate(2 * mib), std::bad_alloc);
    }
    CHECK(cache->cached_bytes() == 0);  // 7 MiB is past the cap
    CHECK(LimitedSpace::live == 0);
    auto again = cache->allocate(2 * mib);
    CHECK(again != nullptr);
  }
  CHECK(LimitedSpace::live == 0);  // the cache gives its free blocks back when it goes
}

TEST_CASE("reshard errors: another mesh, an unbound mesh; nothing half-changed") {
  sl::test::for_each_run([](sl::Context& ctx) {
    const int n = ctx.num_devices();
    const M2 a(ctx, {n, 1}), b(ctx, {1, n});
    auto src = Tensor<Rows>::iota(a, {4, 3});
    auto dst = Tensor<Cols>::full(b, {4, 3}, 9.0f);
    const float* before = dst.local().data();
    if (n > 1) {
      const std::string msg = "shardlib: cannot assign a tensor of shape [4, 3] with Spec<\"x\", none> on mesh {x: " +
                              std::to_string(n) + ", y: 1} to a tensor of shape [4, 3] with Spec<none, \"x\"> on mesh "
                              "{x: 1, y: " + std::to_string(n) + "}: the meshes differ";
      CHECK_THROWS_WITH_AS(dst = src, msg.c_str(), std::invalid_argument);
      CHECK(dst.local().data() == before);
      CHECK(dst.to_host() == std::vector<float>(12, 9.0f));
    }
    const M2 unbound({n, 1});
    CHECK_THROWS_WITH_AS(Tensor<Rows>::zeros(unbound, {2, 2}), doctest::Contains("is not bound to a device"),
                         std::logic_error);
    CHECK_THROWS_WITH_AS(M2(ctx, {n + 1, 1}), doctest::Contains("the axis sizes must multiply to the device count"),
                         std::invalid_argument);
  });
}
}
