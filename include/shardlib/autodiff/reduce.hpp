// SPDX-License-Identifier: Apache-2.0
/// @file
/// Differentiable reductions (`sum`, `mean` along a dim, `sum_all`, `mean_all`) and
/// normalisations (`softmax`, `log_softmax`, `layer_norm`, `rms_norm`) on Vars.
///
/// A reduction's backward spreads the gradient back over the reduced dim (local: every device
/// holds its rows whole). The normalisations' backward rules are written with the forward ops, so
/// they communicate exactly where the forward does: along a split dim, the row sums of the
/// backward are all-reduced over that dim's axes.
#pragma once

#include <shardlib/autodiff/elementwise.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/kernels/rows.hpp>
#include <shardlib/ops/reduce.hpp>

#include <limits>

namespace shardlib {

namespace autodiff::detail {
template <int Dim, bool KeepDim, bool Mean, class A>
auto reduce_var(const A& a) {
  using In = tensor_of_t<A>;
  using T = typename In::value_type;
  auto out = [&] {
    if constexpr (Mean) return shardlib::mean<Dim, KeepDim>(a.value());
    else return shardlib::sum<Dim, KeepDim>(a.value());
  }();
  // (computed in float, or double for double: a 16-bit T's division yields float)
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const T scale = static_cast<T>(Mean ? Acc(1) / static_cast<Acc>(a.shape()[Dim]) : Acc(1));
  return record(Mean ? "mean" : "sum", std::move(out),
                [na = a.node(), scale](const auto& g, autodiff::BackwardPass& p) {
                  using G = std::remove_cvref_t<decltype(g)>;
                  give(p, 0, *na,
                       expand_dim<T, typename In::memory_space>(
                           g.context(), g.mesh().shape(), G::sharding, g.local().data(), Dim, KeepDim,
                           In::sharding.dims[static_cast<std::size_t>(Dim)], na->shape(), scale));
                },
                a.node());
}
}  // namespace autodiff::detail

/// Sum along `Dim` of a Var; its backward spreads the gradient over the dim.
template <int Dim, bool KeepDim = false, VarType A>
auto sum(const A& a) {
  return autodiff::detail::reduce_var<Dim, KeepDim, false>(a);
}
/// Mean along `Dim` of a Var.
template <int Dim, bool KeepDim = false, VarType A>
auto mean(const A& a) {
  return autodiff::detail::reduce_var<Dim, KeepDim, true>(a);
}
namespace fn::grad {
/// 1 where x equals the row's extremum m, else 0.
struct is_extremum {
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(const A& x, const A& m) const {
    return x == m ? A(1) : A(0);
  }
};
}  // namespace fn::grad

namespace autodiff::detail {
/// max or min along `Dim` of a Var. Backward: the gradient goes to the elements equal to the
/// extremum, split evenly between ties (the extremum and the tie count are all-reduced over the
/// dim's axes when it is split).
template <int Dim, bool KeepDim, bool Max, class A0>
auto extremum_var(const A0& a0) {
  const auto& a = resolved(a0);
  auto out = [&] {
    if constexpr (Max) return shardlib::max<Dim, KeepDim>(a.value());
    else return shardlib::min<Dim, KeepDim>(a.value());
  }();
  return record(Max ? "max" : "min", std::move(out),
                [na = a.node(), x = a.value()](const auto& g, BackwardPass& p) {
                  auto mk = [&] {
                    if constexpr (Max) return shardlib::max<Dim, true>(x);
                    else return shardlib::min<Dim, true>(x);
                  }();
                  using GK = grad_tensor_t<decltype(mk)>;
                  static_assert(GK::sharding.dims[static_cast<std::size_t>(Dim)].empty(),
                                "shardlib: internal: a keepdim reduction's dim is replicated");
                  const GK m(mk);  // the extremum, resolved
                  using G = std::remove_cvref_t<decltype(g)>;
                  // g with the dim kept (extent 1): the same block, read with one more dim.
                  auto gk = [&] {
                    if constexpr (KeepDim) {
                      return g;
                    } else {
                      return GK(g.mesh(), m.shape(), g.block_owner(), const_cast<typename G::value_type*>(g.local().data()));
                    }
                  }();
                  const auto mask = zip(fn::grad::is_extremum{}, x, m);
                  give(p, 0, *na, mask * gk / shardlib::sum<Dim, true>(mask));
                },
                a.node());
}
}  // namespace autodiff::detail

/// Maximum along `Dim` of a Var (the gradient goes to the maximum, shared between ties).
template <int Dim, bool KeepDim = false, VarType A>
auto max(const A& a) {
  return autodiff::detail::extremum_var<Dim, KeepDim, true>(a);
}
/// Minimum along `Dim` of a Var.
template <int Dim, bool KeepDim = false, VarType A>
auto min(const A& a) {
  return autodiff::detail::extremum_var<Dim, KeepDim, false>(a);
}

/// Sum of every element: a scalar (partial-sum over the axes that split the dims).
template <VarOrTensor A>
auto sum_all(const A& a) {
  if constexpr (autodiff::detail::tensor_of_t<A>::rank == 0) return a;
  else return sum_all(sum<0>(a));
}
/// Mean of every element: a scalar.
template <VarOrTensor A>
auto mean_all(const A& a) {
  using T = typename autodiff::detail::tensor_of_t<A>::value_type;
  std::int64_t n = 1;
  for (auto e : a.shape()) n *= e;
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;  // (1/n not rounded to 16 bits)
  return sum_all(a) * (Acc(1) / static_cast<Acc>(n));
}

namespace autodiff::detail {
/// softmax's backward over whole contiguous rows in one launch, in row groups
/// (kernels/row_groups.hpp: a group of GPU threads per row, y and g in registers): sums g y (in
/// double) and writes scale y (g - sum). The ops' form (g y, its row sums, g minus them, times y)
/// is four passes over the [B, H, S, S] scores of an unfused attention. The tests run it on host
/// instances too.
template <class T, bool Chunked>
struct SoftmaxBackwardRows {
  using C = compute_t<T>;
  const T *y, *g;
  T* out;
  std::int64_t n;
  double scale;
  std::int64_t rows;
  kernels::RowGroups groups;
  bool aligned;  // y, g and out
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const kernels::RowPlace at = kernels::row_place(team, groups, rows);
    const std::int64_t r = at.valid ? at.row : 0;
    double* scratch = static_cast<double*>(team.team_shmem().get_shmem(kernels::row_groups_scratch<double, 1>(groups)));
    const kernels::RowWalk<T, 8, 2, Chunked> walk({y, g}, r, n, n, groups.group, at.lane, aligned, at.valid);
    double s[1] = {0};
    walk.each([&](std::int64_t, const auto& v) { s[0] += static_cast<double>(v[1]) * static_cast<double>(v[0]); });
    kernels::group_combine(team, groups, s, scratch, [](double a, double b) { return a + b; });
    const double sum = s[0];
    walk.store(out, r, aligned, [&](std::int64_t, const auto& v) {
      return static_cast<T>(scale * static_cast<double>(v[0]) * (static_cast<double>(v[1]) - sum));
    });
  }
};
/// SoftmaxBackwardRows over `rows` rows of `n` (kernels::row_groups' layout unless given).
template <class Exec, class T>
void softmax_backward_rows(const Exec& exec, const T* y, const T* g, T* out, std::int64_t rows, std::int64_t n,
                           double scale, kernels::RowGroups groups = {}) {
  if (rows > 0 && n > 0)  // reads y and g, writes out
    kernels::count_kernel(3 * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(n) * sizeof(T));
  if (groups.team == 0) groups = kernels::row_groups<Exec>(n);
  const bool aligned = kernels::rows_aligned(y, n) && kernels::rows_aligned(g, n) && kernels::rows_aligned(static_cast<const T*>(out), n);
  kernels::with_row_tile(kernels::RowGroups{groups.team, groups.group, 8}, n, [&](auto, auto chunked) {
    kernels::launch_row_groups(exec, "shardlib::autodiff::softmax_backward_rows", rows, groups,
                             kernels::row_groups_scratch<double, 1>(groups),
                             SoftmaxBackwardRows<T, decltype(chunked)::value>{y, g, out, n, scale, rows, groups, aligned});
  });
}

/// softmax's backward on the host over whole contiguous rows of float or double: per row, while it
/// is in cache, the sum of g y (vmath::sum_runs: an order set by the row alone, whatever its
/// address or the tensor's layout), then scale y (g - sum) on whole SIMD packets
/// (vmath::assign_packets). Reads y and g once from memory
/// and writes out once, as SoftmaxBackwardRows in GPU memory; the ops' form took four passes
/// over the scores and a fifth for the scale. `out` may be `g`.
template <class Exec, class T>
void softmax_backward_rows_host(const Exec& exec, const T* y, const T* g, T* out, std::int64_t rows, std::int64_t n,
                                double scale) {
  static_assert(kernels::is_host_exec_v<Exec> && kernels::vmath::is_vector_type_v<T>,
                "shardlib::autodiff::softmax_backward_rows_host: host execution spaces, float or double");
  if (rows > 0 && n > 0)  // reads y and g, writes out (as softmax_backward_rows)
    kernels::count_kernel(3 * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(n) * sizeof(T));
  if (shardlib::shape_only()) return;
  namespace vm = kernels::vmath;
  kernels::detail::for_rows(exec, "shardlib::autodiff::softmax_backward_rows(host)", rows, n, [=](std::int64_t r) {
    const T *yr = y + r * n, *gr = g + r * n;
    T* o = out + r * n;
    const T s = static_cast<T>(vm::sum_runs(n, [](const auto& yy, const auto& gg) { return yy * gg; }, yr, gr));
    const T c = static_cast<T>(scale);
    vm::assign_packets(o, n, [s, c](const auto& yy, const auto& gg) { return (yy * c) * (gg - s); }, yr, gr);
  });
}
}  // namespace autodiff::detail

namespace autodiff::detail {
/// softmax<Dim> of a Var, with ops::normalize_run's `causal` mask (0: none; > 0 attention's
/// unfused form in GPU memory): the masked elements' y is 0, so the backward is softmax's.
template <int Dim, class A>
auto softmax_var(const A& a0, double scale, std::int64_t causal) {
  using T = typename tensor_of_t<A>::value_type;
  const auto& a = resolved(a0);
  auto y = causal != 0 ? shardlib::detail::normalize_op<"softmax", shardlib::detail::Normalization::softmax, Dim>(a.value(), 0.0,
                                                                                                                  scale, causal)
                       : shardlib::softmax<Dim>(a.value(), scale);
  using Y = decltype(y);
  return record("softmax", y,
                [na = a.node(), y, scale](const auto& g, autodiff::BackwardPass& p) {
                  using G = std::remove_cvref_t<decltype(g)>;
                  using Mem = typename Y::memory_space;
                  constexpr bool whole_rows = Dim == static_cast<int>(Y::rank) - 1 && Y::rank > 0 &&
                                              Y::sharding.dims[Y::rank > 0 ? Y::rank - 1 : 0].empty() &&
                                              std::is_same_v<typename G::spec_type, typename Y::spec_type>;
                  if constexpr (!shardlib::detail::host_memory_v<Mem> && whole_rows) {
                    const std::int64_t n = y.shape()[Y::rank - 1];
                    const std::int64_t rows = n > 0 ? y.block().num_elements() / n : 0;
                    if (rows <= std::numeric_limits<int>::max()) {
                      Y out(y.mesh(), y.shape());
                      softmax_backward_rows(y.context().template exec_for<Mem>(), y.local().data(), g.local().data(),
                                            out.local().data(), rows, n, scale);
                      give(p, 0, *na, out);
                      return;
                    }
                  } else if constexpr (whole_rows && kernels::vmath::is_vector_type_v<T>) {  // host memory
                    const std::int64_t n = y.shape()[Y::rank - 1];
                    Y out(y.mesh(), y.shape());
                    [[maybe_unused]] const auto guard = shardlib::detail::kernel_guard_for<Mem>(y.context(), false);
                    softmax_backward_rows_host(y.context().template exec_for<Mem>(), y.local().data(), g.local().data(),
                                               out.local().data(), n > 0 ? y.block().num_elements() / n : 0, n, scale);
                    give(p, 0, *na, out);
                    return;
                  }
                  if (scale == 1) give(p, 0, *na, y * (g - shardlib::sum<Dim, true>(g * y)));
                  else give(p, 0, *na, (y * static_cast<T>(scale)) * (g - shardlib::sum<Dim, true>(g * y)));
                },
                a.node());
}
}  // namespace autodiff::detail

/// softmax along `Dim` of a Var (of scale * a, with `scale`): backward scale y (g - sum(g y)); over
/// whole rows of the last dim one kernel (SoftmaxBackwardRows in GPU memory, softmax_backward_rows_host
/// on the host for float and double).
template <int Dim, VarType A>
auto softmax(const A& a0, double scale = 1) {
  return autodiff::detail::softmax_var<Dim>(a0, scale, 0);
}
/// log_softmax along `Dim` of a Var (of scale * a, with `scale`): backward scale (g - softmax sum(g)).
template <int Dim, VarType A>
auto log_softmax(const A& a0, double scale = 1) {
  using namespace autodiff::detail;
  using T = typename tensor_of_t<A>::value_type;
  const auto& a = resolved(a0);
  auto y = shardlib::log_softmax<Dim>(a.value(), scale);
  return record("log_softmax", y,
                [na = a.node(), y, scale](const auto& g, autodiff::BackwardPass& p) {
                  if (scale == 1) give(p, 0, *na, g - shardlib::exp(y) * shardlib::sum<Dim, true>(g));
                  else give(p, 0, *na, (g - shardlib::exp(y) * shardlib::sum<Dim, true>(g)) * static_cast<T>(scale));
                },
                a.node());
}
namespace autodiff::detail {
/// The row sums norm_backward needs, in double (layer_norm: of x, x^2, g and g y; rms_norm: of
/// x^2 and g y) of row `row` (elements base + j * inner, j < n) into st[row * k ...]. `Lanes`
/// (host memory): a contiguous row (inner 1) in 8 interleaved lanes of each sum: one chain of
/// dependent adds a sum took 439 us for [2048, 256] floats from the cache on a Xeon core, these
/// lanes 213 (16 lanes 310: they spill registers).
template <class T, bool Lanes = false>
struct NormBackwardSums {
  const T *x, *y, *g;
  double* st;
  std::int64_t n, inner;
  bool layer;
  static constexpr std::int64_t lanes = 8;
  KOKKOS_INLINE_FUNCTION static double value(const T& v) { return static_cast<double>(static_cast<compute_t<T>>(v)); }
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    const std::int64_t base = (row / inner) * n * inner + row % inner;
    double sx = 0, sxx = 0, sg = 0, sgy = 0;
    std::int64_t j = 0;
    if constexpr (Lanes) {
      if (inner == 1) {
        double lx[lanes] = {}, lxx[lanes] = {}, lg[lanes] = {}, lgy[lanes] = {};
        for (; j + lanes <= n; j += lanes)
          for (std::int64_t l = 0; l < lanes; ++l) {
            const double xv = value(x[base + j + l]), gv = value(g[base + j + l]);
            lx[l] += xv, lxx[l] += xv * xv, lg[l] += gv, lgy[l] += gv * value(y[base + j + l]);
          }
        for (std::int64_t l = 0; l < lanes; ++l) sx += lx[l], sxx += lxx[l], sg += lg[l], sgy += lgy[l];
      }
    }
    for (; j < n; ++j) {
      const std::int64_t e = base + j * inner;
      const double xv = value(x[e]), gv = value(g[e]);
      sx += xv, sxx += xv * xv, sg += gv, sgy += gv * value(y[e]);
    }
    if (layer) {
      double* s = st + row * 4;
      s[0] = sx, s[1] = sxx, s[2] = sg, s[3] = sgy;
    } else {
      double* s = st + row * 2;
      s[0] = sxx, s[1] = sgy;
    }
  }
};
/// The input's gradient of row `row` from the (all-reduced) sums: rstd (g - mean(g) - y mean(g y)).
template <class T>
struct NormBackwardApply {
  const T *y, *g;
  const double* st;
  T* out;
  std::int64_t n, inner;
  double count, eps;
  bool layer;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t row) const {
    using std::sqrt;
    const std::int64_t base = (row / inner) * n * inner + row % inner;
    double scale, mg, mgy;
    if (layer) {
      const double* s = st + row * 4;
      const double mu = s[0] / count, var = s[1] / count - mu * mu;
      scale = 1.0 / sqrt(var + eps), mg = s[2] / count, mgy = s[3] / count;
    } else {
      const double* s = st + row * 2;
      scale = 1.0 / sqrt(s[0] / count + eps), mg = 0, mgy = s[1] / count;
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t e = base + j * inner;
      out[e] = static_cast<T>(scale * (static_cast<double>(static_cast<compute_t<T>>(g[e])) - mg -
                                       static_cast<double>(static_cast<compute_t<T>>(y[e])) * mgy));
    }
  }
};

/// norm_backward of whole contiguous rows not split over devices, in one launch, in row groups
/// (kernels/row_groups.hpp: a group of GPU threads per row, x, y and g in registers): sums the row
/// (layer_norm: x, x^2, g, g y; rms_norm: x^2, g y) in double, in one reduction, and writes its
/// gradient. NormBackwardSums and NormBackwardApply give a row to one GPU thread, whose loads are
/// a row apart across the warp: 0.5 ms on an H100 for [8192, 768] bf16 against about 10 us of
/// memory traffic (issue 40).
template <class T, bool Chunked>
struct NormBackwardRows {
  const T *x, *y, *g;
  T* out;
  std::int64_t n;
  double count, eps;
  bool layer;
  std::int64_t rows;
  kernels::RowGroups groups;
  bool aligned;  // x, y, g and out
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    using std::sqrt;
    const kernels::RowPlace at = kernels::row_place(team, groups, rows);
    const std::int64_t r = at.valid ? at.row : 0;
    double* scratch = static_cast<double*>(team.team_shmem().get_shmem(kernels::row_groups_scratch<double, 4>(groups)));
    const kernels::RowWalk<T, 8, 3, Chunked> walk({x, y, g}, r, n, n, groups.group, at.lane, aligned, at.valid);
    double s[4] = {0, 0, 0, 0};  // x^2, g y, x, g
    walk.each([&](std::int64_t, const auto& v) {
      const double dx = static_cast<double>(v[0]), dy = static_cast<double>(v[1]), dg = static_cast<double>(v[2]);
      s[0] += dx * dx;
      s[1] += dg * dy;
      if (layer) s[2] += dx, s[3] += dg;
    });
    kernels::group_combine(team, groups, s, scratch, [](double a, double b) { return a + b; });
    double scale, mg = 0;
    if (layer) {
      const double mu = s[2] / count, var = s[0] / count - mu * mu;
      scale = 1.0 / sqrt(var + eps), mg = s[3] / count;
    } else {
      scale = 1.0 / sqrt(s[0] / count + eps);
    }
    const double mgy = s[1] / count;
    walk.store(out, r, aligned, [&](std::int64_t, const auto& v) {
      return static_cast<T>(scale * (static_cast<double>(v[2]) - mg - static_cast<double>(v[1]) * mgy));
    });
  }
};

/// Launches NormBackwardRows over `rows` rows of `n` on `exec` (kernels::row_groups' layout
/// unless given, as kernels::rows_fused).
template <class Exec, class T>
void norm_backward_rows(const Exec& exec, const T* x, const T* y, const T* g, T* out, std::int64_t rows, std::int64_t n,
                        double count, double eps, bool layer, kernels::RowGroups groups = {}) {
  if (rows > 0 && n > 0)  // reads x, y and g, writes out
    kernels::count_kernel(4 * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(n) * sizeof(T));
  if (groups.team == 0) groups = kernels::row_groups<Exec>(n);
  const bool aligned = kernels::rows_aligned(x, n) && kernels::rows_aligned(y, n) && kernels::rows_aligned(g, n) &&
                       kernels::rows_aligned(static_cast<const T*>(out), n);
  kernels::with_row_tile(kernels::RowGroups{groups.team, groups.group, 8}, n, [&](auto, auto chunked) {
    kernels::launch_row_groups(exec, "shardlib::autodiff::norm_backward_rows", rows, groups,
                               kernels::row_groups_scratch<double, 4>(groups),
                               NormBackwardRows<T, decltype(chunked)::value>{x, y, g, out, n, count, eps, layer, rows, groups, aligned});
  });
}

/// norm_backward of whole contiguous rows on the host (float, double), one work item per row while
/// it is in cache: the statistics of x as layer_norm_rows takes them (the mean, then the
/// variance about it; rms_norm: the mean of x^2), the sums of g and g y, then
/// rstd (g - mean(g) - y mean(g y)), each on whole SIMD packets from the row's start
/// (vmath::sum_runs, vmath::assign_packets): a row's gradient does not depend on its address.
/// Reads x, y and g once from memory and writes out once, as norm_backward_rows in GPU memory; NormBackwardSums and
/// NormBackwardApply read y and g twice. `out` may be `g`.
template <class Exec, class T>
void norm_backward_rows_host(const Exec& exec, const T* x, const T* y, const T* g, T* out, std::int64_t rows,
                             std::int64_t n, double eps, bool layer) {
  static_assert(kernels::is_host_exec_v<Exec> && kernels::vmath::is_vector_type_v<T>,
                "shardlib::autodiff::norm_backward_rows_host: host execution spaces, float or double");
  if (rows > 0 && n > 0)  // reads x, y and g, writes out (as norm_backward_rows)
    kernels::count_kernel(4 * static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(n) * sizeof(T));
  if (shardlib::shape_only()) return;
  namespace vm = kernels::vmath;
  kernels::detail::for_rows(exec, "shardlib::autodiff::norm_backward_rows(host)", rows, n, [=](std::int64_t r) {
    const T *xr = x + r * n, *yr = y + r * n, *gr = g + r * n;
    auto sum = [n](const auto& f, const auto*... in) { return vm::sum_runs(n, f, in...); };
    const double count = static_cast<double>(n);
    double rstd, mg = 0;
    if (layer) {
      const double mean = sum([](const auto& v) { return v; }, xr) / count;
      const T hi = static_cast<T>(mean), lo = static_cast<T>(mean - static_cast<double>(hi));
      rstd = 1 / std::sqrt(sum([hi, lo](const auto& v) { return (v - hi - lo).square(); }, xr) / count + eps);
      mg = sum([](const auto& v) { return v; }, gr) / count;
    } else {
      rstd = 1 / std::sqrt(sum([](const auto& v) { return v.square(); }, xr) / count + eps);
    }
    const double mgy = sum([](const auto& a, const auto& b) { return a * b; }, gr, yr) / count;
    const T rs = static_cast<T>(rstd), tg = static_cast<T>(mg), tgy = static_cast<T>(mgy);
    vm::assign_packets(out + r * n, n, [rs, tg, tgy](const auto& gv, const auto& yv) { return (gv - tg - yv * tgy) * rs; }, gr, yr);
  });
}

/// The backward of layer_norm (`layer`) or rms_norm along `dim`: the input's gradient block
/// (laid out as y) from the blocks of x, y and g. The row sums it needs (layer_norm: of x, x^2,
/// g and g y; rms_norm: of x^2 and g y) are all-reduced in one call over the dim's axes when it
/// is split; the forward's statistics are recomputed from x, in double.
template <class T, class Mem>
SHARDLIB_NOINLINE Contribution norm_backward(Context& ctx, const MeshShape& mesh, const Sharding& layout,
                                             ArrayRef<std::int64_t> shape, int dim, double eps, bool layer,
                                             const OperandRef<T>& x, const OperandRef<T>& y, const OperandRef<T>& g) {
  const Block<T> bx = block_as<Mem>(x, layout), by = block_as<Mem>(y, layout), bg = block_as<Mem>(g, layout);
  Contribution c;
  c.sharding = layout;
  c.box = by.box;
  const std::int64_t total = c.box.num_elements();
  c.keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(total, 1)) * sizeof(T));
  c.data = c.keep.get();
  T* out = static_cast<T*>(c.data);
  const RowSplit r = split_at(c.box, dim);
  const std::int64_t rows = r.outer * r.inner, n = r.n, inner = r.inner;
  const AxisList& axes = layout.dims[static_cast<std::size_t>(dim)];
  if (!host_memory_v<Mem> && inner == 1 && mesh.group_size(axes) == 1) {  // whole contiguous rows: one launch
    [[maybe_unused]] const auto guard = kernel_guard_for<Mem>(ctx, true);
    norm_backward_rows(ctx.exec_for<Mem>(), bx.data, by.data, bg.data, out, rows, n,
                       static_cast<double>(shape[static_cast<std::size_t>(dim)]), eps, layer);
    return c;
  }
  if constexpr (host_memory_v<Mem> && kernels::vmath::is_vector_type_v<T>) {
    if (inner == 1 && mesh.group_size(axes) == 1) {  // whole contiguous rows: one pass
      [[maybe_unused]] const auto guard = kernel_guard_for<Mem>(ctx, false);
      norm_backward_rows_host(ctx.exec_for<Mem>(), bx.data, by.data, bg.data, out, rows, n, eps, layer);
      return c;
    }
  }
  const int k = layer ? 4 : 2;
  const std::shared_ptr<void> stats =  // the row sums, in double, in Mem
      block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(k * rows, 1)) * sizeof(double));
  double* st = static_cast<double*>(stats.get());
  for_range<Mem>("shardlib::autodiff::norm_backward_sums", ctx, rows,
                 NormBackwardSums<T, host_memory_v<Mem>>{bx.data, by.data, bg.data, st, n, inner, layer},
                 3 * static_cast<std::uint64_t>(rows * n) * sizeof(T));
  if (rows && mesh.group_size(axes) > 1)
    all_reduce_stats<Mem>(ctx, mesh, axes, st, static_cast<std::size_t>(k * rows), coll::Op::sum);
  for_range<Mem>("shardlib::autodiff::norm_backward", ctx, rows,
                 NormBackwardApply<T>{by.data, bg.data, st, out, n, inner, static_cast<double>(shape[static_cast<std::size_t>(dim)]),
                                      eps, layer},
                 3 * static_cast<std::uint64_t>(rows * n) * sizeof(T));
  // The blocks of x, y and g (resharded copies perhaps) and the sums are in use until the
  // kernels ran: on a device's stream they are given back to the cache, which hands them out
  // again only to work queued on the same stream after these kernels.
  return c;
}

template <int Dim, bool Layer, class A0>
auto norm_var(const A0& a0, double eps) {
  const auto& a = resolved(a0);
  auto y = [&] {
    if constexpr (Layer) return shardlib::layer_norm<Dim>(a.value(), eps);
    else return shardlib::rms_norm<Dim>(a.value(), eps);
  }();
  using Y = decltype(y);
  return record(Layer ? "layer_norm" : "rms_norm", y,
                [na = a.node(), x = a.value(), y, eps](const auto& g, BackwardPass& p) {
                  using T = typename Y::value_type;
                  give(p, 0, *na,
                       norm_backward<T, typename Y::memory_space>(g.context(), g.mesh().shape(), Y::sharding, y.shape(), Dim,
                                                                  eps, Layer, ref(x), ref(y), ref(g)));
                },
                a.node());
}
}  // namespace autodiff::detail

/// (x - mean) / sqrt(var + eps) along `Dim` of a Var: backward rstd * (g - mean(g) - y mean(g y)),
/// its four row sums in one all_reduce when `Dim` is split.
template <int Dim, VarType A>
auto layer_norm(const A& a, double eps = 1e-5) {
  return autodiff::detail::norm_var<Dim, true>(a, eps);
}
/// layer_norm along the last dim with a gain and a bias where one of the three is a Var: the
/// composition `layer_norm<Dim>(a, eps) * gain + bias`, differentiated op by op.
template <int Dim, VarOrTensor A, VarOrTensor G, VarOrTensor B>
  requires(VarType<A> || VarType<G> || VarType<B>)
auto layer_norm(const A& a, const G& gain, const B& bias, double eps = 1e-5) {
  constexpr int D = static_cast<int>(autodiff::detail::tensor_of_t<A>::rank) - 1;
  static_assert(Dim == -1 || Dim == D,
                "shardlib: layer_norm with a gain and a bias normalises the last dim (as torch.nn.functional.layer_norm)");
  return layer_norm<D>(a, eps) * gain + bias;
}
/// x / sqrt(mean(x^2) + eps) along `Dim` of a Var: backward r (g - y mean(g y)), its row sums in
/// one all_reduce when `Dim` is split.
template <int Dim, VarType A>
auto rms_norm(const A& a, double eps = 1e-6) {
  return autodiff::detail::norm_var<Dim, false>(a, eps);
}

}  // namespace shardlib
