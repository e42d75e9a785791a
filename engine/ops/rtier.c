/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/rtier.c — the remote tier's use by the operations (kvdb_options.remote_addr):
 * write-through of the blocks a put wrote (a bounded queue and a background thread per handle),
 * the remote continuation of a lookup or get's chain (one pipelined round trip), and the
 * verification of every value that comes back. engine/remote/ moves the bytes.
 *
 * A VALUE (FORMAT.md §6) is an envelope followed by the block object exactly as the local
 * store holds it (compressed, checksummed, score region included):
 *
 *    0  u32 magic 0x52564B4B ("KKVR")      4  u16 version 1     6  u16 header bytes (80)
 *    8  u32 n_tokens                      12  u32 block flags (KV_BLK_*)
 *   16  u8 method, bits, drop, 0          20  u16 keep_permille 22  u16 0
 *   24  u64 object bytes                  32  model fingerprint (16)
 *   48  parent hash (16)                  64  u64 XXH3-64 of the namespace
 *   72  u64 XXH3-64 of bytes [0, 72) and the tokens, seeded with the block hash's first 8 bytes
 *   80  the tokens (u32 each), then the object
 *
 * under the key "kvdb:" namespace ":" hex(model fingerprint) ":" hex(block hash). A lookup reads
 * [0, 80 + 4 * n_tokens) of each value (GETRANGE) and checks the envelope: magic, version, the
 * checksum, namespace, model, parent (the query's previous block), tokens (the query's). A get
 * reads the whole value and also checks the object with kv_block_check (header hash = the key's
 * block hash, meta, every page or group checksum, score region), its model and parent hashes
 * and the tokens it stores. Whatever fails is a miss and counted (`rejected`).
 *
 * Hash tags (kvdb_options.remote_hash_tag): by default none, a chain's blocks spread over the
 * slots and a Cluster lookup pipelines to every node at once. KVDB_REMOTE_TAG_ROOT tags a key
 * with its chain's first block (the one tag a block can carry: it belongs to every context
 * that shares its prefix, and those share their first block), so a chain is on one slot.
 * `kvdb-bench remote-tags` measured both (bench/RESULTS.md, "hash tags").
 *
 * Remote hits copied (kvdb_options.remote_copy_hits): a get keeps each verified object of its
 * remote part and hands them to the handle's thread, which stores them as they are
 * (kv_put_objects) under a context record for the prefix hit, then runs the placement after
 * a put (db->after_copy). The get waits for none of it.
 *
 * The placement's remote tier (engine/place): kv_rtier_figures measures the server (a probe
 * value SET, read back, deleted), kv_rtier_write_ctx writes a context the plan moves there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "catalog/catalog.h"
#include "ops_int.h"
#include "remote/remote.h"
#include "rtier_int.h"

#define RV_MAGIC 0x52564B4Bu
#define RV_VERSION 1u
#define RV_HDR 80u
#define RV_KEY_MAX 160u
#define RT_BATCH 16u            /* blocks per write-through round trip */
#define RT_BATCH_BYTES (64u << 20)
#define RT_COPY_BYTES (256ull << 20) /* remote-hit objects waiting to be copied locally */

/* A get's remote hit to copy to the local store (kvdb_options.remote_copy_hits): the chain of
 * tokens[0..n), block i's verified object objs[i] (NULL: one of the local hit's blocks). */
typedef struct copy_job {
  struct copy_job *next;
  kvdb_model m;
  char id[64];
  uint32_t bt;
  uint8_t mh[16];
  uint32_t *tokens;
  size_t n;
  uint32_t nb, n_objs;
  uint8_t **objs;
  kv_block_rec *recs;
  uint64_t bytes;
} copy_job;

static void job_free(copy_job *j)
{
  if (j == NULL)
    return;
  for (uint32_t i = 0; j->objs != NULL && i < j->nb; i++)
    free(j->objs[i]);
  free(j->objs);
  free(j->recs);
  free(j->tokens);
  free(j);
}


static uint64_t rt_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The key of block h, whose chain starts with block `root` (KVDB_REMOTE_TAG_ROOT: a hash tag
 * of the root's first 8 bytes, so a chain's blocks share one Cluster slot). */
static size_t rt_key(const struct kv_rtier *t, const uint8_t mh[16], const uint8_t root[16],
                     const uint8_t h[16], char *buf)
{
  char a[33], b[33], r[33];
  if (t->tag) {
    kv_hex16(root, r);
    r[16] = 0;
    return (size_t)snprintf(buf, RV_KEY_MAX, "kvdb:%s:%s:{%s}:%s", t->ns, kv_hex16(mh, a), r,
                            kv_hex16(h, b));
  }
  return (size_t)snprintf(buf, RV_KEY_MAX, "kvdb:%s:%s:%s", t->ns, kv_hex16(mh, a),
                          kv_hex16(h, b));
}

static uint64_t head_sum(const uint8_t *env, const uint8_t hash[16], uint32_t n_tok)
{
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, kv_get_le64(hash));
  XXH3_64bits_update(&st, env, 72);
  XXH3_64bits_update(&st, env + RV_HDR, 4 * (size_t)n_tok);
  return XXH3_64bits_digest(&st);
}

/* ---- write-through ---- */

/* Fill the envelope at env for block `hash` (its record rec, tokens from it). */
static void envelope(uint64_t ns_tag, const kv_block_rec *rec, const uint8_t hash[16],
                     uint8_t *env)
{
  memset(env, 0, RV_HDR);
  kv_put_le32(env, RV_MAGIC);
  kv_put_le16(env + 4, RV_VERSION);
  kv_put_le16(env + 6, RV_HDR);
  kv_put_le32(env + 8, rec->n_tokens);
  kv_put_le32(env + 12, rec->bflags);
  env[16] = rec->method;
  env[17] = rec->bits;
  env[18] = rec->drop;
  kv_put_le16(env + 20, rec->keep_permille);
  kv_put_le64(env + 24, rec->bytes);
  memcpy(env + 32, rec->model, 16);
  memcpy(env + 48, rec->parent, 16);
  kv_put_le64(env + 64, ns_tag);
  memcpy(env + RV_HDR, rec->tokens, 4 * (size_t)rec->n_tokens);
  kv_put_le64(env + 72, head_sum(env, hash, rec->n_tokens));
}

typedef struct wblk {
  uint8_t *mem;   /* aligned allocation: envelope ends where the object begins (a page) */
  uint8_t *val;
  size_t vlen;
  char key[RV_KEY_MAX];
  size_t klen;
} wblk;

/* Read block `hash` from the local store into a value; 0, or -1 when it cannot (gone,
 * corrupt: not sent, counted as dropped). */
static int build_value(kvdb *db, struct kv_rtier *t, const uint8_t hash[16],
                       const uint8_t root[16], wblk *w)
{
  kv_txn *txn;
  if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK)
    return -1;
  kv_block_rec rec;
  int rc = -1;
  if (kv_cat_get_block(&db->cat, txn, hash, &rec) == KVDB_OK && rec.bytes > 0 &&
      rec.bytes < (1ull << 34)) {
    size_t env = RV_HDR + 4 * (size_t)rec.n_tokens;
    size_t pad = (env + KV_PAGE - 1) / KV_PAGE * KV_PAGE;
    w->mem = kv_alloc_aligned(pad + rec.bytes);
    if (w->mem != NULL) {
      w->val = w->mem + pad - env;
      w->vlen = env + rec.bytes;
      envelope(t->ns_tag, &rec, hash, w->val);
      w->klen = rt_key(t, rec.model, root, hash, w->key);
      rc = 0;
    }
  }
  kv_block_rec copy = rec; /* the location, read outside the transaction */
  kv_txn_abort(txn);
  if (rc != 0)
    return -1;
  kv_block_hdr hdr;
  if (kv_block_read_verify(db, &copy, hash, w->mem + (w->val - w->mem) + RV_HDR +
                                                4 * (size_t)copy.n_tokens, &hdr) != KVDB_OK) {
    kv_log(&db->log, 2, "remote tier: not written through: %s", kvdb_errmsg());
    kv_free_aligned(w->mem);
    w->mem = NULL;
    return -1;
  }
  return 0;
}

/* Send up to RT_BATCH queued blocks (one round trip); the queue lock is not held. hs[i]:
 * the block's hash, then its chain's root's. Returns the blocks Redis took. */
static uint32_t send_batch(kvdb *db, struct kv_rtier *t, uint8_t (*hs)[32], uint32_t n)
{
  uint32_t took = 0;
  wblk w[RT_BATCH];
  kv_rcmd c[RT_BATCH];
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    memset(&w[k], 0, sizeof w[k]);
    if (build_value(db, t, hs[i], hs[i] + 16, &w[k]) != 0) {
      t->dropped++;
      continue;
    }
    memset(&c[k], 0, sizeof c[k]);
    c[k].op = KV_RCMD_SET;
    c[k].key = w[k].key;
    c[k].klen = w[k].klen;
    c[k].val = w[k].val;
    c[k].vlen = w[k].vlen;
    k++;
  }
  if (k > 0 && kv_remote_exec(t->r, c, k) == KVDB_OK) {
    for (uint32_t i = 0; i < k; i++) {
      if (c[i].status == KV_RCMD_OK) {
        t->written++;
        took++;
      } else {
        t->dropped++;
      }
    }
    kv_remote_release(c, k);
  } else {
    t->dropped += k;
  }
  for (uint32_t i = 0; i < k; i++)
    kv_free_aligned(w[i].mem);
  return took;
}

/* Store copy j locally (the worker's thread), then what follows a put (the placement). */
static void run_copy(kvdb *db, struct kv_rtier *t, copy_job *j)
{
  kvdb_put_info info;
  memset(&info, 0, sizeof info);
  uint8_t ctx[16];
  kvdb_status rc = kv_put_objects(db, &j->m, j->bt, j->mh, j->tokens, j->n,
                                  (const uint8_t *const *)j->objs, j->recs, &info, ctx);
  if (rc != KVDB_OK) {
    t->copy_failed += j->n_objs;
    kv_log(&db->log, 1, "remote tier: a remote hit of %u blocks was not copied to the local "
           "store: %s", j->n_objs, kvdb_errmsg());
    kv_clear_error();
    return;
  }
  t->copied += info.blocks_written;
  if (db->after_copy != NULL)
    db->after_copy(db, ctx);
  kv_clear_error();
}

static void *worker(void *arg)
{
  kvdb *db = arg;
  struct kv_rtier *t = db->rtier;
  uint8_t hs[RT_BATCH][32];
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (t->len == 0 && t->jh == NULL && !t->stop)
      pthread_cond_wait(&t->more, &t->mu);
    if (t->jh != NULL) { /* a copy first: the get that made it wants it local soon */
      copy_job *j = t->jh;
      t->jh = j->next;
      if (t->jh == NULL)
        t->jt = NULL;
      t->busy = 1;
      pthread_mutex_unlock(&t->mu);
      run_copy(db, t, j);
      pthread_mutex_lock(&t->mu);
      t->job_bytes -= j->bytes;
      t->busy = 0;
      job_free(j);
      if (t->len == 0 && t->jh == NULL)
        pthread_cond_broadcast(&t->idle);
      continue;
    }
    if (t->len == 0 && t->stop)
      break;
    uint32_t n = t->len < RT_BATCH ? t->len : RT_BATCH;
    for (uint32_t i = 0; i < n; i++)
      memcpy(hs[i], t->q[(t->head + i) % t->cap], 32);
    t->head = (t->head + n) % t->cap;
    t->len -= n;
    t->busy = 1;
    pthread_cond_broadcast(&t->room);
    pthread_mutex_unlock(&t->mu);
    send_batch(db, t, hs, n);
    pthread_mutex_lock(&t->mu);
    t->busy = 0;
    if (t->len == 0)
      pthread_cond_broadcast(&t->idle);
  }
  t->busy = 0;
  pthread_cond_broadcast(&t->idle);
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* ---- the remote part of a chain ---- */

/* Check the envelope of value v (len bytes at least RV_HDR + 4 n) for block j of the query. */
static int env_ok(uint64_t ns_tag, const uint8_t *v, size_t len, const uint8_t mh[16],
                  const uint8_t parent[16], const uint8_t hash[16], const uint32_t *tok,
                  uint32_t n_tok, int whole)
{
  if (len < RV_HDR || kv_get_le32(v) != RV_MAGIC || kv_get_le16(v + 4) != RV_VERSION ||
      kv_get_le16(v + 6) != RV_HDR || kv_get_le32(v + 8) != n_tok)
    return 0;
  if (len < RV_HDR + 4 * (size_t)n_tok)
    return 0;
  if (kv_get_le64(v + 72) != head_sum(v, hash, n_tok) || kv_get_le64(v + 64) != ns_tag ||
      memcmp(v + 32, mh, 16) != 0 || memcmp(v + 48, parent, 16) != 0)
    return 0;
  for (uint32_t i = 0; i < n_tok; i++)
    if (kv_get_le32(v + RV_HDR + 4 * i) != tok[i])
      return 0;
  if (whole && len != RV_HDR + 4 * (size_t)n_tok + kv_get_le64(v + 24))
    return 0;
  if (kv_get_le32(v + 12) & KV_BLK_DROPS)
    return 0; /* a block stored without some tokens: not a prefix a get can deliver */
  return 1;
}

/* Verify the object of value v for block `hash` and copy its tokens into out at t0; 0 or -1. */
static int deliver(kvdb *db, const kvdb_model *m, uint32_t bt, const uint8_t *v,
                   const uint8_t hash[16], const uint8_t mh[16], const uint8_t parent[16],
                   const uint32_t *tok, uint32_t n_tok, const kvdb_kv_view *out, uint64_t t0,
                   kv_cdec *dec, kv_rbuf **dbuf, kv_rbuf **obuf)
{
  kv_block_rec rec;
  memset(&rec, 0, sizeof rec);
  rec.n_tokens = n_tok;
  rec.bflags = kv_get_le32(v + 12);
  rec.method = v[16];
  rec.bits = v[17];
  rec.drop = v[18];
  rec.keep_permille = kv_get_le16(v + 20);
  rec.bytes = kv_get_le64(v + 24);
  const uint8_t *obj = v + RV_HDR + 4 * (size_t)n_tok;
  kv_block_geom g;
  if (kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt, n_tok) !=
      KVDB_OK)
    return -1;
  kv_rec_geom(&g, &rec); /* a packed raw object (FORMAT.md §3e); compressed: §3f */
  uint64_t raw = (uint64_t)g.meta_bytes + g.data_bytes;
  if (g.packed && (rec.bytes != raw || rec.bflags != KV_BLK_PACKED))
    return -1;
  if ((rec.bflags & KV_BLK_PACKED) && (rec.bflags & (KV_BLK_SCORE8 | KV_BLK_SCORE4)))
    return -1; /* packed compressed (FORMAT.md §3f): never with score copies */
  if (rec.bytes == 0 || rec.bytes % (kv_rec_packed(&rec) ? KV_BLOCK_PACK_ALIGN : KV_PAGE) != 0 ||
      rec.bytes > 2 * raw + (uint64_t)g.n_sections * KV_PAGE +
                      kv_score_region_bytes(&g, kv_rec_score_bits(&rec), kv_rec_score_variant(&rec)))
    return -1;
  /* a full block's object starts 16-byte aligned in the reply (malloc'd; envelope 80 + 64k
   * bytes); a partial block's may not: copied, as the decoders read u16 and u32 fields */
  if (((uintptr_t)obj & 15) != 0) {
    if (*obuf == NULL || (*obuf)->cap < rec.bytes) {
      kv_rbuf_release(db, *obuf);
      if ((*obuf = kv_rbuf_acquire(db, rec.bytes)) == NULL)
        return -1;
    }
    memcpy((*obuf)->p, obj, rec.bytes);
    obj = (*obuf)->p;
  }
  /* kv_block_check's checks, the sections' checksums one layer at a time, each layer
   * scattered right after its check while its bytes are in cache (the local get's order:
   * engine/ops/get.c); a failure part-way leaves verified rows past the hit only */
  kv_block_hdr hdr;
  if (kv_block_check_meta(&rec, hash, obj, &hdr) != KVDB_OK ||
      memcmp(hdr.model_hash, mh, 16) != 0 || memcmp(hdr.parent_hash, parent, 16) != 0 ||
      kv_score_region_check(&rec, hash, &hdr, obj) != KVDB_OK)
    return -1;
  for (uint32_t i = 0; i < n_tok; i++)
    if (kv_get_le32(obj + KV_BLOCK_HDR_BYTES + 4 * i) != tok[i])
      return -1;
  const uint8_t *data = obj + g.meta_bytes;
  if (KV_HDR_CPR(&hdr)) {
    if (*dbuf == NULL && (*dbuf = kv_rbuf_acquire(db, g.data_bytes)) == NULL)
      return -1;
    if ((*dbuf)->cap < g.data_bytes) {
      kv_rbuf_release(db, *dbuf);
      if ((*dbuf = kv_rbuf_acquire(db, g.data_bytes)) == NULL)
        return -1;
    }
    if (dec->ctx == NULL && kv_cdec_init(dec) != KVDB_OK)
      return -1;
    data = (*dbuf)->p;
  }
  uint32_t per_layer = 2 * g.n_kv_heads;
  int stream = kv_scatter_streams(&g, n_tok);
  for (uint32_t l = 0; l < g.n_layers; l++) {
    uint32_t s0 = l * per_layer;
    if (kv_block_check_sections(&rec, hash, &hdr, obj, s0, s0 + per_layer) != KVDB_OK)
      return -1;
    if (KV_HDR_FRAMES(&hdr)) /* lossless frames: decoded together once all are verified */
      continue;
    if ((hdr.codec == KV_CODEC_SECTIONS) &&
        kv_cblock_decode_data(&hdr, obj, s0, s0 + per_layer, dec, (uint8_t *)data) != KVDB_OK)
      return -1;
    kv_scatter_sections(&g, data, s0, s0 + per_layer, 0, n_tok, out, t0, stream);
  }
  if (KV_HDR_FRAMES(&hdr)) {
    if (kv_cblock_decode_data(&hdr, obj, 0, g.n_sections, dec, (uint8_t *)data) != KVDB_OK)
      return -1;
    kv_scatter_sections(&g, data, 0, g.n_sections, 0, n_tok, out, t0, stream);
  }
  return 0;
}

/* The state of one remote continuation: replies are taken in chain order as they arrive
 * (kv_remote_exec's callback), so each value is verified and copied while the next ones are
 * still on their way. */
typedef struct chain {
  kvdb *db;
  struct kv_rtier *t;
  const kvdb_model *m;
  uint32_t bt;
  const uint32_t *tokens;
  size_t n, s, nb;
  uint8_t (*h)[16];
  kv_rcmd *c;
  uint8_t *arrived;
  const kvdb_kv_view *out;
  size_t next;  /* the next block (index from s) to take */
  int stopped;  /* the chain ended (a miss or a rejected value) */
  size_t got;   /* tokens hit so far */
  kv_cdec dec;
  kv_rbuf *dbuf, *obuf;
  copy_job *job; /* remote_copy_hits: the verified objects kept for the local store */
} chain;

/* Keep a copy of block i's verified object (value v of a block of nt tokens) for the copy
 * to the local store; past the copy queue's room, the copy is given up (counted). */
static void keep_object(chain *ch, size_t i, const uint8_t *v, uint32_t nt)
{
  copy_job *j = ch->job;
  if (j == NULL)
    return;
  uint64_t bytes = kv_get_le64(v + 24);
  uint8_t *o = j->bytes + bytes <= RT_COPY_BYTES ? malloc(bytes) : NULL;
  if (o == NULL) {
    ch->t->copy_failed += 1 + j->n_objs; /* this block and those kept: the copy is off */
    job_free(j);
    ch->job = NULL;
    return;
  }
  memcpy(o, v + RV_HDR + 4 * (size_t)nt, bytes);
  j->objs[i] = o;
  kv_block_rec *r = &j->recs[i];
  r->bytes = bytes;
  r->bflags = kv_get_le32(v + 12);
  r->method = v[16];
  r->bits = v[17];
  r->drop = v[18];
  r->keep_permille = kv_get_le16(v + 20);
  j->bytes += bytes;
  j->n_objs++;
}

/* A new copy job for a get's remote part (NULL when copies are off or memory is short). */
static copy_job *job_new(const struct kv_rtier *t, const kvdb_model *m, uint32_t bt,
                         const uint8_t mh[16], size_t nb)
{
  if (!t->copy || !t->has_thread || m->id == NULL || strlen(m->id) > 63)
    return NULL;
  copy_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return NULL;
  j->objs = calloc(nb, sizeof *j->objs);
  j->recs = calloc(nb, sizeof *j->recs);
  if (j->objs == NULL || j->recs == NULL) {
    job_free(j);
    return NULL;
  }
  j->nb = (uint32_t)nb;
  j->m = *m;
  strcpy(j->id, m->id);
  j->m.id = j->id;
  j->bt = bt;
  memcpy(j->mh, mh, 16);
  return j;
}

/* Hand a get's copy job (its remote blocks up to got tokens) to the worker, or give it up. */
static void job_queue(struct kv_rtier *t, copy_job *j, const uint32_t *tokens, size_t got)
{
  if (j == NULL)
    return;
  if (j->n_objs == 0) {
    job_free(j);
    return;
  }
  j->n = got;
  j->tokens = malloc(got * sizeof *tokens);
  pthread_mutex_lock(&t->mu);
  int ok = j->tokens != NULL && !t->stop && t->job_bytes + j->bytes <= RT_COPY_BYTES;
  if (ok) {
    memcpy(j->tokens, tokens, got * sizeof *tokens);
    j->next = NULL;
    if (t->jt != NULL)
      t->jt->next = j;
    else
      t->jh = j;
    t->jt = j;
    t->job_bytes += j->bytes;
    pthread_cond_signal(&t->more);
  }
  pthread_mutex_unlock(&t->mu);
  if (!ok) {
    t->copy_failed += j->n_objs;
    job_free(j);
  }
}

/* Take block s + k of the chain (its reply final): a hit extends ch->got, else the chain ends. */
static void take_block(chain *ch, size_t k)
{
  kv_rcmd *x = &ch->c[k];
  size_t i = ch->s + k, t0 = i * ch->bt;
  uint32_t nt = (uint32_t)(t0 + ch->bt <= ch->n ? ch->bt : ch->n - t0);
  if (ch->stopped) {
    kv_remote_release(x, 1);
    return;
  }
  if (x->status != KV_RCMD_OK || x->len == 0) { /* GETRANGE of no key is "" */
    ch->t->misses++;
    ch->stopped = 1;
  } else if (!env_ok(ch->t->ns_tag, x->data, x->len, ch->h[0], ch->h[i], ch->h[i + 1],
                     ch->tokens + t0, nt, ch->out != NULL) ||
             (ch->out != NULL &&
              deliver(ch->db, ch->m, ch->bt, x->data, ch->h[i + 1], ch->h[0], ch->h[i],
                      ch->tokens + t0, nt, ch->out, t0, &ch->dec, &ch->dbuf, &ch->obuf) != 0)) {
    ch->t->rejected++;
    ch->stopped = 1;
    char hx[33];
    kv_log(&ch->db->log, 1, "remote tier: the value of block %s failed verification: a miss",
           kv_hex16(ch->h[i + 1], hx));
  } else {
    ch->t->hits++;
    ch->got = t0 + nt;
    keep_object(ch, i, x->data, nt);
  }
  kv_remote_release(x, 1); /* its memory back at once */
}

static void on_reply(void *ctx, size_t k)
{
  chain *ch = ctx;
  ch->arrived[k] = 1;
  while (ch->next < ch->nb - ch->s && ch->arrived[ch->next])
    take_block(ch, ch->next++);
}

size_t kv_rtier_extend(kvdb *db, const kvdb_model *m, uint32_t bt, const uint32_t *tokens,
                       size_t n, size_t have, const kvdb_kv_view *out)
{
  struct kv_rtier *t = db->rtier;
  if (t == NULL || have >= n)
    return have;
  size_t nb = (n + bt - 1) / bt, s = have / bt;
  if (s >= nb)
    return have;
  chain ch;
  memset(&ch, 0, sizeof ch);
  ch.db = db;
  ch.t = t;
  ch.m = m;
  ch.bt = bt;
  ch.tokens = tokens;
  ch.n = n;
  ch.s = s;
  ch.nb = nb;
  ch.out = out;
  ch.got = have;
  ch.h = malloc((nb + 1) * 16);
  char(*keys)[RV_KEY_MAX] = malloc((nb - s) * RV_KEY_MAX);
  ch.c = calloc(nb - s, sizeof *ch.c);
  ch.arrived = calloc(nb - s, 1);
  if (ch.h != NULL && keys != NULL && ch.c != NULL && ch.arrived != NULL) {
    /* h[0] = h_{-1} (the model fingerprint), h[i + 1] = block i's chained hash */
    kv_model_hash(m, bt, ch.h[0]);
    for (size_t i = 0; i < nb; i++) {
      size_t t0 = i * bt, nt = t0 + bt <= n ? bt : n - t0;
      kv_chain_hash(ch.h[i], tokens + t0, nt, ch.h[i + 1]);
    }
    if (out != NULL)
      ch.job = job_new(t, m, bt, ch.h[0], nb);
    for (size_t i = s; i < nb; i++) {
      kv_rcmd *x = &ch.c[i - s];
      size_t nt = i * bt + bt <= n ? bt : n - i * bt;
      x->op = out != NULL ? KV_RCMD_GET : KV_RCMD_GETRANGE;
      x->range_end = (int64_t)(RV_HDR + 4 * nt) - 1;
      x->key = keys[i - s];
      x->klen = rt_key(t, ch.h[0], ch.h[1], ch.h[i + 1], keys[i - s]);
    }
    if (kv_remote_exec_cb(t->r, ch.c, nb - s, on_reply, &ch) == KVDB_OK)
      while (ch.next < nb - s) /* replies the callback did not see (a node down) */
        take_block(&ch, ch.next++);
    kv_remote_release(ch.c, nb - s);
    if (ch.got > have) /* the blocks after got (a rejected value's successors) are not kept */
      job_queue(t, ch.job, tokens, ch.got);
    else
      job_free(ch.job);
    ch.job = NULL;
  }
  job_free(ch.job);
  kv_rbuf_release(db, ch.dbuf);
  kv_rbuf_release(db, ch.obuf);
  kv_cdec_free(&ch.dec);
  free(ch.h);
  free(keys);
  free(ch.c);
  free(ch.arrived);
  kv_clear_error();
  return ch.got > have ? ch.got : have;
}

/* ---- write-back on eviction ---- */

/* Write context `key`'s blocks (read back from the local store, verified) in round trips of
 * RT_BATCH; *n_blocks its blocks. Returns the blocks Redis took. */
static uint32_t write_ctx(kvdb *db, struct kv_rtier *t, const uint8_t key[16], uint32_t *n_blocks)
{
  *n_blocks = 0;
  kv_txn *txn;
  if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK) {
    kv_clear_error();
    return 0;
  }
  kv_ctx_rec cr;
  uint8_t(*hs)[32] = NULL;
  uint32_t n = 0;
  if (kv_cat_get_ctx(&db->cat, txn, key, &cr) == KVDB_OK && cr.n_blocks > 0 &&
      (hs = malloc((size_t)cr.n_blocks * 32)) != NULL) {
    n = cr.n_blocks;
    for (uint32_t i = 0; i < n; i++) {
      memcpy(hs[i], cr.blocks + 16 * (size_t)i, 16);
      memcpy(hs[i] + 16, cr.blocks, 16); /* the context's first block: its chain's root */
    }
  }
  kv_txn_abort(txn); /* its blocks stay until the caller's delete, which follows this */
  uint32_t took = 0;
  for (uint32_t i = 0; i < n; i += RT_BATCH) {
    uint32_t m = n - i < RT_BATCH ? n - i : RT_BATCH;
    t->queued += m;
    took += send_batch(db, t, hs + i, m);
  }
  free(hs);
  kv_clear_error();
  *n_blocks = n;
  return took;
}

void kv_rtier_note_evict(kvdb *db, const uint8_t key[16])
{
  struct kv_rtier *t = db->rtier;
  uint32_t n;
  if (t != NULL && t->cap > 0 && t->on_evict)
    (void)write_ctx(db, t, key, &n);
}

int kv_rtier_write_ctx(kvdb *db, const uint8_t key[16], uint32_t *n_blocks, uint32_t *written)
{
  struct kv_rtier *t = db->rtier;
  *n_blocks = *written = 0;
  if (t == NULL || t->cap == 0)
    return -1;
  *written = write_ctx(db, t, key, n_blocks);
  return 0;
}

/* ---- the remote tier's figures (the placement's model) ---- */

#define RT_PROBE_BYTES (4u << 20) /* the value GET back for the bandwidth */
#define RT_PROBE_LAT 5u           /* 1-byte GETRANGEs for the latency (the median) */
#define RT_PROBE_BW 3u            /* GETs of the value (the fastest) */
#define RT_PROBE_AGAIN_MS 30000u  /* figures older than this are measured again */
#define RT_PROBE_RETRY_MS 5000u   /* after a failed probe */

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* One round trip of command c alone: its time in ns, or 0 when it failed. */
static uint64_t timed(kv_remote *r, kv_rcmd *c, size_t want_len)
{
  uint64_t t0 = rt_now_ns();
  kvdb_status rc = kv_remote_exec(r, c, 1);
  uint64_t ns = rt_now_ns() - t0;
  int ok = rc == KVDB_OK && c->status == KV_RCMD_OK && (want_len == 0 || c->len == want_len);
  kv_remote_release(c, 1);
  return ok ? (ns > 0 ? ns : 1) : 0;
}

/* Measure the server as the placement reads it: a value of RT_PROBE_BYTES under a key of this
 * handle's namespace, SET, read back whole (bandwidth) and one byte at a time (latency), then
 * deleted. 0, or -1 when the server did not answer. */
static int probe(struct kv_rtier *t, kv_tier_perf *f)
{
  char key[RV_KEY_MAX];
  static _Atomic unsigned seq;
  size_t kl = (size_t)snprintf(key, sizeof key, "kvdb:%s:probe:%ld-%u", t->ns, (long)getpid(),
                               seq++);
  uint8_t *v = malloc(RT_PROBE_BYTES);
  if (v == NULL)
    return -1;
  uint64_t x = 0x9e3779b97f4a7c15ull ^ rt_now_ns(); /* incompressible: no shortcut anywhere */
  for (size_t i = 0; i < RT_PROBE_BYTES / 8; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(v + 8 * i, &x, 8);
  }
  kv_rcmd c;
  memset(&c, 0, sizeof c);
  c.op = KV_RCMD_SET;
  c.key = key;
  c.klen = kl;
  c.val = v;
  c.vlen = RT_PROBE_BYTES;
  int ok = timed(t->r, &c, 0) != 0;
  free(v);
  uint64_t lat[RT_PROBE_LAT], best = UINT64_MAX;
  for (unsigned i = 0; ok && i < RT_PROBE_LAT; i++) {
    memset(&c, 0, sizeof c);
    c.op = KV_RCMD_GETRANGE;
    c.key = key;
    c.klen = kl;
    c.range_end = 0;
    ok = (lat[i] = timed(t->r, &c, 1)) != 0;
  }
  for (unsigned i = 0; ok && i < RT_PROBE_BW; i++) {
    memset(&c, 0, sizeof c);
    c.op = KV_RCMD_GET;
    c.key = key;
    c.klen = kl;
    uint64_t ns = timed(t->r, &c, RT_PROBE_BYTES);
    ok = ns != 0;
    best = ns < best ? ns : best;
  }
  memset(&c, 0, sizeof c);
  c.op = KV_RCMD_DEL;
  c.key = key;
  c.klen = kl;
  (void)timed(t->r, &c, 0);
  if (!ok)
    return -1;
  qsort(lat, RT_PROBE_LAT, sizeof lat[0], cmp_u64);
  uint64_t l = lat[RT_PROBE_LAT / 2];
  uint64_t xfer = best > 2 * l ? best - l : best / 2; /* the part that grows with the bytes */
  f->latency_s = (double)l * 1e-9;
  f->read_bps = (double)RT_PROBE_BYTES / ((double)xfer * 1e-9);
  return 0;
}

int kv_rtier_figures(kvdb *db, kv_tier_perf *out)
{
  struct kv_rtier *t = db->rtier;
  if (t == NULL)
    return -1;
  pthread_mutex_lock(&t->fmu);
  uint64_t now = kv_now_ms();
  uint64_t again = t->perf_ok ? RT_PROBE_AGAIN_MS : RT_PROBE_RETRY_MS;
  if (t->probed_ms == 0 || now - t->probed_ms >= again) {
    kv_tier_perf f;
    t->perf_ok = probe(t, &f) == 0;
    if (t->perf_ok)
      t->perf = f;
    t->probed_ms = now;
    kv_log(&db->log, 2, "remote tier: %s (%.3g GB/s, %.3g us)",
           t->perf_ok ? "measured" : "did not answer the probe: not in the placement",
           t->perf.read_bps / 1e9, t->perf.latency_s * 1e6);
  }
  int ok = t->perf_ok;
  if (ok)
    *out = t->perf;
  pthread_mutex_unlock(&t->fmu);
  kv_clear_error();
  return ok ? 0 : -1;
}

/* ---- one value alone (tests, fuzz_rtier_value) ---- */

kvdb_status kv_rtier_value_make(kvdb *db, uint64_t ns_tag, const uint8_t hash[16],
                                uint8_t **val, size_t *len)
{
  struct kv_rtier t;
  memset(&t, 0, sizeof t);
  t.ns_tag = ns_tag;
  wblk w;
  memset(&w, 0, sizeof w);
  *val = NULL;
  *len = 0;
  if (build_value(db, &t, hash, hash, &w) != 0) {
    char hx[33];
    return kv_fail(KVDB_NOTFOUND, "remote value: block %s cannot be read into a value",
                   kv_hex16(hash, hx));
  }
  *val = malloc(w.vlen);
  if (*val == NULL) {
    kv_free_aligned(w.mem);
    return kv_fail(KVDB_NOMEM, "remote value: out of memory (%zu bytes)", w.vlen);
  }
  memcpy(*val, w.val, w.vlen);
  *len = w.vlen;
  kv_free_aligned(w.mem);
  return KVDB_OK;
}

int kv_rtier_value_take(kvdb *db, const kvdb_model *m, uint32_t bt, uint64_t ns_tag,
                        const uint8_t *v, size_t len, const uint8_t mh[16],
                        const uint8_t parent[16], const uint8_t hash[16], const uint32_t *tok,
                        uint32_t n_tok, const kvdb_kv_view *out, uint64_t t0)
{
  if (!env_ok(ns_tag, v, len, mh, parent, hash, tok, n_tok, 1))
    return -1;
  kv_cdec dec;
  memset(&dec, 0, sizeof dec);
  kv_rbuf *dbuf = NULL, *obuf = NULL;
  int rc = deliver(db, m, bt, v, hash, mh, parent, tok, n_tok, out, t0, &dec, &dbuf, &obuf);
  kv_rbuf_release(db, dbuf);
  kv_rbuf_release(db, obuf);
  kv_cdec_free(&dec);
  return rc;
}

/* ---- open, close, stats ---- */

kvdb_status kv_rtier_open(kvdb *db)
{
  const kvdb_options *o = &db->opt;
  if (o->remote_addr == NULL)
    return KVDB_OK;
  const char *ns = o->remote_namespace ? o->remote_namespace : "";
  size_t nl = strlen(ns);
  if (nl > 63)
    return kv_fail(KVDB_INVALID, "options.remote_namespace is %zu bytes (at most 63)", nl);
  for (size_t i = 0; i < nl; i++) {
    char ch = ns[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '.' || ch == '_' || ch == '-'))
      return kv_fail(KVDB_INVALID, "options.remote_namespace '%s': byte %zu is not one of "
                     "[A-Za-z0-9._-]", ns, i);
  }
  if (o->remote_put_wait_ms > 10000)
    return kv_fail(KVDB_INVALID, "options.remote_put_wait_ms %u is above 10000",
                   o->remote_put_wait_ms);
  struct kv_rtier *t = calloc(1, sizeof *t);
  if (t == NULL)
    return kv_fail(KVDB_NOMEM, "remote tier");
  kvdb_status rc = kv_remote_open(o->remote_addr, o->remote_timeout_ms, &db->log, &t->r);
  if (rc != KVDB_OK) {
    free(t);
    return rc;
  }
  kv_remote_set_poll(t->r, o->remote_poll_us);
  memcpy(t->ns, ns, nl + 1);
  t->ns_tag = XXH3_64bits(ns, nl);
  pthread_mutex_init(&t->mu, NULL);
  pthread_mutex_init(&t->fmu, NULL);
  pthread_cond_init(&t->more, NULL);
  pthread_cond_init(&t->room, NULL);
  pthread_cond_init(&t->idle, NULL);
  t->cap = db->cat.rdonly ? 0 : o->remote_queue_blocks;
  t->on_put = o->remote_write == 0 || (o->remote_write & KVDB_REMOTE_WRITE_PUT) != 0;
  t->on_evict = (o->remote_write & KVDB_REMOTE_WRITE_EVICT) != 0;
  t->copy = t->cap > 0 && o->remote_copy_hits != 0;
  t->tag = o->remote_hash_tag == KVDB_REMOTE_TAG_ROOT;
  db->rtier = t;
  if (t->cap > 0) {
    t->q = malloc((size_t)t->cap * 32);
    if (t->q == NULL || pthread_create(&t->th, NULL, worker, db) != 0) {
      kv_rtier_close(db);
      return kv_fail(KVDB_NOMEM, "remote tier: queue of %u blocks or its thread", o->remote_queue_blocks);
    }
    t->has_thread = 1;
  }
  return KVDB_OK;
}

void kv_rtier_close(kvdb *db)
{
  struct kv_rtier *t = db->rtier;
  if (t == NULL)
    return;
  if (t->has_thread) {
    pthread_mutex_lock(&t->mu);
    t->stop = 1; /* the worker sends what is queued, then ends */
    pthread_cond_broadcast(&t->more);
    pthread_cond_broadcast(&t->room);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
  }
  while (t->jh != NULL) { /* none: the worker ran each one before it ended */
    copy_job *j = t->jh;
    t->jh = j->next;
    job_free(j);
  }
  kv_remote_close(t->r);
  pthread_mutex_destroy(&t->mu);
  pthread_mutex_destroy(&t->fmu);
  pthread_cond_destroy(&t->more);
  pthread_cond_destroy(&t->room);
  pthread_cond_destroy(&t->idle);
  free(t->q);
  free(t);
  db->rtier = NULL;
}

kvdb_status kvdb_remote_stat(kvdb *db, kvdb_remote_stats *out)
{
  KV_RET(kv_check_db(db));
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  memset(out, 0, sizeof *out);
  struct kv_rtier *t = db->rtier;
  if (t == NULL)
    return KVDB_OK;
  kv_remote_counters rc;
  kv_remote_counters_get(t->r, &rc);
  out->enabled = 1;
  out->cluster = rc.cluster;
  out->nodes = rc.nodes;
  out->hits = t->hits;
  out->misses = t->misses;
  out->rejected = t->rejected;
  out->queued = t->queued;
  out->written = t->written;
  out->dropped = t->dropped;
  out->copied = t->copied;
  out->copy_failed = t->copy_failed;
  pthread_mutex_lock(&t->mu);
  out->queue_len = t->len + (t->busy ? 1u : 0u);
  pthread_mutex_unlock(&t->mu);
  out->round_trips = rc.round_trips;
  out->errors = rc.errors;
  out->reconnects = rc.reconnects;
  out->down_skips = rc.down_skips;
  out->redirects = rc.redirects;
  out->bytes_in = rc.bytes_in;
  out->bytes_out = rc.bytes_out;
  return KVDB_OK;
}
