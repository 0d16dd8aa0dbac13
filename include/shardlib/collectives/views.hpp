// SPDX-License-Identifier: Apache-2.0
/// @file
/// The collectives on Kokkos views: `shardlib::coll::all_reduce(comm, send, recv, Op::sum)`.
///
/// Buffers are rank-1, contiguous views whose element type has a DType (arithmetic types, and
/// Kokkos' half_t / bhalf_t where the Kokkos in use has them as 16-bit types). Their memory
/// space must be one the backend reaches: host-accessible for `threads` and `mpi`. Extents are
/// checked against the call (and against `counts` for uneven blocks) before anything moves;
/// an error names the call, the group, the views' labels and their extents.
#pragma once

#include <shardlib/collectives/communicator.hpp>

#include <Kokkos_Core.hpp>

#include <numeric>
#include <span>
#include <string>
#include <type_traits>

namespace shardlib::coll {

namespace detail {
template <class T>
constexpr DType view_dtype() noexcept {
  using U = std::remove_cv_t<T>;
#if defined(KOKKOS_HALF_T_IS_FLOAT) && !KOKKOS_HALF_T_IS_FLOAT
  if constexpr (std::is_same_v<U, Kokkos::Experimental::half_t>) return DType::f16;
  else
#endif
#if defined(KOKKOS_BHALF_T_IS_FLOAT) && !KOKKOS_BHALF_T_IS_FLOAT
  if constexpr (std::is_same_v<U, Kokkos::Experimental::bhalf_t>) return DType::bf16;
  else
#endif
    return dtype_of<U>();
}

template <class V>
void check_view(const Communicator& c, const V& v, const char* call, const char* which) {
  static_assert(Kokkos::is_view<V>::value, "shardlib::coll: collective buffers are Kokkos views");
  static_assert(V::rank == 1, "shardlib::coll: collectives take rank-1 views (view a shard's contiguous span)");
  if (!v.span_is_contiguous())
    throw CollectiveError(std::string("shardlib: ") + call + " on " + c.name() + ": " + which + " view '" + v.label() +
                          "' is not contiguous");
  if (!c.accepts_device_memory() &&
      !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible)
    throw CollectiveError(std::string("shardlib: ") + call + " on " + c.name() + ": " + which + " view '" + v.label() +
                          "' lives in " + V::memory_space::name() + ", which the " + std::string(c.backend()) +
                          " backend cannot reach; use a host-accessible view");
}

template <class S, class R>
constexpr void check_same_type() {
  static_assert(std::is_same_v<std::remove_cv_t<typename S::value_type>, std::remove_cv_t<typename R::value_type>>,
                "shardlib::coll: send and receive views must have the same element type");
}

template <class V>
std::string describe(const V& v) {
  return "'" + v.label() + "' (" + std::to_string(v.extent(0)) + " elements)";
}

[[noreturn]] inline void bad_extent(const Communicator& c, const char* call, const std::string& detail) {
  throw CollectiveError(std::string("shardlib: ") + call + " on " + c.name() + " (rank " + std::to_string(c.rank()) +
                        " of " + std::to_string(c.size()) + "): " + detail);
}

inline std::size_t sum(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}
}  // namespace detail

/// recv (size() × n) = every rank's send (n), in rank order.
template <class S, class R>
void all_gather(Communicator& c, const S& send, const R& recv) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "all_gather", "send");
  detail::check_view(c, recv, "all_gather", "receive");
  if (recv.extent(0) != send.extent(0) * static_cast<std::size_t>(c.size()))
    detail::bad_extent(c, "all_gather", "receive view " + detail::describe(recv) + " must hold " + std::to_string(c.size()) +
                                            " × send view " + detail::describe(send));
  c.all_gather(send.data(), recv.data(), send.extent(0), detail::view_dtype<typename S::value_type>());
}
/// Uneven: rank r contributes counts[r] elements.
template <class S, class R>
void all_gather(Communicator& c, const S& send, const R& recv, std::span<const std::size_t> counts) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "all_gather", "send");
  detail::check_view(c, recv, "all_gather", "receive");
  if (counts.size() == static_cast<std::size_t>(c.size()) &&
      (send.extent(0) != counts[static_cast<std::size_t>(c.rank())] || recv.extent(0) != detail::sum(counts)))
    detail::bad_extent(c, "all_gather", "send view " + detail::describe(send) + " and receive view " + detail::describe(recv) +
                                            " do not match the block counts (this rank's " +
                                            std::to_string(counts[static_cast<std::size_t>(c.rank())]) + ", total " +
                                            std::to_string(detail::sum(counts)) + ")");
  c.all_gather(send.data(), recv.data(), counts, detail::view_dtype<typename S::value_type>());
}

/// recv (n) = block rank() of the reduction of every rank's send (size() × n).
template <class S, class R>
void reduce_scatter(Communicator& c, const S& send, const R& recv, Op op) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "reduce_scatter", "send");
  detail::check_view(c, recv, "reduce_scatter", "receive");
  if (send.extent(0) != recv.extent(0) * static_cast<std::size_t>(c.size()))
    detail::bad_extent(c, "reduce_scatter", "send view " + detail::describe(send) + " must hold " + std::to_string(c.size()) +
                                                " × receive view " + detail::describe(recv));
  c.reduce_scatter(send.data(), recv.data(), recv.extent(0), detail::view_dtype<typename S::value_type>(), op);
}
/// Uneven: block r has counts[r] elements.
template <class S, class R>
void reduce_scatter(Communicator& c, const S& send, const R& recv, std::span<const std::size_t> counts, Op op) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "reduce_scatter", "send");
  detail::check_view(c, recv, "reduce_scatter", "receive");
  if (counts.size() == static_cast<std::size_t>(c.size()) &&
      (recv.extent(0) != counts[static_cast<std::size_t>(c.rank())] || send.extent(0) != detail::sum(counts)))
    detail::bad_extent(c, "reduce_scatter", "send view " + detail::describe(send) + " and receive view " +
                                                detail::describe(recv) + " do not match the block counts");
  c.reduce_scatter(send.data(), recv.data(), counts, detail::view_dtype<typename S::value_type>(), op);
}

/// recv = the reduction of every rank's send (same extent).
template <class S, class R>
void all_reduce(Communicator& c, const S& send, const R& recv, Op op) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "all_reduce", "send");
  detail::check_view(c, recv, "all_reduce", "receive");
  if (send.extent(0) != recv.extent(0))
    detail::bad_extent(c, "all_reduce", "send view " + detail::describe(send) + " and receive view " +
                                            detail::describe(recv) + " differ in size");
  c.all_reduce(send.data(), recv.data(), send.extent(0), detail::view_dtype<typename S::value_type>(), op);
}
/// In place.
template <class V>
void all_reduce(Communicator& c, const V& buf, Op op) {
  detail::check_view(c, buf, "all_reduce", "the");
  c.all_reduce(buf.data(), buf.data(), buf.extent(0), detail::view_dtype<typename V::value_type>(), op);
}

/// Block p of send goes to rank p (equal blocks: extent / size()).
template <class S, class R>
void all_to_all(Communicator& c, const S& send, const R& recv) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "all_to_all", "send");
  detail::check_view(c, recv, "all_to_all", "receive");
  const auto n = static_cast<std::size_t>(c.size());
  if (send.extent(0) != recv.extent(0) || send.extent(0) % n != 0)
    detail::bad_extent(c, "all_to_all", "send view " + detail::describe(send) + " and receive view " + detail::describe(recv) +
                                            " must have equal sizes divisible by the group size " + std::to_string(n));
  c.all_to_all(send.data(), recv.data(), send.extent(0) / n, detail::view_dtype<typename S::value_type>());
}
/// Uneven: send_counts[p] elements to rank p, recv_counts[p] from rank p.
template <class S, class R>
void all_to_all(Communicator& c, const S& send, std::span<const std::size_t> send_counts, const R& recv,
                std::span<const std::size_t> recv_counts) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "all_to_all", "send");
  detail::check_view(c, recv, "all_to_all", "receive");
  if (send.extent(0) != detail::sum(send_counts) || recv.extent(0) != detail::sum(recv_counts))
    detail::bad_extent(c, "all_to_all", "send view " + detail::describe(send) + " and receive view " + detail::describe(recv) +
                                            " do not match the counts (" + std::to_string(detail::sum(send_counts)) +
                                            " to send, " + std::to_string(detail::sum(recv_counts)) + " to receive)");
  c.all_to_all(send.data(), send_counts, recv.data(), recv_counts, detail::view_dtype<typename S::value_type>());
}

/// Every rank's buf = root's.
template <class V>
void broadcast(Communicator& c, const V& buf, int root) {
  detail::check_view(c, buf, "broadcast", "the");
  c.broadcast(buf.data(), buf.extent(0), detail::view_dtype<typename V::value_type>(), root);
}

template <class V>
void send(Communicator& c, const V& buf, int peer, int tag = 0) {
  detail::check_view(c, buf, "send", "the");
  c.send(buf.data(), buf.extent(0), detail::view_dtype<typename V::value_type>(), peer, tag);
}
template <class V>
void recv(Communicator& c, const V& buf, int peer, int tag = 0) {
  detail::check_view(c, buf, "recv", "the");
  c.recv(buf.data(), buf.extent(0), detail::view_dtype<typename V::value_type>(), peer, tag);
}

/// send goes to rank dest while recv arrives from rank source (-1: none).
template <class S, class R>
void permute(Communicator& c, const S& send, int dest, const R& recv, int source) {
  detail::check_same_type<S, R>();
  detail::check_view(c, send, "permute", "send");
  detail::check_view(c, recv, "permute", "receive");
  c.permute(send.data(), send.extent(0), dest, recv.data(), recv.extent(0), source,
            detail::view_dtype<typename S::value_type>());
}

}  // namespace shardlib::coll
