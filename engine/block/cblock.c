/* SPDX-License-Identifier: MIT */
/*
 * engine/block/cblock.c — compressed block objects (format 2, FORMAT.md §3b) through the
 * codecs of compress/: building one from the caller's KV, and decoding its sections.
 *
 * A block stored with a config other than raw keeps the page-grouped order of sections
 * (layer -> KV head -> K, V) but each section is a compress/ section: its own header (codec,
 * shape, parameters, the keep bitmap of a drop section, the table of its token groups) and
 * independently decodable groups of tokens. Token dropping chooses the kept tokens per block
 * and KV head from the K section (knorm, keydiff, snapkv) and keeps the same tokens of V.
 * Every data page carries its own checksum, so a reader of a few groups verifies exactly the
 * pages it read.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cblock.h"

/* ---- errors ---- */

kvdb_status kv_codec_fail(kv_codec_status st, const kv_codec_err *err, const char *what)
{
  char msg[256];
  kv_codec_errmsg(err, msg, sizeof msg);
  kvdb_status rc = st == KV_CODEC_EINVAL     ? KVDB_INVALID
                   : st == KV_CODEC_ECORRUPT ? KVDB_CORRUPT
                                             : KVDB_PANIC; /* a size this file computed */
  return kv_fail(rc, "%s: %s", what, msg);
}

static uint8_t *grow(uint8_t **p, size_t *cap, size_t need)
{
  if (*cap >= need)
    return *p;
  size_t n = need + need / 4 + 4096;
  uint8_t *q = realloc(*p, n);
  if (q == NULL)
    return NULL;
  *p = q;
  *cap = n;
  return q;
}

/* ---- encoding ---- */

void kv_cenc_free(kv_cenc *e)
{
  free(e->rows_k);
  free(e->rows_v);
  free(e->scratch);
  free(e->sect);
  free(e->keep);
  free(e->qwin);
  free(e->sect_len);
  free(e->sect_codec);
  free(e->pair);
  free(e->frows);
  free(e->fsecs);
  free(e->ffirst);
  free(e->flen);
  free(e->fsb);
  memset(e, 0, sizeof *e);
}

static kv_section_shape shape_of(const kv_block_geom *g, uint32_t s)
{
  kv_section_shape sh = {(kv_codec_dtype)g->dtype, (s & 1) ? KV_SECTION_V : KV_SECTION_K,
                         g->n_tokens, g->head_dim};
  return sh;
}

/* Parameters of section s (group per kind; drop positions attached by the caller). */
static kv_codec_params section_params(const kv_section_codec *sc, uint32_t s)
{
  kv_codec_params p = sc->params;
  if (p.bits)
    p.group = (s & 1) ? sc->group_v : sc->group_k;
  if (s & 1) /* pre-RoPE applies to K only */
    p.rope_base = 0.0f, p.rope_style = 0, p.rope_pos0 = 0;
  return p;
}

/* Section s's parameters with the model's calibration applied (kvquant int4 / int2 of a
 * calibrated model: compress/calib.c kv_calib_section_params; a config's explicit group wins). */
static kv_codec_params section_params_cal(const kv_section_codec *sc, uint32_t s,
                                          const kvdb_config *cfg, const kv_block_geom *g,
                                          const kv_calib *cal)
{
  kv_codec_params p = section_params(sc, s);
  if (cal != NULL && sc->codec->id == KV_CODEC_ID_KVQUANT && cfg->method == KVDB_METHOD_QUANT) {
    uint32_t layer = (s >> 1) / g->n_kv_heads, head = (s >> 1) % g->n_kv_heads;
    kv_calib_section_params(cal, cfg->bits, layer, head, (int)(s & 1), g->n_tokens, cfg->group,
                            &p);
  }
  return p;
}

uint64_t kv_cblock_bound_cal(const kvdb_config *cfg, const kv_block_geom *g, const kv_calib *cal)
{
  if (cal == NULL)
    return kv_cblock_bound(cfg, g);
  kv_section_codec sc;
  if (kv_config_section(cfg, g, g->n_tokens, 0, &sc) != KVDB_OK)
    return 0;
  uint64_t sum = 0;
  for (uint32_t s = 0; s < g->n_sections; s++) { /* every head's own widths and groups */
    kv_section_shape sh = shape_of(g, s);
    kv_codec_params p = section_params_cal(&sc, s, cfg, g, cal);
    p.residual = 0;
    size_t b = kv_codec_bound(sc.codec, &sh, &p);
    if (b == 0)
      return 0;
    sum += (uint64_t)(b + (size_t)g->n_tokens * g->row_bytes);
  }
  kv_cblock_layout l;
  kv_cblock_layout_init(g, sum, &l);
  return l.total_bytes;
}

uint64_t kv_cblock_bound(const kvdb_config *cfg, const kv_block_geom *g)
{
  kv_section_codec sc;
  if (kv_config_section(cfg, g, g->n_tokens, 0, &sc) != KVDB_OK)
    return 0;
  uint64_t sum = 0;
  for (uint32_t kv = 0; kv < 2; kv++) {
    kv_section_shape sh = shape_of(g, kv);
    kv_codec_params p = section_params(&sc, kv);
    if (sc.codec->id == KV_CODEC_ID_DROP)
      p.n_keep = g->n_tokens; /* the bound for keeping everything covers any keep count */
    p.residual = 0;
    size_t b = kv_codec_bound(sc.codec, &sh, &p);
    if (b == 0)
      return 0;
    /* residual rows are stored raw: never more than the raw rows plus the bound */
    sum += (uint64_t)(b + (size_t)g->n_tokens * g->row_bytes) * (g->n_sections / 2);
  }
  kv_cblock_layout l;
  kv_cblock_layout_init(g, sum, &l);
  return l.total_bytes;
}

/* SnapKV's observation window of (layer, KV head) from the caller's queries. */
static kvdb_status window(const kv_queries *q, const kv_block_geom *g, uint32_t layer,
                          uint32_t head, int last_block, kv_cenc *e, kv_snapkv_window *w)
{
  uint32_t grp = q->n_q_heads / g->n_kv_heads;
  size_t need = (size_t)q->n_queries * grp * g->head_dim * sizeof(float);
  if (grow((uint8_t **)&e->qwin, &e->qwin_cap, need) == NULL)
    return kv_fail(KVDB_NOMEM, "snapkv window");
  for (uint32_t o = 0; o < q->n_queries; o++)
    for (uint32_t j = 0; j < grp; j++)
      memcpy(e->qwin + ((size_t)o * grp + j) * g->head_dim,
             q->q + (((size_t)o * g->n_layers + layer) * q->n_q_heads + head * grp + j) *
                        g->head_dim,
             g->head_dim * sizeof(float));
  memset(w, 0, sizeof *w);
  w->q = e->qwin;
  w->n_obs = q->n_queries;
  w->n_q_heads = grp;
  w->pool = KV_POOL_AVG;
  /* the queries are the prompt's last tokens: they follow every key of earlier blocks, and
   * in the context's last block they are that block's own last tokens (causal mask) */
  w->tail_window = last_block && q->n_queries <= g->n_tokens;
  return KVDB_OK;
}

/* Scratch for encoding (and choosing the kept tokens of) a section of geometry g with sc;
 * win: SnapKV's observation window (NULL for other methods). */
static kvdb_status reserve(const kv_cblock_src *src, const kv_section_codec *sc, uint32_t s,
                           kv_cenc *e, const kv_snapkv_window *win)
{
  const kv_block_geom *g = src->g;
  size_t rows_bytes = (size_t)g->n_tokens * g->row_bytes, scratch = 0, bound = 0;
  for (uint32_t kv = 0; kv < 2; kv++) {
    kv_section_shape sh = shape_of(g, kv);
    kv_codec_params p = section_params_cal(sc, s + kv, src->cfg, g, src->calib);
    if (sc->codec->id == KV_CODEC_ID_DROP)
      p.n_keep = g->n_tokens;
    size_t a = kv_codec_scratch_bytes(sc->codec, &sh, &p, KV_CODEC_OP_ENCODE);
    size_t b = kv_codec_bound(sc->codec, &sh, &p);
    if (a == 0 || b == 0) {
      char nm[48];
      return kv_fail(KVDB_INVALID, "config '%s' cannot store a block of %u tokens x %u dims",
                     kvdb_config_name(src->cfg, nm, sizeof nm), g->n_tokens, g->head_dim);
    }
    scratch = a > scratch ? a : scratch;
    bound = b + rows_bytes > bound ? b + rows_bytes : bound;
  }
  if (sc->codec->id == KV_CODEC_ID_DROP) {
    size_t d = kv_drop_scratch_bytes((kv_drop_method)src->cfg->drop, g->n_tokens, g->head_dim,
                                     win);
    if (d == 0)
      return kv_fail(KVDB_INVALID, "token selection by method %u cannot run on %u tokens with "
                                   "%u observed queries",
                     src->cfg->drop, g->n_tokens, win ? win->n_obs : 0);
    scratch = d > scratch ? d : scratch;
  }
  if (grow(&e->scratch, &e->scratch_cap, scratch) == NULL ||
      grow((uint8_t **)&e->keep, &e->keep_cap, g->n_tokens * sizeof(uint32_t)) == NULL ||
      grow(&e->pair, &e->pair_cap, 2 * bound) == NULL)
    return kv_fail(KVDB_NOMEM, "compression buffers");
  return KVDB_OK;
}

kvdb_status kv_cblock_encode_pair(const kv_cblock_src *src, const kv_section_codec *sc,
                                  uint32_t s, const uint8_t *rows_k, const uint8_t *rows_v,
                                  kv_cenc *e, uint32_t len[2])
{
  const kv_block_geom *g = src->g;
  kv_snapkv_window w, *wp = NULL;
  if (sc->codec->id == KV_CODEC_ID_DROP && src->cfg->drop == KVDB_DROP_SNAPKV) {
    uint32_t layer = (s >> 1) / g->n_kv_heads, head = (s >> 1) % g->n_kv_heads;
    if (src->q == NULL)
      return kv_fail(KVDB_INVALID, "snapkv needs the prompt's last queries (kvdb_put_opts.queries)");
    KV_RET(window(src->q, g, layer, head, src->last_block, e, &w));
    wp = &w;
  }
  KV_RET(reserve(src, sc, s, e, wp));
  size_t rows_bytes = (size_t)g->n_tokens * g->row_bytes;
  kv_section_shape shk = shape_of(g, s), shv = shape_of(g, s + 1);
  kv_codec_params pk = section_params_cal(sc, s, src->cfg, g, src->calib),
                  pv = section_params_cal(sc, s + 1, src->cfg, g, src->calib);
  kv_codec_err err;
  if (sc->codec->id == KV_CODEC_ID_DROP) {
    uint32_t n_keep = 0;
    uint32_t want = kv_drop_keep_span(src->keep_t0, g->n_tokens, src->cfg->keep_permille);
    if (want == 0)
      return kv_fail(KVDB_INVALID, "block %u at token %llu keeps no tokens at %u permille",
                     src->index, (unsigned long long)src->keep_t0, src->cfg->keep_permille);
    kv_codec_status st = kv_drop_select_n((kv_drop_method)src->cfg->drop, &shk, rows_k,
                                          rows_bytes, want, wp, e->scratch, e->scratch_cap,
                                          e->keep, g->n_tokens, &n_keep, &err);
    if (st != KV_CODEC_OK)
      return kv_codec_fail(st, &err, "choosing the tokens to keep");
    pk.keep_pos = pv.keep_pos = e->keep;
    pk.n_keep = pv.n_keep = n_keep;
    /* K groups run along the kept rows (kv_config_section sized them for the ratio's ceil) */
    if (pk.bits && pk.group > n_keep)
      pk.group = n_keep;
  }
  size_t used = 0;
  for (uint32_t kv = 0; kv < 2; kv++) {
    size_t out = 0;
    kv_codec_status st = kv_codec_encode(sc->codec, kv ? &shv : &shk, kv ? rows_v : rows_k,
                                         rows_bytes, kv ? &pv : &pk, e->scratch, e->scratch_cap,
                                         e->pair + used, e->pair_cap - used, &out, &err);
    if (st != KV_CODEC_OK) {
      char what[96];
      snprintf(what, sizeof what, "encoding section %u of block %u", s + kv, src->index);
      return kv_codec_fail(st, &err, what);
    }
    len[kv] = (uint32_t)out;
    used += out;
  }
  return KVDB_OK;
}

/* The layout of src's object whose sections take `used` bytes: packed (block format 5,
 * FORMAT.md §3f) when src->pack_max allows it (returns 1), else whole pages (0). */
static int layout_for(const kv_cblock_src *src, uint64_t used, kv_cblock_layout *l)
{
  if (src->pack_max != 0) {
    kv_cblock_layout_init_packed(src->g, used, l);
    if (l->total_bytes <= src->pack_max)
      return 1;
  }
  kv_cblock_layout_init(src->g, used, l);
  return 0;
}

/* A lossless block as frames (format 3): the sections, in block order, cut by kv_frames_plan()
 * into frames of >= src->frame_bytes raw bytes, each frame encoded from its sections' rows. */
static kvdb_status build_frames(const kv_cblock_src *src, kv_cenc *e, uint8_t *dst,
                                size_t dst_cap, uint64_t *obj_bytes)
{
  const kv_block_geom *g = src->g;
  uint32_t ns = g->n_sections;
  size_t rows_bytes = (size_t)g->n_tokens * g->row_bytes;
  if (e->fcap < ns) {
    free(e->fsb);
    free(e->ffirst);
    free(e->flen);
    e->fsb = malloc(ns * sizeof *e->fsb);
    e->ffirst = malloc((ns + 1) * sizeof *e->ffirst);
    e->flen = malloc(ns * sizeof *e->flen);
    e->fcap = e->fsb && e->ffirst && e->flen ? ns : 0;
  }
  if (e->fsecs == NULL)
    e->fsecs = malloc(KV_FRAME_MAX_SECTIONS * sizeof *e->fsecs);
  if (e->fcap < ns || e->fsecs == NULL)
    return kv_fail(KVDB_NOMEM, "compression buffers");
  for (uint32_t i = 0; i < ns; i++)
    e->fsb[i] = rows_bytes;
  uint32_t nf = kv_frames_plan(e->fsb, ns, src->frame_bytes, e->ffirst);
  e->ffirst[nf] = ns;
  int level = src->cfg->zstd_level != 0 ? src->cfg->zstd_level : KV_FRAME_LEVEL_DEFAULT;
  uint64_t used = 0;
  for (uint32_t f = 0; f < nf; f++) {
    uint32_t a = e->ffirst[f], n = e->ffirst[f + 1] - a;
    if (grow(&e->frows, &e->frows_cap, (size_t)n * rows_bytes) == NULL)
      return kv_fail(KVDB_NOMEM, "compression buffers");
    for (uint32_t i = 0; i < n; i++) {
      kv_gather_rows(g, src->kv, src->t0, a + i, e->frows + (size_t)i * rows_bytes);
      e->fsecs[i].rows = e->frows + (size_t)i * rows_bytes;
      e->fsecs[i].n_rows = g->n_tokens;
      e->fsecs[i].head_dim = g->head_dim;
      e->fsecs[i].kind = ((a + i) & 1) ? KV_SECTION_V : KV_SECTION_K;
    }
    size_t bound = kv_frame_bound((kv_codec_dtype)g->dtype, e->fsecs, n);
    size_t scr = kv_frame_encode_scratch_bytes((kv_codec_dtype)g->dtype, e->fsecs, n, level);
    if (bound == 0 || scr == 0)
      return kv_fail(KVDB_INVALID, "a lossless frame of %u sections of %u tokens x %u dims", n,
                     g->n_tokens, g->head_dim);
    if (grow(&e->scratch, &e->scratch_cap, scr) == NULL ||
        grow(&e->sect, &e->sect_cap, used + bound) == NULL)
      return kv_fail(KVDB_NOMEM, "compression buffers");
    size_t out = 0;
    kv_codec_err err;
    kv_codec_status st = kv_frame_encode((kv_codec_dtype)g->dtype, e->fsecs, n, level,
                                         e->scratch, e->scratch_cap, e->sect + used, bound, &out,
                                         &err);
    if (st != KV_CODEC_OK) {
      char what[96];
      snprintf(what, sizeof what, "encoding frame %u of block %u", f, src->index);
      return kv_codec_fail(st, &err, what);
    }
    e->flen[f] = (uint32_t)out;
    used += out;
  }
  kv_cblock_layout l;
  e->packed = layout_for(src, used, &l);
  if (l.total_bytes > dst_cap)
    return kv_fail(KVDB_PANIC, "compressed block of %" PRIu64 " bytes exceeds its bound %zu",
                   l.total_bytes, dst_cap);
  memcpy(dst + l.meta_bytes, e->sect, used);
  memset(dst + l.meta_bytes + used, 0, l.data_bytes - used);
  kv_cblock_seal_frames(g, &l, nf, e->ffirst, e->flen, src->hash, src->parent, src->model_hash,
                        src->tokens, dst);
  *obj_bytes = l.total_bytes;
  return KVDB_OK;
}

kvdb_status kv_cblock_build(const kv_cblock_src *src, kv_cenc *e, uint8_t *dst, size_t dst_cap,
                            uint64_t *obj_bytes)
{
  const kv_block_geom *g = src->g;
  kv_section_codec sc;
  KV_RET(kv_config_section_rope(src->cfg, g, src->ctx_tokens, src->t0, &src->rope, &sc));
  if (sc.codec->id == KV_CODEC_ID_ZSTD_PLANES)
    return build_frames(src, e, dst, dst_cap, obj_bytes);
  size_t rows_bytes = (size_t)g->n_tokens * g->row_bytes;
  if (grow(&e->rows_k, &e->rows_k_cap, rows_bytes) == NULL ||
      grow(&e->rows_v, &e->rows_v_cap, rows_bytes) == NULL ||
      grow((uint8_t **)&e->sect_len, &e->sect_len_cap, g->n_sections * sizeof(uint32_t)) == NULL ||
      grow(&e->sect_codec, &e->sect_codec_cap, g->n_sections) == NULL)
    return kv_fail(KVDB_NOMEM, "compression buffers");
  uint64_t used = 0;
  for (uint32_t s = 0; s < g->n_sections; s += 2) {
    kv_gather_rows(g, src->kv, src->t0, s, e->rows_k);
    kv_gather_rows(g, src->kv, src->t0, s + 1, e->rows_v);
    uint32_t len[2];
    KV_RET(kv_cblock_encode_pair(src, &sc, s, e->rows_k, e->rows_v, e, len));
    if (grow(&e->sect, &e->sect_cap, used + len[0] + len[1]) == NULL)
      return kv_fail(KVDB_NOMEM, "compression buffers");
    memcpy(e->sect + used, e->pair, (size_t)len[0] + len[1]);
    e->sect_len[s] = len[0];
    e->sect_len[s + 1] = len[1];
    e->sect_codec[s] = e->sect_codec[s + 1] = sc.codec->id;
    used += (uint64_t)len[0] + len[1];
  }
  kv_cblock_layout l;
  e->packed = layout_for(src, used, &l);
  if (l.total_bytes > dst_cap)
    return kv_fail(KVDB_PANIC, "compressed block of %" PRIu64 " bytes exceeds its bound %zu",
                   l.total_bytes, dst_cap);
  memcpy(dst + l.meta_bytes, e->sect, used);
  memset(dst + l.meta_bytes + used, 0, l.data_bytes - used);
  kv_cblock_seal(g, &l, e->sect_len, e->sect_codec, src->hash, src->parent, src->model_hash,
                 src->tokens, dst);
  *obj_bytes = l.total_bytes;
  return KVDB_OK;
}

/* ---- decoding ---- */

kvdb_status kv_cdec_init(kv_cdec *d)
{
  memset(d, 0, sizeof *d);
  d->ctx_mem = malloc(kv_codec_dctx_bytes());
  if (d->ctx_mem == NULL)
    return kv_fail(KVDB_NOMEM, "decoding context");
  d->ctx = kv_codec_dctx_init(d->ctx_mem, kv_codec_dctx_bytes());
  return KVDB_OK;
}

void kv_cdec_free(kv_cdec *d)
{
  free(d->ctx_mem);
  free(d->scratch);
  free(d->rows);
  free(d->frame);
  for (unsigned t = 0; t < d->mt_n; t++) {
    free(d->mt_ctx[t]);
    free(d->mt_w[t].scratch);
  }
  free(d->mt_ctx);
  free(d->mt_w);
  free(d->mt_jobs);
  free(d->mt_rows);
  memset(d, 0, sizeof *d);
}

kvdb_status kv_cblock_section_info(const kv_block_hdr *h, const uint8_t *hdr_bytes, size_t len,
                                   uint32_t s, uint8_t codec_id, kv_section_info *info)
{
  kv_codec_err err;
  kv_codec_status st = kv_section_parse(hdr_bytes, len, info, &err);
  if (st != KV_CODEC_OK) {
    char what[64];
    snprintf(what, sizeof what, "section %u", s);
    return kv_codec_fail(st == KV_CODEC_EINVAL ? KV_CODEC_ECORRUPT : st, &err, what);
  }
  const kv_block_geom *g = &h->g;
  if (info->codec_id != codec_id || (uint32_t)info->shape.dtype != g->dtype ||
      info->shape.n_tokens != g->n_tokens || info->shape.head_dim != g->head_dim ||
      info->shape.kind != ((s & 1) ? KV_SECTION_V : KV_SECTION_K))
    return kv_fail(KVDB_CORRUPT,
                   "section %u is %u tokens x %u dims of dtype %u, codec %u (%s); the block "
                   "has %u x %u of dtype %u, codec %u (%s)",
                   s, info->shape.n_tokens, info->shape.head_dim, (unsigned)info->shape.dtype,
                   info->codec_id, info->shape.kind == KV_SECTION_V ? "V" : "K", g->n_tokens,
                   g->head_dim, g->dtype, codec_id, (s & 1) ? "V" : "K");
  return KVDB_OK;
}

/* Parse the frame holding section s and check it against the block and its table: *first =
 * its first section. */
static kvdb_status frame_check(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                               kv_frame_info *info, uint64_t *off, uint32_t *len,
                               uint32_t *first)
{
  const kv_block_geom *g = &h->g;
  kv_cblock_section(h, buf, s, off, len);
  uint32_t idx = kv_cblock_frame_index(h, buf, s);
  kv_codec_err err;
  kv_codec_status st = kv_frame_parse(buf + *off, *len, info, &err);
  if (st != KV_CODEC_OK) {
    char what[64];
    snprintf(what, sizeof what, "frame of section %u", s);
    return kv_codec_fail(KV_CODEC_ECORRUPT, &err, what);
  }
  /* the frame holds exactly the table's sections of it, each the block's shape and kind */
  uint32_t f0 = s - idx, last = f0 + info->n_sections - 1;
  if (idx >= info->n_sections || (uint32_t)info->dtype != g->dtype || last >= g->n_sections ||
      kv_cblock_frame_index(h, buf, last) != info->n_sections - 1 ||
      (last + 1 < g->n_sections && kv_cblock_frame_index(h, buf, last + 1) != 0))
    return kv_fail(KVDB_CORRUPT, "the frame of section %u holds %u sections of dtype %u; the "
                                 "block's table gives it index %u (dtype %u)",
                   s, info->n_sections, (unsigned)info->dtype, idx, g->dtype);
  for (uint32_t i = 0; i < info->n_sections; i++) {
    uint32_t r, dim;
    kv_section_kind kind;
    kv_frame_section(buf + *off, info, i, &r, &dim, &kind, NULL);
    if (r != g->n_tokens || dim != g->head_dim ||
        kind != (((f0 + i) & 1) ? KV_SECTION_V : KV_SECTION_K))
      return kv_fail(KVDB_CORRUPT, "section %u of a frame is %u tokens x %u dims (%s); the "
                                   "block has %u x %u (%s)",
                     f0 + i, r, dim, kind == KV_SECTION_V ? "V" : "K", g->n_tokens,
                     g->head_dim, ((f0 + i) & 1) ? "V" : "K");
  }
  *first = f0;
  return KVDB_OK;
}

kvdb_status kv_cblock_frame_rows(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                                 kv_cdec *d, const uint8_t **rows)
{
  const kv_block_geom *g = &h->g;
  uint64_t off;
  uint32_t len;
  kv_cblock_section(h, buf, s, &off, &len);
  uint32_t idx = kv_cblock_frame_index(h, buf, s);
  size_t rows_bytes = (size_t)g->n_tokens * g->row_bytes;
  if (!d->frame_valid || d->frame_off != off || memcmp(d->frame_hash, h->block_hash, 16) != 0) {
    d->frame_valid = 0;
    kv_frame_info info;
    uint32_t first;
    KV_RET(frame_check(h, buf, s, &info, &off, &len, &first));
    size_t out_bytes = (size_t)info.n_sections * rows_bytes;
    size_t scratch = kv_frame_decode_scratch_bytes(&info);
    if (grow(&d->frame, &d->frame_cap, out_bytes) == NULL ||
        grow(&d->scratch, &d->scratch_cap, scratch) == NULL)
      return kv_fail(KVDB_NOMEM, "decoding buffers");
    kv_codec_err err;
    kv_codec_status st = kv_frame_decode(d->ctx, buf + off, len, d->scratch, d->scratch_cap,
                                         d->frame, d->frame_cap, &err);
    if (st != KV_CODEC_OK) {
      char what[64];
      snprintf(what, sizeof what, "decoding the frame of section %u", s);
      return kv_codec_fail(st, &err, what);
    }
    memcpy(d->frame_hash, h->block_hash, 16);
    d->frame_off = off;
    d->frame_valid = 1;
  }
  *rows = d->frame + (size_t)idx * rows_bytes;
  return KVDB_OK;
}

/* The decoding threads of d (kv_frames_decode_mt): made at the first parallel decode, each with
 * its own decoding context and scratch of at least `scratch` bytes. The number of threads is
 * 0 when they cannot be had (the caller decodes alone). */
static unsigned mt_workers(kv_cdec *d, size_t scratch)
{
  if (d->mt_n == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned nt = n < 2 ? 0 : n > KV_CDEC_MAX_THREADS ? KV_CDEC_MAX_THREADS : (unsigned)n;
    if (nt == 0)
      return 0;
    d->mt_w = calloc(nt, sizeof *d->mt_w);
    d->mt_ctx = calloc(nt, sizeof *d->mt_ctx);
    if (d->mt_w == NULL || d->mt_ctx == NULL)
      return 0;
    for (unsigned t = 0; t < nt; t++) {
      d->mt_ctx[t] = malloc(kv_codec_dctx_bytes());
      if (d->mt_ctx[t] == NULL)
        return 0;
      d->mt_w[t].ctx = kv_codec_dctx_init(d->mt_ctx[t], kv_codec_dctx_bytes());
      d->mt_n = t + 1;
    }
  }
  for (unsigned t = 0; t < d->mt_n; t++)
    if (d->mt_w[t].scratch_cap < scratch) {
      void *p = realloc(d->mt_w[t].scratch, scratch);
      if (p == NULL)
        return 0;
      d->mt_w[t].scratch = p;
      d->mt_w[t].scratch_cap = scratch;
    }
  return d->mt_n;
}

/* Sections [s0, s1) of a format-3 block decoded on every core: the frames holding them are
 * decoded in parallel into d->mt_rows, then copied into the data region. 1 when done, 0 when
 * the range is too small for threads to pay (or they cannot be had): the caller decodes
 * alone. */
static kvdb_status decode_frames_mt(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                    uint32_t s1, kv_cdec *d, uint8_t *data, int *done)
{
  const kv_block_geom *g = &h->g;
  size_t rows_bytes = (size_t)g->n_tokens * g->row_bytes;
  *done = 0;
  uint32_t f0 = s0 - kv_cblock_frame_index(h, buf, s0), nf = 0;
  uint64_t total = 0;
  for (uint32_t s = f0; s < s1; s++)
    if (kv_cblock_frame_index(h, buf, s) == 0 || s == f0)
      nf++;
  /* the frames' rows from the first frame's first section to the end of the last frame */
  uint32_t end = s1;
  while (end < g->n_sections && kv_cblock_frame_index(h, buf, end) != 0)
    end++;
  total = (uint64_t)(end - f0) * rows_bytes;
  if (nf < 2 || total < KV_CDEC_MT_MIN_BYTES)
    return KVDB_OK;
  /* whole frames of sections whose rows lie back to back in the data region (no padding
   * between groups or sections): decoded in place, else into d->mt_rows and copied */
  int in_place = f0 == s0 && end == s1 &&
                 g->group_stride == (uint64_t)g->group_tokens * g->row_bytes &&
                 g->section_bytes == rows_bytes;
  uint8_t *base = in_place ? data + (size_t)s0 * rows_bytes : NULL;
  if (!in_place) {
    if (grow(&d->mt_rows, &d->mt_rows_cap, total) == NULL)
      return KVDB_OK; /* no memory for the threads' way: decode alone */
    base = d->mt_rows;
  }
  if (d->mt_jobs_cap < nf) {
    free(d->mt_jobs);
    d->mt_jobs = malloc(nf * sizeof *d->mt_jobs);
    d->mt_jobs_cap = d->mt_jobs != NULL ? nf : 0;
    if (d->mt_jobs == NULL)
      return KVDB_OK;
  }
  size_t scratch = 0;
  uint32_t j = 0;
  for (uint32_t s = f0; s < end;) {
    kv_frame_info info;
    uint64_t off;
    uint32_t len, first;
    KV_RET(frame_check(h, buf, s, &info, &off, &len, &first));
    size_t sb = kv_frame_decode_scratch_bytes(&info);
    scratch = sb > scratch ? sb : scratch;
    d->mt_jobs[j].src = buf + off;
    d->mt_jobs[j].len = len;
    d->mt_jobs[j].dst = base + (size_t)(s - f0) * rows_bytes;
    d->mt_jobs[j].dst_cap = (size_t)info.n_sections * rows_bytes;
    j++;
    s = first + info.n_sections;
  }
  unsigned nt = mt_workers(d, scratch);
  if (nt < 2)
    return KVDB_OK;
  kv_codec_err err;
  kv_codec_status st = kv_frames_decode_mt(d->mt_jobs, j, d->mt_w, nt, &err);
  if (st != KV_CODEC_OK)
    return kv_codec_fail(st, &err, "decoding frames");
  if (!in_place)
    for (uint32_t s = s0; s < s1; s++)
      kv_rows_to_section(g, d->mt_rows + (size_t)(s - f0) * rows_bytes, s, data);
  *done = 1;
  return KVDB_OK;
}

/* Section s of a format-2 block: where it lies (sec, len) and its parsed header, checked
 * against the block and against its table entry's length. */
static kvdb_status section_at(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                              const uint8_t **sec, uint32_t *len, kv_section_info *info)
{
  uint64_t off;
  kv_cblock_section(h, buf, s, &off, len);
  *sec = buf + off;
  KV_RET(kv_cblock_section_info(h, *sec, *len, s,
                                kv_cblock_codec(h, buf, s), info));
  if (info->section_bytes != *len)
    return kv_fail(KVDB_CORRUPT, "section %u is %" PRIu64 " bytes by its header, %u by the table",
                   s, info->section_bytes, *len);
  return KVDB_OK;
}

kvdb_status kv_cblock_decode_section(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                                     kv_cdec *d, const uint8_t **rows, uint32_t *n_rows,
                                     uint32_t *positions)
{
  if (KV_HDR_FRAMES(h)) {
    KV_RET(kv_cblock_frame_rows(h, buf, s, d, rows));
    *n_rows = h->g.n_tokens;
    if (positions != NULL)
      for (uint32_t t = 0; t < h->g.n_tokens; t++)
        positions[t] = t;
    return KVDB_OK;
  }
  const uint8_t *sec;
  uint32_t len;
  kv_section_info info;
  KV_RET(section_at(h, buf, s, &sec, &len, &info));
  size_t out_bytes = kv_section_rows_bytes(&info, 0, info.n_groups);
  size_t scratch = kv_section_scratch_bytes(&info);
  if (grow(&d->rows, &d->rows_cap, out_bytes) == NULL ||
      grow(&d->scratch, &d->scratch_cap, scratch ? scratch : 1) == NULL)
    return kv_fail(KVDB_NOMEM, "decoding buffers");
  kv_codec_err err;
  kv_codec_status st = kv_section_decode_dctx(d->ctx, sec, len, d->scratch, d->scratch_cap,
                                              d->rows, d->rows_cap, NULL, &err);
  if (st == KV_CODEC_OK && positions != NULL)
    st = kv_section_positions(sec, len, 0, info.n_rows, positions, &err);
  if (st != KV_CODEC_OK) {
    char what[64];
    snprintf(what, sizeof what, "decoding section %u", s);
    return kv_codec_fail(st, &err, what);
  }
  *rows = d->rows;
  *n_rows = info.n_rows;
  return KVDB_OK;
}

/* A block stored without dropping keeps every token in each section. */
static kvdb_status all_rows_kept(const kv_block_hdr *h, uint32_t s, uint32_t n_rows)
{
  if (n_rows != h->g.n_tokens)
    return kv_fail(KVDB_CORRUPT, "section %u keeps %u of the block's %u tokens: a block "
                                 "stored without dropping has them all", s, n_rows,
                   h->g.n_tokens);
  return KVDB_OK;
}

/* Section s (format 2, every token kept) decoded straight into dst, its n_tokens rows. */
static kvdb_status decode_section_into(const kv_block_hdr *h, const uint8_t *buf, uint32_t s,
                                       kv_cdec *d, uint8_t *dst)
{
  const uint8_t *sec;
  uint32_t len;
  kv_section_info info;
  KV_RET(section_at(h, buf, s, &sec, &len, &info));
  KV_RET(all_rows_kept(h, s, info.n_rows));
  size_t out_bytes = (size_t)h->g.n_tokens * h->g.row_bytes;
  size_t scratch = kv_section_scratch_bytes(&info);
  if (kv_section_rows_bytes(&info, 0, info.n_groups) != out_bytes)
    return kv_fail(KVDB_CORRUPT, "section %u decodes to %zu bytes, not the block's %zu", s,
                   kv_section_rows_bytes(&info, 0, info.n_groups), out_bytes);
  if (grow(&d->scratch, &d->scratch_cap, scratch ? scratch : 1) == NULL)
    return kv_fail(KVDB_NOMEM, "decoding buffers");
  kv_codec_err err;
  kv_codec_status st = kv_section_decode_dctx(d->ctx, sec, len, d->scratch, d->scratch_cap, dst,
                                              out_bytes, NULL, &err);
  if (st != KV_CODEC_OK) {
    char what[64];
    snprintf(what, sizeof what, "decoding section %u", s);
    return kv_codec_fail(st, &err, what);
  }
  return KVDB_OK;
}

kvdb_status kv_cblock_decode_data(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                  uint32_t s1, kv_cdec *d, uint8_t *data)
{
  if (KV_HDR_FRAMES(h) && s1 > s0) { /* many frames: on every core */
    int done;
    KV_RET(decode_frames_mt(h, buf, s0, s1, d, data, &done));
    if (done)
      return KVDB_OK;
  }
  for (uint32_t s = s0; s < s1; s++) {
    const uint8_t *rows = NULL;
    uint32_t n_rows = 0;
    if (KV_HDR_FRAMES(h)) { /* a frame is decoded once for its sections */
      KV_RET(kv_cblock_frame_rows(h, buf, s, d, &rows));
      kv_rows_to_section(&h->g, rows, s, data);
      continue;
    }
    if (h->g.group_stride == (uint64_t)h->g.group_tokens * h->g.row_bytes) {
      /* the section's rows lie back to back in the data region: decoded in place, not
       * through d->rows and a copy (issue 16: the copy was a third of an int4 get's CPU) */
      KV_RET(decode_section_into(h, buf, s, d, data + (uint64_t)s * h->g.section_bytes));
      continue;
    }
    KV_RET(kv_cblock_decode_section(h, buf, s, d, &rows, &n_rows, NULL));
    KV_RET(all_rows_kept(h, s, n_rows));
    kv_rows_to_section(&h->g, rows, s, data);
  }
  return KVDB_OK;
}

kvdb_status kv_cblock_decode_view(const kv_block_hdr *h, const uint8_t *buf, uint32_t s0,
                                  uint32_t s1, uint32_t n, kv_cdec *d, const kvdb_kv_view *v,
                                  uint64_t t0)
{
  if (n > h->g.n_tokens)
    return kv_fail(KVDB_INVALID, "%u rows of a block of %u tokens", n, h->g.n_tokens);
  for (uint32_t s = s0; s < s1; s++) {
    const uint8_t *sec;
    uint32_t len;
    kv_section_info info;
    KV_RET(section_at(h, buf, s, &sec, &len, &info));
    KV_RET(all_rows_kept(h, s, info.n_rows));
    size_t stride = 0;
    uint8_t *dst = kv_section_decodes_strided(info.codec_id)
                     ? kv_view_section_rows(&h->g, v, s, t0, &stride) : NULL;
    if (dst == NULL) { /* contiguous rows, then copied */
      const uint8_t *rows;
      uint32_t n_rows;
      KV_RET(kv_cblock_decode_section(h, buf, s, d, &rows, &n_rows, NULL));
      kv_scatter_rows(&h->g, rows, n, s, v, t0);
      continue;
    }
    size_t need = kv_section_rows_scratch_bytes(&info, n);
    if (grow(&d->scratch, &d->scratch_cap, need ? need : 1) == NULL)
      return kv_fail(KVDB_NOMEM, "decoding buffers");
    kv_codec_err err;
    kv_codec_status st = kv_section_decode_rows_parsed(d->ctx, &info, sec, len, n, d->scratch,
                                                       d->scratch_cap, dst, stride, &err);
    if (st != KV_CODEC_OK) {
      char what[64];
      snprintf(what, sizeof what, "decoding section %u", s);
      return kv_codec_fail(st, &err, what);
    }
  }
  return KVDB_OK;
}
