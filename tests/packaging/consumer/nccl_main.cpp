// Packaging: the NCCL backend compiles and links through shardlib-nccl (Meson) and
// shardlib::nccl (CMake). Run under mpirun on a machine with one GPU per process, it sums the
// ranks on the GPUs; the packaging test only builds it (CI has no GPU).
#include <shardlib/collectives/nccl.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    auto world = shardlib::coll::NcclCommunicator::world();
    int* x = nullptr;
    cudaMalloc(&x, sizeof(int));
    const int mine = world->rank();
    cudaMemcpy(x, &mine, sizeof(int), cudaMemcpyHostToDevice);
    world->all_reduce(x, x, 1, shardlib::coll::DType::i32, shardlib::coll::Op::sum);
    world->synchronize();
    int sum = 0;
    cudaMemcpy(&sum, x, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(x);
    std::printf("rank %d: the ranks sum to %d\n", world->rank(), sum);
    status = sum == world->size() * (world->size() - 1) / 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
