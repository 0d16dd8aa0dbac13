// SPDX-License-Identifier: Apache-2.0
/// @file
/// cuDNN's fused flash attention (scaled dot-product attention, forward and backward) on raw
/// device pointers: the GPU kernel of `sl::attention` (attention/ops.hpp) for 16-bit operands.
///
/// Built when SHARDLIB_HAVE_CUDNN is defined (the cuDNN frontend's headers, PyPI's
/// `nvidia-cudnn-frontend`, on the include path; scripts/gpu-check.sh fetches them). cuDNN itself
/// is loaded at run time (`dlopen("libcudnn.so.9")`, or SHARDLIB_CUDNN_LIBRARY's path; the
/// frontend's NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): a program built with this runs where cuDNN
/// is missing, and `available()` says why the fused kernel cannot run there, so that the caller
/// falls back to the unfused ops. A graph that cuDNN does not support for a shape (head dims
/// that are no multiple of 8, or over 256; an old cuDNN) is refused the same way, never a crash.
///
/// Each device keeps one `Sdpa`: a cuDNN handle and the graphs built for each shape, layout and
/// option set (building one takes milliseconds: heuristics and plans; executing it, none of
/// that). Tensors are [b, h, s, d] as cuDNN names them, at any strides: shardlib's [B, S, H, K]
/// blocks are passed without a copy.
///
/// In shape-only mode (detail/shape_only.hpp) `forward` and `backward` build their graph and
/// allocate its workspace (the memory account counts it) but queue nothing.
///
/// Each run is counted as a memory-bound kernel (kernels::count_kernel: the bytes of its operands,
/// each read or written once) and its matrix products' FLOPs (kernels::count_fused_products: the
/// forward's q k^T and p v, the backward's five, over the (query, key) pairs the mask keeps), in
/// shape-only mode too.
///
/// Knows pointers, strides and streams only: no tensors, no communicator.
#pragma once

#if defined(SHARDLIB_HAVE_CUDNN)

#if !defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#endif
#if !defined(CUDNN_FRONTEND_SKIP_JSON_LIB)
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#endif
#include <cstring>  // before the frontend, whose shim uses std::strlen without including it

#if defined(__GNUC__)
#pragma GCC diagnostic push  // the frontend's own unused helpers and casts
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wsign-compare"
#endif
#include <cudnn_frontend.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/kernels/exec.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace cudnn_frontend {
// The handle of the dlopened cuDNN, which the frontend's dynamic loading reads. Weak: defined in
// every translation unit that includes this header, one copy in the program (a program of its
// own that defines it wins).
__attribute__((weak)) void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace shardlib::kernels::cudnn {

/// The element type of the operands (the output too); statistics are float32.
enum class Elem : std::uint8_t { f16, bf16 };

/// One attention problem: extents, the strides of each operand in (b, h, s, d) order, options.
struct SdpaShape {
  std::int64_t b = 0, h = 0, sq = 0, sk = 0, dqk = 0, dv = 0;
  std::array<std::int64_t, 4> q{}, k{}, v{}, o{};  // strides, elements
  Elem elem = Elem::bf16;
  bool causal = false;  ///< query i attends keys j <= i (the diagonal from the top left)
  bool bias = false;    ///< an additive [sq, sk] bias (a mask), broadcast over b and h
  bool stats = false;   ///< forward: also the softmax statistics the backward needs
  float scale = 1;
  friend bool operator<(const SdpaShape& a, const SdpaShape& b) {
    auto t = [](const SdpaShape& s) {
      return std::tie(s.b, s.h, s.sq, s.sk, s.dqk, s.dv, s.q, s.k, s.v, s.o, s.elem, s.causal, s.bias, s.stats, s.scale);
    };
    return t(a) < t(b);
  }
};

/// Device memory for a workspace, kept alive until the returned owner goes (the caller's block
/// cache: the work queued on the stream is ordered before any later use of the block).
using WorkspaceAllocator = std::function<std::shared_ptr<void>(std::size_t bytes)>;

namespace detail {
/// Loads cuDNN once per process; "" when it loaded, else why not.
inline const std::string& load_error() {
  static const std::string error = []() -> std::string {
    const char* custom = std::getenv("SHARDLIB_CUDNN_LIBRARY");
    const char* name = custom && *custom ? custom : "libcudnn.so.9";
    void* h = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = ::dlerror();
      return std::string("cannot load ") + name + " (" + (e ? e : "unknown error") +
             "; put cuDNN 9's library folder on LD_LIBRARY_PATH, or its path in SHARDLIB_CUDNN_LIBRARY)";
    }
    using GetVersion = std::size_t (*)();
    auto version = reinterpret_cast<GetVersion>(::dlsym(h, "cudnnGetVersion"));
    if (!version) return std::string(name) + " has no cudnnGetVersion: not cuDNN";
    if (version() < 90000)
      return std::string(name) + " is cuDNN " + std::to_string(version()) + "; fused attention needs cuDNN 9";
    cudnn_frontend::cudnn_dlhandle = h;
    return {};
  }();
  return error;
}
inline std::string text(cudnn_frontend::error_t e) { return e.get_message(); }
}  // namespace detail

/// Whether cuDNN's fused attention can run in this process: "" when it can, else the reason.
inline std::string available() { return detail::load_error(); }

/// The version of the cuDNN loaded (0 when none).
inline std::size_t version() {
  if (!available().empty()) return 0;
  return cudnn_frontend::detail::get_backend_version();
}

/// One device's cuDNN handle and attention graphs (see the file comment). Not thread-safe: one
/// per device thread (the Context's).
class Sdpa {
 public:
  Sdpa() = default;
  Sdpa(const Sdpa&) = delete;
  Sdpa& operator=(const Sdpa&) = delete;
  ~Sdpa() {
    if (handle_) (void)cudnn_frontend::detail::destroy_handle(handle_);
  }

  /// o = softmax(scale q k^T [+ bias] [causal]) v, and (with shape.stats) the statistics
  /// [b, h, sq, 1] (float32, contiguous) for backward(). "" when it ran (queued on `stream`;
  /// shape-only mode: when it would have), else why not (nothing was queued): the caller computes
  /// it another way.
  std::string forward(cudaStream_t stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                      const void* bias, void* o, float* stats, const WorkspaceAllocator& workspace) {
    Built* g = graph(s, false);
    if (!g->why.empty()) return g->why;
    std::unordered_map<std::int64_t, void*> pack = {{uid_q, const_cast<void*>(q)},
                                                    {uid_k, const_cast<void*>(k)},
                                                    {uid_v, const_cast<void*>(v)},
                                                    {uid_o, o}};
    if (s.bias) pack[uid_bias] = const_cast<void*>(bias);
    if (s.stats) pack[uid_stats] = stats;
    return run(stream, *g, pack, workspace, run_bytes(s, 1, 1, s.stats ? 1 : 0), run_flops(s, false));
  }

  /// dq, dk, dv of forward()'s output from do_ (the output's gradient, laid out as o), the
  /// forward's o and statistics. Returns as forward() does.
  std::string backward(cudaStream_t stream, const SdpaShape& s, const void* q, const void* k, const void* v,
                       const void* bias, const void* o, const void* do_, const float* stats, void* dq, void* dk,
                       void* dv, const WorkspaceAllocator& workspace) {
    Built* g = graph(s, true);
    if (!g->why.empty()) return g->why;
    std::unordered_map<std::int64_t, void*> pack = {
        {uid_q, const_cast<void*>(q)},   {uid_k, const_cast<void*>(k)}, {uid_v, const_cast<void*>(v)},
        {uid_o, const_cast<void*>(o)},   {uid_do, const_cast<void*>(do_)},
        {uid_stats, const_cast<float*>(stats)}, {uid_dq, dq}, {uid_dk, dk}, {uid_dv, dv}};
    if (s.bias) pack[uid_bias] = const_cast<void*>(bias);
    // q, k, v read, dq, dk, dv written; o, do_ read
    return run(stream, *g, pack, workspace, run_bytes(s, 2, 2, 1), run_flops(s, true));
  }

  /// Graphs built so far (forward and backward), for tests and benchmarks.
  std::size_t graphs_built() const noexcept { return graphs_.size(); }

 private:
  static constexpr std::int64_t uid_q = 1, uid_k = 2, uid_v = 3, uid_o = 4, uid_stats = 5, uid_bias = 6, uid_do = 7,
                                uid_dq = 8, uid_dk = 9, uid_dv = 10;
  struct Built {
    std::shared_ptr<cudnn_frontend::graph::Graph> graph;
    std::int64_t workspace = 0;
    std::string why;  // not "" when cuDNN cannot run this graph
  };

  /// The bytes of a run on `s` that reads or writes q, k and v `qkv` times each and o `o` times
  /// (16-bit elements), the bias (when given) once and the statistics `stats` times (float32).
  static std::uint64_t run_bytes(const SdpaShape& s, std::uint64_t qkv, std::uint64_t o, std::uint64_t stats) {
    auto n = [](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
      return static_cast<std::uint64_t>(a * b * c * d);
    };
    const std::uint64_t q = n(s.b, s.h, s.sq, s.dqk), k = n(s.b, s.h, s.sk, s.dqk), v = n(s.b, s.h, s.sk, s.dv);
    const std::uint64_t elements = qkv * (q + k + v) + o * n(s.b, s.h, s.sq, s.dv) + (s.bias ? n(1, 1, s.sq, s.sk) : 0);
    return elements * 2 + stats * n(s.b, s.h, s.sq, 1) * sizeof(float);  // (f16 and bf16: 2 bytes an element)
  }

  /// The FLOPs of a run's matrix products: 2 d per (query, key) pair the mask keeps (causal: key j
  /// <= query i), d the products' inner or outer extents: the forward's q k^T (dqk) and p v (dv);
  /// the backward's q k^T again, dq = ds k and dk = ds^T q (dqk each), dp = do v^T and dv = p^T do.
  static std::uint64_t run_flops(const SdpaShape& s, bool backward) {
    std::uint64_t pairs = static_cast<std::uint64_t>(s.sq) * static_cast<std::uint64_t>(s.sk);
    if (s.causal) {  // sum over queries i of min(i + 1, sk)
      const std::uint64_t sq = static_cast<std::uint64_t>(s.sq), sk = static_cast<std::uint64_t>(s.sk);
      const std::uint64_t tri = std::min(sq, sk);  // queries i < sk keep i + 1 keys, the rest all sk
      pairs = tri * (tri + 1) / 2 + (sq - tri) * sk;
    }
    const std::uint64_t d = backward ? 3 * static_cast<std::uint64_t>(s.dqk) + 2 * static_cast<std::uint64_t>(s.dv)
                                     : static_cast<std::uint64_t>(s.dqk + s.dv);
    return 2 * static_cast<std::uint64_t>(s.b) * static_cast<std::uint64_t>(s.h) * pairs * d;
  }

  /// Runs graph `g`, counted as a kernel of `bytes` (kernels::count_kernel) and `flops` of fused
  /// products (kernels::count_fused_products) once it ran, or would have (shape-only mode): a run
  /// that fails is not counted (its caller computes it another way).
  std::string run(cudaStream_t stream, Built& g, std::unordered_map<std::int64_t, void*>& pack,
                  const WorkspaceAllocator& workspace, std::uint64_t bytes, std::uint64_t flops) {
    try {
      if (const auto st = cudnn_frontend::detail::set_stream(handle_, stream); st != CUDNN_STATUS_SUCCESS)
        return std::string("cudnnSetStream: ") + cudnn_frontend::detail::get_error_string(st);
      std::shared_ptr<void> ws = g.workspace > 0 ? workspace(static_cast<std::size_t>(g.workspace)) : nullptr;
      if (!shardlib::shape_only()) {  // (shape-only: the workspace counted, nothing queued)
        const auto e = g.graph->execute(handle_, pack, ws.get());
        if (!e.is_good()) return "cuDNN could not run its attention graph: " + detail::text(e);
      }
      kernels::count_kernel(bytes);
      kernels::count_fused_products(flops);
      return {};
    } catch (const std::exception& x) {
      return std::string("cuDNN's attention failed: ") + x.what();
    }
  }

  static std::vector<std::int64_t> dims(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
    return {b, h, s, d};
  }
  static std::vector<std::int64_t> strides(const std::array<std::int64_t, 4>& a) { return {a[0], a[1], a[2], a[3]}; }

  Built* graph(const SdpaShape& s, bool backward) {
    auto key = std::make_pair(s, backward);
    if (auto it = graphs_.find(key); it != graphs_.end()) return &it->second;
    Built& b = graphs_[key];
    b.why = build(s, backward, b);
    if (!b.why.empty()) b.graph.reset();
    return &b;
  }

  std::string build(const SdpaShape& s, bool backward, Built& out) {
    namespace fe = cudnn_frontend;
    if (std::string why = available(); !why.empty()) return why;
    try {
      if (!handle_) {
        if (const auto st = fe::detail::create_handle(&handle_); st != CUDNN_STATUS_SUCCESS) {
          handle_ = nullptr;
          return std::string("cudnnCreate: ") + fe::detail::get_error_string(st);
        }
      }
      auto g = std::make_shared<fe::graph::Graph>();
      g->set_io_data_type(s.elem == Elem::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
          .set_intermediate_data_type(fe::DataType_t::FLOAT)
          .set_compute_data_type(fe::DataType_t::FLOAT);
      auto tensor = [&](const char* name, std::int64_t uid, std::vector<std::int64_t> d, std::vector<std::int64_t> st) {
        return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(st));
      };
      auto Q = tensor("Q", uid_q, dims(s.b, s.h, s.sq, s.dqk), strides(s.q));
      auto K = tensor("K", uid_k, dims(s.b, s.h, s.sk, s.dqk), strides(s.k));
      auto V = tensor("V", uid_v, dims(s.b, s.h, s.sk, s.dv), strides(s.v));
      std::shared_ptr<fe::graph::Tensor_attributes> bias;
      if (s.bias) bias = tensor("bias", uid_bias, {1, 1, s.sq, s.sk}, {s.sq * s.sk, s.sq * s.sk, s.sk, 1});
      const std::vector<std::int64_t> stats_dims{s.b, s.h, s.sq, 1}, stats_strides{s.h * s.sq, s.sq, 1, 1};
      if (!backward) {
        auto opts = fe::graph::SDPA_attributes().set_name("shardlib_attention").set_generate_stats(s.stats).set_attn_scale(s.scale);
        if (s.causal) opts.set_causal_mask(true);
        if (bias) opts.set_bias(bias);
        auto [O, Stats] = g->sdpa(Q, K, V, opts);
        O->set_output(true).set_uid(uid_o).set_dim(dims(s.b, s.h, s.sq, s.dv)).set_stride(strides(s.o));
        if (s.stats) Stats->set_output(true).set_uid(uid_stats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims).set_stride(stats_strides);
      } else {
        auto O = tensor("O", uid_o, dims(s.b, s.h, s.sq, s.dv), strides(s.o));
        auto dO = tensor("dO", uid_do, dims(s.b, s.h, s.sq, s.dv), strides(s.o));
        auto Stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("Stats")
                                   .set_uid(uid_stats)
                                   .set_dim(stats_dims)
                                   .set_stride(stats_strides)
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto opts = fe::graph::SDPA_backward_attributes().set_name("shardlib_attention_backward").set_attn_scale(s.scale);
        if (s.causal) opts.set_causal_mask(true);
        if (bias) opts.set_bias(bias);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
        dQ->set_output(true).set_uid(uid_dq).set_dim(dims(s.b, s.h, s.sq, s.dqk)).set_stride(strides(s.q));
        dK->set_output(true).set_uid(uid_dk).set_dim(dims(s.b, s.h, s.sk, s.dqk)).set_stride(strides(s.k));
        dV->set_output(true).set_uid(uid_dv).set_dim(dims(s.b, s.h, s.sk, s.dv)).set_stride(strides(s.v));
      }
      if (auto e = g->validate(); !e.is_good()) return "cuDNN refuses the attention graph: " + detail::text(e);
      if (auto e = g->build_operation_graph(handle_); !e.is_good()) return "cuDNN cannot build the attention graph: " + detail::text(e);
      if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); !e.is_good())
        return "cuDNN has no plan for the attention graph: " + detail::text(e);
      if (auto e = g->check_support(handle_); !e.is_good()) return "cuDNN does not support this attention: " + detail::text(e);
      if (auto e = g->build_plans(handle_); !e.is_good()) return "cuDNN cannot build a plan for the attention: " + detail::text(e);
      if (auto e = g->get_workspace_size(out.workspace); !e.is_good()) return "cuDNN's workspace size: " + detail::text(e);
      out.graph = std::move(g);
      return {};
    } catch (const std::exception& x) {
      return std::string("cuDNN's attention graph failed: ") + x.what();
    }
  }

  cudnnHandle_t handle_ = nullptr;
  std::map<std::pair<SdpaShape, bool>, Built> graphs_;
};

}  // namespace shardlib::kernels::cudnn

#endif  // SHARDLIB_HAVE_CUDNN
