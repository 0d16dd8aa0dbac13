// SPDX-License-Identifier: Apache-2.0
/// @file
/// The `mpi` backend of the collectives: one process per device, each collective one MPI call
/// (long buffers aside).
///
/// A thin layer over MPI, no algorithms of its own: all_gather is MPI_Allgather(v),
/// reduce_scatter MPI_Reduce_scatter, all_reduce MPI_Allreduce, all_to_all
/// MPI_Alltoall(v), broadcast MPI_Bcast, send/recv MPI_Send/MPI_Recv, permute MPI_Sendrecv,
/// barrier MPI_Barrier and split MPI_Comm_split. Buffers are host memory.
///
/// exchange talks only to the ranks it sends to or receives from (MPI_Isend/MPI_Irecv on the
/// backend's own tag, as permute): a reshard that moves blocks to one peer costs one message,
/// not an all-rank MPI_Alltoallv. Contiguous regions go straight from and into the caller's
/// buffers; strided ones are packed into (and unpacked from) reused scratch buffers; the self
/// pair is copied directly.
///
/// - **In place.** MPI wants MPI_IN_PLACE on every rank or none, and one rank cannot know what
///   the others do. all_reduce always passes it (a separate send buffer is first copied into
///   place, measured as fast as the raw call); all_gather never does (a send buffer inside recv
///   is staged in a reused scratch buffer, so the common separate-buffer case is the raw call).
///   reduce_scatter and all_to_all take separate buffers (Communicator refuses overlapping
///   ones on every backend).
/// - **Errors.** The communicator returns errors (MPI_ERRORS_RETURN); each failing MPI call
///   becomes a `CollectiveError` naming the MPI function, the group, the rank and MPI's text.
/// - **f16 / bf16.** Moved as 16-bit words; reduced by user-defined MPI operations that
///   combine pairs through float (round to nearest even at every step; NaN propagates).
/// - **Large buffers.** MPI counts are `int`. all_reduce, broadcast, send, recv and permute
///   split longer buffers into several calls; all_gather, reduce_scatter, all_to_all and
///   exchange, whose blocks MPI addresses with `int` counts and displacements, throw when a
///   whole buffer (for exchange: what goes to, or comes from, the other ranks) exceeds INT_MAX
///   elements (never truncating).
/// - **Tags.** permute travels on the communicator's largest tag (MPI_TAG_UB), which send and
///   recv refuse, so that a permute never takes a message meant for a recv or the reverse.
/// - **Checked mode.** With SHARDLIB_CHECK_COLLECTIVES=1 in the environment (or `checked` set
///   at construction), every collective first compares a small signature across the group
///   (which collective, dtype, op, root, counts) with one MPI_Allreduce (uneven all_to_all,
///   exchange and permute also exchange their counts and peers), and throws on every rank when they
///   disagree, instead of letting MPI hang or corrupt memory. It costs a latency or two per
///   collective, so it is off by default. send and recv are not checked.
/// - **Watchdog.** A call that waits in MPI longer than SHARDLIB_MPI_TIMEOUT seconds (default
///   600; 0: off), a collective some rank never reaches, ends the process with the call, group
///   and rank on stderr and exit status 124; mpirun then ends the job (detail/mpi_watchdog.hpp).
///
/// Compiled only with SHARDLIB_HAVE_MPI (Meson defines it when MPI is found); otherwise this
/// header declares nothing of its own.
#pragma once

#include <shardlib/collectives/communicator.hpp>

#if defined(SHARDLIB_HAVE_MPI)

#include <shardlib/collectives/detail/mpi_c.hpp>
#include <shardlib/collectives/detail/mpi_watchdog.hpp>
#include <shardlib/collectives/detail/region_copy.hpp>

#include <algorithm>
#include <atomic>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifndef SHARDLIB_MPI_MAX_COUNT
/// The most elements one MPI call is given at start-up (MPI counts are int); see
/// `coll::set_mpi_max_count` to change it at run time. Every translation unit must agree on it.
#define SHARDLIB_MPI_MAX_COUNT INT_MAX
#endif

namespace shardlib::coll {

namespace detail::mpi {

static_assert(SHARDLIB_MPI_MAX_COUNT >= 1 && SHARDLIB_MPI_MAX_COUNT <= INT_MAX,
              "SHARDLIB_MPI_MAX_COUNT must lie in [1, INT_MAX]");
inline std::atomic<std::size_t>& max_count_setting() noexcept {
  static std::atomic<std::size_t> n{static_cast<std::size_t>(SHARDLIB_MPI_MAX_COUNT)};
  return n;
}
/// The most elements one MPI call is given now (see set_mpi_max_count).
inline std::size_t max_count() noexcept { return max_count_setting().load(std::memory_order_relaxed); }

inline MPI_Datatype datatype(DType t) noexcept {
  switch (t) {
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i16: return MPI_INT16_T;
    case DType::u16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::u32: return MPI_UINT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u64: return MPI_UINT64_T;
    case DType::f16: return MPI_UINT16_T;  // moved as words, reduced by half_ops()
    case DType::bf16: return MPI_UINT16_T;
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op builtin_op(Op op) noexcept {
  switch (op) {
    case Op::sum: return MPI_SUM;
    case Op::prod: return MPI_PROD;
    case Op::max: return MPI_MAX;
    case Op::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

/// inout[i] = in[i] (op) inout[i] for 16-bit floats, through float.
template <bool Bf16, Op O>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const unsigned char*>(in);
  auto* b = static_cast<unsigned char*>(inout);
  for (std::size_t i = 0, n = static_cast<std::size_t>(*len); i < n; ++i) {
    std::uint16_t x, y;
    std::memcpy(&x, a + 2 * i, 2);
    std::memcpy(&y, b + 2 * i, 2);
    const float fx = Bf16 ? bf16_to_float(x) : f16_to_float(x);
    const float fy = Bf16 ? bf16_to_float(y) : f16_to_float(y);
    float r;
    if constexpr (O == Op::sum) r = fx + fy;
    else if constexpr (O == Op::prod) r = fx * fy;
    else if constexpr (O == Op::max) r = (fx != fx || fx > fy) ? fx : fy;  // NaN propagates
    else r = (fx != fx || fx < fy) ? fx : fy;
    y = Bf16 ? float_to_bf16(r) : float_to_f16(r);
    std::memcpy(b + 2 * i, &y, 2);
  }
}

/// The eight f16/bf16 operations, [bf16][op].
struct HalfOps {
  MPI_Op op[2][4];
};

/// Frees the operations at MPI_Finalize (attribute of MPI_COMM_SELF, deleted first thing there).
inline int free_half_ops(MPI_Comm, int, void*, void* extra) {
  auto* ops = static_cast<HalfOps*>(extra);
  for (auto& row : ops->op)
    for (auto& o : row)
      if (o != MPI_OP_NULL) MPI_Op_free(&o);
  return MPI_SUCCESS;
}

/// Creates the operations once, on first use; returns the MPI error code of a failure.
inline int create_half_ops(HalfOps& ops) {
  using Fn = MPI_User_function*;
  const Fn fns[2][4] = {
      {&half_reduce<false, Op::sum>, &half_reduce<false, Op::prod>, &half_reduce<false, Op::max>,
       &half_reduce<false, Op::min>},
      {&half_reduce<true, Op::sum>, &half_reduce<true, Op::prod>, &half_reduce<true, Op::max>,
       &half_reduce<true, Op::min>}};
  for (auto& row : ops.op)
    for (auto& o : row) o = MPI_OP_NULL;
  for (int b = 0; b < 2; ++b)
    for (int o = 0; o < 4; ++o)
      if (int rc = MPI_Op_create(fns[b][o], 1, &ops.op[b][o]); rc != MPI_SUCCESS) return rc;
  int keyval = MPI_KEYVAL_INVALID;
  if (int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half_ops, &keyval, &ops); rc != MPI_SUCCESS)
    return rc;
  return MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
}

/// The operation for (bf16?, op); creates all eight on first call (thread-safe).
inline MPI_Op half_op(bool bf16, Op op, int& rc) {
  static HalfOps ops;
  static const int created = create_half_ops(ops);
  rc = created;
  return ops.op[bf16 ? 1 : 0][static_cast<int>(op)];
}

}  // namespace detail::mpi

/// Sets the most elements the mpi backend hands one MPI call (at start-up INT_MAX, MPI counts
/// being int, or `SHARDLIB_MPI_MAX_COUNT`): all_reduce, broadcast, send/recv and permute then send
/// longer buffers in several calls; the other collectives refuse a buffer over it (MPI's counts
/// and displacements of one call must hold it). Lower it for an MPI library with trouble above
/// some message size, or to reach the splitting paths with small buffers (the tests do). Set it
/// to the same value on every process, between collectives. Throws std::invalid_argument
/// outside [1, INT_MAX].
inline void set_mpi_max_count(std::size_t n) {
  if (n < 1 || n > static_cast<std::size_t>(INT_MAX))
    throw std::invalid_argument("shardlib: set_mpi_max_count(" + std::to_string(n) +
                                "): the limit must lie in [1, INT_MAX] (MPI counts are int)");
  detail::mpi::max_count_setting().store(n, std::memory_order_relaxed);
}

/// A group of processes over an MPI communicator (see the file comment).
///
/// One instance per group and process; like MPI communicators, an instance must not run two
/// collectives at once from different threads. Every call blocks until its buffers may be
/// reused. Buffers must be host memory.
class MpiCommunicator final : public Communicator {
 public:
  /// Wraps `comm` (an intracommunicator) and sets MPI_ERRORS_RETURN on it. With `owns_comm`
  /// the destructor frees it (unless MPI is finalised by then); without, it puts the previous
  /// error handler back. If the constructor throws, `comm` stays the caller's, unchanged.
  /// `checked` turns the checked mode on (see the file comment).
  MpiCommunicator(MPI_Comm comm, std::string name, bool owns_comm, bool checked = checked_by_environment())
      : Communicator(query(comm, true), query(comm, false), std::move(name)),
        comm_(comm),
        owns_(owns_comm),
        checked_(checked),
        send_counts_(static_cast<std::size_t>(size())),
        send_displs_(static_cast<std::size_t>(size())),
        recv_counts_(static_cast<std::size_t>(size())),
        recv_displs_(static_cast<std::size_t>(size())),
        check_buf_(checked ? 4 * static_cast<std::size_t>(size()) : 0) {
    int inter = 0;
    ok(MPI_Comm_test_inter(comm_, &inter), "MPI_Comm_test_inter", "construction");
    if (inter) {
      throw CollectiveError("shardlib: " + where("construction") +
                            ": an intercommunicator was given; collectives need an intracommunicator");
    }
    if (!owns_) ok(MPI_Comm_get_errhandler(comm_, &previous_), "MPI_Comm_get_errhandler", "construction");
    if (int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN); rc != MPI_SUCCESS) {
      if (previous_ != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&previous_);
      ok(rc, "MPI_Comm_set_errhandler", "construction");
    }
    int* tag_ub = nullptr;
    int found = 0;
    // Predefined attributes are cached on MPI_COMM_WORLD (the bound holds for every communicator).
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found) == MPI_SUCCESS && found && tag_ub)
      permute_tag_ = *tag_ub;
  }

  /// All processes, over a duplicate of MPI_COMM_WORLD (so that our traffic never matches the
  /// application's own), named "world".
  static std::unique_ptr<MpiCommunicator> world(bool checked = checked_by_environment()) {
    query(MPI_COMM_WORLD, true);  // throws when MPI is not initialised
    MPI_Comm dup = MPI_COMM_NULL;
    if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup); rc != MPI_SUCCESS)
      throw CollectiveError("shardlib: mpi backend: MPI_Comm_dup(MPI_COMM_WORLD) failed: " +
                            detail::mpi::error_string(rc));
    try {
      return std::make_unique<MpiCommunicator>(dup, "world", true, checked);
    } catch (...) {
      MPI_Comm_free(&dup);
      throw;
    }
  }

  /// Whether SHARDLIB_CHECK_COLLECTIVES asks for the checked mode (set, not empty, not "0").
  static bool checked_by_environment() noexcept {
    const char* v = std::getenv("SHARDLIB_CHECK_COLLECTIVES");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    reap_sends(true);  // (every send was matched by a recv: these complete)
    if (owns_) {
      MPI_Comm_free(&comm_);
    } else if (previous_ != MPI_ERRHANDLER_NULL) {
      MPI_Comm_set_errhandler(comm_, previous_);
      MPI_Errhandler_free(&previous_);
    }
  }

  std::string_view backend() const noexcept override { return "mpi"; }
  bool accepts_device_memory() const noexcept override { return false; }
  bool buffered_sends() const noexcept override { return true; }  // MPI_Isend of a copy (do_send)

  /// The MPI communicator (for calls of the application's own; do not free it).
  MPI_Comm comm() const noexcept { return comm_; }
  /// Whether collectives are checked across the group before they run.
  bool checked() const noexcept { return checked_; }

 protected:
  void do_all_gather(const void* send, void* recv, const Blocks& blocks, DType t) override {
    const auto watching = watch("all_gather");
    constexpr std::string_view call = "all_gather";
    if (checked_) verify(call, signature(Kind::all_gather, t, blocks));
    const int me = rank();
    const std::size_t es = size_of(t);
    int count = 0;
    fit_total(call, blocks.total());
    if (blocks.is_uniform()) {
      count = static_cast<int>(blocks.count(me));
    } else {
      fill(blocks, send_counts_, send_displs_);
    }
    // Never MPI_IN_PLACE (MPI wants it on all ranks or none, and one rank cannot know what the
    // others pass): the plain call, as fast as the raw MPI call. A send buffer inside recv (this
    // rank gathers in place) is staged in a reused scratch buffer first, since MPI forbids
    // overlapping buffers.
    const std::size_t own_bytes = blocks.count(me) * es;
    const auto* s = static_cast<const unsigned char*>(send);
    const auto* r = static_cast<const unsigned char*>(recv);
    if (own_bytes != 0 && s < r + blocks.total() * es && r < s + own_bytes) {
      if (scratch_.size() < own_bytes) scratch_.resize(own_bytes);
      std::memcpy(scratch_.data(), send, own_bytes);
      send = scratch_.data();
    }
    const MPI_Datatype dt = detail::mpi::datatype(t);
    if (blocks.is_uniform())
      ok(MPI_Allgather(send, count, dt, recv, count, dt, comm_), "MPI_Allgather", call);
    else
      ok(MPI_Allgatherv(send, static_cast<int>(blocks.count(me)), dt, recv, send_counts_.data(), send_displs_.data(), dt,
                        comm_),
         "MPI_Allgatherv", call);
  }

  void do_reduce_scatter(const void* send, void* recv, const Blocks& blocks, DType t, Op op) override {
    const auto watching = watch("reduce_scatter");
    constexpr std::string_view call = "reduce_scatter";
    if (checked_) verify(call, signature(Kind::reduce_scatter, t, blocks, op));
    fit_total(call, blocks.total());
    const MPI_Op mop = mpi_op(call, t, op);
    const void* in = send;  // never overlaps recv (checked by Communicator)
    // MPI_Reduce_scatter even for uniform blocks: Open MPI 4.1's MPI_Reduce_scatter_block took
    // 2-2.6x its time for 1-8 MiB on 2, 4 and 8 ranks of one host (as long as its reduce-then-
    // scatter algorithm, forced, takes).
    fill(blocks, recv_counts_, recv_displs_);
    ok(MPI_Reduce_scatter(in, recv, recv_counts_.data(), detail::mpi::datatype(t), mop, comm_), "MPI_Reduce_scatter",
       call);
  }

  void do_all_reduce(const void* send, void* recv, std::size_t count, DType t, Op op) override {
    const auto watching = watch("all_reduce");
    constexpr std::string_view call = "all_reduce";
    if (checked_) {
      Signature s{Kind::all_reduce, t};
      s.op = static_cast<std::int64_t>(op);
      s.count = static_cast<std::int64_t>(count);
      verify(call, s);
    }
    const MPI_Op mop = mpi_op(call, t, op);
    const std::size_t es = size_of(t);
    // In place on every rank (MPI wants MPI_IN_PLACE on all ranks or none): a separate send
    // buffer is copied first, as MPI's own algorithms do.
    if (count != 0 && send != recv) std::memmove(recv, send, count * es);
    auto* buf = static_cast<unsigned char*>(recv);
    for (std::size_t done = 0; done < count;) {
      const std::size_t n = std::min(count - done, detail::mpi::max_count());
      ok(MPI_Allreduce(MPI_IN_PLACE, buf + done * es, static_cast<int>(n), detail::mpi::datatype(t), mop, comm_),
         "MPI_Allreduce", call);
      done += n;
    }
  }

  void do_all_to_all(const void* send, const Blocks& send_blocks, void* recv, const Blocks& recv_blocks,
                     DType t) override {
    constexpr std::string_view call = "all_to_all";
    const auto watching = watch("all_to_all");
    if (checked_) verify_all_to_all(send_blocks, recv_blocks, t);
    fit_total(call, send_blocks.total());
    fit_total(call, recv_blocks.total());
    const MPI_Datatype dt = detail::mpi::datatype(t);
    if (send_blocks.is_uniform() && recv_blocks.is_uniform()) {
      ok(MPI_Alltoall(send, static_cast<int>(send_blocks.count(0)), dt, recv, static_cast<int>(recv_blocks.count(0)),
                      dt, comm_),
         "MPI_Alltoall", call);
    } else {
      fill(send_blocks, send_counts_, send_displs_);
      fill(recv_blocks, recv_counts_, recv_displs_);
      ok(MPI_Alltoallv(send, send_counts_.data(), send_displs_.data(), dt, recv, recv_counts_.data(),
                       recv_displs_.data(), dt, comm_),
         "MPI_Alltoallv", call);
    }
  }

  void do_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                   std::span<const Region> recv_regions, DType t) override {
    Exchange x(*this);
    x.start(send, send_regions, recv, recv_regions, t);
    x.wait();
  }
  std::unique_ptr<PendingExchange> do_start_exchange(const void* send, std::span<const Region> send_regions, void* recv,
                                                     std::span<const Region> recv_regions, DType t) override {
    auto x = std::make_unique<Exchange>(*this);
    x->start(send, send_regions, recv, recv_regions, t);
    return x;
  }

  void do_broadcast(void* buf, std::size_t count, DType t, int root) override {
    const auto watching = watch("broadcast");
    constexpr std::string_view call = "broadcast";
    if (checked_) {
      Signature s{Kind::broadcast, t};
      s.root = root;
      s.count = static_cast<std::int64_t>(count);
      verify(call, s);
    }
    const std::size_t es = size_of(t);
    auto* p = static_cast<unsigned char*>(buf);
    for (std::size_t done = 0; done < count;) {
      const std::size_t n = std::min(count - done, detail::mpi::max_count());
      ok(MPI_Bcast(p + done * es, static_cast<int>(n), detail::mpi::datatype(t), root, comm_), "MPI_Bcast", call);
      done += n;
    }
  }

  /// The receiver must ask for exactly `count` elements (long messages travel in pieces).
  /// Buffered: the message is copied and sent with MPI_Isend, so the call returns before the peer
  /// receives (two neighbours may send to each other first); the sends still in flight are
  /// completed as later sends and receives find them done, and all of them at the end.
  void do_send(const void* buf, std::size_t count, DType t, int peer, int tag) override {
    const auto watching = watch("send");
    check_tag("send", tag);
    reap_sends(false);
    const std::size_t es = size_of(t);
    PendingSend ps;
    ps.data.assign(static_cast<const unsigned char*>(buf), static_cast<const unsigned char*>(buf) + count * es);
    const std::size_t pieces = pieces_of(count);
    for (std::size_t i = 0; i < pieces; ++i) {
      const std::size_t done = i * detail::mpi::max_count(), n = std::min(count - done, detail::mpi::max_count());
      MPI_Request r = MPI_REQUEST_NULL;
      ok(MPI_Isend(ps.data.data() + done * es, static_cast<int>(n), detail::mpi::datatype(t), peer, tag, comm_, &r),
         "MPI_Isend", "send");
      ps.requests.push_back(r);
    }
    pending_sends_.push_back(std::move(ps));  // (the copy's buffer moves with it: the requests stay valid)
  }

  void do_recv(void* buf, std::size_t count, DType t, int peer, int tag) override {
    const auto watching = watch("recv");
    check_tag("recv", tag);
    reap_sends(false);
    const std::size_t es = size_of(t);
    auto* p = static_cast<unsigned char*>(buf);
    const std::size_t pieces = pieces_of(count);
    for (std::size_t i = 0; i < pieces; ++i) {
      const std::size_t done = i * detail::mpi::max_count(), n = std::min(count - done, detail::mpi::max_count());
      ok(MPI_Recv(p + done * es, static_cast<int>(n), detail::mpi::datatype(t), peer, tag, comm_, MPI_STATUS_IGNORE),
         "MPI_Recv", "recv");
    }
  }

  void do_permute(const void* send, std::size_t send_count, int dest, void* recv, std::size_t recv_count,
                  int source, DType t) override {
    constexpr std::string_view call = "permute";
    const auto watching = watch("permute");
    if (checked_) verify_permute(send_count, dest, recv_count, source, t);
    const std::size_t es = size_of(t);
    const auto* in = static_cast<const unsigned char*>(send);
    auto* out = static_cast<unsigned char*>(recv);
    // Piece i of what goes out travels with piece i of what comes in; a side with fewer pieces
    // sits the rest out (MPI_PROC_NULL). Both ends of a message count its pieces alike.
    const std::size_t out_pieces = dest < 0 ? 0 : pieces_of(send_count);
    const std::size_t in_pieces = source < 0 ? 0 : pieces_of(recv_count);
    const MPI_Datatype dt = detail::mpi::datatype(t);
    for (std::size_t i = 0; i < std::max(out_pieces, in_pieces); ++i) {
      const std::size_t at = i * detail::mpi::max_count();
      const bool sends = i < out_pieces, receives = i < in_pieces;
      const std::size_t ns = sends ? std::min(send_count - at, detail::mpi::max_count()) : 0;
      const std::size_t nr = receives ? std::min(recv_count - at, detail::mpi::max_count()) : 0;
      ok(MPI_Sendrecv(sends ? in + at * es : nullptr, static_cast<int>(ns), dt, sends ? dest : MPI_PROC_NULL,
                      permute_tag_, receives ? out + at * es : nullptr, static_cast<int>(nr), dt,
                      receives ? source : MPI_PROC_NULL, permute_tag_, comm_, MPI_STATUS_IGNORE),
         "MPI_Sendrecv", call);
    }
  }

  void do_barrier() override {
    const auto watching = watch("barrier");
    if (checked_) verify("barrier", Signature{Kind::barrier, DType::u8});
    ok(MPI_Barrier(comm_), "MPI_Barrier", "barrier");
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name) override {
    const auto watching = watch("split");
    if (checked_) verify("split", Signature{split_kind, DType::u8});
    MPI_Comm sub = MPI_COMM_NULL;
    ok(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split", "split");
    if (sub == MPI_COMM_NULL) return nullptr;
    try {
      return std::make_unique<MpiCommunicator>(sub, std::move(name), true, checked_);
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
  }

 private:
  /// While alive, the watchdog (detail/mpi_watchdog.hpp) knows this process waits in `call` here.
  detail::mpi::Watch watch(const char* call) const { return detail::mpi::Watch(call, name(), rank(), size()); }

  static constexpr std::int64_t split_kind = num_kinds;        // signature codes after Kind's: split,
  static constexpr std::int64_t exchange_kind = num_kinds + 1;  // exchange (counted as all_to_all)

  /// What the checked mode compares; -1 where a field does not apply.
  struct Signature {
    Signature(std::int64_t k, DType t) : kind(k), dtype(static_cast<std::int64_t>(t)) {}
    Signature(Kind k, DType t) : Signature(static_cast<std::int64_t>(k), t) {}
    std::int64_t kind, dtype, op = -1, root = -1, uneven = 0, count = -1, total = -1, hash = -1;
    static constexpr int fields = 8;
    std::array<std::int64_t, fields> values() const { return {kind, dtype, op, root, uneven, count, total, hash}; }
  };

  static int query(MPI_Comm comm, bool rank) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw CollectiveError(std::string("shardlib: mpi backend: MPI is ") +
                            (finalized ? "already finalised" : "not initialised (call MPI_Init_thread first)"));
    if (comm == MPI_COMM_NULL) throw CollectiveError("shardlib: mpi backend: the communicator is MPI_COMM_NULL");
    int v = 0;
    if (int rc = rank ? MPI_Comm_rank(comm, &v) : MPI_Comm_size(comm, &v); rc != MPI_SUCCESS)
      throw CollectiveError(std::string("shardlib: mpi backend: ") + (rank ? "MPI_Comm_rank" : "MPI_Comm_size") +
                            " failed: " + detail::mpi::error_string(rc));
    return v;
  }

  void ok(int rc, std::string_view mpi_call, std::string_view call) const {
    if (rc != MPI_SUCCESS)
      throw CollectiveError("shardlib: " + where(call) + ": " + std::string(mpi_call) +
                            " failed: " + detail::mpi::error_string(rc));
  }

  /// permute's messages have a tag of their own, so that they never match a send or recv.
  void check_tag(std::string_view call, int tag) const {
    if (tag == permute_tag_)
      throw CollectiveError("shardlib: " + where(call) + ": tag " + std::to_string(tag) +
                            " (MPI_TAG_UB) is the mpi backend's own, for permute; use a smaller tag");
  }

  static std::size_t pieces_of(std::size_t count) noexcept {
    return count == 0 ? 1 : (count - 1) / detail::mpi::max_count() + 1;
  }

  /// The whole buffer must fit MPI's int counts and displacements (same verdict on every rank
  /// whose blocks agree).
  void fit_total(std::string_view call, std::size_t total) const {
    if (total > detail::mpi::max_count())
      throw CollectiveError("shardlib: " + where(call) + ": a buffer of " + std::to_string(total) +
                            " elements is more than the mpi backend can pass to one MPI call (" +
                            std::to_string(detail::mpi::max_count()) +
                            "; MPI counts and displacements are int) and this collective is not split");
  }

  /// Counts and displacements as int (fit_total has checked the total).
  static void fill(const Blocks& b, std::vector<int>& counts, std::vector<int>& displs) noexcept {
    std::size_t off = 0;
    for (int r = 0; r < b.ranks(); ++r) {
      const auto i = static_cast<std::size_t>(r);
      counts[i] = static_cast<int>(b.count(r));
      displs[i] = static_cast<int>(off);
      off += b.count(r);
    }
  }

  MPI_Op mpi_op(std::string_view call, DType t, Op op) const {
    if (t != DType::f16 && t != DType::bf16) return detail::mpi::builtin_op(op);
    int rc = MPI_SUCCESS;
    const MPI_Op o = detail::mpi::half_op(t == DType::bf16, op, rc);
    if (rc != MPI_SUCCESS)
      throw CollectiveError("shardlib: " + where(call) + ": the mpi backend cannot reduce " + std::string(coll::name(t)) +
                            ": creating its MPI operation failed: " + detail::mpi::error_string(rc));
    return o;
  }

  // ---- checked mode -------------------------------------------------------------------------

  Signature signature(Kind k, DType t, const Blocks& b, int op = -1) const {
    Signature s{k, t};
    s.op = op;
    if (b.is_uniform()) {
      s.count = static_cast<std::int64_t>(b.count(0));
    } else {
      s.uneven = 1;
      s.total = static_cast<std::int64_t>(b.total());
      std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts
      for (int r = 0; r < b.ranks(); ++r) h = (h ^ b.count(r)) * 1099511628211ull;
      s.hash = static_cast<std::int64_t>(h >> 2);  // >= 0, so that -hash cannot overflow
    }
    return s;
  }
  Signature signature(Kind k, DType t, const Blocks& b, Op op) const {
    return signature(k, t, b, static_cast<int>(op));
  }

  [[noreturn]] void mismatch(std::string_view call, const std::string& what) const {
    throw CollectiveError("shardlib: " + where(call) + ": checked mode (SHARDLIB_CHECK_COLLECTIVES): " + what);
  }

  static std::string kind_name(std::int64_t k) {
    return k == split_kind ? "split" : k == exchange_kind ? "exchange" : std::string(coll::name(static_cast<Kind>(k)));
  }

  /// One MPI_Allreduce(MAX) of (fields, -fields) gives every field's max and min.
  void verify(std::string_view call, const Signature& s) {
    constexpr int f = Signature::fields;
    const auto v = s.values();
    std::array<std::int64_t, 2 * f> m{};
    for (int i = 0; i < f; ++i) {
      m[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>(i)];
      m[static_cast<std::size_t>(f + i)] = -v[static_cast<std::size_t>(i)];
    }
    ok(MPI_Allreduce(MPI_IN_PLACE, m.data(), 2 * f, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce (checked mode)",
       call);
    for (int i = 0; i < f; ++i) {
      const std::int64_t hi = m[static_cast<std::size_t>(i)], lo = -m[static_cast<std::size_t>(f + i)];
      if (hi == lo) continue;
      const std::string range = "min " + std::to_string(lo) + ", max " + std::to_string(hi);
      switch (i) {
        case 0: mismatch(call, "ranks call different collectives: " + kind_name(lo) + " and " + kind_name(hi));
        case 1:
          mismatch(call, "ranks disagree on the dtype: " + std::string(coll::name(static_cast<DType>(lo))) + " and " +
                             std::string(coll::name(static_cast<DType>(hi))));
        case 2:
          mismatch(call, "ranks disagree on the reduction: " + std::string(coll::name(static_cast<Op>(lo))) + " and " +
                             std::string(coll::name(static_cast<Op>(hi))));
        case 3: mismatch(call, "ranks disagree on the root: " + range);
        case 4:
          mismatch(call,
                   "ranks disagree on the form of the call: some give one count for every rank, others a count per rank");
        case 5: mismatch(call, "ranks disagree on the element count: " + range);
        case 6: mismatch(call, "ranks disagree on the block counts: their totals are " + range);
        default: mismatch(call, "ranks disagree on the block counts (same total, different blocks)");
      }
    }
  }

  /// Uneven all_to_all: what p sends here must be what this rank expects from p.
  void verify_all_to_all(const Blocks& sb, const Blocks& rb, DType t) {
    constexpr std::string_view call = "all_to_all";
    Signature s{Kind::all_to_all, t};
    s.uneven = sb.is_uniform() && rb.is_uniform() ? 0 : 1;
    if (!s.uneven) s.count = static_cast<std::int64_t>(sb.count(0));
    verify(call, s);
    if (!s.uneven) return;
    verify_pairs(call, "block counts", [&](int p) { return sb.count(p); }, [&](int p) { return rb.count(p); });
  }

  /// exchange: the counts of every pair's regions, the self pair included.
  void verify_exchange(std::span<const Region> sr, std::span<const Region> rr, DType t) {
    constexpr std::string_view call = "exchange";
    verify(call, Signature{exchange_kind, t});
    verify_pairs(call, "region counts", [&](int p) { return sr[static_cast<std::size_t>(p)].count(); },
                 [&](int p) { return rr[static_cast<std::size_t>(p)].count(); });
  }

  /// One MPI_Alltoall of the per-pair counts: each rank compares what comes with what it
  /// expects, and one MPI_Allreduce tells every rank whether some rank found a mismatch.
  template <class Sent, class Expected>
  void verify_pairs(std::string_view call, std::string_view what, const Sent& sent, const Expected& expected) {
    const std::size_t n = static_cast<std::size_t>(size());
    for (std::size_t p = 0; p < n; ++p) check_buf_[p] = static_cast<std::int64_t>(sent(static_cast<int>(p)));
    ok(MPI_Alltoall(check_buf_.data(), 1, MPI_INT64_T, check_buf_.data() + n, 1, MPI_INT64_T, comm_),
       "MPI_Alltoall (checked mode)", call);
    int bad = -1;
    for (std::size_t p = 0; p < n && bad < 0; ++p)
      if (check_buf_[n + p] != static_cast<std::int64_t>(expected(static_cast<int>(p)))) bad = static_cast<int>(p);
    std::int64_t finder = bad >= 0 ? rank() : -1;
    ok(MPI_Allreduce(MPI_IN_PLACE, &finder, 1, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce (checked mode)", call);
    if (bad >= 0) {
      const auto p = static_cast<std::size_t>(bad);
      mismatch(call, "ranks disagree on the " + std::string(what) + ": this rank expects " +
                         std::to_string(expected(bad)) + " elements from rank " + std::to_string(bad) + ", which sends " +
                         std::to_string(check_buf_[n + p]));
    }
    if (finder >= 0)
      mismatch(call, "ranks disagree on the " + std::string(what) + " (rank " + std::to_string(finder) +
                         " found the mismatch)");
  }

  /// Every rank checks the whole permutation, so all reach the same verdict and message.
  void verify_permute(std::size_t send_count, int dest, std::size_t recv_count, int source, DType t) {
    constexpr std::string_view call = "permute";
    verify(call, Signature{Kind::permute, t});
    std::array<std::int64_t, 4> mine = {dest, source, static_cast<std::int64_t>(send_count),
                                        static_cast<std::int64_t>(recv_count)};
    ok(MPI_Allgather(mine.data(), 4, MPI_INT64_T, check_buf_.data(), 4, MPI_INT64_T, comm_),
       "MPI_Allgather (checked mode)", call);
    auto at = [&](std::int64_t r, int field) { return check_buf_[static_cast<std::size_t>(4 * r + field)]; };
    auto who = [](std::int64_t r) { return r < 0 ? std::string("nobody") : "rank " + std::to_string(r); };
    for (std::int64_t r = 0; r < size(); ++r) {
      if (const std::int64_t d = at(r, 0); d >= 0) {
        if (at(d, 1) != r)
          mismatch(call, "rank " + std::to_string(r) + " sends to rank " + std::to_string(d) + ", which receives from " +
                             who(at(d, 1)));
        if (at(d, 3) != at(r, 2))
          mismatch(call, "rank " + std::to_string(r) + " sends " + std::to_string(at(r, 2)) + " elements to rank " +
                             std::to_string(d) + ", which expects " + std::to_string(at(d, 3)));
      }
      if (const std::int64_t s = at(r, 1); s >= 0 && at(s, 0) != r)
        mismatch(call, "rank " + std::to_string(r) + " receives from rank " + std::to_string(s) + ", which sends to " +
                           who(at(s, 0)));
    }
  }

  /// A strided receive region of an exchange and where its elements wait in the packed scratch.
  struct ExchangeUnpack {
    Region region;
    std::size_t offset;
  };
  /// One exchange in flight: point to point with the pairs that carry data (a permute-like
  /// exchange talks to one peer, not to all), on the backend's own tag; contiguous pieces go
  /// straight from and into the caller's buffers, strided ones through packed scratch buffers
  /// (these buffers, and the request and unpack lists, are borrowed from the communicator while
  /// in flight, so that a blocking exchange allocates nothing once warm).
  class Exchange final : public PendingExchange {
   public:
    explicit Exchange(MpiCommunicator& c) : c_(c) {
      scratch_.swap(c_.scratch_);
      recv_scratch_.swap(c_.recv_scratch_);
      requests_.swap(c_.exchange_requests_);
      unpack_.swap(c_.exchange_unpack_);
      requests_.clear();
      unpack_.clear();
    }
    ~Exchange() override {
      if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
      if (c_.scratch_.size() < scratch_.size()) c_.scratch_.swap(scratch_);
      if (c_.recv_scratch_.size() < recv_scratch_.size()) c_.recv_scratch_.swap(recv_scratch_);
      if (c_.exchange_requests_.capacity() < requests_.capacity()) c_.exchange_requests_.swap(requests_);
      if (c_.exchange_unpack_.capacity() < unpack_.capacity()) c_.exchange_unpack_.swap(unpack_);
    }

    void start(const void* send, std::span<const Region> send_regions, void* recv,
               std::span<const Region> recv_regions, DType t) {
      constexpr std::string_view call = "exchange";
      const auto watching = c_.watch("exchange");  // (checked mode's all_reduce)
      if (c_.checked_) c_.verify_exchange(send_regions, recv_regions, t);
      const int me = c_.rank();
      const std::size_t n = static_cast<std::size_t>(c_.size()), es = size_of(t);
      // Counts without the self pair, which never travels; check the totals before packing.
      std::size_t send_total = 0, recv_total = 0;
      for (std::size_t p = 0; p < n; ++p)
        if (p != static_cast<std::size_t>(me)) {
          send_total += send_regions[p].count();
          recv_total += recv_regions[p].count();
        }
      c_.fit_total(call, send_total);
      c_.fit_total(call, recv_total);
      if (scratch_.size() < send_total * es) scratch_.resize(send_total * es);
      if (recv_scratch_.size() < recv_total * es) recv_scratch_.resize(recv_total * es);
      const MPI_Datatype dt = detail::mpi::datatype(t);
      auto contiguous = [](const Region& r) {
        const Region c = detail::normalise(r);
        return c.rank == 1 && c.stride[0] == 1;
      };
      recv_ = recv;
      es_ = es;
      requests_.reserve(2 * n);
      std::size_t send_off = 0, recv_off = 0;
      for (std::size_t p = 0; p < n; ++p) {
        if (p == static_cast<std::size_t>(me)) continue;
        if (const std::size_t rc = recv_regions[p].count(); rc != 0) {
          void* at = recv_scratch_.data() + recv_off * es;
          if (contiguous(recv_regions[p])) {
            at = static_cast<unsigned char*>(recv) + recv_regions[p].offset * es;
          } else {
            unpack_.push_back({recv_regions[p], recv_off});
            recv_off += rc;
          }
          post(MPI_Irecv(at, static_cast<int>(rc), dt, static_cast<int>(p), c_.permute_tag_, c_.comm_, next()), "MPI_Irecv");
        }
      }
      for (std::size_t p = 0; p < n; ++p) {
        if (p == static_cast<std::size_t>(me)) continue;
        if (const std::size_t sc = send_regions[p].count(); sc != 0) {
          const void* at;
          if (contiguous(send_regions[p])) {
            at = static_cast<const unsigned char*>(send) + send_regions[p].offset * es;
          } else {
            detail::copy_region(scratch_.data() + send_off * es, Region::contiguous(0, sc), send, send_regions[p], es);
            at = scratch_.data() + send_off * es;
            send_off += sc;
          }
          post(MPI_Isend(at, static_cast<int>(sc), dt, static_cast<int>(p), c_.permute_tag_, c_.comm_, next()), "MPI_Isend");
        }
      }
      // The self pair, checked only now so that a mismatch here leaves no other rank waiting.
      const auto own = static_cast<std::size_t>(me);
      if (send_regions[own].count() != recv_regions[own].count())
        self_error_ = "shardlib: " + c_.where(call) + ": rank " + std::to_string(me) + " sends " +
                      std::to_string(send_regions[own].count()) + " elements to itself, but expects " +
                      std::to_string(recv_regions[own].count());
      else
        detail::copy_region(recv, recv_regions[own], send, send_regions[own], es);
    }

    void wait() override {
      const auto watching = c_.watch("exchange");
      const int nreq = static_cast<int>(requests_.size());
      const int rc = MPI_Waitall(nreq, requests_.data(), MPI_STATUSES_IGNORE);
      requests_.clear();  // completed (or failed): nothing left for the destructor to wait for
      c_.ok(rc, "MPI_Waitall", "exchange");
      for (const auto& u : unpack_)
        detail::copy_region(recv_, u.region, recv_scratch_.data() + u.offset * es_, Region::contiguous(0, u.region.count()), es_);
      if (!self_error_.empty()) throw CollectiveError(self_error_);
    }

   private:
    MPI_Request* next() {
      requests_.push_back(MPI_REQUEST_NULL);
      return &requests_.back();
    }
    void post(int rc, const char* fn) {
      if (rc != MPI_SUCCESS) requests_.pop_back();
      c_.ok(rc, fn, "exchange");
    }
    MpiCommunicator& c_;
    std::vector<unsigned char> scratch_, recv_scratch_;
    std::vector<MPI_Request> requests_;
    std::vector<ExchangeUnpack> unpack_;
    void* recv_ = nullptr;
    std::size_t es_ = 0;
    std::string self_error_;
  };

  /// A buffered send in flight: its copy of the message and its requests (one per piece).
  struct PendingSend {
    std::vector<unsigned char> data;
    std::vector<MPI_Request> requests;
  };
  std::vector<PendingSend> pending_sends_;
  /// Frees the sends that completed (all of them, waiting, when `wait`).
  void reap_sends(bool wait) {
    std::erase_if(pending_sends_, [&](PendingSend& ps) {
      int done = 0;
      if (wait)
        MPI_Waitall(static_cast<int>(ps.requests.size()), ps.requests.data(), MPI_STATUSES_IGNORE), done = 1;
      else
        MPI_Testall(static_cast<int>(ps.requests.size()), ps.requests.data(), &done, MPI_STATUSES_IGNORE);
      return done != 0;
    });
  }
  std::vector<MPI_Request> exchange_requests_;   // lent to the exchange in flight
  std::vector<ExchangeUnpack> exchange_unpack_;  // ...
  MPI_Comm comm_;
  MPI_Errhandler previous_ = MPI_ERRHANDLER_NULL;  // put back at the end when !owns_
  bool owns_;
  bool checked_;
  int permute_tag_ = 32767;  // MPI_TAG_UB of the communicator (32767 is the least MPI allows)
  // Per-rank int counts and displacements of the v-forms, allocated once.
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  // Grown as needed, never shrunk: all_gather's in-place staging and exchange's packed send;
  // exchange's packed receive.
  std::vector<unsigned char> scratch_, recv_scratch_;
  std::vector<std::int64_t> check_buf_;  // checked mode: 4 per rank
};

}  // namespace shardlib::coll

#endif  // SHARDLIB_HAVE_MPI
