/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/score_ctx.c — kvdb_score and kvdb_score_batch: the top k tokens of a stored
 * context by raw q·k on its blocks' score copies (HillInfer §4.4), wherever each block lives
 * (kvdb.h "Top-k token scoring"; FORMAT.md §3c for the copies).
 *
 * ONE CALL
 *   1. The requests' queries are quantized (score/: kv_score_query_create); the distinct
 *      copies they need (copy c = layer * n_kv_heads + head) are listed.
 *   2. A read snapshot of the catalog gives the context's blocks (record, first position); each
 *      must carry score copies of the model's bits. Blocks are split three ways:
 *        DRAM    the handle holds the block in the DRAM tier: its whole score region is kept
 *                there too (under a key derived from the block hash, with the block's location
 *                as a trailer, so a block moved or rewritten since is read again); a region not
 *                there yet is read whole once, verified and inserted;
 *        DEVICE  opts.device is set and the block's tier is in device_tiers: the near-data
 *                device (fpga/) reads the copy from the segment file itself (P2P, O_DIRECT) and
 *                scores it in chunks, streaming <pos, score> blocks back (HIE, HillInfer §4.2:
 *                the host scores the DRAM copies meanwhile, on the calling thread, and the two
 *                top-k lists merge);
 *        HOST    the rest: the host reads the region's checksum table page(s) and the copies it
 *                needs (adjacent copies in one read), in waves of kv_score_wave_bytes,
 *                verifies each copy's checksum and scores it.
 *   3. Each request keeps a bounded accumulator (score.h kv_score_acc): every set of copies
 *      scored contributes its own top min(k, tokens), so no array of all N scores exists; the
 *      union of the parts' top k holds the global top k, and ORDER is total, so the result is
 *      the same whatever the split (bit for bit: every path computes score.h's scores).
 *   A read that fails while a compaction moved blocks (meta "gen" changed) starts again from a
 *   fresh snapshot, up to three times (kv_read_again, ops_int.h).
 *
 * DEVICES. An opened near-data device is kept by the handle (an XRT open loads the xclbin, which
 * takes seconds): one per kind (the emulation; AUTO/XRT with its xclbin path). A call takes the
 * kept one exclusively (a device handle serves one thread at a time); a call that finds it busy
 * opens its own, kept in its place afterwards if the place is empty, else closed. kvdb_close
 * frees them (kv_score_close).
 *
 * NOT VERIFIED ON THE DEVICE PATH: the device reads copies the host never sees, and the kernel
 * has no XXH3 unit, so per-query checksums are not checked there (kvdb_verify checks every
 * copy, and the fetch of the chosen tokens by kvdb_get_tokens or kvdb_get_head_tokens verifies
 * their groups: on the host, or on the emulated device).
 *
 * APP (HillInfer §4.3). With a device, a share of the device-tier blocks is read and scored by
 * the host instead (opts.host_share_permille, or -1: Eq. 4 from the rates the handle measured on
 * earlier calls, app_host_blocks), on the calling thread, while the device part runs on a thread
 * of its own with its own accumulators (device_part); both sides' rates are folded into the
 * handle's profile after each call (kv_app_profile_update). The split changes who scores a
 * block, never a score: the results are the same.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <pthread.h>
#include <time.h>

#include "device.h"
#include "ops_int.h"

uint64_t kv_score_wave_bytes = 16u << 20; /* ops_int.h */
#define KV_SCORE_TRAILER 64u      /* after a region in the DRAM tier: its block's location */

enum { SB_HOST = 0, SB_DRAM = 1, SB_DEVICE = 2 };

struct kv_score_devs {
  pthread_mutex_t mu;
  kv_fpga_dev *dev[2]; /* [0] emulated, [1] AUTO (XRT when present) */
  char *xclbin[2];     /* the path it was opened with (NULL: none) */
  int busy[2];
  kv_app_profile app[2]; /* APP rates per kind of device (f_c, f_s measured; 0: not yet) */
};

/* The work of the device part of a call, run on its own thread while the calling thread reads
 * and scores the host's blocks (APP: both finish together), with its own accumulators. */
typedef struct dev_task {
  kv_fpga_dev *dev;
  uint32_t *idx;
  uint32_t n_idx;
  const kv_score_view *dviews;
  const struct sblk *const *dblk;
  size_t n_d;
  kv_score_acc *accs; /* per request */
  void **acc_mem;
  uint32_t *tpos;
  float *tscore;
  kvdb_score_stats st;
  uint64_t bytes, ns; /* copy bytes of the device blocks; time of the part */
  kvdb_status rc;
  char msg[512];      /* kvdb_errmsg() of the thread that failed */
} dev_task;

typedef struct sreq {
  uint32_t c;    /* copy index */
  uint32_t slot; /* its index in the call's list of distinct copies */
  uint32_t k;
  kv_score_query *q;
  void *acc_mem;
  kv_score_acc acc;
} sreq;

typedef struct sblk {
  uint8_t hash[16];
  kv_block_rec rec; /* tokens NULL */
  uint32_t pos0;    /* context position of its first token */
  kv_block_geom g;
  kv_sregion r;
  uint64_t score_off; /* of the region in the object */
  int where;
  kv_dram_entry *pin; /* SB_DRAM: the pinned region (or NULL: `own` holds it) */
  uint8_t *own;       /* SB_DRAM: the region read now, when the DRAM tier could not take it */
  const uint8_t *region;
} sblk;

typedef struct sctx {
  kvdb *db;
  const kvdb_model *m;
  const kvdb_score_opts *o;
  kv_score_opts so;
  sreq *rq;
  size_t n_rq;
  uint32_t *copies; /* distinct copy indices, ascending */
  uint32_t n_copies;
  uint32_t max_k;
  uint32_t *tpos;
  float *tscore;
  sblk *b;
  uint32_t n_b;
  uint64_t n_tokens;
  kvdb_score_stats st;
} sctx;

void kvdb_score_opts_init(kvdb_score_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->host_share_permille = -1; /* APP decides */
}

/* ---- scoring a set of views into the requests' accumulators ---- */

/* views[i * n_copies + slot] is block blk[i]'s copy `slot`. */
static kvdb_status score_views(sctx *x, const kv_score_view *views, const sblk *const *blk,
                               size_t nb, kv_score_span *spans)
{
  if (nb == 0)
    return KVDB_OK;
  for (size_t r = 0; r < x->n_rq; r++) {
    sreq *q = &x->rq[r];
    uint64_t total = 0;
    for (size_t i = 0; i < nb; i++) {
      spans[i] = (kv_score_span){&views[i * x->n_copies + q->slot], 0, blk[i]->g.n_tokens,
                                 blk[i]->pos0};
      total += blk[i]->g.n_tokens;
    }
    uint32_t kk = q->k < total ? q->k : (uint32_t)total, n = 0;
    kv_score_err e;
    kv_score_status st = kv_score_topk(q->q, spans, nb, kk, &x->so, NULL, 0, x->tpos, x->tscore,
                                       &n, &e);
    if (st != KV_SCORE_OK) {
      char msg[200];
      kv_score_errmsg(&e, msg, sizeof msg);
      return kv_fail(st == KV_SCORE_ENOMEM ? KVDB_NOMEM : KVDB_PANIC, "scoring: %s", msg);
    }
    for (uint32_t i = 0; i < n; i++)
      kv_score_acc_push(&q->acc, x->tpos[i], x->tscore[i]);
    x->st.tokens += total;
  }
  return KVDB_OK;
}

/* A view of copy c of a verified region (in DRAM or read whole). */
static void view_of(const sblk *b, uint32_t c, kv_score_view *v)
{
  const uint8_t *copy = b->region + kv_sregion_copy_off(&b->r, c);
  const kv_score_layout *l = &b->r.layout;
  kv_score_view_init(v, l->n_tokens, l->head_dim, l->bits, copy + l->meta_bytes,
                     (const float *)(const void *)(copy + KV_SCORE_COPY_HDR_BYTES), NULL);
  if (l->variant != 0) { /* version 2: the center codes and scale (score.h), checked with the copy */
    v->layout = *l;
    v->center = (const int8_t *)(copy + l->center_off);
    uint32_t cs = kv_get_le32(copy + 32);
    memcpy(&v->center_scale, &cs, 4);
  }
}

/* ---- the DRAM tier ---- */

static void dram_key(const uint8_t hash[16], uint8_t key[16])
{
  uint8_t buf[17 + 16];
  memcpy(buf, "kvdb-score-region", 17);
  memcpy(buf + 17, hash, 16);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(buf, sizeof buf));
  memcpy(key, c.digest, 16);
}

static void trailer(const sblk *b, uint8_t t[KV_SCORE_TRAILER])
{
  memset(t, 0, KV_SCORE_TRAILER);
  kv_put_le64(t, b->rec.segment);
  kv_put_le64(t + 8, b->rec.offset);
  kv_put_le64(t + 16, b->rec.bytes);
}

static kvdb_status read_at(kvdb *db, const sblk *b, uint8_t *buf, uint64_t len, uint64_t off)
{
  kv_segfile *sf;
  KV_RET(kv_segfile_get(db, b->rec.segment, &sf));
  int e = db->io->ops->pread(db->io, sf->f, buf, len, b->rec.offset + off);
  kv_segfile_put(db, sf);
  if (e != 0) /* a missing or short file is KVDB_CORRUPT, naming it */
    return kv_seg_read_fail(db, -e, b->rec.segment, b->rec.offset, b->rec.bytes, b->hash);
  db->bytes_read += len;
  return KVDB_OK;
}

static kvdb_status corrupt(kvdb *db, const sblk *b, uint64_t off)
{
  char hx[33];
  db->corrupt_blocks++;
  return kv_fail(KVDB_CORRUPT,
                 "score region of block %s in segment %" PRIu64 " at offset %" PRIu64 ": %s",
                 kv_hex16(b->hash, hx), b->rec.segment, b->rec.offset + b->score_off + off,
                 kvdb_errmsg());
}

/* Pin b's region in the DRAM tier, reading it whole (and inserting it) when absent or stale. */
static kvdb_status dram_prepare(sctx *x, sblk *b)
{
  kvdb *db = x->db;
  uint8_t key[16], tr[KV_SCORE_TRAILER];
  dram_key(b->hash, key);
  trailer(b, tr);
  const uint8_t *data;
  uint64_t len;
  kv_dram_entry *e = kv_dram_pin(db->dram, key, &data, &len);
  if (e != NULL) {
    if (len == b->r.bytes + KV_SCORE_TRAILER && memcmp(data + b->r.bytes, tr, sizeof tr) == 0) {
      b->pin = e;
      b->region = data;
      x->st.dram_copies += x->n_copies;
      return KVDB_OK;
    }
    kv_dram_unpin(db->dram, e); /* the block moved or was rewritten since */
    kv_dram_remove(db->dram, key);
  }
  uint8_t *buf = kv_alloc_aligned(b->r.bytes + KV_SCORE_TRAILER);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "cannot allocate a score region of %" PRIu64 " bytes",
                   b->r.bytes);
  kvdb_status rc = read_at(db, b, buf, b->r.bytes, b->score_off);
  uint64_t bad = 0;
  if (rc == KVDB_OK && kv_sregion_verify(&b->r, b->hash, buf, &bad) != KVDB_OK)
    rc = corrupt(db, b, bad);
  if (rc != KVDB_OK) {
    kv_free_aligned(buf);
    return rc;
  }
  x->st.host_bytes += b->r.bytes;
  x->st.host_copies += x->n_copies;
  memcpy(buf + b->r.bytes, tr, sizeof tr);
  if (kv_dram_insert(db->dram, key, buf, b->r.bytes + KV_SCORE_TRAILER) == 0 &&
      (e = kv_dram_pin(db->dram, key, &data, &len)) != NULL) {
    if (len == b->r.bytes + KV_SCORE_TRAILER && memcmp(data + b->r.bytes, tr, sizeof tr) == 0) {
      kv_free_aligned(buf);
      b->pin = e;
      b->region = data;
      return KVDB_OK;
    }
    kv_dram_unpin(db->dram, e);
  }
  b->own = buf; /* the tier could not keep it: use it for this call */
  b->region = buf;
  return KVDB_OK;
}

static void dram_release(sctx *x)
{
  for (uint32_t i = 0; i < x->n_b; i++) {
    sblk *b = &x->b[i];
    if (b->pin != NULL)
      kv_dram_unpin(x->db->dram, b->pin);
    kv_free_aligned(b->own);
    b->pin = NULL;
    b->own = NULL;
    b->region = NULL;
  }
}

/* ---- host reads of single copies, in waves ---- */

/* Bytes of b's slot in a wave buffer: its table pages, then the call's copies in order. */
static uint64_t slot_bytes(const sctx *x, const sblk *b)
{
  return (uint64_t)b->r.table_pages * KV_PAGE + (uint64_t)x->n_copies * b->r.copy_bytes;
}

static kvdb_status host_waves(sctx *x, uint32_t *idx, uint32_t n_idx)
{
  kvdb *db = x->db;
  kvdb_status rc = KVDB_OK;
  uint64_t biggest = 0;
  for (uint32_t i = 0; i < n_idx; i++)
    if (slot_bytes(x, &x->b[idx[i]]) > biggest)
      biggest = slot_bytes(x, &x->b[idx[i]]);
  if (n_idx == 0)
    return KVDB_OK;
  uint64_t cap = biggest > kv_score_wave_bytes ? biggest : kv_score_wave_bytes;
  size_t max_nb = 0; /* the most blocks one wave takes (the waves below, dry) */
  for (uint32_t w0 = 0, w1; w0 < n_idx; w0 = w1) {
    uint64_t fill = 0;
    for (w1 = w0; w1 < n_idx && (w1 == w0 || fill + slot_bytes(x, &x->b[idx[w1]]) <= cap); w1++)
      fill += slot_bytes(x, &x->b[idx[w1]]);
    if (w1 - w0 > max_nb)
      max_nb = w1 - w0;
  }
  kv_rbuf *rb = kv_rbuf_acquire(db, cap);
  kv_batch *bat = kv_batch_begin(db->io);
  kv_score_view *views = malloc(max_nb * x->n_copies * sizeof *views);
  const sblk **blk = malloc(max_nb * sizeof *blk);
  kv_score_span *spans = malloc(max_nb * sizeof *spans);
  kv_segfile **sfs = calloc(max_nb, sizeof *sfs);
  uint64_t *at = malloc(max_nb * sizeof *at);
  if (rb == NULL || bat == NULL || views == NULL || blk == NULL || spans == NULL || sfs == NULL ||
      at == NULL) {
    rc = kv_fail(KVDB_NOMEM, "score read buffers");
    goto out;
  }
  for (uint32_t w0 = 0; w0 < n_idx && rc == KVDB_OK;) {
    /* a wave: as many blocks as fit */
    uint32_t w1 = w0;
    uint64_t fill = 0, bytes = 0;
    while (w1 < n_idx && (w1 == w0 || fill + slot_bytes(x, &x->b[idx[w1]]) <= cap)) {
      const sblk *b = &x->b[idx[w1]];
      size_t j = w1 - w0;
      at[j] = fill;
      KV_ERR(kv_segfile_get(db, b->rec.segment, &sfs[j]));
      uint8_t *slot = rb->p + fill;
      uint64_t base = b->rec.offset + b->score_off, tb = (uint64_t)b->r.table_pages * KV_PAGE;
      kv_batch_read(db->io, bat, sfs[j]->f, slot, tb, base);
      bytes += tb;
      for (uint32_t s = 0; s < x->n_copies;) { /* adjacent copies in one read */
        uint32_t e = s + 1;
        while (e < x->n_copies && x->copies[e] == x->copies[e - 1] + 1)
          e++;
        uint64_t len = (uint64_t)(e - s) * b->r.copy_bytes;
        kv_batch_read(db->io, bat, sfs[j]->f, slot + tb + (uint64_t)s * b->r.copy_bytes, len,
                      base + kv_sregion_copy_off(&b->r, x->copies[s]));
        bytes += len;
        s = e;
      }
      fill += slot_bytes(x, b);
      w1++;
    }
    int e = kv_batch_wait(db->io, bat);
    for (uint32_t j = 0; j < w1 - w0; j++) {
      kv_segfile_put(db, sfs[j]);
      sfs[j] = NULL;
    }
    if (e != 0) { /* the first block of the wave whose file is missing or short, if any */
      for (uint32_t j = w0; j < w1; j++) {
        const sblk *b = &x->b[idx[j]];
        rc = kv_seg_read_fail(db, -e, b->rec.segment, b->rec.offset, b->rec.bytes, b->hash);
        if (rc == KVDB_CORRUPT)
          break;
      }
      goto out;
    }
    db->bytes_read += bytes;
    x->st.host_bytes += bytes;
    for (uint32_t j = 0; j < w1 - w0; j++) {
      const sblk *b = &x->b[idx[w0 + j]];
      const uint8_t *slot = rb->p + at[j];
      uint64_t tb = (uint64_t)b->r.table_pages * KV_PAGE, bad = 0;
      if (kv_sregion_check_head(&b->r, slot) != KVDB_OK) {
        rc = corrupt(db, b, 0);
        goto out;
      }
      for (uint32_t s = 0; s < x->n_copies; s++)
        if (kv_sregion_verify_copy(&b->r, b->hash, slot, x->copies[s],
                                   slot + tb + (uint64_t)s * b->r.copy_bytes,
                                   &views[j * x->n_copies + s], &bad) != KVDB_OK) {
          rc = corrupt(db, b, bad);
          goto out;
        }
      blk[j] = b;
      x->st.host_copies += x->n_copies;
    }
    KV_ERR(score_views(x, views, blk, w1 - w0, spans));
    w0 = w1;
  }
out:
  kv_batch_end(db->io, bat); /* waits for reads still in flight */
  if (sfs != NULL)
    for (size_t j = 0; j < max_nb; j++)
      kv_segfile_put(db, sfs[j]);
  kv_rbuf_release(db, rb);
  free(views);
  free(blk);
  free(spans);
  free(sfs);
  free(at);
  return rc;
}

/* ---- the near-data device ---- */

kvdb_status kv_score_fpga_fail(kv_fpga_status st, const kv_fpga_err *err, const char *what)
{
  char msg[256];
  kv_fpga_errmsg(err, msg, sizeof msg);
  kvdb_status rc = st == KV_FPGA_ENOMEM    ? KVDB_NOMEM
                   : st == KV_FPGA_EIO      ? KVDB_IOERR
                   : st == KV_FPGA_ECORRUPT ? KVDB_CORRUPT
                   : st == KV_FPGA_EINVAL   ? KVDB_PANIC /* arguments this file computed */
                                            : KVDB_UNSUPPORTED;
  return kv_fail(rc, "%s: %s", what, msg);
}

/* Open a segment file for the device's own reads (O_DIRECT where the filesystem allows). */
kvdb_status kv_score_open_direct(kvdb *db, uint64_t seg, int *fd)
{
  char path[4200];
  KV_RET(kv_seg_path(db, seg, path, sizeof path));
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (*fd < 0 && errno == EINVAL)
    *fd = open(path, O_RDONLY | O_CLOEXEC);
  if (*fd < 0 && errno == ENOENT)
    return kv_fail(KVDB_CORRUPT, "segment %" PRIx64 ": file '%s' is missing (the catalog lists "
                   "blocks in it)", seg, path);
  if (*fd < 0)
    return kv_fail_errno(errno, "cannot open segment file '%s' for the scoring device", path);
  return KVDB_OK;
}

static int by_segment(const void *a, const void *b, void *ctx)
{
  const sblk *bl = ctx;
  uint64_t x = bl[*(const uint32_t *)a].rec.segment, y = bl[*(const uint32_t *)b].rec.segment;
  return x < y ? -1 : x > y;
}

/*
 * The device blocks (idx, sorted here by segment): one HIE job per request and segment file;
 * the DRAM-resident views ride along as the host part of each request's first job, so the host
 * scores them while the device works. Every job goes to the device in one kv_hie_topk_batch
 * call, so that the device reads the next job's sections while it scores this one's.
 */
static kvdb_status device_jobs(sctx *x, dev_task *t)
{
  kvdb *db = x->db;
  kv_fpga_dev *dev = t->dev;
  uint32_t *idx = t->idx, n_idx = t->n_idx;
  const kv_score_view *dviews = t->dviews;
  const sblk *const *dblk = (const sblk *const *)t->dblk;
  size_t n_d = t->n_d;
  qsort_r(idx, n_idx, sizeof *idx, by_segment, x->b);
  kvdb_status rc = KVDB_OK;
  int *fds = malloc((n_idx ? n_idx : 1) * sizeof *fds);
  uint32_t n_seg = 0;
  if (fds == NULL)
    return kv_fail(KVDB_NOMEM, "score device jobs");
  /* one fd per segment */
  for (uint32_t i = 0; i < n_idx; i++)
    if (i == 0 || x->b[idx[i]].rec.segment != x->b[idx[i - 1]].rec.segment) {
      rc = kv_score_open_direct(db, x->b[idx[i]].rec.segment, &fds[n_seg]);
      if (rc != KVDB_OK)
        goto out0;
      n_seg++;
    }
  size_t n_jobs = x->n_rq * (n_seg ? n_seg : 1);
  kv_hie_dev_span *ds = malloc((x->n_rq * (size_t)n_idx + 1) * sizeof *ds);
  kv_score_span *hs = malloc((x->n_rq * n_d + 1) * sizeof *hs);
  kv_hie_job *jobs = calloc(n_jobs, sizeof *jobs);
  kv_hie_result *res = calloc(n_jobs, sizeof *res);
  uint32_t *tpos = malloc(n_jobs * (size_t)x->max_k * sizeof *tpos);
  float *tsc = malloc(n_jobs * (size_t)x->max_k * sizeof *tsc);
  size_t *job_rq = malloc(n_jobs * sizeof *job_rq);
  if (ds == NULL || hs == NULL || jobs == NULL || res == NULL || tpos == NULL || tsc == NULL ||
      job_rq == NULL) {
    rc = kv_fail(KVDB_NOMEM, "score device jobs");
    goto out;
  }
  size_t nj = 0;
  for (size_t r = 0; r < x->n_rq; r++) {
    sreq *q = &x->rq[r];
    kv_score_span *qhs = hs + r * n_d;
    kv_hie_dev_span *qds = ds + r * (size_t)n_idx;
    uint64_t host_tokens = 0;
    for (size_t i = 0; i < n_d; i++) {
      qhs[i] = (kv_score_span){&dviews[i * x->n_copies + q->slot], 0, dblk[i]->g.n_tokens,
                               dblk[i]->pos0};
      host_tokens += dblk[i]->g.n_tokens;
    }
    uint32_t seg = 0;
    for (uint32_t i0 = 0; i0 < n_idx; seg++) {
      uint32_t i1 = i0;
      uint64_t tokens = seg == 0 ? host_tokens : 0;
      while (i1 < n_idx && x->b[idx[i1]].rec.segment == x->b[idx[i0]].rec.segment) {
        const sblk *b = &x->b[idx[i1]];
        qds[i1] = (kv_hie_dev_span){b->rec.offset + b->score_off +
                                        kv_sregion_copy_off(&b->r, q->c),
                                    b->r.layout, b->pos0};
        tokens += b->g.n_tokens;
        i1++;
      }
      jobs[nj] = (kv_hie_job){.q = q->q, .host = seg == 0 ? qhs : NULL,
                              .n_host = seg == 0 ? n_d : 0, .fd = fds[seg], .dev = qds + i0,
                              .n_dev = i1 - i0, .chunk_tokens = x->o->chunk_tokens,
                              .host_opts = x->so};
      res[nj] = (kv_hie_result){.k = q->k < tokens ? q->k : (uint32_t)tokens,
                                .pos = tpos + nj * (size_t)x->max_k,
                                .scores = tsc + nj * (size_t)x->max_k};
      job_rq[nj++] = r;
      i0 = i1;
    }
  }
  kv_fpga_err err;
  kv_fpga_status st = kv_hie_topk_batch(dev, jobs, nj, res, &err);
  if (st != KV_FPGA_OK) {
    rc = kv_score_fpga_fail(st, &err, "near-data scoring");
    goto out;
  }
  for (size_t j = 0; j < nj; j++) {
    for (uint32_t i = 0; i < res[j].n; i++)
      kv_score_acc_push(&t->accs[job_rq[j]], res[j].pos[i], res[j].scores[i]);
    t->st.tokens += res[j].stats.host_tokens + res[j].stats.dev_tokens;
    t->st.device_bytes += res[j].stats.p2p_bytes;
    t->st.device_to_host_bytes += res[j].stats.to_host_bytes;
  }
  t->st.device_copies += (uint64_t)n_idx * x->n_copies;
out:
  free(ds);
  free(hs);
  free(jobs);
  free(res);
  free(tpos);
  free(tsc);
  free(job_rq);
out0:
  for (uint32_t s = 0; s < n_seg; s++)
    close(fds[s]);
  free(fds);
  return rc;
}

/* ---- APP: the host's share of the device-tier blocks (HillInfer §4.3) ---- */

/* The profile of the device kind in `slot` (zeros until measured). */
static kv_app_profile app_profile(kvdb *db, int slot)
{
  kv_app_profile p;
  memset(&p, 0, sizeof p);
  struct kv_score_devs *ds = db->score_devs;
  if (ds != NULL) {
    pthread_mutex_lock(&ds->mu);
    p = ds->app[slot];
    pthread_mutex_unlock(&ds->mu);
  }
  return p;
}

/*
 * How many of the n_dev device-tier blocks the host reads and scores itself. Eq. 2-4 with
 * M = the blocks' copy bytes (all blocks have the same size but the last), no M_0 cap (the
 * host does not keep them: they stay on the SmartSSD), alpha = the fraction of tokens selected
 * (the largest k over the context), f_c and f_s the rates the handle measured on earlier calls
 * (copy bytes per second of the host's part, reads included, and of the device's), B_c = B_s
 * the SmartSSD tier's read bandwidth (placement's figures; HARDWARE.md's 2.3 GB/s sync P2P
 * without them): the selected K and V come from the same flash whoever scored them. Before
 * both rates are known the blocks are split evenly, which measures them.
 */
static uint32_t app_host_blocks(sctx *x, int slot, uint32_t n_dev)
{
  int32_t pm = x->o->host_share_permille;
  if (pm >= 0)
    return (uint32_t)(((uint64_t)n_dev * (uint32_t)pm + 500) / 1000);
  kv_app_profile p = app_profile(x->db, slot);
  if (!(p.f_c > 0) || !(p.f_s > 0)) /* first use: both sides get work (the device first) */
    return n_dev / 2;
  kv_tier_perf perf[KVDB_TIER_COUNT];
  kv_place_perf(x->db, perf);
  p.B_c = p.B_s = perf[KVDB_TIER_SMARTSSD].read_bps > 0 ? perf[KVDB_TIER_SMARTSSD].read_bps
                                                         : 2.3e9;
  double alpha = x->n_tokens ? (double)x->max_k / (double)x->n_tokens : 1.0;
  kv_app_split sp;
  if (kv_app_split_compute(&p, alpha > 1 ? 1 : alpha, alpha > 1 ? 1 : alpha, (double)n_dev,
                           (double)n_dev, &sp, NULL) != KV_FPGA_OK)
    return n_dev / 2;
  double nh = sp.M_c + 0.5;
  uint32_t h = nh >= (double)n_dev ? n_dev : (uint32_t)nh;
  kv_log(&x->db->log, 3,
         "score: APP beta %.4g (f_c %.3g, f_s %.3g, B %.3g bytes/s, alpha %.4f): the host scores "
         "%u of %u device-tier blocks, the device %u (T_cpu %.3g s, T_ssd %.3g s per block)",
         sp.beta, p.f_c, p.f_s, p.B_c, alpha, h, n_dev, n_dev - h, sp.T_cpu / n_dev,
         sp.T_ssd / n_dev);
  return h;
}

int32_t kv_score_app_permille(kvdb *db, kvdb_score_device device, double alpha_c,
                              double alpha_s)
{
  if (device == KVDB_SCORE_CPU)
    return 1000;
  kv_app_profile p = app_profile(db, device == KVDB_SCORE_EMULATED ? 0 : 1);
  if (!(p.f_c > 0) || !(p.f_s > 0))
    return -1;
  kv_tier_perf perf[KVDB_TIER_COUNT];
  kv_place_perf(db, perf);
  p.B_c = p.B_s = perf[KVDB_TIER_SMARTSSD].read_bps > 0 ? perf[KVDB_TIER_SMARTSSD].read_bps
                                                         : 2.3e9;
  kv_app_split sp;
  if (kv_app_split_compute(&p, alpha_c > 1 ? 1 : alpha_c < 0 ? 0 : alpha_c,
                           alpha_s > 1 ? 1 : alpha_s < 0 ? 0 : alpha_s, 1000.0, 1000.0, &sp,
                           NULL) != KV_FPGA_OK)
    return -1;
  double pm = sp.M_c + 0.5;
  return pm >= 1000 ? 1000 : (int32_t)pm;
}

/* Fold one call's measured rates into the handle's profile (exponential average). */
static void app_update(kvdb *db, int slot, uint64_t host_bytes, uint64_t host_ns,
                       uint64_t dev_bytes, uint64_t dev_ns)
{
  struct kv_score_devs *ds = db->score_devs;
  if (ds == NULL)
    return;
  kv_hie_stats hs;
  memset(&hs, 0, sizeof hs);
  hs.host_bytes = host_bytes;
  hs.host_ns = host_ns;
  hs.dev_bytes = dev_bytes;
  hs.dev_ns = dev_ns;
  pthread_mutex_lock(&ds->mu);
  kv_app_profile_update(&ds->app[slot], &hs, 0.5);
  pthread_mutex_unlock(&ds->mu);
}

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *dev_main(void *arg)
{
  void **a = arg;
  sctx *x = a[0];
  dev_task *t = a[1];
  uint64_t t0 = now_ns();
  t->rc = device_jobs(x, t);
  t->ns = now_ns() - t0;
  if (t->rc != KVDB_OK)
    snprintf(t->msg, sizeof t->msg, "%s", kvdb_errmsg());
  return NULL;
}

/*
 * The device's blocks (devb) on a thread of their own (with the DRAM views as HIE's host part)
 * while this thread reads and scores the host's blocks (host: the SSD tier's, and the share of
 * the device tier's APP gave the host); then the device's accumulators are merged into the
 * requests' and the measured rates into the profile.
 */
static kvdb_status device_part(sctx *x, kv_fpga_dev *dev, int slot, uint32_t *devb,
                               uint32_t n_dev, const kv_score_view *dviews, const sblk **dblk,
                               size_t n_dram, uint32_t *host, uint32_t n_host)
{
  dev_task t;
  memset(&t, 0, sizeof t);
  t.dev = dev;
  t.idx = devb;
  t.n_idx = n_dev;
  t.dviews = dviews;
  t.dblk = (const struct sblk *const *)dblk;
  t.n_d = n_dram;
  t.accs = calloc(x->n_rq, sizeof *t.accs);
  t.acc_mem = calloc(x->n_rq, sizeof *t.acc_mem);
  t.tpos = malloc((size_t)x->max_k * sizeof *t.tpos);
  t.tscore = malloc((size_t)x->max_k * sizeof *t.tscore);
  kvdb_status rc = KVDB_OK;
  if (t.accs == NULL || t.acc_mem == NULL || t.tpos == NULL || t.tscore == NULL)
    rc = kv_fail(KVDB_NOMEM, "device top-k lists");
  for (size_t r = 0; rc == KVDB_OK && r < x->n_rq; r++) {
    size_t bytes = kv_score_acc_bytes(x->rq[r].k);
    if ((t.acc_mem[r] = malloc(bytes)) == NULL ||
        kv_score_acc_init(&t.accs[r], x->rq[r].k, t.acc_mem[r], bytes, NULL) != KV_SCORE_OK)
      rc = kv_fail(KVDB_NOMEM, "device top-k of %u", x->rq[r].k);
  }
  uint64_t host_bytes = 0, host_ns = 0;
  for (uint32_t i = 0; i < n_dev; i++)
    t.bytes += (uint64_t)x->n_copies * x->b[devb[i]].r.copy_bytes;
  for (uint32_t i = 0; i < n_host; i++)
    host_bytes += (uint64_t)x->n_copies * x->b[host[i]].r.copy_bytes;
  if (rc == KVDB_OK) {
    void *arg[2] = {x, &t};
    pthread_t tid;
    int threaded = n_host > 0 && pthread_create(&tid, NULL, dev_main, arg) == 0;
    if (!threaded)
      dev_main(arg);
    uint64_t h0 = now_ns();
    rc = host_waves(x, host, n_host);
    host_ns = now_ns() - h0;
    if (threaded)
      pthread_join(tid, NULL);
    if (rc == KVDB_OK && t.rc != KVDB_OK)
      rc = kv_fail(t.rc, "%s", t.msg);
  }
  if (rc == KVDB_OK) {
    for (size_t r = 0; r < x->n_rq; r++)
      kv_score_acc_merge(&x->rq[r].acc, &t.accs[r]);
    x->st.tokens += t.st.tokens;
    x->st.device_bytes += t.st.device_bytes;
    x->st.device_to_host_bytes += t.st.device_to_host_bytes;
    x->st.device_copies += t.st.device_copies;
    app_update(x->db, slot, host_bytes, host_ns, t.bytes, t.ns);
  }
  for (size_t r = 0; t.acc_mem != NULL && r < x->n_rq; r++)
    free(t.acc_mem[r]);
  free(t.acc_mem);
  free(t.accs);
  free(t.tpos);
  free(t.tscore);
  return rc;
}

/* ---- the handle's devices ---- */

static int same_path(const char *a, const char *b)
{
  return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* A device of the kind opts ask for: the handle's kept one if free, else a new one. *slot
 * receives its place (0/1) and *kept whether it is the kept one. */
kvdb_status kv_score_dev_acquire(kvdb *db, const kvdb_score_opts *o, kv_fpga_dev **dev,
                                 int *slot, int *kept)
{
  *dev = NULL;
  *kept = 0;
  *slot = o->device == KVDB_SCORE_EMULATED ? 0 : 1;
  const char *xclbin = o->xclbin_path ? o->xclbin_path : getenv("KVDB_XCLBIN");
  pthread_mutex_lock(&db->mu); /* the handle's pools lock: only to create the table */
  if (db->score_devs == NULL) {
    struct kv_score_devs *d = calloc(1, sizeof *d);
    if (d != NULL && pthread_mutex_init(&d->mu, NULL) != 0) {
      free(d);
      d = NULL;
    }
    db->score_devs = d;
  }
  struct kv_score_devs *ds = db->score_devs;
  pthread_mutex_unlock(&db->mu);
  if (ds != NULL) {
    pthread_mutex_lock(&ds->mu);
    if (ds->dev[*slot] != NULL && !ds->busy[*slot] && same_path(ds->xclbin[*slot], xclbin)) {
      ds->busy[*slot] = 1;
      *dev = ds->dev[*slot];
      *kept = 1;
    }
    pthread_mutex_unlock(&ds->mu);
    if (*dev != NULL)
      return KVDB_OK;
  }
  kv_fpga_opts fo;
  kv_fpga_opts_init(&fo);
  fo.backend = *slot == 0 ? KV_FPGA_EMULATED : KV_FPGA_AUTO;
  fo.xclbin_path = xclbin;
  kv_fpga_err err;
  kv_fpga_status st = kv_fpga_open(&fo, dev, &err);
  if (st != KV_FPGA_OK)
    return kv_score_fpga_fail(st, &err, "cannot open the near-data scoring device");
  return KVDB_OK;
}

void kv_score_dev_release(kvdb *db, const kvdb_score_opts *o, kv_fpga_dev *dev, int slot,
                          int kept)
{
  if (dev == NULL)
    return;
  struct kv_score_devs *ds = db->score_devs;
  if (ds != NULL) {
    const char *xclbin = o->xclbin_path ? o->xclbin_path : getenv("KVDB_XCLBIN");
    pthread_mutex_lock(&ds->mu);
    if (kept) {
      ds->busy[slot] = 0;
      dev = NULL;
    } else if (ds->dev[slot] == NULL) { /* keep it for the next calls */
      char *path = xclbin != NULL ? strdup(xclbin) : NULL;
      if (xclbin == NULL || path != NULL) {
        ds->dev[slot] = dev;
        ds->xclbin[slot] = path;
        dev = NULL;
      }
    }
    pthread_mutex_unlock(&ds->mu);
  }
  kv_fpga_close(dev);
}

void kv_score_close(kvdb *db)
{
  struct kv_score_devs *ds = db->score_devs;
  if (ds == NULL)
    return;
  for (int i = 0; i < 2; i++) {
    kv_fpga_close(ds->dev[i]);
    free(ds->xclbin[i]);
  }
  pthread_mutex_destroy(&ds->mu);
  free(ds);
  db->score_devs = NULL;
}

/* ---- one attempt over a catalog snapshot ---- */

static kvdb_status snapshot(sctx *x, const kvdb_key *context, kv_read_snap *s)
{
  kvdb *db = x->db;
  const kvdb_model *m = x->m;
  uint32_t bt = m->block_tokens ? m->block_tokens : 256;
  kv_txn *txn;
  char hx[33], hx2[33];
  uint8_t mh[16];
  KV_RET(kv_read_begin(db, s));
  txn = s->txn;
  kv_model_hash(m, bt, mh);
  kv_ctx_rec cr;
  kvdb_status rc = kv_ctx_of_model(db, txn, context->b, mh, m, &cr);
  if (rc != KVDB_OK)
    goto out;
  x->b = calloc(cr.n_blocks, sizeof *x->b);
  if (x->b == NULL) {
    rc = kv_fail(KVDB_NOMEM, "context of %u blocks", cr.n_blocks);
    goto out;
  }
  uint64_t pos = 0;
  for (uint32_t i = 0; i < cr.n_blocks; i++) {
    sblk *b = &x->b[i];
    memcpy(b->hash, cr.blocks + 16 * i, 16);
    rc = kv_ctx_block(db, txn, context->b, b->hash, &b->rec);
    if (rc != KVDB_OK)
      goto out;
    b->rec.tokens = NULL;
    b->pos0 = (uint32_t)pos;
    x->n_b = i + 1;
    rc = kv_block_geom_init(&b->g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                            b->rec.n_tokens);
    if (rc == KVDB_OK)
      kv_rec_geom(&b->g, &b->rec);
    if (rc == KVDB_OK)
      rc = kv_sregion_init(&b->r, &b->g, m->score_bits, kv_rec_score_variant(&b->rec));
    if (rc != KVDB_OK || kv_rec_score_bits(&b->rec) != m->score_bits ||
        b->rec.bytes <= b->r.bytes) {
      rc = kv_fail(KVDB_CORRUPT,
                   "block %s of context %s has no score copies of %u bits (record flags %u, "
                   "%" PRIu64 " bytes)",
                   kv_hex16(b->hash, hx2), kv_hex16(context->b, hx), m->score_bits,
                   b->rec.bflags, b->rec.bytes);
      goto out;
    }
    b->score_off = b->rec.bytes - b->r.bytes;
    pos += b->rec.n_tokens;
  }
  if (pos != cr.n_tokens || pos > UINT32_MAX) {
    rc = kv_fail(pos > UINT32_MAX ? KVDB_UNSUPPORTED : KVDB_CORRUPT,
                 "context %s has %" PRIu64 " tokens in its blocks and %" PRIu64 " in its record "
                 "(scoring takes up to 2^32 - 1)",
                 kv_hex16(context->b, hx), pos, cr.n_tokens);
    goto out;
  }
  x->n_tokens = pos;
out:
  kv_txn_abort(txn);
  return rc;
}

static kvdb_status attempt(sctx *x, const kvdb_key *context, kv_read_snap *snap)
{
  kvdb *db = x->db;
  KV_RET(snapshot(x, context, snap));
  kvdb_status rc = KVDB_OK;
  for (size_t r = 0; r < x->n_rq; r++)
    if (x->rq[r].k > x->n_tokens)
      return kv_fail(KVDB_INVALID, "reqs[%zu].k = %u is larger than the context's %" PRIu64
                     " tokens", r, x->rq[r].k, x->n_tokens);
  /* where each block is scored */
  uint32_t tiers = x->o->device_tiers ? x->o->device_tiers : 1u << KVDB_TIER_SMARTSSD;
  uint32_t *idx = malloc((size_t)x->n_b * 3 * sizeof *idx);
  kv_score_view *dviews = NULL;
  const sblk **dblk = NULL;
  kv_score_span *spans = NULL;
  if (idx == NULL)
    return kv_fail(KVDB_NOMEM, "score block lists");
  uint32_t *host = idx, *devb = idx + x->n_b, *dram = idx + 2 * (size_t)x->n_b;
  uint32_t n_host = 0, n_dev = 0, n_dram = 0;
  for (uint32_t i = 0; i < x->n_b; i++) {
    sblk *b = &x->b[i];
    if (db->dram != NULL && kv_dram_contains(db->dram, b->hash))
      b->where = SB_DRAM, dram[n_dram++] = i;
    else if (x->o->device != KVDB_SCORE_CPU && b->rec.tier < 32 && (tiers >> b->rec.tier & 1) &&
             b->r.variant == 0) /* the device scores version-1 copies only (seg.h) */
      b->where = SB_DEVICE, devb[n_dev++] = i;
    else
      b->where = SB_HOST, host[n_host++] = i;
  }
  /* the DRAM-resident regions, pinned for the call */
  dviews = malloc(((size_t)n_dram * x->n_copies + 1) * sizeof *dviews);
  dblk = malloc(((size_t)n_dram + 1) * sizeof *dblk);
  spans = malloc(((size_t)n_dram + 1) * sizeof *spans);
  if (dviews == NULL || dblk == NULL || spans == NULL) {
    rc = kv_fail(KVDB_NOMEM, "score views");
    goto out;
  }
  for (uint32_t j = 0; j < n_dram; j++) {
    sblk *b = &x->b[dram[j]];
    KV_ERR(dram_prepare(x, b));
    for (uint32_t s = 0; s < x->n_copies; s++)
      view_of(b, x->copies[s], &dviews[(size_t)j * x->n_copies + s]);
    dblk[j] = b;
  }
  if (n_dev > 0) {
    kv_fpga_dev *dev;
    int slot, kept;
    KV_ERR(kv_score_dev_acquire(db, x->o, &dev, &slot, &kept));
    /* APP: the host's share of the device-tier blocks, spread over them */
    uint32_t nh = app_host_blocks(x, slot, n_dev), kept_dev = 0;
    for (uint32_t i = 0; i < n_dev; i++) {
      if ((uint64_t)(i + 1) * nh / n_dev != (uint64_t)i * nh / n_dev) {
        x->b[devb[i]].where = SB_HOST;
        host[n_host++] = devb[i];
      } else {
        devb[kept_dev++] = devb[i];
      }
    }
    n_dev = kept_dev;
    if (n_dev > 0)
      rc = device_part(x, dev, slot, devb, n_dev, dviews, dblk, n_dram, host, n_host);
    kv_score_dev_release(db, x->o, dev, slot, kept);
    if (rc != KVDB_OK)
      goto out;
  }
  if (n_dev == 0) {
    KV_ERR(score_views(x, dviews, dblk, n_dram, spans));
    KV_ERR(host_waves(x, host, n_host));
  }
out:
  dram_release(x);
  free(idx);
  free(dviews);
  free(dblk);
  free(spans);
  return rc;
}

/* ---- the API ---- */

kvdb_status kv_score_opts_get(const kvdb_score_opts *opts, kvdb_score_opts *o)
{
  kvdb_score_opts_init(o);
  if (opts != NULL) {
    if (opts->struct_size < offsetof(kvdb_score_opts, n_threads) || opts->struct_size > 4096)
      return kv_fail(KVDB_INVALID, "opts->struct_size %u: call kvdb_score_opts_init() first",
                     opts->struct_size);
    memcpy(o, opts, opts->struct_size < sizeof *o ? opts->struct_size : sizeof *o);
    o->struct_size = sizeof *o;
  }
  if (o->combine != KVDB_SCORE_SUM && o->combine != KVDB_SCORE_MAX)
    return kv_fail(KVDB_INVALID, "opts->combine %d is not KVDB_SCORE_SUM or KVDB_SCORE_MAX",
                   (int)o->combine);
  if (o->device != KVDB_SCORE_CPU && o->device != KVDB_SCORE_NEAR_DATA &&
      o->device != KVDB_SCORE_EMULATED)
    return kv_fail(KVDB_INVALID, "opts->device %d is not a kvdb_score_device", (int)o->device);
  if ((o->device_tiers & ~((1u << KVDB_TIER_COUNT) - 1)) != 0)
    return kv_fail(KVDB_INVALID, "opts->device_tiers 0x%x has bits of no kvdb_tier (0x%x)",
                   o->device_tiers, o->device_tiers & ~((1u << KVDB_TIER_COUNT) - 1));
  if (o->chunk_tokens % 64 != 0)
    return kv_fail(KVDB_INVALID, "opts->chunk_tokens %u is not a multiple of 64",
                   o->chunk_tokens);
  if (o->host_share_permille < -1 || o->host_share_permille > 1000)
    return kv_fail(KVDB_INVALID, "opts->host_share_permille %d is not -1 (APP) or 0..1000",
                   (int)o->host_share_permille);
  return KVDB_OK;
}

static int cmp_u32(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static kvdb_status prepare(sctx *x, kvdb_dtype q_dtype, const kvdb_score_req *reqs,
                           size_t n_reqs, kv_score_combine comb)
{
  const kvdb_model *m = x->m;
  if (q_dtype != KVDB_F16 && q_dtype != KVDB_BF16 && q_dtype != KVDB_F32)
    return kv_fail(KVDB_INVALID, "q_dtype %d is not KVDB_F16, KVDB_BF16 or KVDB_F32",
                   (int)q_dtype);
  x->rq = calloc(n_reqs, sizeof *x->rq);
  x->copies = malloc(n_reqs * sizeof *x->copies);
  if (x->rq == NULL || x->copies == NULL)
    return kv_fail(KVDB_NOMEM, "%zu score requests", n_reqs);
  x->n_rq = n_reqs;
  for (size_t r = 0; r < n_reqs; r++) {
    const kvdb_score_req *in = &reqs[r];
    sreq *q = &x->rq[r];
    uint32_t n_q = in->n_q ? in->n_q : 1;
    if (in->layer >= m->n_layers || in->kv_head >= m->n_kv_heads)
      return kv_fail(KVDB_INVALID, "reqs[%zu]: layer %u / kv_head %u out of range (model '%s' "
                     "has %u layers, %u KV heads)",
                     r, in->layer, in->kv_head, m->id, m->n_layers, m->n_kv_heads);
    if (in->q == NULL || in->positions == NULL)
      return kv_fail(KVDB_INVALID, "reqs[%zu]: q or positions is NULL", r);
    if (in->k == 0)
      return kv_fail(KVDB_INVALID, "reqs[%zu]: k is 0", r);
    if (n_q > KV_SCORE_MAX_Q_HEADS)
      return kv_fail(KVDB_INVALID, "reqs[%zu]: n_q %u is more than %u query heads", r, n_q,
                     KV_SCORE_MAX_Q_HEADS);
    kv_score_err e;
    size_t eb = kv_score_dtype_bytes((kv_score_dtype)q_dtype);
    kv_score_status st = kv_score_query_create((kv_score_dtype)q_dtype, in->q, n_q, m->head_dim,
                                               (size_t)m->head_dim * eb, comb, &q->q, &e);
    if (st != KV_SCORE_OK) {
      char msg[200];
      kv_score_errmsg(&e, msg, sizeof msg);
      return kv_fail(st == KV_SCORE_ENOMEM ? KVDB_NOMEM : KVDB_INVALID, "reqs[%zu].q: %s", r,
                     msg);
    }
    q->c = in->layer * m->n_kv_heads + in->kv_head;
    q->k = in->k;
    x->copies[r] = q->c;
    if (q->k > x->max_k)
      x->max_k = q->k;
  }
  qsort(x->copies, n_reqs, sizeof *x->copies, cmp_u32);
  uint32_t n = 0;
  for (size_t r = 0; r < n_reqs; r++)
    if (n == 0 || x->copies[n - 1] != x->copies[r])
      x->copies[n++] = x->copies[r];
  x->n_copies = n;
  for (size_t r = 0; r < n_reqs; r++) {
    uint32_t *p = bsearch(&x->rq[r].c, x->copies, n, sizeof *x->copies, cmp_u32);
    x->rq[r].slot = (uint32_t)(p - x->copies);
  }
  x->tpos = malloc((size_t)x->max_k * sizeof *x->tpos);
  x->tscore = malloc((size_t)x->max_k * sizeof *x->tscore);
  if (x->tpos == NULL || x->tscore == NULL)
    return kv_fail(KVDB_NOMEM, "top-k of %u", x->max_k);
  return KVDB_OK;
}

/* (Re)start every request's accumulator empty. */
static kvdb_status reset_accs(sctx *x)
{
  for (size_t r = 0; r < x->n_rq; r++) {
    sreq *q = &x->rq[r];
    size_t bytes = kv_score_acc_bytes(q->k);
    if (q->acc_mem == NULL && (q->acc_mem = malloc(bytes)) == NULL)
      return kv_fail(KVDB_NOMEM, "top-k of %u", q->k);
    kv_score_err e;
    if (kv_score_acc_init(&q->acc, q->k, q->acc_mem, bytes, &e) != KV_SCORE_OK)
      return kv_fail(KVDB_PANIC, "top-k accumulator of %u", q->k);
  }
  return KVDB_OK;
}

static void sctx_free(sctx *x)
{
  for (size_t r = 0; x->rq != NULL && r < x->n_rq; r++) {
    kv_score_query_free(x->rq[r].q);
    free(x->rq[r].acc_mem);
  }
  free(x->rq);
  free(x->copies);
  free(x->tpos);
  free(x->tscore);
  free(x->b);
}

kvdb_status kvdb_score_batch(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                             kvdb_dtype q_dtype, const kvdb_score_req *reqs, size_t n_reqs,
                             const kvdb_score_opts *opts, kvdb_score_stats *stats)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (stats != NULL)
    memset(stats, 0, sizeof *stats);
  if (m->score_bits == 0)
    return kv_fail(KVDB_UNSUPPORTED,
                   "model '%s' keeps no score copies: put its contexts with "
                   "kvdb_model.score_bits 8 or 4 to score them",
                   m->id);
  if (context == NULL || reqs == NULL || n_reqs == 0)
    return kv_fail(KVDB_INVALID, "context or reqs is NULL, or n_reqs is 0");
  if (n_reqs > (1u << 20))
    return kv_fail(KVDB_INVALID, "n_reqs %zu is more than 2^20", n_reqs);
  kvdb_score_opts o;
  KV_RET(kv_score_opts_get(opts, &o));
  sctx x;
  memset(&x, 0, sizeof x);
  x.db = db;
  x.m = m;
  x.o = &o;
  kv_score_opts_init(&x.so);
  x.so.n_threads = o.n_threads;
  kvdb_status rc = prepare(&x, q_dtype, reqs, n_reqs,
                           o.combine == KVDB_SCORE_MAX ? KV_SCORE_MAX : KV_SCORE_SUM);
  if (rc == KVDB_OK && o.device != KVDB_SCORE_CPU) { /* can the kernel take these queries? */
    uint8_t *qp = malloc(KV_FPGA_QUERY_BYTES);
    if (qp == NULL)
      rc = kv_fail(KVDB_NOMEM, "packed query");
    for (size_t r = 0; rc == KVDB_OK && r < x.n_rq; r++) {
      kv_fpga_err err;
      kv_fpga_status st = kv_fpga_query_pack(x.rq[r].q, qp, KV_FPGA_QUERY_BYTES, &err);
      if (st != KV_FPGA_OK)
        rc = kv_score_fpga_fail(st, &err, "the scoring kernel cannot take this query");
    }
    free(qp);
  }
  kv_read_snap s = {0};
  while (rc == KVDB_OK) {
    memset(&x.st, 0, sizeof x.st);
    rc = reset_accs(&x);
    if (rc == KVDB_OK)
      rc = attempt(&x, context, &s);
    free(x.b);
    x.b = NULL;
    x.n_b = 0;
    if (!kv_read_again(db, &s, rc != KVDB_OK && rc != KVDB_INVALID))
      break;
    rc = KVDB_OK; /* a compaction moved blocks meanwhile: again from a fresh snapshot */
  }
  for (size_t r = 0; rc == KVDB_OK && r < x.n_rq; r++) {
    uint32_t n = kv_score_acc_finish(&x.rq[r].acc, reqs[r].positions, reqs[r].scores);
    if (n != x.rq[r].k)
      rc = kv_fail(KVDB_PANIC, "reqs[%zu]: %u of %u positions", r, n, x.rq[r].k);
  }
  if (rc == KVDB_OK) {
    kv_note_access(db, context->b);
    if (stats != NULL)
      *stats = x.st;
  }
  sctx_free(&x);
  return rc;
}

kvdb_status kvdb_score(kvdb *db, const kvdb_model *m, const kvdb_key *context, uint32_t layer,
                       uint32_t kv_head, const void *q, kvdb_dtype q_dtype, uint32_t k,
                       uint32_t *positions, float *scores)
{
  kvdb_score_req r = {.layer = layer, .kv_head = kv_head, .q = q, .n_q = 1, .k = k,
                      .positions = positions, .scores = scores};
  return kvdb_score_batch(db, m, context, q_dtype, &r, 1, NULL, NULL);
}
