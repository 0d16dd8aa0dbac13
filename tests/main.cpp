// SPDX-License-Identifier: Apache-2.0
// The one doctest main, for both backends. Started by mpirun (in a build with MPI), it runs the
// test bodies once per process on the MPI runtime: each rank is one device, and the job fails
// when any rank saw a failure (`meson test` passes the suites that make sense under MPI).
// Otherwise the bodies run on threads runtimes of several device counts (harness.hpp). Kokkos
// is initialised here, once per process, by the library's own entry points (the Runtime or a
// KokkosScope), never by a test.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "collectives/harness.hpp"

#include <shardlib/runtime/kokkos_scope.hpp>
#include <shardlib/runtime/runtime.hpp>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace {
#if defined(SHARDLIB_HAVE_MPI)
// `--backend nccl` (a build with the nccl backend, one GPU per process) runs the bodies on the
// nccl backend: tensors in GPU memory then reshard over NCCL (tests/tensor/memory_space.cpp).
shardlib::Runtime start_mpi_runtime(int& argc, char**& argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--backend") == 0 && std::strcmp(argv[i + 1], "nccl") == 0) {
#if defined(SHARDLIB_HAVE_NCCL)
      for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
      argc -= 2;
      return shardlib::Runtime::nccl(&argc, &argv);
#else
      throw std::invalid_argument("this test build has no nccl backend (build it with SHARDLIB_HAVE_NCCL)");
#endif
    }
  return shardlib::Runtime::mpi(&argc, &argv);
}

int run_under_mpi(int argc, char** argv) {
  auto rt = start_mpi_runtime(argc, argv);
  shardlib::test::mpi_runtime() = &rt;
  doctest::Context context(argc, argv);
  if (rt.first_local_device() != 0) {  // rank 0 reports; the others only their failures
    context.setOption("minimal", true);
    context.setOption("no-colors", true);
  }
  int failed = context.run();
  shardlib::test::mpi_runtime() = nullptr;
  // Every process's verdict counts: fail the job if any process failed.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
#endif
}  // namespace

int main(int argc, char** argv) {
  // Runtimes warn once per process when the BLAS kernel is far below the CPU; the tests check
  // that warning themselves, and keep the logs free of it (set the variable to 0 to see it).
  setenv("SHARDLIB_NO_BLAS_WARNING", "1", 0);
#if defined(SHARDLIB_HAVE_MPI)
  if (shardlib::Runtime::launched_by_mpirun()) return run_under_mpi(argc, argv);
#endif
  shardlib::KokkosScope kokkos(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
