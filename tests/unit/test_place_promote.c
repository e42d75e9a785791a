/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_place_promote.c — promotion on a hit (issue 17; placer.c PROMOTION) through the
 * public API: with KVDB_PLACEMENT_EVICPRESS (the default rule), a context that is not in the
 * DRAM tier and becomes the hottest is cached after gets of it (kvdb_context_stat's `cached`,
 * and the next get fills DRAM with it), the DRAM tier stays within its capacity, and every get
 * returns the context's KV exactly; with KVDB_PLACEMENT_LEAST_DROP (Algorithm 1 as the paper has
 * it) the same gets promote nothing. A get never moves or deletes a stored context, also when
 * a tier is over-full.
 */
#include "kvdb_test.h"

static const kvdb_model M = {.id = "promote-model", .n_layers = 2, .n_kv_heads = 2, .head_dim = 64,
                             .dtype = KVDB_F16, .block_tokens = 16};

#define N_CTX 4
#define TOKENS 200

static void tokens_of(int i, uint32_t *tok)
{
  t_family_tokens(7000 + 100 * (uint64_t)i, 70 + (uint64_t)i, 32, tok, TOKENS);
}

/* A get of context i: a full hit, KV exact (contexts are put raw and the placement keeps exact
 * configs here: lossless or raw, checked). */
static void get_ctx(kvdb *db, int i)
{
  uint32_t tok[TOKENS];
  tokens_of(i, tok);
  uint16_t *buf = calloc(TOKENS, kvdb_model_token_bytes(&M));
  ASSERT(buf != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, TOKENS, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &M, tok, TOKENS, &v, &hit));
  ASSERT_EQ(hit, TOKENS);
  ASSERT_EQ(t_check_kv(&M, tok, TOKENS, TOKENS, buf), TOKENS);
  free(buf);
}

static int exact(const kvdb_config *c)
{
  return c->method == KVDB_METHOD_RAW || c->method == KVDB_METHOD_LOSSLESS;
}

static kvdb_context_info info(kvdb *db, const kvdb_key *k)
{
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, k, &ci));
  return ci;
}

/* Whether context 0 was cached before (*before) and after (return) the gets that make it the
 * hottest. */
static int run(kvdb_placement rule, int *before)
{
  char *dir = t_tmpdir("promote");
  kvdb_options o;
  kvdb_options_init(&o);
  o.segment_bytes = 1 << 20;
  o.log_level = getenv("PROMOTE_LOG") ? 3 : -1;
  o.placement = rule;
  o.dram_bytes = 520 << 10; /* two of the four contexts (208 KiB decoded each) */
  o.ssd_bytes = 0;          /* unlimited: every context stays stored */
  o.placement_alpha = 1000; /* quality first: exact configs only (int8 costs 0.0002 x 1000) */
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_key keys[N_CTX];
  for (int i = 0; i < N_CTX; i++) {
    uint32_t tok[TOKENS];
    tokens_of(i, tok);
    ASSERT_OK(t_put_config(db, &M, tok, TOKENS, "raw", &keys[i]));
  }
  /* contexts 1..3 hot first: the DRAM tier holds two of them, context 0 is cold */
  for (int r = 0; r < 4; r++)
    for (int i = 1; i < N_CTX; i++)
      get_ctx(db, i);
  kvdb_context_info c0 = info(db, &keys[0]);
  *before = (int)c0.cached;
  int cached_hot = 0;
  for (int i = 1; i < N_CTX; i++)
    cached_hot += info(db, &keys[i]).cached;
  if (rule == KVDB_PLACEMENT_EVICPRESS) {
    ASSERT_EQ(c0.cached, 0);
    ASSERT_EQ(cached_hot, 2);
  }
  /* context 0 becomes the hottest */
  for (int r = 0; r < 20; r++)
    get_ctx(db, 0);
  c0 = info(db, &keys[0]);
  fprintf(stderr, "after 20 gets: frequency %.2f cached %u\n", c0.frequency, c0.cached);
  get_ctx(db, 0); /* the DRAM tier admits it now, when it is cached */
  c0 = info(db, &keys[0]);
  uint64_t dram = 0;
  for (int i = 0; i < N_CTX; i++) {
    kvdb_context_info ci = info(db, &keys[i]);
    ASSERT(exact(&ci.config));
    if (ci.cached)
      dram += (uint64_t)ci.n_blocks * 16 * kvdb_model_token_bytes(&M);
  }
  ASSERT(dram <= o.dram_bytes);
  if (c0.cached)
    ASSERT_EQ(c0.in_dram_blocks, c0.n_blocks);
  printf("%s: context 0 after 20 gets: frequency %.1f, cached %u, %u of %u blocks in DRAM\n",
         rule == KVDB_PLACEMENT_EVICPRESS ? "default rule" : "least drop", c0.frequency,
         c0.cached, c0.in_dram_blocks, c0.n_blocks);
  int cached = (int)c0.cached;
  kvdb_close(db);
  t_rmdir(dir);
  return cached;
}

/* A get never moves or deletes a stored context: contexts stored with roomy tiers, the store
 * reopened with an SSD tier that holds half of them (over-full, as after a crash in the middle
 * of a rebalance or a capacity shrink), then gets that promote: every context is still stored,
 * on its tier, in its config (the promotion's run changes DRAM admissions only; it used to
 * carry out the whole plan, deleting contexts the tier had no room for). */
static void get_never_deletes(void)
{
  char *dir = t_tmpdir("promote-keep");
  kvdb_options o;
  kvdb_options_init(&o);
  o.segment_bytes = 1 << 20;
  o.log_level = -1;
  o.placement = KVDB_PLACEMENT_EVICPRESS;
  o.dram_bytes = 520 << 10;
  o.ssd_bytes = 0;
  o.placement_alpha = 1000;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_key keys[N_CTX];
  for (int i = 0; i < N_CTX; i++) {
    uint32_t tok[TOKENS];
    tokens_of(i, tok);
    ASSERT_OK(t_put_config(db, &M, tok, TOKENS, "raw", &keys[i]));
  }
  kvdb_context_info was[N_CTX];
  for (int i = 0; i < N_CTX; i++)
    was[i] = info(db, &keys[i]);
  kvdb_close(db);
  o.ssd_bytes = (uint64_t)was[0].bytes * N_CTX / 2; /* room for half of them */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  for (int r = 0; r < 20; r++)
    for (int i = 0; i < N_CTX; i++)
      get_ctx(db, (i + r) % N_CTX);
  for (int i = 0; i < N_CTX; i++) {
    kvdb_context_info ci;
    ASSERT_OK(kvdb_context_stat(db, &keys[i], &ci)); /* still stored */
    ASSERT_EQ(ci.tier, was[i].tier);
    ASSERT(memcmp(&ci.config, &was[i].config, sizeof ci.config) == 0);
  }
  kvdb_close(db);
  t_rmdir(dir);
  printf("get never deletes: %d contexts on an over-full SSD tier, 80 gets: all still stored as "
         "they were\n", N_CTX);
}

int main(void)
{
  int before;
  ASSERT_EQ(run(KVDB_PLACEMENT_EVICPRESS, &before), 1);
  ASSERT_EQ(before, 0);
  int after = run(KVDB_PLACEMENT_LEAST_DROP, &before);
  ASSERT_EQ(after, before); /* no promotion: gets change nothing */
  get_never_deletes();
  printf("place-promote: all tests passed\n");
  return T_EXIT_PASS;
}
