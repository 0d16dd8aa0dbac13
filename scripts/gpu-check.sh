#!/usr/bin/env bash
# shardlib on a GPU, in one command (docs/13_gpus.md, "Checking a GPU machine").
#
#   scripts/gpu-check.sh build --kokkos DIR [--out OUT] [-j N] [--arch 90] [--no-host-forms]
#                              [--cudnn-frontend INCLUDE_DIR | --no-cudnn]
#       Compiles, with DIR/bin/nvcc_wrapper (DIR: a Kokkos install built with CUDA), the GPU test
#       programs (tests/tensor/memory_space.cpp and tests/autodiff/memory_space.cpp, each with
#       tests/main.cpp), the host forms of the same code (kernels_reduce, kernels_elementwise and
#       the collectives suite, on Kokkos's Serial host space) and the GPU benchmarks
#       (benchmarks/gpu.cpp; benchmarks/gpu_block.cpp, a transformer layer's training step), N at
#       a time, into OUT (build-gpu/), stripped, with OUT/manifest.txt saying what was built, from
#       which commit, with what. The attention test and the layer's benchmark are built with
#       cuDNN's fused attention (SHARDLIB_HAVE_CUDNN): the cuDNN frontend's headers from
#       --cudnn-frontend, else SHARDLIB_CUDNN_FRONTEND, else OUT/cudnn-frontend/include, fetched
#       there from PyPI (nvidia-cudnn-frontend) when pip can; without them, --no-cudnn, or no
#       network, they are built without (the unfused ops then run; the manifest says so). cuDNN
#       itself is loaded when they run. Needs no GPU: a GPU translation unit takes about 5
#       minutes and 3 GB to compile on one core.
#   scripts/gpu-check.sh run [--out OUT] [--profile] [--profile-args 'ARGS'] [--devices LIST]
#       On a machine with an NVIDIA GPU (no Kokkos, MPI or network needed: only the driver and
#       libcublas), runs what `build` made: each suite on 1 to 8 virtual devices (in-process
#       devices, a CUDA stream each; --devices 1,8 picks the suites' counts), bench_gpu's parts
#       (1, 2 or 8 devices each), the same figures in PyTorch eager when python3 has torch (its
#       peer, benchmarks/peers/torch_gpu.py); then prints one summary: cases and checks passed per
#       suite, each GPU goal of benchmarks/harness/goals.py met or short, ours beside PyTorch, the
#       wall time. --profile adds Nsight Compute's per-kernel time of one training-like step
#       (ncu --metrics gpu__time_duration.sum, its --print-summary per-kernel kept beside) and the
#       step's time outside kernels; --profile-args gives bench_gpu's arguments for that step
#       (PROFILE_ARGS below; arguments that start with --config are bench_gpu_block's). Records
#       and logs go to OUT/results/. cuDNN (libcudnn.so.9) is looked for on the loader's path,
#       then in python3's nvidia-cudnn wheel (PyTorch's), and put on LD_LIBRARY_PATH. The layer's
#       benchmark runs beside its PyTorch peer (benchmarks/peers/block_torch.py: eager with a
#       mask, and torch.compile with SDPA of both layers, whose warm-up takes most of a minute).
#       About 2.5 minutes on an H100.
#   scripts/gpu-check.sh --kokkos DIR [--profile] ...
#       Both: build, then run (on a machine that has the GPU and the Kokkos).
#
# Exit status: 0 every suite passed and every benchmark part ran (a goal that is short is
# reported, not a failure); 1 a build, suite or part failed; 2 a bad flag; 77 cannot run here,
# with a one-line reason (no GPU, no nvcc_wrapper in DIR, a host-only Kokkos, no nvcc).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ME="scripts/gpu-check.sh"

# What `--profile` runs under Nsight Compute: bench_gpu's arguments. --profile-step delimits one
# step with cudaProfilerStart/Stop (ncu --profile-from-start off) and records its wall time.
# A part that models a training step better can take its place: --profile-args '--part block ...'.
PROFILE_ARGS="${GPU_CHECK_PROFILE_ARGS:-}"  # default: the layer's step (block) when built, else mlp's
CUDNN_FRONTEND_VERSION=1.32.0  # PyPI's nvidia-cudnn-frontend, when build fetches it

# The compiler's flags (docs/13): C++20, extended lambdas, Hopper; Kokkos linked statically, so a
# GPU machine needs only the driver (-lcuda) and libcublas.so.13.
NVFLAGS=(-std=c++20 -extended-lambda)
TEST_FLAGS=(-O2)
BENCH_FLAGS=(-O3 -DNDEBUG)  # as benchmarks/run gpu builds bench_gpu (figures comparable with its)
LIBS=(-lkokkoscore -lcublas -lcuda -ldl)

# The programs: name, sources (tests/main.cpp is linked into every suite), the doctest suites
# each runs. The host forms are the same code on Kokkos's host space, compiled by nvcc_wrapper.
GPU_SUITES=(tensor_memory_space autodiff_memory_space)
declare -A SOURCES=(
  [tensor_memory_space]="tests/tensor/memory_space.cpp"
  [autodiff_memory_space]="tests/autodiff/memory_space.cpp"
  [host_forms]="tests/kernels/reduce.cpp tests/kernels/elementwise.cpp tests/collectives/collectives.cpp tests/collectives/region_copy.cpp"
)
declare -A TEST_SUITES=(
  [tensor_memory_space]="tensor_memory_space"
  [autodiff_memory_space]="autodiff_memory_space"
  [host_forms]="kernels_reduce,kernels_elementwise,collectives"
)
# bench_gpu's parts in `run`: "part devices [extra args]" (full sizes: each part takes seconds).
BENCH_CASES=(
  "elementwise 1" "rows 1" "overhead 1" "matmul 1" "matmul 2" "mlp 1" "mlp 8"
  "reshard 2" "reshard 8" "stencil 1" "stencil 8 --stencil-side 4096"
)
# bench_gpu_block's cases: "config devices dtype", then its PyTorch peer on the same configs.
BLOCK_CASES=("gpt2 1 bf16" "gpt2 2 bf16" "large 1 bf16" "gpt2 1 tf32" "large 1 tf32")
BLOCK_PEER_ARGS=(--configs "gpt2,large" --dtypes "bf16,tf32" --compile-configs "gpt2,large")

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}
die() { echo "$ME: $*" >&2; exit 1; }
bad_flag() { echo "$ME: $*; see $ME --help" >&2; exit 2; }
cannot() { echo "$ME: skipped: $*" >&2; exit 77; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- flags -----------------------------------------------------------------------------------
mode=all
case "${1:-}" in
  build | run) mode="$1"; shift ;;
esac
kokkos="${SHARDLIB_KOKKOS_CUDA:-}"
out="$ROOT/build-gpu"
njobs=2
arch=90
profile=0
host_forms=1
cudnn_frontend="${SHARDLIB_CUDNN_FRONTEND:-}"
cudnn=1
devices=""
need_value() { if [ "$#" -lt 2 ] || [ -z "$2" ]; then bad_flag "$1 needs a value"; fi; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --kokkos) need_value "$@"; kokkos="$2"; shift 2 ;;
    --kokkos=*) kokkos="${1#*=}"; shift ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    -j | --jobs) need_value "$@"; njobs="$2"; shift 2 ;;
    -j*) njobs="${1#-j}"; shift ;;
    --jobs=*) njobs="${1#*=}"; shift ;;
    --arch) need_value "$@"; arch="$2"; shift 2 ;;
    --arch=*) arch="${1#*=}"; shift ;;
    --no-host-forms) host_forms=0; shift ;;
    --cudnn-frontend) need_value "$@"; cudnn_frontend="$2"; shift 2 ;;
    --cudnn-frontend=*) cudnn_frontend="${1#*=}"; shift ;;
    --no-cudnn) cudnn=0; shift ;;
    --profile) profile=1; shift ;;
    --profile-args) need_value "$@"; PROFILE_ARGS="$2"; shift 2 ;;
    --profile-args=*) PROFILE_ARGS="${1#*=}"; shift ;;
    --devices) need_value "$@"; devices="$2"; shift 2 ;;
    --devices=*) devices="${1#*=}"; shift ;;
    build | run) bad_flag "'$1' must come first" ;;
    *) bad_flag "unknown flag '$1'" ;;
  esac
done
[[ "$njobs" =~ ^[1-9][0-9]*$ ]] || bad_flag "-j takes a positive number, not '$njobs'"
[[ "$arch" =~ ^[0-9]+[a-z]?$ ]] || bad_flag "--arch takes a compute capability such as 90, not '$arch'"
[[ -z "$devices" || "$devices" =~ ^[1-8](,[1-8])*$ ]] || bad_flag "--devices takes counts 1 to 8 such as 1,8, not '$devices'"
if [ "$mode" = build ] && [ "$profile" = 1 ]; then bad_flag "--profile is for run"; fi
if [ "$mode" != build ] && [ -z "$kokkos" ] && [ "$mode" = all ]; then
  bad_flag "--kokkos DIR is needed to build (a Kokkos install configured with -DKokkos_ENABLE_CUDA=ON)"
fi
if [ "$mode" = build ] && [ -z "$kokkos" ]; then
  bad_flag "build needs --kokkos DIR (a Kokkos install configured with -DKokkos_ENABLE_CUDA=ON)"
fi
out="$(realpath -m "$out")"

# ---- checks: what this machine can do (one line and exit 77 when it cannot) -------------------
check_gpu() {
  command -v nvidia-smi >/dev/null || cannot "no GPU: nvidia-smi is not on the PATH (no NVIDIA driver here)"
  local list
  if ! list="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>&1)" || [ -z "$list" ]; then
    cannot "no GPU: nvidia-smi lists none ($(echo "$list" | head -n1))"
  fi
  gpu_line="$(echo "$list" | head -n1)"
}

check_kokkos() {
  [ -x "$kokkos/bin/nvcc_wrapper" ] || cannot "no nvcc_wrapper: $kokkos/bin/nvcc_wrapper does not exist (--kokkos takes a Kokkos install built with CUDA)"
  local config="$kokkos/include/KokkosCore_config.h"
  [ -f "$config" ] || cannot "not a Kokkos install: $config does not exist"
  grep -q '^#define KOKKOS_ENABLE_CUDA\b' "$config" ||
    cannot "host-only Kokkos: $config has no KOKKOS_ENABLE_CUDA (configure Kokkos with -DKokkos_ENABLE_CUDA=ON)"
  libdir=""
  for d in "$kokkos/lib" "$kokkos/lib64"; do
    if [ -f "$d/libkokkoscore.a" ]; then libdir="$d"; break; fi
  done
  [ -n "$libdir" ] || cannot "no static Kokkos: $kokkos/lib*/libkokkoscore.a does not exist (build Kokkos with -DBUILD_SHARED_LIBS=OFF)"
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  command -v nvcc >/dev/null || cannot "no nvcc: nvcc_wrapper needs the CUDA toolkit's nvcc on the PATH"
}

# ---- build -----------------------------------------------------------------------------------
# Jobs: PROGRAM_I (the I-th source of a program, compiled), main (tests/main.cpp, compiled),
# bench_gpu (compiled and linked), link_PROGRAM. Each writes logs/NAME.log and logs/NAME.status
# ("ok SECONDS" or "failed SECONDS"); `njobs` run at a time.
job_command() {  # the command of job $1, into the array `cmd`
  local name="$1" p i srcs
  case "$name" in
    main) cmd=("$nv" "${flags[@]}" -c "$ROOT/tests/main.cpp" -o "$obj/main.o") ;;
    bench_gpu) cmd=("$nv" "${NVFLAGS[@]}" "${BENCH_FLAGS[@]}" -arch="sm_$arch" "${includes[@]}"
      "$ROOT/benchmarks/gpu.cpp" -o "$out/bench_gpu" -L"$libdir" "${LIBS[@]}") ;;
    bench_gpu_block) cmd=("$nv" "${NVFLAGS[@]}" "${BENCH_FLAGS[@]}" -arch="sm_$arch" "${includes[@]}" "${cudnn_flags[@]}"
      "$ROOT/benchmarks/gpu_block.cpp" -o "$out/bench_gpu_block" -L"$libdir" "${LIBS[@]}") ;;
    link_*)
      p="${name#link_}"
      read -r -a srcs <<<"${SOURCES[$p]}"
      cmd=("$nv" "${flags[@]}" "$obj/main.o")
      for i in "${!srcs[@]}"; do cmd+=("$obj/${p}_$i.o"); done
      cmd+=(-o "$out/${p}_tests" -L"$libdir" "${LIBS[@]}") ;;
    *)
      p="${name%_*}" i="${name##*_}"
      read -r -a srcs <<<"${SOURCES[$p]}"
      cmd=("$nv" "${flags[@]}" -c "$ROOT/${srcs[$i]}" -o "$obj/$name.o")
      if [ "$p" = autodiff_memory_space ]; then cmd+=("${cudnn_flags[@]}"); fi ;;
  esac
}

run_job() {
  local name="$1" t0 status=ok cmd=()
  job_command "$name"
  t0="$(now)"
  "${cmd[@]}" >"$out/logs/$name.log" 2>&1 || status=failed
  # nvcc only warns when device code calls a host function (#20011-#20015), and the call is then
  # undefined: the compiler may drop the kernel's body (a row kernel compiled to no loads and no
  # stores this way). One such warning from shardlib's own code fails a GPU program's build (the
  # host forms run on the host only, their test functors host lambdas: not checked).
  local host_calls=""
  if [[ "$name" != host_forms* ]]; then
    host_calls="$(grep -E "include/shardlib/[^ ]*: warning #2001[1-5]" "$out/logs/$name.log" | sort -u | head -n 5 || true)"
  fi
  if [ -n "$host_calls" ]; then
    status=failed
    printf 'device code calls a host function (nvcc warning #20011-#20015 in shardlib'"'"'s headers):\n%s\n' "$host_calls" >>"$out/logs/$name.log"
  fi
  echo "$status $(since "$t0")" >"$out/logs/$name.status"
  echo "  $name: $status in $(since "$t0") s"
}

run_jobs() {  # run_jobs NAME...
  local name
  for name in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$njobs" ]; do wait -n || true; done
    echo "  $name: started"
    run_job "$name" &
  done
  wait
}

job_ok() { [ -f "$out/logs/$1.status" ] && [ "$(cut -d' ' -f1 "$out/logs/$1.status")" = ok ]; }
job_seconds() { cut -d' ' -f2 "$out/logs/$1.status"; }

# The cuDNN frontend's include folder into `cudnn_flags` (empty, with the reason in `cudnn_note`,
# when there is none: then the attention test and the layer's benchmark run the unfused ops).
find_cudnn_frontend() {
  cudnn_flags=()
  if [ "$cudnn" = 0 ]; then cudnn_note="off (--no-cudnn)"; return; fi
  local dir="$cudnn_frontend" fetched="$out/cudnn-frontend"
  if [ -z "$dir" ] && [ -f "$fetched/include/cudnn_frontend.h" ]; then dir="$fetched/include"; fi
  if [ -z "$dir" ]; then
    echo "  fetching the cuDNN frontend's headers (PyPI nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION) into $fetched ..."
    local tmp
    tmp="$(mktemp -d)"
    if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" \
        >"$tmp/pip.log" 2>&1 && python3 - "$tmp" "$fetched" <<'PY'
import glob, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(tmp + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
PY
    then
      dir="$fetched/include"
    else
      cudnn_note="off: the cuDNN frontend's headers could not be fetched ($(tail -n1 "$tmp/pip.log" 2>/dev/null)); give --cudnn-frontend DIR"
      rm -rf "$tmp"
      echo "  $cudnn_note"
      return
    fi
    rm -rf "$tmp"
  fi
  [ -f "$dir/cudnn_frontend.h" ] || bad_flag "--cudnn-frontend $dir has no cudnn_frontend.h"
  cudnn_flags=(-DSHARDLIB_HAVE_CUDNN=1 -isystem "$dir")
  cudnn_note="cuDNN fused attention built in (frontend $(grep -o 'MINOR_VERSION [0-9]*' "$dir/cudnn_frontend_version.h" 2>/dev/null | head -n1 | sed 's/MINOR_VERSION /1./'), $dir); libcudnn.so.9 loaded at run time"
}

do_build() {
  check_kokkos
  nv="$kokkos/bin/nvcc_wrapper"
  obj="$out/obj"
  includes=(-I"$ROOT/include" -I"$kokkos/include" -isystem /usr/include/eigen3)
  find_cudnn_frontend
  flags=("${NVFLAGS[@]}" "${TEST_FLAGS[@]}" -arch="sm_$arch" "${includes[@]}")
  local t_all p i n srcs programs=("${GPU_SUITES[@]}") order=() late=()
  t_all="$(now)"
  rm -rf "$obj" "$out/logs" "$out/manifest.txt"
  mkdir -p "$obj" "$out/logs" || die "cannot create $obj"
  [ "$host_forms" = 0 ] || programs+=(host_forms)
  echo "$ME build: ${programs[*]} and bench_gpu with $nv (sm_$arch), $njobs at a time, into $out"

  # The heaviest first (the GPU suites, then bench_gpu), so that no long one starts last.
  for p in "${programs[@]}"; do
    read -r -a srcs <<<"${SOURCES[$p]}"
    for i in "${!srcs[@]}"; do
      if [ "$p" = host_forms ]; then late+=("${p}_$i"); else order+=("${p}_$i"); fi
    done
  done
  order+=(bench_gpu_block bench_gpu "${late[@]}" main)
  run_jobs "${order[@]}"

  # Links (seconds each), then the manifest: one line per program (kind, name, file, doctest
  # suites, compile seconds, bytes once stripped).
  local failed=() built=() ok seconds
  for n in "${order[@]}"; do job_ok "$n" || failed+=("$n"); done
  for p in "${programs[@]}"; do
    read -r -a srcs <<<"${SOURCES[$p]}"
    ok=1
    job_ok main || ok=0
    for i in "${!srcs[@]}"; do job_ok "${p}_$i" || ok=0; done
    [ "$ok" = 1 ] || continue
    run_job "link_$p"
    if job_ok "link_$p"; then built+=("$p"); else failed+=("link_$p"); fi
  done
  local commit dirty=""
  commit="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  [ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=" (with uncommitted changes)"
  {
    echo "# scripts/gpu-check.sh build, $(date -Iseconds) on $(hostname): shardlib $commit$dirty"
    echo "# compiler: $nv ($(nvcc --version | grep -o 'release [0-9.]*' | head -n1)), sm_$arch; Kokkos: $kokkos"
    echo "# kind name file suites compile-seconds bytes"
    for p in "${built[@]}"; do
      read -r -a srcs <<<"${SOURCES[$p]}"
      seconds=0
      for i in "${!srcs[@]}"; do seconds="$(awk -v a="$seconds" -v b="$(job_seconds "${p}_$i")" 'BEGIN { print a + b }')"; done
      strip "$out/${p}_tests"
      echo "suite $p ${p}_tests ${TEST_SUITES[$p]} $seconds $(stat -c %s "$out/${p}_tests")"
    done
    if job_ok bench_gpu; then
      strip "$out/bench_gpu"
      echo "bench bench_gpu bench_gpu - $(job_seconds bench_gpu) $(stat -c %s "$out/bench_gpu")"
    fi
    if job_ok bench_gpu_block; then
      strip "$out/bench_gpu_block"
      echo "block bench_gpu_block bench_gpu_block - $(job_seconds bench_gpu_block) $(stat -c %s "$out/bench_gpu_block")"
    fi
    echo "# cudnn: $cudnn_note"
  } >"$out/manifest.txt"
  rm -rf "$obj"  # hundreds of MB; the stripped programs are what a GPU machine needs

  echo "$ME build: $(since "$t_all") s (main.cpp $(job_seconds main) s of it); in $out:"
  awk '!/^#/ { printf "  %-28s %5.0f s to compile, %5.1f MB\n", $3, $5, $6 / 1e6 }' "$out/manifest.txt"
  if [ "${#failed[@]}" -gt 0 ]; then
    for n in "${failed[@]}"; do
      echo "$ME build: $n failed; from $out/logs/$n.log:" >&2
      grep -m 20 'error' "$out/logs/$n.log" >&2 || tail -n 20 "$out/logs/$n.log" >&2
    done
    exit 1
  fi
}

# ---- run -------------------------------------------------------------------------------------
do_run() {
  check_gpu
  local manifest="$out/manifest.txt"
  [ -f "$manifest" ] || die "nothing built in $out (no manifest.txt): run $ME build --kokkos DIR --out $out first"
  local built_arch cap
  built_arch="$(grep -o 'sm_[0-9]*[a-z]\?' "$manifest" | head -n1)"
  cap="$(echo "$gpu_line" | awk -F', *' '{ print $NF }' | tr -d .)"
  if [ -n "$built_arch" ] && [ "sm_$cap" != "$built_arch" ]; then
    cannot "the programs in $out were built for $built_arch; this GPU ($gpu_line) is sm_$cap: build with --arch $cap"
  fi
  # libcublas: the CUDA toolkit's lib64 when the loader does not know it.
  if [ -d /usr/local/cuda/lib64 ]; then export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  local kind name file suites rest missing
  res_notes_pending="$(mktemp)"
  while read -r kind name file suites rest; do
    case "$kind" in suite | bench | block) ;; *) continue ;; esac
    [ -x "$out/$file" ] || die "$out/$file is listed in the manifest but missing"
    missing="$(ldd "$out/$file" 2>/dev/null | awk '/not found/ { print $1 }' | tr '\n' ' ')"
    [ -z "$missing" ] || cannot "$file needs ${missing% } (not found; is the CUDA toolkit's lib64 on LD_LIBRARY_PATH?)"
  done <"$manifest"

  # cuDNN for the fused attention: the loader's, else PyTorch's wheel (nvidia-cudnn-*).
  if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
    local cudnn_lib
    cudnn_lib="$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for r in roots:
    hits = sorted(glob.glob(r + "/nvidia/**/libcudnn.so.9", recursive=True))
    if hits:
        print(hits[0].rsplit("/", 1)[0])
        break
PY
)"
    if [ -n "$cudnn_lib" ]; then
      export LD_LIBRARY_PATH="$cudnn_lib:$LD_LIBRARY_PATH"
      echo "note: libcudnn.so.9 from $cudnn_lib (python3's nvidia-cudnn wheel)" >>"$res_notes_pending"
    fi
  fi
  # bench_gpu's host GEMM warning (no OpenBLAS in an nvcc build) says nothing about the GPU.
  export SHARDLIB_NO_BLAS_WARNING=1
  local res="$out/results" t_all failures=0
  t_all="$(now)"
  rm -rf "$res"
  mkdir -p "$res"
  cat "$res_notes_pending" >>"$res/notes.txt"
  rm -f "$res_notes_pending"
  echo "$ME run: on $gpu_line; $(head -n1 "$manifest" | sed 's/^# scripts\/gpu-check.sh //')"

  # The suites (each loops over 1 to 8 virtual devices itself; SHARDLIB_TEST_DEVICES picks).
  local t0 rc
  while read -r kind name file suites rest; do
    [ "$kind" = suite ] || continue
    t0="$(now)"
    echo "[suite] $name (${devices:-every device count}) ..."
    rc=0
    env ${devices:+SHARDLIB_TEST_DEVICES="$devices"} timeout 120 "$out/$file" --test-suite="$suites" --no-version \
      --no-colors </dev/null >"$res/$name.log" 2>&1 || rc=$?
    echo "$name $rc $(since "$t0")" >>"$res/suites.txt"
    [ "$rc" = 0 ] || failures=$((failures + 1))
    echo "        $(awk '/^\[doctest\] test cases:/ { c = $6 " of " $4 " cases passed" }
      /^\[doctest\] assertions:/ { a = $5 " of " $3 " checks" } END { print (c ? c ", " a : "no doctest totals") }' \
      "$res/$name.log"), exit $rc, $(since "$t0") s"
  done <"$manifest"

  # bench_gpu's parts, one process each; JSON records to records.jsonl.
  local bench
  bench="$(awk '$1 == "bench" { print $3 }' "$manifest")"
  if [ -n "$bench" ]; then
    local i=0 c part dev extra
    for c in "${BENCH_CASES[@]}"; do
      i=$((i + 1))
      read -r part dev extra <<<"$c"
      t0="$(now)"
      rc=0
      # shellcheck disable=SC2086  # extra: the case's own flags
      timeout 60 "$out/$bench" --backend threads --devices "$dev" --part "$part" $extra \
        </dev/null >"$res/bench_${part}_$dev.out" 2>"$res/bench_${part}_$dev.log" || rc=$?
      grep '^{' "$res/bench_${part}_$dev.out" >>"$res/records.jsonl" || true
      echo "bench $part $dev $rc $(since "$t0")" >>"$res/bench.txt"
      [ "$rc" = 0 ] || failures=$((failures + 1))
      echo "[bench ${i}/${#BENCH_CASES[@]}] $part on $dev device(s): $(grep -c '^{' "$res/bench_${part}_$dev.out") records, exit $rc, $(since "$t0") s"
    done
    # The PyTorch peer: the same figures in PyTorch eager on the same GPU.
    t0="$(now)"
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      echo "[peer] PyTorch: elementwise, matmul, MLP block ..."
      rc=0
      timeout 90 python3 "$ROOT/benchmarks/peers/torch_gpu.py" >"$res/torch.out" 2>"$res/torch.log" || rc=$?
      grep '^{' "$res/torch.out" >>"$res/records.jsonl" || true
      echo "        $(grep -c '^{' "$res/torch.out") records, exit $rc, $(since "$t0") s"
      [ "$rc" = 0 ] || echo "peer torch failed (exit $rc): see $res/torch.log" >>"$res/notes.txt"
    else
      echo "peer torch: not run (python3 cannot import torch with CUDA here)" >>"$res/notes.txt"
    fi
  fi

  # bench_gpu_block: a transformer layer's step, then the same in PyTorch (eager and compiled).
  local block
  block="$(awk '$1 == "block" { print $3 }' "$manifest")"
  if [ -n "$block" ]; then
    local i=0 c config dev dtype
    for c in "${BLOCK_CASES[@]}"; do
      i=$((i + 1))
      read -r config dev dtype <<<"$c"
      t0="$(now)"
      rc=0
      timeout 120 "$out/$block" --backend threads --devices "$dev" --config "$config" --dtype "$dtype" \
        </dev/null >"$res/block_${config}_${dev}_$dtype.out" 2>"$res/block_${config}_${dev}_$dtype.log" || rc=$?
      grep '^{' "$res/block_${config}_${dev}_$dtype.out" >>"$res/records.jsonl" || true
      echo "bench block-$config-$dtype $dev $rc $(since "$t0")" >>"$res/bench.txt"
      [ "$rc" = 0 ] || failures=$((failures + 1))
      echo "[block ${i}/${#BLOCK_CASES[@]}] $config $dtype on $dev device(s): $(grep -c '^{' "$res/block_${config}_${dev}_$dtype.out") records, exit $rc, $(since "$t0") s"
      grep -h 'attention\|allocations' "$res/block_${config}_${dev}_$dtype.log" | head -n 2 | sed 's/^/        /' || true
    done
    t0="$(now)"
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      echo "[peer] PyTorch: the layer, eager and torch.compile (its warm-up takes most of a minute) ..."
      rc=0
      timeout 300 python3 "$ROOT/benchmarks/peers/block_torch.py" "${BLOCK_PEER_ARGS[@]}" >"$res/block_torch.out" \
        2>"$res/block_torch.log" || rc=$?
      grep '^{' "$res/block_torch.out" >>"$res/records.jsonl" || true
      echo "        $(grep -c '^{' "$res/block_torch.out") records, exit $rc, $(since "$t0") s"
      [ "$rc" = 0 ] || echo "peer block_torch failed (exit $rc): see $res/block_torch.log" >>"$res/notes.txt"
    fi
  fi

  # --profile: one step under Nsight Compute (kernel times), and its wall time without it.
  if [ "$profile" = 1 ]; then
    local ncu="" c
    for c in "$(command -v ncu || true)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
      if [ -n "$c" ] && [ -x "$c" ]; then ncu="$c"; break; fi
    done
    local pbin="$bench"
    if [ -z "$PROFILE_ARGS" ] && [ -n "$block" ]; then
      pbin="$block" PROFILE_ARGS="--config gpt2 --devices 1 --profile-step"
    elif [ -n "$block" ] && [[ "$PROFILE_ARGS" == --config* ]]; then
      pbin="$block"  # the layer's benchmark's arguments (--config NAME --dtype ... --profile-step)
    elif [ -z "$PROFILE_ARGS" ]; then
      PROFILE_ARGS="--part mlp --devices 1 --profile-step"
    fi
    if [ -z "$pbin" ]; then
      echo "profile: not run (no bench_gpu in $out)" >>"$res/notes.txt"
    elif [ -z "$ncu" ]; then
      echo "profile: not run (ncu, Nsight Compute's command line, is not on the PATH)" >>"$res/notes.txt"
    else
      t0="$(now)"
      echo "[profile] $pbin $PROFILE_ARGS: its wall time, then under ncu ..."
      local pargs
      read -r -a pargs <<<"$PROFILE_ARGS"
      rc=0
      timeout 60 "$out/$pbin" --backend threads "${pargs[@]}" >"$res/profile_wall.out" 2>"$res/profile_wall.log" || rc=$?
      if [ "$rc" = 0 ]; then
        timeout 120 "$ncu" --metrics gpu__time_duration.sum --kernel-name-base demangled --profile-from-start off \
          -f -o "$res/profile" "$out/$pbin" --backend threads "${pargs[@]}" >"$res/profile_ncu.log" 2>&1 || rc=$?
      fi
      if [ "$rc" = 0 ]; then  # ncu's own per-kernel summary, and each launch as CSV for the summary
        "$ncu" --import "$res/profile.ncu-rep" --print-summary per-kernel >"$res/profile_summary.txt" 2>&1 || rc=$?
        "$ncu" --import "$res/profile.ncu-rep" --csv >"$res/profile_kernels.csv" 2>&1 || rc=$?
      fi
      echo "        exit $rc, $(since "$t0") s"
      [ "$rc" = 0 ] || echo "profile: failed (exit $rc): see $res/profile_*.log" >>"$res/notes.txt"
    fi
  fi

  since "$t_all" >"$res/seconds.txt"
  python3 "$ROOT/scripts/gpu_check_summary.py" "$out" || failures=$((failures + 1))
  [ "$failures" = 0 ] || exit 1
}

case "$mode" in
  build) do_build ;;
  run) do_run ;;
  all)
    check_kokkos
    check_gpu
    do_build
    do_run
    ;;
esac
