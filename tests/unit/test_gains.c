/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_gains.c — a model's output-projection gains (kvdb_model_set_output_gains,
 * issue 16, helper wt-wo16) through the public API: bad inputs refused with a message; set,
 * read back, replace, remove; the model record's version 4 (with and without a calibration)
 * decoded bit for bit; the profile of a model with gains reports the output-weighted quality
 * as `quality`, equal to a direct computation here (causal attention in double, compress/'s
 * formula), and the per-head cosine and worst head beside it; a second process sees the gains
 * and the profile; damaged gains are KVDB_CORRUPT for kvdb_model_output_gains, kvdb_verify and
 * a profiled put (never a wrong quality), while plain puts and reads go on. (test `gains`)
 */
#include "kvdb_test.h"

#include <math.h>
#include <sys/wait.h>

#include "cat_edit.h" /* white-box: records, and damage through LMDB */
#include "codec.h"

static const kvdb_model M = {"test-gains", 2, 2, 8, KVDB_F16, 16, 0, 0.0f, 0};
enum { N = 48, QH = 4, NP = 6, LQ = 2 * QH };

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.log_level = -1;
  return o;
}

static size_t at(uint32_t l, uint32_t kv, size_t t, uint32_t h, uint32_t d)
{
  return ((((size_t)l * 2 + kv) * N + t) * M.n_kv_heads + h) * M.head_dim + d;
}

static uint16_t *make_kv(uint64_t seed)
{
  uint16_t *b = malloc(N * kvdb_model_token_bytes(&M));
  ASSERT(b != NULL);
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < N; t++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++) {
            double u = (double)(t_rand(&seed) % 20000) / 10000.0 - 1.0;
            /* heads of unequal loudness: layer 1's head 1 is quiet */
            double sc = (kv && l == 1 && h == 1 ? 0.05 : 1.0) * (1.0 + (d % 3));
            b[at(l, kv, t, h, d)] = kv_codec_f32_to_f16((float)(u * sc));
          }
  return b;
}

static const uint32_t PPOS[NP] = {3, 10, 20, 30, 40, 47};
static float g_q[NP * LQ * 8]; /* [probe][layer][q head][dim] */
static float g_gain_ch[LQ * 8], g_gain_h[LQ];

static void make_inputs(void)
{
  uint64_t s = 77;
  for (size_t i = 0; i < sizeof g_q / sizeof g_q[0]; i++)
    g_q[i] = (float)((double)(t_rand(&s) % 20000) / 5000.0 - 2.0);
  for (uint32_t i = 0; i < LQ * 8; i++) /* query head 3 of each layer weighs 20x */
    g_gain_ch[i] = (float)(0.1 + (double)(t_rand(&s) % 1000) / 1000.0) *
                   ((i / 8) % QH == 3 ? 20.0f : 1.0f);
  for (uint32_t i = 0; i < LQ; i++) {
    double m = 0;
    for (uint32_t c = 0; c < 8; c++)
      m += g_gain_ch[i * 8 + c];
    g_gain_h[i] = (float)(m / 8);
  }
}

static uint32_t g_put_flags;
static const char *g_space = "int8,kivi2,int4";

static kvdb_status put_cfg(kvdb *db, const uint32_t *tok, const uint16_t *buf, const char *cfg,
                           uint32_t n_q_heads)
{
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.flags = g_put_flags;
  ASSERT_OK(kvdb_config_parse(cfg, &po.config));
  if (g_put_flags & KVDB_PUT_PROFILE) {
    po.probe_queries = g_q;
    po.probe_positions = PPOS;
    po.n_probe_queries = NP;
    po.n_q_heads = n_q_heads;
    po.profile_space = g_space;
    po.profile_heads = M.n_layers * M.n_kv_heads;
  }
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, (void *)buf, &M, N, KVDB_LAYOUT_LKTHD));
  return kvdb_put_ex(db, &M, tok, N, &v, &po, NULL);
}

/* Causal attention of probe i's query head j over rows 0..PPOS[i] of K, V (layer l, KV head
 * h) in kv (LKTHD f16), in double: out[d]. */
static void attend(const uint16_t *kv, uint32_t l, uint32_t h, uint32_t i, uint32_t j, double *out)
{
  const uint32_t d = M.head_dim;
  const float *q = g_q + (((size_t)i * M.n_layers + l) * QH + h * (QH / M.n_kv_heads) + j) * d;
  double w[N], mx = -INFINITY, sum = 0;
  for (uint32_t t = 0; t <= PPOS[i]; t++) {
    double s = 0;
    for (uint32_t c = 0; c < d; c++) {
      float k;
      kv_codec_to_f32(KV_CODEC_F16, &kv[at(l, 0, t, h, c)], 1, &k);
      s += (double)q[c] * k;
    }
    w[t] = s / sqrt((double)d);
    mx = w[t] > mx ? w[t] : mx;
  }
  for (uint32_t t = 0; t <= PPOS[i]; t++)
    sum += (w[t] = exp(w[t] - mx));
  for (uint32_t c = 0; c < d; c++)
    out[c] = 0;
  for (uint32_t t = 0; t <= PPOS[i]; t++)
    for (uint32_t c = 0; c < d; c++) {
      float v;
      kv_codec_to_f32(KV_CODEC_F16, &kv[at(l, 1, t, h, c)], 1, &v);
      out[c] += w[t] / sum * v;
    }
}

/* The output-weighted quality (gains ch: 1 or head_dim), the mean per-head cosine and the worst
 * head's, of decoded KV `dec` against `ref`, computed directly. */
static void direct(const uint16_t *ref, const uint16_t *dec, const float *gains, uint32_t ch,
                   double *q, double *cosine, double *worst)
{
  const uint32_t d = M.head_dim, grp = QH / M.n_kv_heads;
  double rsum = 0, csum = 0;
  *worst = 1;
  for (uint32_t l = 0; l < M.n_layers; l++) {
    double e[NP] = {0}, r[NP] = {0};
    for (uint32_t h = 0; h < M.n_kv_heads; h++) {
      double hc = 0;
      for (uint32_t i = 0; i < NP; i++)
        for (uint32_t j = 0; j < grp; j++) {
          double a[8], b[8], ab = 0, aa = 0, bb = 0;
          attend(ref, l, h, i, j, a);
          attend(dec, l, h, i, j, b);
          const float *g = gains + ((size_t)l * QH + h * grp + j) * ch;
          for (uint32_t c = 0; c < d; c++) {
            double gc = ch == 1 ? g[0] : g[c];
            e[i] += gc * (a[c] - b[c]) * (a[c] - b[c]);
            r[i] += gc * a[c] * a[c];
            ab += a[c] * b[c];
            aa += a[c] * a[c];
            bb += b[c] * b[c];
          }
          hc += aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : (aa == 0 && bb == 0 ? 1 : 0);
        }
      hc /= NP * grp;
      csum += hc;
      *worst = hc < *worst ? hc : *worst;
    }
    double se = 0, sr = 0;
    for (uint32_t i = 0; i < NP; i++) {
      se += sqrt(e[i]);
      sr += sqrt(r[i]);
    }
    rsum += se / sr;
  }
  double rm = rsum / M.n_layers;
  *q = fmax(0.0, 1.0 - rm * rm / 2);
  *cosine = csum / (M.n_layers * M.n_kv_heads);
}

static const kvdb_profile_entry *entry(const kvdb_profile_entry *e, size_t n, const char *name)
{
  for (size_t i = 0; i < n; i++) {
    char b[64];
    kvdb_config_name(&e[i].config, b, sizeof b);
    if (strcmp(b, name) == 0)
      return &e[i];
  }
  ASSERT(!"config not in the profile");
  return NULL;
}

/* the KV a put in config cfg returns, from a scratch database */
static uint16_t *decoded(const uint32_t *tok, const uint16_t *kv, const char *cfg)
{
  char *dir = t_tmpdir("gains-dec");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t f = g_put_flags;
  g_put_flags = 0;
  ASSERT_OK(put_cfg(db, tok, kv, cfg, QH));
  g_put_flags = f;
  uint16_t *out = malloc(N * kvdb_model_token_bytes(&M));
  ASSERT(out != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, &M, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT_EQ(hit, (size_t)N);
  kvdb_close(db);
  t_rmdir(dir);
  return out;
}

static void bad_inputs(kvdb *db)
{
  float g[LQ * 8];
  memcpy(g, g_gain_ch, sizeof g);
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(NULL, &M, g, QH, 1));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, NULL, g, QH, 1));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, NULL, QH, 1));
  ASSERT_MSG_HAS("NULL");
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, g, 3, 1));
  ASSERT_MSG_HAS("multiple");
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, g, 0, 1));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, g, QH, 5));
  ASSERT_MSG_HAS("channels");
  g[9] = NAN;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, g, QH, 8));
  ASSERT_MSG_HAS("finite");
  g[9] = -0.5f;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, g, QH, 8));
  g[9] = 1.0f;
  g[3] = INFINITY;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &M, g, QH, 1));
  kvdb_model wrong = M;
  wrong.head_dim = 0;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_set_output_gains(db, &wrong, g_gain_h, QH, 1));
  size_t n;
  uint32_t q, ch;
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_model_output_gains(db, "no-such-model", NULL, 0, &n, &q, &ch));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_output_gains(db, M.id, NULL, 4, &n, &q, &ch));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_output_gains(db, M.id, NULL, 0, NULL, &q, &ch));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_output_gains(db, NULL, NULL, 0, &n, &q, &ch));
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_model_output_gains(db, M.id, NULL, 0, &n, &q, &ch));
}

/* version 4 records: decode what encode wrote, bit for bit, with and without a calibration;
 * records of versions 1-3 carry no gains */
static void records(void)
{
  kv_model_rec r = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .dtype = KVDB_F16,
                    .block_tokens = 16, .rope_base = 10000.0f, .rope_style = KVDB_ROPE_HALF};
  for (int i = 0; i < 16; i++)
    r.hash[i] = (uint8_t)(i * 7);
  kv_model_gains g = {2, QH, 8, g_gain_ch}, none = {0, 0, 0, NULL}, got;
  float w[2 * 2 * 8];
  kv_calib_opt plan[4] = {{4, 4, 128, 128}, {3, 5, 64, 256}, {4, 4, 128, 128}, {2, 6, 32, 32}};
  for (int i = 0; i < 32; i++)
    w[i] = 0.5f + (float)i;
  kv_calib cal;
  memset(&cal, 0, sizeof cal);
  cal.n_layers = 2;
  cal.n_heads = 2;
  cal.head_dim = 8;
  cal.n_contexts = 3;
  cal.n_probes = 17;
  cal.weight = w;
  cal.plan[0] = plan;
  cal.budget[0] = 4.5f;
  for (int with_cal = 0; with_cal < 2; with_cal++)
    for (int rope = 0; rope < 2; rope++) {
      kv_model_rec rr = r;
      if (!rope)
        rr.rope_base = 0.0f, rr.rope_style = 0;
      const kv_calib *c = with_cal ? &cal : NULL;
      size_t n = kv_model_rec_full_size(&rr, c, &g);
      ASSERT_EQ(n, (with_cal ? kv_model_rec_calib_size(&rr, &cal) : 44) + 16 + 4 * 64 + 8);
      uint8_t *b = malloc(n), *b2 = malloc(n);
      ASSERT(b && b2);
      kv_model_rec_encode_full(&rr, c, &g, b);
      ASSERT_EQ(b[0], 4);
      kv_model_rec d;
      ASSERT_OK(kv_model_rec_decode(b, n, &d));
      ASSERT(d.n_layers == 2 && d.head_dim == 8 && d.rope_style == rr.rope_style &&
             d.rope_base == rr.rope_base && d.gains_bytes == 16 + 4 * 64 + 8 &&
             memcmp(d.hash, r.hash, 16) == 0);
      ASSERT_OK(kv_model_gains_decode(b, n, &got));
      ASSERT(got.n_q_heads == QH && got.channels == 8 && got.n_layers == 2 &&
             memcmp(got.g, g_gain_ch, sizeof g_gain_ch) == 0);
      kv_calib dc;
      ASSERT_OK(kv_model_calib_decode(b, n, &dc));
      ASSERT(with_cal ? dc.weight != NULL && dc.weight[5] == w[5] && dc.plan[0][1].vg == 256 &&
                            dc.n_probes == 17
                      : dc.weight == NULL);
      /* a rewrite of what was decoded is the same bytes */
      d.gains_bytes = d.calib_bytes = 0;
      kv_model_rec_encode_full(&d, with_cal ? &dc : NULL, &got, b2);
      ASSERT(memcmp(b, b2, n) == 0);
      kv_calib_free(&dc);
      /* any flipped byte of the gains block is refused by the gains' checksum, not the
       * calibration's, and the other way round */
      size_t gat = n - (16 + 4 * 64 + 8);
      b[gat + 20] ^= 1;
      kv_model_gains_free(&got);
      ASSERT_STATUS(KVDB_CORRUPT, kv_model_gains_decode(b, n, &got));
      ASSERT_MSG_HAS("checksum");
      ASSERT_OK(kv_model_calib_decode(b, n, &dc));
      kv_calib_free(&dc);
      b[gat + 20] ^= 1;
      if (with_cal) {
        b[60] ^= 1;
        ASSERT_STATUS(KVDB_CORRUPT, kv_model_calib_decode(b, n, &dc));
        ASSERT_OK(kv_model_gains_decode(b, n, &got));
        kv_model_gains_free(&got);
        b[60] ^= 1;
      }
      for (size_t cut = 36; cut < n; cut += 13) /* truncated: refused */
        ASSERT(kv_model_rec_decode(b, cut, &d) != KVDB_OK);
      free(b);
      free(b2);
      /* without gains: the versions before (1 or 2, 3 with a calibration) */
      n = kv_model_rec_full_size(&rr, c, &none);
      b = malloc(n);
      kv_model_rec_encode_full(&rr, c, &none, b);
      ASSERT_EQ(b[0], with_cal ? 3 : rope ? 2 : 1);
      ASSERT_EQ(n, with_cal ? kv_model_rec_calib_size(&rr, &cal) : kv_model_rec_size(&rr));
      ASSERT_OK(kv_model_gains_decode(b, n, &got));
      ASSERT(got.g == NULL);
      free(b);
    }
}

static void flip_gains(uint8_t *rec, size_t *len)
{
  ASSERT(*len == 100 && rec[0] == 4);
  rec[*len - 20] ^= 0x40; /* a byte of the last gains */
}

static void damage_gains(const char *dir)
{
  t_cat_edit(dir, T_CAT_MODELS, M.id, strlen(M.id), flip_gains);
}

static char g_problem[512];

static void on_problem(void *ctx, const kvdb_problem *p)
{
  (void)ctx;
  snprintf(g_problem, sizeof g_problem, "%s", p->message);
}

int main(void)
{
  make_inputs();
  records();
  char *dir = t_tmpdir("gains");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  bad_inputs(db);

  /* set (the model recorded now), read back, replace, remove, set again */
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_ch, QH, M.head_dim));
  float back[LQ * 8];
  size_t n;
  uint32_t q, ch;
  ASSERT_OK(kvdb_model_output_gains(db, M.id, back, 5, &n, &q, &ch)); /* cap below: a prefix */
  ASSERT(n == LQ * 8 && q == QH && ch == 8 && memcmp(back, g_gain_ch, 5 * sizeof(float)) == 0);
  ASSERT_OK(kvdb_model_output_gains(db, M.id, back, LQ * 8, &n, &q, &ch));
  ASSERT(memcmp(back, g_gain_ch, sizeof g_gain_ch) == 0);
  kvdb_model mg;
  ASSERT_OK(kvdb_model_get(db, M.id, &mg));
  ASSERT(mg.n_layers == M.n_layers && mg.head_dim == M.head_dim);
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, NULL, 0, 0));
  ASSERT_OK(kvdb_model_output_gains(db, M.id, NULL, 0, &n, &q, &ch));
  ASSERT(n == 0 && q == 0 && ch == 0);
  kvdb_model other = M; /* another fingerprint under the same id */
  other.block_tokens = 32;
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_model_set_output_gains(db, &other, g_gain_h, QH, 1));
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_h, QH, 1));
  ASSERT_OK(kvdb_model_output_gains(db, M.id, back, LQ, &n, &q, &ch));
  ASSERT(n == LQ && q == QH && ch == 1 && memcmp(back, g_gain_h, sizeof g_gain_h) == 0);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));

  /* a profiled put: `quality` is the output-weighted quality, computed here directly */
  uint32_t tok[N], tok2[N];
  for (uint32_t i = 0; i < N; i++)
    tok[i] = 500 + i, tok2[i] = 9000 + i;
  uint16_t *kv = make_kv(5), *kv2 = make_kv(6);
  g_put_flags = KVDB_PUT_PROFILE;
  ASSERT_STATUS(KVDB_INVALID, put_cfg(db, tok, kv, "raw", 2)); /* gains for 4 query heads */
  ASSERT_MSG_HAS("query heads");
  ASSERT_OK(put_cfg(db, tok, kv, "raw", QH));
  kvdb_key hs[3];
  ASSERT_OK(kvdb_chain_hashes(&M, tok, N, hs, 3));
  kvdb_profile_entry e[16];
  ASSERT_OK(kvdb_profile_get(db, &hs[2], e, 16, &n));
  static const char *const cfgs[] = {"int8", "kivi2", "int4"};
  double qw[3];
  for (int i = 0; i < 3; i++) {
    const kvdb_profile_entry *pe = entry(e, n, cfgs[i]);
    uint16_t *dec = decoded(tok, kv, cfgs[i]);
    double dq, dc, dw;
    direct(kv, dec, g_gain_h, 1, &dq, &dc, &dw);
    free(dec);
    ASSERT(pe->flags & KVDB_PROFILE_WEIGHTED);
    ASSERT(fabs(pe->quality - dq) < 2e-6 && fabs(pe->cosine - dc) < 2e-6 &&
           fabs(pe->worst_head - dw) < 2e-6);
    ASSERT(pe->worst_head <= pe->cosine && pe->quality < 1.0);
    qw[i] = pe->quality;
  }
  ASSERT(qw[0] > qw[2] && qw[2] > qw[1]); /* int8 > int4 > kivi2 */
  const kvdb_profile_entry *raw = entry(e, n, "raw");
  ASSERT(raw->quality == 1.0 && raw->cosine == 1.0); /* the stored config, added unmeasured */

  /* per-channel gains: the same computation with a gain per channel */
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_ch, QH, M.head_dim));
  g_space = "kivi2";
  ASSERT_OK(put_cfg(db, tok2, kv2, "raw", QH));
  kvdb_key hs2[3];
  ASSERT_OK(kvdb_chain_hashes(&M, tok2, N, hs2, 3));
  kvdb_profile_entry e2[8];
  ASSERT_OK(kvdb_profile_get(db, &hs2[2], e2, 8, &n));
  {
    uint16_t *dec = decoded(tok2, kv2, "kivi2");
    double dq, dc, dw;
    direct(kv2, dec, g_gain_ch, 8, &dq, &dc, &dw);
    free(dec);
    const kvdb_profile_entry *pe = entry(e2, n, "kivi2");
    ASSERT(fabs(pe->quality - dq) < 2e-6 && fabs(pe->cosine - dc) < 2e-6);
  }
  /* kvdb_profile (on demand) weighs the same way */
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_h, QH, 1));
  g_space = "int8,kivi2,int4";
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.probe_queries = g_q;
  po.probe_positions = PPOS;
  po.n_probe_queries = NP;
  po.n_q_heads = QH;
  po.profile_space = "kivi2";
  po.profile_heads = M.n_layers * M.n_kv_heads;
  ASSERT_OK(kvdb_profile(db, &M, &hs[2], &po));
  ASSERT_OK(kvdb_profile_get(db, &hs[2], e, 16, &n));
  ASSERT(fabs(entry(e, n, "kivi2")->quality - qw[1]) < 1e-12);
  kvdb_close(db);

  /* a second process: the gains and the weighted profile persist */
  pid_t pid = fork();
  if (pid == 0) {
    kvdb *db2;
    kvdb_options o2 = opts();
    if (kvdb_open(dir, &o2, &db2) != KVDB_OK)
      _exit(1);
    float b2[LQ];
    size_t n2;
    uint32_t q2, c2;
    if (kvdb_model_output_gains(db2, M.id, b2, LQ, &n2, &q2, &c2) != KVDB_OK || n2 != LQ ||
        q2 != QH || c2 != 1 || memcmp(b2, g_gain_h, sizeof b2) != 0)
      _exit(2);
    kvdb_profile_entry pe[16];
    if (kvdb_profile_get(db2, &hs[2], pe, 16, &n2) != KVDB_OK)
      _exit(3);
    for (size_t i = 0; i < n2; i++) {
      char nm[64];
      kvdb_config_name(&pe[i].config, nm, sizeof nm);
      if (strcmp(nm, "int8") == 0 &&
          (!(pe[i].flags & KVDB_PROFILE_WEIGHTED) || pe[i].quality != qw[0] ||
           !(pe[i].worst_head <= pe[i].cosine)))
        _exit(4);
    }
    kvdb_close(db2);
    _exit(0);
  }
  int status;
  ASSERT(waitpid(pid, &status, 0) == pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* without gains: quality is the cosine, unflagged, no worst head */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, NULL, 0, 0));
  po.profile_space = "int8,kivi2,int4";
  ASSERT_OK(kvdb_profile(db, &M, &hs[2], &po));
  ASSERT_OK(kvdb_profile_get(db, &hs[2], e, 16, &n));
  for (int i = 0; i < 3; i++) {
    const kvdb_profile_entry *pe = entry(e, n, cfgs[i]);
    ASSERT(!(pe->flags & KVDB_PROFILE_WEIGHTED) && pe->quality == pe->cosine &&
           isnan(pe->worst_head) && pe->quality != qw[i]);
  }
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_h, QH, 1));
  kvdb_close(db);

  /* damaged gains: KVDB_CORRUPT where they are needed, never a wrong quality; reads go on */
  damage_gains(dir);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_model_output_gains(db, M.id, back, LQ, &n, &q, &ch));
  ASSERT_MSG_HAS("checksum");
  kvdb_verify_report vr;
  g_problem[0] = 0;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, on_problem, NULL, NULL, &vr));
  ASSERT(vr.problems == 1 && strstr(g_problem, "model 'test-gains': its output gains") != NULL);
  uint32_t tok3[N];
  for (uint32_t i = 0; i < N; i++)
    tok3[i] = 20000 + i;
  ASSERT_STATUS(KVDB_CORRUPT, put_cfg(db, tok3, kv, "raw", QH));
  ASSERT_MSG_HAS("output gains");
  size_t hit = 1;
  ASSERT_OK(kvdb_lookup(db, &M, tok3, N, &hit));
  ASSERT_EQ(hit, 0); /* nothing of the refused put */
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_profile(db, &M, &hs[2], &po));
  g_put_flags = 0; /* a put without a profile, and reads, go on */
  ASSERT_OK(put_cfg(db, tok3, kv, "int8", QH));
  uint16_t *got = malloc(N * kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, got, &M, N, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, &M, tok, N, &v, &hit));
  ASSERT(hit == N && memcmp(got, kv, N * kvdb_model_token_bytes(&M)) == 0);
  /* setting them again repairs the record */
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_h, QH, 1));
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  g_put_flags = KVDB_PUT_PROFILE;
  ASSERT_OK(put_cfg(db, tok3, kv, "raw", QH));
  kvdb_close(db);

  /* read-only: refused */
  kvdb_options ro = opts();
  ro.flags |= KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(dir, &ro, &db));
  ASSERT_STATUS(KVDB_READONLY, kvdb_model_set_output_gains(db, &M, g_gain_h, QH, 1));
  ASSERT_OK(kvdb_model_output_gains(db, M.id, back, LQ, &n, &q, &ch));
  kvdb_close(db);
  t_rmdir(dir);

  /* a calibration and the gains keep each other (model record version 4 with both) */
  dir = t_tmpdir("gains-calib");
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_ch, QH, M.head_dim));
  kvdb_kv_view cv;
  ASSERT_OK(kvdb_kv_view_packed(&cv, kv2, &M, N, KVDB_LAYOUT_LKTHD));
  kvdb_calib_context cc = {&cv, N, g_q, PPOS, NP};
  kvdb_calib_opts co;
  kvdb_calib_opts_init(&co);
  co.flags = KVDB_CALIB_INT4;
  co.n_q_heads = QH;
  ASSERT_OK(kvdb_model_calibrate(db, &M, &cc, 1, &co));
  kvdb_calib_info ci;
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT(ci.calibrated == 1 && ci.flags == KVDB_CALIB_INT4);
  ASSERT_OK(kvdb_model_output_gains(db, M.id, back, LQ * 8, &n, &q, &ch));
  ASSERT(n == LQ * 8 && ch == 8 && memcmp(back, g_gain_ch, sizeof g_gain_ch) == 0);
  ASSERT_OK(kvdb_model_set_output_gains(db, &M, g_gain_h, QH, 1));
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT(ci.calibrated == 1 && ci.flags == KVDB_CALIB_INT4);
  ASSERT_OK(kvdb_model_output_gains(db, M.id, back, LQ, &n, &q, &ch));
  ASSERT(n == LQ && ch == 1 && memcmp(back, g_gain_h, sizeof g_gain_h) == 0);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  g_space = "int4"; /* a profiled int4 put of the calibrated model with gains */
  ASSERT_OK(put_cfg(db, tok, kv, "int4", QH));
  kvdb_close(db);
  t_rmdir(dir);
  free(got);
  free(kv);
  free(kv2);
  return 0;
}
