#!/bin/bash
# The one prepared command for a GPU machine: build beamd with CUDA for the
# H200 (sm_90), run the GPU cross-checks, then the GPU benchmarks, each
# with its own time limit, inside one overall budget. Keeps going when a
# step fails, records every step, and exits non-zero if any GPU check or
# benchmark failed.
#
#   OUT=/some/dir tools/gpu-check.sh          (from the repository root or anywhere)
#   tools/gpu-check.sh --pack [FILE]          (here, no GPU needed: see Prebuilt)
#
# Writes to $OUT (default build/gpu-check-out):
#   machine.txt        nvidia-smi -L and its query, nvcc --version, CPU, memory
#   deps.txt           what the build needs and what was found
#   build.log          make output
#   check-gpu.log      BEAM_REQUIRE_GPU=1 tests/run-unit.sh over tests/gpu/*
#   pca.log, xpcs_multitau.log, twotime.log, twotime_f64.log, ptycho_gpu.log,
#   fit_cuda.log (XANI-shaped 4M x T=100 uint16, thread per fit, given
#   starts, launch variant 0), fit_cuda_lb4.log / fit_cuda_lb3.log (the
#   same, variants 1 and 2: __launch_bounds__(128, 4) and (128, 3)),
#   fit_cuda_t1000.log (256k x T=1000, warp per fit), fit_cuda_auto.log
#   (4M x T=100, starts made on the device),
#   fit_cuda_auto_t1000.log (64k x T=1000, device starts),
#   fit_cuda_auto_host.log (64k x T=100, the host starts, for comparison);
#   each JSON line names the mapping, variant, block and starts that ran
#   ptycho_gpu.json    ptycho_gpu --json
#   summary.txt        one line per step (ok / FAILED / TIMEOUT, seconds) and
#                      the key lines of every log
#   gpu-check.log      everything this script printed
#
# Environment:
#   OUT                      output directory
#   JOBS                     make -j (default: nproc)
#   CUDA_ARCH                default 90 (H200)
#   GPU_CHECK_BUILD          build directory (default build/gpu)
#   GPU_CHECK_BUDGET_S       wall-clock budget for the whole script, default
#                            420: a step never runs past it, and a step that
#                            finds under 15 s left is recorded as NOT RUN
#   GPU_CHECK_ALLOW_NO_GPU=1 run without a GPU (the checks and benchmarks then
#                            skip themselves); without it the script stops at
#                            once when nvidia-smi shows no GPU
#   GPU_CHECK_PTYCHO_ARGS    arguments for ptycho_gpu (default "--iters 20")
#   GPU_CHECK_MODE           auto (default), source or prebuilt
#   GPU_CHECK_PREBUILT       the prebuilt archive (default build/gpu-prebuilt.tar.xz)
#
# It never installs anything (no apt): a missing compiler, library or
# header is named with its Debian package in deps.txt and on the screen.
#
# Prebuilt: the GPU machine's image may lack the -dev packages (libzmq,
# hdf5, openblas, cmocka, ...). `--pack` builds the GPU tests and the four
# GPU benchmarks here (CUDA_ARCH=90), strips them and packs them with every
# shared library they load except the C runtime and CUDA's own (libc,
# libstdc++, libcudart, libcufft, libcublas: the GPU machine's are used)
# into one archive (about 15 MB) to carry. In mode auto the script builds
# from source when everything is there, and otherwise unpacks that archive
# and runs its binaries (LD_LIBRARY_PATH = its lib/ plus the CUDA library
# folders found there); mode source never does, mode prebuilt always does.
# The archive records a digest of the sources it was built from, and the
# summary says whether the tree still matches it.
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-check-out}
mkdir -p "$OUT" || { echo "gpu-check: cannot create OUT=$OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-$(nproc)}
ARCH=${CUDA_ARCH:-90}
BUILD=${GPU_CHECK_BUILD:-build/gpu}
BUDGET=${GPU_CHECK_BUDGET_S:-420}
ALLOW_NO_GPU=${GPU_CHECK_ALLOW_NO_GPU:-0}
PTYCHO_ARGS=${GPU_CHECK_PTYCHO_ARGS:---iters 20}
MODE=${GPU_CHECK_MODE:-auto}
PREBUILT=${GPU_CHECK_PREBUILT:-build/gpu-prebuilt.tar.xz}
PACK=""
if [ "${1:-}" = --pack ]; then
  PACK=${2:-build/gpu-prebuilt.tar.xz}
elif [ $# -gt 0 ]; then
  echo "usage: [OUT=dir] tools/gpu-check.sh | tools/gpu-check.sh --pack [FILE]" >&2
  exit 2
fi
case $MODE in auto | source | prebuilt) ;; *)
  echo "gpu-check: GPU_CHECK_MODE must be auto, source or prebuilt" >&2
  exit 2
  ;;
esac
RUNENV=(env)
T_START=$(date +%s)
DEADLINE=$((T_START + BUDGET))
STEPS=$OUT/.steps
: >"$STEPS"
exec > >(tee "$OUT/gpu-check.log") 2>&1
failed=0

say() { echo "gpu-check: $*"; }
# The sources a build depends on, as one digest (a prebuilt archive is
# compared with the tree it runs in).
src_digest() {
  find Makefile daemon gpu pipeline proto bench tests/common tests/gpu -type f \
    \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name Makefile \) -print0 2>/dev/null |
    sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
record() { # name status seconds log
  printf '%-22s %-28s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$STEPS"
}

# run_step NAME LIMIT_S LOG CMD...: runs CMD with its output in LOG under
# timeout min(LIMIT_S, what is left of the budget); records the outcome.
run_step() {
  local name=$1 lim=$2 log=$3
  shift 3
  local left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 15 ]; then
    record "$name" "NOT RUN (budget spent)" 0 "-"
    failed=1
    return 1
  fi
  [ "$lim" -gt "$left" ] && lim=$left
  say "$name (limit ${lim}s) -> $log"
  echo "\$ $*" >"$log"
  local t0 rc dt status
  t0=$(date +%s)
  timeout -k 10 "$lim" "$@" >>"$log" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  if [ "$rc" = 0 ]; then
    status=ok
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status="TIMEOUT after ${lim}s"
    echo "# gpu-check: killed after ${lim}s" >>"$log"
  else
    status="FAILED rc=$rc"
  fi
  record "$name" "$status" "$dt" "$log"
  [ "$status" = ok ] || failed=1
  [ "$status" = ok ]
}

# ---- the machine ------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm); $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "\$ nvidia-smi -L"
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
      --format=csv 2>&1
  else
    echo "nvidia-smi: not found"
  fi
  echo "\$ nvcc --version"
  if command -v nvcc >/dev/null 2>&1; then nvcc --version 2>&1; elif [ -x /usr/local/cuda/bin/nvcc ]; then
    /usr/local/cuda/bin/nvcc --version 2>&1
  else echo "nvcc: not found"; fi
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"

have_gpu=0
if [ -n "$PACK" ]; then
  : # packing needs no GPU
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  have_gpu=1
fi
if [ "$have_gpu" = 0 ] && [ -z "$PACK" ]; then
  if [ "$ALLOW_NO_GPU" != 1 ]; then
    say "no NVIDIA GPU visible (nvidia-smi $(command -v nvidia-smi >/dev/null 2>&1 && echo 'lists none' ||
      echo 'is not installed')). This script measures a GPU: run it on the GPU machine, or set" \
      "GPU_CHECK_ALLOW_NO_GPU=1 to build and run everything here with the GPU steps skipping."
    echo "no GPU: stopped before the build (set GPU_CHECK_ALLOW_NO_GPU=1 to run anyway)" >"$OUT/summary.txt"
    exit 3
  fi
  say "no GPU visible; GPU_CHECK_ALLOW_NO_GPU=1: the checks and benchmarks will skip themselves"
fi

# ---- what the build needs (Makefile: PKGS, PKG_LIBS, test and tool links) -----
NVCC=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
export CUDA_HOME=${CUDA_HOME:-$([ -n "$NVCC" ] && dirname "$(dirname "$(readlink -f "$NVCC")")")}
missing="" optional=""
need() { missing="$missing
  $1"; }
{
  for t in make:make cc:gcc pkg-config:pkg-config timeout:coreutils; do
    command -v "${t%%:*}" >/dev/null 2>&1 || need "command ${t%%:*} (Debian package ${t#*:})"
  done
  [ -n "$NVCC" ] || need "nvcc (the CUDA toolkit; put it on PATH or set CUDA_HOME)"
  for m in libzmq:libzmq3-dev libuv:libuv1-dev yaml-0.1:libyaml-dev hdf5:libhdf5-dev fftw3:libfftw3-dev \
    fftw3f:libfftw3-dev jansson:libjansson-dev liblz4:liblz4-dev libsystemd:libsystemd-dev \
    openblas:libopenblas-dev cmocka:libcmocka-dev; do
    if pkg-config --exists "${m%%:*}" 2>/dev/null; then
      echo "pkg-config ${m%%:*}: $(pkg-config --modversion "${m%%:*}")"
    else
      need "pkg-config module ${m%%:*} (Debian package ${m#*:})"
    fi
  done
  tmp=$(mktemp -d)
  echo 'int main(void) { return 0; }' >"$tmp/t.c"
  for l in lapacke:liblapacke-dev fftw3f_threads:libfftw3-dev fftw3_threads:libfftw3-dev cmocka:libcmocka-dev; do
    if cc "$tmp/t.c" -o "$tmp/t" -l"${l%%:*}" 2>/dev/null; then echo "library -l${l%%:*}: links"; else
      need "library -l${l%%:*} (Debian package ${l#*:})"
    fi
  done
  for h in lapacke.h:liblapacke-dev cmocka.h:libcmocka-dev; do
    printf '#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <%s>\n' \
      "${h%%:*}" >"$tmp/h.c"
    # shellcheck disable=SC2046
    if cc -E $(pkg-config --cflags openblas 2>/dev/null) "$tmp/h.c" -o /dev/null 2>/dev/null; then
      echo "header ${h%%:*}: found"
    else need "header ${h%%:*} (Debian package ${h#*:})"; fi
  done
  for l in cudart cufft cublas; do
    if [ -e "$CUDA_HOME/lib64/lib$l.so" ] || ldconfig -p 2>/dev/null | grep -q "lib$l\.so "; then
      echo "CUDA library lib$l: found"
    else need "CUDA library lib$l.so (in \$CUDA_HOME/lib64 = $CUDA_HOME/lib64; the CUDA toolkit's lib$l)"; fi
  done
  # only the tools beamd-ptycho (MPI, libpng) and beamd-view (libwebsockets) need these
  pkg-config --exists ompi-c 2>/dev/null || optional="$optional libopenmpi-dev"
  pkg-config --exists libwebsockets 2>/dev/null || optional="$optional libwebsockets-dev"
  cc "$tmp/t.c" -o "$tmp/t" -lpng 2>/dev/null || optional="$optional libpng-dev"
  rm -rf "$tmp"
  echo "CUDA_HOME=$CUDA_HOME nvcc=${NVCC:-none}"
} >"$OUT/deps.txt" 2>&1
[ -n "$missing" ] && echo "missing:$missing" >>"$OUT/deps.txt"
[ -n "$optional" ] && echo "optional, missing (tools beamd-ptycho / beamd-view not built):$optional" >>"$OUT/deps.txt"
use_prebuilt=0
if [ "$MODE" = prebuilt ] || { [ -n "$missing" ] && [ "$MODE" = auto ] && [ -z "$PACK" ] && [ -f "$PREBUILT" ]; }; then
  use_prebuilt=1
elif [ -n "$missing" ]; then
  say "the build cannot start; missing (install them first; this script does not run apt):$missing"
  say "or carry an archive made with 'tools/gpu-check.sh --pack' on a machine that has them" \
    "(GPU_CHECK_PREBUILT=$PREBUILT: $([ -f "$PREBUILT" ] && echo "present, but GPU_CHECK_MODE=$MODE" || echo absent))"
  {
    echo "build dependencies missing: stopped before the build"
    echo "missing:$missing"
  } >"$OUT/summary.txt"
  exit 4
else
  [ -n "$optional" ] && say "missing$optional: building only what the GPU checks need (not 'all')"
  say "build dependencies present (deps.txt)"
fi

GPU_TESTS_REL=$(for f in tests/gpu/test_*.c; do t=${f##*/}; echo "tests/${t%.c}"; done)
BENCHES="pca xpcs_multitau twotime ptycho_gpu fit"
BINS_REL="$GPU_TESTS_REL $(for b in $BENCHES; do echo "bench/$b"; done)"
MAKE=(make -j"$JOBS" CUDA=1 CUDA_ARCH="$ARCH" BUILD="$BUILD" CUDA_HOME="$CUDA_HOME")
# the binaries the checks run, as make targets
TARGETS=()
for b in $BINS_REL; do TARGETS+=("$BUILD/$b"); done

# ---- --pack: build here, archive binaries + their libraries --------------------------
if [ -n "$PACK" ]; then
  "${MAKE[@]}" "${TARGETS[@]}" || { say "pack: build failed"; exit 1; }
  stage=$(mktemp -d)
  dst=$stage/gpu-prebuilt
  mkdir -p "$dst/tests" "$dst/bench" "$dst/lib"
  for b in $BINS_REL; do strip -o "$dst/$b" "$BUILD/$b" || exit 1; done
  # every library the binaries load, except the C/C++ runtime and CUDA's
  for b in $BINS_REL; do ldd "$BUILD/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
    grep -Ev '^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libresolv|libstdc\+\+|libgcc_s|libcudart|libcufft|libcublas)' |
    while read -r so path; do cp -L "$path" "$dst/lib/$so" || exit 1; done || exit 1
  {
    echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -srm)"
    echo "sources: $(src_digest)"
    echo "glibc: $(ldd --version | head -1)"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep release)"
    echo "CUDA_ARCH: $ARCH"
    echo "cuda libraries expected on the GPU machine: $(for b in $BINS_REL; do ldd "$BUILD/$b"; done |
      awk '$1 ~ /^lib(cudart|cufft|cublas)/ {print $1}' | sort -u | tr '\n' ' ')"
    echo "libraries: $(find "$dst/lib" -type f -printf '%f ' | tr -s ' ')"
  } >"$dst/MANIFEST"
  mkdir -p "$(dirname "$PACK")"
  tar -C "$stage" -cJf "$PACK" gpu-prebuilt || exit 1
  rm -rf "$stage"
  say "packed $(du -h "$PACK" | cut -f1) into $PACK:"
  sed 's/^/  /' <(tar -xJOf "$PACK" gpu-prebuilt/MANIFEST)
  exit 0
fi

# ---- build (or unpack the prebuilt archive) -------------------------------------------
if [ "$use_prebuilt" = 1 ]; then
  BUILD=$BUILD-prebuilt
  if [ ! -f "$PREBUILT" ]; then
    record build "FAILED (no $PREBUILT)" 0 "-"
    failed=1
  else
    rm -rf "$BUILD" && mkdir -p "$BUILD" && tar -C "$BUILD" --strip-components=1 -xJf "$PREBUILT"
    cudadirs=""
    for l in libcudart.so libcufft.so libcublas.so; do
      [ -e "$CUDA_HOME/lib64/$l" ] || ldconfig -p 2>/dev/null | grep -q "$l" && continue
      d=$(find /usr/local /opt /usr/lib -name "$l.*" -print -quit 2>/dev/null)
      [ -n "$d" ] && cudadirs="$cudadirs:$(dirname "$d")"
    done
    # only for the beamd binaries: the system's own tools keep their libraries
    RUNENV=(env "LD_LIBRARY_PATH=$ROOT/$BUILD/lib${cudadirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    cur=$(src_digest)
    {
      echo "prebuilt $PREBUILT (missing here:$(echo "$missing" | tr '\n' ' ' | sed 's/ (Debian package [^)]*)//g; s/pkg-config module //g' | tr -s ' '))"
      sed 's/^/  /' "$BUILD/MANIFEST"
      echo "  sources here: $cur ($(grep -q "sources: $cur" "$BUILD/MANIFEST" && echo "the same" ||
        echo "DIFFERENT: the archive is stale"))"
      echo "  ${RUNENV[1]}"
      for b in $BINS_REL; do "${RUNENV[@]}" ldd "$BUILD/$b" | grep 'not found' | sed "s|^|  $b: |"; done
    } >"$OUT/build.log" 2>&1
    cat "$OUT/build.log"
    if grep -q 'not found' "$OUT/build.log"; then
      record build "FAILED (prebuilt: library not found)" 0 "$OUT/build.log"
      failed=1
    else
      record build "prebuilt (no build)" 0 "$OUT/build.log"
    fi
  fi
elif [ -n "$optional" ]; then
  run_step build 300 "$OUT/build.log" "${MAKE[@]}" "${TARGETS[@]}"
else
  if ! run_step build 300 "$OUT/build.log" "${MAKE[@]}" all; then
    # something outside the GPU path may have failed: still try to get what the checks need
    run_step build-needed 300 "$OUT/build-needed.log" "${MAKE[@]}" -k "${TARGETS[@]}"
  fi
fi

# ---- GPU cross-checks -------------------------------------------------------------
present_tests=""
for t in $GPU_TESTS_REL; do [ -x "$BUILD/$t" ] && present_tests="$present_tests $BUILD/$t"; done
if [ -z "$present_tests" ]; then
  record check-gpu "NOT RUN (no test built)" 0 "-"
  failed=1
else
  req=1
  [ "$have_gpu" = 1 ] || req=0
  # shellcheck disable=SC2086
  run_step check-gpu 200 "$OUT/check-gpu.log" "${RUNENV[@]}" BEAM_REQUIRE_GPU=$req tests/run-unit.sh $present_tests
fi

# ---- benchmarks ---------------------------------------------------------------------
bench() { # name limit log args...
  local name=$1 lim=$2 log=$3 bin=$BUILD/bench/$4
  shift 4
  if [ ! -x "$bin" ]; then
    record "$name" "NOT RUN (not built)" 0 "-"
    failed=1
    return
  fi
  run_step "$name" "$lim" "$log" "${RUNENV[@]}" "$bin" "$@"
  # a GPU the driver shows but the CUDA runtime cannot use is a failure
  if [ "$have_gpu" = 1 ] && grep -q '^skipped: no GPU' "$log"; then
    record "$name" "FAILED (skipped: no GPU)" 0 "$log"
    failed=1
  fi
}
bench pca 90 "$OUT/pca.log" pca --backend cuda
bench xpcs_multitau 90 "$OUT/xpcs_multitau.log" xpcs_multitau --backend cuda
bench twotime 90 "$OUT/twotime.log" twotime --backend cuda --frames 10000 --pixels 50000 --float32
bench twotime_f64 60 "$OUT/twotime_f64.log" twotime --backend cuda --frames 10000 --pixels 50000
# the batched fitter: data made in the binary (--synth), starts given, so
# the kernel time is the fused LM alone (docs/fit.md, CUDA)
bench fit_cuda 120 "$OUT/fit_cuda.log" fit --synth --fits 4194304 --points 100 --u16 --init given \
  --impl cuda --reps 5 --variant 0
# the same with registers capped at 128 (4 blocks of 128 per SM instead of
# 2) and at 168 (3 blocks): docs/fit.md "Register pressure"
bench fit_cuda_lb4 90 "$OUT/fit_cuda_lb4.log" fit --synth --fits 4194304 --points 100 --u16 \
  --init given --impl cuda --reps 5 --variant 1
bench fit_cuda_lb3 90 "$OUT/fit_cuda_lb3.log" fit --synth --fits 4194304 --points 100 --u16 \
  --init given --impl cuda --reps 5 --variant 2
bench fit_cuda_t1000 90 "$OUT/fit_cuda_t1000.log" fit --synth --fits 262144 --points 1000 --u16 \
  --init given --impl cuda --reps 3
# automatic starts on the device (gpu/fit_init_cuda.cuh): cuda.guess_s is
# their device time; the host's starts (fit_init.c, one core) on a smaller
# batch for the comparison
bench fit_cuda_auto 120 "$OUT/fit_cuda_auto.log" fit --synth --fits 4194304 --points 100 --u16 \
  --init auto --impl cuda --reps 3
bench fit_cuda_auto_t1000 90 "$OUT/fit_cuda_auto_t1000.log" fit --synth --fits 65536 --points 1000 \
  --u16 --init auto --impl cuda --reps 2
bench fit_cuda_auto_host 60 "$OUT/fit_cuda_auto_host.log" fit --synth --fits 65536 --points 100 \
  --u16 --init auto --starts host --impl cuda --reps 1
# shellcheck disable=SC2086
bench ptycho_gpu 150 "$OUT/ptycho_gpu.log" ptycho_gpu $PTYCHO_ARGS --json "$OUT/ptycho_gpu.json"

# ---- summary ----------------------------------------------------------------------------
{
  echo "beamd gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(($(date +%s) - T_START)) s of a ${BUDGET} s budget," \
    "build $BUILD ($([ "$use_prebuilt" = 1 ] && echo prebuilt || echo "CUDA_ARCH=$ARCH, -j$JOBS"))"
  grep -E '^GPU |^date|^host|^memory' "$OUT/machine.txt"
  grep -A1 '^name, driver_version' "$OUT/machine.txt"
  grep -E 'release|^Build cuda' "$OUT/machine.txt" | head -2
  [ "$use_prebuilt" = 1 ] && grep -E '^prebuilt|^  (built|sources)' "$OUT/build.log"
  [ "$have_gpu" = 1 ] || echo "NO GPU: run with GPU_CHECK_ALLOW_NO_GPU=1; the GPU steps skipped themselves"
  echo
  echo "== steps"
  cat "$STEPS"
  echo
  echo "== check-gpu"
  if [ -f "$OUT/check-gpu.log" ]; then
    grep -E '^unit:|^unit failures|timed out|^\[  FAILED  \]|but no GPU|^# GPU:' "$OUT/check-gpu.log" | sort -u
    echo "cmocka tests passed: $(grep -E '^\[  PASSED  \] [0-9]+' "$OUT/check-gpu.log" |
      awk '{s += $4} END {print s + 0}'), skipped: $(grep -c '^\[  SKIPPED \]' "$OUT/check-gpu.log")"
  fi
  for b in pca xpcs_multitau twotime twotime_f64 ptycho_gpu fit_cuda fit_cuda_lb4 fit_cuda_lb3 fit_cuda_t1000 \
    fit_cuda_auto fit_cuda_auto_t1000 fit_cuda_auto_host; do
    f=$OUT/$b.log
    [ -f "$f" ] || continue
    echo
    echo "== $b"
    grep -E '"impl": "cuda"|backend=cuda|stage end|stage process|^ptycho_gpu |^# ptycho_gpu|^skipped|CUDA backend on|error|rror:|killed after' "$f" |
      grep -v '^json:'
  done
  # the end of each failed step's log
  grep -E 'FAILED|TIMEOUT' "$STEPS" | awk '$NF != "-" {print $1, $NF}' | sort -u | while read -r n f; do
    echo
    echo "== $n: last lines of $f"
    tail -n 8 "$f"
  done
  echo
  if [ "$failed" = 0 ]; then echo "RESULT: ok"; else echo "RESULT: FAILED (see the steps above)"; fi
} >"$OUT/summary.txt"
rm -f "$STEPS"
echo
cat "$OUT/summary.txt"
exit "$failed"
