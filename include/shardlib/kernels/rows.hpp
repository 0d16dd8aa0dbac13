// SPDX-License-Identifier: Apache-2.0
/// @file
/// Fused row kernels on the host: softmax, log_softmax, layer_norm and rms_norm of `rows`
/// contiguous rows of `n` values each (the normalised dim last and whole on the device, the common
/// case), one work item per row doing the statistics and the output while the row is in cache,
/// vectorised with Eigen's packet math (kernels/vmath.hpp).
///
/// The op layer takes these when the dim is not split and is the innermost; a split dim, or a dim
/// with `inner > 1`, goes through the stats / all-reduce / apply kernels of kernels/reduce.hpp.
/// The results are those kernels' to float round-off: sums are taken in float a chunk of
/// `vmath::chunk` values at a time (Eigen's packet partial sums) and in double across chunks;
/// layer_norm takes the mean first, then the variance about it (two passes over a row in cache: no
/// cancellation when the mean is far from zero), and subtracts the mean as a float pair (hi + lo),
/// so each output carries the error of float arithmetic on values of its own size.
///
/// `scale` multiplies the input first (softmax(scale * x): attention's 1/sqrt(d) folded into the
/// softmax instead of a pass of its own). A row with a NaN gives NaN; softmax of a row that is all
/// -inf gives NaN (as torch). Knows nothing of tensors or collectives; fences before returning.
#pragma once

#include <shardlib/detail/attributes.hpp>
SHARDLIB_SIMD_WARNINGS_OFF  // (g++ 12 under -march=native: detail/attributes.hpp)

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/vmath.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib::kernels {

namespace detail {
inline void check_rows(const char* kernel, std::int64_t rows, std::int64_t n, double eps) {
  if (rows < 0 || n < 0)
    throw std::invalid_argument(std::string("shardlib::kernels::") + kernel + ": negative extent in [rows, n] = [" +
                                std::to_string(rows) + ", " + std::to_string(n) + "]");
  if (!(eps >= 0))
    throw std::invalid_argument(std::string("shardlib::kernels::") + kernel + ": eps must be >= 0, got " + std::to_string(eps));
}

/// Runs `row(r)` for r in [0, rows) on `exec` (one work item per row), then fences.
template <class Exec, class Row>
void for_rows(const Exec& exec, const char* label, std::int64_t rows, std::int64_t n, const Row& row) {
  if (rows > 0 && n > 0) Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, rows), row);
  kernels::fence(exec);
}

/// softmax (or log_softmax) of one row shorter than a SIMD packet, as Eigen array expressions (which
/// take such a row in smaller packets or one value at a time; padding it to a packet was slower: 46
/// ns a row of 8 floats against 35, AVX-512).
/// A value below `floor` gives 0, as in softmax_row_packets (its exp is still taken: the row is short).
template <class T>
inline void softmax_row_short(const T* x, T* y, std::int64_t n, bool log, T scale, T floor) {
  // Eigen's fast max (a NaN may or may not win it: either way exp(NaN - m) or exp(x - NaN) makes
  // the sum, and so the row, NaN); its NaN-propagating max costs 3x as much.
  const T m = (vmath::ConstRun<T>(x, n) * scale).maxCoeff();
  const auto d = vmath::ConstRun<T>(x, n) * scale - m;
  const auto e = (d < floor).select(T(0), vmath::exp(d));
  if (log) {
    const T shift = m + static_cast<T>(std::log(static_cast<double>(e.sum())));
    vmath::Run<T>(y, n) = vmath::ConstRun<T>(x, n) * scale - shift;
  } else {
    vmath::Run<T> out(y, n);
    out = e;
    out *= static_cast<T>(1 / static_cast<double>(out.sum()));
  }
}

/// softmax (or log_softmax) of one row of n >= lanes<T> values, on Eigen's packets: a pass for the
/// max, one for exp (stored) and its sum, one to scale (log_softmax: the exp is not stored and the
/// last pass subtracts). The n % lanes values past the last whole packet are taken as the row's
/// last lanes values, one packet overlapping the one before it; only its top n % lanes lanes are
/// summed and stored, and they are not written before they are read (so `y` may be `x`).
/// Measured on 1 M floats (AVX-512, one core, rows 64-byte aligned), against the same passes as
/// Eigen array expressions (as softmax_row_short), which take a row's unaligned ends one scalar exp
/// at a time: rows of 128 0.41 ms against 0.46, of 100 0.51 against 0.86, of 17 1.2 against 3.7;
/// exp alone 0.22 ms.
///
/// A value x - max below `floor` (underflow_floor: exp of it over the row's sum would be subnormal)
/// gives exactly 0, its exp not taken: a causal mask's -inf, or a score far below its row's
/// max, made exp underflow, and on Intel cores an underflowing multiply takes a microcode assist
/// (over a hundred cycles). Softmax of [16 x 8 x 128, 128] floats with a causal mask (half the
/// values -inf) took 4.9-5.1 ms against 1.1-1.2 ms unmasked (Xeon, AVX-512, one core); with the
/// floor 1.2-1.3 ms both. A NaN still makes its row NaN.
template <class T>
inline void softmax_row_packets(const T* x, T* y, std::int64_t n, bool log, T scale, T floor) {
  namespace ei = Eigen::internal;
  using P = vmath::Packet<T>;
  constexpr std::int64_t W = vmath::lanes<T>;
  const std::int64_t full = n / W * W, rest = n - full;
  const P s = ei::pset1<P>(scale);
  const P last = ei::pmul(ei::ploadu<P>(x + n - W), s);  // the last n % W values in its top lanes
  // Two running maxima: a NaN may or may not win them (either way exp(NaN - m) or exp(x - NaN)
  // makes the sum, and so the row, NaN).
  P m0 = last, m1 = last;
  std::int64_t j = 0;
  for (; j + 2 * W <= full; j += 2 * W) {
    m0 = ei::pmax(m0, ei::pmul(ei::ploadu<P>(x + j), s));
    m1 = ei::pmax(m1, ei::pmul(ei::ploadu<P>(x + j + W), s));
  }
  if (j < full) m0 = ei::pmax(m0, ei::pmul(ei::ploadu<P>(x + j), s));
  const T m = ei::predux_max(ei::pmax(m0, m1));
  const P pm = ei::pset1<P>(m), lo = ei::pset1<P>(floor);
  // exp(d) for d = x - m at the floor or above, exactly 0 below it; a NaN d stays NaN (pmax
  // keeps a NaN of its first operand, and pcmp_lt is false for one).
  auto exp_above = [lo](const P& d) { return ei::pandnot(vmath::pexp(ei::pmax(d, lo)), ei::pcmp_lt(d, lo)); };
  double sum = 0;
  for (std::int64_t b = 0; b < full; b += vmath::chunk) {  // float partial sums per chunk
    const std::int64_t end = full - b < vmath::chunk ? full : b + vmath::chunk;
    P acc = ei::pset1<P>(T(0));
    for (std::int64_t k = b; k < end; k += W) {
      const P e = exp_above(ei::psub(ei::pmul(ei::ploadu<P>(x + k), s), pm));
      if (!log) ei::pstoreu(y + k, e);
      acc = ei::padd(acc, e);
    }
    sum += static_cast<double>(ei::predux(acc));
  }
  if (rest > 0) {
    alignas(sizeof(P)) T e[W];
    ei::pstore(e, exp_above(ei::psub(last, pm)));
    for (std::int64_t k = W - rest; k < W; ++k) {
      if (!log) y[n - W + k] = e[k];
      sum += static_cast<double>(e[k]);
    }
  }
  if (log) {
    const T shift = m + static_cast<T>(std::log(sum));
    const P ps = ei::pset1<P>(shift);
    for (j = 0; j < full; j += W) ei::pstoreu(y + j, ei::psub(ei::pmul(ei::ploadu<P>(x + j), s), ps));
    for (j = full; j < n; ++j) y[j] = x[j] * scale - shift;
  } else {
    const T inv = static_cast<T>(1 / sum);
    const P pinv = ei::pset1<P>(inv);
    for (j = 0; j < full; j += W) ei::pstoreu(y + j, ei::pmul(ei::ploadu<P>(y + j), pinv));
    for (j = full; j < n; ++j) y[j] *= inv;
  }
}

/// The floor of softmax_row_packets on rows of n values: log of the smallest normal T times n.
/// Below it exp(x - max) / sum is below the smallest normal whatever the sum (1 <= sum <= n), so
/// a probability that small is 0 (its error at most n times the smallest normal: 1.5e-36 in
/// float on rows of 128).
template <class T>
inline T underflow_floor(std::int64_t n) {
  return static_cast<T>(std::log(static_cast<double>(std::numeric_limits<T>::min())) + std::log(static_cast<double>(n)));
}
}  // namespace detail

namespace detail {
/// The elements `rows` rows of `n` read under a causal mask over [..., causal, n] matrices (row r
/// the query r % causal, reading its first min(r % causal + 1, n)): rows * n without one.
inline std::int64_t causal_read(std::int64_t rows, std::int64_t n, std::int64_t causal) noexcept {
  if (causal <= 0) return rows * n;
  const std::int64_t full = causal < n ? causal : n;  // a matrix's rows read 1, 2, ..., full, then n each
  return rows / causal * (full * (full + 1) / 2 + (causal - full) * n);
}
}  // namespace detail

/// out = softmax(scale * in) along each row (or, with `log`, log_softmax). `out` may be `in`.
/// A row's max and sum are kept in SIMD registers: three passes over the row while it is in cache.
/// A probability below the row's length times the smallest normal number is 0 (no subnormal
/// result: see detail::softmax_row_packets).
/// With `causal` > 0 the rows are [..., causal, n] matrices (row r the query r % causal) and
/// element j is masked where j > r % causal, as an additive -infinity bias would mask it: a row
/// is read up to its diagonal only and written 0 beyond it (log_softmax: -infinity), as the
/// GPU's kernels::detail::portable::rows_fused does (attention's causal mask, unfused).
template <class Exec, class T>
void softmax_rows(const Exec& exec, const T* in, T* out, std::int64_t rows, std::int64_t n, bool log, T scale = T(1),
                  std::int64_t causal = 0) {
  static_assert(is_host_exec_v<Exec> && vmath::is_vector_type_v<T>,
                "shardlib::kernels::softmax_rows: host execution spaces, float or double");
  if (causal < 0)
    throw std::invalid_argument("shardlib::kernels::softmax_rows: causal " + std::to_string(causal) +
                                " (0: no mask; > 0: the rows are [..., causal, n] matrices of queries)");
  if (rows > 0 && n > 0)  // in read (under `causal` up to each row's diagonal), out written
    count_kernel(static_cast<std::uint64_t>(detail::causal_read(rows, n, causal) + rows * n) * sizeof(T));
  if (shardlib::shape_only()) return;
  detail::check_rows("softmax_rows", rows, n, 0);
  const T floor = detail::underflow_floor<T>(n);  // (the row's length: a masked row's sum is no larger)
  const T masked = log ? -std::numeric_limits<T>::infinity() : T(0);
  detail::for_rows(exec, "shardlib::kernels::softmax_rows", rows, n,
                   [=](std::int64_t r) {
                     const std::int64_t kept = causal > 0 && r % causal + 1 < n ? r % causal + 1 : n;
                     const T* x = in + r * n;
                     T* y = out + r * n;
                     if (kept >= vmath::lanes<T>) detail::softmax_row_packets(x, y, kept, log, scale, floor);
                     else detail::softmax_row_short(x, y, kept, log, scale, floor);
                     for (std::int64_t j = kept; j < n; ++j) y[j] = masked;
                   });
}

/// out = (in - mean) / sqrt(var + eps) along each row (biased variance, as torch), then, when they
/// are given (not null), times `gain[j]` and plus `bias[j]` (n values each; torch's weight and bias)
/// in the same pass. `out` may be `in`.
template <class Exec, class T>
void layer_norm_rows(const Exec& exec, const T* in, T* out, std::int64_t rows, std::int64_t n, double eps,
                     const T* gain = nullptr, const T* bias = nullptr) {
  static_assert(is_host_exec_v<Exec> && vmath::is_vector_type_v<T>,
                "shardlib::kernels::layer_norm_rows: host execution spaces, float or double");
  if (rows > 0 && n > 0) {  // in read, out written; gain and bias read when given
    const std::uint64_t vectors = (gain != nullptr ? 1u : 0u) + (bias != nullptr ? 1u : 0u);
    count_kernel((2 * static_cast<std::uint64_t>(rows) + vectors) * static_cast<std::uint64_t>(n) * sizeof(T));
  }
  if (shardlib::shape_only()) return;
  detail::check_rows("layer_norm_rows", rows, n, eps);
  detail::for_rows(exec, "shardlib::kernels::layer_norm_rows", rows, n, [=](std::int64_t r) {
    const T* x = in + r * n;
    // Sums and outputs a whole packet at a time from the row's start (vmath::sum_runs,
    // assign_packets): a row's result does not depend on its address.
    const double mean = vmath::sum_runs(n, [](const auto& v) { return v; }, x) / static_cast<double>(n);
    const T hi = static_cast<T>(mean), lo = static_cast<T>(mean - static_cast<double>(hi));
    const double q = vmath::sum_runs(n, [hi, lo](const auto& v) { return (v - hi - lo).square(); }, x);
    const T rs = static_cast<T>(1 / std::sqrt(q / static_cast<double>(n) + eps));
    T* y = out + r * n;
    auto normed = [hi, lo, rs](const auto& v) { return (v - hi - lo) * rs; };
    if (gain != nullptr && bias != nullptr)
      vmath::assign_packets(y, n, [normed](const auto& v, const auto& g, const auto& c) { return normed(v) * g + c; }, x, gain, bias);
    else if (gain != nullptr)
      vmath::assign_packets(y, n, [normed](const auto& v, const auto& g) { return normed(v) * g; }, x, gain);
    else if (bias != nullptr)
      vmath::assign_packets(y, n, [normed](const auto& v, const auto& c) { return normed(v) + c; }, x, bias);
    else
      vmath::assign_packets(y, n, normed, x);
  });
}

/// out = in / sqrt(mean(in²) + eps) along each row. `out` may be `in`.
template <class Exec, class T>
void rms_norm_rows(const Exec& exec, const T* in, T* out, std::int64_t rows, std::int64_t n, double eps) {
  static_assert(is_host_exec_v<Exec> && vmath::is_vector_type_v<T>,
                "shardlib::kernels::rms_norm_rows: host execution spaces, float or double");
  if (rows > 0 && n > 0) count_kernel(2 * static_cast<std::uint64_t>(rows * n) * sizeof(T));  // in read, out written
  if (shardlib::shape_only()) return;
  detail::check_rows("rms_norm_rows", rows, n, eps);
  detail::for_rows(exec, "shardlib::kernels::rms_norm_rows", rows, n, [=](std::int64_t r) {
    const T* x = in + r * n;
    const double q = vmath::sum_runs(n, [](const auto& v) { return v.square(); }, x);  // (as layer_norm_rows)
    const T rs = static_cast<T>(1 / std::sqrt(q / static_cast<double>(n) + eps));
    vmath::assign_packets(out + r * n, n, [rs](const auto& v) { return v * rs; }, x);
  });
}

}  // namespace shardlib::kernels

SHARDLIB_SIMD_WARNINGS_ON
