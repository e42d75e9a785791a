/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_score_fetch.c — kvdb_get_head_tokens (engine/ops/fetch.c): the K and V rows
 * of chosen positions of one layer and KV head.
 *   - the rows equal kvdb_get_tokens's rows of that head for the same positions (any order,
 *     repeats, the last partial block), on the SSD tier (host page reads), the DRAM tier, the
 *     SmartSSD tier through the emulated near-data device (pages P2P-read, groups checked and
 *     rows gathered on the device) and through the host, for paged and packed sections, raw
 *     and compressed (lossless, int8: decoded) contexts, with and without score copies; the
 *     device path equals the CPU path bit for bit;
 *   - bytes: the device path reads nothing on the host and sends exactly the rows; the host
 *     path reads only this head's groups (less than kvdb_get_tokens, which reads every head's);
 *   - many waves (a small wave size) give the same rows;
 *   - a damaged byte of one group: KVDB_CORRUPT from the host path and from the device (naming
 *     the segment and block), while another head's rows still come;
 *   - bad input: NULL context, positions or buffers, n_pos 0, layer or head out of range, a
 *     position out of range, bad options, a missing context, another model.
 */
#include "kvdb_test.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "place/place.h"
#include "ops/ops_int.h"

static const kvdb_model MP = {"fetch-paged", 2, 3, 128, KVDB_F16, 64, 8};  /* G = 16 */
static const kvdb_model MK = {"fetch-packed", 2, 2, 64, KVDB_F16, 16, 4};  /* one group */
static const kvdb_model M0 = {"fetch-plain", 3, 2, 32, KVDB_F32, 32, 0};   /* no copies */

#define N_TOK 300u
#define N_POS 70u

static uint32_t rowb(const kvdb_model *m)
{
  return m->head_dim * (m->dtype == KVDB_F32 ? 4 : 2);
}

typedef struct ctx {
  uint32_t tok[N_TOK];
  uint8_t *kv;
  kvdb_key key;
} ctx;

static void put_ctx(kvdb *db, const kvdb_model *m, ctx *c, uint64_t seed, const char *config)
{
  size_t tb = kvdb_model_token_bytes(m);
  c->kv = malloc(N_TOK * tb);
  ASSERT(c->kv != NULL);
  for (uint32_t i = 0; i < N_TOK; i++)
    c->tok[i] = (uint32_t)(t_rand(&seed) % 32000);
  for (size_t i = 0; i < N_TOK * tb / 2; i++)
    ((uint16_t *)(void *)c->kv)[i] = m->dtype == KVDB_F32
                                         ? (uint16_t)((i & 1) ? 0x3f00 | (t_rand(&seed) & 0x7f)
                                                              : (uint16_t)t_rand(&seed))
                                         : (uint16_t)(t_rand(&seed) & 0x3bff);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, c->kv, m, N_TOK, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  if (config != NULL)
    ASSERT_OK(kvdb_config_parse(config, &o.config));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, m, c->tok, N_TOK, &v, &o, &info));
  c->key = info.context;
}

/* Positions: random, out of order, repeats, the first and the last token. */
static void make_positions(uint32_t *pos, uint64_t seed)
{
  for (uint32_t i = 0; i < N_POS; i++)
    pos[i] = (uint32_t)(t_rand(&seed) % N_TOK);
  pos[0] = N_TOK - 1;
  pos[1] = 0;
  pos[2] = pos[5];
}

/* kvdb_get_tokens's rows of (layer, head) for pos (all heads into a packed view, one kept). */
static void ref_rows(kvdb *db, const kvdb_model *m, const ctx *c, uint32_t layer, uint32_t head,
                     const uint32_t *pos, uint8_t *k, uint8_t *v)
{
  size_t rb = rowb(m), hr = m->n_kv_heads * rb;
  uint8_t *buf = malloc(N_POS * kvdb_model_token_bytes(m));
  kvdb_kv_view view;
  ASSERT_OK(kvdb_kv_view_packed(&view, buf, m, N_POS, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_tokens(db, m, &c->key, layer, pos, N_POS, &view));
  for (uint32_t i = 0; i < N_POS; i++) {
    memcpy(k + i * rb, buf + i * hr + head * rb, rb);
    memcpy(v + i * rb, buf + (N_POS + i) * hr + head * rb, rb);
  }
  free(buf);
}

/* The rows of every (layer, head) through kvdb_get_head_tokens with opts equal kvdb_get_tokens's
 * and, for raw contexts put exactly, the rows as put. Returns the summed stats. */
static kvdb_fetch_stats check_all(kvdb *db, const kvdb_model *m, const ctx *c,
                                  const kvdb_score_opts *o, int exact, uint64_t seed)
{
  size_t rb = rowb(m), tb = kvdb_model_token_bytes(m) / m->n_layers / 2;
  uint8_t *k = malloc(N_POS * rb), *v = malloc(N_POS * rb), *rk = malloc(N_POS * rb),
          *rv = malloc(N_POS * rb);
  kvdb_fetch_stats sum;
  memset(&sum, 0, sizeof sum);
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t h = 0; h < m->n_kv_heads; h++) {
      uint32_t pos[N_POS];
      make_positions(pos, seed + l * 16 + h);
      kvdb_fetch_stats st;
      memset(k, 0xee, N_POS * rb);
      ASSERT_OK(kvdb_get_head_tokens(db, m, &c->key, l, h, pos, N_POS, k, v, o, &st));
      ref_rows(db, m, c, l, h, pos, rk, rv);
      ASSERT(memcmp(k, rk, N_POS * rb) == 0);
      ASSERT(memcmp(v, rv, N_POS * rb) == 0);
      if (exact) /* the rows as put: LKTHD [layer][K,V][token][head][dim] */
        for (uint32_t i = 0; i < N_POS; i++) {
          const uint8_t *kk = c->kv + (((size_t)l * 2 * N_TOK + pos[i]) * m->n_kv_heads + h) * rb;
          ASSERT(memcmp(k + i * rb, kk, rb) == 0);
          ASSERT(memcmp(v + i * rb, kk + (size_t)N_TOK * tb, rb) == 0);
        }
      ASSERT_EQ(st.rows, N_POS);
      sum.rows += st.rows;
      sum.dram_blocks += st.dram_blocks;
      sum.host_blocks += st.host_blocks;
      sum.device_blocks += st.device_blocks;
      sum.decoded_blocks += st.decoded_blocks;
      sum.host_bytes += st.host_bytes;
      sum.device_bytes += st.device_bytes;
      sum.device_to_host_bytes += st.device_to_host_bytes;
      sum.unverified_groups += st.unverified_groups;
    }
  free(k);
  free(v);
  free(rk);
  free(rv);
  return sum;
}

static kvdb *open_db(const char *dir, uint64_t dram)
{
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.dram_bytes = dram;
  opt.log_level = -1;
  opt.smartssd_bytes = 256 << 20;
  /* whole-page objects: the device reads page groups at page offsets (packed raw objects,
   * FORMAT.md §3e, are served by the host on every tier: test_packed.c) */
  opt.packed_block_bytes = 1;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &opt, &db));
  return db;
}

static uint64_t blocks_of(const kvdb_model *m)
{
  return (N_TOK + m->block_tokens - 1) / m->block_tokens;
}

static void test_tiers(const kvdb_model *m)
{
  char *dir = t_tmpdir("fetch");
  kvdb *db = open_db(dir, 0);
  ctx c;
  put_ctx(db, m, &c, 11, NULL);
  kvdb_score_opts cpu, dev;
  kvdb_score_opts_init(&cpu);
  kvdb_score_opts_init(&dev);
  dev.device = KVDB_SCORE_EMULATED;
  uint64_t heads = (uint64_t)m->n_layers * m->n_kv_heads;
  /* SSD tier: the host reads pages (the device is not asked for: SSD is not a device tier) */
  kvdb_fetch_stats st = check_all(db, m, &c, NULL, 1, 1);
  ASSERT(st.host_blocks > 0 && st.host_blocks <= heads * blocks_of(m));
  ASSERT_EQ(st.device_to_host_bytes, 0);
  ASSERT(st.host_bytes > 0);
  /* fewer bytes than kvdb_get_tokens for the same rows when a layer has several heads */
  uint32_t pos[N_POS];
  make_positions(pos, 99);
  kvdb_stats s0, s1;
  uint8_t *buf = malloc(N_POS * kvdb_model_token_bytes(m));
  kvdb_kv_view view;
  ASSERT_OK(kvdb_kv_view_packed(&view, buf, m, N_POS, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_stat(db, &s0));
  ASSERT_OK(kvdb_get_tokens(db, m, &c.key, 0, pos, N_POS, &view));
  ASSERT_OK(kvdb_stat(db, &s1));
  uint8_t *k = malloc(N_POS * rowb(m)), *v = malloc(N_POS * rowb(m));
  ASSERT_OK(kvdb_get_head_tokens(db, m, &c.key, 0, 0, pos, N_POS, k, v, NULL, &st));
  printf("%s: one head %llu bytes, get_tokens (all %u heads) %llu bytes\n", m->id,
         (unsigned long long)st.host_bytes, m->n_kv_heads,
         (unsigned long long)(s1.bytes_read - s0.bytes_read));
  ASSERT(st.host_bytes < s1.bytes_read - s0.bytes_read);
  /* the SmartSSD tier: through the device, and the host */
  ASSERT_OK(kvdb_relocate(db, m, &c.key, NULL, KVDB_TIER_SMARTSSD, NULL));
  kvdb_fetch_stats sd = check_all(db, m, &c, &dev, 1, 2);
  ASSERT(sd.device_blocks > 0 && sd.device_blocks <= heads * blocks_of(m));
  ASSERT_EQ(sd.host_bytes, 0);
  ASSERT_EQ(sd.unverified_groups, 0); /* the emulation checks every group */
  ASSERT_EQ(sd.device_to_host_bytes, (uint64_t)heads * N_POS * 2 * ((rowb(m) + 63) / 64 * 64));
  ASSERT(sd.device_bytes > 0);
  kvdb_fetch_stats sh = check_all(db, m, &c, &cpu, 1, 2); /* same positions: same rows */
  ASSERT_EQ(sh.device_blocks, 0);
  ASSERT_EQ(sh.host_blocks, sd.device_blocks);
  /* many waves: a wave of one page */
  uint64_t wave = kv_score_wave_bytes;
  kv_score_wave_bytes = 4096;
  sd = check_all(db, m, &c, &dev, 1, 3);
  ASSERT_EQ(sd.host_bytes, 0);
  kv_score_wave_bytes = wave;
  /* the device tiers may include the SSD tier; NEAR_DATA is the emulation here */
  dev.device = KVDB_SCORE_NEAR_DATA;
  sd = check_all(db, m, &c, &dev, 1, 2);
  ASSERT_EQ(sd.device_blocks, sh.host_blocks);
  kvdb_close(db);
  /* the DRAM tier: blocks read by kvdb_get are served from there */
  db = open_db(dir, 64 << 20);
  size_t hit = 0;
  kvdb_kv_view all;
  uint8_t *whole = malloc(N_TOK * kvdb_model_token_bytes(m));
  ASSERT_OK(kvdb_kv_view_packed(&all, whole, m, N_TOK, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get(db, m, c.tok, N_TOK, &all, &hit));
  ASSERT_EQ(hit, N_TOK);
  st = check_all(db, m, &c, &dev, 1, 2);
  ASSERT_EQ(st.dram_blocks, sh.host_blocks);
  ASSERT_EQ(st.host_bytes + st.device_bytes, 0);
  kvdb_close(db);
  free(whole);
  free(buf);
  free(k);
  free(v);
  free(c.kv);
  t_rmdir(dir);
}

/* Compressed contexts: decoded on the host, equal to kvdb_get_tokens (and exact for lossless),
 * also when a device is asked for. */
static void test_compressed(void)
{
  static const char *cfgs[] = {"lossless", "int8"};
  for (int i = 0; i < 2; i++) {
    const kvdb_model *m = &MP;
    char *dir = t_tmpdir("fetch");
    kvdb *db = open_db(dir, 0);
    ctx c;
    put_ctx(db, m, &c, 21 + (uint64_t)i, cfgs[i]);
    ASSERT_OK(kvdb_relocate(db, m, &c.key, NULL, KVDB_TIER_SMARTSSD, NULL));
    kvdb_score_opts dev;
    kvdb_score_opts_init(&dev);
    dev.device = KVDB_SCORE_EMULATED;
    kvdb_fetch_stats st = check_all(db, m, &c, &dev, i == 0, 6);
    ASSERT(st.decoded_blocks > 0 && st.decoded_blocks <= (uint64_t)m->n_layers * m->n_kv_heads * blocks_of(m));
    ASSERT_EQ(st.device_blocks, 0);
    ASSERT(st.host_bytes > 0);
    kvdb_close(db);
    free(c.kv);
    t_rmdir(dir);
  }
}

/* Flip one byte of the K group holding token t of (layer, head) in every stored copy of block
 * `bi` of the context (both tiers' segment files are searched for the block's header). */
static void damage(const char *dir, const kvdb_model *m, const ctx *c, uint32_t bi,
                   uint32_t layer, uint32_t head, uint32_t t)
{
  kvdb_key hashes[64];
  ASSERT_OK(kvdb_chain_hashes(m, c->tok, N_TOK, hashes, 64));
  kv_block_geom g;
  uint32_t n = N_TOK - bi * m->block_tokens < m->block_tokens ? N_TOK - bi * m->block_tokens
                                                               : m->block_tokens;
  ASSERT_OK(kv_block_geom_init(&g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype,
                               m->block_tokens, n));
  char cmd[4300], path[4096];
  snprintf(cmd, sizeof cmd, "find %s -name '*.kvs'", dir);
  FILE *p = popen(cmd, "r");
  ASSERT(p != NULL);
  int flipped = 0;
  while (fgets(path, sizeof path, p) != NULL) {
    path[strcspn(path, "\n")] = 0;
    int fd = open(path, O_RDWR);
    ASSERT(fd >= 0);
    uint8_t page[4096];
    for (off_t at = 0; pread(fd, page, sizeof page, at) == (ssize_t)sizeof page; at += 4096) {
      if (kv_get_le32(page) != KV_BLOCK_MAGIC || memcmp(page + 16, hashes[bi].b, 16) != 0)
        continue;
      uint32_t s = (layer * m->n_kv_heads + head) * 2;
      off_t off = at + (off_t)kv_block_group_off(&g, s, t / g.group_tokens) + 3;
      uint8_t b;
      ASSERT(pread(fd, &b, 1, off) == 1);
      b ^= 0x20;
      ASSERT(pwrite(fd, &b, 1, off) == 1);
      flipped++;
    }
    close(fd);
  }
  pclose(p);
  ASSERT(flipped > 0);
}

static void test_corrupt(void)
{
  const kvdb_model *m = &MP;
  for (int on_device = 0; on_device < 2; on_device++) {
    char *dir = t_tmpdir("fetch");
    kvdb *db = open_db(dir, 0);
    ctx c;
    put_ctx(db, m, &c, 31, NULL);
    if (on_device)
      ASSERT_OK(kvdb_relocate(db, m, &c.key, NULL, KVDB_TIER_SMARTSSD, NULL));
    kvdb_close(db);
    damage(dir, m, &c, 1, 1, 2, 70); /* block 1 (tokens 64..127), token 70's group */
    db = open_db(dir, 0);
    kvdb_score_opts o;
    kvdb_score_opts_init(&o);
    o.device = on_device ? KVDB_SCORE_EMULATED : KVDB_SCORE_CPU;
    uint32_t pos[3] = {5, 70, 290};
    uint8_t k[3 * 256], v[3 * 256];
    ASSERT_STATUS(KVDB_CORRUPT, kvdb_get_head_tokens(db, m, &c.key, 1, 2, pos, 3, k, v, &o, NULL));
    ASSERT_MSG_HAS("checksum mismatch");
    ASSERT_MSG_HAS("segment");
    ASSERT_MSG_HAS("block");
    if (on_device)
      ASSERT_MSG_HAS("near-data device");
    kvdb_stats s;
    ASSERT_OK(kvdb_stat(db, &s));
    ASSERT(s.corrupt_blocks >= 1);
    /* the other head of the layer, and the same head without token 70's group, are intact */
    ASSERT_OK(kvdb_get_head_tokens(db, m, &c.key, 1, 1, pos, 3, k, v, &o, NULL));
    uint32_t far[2] = {5, 290};
    ASSERT_OK(kvdb_get_head_tokens(db, m, &c.key, 1, 2, far, 2, k, v, &o, NULL));
    kvdb_close(db);
    free(c.kv);
    t_rmdir(dir);
  }
}

/* kv_get_head_tokens_cc (a decode session's fetch): the checksum tables read once are kept, so
 * a second fetch of the same groups reads fewer bytes, the rows equal kvdb_get_head_tokens's,
 * and a group damaged after its table was kept is still KVDB_CORRUPT. */
static void test_checksum_cache(void)
{
  const kvdb_model *m = &MP;
  char *dir = t_tmpdir("fetch-ck");
  kvdb *db = open_db(dir, 0);
  ctx c;
  put_ctx(db, m, &c, 41, NULL);
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  o.device = KVDB_SCORE_CPU;
  uint32_t pos[3] = {5, 70, 290};
  uint8_t k[3 * 256], v[3 * 256], k2[3 * 256], v2[3 * 256];
  kv_ckcache *cc = NULL;
  kvdb_fetch_stats s1, s2;
  ASSERT_OK(kvdb_get_head_tokens(db, m, &c.key, 1, 2, pos, 3, k, v, &o, NULL));
  ASSERT_OK(kv_get_head_tokens_cc(db, m, &c.key, 1, 2, pos, 3, k2, v2, &o, &s1, &cc));
  ASSERT(cc != NULL && memcmp(k, k2, sizeof k) == 0 && memcmp(v, v2, sizeof v) == 0);
  memset(k2, 0, sizeof k2);
  memset(v2, 0, sizeof v2);
  ASSERT_OK(kv_get_head_tokens_cc(db, m, &c.key, 1, 2, pos, 3, k2, v2, &o, &s2, &cc));
  ASSERT(memcmp(k, k2, sizeof k) == 0 && memcmp(v, v2, sizeof v) == 0);
  ASSERT(s2.host_bytes < s1.host_bytes && s2.host_blocks == s1.host_blocks);
  kvdb_close(db);
  damage(dir, m, &c, 1, 1, 2, 70); /* token 70's group, its table kept */
  db = open_db(dir, 0);
  ASSERT_STATUS(KVDB_CORRUPT,
                kv_get_head_tokens_cc(db, m, &c.key, 1, 2, pos, 3, k2, v2, &o, NULL, &cc));
  ASSERT_MSG_HAS("checksum mismatch");
  uint32_t far[2] = {5, 290};
  ASSERT_OK(kv_get_head_tokens_cc(db, m, &c.key, 1, 2, far, 2, k2, v2, &o, NULL, &cc));
  kv_ckcache_free(cc);
  kvdb_close(db);
  free(c.kv);
  t_rmdir(dir);
}

/* kv_get_heads_tokens_cc (a decode step's fetch of a layer): the host reads of several KV heads
 * in one batch give each head's rows and figures as kv_get_head_tokens_cc alone does (heads in
 * any order, different positions each, a head with one position); a group damaged in one head
 * fails the call with KVDB_CORRUPT, and the call without that group works. */
static void test_heads_batch(void)
{
  const kvdb_model *m = &MP;
  char *dir = t_tmpdir("fetch-heads");
  kvdb *db = open_db(dir, 0);
  ctx c;
  put_ctx(db, m, &c, 43, NULL);
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  o.device = KVDB_SCORE_CPU;
  uint32_t heads[3] = {2, 0, 1};
  uint32_t p0[4] = {5, 70, 290, 71}, p1[1] = {130}, p2[3] = {299, 0, 64};
  const uint32_t *pp[3] = {p0, p1, p2};
  size_t np[3] = {4, 1, 3};
  uint8_t kb[3][4 * 256], vb[3][4 * 256], k1[4 * 256], v1[4 * 256];
  void *ko[3] = {kb[0], kb[1], kb[2]}, *vo[3] = {vb[0], vb[1], vb[2]};
  kvdb_fetch_stats fs[3], f1;
  ASSERT_OK(kv_get_heads_tokens_cc(db, m, &c.key, 1, 3, heads, pp, np, ko, vo, &o, fs, NULL));
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(kv_get_head_tokens_cc(db, m, &c.key, 1, heads[i], pp[i], np[i], k1, v1, &o, &f1,
                                    NULL));
    ASSERT(memcmp(kb[i], k1, np[i] * 256) == 0 && memcmp(vb[i], v1, np[i] * 256) == 0);
    ASSERT_EQ(fs[i].host_bytes, f1.host_bytes);
    ASSERT_EQ(fs[i].host_blocks, f1.host_blocks);
    ASSERT_EQ(fs[i].rows, np[i]);
  }
  kvdb_close(db);
  damage(dir, m, &c, 1, 1, 2, 70); /* head 2's group of token 70 */
  db = open_db(dir, 0);
  ASSERT_STATUS(KVDB_CORRUPT,
                kv_get_heads_tokens_cc(db, m, &c.key, 1, 3, heads, pp, np, ko, vo, &o, fs, NULL));
  ASSERT_MSG_HAS("checksum mismatch");
  uint32_t far[2] = {5, 290};
  pp[0] = far;
  np[0] = 2;
  ASSERT_OK(kv_get_heads_tokens_cc(db, m, &c.key, 1, 3, heads, pp, np, ko, vo, &o, fs, NULL));
  kvdb_close(db);
  free(c.kv);
  t_rmdir(dir);
}

static void test_bad_input(void)
{
  const kvdb_model *m = &MP;
  char *dir = t_tmpdir("fetch");
  kvdb *db = open_db(dir, 0);
  ctx c;
  put_ctx(db, m, &c, 41, NULL);
  uint32_t pos[2] = {3, 9};
  uint8_t k[512], v[512];
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, NULL, 0, 0, pos, 2, k, v, NULL, NULL));
  ASSERT_MSG_HAS("context");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, NULL, 2, k, v, NULL, NULL));
  ASSERT_MSG_HAS("positions");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, pos, 2, NULL, v, NULL, NULL));
  ASSERT_MSG_HAS("k_out");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, pos, 2, k, NULL, NULL, NULL));
  ASSERT_MSG_HAS("v_out");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, pos, 0, k, v, NULL, NULL));
  ASSERT_MSG_HAS("n_pos");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 2, 0, pos, 2, k, v, NULL, NULL));
  ASSERT_MSG_HAS("layer 2");
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 3, pos, 2, k, v, NULL, NULL));
  ASSERT_MSG_HAS("kv_head 3");
  uint32_t far[2] = {3, N_TOK};
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, far, 2, k, v, NULL, NULL));
  ASSERT_MSG_HAS("positions[1] = 300 out of range");
  kvdb_score_opts o;
  kvdb_score_opts_init(&o);
  o.device = (kvdb_score_device)7;
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, pos, 2, k, v, &o, NULL));
  ASSERT_MSG_HAS("opts->device");
  o.device = KVDB_SCORE_CPU;
  o.struct_size = 1;
  ASSERT_STATUS(KVDB_INVALID, kvdb_get_head_tokens(db, m, &c.key, 0, 0, pos, 2, k, v, &o, NULL));
  ASSERT_MSG_HAS("struct_size");
  kvdb_key missing = c.key;
  missing.b[0] ^= 1;
  ASSERT_STATUS(KVDB_NOTFOUND,
                kvdb_get_head_tokens(db, m, &missing, 0, 0, pos, 2, k, v, NULL, NULL));
  kvdb_model other = *m;
  other.id = "fetch-other";
  ASSERT(kvdb_get_head_tokens(db, &other, &c.key, 0, 0, pos, 2, k, v, NULL, NULL) != KVDB_OK);
  kvdb_close(db);
  free(c.kv);
  t_rmdir(dir);
}

int main(void)
{
  test_tiers(&MP);
  test_tiers(&MK);
  test_tiers(&M0);
  test_compressed();
  test_corrupt();
  test_heads_batch();
  test_checksum_cache();
  test_bad_input();
  printf("test_score_fetch: ok\n");
  return 0;
}
