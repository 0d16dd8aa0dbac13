#!/usr/bin/env bash
# Packaging test: an outside project consumes shardlib
#   1. as a Meson subproject (dependency('shardlib') through meson.override_dependency);
#   2. installed, through pkg-config;
#   3. installed, through CMake's find_package(shardlib).
# The consumers build with no optimisation flags (Meson's plain buildtype, CMake's empty build
# type): what is tested is how they find shardlib, and unoptimised they compile in two thirds of
# the time (this test: 95 s -> 65 s without ccache).
# usage: run.sh SOURCE_ROOT WORK_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$2
consumer=$src/tests/packaging/consumer
rm -rf "$work"
mkdir -p "$work"

step() { echo "== $*"; }

step "1. shardlib as a Meson subproject"
cp -r "$consumer" "$work/sub"
mkdir -p "$work/sub/subprojects"
ln -s "$src" "$work/sub/subprojects/shardlib"
meson setup "$work/sub/build" "$work/sub" -Dbuildtype=plain >"$work/sub.log" 2>&1 || { cat "$work/sub.log"; exit 1; }
meson compile -C "$work/sub/build" >>"$work/sub.log" 2>&1 || { cat "$work/sub.log"; exit 1; }
"$work/sub/build/consumer"
# The NCCL consumer is built only (no GPU here): wherever the subproject had the NCCL backend,
# CMake's shardlib::nccl must build it too.
need_nccl=0
if [ -x "$work/sub/build/consumer_nccl" ]; then need_nccl=1; echo "consumer_nccl built through the subproject"; fi
run_io() {  # the checkpoint consumer, required when this build has HDF5
  if [ -x "$1/consumer_io" ]; then (cd "$1" && ./consumer_io)
  elif [ "$need_io" = 1 ]; then echo "consumer_io was not built through $2"; exit 1; fi
}
need_io=0
if pkg-config --exists hdf5-serial 2>/dev/null || pkg-config --exists hdf5 2>/dev/null; then need_io=1; fi
run_io "$work/sub/build" "the subproject"

step "2. installed shardlib through pkg-config"
prefix=$work/prefix
meson setup "$work/lib" "$src" --prefix "$prefix" -Dtests=false -Dexamples=false -Dbenchmarks=false \
  >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
meson install -C "$work/lib" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
test -f "$prefix/include/shardlib/detail/diagnostics.hpp" || { echo "install flattened include/shardlib/detail"; exit 1; }
test -f "$prefix/include/shardlib/runtime/kokkos_scope.hpp" || { echo "install lost include/shardlib/runtime"; exit 1; }
pcdir=$(dirname "$(find "$prefix" -name shardlib.pc | head -n 1)")
cp -r "$consumer" "$work/pc"
PKG_CONFIG_PATH=$pcdir meson setup "$work/pc/build" "$work/pc" -Duse_subproject=false -Dbuildtype=plain \
  >"$work/pc.log" 2>&1 || { cat "$work/pc.log"; exit 1; }
meson compile -C "$work/pc/build" >>"$work/pc.log" 2>&1 || { cat "$work/pc.log"; exit 1; }
"$work/pc/build/consumer"
run_io "$work/pc/build" pkg-config

step "3. installed shardlib through CMake find_package"
cmake -S "$consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; exit 1; }
"$work/cmake/consumer"
run_io "$work/cmake" CMake
if [ "$need_nccl" = 1 ]; then
  [ -x "$work/cmake/consumer_nccl" ] || { echo "consumer_nccl was not built through CMake (shardlib::nccl missing)"; exit 1; }
  echo "consumer_nccl built through CMake"
fi
echo "packaging: subproject, pkg-config and CMake consumers all built and ran"
