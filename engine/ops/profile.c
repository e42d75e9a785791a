/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/profile.c — a context's quality profile (EvicPress §4.3: the profiler that feeds
 * the placement policy its (size, quality) per config).
 *
 * For each config of the space and each sampled (layer, KV head): the head's K and V over the
 * whole context are encoded block by block exactly as a put with that config stores them
 * (same codec parameters, same per-block token selection), decoded, and measured by
 * compress/'s causal metric (codec.h THE CAUSAL METRIC, issue 16): each probe, at a token
 * position, attends causally, softmax(q.K^T / sqrt(d)).V, to the keys at positions <= its own,
 * over the decoded rows (dropped tokens absent) and over the original ones; quality = the mean
 * over heads of the mean cosine of the two outputs (`cosine`; `worst_head` the lowest head's),
 * rel_l2 the mean of the relative L2 errors. A model with output gains
 * (kvdb_model_set_output_gains) gets the output-weighted quality instead (codec.h THE
 * OUTPUT-WEIGHTED QUALITY: each probe's errors pooled over the sampled heads of its layer,
 * weighted by the gains of their query heads), flag KVDB_PROFILE_WEIGHTED. The size of the
 * whole context in the config is its sampled sections' encoded bytes scaled to all sections,
 * laid out per block.
 * Probes are the model's queries at positions spread over the context when the caller gives
 * them (kvdb_put_opts.probe_queries: every query head of the KV head's group), else the keys
 * at KV_QUALITY_SPREAD_PROBES evenly spaced positions scaled to a query's norm
 * (kv_quality_spread_probes). SnapKV's window (kvdb_put_opts.queries) is never a probe: those
 * queries chose what SnapKV keeps, and probing with them flattered it (issue 16).
 * Sampling keeps the cost bounded: per config, about 2 x heads x n_tokens x head_dim elements
 * are encoded, decoded and attended (16 heads of a 1024-token Llama-3-8B context: 8 MiB).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_int.h"

static const char *const DEFAULT_SPACE =
    "raw,lossless,int8,int4,int2,knorm90,knorm70,knorm50,knorm30,keydiff90,keydiff70,keydiff50,"
    "keydiff30";
static const char *const DEFAULT_SNAPKV = "snapkv90,snapkv70,snapkv50,snapkv30";

/* The configs named in `list` into out. A config the model cannot take is an error when the
 * caller named it; in the default space (`skip_unfit`) it is left out (a scoring model takes
 * no token dropping; a small block_tokens no large quantization group). */
static kvdb_status add_names(const char *list, const kvdb_model *m, kvdb_config *out, uint32_t cap,
                             uint32_t *n, int skip_unfit)
{
  const char *p = list;
  while (*p) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char name[64];
    if (len == 0 || len >= sizeof name)
      return kv_fail(KVDB_INVALID, "profile space: empty or too long config name at '%.20s'", p);
    memcpy(name, p, len);
    name[len] = 0;
    kvdb_config c;
    KV_RET(kvdb_config_parse(name, &c));
    if (kvdb_config_check(m, &c) != KVDB_OK) {
      if (!skip_unfit)
        return KVDB_INVALID; /* kvdb_config_check's message names the field */
      kv_clear_error();
      p += len + (e != NULL);
      continue;
    }
    int dup = 0;
    for (uint32_t i = 0; i < *n && !dup; i++)
      dup = kv_policy_config_equal(&out[i], &c);
    if (!dup) {
      if (*n == cap)
        return kv_fail(KVDB_INVALID, "profile space: more than %u configs", cap);
      out[(*n)++] = c;
    }
    p += len + (e != NULL);
  }
  return KVDB_OK;
}

kvdb_status kv_profile_space(const char *space, int have_queries, const kvdb_model *m,
                             kvdb_config *out, uint32_t cap, uint32_t *n)
{
  *n = 0;
  if (space != NULL && *space) {
    KV_RET(add_names(space, m, out, cap, n, 0));
    for (uint32_t i = 0; i < *n; i++)
      if (out[i].method == KVDB_METHOD_DROP && out[i].drop == KVDB_DROP_SNAPKV && !have_queries)
        return kv_fail(KVDB_INVALID, "profile space: snapkv configs need queries");
    return KVDB_OK;
  }
  KV_RET(add_names(DEFAULT_SPACE, m, out, cap, n, 1));
  if (have_queries)
    KV_RET(add_names(DEFAULT_SNAPKV, m, out, cap, n, 1));
  return KVDB_OK;
}

void kv_profile_mark_stored(kv_profile_rec *p, const kvdb_config *cfg, uint64_t bytes)
{
  kv_profile_rec_mark_stored(p, cfg, bytes);
}

/* Buffers of one measurement. */
typedef struct prof_buf {
  uint8_t *k, *v, *kd, *vd, *ascratch, *dscratch;
  float *probes, *ref, *out;
  uint32_t *ppos, *rpos; /* probe positions; token positions of the decoded rows */
  size_t dscratch_cap;
} prof_buf;

static void prof_free(prof_buf *b)
{
  free(b->k);
  free(b->v);
  free(b->kd);
  free(b->vd);
  free(b->ascratch);
  free(b->dscratch);
  free(b->probes);
  free(b->ppos);
  free(b->rpos);
  free(b->ref);
  free(b->out);
}

/* Decode one encoded section (len bytes at src) and append its rows to dst (*n_rows so far);
 * pos (when not NULL) receives their token positions, t0 added. */
static kvdb_status decode_append(const uint8_t *src, uint32_t len, kv_cdec *d, prof_buf *pb,
                                 uint8_t *dst, uint32_t row_bytes, uint32_t *n_rows,
                                 uint32_t *pos, uint64_t t0)
{
  kv_section_info info;
  kv_codec_err err;
  kv_codec_status st = kv_section_parse(src, len, &info, &err);
  if (st == KV_CODEC_OK) {
    size_t need = kv_section_scratch_bytes(&info);
    if (need > pb->dscratch_cap) {
      free(pb->dscratch);
      pb->dscratch = malloc(need);
      pb->dscratch_cap = pb->dscratch ? need : 0;
      if (pb->dscratch == NULL)
        return kv_fail(KVDB_NOMEM, "profile decoding scratch");
    }
    /* the decoding context (its zstd set-up is a large share of a small context's profile)
     * only where it is used: kivi sections (the engine's int8, kivi4, kivi2) decode the same
     * values without one (it only enables streaming stores there) */
    kv_codec_dctx *ctx = NULL;
    if (info.codec_id != KV_CODEC_ID_KIVI) {
      if (d->ctx_mem == NULL)
        KV_RET(kv_cdec_init(d));
      ctx = d->ctx;
    }
    st = kv_section_decode_dctx(ctx, src, len, pb->dscratch, pb->dscratch_cap,
                                dst + (size_t)*n_rows * row_bytes,
                                kv_section_rows_bytes(&info, 0, info.n_groups), NULL, &err);
  }
  if (st == KV_CODEC_OK && pos != NULL) {
    st = kv_section_positions(src, len, 0, info.n_rows, pos + *n_rows, &err);
    for (uint32_t i = 0; st == KV_CODEC_OK && i < info.n_rows; i++)
      pos[*n_rows + i] += (uint32_t)t0;
  }
  if (st != KV_CODEC_OK)
    return kv_codec_fail(st, &err, "profile: decoding a section it just encoded");
  *n_rows += info.n_rows;
  return KVDB_OK;
}

kvdb_status kv_profile_measure(const kv_profile_src *src, kv_profile_rec *out)
{
  const kvdb_model *m = src->m;
  const kv_model_rope rope = {m->rope_base, m->rope_style};
  kvdb_config cfgs[KV_PROFILE_MAX_CONFIGS];
  uint32_t n_cfg = 0;
  KV_RET(kv_profile_space(src->space, src->q != NULL, m, cfgs, KV_PROFILE_MAX_CONFIGS, &n_cfg));
  uint32_t bt = src->block_tokens, H = m->n_kv_heads, L = m->n_layers, d = m->head_dim;
  uint64_t n = src->n_tokens;
  uint32_t eb = kv_dtype_bytes(m->dtype), row = d * eb;
  uint32_t n_blocks = (uint32_t)((n + bt - 1) / bt);
  uint32_t S = src->heads ? src->heads : KV_PROFILE_HEADS_DEFAULT;
  if (S > L * H)
    S = L * H;
  uint32_t grp = src->pq ? src->pq->n_q_heads / H : 0;
  uint32_t max_probes = src->pq ? src->pq->n_queries * grp : KV_QUALITY_SPREAD_PROBES;
  const kv_model_gains *gn = src->gains != NULL && src->gains->g != NULL ? src->gains : NULL;
  if (gn != NULL && (gn->n_layers != L || (src->pq != NULL && src->pq->n_q_heads != gn->n_q_heads)))
    return kv_fail(KVDB_INVALID, "the probe queries have %u query heads; model '%s' has output "
                                 "gains for %u layers of %u query heads",
                   src->pq ? src->pq->n_q_heads : 0, m->id, gn->n_layers, gn->n_q_heads);
  /* the output-weighted quality's sums: [config][layer][probe position] */
  uint32_t npos = src->pq ? src->pq->n_queries : KV_QUALITY_SPREAD_PROBES;

  memset(out, 0, sizeof *out);
  out->n_entries = n_cfg;
  out->measured_ms = kv_now_ms();
  double *qsum = calloc(n_cfg, sizeof *qsum), *rsum = calloc(n_cfg, sizeof *rsum);
  double *wmin = malloc(n_cfg * sizeof *wmin); /* the worst head's mean cosine */
  size_t gcells = gn ? (size_t)n_cfg * L * npos : 0;
  double *ge = gn ? calloc(gcells * 2, sizeof *ge) : NULL, *gr = ge ? ge + gcells : NULL;
  uint8_t *seen = gn ? calloc(L, 1) : NULL;
  float *gmean = gn ? malloc((size_t)d * sizeof *gmean) : NULL; /* derived probes' gains */
  for (uint32_t c = 0; wmin != NULL && c < n_cfg; c++)
    wmin[c] = 1.0;
  uint64_t *enc = calloc((size_t)n_cfg * n_blocks, sizeof *enc); /* sampled bytes per block */
  prof_buf pb;
  memset(&pb, 0, sizeof pb);
  size_t rows_bytes = (size_t)n * row;
  pb.k = malloc(rows_bytes);
  pb.v = malloc(rows_bytes);
  pb.kd = malloc(rows_bytes);
  pb.vd = malloc(rows_bytes);
  pb.probes = malloc((size_t)max_probes * d * sizeof(float));
  pb.ppos = malloc((size_t)max_probes * sizeof *pb.ppos);
  pb.rpos = malloc((size_t)n * sizeof *pb.rpos);
  pb.ref = malloc((size_t)max_probes * d * sizeof(float));
  pb.out = malloc((size_t)max_probes * d * sizeof(float));
  size_t asc = kv_quality_causal_scratch_bytes((uint32_t)n, d);
  pb.ascratch = malloc(asc);
  kv_cenc e;
  memset(&e, 0, sizeof e);
  kv_cdec dec; /* its zstd context made on first use (decode_append) */
  memset(&dec, 0, sizeof dec);
  kvdb_status rc = KVDB_OK;
  if (rc == KVDB_OK && (!qsum || !rsum || !enc || !pb.k || !pb.v || !pb.kd || !pb.vd ||
                        !pb.probes || !pb.ppos || !pb.rpos || !pb.ref || !pb.out ||
                        !pb.ascratch || !wmin || (gn && (!ge || !seen || !gmean))))
    rc = kv_fail(KVDB_NOMEM, "profile buffers for %llu tokens", (unsigned long long)n);
  kv_codec_err err;
  kv_section_shape kshape = {(kv_codec_dtype)m->dtype, KV_SECTION_K, (uint32_t)n, d};
  for (uint32_t si = 0; rc == KVDB_OK && si < S; si++) {
    uint32_t idx = (uint32_t)(((uint64_t)si * L * H) / S), layer = idx / H, head = idx % H;
    kv_gather_head(src->kv, eb, d, layer, head, 0, 0, n, pb.k);
    kv_gather_head(src->kv, eb, d, layer, head, 1, 0, n, pb.v);
    uint32_t np = 0;
    if (src->pq != NULL) { /* the query heads of this KV head at every probe position */
      for (uint32_t o = 0; o < src->pq->n_queries; o++)
        for (uint32_t j = 0; j < grp; j++, np++) {
          memcpy(pb.probes + (size_t)np * d,
                 src->pq->q + (((size_t)o * L + layer) * src->pq->n_q_heads + head * grp + j) * d,
                 d * sizeof(float));
          pb.ppos[np] = src->pq_pos[o];
        }
    } else {
      kv_codec_status st = kv_quality_spread_probes(&kshape, pb.k, rows_bytes,
                                                    KV_QUALITY_SPREAD_PROBES, pb.probes, pb.ppos,
                                                    &np, &err);
      if (st != KV_CODEC_OK) {
        rc = kv_codec_fail(st, &err, "profile: deriving probes");
        break;
      }
    }
    out->n_probes = np;
    /* the gains this head's probes weigh by: its query heads' (real queries), or their mean
     * (probes derived from the keys: one per position) */
    const float *hg = NULL;
    uint32_t hgrp = 1, hch = 1;
    if (gn != NULL) {
      seen[layer] = 1;
      uint32_t qg = gn->n_q_heads / H;
      const float *g0 = gn->g + ((size_t)layer * gn->n_q_heads + (size_t)head * qg) * gn->channels;
      hch = gn->channels;
      if (src->pq != NULL) {
        hg = g0;
        hgrp = grp;
      } else {
        for (uint32_t ch = 0; ch < hch; ch++) {
          double sm = 0;
          for (uint32_t j = 0; j < qg; j++)
            sm += g0[(size_t)j * hch + ch];
          gmean[ch] = (float)(sm / qg);
        }
        hg = gmean;
      }
    }
    kv_codec_status st = kv_quality_causal_attend((kv_codec_dtype)m->dtype, (uint32_t)n, d, pb.k,
                                                  pb.v, NULL, pb.probes, pb.ppos, np, pb.ascratch,
                                                  asc, pb.ref, &err);
    if (st != KV_CODEC_OK) {
      rc = kv_codec_fail(st, &err, "profile: attention over the original KV");
      break;
    }
    for (uint32_t c = 0; rc == KVDB_OK && c < n_cfg; c++) {
      const kvdb_config *cfg = &cfgs[c];
      if (cfg->method == KVDB_METHOD_RAW ||
          (src->not_below != NULL && !kv_policy_config_reachable(src->not_below, cfg)))
        continue; /* raw: exact by definition; unreachable: recorded unmeasured below */
      uint32_t nk = 0, nv = 0;
      /* lossless: bit-exact by construction (compress/ tests): its bytes are measured, its
       * sections are not decoded back (nothing compares them) */
      int exact = kv_policy_config_exact(cfg);
      for (uint32_t b = 0; rc == KVDB_OK && b < n_blocks; b++) {
        uint64_t t0 = (uint64_t)b * bt;
        uint32_t nt = (uint32_t)(t0 + bt <= n ? bt : n - t0);
        kv_block_geom g;
        rc = kv_block_geom_init(&g, L, H, d, m->dtype, bt, nt);
        kv_section_codec sc;
        if (rc == KVDB_OK)
          rc = kv_config_section_rope(cfg, &g, n, t0, &rope, &sc);
        if (rc != KVDB_OK)
          break;
        kv_cblock_src bs = {.cfg = cfg, .g = &g, .t0 = t0, .keep_t0 = t0, .ctx_tokens = n, .q = src->q,
                            .last_block = b + 1 == n_blocks, .index = b, .rope = rope,
                            .calib = src->calib};
        uint32_t len[2];
        uint32_t s = (layer * H + head) * 2;
        rc = kv_cblock_encode_pair(&bs, &sc, s, pb.k + t0 * row, pb.v + t0 * row, &e, len);
        if (rc == KVDB_OK && !exact)
          rc = decode_append(e.pair, len[0], &dec, &pb, pb.kd, row, &nk, pb.rpos, t0);
        if (rc == KVDB_OK && !exact)
          rc = decode_append(e.pair + len[0], len[1], &dec, &pb, pb.vd, row, &nv, NULL, 0);
        enc[(size_t)c * n_blocks + b] += (uint64_t)len[0] + len[1];
      }
      if (rc != KVDB_OK)
        break;
      if (exact) {
        qsum[c] += 1.0;
        continue;
      }
      kv_quality qy;
      st = kv_quality_causal_attend((kv_codec_dtype)m->dtype, nk, d, pb.kd, pb.vd, pb.rpos,
                                    pb.probes, pb.ppos, np, pb.ascratch, asc, pb.out, &err);
      if (st == KV_CODEC_OK)
        st = kv_quality_compare(pb.ref, pb.out, np, d, &qy, &err);
      if (st != KV_CODEC_OK) {
        rc = kv_codec_fail(st, &err, "profile: attention over the decoded KV");
        break;
      }
      qsum[c] += qy.cos_mean;
      rsum[c] += qy.rel_l2;
      wmin[c] = qy.cos_mean < wmin[c] ? qy.cos_mean : wmin[c];
      if (gn != NULL) {
        size_t at = ((size_t)c * L + layer) * npos;
        kv_quality_gain_add(pb.ref, pb.out, np / hgrp, hgrp, d, hg, hch, ge + at, gr + at);
      }
    }
  }
  /* blocks as a put writes them: packed (64-byte units, the run padded to a page) when small
   * and without score copies (raw: FORMAT.md §3e, compressed: §3f), else whole pages */
  uint64_t pack_max = src->packed_block_bytes == 1 ? 0
                      : src->packed_block_bytes > 1 ? src->packed_block_bytes
                                                    : KV_PACK_MAX_DEFAULT;
  for (uint32_t c = 0; rc == KVDB_OK && c < n_cfg; c++) {
    kvdb_profile_entry *pe = &out->e[c];
    memset(pe, 0, sizeof *pe);
    uint64_t packed_run = 0;
    pe->config = cfgs[c];
    pe->reported_quality = NAN;
    pe->n_probes = out->n_probes;
    uint64_t bytes = 0;
    for (uint32_t b = 0; b < n_blocks; b++) {
      uint64_t t0 = (uint64_t)b * bt;
      uint32_t nt = (uint32_t)(t0 + bt <= n ? bt : n - t0);
      kv_block_geom g;
      kv_block_geom_init(&g, L, H, d, m->dtype, bt, nt);
      if (cfgs[c].method == KVDB_METHOD_RAW) {
        kv_block_geom pg = g;
        kv_block_geom_pack(&pg);
        if (m->score_bits == 0 && pg.total_bytes <= pack_max)
          packed_run += KV_ALIGN_UP(pg.total_bytes, (uint64_t)KV_BLOCK_PACK_ALIGN);
        else
          bytes += g.total_bytes;
        continue;
      }
      kv_cblock_layout lay;
      uint64_t scaled = (uint64_t)((double)enc[(size_t)c * n_blocks + b] * ((double)L * H / S));
      kv_cblock_layout_init_packed(&g, scaled, &lay);
      if (m->score_bits == 0 && pack_max != 0 && lay.total_bytes <= pack_max) {
        packed_run += lay.total_bytes;
        continue;
      }
      kv_cblock_layout_init(&g, scaled, &lay);
      bytes += lay.total_bytes;
    }
    pe->bytes = bytes + KV_ALIGN_UP(packed_run, (uint64_t)KV_PAGE);
    pe->flags = gn != NULL ? KVDB_PROFILE_WEIGHTED : 0;
    if (cfgs[c].method == KVDB_METHOD_RAW) {
      pe->quality = pe->cosine = pe->worst_head = 1.0;
      pe->flags |= KVDB_PROFILE_EXACT;
    } else if (src->not_below != NULL && !kv_policy_config_reachable(src->not_below, &cfgs[c])) {
      pe->quality = pe->rel_l2 = pe->cosine = pe->worst_head = NAN;
      pe->bytes = 0;
    } else {
      pe->cosine = qsum[c] / S;
      pe->rel_l2 = rsum[c] / S;
      pe->worst_head = wmin[c];
      pe->quality = pe->cosine;
      if (gn != NULL) /* exact configs: no error was added, the quality is 1 */
        pe->quality = kv_policy_config_exact(&cfgs[c])
                          ? 1.0
                          : kv_quality_gain_finish(ge + (size_t)c * L * npos,
                                                   gr + (size_t)c * L * npos, L, npos, seen);
    }
  }
  free(qsum);
  free(rsum);
  free(wmin);
  free(ge);
  free(seen);
  free(gmean);
  free(enc);
  prof_free(&pb);
  kv_cenc_free(&e);
  kv_cdec_free(&dec);
  return rc;
}

/* ---- recording, reading (reports: place/report.c) ---- */

/* Keep the caller's reports of `old` in `p` (matched by config). */
static void keep_reports(kv_profile_rec *p, const kv_profile_rec *old)
{
  for (uint32_t i = 0; i < old->n_entries; i++) {
    if (old->e[i].n_reports == 0)
      continue;
    uint32_t k;
    for (k = 0; k < p->n_entries &&
                !kv_policy_config_equal(&p->e[k].config, &old->e[i].config); k++)
      ;
    if (k == p->n_entries) {
      if (p->n_entries == KV_PROFILE_MAX_ENTRIES)
        continue;
      p->e[k] = old->e[i];
      p->e[k].flags &= ~(uint32_t)KVDB_PROFILE_STORED;
      p->n_entries++;
      continue;
    }
    p->e[k].reported_quality = old->e[i].reported_quality;
    p->e[k].n_reports = old->e[i].n_reports;
  }
}

kvdb_status kv_profile_store(kvdb *db, const uint8_t key[16], kv_profile_rec *p)
{
  kv_txn *txn;
  KV_RET(kv_txn_begin(&db->cat, 1, &txn));
  kv_ctx_rec cr;
  kvdb_status rc = kv_cat_get_ctx(&db->cat, txn, key, &cr);
  kv_profile_rec *old = NULL;
  if (rc == KVDB_OK) {
    old = malloc(sizeof *old);
    if (old == NULL)
      rc = kv_fail(KVDB_NOMEM, "profile");
  }
  if (rc == KVDB_OK) {
    kvdb_status g = kv_cat_get_profile(&db->cat, txn, key, old);
    if (g == KVDB_OK)
      keep_reports(p, old);
    else if (g != KVDB_NOTFOUND)
      rc = g;
  }
  if (rc == KVDB_OK) {
    kv_profile_mark_stored(p, &cr.config, cr.bytes);
    rc = kv_cat_put_profile(&db->cat, txn, key, p);
  }
  free(old);
  if (rc != KVDB_OK) {
    kv_txn_abort(txn);
    return rc;
  }
  return kv_txn_commit(txn);
}

kvdb_status kvdb_profile_get(kvdb *db, const kvdb_key *context, kvdb_profile_entry *out,
                             size_t cap, size_t *n)
{
  KV_RET(kv_check_db(db));
  if (context == NULL || n == NULL || (out == NULL && cap > 0))
    return kv_fail(KVDB_INVALID, "context or n is NULL, or out is NULL with cap > 0");
  *n = 0;
  kv_profile_rec *p = malloc(sizeof *p);
  if (p == NULL)
    return kv_fail(KVDB_NOMEM, "profile");
  kv_txn *txn;
  kvdb_status rc = kv_txn_begin(&db->cat, 0, &txn);
  if (rc == KVDB_OK) {
    rc = kv_cat_get_profile(&db->cat, txn, context->b, p);
    kv_txn_abort(txn);
  }
  char hx[33];
  if (rc == KVDB_NOTFOUND)
    rc = kv_fail(KVDB_NOTFOUND, "no profile recorded for context %s", kv_hex16(context->b, hx));
  if (rc == KVDB_OK) {
    *n = p->n_entries;
    for (size_t i = 0; i < cap && i < p->n_entries; i++) {
      out[i] = p->e[i];
      if (!(out[i].flags & KVDB_PROFILE_WEIGHTED)) { /* a record without them (version 1,
                                                        predicted): quality is the cosine */
        out[i].cosine = out[i].quality;
        out[i].worst_head = NAN;
      }
    }
  }
  free(p);
  return rc;
}
