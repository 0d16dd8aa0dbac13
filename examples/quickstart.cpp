// SPDX-License-Identifier: Apache-2.0
// shardlib quickstart: a transformer MLP block (column-parallel, gelu, row-parallel) on a
// data x model mesh, with specs as types and collectives inserted by the library.
//
// Only the inputs are annotated: x splits its batch over "data", w1 its columns and w2 its rows
// over "model" (Megatron-LM's tensor parallelism). Every intermediate's spec follows from the op
// rules at compile time: x·w1 is split over "model" along the hidden dim, gelu keeps that, and
// the row-parallel product leaves a pending sum over "model" - which costs exactly one collective
// when it is resolved: an all_reduce to a replicated result, or a reduce_scatter when the result
// is wanted split along the sequence (sequence parallelism). The program prints the specs, the
// collectives each step emitted (from the counters) and the difference from a one-device result.
//
//   build/examples/quickstart [--devices N] [--model M]      (N devices as an (N/M) x M mesh; --help)
//   mpirun -np 8 build/examples/quickstart
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace sl = shardlib;

using Mesh2D = sl::Mesh<"data", "model">;  // axis names are types, sizes come at run time
template <class Spec>
using Tensor = sl::DistributedTensor<float, Mesh2D, Spec>;

using XSpec = sl::Spec<"data", sl::none, sl::none>;  // [batch, seq, d_model]: batch over "data"
using W1Spec = sl::Spec<sl::none, "model">;         // [d_model, d_ff]: column-parallel
using W2Spec = sl::Spec<"model", sl::none>;         // [d_ff, d_model]: row-parallel

namespace {
constexpr const char* usage = R"(usage: quickstart [--devices N] [--model M]
  --devices N  in-process devices (8); under mpirun each rank is a device: mpirun -np 8 quickstart
  --model M    devices on the "model" axis (2), a divisor of the device count: an (N/M) x M mesh
Also the runtime's --backend threads|mpi|nccl and --threads-per-device N, and Kokkos's
--kokkos-NAME=VALUE. Bad input: a one-line message and exit status 2.
)";

// What the collectives of one step cost on this device, in one line.
std::string emitted(const sl::coll::CommRecorder& r) {
  std::string s = r.to_string();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  for (auto& c : s)
    if (c == '\n') c = ';';
  return s.empty() ? "no collective" : s;
}

// The same block on one device, in plain loops (the oracle).
std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w1, const std::vector<float>& w2,
                             int rows, int d, int f) {
  std::vector<float> h(static_cast<std::size_t>(rows) * f), y(static_cast<std::size_t>(rows) * d, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < f; ++j) {
      double s = 0;
      for (int k = 0; k < d; ++k) s += double(x[r * d + k]) * w1[k * f + j];
      h[r * f + j] = static_cast<float>(0.5 * s * (1 + std::erf(s / std::sqrt(2.0))));
    }
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int k = 0; k < f; ++k) s += double(h[r * f + k]) * w2[k * d + j];
      y[r * d + j] = static_cast<float>(s);
    }
  return y;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}
}  // namespace

int main(int argc, char** argv) {
  return example::main(argc, argv, "quickstart", usage, [](example::Args& args) {
    const int model = static_cast<int>(args.integer("--model", 2, 1, 65536));
    auto rt = args.runtime(/*default_devices=*/8);
    if (rt.num_devices() % model != 0)
      args.fail("--model " + std::to_string(model) + " does not divide the " + std::to_string(rt.num_devices()) +
                " devices (an (N/M) x M mesh)");
    if (rt.first_local_device() == 0)
      std::printf("shardlib %s; Kokkos execution space: %s\n%s\n", SHARDLIB_VERSION_STRING,
                  sl::KokkosScope::execution_space_name().c_str(), rt.describe().c_str());
    rt.spmd([&](sl::Context& ctx) {
      const int n = ctx.num_devices();
      const Mesh2D mesh(ctx, {n / model, model});
      const bool printer = ctx.device() == 0;
      const std::int64_t batch = 8, seq = 16, d_model = 64, d_ff = 256;

      // Inputs: the same global tensors whatever the mesh (generated from the global index).
      auto x = Tensor<XSpec>::random(mesh, {batch, seq, d_model}, 1, -1.0f, 1.0f);
      auto w1 = Tensor<W1Spec>::random(mesh, {d_model, d_ff}, 2, -0.2f, 0.2f);
      auto w2 = Tensor<W2Spec>::random(mesh, {d_ff, d_model}, 3, -0.1f, 0.1f);

      // The block. Each step's collectives are counted on this device.
      std::uint64_t block_calls = 0;
      std::string c1, c2, c3, c4, c5;
      auto counted = [&](std::string& text, auto&& step) {
        sl::coll::CommRecorder r;
        auto result = step();
        text = emitted(r);
        block_calls += r.total_calls();
        return result;
      };
      auto h = counted(c1, [&] { return sl::einsum<"bsd,df->bsf">(x, w1); });  // column-parallel
      auto a = counted(c2, [&] { return sl::gelu(h); });
      auto y = counted(c3, [&] { return sl::einsum<"bsf,fd->bsd">(a, w2); });  // row-parallel: pending sum
      auto out = counted(c4, [&] { return Tensor<XSpec>(y); });  // resolve it: one all_reduce
      const auto in_block = block_calls;
      // Or resolve it split along the sequence (sequence parallelism): one reduce_scatter.
      auto seq_out = counted(c5, [&] { return Tensor<sl::Spec<"data", "model", sl::none>>(y); });
      block_calls = in_block;

      // The one-device oracle (every device takes part in the gathers).
      const auto xs = x.to_host(), w1s = w1.to_host(), w2s = w2.to_host();
      const auto got = out.to_host(), got_seq = seq_out.to_host();
      if (printer) {
        std::printf("mesh %s, %d devices; x [%lld, %lld, %lld], d_ff %lld\n", mesh.to_string().c_str(), n,
                    static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(d_model),
                    static_cast<long long>(d_ff));
        std::printf("  x   %-48s (input)\n", decltype(x)::spec_string().c_str());
        std::printf("  w1  %-48s (input)\n", decltype(w1)::spec_string().c_str());
        std::printf("  w2  %-48s (input)\n", decltype(w2)::spec_string().c_str());
        std::printf("  h   %-48s x·w1: %s\n", decltype(h)::spec_string().c_str(), c1.c_str());
        std::printf("  a   %-48s gelu(h): %s\n", decltype(a)::spec_string().c_str(), c2.c_str());
        std::printf("  y   %-48s a·w2: %s\n", decltype(y)::spec_string().c_str(), c3.c_str());
        std::printf("  out %-48s y resolved: %s\n", decltype(out)::spec_string().c_str(), c4.c_str());
        std::printf("  seq %-48s y resolved along the sequence: %s\n", decltype(seq_out)::spec_string().c_str(), c5.c_str());
        const auto want = reference(xs, w1s, w2s, static_cast<int>(batch * seq), static_cast<int>(d_model),
                                    static_cast<int>(d_ff));
        std::printf("collectives in the block on device 0: %llu\n", static_cast<unsigned long long>(block_calls));
        std::printf("max |out - one-device result| = %.3g, sequence-split: %.3g\n", max_diff(got, want),
                    max_diff(got_seq, want));
        if (max_diff(got, want) > 1e-4 || max_diff(got_seq, want) > 1e-4)
          throw std::runtime_error("the result differs from the one-device result");
        if (model > 1 && block_calls != 1)
          throw std::runtime_error("the block emitted " + std::to_string(block_calls) +
                                   " collectives; the column/row-parallel pair needs exactly one");
      }
    });
    return 0;
  });
}
