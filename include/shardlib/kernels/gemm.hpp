// SPDX-License-Identifier: Apache-2.0
/// @file
/// Host GEMM on one shard: `C[b] = alpha * A[b] * B[b] + beta * C[b]` over a batch of strided
/// matrices. When the build defines `EIGEN_USE_BLAS` (it does when it finds OpenBLAS, and then
/// also `SHARDLIB_HAVE_OPENBLAS`), float and double call the BLAS's `sgemm_`/`dgemm_` directly,
/// one call per matrix (Eigen declares them); other element types, and every type without a
/// BLAS, go through Eigen's own product kernel.
///
/// Every operand is read in place when one of its two strides is 1 (row- or column-major with
/// any leading dimension: submatrix views and transposed operands need no copy); an operand with
/// no unit stride is packed into a temporary first.
///
/// Threads: several in-process virtual devices call this at once, each from its own thread. The
/// BLAS's thread count is one setting for the process (kernels/blas.hpp): one thread unless the
/// runtime set each device's share of the host's cores (cores / devices on this host, at least
/// 1), so that the devices together use the host's cores and no more; before the first product
/// it is applied (OpenBLAS's pthread build would otherwise start a thread per core inside every
/// call). A batch of small products is the exception: OpenBLAS splits each one over its threads at
/// a loss, so the batch is spread over threads of this kernel's own instead, one BLAS thread each
/// (detail::batch_threads). Which BLAS kernel runs: `blas_info()` (kernels/blas.hpp). Eigen's
/// own threading is left as the user configured it: a translation unit compiled with OpenMP
/// should define `EIGEN_DONT_PARALLELIZE` (or call `Eigen::setNbThreads(1)`), or each call
/// splits its product over an OpenMP team.
///
/// In shape-only mode (detail/shape_only.hpp) a product checks its shapes and computes nothing.
///
/// Knows nothing of tensors or collectives: raw pointers, extents, strides.
#pragma once

#include <shardlib/detail/attributes.hpp>
SHARDLIB_SIMD_WARNINGS_OFF  // (g++ 12 under -march=native: detail/attributes.hpp)

#include <Eigen/Core>
#include <Kokkos_Core.hpp>

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/detail/text.hpp>
#include <shardlib/kernels/blas.hpp>
#include <shardlib/kernels/exec.hpp>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib::kernels {

namespace detail {
inline std::atomic<bool>& allow_tf32_setting() noexcept {
  static std::atomic<bool> allowed{false};
  return allowed;
}
}  // namespace detail

/// Whether float products on a GPU may use TF32 tensor cores (10-bit mantissa products, float32
/// sums): off unless `set_allow_tf32(true)`, for the whole process (PyTorch's
/// `torch.backends.cuda.matmul.allow_tf32`). Every build has the setting, so a portable program
/// sets it unconditionally; host GEMMs ignore it (their float products stay float32).
inline bool tf32_allowed() noexcept { return detail::allow_tf32_setting().load(std::memory_order_relaxed); }
inline void set_allow_tf32(bool allowed) noexcept { detail::allow_tf32_setting().store(allowed, std::memory_order_relaxed); }

/// A batch of matrices in memory: element (b, i, j) is at
/// `data[b * batch_stride + i * row_stride + j * col_stride]`. Strides may be any values (0 along
/// a broadcast dim, e.g. `batch_stride = 0` for a weight shared by the batch). Read-only operands
/// are `MatrixBatch<const T>`; a `MatrixBatch<T>` converts to one.
template <class T>
struct MatrixBatch {
  T* data = nullptr;
  std::int64_t rows = 0, cols = 0;
  std::int64_t row_stride = 0, col_stride = 0, batch_stride = 0;

  /// The same memory read as the transposed matrices (no copy: the strides swap).
  constexpr MatrixBatch transposed() const noexcept {
    return {data, cols, rows, col_stride, row_stride, batch_stride};
  }
  /// A read-only view of the same matrices. (A template, so that MatrixBatch<const T> declares no
  /// conversion to its own type: nvcc warns of such a conversion, #554-D.)
  template <class U>
    requires(std::is_same_v<U, T> && !std::is_const_v<U>)
  constexpr operator MatrixBatch<const U>() const noexcept {
    return {data, rows, cols, row_stride, col_stride, batch_stride};
  }
};

/// Whether `batch` matrices of rows x cols (strides `row_stride`, `col_stride`, `batch_stride`
/// apart, all >= 0) share no element: each lies past the one before, or their lines interleave
/// within one leading dimension (a batch over H of [B, S, H, K]'s [S, K] matrices). A batched
/// GEMM writes such a C's matrices at once.
constexpr bool matrices_apart(std::int64_t batch, std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                              std::int64_t col_stride, std::int64_t batch_stride) noexcept {
  if (batch <= 1 || rows == 0 || cols == 0) return true;
  const std::int64_t span = (rows - 1) * row_stride + (cols - 1) * col_stride + 1;
  if (batch_stride >= span) return true;
  const bool by_rows = col_stride == 1 || cols == 1;  // lines: rows, along a unit stride
  const bool by_cols = row_stride == 1 || rows == 1;
  if (!by_rows && !by_cols) return false;
  const std::int64_t run = by_rows ? cols : rows, ld = by_rows ? (rows == 1 ? run : row_stride) : (cols == 1 ? run : col_stride);
  return batch_stride >= run && (batch - 1) * batch_stride + run <= ld;
}

namespace detail {

using shardlib::detail::to_text;

/// How one matrix of an operand is handed to Eigen: mapped in place row- or column-major with
/// leading dimension `ld`, or packed into a row-major temporary first.
enum class GemmLayout { row_major, col_major, packed };
struct GemmOperand {
  GemmLayout layout = GemmLayout::packed;
  std::int64_t ld = 0;
};

/// The layout of a rows x cols matrix with the given strides. A stride along a dim of extent 1
/// is never used, so it does not matter. In place needs a unit stride along one dim and rows (or
/// columns) that do not overlap, as BLAS requires (ld >= max(1, inner extent)); with `max_ld`
/// (the BLAS index limit) a larger leading dimension is packed instead.
constexpr GemmOperand gemm_operand(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                                   std::int64_t col_stride, std::int64_t max_ld = INT64_MAX) noexcept {
  if (rows == 0 || cols == 0) return {GemmLayout::row_major, std::max<std::int64_t>(1, cols)};
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= cols)) {
    const std::int64_t ld = rows == 1 ? cols : row_stride;
    if (ld <= max_ld) return {GemmLayout::row_major, ld};
  }
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= rows)) {
    const std::int64_t ld = cols == 1 ? rows : col_stride;
    if (ld <= max_ld) return {GemmLayout::col_major, ld};
  }
  return {GemmLayout::packed, 0};
}

/// The largest extent or leading dimension the product may hand to Eigen: BLAS takes 32-bit
/// indices, so under EIGEN_USE_BLAS float and double are limited to INT_MAX.
template <class T>
constexpr std::int64_t gemm_index_limit() noexcept {
#if defined(EIGEN_USE_BLAS)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) return INT_MAX;
#endif
  return INT64_MAX;
}

/// Once per process, before the first product: OpenBLAS to blas_threads() (one thread unless a
/// runtime set each device's share; see the file comment), Eigen's cache sizes queried (Eigen
/// asks for this before concurrent use).
inline void gemm_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    set_blas_threads(blas_threads());
    Eigen::initParallel();
  });
}

/// An Eigen map of a matrix of T (const T: read-only) with the given storage order and a
/// runtime leading dimension (a unit inner stride known at compile time, as BLAS needs).
template <class T, int Order>
using GemmMatrix = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Order>;
template <class T, int Order>
using GemmMap = Eigen::Map<std::conditional_t<std::is_const_v<T>, const GemmMatrix<T, Order>, GemmMatrix<T, Order>>,
                           Eigen::Unaligned, Eigen::OuterStride<>>;

/// Calls `f` with `p` (a rows x cols matrix laid out as `op` says, not packed) mapped as an
/// Eigen matrix of the matching storage order.
template <class T, class F>
void with_map(T* p, std::int64_t rows, std::int64_t cols, const GemmOperand& op, F&& f) {
  using Index = Eigen::Index;
  const auto r = static_cast<Index>(rows), c = static_cast<Index>(cols);
  if (op.layout == GemmLayout::col_major) {
    GemmMap<T, Eigen::ColMajor> m(p, r, c, Eigen::OuterStride<>(static_cast<Index>(op.ld)));
    f(m);
  } else {
    GemmMap<T, Eigen::RowMajor> m(p, r, c, Eigen::OuterStride<>(static_cast<Index>(op.ld)));
    f(m);
  }
}

/// Copies matrix `b` of `m` into the dense row-major buffer `dst` (rows * cols elements).
template <class T>
void pack(const MatrixBatch<const T>& m, std::int64_t b, T* dst) {
  const T* src = m.data + b * m.batch_stride;
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j) dst[i * m.cols + j] = src[i * m.row_stride + j * m.col_stride];
}

/// Copies the dense row-major buffer `src` back into matrix `b` of `m`.
template <class T>
void unpack(const T* src, const MatrixBatch<T>& m, std::int64_t b) {
  T* dst = m.data + b * m.batch_stride;
  for (std::int64_t i = 0; i < m.rows; ++i)
    for (std::int64_t j = 0; j < m.cols; ++j) dst[i * m.row_stride + j * m.col_stride] = src[i * m.cols + j];
}

inline std::string gemm_shape(const char* name, std::int64_t rows, std::int64_t cols) {
  return std::string(name) + " is " + to_text(rows) + "x" + to_text(cols);
}

template <class T, class U>
void gemm_check(std::int64_t batch, const MatrixBatch<const T>& a, const MatrixBatch<const T>& b,
                const MatrixBatch<U>& c) {
  const std::string where = "shardlib: kernels::gemm: ";
  if (batch < 0) throw std::invalid_argument(where + "batch " + to_text(batch) + " is negative");
  auto extents = [&](const char* name, std::int64_t rows, std::int64_t cols) {
    if (rows < 0 || cols < 0)
      throw std::invalid_argument(where + gemm_shape(name, rows, cols) + ": extents must be >= 0");
  };
  extents("A", a.rows, a.cols);
  extents("B", b.rows, b.cols);
  extents("C", c.rows, c.cols);
  const std::string shapes = gemm_shape("A", a.rows, a.cols) + ", " + gemm_shape("B", b.rows, b.cols) + ", " +
                             gemm_shape("C", c.rows, c.cols);
  if (a.cols != b.rows)
    throw std::invalid_argument(where + shapes + ": A's columns (" + to_text(a.cols) + ") must equal B's rows (" +
                                to_text(b.rows) + ")");
  if (c.rows != a.rows || c.cols != b.cols)
    throw std::invalid_argument(where + shapes + ": C must be " + to_text(a.rows) + "x" + to_text(b.cols) +
                                " (A's rows x B's columns)");
  const std::int64_t limit = gemm_index_limit<T>();
  if (a.rows > limit || a.cols > limit || b.cols > limit)
    throw std::invalid_argument(where + shapes + ": an extent exceeds " + to_text(limit) +
                                ", the largest index of the BLAS underneath");
  if (batch > 0) {
    auto null = [&](const char* name, const void* p, std::int64_t rows, std::int64_t cols) {
      if (p == nullptr && rows > 0 && cols > 0)
        throw std::invalid_argument(where + name + " has no data but " + to_text(rows) + "x" + to_text(cols) +
                                    " elements");
    };
    null("A", a.data, a.rows, a.cols);
    null("B", b.data, b.rows, b.cols);
    null("C", c.data, c.rows, c.cols);
  }
}

/// One product on Eigen matrices, with BLAS semantics for alpha = 0 and beta = 0: neither then
/// reads what it multiplies (a NaN there does not leak), and `noalias()` writes C in place.
template <class MA, class MB, class MC, class T>
void gemm_one(const MA& a, const MB& b, MC& c, T alpha, T beta) {
  if (alpha == T(0) || a.cols() == 0) {
    if (beta == T(0)) c.setZero();
    else if (beta != T(1)) c *= beta;
    return;
  }
  if (beta == T(0)) {
    c.noalias() = alpha * a * b;
  } else {
    if (beta != T(1)) c *= beta;
    c.noalias() += alpha * a * b;
  }
}

/// Whether float and double products go straight to the BLAS's ?gemm_ (the build defined
/// `EIGEN_USE_BLAS`, so Eigen declared them): one call per matrix, no Eigen expression templates
/// to instantiate (they cost a user's translation unit seconds of compile time per element type).
template <class T>
inline constexpr bool direct_blas =
#if defined(EIGEN_USE_BLAS) && !defined(EIGEN_USE_MKL)
    std::is_same_v<T, float> || std::is_same_v<T, double>;
#else
    false;
#endif

/// C = beta * C on one rows x cols matrix with BLAS semantics (beta = 0 writes zeros, never
/// reads C; beta = 1 leaves it).
template <class T>
void scale_matrix(T* c, std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs, T beta) {
  if (beta == T(1)) return;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      T& x = c[i * rs + j * cs];
      x = beta == T(0) ? T(0) : static_cast<T>(beta * x);
    }
}

#if defined(EIGEN_USE_BLAS) && !defined(EIGEN_USE_MKL)
/// One product through the BLAS (column-major): C (m x n, ldc) = alpha op(A) op(B) + beta C.
inline void blas_gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}
inline void blas_gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                      int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

/// One matrix product with operands in place (row- or column-major, leading dimensions as
/// `la`, `lb`, `lc` say; none packed), through the BLAS. A row-major C is computed as its
/// transpose, C^T = B^T A^T, which BLAS sees column-major with the same leading dimension.
template <class T>
void gemm_blas_one(const T* a, const GemmOperand& la, const T* b, const GemmOperand& lb, T* c, const GemmOperand& lc,
                   std::int64_t m, std::int64_t n, std::int64_t k, T alpha, T beta) {
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  const bool a_row = la.layout == GemmLayout::row_major, b_row = lb.layout == GemmLayout::row_major;
  if (lc.layout == GemmLayout::col_major)
    blas_gemm(a_row ? 'T' : 'N', b_row ? 'T' : 'N', i(m), i(n), i(k), alpha, a, i(la.ld), b, i(lb.ld), beta, c, i(lc.ld));
  else
    blas_gemm(b_row ? 'N' : 'T', a_row ? 'N' : 'T', i(n), i(m), i(k), alpha, b, i(lb.ld), a, i(la.ld), beta, c, i(lc.ld));
}

/// Threads for a batch of products spread over threads of our own, each product on one BLAS
/// thread (gemm_blas_batches), or 1: the BLAS then runs the batch in order, each product on the
/// device's BLAS threads. OpenBLAS splits each product of a batch over its threads, and on small
/// ones that costs more than it gains: the attention scores of 64 heads, [128 x 64] x [64 x 128]
/// each, ran at 97-101 GFLOP/s on OpenBLAS's 2 threads, 181-184 on 1, 289-292 as two halves of
/// the batch on 1 thread each (AMD EPYC Zen 5, OpenBLAS 0.3.21). So: when the device has more
/// than one BLAS thread, the batch has a product per thread, C's matrices do not overlap (a
/// batch_stride of 0 accumulates in order; `c_span`: the elements one C matrix spans) and the
/// BLAS's thread count can be set, at most one thread per 8 MFLOP of work (a thread's start is
/// ~10-20 us).
inline int batch_threads(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t c_batch_stride,
                         std::int64_t c_span) {
  const int share = blas_threads();
  if (share <= 1 || batch < 2 || std::abs(c_batch_stride) < c_span || !blas_threads_settable()) return 1;
  const double flops = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto by_work = static_cast<std::int64_t>(flops / double(1 << 23));
  return static_cast<int>(std::max<std::int64_t>(1, std::min({static_cast<std::int64_t>(share), batch, by_work})));
}

/// The batch in `threads` contiguous parts, the first on the calling thread, each product on one
/// BLAS thread (BlasSingleThreaded). Operands in place (no packed one).
template <class T>
void gemm_blas_batches(int threads, std::int64_t batch, const MatrixBatch<const T>& a, const GemmOperand& la,
                       const MatrixBatch<const T>& b, const GemmOperand& lb, const MatrixBatch<T>& c,
                       const GemmOperand& lc, T alpha, T beta) {
  const auto part = [&](int w) {
    const std::int64_t end = batch * (w + 1) / threads;
    for (std::int64_t i = batch * w / threads; i < end; ++i)
      gemm_blas_one(a.data + i * a.batch_stride, la, b.data + i * b.batch_stride, lb, c.data + i * c.batch_stride, lc,
                    a.rows, b.cols, a.cols, alpha, beta);
  };
  const BlasSingleThreaded one_thread_each;
  std::vector<std::jthread> helpers;  // joined before one_thread_each goes, also when a start throws
  helpers.reserve(static_cast<std::size_t>(threads - 1));
  for (int w = 1; w < threads; ++w) helpers.emplace_back(part, w);
  part(0);
}
#endif

}  // namespace detail

/// `C[b] = alpha * A[b] * B[b] + beta * C[b]` for b in [0, batch): A[b] is rows x K, B[b] K x cols.
///
/// Operands with a unit stride along one dim are used in place (see the file comment), others
/// packed; matrices of the batch run in order on the calling thread, so a C with `batch_stride`
/// 0 and beta = 1 accumulates over the batch. Except: when the device has several BLAS threads,
/// a batch of C's that do not overlap, with operands in place, is spread over as many threads of
/// its own, each product on one BLAS thread (detail::batch_threads: up to 3x on attention's
/// products). As in BLAS, beta = 0 never reads C (NaN there is overwritten) and alpha = 0 or K = 0 never reads A and B. C's elements must not overlap A's or B's.
/// Throws std::invalid_argument, naming the shapes, when A, B and C do not fit together, an
/// extent or the batch is negative, or an operand with elements has no data. Shape-only mode:
/// the checks only.
template <class T>
void gemm(std::int64_t batch, std::type_identity_t<MatrixBatch<const T>> a,
          std::type_identity_t<MatrixBatch<const T>> b, MatrixBatch<T> c, std::type_identity_t<T> alpha = T(1),
          std::type_identity_t<T> beta = T(0)) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>,
                "shardlib: kernels::gemm: the element type must be an arithmetic type other than bool");
  detail::gemm_check(batch, a, b, c);
  count_gemm(batch, c.rows, c.cols, a.cols);
  if (batch == 0 || c.rows == 0 || c.cols == 0 || shardlib::shape_only()) return;
  if (alpha == T(0) || a.cols == 0) {  // C = beta C: A and B are not read
    for (std::int64_t i = 0; i < batch; ++i)
      detail::scale_matrix(c.data + i * c.batch_stride, c.rows, c.cols, c.row_stride, c.col_stride, T(beta));
    return;
  }
  detail::gemm_init_once();

  const std::int64_t max_ld = detail::gemm_index_limit<T>();
  const auto la = detail::gemm_operand(a.rows, a.cols, a.row_stride, a.col_stride, max_ld);
  const auto lb = detail::gemm_operand(b.rows, b.cols, b.row_stride, b.col_stride, max_ld);
  const auto lc = detail::gemm_operand(c.rows, c.cols, c.row_stride, c.col_stride, max_ld);
  // A packed operand is a dense row-major temporary.
  const auto packed_as = [](std::int64_t cols) {
    return detail::GemmOperand{detail::GemmLayout::row_major, std::max<std::int64_t>(1, cols)};
  };
  const bool pack_a = la.layout == detail::GemmLayout::packed, pack_b = lb.layout == detail::GemmLayout::packed,
             pack_c = lc.layout == detail::GemmLayout::packed;
  std::vector<T> ta(pack_a ? static_cast<std::size_t>(a.rows * a.cols) : 0),
      tb(pack_b ? static_cast<std::size_t>(b.rows * b.cols) : 0),
      tc(pack_c ? static_cast<std::size_t>(c.rows * c.cols) : 0);

#if defined(EIGEN_USE_BLAS) && !defined(EIGEN_USE_MKL)
  if constexpr (detail::direct_blas<T>) {
    const std::int64_t c_span = (c.rows - 1) * std::abs(c.row_stride) + (c.cols - 1) * std::abs(c.col_stride) + 1;
    const int threads =
        pack_a || pack_b || pack_c ? 1 : detail::batch_threads(batch, a.rows, b.cols, a.cols, c.batch_stride, c_span);
    if (threads > 1) {
      detail::gemm_blas_batches(threads, batch, a, la, b, lb, c, lc, T(alpha), T(beta));
      return;
    }
  }
#endif
  for (std::int64_t i = 0; i < batch; ++i) {
    const T* pa = a.data + i * a.batch_stride;
    const T* pb = b.data + i * b.batch_stride;
    T* pc = c.data + i * c.batch_stride;
    if (pack_a && (i == 0 || a.batch_stride != 0)) detail::pack(a, i, ta.data());
    if (pack_b && (i == 0 || b.batch_stride != 0)) detail::pack(b, i, tb.data());
    if (pack_c && beta != T(0)) detail::pack(MatrixBatch<const T>(c), i, tc.data());
    const T* ua = pack_a ? ta.data() : pa;
    const T* ub = pack_b ? tb.data() : pb;
    T* uc = pack_c ? tc.data() : pc;
    const auto ma = pack_a ? packed_as(a.cols) : la, mb = pack_b ? packed_as(b.cols) : lb,
               mc = pack_c ? packed_as(c.cols) : lc;
#if defined(EIGEN_USE_BLAS) && !defined(EIGEN_USE_MKL)
    if constexpr (detail::direct_blas<T>) {
      detail::gemm_blas_one(ua, ma, ub, mb, uc, mc, a.rows, b.cols, a.cols, T(alpha), T(beta));
    } else
#endif
    {
      detail::with_map(ua, a.rows, a.cols, ma, [&](const auto& ea) {
        detail::with_map(ub, b.rows, b.cols, mb, [&](const auto& eb) {
          detail::with_map(uc, c.rows, c.cols, mc, [&](auto& ec) { detail::gemm_one(ea, eb, ec, T(alpha), T(beta)); });
        });
      });
    }
    if (pack_c) detail::unpack(tc.data(), c, i);
  }
}

/// gemm on an execution-space instance's stream of work: waits for the work already queued on
/// `exec` (which may be writing A or B), computes on the calling thread, fences `exec` at the end.
/// The memory must be host-accessible. Shape-only mode: the checks only, no wait.
template <class ExecSpace, class T>
  requires Kokkos::is_execution_space<ExecSpace>::value
void gemm(const ExecSpace& exec, std::int64_t batch, std::type_identity_t<MatrixBatch<const T>> a,
          std::type_identity_t<MatrixBatch<const T>> b, MatrixBatch<T> c, std::type_identity_t<T> alpha = T(1),
          std::type_identity_t<T> beta = T(0)) {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible,
                "shardlib: kernels::gemm: the host GEMM needs an execution space whose memory the host can access");
  if (shardlib::shape_only()) return gemm<T>(batch, a, b, c, alpha, beta);
  kernels::fence(exec);
  gemm<T>(batch, a, b, c, alpha, beta);
  kernels::fence(exec);
}

}  // namespace shardlib::kernels

SHARDLIB_SIMD_WARNINGS_ON
