// SPDX-License-Identifier: Apache-2.0
// Save a model's tensors on one mesh, load them onto another mesh with other specs.
//
//   ./checkpoint [--devices N] [--dir DIR]       (threads: 8 devices by default; --help)
//   mpirun -np 4 ./checkpoint --dir DIR
//
// Writes DIR/model.h5 (an ordinary HDF5 file: `h5ls -r DIR/model.h5`, or h5py), lists it, then
// loads it back as a tensor-parallel layout on a {data, model} mesh and as a fully sharded
// (FSDP-like) layout on a one-axis mesh, and checks every tensor against the saved values.
#include <shardlib/io.hpp>
#include <shardlib/shardlib.hpp>

#include "common.hpp"

#include <cstdio>
#include <stdexcept>
#include <string>

namespace sl = shardlib;
using sl::none;

using Mesh2D = sl::Mesh<"data", "model">;
using Mesh1D = sl::Mesh<"fsdp">;

constexpr const char* usage = R"(usage: checkpoint [--devices N] [--dir DIR]
  --devices N  in-process devices (8); under mpirun each rank is a device: mpirun -np 4 checkpoint
  --dir DIR    where model.h5 is written (.), an existing directory
Also the runtime's --backend threads|mpi|nccl and --threads-per-device N, and Kokkos's
--kokkos-NAME=VALUE. Bad input: a one-line message and exit status 2; a failed save or load, or a
loaded tensor that differs from the saved one: exit status 1.
)";

int main(int argc, char** argv) {
  return example::main(argc, argv, "checkpoint", usage, [](example::Args& args) {
    const std::string path = args.text("--dir", ".") + "/model.h5";
    auto rt = args.runtime(/*default_devices=*/8);
    rt.spmd([&](sl::Context& ctx) {
      const int n = ctx.num_devices();
      const bool root = ctx.device() == 0;
      // Megatron-style layout: W1 split by columns, W2 by rows over "model"; embeddings by rows.
      Mesh2D tp(ctx, {n % 2 == 0 ? n / 2 : n, n % 2 == 0 ? 2 : 1});
      auto w1 = sl::DistributedTensor<float, Mesh2D, sl::Spec<none, "model">>::iota(tp, {64, 256});
      auto w2 = sl::DistributedTensor<float, Mesh2D, sl::Spec<"model", none>>::iota(tp, {256, 64});
      auto emb = sl::DistributedTensor<double, Mesh2D, sl::Spec<"data", none>>::iota(tp, {1000, 32});
      auto step = sl::DistributedTensor<std::int64_t, Mesh2D, sl::Spec<none>>::full(tp, {1}, 100);
      sl::io::save(path, {{"mlp/w1", w1}, {"mlp/w2", w2}, {"embedding", emb}, {"step", step}});
      if (root) {
        std::printf("saved %s on mesh %s:\n", path.c_str(), tp.to_string().c_str());
        for (const auto& t : sl::io::list(path)) {
          std::string shape;
          for (auto e : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(e);
          std::printf("  %-10s %-4s %-9s %s\n", t.name.c_str(), std::string(sl::coll::name(t.dtype)).c_str(),
                      shape.c_str(), t.spec.c_str());
        }
      }

      // 1. Onto the same devices as a {data: 1, model: n} mesh, other specs.
      Mesh2D wide(ctx, {1, n});
      auto w1_rows = sl::io::load<sl::DistributedTensor<float, Mesh2D, sl::Spec<"model", none>>>(wide, path, "mlp/w1");
      // 2. Into existing tensors of a one-axis mesh, everything split over "fsdp" (FSDP's layout).
      Mesh1D flat(ctx, {n});
      auto w1_f = sl::DistributedTensor<float, Mesh1D, sl::Spec<"fsdp", none>>::zeros(flat, {64, 256});
      auto w2_f = sl::DistributedTensor<float, Mesh1D, sl::Spec<"fsdp", none>>::zeros(flat, {256, 64});
      auto emb_f = sl::DistributedTensor<double, Mesh1D, sl::Spec<none, "fsdp">>::zeros(flat, {1000, 32});
      auto step_f = sl::DistributedTensor<std::int64_t, Mesh1D, sl::Spec<none>>::zeros(flat, {1});
      sl::io::load(path, {{"mlp/w1", w1_f}, {"mlp/w2", w2_f}, {"embedding", emb_f}, {"step", step_f}});

      const bool same = w1_rows.to_host() == w1.to_host() && w1_f.to_host() == w1.to_host() &&
                        w2_f.to_host() == w2.to_host() && emb_f.to_host() == emb.to_host() &&
                        step_f.to_host() == step.to_host();
      const auto& s = sl::io::stats(ctx);
      std::uint64_t mine[2] = {s.bytes_written, s.bytes_read}, all[2] = {};
      ctx.world().all_reduce(mine, all, 2, sl::coll::DType::u64, sl::coll::Op::sum);
      if (root)
        std::printf("loaded onto %s and %s: %s; %llu bytes written, %llu read (each byte once per load)\n",
                    wide.to_string().c_str(), flat.to_string().c_str(), same ? "every tensor equal" : "MISMATCH",
                    static_cast<unsigned long long>(all[0]), static_cast<unsigned long long>(all[1]));
      if (!same) throw std::runtime_error("a loaded tensor differs from the saved one");
    });
    return 0;
  });
}
