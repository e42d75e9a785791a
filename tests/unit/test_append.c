/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_append.c — appends to a stored context (kvdb_append, kvdb_decode_append,
 * kvdb_decode_flush: engine/ops/decode.c over put.c's kv_put_append).
 *   - a one-shot append: the grown context reads back exactly (kvdb_get, kvdb_lookup), the
 *     record it grew from is gone, kvdb_verify is clean, and its score copies rank as those of
 *     the same tokens put at once (kvdb_score_batch: same positions and scores);
 *   - token-by-token appends in a session: each filled block is published at once, the rest at
 *     the flush; a second process reopening the database reads every token back;
 *   - a crash (SIGKILL of a writer mid-appends, three times): every token the writer reported
 *     published reads back exactly, one context is left, kvdb_verify is clean;
 *   - bad input: NULL, n 0, ctx out of range, a read-only handle, score_bits 0, a context that
 *     is not stored: each with a status and a message naming it.
 */
#include "kvdb_test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static const kvdb_model M = {"append-m", 2, 2, 32, KVDB_F16, 16, 8};

/* The KV of positions [t0, t0 + n) of the sequence `tok` (t_kv_value's) in a packed buffer. */
static uint16_t *kv_slice(const uint32_t *tok, size_t t0, size_t n, kvdb_kv_view *v)
{
  uint16_t *b = malloc(n * kvdb_model_token_bytes(&M));
  ASSERT(b != NULL);
  t_fill_kv_range(&M, tok, t0, n, b);
  ASSERT_OK(kvdb_kv_view_packed(v, b, &M, n, KVDB_LAYOUT_LKTHD));
  return b;
}

static void make_tokens(uint32_t *tok, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(t_rand(&seed) % 30000);
}

static size_t count_contexts(kvdb *db)
{
  kvdb_iter *it;
  ASSERT_OK(kvdb_iter_open(db, &it));
  size_t n = 0;
  kvdb_context_info ci;
  while (kvdb_iter_next(it, &ci) == KVDB_OK)
    n++;
  kvdb_iter_close(it);
  return n;
}

static void verify_clean(kvdb *db)
{
  kvdb_verify_report r;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &r));
  ASSERT_EQ(r.problems, 0);
}

static void test_oneshot(void)
{
  char *dir = t_tmpdir("append"), *dir2 = t_tmpdir("append-ref");
  kvdb *db, *ref;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  ASSERT_OK(kvdb_open(dir2, NULL, &ref));
  uint32_t tok[150];
  make_tokens(tok, 150, 7);
  kvdb_put_info pi;
  t_put_kv(db, &M, tok, 100, &pi);
  kvdb_kv_view v;
  uint16_t *b = kv_slice(tok, 100, 50, &v);
  kvdb_key nk;
  ASSERT_OK(kvdb_append(db, &M, &pi.context, tok + 100, 50, &v, &nk));
  free(b);
  ASSERT(memcmp(nk.b, pi.context.b, 16) != 0);
  ASSERT_EQ(t_get_check(db, &M, tok, 150), 150);
  size_t hit;
  ASSERT_OK(kvdb_lookup(db, &M, tok, 150, &hit));
  ASSERT_EQ(hit, 150);
  kvdb_context_info ci;
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_context_stat(db, &pi.context, &ci));
  ASSERT_OK(kvdb_context_stat(db, &nk, &ci));
  ASSERT_EQ(ci.n_tokens, 150);
  ASSERT_EQ(count_contexts(db), 1);
  verify_clean(db);
  /* the score copies: as if the 150 tokens had been put at once */
  kvdb_put_info rp;
  t_put_kv(ref, &M, tok, 150, &rp);
  ASSERT(memcmp(rp.context.b, nk.b, 16) == 0); /* the same chain, the same key */
  float q[2 * 32];
  uint64_t s = 99;
  for (int i = 0; i < 64; i++)
    q[i] = (float)((int)(t_rand(&s) % 2001) - 1000) / 300.0f;
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t h = 0; h < M.n_kv_heads; h++) {
      uint32_t p1[40], p2[40];
      float s1[40], s2[40];
      kvdb_score_req r1 = {l, h, q, 2, 40, p1, s1}, r2 = {l, h, q, 2, 40, p2, s2};
      ASSERT_OK(kvdb_score_batch(db, &M, &nk, KVDB_F32, &r1, 1, NULL, NULL));
      ASSERT_OK(kvdb_score_batch(ref, &M, &rp.context, KVDB_F32, &r2, 1, NULL, NULL));
      ASSERT(memcmp(p1, p2, sizeof p1) == 0 && memcmp(s1, s2, sizeof s1) == 0);
    }
  /* a second append on the grown context, through its new key */
  uint32_t tok2[170];
  memcpy(tok2, tok, sizeof tok);
  make_tokens(tok2 + 150, 20, 8);
  b = kv_slice(tok2, 150, 20, &v);
  kvdb_key nk2;
  ASSERT_OK(kvdb_append(db, &M, &nk, tok2 + 150, 20, &v, &nk2));
  free(b);
  ASSERT_EQ(t_get_check(db, &M, tok2, 170), 170);
  ASSERT_EQ(count_contexts(db), 1);
  verify_clean(db);
  kvdb_close(db);
  kvdb_close(ref);
  t_rmdir(dir);
  t_rmdir(dir2);
}

static void test_session(void)
{
  char *dir = t_tmpdir("append");
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  uint32_t tok[90];
  make_tokens(tok, 90, 11);
  kvdb_put_info pi;
  t_put_kv(db, &M, tok, 40, &pi); /* 2 full blocks and 8 tokens */
  kvdb_decode *s;
  ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, NULL, &s));
  for (size_t t = 40; t < 90; t++) {
    kvdb_kv_view v;
    uint16_t *b = kv_slice(tok, t, 1, &v);
    ASSERT_OK(kvdb_decode_append(s, 0, tok + t, 1, &v));
    free(b);
    uint64_t n, np;
    kvdb_key k;
    ASSERT_OK(kvdb_decode_context(s, 0, &k, &n, &np));
    ASSERT_EQ(n, t + 1);
    ASSERT_EQ(np, (t + 1) / 16 * 16 > 40 ? (t + 1) / 16 * 16 : 40);
    ASSERT_EQ(t_get_check(db, &M, tok, (size_t)np), np); /* published: readable at once */
  }
  ASSERT_OK(kvdb_decode_flush(s));
  kvdb_key k;
  uint64_t n, np;
  ASSERT_OK(kvdb_decode_context(s, 0, &k, &n, &np));
  ASSERT_EQ(np, 90);
  kvdb_decode_stats st;
  ASSERT_OK(kvdb_decode_stat(s, &st));
  ASSERT_EQ(st.appended, 50);
  ASSERT_EQ(st.published, 50);
  kvdb_decode_close(s);
  kvdb_close(db);
  /* a second process reopens and reads every token */
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvdb *d2;
    if (kvdb_open(dir, NULL, &d2) != KVDB_OK)
      _exit(2);
    size_t hit = t_get_check(d2, &M, tok, 90);
    kvdb_verify_report r;
    int bad = kvdb_verify(d2, NULL, NULL, NULL, &r) != KVDB_OK || r.problems != 0;
    kvdb_close(d2);
    _exit(hit == 90 && !bad ? 0 : 1);
  }
  int wst;
  ASSERT(waitpid(pid, &wst, 0) == pid);
  ASSERT(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  t_rmdir(dir);
}

#define CRASH_TOK 400
static void test_crash(void)
{
  for (int round = 0; round < 3; round++) {
    char *dir = t_tmpdir("append-crash");
    uint32_t tok[CRASH_TOK];
    make_tokens(tok, CRASH_TOK, 100 + (uint64_t)round);
    kvdb *db;
    ASSERT_OK(kvdb_open(dir, NULL, &db));
    kvdb_put_info pi;
    t_put_kv(db, &M, tok, 24, &pi);
    kvdb_close(db);
    int fds[2];
    ASSERT(pipe(fds) == 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) { /* the writer: appends one token at a time, reports what is published */
      close(fds[0]);
      kvdb *w;
      kvdb_decode *s;
      if (kvdb_open(dir, NULL, &w) != KVDB_OK ||
          kvdb_decode_open(w, &M, &pi.context, 1, NULL, &s) != KVDB_OK)
        _exit(2);
      for (size_t t = 24; t < CRASH_TOK; t++) {
        kvdb_kv_view v;
        uint16_t *b = kv_slice(tok, t, 1, &v);
        if (kvdb_decode_append(s, 0, tok + t, 1, &v) != KVDB_OK)
          _exit(3);
        free(b);
        if (t % 7 == 0 && kvdb_decode_flush(s) != KVDB_OK) /* partial blocks too */
          _exit(4);
        uint64_t np;
        kvdb_decode_context(s, 0, NULL, NULL, &np);
        uint32_t x = (uint32_t)np;
        if (write(fds[1], &x, sizeof x) != sizeof x)
          _exit(5);
      }
      _exit(0);
    }
    close(fds[1]);
    uint32_t last = 24, x;
    int reads = 0, stop_at = 40 + round * 60;
    while (reads < stop_at && read(fds[0], &x, sizeof x) == sizeof x) {
      last = x;
      reads++;
    }
    kill(pid, SIGKILL);
    while (read(fds[0], &x, sizeof x) == sizeof x) /* reported before the kill landed */
      last = x;
    close(fds[0]);
    int wst;
    ASSERT(waitpid(pid, &wst, 0) == pid);
    ASSERT_OK(kvdb_open(dir, NULL, &db));
    size_t hit = t_get_check(db, &M, tok, CRASH_TOK); /* every delivered byte checked */
    ASSERT(hit >= last);
    ASSERT_EQ(count_contexts(db), 1);
    verify_clean(db);
    kvdb_close(db);
    t_rmdir(dir);
  }
}

static void test_bad_input(void)
{
  char *dir = t_tmpdir("append-bad");
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, NULL, &db));
  uint32_t tok[40];
  make_tokens(tok, 40, 5);
  kvdb_put_info pi;
  t_put_kv(db, &M, tok, 20, &pi);
  kvdb_kv_view v;
  uint16_t *b = kv_slice(tok, 20, 20, &v);
  ASSERT_STATUS(KVDB_INVALID, kvdb_append(db, &M, NULL, tok + 20, 20, &v, NULL));
  ASSERT_MSG_HAS("context is NULL");
  ASSERT_STATUS(KVDB_INVALID, kvdb_append(db, &M, &pi.context, tok + 20, 0, &v, NULL));
  ASSERT_MSG_HAS("n is 0");
  ASSERT_STATUS(KVDB_INVALID, kvdb_append(db, &M, &pi.context, tok + 20, 20, NULL, NULL));
  ASSERT_MSG_HAS("kv is NULL");
  kvdb_key other = pi.context;
  other.b[0] ^= 1;
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_append(db, &M, &other, tok + 20, 20, &v, NULL));
  ASSERT_MSG_HAS("is not stored");
  kvdb_model m0 = M;
  m0.score_bits = 0;
  ASSERT_STATUS(KVDB_UNSUPPORTED, kvdb_append(db, &m0, &pi.context, tok + 20, 20, &v, NULL));
  ASSERT_MSG_HAS("score_bits 0");
  kvdb_decode *s;
  ASSERT_OK(kvdb_decode_open(db, &M, &pi.context, 1, NULL, &s));
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_append(s, 1, tok + 20, 20, &v));
  ASSERT_MSG_HAS("ctx 1 out of range");
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_append(s, 0, NULL, 20, &v));
  ASSERT_MSG_HAS("tokens is NULL");
  kvdb_decode_close(s);
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 0, NULL, &s));
  ASSERT_MSG_HAS("n_contexts 0");
  kvdb_decode_opts o;
  kvdb_decode_opts_init(&o);
  o.recent_tokens = 100000;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("recent_tokens");
  o.recent_tokens = 4;
  o.struct_size = 0;
  ASSERT_STATUS(KVDB_INVALID, kvdb_decode_open(db, &M, &pi.context, 1, &o, &s));
  ASSERT_MSG_HAS("struct_size");
  kvdb_close(db);
  /* a read-only handle: the tokens stay in the session, publishing is refused */
  kvdb_options ro;
  kvdb_options_init(&ro);
  ro.flags = KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(dir, &ro, &db));
  ASSERT_STATUS(KVDB_READONLY, kvdb_append(db, &M, &pi.context, tok + 20, 20, &v, NULL));
  ASSERT_MSG_HAS("read-only");
  kvdb_close(db);
  free(b);
  t_rmdir(dir);
}

int main(void)
{
  test_oneshot();
  test_session();
  test_crash();
  test_bad_input();
  printf("test_append: ok\n");
  return 0;
}
