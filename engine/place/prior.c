/* SPDX-License-Identifier: MIT */
/*
 * engine/place/prior.c — PROFILE SAMPLING: which placed puts measure their quality profile
 * (kvdb_options.placement_profile), and the profile predicted for the others from the
 * profiles this handle measured for earlier puts like them.
 *
 * Why: with placement on, every put measured its profile before it was written (EvicPress
 * §4.3; engine/ops/profile.c): for small contexts that measurement was most of a placed put's
 * cost (issue 17, put_overhead_of_placement; bench/RESULTS.md "issue 17 put overhead, session
 * 26"). Contexts of one model, space and length measure alike; once they do, measuring each
 * one buys nothing the placement uses.
 *
 * GROUPS. A put's group is (model hash with block_tokens, profile space string, sampled heads,
 * whether SnapKV queries and probe queries were given, floor(log2(n_tokens))). Each group keeps
 * its last PRIOR_WINDOW measured profiles (a ring): per config, the quality and the bytes per
 * token. At most PRIOR_GROUPS groups (the least recently used one is replaced).
 *
 * AGREEMENT. A group agrees when its ring is full, every profile in it has the same configs,
 * and for every config the qualities are finite with max - min <= max(PRIOR_Q_ABS,
 * PRIOR_Q_REL * (1 - min)) (the quality losses agree within 20% or 0.001) and the bytes per
 * token max <= PRIOR_BYTES_REL * min.
 *
 * PREDICTION. While the group agrees, a put is predicted, except every PRIOR_EVERY-th, which
 * is measured and joins the ring (so a group that drifts stops agreeing: the puts after it are
 * measured until PRIOR_WINDOW measured ones agree again). A predicted entry has the ring's
 * least quality (the conservative side: the placement compresses less, never more, than the
 * worst of the group), its largest rel_l2, the ring's mean bytes per token times the
 * context's tokens, flags 0 and n_probes 0 (kvdb.h: predicted). A put whose caller asked for
 * the profile (KVDB_PUT_PROFILE) is always measured; KVDB_PLACE_PROFILE_EVERY_PUT measures
 * every put (the paper's profiler).
 *
 * DURABILITY. Nothing is deferred: a predicted profile is recorded in the put's own
 * transaction (put.c), so a crash leaves a context with its profile or no context. It is
 * recorded BY REFERENCE (catalog.h PRIORS, format 7): no profile record, but the group key in
 * the context's ctxstats record (which the put's transaction writes anyway) and the group's
 * prediction in the `priors` database, rewritten only when it changes (after a measured put
 * joined the ring): a predicted put adds no catalog page of its own for its profile. Readers
 * (kv_cat_get_profile) synthesize the profile from the group's record: a context's predicted
 * profile is its group's latest prediction (the same values while the ring holds; after a
 * measured put joined, the prediction the group has learnt since). A prediction of more than
 * KV_PRIOR_MAX_ENTRIES configs is written as a profile record as before. The rings live in the
 * handle only: a reopened handle measures each group's first puts again.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "place.h"

#define PRIOR_WINDOW 16       /* measured profiles a group keeps */
#define PRIOR_EVERY 16        /* while it agrees: one put in this many is measured */
#define PRIOR_GROUPS 32       /* groups a handle keeps */
#define PRIOR_Q_ABS 1e-3      /* qualities agree within this ... */
#define PRIOR_Q_REL 0.2       /* ... or this share of the least quality loss */
#define PRIOR_BYTES_REL 1.25  /* bytes per token agree within this ratio */

typedef struct prior_group {
  uint64_t key;
  uint64_t used;            /* the handle's use counter when last used (LRU) */
  uint32_t n_cfg;
  kvdb_config cfg[KV_PROFILE_MAX_CONFIGS];
  uint32_t n, head;         /* profiles in the ring; the next slot */
  uint32_t skip;            /* predicted puts since the last measured one */
  uint64_t noted_ms;        /* when the last measured profile joined (the prediction's time) */
  double q[PRIOR_WINDOW][KV_PROFILE_MAX_CONFIGS];
  double rl2[PRIOR_WINDOW][KV_PROFILE_MAX_CONFIGS];
  double bpt[PRIOR_WINDOW][KV_PROFILE_MAX_CONFIGS];
} prior_group;

typedef struct prior_state {
  uint64_t clock;
  prior_group *g[PRIOR_GROUPS];
} prior_state;

static void prior_free(void *p)
{
  prior_state *s = p;
  if (s == NULL)
    return;
  for (int i = 0; i < PRIOR_GROUPS; i++)
    free(s->g[i]);
  free(s);
}

uint64_t kv_place_prior_key(const uint8_t model_hash[16], const char *space, uint32_t heads,
                            int have_q, int have_pq, uint64_t n_tokens)
{
  uint32_t lg = 0;
  while (lg < 63 && (n_tokens >> (lg + 1)) != 0)
    lg++;
  uint32_t w[4] = {heads, (uint32_t)(have_q != 0), (uint32_t)(have_pq != 0), lg};
  uint8_t k[16 + sizeof w];
  memcpy(k, model_hash, 16);
  memcpy(k + 16, w, sizeof w);
  uint64_t h = XXH3_64bits(k, sizeof k);
  h = space != NULL ? XXH3_64bits_withSeed(space, strlen(space) + 1, h) : h;
  return h != 0 ? h : 1; /* 0 is "no group" in a ctxstats record (catalog.h PRIORS) */
}

/* The group of `key` (created when `create`); the slot's lock held. */
static prior_group *group_of(kv_place_prior_slot *slot, uint64_t key, int create)
{
  prior_state *s = slot->state;
  if (s == NULL) {
    if (!create)
      return NULL;
    s = calloc(1, sizeof *s);
    if (s == NULL)
      return NULL;
    slot->state = s;
    slot->state_free = prior_free;
  }
  s->clock++;
  int lru = 0;
  for (int i = 0; i < PRIOR_GROUPS; i++) {
    if (s->g[i] != NULL && s->g[i]->key == key) {
      s->g[i]->used = s->clock;
      return s->g[i];
    }
    if (s->g[i] == NULL || (s->g[lru] != NULL && s->g[i]->used < s->g[lru]->used))
      lru = i;
  }
  if (!create)
    return NULL;
  if (s->g[lru] == NULL) {
    s->g[lru] = malloc(sizeof *s->g[lru]);
    if (s->g[lru] == NULL)
      return NULL;
  }
  prior_group *g = s->g[lru];
  memset(g, 0, offsetof(prior_group, q));
  g->key = key;
  g->used = s->clock;
  return g;
}

/* Whether the ring is full and agrees (AGREEMENT). */
static int agrees(const prior_group *g)
{
  if (g->n < PRIOR_WINDOW || g->n_cfg == 0)
    return 0;
  for (uint32_t c = 0; c < g->n_cfg; c++) {
    double qmin = INFINITY, qmax = -INFINITY, bmin = INFINITY, bmax = 0;
    for (uint32_t r = 0; r < g->n; r++) {
      double q = g->q[r][c], b = g->bpt[r][c];
      if (!isfinite(q) || !isfinite(b) || !(b > 0))
        return 0;
      qmin = q < qmin ? q : qmin;
      qmax = q > qmax ? q : qmax;
      bmin = b < bmin ? b : bmin;
      bmax = b > bmax ? b : bmax;
    }
    double tol = PRIOR_Q_REL * (1.0 - qmin);
    if (qmax - qmin > (tol > PRIOR_Q_ABS ? tol : PRIOR_Q_ABS) || bmax > PRIOR_BYTES_REL * bmin)
      return 0;
  }
  return 1;
}

int kv_place_prior_predict(kvdb *db, uint64_t key, uint64_t n_tokens, kv_profile_rec *out)
{
  if (db->place == NULL || db->opt.placement_profile != KVDB_PLACE_PROFILE_SAMPLED)
    return 0;
  kv_place_prior_slot *slot = kv_place_prior_of(db);
  pthread_mutex_lock(&slot->mu);
  prior_group *g = group_of(slot, key, 0);
  int predict = g != NULL && agrees(g) && g->skip + 1 < PRIOR_EVERY;
  if (predict) {
    g->skip++;
    memset(out, 0, sizeof *out);
    out->n_entries = g->n_cfg;
    out->n_probes = 0;
    out->measured_ms = g->noted_ms; /* the prediction's: the same for the group's puts */
    /* recorded by reference to the group's prior record (catalog.h PRIORS) when it fits */
    out->prior = g->n_cfg <= KV_PRIOR_MAX_ENTRIES ? key : 0;
    for (uint32_t c = 0; c < g->n_cfg; c++) {
      kvdb_profile_entry *e = &out->e[c];
      double qmin = INFINITY, rmax = 0, bsum = 0;
      for (uint32_t r = 0; r < g->n; r++) {
        qmin = g->q[r][c] < qmin ? g->q[r][c] : qmin;
        rmax = g->rl2[r][c] > rmax ? g->rl2[r][c] : rmax;
        bsum += g->bpt[r][c];
      }
      e->config = g->cfg[c];
      e->flags = 0;
      e->quality = qmin;
      e->rel_l2 = rmax;
      e->reported_quality = NAN;
      if (c < KV_PRIOR_MAX_ENTRIES)
        out->prior_bpt[c] = bsum / g->n;
      uint64_t b = (uint64_t)llround(bsum / g->n * (double)n_tokens);
      e->bytes = b > 0 ? b : 1;
      e->n_probes = 0;
    }
  } else if (g != NULL) {
    g->skip = 0; /* this put is measured */
  }
  if (!predict)
    out->prior = 0;
  pthread_mutex_unlock(&slot->mu);
  return predict;
}

void kv_place_prior_note(kvdb *db, uint64_t key, uint64_t n_tokens, const kv_profile_rec *p)
{
  if (db->place == NULL || n_tokens == 0 || p->n_entries == 0 ||
      p->n_entries > KV_PROFILE_MAX_CONFIGS)
    return;
  kv_place_prior_slot *slot = kv_place_prior_of(db);
  pthread_mutex_lock(&slot->mu);
  prior_group *g = group_of(slot, key, 1);
  if (g != NULL) {
    int same = g->n_cfg == p->n_entries;
    for (uint32_t c = 0; same && c < g->n_cfg; c++)
      same = kv_policy_config_equal(&g->cfg[c], &p->e[c].config);
    if (!same) { /* another space under the same key (or the first profile): start again */
      g->n = g->head = g->skip = 0;
      g->n_cfg = p->n_entries;
      for (uint32_t c = 0; c < g->n_cfg; c++)
        g->cfg[c] = p->e[c].config;
    }
    for (uint32_t c = 0; c < g->n_cfg; c++) {
      const kvdb_profile_entry *e = &p->e[c];
      g->q[g->head][c] = e->quality;
      g->rl2[g->head][c] = isfinite(e->rel_l2) ? e->rel_l2 : 0.0;
      g->bpt[g->head][c] = (double)e->bytes / (double)n_tokens;
    }
    g->head = (g->head + 1) % PRIOR_WINDOW;
    g->noted_ms = kv_now_ms();
    if (g->n < PRIOR_WINDOW)
      g->n++;
  }
  pthread_mutex_unlock(&slot->mu);
}
