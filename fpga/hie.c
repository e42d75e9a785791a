/* SPDX-License-Identifier: MIT */
/*
 * fpga/hie.c — Hierarchical Importance Evaluation (HillInfer §4.2; Algorithm 1 in the appendix
 * of seed 000): the device scores its resident tokens in chunks of n while the host scores its
 * own; each chunk's score block streams back when the chunk is done and is merged at once into
 * the device-side top k (Algorithm 1 lines 8 and 11: "transfer S_i asynchronously",
 * "incrementally merge"); at the end the host's top k and the device's are merged (lines 14-15).
 *
 * Threads: the calling thread scores the host spans (kv_score_topk, with its own helper threads
 * per job->host_opts) while one device thread drives the device (the calling thread itself when
 * there are no host spans): P2P read of a section (read ahead by the device's pool of up to 8
 * reader threads into 16 slots of one buffer the device keeps, so that the section reads are in
 * flight together, across the jobs of a kv_hie_topk_batch call: sect_reader, kv_hie_pool), then
 * kernel runs over its chunks with two result buffers, so that run j+1 is started before run j's
 * block is read and merged (with XRT the merge overlaps the next run; the emulated device runs
 * the kernel inside run_start, on that thread, concurrently with the host's scoring). The device
 * thread is joined and the pool's threads have left the call's reads before the call returns.
 *
 * k > 64 (beyond the on-chip insertion array): a chunk's top min(k, n) would be its whole block
 * (8 bytes per token to the host: with kvdb's 256-token blocks, each its own section, every
 * run is a chunk smaller than k). Instead each run writes its block at its own place of one
 * device buffer (kv_fpga_run_args.blocks_off) and after the last run one kv_fpga_select sends
 * the device's top min(k, N_dev) pairs: the merge of Algorithm 1 line 11 moves onto the device
 * for the part that would not fit on chip, and min(k, N_dev) pairs cross instead of N_dev.
 *
 * Correctness: the global top k is contained in the union of the host's top min(k, N_host) and
 * every chunk's top min(k, n) (a chunk's on-chip top k when k <= 64), or the device's top
 * min(k, N_dev) (the select kernel's exact radix select), and score.h ORDER is total, so the
 * result equals kv_score_topk over all tokens bit for bit (tests/unit: test_fpga_hie).
 */
#define _GNU_SOURCE
#include "fpga_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAIL KV_FPGA_FAIL

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct dev_work {
  kv_fpga_dev *dev;
  const kv_hie_job *job;
  uint32_t k;
  uint64_t n_dev; /* the job's device tokens */
  kv_score_acc acc;
  uint64_t p2p_bytes, to_host, runs, selects, ns, bytes, tokens;
} dev_work;

/* Read the results of a finished run and merge them into the device-side accumulator. */
static kv_fpga_status merge_run(dev_work *w, kv_fpga_buf *blocks, kv_fpga_buf *topk, uint32_t n,
                                kv_score_pair *tmp, kv_fpga_err *err)
{
  uint32_t m = w->k <= KV_FPGA_MAX_TOPK ? (w->k < n ? w->k : n) : n;
  kv_fpga_buf *src = w->k <= KV_FPGA_MAX_TOPK ? topk : blocks;
  kv_fpga_status rc = kv_fpga_buf_read(w->dev, src, 0, tmp, (size_t)m * sizeof *tmp, err);
  if (rc != KV_FPGA_OK)
    return rc;
  w->to_host += (uint64_t)m * sizeof *tmp;
  kv_score_acc_push_pairs(&w->acc, tmp, m);
  return KV_FPGA_OK;
}

/* Select mode (k > KV_FPGA_MAX_TOPK): where each run's block lies in the shared blocks buffer
 * (pairs, 8-aligned: 64-byte offsets), and the total. */
static uint64_t select_layout(const kv_hie_job *job, uint32_t chunk, uint32_t *segs)
{
  uint64_t at = 0;
  size_t r = 0;
  for (size_t i = 0; i < job->n_dev; i++)
    for (uint32_t t0 = 0; t0 < job->dev[i].layout.n_tokens; t0 += chunk) {
      uint32_t n = job->dev[i].layout.n_tokens - t0 < chunk ? job->dev[i].layout.n_tokens - t0 : chunk;
      if (segs != NULL) {
        segs[2 * r] = (uint32_t)at;
        segs[2 * r + 1] = n;
      }
      r++;
      at += (n + 7u) / 8u * 8u;
    }
  return at;
}

/* ---- the section reads, ahead of the kernel runs ----
 *
 * The sections of every job of a call, in order, form one queue: up to HIE_READERS threads of
 * the device's reader pool P2P-read them into HIE_SLOTS slots of one device buffer (a slot is
 * reused once the device thread is done with the section HIE_SLOTS before), so that up to
 * HIE_READERS reads are in flight (queue depth) while the device scores the sections already
 * read, the next job's first sections included. The reads are the ones a single thread made one
 * after the other before (same bytes, same buffers). The pool (struct kv_hie_pool) is the
 * device's: started at its first job, it waits between jobs and is joined by kv_fpga_close, so
 * no thread is started or joined on a job's path. */
#define HIE_READERS 8
#define HIE_SLOTS 16

typedef struct sect_item {
  int fd;
  uint64_t off, len;
} sect_item;

typedef struct sect_reader {
  kv_fpga_dev *dev;
  const sect_item *items;
  size_t n;
  kv_fpga_buf *buf;
  uint64_t stride; /* bytes of a slot */
  uint32_t slots;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t next;     /* the next section to read */
  size_t consumed; /* sections [0, consumed) are done with: their slots are free */
  uint8_t *ready;  /* per section */
  int stop;        /* an error, or the device thread gave up */
  kv_fpga_status rc;
  kv_fpga_err err;
} sect_reader;

struct kv_hie_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th[HIE_READERS];
  size_t n_th;
  sect_reader *cur; /* the job being read, or NULL */
  uint64_t gen;     /* counts the readers handed to the pool */
  size_t busy;      /* threads inside cur */
  int shutdown;
};

/* Read sections of r until all are read, an error, or stop. */
static void reader_loop(sect_reader *r)
{
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->stop && r->next < r->n && r->next - r->consumed >= r->slots)
      pthread_cond_wait(&r->cv, &r->mu);
    if (r->stop || r->next >= r->n)
      break;
    size_t i = r->next++;
    pthread_mutex_unlock(&r->mu);
    const sect_item *it = &r->items[i];
    kv_fpga_err e;
    kv_fpga_status rc = kv_fpga_p2p_read(r->dev, r->buf, (size_t)((i % r->slots) * r->stride),
                                         it->fd, it->off, (size_t)it->len, &e);
    pthread_mutex_lock(&r->mu);
    if (rc != KV_FPGA_OK) {
      if (r->rc == KV_FPGA_OK) {
        r->rc = rc;
        r->err = e;
      }
      r->stop = 1;
    } else {
      r->ready[i] = 1;
    }
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&r->mu);
}

static void *pool_main(void *arg)
{
  struct kv_hie_pool *p = arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->shutdown && (p->cur == NULL || p->gen == seen))
      pthread_cond_wait(&p->cv, &p->mu);
    if (p->shutdown)
      break;
    seen = p->gen;
    sect_reader *r = p->cur;
    p->busy++;
    pthread_mutex_unlock(&p->mu);
    reader_loop(r);
    pthread_mutex_lock(&p->mu);
    p->busy--;
    pthread_cond_broadcast(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void hie_pool_free(struct kv_hie_pool *p)
{
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mu);
  p->shutdown = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (size_t i = 0; i < p->n_th; i++)
    pthread_join(p->th[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

/* The device's pool, started at its first job (as many threads as start, at least one). */
static kv_fpga_status pool_get(kv_fpga_dev *dev, struct kv_hie_pool **out, kv_fpga_err *err)
{
  if (dev->hie_pool != NULL) {
    *out = dev->hie_pool;
    return KV_FPGA_OK;
  }
  struct kv_hie_pool *p = calloc(1, sizeof *p);
  if (p == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for the section reader pool", sizeof *p, 0);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  for (; p->n_th < HIE_READERS; p->n_th++)
    if (pthread_create(&p->th[p->n_th], NULL, pool_main, p) != 0)
      break;
  if (p->n_th == 0) {
    hie_pool_free(p);
    return FAIL(err, KV_FPGA_ENOMEM, "cannot start a section reader thread", 0, 0);
  }
  dev->hie_pool = *out = p;
  dev->hie_pool_free = hie_pool_free;
  return KV_FPGA_OK;
}

/* Hand r to the pool's threads. */
static kv_fpga_status pool_start(struct kv_hie_pool *p, sect_reader *r, kv_fpga_err *err)
{
  pthread_mutex_lock(&p->mu);
  if (p->cur != NULL) {
    pthread_mutex_unlock(&p->mu);
    return FAIL(err, KV_FPGA_EINVAL, "the device is running another job (one thread at a time)",
                0, 0);
  }
  p->cur = r;
  p->gen++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return KV_FPGA_OK;
}

/* Stop r's reads and wait until no pool thread is inside it (it may then go). */
static void pool_stop(struct kv_hie_pool *p, sect_reader *r)
{
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_lock(&p->mu);
  p->cur = NULL;
  while (p->busy > 0)
    pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/* Wait until section i is read; returns its status. */
static kv_fpga_status reader_wait(sect_reader *r, size_t i, kv_fpga_err *err)
{
  pthread_mutex_lock(&r->mu);
  while (!r->ready[i] && !r->stop)
    pthread_cond_wait(&r->cv, &r->mu);
  kv_fpga_status rc = r->ready[i] ? KV_FPGA_OK : r->rc != KV_FPGA_OK ? r->rc : KV_FPGA_EIO;
  if (rc != KV_FPGA_OK && err != NULL)
    *err = r->err;
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* Sections [0, n) are done with (their runs finished). */
static void reader_consumed(sect_reader *r, size_t n)
{
  pthread_mutex_lock(&r->mu);
  r->consumed = n;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* One job's device part: its sections are rd's items [base, base + job->n_dev). */
static kv_fpga_status dev_run_job(dev_work *w, sect_reader *rd, size_t base, kv_fpga_err *err)
{
  const kv_hie_job *job = w->job;
  uint32_t chunk = job->chunk_tokens ? job->chunk_tokens : 16384;
  size_t n_runs = 0;
  for (size_t i = 0; i < job->n_dev; i++)
    n_runs += (job->dev[i].layout.n_tokens + chunk - 1) / chunk;
  /* on-chip top k, or (k > 64) every block kept on the device and one selection, or (too many
   * tokens for that) every block to the host */
  int on_chip = w->k <= KV_FPGA_MAX_TOPK;
  int sel = !on_chip && w->n_dev <= KV_HIE_SELECT_MAX_TOKENS;
  uint32_t ksel = (uint32_t)(w->k < w->n_dev ? w->k : w->n_dev);
  kv_fpga_buf *sect = rd->buf, *query = NULL, *blocks[2] = {NULL, NULL}, *topk[2] = {NULL, NULL};
  kv_fpga_buf *all = NULL, *sdesc = NULL, *sout = NULL;
  uint32_t *segs = NULL;
  size_t tmp_n = sel ? ksel : chunk;
  kv_score_pair *tmp = malloc(tmp_n * sizeof *tmp);
  uint8_t *qpack = malloc(KV_FPGA_QUERY_BYTES);
  kv_fpga_status rc = KV_FPGA_OK;
  kv_fpga_run *pending = NULL;
  uint32_t pending_n = 0;
  int pending_slot = 0;
  uint64_t t_start = now_ns();
  if (tmp == NULL || qpack == NULL) {
    rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the score block staging", tmp_n, 0);
    goto out;
  }
  if ((rc = kv_fpga_buf_alloc(w->dev, KV_FPGA_QUERY_BYTES, KV_FPGA_BUF_IN, &query, err)))
    goto out;
  if (sel) {
    segs = malloc(n_runs * 2 * sizeof *segs);
    if (segs == NULL) {
      rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the select segments", n_runs, 0);
      goto out;
    }
    uint64_t pairs = select_layout(job, chunk, segs);
    if ((rc = kv_fpga_buf_alloc(w->dev, (size_t)pairs * 8, KV_FPGA_BUF_OUT, &all, err)) ||
        (rc = kv_fpga_buf_alloc(w->dev, n_runs * 8, KV_FPGA_BUF_IN, &sdesc, err)) ||
        (rc = kv_fpga_buf_alloc(w->dev, (size_t)ksel * 8, KV_FPGA_BUF_OUT, &sout, err)))
      goto out;
  } else {
    for (int s = 0; s < 2; s++) {
      if ((rc = kv_fpga_buf_alloc(w->dev, (size_t)chunk * 8, KV_FPGA_BUF_OUT, &blocks[s], err)))
        goto out;
      if (on_chip &&
          (rc = kv_fpga_buf_alloc(w->dev, (size_t)w->k * 8, KV_FPGA_BUF_OUT, &topk[s], err)))
        goto out;
    }
  }
  if ((rc = kv_fpga_query_pack(job->q, qpack, KV_FPGA_QUERY_BYTES, err)) ||
      (rc = kv_fpga_buf_write(w->dev, query, 0, qpack, KV_FPGA_QUERY_BYTES, err)))
    goto out;
  int slot = 0;
  size_t run_i = 0;
  for (size_t i = 0; i < job->n_dev; i++) {
    const kv_hie_dev_span *ds = &job->dev[i];
    size_t g = base + i; /* in the call's queue of sections */
    /* the previous section's runs must be done before its buffer is overwritten */
    if (pending != NULL) {
      kv_fpga_run *r = pending;
      pending = NULL;
      if ((rc = kv_fpga_run_wait(r, err)) ||
          (!sel && (rc = merge_run(w, blocks[pending_slot], topk[pending_slot], pending_n, tmp,
                                   err))))
        goto out;
    }
    reader_consumed(rd, g); /* sections before g: their runs are done */
    if ((rc = reader_wait(rd, g, err)))
      goto out;
    w->p2p_bytes += ds->layout.total_bytes;
    uint64_t soff = (g % rd->slots) * rd->stride;
    for (uint32_t t0 = 0; t0 < ds->layout.n_tokens; t0 += chunk, run_i++) {
      uint32_t n = ds->layout.n_tokens - t0 < chunk ? ds->layout.n_tokens - t0 : chunk;
      kv_fpga_run_args a = {sect, soff, ds->layout, t0, n, ds->pos_base, on_chip ? w->k : 0, query,
                            sel ? all : blocks[slot], on_chip ? topk[slot] : NULL,
                            sel ? (size_t)segs[2 * run_i] * 8 : 0};
      kv_fpga_run *r;
      if ((rc = kv_fpga_run_start(w->dev, &a, &r, err)))
        goto out;
      w->runs++;
      w->tokens += n;
      w->bytes += (uint64_t)n * ds->layout.row_bytes;
      if (pending != NULL) { /* merge the previous chunk while this one runs */
        kv_fpga_run *p = pending;
        pending = NULL;
        if ((rc = kv_fpga_run_wait(p, err)) ||
            (!sel && (rc = merge_run(w, blocks[pending_slot], topk[pending_slot], pending_n, tmp,
                                     err)))) {
          (void)kv_fpga_run_wait(r, NULL);
          goto out;
        }
      }
      pending = r;
      pending_n = n;
      pending_slot = slot;
      slot ^= 1;
    }
  }
  if (pending != NULL) {
    kv_fpga_run *r = pending;
    pending = NULL;
    if ((rc = kv_fpga_run_wait(r, err)) ||
        (!sel && (rc = merge_run(w, blocks[pending_slot], topk[pending_slot], pending_n, tmp,
                                 err))))
      goto out;
  }
  reader_consumed(rd, base + job->n_dev); /* the job's slots are free for the next job */
  if (sel && n_runs > 0) { /* the device's top k, selected where the blocks are */
    kv_fpga_select_args a = {all, sdesc, sout, segs, (uint32_t)n_runs, ksel};
    if ((rc = kv_fpga_select(w->dev, &a, err)) ||
        (rc = kv_fpga_buf_read(w->dev, sout, 0, tmp, (size_t)ksel * sizeof *tmp, err)))
      goto out;
    w->selects++;
    w->to_host += (uint64_t)ksel * sizeof *tmp;
    kv_score_acc_push_pairs(&w->acc, tmp, ksel);
  }
out:
  if (pending != NULL)
    (void)kv_fpga_run_wait(pending, NULL);
  for (int s = 0; s < 2; s++) {
    kv_fpga_buf_free(blocks[s]);
    kv_fpga_buf_free(topk[s]);
  }
  kv_fpga_buf_free(all);
  kv_fpga_buf_free(sdesc);
  kv_fpga_buf_free(sout);
  kv_fpga_buf_free(query);
  free(segs);
  free(tmp);
  free(qpack);
  w->ns = now_ns() - t_start;
  return rc;
}

/* The device part of a call: every job with device sections, in order, over one queue of
 * section reads (the pool reading ahead across jobs). */
typedef struct dev_batch {
  kv_fpga_dev *dev;
  dev_work *w;
  size_t n;
  kv_fpga_status rc;
  kv_fpga_err err;
} dev_batch;

static kv_fpga_status dev_run_batch(dev_batch *b)
{
  kv_fpga_dev *dev = b->dev;
  size_t n_items = 0;
  uint64_t max_sect = 0;
  for (size_t j = 0; j < b->n; j++)
    for (size_t i = 0; i < b->w[j].job->n_dev; i++) {
      n_items++;
      if (b->w[j].job->dev[i].layout.total_bytes > max_sect)
        max_sect = b->w[j].job->dev[i].layout.total_bytes;
    }
  if (n_items == 0)
    return KV_FPGA_OK;
  sect_reader rd;
  memset(&rd, 0, sizeof rd);
  rd.dev = dev;
  rd.n = n_items;
  rd.slots = n_items < HIE_SLOTS ? (uint32_t)n_items : HIE_SLOTS;
  rd.stride = (max_sect + 4095) / 4096 * 4096;
  pthread_mutex_init(&rd.mu, NULL);
  pthread_cond_init(&rd.cv, NULL);
  sect_item *items = malloc(n_items * sizeof *items);
  rd.ready = calloc(n_items, 1);
  kv_fpga_status rc = KV_FPGA_OK;
  struct kv_hie_pool *pool = NULL;
  int started = 0;
  kv_fpga_buf *sect = NULL;
  if (items == NULL || rd.ready == NULL) {
    rc = FAIL(&b->err, KV_FPGA_ENOMEM, "out of memory for the section reads", n_items, 0);
    goto out;
  }
  n_items = 0;
  for (size_t j = 0; j < b->n; j++)
    for (size_t i = 0; i < b->w[j].job->n_dev; i++)
      items[n_items++] = (sect_item){b->w[j].job->fd, b->w[j].job->dev[i].file_off,
                                     b->w[j].job->dev[i].layout.total_bytes};
  rd.items = items;
  size_t sect_bytes = (size_t)(rd.stride * rd.slots);
  if (dev->hie_sect != NULL && kv_fpga_buf_size(dev->hie_sect) >= sect_bytes) {
    sect = dev->hie_sect; /* the last call's (the device's: one call at a time) */
    dev->hie_sect = NULL;
  } else {
    kv_fpga_buf_free(dev->hie_sect); /* too small */
    dev->hie_sect = NULL;
    if ((rc = kv_fpga_buf_alloc(dev, sect_bytes, KV_FPGA_BUF_P2P, &sect, &b->err)))
      goto out;
  }
  rd.buf = sect;
  if ((rc = pool_get(dev, &pool, &b->err)) || (rc = pool_start(pool, &rd, &b->err)))
    goto out;
  started = 1;
  size_t base = 0;
  for (size_t j = 0; j < b->n; j++) {
    if (b->w[j].job->n_dev == 0)
      continue;
    if ((rc = dev_run_job(&b->w[j], &rd, base, &b->err)))
      goto out;
    base += b->w[j].job->n_dev;
  }
out:
  if (started) /* the readers leave rd (all read, or an error) before sect goes */
    pool_stop(pool, &rd);
  if (sect != NULL) { /* kept for the next call */
    kv_fpga_buf_free(dev->hie_sect);
    dev->hie_sect = sect;
  }
  pthread_mutex_destroy(&rd.mu);
  pthread_cond_destroy(&rd.cv);
  free(rd.ready);
  free(items);
  return rc;
}

static void *dev_main(void *arg)
{
  dev_batch *b = arg;
  b->rc = dev_run_batch(b);
  return NULL;
}

/* A job's checks; its host and device token counts and host code bytes. */
static kv_fpga_status job_check(kv_fpga_dev *dev, const kv_hie_job *job, uint32_t k,
                                uint64_t *n_host_out, uint64_t *n_dev_out, uint64_t *host_bytes,
                                kv_fpga_err *err)
{
  if (job == NULL || job->q == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL job or query", 0, 0);
  if (k == 0)
    return FAIL(err, KV_FPGA_EINVAL, "k is 0", 0, 1);
  if (job->n_dev > 0 && (dev == NULL || job->dev == NULL))
    return FAIL(err, KV_FPGA_EINVAL, "device spans without a device", job->n_dev, 0);
  if (job->n_host > 0 && job->host == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL host spans", job->n_host, 0);
  if (job->chunk_tokens % 64 != 0)
    return FAIL(err, KV_FPGA_EINVAL, "chunk_tokens must be a multiple of 64", job->chunk_tokens, 64);
  uint64_t n_host = 0, n_dev = 0;
  *host_bytes = 0;
  for (size_t i = 0; i < job->n_host; i++) {
    n_host += job->host[i].n;
    if (job->host[i].view != NULL)
      *host_bytes += (uint64_t)job->host[i].n * job->host[i].view->layout.row_bytes;
  }
  for (size_t i = 0; i < job->n_dev; i++) {
    const kv_hie_dev_span *d = &job->dev[i];
    kv_score_layout chk;
    if (d->layout.variant != 0)
      return FAIL(err, KV_FPGA_EUNSUPPORTED,
                  "centered (version 2) score copies are scored on the host only (value: span)", i,
                  0);
    if (kv_score_layout_init(&chk, d->layout.n_tokens, d->layout.head_dim, d->layout.bits, NULL) !=
            KV_SCORE_OK ||
        memcmp(&chk, &d->layout, sizeof chk) != 0)
      return FAIL(err, KV_FPGA_EINVAL, "device span layout is not a kv_score_layout (value: span)",
                  i, 0);
    if (d->file_off % 4096 != 0)
      return FAIL(err, KV_FPGA_EINVAL, "device span not 4096-aligned in the file (value: span)", i,
                  4096);
    if (d->layout.head_dim != kv_score_query_head_dim(job->q))
      return FAIL(err, KV_FPGA_EINVAL, "device span head_dim differs from the query's", i, 0);
    n_dev += d->layout.n_tokens;
  }
  if (k > n_host + n_dev)
    return FAIL(err, KV_FPGA_EINVAL, "k is larger than the number of tokens", k, n_host + n_dev);
  *n_host_out = n_host;
  *n_dev_out = n_dev;
  return KV_FPGA_OK;
}

kv_fpga_status kv_hie_topk_batch(kv_fpga_dev *dev, const kv_hie_job *jobs, size_t n_jobs,
                                 kv_hie_result *res, kv_fpga_err *err)
{
  uint64_t t_start = now_ns();
  if (n_jobs > 0 && (jobs == NULL || res == NULL))
    return FAIL(err, KV_FPGA_EINVAL, "NULL jobs or results", n_jobs, 0);
  for (size_t j = 0; j < n_jobs; j++) {
    res[j].n = 0;
    memset(&res[j].stats, 0, sizeof res[j].stats);
    if (res[j].pos == NULL && res[j].scores == NULL)
      return FAIL(err, KV_FPGA_EINVAL, "NULL outputs (both positions and scores; value: job)", j,
                  0);
  }
  dev_work *w = calloc(n_jobs ? n_jobs : 1, sizeof *w);
  uint64_t *n_host = calloc(n_jobs ? n_jobs : 1, sizeof *n_host);
  uint64_t *host_bytes = calloc(n_jobs ? n_jobs : 1, sizeof *host_bytes);
  void **mem = calloc(n_jobs ? n_jobs : 1, 3 * sizeof *mem); /* device acc, host pos, host scores */
  uint32_t *got_h = calloc(n_jobs ? n_jobs : 1, sizeof *got_h);
  void *fin_mem = NULL;
  kv_fpga_status rc = KV_FPGA_OK;
  if (w == NULL || n_host == NULL || host_bytes == NULL || mem == NULL || got_h == NULL) {
    rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the jobs", n_jobs, 0);
    goto out;
  }
  uint32_t max_k = 0;
  int any_dev = 0, any_host = 0;
  for (size_t j = 0; j < n_jobs; j++) {
    if ((rc = job_check(dev, &jobs[j], res[j].k, &n_host[j], &w[j].n_dev, &host_bytes[j], err)))
      goto out;
    w[j].dev = dev;
    w[j].job = &jobs[j];
    w[j].k = res[j].k;
    max_k = res[j].k > max_k ? res[j].k : max_k;
    if (w[j].n_dev > 0) {
      any_dev = 1;
      size_t ab = kv_score_acc_bytes(res[j].k);
      if ((mem[3 * j] = malloc(ab)) == NULL) {
        rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the device top k", res[j].k, 0);
        goto out;
      }
      (void)kv_score_acc_init(&w[j].acc, res[j].k, mem[3 * j], ab, NULL);
    }
    uint32_t kh = n_host[j] < res[j].k ? (uint32_t)n_host[j] : res[j].k;
    if (kh > 0) {
      any_host = 1;
      if ((mem[3 * j + 1] = malloc((size_t)kh * 4)) == NULL ||
          (mem[3 * j + 2] = malloc((size_t)kh * 4)) == NULL) {
        rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the host top k", kh, 0);
        goto out;
      }
    }
  }
  /* the device's part on a thread of its own while this one scores the host's tokens; with no
   * host tokens, on this thread */
  dev_batch b = {dev, w, n_jobs, KV_FPGA_OK, {0}};
  pthread_t tid;
  int started = 0;
  if (any_dev && any_host)
    started = pthread_create(&tid, NULL, dev_main, &b) == 0;
  for (size_t j = 0; j < n_jobs && rc == KV_FPGA_OK; j++) {
    uint32_t kh = n_host[j] < res[j].k ? (uint32_t)n_host[j] : res[j].k;
    if (kh == 0)
      continue;
    uint64_t t_host = now_ns();
    kv_score_err se;
    if (kv_score_topk(jobs[j].q, jobs[j].host, jobs[j].n_host, kh, &jobs[j].host_opts, NULL, 0,
                      mem[3 * j + 1], mem[3 * j + 2], &got_h[j], &se) != KV_SCORE_OK)
      rc = FAIL(err, se.code == KV_SCORE_ENOMEM ? KV_FPGA_ENOMEM : KV_FPGA_EINVAL,
                se.what ? se.what : "host scoring failed", se.value, se.limit);
    res[j].stats.host_ns = now_ns() - t_host;
  }
  if (any_dev) {
    if (started)
      pthread_join(tid, NULL);
    else
      dev_main(&b);
    if (rc == KV_FPGA_OK && b.rc != KV_FPGA_OK) {
      rc = b.rc;
      if (err != NULL)
        *err = b.err;
    }
  }
  if (rc == KV_FPGA_OK && (fin_mem = malloc(kv_score_acc_bytes(max_k))) == NULL)
    rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the merged top k", max_k, 0);
  for (size_t j = 0; j < n_jobs && rc == KV_FPGA_OK; j++) {
    kv_score_acc fin;
    (void)kv_score_acc_init(&fin, res[j].k, fin_mem, kv_score_acc_bytes(res[j].k), NULL);
    const uint32_t *hpos = mem[3 * j + 1];
    const float *hsc = mem[3 * j + 2];
    for (uint32_t i = 0; i < got_h[j]; i++)
      kv_score_acc_push(&fin, hpos[i], hsc[i]);
    if (w[j].n_dev > 0)
      kv_score_acc_merge(&fin, &w[j].acc);
    res[j].n = kv_score_acc_finish(&fin, res[j].pos, res[j].scores);
  }
  for (size_t j = 0; rc == KV_FPGA_OK && j < n_jobs; j++) {
    kv_hie_stats *s = &res[j].stats;
    s->host_tokens = n_host[j];
    s->dev_tokens = w[j].tokens;
    s->host_bytes = host_bytes[j];
    s->dev_bytes = w[j].bytes;
    s->p2p_bytes = w[j].p2p_bytes;
    s->to_host_bytes = w[j].to_host;
    s->dev_runs = w[j].runs;
    s->dev_selects = w[j].selects;
    s->dev_ns = w[j].ns;
    s->total_ns = now_ns() - t_start;
  }
out:
  for (size_t j = 0; mem != NULL && j < 3 * n_jobs; j++)
    free(mem[j]);
  free(mem);
  free(w);
  free(n_host);
  free(host_bytes);
  free(got_h);
  free(fin_mem);
  return rc;
}

kv_fpga_status kv_hie_topk(kv_fpga_dev *dev, const kv_hie_job *job, uint32_t k, uint32_t *out_pos,
                           float *out_scores, uint32_t *n_out, kv_hie_stats *stats,
                           kv_fpga_err *err)
{
  if (n_out != NULL)
    *n_out = 0;
  if (job == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL job or query", 0, 0);
  kv_hie_result r;
  memset(&r, 0, sizeof r);
  r.pos = out_pos;
  r.scores = out_scores;
  r.k = k;
  kv_fpga_status rc = kv_hie_topk_batch(dev, job, 1, &r, err);
  if (rc == KV_FPGA_OK && n_out != NULL)
    *n_out = r.n;
  if (stats != NULL)
    *stats = r.stats;
  return rc;
}
