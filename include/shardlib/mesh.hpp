// SPDX-License-Identifier: Apache-2.0
/// @file
/// Device meshes: named axes (compile time) with sizes (run time).
///
/// Devices are laid out row-major over the axes, last axis fastest, as in JAX and
/// PyTorch/XLA: on `Mesh<"data", "model">` of sizes {4, 2}, device 5 has coordinates {2, 1}.
/// A list of axes names a *group*: the devices that share this device's coordinates on every
/// other axis. The group along {"model"} is what a collective over "model" talks to.
#pragma once

#include <shardlib/axis_name.hpp>
#include <shardlib/detail/diagnostics.hpp>
#include <shardlib/detail/text.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <shardlib/detail/array_ref.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {

class Context;  // runtime/runtime.hpp: one device's view of a run; a Mesh can be bound to one

/// An ordered list of mesh-axis indices, major to minor (at most `max_mesh_rank`).
/// A group of devices and a sharded tensor dim are both described by one.
struct AxisList {
  std::uint8_t count = 0;
  std::array<std::uint8_t, max_mesh_rank> axis{};

  constexpr AxisList() = default;
  constexpr AxisList(std::initializer_list<int> axes) {
    for (int a : axes) push_back(a);
  }
  constexpr void push_back(int a) {
    if (count >= max_mesh_rank) throw std::length_error("shardlib: AxisList holds at most max_mesh_rank axes");
    axis[count++] = static_cast<std::uint8_t>(a);
  }
  constexpr int size() const noexcept { return count; }
  constexpr bool empty() const noexcept { return count == 0; }
  constexpr int operator[](int i) const noexcept { return axis[static_cast<std::size_t>(i)]; }
  constexpr const std::uint8_t* begin() const noexcept { return axis.data(); }
  constexpr const std::uint8_t* end() const noexcept { return axis.data() + count; }
  constexpr bool contains(int a) const noexcept {
    for (int x : *this)
      if (x == a) return true;
    return false;
  }
  friend constexpr bool operator==(const AxisList& a, const AxisList& b) noexcept {
    if (a.count != b.count) return false;
    for (int i = 0; i < a.count; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
};

/// A mesh as a plain value: axis names and sizes. Typed meshes (`Mesh<...>`) hold one; code
/// that works on runtime meshes uses it directly. Every function is constexpr and throws
/// std::invalid_argument / std::out_of_range with the mesh and the bad value in the message.
class MeshShape {
 public:
  constexpr MeshShape() = default;

  /// Axis names and their sizes, one each. Sizes must be >= 1; names distinct.
  constexpr MeshShape(detail::ArrayRef<AxisName> names, detail::ArrayRef<int> sizes) {
    if (names.size() != sizes.size())
      throw std::invalid_argument("shardlib: a mesh needs one size per axis: got " +
                                  detail::to_text(names.size()) + " axis names and " +
                                  detail::to_text(sizes.size()) + " sizes");
    if (names.empty()) throw std::invalid_argument("shardlib: a mesh needs at least one axis");
    if (names.size() > max_mesh_rank)
      throw std::invalid_argument("shardlib: a mesh has at most " + detail::to_text(max_mesh_rank) +
                                  " axes, got " + detail::to_text(names.size()));
    rank_ = static_cast<int>(names.size());
    for (int i = 0; i < rank_; ++i) {
      names_[static_cast<std::size_t>(i)] = names[static_cast<std::size_t>(i)];
      sizes_[static_cast<std::size_t>(i)] = sizes[static_cast<std::size_t>(i)];
    }
    for (int i = 0; i < rank_; ++i)
      for (int j = 0; j < i; ++j)
        if (names_[static_cast<std::size_t>(i)] == names_[static_cast<std::size_t>(j)])
          throw std::invalid_argument("shardlib: mesh " + to_string() + " names axis '" +
                                      names_[static_cast<std::size_t>(i)].str() + "' twice");
    long long n = 1;
    for (int i = 0; i < rank_; ++i) {
      if (size(i) < 1)
        throw std::invalid_argument("shardlib: mesh " + to_string() + ": axis '" + name(i).str() +
                                    "' has size " + detail::to_text(size(i)) + "; sizes must be >= 1");
      n *= size(i);
      if (n > 0x7fffffff)
        throw std::invalid_argument("shardlib: mesh " + to_string() + " has more than 2^31 devices");
    }
    devices_ = static_cast<int>(n);
  }

  constexpr int rank() const noexcept { return rank_; }
  constexpr int size(int axis) const noexcept { return sizes_[static_cast<std::size_t>(axis)]; }
  constexpr const AxisName& name(int axis) const noexcept { return names_[static_cast<std::size_t>(axis)]; }
  /// Number of devices: the product of the axis sizes.
  constexpr int num_devices() const noexcept { return devices_; }

  /// Index of the axis named `a`, or -1.
  constexpr int find(const AxisName& a) const noexcept {
    for (int i = 0; i < rank_; ++i)
      if (name(i) == a) return i;
    return -1;
  }
  /// Index of the axis named `a`; throws std::invalid_argument naming the mesh when absent.
  constexpr int index_of(const AxisName& a) const {
    int i = find(a);
    if (i < 0)
      throw std::invalid_argument("shardlib: axis '" + a.str() + "' is not in mesh " + to_string());
    return i;
  }

  /// Throws unless this mesh has exactly `device_count` devices.
  constexpr void require_devices(int device_count) const {
    if (devices_ != device_count)
      throw std::invalid_argument("shardlib: mesh " + to_string() + " has " + detail::to_text(devices_) +
                                  " devices but the run has " + detail::to_text(device_count) +
                                  "; the axis sizes must multiply to the device count");
  }

  /// Coordinates of `device` (row-major, last axis fastest). Entries past rank() are 0.
  constexpr std::array<int, max_mesh_rank> coords(int device) const {
    check_device(device);
    std::array<int, max_mesh_rank> c{};
    for (int i = rank_ - 1; i >= 0; --i) {
      c[static_cast<std::size_t>(i)] = device % size(i);
      device /= size(i);
    }
    return c;
  }
  /// Device at `coords` (one per axis).
  constexpr int device_at(detail::ArrayRef<int> coords) const {
    if (static_cast<int>(coords.size()) != rank_)
      throw std::invalid_argument("shardlib: mesh " + to_string() + " needs " + detail::to_text(rank_) +
                                  " coordinates, got " + detail::to_text(coords.size()));
    int d = 0;
    for (int i = 0; i < rank_; ++i) {
      int c = coords[static_cast<std::size_t>(i)];
      if (c < 0 || c >= size(i))
        throw std::out_of_range("shardlib: coordinate " + detail::to_text(c) + " is outside axis '" +
                                name(i).str() + "' of mesh " + to_string());
      d = d * size(i) + c;
    }
    return d;
  }

  /// Number of devices in a group along `axes`: the product of their sizes.
  constexpr int group_size(const AxisList& axes) const {
    check_axes(axes);
    int n = 1;
    for (int a : axes) n *= size(a);
    return n;
  }
  /// Position of `device` in its group along `axes`: mixed radix over `axes`, first major.
  constexpr int group_rank(int device, const AxisList& axes) const {
    check_axes(axes);
    auto c = coords(device);
    int r = 0;
    for (int a : axes) r = r * size(a) + c[a];
    return r;
  }
  /// The `i`-th device of `device`'s group along `axes` (the inverse of group_rank).
  constexpr int group_member(int device, const AxisList& axes, int i) const {
    int n = group_size(axes);
    if (i < 0 || i >= n)
      throw std::out_of_range("shardlib: group member " + detail::to_text(i) + " of a group of " +
                              detail::to_text(n) + " devices in mesh " + to_string());
    auto c = coords(device);
    for (int k = axes.size() - 1; k >= 0; --k) {
      int a = axes[k];
      c[static_cast<std::size_t>(a)] = i % size(a);
      i /= size(a);
    }
    return device_at(detail::ArrayRef<int>(c.data(), static_cast<std::size_t>(rank_)));
  }
  /// All devices of `device`'s group along `axes`, in group-rank order.
  constexpr std::vector<int> group_devices(int device, const AxisList& axes) const {
    std::vector<int> out;
    int n = group_size(axes);
    out.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) out.push_back(group_member(device, axes, i));
    return out;
  }

  /// `{data: 4, model: 2}`
  constexpr std::string to_string() const {
    std::string s = "{";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ", ";
      s += name(i).str();
      s += ": ";
      s += detail::to_text(size(i));
    }
    return s + "}";
  }

  friend constexpr bool operator==(const MeshShape& a, const MeshShape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (!(a.name(i) == b.name(i)) || a.size(i) != b.size(i)) return false;
    return true;
  }

 private:
  constexpr void check_device(int device) const {
    if (device < 0 || device >= devices_)
      throw std::out_of_range("shardlib: device " + detail::to_text(device) + " is outside mesh " +
                              to_string() + " of " + detail::to_text(devices_) + " devices");
  }
  constexpr void check_axes(const AxisList& axes) const {
    for (int i = 0; i < axes.size(); ++i) {
      if (axes[i] >= rank_)
        throw std::out_of_range("shardlib: axis index " + detail::to_text(axes[i]) + " is outside mesh " +
                                to_string());
      for (int j = 0; j < i; ++j)
        if (axes[i] == axes[j])
          throw std::invalid_argument("shardlib: axis '" + name(axes[i]).str() +
                                      "' is listed twice in a group of mesh " + to_string());
    }
  }

  int rank_ = 0;
  int devices_ = 0;
  std::array<AxisName, max_mesh_rank> names_{};
  std::array<int, max_mesh_rank> sizes_{};
};

/// Compile-time errors about meshes (undefined on purpose: see detail/diagnostics.hpp).
namespace error {
template <AxisName Axis, class MeshT>
struct mesh_names_an_axis_twice;
template <AxisName Axis, class MeshT>
struct axis_is_not_in_the_mesh;
template <class MeshT>
struct mesh_has_more_axes_than_max_mesh_rank;
}  // namespace error

namespace detail {
/// Mesh::context()'s throw when the mesh was made without a device (out of line: one copy, not
/// one per mesh type and caller).
[[noreturn]] inline void throw_unbound_mesh(const MeshShape& shape) {
  throw std::logic_error("shardlib: mesh " + shape.to_string() +
                         " is not bound to a device; tensors need Mesh(ctx, sizes), made inside Runtime::spmd");
}

template <std::size_t N>
constexpr int first_repeated(const std::array<AxisName, N>& names) {
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) return static_cast<int>(i);
  return -1;
}
template <std::size_t N>
constexpr int find_axis(const std::array<AxisName, N>& names, const AxisName& a) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == a) return static_cast<int>(i);
  return -1;
}
}  // namespace detail

/// A device mesh whose axis names are part of its type: `Mesh<"data", "model">`.
///
/// Sizes are chosen at run time (a job's size is picked at launch). Misuse of names fails to
/// compile and names the axis: a repeated axis, an unknown axis in `index_of`/`axes`.
template <AxisName... Names>
class Mesh {
 public:
  static constexpr std::size_t rank = sizeof...(Names);
  static constexpr std::array<AxisName, rank> axis_names{Names...};

 private:
  static_assert(rank >= 1, "shardlib: Mesh needs at least one axis name, e.g. Mesh<\"data\">");
  SHARDLIB_STATIC_REQUIRE((rank <= max_mesh_rank),
                          "shardlib: Mesh has more axes than shardlib::max_mesh_rank",
                          error::mesh_has_more_axes_than_max_mesh_rank<Mesh>);
  static constexpr int repeated_ = detail::first_repeated(axis_names);
  SHARDLIB_STATIC_REQUIRE((repeated_ < 0),
                          "shardlib: Mesh names the same axis twice",
                          error::mesh_names_an_axis_twice<axis_names[repeated_ < 0 ? 0 : repeated_], Mesh>);

 public:
  /// Index of axis `A`; an axis not in the mesh fails to compile, naming it.
  template <AxisName A>
  static constexpr int index_of() {
    constexpr int i = detail::find_axis(axis_names, A);
    SHARDLIB_STATIC_REQUIRE((i >= 0),
                          "shardlib: axis is not in the mesh",
                          error::axis_is_not_in_the_mesh<A, Mesh>);
    return i;
  }
  /// The ordered axis list for axes `A...` (major to minor), checked at compile time.
  template <AxisName... A>
  static constexpr AxisList axes() {
    return AxisList{index_of<A>()...};
  }

  /// A mesh of the given sizes; its device count is their product. Throws
  /// std::invalid_argument naming the axis when a size is below 1.
  explicit Mesh(const std::array<int, rank>& sizes) : shape_(axis_names, sizes) {}
  /// As above, and checks that the sizes multiply to `device_count` (the devices of the run).
  Mesh(const std::array<int, rank>& sizes, int device_count) : shape_(axis_names, sizes) {
    shape_.require_devices(device_count);
  }

  /// A mesh over the devices of `ctx`'s run, bound to it: tensors made on this mesh live on
  /// `ctx`'s device and communicate through its groups. Throws std::invalid_argument when the
  /// sizes do not multiply to the run's device count (the message names the mesh and both counts).
  template <class Ctx>
    requires std::is_same_v<Ctx, Context>
  Mesh(Ctx& ctx, const std::array<int, rank>& sizes) : shape_(axis_names, sizes), context_(&ctx) {
    shape_.require_devices(ctx.num_devices());
  }

  /// The mesh as a plain value.
  const MeshShape& shape() const noexcept { return shape_; }
  /// Whether the mesh was made with a Context (needed by tensors).
  bool is_bound() const noexcept { return context_ != nullptr; }
  /// The Context the mesh was made with. Throws std::logic_error when it was made from sizes alone.
  Context& context() const {
    if (!context_) detail::throw_unbound_mesh(shape_);
    return *context_;
  }
  /// Same axis sizes (the axis names are the type's).
  friend bool operator==(const Mesh& a, const Mesh& b) noexcept { return a.shape_ == b.shape_; }
  int num_devices() const noexcept { return shape_.num_devices(); }
  int size(int axis) const noexcept { return shape_.size(axis); }
  /// Size of axis `A`.
  template <AxisName A>
  int size() const noexcept {
    return shape_.size(index_of<A>());
  }
  std::array<int, rank> coords(int device) const {
    auto c = shape_.coords(device);
    std::array<int, rank> out{};
    for (std::size_t i = 0; i < rank; ++i) out[i] = c[i];
    return out;
  }
  int device_at(const std::array<int, rank>& coords) const { return shape_.device_at(coords); }
  int group_size(const AxisList& axes) const { return shape_.group_size(axes); }
  int group_rank(int device, const AxisList& axes) const { return shape_.group_rank(device, axes); }
  std::vector<int> group_devices(int device, const AxisList& axes) const {
    return shape_.group_devices(device, axes);
  }
  std::string to_string() const { return shape_.to_string(); }

 private:
  MeshShape shape_;
  Context* context_ = nullptr;
};

/// True for `Mesh<...>` types.
template <class T>
inline constexpr bool is_mesh_v = false;
template <AxisName... N>
inline constexpr bool is_mesh_v<Mesh<N...>> = true;
template <class T>
concept MeshType = is_mesh_v<T>;

}  // namespace shardlib
