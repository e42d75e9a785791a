/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_prefetch_sim.c — `kvdb-bench prefetch`, the serving simulation (TierKV, seed 003
 * §4): continuous batching with a lookahead window K over a request trace, real kvdb gets and
 * prefetches, the policies LRU, LFU, static, oracle and TierKV's prefetch at K = 1..8.
 *
 * THE TRACE (synthetic, seeded; the distributions TierKV §4 names: Poisson arrivals, log-normal
 * lengths). Each request reuses one prefix of the pool (a system prompt or document, put once
 * in kvdb), chosen by a Zipf law of exponent 0.8 over a random ranking of the pool (prefix
 * reuse as in prefix-caching serving traces: a few hot prefixes, a long tail), and adds a
 * suffix of its own that is prefilled (its compute is part of the step). Arrivals are Poisson
 * at 0.6 of the rate the compute alone would serve (B per T_iter). The pool's lengths are log-normal (bench_prefetch.c).
 *
 * THE SCHEDULER. Step i admits requests [i B, (i + 1) B) (B = 2, first come first served),
 * waiting for the last of them to arrive; it loads their prefixes' KV (kvdb_get), then computes
 * for T_iter (a sleep: the GPU's step). T_iter is set from the SSD tier's measured speed so that
 * even an all-miss step's loads need a quarter of the tier's bandwidth (the "SSD bandwidth
 * suffices" regime of the target, with room for this VM's disk, whose speed varies 2-3x). TTFT of a request = its step's start - its arrival + its load + T_iter.
 * Its STALL = 0 when every block came from the DRAM tier, else its load - the same prefix's
 * load from the DRAM tier (measured beforehand, median of 3), at least 0: the time the step
 * waits because the KV was not staged. The HIT rate: the
 * requests whose every block came from the DRAM tier. The first WARM steps count for no
 * policy (every cache starts empty).
 *
 * THE POLICIES, each with a DRAM tier of the same capacity (half the pool's bytes):
 *   lru     the DRAM tier as kvdb keeps it without placement: filled by gets, least recently
 *           used first out;
 *   lfu     least frequently used first out (counts since the start);
 *   static  the most requested prefixes of the whole trace that fit, fixed (an offline choice);
 *   oracle  every prefix pre-placed in DRAM with zero transfer (TierKV's Oracle);
 *   tierkv  the real kvdb DRAM tier and kvdb_prefetch: at each step's start, the requests of
 *           steps i+1 .. i+K are prefetched (priority K_MAX + 1 - k for step i+k: the nearest
 *           first, TierKV's 1/k; no deadline, so a late step still finds its prefetch).
 * For lru, lfu, static and oracle the policy's DRAM contents are modelled here and each load is a
 * real kvdb_get: a hit on a handle whose DRAM tier holds every prefix, a miss on a handle with no
 * DRAM tier (O_DIRECT reads of the SSD tier). tierkv runs on one real handle.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prefetch.h"
#include "datagen.h"

#define B_PER_STEP 2
#define WARM 8
#define K_MAX 8

typedef struct req {
  size_t prefix;
  uint64_t arrival_ns; /* from the run's start */
} req;

typedef struct result {
  double ttft_p50_ms, ttft_p99_ms, stall_s, hit_rate;
  size_t counted;
  size_t miss_running, miss_queued, miss_done; /* tierkv misses: where their prefetch was */
} result;

enum { P_LRU, P_LFU, P_STATIC, P_ORACLE, P_TIERKV };
static const char *const PNAME[] = {"lru", "lfu", "static", "oracle", "tierkv"};

/* The modelled DRAM contents of lru/lfu/static. */
typedef struct cache {
  uint64_t cap, used;
  int *in;            /* per prefix */
  uint64_t *last;     /* last use (lru) */
  uint64_t *count;    /* uses so far (lfu) */
} cache;

static int cache_access(cache *c, const pf_pool *p, int policy, size_t i, uint64_t now)
{
  c->count[i]++;
  c->last[i] = now;
  if (policy == P_ORACLE)
    return 1;
  if (c->in[i])
    return 1;
  if (policy == P_STATIC)
    return 0;
  uint64_t b = p->len[i] * kvdb_model_token_bytes(&p->m);
  if (b > c->cap)
    return 0;
  while (c->used + b > c->cap) {
    size_t v = SIZE_MAX;
    for (size_t k = 0; k < p->n; k++)
      if (c->in[k] && k != i &&
          (v == SIZE_MAX ||
           (policy == P_LRU ? c->last[k] < c->last[v]
                            : (c->count[k] < c->count[v] ||
                               (c->count[k] == c->count[v] && c->last[k] < c->last[v])))))
        v = k;
    if (v == SIZE_MAX)
      return 0;
    c->in[v] = 0;
    c->used -= p->len[v] * kvdb_model_token_bytes(&p->m);
  }
  c->in[i] = 1;
  c->used += b;
  return 0;
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct_ms(uint64_t *v, size_t n, double q)
{
  if (n == 0)
    return 0;
  qsort(v, n, sizeof *v, cmp_u64);
  size_t r = (size_t)ceil(q / 100.0 * (double)n);
  if (r == 0)
    r = 1;
  return (double)v[r - 1] / 1e6;
}

/* One run of a policy over the trace. */
static int run_policy(const pf_pool *p, int policy, int K, const req *rq, size_t n_req,
                      uint64_t t_iter, uint64_t cap, const uint64_t *dram_ns, kvdb *hot,
                      kvdb *cold, void *buf, result *out)
{
  size_t steps = n_req / B_PER_STEP;
  uint64_t *ttft = calloc(n_req, sizeof *ttft);
  cache c = {cap, 0, calloc(p->n, sizeof(int)), calloc(p->n, 8), calloc(p->n, 8)};
  kvdb *db = NULL;
  if (ttft == NULL || c.in == NULL || c.last == NULL || c.count == NULL)
    return -1;
  if (policy == P_STATIC) { /* the trace's most requested prefixes that fit */
    uint64_t *cnt = calloc(p->n, 8);
    for (size_t r = 0; r < n_req; r++)
      cnt[rq[r].prefix]++;
    for (;;) {
      size_t best = SIZE_MAX;
      for (size_t k = 0; k < p->n; k++)
        if (!c.in[k] && cnt[k] > 0 &&
            c.used + p->len[k] * kvdb_model_token_bytes(&p->m) <= cap &&
            (best == SIZE_MAX || cnt[k] > cnt[best]))
          best = k;
      if (best == SIZE_MAX)
        break;
      c.in[best] = 1;
      c.used += p->len[best] * kvdb_model_token_bytes(&p->m);
    }
    free(cnt);
  }
  kvdb_prefetch_id *ids = calloc(p->n, sizeof *ids);
  if (ids == NULL || (policy == P_TIERKV && (db = pf_open(p, cap, 0)) == NULL))
    return -1;
  memset(out, 0, sizeof *out);
  size_t counted = 0, hits = 0;
  double stall = 0;
  uint64_t t0 = bench_now_ns(), clock_end = 0;
  for (size_t s = 0; s < steps; s++) {
    const req *batch = &rq[s * B_PER_STEP];
    /* wait for the step's requests to arrive */
    uint64_t last_arr = batch[B_PER_STEP - 1].arrival_ns;
    uint64_t now = bench_now_ns() - t0;
    if (now < last_arr)
      pf_sleep_ns(last_arr - now);
    uint64_t start = bench_now_ns() - t0;
    if (policy == P_TIERKV) /* the plan of steps s+1 .. s+K */
      for (int k = 1; k <= K && s + (size_t)k < steps; k++)
        for (int b = 0; b < B_PER_STEP; b++) {
          const req *r = &rq[(s + (size_t)k) * B_PER_STEP + (size_t)b];
          kvdb_prefetch_opts po; /* TierKV's priority 1/k: the nearest step first */
          kvdb_prefetch_opts_init(&po);
          po.priority = K_MAX + 1 - k;
          if (kvdb_prefetch(db, &p->m, p->tok[r->prefix], p->len[r->prefix], &po,
                            &ids[r->prefix]) != KVDB_OK)
            bench_log("kvdb_prefetch: %s", kvdb_errmsg());
        }
    for (int b = 0; b < B_PER_STEP; b++) {
      size_t i = batch[b].prefix;
      int from_dram = 0;
      uint64_t ns;
      if (policy == P_TIERKV) {
        kvdb_prefetch_info in;
        memset(&in, 0, sizeof in);
        if (ids[i] != 0)
          kvdb_prefetch_poll(db, ids[i], &in);
        ns = pf_get(db, p, i, buf, &from_dram);
        if (!from_dram && s >= WARM) {
          if (ids[i] != 0 && in.state == KVDB_PREFETCH_RUNNING)
            out->miss_running++;
          else if (ids[i] != 0 && in.state == KVDB_PREFETCH_QUEUED)
            out->miss_queued++;
          else
            out->miss_done++; /* staged and evicted, or never asked (K = 0) */
        }
      } else {
        int hit = cache_access(&c, p, policy, i, s * B_PER_STEP + (uint64_t)b + 1);
        ns = pf_get(hit ? hot : cold, p, i, buf, &from_dram);
        from_dram = hit;
      }
      uint64_t done = bench_now_ns() - t0;
      size_t r = s * B_PER_STEP + (size_t)b;
      if (s >= WARM) {
        ttft[counted++] = done - batch[b].arrival_ns + t_iter;
        hits += from_dram != 0;
        if (!from_dram && ns > dram_ns[i]) /* staged KV costs no stall */
          stall += (double)(ns - dram_ns[i]) / 1e9;
      }
      (void)r;
    }
    (void)start;
    pf_sleep_ns(t_iter); /* the step's compute */
    clock_end = bench_now_ns() - t0;
  }
  (void)clock_end;
  out->counted = counted;
  out->hit_rate = counted ? (double)hits / (double)counted : 0;
  out->stall_s = stall;
  out->ttft_p50_ms = pct_ms(ttft, counted, 50);
  out->ttft_p99_ms = pct_ms(ttft, counted, 99);
  kvdb_close(db);
  free(ids);
  free(ttft);
  free(c.in);
  free(c.last);
  free(c.count);
  return 0;
}

int pf_simulate(const bench_env *env, const pf_pool *p, bench_json *j, double *hit_k4,
                double *stall_ratio)
{
  size_t steps = env->quick ? 40 : 120;
  size_t n_req = steps * B_PER_STEP;
  uint64_t tb = kvdb_model_token_bytes(&p->m);
  double mean_bytes = (double)p->bytes / (double)p->n;
  /* an all-miss step needs a quarter of the tier's bandwidth as cold gets measured it (this
   * VM's disk reads 0.8-3 GB/s from one minute to the next: half left steps where it did not
   * suffice) */
  uint64_t t_iter = (uint64_t)(B_PER_STEP * mean_bytes / (0.25 * p->ssd_bps) * 1e9);
  if (t_iter < 20000000)
    t_iter = 20000000;
  if (t_iter > 150000000) /* a disk measured very slow under others' load: keep runs short */
    t_iter = 150000000;
  uint64_t cap = p->bytes / 2;
  /* the trace */
  dg_rng rng = {env->seed * 7919 + 19};
  size_t *rank = malloc(p->n * sizeof *rank);
  double *cdf = malloc(p->n * sizeof *cdf);
  req *rq = malloc(n_req * sizeof *rq);
  uint64_t *dram_ns = calloc(p->n, sizeof *dram_ns);
  void *buf = NULL;
  size_t maxlen = 0;
  for (size_t i = 0; i < p->n; i++)
    if (p->len[i] > maxlen)
      maxlen = p->len[i];
  buf = bench_alloc(maxlen * tb);
  if (rank == NULL || cdf == NULL || rq == NULL || dram_ns == NULL || buf == NULL)
    return -1;
  for (size_t i = 0; i < p->n; i++)
    rank[i] = i;
  for (size_t i = p->n; i > 1; i--) {
    size_t k = dg_below(&rng, i);
    size_t t = rank[i - 1];
    rank[i - 1] = rank[k];
    rank[k] = t;
  }
  double z = 0;
  for (size_t i = 0; i < p->n; i++)
    cdf[i] = (z += 1.0 / pow((double)(i + 1), 0.8));
  double gap_ns = 1.6 * (double)t_iter / B_PER_STEP, t = 0; /* 0.6 of the compute's rate */
  for (size_t r = 0; r < n_req; r++) {
    double u = (double)(dg_next(&rng) >> 11) / 9007199254740992.0 * z;
    size_t k = 0;
    while (k + 1 < p->n && cdf[k] < u)
      k++;
    rq[r].prefix = rank[k];
    double e = (double)(dg_next(&rng) >> 11) / 9007199254740992.0;
    t += -log(1.0 - e) * gap_ns;
    rq[r].arrival_ns = (uint64_t)t;
  }
  /* the handles of the modelled policies, and each prefix's load from DRAM */
  kvdb *hot = pf_open(p, p->bytes + (64u << 20), 0), *cold = pf_open(p, 0, 0);
  if (hot == NULL || cold == NULL)
    return -1;
  for (size_t i = 0; i < p->n; i++) {
    int d;
    pf_get(hot, p, i, buf, &d); /* in */
    uint64_t v[3];
    for (int k = 0; k < 3; k++)
      v[k] = pf_get(hot, p, i, buf, &d);
    qsort(v, 3, sizeof *v, cmp_u64);
    dram_ns[i] = v[1];
  }
  fprintf(env->out, "\nserving simulation: %zu steps x %d requests, T_iter %.1f ms, DRAM tier "
          "%.0f MiB (half of the pool's %.0f MiB), SSD %.2f GB/s, first %d steps not counted\n",
          steps, B_PER_STEP, (double)t_iter / 1e6, (double)cap / 1048576.0,
          (double)p->bytes / 1048576.0, p->ssd_bps / 1e9, WARM);
  fflush(env->out);
  fprintf(env->out, "  %-10s %10s %10s %10s %8s\n", "policy", "TTFT p50", "TTFT p99", "stall s",
          "hit");
  fflush(env->out);
  result res[4 + K_MAX];
  for (int pol = P_LRU; pol <= P_ORACLE; pol++) {
    if (run_policy(p, pol, 0, rq, n_req, t_iter, cap, dram_ns, hot, cold, buf, &res[pol]) != 0)
      return -1;
    fprintf(env->out, "  %-10s %8.1f ms %8.1f ms %10.3f %8.3f\n", PNAME[pol],
            res[pol].ttft_p50_ms, res[pol].ttft_p99_ms, res[pol].stall_s, res[pol].hit_rate);
    fflush(env->out);
  }
  for (int k = 1; k <= K_MAX; k++) {
    result *r = &res[3 + k];
    if (run_policy(p, P_TIERKV, k, rq, n_req, t_iter, cap, dram_ns, hot, cold, buf, r) != 0)
      return -1;
    char name[16];
    snprintf(name, sizeof name, "tierkv K=%d", k);
    fprintf(env->out, "  %-10s %8.1f ms %8.1f ms %10.3f %8.3f   misses: %zu prefetch running, %zu "
            "queued, %zu done (evicted)\n", name, r->ttft_p50_ms, r->ttft_p99_ms, r->stall_s,
            r->hit_rate, r->miss_running, r->miss_queued, r->miss_done);
    fflush(env->out);
  }
  for (int pol = P_LRU; pol <= P_ORACLE; pol++) {
    char key[64];
    snprintf(key, sizeof key, "%s_ttft_p50_ms", PNAME[pol]);
    bench_json_num(j, key, res[pol].ttft_p50_ms);
    snprintf(key, sizeof key, "%s_ttft_p99_ms", PNAME[pol]);
    bench_json_num(j, key, res[pol].ttft_p99_ms);
    snprintf(key, sizeof key, "%s_stall_s", PNAME[pol]);
    bench_json_num(j, key, res[pol].stall_s);
    snprintf(key, sizeof key, "%s_hit_rate", PNAME[pol]);
    bench_json_num(j, key, res[pol].hit_rate);
  }
  for (int k = 1; k <= K_MAX; k++) {
    char key[64];
    result *r = &res[3 + k];
    snprintf(key, sizeof key, "tierkv_k%d_ttft_p50_ms", k);
    bench_json_num(j, key, r->ttft_p50_ms);
    snprintf(key, sizeof key, "tierkv_k%d_ttft_p99_ms", k);
    bench_json_num(j, key, r->ttft_p99_ms);
    snprintf(key, sizeof key, "tierkv_k%d_stall_s", k);
    bench_json_num(j, key, r->stall_s);
    snprintf(key, sizeof key, "prefetch_hit_rate_k%d", k);
    bench_json_num(j, key, r->hit_rate);
  }
  bench_json_num(j, "sim_t_iter_ms", (double)t_iter / 1e6);
  *hit_k4 = res[3 + 4].hit_rate;
  *stall_ratio = res[P_LRU].stall_s > 0 ? res[3 + 4].stall_s / res[P_LRU].stall_s : 0;
  kvdb_close(hot);
  kvdb_close(cold);
  bench_free(buf);
  free(rank);
  free(cdf);
  free(rq);
  free(dram_ns);
  return 0;
}
