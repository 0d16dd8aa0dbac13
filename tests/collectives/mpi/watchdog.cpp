// SPDX-License-Identifier: Apache-2.0
// The mpi backend's watchdog (collectives/detail/mpi_watchdog.hpp), run by watchdog_check.py
// under mpirun -np 2 with SHARDLIB_MPI_TIMEOUT=5. Rank 0 reaches the first barrier a second
// late (a wait under the timeout: no report), then sleeps for a minute where rank 1 waits in a
// second barrier: the watchdog must end rank 1 within seconds, naming the call, and mpirun the
// job. With a SHARDLIB_MPI_TIMEOUT that is not a number, the first collective throws: printed,
// exit status 3.
#include <shardlib/collectives/mpi.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);  // as the runtime does
  int status = 0;
  {
    auto world = shardlib::coll::MpiCommunicator::world();
    try {
      if (world->rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
      world->barrier();
      if (world->rank() == 0) {
        std::printf("rank 0: the first barrier passed; sleeping\n");
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::seconds(60));
      } else {
        world->barrier();  // rank 0 is not coming
      }
    } catch (const shardlib::coll::CollectiveError& e) {
      std::printf("%s\n", e.what());
      status = 3;
    }
  }
  MPI_Finalize();
  return status;
}
