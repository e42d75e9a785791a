/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_calib.c — a model's calibration of int4 and int2 (kvdb_model_calibrate,
 * issue 16) through the public API: bad inputs refused with a message; calibrate, then int4 and
 * int2 puts (and a re-encode) return exactly what the codec decodes with the calibration's
 * section parameters (compress/calib.c, computed here from the same inputs); contexts stored
 * before the calibration read back bit for bit; a second process sees the calibration; a damaged
 * calibration is KVDB_CORRUPT for the writers that need it, never wrong KV, and reads go on.
 * (test `calib`)
 */
#include "kvdb_test.h"

#include <math.h>
#include <sys/wait.h>

#include "cat_edit.h" /* white-box: damage the model record through LMDB */
#include "codec.h"
#include "ops/ops_int.h" /* kv_calib_block_reserve */

/* 2 full blocks of 64 tokens and a partial one of 32 per context; K before RoPE */
static const kvdb_model M = {"test-calib", 2, 2, 16, KVDB_F16, 64, 0, 10000.0f,
                             KVDB_ROPE_ADJACENT};
/* the same KV shape in blocks of 256 tokens: the plan's groups of 256 and 128 tokens stored */
static const kvdb_model M256 = {"test-calib", 2, 2, 16, KVDB_F16, 256, 0, 10000.0f,
                                KVDB_ROPE_ADJACENT};
static const kvdb_model *g_m = &M; /* the model the puts, gets and expected() use */
enum { N = 160, NCAL = 3, NCT = 128, QH = 4, N2 = 600 };

static kvdb_options opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.log_level = -1;
  return o;
}

static size_t at(uint32_t l, uint32_t kv, size_t t, uint32_t h, uint32_t d, size_t n)
{
  return ((((size_t)l * 2 + kv) * n + t) * M.n_kv_heads + h) * M.head_dim + d;
}

/* KV with per-channel structure (wide and narrow channels, offsets), LKTHD f16 */
static uint16_t *make_kv(size_t n, uint64_t seed)
{
  uint16_t *b = malloc(n * kvdb_model_token_bytes(&M));
  ASSERT(b != NULL);
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++) {
            uint64_t s = seed * 1000003u + t * 97 + l * 131 + kv * 7 + h * 17 + d;
            double u = (double)(t_rand(&s) % 20000) / 10000.0 - 1.0;
            double sc = kv ? 0.3 + 0.2 * (d % 3) : 0.5 + (d % 7 == 0 ? 5.0 : 0.0) + (d % 4);
            b[at(l, kv, t, h, d, n)] =
                kv_codec_f32_to_f16((float)(u * sc + (kv ? 0.0 : 0.2 * (d % 3)) + 0.01 * h));
          }
  return b;
}

/* queries of every position: channels of uneven size, so K's weights matter */
static float *make_q(size_t n, uint64_t seed)
{
  size_t per = (size_t)M.n_layers * QH * M.head_dim;
  float *q = malloc(n * per * sizeof *q);
  ASSERT(q != NULL);
  for (size_t i = 0; i < n * per; i++) {
    uint64_t s = seed * 7919u + i;
    uint32_t d = (uint32_t)(i % M.head_dim);
    q[i] = (float)(((double)(t_rand(&s) % 20000) / 10000.0 - 1.0) * (d < 4 ? 3.0 : 0.4));
  }
  return q;
}

static void tokens(uint32_t *t, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(t_rand(&seed) % 30000);
}

/* the calibration inputs */
static uint16_t *cal_kv[NCAL];
static float *cal_q[NCAL];
static uint32_t cal_pos[NCT];
static kvdb_kv_view cal_view[NCAL];
static kvdb_calib_context cal_ctx[NCAL];

static void make_cal(void)
{
  for (uint32_t i = 0; i < NCT; i++)
    cal_pos[i] = i;
  for (int c = 0; c < NCAL; c++) {
    cal_kv[c] = make_kv(NCT, 100 + (uint64_t)c);
    cal_q[c] = make_q(NCT, 200 + (uint64_t)c);
    ASSERT_OK(kvdb_kv_view_packed(&cal_view[c], cal_kv[c], &M, NCT, KVDB_LAYOUT_LKTHD));
    cal_ctx[c] = (kvdb_calib_context){&cal_view[c], NCT, cal_q[c], cal_pos, NCT};
  }
}

/* The same calibration the engine computes, from the same inputs (compress/calib.c). */
static int cal_head(void *user, uint32_t c, uint32_t l, uint32_t h, void *k, void *v)
{
  (void)user;
  for (uint32_t t = 0; t < NCT; t++) {
    memcpy((uint16_t *)k + (size_t)t * M.head_dim, cal_kv[c] + at(l, 0, t, h, 0, NCT),
           M.head_dim * 2);
    memcpy((uint16_t *)v + (size_t)t * M.head_dim, cal_kv[c] + at(l, 1, t, h, 0, NCT),
           M.head_dim * 2);
  }
  return 0;
}

static void reference_calib(kvdb *db, const kvdb_model *m, kv_calib *out, uint32_t block)
{
  uint32_t nt[NCAL], nq[NCAL];
  const float *q[NCAL];
  const uint32_t *qp[NCAL];
  for (int c = 0; c < NCAL; c++) {
    nt[c] = nq[c] = NCT;
    q[c] = cal_q[c];
    qp[c] = cal_pos;
  }
  kv_calib_input in = {.n_layers = M.n_layers, .n_heads = M.n_kv_heads, .head_dim = M.head_dim,
                       .n_q_heads = QH, .dtype = KV_CODEC_F16, .rope_base = M.rope_base,
                       .rope_style = KV_ROPE_ADJACENT, .n_contexts = NCAL, .n_tokens = nt,
                       .q = q, .q_pos = qp, .n_q = nq, .head = cal_head, .plans = 3,
                       .block = block};
  for (int p = 0; p < KV_CALIB_N_PLANS; p++) /* the sections' share of the default budgets */
    if (block != 0)
      in.budget[p] = (p ? 2.5f : 4.5f) -
                     (float)kv_calib_block_reserve(db, m, block, nt, NCAL, p ? 2.5 : 4.5);
  ASSERT(kv_calib_run(&in, out, NULL) == KV_CODEC_OK);
  ASSERT(out->plan[0] != NULL && out->plan[1] != NULL);
}

/* What a get of src (n tokens) stored with cfg returns: each section coded with the engine's
 * parameters (kvquant, groups of min(128, block), K before RoPE from the block's first token),
 * then the calibration's (cal NULL: none). */
static size_t g_sec_bytes; /* the coded sections' bytes of the last expected() */

static void expected(const uint16_t *src, size_t n, const char *cfg, const kv_calib *cal,
                     uint16_t *exp)
{
  g_sec_bytes = 0;
  kvdb_config cf;
  ASSERT_OK(kvdb_config_parse(cfg, &cf));
  const kv_codec *c = kv_codec_by_id(KV_CODEC_ID_KVQUANT);
  static uint16_t rows[256 * 16], dec[256 * 16];
  static uint8_t enc[1 << 16], scratch[1 << 20];
  uint32_t bt = g_m->block_tokens;
  for (size_t b0 = 0; b0 < n; b0 += bt) {
    uint32_t nt = (uint32_t)(b0 + bt <= n ? bt : n - b0);
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t h = 0; h < M.n_kv_heads; h++)
        for (uint32_t kv = 0; kv < 2; kv++) {
          for (uint32_t t = 0; t < nt; t++)
            memcpy(rows + t * M.head_dim, src + at(l, kv, b0 + t, h, 0, n), M.head_dim * 2);
          kv_section_shape sh = {KV_CODEC_F16, kv ? KV_SECTION_V : KV_SECTION_K, nt, M.head_dim};
          kv_codec_params p;
          kv_codec_params_init(&p);
          p.bits = cf.bits;
          unsigned g = cf.group ? cf.group : 128;
          p.group = g < nt ? g : nt;
          if (!kv) {
            p.rope_base = M.rope_base;
            p.rope_style = KV_ROPE_ADJACENT;
            p.rope_pos0 = (uint32_t)b0;
          }
          if (cal != NULL)
            ASSERT(kv_calib_section_params(cal, cf.bits, l, h, (int)kv, nt, cf.group, &p));
          size_t out = 0;
          ASSERT(kv_codec_encode(c, &sh, rows, (size_t)nt * M.head_dim * 2, &p, scratch,
                                 sizeof scratch, enc, sizeof enc, &out, NULL) == KV_CODEC_OK);
          kv_section_info info;
          ASSERT(kv_section_decode(enc, out, scratch, sizeof scratch, dec, sizeof dec, &info,
                                   NULL) == KV_CODEC_OK);
          ASSERT_EQ(info.params.alloc, cal != NULL);
          g_sec_bytes += out;
          for (uint32_t t = 0; t < nt; t++)
            memcpy(exp + at(l, kv, b0 + t, h, 0, n), dec + t * M.head_dim, M.head_dim * 2);
        }
  }
}

static uint32_t g_put_flags; /* kvdb_put_opts.flags of put_cfg */

static kvdb_status put_cfg(kvdb *db, const uint32_t *tok, size_t n, const uint16_t *buf,
                           const char *cfg)
{
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.flags = g_put_flags;
  ASSERT_OK(kvdb_config_parse(cfg, &po.config));
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, (void *)buf, g_m, n, KVDB_LAYOUT_LKTHD));
  return kvdb_put_ex(db, g_m, tok, n, &v, &po, NULL);
}

/* get of tok (n) equals want, bit for bit */
static void check_get(kvdb *db, const uint32_t *tok, size_t n, const uint16_t *want)
{
  size_t bytes = n * kvdb_model_token_bytes(&M);
  uint16_t *got = malloc(bytes);
  ASSERT(got != NULL);
  memset(got, 0xee, bytes);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, got, g_m, n, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, g_m, tok, n, &v, &hit));
  ASSERT_EQ(hit, n);
  ASSERT(memcmp(got, want, bytes) == 0);
  free(got);
}

static char g_problem[512]; /* kvdb_verify's last problem */

static void on_problem(void *ctx, const kvdb_problem *p)
{
  (void)ctx;
  snprintf(g_problem, sizeof g_problem, "%s", p->message);
}

static kvdb_calib_opts cal_opts(void)
{
  kvdb_calib_opts o;
  kvdb_calib_opts_init(&o);
  o.n_q_heads = QH;
  return o;
}

static void test_bad_inputs(kvdb *db)
{
  kvdb_calib_opts o = cal_opts();
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, NULL, 1, &o));
  ASSERT_MSG_HAS("no calibration contexts");
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, cal_ctx, 0, &o));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, cal_ctx, NCAL, NULL));
  ASSERT_MSG_HAS("kvdb_calib_opts_init");
  kvdb_calib_opts bad = o;
  bad.n_q_heads = 3; /* not a multiple of 2 KV heads */
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &bad));
  ASSERT_MSG_HAS("n_q_heads");
  bad = o;
  bad.int4_bits = 9.0f;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &bad));
  ASSERT_MSG_HAS("budgets");
  bad = o;
  bad.flags = 4;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &bad));
  ASSERT_MSG_HAS("flags");
  kvdb_calib_context x = cal_ctx[0];
  x.n_queries = 0; /* no queries */
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("no queries");
  x = cal_ctx[0];
  x.queries = NULL;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("no queries");
  uint32_t pos[3] = {5, 5, 9};
  x = cal_ctx[0];
  x.positions = pos;
  x.n_queries = 3;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("positions[1]");
  pos[1] = 6;
  pos[2] = NCT; /* past the context */
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("positions[2]");
  x = cal_ctx[0];
  x.kv = NULL;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("kv is NULL");
  x = cal_ctx[0];
  x.n_tokens = 0;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("n_tokens");
  kvdb_kv_view wv = cal_view[0]; /* a view without its V */
  wv.v.base = NULL;
  x = cal_ctx[0];
  x.kv = &wv;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("neither base");
  wv = cal_view[0]; /* strides past int64 */
  wv.k.token_stride = INT64_MAX / 2;
  x.kv = &wv;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  float nanq[2 * QH * 16]; /* one query row: n_layers x n_q_heads x head_dim */
  for (size_t i = 0; i < sizeof nanq / sizeof nanq[0]; i++)
    nanq[i] = 0.0f;
  nanq[3] = NAN;
  uint32_t p0 = 0;
  x = cal_ctx[0];
  x.queries = nanq;
  x.positions = &p0;
  x.n_queries = 1;
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibrate(db, &M, &x, 1, &o));
  ASSERT_MSG_HAS("not finite");
  kvdb_model wrong = M; /* another fingerprint under the same id */
  wrong.head_dim = 8;
  kvdb_calib_info ci;
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_model_calibration(db, "no-such-model", &ci));
  ASSERT_STATUS(KVDB_INVALID, kvdb_model_calibration(db, NULL, &ci));
  (void)wrong;
}

/* Blocks smaller than the options' groups (64 tokens here, groups of 128 and 256): the plan is
 * chosen on the sections a put stores, so a calibrated put of a context shaped like the
 * calibration contexts (two full blocks) stores at most the budget in its coded sections, and
 * the plan's groups are at most the block. The plan chosen on whole contexts (block 0: before
 * session 29) is measured beside it. */
static void test_block_budget(kvdb *db, const kv_calib *ref)
{
  uint32_t heads = M.n_layers * M.n_kv_heads;
  for (int p = 0; p < KV_CALIB_N_PLANS; p++)
    for (uint32_t h = 0; h < heads; h++)
      ASSERT(ref->plan[p][h].kg <= M.block_tokens && ref->plan[p][h].vg <= M.block_tokens);
  kv_calib whole;
  reference_calib(db, &M, &whole, 0);
  size_t tb = kvdb_model_token_bytes(&M);
  double elems = (double)NCT * M.n_layers * M.n_kv_heads * 2 * M.head_dim;
  uint16_t *src = make_kv(NCT, 21), *exp = malloc(NCT * tb);
  uint32_t tok[NCT];
  ASSERT(exp != NULL);
  static const char *cfgs[2] = {"int4", "int2"};
  for (int p = 0; p < KV_CALIB_N_PLANS; p++) {
    expected(src, NCT, cfgs[p], &whole, exp);
    double whole_bits = 8.0 * (double)g_sec_bytes / elems;
    tokens(tok, NCT, 30 + (uint64_t)p);
    ASSERT_OK(put_cfg(db, tok, NCT, src, cfgs[p]));
    expected(src, NCT, cfgs[p], ref, exp);
    check_get(db, tok, NCT, exp); /* the round trip equals the codec's */
    double bits = 8.0 * (double)g_sec_bytes / elems;
    kvdb_key hs[2];
    ASSERT_OK(kvdb_chain_hashes(&M, tok, NCT, hs, 2));
    kvdb_context_info ci;
    ASSERT_OK(kvdb_context_stat(db, &hs[1], &ci));
    printf("calib: %s at %u-token blocks: sections %.4f bits per element (their budget %.4f; the "
           "plan of whole contexts %.4f), stored %.4f\n",
           cfgs[p], M.block_tokens, bits, (double)ref->budget[p], whole_bits,
           8.0 * (double)ci.bytes / elems);
    ASSERT(bits <= ref->budget[p]);
    ASSERT(8.0 * (double)ci.bytes / elems <= 4.5 - 2.0 * p); /* what the put stores */
  }
  kv_calib_free(&whole);
  free(src);
  free(exp);
}

static void flip_calibration(uint8_t *rec, size_t *len)
{
  ASSERT(*len > 100 && rec[0] == 3);
  rec[70] ^= 0x40; /* a byte of K's weights */
}

static void damage_calibration(const char *dir)
{
  t_cat_edit(dir, T_CAT_MODELS, M.id, strlen(M.id), flip_calibration);
}

int main(void)
{
  char *dir = t_tmpdir("calib");
  kvdb_options o = opts();
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  make_cal();
  size_t tb = kvdb_model_token_bytes(&M);
  uint32_t ta[N], tbk[N], tc[N], td[N], te[N], tf[N];
  tokens(ta, N, 1);
  tokens(tbk, N, 2);
  tokens(tc, N, 3);
  tokens(td, N, 4);
  tokens(te, N, 5);
  tokens(tf, N, 6);
  uint16_t *ka = make_kv(N, 11), *kb = make_kv(N, 12), *kc = make_kv(N, 13), *kd = make_kv(N, 14),
           *ke = make_kv(N, 15), *kf = make_kv(N, 16);
  uint16_t *exp = malloc(N * tb), *exp_a = malloc(N * tb);
  ASSERT(exp != NULL && exp_a != NULL);

  /* before any calibration: int4 as always, and the model has none */
  ASSERT_OK(put_cfg(db, ta, N, ka, "int4"));
  expected(ka, N, "int4", NULL, exp_a);
  check_get(db, ta, N, exp_a);
  kvdb_calib_info ci;
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT_EQ(ci.calibrated, 0);
  test_bad_inputs(db);
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT_EQ(ci.calibrated, 0); /* nothing stored by the refusals */

  /* calibrate; the catalog holds it; the computation is compress/calib.c's */
  kvdb_calib_opts co = cal_opts();
  ASSERT_OK(kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &co));
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT(ci.calibrated == 1 && ci.flags == (KVDB_CALIB_INT4 | KVDB_CALIB_INT2));
  ASSERT(ci.n_contexts == NCAL && ci.int4_bits == 4.5f && ci.int2_bits == 2.5f);
  ASSERT(ci.int4_planned_bits >= 2.0f && ci.int4_planned_bits <= 7.0f);
  kv_calib ref;
  reference_calib(db, &M, &ref, M.block_tokens);
  test_block_budget(db, &ref);

  /* the context stored before reads back bit for bit */
  check_get(db, ta, N, exp_a);
  /* int4 and int2 puts of the calibrated model: the calibration's sections */
  ASSERT_OK(put_cfg(db, tbk, N, kb, "int4"));
  expected(kb, N, "int4", &ref, exp);
  check_get(db, tbk, N, exp);
  ASSERT_OK(put_cfg(db, tc, N, kc, "int2"));
  expected(kc, N, "int2", &ref, exp);
  check_get(db, tc, N, exp);
  g_put_flags = KVDB_PUT_PROFILE; /* the profile measures int4 / int2 with the calibration */
  ASSERT_OK(put_cfg(db, td, N, kd, "int4:g32")); /* an explicit group wins over the plan's */
  g_put_flags = 0;
  expected(kd, N, "int4:g32", &ref, exp);
  check_get(db, td, N, exp);
  /* re-encoding the old context uses the calibration too */
  kvdb_key key_a;
  kvdb_key hs[3];
  ASSERT_OK(kvdb_chain_hashes(&M, ta, N, hs, 3));
  key_a = hs[2];
  kvdb_config to;
  ASSERT_OK(kvdb_config_parse("int2", &to));
  ASSERT_OK(kvdb_recompress(db, &M, &key_a, &to, NULL));
  uint16_t *dec_a = malloc(N * tb); /* what int4 stored, as re-encoding decodes it */
  memcpy(dec_a, exp_a, N * tb);
  expected(dec_a, N, "int2", &ref, exp);
  check_get(db, ta, N, exp);
  /* a new calibration replaces the old (here: int4 only, another budget) */
  co.flags = KVDB_CALIB_INT4;
  co.int4_bits = 4.25f;
  ASSERT_OK(kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &co));
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT(ci.flags == KVDB_CALIB_INT4 && ci.int4_bits == 4.25f && ci.int2_bits == 0.0f);
  co = cal_opts();
  ASSERT_OK(kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &co));
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);

  /* a second process: the calibration persists; its puts use it */
  pid_t pid = fork();
  if (pid == 0) {
    kvdb *db2;
    kvdb_options o2 = opts();
    if (kvdb_open(dir, &o2, &db2) != KVDB_OK)
      _exit(1);
    kvdb_calib_info c2;
    if (kvdb_model_calibration(db2, M.id, &c2) != KVDB_OK || c2.calibrated != 1 ||
        c2.flags != (KVDB_CALIB_INT4 | KVDB_CALIB_INT2))
      _exit(2);
    if (put_cfg(db2, te, N, ke, "int4") != KVDB_OK)
      _exit(3);
    expected(ke, N, "int4", &ref, exp);
    check_get(db2, te, N, exp);
    expected(kb, N, "int4", &ref, exp);
    check_get(db2, tbk, N, exp);
    kvdb_close(db2);
    _exit(0);
  }
  int status;
  ASSERT(waitpid(pid, &status, 0) == pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* a damaged calibration: the writers that need it fail KVDB_CORRUPT; reads stay right */
  damage_calibration(dir);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_model_calibration(db, M.id, &ci));
  ASSERT_MSG_HAS("checksum");
  kvdb_verify_report vr; /* kvdb_verify names it */
  g_problem[0] = 0;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, on_problem, NULL, NULL, &vr));
  ASSERT(vr.problems == 1 && strstr(g_problem, "model 'test-calib': its calibration") != NULL);
  ASSERT_STATUS(KVDB_CORRUPT, put_cfg(db, tf, N, kf, "int4"));
  size_t hit = 1;
  ASSERT_OK(kvdb_lookup(db, &M, tf, N, &hit));
  ASSERT_EQ(hit, 0); /* nothing of the refused put */
  expected(kb, N, "int4", &ref, exp);
  check_get(db, tbk, N, exp);
  expected(ke, N, "int4", &ref, exp);
  check_get(db, te, N, exp);
  g_put_flags = KVDB_PUT_PROFILE; /* a profile goes on without the damaged calibration */
  ASSERT_OK(put_cfg(db, tf, N, kf, "raw")); /* configs without calibration still write */
  g_put_flags = 0;
  check_get(db, tf, N, kf);
  kvdb_key key_f; /* re-encoding to int4 needs the calibration: refused, the context kept */
  ASSERT_OK(kvdb_chain_hashes(&M, tf, N, hs, 3));
  key_f = hs[2];
  kvdb_config to4;
  ASSERT_OK(kvdb_config_parse("int4", &to4));
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_recompress(db, &M, &key_f, &to4, NULL));
  ASSERT_MSG_HAS("checksum");
  check_get(db, tf, N, kf);
  ASSERT_OK(put_cfg(db, tf + 1, N - 1, kf, "int8"));
  /* calibrating again repairs it */
  ASSERT_OK(kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &co));
  ASSERT_OK(kvdb_model_calibration(db, M.id, &ci));
  ASSERT_EQ(ci.calibrated, 1);
  kvdb_close(db);

  /* read-only: calibration refused */
  kvdb_options ro = opts();
  ro.flags |= KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(dir, &ro, &db));
  ASSERT_STATUS(KVDB_READONLY, kvdb_model_calibrate(db, &M, cal_ctx, NCAL, &co));
  kvdb_close(db);

  t_rmdir(dir);

  /* blocks of 256 tokens: the plan's groups (256 or 128) are what a block stores */
  dir = t_tmpdir("calib256");
  g_m = &M256;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_model_calibrate(db, &M256, cal_ctx, NCAL, &co));
  uint32_t tg[N2];
  tokens(tg, N2, 7);
  uint16_t *kg = make_kv(N2, 17), *exp2 = malloc(N2 * tb);
  ASSERT(kg != NULL && exp2 != NULL);
  kv_calib ref256;
  reference_calib(db, &M256, &ref256, M256.block_tokens);
  int big = 0;
  for (uint32_t h = 0; h < M.n_layers * M.n_kv_heads; h++)
    big |= ref256.plan[0][h].kg > 128 || ref256.plan[0][h].vg > 128;
  ASSERT(big); /* some head's group is 256 */
  ASSERT_OK(put_cfg(db, tg, N2, kg, "int4"));
  expected(kg, N2, "int4", &ref256, exp2);
  check_get(db, tg, N2, exp2);
  tokens(tg, N2, 8);
  ASSERT_OK(put_cfg(db, tg, N2, kg, "int2"));
  expected(kg, N2, "int2", &ref256, exp2);
  check_get(db, tg, N2, exp2);
  kv_calib_free(&ref256);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  free(kg);
  free(exp2);
  t_rmdir(dir);

  /* blocks of 16 tokens: no plan fits 4.5 bits (every group of 16 rows pays its scales; the
   * least option takes more), so the plan of least bytes is stored, the calibration says so in
   * the log, and puts still read back what the codec decodes */
  dir = t_tmpdir("calib16");
  static const kvdb_model M16 = {"test-calib", 2, 2, 16, KVDB_F16, 16, 0, 10000.0f,
                                 KVDB_ROPE_ADJACENT};
  g_m = &M16;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_model_calibrate(db, &M16, cal_ctx, NCAL, &co));
  kv_calib ref16;
  reference_calib(db, &M16, &ref16, M16.block_tokens);
  ASSERT(ref16.planned[0] > ref16.budget[0]); /* over: nothing fits */
  for (uint32_t h = 0; h < M.n_layers * M.n_kv_heads; h++)
    ASSERT(ref16.plan[0][h].kg <= 16 && ref16.plan[0][h].vg <= 16);
  ASSERT_OK(put_cfg(db, ta, N, ka, "int4"));
  expected(ka, N, "int4", &ref16, exp);
  check_get(db, ta, N, exp);
  kvdb_close(db);
  kv_calib_free(&ref16);

  kv_calib_free(&ref);
  for (int c = 0; c < NCAL; c++) {
    free(cal_kv[c]);
    free(cal_q[c]);
  }
  free(ka), free(kb), free(kc), free(kd), free(ke), free(kf), free(exp), free(exp_a), free(dec_a);
  t_rmdir(dir);
  printf("calib: ok\n");
  return 0;
}
