// SPDX-License-Identifier: Apache-2.0
// Oracle property test of resharding: random meshes (1 to 3 axes over the run's devices), random
// shapes (uneven and empty dims), random source and target shardings (partial sum/max/min too)
// and element types. After each reshard every device's block must equal its slice of the global
// tensor (for a partial target: reduce over its partial group, with the collectives layer, and
// compare), and the counters must show the lower bound for every transition one collective can
// do. Runs on 1..8 threads devices and under mpirun.
#include <doctest/doctest.h>
#include <shardlib/tensor.hpp>

#include "../collectives/harness.hpp"
#include "../sharding/random.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace sl = shardlib;
namespace coll = shardlib::coll;

namespace {
using sl::test::Rng;

std::uint64_t hash(std::uint64_t x) { return sl::detail::mix64(x); }

// Addend of element k held by the device at position p of the source's partial group.
int addend(std::int64_t k, int p) { return static_cast<int>(hash(static_cast<std::uint64_t>(k) * 64 + static_cast<std::uint64_t>(p)) % 8); }

int expected_value(std::int64_t k, const sl::Sharding& from, const sl::MeshShape& mesh) {
  if (!from.is_partial()) return static_cast<int>(hash(static_cast<std::uint64_t>(k)) % 100);
  const int n = mesh.group_size(from.partial);
  int v = addend(k, 0);
  for (int p = 1; p < n; ++p) {
    const int a = addend(k, p);
    v = from.op == sl::ReduceOp::sum ? v + a : from.op == sl::ReduceOp::max ? std::max(v, a) : std::min(v, a);
  }
  return v;
}

std::int64_t linear(const sl::ShardBox& b, std::int64_t local, const std::vector<std::int64_t>& shape) {
  std::int64_t k = 0, rest = local;
  std::array<std::int64_t, 8> idx{};
  for (int d = b.rank - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    idx[u] = b.offset[u] + rest % b.extent[u];
    rest /= b.extent[u];
  }
  for (int d = 0; d < b.rank; ++d) k = k * shape[static_cast<std::size_t>(d)] + idx[static_cast<std::size_t>(d)];
  return k;
}

struct Totals {
  int cases = 0, exact_bound = 0, single_reduce = 0;
};

template <class T>
void run_case(sl::Context& ctx, const sl::MeshShape& mesh, const std::vector<std::int64_t>& shape,
              const sl::Sharding& from, const sl::Sharding& to, Totals& totals) {
  const int me = ctx.device();
  const sl::ShardBox a = sl::shard_box(from, mesh, shape, me), b = sl::shard_box(to, mesh, shape, me);
  std::vector<T> src(static_cast<std::size_t>(a.num_elements()));
  const int p = from.is_partial() ? mesh.group_rank(me, from.partial) : 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const std::int64_t k = linear(a, static_cast<std::int64_t>(i), shape);
    src[i] = static_cast<T>(from.is_partial() ? addend(k, p) : expected_value(k, from, mesh));
  }
  const sl::ReshardSchedule s = sl::schedule_reshard(sl::plan_reshard(from, to), mesh, shape);
  INFO(sl::describe(s, mesh, shape, me, sizeof(T)));
  const auto& compiled = sl::detail::compiled_reshard(ctx, mesh, from, to, shape);
  REQUIRE(compiled.schedule.num_steps == s.num_steps);
  std::vector<T> out;
  coll::CommRecorder rec;
  auto scratch = [](std::size_t n) { return std::shared_ptr<void>(new T[n], [](void* p) { delete[] static_cast<T*>(p); }); };
  sl::detail::run_reshard(ctx, compiled, src.data(), scratch, [&](std::size_t n) {
    out.resize(n);
    return out.data();
  });
  if (s.num_steps == 0) out = src;  // nothing to do: the block is the same
  REQUIRE(out.size() == static_cast<std::size_t>(b.num_elements()));
  const std::uint64_t received = rec.total_bytes_received(), calls = rec.total_calls();

  // Values: a partial target is reduced over its partial group first (collectives layer).
  if (to.is_partial())
    ctx.group(mesh, to.partial).all_reduce(out.data(), out.data(), out.size(), coll::dtype_of<T>(), to.op);
  bool ok = true;
  for (std::size_t i = 0; i < out.size() && ok; ++i) {
    const std::int64_t k = linear(b, static_cast<std::int64_t>(i), shape);
    const T want = static_cast<T>(expected_value(k, from, mesh));
    if (out[i] != want) {
      ok = false;
      FAIL_CHECK("device " << me << ": element " << k << " is " << +out[i] << ", expected " << +want);
    }
  }
  // Bytes: between non-partial layouts, exactly the elements needed and not held arrive.
  if (!from.is_partial() && !to.is_partial()) {
    const auto bound = static_cast<std::uint64_t>(b.num_elements() - sl::intersect(a, b).num_elements()) * sizeof(T);
    CHECK(received == bound);
    CHECK(calls <= 1);
    ++totals.exact_bound;
  }
  // Partial to the same dims, replicated: one all_reduce. Partial to dims refined by the reduced
  // axes (even shapes): one reduce_scatter whose bytes are the bound (own block × (n - 1)).
  if (from.is_partial() && !to.is_partial()) {
    bool same_dims = true, refined = true, even = true;
    int parts_used = 0;
    for (int d = 0; d < from.rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      same_dims = same_dims && from.dims[u] == to.dims[u];
      const sl::AxisList& f = from.dims[u];
      const sl::AxisList& t = to.dims[u];
      refined = refined && t.size() >= f.size();
      for (int i = 0; refined && i < f.size(); ++i) refined = f[i] == t[i];
      for (int i = f.size(); refined && i < t.size(); ++i) refined = from.partial.contains(t[i]);
      parts_used += t.size() - f.size();
      even = even && shape[u] % mesh.group_size(t) == 0;
    }
    const std::uint64_t one = mesh.group_size(from.partial) > 1 ? 1 : 0;  // groups of one device: a copy
    if (same_dims) {
      CHECK(calls == one);
      ++totals.single_reduce;
    } else if (refined && even && parts_used == from.partial.size()) {
      const std::uint64_t n = static_cast<std::uint64_t>(mesh.group_size(from.partial));
      CHECK(calls == one);
      CHECK(received == static_cast<std::uint64_t>(b.num_elements()) * sizeof(T) * (n - 1));
      ++totals.single_reduce;
    }
  }
  ++totals.cases;
}

void property(sl::Context& ctx, int cases, std::uint64_t seed) {
  const int n = ctx.num_devices();
  Rng r{std::mt19937_64(seed + static_cast<std::uint64_t>(n))};  // the same draws on every device
  Totals totals;
  for (int c = 0; c < cases; ++c) {
    const sl::MeshShape mesh = sl::test::random_mesh(r, n);
    const int mesh_rank = mesh.rank();
    const int rank = r.below(8) == 0 ? 0 : 1 + r.below(3);
    std::vector<std::int64_t> shape;
    for (int d = 0; d < rank; ++d) shape.push_back(r.below(5) == 0 ? r.below(2) : r.below(13));
    const sl::Sharding from = sl::test::random_sharding(r, mesh_rank, rank, true),
                      to = sl::test::random_sharding(r, mesh_rank, rank, true);
    CAPTURE(c);
    CAPTURE(mesh.to_string());
    switch (r.below(5)) {
      case 0: run_case<float>(ctx, mesh, shape, from, to, totals); break;
      case 1: run_case<double>(ctx, mesh, shape, from, to, totals); break;
      case 2: run_case<std::int32_t>(ctx, mesh, shape, from, to, totals); break;
      case 3: run_case<std::int8_t>(ctx, mesh, shape, from, to, totals); break;
      default: run_case<std::uint16_t>(ctx, mesh, shape, from, to, totals); break;
    }
  }
  CHECK(totals.cases == cases);
  CHECK(totals.exact_bound > cases / 8);
  if (n > 1) CHECK(totals.single_reduce > 0);
}
}  // namespace

TEST_SUITE("tensor_reshard") {
TEST_CASE("reshard matches the one-device oracle, at the lower bound (random meshes, shapes, specs, types)") {
  sl::test::for_each_run([](sl::Context& ctx) { property(ctx, sl::test::mpi_runtime() ? 500 : 2000, 42); });
}
}
