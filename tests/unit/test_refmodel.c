/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_refmodel.c — tools/refmodel against the reference values of
 * shared/models/README.md (stories260K), plus KV restore, tokenizer round trips on TinyStories
 * lines, an independent naive llama2.c encoder, and malformed inputs built in memory from the
 * real files' bytes.
 *
 * The model is found through $KVDB_SHARED_DIR, then ../shared relative to the working directory.
 * When it is not found the test prints what it looked for and exits 77 (skipped).
 */
#define _POSIX_C_SOURCE 200809L
#include "refmodel.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_EXIT_SKIP 77

static int n_checks, n_failures;

/* The message arguments are evaluated only after cond, and only when it fails. */
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    n_checks++;                                                                                    \
    if (!(cond))                                                                                   \
      check_failed(#cond, __FILE__, __LINE__, __VA_ARGS__);                                        \
  } while (0)

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void
check_failed(const char *expr, const char *file, int line, const char *fmt, ...)
{
  n_failures++;
  fprintf(stderr, "%s:%d: FAILED: %s: ", file, line, expr);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " [last refmodel message: %s]\n", refmodel_errmsg());
}

/* Stop the whole test: the rest depends on this. */
static void require(int ok, const char *what)
{
  if (ok)
    return;
  fprintf(stderr, "FATAL: %s [%s]\n", what, refmodel_errmsg());
  exit(1);
}

/* ---- reference values (shared/models/README.md) ---------------------------------------- */

static const int ref_tokens[65] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421,
                                   395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411,
                                   322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370,
                                   432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312,
                                   432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

static const char ref_text[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily";

static const double ref_k[5][4] = {{-0.30671, -0.73156, 0.56442, -0.88139},
                                   {0.04123, 0.23824, 0.34656, -1.36424},
                                   {-1.53005, -1.83629, 6.50313, 2.49888},
                                   {-0.38391, 0.21529, -0.70239, 0.20109},
                                   {-0.92439, -0.40249, -1.08780, 2.30382}};
static const double ref_v[5][4] = {{-0.39030, 0.97949, -0.52503, 0.01568},
                                   {-0.01182, 1.34295, 0.10799, 0.83390},
                                   {0.00732, 0.39962, 0.26541, 0.06168},
                                   {-0.82194, -0.92844, 0.90341, 0.22743},
                                   {-0.57197, -0.32826, 0.36667, 0.36780}};
static const double ref_k_norm[5] = {22.78571, 32.45587, 29.55692, 30.96899, 23.20785};
static const double ref_v_norm[5] = {2.65303, 2.49522, 2.70739, 3.88238, 2.78802};
#define REF_K_SUMSQ 285418.48
#define REF_V_SUMSQ 2678.57

/* 1e-3 relative; the 1e-5 absolute term covers the 5-decimal rounding of the table. */
static int close_rel(double got, double want)
{
  return fabs(got - want) <= 1e-3 * fabs(want) + 1e-5;
}

/* ---- files ----------------------------------------------------------------------------- */

static char shared_dir[4096];

static int file_exists(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return 0;
  fclose(f);
  return 1;
}

static void find_shared_or_skip(void)
{
  const char *rel = "models/stories260K/stories260K.bin";
  char tried[2][4200];
  int n_tried = 0;
  const char *env = getenv("KVDB_SHARED_DIR");
  const char *candidates[2] = {env != NULL && env[0] != '\0' ? env : NULL, "../shared"};
  for (int i = 0; i < 2; i++) {
    if (candidates[i] == NULL)
      continue;
    snprintf(tried[n_tried], sizeof tried[n_tried], "%s/%s", candidates[i], rel);
    if (file_exists(tried[n_tried])) {
      snprintf(shared_dir, sizeof shared_dir, "%s", candidates[i]);
      return;
    }
    n_tried++;
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof cwd) == NULL)
    snprintf(cwd, sizeof cwd, "(unknown)");
  printf("test_refmodel: SKIP: stories260K.bin not found. Looked for:\n");
  if (env == NULL || env[0] == '\0')
    printf("  (KVDB_SHARED_DIR not set)\n");
  for (int i = 0; i < n_tried; i++)
    printf("  '%s'\n", tried[i]);
  printf("  (working directory '%s')\n", cwd);
  exit(T_EXIT_SKIP);
}

static void shared_path(char *out, size_t cap, const char *rel)
{
  snprintf(out, cap, "%s/%s", shared_dir, rel);
}

static unsigned char *read_all(const char *path, size_t *size)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n + 1);
  if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return NULL;
  }
  fclose(f);
  buf[n] = 0;
  *size = (size_t)n;
  return buf;
}

static void put_i32(unsigned char *p, int32_t v)
{
  uint32_t u;
  memcpy(&u, &v, 4);
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(u >> (8 * i));
}

static int32_t get_i32(const unsigned char *p)
{
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  int32_t v;
  memcpy(&v, &u, 4);
  return v;
}

static float get_f32(const unsigned char *p)
{
  uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  float v;
  memcpy(&v, &u, 4);
  return v;
}

static void put_f32(unsigned char *p, float f)
{
  uint32_t u;
  memcpy(&u, &f, 4);
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(u >> (8 * i));
}

static int contains(const char *s, const char *sub)
{
  return strstr(s, sub) != NULL;
}

/* ---- model tests ----------------------------------------------------------------------- */

static void test_config(const refmodel_model *m)
{
  const refmodel_config *c = refmodel_model_config(m);
  CHECK(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 5 && c->n_heads == 8 &&
            c->n_kv_heads == 4 && c->vocab_size == 512 && c->seq_len == 512 && c->head_size == 8 &&
            c->kv_dim == 32 && c->shared_classifier == 1,
        "config %d %d %d %d %d %d %d %d %d %d", c->dim, c->hidden_dim, c->n_layers, c->n_heads,
        c->n_kv_heads, c->vocab_size, c->seq_len, c->head_size, c->kv_dim, c->shared_classifier);
}

static void test_position0_logits(const refmodel_model *m)
{
  refmodel_state *st;
  require(refmodel_state_new(m, 8, &st) == 0, "state_new");
  CHECK(refmodel_state_max_pos(st) == 8, "max_pos %d", refmodel_state_max_pos(st));
  const float *logits = NULL;
  CHECK(refmodel_forward(st, REFMODEL_TOKEN_BOS, 0, &logits) == 0, "forward BOS");
  CHECK(logits == refmodel_state_logits(st), "logits pointer");
  int best = refmodel_argmax(logits, 512);
  int second = -1;
  for (int i = 0; i < 512; i++)
    if (i != best && (second < 0 || logits[i] > logits[second]))
      second = i;
  CHECK(best == 403, "top token %d", best);
  CHECK(second == 385, "second token %d", second);
  CHECK(fabs(logits[403] - 17.0235) <= 1e-3, "logit[403] = %.6f, want 17.0235", logits[403]);
  CHECK(fabs(logits[385] - 15.4062) <= 1e-3, "logit[385] = %.6f, want 15.4062", logits[385]);

  /* log-softmax: normalized, differences kept, in place == out of place, KL(p||p) = 0. */
  float lp[512], lp2[512];
  CHECK(refmodel_log_softmax(logits, 512, lp) == 0, "log_softmax");
  double total = 0, kl = 0;
  for (int i = 0; i < 512; i++) {
    total += exp((double)lp[i]);
    kl += exp((double)lp[i]) * ((double)lp[i] - (double)lp[i]);
  }
  CHECK(fabs(total - 1.0) < 1e-5, "sum of probabilities %.9f", total);
  CHECK(kl == 0.0, "KL(p||p) = %g", kl);
  CHECK(fabs((lp[403] - lp[385]) - (17.0235 - 15.4062)) <= 2e-3, "log-prob gap %.6f",
        (double)(lp[403] - lp[385]));
  CHECK(lp[403] < 0 && lp[403] > -1.0f, "log p(403) = %f", (double)lp[403]);
  memcpy(lp2, logits, sizeof lp2);
  CHECK(refmodel_log_softmax(lp2, 512, lp2) == 0 && memcmp(lp, lp2, sizeof lp) == 0,
        "in-place log_softmax differs");
  CHECK(refmodel_log_softmax(NULL, 512, lp) == REFMODEL_EINVAL, "log_softmax NULL");
  CHECK(refmodel_log_softmax(logits, 0, lp) == REFMODEL_EINVAL, "log_softmax n=0");
  refmodel_state_free(st);
}

/* Greedy generation from BOS, K/V at position 0, sums of squares over 64 positions. */
static refmodel_state *test_generate_and_kv(const refmodel_model *m)
{
  refmodel_state *st;
  require(refmodel_state_new(m, 0, &st) == 0, "state_new");
  CHECK(refmodel_state_max_pos(st) == 512, "default max_pos %d", refmodel_state_max_pos(st));
  int out[64], n_out = -1;
  CHECK(refmodel_generate(st, REFMODEL_TOKEN_BOS, 0, 64, REFMODEL_TOKEN_BOS, out, &n_out) == 0,
        "generate");
  CHECK(n_out == 64, "generated %d tokens", n_out);
  for (int i = 0; i < 64 && i < n_out; i++)
    CHECK(out[i] == ref_tokens[i + 1], "token %d: got %d, want %d", i + 1, out[i],
          ref_tokens[i + 1]);

  for (int l = 0; l < 5; l++) {
    const float *k = refmodel_state_key(st, l, 0), *v = refmodel_state_value(st, l, 0);
    require(k != NULL && v != NULL, "key/value accessor");
    double kn = 0, vn = 0;
    for (int i = 0; i < 32; i++) {
      kn += (double)k[i] * k[i];
      vn += (double)v[i] * v[i];
    }
    for (int i = 0; i < 4; i++) {
      CHECK(close_rel(k[i], ref_k[l][i]), "layer %d k[%d] = %.6f, want %.5f", l, i, k[i],
            ref_k[l][i]);
      CHECK(close_rel(v[i], ref_v[l][i]), "layer %d v[%d] = %.6f, want %.5f", l, i, v[i],
            ref_v[l][i]);
    }
    CHECK(close_rel(sqrt(kn), ref_k_norm[l]), "layer %d |k| = %.6f, want %.5f", l, sqrt(kn),
          ref_k_norm[l]);
    CHECK(close_rel(sqrt(vn), ref_v_norm[l]), "layer %d |v| = %.6f, want %.5f", l, sqrt(vn),
          ref_v_norm[l]);
  }

  /* Layout: [layer][pos][kv_dim], positions contiguous within a layer. */
  CHECK(refmodel_state_key(st, 2, 7) == refmodel_state_key(st, 2, 0) + 7 * 32, "K pos stride");
  CHECK(refmodel_state_key(st, 3, 0) == refmodel_state_key(st, 2, 0) + 512 * 32, "K layer stride");
  CHECK(refmodel_state_value(st, 4, 511) == refmodel_state_value(st, 0, 0) + (4 * 512 + 511) * 32,
        "V layout");

  double ks = 0, vs = 0;
  for (int l = 0; l < 5; l++)
    for (int p = 0; p < 64; p++) {
      const float *k = refmodel_state_key(st, l, p), *v = refmodel_state_value(st, l, p);
      for (int i = 0; i < 32; i++) {
        ks += (double)k[i] * k[i];
        vs += (double)v[i] * v[i];
      }
    }
  CHECK(close_rel(ks, REF_K_SUMSQ), "K sum of squares %.3f, want %.2f", ks, REF_K_SUMSQ);
  CHECK(close_rel(vs, REF_V_SUMSQ), "V sum of squares %.4f, want %.2f", vs, REF_V_SUMSQ);
  /* Position 64 was never fed (the last generated token is not fed). */
  const float *k64 = refmodel_state_key(st, 0, 64);
  int zero = 1;
  for (int i = 0; i < 32; i++)
    zero &= k64[i] == 0.0f;
  CHECK(zero, "position 64 was written");
  return st;
}

/* Restore positions [0, 40) into a fresh state and continue: identical tokens, K and V. */
static void test_restore(const refmodel_model *m, refmodel_state *ref_st)
{
  const int p = 40;
  refmodel_state *st;
  require(refmodel_state_new(m, 0, &st) == 0, "state_new");
  for (int l = 0; l < 5; l++) {
    memcpy(refmodel_state_key(st, l, 0), refmodel_state_key(ref_st, l, 0),
           (size_t)p * 32 * sizeof(float));
    memcpy(refmodel_state_value(st, l, 0), refmodel_state_value(ref_st, l, 0),
           (size_t)p * 32 * sizeof(float));
  }
  int out[24], n_out = 0;
  CHECK(refmodel_generate(st, ref_tokens[p], p, 24, -1, out, &n_out) == 0 && n_out == 24,
        "generate after restore");
  for (int i = 0; i < 24; i++)
    CHECK(out[i] == ref_tokens[p + 1 + i], "restored token %d: got %d, want %d", p + 1 + i, out[i],
          ref_tokens[p + 1 + i]);
  for (int l = 0; l < 5; l++)
    CHECK(memcmp(refmodel_state_key(st, l, p), refmodel_state_key(ref_st, l, p),
                 24 * 32 * sizeof(float)) == 0 &&
              memcmp(refmodel_state_value(st, l, p), refmodel_state_value(ref_st, l, p),
                     24 * 32 * sizeof(float)) == 0,
          "layer %d: K/V after restore differ", l);
  CHECK(memcmp(refmodel_state_logits(st), refmodel_state_logits(ref_st), 512 * sizeof(float)) == 0,
        "final logits after restore differ");
  refmodel_state_free(st);

  /* Control: the same continuation without the restored prefix must not match. */
  require(refmodel_state_new(m, 0, &st) == 0, "state_new");
  CHECK(refmodel_generate(st, ref_tokens[p], p, 24, -1, out, &n_out) == 0, "generate");
  int same = 1;
  for (int i = 0; i < 24; i++)
    same &= out[i] == ref_tokens[p + 1 + i];
  CHECK(!same, "continuation without the prefix KV still matched");
  refmodel_state_free(st);
}

static void test_prefill(const refmodel_model *m, refmodel_state *ref_st)
{
  refmodel_state *st;
  require(refmodel_state_new(m, 64, &st) == 0, "state_new");
  const float *logits = NULL;
  CHECK(refmodel_prefill(st, ref_tokens, 40, 0, &logits) == 0, "prefill 0..40");
  CHECK(refmodel_argmax(logits, 512) == ref_tokens[40], "argmax after 40: %d",
        refmodel_argmax(logits, 512));
  CHECK(refmodel_prefill(st, ref_tokens + 40, 24, 40, &logits) == 0, "prefill 40..64");
  CHECK(refmodel_argmax(logits, 512) == ref_tokens[64], "argmax after 64: %d",
        refmodel_argmax(logits, 512));
  CHECK(memcmp(logits, refmodel_state_logits(ref_st), 512 * sizeof(float)) == 0,
        "prefill logits differ from generation's");
  for (int l = 0; l < 5; l++)
    CHECK(memcmp(refmodel_state_key(st, l, 0), refmodel_state_key(ref_st, l, 0),
                 64 * 32 * sizeof(float)) == 0,
          "layer %d: prefill K differs", l);

  /* Argument errors leave the state unchanged. */
  float before[32];
  memcpy(before, refmodel_state_key(st, 0, 10), sizeof before);
  int bad[3] = {5, 6, 512};
  CHECK(refmodel_prefill(st, bad, 3, 10, NULL) == REFMODEL_EINVAL, "bad token accepted");
  CHECK(contains(refmodel_errmsg(), "token 512"), "message '%s'", refmodel_errmsg());
  CHECK(memcmp(before, refmodel_state_key(st, 0, 10), sizeof before) == 0, "state changed");
  CHECK(refmodel_prefill(st, ref_tokens, 3, 62, NULL) == REFMODEL_EINVAL, "past max_pos");
  CHECK(refmodel_prefill(st, ref_tokens, 0, 0, NULL) == REFMODEL_EINVAL, "n = 0");
  CHECK(refmodel_forward(st, -1, 0, NULL) == REFMODEL_EINVAL, "token -1");
  CHECK(refmodel_forward(st, 1, 64, NULL) == REFMODEL_EINVAL, "pos 64 of 64");
  CHECK(contains(refmodel_errmsg(), "[64, 65)"), "message '%s'", refmodel_errmsg());
  CHECK(refmodel_forward(st, 1, -1, NULL) == REFMODEL_EINVAL, "pos -1");
  int out[4];
  CHECK(refmodel_generate(st, 1, 62, 4, -1, out, NULL) == REFMODEL_EINVAL, "generate past end");
  CHECK(refmodel_generate(st, 1, 0, 4, -1, NULL, NULL) == REFMODEL_EINVAL, "generate NULL");
  CHECK(refmodel_state_key(st, 5, 0) == NULL, "layer 5");
  CHECK(refmodel_state_value(st, 0, 64) == NULL, "pos 64");
  CHECK(refmodel_state_key(st, -1, 0) == NULL && contains(refmodel_errmsg(), "layer -1"),
        "layer -1");
  refmodel_state *bad_st = (refmodel_state *)&bad;
  CHECK(refmodel_state_new(m, -1, &bad_st) == REFMODEL_EINVAL && bad_st == NULL, "max_pos -1");
  CHECK(refmodel_state_new(NULL, 4, &bad_st) == REFMODEL_EINVAL, "model NULL");
  refmodel_state_free(st);
  refmodel_state_free(NULL);

  /* Generation stops before a stop token: stop at the 3rd reference token. */
  require(refmodel_state_new(m, 16, &st) == 0, "state_new");
  int n_out = -1;
  CHECK(refmodel_generate(st, 1, 0, 10, ref_tokens[3], out, &n_out) == 0 && n_out == 2 &&
            out[0] == ref_tokens[1] && out[1] == ref_tokens[2],
        "stop token: n_out %d", n_out);
  refmodel_state_free(st);
}

static void test_argmax(void)
{
  float v[5] = {1, 3, 3, 2, -1};
  CHECK(refmodel_argmax(v, 5) == 1, "tie goes to lowest index");
  float w[3] = {NAN, 1, 2};
  CHECK(refmodel_argmax(w, 3) == 2, "NaN must not win");
  float z[2] = {NAN, NAN};
  CHECK(refmodel_argmax(z, 2) == 0, "all NaN");
  CHECK(refmodel_argmax(v, 0) == REFMODEL_EINVAL, "n = 0");
  CHECK(refmodel_argmax(NULL, 3) == REFMODEL_EINVAL, "NULL");
}

/* Checkpoint from the real bytes with a changed header: n_kv_heads etc. */
static int load_patched(const unsigned char *bin, size_t size, int field, int32_t value,
                        refmodel_model **out)
{
  unsigned char *copy = malloc(size);
  memcpy(copy, bin, size);
  put_i32(copy + 4 * field, value);
  int rc = refmodel_model_load_buffer(copy, size, "patched.bin", out);
  free(copy);
  return rc;
}

static void test_malformed_checkpoints(const refmodel_model *good, const unsigned char *bin,
                                       size_t size)
{
  refmodel_model *m = (refmodel_model *)&m;
  int rc = refmodel_model_load_buffer(bin, size - 1, "x.bin", &m);
  CHECK(rc == REFMODEL_ETRUNCATED && m == NULL, "truncated by 1: %s", refmodel_strerror(rc));
  CHECK(strcmp(refmodel_errmsg(), "'x.bin': truncated: header says 1056540 bytes, file has "
                                  "1056539") == 0,
        "message '%s'", refmodel_errmsg());
  rc = refmodel_model_load_buffer(bin, 1000, NULL, &m);
  CHECK(rc == REFMODEL_ETRUNCATED && contains(refmodel_errmsg(), "'(buffer)'") &&
            contains(refmodel_errmsg(), "file has 1000"),
        "truncated to 1000: '%s'", refmodel_errmsg());
  rc = refmodel_model_load_buffer(bin, 27, "short", &m);
  CHECK(rc == REFMODEL_ETRUNCATED && contains(refmodel_errmsg(), "header"), "27 bytes: '%s'",
        refmodel_errmsg());
  rc = refmodel_model_load_buffer(NULL, 0, "empty", &m);
  CHECK(rc == REFMODEL_ETRUNCATED, "empty: %s", refmodel_strerror(rc));

  unsigned char *longer = malloc(size + 1);
  memcpy(longer, bin, size);
  longer[size] = 0;
  rc = refmodel_model_load_buffer(longer, size + 1, "long.bin", &m);
  CHECK(rc == REFMODEL_EFORMAT && contains(refmodel_errmsg(), "1 extra"), "1 extra byte: '%s'",
        refmodel_errmsg());
  free(longer);

  struct {
    int field;
    int32_t value;
    const char *word;
  } bad[] = {
      {3, 0, "n_heads = 0"},    {4, 3, "n_kv_heads = 3 does not divide"},
      {4, 0, "n_kv_heads = 0"}, {4, 16, "n_kv_heads = 16"},
      {3, 64, "odd"},           {3, 7, "n_heads = 7 does not divide dim"},
      {0, 0, "dim = 0"},        {0, 65537, "dim = 65537"},
      {0, -64, "dim = -64"},    {1, 0, "hidden_dim = 0"},
      {2, 0, "n_layers = 0"},   {2, 1025, "n_layers = 1025"},
      {5, 0, "vocab_size = 0"}, {5, INT32_MIN, "vocab_size = -2147483648"},
      {6, 0, "seq_len = 0"},    {6, INT32_MAX, "seq_len = 2147483647"},
      {2, 4, "header says"},    {6, 511, "header says"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    rc = load_patched(bin, size, bad[i].field, bad[i].value, &m);
    CHECK(rc == REFMODEL_EFORMAT || rc == REFMODEL_ETRUNCATED, "field %d = %d: rc %s", bad[i].field,
          (int)bad[i].value, refmodel_strerror(rc));
    CHECK(contains(refmodel_errmsg(), bad[i].word) && contains(refmodel_errmsg(), "'patched.bin'"),
          "field %d = %d: message '%s' lacks '%s'", bad[i].field, (int)bad[i].value,
          refmodel_errmsg(), bad[i].word);
  }
  /* More layers than the file holds is a truncation; fewer leaves extra bytes. */
  CHECK(load_patched(bin, size, 2, 6, &m) == REFMODEL_ETRUNCATED, "6 layers");
  CHECK(load_patched(bin, size, 2, 4, &m) == REFMODEL_EFORMAT, "4 layers");
  /* Negative vocab without a wcls at the end: truncated by vocab * dim floats. */
  CHECK(load_patched(bin, size, 5, -512, &m) == REFMODEL_ETRUNCATED, "vocab -512 without wcls");

  /* A NaN and an infinity among the weights. */
  unsigned char *copy = malloc(size);
  memcpy(copy, bin, size);
  size_t wq_off = 28 + 4 * (512 * 64 + 5 * 64); /* token_embedding, rms_att */
  put_f32(copy + wq_off + 4 * 3, NAN);
  rc = refmodel_model_load_buffer(copy, size, "nan.bin", &m);
  CHECK(rc == REFMODEL_EFORMAT && contains(refmodel_errmsg(), "wq[3] is not finite"), "NaN: '%s'",
        refmodel_errmsg());
  memcpy(copy, bin, size);
  put_f32(copy + size - 4, INFINITY);
  rc = refmodel_model_load_buffer(copy, size, "inf.bin", &m);
  CHECK(rc == REFMODEL_EFORMAT && contains(refmodel_errmsg(), "freq_cis_imag[2047]"), "inf: '%s'",
        refmodel_errmsg());
  free(copy);

  /* Unshared classifier: vocab_size -512 plus a wcls equal to the embedding = same logits. */
  unsigned char *unshared = malloc(size + 512 * 64 * 4);
  memcpy(unshared, bin, size);
  memcpy(unshared + size, bin + 28, 512 * 64 * 4);
  put_i32(unshared + 20, -512);
  rc = refmodel_model_load_buffer(unshared, size + 512 * 64 * 4, "unshared.bin", &m);
  CHECK(rc == REFMODEL_OK, "unshared classifier: %s", refmodel_errmsg());
  if (rc == REFMODEL_OK) {
    CHECK(refmodel_model_config(m)->shared_classifier == 0 &&
              refmodel_model_config(m)->vocab_size == 512,
          "unshared config");
    refmodel_state *a = NULL, *b = NULL;
    require(refmodel_state_new(m, 4, &a) == 0 && refmodel_state_new(good, 4, &b) == 0, "states");
    const float *la, *lb;
    CHECK(refmodel_forward(a, 1, 0, &la) == 0 && refmodel_forward(b, 1, 0, &lb) == 0 &&
              memcmp(la, lb, 512 * sizeof(float)) == 0,
          "unshared logits differ");
    /* Prove wcls is used: zero its row 403 and that logit becomes 0. */
    refmodel_state_free(a);
    refmodel_model_free(m);
    memset(unshared + size + 403 * 64 * 4, 0, 64 * 4);
    require(refmodel_model_load_buffer(unshared, size + 512 * 64 * 4, "u2", &m) == 0, "u2");
    require(refmodel_state_new(m, 4, &a) == 0, "state");
    require(refmodel_forward(a, 1, 0, &la) == 0, "forward u2");
    CHECK(la[403] == 0.0f && la[385] == lb[385], "wcls row 403 not used: %f", (double)la[403]);
    refmodel_state_free(a);
    refmodel_state_free(b);
    refmodel_model_free(m);
  }
  free(unshared);

  /* From a path: missing file, truncated file. */
  rc = refmodel_model_load("/nonexistent/dir/model.bin", &m);
  CHECK(rc == REFMODEL_EIO && contains(refmodel_errmsg(), "'/nonexistent/dir/model.bin'"),
        "missing: '%s'", refmodel_errmsg());
  char tmp[] = "/tmp/test_refmodel_XXXXXX";
  int fd = mkstemp(tmp);
  require(fd >= 0, "mkstemp");
  require(write(fd, bin, 1000) == 1000, "write");
  close(fd);
  rc = refmodel_model_load(tmp, &m);
  char want[256];
  snprintf(want, sizeof want, "'%s': truncated: header says 1056540 bytes, file has 1000", tmp);
  CHECK(rc == REFMODEL_ETRUNCATED && strcmp(refmodel_errmsg(), want) == 0, "file: '%s'",
        refmodel_errmsg());
  FILE *f = fopen(tmp, "wb");
  require(f != NULL && fwrite(bin, 1, 10, f) == 10 && fclose(f) == 0, "rewrite temp file");
  rc = refmodel_model_load(tmp, &m);
  snprintf(want, sizeof want, "'%s': truncated: 10 bytes, the header alone is 28", tmp);
  CHECK(rc == REFMODEL_ETRUNCATED && strcmp(refmodel_errmsg(), want) == 0, "10-byte file: '%s'",
        refmodel_errmsg());
  remove(tmp);
  CHECK(refmodel_model_load(NULL, &m) == REFMODEL_EINVAL, "NULL path");
  rc = refmodel_model_load(shared_dir, &m);
  CHECK(rc == REFMODEL_EIO && m == NULL, "a directory: %s '%s'", refmodel_strerror(rc),
        refmodel_errmsg());
  CHECK(refmodel_model_load_buffer(bin, size, "x", NULL) == REFMODEL_EINVAL, "NULL out");
  refmodel_model_free(NULL);

  CHECK(strcmp(refmodel_strerror(REFMODEL_ETRUNCATED), "REFMODEL_ETRUNCATED") == 0 &&
            strcmp(refmodel_strerror(REFMODEL_OK), "REFMODEL_OK") == 0 &&
            strcmp(refmodel_strerror(REFMODEL_EIO), "REFMODEL_EIO") == 0 &&
            strcmp(refmodel_strerror(REFMODEL_ENOMEM), "REFMODEL_ENOMEM") == 0 &&
            strcmp(refmodel_strerror(REFMODEL_EFORMAT), "REFMODEL_EFORMAT") == 0 &&
            strcmp(refmodel_strerror(REFMODEL_EINVAL), "REFMODEL_EINVAL") == 0 &&
            strcmp(refmodel_strerror(REFMODEL_ENOSPC), "REFMODEL_ENOSPC") == 0 &&
            strcmp(refmodel_strerror(42), "REFMODEL_E?") == 0,
        "strerror");
}

/* ---- tokenizer tests ------------------------------------------------------------------- */

/* An independent parse of tok512.bin and the plain O(n^2) llama2.c encoder, to compare with. */
struct naive_vocab {
  int n;
  const char *piece[512];
  int len[512];
  float score[512];
  size_t offset[512]; /* of each record in the file */
};

static void naive_parse(const unsigned char *d, size_t size, struct naive_vocab *v)
{
  size_t off = 4;
  v->n = 0;
  while (off < size && v->n < 512) {
    v->offset[v->n] = off;
    v->score[v->n] = get_f32(d + off);
    v->len[v->n] = get_i32(d + off + 4);
    v->piece[v->n] = (const char *)(d + off + 8);
    off += 8 + (size_t)v->len[v->n];
    v->n++;
  }
}

static int naive_lookup(const struct naive_vocab *v, const char *s, int len)
{
  for (int i = 0; i < v->n; i++)
    if (v->len[i] == len && memcmp(v->piece[i], s, (size_t)len) == 0)
      return i;
  return -1;
}

/* llama2.c encode() with BOS kept out of the merges; returns the count. */
static size_t naive_encode(const struct naive_vocab *v, const char *text, size_t len, int *out)
{
  size_t n = 0;
  out[n++] = 1;
  int *t = out + 1;
  size_t nt = 0;
  if (len > 0)
    t[nt++] = naive_lookup(v, " ", 1);
  for (size_t i = 0; i < len;) {
    size_t k = 1;
    while (k < 4 && i + k < len && ((unsigned char)text[i + k] & 0xC0) == 0x80)
      k++;
    int id = naive_lookup(v, text + i, (int)k);
    if (id >= 0)
      t[nt++] = id;
    else
      for (size_t j = 0; j < k; j++)
        t[nt++] = (unsigned char)text[i + j] + 3;
    i += k;
  }
  char buf[64];
  for (;;) {
    float best = -1e10f;
    int best_id = -1;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < nt; i++) {
      int la = v->len[t[i]], lb = v->len[t[i + 1]];
      memcpy(buf, v->piece[t[i]], (size_t)la);
      memcpy(buf + la, v->piece[t[i + 1]], (size_t)lb);
      int id = naive_lookup(v, buf, la + lb);
      if (id >= 0 && v->score[id] > best) {
        best = v->score[id];
        best_id = id;
        best_i = i;
      }
    }
    if (best_id < 0)
      break;
    t[best_i] = best_id;
    memmove(t + best_i + 1, t + best_i + 2, (nt - best_i - 2) * sizeof *t);
    nt--;
  }
  return n + nt;
}

static void round_trip(const refmodel_tokenizer *tok, const struct naive_vocab *nv,
                       const char *text, size_t len, size_t *n_tokens_total)
{
  size_t cap = refmodel_encode_bound(len);
  int *tokens = malloc(cap * sizeof *tokens), *naive = malloc(cap * sizeof *naive);
  char *back = malloc(len + 1);
  size_t n = 0, back_len = 0;
  int rc = refmodel_encode(tok, text, len, REFMODEL_ENCODE_BOS, tokens, cap, &n);
  CHECK(rc == 0 && n >= 1 && tokens[0] == 1, "encode '%.40s': %s", text, refmodel_strerror(rc));
  if (rc == 0) {
    size_t nn = naive_encode(nv, text, len, naive);
    CHECK(nn == n && memcmp(naive, tokens, n * sizeof *tokens) == 0,
          "'%.60s': %zu tokens, naive llama2.c encoder %zu", text, n, nn);
    rc = refmodel_detokenize(tok, REFMODEL_TOKEN_BOS, tokens + 1, n - 1, back, len + 1, &back_len);
    CHECK(rc == 0 && back_len == len && memcmp(back, text, len) == 0,
          "round trip of '%.60s' gave '%.*s'", text, (int)(back_len < 60 ? back_len : 60), back);
    *n_tokens_total += n - 1;
  }
  free(tokens);
  free(naive);
  free(back);
}

static void test_tokenizer(const unsigned char *tbin, size_t tsize)
{
  char path[4200];
  shared_path(path, sizeof path, "models/stories260K/tok512.bin");
  refmodel_tokenizer *tok;
  int rc = refmodel_tokenizer_load(path, 512, &tok);
  require(rc == 0, "load tok512.bin");
  CHECK(refmodel_tokenizer_vocab_size(tok) == 512, "vocab %d", refmodel_tokenizer_vocab_size(tok));
  struct naive_vocab nv;
  naive_parse(tbin, tsize, &nv);
  require(nv.n == 512, "naive parse");

  /* The reference story decodes to the README's text. */
  char text[1024];
  size_t len = 0;
  CHECK(refmodel_detokenize(tok, 1, ref_tokens + 1, 64, text, sizeof text, &len) == 0 &&
            len == strlen(ref_text) && memcmp(text, ref_text, len) == 0,
        "reference tokens decode to '%.*s'", (int)len, text);

  /* Encoding the first sentence gives the model's own tokens. */
  const char *s = "Once upon a time, there was a little girl named Lily.";
  int tokens[128];
  size_t n = 0;
  CHECK(refmodel_encode(tok, s, strlen(s), REFMODEL_ENCODE_BOS, tokens, 128, &n) == 0, "encode");
  CHECK(n == 16 && memcmp(tokens, ref_tokens, 16 * sizeof(int)) == 0,
        "encode gave %zu tokens: %d %d %d %d ...", n, tokens[0], tokens[1], tokens[2], tokens[3]);
  size_t total = 0;
  round_trip(tok, &nv, s, strlen(s), &total);

  /* Flags, bounds, odd bytes. */
  CHECK(refmodel_encode(tok, s, strlen(s), REFMODEL_ENCODE_BOS | REFMODEL_ENCODE_EOS, tokens, 128,
                        &n) == 0 &&
            n == 17 && tokens[16] == 2,
        "EOS");
  CHECK(refmodel_encode(tok, s, strlen(s), 0, tokens, 128, &n) == 0 && n == 15 && tokens[0] == 403,
        "no BOS");
  CHECK(refmodel_encode(tok, s, strlen(s), REFMODEL_ENCODE_BOS, tokens, 15, &n) ==
                REFMODEL_ENOSPC &&
            n == 16,
        "ENOSPC n=%zu", n);
  CHECK(refmodel_encode(tok, s, strlen(s), 4, tokens, 128, &n) == REFMODEL_EINVAL, "flag 4");
  CHECK(refmodel_encode(tok, "", 0, REFMODEL_ENCODE_BOS, tokens, 128, &n) == 0 && n == 1 &&
            tokens[0] == 1,
        "empty text");
  CHECK(refmodel_encode(tok, NULL, 0, 0, NULL, 0, &n) == 0 && n == 0, "nothing at all");
  CHECK(refmodel_encode(tok, NULL, 3, 0, tokens, 128, &n) == REFMODEL_EINVAL, "NULL text");
  CHECK(refmodel_encode_bound(10) == 13, "bound");
  const char odd[] = "\xe2\x80\x9cHi!\xe2\x80\x9d \x01\x00\xff\x80 <0x41> caf\xc3\xa9\n\n  x";
  round_trip(tok, &nv, odd, sizeof odd - 1, &total);
  round_trip(tok, &nv, " leading space", 14, &total);

  const char *piece;
  size_t plen;
  CHECK(refmodel_decode(tok, 1, 403, &piece, &plen) == 0 && plen == 4 &&
            memcmp(piece, "Once", 4) == 0,
        "decode 403 after BOS: '%.*s'", (int)plen, piece);
  CHECK(refmodel_decode(tok, 7, 403, &piece, &plen) == 0 && plen == 5 &&
            memcmp(piece, " Once", 5) == 0,
        "decode 403 after 7: '%.*s'", (int)plen, piece);
  CHECK(refmodel_decode(tok, 1, 0x41 + 3, &piece, &plen) == 0 && plen == 1 && piece[0] == 'A',
        "byte token");
  CHECK(refmodel_decode(tok, 0, 1, &piece, &plen) == 0 && plen == 5 &&
            memcmp(piece, "\n<s>\n", 5) == 0,
        "BOS piece");
  CHECK(refmodel_decode(tok, 0, 512, &piece, &plen) == REFMODEL_EINVAL, "token 512");
  CHECK(refmodel_decode(tok, 0, -1, &piece, &plen) == REFMODEL_EINVAL, "token -1");
  int bad_tokens[2] = {403, 600};
  char small[4];
  CHECK(refmodel_detokenize(tok, 1, bad_tokens, 2, text, sizeof text, &len) == REFMODEL_EINVAL,
        "detokenize 600");
  CHECK(refmodel_detokenize(tok, 1, ref_tokens + 1, 3, small, sizeof small, &len) ==
                REFMODEL_ENOSPC &&
            len == 11 && memcmp(small, "Once", 4) == 0,
        "detokenize ENOSPC len=%zu", len);

  /* A few hundred TinyStories lines. */
  char cpath[4200];
  shared_path(cpath, sizeof cpath, "corpora/tinystories/tinystories_validation_head.txt");
  size_t csize;
  char *corpus = (char *)read_all(cpath, &csize);
  CHECK(corpus != NULL, "cannot read '%s'", cpath);
  if (corpus != NULL) {
    int lines = 0;
    size_t bytes = 0;
    total = 0;
    for (char *p = corpus; p < corpus + csize && lines < 400;) {
      char *e = memchr(p, '\n', (size_t)(corpus + csize - p));
      size_t l = e != NULL ? (size_t)(e - p) : (size_t)(corpus + csize - p);
      if (l > 0) {
        round_trip(tok, &nv, p, l, &total);
        lines++;
        bytes += l;
      }
      p += l + 1;
    }
    printf("tinystories: %d lines, %zu bytes, %zu tokens (%.2f bytes/token)\n", lines, bytes, total,
           (double)bytes / (double)total);
    CHECK(lines == 400, "only %d lines", lines);
    CHECK((double)bytes / (double)total > 1.8 && (double)bytes / (double)total < 2.4,
          "%.3f bytes per token", (double)bytes / (double)total);
    /* The whole head as one text (O(n log n) merge), round trip and token count. */
    size_t cap = refmodel_encode_bound(200000);
    int *big = malloc(cap * sizeof *big);
    char *back = malloc(200000);
    CHECK(refmodel_encode(tok, corpus, 200000, 0, big, cap, &n) == 0, "encode 200000 bytes");
    CHECK(refmodel_detokenize(tok, 1, big, n, back, 200000, &len) == 0 && len == 200000 &&
              memcmp(back, corpus, len) == 0,
          "200000-byte round trip");
    printf("tinystories: first 200000 bytes as one text: %zu tokens\n", n);
    free(big);
    free(back);
    free(corpus);
  }
  refmodel_tokenizer_free(tok);
  refmodel_tokenizer_free(NULL);

  /* Loading: vocab size checks, malformed copies of the real bytes. */
  CHECK(refmodel_tokenizer_load_buffer(tbin, tsize, "t", 0, &tok) == 0 &&
            refmodel_tokenizer_vocab_size(tok) == 512,
        "vocab 0 reads all");
  refmodel_tokenizer_free(tok);
  tok = (refmodel_tokenizer *)&tok;
  rc = refmodel_tokenizer_load_buffer(tbin, tsize, "t", 511, &tok);
  CHECK(rc == REFMODEL_EFORMAT && tok == NULL && contains(refmodel_errmsg(), "left after"),
        "511: '%s'", refmodel_errmsg());
  rc = refmodel_tokenizer_load_buffer(tbin, tsize, "t", 513, &tok);
  CHECK(rc == REFMODEL_ETRUNCATED && contains(refmodel_errmsg(), "token 512"), "513: '%s'",
        refmodel_errmsg());
  rc = refmodel_tokenizer_load_buffer(tbin, tsize - 1, "tok.bin", 512, &tok);
  CHECK(rc == REFMODEL_ETRUNCATED &&
            contains(refmodel_errmsg(), "'tok.bin': truncated: token 511 needs"),
        "truncated by 1: '%s'", refmodel_errmsg());
  rc = refmodel_tokenizer_load_buffer(tbin, tsize - 1, "tok.bin", 0, &tok);
  CHECK(rc == REFMODEL_ETRUNCATED, "truncated by 1, vocab 0: %s", refmodel_strerror(rc));
  rc = refmodel_tokenizer_load_buffer(tbin, 3, "tok.bin", 0, &tok);
  CHECK(rc == REFMODEL_ETRUNCATED, "3 bytes");
  rc = refmodel_tokenizer_load_buffer(tbin, 4, "tok.bin", 0, &tok);
  CHECK(rc == REFMODEL_EFORMAT && contains(refmodel_errmsg(), "no token"), "4 bytes: '%s'",
        refmodel_errmsg());
  rc = refmodel_tokenizer_load_buffer(tbin, tsize, "tok.bin", -1, &tok);
  CHECK(rc == REFMODEL_EINVAL, "vocab -1");
  unsigned char *copy = malloc(tsize);
  struct {
    size_t off;
    int is_float;
    float f;
    int32_t i;
    int want;
    const char *word;
  } bad[] = {
      {nv.offset[5] + 4, 0, 0, -1, REFMODEL_EFORMAT, "token 5: negative piece length -1"},
      {nv.offset[300] + 4, 0, 0, 8, REFMODEL_EFORMAT, "exceeds max_token_length 7"},
      {nv.offset[511] + 4, 0, 0, 1000, REFMODEL_EFORMAT, "exceeds"},
      {nv.offset[400], 1, NAN, 0, REFMODEL_EFORMAT, "token 400: score is not finite"},
      {nv.offset[401], 1, -INFINITY, 0, REFMODEL_EFORMAT, "not finite"},
      {0, 0, 0, 0, REFMODEL_EFORMAT, "max_token_length 0"},
      {0, 0, 0, -5, REFMODEL_EFORMAT, "max_token_length -5"},
      {0, 0, 0, 4097, REFMODEL_EFORMAT, "max_token_length 4097"},
      {0, 0, 0, 5, REFMODEL_EFORMAT, "exceeds max_token_length 5"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(copy, tbin, tsize);
    if (bad[i].is_float)
      put_f32(copy + bad[i].off, bad[i].f);
    else
      put_i32(copy + bad[i].off, bad[i].i);
    rc = refmodel_tokenizer_load_buffer(copy, tsize, "bad-tok.bin", 512, &tok);
    CHECK(rc == bad[i].want && tok == NULL, "case %zu: rc %s", i, refmodel_strerror(rc));
    CHECK(contains(refmodel_errmsg(), bad[i].word) && contains(refmodel_errmsg(), "'bad-tok.bin'"),
          "case %zu: message '%s' lacks '%s'", i, refmodel_errmsg(), bad[i].word);
  }
  free(copy);
  rc = refmodel_tokenizer_load("/nonexistent/tok.bin", 512, &tok);
  CHECK(rc == REFMODEL_EIO && contains(refmodel_errmsg(), "'/nonexistent/tok.bin'"),
        "missing: '%s'", refmodel_errmsg());
  CHECK(refmodel_tokenizer_load(path, 512, NULL) == REFMODEL_EINVAL, "NULL out");
  rc = refmodel_tokenizer_load(shared_dir, 512, &tok);
  CHECK(rc == REFMODEL_EIO && tok == NULL, "a directory: %s '%s'", refmodel_strerror(rc),
        refmodel_errmsg());

  /* A tokenizer too small for byte fallback: encode must refuse, not index out of bounds. */
  unsigned char tiny[4 + 3 * 9];
  put_i32(tiny, 1);
  for (int i = 0; i < 3; i++) {
    put_f32(tiny + 4 + 9 * i, 0.0f);
    put_i32(tiny + 8 + 9 * i, 1);
    tiny[12 + 9 * i] = (unsigned char)"ab "[i];
  }
  require(refmodel_tokenizer_load_buffer(tiny, sizeof tiny, "tiny", 3, &tok) == 0, "tiny");
  CHECK(refmodel_encode(tok, "ab", 2, REFMODEL_ENCODE_BOS | REFMODEL_ENCODE_EOS, tokens, 128, &n) ==
                0 &&
            n == 5 && tokens[0] == 1 && tokens[1] == 2 && tokens[2] == 0 && tokens[3] == 1 &&
            tokens[4] == 2,
        "tiny encode");
  CHECK(refmodel_encode(tok, "abc", 3, 0, tokens, 128, &n) == REFMODEL_EINVAL &&
            contains(refmodel_errmsg(), "byte 0x63"),
        "tiny fallback: '%s'", refmodel_errmsg());
  refmodel_tokenizer_free(tok);
}

int main(void)
{
  find_shared_or_skip();
  char path[4200];
  shared_path(path, sizeof path, "models/stories260K/stories260K.bin");
  size_t size, tsize;
  unsigned char *bin = read_all(path, &size);
  require(bin != NULL && size == 1056540, "read stories260K.bin (1056540 bytes)");
  char tpath[4200];
  shared_path(tpath, sizeof tpath, "models/stories260K/tok512.bin");
  unsigned char *tbin = read_all(tpath, &tsize);
  require(tbin != NULL && tsize == 6227, "read tok512.bin (6227 bytes)");

  refmodel_model *m, *mb;
  require(refmodel_model_load(path, &m) == 0, "load stories260K.bin");
  require(refmodel_model_load_buffer(bin, size, "stories260K (buffer)", &mb) == 0,
          "load stories260K from a buffer");

  test_config(m);
  test_config(mb);
  test_position0_logits(m);
  test_position0_logits(mb);
  refmodel_state *st = test_generate_and_kv(m);
  test_restore(m, st);
  test_prefill(mb, st);
  refmodel_state_free(st);
  test_argmax();
  test_malformed_checkpoints(m, bin, size);
  test_tokenizer(tbin, tsize);

  refmodel_model_free(m);
  refmodel_model_free(mb);
  free(bin);
  free(tbin);
  printf("test_refmodel: %d checks, %d failed\n", n_checks, n_failures);
  return n_failures == 0 ? 0 : 1;
}
