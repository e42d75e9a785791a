/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_tier_dirs.c — every handle sees every tier any process created (issue 13 C).
 *
 * A handle opened before another process creates the SmartSSD tier reads the contexts moved
 * there, bit-exact, through kvdb_get, kvdb_get_tokens and kvdb_verify: the tier's directory is
 * the one the catalog records, looked up when the handle first needs it. Three ways to be
 * opened first: without the tier (no directory of its own), with the tier in the default
 * directory while the other process records a directory of its own, and with an explicit
 * smartssd_dir that the other process's record contradicts (reads follow the record; a move
 * of this handle's into the tier is refused with a message naming both directories). The
 * other process moves the contexts with kvdb_relocate, or with placement (a small SSD tier).
 */
#include "kvdb_test.h"

#include <sys/wait.h>
#include <unistd.h>

static const kvdb_model M = {.id = "tierdir-model", .n_layers = 2, .n_kv_heads = 2,
                             .head_dim = 64, .dtype = KVDB_F16, .block_tokens = 16};

#define N_CTX 12
#define N_TOK 100

static kvdb_options opts(uint64_t smart_bytes, const char *smart_dir)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0; /* every get reads the tiers */
  o.segment_bytes = 1 << 20;
  o.smartssd_bytes = smart_bytes;
  o.smartssd_dir = smart_dir;
  o.log_level = -1;
  return o;
}

static void ctx_tokens(uint64_t seed, uint32_t *tok, size_t n)
{
  uint64_t s = seed * 7919 + 1;
  for (size_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(t_rand(&s) % 30000);
}

/* The key of context `seed` (the last of its chained block hashes). */
static kvdb_status ctx_key(uint64_t seed, kvdb_key *key)
{
  uint32_t tok[N_TOK];
  kvdb_key h[(N_TOK + 15) / 16];
  ctx_tokens(seed, tok, N_TOK);
  kvdb_status rc = kvdb_chain_hashes(&M, tok, N_TOK, h, sizeof h / sizeof h[0]);
  *key = h[sizeof h / sizeof h[0] - 1];
  return rc;
}

static kvdb_status put_ctx(kvdb *db, uint64_t seed, kvdb_key *key)
{
  uint32_t tok[N_TOK];
  ctx_tokens(seed, tok, N_TOK);
  uint16_t *buf = malloc(N_TOK * kvdb_model_token_bytes(&M));
  t_fill_kv(&M, tok, N_TOK, buf);
  kvdb_kv_view v;
  kvdb_status rc = kvdb_kv_view_packed(&v, buf, &M, N_TOK, KVDB_LAYOUT_LKTHD);
  kvdb_put_info info;
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.profile_space = "lossless"; /* with placement on: exact configs only (bit-exact reads) */
  if (rc == KVDB_OK)
    rc = kvdb_put_ex(db, &M, tok, N_TOK, &v, &po, &info);
  if (rc == KVDB_OK && key != NULL)
    *key = info.context;
  free(buf);
  return rc;
}

/* Context `seed` read whole with kvdb_get and token by token with kvdb_get_tokens (every
 * position, every layer), each compared bit for bit with what was put. */
static void check_ctx(kvdb *db, uint64_t seed)
{
  uint32_t tok[N_TOK];
  ctx_tokens(seed, tok, N_TOK);
  size_t tb = kvdb_model_token_bytes(&M);
  uint16_t *buf = calloc(N_TOK, tb), *want = malloc(N_TOK * tb);
  t_fill_kv(&M, tok, N_TOK, want);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, N_TOK, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &M, tok, N_TOK, &v, &hit));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_EQ(t_check_kv(&M, tok, N_TOK, N_TOK, buf), N_TOK);
  ASSERT(memcmp(buf, want, N_TOK * tb) == 0);

  /* get_tokens: one layer at a time, positions in reverse order, into a one-layer view */
  kvdb_key key;
  ASSERT_OK(ctx_key(seed, &key));
  uint32_t pos[N_TOK];
  for (uint32_t i = 0; i < N_TOK; i++)
    pos[i] = N_TOK - 1 - i;
  size_t hd = (size_t)M.n_kv_heads * M.head_dim; /* elements of one token's K (or V), one layer */
  uint16_t *k = malloc(N_TOK * hd * 2), *vv = malloc(N_TOK * hd * 2);
  for (uint32_t l = 0; l < M.n_layers; l++) {
    kvdb_kv_view ov = {
      .k = {.base = k, .token_stride = (int64_t)hd * 2, .head_stride = M.head_dim * 2},
      .v = {.base = vv, .token_stride = (int64_t)hd * 2, .head_stride = M.head_dim * 2}};
    ASSERT_OK(kvdb_get_tokens(db, &M, &key, l, pos, N_TOK, &ov));
    for (uint32_t i = 0; i < N_TOK; i++)
      for (uint32_t h = 0; h < M.n_kv_heads; h++)
        for (uint32_t d = 0; d < M.head_dim; d++) {
          ASSERT_EQ(k[(size_t)i * hd + (size_t)h * M.head_dim + d],
                    t_kv_value(tok, pos[i], l, 0, h, d));
          ASSERT_EQ(vv[(size_t)i * hd + (size_t)h * M.head_dim + d],
                    t_kv_value(tok, pos[i], l, 1, h, d));
        }
  }
  free(k);
  free(vv);
  free(buf);
  free(want);
}

static uint32_t tier_of(kvdb *db, uint64_t seed)
{
  kvdb_key key;
  ASSERT_OK(ctx_key(seed, &key));
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &key, &ci));
  return ci.tier;
}

static void verify_clean(kvdb *db)
{
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  ASSERT(rep.blocks_checked > 0);
}

enum { BY_RELOCATE, BY_PLACEMENT };

/* The other process: opens with the tier (`smart_dir`: NULL = default), moves the contexts
 * seeds [0, N_CTX) there and puts N_CTX more, also moved; exits 0 on success. */
static void other_process(const char *dir, const char *smart_dir, int how)
{
  kvdb_options o = opts(64 << 20, smart_dir);
  if (how == BY_PLACEMENT) { /* an SSD tier too small for more than a context or two */
    o.placement = KVDB_PLACEMENT_EVICPRESS;
    o.ssd_bytes = 2 * N_TOK * kvdb_model_token_bytes(&M);
    o.placement_slack_pct = 0;
  }
  kvdb *db;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    _exit(10);
  for (uint64_t s = N_CTX; s < 2 * N_CTX; s++)
    if (put_ctx(db, s, NULL) != KVDB_OK)
      _exit(11);

  if (how == BY_RELOCATE) {
    for (uint64_t s = 0; s < 2 * N_CTX; s++) {
      kvdb_key key;
      if (ctx_key(s, &key) != KVDB_OK ||
          kvdb_relocate(db, &M, &key, NULL, KVDB_TIER_SMARTSSD, NULL) != KVDB_OK)
        _exit(12);
    }
  } else { /* a rebalance places the first contexts too (they were put without placement) */
    kvdb_place_plan plan;
    if (kvdb_rebalance_plan(db, &plan) != KVDB_OK)
      _exit(13);
    kvdb_status rc = kvdb_rebalance_execute(db, &plan, NULL);
    kvdb_place_plan_free(&plan);
    if (rc != KVDB_OK)
      _exit(14);
  }

  kvdb_close(db);
  _exit(0);
}

static void run(const char *tag, uint64_t first_bytes, int own_first, int own_other, int how)
{
  char *dir = t_tmpdir(tag), *mine = t_tmpdir("tierdir-mine"), *theirs = t_tmpdir("tierdir-t");
  kvdb_options o = opts(first_bytes, own_first ? mine : NULL);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db)); /* opened first: no tier is recorded yet */
  for (uint64_t s = 0; s < N_CTX; s++)
    ASSERT_OK(put_ctx(db, s, NULL));
  check_ctx(db, 0);
  pid_t pid = fork();
  if (pid == 0)
    other_process(dir, own_other ? theirs : NULL, how);
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);

  /* every context, the ones this handle put and the other's, from the handle opened first */
  uint64_t on_smart = 0;
  for (uint64_t s = 0; s < 2 * N_CTX; s++) {
    check_ctx(db, s);
    on_smart += tier_of(db, s) == KVDB_TIER_SMARTSSD;
  }
  if (how == BY_RELOCATE)
    ASSERT_EQ(on_smart, 2 * N_CTX);
  else
    ASSERT(on_smart >= N_CTX); /* the SSD tier holds two contexts at most */
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.tier[KVDB_TIER_SMARTSSD].contexts, on_smart);
  ASSERT(st.tier[KVDB_TIER_SMARTSSD].hits > 0);
  verify_clean(db);

  /* the segments are in the recorded directory, none in this handle's own */
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -q '^seg-4'", own_other ? theirs : dir);
  if (!own_other)
    snprintf(cmd, sizeof cmd, "ls '%s/smartssd' | grep -q '^seg-4'", dir);
  ASSERT(system(cmd) == 0);
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -q '^seg-'", mine);
  ASSERT(system(cmd) != 0);

  if (own_first && first_bytes > 0) {
    /* this handle's explicit directory contradicts the record: reads follow the record (above),
     * a move of its own into the tier is refused, naming both */
    ASSERT(own_other);
    kvdb_key key;
    ASSERT_OK(put_ctx(db, 2 * N_CTX, &key));
    ASSERT_STATUS(KVDB_INVALID, kvdb_relocate(db, &M, &key, NULL, KVDB_TIER_SMARTSSD, NULL));
    ASSERT_MSG_HAS(mine);
    ASSERT_MSG_HAS(theirs);
    ASSERT_EQ(tier_of(db, 2 * N_CTX), KVDB_TIER_SSD);
    check_ctx(db, 2 * N_CTX);
  } else if (first_bytes > 0) {
    /* with the tier configured and no directory of its own, it moves contexts into the
     * recorded directory */
    kvdb_key key;
    ASSERT_OK(put_ctx(db, 2 * N_CTX, &key));
    ASSERT_OK(kvdb_relocate(db, &M, &key, NULL, KVDB_TIER_SMARTSSD, NULL));
    ASSERT_EQ(tier_of(db, 2 * N_CTX), KVDB_TIER_SMARTSSD);
    check_ctx(db, 2 * N_CTX);
    if (own_other) { /* nothing in the default directory (created at open, empty) */
      snprintf(cmd, sizeof cmd, "ls '%s/smartssd' 2>/dev/null | grep -q '^seg-'", dir);
      ASSERT(system(cmd) != 0);
    }
  }
  verify_clean(db);
  kvdb_close(db);

  /* and a handle opened now agrees */
  kvdb_options o2 = opts(0, NULL);
  ASSERT_OK(kvdb_open(dir, &o2, &db));
  for (uint64_t s = 0; s < 2 * N_CTX; s++)
    check_ctx(db, s);
  verify_clean(db);
  kvdb_close(db);
  t_rmdir(dir);
  t_rmdir(mine);
  t_rmdir(theirs);
}

int main(void)
{
  /* opened without the tier; the other process creates it in the default directory */
  run("tierdir-none", 0, 0, 0, BY_RELOCATE);
  /* ... or in a directory of its own */
  run("tierdir-none-own", 0, 0, 1, BY_RELOCATE);
  /* opened with the tier in the default directory; the other records its own */
  run("tierdir-def", 64 << 20, 0, 1, BY_RELOCATE);
  /* opened with an explicit directory; the other records another one */
  run("tierdir-conflict", 64 << 20, 1, 1, BY_RELOCATE);
  /* the other process's placement moves them */
  run("tierdir-place", 0, 0, 0, BY_PLACEMENT);
  printf("tier-dirs: ok\n");
  return 0;
}
