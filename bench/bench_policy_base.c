/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_base.c — `kvdb-bench policy` part 4b: the baselines a skeptic asks for
 * besides LRU (bench_policy_sim.c), every context in one fixed config, over the same DRAM
 * (inclusive) and SSD tiers and the same TTFT model:
 *   LFU: evicts the context of lowest decayed access count, with the half-life the EvicPress
 *     runs use for their frequencies (PB_HALF_LIFE_PER_CTX x contexts requests): the same
 *     counts the placement gets. Compared as log2(count) + t / half-life, which orders contexts
 *     as their counts decayed to any common time do.
 *   S3-FIFO (Yang et al., SOSP 2023) per tier: a small FIFO (10% of the bytes), a main FIFO and
 *     a ghost FIFO of keys (as many as the main one holds); a context enters the main FIFO when
 *     its key is in the ghost, else the small one; a hit raises its counter (at most 3); the
 *     small FIFO's tail moves to the main FIFO when it was hit, else leaves (its key to the
 *     ghost); the main FIFO's tail is reinserted with its counter lowered while above 0.
 *   ARC (Megiddo and Modha, FAST 2003) per tier, in bytes: T1 (seen once recently), T2 (seen
 *     again), their ghosts B1 and B2 (keys only, their bytes counted); a hit moves a context to
 *     T2's head; a miss found in B1 raises the target p of T1's bytes by its bytes x
 *     max(1, B2/B1), one found in B2 lowers it by its bytes x max(1, B1/B2), and it enters T2;
 *     any other miss enters T1. Room is made from T1's tail (to B1) while T1 holds more than p
 *     (or exactly p and the context came from B2), else from T2's tail (to B2); T1 + B1 stay
 *     within the tier's bytes and all four within twice that (the ghosts' tails are dropped).
 *     A DRAM hit is a hit of the SSD's ARC as well (S3-FIFO's counters likewise).
 * As with LRU: a request served from the SSD is copied into DRAM, a miss is recomputed and
 * stored (SSD, then DRAM), and leaving the SSD leaves DRAM too.
 */
#define _GNU_SOURCE
#include "bench_policy.h"

/* ---- a resident set with a victim by lowest key (LFU) -------------------------------------- */

typedef struct rset {
  int32_t *ids, *pos; /* ids[0..n); pos[id] = index or -1 */
  uint32_t n;
  uint64_t used, cap;
} rset;

static void rs_add(rset *r, int32_t i)
{
  r->pos[i] = (int32_t)r->n;
  r->ids[r->n++] = i;
}

static void rs_del(rset *r, int32_t i)
{
  int32_t p = r->pos[i], last = r->ids[--r->n];
  r->ids[p] = last;
  r->pos[last] = p;
  r->pos[i] = -1;
}

static int32_t rs_min(const rset *r, const double *key, int32_t skip)
{
  int32_t v = -1;
  for (uint32_t k = 0; k < r->n; k++) {
    int32_t i = r->ids[k];
    if (i != skip && (v < 0 || key[i] < key[v] || (key[i] == key[v] && i < v)))
      v = i;
  }
  return v;
}

/* ---- S3-FIFO over one tier ------------------------------------------------------------------ */

typedef struct fifo {
  int32_t *prev, *next;
  int32_t head, tail;
  uint64_t used;
  uint32_t count;
} fifo;

static void f_init(fifo *f, int32_t *prev, int32_t *next)
{
  f->prev = prev, f->next = next;
  f->head = f->tail = -1;
  f->used = 0;
  f->count = 0;
}

static void f_push(fifo *f, int32_t i, uint64_t b)
{
  f->prev[i] = -1;
  f->next[i] = f->head;
  if (f->head >= 0)
    f->prev[f->head] = i;
  f->head = i;
  if (f->tail < 0)
    f->tail = i;
  f->used += b;
  f->count++;
}

static void f_del(fifo *f, int32_t i, uint64_t b)
{
  if (f->prev[i] >= 0)
    f->next[f->prev[i]] = f->next[i];
  else
    f->head = f->next[i];
  if (f->next[i] >= 0)
    f->prev[f->next[i]] = f->prev[i];
  else
    f->tail = f->prev[i];
  f->used -= b;
  f->count--;
}

typedef struct s3 {
  fifo S, M, G;
  uint8_t *where; /* 0 none, 1 S, 2 M */
  uint8_t *ghost, *freq;
  uint64_t cap;
} s3;

/* Evict one context from the tier; returns it (-1: empty). `bytes(i)` by the caller's table. */
static int32_t s3_evict(s3 *q, const uint64_t *bytes)
{
  for (;;) {
    if (q->S.count > 0 && (q->S.used > q->cap / 10 || q->M.count == 0)) {
      int32_t v = q->S.tail;
      f_del(&q->S, v, bytes[v]);
      if (q->freq[v] > 1) {
        q->freq[v] = 0;
        f_push(&q->M, v, bytes[v]);
        q->where[v] = 2;
        continue;
      }
      q->where[v] = 0;
      if (!q->ghost[v]) {
        f_push(&q->G, v, 0);
        q->ghost[v] = 1;
      }
      while (q->G.count > q->M.count + 1) {
        int32_t g = q->G.tail;
        f_del(&q->G, g, 0);
        q->ghost[g] = 0;
      }
      return v;
    }
    if (q->M.count == 0)
      return -1;
    int32_t v = q->M.tail;
    f_del(&q->M, v, bytes[v]);
    if (q->freq[v] > 0) {
      q->freq[v]--;
      f_push(&q->M, v, bytes[v]);
      continue;
    }
    q->where[v] = 0;
    return v;
  }
}

static void s3_remove(s3 *q, int32_t i, const uint64_t *bytes)
{
  if (q->where[i] == 1)
    f_del(&q->S, i, bytes[i]);
  else if (q->where[i] == 2)
    f_del(&q->M, i, bytes[i]);
  q->where[i] = 0;
}

static void s3_insert(s3 *q, int32_t i, const uint64_t *bytes)
{
  q->freq[i] = 0;
  if (q->ghost[i]) {
    f_del(&q->G, i, 0);
    q->ghost[i] = 0;
    f_push(&q->M, i, bytes[i]);
    q->where[i] = 2;
  } else {
    f_push(&q->S, i, bytes[i]);
    q->where[i] = 1;
  }
}

/* ---- ARC over one tier (bytes) ------------------------------------------------------------- */

enum { A_NONE = 0, A_T1, A_T2, A_B1, A_B2 };

typedef struct arc {
  fifo T1, T2, B1, B2; /* heads are the most recent; one prev/next pair (an id is in one list) */
  uint8_t *where;
  uint64_t cap, p;
} arc;

static fifo *a_list(arc *q, uint8_t w)
{
  return w == A_T1 ? &q->T1 : w == A_T2 ? &q->T2 : w == A_B1 ? &q->B1 : &q->B2;
}

static void a_move(arc *q, int32_t i, uint8_t to, const uint64_t *bytes)
{
  if (q->where[i] != A_NONE)
    f_del(a_list(q, q->where[i]), i, bytes[i]);
  if (to != A_NONE)
    f_push(a_list(q, to), i, bytes[i]);
  q->where[i] = to;
}

static int a_resident(const arc *q, int32_t i)
{
  return q->where[i] == A_T1 || q->where[i] == A_T2;
}

/* A context about to enter (not resident): adapt p when it is a ghost. */
static void a_adapt(arc *q, int32_t i, const uint64_t *bytes)
{
  double b = (double)bytes[i];
  if (q->where[i] == A_B1) {
    double r = q->B1.used > 0 ? (double)q->B2.used / (double)q->B1.used : 1;
    double np = (double)q->p + b * (r > 1 ? r : 1);
    q->p = np > (double)q->cap ? q->cap : (uint64_t)np;
  } else if (q->where[i] == A_B2) {
    double r = q->B2.used > 0 ? (double)q->B1.used / (double)q->B2.used : 1;
    double d = b * (r > 1 ? r : 1);
    q->p = d >= (double)q->p ? 0 : (uint64_t)((double)q->p - d);
  }
}

/* Evict one resident context to make room for i; returns it (-1: none resident). */
static int32_t a_evict(arc *q, int32_t i, const uint64_t *bytes)
{
  int from_b2 = q->where[i] == A_B2;
  int32_t v;
  if (q->T1.count > 0 &&
      (q->T1.used > q->p || (from_b2 && q->T1.used == q->p) || q->T2.count == 0)) {
    v = q->T1.tail;
    a_move(q, v, A_B1, bytes);
  } else if (q->T2.count > 0) {
    v = q->T2.tail;
    a_move(q, v, A_B2, bytes);
  } else {
    return -1;
  }
  return v;
}

/* i enters (room made): T2 when it was a ghost, else T1; the ghosts trimmed. */
static void a_insert(arc *q, int32_t i, const uint64_t *bytes)
{
  uint8_t to = q->where[i] == A_B1 || q->where[i] == A_B2 ? A_T2 : A_T1;
  a_move(q, i, to, bytes);
  while (q->B1.count > 0 && q->T1.used + q->B1.used > q->cap)
    a_move(q, q->B1.tail, A_NONE, bytes);
  while (q->B2.count > 0 &&
         q->T1.used + q->T2.used + q->B1.used + q->B2.used > 2 * q->cap)
    a_move(q, q->B2.tail, A_NONE, bytes);
}

/* ---- the simulation ------------------------------------------------------------------------ */

int pb_sim_fixed(const trace *tr, const model *md, uint32_t cfg, int kind, result *res)
{
  uint32_t n = tr->n;
  int rc = -1;
  uint64_t *bs = malloc(n * sizeof *bs), *bd = malloc(n * sizeof *bd);
  double *key = malloc(n * sizeof *key), *cnt = calloc(n, sizeof *cnt), *tl = calloc(n, sizeof *tl);
  int32_t *buf = malloc(16 * (size_t)n * sizeof *buf);
  uint8_t *flags = calloc(8 * (size_t)n, 1);
  if (!bs || !bd || !key || !cnt || !tl || !buf || !flags)
    goto out;
  for (uint32_t i = 0; i < n; i++) {
    bs[i] = tr->c[i].opt[cfg].bytes;
    bd[i] = md->dram[(size_t)i * NCFG + cfg];
  }
  double H = PB_HALF_LIFE_PER_CTX * n;
  rset D = {buf, buf + n, 0, 0, md->tiers[0].capacity_bytes};
  rset S = {buf + 2 * (size_t)n, buf + 3 * (size_t)n, 0, 0, md->tiers[1].capacity_bytes};
  for (uint32_t i = 0; i < n; i++)
    D.pos[i] = S.pos[i] = -1;
  s3 qd, qs;
  f_init(&qd.S, buf + 4 * (size_t)n, buf + 5 * (size_t)n);
  f_init(&qd.M, buf + 4 * (size_t)n, buf + 5 * (size_t)n); /* S and M never share an id */
  f_init(&qd.G, buf + 6 * (size_t)n, buf + 7 * (size_t)n);
  f_init(&qs.S, buf + 8 * (size_t)n, buf + 9 * (size_t)n);
  f_init(&qs.M, buf + 8 * (size_t)n, buf + 9 * (size_t)n);
  f_init(&qs.G, buf + 10 * (size_t)n, buf + 11 * (size_t)n);
  qd.where = flags, qd.ghost = flags + n, qd.freq = flags + 2 * (size_t)n;
  qs.where = flags + 3 * (size_t)n, qs.ghost = flags + 4 * (size_t)n, qs.freq = flags + 5 * (size_t)n;
  qd.cap = md->tiers[0].capacity_bytes;
  qs.cap = md->tiers[1].capacity_bytes;
  arc ad, as;
  memset(&ad, 0, sizeof ad);
  memset(&as, 0, sizeof as);
  f_init(&ad.T1, buf + 12 * (size_t)n, buf + 13 * (size_t)n);
  ad.T2 = ad.B1 = ad.B2 = ad.T1;
  f_init(&as.T1, buf + 14 * (size_t)n, buf + 15 * (size_t)n);
  as.T2 = as.B1 = as.B2 = as.T1;
  ad.where = flags + 6 * (size_t)n, as.where = flags + 7 * (size_t)n;
  ad.cap = md->tiers[0].capacity_bytes;
  as.cap = md->tiers[1].capacity_bytes;
  acc a;
  memset(&a, 0, sizeof a);
  for (size_t r = 0; r < tr->n_req; r++) {
    int32_t i = (int32_t)tr->req[r];
    int meas = r >= tr->n_warm;
    double t = (double)r;
    cnt[i] = kv_policy_decay(cnt[i], t - tl[i], H, 1);
    tl[i] = t;
    key[i] = log2(cnt[i]) + t / H;
    int in_d = kind == PB_BASE_LFU ? D.pos[i] >= 0
               : kind == PB_BASE_ARC ? a_resident(&ad, i) : qd.where[i] != 0;
    int in_s = kind == PB_BASE_LFU ? S.pos[i] >= 0
               : kind == PB_BASE_ARC ? a_resident(&as, i) : qs.where[i] != 0;
    double wbytes = 0;
    if (in_d) {
      if (meas)
        acc_add(&a, md->ttft[((size_t)i * NCFG + cfg) * 2], tr->c[i].qs[cfg], 0);
      if (kind == PB_BASE_S3FIFO) {
        qd.freq[i] = qd.freq[i] < 3 ? qd.freq[i] + 1 : 3;
        qs.freq[i] = qs.freq[i] < 3 ? qs.freq[i] + 1 : 3;
      } else if (kind == PB_BASE_ARC) {
        a_move(&ad, i, A_T2, bd);
        if (a_resident(&as, i))
          a_move(&as, i, A_T2, bs);
      }
      continue;
    }
    if (in_s) {
      if (meas)
        acc_add(&a, md->ttft[((size_t)i * NCFG + cfg) * 2 + 1], tr->c[i].qs[cfg], 1);
      if (kind == PB_BASE_S3FIFO)
        qs.freq[i] = qs.freq[i] < 3 ? qs.freq[i] + 1 : 3;
      else if (kind == PB_BASE_ARC)
        a_move(&as, i, A_T2, bs);
    } else {
      if (meas)
        acc_add(&a, md->prefill[i], 1.0, 2);
      if (bs[i] > S.cap)
        continue;
      if (kind == PB_BASE_LFU) {
        while (S.used + bs[i] > S.cap) { /* leaving the SSD leaves the store (and DRAM) */
          int32_t v = rs_min(&S, key, i);
          rs_del(&S, v);
          S.used -= bs[v];
          if (D.pos[v] >= 0) {
            rs_del(&D, v);
            D.used -= bd[v];
          }
        }
        rs_add(&S, i);
        S.used += bs[i];
      } else if (kind == PB_BASE_ARC) {
        a_adapt(&as, i, bs);
        while (as.T1.used + as.T2.used + bs[i] > as.cap) {
          int32_t v = a_evict(&as, i, bs);
          if (v < 0)
            break;
          if (a_resident(&ad, v))
            a_move(&ad, v, A_NONE, bd);
        }
        a_insert(&as, i, bs);
      } else {
        while (qs.S.used + qs.M.used + bs[i] > qs.cap) {
          int32_t v = s3_evict(&qs, bs);
          if (v < 0)
            break;
          s3_remove(&qd, v, bd);
        }
        s3_insert(&qs, i, bs);
      }
      wbytes += (double)bs[i];
    }
    if (bd[i] <= D.cap) { /* into DRAM: the put, or an SSD hit promoted */
      if (kind == PB_BASE_LFU) {
        while (D.used + bd[i] > D.cap) {
          int32_t v = rs_min(&D, key, i);
          rs_del(&D, v);
          D.used -= bd[v];
        }
        rs_add(&D, i);
        D.used += bd[i];
      } else if (kind == PB_BASE_ARC) {
        a_adapt(&ad, i, bd);
        while (ad.T1.used + ad.T2.used + bd[i] > ad.cap && a_evict(&ad, i, bd) >= 0)
          ;
        a_insert(&ad, i, bd);
      } else {
        while (qd.S.used + qd.M.used + bd[i] > qd.cap && s3_evict(&qd, bd) >= 0)
          ;
        s3_insert(&qd, i, bd);
      }
      wbytes += (double)bd[i];
    }
    if (meas)
      a.wbytes += wbytes;
  }
  acc_result(&a, res);
  rc = 0;
out:
  free(bs);
  free(bd);
  free(key);
  free(cnt);
  free(tl);
  free(buf);
  free(flags);
  return rc;
}
