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
 * Keys carry no hash tag: a block belongs to every context that shares it, so a context tag
 * would not be one slot per block, and a (namespace, model) tag would put a tenant on one node;
 * a chain's blocks spread over the slots and a Cluster lookup pipelines to every node at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "catalog/catalog.h"
#include "ops_int.h"
#include "remote/remote.h"

#define RV_MAGIC 0x52564B4Bu
#define RV_VERSION 1u
#define RV_HDR 80u
#define RV_KEY_MAX 160u
#define RT_BATCH 16u            /* blocks per write-through round trip */
#define RT_BATCH_BYTES (64u << 20)

struct kv_rtier {
  kv_remote *r;
  char ns[64];
  uint64_t ns_tag;
  pthread_mutex_t mu;
  pthread_cond_t more, room, idle;
  uint8_t (*q)[16]; /* ring of block hashes */
  uint32_t cap, head, len;
  int busy;         /* the worker holds a batch */
  int stop;
  int has_thread;
  int on_put, on_evict; /* kvdb_options.remote_write (0 = on put), with a queue only */
  pthread_t th;
  _Atomic uint64_t hits, misses, rejected, queued, written, dropped;
};

static uint64_t rt_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static size_t rt_key(const struct kv_rtier *t, const uint8_t mh[16], const uint8_t h[16],
                     char *buf)
{
  char a[33], b[33];
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
static int build_value(kvdb *db, struct kv_rtier *t, const uint8_t hash[16], wblk *w)
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
      w->klen = rt_key(t, rec.model, hash, w->key);
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

/* Send up to RT_BATCH queued blocks (one round trip); the queue lock is not held. */
static void send_batch(kvdb *db, struct kv_rtier *t, uint8_t (*hs)[16], uint32_t n)
{
  wblk w[RT_BATCH];
  kv_rcmd c[RT_BATCH];
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    memset(&w[k], 0, sizeof w[k]);
    if (build_value(db, t, hs[i], &w[k]) != 0) {
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
      if (c[i].status == KV_RCMD_OK)
        t->written++;
      else
        t->dropped++;
    }
    kv_remote_release(c, k);
  } else {
    t->dropped += k;
  }
  for (uint32_t i = 0; i < k; i++)
    kv_free_aligned(w[i].mem);
}

static void *worker(void *arg)
{
  kvdb *db = arg;
  struct kv_rtier *t = db->rtier;
  uint8_t hs[RT_BATCH][16];
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (t->len == 0 && !t->stop)
      pthread_cond_wait(&t->more, &t->mu);
    if (t->len == 0 && t->stop)
      break;
    uint32_t n = t->len < RT_BATCH ? t->len : RT_BATCH;
    for (uint32_t i = 0; i < n; i++)
      memcpy(hs[i], t->q[(t->head + i) % t->cap], 16);
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

void kv_rtier_note_put(kvdb *db, const uint8_t (*hashes)[16], uint32_t n)
{
  struct kv_rtier *t = db->rtier;
  if (t == NULL || t->cap == 0 || !t->on_put || n == 0)
    return;
  uint64_t deadline = rt_now_ns() + (uint64_t)db->opt.remote_put_wait_ms * 1000000ull;
  struct timespec abs;
  clock_gettime(CLOCK_REALTIME, &abs);
  uint64_t wait_ns = (uint64_t)db->opt.remote_put_wait_ms * 1000000ull;
  abs.tv_sec += (time_t)(wait_ns / 1000000000ull);
  abs.tv_nsec += (long)(wait_ns % 1000000000ull);
  if (abs.tv_nsec >= 1000000000L) {
    abs.tv_sec++;
    abs.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&t->mu);
  uint32_t i = 0;
  while (i < n) {
    while (i < n && t->len < t->cap) {
      memcpy(t->q[(t->head + t->len) % t->cap], hashes[i], 16);
      t->len++;
      i++;
      t->queued++;
    }
    pthread_cond_signal(&t->more);
    if (i == n || t->stop || rt_now_ns() >= deadline)
      break;
    if (pthread_cond_timedwait(&t->room, &t->mu, &abs) == ETIMEDOUT && t->len == t->cap)
      break;
  }
  pthread_mutex_unlock(&t->mu);
  t->dropped += n - i;
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
  uint64_t raw = (uint64_t)g.meta_bytes + g.data_bytes;
  if (rec.bytes == 0 || rec.bytes % KV_PAGE != 0 ||
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
  kv_block_hdr hdr;
  if (kv_block_check(&rec, hash, obj, &hdr) != KVDB_OK || memcmp(hdr.model_hash, mh, 16) != 0 ||
      memcmp(hdr.parent_hash, parent, 16) != 0)
    return -1;
  for (uint32_t i = 0; i < n_tok; i++)
    if (kv_get_le32(obj + KV_BLOCK_HDR_BYTES + 4 * i) != tok[i])
      return -1;
  const uint8_t *data = obj + g.meta_bytes;
  if (hdr.version >= 2) {
    if (*dbuf == NULL && (*dbuf = kv_rbuf_acquire(db, g.data_bytes)) == NULL)
      return -1;
    if ((*dbuf)->cap < g.data_bytes) {
      kv_rbuf_release(db, *dbuf);
      if ((*dbuf = kv_rbuf_acquire(db, g.data_bytes)) == NULL)
        return -1;
    }
    if (dec->ctx == NULL && kv_cdec_init(dec) != KVDB_OK)
      return -1;
    if (kv_cblock_decode_data(&hdr, obj, 0, g.n_sections, dec, (*dbuf)->p) != KVDB_OK)
      return -1;
    data = (*dbuf)->p;
  }
  kv_scatter(&g, data, 0, n_tok, out, t0);
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
} chain;

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
    for (size_t i = s; i < nb; i++) {
      kv_rcmd *x = &ch.c[i - s];
      size_t nt = i * bt + bt <= n ? bt : n - i * bt;
      x->op = out != NULL ? KV_RCMD_GET : KV_RCMD_GETRANGE;
      x->range_end = (int64_t)(RV_HDR + 4 * nt) - 1;
      x->key = keys[i - s];
      x->klen = rt_key(t, ch.h[0], ch.h[i + 1], keys[i - s]);
    }
    if (kv_remote_exec_cb(t->r, ch.c, nb - s, on_reply, &ch) == KVDB_OK)
      while (ch.next < nb - s) /* replies the callback did not see (a node down) */
        take_block(&ch, ch.next++);
    kv_remote_release(ch.c, nb - s);
  }
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

void kv_rtier_note_evict(kvdb *db, const uint8_t key[16])
{
  struct kv_rtier *t = db->rtier;
  if (t == NULL || t->cap == 0 || !t->on_evict)
    return;
  kv_txn *txn;
  if (kv_txn_begin(&db->cat, 0, &txn) != KVDB_OK) {
    kv_clear_error();
    return;
  }
  kv_ctx_rec cr;
  uint8_t(*hs)[16] = NULL;
  uint32_t n = 0;
  if (kv_cat_get_ctx(&db->cat, txn, key, &cr) == KVDB_OK && cr.n_blocks > 0 &&
      (hs = malloc((size_t)cr.n_blocks * 16)) != NULL) {
    memcpy(hs, cr.blocks, (size_t)cr.n_blocks * 16);
    n = cr.n_blocks;
  }
  kv_txn_abort(txn); /* its blocks stay until the caller's delete, which follows this */
  for (uint32_t i = 0; i < n; i += RT_BATCH) {
    uint32_t m = n - i < RT_BATCH ? n - i : RT_BATCH;
    t->queued += m;
    send_batch(db, t, hs + i, m);
  }
  free(hs);
  kv_clear_error();
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
  if (build_value(db, &t, hash, &w) != 0) {
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
  memcpy(t->ns, ns, nl + 1);
  t->ns_tag = XXH3_64bits(ns, nl);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->more, NULL);
  pthread_cond_init(&t->room, NULL);
  pthread_cond_init(&t->idle, NULL);
  t->cap = db->cat.rdonly ? 0 : o->remote_queue_blocks;
  t->on_put = o->remote_write == 0 || (o->remote_write & KVDB_REMOTE_WRITE_PUT) != 0;
  t->on_evict = (o->remote_write & KVDB_REMOTE_WRITE_EVICT) != 0;
  db->rtier = t;
  if (t->cap > 0) {
    t->q = malloc((size_t)t->cap * 16);
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
  kv_remote_close(t->r);
  pthread_mutex_destroy(&t->mu);
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
