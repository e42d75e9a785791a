/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/get.c — lookup (and kvdb_lookup_kept, whose walk counts blocks stored with
 * dropped tokens), get, get_tokens, get_block, and the read-only inspection calls
 * (context_stat, iterator, stat).
 *
 * The walk (lookup and get): full blocks by chained hash while each one's stored tokens equal
 * the query's; then the longest stored block continuing the prefix among the children of the
 * last hit (a partial block, or a block whose first tokens match), found by descending the
 * catalog's trie of blocks (catalog/index.h: one search per chunk of tokens that two stored
 * blocks share, whatever the number of children). Hits are verified token by token; no block
 * data is read.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog/catalog.h"
#include "ops_int.h"

typedef kv_hit hit;   /* tokens of its record point into the read transaction */
typedef kv_walk walk;

static int push(walk *w, const kv_block_rec *rec, const uint8_t *hash, uint32_t n_copy, uint64_t t0)
{
  if (w->n == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 16;
    hit *nh = realloc(w->h, cap * sizeof *nh);
    if (nh == NULL)
      return -1;
    w->h = nh;
    w->cap = cap;
  }
  hit *x = &w->h[w->n++];
  x->rec = *rec;
  memcpy(x->hash, hash, 16);
  x->n_copy = n_copy;
  x->t0 = t0;
  w->hit_tokens = t0 + n_copy;
  return 0;
}

static uint32_t common_prefix(const uint8_t *stored, uint32_t n_stored, const uint32_t *q, size_t nq)
{
  uint32_t n = n_stored < nq ? n_stored : (uint32_t)nq;
  uint32_t i = 0;
  while (i < n && kv_get_le32(stored + 4 * i) == q[i])
    i++;
  return i;
}

/* with_drops: a block stored with dropped tokens is a hit too (kvdb_lookup_kept), only whole:
 * a full block matched by hash, or a partial block whose tokens all start the query's rest
 * (the trie's children, which end other hits, leave such blocks out: they are looked up by
 * hash, one length at a time). */
static kvdb_status do_walk(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                           const uint32_t *tokens, size_t n, int with_drops, walk *w)
{
  uint8_t prev[16], h[16];
  kv_model_hash(m, bt, prev);
  uint8_t mh[16];
  memcpy(mh, prev, 16);
  uint64_t t = 0;
  while (t + bt <= n) {
    kv_chain_hash(prev, tokens + t, bt, h);
    kv_block_rec br;
    kvdb_status rc = kv_cat_get_block(&db->cat, txn, h, &br);
    if (rc == KVDB_NOTFOUND || rc == KVDB_CORRUPT)
      break;
    if (rc != KVDB_OK)
      return rc;
    if (br.n_tokens != bt || memcmp(br.model, mh, 16) != 0 ||
        common_prefix(br.tokens, br.n_tokens, tokens + t, bt) != bt)
      break; /* a collision or a stale entry: a miss, never wrong KV */
    if ((br.bflags & KV_BLK_DROPS) && !with_drops)
      break; /* stored without some tokens: not a prefix kvdb_get can deliver */
    if (push(w, &br, h, bt, t) != 0)
      return kv_fail(KVDB_NOMEM, "lookup");
    memcpy(prev, h, 16);
    t += bt;
  }
  size_t r = n - t;
  if (r == 0)
    return KVDB_OK;
  /* the tail: first the exact partial block, then the children of the last hit */
  if (r < bt) {
    kv_chain_hash(prev, tokens + t, r, h);
    kv_block_rec br;
    if (kv_cat_get_block(&db->cat, txn, h, &br) == KVDB_OK && br.n_tokens == r &&
        (with_drops || !(br.bflags & KV_BLK_DROPS)) && memcmp(br.model, mh, 16) == 0 &&
        common_prefix(br.tokens, br.n_tokens, tokens + t, r) == r)
      return push(w, &br, h, (uint32_t)r, t) == 0 ? KVDB_OK : kv_fail(KVDB_NOMEM, "lookup");
  }
  uint32_t best = 0;
  kv_block_rec best_rec;
  uint8_t best_hash[16];
  KV_RET(kv_idx_child_best(&db->cat, txn, prev, mh, tokens + t, r, &best, &best_rec, best_hash));
  /* with_drops: a stored partial block with dropped tokens that the query continues past (the
   * last block of a shorter context) is not in the trie's answer: look each length longer than
   * the best up by its hash, longest first (at most block_tokens - 1 catalog reads) */
  for (uint32_t len = (r < bt ? (uint32_t)r : bt) - 1; with_drops && len > best; len--) {
    kv_block_rec br;
    kv_chain_hash(prev, tokens + t, len, h);
    if (kv_cat_get_block(&db->cat, txn, h, &br) == KVDB_OK && br.n_tokens == len &&
        (br.bflags & KV_BLK_DROPS) && memcmp(br.model, mh, 16) == 0 &&
        common_prefix(br.tokens, br.n_tokens, tokens + t, len) == len) {
      best = len;
      best_rec = br;
      memcpy(best_hash, h, 16);
      break;
    }
  }
  if (best > 0 && push(w, &best_rec, best_hash, best, t) != 0)
    return kv_fail(KVDB_NOMEM, "lookup");
  return KVDB_OK;
}

static kvdb_status read_checks(kvdb *db, const kvdb_model *m, uint32_t *bt, const uint32_t *tokens,
                               size_t n)
{
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, bt));
  if (tokens == NULL || n == 0)
    return kv_fail(KVDB_INVALID, "tokens is NULL or n is 0");
  return kv_check_n_tokens(n);
}

/* KVDB_MISMATCH when the model's id is stored with another shape; else KVDB_OK (a model that
 * is not stored at all is a miss, not an error). */
static kvdb_status model_stored(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt)
{
  uint8_t mh[16];
  kv_model_hash(m, bt, mh);
  kvdb_status rc = kv_model_known(db, txn, m, bt, mh);
  return rc == KVDB_NOTFOUND ? KVDB_OK : rc;
}

kvdb_status kvdb_lookup(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                        size_t *hit_tokens)
{
  uint32_t bt;
  if (hit_tokens != NULL)
    *hit_tokens = 0;
  KV_RET(read_checks(db, m, &bt, tokens, n));
  if (hit_tokens == NULL)
    return kv_fail(KVDB_INVALID, "hit_tokens is NULL");
  uint64_t t_start = kv_place_now_ns();
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  walk w = {0};
  kvdb_status rc = model_stored(db, txn, m, bt);
  if (rc == KVDB_OK)
    rc = do_walk(db, txn, m, bt, tokens, n, 0, &w);
  kv_txn_abort(txn);
  free(w.h);
  if (rc == KVDB_OK) /* the rest of the chain on the remote tier, if any */
    *hit_tokens = kv_rtier_extend(db, m, bt, tokens, n, w.hit_tokens, NULL);
  kv_lat_note(db, KV_LAT_LOOKUP, kv_place_now_ns() - t_start);
  return rc;
}

kvdb_status kv_walk_prefix(kvdb *db, kv_txn *txn, const kvdb_model *m, uint32_t bt,
                           const uint32_t *tokens, size_t n, int with_drops, kv_walk *w)
{
  KV_RET(model_stored(db, txn, m, bt));
  return do_walk(db, txn, m, bt, tokens, n, with_drops, w);
}

uint32_t kv_hit_kept(const kv_hit *x)
{
  if (x->rec.bflags & KV_BLK_DROPS)
    return kv_block_rec_kept(&x->rec); /* recorded (format 8) or the ratio's (formats 2-7) */
  return x->n_copy;
}

kvdb_status kvdb_lookup_kept(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                             size_t *hit_tokens, size_t *kept_tokens)
{
  uint32_t bt;
  if (hit_tokens != NULL)
    *hit_tokens = 0;
  if (kept_tokens != NULL)
    *kept_tokens = 0;
  KV_RET(read_checks(db, m, &bt, tokens, n));
  if (hit_tokens == NULL || kept_tokens == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL", hit_tokens == NULL ? "hit_tokens" : "kept_tokens");
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  walk w = {0};
  kvdb_status rc = kv_walk_prefix(db, txn, m, bt, tokens, n, 1, &w);
  kv_txn_abort(txn);
  if (rc == KVDB_OK) {
    size_t kept = 0;
    for (size_t i = 0; i < w.n; i++)
      kept += kv_hit_kept(&w.h[i]);
    *hit_tokens = w.hit_tokens;
    *kept_tokens = kept;
  }
  free(w.h);
  return rc;
}

/* Serve block `x` (n_copy tokens at t0) from the DRAM tier: lent to the caller's on_lend
 * (kvdb_get_lend: taken, it stays pinned until kvdb_lent_return), else copied into the view and
 * told to on_block. 1 when served (a hit). */
static int from_dram(kvdb *db, const kv_block_geom *g, const uint8_t *hash, uint32_t n_copy,
                     const kvdb_kv_view *out, uint64_t t0, kvdb_lend_fn on_lend,
                     kvdb_block_fn on_block, void *ctx)
{
  if (db->dram == NULL)
    return 0;
  const uint8_t *data;
  uint64_t len;
  kv_dram_entry *e = kv_dram_pin(db->dram, hash, &data, &len);
  if (e == NULL)
    return 0;
  if (len != g->data_bytes) {
    kv_dram_unpin(db->dram, e);
    return 0;
  }
  if (on_lend != NULL) {
    kvdb_lent_block b = {data, len, (size_t)t0, n_copy, g->n_sections, g->group_tokens,
                         g->row_bytes, g->group_stride, g->section_bytes, e};
    if (on_lend(ctx, &b))
      return 1; /* the caller's until kvdb_lent_return */
  }
  kv_scatter(g, data, 0, n_copy, out, t0);
  kv_dram_unpin(db->dram, e);
  if (on_block != NULL)
    on_block(ctx, t0, n_copy);
  return 1;
}

#ifndef KV_GET_WAVE
#define KV_GET_WAVE (16u << 20) /* bytes of a block read at once (whole layers; see below) */
#endif

/*
 * The read schedule. A block is read in WAVES of whole layers (about KV_GET_WAVE bytes; the
 * first also holds the meta region), one wave in flight at a time: the next wave is queued the
 * moment the current one has arrived, and then the current one's layers are verified and
 * scattered while the disk reads the next. A get costs its reads plus the processing of its
 * last wave.
 *  - Not earlier: the virtio disk of this project's machines (Firecracker) signals completions
 *    only when its queue drains, so a read queued while another is in flight joins its batch
 *    and delays it until both are done (measured: 96 x 1 MiB reads all complete at 53.4 ms;
 *    32 all at 18.1 ms). Reading a whole block ahead that way left the disk idle during every
 *    scatter: 0.72x a raw sequential read.
 *  - Not whole blocks: then the last block's processing (5 ms per 32 MiB) is never overlapped.
 *    Measured on the Llama-3-8B shape (32 MiB blocks, 1 MiB layers), mean get/raw over 12
 *    interleaved runs each: whole blocks 0.908 and 0.885; waves of 16 MiB 0.963 and 0.912,
 *    12 MiB 0.960, 8 MiB 0.905 (more waves, more round trips).
 * Two slots (read buffers), so the first wave of block j can be read while the last one of
 * block i is processed. All reads go into one batch (one io_uring ring); a wave is one read
 * request, which the OS backend splits into KV_IO_CHUNK pieces that all fit in its queue depth,
 * so it goes to the disk in one submission. Section layouts whose layers do not end on page
 * boundaries (tiny "packed" sections) read a block in one wave.
 */
typedef struct rslot {
  kv_rbuf *buf;
  kv_segfile *sf;
  size_t idx;     /* hit index being read, SIZE_MAX when idle */
  uint32_t wave;  /* the wave of that block in flight */
  size_t req;     /* its read request in the batch */
} rslot;

/* Waves of a block: the layers each one completes. */
typedef struct waves {
  uint32_t n;             /* waves */
  uint32_t layers_per;    /* layers per wave (the last may have fewer) */
  uint64_t layer_bytes;
  uint64_t total;         /* bytes of the object */
} waves;

/* A compressed object (its layout known only from its meta region) is read in one wave. */
static void plan_waves(const kv_block_geom *g, const kv_block_rec *rec, uint64_t wave_bytes,
                       waves *wv)
{
  wv->layer_bytes = 2ull * g->n_kv_heads * g->section_bytes;
  wv->total = kv_rec_body_bytes(g, rec); /* a score region after the data is not read */
  if ((rec->bflags & KV_BLK_COMPRESSED) || g->packed || wv->layer_bytes % KV_PAGE != 0 ||
      g->data_bytes != (uint64_t)g->n_layers * wv->layer_bytes) {
    wv->n = 1;
    wv->layers_per = g->n_layers;
    return;
  }
  uint64_t per = wave_bytes / wv->layer_bytes;
  wv->layers_per = per == 0 ? 1 : per >= g->n_layers ? g->n_layers : (uint32_t)per;
  wv->n = (g->n_layers + wv->layers_per - 1) / wv->layers_per;
}

/* Byte range of wave k within the block object. */
static void wave_range(const kv_block_geom *g, const waves *wv, uint32_t k, uint64_t *off,
                       uint64_t *len)
{
  uint32_t l0 = k * wv->layers_per, l1 = l0 + wv->layers_per;
  if (l1 > g->n_layers || k + 1 == wv->n)
    l1 = g->n_layers;
  uint64_t a = k == 0 ? 0 : g->meta_bytes + l0 * wv->layer_bytes;
  uint64_t b = k + 1 == wv->n ? wv->total : g->meta_bytes + l1 * wv->layer_bytes;
  *off = a;
  *len = b - a;
}

/*
 * What a fetch does with the blocks it reads. A get (kv_fetch_ctl.out set) scatters each
 * block into the caller's view and tells on_block; a prefetch (out NULL) copies each block's
 * data region into the DRAM tier and asks `gate` before every read it queues (admission
 * control: it waits there; nonzero ends the fetch, with `stopped` set) and, with 0 bytes,
 * before it processes each wave that arrived (it yields the CPU to foreground reads too).
 */
typedef struct kv_fetch_ctl {
  const kvdb_kv_view *out; /* NULL: into the DRAM tier only */
  uint64_t wave_bytes;     /* bytes of a block read at once (whole layers) */
  int (*gate)(void *ctx, uint64_t bytes);
  void *gate_ctx;
  void (*on_block)(void *ctx, size_t t0, size_t n_tokens);
  void *block_ctx;         /* on_block's and on_lend's */
  kvdb_lend_fn on_lend;    /* kvdb_get_lend: DRAM-tier blocks lent, not copied */
  int stopped;             /* the gate said stop */
  uint32_t blocks_read, blocks_present; /* prefetch: read from disk, found in the DRAM tier */
  uint64_t bytes_read;
  uint8_t hit_ctx[16];     /* a get: the context whose last block was the last delivered, */
  int served;              /* when served is 1 (placement's promotion on a hit) */
} kv_fetch_ctl;

/* Queue wave k of hit x into slot s (wave 0 first opens the block's segment: -1 on failure;
 * -1 also when the control's gate stops the fetch). */
static int issue(kvdb *db, kv_batch *bat, rslot *s, const hit *x, const kv_block_geom *g,
                 size_t idx, uint32_t k, kv_fetch_ctl *ctl)
{
  if (k == 0) {
    kv_segfile_put(db, s->sf);
    s->sf = NULL;
    if (kv_segfile_get(db, x->rec.segment, &s->sf) != KVDB_OK)
      return -1;
  }
  waves wv;
  plan_waves(g, &x->rec, ctl->wave_bytes, &wv);
  uint64_t off, len;
  wave_range(g, &wv, k, &off, &len);
  if (ctl->gate != NULL && ctl->gate(ctl->gate_ctx, len) != 0) {
    ctl->stopped = 1;
    return -1;
  }
  if (kv_rec_packed(&x->rec)) { /* one wave: the pages that cover the object (FORMAT.md §3e,
                                  * §3f), which then starts at s->buf->p + kv_rec_lead() */
    uint64_t lead = x->rec.offset % KV_PAGE;
    s->req = kv_batch_read(db->io, bat, s->sf->f, s->buf->p, KV_ALIGN_UP(lead + len, KV_PAGE),
                           x->rec.offset - lead);
  } else {
    s->req = kv_batch_read(db->io, bat, s->sf->f, s->buf->p + off, len, x->rec.offset + off);
  }
  s->idx = idx;
  s->wave = k;
  return 0;
}

/* Wait until slot s's wave in flight has arrived. */
static kvdb_status arrive(kvdb *db, kv_batch *bat, const rslot *s, const hit *x)
{
  int e = kv_batch_wait_first(db->io, bat, s->req + 1);
  if (e == 0)
    return KVDB_OK;
  return kv_seg_read_fail(db, -e, x->rec.segment, x->rec.offset, x->rec.bytes, x->hash);
}

/* The next hit after `i` that the DRAM tier does not hold, or w->n. */
static size_t next_from_disk(kvdb *db, const walk *w, size_t i)
{
  size_t j = i + 1;
  while (j < w->n && db->dram != NULL && kv_dram_contains(db->dram, w->h[j].hash))
    j++;
  return j;
}

/* 1 when a block record's object size is possible for its geometry: a raw object is exactly
 * meta + data; a compressed one never more than twice that plus a page per section (a section
 * that does not shrink is stored raw; quantization scales and the section table are smaller
 * than the raw rows they describe). Checked before any buffer is sized from the record, so a
 * damaged catalog record cannot ask for an absurd allocation. */
static int rec_bytes_plausible(const kv_block_geom *g, const kv_block_rec *rec)
{
  uint64_t raw = (uint64_t)g->meta_bytes + g->data_bytes;
  uint64_t score = kv_score_region_bytes(g, kv_rec_score_bits(rec), kv_rec_score_variant(rec)); /* after the object */
  if (g->packed) /* a packed raw object (FORMAT.md §3e): exactly meta + data, no score copies */
    return rec->bytes == raw && !(rec->bflags & ~(uint32_t)KV_BLK_PACKED);
  /* a packed compressed object (FORMAT.md §3f): 64-byte units, no score copies */
  uint64_t unit = kv_rec_packed(rec) ? KV_BLOCK_PACK_ALIGN : KV_PAGE;
  if (rec->bytes == 0 || rec->bytes % unit != 0 || (kv_rec_packed(rec) && score != 0))
    return 0;
  if (!(rec->bflags & KV_BLK_COMPRESSED))
    return rec->bytes == raw + score;
  return rec->bytes <= 2 * raw + (uint64_t)g->n_sections * KV_PAGE + score;
}

/* The hit's tokens as the block itself stores them (its meta region, checksum verified) must be
 * the query's: the walk matched them against the catalog record's copy, which has no checksum
 * of its own. */
static kvdb_status check_hit_tokens(const hit *x, const uint8_t *buf, const uint32_t *tokens)
{
  const uint8_t *bt = buf + KV_BLOCK_HDR_BYTES;
  for (uint32_t i = 0; i < x->n_copy; i++)
    if (kv_get_le32(bt + 4 * i) != tokens[x->t0 + i]) {
      char hx[33];
      return kv_fail(KVDB_CORRUPT,
                     "block %s in segment %" PRIu64 " at offset %" PRIu64
                     ": its token %u is not the one its catalog record lists",
                     kv_hex16(x->hash, hx), x->rec.segment, x->rec.offset, i);
    }
  return KVDB_OK;
}

/*
 * A compressed (format 2) block's layers verified and decoded (straight into the caller's view,
 * kv_cblock_decode_view, or into the data region and scattered) on every core: the calling
 * thread and one thread per other core claim layers one at a time, each with its own decoding
 * context (issue 16: an int4 get is bound by its CPU, not by the disk: 4.2 GB/s of fp16 per CPU
 * second against a 1.6-2.5 GB/s raw read on the project's 2-core VM before the direct decode,
 * ~12 after it). Only for blocks of at least KV_GET_MT_MIN_BYTES of KV (a thread costs ~20-50
 * us to start) and gets into a caller's view.
 */
#ifndef KV_GET_MT_MIN_BYTES
#define KV_GET_MT_MIN_BYTES (4u << 20)
#endif
#define KV_GET_MT_MAX 8

/* The layers of a block are claimed one at a time from a shared counter (not cut into equal
 * shares): on this project's shared 2-vCPU machines a thread is often descheduled for
 * milliseconds, and then the other takes its layers instead of waiting for it. A failure
 * stops the claims. */
typedef struct layer_shared {
  uint32_t next; /* the next layer to claim (atomic) */
  int stop;      /* a layer failed (atomic) */
} layer_shared;

typedef struct layer_job {
  const hit *x;
  const kv_block_hdr *hdr;
  const uint8_t *buf;
  const kv_block_geom *g;
  kv_cdec *dec;
  uint8_t *data;
  const kvdb_kv_view *out;
  int stream;
  int direct; /* decoded straight into out (kv_cblock_decode_view), data unused */
  layer_shared *sh;
  kvdb_status rc;
  char msg[512];
} layer_job;

static kvdb_status layer_one(const layer_job *j, uint32_t l)
{
  uint32_t per_layer = 2 * j->g->n_kv_heads, s0 = l * per_layer;
  KV_RET(kv_block_check_sections(&j->x->rec, j->x->hash, j->hdr, j->buf, s0, s0 + per_layer));
  if (j->direct)
    return kv_cblock_decode_view(j->hdr, j->buf, s0, s0 + per_layer, j->x->n_copy, j->dec,
                                 j->out, j->x->t0);
  KV_RET(kv_cblock_decode_data(j->hdr, j->buf, s0, s0 + per_layer, j->dec, j->data));
  kv_scatter_sections(j->g, j->data, s0, s0 + per_layer, 0, j->x->n_copy, j->out, j->x->t0,
                      j->stream);
  return KVDB_OK;
}

static kvdb_status layers_run(const layer_job *j)
{
  for (;;) {
    if (__atomic_load_n(&j->sh->stop, __ATOMIC_RELAXED))
      return KVDB_OK; /* another thread's failure ends the block */
    uint32_t l = __atomic_fetch_add(&j->sh->next, 1, __ATOMIC_RELAXED);
    if (l >= j->g->n_layers)
      return KVDB_OK;
    kvdb_status rc = layer_one(j, l);
    if (rc != KVDB_OK) {
      __atomic_store_n(&j->sh->stop, 1, __ATOMIC_RELAXED);
      return rc;
    }
  }
}

static void *layer_thread(void *arg)
{
  layer_job *j = arg;
  j->rc = layers_run(j);
  if (j->rc != KVDB_OK)
    snprintf(j->msg, sizeof j->msg, "%s", kvdb_errmsg());
  return NULL;
}

/* The threads a block of `bytes` of KV is processed on (1: the calling thread alone). */
static unsigned get_threads(const kv_block_geom *g)
{
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu < 2 || g->data_bytes < KV_GET_MT_MIN_BYTES || g->n_layers < 2)
    return 1;
  unsigned n = ncpu > KV_GET_MT_MAX ? KV_GET_MT_MAX : (unsigned)ncpu;
  return n > g->n_layers ? g->n_layers : n;
}

/* Layers [0, n_layers) of compressed block x (format 2, read whole into buf, meta checked) on
 * nt threads; hdec: nt - 1 decoding contexts for the others (initialized on first use). A
 * thread that cannot start (or has no context) leaves its layers to the others. */
static kvdb_status layers_mt(const hit *x, const kv_block_hdr *hdr, const uint8_t *buf,
                             const kv_block_geom *g, kv_cdec *dec, kv_cdec *hdec, uint8_t *data,
                             const kvdb_kv_view *out, int stream, int direct, unsigned nt)
{
  layer_job jobs[KV_GET_MT_MAX];
  pthread_t th[KV_GET_MT_MAX];
  int started[KV_GET_MT_MAX] = {0};
  layer_shared sh = {0, 0};
  for (unsigned t = 0; t < nt; t++) {
    jobs[t] = (layer_job){x, hdr, buf, g, t == 0 ? dec : &hdec[t - 1], data, out, stream, direct,
                          &sh, KVDB_OK, ""};
    if (t > 0 && hdec[t - 1].ctx == NULL && kv_cdec_init(&hdec[t - 1]) != KVDB_OK)
      jobs[t].dec = NULL;
    if (jobs[t].dec != NULL) /* rows straight into a large output: streaming stores */
      kv_codec_dctx_set_stream(jobs[t].dec->ctx, direct && stream);
  }
  for (unsigned t = 1; t < nt; t++)
    started[t] = jobs[t].dec != NULL && pthread_create(&th[t], NULL, layer_thread, &jobs[t]) == 0;
  kvdb_status rc = layers_run(&jobs[0]);
  for (unsigned t = 1; t < nt; t++)
    if (started[t])
      pthread_join(th[t], NULL);
  if (rc != KVDB_OK)
    return rc;
  for (unsigned t = 1; t < nt; t++)
    if (started[t] && jobs[t].rc != KVDB_OK)
      return kv_fail(jobs[t].rc, "%s", jobs[t].msg);
  return KVDB_OK;
}

/* Fetch the hits into ctl->out (or the DRAM tier); returns how many tokens were delivered (a
 * failure, or the gate, ends it). */
static size_t fetch(kvdb *db, const kvdb_model *m, uint32_t bt, walk *w, const uint32_t *tokens,
                    kv_fetch_ctl *ctl)
{
  const kvdb_kv_view *out = ctl->out;
  size_t biggest = 0;
  for (size_t i = 0; i < w->n; i++) {
    kv_block_geom gi;
    if (kv_block_geom_init(&gi, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                           w->h[i].rec.n_tokens) != KVDB_OK ||
        (kv_rec_geom(&gi, &w->h[i].rec), !rec_bytes_plausible(&gi, &w->h[i].rec))) {
      char hx[33];
      db->corrupt_blocks++;
      kv_fail(KVDB_CORRUPT, "block %s: its catalog record gives %" PRIu64 " bytes for %u tokens",
              kv_hex16(w->h[i].hash, hx), w->h[i].rec.bytes, w->h[i].rec.n_tokens);
      kv_log(&db->log, 0, "%s", kvdb_errmsg());
      w->n = i; /* deliver the hits before it */
      break;
    }
    if (w->h[i].rec.bytes + 2 * KV_PAGE > biggest) /* (a packed object's covering pages) */
      biggest = w->h[i].rec.bytes + 2 * KV_PAGE;
  }
  rslot sl[2] = {{NULL, NULL, SIZE_MAX, 0, 0}, {NULL, NULL, SIZE_MAX, 0, 0}};
  kv_batch *bat = NULL;
  size_t delivered = 0;
  kv_rbuf *dbuf = NULL; /* compressed blocks are decoded into it */
  size_t data_cap = 0;
  kv_cdec dec, hdec[KV_GET_MT_MAX - 1];
  memset(&dec, 0, sizeof dec);
  memset(hdec, 0, sizeof hdec);
  for (size_t i = 0; i < w->n; i++) {
    kv_block_geom gi;
    if (kv_block_geom_init(&gi, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                           w->h[i].rec.n_tokens) == KVDB_OK && gi.data_bytes > data_cap)
      data_cap = gi.data_bytes;
  }
  for (size_t i = 0; i < w->n && !ctl->stopped; i++) {
    hit *x = &w->h[i];
    kv_block_geom g;
    if (kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                           x->rec.n_tokens) != KVDB_OK)
      break;
    kv_rec_geom(&g, &x->rec);
    int s = sl[0].idx == i ? 0 : sl[1].idx == i ? 1 : -1;
    if (s < 0 && out != NULL &&
        from_dram(db, &g, x->hash, x->n_copy, out, x->t0, ctl->on_lend, ctl->on_block,
                  ctl->block_ctx)) {
      delivered = x->t0 + x->n_copy;
      continue;
    }
    if (s < 0 && out == NULL && kv_dram_keep(db->dram, x->hash)) {
      delivered = x->t0 + x->n_copy;
      ctl->blocks_present++;
      continue;
    }
    uint64_t t_blk = kv_place_now_ns(); /* the block's share of the get (placement figures) */
    if (bat == NULL) {
      bat = kv_batch_begin(db->io);
      sl[0].buf = kv_rbuf_acquire(db, biggest);
      sl[1].buf = kv_rbuf_acquire(db, biggest);
      if (bat == NULL || sl[0].buf == NULL || sl[1].buf == NULL) {
        kv_fail(KVDB_NOMEM, "cannot allocate %zu bytes of read buffers", 2 * biggest);
        break;
      }
    }
    if (s < 0) {
      /* not read ahead (the DRAM tier held it when the read-ahead was chosen and lost it) */
      if (sl[0].idx != SIZE_MAX || sl[1].idx != SIZE_MAX) {
        kv_batch_wait(db->io, bat); /* let an unused read-ahead land */
        sl[0].idx = sl[1].idx = SIZE_MAX;
      }
      s = 0;
      if (issue(db, bat, &sl[s], x, &g, i, 0, ctl) != 0)
        break;
    }
    if (out == NULL)
      ; /* a prefetch serves nobody yet: the get that finds it counts a DRAM hit */
    else if (x->rec.tier == KVDB_TIER_SMARTSSD)
      db->smart_hits++;
    else
      db->ssd_hits++;
    /* the object (a packed one after the bytes of its first page before it) */
    const uint8_t *buf = sl[s].buf->p + kv_rec_lead(&x->rec);
    waves wv;
    plan_waves(&g, &x->rec, ctl->wave_bytes, &wv);
    const uint8_t *data = buf + g.meta_bytes; /* the raw data region (decoded if compressed) */
    /* a format-2 block decodes straight into the caller's view unless the DRAM tier is to
     * keep its data region (kv_cblock_decode_view: no data region, no scatter) */
    int direct = out != NULL && (x->rec.bflags & KV_BLK_COMPRESSED) &&
                 !(db->dram != NULL && kv_place_dram_admits(db, x->hash));
    if (x->rec.bflags & KV_BLK_COMPRESSED) {
      /* the data region only where it is used: a buffer acquired and not used would take the
       * place of a read buffer in the handle's idle list, and the next get would read into
       * fresh memory (page faults in every read: issue 16) */
      if (!direct && dbuf == NULL && (dbuf = kv_rbuf_acquire(db, data_cap)) == NULL) {
        kv_fail(KVDB_NOMEM, "cannot allocate %zu bytes to decode into", data_cap);
        break;
      }
      if (dec.ctx == NULL && kv_cdec_init(&dec) != KVDB_OK)
        break;
      data = dbuf != NULL ? dbuf->p : NULL;
    }
    int stream = kv_scatter_streams(&g, x->n_copy);
    if (dec.ctx != NULL)
      kv_codec_dctx_set_stream(dec.ctx, direct && stream);
    uint32_t per_layer = 2 * g.n_kv_heads;
    kv_block_hdr hdr;
    kvdb_status rr = KVDB_OK;
    for (uint32_t k = 0; rr == KVDB_OK && k < wv.n; k++) {
      rr = arrive(db, bat, &sl[s], x);
      if (rr != KVDB_OK)
        break;
      /* a prefetch also yields its processing (verify, copy) to a foreground read: gate(0) */
      if (out == NULL && ctl->gate != NULL && ctl->gate(ctl->gate_ctx, 0) != 0) {
        ctl->stopped = 1;
        rr = KVDB_BUSY;
        break;
      }
      /* the next wave is queued now, before this one is verified and scattered */
      if (k + 1 < wv.n) {
        /* a later wave only queues: only the gate can stop it */
        if (issue(db, bat, &sl[s], x, &g, i, k + 1, ctl) != 0) {
          sl[s].idx = SIZE_MAX;
          rr = KVDB_BUSY;
          break;
        }
      } else {
        sl[s].idx = SIZE_MAX;
        size_t j = next_from_disk(db, w, i);
        kv_block_geom gj;
        if (j < w->n &&
            kv_block_geom_init(&gj, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                               w->h[j].rec.n_tokens) == KVDB_OK &&
            (kv_rec_geom(&gj, &w->h[j].rec), 1))
          issue(db, bat, &sl[s ^ 1], &w->h[j], &gj, j, 0, ctl); /* a failure shows when
                                                                     needed */
      }
      if (rr == KVDB_OK && k == 0)
        rr = kv_block_check_meta(&x->rec, x->hash, buf, &hdr);
      if (rr == KVDB_OK && k == 0)
        rr = check_hit_tokens(x, buf, tokens);
      if (rr == KVDB_OK && k == 0 && direct && (hdr.version != 2 || KV_HDR_FRAMES(&hdr))) {
        direct = 0; /* lossless frames: decoded into the data region, then scattered */
        if (dbuf == NULL && (dbuf = kv_rbuf_acquire(db, data_cap)) == NULL)
          rr = kv_fail(KVDB_NOMEM, "cannot allocate %zu bytes to decode into", data_cap);
        else
          data = dbuf->p;
        kv_codec_dctx_set_stream(dec.ctx, 0);
      }
      /* format 2 read whole: its layers on every core (layers_mt) */
      unsigned nt = rr == KVDB_OK && hdr.version == 2 && wv.n == 1 && out != NULL
                        ? get_threads(&g) : 1;
      if (nt > 1) {
        rr = layers_mt(x, &hdr, buf, &g, &dec, hdec, (uint8_t *)data, out, stream, direct, nt);
        continue;
      }
      /* each layer's sections are verified, then scattered while they are still in cache:
       * one pass over the data in memory instead of two (5.0 + 4.7 ms per 32 MiB apart) */
      uint32_t l1 = k + 1 == wv.n ? g.n_layers : (k + 1) * wv.layers_per;
      for (uint32_t l = k * wv.layers_per; rr == KVDB_OK && l < l1; l++) {
        uint32_t s0 = l * per_layer;
        rr = kv_block_check_sections(&x->rec, x->hash, &hdr, buf, s0, s0 + per_layer);
        if (KV_HDR_FRAMES(&hdr)) /* lossless frames: decoded together once all are verified */
          continue;
        if (rr == KVDB_OK && direct) {
          rr = kv_cblock_decode_view(&hdr, buf, s0, s0 + per_layer, x->n_copy, &dec, out, x->t0);
          continue;
        }
        if (rr == KVDB_OK && KV_HDR_CPR(&hdr))
          rr = kv_cblock_decode_data(&hdr, buf, s0, s0 + per_layer, &dec, (uint8_t *)data);
        if (rr == KVDB_OK && out != NULL)
          kv_scatter_sections(&g, data, s0, s0 + per_layer, 0, x->n_copy, out, x->t0, stream);
      }
      /* format 3: the block's frames decoded on every core (kv_cblock_decode_data), then
       * scattered, after its last wave */
      if (rr == KVDB_OK && KV_HDR_FRAMES(&hdr) && k + 1 == wv.n) {
        rr = kv_cblock_decode_data(&hdr, buf, 0, g.n_sections, &dec, (uint8_t *)data);
        if (rr == KVDB_OK && out != NULL) /* (a prefetch: into the DRAM tier below) */
          kv_scatter_sections(&g, data, 0, g.n_sections, 0, x->n_copy, out, x->t0, stream);
      }
    }
    if (rr != KVDB_OK) {
      if (rr == KVDB_CORRUPT)
        db->corrupt_blocks++;
      if (!ctl->stopped)
        kv_log(&db->log, 0, "%s", kvdb_errmsg());
      break;
    }
    db->bytes_read += kv_rec_body_bytes(&g, &x->rec);
    kv_place_observe(db, x->rec.tier, kv_rec_body_bytes(&g, &x->rec), kv_place_now_ns() - t_blk);
    if (out == NULL) { /* a prefetch: into the DRAM tier whatever the placement keeps */
      if (kv_dram_stage(db->dram, x->hash, data, g.data_bytes) != 0)
        break; /* the tier cannot take it (pinned full): nothing more would stay */
      ctl->blocks_read++;
      ctl->bytes_read += kv_rec_body_bytes(&g, &x->rec);
    } else if (!direct && db->dram != NULL && kv_place_dram_admits(db, x->hash)) {
      kv_dram_insert(db->dram, x->hash, data, g.data_bytes);
    }
    delivered = x->t0 + x->n_copy;
    if (ctl->on_block != NULL)
      ctl->on_block(ctl->block_ctx, x->t0, x->n_copy);
  }
  if (bat != NULL) {
    kv_batch_wait(db->io, bat);
    kv_batch_end(db->io, bat);
  }
  for (int k = 0; k < 2; k++) {
    kv_segfile_put(db, sl[k].sf);
    kv_rbuf_release(db, sl[k].buf);
  }
  kv_rbuf_release(db, dbuf);
  kv_cdec_free(&dec);
  for (unsigned t = 0; t < KV_GET_MT_MAX - 1; t++)
    kv_cdec_free(&hdec[t]);
  return delivered;
}

/* kvdb_get and kvdb_get_notify: the walk, then the fetch as ctl says, in the snapshot-and-retry
 * loop. A foreground read (ctl->out set) is counted in db->fg_reads while it runs and its bytes
 * in db->fg_bytes: the prefetch's admission control (prefetch.c) reads both. */
static kvdb_status get_ctl(kvdb *db, const kvdb_model *m, uint32_t bt, const uint32_t *tokens,
                           size_t n, kv_fetch_ctl *ctl, size_t *hit_tokens)
{
  /* a hit that comes back short because a compaction moved its blocks is read again from a
   * fresh snapshot (kv_read_again, ops_int.h) */
  kvdb_status rc;
  kv_read_snap s = {0};
  int again;
  uint64_t t_start = kv_place_now_ns();
  do {
    KV_RET(kv_read_begin(db, &s));
    kv_txn *txn = s.txn;
    kv_place_refresh(db, txn); /* placement on: which blocks the DRAM tier may take */
    walk w = {0};
    rc = model_stored(db, txn, m, bt);
    if (rc == KVDB_OK)
      rc = do_walk(db, txn, m, bt, tokens, n, 0, &w);
    if (rc == KVDB_OK && w.n > 0) {
      uint64_t before = db->bytes_read;
      if (ctl->out != NULL)
        db->fg_reads++;
      *hit_tokens = fetch(db, m, bt, &w, tokens, ctl);
      if (ctl->out != NULL) {
        db->fg_bytes += db->bytes_read - before; /* other threads' reads too: an estimate */
        db->fg_reads--;
        /* the context whose last block is the last block delivered, if there is one */
        for (size_t i = w.n; i-- > 0;)
          if (w.h[i].t0 + w.h[i].n_copy == *hit_tokens) {
            kv_note_access(db, w.h[i].hash);
            memcpy(ctl->hit_ctx, w.h[i].hash, 16);
            ctl->served = 1;
            break;
          }
      }
    }
    kv_txn_abort(txn);
    again = rc == KVDB_OK && *hit_tokens < w.hit_tokens && !ctl->stopped;
    free(w.h);
  } while (kv_read_again(db, &s, again));
  /* the rest of the chain on the remote tier, if any: for a get into the caller's view only
   * (a prefetch stages local blocks; a get that reports each block as it lands, the GPU hop's,
   * ends at the local hit, since remote blocks would land unreported) */
  if (rc == KVDB_OK && ctl->out != NULL && ctl->on_block == NULL && ctl->on_lend == NULL &&
      !ctl->stopped)
    *hit_tokens = kv_rtier_extend(db, m, bt, tokens, n, *hit_tokens, ctl->out);
  if (rc == KVDB_OK)
    kv_clear_error(); /* a block that failed verification is a miss, not an error */
  kv_lat_note(db, KV_LAT_GET, kv_place_now_ns() - t_start);
  return rc;
}

kvdb_status kv_get(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                   const kvdb_kv_view *out, size_t *hit_tokens, kvdb_block_fn on_block,
                   kvdb_lend_fn on_lend, void *ctx, uint8_t hit_ctx[16], int *served)
{
  uint32_t bt;
  *served = 0;
  if (hit_tokens != NULL)
    *hit_tokens = 0;
  KV_RET(read_checks(db, m, &bt, tokens, n));
  KV_RET(kv_check_view(out, m, "out"));
  KV_RET(kv_check_view_extent(out, m, n, "out"));
  if (hit_tokens == NULL)
    return kv_fail(KVDB_INVALID, "hit_tokens is NULL");
  kv_fetch_ctl ctl = {out, KV_GET_WAVE, NULL, NULL, on_block, ctx, on_lend, 0, 0, 0, 0, {0}, 0};
  kvdb_status rc = get_ctl(db, m, bt, tokens, n, &ctl, hit_tokens);
  if (rc == KVDB_OK && ctl.served) {
    memcpy(hit_ctx, ctl.hit_ctx, 16);
    *served = 1;
  }
  return rc;
}

kvdb_status kv_prefetch_fetch(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                              uint64_t wave_bytes, int (*gate)(void *, uint64_t), void *gate_ctx,
                              kv_prefetch_result *res)
{
  uint32_t bt;
  memset(res, 0, sizeof *res);
  KV_RET(read_checks(db, m, &bt, tokens, n));
  if (db->dram == NULL)
    return kv_fail(KVDB_UNSUPPORTED, "prefetch: the DRAM tier is off (options.dram_bytes 0)");
  kv_fetch_ctl ctl = {NULL, wave_bytes, gate, gate_ctx, NULL, NULL, NULL, 0, 0, 0, 0, {0}, 0};
  size_t staged = 0;
  kvdb_status rc = get_ctl(db, m, bt, tokens, n, &ctl, &staged);
  res->staged_tokens = staged;
  res->blocks_read = ctl.blocks_read;
  res->blocks_present = ctl.blocks_present;
  res->bytes_read = ctl.bytes_read;
  res->stopped = ctl.stopped;
  return rc;
}

/* ---- get_tokens: dual-step loading (pages, then tokens) ---- */

typedef struct range {
  uint64_t off, len;
} range;

static int cmp_range(const void *a, const void *b)
{
  const range *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

static kvdb_status tokens_from_block(kvdb *db, const kv_block_rec *rec, const uint8_t *hash,
                                     const kv_block_geom *g, uint32_t layer,
                                     const uint32_t *positions, size_t n_pos, uint64_t pos0,
                                     const kvdb_kv_view *out)
{
  /* DRAM first */
  if (db->dram != NULL) {
    const uint8_t *data;
    uint64_t len;
    kv_dram_entry *e = kv_dram_pin(db->dram, hash, &data, &len);
    if (e != NULL) {
      if (len == g->data_bytes)
        for (size_t i = 0; i < n_pos; i++)
          if (positions[i] >= pos0 && positions[i] < pos0 + g->n_tokens)
            kv_scatter_token_layer(g, data, layer, (uint32_t)(positions[i] - pos0), out, i);
      kv_dram_unpin(db->dram, e);
      if (len == g->data_bytes)
        return KVDB_OK;
    }
  }
  if (rec->bflags & KV_BLK_COMPRESSED)
    return kv_block_read_tokens(db, rec, hash, g, layer, positions, n_pos, pos0, out);
  uint32_t s0 = layer * g->n_kv_heads * 2, s1 = s0 + g->n_kv_heads * 2;
  uint8_t *need = calloc(g->n_groups, 1);
  size_t cap = 2 + (size_t)g->n_groups * (s1 - s0);
  range *rg = malloc(cap * sizeof *rg);
  kv_rbuf *rb = kv_rbuf_acquire(db, g->total_bytes + 2 * KV_PAGE);
  /* a packed object (FORMAT.md §3e) lies at a 64-byte offset: the buffer holds the pages from
   * the one it starts in, so that every read is of whole pages, and the object starts `lead`
   * bytes in (0 for any other object) */
  uint64_t lead = g->packed ? rec->offset % KV_PAGE : 0;
  uint8_t *buf = rb != NULL ? rb->p + lead : NULL;
  kv_segfile *sf = NULL;
  kv_batch *bat = NULL;
  kvdb_status rc = KVDB_OK;
  char hx[33];
  if (need == NULL || rg == NULL || buf == NULL) {
    rc = kv_fail(KVDB_NOMEM, "get_tokens buffers");
    goto out;
  }
  for (size_t i = 0; i < n_pos; i++)
    if (positions[i] >= pos0 && positions[i] < pos0 + g->n_tokens)
      need[(positions[i] - pos0) / g->group_tokens] = 1;
  size_t nr = 0;
  /* ranges in pages of the segment (offsets from the object's first page: + lead) */
  rg[nr++] = (range){0, KV_PAGE}; /* the fixed header */
  uint64_t c0 = lead + kv_block_cksum_off(g, s0, 0), c1 = lead + kv_block_cksum_off(g, s1 - 1, g->n_groups);
  c0 = c0 / KV_PAGE * KV_PAGE;
  rg[nr++] = (range){c0, KV_ALIGN_UP(c1, KV_PAGE) - c0};
  for (uint32_t s = s0; s < s1; s++)
    for (uint32_t grp = 0; grp < g->n_groups; grp++)
      if (need[grp]) {
        uint64_t a = (lead + kv_block_group_off(g, s, grp)) / KV_PAGE * KV_PAGE;
        uint64_t b = KV_ALIGN_UP(lead + kv_block_group_off(g, s, grp) + g->group_stride, (uint64_t)KV_PAGE);
        rg[nr++] = (range){a, b - a};
      }
  qsort(rg, nr, sizeof *rg, cmp_range);
  size_t m = 0;
  for (size_t i = 1; i < nr; i++) {
    if (rg[i].off <= rg[m].off + rg[m].len) {
      uint64_t end = rg[i].off + rg[i].len;
      if (end > rg[m].off + rg[m].len)
        rg[m].len = end - rg[m].off;
    } else {
      rg[++m] = rg[i];
    }
  }
  nr = m + 1;
  KV_ERR(kv_segfile_get(db, rec->segment, &sf));
  bat = kv_batch_begin(db->io);
  if (bat == NULL) {
    rc = kv_fail(KVDB_NOMEM, "get_tokens batch");
    goto out;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < nr; i++) {
    kv_batch_read(db->io, bat, sf->f, rb->p + rg[i].off, rg[i].len,
                  rec->offset - lead + rg[i].off);
    bytes += rg[i].len;
  }
  int e = kv_batch_wait(db->io, bat);
  if (e != 0) {
    rc = kv_seg_read_fail(db, -e, rec->segment, rec->offset, rec->bytes, hash);
    goto out;
  }
  db->bytes_read += bytes;
  kv_block_hdr hdr;
  rc = kv_block_parse_header(buf, KV_BLOCK_HDR_BYTES, &hdr);
  if (rc == KVDB_OK && (memcmp(hdr.block_hash, hash, 16) != 0 || hdr.g.n_tokens != rec->n_tokens ||
                        hdr.g.packed != g->packed))
    rc = kv_fail(KVDB_CORRUPT, "the object is another block (stale location)");
  if (rc != KVDB_OK) {
    rc = kv_fail(rc, "block %s in segment %" PRIu64 " at offset %" PRIu64 ": %s",
                 kv_hex16(hash, hx), rec->segment, rec->offset, kvdb_errmsg());
    goto out;
  }
  for (uint32_t s = s0; s < s1; s++)
    for (uint32_t grp = 0; grp < g->n_groups; grp++) {
      if (!need[grp])
        continue;
      uint64_t off = kv_block_group_off(g, s, grp);
      uint64_t want = kv_get_le64(buf + kv_block_cksum_off(g, s, grp));
      if (kv_block_group_checksum(&hdr, s, grp, buf + off, g->group_stride) != want) {
        rc = kv_fail(KVDB_CORRUPT,
                     "checksum mismatch in segment %" PRIu64 " at offset %" PRIu64
                     " (block %s, section %u)",
                     rec->segment, rec->offset + off, kv_hex16(hash, hx), s);
        goto out;
      }
    }
  for (size_t i = 0; i < n_pos; i++)
    if (positions[i] >= pos0 && positions[i] < pos0 + g->n_tokens)
      kv_scatter_token_layer(g, buf + g->meta_bytes, layer, (uint32_t)(positions[i] - pos0), out, i);
out:
  if (rc == KVDB_CORRUPT)
    db->corrupt_blocks++;
  kv_batch_end(db->io, bat);
  kv_segfile_put(db, sf);
  kv_rbuf_release(db, rb);
  free(rg);
  free(need);
  return rc;
}

kvdb_status kvdb_get_tokens(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                            uint32_t layer, const uint32_t *positions, size_t n_pos,
                            const kvdb_kv_view *out)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (context == NULL || positions == NULL || n_pos == 0)
    return kv_fail(KVDB_INVALID, "context or positions is NULL, or n_pos is 0");
  if (n_pos > UINT32_MAX) /* sizes below are n_pos times a few bytes */
    return kv_fail(KVDB_INVALID, "n_pos %zu is more than 2^32 - 1", n_pos);
  KV_RET(kv_check_view(out, m, "out"));
  KV_RET(kv_check_view_extent(out, m, n_pos, "out"));
  if (layer >= m->n_layers)
    return kv_fail(KVDB_INVALID, "layer %u out of range (model has %u layers)", layer,
                   m->n_layers);
  kv_read_snap s = {0};
again:;
  KV_RET(kv_read_begin(db, &s));
  kv_txn *txn = s.txn;
  kv_ctx_rec cr;
  uint8_t mh[16];
  kv_model_hash(m, bt, mh);
  kvdb_status rc = kv_ctx_of_model(db, txn, context->b, mh, m, &cr);
  for (size_t i = 0; rc == KVDB_OK && i < n_pos; i++)
    if (positions[i] >= cr.n_tokens)
      rc = kv_fail(KVDB_INVALID, "positions[%zu] = %u out of range (context has %" PRIu64
                   " tokens)", i, positions[i], cr.n_tokens);
  uint64_t pos0 = 0;
  for (uint32_t b = 0; rc == KVDB_OK && b < cr.n_blocks; b++) {
    const uint8_t *h = cr.blocks + 16 * b;
    kv_block_rec br;
    rc = kv_ctx_block(db, txn, context->b, h, &br);
    if (rc != KVDB_OK)
      break;
    int wanted = 0;
    for (size_t i = 0; i < n_pos && !wanted; i++)
      wanted = positions[i] >= pos0 && positions[i] < pos0 + br.n_tokens;
    if (wanted) {
      kv_block_geom g;
      rc = kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt, br.n_tokens);
      kv_rec_geom(&g, &br);
      if (rc == KVDB_OK)
        rc = tokens_from_block(db, &br, h, &g, layer, positions, n_pos, pos0, out);
    }
    pos0 += br.n_tokens;
  }
  if (rc == KVDB_OK)
    kv_note_access(db, context->b);
  kv_txn_abort(txn);
  if (kv_read_again(db, &s, rc != KVDB_OK))
    goto again; /* a compaction moved a block and removed its old file meanwhile */
  return rc;
}

kvdb_status kvdb_get_block(kvdb *db, const kvdb_model *m, const kvdb_key *key,
                           const uint32_t *expect_tokens, size_t n_tokens, const kvdb_kv_view *out,
                           size_t *out_tokens)
{
  uint32_t bt;
  if (out_tokens != NULL)
    *out_tokens = 0;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  KV_RET(kv_check_view(out, m, "out"));
  KV_RET(kv_check_view_extent(out, m, bt, "out"));
  if (key == NULL)
    return kv_fail(KVDB_INVALID, "key is NULL");
  if (expect_tokens != NULL && (n_tokens == 0 || n_tokens > bt))
    return kv_fail(KVDB_INVALID, "n_tokens %zu out of range 1..%u", n_tokens, bt);
  kvdb_key ck;
  KV_RET(kvdb_block_context(m, key, &ck));
  kv_read_snap s = {0};
again:;
  KV_RET(kv_read_begin(db, &s));
  kv_txn *txn = s.txn;
  kv_block_rec br;
  char hx[33];
  kvdb_status rc = model_stored(db, txn, m, bt);
  if (rc == KVDB_OK)
    rc = kv_cat_get_block(&db->cat, txn, ck.b, &br);
  if (rc == KVDB_NOTFOUND)
    rc = kv_fail(KVDB_NOTFOUND, "no block under key %s", kv_hex16(key->b, hx));
  if (rc == KVDB_OK && expect_tokens != NULL &&
      (br.n_tokens != n_tokens || memcmp(br.tokens, expect_tokens, 4 * n_tokens) != 0))
    rc = kv_fail(KVDB_NOTFOUND, "block under key %s holds other tokens (a miss)",
                 kv_hex16(key->b, hx));
  if (rc == KVDB_OK && (br.bflags & KV_BLK_DROPS))
    rc = kv_fail(KVDB_NOTFOUND, "block under key %s is stored with dropped tokens "
                                "(kvdb_get_context returns what is kept)",
                 kv_hex16(key->b, hx));
  kv_block_geom g;
  if (rc == KVDB_OK)
    rc = kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt, br.n_tokens);
  if (rc == KVDB_OK)
    kv_rec_geom(&g, &br);
  if (rc == KVDB_OK && !from_dram(db, &g, ck.b, br.n_tokens, out, 0, NULL, NULL, NULL)) {
    int comp = (br.bflags & KV_BLK_COMPRESSED) != 0;
    kv_rbuf *rb = kv_rbuf_acquire(db, br.bytes);
    kv_rbuf *db_ = comp ? kv_rbuf_acquire(db, g.data_bytes) : NULL;
    uint8_t *buf = rb != NULL ? rb->p : NULL;
    kv_block_hdr hdr;
    kv_cdec dec;
    memset(&dec, 0, sizeof dec);
    if (buf == NULL || (comp && db_ == NULL))
      rc = kv_fail(KVDB_NOMEM, "read buffer");
    else
      rc = kv_block_read_verify(db, &br, ck.b, buf, &hdr);
    const uint8_t *data = buf != NULL ? buf + g.meta_bytes : NULL;
    if (rc == KVDB_OK && comp) { /* decode it into a raw data region */
      rc = kv_cdec_init(&dec);
      if (rc == KVDB_OK)
        rc = kv_cblock_decode_data(&hdr, buf, 0, g.n_sections, &dec, db_->p);
      data = db_->p;
    }
    if (rc == KVDB_OK) {
      db->bytes_read += br.bytes;
      kv_scatter(&g, data, 0, br.n_tokens, out, 0);
      if (db->dram != NULL && kv_place_dram_admits(db, ck.b))
        kv_dram_insert(db->dram, ck.b, data, g.data_bytes);
    } else if (rc == KVDB_CORRUPT) {
      db->corrupt_blocks++;
    }
    kv_cdec_free(&dec);
    kv_rbuf_release(db, db_);
    kv_rbuf_release(db, rb);
  }
  if (rc == KVDB_OK) {
    if (out_tokens != NULL)
      *out_tokens = br.n_tokens;
    kv_note_access(db, ck.b);
  }
  kv_txn_abort(txn);
  if (kv_read_again(db, &s, rc != KVDB_OK))
    goto again; /* a compaction moved the block and removed its old file meanwhile */
  return rc;
}

/* ---- inspection ---- */

static kvdb_status fill_info(kvdb *db, kv_txn *txn, const uint8_t *key, const kv_ctx_rec *cr,
                             kvdb_context_info *out)
{
  memset(out, 0, sizeof *out);
  memcpy(out->key.b, key, 16);
  out->n_tokens = cr->n_tokens;
  out->n_blocks = cr->n_blocks;
  out->explicit_key = (cr->flags & KV_CTX_EXPLICIT) != 0;
  out->bytes = cr->bytes;
  out->created_unix_ms = cr->created_ms;
  out->last_access_unix_ms = cr->last_access_ms;
  out->tier = kv_ctx_tier(db, txn, cr);
  out->config = cr->config;
  kv_place_info(db, txn, key, cr->last_access_ms, &out->frequency, &out->cached);
  out->has_profile = kv_cat_has_profile(&db->cat, txn, key);
  kv_model_rec mr;
  if (kv_model_by_hash(db, txn, cr->model, out->model_id, &mr) != KVDB_OK)
    snprintf(out->model_id, sizeof out->model_id, "?");
  else
    out->score_bits = mr.score_bits;
  for (uint32_t i = 0; out->score_bits != 0 && i < cr->n_blocks; i++) {
    kv_block_rec br; /* which score copy versions its blocks carry */
    if (kv_cat_get_block(&db->cat, txn, cr->blocks + 16 * i, &br) == KVDB_OK &&
        kv_rec_score_bits(&br) != 0)
      out->score_versions |= kv_rec_score_variant(&br) ? 2u : 1u;
  }
  if (db->dram != NULL) {
    for (uint32_t i = 0; i < cr->n_blocks; i++) {
      const uint8_t *d;
      uint64_t l;
      kv_dram_entry *e = kv_dram_pin(db->dram, cr->blocks + 16 * i, &d, &l);
      if (e != NULL) {
        out->in_dram_blocks++;
        kv_dram_unpin(db->dram, e);
      }
    }
  }
  return KVDB_OK;
}

kvdb_status kvdb_context_stat(kvdb *db, const kvdb_key *context, kvdb_context_info *out)
{
  KV_RET(kv_check_db(db));
  if (context == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "context or out is NULL");
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_ctx_rec cr;
  kvdb_status rc = kv_cat_get_ctx(&db->cat, txn, context->b, &cr);
  if (rc == KVDB_NOTFOUND) {
    char hx[33];
    rc = kv_fail(KVDB_NOTFOUND, "no context %s", kv_hex16(context->b, hx));
  }
  if (rc == KVDB_OK)
    rc = fill_info(db, txn, context->b, &cr, out);
  kv_txn_abort(txn);
  return rc;
}

kvdb_status kvdb_model_get(kvdb *db, const char *id, kvdb_model *out)
{
  KV_RET(kv_check_db(db));
  if (id == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "id or out is NULL");
  KV_RET(kv_model_id_check(id));
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_model_rec mr;
  kvdb_status rc = kv_cat_get_model(&db->cat, txn, id, &mr);
  kv_txn_abort(txn);
  if (rc == KVDB_NOTFOUND)
    return kv_fail(KVDB_NOTFOUND, "no model '%s' in the database", id);
  if (rc != KVDB_OK)
    return rc;
  memset(out, 0, sizeof *out);
  out->id = id;
  out->n_layers = mr.n_layers;
  out->n_kv_heads = mr.n_kv_heads;
  out->head_dim = mr.head_dim;
  out->dtype = (kvdb_dtype)mr.dtype;
  out->block_tokens = mr.block_tokens;
  out->score_bits = mr.score_bits;
  out->rope_base = mr.rope_base;
  out->rope_style = mr.rope_style;
  return KVDB_OK;
}

struct kvdb_iter {
  kvdb *db;
  kv_txn *txn;
  kv_cat_iter ci; /* over the contexts table, in txn */
  int failed;     /* an earlier kvdb_iter_next failed reading the catalog */
};

kvdb_status kvdb_iter_open(kvdb *db, kvdb_iter **out)
{
  KV_RET(kv_check_db(db));
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  *out = NULL;
  kvdb_iter *it = calloc(1, sizeof *it);
  if (it == NULL)
    return kv_fail(KVDB_NOMEM, "iterator");
  it->db = db;
  kvdb_status rc = kv_txn_begin(&db->cat, 0, &it->txn);
  if (rc == KVDB_OK)
    rc = kv_cat_iter_open(&db->cat, it->txn, KV_TBL_CONTEXTS, &it->ci, "iterate contexts");
  if (rc != KVDB_OK) {
    kvdb_iter_close(it);
    return rc;
  }
  *out = it;
  return KVDB_OK;
}

kvdb_status kvdb_iter_next(kvdb_iter *it, kvdb_context_info *out)
{
  kv_clear_error();
  if (it == NULL || out == NULL)
    return kv_fail(KVDB_INVALID, "iterator or out is NULL");
  if (!kv_cat_iter_next(&it->ci)) {
    if (it->ci.err == KVDB_OK)
      return KVDB_NOTFOUND;
    if (it->failed++) /* the message went with the call that failed */
      return kv_fail(it->ci.err, "iterate contexts: the catalog failed earlier: %s",
                     kvdb_strerror(it->ci.err));
    return it->ci.err; /* (its message: kv_cat_iter_next) */
  }
  kv_ctx_rec cr;
  KV_RET(kv_cat_iter_ctx(&it->ci, &cr));
  return fill_info(it->db, it->txn, it->ci.key.data, &cr, out);
}

void kvdb_iter_close(kvdb_iter *it)
{
  if (it == NULL)
    return;
  kv_cat_iter_close(&it->ci); /* zeroed (calloc) when it was never opened */
  kv_txn_abort(it->txn);
  free(it);
}

/* kvdb_stat's catalog figures as of txn's snapshot: format, models, contexts, blocks. */
static void stat_tables(kvdb *db, kv_txn *txn, kvdb_stats *out)
{
  uint64_t ver = 0, n;
  kv_cat_get_u64(&db->cat, txn, "format", &ver);
  out->format_version = (uint32_t)ver;
  out->n_models = 0;
  out->n_contexts = out->n_blocks = 0;
  if (kv_cat_count(&db->cat, txn, KV_TBL_MODELS, &n) == KVDB_OK)
    out->n_models = (uint32_t)n;
  if (kv_cat_count(&db->cat, txn, KV_TBL_CONTEXTS, &n) == KVDB_OK)
    out->n_contexts = n;
  if (kv_cat_count(&db->cat, txn, KV_TBL_BLOCKS, &n) == KVDB_OK)
    out->n_blocks = n;
}

kvdb_status kvdb_stat(kvdb *db, kvdb_stats *out)
{
  KV_RET(kv_check_db(db));
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  memset(out, 0, sizeof *out);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  stat_tables(db, txn, out);
  /* the per-tier figures: the catalog's counters (counts.h), kept by every commit; counted
   * anew when a commit did not keep them (an older build wrote, or a change whose effect on
   * them is not known), and then stored by a read-write handle */
  kv_counts cnt;
  uint64_t snap = kv_txn_id(txn);
  kvdb_status rc = kv_counts_get(&db->cat, txn, &cnt);
  int counted = rc == KVDB_NOTFOUND;
  if (counted)
    rc = kv_counts_recount(&db->cat, txn, &cnt);
  kv_txn_abort(txn);
  if (rc == KVDB_OK && counted && !db->cat.rdonly && kv_txn_begin(&db->cat, 1, &txn) == KVDB_OK) {
    /* a commit this read did not see (another handle's; or one whose writer was killed
     * before it told readers, whose next writer is this): count again as of this
     * transaction, and report every figure as of it, so that they are one snapshot's and
     * equal what is stored */
    if (kv_txn_id(txn) != snap + 1) {
      kv_counts now;
      if (kv_counts_recount(&db->cat, txn, &now) == KVDB_OK) {
        cnt = now;
        stat_tables(db, txn, out);
      } else {
        kv_txn_abort(txn);
        txn = NULL;
      }
    }
    if (txn != NULL && kv_counts_put(&db->cat, txn, &cnt) == KVDB_OK)
      kv_txn_commit(txn);
    else
      kv_txn_abort(txn);
    kv_clear_error(); /* stored or not, the figures stand */
  }
  for (uint32_t t = 0; rc == KVDB_OK && t < KVDB_TIER_COUNT; t++) {
    out->n_segments += cnt.v[t][KV_CNT_SEGMENTS];
    out->segment_file_bytes += cnt.v[t][KV_CNT_SEG_BYTES];
    out->live_bytes += cnt.v[t][KV_CNT_LIVE_BYTES];
  }
  if (rc == KVDB_OK) {
    out->tier[KVDB_TIER_SMARTSSD].bytes = cnt.v[KVDB_TIER_SMARTSSD][KV_CNT_LIVE_BYTES];
    out->tier[KVDB_TIER_SMARTSSD].blocks = cnt.v[KVDB_TIER_SMARTSSD][KV_CNT_LIVE_BLOCKS];
  }
  uint64_t smart_contexts = rc == KVDB_OK ? cnt.v[KVDB_TIER_SMARTSSD][KV_CNT_CONTEXTS] : 0;
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/catalog.mdb", db->dir);
  if (stat(path, &st) == 0)
    out->catalog_bytes = (uint64_t)st.st_size;
  out->corrupt_blocks = db->corrupt_blocks;
  out->bytes_read = db->bytes_read;
  out->bytes_written = db->bytes_written;
  out->direct_io = db->direct;
  out->io_uring = db->os_io->uring;
  kvdb_tier_stats *ssd = &out->tier[KVDB_TIER_SSD], *smart = &out->tier[KVDB_TIER_SMARTSSD];
  ssd->capacity_bytes = db->opt.ssd_bytes;
  ssd->bytes = out->live_bytes - smart->bytes;
  ssd->blocks = out->n_blocks - (smart->blocks < out->n_blocks ? smart->blocks : out->n_blocks);
  ssd->contexts = out->n_contexts - smart_contexts;
  ssd->hits = db->ssd_hits;
  smart->capacity_bytes = db->opt.smartssd_bytes;
  smart->contexts = smart_contexts;
  smart->hits = db->smart_hits;
  if (db->dram != NULL) {
    kv_dram_stats ds;
    kv_dram_stat(db->dram, &ds);
    kvdb_tier_stats *t = &out->tier[KVDB_TIER_DRAM];
    t->capacity_bytes = ds.capacity;
    t->bytes = ds.bytes;
    t->blocks = ds.blocks;
    t->hits = ds.hits;
    t->misses = ds.misses;
  }
  return rc;
}
