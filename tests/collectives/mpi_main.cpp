// SPDX-License-Identifier: Apache-2.0
// The backend-independent collectives suites, run once per process on the MPI runtime
// (under mpirun -np N): every test body runs with N devices.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "harness.hpp"

int main(int argc, char** argv) {
  auto rt = shardlib::Runtime::mpi(&argc, &argv);
  shardlib::test::mpi_runtime() = &rt;
  doctest::Context context(argc, argv);
  if (rt.first_local_device() != 0) context.setOption("minimal", true);  // other ranks: failures only
  int failed = context.run();
  shardlib::test::mpi_runtime() = nullptr;
  // Every process's verdict counts: fail the job if any process failed.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
