/* SPDX-License-Identifier: MIT */
/*
 * engine/db/db.c — the top floor (LAYERS): kvdb_options_init, kvdb_open, kvdb_close, and the
 * entry points that compose the operations (engine/ops) with the placement (engine/place).
 *
 * PUT (kvdb_put_ex): check -> (placement on: profile the context and ask the placement for the
 * config it will choose) -> kv_put_context (engine/ops/put.c: hash, encode, write, publish in
 * one catalog transaction; its head comment has the durability order) -> (placement on: place
 * the context). GET (kvdb_get, kvdb_get_notify): kv_get (engine/ops/get.c) -> (placement on:
 * promotion of the context served to the DRAM tier, kv_place_after_get). Lookup, delete and the rest live in
 * engine/ops.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ops/ops.h"
#include "place/place.h"

/* ---- options ------------------------------------------------------------------------------ */

void kvdb_options_init(kvdb_options *opt)
{
  if (opt == NULL)
    return;
  memset(opt, 0, sizeof *opt);
  opt->struct_size = sizeof *opt;
  opt->flags = KVDB_O_CREATE;
  opt->dram_bytes = 256ull << 20;
  opt->ssd_bytes = 0;
  opt->sync_mode = KVDB_SYNC_FULL;
  opt->segment_bytes = 1ull << 30;
  opt->catalog_map_bytes = 64ull << 30;
  opt->use_direct_io = 1;
  opt->use_io_uring = 1;
  opt->log_level = 1;
  kv_place_options_init(opt);
  opt->remote_timeout_ms = 250;
  opt->remote_queue_blocks = 4096;
  opt->remote_copy_hits = 1;
  opt->remote_poll_us = 50;
}

/* ---- get: read -> (placement) promote ----------------------------------------------------- */

kvdb_status kvdb_get_lend(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                          const kvdb_kv_view *out, size_t *hit_tokens, kvdb_block_fn on_block,
                          kvdb_lend_fn on_lend, void *ctx)
{
  uint8_t served_ctx[16];
  int hit;
  kvdb_status rc =
      kv_get(db, m, tokens, n, out, hit_tokens, on_block, on_lend, ctx, served_ctx, &hit);
  if (rc == KVDB_OK && hit)
    kv_place_after_get(db, served_ctx); /* placement on: promote it to DRAM when its utility
                                           says so */
  return rc;
}

kvdb_status kvdb_get_notify(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                            const kvdb_kv_view *out, size_t *hit_tokens, kvdb_block_fn on_block,
                            void *ctx)
{
  return kvdb_get_lend(db, m, tokens, n, out, hit_tokens, on_block, NULL, ctx);
}

void kvdb_lent_return(kvdb *db, const kvdb_lent_block *b)
{
  if (db != NULL && b != NULL && b->lease != NULL && db->dram != NULL)
    kv_dram_unpin(db->dram, (kv_dram_entry *)b->lease);
}

kvdb_status kvdb_dram_memory(kvdb *db, void **base, size_t *bytes)
{
  if (db == NULL || base == NULL || bytes == NULL)
    return kv_fail(KVDB_INVALID, "kvdb_dram_memory: db, base or bytes is NULL");
  if (db->dram == NULL)
    return kv_fail(KVDB_UNSUPPORTED, "kvdb_dram_memory: the DRAM tier is off (options.dram_bytes "
                   "0)");
  kv_dram_region(db->dram, base, bytes);
  return KVDB_OK;
}

kvdb_status kvdb_get(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                     const kvdb_kv_view *out, size_t *hit_tokens)
{
  return kvdb_get_notify(db, m, tokens, n, out, hit_tokens, NULL, NULL);
}

/* ---- put: check -> (placement) config -> write -> (placement) place --------------------- */

kvdb_status kvdb_put(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                     const kvdb_kv_view *kv, kvdb_put_info *info)
{
  return kvdb_put_ex(db, m, tokens, n, kv, NULL, info);
}

/* Whether config c can store every block of an n-token put (a full block and the tail). */
static int config_fits(const kvdb_config *c, const kvdb_model *m, uint32_t bt, size_t n)
{
  if (c->method == KVDB_METHOD_RAW)
    return 1;
  uint32_t sizes[2] = {n >= bt ? bt : 0, (uint32_t)(n % bt)};
  for (int i = 0; i < 2; i++) {
    kv_block_geom g;
    if (sizes[i] == 0)
      continue;
    if (kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                           sizes[i]) != KVDB_OK ||
        kv_cblock_bound(c, &g) == 0) {
      kv_clear_error();
      return 0;
    }
  }
  return 1;
}

kvdb_status kvdb_put_ex(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                        const kvdb_kv_view *kv, const kvdb_put_opts *opts, kvdb_put_info *info)
{
  uint32_t bt;
  KV_RET(kv_put_checks(db, m, &bt, kv));
  if (tokens == NULL || n == 0)
    return kv_fail(KVDB_INVALID, "tokens is NULL or n is 0");
  KV_RET(kv_check_n_tokens(n));
  KV_RET(kv_check_view_extent(kv, m, n, "kv"));
  kvdb_put_opts o;
  KV_RET(kv_put_opts_copy(opts, &o));
  int asked = (o.flags & KVDB_PUT_PROFILE) != 0; /* the caller's: always measured */
  const char *space = o.profile_space;            /* the group's (place/prior.c), as asked */
  kv_place_put_opts(db, &o); /* placement on: profile the context */
  if ((o.flags & ~(uint32_t)KVDB_PUT_PROFILE) != 0)
    return kv_fail(KVDB_INVALID, "opts->flags 0x%x has unknown bits", o.flags);
  KV_RET(kvdb_config_check(m, &o.config));
  kv_queries qs;
  const kv_queries *q;
  KV_RET(kv_opts_queries(&o, m, &qs, &q));
  if (o.config.method == KVDB_METHOD_DROP && o.config.drop == KVDB_DROP_SNAPKV && q == NULL)
    return kv_fail(KVDB_INVALID, "config snapkv needs the prompt's last queries "
                                 "(opts->queries, n_queries, n_q_heads)");
  uint8_t mh[16], ctx[16];
  kv_model_hash(m, bt, mh);
  kvdb_config cfg = o.config;
  kv_profile_rec *profile = NULL;
  kvdb_status rc = KVDB_OK;
  if (o.flags & KVDB_PUT_PROFILE) {
    profile = malloc(sizeof *profile);
    if (profile == NULL)
      return kv_fail(KVDB_NOMEM, "profile");
    /* placement on: measured, or predicted from the handle's measured profiles of its
     * group (place/prior.c PROFILE SAMPLING; placement_profile) */
    uint64_t pkey = kv_place_prior_key(mh, space, o.profile_heads, q != NULL,
                                       o.probe_queries != NULL, n);
    if (asked || !kv_place_prior_predict(db, pkey, n, profile)) {
      kv_queries pqs;
      const kv_queries *pq;
      const uint32_t *pq_pos;
      KV_ERR(kv_opts_probes(&o, m, n, &pqs, &pq, &pq_pos));
      kv_calib cal; /* a calibrated model's int4 / int2 as its puts code them (a damaged
                       calibration: the profile measures them without; such puts fail) */
      if (kv_model_calib_load(db, m, NULL, &cal) != KVDB_OK)
        memset(&cal, 0, sizeof cal);
      kv_model_gains gains; /* the model's output gains: the output-weighted quality (damaged
                               ones: the profile, so the put, fails KVDB_CORRUPT) */
      rc = kv_model_gains_load(db, m, &gains);
      if (rc != KVDB_OK) {
        kv_calib_free(&cal);
        goto out;
      }
      kv_profile_src ps = {.m = m, .block_tokens = bt, .kv = kv, .n_tokens = n, .q = q,
                           .pq = pq, .pq_pos = pq_pos, .space = o.profile_space,
                           .heads = o.profile_heads,
                           .packed_block_bytes = db->opt.packed_block_bytes,
                           .calib = cal.weight != NULL ? &cal : NULL,
                           .gains = gains.g != NULL ? &gains : NULL};
      rc = kv_profile_measure(&ps, profile);
      kv_calib_free(&cal);
      kv_model_gains_free(&gains);
      if (rc != KVDB_OK)
        goto out;
      profile->prior = 0; /* measured: recorded as a profile record */
      kv_place_prior_note(db, pkey, n, profile);
    }
    /* placement on: write it once in the config the placement will choose on the SSD */
    kvdb_config pc = cfg;
    if (kv_place_put_config(db, m, bt, mh, n, profile, &pc) == KVDB_OK &&
        kvdb_config_check(m, &pc) == KVDB_OK && config_fits(&pc, m, bt, n))
      cfg = pc;
    kv_clear_error(); /* only a hint: the placement after the put decides */
  }
  uint64_t t_start = kv_place_now_ns();
  kv_place_put pst;
  kv_put_hook hook;
  int hooked = kv_place_put_hook(db, &pst, &hook); /* placement on: joins the put's commit */
  rc = kv_put_context(db, m, bt, mh, tokens, n, kv, &cfg, q, profile, hooked ? &hook : NULL,
                      info, ctx);
  if (rc == KVDB_OK)
    kv_place_after_put(db, ctx, hooked ? &pst : NULL); /* placement on: place it */
  kv_lat_note(db, KV_LAT_PUT, kv_place_now_ns() - t_start);
out:
  free(profile);
  return rc;
}

/* ---- open / close ----------------------------------------------------------------------- */

static char *dup_printf(const char *a, const char *b)
{
  size_t n = strlen(a) + strlen(b) + 1;
  char *s = malloc(n);
  if (s != NULL)
    snprintf(s, n, "%s%s", a, b);
  return s;
}

/* A remote hit copied to the local store (rtier.c) is placed like a put made without the put's
 * hook: its access counted and the default rule run after its commit. */
static void after_copy(kvdb *db, const uint8_t key[16])
{
  kv_place_after_put(db, key, NULL);
}

kvdb_status kvdb_open(const char *path, const kvdb_options *user, kvdb **out)
{
  kv_clear_error();
  if (out == NULL)
    return kv_fail(KVDB_INVALID, "out is NULL");
  *out = NULL;
  if (path == NULL || path[0] == 0)
    return kv_fail(KVDB_INVALID, "path is NULL or empty");
  if (strlen(path) > 3900)
    return kv_fail(KVDB_INVALID, "path '%.40s...' is too long", path);
  kvdb_options opt;
  kvdb_options_init(&opt);
  if (user != NULL) {
    if (user->struct_size == 0 || user->struct_size > sizeof opt)
      return kv_fail(KVDB_INVALID, "options.struct_size %u: call kvdb_options_init() first",
                     user->struct_size);
    memcpy(&opt, user, user->struct_size);
    opt.struct_size = sizeof opt;
  }
  if ((opt.flags & ~(uint32_t)(KVDB_O_CREATE | KVDB_O_RDONLY)) != 0)
    return kv_fail(KVDB_INVALID, "options.flags 0x%x has unknown bits 0x%x (known: KVDB_O_CREATE, "
                   "KVDB_O_RDONLY)", opt.flags,
                   opt.flags & ~(uint32_t)(KVDB_O_CREATE | KVDB_O_RDONLY));
  if (opt.log_level < -1 || opt.log_level > 3)
    return kv_fail(KVDB_INVALID, "options.log_level %d is not -1 (nothing), 0 (errors), "
                   "1 (warnings), 2 (info) or 3 (debug)", opt.log_level);
  if (opt.use_direct_io != 0 && opt.use_direct_io != 1)
    return kv_fail(KVDB_INVALID, "options.use_direct_io %d is not 0 or 1", opt.use_direct_io);
  if (opt.use_io_uring != 0 && opt.use_io_uring != 1)
    return kv_fail(KVDB_INVALID, "options.use_io_uring %d is not 0 or 1", opt.use_io_uring);
  if (opt.segment_bytes < (1u << 20))
    return kv_fail(KVDB_INVALID, "segment_bytes %" PRIu64 " is below 1 MiB", opt.segment_bytes);
  if (opt.catalog_map_bytes < (1u << 20))
    return kv_fail(KVDB_INVALID, "catalog_map_bytes %" PRIu64 " is below 1 MiB",
                   opt.catalog_map_bytes);
  if (opt.sync_mode != KVDB_SYNC_FULL && opt.sync_mode != KVDB_SYNC_NONE)
    return kv_fail(KVDB_INVALID, "sync_mode %d is not KVDB_SYNC_FULL or KVDB_SYNC_NONE",
                   (int)opt.sync_mode);
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
    const kvdb_tier_perf *f = &opt.tier_perf[t];
    if (!isfinite(f->read_bps) || !isfinite(f->latency_s) || f->read_bps < 0 ||
        f->latency_s < 0 || (f->read_bps == 0 && f->latency_s != 0))
      return kv_fail(KVDB_INVALID, "options.tier_perf[%u]: read_bps %g, latency_s %g (both "
                     ">= 0 and finite; a latency needs a bandwidth)", t, f->read_bps,
                     f->latency_s);
  }
  if (opt.packed_block_bytes > 1 &&
      (opt.packed_block_bytes < 4096 || opt.packed_block_bytes > (16u << 20)))
    return kv_fail(KVDB_INVALID, "options.packed_block_bytes %u is not 0 (default), 1 (never) "
                   "or 4096 .. 16 MiB", opt.packed_block_bytes);
  if (opt.lossless_frame_bytes != 0 &&
      (opt.lossless_frame_bytes < 4096 || opt.lossless_frame_bytes > (16u << 20)))
    return kv_fail(KVDB_INVALID, "options.lossless_frame_bytes %u is not 0 (default) or "
                   "4096 .. 16 MiB", opt.lossless_frame_bytes);
  KV_RET(kv_place_options_check(&opt));
  if (!(opt.prefetch_bps >= 0 && opt.prefetch_bps < 1e300))
    return kv_fail(KVDB_INVALID, "options.prefetch_bps %g is not a finite number >= 0",
                   opt.prefetch_bps);
  if ((opt.remote_write & ~(uint32_t)(KVDB_REMOTE_WRITE_PUT | KVDB_REMOTE_WRITE_EVICT)) != 0)
    return kv_fail(KVDB_INVALID, "options.remote_write 0x%x has unknown bits (known: "
                   "KVDB_REMOTE_WRITE_PUT 1, KVDB_REMOTE_WRITE_EVICT 2)", opt.remote_write);
  if (opt.remote_hash_tag > KVDB_REMOTE_TAG_ROOT)
    return kv_fail(KVDB_INVALID, "options.remote_hash_tag %u is not KVDB_REMOTE_TAG_NONE (0) "
                   "or KVDB_REMOTE_TAG_ROOT (1)", opt.remote_hash_tag);
  if (opt.remote_copy_hits > 1)
    return kv_fail(KVDB_INVALID, "options.remote_copy_hits %u is not 0 or 1",
                   opt.remote_copy_hits);
  if (opt.remote_poll_us > 10000)
    return kv_fail(KVDB_INVALID, "options.remote_poll_us %u is above 10000",
                   opt.remote_poll_us);
  int rdonly = (opt.flags & KVDB_O_RDONLY) != 0;
  int create = !rdonly && (opt.flags & KVDB_O_CREATE) != 0;

  struct stat st;
  if (stat(path, &st) != 0) {
    if (!create)
      return kv_fail(KVDB_NOTFOUND, "no database directory '%s'", path);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return kv_fail_errno(errno, "cannot create database directory '%s'", path);
  } else if (!S_ISDIR(st.st_mode)) {
    return kv_fail(KVDB_INVALID, "'%s' is not a directory", path);
  }
  if (!rdonly && access(path, W_OK) != 0)
    return kv_fail(KVDB_READONLY, "database directory '%s' is not writable (open with "
                   "KVDB_O_RDONLY to read it)", path);

  kvdb *db = calloc(1, sizeof *db);
  if (db == NULL)
    return kv_fail(KVDB_NOMEM, "cannot allocate the handle");
  kvdb_status rc = KVDB_OK;
  db->opt = opt;
  db->log = (kv_logger){opt.log_fn, opt.log_ctx, opt.log_level};
  pthread_mutex_init(&db->mu, NULL);
  db->dir = strdup(path);
  db->seg_dir = dup_printf(path, "/ssd");
  if (db->dir == NULL || db->seg_dir == NULL) {
    rc = kv_fail(KVDB_NOMEM, "cannot allocate paths");
    goto fail;
  }
  rc = kv_catalog_open(&db->cat, path, opt.catalog_map_bytes, rdonly, create,
                       opt.sync_mode == KVDB_SYNC_NONE);
  if (rc != KVDB_OK)
    goto fail;
  if (!rdonly && mkdir(db->seg_dir, 0755) != 0 && errno != EEXIST) {
    rc = kv_fail_errno(errno, "cannot create segment directory '%s'", db->seg_dir);
    goto fail;
  }
  db->os_io = kv_io_os_create(opt.use_io_uring);
  if (db->os_io == NULL) {
    rc = kv_fail(KVDB_NOMEM, "cannot create the I/O layer");
    goto fail;
  }
  if (opt.use_io_uring && !db->os_io->uring)
    kv_log(&db->log, 1, "io_uring is not available here; using pread/pwrite");
  db->io = kv_io_test_wrap ? kv_io_test_wrap(db->os_io) : db->os_io;
  db->direct = opt.use_direct_io;
  if (opt.dram_bytes >= KV_PAGE) {
    db->dram = kv_dram_create(opt.dram_bytes);
    if (db->dram == NULL) {
      rc = kv_fail(KVDB_NOMEM, "cannot reserve %" PRIu64 " bytes for the DRAM tier",
                   opt.dram_bytes);
      goto fail;
    }
  }
  rc = kv_place_open(db); /* SmartSSD directory (recovery needs it), placement state */
  if (rc != KVDB_OK)
    goto fail;
  db->magic = KVDB_MAGIC_OPEN;
  if (!rdonly) {
    rc = kv_recover(db);
    if (rc != KVDB_OK)
      goto fail;
    kv_counts_open(&db->cat); /* kvdb_stat's counters, for a database an older build wrote */
  }
  db->after_copy = after_copy; /* set before the remote tier's thread starts */
  rc = kv_rtier_open(db); /* the remote tier when remote_addr names one (no connection yet) */
  if (rc != KVDB_OK)
    goto fail;
  *out = db;
  return KVDB_OK;
fail:
  db->magic = KVDB_MAGIC_OPEN;
  {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvdb_errmsg());
    kvdb_close(db);
    kv_fail(rc, "%s", msg);
  }
  return rc;
}

void kvdb_close(kvdb *db)
{
  if (db == NULL || db->magic != KVDB_MAGIC_OPEN)
    return;
  kv_prefetch_close(db); /* first: its worker reads through everything below */
  kv_rtier_close(db);    /* then the write-through thread, which reads blocks likewise */
  if (db->n_pending > 0 && !db->cat.rdonly && db->cat.env != NULL) {
    kv_txn *txn;
    if (kv_txn_begin(&db->cat, 1, &txn) == KVDB_OK) {
      if (kv_flush_atime(db, txn) == KVDB_OK)
        kv_txn_commit(txn);
      else
        kv_txn_abort(txn);
    }
  }
  if (db->io != NULL) {
    kv_writers_free(db);
    kv_rbufs_free(db);
    kv_files_free(db);
  }
  kv_place_close(db);
  kv_score_close(db);
  kv_catalog_close(&db->cat);
  kv_io_destroy(db->os_io);
  kv_dram_destroy(db->dram);
  free(db->pending);
  free(db->dir);
  free(db->seg_dir);
  pthread_mutex_destroy(&db->mu);
  db->magic = KVDB_MAGIC_CLOSED;
  free(db);
}
