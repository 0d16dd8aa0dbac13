// SPDX-License-Identifier: Apache-2.0
// shardlib quickstart: a device mesh and partition specs, as types.
//
// A mesh names its axes in its type and takes their sizes at run time; a spec says, per tensor
// dim, which mesh axes split it. The library checks every spec against its mesh at compile time
// (try changing "model" below to "pipe") and tells each device which block it holds.
//
//   build/examples/quickstart [--data N] [--model M]
#include <shardlib/runtime/kokkos_scope.hpp>
#include <shardlib/shardlib.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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
  sl::KokkosScope kokkos(argc, argv);
  int data = arg(argc, argv, "--data", 4), model = arg(argc, argv, "--model", 2);
  try {
    Mesh2D mesh({data, model}, data * model);
    std::printf("shardlib %s, Kokkos execution space: %s\n", SHARDLIB_VERSION_STRING,
                sl::KokkosScope::execution_space_name().c_str());
    std::printf("mesh %s: %d devices, row-major, last axis fastest\n", mesh.to_string().c_str(), mesh.num_devices());
    for (int d = 0; d < mesh.num_devices(); ++d) {
      auto c = mesh.coords(d);
      std::printf("  device %d at (data %d, model %d): \"model\" group {", d, c[0], c[1]);
      auto g = mesh.group_devices(d, Mesh2D::axes<"model">());
      for (std::size_t i = 0; i < g.size(); ++i) std::printf("%s%d", i ? ", " : "", g[i]);
      std::printf("}\n");
    }
    std::printf("specs on this mesh:\n");
    show<X>("x", mesh);
    show<W1>("w1", mesh);
    show<W2>("w2", mesh);
    show<Y>("y", mesh);

    // The same rules at run time, for specs only known then: a bad one is an exception.
    sl::PartitionSpec runtime_spec{sl::AxisName::from("model"), sl::none};
    sl::Sharding r = sl::resolve(runtime_spec, mesh.shape());
    std::printf("run-time spec %s splits dim 0 over [%s]\n", runtime_spec.to_string().c_str(),
                axes_text(mesh, r.dims[0]).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
