// SPDX-License-Identifier: Apache-2.0
/// @file
/// Contractions: `einsum<"bij,bjk->bik">(a, b)` (subscripts parsed at compile time), `matmul`.
///
/// The output spec comes from `einsum_rule` (sharding/einsum.hpp): a contracted dim split over
/// the same axes in both operands gives a partial-sum output (each device multiplies its blocks;
/// nothing moves), so Megatron's column-parallel then row-parallel pair costs one all_reduce (or
/// one reduce_scatter) when the partial result is resharded. The local product is one (batched)
/// GEMM on the blocks (kernels/gemm.hpp: Eigen, with BLAS underneath when the build found one;
/// in GPU memory kernels/cublas.hpp's cuBLAS GEMM on the device's stream): an operand whose dims
/// are already [batch..., rows..., contracted...] (or transposed) is mapped with no copy; any
/// other order is permuted into that layout first.
///
/// In shape-only mode (detail/shape_only.hpp) a contraction reshards its operands and allocates
/// its packed operands and output as always, and permutes, sums and multiplies nothing (the GEMM
/// kernels still count the FLOPs they were asked for: kernels/exec.hpp's flop_count).
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/gemm.hpp>
#include <shardlib/kernels/layout.hpp>
#include <shardlib/kernels/reduce.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/ops/elementwise.hpp>
#include <shardlib/sharding/einsum.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <shardlib/kernels/cublas.hpp>
#endif

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib {

namespace error {
/// The einsum subscripts do not parse: `What` says why, `Position` where.
template <OpName Subscripts, OpName What, int Position>
struct einsum_subscripts_do_not_parse;
/// einsum and matmul need both operands to have the same element type.
template <class A, class B>
struct einsum_operands_have_different_element_types;
}  // namespace error

namespace detail {

/// How each operand maps onto one batched GEMM C[b] = A[b] · B[b] (see the file comment).
/// Canonical orders: A [batch, free_a, summed_a, contracted], B [batch, summed_b, contracted,
/// free_b], C [batch, free_a, free_b]. perm[k] = the operand dim that goes to canonical position k.
struct EinsumLayout {
  int n_batch = 0, n_free_a = 0, n_free_b = 0, n_contract = 0, n_sum_a = 0, n_sum_b = 0;
  std::array<int, max_tensor_rank> a_perm{}, b_perm{}, c_perm{};  // c_perm: canonical -> output dim
  bool a_direct = false, a_trans = false;  // A already [batch, free, contracted] / [batch, contracted, free]
  bool b_direct = false, b_trans = false;  // B already [batch, contracted, free] / [batch, free, contracted]
  bool c_direct = false, c_trans = false;  // output already [batch, free_a, free_b] / [batch, free_b, free_a]
};

constexpr int label_pos(const std::array<char, max_tensor_rank>& l, int n, char c) {
  for (int i = 0; i < n; ++i)
    if (l[static_cast<std::size_t>(i)] == c) return i;
  return -1;
}

constexpr EinsumLayout einsum_layout(const EinsumSubscripts& s) {
  EinsumLayout L;
  const auto &la = s.in[0], &lb = s.in[1], &lo = s.out;
  const int ra = s.rank[0], rb = s.rank[1], ro = s.out_rank;
  std::array<int, max_tensor_rank> batch{}, fa{}, fb{}, con{}, sa{}, sb{};  // label positions
  for (int o = 0; o < ro; ++o) {  // output order for batch and free labels
    const char c = lo[static_cast<std::size_t>(o)];
    const int ia = label_pos(la, ra, c), ib = label_pos(lb, rb, c);
    if (ia >= 0 && ib >= 0) batch[static_cast<std::size_t>(L.n_batch++)] = o;
    else if (ia >= 0) fa[static_cast<std::size_t>(L.n_free_a++)] = o;
    else fb[static_cast<std::size_t>(L.n_free_b++)] = o;
  }
  for (int i = 0; i < ra; ++i) {  // a's order for contracted and summed labels
    const char c = la[static_cast<std::size_t>(i)];
    if (label_pos(lo, ro, c) >= 0) continue;
    if (label_pos(lb, rb, c) >= 0) con[static_cast<std::size_t>(L.n_contract++)] = i;
    else sa[static_cast<std::size_t>(L.n_sum_a++)] = i;
  }
  for (int i = 0; i < rb; ++i) {
    const char c = lb[static_cast<std::size_t>(i)];
    if (label_pos(lo, ro, c) < 0 && label_pos(la, ra, c) < 0) sb[static_cast<std::size_t>(L.n_sum_b++)] = i;
  }
  auto at = [](const std::array<char, max_tensor_rank>& l, int n, char c) { return label_pos(l, n, c); };
  auto out_label = [&](int o) { return lo[static_cast<std::size_t>(o)]; };
  auto a_label = [&](int i) { return la[static_cast<std::size_t>(i)]; };
  // A: [batch, free_a, summed_a, contracted]
  int k = 0;
  for (int i = 0; i < L.n_batch; ++i) L.a_perm[static_cast<std::size_t>(k++)] = at(la, ra, out_label(batch[static_cast<std::size_t>(i)]));
  for (int i = 0; i < L.n_free_a; ++i) L.a_perm[static_cast<std::size_t>(k++)] = at(la, ra, out_label(fa[static_cast<std::size_t>(i)]));
  for (int i = 0; i < L.n_sum_a; ++i) L.a_perm[static_cast<std::size_t>(k++)] = sa[static_cast<std::size_t>(i)];
  for (int i = 0; i < L.n_contract; ++i) L.a_perm[static_cast<std::size_t>(k++)] = con[static_cast<std::size_t>(i)];
  // B: [batch, summed_b, contracted, free_b]
  k = 0;
  for (int i = 0; i < L.n_batch; ++i) L.b_perm[static_cast<std::size_t>(k++)] = at(lb, rb, out_label(batch[static_cast<std::size_t>(i)]));
  for (int i = 0; i < L.n_sum_b; ++i) L.b_perm[static_cast<std::size_t>(k++)] = sb[static_cast<std::size_t>(i)];
  for (int i = 0; i < L.n_contract; ++i) L.b_perm[static_cast<std::size_t>(k++)] = at(lb, rb, a_label(con[static_cast<std::size_t>(i)]));
  for (int i = 0; i < L.n_free_b; ++i) L.b_perm[static_cast<std::size_t>(k++)] = at(lb, rb, out_label(fb[static_cast<std::size_t>(i)]));
  // C: [batch, free_a, free_b]
  k = 0;
  for (int i = 0; i < L.n_batch; ++i) L.c_perm[static_cast<std::size_t>(k++)] = batch[static_cast<std::size_t>(i)];
  for (int i = 0; i < L.n_free_a; ++i) L.c_perm[static_cast<std::size_t>(k++)] = fa[static_cast<std::size_t>(i)];
  for (int i = 0; i < L.n_free_b; ++i) L.c_perm[static_cast<std::size_t>(k++)] = fb[static_cast<std::size_t>(i)];

  auto identity = [](const std::array<int, max_tensor_rank>& p, int n) {
    for (int i = 0; i < n; ++i)
      if (p[static_cast<std::size_t>(i)] != i) return false;
    return true;
  };
  // Whether p is [0..nb) then the block [nb+x, nb+x+y) then [nb, nb+x): two groups swapped.
  auto swapped = [](const std::array<int, max_tensor_rank>& p, int nb, int x, int y) {
    for (int i = 0; i < nb; ++i)
      if (p[static_cast<std::size_t>(i)] != i) return false;
    for (int i = 0; i < x; ++i)
      if (p[static_cast<std::size_t>(nb + i)] != nb + y + i) return false;
    for (int i = 0; i < y; ++i)
      if (p[static_cast<std::size_t>(nb + x + i)] != nb + i) return false;
    return true;
  };
  L.a_direct = L.n_sum_a == 0 && identity(L.a_perm, ra);
  L.a_trans = L.n_sum_a == 0 && !L.a_direct && swapped(L.a_perm, L.n_batch, L.n_free_a, L.n_contract);
  L.b_direct = L.n_sum_b == 0 && identity(L.b_perm, rb);
  L.b_trans = L.n_sum_b == 0 && !L.b_direct && swapped(L.b_perm, L.n_batch, L.n_contract, L.n_free_b);
  L.c_direct = identity(L.c_perm, ro);
  L.c_trans = !L.c_direct && swapped(L.c_perm, L.n_batch, L.n_free_a, L.n_free_b);
  return L;
}

/// One operand as a batch of matrices (rows x cols after its summed labels are added up),
/// mapped in place or packed into `keep`.
template <class T, class Exec, class Alloc>
kernels::MatrixBatch<const T> einsum_operand(const Exec& exec, const T* data, const ShardBox& box, int rank,
                                             const std::array<int, max_tensor_rank>& perm, bool direct, bool trans,
                                             int n_batch, int n_rows, int n_sum, int n_cols, bool sum_first,
                                             std::shared_ptr<void>& keep, Alloc&& alloc) {
  // canonical extents: batch, rows, summed, cols (for B: rows = summed, then contracted, then free)
  std::array<std::int64_t, max_tensor_rank> ext{};
  for (int i = 0; i < rank; ++i) ext[static_cast<std::size_t>(i)] = box.extent[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
  auto prod = [&](int from, int n) {
    std::int64_t p = 1;
    for (int i = from; i < from + n; ++i) p *= ext[static_cast<std::size_t>(i)];
    return p;
  };
  // A: [batch | rows=free | sum | cols=contracted]; B: [batch | sum | rows=contracted | cols=free]
  const std::int64_t nb = prod(0, n_batch);
  const std::int64_t ns = sum_first ? prod(n_batch, n_sum) : prod(n_batch + n_rows, n_sum);
  const std::int64_t rows = sum_first ? prod(n_batch + n_sum, n_rows) : prod(n_batch, n_rows);
  const std::int64_t cols = sum_first ? prod(n_batch + n_sum + n_rows, n_cols) : prod(n_batch + n_rows + n_sum, n_cols);
  if (direct) return {data, rows, cols, cols, 1, rows * cols};
  if (trans) return {data, rows, cols, 1, rows, rows * cols};
  // Pack: permute into the canonical order, then add up the summed labels.
  std::array<std::int64_t, max_tensor_rank> in_ext{};
  for (int i = 0; i < rank; ++i) in_ext[static_cast<std::size_t>(i)] = box.extent[static_cast<std::size_t>(i)];
  const std::int64_t total = nb * ns * rows * cols;
  std::shared_ptr<void> packed = alloc(static_cast<std::size_t>(total) * sizeof(T));
  // (shape-only: the kernels count their work and return; the allocations are real)
  kernels::permute(exec, data, static_cast<T*>(packed.get()), rank, in_ext.data(), perm.data());
  if (n_sum == 0) {
    keep = packed;
    return {static_cast<const T*>(packed.get()), rows, cols, cols, 1, rows * cols};
  }
  keep = alloc(static_cast<std::size_t>(nb * rows * cols) * sizeof(T));
  T* summed = static_cast<T*>(keep.get());
  if (sum_first) kernels::reduce_dim(exec, static_cast<const T*>(packed.get()), summed, nb, ns, rows * cols, kernels::ReduceKind::sum);
  else kernels::reduce_dim(exec, static_cast<const T*>(packed.get()), summed, nb * rows, ns, cols, kernels::ReduceKind::sum);
  return {summed, rows, cols, cols, 1, rows * cols};
}

/// The output's global shape (into `shape`) from the operands' extents per label; throws
/// std::invalid_argument when a label shared by both operands has two extents.
SHARDLIB_NOINLINE inline void einsum_shape(const char* name, const char* sub, const EinsumSubscripts& s,
                                           const OperandInfo& a, const OperandInfo& b, std::int64_t* shape) {
  for (int o = 0; o < s.out_rank; ++o) {
    const char c = s.out[static_cast<std::size_t>(o)];
    const int ia = label_pos(s.in[0], s.rank[0], c);
    shape[o] = ia >= 0 ? a.shape[static_cast<std::size_t>(ia)]
                       : b.shape[static_cast<std::size_t>(label_pos(s.in[1], s.rank[1], c))];
  }
  for (int i = 0; i < s.rank[0]; ++i) {
    const int j = label_pos(s.in[1], s.rank[1], s.in[0][static_cast<std::size_t>(i)]);
    if (j >= 0 && a.shape[static_cast<std::size_t>(i)] != b.shape[static_cast<std::size_t>(j)])
      throw std::invalid_argument(std::string("shardlib: ") + name + " \"" + sub + "\": label '" +
                                  s.in[0][static_cast<std::size_t>(i)] + "' has extent " +
                                  std::to_string(a.shape[static_cast<std::size_t>(i)]) + " in " + operand_text(a) +
                                  " but " + std::to_string(b.shape[static_cast<std::size_t>(j)]) + " in " +
                                  operand_text(b));
  }
}

/// What a device keeps for its GPU products: its cuBLAS handle, on its stream (made on first use).
struct DeviceGemmState {
#if defined(KOKKOS_ENABLE_CUDA)
  std::unique_ptr<kernels::CublasHandle> cublas;
#endif
};

/// The batched GEMM of a contraction on blocks in device memory `Mem`: cuBLAS on the device's
/// stream (CUDA); other device backends have none yet.
template <class T, class Mem>
void device_gemm([[maybe_unused]] Context& ctx, [[maybe_unused]] std::int64_t batch,
                 [[maybe_unused]] const kernels::MatrixBatch<const T>& a, [[maybe_unused]] const kernels::MatrixBatch<const T>& b,
                 [[maybe_unused]] const kernels::MatrixBatch<T>& c, [[maybe_unused]] bool accumulate) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<exec_space_t<Mem>, Kokkos::Cuda>) {
    auto& state = ctx.state<DeviceGemmState>();
    if (!state.cublas) state.cublas = std::make_unique<kernels::CublasHandle>(ctx.exec_for<Mem>());
    kernels::cublas_gemm<T>(*state.cublas, batch, a, b, c, 1, accumulate ? 1 : 0);
  } else
#endif
  {
    static_assert(host_memory_v<Mem> && !host_memory_v<Mem>,
                  "shardlib: einsum and matmul in device memory need CUDA (cuBLAS) for now");
  }
}

/// In GPU memory, the most GEMM calls an in-place contraction makes (one per outer batch index:
/// each a launch); past it the operands are permuted into one strided batch instead.
inline constexpr std::int64_t max_in_place_calls = 64;

/// A contraction whose operands need no copy: each is a batch of matrices read in place with
/// strides, the batch labels split into outer ones (a loop on the host, one GEMM call each) and
/// inner ones (the GEMM's strided batch). Attention's products on [B, S, H, K] blocks are the
/// case: "bshk,bthk->bhst" batches over b and h, whose strides in q (S*H*K and K) are no single
/// stride, so a GEMM per b over a batch of h reads q, k and v in place (ld = H*K) where a permute
/// into [B, H, S, K] would first copy each one (12 such copies were 0.8 ms of a float32 GPT-2
/// layer's 5.8 ms step on an H100).
struct EinsumInPlace {
  struct Operand {
    std::int64_t rows = 1, cols = 1, row_stride = 0, col_stride = 0, inner_stride = 0;
    std::array<std::int64_t, max_tensor_rank> outer_stride{};
  };
  Operand a, b, c;
  int n_outer = 0;                                  // outer batch labels (canonical order)
  std::array<std::int64_t, max_tensor_rank> outer{};  // their extents
  std::int64_t inner = 1;                           // the strided batch's count
  std::int64_t outer_count() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < n_outer; ++i) n *= outer[static_cast<std::size_t>(i)];
    return n;
  }
};

/// Canonical positions [from, from + count) of a row-major block (extents `ext`, dims through
/// `perm`) as one extent and stride, when they merge (extent-1 dims aside); false otherwise.
inline bool merge_dims(const std::int64_t* ext, const std::array<int, max_tensor_rank>& perm, int rank, int from, int count,
                       std::int64_t& extent, std::int64_t& stride) {
  std::array<std::int64_t, max_tensor_rank> st{};
  std::int64_t m = 1;
  for (int d = rank; d-- > 0;) {
    st[static_cast<std::size_t>(d)] = m;
    m *= ext[d];
  }
  extent = 1;
  stride = 0;
  bool any = false;
  for (int i = from; i < from + count; ++i) {
    const int d = perm[static_cast<std::size_t>(i)];
    if (ext[d] == 1) continue;
    if (any && stride != ext[d] * st[static_cast<std::size_t>(d)]) return false;
    extent *= ext[d];
    stride = st[static_cast<std::size_t>(d)];
    any = true;
  }
  return true;
}

/// The in-place plan of a contraction with no summed labels, or false when an operand's rows,
/// columns or inner batch do not merge into single strides, or its matrices have no unit stride
/// (the permuting path then runs). `max_ld`: the GEMM's largest leading dimension. The fewest
/// outer labels that work are taken (the largest strided batch).
inline bool einsum_in_place(const EinsumSubscripts& s, const EinsumLayout& L, const ShardBox& a_box, const ShardBox& b_box,
                            const ShardBox& c_box, std::int64_t max_ld, EinsumInPlace& plan) {
  if (L.n_sum_a != 0 || L.n_sum_b != 0) return false;
  if (a_box.num_elements() == 0 || b_box.num_elements() == 0 || c_box.num_elements() == 0) return false;
  const int nb = L.n_batch;
  struct Side {
    const std::int64_t* ext;
    const std::array<int, max_tensor_rank>* perm;
    int rank, rows_from, rows_n, cols_from, cols_n;
    EinsumInPlace::Operand* out;
  };
  const Side sides[3] = {
      {a_box.extent.data(), &L.a_perm, s.rank[0], nb, L.n_free_a, nb + L.n_free_a, L.n_contract, &plan.a},
      {b_box.extent.data(), &L.b_perm, s.rank[1], nb, L.n_contract, nb + L.n_contract, L.n_free_b, &plan.b},
      {c_box.extent.data(), &L.c_perm, s.out_rank, nb, L.n_free_a, nb + L.n_free_a, L.n_free_b, &plan.c}};
  for (const Side& x : sides) {
    EinsumInPlace::Operand& o = *x.out;
    std::int64_t rs = 0, cs = 0;
    if (!merge_dims(x.ext, *x.perm, x.rank, x.rows_from, x.rows_n, o.rows, rs) ||
        !merge_dims(x.ext, *x.perm, x.rank, x.cols_from, x.cols_n, o.cols, cs))
      return false;
    o.row_stride = rs;
    o.col_stride = cs;
    if (kernels::detail::gemm_operand(o.rows, o.cols, rs, cs, max_ld).layout == kernels::detail::GemmLayout::packed) return false;
  }
  for (int p = 0; p <= nb; ++p) {  // labels [0, p) outer, [p, nb) the strided batch
    bool ok = true;
    std::int64_t inner = 1;
    for (const Side& x : sides) {
      std::int64_t stride = 0;
      ok = ok && merge_dims(x.ext, *x.perm, x.rank, p, nb - p, inner, stride);
      x.out->inner_stride = stride;
    }
    if (!ok) continue;
    plan.n_outer = p;
    plan.inner = inner;
    for (int i = 0; i < p; ++i) {
      plan.outer[static_cast<std::size_t>(i)] = c_box.extent[static_cast<std::size_t>(L.c_perm[static_cast<std::size_t>(i)])];
      for (const Side& x : sides) {
        std::int64_t e = 0, st = 0;
        merge_dims(x.ext, *x.perm, x.rank, i, 1, e, st);
        x.out->outer_stride[static_cast<std::size_t>(i)] = e == 1 ? 0 : st;
      }
    }
    // The strided batch's matrices are written at once: they must not overlap in C.
    const EinsumInPlace::Operand& c = plan.c;
    if (!kernels::matrices_apart(inner, c.rows, c.cols, c.row_stride, c.col_stride, c.inner_stride)) continue;
    return true;
  }
  return false;
}

/// Runs an in-place plan: a GEMM call per outer index (kernels::gemm on the host, cuBLAS in GPU
/// memory), each over the plan's strided batch (in shape-only mode each call checks and counts
/// its FLOPs, kernels/exec.hpp, and computes nothing).
template <class T, class Mem>
void einsum_run_in_place(Context& ctx, const EinsumInPlace& plan, const T* a, const T* b, T* c, bool accumulate) {
  const std::int64_t count = plan.outer_count();
  for (std::int64_t o = 0; o < count; ++o) {
    std::int64_t rest = o, oa = 0, ob = 0, oc = 0;
    for (int i = plan.n_outer; i-- > 0;) {
      const auto u = static_cast<std::size_t>(i);
      const std::int64_t k = rest % plan.outer[u];
      rest /= plan.outer[u];
      oa += k * plan.a.outer_stride[u];
      ob += k * plan.b.outer_stride[u];
      oc += k * plan.c.outer_stride[u];
    }
    const bool batched = plan.inner > 1;
    const kernels::MatrixBatch<const T> ma{a + oa, plan.a.rows, plan.a.cols, plan.a.row_stride, plan.a.col_stride,
                                           batched ? plan.a.inner_stride : 0};
    const kernels::MatrixBatch<const T> mb{b + ob, plan.b.rows, plan.b.cols, plan.b.row_stride, plan.b.col_stride,
                                           batched ? plan.b.inner_stride : 0};
    const kernels::MatrixBatch<T> mc{c + oc, plan.c.rows, plan.c.cols, plan.c.row_stride, plan.c.col_stride,
                                     batched ? plan.c.inner_stride : 0};
    if constexpr (host_memory_v<Mem>) kernels::gemm<T>(plan.inner, ma, mb, mc, T(1), accumulate ? T(1) : T(0));
    else device_gemm<T, Mem>(ctx, plan.inner, ma, mb, mc, accumulate);
  }
}

/// The runtime part of a contraction, compiled once per element type and memory space: the
/// operands in the rule's layouts (resharded where theirs differ), each mapped or packed into a
/// matrix batch, one batched GEMM into the output block `c_out` (`c_box`). With `accumulate` the
/// product is added to what `c_out` holds (the GEMM's beta = 1: einsum_add); the output must then
/// be the GEMM's C as it is (`L.c_direct` or `L.c_trans`).
template <class T, class Mem>
SHARDLIB_NOINLINE void einsum_run(const char* name, const EinsumSubscripts& s, const EinsumLayout& L,
                                  const OpRule& rule, const OperandRef<T>& a, const OperandRef<T>& b, T* c_out,
                                  const ShardBox& c_box, bool accumulate = false) {
  const Block<T> ba = block_as<Mem>(a, rule.in[0]);
  const Block<T> bb = block_as<Mem>(b, rule.in[1]);
  Context& ctx = *a.ctx;
  auto alloc = [cache = &block_cache<Mem>(ctx)](std::size_t bytes) { return cache->allocate(bytes); };
  auto guard = kernel_guard(ctx, false);
  const auto& exec = ctx.exec_for<Mem>();
  // An operand or the output that is no [batch, rows, cols] matrix batch as it lies: read and
  // write them in place with strides where they allow it (EinsumInPlace), else permute.
  if (!((L.a_direct || L.a_trans) && (L.b_direct || L.b_trans) && (L.c_direct || L.c_trans))) {
    EinsumInPlace plan;
    if (einsum_in_place(s, L, ba.box, bb.box, c_box, host_memory_v<Mem> ? kernels::detail::gemm_index_limit<T>() : INT_MAX,
                        plan) &&
        (host_memory_v<Mem> || plan.outer_count() <= max_in_place_calls)) {
      einsum_run_in_place<T, Mem>(ctx, plan, ba.data, bb.data, c_out, accumulate);
      return;
    }
  }
  std::shared_ptr<void> keep_a, keep_b, keep_c;
  const auto ma = einsum_operand<T>(exec, ba.data, ba.box, s.rank[0], L.a_perm, L.a_direct, L.a_trans, L.n_batch,
                                    L.n_free_a, L.n_sum_a, L.n_contract, false, keep_a, alloc);
  const auto mb = einsum_operand<T>(exec, bb.data, bb.box, s.rank[1], L.b_perm, L.b_direct, L.b_trans, L.n_batch,
                                    L.n_contract, L.n_sum_b, L.n_free_b, true, keep_b, alloc);
  std::int64_t nb = 1;
  for (int i = 0; i < L.n_batch; ++i) nb *= c_box.extent[static_cast<std::size_t>(L.c_perm[static_cast<std::size_t>(i)])];
  const std::int64_t m = ma.rows, n = mb.cols, mn = m * n;
  if (ma.cols != mb.rows || nb * mn != c_box.num_elements())
    throw std::logic_error("shardlib: internal error: " + std::string(name) + " blocks do not line up (" +
                           std::to_string(ma.rows) + "x" + std::to_string(ma.cols) + " times " + std::to_string(mb.rows) +
                           "x" + std::to_string(mb.cols) + ")");
  T* c = c_out;
  if (accumulate && !L.c_direct && !L.c_trans)
    throw std::logic_error("shardlib: internal error: " + std::string(name) + " accumulates into a permuted output");
  if (!L.c_direct && !L.c_trans) {
    keep_c = alloc(static_cast<std::size_t>(nb * mn) * sizeof(T));
    c = static_cast<T*>(keep_c.get());
  }
  const kernels::MatrixBatch<T> mc = L.c_trans ? kernels::MatrixBatch<T>{c, m, n, 1, m, mn}
                                               : kernels::MatrixBatch<T>{c, m, n, n, 1, mn};
  const kernels::MatrixBatch<const T> a_batch{ma.data, m, ma.cols, ma.row_stride, ma.col_stride, nb > 1 ? ma.batch_stride : 0};
  const kernels::MatrixBatch<const T> b_batch{mb.data, mb.rows, n, mb.row_stride, mb.col_stride, nb > 1 ? mb.batch_stride : 0};
  if constexpr (host_memory_v<Mem>) kernels::gemm<T>(nb, a_batch, b_batch, mc, T(1), accumulate ? T(1) : T(0));
  else device_gemm<T, Mem>(ctx, nb, a_batch, b_batch, mc, accumulate);
  if (keep_c) {  // canonical [batch, free_a, free_b] -> the output's order
    std::array<std::int64_t, max_tensor_rank> ext{};
    std::array<int, max_tensor_rank> inv{};
    for (int i = 0; i < s.out_rank; ++i) {
      ext[static_cast<std::size_t>(i)] = c_box.extent[static_cast<std::size_t>(L.c_perm[static_cast<std::size_t>(i)])];
      inv[static_cast<std::size_t>(L.c_perm[static_cast<std::size_t>(i)])] = i;
    }
    kernels::permute(exec, static_cast<const T*>(c), c_out, s.out_rank, ext.data(), inv.data());
  }
}

/// The einsum op on tensors `a`, `b` with parsed subscripts `S` (compile-time string).
/// Whether a contraction of 16-bit operands in `Mem` casts them to float first: on the host (the
/// BLAS has no 16-bit GEMM), and where a label is summed over one operand (its sum in float32). On
/// a GPU, cuBLAS multiplies the 16-bit blocks with float32 accumulation itself.
template <OpName Sub, class Mem>
constexpr bool einsum_casts_16bit() {
  constexpr EinsumSubscripts s = parse_einsum(std::string_view(Sub.text));
  if constexpr (s.status != OpRule::ok) return true;
  else return host_memory_v<Mem> || einsum_layout(s).n_sum_a > 0 || einsum_layout(s).n_sum_b > 0;
}

template <OpName Name, OpName Sub, class A, class B>
auto einsum_op(const A& a, const B& b) {
  if constexpr (is_half_v<typename A::value_type> && std::is_same_v<typename A::value_type, typename B::value_type> &&
                einsum_casts_16bit<Sub, typename A::memory_space>()) {
    // float32 products and sums (cuBLAS's GemmEx with float32 accumulation), the result rounded once
    return shardlib::cast<typename A::value_type>(einsum_op<Name, Sub>(shardlib::cast<float>(a), shardlib::cast<float>(b)));
  } else {
    static constexpr EinsumSubscripts s = parse_einsum(std::string_view(Sub.text));
    SHARDLIB_STATIC_REQUIRE((s.status == OpRule::ok), "shardlib: einsum subscripts do not parse",
                            error::einsum_subscripts_do_not_parse<Sub, OpName(s.error), s.error_pos>);
    SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename A::mesh_type, typename B::mesh_type>),
                            "shardlib: einsum operands on different mesh types",
                            error::op_operands_are_on_different_meshes<Name, typename A::mesh_type, typename B::mesh_type>);
    using T = typename A::value_type;
    SHARDLIB_STATIC_REQUIRE((std::is_same_v<T, typename B::value_type>),
                            "shardlib: einsum operands need the same element type",
                            error::einsum_operands_have_different_element_types<T, typename B::value_type>);
    SHARDLIB_STATIC_REQUIRE((std::is_same_v<typename A::memory_space, typename B::memory_space>),
                            "shardlib: einsum operands in different memory spaces",
                            error::op_operands_are_in_different_memory_spaces<Name, typename A::memory_space,
                                                                              typename B::memory_space>);
    static constexpr OpRule rule = s.status == OpRule::ok && s.n_in == 2 ? einsum_rule(s, A::sharding, B::sharding) : OpRule{};
    SHARDLIB_STATIC_REQUIRE((s.status != OpRule::ok || s.n_in == 2 || rule.status == OpRule::ok),
                            "shardlib: einsum of two tensors needs two operands in its subscripts",
                            error::op_has_no_sharding_rule_for_these_specs<Name, OpRule::rank_mismatch,
                                                                           typename A::spec_type, typename B::spec_type>);
    SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for this contraction and these specs",
                            error::op_has_no_sharding_rule_for_these_specs<Name, rule.status, typename A::spec_type,
                                                                           typename B::spec_type>);
    using MeshT = typename A::mesh_type;
    using Mem = typename A::memory_space;
    // (After an error above: replicated, of the subscripts' output rank, so that the ops that
    // take the result report nothing more.)
    using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] {
                                    if (rule.status == OpRule::ok) return rule.out;
                                    Sharding replicated;
                                    replicated.rank = s.out_rank;
                                    return replicated;
                                  })>,
                                  Mem>;
    static constexpr EinsumLayout L = einsum_layout(s);
    check_same_mesh(Name.text, a, b);
    typename Out::Shape shape{};
    einsum_shape(Name.text, Sub.text, s, info(a), info(b), shape.data());
    Out out(a.mesh(), shape);
    einsum_run<T, Mem>(Name.text, s, L, rule, ref(a), ref(b), out.local().data(), out.block());
    return out;
  }
}

/// `c + einsum<Sub>(a, b)`, with `c` folded into the GEMM (its beta = 1) where that gives the same
/// tensor: `c` lies as the product does (same type: element type, mesh, spec and memory space,
/// so the add's rule keeps the product's layout, partial clause included), the add's output
/// type is the product's, the output needs no permute after the GEMM (its dims in the GEMM's
/// order or transposed) and `c` has the product's shape. The output starts as `c`'s block (taken
/// over when `c` is an rvalue whose block nobody else shares, copied otherwise) and the GEMM adds
/// the product to it. Every other case computes `c + einsum<Sub>(a, b)` as written.
template <OpName Name, OpName Sub, class A, class B, class C>
auto einsum_add_op(const A& a, const B& b, C&& c) {
  using CT = std::remove_cvref_t<C>;
  using Prod = decltype(einsum_op<Name, Sub>(a, b));
  // The add under this op's name (its messages name einsum_add / matmul_add); `c + product`'s type.
  auto add = [](const auto& x, const auto& y) { return elementwise_op<Name, Linearity::additive>(fn::add{}, x, y); };
  using Sum = decltype(add(std::declval<const CT&>(), std::declval<const Prod&>()));
  using T = typename A::value_type;
  static constexpr EinsumSubscripts s = parse_einsum(std::string_view(Sub.text));
  static constexpr EinsumLayout L = einsum_layout(s);
  if constexpr (!std::is_same_v<Sum, Prod> || !std::is_same_v<CT, Prod> || !(L.c_direct || L.c_trans) ||
                (is_half_v<T> && einsum_casts_16bit<Sub, typename A::memory_space>())) {
    return add(c, einsum_op<Name, Sub>(a, b));
  } else {
    static constexpr OpRule rule = einsum_rule(s, A::sharding, B::sharding);
    check_same_mesh(Name.text, a, b);
    check_same_mesh(Name.text, a, c);
    typename Prod::Shape shape{};
    einsum_shape(Name.text, Sub.text, s, info(a), info(b), shape.data());
    if (c.shape() != shape) return add(c, einsum_op<Name, Sub>(a, b));  // the add's broadcast or its error
    // An rvalue's block that no other tensor holds becomes the output's; else a copy of it does.
    // (`c` may be `a` or `b` itself, `matmul_add(x, w, std::move(x))`: the GEMM's C must not be
    // its A or B, so that one is copied.)
    const bool take = std::is_rvalue_reference_v<C&&> && !std::is_const_v<std::remove_reference_t<C>> &&
                      c.block_owner().use_count() == 1 && static_cast<const void*>(&c) != static_cast<const void*>(&a) &&
                      static_cast<const void*>(&c) != static_cast<const void*>(&b);
    Prod out = take ? Prod(std::move(c)) : c.clone();
    einsum_run<T, typename A::memory_space>(Name.text, s, L, rule, ref(a), ref(b), out.local().data(),
                                            out.block(), true);
    return out;
  }
}

/// "ab...yz,..." subscripts for matmul of ranks RA and RB (numpy's matmul on equal batch ranks, or
/// a rank-2 right operand shared across the left operand's leading dims).
template <std::size_t RA, std::size_t RB>
constexpr OpName matmul_subscripts() {
  OpName s("");
  std::size_t k = 0;
  auto put = [&](char c) { s.text[k++] = c; };
  constexpr const char* batch = "abcdefgh";
  if constexpr (RA >= 2 && RB == 2) {  // ...ij,jk->...ik
    for (std::size_t i = 0; i + 2 < RA; ++i) put(batch[i]);
    put('i'), put('j'), put(','), put('j'), put('k'), put('-'), put('>');
    for (std::size_t i = 0; i + 2 < RA; ++i) put(batch[i]);
    put('i'), put('k');
  } else {  // equal ranks: ...ij,...jk->...ik (other combinations leave the ranks to the rule)
    for (std::size_t i = 0; i + 2 < RA; ++i) put(batch[i]);
    put('i'), put('j'), put(',');
    for (std::size_t i = 0; i + 2 < RB; ++i) put(batch[i]);
    put('j'), put('k'), put('-'), put('>');
    for (std::size_t i = 0; i + 2 < RA; ++i) put(batch[i]);
    put('i'), put('k');
  }
  return s;
}

}  // namespace detail

/// Einstein summation of two tensors: `einsum<"bij,bjk->bik">(a, b)`. Labels are letters; without
/// "->" the output is the labels that appear once, alphabetically (numpy's implicit mode).
/// A contracted label split over mesh axes makes the output partial-sum over them; the rule
/// (sharding/einsum.hpp) picks each label's axes and reshards an operand that disagrees.
/// Throws std::invalid_argument when a label's extents differ between the operands.
template <OpName Subscripts, TensorType A, TensorType B>
auto einsum(const A& a, const B& b) {
  return detail::einsum_op<"einsum", Subscripts>(a, b);
}

/// `c + einsum<Subscripts>(a, b)` in one pass where it can (a residual added to the projection
/// before it): the same tensor, of the same type, as the two ops, to float round-off. When `c`
/// has the product's type (so its spec) and shape and the output's dims come out of the GEMM in
/// order, `c` is the GEMM's initial C (beta = 1): no separate add pass, and no copy of `c` when
/// it is an rvalue (`std::move(x)`) whose block no other tensor shares. Otherwise it runs the
/// two ops. Throws what they throw.
template <OpName Subscripts, TensorType A, TensorType B, TensorType C>
auto einsum_add(const A& a, const B& b, C&& c) {
  return detail::einsum_add_op<"einsum_add", Subscripts>(a, b, std::forward<C>(c));
}

/// Matrix product (numpy's matmul): rank-2 times rank-2, batched with equal ranks >= 3 (the
/// leading dims are batch dims), or any rank >= 2 times a rank-2 matrix shared across the leading
/// dims. Other rank combinations fail to compile, naming the specs.
template <TensorType A, TensorType B>
auto matmul(const A& a, const B& b) {
  constexpr std::size_t ra = std::remove_cvref_t<A>::rank, rb = std::remove_cvref_t<B>::rank;
  SHARDLIB_STATIC_REQUIRE((ra >= 2 && (rb == 2 || rb == ra)),
                          "shardlib: matmul needs rank >= 2 operands: equal ranks, or a rank-2 right operand",
                          error::op_has_no_sharding_rule_for_these_specs<"matmul", OpRule::rank_mismatch,
                                                                         typename A::spec_type, typename B::spec_type>);
  if constexpr (ra >= 2 && (rb == 2 || rb == ra))
    return detail::einsum_op<"matmul", detail::matmul_subscripts<ra, rb>()>(a, b);
}

/// `c + matmul(a, b)` in one pass where it can: see einsum_add (PyTorch's `addmm(c, a, b)`, with
/// the operands in matmul's order).
template <TensorType A, TensorType B, TensorType C>
auto matmul_add(const A& a, const B& b, C&& c) {
  constexpr std::size_t ra = std::remove_cvref_t<A>::rank, rb = std::remove_cvref_t<B>::rank;
  SHARDLIB_STATIC_REQUIRE((ra >= 2 && (rb == 2 || rb == ra)),
                          "shardlib: matmul needs rank >= 2 operands: equal ranks, or a rank-2 right operand",
                          error::op_has_no_sharding_rule_for_these_specs<"matmul_add", OpRule::rank_mismatch,
                                                                         typename A::spec_type, typename B::spec_type>);
  if constexpr (ra >= 2 && (rb == 2 || rb == ra))
    return detail::einsum_add_op<"matmul_add", detail::matmul_subscripts<ra, rb>()>(a, b, std::forward<C>(c));
}

}  // namespace shardlib
