/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/ingest.c — the ingest engine (ingest.h).
 *
 * Threads: `jobs` workers share one kvdb handle (kvdb handles are thread-safe), the model and
 * the tokenizer (immutable); each has its own refmodel_state. One mutex guards the document
 * reader, the totals and the first error; documents are taken one at a time in order and
 * processed outside the lock. The first error stops every worker after its current document.
 */
#define _GNU_SOURCE
#include "ingest.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "docs.h"
#include "refmodel.h"
#include "safetensors.h"

#define MAX_JOBS 256
#define N_QUERIES 8 /* last queries of a window given to kvdb (profile probes, SnapKV window) */

typedef struct run {
  const ingest_opts *o;
  kvdb *db;
  refmodel_model *rm;
  refmodel_tokenizer *tok;
  refkv_model km; /* text windows */
  int window, stride;
  src_list list;
  doc_reader reader;
  pthread_mutex_t mu;
  ingest_stats st;
  double t0, last_progress;
  int failed;
  char err[1536];
} run;

/* Per-worker scratch. */
typedef struct worker {
  run *r;
  refmodel_state *state;
  refmodel_state *ref; /* quality_steps: the float32 recompute */
  float *queries;      /* N_QUERIES query positions */
  int *text_tokens;
  size_t text_cap;
  int *ctx;
  uint32_t *uctx;
  kvdb_key *hashes;
  size_t hashes_cap;
  char err[1536];
} worker;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
wfail(worker *w, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->err, sizeof w->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* Record the first error of the run. */
static void run_fail(run *r, const char *msg)
{
  pthread_mutex_lock(&r->mu);
  if (!r->failed) {
    r->failed = 1;
    snprintf(r->err, sizeof r->err, "%s", msg);
  }
  pthread_mutex_unlock(&r->mu);
}

static void add_stats(ingest_stats *to, const ingest_stats *d)
{
  to->docs += d->docs;
  to->docs_empty += d->docs_empty;
  to->bytes_done += d->bytes_done;
  to->windows += d->windows;
  to->windows_stored += d->windows_stored;
  to->windows_present += d->windows_present;
  to->tokens += d->tokens;
  to->tokens_computed += d->tokens_computed;
  to->tokens_restored += d->tokens_restored;
  to->kv_bytes += d->kv_bytes;
  to->bytes_written += d->bytes_written;
  to->blocks_written += d->blocks_written;
  to->blocks_shared += d->blocks_shared;
  to->put_seconds += d->put_seconds;
  to->quality_windows += d->quality_windows;
  to->quality_agreement += d->quality_agreement;
  to->quality_kl += d->quality_kl;
  if (d->quality_max_kl > to->quality_max_kl)
    to->quality_max_kl = d->quality_max_kl;
}

/* Is the context of tokens[0..n) under model m stored already? 1 yes, 0 no, -1 error. */
static int stored(worker *w, const kvdb_model *m, const uint32_t *tokens, size_t n,
                  const char *what)
{
  size_t nb = (n + m->block_tokens - 1) / m->block_tokens;
  if (nb > w->hashes_cap) {
    kvdb_key *h = realloc(w->hashes, nb * sizeof *h);
    if (h == NULL)
      return wfail(w, "%s: out of memory", what);
    w->hashes = h;
    w->hashes_cap = nb;
  }
  kvdb_status rc = kvdb_chain_hashes(m, tokens, n, w->hashes, nb);
  kvdb_context_info info;
  if (rc == KVDB_OK)
    rc = kvdb_context_stat(w->r->db, &w->hashes[nb - 1], &info);
  if (rc == KVDB_OK)
    return 1;
  if (rc == KVDB_NOTFOUND)
    return 0;
  return wfail(w, "%s: looking up the context: %s: %s", what, kvdb_status_name(rc), kvdb_errmsg());
}

/*
 * One text window (ctx / uctx [0, n)): skip it when stored, else restore the longest stored
 * prefix (lossless storage only: with lossy storage the KV of later positions must come from
 * the exact prefix), compute the rest (keeping its last queries), put it; then, for lossy
 * storage with quality_steps, measure and report its quality.
 */
static int put_window(worker *w, size_t n, ingest_stats *s, const char *what)
{
  run *r = w->r;
  s->windows++;
  s->tokens += n;
  int have = stored(w, &r->km.km, w->uctx, n, what);
  if (have < 0)
    return -1;
  if (have) {
    s->windows_present++;
    return 0;
  }
  size_t hit = 0;
  int lossless = refkv_model_lossless(&r->km);
  if (lossless) {
    if (refkv_get(r->db, &r->km, w->state, w->uctx, n, &hit) != KVDB_OK)
      return wfail(w, "%s: %s", what, refkv_errmsg());
  }
  uint32_t n_q = 0;
  if (hit < n && refkv_prefill_queries(&r->km, w->state, w->ctx, n, hit, N_QUERIES, w->queries,
                                       &n_q) != KVDB_OK)
    return wfail(w, "%s: %s", what, refkv_errmsg());
  kvdb_put_info info;
  double t0 = now_s();
  if (refkv_put_ex(r->db, &r->km, w->state, w->uctx, n, w->queries, n_q, r->o->profile, &info) !=
      KVDB_OK)
    return wfail(w, "%s: %s", what, refkv_errmsg());
  s->put_seconds += now_s() - t0;
  if (!lossless && r->o->quality_steps > 0) {
    refkv_quality q;
    if (refkv_quality_measure(r->db, &r->km, w->ref, w->state, w->ctx, n, r->o->quality_steps,
                              &q) != KVDB_OK ||
        refkv_report_quality(r->db, &r->km, w->uctx, n, q.agreement) != KVDB_OK)
      return wfail(w, "%s: quality: %s", what, refkv_errmsg());
    s->quality_windows++;
    s->quality_agreement += q.agreement;
    s->quality_kl += q.mean_kl;
    if (q.max_kl > s->quality_max_kl)
      s->quality_max_kl = q.max_kl;
  }
  s->windows_stored++;
  s->tokens_computed += n - hit;
  s->tokens_restored += hit;
  s->kv_bytes += (uint64_t)n * refkv_token_bytes(&r->km);
  s->bytes_written += info.bytes_written;
  s->blocks_written += info.blocks_written;
  s->blocks_shared += info.blocks_shared;
  return 0;
}

static int do_text(worker *w, const doc *d, ingest_stats *s)
{
  run *r = w->r;
  char what[4200];
  if (d->len == 0) {
    s->docs_empty++;
    return 0;
  }
  size_t cap = refmodel_encode_bound(d->len), n_tok = 0;
  if (cap > w->text_cap) {
    int *t = realloc(w->text_tokens, cap * sizeof *t);
    if (t == NULL)
      return wfail(w, "'%s' line %llu: out of memory for %zu tokens", d->src->path,
                   (unsigned long long)d->line, cap);
    w->text_tokens = t;
    w->text_cap = cap;
  }
  int rc = refmodel_encode(r->tok, d->text, d->len, 0, w->text_tokens, cap, &n_tok);
  if (rc != REFMODEL_OK)
    return wfail(w, "'%s' line %llu: tokenizing: %s: %s", d->src->path, (unsigned long long)d->line,
                 refmodel_strerror(rc), refmodel_errmsg());
  size_t per = (size_t)r->window - 1;
  for (size_t start = 0;; start += (size_t)r->stride) {
    size_t m = n_tok - start < per ? n_tok - start : per;
    w->ctx[0] = REFMODEL_TOKEN_BOS;
    memcpy(w->ctx + 1, w->text_tokens + start, m * sizeof *w->ctx);
    for (size_t i = 0; i <= m; i++)
      w->uctx[i] = (uint32_t)w->ctx[i];
    snprintf(what, sizeof what, "'%s' line %llu (document %llu, tokens %zu..%zu)", d->src->path,
             (unsigned long long)d->line, (unsigned long long)d->index + 1, start, start + m);
    if (put_window(w, m + 1, s, what) != 0)
      return -1;
    if (start + per >= n_tok)
      break;
  }
  return 0;
}

static int do_safetensors(worker *w, const doc *d, ingest_stats *s)
{
  run *r = w->r;
  st_context c;
  if (st_open(d->src->path, &c, w->err, sizeof w->err) != 0)
    return -1;
  int ret = -1;
  const char *id = r->o->model_id != NULL ? r->o->model_id : c.model_id;
  if (id[0] == '\0') {
    wfail(w, "'%s': no model id: set --model-id or __metadata__.model_id", d->src->path);
    goto done;
  }
  kvdb_model m = {id,         c.n_layers, c.n_kv_heads,
                  c.head_dim, c.dtype,    r->o->block_tokens ? r->o->block_tokens : 16};
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.flags = r->o->profile ? KVDB_PUT_PROFILE : 0;
  kvdb_status crc = kvdb_config_parse(r->o->config != NULL ? r->o->config : "raw", &po.config);
  if (crc == KVDB_OK)
    crc = kvdb_config_check(&m, &po.config);
  if (crc != KVDB_OK) {
    wfail(w, "'%s': config '%s' does not fit its KV: %s", d->src->path,
          r->o->config != NULL ? r->o->config : "raw", kvdb_errmsg());
    goto done;
  }
  s->windows++;
  s->tokens += c.n_tokens;
  int have = stored(w, &m, c.tokens, c.n_tokens, d->src->path);
  if (have < 0)
    goto done;
  if (have) {
    s->windows_present++;
    ret = 0;
    goto done;
  }
  kvdb_put_info info;
  double t0 = now_s();
  kvdb_status rc = kvdb_put_ex(r->db, &m, c.tokens, c.n_tokens, &c.view, &po, &info);
  s->put_seconds += now_s() - t0;
  if (rc != KVDB_OK) {
    wfail(w, "'%s': kvdb_put: %s: %s", d->src->path, kvdb_status_name(rc), kvdb_errmsg());
    goto done;
  }
  s->windows_stored++;
  s->kv_bytes += (uint64_t)c.n_tokens * kvdb_model_token_bytes(&m);
  s->bytes_written += info.bytes_written;
  s->blocks_written += info.blocks_written;
  s->blocks_shared += info.blocks_shared;
  ret = 0;
done:
  st_close(&c);
  return ret;
}

static void maybe_progress(run *r, int final)
{
  double t = now_s();
  r->st.seconds = t - r->t0;
  if (r->o->progress == NULL)
    return;
  double every = r->o->progress_interval_s > 0 ? r->o->progress_interval_s : 1.0;
  if (!final && t - r->last_progress < every)
    return;
  r->last_progress = t;
  r->o->progress(r->o->progress_ctx, &r->st, final);
}

static void *work(void *arg)
{
  worker *w = arg;
  run *r = w->r;
  for (;;) {
    doc d;
    pthread_mutex_lock(&r->mu);
    int got = r->failed ? 0 : doc_reader_next(&r->reader, &d, w->err, sizeof w->err);
    pthread_mutex_unlock(&r->mu);
    if (got < 0)
      run_fail(r, w->err);
    if (got <= 0)
      break;
    ingest_stats s;
    memset(&s, 0, sizeof s);
    int rc = d.src->kind == SRC_SAFETENSORS ? do_safetensors(w, &d, &s) : do_text(w, &d, &s);
    free(d.text);
    pthread_mutex_lock(&r->mu);
    if (rc == 0) {
      s.docs = 1;
      s.bytes_done = d.src_bytes;
    }
    add_stats(&r->st, &s);
    if (rc == 0)
      maybe_progress(r, 0);
    pthread_mutex_unlock(&r->mu);
    if (rc != 0) {
      run_fail(r, w->err);
      break;
    }
  }
  return NULL;
}

void ingest_opts_init(ingest_opts *o)
{
  memset(o, 0, sizeof *o);
  o->storage = REFKV_STORE_F32;
  o->profile = 1;
  o->block_tokens = 16;
  o->jobs = 1;
  o->sync_mode = KVDB_SYNC_FULL;
  o->progress_interval_s = 1.0;
}

/* Load the model and tokenizer and check the window options against the model. */
static int load_model(run *r, char *err, size_t cap)
{
  const ingest_opts *o = r->o;
  if (o->model_path == NULL || o->tokenizer_path == NULL)
    return ingest_errf(err, cap, "text inputs need a model and a tokenizer (--model, --tokenizer)");
  int rc = refmodel_model_load(o->model_path, &r->rm);
  if (rc != REFMODEL_OK)
    return ingest_errf(err, cap, "model: %s: %s", refmodel_strerror(rc), refmodel_errmsg());
  const refmodel_config *c = refmodel_model_config(r->rm);
  rc = refmodel_tokenizer_load(o->tokenizer_path, c->vocab_size, &r->tok);
  if (rc != REFMODEL_OK)
    return ingest_errf(err, cap, "tokenizer: %s: %s", refmodel_strerror(rc), refmodel_errmsg());
  if (refkv_model_init(&r->km, r->rm, o->model_id, o->model_path, o->storage, o->block_tokens) !=
          KVDB_OK ||
      refkv_model_set_config(&r->km, o->config != NULL ? o->config : "raw") != KVDB_OK)
    return ingest_errf(err, cap, "%s", refkv_errmsg());
  r->window = o->window ? o->window : c->seq_len;
  if (r->window < 2 || r->window > c->seq_len)
    return ingest_errf(err, cap,
                 "--window %d: must be 2..%d (BOS and at least one token; the model's "
                 "seq_len is %d)",
                 r->window, c->seq_len, c->seq_len);
  r->stride = o->stride ? o->stride : r->window - 1;
  if (r->stride < 1 || r->stride > r->window - 1)
    return ingest_errf(err, cap,
                 "--stride %d: must be 1..%d (window - 1; a larger stride would skip "
                 "text)",
                 o->stride, r->window - 1);
  return 0;
}

int ingest_run(const ingest_opts *o, ingest_stats *stats, char *err, size_t err_cap)
{
  run *r = calloc(1, sizeof *r);
  worker *ws = NULL;
  pthread_t *th = NULL;
  int rc = -1, n_started = 0, mu_ready = 0;
  memset(stats, 0, sizeof *stats);
  if (r == NULL)
    return ingest_errf(err, err_cap, "out of memory");
  r->o = o;
  r->t0 = r->last_progress = now_s();
  int jobs = o->jobs ? o->jobs : 1;
  if (o->db_dir == NULL || o->n_inputs == 0) {
    ingest_errf(err, err_cap, "no %s given", o->db_dir == NULL ? "database directory" : "input");
    goto out;
  }
  if (jobs < 1 || jobs > MAX_JOBS) {
    ingest_errf(err, err_cap, "--jobs %d: must be 1..%d", jobs, MAX_JOBS);
    goto out;
  }
  if (o->quality_steps < 0 || o->quality_steps > 4096) {
    ingest_errf(err, err_cap, "--quality-steps %d: must be 0..4096", o->quality_steps);
    goto out;
  }
  if (o->config != NULL) {
    kvdb_config kc;
    kvdb_status crc = kvdb_config_parse(o->config, &kc);
    if (crc != KVDB_OK) {
      ingest_errf(err, err_cap, "--config: %s", kvdb_errmsg());
      goto out;
    }
  }
  if (refkv_storage_name(o->storage) == NULL) {
    ingest_errf(err, err_cap, "storage %d is not a refkv_storage", (int)o->storage);
    goto out;
  }
  uint32_t bt = o->block_tokens ? o->block_tokens : 16;
  if (bt < 16 || bt > 4096 || (bt & (bt - 1)) != 0) {
    ingest_errf(err, err_cap, "--block-tokens %u: must be a power of two from 16 to 4096", bt);
    goto out;
  }
  if (src_list_build(o->inputs, o->n_inputs, &r->list, err, err_cap) != 0)
    goto out;
  r->st.files = r->list.n;
  r->st.files_ignored = r->list.ignored;
  r->st.jobs = jobs;
  if (docs_count(&r->list, o->max_docs, &r->st.docs_total, &r->st.bytes_total, err, err_cap) != 0)
    goto out;
  if (r->list.n_text > 0) {
    if (load_model(r, err, err_cap) != 0)
      goto out;
    snprintf(r->st.model_id, sizeof r->st.model_id, "%s", r->km.id);
    r->st.window = r->window;
    r->st.stride = r->stride;
    refkv_model_describe(&r->km, r->st.storage, sizeof r->st.storage);
  }

  kvdb_options ko;
  kvdb_options_init(&ko);
  ko.sync_mode = o->sync_mode;
  kvdb_status ks = kvdb_open(o->db_dir, &ko, &r->db);
  if (ks != KVDB_OK) {
    ingest_errf(err, err_cap, "cannot open the database '%s': %s: %s", o->db_dir, kvdb_status_name(ks),
          kvdb_errmsg());
    goto out;
  }
  if (pthread_mutex_init(&r->mu, NULL) != 0) {
    ingest_errf(err, err_cap, "cannot create a mutex");
    goto out;
  }
  mu_ready = 1;
  doc_reader_open(&r->reader, &r->list, o->text_field, o->max_docs);

  ws = calloc((size_t)jobs, sizeof *ws);
  th = calloc((size_t)jobs, sizeof *th);
  if (ws == NULL || th == NULL) {
    ingest_errf(err, err_cap, "out of memory");
    goto out;
  }
  for (int i = 0; i < jobs; i++) {
    worker *w = &ws[i];
    w->r = r;
    if (r->rm != NULL) {
      /* a quality measurement continues a window for quality_steps positions past it */
      int positions = r->window + (o->quality_steps > 0 ? o->quality_steps : 0);
      int mrc = refmodel_state_new(r->rm, positions, &w->state);
      if (mrc == REFMODEL_OK && o->quality_steps > 0)
        mrc = refmodel_state_new(r->rm, positions, &w->ref);
      w->ctx = malloc((size_t)r->window * sizeof *w->ctx);
      w->uctx = malloc((size_t)r->window * sizeof *w->uctx);
      w->queries = malloc(N_QUERIES * r->km.q_floats * sizeof *w->queries);
      if (mrc != REFMODEL_OK || w->ctx == NULL || w->uctx == NULL || w->queries == NULL) {
        ingest_errf(err, err_cap, "out of memory for worker %d", i + 1);
        goto join;
      }
    }
  }
  for (int i = 0; i < jobs; i++) {
    if (pthread_create(&th[i], NULL, work, &ws[i]) != 0) {
      run_fail(r, "cannot start a worker thread");
      break;
    }
    n_started++;
  }
join:
  for (int i = 0; i < n_started; i++)
    pthread_join(th[i], NULL);
  if (n_started == jobs) {
    if (r->failed)
      ingest_errf(err, err_cap, "%s", r->err);
    else
      rc = 0;
  } else if (r->failed) {
    ingest_errf(err, err_cap, "%s", r->err);
  }
  pthread_mutex_lock(&r->mu);
  maybe_progress(r, 1);
  pthread_mutex_unlock(&r->mu);
out:
  if (r->db != NULL)
    r->st.seconds = now_s() - r->t0;
  *stats = r->st;
  for (int i = 0; ws != NULL && i < jobs; i++) {
    refmodel_state_free(ws[i].state);
    refmodel_state_free(ws[i].ref);
    free(ws[i].queries);
    free(ws[i].text_tokens);
    free(ws[i].ctx);
    free(ws[i].uctx);
    free(ws[i].hashes);
  }
  free(ws);
  free(th);
  doc_reader_close(&r->reader);
  if (mu_ready)
    pthread_mutex_destroy(&r->mu);
  kvdb_close(r->db);
  refmodel_tokenizer_free(r->tok);
  refmodel_model_free(r->rm);
  src_list_free(&r->list);
  free(r);
  return rc;
}
