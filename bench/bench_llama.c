/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_llama.c — kvdb-bench llama: kvdb as llama.cpp's prefix cache (SmolLM2-135M
 * through llama-cpp-python) and the Python package against the C API.
 *
 * First the C API's put and get throughput on SmolLM2-shaped KV (30 layers, 3 KV heads,
 * head_dim 64, f16, 64-token blocks; contexts of 1,024 tokens in the packed LKTHD layout;
 * 12 contexts = 283 MB, --quick 4), durable puts, the DRAM tier off; the best of two puts (into
 * fresh databases) and of three get passes. The bytes of element i of context c are ((i * 2654435761 + c * 40503) >> 7) & 0x3BFF
 * as f16 bits: python/kvdb/llama_bench.py makes the same ones. Then it hands over to that
 * script (the repository's .venv/bin/python, or $KVDB_PYTHON, with KVDB_LIB naming this build's
 * libkvdb.so), which measures the same put/get through numpy views -- C and Python rounds
 * alternate, 3 each (--quick 2), the best of each side kept: py_put_vs_c, py_get_vs_c; the
 * gets of both sides read the database the C puts of the round wrote, C first in even rounds
 * and Python first in odd ones (the same files:
 * this machine's shared disk reads one set of files at 0.8 GB/s and the next at 2.5, so two
 * sides reading their own databases measured the disk, not the binding) -- and
 * then the TTFT curve with llama.cpp (ttft_ratio_hit25..99, continuations_identical,
 * n_prompts); its '@json NAME VALUE' lines become fields of this JSON line. Without the virtual
 * environment the Python part is reported as skipped (llama_skipped) and the C figures stay.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "kvdb.h"

#define LL_TOKENS 1024

static void fill_pattern(uint16_t *p, size_t n, uint64_t c)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (uint16_t)((((uint64_t)i * 2654435761u + c * 40503u) >> 7) & 0x3BFF);
}

/* Close *db and open env->dir/c-putget<round>-<rep> (no DRAM tier) in its place: 0, or -1
 * (said; *db NULL). */
static int open_putget(const bench_env *env, int round, int rep, kvdb **db)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/c-putget%d-%d", env->dir, round, rep);
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  kvdb_close(*db);
  *db = NULL;
  if (kvdb_open(path, &o, db) != KVDB_OK) {
    bench_log("kvdb_open %s: %s", path, kvdb_errmsg());
    return -1;
  }
  return 0;
}

/* The C side of one round: its puts (put_gbps non-NULL: two fresh databases) or its gets
 * (get_gbps non-NULL: three passes over the second, through a fresh handle). */
static int c_put_get(const bench_env *env, size_t n_ctx, int round, double *put_gbps,
                     double *get_gbps)
{
  kvdb_model m = {"bench-llama-smollm2", 30, 3, 64, KVDB_F16, 64, 0};
  size_t bytes = LL_TOKENS * kvdb_model_token_bytes(&m);
  uint16_t **bufs = calloc(n_ctx, sizeof *bufs);
  uint16_t *out = bench_alloc(bytes);
  uint32_t *toks = malloc(LL_TOKENS * sizeof *toks);
  int rc = 1;
  kvdb *db = NULL;
  if (bufs == NULL || out == NULL || toks == NULL)
    goto done;
  for (size_t c = 0; c < n_ctx; c++) {
    if ((bufs[c] = bench_alloc(bytes)) == NULL)
      goto done;
    fill_pattern(bufs[c], bytes / 2, c);
  }
  /* puts: the best of two fresh databases; gets: the best of three passes over the second */
  uint64_t put_ns = UINT64_MAX, get_ns = UINT64_MAX, t0;
  for (int rep = 0; put_gbps != NULL && rep < 2; rep++) {
    if (open_putget(env, round, rep, &db) != 0)
      goto done;
    t0 = bench_now_ns();
    for (size_t c = 0; c < n_ctx; c++) {
      kvdb_kv_view v;
      for (uint32_t t = 0; t < LL_TOKENS; t++)
        toks[t] = (uint32_t)(c * 100000 + t);
      kvdb_kv_view_packed(&v, bufs[c], &m, LL_TOKENS, KVDB_LAYOUT_LKTHD);
      if (kvdb_put(db, &m, toks, LL_TOKENS, &v, NULL) != KVDB_OK) {
        bench_log("kvdb_put: %s", kvdb_errmsg());
        goto done;
      }
    }
    uint64_t ns = bench_now_ns() - t0;
    if (ns < put_ns)
      put_ns = ns;
  }
  /* the gets through a fresh handle on the second database, as the script does */
  if (get_gbps != NULL && open_putget(env, round, 1, &db) != 0)
    goto done;
  for (int pass = 0; get_gbps != NULL && pass < 3; pass++) {
    t0 = bench_now_ns();
    for (size_t c = 0; c < n_ctx; c++) {
      kvdb_kv_view v;
      size_t hit = 0;
      for (uint32_t t = 0; t < LL_TOKENS; t++)
        toks[t] = (uint32_t)(c * 100000 + t);
      kvdb_kv_view_packed(&v, out, &m, LL_TOKENS, KVDB_LAYOUT_LKTHD);
      if (kvdb_get(db, &m, toks, LL_TOKENS, &v, &hit) != KVDB_OK || hit != LL_TOKENS) {
        bench_log("kvdb_get: hit %zu: %s", hit, kvdb_errmsg());
        goto done;
      }
    }
    uint64_t ns = bench_now_ns() - t0;
    if (ns < get_ns)
      get_ns = ns;
  }
  if (get_gbps != NULL && memcmp(out, bufs[n_ctx - 1], bytes) != 0) {
    bench_log("the KV read back differs");
    goto done;
  }
  if (put_gbps != NULL) {
    *put_gbps = bench_gbps(n_ctx * bytes, put_ns);
    fprintf(env->out, "C API put: %.0f MB, %.3f GB/s\n", (double)(n_ctx * bytes) / 1e6,
            *put_gbps);
  }
  if (get_gbps != NULL) {
    *get_gbps = bench_gbps(n_ctx * bytes, get_ns);
    fprintf(env->out, "C API get: %.0f MB, %.3f GB/s\n", (double)(n_ctx * bytes) / 1e6,
            *get_gbps);
  }
  fflush(env->out);
  rc = 0;
done:
  kvdb_close(db);
  if (bufs != NULL)
    for (size_t c = 0; c < n_ctx; c++)
      bench_free(bufs[c]);
  free(bufs);
  bench_free(out);
  free(toks);
  return rc;
}

/* The figures named py_put_gbps and py_get_gbps go to best[0] / best[1] (the best is kept), not
 * to the JSON line. */
static int take_best(void *arg, const char *name, const char *value)
{
  double *best = arg;
  if (strcmp(name, "py_put_gbps") != 0 && strcmp(name, "py_get_gbps") != 0)
    return 0;
  double *d = &best[name[3] == 'p' ? 0 : 1], x = strtod(value, NULL);
  if (x > *d)
    *d = x;
  return 1;
}

/* Run the script's part `part` ("putget" or "ttft"), echoing its report and taking its fields;
 * best: the best Python put and get GB/s so far. */
static int run_py(const bench_env *env, bench_json *j, const char *py, const char *part, int round,
                  double best[2])
{
  char cmd[8192];
  char get_db[4200] = "";
  if (strcmp(part, "putget") == 0) /* its gets read the database the C gets just read */
    snprintf(get_db, sizeof get_db, " --get-db '%s/c-putget%d-1'", env->dir, round);
  snprintf(cmd, sizeof cmd, "'%s' -m kvdb.llama_run bench --json --part %s --dir '%s/py%d'%s%s",
           py, part, env->dir, round, get_db, env->quick ? " --quick" : "");
  int rc = bench_run_py(env, j, cmd, take_best, best);
  if (rc == 77)
    bench_log("the Python part (%s) exited 77", cmd);
  return rc != 0;
}

int bench_llama(const bench_env *env, bench_json *j)
{
  char py[4096];
  int have_py = bench_python(py, sizeof py);

  /* C and Python put/get in alternating rounds (this machine's disk is shared: the best of each
   * side over the rounds). Both sides' gets read the database the C puts wrote, C first in even
   * rounds and Python first in odd ones. */
  double c_put = 0, c_get = 0, py_best[2] = {0, 0}; /* Python's put, get */
  size_t n_ctx = env->quick ? 4 : 12;
  int rounds = env->quick ? 2 : 3;
  for (int r = 0; r < rounds; r++) {
    double p = 0, g = 0;
    if (c_put_get(env, n_ctx, r, &p, NULL) != 0)
      return 1;
    if (r % 2 == 0 && c_put_get(env, n_ctx, r, NULL, &g) != 0)
      return 1;
    if (have_py && run_py(env, j, py, "putget", r, py_best) != 0)
      return 1;
    if (r % 2 == 1 && c_put_get(env, n_ctx, r, NULL, &g) != 0)
      return 1;
    if (p > c_put)
      c_put = p;
    if (g > c_get)
      c_get = g;
  }
  bench_json_num(j, "c_put_gbps", c_put);
  bench_json_num(j, "c_get_gbps", c_get);
  if (!have_py) {
    fprintf(env->out, "Python part skipped: no %s (./setup.sh makes the .venv; it needs PyPI)\n",
            py);
    bench_json_str(j, "llama_skipped", "no .venv");
    return 0;
  }
  double py_put = py_best[0], py_get = py_best[1];
  bench_json_num(j, "py_put_gbps", py_put);
  bench_json_num(j, "py_get_gbps", py_get);
  bench_json_num(j, "py_put_vs_c", bench_ratio(py_put, c_put));
  bench_json_num(j, "py_get_vs_c", bench_ratio(py_get, c_get));
  fprintf(env->out, "put/get of %zu MB, best of %d alternating rounds: C put %.3f GB/s, get %.3f; "
          "Python put %.3f (%.3fx C), get %.3f (%.3fx C)\n",
          n_ctx * LL_TOKENS * 23040 / 1000000, rounds, c_put, c_get, py_put,
          bench_ratio(py_put, c_put), py_get, bench_ratio(py_get, c_get));
  return run_py(env, j, py, "ttft", 0, py_best);
}
