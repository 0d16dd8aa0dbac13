// SPDX-License-Identifier: Apache-2.0
// shardlib quickstart: a device mesh and partition specs as types, run as an SPMD program.
//
// A mesh names its axes in its type and takes their sizes at run time; a spec says, per tensor
// dim, which mesh axes split it. The library checks every spec against its mesh at compile time
// (try changing "model" below to "pipe"). The program runs once per device, on the threads
// backend (in-process devices) or under mpirun, and talks to the devices along one mesh axis.
//
//   build/examples/quickstart [--devices N] [--model M]      (N devices as an (N/M) x M mesh)
//   mpirun -np 8 build/examples/quickstart
#include <shardlib/shardlib.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace sl = shardlib;

using Mesh2D = sl::Mesh<"data", "model">;                          // axis names are types
using X = sl::Spec<"data", sl::none>;                              // activations: rows over "data"
using W1 = sl::Spec<sl::none, "model">;                            // column-parallel weight
using W2 = sl::Spec<"model", sl::none>;                            // row-parallel weight
using Y = sl::Spec<"data", sl::none, sl::partial_sum<"model">>;    // x·w1·w2 before its all_reduce

namespace {
int arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

std::string axes_text(const Mesh2D& mesh, const sl::AxisList& axes) {
  if (axes.empty()) return "-";
  std::string s;
  for (int a : axes) s += (s.empty() ? "" : "*") + mesh.shape().name(a).str();
  return s;
}

template <class S>
void show(const char* name, const Mesh2D& mesh) {
  constexpr sl::Sharding sh = sl::sharding_v<Mesh2D, S>;  // checked at compile time
  std::printf("  %-3s %-44s dims split over:", name, S::value.to_string().c_str());
  for (int d = 0; d < sh.rank; ++d) std::printf(" [%s]", axes_text(mesh, sh.dims[static_cast<std::size_t>(d)]).c_str());
  if (sh.is_partial())
    std::printf("  pending %s over [%s]", std::string(sl::to_string(sh.op)).c_str(), axes_text(mesh, sh.partial).c_str());
  std::printf("\n");
}
}  // namespace

int main(int argc, char** argv) {
  try {
    auto rt = sl::Runtime::from_args(argc, argv, /*default_devices=*/8);
    const int model = arg(argc, argv, "--model", 2);
    if (rt.first_local_device() == 0)
      std::printf("shardlib %s on the %s; Kokkos execution space: %s\n", SHARDLIB_VERSION_STRING, rt.describe().c_str(),
                  sl::KokkosScope::execution_space_name().c_str());
    rt.spmd([&](sl::Context& ctx) {
      const int n = ctx.num_devices();
      Mesh2D mesh({model > 0 ? n / model : 0, model}, n);  // checks that the sizes multiply to n
      const bool printer = ctx.device() == 0;
      if (printer) {
        std::printf("mesh %s: %d devices, row-major, last axis fastest\n", mesh.to_string().c_str(), n);
        std::printf("specs on this mesh:\n");
        show<X>("x", mesh);
        show<W1>("w1", mesh);
        show<W2>("w2", mesh);
        show<Y>("y", mesh);
      }

      // A collective along "model": each device adds its id over its model group (what turns
      // y's pending sum into a value). The counters say what this device moved.
      sl::coll::CommRecorder recorder;
      auto& model_group = ctx.group(mesh, Mesh2D::axes<"model">());
      int id = ctx.device(), group_sum = 0;
      model_group.all_reduce(&id, &group_sum, 1, sl::coll::DType::i32, sl::coll::Op::sum);
      const auto moved = recorder[sl::coll::Kind::all_reduce];

      // Collect every device's line on device 0, so the output is in device order.
      std::vector<int> sums(static_cast<std::size_t>(n));
      ctx.world().all_gather(&group_sum, sums.data(), 1, sl::coll::DType::i32);
      if (printer) {
        std::printf("all_reduce over \"model\" (each device contributes its id):\n");
        for (int d = 0; d < n; ++d) {
          auto c = mesh.coords(d);
          std::printf("  device %d at (data %d, model %d): group sum %d\n", d, c[0], c[1], sums[static_cast<std::size_t>(d)]);
        }
        std::printf("device 0 moved: %llu all_reduce call(s), %llu B sent, %llu B received\n",
                    static_cast<unsigned long long>(moved.calls), static_cast<unsigned long long>(moved.bytes_sent),
                    static_cast<unsigned long long>(moved.bytes_received));
        // The same rules at run time, for specs only known then: a bad one is an exception.
        sl::PartitionSpec runtime_spec{sl::AxisName::from("model"), sl::none};
        sl::Sharding r = sl::resolve(runtime_spec, mesh.shape());
        std::printf("run-time spec %s splits dim 0 over [%s]\n", runtime_spec.to_string().c_str(),
                    axes_text(mesh, r.dims[0]).c_str());
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
