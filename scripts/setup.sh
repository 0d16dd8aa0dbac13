#!/usr/bin/env bash
# shardlib, from a fresh clone to a built, running example:
#   1. installs the Debian packages the build needs that are missing (sudo when not root);
#   2. configures the build in build/ (or reconfigures it), and builds (through ccache);
#   3. runs the flagship example, examples/quickstart.
# Then `meson test -C build --print-errorlogs` runs the whole test suite.
# Extra arguments go to `meson setup` (e.g. -Dmpi=disabled, -Dcmake_prefix_path=/opt/kokkos).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  meson ninja-build pkg-config cmake g++ python3   # build tools
  libtrilinos-kokkos-dev                           # Kokkos (3.4, Serial) from Debian
  libeigen3-dev                                    # host linear algebra
  libopenblas-dev                                  # BLAS under Eigen's host GEMM (optional: -Dblas)
  doctest-dev                                      # tests
  libopenmpi-dev openmpi-bin                       # MPI backend
  libhdf5-dev python3-h5py                         # checkpoints (HDF5), and h5py for their test
  ccache                                           # compiler cache (Meson uses it when present)
)
./scripts/packages.sh "${packages[@]}"

# ccache: a second build of the same sources (another clone, CI after you) compiles only what
# changed. With debug info ccache keys on the build directory too, by default; let clones share
# objects (only the compile directory recorded in their debug info differs).
export CCACHE_NOHASHDIR=true

if [ -f build/build.ninja ]; then
  meson setup --reconfigure build "$@"
else
  meson setup build "$@"
fi
meson compile -C build
./build/examples/quickstart
