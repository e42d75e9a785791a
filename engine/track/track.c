/* SPDX-License-Identifier: MIT */
/*
 * engine/track/track.c — the placement state (track.h), the floor below the operations that
 * the read and write paths feed: the tiers' read figures, access counts, blocks served per
 * tier, the DRAM tier's admission set, the tier of a context, and the state placer.c keeps
 * between placements. The placement's decisions are one floor up (engine/place).
 *
 * TIER FIGURES (EvicPress §4.2's TTFT; §8 names static figures a limitation). DRAM: a timed
 * copy at each open. SSD and SmartSSD: kv_probe_dir on the tier's directory, once per
 * database, directory and device: cached in meta "perf.ssd" / "perf.smartssd" (32 bytes: st_dev
 * u64, bandwidth f64, latency f64, probed-at Unix ms u64; FORMAT.md §2) and probed again when
 * the directory's device changes or kvdb_tier_probe asks. Each cold kvdb_get block then feeds
 * an exponentially weighted least-squares fit of read time against bytes (tiers/tiers.h) that
 * starts from the probe. The probe goes to the operating system's I/O directly (db->os_io):
 * it measures the device, and a test's I/O layer does not count its syncs. A tier whose
 * figures the caller fixed (kvdb_options.tier_perf) is neither probed nor refitted.
 *
 * DRAM ADMISSION. With placement on, the DRAM tier is an inclusive cache that follows the
 * placement: a get copies a block into it only when some context the placement keeps in DRAM
 * (ctxstats flag) holds the block. The set of those blocks is rebuilt whenever meta "place_gen"
 * (bumped by every placement) changes, and blocks that leave it are dropped from this handle's
 * DRAM tier.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "catalog/catalog.h"
#include "track.h"

#define META_PLACE_GEN "place_gen"
#define META_PLACEMENT "placement"
#define META_STAT_BLOCKS "stat.blocks"
#define SET_REC_BYTES KV_PLACE_SET_BYTES
#define PERF_REC_BYTES KV_PLACE_PERF_BYTES
#define PERF_PRIOR_WEIGHT 8.0 /* the probe counts as this many reads in the online fit */
#define MEM_PROBE_BYTES (16u << 20)

/* A multiset of 16-byte keys (open addressing, linear probing): used[i] counts the cached
 * contexts holding block k[i] (0: free slot), so that a context leaving the set removes only
 * the blocks no other cached context holds (kset_del, backward-shift deletion). */
typedef struct kset {
  uint8_t (*k)[16];
  uint32_t *used;
  size_t cap, n;
} kset;

struct kv_place {
  pthread_mutex_t mu; /* figures, the admission set */
  pthread_mutex_t run_mu; /* one placement at a time in this handle (placer.c) */
  kv_tier_perf prior[KVDB_TIER_COUNT];
  kv_perf_fit fit[KVDB_TIER_COUNT];
  uint64_t probed_ms[KVDB_TIER_COUNT];
  uint64_t reads[KVDB_TIER_COUNT];
  kset want;
  uint64_t want_gen;
  int want_loaded;
  uint64_t flushed[KVDB_TIER_COUNT]; /* served-block counts already added to the catalog's */
  kv_place_view view;     /* placer.c's, under run_mu */
  int view_stale;         /* set (atomically) by kv_place_view_drop */
  kv_place_prior_slot profs; /* place/prior.c's, under profs.mu */
};

/* ---- options ----------------------------------------------------------------------------- */

void kv_place_options_init(kvdb_options *o)
{
  o->placement = KVDB_PLACEMENT_OFF;
  o->placement_alpha = 1.0;
  o->freq_half_life_s = 3600.0;
  o->reprofile_drift_pct = 5.0;
  o->prefill_tokens_per_s = 10000.0;
  o->placement_slack_pct = 5.0;
}

kvdb_status kv_place_options_check(const kvdb_options *o)
{
  if (o->placement != KVDB_PLACEMENT_OFF && o->placement != KVDB_PLACEMENT_EVICPRESS &&
      o->placement != KVDB_PLACEMENT_PER_BYTE && o->placement != KVDB_PLACEMENT_LEAST_DROP)
    return kv_fail(KVDB_INVALID, "placement %d is not KVDB_PLACEMENT_OFF, _EVICPRESS, "
                   "_PER_BYTE or _LEAST_DROP", (int)o->placement);
  if (!(isfinite(o->placement_alpha) && o->placement_alpha >= 0))
    return kv_fail(KVDB_INVALID, "placement_alpha %g is not a number >= 0", o->placement_alpha);
  if (!(isfinite(o->freq_half_life_s) && o->freq_half_life_s > 0))
    return kv_fail(KVDB_INVALID, "freq_half_life_s %g is not a positive number",
                   o->freq_half_life_s);
  if (o->placement_profile != KVDB_PLACE_PROFILE_SAMPLED &&
      o->placement_profile != KVDB_PLACE_PROFILE_EVERY_PUT)
    return kv_fail(KVDB_INVALID, "placement_profile %u is not KVDB_PLACE_PROFILE_SAMPLED (0) or "
                   "KVDB_PLACE_PROFILE_EVERY_PUT (1)", o->placement_profile);
  if (!(o->reprofile_drift_pct >= 0 && o->reprofile_drift_pct <= 100))
    return kv_fail(KVDB_INVALID, "reprofile_drift_pct %g is not in 0..100",
                   o->reprofile_drift_pct);
  if (!(isfinite(o->prefill_tokens_per_s) && o->prefill_tokens_per_s > 0))
    return kv_fail(KVDB_INVALID, "prefill_tokens_per_s %g is not a positive number",
                   o->prefill_tokens_per_s);
  if (!(o->placement_slack_pct >= 0 && o->placement_slack_pct <= 50))
    return kv_fail(KVDB_INVALID, "placement_slack_pct %g is not in 0..50",
                   o->placement_slack_pct);
  return KVDB_OK;
}

/* ---- tier figures ------------------------------------------------------------------------ */

uint64_t kv_place_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *perf_key(uint32_t tier)
{
  return tier == KVDB_TIER_SMARTSSD ? "perf.smartssd" : "perf.ssd";
}

static const char *tier_dir(const kvdb *db, uint32_t tier)
{
  return tier == KVDB_TIER_SMARTSSD ? db->smart_dir : db->seg_dir;
}

/* Whether a persistent tier is there to be measured. */
static int tier_present(const kvdb *db, uint32_t tier)
{
  if (tier == KVDB_TIER_SSD)
    return 1;
  return tier == KVDB_TIER_SMARTSSD && db->smart_dir != NULL && db->opt.smartssd_bytes > 0;
}

/* Probe a persistent tier and cache the figures (a write transaction of its own). */
static kvdb_status probe_tier(kvdb *db, uint32_t tier, kv_tier_perf *out, uint64_t *ms)
{
  const char *dir = tier_dir(db, tier);
  struct stat st;
  if (stat(dir, &st) != 0)
    return kv_fail_errno(errno, "cannot stat the tier directory '%s'", dir);
  int e = kv_probe_dir(db->os_io, dir, db->opt.use_direct_io, KV_PROBE_BYTES, out);
  if (e != 0)
    return kv_fail_errno(-e, "cannot probe the tier directory '%s'", dir);
  *ms = kv_now_ms();
  uint8_t b[PERF_REC_BYTES];
  kv_place_perf_encode((uint64_t)st.st_dev, out, *ms, b);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = kv_cat_put_blob(&db->cat, txn, perf_key(tier), b, sizeof b);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  kv_log(&db->log, 2, "tier probe of '%s': %.2f GB/s, %.1f us", dir, out->read_bps / 1e9,
         out->latency_s * 1e6);
  return kv_txn_commit(txn);
}

/* meta "perf.ssd" / "perf.smartssd" (32 bytes): device u64, read bandwidth f64 (bytes/s),
 * latency f64 (s), probed at Unix ms u64. */
void kv_place_perf_encode(uint64_t dev, const kv_tier_perf *f, uint64_t ms,
                          uint8_t b[KV_PLACE_PERF_BYTES])
{
  kv_put_le64(b, dev);
  kv_put_lef64(b + 8, f->read_bps);
  kv_put_lef64(b + 16, f->latency_s);
  kv_put_le64(b + 24, ms);
}

kvdb_status kv_place_perf_decode(const uint8_t b[KV_PLACE_PERF_BYTES], uint64_t *dev,
                                 kv_tier_perf *f, uint64_t *ms)
{
  *dev = kv_get_le64(b);
  f->read_bps = kv_get_lef64(b + 8);
  f->latency_s = kv_get_lef64(b + 16);
  *ms = kv_get_le64(b + 24);
  if (!(isfinite(f->read_bps) && f->read_bps > 0 && isfinite(f->latency_s) && f->latency_s >= 0))
    return kv_fail(KVDB_CORRUPT, "catalog tier figures are not finite and positive");
  return KVDB_OK;
}

/* The cached figures of a tier when they are for this directory's device: KVDB_OK;
 * KVDB_NOTFOUND when there are none to use (none cached, another device's, damaged, or the
 * directory cannot be stat'ed): the tier is probed again. Another status when the catalog
 * could not be read (out of memory, no reader slot...): an error, not a miss, since a probe
 * would replace the database's figures with ones measured at this moment (on a loaded
 * machine a tier many times slower, and the placement then drops contexts it finds faster to
 * recompute than to read). */
static kvdb_status cached_perf(kvdb *db, uint32_t tier, kv_tier_perf *out, uint64_t *ms)
{
  struct stat st;
  uint8_t b[PERF_REC_BYTES];
  kv_txn *txn;
  if (stat(tier_dir(db, tier), &st) != 0)
    return KVDB_NOTFOUND;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kvdb_status rc = kv_cat_get_blob(&db->cat, txn, perf_key(tier), b, sizeof b);
  kv_txn_abort(txn);
  if (rc != KVDB_OK && rc != KVDB_NOTFOUND && rc != KVDB_CORRUPT)
    return rc;
  uint64_t dev = 0;
  int ok = rc == KVDB_OK && kv_place_perf_decode(b, &dev, out, ms) == KVDB_OK &&
           dev == (uint64_t)st.st_dev;
  kv_clear_error(); /* a missing or damaged cache is probed again */
  return ok ? KVDB_OK : KVDB_NOTFOUND;
}

/* Figures of one persistent tier: cached, else probed (a read-only handle that finds none
 * uses a nominal NVMe figure and says so). */
static kvdb_status tier_figures(kvdb *db, uint32_t tier, int reprobe, kv_tier_perf *out,
                                uint64_t *ms)
{
  kvdb_status rc = reprobe ? KVDB_NOTFOUND : cached_perf(db, tier, out, ms);
  if (rc != KVDB_NOTFOUND)
    return rc; /* the cached figures, or the catalog could not be read */
  if (db->cat.rdonly) {
    if (reprobe)
      return kv_fail(KVDB_READONLY, "database '%s' is open read-only: no probe is cached",
                     db->dir);
    out->read_bps = 2e9;
    out->latency_s = 100e-6;
    *ms = 0;
    kv_log(&db->log, 1, "no cached figures for '%s' and the database is read-only: assuming "
           "2 GB/s and 100 us", tier_dir(db, tier));
    return KVDB_OK;
  }
  return probe_tier(db, tier, out, ms);
}

/* 1 and *f = kvdb_options.tier_perf[t] when the caller fixed tier t's figures (no probe, no
 * refit from reads), else 0. */
static int pinned(const kvdb *db, uint32_t t, kv_tier_perf *f)
{
  const kvdb_tier_perf *o = &db->opt.tier_perf[t];
  if (o->read_bps <= 0)
    return 0;
  if (f != NULL)
    *f = (kv_tier_perf){o->read_bps, o->latency_s};
  return 1;
}

static void fit_reset(struct kv_place *p, uint32_t t, const kv_tier_perf *f, uint64_t ms)
{
  p->prior[t] = *f;
  p->probed_ms[t] = ms;
  p->reads[t] = 0;
  kv_perf_fit_init(&p->fit[t], f, PERF_PRIOR_WEIGHT);
}

void kv_place_perf(kvdb *db, kv_tier_perf out[KVDB_TIER_COUNT])
{
  struct kv_place *p = db->place;
  memset(out, 0, KVDB_TIER_COUNT * sizeof *out);
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mu);
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    if (p->prior[t].read_bps > 0 && !pinned(db, t, &out[t]))
      kv_perf_estimate(&p->fit[t], &p->prior[t], &out[t]);
  pthread_mutex_unlock(&p->mu);
}

void kv_place_observe(kvdb *db, uint32_t tier, uint64_t bytes, uint64_t ns)
{
  struct kv_place *p = db->place;
  if (p == NULL || tier >= KVDB_TIER_COUNT)
    return;
  if (pinned(db, tier, NULL))
    return; /* fixed by the caller */
  pthread_mutex_lock(&p->mu);
  if (p->prior[tier].read_bps > 0) {
    kv_perf_observe(&p->fit[tier], bytes, (double)ns * 1e-9);
    p->reads[tier]++;
  }
  pthread_mutex_unlock(&p->mu);
}

kvdb_status kvdb_tier_probe(kvdb *db, int reprobe, kvdb_tier_perf out[KVDB_TIER_COUNT])
{
  KV_RET(kv_check_db(db));
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  kv_tier_perf f[KVDB_TIER_COUNT];
  uint64_t ms[KVDB_TIER_COUNT] = {0}, reads[KVDB_TIER_COUNT] = {0};
  memset(f, 0, sizeof f);
  memset(out, 0, KVDB_TIER_COUNT * sizeof *out);
  struct kv_place *p = db->place;
  if (db->dram != NULL && !pinned(db, KVDB_TIER_DRAM, &f[KVDB_TIER_DRAM]))
    kv_probe_memory(MEM_PROBE_BYTES, &f[KVDB_TIER_DRAM]);
  for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++)
    if (tier_present(db, t) && !pinned(db, t, &f[t]))
      KV_RET(tier_figures(db, t, reprobe, &f[t], &ms[t]));
  if (p != NULL) { /* the handle's figures: refit from the new probe, else its current ones */
    pthread_mutex_lock(&p->mu);
    for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
      if (f[t].read_bps > 0 && (reprobe || t == KVDB_TIER_DRAM || p->prior[t].read_bps <= 0))
        fit_reset(p, t, &f[t], ms[t]);
      if (p->prior[t].read_bps > 0 && !pinned(db, t, &f[t])) {
        kv_perf_estimate(&p->fit[t], &p->prior[t], &f[t]);
        ms[t] = p->probed_ms[t];
        reads[t] = p->reads[t];
      }
    }
    pthread_mutex_unlock(&p->mu);
  }
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    out[t] = (kvdb_tier_perf){f[t].read_bps, f[t].latency_s, ms[t], reads[t]};
  return KVDB_OK;
}

/* ---- the DRAM admission set -------------------------------------------------------------- */

static void kset_free(kset *s)
{
  free(s->k);
  free(s->used);
  memset(s, 0, sizeof *s);
}

/* The slot where k's probe run starts. */
static size_t kset_home(const kset *s, const uint8_t *k)
{
  uint64_t h;
  memcpy(&h, k, 8);
  return (size_t)(h ^ (h >> 29)) & (s->cap - 1);
}

static size_t kset_slot(const kset *s, const uint8_t *k)
{
  size_t i = kset_home(s, k);
  while (s->used[i] && memcmp(s->k[i], k, 16) != 0)
    i = (i + 1) & (s->cap - 1);
  return i;
}

static int kset_has(const kset *s, const uint8_t *k)
{
  return s->cap > 0 && s->used[kset_slot(s, k)];
}

/* 0, or -1 when out of memory. */
static int kset_add(kset *s, const uint8_t *k)
{
  if (2 * (s->n + 1) > s->cap) {
    kset b = {NULL, NULL, s->cap ? 2 * s->cap : 64, 0};
    b.k = malloc(b.cap * 16);
    b.used = calloc(b.cap, sizeof *b.used);
    if (b.k == NULL || b.used == NULL) {
      kset_free(&b);
      return -1;
    }
    for (size_t i = 0; i < s->cap; i++)
      if (s->used[i]) {
        size_t j = kset_slot(&b, s->k[i]);
        memcpy(b.k[j], s->k[i], 16);
        b.used[j] = s->used[i];
        b.n++;
      }
    kset_free(s);
    *s = b;
  }
  size_t i = kset_slot(s, k);
  if (!s->used[i]) {
    memcpy(s->k[i], k, 16);
    s->n++;
  }
  s->used[i]++;
  return 0;
}

/* Every block of context record cr into the set. */
static kvdb_status kset_add_ctx(kset *s, const kv_ctx_rec *cr)
{
  for (uint32_t i = 0; i < cr->n_blocks; i++)
    if (kset_add(s, cr->blocks + 16 * i) != 0)
      return kv_fail(KVDB_NOMEM, "the DRAM admission set");
  return KVDB_OK;
}

/* One holder of k less; returns 1 when that was the last (k left the set). */
static int kset_del(kset *s, const uint8_t *k)
{
  if (s->cap == 0)
    return 0;
  size_t i = kset_slot(s, k);
  if (!s->used[i] || --s->used[i] > 0)
    return 0;
  s->n--;
  /* backward shift: move up every later entry of the probe run whose home is not in (i, j] */
  size_t j = i;
  for (;;) {
    j = (j + 1) & (s->cap - 1);
    if (!s->used[j])
      break;
    size_t home = kset_home(s, s->k[j]);
    if (((j - home) & (s->cap - 1)) >= ((j - i) & (s->cap - 1))) {
      memcpy(s->k[i], s->k[j], 16);
      s->used[i] = s->used[j];
      s->used[j] = 0;
      i = j;
    }
  }
  return 1;
}

/* The admission set as of txn. */
static kvdb_status build_want(kvdb *db, kv_txn *txn, kset *out, uint64_t *gen)
{
  memset(out, 0, sizeof *out);
  *gen = 0;
  kv_cat_get_u64(&db->cat, txn, META_PLACE_GEN, gen);
  kv_clear_error();
  if (!db->cat.has_ctxstats)
    return KVDB_OK;
  kv_cat_iter it;
  KV_RET(kv_cat_iter_open(&db->cat, txn, KV_TBL_CTXSTATS, &it, "open ctxstats cursor"));
  kvdb_status rc = KVDB_OK;
  while (rc == KVDB_OK && kv_cat_iter_next(&it)) {
    kv_ctxstats cs;
    kv_ctx_rec cr;
    if (it.key.size != 16 || kv_ctxstats_decode(it.val.data, it.val.size, &cs) != KVDB_OK ||
        !(cs.flags & KV_CTXS_CACHED) || kv_cat_get_ctx(&db->cat, txn, it.key.data, &cr) != KVDB_OK)
      continue;
    rc = kset_add_ctx(out, &cr);
  }
  kv_cat_iter_close(&it);
  kv_clear_error();
  /* FOLDED STATS (catalog.h): contexts whose record carries their statistics and that have no
   * ctxstats record (which would take precedence, above) */
  if (rc == KVDB_OK &&
      kv_cat_iter_open(&db->cat, txn, KV_TBL_CONTEXTS, &it, "open contexts cursor") == KVDB_OK) {
    while (rc == KVDB_OK && kv_cat_iter_next(&it)) {
      const uint8_t *d = it.val.data;
      kv_ctx_rec cr;
      if (it.key.size != 16 || it.val.size < 1 || d[0] < 3 ||
          kv_ctx_rec_decode(d, it.val.size, &cr) != KVDB_OK || !cr.has_stats ||
          !(cr.stats.flags & KV_CTXS_CACHED) || kv_cat_has_ctxstats_rec(&db->cat, txn, it.key.data))
        continue;
      rc = kset_add_ctx(out, &cr);
    }
    kv_cat_iter_close(&it);
  }
  kv_clear_error();
  if (rc != KVDB_OK)
    kset_free(out);
  return rc;
}

/* Install a new set; drop from DRAM what left. */
static void install_want(kvdb *db, kset *nw, uint64_t gen)
{
  struct kv_place *p = db->place;
  pthread_mutex_lock(&p->mu);
  kset old = p->want;
  p->want = *nw;
  p->want_gen = gen;
  p->want_loaded = 1;
  pthread_mutex_unlock(&p->mu);
  if (db->dram != NULL)
    for (size_t i = 0; i < old.cap; i++)
      if (old.used[i] && !kset_has(nw, old.k[i]))
        kv_dram_remove(db->dram, old.k[i]);
  kset_free(&old);
  memset(nw, 0, sizeof *nw);
}

kvdb_status kv_place_reload(kvdb *db)
{
  if (db->place == NULL)
    return KVDB_OK;
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kset nw;
  uint64_t gen;
  kvdb_status rc = build_want(db, txn, &nw, &gen);
  kv_txn_abort(txn);
  if (rc == KVDB_OK)
    install_want(db, &nw, gen);
  return rc;
}

int kv_place_want_change(kvdb *db, const uint8_t *add, uint32_t n_add, const uint8_t *del,
                         size_t n_del, uint64_t gen_from, uint64_t gen_to)
{
  struct kv_place *p = db->place;
  if (p == NULL)
    return 0;
  uint8_t *gone = n_del > 0 ? malloc(16 * n_del) : NULL;
  size_t n_gone = 0;
  pthread_mutex_lock(&p->mu);
  int ok = p->want_loaded && p->want_gen == gen_from && (n_del == 0 || gone != NULL);
  for (uint32_t i = 0; i < n_add && ok; i++)
    ok = kset_add(&p->want, add + 16 * (size_t)i) == 0;
  for (size_t i = 0; i < n_del && ok; i++)
    if (kset_del(&p->want, del + 16 * i))
      memcpy(gone + 16 * n_gone++, del + 16 * i, 16);
  if (ok)
    p->want_gen = gen_to;
  else
    p->want_loaded = 0; /* the next refresh rebuilds it */
  pthread_mutex_unlock(&p->mu);
  if (ok && db->dram != NULL)
    for (size_t i = 0; i < n_gone; i++)
      kv_dram_remove(db->dram, gone + 16 * i);
  free(gone);
  return ok;
}

int kv_place_want_extend(kvdb *db, const uint8_t *blocks, uint32_t n, uint64_t gen_from,
                         uint64_t gen_to)
{
  return kv_place_want_change(db, blocks, n, NULL, 0, gen_from, gen_to);
}

void kv_place_refresh(kvdb *db, kv_txn *txn)
{
  struct kv_place *p = db->place;
  if (p == NULL)
    return;
  uint64_t gen = 0;
  kv_cat_get_u64(&db->cat, txn, META_PLACE_GEN, &gen);
  pthread_mutex_lock(&p->mu);
  int stale = !p->want_loaded || gen != p->want_gen;
  pthread_mutex_unlock(&p->mu);
  if (!stale) {
    kv_clear_error();
    return;
  }
  kset nw;
  if (build_want(db, txn, &nw, &gen) == KVDB_OK)
    install_want(db, &nw, gen);
  kv_clear_error(); /* a failure keeps the old set: DRAM admission is advisory */
}

int kv_place_dram_admits(kvdb *db, const uint8_t hash[16])
{
  struct kv_place *p = db->place;
  if (p == NULL)
    return 1;
  pthread_mutex_lock(&p->mu);
  int yes = kset_has(&p->want, hash);
  pthread_mutex_unlock(&p->mu);
  return yes;
}

/* ---- access counts, put options, context info -------------------------------------------- */

kvdb_status kv_place_touch(kvdb *db, kv_txn *txn, const uint8_t key[16], uint64_t ms)
{
  if (db->place == NULL || !db->cat.has_ctxstats)
    return KVDB_OK;
  if (!kv_cat_has_ctx(&db->cat, txn, key))
    return KVDB_OK; /* deleted since the access */
  return kv_cat_touch_ctxstats(&db->cat, txn, key, ms, db->opt.freq_half_life_s * 1000.0);
}

void kv_place_put_opts(kvdb *db, kvdb_put_opts *o)
{
  if (db->place == NULL)
    return;
  o->flags |= KVDB_PUT_PROFILE;
  if (o->profile_space == NULL)
    o->profile_space = "lossless,int8,int4,int2";
}

void kv_place_info(kvdb *db, kv_txn *txn, const uint8_t key[16], uint64_t last_access_ms,
                   double *frequency, uint32_t *cached)
{
  (void)last_access_ms;
  *frequency = 0;
  *cached = 0;
  kv_ctxstats cs;
  if (kv_cat_get_ctxstats(&db->cat, txn, key, &cs) != KVDB_OK) {
    kv_clear_error();
    return;
  }
  *frequency = kv_ctxstats_freq_at(&cs, kv_now_ms(), db->opt.freq_half_life_s * 1000.0);
  *cached = (cs.flags & KV_CTXS_CACHED) != 0 && db->dram != NULL;
}

/* ---- settings, figures, counters --------------------------------------------------------- */

static void set_from_opts(const kvdb *db, kv_place_set *s)
{
  s->rule = db->opt.placement;
  s->alpha = db->opt.placement_alpha;
  s->half_life_s = db->opt.freq_half_life_s;
  s->prefill_tps = db->opt.prefill_tokens_per_s;
  s->dram_bytes = db->dram != NULL ? db->opt.dram_bytes : 0;
  s->ssd_bytes = db->opt.ssd_bytes;
  s->smartssd_bytes = db->smart_dir != NULL ? db->opt.smartssd_bytes : 0;
}

/* meta "placement" (56 bytes): version u8 (1), rule u8, reserved u16 and u32 (0), alpha f64,
 * half-life s f64, prefill tokens/s f64, dram / ssd / smartssd bytes u64. */
void kv_place_set_encode(const kv_place_set *s, uint8_t b[KV_PLACE_SET_BYTES])
{
  memset(b, 0, SET_REC_BYTES);
  b[0] = 1;
  b[1] = (uint8_t)s->rule;
  kv_put_lef64(b + 8, s->alpha);
  kv_put_lef64(b + 16, s->half_life_s);
  kv_put_lef64(b + 24, s->prefill_tps);
  kv_put_le64(b + 32, s->dram_bytes);
  kv_put_le64(b + 40, s->ssd_bytes);
  kv_put_le64(b + 48, s->smartssd_bytes);
}

kvdb_status kv_place_set_decode(const uint8_t b[KV_PLACE_SET_BYTES], kv_place_set *s)
{
  if (b[0] != 1 || b[2] != 0 || b[3] != 0 || kv_get_le32(b + 4) != 0)
    return kv_fail(KVDB_CORRUPT, "catalog meta 'placement' has version %u", b[0]);
  s->rule = (kvdb_placement)b[1];
  s->alpha = kv_get_lef64(b + 8);
  s->half_life_s = kv_get_lef64(b + 16);
  s->prefill_tps = kv_get_lef64(b + 24);
  s->dram_bytes = kv_get_le64(b + 32);
  s->ssd_bytes = kv_get_le64(b + 40);
  s->smartssd_bytes = kv_get_le64(b + 48);
  kvdb_options o;
  memset(&o, 0, sizeof o);
  o.placement = s->rule;
  o.placement_alpha = s->alpha;
  o.freq_half_life_s = s->half_life_s;
  o.prefill_tokens_per_s = s->prefill_tps;
  if (s->rule == KVDB_PLACEMENT_OFF || kv_place_options_check(&o) != KVDB_OK)
    return kv_fail(KVDB_CORRUPT, "catalog meta 'placement' holds invalid settings");
  return KVDB_OK;
}

kvdb_status kv_place_settings(kvdb *db, kv_txn *txn, kv_place_set *out)
{
  if (db->place != NULL) {
    set_from_opts(db, out);
    return KVDB_OK;
  }
  uint8_t b[SET_REC_BYTES];
  kvdb_status rc = kv_cat_get_blob(&db->cat, txn, META_PLACEMENT, b, sizeof b);
  if (rc == KVDB_NOTFOUND)
    return kv_fail(KVDB_INVALID, "database '%s' has no placement settings: open it once with "
                   "kvdb_options.placement on (or use this handle with it on)", db->dir);
  KV_RET(rc);
  KV_RET(kv_place_set_decode(b, out));
  if (out->smartssd_bytes > 0 && kv_smart_dir(db) == NULL)
    out->smartssd_bytes = 0; /* the tier's directory is not known here */
  return KVDB_OK;
}

kvdb_status kv_place_figures(kvdb *db, const kv_place_set *set, kv_tier_perf out[KVDB_TIER_COUNT])
{
  memset(out, 0, KVDB_TIER_COUNT * sizeof *out);
  if (db->place != NULL) {
    kv_place_perf(db, out);
    return KVDB_OK;
  }
  if (set->dram_bytes > 0 && !pinned(db, KVDB_TIER_DRAM, &out[KVDB_TIER_DRAM]))
    kv_probe_memory(MEM_PROBE_BYTES, &out[KVDB_TIER_DRAM]);
  for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++) {
    if (t == KVDB_TIER_SMARTSSD && (set->smartssd_bytes == 0 || db->smart_dir == NULL))
      continue;
    uint64_t ms;
    if (!pinned(db, t, &out[t]))
      KV_RET(tier_figures(db, t, 0, &out[t], &ms));
  }
  return KVDB_OK;
}

static void served_now(kvdb *db, uint64_t out[KVDB_TIER_COUNT])
{
  memset(out, 0, KVDB_TIER_COUNT * sizeof *out);
  if (db->dram != NULL) {
    kv_dram_stats ds;
    kv_dram_stat(db->dram, &ds);
    out[KVDB_TIER_DRAM] = ds.hits;
  }
  out[KVDB_TIER_SSD] = db->ssd_hits;
  out[KVDB_TIER_SMARTSSD] = db->smart_hits;
}

void kv_place_served(kvdb *db, kv_txn *txn, uint64_t out[KVDB_TIER_COUNT])
{
  uint8_t b[8 * KVDB_TIER_COUNT];
  memset(out, 0, KVDB_TIER_COUNT * sizeof *out);
  if (kv_cat_get_blob(&db->cat, txn, META_STAT_BLOCKS, b, sizeof b) == KVDB_OK)
    for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
      out[t] = kv_get_le64(b + 8 * t);
  kv_clear_error();
}

kvdb_status kv_place_flush_stats(kvdb *db, kv_txn *txn)
{
  struct kv_place *p = db->place;
  if (p == NULL)
    return KVDB_OK;
  uint64_t now[KVDB_TIER_COUNT], cat[KVDB_TIER_COUNT];
  served_now(db, now);
  pthread_mutex_lock(&p->mu);
  int any = 0;
  uint64_t add[KVDB_TIER_COUNT];
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
    add[t] = now[t] >= p->flushed[t] ? now[t] - p->flushed[t] : 0;
    any |= add[t] != 0;
  }
  pthread_mutex_unlock(&p->mu);
  if (!any)
    return KVDB_OK;
  kv_place_served(db, txn, cat);
  uint8_t b[8 * KVDB_TIER_COUNT];
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    kv_put_le64(b + 8 * t, cat[t] + add[t]);
  KV_RET(kv_cat_put_blob(&db->cat, txn, META_STAT_BLOCKS, b, sizeof b));
  pthread_mutex_lock(&p->mu); /* counted once the transaction commits (or twice, rarely, when
                                 it aborts after this: the counters are statistics) */
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    p->flushed[t] += add[t];
  pthread_mutex_unlock(&p->mu);
  return KVDB_OK;
}

/* At a read-write open with placement on: the settings (and the SmartSSD directory) for
 * handles without placement (kvdb-admin rebalance). */
static kvdb_status record_settings(kvdb *db)
{
  kv_place_set set;
  set_from_opts(db, &set);
  uint8_t b[SET_REC_BYTES], old[SET_REC_BYTES];
  kv_place_set_encode(&set, b);
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  int same = kv_cat_get_blob(&db->cat, txn, META_PLACEMENT, old, sizeof old) == KVDB_OK &&
             memcmp(old, b, sizeof b) == 0;
  int need_dir = kv_smart_dir_unrecorded(db, txn);
  kv_txn_abort(txn);
  kv_clear_error();
  if (same && !need_dir)
    return KVDB_OK;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kvdb_status rc = kv_cat_put_blob(&db->cat, txn, META_PLACEMENT, b, sizeof b);
  if (rc == KVDB_OK && need_dir)
    rc = kv_smart_dir_record(db, txn);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

/* ---- open / close ------------------------------------------------------------------------ */

kvdb_status kv_place_open(kvdb *db)
{
  KV_RET(kv_smart_dir_open(db)); /* seg/smartdir.c */
  if (db->opt.placement == KVDB_PLACEMENT_OFF)
    return KVDB_OK;
  struct kv_place *p = calloc(1, sizeof *p);
  if (p == NULL)
    return kv_fail(KVDB_NOMEM, "placement state");
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->run_mu, NULL);
  pthread_mutex_init(&p->profs.mu, NULL);
  db->place = p;
  if (db->dram != NULL) {
    kv_tier_perf f;
    if (!pinned(db, KVDB_TIER_DRAM, &f))
      kv_probe_memory(MEM_PROBE_BYTES, &f);
    fit_reset(p, KVDB_TIER_DRAM, &f, 0);
  }
  for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++) {
    if (!tier_present(db, t))
      continue;
    kv_tier_perf f;
    uint64_t ms = 0;
    if (!pinned(db, t, &f))
      KV_RET(tier_figures(db, t, 0, &f, &ms));
    fit_reset(p, t, &f, ms);
  }
  if (!db->cat.rdonly) {
    KV_RET(record_settings(db));
    KV_RET(kv_cat_track_commits(&db->cat)); /* placer.c's view between puts */
  }
  return kv_place_reload(db);
}

void kv_place_close(kvdb *db)
{
  kv_smart_dir_close(db);
  struct kv_place *p = db->place;
  if (p == NULL)
    return;
  kset_free(&p->want);
  if (p->view.inc_free != NULL)
    p->view.inc_free(p->view.inc);
  if (p->profs.state_free != NULL)
    p->profs.state_free(p->profs.state);
  pthread_mutex_destroy(&p->profs.mu);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->run_mu);
  free(p);
  db->place = NULL;
}

/* ---- tiers of contexts ------------------------------------------------------------------- */

uint32_t kv_ctx_tier(kvdb *db, kv_txn *txn, const kv_ctx_rec *cr)
{
  return kv_cat_ctx_tier(&db->cat, txn, cr);
}

/* ---- for placer.c ------------------------------------------------------------------------- */

pthread_mutex_t *kv_place_run_lock(kvdb *db)
{
  return &db->place->run_mu;
}

kv_place_view *kv_place_view_of(kvdb *db)
{
  struct kv_place *p = db->place;
  if (__atomic_exchange_n(&p->view_stale, 0, __ATOMIC_ACQ_REL))
    p->view.valid = 0;
  return &p->view;
}

kv_place_prior_slot *kv_place_prior_of(kvdb *db)
{
  return &db->place->profs;
}

void kv_place_view_drop(kvdb *db)
{
  if (db->place != NULL)
    __atomic_store_n(&db->place->view_stale, 1, __ATOMIC_RELEASE);
}

kvdb_status kv_place_bump_gen(kvdb *db, kv_txn *txn, uint64_t *gen_from)
{
  uint64_t gen = 0;
  kv_cat_get_u64(&db->cat, txn, META_PLACE_GEN, &gen);
  kv_clear_error();
  if (gen_from != NULL)
    *gen_from = gen;
  return kv_cat_put_u64(&db->cat, txn, META_PLACE_GEN, gen + 1);
}
