/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/context.c — whole stored contexts: kvdb_get_context (every config, dropped
 * tokens included: the kept rows of each layer and KV head with their positions), a prefix's
 * kept rows at their own positions with a mask of the absent ones (kvdb_get_kept), and the
 * on-demand profile (kvdb_profile), which measures from the context as stored.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "ops_int.h"

/* Reading state of one call. */
typedef struct ctx_reader {
  kv_rbuf *buf;   /* a block object */
  uint8_t *rows;  /* contiguous rows of one section (raw blocks with padded groups) */
  uint32_t *pos;  /* positions of one decoded section */
  kv_cdec dec;
} ctx_reader;

static void reader_free(kvdb *db, ctx_reader *r)
{
  kv_rbuf_release(db, r->buf);
  free(r->rows);
  free(r->pos);
  kv_cdec_free(&r->dec);
}

/* The contiguous rows of section s of a raw data region (no copy when groups are unpadded). */
static const uint8_t *raw_rows(const kv_block_geom *g, const uint8_t *data, uint32_t s,
                               uint8_t *tmp)
{
  if (g->group_stride == (uint64_t)g->group_tokens * g->row_bytes)
    return data + (uint64_t)s * g->section_bytes;
  for (uint32_t t = 0; t < g->n_tokens; t++)
    memcpy(tmp + (uint64_t)t * g->row_bytes,
           data + (uint64_t)s * g->section_bytes + (uint64_t)(t / g->group_tokens) * g->group_stride +
               (uint64_t)(t % g->group_tokens) * g->row_bytes,
           g->row_bytes);
  return tmp;
}

/* kvdb_get_kept's placement of a block's rows: at their own positions, the first n_copy tokens
 * of the block only, each row delivered marked in present[(l * H + h) * n + position]; kept:
 * the rows per (layer, KV head) the block must deliver (kv_hit_kept). */
typedef struct rows_at {
  const uint32_t *tokens; /* the query's tokens from the block's first position */
  uint32_t n_copy, kept;
  uint8_t *present;
  size_t n;
} rows_at;

/*
 * One block of a context into `out`: for each (layer, KV head) its rows go after the rows
 * already delivered for it (base[l * H + h]), positions t0 + token. With `at`, instead each
 * row goes to token t0 + its position (rows_at above; base, positions and n_tokens unused).
 */
static kvdb_status block_out(kvdb *db, ctx_reader *cr, const kvdb_model *m, uint32_t bt,
                             const kv_block_rec *rec, const uint8_t *hash, uint64_t t0,
                             uint64_t n_tokens, const kvdb_kv_view *out, uint32_t *positions,
                             uint32_t *base, const rows_at *at)
{
  kv_block_geom g;
  KV_RET(kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                            rec->n_tokens));
  kv_rec_geom(&g, rec);
  uint32_t H = m->n_kv_heads;
  const uint8_t *data = NULL;
  kv_dram_entry *pin = NULL;
  kv_block_hdr hdr;
  memset(&hdr, 0, sizeof hdr);
  if (db->dram != NULL && !(rec->bflags & KV_BLK_DROPS)) {
    const uint8_t *d;
    uint64_t len;
    pin = kv_dram_pin(db->dram, hash, &d, &len);
    if (pin != NULL && len == g.data_bytes) {
      data = d;
      hdr.version = 1;
    } else if (pin != NULL) {
      kv_dram_unpin(db->dram, pin);
      pin = NULL;
    }
  }
  kvdb_status rc = KVDB_OK;
  if (data == NULL) {
    kv_rbuf_release(db, cr->buf);
    cr->buf = kv_rbuf_acquire(db, rec->bytes);
    if (cr->buf == NULL)
      return kv_fail(KVDB_NOMEM, "cannot allocate %" PRIu64 " bytes to read a block", rec->bytes);
    rc = kv_block_read_verify(db, rec, hash, cr->buf->p, &hdr);
    if (rc != KVDB_OK) {
      if (rc == KVDB_CORRUPT)
        db->corrupt_blocks++;
      return rc;
    }
    db->bytes_read += rec->bytes;
    db->ssd_hits++;
    /* the hit's tokens as the block stores them (verified) must be the query's: the walk
     * matched the catalog record's copy, which has no checksum of its own */
    for (uint32_t i = 0; at != NULL && i < at->n_copy; i++)
      if (kv_get_le32(cr->buf->p + KV_BLOCK_HDR_BYTES + 4 * i) != at->tokens[i]) {
        db->corrupt_blocks++;
        return kv_fail(KVDB_CORRUPT, "block at offset %" PRIu64 " of segment %" PRIu64
                                     ": its token %u is not the one its catalog record lists",
                       rec->offset, rec->segment, i);
      }
    if (!KV_HDR_CPR(&hdr))
      data = cr->buf->p + g.meta_bytes;
  }
  if (KV_HDR_CPR(&hdr) && cr->dec.ctx == NULL)
    KV_RET(kv_cdec_init(&cr->dec));
  for (uint32_t s = 0; rc == KVDB_OK && s < g.n_sections; s += 2) {
    uint32_t lh = s / 2, nr = 0;
    for (uint32_t kv = 0; rc == KVDB_OK && kv < 2; kv++) {
      const uint8_t *rows;
      uint32_t n_rows;
      if (KV_HDR_CPR(&hdr)) {
        rc = kv_cblock_decode_section(&hdr, cr->buf->p, s + kv, &cr->dec, &rows, &n_rows,
                                      kv == 0 ? cr->pos : NULL);
      } else {
        rows = raw_rows(&g, data, s + kv, cr->rows);
        n_rows = g.n_tokens;
        if (kv == 0)
          for (uint32_t t = 0; t < n_rows; t++)
            cr->pos[t] = t;
      }
      if (rc != KVDB_OK)
        break;
      if (kv == 1 && n_rows != nr)
        rc = kv_fail(KVDB_CORRUPT, "block at offset %" PRIu64 " of segment %" PRIu64
                                   ": K and V of section pair %u keep %u and %u rows",
                     rec->offset, rec->segment, s, nr, n_rows);
      else if (at == NULL && base[lh] + (uint64_t)n_rows > n_tokens)
        rc = kv_fail(KVDB_CORRUPT, "a block holds more rows than its context's tokens");
      if (rc != KVDB_OK)
        break;
      nr = n_rows;
      if (at == NULL) {
        kv_scatter_rows(&g, rows, n_rows, s + kv, out, base[lh]);
        continue;
      }
      uint32_t got = 0;
      for (uint32_t r = 0; r < n_rows; r++) {
        if (cr->pos[r] >= at->n_copy || (r > 0 && cr->pos[r] <= cr->pos[r - 1]))
          continue; /* past the hit (a partial hit of a block not dropped), or out of order */
        kv_scatter_rows(&g, rows + (uint64_t)r * g.row_bytes, 1, s + kv, out, t0 + cr->pos[r]);
        if (kv == 1)
          at->present[(uint64_t)lh * at->n + t0 + cr->pos[r]] = 1;
        got++;
      }
      if (got != at->kept) {
        db->corrupt_blocks++;
        rc = kv_fail(KVDB_CORRUPT, "block at offset %" PRIu64 " of segment %" PRIu64
                                   ": section %u delivers %u rows, its record says %u",
                     rec->offset, rec->segment, s + kv, got, at->kept);
      }
    }
    if (at != NULL)
      continue;
    if (rc == KVDB_OK && positions != NULL)
      for (uint32_t r = 0; r < nr; r++)
        positions[(uint64_t)lh * n_tokens + base[lh] + r] = (uint32_t)(t0 + cr->pos[r]);
    base[lh] += nr;
    (void)H;
  }
  if (pin != NULL)
    kv_dram_unpin(db->dram, pin);
  return rc;
}

kvdb_status kvdb_get_context(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                             const kvdb_kv_view *out, uint32_t *positions, uint32_t *n_rows)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (context == NULL)
    return kv_fail(KVDB_INVALID, "context is NULL");
  KV_RET(kv_check_view(out, m, "out"));
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 0, &txn));
  kv_files_prune(db, txn);
  kv_ctx_rec cr;
  uint8_t mh[16];
  kv_model_hash(m, bt, mh);
  kvdb_status rc = kv_ctx_of_model(db, txn, context->b, mh, m, &cr);
  if (rc == KVDB_OK)
    rc = kv_check_view_extent(out, m, cr.n_tokens, "out");
  uint32_t LH = m->n_layers * m->n_kv_heads;
  uint32_t *base = rc == KVDB_OK ? calloc(LH, sizeof *base) : NULL;
  ctx_reader rd;
  memset(&rd, 0, sizeof rd);
  size_t row = (size_t)m->head_dim * kv_dtype_bytes(m->dtype);
  if (rc == KVDB_OK) {
    rd.rows = malloc(bt * row);
    rd.pos = malloc(bt * sizeof *rd.pos);
    if (base == NULL || rd.rows == NULL || rd.pos == NULL)
      rc = kv_fail(KVDB_NOMEM, "context buffers");
  }
  uint64_t t0 = 0;
  for (uint32_t b = 0; rc == KVDB_OK && b < cr.n_blocks; b++) {
    const uint8_t *h = cr.blocks + 16 * b;
    kv_block_rec br;
    rc = kv_ctx_block(db, txn, context->b, h, &br);
    if (rc != KVDB_OK)
      break;
    rc = block_out(db, &rd, m, bt, &br, h, t0, cr.n_tokens, out, positions, base, NULL);
    t0 += br.n_tokens;
  }
  if (rc == KVDB_OK && n_rows != NULL)
    memcpy(n_rows, base, LH * sizeof *base);
  if (rc == KVDB_OK)
    kv_note_access(db, context->b);
  reader_free(db, &rd);
  free(base);
  kv_txn_abort(txn);
  return rc;
}

kvdb_status kvdb_get_kept(kvdb *db, const kvdb_model *m, const uint32_t *tokens, size_t n,
                          const kvdb_kv_view *out, uint8_t *present, size_t present_cap,
                          size_t *hit_tokens, size_t *kept_tokens)
{
  uint32_t bt;
  if (hit_tokens != NULL)
    *hit_tokens = 0;
  if (kept_tokens != NULL)
    *kept_tokens = 0;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (tokens == NULL || n == 0)
    return kv_fail(KVDB_INVALID, "tokens is NULL or n is 0");
  KV_RET(kv_check_n_tokens(n));
  if (hit_tokens == NULL)
    return kv_fail(KVDB_INVALID, "hit_tokens is NULL");
  if (present == NULL)
    return kv_fail(KVDB_INVALID, "present is NULL");
  uint64_t LH = (uint64_t)m->n_layers * m->n_kv_heads;
  if (present_cap / LH < n)
    return kv_fail(KVDB_INVALID,
                   "present_cap %zu is below n_layers x n_kv_heads x n = %" PRIu64 " x %zu",
                   present_cap, LH, n);
  KV_RET(kv_check_view(out, m, "out"));
  KV_RET(kv_check_view_extent(out, m, n, "out"));
  ctx_reader rd;
  memset(&rd, 0, sizeof rd);
  size_t row = (size_t)m->head_dim * kv_dtype_bytes(m->dtype);
  rd.rows = malloc(bt * row);
  rd.pos = malloc(bt * sizeof *rd.pos);
  if (rd.rows == NULL || rd.pos == NULL) {
    reader_free(db, &rd);
    return kv_fail(KVDB_NOMEM, "context buffers");
  }
  kvdb_status rc;
  size_t hit, kept;
  int short_hit;
  kv_read_snap snap = {0};
  do { /* again from a fresh snapshot when a compaction moved blocks it found (ops_int.h) */
    memset(present, 0, LH * n);
    hit = kept = 0;
    short_hit = 0;
    rc = kv_read_begin(db, &snap);
    if (rc != KVDB_OK)
      break;
    kv_walk w = {0};
    rc = kv_walk_prefix(db, snap.txn, m, bt, tokens, n, 1, &w);
    for (size_t i = 0; rc == KVDB_OK && i < w.n; i++) {
      const kv_hit *x = &w.h[i];
      rows_at at = {tokens + x->t0, x->n_copy, kv_hit_kept(x), present, n};
      kvdb_status brc = block_out(db, &rd, m, bt, &x->rec, x->hash, x->t0, 0, out, NULL, NULL,
                                  &at);
      if (brc != KVDB_OK) {
        /* the hit ends before this block: none of its rows count as delivered */
        for (uint64_t lh = 0; lh < LH; lh++)
          memset(present + lh * n + x->t0, 0, x->n_copy);
        if (brc == KVDB_NOMEM)
          rc = brc;
        else
          kv_log(&db->log, 0, "get_kept: %s", kvdb_errmsg());
        short_hit = 1;
        break;
      }
      hit = x->t0 + x->n_copy;
      kept += at.kept;
    }
    free(w.h);
    kv_txn_abort(snap.txn);
  } while (rc == KVDB_OK && kv_read_again(db, &snap, short_hit));
  reader_free(db, &rd);
  if (rc == KVDB_OK) {
    *hit_tokens = hit;
    if (kept_tokens != NULL)
      *kept_tokens = kept;
  }
  return rc;
}

kvdb_status kvdb_profile(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                         const kvdb_put_opts *opts)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (context == NULL)
    return kv_fail(KVDB_INVALID, "context is NULL");
  if (db->cat.rdonly)
    return kv_fail(KVDB_READONLY, "database '%s' is open read-only", db->dir);
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  if (opts != NULL) { /* as kvdb_put_ex checks them */
    if (opts->struct_size < offsetof(kvdb_put_opts, queries) || opts->struct_size > 4096)
      return kv_fail(KVDB_INVALID, "opts->struct_size %u: call kvdb_put_opts_init() first",
                     opts->struct_size);
    memcpy(&o, opts, opts->struct_size < sizeof o ? opts->struct_size : sizeof o);
    if ((o.flags & ~(uint32_t)KVDB_PUT_PROFILE) != 0)
      return kv_fail(KVDB_INVALID, "opts->flags 0x%x has unknown bits", o.flags);
  }
  kv_queries qs;
  const kv_queries *q;
  KV_RET(kv_opts_queries(&o, m, &qs, &q));
  kvdb_context_info ci;
  KV_RET(kvdb_context_stat(db, context, &ci));
  if (ci.config.method == KVDB_METHOD_DROP) {
    char hx[33];
    return kv_fail(KVDB_INVALID,
                   "context %s is stored with dropped tokens: its profile can only be measured "
                   "at put (KVDB_PUT_PROFILE)",
                   kv_hex16(context->b, hx));
  }
  /* the context as stored, decoded into one buffer in vLLM's layout */
  size_t tb = kvdb_model_token_bytes(m);
  uint8_t *buf = kv_alloc_aligned(ci.n_tokens * tb);
  if (buf == NULL)
    return kv_fail(KVDB_NOMEM, "cannot allocate %" PRIu64 " bytes for the context", ci.n_tokens * tb);
  kvdb_kv_view v;
  kvdb_status rc = kvdb_kv_view_packed(&v, buf, m, ci.n_tokens, KVDB_LAYOUT_LKTHD);
  if (rc == KVDB_OK)
    rc = kvdb_get_context(db, m, context, &v, NULL, NULL);
  kv_profile_rec *p = rc == KVDB_OK ? malloc(sizeof *p) : NULL;
  if (rc == KVDB_OK && p == NULL)
    rc = kv_fail(KVDB_NOMEM, "profile");
  kv_queries pqs;
  const kv_queries *pq = NULL;
  const uint32_t *pq_pos = NULL;
  if (rc == KVDB_OK)
    rc = kv_opts_probes(&o, m, ci.n_tokens, &pqs, &pq, &pq_pos);
  if (rc == KVDB_OK) {
    kv_calib cal; /* as kvdb_put_ex's profile: a calibrated model's int4 / int2 */
    if (kv_model_calib_load(db, m, NULL, &cal) != KVDB_OK)
      memset(&cal, 0, sizeof cal);
    kv_model_gains gains; /* the output-weighted quality (db.c's put does the same) */
    rc = kv_model_gains_load(db, m, &gains);
    kv_profile_src ps = {.m = m, .block_tokens = bt, .kv = &v, .n_tokens = ci.n_tokens, .q = q,
                         .pq = pq, .pq_pos = pq_pos, .space = o.profile_space,
                         .heads = o.profile_heads, .not_below = &ci.config,
                         .packed_block_bytes = db->opt.packed_block_bytes,
                         .calib = cal.weight != NULL ? &cal : NULL,
                         .gains = gains.g != NULL ? &gains : NULL};
    if (rc == KVDB_OK)
      rc = kv_profile_measure(&ps, p);
    kv_calib_free(&cal);
    kv_model_gains_free(&gains);
  }
  if (rc == KVDB_OK)
    rc = kv_profile_store(db, context->b, p);
  free(p);
  kv_free_aligned(buf);
  return rc;
}
