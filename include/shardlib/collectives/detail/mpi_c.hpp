// SPDX-License-Identifier: Apache-2.0
/// @file
/// <mpi.h> with the C API only, for the backends that use MPI (mpi, and nccl's start-up): MPI's
/// C++ bindings left the standard with MPI-3.0, and Open MPI's warn under -Wextra. (Without
/// effect where <mpi.h> was included before.)
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
