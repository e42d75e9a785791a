/* SPDX-License-Identifier: MIT */
/*
 * fpga/hie.c — Hierarchical Importance Evaluation (HillInfer §4.2; Algorithm 1 in the appendix
 * of seed 000): the device scores its resident tokens in chunks of n while the host scores its
 * own; each chunk's score block streams back when the chunk is done and is merged at once into
 * the device-side top k (Algorithm 1 lines 8 and 11: "transfer S_i asynchronously",
 * "incrementally merge"); at the end the host's top k and the device's are merged (lines 14-15).
 *
 * Threads: the calling thread scores the host spans (kv_score_topk, with its own helper threads
 * per job->host_opts); one device thread drives the device: P2P read of a section (read ahead
 * by up to 8 reader threads into 16 slots of one buffer the device keeps, so that the section
 * reads are in flight together: sect_reader), then kernel runs over its chunks with two result buffers, so that run j+1 is started before run j's block
 * is read and merged (with XRT the merge overlaps the next run; the emulated device runs the
 * kernel inside run_start, on that thread, concurrently with the host's scoring). Both threads
 * are joined before the call returns.
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
  kv_score_acc acc;
  kv_fpga_status rc;
  kv_fpga_err err;
  uint64_t p2p_bytes, to_host, runs, selects, ns, bytes, tokens;
} dev_work;

/* Read the results of a finished run and merge them into the device-side accumulator. */
static kv_fpga_status merge_run(dev_work *w, kv_fpga_buf *blocks, kv_fpga_buf *topk, uint32_t n,
                                kv_score_pair *tmp)
{
  uint32_t m = w->k <= KV_FPGA_MAX_TOPK ? (w->k < n ? w->k : n) : n;
  kv_fpga_buf *src = w->k <= KV_FPGA_MAX_TOPK ? topk : blocks;
  kv_fpga_status rc = kv_fpga_buf_read(w->dev, src, 0, tmp, (size_t)m * sizeof *tmp, &w->err);
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

/* The section reads of a job, ahead of the kernel runs: HIE_READERS threads P2P-read the
 * sections in order into HIE_SLOTS slots of one device buffer (a slot is reused once the
 * device thread is done with the section HIE_SLOTS before), so that up to HIE_READERS reads
 * are in flight (queue depth) while the device scores the sections already read. The reads are
 * the ones a single thread made one after the other before (same bytes, same buffers). */
#define HIE_READERS 8
#define HIE_SLOTS 16

typedef struct sect_reader {
  kv_fpga_dev *dev;
  const kv_hie_job *job;
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

static void *reader_main(void *arg)
{
  sect_reader *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->stop && r->next < r->job->n_dev && r->next - r->consumed >= r->slots)
      pthread_cond_wait(&r->cv, &r->mu);
    if (r->stop || r->next >= r->job->n_dev)
      break;
    size_t i = r->next++;
    pthread_mutex_unlock(&r->mu);
    const kv_hie_dev_span *ds = &r->job->dev[i];
    kv_fpga_err e;
    kv_fpga_status rc = kv_fpga_p2p_read(r->dev, r->buf, (size_t)((i % r->slots) * r->stride),
                                         r->job->fd, ds->file_off,
                                         (size_t)ds->layout.total_bytes, &e);
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
  return NULL;
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

static kv_fpga_status dev_run_all(dev_work *w)
{
  const kv_hie_job *job = w->job;
  uint32_t chunk = job->chunk_tokens ? job->chunk_tokens : 16384;
  uint64_t max_sect = 0, n_dev = 0;
  size_t n_runs = 0;
  for (size_t i = 0; i < job->n_dev; i++) {
    if (job->dev[i].layout.total_bytes > max_sect)
      max_sect = job->dev[i].layout.total_bytes;
    n_dev += job->dev[i].layout.n_tokens;
    n_runs += (job->dev[i].layout.n_tokens + chunk - 1) / chunk;
  }
  /* on-chip top k, or (k > 64) every block kept on the device and one selection, or (too many
   * tokens for that) every block to the host */
  int on_chip = w->k <= KV_FPGA_MAX_TOPK;
  int sel = !on_chip && n_dev <= KV_HIE_SELECT_MAX_TOKENS;
  uint32_t ksel = (uint32_t)(w->k < n_dev ? w->k : n_dev);
  kv_fpga_buf *sect = NULL, *query = NULL, *blocks[2] = {NULL, NULL}, *topk[2] = {NULL, NULL};
  kv_fpga_buf *all = NULL, *sdesc = NULL, *sout = NULL;
  uint32_t *segs = NULL;
  size_t tmp_n = sel ? ksel : chunk;
  kv_score_pair *tmp = malloc(tmp_n * sizeof *tmp);
  uint8_t *qpack = malloc(KV_FPGA_QUERY_BYTES);
  kv_fpga_status rc = KV_FPGA_OK;
  kv_fpga_run *pending = NULL;
  uint32_t pending_n = 0;
  int pending_slot = 0;
  sect_reader rd;
  pthread_t readers[HIE_READERS];
  size_t n_readers = 0;
  memset(&rd, 0, sizeof rd);
  rd.slots = job->n_dev < HIE_SLOTS ? (uint32_t)job->n_dev : HIE_SLOTS;
  rd.stride = (max_sect + 4095) / 4096 * 4096;
  pthread_mutex_init(&rd.mu, NULL);
  pthread_cond_init(&rd.cv, NULL);
  if (tmp == NULL || qpack == NULL) {
    rc = FAIL(&w->err, KV_FPGA_ENOMEM, "out of memory for the score block staging", tmp_n, 0);
    goto out;
  }
  if (job->n_dev > 0 && (rd.ready = calloc(job->n_dev, 1)) == NULL) {
    rc = FAIL(&w->err, KV_FPGA_ENOMEM, "out of memory for the section reads", job->n_dev, 0);
    goto out;
  }
  size_t sect_bytes = (size_t)(rd.stride * (rd.slots ? rd.slots : 1));
  if (w->dev->hie_sect != NULL && kv_fpga_buf_size(w->dev->hie_sect) >= sect_bytes) {
    sect = w->dev->hie_sect; /* the last job's (the device's: one job at a time) */
    w->dev->hie_sect = NULL;
  } else {
    kv_fpga_buf_free(w->dev->hie_sect); /* too small */
    w->dev->hie_sect = NULL;
    if ((rc = kv_fpga_buf_alloc(w->dev, sect_bytes, KV_FPGA_BUF_P2P, &sect, &w->err)))
      goto out;
  }
  if ((rc = kv_fpga_buf_alloc(w->dev, KV_FPGA_QUERY_BYTES, KV_FPGA_BUF_IN, &query, &w->err)))
    goto out;
  rd.dev = w->dev;
  rd.job = job;
  rd.buf = sect;
  for (; n_readers < HIE_READERS && n_readers < job->n_dev; n_readers++)
    if (pthread_create(&readers[n_readers], NULL, reader_main, &rd) != 0)
      break;
  if (job->n_dev > 0 && n_readers == 0) {
    rc = FAIL(&w->err, KV_FPGA_ENOMEM, "cannot start a section reader thread", 0, 0);
    goto out;
  }
  if (sel) {
    segs = malloc(n_runs * 2 * sizeof *segs);
    if (segs == NULL) {
      rc = FAIL(&w->err, KV_FPGA_ENOMEM, "out of memory for the select segments", n_runs, 0);
      goto out;
    }
    uint64_t pairs = select_layout(job, chunk, segs);
    if ((rc = kv_fpga_buf_alloc(w->dev, (size_t)pairs * 8, KV_FPGA_BUF_OUT, &all, &w->err)) ||
        (rc = kv_fpga_buf_alloc(w->dev, n_runs * 8, KV_FPGA_BUF_IN, &sdesc, &w->err)) ||
        (rc = kv_fpga_buf_alloc(w->dev, (size_t)ksel * 8, KV_FPGA_BUF_OUT, &sout, &w->err)))
      goto out;
  } else {
    for (int s = 0; s < 2; s++) {
      if ((rc = kv_fpga_buf_alloc(w->dev, (size_t)chunk * 8, KV_FPGA_BUF_OUT, &blocks[s], &w->err)))
        goto out;
      if (on_chip &&
          (rc = kv_fpga_buf_alloc(w->dev, (size_t)w->k * 8, KV_FPGA_BUF_OUT, &topk[s], &w->err)))
        goto out;
    }
  }
  if ((rc = kv_fpga_query_pack(job->q, qpack, KV_FPGA_QUERY_BYTES, &w->err)) ||
      (rc = kv_fpga_buf_write(w->dev, query, 0, qpack, KV_FPGA_QUERY_BYTES, &w->err)))
    goto out;
  int slot = 0;
  size_t run_i = 0;
  for (size_t i = 0; i < job->n_dev; i++) {
    const kv_hie_dev_span *ds = &job->dev[i];
    /* the previous section's runs must be done before its buffer is overwritten */
    if (pending != NULL) {
      kv_fpga_run *r = pending;
      pending = NULL;
      if ((rc = kv_fpga_run_wait(r, &w->err)) ||
          (!sel && (rc = merge_run(w, blocks[pending_slot], topk[pending_slot], pending_n, tmp))))
        goto out;
    }
    reader_consumed(&rd, i); /* sections before i: their runs are done */
    if ((rc = reader_wait(&rd, i, &w->err)))
      goto out;
    w->p2p_bytes += ds->layout.total_bytes;
    uint64_t soff = (i % rd.slots) * rd.stride;
    for (uint32_t t0 = 0; t0 < ds->layout.n_tokens; t0 += chunk, run_i++) {
      uint32_t n = ds->layout.n_tokens - t0 < chunk ? ds->layout.n_tokens - t0 : chunk;
      kv_fpga_run_args a = {sect, soff, ds->layout, t0, n, ds->pos_base, on_chip ? w->k : 0, query,
                            sel ? all : blocks[slot], on_chip ? topk[slot] : NULL,
                            sel ? (size_t)segs[2 * run_i] * 8 : 0};
      kv_fpga_run *r;
      if ((rc = kv_fpga_run_start(w->dev, &a, &r, &w->err)))
        goto out;
      w->runs++;
      w->tokens += n;
      w->bytes += (uint64_t)n * ds->layout.row_bytes;
      if (pending != NULL) { /* merge the previous chunk while this one runs */
        kv_fpga_run *p = pending;
        pending = NULL;
        if ((rc = kv_fpga_run_wait(p, &w->err)) ||
            (!sel && (rc = merge_run(w, blocks[pending_slot], topk[pending_slot], pending_n, tmp)))) {
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
    if ((rc = kv_fpga_run_wait(r, &w->err)) ||
        (!sel && (rc = merge_run(w, blocks[pending_slot], topk[pending_slot], pending_n, tmp))))
      goto out;
  }
  if (sel && n_runs > 0) { /* the device's top k, selected where the blocks are */
    kv_fpga_select_args a = {all, sdesc, sout, segs, (uint32_t)n_runs, ksel};
    if ((rc = kv_fpga_select(w->dev, &a, &w->err)) ||
        (rc = kv_fpga_buf_read(w->dev, sout, 0, tmp, (size_t)ksel * sizeof *tmp, &w->err)))
      goto out;
    w->selects++;
    w->to_host += (uint64_t)ksel * sizeof *tmp;
    kv_score_acc_push_pairs(&w->acc, tmp, ksel);
  }
out:
  if (pending != NULL)
    (void)kv_fpga_run_wait(pending, NULL);
  pthread_mutex_lock(&rd.mu); /* the readers stop (all read, or an error) before sect goes */
  rd.stop = 1;
  pthread_cond_broadcast(&rd.cv);
  pthread_mutex_unlock(&rd.mu);
  for (size_t i = 0; i < n_readers; i++)
    pthread_join(readers[i], NULL);
  pthread_mutex_destroy(&rd.mu);
  pthread_cond_destroy(&rd.cv);
  free(rd.ready);
  for (int s = 0; s < 2; s++) {
    kv_fpga_buf_free(blocks[s]);
    kv_fpga_buf_free(topk[s]);
  }
  kv_fpga_buf_free(all);
  kv_fpga_buf_free(sdesc);
  kv_fpga_buf_free(sout);
  kv_fpga_buf_free(query);
  if (sect != NULL) { /* kept for the next job */
    kv_fpga_buf_free(w->dev->hie_sect);
    w->dev->hie_sect = sect;
  }
  free(segs);
  free(tmp);
  free(qpack);
  return rc;
}

static void *dev_main(void *arg)
{
  dev_work *w = arg;
  uint64_t t = now_ns();
  w->rc = dev_run_all(w);
  w->ns = now_ns() - t;
  return NULL;
}

kv_fpga_status kv_hie_topk(kv_fpga_dev *dev, const kv_hie_job *job, uint32_t k, uint32_t *out_pos,
                           float *out_scores, uint32_t *n_out, kv_hie_stats *stats,
                           kv_fpga_err *err)
{
  uint64_t t_start = now_ns();
  if (n_out != NULL)
    *n_out = 0;
  if (job == NULL || job->q == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL job or query", 0, 0);
  if (out_pos == NULL && out_scores == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL outputs (both positions and scores)", 0, 0);
  if (k == 0)
    return FAIL(err, KV_FPGA_EINVAL, "k is 0", 0, 1);
  if (job->n_dev > 0 && (dev == NULL || job->dev == NULL))
    return FAIL(err, KV_FPGA_EINVAL, "device spans without a device", job->n_dev, 0);
  if (job->n_host > 0 && job->host == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL host spans", job->n_host, 0);
  if (job->chunk_tokens % 64 != 0)
    return FAIL(err, KV_FPGA_EINVAL, "chunk_tokens must be a multiple of 64", job->chunk_tokens, 64);
  uint64_t n_host = 0, n_dev = 0, host_bytes = 0;
  for (size_t i = 0; i < job->n_host; i++) {
    n_host += job->host[i].n;
    if (job->host[i].view != NULL)
      host_bytes += (uint64_t)job->host[i].n * job->host[i].view->layout.row_bytes;
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

  dev_work w;
  memset(&w, 0, sizeof w);
  w.dev = dev;
  w.job = job;
  w.k = k;
  void *dev_mem = NULL, *fin_mem = NULL;
  uint32_t *hpos = NULL;
  float *hsc = NULL;
  kv_fpga_status rc = KV_FPGA_OK;
  pthread_t tid;
  int started = 0;
  if (n_dev > 0) {
    dev_mem = malloc(kv_score_acc_bytes(k));
    if (dev_mem == NULL)
      return FAIL(err, KV_FPGA_ENOMEM, "out of memory for the device top k", k, 0);
    (void)kv_score_acc_init(&w.acc, k, dev_mem, kv_score_acc_bytes(k), NULL);
    started = pthread_create(&tid, NULL, dev_main, &w) == 0;
  }
  /* the host's own tokens, meanwhile */
  uint32_t kh = n_host < k ? (uint32_t)n_host : k, got_h = 0;
  uint64_t t_host = now_ns();
  if (kh > 0) {
    hpos = malloc((size_t)kh * 4);
    hsc = malloc((size_t)kh * 4);
    kv_score_err se;
    if (hpos == NULL || hsc == NULL) {
      rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the host top k", kh, 0);
    } else if (kv_score_topk(job->q, job->host, job->n_host, kh, &job->host_opts, NULL, 0, hpos,
                             hsc, &got_h, &se) != KV_SCORE_OK) {
      rc = FAIL(err, se.code == KV_SCORE_ENOMEM ? KV_FPGA_ENOMEM : KV_FPGA_EINVAL,
                se.what ? se.what : "host scoring failed", se.value, se.limit);
    }
  }
  t_host = now_ns() - t_host;
  if (n_dev > 0) {
    if (started)
      pthread_join(tid, NULL);
    else
      dev_main(&w);
    if (rc == KV_FPGA_OK && w.rc != KV_FPGA_OK) {
      rc = w.rc;
      if (err != NULL)
        *err = w.err;
    }
  }
  if (rc == KV_FPGA_OK) {
    fin_mem = malloc(kv_score_acc_bytes(k));
    kv_score_acc fin;
    if (fin_mem == NULL) {
      rc = FAIL(err, KV_FPGA_ENOMEM, "out of memory for the merged top k", k, 0);
    } else {
      (void)kv_score_acc_init(&fin, k, fin_mem, kv_score_acc_bytes(k), NULL);
      for (uint32_t i = 0; i < got_h; i++)
        kv_score_acc_push(&fin, hpos[i], hsc[i]);
      if (n_dev > 0)
        kv_score_acc_merge(&fin, &w.acc);
      uint32_t got = kv_score_acc_finish(&fin, out_pos, out_scores);
      if (n_out != NULL)
        *n_out = got;
    }
  }
  if (stats != NULL) {
    stats->host_tokens = n_host;
    stats->dev_tokens = w.tokens;
    stats->host_bytes = host_bytes;
    stats->dev_bytes = w.bytes;
    stats->p2p_bytes = w.p2p_bytes;
    stats->to_host_bytes = w.to_host;
    stats->dev_runs = w.runs;
    stats->dev_selects = w.selects;
    stats->host_ns = kh > 0 ? t_host : 0;
    stats->dev_ns = w.ns;
    stats->total_ns = now_ns() - t_start;
  }
  free(dev_mem);
  free(fin_mem);
  free(hpos);
  free(hsc);
  return rc;
}
