// An outside program using shardlib: built as a Meson subproject, through pkg-config and
// through CMake's find_package by tests/packaging/run.sh.
#include <shardlib/runtime/kokkos_scope.hpp>
#include <shardlib/shardlib.hpp>

#include <cstdio>

namespace sl = shardlib;
using M = sl::Mesh<"data", "model">;
using S = sl::Spec<"data", sl::none>;

int main(int argc, char** argv) {
  sl::KokkosScope kokkos(argc, argv);
  M mesh({2, 2}, 4);
  constexpr auto sharding = sl::sharding_v<M, S>;
  int sum = 0;
  Kokkos::parallel_reduce(
      "consumer", Kokkos::RangePolicy<>(0, mesh.num_devices()), KOKKOS_LAMBDA(int i, int& s) { s += i; }, sum);
  bool ok = sharding.dims[0] == sl::AxisList{0} && sum == 6;
  std::printf("consumer: shardlib %s, %s\n", SHARDLIB_VERSION_STRING, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
