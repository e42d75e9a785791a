/* SPDX-License-Identifier: MIT */
/*
 * engine/place/placer.c — placing contexts with the EvicPress policy (policy/): the
 * policy's instance built from the catalog, the placement after each put (BETWEEN PUTS,
 * INCREMENTAL ADMISSION, IN THE PUT'S TRANSACTION), promotion on a hit (PROMOTION), rebalance
 * plans and their execution as relocations (kvdb_rebalance_plan / _execute), placement
 * statistics.
 *
 * THE INSTANCE (policy.h's model, from the catalog as of one read transaction, with the
 * settings of kv_place_settings)
 *   tiers: DRAM (if dram_bytes: inclusive, holding decoded blocks), SSD (ssd_bytes, 0 =
 *     unlimited), SmartSSD (if smartssd_bytes); their read figures from kv_place_figures.
 *   per context: its options = the entries of its quality profile that it can be re-encoded to
 *     (kv_policy_config_reachable from its stored config), token-dropping ones excepted (kvdb_get
 *     cannot serve them) unless it is stored so, each with the profile's bytes and quality (a
 *     reported quality wins; exact configs are 1); its stored config is always one of them
 *     (without a profile it is the only one, quality 1). raw bytes = tokens x token bytes,
 *     decoded bytes (its size in the DRAM tier) = its blocks' data regions; decode speed per
 *     method from KV_PLACE_DECODE_BPS. Frequency = its ctxstats count decayed to now (none kept:
 *     one access at its last access time). Current place = the tier of its last block (a
 *     SmartSSD context of a handle without that tier counts as SSD), cached = its ctxstats flag.
 *   Blocks shared by several contexts count in each (conservative).
 *
 * EXECUTION of a plan (kvdb_place_move list): in the plan's order (room is freed before it is
 * used), each context still as the plan found it (same config and tier) is relocated
 * (kv_relocate: one transaction each) or, when it leaves the last tier, deleted; one that
 * changed meanwhile is skipped. It runs in steps (kvdb_rebalance_step: a bound on the moves
 * and on the bytes relocated per step; kvdb_rebalance_execute: steps of
 * KV_REBALANCE_STEP_MOVES back to back), each under the handle's placement lock. After each
 * step one transaction records the moved contexts' tiers and DRAM flags in ctxstats and, when
 * a flag changed or the plan is done, bumps "place_gen", and the handle reloads its DRAM
 * admission set. A crash between moves leaves each context either where it was or where the
 * plan put it, readable either way; the flags are advisory and the next placement rewrites
 * them.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "catalog/catalog.h"
#include "place.h"

/* Decode throughput per kvdb_method (RAW, LOSSLESS, QUANT, DROP) in bytes of original KV per
 * second and core: the order of magnitude `kvdb-bench policy` measures on the reference VM
 * (lossless 0.7-1.7, int8 4-11, int4 4-9, dropping 13-45 GB/s). */
static const double KV_PLACE_DECODE_BPS[4] = {0, 1.5e9, 8e9, 20e9};

/* kvdb_rebalance_execute's steps: moves per hold of the placement lock. */
#define KV_REBALANCE_STEP_MOVES 64

typedef struct pmodel {
  uint8_t hash[16];
  kv_model_rec rec;
  char id[64];
} pmodel;

typedef struct pmeta {
  uint8_t key[16];
  uint32_t model;       /* index into models */
  uint32_t tier;        /* kvdb tier of its last block */
  kvdb_config cur;      /* its stored config */
  size_t opt0;          /* its options in opt[] */
} pmeta;

/* kvdb tiers the placer knows: the local ones, KVDB_TIER_NONE's slot, KVDB_TIER_REMOTE */
#define KV_PLACE_KTIERS (KVDB_TIER_REMOTE + 1)

typedef struct pinst {
  kv_place_set set;
  kv_policy_params p;
  kv_policy_tier tiers[KV_POLICY_MAX_TIERS];
  uint32_t n_tiers;
  uint32_t ktier[KV_POLICY_MAX_TIERS]; /* policy tier -> kvdb tier */
  int32_t ptier[KV_PLACE_KTIERS];      /* kvdb tier -> policy tier (-1: none) */
  int remote;                          /* the remote tier is the last policy tier */
  kv_tier_perf remote_perf;            /* as measured */
  uint64_t remote_bytes;               /* kvdb_options.remote_bytes (0: unlimited) */
  size_t n, cap;
  kv_policy_context *pc;
  pmeta *meta;
  kv_policy_option *opt;
  size_t n_opt, cap_opt;
  pmodel *models;
  size_t n_models, cap_models;
  uint64_t now_ms;
} pinst;

static void inst_free(pinst *in)
{
  free(in->pc);
  free(in->meta);
  free(in->opt);
  free(in->models);
  memset(in, 0, sizeof *in);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
  if (need <= *cap)
    return 0;
  size_t nc = *cap ? *cap : 64;
  while (nc < need)
    nc *= 2;
  void *np = realloc(*p, nc * elem);
  if (np == NULL)
    return -1;
  *p = np;
  *cap = nc;
  return 0;
}

/* The index of model `hash` in the instance (added from the catalog), or -1. */
static long model_index(kvdb *db, kv_txn *txn, pinst *in, const uint8_t hash[16])
{
  for (size_t i = 0; i < in->n_models; i++)
    if (memcmp(in->models[i].hash, hash, 16) == 0)
      return (long)i;
  if (grow((void **)&in->models, &in->cap_models, in->n_models + 1, sizeof *in->models) != 0)
    return -1;
  pmodel *pm = &in->models[in->n_models];
  if (kv_model_by_hash(db, txn, hash, pm->id, &pm->rec) != KVDB_OK) {
    kv_clear_error();
    return -1;
  }
  memcpy(pm->hash, hash, 16);
  return (long)in->n_models++;
}

static kvdb_model model_of(const pmodel *pm)
{
  kvdb_model m = {.id = pm->id, .n_layers = pm->rec.n_layers, .n_kv_heads = pm->rec.n_kv_heads,
                  .head_dim = pm->rec.head_dim, .dtype = (kvdb_dtype)pm->rec.dtype,
                  .block_tokens = pm->rec.block_tokens, .score_bits = pm->rec.score_bits,
                  .rope_base = pm->rec.rope_base, .rope_style = pm->rec.rope_style};
  return m;
}

/* Bytes of a context's blocks' data regions (its size in the DRAM tier). */
static uint64_t decoded_bytes(const kv_model_rec *r, uint64_t n_tokens)
{
  kv_block_geom g;
  uint64_t full = n_tokens / r->block_tokens, rem = n_tokens % r->block_tokens, b = 0;
  if (full > 0 && kv_block_geom_init(&g, r->n_layers, r->n_kv_heads, r->head_dim, r->dtype,
                                     r->block_tokens, r->block_tokens) == KVDB_OK)
    b += full * g.data_bytes;
  if (rem > 0 && kv_block_geom_init(&g, r->n_layers, r->n_kv_heads, r->head_dim, r->dtype,
                                    r->block_tokens, (uint32_t)rem) == KVDB_OK)
    b += g.data_bytes;
  kv_clear_error();
  return b;
}

static kvdb_status add_option(pinst *in, const kvdb_config *c, uint64_t bytes, double q,
                              uint64_t decoded)
{
  if (grow((void **)&in->opt, &in->cap_opt, in->n_opt + 1, sizeof *in->opt) != 0)
    return kv_fail(KVDB_NOMEM, "placement options");
  kv_policy_option *o = &in->opt[in->n_opt++];
  memset(o, 0, sizeof *o);
  o->config = *c;
  o->bytes = bytes > 0 ? bytes : 1;
  o->decoded_bytes = decoded;
  o->quality = q < 0 ? 0 : q > 1 ? 1 : q;
  return KVDB_OK;
}

/* The policy's tiers from the settings and figures; rf: the remote tier's measured figures
 * (NULL: not in the model). */
static void inst_tiers(pinst *in, const kv_tier_perf *f, const kv_tier_perf *rf)
{
  const kv_place_set *set = &in->set;
  in->n_tiers = 0;
  for (int t = 0; t < KV_PLACE_KTIERS; t++)
    in->ptier[t] = -1;
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
    kv_policy_tier *pt = &in->tiers[in->n_tiers];
    if (t == KVDB_TIER_DRAM) {
      if (set->dram_bytes == 0 || f[t].read_bps <= 0)
        continue;
      *pt = (kv_policy_tier){"dram", set->dram_bytes, f[t].read_bps, f[t].latency_s,
                             KV_POLICY_TIER_INCLUSIVE | KV_POLICY_TIER_DECODED};
    } else if (t == KVDB_TIER_SSD) {
      *pt = (kv_policy_tier){"ssd", set->ssd_bytes ? set->ssd_bytes : KV_POLICY_UNLIMITED,
                             f[t].read_bps > 0 ? f[t].read_bps : 2e9, f[t].latency_s, 0};
    } else {
      if (set->smartssd_bytes == 0 || f[t].read_bps <= 0)
        continue;
      *pt = (kv_policy_tier){"smartssd", set->smartssd_bytes, f[t].read_bps, f[t].latency_s, 0};
    }
    in->ktier[in->n_tiers] = t;
    in->ptier[t] = (int32_t)in->n_tiers;
    in->n_tiers++;
  }
  /* the remote tier, below the local ones: read at its measured figures, but never better
   * than the last local tier's, and a network round trip (its latency) after it: kept
   * locally while it fits there (no tie to break), Redis holds what leaves */
  in->remote = 0;
  if (rf != NULL && rf->read_bps > 0 && in->n_tiers < KV_POLICY_MAX_TIERS) {
    const kv_policy_tier *last = &in->tiers[in->n_tiers - 1];
    double bps = rf->read_bps < last->read_bps ? rf->read_bps : last->read_bps;
    double lat = rf->latency_s > last->latency_s ? rf->latency_s : last->latency_s;
    lat += rf->latency_s > 0 ? rf->latency_s : 1e-6;
    in->tiers[in->n_tiers] = (kv_policy_tier){
        "remote", in->remote_bytes ? in->remote_bytes : KV_POLICY_UNLIMITED, bps, lat, 0};
    in->ktier[in->n_tiers] = KVDB_TIER_REMOTE;
    in->ptier[KVDB_TIER_REMOTE] = (int32_t)in->n_tiers;
    in->n_tiers++;
    in->remote = 1;
    in->remote_perf = *rf;
  }
  kv_policy_params_init(&in->p);
  in->p.tiers = in->tiers;
  in->p.n_tiers = in->n_tiers;
  in->p.alpha = set->alpha;
  in->p.prefill_tokens_per_s = set->prefill_tps;
  in->p.recompute_quality = 1.0;
  memcpy(in->p.decode_bps, KV_PLACE_DECODE_BPS, sizeof in->p.decode_bps);
  in->p.rule = set->rule == KVDB_PLACEMENT_PER_BYTE     ? KV_POLICY_PER_BYTE
               : set->rule == KVDB_PLACEMENT_LEAST_DROP ? KV_POLICY_LEAST_DROP
                                                        : KV_POLICY_REFILL;
}

/* One context into the instance, from what the catalog (or a put about to be written) says:
 * its record, its model (index into models), the tier it is on, its quality profile (NULL:
 * none) and its access record (NULL: none kept). */
static kvdb_status inst_put(pinst *in, const uint8_t key[16], const kv_ctx_rec *cr, long mi,
                            uint32_t tier, const kv_profile_rec *prof, const kv_ctxstats *cs)
{
  const kv_model_rec *mr = &in->models[mi].rec;
  if (in->n == in->cap) {
    size_t nc = in->cap ? 2 * in->cap : 64;
    kv_policy_context *npc = realloc(in->pc, nc * sizeof *npc);
    if (npc != NULL)
      in->pc = npc;
    pmeta *nm = npc != NULL ? realloc(in->meta, nc * sizeof *nm) : NULL;
    if (nm == NULL)
      return kv_fail(KVDB_NOMEM, "placement instance of %zu contexts", nc);
    in->meta = nm;
    in->cap = nc;
  }
  pmeta *me = &in->meta[in->n];
  kv_policy_context *c = &in->pc[in->n];
  memset(me, 0, sizeof *me);
  memset(c, 0, sizeof *c);
  memcpy(me->key, key, 16);
  me->model = (uint32_t)mi;
  me->tier = tier;
  me->cur = cr->config;
  me->opt0 = in->n_opt;
  uint64_t tok_bytes = (uint64_t)mr->n_layers * mr->n_kv_heads * mr->head_dim * 2 *
                       kv_dtype_bytes(mr->dtype);
  uint64_t dec = decoded_bytes(mr, cr->n_tokens);
  /* a token-dropping context cannot be in the DRAM tier (kvdb_get does not serve it): its
   * decoded size there is made larger than the tier */
  uint64_t dec_drop = in->set.dram_bytes + 1;
  int have_cur = 0;
  for (uint32_t e = 0; prof != NULL && e < prof->n_entries; e++) {
    const kvdb_profile_entry *pe = &prof->e[e];
    int is_cur = kv_policy_config_equal(&pe->config, &cr->config);
    if (!is_cur && (pe->config.method == KVDB_METHOD_DROP ||
                    !kv_policy_config_reachable(&cr->config, &pe->config)))
      continue;
    int dup = 0;
    for (size_t o = me->opt0; o < in->n_opt && !dup; o++)
      dup = kv_policy_config_equal(&in->opt[o].config, &pe->config);
    if (dup)
      continue;
    double q = !isnan(pe->reported_quality) ? pe->reported_quality : pe->quality;
    if (isnan(q)) {
      if (!is_cur && !kv_policy_config_exact(&pe->config))
        continue; /* unmeasured */
      q = 1.0;
    }
    uint64_t bytes = is_cur ? cr->bytes : pe->bytes;
    if (bytes == 0)
      continue;
    KV_RET(add_option(in, &pe->config, bytes, q,
                      pe->config.method == KVDB_METHOD_DROP ? dec_drop : dec));
    have_cur |= is_cur;
  }
  if (!have_cur) /* no profile, or it lacks the stored config */
    KV_RET(add_option(in, &cr->config, cr->bytes, 1.0,
                      cr->config.method == KVDB_METHOD_DROP ? dec_drop : dec));
  c->n_options = (uint32_t)(in->n_opt - me->opt0);
  c->raw_bytes = cr->n_tokens * tok_bytes > 0 ? cr->n_tokens * tok_bytes : 1;
  c->n_tokens = cr->n_tokens > 0 ? cr->n_tokens : 1;
  double hl = in->set.half_life_s * 1000.0;
  kv_ctxstats one = {.freq = 1.0, .freq_ms = cr->last_access_ms};
  c->frequency = kv_ctxstats_freq_at(cs != NULL ? cs : &one, in->now_ms, hl);
  int cached = cs != NULL && (cs->flags & KV_CTXS_CACHED) != 0;
  uint32_t t = me->tier;
  if (in->ptier[t] < 0 || t == KVDB_TIER_DRAM)
    t = KVDB_TIER_SSD; /* a tier this handle does not place on: planned as SSD */
  int32_t cur_opt = 0;
  for (uint32_t o = 0; o < c->n_options; o++)
    if (kv_policy_config_equal(&in->opt[me->opt0 + o].config, &cr->config))
      cur_opt = (int32_t)o;
  c->current = (kv_policy_place){in->ptier[t], cur_opt,
                                 cached && in->ptier[KVDB_TIER_DRAM] == 0 ? 1u : 0u};
  in->n++;
  return KVDB_OK;
}

/* One stored context into the instance (its profile and access record read as of txn;
 * `prof` is a buffer for the profile). */
static kvdb_status inst_add(kvdb *db, kv_txn *txn, pinst *in, const uint8_t key[16],
                            const kv_ctx_rec *cr, kv_profile_rec *prof)
{
  long mi = model_index(db, txn, in, cr->model);
  if (mi < 0)
    return KVDB_OK; /* no model record: [C1]-style damage, left to verify; not placed */
  kvdb_status rc = kv_cat_get_profile(&db->cat, txn, key, prof);
  if (rc != KVDB_OK && rc != KVDB_NOTFOUND)
    return rc;
  kv_clear_error();
  kv_ctxstats cs;
  int have_cs = kv_cat_get_ctxstats(&db->cat, txn, key, &cs) == KVDB_OK;
  kv_clear_error();
  return inst_put(in, key, cr, mi, kv_ctx_tier(db, txn, cr), rc == KVDB_OK ? prof : NULL,
                  have_cs ? &cs : NULL);
}

/* An instance without contexts: the settings, the tiers and their figures, as of txn; with
 * `remote`, the remote tier too when this handle has one it writes and its server answers. */
static kvdb_status inst_start(kvdb *db, kv_txn *txn, pinst *in, int remote)
{
  memset(in, 0, sizeof *in);
  in->now_ms = kv_now_ms();
  KV_RET(kv_place_settings(db, txn, &in->set));
  kv_tier_perf f[KVDB_TIER_COUNT], rf;
  KV_RET(kv_place_figures(db, &in->set, f));
  int have_r = remote && kv_rtier_figures(db, &rf) == 0;
  in->remote_bytes = db->opt.remote_bytes;
  inst_tiers(in, f, have_r ? &rf : NULL);
  return KVDB_OK;
}

/* Every stored context, as of txn (`remote`: as inst_start). */
static kvdb_status inst_build(kvdb *db, kv_txn *txn, pinst *in, int remote)
{
  KV_RET(inst_start(db, txn, in, remote));
  kv_profile_rec *prof = malloc(sizeof *prof);
  if (prof == NULL)
    return kv_fail(KVDB_NOMEM, "profile");
  kv_cat_iter it;
  kvdb_status rc = kv_cat_iter_open(&db->cat, txn, KV_TBL_CONTEXTS, &it, "open context cursor");
  if (rc != KVDB_OK) {
    free(prof);
    return rc;
  }
  while (rc == KVDB_OK && kv_cat_iter_next(&it)) {
    kv_ctx_rec cr;
    if (kv_cat_iter_ctx(&it, &cr) != KVDB_OK) {
      kv_clear_error(); /* a damaged record is verify's to report; it is not placed */
      continue;
    }
    rc = inst_add(db, txn, in, it.key.data, &cr, prof);
  }
  kv_cat_iter_close(&it);
  free(prof);
  for (size_t i = 0; rc == KVDB_OK && i < in->n; i++) /* opt[] is final now */
    in->pc[i].options = &in->opt[in->meta[i].opt0];
  if (rc != KVDB_OK)
    inst_free(in);
  return rc;
}

/* Context `key` alone (the others are not read), as of txn; in->n is 0 when it is gone. */
static kvdb_status inst_one(kvdb *db, kv_txn *txn, const uint8_t key[16], pinst *in)
{
  KV_RET(inst_start(db, txn, in, 0));
  kv_ctx_rec cr;
  kvdb_status rc = kv_cat_get_ctx(&db->cat, txn, key, &cr);
  if (rc == KVDB_NOTFOUND) {
    kv_clear_error();
    return KVDB_OK;
  }
  KV_RET(rc);
  kv_profile_rec *prof = malloc(sizeof *prof);
  if (prof == NULL)
    return kv_fail(KVDB_NOMEM, "profile");
  rc = inst_add(db, txn, in, key, &cr, prof);
  free(prof);
  if (rc == KVDB_OK && in->n == 1)
    in->pc[0].options = &in->opt[in->meta[0].opt0];
  if (rc != KVDB_OK)
    inst_free(in);
  return rc;
}

/* ---- plans in public form ---------------------------------------------------------------- */

static uint32_t pub_tier(const pinst *in, int32_t ptier)
{
  return ptier == KV_POLICY_NONE ? (uint32_t)KVDB_TIER_NONE : in->ktier[ptier];
}

static const kv_policy_option *opt_of(const pinst *in, uint32_t ctx, int32_t o)
{
  return &in->opt[in->meta[ctx].opt0 + (size_t)o];
}

/* A policy plan as kvdb_place_plan (moves with keys, kvdb tiers, configs, bytes). */
static kvdb_status to_public(const pinst *in, const kv_policy_plan *pp, kvdb_place_plan *out)
{
  memset(out, 0, sizeof *out);
  out->n_contexts = in->n;
  out->utility_before = pp->utility_before;
  out->utility_after = pp->utility_after;
  out->n_recompress = pp->n_recompress;
  out->n_evict = pp->n_evict;
  for (uint32_t t = 0; t < in->n_tiers; t++) {
    uint32_t k = in->ktier[t];
    uint64_t cap = in->tiers[t].capacity_bytes == KV_POLICY_UNLIMITED
                       ? 0 : in->tiers[t].capacity_bytes;
    if (k == KVDB_TIER_REMOTE) {
      out->remote = 1;
      out->remote_capacity = cap;
      out->remote_bytes_after = pp->used_after[t];
      out->remote_perf = (kvdb_tier_perf){in->remote_perf.read_bps, in->remote_perf.latency_s,
                                          in->now_ms, 0};
      out->remote_model = (kvdb_tier_perf){in->tiers[t].read_bps, in->tiers[t].latency_s,
                                           in->now_ms, 0};
      continue;
    }
    out->capacity[k] = cap;
    out->bytes_before[k] = pp->used_before[t];
    out->bytes_after[k] = pp->used_after[t];
  }
  if (pp->n_moves == 0)
    return KVDB_OK;
  out->moves = calloc(pp->n_moves, sizeof *out->moves);
  if (out->moves == NULL)
    return kv_fail(KVDB_NOMEM, "plan of %zu moves", pp->n_moves);
  for (size_t i = 0; i < pp->n_moves; i++) {
    const kv_policy_move *mv = &pp->moves[i];
    const pmeta *me = &in->meta[mv->context];
    kvdb_place_move *m = &out->moves[out->n_moves++];
    memcpy(m->context.b, me->key, 16);
    m->from_tier = me->tier; /* where it is (a tier planned as another is still found there) */
    m->to_tier = pub_tier(in, mv->to.tier);
    m->from_cached = mv->from.cached;
    m->to_cached = mv->to.cached;
    m->from_config = me->cur;
    m->from_bytes = opt_of(in, mv->context, in->pc[mv->context].current.option)->bytes;
    if (mv->to.tier != KV_POLICY_NONE) {
      const kv_policy_option *o = opt_of(in, mv->context, mv->to.option);
      m->to_config = o->config;
      m->to_bytes = o->bytes;
    }
    m->utility_from = mv->utility_from;
    m->utility_to = mv->utility_to;
  }
  return KVDB_OK;
}

void kvdb_place_plan_free(kvdb_place_plan *plan)
{
  if (plan == NULL)
    return;
  free(plan->moves);
  memset(plan, 0, sizeof *plan);
}

/* ---- execution --------------------------------------------------------------------------- */

/* Delete context `key` in its own transaction. */
static kvdb_status delete_ctx(kvdb *db, const uint8_t key[16])
{
  kv_txn *txn;
  uint64_t freed;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = kv_delete_ctx_txn(db, txn, key, &freed);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

/* Delete a context the plan pushed off the last tier (its own transaction). Written back to
 * the remote tier first (KVDB_REMOTE_WRITE_EVICT) unless the plan's model had that tier:
 * then the utility chose to drop it rather than keep it there. */
static kvdb_status evict(kvdb *db, const uint8_t key[16], int plan_remote)
{
  if (!plan_remote)
    kv_rtier_note_evict(db, key); /* write-back to the remote tier, when asked for */
  return delete_ctx(db, key);
}

/* Move a context to the remote tier: its blocks written to Redis, then deleted here (its own
 * transaction), whatever Redis answered: the plan counts on the room (blocks not taken are
 * counted, and the context is a miss there, never wrong KV). */
static kvdb_status to_remote(kvdb *db, const uint8_t key[16], kvdb_rebalance_report *rep)
{
  uint32_t n = 0, took = 0;
  if (kv_rtier_write_ctx(db, key, &n, &took) != 0)
    return kv_fail(KVDB_INVALID, "a plan move to the remote tier, and this handle has none it "
                   "writes (kvdb_options.remote_addr)");
  if (took < n) {
    char hx[33];
    kv_log(&db->log, 1, "placement: %u of the %u blocks of context %s did not reach the remote "
           "tier; deleted here as planned", n - took, n, kv_hex16(key, hx));
    rep->remote_unwritten += n - took;
  }
  return delete_ctx(db, key);
}

/* Where a context is now: its config, tier and model (KVDB_NOTFOUND when gone). */
static kvdb_status ctx_now(kvdb *db, const uint8_t key[16], kvdb_config *cfg, uint32_t *tier,
                           pmodel *pm)
{
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_ctx_rec cr;
  kvdb_status rc = kv_cat_get_ctx(&db->cat, txn, key, &cr);
  if (rc == KVDB_OK) {
    *cfg = cr.config;
    *tier = kv_ctx_tier(db, txn, &cr);
    memcpy(pm->hash, cr.model, 16);
    rc = kv_model_by_hash(db, txn, cr.model, pm->id, &pm->rec);
  }
  kv_txn_abort(txn);
  return rc;
}

/* Record tiers and DRAM flags of the moved contexts; with `bump`, bump place_gen (every
 * handle then rebuilds its DRAM admission set). */
static kvdb_status record_flags(kvdb *db, const kvdb_place_move *mv, size_t n, const uint8_t *done,
                                uint64_t now_ms, int bump)
{
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = KVDB_OK;
  for (size_t i = 0; i < n && rc == KVDB_OK; i++) {
    if (!done[i] || mv[i].to_tier == KVDB_TIER_NONE || mv[i].to_tier == KVDB_TIER_REMOTE)
      continue;
    kv_ctx_rec cr;
    if (kv_cat_get_ctx(&db->cat, txn, mv[i].context.b, &cr) != KVDB_OK) {
      kv_clear_error(); /* deleted since */
      continue;
    }
    kv_ctxstats cs;
    if (kv_cat_get_ctxstats(&db->cat, txn, mv[i].context.b, &cs) != KVDB_OK) {
      kv_clear_error(); /* none kept yet: one access at its last access time */
      memset(&cs, 0, sizeof cs);
      cs.freq = 1.0;
      cs.freq_ms = cr.last_access_ms < now_ms ? cr.last_access_ms : now_ms;
    }
    cs.tier = kv_ctx_tier(db, txn, &cr);
    cs.flags = mv[i].to_cached ? KV_CTXS_CACHED : 0;
    rc = kv_cat_put_ctxstats(&db->cat, txn, mv[i].context.b, &cs);
  }
  if (rc == KVDB_OK && bump)
    rc = kv_place_bump_gen(db, txn, NULL);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

/*
 * Carry out moves mv[*next..n) of a plan, one step: at most max_moves of them (0: no limit;
 * skipped ones count), and none more once the stored bytes of the relocations done reach
 * max_bytes (0: no limit; the first move is always made); then the DRAM flags of the moved
 * contexts. place_gen is bumped (every handle reloads its admission set) when a flag changed
 * in the step or the step ends the plan. *next becomes the first move not made (on an error,
 * the one that failed).
 */
static kvdb_status execute_step(kvdb *db, const kvdb_place_move *mv, size_t n, size_t *next,
                                uint64_t max_moves, uint64_t max_bytes, int plan_remote,
                                kvdb_rebalance_report *rep)
{
  memset(rep, 0, sizeof *rep);
  size_t i0 = *next;
  if (i0 >= n)
    return KVDB_OK;
  uint8_t *done = calloc(n - i0, 1);
  if (done == NULL)
    return kv_fail(KVDB_NOMEM, "plan execution");
  kvdb_status rc = KVDB_OK;
  uint64_t bytes = 0;
  size_t i;
  for (i = i0; i < n; i++) {
    if (i > i0 && ((max_moves > 0 && i - i0 >= max_moves) || (max_bytes > 0 && bytes >= max_bytes)))
      break;
    kvdb_config cfg;
    uint32_t tier;
    pmodel pm;
    rc = ctx_now(db, mv[i].context.b, &cfg, &tier, &pm);
    if (rc == KVDB_NOTFOUND ||
        (rc == KVDB_OK && (!kv_policy_config_equal(&cfg, &mv[i].from_config) ||
                           tier != mv[i].from_tier))) {
      kv_clear_error(); /* gone or changed since the plan */
      rc = KVDB_OK;
      rep->skipped++;
      continue;
    }
    if (rc != KVDB_OK)
      break;
    if (mv[i].to_tier == KVDB_TIER_NONE || mv[i].to_tier == KVDB_TIER_REMOTE) {
      int remote = mv[i].to_tier == KVDB_TIER_REMOTE;
      rc = remote ? to_remote(db, mv[i].context.b, rep)
                  : evict(db, mv[i].context.b, plan_remote);
      rep->to_remote += remote && rc == KVDB_OK;
      if (rc == KVDB_NOTFOUND) {
        kv_clear_error();
        rc = KVDB_OK;
        rep->skipped++;
      } else if (rc == KVDB_OK) {
        rep->deleted++;
        done[i - i0] = 1;
      } else {
        break;
      }
      continue;
    }
    int new_cfg = !kv_policy_config_equal(&mv[i].to_config, &cfg);
    if (new_cfg || mv[i].to_tier != tier) {
      kvdb_model km = model_of(&pm);
      rc = kv_relocate(db, &km, mv[i].context.b, new_cfg ? &mv[i].to_config : NULL,
                       mv[i].to_tier, NULL, 1); /* plans target SmartSSD only when it is set */
      if (rc == KVDB_BUSY || rc == KVDB_NOTFOUND) { /* changed meanwhile: the next placement */
        kv_clear_error();
        rc = KVDB_OK;
        rep->skipped++;
        continue;
      }
      if (rc != KVDB_OK)
        break;
      rep->relocated++;
      bytes += mv[i].to_bytes;
    }
    done[i - i0] = 1;
    rep->cache_changes += mv[i].to_cached != mv[i].from_cached;
  }
  *next = i; /* on an error: the move that failed */
  if (rc == KVDB_OK) {
    int bump = rep->cache_changes > 0 || i == n;
    rc = record_flags(db, mv + i0, i - i0, done, kv_now_ms(), bump);
    if (rc == KVDB_OK && bump)
      rc = kv_place_reload(db);
  }
  free(done);
  return rc;
}

/* Carry out moves mv[0..n) in one step. */
static kvdb_status execute(kvdb *db, const kvdb_place_move *mv, size_t n, int plan_remote,
                           kvdb_rebalance_report *rep)
{
  size_t next = 0;
  return execute_step(db, mv, n, &next, 0, 0, plan_remote, rep);
}

/* Write this handle's pending access counts (a read-write handle). */
static kvdb_status flush_accesses(kvdb *db)
{
  if (db->cat.rdonly)
    return KVDB_OK;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = kv_flush_atime(db, txn);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

/* The instance as of the catalog now. */
static kvdb_status inst_now(kvdb *db, pinst *in)
{
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = inst_build(db, txn, in, 1);
  kv_txn_abort(txn);
  return rc;
}

/* ---- after a put ------------------------------------------------------------------------- */

/*
 * BETWEEN PUTS. Algorithm 1 after a put looks at every context only when a tier overflows:
 * the incoming context takes its best (tier, config) whatever the others are, and only an
 * over-full tier makes the others move. So the handle keeps a view of the tiers (the policy's
 * bytes on each, kv_place_view) and a put first places its context alone (a one-context
 * instance with unlimited tiers: its best place); when that place fits beside the view's bytes
 * on every tier, the outcome is Algorithm 1's and only the incoming context is read and moved.
 * Otherwise, when only the DRAM tier overflows and the incremental state holds, the DRAM
 * tier's cascade runs alone (INCREMENTAL ADMISSION, below). Otherwise (or without a valid
 * view) the whole instance is built from the catalog and the rule runs over every context, resolving the tiers down to placement_slack_pct below
 * their capacities (slack 0: exactly to them), so that the next puts fit in the room it left
 * and the O(contexts) run comes once per that much data instead of on every put. The view is
 * right as of a catalog txn id; it is rebuilt when anything but this handle has committed
 * since (kv_cat_own_since: another handle or process wrote) or this handle changed the tiers
 * outside the placement (kv_place_view_drop), and after a run whose moves were not all made.
 * Deletes only free bytes: the view then overstates the tiers, which costs an earlier full
 * run, never an over-full tier.
 */

/*
 * INCREMENTAL ADMISSION (issue 17, must-have 1). The run over every context above is needed on
 * a put only when the put's best place does not fit beside the view, and at the default tiers
 * (SSD unlimited, a small DRAM tier) that is the DRAM tier: the put wants to be cached and the
 * tier is full. On that tier the greedy's only operation is leaving it (every config but a
 * token-dropping one holds the same decoded bytes there), and the per-byte rules take those
 * operations cheapest first: the cascade uncaches the contexts whose utility gain from the DRAM
 * tier per DRAM byte (their density: U cached minus U at their best option uncached, over
 * their decoded bytes) is least. So the handle keeps, between puts and beside the view, the
 * contexts the last run over every context left cached, in a min-heap by density (with a map
 * from key to heap slot; puts and promotions that fit join it), and a put whose only
 * over-full tier is DRAM is admitted by that cascade alone: it takes the tier when its density
 * beats the least dense ones that must leave to make room (their flags cleared in the put's own
 * transaction; their blocks leave the DRAM admission set, kv_place_want_change), else it stays
 * uncached. A context leaving DRAM keeps its stored config unless another gains more than
 * KV_INC_MARGIN uncached (greedy.c keep_configs' rule): that re-encoding is made right after the
 * put's commit (inc_unc_move, kv_place_after_put). O(log n) per context moved, no scan.
 * Densities decay with the access counts, all at the same rate (U is linear in the decayed
 * frequency), so a heap key is the density's log2 plus the time in half-lives: keys taken at
 * different times compare as the densities would now. A context accessed since its key was
 * taken (a get) is denser than its key says: when it comes up for eviction its key is taken
 * again from its access record in the put's transaction and it goes back into the heap.
 * What the cascade does not do that a run over every context does: the refill (room a cascade
 * leaves is not filled with smaller contexts), the guard and exchanges of the default rule, a
 * context on another tier than the SSD moving. Bound: the state is rebuilt by a run over every
 * context after as many incremental admissions as there were contexts at the last run (at
 * least KV_INC_MIN: O(1) amortized per put), whenever the view is rebuilt (another handle
 * wrote, a relocation outside the placement, a reopen: it starts invalid, a promotion that ran
 * over every context), and on any overflow of another tier; Algorithm 1 as the paper has it
 * (KVDB_PLACEMENT_LEAST_DROP, not per byte) always runs over every context. Measured:
 * test_place.c test_place_incremental (>= 0.999 of the utility a run over every context
 * plans, after a reopen too) and `kvdb-bench policy` part 6 (put_utility_vs_full_*).
 */

#define KV_INC_MIN 1024
/* A put keeps its written config when uncached unless another gains more than this share of
 * that one's utility (policy/greedy.c's POL_MARGIN, keep_configs' rule for stored contexts) */
#define KV_INC_MARGIN 1e-4

typedef struct inc_ent {
  double key;     /* log2(density) + time in half-lives */
  double lf;      /* the frequency it was taken at: log2(f) + time in half-lives */
  uint64_t bytes; /* its bytes in the DRAM tier (the policy's) */
  uint8_t ctx[16];
} inc_ent;

/* The map from key to heap slot: open addressing, linear probing, its own copy of the key. */
typedef struct inc_slot {
  uint8_t ctx[16];
  uint32_t at; /* heap index + 1 (0: free) */
} inc_slot;

typedef struct kv_place_inc {
  int valid;
  uint64_t left;  /* incremental admissions before the next run over every context */
  double half_life_s; /* the settings' (keys are in its units) */
  inc_ent *h;     /* min-heap by key */
  size_t n, cap;
  inc_slot *slot; /* mcap (a power of two, >= 2 n) entries */
  size_t mcap;
  uint64_t admitted, uncached, evicted; /* counters since open (logs) */
  /* a put's cascade between its transaction and its commit (the run lock is held through):
   * the contexts it takes out of DRAM (popped from the heap), their blocks, its own entry */
  inc_ent *ev;
  size_t n_ev, cap_ev;
  uint8_t *ev_blocks;
  size_t n_ev_blocks, cap_ev_blocks;
  inc_ent pend;
  uint64_t pend_old;        /* bytes of an entry of the same key the put replaced */
  int pending, pend_cache;  /* a put placed in its transaction; cached */
  int pend_casc;            /* by the cascade */
} kv_place_inc;

static void inc_free(void *p)
{
  kv_place_inc *s = p;
  if (s == NULL)
    return;
  free(s->h);
  free(s->slot);
  free(s->ev);
  free(s->ev_blocks);
  free(s);
}

static kv_place_inc *inc_of(kvdb *db)
{
  kv_place_view *v = kv_place_view_of(db);
  if (v->inc == NULL) {
    v->inc = calloc(1, sizeof(kv_place_inc));
    v->inc_free = inc_free;
  }
  return v->inc;
}

static size_t inc_home(const kv_place_inc *s, const uint8_t k[16])
{
  uint64_t h;
  memcpy(&h, k, 8);
  return (size_t)(h ^ (h >> 31)) & (s->mcap - 1);
}

/* The map slot of key k (a free one when absent); mcap > 0. */
static size_t inc_mslot(const kv_place_inc *s, const uint8_t k[16])
{
  size_t i = inc_home(s, k);
  while (s->slot[i].at && memcmp(s->slot[i].ctx, k, 16) != 0)
    i = (i + 1) & (s->mcap - 1);
  return i;
}

/* Free map slot i (backward-shift deletion). */
static void inc_mdel(kv_place_inc *s, size_t i)
{
  s->slot[i].at = 0;
  for (size_t j = (i + 1) & (s->mcap - 1); s->slot[j].at; j = (j + 1) & (s->mcap - 1)) {
    size_t home = inc_home(s, s->slot[j].ctx);
    if (((j - home) & (s->mcap - 1)) >= ((j - i) & (s->mcap - 1))) {
      s->slot[i] = s->slot[j];
      s->slot[j].at = 0;
      i = j;
    }
  }
}

/* h[at] = e, and e's map slot says so (e's key is in the map). */
static void inc_set(kv_place_inc *s, size_t at, const inc_ent *e)
{
  s->h[at] = *e;
  s->slot[inc_mslot(s, e->ctx)].at = (uint32_t)at + 1;
}

static void inc_up(kv_place_inc *s, size_t i)
{
  inc_ent e = s->h[i];
  while (i > 0 && s->h[(i - 1) / 2].key > e.key) {
    inc_set(s, i, &s->h[(i - 1) / 2]);
    i = (i - 1) / 2;
  }
  inc_set(s, i, &e);
}

static void inc_down(kv_place_inc *s, size_t i)
{
  inc_ent e = s->h[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= s->n)
      break;
    if (c + 1 < s->n && s->h[c + 1].key < s->h[c].key)
      c++;
    if (!(s->h[c].key < e.key))
      break;
    inc_set(s, i, &s->h[c]);
    i = c;
  }
  inc_set(s, i, &e);
}

/* Add e (its key must not be there); -1 when out of memory. */
static int inc_push(kv_place_inc *s, const inc_ent *e)
{
  if (s->n + 1 > s->cap) {
    size_t nc = s->cap ? 2 * s->cap : 256;
    inc_ent *nh = realloc(s->h, nc * sizeof *nh);
    if (nh == NULL)
      return -1;
    s->h = nh;
    s->cap = nc;
  }
  if (2 * (s->n + 1) > s->mcap) {
    size_t nm = s->mcap ? 2 * s->mcap : 512;
    inc_slot *ns = calloc(nm, sizeof *ns);
    if (ns == NULL)
      return -1;
    free(s->slot);
    s->slot = ns;
    s->mcap = nm;
    for (size_t i = 0; i < s->n; i++) {
      size_t m = inc_mslot(s, s->h[i].ctx);
      memcpy(s->slot[m].ctx, s->h[i].ctx, 16);
      s->slot[m].at = (uint32_t)i + 1;
    }
  }
  size_t m = inc_mslot(s, e->ctx);
  memcpy(s->slot[m].ctx, e->ctx, 16);
  s->h[s->n++] = *e;
  s->slot[m].at = (uint32_t)s->n;
  inc_up(s, s->n - 1);
  return 0;
}

/* Remove the entry at heap index i. */
static void inc_remove_at(kv_place_inc *s, size_t i)
{
  inc_mdel(s, inc_mslot(s, s->h[i].ctx));
  s->n--;
  if (i == s->n)
    return;
  s->h[i] = s->h[s->n];
  s->slot[inc_mslot(s, s->h[i].ctx)].at = (uint32_t)i + 1;
  if (i > 0 && s->h[(i - 1) / 2].key > s->h[i].key)
    inc_up(s, i);
  else
    inc_down(s, i);
}

/* Remove context k when it is there (*e: its entry, when e is not NULL); 1 when it was. */
static int inc_remove(kv_place_inc *s, const uint8_t k[16], inc_ent *e)
{
  if (s->mcap == 0)
    return 0;
  size_t ms = inc_mslot(s, k);
  if (!s->slot[ms].at)
    return 0;
  size_t i = s->slot[ms].at - 1;
  if (e != NULL)
    *e = s->h[i];
  inc_remove_at(s, i);
  return 1;
}

static void inc_reset(kv_place_inc *s)
{
  s->valid = 0;
  s->n = 0;
  if (s->slot != NULL)
    memset(s->slot, 0, s->mcap * sizeof *s->slot);
}

/* The state as this handle may use it now: valid with the view, else NULL. */
static kv_place_inc *inc_valid(kvdb *db, const kv_place_view *v)
{
  kv_place_inc *s = v->inc;
  if (s == NULL || !v->valid || !s->valid || s->left == 0 ||
      db->opt.placement == KVDB_PLACEMENT_LEAST_DROP)
    return NULL;
  return s;
}

/* Context c's heap entry at place pl (cached) in an instance with params p, as of now_ms. */
static inc_ent inc_entry(const kv_policy_params *p, const kv_policy_context *c,
                         kv_policy_place pl, uint64_t now_ms, double half_life_s)
{
  inc_ent e;
  memset(&e, 0, sizeof e);
  const kv_policy_option *o = &c->options[pl.option];
  e.bytes = o->decoded_bytes ? o->decoded_bytes : c->raw_bytes;
  double un = -INFINITY; /* out of DRAM: its best option on its tier (the greedy's drop) */
  for (uint32_t k = 0; k < c->n_options; k++) {
    double u = kv_policy_utility(p, c, (kv_policy_place){pl.tier, (int32_t)k, 0});
    un = u > un ? u : un;
  }
  double g = kv_policy_utility(p, c, pl) - un;
  double d = g / (double)(e.bytes > 0 ? e.bytes : 1);
  double t = half_life_s > 0 ? (double)now_ms / (half_life_s * 1000.0) : 0;
  e.key = d > 0 ? log2(d) + t : -1e300;
  e.lf = c->frequency > 0 ? log2(c->frequency) + t : -1e300;
  return e;
}

/* The frequency of an access record in inc_ent.lf's terms. */
static double inc_lf(const kv_ctxstats *cs, double half_life_s)
{
  if (!(cs->freq > 0))
    return -1e300;
  return log2(cs->freq) + (half_life_s > 0 ? (double)cs->freq_ms / (half_life_s * 1000.0) : 0);
}

/* What alone_plan says of the incoming context beside the plan. */
typedef struct alone_info {
  int cached;    /* its best place is cached in the DRAM tier (ent: its heap entry) */
  int dram_over; /* it fits on every tier but DRAM, and not there */
  int keep_unc;  /* uncached, its config (the plan's) is within KV_INC_MARGIN of the best */
  uint64_t dram_cap;
  inc_ent ent;
} alone_info;

/* The incoming context placed alone, as of txn: *ok = 1 when that place fits beside the view
 * on every tier; *pub is its plan either way and add[] what it adds to the view's kvdb tiers;
 * *gone = 1 when the context is not there. ai (NULL: not asked): see alone_info. */
static kvdb_status alone_plan(kvdb *db, kv_txn *txn, const kv_place_view *v, const uint8_t key[16],
                              int in_view, kvdb_place_plan *pub, uint64_t add[KVDB_TIER_COUNT],
                              int *ok, int *gone, alone_info *ai)
{
  *ok = 0;
  *gone = 0;
  memset(pub, 0, sizeof *pub);
  memset(add, 0, KVDB_TIER_COUNT * sizeof *add);
  if (ai != NULL)
    memset(ai, 0, sizeof *ai);
  pinst in;
  KV_RET(inst_one(db, txn, key, &in));
  if (in.n == 0) { /* deleted meanwhile */
    *gone = 1;
    return KVDB_OK;
  }
  uint64_t cap[KV_POLICY_MAX_TIERS];
  for (uint32_t t = 0; t < in.n_tiers; t++) {
    cap[t] = in.tiers[t].capacity_bytes;
    in.tiers[t].capacity_bytes = KV_POLICY_UNLIMITED;
  }
  kv_policy_plan plan;
  kv_policy_err perr;
  size_t zero = 0;
  kvdb_status rc = kv_policy_admit(&in.p, in.pc, 1, &zero, 1, &plan, &perr);
  if (rc != KVDB_OK) {
    inst_free(&in);
    return kv_fail(rc, "placement: %s", perr.msg);
  }
  /* a put's context is not in the view yet; a promoted one is, where it is now */
  for (uint32_t t = 0; t < in.n_tiers; t++)
    add[in.ktier[t]] = plan.used_after[t] -
                       (in_view && plan.used_before[t] <= plan.used_after[t] ? plan.used_before[t] : 0);
  int fits = 1, other = 1;
  for (uint32_t t = 0; t < in.n_tiers; t++) {
    int f = cap[t] == KV_POLICY_UNLIMITED || v->used[in.ktier[t]] + add[in.ktier[t]] <= cap[t];
    fits &= f;
    if (in.ktier[t] != KVDB_TIER_DRAM)
      other &= f;
  }
  kv_policy_place pl = plan.place[0];
  if (ai != NULL && pl.tier != KV_POLICY_NONE && pl.cached && in.ptier[KVDB_TIER_DRAM] == 0) {
    ai->cached = 1;
    ai->dram_over = other && !fits;
    ai->dram_cap = cap[0];
    ai->ent = inc_entry(&in.p, &in.pc[0], pl, in.now_ms, in.set.half_life_s);
    memcpy(ai->ent.ctx, key, 16);
    kv_policy_place un = pl;
    un.cached = 0;
    double u = kv_policy_utility(&in.p, &in.pc[0], un);
    ai->keep_unc = 1;
    for (uint32_t o = 0; o < in.pc[0].n_options && ai->keep_unc; o++) {
      kv_policy_place alt = {un.tier, (int32_t)o, 0};
      double ua = kv_policy_utility(&in.p, &in.pc[0], alt);
      ai->keep_unc = u >= ua - KV_INC_MARGIN * fabs(ua); /* greedy.c keep_configs' test */
    }
  }
  rc = to_public(&in, &plan, pub);
  kv_policy_plan_free(&plan);
  inst_free(&in);
  if (rc != KVDB_OK)
    kvdb_place_plan_free(pub);
  *ok = fits && rc == KVDB_OK;
  return rc;
}

/* The incoming context placed alone; *fits = 1 when that place fits beside the view on every
 * tier (then it is carried out and added to the view). */
static kvdb_status admit_alone(kvdb *db, kv_place_view *v, const uint8_t key[16], int in_view,
                               int *fits)
{
  *fits = 0;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_place_plan pub;
  uint64_t add[KVDB_TIER_COUNT];
  int ok, gone;
  alone_info ai;
  kvdb_status rc = alone_plan(db, txn, v, key, in_view, &pub, add, &ok, &gone, &ai);
  kv_txn_abort(txn);
  KV_RET(rc);
  if (gone) {
    *fits = 1;
    return KVDB_OK;
  }
  if (!ok) {
    kvdb_place_plan_free(&pub);
    return KVDB_OK;
  }
  kvdb_rebalance_report rep;
  /* the remote tier is left out of this one-context model: it reads no better than the last
   * local tier, which is unlimited here, so it would change no place; but a context dropped
   * here is dropped by the utility all the same (no write-back) when the tier is there */
  kv_tier_perf rf;
  int remote = kv_rtier_figures(db, &rf) == 0;
  rc = execute(db, pub.moves, pub.n_moves, remote, &rep);
  kvdb_place_plan_free(&pub);
  if (rc == KVDB_OK && rep.skipped == 0) {
    for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
      v->used[t] += add[t];
    *fits = 1;
    kv_place_inc *s = inc_valid(db, v);
    if (s != NULL) { /* the heap holds the cached contexts: this one's entry as placed now */
      inc_remove(s, key, NULL);
      if (ai.cached && inc_push(s, &ai.ent) != 0)
        s->valid = 0;
    }
  } else {
    v->valid = 0;
  }
  return rc;
}

/*
 * PROMOTION. A get of a context that is not in the DRAM tier (placement on, any rule but
 * KVDB_PLACEMENT_LEAST_DROP: Algorithm 1 as the paper has it never promotes) counts the access
 * asks whether caching it pays (a read transaction; the accesses noted and not yet written count
 * too): its utility
 * cached (same tier and config) minus where it is,
 * per byte it would take in DRAM, against the least such gain among the contexts cached: the
 * incremental state's heap minimum taken now when it holds (INCREMENTAL ADMISSION), else
 * promote_per_byte, that of the last run over every context (0 without one: any gain). When it beats it
 * by KV_PROMOTE_MARGIN,
 * the context is placed again as an incoming one: alone when that fits beside the view (it is
 * then cached, and the DRAM tier admits it for the next get), else by the greedy over every
 * context, which may uncache others or leave it out. A context worth less per byte than every
 * one cached costs a read transaction per get.
 */

/* Promotion needs this much more gain per byte than the least cached context has: contexts of
 * about equal heat do not take each other's place on every get. */
#define KV_PROMOTE_MARGIN 1.25

/* The least utility gain per DRAM byte among the contexts `place` caches (0: none). */
static double promote_threshold(const pinst *in, const kv_policy_place *place)
{
  double least = INFINITY;
  for (size_t i = 0; i < in->n; i++) {
    if (!place[i].cached || place[i].tier == KV_POLICY_NONE)
      continue;
    kv_policy_place un = place[i];
    un.cached = 0;
    const kv_policy_option *o = &in->pc[i].options[place[i].option];
    double b = (double)(o->decoded_bytes ? o->decoded_bytes : in->pc[i].raw_bytes);
    double g = (kv_policy_utility(&in->p, &in->pc[i], place[i]) -
                kv_policy_utility(&in->p, &in->pc[i], un)) / (b > 0 ? b : 1);
    least = g < least ? g : least;
  }
  return isfinite(least) && least > 0 ? least : 0;
}

/* Whether context `key` (as the catalog has it now) gains more from the DRAM tier per byte than
 * `threshold`: *yes. */
static kvdb_status promote_pays(kvdb *db, const uint8_t key[16], double threshold, int *yes)
{
  *yes = 0;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  pinst in;
  kvdb_status rc = inst_one(db, txn, key, &in);
  kv_txn_abort(txn);
  KV_RET(rc);
  if (in.n == 1 && in.ptier[KVDB_TIER_DRAM] == 0 && in.pc[0].current.tier != KV_POLICY_NONE &&
      !in.pc[0].current.cached) {
    in.pc[0].frequency += (double)kv_pending_accesses(db, key); /* not written yet */
    kv_policy_place cur = in.pc[0].current, up = cur;
    up.cached = 1;
    const kv_policy_option *o = &in.pc[0].options[cur.option];
    double b = (double)(o->decoded_bytes ? o->decoded_bytes : in.pc[0].raw_bytes);
    double g = (kv_policy_utility(&in.p, &in.pc[0], up) -
                kv_policy_utility(&in.p, &in.pc[0], cur)) / (b > 0 ? b : 1);
    *yes = g > 0 && g > threshold * KV_PROMOTE_MARGIN;
  }
  inst_free(&in);
  return KVDB_OK;
}

static kvdb_status admit_all(kvdb *db, kv_place_view *v, const uint8_t key[16], double slack_pct,
                             int cache_only);

static kvdb_status promote(kvdb *db, const uint8_t key[16])
{
  kv_place_view *v = kv_place_view_of(db);
  int yes;
  double thr = v->promote_per_byte;
  kv_place_inc *s = inc_valid(db, v);
  if (s != NULL && s->n > 0 && s->h[0].key > -1e300) /* the least dense cached context now */
    thr = exp2(s->h[0].key - (s->half_life_s > 0 ? (double)kv_now_ms() /
                                                       (s->half_life_s * 1000.0) : 0));
  KV_RET(promote_pays(db, key, thr, &yes));
  if (!yes)
    return KVDB_OK;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn)); /* the accesses count */
  uint64_t touch = kv_txn_id(txn);
  kvdb_status rc = kv_flush_atime(db, txn);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  KV_RET(kv_txn_commit(txn));
  if (v->valid && !kv_cat_own_since(&db->cat, v->txnid, touch))
    v->valid = 0;
  if (v->valid) {
    int fits;
    rc = admit_alone(db, v, key, 1, &fits);
    if (rc != KVDB_OK || fits) {
      if (rc == KVDB_OK && v->valid)
        v->txnid = touch;
      return rc;
    }
  }
  /* a get never moves or deletes a stored context: of the whole run only the DRAM tier's
   * admissions and evictions are carried out */
  return admit_all(db, v, key, db->opt.placement_slack_pct, 1);
}

void kv_place_after_get(kvdb *db, const uint8_t key[16])
{
  if (db->place == NULL || db->opt.placement == KVDB_PLACEMENT_LEAST_DROP || db->cat.rdonly ||
      kv_place_dram_admits(db, key)) /* cached already (or its last block is) */
    return;
  pthread_mutex_lock(kv_place_run_lock(db));
  kvdb_status rc = promote(db, key);
  pthread_mutex_unlock(kv_place_run_lock(db));
  if (rc != KVDB_OK) {
    char hx[33];
    kv_log(&db->log, 1, "placement: promotion of %s: %s", kv_hex16(key, hx), kvdb_errmsg());
  }
  kv_clear_error();
}

/* The part of a plan that changes DRAM admissions only (a promotion's): a move whose stored
 * copy stays (same tier, same config) is kept; one that moves, re-encodes or deletes it is
 * dropped, except that a context the plan takes out of the DRAM tier still leaves it.
 * Returns the moves kept (in place, in order). */
static size_t cache_moves_only(kvdb_place_move *mv, size_t n)
{
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    kvdb_place_move m = mv[i];
    int stays = m.to_tier != KVDB_TIER_NONE && m.to_tier == m.from_tier &&
                memcmp(&m.to_config, &m.from_config, sizeof m.to_config) == 0;
    if (!stays) {
      if (!(m.from_cached && !m.to_cached) || m.from_tier == KVDB_TIER_NONE)
        continue;
      m.to_tier = m.from_tier; /* leave the DRAM tier, stay where it is stored */
      m.to_config = m.from_config;
      m.to_bytes = m.from_bytes;
      m.utility_to = m.utility_from;
    }
    if (m.from_cached != m.to_cached)
      mv[k++] = m;
  }
  return k;
}

/* Algorithm 1 over every context (the incoming one, if any, first takes its best place), the
 * tiers resolved to `slack_pct` below their capacities; the view is rebuilt from the plan.
 * cache_only: only the plan's DRAM admissions and evictions are carried out
 * (cache_moves_only), and the view is left to be rebuilt. */
/* The incremental state from a run's plan: the contexts it caches, by density. */
static void inc_build(kv_place_inc *s, const pinst *in, const kv_policy_place *place)
{
  inc_reset(s);
  if (in->ptier[KVDB_TIER_DRAM] != 0)
    return;
  for (size_t i = 0; i < in->n; i++) {
    if (!place[i].cached || place[i].tier == KV_POLICY_NONE)
      continue;
    inc_ent e = inc_entry(&in->p, &in->pc[i], place[i], in->now_ms, in->set.half_life_s);
    memcpy(e.ctx, in->meta[i].key, 16);
    if (inc_push(s, &e) != 0) {
      inc_reset(s);
      return;
    }
  }
  s->left = in->n > KV_INC_MIN ? in->n : KV_INC_MIN;
  s->half_life_s = in->set.half_life_s;
  s->valid = 1; /* used once the view is valid too */
}

static kvdb_status admit_all(kvdb *db, kv_place_view *v, const uint8_t key[16], double slack_pct,
                             int cache_only)
{
  v->valid = 0;
  kv_place_inc *s = inc_of(db);
  if (s != NULL)
    inc_reset(s);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  uint64_t snap = kv_txn_id(txn);
  pinst in;
  kvdb_status rc = inst_build(db, txn, &in, !cache_only);
  kv_txn_abort(txn);
  KV_RET(rc);
  size_t idx = in.n;
  for (size_t i = 0; key != NULL && i < in.n; i++)
    if (memcmp(in.meta[i].key, key, 16) == 0)
      idx = i;
  for (uint32_t t = 0; t < in.n_tiers; t++)
    if (in.tiers[t].capacity_bytes != KV_POLICY_UNLIMITED)
      in.tiers[t].capacity_bytes -= (uint64_t)((double)in.tiers[t].capacity_bytes * slack_pct / 100);
  kv_policy_plan plan;
  kv_policy_err perr;
  kvdb_place_plan pub;
  memset(&pub, 0, sizeof pub);
  rc = kv_policy_admit(&in.p, in.pc, in.n, &idx, idx < in.n ? 1 : 0, &plan, &perr);
  if (rc != KVDB_OK) {
    rc = kv_fail(rc, "placement: %s", perr.msg);
  } else {
    v->promote_per_byte = promote_threshold(&in, plan.place);
    if (s != NULL && !cache_only)
      inc_build(s, &in, plan.place);
    rc = to_public(&in, &plan, &pub);
    kv_policy_plan_free(&plan);
  }
  inst_free(&in);
  if (rc == KVDB_OK) {
    kvdb_rebalance_report rep;
    size_t planned = pub.n_moves;
    if (cache_only)
      pub.n_moves = cache_moves_only(pub.moves, pub.n_moves);
    rc = execute(db, pub.moves, pub.n_moves, pub.remote, &rep);
    if (cache_only)
      rep.skipped += planned - pub.n_moves; /* the view does not hold: rebuilt next time */
    kv_log(&db->log, 2, "placement: Algorithm 1 over %" PRIu64 " contexts (slack %g%%): %zu "
           "moves", pub.n_contexts, slack_pct, pub.n_moves);
    if (rc == KVDB_OK && rep.skipped == 0) {
      memcpy(v->used, pub.bytes_after, sizeof v->used);
      v->txnid = snap;
      v->valid = 1;
    }
  }
  if (s != NULL && !v->valid)
    inc_reset(s);
  kvdb_place_plan_free(&pub);
  return rc;
}

/* Place context `key` after its put's commit (access 1) or after re-profiling (access 0).
 * `touched`: the put counted its access in its own transaction already (kv_place_put_hook). */
static kvdb_status admit(kvdb *db, const uint8_t key[16], int access, int touched)
{
  kv_txn *txn;
  uint64_t touch;
  if (touched) { /* the catalog as of now: the put's commit is among what the view checks */
    KV_RET(kv_txn_begin(&db->cat, 0, &txn));
    touch = kv_txn_id(txn);
    kv_txn_abort(txn);
  } else { /* a put is an access; pending accesses of this handle count too */
    KV_RET(kv_txn_begin(&db->cat, 1, &txn));
    touch = kv_txn_id(txn);
    kvdb_status rc = kv_flush_atime(db, txn);
    if (rc == KVDB_OK && access)
      rc = kv_place_touch(db, txn, key, kv_now_ms());
    if (rc != KVDB_OK) {
      kv_txn_abort(txn);
      return rc;
    }
    KV_RET(kv_txn_commit(txn));
  }
  kv_place_view *v = kv_place_view_of(db);
  /* the view holds when every commit since it was made is this handle's (the touch was one) */
  if (v->valid && !kv_cat_own_since(&db->cat, v->txnid, touch))
    v->valid = 0;
  if (v->valid && access) { /* a put: Algorithm 1's first step alone, when it fits */
    int fits;
    kvdb_status rc = admit_alone(db, v, key, 0, &fits);
    if (rc != KVDB_OK || fits) {
      if (rc == KVDB_OK && v->valid)
        v->txnid = touch;
      return rc;
    }
  }
  return admit_all(db, v, key, access ? db->opt.placement_slack_pct : 0, 0);
}

static void place_one(kvdb *db, const uint8_t key[16], int access, int touched, const char *why)
{
  if (db->place == NULL)
    return;
  pthread_mutex_lock(kv_place_run_lock(db));
  kvdb_status rc = admit(db, key, access, touched);
  pthread_mutex_unlock(kv_place_run_lock(db));
  if (rc != KVDB_OK) {
    char hx[33];
    kv_log(&db->log, 1, "placement %s %s: %s", why, kv_hex16(key, hx), kvdb_errmsg());
  }
  kv_clear_error();
}

/*
 * IN THE PUT'S TRANSACTION. A put with placement on counts its access (kv_place_touch) in its
 * own write transaction, and when the view holds and the context's best place alone fits
 * beside it (BETWEEN PUTS) with no move but the DRAM flag (kv_place_put_config had it written
 * in its placed config, on the tier it was written to), the flag and its tier go into the
 * same transaction too (with the place_gen bump when the flag is set), so such a put makes one
 * commit: before, the access and the flag were two commits of their own after the put's. The
 * run lock is only tried (its holders take the catalog's write lock under it: waiting here,
 * inside that lock, could deadlock); when it is busy, the view does not hold, the place does
 * not fit or needs a move, the placement runs after the commit as before, the access already
 * counted. The lock is held through the commit, so the view is updated only once the commit
 * is durable. A crash loses nothing of the put: its access and flag are in its commit.
 */
/* A context leaving the DRAM tier (its flag cleared in txn) keeps its stored config unless
 * another on its tier gains more than KV_INC_MARGIN of its utility uncached (greedy.c
 * keep_configs' test) and takes no more bytes: then that re-encoding is appended to st's moves,
 * carried out after the put's commit (kv_place_after_put). */
static kvdb_status inc_unc_move(kvdb *db, kv_txn *txn, const uint8_t key[16], kv_place_put *st)
{
  pinst in;
  KV_RET(inst_one(db, txn, key, &in));
  kvdb_status rc = KVDB_OK;
  if (in.n == 1 && in.pc[0].current.tier != KV_POLICY_NONE) {
    const kv_policy_context *c = &in.pc[0];
    kv_policy_place keep = c->current, best = keep;
    keep.cached = best.cached = 0;
    double uk = kv_policy_utility(&in.p, c, keep), ub = uk;
    for (uint32_t o = 0; o < c->n_options; o++) {
      kv_policy_place alt = {keep.tier, (int32_t)o, 0};
      double u = kv_policy_utility(&in.p, c, alt);
      if (u > ub && c->options[o].bytes <= c->options[keep.option].bytes) {
        ub = u;
        best = alt;
      }
    }
    if (!(uk >= ub - KV_INC_MARGIN * fabs(ub))) {
      kvdb_place_move *nm = realloc(st->moves, (st->n_moves + 1) * sizeof *nm);
      if (nm == NULL) {
        rc = kv_fail(KVDB_NOMEM, "placement: moves");
      } else {
        st->moves = nm;
        kvdb_place_move *m = &nm[st->n_moves++];
        memset(m, 0, sizeof *m);
        memcpy(m->context.b, key, 16);
        m->from_tier = m->to_tier = in.meta[0].tier;
        m->from_config = in.meta[0].cur;
        m->from_bytes = c->options[keep.option].bytes;
        m->to_config = c->options[best.option].config;
        m->to_bytes = c->options[best.option].bytes;
        m->utility_from = uk;
        m->utility_to = ub;
      }
    }
  }
  inst_free(&in);
  return rc;
}

/* The put's cascade on the DRAM tier (INCREMENTAL ADMISSION): the least dense cached contexts
 * leave while the tier is over `cap` and they are less dense than the incoming entry e; *cache
 * = 1 when that makes room (s->ev: those that leave), else 0 and the heap is as it was. */
static int inc_cascade(kvdb *db, kv_txn *txn, kv_place_inc *s, const inc_ent *e, uint64_t used,
                       uint64_t cap, int *cache)
{
  s->n_ev = 0;
  while (used > cap && s->n > 0 && s->h[0].key < e->key) {
    /* accessed since its key was taken (a get, counted in this transaction or before): its
     * density grew with its frequency; it goes back with the key it has now */
    kv_ctxstats cs;
    if (kv_cat_get_ctxstats(&db->cat, txn, s->h[0].ctx, &cs) == KVDB_OK) {
      double lf = inc_lf(&cs, s->half_life_s);
      if (lf > s->h[0].lf + 1e-9) {
        inc_ent r = s->h[0];
        r.key += lf - r.lf;
        r.lf = lf;
        s->h[0] = r;
        inc_down(s, 0);
        continue;
      }
    }
    kv_clear_error();
    if (s->n_ev == s->cap_ev) {
      size_t nc = s->cap_ev ? 2 * s->cap_ev : 16;
      inc_ent *ne = realloc(s->ev, nc * sizeof *ne);
      if (ne == NULL)
        break;
      s->ev = ne;
      s->cap_ev = nc;
    }
    s->ev[s->n_ev++] = s->h[0];
    used = used > s->h[0].bytes ? used - s->h[0].bytes : 0;
    inc_remove_at(s, 0);
  }
  *cache = used <= cap;
  if (!*cache) { /* denser than the incoming one: they stay, it is not cached */
    for (size_t i = 0; i < s->n_ev; i++)
      if (inc_push(s, &s->ev[i]) != 0)
        return -1;
    s->n_ev = 0;
  }
  return 0;
}

/* In the put's transaction: the contexts of s->ev leave the DRAM tier (their flags cleared;
 * one deleted meanwhile is skipped); their blocks are gathered in s->ev_blocks. *changed = 1
 * when a flag changed. */
static kvdb_status inc_uncache(kvdb *db, kv_txn *txn, kv_place_inc *s, int *changed)
{
  s->n_ev_blocks = 0;
  *changed = 0;
  for (size_t i = 0; i < s->n_ev; i++) {
    kv_ctx_rec cr;
    kv_ctxstats cs;
    if (kv_cat_get_ctx(&db->cat, txn, s->ev[i].ctx, &cr) != KVDB_OK ||
        kv_cat_get_ctxstats(&db->cat, txn, s->ev[i].ctx, &cs) != KVDB_OK) {
      kv_clear_error(); /* deleted since: its bytes leave the view all the same */
      continue;
    }
    if (!(cs.flags & KV_CTXS_CACHED))
      continue;
    cs.flags &= ~(uint32_t)KV_CTXS_CACHED;
    cs.tier = kv_ctx_tier(db, txn, &cr);
    KV_RET(kv_cat_put_ctxstats(&db->cat, txn, s->ev[i].ctx, &cs));
    /* FOLDED STATS: that may have rewritten the context record cr.blocks points into */
    KV_RET(kv_cat_get_ctx(&db->cat, txn, s->ev[i].ctx, &cr));
    *changed = 1;
    if (s->n_ev_blocks + cr.n_blocks > s->cap_ev_blocks) {
      size_t nc = s->cap_ev_blocks ? 2 * s->cap_ev_blocks : 64;
      while (nc < s->n_ev_blocks + cr.n_blocks)
        nc *= 2;
      uint8_t *nb = realloc(s->ev_blocks, 16 * nc);
      if (nb == NULL)
        return kv_fail(KVDB_NOMEM, "placement: blocks leaving DRAM");
      s->ev_blocks = nb;
      s->cap_ev_blocks = nc;
    }
    memcpy(s->ev_blocks + 16 * s->n_ev_blocks, cr.blocks, 16 * (size_t)cr.n_blocks);
    s->n_ev_blocks += cr.n_blocks;
  }
  return KVDB_OK;
}

static kvdb_status put_in_txn(kvdb *db, kv_txn *txn, const uint8_t key[16], void *arg)
{
  kv_place_put *st = arg;
  free(st->blocks);
  st->blocks = NULL;
  st->n_blocks = 0;
  st->placed = st->bump = 0;
  free(st->moves);
  st->moves = NULL;
  st->n_moves = 0;
  KV_RET(kv_place_touch(db, txn, key, kv_now_ms()));
  st->touched = 1;
  if (pthread_mutex_trylock(kv_place_run_lock(db)) != 0)
    return KVDB_OK; /* a placement is running: the put's is made after the commit */
  st->locked = 1;
  kv_place_view *v = kv_place_view_of(db);
  uint64_t id = kv_txn_id(txn);
  if (v->valid && !kv_cat_own_since(&db->cat, v->txnid, id - 1))
    v->valid = 0;
  if (!v->valid)
    return KVDB_OK;
  kvdb_place_plan pub;
  int ok, gone;
  alone_info ai;
  if (alone_plan(db, txn, v, key, 0, &pub, st->add, &ok, &gone, &ai) != KVDB_OK) {
    kv_clear_error(); /* the placement after the commit tries again and logs it */
    return KVDB_OK;
  }
  int flag_only = 1;
  for (size_t i = 0; flag_only && i < pub.n_moves; i++) {
    const kvdb_place_move *m = &pub.moves[i];
    flag_only = memcmp(m->context.b, key, 16) == 0 && m->to_tier != KVDB_TIER_NONE &&
                m->to_tier == m->from_tier && kv_policy_config_equal(&m->to_config, &m->from_config);
  }
  ok &= flag_only;
  int cache = ok && pub.n_moves > 0 && pub.moves[pub.n_moves - 1].to_cached;
  kv_place_inc *s = inc_valid(db, v);
  kvdb_status rc = KVDB_OK;
  if (s != NULL) {
    s->pending = s->pend_casc = 0;
    s->n_ev = 0;
    s->pend_old = 0;
    inc_ent old;
    if (!gone && inc_remove(s, key, &old)) /* a context of this key deleted and put again */
      s->pend_old = old.bytes;
  }
  if (!ok && !gone && flag_only && s != NULL && ai.cached && ai.dram_over && pub.n_moves > 0) { /* INCREMENTAL ADMISSION: the DRAM tier's cascade alone */
    uint64_t used = v->used[KVDB_TIER_DRAM] + st->add[KVDB_TIER_DRAM];
    used = used > s->pend_old ? used - s->pend_old : 0;
    if (inc_cascade(db, txn, s, &ai.ent, used, ai.dram_cap, &cache) != 0) {
      s->valid = 0;
      kvdb_place_plan_free(&pub);
      return KVDB_OK; /* out of memory: the run over every context after the commit */
    }
    if (!cache)
      st->add[KVDB_TIER_DRAM] = 0;
    s->pend_casc = 1;
    ok = 1;
  }
  if (s != NULL && ok && !gone) {
    s->pending = 1;
    s->pend = ai.ent;
    memcpy(s->pend.ctx, key, 16);
    s->pend_cache = cache;
  }
  if (ok && !gone && pub.n_moves > 0) {
    kv_ctx_rec cr;
    kv_ctxstats cs;
    rc = kv_cat_get_ctx(&db->cat, txn, key, &cr);
    if (rc == KVDB_OK)
      rc = kv_cat_get_ctxstats(&db->cat, txn, key, &cs); /* the touch wrote it */
    if (rc == KVDB_OK) {
      int was = (cs.flags & KV_CTXS_CACHED) != 0;
      cs.tier = kv_ctx_tier(db, txn, &cr);
      cs.flags = cache ? KV_CTXS_CACHED : 0;
      rc = kv_cat_put_ctxstats(&db->cat, txn, key, &cs);
      if (rc == KVDB_OK) /* FOLDED STATS: it may have rewritten the record of cr.blocks */
        rc = kv_cat_get_ctx(&db->cat, txn, key, &cr);
      if (rc == KVDB_OK && was != cache) {
        rc = kv_place_bump_gen(db, txn, &st->gen_from);
        st->bump = 1;
      }
      if (rc == KVDB_OK && cache && cr.n_blocks > 0) {
        st->blocks = malloc(16 * (size_t)cr.n_blocks);
        if (st->blocks != NULL) {
          memcpy(st->blocks, cr.blocks, 16 * (size_t)cr.n_blocks);
          st->n_blocks = cr.n_blocks;
        }
      }
    }
    int changed = 0;
    if (rc == KVDB_OK && s != NULL && s->pending && s->n_ev > 0)
      rc = inc_uncache(db, txn, s, &changed);
    for (size_t i = 0; rc == KVDB_OK && s != NULL && s->pend_casc && i < s->n_ev; i++)
      rc = inc_unc_move(db, txn, s->ev[i].ctx, st);
    if (rc == KVDB_OK && s != NULL && s->pend_casc && !cache && !ai.keep_unc)
      rc = inc_unc_move(db, txn, key, st);
    if (rc == KVDB_OK && changed && !st->bump) {
      rc = kv_place_bump_gen(db, txn, &st->gen_from);
      st->bump = 1;
    }
  }
  kvdb_place_plan_free(&pub);
  if (rc == KVDB_OK && ok && !gone) {
    st->placed = 1;
    st->txnid = id;
  } else if (s != NULL && s->pending) {
    s->valid = 0; /* the contexts popped from the heap are not uncached: rebuilt next time */
    s->pending = 0;
  }
  return rc;
}

static void put_done(kvdb *db, kvdb_status commit_rc, void *arg)
{
  kv_place_put *st = arg;
  if (!st->locked)
    return;
  kv_place_view *v = kv_place_view_of(db);
  kv_place_inc *s = v->inc;
  int inc = s != NULL && s->pending;
  if (s != NULL)
    s->pending = 0;
  if (commit_rc != KVDB_OK) {
    st->placed = 0;
    v->valid = 0;
    if (s != NULL)
      s->valid = 0;
    free(st->moves); /* the put failed: kv_place_after_put is not called */
    st->moves = NULL;
    st->n_moves = 0;
  } else if (st->placed) {
    if (v->valid) {
      for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
        v->used[t] += st->add[t];
      v->txnid = st->txnid;
    }
    if (inc) { /* the heap follows the view: what left DRAM, the put's own entry */
      uint64_t *u = &v->used[KVDB_TIER_DRAM], out = s->pend_old;
      for (size_t i = 0; i < s->n_ev; i++)
        out += s->ev[i].bytes;
      *u = *u > out ? *u - out : 0;
      if (s->pend_cache && inc_push(s, &s->pend) != 0)
        s->valid = 0;
      if (s->pend_casc) {
        s->left--;
        s->admitted += s->pend_cache;
        s->uncached += !s->pend_cache;
        s->evicted += s->n_ev;
      }
    }
    if (st->bump &&
        !kv_place_want_change(db, st->blocks, st->blocks != NULL ? st->n_blocks : 0,
                              inc ? s->ev_blocks : NULL, inc ? s->n_ev_blocks : 0, st->gen_from,
                              st->gen_from + 1)) {
      if (kv_place_reload(db) != KVDB_OK) {
        kv_log(&db->log, 1, "placement after a put: DRAM admission set: %s", kvdb_errmsg());
        kv_clear_error(); /* advisory: the next get's refresh tries again */
      }
    }
  }
  if (s != NULL)
    s->n_ev = s->n_ev_blocks = 0;
  free(st->blocks);
  st->blocks = NULL;
  st->n_blocks = 0;
  st->locked = 0;
  pthread_mutex_unlock(kv_place_run_lock(db));
}

int kv_place_put_hook(kvdb *db, kv_place_put *st, kv_put_hook *h)
{
  memset(st, 0, sizeof *st);
  if (db->place == NULL || db->cat.rdonly)
    return 0;
  *h = (kv_put_hook){put_in_txn, put_done, st};
  return 1;
}

/* The re-encodings of contexts the put's cascade took out of DRAM (inc_unc_move), each in
 * its own transaction as a plan's move (skipped when the context changed since). */
static kvdb_status inc_moves(kvdb *db, const kvdb_place_move *mv, size_t n)
{
  kv_place_view *v = kv_place_view_of(db);
  for (size_t i = 0; i < n; i++) {
    kvdb_config cfg;
    uint32_t tier;
    pmodel pm;
    kvdb_status rc = ctx_now(db, mv[i].context.b, &cfg, &tier, &pm);
    if (rc == KVDB_NOTFOUND ||
        (rc == KVDB_OK && (!kv_policy_config_equal(&cfg, &mv[i].from_config) ||
                           tier != mv[i].from_tier))) {
      kv_clear_error();
      continue;
    }
    KV_RET(rc);
    kvdb_model km = model_of(&pm);
    rc = kv_relocate(db, &km, mv[i].context.b, &mv[i].to_config, KV_TIER_KEEP, NULL, 1);
    if (rc == KVDB_BUSY || rc == KVDB_NOTFOUND) {
      kv_clear_error();
      continue;
    }
    KV_RET(rc);
    if (v->valid && tier < KVDB_TIER_COUNT) /* the view follows: this handle's own commit */
      v->used[tier] = v->used[tier] + mv[i].to_bytes > mv[i].from_bytes
                          ? v->used[tier] + mv[i].to_bytes - mv[i].from_bytes : 0;
  }
  return KVDB_OK;
}

void kv_place_after_put(kvdb *db, const uint8_t key[16], kv_place_put *st)
{
  if (st != NULL && st->placed) { /* placed in the put's own transaction */
    if (st->n_moves > 0) {
      pthread_mutex_lock(kv_place_run_lock(db));
      kvdb_status rc = inc_moves(db, st->moves, st->n_moves);
      if (rc != KVDB_OK) {
        kv_place_view_of(db)->valid = 0;
        char hx[33];
        kv_log(&db->log, 1, "placement after the put of %s: re-encoding what left DRAM: %s",
               kv_hex16(key, hx), kvdb_errmsg());
      }
      pthread_mutex_unlock(kv_place_run_lock(db));
      kv_clear_error();
    }
    free(st->moves);
    st->moves = NULL;
    st->n_moves = 0;
    return;
  }
  if (st != NULL) {
    free(st->moves);
    st->moves = NULL;
    st->n_moves = 0;
  }
  place_one(db, key, 1, st != NULL && st->touched, "after the put of");
}

void kv_place_context(kvdb *db, const uint8_t key[16])
{
  place_one(db, key, 0, 0, "after re-profiling");
}

/* ---- before a put ------------------------------------------------------------------------ */

kvdb_status kv_place_put_config(kvdb *db, const kvdb_model *m, uint32_t block_tokens,
                                const uint8_t model_hash[16], uint64_t n_tokens,
                                const kv_profile_rec *prof, kvdb_config *cfg)
{
  if (db->place == NULL || prof == NULL)
    return KVDB_OK;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  pinst in;
  kvdb_status rc = inst_start(db, txn, &in, 0);
  kv_txn_abort(txn);
  KV_RET(rc);
  kv_ctx_rec cr;
  memset(&cr, 0, sizeof cr);
  cr.config = *cfg;
  cr.n_tokens = n_tokens;
  cr.last_access_ms = in.now_ms; /* a new context: one access, now */
  memcpy(cr.model, model_hash, 16);
  for (uint32_t e = 0; e < prof->n_entries && cr.bytes == 0; e++)
    if (kv_policy_config_equal(&prof->e[e].config, cfg))
      cr.bytes = prof->e[e].bytes;
  rc = grow((void **)&in.models, &in.cap_models, 1, sizeof *in.models) != 0
           ? kv_fail(KVDB_NOMEM, "placement model")
           : KVDB_OK;
  if (rc == KVDB_OK) {
    pmodel *pm = &in.models[in.n_models++];
    memset(pm, 0, sizeof *pm);
    memcpy(pm->hash, model_hash, 16);
    snprintf(pm->id, sizeof pm->id, "%s", m->id);
    pm->rec = (kv_model_rec){.n_layers = m->n_layers, .n_kv_heads = m->n_kv_heads,
                             .head_dim = m->head_dim, .dtype = (uint32_t)m->dtype,
                             .block_tokens = block_tokens,
                             .score_bits = m->score_bits, .rope_base = m->rope_base,
                             .rope_style = m->rope_style};
    memcpy(pm->rec.hash, model_hash, 16);
    if (cr.bytes == 0) /* the asked config is not profiled (raw, usually): its data regions */
      cr.bytes = decoded_bytes(&pm->rec, n_tokens);
    uint8_t key[16] = {0};
    rc = inst_put(&in, key, &cr, 0, KVDB_TIER_SSD, prof, NULL);
  }
  if (rc == KVDB_OK && in.n == 1) {
    in.pc[0].options = &in.opt[in.meta[0].opt0];
    in.pc[0].current = kv_policy_place_none(); /* not written yet: no stored config to keep */
    for (uint32_t t = 0; t < in.n_tiers; t++)
      in.tiers[t].capacity_bytes = KV_POLICY_UNLIMITED;
    kv_policy_plan plan;
    kv_policy_err perr;
    size_t zero = 0;
    rc = kv_policy_admit(&in.p, in.pc, 1, &zero, 1, &plan, &perr);
    if (rc != KVDB_OK) {
      rc = kv_fail(rc, "placement: %s", perr.msg);
    } else {
      for (size_t i = 0; i < plan.n_moves; i++) {
        const kv_policy_move *mv = &plan.moves[i];
        if (mv->to.tier != KV_POLICY_NONE && in.ktier[mv->to.tier] == KVDB_TIER_SSD)
          *cfg = opt_of(&in, 0, mv->to.option)->config;
      }
      kv_policy_plan_free(&plan);
    }
  }
  inst_free(&in);
  return rc;
}

/* ---- re-profiling (EvicPress §4.3) -------------------------------------------------------- */

kvdb_status kv_place_drift(kvdb *db, kv_txn *txn, const kv_ctx_rec *cr, kv_profile_rec *p,
                           int *drifted)
{
  *drifted = 0;
  if (db->place == NULL || !(db->opt.reprofile_drift_pct > 0))
    return KVDB_OK;
  kvdb_profile_entry *s = NULL;
  for (uint32_t i = 0; i < p->n_entries && s == NULL; i++)
    if (kv_policy_config_equal(&p->e[i].config, &cr->config))
      s = &p->e[i];
  if (s == NULL || s->n_reports == 0 || isnan(s->reported_quality) || isnan(s->quality))
    return KVDB_OK;
  double q = s->quality, r = s->reported_quality;
  if (!(r < q * (1.0 - db->opt.reprofile_drift_pct / 100.0)) || !(q < 1.0))
    return KVDB_OK; /* no drift; or stored exactly: the reports say nothing about compression */
  double k = (1.0 - r) / (1.0 - q);
  for (uint32_t i = 0; i < p->n_entries; i++) {
    kvdb_profile_entry *e = &p->e[i];
    if (e == s || e->n_reports > 0 || isnan(e->quality))
      continue;
    double err = k * (1.0 - e->quality);
    e->quality = 1.0 - (err < 1.0 ? err : 1.0);
    e->flags |= KVDB_PROFILE_RESCALED;
  }
  s->quality = r; /* later drift is measured from here */
  s->flags |= KVDB_PROFILE_RESCALED;
  p->measured_ms = kv_now_ms();
  *drifted = 1;
  return kv_cat_require_format(&db->cat, txn, 3); /* builds before refuse flag bit 2 */
}

/* ---- rebalance --------------------------------------------------------------------------- */

kvdb_status kvdb_rebalance_plan(kvdb *db, kvdb_place_plan *plan)
{
  KV_RET(kv_check_db(db));
  if (plan == NULL)
    return kv_fail(KVDB_INVALID, "plan is NULL");
  memset(plan, 0, sizeof *plan);
  KV_RET(flush_accesses(db));
  pinst in;
  KV_RET(inst_now(db, &in));
  kv_policy_plan pp;
  kv_policy_err perr;
  kvdb_status rc = kv_policy_rebalance(&in.p, in.pc, in.n, &pp, &perr);
  if (rc != KVDB_OK) {
    rc = kv_fail(rc, "rebalance: %s", perr.msg);
  } else {
    rc = to_public(&in, &pp, plan);
    kv_policy_plan_free(&pp);
  }
  inst_free(&in);
  if (rc != KVDB_OK)
    kvdb_place_plan_free(plan);
  return rc;
}

/* The checks of kvdb_rebalance_execute and _step. */
static kvdb_status plan_check(kvdb *db, const kvdb_place_plan *plan)
{
  KV_RET(kv_check_db(db));
  if (plan == NULL || (plan->n_moves > 0 && plan->moves == NULL))
    return kv_fail(KVDB_INVALID, "plan is NULL or has no moves array");
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  for (size_t i = 0; i < plan->n_moves; i++) {
    const kvdb_place_move *m = &plan->moves[i];
    if (m->from_tier < KVDB_TIER_SSD || m->from_tier >= KVDB_TIER_COUNT ||
        (m->to_tier != KVDB_TIER_NONE && m->to_tier != KVDB_TIER_REMOTE &&
         (m->to_tier < KVDB_TIER_SSD || m->to_tier >= KVDB_TIER_COUNT)) ||
        m->from_cached > 1 || m->to_cached > 1)
      return kv_fail(KVDB_INVALID, "plan move %zu: tiers %u -> %u, cached %u -> %u", i,
                     m->from_tier, m->to_tier, m->from_cached, m->to_cached);
  }
  return KVDB_OK;
}

/* One step under the handle's placement lock (puts of this handle place their contexts
 * between steps). */
static kvdb_status step_locked(kvdb *db, const kvdb_place_plan *plan, size_t *next,
                               uint64_t max_moves, uint64_t max_bytes, kvdb_rebalance_report *rep)
{
  pthread_mutex_t *lk = db->place != NULL ? kv_place_run_lock(db) : NULL;
  if (lk != NULL)
    pthread_mutex_lock(lk);
  kv_place_view_drop(db); /* the plan was made from the catalog, not from the view */
  kvdb_status rc = execute_step(db, plan->moves, plan->n_moves, next, max_moves, max_bytes,
                                plan->remote, rep);
  if (lk != NULL)
    pthread_mutex_unlock(lk);
  return rc;
}

kvdb_status kvdb_rebalance_step(kvdb *db, const kvdb_place_plan *plan, size_t *next,
                                uint64_t max_moves, uint64_t max_bytes,
                                kvdb_rebalance_report *report)
{
  KV_RET(plan_check(db, plan));
  if (next == NULL || *next > plan->n_moves)
    return kv_fail(KVDB_INVALID, "next is NULL or past the plan's %zu moves", plan->n_moves);
  kvdb_rebalance_report tmp;
  return step_locked(db, plan, next, max_moves, max_bytes, report != NULL ? report : &tmp);
}

kvdb_status kvdb_rebalance_execute(kvdb *db, const kvdb_place_plan *plan,
                                   kvdb_rebalance_report *report)
{
  KV_RET(plan_check(db, plan));
  kvdb_rebalance_report tmp, step;
  if (report == NULL)
    report = &tmp;
  memset(report, 0, sizeof *report);
  size_t next = 0;
  kvdb_status rc = KVDB_OK;
  while (rc == KVDB_OK && next < plan->n_moves) {
    rc = step_locked(db, plan, &next, KV_REBALANCE_STEP_MOVES, 0, &step);
    report->relocated += step.relocated;
    report->deleted += step.deleted;
    report->skipped += step.skipped;
    report->cache_changes += step.cache_changes;
    report->to_remote += step.to_remote;
    report->remote_unwritten += step.remote_unwritten;
  }
  return rc;
}

/* ---- statistics -------------------------------------------------------------------------- */

kvdb_status kvdb_placement_stat(kvdb *db, kvdb_placement_stats *out, kvdb_config_use *uses,
                                size_t cap)
{
  KV_RET(kv_check_db(db));
  if (out == NULL || (cap > 0 && uses == NULL))
    return kv_fail(KVDB_INVALID, "out is NULL, or uses is NULL with cap %zu", cap);
  memset(out, 0, sizeof *out);
  KV_RET(flush_accesses(db));
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  pinst in;
  kvdb_status rc = inst_build(db, txn, &in, 0);
  if (rc == KVDB_OK)
    kv_place_served(db, txn, out->blocks_read);
  kv_txn_abort(txn);
  if (rc != KVDB_OK)
    return rc;
  kv_tier_perf f[KVDB_TIER_COUNT];
  memset(f, 0, sizeof f);
  for (uint32_t t = 0; t < in.n_tiers; t++)
    f[in.ktier[t]] = (kv_tier_perf){in.tiers[t].read_bps, in.tiers[t].latency_s};
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    out->perf[t] = (kvdb_tier_perf){f[t].read_bps, f[t].latency_s, 0, 0};
  out->contexts = in.n;
  kvdb_config_use *all = NULL;
  size_t n_all = 0, cap_all = 0;
  for (size_t i = 0; i < in.n && rc == KVDB_OK; i++) {
    const kv_policy_context *c = &in.pc[i];
    const pmeta *me = &in.meta[i];
    double u = kv_policy_utility(&in.p, c, c->current);
    uint32_t served = c->current.cached ? (uint32_t)KVDB_TIER_DRAM : me->tier;
    out->served_from[served]++;
    out->utility_from[served] += u;
    out->utility += u;
    out->frequency += c->frequency;
    const kv_policy_option *o = &c->options[c->current.option];
    size_t k = 0;
    while (k < n_all && !(all[k].tier == me->tier && all[k].cached == c->current.cached &&
                          kv_policy_config_equal(&all[k].config, &me->cur)))
      k++;
    if (k == n_all) {
      if (grow((void **)&all, &cap_all, n_all + 1, sizeof *all) != 0) {
        rc = kv_fail(KVDB_NOMEM, "placement statistics");
        break;
      }
      all[n_all++] = (kvdb_config_use){me->cur, me->tier, c->current.cached, 0, 0};
    }
    all[k].contexts++;
    all[k].bytes += o->bytes;
  }
  out->n_uses = n_all;
  if (rc == KVDB_OK && cap > 0)
    memcpy(uses, all, (n_all < cap ? n_all : cap) * sizeof *uses);
  free(all);
  inst_free(&in);
  return rc;
}
