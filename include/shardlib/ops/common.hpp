// SPDX-License-Identifier: Apache-2.0
/// @file
/// What every op shares: compile errors that name the op and the specs, operands resharded to
/// the layout an op's rule asks for, and checks that operands live on the same mesh.
///
/// An op is three steps: its rule (a constexpr function in sharding/) picks the output spec and
/// each operand's layout at compile time; operands whose spec differs are resharded (the plan is
/// cached per shape, see tensor.hpp); the local kernel (kernels/) runs on the blocks. The output
/// type is `DistributedTensor<U, Mesh, spec_from_t<Mesh, ...rule.out...>>`: no runtime dispatch.
#pragma once

#include <shardlib/detail/attributes.hpp>
#include <shardlib/detail/diagnostics.hpp>
#include <shardlib/sharding/rule.hpp>
#include <shardlib/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardlib {

/// A short compile-time text (an op's name, a parse error) usable as a template argument, so that
/// compile errors spell it: `error::op_has_no_sharding_rule<"einsum", ...>`.
struct OpName {
  char text[48]{};
  template <std::size_t N>
  constexpr OpName(const char (&s)[N]) {  // NOLINT(google-explicit-constructor)
    static_assert(N <= sizeof(text), "shardlib: OpName holds at most 47 characters");
    for (std::size_t i = 0; i < N; ++i) text[i] = s[i];
  }
  /// From a string literal known at compile time (truncated to 47 characters).
  constexpr explicit OpName(const char* s) {
    for (std::size_t i = 0; i + 1 < sizeof(text) && s[i] != '\0'; ++i) text[i] = s[i];
  }
};

/// Compile-time errors about ops (undefined on purpose: see detail/diagnostics.hpp).
namespace error {
/// The op's rule rejects these operand specs; `Why` is the rule's status.
template <OpName Op, OpRule::Status Why, class... Specs>
struct op_has_no_sharding_rule_for_these_specs;
/// The operands of an op live on meshes of different types.
template <OpName Op, class... Meshes>
struct op_operands_are_on_different_meshes;
/// The operands of an op live in different memory spaces (host and device memory, say): move one
/// (`to_host`/`from_host`, or a tensor created in the other space) first.
template <OpName Op, class... MemorySpaces>
struct op_operands_are_in_different_memory_spaces;
}  // namespace error


template <class T>
inline constexpr bool is_tensor_v = false;
template <class T, class M, class S, class Mem>
inline constexpr bool is_tensor_v<DistributedTensor<T, M, S, Mem>> = true;
/// A `DistributedTensor<...>` (cv-ref ignored).
template <class T>
concept TensorType = is_tensor_v<std::remove_cvref_t<T>>;

namespace detail {

/// A block an op's kernel reads: the operand's own block, or a resharded copy that `keep` owns.
template <class T>
struct Block {
  std::shared_ptr<void> keep;
  const T* data = nullptr;
  ShardBox box{};
};

/// An operand as runtime values: what runtime-generic op code needs of a tensor, whatever its
/// spec type (the sharding is the type's constexpr value). Refers to the tensor: use it during
/// the call that made it.
template <class T>
struct OperandRef {
  Context* ctx = nullptr;
  const MeshShape* mesh = nullptr;
  const Sharding* sharding = nullptr;
  ArrayRef<std::int64_t> shape;
  const T* data = nullptr;
  const ShardBox* box = nullptr;
};
/// Stops the build when the operands of op `Name` live in different memory spaces.
template <OpName Name, class Mem, class... Mems>
constexpr bool require_one_memory_space() {
  SHARDLIB_STATIC_REQUIRE(((std::is_same_v<Mem, Mems> && ...)), "shardlib: an op on tensors in different memory spaces",
                          error::op_operands_are_in_different_memory_spaces<Name, Mem, Mems...>);
  return true;
}

/// Tensor `t` as an OperandRef.
template <class T, class MeshT, class SpecT, class Mem>
OperandRef<T> ref(const DistributedTensor<T, MeshT, SpecT, Mem>& t) noexcept {
  return {&t.context(), &t.mesh().shape(), &DistributedTensor<T, MeshT, SpecT, Mem>::sharding, t.shape(),
          t.local().data(), &t.block()};
}

/// The block (`data`, `box`) of a tensor of `shape` with sharding `from` on `mesh`, laid out as
/// `target` (a reshard when it differs; collective then), in memory space `Mem` (a reshard of a
/// block in device memory: execute/reshard.hpp's run_reshard_in). Runtime-generic: compiled once
/// per element type and memory space.
template <class T, class Mem>
SHARDLIB_NOINLINE Block<T> block_as(Context& ctx, const MeshShape& mesh, const Sharding& from, ArrayRef<std::int64_t> shape,
                                    const T* data, const ShardBox& box, const Sharding& target) {
  if (target == from) return {nullptr, data, box};
  const auto& c = compiled_reshard(ctx, mesh, from, target, shape, nullptr, reshards_on_device<Mem>(ctx));
  if (c.steps.empty()) return {nullptr, data, box};
  Block<T> b;
  b.box = c.steps.back().out_box;
  run_reshard_in<Mem, T>(ctx, c, data, [&](std::size_t n) {
    b.keep = block_cache<Mem>(ctx).allocate(n * sizeof(T));
    return static_cast<T*>(b.keep.get());
  });
  b.data = static_cast<const T*>(b.keep.get());
  return b;
}

/// The block of operand `t` laid out as `target` (see above), in `t`'s memory space `Mem`.
template <class Mem, class T>
Block<T> block_as(const OperandRef<T>& t, const Sharding& target) {
  return block_as<T, Mem>(*t.ctx, *t.mesh, *t.sharding, t.shape, t.data, *t.box, target);
}

/// The block of `t` laid out as `target` (see above), in `t`'s memory space. `target` has the
/// tensor's rank.
template <class T, class MeshT, class SpecT, class Mem>
Block<T> block_as(const DistributedTensor<T, MeshT, SpecT, Mem>& t, const Sharding& target) {
  return block_as<T, Mem>(t.context(), t.mesh().shape(), DistributedTensor<T, MeshT, SpecT, Mem>::sharding, t.shape(),
                          t.local().data(), t.block(), target);
}

/// What messages say of an operand, whatever its type: its shape, spec and mesh.
struct OperandInfo {
  ArrayRef<std::int64_t> shape;
  const PartitionSpec* spec = nullptr;
  const MeshShape* mesh = nullptr;
};
template <class Tensor>
OperandInfo info(const Tensor& t) noexcept {
  return {t.shape(), &Tensor::spec_type::value, &t.mesh().shape()};
}

/// "[4, 8] with Spec<"x", none>", for messages.
inline std::string operand_text(const OperandInfo& t) { return shape_text(t.shape) + " with " + t.spec->to_string(); }
template <class Tensor>
std::string operand_text(const Tensor& t) {
  return operand_text(info(t));
}

[[noreturn]] SHARDLIB_COLD inline void throw_different_meshes(const char* op, const OperandInfo& a, const OperandInfo& b) {
  throw std::invalid_argument(std::string("shardlib: ") + op + ": operands on different meshes: " + operand_text(a) +
                              " on " + a.mesh->to_string() + ", " + operand_text(b) + " on " + b.mesh->to_string());
}

/// Throws std::invalid_argument when `b` lives on another mesh (sizes or context) than `a`.
template <class A, class B>
void check_same_mesh(const char* op, const A& a, const B& b) {
  if (!(a.mesh() == b.mesh()) || &a.context() != &b.context()) throw_different_meshes(op, info(a), info(b));
}

}  // namespace detail
}  // namespace shardlib
