/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/prefetch.c — kvdb_prefetch and its worker (kvdb.h, group "prefetch"; TierKV,
 * seed 003 §3.4-§3.5).
 *
 * A handle's prefetch state is created by its first kvdb_prefetch: a list of requests under
 * one mutex, and one worker thread that takes the best queued request (earliest deadline,
 * then highest priority, then oldest), runs it through the get path with no view
 * (get.c, kv_prefetch_fetch: the blocks go into the DRAM tier) and records the outcome.
 * Before each read it queues, the get path asks this file's gate, which is the admission
 * control: it ends the request if it was cancelled, the handle is closing or the deadline
 * passed; it waits while a foreground get reads (db->fg_reads); and it waits for the token
 * bucket (tiers.h, admit.c), whose rate follows the foreground's bytes (db->fg_bytes).
 * Finished requests are kept (for kvdb_prefetch_poll) up to KEEP_DONE, oldest dropped first.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops_int.h"

#define KEEP_DONE 1024
#define WAVE_BYTES (1u << 20)     /* a prefetch read: whole layers, at most this (or one layer) */
#define FG_POLL_NS 50000ull       /* how often the gate looks again while the foreground reads */
#define SLEEP_MAX_NS 1000000ull   /* the gate sleeps at most this at once (a cancel shows) */
#define CAPACITY_GUESS_BPS 500e6  /* the tier's speed before any read was measured */

typedef struct pf_req {
  kvdb_prefetch_id id;
  uint8_t key[16];      /* chain hash of the tokens under the model: what idempotence compares */
  kvdb_model m;
  char model_id[64];
  uint32_t *tokens;
  size_t n;
  int32_t priority;
  uint64_t deadline_ns; /* 0: none */
  kvdb_prefetch_info info;
  int cancel;
  struct pf_req *next;  /* all requests, newest first */
} pf_req;

struct kv_prefetch {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int started, stop;
  pf_req *reqs;
  uint64_t next_id;
  size_t n_done;
  kv_bucket bucket; /* the worker's alone */
};

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  nanosleep(&ts, NULL);
}

static int finished(const pf_req *r)
{
  return r->info.state >= KVDB_PREFETCH_DONE;
}

static void req_free(pf_req *r)
{
  free(r->tokens);
  free(r);
}

/* Drop the oldest finished requests past KEEP_DONE (lock held). */
static void trim(struct kv_prefetch *p)
{
  if (p->n_done <= KEEP_DONE)
    return;
  size_t seen = 0;
  for (pf_req **pp = &p->reqs; *pp != NULL;) {
    pf_req *r = *pp;
    if (finished(r) && ++seen > KEEP_DONE) {
      *pp = r->next;
      req_free(r);
      p->n_done--;
      continue;
    }
    pp = &r->next;
  }
}

/* 1 when a should go before b. */
static int before(const pf_req *a, const pf_req *b)
{
  if ((a->deadline_ns != 0) != (b->deadline_ns != 0))
    return a->deadline_ns != 0;
  if (a->deadline_ns != b->deadline_ns)
    return a->deadline_ns < b->deadline_ns;
  if (a->priority != b->priority)
    return a->priority > b->priority;
  return a->id < b->id;
}

typedef struct gate_ctx {
  kvdb *db;
  struct kv_prefetch *p;
  pf_req *r;
  int expired;
} gate_ctx;

/* 1 when the request must end now (lock taken briefly). */
static int must_stop(gate_ctx *g)
{
  pthread_mutex_lock(&g->p->mu);
  int stop = g->p->stop || g->r->cancel;
  uint64_t deadline = g->r->deadline_ns;
  pthread_mutex_unlock(&g->p->mu);
  if (!stop && deadline != 0 && now_ns() > deadline) {
    g->expired = 1;
    stop = 1;
  }
  return stop;
}

/* The get path asks before each read of `bytes` it queues: 0 = go, 1 = end the request. */
static int gate(void *ctx, uint64_t bytes)
{
  gate_ctx *g = ctx;
  kvdb *db = g->db;
  for (;;) {
    if (must_stop(g))
      return 1;
    if (db->fg_reads > 0) { /* foreground reads first */
      sleep_ns(FG_POLL_NS);
      continue;
    }
    if (bytes == 0) /* before processing a wave: only the foreground comes first */
      return 0;
    uint64_t t = now_ns();
    kv_bucket_observe(&g->p->bucket, db->fg_bytes, db->bytes_read, t);
    uint64_t wait = kv_bucket_take(&g->p->bucket, bytes, t);
    if (wait == 0) {
      pthread_mutex_lock(&g->p->mu); /* progress for kvdb_prefetch_poll */
      g->r->info.bytes_read += bytes;
      pthread_mutex_unlock(&g->p->mu);
      return 0;
    }
    sleep_ns(wait < SLEEP_MAX_NS ? wait : SLEEP_MAX_NS);
  }
}

static void run(kvdb *db, struct kv_prefetch *p, pf_req *r)
{
  gate_ctx g = {db, p, r, 0};
  kv_prefetch_result res;
  kvdb_status rc = KVDB_OK;
  if (!must_stop(&g))
    rc = kv_prefetch_fetch(db, &r->m, r->tokens, r->n, WAVE_BYTES, gate, &g, &res);
  else
    memset(&res, 0, sizeof res), res.stopped = 1;
  pthread_mutex_lock(&p->mu);
  r->info.staged_tokens = res.staged_tokens;
  r->info.blocks_read = res.blocks_read;
  r->info.blocks_present = res.blocks_present;
  r->info.bytes_read = res.bytes_read;
  r->info.status = res.stopped ? KVDB_OK : rc;
  if (res.stopped)
    r->info.state = g.expired && !r->cancel && !p->stop ? KVDB_PREFETCH_EXPIRED
                                                         : KVDB_PREFETCH_CANCELLED;
  else
    r->info.state = rc == KVDB_OK ? KVDB_PREFETCH_DONE : KVDB_PREFETCH_FAILED;
  if (rc != KVDB_OK && !res.stopped)
    kv_log(&db->log, 1, "prefetch %llu: %s", (unsigned long long)r->id, kvdb_errmsg());
  p->n_done++;
  trim(p);
  pthread_mutex_unlock(&p->mu);
}

static void *worker(void *arg)
{
  kvdb *db = arg;
  struct kv_prefetch *p = db->prefetch;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    pf_req *best = NULL;
    for (pf_req *r = p->reqs; r != NULL; r = r->next)
      if (r->info.state == KVDB_PREFETCH_QUEUED && (best == NULL || before(r, best)))
        best = r;
    if (p->stop)
      break;
    if (best == NULL) {
      pthread_cond_wait(&p->cv, &p->mu);
      continue;
    }
    best->info.state = KVDB_PREFETCH_RUNNING;
    pthread_mutex_unlock(&p->mu);
    run(db, p, best); /* the request stays in the list: only trim frees, and it skips it */
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* The handle's prefetch state, created on first use (*out NULL on failure, status set). */
static kvdb_status state_of(kvdb *db, struct kv_prefetch **out)
{
  *out = NULL;
  pthread_mutex_lock(&db->mu);
  struct kv_prefetch *p = db->prefetch;
  if (p == NULL) {
    p = calloc(1, sizeof *p);
    if (p == NULL) {
      pthread_mutex_unlock(&db->mu);
      return kv_fail(KVDB_NOMEM, "prefetch state");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->next_id = 1;
    kv_tier_perf perf[KVDB_TIER_COUNT];
    memset(perf, 0, sizeof perf);
    kv_place_perf(db, perf);
    double cap = perf[KVDB_TIER_SSD].read_bps > 0 ? perf[KVDB_TIER_SSD].read_bps
                                                  : CAPACITY_GUESS_BPS;
    /* the burst: a wave, or 10 ms at the ceiling when that is less (a page at least) */
    double burst = WAVE_BYTES, ceil = db->opt.prefetch_bps;
    if (ceil > 0 && ceil * 0.01 < burst)
      burst = ceil * 0.01 > 4096 ? ceil * 0.01 : 4096;
    kv_bucket_init(&p->bucket, cap, ceil, burst, now_ns());
    db->prefetch = p;
  }
  if (!p->started) {
    if (pthread_create(&p->thread, NULL, worker, db) != 0) {
      pthread_mutex_unlock(&db->mu);
      return kv_fail(KVDB_NOMEM, "cannot start the prefetch thread");
    }
    p->started = 1;
  }
  pthread_mutex_unlock(&db->mu);
  *out = p;
  return KVDB_OK;
}

void kvdb_prefetch_opts_init(kvdb_prefetch_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
}

kvdb_status kvdb_prefetch(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                          const kvdb_prefetch_opts *opts, kvdb_prefetch_id *id)
{
  KV_RET(kv_check_db(db));
  if (id == NULL)
    return kv_fail(KVDB_INVALID, "id is NULL");
  *id = 0;
  uint32_t bt;
  KV_RET(kv_check_model(m, &bt));
  if (tokens == NULL || n == 0)
    return kv_fail(KVDB_INVALID, "tokens is NULL or n is 0");
  KV_RET(kv_check_n_tokens(n));
  kvdb_prefetch_opts o;
  kvdb_prefetch_opts_init(&o);
  if (opts != NULL) {
    if (opts->struct_size == 0 || opts->struct_size > sizeof o)
      return kv_fail(KVDB_INVALID, "prefetch opts.struct_size %u: call kvdb_prefetch_opts_init() "
                     "first", opts->struct_size);
    memcpy(&o, opts, opts->struct_size);
  }
  if (db->dram == NULL)
    return kv_fail(KVDB_UNSUPPORTED, "prefetch: the DRAM tier is off (options.dram_bytes 0)");
  /* the key: the chain over every token (the context key a put of them would have) */
  uint8_t key[16], prev[16];
  kv_model_hash(m, bt, prev);
  for (size_t t = 0; t < n; t += bt) {
    size_t c = n - t < bt ? n - t : bt;
    kv_chain_hash(prev, tokens + t, (uint32_t)c, key);
    memcpy(prev, key, 16);
  }
  struct kv_prefetch *p;
  KV_RET(state_of(db, &p));
  uint64_t deadline = o.deadline_us ? now_ns() + o.deadline_us * 1000ull : 0;
  pthread_mutex_lock(&p->mu);
  for (pf_req *r = p->reqs; r != NULL; r = r->next)
    if (!finished(r) && !r->cancel && r->n == n && memcmp(r->key, key, 16) == 0 &&
        strcmp(r->model_id, m->id) == 0 &&
        memcmp(r->tokens, tokens, n * sizeof *tokens) == 0) {
      /* the same request: it takes the more urgent of its order and this call's */
      if (o.priority > r->priority)
        r->priority = o.priority;
      if (deadline != 0 && (r->deadline_ns == 0 || deadline < r->deadline_ns))
        r->deadline_ns = deadline;
      *id = r->id;
      pthread_mutex_unlock(&p->mu);
      return KVDB_OK;
    }
  pthread_mutex_unlock(&p->mu);
  pf_req *r = calloc(1, sizeof *r);
  uint32_t *copy = malloc(n * sizeof *copy);
  if (r == NULL || copy == NULL) {
    free(r);
    free(copy);
    return kv_fail(KVDB_NOMEM, "prefetch of %zu tokens", n);
  }
  memcpy(copy, tokens, n * sizeof *copy);
  memcpy(r->key, key, 16);
  r->m = *m;
  snprintf(r->model_id, sizeof r->model_id, "%s", m->id);
  r->m.id = r->model_id;
  r->tokens = copy;
  r->n = n;
  r->priority = o.priority;
  r->deadline_ns = deadline;
  r->info.state = KVDB_PREFETCH_QUEUED;
  r->info.status = KVDB_OK;
  pthread_mutex_lock(&p->mu);
  r->id = p->next_id++;
  r->next = p->reqs;
  p->reqs = r;
  *id = r->id;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return KVDB_OK;
}

/* The request `id` (lock held), or NULL. */
static pf_req *find(struct kv_prefetch *p, kvdb_prefetch_id id)
{
  for (pf_req *r = p->reqs; r != NULL; r = r->next)
    if (r->id == id)
      return r;
  return NULL;
}

kvdb_status kvdb_prefetch_poll(kvdb *db, kvdb_prefetch_id id, kvdb_prefetch_info *out)
{
  KV_RET(kv_check_db(db));
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&db->mu);
  struct kv_prefetch *p = db->prefetch;
  pthread_mutex_unlock(&db->mu);
  if (p != NULL) {
    pthread_mutex_lock(&p->mu);
    pf_req *r = find(p, id);
    if (r != NULL)
      *out = r->info;
    pthread_mutex_unlock(&p->mu);
    if (r != NULL)
      return KVDB_OK;
  }
  return kv_fail(KVDB_NOTFOUND, "no prefetch request %llu (or it finished more than %d requests "
                 "ago)", (unsigned long long)id, KEEP_DONE);
}

kvdb_status kvdb_prefetch_cancel(kvdb *db, kvdb_prefetch_id id)
{
  KV_RET(kv_check_db(db));
  pthread_mutex_lock(&db->mu);
  struct kv_prefetch *p = db->prefetch;
  pthread_mutex_unlock(&db->mu);
  if (p != NULL) {
    pthread_mutex_lock(&p->mu);
    pf_req *r = find(p, id);
    if (r != NULL && r->info.state == KVDB_PREFETCH_QUEUED) {
      r->info.state = KVDB_PREFETCH_CANCELLED;
      p->n_done++;
      trim(p);
    } else if (r != NULL && r->info.state == KVDB_PREFETCH_RUNNING) {
      r->cancel = 1; /* the gate ends it before its next read */
    }
    pthread_mutex_unlock(&p->mu);
    if (r != NULL)
      return KVDB_OK;
  }
  return kv_fail(KVDB_NOTFOUND, "no prefetch request %llu", (unsigned long long)id);
}

void kv_prefetch_close(kvdb *db)
{
  struct kv_prefetch *p = db->prefetch;
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (p->started)
    pthread_join(p->thread, NULL);
  while (p->reqs != NULL) {
    pf_req *r = p->reqs;
    p->reqs = r->next;
    req_free(r);
  }
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
  db->prefetch = NULL;
}
