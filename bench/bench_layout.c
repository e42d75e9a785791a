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
 * and layout_<...>_<config>_vs_raw (stored bytes over the raw context's stored bytes);
 * layout_<...>_raw_pages_vs_logical and layout_<...>_<config>_pages_vs_logical: every config
 * again in whole-page objects (packed_block_bytes = 1, the layout before formats 7 and 9)
 * beside the packed default.
 *
 * layout_speed() (issue 16, packed objects): at f32 and 16-token blocks, for each config, the
 * same contexts put into two databases, packed (the default: formats 4, 5) and in whole pages;
 * cold kvdb_get of all of them (no DRAM tier), alternated, median of 5:
 * layout_get_[<config>_]<packed|pages>_gbps (logical bytes; raw without the config in the
 * name) and layout_get_[<config>_]packed_vs_pages; kvdb_get_tokens of 16 positions of one
 * layer per context: layout_tokens_[<config>_]<packed|pages>_bytes (bytes read per call,
 * kvdb_stat), layout_tokens_[<config>_]<packed|pages>_us (median per call) and
 * layout_tokens_[<config>_]packed_vs_pages_time. Both databases must return the same bytes.
 *
 * bench_get_vs_read(): a cold get of a whole context through kvdb (no DRAM tier: every block
 * read from its segment file with O_DIRECT, decoded, scattered into the caller's buffer) in
 * fp16-equivalent (logical) bytes per second, over the O_DIRECT read bandwidth of a plain file
 * of the context's stored size in the same directory, same run (4 MiB reads): JSON
 * <config>_logical_get_vs_raw_read (int4 is the figure; raw, lossless and kivi4, the
 * int4 before issue 16's redesign, beside it),
 * <config>_get_logical_gbps, get_raw_read_gbps, and <config>_get_cpu_gbps (logical bytes per
 * second of the process's CPU time, all threads: the get's cost whatever the machine's load).
 * The plain read is measured two ways, 4 MiB requests at queue depth 1
 * (get_raw_read_qd1_gbps) and 4 MiB requests 3 in flight (get_raw_read_qdN_gbps: as the get
 * reads a block), and get_raw_read_gbps, the ratio's denominator, is the faster.
 * Median of 5 of each, alternated.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* A fresh database at dir with contexts 0..n_ctx-1 of s (tokens 9000000 + 1000 c + t) stored
 * in config cfg, packed or in whole pages; NULL logged on failure. */
static kvdb *speed_db(const char *dir, const bench_kvset *s, const kvdb_model *m, uint32_t n_ctx,
                      int pages, const char *cfg, void *buf, uint32_t *tok)
{
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  if (kvdb_config_parse(cfg, &po.config) != KVDB_OK)
    return NULL;
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.dram_bytes = 0;
  opt.log_level = -1;
  opt.packed_block_bytes = pages ? 1 : 0;
  bench_rmtree(dir);
  kvdb *db = NULL;
  if (kvdb_open(dir, &opt, &db) != KVDB_OK)
    goto fail;
  for (uint32_t c = 0; c < n_ctx; c++) {
    fill_ctx(s, c, m->dtype, buf);
    for (uint32_t t = 0; t < s->n_tokens; t++)
      tok[t] = 9000000u + 1000u * c + t;
    kvdb_kv_view v;
    if (kvdb_kv_view_packed(&v, buf, m, s->n_tokens, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
        kvdb_put_ex(db, m, tok, s->n_tokens, &v, &po, NULL) != KVDB_OK)
      goto fail;
  }
  kvdb_close(db); /* reopened cold by the caller */
  if (kvdb_open(dir, &opt, &db) == KVDB_OK)
    return db;
fail:
  bench_log("layout speed: %s: %s", dir, kvdb_errmsg());
  kvdb_close(db);
  return NULL;
}

static int cmp_u64(const void *a, const void *b);

/* Get and get_tokens speed of contexts stored in cfg, packed objects against whole pages (see
 * the head comment). */
static int layout_speed(const bench_env *env, bench_json *j, const bench_kvset *s,
                        const kvdb_model *m, uint32_t n_ctx, const char *cfg)
{
  FILE *o = env->out;
  enum { REPS = 5, NPOS = 16 };
  size_t tb = kvdb_model_token_bytes(m), logical = (size_t)n_ctx * s->n_tokens * tb;
  void *buf = malloc((size_t)s->n_tokens * tb), *out = malloc((size_t)s->n_tokens * tb);
  void *tout = malloc(NPOS * tb), *first = malloc((size_t)s->n_tokens * tb);
  void *tfirst = malloc(NPOS * tb);
  uint32_t *tok = malloc(s->n_tokens * sizeof *tok);
  kvdb *db[2] = {NULL, NULL};
  char dir[2][4200];
  int rc = -1, exact = strcmp(cfg, "raw") == 0 || strcmp(cfg, "lossless") == 0;
  if (buf == NULL || out == NULL || tok == NULL || tout == NULL || first == NULL ||
      tfirst == NULL)
    goto out;
  for (int k = 0; k < 2; k++) {
    snprintf(dir[k], sizeof dir[k], "%s/layout-speed-%s-%d", env->dir, cfg, k);
    if ((db[k] = speed_db(dir[k], s, m, n_ctx, k, cfg, buf, tok)) == NULL)
      goto out;
  }
  uint64_t gns[2][REPS], tns[2][REPS], tbytes[2] = {0, 0};
  uint32_t pos[NPOS];
  for (int i = 0; i < NPOS; i++) /* spread over the context: one per block at 512 tokens */
    pos[i] = (uint32_t)(((uint64_t)i * s->n_tokens) / NPOS + (uint32_t)i % 7);
  for (int r = 0; r < REPS; r++)
    for (int k = 0; k < 2; k++) {
      uint64_t t0 = bench_now_ns();
      for (uint32_t c = 0; c < n_ctx; c++) {
        for (uint32_t t = 0; t < s->n_tokens; t++)
          tok[t] = 9000000u + 1000u * c + t;
        kvdb_kv_view ov;
        size_t hit = 0;
        if (kvdb_kv_view_packed(&ov, out, m, s->n_tokens, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
            kvdb_get(db[k], m, tok, s->n_tokens, &ov, &hit) != KVDB_OK || hit != s->n_tokens) {
          bench_log("layout speed: get: %s", kvdb_errmsg());
          goto out;
        }
        if (r == 0 && c == 0) { /* what was put comes back (lossy: the same from both) */
          fill_ctx(s, c, m->dtype, buf);
          if (exact && memcmp(buf, out, (size_t)s->n_tokens * tb) != 0) {
            bench_log("layout speed: the %s get is not the KV put", cfg);
            goto out;
          }
          if (k == 0)
            memcpy(first, out, (size_t)s->n_tokens * tb);
          else if (memcmp(first, out, (size_t)s->n_tokens * tb) != 0) {
            bench_log("layout speed: %s: packed and whole-page gets differ", cfg);
            goto out;
          }
        }
      }
      gns[k][r] = bench_now_ns() - t0;
      kvdb_stats s0, s1;
      if (kvdb_stat(db[k], &s0) != KVDB_OK)
        goto out;
      t0 = bench_now_ns();
      for (uint32_t c = 0; c < n_ctx; c++) {
        kvdb_key keys[256];
        for (uint32_t t = 0; t < s->n_tokens; t++)
          tok[t] = 9000000u + 1000u * c + t;
        size_t nb = (s->n_tokens + m->block_tokens - 1) / m->block_tokens;
        kvdb_kv_view tv;
        if (nb > 256 || kvdb_chain_hashes(m, tok, s->n_tokens, keys, 256) != KVDB_OK ||
            kvdb_kv_view_packed(&tv, tout, m, NPOS, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
            kvdb_get_tokens(db[k], m, &keys[nb - 1], 1, pos, NPOS, &tv) != KVDB_OK) {
          bench_log("layout speed: get_tokens: %s", kvdb_errmsg());
          goto out;
        }
        if (r == 0 && c == 0) {
          if (k == 0)
            memcpy(tfirst, tout, NPOS * tb);
          else if (memcmp(tfirst, tout, NPOS * tb) != 0) {
            bench_log("layout speed: %s: packed and whole-page get_tokens differ", cfg);
            goto out;
          }
        }
      }
      tns[k][r] = (bench_now_ns() - t0) / n_ctx;
      if (kvdb_stat(db[k], &s1) != KVDB_OK)
        goto out;
      tbytes[k] = (s1.bytes_read - s0.bytes_read) / n_ctx;
    }
  static const char *const NM[2] = {"packed", "pages"};
  double g[2], tu[2];
  /* raw keeps the names it had (layout_get_packed_gbps, ...); other configs add theirs */
  char pre[64];
  snprintf(pre, sizeof pre, "%s%s", exact && cfg[0] == 'r' ? "" : cfg,
           exact && cfg[0] == 'r' ? "" : "_");
  for (int k = 0; k < 2; k++) {
    qsort(gns[k], REPS, sizeof gns[k][0], cmp_u64);
    qsort(tns[k], REPS, sizeof tns[k][0], cmp_u64);
    g[k] = bench_gbps(logical, gns[k][REPS / 2]);
    tu[k] = (double)tns[k][REPS / 2] / 1e3;
    fprintf(o, "    %-8s %-6s get %.3f GB/s logical; get_tokens of %d positions of one layer: "
               "%llu bytes read, %.1f us per context\n",
            cfg, NM[k], g[k], NPOS, (unsigned long long)tbytes[k], tu[k]);
    char key[128];
    snprintf(key, sizeof key, "layout_get_%s%s_gbps", pre, NM[k]);
    bench_json_num(j, key, g[k]);
    snprintf(key, sizeof key, "layout_tokens_%s%s_bytes", pre, NM[k]);
    bench_json_num(j, key, (double)tbytes[k]);
    snprintf(key, sizeof key, "layout_tokens_%s%s_us", pre, NM[k]);
    bench_json_num(j, key, tu[k]);
  }
  fprintf(o, "    %-8s packed / pages: get %.3fx, get_tokens time %.3fx, bytes %.3fx\n", cfg,
          g[0] / g[1], tu[0] / tu[1], (double)tbytes[0] / (double)tbytes[1]);
  char key[128];
  snprintf(key, sizeof key, "layout_get_%spacked_vs_pages", pre);
  bench_json_num(j, key, g[0] / g[1]);
  snprintf(key, sizeof key, "layout_tokens_%spacked_vs_pages_time", pre);
  bench_json_num(j, key, tu[0] / tu[1]);
  rc = 0;
out:
  for (int k = 0; k < 2; k++) {
    kvdb_close(db[k]);
    if (!env->keep && db[k] != NULL)
      bench_rmtree(dir[k]);
  }
  free(buf);
  free(out);
  free(tout);
  free(first);
  free(tfirst);
  free(tok);
  return rc;
}

int bench_layout_set(const bench_env *env, bench_json *j, const bench_kvset *s)
{
  FILE *o = env->out;
  uint32_t n_ctx = s->n_ctx < BL_MAX_CTX ? s->n_ctx : BL_MAX_CTX;
  static const kvdb_dtype DT[2] = {KVDB_F32, KVDB_F16};
  static const uint32_t BT[2] = {16, 256};
  char k[128];
  fprintf(o, "\nbytes that follow the config (issue 16): %u stories260K contexts of %u tokens "
             "put through kvdb; stored = kvdb_context_stat bytes (block objects, 4 KiB pages), "
             "logical = tokens x %u layers x %u KV heads x 2 x head_dim %u x element bytes\n",
          n_ctx, s->n_tokens, s->n_layers, s->n_kv_heads, s->head_dim);
  fprintf(o, "  %-10s %6s", "storage", "block");
  for (int c = 0; c < BL_CONFIGS; c++)
    fprintf(o, " %10s", BL_CFG[c]);
  fprintf(o, "   (stored / logical; each row packed, then in whole-page objects)\n");
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
      /* every config again in whole-page objects (packed_block_bytes = 1: the layout of
       * formats 1-3, before packed raw (format 7) and compressed (format 9) objects) */
      double pages[BL_CONFIGS];
      {
        char pdir[4300];
        snprintf(pdir, sizeof pdir, "%s-pages", dir);
        kvdb_options popt = opt;
        popt.packed_block_bytes = 1;
        kvdb *pdb = NULL;
        if (kvdb_open(pdir, &popt, &pdb) != KVDB_OK)
          goto fail;
        for (int ci = 0; ci < BL_CONFIGS; ci++) {
          kvdb_put_opts po;
          kvdb_put_opts_init(&po);
          uint64_t stored = 0;
          for (uint32_t c = 0; c < n_ctx; c++) {
            fill_ctx(s, c, DT[di], buf);
            for (uint32_t t = 0; t < s->n_tokens; t++)
              tok[t] = 1000000u * (uint32_t)(ci + 1) + 1000u * c + t;
            kvdb_kv_view v;
            kvdb_put_info info;
            kvdb_context_info ci_;
            if (kvdb_config_parse(BL_CFG[ci], &po.config) != KVDB_OK ||
                kvdb_kv_view_packed(&v, buf, &m, s->n_tokens, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
                kvdb_put_ex(pdb, &m, tok, s->n_tokens, &v, &po, &info) != KVDB_OK ||
                kvdb_context_stat(pdb, &info.context, &ci_) != KVDB_OK) {
              kvdb_close(pdb);
              goto fail;
            }
            stored += ci_.bytes;
          }
          pages[ci] = (double)stored / ((double)n_ctx * s->n_tokens * tb);
        }
        kvdb_close(pdb);
        if (!env->keep)
          bench_rmtree(pdir);
      }
      for (int row = 0; row < 2; row++) {
        fprintf(o, "  %-10s %6u", DT[di] == KVDB_F32 ? "f32" : "f16", BT[bi]);
        for (int ci = 0; ci < BL_CONFIGS; ci++)
          fprintf(o, " %10.4f", row == 0 ? ratio[ci] : pages[ci]);
        fprintf(o, "   %s\n", row == 0 ? "packed (default)" : "whole pages (packed_block_bytes 1)");
      }
      snprintf(k, sizeof k, "layout_%s_bt%u_raw_pages_vs_logical", DT[di] == KVDB_F32 ? "f32" : "f16",
               BT[bi]);
      bench_json_num(j, k, pages[0]);
      for (int ci = 1; ci < BL_CONFIGS; ci++) {
        snprintf(k, sizeof k, "layout_%s_bt%u_%s_pages_vs_logical",
                 DT[di] == KVDB_F32 ? "f32" : "f16", BT[bi], BL_CFG[ci]);
        bench_json_num(j, k, pages[ci]);
      }
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
  kvdb_model sm = {"bench-layout-speed", s->n_layers, s->n_kv_heads, s->head_dim, KVDB_F32, 16, 0};
  fprintf(o, "  get at f32, 16-token blocks (%u contexts, %.1f MB logical, cold, no DRAM tier; "
             "median of 5, alternated; packed objects (formats 4, 5) against whole pages):\n",
          n_ctx, (double)n_ctx * s->n_tokens * kvdb_model_token_bytes(&sm) / 1e6);
  for (int ci = 0; ci < BL_CONFIGS; ci++)
    if (layout_speed(env, j, s, &sm, n_ctx, BL_CFG[ci]) != 0)
      return -1;
  return 0;
}

/* `kvdb-bench layout`: the bytes table and the packed-vs-pages speeds alone (stories260K; the
 * same figures `compress` reports), then the cold get vs raw read on synthetic KV. */
int bench_layout(const bench_env *env, bench_json *j)
{
  bench_kvset real, syn;
  char why[8192] = "";
  memset(&syn, 0, sizeof syn);
  int rr = bench_kvset_real(&real, env, env->quick ? 8u : 64u, why, sizeof why);
  if (rr != 0) {
    bench_log("layout: the real set (stories260K) is needed: %s", why);
    return -1;
  }
  int rc = bench_layout_set(env, j, &real);
  bench_kvset_free(&real);
  return rc;
}

/* O_DIRECT read of `bytes` of file fd (4 MiB requests): ns, or 0 on failure. */
static uint64_t direct_read_ns(int fd, uint8_t *buf, uint64_t bytes)
{
  uint64_t t0 = bench_now_ns();
  for (uint64_t off = 0; off < bytes; off += 4u << 20) {
    size_t n = bytes - off < (4u << 20) ? (size_t)(bytes - off) : (4u << 20);
    if (bench_pread_all(fd, buf, n, off) != 0)
      return 0;
  }
  return bench_now_ns() - t0;
}

/* The same at queue depth qd: qd threads, each reading the next `req` bytes not yet claimed
 * (requests of `req` bytes, sequential offsets, qd of them in flight: what a get that keeps
 * its reads in flight asks of the disk) into its own part of buf (qd * req bytes). */
typedef struct qd_reader {
  int fd;
  uint8_t *buf;
  uint64_t bytes, req, *next;
  int fail;
} qd_reader;

static void *qd_read(void *arg)
{
  qd_reader *r = arg;
  for (;;) {
    uint64_t off = __atomic_fetch_add(r->next, r->req, __ATOMIC_RELAXED);
    if (off >= r->bytes)
      return NULL;
    size_t n = r->bytes - off < r->req ? (size_t)(r->bytes - off) : (size_t)r->req;
    if (bench_pread_all(r->fd, r->buf, n, off) != 0) {
      r->fail = 1;
      return NULL;
    }
  }
}

enum { QD_MAX = 16 };

static uint64_t direct_read_qd_ns(int fd, uint8_t *buf, uint64_t bytes, uint64_t req, int qd)
{
  pthread_t th[QD_MAX];
  qd_reader rd[QD_MAX];
  uint64_t next = 0;
  int started = 0, fail = 0;
  uint64_t t0 = bench_now_ns();
  for (int i = 0; i < qd && i < QD_MAX; i++) {
    rd[i] = (qd_reader){fd, buf + (size_t)i * req, bytes, req, &next, 0};
    if (pthread_create(&th[i], NULL, qd_read, &rd[i]) != 0)
      break;
    started++;
  }
  for (int i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    fail |= rd[i].fail;
  }
  uint64_t t = bench_now_ns() - t0;
  return fail || started == 0 ? 0 : t;
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* CPU time of the process (every thread), ns: what a get costs whatever the machine's load. */
static uint64_t cpu_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* 1 when the comma-separated list names `name`. */
static int name_listed(const char *list, const char *name)
{
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0)
      return 1;
    p += len + (e != NULL);
  }
  return 0;
}

int bench_get_vs_read(const bench_env *env, bench_json *j, const bench_kvset *s)
{
  FILE *o = env->out;
  static const char *const CFG[4] = {"int4", "raw", "lossless", "kivi4"};
  /* KVDB_BENCH_GET_CONFIGS (e.g. "int4"): only the configs it names (perf record of one) */
  const char *only = getenv("KVDB_BENCH_GET_CONFIGS");
  enum { REPS_MAX = 101 };
  /* KVDB_BENCH_GET_REPS: gets (and reads) per config, odd, default 5 (more for perf record) */
  const char *reps_env = getenv("KVDB_BENCH_GET_REPS");
  int REPS = reps_env ? atoi(reps_env) | 1 : 5;
  if (REPS < 1 || REPS > REPS_MAX)
    REPS = 5;
  kvdb_model m = {"bench-getspeed", s->n_layers, s->n_kv_heads, s->head_dim, KVDB_F16, 256, 0};
  size_t tb = kvdb_model_token_bytes(&m), logical = (size_t)s->n_tokens * tb;
  char dir[4200], path[4300];
  snprintf(dir, sizeof dir, "%s/getspeed", env->dir);
  snprintf(path, sizeof path, "%s/getspeed-plain", env->dir);
  uint8_t *src = bench_alloc(logical), *out = bench_alloc(logical), *rbuf = bench_alloc(4u << 20);
  /* the plain read at depth: QD_N requests of QD_REQ bytes in flight, as the get reads (a
   * block's object of ~9 MB in one request, which the OS backend splits into 4 MiB pieces all
   * in flight at once: engine/io/io_os.c KV_IO_CHUNK, engine/ops/get.c) */
  enum { QD_N = 3, QD_REQ = 4u << 20 };
  uint8_t *qbuf = bench_alloc((size_t)QD_N * QD_REQ);
  uint32_t *tok = malloc(s->n_tokens * sizeof *tok);
  int rc = -1, fd = -1;
  kvdb *db = NULL;
  if (src == NULL || out == NULL || rbuf == NULL || qbuf == NULL || tok == NULL)
    goto out;
  fill_ctx(s, 0, KVDB_F16, src);
  fprintf(o, "\ncold get vs raw read (issue 16): %s KV, one context of %u tokens (%.1f MB of "
             "f16), 256-token blocks, no DRAM tier; GB/s of fp16-equivalent bytes delivered by "
             "kvdb_get over the O_DIRECT read GB/s of a plain file of the context's stored size "
             "(same directory, 4 MiB reads), median of %d\n",
          s->name, s->n_tokens, (double)logical / 1e6, REPS);
  for (int ci = 0; ci < 4; ci++) {
    if (only != NULL && !name_listed(only, CFG[ci]))
      continue;
    kvdb_options opt;
    kvdb_options_init(&opt);
    opt.dram_bytes = 0;
    opt.log_level = -1;
    bench_rmtree(dir);
    kvdb_put_opts po;
    kvdb_put_opts_init(&po);
    kvdb_kv_view v, ov;
    kvdb_put_info info;
    kvdb_context_info cinf;
    for (uint32_t t = 0; t < s->n_tokens; t++)
      tok[t] = 7000000u + 100000u * (uint32_t)ci + t;
    if (kvdb_config_parse(CFG[ci], &po.config) != KVDB_OK || kvdb_open(dir, &opt, &db) != KVDB_OK ||
        kvdb_kv_view_packed(&v, src, &m, s->n_tokens, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
        kvdb_kv_view_packed(&ov, out, &m, s->n_tokens, KVDB_LAYOUT_LKTHD) != KVDB_OK ||
        kvdb_put_ex(db, &m, tok, s->n_tokens, &v, &po, &info) != KVDB_OK ||
        kvdb_context_stat(db, &info.context, &cinf) != KVDB_OK) {
      bench_log("get vs read: %s: %s", CFG[ci], kvdb_errmsg());
      goto out;
    }
    kvdb_close(db);
    db = NULL;
    /* the plain file: the context's stored bytes */
    uint64_t stored = (cinf.bytes + 4095) & ~(uint64_t)4095;
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0)
      goto out;
    memset(rbuf, 0x5a, 4u << 20);
    for (uint64_t off = 0; off < stored; off += 4u << 20)
      if (bench_pwrite_all(fd, rbuf, stored - off < (4u << 20) ? stored - off : (4u << 20), off) !=
          0)
        goto out;
    if (fdatasync(fd) != 0)
      goto out;
    close(fd);
    fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    int direct = fd >= 0;
    if (fd < 0)
      fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || kvdb_open(dir, &opt, &db) != KVDB_OK)
      goto out;
    uint64_t gns[REPS_MAX], rns[REPS_MAX], cns[REPS_MAX], qns[REPS_MAX];
    for (int r = 0; r < REPS; r++) {
      size_t hit = 0;
      uint64_t c0 = cpu_ns();
      uint64_t t0 = bench_now_ns();
      if (kvdb_get(db, &m, tok, s->n_tokens, &ov, &hit) != KVDB_OK || hit != s->n_tokens) {
        bench_log("get vs read: get of %s hit %zu of %u: %s", CFG[ci], hit, s->n_tokens,
                  kvdb_errmsg());
        goto out;
      }
      gns[r] = bench_now_ns() - t0;
      cns[r] = cpu_ns() - c0;
      if ((rns[r] = direct_read_ns(fd, rbuf, stored)) == 0 ||
          (qns[r] = direct_read_qd_ns(fd, qbuf, stored, QD_REQ, QD_N)) == 0)
        goto out;
    }
    if (ci == 1 && memcmp(out, src, logical) != 0) {
      bench_log("get vs read: the raw get is not the KV put");
      goto out;
    }
    kvdb_close(db);
    db = NULL;
    close(fd);
    fd = -1;
    qsort(gns, REPS, sizeof gns[0], cmp_u64);
    qsort(rns, REPS, sizeof rns[0], cmp_u64);
    qsort(cns, REPS, sizeof cns[0], cmp_u64);
    qsort(qns, REPS, sizeof qns[0], cmp_u64);
    double cpu = bench_gbps(logical, cns[REPS / 2]);
    double g = bench_gbps(logical, gns[REPS / 2]), rd1 = bench_gbps(stored, rns[REPS / 2]);
    double rdq = bench_gbps(stored, qns[REPS / 2]);
    double rd = rd1 > rdq ? rd1 : rdq; /* the ratio is over the faster plain read */
    fprintf(o, "  %-9s stored %.4f of logical: get %.3f GB/s logical, plain read %.3f GB/s%s "
               "(4 MiB at depth 1: %.3f, 4 MiB at depth %d: %.3f): %.3fx; get per CPU second "
               "(all threads) %.3f GB/s logical\n",
            CFG[ci], (double)cinf.bytes / (double)logical, g, rd,
            direct ? "" : " (page cache: O_DIRECT refused)", rd1, (int)QD_N, rdq, g / rd, cpu);
    char k[96];
    snprintf(k, sizeof k, "%s_logical_get_vs_raw_read", CFG[ci]);
    bench_json_num(j, k, g / rd);
    snprintf(k, sizeof k, "%s_get_logical_gbps", CFG[ci]);
    bench_json_num(j, k, g);
    snprintf(k, sizeof k, "%s_get_cpu_gbps", CFG[ci]);
    bench_json_num(j, k, cpu);
    if (ci == 0 || (only != NULL && !name_listed(only, "int4")))
      bench_json_num(j, "get_raw_read_gbps", rd);
    if (ci == 0 || (only != NULL && !name_listed(only, "int4"))) {
      bench_json_num(j, "get_raw_read_qd1_gbps", rd1);
      bench_json_num(j, "get_raw_read_qdN_gbps", rdq);
    }
  }
  rc = 0;
out:
  if (rc != 0)
    bench_log("get vs read failed (%s)", strerror(errno));
  if (db != NULL)
    kvdb_close(db);
  if (fd >= 0)
    close(fd);
  if (!env->keep) {
    bench_rmtree(dir);
    unlink(path);
  }
  bench_free(src);
  bench_free(out);
  bench_free(rbuf);
  bench_free(qbuf);
  free(tok);
  return rc;
}
