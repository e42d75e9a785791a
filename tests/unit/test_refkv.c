/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_refkv.c — tools/refkv: continuing a prompt from KV stored in kvdb gives the
 * same tokens (and bit-identical logits) as a full recompute, on a full hit, a partial hit and a
 * miss; what lossy storage (f16, bf16) costs is measured and is worse for bf16; token-dropping
 * configs are continued over their kept rows (the dropped ones absent to the model), against an
 * independent reference; the rounding conversions; model ids and digests; bad arguments.
 *
 *   test_refkv tiny   on a tiny random model the test writes itself (always runs)
 *   test_refkv real   on stories260K and TinyStories from $KVDB_SHARED_DIR (else ../shared):
 *                     the reference continuation of shared/models/README.md resumed from stored
 *                     KV, corpus prompts; exits 77 (skipped) naming what it looked for when absent
 */
#define _GNU_SOURCE
#include <math.h>
#include <sys/stat.h>

#include "kvdb_test.h"
#include "refkv.h"
#include "refmodel.h"
#include "tinymodel.h"

static char *g_dir;

/* ASSERT_OK / ASSERT_STATUS for refkv calls: the message is refkv_errmsg(). */
#define RK_OK(expr)                                                                                \
  do {                                                                                             \
    kvdb_status rk_ = (expr);                                                                      \
    if (rk_ != KVDB_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #expr, kvdb_status_name(rk_),  \
              refkv_errmsg());                                                                     \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define RK_STATUS(want, expr)                                                                      \
  do {                                                                                             \
    kvdb_status rk_ = (expr);                                                                      \
    if (rk_ != (want)) {                                                                           \
      fprintf(stderr, "%s:%d: %s -> %s, expected %s (%s)\n", __FILE__, __LINE__, #expr,            \
              kvdb_status_name(rk_), kvdb_status_name(want), refkv_errmsg());                      \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

static refmodel_model *load_model(const char *path)
{
  refmodel_model *m = NULL;
  if (refmodel_model_load(path, &m) != REFMODEL_OK) {
    fprintf(stderr, "cannot load %s: %s\n", path, refmodel_errmsg());
    abort();
  }
  return m;
}

static kvdb *open_db(const char *name)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  kvdb_options o;
  kvdb_options_init(&o);
  o.sync_mode = KVDB_SYNC_NONE;     /* durability is not what this test is about */
  o.catalog_map_bytes = 256u << 20; /* small enough for valgrind's address space */
  kvdb *db;
  ASSERT_OK(kvdb_open(path, &o, &db));
  return db;
}

/* ---- conversions -------------------------------------------------------------------------- */

static double f16_value(uint16_t h)
{
  return (double)refkv_f16_to_f32(h);
}

static void conversions(void)
{
  /* every f16 survives f16 -> f32 -> f16; NaN stays NaN */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = refkv_f16_to_f32((uint16_t)h);
    uint16_t back = refkv_f32_to_f16(f);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0)
      ASSERT(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
    else
      ASSERT_EQ(back, h);
  }
  ASSERT_EQ(refkv_f32_to_f16(1.0f), 0x3c00);
  ASSERT_EQ(refkv_f32_to_f16(-2.5f), 0xc100);
  ASSERT_EQ(refkv_f32_to_f16(65504.0f), 0x7bff);
  ASSERT_EQ(refkv_f32_to_f16(65520.0f), 0x7c00); /* halfway to the next binade: to infinity */
  ASSERT_EQ(refkv_f32_to_f16(65519.0f), 0x7bff);
  ASSERT_EQ(refkv_f32_to_f16(ldexpf(1, -24)), 0x0001);
  ASSERT_EQ(refkv_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie to even: 0 */
  ASSERT_EQ(refkv_f32_to_f16(ldexpf(3, -26)), 0x0001); /* 0.75 ulp up */
  ASSERT_EQ(refkv_f32_to_f16(ldexpf(3, -25)), 0x0002); /* 1.5 ulp: tie to even 2 */
  ASSERT_EQ(refkv_f32_to_f16(-0.0f), 0x8000);
  ASSERT_EQ(refkv_f32_to_f16(INFINITY), 0x7c00);
  ASSERT_EQ(refkv_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie: even mantissa */
  ASSERT_EQ(refkv_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02);

  /* random f32: the result is a nearest f16 (no neighbour is closer; ties even) */
  uint64_t s = 42;
  for (int i = 0; i < 200000; i++) {
    uint32_t bits = (uint32_t)t_rand(&s);
    bits =
        (bits & 0x807fffffu) | ((uint32_t)(100 + t_rand(&s) % 45) << 23); /* |x| in 2^-27..2^17 */
    float x;
    memcpy(&x, &bits, 4);
    uint16_t h = refkv_f32_to_f16(x);
    if ((h & 0x7fff) == 0x7c00) {
      ASSERT(fabs((double)x) >= 65520.0);
      continue;
    }
    double err = fabs(f16_value(h) - (double)x);
    for (int d = -1; d <= 1; d += 2) {
      uint16_t nb = (uint16_t)(h + d);
      if ((h & 0x7fff) == 0 && d < 0)
        continue;
      if ((nb & 0x7c00) == 0x7c00)
        continue;
      double e2 = fabs(f16_value(nb) - (double)x);
      ASSERT(err < e2 || (err == e2 && (h & 1) == 0));
    }
  }

  /* bf16 */
  ASSERT_EQ(refkv_f32_to_bf16(1.0f), 0x3f80);
  float f;
  uint32_t b = 0x3f808000u; /* 1 + 2^-8: tie, stays even */
  memcpy(&f, &b, 4);
  ASSERT_EQ(refkv_f32_to_bf16(f), 0x3f80);
  b = 0x3f818000u; /* tie, rounds up to even */
  memcpy(&f, &b, 4);
  ASSERT_EQ(refkv_f32_to_bf16(f), 0x3f82);
  b = 0x3f808001u;
  memcpy(&f, &b, 4);
  ASSERT_EQ(refkv_f32_to_bf16(f), 0x3f81);
  ASSERT(isnan(refkv_bf16_to_f32(refkv_f32_to_bf16(NAN))));
  for (uint32_t h = 0; h < 65536; h++) {
    float g = refkv_bf16_to_f32((uint16_t)h);
    if (!isnan(g))
      ASSERT_EQ(refkv_f32_to_bf16(g), h);
  }
}

/* ---- helpers over a model ----------------------------------------------------------------- */

/* prompt tokens: BOS then deterministic tokens in [259, vocab) seeded by `seed` */
static void make_prompt(int *p, size_t n, int vocab, uint64_t seed)
{
  p[0] = REFMODEL_TOKEN_BOS;
  for (size_t i = 1; i < n; i++)
    p[i] = 259 + (int)(t_rand(&seed) % (uint64_t)(vocab - 259));
}

static void store_prompt(kvdb *db, const refkv_model *m, const int *p, size_t n)
{
  refmodel_state *st;
  ASSERT(refmodel_state_new(m->rm, 0, &st) == REFMODEL_OK);
  ASSERT(refmodel_prefill(st, p, (int)n, 0, NULL) == REFMODEL_OK);
  uint32_t *u = malloc(n * sizeof *u);
  for (size_t i = 0; i < n; i++)
    u[i] = (uint32_t)p[i];
  RK_OK(refkv_put(db, m, st, u, n, NULL));
  free(u);
  refmodel_state_free(st);
}

/* Continue `prompt` from the store and from scratch: same tokens, bit-identical logits. */
static void check_same(kvdb *db, const refkv_model *m, const int *prompt, size_t n, int new_tokens,
                       size_t want_hit)
{
  refmodel_state *a, *b;
  ASSERT(refmodel_state_new(m->rm, 0, &a) == REFMODEL_OK);
  ASSERT(refmodel_state_new(m->rm, 0, &b) == REFMODEL_OK);
  int ta[256], tb[256];
  refkv_run ra, rb;
  RK_OK(refkv_continue(db, m, a, prompt, n, new_tokens, -1, ta, &ra));
  RK_OK(refkv_continue(NULL, m, b, prompt, n, new_tokens, -1, tb, &rb));
  ASSERT_EQ(ra.hit_tokens, want_hit);
  ASSERT_EQ(ra.prefill_tokens, n - want_hit);
  ASSERT_EQ(rb.hit_tokens, 0);
  ASSERT_EQ(rb.prefill_tokens, n);
  ASSERT_EQ(ra.n_generated, (size_t)new_tokens);
  ASSERT_EQ(rb.n_generated, (size_t)new_tokens);
  ASSERT(memcmp(ta, tb, (size_t)new_tokens * sizeof *ta) == 0);
  int vocab = refmodel_model_config(m->rm)->vocab_size;
  ASSERT(memcmp(refmodel_state_logits(a), refmodel_state_logits(b),
                (size_t)vocab * sizeof(float)) == 0);
  refmodel_state_free(a);
  refmodel_state_free(b);
}

/* Store prompt A; continue A itself (full hit), B sharing A's first `shared` tokens and C sharing
 * only BOS: identical to the full recompute every time. */
static void prefix_reuse(const refmodel_model *rm, refkv_storage storage, const char *dbname)
{
  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, "tiny.bin", storage, 16));
  kvdb *db = open_db(dbname);
  int vocab = refmodel_model_config(rm)->vocab_size;
  int a[80], b[80], c[80];
  make_prompt(a, 70, vocab, 1);
  make_prompt(b, 80, vocab, 2);
  memcpy(b, a, 37 * sizeof *a); /* shares 37 tokens: two full blocks and 5 of the third */
  make_prompt(c, 60, vocab, 3);
  store_prompt(db, &m, a, 70);
  if (storage == REFKV_STORE_F32) {
    check_same(db, &m, a, 70, 20, 69); /* the last prompt token is always fed */
    check_same(db, &m, b, 80, 20, 37);
    check_same(db, &m, c, 60, 20, 1);
  } else {
    /* lossy: the continuation is measured, not required to match */
    refmodel_state *r, *t;
    ASSERT(refmodel_state_new(rm, 0, &r) == REFMODEL_OK);
    ASSERT(refmodel_state_new(rm, 0, &t) == REFMODEL_OK);
    refkv_quality q;
    RK_OK(refkv_quality_measure(db, &m, r, t, a, 70, 24, &q));
    ASSERT_EQ(q.hit_tokens, 69);
    ASSERT_EQ(q.steps, 24);
    ASSERT(q.mean_kl > 0 && q.max_kl >= q.mean_kl);
    refmodel_state_free(r);
    refmodel_state_free(t);
  }
  kvdb_close(db);
}

/* Stored KV read back equals the state's (f32) or its rounding (f16, bf16). */
static void round_trip(const refmodel_model *rm, refkv_storage storage, const char *dbname)
{
  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, "tiny.bin", storage, 32));
  kvdb *db = open_db(dbname);
  int vocab = refmodel_model_config(rm)->vocab_size;
  int p[50];
  uint32_t u[50];
  make_prompt(p, 50, vocab, 9);
  for (int i = 0; i < 50; i++)
    u[i] = (uint32_t)p[i];
  refmodel_state *st, *back;
  ASSERT(refmodel_state_new(rm, 64, &st) == REFMODEL_OK);
  ASSERT(refmodel_state_new(rm, 0, &back) == REFMODEL_OK);
  ASSERT(refmodel_prefill(st, p, 50, 0, NULL) == REFMODEL_OK);
  kvdb_put_info info;
  RK_OK(refkv_put(db, &m, st, u, 50, &info));
  ASSERT_EQ(info.n_blocks, 2);
  size_t hit = 0;
  RK_OK(refkv_get(db, &m, back, u, 50, &hit));
  ASSERT_EQ(hit, 50);
  int layers = refmodel_model_config(rm)->n_layers;
  for (int l = 0; l < layers; l++)
    for (int t = 0; t < 50; t++)
      for (size_t i = 0; i < m.kv_dim; i++)
        for (int kv = 0; kv < 2; kv++) {
          float want = kv ? refmodel_state_value(st, l, t)[i] : refmodel_state_key(st, l, t)[i];
          float got = kv ? refmodel_state_value(back, l, t)[i] : refmodel_state_key(back, l, t)[i];
          if (storage == REFKV_STORE_F16)
            want = refkv_f16_to_f32(refkv_f32_to_f16(want));
          else if (storage == REFKV_STORE_BF16)
            want = refkv_bf16_to_f32(refkv_f32_to_bf16(want));
          ASSERT(memcmp(&want, &got, 4) == 0);
        }
  refmodel_state_free(st);
  refmodel_state_free(back);
  kvdb_close(db);
}

/* f32 storage costs nothing; f16 something; bf16 (7 mantissa bits against 10) more. */
static void quality(const refmodel_model *rm, const int *prompt, size_t n, int steps,
                    double f16_min_agreement, double f16_max_kl)
{
  double kl[3] = {0};
  for (int s = 0; s < 3; s++) {
    refkv_model m;
    RK_OK(refkv_model_init(&m, rm, NULL, "q.bin", (refkv_storage)s, 16));
    char name[32];
    snprintf(name, sizeof name, "quality-%d", s);
    kvdb *db = open_db(name);
    store_prompt(db, &m, prompt, n);
    refmodel_state *r, *t;
    ASSERT(refmodel_state_new(rm, 0, &r) == REFMODEL_OK);
    ASSERT(refmodel_state_new(rm, 0, &t) == REFMODEL_OK);
    refkv_quality q;
    RK_OK(refkv_quality_measure(db, &m, r, t, prompt, n, steps, &q));
    ASSERT_EQ(q.hit_tokens, n - 1);
    printf("  quality %-4s: agreement %d/%d, mean KL %.3g, max KL %.3g\n",
           refkv_storage_name((refkv_storage)s), q.agree, q.steps, q.mean_kl, q.max_kl);
    if (s == REFKV_STORE_F32) {
      ASSERT_EQ(q.agree, steps);
      ASSERT(q.mean_kl == 0 && q.max_kl == 0);
    } else {
      ASSERT(q.mean_kl > 0);
    }
    if (s == REFKV_STORE_F16) {
      ASSERT(q.agreement >= f16_min_agreement);
      ASSERT(q.mean_kl < f16_max_kl);
    }
    kl[s] = q.mean_kl;
    refmodel_state_free(r);
    refmodel_state_free(t);
    kvdb_close(db);
  }
  ASSERT(kl[REFKV_STORE_BF16] > kl[REFKV_STORE_F16]);
}

/* ---- tiny-model tests --------------------------------------------------------------------- */

static void model_ids(void)
{
  char p1[4200], p2[4200];
  snprintf(p1, sizeof p1, "%s/ids-a.bin", g_dir);
  snprintf(p2, sizeof p2, "%s/ids-b.bin", g_dir);
  ASSERT(tm_write_model(p1, 5) == 0 && tm_write_model(p2, 6) == 0);
  refmodel_model *a = load_model(p1), *b = load_model(p2);
  ASSERT(refmodel_model_digest(a) != refmodel_model_digest(b));
  /* the digest does not depend on how the bytes were loaded */
  FILE *f = fopen(p1, "rb");
  ASSERT(f != NULL);
  static unsigned char buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  refmodel_model *a2;
  ASSERT(refmodel_model_load_buffer(buf, len, "a", &a2) == REFMODEL_OK);
  ASSERT(refmodel_model_digest(a2) == refmodel_model_digest(a));
  buf[len - 1] ^= 1; /* one bit of the last weight (an unused freq_cis float) */
  refmodel_model *a3;
  ASSERT(refmodel_model_load_buffer(buf, len, "a'", &a3) == REFMODEL_OK);
  ASSERT(refmodel_model_digest(a3) != refmodel_model_digest(a));

  char id[64], id2[64];
  refkv_default_id("/x/y/tiny.bin", a, id);
  ASSERT(strncmp(id, "tiny-", 5) == 0 && strlen(id) == 5 + 12);
  refkv_default_id("tiny.bin", b, id2);
  ASSERT(strcmp(id, id2) != 0);
  refkv_default_id(NULL, a, id2);
  ASSERT(strncmp(id2, "llama2c-", 8) == 0 && strcmp(id + 5, id2 + 8) == 0);
  refkv_default_id("a-very-long-checkpoint-name-that-goes-on-and-on-and-on-forever.bin", a, id2);
  ASSERT(strlen(id2) == 44 + 1 + 12);

  refkv_model m;
  RK_OK(refkv_model_init(&m, a, NULL, p1, REFKV_STORE_F16, 0));
  ASSERT(strncmp(m.id, "ids-a-", 6) == 0 && m.km.id == m.id);
  ASSERT_EQ(m.km.block_tokens, 16);
  ASSERT_EQ(m.km.dtype, KVDB_F16);
  ASSERT_EQ(m.km.n_layers, TM_LAYERS);
  ASSERT_EQ(m.km.n_kv_heads, TM_KV_HEADS);
  ASSERT_EQ(m.km.head_dim, TM_DIM / TM_HEADS);
  ASSERT_EQ(refkv_token_bytes(&m), TM_LAYERS * 2 * TM_KV_HEADS * (TM_DIM / TM_HEADS) * 2);
  refkv_model c;
  refkv_model_copy(&c, &m);
  ASSERT(c.km.id == c.id && strcmp(c.id, m.id) == 0);
  RK_OK(refkv_model_init(&m, a, "my-model", NULL, REFKV_STORE_F32, 64));
  ASSERT(strcmp(m.id, "my-model") == 0);

  RK_STATUS(KVDB_INVALID, refkv_model_init(&m, a, NULL, NULL, REFKV_STORE_F32, 24));
  ASSERT(strstr(refkv_errmsg(), "block tokens 24") != NULL);
  RK_STATUS(KVDB_INVALID, refkv_model_init(&m, a, "", NULL, REFKV_STORE_F32, 16));
  ASSERT(strstr(refkv_errmsg(), "model id") != NULL);
  RK_STATUS(KVDB_INVALID, refkv_model_init(&m, a, NULL, NULL, (refkv_storage)7, 16));
  refkv_storage s;
  RK_STATUS(KVDB_INVALID, refkv_storage_parse("q4", &s));
  ASSERT(strstr(refkv_errmsg(), "unknown storage 'q4'") != NULL);
  RK_OK(refkv_storage_parse("bf16", &s));
  ASSERT_EQ(s, REFKV_STORE_BF16);
  ASSERT(refkv_storage_name((refkv_storage)3) == NULL);
  refmodel_model_free(a);
  refmodel_model_free(a2);
  refmodel_model_free(a3);
  refmodel_model_free(b);
}

static void bad_arguments(void)
{
  char p[4200];
  snprintf(p, sizeof p, "%s/tiny.bin", g_dir);
  refmodel_model *rm = load_model(p);
  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, p, REFKV_STORE_F32, 16));
  kvdb *db = open_db("bad");
  refmodel_state *st;
  ASSERT(refmodel_state_new(rm, 32, &st) == REFMODEL_OK);
  int prompt[40], out[8];
  make_prompt(prompt, 40, TM_VOCAB, 4);
  RK_STATUS(KVDB_INVALID, refkv_continue(db, &m, st, prompt, 30, 8, -1, out, NULL));
  ASSERT(strstr(refkv_errmsg(), "30 prompt tokens + 8 new need 37 positions") != NULL);
  prompt[5] = TM_VOCAB;
  RK_STATUS(KVDB_INVALID, refkv_continue(db, &m, st, prompt, 10, 2, -1, out, NULL));
  ASSERT(strstr(refkv_errmsg(), "prompt token 5 is 320") != NULL);
  RK_STATUS(KVDB_INVALID, refkv_continue(db, &m, st, prompt, 0, 2, -1, out, NULL));
  RK_STATUS(KVDB_INVALID, refkv_continue(db, &m, NULL, prompt, 4, 2, -1, out, NULL));
  uint32_t u[40] = {1, 2, 3};
  RK_STATUS(KVDB_INVALID, refkv_put(db, &m, st, u, 33, NULL));
  ASSERT(strstr(refkv_errmsg(), "33 tokens (the state holds 1..32)") != NULL);
  size_t hit = 7;
  RK_STATUS(KVDB_INVALID, refkv_get(db, &m, st, u, 0, &hit));
  /* the same id under another storage is another shape: kvdb refuses it */
  make_prompt(prompt, 20, TM_VOCAB, 4);
  ASSERT(refmodel_prefill(st, prompt, 20, 0, NULL) == REFMODEL_OK);
  for (int i = 0; i < 20; i++)
    u[i] = (uint32_t)prompt[i];
  RK_OK(refkv_put(db, &m, st, u, 20, NULL));
  refkv_model m16;
  RK_OK(refkv_model_init(&m16, rm, NULL, p, REFKV_STORE_F16, 16));
  RK_STATUS(KVDB_MISMATCH, refkv_put(db, &m16, st, u, 20, NULL));
  ASSERT(strstr(refkv_errmsg(), "kvdb_put: KVDB_MISMATCH") != NULL);
  /* stop token: generation ends before it and does not count it */
  refmodel_state *full;
  ASSERT(refmodel_state_new(rm, 0, &full) == REFMODEL_OK);
  int gen[16];
  refkv_run r;
  RK_OK(refkv_continue(NULL, &m, full, prompt, 20, 16, -1, gen, &r));
  ASSERT_EQ(r.n_generated, 16);
  int stop = gen[3], first_stop = 0;
  while (gen[first_stop] != stop)
    first_stop++;
  int gen2[16];
  RK_OK(refkv_continue(db, &m, full, prompt, 20, 16, stop, gen2, &r));
  ASSERT_EQ(r.hit_tokens, 19);
  ASSERT_EQ(r.n_generated, (size_t)first_stop);
  ASSERT(memcmp(gen, gen2, (size_t)first_stop * sizeof *gen) == 0);
  refmodel_state_free(full);
  refmodel_state_free(st);
  kvdb_close(db);
  refmodel_model_free(rm);
}

/* Layer 0's query depends only on the token and its position: recompute it from the checkpoint's
 * bytes in double (RMSNorm, Wq, RoPE) and compare with what refkv_prefill_queries kept. */
static void queries(const refmodel_model *rm, const char *path)
{
  size_t len;
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  static unsigned char bytes[1 << 20];
  len = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  ASSERT(len > 28);
  const int D = TM_DIM, HS = TM_DIM / TM_HEADS;
  float *w = malloc(len - 28);
  memcpy(w, bytes + 28, len - 28); /* little-endian host (x86) */
  const float *emb = w, *rms = w + TM_VOCAB * D, *wq = rms + TM_LAYERS * D;

  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, path, REFKV_STORE_F32, 16));
  ASSERT_EQ(m.q_floats, TM_LAYERS * TM_DIM);
  refmodel_state *st;
  ASSERT(refmodel_state_new(rm, 0, &st) == REFMODEL_OK);
  int p[10];
  make_prompt(p, 10, TM_VOCAB, 21);
  float q[3 * TM_LAYERS * TM_DIM];
  uint32_t got = 0;
  RK_OK(refkv_prefill_queries(&m, st, p, 10, 0, 3, q, &got));
  ASSERT_EQ(got, 3);
  for (int i = 0; i < 3; i++) {
    int pos = 7 + i, tok = p[pos];
    double x[TM_DIM], ss = 0, y[TM_DIM];
    for (int d = 0; d < D; d++)
      ss += (double)emb[tok * D + d] * emb[tok * D + d];
    double scale = 1.0 / sqrt(ss / D + 1e-5);
    for (int d = 0; d < D; d++)
      x[d] = rms[d] * (scale * emb[tok * D + d]);
    for (int r = 0; r < D; r++) {
      y[r] = 0;
      for (int c = 0; c < D; c++)
        y[r] += (double)wq[r * D + c] * x[c];
    }
    for (int h = 0; h < TM_HEADS; h++)
      for (int j = 0; j < HS / 2; j++) {
        double fr = pow(10000.0, -(double)(2 * j) / HS), a = pos * fr;
        double v0 = y[h * HS + 2 * j], v1 = y[h * HS + 2 * j + 1];
        y[h * HS + 2 * j] = v0 * cos(a) - v1 * sin(a);
        y[h * HS + 2 * j + 1] = v0 * sin(a) + v1 * cos(a);
      }
    const float *got_q = q + (size_t)i * m.q_floats; /* layer 0 comes first */
    for (int d = 0; d < D; d++)
      ASSERT(fabs(got_q[d] - y[d]) <= 1e-4 * (1 + fabs(y[d])));
    /* layer 1's query is there too, and it is not layer 0's */
    ASSERT(memcmp(got_q, got_q + D, (size_t)D * sizeof(float)) != 0);
  }
  /* the state ends as a plain prefill leaves it */
  refmodel_state *st2;
  ASSERT(refmodel_state_new(rm, 0, &st2) == REFMODEL_OK);
  ASSERT(refmodel_prefill(st2, p, 10, 0, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(st), refmodel_state_logits(st2), TM_VOCAB * sizeof(float)) ==
         0);
  ASSERT(refmodel_state_query(st2, 2) == NULL);
  /* fewer positions than queries asked for: all of them */
  RK_OK(refkv_prefill_queries(&m, st, p, 10, 8, 5, q, &got));
  ASSERT_EQ(got, 2);
  RK_STATUS(KVDB_INVALID, refkv_prefill_queries(&m, st, p, 10, 10, 5, q, &got));
  refmodel_state_free(st);
  refmodel_state_free(st2);
  free(w);
}

/* The engine's compression configs through refkv: names, checks, lossless or not, queries for
 * SnapKV, and a measured quality reported into the context's profile. */
static void configs(const refmodel_model *rm)
{
  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, "tiny.bin", REFKV_STORE_F32, 16));
  char d[96];
  ASSERT(refkv_model_lossless(&m));
  ASSERT(strcmp(refkv_model_describe(&m, d, sizeof d), "f32 raw") == 0);
  RK_OK(refkv_model_set_config(&m, "lossless"));
  ASSERT(refkv_model_lossless(&m));
  RK_STATUS(KVDB_INVALID, refkv_model_set_config(&m, "int5"));
  ASSERT(strstr(refkv_errmsg(), "int5") != NULL);
  RK_STATUS(KVDB_INVALID, refkv_model_set_config(&m, "int4:g64"));
  ASSERT(strstr(refkv_errmsg(), "group 64") != NULL && strstr(refkv_errmsg(), m.id) != NULL);
  ASSERT(refkv_model_lossless(&m)); /* unchanged by the failures */

  /* lossless config: continuations identical */
  kvdb *db = open_db("cfg-lossless");
  int a[70];
  make_prompt(a, 70, TM_VOCAB, 31);
  store_prompt(db, &m, a, 50);
  check_same(db, &m, a, 70, 10, 50);
  kvdb_close(db);

  /* int4: lossy; quality measured and reported, the profile recorded with real queries */
  RK_OK(refkv_model_set_config(&m, "int4"));
  ASSERT(!refkv_model_lossless(&m));
  ASSERT(strcmp(refkv_model_describe(&m, d, sizeof d), "f32 int4") == 0);
  db = open_db("cfg-int4");
  refmodel_state *st, *ref;
  ASSERT(refmodel_state_new(rm, 0, &st) == REFMODEL_OK);
  ASSERT(refmodel_state_new(rm, 0, &ref) == REFMODEL_OK);
  float *q = malloc(8 * m.q_floats * sizeof *q);
  uint32_t got, u[70];
  for (int i = 0; i < 70; i++)
    u[i] = (uint32_t)a[i];
  RK_OK(refkv_prefill_queries(&m, st, a, 60, 0, 8, q, &got));
  ASSERT_EQ(got, 8);
  RK_OK(refkv_put_ex(db, &m, st, u, 60, q, got, 1, NULL));
  refkv_quality qa;
  RK_OK(refkv_quality_measure(db, &m, ref, st, a, 60, 10, &qa));
  ASSERT_EQ(qa.hit_tokens, 59);
  ASSERT(qa.mean_kl > 0);
  RK_OK(refkv_report_quality(db, &m, u, 60, qa.agreement));
  kvdb_key h[4];
  ASSERT_OK(kvdb_chain_hashes(&m.km, u, 60, h, 4));
  kvdb_profile_entry pe[64];
  size_t n_pe = 0;
  ASSERT_OK(kvdb_profile_get(db, &h[3], pe, 64, &n_pe));
  int found = 0, has_snapkv = 0;
  for (size_t i = 0; i < n_pe && i < 64; i++) {
    char name[64];
    kvdb_config_name(&pe[i].config, name, sizeof name);
    has_snapkv |= strncmp(name, "snapkv", 6) == 0; /* measured only when queries are given */
    if (pe[i].flags & KVDB_PROFILE_STORED) {
      found = 1;
      ASSERT(strcmp(name, "int4") == 0);
      ASSERT_EQ(pe[i].n_reports, 1);
      ASSERT(fabs(pe[i].reported_quality - qa.agreement) < 1e-9);
    }
  }
  ASSERT(found && has_snapkv);
  RK_STATUS(KVDB_NOTFOUND, refkv_report_quality(db, &m, u, 61, 0.5));

  /* SnapKV keeps what the last queries attend to: refused without them, stored with them */
  RK_OK(refkv_model_set_config(&m, "snapkv50"));
  RK_STATUS(KVDB_INVALID, refkv_put_ex(db, &m, st, u, 60, NULL, 0, 0, NULL));
  RK_STATUS(KVDB_INVALID, refkv_put_ex(db, &m, st, u, 60, NULL, 3, 0, NULL));
  make_prompt(a, 70, TM_VOCAB, 32);
  for (int i = 0; i < 70; i++)
    u[i] = (uint32_t)a[i];
  RK_OK(refkv_prefill_queries(&m, st, a, 40, 0, 8, q, &got));
  RK_OK(refkv_put_ex(db, &m, st, u, 40, q, got, 0, NULL));
  ASSERT_OK(kvdb_chain_hashes(&m.km, u, 40, h, 4));
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &h[2], &ci));
  kvdb_config_name(&ci.config, d, sizeof d);
  ASSERT(strcmp(d, "snapkv50") == 0);
  free(q);
  refmodel_state_free(st);
  refmodel_state_free(ref);
  kvdb_close(db);
}

/* refmodel_state_set_absent: an absent row gets no attention, whatever it holds. */
static void absent_rows(const refmodel_model *rm)
{
  const refmodel_config *c = refmodel_model_config(rm);
  refmodel_state *a, *b, *f;
  ASSERT(refmodel_state_new(rm, 0, &a) == REFMODEL_OK);
  ASSERT(refmodel_state_new(rm, 0, &b) == REFMODEL_OK);
  ASSERT(refmodel_state_new(rm, 0, &f) == REFMODEL_OK);
  int pa[40], pb[40];
  make_prompt(pa, 40, TM_VOCAB, 41);
  make_prompt(pb, 40, TM_VOCAB, 42);
  pb[39] = pa[39];
  size_t vbytes = (size_t)c->vocab_size * sizeof(float);
  float *la = malloc(vbytes);
  ASSERT(la != NULL);

  /* two different histories, every earlier row absent: the same token at 39 sees only itself */
  ASSERT(refmodel_prefill(a, pa, 39, 0, NULL) == REFMODEL_OK);
  ASSERT(refmodel_prefill(b, pb, 39, 0, NULL) == REFMODEL_OK);
  for (int l = 0; l < c->n_layers; l++)
    for (int g = 0; g < c->n_kv_heads; g++)
      for (int t = 0; t < 39; t++) {
        ASSERT(refmodel_state_set_absent(a, l, g, t, 1) == REFMODEL_OK);
        ASSERT(refmodel_state_set_absent(b, l, g, t, 1) == REFMODEL_OK);
      }
  ASSERT(refmodel_forward(a, pa[39], 39, NULL) == REFMODEL_OK);
  ASSERT(refmodel_forward(b, pb[39], 39, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(a), refmodel_state_logits(b), vbytes) == 0);
  memcpy(la, refmodel_state_logits(a), vbytes);

  /* marks undone one by one, or all at once: the full history's logits, bit for bit */
  ASSERT(refmodel_prefill(f, pa, 40, 0, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(f), la, vbytes) != 0);
  for (int l = 0; l < c->n_layers; l++)
    for (int g = 0; g < c->n_kv_heads; g++)
      for (int t = 0; t < 39; t++)
        ASSERT(refmodel_state_set_absent(a, l, g, t, 0) == REFMODEL_OK);
  ASSERT(refmodel_forward(a, pa[39], 39, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(a), refmodel_state_logits(f), vbytes) == 0);
  refmodel_state_clear_absent(b);
  ASSERT(refmodel_prefill(b, pa, 40, 0, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(b), refmodel_state_logits(f), vbytes) == 0);

  /* one row of one KV head of one layer absent changes the logits; a forward step at an absent
   * position makes it present again */
  ASSERT(refmodel_state_set_absent(a, 1, c->n_kv_heads - 1, 5, 1) == REFMODEL_OK);
  ASSERT(refmodel_forward(a, pa[39], 39, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(a), refmodel_state_logits(f), vbytes) != 0);
  ASSERT(refmodel_state_set_absent(a, 0, 0, 39, 1) == REFMODEL_OK);
  ASSERT(refmodel_forward(a, pa[39], 39, NULL) == REFMODEL_OK); /* 39 present again */
  ASSERT(refmodel_state_set_absent(a, 1, c->n_kv_heads - 1, 5, 0) == REFMODEL_OK);
  ASSERT(refmodel_forward(a, pa[39], 39, NULL) == REFMODEL_OK);
  ASSERT(memcmp(refmodel_state_logits(a), refmodel_state_logits(f), vbytes) == 0);

  ASSERT(refmodel_state_set_absent(a, c->n_layers, 0, 0, 1) == REFMODEL_EINVAL);
  ASSERT(refmodel_state_set_absent(a, 0, c->n_kv_heads, 0, 1) == REFMODEL_EINVAL);
  ASSERT(refmodel_state_set_absent(a, 0, 0, refmodel_state_max_pos(a), 1) == REFMODEL_EINVAL);
  ASSERT(refmodel_state_set_absent(NULL, 0, 0, 0, 1) == REFMODEL_EINVAL);
  refmodel_state_clear_absent(NULL);
  free(la);
  refmodel_state_free(a);
  refmodel_state_free(b);
  refmodel_state_free(f);
}

/*
 * Token-dropping configs: kvdb_get cannot deliver a dropped block, so refkv reads the prefix
 * with kvdb_get_kept and marks the dropped rows absent. The reference here is built
 * independently: a full float32 prefill whose kept rows are replaced by what kvdb_get_context
 * returns (exact for f32 without quantization) and whose dropped rows are marked absent.
 */
static void dropped(const refmodel_model *rm, const char *config, refkv_storage storage)
{
  const refmodel_config *c = refmodel_model_config(rm);
  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, "tiny.bin", storage, 16));
  RK_OK(refkv_model_set_config(&m, config));
  ASSERT(!refkv_model_lossless(&m));
  char name[64];
  snprintf(name, sizeof name, "drop-%s-%d", config, (int)storage);
  kvdb *db = open_db(name);
  refmodel_state *st, *ref, *want;
  ASSERT(refmodel_state_new(rm, 0, &st) == REFMODEL_OK);
  ASSERT(refmodel_state_new(rm, 0, &ref) == REFMODEL_OK);
  ASSERT(refmodel_state_new(rm, 0, &want) == REFMODEL_OK);
  enum { N = 56, EXTRA = 12 };
  int a[N + EXTRA];
  uint32_t u[N + EXTRA];
  make_prompt(a, N + EXTRA, TM_VOCAB, 51);
  for (int i = 0; i < N + EXTRA; i++)
    u[i] = (uint32_t)a[i];
  float *q = malloc(8 * m.q_floats * sizeof *q);
  uint32_t got;
  RK_OK(refkv_prefill_queries(&m, st, a, N, 0, 8, q, &got));
  RK_OK(refkv_put_ex(db, &m, st, u, N, q, got, 0, NULL));
  size_t hit = 99;
  ASSERT_OK(kvdb_lookup(db, &m.km, u, N, &hit));
  ASSERT_EQ(hit, 0); /* what kvdb_get would deliver: nothing */

  /* which rows kvdb kept, per layer and KV head */
  kvdb_key h[4];
  ASSERT_OK(kvdb_chain_hashes(&m.km, u, N, h, 4));
  size_t n_lh = (size_t)c->n_layers * (size_t)c->n_kv_heads;
  uint32_t *pos = malloc(n_lh * N * sizeof *pos), *n_rows = malloc(n_lh * sizeof *n_rows);
  void *buf = malloc(N * refkv_token_bytes(&m));
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, buf, &m.km, N, KVDB_LAYOUT_LKTHD);
  ASSERT_OK(kvdb_get_context(db, &m.km, &h[3], &v, pos, n_rows));
  size_t kept = 0;
  for (size_t lh = 0; lh < n_lh; lh++)
    kept += n_rows[lh];
  ASSERT(kept > 0 && kept < n_lh * N); /* some rows dropped, some kept */

  /* the continuation of the stored context plus EXTRA tokens, from the store */
  int out[8];
  refkv_run run;
  RK_OK(refkv_continue(db, &m, st, a, N + EXTRA, 8, -1, out, &run));
  ASSERT_EQ(run.hit_tokens, N);
  ASSERT_EQ(run.prefill_tokens, EXTRA);
  /* the reference: the stored rows at their positions, the dropped ones absent */
  ASSERT(refmodel_prefill(want, a, N, 0, NULL) == REFMODEL_OK);
  size_t hs = (size_t)c->head_size, kvd = m.kv_dim;
  for (int l = 0; l < c->n_layers; l++)
    for (int g = 0; g < c->n_kv_heads; g++) {
      size_t lh = (size_t)l * (size_t)c->n_kv_heads + (size_t)g;
      char keep[N] = {0};
      for (uint32_t r = 0; r < n_rows[lh]; r++) {
        uint32_t t = pos[lh * N + r];
        ASSERT(t < N && !keep[t]); /* positions in range, each once */
        keep[t] = 1;
        for (int kv = 0; kv < 2; kv++) {
          float *row = (kv ? refmodel_state_value(want, l, (int)t)
                           : refmodel_state_key(want, l, (int)t)) + (size_t)g * hs;
          size_t at = (((size_t)l * 2 + (size_t)kv) * N + r) * kvd + (size_t)g * hs;
          for (size_t d = 0; d < hs; d++)
            row[d] = storage == REFKV_STORE_F32 ? ((const float *)buf)[at + d]
                     : storage == REFKV_STORE_F16
                         ? refkv_f16_to_f32(((const uint16_t *)buf)[at + d])
                         : refkv_bf16_to_f32(((const uint16_t *)buf)[at + d]);
        }
      }
      for (int t = 0; t < N; t++)
        if (!keep[t]) {
          ASSERT(refmodel_state_set_absent(want, l, g, t, 1) == REFMODEL_OK);
          memset(refmodel_state_key(want, l, t) + (size_t)g * hs, 0, hs * sizeof(float));
          memset(refmodel_state_value(want, l, t) + (size_t)g * hs, 0, hs * sizeof(float));
        }
    }
  const float *lw;
  ASSERT(refmodel_prefill(want, a + N, EXTRA, N, &lw) == REFMODEL_OK);
  ASSERT_EQ(out[0], refmodel_argmax(lw, c->vocab_size));
  /* st has generated 7 more tokens since: the first token's logits again, bit for bit */
  RK_OK(refkv_continue(db, &m, st, a, N + EXTRA, 1, -1, out, &run));
  ASSERT(memcmp(refmodel_state_logits(st), lw, (size_t)c->vocab_size * sizeof(float)) == 0);

  /* the quality of the stored context, measured over its kept rows: not exact */
  refkv_quality qa;
  RK_OK(refkv_quality_measure(db, &m, ref, st, a, N, 10, &qa));
  ASSERT_EQ(qa.hit_tokens, N - 1);
  ASSERT(qa.mean_kl > 0 && qa.max_kl >= qa.mean_kl);
  ASSERT(qa.agreement >= 0 && qa.agreement <= 1);
  /* a prompt no stored context is a prefix of: nothing restored, exact */
  int other[N];
  make_prompt(other, N, TM_VOCAB, 52);
  RK_OK(refkv_quality_measure(db, &m, ref, st, other, N, 4, &qa));
  ASSERT_EQ(qa.hit_tokens, 0);
  ASSERT(qa.mean_kl == 0 && qa.agree == qa.steps);
  /* refkv_get of the context alone: all N positions */
  RK_OK(refkv_get(db, &m, st, u, N, &hit));
  ASSERT_EQ(hit, N);
  /* a prompt shorter than the stored context: its whole blocks are a prefix hit (3 of 16) */
  RK_OK(refkv_continue(db, &m, st, a, 50, 1, -1, out, &run));
  ASSERT_EQ(run.hit_tokens, 48);
  ASSERT_EQ(run.prefill_tokens, 2);
  free(q);
  free(pos);
  free(n_rows);
  free(buf);
  refmodel_state_free(st);
  refmodel_state_free(ref);
  refmodel_state_free(want);
  kvdb_close(db);
}

static int run_tiny(void)
{
  char p[4200];
  snprintf(p, sizeof p, "%s/tiny.bin", g_dir);
  ASSERT(tm_write_model(p, 1) == 0);
  refmodel_model *rm = load_model(p);
  conversions();
  model_ids();
  bad_arguments();
  queries(rm, p);
  configs(rm);
  absent_rows(rm);
  dropped(rm, "knorm50", REFKV_STORE_F32);
  dropped(rm, "snapkv50", REFKV_STORE_F32);
  dropped(rm, "keydiff30+int8", REFKV_STORE_F16);
  for (int s = 0; s < 3; s++) {
    char name[32];
    snprintf(name, sizeof name, "rt-%d", s);
    round_trip(rm, (refkv_storage)s, name);
  }
  prefix_reuse(rm, REFKV_STORE_F32, "reuse-f32");
  prefix_reuse(rm, REFKV_STORE_F16, "reuse-f16");
  int prompt[100];
  make_prompt(prompt, 100, TM_VOCAB, 11);
  quality(rm, prompt, 100, 24, 0.75, 1e-2);
  refmodel_model_free(rm);
  return T_EXIT_PASS;
}

/* ---- the real model ----------------------------------------------------------------------- */

static const int ref_tokens[65] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421,
                                   395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411,
                                   322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370,
                                   432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312,
                                   432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

static int run_real(void)
{
  const char *env = getenv("KVDB_SHARED_DIR");
  const char *dirs[2] = {env != NULL && env[0] != '\0' ? env : NULL, "../shared"};
  char model[4200] = "", tok[4200] = "", corpus[4200] = "", looked[9000] = "";
  int found = 0;
  for (int i = 0; i < 2 && !found; i++) {
    if (dirs[i] == NULL)
      continue;
    snprintf(model, sizeof model, "%s/models/stories260K/stories260K.bin", dirs[i]);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", dirs[i]);
    snprintf(corpus, sizeof corpus, "%s/corpora/tinystories/tinystories_validation_head.txt",
             dirs[i]);
    struct stat sb;
    found = stat(model, &sb) == 0 && stat(tok, &sb) == 0 && stat(corpus, &sb) == 0;
    size_t u = strlen(looked);
    snprintf(looked + u, sizeof looked - u, "  '%s', '%s', '%s'\n", model, tok, corpus);
  }
  if (!found) {
    printf("test_refkv real: SKIP: stories260K or TinyStories not found (KVDB_SHARED_DIR %s). "
           "Looked for:\n%s",
           env != NULL && env[0] != '\0' ? "set" : "not set", looked);
    return T_EXIT_SKIP;
  }
  refmodel_model *rm = load_model(model);
  refmodel_tokenizer *tk;
  ASSERT(refmodel_tokenizer_load(tok, 512, &tk) == REFMODEL_OK);
  refkv_model m;
  RK_OK(refkv_model_init(&m, rm, NULL, model, REFKV_STORE_F32, 16));
  ASSERT(strncmp(m.id, "stories260K-", 12) == 0);
  kvdb *db = open_db("real");

  /* The reference continuation (shared/models/README.md), resumed from 40 stored positions. */
  store_prompt(db, &m, ref_tokens, 40);
  refmodel_state *st;
  ASSERT(refmodel_state_new(rm, 0, &st) == REFMODEL_OK);
  int out[24];
  refkv_run r;
  RK_OK(refkv_continue(db, &m, st, ref_tokens, 41, 24, REFMODEL_TOKEN_BOS, out, &r));
  ASSERT_EQ(r.hit_tokens, 40);
  ASSERT_EQ(r.prefill_tokens, 1);
  ASSERT_EQ(r.n_generated, 24);
  for (int i = 0; i < 24; i++)
    ASSERT_EQ(out[i], ref_tokens[41 + i]);
  refmodel_state_free(st);
  check_same(db, &m, ref_tokens, 64, 32, 40);

  /* A TinyStories paragraph stored; a prompt extending it continues identically. */
  FILE *f = fopen(corpus, "rb");
  ASSERT(f != NULL);
  char text[4096];
  size_t len = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[len] = '\0';
  char *para_end = strstr(text, "\n\n");
  ASSERT(para_end != NULL);
  size_t plen = (size_t)(para_end - text);
  int ptoks[600], qtoks[600];
  size_t np = 0, nq = 0;
  ASSERT(refmodel_encode(tk, text, plen, REFMODEL_ENCODE_BOS, ptoks, 600, &np) == REFMODEL_OK);
  ASSERT(np > 20 && np < 300);
  memcpy(text + plen, "\nThen the sun", 13);
  ASSERT(refmodel_encode(tk, text, plen + 13, REFMODEL_ENCODE_BOS, qtoks, 600, &nq) == REFMODEL_OK);
  store_prompt(db, &m, ptoks, np);
  size_t common = 0;
  while (common < np && common < nq && ptoks[common] == qtoks[common])
    common++;
  ASSERT(common + 1 >= np); /* at most the last token re-merges with the extension */
  check_same(db, &m, qtoks, nq, 48, common);
  printf("  real: paragraph of %zu tokens stored; a %zu-token prompt extending it hit %zu\n", np,
         nq, common);

  /* What f16 and bf16 storage cost on real KV (first reference tokens as the prompt). */
  quality(rm, qtoks, nq, 48, 0.95, 1e-3);
  kvdb_close(db);
  refmodel_tokenizer_free(tk);
  refmodel_model_free(rm);
  return T_EXIT_PASS;
}

int main(int argc, char **argv)
{
  if (argc != 2 || (strcmp(argv[1], "tiny") != 0 && strcmp(argv[1], "real") != 0)) {
    fprintf(stderr, "usage: test_refkv tiny|real\n");
    return 2;
  }
  g_dir = t_tmpdir("refkv");
  int rc = strcmp(argv[1], "tiny") == 0 ? run_tiny() : run_real();
  t_rmdir(g_dir);
  if (rc == T_EXIT_PASS)
    printf("test_refkv %s: ok\n", argv[1]);
  return rc;
}
