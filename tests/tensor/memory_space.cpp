// SPDX-License-Identifier: Apache-2.0
// Tensors in the memory of Kokkos's default execution space: Kokkos::CudaSpace with a
// CUDA-enabled Kokkos (the GPU suite, docs/13_gpus.md), host memory otherwise (CI). Creation,
// from_host/to_host, scatter_from/gather_to, clone, reshards, the loops (KOKKOS_LAMBDA bodies),
// the elementwise ops, the contractions (cuBLAS on a GPU), the reductions (argmax too), softmax
// and the norms, the layout ops (permute, reshape, slice, concat, take, index_add, roll, shift,
// pad, where), ghosted views and stencil_for (a functor struct: nvcc has no generic device lambdas)
// against the same program on tensors in host memory, on 1..4 devices: the host tensor is the
// oracle of the device one.
#include <doctest/doctest.h>
#include <shardlib/memory.hpp>
#include <shardlib/ops/elementwise.hpp>
#include <shardlib/ops/layout.hpp>
#include <shardlib/ops/linalg.hpp>
#include <shardlib/ops/reduce.hpp>
#include <shardlib/ops/shift.hpp>
#include <shardlib/stencil.hpp>
#include <shardlib/tensor.hpp>

#include "../collectives/harness.hpp"
#include "../string_makers.hpp"  // a failed comparison of two downloaded tensors prints their elements

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace sl = shardlib;
using sl::none;

using Mem = Kokkos::DefaultExecutionSpace::memory_space;
using M2 = sl::Mesh<"x", "y">;
template <class Spec, class Space = Mem>
using T2 = sl::DistributedTensor<float, M2, Spec, Space>;
using Rows = sl::Spec<"x", none>;
using Cols = sl::Spec<none, "y">;
using Both = sl::Spec<"x", "y">;
using Both3 = sl::Spec<"x", "y", none>;  // a 3-D grid's, its last dim whole
using Replicated = sl::Spec<none, none>;
using RowsPartial = sl::Spec<"x", none, sl::partial_sum<"y">>;

M2 mesh_of(sl::Context& ctx) {
  const int n = ctx.num_devices();
  return n % 2 == 0 ? M2(ctx, {n / 2, 2}) : M2(ctx, {n, 1});
}

// The loop bodies: functors whose operator() runs on the device (and the host).
struct Twice {
  KOKKOS_INLINE_FUNCTION float operator()(float v) const { return 2.0f * v; }
};
struct PlusRow {
  KOKKOS_INLINE_FUNCTION float operator()(const sl::Index<2>& i, float v) const { return v + static_cast<float>(i[0]); }
};

void check_creation_and_transfers(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {13, 7};  // uneven blocks on 2..4 devices
  std::vector<float> global(13 * 7);
  for (std::size_t k = 0; k < global.size(); ++k) global[k] = 0.25f * static_cast<float>(k) - 3.0f;

  CHECK(T2<Rows>::random(mesh, shape, 7).to_host() == T2<Rows, Kokkos::HostSpace>::random(mesh, shape, 7).to_host());
  CHECK(T2<Both>::iota(mesh, shape).to_host() == T2<Both, Kokkos::HostSpace>::iota(mesh, shape).to_host());
  CHECK(T2<Cols>::full(mesh, shape, 1.5f).to_host() == std::vector<float>(global.size(), 1.5f));
  CHECK(T2<Cols>::zeros(mesh, shape).to_host() == std::vector<float>(global.size(), 0.0f));

  const auto a = T2<Rows>::from_host(mesh, shape, std::span<const float>(global));
  CHECK(a.to_host() == global);
  const std::vector<float> at0 = a.gather_to(0);
  CHECK(at0 == (ctx.device() == 0 ? global : std::vector<float>{}));
  const auto s = T2<Both>::scatter_from(mesh, shape, ctx.device() == 0 ? std::span<const float>(global) : std::span<const float>(), 0);
  CHECK(s.to_host() == global);

  // An array in GPU memory where from_host and scatter_from read a host array is refused, naming
  // the tensor, for tensors in either memory (with CUDA; a host array is never taken for one).
  CHECK(sl::detail::gpu_only_memory_device(global.data()) == -1);
  if constexpr (!sl::detail::host_memory_v<Mem>) {
    Kokkos::View<float*, Mem> on_gpu("on_gpu", global.size());
    const std::span<const float> g(on_gpu.data(), global.size());
    CHECK(sl::detail::gpu_only_memory_device(g.data()) >= 0);
    CHECK_THROWS_WITH_AS(T2<Rows>::from_host(mesh, shape, g), doctest::Contains("is in the memory of GPU"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS((T2<Rows, Kokkos::HostSpace>::from_host(mesh, shape, g)),
                         doctest::Contains("with Spec<\"x\", none> is in the memory of GPU"), std::invalid_argument);
    // Checked on root, with the shape: every device throws root's error (none waits in the scatter).
    CHECK_THROWS_WITH_AS(T2<Both>::scatter_from(mesh, shape, ctx.device() == 0 ? g : std::span<const float>(), 0),
                         doctest::Contains("scatter_from from device 0: an array in the memory of GPU"),
                         std::invalid_argument);
  }

  // A partial-sum tensor made from a global value holds it on coordinate 0 of "y": the sum is it.
  const auto p = T2<RowsPartial>::from_host(mesh, shape, std::span<const float>(global));
  CHECK(p.to_host() == global);
  CHECK(T2<Rows>(p).to_host() == global);
  CHECK(p.gather_to(0) == (ctx.device() == 0 ? global : std::vector<float>{}));

  // Reshards between every pair of these specs give the same global tensor.
  const T2<Cols> c = a;
  const T2<Both> b = c;
  const T2<Replicated> r = b;
  const T2<Rows> back = r;
  CHECK(c.to_host() == global);
  CHECK(b.to_host() == global);
  CHECK(r.to_host() == global);
  CHECK(back.to_host() == global);

  // Blocks come from the device's block cache in that memory, counted as activations.
  CHECK(sl::memory_usage<Mem>(ctx).activations() >= a.block().num_elements() * std::int64_t{sizeof(float)});
  if (sl::detail::host_memory_v<Mem>)  // host memory: the host instance; device memory: the device's own
    CHECK(static_cast<const void*>(&ctx.exec_for<Mem>()) == static_cast<const void*>(&ctx.exec()));
}

void check_loops(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {11, 6};
  const auto x = T2<Both>::random(mesh, shape, 3);
  const auto hx = T2<Both, Kokkos::HostSpace>::random(mesh, shape, 3);
  const std::vector<float> gx = hx.to_host();

  // clone: a block of its own; parallel_for writes it, with another tensor read beside it.
  auto y = x.clone();
  // (2 * w is exact: nvcc fuses the multiply-add on the GPU, and the host's sum must not differ)
  sl::parallel_for(y, x, KOKKOS_LAMBDA(const sl::Index<2>& i, float& v, const float& w) {
    v = 2.0f * w + static_cast<float>(i[0] * 10 + i[1]);
  });
  std::vector<float> want(gx.size());
  for (std::size_t k = 0; k < gx.size(); ++k)
    want[k] = 2.0f * gx[k] + static_cast<float>((static_cast<std::int64_t>(k) / 6) * 10 + static_cast<std::int64_t>(k) % 6);
  CHECK(y.to_host() == want);
  CHECK(x.to_host() == gx);  // the clone's writes did not reach x

  // map, plain and indexed.
  const auto twice = sl::map(x, Twice{});
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(twice)>, T2<Both>>);
  CHECK(twice.to_host() == sl::map(hx, Twice{}).to_host());
  CHECK(sl::map(x, PlusRow{}).to_host() == sl::map(hx, PlusRow{}).to_host());

  // parallel_reduce: sum, max and a two-tensor dot product, each element once.
  double sum = 0, dot = 0;
  float mx = gx[0];
  for (std::size_t k = 0; k < gx.size(); ++k) {
    sum += gx[k];
    dot += static_cast<double>(gx[k]) * want[k];
    mx = gx[k] > mx ? gx[k] : mx;
  }
  CHECK(sl::parallel_reduce(x, KOKKOS_LAMBDA(const sl::Index<2>&, float v) { return static_cast<double>(v); }) ==
        doctest::Approx(sum).epsilon(1e-12));
  CHECK(sl::parallel_reduce<sl::ReduceOp::max>(x, KOKKOS_LAMBDA(const sl::Index<2>&, float v) { return v; }) == mx);
  CHECK(sl::parallel_reduce(x, y, KOKKOS_LAMBDA(const sl::Index<2>&, float v, float w) { return static_cast<double>(v) * w; }) ==
        doctest::Approx(dot).epsilon(1e-12));
}

// 16-bit tensors: their conversions run in the kernels (creation, map's float compute type).
void check_16bit(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {9, 5};
  using B = sl::DistributedTensor<sl::bf16, M2, Rows, Mem>;
  const auto b = B::random(mesh, shape, 11, sl::bf16(-2.0f), sl::bf16(2.0f));
  const auto hb = sl::DistributedTensor<sl::bf16, M2, Rows, Kokkos::HostSpace>::random(mesh, shape, 11, sl::bf16(-2.0f), sl::bf16(2.0f));
  CHECK(b.to_host() == hb.to_host());
  const sl::DistributedTensor<sl::bf16, M2, Cols, Mem> c = b;  // a reshard of 16-bit blocks
  CHECK(c.to_host() == hb.to_host());

  const auto h = sl::map(sl::DistributedTensor<sl::f16, M2, Both, Mem>::iota(mesh, shape), Twice{});  // f16 -> float -> f16
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(h)>::value_type, sl::f16>);
  std::vector<sl::f16> want(9 * 5);
  for (std::size_t k = 0; k < want.size(); ++k) want[k] = sl::f16(2.0f * static_cast<float>(k));
  CHECK(h.to_host() == want);
  CHECK(sl::parallel_reduce(h, KOKKOS_LAMBDA(const sl::Index<2>&, sl::f16 v) { return static_cast<double>(static_cast<float>(v)); }) ==
        doctest::Approx(2.0 * 44 * 45 / 2));

  // The conversions in the kernels (on a GPU its cvt instructions) give the host's values: every
  // f16 to float; floats at the rounding ties, subnormals, overflow, infinities, NaN and random
  // bit patterns to f16 and bf16 (a NaN stays a NaN; its bits may differ).
  // (On the mesh and spec of the rest of this file: nvcc 13.0's front end crashed on a
  // one-dimensional mesh type added to it.)
  std::vector<sl::f16> all(65536);
  for (std::size_t k = 0; k < all.size(); ++k) all[k] = sl::f16::from_bits(static_cast<std::uint16_t>(k));
  const std::int64_t patterns[2] = {256, 256};
  const auto wide = sl::cast<float>(sl::DistributedTensor<sl::f16, M2, Rows, Mem>::from_host(mesh, patterns, std::span<const sl::f16>(all)))
                        .to_host();
  for (std::size_t k = 0; k < all.size(); ++k)
    if (!(std::isnan(wide[k]) && std::isnan(float(all[k])))) REQUIRE(std::bit_cast<std::uint32_t>(wide[k]) == std::bit_cast<std::uint32_t>(float(all[k])));
  std::vector<float> f = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 1e30f, -1e30f, 6e-8f, 3e-8f, 2.98e-8f, 1e-40f, -1e-45f,
                          1.00048828125f, 1.00146484375f, 1.00390625f, 1.01171875f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
  std::mt19937 g(17);
  while (f.size() < 4096) f.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(g())));
  const std::int64_t count[2] = {64, 64};
  const auto ft = T2<Rows>::from_host(mesh, count, std::span<const float>(f));
  const auto to_f16 = sl::cast<sl::f16>(ft).to_host();
  const auto to_bf16 = sl::cast<sl::bf16>(ft).to_host();
  for (std::size_t k = 0; k < f.size(); ++k) {
    CAPTURE(f[k]);
    if (std::isnan(f[k])) {
      REQUIRE(std::isnan(float(to_f16[k])));
      REQUIRE(std::isnan(float(to_bf16[k])));
    } else {
      REQUIRE(to_f16[k].bits() == sl::f16(f[k]).bits());
      REQUIRE(to_bf16[k].bits() == sl::bf16(f[k]).bits());
    }
  }
}

/// a * b + c, for zip.
struct MulAdd {
  KOKKOS_INLINE_FUNCTION float operator()(float a, float b, float c) const { return a * b + c; }
};

/// Whether `got` equals `want` to float round-off: a GPU's exp and erf and its fused multiply-adds
/// may round differently from the host's vector math; in host memory the two are the same program.
bool close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  bool ok = got.size() == want.size();
  for (std::size_t k = 0; ok && k < got.size(); ++k) ok = std::abs(got[k] - want[k]) <= 1e-5f * (1.0f + std::abs(want[k]));
  if (!ok) FAIL_CHECK(what << ": differs from the same op on host memory");
  return ok;
}

// The elementwise ops run as kernels in the tensors' memory: dense and broadcast operands, a
// reshard of an operand, scalars, unary math, partial operands kept partial, casts, zip.
void check_elementwise(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {11, 6};
  const auto a = T2<Both>::random(mesh, shape, 5, -2.0f, 2.0f);
  const auto b = T2<Rows>::random(mesh, shape, 6, -2.0f, 2.0f);
  const auto ha = T2<Both, Kokkos::HostSpace>::random(mesh, shape, 5, -2.0f, 2.0f);
  const auto hb = T2<Rows, Kokkos::HostSpace>::random(mesh, shape, 6, -2.0f, 2.0f);
  using V = sl::DistributedTensor<float, M2, sl::Spec<"y">, Mem>;  // a row broadcast down the columns
  const std::int64_t vshape[1] = {6};
  const auto v = V::random(mesh, vshape, 7);
  const auto hv = sl::DistributedTensor<float, M2, sl::Spec<"y">, Kokkos::HostSpace>::random(mesh, vshape, 7);

  const auto sum = a + b * 2.0f - 1.0f;  // b resharded to a's layout in device memory
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(sum)>, T2<Both>>);
  close(sum.to_host(), (ha + hb * 2.0f - 1.0f).to_host(), "a + b * 2 - 1");
  close((sl::gelu(a) / (sl::exp(b) + 1.0f)).to_host(), (sl::gelu(ha) / (sl::exp(hb) + 1.0f)).to_host(), "gelu(a) / (exp(b) + 1)");
  close((sl::tanh(a) * v - sl::sqrt(sl::abs(b))).to_host(), (sl::tanh(ha) * hv - sl::sqrt(sl::abs(hb))).to_host(),
        "tanh(a) * v - sqrt(|b|), v broadcast");
  close(sl::zip(MulAdd{}, a, b, v).to_host(), sl::zip(MulAdd{}, ha, hb, hv).to_host(), "zip(a * b + v)");

  // A partial-sum operand stays partial through a linear op; its sum is the op of the sum.
  std::vector<float> global(11 * 6);
  for (std::size_t k = 0; k < global.size(); ++k) global[k] = 0.5f * static_cast<float>(k) - 7.0f;
  const auto p = T2<RowsPartial>::from_host(mesh, shape, std::span<const float>(global));
  const auto p3 = p * 3.0f;
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(p3)>, T2<RowsPartial>>);
  std::vector<float> want(global.size());
  for (std::size_t k = 0; k < global.size(); ++k) want[k] = 3.0f * global[k];
  CHECK(p3.to_host() == want);

  // Casts: to bf16 and back, in the kernels.
  const auto round_trip = sl::cast<float>(sl::cast<sl::bf16>(a));
  CHECK(round_trip.to_host() == sl::cast<float>(sl::cast<sl::bf16>(ha)).to_host());
}

/// Whether `got` equals `want` to the rounding of a float32 product over `k` terms: cuBLAS sums in
/// another order than the host's BLAS.
bool close_product(const std::vector<float>& got, const std::vector<float>& want, float k, const std::string& what) {
  bool ok = got.size() == want.size();
  for (std::size_t i = 0; ok && i < got.size(); ++i) ok = std::abs(got[i] - want[i]) <= 1e-6f * k * (1.0f + std::abs(want[i]));
  if (!ok) FAIL_CHECK(what << ": differs from the same product on host memory");
  return ok;
}

// The contractions run in the tensors' memory (cuBLAS on a GPU): operands in place, transposed,
// permuted (packed first), with a summed label, batched, a partial-sum result, matmul_add, and
// 16-bit operands (float32 accumulation).
void check_contractions(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t xs[2] = {10, 12}, ws[2] = {12, 7}, wts[2] = {7, 12};
  const auto x = T2<Rows>::random(mesh, xs, 21);
  const auto hx = T2<Rows, Kokkos::HostSpace>::random(mesh, xs, 21);
  const auto w = T2<Cols>::random(mesh, ws, 22);
  const auto hw = T2<Cols, Kokkos::HostSpace>::random(mesh, ws, 22);
  const auto wt = T2<Replicated>::random(mesh, wts, 23);
  const auto hwt = T2<Replicated, Kokkos::HostSpace>::random(mesh, wts, 23);
  close_product(sl::matmul(x, w).to_host(), sl::matmul(hx, hw).to_host(), 12, "matmul");
  close_product(sl::einsum<"ij,kj->ik">(x, wt).to_host(), sl::einsum<"ij,kj->ik">(hx, hwt).to_host(), 12, "x wt^T");
  close_product(sl::einsum<"ij,jk->ki">(x, w).to_host(), sl::einsum<"ij,jk->ki">(hx, hw).to_host(), 12, "(x w)^T");
  close_product(sl::einsum<"ij,kj->i">(x, wt).to_host(), sl::einsum<"ij,kj->i">(hx, hwt).to_host(), 84, "summed k");
  // A contraction over the split dim: a partial-sum result, resolved by the reshard.
  const auto xc = T2<Cols>::random(mesh, xs, 24);
  const auto hxc = T2<Cols, Kokkos::HostSpace>::random(mesh, xs, 24);
  const auto wr = sl::DistributedTensor<float, M2, sl::Spec<"y", none>, Mem>::random(mesh, ws, 25);
  const auto hwr = sl::DistributedTensor<float, M2, sl::Spec<"y", none>, Kokkos::HostSpace>::random(mesh, ws, 25);
  close_product(sl::matmul(xc, wr).to_host(), sl::matmul(hxc, hwr).to_host(), 12, "partial x w");
  // Batched, with a permuted operand (packed first) and a permuted output.
  using T3 = sl::DistributedTensor<float, M2, sl::Spec<"x", none, none>, Mem>;
  using H3 = sl::DistributedTensor<float, M2, sl::Spec<"x", none, none>, Kokkos::HostSpace>;
  const std::int64_t as[3] = {4, 5, 6}, bs[3] = {4, 6, 3};
  const auto a3 = T3::random(mesh, as, 26), b3 = T3::random(mesh, bs, 27);
  const auto ha3 = H3::random(mesh, as, 26);
  const auto hb3 = H3::random(mesh, bs, 27);
  close_product(sl::einsum<"bij,bjk->bik">(a3, b3).to_host(), sl::einsum<"bij,bjk->bik">(ha3, hb3).to_host(), 6, "batched");
  close_product(sl::einsum<"bij,bjk->kbi">(a3, b3).to_host(), sl::einsum<"bij,bjk->kbi">(ha3, hb3).to_host(), 6, "permuted");
  const std::int64_t ats[3] = {4, 6, 5};
  close_product(sl::einsum<"bji,bjk->bik">(sl::DistributedTensor<float, M2, sl::Spec<"x", none, none>, Mem>::random(mesh, ats, 28), b3)
                    .to_host(),
                sl::einsum<"bji,bjk->bik">(H3::random(mesh, ats, 28), hb3).to_host(), 6, "transposed batch operand");
  // matmul_add: c folded into the GEMM (beta = 1).
  const auto c = sl::matmul(x, w);
  const auto hc = sl::matmul(hx, hw);
  close_product(sl::matmul_add(x, w, c).to_host(), sl::matmul_add(hx, hw, hc).to_host(), 24, "matmul_add");
  // 16-bit operands: float32 accumulation, the result rounded once to bf16.
  using B2 = sl::DistributedTensor<sl::bf16, M2, Rows, Mem>;
  using HB2 = sl::DistributedTensor<sl::bf16, M2, Rows, Kokkos::HostSpace>;
  const auto bx = B2::random(mesh, xs, 29);
  const auto hbx = HB2::random(mesh, xs, 29);
  const auto bw = sl::cast<sl::bf16>(w);
  const auto hbw = sl::cast<sl::bf16>(hw);
  const auto bp = sl::matmul(bx, bw);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(bp)>::value_type, sl::bf16>);
  const auto got16 = sl::cast<float>(bp).to_host(), want16 = sl::cast<float>(sl::matmul(hbx, hbw)).to_host();
  bool ok = got16.size() == want16.size();
  for (std::size_t i = 0; ok && i < got16.size(); ++i) ok = std::abs(got16[i] - want16[i]) <= 1.0f / 128 * (1.0f + std::abs(want16[i]));
  CHECK_MESSAGE(ok, "bf16 matmul differs from the host's beyond one bf16 rounding");
}

// sum, mean, max and min along a dim run in the tensors' memory: along a split dim the result is
// partial (resolved by a reshard in that memory), along a whole one local; bf16 through float32.
void check_reductions(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {9, 10};
  const auto a = T2<Both>::random(mesh, shape, 31, -3.0f, 3.0f);
  const auto ha = T2<Both, Kokkos::HostSpace>::random(mesh, shape, 31, -3.0f, 3.0f);
  close(sl::sum<0>(a).to_host(), sl::sum<0>(ha).to_host(), "sum<0>");
  close(sl::mean<1>(a).to_host(), sl::mean<1>(ha).to_host(), "mean<1>");
  CHECK(sl::max<1, true>(a).to_host() == sl::max<1, true>(ha).to_host());
  CHECK(sl::min<0>(a).to_host() == sl::min<0>(ha).to_host());
  const auto b = sl::cast<sl::bf16>(a);
  const auto hb = sl::cast<sl::bf16>(ha);
  CHECK(sl::cast<float>(sl::max<0>(b)).to_host() == sl::cast<float>(sl::max<0>(hb)).to_host());
}

// softmax, log_softmax, layer_norm and rms_norm run in the tensors' memory: along a dim split
// over an axis (per-row statistics all-reduced over it) and along a whole one, scaled, with
// torch's gain and bias; bf16 through float32.
void check_normalizations(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {9, 10};
  const T2<Both> a = T2<Both>::random(mesh, shape, 41, -3.0f, 3.0f);
  const T2<Both, Kokkos::HostSpace> ha = T2<Both, Kokkos::HostSpace>::random(mesh, shape, 41, -3.0f, 3.0f);
  const T2<Rows> r = a;  // dim 1 whole on each device
  const T2<Rows, Kokkos::HostSpace> hr = ha;
  close(sl::softmax<1>(a).to_host(), sl::softmax<1>(ha).to_host(), "softmax<1> (split dim)");
  close(sl::softmax<0>(a, 0.5).to_host(), sl::softmax<0>(ha, 0.5).to_host(), "softmax<0>(scale 0.5)");
  close(sl::softmax<1>(r, 0.125).to_host(), sl::softmax<1>(hr, 0.125).to_host(), "softmax<1>(scale 0.125) (whole dim)");
  close(sl::log_softmax<1>(a).to_host(), sl::log_softmax<1>(ha).to_host(), "log_softmax<1>");
  close(sl::log_softmax<1>(r).to_host(), sl::log_softmax<1>(hr).to_host(), "log_softmax<1> (whole dim)");
  close(sl::layer_norm<1>(a).to_host(), sl::layer_norm<1>(ha).to_host(), "layer_norm<1>");
  close(sl::layer_norm<1>(r, 0.5).to_host(), sl::layer_norm<1>(hr, 0.5).to_host(), "layer_norm<1>(eps 0.5) (whole dim)");
  close(sl::rms_norm<0>(a).to_host(), sl::rms_norm<0>(ha).to_host(), "rms_norm<0>");
  close(sl::rms_norm<1>(r).to_host(), sl::rms_norm<1>(hr).to_host(), "rms_norm<1> (whole dim)");
  using V = sl::DistributedTensor<float, M2, sl::Spec<none>, Mem>;
  using HV = sl::DistributedTensor<float, M2, sl::Spec<none>, Kokkos::HostSpace>;
  const std::int64_t n[1] = {10};
  const auto gain = V::random(mesh, n, 42, 0.5f, 1.5f), bias = V::random(mesh, n, 43, -1.0f, 1.0f);
  const auto hgain = HV::random(mesh, n, 42, 0.5f, 1.5f), hbias = HV::random(mesh, n, 43, -1.0f, 1.0f);
  close(sl::layer_norm<1>(r, gain, bias).to_host(), sl::layer_norm<1>(hr, hgain, hbias).to_host(),
        "layer_norm<1>(gain, bias)");
  const auto b = sl::cast<sl::bf16>(a);
  const auto hb = sl::cast<sl::bf16>(ha);
  CHECK(sl::cast<float>(sl::softmax<1>(b)).to_host() == sl::cast<float>(sl::softmax<1>(hb)).to_host());
}

// The row kernels of whole rows (a GPU's row groups: 1 to 1024 threads a row, 8 or 32 elements a
// thread, longer rows in chunks, rows not a multiple of 16 bytes) at every row length a layout
// change falls on, against host memory: softmax, log_softmax, the norms, a sum along the rows.
void check_row_lengths(sl::Context& ctx) {
  using M1 = sl::Mesh<"x">;
  using R1 = sl::DistributedTensor<float, M1, sl::Spec<"x", none>, Mem>;
  using H1 = sl::DistributedTensor<float, M1, sl::Spec<"x", none>, Kokkos::HostSpace>;
  const M1 mesh(ctx, {ctx.num_devices()});
  for (const std::int64_t n : {1, 3, 8, 9, 64, 100, 256, 257, 1024, 3001, 8192, 8200, 32768, 40000}) {
    const std::int64_t shape[2] = {std::max<std::int64_t>(3, 60000 / n), n};
    const auto a = R1::random(mesh, shape, 47, -3.0f, 3.0f);
    const auto ha = H1::random(mesh, shape, 47, -3.0f, 3.0f);
    const std::string at = " of rows of " + std::to_string(n);
    close(sl::softmax<1>(a, 0.5).to_host(), sl::softmax<1>(ha, 0.5).to_host(), "softmax" + at);
    close(sl::log_softmax<1>(a).to_host(), sl::log_softmax<1>(ha).to_host(), "log_softmax" + at);
    close(sl::layer_norm<1>(a).to_host(), sl::layer_norm<1>(ha).to_host(), "layer_norm" + at);
    close(sl::rms_norm<1>(a).to_host(), sl::rms_norm<1>(ha).to_host(), "rms_norm" + at);
    const std::vector<float> got = sl::sum<1>(a).to_host(), want = sl::sum<1>(ha).to_host();
    bool ok = got.size() == want.size();  // float sums in another order: round-off of n terms of up to 3
    for (std::size_t k = 0; ok && k < got.size(); ++k) ok = std::abs(got[k] - want[k]) <= 4e-7f * 3.0f * static_cast<float>(n);
    CHECK_MESSAGE(ok, "sum<1>" << at);
  }
}

// The layout ops run in the tensors' memory: local copies, and along split dims the exchanges
// (on the device world under nccl, through host memory otherwise); take and index_add with ids in
// that memory (vocabulary-parallel: partial results); argmax's per-device answers combined.
// Exact: they move elements without arithmetic (index_add adds in the same order on both).
void check_layout(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {9, 10};
  const auto a = T2<Both>::random(mesh, shape, 51, -3.0f, 3.0f);
  const auto ha = T2<Both, Kokkos::HostSpace>::random(mesh, shape, 51, -3.0f, 3.0f);
  const T2<Rows> r = a;
  const T2<Rows, Kokkos::HostSpace> hr = ha;
  CHECK(sl::transpose<0, 1>(a).to_host() == sl::transpose<0, 1>(ha).to_host());
  CHECK(sl::reshape<"a b -> (a b)">(a).to_host() == sl::reshape<"a b -> (a b)">(ha).to_host());  // gathered
  CHECK(sl::reshape<"a b -> (a b)">(r).to_host() == sl::reshape<"a b -> (a b)">(hr).to_host());
  CHECK(sl::reshape<"a (b c) -> a b c">(a, {9, 2, 5}).to_host() == sl::reshape<"a (b c) -> a b c">(ha, {9, 2, 5}).to_host());
  CHECK(sl::slice<1>(a, 2, 7).to_host() == sl::slice<1>(ha, 2, 7).to_host());
  CHECK(sl::slice<0>(a, 1, 8).to_host() == sl::slice<0>(ha, 1, 8).to_host());
  const std::int64_t bshape[2] = {4, 10}, cshape[2] = {9, 3};
  const auto b = T2<Both>::random(mesh, bshape, 52);
  const auto hb = T2<Both, Kokkos::HostSpace>::random(mesh, bshape, 52);
  const auto c = T2<Rows>::random(mesh, cshape, 53);
  const auto hc = T2<Rows, Kokkos::HostSpace>::random(mesh, cshape, 53);
  CHECK(sl::concat<0>(a, b).to_host() == sl::concat<0>(ha, hb).to_host());
  CHECK(sl::concat<1>(a, c).to_host() == sl::concat<1>(ha, hc).to_host());  // c resharded first

  CHECK(sl::roll(a, 3, 0).to_host() == sl::roll(ha, 3, 0).to_host());
  CHECK(sl::roll<1>(a, -14).to_host() == sl::roll<1>(ha, -14).to_host());
  CHECK(sl::shift<1>(a, 2, 1.5f).to_host() == sl::shift<1>(ha, 2, 1.5f).to_host());
  CHECK(sl::shift(r, -3, 0).to_host() == sl::shift(hr, -3, 0).to_host());
  const sl::PadWidth w[2] = {{1, 2}, {3, 0}};
  for (const sl::Boundary bd : {sl::Boundary::zero(), sl::Boundary::dirichlet(2.5), sl::Boundary::periodic(),
                                sl::Boundary::reflect(), sl::Boundary::edge()})
    CHECK(sl::pad(a, w, bd).to_host() == sl::pad(ha, w, bd).to_host());
  const auto p = T2<RowsPartial>::random(mesh, shape, 54);
  const auto hp = T2<RowsPartial, Kokkos::HostSpace>::random(mesh, shape, 54);
  CHECK(sl::pad(p, w, sl::Boundary::dirichlet(1.0)).to_host() == sl::pad(hp, w, sl::Boundary::dirichlet(1.0)).to_host());

  // where with an int32 condition.
  using C2 = sl::DistributedTensor<std::int32_t, M2, Rows, Mem>;
  using HC2 = sl::DistributedTensor<std::int32_t, M2, Rows, Kokkos::HostSpace>;
  std::vector<std::int32_t> mask(9 * 10);
  for (std::size_t k = 0; k < mask.size(); ++k) mask[k] = static_cast<std::int32_t>(k % 3 == 0);
  const auto m = C2::from_host(mesh, shape, std::span<const std::int32_t>(mask));
  const auto hm = HC2::from_host(mesh, shape, std::span<const std::int32_t>(mask));
  CHECK(sl::where(m, a, r * 2.0f).to_host() == sl::where(hm, ha, hr * 2.0f).to_host());

  // take and index_add: a table split along the gathered dim (vocabulary-parallel) and not.
  const std::int64_t tshape[2] = {12, 6}, ishape[1] = {7};
  const std::vector<std::int64_t> ids = {3, 0, 11, 3, 7, 5, 10};
  using Ids = sl::DistributedTensor<std::int64_t, M2, sl::Spec<none>, Mem>;
  using HIds = sl::DistributedTensor<std::int64_t, M2, sl::Spec<none>, Kokkos::HostSpace>;
  const auto id = Ids::from_host(mesh, ishape, std::span<const std::int64_t>(ids));
  const auto hid = HIds::from_host(mesh, ishape, std::span<const std::int64_t>(ids));
  const auto table = T2<Rows>::random(mesh, tshape, 55);
  const auto htable = T2<Rows, Kokkos::HostSpace>::random(mesh, tshape, 55);
  CHECK(sl::take<0>(table, id).to_host() == sl::take<0>(htable, hid).to_host());
  const auto cols = T2<Cols>::random(mesh, tshape, 56);
  const auto hcols = T2<Cols, Kokkos::HostSpace>::random(mesh, tshape, 56);
  const std::vector<std::int64_t> col_ids = {5, 0, 2, 2, 1, 4, 3};
  const auto cid = Ids::from_host(mesh, ishape, std::span<const std::int64_t>(col_ids));
  const auto hcid = HIds::from_host(mesh, ishape, std::span<const std::int64_t>(col_ids));
  CHECK(sl::take<1>(cols, cid).to_host() == sl::take<1>(hcols, hcid).to_host());
  const std::int64_t vshape[2] = {7, 6};
  const auto v = T2<Replicated>::random(mesh, vshape, 57);
  const auto hv = T2<Replicated, Kokkos::HostSpace>::random(mesh, vshape, 57);
  CHECK(sl::index_add<0>(table, id, v).to_host() == sl::index_add<0>(htable, hid, hv).to_host());
  const std::vector<std::int64_t> bad = {3, 12, 0, 0, 0, 0, 0};
  const auto bid = Ids::from_host(mesh, ishape, std::span<const std::int64_t>(bad));
  if constexpr (sl::detail::check_indices)
    CHECK_THROWS_WITH_AS(sl::take<0>(table, bid), doctest::Contains("id 12 at position 1 is outside [0, 12)"), std::out_of_range);

  // argmax along a split dim (answers combined over the group) and a whole one, with a NaN.
  CHECK(sl::argmax<1>(a).to_host() == sl::argmax<1>(ha).to_host());
  CHECK(sl::argmax<0, true>(a).to_host() == sl::argmax<0, true>(ha).to_host());
  CHECK(sl::argmax<1>(r).to_host() == sl::argmax<1>(hr).to_host());
  std::vector<float> g = a.to_host();
  g[23] = std::nanf("");
  const auto n = T2<Both>::from_host(mesh, shape, std::span<const float>(g));
  const auto hn = T2<Both, Kokkos::HostSpace>::from_host(mesh, shape, std::span<const float>(g));
  CHECK(sl::argmax<1>(n).to_host() == sl::argmax<1>(hn).to_host());
  CHECK(sl::argmax<1>(n).to_host()[2] == 3);
}

// The sync hook (kernels::sync_count, counted per device thread): in steady state the ops wait
// for no GPU stream (elementwise, a softmax and a sum along a whole dim, a matmul with no
// communication); a transfer to the host does. On host memory (CI) the host kernels' fences are
// what it counts, and none are of a device (to_host reads host blocks without a wait).
void check_syncs(sl::Context& ctx) {
  const M2 mesh = mesh_of(ctx);
  const std::int64_t shape[2] = {12, 8}, wshape[2] = {8, 4};
  const T2<Rows> a = T2<Rows>::random(mesh, shape, 51), b = T2<Rows>::random(mesh, shape, 52);
  const auto w = T2<Replicated>::random(mesh, wshape, 53);
  auto ops = [&] {
    const auto c = a * b + 1.0f;
    const auto s = sl::softmax<1>(c, 0.5);
    const auto n = sl::layer_norm<1>(s);
    const auto m = sl::matmul(n, w);
    const sl::PadWidth pw[2] = {{0, 0}, {1, 1}};  // along the whole dim: local copies
    return sl::sum<1>(sl::slice<1>(sl::pad(sl::transpose<0, 1>(sl::transpose<0, 1>(m)), pw, sl::Boundary::periodic()), 1, 4));
  };
  (void)ops();  // the first time: the block caches fill, cuBLAS's handle is made
  const sl::kernels::SyncCount before = sl::kernels::sync_count();
  (void)ops();
  const sl::kernels::SyncCount after = sl::kernels::sync_count();
  CHECK_MESSAGE(after.device == before.device, "ops in steady state waited for the GPU stream "
                                                   << after.device - before.device << " times");
  if constexpr (sl::detail::host_memory_v<Mem>) CHECK(after.host > before.host);
  // In GPU memory the cache keeps even these small blocks (a cudaFree would wait for the GPU).
  // (12 rows over 5 or 7 devices leave the last one none: its ops allocate nothing.)
  if constexpr (!sl::detail::host_memory_v<Mem>) {
    INFO("device " << ctx.device() << " of " << ctx.num_devices() << ", live "
                   << sl::memory_usage<Mem>(ctx).to_string());
    if (a.block().num_elements() > 0) CHECK(sl::detail::block_cache<Mem>(ctx).cached_bytes() > 0);
  }
  if (ctx.num_devices() % 2 == 1) {  // mesh {n, 1}: a partial sum over "y", of one device, is the sum
    const auto p = T2<RowsPartial>::random(mesh, shape, 54);
    const auto hp = T2<RowsPartial, Kokkos::HostSpace>::random(mesh, shape, 54);
    (void)sl::reshard<Rows>(p);
    const sl::kernels::SyncCount s0 = sl::kernels::sync_count();
    const T2<Rows> q = sl::reshard<Rows>(p);  // local copies on the GPU, not through host memory
    CHECK(sl::kernels::sync_count().device == s0.device);
    CHECK(q.to_host() == sl::reshard<Rows>(hp).to_host());
  }
  const sl::kernels::SyncCount before_download = sl::kernels::sync_count();
  const std::vector<float> h = a.to_host();  // in device memory the host waits for the download
  if constexpr (!sl::detail::host_memory_v<Mem>)  // (a device whose block is empty downloads nothing)
    if (a.block().num_elements() > 0) CHECK(sl::kernels::sync_count().device > before_download.device);
  CHECK(h.size() == 96);
}

// A stencil for tensors in GPU memory: a struct with a templated KOKKOS_INLINE_FUNCTION
// operator() (nvcc has no generic __host__ __device__ lambdas). Written so that no compiler may
// fuse a multiply and an add: the same bits on a GPU as on the host.
struct Smooth {
  template <class Nb>
  KOKKOS_INLINE_FUNCTION float operator()(const sl::Index<2>& i, const Nb& nb) const {
    return 0.125f * (nb(-1, 0) + nb(1, 0) + nb(0, -2) + nb(0, 2) + nb(-1, 1) + nb(1, -1) + static_cast<float>(i[1]));
  }
};
struct ReadsTooFar {
  template <class Nb>
  KOKKOS_INLINE_FUNCTION float operator()(const sl::Index<2>&, const Nb& nb) const { return nb(2, 0); }
};

// Ghosted views and stencil_for: several steps with each ghost refresh, boundaries of four kinds,
// against host memory bit for bit (a [11, 3] grid has blocks narrower than the width 2 on 4 and
// more devices: ghost cells from several peers, packed and unpacked); the exchange's kernels; the
// checked mode's error; at(); and no stream wait in a stencil step.
void check_stencil(sl::Context& ctx, const std::int64_t (&shape)[2]) {
  const M2 mesh = mesh_of(ctx);
  const std::array<std::array<sl::Boundary, 2>, 2> boundary = {
      {{sl::Boundary::dirichlet(2.0), sl::Boundary::reflect()}, {sl::Boundary::periodic(), sl::Boundary::periodic()}}};
  auto u = T2<Both>::random(mesh, shape, 61, -1.0f, 1.0f), v = T2<Both>::zeros(mesh, shape);
  auto hu = T2<Both, Kokkos::HostSpace>::random(mesh, shape, 61, -1.0f, 1.0f), hv = T2<Both, Kokkos::HostSpace>::zeros(mesh, shape);
  auto g = sl::ghosted(u, {1, 2}, boundary);
  auto hg = sl::ghosted(hu, {1, 2}, boundary);
  CHECK(g.cells_received() == hg.cells_received());
  for (auto refresh : {sl::GhostRefresh::overlap, sl::GhostRefresh::blocking, sl::GhostRefresh::none}) {
    CAPTURE(static_cast<int>(refresh));
    for (int step = 0; step < 3; ++step) {
      if (refresh == sl::GhostRefresh::none) {
        g.exchange();
        hg.exchange();
      }
      sl::stencil_for(v, g, Smooth{}, refresh);
      sl::stencil_for(hv, hg, Smooth{}, refresh);
      std::swap(u, v);
      std::swap(hu, hv);
    }
    CHECK(u.to_host() == hu.to_host());
  }
  // at(): a cell of the block and one of the ghost layers (a copy of one cell in GPU memory).
  g.exchange();
  hg.exchange();
  const sl::ShardBox& b = u.block();
  if (b.num_elements() > 0) {
    CHECK(g.at({b.offset[0], b.offset[1]}) == hg.at({b.offset[0], b.offset[1]}));
    CHECK(g.at({b.offset[0] - 1, b.offset[1] - 2}) == hg.at({b.offset[0] - 1, b.offset[1] - 2}));
  }
  // The exchange's packing, copies within the device and unpacking are one kernel each at most,
  // however many pieces ([11, 3] on 4 and more devices: several from a peer), and two more (a
  // download and an upload) where the cells go through host memory.
  const std::uint64_t calls = sl::kernels::flop_count().kernel_calls;
  g.exchange();
  CHECK(sl::kernels::flop_count().kernel_calls - calls <= 5);
  // The checked mode finds the read beyond the widths on the GPU and reports it on the host.
  try {
    sl::stencil_for<sl::Check::on>(v, g, ReadsTooFar{});
    FAIL_CHECK("no exception for nb(2, 0) with widths (1, 2)");
  } catch (const std::out_of_range& e) {
    CHECK(std::string(e.what()).find("nb(2, 0) at global index (") != std::string::npos);
  }
  // In steady state a stencil step waits for no GPU stream (the exchange and the kernels are
  // queued; on host memory there is no device stream to count).
  sl::stencil_for(v, g, Smooth{});
  const sl::kernels::SyncCount before = sl::kernels::sync_count();
  const std::uint64_t step_calls = sl::kernels::flop_count().kernel_calls;
  sl::stencil_for(v, g, Smooth{});
  CHECK_MESSAGE(sl::kernels::sync_count().device == before.device,
                "a stencil step waited for the GPU stream " << sl::kernels::sync_count().device - before.device << " times");
  // Counted kernels of a step, however many pieces: the exchange's (above), the rows' middles,
  // then in GPU memory the shell's kernel (the rows' ends and the slabs, stencil_shell), in host
  // memory the rows' ends and per slab of the shell (2) its padded copy (one batch) and its points.
  constexpr bool host = sl::detail::host_memory_v<Mem>;
  CHECK(sl::kernels::flop_count().kernel_calls - step_calls <= 5 + (host ? 2 + 2 * 2 : 2));
}
void check_stencils(sl::Context& ctx) {
  check_stencil(ctx, {11, 9});
  check_stencil(ctx, {11, 3});
}

// A 3-D stencil reading at widths (2, 1, 3), written as Smooth is (the same bits on a GPU).
struct Smooth3 {
  template <class Nb>
  KOKKOS_INLINE_FUNCTION float operator()(const sl::Index<3>& i, const Nb& nb) const {
    return 0.0625f * (nb(-2, 0, 0) + nb(1, 0, 0) + nb(0, -1, 0) + nb(0, 1, 0) + nb(0, 0, -3) + nb(0, 0, 3) + nb(2, 1, -1) +
                      nb(0, 0, 0) + static_cast<float>(i[2]));
  }
};

// The interior as planes in shared memory (SHARDLIB_STENCIL_PLANES, stencil/planes.hpp) on a 2-D
// and a 3-D grid whose blocks take several tiles and runs of planes, with each refresh, against
// host memory (the rows' kernels) bit for bit.
template <class Spec, class F, std::size_t R>
void check_stencil_planes_of(sl::Context& ctx, const std::int64_t (&shape)[R], const std::array<int, R>& widths) {
  const M2 mesh = mesh_of(ctx);
  using G = sl::DistributedTensor<float, M2, Spec, Mem>;
  using H = sl::DistributedTensor<float, M2, Spec, Kokkos::HostSpace>;
  auto u = G::random(mesh, shape, 67, -1.0f, 1.0f), v = G::zeros(mesh, shape);
  auto hu = H::random(mesh, shape, 67, -1.0f, 1.0f), hv = H::zeros(mesh, shape);
  auto g = sl::ghosted(u, widths, sl::Boundary::periodic());
  auto hg = sl::ghosted(hu, widths, sl::Boundary::periodic());
  for (auto refresh : {sl::GhostRefresh::overlap, sl::GhostRefresh::blocking, sl::GhostRefresh::none}) {
    CAPTURE(static_cast<int>(refresh));
    if (refresh == sl::GhostRefresh::none) {
      g.exchange();
      hg.exchange();
    }
    sl::stencil_for(v, g, F{}, refresh);
    sl::stencil_for(hv, hg, F{}, refresh);
    CHECK(v.to_host() == hv.to_host());
  }
}
void check_stencil_planes(sl::Context& ctx) {
  check_stencil_planes_of<Both, Smooth>(ctx, {40, 600}, {1, 2});
  check_stencil_planes_of<Both3, Smooth3>(ctx, {40, 30, 75}, {2, 1, 3});
}

void on_devices(const std::function<void(sl::Context&)>& body) { sl::test::for_each_run_in<Mem>(body); }

TEST_SUITE("tensor_memory_space") {
  TEST_CASE("tensors in the default execution space's memory: creation, transfers and reshards against host memory") {
    on_devices(check_creation_and_transfers);
  }
  TEST_CASE("tensors in the default execution space's memory: clone and the loops against host memory") {
    on_devices(check_loops);
  }
  TEST_CASE("16-bit tensors in the default execution space's memory: creation, reshard, map and reduce") {
    on_devices(check_16bit);
  }
  TEST_CASE("the elementwise ops on tensors in the default execution space's memory against host memory") {
    on_devices(check_elementwise);
  }
  TEST_CASE("contractions on tensors in the default execution space's memory against host memory") {
    on_devices(check_contractions);
  }
  TEST_CASE("reductions on tensors in the default execution space's memory against host memory") {
    on_devices(check_reductions);
  }
  TEST_CASE("softmax and the norms on tensors in the default execution space's memory against host memory") {
    on_devices(check_normalizations);
  }
  TEST_CASE("the row kernels at every row length on tensors in the default execution space's memory against host memory") {
    on_devices(check_row_lengths);
  }
  TEST_CASE("the layout ops and argmax on tensors in the default execution space's memory against host memory") {
    on_devices(check_layout);
  }
  TEST_CASE("ops on tensors in the default execution space's memory wait for no GPU stream in steady state") {
    on_devices(check_syncs);
  }
  TEST_CASE("ghosted views and stencil_for on tensors in the default execution space's memory against host memory") {
    on_devices(check_stencils);
  }
  TEST_CASE("stencil_for's interior as planes in shared memory (SHARDLIB_STENCIL_PLANES) against host memory") {
    const sl::detail::StencilPlanesScope planes(true);
    on_devices(check_stencil_planes);
  }
}
