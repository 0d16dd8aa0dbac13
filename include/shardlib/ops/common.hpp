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

/// The block of `t` laid out as `target` (a reshard when it differs from the tensor's spec;
/// collective then). `target` has the tensor's rank.
template <class T, class MeshT, class SpecT, class Mem>
Block<T> block_as(const DistributedTensor<T, MeshT, SpecT, Mem>& t, const Sharding& target) {
  using Tensor = DistributedTensor<T, MeshT, SpecT, Mem>;
  if (target == Tensor::sharding) return {nullptr, t.local().data(), t.block()};
  Context& ctx = t.context();
  const auto& c = compiled_reshard(ctx, t.mesh().shape(), Tensor::sharding, target, t.shape());
  if (c.steps.empty()) return {nullptr, t.local().data(), t.block()};
  Block<T> b;
  b.box = c.steps.back().out_box;
  auto alloc = [cache = &block_cache<Mem>(ctx)](std::size_t n) { return cache->allocate(n * sizeof(T)); };
  run_reshard(ctx, c, t.local().data(), alloc, [&](std::size_t n) {
    b.keep = alloc(n);
    return static_cast<T*>(b.keep.get());
  });
  b.data = static_cast<const T*>(b.keep.get());
  return b;
}

/// "[4, 8] with Spec<"x", none>", for messages.
template <class Tensor>
std::string operand_text(const Tensor& t) {
  return shape_text(t.shape()) + " with " + t.spec_string();
}

/// Throws std::invalid_argument when `b` lives on another mesh (sizes or context) than `a`.
template <class A, class B>
void check_same_mesh(const char* op, const A& a, const B& b) {
  if (!(a.mesh() == b.mesh()) || &a.context() != &b.context())
    throw std::invalid_argument(std::string("shardlib: ") + op + ": operands on different meshes: " + operand_text(a) +
                                " on " + a.mesh().to_string() + ", " + operand_text(b) + " on " +
                                b.mesh().to_string());
}

/// Kernel launch guard of the tensor's device (see runtime.hpp).
template <class Tensor>
auto guard(const Tensor& t, bool reduction = false) {
  return kernel_guard(t.context(), reduction);
}

}  // namespace detail
}  // namespace shardlib
