#!/bin/sh
# SPDX-License-Identifier: MIT
# scripts/gpu-check.sh BUILD_DIR [DATA_DIR] — the checks that need a GPU, run directly from a
# build folder made elsewhere (meson + ninja, CUDA found): no meson, no compiler, no network.
# scripts/gpu-check.sh --pack BUILD_DIR OUT_DIR — on the build machine: copy what the checks
# need (the three programs, libkvdb and every shared library they load but glibc's, this script)
# into OUT_DIR, a few MiB to carry; then, on the GPU machine: OUT_DIR/gpu-check.sh OUT_DIR.
#
#   1. BUILD_DIR/tests/test_score_cuda gpu   the CUDA scorer against the CPU scorer (test score-cuda-gpu)
#   2. BUILD_DIR/tests/test_gpu host         libkvgpu's pipeline on the emulated device (sanity)
#   3. BUILD_DIR/tests/test_gpu gpu          libkvgpu round trips on CUDA device 0 (test gpu-gpu)
#   4. BUILD_DIR/bench/kvdb-bench prefetch --quick --json with KVDB_BENCH_PARTS=gpu: kvdb_gpu_get
#      into device memory vs a pinned cudaMemcpy (gpu_get_vs_cudamemcpy); under 60 s
#
# Each prints one line "PASS name", "FAIL name (exit N)" or "SKIP name: reason"; the bench's
# JSON line is printed after "JSON ". Data goes under DATA_DIR (default $TMPDIR or /var/tmp;
# about 200 MiB, removed). The shared libraries the binaries need (liblmdb, libzstd, liburing,
# libxxhash, libjansson; cudart is linked in statically) must be found: LD_LIBRARY_PATH.
# Exit status: 0 when everything passed, 1 when something failed, 2 when something skipped
# (on a GPU machine a skip means no usable GPU was seen: read its reason).
set -u
if [ "${1:-}" = --pack ]; then
  B=${2:?usage: scripts/gpu-check.sh --pack BUILD_DIR OUT_DIR}
  O=${3:?usage: scripts/gpu-check.sh --pack BUILD_DIR OUT_DIR}
  mkdir -p "$O/tests" "$O/bench" "$O/lib" || exit 1
  for f in tests/test_score_cuda tests/test_gpu bench/kvdb-bench; do
    [ -x "$B/$f" ] || { echo "gpu-check: $B/$f is missing (build it: ninja -C $B $f)"; exit 1; }
    cp "$B/$f" "$O/$f" || exit 1
    # every library it loads but the C library's own (glibc is on every machine)
    ldd "$B/$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
      grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
      while read -r lib; do cp -L "$lib" "$O/lib/" || exit 1; done
  done
  cp "$0" "$O/gpu-check.sh" && chmod +x "$O/gpu-check.sh"
  echo "gpu-check: packed into $O ($(du -sh "$O" | cut -f1)):"; ls "$O/lib"
  exit 0
fi
B=${1:?usage: scripts/gpu-check.sh BUILD_DIR [DATA_DIR]}
# a packed folder brings its libraries
[ -d "$B/lib" ] && export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
DATA=${2:-${TMPDIR:-/var/tmp}}
fail=0
skip=0
out=$(mktemp "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT INT TERM

echo "gpu-check: build $B, data under $DATA, $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu-check: nvidia-smi: /'

# run NAME TIMEOUT_S CMD...: one PASS/FAIL/SKIP line, the command's output indented after a
# failure or skip (always for the bench).
run() {
  name=$1; t=$2; shift 2
  if [ ! -x "$1" ]; then
    echo "FAIL $name (missing: $1)"; fail=1; return
  fi
  missing=$(ldd "$1" 2>/dev/null | grep 'not found' | tr -s ' \t' ' ')
  [ -n "$missing" ] && echo "gpu-check: $name: libraries not found:$missing"
  timeout "$t" "$@" >"$out" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "PASS $name"
  elif [ $rc -eq 77 ]; then
    echo "SKIP $name: $(grep -m1 'SKIP' "$out" || tail -n1 "$out")"; skip=1
  else
    [ $rc -eq 124 ] && why="timed out after ${t}s" || why="exit $rc"
    echo "FAIL $name ($why)"; fail=1
    sed 's/^/    /' "$out" | tail -n 40
  fi
}

export KVDB_SHARED_DIR="${KVDB_SHARED_DIR:-/nonexistent}" MALLOC_PERTURB_=165
run score-cuda-gpu 180 "$B/tests/test_score_cuda" gpu
run gpu-host 120 "$B/tests/test_gpu" host
run gpu-gpu 120 "$B/tests/test_gpu" gpu
grep -m1 '^device:' "$out" | sed 's/^/gpu-check: gpu-gpu /'

mkdir -p "$DATA"
export KVDB_BENCH_PARTS=gpu
run bench-prefetch-gpu 120 "$B/bench/kvdb-bench" prefetch --quick --json --dir "$DATA"
grep -v '^{' "$out" | sed -n '/^gpu/,$p' | sed 's/^/    /'
json=$(tail -n 1 "$out")
case $json in
  '{'*) echo "JSON $json" ;;
  *) echo "FAIL bench-prefetch-gpu (no JSON line)"; fail=1 ;;
esac
case $json in
  *'"gpu_skip"'*) echo "SKIP bench-prefetch-gpu: no usable GPU (see gpu_skip)"; skip=1 ;;
esac

if [ $fail -ne 0 ]; then echo "gpu-check: FAIL"; exit 1; fi
if [ $skip -ne 0 ]; then echo "gpu-check: SKIPPED (no GPU used)"; exit 2; fi
echo "gpu-check: PASS"
