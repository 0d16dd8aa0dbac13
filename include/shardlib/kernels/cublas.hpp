// SPDX-License-Identifier: Apache-2.0
/// @file
/// GEMM on an NVIDIA GPU: `C[b] = alpha * A[b] * B[b] + beta * C[b]` over a batch of strided
/// matrices (kernels::MatrixBatch, as the host gemm takes them), as one
/// `cublasGemmStridedBatchedEx` (`cublasGemmEx` for a batch of one) queued on the stream of a
/// `Kokkos::Cuda` instance; nothing waits.
///
/// Element types: float (FP32 compute; TF32 tensor cores when `set_allow_tf32(true)`, off by
/// default, as in PyTorch), double (FP64), bf16 and f16 (16-bit operands and result, float32
/// accumulation: `CUBLAS_COMPUTE_32F`, alpha and beta as float). Operands are read in place when
/// one of their two strides is 1 (row- or column-major with any leading dimension); cuBLAS takes
/// no other layout, so such an operand is refused (einsum packs it first). A batch whose C's
/// overlap (a C batch stride of 0 accumulating over the batch) runs as one call per matrix, in
/// order on the stream.
///
/// Handles: one per device and stream (`CublasHandle`), bound to the instance's stream, so that
/// products of several in-process devices on one GPU run on their own streams. Link with
/// `-lcublas` (Meson's `cuda` dependency with the `cublas` module; CMake's `CUDA::cublas`).
///
/// In shape-only mode (detail/shape_only.hpp) a product checks its operands and queues nothing.
///
/// Knows nothing of tensors or collectives: device pointers, extents, strides, a stream.
#pragma once

#include <Kokkos_Core.hpp>

#if !defined(KOKKOS_ENABLE_CUDA)
#error "shardlib/kernels/cublas.hpp needs a CUDA-enabled Kokkos (KOKKOS_ENABLE_CUDA)"
#endif

#include <cublas_v2.h>
#include <library_types.h>

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/gemm.hpp>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib::kernels {

/// Throws std::runtime_error naming the cuBLAS call and its status.
[[noreturn]] inline void throw_cublas_error(const char* call, cublasStatus_t s) {
  throw std::runtime_error(std::string("shardlib: ") + call + " failed: " + cublasGetStatusString(s) +
                           " (cublasStatus_t " + std::to_string(static_cast<int>(s)) + ")");
}
inline void check_cublas(const char* call, cublasStatus_t s) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublas_error(call, s);
}

/// A cuBLAS handle bound to the stream of one Kokkos::Cuda instance (create it on the thread and
/// GPU that use it; not shared between devices: cuBLAS handles are not for concurrent use).
class CublasHandle {
 public:
  explicit CublasHandle(const Kokkos::Cuda& exec) {
    check_cublas("cublasCreate", cublasCreate(&handle_));
    if (const cublasStatus_t s = cublasSetStream(handle_, exec.cuda_stream()); s != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle_);
      throw_cublas_error("cublasSetStream", s);
    }
  }
  ~CublasHandle() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const noexcept { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

namespace detail {
/// cuBLAS's names for an element type: the data type, the compute type, and the type of alpha
/// and beta.
template <class T>
struct CublasTypes;
template <>
struct CublasTypes<float> {
  static constexpr cudaDataType_t data = CUDA_R_32F;
  using scalar = float;
  static cublasComputeType_t compute() noexcept {
    return allow_tf32_setting().load(std::memory_order_relaxed) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }
};
template <>
struct CublasTypes<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F;
  using scalar = double;
  static cublasComputeType_t compute() noexcept { return CUBLAS_COMPUTE_64F; }
};
template <>
struct CublasTypes<bf16> {
  static constexpr cudaDataType_t data = CUDA_R_16BF;
  using scalar = float;
  static cublasComputeType_t compute() noexcept { return CUBLAS_COMPUTE_32F; }
};
template <>
struct CublasTypes<f16> {
  static constexpr cudaDataType_t data = CUDA_R_16F;
  using scalar = float;
  static cublasComputeType_t compute() noexcept { return CUBLAS_COMPUTE_32F; }
};

/// The layout of one operand for cuBLAS, or throws naming it when it has no unit stride.
inline GemmOperand cublas_operand(const char* name, std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                                  std::int64_t col_stride) {
  const GemmOperand op = gemm_operand(rows, cols, row_stride, col_stride, INT_MAX);
  if (op.layout == GemmLayout::packed)
    throw std::invalid_argument(std::string("shardlib: kernels::cublas_gemm: ") + name + " (" + to_text(rows) + "x" +
                                to_text(cols) + ", strides " + to_text(row_stride) + " and " + to_text(col_stride) +
                                ") has no unit stride (or a leading dimension past INT_MAX): cuBLAS reads row- or "
                                "column-major matrices only; copy it into one first (kernels::permute)");
  return op;
}
}  // namespace detail

/// Whether cublas_gemm takes element type T.
template <class T>
inline constexpr bool cublas_gemm_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

/// `C[b] = alpha * A[b] * B[b] + beta * C[b]` for b in [0, batch), in GPU memory, queued on
/// `handle`'s stream (the stream of the Kokkos::Cuda instance it was made for); returns at once.
/// A[b] is rows x K, B[b] K x cols. As in BLAS, beta = 0 never reads C. Throws
/// std::invalid_argument (shapes, an operand without a unit stride, an extent past cuBLAS's int)
/// before anything is queued, std::runtime_error naming the cuBLAS call when cuBLAS refuses.
/// Shape-only mode: the checks only.
template <class T>
void cublas_gemm(const CublasHandle& handle, std::int64_t batch, std::type_identity_t<MatrixBatch<const T>> a,
                 std::type_identity_t<MatrixBatch<const T>> b, MatrixBatch<T> c,
                 typename detail::CublasTypes<T>::scalar alpha = 1, typename detail::CublasTypes<T>::scalar beta = 0) {
  static_assert(cublas_gemm_type_v<T>, "shardlib: kernels::cublas_gemm takes float, double, bf16 or f16");
  detail::gemm_check(batch, a, b, c);
  if (batch == 0 || c.rows == 0 || c.cols == 0) return;
  const std::int64_t m = a.rows, n = b.cols, k = a.cols;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX)
    throw std::invalid_argument("shardlib: kernels::cublas_gemm: " + detail::gemm_shape("A", a.rows, a.cols) + ", " +
                                detail::gemm_shape("B", b.rows, b.cols) + ", batch " + detail::to_text(batch) +
                                ": an extent exceeds cuBLAS's int");
  const auto la = detail::cublas_operand("A", a.rows, a.cols, a.row_stride, a.col_stride);
  const auto lb = detail::cublas_operand("B", b.rows, b.cols, b.row_stride, b.col_stride);
  const auto lc = detail::cublas_operand("C", c.rows, c.cols, c.row_stride, c.col_stride);
  count_gemm(batch, m, n, k);
  if (shardlib::shape_only()) return;
  using Types = detail::CublasTypes<T>;
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  const bool a_row = la.layout == detail::GemmLayout::row_major, b_row = lb.layout == detail::GemmLayout::row_major;
  // cuBLAS is column-major: a column-major C is op(A) op(B); a row-major C is computed as its
  // transpose, C^T = B^T A^T, which cuBLAS sees column-major with the same leading dimension.
  const auto call = [&](const T* pa, const T* pb, T* pc, std::int64_t count, std::int64_t sa, std::int64_t sb,
                        std::int64_t sc) {
    cublasStatus_t s;
    if (count == 1) {  // one product: cublasGemmEx (float32 4096^3 on an H200: 0.94-0.95 of a direct call, 0.89-0.90 batched)
      if (lc.layout == detail::GemmLayout::col_major)
        s = cublasGemmEx(handle.get(), a_row ? CUBLAS_OP_T : CUBLAS_OP_N, b_row ? CUBLAS_OP_T : CUBLAS_OP_N, i(m), i(n), i(k),
                         &alpha, pa, Types::data, i(la.ld), pb, Types::data, i(lb.ld), &beta, pc, Types::data, i(lc.ld),
                         Types::compute(), CUBLAS_GEMM_DEFAULT);
      else
        s = cublasGemmEx(handle.get(), b_row ? CUBLAS_OP_N : CUBLAS_OP_T, a_row ? CUBLAS_OP_N : CUBLAS_OP_T, i(n), i(m), i(k),
                         &alpha, pb, Types::data, i(lb.ld), pa, Types::data, i(la.ld), &beta, pc, Types::data, i(lc.ld),
                         Types::compute(), CUBLAS_GEMM_DEFAULT);
      check_cublas("cublasGemmEx", s);
      return;
    }
    if (lc.layout == detail::GemmLayout::col_major)
      s = cublasGemmStridedBatchedEx(handle.get(), a_row ? CUBLAS_OP_T : CUBLAS_OP_N, b_row ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     i(m), i(n), i(k), &alpha, pa, Types::data, i(la.ld), sa, pb, Types::data, i(lb.ld),
                                     sb, &beta, pc, Types::data, i(lc.ld), sc, i(count), Types::compute(),
                                     CUBLAS_GEMM_DEFAULT);
    else
      s = cublasGemmStridedBatchedEx(handle.get(), b_row ? CUBLAS_OP_N : CUBLAS_OP_T, a_row ? CUBLAS_OP_N : CUBLAS_OP_T,
                                     i(n), i(m), i(k), &alpha, pb, Types::data, i(lb.ld), sb, pa, Types::data, i(la.ld),
                                     sa, &beta, pc, Types::data, i(lc.ld), sc, i(count), Types::compute(),
                                     CUBLAS_GEMM_DEFAULT);
    check_cublas("cublasGemmStridedBatchedEx", s);
  };
  const std::int64_t c_span = (c.rows - 1) * std::abs(c.row_stride) + (c.cols - 1) * std::abs(c.col_stride) + 1;
  const bool apart = c.row_stride >= 0 && c.col_stride >= 0 && c.batch_stride >= 0
                         ? matrices_apart(batch, c.rows, c.cols, c.row_stride, c.col_stride, c.batch_stride)
                         : std::abs(c.batch_stride) >= c_span;
  if (batch == 1 || apart) {
    call(a.data, b.data, c.data, batch, a.batch_stride, b.batch_stride, c.batch_stride);
  } else {  // C's overlap: one product after the other on the stream
    for (std::int64_t j = 0; j < batch; ++j)
      call(a.data + j * a.batch_stride, b.data + j * b.batch_stride, c.data + j * c.batch_stride, 1, 0, 0, 0);
  }
}

}  // namespace shardlib::kernels
