/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_layout.c — part of `kvdb-bench compress` (issue 16, must-have 3): do stored bytes
 * follow the config? The real set's contexts (stories260K, 512 tokens each) are put through the
 * engine (kvdb_put_ex into a fresh database under the run's directory) in each config, and the
 * bytes kvdb_context_stat reports (the block objects: meta region, data region, padding to
 * 4 KiB pages) are divided by the logical KV bytes (n_tokens x kvdb_model_token_bytes). At the
 * model's default block size (16 tokens, tools/refkv) and f32 storage (refkv's default), then
 * at f16, and at 256-token blocks. Sizes, not speeds: deterministic.
 *
 * JSON: raw_bytes_vs_logical (f32, 16-token blocks: the figure), and
 * layout_<f32|f16>_bt<16|256>_<config>_vs_logical for config raw, lossless, int8, int4, int2,
 * and layout_<...>_<config>_vs_raw (stored bytes over the raw context's stored bytes).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_frames.h"
#include "codec.h"
#include "kvdb.h"

#define BL_CONFIGS 5
static const char *const BL_CFG[BL_CONFIGS] = {"raw", "lossless", "int8", "int4", "int2"};
#define BL_MAX_CTX 16u

/* Context c of set s as one LKTHD buffer of the model's dtype. */
static void fill_ctx(const bench_kvset *s, uint32_t c, kvdb_dtype dt, void *out)
{
  uint32_t L = s->n_layers, H = s->n_kv_heads, d = s->head_dim, n = s->n_tokens;
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < H; h++) {
          const uint16_t *src = s->kv + (((size_t)(c * L + l) * H + h) * 2 + kv) * n * d +
                                (size_t)t * d;
          size_t at = ((((size_t)l * 2 + kv) * n + t) * H + h) * d;
          if (dt == KVDB_F16) {
            memcpy((uint16_t *)out + at, src, d * 2);
          } else {
            float *o = (float *)out + at;
            kv_codec_to_f32(KV_CODEC_F16, src, d, o);
          }
        }
}

int bench_layout_set(const bench_env *env, bench_json *j, const bench_kvset *s)
{
  FILE *o = env->out;
  uint32_t n_ctx = s->n_ctx < BL_MAX_CTX ? s->n_ctx : BL_MAX_CTX;
  static const kvdb_dtype DT[2] = {KVDB_F32, KVDB_F16};
  static const uint32_t BT[2] = {16, 256};
  char k[128];
  int rc = -1;
  fprintf(o, "\nbytes that follow the config (issue 16): %u stories260K contexts of %u tokens "
             "put through kvdb; stored = kvdb_context_stat bytes (block objects, 4 KiB pages), "
             "logical = tokens x %u layers x %u KV heads x 2 x head_dim %u x element bytes\n",
          n_ctx, s->n_tokens, s->n_layers, s->n_kv_heads, s->head_dim);
  fprintf(o, "  %-10s %6s", "storage", "block");
  for (int c = 0; c < BL_CONFIGS; c++)
    fprintf(o, " %10s", BL_CFG[c]);
  fprintf(o, "   (stored / logical)\n");
  for (int di = 0; di < 2; di++)
    for (int bi = 0; bi < 2; bi++) {
      kvdb_model m = {"bench-layout-stories260K", s->n_layers, s->n_kv_heads, s->head_dim,
                      DT[di], BT[bi], 0};
      size_t tb = kvdb_model_token_bytes(&m);
      char dir[4200];
      snprintf(dir, sizeof dir, "%s/layout-%d-%u", env->dir, di, BT[bi]);
      kvdb_options opt;
      kvdb_options_init(&opt);
      opt.dram_bytes = 0;
      opt.log_level = -1;
      kvdb *db = NULL;
      void *buf = malloc((size_t)s->n_tokens * tb);
      uint32_t *tok = malloc(s->n_tokens * sizeof *tok);
      if (buf == NULL || tok == NULL || kvdb_open(dir, &opt, &db) != KVDB_OK) {
        bench_log("layout: cannot open %s: %s", dir, kvdb_errmsg());
        free(buf);
        free(tok);
        return -1;
      }
      double ratio[BL_CONFIGS];
      for (int ci = 0; ci < BL_CONFIGS; ci++) {
        kvdb_put_opts po;
        kvdb_put_opts_init(&po);
        if (kvdb_config_parse(BL_CFG[ci], &po.config) != KVDB_OK)
          goto fail;
        uint64_t stored = 0;
        for (uint32_t c = 0; c < n_ctx; c++) {
          fill_ctx(s, c, DT[di], buf);
          for (uint32_t t = 0; t < s->n_tokens; t++) /* no two contexts share a block */
            tok[t] = 1000000u * (uint32_t)(ci + 1) + 1000u * c + t;
          kvdb_kv_view v;
          kvdb_put_info info;
          if (kvdb_kv_view_packed(&v, buf, &m, s->n_tokens, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
              kvdb_put_ex(db, &m, tok, s->n_tokens, &v, &po, &info) != KVDB_OK)
            goto fail;
          kvdb_context_info ci_;
          if (kvdb_context_stat(db, &info.context, &ci_) != KVDB_OK)
            goto fail;
          stored += ci_.bytes;
        }
        ratio[ci] = (double)stored / ((double)n_ctx * s->n_tokens * tb);
      }
      fprintf(o, "  %-10s %6u", DT[di] == KVDB_F32 ? "f32" : "f16", BT[bi]);
      for (int ci = 0; ci < BL_CONFIGS; ci++)
        fprintf(o, " %10.4f", ratio[ci]);
      fprintf(o, "\n");
      for (int ci = 0; ci < BL_CONFIGS; ci++) {
        snprintf(k, sizeof k, "layout_%s_bt%u_%s_vs_logical", DT[di] == KVDB_F32 ? "f32" : "f16",
                 BT[bi], BL_CFG[ci]);
        bench_json_num(j, k, ratio[ci]);
        snprintf(k, sizeof k, "layout_%s_bt%u_%s_vs_raw", DT[di] == KVDB_F32 ? "f32" : "f16",
                 BT[bi], BL_CFG[ci]);
        bench_json_num(j, k, ratio[ci] / ratio[0]);
      }
      if (di == 0 && bi == 0)
        bench_json_num(j, "raw_bytes_vs_logical", ratio[0]);
      kvdb_close(db);
      free(buf);
      free(tok);
      if (!env->keep)
        bench_rmtree(dir);
      continue;
    fail:
      bench_log("layout: put of '%s' failed: %s", BL_CFG[0], kvdb_errmsg());
      kvdb_close(db);
      free(buf);
      free(tok);
      return -1;
    }
  rc = 0;
  return rc;
}
