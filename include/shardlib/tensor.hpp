// SPDX-License-Identifier: Apache-2.0
/// @file
/// `DistributedTensor<T, Mesh, Spec>`: a global tensor whose sharding is its type.
///
/// Each device holds one block of the global tensor (sharding/block.hpp: ceil-division, trailing
/// blocks may be smaller or empty) as a Kokkos view in row-major order. Shardings change by
/// `reshard<Spec>(t)`, by constructing or assigning a tensor of another spec; the plan comes from
/// sharding/reshard.hpp (derived at compile time from the two spec types) and moves the fewest
/// bytes. Loops (`parallel_for`, `parallel_reduce`, `map`) are Kokkos kernels over the local block
/// that hand the functor global indices.
///
/// ```
/// rt.spmd([](sl::Context& ctx) {
///   sl::Mesh<"data", "model"> mesh(ctx, {4, 2});
///   auto x = sl::DistributedTensor<float, decltype(mesh), sl::Spec<"data", sl::none>>::random(mesh, {256, 64}, 1);
///   sl::DistributedTensor<float, decltype(mesh), sl::Spec<sl::none, "model">> y = x;  // one all_to_all
/// });
/// ```
///
/// Copies share the block (as Kokkos views do); `clone()` copies it. Every creation function and
/// every reshard is collective over the mesh's devices when it communicates: all devices call it,
/// in the same order.
///
/// In shape-only mode (detail/shape_only.hpp) blocks are allocated and resharded as always but no
/// element is written or read: loops run nothing, `parallel_reduce` returns zero, `to_host`,
/// `item` and `gather_to` give zeros.
#pragma once

#include <shardlib/collectives/communicator.hpp>
#include <shardlib/detail/attributes.hpp>
#include <shardlib/detail/diagnostics.hpp>
#include <shardlib/detail/function_ref.hpp>
#include <shardlib/detail/pack.hpp>
#include <shardlib/detail/shape_only.hpp>
#include <shardlib/execute/block.hpp>
#include <shardlib/execute/reshard.hpp>
#include <shardlib/half.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/memory.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/runtime/runtime.hpp>
#include <shardlib/sharding/block.hpp>
#include <shardlib/sharding/reshard.hpp>
#include <shardlib/spec.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib {

/// Compile-time errors about tensors (undefined on purpose: see detail/diagnostics.hpp).
namespace error {
template <class T>
struct tensor_element_type_must_be_arithmetic;
template <class SpecT>
struct loop_over_a_partial_tensor_reshard_it_first;
template <class MeshT, class OtherMeshT>
struct tensors_on_different_meshes_cannot_be_resharded_into_each_other;
template <class SpecT, std::size_t SpecRank, std::size_t ShapeRank>
struct shape_has_a_different_number_of_extents_than_the_spec;
template <class FromSpec, class ToSpec>
struct reshard_changes_the_rank;
/// Loops over several tensors: argument `Arg` (0 is the first tensor) is not a tensor, or differs
/// from the first tensor in mesh type, spec or memory space.
template <std::size_t Arg, class NotATensor>
struct loop_argument_before_the_functor_is_not_a_tensor;
template <std::size_t Arg, class ArgMesh, class FirstMesh>
struct loop_over_tensors_on_different_mesh_types;
template <std::size_t Arg, class ArgSpec, class FirstSpec>
struct loop_over_tensors_of_different_specs;
template <std::size_t Arg, class ArgMemory, class FirstMemory>
struct loop_over_tensors_in_different_memory_spaces;
/// parallel_for's functor takes the written element by value or const reference.
template <class F, class T>
struct parallel_for_functor_must_take_the_written_element_by_non_const_reference;
}  // namespace error

namespace detail {
template <class T, std::size_t R>
struct view_data {
  using type = typename view_data<T, R - 1>::type*;
};
template <class T>
struct view_data<T, 0> {
  using type = T;
};

template <class T>
inline constexpr bool is_element_v = (std::is_arithmetic_v<T> || is_half_v<T>) && !std::is_same_v<T, bool> &&
                                     !std::is_const_v<T> && !std::is_volatile_v<T>;

inline std::string shape_text(detail::ArrayRef<std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

/// Passed to a factory (`zeros`, `full`, `uninitialized`) by the library's own code when the
/// shape comes from an existing tensor: the devices agree on it already, so the factory does not
/// check (see DistributedTensor's factories).
struct same_shape_t {
  explicit same_shape_t() = default;
};
inline constexpr same_shape_t same_shape{};

/// What error messages say of a tensor type: its element type and its spec, the spec as a
/// function so that it is formatted only when something throws. The checks below take it instead
/// of the tensor's type: they are compiled once, not once per tensor type (their throws build
/// strings, most of the code of a small function).
struct TensorTypeText {
  const char* element;
  std::string (*spec)();
};

/// Throws std::invalid_argument when an extent of `shape` is negative (a tensor's constructor).
inline void check_extents(ArrayRef<std::int64_t> shape, TensorTypeText type) {
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] < 0)
      throw std::invalid_argument("shardlib: tensor of shape " + shape_text(shape) + " with " + type.spec() + ": dim " +
                                  std::to_string(d) + " has a negative extent");
}

/// The devices' check that they passed one shape to factory `what` (DistributedTensor's
/// agree_on_shape, which see): one mismatch round over the agreement group, a throw on every
/// device naming two devices' shapes when they differ.
inline void agree_on_shape(Context& ctx, const MeshShape& mesh, ArrayRef<std::int64_t> shape, const char* what,
                           TensorTypeText type, std::int64_t extra, int extra_device) {
  const std::size_t rank = shape.size();
  if (rank == 0 && std::strcmp(what, "scatter_from") != 0)
    return;  // a scalar's shape cannot differ: no round trip (backward's seed is one); root's extra word can
  const std::size_t n = rank + 1;
  std::vector<std::int64_t> words(shape.begin(), shape.end());
  words.push_back(extra);
  const std::vector<std::int64_t> all = ctx.agreement_group().mismatch(std::span<const std::int64_t>(words));
  const auto bad_extra = [&](std::int64_t e, std::size_t d) {
    std::int64_t elements = 1;
    for (auto x : shape) elements *= x;
    return std::invalid_argument(std::string("shardlib: ") + what + " from device " + std::to_string(d) + ": " +
                                 (e > 0 ? "a host array of " + std::to_string(e - 1) + " elements"
                                        : "an array in the memory of GPU " + std::to_string(-e - 1) +
                                              " (the host cannot read it; pass a host array)") +
                                 " for a tensor of shape " + shape_text(shape) + " with " + type.spec() + " (" +
                                 std::to_string(elements) + " elements)");
  };
  if (all.empty()) {  // every device passed these words (a lone device too): its own extra is everyone's
    if (extra != 0) throw bad_extra(extra, static_cast<std::size_t>(extra_device));
    return;
  }
  const auto devices = all.size() / n;
  for (std::size_t d = 0; d < devices; ++d)
    if (const std::int64_t e = all[d * n + rank]; e != 0) throw bad_extra(e, d);
  const auto shape_of = [&](std::size_t d) { return ArrayRef<std::int64_t>(all.data() + d * n, rank); };
  std::size_t other = 1;
  while (other + 1 < devices && std::equal(all.begin() + static_cast<std::ptrdiff_t>(other * n),
                                           all.begin() + static_cast<std::ptrdiff_t>(other * n + rank), all.begin()))
    ++other;
  throw std::invalid_argument(std::string("shardlib: ") + what + ": the devices passed different shapes for a " +
                              type.element + " tensor " + type.spec() + " on mesh " + mesh.to_string() + ": device 0 " +
                              shape_text(shape_of(0)) + ", device " + std::to_string(other) + " " +
                              shape_text(shape_of(other)) +
                              " (a tensor's shape is global, the same on every device; its spec splits it)");
}

}  // namespace detail

/// A global tensor of `T` on `MeshT`, sharded by `SpecT` (see the file comment).
///
/// `MemorySpace` is where blocks live: host memory (the default), or with a CUDA-enabled Kokkos
/// `Kokkos::CudaSpace` (docs/13_gpus.md). In device memory, creation, `clone` and the loops run
/// as kernels on the device's own stream (`Context::exec_for`); `from_host` and `to_host` copy
/// through host memory; reshards run on the device world's communicators under the nccl backend
/// and through host memory under threads and mpi; the ops (ops.hpp) take tensors in host memory
/// only, for now.
template <class T, class MeshT, class SpecT, class MemorySpace = Kokkos::HostSpace>
class DistributedTensor {
  static_assert(is_mesh_v<MeshT>, "shardlib: DistributedTensor<T, Mesh, Spec>: Mesh must be a shardlib::Mesh<...>");
  static_assert(is_spec_v<SpecT>, "shardlib: DistributedTensor<T, Mesh, Spec>: Spec must be a shardlib::Spec<...>");
  SHARDLIB_STATIC_REQUIRE((detail::is_element_v<T>),
                          "shardlib: the element type of a DistributedTensor must be arithmetic (not bool, const or volatile) or shardlib::f16/bf16",
                          error::tensor_element_type_must_be_arithmetic<T>);
  static_assert(Kokkos::is_memory_space<MemorySpace>::value,
                "shardlib: DistributedTensor<T, Mesh, Spec, MemorySpace>: MemorySpace must be a Kokkos memory space");

 public:
  using value_type = T;
  using mesh_type = MeshT;
  using spec_type = SpecT;
  using memory_space = MemorySpace;
  static constexpr std::size_t rank = SpecT::rank;
  /// The sharding, resolved and checked against the mesh at compile time.
  static constexpr Sharding sharding = sharding_v<MeshT, SpecT>;
  /// Global extents.
  using Shape = std::array<std::int64_t, rank>;
  /// The local block as a Kokkos view (row-major). Unmanaged: the tensor (and its copies) own the
  /// block, which goes back to the device's block cache when the last of them goes; a view kept
  /// longer must be deep-copied.
  using local_view_type = Kokkos::View<typename detail::view_data<T, rank>::type, Kokkos::LayoutRight, MemorySpace,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  /// Factories: a tensor's shape is global, the same on every device (SPMD). Each factory that
  /// takes a shape from the caller checks that the devices agree on it: one all_reduce of the
  /// shape (not counted in the collectives' counters), and on a mismatch every device throws
  /// std::invalid_argument naming the factory, the tensor's type and two devices' shapes.

  /// A tensor of `shape` filled with `value` (a partial-sum tensor holds it on coordinate 0 of its
  /// partial axes, zeros elsewhere: the sum is `value`).
  static DistributedTensor full(const MeshT& mesh, const Shape& shape, T value) {
    agree_on_shape(mesh, shape, "full");
    return full(mesh, shape, value, detail::same_shape);
  }
  /// full() for the library's own calls, whose shape comes from a tensor (no check).
  static DistributedTensor full(const MeshT& mesh, const Shape& shape, T value, detail::same_shape_t) {
    DistributedTensor t(mesh, shape);
    t.generate(detail::FullValue<T>{value});
    return t;
  }
  template <std::size_t N>
  static DistributedTensor full(const MeshT& mesh, const std::int64_t (&shape)[N], T value) {
    return full(mesh, checked_shape(shape), value);
  }
  static DistributedTensor zeros(const MeshT& mesh, const Shape& shape) { return full(mesh, shape, T{}); }
  static DistributedTensor zeros(const MeshT& mesh, const Shape& shape, detail::same_shape_t s) {
    return full(mesh, shape, T{}, s);
  }
  template <std::size_t N>
  static DistributedTensor zeros(const MeshT& mesh, const std::int64_t (&shape)[N]) {
    return full(mesh, checked_shape(shape), T{});
  }
  /// A tensor of `shape` whose blocks are allocated but not initialised: for code that writes
  /// every element of its block before anything reads it (a checkpoint load, a kernel's output).
  static DistributedTensor uninitialized(const MeshT& mesh, const Shape& shape) {
    agree_on_shape(mesh, shape, "uninitialized");
    return DistributedTensor(mesh, shape);
  }
  static DistributedTensor uninitialized(const MeshT& mesh, const Shape& shape, detail::same_shape_t) {
    return DistributedTensor(mesh, shape);
  }
  /// Element k (row-major global linear index) = T(k).
  static DistributedTensor iota(const MeshT& mesh, const Shape& shape) {
    agree_on_shape(mesh, shape, "iota");
    DistributedTensor t(mesh, shape);
    t.generate(detail::IotaValue<T>{});
    return t;
  }
  template <std::size_t N>
  static DistributedTensor iota(const MeshT& mesh, const std::int64_t (&shape)[N]) {
    return iota(mesh, checked_shape(shape));
  }
  /// Uniform in [lo, hi), from a counter-based generator on the global index: the same global
  /// tensor for a seed whatever the mesh, spec and backend. Defaults: [0, 1) for floating-point
  /// types, [0, 100) for integers.
  static DistributedTensor random(const MeshT& mesh, const Shape& shape, std::uint64_t seed,
                                  T lo = T{0}, T hi = is_floating_v<T> ? T{1} : T{100}) {
    if (!(lo < hi))
      throw std::invalid_argument("shardlib: random: the range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                  ") is empty");
    agree_on_shape(mesh, shape, "random");
    DistributedTensor t(mesh, shape);
    t.generate(detail::RandomValue<T>{seed, lo, hi});
    return t;
  }
  template <std::size_t N>
  static DistributedTensor random(const MeshT& mesh, const std::int64_t (&shape)[N], std::uint64_t seed,
                                  T lo = T{0}, T hi = is_floating_v<T> ? T{1} : T{100}) {
    return random(mesh, checked_shape(shape), seed, lo, hi);
  }

  /// From a global row-major array that every device passes (each copies its block; no
  /// communication). Throws std::invalid_argument when its size is not the shape's element count,
  /// or when it is GPU memory (with CUDA: a cudaMalloc'd pointer, a CudaSpace view's data).
  static DistributedTensor from_host(const MeshT& mesh, const Shape& shape, std::span<const T> global) {
    agree_on_shape(mesh, shape, "from_host");
    DistributedTensor t(mesh, shape);
    t.check_host_array(global, "from_host");
    const ShardBox all = t.global_box();
    t.write_from_host([&](T* block) { detail::copy_box(t.context(), global.data(), all, block, t.box_, t.box_); });
    t.mask_partial();
    return t;
  }
  template <std::size_t N>
  static DistributedTensor from_host(const MeshT& mesh, const std::int64_t (&shape)[N], std::span<const T> global) {
    return from_host(mesh, checked_shape(shape), global);
  }
  /// From a global row-major array that only device `root` passes (the others pass an empty
  /// span): root sends every device its block (collective). Throws std::invalid_argument on root
  /// when the size is wrong or the array is GPU memory, std::out_of_range when root is not a
  /// device of the mesh.
  static DistributedTensor scatter_from(const MeshT& mesh, const Shape& shape, std::span<const T> global, int root) {
    Context& ctx = mesh.context();
    if (root < 0 || root >= ctx.num_devices())
      throw std::out_of_range("shardlib: scatter_from: root " + std::to_string(root) + " is not a device of mesh " +
                              mesh.to_string());
    // Root's array is checked with the shape, in the same all_reduce: a bad one fails every device.
    std::int64_t bad = 0;  // root: its array's size + 1 when it does not fit; -(GPU + 1) when in GPU memory
    if (ctx.device() == root) {
      if (static_cast<std::int64_t>(global.size()) != shape_size(shape)) bad = static_cast<std::int64_t>(global.size()) + 1;
      else if (const int gpu = detail::gpu_only_memory_device(global.data()); gpu >= 0) bad = -(gpu + 1);
    }
    agree_on_shape(mesh, shape, "scatter_from", bad, root);
    DistributedTensor t(mesh, shape);
    if (ctx.device() == root) t.check_host_array(global, "scatter_from");
    coll::Communicator& world = ctx.world();
    std::vector<coll::Region> send(static_cast<std::size_t>(world.size())), recv(send.size());
    const ShardBox all = t.global_box();
    if (ctx.device() == root)
      for (int d = 0; d < world.size(); ++d)
        send[static_cast<std::size_t>(d)] = detail::region_in(all, shard_box(sharding, mesh.shape(), t.shape_, d));
    recv[static_cast<std::size_t>(root)] = detail::region_in(t.box_, t.box_);
    t.write_from_host([&](T* block) { world.exchange(global.data(), send, block, recv, coll::dtype_of<T>()); });
    t.mask_partial();
    return t;
  }
  template <std::size_t N>
  static DistributedTensor scatter_from(const MeshT& mesh, const std::int64_t (&shape)[N], std::span<const T> global,
                                        int root) {
    return scatter_from(mesh, checked_shape(shape), global, root);
  }

  /// The global tensor, row-major, on every device (collective: a reshard to replicated; zeros in
  /// shape-only mode).
  std::vector<T> to_host() const {
    Sharding all;
    all.rank = static_cast<int>(rank);
    std::vector<T> out;
    if (sharding == all) {
      out.resize(static_cast<std::size_t>(box_.num_elements()));
      detail::download<MemorySpace>(context(), local_.data(), out.data(), box_.num_elements());
      return out;
    }
    Context& ctx = context();
    const auto& c = detail::compiled_reshard(ctx, mesh_.shape(), sharding, all, shape_);
    read_on_host([&](const T* block) {
      detail::run_reshard<T>(ctx, c, block, host_scratch(ctx), [&](std::size_t n) {
        out.resize(n);
        return out.data();
      });
    });
    return out;
  }
  /// The number a scalar (rank-0) tensor holds, on every device: a loss, a norm. Collective when
  /// the tensor is partial (one all_reduce of the number, as `to_host`); local otherwise.
  T item() const
    requires(rank == 0)
  {
    return to_host()[0];
  }
  /// The global tensor on device `root`; an empty vector elsewhere (collective). A partial tensor
  /// is reduced first (to the same dims, replicated over its partial axes).
  std::vector<T> gather_to(int root) const {
    Context& ctx = context();
    if (root < 0 || root >= ctx.num_devices())
      throw std::out_of_range("shardlib: gather_to: root " + std::to_string(root) + " is not a device of mesh " +
                              mesh_.to_string());
    if (sharding.is_partial()) {
      Sharding reduced = sharding;
      reduced.partial = AxisList{};
      reduced.op = ReduceOp::sum;
      const auto& c = detail::compiled_reshard(ctx, mesh_.shape(), sharding, reduced, shape_);
      std::shared_ptr<void> block;
      read_on_host([&](const T* mine) {
        detail::run_reshard<T>(ctx, c, mine, host_scratch(ctx), [&](std::size_t n) {
          block = host_scratch(ctx)(n);
          return static_cast<T*>(block.get());
        });
      });
      return detail::gather_block<T>(ctx, mesh_.shape(), reduced, shape_, static_cast<const T*>(block.get()), root);
    }
    std::vector<T> out;
    read_on_host([&](const T* mine) { out = detail::gather_block<T>(ctx, mesh_.shape(), sharding, shape_, mine, root); });
    return out;
  }

  // -- shape and block ------------------------------------------------------------------------
  const Shape& shape() const noexcept { return shape_; }
  std::int64_t extent(std::size_t d) const { return shape_.at(d); }
  /// Number of elements of the global tensor.
  std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (auto e : shape_) n *= e;
    return n;
  }
  /// This device's block: offset (global index of its first element) and extent per dim.
  const ShardBox& block() const noexcept { return box_; }
  Shape local_shape() const noexcept { return pick(box_.extent); }
  Shape local_offset() const noexcept { return pick(box_.offset); }
  /// The block as a Kokkos view, for code that works on shards directly (like JAX's shard_map).
  const local_view_type& local() const noexcept { return local_; }
  const MeshT& mesh() const noexcept { return mesh_; }
  Context& context() const { return mesh_.context(); }
  /// `Spec<...>` as text, for messages.
  static std::string spec_string() { return SpecT::value.to_string(); }

  /// A tensor with its own copy of the block.
  DistributedTensor clone() const {
    DistributedTensor t(mesh_, shape_);
    detail::copy_box<MemorySpace>(context(), local_.data(), box_, t.local_.data(), box_, box_);
    return t;
  }

  // -- resharding -----------------------------------------------------------------------------
  DistributedTensor(const DistributedTensor&) = default;
  DistributedTensor(DistributedTensor&&) noexcept = default;
  DistributedTensor& operator=(const DistributedTensor&) = default;
  DistributedTensor& operator=(DistributedTensor&&) noexcept = default;

  /// The same global tensor with this spec: a reshard (collective; see sharding/reshard.hpp).
  /// A spec of another rank fails to compile.
  template <class OtherSpec>
    requires(!std::is_same_v<OtherSpec, SpecT>)
  DistributedTensor(const DistributedTensor<T, MeshT, OtherSpec, MemorySpace>& other)  // NOLINT: implicit on purpose
      : mesh_(other.mesh_) {
    SHARDLIB_STATIC_REQUIRE((OtherSpec::rank == rank), "shardlib: a reshard cannot change the rank of a tensor",
                            error::reshard_changes_the_rank<OtherSpec, SpecT>);
    if constexpr (OtherSpec::rank == rank) {
      static constexpr ReshardPlan plan =
          plan_reshard(DistributedTensor<T, MeshT, OtherSpec, MemorySpace>::sharding, sharding);
      shape_ = other.shape_;
      Context& ctx = context();
      const auto& c = detail::compiled_reshard(ctx, mesh_.shape(), other.sharding, sharding, shape_, &plan,
                                               detail::reshards_on_device<MemorySpace>(ctx));
      box_ = c.steps.empty() ? other.box_ : c.steps.back().out_box;
      if (c.steps.empty()) {  // only the label changes: share the block
        owner_ = other.owner_;
        local_ = other.local_;
      } else {
        detail::run_reshard_in<MemorySpace, T>(ctx, c, other.local_.data(), [&](std::size_t) {
          allocate_block();
          return local_.data();
        });
      }
    }
  }
  /// Tensors on different mesh types cannot be converted into each other.
  template <class OtherMesh, class OtherSpec>
    requires(!std::is_same_v<OtherMesh, MeshT>)
  DistributedTensor(const DistributedTensor<T, OtherMesh, OtherSpec, MemorySpace>&) {
    SHARDLIB_STATIC_REQUIRE((std::is_same_v<OtherMesh, MeshT> && false),
                            "shardlib: tensors on different meshes cannot be resharded into each other",
                            error::tensors_on_different_meshes_cannot_be_resharded_into_each_other<MeshT, OtherMesh>);
  }
  /// Reshards `other` into this tensor's spec. Throws std::invalid_argument (naming the shapes,
  /// specs and meshes) when this tensor lives on another mesh; this tensor is unchanged when
  /// anything throws.
  template <class OtherSpec>
  DistributedTensor& operator=(const DistributedTensor<T, MeshT, OtherSpec, MemorySpace>& other) {
    if (!(other.mesh_ == mesh_) || &other.context() != &context())
      throw std::invalid_argument("shardlib: cannot assign a tensor of shape " + detail::shape_text(other.shape_) +
                                  " with " + other.spec_string() + " on mesh " + other.mesh_.to_string() +
                                  " to a tensor of shape " + detail::shape_text(shape_) + " with " + spec_string() +
                                  " on mesh " + mesh_.to_string() + ": the meshes differ");
    DistributedTensor t(other);
    *this = std::move(t);
    return *this;
  }

  /// The steps a reshard of this tensor to `OtherSpec` takes, with the bytes this device moves.
  template <class OtherSpec>
  std::string describe_reshard() const {
    static constexpr ReshardPlan plan = plan_reshard(sharding, sharding_v<MeshT, OtherSpec, rank>);
    return describe(schedule_reshard(plan, mesh_.shape(), shape_), mesh_.shape(), shape_, context().device(), sizeof(T));
  }

  // -- loops (see the free functions parallel_for, parallel_reduce, map) ----------------------
  /// Runs `f(const Index<rank>& global, std::int64_t k)` on every element of this device's block,
  /// `k` being the element's row-major position in `local()`, as a Kokkos kernel on the device's
  /// execution space instance (fenced before it returns). The walk divides only once per chunk of
  /// elements (detail::BlockWalk). Replicas each run it; partial tensors too (their addends).
  template <class F>
  void for_each_local(F f) const {
    detail::for_each_in_block<rank, MemorySpace>("shardlib::parallel_for", context(), box_, f, sizeof(T));
  }

  /// Internal: an uninitialised tensor of `shape` on `mesh`.
  DistributedTensor(const MeshT& mesh, const Shape& shape) : mesh_(mesh), shape_(shape) {
    detail::check_extents(shape_, type_text());
    box_ = shard_box(sharding, mesh_.shape(), shape_, context().device());
    allocate_block();
  }
  /// Internal (ops): a tensor of `shape` on `mesh` whose block is `data`, kept alive by `owner`
  /// (which must hold this device's block of `shape` in this spec, row-major).
  DistributedTensor(const MeshT& mesh, const Shape& shape, std::shared_ptr<void> owner, T* data)
      : mesh_(mesh), shape_(shape), owner_(std::move(owner)) {
    box_ = shard_box(sharding, mesh_.shape(), shape_, context().device());
    local_ = wrap(data, box_, std::make_index_sequence<rank>{});
  }
  /// Internal (ops): what keeps the block alive, to share it with a tensor of another shape.
  const std::shared_ptr<void>& block_owner() const noexcept { return owner_; }

 private:
  template <class, class, class, class>
  friend class DistributedTensor;

  /// Throws std::invalid_argument on every device when the devices passed different shapes to
  /// factory `what` (collective; see the factories' comment).
  /// `extra` (scatter_from): a word that is 0 on every device unless root's array is bad (its size
  /// + 1 when it does not fit, -(GPU + 1) when it is in a GPU's memory).
  static void agree_on_shape(const MeshT& mesh, const Shape& shape, const char* what, std::int64_t extra = 0,
                             int extra_device = 0) {
    detail::agree_on_shape(mesh.context(), mesh.shape(), shape, what, type_text(), extra, extra_device);
  }
  /// The element type and spec, for the checks' messages (detail::TensorTypeText).
  static detail::TensorTypeText type_text() noexcept { return {element_name<T>(), &DistributedTensor::spec_string}; }
  static std::int64_t shape_size(const Shape& shape) noexcept {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
  template <std::size_t N>
  static Shape checked_shape(const std::int64_t (&shape)[N]) {
    SHARDLIB_STATIC_REQUIRE((N == rank), "shardlib: the shape has a different number of extents than the spec has dims",
                            error::shape_has_a_different_number_of_extents_than_the_spec<SpecT, rank, N>);
    Shape s{};
    for (std::size_t d = 0; d < N && d < rank; ++d) s[d] = shape[d];
    return s;
  }
  static Shape pick(const std::array<std::int64_t, max_tensor_rank>& a) noexcept {
    Shape s{};
    for (std::size_t d = 0; d < rank; ++d) s[d] = a[d];
    return s;
  }
  /// A fresh block for box_ from the device's block cache.
  void allocate_block() {
    owner_ = scratch(context())(static_cast<std::size_t>(box_.num_elements()));
    local_ = wrap(static_cast<T*>(owner_.get()), box_, std::make_index_sequence<rank>{});
  }
  template <std::size_t... I>
  static local_view_type wrap(T* data, const ShardBox& b, std::index_sequence<I...>) {
    return local_view_type(data, static_cast<std::size_t>(b.extent[I])...);
  }
  /// Allocates `n` elements from the device's block cache.
  static auto scratch(Context& ctx) {
    return [cache = &detail::block_cache<MemorySpace>(ctx)](std::size_t n) { return cache->allocate(n * sizeof(T)); };
  }
  /// Allocates `n` elements of host memory from the device's host block cache.
  static auto host_scratch(Context& ctx) {
    return [cache = &detail::block_cache<Kokkos::HostSpace>(ctx)](std::size_t n) { return cache->allocate(n * sizeof(T)); };
  }
  /// Calls `write(T* block)` to write the whole block in host memory: the block itself in host
  /// memory, else a host buffer uploaded afterwards.
  template <class Write>
  void write_from_host(Write write) {
    if constexpr (detail::host_memory_v<MemorySpace>) {
      write(local_.data());
    } else {
      const std::int64_t n = box_.num_elements();
      std::shared_ptr<void> staged = host_scratch(context())(static_cast<std::size_t>(n));
      write(static_cast<T*>(staged.get()));
      detail::upload<MemorySpace>(context(), static_cast<const T*>(staged.get()), local_.data(), n);
    }
  }
  /// Calls `read(const T* block)` with the block in host memory: the block itself in host memory,
  /// else a downloaded copy.
  template <class Read>
  void read_on_host(Read read) const {
    if constexpr (detail::host_memory_v<MemorySpace>) {
      read(static_cast<const T*>(local_.data()));
    } else {
      const std::int64_t n = box_.num_elements();
      std::shared_ptr<void> staged = host_scratch(context())(static_cast<std::size_t>(n));
      detail::download<MemorySpace>(context(), static_cast<const T*>(local_.data()), static_cast<T*>(staged.get()), n);
      read(static_cast<const T*>(staged.get()));
    }
  }
  ShardBox global_box() const {
    ShardBox b;
    b.rank = static_cast<int>(rank);
    for (std::size_t d = 0; d < rank; ++d) b.extent[d] = shape_[d];
    return b;
  }
  /// Throws std::invalid_argument naming the tensor when `global` is not a host array of its
  /// element count (the wrong size, or GPU memory: the host copy would crash).
  void check_host_array(std::span<const T> global, const char* what) const {
    if (static_cast<std::int64_t>(global.size()) != size())
      throw std::invalid_argument(std::string("shardlib: ") + what + ": a host array of " + std::to_string(global.size()) +
                                  " elements for a tensor of shape " + detail::shape_text(shape_) + " with " +
                                  spec_string() + " (" + std::to_string(size()) + " elements)");
    if (const int gpu = detail::gpu_only_memory_device(global.data()); gpu >= 0)
      throw std::invalid_argument(std::string("shardlib: ") + what + ": the array for a tensor of shape " +
                                  detail::shape_text(shape_) + " with " + spec_string() + " is in the memory of GPU " +
                                  std::to_string(gpu) + ", which the host cannot read; " + what +
                                  " takes a host array (a std::vector, a host Kokkos::View) and uploads it to a "
                                  "tensor in GPU memory itself. For data already on the GPU, make the tensor "
                                  "(uninitialized) and copy each device's block into local() (Kokkos::deep_copy)");
  }
  /// Fills the block with value(k) of each element's global linear index k, then masks.
  template <class G>
  void generate(G value) {
    detail::generate_block<rank, MemorySpace>(context(), local_.data(), box_, shape_.data(), value);
    mask_partial();
  }
  /// A partial-sum tensor made from a global value holds it on coordinate 0 of its partial axes.
  void mask_partial() {
    if (sharding.is_partial() && sharding.op == ReduceOp::sum &&
        detail::off_first_coordinate(mesh_.shape(), context().device(), sharding.partial))
      detail::fill<MemorySpace>(context(), local_.data(), box_.num_elements(), T{});
  }
  MeshT mesh_;
  Shape shape_{};
  ShardBox box_{};
  std::shared_ptr<void> owner_;  // the block (local_ views it)
  local_view_type local_;
};

/// The same global tensor with spec `NewSpec` (collective; the plan is derived at compile time).
template <class NewSpec, class T, class MeshT, class SpecT, class Mem>
DistributedTensor<T, MeshT, NewSpec, Mem> reshard(const DistributedTensor<T, MeshT, SpecT, Mem>& t) {
  return DistributedTensor<T, MeshT, NewSpec, Mem>(t);
}

// -- loops over global indices ------------------------------------------------------------------
//
// parallel_for, parallel_reduce and map run one Kokkos kernel per device over its block, on the
// device's execution space instance: the block is cut into chunks of consecutive elements
// (detail::BlockWalk), and each chunk walks its rows with the global index carried along, so an
// element costs what a hand-written loop over local() costs (benchmarks/loops.cpp). Several
// tensors of one mesh type, spec and shape are walked together: their blocks have the same box on
// each device, so element k of one block sits beside element k of the others.

namespace detail {
template <class A>
struct tensor_traits {  // not a tensor: void everywhere (keeps the diagnostics below short)
  using mesh = void;
  using spec = void;
  using memory = void;
  using element = void;
};
template <class T, class MeshT, class SpecT, class Mem>
struct tensor_traits<DistributedTensor<T, MeshT, SpecT, Mem>> {
  using mesh = MeshT;
  using spec = SpecT;
  using memory = Mem;
  using element = T;
};
template <class A>
inline constexpr bool is_tensor_v = !std::is_void_v<typename tensor_traits<std::remove_cvref_t<A>>::element>;

/// What a loop hands its functor for an element of tensor argument `A` (a reference type: const
/// when the tensor is), and the pointer it reads it through.
template <class A>
using loop_element_t = std::conditional_t<std::is_const_v<std::remove_reference_t<A>>,
                                          const typename tensor_traits<std::remove_cvref_t<A>>::element&,
                                          typename tensor_traits<std::remove_cvref_t<A>>::element&>;
template <class A>
using loop_pointer_t = std::remove_reference_t<loop_element_t<A>>*;

/// Argument `Arg` of a loop (counted from 0, the first tensor) against the first tensor `First`:
/// a tensor of the same mesh type, spec and memory space, or a compile error that names it.
template <std::size_t Arg, class First, class A>
struct loop_operand_check {
  using F = tensor_traits<std::remove_cvref_t<First>>;
  using O = tensor_traits<std::remove_cvref_t<A>>;
  static constexpr bool tensor = is_tensor_v<A>;
  SHARDLIB_STATIC_REQUIRE(tensor, "shardlib: loop: the arguments before the functor must be DistributedTensors",
                          error::loop_argument_before_the_functor_is_not_a_tensor<Arg, std::remove_cvref_t<A>>);
  static constexpr bool same_mesh = !tensor || std::is_same_v<typename O::mesh, typename F::mesh>;
  SHARDLIB_STATIC_REQUIRE(same_mesh, "shardlib: loop over several tensors: they must be on the same mesh type",
                          error::loop_over_tensors_on_different_mesh_types<Arg, typename O::mesh, typename F::mesh>);
  static constexpr bool same_spec = !tensor || !same_mesh || std::is_same_v<typename O::spec, typename F::spec>;
  SHARDLIB_STATIC_REQUIRE(same_spec,
                          "shardlib: loop over several tensors: they must have the same spec (reshard one first)",
                          error::loop_over_tensors_of_different_specs<Arg, typename O::spec, typename F::spec>);
  static constexpr bool same_memory = !tensor || std::is_same_v<typename O::memory, typename F::memory>;
  SHARDLIB_STATIC_REQUIRE(same_memory, "shardlib: loop over several tensors: they must be in the same memory space",
                          error::loop_over_tensors_in_different_memory_spaces<Arg, typename O::memory, typename F::memory>);
  static constexpr bool value = tensor && same_mesh && same_spec && same_memory;
};

/// Throws std::invalid_argument unless `other` (argument `arg`) has the first tensor's shape and
/// lives on its mesh.
template <class First, class Other>
void check_loop_operand(const char* loop, const First& first, std::size_t arg, const Other& other) {
  const std::string args = std::string("shardlib: ") + loop + ": tensor arguments 0 and " + std::to_string(arg);
  if (!(other.mesh() == first.mesh()) || &other.context() != &first.context())
    throw std::invalid_argument(args + " are on different meshes, " + first.mesh().to_string() + " and " +
                                other.mesh().to_string() + " (spec " + first.spec_string() + ")");
  if (other.shape() != first.shape())
    throw std::invalid_argument(args + " have different shapes, " + shape_text(first.shape()) + " and " +
                                shape_text(other.shape()) + " (both " + first.spec_string() + "); a loop walks tensors of one shape");
}

/// Combines `x` into the running value `acc` of a reduction by `Op`.
template <ReduceOp Op, class R>
KOKKOS_FORCEINLINE_FUNCTION void reduce_into(R& acc, const R& x) {
  if constexpr (Op == ReduceOp::sum) acc += x;
  else if constexpr (Op == ReduceOp::prod) acc *= x;
  else if constexpr (Op == ReduceOp::max) acc = x > acc ? x : acc;
  else acc = x < acc ? x : acc;
}
/// The identity of `Op` on R (what a device without elements contributes).
template <ReduceOp Op, class R>
constexpr R reduce_identity() noexcept {
  if constexpr (Op == ReduceOp::sum) return R(0);
  else if constexpr (Op == ReduceOp::prod) return R(1);
  else if constexpr (Op == ReduceOp::max) return std::numeric_limits<R>::lowest();
  else return std::numeric_limits<R>::max();
}

// map's result: f's on the element's compute type (a 16-bit element reaches f as float), stored
// back in 16 bits when f returns float (half.hpp's stored_t).
template <class F, class I, class T, bool Indexed>
struct map_result {
  using type = stored_t<std::remove_cvref_t<std::invoke_result_t<F, const compute_t<T>&>>, T>;
};
template <class F, class I, class T>
struct map_result<F, I, T, true> {
  using type = stored_t<std::remove_cvref_t<std::invoke_result_t<F, const I&, const compute_t<T>&>>, T>;
};
/// map's kernel: o[k] = f(in[k]) or f(global index, in[k]), on the element's compute type; the
/// form host memory uses (`Device` false: f may be host-only; nvcc warns) and the one device
/// memory uses (f must run on the GPU: calling host code is an error).
template <bool Device, class F, class T, class U, std::size_t R, bool Indexed>
struct MapKernel {
  F f;
  const T* in;
  U* o;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(const Index<R>& g, std::int64_t k) const {
    if constexpr (Indexed) o[k] = static_cast<U>(f(g, static_cast<compute_t<T>>(in[k])));
    else o[k] = static_cast<U>(f(static_cast<compute_t<T>>(in[k])));
  }
};
SHARDLIB_DEVICE_FUNCTORS_BEGIN
template <class F, class T, class U, std::size_t R, bool Indexed>
struct MapKernel<true, F, T, U, R, Indexed> {
  F f;
  const T* in;
  U* o;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(const Index<R>& g, std::int64_t k) const {
    if constexpr (Indexed) o[k] = static_cast<U>(f(g, static_cast<compute_t<T>>(in[k])));
    else o[k] = static_cast<U>(f(static_cast<compute_t<T>>(in[k])));
  }
};
SHARDLIB_DEVICE_FUNCTORS_END
/// map's element type for `f` on a tensor of `T` and rank `R`.
template <class F, class T, std::size_t R>
using map_element_t =
    typename map_result<F, Index<R>, T, std::is_invocable_v<F, const Index<R>&, const compute_t<T>&>>::type;


/// parallel_for's element functor: f(global index, out[k], in[k]...); the form host memory uses
/// (`Device` false: f may be host-only; nvcc warns) and the one device memory uses (f must run on
/// the GPU: calling host code is an error).
template <bool Device, class F, class T, class P, std::size_t... I>
struct ForKernel {
  F f;
  T* out;
  P in;
  template <std::size_t R>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(const Index<R>& g, std::int64_t k) const {
    f(g, out[k], detail::get<I>(in)[k]...);
  }
};
SHARDLIB_DEVICE_FUNCTORS_BEGIN
template <class F, class T, class P, std::size_t... I>
struct ForKernel<true, F, T, P, I...> {
  F f;
  T* out;
  P in;
  template <std::size_t R>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(const Index<R>& g, std::int64_t k) const {
    f(g, out[k], detail::get<I>(in)[k]...);
  }
};
SHARDLIB_DEVICE_FUNCTORS_END

template <class Tensor, class Args, std::size_t... I>
void parallel_for_impl(Tensor& t, const Args& args, std::index_sequence<I...>) {
  using T = typename Tensor::value_type;
  using F = std::remove_cvref_t<std::tuple_element_t<sizeof...(I), Args>>;
  using Idx = Index<Tensor::rank>;
  constexpr bool operands_ok = (loop_operand_check<I + 1, Tensor, std::tuple_element_t<I, Args>>::value && ... && true);
  if constexpr (operands_ok) {
    SHARDLIB_STATIC_REQUIRE((!Tensor::sharding.is_partial()),
                            "shardlib: parallel_for on a partial tensor: its blocks hold addends; reshard it first",
                            error::loop_over_a_partial_tensor_reshard_it_first<typename Tensor::spec_type>);
    constexpr bool callable = std::is_invocable_v<const F&, const Idx&, T&, loop_element_t<std::tuple_element_t<I, Args>>...>;
    static_assert(callable,
                  "shardlib: parallel_for: the functor cannot be called as f(const Index<rank>&, T& element of the first "
                  "tensor, elements of the other tensors...)");
    if constexpr (callable && !Tensor::sharding.is_partial()) {
      SHARDLIB_STATIC_REQUIRE(
          (!std::is_invocable_v<const F&, const Idx&, T&&, loop_element_t<std::tuple_element_t<I, Args>>...>),
          "shardlib: parallel_for: the functor must take the first tensor's element by non-const reference (T& or "
          "auto&): it also accepts a temporary (it takes it by value, const& or auto&&), so what it writes is lost",
          error::parallel_for_functor_must_take_the_written_element_by_non_const_reference<F, T>);
      (check_loop_operand("parallel_for", t, I + 1, std::get<I>(args)), ...);
      const auto in = pack<loop_pointer_t<std::tuple_element_t<I, Args>>...>(std::get<I>(args).local().data()...);
      constexpr bool device = !host_memory_v<typename Tensor::memory_space>;
      t.for_each_local(ForKernel<device, F, T, decltype(in), I...>{std::get<sizeof...(I)>(args), t.local().data(), in});
    }
  }
}

/// The reduction by `Op` of `f(global index, a[k], in[k]...)` over block `box` (a in `Mem`).
/// In host memory each work item reduces its chunk into a slot of `partial`, combined here in
/// order: a parallel_for, not a Kokkos::parallel_reduce, so Kokkos 3's Serial (one reduction
/// buffer per process) needs no lock across in-process devices, and the result does not depend
/// on the thread schedule. In device memory, a Kokkos::parallel_reduce on the device's stream.
/// parallel_reduce's work item on device memory: element `c` combined into `acc`.
SHARDLIB_DEVICE_FUNCTORS_BEGIN
template <ReduceOp Op, class R, std::size_t Rank, class F, class T, class P, std::size_t... I>
struct ReduceKernel {
  BlockWalk<Rank> walk;
  F f;
  const T* a;
  P in;
  KOKKOS_FORCEINLINE_FUNCTION void operator()(std::int64_t c, R& acc) const {
    walk(c, [&](const Index<Rank>& g, std::int64_t k) {
      reduce_into<Op>(acc, static_cast<R>(f(g, a[k], detail::get<I>(in)[k]...)));
    });
  }
};
SHARDLIB_DEVICE_FUNCTORS_END

template <ReduceOp Op, class R, class Mem, std::size_t Rank, class F, class T, class P, std::size_t... I>
R reduce_block(const Context& ctx, const ShardBox& box, const F& f, const T* a, const P& in, std::index_sequence<I...>) {
  using Idx = Index<Rank>;
  if (shardlib::shape_only()) return R(0);
  if constexpr (host_memory_v<Mem>) {
    constexpr std::int64_t max_items = 256;
    std::array<R, max_items> partial;
    const BlockWalk<Rank> walk(box, max_items);
    R* out = partial.data();
    {
      auto guard = kernel_guard(ctx, false);
      Kokkos::parallel_for("shardlib::parallel_reduce",
                           Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(ctx.exec(), 0, walk.chunks()),
                           [=](std::int64_t c) {
                             R acc = reduce_identity<Op, R>();
                             walk(c, [&](const Idx& g, std::int64_t k) {
                               reduce_into<Op>(acc, static_cast<R>(f(g, a[k], detail::get<I>(in)[k]...)));
                             });
                             out[c] = acc;
                           });
      kernels::fence(ctx.exec());
    }
    R result = reduce_identity<Op, R>();
    for (std::int64_t c = 0; c < walk.chunks(); ++c) reduce_into<Op>(result, partial[static_cast<std::size_t>(c)]);
    return result;
  } else {
    BlockWalk<Rank> walk(box);
    walk.chunk = 1;
    R result = reduce_identity<Op, R>();
    const ReduceKernel<Op, R, Rank, F, T, P, I...> body{walk, f, a, in};
    using Exec = exec_space_t<Mem>;
    const Kokkos::RangePolicy<Exec> policy(ctx.exec_for<Mem>(), 0, walk.size);
    if constexpr (Op == ReduceOp::sum) Kokkos::parallel_reduce("shardlib::parallel_reduce", policy, body, Kokkos::Sum<R>(result));
    else if constexpr (Op == ReduceOp::prod) Kokkos::parallel_reduce("shardlib::parallel_reduce", policy, body, Kokkos::Prod<R>(result));
    else if constexpr (Op == ReduceOp::max) Kokkos::parallel_reduce("shardlib::parallel_reduce", policy, body, Kokkos::Max<R>(result));
    else Kokkos::parallel_reduce("shardlib::parallel_reduce", policy, body, Kokkos::Min<R>(result));
    return result;
  }
}

template <ReduceOp Op, class Tensor, class Args, std::size_t... I>
auto parallel_reduce_impl(const Tensor& t, const Args& args, std::index_sequence<I...>) {
  using T = typename Tensor::value_type;
  using F = std::remove_cvref_t<std::tuple_element_t<sizeof...(I), Args>>;
  using Idx = Index<Tensor::rank>;
  constexpr bool operands_ok = (loop_operand_check<I + 1, Tensor, std::tuple_element_t<I, Args>>::value && ... && true);
  SHARDLIB_STATIC_REQUIRE((!Tensor::sharding.is_partial()),
                          "shardlib: parallel_reduce on a partial tensor: its blocks hold addends; reshard it first",
                          error::loop_over_a_partial_tensor_reshard_it_first<typename Tensor::spec_type>);
  constexpr bool callable =
      operands_ok &&
      std::is_invocable_v<const F&, const Idx&, const T&,
                          const typename tensor_traits<std::remove_cvref_t<std::tuple_element_t<I, Args>>>::element&...>;
  static_assert(!operands_ok || callable,
                "shardlib: parallel_reduce: the functor cannot be called as f(const Index<rank>&, the tensors' elements...)");
  if constexpr (callable && !Tensor::sharding.is_partial()) {
    using R = std::remove_cvref_t<
        std::invoke_result_t<const F&, const Idx&, const T&,
                             const typename tensor_traits<std::remove_cvref_t<std::tuple_element_t<I, Args>>>::element&...>>;
    static_assert(std::is_arithmetic_v<R> && !std::is_same_v<R, bool>,
                  "shardlib: parallel_reduce: the functor must return an arithmetic value (not bool)");
    (check_loop_operand("parallel_reduce", t, I + 1, std::get<I>(args)), ...);
    Context& ctx = t.context();
    R result = reduce_identity<Op, R>();
    // Each element counts once: only the primary replica of each block takes part.
    if (is_primary_replica(Tensor::sharding, t.mesh().shape(), ctx.device()) && t.block().num_elements() > 0)
      result = reduce_block<Op, R, typename Tensor::memory_space, Tensor::rank>(
          ctx, t.block(), std::get<sizeof...(I)>(args), t.local().data(),
          pack<const typename tensor_traits<std::remove_cvref_t<std::tuple_element_t<I, Args>>>::element*...>(
              std::get<I>(args).local().data()...),
          std::index_sequence<I...>{});
    ctx.world().all_reduce(&result, &result, 1, coll::dtype_of<R>(), Op);
    return shardlib::shape_only() ? R(0) : result;  // (a device without elements holds the identity)
  } else {
    return 0;  // a compile error was reported above
  }
}
}  // namespace detail

/// Runs `f` on every element of every block, as one Kokkos kernel per device on its execution
/// space instance (replicas each update their own copy), with the element's global index:
///
/// - `parallel_for(t, f)`: `f(const Index<rank>& i, T& v)`;
/// - `parallel_for(t, b, c, ..., f)`: `f(const Index<rank>& i, T& v, B& b_elem, C& c_elem, ...)`,
///   the elements at `i` of tensors of the same mesh type and spec as `t` (a compile error names
///   the argument otherwise) and the same shape (std::invalid_argument names the arguments, their
///   shapes and the spec otherwise). Their elements are lvalues, const when the tensor is const:
///   `f` may take them by value.
///
/// `t` is the tensor written: `f` must take its element by non-const reference (`T&` or `auto&`);
/// a functor that would also accept a temporary (by value, `const T&`, `auto&&`) fails to compile,
/// as its writes would be lost. Not for partial tensors: their blocks hold addends, not elements
/// (reshard first, or work on `local()`).
template <class T, class MeshT, class SpecT, class Mem, class... Args>
  requires(sizeof...(Args) >= 1)
void parallel_for(DistributedTensor<T, MeshT, SpecT, Mem>& t, Args&&... args) {
  detail::parallel_for_impl(t, std::forward_as_tuple(args...), std::make_index_sequence<sizeof...(Args) - 1>{});
}

/// The reduction by `Op` (`ReduceOp::sum` (default), `prod`, `max` or `min`; `ReduceOp` is
/// `coll::Op`) of `f(const Index<rank>& i, const T& a_elem, const B& b_elem, ...)` over every
/// element of the global tensors `t, b, ...` (same mesh type, spec and shape, as parallel_for's),
/// returned on every device. Each element counts once: replicas do not add their copies. `f`
/// returns an arithmetic type (not bool), which is the result's type; a device without elements
/// contributes the identity (0, 1, lowest, max). Dot products and norms need no temporary:
/// `parallel_reduce(a, b, [](const Index<1>&, float x, float y) { return double(x) * y; })`.
/// Collective. Not for partial tensors. Zero in shape-only mode (whatever `Op`).
template <ReduceOp Op = ReduceOp::sum, class T, class MeshT, class SpecT, class Mem, class... Args>
  requires(sizeof...(Args) >= 1)
auto parallel_reduce(const DistributedTensor<T, MeshT, SpecT, Mem>& t, Args&&... args) {
  return detail::parallel_reduce_impl<Op>(t, std::forward_as_tuple(args...), std::make_index_sequence<sizeof...(Args) - 1>{});
}

/// A new tensor of the same mesh, spec and shape whose elements are `f(element)`, or
/// `f(const Index<rank>&, element)` when `f` takes the index too. No communication. Not for
/// partial tensors (f need not be linear). A 16-bit element reaches `f` as float, and a float
/// result is stored in the element's 16-bit type.
template <class T, class MeshT, class SpecT, class Mem, class F>
DistributedTensor<detail::map_element_t<F, T, SpecT::rank>, MeshT, SpecT, Mem> map(
    const DistributedTensor<T, MeshT, SpecT, Mem>& t, F f) {
  using Tensor = DistributedTensor<T, MeshT, SpecT, Mem>;
  SHARDLIB_STATIC_REQUIRE((!Tensor::sharding.is_partial()),
                          "shardlib: map on a partial tensor: its blocks hold addends; reshard it first",
                          error::loop_over_a_partial_tensor_reshard_it_first<SpecT>);
  using C = compute_t<T>;
  constexpr bool indexed = std::is_invocable_v<F, const Index<Tensor::rank>&, const C&>;
  using U = detail::map_element_t<F, T, SpecT::rank>;
  DistributedTensor<U, MeshT, SpecT, Mem> out(t.mesh(), t.shape());
  t.for_each_local(detail::MapKernel<!detail::host_memory_v<Mem>, F, T, U, Tensor::rank, indexed>{
      f, t.local().data(), out.local().data()});
  return out;
}

}  // namespace shardlib
