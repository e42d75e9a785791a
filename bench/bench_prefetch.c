/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_prefetch.c — `kvdb-bench prefetch` (issue 19, TierKV seed 003): the driver, and
 * the parts that are not the simulation (bench_prefetch_sim.c):
 *   fg    foreground get p99 while a prefetch reads the whole time ÷ without (admission control)
 *   ttft  a get of a prefetched prefix ÷ a get of a prefix a get put in the DRAM tier
 *   sim   the serving simulation (policies, K = 1..8)
 *   gpu   kvdb_gpu_get into device memory ÷ a pinned cudaMemcpy of the same bytes (libkvgpu;
 *         only where a CUDA device is usable)
 * KVDB_BENCH_PARTS (comma-separated, default all) picks parts; "gpu" alone needs no pool.
 *
 * THE POOL. Prefixes of log-normal length (median 768 tokens, sigma 0.5, rounded up to whole
 * 256-token blocks, 256..2048), distinct tokens each, KV of a model of 4 layers x 8 KV heads x
 * 128 dims in f16 (16 KiB a token, 4 MiB a block), pseudo-random finite values.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_prefetch.h"
#include "datagen.h"
#include "kvdb_gpu.h"

static const kvdb_model MODEL = {"bench-prefetch", 4, 8, 128, KVDB_F16, 256, 0};

void pf_sleep_ns(uint64_t ns)
{
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

kvdb *pf_open(const pf_pool *p, uint64_t dram, double prefetch_bps)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = dram;
  o.prefetch_bps = prefetch_bps;
  o.sync_mode = KVDB_SYNC_NONE;
  kvdb *db = NULL;
  if (kvdb_open(p->path, &o, &db) != KVDB_OK) {
    bench_log("kvdb_open %s: %s", p->path, kvdb_errmsg());
    return NULL;
  }
  return db;
}

static uint64_t ssd_hits(kvdb *db)
{
  kvdb_stats st;
  if (kvdb_stat(db, &st) != KVDB_OK)
    return 0;
  return st.tier[KVDB_TIER_SSD].hits;
}

uint64_t pf_get(kvdb *db, const pf_pool *p, size_t i, void *buf, int *dram_only)
{
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &p->m, p->len[i], KVDB_LAYOUT_LKTHD);
  uint64_t h0 = ssd_hits(db);
  size_t hit = 0;
  uint64_t t = bench_now_ns();
  kvdb_status rc = kvdb_get(db, &p->m, p->tok[i], p->len[i], &v, &hit);
  t = bench_now_ns() - t;
  if (rc != KVDB_OK || hit != p->len[i])
    bench_log("kvdb_get of prefix %zu: %s, %zu of %zu tokens (%s)", i, kvdb_status_name(rc), hit,
              p->len[i], kvdb_errmsg());
  *dram_only = ssd_hits(db) == h0;
  return t;
}

kvdb_prefetch_state pf_wait(kvdb *db, kvdb_prefetch_id id)
{
  kvdb_prefetch_info in;
  memset(&in, 0, sizeof in);
  for (int i = 0; i < 300000; i++) {
    if (kvdb_prefetch_poll(db, id, &in) != KVDB_OK || in.state >= KVDB_PREFETCH_DONE)
      break;
    pf_sleep_ns(100000);
  }
  return in.state;
}

static int want(const char *part)
{
  const char *s = getenv("KVDB_BENCH_PARTS");
  if (s == NULL || *s == 0)
    return 1;
  size_t n = strlen(part);
  for (const char *q = s; (q = strstr(q, part)) != NULL; q += n)
    if ((q == s || q[-1] == ',') && (q[n] == 0 || q[n] == ','))
      return 1;
  return 0;
}

/* Fill n tokens' KV (LKTHD f16) with finite pseudo-random values. */
static void fill_kv(uint16_t *buf, size_t elems, dg_rng *rng)
{
  for (size_t i = 0; i + 4 <= elems; i += 4) {
    uint64_t r = dg_next(rng);
    for (int k = 0; k < 4; k++)
      buf[i + (size_t)k] = (uint16_t)((r >> (16 * k)) & 0x7bff);
  }
}

static int pool_build(const bench_env *env, pf_pool *p, size_t n, size_t extra_len)
{
  memset(p, 0, sizeof *p);
  p->m = MODEL;
  bench_path(p->path, sizeof p->path, env->dir, "prefetch-db");
  p->n = n + (extra_len > 0);
  p->tok = calloc(p->n, sizeof *p->tok);
  p->len = calloc(p->n, sizeof *p->len);
  if (p->tok == NULL || p->len == NULL)
    return -1;
  dg_rng rng = {env->seed * 1000003 + 5};
  size_t bt = MODEL.block_tokens, tb = kvdb_model_token_bytes(&MODEL), maxlen = extra_len;
  for (size_t i = 0; i < n; i++) {
    double u1 = ((double)(dg_next(&rng) >> 11) + 1) / 9007199254740993.0;
    double u2 = (double)(dg_next(&rng) >> 11) / 9007199254740992.0;
    double g = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
    double len = 768.0 * exp(0.5 * g);
    size_t l = ((size_t)len + bt - 1) / bt * bt;
    p->len[i] = l < bt ? bt : l > 2048 ? 2048 : l;
    if (p->len[i] > maxlen)
      maxlen = p->len[i];
  }
  if (extra_len > 0)
    p->len[n] = extra_len;
  kvdb *db = pf_open(p, 0, 0);
  uint16_t *kv = bench_alloc(maxlen * tb);
  if (db == NULL || kv == NULL)
    return -1;
  uint64_t t = bench_now_ns();
  for (size_t i = 0; i < p->n; i++) {
    p->tok[i] = malloc(p->len[i] * sizeof(uint32_t));
    if (p->tok[i] == NULL)
      return -1;
    for (size_t k = 0; k < p->len[i]; k++)
      p->tok[i][k] = (uint32_t)(i * 100003 + k * 7 + 1) % 2000000000u;
    fill_kv(kv, p->len[i] * tb / 2, &rng);
    kvdb_kv_view v;
    kvdb_kv_view_packed(&v, kv, &MODEL, p->len[i], KVDB_LAYOUT_LKTHD);
    if (kvdb_put(db, &MODEL, p->tok[i], p->len[i], &v, NULL) != KVDB_OK) {
      bench_log("kvdb_put: %s", kvdb_errmsg());
      return -1;
    }
    p->bytes += p->len[i] * tb;
  }
  kvdb_close(db);
  bench_free(kv);
  fprintf(env->out, "pool: %zu prefixes, %.0f MiB of KV, put in %.1f s\n", p->n,
          (double)p->bytes / 1048576.0, (double)(bench_now_ns() - t) / 1e9);
  fflush(env->out);
  return 0;
}

static void pool_free(pf_pool *p)
{
  for (size_t i = 0; p->tok != NULL && i < p->n; i++)
    free(p->tok[i]);
  free(p->tok);
  free(p->len);
}

/* The SSD tier's speed as cold gets see it (a handle without a DRAM tier: O_DIRECT reads). */
static int measure_ssd(const bench_env *env, pf_pool *p, void *buf)
{
  kvdb *db = pf_open(p, 0, 0);
  if (db == NULL)
    return -1;
  double bps[8];
  size_t k = 0;
  for (size_t i = 0; i < p->n && k < 8; i++, k++) {
    int d;
    uint64_t ns = pf_get(db, p, i, buf, &d);
    bps[k] = (double)(p->len[i] * kvdb_model_token_bytes(&p->m)) / ((double)ns / 1e9);
  }
  kvdb_close(db);
  for (size_t a = 1; a < k; a++) /* the median get's speed: one slow moment does not set it */
    for (size_t b = a; b > 0 && bps[b - 1] > bps[b]; b--) {
      double t = bps[b];
      bps[b] = bps[b - 1];
      bps[b - 1] = t;
    }
  p->ssd_bps = k > 0 ? bps[k / 2] : 1e9;
  fprintf(env->out, "SSD tier: cold gets read %.2f GB/s (median of %zu)\n", p->ssd_bps / 1e9, k);
  fflush(env->out);
  return 0;
}

/* fg: gets of the pool's first half, one after another with a gap of half a get, on a handle
 * whose DRAM tier (64 MiB) is too small to keep them (every get reads the SSD tier), without
 * and with a prefetch of the second half running the whole time (re-queued as each finishes:
 * they evict each other, so it keeps reading). Rounds alternate without and with, 4 (8) of
 * 12 (50) gets. */
static int part_fg(const bench_env *env, const pf_pool *p, void *buf, bench_json *j)
{
  size_t half = p->n / 2, gets = env->quick ? 12 : 50, rounds = env->quick ? 4 : 8;
  bench_samples s[2] = {{0}, {0}};
  uint64_t fg_ssd[2] = {0, 0}, fg_n[2] = {0, 0}, pf_bytes = 0, pf_ns = 0;
  for (size_t round = 0; round < rounds; round++) {
    int with = (int)(round % 2);
    kvdb *db = pf_open(p, 64u << 20, 0);
    if (db == NULL)
      return -1;
    kvdb_prefetch_id *ids = calloc(p->n, sizeof *ids);
    uint64_t t_start = bench_now_ns(), read0 = 0;
    kvdb_stats st;
    kvdb_stat(db, &st);
    read0 = st.bytes_read;
    uint64_t fg_bytes = 0;
    for (size_t g = 0; g < gets; g++) {
      if (with) /* keep the prefetcher busy */
        for (size_t i = half; i < p->n; i++) {
          kvdb_prefetch_info in;
          if (ids[i] == 0 || (kvdb_prefetch_poll(db, ids[i], &in) == KVDB_OK &&
                              in.state >= KVDB_PREFETCH_DONE))
            kvdb_prefetch(db, &p->m, p->tok[i], p->len[i], NULL, &ids[i]);
        }
      size_t i = g % half;
      int d;
      uint64_t ns = pf_get(db, p, i, buf, &d);
      bench_samples_push(&s[with], ns);
      fg_ssd[with] += !d;
      fg_n[with]++;
      fg_bytes += p->len[i] * kvdb_model_token_bytes(&p->m);
      pf_sleep_ns(ns / 2);
    }
    kvdb_stat(db, &st);
    if (with) {
      pf_bytes += st.bytes_read - read0 - fg_bytes;
      pf_ns += bench_now_ns() - t_start;
    }
    free(ids);
    kvdb_close(db);
  }
  double p99[2], p50[2];
  for (int w = 0; w < 2; w++) {
    p99[w] = (double)bench_samples_pct(&s[w], 99) / 1e6;
    p50[w] = (double)bench_samples_pct(&s[w], 50) / 1e6;
  }
  double ratio = bench_ratio(p99[1], p99[0]);
  fprintf(env->out, "\nforeground gets (%zu per round, %zu rounds each, %.0f%% / %.0f%% from the "
          "SSD tier):\n  without prefetch: p50 %.2f ms, p99 %.2f ms\n  with prefetch:    p50 "
          "%.2f ms, p99 %.2f ms (the prefetch read %.2f GB/s meanwhile)\n  fg_get_p99_ratio "
          "%.3f (target <= 1.10: %s)\n",
          gets, rounds / 2, 100.0 * (double)fg_ssd[0] / (double)fg_n[0],
          100.0 * (double)fg_ssd[1] / (double)fg_n[1], p50[0], p99[0], p50[1], p99[1],
          pf_ns ? (double)pf_bytes / (double)pf_ns : 0, ratio, bench_met(ratio <= 1.10));
  fflush(env->out);
  bench_json_num(j, "fg_get_p99_ms", p99[0]);
  bench_json_num(j, "fg_get_p99_with_prefetch_ms", p99[1]);
  bench_json_num(j, "fg_prefetch_gbps", pf_ns ? (double)pf_bytes / (double)pf_ns : 0);
  bench_json_num(j, "fg_get_p99_ratio", ratio);
  bench_samples_free(&s[0]);
  bench_samples_free(&s[1]);
  return 0;
}

/* ttft: on two fresh handles with room for the pool, for each of the first prefixes: a get
 * after a finished kvdb_prefetch (handle A), and a get after an earlier get (handle B). */
static int part_ttft(const bench_env *env, const pf_pool *p, void *buf, bench_json *j)
{
  size_t m = env->quick ? 8 : 16;
  if (m > p->n)
    m = p->n;
  kvdb *a = pf_open(p, p->bytes + (64u << 20), 0), *b = pf_open(p, p->bytes + (64u << 20), 0);
  if (a == NULL || b == NULL)
    return -1;
  bench_samples sp = {0}, sd = {0};
  size_t pf_dram = 0;
  for (size_t i = 0; i < m; i++) {
    kvdb_prefetch_id id;
    if (kvdb_prefetch(a, &p->m, p->tok[i], p->len[i], NULL, &id) != KVDB_OK ||
        pf_wait(a, id) != KVDB_PREFETCH_DONE) {
      bench_log("prefetch of prefix %zu: %s", i, kvdb_errmsg());
      return -1;
    }
    int d;
    bench_samples_push(&sp, pf_get(a, p, i, buf, &d));
    pf_dram += d != 0;
    pf_get(b, p, i, buf, &d); /* the get that puts it in the DRAM tier */
    bench_samples_push(&sd, pf_get(b, p, i, buf, &d));
  }
  double tp = (double)bench_samples_pct(&sp, 50) / 1e6, td = (double)bench_samples_pct(&sd, 50) /
                                                             1e6;
  double ratio = bench_ratio(tp, td);
  fprintf(env->out, "\nTTFT's load of a stored prefix (median of %zu prefixes): prefetched %.2f ms "
          "(%zu of %zu wholly from the DRAM tier), in the DRAM tier by an earlier get %.2f ms\n"
          "  prefetched_ttft_vs_dram %.3f (target <= 1.10: %s)\n",
          m, tp, pf_dram, m, td, ratio, bench_met(ratio <= 1.10));
  fflush(env->out);
  bench_json_num(j, "prefetched_get_ms", tp);
  bench_json_num(j, "dram_get_ms", td);
  bench_json_num(j, "prefetched_ttft_vs_dram", ratio);
  bench_samples_free(&sp);
  bench_samples_free(&sd);
  kvdb_close(a);
  kvdb_close(b);
  return 0;
}

static uint64_t median_ns(uint64_t *v, int n)
{
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && v[k - 1] > v[k]; k--) {
      uint64_t t = v[k];
      v[k] = v[k - 1];
      v[k - 1] = t;
    }
  return v[n / 2];
}

/* gpu: the pool's long context (index p->n - 1) into device memory: kvdb_gpu_get from the DRAM
 * tier (attached, its blocks lent: gpu_get_vs_cudamemcpy; and not attached, through the
 * staging buffer) and from the SSD tier, against a pinned cudaMemcpy of the same bytes, same
 * run. */
static int part_gpu(const bench_env *env, const pf_pool *p, bench_json *j)
{
  kvdb_gpu *g = NULL;
  kvdb_status rc = kvdb_gpu_open(0, &g);
  if (rc != KVDB_OK) {
    fprintf(env->out, "\ngpu: SKIP: %s\n", kvdb_gpu_errmsg());
    fflush(env->out);
    bench_json_str(j, "gpu_skip", kvdb_gpu_errmsg());
    bench_json_num(j, "gpu_get_vs_cudamemcpy", NAN);
    return 0;
  }
  size_t i = p->n - 1, n = p->len[i];
  size_t bytes = n * kvdb_model_token_bytes(&p->m);
  int reps = env->quick ? 5 : 15;
  void *dev = NULL, *pinned = NULL;
  uint64_t t_cp[16], t_dram[16], t_staged[16], t_ssd[16], t_naive[16], t_serial[16];
  void *pageable = bench_alloc(bytes);
  kvdb_kv_view vp, vs;
  int ok = kvdb_gpu_alloc(g, bytes, &dev) == KVDB_OK &&
           kvdb_gpu_host_alloc(g, bytes, &pinned) == KVDB_OK;
  if (!ok) {
    bench_log("gpu memory: %s", kvdb_gpu_errmsg());
    kvdb_gpu_close(g);
    return -1;
  }
  memset(pinned, 1, bytes);
  kvdb *warm = pf_open(p, bytes + (64u << 20), 0);
  size_t hit = 0;
  if (warm == NULL)
    return -1;
  rc = kvdb_gpu_get(g, warm, &p->m, p->tok[i], n, dev, KVDB_LAYOUT_LKTHD, &hit); /* into DRAM */
  if (rc != KVDB_OK || hit != n) {
    bench_log("kvdb_gpu_get: %s (%zu of %zu)", kvdb_gpu_errmsg(), hit, n);
    return -1;
  }
  kvdb_gpu_copy(g, dev, pinned, bytes, 1); /* warm the copy path */
  if (pageable == NULL)
    return -1;
  kvdb_kv_view_packed(&vp, pageable, &p->m, n, KVDB_LAYOUT_LKTHD);
  kvdb_kv_view_packed(&vs, pinned, &p->m, n, KVDB_LAYOUT_LKTHD);
  for (int r = 0; r < reps; r++) {
    /* the other designs: kvdb_get into pageable memory, then one copy (naive); kvdb_get into
     * pinned memory, then one copy (staged, no overlap) */
    uint64_t t = bench_now_ns();
    rc = kvdb_get(warm, &p->m, p->tok[i], n, &vp, &hit);
    if (rc == KVDB_OK)
      rc = kvdb_gpu_copy(g, dev, pageable, bytes, 1);
    t_naive[r] = bench_now_ns() - t;
    t = bench_now_ns();
    if (rc == KVDB_OK)
      rc = kvdb_get(warm, &p->m, p->tok[i], n, &vs, &hit);
    if (rc == KVDB_OK)
      rc = kvdb_gpu_copy(g, dev, pinned, bytes, 1);
    t_serial[r] = bench_now_ns() - t;
    if (rc != KVDB_OK) {
      bench_log("gpu rep %d: %s / %s", r, kvdb_errmsg(), kvdb_gpu_errmsg());
      return -1;
    }
  }
  /* the DRAM tier page-locked: its blocks go to the device straight from it (lent) */
  rc = kvdb_gpu_attach(g, warm);
  if (rc != KVDB_OK) {
    bench_log("kvdb_gpu_attach: %s", kvdb_gpu_errmsg());
    return -1;
  }
  rc = kvdb_gpu_get(g, warm, &p->m, p->tok[i], n, dev, KVDB_LAYOUT_LKTHD, &hit); /* warm */
  for (int r = 0; r < reps && rc == KVDB_OK; r++) {
    uint64_t t = bench_now_ns();
    rc = kvdb_gpu_copy(g, dev, pinned, bytes, 1);
    t_cp[r] = bench_now_ns() - t;
    t = bench_now_ns();
    if (rc == KVDB_OK)
      rc = kvdb_gpu_get(g, warm, &p->m, p->tok[i], n, dev, KVDB_LAYOUT_LKTHD, &hit);
    t_dram[r] = bench_now_ns() - t;
    if (rc == KVDB_OK && hit != n)
      rc = KVDB_NOTFOUND;
  }
  if (rc != KVDB_OK) {
    bench_log("gpu (attached): %s", kvdb_gpu_errmsg());
    return -1;
  }
  kvdb_gpu_detach(g, warm);
  for (int r = 0; r < reps; r++) {
    /* not attached: every block through the pinned staging buffer (kvdb_get's copy) */
    uint64_t t = bench_now_ns();
    rc = kvdb_gpu_get(g, warm, &p->m, p->tok[i], n, dev, KVDB_LAYOUT_LKTHD, &hit);
    t_staged[r] = bench_now_ns() - t;
    kvdb *cold = pf_open(p, 0, 0);
    t = bench_now_ns();
    if (rc == KVDB_OK && cold != NULL)
      rc = kvdb_gpu_get(g, cold, &p->m, p->tok[i], n, dev, KVDB_LAYOUT_LKTHD, &hit);
    t_ssd[r] = bench_now_ns() - t;
    kvdb_close(cold);
    if (rc != KVDB_OK || hit != n) {
      bench_log("gpu rep %d: %s", r, kvdb_gpu_errmsg());
      return -1;
    }
  }
  double cp = (double)bytes / (double)median_ns(t_cp, reps);
  double dr = (double)bytes / (double)median_ns(t_dram, reps);
  double st = (double)bytes / (double)median_ns(t_staged, reps);
  double sd = (double)bytes / (double)median_ns(t_ssd, reps);
  double nv = (double)bytes / (double)median_ns(t_naive, reps);
  double se = (double)bytes / (double)median_ns(t_serial, reps);
  double ratio = dr / cp;
  fprintf(env->out, "\ngpu (%s): %zu tokens, %.0f MiB into device memory (median of %d):\n"
          "  pinned cudaMemcpy                          %.2f GB/s\n"
          "  kvdb_gpu_get, DRAM tier (attached: lent)   %.2f GB/s\n"
          "  kvdb_gpu_get, DRAM tier (staged, pipelined) %.2f GB/s\n"
          "  kvdb_gpu_get, SSD tier (pipelined)         %.2f GB/s\n"
          "  kvdb_get to pageable + cudaMemcpy (naive)  %.2f GB/s\n"
          "  kvdb_get to pinned + cudaMemcpy (serial)   %.2f GB/s\n"
          "  gpu_get_vs_cudamemcpy %.3f (target >= 0.85: %s)\n",
          kvdb_gpu_name(g), n, (double)bytes / 1048576.0, reps, cp, dr, st, sd, nv, se, ratio,
          bench_met(ratio >= 0.85));
  fflush(env->out);
  bench_json_num(j, "gpu_naive_gbps", nv);
  bench_json_num(j, "gpu_serial_gbps", se);
  bench_json_num(j, "gpu_cudamemcpy_gbps", cp);
  bench_json_num(j, "gpu_get_dram_gbps", dr);
  bench_json_num(j, "gpu_get_dram_staged_gbps", st);
  bench_json_num(j, "gpu_get_ssd_gbps", sd);
  bench_json_num(j, "gpu_get_vs_cudamemcpy", ratio);
  kvdb_close(warm);
  kvdb_gpu_host_free(g, pinned);
  bench_free(pageable);
  kvdb_gpu_free(g, dev);
  kvdb_gpu_close(g);
  return 0;
}

int bench_prefetch(const bench_env *env, bench_json *j)
{
  int only_gpu = want("gpu") && !want("fg") && !want("ttft") && !want("sim");
  pf_pool p;
  size_t n = only_gpu ? 0 : env->quick ? 24 : 48;
  size_t long_len = env->quick ? 4096 : 8192; /* the GPU part's context: 64 or 128 MiB */
  if (pool_build(env, &p, n, want("gpu") ? long_len : 0) != 0)
    return 1;
  int rc = 0;
  void *buf = NULL;
  if (n > 0) {
    size_t maxlen = 0;
    for (size_t i = 0; i < p.n; i++)
      maxlen = p.len[i] > maxlen ? p.len[i] : maxlen;
    buf = bench_alloc(maxlen * kvdb_model_token_bytes(&p.m));
    if (buf == NULL || measure_ssd(env, &p, buf) != 0)
      rc = 1;
    p.n = n; /* the parts below use the pool without the GPU's long context */
    if (rc == 0 && want("fg"))
      rc = part_fg(env, &p, buf, j);
    if (rc == 0 && want("ttft"))
      rc = part_ttft(env, &p, buf, j);
    double hit4 = 0, stall = 0;
    if (rc == 0 && want("sim")) {
      rc = pf_simulate(env, &p, j, &hit4, &stall);
      if (rc == 0) {
        fprintf(env->out, "  prefetch_hit_rate_k4 %.3f (target >= 0.99: %s)\n  stall_vs_lru %.3f "
                "(target <= 0.25: %s)\n", hit4, bench_met(hit4 >= 0.99), stall,
                bench_met(stall <= 0.25));
        fflush(env->out);
        bench_json_num(j, "stall_vs_lru", stall);
      }
    }
    p.n = n + want("gpu");
  }
  if (rc == 0 && want("gpu"))
    rc = part_gpu(env, &p, j);
  bench_free(buf);
  pool_free(&p);
  return rc != 0;
}
