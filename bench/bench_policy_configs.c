/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_configs.c — `kvdb-bench policy` part 2: what each config of the space does to
 * a set of KV: encoded bytes (the ratio), decode time (one core) and the quality proxy per
 * context (attention outputs of the decoded rows against the original's).
 */
#define _GNU_SOURCE
#include "bench_policy.h"

/* The codec, parameters and codec id of a config for a section kind. */
static unsigned cfg_codec(const kvdb_config *c, kv_codec_params *p)
{
  kv_codec_params_init(p);
  switch (c->method) {
  case KVDB_METHOD_LOSSLESS:
    p->zstd_level = c->zstd_level != 0 ? c->zstd_level : KV_CODEC_ZSTD_LEVEL_DEFAULT;
    return KV_CODEC_ID_ZSTD_PLANES;
  case KVDB_METHOD_QUANT:
    p->bits = c->bits;
    p->group = c->group;
    p->residual = c->residual;
    return KV_CODEC_ID_KIVI;
  case KVDB_METHOD_DROP:
    p->bits = c->bits;
    p->group = c->bits ? c->group : 0;
    p->residual = c->bits ? c->residual : 0;
    p->keep_permille = c->keep_permille;
    p->drop_method = (kv_drop_method)c->drop;
    return KV_CODEC_ID_DROP;
  default:
    return KV_CODEC_ID_RAW;
  }
}

int pb_encode_set(cfg_run *r)
{
  const bench_kvset *s = r->s;
  kv_codec_params p;
  unsigned id = cfg_codec(r->c, &p);
  const kv_codec *codec = kv_codec_by_id(id);
  kv_section_shape sh[2] = {{KV_CODEC_F16, KV_SECTION_K, s->n_tokens, s->head_dim},
                            {KV_CODEC_F16, KV_SECTION_V, s->n_tokens, s->head_dim}};
  size_t need_scr = 0, bound = 0;
  for (int kv = 0; kv < 2; kv++) {
    size_t b = kv_codec_bound(codec, &sh[kv], &p);
    size_t e = kv_codec_scratch_bytes(codec, &sh[kv], &p, KV_CODEC_OP_ENCODE);
    size_t dsc = kv_codec_scratch_bytes(codec, &sh[kv], &p, KV_CODEC_OP_DECODE);
    if (b == 0 || e == 0 || dsc == 0) {
      bench_log("the codec refuses config %d's shape", (int)r->c->method);
      return -1;
    }
    bound += b * s->n_heads;
    need_scr = e > need_scr ? e : need_scr;
    need_scr = dsc > need_scr ? dsc : need_scr;
  }
  if (id == KV_CODEC_ID_DROP) {
    kv_snapkv_window w = {s->win, s->win_obs, s->win_qh, 0, KV_POOL_AVG, 1};
    kv_snapkv_window wk = {s->kwin, BENCH_KVSET_SNAP_OBS, 1, 0, KV_POOL_AVG, 1};
    size_t e = kv_drop_scratch_bytes(p.drop_method, s->n_tokens, s->head_dim,
                                     p.drop_method == KV_DROP_SNAPKV ? &w : NULL);
    need_scr = e > need_scr ? e : need_scr;
    if (s->kwin != NULL && p.drop_method == KV_DROP_SNAPKV) {
      e = kv_drop_scratch_bytes(p.drop_method, s->n_tokens, s->head_dim, &wk);
      need_scr = e > need_scr ? e : need_scr;
    }
  }
  uint32_t most = s->max_probes > KV_QUALITY_MAX_DERIVED ? s->max_probes : KV_QUALITY_MAX_DERIVED;
  size_t qa = kv_quality_attend_scratch_bytes(s->n_tokens, s->head_dim, most);
  need_scr = qa > need_scr ? qa : need_scr;
  if (bench_scratch_need(r->ws, need_scr) != 0)
    return -1;
  if (bound > r->arena_cap) {
    bench_free(r->arena);
    r->arena = bench_alloc(bound);
    r->arena_cap = r->arena ? bound : 0;
    if (r->arena == NULL) {
      bench_log("out of memory (%zu bytes of encoded sections)", bound);
      return -1;
    }
  }
  size_t pos = 0;
  for (uint32_t h = 0; h < s->n_heads; h++) {
    const uint8_t *k = bench_kvset_sec(s, s->kv, 2 * (size_t)h);
    kv_codec_params pk[2] = {p, p};
    if (id == KV_CODEC_ID_DROP) {
      kv_snapkv_window w = {s->win + (size_t)h * s->win_obs * s->win_qh * s->head_dim,
                            s->win_obs, s->win_qh, 0, KV_POOL_AVG, 1};
      if (r->key_window && s->kwin != NULL)
        w = (kv_snapkv_window){s->kwin + (size_t)h * BENCH_KVSET_SNAP_OBS * s->head_dim, BENCH_KVSET_SNAP_OBS, 1, 0,
                               KV_POOL_AVG, 1};
      uint32_t nk = 0;
      if (kv_drop_select(p.drop_method, &sh[0], k, s->sec_bytes, p.keep_permille,
                         p.drop_method == KV_DROP_SNAPKV ? &w : NULL, r->ws->p, r->ws->cap,
                         r->keep_pos, s->n_tokens, &nk, &r->err) != KV_CODEC_OK)
        return bench_codec_fail("kv_drop_select", &r->err);
      for (int kv = 0; kv < 2; kv++) {
        pk[kv].keep_pos = r->keep_pos;
        pk[kv].n_keep = nk;
      }
    }
    for (int kv = 0; kv < 2; kv++) {
      size_t sec = 2 * (size_t)h + (size_t)kv, n = 0;
      if (kv_codec_encode(codec, &sh[kv], k + (size_t)kv * s->sec_bytes, s->sec_bytes, &pk[kv],
                          r->ws->p, r->ws->cap, r->arena + pos, r->arena_cap - pos, &n,
                          &r->err) != KV_CODEC_OK)
        return bench_codec_fail("kv_codec_encode", &r->err);
      r->off[sec] = pos;
      r->len[sec] = n;
      pos += n;
    }
  }
  return 0;
}

int pb_decode_pass(void *payload, size_t iter)
{
  cfg_run *r = payload;
  const bench_kvset *s = r->s;
  (void)iter;
  for (size_t sec = 0; sec < 2 * (size_t)s->n_heads; sec++)
    if (kv_section_decode_dctx(r->dctx, r->arena + r->off[sec], r->len[sec], r->ws->p,
                               r->ws->cap, r->out + sec * s->sec_bytes, s->sec_bytes, NULL,
                               &r->err) != KV_CODEC_OK)
      return -1;
  return 0;
}

/* Quality of the decoded set per context (mean over its heads of the mean cosine) for one probe
 * set: head h's probes and original outputs at h * stride rows, n_probes[h] of them. */
int pb_probe_quality(cfg_run *r, const float *probes, const uint32_t *n_probes,
                     const float *refs, uint32_t stride, double *q_ctx)
{
  const bench_kvset *s = r->s;
  uint32_t d = s->head_dim;
  float *test = malloc((size_t)stride * d * sizeof *test);
  if (test == NULL)
    return -1;
  for (uint32_t c = 0; c < s->n_ctx; c++)
    q_ctx[c] = 0;
  for (uint32_t h = 0; h < s->n_heads; h++) {
    kv_section_info info;
    kv_codec_err err;
    if (kv_section_parse(r->arena + r->off[2 * (size_t)h], r->len[2 * (size_t)h], &info, &err) !=
        KV_CODEC_OK) {
      free(test);
      return bench_codec_fail("kv_section_parse", &err);
    }
    const uint8_t *kd = bench_kvset_sec(s, r->out, 2 * (size_t)h), *vd = kd + s->sec_bytes;
    kv_quality q;
    if (kv_quality_attend(KV_CODEC_F16, info.n_rows, d, kd, vd, probes + (size_t)h * stride * d,
                          n_probes[h], r->ws->p, r->ws->cap, test, &err) != KV_CODEC_OK ||
        kv_quality_compare(refs + (size_t)h * stride * d, test, n_probes[h], d, &q, &err) !=
            KV_CODEC_OK) {
      free(test);
      return bench_codec_fail("quality", &err);
    }
    q_ctx[h / s->heads_per_ctx] += q.cos_mean / s->heads_per_ctx;
  }
  free(test);
  return 0;
}

/* The set's quality per context on its probes (real queries, else derived from K). */
int pb_set_quality(cfg_run *r, double *q_ctx)
{
  const bench_kvset *s = r->s;
  return pb_probe_quality(r, s->probes, s->n_probes, s->ref, s->max_probes, q_ctx);
}

int pb_cfg_run_init(cfg_run *r, const bench_kvset *s, bench_scratch *ws)
{
  memset(r, 0, sizeof *r);
  r->s = s;
  r->ws = ws;
  r->off = calloc(2 * (size_t)s->n_heads, sizeof *r->off);
  r->len = calloc(2 * (size_t)s->n_heads, sizeof *r->len);
  r->keep_pos = calloc(s->n_tokens, sizeof *r->keep_pos);
  r->out = bench_alloc(s->total);
  r->dctx_mem = malloc(kv_codec_dctx_bytes());
  r->dctx = kv_codec_dctx_init(r->dctx_mem, kv_codec_dctx_bytes());
  if (!r->off || !r->len || !r->keep_pos || !r->out || !r->dctx) {
    bench_log("out of memory (config runs)");
    return -1;
  }
  return 0;
}

void pb_cfg_run_free(cfg_run *r)
{
  free(r->off);
  free(r->len);
  free(r->keep_pos);
  bench_free(r->out);
  bench_free(r->arena);
  free(r->dctx_mem);
}
