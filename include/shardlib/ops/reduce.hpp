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
#pragma once

#include <shardlib/kernels/reduce.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/sharding/reduce.hpp>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
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
  for (std::size_t i = 0; i < RI && k < RO; ++i) {
    if (static_cast<int>(i) == d) {
      if (keepdim) out[k++] = 1;
    } else {
      out[k++] = shape[i];
    }
  }
  return out;
}

/// The runtime part of a reduction along `dim`, compiled once per kind, element type and memory
/// space: the operand in the rule's layout, one kernel into the output block `out` (`out_box`),
/// and argmax's two all_reduces over the dim's axes.
template <Reduction Kind, class T, class U, class Mem>
SHARDLIB_NOINLINE void reduce_run(const OpRule& rule, int dim, const OperandRef<T>& a, U* out, const ShardBox& out_box) {
  const Block<T> in = block_as<Mem>(a, rule.in[0]);
  Context& ctx = *a.ctx;
  const RowSplit r = split_at(in.box, dim);
  if constexpr (Kind == Reduction::argmax) {
    const auto rows = static_cast<std::size_t>(r.outer * r.inner);
    std::vector<T> best(rows);
    {
      auto guard = kernel_guard(ctx, false);
      kernels::argmax_dim(ctx.exec(), in.data, best.data(), out, r.outer, r.n, r.inner,
                          in.box.offset[static_cast<std::size_t>(dim)]);
    }
    // The group along the dim's axes (a world-wide split: every device asks, even with no rows;
    // within the group all devices have the same rows).
    coll::Communicator* g = rule.comm.empty() ? nullptr : &ctx.group(*a.mesh, rule.comm);
    if (g && rows > 0) {  // the global maximum, then the first index holding it
      if constexpr (std::is_floating_point_v<T>)  // a NaN counts as +inf across devices
        for (auto& v : best)
          if (v != v) v = std::numeric_limits<T>::infinity();
      std::vector<T> top(rows);
      g->all_reduce(best.data(), top.data(), rows, coll::dtype_of<T>(), coll::Op::max);
      std::int64_t* idx = out;
      for (std::size_t i = 0; i < rows; ++i)
        if (!(best[i] == top[i]) || idx[i] < 0) idx[i] = std::numeric_limits<std::int64_t>::max();
      g->all_reduce(idx, idx, rows, coll::dtype_of<std::int64_t>(), coll::Op::min);
    }
  } else {
    constexpr kernels::ReduceKind k = Kind == Reduction::max   ? kernels::ReduceKind::max
                                      : Kind == Reduction::min ? kernels::ReduceKind::min
                                                               : kernels::ReduceKind::sum;
    auto guard = kernel_guard(ctx, false);
    kernels::reduce_dim(ctx.exec(), in.data, out, r.outer, r.n, r.inner, k);
    if constexpr (Kind == Reduction::mean) {
      const std::int64_t extent = a.shape[static_cast<std::size_t>(dim)];
      kernels::scale(ctx.exec(), out, out_box.num_elements(), static_cast<T>(T(1) / static_cast<T>(extent)));
    }
  }
}

template <OpName Name, Reduction Kind, int Dim, bool KeepDim, class A>
auto reduce_op(const A& a) {
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

enum class Normalization : std::uint8_t { softmax, log_softmax, layer_norm, rms_norm };

/// The runtime part of a normalisation along `dim`, compiled once per kind, element type and
/// memory space: per-row statistics (all-reduced over the dim's axes when it is split), then the
/// kernel that writes the output block `out`.
template <Normalization Kind, class T, class Mem>
SHARDLIB_NOINLINE void normalize_run(const OpRule& rule, int dim, double eps, const OperandRef<T>& a, T* out) {
  const Block<T> in = block_as<Mem>(a, rule.in[0]);
  Context& ctx = *a.ctx;
  const RowSplit r = split_at(in.box, dim);
  const auto rows = static_cast<std::size_t>(r.outer * r.inner);
  coll::Communicator* g = rule.comm.empty() ? nullptr : &ctx.group(*a.mesh, rule.comm);
  const std::int64_t count = a.shape[static_cast<std::size_t>(dim)];
  if constexpr (Kind == Normalization::softmax || Kind == Normalization::log_softmax) {
    std::vector<T> mx(rows), sum(rows);
    {
      auto guard = kernel_guard(ctx, false);
      kernels::reduce_dim(ctx.exec(), in.data, mx.data(), r.outer, r.n, r.inner, kernels::ReduceKind::max);
    }
    if (g) g->all_reduce(mx.data(), mx.data(), rows, coll::dtype_of<T>(), coll::Op::max);
    {
      auto guard = kernel_guard(ctx, false);
      kernels::exp_sum(ctx.exec(), in.data, mx.data(), sum.data(), r.outer, r.n, r.inner);
    }
    if (g) g->all_reduce(sum.data(), sum.data(), rows, coll::dtype_of<T>(), coll::Op::sum);
    auto guard = kernel_guard(ctx, false);
    kernels::softmax_apply(ctx.exec(), in.data, out, mx.data(), sum.data(), r.outer, r.n, r.inner,
                           Kind == Normalization::log_softmax);
  } else {
    using Acc = kernels::acc_t<T>;
    constexpr bool layer = Kind == Normalization::layer_norm;
    std::vector<Acc> stats(layer ? 2 * rows : rows);  // [sum | sumsq] or [sumsq]
    Acc* sum = layer ? stats.data() : nullptr;
    Acc* sumsq = layer ? stats.data() + rows : stats.data();
    {
      auto guard = kernel_guard(ctx, false);
      kernels::moments(ctx.exec(), in.data, sum, sumsq, r.outer, r.n, r.inner);
    }
    if (g) g->all_reduce(stats.data(), stats.data(), stats.size(), coll::dtype_of<Acc>(), coll::Op::sum);
    auto guard = kernel_guard(ctx, false);
    if constexpr (layer)
      kernels::layer_norm_apply(ctx.exec(), in.data, out, sum, sumsq, r.outer, r.n, r.inner, count, eps);
    else
      kernels::rms_norm_apply(ctx.exec(), in.data, out, sumsq, r.outer, r.n, r.inner, count, eps);
  }
}

template <OpName Name, Normalization Kind, int Dim, class A>
auto normalize_op(const A& a, double eps) {
  static constexpr OpRule rule = normalize_rule(A::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for this normalisation (is the dim in range?)",
                          error::op_has_no_sharding_rule_for_these_specs<Name, rule.status, typename A::spec_type>);
  using T = typename A::value_type;
  static_assert(std::is_floating_point_v<T>, "shardlib: softmax and the norms need a floating-point element type");
  using MeshT = typename A::mesh_type;
  using Mem = typename A::memory_space;
  using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, Mem>;
  Out out(a.mesh(), a.shape());
  normalize_run<Kind, T, Mem>(rule, Dim, eps, ref(a), out.local().data());
  return out;
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
/// softmax along `Dim` (the input's spec; communicates only when `Dim` is split).
template <int Dim, TensorType A>
auto softmax(const A& a) {
  return detail::normalize_op<"softmax", detail::Normalization::softmax, Dim>(a, 0.0);
}
/// log(softmax) along `Dim`, computed as x - max - log(sum exp(x - max)).
template <int Dim, TensorType A>
auto log_softmax(const A& a) {
  return detail::normalize_op<"log_softmax", detail::Normalization::log_softmax, Dim>(a, 0.0);
}
/// (x - mean) / sqrt(var + eps) along `Dim` (no affine parameters: multiply and add broadcast
/// tensors for those).
template <int Dim, TensorType A>
auto layer_norm(const A& a, double eps = 1e-5) {
  return detail::normalize_op<"layer_norm", detail::Normalization::layer_norm, Dim>(a, eps);
}
/// x / sqrt(mean(x^2) + eps) along `Dim`.
template <int Dim, TensorType A>
auto rms_norm(const A& a, double eps = 1e-6) {
  return detail::normalize_op<"rms_norm", detail::Normalization::rms_norm, Dim>(a, eps);
}

}  // namespace shardlib
