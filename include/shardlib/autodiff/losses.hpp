// SPDX-License-Identifier: Apache-2.0
/// @file
/// Losses: mean squared error, and cross-entropy over logits whose vocabulary dim may be split
/// (Megatron's vocab-parallel cross-entropy: no gather of the logits).
///
/// In shape-only mode (detail/shape_only.hpp) the losses allocate and communicate as always and
/// read no logit or target: no target is out of range, and nothing is written.
#pragma once

#include <shardlib/autodiff/reduce.hpp>
#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/layout.hpp>
#include <shardlib/kernels/reduce.hpp>
#include <shardlib/kernels/vmath.hpp>
#include <shardlib/ops/layout.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlib {

namespace error {
/// cross_entropy needs logits of rank 2 ([rows, classes]) and integer targets of rank 1.
template <class LogitsSpec, class TargetsSpec>
struct cross_entropy_needs_rank_2_logits_and_rank_1_integer_targets;
}  // namespace error

/// Mean over every element of (pred - target)^2: a scalar (partial-sum over the axes that split
/// the operands' dims, resolved when read). Either operand may be a Var.
template <class P, class T>
  requires DifferentiableOperands<P, T>
auto mse_loss(const P& pred, const T& target) {
  return mean_all(square(pred - target));
}

namespace autodiff::detail {

/// The sharding of cross_entropy's scalar: partial-sum over the axes that split the logits.
constexpr Sharding cross_entropy_sharding(const Sharding& logits) {
  Sharding s;
  s.partial = axis_union(logits.dims[0], logits.dims[1]);
  return s;
}

/// What the backward of cross_entropy keeps: per local row, log-sum-exp, and the row's target.
template <class T>
struct CrossEntropySaved {
  std::vector<T> lse;
  std::vector<std::int64_t> target;
};

/// Counts cross_entropy's three passes (kernels::count_kernel, the cost model's bytes): the row
/// max and the sum of exponentials read the logits' block (and write a row's figure), the loss
/// reads per row its max, sum, target and target's logit and writes its log-sum-exp and target.
template <class T, class I>
void count_passes(std::int64_t rows, std::int64_t cols) noexcept {
  if (rows <= 0) return;
  const auto r = static_cast<std::uint64_t>(rows), logits = r * static_cast<std::uint64_t>(cols) * sizeof(T);
  if (cols > 0) {
    kernels::count_kernel(logits + r * sizeof(T));
    kernels::count_kernel(logits + 2 * r * sizeof(T));
  }
  kernels::count_kernel(r * (4 * sizeof(T) + sizeof(I) + sizeof(std::int64_t)));
}

/// The runtime part of cross_entropy, compiled once per element and index type: the logits'
/// block (rows and a range of classes), targets laid out as the rows; the row max and the sum of
/// exponentials all-reduced over the class dim's axes (two small all_reduces when it is split);
/// this device's addend of the mean loss into `out`.
template <class T, class I, class Mem>
SHARDLIB_NOINLINE void cross_entropy_run(Context& ctx, const MeshShape& mesh, const Sharding& layout,
                                         ArrayRef<std::int64_t> shape, const Block<T>& z, const Block<I>& t,
                                         const OperandInfo& logits_info, const OperandInfo& targets_info, T* out,
                                         CrossEntropySaved<T>& saved) {
  const std::int64_t rows = z.box.extent[0], cols = z.box.extent[1], col0 = z.box.offset[1];
  const std::int64_t n = shape[0], classes = shape[1];
  const bool read = !shardlib::shape_only();  // shape-only: the collectives alone (saved: zeros)
  count_passes<T, I>(rows, cols);
  for (std::int64_t r = 0; r < rows && read; ++r)
    if (t.data[r] < 0 || t.data[r] >= classes)
      throw std::out_of_range("shardlib: cross_entropy: target " + std::to_string(static_cast<long long>(t.data[r])) +
                              " of row " + std::to_string(z.box.offset[0] + r) + " is outside [0, " +
                              std::to_string(classes) + ") (logits " + operand_text(logits_info) + ", targets " +
                              operand_text(targets_info) + ")");
  std::vector<T> m(static_cast<std::size_t>(rows), -std::numeric_limits<T>::infinity());
  constexpr bool vector = kernels::vmath::is_vector_type_v<T>;  // Eigen's packets (kernels/vmath.hpp)
  for (std::int64_t r = 0; r < rows && read; ++r) {
    if constexpr (vector) {
      if (cols > 0) m[static_cast<std::size_t>(r)] = kernels::vmath::ConstRun<T>(z.data + r * cols, cols).maxCoeff();
    } else {
      for (std::int64_t c = 0; c < cols; ++c) m[static_cast<std::size_t>(r)] = std::max(m[static_cast<std::size_t>(r)], z.data[r * cols + c]);
    }
  }
  const AxisList& vaxes = layout.dims[1];
  const bool split = mesh.group_size(vaxes) > 1;
  coll::Communicator* comm = split ? &ctx.group(mesh, vaxes) : nullptr;
  if (comm && rows) comm->all_reduce(m.data(), m.data(), m.size(), coll::dtype_of<T>(), coll::Op::max);
  std::vector<T> s(static_cast<std::size_t>(rows), T(0));
  for (std::int64_t r = 0; r < rows && read; ++r) {
    const T mr = m[static_cast<std::size_t>(r)];
    T acc = 0;
    if constexpr (vector) {
      if (cols > 0) acc = kernels::vmath::sum_packets(cols, [mr](const auto& v) { return kernels::vmath::exp(v - mr); }, z.data + r * cols);
    } else {
      for (std::int64_t c = 0; c < cols; ++c) acc += std::exp(z.data[r * cols + c] - mr);
    }
    s[static_cast<std::size_t>(r)] = acc;
  }
  if (comm && rows) comm->all_reduce(s.data(), s.data(), s.size(), coll::dtype_of<T>(), coll::Op::sum);
  const bool first = mesh.group_rank(ctx.device(), vaxes) == 0;
  saved.lse.resize(static_cast<std::size_t>(rows));
  saved.target.resize(static_cast<std::size_t>(rows));
  if (!read) return;
  T total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto u = static_cast<std::size_t>(r);
    const T lse = m[u] + std::log(s[u]);
    saved.lse[u] = lse;
    saved.target[u] = static_cast<std::int64_t>(t.data[r]);
    const std::int64_t c = saved.target[u] - col0;
    const T zt = c >= 0 && c < cols ? z.data[r * cols + c] : T(0);
    total += (first ? lse : T(0)) - zt;
  }
  *out = n > 0 ? total / static_cast<T>(n) : T(0);
}

/// The gradient of the logits' block: g / n * (softmax - one_hot(target)). Nothing in shape-only
/// mode.
template <class T>
SHARDLIB_NOINLINE void cross_entropy_grad(const Block<T>& z, std::int64_t n, const CrossEntropySaved<T>& saved, T g,
                                          T* out) {
  const std::int64_t rows = z.box.extent[0], cols = z.box.extent[1], col0 = z.box.offset[1];
  if (rows > 0 && cols > 0) kernels::count_kernel(2 * static_cast<std::uint64_t>(rows * cols) * sizeof(T));  // read, written
  if (shardlib::shape_only()) return;
  const T scale = n > 0 ? g / static_cast<T>(n) : T(0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto u = static_cast<std::size_t>(r);
    if constexpr (kernels::vmath::is_vector_type_v<T>) {
      if (cols == 0) continue;
      const T lse = saved.lse[u];  // whole packets: a value's bits do not depend on where the vocabulary is split
      kernels::vmath::assign_packets(out + r * cols, cols,
                                     [lse, scale](const auto& x) { return kernels::vmath::exp(x - lse) * scale; },
                                     z.data + r * cols);
      const std::int64_t c = saved.target[u] - col0;
      if (c >= 0 && c < cols) out[r * cols + c] = scale * (std::exp(z.data[r * cols + c] - saved.lse[u]) - T(1));
    } else {
      for (std::int64_t c = 0; c < cols; ++c)
        out[r * cols + c] = scale * (std::exp(z.data[r * cols + c] - saved.lse[u]) - (col0 + c == saved.target[u] ? T(1) : T(0)));
    }
  }
}

/// What the backward of cross_entropy keeps of logits in device memory: per local row,
/// log-sum-exp (`rows` T) and the row's target (`rows` int64), blocks in the logits' memory.
struct CrossEntropyRows {
  std::shared_ptr<void> lse, target;
};

/// Row r's log-sum-exp and target (kept for the backward), and its addend of the loss: lse (on
/// the first device of the class dim's group) minus the target's logit (on the device that holds
/// its column).
template <class T, class I>
struct CrossEntropyLossKernel {
  const T* z;
  const T* m;
  const T* s;
  const I* t;
  T* lse;
  std::int64_t* target;
  std::int64_t cols, col0;
  bool first;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r, T& total) const {
    using std::log;
    const T l = m[r] + log(s[r]);
    const auto tr = static_cast<std::int64_t>(t[r]);
    lse[r] = l;
    target[r] = tr;
    const std::int64_t c = tr - col0;
    total += (first ? l : T(0)) - (c >= 0 && c < cols ? z[r * cols + c] : T(0));
  }
};
/// out[0] /= n (0 for no rows).
template <class T>
struct CrossEntropyMeanKernel {
  T* out;
  std::int64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t) const { out[0] = n > 0 ? out[0] / static_cast<T>(n) : T(0); }
};
/// The logits' gradient, element k of the [rows, cols] block: g / n * (softmax - one_hot(target)),
/// with g read from the scalar gradient's block.
template <class T>
struct CrossEntropyGradKernel {
  const T* z;
  const T* lse;
  const std::int64_t* target;
  const T* g;
  T* out;
  std::int64_t cols, col0, n;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    using std::exp;
    const std::int64_t r = k / cols, c = k % cols;
    const T scale = n > 0 ? g[0] / static_cast<T>(n) : T(0);
    out[k] = scale * (exp(z[k] - lse[r]) - (col0 + c == target[r] ? T(1) : T(0)));
  }
};

/// cross_entropy_run for logits and targets in any memory `Mem` (device memory: kernels on the
/// device's stream; the row max and sum of exponentials are softmax's portable kernels,
/// all-reduced over the class dim's axes in device memory where the backend can): the same
/// loss, its row statistics kept in `saved`. The targets are checked by a reduction that the
/// host waits for (unless NDEBUG without SHARDLIB_CHECKED, as take's ids).
template <class T, class I, class Mem>
SHARDLIB_NOINLINE void cross_entropy_run_in(Context& ctx, const MeshShape& mesh, const Sharding& layout,
                                            ArrayRef<std::int64_t> shape, const Block<T>& z, const Block<I>& t,
                                            const OperandInfo& logits_info, const OperandInfo& targets_info, T* out,
                                            CrossEntropyRows& saved) {
  const std::int64_t rows = z.box.extent[0], cols = z.box.extent[1], col0 = z.box.offset[1];
  const std::int64_t n = shape[0], classes = shape[1];
  if (check_indices && rows > 0) {
    const auto first = kernels::detail::portable::first_bad_id(ctx.exec_for<Mem>(), t.data, rows, classes);
    if (first.val < rows)
      throw std::out_of_range("shardlib: cross_entropy: target " + std::to_string(static_cast<long long>(first.loc)) +
                              " of row " + std::to_string(z.box.offset[0] + first.val) + " is outside [0, " +
                              std::to_string(classes) + ") (logits " + operand_text(logits_info) + ", targets " +
                              operand_text(targets_info) + ")");
  }
  auto& cache = block_cache<Mem>(ctx);
  const auto row_bytes = static_cast<std::size_t>(std::max<std::int64_t>(rows, 1));
  const std::shared_ptr<void> stats = cache.allocate(2 * row_bytes * sizeof(T));  // m, then s
  saved.lse = cache.allocate(row_bytes * sizeof(T));
  saved.target = cache.allocate(row_bytes * sizeof(std::int64_t));
  T* m = static_cast<T*>(stats.get());
  T* s = m + row_bytes;
  const auto& exec = ctx.exec_for<Mem>();
  // The max, then the sum of exp(z - max) in double: softmax's portable kernels (kernels/reduce.hpp).
  kernels::detail::portable::reduce_dim(exec, z.data, m, rows, cols, 1, kernels::ReduceKind::max);
  const AxisList& vaxes = layout.dims[1];
  const bool split = mesh.group_size(vaxes) > 1;
  if (split && rows) all_reduce_stats<Mem>(ctx, mesh, vaxes, m, static_cast<std::size_t>(rows), coll::Op::max);
  kernels::detail::portable::exp_sum(exec, z.data, m, s, rows, cols, 1);
  if (split && rows) all_reduce_stats<Mem>(ctx, mesh, vaxes, s, static_cast<std::size_t>(rows), coll::Op::sum);
  if (rows == 0) {
    fill<Mem>(ctx, out, 1, T(0));
    return;
  }
  kernels::count_kernel(static_cast<std::uint64_t>(rows) * (4 * sizeof(T) + sizeof(I) + sizeof(std::int64_t)));  // the loss's pass
  if (!shardlib::shape_only()) {
    auto guard = kernel_guard_for<Mem>(ctx, true);
    Kokkos::parallel_reduce("shardlib::cross_entropy_loss", Kokkos::RangePolicy<exec_space_t<Mem>>(exec, 0, rows),
                            CrossEntropyLossKernel<T, I>{z.data, m, s, t.data, static_cast<T*>(saved.lse.get()),
                                                         static_cast<std::int64_t*>(saved.target.get()), cols, col0,
                                                         mesh.group_rank(ctx.device(), vaxes) == 0},
                            Kokkos::View<T, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(out));
  }
  for_range<Mem>("shardlib::cross_entropy_mean", ctx, 1, CrossEntropyMeanKernel<T>{out, n});
}

/// cross_entropy_grad for logits in any memory `Mem`: `g` points at the loss's gradient (one
/// element in `Mem`); a kernel on the device's stream.
template <class T, class Mem>
void cross_entropy_grad_in(const Context& ctx, const Block<T>& z, std::int64_t n, const CrossEntropyRows& saved,
                           const T* g, T* out) {
  const std::int64_t cols = z.box.extent[1];
  if (cols == 0) return;
  for_range<Mem>("shardlib::cross_entropy_grad", ctx, z.box.extent[0] * cols,
                 CrossEntropyGradKernel<T>{z.data, static_cast<const T*>(saved.lse.get()),
                                           static_cast<const std::int64_t*>(saved.target.get()), g, out, cols,
                                           z.box.offset[1], n},
                 2 * static_cast<std::uint64_t>(z.box.extent[0] * cols) * sizeof(T));
}

}  // namespace autodiff::detail

/// Mean cross-entropy of `logits` ([rows, classes], a Var or tensor) against integer `targets`
/// ([rows], class indices): mean over rows of log(sum_c exp(z_c)) - z_target. With the class dim
/// split over mesh axes (a vocabulary-parallel output layer), each device works on its classes:
/// the row max and the sum of exponentials are all-reduced over those axes (two small
/// all_reduces), the logits are never gathered, and the loss is a scalar partial-sum over the
/// axes that split the logits (one all_reduce of one element when read). Its backward is local:
/// softmax minus one-hot on each device's block. Throws std::out_of_range naming the row of a
/// target outside [0, classes) (on the devices that hold that row).
template <VarOrTensor L, TensorType Targets>
auto cross_entropy(const L& logits0, const Targets& targets) {
  using namespace autodiff::detail;
  using LT = tensor_of_t<L>;
  using I = typename Targets::value_type;
  if constexpr (is_half_v<typename LT::value_type>) {  // 16-bit logits: the loss in float32
    return cross_entropy(shardlib::cast<float>(logits0), targets);
  } else {
    SHARDLIB_STATIC_REQUIRE((LT::rank == 2 && Targets::rank == 1 && std::is_integral_v<I>),
                            "shardlib: cross_entropy needs rank-2 logits [rows, classes] and rank-1 integer targets",
                            error::cross_entropy_needs_rank_2_logits_and_rank_1_integer_targets<
                                typename LT::spec_type, typename Targets::spec_type>);
    if constexpr (LT::rank == 2 && Targets::rank == 1 && std::is_integral_v<I>) {
      const auto& logits = resolved(logits0);
      using Z = tensor_of_t<std::remove_cvref_t<decltype(logits)>>;
      using T = typename Z::value_type;
      using Mem = typename Z::memory_space;
      using MeshT = typename Z::mesh_type;
      static constexpr Sharding layout = Z::sharding;
      static constexpr Sharding out_sharding = cross_entropy_sharding(layout);
      using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return out_sharding; })>, Mem>;
      const Z& z = value(logits);
      check_same_mesh("cross_entropy", z, targets);
      if (targets.shape()[0] != z.shape()[0])
        throw std::invalid_argument("shardlib: cross_entropy: logits " + operand_text(z) + " and targets " +
                                    operand_text(targets) + " have different row counts");
      static_assert(require_one_memory_space<"cross_entropy", Mem, typename Targets::memory_space>());
      Sharding rows;
      rows.rank = 1;
      rows.dims[0] = layout.dims[0];
      const Block<I> t = block_as(targets, rows);
      const Block<T> zb{nullptr, z.local().data(), z.block()};
      Out out(z.mesh(), {});
      // Host memory: the host kernels (Eigen's packets); device memory: kernels on the stream.
      using Saved = std::conditional_t<host_memory_v<Mem>, CrossEntropySaved<T>, CrossEntropyRows>;
      auto saved = std::make_shared<Saved>();
      if constexpr (host_memory_v<Mem>)
        cross_entropy_run<T, I, Mem>(z.context(), z.mesh().shape(), layout, z.shape(), zb, t, info(z), info(targets),
                                     out.local().data(), *saved);
      else
        cross_entropy_run_in<T, I, Mem>(z.context(), z.mesh().shape(), layout, z.shape(), zb, t, info(z),
                                        info(targets), out.local().data(), *saved);
      if constexpr (VarType<std::remove_cvref_t<decltype(logits)>>) {
        return record("cross_entropy", std::move(out),
                      [nz = logits.node(), z, saved](const auto& g, autodiff::BackwardPass& p) {
                        Z gz(z.mesh(), z.shape());
                        const Block<T> zg{nullptr, z.local().data(), z.block()};
                        if constexpr (host_memory_v<Mem>) {  // g's value read on the host (none when shape-only)
                          const T gv = shardlib::shape_only() ? T(0) : g.local().data()[0];
                          cross_entropy_grad<T>(zg, z.shape()[0], *saved, gv, gz.local().data());
                        } else {
                          cross_entropy_grad_in<T, Mem>(z.context(), zg, z.shape()[0], *saved, g.local().data(),
                                                        gz.local().data());
                        }
                        give(p, 0, *nz, gz);
                      },
                      logits.node());
      } else {
        return out;
      }
    }
  }
}

}  // namespace shardlib
