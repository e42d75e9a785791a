/* SPDX-License-Identifier: MIT */
/*
 * engine/place/relocate.c — move a stored context to another (config, tier) in one
 * transaction: kvdb_relocate, kvdb_recompress, and the executor of the placement policy's
 * moves (EvicPress §4.4: "recompress" and "evict to the next tier").
 *
 * RELOCATION of context C to (config K, tier T):
 *   1. a read transaction lists C's blocks; a block is rewritten when C alone uses it
 *      (refcount 1: blocks shared with other contexts keep where and how they are stored) and
 *      its config or tier differs from the target
 *   2. the new objects are written to a segment of tier T owned by this handle: copied as they
 *      are (verified first) when only the tier changes, else built anew from C's decoded KV
 *      (kvdb_get_context) with config K; then fdatasync
 *   3. one write transaction checks each rewritten block is still where step 1 saw it and
 *      still C's alone (else KVDB_BUSY: nothing is published), points it at its new copy
 *      (tier, config, place), releases the old bytes (dead space for compaction), updates C's
 *      record (config, bytes), its profile (the stored entry), its ctxstats tier, and the
 *      segment's end; commit
 *   A crash before step 3 commits leaves C as it was and an unreferenced tail in T's segment
 *   (truncated by recovery); after it, C is wholly at its new place. Readers holding an older
 *   snapshot keep reading the old copies (their bytes stay until a compaction).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "catalog/catalog.h"
#include "place.h"

typedef struct rblk {
  uint8_t hash[16], parent[16];
  kv_block_rec old; /* as step 1 saw it (tokens NULL) */
  uint32_t *tokens; /* into the relocation's token array */
  uint64_t t0;
  int write;
  uint64_t off, obj_bytes; /* its new copy */
  int packed;              /* re-encoded as a packed compressed object (FORMAT.md §3f) */
} rblk;

typedef struct reloc {
  const kvdb_model *m;
  uint32_t bt;
  uint8_t ctx[16], mh[16];
  kvdb_config cfg;   /* the target config */
  uint32_t tier;     /* the target tier, or KV_TIER_KEEP */
  int reencode;      /* the config changes: build objects anew */
  uint64_t n_tokens;
  uint32_t n;
  rblk *b;
  uint32_t *tokens;
  unsigned sv;       /* re-encoded blocks' score copy variant (kv_score_variant_for) */
} reloc;

static void reloc_free(reloc *r)
{
  free(r->b);
  free(r->tokens);
}

static int tier_of(const reloc *r, const rblk *b)
{
  return r->tier == KV_TIER_KEEP ? (int)b->old.tier : (int)r->tier;
}

/* Step 1: C's blocks and tokens; the blocks a tier move rewrites. */
static kvdb_status survey(kvdb *db, reloc *r, kv_ctx_rec *cr_out)
{
  kv_txn *txn;
  char hx[33];
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_ctx_rec cr;
  kvdb_status rc = kv_ctx_of_model(db, txn, r->ctx, r->mh, r->m, &cr);
  if (rc != KVDB_OK)
    goto out;
  *cr_out = cr;
  cr_out->blocks = NULL;
  r->n = cr.n_blocks;
  r->n_tokens = cr.n_tokens;
  r->b = calloc(r->n, sizeof *r->b);
  r->tokens = malloc((cr.n_tokens > 0 ? cr.n_tokens : 1) * sizeof *r->tokens);
  if (r->b == NULL || r->tokens == NULL) {
    rc = kv_fail(KVDB_NOMEM, "relocation of %u blocks", r->n);
    goto out;
  }
  uint64_t t0 = 0;
  for (uint32_t i = 0; i < r->n; i++) {
    rblk *b = &r->b[i];
    memcpy(b->hash, cr.blocks + 16 * i, 16);
    KV_ERR(kv_cat_get_block(&db->cat, txn, b->hash, &b->old));
    if (t0 + b->old.n_tokens > cr.n_tokens) {
      rc = kv_fail(KVDB_CORRUPT, "context %s has more tokens in its blocks",
                   kv_hex16(r->ctx, hx));
      goto out;
    }
    for (uint32_t t = 0; t < b->old.n_tokens; t++)
      r->tokens[t0 + t] = kv_get_le32(b->old.tokens + 4 * t);
    b->old.tokens = NULL; /* points into the transaction */
    memcpy(b->parent, b->old.parent, 16);
    b->tokens = r->tokens + t0;
    b->t0 = t0;
    t0 += b->old.n_tokens;
    b->write = b->old.refcount == 1 && (uint32_t)tier_of(r, b) != b->old.tier;
  }
out:
  kv_txn_abort(txn);
  return rc;
}

/* Step 2: the new objects into w, synced. *written = bytes appended past w->end. */
static kvdb_status write_objects(kvdb *db, reloc *r, kv_writer *w, const kv_queries *q,
                                 uint64_t *written)
{
  *written = 0;
  kvdb_status rc = KVDB_OK;
  uint8_t *kvbuf = NULL, *obj = NULL;
  size_t obj_cap = 0;
  kvdb_kv_view v;
  kv_cenc enc;
  memset(&enc, 0, sizeof enc);
  kv_calib cal; /* int4 / int2 of a calibrated model: re-encoded with its calibration */
  memset(&cal, 0, sizeof cal);
  if (r->reencode)
    KV_RET(kv_model_calib_load(db, r->m, &r->cfg, &cal));
  const kv_calib *calp = cal.weight != NULL ? &cal : NULL;
  kv_run run;
  if ((rc = kv_run_open(&run, w->end)) != KVDB_OK) {
    kv_calib_free(&cal);
    return rc;
  }
  if (r->reencode) { /* the context as stored, decoded, in vLLM's layout */
    size_t tb = kvdb_model_token_bytes(r->m);
    kvbuf = kv_alloc_aligned(r->n_tokens * tb);
    if (kvbuf == NULL) {
      rc = kv_fail(KVDB_NOMEM, "cannot allocate the context's %" PRIu64 " tokens", r->n_tokens);
      goto out;
    }
    KV_ERR(kvdb_kv_view_packed(&v, kvbuf, r->m, r->n_tokens, KVDB_LAYOUT_LKTHD));
    kvdb_key k;
    memcpy(k.b, r->ctx, 16);
    KV_ERR(kvdb_get_context(db, r->m, &k, &v, NULL, NULL));
  }
  for (uint32_t i = 0; i < r->n; i++) {
    rblk *b = &r->b[i];
    if (!b->write)
      continue;
    kv_block_geom g;
    KV_ERR(kv_block_geom_init(&g, r->m->n_layers, r->m->n_kv_heads, r->m->head_dim,
                              r->m->dtype, r->bt, b->old.n_tokens));
    uint64_t need = b->old.bytes;
    if (r->reencode) {
      need = r->cfg.method == KVDB_METHOD_RAW ? g.total_bytes
                                               : kv_cblock_bound_cal(&r->cfg, &g, calp);
      if (need != 0) /* a model with score copies: they follow each object (block/cblock.h) */
        need += kv_score_region_bytes(&g, r->m->score_bits, r->sv);
    }
    if (need == 0) {
      char nm[48];
      rc = kv_fail(KVDB_INVALID, "config '%s' cannot store block %u",
                   kvdb_config_name(&r->cfg, nm, sizeof nm), i);
      goto out;
    }
    /* a packed object (FORMAT.md §3e) moved as it is stays packed (on any tier: the bytes the
     * placement counted), in a run of its own padded to a page below */
    need = KV_ALIGN_UP(need, (uint64_t)KV_PAGE);
    if (need > obj_cap) {
      kv_free_aligned(obj);
      obj = kv_alloc_aligned(need);
      obj_cap = obj != NULL ? need : 0;
      if (obj == NULL) {
        rc = kv_fail(KVDB_NOMEM, "cannot allocate %" PRIu64 " bytes for a block", need);
        goto out;
      }
    }
    if (!r->reencode) { /* the object as it is, verified */
      kv_block_hdr hdr;
      KV_ERR(kv_block_read_verify(db, &b->old, b->hash, obj, &hdr));
      b->obj_bytes = b->old.bytes;
    } else if (r->cfg.method == KVDB_METHOD_RAW) {
      memset(obj, 0, g.total_bytes);
      kv_gather(&g, &v, b->t0, obj + g.meta_bytes);
      kv_block_seal(&g, b->hash, b->parent, r->mh, b->tokens, obj);
      b->obj_bytes = g.total_bytes;
    } else {
      kv_cblock_src src = {.cfg = &r->cfg, .g = &g, .kv = &v, .t0 = b->t0, .keep_t0 = b->t0,
                           .ctx_tokens = r->n_tokens, .q = q, .last_block = i + 1 == r->n,
                           .index = i, .hash = b->hash, .parent = b->parent,
                           .model_hash = r->mh, .tokens = b->tokens,
                           .frame_bytes = db->opt.lossless_frame_bytes,
                           .rope = {r->m->rope_base, r->m->rope_style}, .calib = calp};
      /* packed (FORMAT.md §3f) as a put would: no score copies; on either tier (the near-data
       * device reads raw page groups and score copies only, never a compressed object), so
       * that a placement's recompression to the SmartSSD tier stores the bytes its profile
       * counted */
      if (r->m->score_bits == 0 && db->opt.packed_block_bytes != 1)
        src.pack_max = db->opt.packed_block_bytes > 1 ? db->opt.packed_block_bytes
                                                      : KV_PACK_MAX_DEFAULT;
      KV_ERR(kv_cblock_build(&src, &enc, obj, obj_cap, &b->obj_bytes));
      b->packed = src.pack_max != 0 && enc.packed;
    }
    if (r->reencode)
      KV_ERR(kv_score_block_append(r->m, r->sv, &g, &v, b->t0, b->hash, obj, &b->obj_bytes));
    /* packed objects moved as they are stay packed, back to back (FORMAT.md §3e) */
    rc = kv_run_put(db, w, &run, obj, b->obj_bytes,
                    r->reencode ? b->packed : (b->old.bflags & KV_BLK_PACKED) != 0, &b->off);
    *written = run.base - w->end;
    if (rc != KVDB_OK)
      goto out;
  }
  rc = kv_run_close(db, w, &run, 1);
  *written = run.base - w->end;
  if (rc != KVDB_OK)
    goto out;
  if (*written > 0 && db->opt.sync_mode == KVDB_SYNC_FULL) {
    int e = db->io->ops->sync(db->io, kv_writer_file(w));
    if (e != 0)
      rc = kv_fail_errno(-e, "cannot fdatasync segment %" PRIx64, w->seg_id);
  }
out:
  kv_run_close(db, w, &run, 0); /* (closed above on success: nothing left) */
  kv_cenc_free(&enc);
  kv_calib_free(&cal);
  kv_free_aligned(obj);
  kv_free_aligned(kvbuf);
  return rc;
}

/* Step 3: publish. */
static kvdb_status publish(kvdb *db, reloc *r, kv_writer *w, uint64_t written, int *sealed)
{
  kv_txn *txn;
  kvdb_status rc;
  char hx[33];
  uint8_t *buf = NULL, *blocks = NULL, *cbuf = NULL;
  kv_profile_rec *p = NULL;
  *sealed = 0;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kv_ctx_rec cr;
  rc = kv_cat_get_ctx(&db->cat, txn, r->ctx, &cr);
  if (rc == KVDB_NOTFOUND)
    rc = kv_fail(KVDB_BUSY, "context %s was deleted during its relocation", kv_hex16(r->ctx, hx));
  if (rc != KVDB_OK)
    goto out;
  buf = malloc(kv_block_rec_size(r->bt));
  if (buf == NULL) {
    rc = kv_fail(KVDB_NOMEM, "block record");
    goto out;
  }
  uint64_t new_bytes = 0, new_blocks = 0, ctx_bytes = 0;
  uint32_t last_tier = KVDB_TIER_SSD, was_tier = kv_cat_ctx_tier(&db->cat, txn, &cr);
  for (uint32_t i = 0; i < r->n; i++) {
    rblk *b = &r->b[i];
    kv_block_rec br;
    KV_ERR(kv_cat_get_block(&db->cat, txn, b->hash, &br));
    if (b->write) {
      if (br.segment != b->old.segment || br.offset != b->old.offset || br.refcount != 1) {
        rc = kv_fail(KVDB_BUSY, "block %u of context %s changed during its relocation", i,
                     kv_hex16(r->ctx, hx));
        goto out;
      }
      uint64_t from = br.segment;
      KV_ERR(kv_seg_unref(db, txn, br.segment, br.bytes));
      br.segment = w->seg_id;
      br.offset = b->off;
      br.bytes = b->obj_bytes;
      br.tier = w->tier;
      if (r->reencode) {
        kv_block_rec_set_config(&br, &r->cfg);
        kv_block_rec_set_kept(&br, &r->cfg, b->t0);
        br.bflags |= kv_score_rec_flags(r->m->score_bits, r->sv);
        if (b->packed) {
          br.bflags |= KV_BLK_PACKED;
          KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_PCPR));
        }
      }
      kv_block_rec_encode(&br, NULL, buf);
      KV_ERR(kv_cat_put_raw(&db->cat, txn, KV_TBL_BLOCKS, b->hash, 16, buf,
                            kv_block_rec_size(br.n_tokens), "put block"));
      KV_ERR(kv_idx_seg_move(&db->cat, txn, from, w->seg_id, b->hash));
      new_bytes += br.bytes;
      new_blocks++;
    }
    ctx_bytes += br.bytes;
    last_tier = br.tier;
  }
  blocks = malloc(16 * (size_t)cr.n_blocks);
  if (blocks == NULL) {
    rc = kv_fail(KVDB_NOMEM, "context record");
    goto out;
  }
  memcpy(blocks, cr.blocks, 16 * (size_t)cr.n_blocks);
  cr.config = r->cfg;
  cr.bytes = ctx_bytes;
  size_t clen = kv_ctx_rec_size(&cr, cr.n_blocks);
  cbuf = malloc(clen);
  if (cbuf == NULL) {
    rc = kv_fail(KVDB_NOMEM, "context record");
    goto out;
  }
  kv_ctx_rec_encode(&cr, blocks, cbuf);
  KV_ERR(kv_cat_put_raw(&db->cat, txn, KV_TBL_CONTEXTS, r->ctx, 16, cbuf, clen, "put context"));
  if (r->cfg.method != KVDB_METHOD_RAW)
    KV_ERR(kv_cat_require_format(&db->cat, txn, 2));
  if (r->reencode && r->cfg.method == KVDB_METHOD_LOSSLESS)
    KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_FRAMES)); /* lossless frames */
  if (r->reencode && (kv_score_rec_flags(r->m->score_bits, r->sv) & KV_BLK_SCOREV2))
    KV_ERR(kv_cat_require_format(&db->cat, txn, KV_FORMAT_SCOREV2)); /* version-2 copies */
  if (last_tier != was_tier) { /* kvdb_stat's per-tier context counts */
    KV_ERR(kv_counts_add(&db->cat, txn, was_tier, KV_CNT_CONTEXTS, -1));
    KV_ERR(kv_counts_add(&db->cat, txn, last_tier, KV_CNT_CONTEXTS, 1));
  }
  if (r->reencode) { /* the profile now says how the context is stored */
    p = malloc(sizeof *p);
    if (p == NULL) {
      rc = kv_fail(KVDB_NOMEM, "profile");
      goto out;
    }
    rc = kv_cat_get_profile(&db->cat, txn, r->ctx, p);
    if (rc == KVDB_OK) {
      kv_profile_mark_stored(p, &r->cfg, ctx_bytes);
      rc = kv_cat_put_profile(&db->cat, txn, r->ctx, p);
    } else if (rc == KVDB_NOTFOUND) {
      rc = KVDB_OK;
    }
    if (rc != KVDB_OK)
      goto out;
  }
  if (db->cat.has_ctxstats) { /* where the context is now */
    kv_ctxstats cs;
    rc = kv_cat_get_ctxstats(&db->cat, txn, r->ctx, &cs);
    if (rc == KVDB_OK && cs.tier != last_tier) {
      cs.tier = last_tier;
      rc = kv_cat_put_ctxstats(&db->cat, txn, r->ctx, &cs);
    } else if (rc == KVDB_NOTFOUND || rc == KVDB_CORRUPT) {
      rc = KVDB_OK; /* none kept yet (a damaged one is rewritten by the next access) */
    }
    if (rc != KVDB_OK)
      goto out;
  }
  if (w != NULL) {
    kv_seg_rec sr;
    KV_ERR(kv_cat_get_seg(&db->cat, txn, w->seg_id, &sr));
    sr.end = w->end + written;
    sr.live_bytes += new_bytes;
    sr.live_blocks += new_blocks;
    if (sr.end >= db->opt.segment_bytes) {
      sr.state = KV_SEG_SEALED;
      *sealed = 1;
    }
    KV_ERR(kv_cat_put_seg(&db->cat, txn, w->seg_id, &sr));
  }
  KV_ERR(kv_flush_atime(db, txn));
  rc = kv_txn_commit(txn);
  txn = NULL;
out:
  if (txn != NULL)
    kv_txn_abort(txn);
  if (rc != KVDB_OK)
    *sealed = 0;
  free(buf);
  free(blocks);
  free(cbuf);
  free(p);
  return rc;
}

kvdb_status kv_relocate(kvdb *db, const kvdb_model *m, const uint8_t ctx[16],
                        const kvdb_config *to, uint32_t tier, const kv_queries *q, int smart_ok)
{
  char hx[33];
  reloc r;
  memset(&r, 0, sizeof r);
  r.m = m;
  r.sv = kv_score_variant_for(db, m);
  KV_RET(kv_check_model(m, &r.bt));
  kv_model_hash(m, r.bt, r.mh);
  memcpy(r.ctx, ctx, 16);
  r.tier = tier;
  if (tier != KV_TIER_KEEP) {
    if (tier != KVDB_TIER_SSD && tier != KVDB_TIER_SMARTSSD)
      return kv_fail(KVDB_INVALID, "tier %u is not a persistent tier (KVDB_TIER_SSD or "
                     "KVDB_TIER_SMARTSSD)", tier);
    if (tier == KVDB_TIER_SMARTSSD && (!smart_ok || kv_smart_dir(db) == NULL))
      return kv_fail(KVDB_INVALID, "this handle has no SmartSSD tier "
                     "(kvdb_options.smartssd_bytes is 0)");
  }
  kv_ctx_rec cr;
  kvdb_status rc = survey(db, &r, &cr);
  if (rc != KVDB_OK) {
    reloc_free(&r);
    return rc;
  }
  r.cfg = to != NULL ? *to : cr.config;
  if (to != NULL && !kv_policy_config_equal(&cr.config, to)) {
    char have_nm[48], to_nm[48];
    kvdb_config_name(&cr.config, have_nm, sizeof have_nm);
    kvdb_config_name(to, to_nm, sizeof to_nm);
    if (!kv_policy_config_reachable(&cr.config, to)) {
      reloc_free(&r);
      return kv_fail(KVDB_INVALID,
                     "context %s is stored as '%s': re-encoding it to '%s' would need precision "
                     "or tokens it no longer has",
                     kv_hex16(ctx, hx), have_nm, to_nm);
    }
    r.reencode = 1;
    for (uint32_t i = 0; i < r.n; i++) /* every block C owns alone takes the new config */
      r.b[i].write = r.b[i].old.refcount == 1;
  } else if (to != NULL && tier == KV_TIER_KEEP && to->method == KVDB_METHOD_LOSSLESS) {
    /* kvdb_recompress to the same lossless config: rewritten in this build's lossless format
     * (frames), the migration of blocks an earlier build wrote as zstd-planes sections */
    r.reencode = 1;
    for (uint32_t i = 0; i < r.n; i++)
      r.b[i].write = r.b[i].old.refcount == 1;
  }
  int need_write = 0, ctx_changes = r.reencode;
  uint32_t wtier = tier;
  for (uint32_t i = 0; i < r.n; i++) {
    need_write |= r.b[i].write;
    if (r.b[i].write && wtier == KV_TIER_KEEP)
      wtier = r.b[i].old.tier; /* KEEP: a re-encoding rewrites each owned block in place */
  }
  if (!need_write && !ctx_changes) {
    reloc_free(&r);
    return KVDB_OK;
  }
  /* KEEP with blocks on several tiers: blocks on other tiers than the first rewritten one
   * move to it (a context's owned blocks normally share one tier) */
  if (tier == KV_TIER_KEEP && wtier != KV_TIER_KEEP)
    r.tier = wtier;
  kv_writer *w = NULL;
  uint64_t written = 0;
  int sealed = 0;
  if (need_write) {
    rc = kv_writer_acquire_tier(db, wtier, &w);
    if (rc == KVDB_OK)
      rc = write_objects(db, &r, w, q, &written);
  }
  if (rc == KVDB_OK)
    rc = publish(db, &r, w, written, &sealed);
  if (w != NULL) {
    if (rc == KVDB_OK) {
      w->end += written;
      db->bytes_written += written;
    } else if (db->io->ops->truncate(db->io, kv_writer_file(w), w->end) != 0) {
      w->end += written; /* the tail stays (recovery truncates it once the writer is gone) */
    }
    kv_writer_release(db, w, sealed);
  }
  if (rc == KVDB_OK && r.reencode && db->dram != NULL) /* decoded copies of the old encoding */
    for (uint32_t i = 0; i < r.n; i++)
      if (r.b[i].write)
        kv_dram_remove(db->dram, r.b[i].hash);
  if (rc == KVDB_OK)
    db->relocations++;
  reloc_free(&r);
  return rc;
}

/* The options of kvdb_put_opts used here (queries), as this build's struct. */
static kvdb_status opts_queries(const kvdb_put_opts *in, const kvdb_model *m, kv_queries *qs,
                                const kv_queries **q)
{
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  if (in != NULL) {
    if (in->struct_size < offsetof(kvdb_put_opts, queries) || in->struct_size > 4096)
      return kv_fail(KVDB_INVALID, "opts->struct_size %u: call kvdb_put_opts_init() first",
                     in->struct_size);
    memcpy(&o, in, in->struct_size < sizeof o ? in->struct_size : sizeof o);
  }
  return kv_opts_queries(&o, m, qs, q);
}

static kvdb_status relocate_api(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                const kvdb_config *to, uint32_t tier, const kvdb_put_opts *opts)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (context == NULL)
    return kv_fail(KVDB_INVALID, "context is NULL");
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  if (to != NULL)
    KV_RET(kvdb_config_check(m, to));
  kv_queries qs;
  const kv_queries *q;
  KV_RET(opts_queries(opts, m, &qs, &q));
  if (to != NULL && to->method == KVDB_METHOD_DROP && to->drop == KVDB_DROP_SNAPKV && q == NULL)
    return kv_fail(KVDB_INVALID, "config snapkv needs the prompt's last queries (opts->queries)");
  kv_place_view_drop(db); /* the tiers' contents change outside the placement */
  return kv_relocate(db, m, context->b, to, tier, q, db->opt.smartssd_bytes > 0);
}

kvdb_status kvdb_relocate(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                          const kvdb_config *to, kvdb_tier tier, const kvdb_put_opts *opts)
{
  return relocate_api(db, m, context, to, (uint32_t)tier, opts);
}

kvdb_status kvdb_recompress(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                            const kvdb_config *to, const kvdb_put_opts *opts)
{
  if (to == NULL) {
    kv_clear_error();
    return kv_fail(KVDB_INVALID, "context or config is NULL");
  }
  return relocate_api(db, m, context, to, KV_TIER_KEEP, opts);
}
