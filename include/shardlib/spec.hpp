// SPDX-License-Identifier: Apache-2.0
/// @file
/// Partition specs: how each tensor dim is split over mesh axes, and pending reductions.
///
/// `Spec<"data", none>` splits dim 0 over mesh axis "data" and replicates dim 1;
/// `Spec<axes<"data", "model">, none>` splits dim 0 over both (major to minor);
/// `Spec<none, "model", partial_sum<"data">>` also says each device holds an addend and the true
/// value is the sum over the "data" group. Axes a spec does not name replicate the tensor.
///
/// Three levels, one set of rules:
/// - `SpecEntry`: one template argument of `Spec` (a dim, or a partial clause);
/// - `PartitionSpec`: the spec as a plain constexpr value, with axis names (mesh-independent);
/// - `Sharding`: a spec resolved on a mesh (axis indices), what the sharding rules compute on.
/// `check_entries` and `check_on_mesh` find every misuse; the typed API turns their answer into
/// a compile error naming the axis or spec, the value API into an exception that does the same.
#pragma once

#include <shardlib/axis_name.hpp>
#include <shardlib/detail/diagnostics.hpp>
#include <shardlib/detail/text.hpp>
#include <shardlib/mesh.hpp>
#include <shardlib/reduce_op.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <shardlib/detail/array_ref.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardlib {

/// Marks a replicated (unsplit) tensor dim: `Spec<"data", none>`.
struct none_t {
  explicit constexpr none_t() = default;
};
inline constexpr none_t none{};

/// Room for the comma-separated axis names of one entry.
inline constexpr std::size_t spec_entry_capacity = max_mesh_rank * (max_axis_name_length + 1);

/// One template argument of `Spec`: a tensor dim (split over 0..n axes, major to minor) or a
/// partial clause (a reduction over 1..n axes). Built from a string literal ("data"), `none`,
/// `axes<...>` or `partial<...>`. A flat structural type (see docs/01_mesh_and_spec.md on why).
struct SpecEntry {
  enum Kind : std::uint8_t { dim = 0, partial = 1 };

  std::uint8_t kind = dim;
  std::uint8_t op = 0;                   ///< ReduceOp, for partial clauses
  char axes[spec_entry_capacity]{};      ///< axis names joined by ','; empty: replicated

  constexpr SpecEntry() = default;
  /// All members in declaration order (nvcc re-emits class-type template arguments this way).
  constexpr SpecEntry(std::uint8_t k, std::uint8_t o, const char (&a)[spec_entry_capacity]) : kind(k), op(o) {
    for (std::size_t i = 0; i < spec_entry_capacity; ++i) axes[i] = a[i];
  }
  /// A dim split over one axis: `"data"`.
  template <std::size_t N>
  constexpr SpecEntry(const char (&axis)[N]) : SpecEntry(AxisName(axis)) {}  // NOLINT
  constexpr SpecEntry(const AxisName& axis) {  // NOLINT(google-explicit-constructor)
    append(axis);
  }
  /// A replicated dim.
  constexpr SpecEntry(none_t) {}  // NOLINT(google-explicit-constructor)

  /// A dim split over `names`, major to minor (none: replicated).
  static constexpr SpecEntry split(detail::ArrayRef<AxisName> names) {
    SpecEntry e;
    for (const auto& n : names) e.append(n);
    return e;
  }
  /// A partial clause: the true value is `op` over the groups along `names`.
  static constexpr SpecEntry pending(ReduceOp op, detail::ArrayRef<AxisName> names) {
    if (names.empty()) throw std::invalid_argument("shardlib: a partial clause needs at least one axis");
    SpecEntry e = split(names);
    e.kind = partial;
    e.op = static_cast<std::uint8_t>(op);
    return e;
  }

  constexpr bool is_partial() const noexcept { return kind == partial; }
  constexpr ReduceOp reduce_op() const noexcept { return static_cast<ReduceOp>(op); }
  /// Number of axis names.
  constexpr int axis_count() const noexcept {
    if (axes[0] == '\0') return 0;
    int n = 1;
    for (std::size_t i = 0; i < spec_entry_capacity && axes[i] != '\0'; ++i)
      if (axes[i] == ',') ++n;
    return n;
  }
  /// The `k`-th axis name (major to minor).
  constexpr AxisName axis(int k) const noexcept {
    AxisName a;
    std::size_t i = 0;
    for (int seen = 0; seen < k && i < spec_entry_capacity; ++i)
      if (axes[i] == ',') ++seen;
    for (std::size_t j = 0; i < spec_entry_capacity && axes[i] != '\0' && axes[i] != ','; ++i, ++j)
      a.chars[j] = axes[i];
    return a;
  }

 private:
  constexpr void append(const AxisName& a) {
    std::size_t end = 0;
    while (end < spec_entry_capacity && axes[end] != '\0') ++end;
    if (axis_count() >= static_cast<int>(max_mesh_rank))
      throw std::invalid_argument("shardlib: a spec entry names at most max_mesh_rank axes");
    if (end != 0) axes[end++] = ',';
    for (char c : a.view()) axes[end++] = c;
  }
};

namespace detail {
template <std::uint8_t Kind, ReduceOp Op, AxisName... A>
consteval SpecEntry make_entry() {
  static_assert(sizeof...(A) >= 1, "shardlib: axes<...> and partial<...> need at least one axis name");
  static_assert(sizeof...(A) <= max_mesh_rank, "shardlib: a spec entry names at most shardlib::max_mesh_rank axes");
  constexpr std::array<AxisName, sizeof...(A)> names{A...};
  return Kind == SpecEntry::dim ? SpecEntry::split(names) : SpecEntry::pending(Op, names);
}
}  // namespace detail

/// A dim split over several axes, major to minor: `Spec<axes<"data", "model">>`.
template <AxisName... A>
inline constexpr SpecEntry axes = detail::make_entry<SpecEntry::dim, ReduceOp::sum, A...>();
/// A pending reduction over axes: `Spec<"data", none, partial<ReduceOp::max, "model">>` (op sum,
/// max or min; a Spec with `partial<ReduceOp::prod, ...>` fails to compile).
template <ReduceOp Op, AxisName... A>
inline constexpr SpecEntry partial = detail::make_entry<SpecEntry::partial, Op, A...>();
template <AxisName... A>
inline constexpr SpecEntry partial_sum = partial<ReduceOp::sum, A...>;
template <AxisName... A>
inline constexpr SpecEntry partial_max = partial<ReduceOp::max, A...>;
template <AxisName... A>
inline constexpr SpecEntry partial_min = partial<ReduceOp::min, A...>;

/// What is wrong with a spec, if anything (the answer of the check functions).
struct SpecCheck {
  enum Issue : std::uint8_t {
    ok = 0,
    too_many_dims,           ///< more dims than max_tensor_rank
    several_partial_clauses, ///< at most one partial clause
    axis_used_twice,         ///< an axis appears at most once per spec (dims and partial clause)
    unknown_axis,            ///< `axis` is not one of the mesh's axes
    rank_mismatch,           ///< the spec's rank differs from the tensor's
    partial_op_unsupported,  ///< a partial clause's op is not sum, max or min (a pending prod)
  };
  Issue issue = ok;
  int dim = -1;  ///< offending dim, or -1 for the partial clause / the whole spec
  AxisName axis{};

  constexpr explicit operator bool() const noexcept { return issue == ok; }
};

/// Up to max_mesh_rank axis names: one dim of a PartitionSpec, or its partial clause.
struct AxisNames {
  std::uint8_t count = 0;
  std::array<AxisName, max_mesh_rank> names{};
  constexpr int size() const noexcept { return count; }
  constexpr const AxisName& operator[](int i) const noexcept { return names[static_cast<std::size_t>(i)]; }
  constexpr const AxisName* begin() const noexcept { return names.data(); }
  constexpr const AxisName* end() const noexcept { return names.data() + count; }
  friend constexpr bool operator==(const AxisNames&, const AxisNames&) = default;
};

/// Whether a partial clause may pend `op`: sum, max and min (the sharding rules and creation
/// functions know those three; a pending product has no rule).
constexpr bool is_partial_op(ReduceOp op) noexcept {
  return op == ReduceOp::sum || op == ReduceOp::max || op == ReduceOp::min;
}

/// Checks a list of entries on its own (no mesh): dim count, partial clauses (at most one, with
/// op sum, max or min), repeated axes.
constexpr SpecCheck check_entries(detail::ArrayRef<SpecEntry> entries) {
  AxisName seen[max_tensor_rank * max_mesh_rank + max_mesh_rank]{};
  int nseen = 0, ndims = 0, npartial = 0;
  for (const auto& e : entries) {
    int dim = e.is_partial() ? -1 : ndims;
    if (e.is_partial()) {
      if (++npartial > 1) return {SpecCheck::several_partial_clauses, -1, {}};
      if (!is_partial_op(e.reduce_op())) return {SpecCheck::partial_op_unsupported, -1, {}};
    } else if (++ndims > static_cast<int>(max_tensor_rank)) {
      return {SpecCheck::too_many_dims, -1, {}};
    }
    for (int k = 0; k < e.axis_count(); ++k) {
      AxisName a = e.axis(k);
      for (int j = 0; j < nseen; ++j)
        if (seen[j] == a) return {SpecCheck::axis_used_twice, dim, a};
      seen[nseen++] = a;
    }
  }
  return {};
}

/// A partition spec as a plain value: per dim the axes it is split over (major to minor),
/// plus an optional partial clause. Mesh-independent (it holds names); `resolve` binds it to a
/// mesh. Build one with the same words as the typed API: `PartitionSpec{"data", none}`.
class PartitionSpec {
 public:
  constexpr PartitionSpec() = default;
  /// Throws std::invalid_argument naming the spec and the offending axis when the entries are
  /// invalid (a repeated axis, two partial clauses, too many dims).
  constexpr PartitionSpec(std::initializer_list<SpecEntry> entries)
      : PartitionSpec(detail::ArrayRef<SpecEntry>(entries.begin(), entries.size())) {}
  constexpr explicit PartitionSpec(detail::ArrayRef<SpecEntry> entries) {
    SpecCheck c = check_entries(entries);
    if (c.issue == SpecCheck::too_many_dims)
      throw std::invalid_argument("shardlib: a spec has at most " + detail::to_text(max_tensor_rank) + " dims");
    for (const auto& e : entries) {
      AxisNames n;
      for (int k = 0; k < e.axis_count(); ++k) n.names[static_cast<std::size_t>(n.count++)] = e.axis(k);
      if (e.is_partial()) {
        if (partial_.count == 0) {  // a second clause is reported below, once the spec is whole
          partial_ = n;
          op_ = e.reduce_op();
        }
      } else {
        dims_[static_cast<std::size_t>(rank_++)] = n;
      }
    }
    if (c.issue == SpecCheck::several_partial_clauses)
      throw std::invalid_argument("shardlib: spec " + to_string() + " has more than one partial clause");
    if (c.issue == SpecCheck::partial_op_unsupported)
      throw std::invalid_argument("shardlib: spec " + to_string() + " has a partial clause over " +
                                  std::string(shardlib::to_string(op_)) + "; partial clauses are sum, max or min");
    if (c.issue == SpecCheck::axis_used_twice)
      throw std::invalid_argument("shardlib: spec " + to_string() + " uses axis '" + c.axis.str() +
                                  "' twice; an axis appears at most once per spec");
  }

  /// Number of tensor dims.
  constexpr int rank() const noexcept { return rank_; }
  /// Axes dim `d` is split over, major to minor (empty: replicated).
  constexpr const AxisNames& dim(int d) const noexcept { return dims_[static_cast<std::size_t>(d)]; }
  constexpr bool is_partial() const noexcept { return partial_.count != 0; }
  constexpr const AxisNames& partial_axes() const noexcept { return partial_; }
  constexpr ReduceOp partial_op() const noexcept { return op_; }

  /// The spec as the typed API spells it: `Spec<"data", none, partial<sum, "model">>`.
  constexpr std::string to_string() const {
    auto names = [](const AxisNames& n) {
      std::string s;
      for (int i = 0; i < n.size(); ++i) s += (i ? ", \"" : "\"") + n[i].str() + "\"";
      return s;
    };
    std::string s = "Spec<";
    for (int d = 0; d < rank_; ++d) {
      if (d) s += ", ";
      const AxisNames& n = dim(d);
      s += n.size() == 0 ? "none" : n.size() == 1 ? names(n) : "axes<" + names(n) + ">";
    }
    if (is_partial()) s += std::string(rank_ ? ", " : "") + "partial<" + std::string(shardlib::to_string(op_)) + ", " + names(partial_) + ">";
    return s + ">";
  }

  friend constexpr bool operator==(const PartitionSpec&, const PartitionSpec&) = default;

 private:
  int rank_ = 0;
  std::array<AxisNames, max_tensor_rank> dims_{};
  AxisNames partial_{};
  ReduceOp op_ = ReduceOp::sum;
};

/// Checks a spec against a mesh's axis names and a tensor rank: unknown axes, rank mismatch.
constexpr SpecCheck check_on_mesh(const PartitionSpec& spec, detail::ArrayRef<AxisName> mesh_axes, int tensor_rank) {
  auto known = [&](const AxisName& a) {
    for (const auto& m : mesh_axes)
      if (m == a) return true;
    return false;
  };
  for (int d = 0; d < spec.rank(); ++d)
    for (const auto& a : spec.dim(d))
      if (!known(a)) return {SpecCheck::unknown_axis, d, a};
  for (const auto& a : spec.partial_axes())
    if (!known(a)) return {SpecCheck::unknown_axis, -1, a};
  if (spec.rank() != tensor_rank) return {SpecCheck::rank_mismatch, -1, {}};
  return {};
}

/// A spec resolved on a mesh: per dim the mesh-axis indices it is split over (major to
/// minor), and the partial clause's axes. The value the sharding rules compute on.
struct Sharding {
  int rank = 0;
  std::array<AxisList, max_tensor_rank> dims{};
  AxisList partial{};
  ReduceOp op = ReduceOp::sum;

  constexpr bool is_partial() const noexcept { return !partial.empty(); }
  /// Whether mesh axis `a` splits some dim.
  constexpr bool shards_over(int a) const noexcept {
    for (int d = 0; d < rank; ++d)
      if (dims[static_cast<std::size_t>(d)].contains(a)) return true;
    return false;
  }
  /// Dim split over mesh axis `a`, or -1.
  constexpr int dim_of(int a) const noexcept {
    for (int d = 0; d < rank; ++d)
      if (dims[static_cast<std::size_t>(d)].contains(a)) return d;
    return -1;
  }
  /// Mesh axes (of a mesh of `mesh_rank` axes) that neither split a dim nor are partial.
  constexpr AxisList replicated_axes(int mesh_rank) const {
    AxisList r;
    for (int a = 0; a < mesh_rank; ++a)
      if (!shards_over(a) && !partial.contains(a)) r.push_back(a);
    return r;
  }
  friend constexpr bool operator==(const Sharding&, const Sharding&) = default;
};

/// Resolves `spec` on `mesh` for a tensor of `tensor_rank` dims. Throws std::invalid_argument
/// naming the spec, the mesh and the offending axis or ranks.
constexpr Sharding resolve(const PartitionSpec& spec, const MeshShape& mesh, int tensor_rank) {
  std::array<AxisName, max_mesh_rank> names{};
  for (int i = 0; i < mesh.rank(); ++i) names[static_cast<std::size_t>(i)] = mesh.name(i);
  SpecCheck c = check_on_mesh(spec, detail::ArrayRef<AxisName>(names.data(), static_cast<std::size_t>(mesh.rank())), tensor_rank);
  if (c.issue == SpecCheck::unknown_axis)
    throw std::invalid_argument("shardlib: spec " + spec.to_string() + " uses axis '" + c.axis.str() + "'" +
                                (c.dim >= 0 ? " (dim " + detail::to_text(c.dim) + ")" : std::string(" (partial clause)")) +
                                ", which is not in mesh " + mesh.to_string());
  if (c.issue == SpecCheck::rank_mismatch)
    throw std::invalid_argument("shardlib: spec " + spec.to_string() + " has rank " + detail::to_text(spec.rank()) +
                                " but the tensor has rank " + detail::to_text(tensor_rank));
  Sharding s;
  s.rank = spec.rank();
  for (int d = 0; d < spec.rank(); ++d)
    for (const auto& a : spec.dim(d)) s.dims[static_cast<std::size_t>(d)].push_back(mesh.find(a));
  for (const auto& a : spec.partial_axes()) s.partial.push_back(mesh.find(a));
  s.op = spec.partial_op();
  return s;
}
/// As above, for a tensor of the spec's own rank.
constexpr Sharding resolve(const PartitionSpec& spec, const MeshShape& mesh) { return resolve(spec, mesh, spec.rank()); }

/// Compile-time errors about specs (undefined on purpose: see detail/diagnostics.hpp).
namespace error {
template <class SpecT>
struct spec_has_more_dims_than_max_tensor_rank;
template <class SpecT>
struct spec_has_more_than_one_partial_clause;
template <class SpecT>
struct spec_partial_clause_must_be_sum_max_or_min;
template <AxisName Axis, class SpecT>
struct spec_uses_an_axis_twice;
template <AxisName Axis, class SpecT, class MeshT>
struct spec_uses_an_axis_that_is_not_in_the_mesh;
template <class SpecT, std::size_t SpecRank, std::size_t TensorRank>
struct spec_rank_does_not_match_tensor_rank;
}  // namespace error

/// A partition spec as a type: `Spec<"data", none>`. Checked on its own when used
/// (repeated axes, partial clauses, dim count); checked against a mesh by `sharding_v`.
template <SpecEntry... E>
struct Spec {
  static constexpr std::array<SpecEntry, sizeof...(E)> entries{E...};

 private:
  static constexpr SpecCheck check_ = check_entries(entries);
  SHARDLIB_STATIC_REQUIRE((check_.issue != SpecCheck::too_many_dims),
                          "shardlib: Spec has more dims than shardlib::max_tensor_rank",
                          error::spec_has_more_dims_than_max_tensor_rank<Spec>);
  SHARDLIB_STATIC_REQUIRE((check_.issue != SpecCheck::several_partial_clauses),
                          "shardlib: Spec has more than one partial clause",
                          error::spec_has_more_than_one_partial_clause<Spec>);
  SHARDLIB_STATIC_REQUIRE((check_.issue != SpecCheck::partial_op_unsupported),
                          "shardlib: Spec has a partial clause over an op other than sum, max or min (a pending prod)",
                          error::spec_partial_clause_must_be_sum_max_or_min<Spec>);
  SHARDLIB_STATIC_REQUIRE((check_.issue != SpecCheck::axis_used_twice),
                          "shardlib: Spec uses an axis twice; an axis appears at most once per spec",
                          error::spec_uses_an_axis_twice<check_.axis, Spec>);
  /// Its dims replicated, no partial clause: what `value` is when a check above failed, so that
  /// the error is reported once (the ops see a valid spec of the same rank and stay silent).
  static constexpr std::array<SpecEntry, sizeof...(E)> stripped_ = [] {
    std::array<SpecEntry, sizeof...(E)> out{};
    std::size_t n = 0;
    for (const SpecEntry& e : entries)
      if (e.kind == SpecEntry::dim) out[n++] = SpecEntry{};
    return out;
  }();
  static constexpr std::size_t stripped_rank_ = [] {
    std::size_t n = 0;
    for (const SpecEntry& e : entries) n += e.kind == SpecEntry::dim;
    return n;
  }();

 public:
  /// The spec as a plain value (when a check above failed: its dims replicated, to keep errors short).
  static constexpr PartitionSpec value =
      check_                              ? PartitionSpec(detail::ArrayRef<SpecEntry>(entries))
      : stripped_rank_ <= max_tensor_rank ? PartitionSpec(detail::ArrayRef<SpecEntry>(stripped_.data(), stripped_rank_))
                                          : PartitionSpec{};
  /// Number of tensor dims.
  static constexpr std::size_t rank = static_cast<std::size_t>(value.rank());
};

template <class T>
inline constexpr bool is_spec_v = false;
template <SpecEntry... E>
inline constexpr bool is_spec_v<Spec<E...>> = true;
template <class T>
concept SpecType = is_spec_v<T>;

namespace detail {
template <class MeshT, class SpecT, std::size_t TensorRank>
struct checked_sharding {
  static_assert(is_mesh_v<MeshT>, "shardlib: sharding_v<Mesh, Spec>: the first argument must be a shardlib::Mesh<...>");
  static_assert(is_spec_v<SpecT>, "shardlib: sharding_v<Mesh, Spec>: the second argument must be a shardlib::Spec<...>");
  static constexpr SpecCheck check = check_on_mesh(SpecT::value, MeshT::axis_names, static_cast<int>(TensorRank));
  SHARDLIB_STATIC_REQUIRE((check.issue != SpecCheck::unknown_axis),
                          "shardlib: Spec uses an axis that is not in the Mesh",
                          error::spec_uses_an_axis_that_is_not_in_the_mesh<check.axis, SpecT, MeshT>);
  SHARDLIB_STATIC_REQUIRE((check.issue != SpecCheck::rank_mismatch),
                          "shardlib: Spec's rank (number of entries other than partial<...>) differs from the tensor's rank",
                          error::spec_rank_does_not_match_tensor_rank<SpecT, SpecT::rank, TensorRank>);
  static constexpr Sharding value = [] {
    if (!check) {  // reported above; replicated of the tensor's rank, so that no op reports it again
      Sharding replicated;
      replicated.rank = static_cast<int>(TensorRank);
      return replicated;
    }
    std::array<int, MeshT::rank> sizes{};
    sizes.fill(1);
    return resolve(SpecT::value, MeshShape(MeshT::axis_names, sizes), static_cast<int>(TensorRank));
  }();
};
}  // namespace detail

/// `Spec` resolved on `Mesh` for a tensor of rank `TensorRank` (default: the spec's), checked at
/// compile time: an axis not in the mesh, or a rank mismatch, fails to compile and names it.
template <class MeshT, class SpecT, std::size_t TensorRank = SpecT::rank>
inline constexpr Sharding sharding_v = detail::checked_sharding<MeshT, SpecT, TensorRank>::value;

/// True when `SpecT` is valid on `MeshT` for a tensor of rank `TensorRank` (no diagnostics:
/// for constraints; use `sharding_v` to get the error that says what is wrong).
template <class SpecT, class MeshT, std::size_t TensorRank = SpecT::rank>
concept ValidSpecFor = SpecType<SpecT> && MeshType<MeshT> &&
                       static_cast<bool>(check_on_mesh(SpecT::value, MeshT::axis_names, static_cast<int>(TensorRank)));

}  // namespace shardlib
