// SPDX-License-Identifier: Apache-2.0
// Semantics of every collective, on any backend: each device computes what every other device
// holds (value = f(rank, index)), so results are checked without gathering anything.
#include "harness.hpp"

#include <doctest/doctest.h>
#include <shardlib/collectives/communicator.hpp>
#include <shardlib/collectives/threads_device.hpp>
#include <shardlib/runtime/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <stdexcept>
#include <string>
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

using sl::coll::Region;

constexpr auto box = sl::coll::Region::strided;

// A matrix of n*rb rows and n*cb columns, distributed by rows, redistributed by columns
// (rank r: columns [r*cb, (r+1)*cb)), once as plain column blocks, once transposed, and back.
template <class T>
void check_exchange_transpose(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  const auto un = static_cast<std::size_t>(n), ume = static_cast<std::size_t>(me);
  const std::size_t rb = 2, cb = 3, rows = un * rb, cols = un * cb;
  auto g = [](std::size_t i, std::size_t j) { return static_cast<T>((i * 13 + j * 7) % 101); };
  std::vector<T> a(rb * cols);  // my rows: a[i][j] = g(me*rb + i, j)
  for (std::size_t i = 0; i < rb; ++i)
    for (std::size_t j = 0; j < cols; ++j) a[i * cols + j] = g(ume * rb + i, j);
  std::vector<Region> send(un), recv(un), recv_t(un);
  for (std::size_t p = 0; p < un; ++p) {
    send[p] = box(p * cb, {rb, cb}, {cols, 1});            // my rows, p's columns
    recv[p] = box(p * rb * cb, {rb, cb}, {cb, 1});         // p's rows of my columns: rows x cb
    recv_t[p] = box(p * rb, {rb, cb}, {1, rows});          // the same, transposed: cb x rows
  }
  std::vector<T> b(rows * cb, static_cast<T>(-1)), bt(cb * rows, static_cast<T>(-1));
  comm.exchange(a.data(), send, b.data(), recv, sl::coll::dtype_of<T>());
  comm.exchange(a.data(), send, bt.data(), recv_t, sl::coll::dtype_of<T>());
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cb; ++j) {
      REQUIRE(b[i * cb + j] == g(i, ume * cb + j));
      REQUIRE(bt[j * rows + i] == g(i, ume * cb + j));
    }
  // Back from the transposed columns to rows: strided on the send side now.
  std::vector<T> back(rb * cols, static_cast<T>(-1));
  comm.exchange(bt.data(), recv_t, back.data(), send, sl::coll::dtype_of<T>());
  REQUIRE(back == a);
}

// Shapes differ, counts agree: a 3x4 box (row stride 10) lands as a contiguous run of 12,
// which goes on into a 2x6 box (row stride 15, element stride 2).
void check_exchange_shapes(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  const auto un = static_cast<std::size_t>(n);
  auto v = [](int p, int q, std::size_t k) { return static_cast<std::int32_t>(p * 1000 + q * 100 + static_cast<int>(k)); };
  std::vector<std::int32_t> src(un * 40, -1), mid(un * 12, -1), dst(un * 30, -1);
  std::vector<Region> boxes(un), runs(un), wide(un);
  for (int q = 0; q < n; ++q) {
    const auto uq = static_cast<std::size_t>(q);
    boxes[uq] = box(uq * 40 + 3, {3, 4}, {10, 1});
    runs[uq] = Region::contiguous(uq * 12, 12);
    wide[uq] = box(uq * 30 + 1, {2, 6}, {15, 2});
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 4; ++j) src[uq * 40 + 3 + i * 10 + j] = v(me, q, i * 4 + j);
  }
  comm.exchange(src.data(), boxes, mid.data(), runs, DType::i32);
  for (int p = 0; p < n; ++p)
    for (std::size_t k = 0; k < 12; ++k) REQUIRE(mid[static_cast<std::size_t>(p) * 12 + k] == v(p, me, k));
  comm.exchange(mid.data(), runs, dst.data(), wide, DType::i32);  // mid's block p goes back to p
  std::vector<std::int32_t> want(un * 30, -1);
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 6; ++j) want[static_cast<std::size_t>(q) * 30 + 1 + i * 15 + j * 2] = v(me, q, i * 6 + j);
  REQUIRE(dst == want);
}

// Only pairs with (p + 2q) % 3 == 0 carry data (1 + (p + q) % 4 elements); the others are
// empty regions, of rank 0 or with a zero extent. Returns the elements this rank sent to others.
std::size_t check_exchange_sparse(sl::coll::Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  const auto un = static_cast<std::size_t>(n);
  auto count = [](int p, int q) { return (p + 2 * q) % 3 == 0 ? static_cast<std::size_t>(1 + (p + q) % 4) : 0; };
  auto empty = [](int p, int q) { return (p + q) % 2 ? Region{} : box(0, {3, 0}, {1, 1}); };
  std::vector<double> send(un * 4), recv(un * 8, -1.0);
  std::vector<Region> sr(un), rr(un);
  std::size_t to_others = 0;
  for (int q = 0; q < n; ++q) {
    const auto uq = static_cast<std::size_t>(q);
    for (std::size_t k = 0; k < 4; ++k) send[uq * 4 + k] = me * 100.0 + q * 10.0 + static_cast<double>(k);
    sr[uq] = count(me, q) ? Region::contiguous(uq * 4, count(me, q)) : empty(me, q);
    rr[uq] = count(q, me) ? box(uq * 8, {count(q, me)}, {2}) : empty(q, me);
    if (q != me) to_others += count(me, q);
  }
  comm.exchange(send.data(), sr, recv.data(), rr, DType::f64);
  for (int p = 0; p < n; ++p)
    for (std::size_t k = 0; k < 8; ++k) {
      const double got = recv[static_cast<std::size_t>(p) * 8 + k];
      if (k % 2 == 0 && k / 2 < count(p, me)) REQUIRE(got == p * 100.0 + me * 10.0 + static_cast<double>(k / 2));
      else REQUIRE(got == -1.0);  // untouched
    }
  // Nothing at all, with null buffers.
  std::vector<Region> none(un);
  comm.exchange(nullptr, none, nullptr, none, DType::f64);
  return to_others;
}

// Only the self pair carries data: a 2x3 box (row stride 5) into its transpose.
void check_exchange_self(sl::coll::Communicator& comm) {
  const auto un = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
  std::vector<std::uint8_t> src(10), dst(6, 0);
  for (std::size_t i = 0; i < 10; ++i) src[i] = static_cast<std::uint8_t>(10 * me + i);
  std::vector<Region> sr(un), rr(un);
  sr[me] = box(0, {2, 3}, {5, 1});
  rr[me] = box(0, {2, 3}, {1, 2});
  comm.exchange(src.data(), sr, dst.data(), rr, DType::u8);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) REQUIRE(dst[j * 2 + i] == src[i * 5 + j]);
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

  TEST_CASE("exchange: 2-D transpose of blocks between ranks, element types i8/u16/f32/f64") {
    for_each_run([](sl::Context& ctx) {
      check_exchange_transpose<std::int8_t>(ctx.world());
      check_exchange_transpose<std::uint16_t>(ctx.world());
      check_exchange_transpose<float>(ctx.world());
      check_exchange_transpose<double>(ctx.world());
    });
  }

  TEST_CASE("exchange: shapes differ, counts agree (strided -> contiguous -> strided)") {
    for_each_run([](sl::Context& ctx) { check_exchange_shapes(ctx.world()); });
  }

  TEST_CASE("exchange: empty regions, only some pairs carrying data, nothing at all") {
    for_each_run([](sl::Context& ctx) { check_exchange_sparse(ctx.world()); });
  }

  TEST_CASE("exchange: the self pair alone") {
    for_each_run([](sl::Context& ctx) { check_exchange_self(ctx.world()); });
  }

  TEST_CASE("exchange: counted as all_to_all, bytes to and from other ranks only") {
    for_each_run([](sl::Context& ctx) {
      auto& c = ctx.world();
      const auto n = static_cast<std::uint64_t>(c.size());
      sl::coll::CommRecorder rec;
      const std::size_t to_others = check_exchange_sparse(c);  // two calls: the second moves nothing
      CHECK(rec[sl::coll::Kind::all_to_all].calls == 2);
      CHECK(rec[sl::coll::Kind::all_to_all].bytes_sent == 8 * to_others);
      // What this rank gets from others: the same rule, read the other way.
      std::uint64_t from_others = 0;
      for (int p = 0; p < c.size(); ++p)
        if (p != c.rank() && (p + 2 * c.rank()) % 3 == 0) from_others += static_cast<std::uint64_t>(1 + (p + c.rank()) % 4);
      CHECK(rec[sl::coll::Kind::all_to_all].bytes_received == 8 * from_others);
      rec.reset();
      check_exchange_transpose<float>(c);  // three calls of n-1 blocks of 2x3 floats each way
      CHECK(rec[sl::coll::Kind::all_to_all].calls == 3);
      CHECK(rec[sl::coll::Kind::all_to_all].bytes_sent == 3 * 24 * (n - 1));
      CHECK(rec[sl::coll::Kind::all_to_all].bytes_received == 3 * 24 * (n - 1));
      rec.reset();
      check_exchange_self(c);
      CHECK(rec[sl::coll::Kind::all_to_all].calls == 1);
      CHECK(rec.total_bytes_sent() == 0);
      CHECK(rec.total_bytes_received() == 0);
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

  TEST_CASE("groups: devices asking for different groups at the same point throw on every device, naming them") {
    // Making a group splits the whole world: device 0 asking for {data} where the others ask for
    // {model} would pair in one split (wrong groups, silently) without the check.
    for_each_run([](sl::Context& ctx) {
      const int n = ctx.num_devices();
      if (n % 2) return;  // (mpirun -np 5)
      sl::MeshShape mesh({"data", "model"}, {n / 2, 2});
      const sl::AxisList data{0}, model{1};
      const bool first = ctx.device() == 0;
      try {
        ctx.group(mesh, first ? data : model);
        FAIL("no exception on device " << ctx.device());
      } catch (const std::logic_error& e) {
        const std::string m = e.what();
        const std::string others = n > 2 ? "devices 1, 2" : "device 1 asks";
        CHECK_MESSAGE(m.find("different groups at the same point (device 0 asks for 'group {data} of mesh "
                             "{data: " + std::to_string(n / 2) + ", model: 2}'") != std::string::npos, m);
        CHECK_MESSAGE(m.find(others) != std::string::npos, m);
        CHECK_MESSAGE(m.find("for 'group {model} of mesh") != std::string::npos, m);
      }
      // Nothing was made: asked for in one order, both groups work.
      for (const auto& axes : {data, model}) {
        auto& g = ctx.group(mesh, axes);
        int id = ctx.device(), sum = 0;
        g.all_reduce(&id, &sum, 1, DType::i32, Op::sum);
        const auto members = mesh.group_devices(ctx.device(), axes);
        CHECK(sum == std::accumulate(members.begin(), members.end(), 0));
      }
    }, {2, 4, 6});
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
      CHECK(rec.calls().empty());  // a plain recorder keeps no list
    });
  }

  TEST_CASE("trace: the collectives of a block in order, with group and bytes; nested recorders still count") {
    for_each_run([](sl::Context& ctx) {
      auto& c = ctx.world();
      const int n = c.size();
      std::vector<float> a(256, 1.f), b(256 * static_cast<std::size_t>(n), 0.f);
      sl::coll::CommRecorder outer;
      const sl::coll::CommTrace t = sl::coll::trace([&] {
        c.all_gather(a.data(), b.data(), 256, DType::f32);
        c.all_reduce(a.data(), a.data(), 16, DType::f32, Op::sum);
        c.barrier();
      });
      REQUIRE(t.calls.size() == 3);
      CHECK(t.calls[0].kind == sl::coll::Kind::all_gather);
      CHECK(t.calls[1].kind == sl::coll::Kind::all_reduce);
      CHECK(t.calls[2].kind == sl::coll::Kind::barrier);
      CHECK(t.calls[0].group == c.name());
      CHECK(t.calls[0].group_size == n);
      CHECK(t.calls[0].bytes_received == 1024u * static_cast<std::uint64_t>(n - 1));
      CHECK(t.totals.total_calls() == 3);
      CHECK(outer.total_calls() == 3);
      const std::string text = t.to_string();
      CHECK_MESSAGE(text.find("3 collectives: ") == 0, text);
      CHECK_MESSAGE(text.find("  1. all_gather over world (" + std::to_string(n) + (n == 1 ? " device): " : " devices): ")) !=
                        std::string::npos,
                    text);
      CHECK_MESSAGE(text.find("  3. barrier over world") != std::string::npos, text);
      if (n == 2)
        CHECK_MESSAGE(text.find("all_gather over world (2 devices): 1.00 KiB sent, 1.00 KiB received") != std::string::npos, text);
      // The block's exception passes through; the recorder is gone with it.
      CHECK_THROWS_AS(sl::coll::trace([] { throw std::runtime_error("step failed"); }), std::runtime_error);
      CHECK(sl::coll::trace([] {}).to_string() == "0 collectives: 0 B sent, 0 B received (this device)\n");
    });
  }

  TEST_CASE("dry_run: collectives counted, not performed; each receive buffer gets this device's own part and zeros") {
    for_each_run([](sl::Context& ctx) {
      auto& c = ctx.world();
      const int n = c.size(), me = c.rank();
      const auto un = static_cast<std::size_t>(n);
      std::vector<float> own(4, static_cast<float>(me + 1)), all(4 * un, -1.f), big(4 * un);
      for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(me * 100 + static_cast<int>(i));
      auto step = [&] {
        c.all_gather(own.data(), all.data(), 4, DType::f32);
        c.all_reduce(own.data(), own.data(), 4, DType::f32, Op::sum);
        c.barrier();
      };
      const sl::coll::CommTrace dry = sl::coll::dry_run(step);
      CHECK_FALSE(sl::coll::DryRun::active());
      for (std::size_t i = 0; i < all.size(); ++i)  // own block, zeros for the others' (none sent)
        CHECK(all[i] == (i / 4 == static_cast<std::size_t>(me) ? static_cast<float>(me + 1) : 0.f));
      CHECK(own[0] == static_cast<float>(me + 1));  // the in-place all_reduce left this device's input
      const sl::coll::CommTrace real = sl::coll::trace(step);
      CHECK(dry.to_string() == real.to_string());  // the same calls, groups and bytes as the real run
      CHECK(own[0] == static_cast<float>(n * (n + 1) / 2));
      sl::coll::dry_run([&] {
        std::vector<float> rs(4, -1.f), a2a(4 * un, -1.f), out(4, -1.f), b(4, static_cast<float>(me));
        c.reduce_scatter(big.data(), rs.data(), 4, DType::f32, Op::sum);
        for (std::size_t i = 0; i < 4; ++i) CHECK(rs[i] == big[4 * static_cast<std::size_t>(me) + i]);
        c.all_to_all(big.data(), a2a.data(), 4, DType::f32);
        for (std::size_t i = 0; i < a2a.size(); ++i)
          CHECK(a2a[i] == (i / 4 == static_cast<std::size_t>(me) ? big[i] : 0.f));
        c.all_reduce(b.data(), out.data(), 4, DType::f32, Op::max);
        CHECK(out[3] == static_cast<float>(me));
        c.broadcast(b.data(), 4, DType::f32, 0);
        CHECK(b[0] == 0.f);  // root 0 keeps its 0; the others get zeros
        std::vector<float> pr(4, -1.f);
        c.permute(own.data(), 4, (me + 1) % n, pr.data(), 4, (me + n - 1) % n, DType::f32);
        CHECK(pr[0] == (n == 1 ? own[0] : 0.f));
        // exchange: the pair to itself copied (a column of a 2 x n block into a row), the others zeroed
        std::vector<float> src(2 * un), dst(2 * un, -1.f);
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i + 1);
        std::vector<sl::coll::Region> send(un), recv(un);
        for (int p = 0; p < n; ++p) {
          send[static_cast<std::size_t>(p)] = sl::coll::Region::strided(static_cast<std::size_t>(p), {2}, {un});
          recv[static_cast<std::size_t>(p)] = sl::coll::Region::contiguous(2 * static_cast<std::size_t>(p), 2);
        }
        c.exchange(src.data(), send, dst.data(), recv, DType::f32);
        for (int p = 0; p < n; ++p)
          for (std::size_t j = 0; j < 2; ++j)
            CHECK(dst[2 * static_cast<std::size_t>(p) + j] ==
                  (p == me ? src[j * un + static_cast<std::size_t>(me)] : 0.f));
        auto pending = c.start_exchange(src.data(), send, dst.data(), recv, DType::f32);
        pending->wait();
        // all_gather in place: this device's block is already in the output, and stays
        std::vector<float> inplace(4 * un, 7.f);
        for (std::size_t i = 0; i < 4; ++i) inplace[4 * static_cast<std::size_t>(me) + i] = static_cast<float>(me + 1);
        c.all_gather(inplace.data() + 4 * me, inplace.data(), 4, DType::f32);
        for (std::size_t i = 0; i < inplace.size(); ++i)
          CHECK(inplace[i] == (i / 4 == static_cast<std::size_t>(me) ? static_cast<float>(me + 1) : 0.f));
      });
      // A dry run that throws leaves no dry state behind.
      CHECK_THROWS_AS(sl::coll::dry_run([] { throw std::runtime_error("step failed"); }), std::runtime_error);
      CHECK_FALSE(sl::coll::DryRun::active());
    });
  }

  TEST_CASE("bytes_text: bytes as people read them") {
    CHECK(sl::coll::bytes_text(0) == "0 B");
    CHECK(sl::coll::bytes_text(1023) == "1023 B");
    CHECK(sl::coll::bytes_text(1024) == "1.00 KiB");
    CHECK(sl::coll::bytes_text(393216) == "384 KiB");
    CHECK(sl::coll::bytes_text(3u << 19) == "1.50 MiB");
    CHECK(sl::coll::bytes_text(40ull << 30) == "40.0 GiB");
  }

  TEST_CASE("the threads communicator over device memory, run on host instances: every collective, sub-groups, dry runs") {
    // collectives/threads_device.hpp's ThreadDeviceCommunicator with a host execution space: the
    // protocol and the data movement a GPU runs (copies and region copies as rectangles, the
    // reduction kernel, the event hooks, which order nothing here), on the checks above and
    // against the host communicator (ctx.world()) for 16-bit reductions.
    if (sl::test::mpi_runtime()) return;  // a threads backend
    using Comm = sl::coll::ThreadDeviceCommunicator<Kokkos::DefaultHostExecutionSpace>;
    for (int n : {1, 2, 3, 5}) {
      auto world = Comm::make_world(n, std::chrono::milliseconds(60000));
      sl::Runtime::threads(n).spmd([&](sl::Context& ctx) {
        auto comm = Comm::world(world, ctx.device(), {ctx.exec()});
        CHECK(comm->accepts_device_memory());
        check_all_gather<std::int32_t>(*comm);
        check_all_gather<double>(*comm);
        check_reductions<std::int32_t>(*comm);
        check_reductions<std::uint8_t>(*comm);
        check_reductions<float>(*comm);
        check_reductions<double>(*comm);
        check_all_to_all<float>(*comm);
        check_exchange_transpose<std::int8_t>(*comm);
        check_exchange_transpose<double>(*comm);
        check_exchange_shapes(*comm);
        check_exchange_sparse(*comm);
        check_exchange_self(*comm);
        check_point_to_point(*comm);
        comm->barrier();
        // 16-bit floats reduce through float, rounded once: as the host communicator does.
        for (const DType t : {DType::f16, DType::bf16}) {
          std::vector<std::uint16_t> in(37), got(37), want(37);
          for (std::size_t i = 0; i < in.size(); ++i) {
            const float v = 0.37f * static_cast<float>(ctx.device() + 1) + static_cast<float>(i) * 1.13f;
            in[i] = t == DType::f16 ? sl::float_to_f16(v) : sl::float_to_bf16(v);
          }
          for (const Op op : {Op::sum, Op::prod, Op::max, Op::min}) {
            comm->all_reduce(in.data(), got.data(), in.size(), t, op);
            ctx.world().all_reduce(in.data(), want.data(), in.size(), t, op);
            REQUIRE(got == want);
          }
        }
        // A sub-group (split) works as the world does.
        auto half = comm->split(ctx.device() % 2, ctx.device(), "half");
        REQUIRE(half);
        check_reductions<double>(*half);
        check_exchange_transpose<float>(*half);
        // Dry runs: this device's own part, zeros for the others'.
        {
          sl::coll::DryRun dry;
          std::vector<float> a(4, 2.f), b(4 * static_cast<std::size_t>(n), 9.f);
          comm->all_gather(a.data(), b.data(), 4, DType::f32);
          for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < 4; ++i)
              REQUIRE(b[static_cast<std::size_t>(r) * 4 + i] == (r == ctx.device() ? 2.f : 0.f));
          // exchange: column p of a [2, n] block goes to rank p (strided regions, as rectangles)
          std::vector<float> src(2 * static_cast<std::size_t>(n), 5.f), dst(2 * static_cast<std::size_t>(n), 9.f);
          std::vector<sl::coll::Region> sr, rr;
          for (int p = 0; p < n; ++p) {
            sr.push_back(sl::coll::Region::strided(static_cast<std::size_t>(p), {2}, {static_cast<std::size_t>(n)}));
            rr.push_back(sl::coll::Region::strided(static_cast<std::size_t>(p), {2}, {static_cast<std::size_t>(n)}));
          }
          comm->exchange(src.data(), sr, dst.data(), rr, DType::f32);
          for (std::size_t k = 0; k < dst.size(); ++k)
            REQUIRE(dst[k] == (static_cast<int>(k % static_cast<std::size_t>(n)) == ctx.device() ? 5.f : 0.f));
        }
      });
    }
  }
}
