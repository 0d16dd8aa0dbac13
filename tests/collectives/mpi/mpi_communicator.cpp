// SPDX-License-Identifier: Apache-2.0
// The mpi backend, run under mpirun with several processes. Every rank computes what every
// other rank sent (values are functions of rank and index) and checks its results against
// that. MPI calls are counted through the profiling interface (PMPI) to check which MPI call
// each collective makes, and how many.
//
// Every rank runs the same collectives whatever its checks find (CHECK, never REQUIRE), so a
// failure on one rank does not leave the others waiting.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <shardlib/collectives/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <new>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace coll = shardlib::coll;
using coll::Blocks;
using coll::CollectiveError;
using coll::DType;
using coll::MpiCommunicator;
using coll::Op;
using shardlib::bf16;
using shardlib::f16;

// ---- MPI calls, counted through PMPI ----------------------------------------------------------

namespace {
using Tally = std::map<std::string, int, std::less<>>;
struct CallLog {
  Tally calls;     // MPI function -> calls
  Tally in_place;  // MPI function -> calls with MPI_IN_PLACE
};
CallLog& call_log() {
  static CallLog log;
  return log;
}
void bump(Tally& t, std::string_view fn) {  // allocates only for a new name
  auto it = t.find(fn);
  if (it == t.end()) it = t.emplace(std::string(fn), 0).first;
  ++it->second;
}
void note(const char* fn, bool in_place = false) {
  bump(call_log().calls, fn);
  if (in_place) bump(call_log().in_place, fn);
}
void reset_calls() { call_log() = {}; }
int calls(std::string_view fn) {
  const auto it = call_log().calls.find(fn);
  return it == call_log().calls.end() ? 0 : it->second;
}
int in_place_calls(std::string_view fn) {
  const auto it = call_log().in_place.find(fn);
  return it == call_log().in_place.end() ? 0 : it->second;
}
}  // namespace

extern "C" {
int MPI_Allgather(const void* sb, int sc, MPI_Datatype st, void* rb, int rc, MPI_Datatype rt, MPI_Comm c) {
  note("MPI_Allgather", sb == MPI_IN_PLACE);
  return PMPI_Allgather(sb, sc, st, rb, rc, rt, c);
}
int MPI_Allgatherv(const void* sb, int sc, MPI_Datatype st, void* rb, const int rc[], const int d[], MPI_Datatype rt,
                   MPI_Comm c) {
  note("MPI_Allgatherv", sb == MPI_IN_PLACE);
  return PMPI_Allgatherv(sb, sc, st, rb, rc, d, rt, c);
}
int MPI_Reduce_scatter_block(const void* sb, void* rb, int rc, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  note("MPI_Reduce_scatter_block", sb == MPI_IN_PLACE);
  return PMPI_Reduce_scatter_block(sb, rb, rc, t, op, c);
}
int MPI_Reduce_scatter(const void* sb, void* rb, const int rc[], MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  note("MPI_Reduce_scatter", sb == MPI_IN_PLACE);
  return PMPI_Reduce_scatter(sb, rb, rc, t, op, c);
}
int MPI_Allreduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  note("MPI_Allreduce", sb == MPI_IN_PLACE);
  return PMPI_Allreduce(sb, rb, n, t, op, c);
}
int MPI_Alltoall(const void* sb, int sc, MPI_Datatype st, void* rb, int rc, MPI_Datatype rt, MPI_Comm c) {
  note("MPI_Alltoall", sb == MPI_IN_PLACE);
  return PMPI_Alltoall(sb, sc, st, rb, rc, rt, c);
}
int MPI_Alltoallv(const void* sb, const int sc[], const int sd[], MPI_Datatype st, void* rb, const int rc[],
                  const int rd[], MPI_Datatype rt, MPI_Comm c) {
  note("MPI_Alltoallv", sb == MPI_IN_PLACE);
  return PMPI_Alltoallv(sb, sc, sd, st, rb, rc, rd, rt, c);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  note("MPI_Bcast");
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Send(const void* b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c) {
  note("MPI_Send");
  return PMPI_Send(b, n, t, dest, tag, c);
}
int MPI_Recv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status* s) {
  note("MPI_Recv");
  return PMPI_Recv(b, n, t, src, tag, c, s);
}
int MPI_Sendrecv(const void* sb, int sn, MPI_Datatype st, int dest, int stag, void* rb, int rn, MPI_Datatype rt,
                 int src, int rtag, MPI_Comm c, MPI_Status* s) {
  note("MPI_Sendrecv");
  return PMPI_Sendrecv(sb, sn, st, dest, stag, rb, rn, rt, src, rtag, c, s);
}
int MPI_Isend(const void* b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request* r) {
  note("MPI_Isend");
  return PMPI_Isend(b, n, t, dest, tag, c, r);
}
int MPI_Irecv(void* b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Request* r) {
  note("MPI_Irecv");
  return PMPI_Irecv(b, n, t, src, tag, c, r);
}
int MPI_Barrier(MPI_Comm c) {
  note("MPI_Barrier");
  return PMPI_Barrier(c);
}
int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm* out) {
  note("MPI_Comm_split");
  return PMPI_Comm_split(c, color, key, out);
}
}

// ---- C++ heap allocations, counted (MPI itself allocates with malloc, not counted) -----------

namespace {
long cxx_allocations = 0;
}
void* operator new(std::size_t n) {
  ++cxx_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// GCC 12 takes free() of what the replaced operator new returned for a mismatch.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// ---- helpers ----------------------------------------------------------------------------------

namespace {

MpiCommunicator* the_world = nullptr;  // made in main, after MPI_Init_thread
MpiCommunicator& world() { return *the_world; }

/// The mpi backend's current limit of elements per MPI call (coll::set_mpi_max_count).
std::size_t max_count() { return coll::detail::mpi::max_count(); }
std::size_t pieces(std::size_t n) { return n == 0 ? 1 : (n + max_count() - 1) / max_count(); }

/// Runs `body` with the per-call limit lowered to 5 elements (small buffers then take the paths
/// that split long ones), then at the default (INT_MAX); restores the default even on failure.
template <class F>
void at_small_and_default_limit(F&& body) {
  const std::size_t initial = max_count();
  struct Restore {
    std::size_t n;
    ~Restore() { coll::set_mpi_max_count(n); }
  } restore{initial};
  for (std::size_t limit : {std::size_t{5}, initial}) {
    coll::set_mpi_max_count(limit);
    INFO(("per-call limit " + std::to_string(limit)));
    body();
  }
}

template <class T>
constexpr bool is_half = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

template <class T>
T make(double x) {
  if constexpr (is_half<T>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}
template <class T>
double num(T v) {
  if constexpr (is_half<T>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

/// A small value that names where it came from (exact in every dtype, including i8 and f16).
long long code(long long a, long long b, long long i) { return (a * 31 + b * 7 + i * 3 + 1) % 97; }

/// What rank q puts at index i of the block for `salt`, for reductions with `op`: small
/// integers (sum, max, min) or +-1 and 2 (prod), so that every result is exact.
template <class T>
T input(Op op, long long q, long long i, long long salt) {
  if (op == Op::prod) {
    double v = (q + i + salt) % 3 == 0 ? 2 : 1;
    if (!std::is_unsigned_v<T> && (q * 3 + i + salt) % 2 == 1) v = -v;
    return make<T>(v);
  }
  long long k = (q * 5 + i * 3 + salt) % 9;
  if (!std::is_unsigned_v<T>) k -= 4;
  return make<T>(static_cast<double>(k));
}

/// a (op) b as the reduction computes it (unsigned integers wrap; halves round through float).
template <class T>
T combine(Op op, T a, T b) {
  if constexpr (is_half<T>) {
    const float x = static_cast<float>(num(a)), y = static_cast<float>(num(b));
    const float r = op == Op::sum ? x + y : op == Op::prod ? x * y : op == Op::max ? std::max(x, y) : std::min(x, y);
    return make<T>(r);
  } else {
    switch (op) {
      case Op::sum: return static_cast<T>(a + b);
      case Op::prod: return static_cast<T>(a * b);
      case Op::max: return std::max(a, b);
      case Op::min: return std::min(a, b);
    }
    return a;
  }
}

/// The reduction over all n ranks of input(op, q, i, salt).
template <class T>
T reduced(Op op, int n, long long i, long long salt) {
  T acc = input<T>(op, 0, i, salt);
  for (int q = 1; q < n; ++q) acc = combine(op, acc, input<T>(op, q, i, salt));
  return acc;
}

/// "" when equal, else where they first differ.
template <class T>
std::string diff(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + ", want " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (num(got[i]) != num(want[i]))
      return "index " + std::to_string(i) + " of " + std::to_string(got.size()) + ": got " + std::to_string(num(got[i])) +
             ", want " + std::to_string(num(want[i]));
  return "";
}

template <class... Ts, class F>
void for_types(F&& f) {
  (f(std::type_identity<Ts>{}), ...);
}
template <class F>
void for_all_dtypes(F&& f) {
  for_types<std::int8_t, std::uint8_t, std::int16_t, std::uint16_t, std::int32_t, std::uint32_t, std::int64_t,
            std::uint64_t, f16, bf16, float, double>(f);
}
template <class F>
void for_reduce_dtypes(F&& f) {
  for_types<std::int32_t, std::int64_t, std::uint8_t, float, double, f16, bf16>(f);
}
constexpr Op all_ops[] = {Op::sum, Op::prod, Op::max, Op::min};

/// The message of the CollectiveError that f throws, or what happened instead.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CollectiveError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  return "no exception";
}
bool has(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

constexpr auto box = coll::Region::strided;

std::string ctx(std::string_view what, DType t, std::size_t count, int variant = -1) {
  return std::string(what) + " dtype=" + std::string(coll::name(t)) + " count=" + std::to_string(count) +
         (variant >= 0 ? " variant=" + std::to_string(variant) : "");
}

}  // namespace

// ---- the communicator itself ------------------------------------------------------------------

TEST_CASE("world: rank, size, name and a duplicate of MPI_COMM_WORLD") {
  int r = -1, n = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(world().rank() == r);
  CHECK(world().size() == n);
  CHECK(world().name() == "world");
  CHECK(world().backend() == "mpi");
  CHECK_FALSE(world().accepts_device_memory());
  CHECK_FALSE(world().checked());
  int cmp = MPI_IDENT;
  MPI_Comm_compare(world().comm(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);  // same processes, separate traffic
  MPI_Errhandler eh = MPI_ERRORS_ARE_FATAL;
  MPI_Comm_get_errhandler(world().comm(), &eh);
  CHECK(eh == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&eh);
}

TEST_CASE("a communicator wrapping a comm it does not own leaves it as it was") {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_ARE_FATAL);
  auto handler = [&] {
    MPI_Errhandler eh = MPI_ERRHANDLER_NULL;
    MPI_Comm_get_errhandler(dup, &eh);
    const bool fatal = eh == MPI_ERRORS_ARE_FATAL, returns = eh == MPI_ERRORS_RETURN;
    MPI_Errhandler_free(&eh);
    return fatal ? "fatal" : returns ? "return" : "other";
  };
  {
    MpiCommunicator c(dup, "borrowed", false, false);
    CHECK(c.comm() == dup);
    CHECK(c.name() == "borrowed");
    CHECK(std::string(handler()) == "return");
  }
  CHECK(std::string(handler()) == "fatal");  // put back
  int n = 0;
  CHECK(MPI_Comm_size(dup, &n) == MPI_SUCCESS);  // still valid
  CHECK(n == world().size());
  MPI_Comm_free(&dup);
  CHECK(has(error_of([] { MpiCommunicator c(MPI_COMM_NULL, "null", false, false); }), "MPI_COMM_NULL"));
}

// ---- all_gather -------------------------------------------------------------------------------

TEST_CASE("all_gather, equal blocks, every dtype") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  for_all_dtypes([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
      std::vector<T> send(count), recv(count * static_cast<std::size_t>(n), make<T>(99)), want(recv.size());
      for (std::size_t i = 0; i < count; ++i) send[i] = make<T>(static_cast<double>(code(me, 0, static_cast<long long>(i))));
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < count; ++i)
          want[static_cast<std::size_t>(p) * count + i] = make<T>(static_cast<double>(code(p, 0, static_cast<long long>(i))));
      reset_calls();
      c.all_gather(send.data(), recv.data(), count, t);
      INFO(ctx("all_gather", t, count));
      CHECK(diff(recv, want) == "");
      CHECK(calls("MPI_Allgather") == 1);
      CHECK(in_place_calls("MPI_Allgather") == 0);  // never MPI_IN_PLACE: an aliased send is staged
      CHECK(calls("MPI_Allgatherv") == 0);
    }
  });
}

TEST_CASE("all_gather, uneven blocks with empty ones, in place and not") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<std::size_t>> shapes;
  {
    std::vector<std::size_t> a(static_cast<std::size_t>(n)), zeros(static_cast<std::size_t>(n), 0),
        one(static_cast<std::size_t>(n), 0);
    for (int p = 0; p < n; ++p) a[static_cast<std::size_t>(p)] = static_cast<std::size_t>((p * 2 + 1) % 3);  // 1 0 2 1 0 2 ..
    one[static_cast<std::size_t>(n - 1)] = 4;  // one block, the last rank's
    shapes = {a, zeros, one};
  }
  for_types<std::int32_t, double, f16, std::uint8_t>([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    for (const auto& counts : shapes) {
      const Blocks b(counts);
      const std::size_t total = b.total(), off = b.offset(me), mine = counts[static_cast<std::size_t>(me)];
      std::vector<T> want(total);
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(p)]; ++i)
          want[b.offset(p) + i] = make<T>(static_cast<double>(code(p, 1, static_cast<long long>(i))));
      // variant 0: separate buffers; 1: every rank in place; 2: even ranks in place only.
      for (int variant = 0; variant < 3; ++variant) {
        const bool in_place = variant == 1 || (variant == 2 && me % 2 == 0);
        std::vector<T> recv(total, make<T>(99)), send(mine);
        for (std::size_t i = 0; i < mine; ++i) {
          const T v = make<T>(static_cast<double>(code(me, 1, static_cast<long long>(i))));
          (in_place ? recv[off + i] : send[i]) = v;
        }
        reset_calls();
        c.all_gather(in_place ? static_cast<const void*>(recv.data() + off) : send.data(), recv.data(), counts, t);
        INFO(ctx("all_gather uneven", t, total, variant));
        CHECK(diff(recv, want) == "");
        CHECK(calls("MPI_Allgatherv") == 1);
        CHECK(in_place_calls("MPI_Allgatherv") == 0);
        CHECK(calls("MPI_Allgather") == 0);
      }
    }
  });
}

TEST_CASE("all_gather in place, equal blocks") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  const std::size_t count = 3;
  std::vector<double> buf(count * static_cast<std::size_t>(n), -1.0), want(buf.size());
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < count; ++i)
      want[static_cast<std::size_t>(p) * count + i] = static_cast<double>(code(p, 2, static_cast<long long>(i)));
  for (std::size_t i = 0; i < count; ++i) buf[static_cast<std::size_t>(me) * count + i] = want[static_cast<std::size_t>(me) * count + i];
  c.all_gather(buf.data() + static_cast<std::size_t>(me) * count, buf.data(), count, DType::f64);
  CHECK(diff(buf, want) == "");
}

// ---- reduce_scatter ---------------------------------------------------------------------------

TEST_CASE("reduce_scatter, every op, equal and uneven blocks") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  std::vector<std::size_t> uneven(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) uneven[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p % 3);  // 0 1 2 0 1 2 ..
  for_reduce_dtypes([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    for (Op op : all_ops) {
      // shape 0: 0 each; 1: 3 each; 2: uneven. (send == recv is refused: see below.)
      for (int shape = 0; shape < 3; ++shape) {
        for (bool in_place : {false}) {
          std::vector<std::size_t> counts =
              shape == 2 ? uneven : std::vector<std::size_t>(static_cast<std::size_t>(n), shape == 0 ? 0 : 3);
          const Blocks b(counts);
          const std::size_t mine = counts[static_cast<std::size_t>(me)];
          std::vector<T> send(b.total());
          for (int p = 0; p < n; ++p)
            for (std::size_t i = 0; i < counts[static_cast<std::size_t>(p)]; ++i)
              send[b.offset(p) + i] = input<T>(op, me, static_cast<long long>(i), p * 11);
          std::vector<T> want(mine);
          for (std::size_t i = 0; i < mine; ++i) want[i] = reduced<T>(op, n, static_cast<long long>(i), me * 11);
          std::vector<T> recv(mine, make<T>(99));
          void* out = in_place ? send.data() : recv.data();
          reset_calls();
          if (shape == 2) {
            c.reduce_scatter(send.data(), out, counts, t, op);
          } else {
            c.reduce_scatter(send.data(), out, counts[0], t, op);
          }
          if (in_place) recv.assign(send.begin(), send.begin() + static_cast<std::ptrdiff_t>(mine));
          INFO((ctx("reduce_scatter", t, b.total(), shape) + " op=" + std::string(coll::name(op)) +
                (in_place ? " in place" : "")));
          CHECK(diff(recv, want) == "");
          // MPI_Reduce_scatter for even blocks too: Open MPI's MPI_Reduce_scatter_block was up to 2.6x slower
          CHECK(calls("MPI_Reduce_scatter") == 1);
          CHECK(calls("MPI_Reduce_scatter_block") == 0);
          CHECK(in_place_calls("MPI_Reduce_scatter") == 0);
        }
      }
    }
  });
}

// ---- all_reduce -------------------------------------------------------------------------------

TEST_CASE("all_reduce, every op, several dtypes, in place, mixed and not") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  for_reduce_dtypes([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    for (Op op : all_ops) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{17}}) {
        std::vector<T> want(count);
        for (std::size_t i = 0; i < count; ++i) want[i] = reduced<T>(op, n, static_cast<long long>(i), 5);
        // variant 0: separate buffers; 1: every rank in place; 2: odd ranks in place only.
        for (int variant = 0; variant < 3; ++variant) {
          const bool in_place = variant == 1 || (variant == 2 && me % 2 == 1);
          std::vector<T> send(count), recv(count, make<T>(99));
          for (std::size_t i = 0; i < count; ++i) send[i] = input<T>(op, me, static_cast<long long>(i), 5);
          const std::vector<T> sent = send;
          reset_calls();
          if (in_place) {
            c.all_reduce(send.data(), send.data(), count, t, op);
            recv = send;
          } else {
            c.all_reduce(send.data(), recv.data(), count, t, op);
          }
          INFO((ctx("all_reduce", t, count, variant) + " op=" + std::string(coll::name(op))));
          CHECK(diff(recv, want) == "");
          if (!in_place) CHECK(diff(send, sent) == "");  // the input is left as it was
          const int expect_calls = count == 0 ? 0 : static_cast<int>(pieces(count));
          CHECK(calls("MPI_Allreduce") == expect_calls);
          CHECK(in_place_calls("MPI_Allreduce") == expect_calls);
        }
      }
    }
  });
}

TEST_CASE("f16 and bf16 reductions follow float, NaN and overflow included") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  for_types<f16, bf16>([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    INFO(std::string(coll::name(t)));
    // max with a NaN on rank 0 at index 0: NaN wins wherever it sits in the reduction order.
    std::vector<T> v = {make<T>(me == 0 ? std::nan("") : 1.0), make<T>(static_cast<double>(me))};
    c.all_reduce(v.data(), v.data(), 2, t, Op::max);
    CHECK(std::isnan(num(v[0])));
    CHECK(num(v[1]) == n - 1);
    // 0.5 + 0.25 * rank summed: exact in both formats.
    T x = make<T>(0.5 + 0.25 * me), s{};
    c.all_reduce(&x, &s, 1, t, Op::sum);
    CHECK(num(s) == 0.5 * n + 0.25 * n * (n - 1) / 2);
  });
  // f16 overflows to inf past 65504; bf16 holds the sum.
  f16 h(40000.f);
  c.all_reduce(&h, &h, 1, DType::f16, Op::sum);
  if (n > 1) CHECK(std::isinf(num(h)));
  bf16 b(40000.f);
  c.all_reduce(&b, &b, 1, DType::bf16, Op::sum);
  CHECK(num(b) == doctest::Approx(40000.0 * n).epsilon(0.05));
}

// ---- all_to_all -------------------------------------------------------------------------------

TEST_CASE("all_to_all, equal blocks") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  for_types<std::int32_t, double, f16, std::uint8_t, std::int64_t>([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      const std::size_t total = count * static_cast<std::size_t>(n);
      std::vector<T> send(total), recv(total, make<T>(99)), want(total);
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < count; ++i) {
          send[static_cast<std::size_t>(p) * count + i] = make<T>(static_cast<double>(code(me, p, static_cast<long long>(i))));
          want[static_cast<std::size_t>(p) * count + i] = make<T>(static_cast<double>(code(p, me, static_cast<long long>(i))));
        }
      reset_calls();
      c.all_to_all(send.data(), recv.data(), count, t);
      INFO(ctx("all_to_all", t, count));
      CHECK(diff(recv, want) == "");
      CHECK(calls("MPI_Alltoall") == 1);
      CHECK(calls("MPI_Alltoallv") == 0);
    }
  });
}

TEST_CASE("all_to_all, uneven blocks with empty ones") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  auto sc = [](int from, int to) { return static_cast<std::size_t>((from + 2 * to) % 3); };  // zeros included
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(n)), recv_counts(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    send_counts[static_cast<std::size_t>(p)] = sc(me, p);
    recv_counts[static_cast<std::size_t>(p)] = sc(p, me);
  }
  const Blocks sb(send_counts), rb(recv_counts);
  std::vector<float> send(sb.total()), recv(rb.total(), -1.f), want(rb.total());
  for (int p = 0; p < n; ++p) {
    for (std::size_t i = 0; i < sc(me, p); ++i) send[sb.offset(p) + i] = static_cast<float>(code(me, p, static_cast<long long>(i)));
    for (std::size_t i = 0; i < sc(p, me); ++i) want[rb.offset(p) + i] = static_cast<float>(code(p, me, static_cast<long long>(i)));
  }
  reset_calls();
  c.all_to_all(send.data(), send_counts, recv.data(), recv_counts, DType::f32);
  CHECK(diff(recv, want) == "");
  CHECK(calls("MPI_Alltoallv") == 1);
  CHECK(calls("MPI_Alltoall") == 0);
  // Nothing at all to move.
  std::vector<std::size_t> zeros(static_cast<std::size_t>(n), 0);
  CHECK_NOTHROW(c.all_to_all(nullptr, zeros, nullptr, zeros, DType::f32));
}

TEST_CASE("all_to_all and reduce_scatter refuse overlapping buffers, on every rank alike") {
  auto& c = world();
  std::vector<int> buf(2 * static_cast<std::size_t>(c.size()), 1);
  std::string e = error_of([&] { c.all_to_all(buf.data(), buf.data(), 2, DType::i32); });
  CHECK_MESSAGE(has(e, "all_to_all on world (mpi, rank "), e);
  CHECK_MESSAGE(has(e, "cannot run in place"), e);
  e = error_of([&] { c.reduce_scatter(buf.data(), buf.data(), 2, DType::i32, Op::sum); });
  CHECK_MESSAGE(has(e, "reduce_scatter cannot run in place"), e);
}

// ---- exchange ---------------------------------------------------------------------------------

TEST_CASE("exchange: point to point with the ranks that carry data; strided boxes packed; the self pair stays local") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  // To rank q: 1 + (me + q) % 3 rows of 3 elements from a matrix with row stride 5 (the rows
  // start at row 4q); from rank p: the same count, transposed into column-major order (column
  // stride 4) at 12p.
  auto rows = [](int p, int q) { return static_cast<std::size_t>(1 + (p + q) % 3); };
  for_types<std::int8_t, bf16, std::int32_t, double>([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    std::vector<T> send(un * 4 * 5, make<T>(99)), recv(un * 12, make<T>(-1)), want(un * 12, make<T>(-1));
    std::vector<coll::Region> sr(un), rr(un);
    for (int q = 0; q < n; ++q) {
      const auto uq = static_cast<std::size_t>(q);
      sr[uq] = box(uq * 20, {rows(me, q), 3}, {5, 1});
      rr[uq] = box(uq * 12, {rows(q, me), 3}, {1, 4});
      for (std::size_t i = 0; i < rows(me, q); ++i)
        for (std::size_t j = 0; j < 3; ++j)
          send[uq * 20 + i * 5 + j] = make<T>(static_cast<double>(code(me, q, static_cast<long long>(i * 3 + j))));
      for (std::size_t i = 0; i < rows(q, me); ++i)
        for (std::size_t j = 0; j < 3; ++j)
          want[uq * 12 + j * 4 + i] = make<T>(static_cast<double>(code(q, me, static_cast<long long>(i * 3 + j))));
    }
    coll::CommRecorder rec;
    reset_calls();
    c.exchange(send.data(), sr, recv.data(), rr, t);
    INFO(ctx("exchange", t, 0));
    CHECK(diff(recv, want) == "");
    CHECK(calls("MPI_Isend") == n - 1);  // every pair carries at least one row here
    CHECK(calls("MPI_Irecv") == n - 1);
    CHECK(calls("MPI_Alltoallv") == 0);
    CHECK(calls("MPI_Alltoall") == 0);
    std::uint64_t sent = 0, received = 0;
    for (int q = 0; q < n; ++q)
      if (q != me) {
        sent += 3 * rows(me, q) * sizeof(T);
        received += 3 * rows(q, me) * sizeof(T);
      }
    CHECK(rec[coll::Kind::all_to_all].calls == 1);
    CHECK(rec[coll::Kind::all_to_all].bytes_sent == sent);
    CHECK(rec[coll::Kind::all_to_all].bytes_received == received);
  });
  // Nothing to move: no message at all.
  std::vector<coll::Region> none(un);
  reset_calls();
  CHECK_NOTHROW(c.exchange(nullptr, none, nullptr, none, DType::f32));
  CHECK(calls("MPI_Isend") + calls("MPI_Irecv") + calls("MPI_Alltoallv") == 0);
  // A ring: one contiguous block to the next rank, straight from and into the caller's buffers.
  std::vector<float> out(8, static_cast<float>(me)), in(8, -1.0f);
  std::vector<coll::Region> to(un), from(un);
  to[static_cast<std::size_t>((me + 1) % n)] = coll::Region::contiguous(0, 8);
  from[static_cast<std::size_t>((me + n - 1) % n)] = coll::Region::contiguous(0, 8);
  reset_calls();
  c.exchange(out.data(), to, in.data(), from, DType::f32);
  CHECK(in == std::vector<float>(8, static_cast<float>((me + n - 1) % n)));
  CHECK(calls("MPI_Isend") == (n > 1 ? 1 : 0));
  CHECK(calls("MPI_Irecv") == (n > 1 ? 1 : 0));
}

TEST_CASE("exchange: a self pair whose counts disagree fails on its rank only, after the others' data moved") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::int64_t> send(2 * un), recv(2 * un, -1);
  std::vector<coll::Region> sr(un), rr(un);
  for (std::size_t p = 0; p < un; ++p) {
    sr[p] = coll::Region::contiguous(2 * p, 2);
    rr[p] = coll::Region::contiguous(2 * p, 2);
    send[2 * p] = send[2 * p + 1] = me;
  }
  if (me == 0) rr[0] = coll::Region::contiguous(0, 1);
  const std::string e = error_of([&] { c.exchange(send.data(), sr, recv.data(), rr, DType::i64); });
  if (me == 0) CHECK_MESSAGE(has(e, "exchange on world (mpi, rank 0 of " + std::to_string(n) + "): rank 0 sends 2 elements to itself, but expects 1"), e);
  else CHECK(e == "no exception");
  for (int p = 0; p < n; ++p)
    if (p != me) CHECK(recv[2 * static_cast<std::size_t>(p)] == p);
}

TEST_CASE("exchange: bad regions are refused before MPI") {
  auto& c = world();
  const auto un = static_cast<std::size_t>(c.size());
  std::vector<int> buf(4 * un);
  std::vector<coll::Region> r(un), more(un + 1);
  for (std::size_t p = 0; p < un; ++p) r[p] = coll::Region::contiguous(2 * p, 2);
  reset_calls();
  std::string e = error_of([&] { c.exchange(buf.data(), r, buf.data() + 1, r, DType::i32); });
  CHECK_MESSAGE(has(e, "exchange on world (mpi, rank "), e);
  CHECK_MESSAGE(has(e, "the send and receive buffers overlap; exchange cannot run in place"), e);
  e = error_of([&] { c.exchange(buf.data(), more, buf.data(), r, DType::i32); });
  CHECK_MESSAGE(has(e, std::to_string(un + 1) + " send regions given for a group of " + std::to_string(un)), e);
  auto bad = r;
  bad[0].rank = coll::max_region_rank + 1;
  e = error_of([&] { c.exchange(buf.data(), r, buf.data() + 2 * un, bad, DType::i32); });
  CHECK_MESSAGE(has(e, "receive region 0 has rank 9"), e);
  e = error_of([&] { c.exchange(nullptr, r, buf.data(), r, DType::i32); });
  CHECK_MESSAGE(has(e, "null buffer for " + std::to_string(2 * un) + " elements"), e);
  CHECK(calls("MPI_Alltoallv") + calls("MPI_Alltoall") == 0);
}

// ---- broadcast, send/recv, permute, barrier ---------------------------------------------------

TEST_CASE("broadcast from every root") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  for_types<std::int32_t, double, bf16, std::uint8_t>([&]<class T>(std::type_identity<T>) {
    const DType t = coll::dtype_of<T>();
    for (int root = 0; root < n; ++root) {
      for (std::size_t count : {std::size_t{0}, std::size_t{6}}) {
        std::vector<T> buf(count, make<T>(99)), want(count);
        for (std::size_t i = 0; i < count; ++i) want[i] = make<T>(static_cast<double>(code(root, 3, static_cast<long long>(i))));
        if (me == root) buf = want;
        reset_calls();
        c.broadcast(buf.data(), count, t, root);
        INFO(ctx("broadcast", t, count, root));
        CHECK(diff(buf, want) == "");
        CHECK(calls("MPI_Bcast") == (count == 0 ? 0 : static_cast<int>(pieces(count))));
      }
    }
  });
}

TEST_CASE("send and recv between pairs, with tags") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  const int partner = me % 2 == 0 ? me + 1 : me - 1;
  if (partner < n) {
    // Even ranks send (3 + rank elements, tag 7), odd ones receive; then the other way (tag 9).
    for (int round = 0; round < 2; ++round) {
      const bool sender = (me % 2 == 0) == (round == 0);
      const int from = sender ? me : partner;
      const std::size_t count = static_cast<std::size_t>(3 + from);
      std::vector<std::int64_t> buf(count, -1), want(count);
      for (std::size_t i = 0; i < count; ++i) want[i] = code(from, round, static_cast<long long>(i));
      reset_calls();
      if (sender) {
        c.send(want.data(), count, DType::i64, partner, round == 0 ? 7 : 9);
        CHECK(calls("MPI_Isend") == 1);
      } else {
        c.recv(buf.data(), count, DType::i64, partner, round == 0 ? 7 : 9);
        CHECK(diff(buf, want) == "");
        CHECK(calls("MPI_Recv") == 1);
      }
    }
    // An empty message still travels (one MPI call each side).
    reset_calls();
    if (me % 2 == 0) c.send(nullptr, 0, DType::f32, partner, 1);
    else c.recv(nullptr, 0, DType::f32, partner, 1);
    CHECK(calls(me % 2 == 0 ? "MPI_Isend" : "MPI_Recv") == 1);
    // Buffered: both partners send 4 MiB first, then receive (blocking sends of a message past
    // the eager limit would wait for each other for ever); the send buffer may change at once.
    CHECK(c.buffered_sends());
    const std::size_t big = std::size_t{1} << 20;
    std::vector<float> out(big, static_cast<float>(me)), in(big, -1.f);
    c.send(out.data(), big, DType::f32, partner, 11);
    std::fill(out.begin(), out.end(), -7.f);
    c.recv(in.data(), big, DType::f32, partner, 11);
    CHECK(std::all_of(in.begin(), in.end(), [&](float v) { return v == static_cast<float>(partner); }));
  }
}

TEST_CASE("permute: ring shift, chain with -1 ends, to itself, and nothing") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  auto count_of = [](int r) { return static_cast<std::size_t>(2 + r % 3); };
  {  // ring: rank r sends count_of(r) elements to r + 1
    const int dest = (me + 1) % n, source = (me + n - 1) % n;
    std::vector<double> send(count_of(me)), recv(count_of(source), -1.0), want(count_of(source));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<double>(code(me, dest, static_cast<long long>(i)));
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<double>(code(source, me, static_cast<long long>(i)));
    reset_calls();
    c.permute(send.data(), send.size(), dest, recv.data(), recv.size(), source, DType::f64);
    CHECK(diff(recv, want) == "");
    CHECK(calls("MPI_Sendrecv") == 1);
  }
  {  // chain: rank 0 receives nothing, the last rank sends nothing
    const int dest = me + 1 < n ? me + 1 : -1, source = me > 0 ? me - 1 : -1;
    std::vector<std::int32_t> send(4), recv(4, -1), want(4, -1);
    for (std::size_t i = 0; i < 4; ++i) {
      send[i] = static_cast<std::int32_t>(code(me, 5, static_cast<long long>(i)));
      if (source >= 0) want[i] = static_cast<std::int32_t>(code(source, 5, static_cast<long long>(i)));
    }
    c.permute(send.data(), 4, dest, recv.data(), 4, source, DType::i32);
    CHECK(diff(recv, want) == "");  // rank 0's buffer untouched
  }
  {  // to itself
    std::vector<std::uint16_t> send = {1, 2, 3}, recv(3, 0);
    c.permute(send.data(), 3, me, recv.data(), 3, me, DType::u16);
    CHECK(diff(recv, send) == "");
  }
  {  // nobody sends or receives: no MPI call
    reset_calls();
    c.permute(nullptr, 5, -1, nullptr, 5, -1, DType::f32);
    CHECK(calls("MPI_Sendrecv") == 0);
  }
}

TEST_CASE("collectives allocate nothing once warm") {
  auto& c = world();
  auto checked = MpiCommunicator::world(true);
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::size_t> counts(un), sc(un, 1);
  for (int p = 0; p < n; ++p) counts[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p % 3);
  std::vector<float> a(4 * un, 1.f), b(4 * un, 0.f);
  std::vector<f16> h(4, f16(1.f));
  std::vector<coll::Region> boxes(un), runs(un);  // 2x1 boxes (stride 2) to and from runs of 2
  for (std::size_t p = 0; p < un; ++p) {
    boxes[p] = box(p, {2, 1}, {un, 1});
    runs[p] = coll::Region::contiguous(2 * p, 2);
  }
  std::vector<float> wide(2 * un, 1.f), packed(2 * un, 0.f);
  auto run = [&](MpiCommunicator& k) {
    k.all_gather(a.data(), b.data(), 2, DType::f32);
    k.all_gather(a.data(), b.data(), counts, DType::f32);
    k.reduce_scatter(a.data(), b.data(), 2, DType::f32, Op::sum);
    k.reduce_scatter(a.data(), b.data(), counts, DType::f32, Op::max);
    k.all_reduce(a.data(), b.data(), 4, DType::f32, Op::sum);
    k.all_reduce(h.data(), h.data(), 4, DType::f16, Op::sum);
    k.all_to_all(a.data(), b.data(), 2, DType::f32);
    k.all_to_all(a.data(), sc, b.data(), sc, DType::f32);
    k.exchange(wide.data(), boxes, packed.data(), runs, DType::f32);
    k.exchange(packed.data(), runs, wide.data(), boxes, DType::f32);
    k.broadcast(a.data(), 4, DType::f32, 0);
    k.permute(a.data(), 3, (me + 1) % n, b.data(), 3, (me + n - 1) % n, DType::f32);
    k.barrier();
  };
  run(c);
  run(*checked);
  const long before = cxx_allocations;
  run(c);
  run(*checked);
  CHECK(cxx_allocations - before == 0);
}

TEST_CASE("permute never takes a message meant for recv, and send/recv refuse its tag") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  CHECK(found);
  const int reserved = found ? *tag_ub : 32767;
  std::int32_t x = 0;
  std::string e = error_of([&] { c.send(&x, 1, DType::i32, 0, reserved); });
  CHECK_MESSAGE(has(e, "tag " + std::to_string(reserved) + " (MPI_TAG_UB) is the mpi backend's own"), e);
  e = error_of([&] { c.recv(&x, 1, DType::i32, 0, reserved); });
  CHECK_MESSAGE(has(e, "is the mpi backend's own"), e);
  if (n < 2) return;
  // Rank 0 sends (tag 0, small so it goes out at once), then permutes with rank 1; rank 1
  // permutes first, then receives: each call gets its own message.
  std::int32_t sent = 111, out = me == 0 ? 222 : 333, in = -1, got = -1;
  const int peer = me == 0 ? 1 : me == 1 ? 0 : -1;
  if (me == 0) c.send(&sent, 1, DType::i32, 1, 0);
  c.permute(&out, 1, peer, &in, 1, peer, DType::i32);
  if (me == 1) c.recv(&got, 1, DType::i32, 0, 0);
  if (me < 2) CHECK(in == (me == 0 ? 333 : 222));
  if (me == 1) CHECK(got == 111);
}

TEST_CASE("barrier") {
  coll::CommRecorder rec;
  reset_calls();
  CHECK_NOTHROW(world().barrier());
  CHECK(calls("MPI_Barrier") == 1);
  CHECK(rec[coll::Kind::barrier].calls == 1);
}

// ---- split ------------------------------------------------------------------------------------

TEST_CASE("split into even and odd ranks, reversed, then collectives on the parts") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  std::vector<int> mates;  // same parity, by descending rank (key = -rank)
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == me % 2) mates.push_back(r);
  reset_calls();
  auto sub = c.split(me % 2, -me, me % 2 ? "odd" : "even");
  CHECK(calls("MPI_Comm_split") == 1);
  CHECK(sub != nullptr);
  if (!sub) return;  // every rank gets one here
  CHECK(sub->name() == (me % 2 ? "odd" : "even"));
  CHECK(sub->backend() == "mpi");
  CHECK(sub->size() == static_cast<int>(mates.size()));
  CHECK(sub->rank() == static_cast<int>(std::find(mates.begin(), mates.end(), me) - mates.begin()));

  std::vector<int> ranks(static_cast<std::size_t>(sub->size()), -1);
  sub->all_gather(&me, ranks.data(), 1, DType::i32);
  CHECK(ranks == mates);
  long long sum = me, want = std::accumulate(mates.begin(), mates.end(), 0LL);
  sub->all_reduce(&sum, &sum, 1, DType::i64, Op::sum);
  CHECK(sum == want);
  const std::string e = error_of([&] { sub->broadcast(&sum, 1, DType::i64, sub->size()); });
  CHECK_MESSAGE(has(e, "broadcast on " + std::string(me % 2 ? "odd" : "even") + " (mpi, rank "), e);

  // Split again, leaving the part's rank 0 out (negative color).
  auto subsub = sub->split(sub->rank() == 0 ? -1 : 3, 0, "rest");
  CHECK((subsub == nullptr) == (sub->rank() == 0));
  if (subsub) {
    CHECK(subsub->size() == sub->size() - 1);
    int one = 1, count = 0;
    subsub->all_reduce(&one, &count, 1, DType::i32, Op::sum);
    CHECK(count == sub->size() - 1);
  }
  // The world still works after its parts.
  int x = 1, total = 0;
  c.all_reduce(&x, &total, 1, DType::i32, Op::sum);
  CHECK(total == n);
}

TEST_CASE("split: every rank out") {
  CHECK(world().split(-1, 0, "none") == nullptr);
}

// ---- errors -----------------------------------------------------------------------------------

TEST_CASE("peer and root out of range are refused before MPI") {
  auto& c = world();
  const int n = c.size();
  int x = 0;
  reset_calls();
  std::string e = error_of([&] { c.broadcast(&x, 1, DType::i32, n); });
  CHECK_MESSAGE(has(e, "root " + std::to_string(n) + " is out of range"), e);
  e = error_of([&] { c.send(&x, 1, DType::i32, n); });
  CHECK_MESSAGE(has(e, "peer " + std::to_string(n) + " is out of range"), e);
  e = error_of([&] { c.recv(&x, 1, DType::i32, -1); });
  CHECK_MESSAGE(has(e, "peer -1 is out of range"), e);
  e = error_of([&] { c.permute(&x, 1, n + 2, &x, 1, -1, DType::i32); });
  CHECK_MESSAGE(has(e, "dest " + std::to_string(n + 2) + " is out of range"), e);
  CHECK(calls("MPI_Bcast") + calls("MPI_Send") + calls("MPI_Isend") + calls("MPI_Recv") + calls("MPI_Sendrecv") == 0);
}

TEST_CASE("an MPI error becomes a CollectiveError naming the MPI call") {
  auto& c = world();
  const int n = c.size(), me = c.rank();
  if (n >= 2 && me < 2) {
    // Rank 0 sends 4 elements, rank 1 asks for 2: MPI_ERR_TRUNCATE.
    std::int32_t buf[4] = {1, 2, 3, 4};
    if (me == 0) {
      CHECK_NOTHROW(c.send(buf, 4, DType::i32, 1, 3));
    } else {
      const std::string e = error_of([&] { c.recv(buf, 2, DType::i32, 0, 3); });
      CHECK_MESSAGE(has(e, "shardlib: recv on world (mpi, rank 1 of "), e);
      CHECK_MESSAGE(has(e, "MPI_Recv failed"), e);
      CHECK_MESSAGE(has(e, "truncat"), e);
    }
  }
  // A negative tag: MPI_ERR_TAG, found by MPI before anything travels.
  std::int32_t x = 0;
  const std::string e = error_of([&] { c.send(&x, 1, DType::i32, (me + 1) % n, -5); });
  CHECK_MESSAGE(has(e, "MPI_Isend failed"), e);
  CHECK_MESSAGE(has(e, "tag"), e);
}

TEST_CASE("errors leave the communicator usable") {
  auto& c = world();
  int one = 1, count = 0;
  c.all_reduce(&one, &count, 1, DType::i32, Op::sum);
  CHECK(count == c.size());
}

// ---- checked mode -----------------------------------------------------------------------------

TEST_CASE("checked mode: SHARDLIB_CHECK_COLLECTIVES turns it on") {
  ::setenv("SHARDLIB_CHECK_COLLECTIVES", "1", 1);
  CHECK(MpiCommunicator::checked_by_environment());
  CHECK(MpiCommunicator::world()->checked());
  ::setenv("SHARDLIB_CHECK_COLLECTIVES", "0", 1);
  CHECK_FALSE(MpiCommunicator::world()->checked());
  ::unsetenv("SHARDLIB_CHECK_COLLECTIVES");
  CHECK_FALSE(MpiCommunicator::world()->checked());
  CHECK(MpiCommunicator::world(true)->checked());
}

TEST_CASE("checked mode: agreeing calls run as usual") {
  auto c = MpiCommunicator::world(true);
  const int n = c->size(), me = c->rank();
  int sum = me;
  c->all_reduce(&sum, &sum, 1, DType::i32, Op::sum);
  CHECK(sum == n * (n - 1) / 2);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) counts[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p % 2);
  std::vector<int> got(Blocks(counts).total(), -1), want;
  for (int p = 0; p < n; ++p)
    if (p % 2) want.push_back(p);
  c->all_gather(&me, got.data(), counts, DType::i32);
  CHECK(got == want);
  // all_to_all with uneven blocks: p sends p + 1 elements to everyone.
  std::vector<std::size_t> sc(static_cast<std::size_t>(n), static_cast<std::size_t>(me + 1)), rc(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) rc[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p + 1);
  std::vector<int> out(Blocks(sc).total(), me), in(Blocks(rc).total(), -1), expect;
  for (int p = 0; p < n; ++p) expect.insert(expect.end(), static_cast<std::size_t>(p + 1), p);
  c->all_to_all(out.data(), sc, in.data(), rc, DType::i32);
  CHECK(in == expect);
  // exchange: p sends p + 1 elements to everyone, received as every other element.
  std::vector<coll::Region> xs(static_cast<std::size_t>(n)), xr(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    xs[static_cast<std::size_t>(p)] = coll::Region::contiguous(0, static_cast<std::size_t>(me + 1));
    xr[static_cast<std::size_t>(p)] = box(static_cast<std::size_t>(2 * n * p), {static_cast<std::size_t>(p + 1)}, {2});
  }
  std::vector<int> xin(2 * static_cast<std::size_t>(n * n), -1), xwant(xin.size(), -1);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i <= p; ++i) xwant[static_cast<std::size_t>(2 * n * p + 2 * i)] = p;
  c->exchange(out.data(), xs, xin.data(), xr, DType::i32);
  CHECK(xin == xwant);
  int from = -1;
  c->permute(&me, 1, (me + 1) % n, &from, 1, (me + n - 1) % n, DType::i32);
  CHECK(from == (me + n - 1) % n);
  int b = me == n - 1 ? 42 : 0;
  c->broadcast(&b, 1, DType::i32, n - 1);
  CHECK(b == 42);
  CHECK_NOTHROW(c->barrier());
  auto sub = c->split(me % 2, me, "parity");
  CHECK(sub != nullptr);
  auto* mpi_sub = dynamic_cast<MpiCommunicator*>(sub.get());
  CHECK(mpi_sub != nullptr);
  if (mpi_sub) CHECK(mpi_sub->checked());
}

TEST_CASE("checked mode: disagreements throw on every rank") {
  auto c = MpiCommunicator::world(true);
  const int n = c->size(), me = c->rank();
  if (n < 2) return;
  std::vector<double> buf(16 * static_cast<std::size_t>(n), 1.0);
  auto all_say = [&](std::string_view what, const auto& f) {
    const std::string e = error_of(f);
    INFO(what);
    CHECK_MESSAGE(has(e, "checked mode (SHARDLIB_CHECK_COLLECTIVES)"), e);
    CHECK_MESSAGE(has(e, what), e);
    // The communicator is fine afterwards.
    int one = 1, count = 0;
    c->all_reduce(&one, &count, 1, DType::i32, Op::sum);
    CHECK(count == n);
  };
  all_say("ranks disagree on the element count: min 4, max 5",
          [&] { c->all_reduce(buf.data(), buf.data(), me == 0 ? 5 : 4, DType::f64, Op::sum); });
  all_say("ranks call different collectives: all_reduce and broadcast", [&] {
    if (me == 0) c->broadcast(buf.data(), 4, DType::f64, 0);
    else c->all_reduce(buf.data(), buf.data(), 4, DType::f64, Op::sum);
  });
  all_say("ranks disagree on the dtype: f32 and f64",
          [&] { c->all_reduce(buf.data(), buf.data(), 4, me == 1 ? DType::f32 : DType::f64, Op::sum); });
  all_say("ranks disagree on the reduction: sum and max",
          [&] { c->all_reduce(buf.data(), buf.data(), 4, DType::f64, me == 0 ? Op::max : Op::sum); });
  all_say("ranks disagree on the root: min 0, max 1", [&] { c->broadcast(buf.data(), 4, DType::f64, me == 0 ? 1 : 0); });
  all_say("ranks disagree on the element count: min 2, max 3",
          [&] { c->all_gather(buf.data(), buf.data() + 8 * n, me == 1 ? 3 : 2, DType::f64); });
  std::vector<std::size_t> counts(static_cast<std::size_t>(n), 1), other = counts;
  other[0] = 2;
  all_say("ranks disagree on the block counts: their totals are min " + std::to_string(n) + ", max " +
              std::to_string(n + 1),
          [&] { c->all_gather(buf.data(), buf.data() + 8 * n, me == 0 ? other : counts, DType::f64); });
  other[1] = 0;  // same total as counts, other blocks
  all_say("ranks disagree on the block counts (same total, different blocks)",
          [&] { c->reduce_scatter(buf.data(), buf.data() + 8 * n, me == 1 ? other : counts, DType::f64, Op::sum); });
  all_say("ranks disagree on the form of the call", [&] {
    if (me == 0) c->all_gather(buf.data(), buf.data() + 8 * n, counts, DType::f64);
    else c->all_gather(buf.data(), buf.data() + 8 * n, 1, DType::f64);
  });
  // all_to_all: rank 0 sends 2 elements to rank 1, which expects 1.
  std::vector<std::size_t> sc(static_cast<std::size_t>(n), 1), rc = sc;
  if (me == 0) sc[1] = 2;
  const std::string e = error_of([&] { c->all_to_all(buf.data(), sc, buf.data() + 8 * n, rc, DType::f64); });
  CHECK_MESSAGE(has(e, "checked mode"), e);
  CHECK_MESSAGE(has(e, me == 1 ? "this rank expects 1 elements from rank 0, which sends 2" : "(rank 1 found the mismatch)"), e);
  // exchange: rank 0 sends 2 elements to rank 1, which expects 1; then rank 1's self pair disagrees.
  std::vector<coll::Region> xs(static_cast<std::size_t>(n)), xr(static_cast<std::size_t>(n));
  for (std::size_t p = 0; p < static_cast<std::size_t>(n); ++p) {
    xs[p] = coll::Region::contiguous(p, 1);
    xr[p] = box(p, {1, 1}, {1, 1});
  }
  auto xs0 = xs;
  if (me == 0) xs0[1] = box(4 * static_cast<std::size_t>(n), {2}, {3});
  const std::string xe = error_of([&] { c->exchange(buf.data(), xs0, buf.data() + 8 * n, xr, DType::f64); });
  CHECK_MESSAGE(has(xe, "exchange on world (mpi, rank "), xe);
  CHECK_MESSAGE(has(xe, me == 1 ? "ranks disagree on the region counts: this rank expects 1 elements from rank 0, which sends 2"
                                : "ranks disagree on the region counts (rank 1 found the mismatch)"),
                xe);
  all_say("ranks disagree on the region counts", [&] {
    auto xr1 = xr;
    if (me == 1) xr1[1] = coll::Region{};
    c->exchange(buf.data(), xs, buf.data() + 8 * n, xr1, DType::f64);
  });
  all_say("ranks call different collectives: all_to_all and exchange", [&] {
    if (me == 0) c->exchange(buf.data(), xs, buf.data() + 8 * n, xr, DType::f64);
    else c->all_to_all(buf.data(), buf.data() + 8 * n, 1, DType::f64);
  });
  // permute: a ring where rank 0 sends 3 elements but rank 1 expects 2.
  all_say("rank 0 sends 3 elements to rank 1, which expects 2", [&] {
    c->permute(buf.data(), me == 0 ? 3 : 2, (me + 1) % n, buf.data() + 8 * n, 2, (me + n - 1) % n, DType::f64);
  });
  // permute: rank 1 receives from rank 0, which sends to nobody.
  all_say("rank 1 receives from rank 0, which sends to nobody", [&] {
    const int dest = me == 0 || me == n - 1 ? -1 : me + 1, source = me == 0 ? -1 : me - 1;
    c->permute(buf.data(), 2, dest, buf.data() + 8 * n, 2, source, DType::f64);
  });
}

// ---- long buffers (set_mpi_max_count lowers the limit so that small ones reach it) -------------

TEST_SUITE("count_limit") {
  TEST_CASE("set_mpi_max_count refuses 0 and limits past INT_MAX, and leaves the limit as it was") {
    const std::size_t before = max_count();
    for (std::size_t bad : {std::size_t{0}, static_cast<std::size_t>(INT_MAX) + 1}) {
      const std::string e = error_of([&] { coll::set_mpi_max_count(bad); });
      CHECK_MESSAGE(has(e, "set_mpi_max_count(" + std::to_string(bad) + ")"), e);
      CHECK_MESSAGE(has(e, "[1, INT_MAX]"), e);
      CHECK(max_count() == before);
    }
  }

  TEST_CASE("long buffers: all_reduce, broadcast, send/recv and permute travel in pieces") {
    at_small_and_default_limit([&] {
      auto& c = world();
      const int n = c.size(), me = c.rank();
      const std::size_t count = 23;
      {
        std::vector<std::int32_t> v(count), want(count);
        for (std::size_t i = 0; i < count; ++i) {
          v[i] = input<std::int32_t>(Op::sum, me, static_cast<long long>(i), 0);
          want[i] = reduced<std::int32_t>(Op::sum, n, static_cast<long long>(i), 0);
        }
        std::vector<std::int32_t> out(count, -1);
        reset_calls();
        c.all_reduce(v.data(), out.data(), count, DType::i32, Op::sum);
        CHECK(diff(out, want) == "");
        CHECK(calls("MPI_Allreduce") == static_cast<int>(pieces(count)));
        std::vector<f16> h(count), hw(count);
        for (std::size_t i = 0; i < count; ++i) {
          h[i] = input<f16>(Op::max, me, static_cast<long long>(i), 1);
          hw[i] = reduced<f16>(Op::max, n, static_cast<long long>(i), 1);
        }
        c.all_reduce(h.data(), h.data(), count, DType::f16, Op::max);
        CHECK(diff(h, hw) == "");
      }
      {
        std::vector<double> b(count, -1.0), want(count);
        for (std::size_t i = 0; i < count; ++i) want[i] = static_cast<double>(code(n - 1, 9, static_cast<long long>(i)));
        if (me == n - 1) b = want;
        reset_calls();
        c.broadcast(b.data(), count, DType::f64, n - 1);
        CHECK(diff(b, want) == "");
        CHECK(calls("MPI_Bcast") == static_cast<int>(pieces(count)));
      }
      {  // send/recv of several lengths around the limit
        const int partner = me % 2 == 0 ? me + 1 : me - 1;
        if (partner < n) {
          for (std::size_t len : {std::size_t{0}, std::size_t{4}, std::size_t{5}, std::size_t{6}, count}) {
            std::vector<std::uint8_t> buf(len, 0), want(len);
            for (std::size_t i = 0; i < len; ++i) want[i] = static_cast<std::uint8_t>(code(me - me % 2, 4, static_cast<long long>(i)));
            reset_calls();
            if (me % 2 == 0) c.send(want.data(), len, DType::u8, partner, 5);
            else c.recv(buf.data(), len, DType::u8, partner, 5);
            INFO(("length " + std::to_string(len)));
            if (me % 2 == 1) CHECK(diff(buf, want) == "");
            CHECK(calls(me % 2 == 0 ? "MPI_Isend" : "MPI_Recv") == static_cast<int>(pieces(len)));
          }
        }
      }
      {  // ring where each rank sends a different length: 2, 6, 10, ... elements
        auto len = [](int r) { return static_cast<std::size_t>(2 + 4 * r); };
        const int dest = (me + 1) % n, source = (me + n - 1) % n;
        std::vector<std::int16_t> send(len(me)), recv(len(source), -1), want(len(source));
        for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::int16_t>(code(me, 6, static_cast<long long>(i)));
        for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<std::int16_t>(code(source, 6, static_cast<long long>(i)));
        reset_calls();
        c.permute(send.data(), send.size(), dest, recv.data(), recv.size(), source, DType::i16);
        CHECK(diff(recv, want) == "");
        CHECK(calls("MPI_Sendrecv") == static_cast<int>(std::max(pieces(send.size()), pieces(recv.size()))));
      }
    });
  }

  TEST_CASE("long buffers: all_gather, reduce_scatter and all_to_all refuse what MPI's int counts cannot hold") {
    at_small_and_default_limit([&] {
      auto& c = world();
      const int n = c.size();
      // Nothing is read or written: the check comes before MPI.
      alignas(8) unsigned char dummy[8] = {};
      const std::size_t big = max_count() + 1;
      const std::string limit = "(" + std::to_string(max_count()) + "; MPI counts and displacements are int)";
      std::string e = error_of([&] { c.all_gather(dummy, dummy, big, DType::u8); });
      CHECK_MESSAGE(has(e, "all_gather on world"), e);
      CHECK_MESSAGE(has(e, limit), e);
      // Far-apart addresses (never dereferenced): separate buffers of that size pass the overlap check.
      void* far_a = reinterpret_cast<void*>(std::uintptr_t{1} << 40);
      void* far_b = reinterpret_cast<void*>(std::uintptr_t{3} << 40);
      e = error_of([&] { c.reduce_scatter(far_a, far_b, big, DType::f32, Op::sum); });
      CHECK_MESSAGE(has(e, "reduce_scatter on world"), e);
      CHECK_MESSAGE(has(e, limit), e);
      e = error_of([&] { c.all_to_all(far_a, far_b, big, DType::f64); });
      CHECK_MESSAGE(has(e, "all_to_all on world"), e);
      CHECK_MESSAGE(has(e, limit), e);
      std::vector<std::size_t> counts(static_cast<std::size_t>(n), 0);
      counts[0] = big;
      e = error_of([&] { c.all_gather(dummy, dummy, counts, DType::i64); });
      CHECK_MESSAGE(has(e, "a buffer of " + std::to_string(big) + " elements"), e);
    });
  }

  TEST_CASE("long buffers: exchange refuses what MPI's int counts cannot hold, the self pair not counted") {
    at_small_and_default_limit([&] {
      auto& c = world();
      const int n = c.size(), me = c.rank();
      if (n < 2) return;  // the ring below would be the self pair
      const auto un = static_cast<std::size_t>(n);
      const std::size_t big = max_count() + 1;
      const std::string limit = "(" + std::to_string(max_count()) + "; MPI counts and displacements are int)";
      void* far_a = reinterpret_cast<void*>(std::uintptr_t{1} << 40);  // never dereferenced
      void* far_b = reinterpret_cast<void*>(std::uintptr_t{3} << 40);
      // Ring: big elements to the next rank, from the previous one.
      std::vector<coll::Region> sr(un), rr(un);
      sr[static_cast<std::size_t>((me + 1) % n)] = coll::Region::contiguous(0, big);
      rr[static_cast<std::size_t>((me + n - 1) % n)] = coll::Region::contiguous(0, big);
      std::string e = error_of([&] { c.exchange(far_a, sr, far_b, rr, DType::u8); });
      CHECK_MESSAGE(has(e, "exchange on world"), e);
      CHECK_MESSAGE(has(e, "a buffer of " + std::to_string(big) + " elements"), e);
      CHECK_MESSAGE(has(e, limit), e);
      // Just below the limit, with real buffers: max_count elements to others (when that is small).
      if (max_count() < 1000) {
        std::vector<std::int16_t> send(big * un), recv(big * un, -1);
        std::vector<coll::Region> s2(un), r2(un);
        const std::size_t each = max_count() / std::max<std::size_t>(un - 1, 1);
        for (std::size_t p = 0; p < un; ++p) {
          s2[p] = coll::Region::contiguous(p * big, p == static_cast<std::size_t>(me) ? big : each);  // self: over the limit alone
          r2[p] = coll::Region::contiguous(p * big, p == static_cast<std::size_t>(me) ? big : each);
          for (std::size_t i = 0; i < big; ++i) send[p * big + i] = static_cast<std::int16_t>(code(me, static_cast<long long>(p), static_cast<long long>(i)));
        }
        CHECK(error_of([&] { c.exchange(send.data(), s2, recv.data(), r2, DType::i16); }) == "no exception");
        for (std::size_t p = 0; p < un; ++p)
          for (std::size_t i = 0; i < (p == static_cast<std::size_t>(me) ? big : each); ++i)
            CHECK(recv[p * big + i] == static_cast<std::int16_t>(code(static_cast<long long>(p), me, static_cast<long long>(i))));
      }
    });
  }
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = 0;
  {
    auto w = MpiCommunicator::world(false);
    the_world = w.get();
    doctest::Context context(argc, argv);
    if (rank != 0) {  // rank 0 reports; the others only their failures, uncoloured (mpirun gives them ptys)
      context.setOption("minimal", true);
      context.setOption("no-colors", true);
    }
    failed = context.run();
    the_world = nullptr;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any != 0 ? 1 : 0;
}
