// SPDX-License-Identifier: Apache-2.0
/// @file
/// Kernels over one device's block, on the device's execution-space instance: walking a block
/// with global indices (`Index`, loops), filling it (creation functions), copying boxes between
/// row-major blocks (`copy_box`, what local reshard steps and layout ops run) and the regions
/// that name such boxes for the collectives (`region_in`).
///
/// Part of the layer that executes plans (execute/): it knows blocks and Contexts, not tensors.
/// Each kernel takes the block's memory space `Mem` (host memory by default): blocks in host
/// memory run on the device's host execution space instance and are fenced before the call
/// returns; blocks in device memory (Kokkos::CudaSpace) run on the device's own instance
/// (`Context::exec_for<Mem>()`, its own stream) one element per GPU thread, ordered by the stream
/// with no host wait. `download` and `upload` move a block between device and host memory.
///
/// In shape-only mode (detail/shape_only.hpp) the kernels, copies, fills and transfers here do
/// nothing: a host buffer a transfer would write keeps what it held. In both modes each is
/// counted as a memory-bound kernel (kernels::count_kernel) before it would run.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/detail/attributes.hpp>
#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/runtime/runtime.hpp>
#include <shardlib/sharding/block.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace shardlib {

/// A global multi-index, handed to loop bodies: `i[0]` is the index along dim 0.
template <std::size_t R>
struct Index {
  std::int64_t i[R > 0 ? R : 1] = {};
  static constexpr std::size_t rank = R;
  KOKKOS_INLINE_FUNCTION constexpr std::int64_t operator[](std::size_t d) const { return i[d]; }
};

namespace detail {

/// Walks the elements of a box (a device's block, row-major) in chunks of `chunk` consecutive
/// elements, one Kokkos work item each: item `c` covers the local linear indices
/// [c * chunk, min(size, (c + 1) * chunk)). The global index is carried from element to element
/// (an add per element, a carry per row); only a chunk's first element costs a divide per dim.
/// Along the last (contiguous) dim the walk is a plain counted loop, which the compiler can
/// vectorise once the loop body is inlined.
template <std::size_t R>
struct BlockWalk {
  /// Elements per work item by default: enough to hide the per-item start, small enough to
  /// spread a block over the threads of an OpenMP execution space.
  static constexpr std::int64_t default_chunk = std::int64_t{1} << 13;
  std::int64_t offset[R > 0 ? R : 1] = {};
  std::int64_t extent[R > 0 ? R : 1] = {};
  std::int64_t size = 0;              ///< elements in the box
  std::int64_t chunk = default_chunk;  ///< elements per work item
  BlockWalk() = default;
  /// The walk of box `b` in at most `max_items` work items (chunks of default_chunk or more).
  explicit BlockWalk(const ShardBox& b, std::int64_t max_items = std::numeric_limits<std::int64_t>::max())
      : size(b.num_elements()) {
    for (std::size_t d = 0; d != R; ++d) {  // != R: nvcc warns of d < 0 for R = 0
      offset[d] = b.offset[d];
      extent[d] = b.extent[d];
    }
    if (chunks() > max_items) chunk = (size + max_items - 1) / max_items;
  }
  /// Number of work items.
  std::int64_t chunks() const noexcept { return (size + chunk - 1) / chunk; }
  /// Calls `elem(const Index<R>& global, std::int64_t k)` for each element of item `c`, in order;
  /// `k` is the element's row-major position in the block.
  template <class Elem>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t c, Elem elem) const {  // a copy: kept in registers
    std::int64_t k = c * chunk;
    const std::int64_t end = size - k < chunk ? size : k + chunk;
    if constexpr (R == 0) {
      if (k < end) elem(Index<R>{}, k);
    } else {
      constexpr std::size_t last = R - 1;
      Index<R> g;
      std::int64_t rest = k;
      for (std::size_t d = R; d-- > 0;) {
        g.i[d] = offset[d] + rest % extent[d];
        rest /= extent[d];
      }
      const std::int64_t row_end = offset[last] + extent[last];
      for (;;) {
        const std::int64_t first = g.i[last];
        const std::int64_t len = end - k < row_end - first ? end - k : row_end - first;
        Index<R> h = g;  // a copy indexed by constants only: it lives in registers
        for (std::int64_t j = 0; j < len; ++j) {  // along the contiguous dim
          h.i[last] = first + j;
          elem(static_cast<const Index<R>&>(h), k + j);
        }
        k += len;
        if (k >= end) return;
        g.i[last] = offset[last];  // next row: carry into the outer dims
        for (std::size_t d = last; d-- > 0;) {
          if (++g.i[d] < offset[d] + extent[d]) break;
          g.i[d] = offset[d];
        }
      }
    }
  }
};

/// The device kernels below are functors, not lambdas: nvcc cannot name an extended lambda whose
/// enclosing function has class-type template arguments (a Mesh's axis names, a Spec), and one
/// functor serves every spec type.

/// Work item `c` of a block walk: the element functor on its chunk (device memory only).
SHARDLIB_DEVICE_FUNCTORS_BEGIN
template <std::size_t R, class Elem>
struct WalkKernel {
  BlockWalk<R> walk;
  Elem elem;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t c) const { walk(c, elem); }
};
SHARDLIB_DEVICE_FUNCTORS_END

/// Runs `elem(const Index<R>& global, std::int64_t k)` on every element of block `box` (k: its
/// row-major position in the block) as a Kokkos kernel on the device's execution space instance
/// for `Mem` (in device memory `elem` runs on the GPU: a KOKKOS_LAMBDA or a functor whose
/// operator() is KOKKOS_INLINE_FUNCTION). Counted as a kernel that writes `elem_bytes` per
/// element (the element size of the tensor it writes): what `elem` reads is unknown here.
template <std::size_t R, class Mem = Kokkos::HostSpace, class Elem>
void for_each_in_block(const char* label, const Context& ctx, const ShardBox& box, const Elem& elem,
                       std::size_t elem_bytes = 0) {
  BlockWalk<R> walk(box);
  if (walk.size == 0) return;
  kernels::count_kernel(static_cast<std::uint64_t>(walk.size) * elem_bytes);
  if (shardlib::shape_only()) return;
  if constexpr (host_memory_v<Mem>) {
    auto guard = kernel_guard(ctx, false);
    Kokkos::parallel_for(label, Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, walk.chunks()),
                         [=](std::int64_t c) { walk(c, elem); });
    kernels::fence(ctx.exec());
  } else {
    walk.chunk = 1;  // one element per GPU thread: neighbouring threads touch neighbouring elements
    Kokkos::parallel_for(label, Kokkos::RangePolicy<exec_space_t<Mem>>(ctx.exec_for<Mem>(), 0, walk.size),
                         WalkKernel<R, Elem>{walk, elem});
  }
}

/// Runs `f(k)` for k in [0, n) as a Kokkos kernel on the device's execution space instance for
/// `Mem` (kernels::detail::portable::run there): on the host, under the kernel guard and fenced;
/// in device memory, queued on the device's stream (`f` a functor whose operator() is
/// KOKKOS_INLINE_FUNCTION). Counted as a kernel of `bytes` (what `f` reads and writes, which only
/// the caller knows: k need not be an element).
template <class Mem, class F>
void for_range(const char* label, const Context& ctx, std::int64_t n, const F& f, std::uint64_t bytes = 0) {
  if (n == 0) return;
  kernels::count_kernel(bytes);
  if (shardlib::shape_only()) return;
  [[maybe_unused]] const auto guard = kernel_guard_for<Mem>(ctx, false);
  kernels::detail::portable::run(ctx.exec_for<Mem>(), label, n, f);
}

/// Row-major linear index of `g` in a tensor of `shape`.
template <std::size_t R>
KOKKOS_INLINE_FUNCTION std::int64_t linear_index(const Index<R>& g, const std::int64_t (&shape)[R > 0 ? R : 1]) {
  std::int64_t k = 0;
  for (std::size_t d = 0; d != R; ++d) k = k * shape[d] + g.i[d];  // != R: nvcc warns of d < 0 for R = 0
  return k;
}

/// splitmix64's finaliser: a bijective 64-bit mix (counter-based random numbers).
KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// lo + (hi - lo) * u with the product rounded before the sum, on every compiler and processor:
/// never a fused multiply-add (nvcc fuses `a * b + c` by default, g++ where the target has FMA),
/// so that a random tensor has the same bits in GPU memory as in host memory.
template <class F>
KOKKOS_INLINE_FUNCTION F lerp_unfused(F lo, F hi, F u) {
  static_assert(std::is_same_v<F, float> || std::is_same_v<F, double>);
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<F, float>) return __fadd_rn(lo, __fmul_rn(hi - lo, u));
  else return __dadd_rn(lo, __dmul_rn(hi - lo, u));
#else
  F p = (hi - lo) * u;
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(p));  // an optimisation barrier: the compiler cannot fuse p into the sum
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(p));
#endif
  return lo + p;
#endif
}

/// The random value of element `k` (global linear index) for `seed`: uniform in [lo, hi), the
/// same bits on the host and on a GPU.
template <class T>
KOKKOS_INLINE_FUNCTION T random_value(std::uint64_t seed, std::int64_t k, T lo, T hi) {
  const std::uint64_t x = mix64(static_cast<std::uint64_t>(k) ^ mix64(seed));
  if constexpr (is_floating_v<T>) {
    if constexpr (sizeof(T) <= 4) {  // float, f16, bf16: the float value, rounded
      const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact, < 1
      const T v = static_cast<T>(lerp_unfused<float>(static_cast<float>(lo), static_cast<float>(hi), u));
      return v < hi ? v : lo;
    } else if constexpr (std::is_same_v<T, double>) {
      const double u = static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
      const T v = lerp_unfused<double>(lo, hi, u);
      return v < hi ? v : lo;
    } else {
      const double u = static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
      const T v = static_cast<T>(lo + (hi - lo) * u);
      return v < hi ? v : lo;
    }
  } else {
    const auto span = static_cast<std::uint64_t>(static_cast<std::int64_t>(hi) - static_cast<std::int64_t>(lo));
    return static_cast<T>(static_cast<std::int64_t>(lo) + static_cast<std::int64_t>(span ? x % span : 0));
  }
}

/// A box inside a row-major buffer that holds box `layout` (global indices), as a region.
inline coll::Region region_in(const ShardBox& layout, const ShardBox& part) {
  coll::Region r;
  if (part.num_elements() == 0) return r;
  if (layout.rank == 0) return coll::Region::contiguous(0, 1);
  r.rank = layout.rank;
  std::size_t stride = 1;
  for (int d = layout.rank - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    r.stride[u] = stride;
    r.extent[u] = static_cast<std::size_t>(part.extent[u]);
    r.offset += static_cast<std::size_t>(part.offset[u] - layout.offset[u]) * stride;
    stride *= static_cast<std::size_t>(layout.extent[u]);
  }
  return r;
}

/// Whether a region is one contiguous run (row-major strides with no gaps).
inline bool is_contiguous(const coll::Region& r) {
  std::size_t expect = 1;
  for (int d = r.rank - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    if (r.extent[u] != 1 && r.stride[u] != expect) return false;
    expect *= r.extent[u];
  }
  return true;
}

/// The walk of a box copy between two row-major blocks: per dim of the part, its extent, its
/// offsets in the source and destination blocks and their strides.
struct BoxCopyWalk {
  int rank = 0;
  std::int64_t ext[max_tensor_rank] = {}, soff[max_tensor_rank] = {}, doff[max_tensor_rank] = {},
               sstr[max_tensor_rank] = {}, dstr[max_tensor_rank] = {};
  BoxCopyWalk(const ShardBox& src_layout, const ShardBox& dst_layout, const ShardBox& part) : rank(part.rank) {
    std::int64_t ss = 1, ds = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      ext[u] = part.extent[u];
      soff[u] = part.offset[u] - src_layout.offset[u];
      doff[u] = part.offset[u] - dst_layout.offset[u];
      sstr[u] = ss;
      dstr[u] = ds;
      ss *= src_layout.extent[u];
      ds *= dst_layout.extent[u];
    }
  }
  /// The source and destination positions of the part's element `e` (row-major in the part).
  KOKKOS_INLINE_FUNCTION void at(std::int64_t e, std::int64_t& so, std::int64_t& dof) const {
    so = 0;
    dof = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t i = e % ext[d];
      e /= ext[d];
      so += (soff[d] + i) * sstr[d];
      dof += (doff[d] + i) * dstr[d];
    }
  }
};

/// One element of a box copy per work item (device memory).
template <class T>
struct CopyBoxKernel {
  BoxCopyWalk w;
  const T* src;
  T* dst;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t e) const {
    std::int64_t so, dof;
    w.at(e, so, dof);
    dst[dof] = src[so];
  }
};
/// dst[k] = value (device memory).
template <class T>
struct FillKernel {
  T* dst;
  T value;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t k) const { dst[k] = value; }
};

/// Copies box `part` (global indices) from a row-major buffer holding box `src_layout` to one
/// holding `dst_layout`, both in `Mem`, as a Kokkos kernel: in host memory, contiguous runs along
/// the last dim in chunks of memcpy; in device memory, one asynchronous copy when the part is
/// one run, else one element per GPU thread.
template <class Mem = Kokkos::HostSpace, class T>
void copy_box(const Context& ctx, const T* src, const ShardBox& src_layout, T* dst, const ShardBox& dst_layout,
              const ShardBox& part) {
  const std::int64_t n = part.num_elements();
  if (n == 0) return;
  kernels::count_kernel(2 * static_cast<std::uint64_t>(n) * sizeof(T));  // the part read and written
  if (shardlib::shape_only()) return;
  const coll::Region from = region_in(src_layout, part), to = region_in(dst_layout, part);
  const bool one_run = is_contiguous(from) && is_contiguous(to);
  if constexpr (!host_memory_v<Mem>) {
    const auto& exec = ctx.exec_for<Mem>();
    if (one_run) {
      using View = Kokkos::View<T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
      using ConstView = Kokkos::View<const T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
      Kokkos::deep_copy(exec, View(dst + to.offset, static_cast<std::size_t>(n)),
                        ConstView(src + from.offset, static_cast<std::size_t>(n)));
      return;
    }
    Kokkos::parallel_for("shardlib::copy_box", Kokkos::RangePolicy<exec_space_t<Mem>>(exec, 0, n),
                         CopyBoxKernel<T>{BoxCopyWalk(src_layout, dst_layout, part), src, dst});
    return;
  }
  if (one_run) {  // one run (e.g. whole rows): chunks of one memcpy
    constexpr std::int64_t chunk = 1 << 16;
    const T* s = src + from.offset;
    T* d = dst + to.offset;
    auto guard = kernel_guard(ctx, false);
    Kokkos::parallel_for(
        "shardlib::copy_run", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, (n + chunk - 1) / chunk),
        [=](std::int64_t c) {
          const std::int64_t len = n - c * chunk < chunk ? n - c * chunk : chunk;
          std::memcpy(d + c * chunk, s + c * chunk, static_cast<std::size_t>(len) * sizeof(T));
        });
    kernels::fence(ctx.exec());
    return;
  }
  const int r = part.rank;
  const std::int64_t run = r == 0 ? 1 : part.extent[static_cast<std::size_t>(r - 1)];
  const std::int64_t rows = n / run;
  constexpr std::int64_t chunk = 1 << 14;
  const std::int64_t chunks = (run + chunk - 1) / chunk;
  const BoxCopyWalk w(src_layout, dst_layout, part);
  auto guard = kernel_guard(ctx, false);
  Kokkos::parallel_for(
      "shardlib::copy_box", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, rows * chunks),
      [=](std::int64_t item) {
        const std::int64_t row = item / chunks, c = item % chunks;
        std::int64_t so, dof;
        w.at(row * run + c * chunk, so, dof);  // the run's first element: the divides once per run
        const std::int64_t len = run - c * chunk < chunk ? run - c * chunk : chunk;
        std::memcpy(dst + dof, src + so, static_cast<std::size_t>(len) * sizeof(T));
      });
  kernels::fence(ctx.exec());
}

/// Sets `n` elements of `dst` (in `Mem`) to `value`, as a Kokkos kernel.
template <class Mem = Kokkos::HostSpace, class T>
void fill(const Context& ctx, T* dst, std::int64_t n, T value) {
  if (n == 0) return;
  kernels::count_kernel(static_cast<std::uint64_t>(n) * sizeof(T));  // dst written
  if (shardlib::shape_only()) return;
  if constexpr (host_memory_v<Mem>) {
    auto guard = kernel_guard(ctx, false);
    Kokkos::parallel_for(
        "shardlib::fill", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, n),
        [=](std::int64_t k) { dst[k] = value; });
    kernels::fence(ctx.exec());
  } else {
    Kokkos::parallel_for("shardlib::fill", Kokkos::RangePolicy<exec_space_t<Mem>>(ctx.exec_for<Mem>(), 0, n),
                         FillKernel<T>{dst, value});
  }
}

/// The GPU that `p` points into when it is GPU memory the host cannot read (cudaMalloc, a
/// Kokkos::CudaSpace view), else -1: host memory (pageable, pinned), managed memory, null, or a
/// build without CUDA. For the entry points that read a user's host array (from_host,
/// scatter_from): given a GPU pointer they would crash in a host copy.
inline int gpu_only_memory_device(const void* p) noexcept {
#if defined(KOKKOS_ENABLE_CUDA)
  if (p == nullptr) return -1;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: an unknown pointer is the host's
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
#else
  (void)p;
  return -1;
#endif
}

/// Copies `n` elements from a buffer in `From` to one in `To` (at least one of them host memory)
/// and waits for the copy: on the device's instance for the device memory side, else a host copy.
template <class From, class To, class T>
void transfer(const Context& ctx, const T* src, T* dst, std::int64_t n) {
  if (n == 0) return;
  if constexpr (host_memory_v<From> && host_memory_v<To>) {
    ShardBox b;
    b.rank = 1;
    b.extent[0] = n;
    copy_box(ctx, src, b, dst, b, b);  // (counted there, and nothing else in shape-only mode)
  } else {
    kernels::count_kernel(2 * static_cast<std::uint64_t>(n) * sizeof(T));  // src read, dst written
    if (shardlib::shape_only()) return;
    using Device = std::conditional_t<host_memory_v<From>, To, From>;
    const auto& exec = ctx.exec_for<Device>();
    Kokkos::deep_copy(exec, Kokkos::View<T*, To, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(dst, static_cast<std::size_t>(n)),
                      Kokkos::View<const T*, From, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(src, static_cast<std::size_t>(n)));
    kernels::fence(exec);
  }
}
/// A block in `Mem` to host memory (the host reads it next).
template <class Mem, class T>
void download(const Context& ctx, const T* src, T* host, std::int64_t n) {
  transfer<Mem, Kokkos::HostSpace>(ctx, src, host, n);
}
/// Host memory into a block in `Mem` (the host buffer may go next).
template <class Mem, class T>
void upload(const Context& ctx, const T* host, T* dst, std::int64_t n) {
  transfer<Kokkos::HostSpace, Mem>(ctx, host, dst, n);
}

/// The values creation functions fill a block with, by global linear index (functors rather
/// than lambdas: one Kokkos kernel per element type and rank, shared by every spec type).
template <class T>
struct FullValue {
  T v;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t) const { return v; }
};
template <class T>
struct IotaValue {
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t k) const { return static_cast<T>(k); }
};
template <class T>
struct RandomValue {
  std::uint64_t seed;
  T lo, hi;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t k) const { return random_value<T>(seed, k, lo, hi); }
};

/// A global shape, carried into kernels by value.
template <std::size_t R>
struct ShapeOf {
  std::int64_t s[R > 0 ? R : 1] = {};
};

/// data[k] = value(global linear index of the element).
template <std::size_t R, class T, class G>
struct GenerateKernel {
  T* data;
  ShapeOf<R> shape;
  G value;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(const Index<R>& g, std::int64_t k) const {
    data[k] = value(linear_index<R>(g, shape.s));
  }
};

/// Fills block `box` (row-major at `data`, in `Mem`) of a tensor of global `shape` with
/// `value(k)` of each element's global linear index k, as a Kokkos kernel.
template <std::size_t R, class Mem = Kokkos::HostSpace, class T, class G>
SHARDLIB_NOINLINE void generate_block(const Context& ctx, T* data, const ShardBox& box, const std::int64_t* shape, G value) {
  ShapeOf<R> gshape;
  for (std::size_t d = 0; d != R; ++d) gshape.s[d] = shape[d];
  for_each_in_block<R, Mem>("shardlib::generate", ctx, box, GenerateKernel<R, T, G>{data, gshape, value}, sizeof(T));
}

}  // namespace detail
}  // namespace shardlib
