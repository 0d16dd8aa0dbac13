// SPDX-License-Identifier: Apache-2.0
/// @file
/// The sharding rule of scaled dot-product attention, `attention(q, k, v)` on [B, S, H, K]
/// tensors (batch, sequence, heads, head dim: the layout JAX's dot_product_attention takes, and
/// the one `einsum<"bsd,dhk->bshk">` gives the projections):
///
///  1. Three operands of rank 4 (else `rank_mismatch`, `operand` naming the first that is not).
///  2. The batch dim and the heads dim are independent problems: each may stay split, and the
///     kernel runs on the local batches and heads with no communication (Megatron's attention:
///     heads over "model"; data parallelism: batch over "data").
///  3. The sequence dim and the head dim are contracted or softmaxed over inside the op, so the
///     kernel sees whole sequences. A split of q's sequence is context parallelism, done as
///     DeepSpeed-Ulysses does it: the axes that split q's sequence move onto the heads dim
///     (appended, minor to the heads' own axes) for the kernel — one all-to-all per operand, each
///     device then holds every position of 1/p of the heads — and back onto the sequence for the
///     output (one all-to-all). The head dim is gathered.
///  4. Partial operands are reduced first (attention is not linear in q, k or v together).
///  5. k and v take the kernel's layout (q's batch axes; q's heads and sequence axes on heads);
///     the output has q's layout of the batch, sequence and heads dims (its head dim is v's,
///     replicated). An axis that splits q's batch, sequence or heads dim may not split another
///     dim of k or v: those dims are gathered, so nothing is lost.
///
/// `ring_attention_rule` is the other form of context parallelism, ring attention: q, k and v
/// keep q's sequence split (k and v take q's layout of batch, sequence and heads; the head dim
/// gathered, partial operands reduced), the kernel passes k and v around the ring of the
/// sequence's axes (its own communication, not the rule's), and the output has q's layout.
///
/// Pure rule: constexpr, no Kokkos, no communicator; never throws for bad input.
#pragma once

#include <shardlib/mesh.hpp>
#include <shardlib/sharding/rule.hpp>
#include <shardlib/spec.hpp>

namespace shardlib {

/// The dims of attention's operands, [B, S, H, K].
namespace attention_dims {
inline constexpr int batch = 0, seq = 1, heads = 2, head_dim = 3;
}  // namespace attention_dims

/// The sharding rule of attention(q, k, v) (see the file comment): `in` = {q, k, v} as the
/// kernel needs them (its output is laid out alike), `out` = the output's sharding (q's), `comm`
/// empty.
constexpr OpRule attention_rule(const Sharding& q, const Sharding& k, const Sharding& v) {
  OpRule r;
  r.count = 3;
  const Sharding* ops[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i)
    if (ops[i]->rank != 4) {
      r.status = OpRule::rank_mismatch;
      r.operand = i;
      return r;
    }
  using namespace attention_dims;
  Sharding s;
  s.rank = 4;
  s.dims[batch] = q.dims[batch];
  s.dims[heads] = q.dims[heads];
  for (int a : q.dims[seq]) s.dims[heads].push_back(a);  // Ulysses: the sequence's axes onto the heads
  r.in = {s, s, s};
  r.out = s;
  r.out.dims[seq] = q.dims[seq];
  r.out.dims[heads] = q.dims[heads];
  return r;
}

/// The sharding rule of ring attention (see the file comment): `in` = {q, k, v} in q's layout of
/// the batch, sequence and heads dims (head dim whole, nothing partial), `out` the same, `comm`
/// the axes of the ring (q's sequence axes).
constexpr OpRule ring_attention_rule(const Sharding& q, const Sharding& k, const Sharding& v) {
  OpRule r = attention_rule(q, k, v);
  if (r.status != OpRule::ok) return r;
  using namespace attention_dims;
  Sharding s;
  s.rank = 4;
  s.dims[batch] = q.dims[batch];
  s.dims[seq] = q.dims[seq];
  s.dims[heads] = q.dims[heads];
  r.in = {s, s, s};
  r.out = s;
  r.comm = q.dims[seq];  // the ring
  return r;
}

}  // namespace shardlib
