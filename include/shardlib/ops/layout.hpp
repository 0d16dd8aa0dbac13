// SPDX-License-Identifier: Apache-2.0
/// @file
/// Layout ops: `permute`/`transpose`, `reshape` (einops-style patterns parsed at compile time),
/// `slice` and `concat` along a dim, and `take` (gather along a dim; with dim 0 on a
/// vocabulary-sharded table, Megatron's vocab-parallel embedding).
///
/// Rules: sharding/layout.hpp. permute moves specs with their dims and never communicates.
/// reshape keeps a split dim's axes on the major dim of a merge or split; when the blocks line up
/// (extents divide evenly) each device reinterprets its own block with no copy, otherwise the
/// tensor is gathered along its split dims and each device takes its new block. slice and concat
/// keep the spec; along a split dim, blocks shift between the devices of that dim's group (one
/// all_to_all of exactly the elements that change owner). take looks each index up in the local
/// block of the table: when the table is split along the gathered dim, indices held elsewhere give
/// zeros and the result is partial-sum (one all_reduce when it is resharded).
#pragma once

#include <shardlib/kernels/layout.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/sharding/layout.hpp>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace shardlib {

namespace error {
/// The reshape pattern does not parse: `What` says why, `Position` where.
template <OpName Pattern, OpName What, int Position>
struct reshape_pattern_does_not_parse;
/// take needs integer indices.
template <class I>
struct take_needs_integer_indices;
}  // namespace error

namespace detail {

/// Moves `src` (this device's block `src_box` of a tensor whose dim `d` is shifted by `shift`
/// into the output's coordinates) into the output block `out_box` at `out`: every output element
/// that the source holds, from whichever device of dim `d`'s group holds it. Local when the dim
/// is not split (`axes` empty), else one exchange over the group. Both blocks in `Mem`.
template <class T, class Mem>
SHARDLIB_NOINLINE void shift_blocks(Context& ctx, const MeshShape& mesh, const AxisList& axes, int d, const T* src, ShardBox src_box,
                  std::int64_t src_extent, std::int64_t shift, T* out, const ShardBox& out_box,
                  std::int64_t out_extent) {
  const auto u = static_cast<std::size_t>(d);
  src_box.offset[u] += shift;
  if (axes.empty()) {
    copy_box<Mem>(ctx, src, src_box, out, out_box, intersect(src_box, out_box));
    return;
  }
  const int n = mesh.group_size(axes);
  std::vector<coll::Region> send(static_cast<std::size_t>(n)), recv(send.size());
  for (int r = 0; r < n; ++r) {  // group rank r holds part r of dim d (only `axes` split it)
    ShardBox peer_src = src_box, peer_out = out_box;
    const BlockRange s = block_of(src_extent, n, r), o = block_of(out_extent, n, r);
    peer_src.offset[u] = s.offset + shift;
    peer_src.extent[u] = s.size;
    peer_out.offset[u] = o.offset;
    peer_out.extent[u] = o.size;
    send[static_cast<std::size_t>(r)] = region_in(src_box, intersect(src_box, peer_out));
    recv[static_cast<std::size_t>(r)] = region_in(out_box, intersect(peer_src, out_box));
  }
  exchange_in<Mem>(ctx, &mesh, axes, src, src_box.num_elements(), send, out, out_box.num_elements(), recv);
}

[[noreturn]] SHARDLIB_COLD inline void throw_slice_out_of_range(std::int64_t begin, std::int64_t end, int dim,
                                                                const OperandInfo& a) {
  throw std::out_of_range("shardlib: slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of dim " +
                          std::to_string(dim) + " of " + operand_text(a) + " is outside [0, " +
                          std::to_string(a.shape[static_cast<std::size_t>(dim)]) + "]");
}
[[noreturn]] SHARDLIB_COLD inline void throw_concat_mismatch(int dim, int bad, const OperandInfo& a, const OperandInfo& b) {
  throw std::invalid_argument("shardlib: concat along dim " + std::to_string(dim) + " of " + operand_text(a) + " and " +
                              operand_text(b) + ": dim " + std::to_string(bad) + " differs");
}
/// Whether take and index_add check their indices (unless NDEBUG without SHARDLIB_CHECKED).
#if !defined(NDEBUG) || defined(SHARDLIB_CHECKED)
inline constexpr bool check_indices = true;
#else
inline constexpr bool check_indices = false;
#endif

/// The shape of take<dim>(table, indices): the table's dims before `dim`, the indices' dims, the
/// table's dims after `dim`.
template <std::size_t R>
std::array<std::int64_t, R> take_shape(ArrayRef<std::int64_t> table, ArrayRef<std::int64_t> indices, std::size_t dim) {
  std::array<std::int64_t, R> shape{};
  const std::size_t ri = indices.size();
  for (std::size_t d = 0; d < dim; ++d) shape[d] = table[d];
  for (std::size_t d = 0; d < ri; ++d) shape[dim + d] = indices[d];
  for (std::size_t d = dim + 1; d < table.size(); ++d) shape[d - 1 + ri] = table[d];
  return shape;
}
[[noreturn]] SHARDLIB_COLD inline void throw_take_out_of_range(int dim, const OperandInfo& table, const OperandInfo& indices,
                                                               ArrayRef<std::int64_t> block_start, const char* what) {
  throw std::out_of_range(std::string("shardlib: take<") + std::to_string(dim) + "> of table " + operand_text(table) +
                          " with indices " + operand_text(indices) + " (this device's block of indices starts at " +
                          shape_text(block_start) + "): " + what);
}

}  // namespace detail

/// The tensor with its dims permuted: output dim k is input dim `Perm...[k]` (specs move with
/// their dims; a local transpose of each block, no communication).
template <int... Perm, TensorType A>
auto permute(const A& a) {
  static constexpr std::array<int, sizeof...(Perm)> perm{Perm...};
  static constexpr OpRule rule = permute_rule(A::sharding, detail::ArrayRef<int>(perm.data(), perm.size()));
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: permute needs a permutation of 0..rank-1",
                          error::op_has_no_sharding_rule_for_these_specs<"permute", rule.status, typename A::spec_type>);
  using T = typename A::value_type;
  using MeshT = typename A::mesh_type;
  using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, typename A::memory_space>;
  typename Out::Shape shape{};
  std::array<std::int64_t, max_tensor_rank> ext{};
  for (std::size_t k = 0; k < Out::rank; ++k) {
    shape[k] = a.shape()[static_cast<std::size_t>(perm[k])];
    ext[k] = a.block().extent[k];
  }
  Out out(a.mesh(), shape);
  auto guard = detail::kernel_guard(out.context(), false);
  kernels::permute(out.context().template exec_for<typename A::memory_space>(), a.local().data(), out.local().data(), static_cast<int>(A::rank), ext.data(),
                   perm.data());
  return out;
}

/// The tensor with dims `D0` and `D1` swapped.
template <int D0, int D1, TensorType A>
auto transpose(const A& a) {
  constexpr int r = static_cast<int>(std::remove_cvref_t<A>::rank);
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    return permute<(I == D0 ? D1 : I == D1 ? D0 : I)...>(a);
  }(std::make_integer_sequence<int, r>{});
}

namespace detail {
/// The output shape of reshape `pattern` (parsed: `p`) of operand `a`: `given`, or (when null)
/// the merges of the input dims; throws std::invalid_argument naming both shapes and the spec when
/// it does not fit the pattern.
SHARDLIB_NOINLINE inline void reshape_shape(const char* pattern, const ReshapePattern& p, const OperandInfo& a,
                                            const std::int64_t* given, std::int64_t* shape) {
  const auto out_rank = static_cast<std::size_t>(p.out_rank);
  if (given) {
    for (std::size_t k = 0; k < out_rank; ++k) shape[k] = given[k];
  } else {  // merges only: every output dim is a product of whole input dims
    for (int d = 0; d < p.in_rank; ++d)
      if (p.in_first[static_cast<std::size_t>(d) + 1] - p.in_first[static_cast<std::size_t>(d)] != 1)
        throw std::invalid_argument(std::string("shardlib: reshape \"") + pattern + "\" of " + operand_text(a) +
                                    " splits input dim " + std::to_string(d) + ": pass the output shape");
    for (int o = 0; o < p.out_rank; ++o) {
      std::int64_t e = 1;
      for (int at = p.out_first[static_cast<std::size_t>(o)]; at < p.out_first[static_cast<std::size_t>(o) + 1]; ++at)
        e *= a.shape[static_cast<std::size_t>(at)];  // atom i is input dim i here
      shape[static_cast<std::size_t>(o)] = e;
    }
  }
  const ArrayRef<std::int64_t> out(shape, out_rank);
  const int bad = check_reshape_shapes(p, a.shape, out);
  if (bad != -1)
    throw std::invalid_argument(std::string("shardlib: reshape \"") + pattern + "\" of " + operand_text(a) +
                                " to shape " + shape_text(out) + (bad >= 0 ? ": output dim " + std::to_string(bad) : std::string(": the shapes")) +
                                " does not match (a reshape keeps the element count and the pattern's groups)");
}

/// A reshape whose blocks do not line up: the operand gathered along its split dims (partial axes
/// stay partial), then each device copies its new block (`out`, `out_box` of global `shape`).
template <class T, class Mem>
SHARDLIB_NOINLINE void reshape_gather(const OpRule& rule, const OperandRef<T>& a, T* out, const ShardBox& out_box,
                                      ArrayRef<std::int64_t> shape) {
  Sharding whole = reduced(rule.in[0]);
  for (int d = 0; d < whole.rank; ++d) whole.dims[static_cast<std::size_t>(d)] = AxisList{};
  whole.partial = rule.in[0].partial;
  whole.op = rule.in[0].op;
  const Block<T> full = block_as<Mem>(a, whole);
  ShardBox all;
  all.rank = static_cast<int>(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k) all.extent[k] = shape[k];
  copy_box<Mem>(*a.ctx, full.data, all, out, out_box, out_box);
}

template <OpName Pattern, std::size_t ROut, class A>
auto reshape_op(const A& a, const std::array<std::int64_t, ROut>* given) {
  static constexpr ReshapePattern p = parse_reshape(std::string_view(Pattern.text));
  SHARDLIB_STATIC_REQUIRE((p.status == OpRule::ok), "shardlib: the reshape pattern does not parse",
                          error::reshape_pattern_does_not_parse<Pattern, OpName(p.error), p.error_pos>);
  static constexpr OpRule rule = p.status == OpRule::ok ? reshape_rule(p, A::sharding) : OpRule{};
  SHARDLIB_STATIC_REQUIRE((p.status != OpRule::ok || rule.status == OpRule::ok),
                          "shardlib: the reshape pattern's left side does not have the tensor's rank",
                          error::op_has_no_sharding_rule_for_these_specs<"reshape", rule.status, typename A::spec_type>);
  using T = typename A::value_type;
  using MeshT = typename A::mesh_type;
  using Mem = typename A::memory_space;
  using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, Mem>;
  static_assert(ROut == 0 || ROut == Out::rank, "shardlib: reshape: the output shape has another rank than the pattern");
  typename Out::Shape shape{};
  reshape_shape(Pattern.text, p, info(a), given ? given->data() : nullptr, shape.data());
  const Block<T> in = block_as(a, rule.in[0]);
  if (reshape_blocks_align(p, rule.in[0], rule.out, a.mesh().shape(), a.shape(), shape)) {
    // Row-major blocks of the same elements in the same order: reinterpret, no copy.
    std::shared_ptr<void> owner = in.keep ? in.keep : a.block_owner();
    return Out(a.mesh(), shape, std::move(owner), const_cast<T*>(in.data));
  }
  Out out(a.mesh(), shape);
  reshape_gather<T, Mem>(rule, ref(a), out.local().data(), out.block(), shape);
  return out;
}
}  // namespace detail

/// Reshape by an einops-style pattern, parsed at compile time: `reshape<"b s h -> (b s) h">(x)`
/// merges dims (the output shape follows from the input's); a split needs the output shape:
/// `reshape<"b (n d) -> b n d">(x, {B, N, D})`. The pattern lists the same names in the same
/// order on both sides (a reshape does not transpose: use permute). A split dim keeps its axes
/// on the major dim of its group; minor dims of a merge are gathered first when split. Throws
/// std::invalid_argument when the shapes do not fit the pattern (naming both shapes and the spec).
template <OpName Pattern, TensorType A>
auto reshape(const A& a) {
  return detail::reshape_op<Pattern, 0>(a, nullptr);
}
template <OpName Pattern, TensorType A, std::size_t N>
auto reshape(const A& a, const std::int64_t (&shape)[N]) {
  std::array<std::int64_t, N> s{};
  for (std::size_t i = 0; i < N; ++i) s[i] = shape[i];
  return detail::reshape_op<Pattern, N>(a, &s);
}

/// Elements [begin, end) along dim `Dim`, in the same spec. Along a split dim the blocks of the
/// result come from whichever devices of the dim's group hold them (one all_to_all); otherwise a
/// local copy. Throws std::out_of_range naming the shape, spec and range when it is outside the dim.
template <int Dim, TensorType A>
auto slice(const A& a, std::int64_t begin, std::int64_t end) {
  static constexpr OpRule rule = slice_rule(A::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: slice: the dim is outside the tensor's rank",
                          error::op_has_no_sharding_rule_for_these_specs<"slice", rule.status, typename A::spec_type>);
  using Out = DistributedTensor<typename A::value_type, typename A::mesh_type, spec_from_t<typename A::mesh_type, decltype([] { return rule.out; })>,
                                typename A::memory_space>;
  const std::int64_t extent = a.shape()[static_cast<std::size_t>(Dim)];
  if (begin < 0 || end > extent || begin > end) detail::throw_slice_out_of_range(begin, end, Dim, detail::info(a));
  const auto in = detail::block_as(a, rule.in[0]);
  typename Out::Shape shape = a.shape();
  shape[static_cast<std::size_t>(Dim)] = end - begin;
  Out out(a.mesh(), shape);
  detail::shift_blocks<typename A::value_type, typename A::memory_space>(out.context(), a.mesh().shape(), rule.comm, Dim, in.data, in.box, extent, -begin, out.local().data(),
                       out.block(), end - begin);
  return out;
}

/// `a` and `b` joined along dim `Dim` (b is resharded to a's spec first when they differ; two
/// partial-sum operands over the same axes stay partial). Throws std::invalid_argument naming
/// both shapes and specs when the other dims differ.
template <int Dim, TensorType A, TensorType B>
auto concat(const A& a, const B& b) {
  static constexpr OpRule rule = concat_rule(A::sharding, B::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: concat needs operands of one rank and a dim inside it",
                          error::op_has_no_sharding_rule_for_these_specs<"concat", rule.status, typename A::spec_type,
                                                                         typename B::spec_type>);
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type>,
                "shardlib: concat needs operands of one element type");
  static_assert(detail::require_one_memory_space<"concat", typename A::memory_space, typename B::memory_space>());
  detail::check_same_mesh("concat", a, b);
  using Out = DistributedTensor<typename A::value_type, typename A::mesh_type, spec_from_t<typename A::mesh_type, decltype([] { return rule.out; })>,
                                typename A::memory_space>;
  typename Out::Shape shape = a.shape();
  for (std::size_t d = 0; d < Out::rank; ++d)
    if (static_cast<int>(d) != Dim && a.shape()[d] != b.shape()[d])
      detail::throw_concat_mismatch(Dim, static_cast<int>(d), detail::info(a), detail::info(b));
  const auto u = static_cast<std::size_t>(Dim);
  shape[u] = a.shape()[u] + b.shape()[u];
  const auto ba = detail::block_as(a, rule.in[0]);
  const auto bb = detail::block_as(b, rule.in[1]);
  Out out(a.mesh(), shape);
  using Mem = typename A::memory_space;
  detail::shift_blocks<typename A::value_type, Mem>(out.context(), a.mesh().shape(), rule.comm, Dim, ba.data, ba.box, a.shape()[u], 0,
                                                    out.local().data(), out.block(), shape[u]);
  detail::shift_blocks<typename A::value_type, Mem>(out.context(), a.mesh().shape(), rule.comm, Dim, bb.data, bb.box, b.shape()[u], a.shape()[u],
                       out.local().data(), out.block(), shape[u]);
  return out;
}

/// numpy's take(table, indices, axis=Dim): the output has the table's dims before `Dim`, then the
/// indices' dims, then the table's dims after `Dim`. With the table split along `Dim` (a
/// vocabulary-parallel embedding) each device looks up the rows it holds and the result is
/// partial-sum over the split axes. Indices are global; an index outside [0, extent) throws
/// std::out_of_range naming it (checked unless NDEBUG is defined without SHARDLIB_CHECKED).
template <int Dim, TensorType Table, TensorType Indices>
auto take(const Table& table, const Indices& indices) {
  using I = typename Indices::value_type;
  SHARDLIB_STATIC_REQUIRE((std::is_integral_v<I>), "shardlib: take needs integer indices",
                          error::take_needs_integer_indices<I>);
  static constexpr OpRule rule = take_rule(Table::sharding, Indices::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for take with these specs",
                          error::op_has_no_sharding_rule_for_these_specs<"take", rule.status, typename Table::spec_type,
                                                                         typename Indices::spec_type>);
  static_assert(detail::require_one_memory_space<"take", typename Table::memory_space, typename Indices::memory_space>());
  detail::check_same_mesh("take", table, indices);
  using T = typename Table::value_type;
  using MeshT = typename Table::mesh_type;
  using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, typename Table::memory_space>;
  constexpr std::size_t rt = Table::rank, ri = Indices::rank;
  constexpr auto u = static_cast<std::size_t>(Dim);
  const typename Out::Shape shape = detail::take_shape<Out::rank>(table.shape(), indices.shape(), u);
  const auto bt = detail::block_as(table, rule.in[0]);
  const auto bi = detail::block_as(indices, rule.in[1]);
  Out out(table.mesh(), shape);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d != u; ++d) outer *= bt.box.extent[d];  // (not d < u: nvcc warns when u is 0)
  for (std::size_t d = u + 1; d < rt; ++d) inner *= bt.box.extent[d];
  constexpr bool check = detail::check_indices;
  auto guard = detail::kernel_guard(out.context(), false);
  try {
    kernels::take(out.context().template exec_for<typename Table::memory_space>(), bt.data, outer, bt.box.extent[u], inner, bt.box.offset[u], table.shape()[u],
                  bi.data, bi.box.num_elements(), out.local().data(), check);
  } catch (const std::out_of_range& e) {  // name the tensors (the kernel's position is within this block)
    detail::throw_take_out_of_range(Dim, detail::info(table), detail::info(indices),
                                    detail::ArrayRef<std::int64_t>(bi.box.offset.data(), ri), e.what());
  }
  return out;
}

/// The transpose of take: `base` with `values` added at `indices` along `Dim` (torch's
/// index_add, for any rank of indices): `values` has take(base, indices)'s shape, and row
/// indices[j] of the result gets the values of position j (repeated indices add up). Rule:
/// sharding/layout.hpp `index_add_rule`: each device scatters its block of indices into its
/// block of the base; a base split along `Dim` (vocabulary-parallel) takes only the rows it holds
/// (no communication); the result is partial-sum over the axes that split the indices. Throws
/// std::invalid_argument when `values` does not have take's shape, std::out_of_range for an
/// index outside the dim (checked as take checks).
template <int Dim, TensorType Base, TensorType Indices, TensorType Values>
auto index_add(const Base& base, const Indices& indices, const Values& values) {
  using I = typename Indices::value_type;
  SHARDLIB_STATIC_REQUIRE((std::is_integral_v<I>), "shardlib: index_add needs integer indices",
                          error::take_needs_integer_indices<I>);
  static_assert(std::is_same_v<typename Base::value_type, typename Values::value_type>,
                "shardlib: index_add needs base and values of one element type");
  static constexpr OpRule rule = index_add_rule(Base::sharding, Indices::sharding, Values::sharding, Dim);
  SHARDLIB_STATIC_REQUIRE((rule.status == OpRule::ok), "shardlib: no sharding rule for index_add with these specs",
                          error::op_has_no_sharding_rule_for_these_specs<"index_add", rule.status, typename Base::spec_type,
                                                                         typename Indices::spec_type, typename Values::spec_type>);
  static_assert(detail::require_one_memory_space<"index_add", typename Base::memory_space, typename Indices::memory_space,
                                                typename Values::memory_space>());
  detail::check_same_mesh("index_add", base, indices);
  detail::check_same_mesh("index_add", base, values);
  using T = typename Base::value_type;
  using MeshT = typename Base::mesh_type;
  using Out = DistributedTensor<T, MeshT, spec_from_t<MeshT, decltype([] { return rule.out; })>, typename Base::memory_space>;
  constexpr std::size_t rt = Base::rank, ri = Indices::rank;
  constexpr auto u = static_cast<std::size_t>(Dim);
  bool fits = Values::rank == rt - 1 + ri;
  if constexpr (Values::rank == rt - 1 + ri)
    fits = values.shape() == detail::take_shape<Values::rank>(base.shape(), indices.shape(), u);
  if (!fits)
    throw std::invalid_argument("shardlib: index_add<" + std::to_string(Dim) + ">: values " + detail::operand_text(values) +
                                " do not have the shape of take(base, indices) for base " + detail::operand_text(base) +
                                " and indices " + detail::operand_text(indices));
  const auto bb = detail::block_as(base, rule.in[0]);
  const auto bi = detail::block_as(indices, rule.in[1]);
  const auto bv = detail::block_as(values, rule.in[2]);
  using Mem = typename Base::memory_space;
  Out out(base.mesh(), base.shape());
  Context& ctx = out.context();
  if (detail::off_first_coordinate(base.mesh().shape(), ctx.device(), rule.out.partial))
    detail::fill<Mem>(ctx, out.local().data(), out.block().num_elements(), T{});
  else
    detail::copy_box<Mem>(ctx, bb.data, bb.box, out.local().data(), out.block(), out.block());
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d != u; ++d) outer *= out.block().extent[d];  // (not d < u: nvcc warns when u is 0)
  for (std::size_t d = u + 1; d < rt; ++d) inner *= out.block().extent[d];
  constexpr bool check = detail::check_indices;
  auto guard = detail::kernel_guard(ctx, false);
  try {
    kernels::index_add(ctx.exec_for<Mem>(), out.local().data(), outer, out.block().extent[u], inner, out.block().offset[u],
                       base.shape()[u], bi.data, bi.box.num_elements(), bv.data, check);
  } catch (const std::out_of_range& e) {
    detail::throw_take_out_of_range(Dim, detail::info(base), detail::info(indices),
                                    detail::ArrayRef<std::int64_t>(bi.box.offset.data(), ri), e.what());
  }
  return out;
}

}  // namespace shardlib
