// SPDX-License-Identifier: Apache-2.0
/// @file
/// What every op's sharding rule answers, and the way back from a computed sharding to a type.
///
/// An op's rule is a constexpr function from its operands' shardings (and the op's own static
/// arguments: dims, subscripts) to an `OpRule`: the sharding each operand must have when the
/// local kernel runs (the op reshards an operand that differs, with the fewest bytes), the
/// output's sharding (possibly partial), and the mesh axes the op communicates over itself.
/// Rules never throw for bad input: they answer a `status` naming what is wrong, which the typed
/// API turns into a compile error naming the op and the specs. Pure: no Kokkos, no
/// communicator.
#pragma once

#include <shardlib/mesh.hpp>
#include <shardlib/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace shardlib {

/// The answer of a sharding rule (see the file comment).
struct OpRule {
  enum Status : std::uint8_t {
    ok = 0,
    rank_mismatch,      ///< an operand's rank does not fit the op (`operand` says which)
    dim_out_of_range,   ///< a dim argument is outside the operand's rank (`dim` says which)
    bad_subscripts,     ///< an einsum subscript string does not parse (`dim`: the character position)
    bad_pattern,        ///< a reshape pattern does not parse or its two sides differ (`dim`: position)
    bad_permutation,    ///< a permutation is not one of 0..rank-1
    partial_indices,    ///< indices (gather) cannot be partial
    too_many_dims,      ///< the output would have more than max_tensor_rank dims
  };
  Status status = ok;
  int operand = -1;  ///< offending operand, or -1
  int dim = -1;      ///< offending dim (or character position), or -1
  int count = 0;     ///< number of operands
  /// The sharding each operand must have when the local kernel runs.
  std::array<Sharding, 3> in{};
  /// The output's sharding (partial when the op leaves addends, e.g. a sharded contraction).
  Sharding out{};
  /// Mesh axes the op itself runs a collective over (besides resharding operands, and besides
  /// the reduction that the output's partial clause leaves pending), e.g. softmax along a dim
  /// split over these axes. Empty: the op communicates only through operand reshards.
  AxisList comm{};

  constexpr explicit operator bool() const noexcept { return status == ok; }
};

/// A short sentence for a rule status, for error messages.
constexpr std::string_view describe(OpRule::Status s) noexcept {
  switch (s) {
    case OpRule::ok: return "ok";
    case OpRule::rank_mismatch: return "an operand's rank does not fit the op";
    case OpRule::dim_out_of_range: return "a dim is outside the operand's rank";
    case OpRule::bad_subscripts: return "the einsum subscripts do not parse";
    case OpRule::bad_pattern: return "the reshape pattern does not parse or its sides differ";
    case OpRule::bad_permutation: return "the permutation is not one of 0..rank-1";
    case OpRule::partial_indices: return "indices cannot be partial";
    case OpRule::too_many_dims: return "the output would have more than max_tensor_rank dims";
  }
  return "?";
}

/// A Sharding packed into one flat byte array: the form `spec_t` takes it in as a template
/// argument. g++ 12 confuses class-type template arguments with nested arrays of structs that
/// differ only in their inner elements (two different Shardings gave the same type); a flat array
/// it compares right.
struct ShardingCode {
  static constexpr std::size_t size = 2 + max_tensor_rank * (1 + max_mesh_rank) + 1 + max_mesh_rank;
  std::uint8_t code[size]{};

  constexpr ShardingCode() = default;
  constexpr ShardingCode(const Sharding& s) {  // NOLINT(google-explicit-constructor)
    std::size_t k = 0;
    code[k++] = static_cast<std::uint8_t>(s.rank);
    code[k++] = static_cast<std::uint8_t>(s.op);
    auto put = [&](const AxisList& l) {
      code[k++] = static_cast<std::uint8_t>(l.size());
      for (int i = 0; i < static_cast<int>(max_mesh_rank); ++i) code[k++] = static_cast<std::uint8_t>(i < l.size() ? l[i] : 0);
    };
    for (const auto& d : s.dims) put(d);
    put(s.partial);
  }
  constexpr Sharding decode() const {
    Sharding s;
    std::size_t k = 0;
    s.rank = code[k++];
    s.op = static_cast<ReduceOp>(code[k++]);
    auto get = [&](AxisList& l) {
      const int n = code[k++];
      for (int i = 0; i < static_cast<int>(max_mesh_rank); ++i, ++k)
        if (i < n) l.push_back(code[k]);
    };
    for (auto& d : s.dims) get(d);
    get(s.partial);
    return s;
  }
};

namespace detail {
/// `s` with its partial clause dropped (the addends reduced).
constexpr Sharding reduced(Sharding s) noexcept {
  s.partial = AxisList{};
  s.op = ReduceOp::sum;
  return s;
}
/// Whether `s` holds addends of a sum (the partial clause every linear op can keep).
constexpr bool is_partial_sum(const Sharding& s) noexcept { return s.is_partial() && s.op == ReduceOp::sum; }
/// The axes of `l` not in `used` (nor repeated), in `l`'s order.
constexpr AxisList without(const AxisList& l, const AxisList& used) {
  AxisList r;
  for (int a : l)
    if (!used.contains(a) && !r.contains(a)) r.push_back(a);
  return r;
}
/// Partial axes in mesh order, so that equal sets give equal shardings (and equal types).
constexpr AxisList sorted_axes(const AxisList& l) {
  AxisList r;
  for (int a = 0; a < static_cast<int>(max_mesh_rank); ++a)
    if (l.contains(a)) r.push_back(a);
  return r;
}

/// The Spec type of `Holder::value` (a Sharding): keyed on a type, so that no computed Sharding
/// is ever a template argument (nvcc 13 cannot re-emit one; g++ 12 confuses some).
template <class MeshT, class Holder>
struct spec_of {
  static constexpr Sharding S = Holder::value;
  static constexpr std::size_t n = static_cast<std::size_t>(S.rank) + (S.is_partial() ? 1 : 0);
  static constexpr std::array<SpecEntry, n> entries = [] {
    std::array<SpecEntry, n> e{};
    auto names = [](const AxisList& l) {
      std::array<AxisName, max_mesh_rank> a{};
      for (int i = 0; i < l.size(); ++i) a[static_cast<std::size_t>(i)] = MeshT::axis_names[static_cast<std::size_t>(l[i])];
      return a;
    };
    for (int d = 0; d < S.rank; ++d) {
      const auto a = names(S.dims[static_cast<std::size_t>(d)]);
      e[static_cast<std::size_t>(d)] = SpecEntry::split(
          detail::ArrayRef<AxisName>(a.data(), static_cast<std::size_t>(S.dims[static_cast<std::size_t>(d)].size())));
    }
    if (S.is_partial()) {
      const auto a = names(S.partial);
      e[n - 1] = SpecEntry::pending(S.op, detail::ArrayRef<AxisName>(a.data(), static_cast<std::size_t>(S.partial.size())));
    }
    return e;
  }();
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>) -> Spec<entries[I]...>;
  using type = decltype(make(std::make_index_sequence<n>{}));
};
template <class MeshT, ShardingCode C>
struct spec_of_code {
  struct holder {
    static constexpr Sharding value = C.decode();
  };
  using type = typename spec_of<MeshT, holder>::type;
};
template <class F>
struct fn_holder {
  static constexpr Sharding value = F{}();
};
}  // namespace detail

/// The `Spec<...>` type of sharding `S` on mesh type `MeshT`: the way from a rule's answer back
/// to a tensor type. `spec_t<M, sharding_v<M, Spec<"x", none>>>` is `Spec<"x", none>` itself.
/// For static checks with g++ and clang; nvcc 13 cannot take a computed Sharding as a template
/// argument: code that must compile under nvcc (the ops) uses `spec_from_t`.
template <class MeshT, ShardingCode S>
using spec_t = typename detail::spec_of_code<MeshT, S>::type;

/// The `Spec<...>` type of the sharding that `F{}()` returns, `F` being a captureless lambda's
/// type: `spec_from_t<Mesh, decltype([] { return rule.out; })>`. Compiles under nvcc too.
template <class MeshT, class F>
using spec_from_t = typename detail::spec_of<MeshT, detail::fn_holder<F>>::type;

}  // namespace shardlib
