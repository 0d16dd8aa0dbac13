// SPDX-License-Identifier: Apache-2.0
/// @file
/// The recorded graph of reverse mode, per device, and the gradient blocks that flow through it.
///
/// Each op on a `Var` that needs a gradient records a node: what it must know to run its
/// backward rule (the tensors it saved, its inputs' nodes). `backward()` visits the nodes reached
/// from the loss in reverse topological order. A node's gradient arrives as *contributions*:
/// blocks with a runtime sharding, one per distinct sharding (contributions of the same sharding
/// are added locally as they arrive). A contribution may be partial-sum (a weight's gradient
/// from a batch split over "data" is pending over "data"): nothing moves until the node resolves
/// its contributions into its gradient spec (its value's spec without a partial clause), one
/// reshard each: the all_reduce of data parallelism, or a reduce_scatter when the target is
/// split (FSDP). A reshard node does not resolve: it hands its contributions to its input
/// unchanged, which is how the transpose of an all_gather becomes a reduce_scatter.
///
/// Runtime-generic: compiled once per element type and memory space, whatever the specs.
///
/// In shape-only mode (detail/shape_only.hpp) gradient blocks are allocated, summed and resharded
/// as always with no element computed, and every gradient checks finite.
#pragma once

#include <shardlib/detail/attributes.hpp>
#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/exec.hpp>
#include <shardlib/ops/common.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace shardlib {

/// How `backward()` resolves and checks gradients (see docs/05_gradients.md).
struct BackwardOptions {
  /// Resolve the parameters' pending sums now (one collective per bucket or parameter). False
  /// keeps them pending on the parameters, added up locally over several backward calls, until
  /// `sync_grads(params...)` (gradient accumulation over micro-batches: one reduction for N).
  bool sync = true;
  /// Parameters whose gradients resolve by the same all_reduce share one collective per bucket of
  /// at most this many bytes (DDP's 25 MB); 0: one collective per parameter. With `sync = false`,
  /// the parameters an optimizer keeps state for in another spec (ZeRO-2) are reduce-scattered
  /// into it once their full-size gradients in flight reach this many bytes (DeepSpeed's
  /// reduce_bucket_size), and at the end of the pass; 0: each as soon as the pass is done with it.
  /// With `sync = true`, the parameters whose gradients do not resolve by an all_reduce (a split
  /// parameter's reduce_scatter: ZeRO-3 / FSDP) resolve in the same buckets of full-size bytes
  /// during the pass, not all at its end.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// With `sync = false`: reduce-scatter the pending gradients of the parameters an optimizer keeps
  /// state for in another spec during the pass (ZeRO-2, above). False keeps their full-size sums
  /// pending until the optimizer's step, which resolves them once (ZeRO-1 over several passes:
  /// one reduction per global batch, not one per micro-batch).
  bool settle = true;
  /// Check every gradient block a backward rule produces for NaN or infinity and throw naming
  /// the op. Costs one small all_reduce per op (so that every device throws together).
  bool check_finite = false;
  /// Keep the graph for another backward through it (otherwise each node's saved tensors are
  /// freed once its rule ran).
  bool keep_graph = false;
};

namespace autodiff {

/// A gradient block with its runtime sharding: this device's block (`box`) of a tensor of the
/// node's shape, laid out by `sharding` (possibly partial-sum), kept alive by `keep`.
struct Contribution {
  Sharding sharding{};
  ShardBox box{};
  std::shared_ptr<void> keep;
  void* data = nullptr;
};

class Node;

/// What a parameter's node does for the pass that resolves its gradient (see resolve_leaves).
class LeafGrad {
 public:
  virtual ~LeafGrad() = default;
  virtual std::size_t elem_size() const noexcept = 0;
  virtual coll::DType dtype() const noexcept = 0;
  virtual Context& context() const = 0;
  virtual const MeshShape& mesh_shape() const noexcept = 0;
  virtual bool has_pending_grad() const noexcept = 0;
  /// Whether the pending contributions resolve by one all_reduce over `axes` of a block laid out
  /// as the parameter (then `only_pending()` is that block).
  virtual bool resolves_by_all_reduce(AxisList& axes) const = 0;
  virtual const Contribution& only_pending() const = 0;
  /// Whether the gradient is in host memory (buckets hold gradients of one kind of memory).
  virtual bool in_host_memory() const noexcept = 0;
  /// Whether the gradient may share a bucket: in host memory, or in device memory under a backend
  /// that reduces device memory in place (threads on a GPU, nccl). Otherwise it resolves alone
  /// (its reshard goes through host memory).
  virtual bool bucketable() const = 0;
  /// A bucket of `bytes` in the gradient's memory, counted as gradients in the device's ledger.
  virtual std::shared_ptr<void> allocate_bucket(std::size_t bytes) = 0;
  /// Copies `only_pending()`'s block to `dst` in the gradient's memory (device memory: queued on
  /// the device's stream).
  virtual void copy_pending_to(void* dst) = 0;
  /// The communicator that all-reduces a bucket over `axes` (device memory: the device group).
  virtual coll::Communicator& bucket_group(const AxisList& axes) = 0;
  /// The pending contributions resolved into the parameter's spec (collective when one is
  /// partial or laid out otherwise): a type-erased tensor for commit().
  virtual std::shared_ptr<void> resolve_alone() = 0;
  /// A resolved block (laid out as the parameter) as a type-erased tensor for commit().
  virtual std::shared_ptr<void> from_block(std::shared_ptr<void> keep, void* data) = 0;
  /// Forgets the pending contributions and adds the resolved gradient (local).
  virtual void commit(const std::shared_ptr<void>& resolved) = 0;
  /// Whether an optimizer asked for this parameter's pending gradient in another layout
  /// (`settle`), and the bytes of its full-size gradient (the same on every device).
  virtual bool settles() const noexcept = 0;
  virtual std::size_t full_bytes() const noexcept = 0;
  /// In a pass that leaves gradients pending (`sync = false`), called once the pass is done with
  /// this parameter (in buckets, see BackwardOptions::bucket_bytes): resolves its contributions
  /// into the layout an optimizer asked for (ZeRO-2: a reduce_scatter into the state's shard), so
  /// the full-size addends are freed during the pass, not at the step. Collective.
  virtual void settle() = 0;
  /// In a pass that resolves gradients (`sync = true`), called once the pass is done with a
  /// parameter whose gradient does not resolve by an all_reduce (a split parameter: ZeRO-3's
  /// reduce_scatter; one used in several layouts): resolves its contributions into its own spec,
  /// still pending (the pass commits every gradient at its end, so a throw changes none), so the
  /// full-size addends are freed during the pass. Collective.
  virtual void settle_own() = 0;
};

/// State of one backward pass, passed to the nodes' rules.
struct BackwardPass {
  BackwardOptions options;
  const Node* current = nullptr;  ///< the node whose rule runs
};

/// A node of the graph (see the file comment): an op's output, or a parameter (a leaf).
class Node {
 public:
  Node(const char* op, std::vector<std::shared_ptr<Node>> inputs) : op_(op), inputs_(std::move(inputs)) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// The op that made this node ("matmul", "param").
  const char* op() const noexcept { return op_; }
  const std::vector<std::shared_ptr<Node>>& inputs() const noexcept { return inputs_; }
  bool has_pending() const noexcept { return !pending_.empty(); }
  /// Whether the rule's saved tensors were freed by a backward pass.
  bool freed() const noexcept { return freed_; }
  /// A parameter's node, or null.
  virtual LeafGrad* as_leaf() noexcept { return nullptr; }
  /// "[8, 16] with Spec<"data", none>", for messages.
  virtual std::string describe() const = 0;

  /// Runs the backward rule: resolves this node's contributions and adds its inputs'.
  virtual void backward(BackwardPass& pass) = 0;
  /// Frees what the rule saved (and the edges to the inputs).
  void release() {
    release_saved();
    inputs_.clear();
    freed_ = true;
  }
  /// Forgets the contributions received (a failed backward pass).
  void drop_pending() noexcept { pending_.clear(); }
  /// The contributions received (shared blocks), to restore after a failed pass.
  const std::vector<Contribution>& pending() const noexcept { return pending_; }
  void set_pending(std::vector<Contribution> p) noexcept { pending_ = std::move(p); }

 protected:
  virtual void release_saved() = 0;
  std::vector<Contribution> pending_;

 private:
  const char* op_;
  std::vector<std::shared_ptr<Node>> inputs_;
  bool freed_ = false;
};

namespace detail {
using namespace shardlib::detail;  // NOLINT: the ops' runtime helpers

/// The forward of a `checkpoint` (checkpoint.hpp): while one is open on this thread (a device's
/// thread), ops record no node and return constants; the scope notes the nodes of the operands they
/// read: parameters (leaves), which the checkpoint's node then lists as inputs so that the outer
/// pass resolves their gradients after the recomputation added to them, and Vars, which must be
/// the checkpoint's own inputs (anything else would be cut off from its gradient: an error).
class NoRecordScope {
 public:
  explicit NoRecordScope(std::vector<const Node*> inputs) : inputs_(std::move(inputs)), outer_(current()) {
    current() = this;
  }
  /// `sl::NoGrad`'s scope: every Var may be read (its value only), nothing is an error.
  struct Lenient {};
  explicit NoRecordScope(Lenient) : lenient_(true), outer_(current()) { current() = this; }
  ~NoRecordScope() { current() = outer_; }
  NoRecordScope(const NoRecordScope&) = delete;
  NoRecordScope& operator=(const NoRecordScope&) = delete;

  /// The scope open on this thread, or null.
  static NoRecordScope*& current() noexcept {
    thread_local NoRecordScope* scope = nullptr;
    return scope;
  }
  /// Notes an operand's node (null: a constant). Throws std::logic_error for a Var that is neither
  /// a parameter nor one of the checkpoint's inputs.
  void see(const std::shared_ptr<Node>& n) {
    if (!n || lenient_) return;
    if (n->as_leaf()) {
      if (std::find(leaves_.begin(), leaves_.end(), n) == leaves_.end()) leaves_.push_back(n);
      return;
    }
    if (std::find(inputs_.begin(), inputs_.end(), n.get()) != inputs_.end()) return;
    throw std::logic_error(std::string("shardlib: checkpoint: the function reads a Var that is not one of its inputs "
                                       "(the output of op '") + n->op() + "', " + n->describe() +
                           "): pass it to checkpoint as an input, or its gradient would be lost");
  }
  /// The parameters read, in the order first read.
  const std::vector<std::shared_ptr<Node>>& leaves() const noexcept { return leaves_; }

 private:
  std::vector<const Node*> inputs_;
  std::vector<std::shared_ptr<Node>> leaves_;
  bool lenient_ = false;
  NoRecordScope* outer_;
};

/// Whether an op on operands with these nodes records one (false inside a checkpoint's forward,
/// which notes them).
template <class... N>
bool recording(const std::shared_ptr<N>&... nodes) {
  NoRecordScope* scope = NoRecordScope::current();
  if (!scope) return true;
  (scope->see(nodes), ...);
  return false;
}

/// The nodes reached from `root`, in the order their rules run (reverse topological); `keep`
/// holds them alive while the pass frees the edges.
SHARDLIB_NOINLINE inline std::vector<Node*> backward_order(Node* root, std::vector<std::shared_ptr<Node>>& keep) {
  std::vector<Node*> post;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<Node*, std::size_t>> stack{{root, 0}};
  seen.insert(root);
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->inputs().size()) {
      const std::shared_ptr<Node>& in = n->inputs()[next++];
      if (in && seen.insert(in.get()).second) {
        keep.push_back(in);
        stack.push_back({in.get(), 0});
      }
    } else {
      post.push_back(n);
      stack.pop_back();
    }
  }
  std::reverse(post.begin(), post.end());
  return post;
}

/// out[k] = a[k] + b[k] (a kernel; device memory: on the GPU).
template <class T>
struct AddKernel {
  T* out;
  const T* a;
  const T* b;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const { out[k] = a[k] + b[k]; }
};
/// out[k] = in[k] converted.
template <class T, class U>
struct ConvertKernel {
  T* out;
  const U* in;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const { out[k] = static_cast<T>(in[k]); }
};
/// Counts the elements that are a NaN or an infinity (a Kokkos::Sum reduction).
template <class T>
struct NonFiniteKernel {
  const T* p;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k, int& bad) const {
    const compute_t<T> v = static_cast<compute_t<T>>(p[k]);
    if (!(v - v == v - v)) ++bad;  // inf - inf and NaN - NaN are NaN; finite - itself is 0
  }
};

/// `out = a + b` over `n` elements of blocks in `Mem`, on the device's execution space.
template <class T, class Mem>
void add_blocks(const Context& ctx, T* out, const T* a, const T* b, std::int64_t n) {
  for_range<Mem>("shardlib::autodiff::add", ctx, n, AddKernel<T>{out, a, b}, 3 * static_cast<std::uint64_t>(n) * sizeof(T));
}

/// out[k] = in[k] converted (`n` elements of blocks in `Mem`; a kernel).
template <class T, class U, class Mem>
void convert_block(const Context& ctx, T* out, const U* in, std::int64_t n) {
  for_range<Mem>("shardlib::autodiff::convert", ctx, n, ConvertKernel<T, U>{out, in},
                 static_cast<std::uint64_t>(n) * (sizeof(T) + sizeof(U)));
}

/// Whether a block in `Mem` holds a NaN or an infinity: one reduction kernel on the device's
/// execution space (host memory too, so CI runs the code a GPU runs), which the host waits for.
/// False (finite) in shape-only mode.
template <class T, class Mem>
bool has_non_finite(const Context& ctx, const T* p, std::int64_t n) {
  if constexpr (is_floating_v<T>) {
    if (n == 0 || shardlib::shape_only()) return false;
    int bad = 0;
    const auto& exec = ctx.exec_for<Mem>();
    {
      auto guard = kernel_guard_for<Mem>(ctx, true);
      Kokkos::parallel_reduce("shardlib::autodiff::non_finite", Kokkos::RangePolicy<exec_space_t<Mem>>(exec, 0, n),
                              NonFiniteKernel<T>{p}, Kokkos::Sum<int>(bad));
    }
    kernels::fence(exec);
    return bad != 0;
  } else {
    return false;
  }
}

/// Adds contribution `c` to `pending`: summed locally into one of the same sharding, else
/// appended. The sum is out of place (a contribution may share its block with a saved tensor).
template <class T, class Mem>
void add_contribution(Context& ctx, std::vector<Contribution>& pending, Contribution c) {
  for (Contribution& p : pending) {
    if (p.sharding != c.sharding) continue;
    const std::int64_t n = p.box.num_elements();
    std::shared_ptr<void> keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(n) * sizeof(T));
    add_blocks<T, Mem>(ctx, static_cast<T*>(keep.get()), static_cast<const T*>(p.data), static_cast<const T*>(c.data), n);
    p.data = keep.get();
    p.keep = std::move(keep);
    return;
  }
  pending.push_back(std::move(c));
}

/// The sum of `pending` (blocks of a tensor of `shape` on `mesh`) laid out as `target`: each
/// resharded to it (collective when it differs), then added. One contribution already in the
/// target layout is returned as it is.
template <class T, class Mem>
SHARDLIB_NOINLINE Block<T> resolve(Context& ctx, const MeshShape& mesh, ArrayRef<std::int64_t> shape,
                                   const std::vector<Contribution>& pending, const Sharding& target) {
  Block<T> sum;
  for (const Contribution& c : pending) {
    Block<T> b = block_as<T, Mem>(ctx, mesh, c.sharding, shape, static_cast<const T*>(c.data), c.box, target);
    if (!b.keep && b.data == c.data) b.keep = c.keep;
    if (!sum.data) {
      sum = std::move(b);
      continue;
    }
    const std::int64_t n = b.box.num_elements();
    std::shared_ptr<void> keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(n) * sizeof(T));
    add_blocks<T, Mem>(ctx, static_cast<T*>(keep.get()), sum.data, b.data, n);
    sum.keep = std::move(keep);
    sum.data = static_cast<const T*>(sum.keep.get());
  }
  return sum;
}

/// `sharding` without its partial clause: the sharding of a gradient.
constexpr Sharding without_partial(Sharding s) noexcept {
  s.partial = AxisList{};
  s.op = ReduceOp::sum;
  return s;
}

/// Sorted union of two axis lists.
constexpr AxisList axis_union(const AxisList& a, const AxisList& b) noexcept {
  AxisList u;
  for (int x = 0; x < static_cast<int>(max_mesh_rank); ++x)
    if (a.contains(x) || b.contains(x)) u.push_back(x);
  return u;
}

/// out[k] for k in [item * Chunk, +Chunk) = the sum over rows j < m of g[j * n + k] (the
/// summed dims lead), in compute_t<T> (a 16-bit gradient's sum in float, rounded once, as
/// SumToShapeKernel's), each row's run read in order.
template <class T, std::int64_t Chunk>
struct SumRowsKernel {
  T* out;
  const T* g;
  std::int64_t n, m;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t k0 = item * Chunk, len = k0 + Chunk < n ? Chunk : n - k0;
    compute_t<T> acc[Chunk] = {};  // Chunk 1 (a GPU thread's one output): a register
    for (std::int64_t j = 0; j < m; ++j) {
      const T* row = g + j * n + k0;
      for (std::int64_t k = 0; k < len; ++k) acc[k] += static_cast<compute_t<T>>(row[k]);
    }
    for (std::int64_t k = 0; k < len; ++k) out[k0 + k] = static_cast<T>(acc[k]);
  }
};
/// The GPU's form of SumRowsKernel, in two launches: first `parts` partial sums of each column over
/// `rows_each` rows (part p: rows [p rows_each, (p + 1) rows_each)), into float `partial` [parts, n],
/// a column per GPU thread (neighbouring threads read neighbouring elements of each row); then each
/// column's partial sums added up. A thread per column over all the rows (SumRowsKernel with one
/// output each) kept 768 threads busy for a bias's [8192, 768] gradient: 2 to 4 ms on an H100,
/// most of a transformer layer's backward (issue 40).
template <class T>
struct SumRowsPartKernel {
  compute_t<T>* partial;
  const T* g;
  std::int64_t n, m, rows_each;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t item) const {
    const std::int64_t p = item / n, k = item % n, j0 = p * rows_each, j1 = j0 + rows_each < m ? j0 + rows_each : m;
    compute_t<T> acc{};
    for (std::int64_t j = j0; j < j1; ++j) acc += static_cast<compute_t<T>>(g[j * n + k]);
    partial[item] = acc;
  }
};
template <class T>
struct SumPartsKernel {
  T* out;
  const compute_t<T>* partial;
  std::int64_t n, parts;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    compute_t<T> acc{};
    for (std::int64_t p = 0; p < parts; ++p) acc += partial[p * n + k];
    out[k] = static_cast<T>(acc);
  }
};

/// out[k] = the sum of g over the summed dims (extents `sum_ext`, strides `sum_stride` in g's
/// block) at the kept dims' position of output element k.
template <class T>
struct SumToShapeKernel {
  T* out;
  const T* g;
  std::int64_t m;
  int nk, ns;
  Kokkos::Array<std::int64_t, max_tensor_rank> kept_ext, kept_stride, sum_ext, sum_stride;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    std::int64_t rest = k, base = 0;
    for (int i = nk - 1; i >= 0; --i) {
      base += (rest % kept_ext[i]) * kept_stride[i];
      rest /= kept_ext[i];
    }
    compute_t<T> acc{};  // a 16-bit gradient's sum in float, rounded once
    for (std::int64_t j = 0; j < m; ++j) {
      std::int64_t rj = j, off = base;
      for (int i = ns - 1; i >= 0; --i) {
        off += (rj % sum_ext[i]) * sum_stride[i];
        rj /= sum_ext[i];
      }
      acc += static_cast<compute_t<T>>(g[off]);
    }
    out[k] = static_cast<T>(acc);
  }
};
/// out[k] = scale * g[o * inner + i] (k = (o * len + any) * inner + i): a reduction's gradient
/// spread back over the reduced dim.
template <class T>
struct ExpandDimKernel {
  T* out;
  const T* g;
  std::int64_t len, inner;
  T scale;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k) const {
    const std::int64_t o = k / (len * inner), i = k % inner;
    out[k] = scale * g[o * inner + i];
  }
};

/// The gradient `g` (a block of a tensor of global shape `g_shape`, non-partial sharding `gs`)
/// summed down to `shape` (numpy's broadcasting, undone): over the leading dims `shape` lacks and
/// over dims where `shape` has extent 1 and `g_shape` not. Dims that were split become partial-sum
/// over their axes (each device adds up its block; nothing moves).
template <class T, class Mem>
SHARDLIB_NOINLINE Contribution sum_to_shape(Context& ctx, const MeshShape& mesh, const Sharding& gs,
                                            ArrayRef<std::int64_t> g_shape, const ShardBox& g_box, const T* g,
                                            const std::shared_ptr<void>& g_keep, ArrayRef<std::int64_t> shape) {
  const int R = gs.rank, r = static_cast<int>(shape.size()), lead = R - r;
  Sharding s;
  s.rank = r;
  std::array<bool, max_tensor_rank> summed{};
  bool any = lead > 0;
  for (int d = 0; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    summed[u] = d < lead || (shape[static_cast<std::size_t>(d - lead)] == 1 && g_shape[u] != 1);
    any = any || summed[u];
    if (summed[u]) s.partial = axis_union(s.partial, gs.dims[u]);
    else s.dims[static_cast<std::size_t>(d - lead)] = gs.dims[u];
  }
  if (!any) return {gs, g_box, g_keep, const_cast<T*>(g)};
  Contribution c;
  c.sharding = s;
  c.box = shard_box(s, mesh, shape, ctx.device());
  const std::int64_t n = c.box.num_elements();
  c.keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T));
  c.data = c.keep.get();
  T* out = static_cast<T*>(c.data);
  // Output element k: its kept dims' local indices give a base offset into g's block; the summed
  // dims are walked with their strides.
  std::array<std::int64_t, max_tensor_rank> g_stride{};
  Kokkos::Array<std::int64_t, max_tensor_rank> kept_ext{}, kept_stride{}, sum_ext{}, sum_stride{};
  int nk = 0, ns = 0;
  std::int64_t m = 1, st = 1;
  for (int d = R - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    g_stride[u] = st;
    st *= g_box.extent[u];
  }
  for (int d = 0; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (summed[u]) {
      sum_ext[static_cast<std::size_t>(ns)] = g_box.extent[u];
      sum_stride[static_cast<std::size_t>(ns++)] = g_stride[u];
      m *= g_box.extent[u];
    } else {
      kept_ext[static_cast<std::size_t>(nk)] = g_box.extent[u];
      kept_stride[static_cast<std::size_t>(nk++)] = g_stride[u];
    }
  }
  bool leading = true;  // summed dims first, kept dims after: out[k] = sum over rows j of g[j * n + k]
  for (int d = 1; d < R; ++d)
    if (summed[static_cast<std::size_t>(d)] && !summed[static_cast<std::size_t>(d - 1)]) leading = false;
  if (leading) {
    const auto gb = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(m) * sizeof(T);  // g read once
    if constexpr (host_memory_v<Mem>) {  // a chunk of 64 outputs per item, each row's run read in order
      constexpr std::int64_t chunk = 64;
      for_range<Mem>("shardlib::autodiff::sum_rows", ctx, (n + chunk - 1) / chunk, SumRowsKernel<T, chunk>{out, g, n, m},
                     gb + static_cast<std::uint64_t>(n) * sizeof(T));
    } else {  // enough work items to fill the GPU: partial sums over row ranges, then their sums
      // parts ~ sqrt(m): the two launches' loops about as long (a thread's loop is a chain of
      // loads; 341 parts of a [8192, 768] gradient left 768 threads 43 us in the second).
      const auto root = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(m))));
      const std::int64_t parts =
          std::max<std::int64_t>(1, std::min({m, root, (std::int64_t{1} << 18) / std::max<std::int64_t>(n, 1)}));
      const std::int64_t rows_each = (m + parts - 1) / parts;
      auto partial = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(parts * n, 1)) *
                                                    sizeof(compute_t<T>));
      auto* p = static_cast<compute_t<T>*>(partial.get());
      const auto pb = static_cast<std::uint64_t>(parts) * static_cast<std::uint64_t>(n) * sizeof(compute_t<T>);
      for_range<Mem>("shardlib::autodiff::sum_rows(parts)", ctx, parts * n, SumRowsPartKernel<T>{p, g, n, m, rows_each},
                     gb + pb);
      for_range<Mem>("shardlib::autodiff::sum_rows(sum)", ctx, n, SumPartsKernel<T>{out, p, n, parts},
                     pb + static_cast<std::uint64_t>(n) * sizeof(T));
    }
    return c;
  }
  for_range<Mem>("shardlib::autodiff::sum_to_shape", ctx, n,
                 SumToShapeKernel<T>{out, g, m, nk, ns, kept_ext, kept_stride, sum_ext, sum_stride},
                 static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(m + 1) * sizeof(T));
  return c;
}

/// The gradient `g` of a reduction along dim `dim` (a block of non-partial sharding `gs`, the
/// dim dropped unless `keepdim`), spread back over that dim of a tensor of `shape`, times `scale`
/// (1 for sum, 1/n for mean). The result is split along `dim` over `dim_axes` (the reduced
/// tensor's axes there): each device writes only its part of the dim, from its rows of g.
template <class T, class Mem>
SHARDLIB_NOINLINE Contribution expand_dim(Context& ctx, const MeshShape& mesh, const Sharding& gs, const T* g, int dim,
                                          bool keepdim, const AxisList& dim_axes, ArrayRef<std::int64_t> shape, T scale) {
  const int r = static_cast<int>(shape.size());
  Contribution c;
  c.sharding.rank = r;
  for (int d = 0, k = 0; d < r; ++d) {
    if (d == dim) {
      if (keepdim) ++k;
      c.sharding.dims[static_cast<std::size_t>(d)] = dim_axes;
      continue;
    }
    c.sharding.dims[static_cast<std::size_t>(d)] = gs.dims[static_cast<std::size_t>(k++)];
  }
  c.box = shard_box(c.sharding, mesh, shape, ctx.device());
  const std::int64_t n = c.box.num_elements();
  c.keep = block_cache<Mem>(ctx).allocate(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T));
  c.data = c.keep.get();
  T* out = static_cast<T*>(c.data);
  std::int64_t inner = 1;
  for (int d = dim + 1; d < r; ++d) inner *= c.box.extent[static_cast<std::size_t>(d)];
  const std::int64_t len = c.box.extent[static_cast<std::size_t>(dim)];
  for_range<Mem>("shardlib::autodiff::expand_dim", ctx, n, ExpandDimKernel<T>{out, g, len, inner, scale},
                 static_cast<std::uint64_t>(n + (len > 0 ? n / len : 0)) * sizeof(T));
  return c;
}

/// Resolves the pending gradients of `leaves` (every device passes the same leaves in the same
/// order): those that resolve by an all_reduce over the same axes (data parallelism) share one per
/// bucket of at most `bucket_bytes`; the others (a reduce_scatter for a split parameter) take one
/// reshard each. Strong guarantee: nothing is added before everything resolved, so when a
/// collective throws no gradient changed (the contributions stay pending).
SHARDLIB_NOINLINE inline void resolve_leaves(std::vector<LeafGrad*> leaves, std::size_t bucket_bytes) {
  // Leaves that resolve by an all_reduce over the same axes go next to each other (in their
  // order otherwise), so that a model whose norms are pending over ("data", "model") and whose
  // matrices over "data" alone takes one bucket of each, not one per alternation.
  {
    auto key = [](const LeafGrad* l) {
      AxisList a;
      if (!l->resolves_by_all_reduce(a)) return std::pair<int, AxisList>{1, AxisList{}};
      return std::pair<int, AxisList>{0, a};
    };
    std::vector<std::pair<int, AxisList>> keys;
    for (const LeafGrad* l : leaves) keys.push_back(key(l));
    std::vector<std::size_t> idx(leaves.size());
    for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = k;
    auto less = [](const AxisList& a, const AxisList& b) {
      return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
    };
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) {
      if (keys[x].first != keys[y].first) return keys[x].first < keys[y].first;
      return less(keys[x].second, keys[y].second);
    });
    std::vector<LeafGrad*> sorted;
    for (std::size_t k : idx) sorted.push_back(leaves[k]);
    leaves = std::move(sorted);
  }
  std::vector<std::shared_ptr<void>> resolved(leaves.size());
  std::size_t i = 0;
  while (i < leaves.size()) {
    AxisList axes;
    LeafGrad& first = *leaves[i];
    if (bucket_bytes == 0 || !first.resolves_by_all_reduce(axes) || axes.empty() || !first.bucketable()) {
      resolved[i] = first.resolve_alone();
      ++i;
      continue;
    }
    std::size_t j = i, bytes = 0;
    while (j < leaves.size()) {
      AxisList a;
      LeafGrad& l = *leaves[j];
      if (l.dtype() != first.dtype() || !(l.mesh_shape() == first.mesh_shape()) || !l.resolves_by_all_reduce(a) ||
          !(a == axes) || l.in_host_memory() != first.in_host_memory() || !l.bucketable())
        break;
      const std::size_t b = static_cast<std::size_t>(l.only_pending().box.num_elements()) * l.elem_size();
      if (j > i && bytes + b > bucket_bytes) break;
      bytes += b;
      ++j;
    }
    std::shared_ptr<void> buffer = first.allocate_bucket(std::max<std::size_t>(bytes, 1));
    char* buf = static_cast<char*>(buffer.get());
    std::size_t off = 0;
    for (std::size_t k = i; k < j; ++k) {
      leaves[k]->copy_pending_to(buf + off);
      off += static_cast<std::size_t>(leaves[k]->only_pending().box.num_elements()) * leaves[k]->elem_size();
    }
    if (first.mesh_shape().group_size(axes) > 1) {  // (a group of one device adds nothing)
      // The group is made on every device, one whose bucket is empty too: making a group is a
      // collective of the whole world (Context::group), and a bucket's bytes differ between groups
      // (a split parameter's empty blocks: 4 experts over 3 devices are 2, 2 and 0). Within the
      // group the blocks, so the bytes, are the same: an empty bucket is empty on all of it.
      coll::Communicator& group = first.bucket_group(axes);
      if (bytes) group.all_reduce(buf, buf, bytes / first.elem_size(), first.dtype(), coll::Op::sum);
    }
    off = 0;
    for (std::size_t k = i; k < j; ++k) {  // each gradient views its part of the bucket
      const std::size_t b =
          static_cast<std::size_t>(leaves[k]->only_pending().box.num_elements()) * leaves[k]->elem_size();
      resolved[k] = leaves[k]->from_block(buffer, buf + off);
      off += b;
    }
    i = j;
  }
  for (std::size_t k = 0; k < leaves.size(); ++k) leaves[k]->commit(resolved[k]);
}

/// Throws, on every device together, when a device's contribution holds a NaN or infinity.
template <class T, class Mem>
void check_finite(Context& ctx, const Contribution& c, const Node& node, int input, const Node& target) {
  int bad = has_non_finite<T, Mem>(ctx, static_cast<const T*>(c.data), c.box.num_elements()) ? 1 : 0;
  ctx.world().all_reduce(&bad, &bad, 1, coll::dtype_of<int>(), coll::Op::max);
  if (bad)
    throw std::runtime_error(std::string("shardlib: backward: a NaN or infinity in the gradient that op '") +
                             node.op() + "' (output " + node.describe() + ") passes to its input " +
                             std::to_string(input) + " (" + target.describe() + ")");
}

}  // namespace detail
}  // namespace autodiff
}  // namespace shardlib
