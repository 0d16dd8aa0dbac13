// SPDX-License-Identifier: Apache-2.0
/// @file
/// Reductions along a dim (`sum`, `mean`, `max`, `min`, `argmax`, keepdim or not) and the
/// normalisations along a dim (`softmax`, `log_softmax`, `layer_norm`, `rms_norm`).
///
/// Rules: sharding/reduce.hpp. Reducing a dim split over mesh axes leaves a partial result over
/// them (each device reduces its block; nothing moves until the partial tensor is resharded, so a
/// sum followed by a reshard to sharded is one reduce_scatter). `mean` divides by the global
/// extent, uneven blocks included. `argmax` answers global indices, with two small all_reduces
/// over the dim's axes (the maximum, then the first index that holds it). The normalisations keep
/// the input's spec and communicate only when their dim is split: per-row statistics are
/// all-reduced over the dim's axes (softmax: the row max, then the sum of exponentials; the norms:
/// one all_reduce of the row sums in double).
///
/// In shape-only mode (detail/shape_only.hpp) the kernels do nothing; the statistics' and
/// argmax's collectives are counted as always.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/reduce.hpp>
#include <shardlib/kernels/rows.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/ops/elementwise.hpp>
#include <shardlib/sharding/reduce.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {
namespace detail {

/// The block as [outer, n, inner] around dim `d`.
struct RowSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline RowSplit split_at(const ShardBox& b, int d) {
  RowSplit r;
  for (int i = 0; i < b.rank; ++i) {
    const auto e = b.extent[static_cast<std::size_t>(i)];
    if (i < d) r.outer *= e;
    else if (i == d) r.n = e;
    else r.inner *= e;
  }
  return r;
}

/// The shape of a reduction's output: `shape` without dim `d` (or with extent 1 there).
template <std::size_t RO, std::size_t RI>
std::array<std::int64_t, RO> reduced_shape(const std::array<std::int64_t, RI>& shape, int d, bool keepdim) {
  std::array<std::int64_t, RO> out{};
  std::size_t k = 0;
  for (std::size_t i = 0; i < RI && k != RO; ++i) {  // != RO: nvcc warns of k < 0 for RO = 0
    if (static_cast<int>(i) == d) {
      if (keepdim) out[k++] = 1;
    } else {
      out[k++] = shape[i];
    }
  }
  return out;
}

/// The runtime part of a reduction along `dim`, compiled once per kind, element type and memory
/// space: the operand in the rule's layout, one kernel into the output block `out` (`out_box`)
/// on the device's instance for `Mem`, and argmax's two all_reduces over the dim's axes (in GPU
/// memory through host memory).
template <Reduction Kind, class T, class U, class Mem>
SHARDLIB_NOINLINE void reduce_run(const OpRule& rule, int dim, const OperandRef<T>& a, U* out, const ShardBox& out_box) {
  const Block<T> in = block_as<Mem>(a, rule.in[0]);
  Context& ctx = *a.ctx;
  const RowSplit r = split_at(in.box, dim);
  if constexpr (Kind == Reduction::argmax) {
    const auto rows = static_cast<std::size_t>(r.outer * r.inner);
    // The group along the dim's axes (a world-wide split: every device asks, even with no rows;
    // within the group all devices have the same rows).
    coll::Communicator* g = rule.comm.empty() ? nullptr : &ctx.group(*a.mesh, rule.comm);
    // Each device's first maximum of its block, then (split dim) the global maximum and the first
    // index holding it, on the host: in device memory the per-row answers go through host memory
    // (a few values per row; argmax is not on a training step's path).
    std::vector<T> best(rows);
    std::vector<std::int64_t> host_idx;
    std::int64_t* idx = out;
    {
      auto guard = kernel_guard(ctx, false);
      const std::int64_t at = in.box.offset[static_cast<std::size_t>(dim)];
      if constexpr (host_memory_v<Mem>) {
        kernels::argmax_dim(ctx.exec(), in.data, best.data(), out, r.outer, r.n, r.inner, at);
      } else {
        const std::shared_ptr<void> dev_best = block_cache<Mem>(ctx).allocate(rows * sizeof(T));
        kernels::argmax_dim(ctx.exec_for<Mem>(), in.data, static_cast<T*>(dev_best.get()), out, r.outer, r.n, r.inner, at);
        if (g && rows > 0) {
          host_idx.resize(rows);
          idx = host_idx.data();
          download<Mem>(ctx, static_cast<const T*>(dev_best.get()), best.data(), static_cast<std::int64_t>(rows));
          download<Mem>(ctx, static_cast<const std::int64_t*>(out), idx, static_cast<std::int64_t>(rows));
        }
      }
    }
    if (g && rows > 0) {
      if constexpr (std::is_floating_point_v<T>)  // a NaN counts as +inf across devices
        for (auto& v : best)
          if (v != v) v = std::numeric_limits<T>::infinity();
      std::vector<T> top(rows);
      g->all_reduce(best.data(), top.data(), rows, coll::dtype_of<T>(), coll::Op::max);
      if (!shardlib::shape_only())  // (idx may be the output block: shape-only, no memory)
        for (std::size_t i = 0; i < rows; ++i)
          if (!(best[i] == top[i]) || idx[i] < 0) idx[i] = std::numeric_limits<std::int64_t>::max();
      g->all_reduce(idx, idx, rows, coll::dtype_of<std::int64_t>(), coll::Op::min);
      if constexpr (!host_memory_v<Mem>) upload<Mem>(ctx, static_cast<const std::int64_t*>(idx), out, static_cast<std::int64_t>(rows));
    }
  } else {
    constexpr kernels::ReduceKind k = Kind == Reduction::max   ? kernels::ReduceKind::max
                                      : Kind == Reduction::min ? kernels::ReduceKind::min
                                                               : kernels::ReduceKind::sum;
    auto guard = kernel_guard(ctx, false);
    const auto& exec = ctx.exec_for<Mem>();
    kernels::reduce_dim(exec, in.data, out, r.outer, r.n, r.inner, k);
    if constexpr (Kind == Reduction::mean) {
      const std::int64_t extent = a.shape[static_cast<std::size_t>(dim)];
      kernels::scale(exec, out, out_box.num_elements(), static_cast<T>(T(1) / static_cast<T>(extent)));
    }
  }
}

template <OpName Name, Reduction Kind, int Dim, bool KeepDim, class A>
auto reduce_op(const A& a) {
  if constexpr (is_half_v<typename A::value_type>) {  // in float32, the result rounded once
    auto r = reduce_op<Name, Kind, Dim, KeepDim>(shardlib::cast<float>(a));
    if constexpr (Kind == Reduction::argmax) return r;
    else return shardlib::cast<typename A::value_type>(r);
  } else {
    static constexpr OpRule rule = reduce_rule(Kind, A::sharding, Dim, KeepDim);
    SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for this reduction (is the dim in range?)",
                            error::op_has_no_sharding_rule_for_these_specs<Name, rule.status, typename A::spec_type>);
    using T = typename A::value_type;
    using MeshT = typename A::mesh_type;
    static_assert(Kind != Reduction::mean || std::is_floating_point_v<T>,
                  "shardlib: mean needs a floating-point element type (as torch.mean)");
    using U = std::conditional_t<Kind == Reduction::argmax, std::int64_t, T>;
    using Mem = typename A::memory_space;
    using Out = DistributedTensor<U, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, Mem>;
    Out out(a.mesh(), reduced_shape<Out::rank>(a.shape(), Dim, KeepDim));
    reduce_run<Kind, T, U, Mem>(rule, Dim, ref(a), out.local().data(), out.block());
    return out;
  }
}

enum class Normalization : std::uint8_t { softmax, log_softmax, layer_norm, rms_norm };

/// Per-row statistics `p` (`count` values in `Mem`) all-reduced with `op` over the group of the
/// dim's `axes`: on that group where its communicator reaches `Mem` (host memory; device memory
/// under nccl, on the device's stream), else through a host copy (threads and mpi with device
/// memory: downloaded, reduced, uploaded).
template <class Mem, class S>
void all_reduce_stats(Context& ctx, const MeshShape& mesh, const AxisList& axes, S* p, std::size_t count, coll::Op op) {
  if constexpr (host_memory_v<Mem>) {
    ctx.group(mesh, axes).all_reduce(p, p, count, coll::dtype_of<S>(), op);
  } else if (reshards_on_device<Mem>(ctx)) {
    ctx.device_group(mesh, axes).all_reduce(p, p, count, coll::dtype_of<S>(), op);
  } else {
    std::vector<S> h(count);
    download<Mem>(ctx, p, h.data(), static_cast<std::int64_t>(count));
    ctx.group(mesh, axes).all_reduce(h.data(), h.data(), count, coll::dtype_of<S>(), op);
    upload<Mem>(ctx, h.data(), p, static_cast<std::int64_t>(count));
  }
}

/// The runtime part of a normalisation along `dim`, compiled once per kind, element type and
/// memory space: per-row statistics (all-reduced over the dim's axes when it is split), then the
/// kernel that writes the output block `out`, on the device's instance for `Mem` (host memory:
/// whole contiguous rows take the fused row kernels of kernels/rows.hpp; device memory: whole
/// contiguous rows in one launch (a group of threads per row: kernels/row_groups.hpp), other blocks the stats and apply kernels, one
/// GPU thread per row or element, the statistics kept in device memory). `causal` > 0: softmax's
/// causal mask over [..., causal, n] rows (attention's unfused form, whole contiguous rows only:
/// kernels::softmax_rows' on the host, kernels::detail::portable::rows_fused's in GPU memory).
template <Normalization Kind, class T, class Mem>
SHARDLIB_NOINLINE void normalize_run(const OpRule& rule, int dim, double eps, double scale, const OperandRef<T>& a,
                                     T* out, std::int64_t causal = 0) {
  Block<T> in = block_as<Mem>(a, rule.in[0]);
  Context& ctx = *a.ctx;
  const RowSplit r = split_at(in.box, dim);
  const auto rows = static_cast<std::size_t>(r.outer * r.inner);
  const bool split = !rule.comm.empty();
  if (causal != 0 && (split || r.inner != 1 || (host_memory_v<Mem> && !kernels::vmath::is_vector_type_v<T>)))
    throw std::logic_error("shardlib: internal error: a causal softmax needs whole contiguous rows (float or double "
                           "on the host)");
  const std::int64_t count = a.shape[static_cast<std::size_t>(dim)];
  if constexpr (host_memory_v<Mem> && kernels::vmath::is_vector_type_v<T>) {
    if (!split && r.inner == 1) {  // whole rows on this device, contiguous: one fused pass
      auto guard = kernel_guard(ctx, false);
      const std::int64_t rows = r.outer;
      if constexpr (Kind == Normalization::softmax || Kind == Normalization::log_softmax)
        kernels::softmax_rows(ctx.exec(), in.data, out, rows, r.n, Kind == Normalization::log_softmax,
                              static_cast<T>(scale), causal);
      else if constexpr (Kind == Normalization::layer_norm)
        kernels::layer_norm_rows(ctx.exec(), in.data, out, rows, r.n, eps);
      else
        kernels::rms_norm_rows(ctx.exec(), in.data, out, rows, r.n, eps);
      return;
    }
  }
  const auto& exec = ctx.exec_for<Mem>();
  if constexpr (!host_memory_v<Mem>) {
    if (!split && r.inner == 1) {  // whole contiguous rows: row groups, one launch
      constexpr auto op = Kind == Normalization::softmax       ? kernels::detail::portable::RowOp::softmax
                          : Kind == Normalization::log_softmax ? kernels::detail::portable::RowOp::log_softmax
                          : Kind == Normalization::layer_norm  ? kernels::detail::portable::RowOp::layer_norm
                                                               : kernels::detail::portable::RowOp::rms_norm;
      auto guard = kernel_guard(ctx, false);
      kernels::detail::portable::rows_fused(exec, op, in.data, out, r.outer, r.n, static_cast<T>(scale), eps, {}, causal);
      return;
    }
  }
  auto reduce_stats = [&](auto* p, std::size_t n, coll::Op op) {
    if (split) all_reduce_stats<Mem>(ctx, *a.mesh, rule.comm, p, n, op);
  };
  if constexpr (Kind == Normalization::softmax || Kind == Normalization::log_softmax) {
    if (scale != 1) {  // the stats kernels take the input as it is: scale a copy of the block first
      auto scaled = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(in.box.num_elements(), 1)) * sizeof(T));
      T* dst = static_cast<T*>(scaled.get());
      auto guard = kernel_guard(ctx, false);
      kernels::elementwise(exec, dst, std::array<std::int64_t, 1>{in.box.num_elements()},
                           fn::bind_scalar<fn::mul, T, false>{{}, static_cast<T>(scale)},
                           kernels::Strided<T, 1>{in.data, {1}});
      in.data = dst;
      in.keep = std::move(scaled);
    }
    auto stats = block_cache<Mem>(ctx).allocate(std::max<std::size_t>(2 * rows, 1) * sizeof(T));  // [max | sum]
    T* mx = static_cast<T*>(stats.get());
    T* sum = mx + rows;
    {
      auto guard = kernel_guard(ctx, false);
      kernels::reduce_dim(exec, in.data, mx, r.outer, r.n, r.inner, kernels::ReduceKind::max);
    }
    reduce_stats(mx, rows, coll::Op::max);
    {
      auto guard = kernel_guard(ctx, false);
      kernels::exp_sum(exec, in.data, mx, sum, r.outer, r.n, r.inner);
    }
    reduce_stats(sum, rows, coll::Op::sum);
    auto guard = kernel_guard(ctx, false);
    kernels::softmax_apply(exec, in.data, out, mx, sum, r.outer, r.n, r.inner, Kind == Normalization::log_softmax);
  } else {
    using Acc = kernels::acc_t<T>;
    constexpr bool layer = Kind == Normalization::layer_norm;
    const std::size_t n_stats = layer ? 2 * rows : rows;  // [sum | sumsq] or [sumsq]
    auto stats = block_cache<Mem>(ctx).allocate(std::max<std::size_t>(n_stats, 1) * sizeof(Acc));
    Acc* sum = layer ? static_cast<Acc*>(stats.get()) : nullptr;
    Acc* sumsq = layer ? sum + rows : static_cast<Acc*>(stats.get());
    {
      auto guard = kernel_guard(ctx, false);
      kernels::moments(exec, in.data, sum, sumsq, r.outer, r.n, r.inner);
    }
    reduce_stats(static_cast<Acc*>(stats.get()), n_stats, coll::Op::sum);
    auto guard = kernel_guard(ctx, false);
    if constexpr (layer)
      kernels::layer_norm_apply(exec, in.data, out, sum, sumsq, r.outer, r.n, r.inner, count, eps);
    else
      kernels::rms_norm_apply(exec, in.data, out, sumsq, r.outer, r.n, r.inner, count, eps);
  }
}

template <OpName Name, Normalization Kind, int Dim, class A>
auto normalize_op(const A& a, double eps, double scale = 1, std::int64_t causal = 0) {
  if constexpr (is_half_v<typename A::value_type>) {  // in float32, the result rounded once
    return shardlib::cast<typename A::value_type>(normalize_op<Name, Kind, Dim>(shardlib::cast<float>(a), eps, scale, causal));
  } else {
    if (!std::isfinite(scale))
      throw std::invalid_argument(std::string("shardlib: ") + Name.text + ": scale must be finite, got " + std::to_string(scale) +
                                  " (operand " + operand_text(info(a)) + ")");
    static constexpr OpRule rule = normalize_rule(A::sharding, Dim);
    SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for this normalisation (is the dim in range?)",
                            error::op_has_no_sharding_rule_for_these_specs<Name, rule.status, typename A::spec_type>);
    using T = typename A::value_type;
    static_assert(std::is_floating_point_v<T>, "shardlib: softmax and the norms need a floating-point element type");
    using MeshT = typename A::mesh_type;
    using Mem = typename A::memory_space;
    using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, Mem>;
    Out out(a.mesh(), a.shape());
    normalize_run<Kind, T, Mem>(rule, Dim, eps, scale, ref(a), out.local().data(), causal);
    return out;
  }
}

}  // namespace detail

/// Sum along dim `Dim` (dropped, or kept with extent 1). A split dim gives a partial-sum result.
template <int Dim, bool KeepDim = false, TensorType A>
auto sum(const A& a) {
  return detail::reduce_op<"sum", Reduction::sum, Dim, KeepDim>(a);
}
/// Mean along `Dim`: the sum divided by the dim's global extent (partial-sum when the dim is split).
template <int Dim, bool KeepDim = false, TensorType A>
auto mean(const A& a) {
  return detail::reduce_op<"mean", Reduction::mean, Dim, KeepDim>(a);
}
/// Maximum along `Dim` (partial-max when the dim is split).
template <int Dim, bool KeepDim = false, TensorType A>
auto max(const A& a) {
  return detail::reduce_op<"max", Reduction::max, Dim, KeepDim>(a);
}
/// Minimum along `Dim` (partial-min when the dim is split).
template <int Dim, bool KeepDim = false, TensorType A>
auto min(const A& a) {
  return detail::reduce_op<"min", Reduction::min, Dim, KeepDim>(a);
}
/// Global index (int64) of the first maximum along `Dim`; never partial. A NaN is the maximum
/// within a block; across the devices of a split dim it counts as +inf.
template <int Dim, bool KeepDim = false, TensorType A>
auto argmax(const A& a) {
  return detail::reduce_op<"argmax", Reduction::argmax, Dim, KeepDim>(a);
}
/// softmax along `Dim` (the input's spec; communicates only when `Dim` is split). With `scale`,
/// softmax(scale * a) in the same pass (attention's 1 / sqrt(head dim) without a pass of its own).
template <int Dim, TensorType A>
auto softmax(const A& a, double scale = 1) {
  return detail::normalize_op<"softmax", detail::Normalization::softmax, Dim>(a, 0.0, scale);
}
/// log(softmax) along `Dim`, computed as x - max - log(sum exp(x - max)); with `scale`, of scale * a.
template <int Dim, TensorType A>
auto log_softmax(const A& a, double scale = 1) {
  return detail::normalize_op<"log_softmax", detail::Normalization::log_softmax, Dim>(a, 0.0, scale);
}
/// (x - mean) / sqrt(var + eps) along `Dim` (for torch's weight and bias along the last dim, the
/// overload below with `gain` and `bias`).
template <int Dim, TensorType A>
auto layer_norm(const A& a, double eps = 1e-5) {
  return detail::normalize_op<"layer_norm", detail::Normalization::layer_norm, Dim>(a, eps);
}
namespace detail {
constexpr bool is_replicated(const Sharding& s) noexcept {
  for (int d = 0; d < s.rank; ++d)
    if (!s.dims[static_cast<std::size_t>(d)].empty()) return false;
  return !s.is_partial();
}
}  // namespace detail

/// layer_norm along the last dim with torch's weight and bias: `layer_norm<Dim>(a, eps) * gain +
/// bias`, gain and bias 1-D of the dim's extent, with that expression's sharding and result. Where
/// the dim is whole on each device, gain and bias are replicated and the block is in host memory,
/// it is one pass (kernels::layer_norm_rows); elsewhere (GPU memory too) it runs as the three ops.
template <int Dim, TensorType A, TensorType G, TensorType B>
auto layer_norm(const A& a, const G& gain, const B& bias, double eps = 1e-5) {
  static_assert(Dim == -1 || Dim == static_cast<int>(A::rank) - 1,
                "shardlib: layer_norm with a gain and a bias normalises the last dim (as torch.nn.functional.layer_norm)");
  static_assert(G::rank == 1 && B::rank == 1, "shardlib: layer_norm's gain and bias are 1-D (the last dim's extent)");
  constexpr int D = static_cast<int>(A::rank) - 1;
  using Out = decltype(layer_norm<D>(a, eps) * gain + bias);
  using T = typename A::value_type;
  constexpr bool fusable = detail::host_memory_v<typename A::memory_space> && kernels::vmath::is_vector_type_v<T> &&
                           std::is_same_v<typename G::value_type, T> && std::is_same_v<typename B::value_type, T> &&
                           Out::sharding == A::sharding && A::sharding.dims[static_cast<std::size_t>(D)].empty() &&
                           !A::sharding.is_partial() && detail::is_replicated(G::sharding) &&
                           detail::is_replicated(B::sharding);
  if constexpr (fusable) {
    const std::int64_t n = a.shape()[static_cast<std::size_t>(D)];
    if (gain.shape()[0] == n && bias.shape()[0] == n) {
      detail::check_same_mesh("layer_norm", a, gain);
      detail::check_same_mesh("layer_norm", a, bias);
      Out out(a.mesh(), a.shape());
      Context& ctx = a.context();
      auto guard = detail::kernel_guard(ctx, false);
      const std::int64_t total = out.block().num_elements();
      kernels::layer_norm_rows(ctx.exec(), a.local().data(), out.local().data(), n == 0 ? 0 : total / n, n, eps,
                               gain.local().data(), bias.local().data());
      return out;
    }
  }
  return layer_norm<D>(a, eps) * gain + bias;  // other layouts, and shapes that do not match (its error)
}

/// x / sqrt(mean(x^2) + eps) along `Dim`.
template <int Dim, TensorType A>
auto rms_norm(const A& a, double eps = 1e-6) {
  return detail::normalize_op<"rms_norm", detail::Normalization::rms_norm, Dim>(a, eps);
}

}  // namespace shardlib
