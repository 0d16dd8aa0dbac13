// SPDX-License-Identifier: Apache-2.0
// Semantics of every collective, on any backend: each device computes what every other device
// holds (value = f(rank, index)), so results are checked without gathering anything.
#include "harness.hpp"

#include <doctest/doctest.h>
#include <shardlib/collectives/communicator.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace sl = shardlib;
using sl::coll::DType;
using sl::coll::Op;
using sl::coll::dtype_of;
using sl::test::for_each_run;

namespace {
// A value that device `r` holds at index `i`, small enough that sums and products stay exact.
template <class T>
T val(int r, std::size_t i) {
  return static_cast<T>(1 + (static_cast<std::size_t>(r) * 7 + i * 3) % 5);
}
template <class T>
T reduce_ref(Op op, int n, std::size_t i, int offset_rank_base = 0) {
  T acc = val<T>(offset_rank_base, i);
  for (int r = 1; r < n; ++r) {
    T x = val<T>(r, i);
    switch (op) {
      case Op::sum: acc = static_cast<T>(acc + x); break;
      case Op::prod: acc = static_cast<T>(acc * x); break;
      case Op::max: acc = std::max(acc, x); break;
      case Op::min: acc = std::min(acc, x); break;
    }
  }
  return acc;
}
// Uneven block sizes with zeros: 1, 4, 0, 3, 1, 4, 0, ...
std::vector<std::size_t> uneven(int n) {
  std::vector<std::size_t> c(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) c[static_cast<std::size_t>(r)] = static_cast<std::size_t>((r * 3 + 1) % 5);
  return c;
}
std::size_t offset(const std::vector<std::size_t>& c, int r) {
  return std::accumulate(c.begin(), c.begin() + r, std::size_t{0});
}

template <class T>
void check_all_gather(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  const std::size_t count = 5;
  std::vector<T> send(count), recv(count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < count; ++i) send[i] = val<T>(me, i);
  comm.all_gather(send.data(), recv.data(), count, dtype_of<T>());
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) REQUIRE(recv[static_cast<std::size_t>(r) * count + i] == val<T>(r, i));

  auto c = uneven(n);
  std::vector<T> usend(c[static_cast<std::size_t>(me)]), urecv(offset(c, n));
  for (std::size_t i = 0; i < usend.size(); ++i) usend[i] = val<T>(me, i);
  comm.all_gather(usend.data(), urecv.data(), c, dtype_of<T>());
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < c[static_cast<std::size_t>(r)]; ++i) REQUIRE(urecv[offset(c, r) + i] == val<T>(r, i));

  // In place: this device's block already sits in the output.
  std::vector<T> inplace(offset(c, n));
  for (std::size_t i = 0; i < c[static_cast<std::size_t>(me)]; ++i) inplace[offset(c, me) + i] = val<T>(me, i);
  comm.all_gather(inplace.data() + offset(c, me), inplace.data(), c, dtype_of<T>());
  REQUIRE(inplace == urecv);
}

template <class T>
void check_reductions(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (Op op : {Op::sum, Op::prod, Op::max, Op::min}) {
    CAPTURE(sl::coll::name(op));
    // all_reduce, out of place and in place.
    const std::size_t count = 7;
    std::vector<T> send(count), recv(count);
    for (std::size_t i = 0; i < count; ++i) send[i] = val<T>(me, i);
    comm.all_reduce(send.data(), recv.data(), count, dtype_of<T>(), op);
    for (std::size_t i = 0; i < count; ++i) REQUIRE(recv[i] == reduce_ref<T>(op, n, i));
    comm.all_reduce(send.data(), send.data(), count, dtype_of<T>(), op);
    REQUIRE(send == recv);

    // reduce_scatter, uniform: block r of the reduction.
    const std::size_t block = 3;
    std::vector<T> rs_send(block * static_cast<std::size_t>(n)), rs_recv(block);
    for (std::size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = val<T>(me, i);
    comm.reduce_scatter(rs_send.data(), rs_recv.data(), block, dtype_of<T>(), op);
    for (std::size_t i = 0; i < block; ++i)
      REQUIRE(rs_recv[i] == reduce_ref<T>(op, n, static_cast<std::size_t>(me) * block + i));

    // reduce_scatter, uneven.
    auto c = uneven(n);
    std::vector<T> u_send(offset(c, n)), u_recv(c[static_cast<std::size_t>(me)]);
    for (std::size_t i = 0; i < u_send.size(); ++i) u_send[i] = val<T>(me, i);
    comm.reduce_scatter(u_send.data(), u_recv.data(), c, dtype_of<T>(), op);
    for (std::size_t i = 0; i < u_recv.size(); ++i) REQUIRE(u_recv[i] == reduce_ref<T>(op, n, offset(c, me) + i));
  }
}

template <class T>
void check_all_to_all(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  // Element i of the block from p to q is 10000*p + 100*q + i (fits every type by reduction mod).
  auto v = [](int p, int q, std::size_t i) { return static_cast<T>((p * 31 + q * 7 + static_cast<int>(i)) % 100); };
  const std::size_t count = 4;
  std::vector<T> send(count * static_cast<std::size_t>(n)), recv(send.size());
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < count; ++i) send[static_cast<std::size_t>(q) * count + i] = v(me, q, i);
  comm.all_to_all(send.data(), recv.data(), count, dtype_of<T>());
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < count; ++i) REQUIRE(recv[static_cast<std::size_t>(p) * count + i] == v(p, me, i));

  // Uneven: p sends (p + q) % 3 elements to q.
  auto sz = [](int p, int q) { return static_cast<std::size_t>((p + q) % 3); };
  std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    sc[static_cast<std::size_t>(q)] = sz(me, q);
    rc[static_cast<std::size_t>(q)] = sz(q, me);
  }
  std::vector<T> us(offset(sc, n)), ur(offset(rc, n));
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i) us[offset(sc, q) + i] = v(me, q, i);
  comm.all_to_all(us.data(), sc, ur.data(), rc, dtype_of<T>());
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < rc[static_cast<std::size_t>(p)]; ++i) REQUIRE(ur[offset(rc, p) + i] == v(p, me, i));
}

void check_point_to_point(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  // Broadcast from every root.
  for (int root = 0; root < n; ++root) {
    std::vector<double> buf(6, me == root ? 0.0 : -1.0);
    if (me == root)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = root * 10.0 + static_cast<double>(i);
    comm.broadcast(buf.data(), buf.size(), DType::f64, root);
    for (std::size_t i = 0; i < buf.size(); ++i) REQUIRE(buf[i] == root * 10.0 + static_cast<double>(i));
  }
  // Ring shift with permute: send to me+1, receive from me-1.
  std::vector<std::int64_t> out(3, me), in(3, -1);
  comm.permute(out.data(), out.size(), (me + 1) % n, in.data(), in.size(), (me + n - 1) % n, DType::i64);
  for (auto x : in) REQUIRE(x == (me + n - 1) % n);
  // Permute where only even ranks send (to the next rank) and odd ranks receive.
  std::vector<int> pin(2, -7);
  bool sends = me % 2 == 0 && me + 1 < n, receives = me % 2 == 1;
  std::vector<int> pout(2, 100 + me);
  comm.permute(pout.data(), 2, sends ? me + 1 : -1, pin.data(), 2, receives ? me - 1 : -1, DType::i32);
  for (auto x : pin) REQUIRE(x == (receives ? 100 + me - 1 : -7));
  // send/recv: everyone sends to the next rank first, then receives (eager sends do not block on
  // threads; MPI buffers small messages), and a message to itself.
  std::vector<float> msg(4, static_cast<float>(me)), got(4, -1.f);
  if (n > 1) {
    if (me % 2 == 0) {
      comm.send(msg.data(), 4, DType::f32, (me + 1) % n, 7);
      comm.recv(got.data(), 4, DType::f32, (me + n - 1) % n, 7);
    } else {
      comm.recv(got.data(), 4, DType::f32, (me + n - 1) % n, 7);
      comm.send(msg.data(), 4, DType::f32, (me + 1) % n, 7);
    }
    for (auto x : got) REQUIRE(x == static_cast<float>((me + n - 1) % n));
  }
  comm.barrier();
}
}  // namespace

TEST_SUITE("collectives") {
  TEST_CASE("all_gather: uniform, uneven with empty blocks, in place; several element types") {
    for_each_run([](sl::Context& ctx) {
      check_all_gather<std::int32_t>(ctx.world());
      check_all_gather<double>(ctx.world());
      check_all_gather<std::uint8_t>(ctx.world());
      check_all_gather<std::int64_t>(ctx.world());
    });
  }

  TEST_CASE("all_reduce and reduce_scatter: every op, several element types, uneven blocks") {
    for_each_run([](sl::Context& ctx) {
      check_reductions<std::int32_t>(ctx.world());
      check_reductions<std::int64_t>(ctx.world());
      check_reductions<std::uint8_t>(ctx.world());
      check_reductions<float>(ctx.world());
      check_reductions<double>(ctx.world());
    });
  }

  TEST_CASE("all_to_all: uniform and uneven") {
    for_each_run([](sl::Context& ctx) {
      check_all_to_all<std::int32_t>(ctx.world());
      check_all_to_all<float>(ctx.world());
      check_all_to_all<std::uint16_t>(ctx.world());
    });
  }

  TEST_CASE("broadcast, permute, send/recv, barrier") {
    for_each_run([](sl::Context& ctx) { check_point_to_point(ctx.world()); });
  }

  TEST_CASE("empty buffers: every collective with zero elements") {
    for_each_run([](sl::Context& ctx) {
      auto& c = ctx.world();
      c.all_gather(nullptr, nullptr, 0, DType::f32);
      c.all_reduce(nullptr, nullptr, 0, DType::f32, Op::sum);
      c.reduce_scatter(nullptr, nullptr, 0, DType::f32, Op::max);
      c.all_to_all(nullptr, nullptr, 0, DType::f32);
      c.broadcast(nullptr, 0, DType::f32, 0);
      c.permute(nullptr, 0, (c.rank() + 1) % c.size(), nullptr, 0, (c.rank() + c.size() - 1) % c.size(), DType::f32);
      CHECK(c.size() == ctx.num_devices());
    });
  }

  TEST_CASE("groups of 1-, 2- and 3-axis meshes: every axis subset, in both orders") {
    struct MeshCase {
      std::vector<sl::AxisName> names;
      std::vector<int> sizes;
    };
    std::vector<MeshCase> meshes = {
        {{"x"}, {8}}, {{"data", "model"}, {4, 2}}, {{"pp", "dp", "tp"}, {2, 2, 2}}, {{"a", "b", "c"}, {1, 4, 2}},
        {{"x"}, {4}}, {{"data", "model"}, {2, 2}}, {{"a", "b", "c"}, {2, 1, 2}},
        {{"x"}, {2}}, {{"data", "model"}, {1, 2}},
    };
    auto run = [&](sl::Context& ctx) {
      for (const auto& mc : meshes) {
        sl::MeshShape mesh(mc.names, mc.sizes);
        if (mesh.num_devices() != ctx.num_devices()) continue;
        // Every ordered subset of the axes (all orders of every subset for up to 3 axes).
        std::vector<sl::AxisList> subsets;
        std::vector<int> idx(static_cast<std::size_t>(mesh.rank()));
        std::iota(idx.begin(), idx.end(), 0);
        for (int mask = 0; mask < (1 << mesh.rank()); ++mask) {
          std::vector<int> sub;
          for (int a = 0; a < mesh.rank(); ++a)
            if (mask & (1 << a)) sub.push_back(a);
          do {
            sl::AxisList l;
            for (int a : sub) l.push_back(a);
            subsets.push_back(l);
          } while (std::next_permutation(sub.begin(), sub.end()));
        }
        for (const auto& axes : subsets) {
          auto& g = ctx.group(mesh, axes);
          auto members = mesh.group_devices(ctx.device(), axes);
          REQUIRE(g.size() == static_cast<int>(members.size()));
          REQUIRE(g.rank() == mesh.group_rank(ctx.device(), axes));
          // The group's all_gather of device ids lists exactly its members, in group-rank order.
          int id = ctx.device();
          std::vector<int> ids(static_cast<std::size_t>(g.size()));
          g.all_gather(&id, ids.data(), 1, DType::i32);
          REQUIRE(ids == members);
          int sum = 0;
          g.all_reduce(&id, &sum, 1, DType::i32, Op::sum);
          REQUIRE(sum == std::accumulate(members.begin(), members.end(), 0));
          REQUIRE(&ctx.group(mesh, axes) == &g);  // cached
        }
      }
    };
    for_each_run(run, {2, 4, 8});
  }

  TEST_CASE("counters: calls and bytes per kind, for this device") {
    for_each_run([](sl::Context& ctx) {
      auto& c = ctx.world();
      const auto n = static_cast<std::uint64_t>(c.size());
      std::vector<float> a(16, 1.f), b(16 * n, 0.f);
      sl::coll::CommRecorder rec;
      {
        sl::coll::CommRecorder inner;  // recorders nest
        c.all_gather(a.data(), b.data(), 16, DType::f32);
        CHECK(inner[sl::coll::Kind::all_gather].calls == 1);
      }
      c.all_reduce(a.data(), a.data(), 16, DType::f32, Op::sum);
      c.barrier();
      CHECK(rec[sl::coll::Kind::all_gather].calls == 1);
      CHECK(rec[sl::coll::Kind::all_gather].bytes_sent == 64 * (n - 1));
      CHECK(rec[sl::coll::Kind::all_gather].bytes_received == 64 * (n - 1));
      CHECK(rec[sl::coll::Kind::all_reduce].bytes_sent == 2 * 64 * (n - 1) / n);
      CHECK(rec[sl::coll::Kind::barrier].calls == 1);
      CHECK(rec.total_calls() == 3);
      CHECK(rec[sl::coll::Kind::all_to_all].calls == 0);
      CHECK(rec.to_string().find("all_gather: 1 call, ") == 0);
    });
  }
}
