/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_golden_db.c — databases written by earlier builds must keep opening, reading
 * and verifying, and must keep working after this build writes to them.
 *
 *   test_golden_db DIR            verify tests/golden/db/format1 to 4 (the meson test)
 *   test_golden_db --write DIR    write them: only when a new catalog or block format version is
 *                                 introduced, into a new formatN folder; never rewrite a
 *                                 released format's files
 *   test_golden_db --write-corpus DIR OUT   write the seeds of fuzz_cblock into OUT: the
 *                                 compressed block objects of DIR/format2's segment (one of
 *                                 each kind), whole, cut short and damaged (with fuzz_cblock's
 *                                 repair flags)
 *
 * A golden database is a kvdb directory (catalog.mdb and ssd/seg-*.kvs, without the LMDB lock
 * file) and MANIFEST, the expected answers, one per line:
 *
 *   model ID N_LAYERS N_KV_HEADS HEAD_DIM DTYPE BLOCK_TOKENS
 *   stats FORMAT N_CONTEXTS N_BLOCKS
 *   get N HIT HASH T0 T1 ...          kvdb_lookup and kvdb_get of the tokens: hit tokens and
 *                                     the hash of the hit's KV (LKTHD, positions < HIT)
 *   context KEY CONFIG N_TOKENS HASH  kvdb_context_stat's config and tokens, and the hash of
 *                                     kvdb_get_context's rows, positions and row counts
 *   block KEY N HASH T0 ...           kvdb_get_block of an explicit-key block
 *   absent KEY                        a deleted context: KVDB_NOTFOUND
 *   tier KEY TIER                     kvdb_context_stat's tier (format 3: the SmartSSD tier)
 *   score KEY LAYER HEAD K HASH       kvdb_score of a fixed query (format 3: score regions):
 *                                     the hash of the top K positions and scores
 *   profile KEY CONFIG BYTES QUALITY RELL2 REPORTED NREPORTS   one kvdb_profile_get entry
 *                                     (doubles printed with %a, compared exactly)
 *
 * Verification copies the directory to a scratch folder, then: opens it read-only and checks
 * every line (a read-only open writes nothing, so a format-1 database stays format 1); opens
 * it read-write and checks again; runs kvdb_verify (no problem); writes to it — a compressed
 * context, which lifts a format-1 catalog to format 2, and a compaction that moves the old
 * blocks — then reopens and checks every line once more plus the new context. It reads only
 * the files: neither the generator nor the encoder, whose output may change over time, is
 * consulted (the new context is checked against what the put returned).
 *
 * LMDB files are portable between machines of the same word size and byte order; these were
 * written on x86-64 Linux.
 */
#include "kvdb_test.h" /* first: it defines _GNU_SOURCE */
#include "codec_int.h"
#include "kvgen.h"
#include "block.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <sys/stat.h>

#define GOLDEN_FORMATS 4

static const kvdb_model GM = {"test/golden", 2, 2, 32, KVDB_F16, 32};
/* format 3: a model with int8 score copies (every block carries a score region) */
static const kvdb_model GM3 = {"test/golden-score", 2, 2, 32, KVDB_F16, 32, 8};
/* the model the writer uses */
static const kvdb_model *WM = &GM;

/* ---- hashing and data -------------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
#define FNV0 0xcbf29ce484222325ull

static size_t row_elems(const kvdb_model *m) { return (size_t)m->n_kv_heads * m->head_dim; }

/* Hash of positions [0, hit) of a packed LKTHD buffer of n tokens. */
static uint64_t hash_lkthd(const kvdb_model *m, const uint16_t *buf, size_t n, size_t hit)
{
  uint64_t h = FNV0;
  size_t row = row_elems(m);
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      h = fnv(h, buf + ((size_t)l * 2 + kv) * n * row, hit * row * 2);
  return h;
}

/* KV-like f16 data for n tokens (generator only): per (layer, head), kvgen keys and values. */
static uint16_t *make_kv(const kvdb_model *m, size_t n, uint64_t seed)
{
  size_t row = row_elems(m);
  uint16_t *buf = malloc(n * kvdb_model_token_bytes(m));
  float *f = malloc(sizeof(float) * n * m->head_dim);
  ASSERT(buf != NULL && f != NULL);
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t hd = 0; hd < m->n_kv_heads; hd++) {
        uint64_t s = seed * 1000003u + l * 101u + kv * 11u + hd;
        if (kv == 0)
          kvgen_keys(s, (uint32_t)n, m->head_dim, f);
        else
          kvgen_values(s, (uint32_t)n, m->head_dim, f);
        for (size_t t = 0; t < n; t++)
          for (uint32_t d = 0; d < m->head_dim; d++)
            buf[((size_t)l * 2 + kv) * n * row + t * row + (size_t)hd * m->head_dim + d] =
                kv_codec_f32_to_f16(f[t * m->head_dim + d]);
      }
  free(f);
  return buf;
}

static void make_tokens(uint32_t *t, size_t n, uint64_t seed)
{
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(t_rand(&seed) % 32000);
}

/* ---- the checks (shared by writer and verifier) ------------------------------------------- */

static uint64_t get_hash(kvdb *db, const kvdb_model *m, const uint32_t *tok, size_t n, size_t *hit)
{
  uint16_t *out = calloc(n, kvdb_model_token_bytes(m));
  ASSERT(out != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, m, n, KVDB_LAYOUT_LKTHD));
  size_t looked = 0;
  ASSERT_OK(kvdb_lookup(db, m, tok, n, &looked));
  ASSERT_OK(kvdb_get(db, m, tok, n, &v, hit));
  ASSERT_EQ(looked, *hit);
  uint64_t h = hash_lkthd(m, out, n, *hit);
  free(out);
  return h;
}

static uint64_t context_hash(kvdb *db, const kvdb_model *m, const kvdb_key *key, char *cfg,
                             uint64_t *n_tokens)
{
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, key, &ci));
  kvdb_config_name(&ci.config, cfg, 48);
  size_t n = ci.n_tokens, heads = (size_t)m->n_layers * m->n_kv_heads;
  *n_tokens = n;
  uint16_t *out = calloc(n, kvdb_model_token_bytes(m));
  uint32_t *pos = calloc(heads * n, sizeof *pos), *rows = calloc(heads, sizeof *rows);
  ASSERT(out != NULL && pos != NULL && rows != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, m, n, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_get_context(db, m, key, &v, pos, rows));
  /* rows past a head's count are unspecified: hash the kept ones only */
  uint64_t h = FNV0;
  size_t row = row_elems(m);
  for (uint32_t l = 0; l < m->n_layers; l++)
    for (uint32_t hd = 0; hd < m->n_kv_heads; hd++) {
      size_t s = (size_t)l * m->n_kv_heads + hd;
      ASSERT(rows[s] <= n);
      h = fnv(h, &rows[s], 4);
      h = fnv(h, pos + s * n, rows[s] * 4u);
      for (uint32_t kv = 0; kv < 2; kv++)
        for (size_t r = 0; r < rows[s]; r++)
          h = fnv(h, out + ((size_t)l * 2 + kv) * n * row + r * row + (size_t)hd * m->head_dim,
                  m->head_dim * 2u);
    }
  free(out);
  free(pos);
  free(rows);
  return h;
}

static uint64_t block_hash(kvdb *db, const kvdb_model *m, const kvdb_key *key, const uint32_t *tok,
                           size_t n)
{
  uint16_t *out = calloc(m->block_tokens, kvdb_model_token_bytes(m));
  ASSERT(out != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, m, m->block_tokens, KVDB_LAYOUT_LKTHD));
  size_t got = 0;
  ASSERT_OK(kvdb_get_block(db, m, key, tok, n, &v, &got));
  ASSERT_EQ(got, n);
  uint64_t h = hash_lkthd(m, out, m->block_tokens, n);
  free(out);
  return h;
}

/* kvdb_score of a fixed query (a formula, not a generator) at (layer, head): the hash of the
 * top k positions and their scores' bits. */
static uint64_t score_hash(kvdb *db, const kvdb_model *m, const kvdb_key *key, uint32_t layer,
                           uint32_t head, uint32_t k)
{
  float q[4096];
  ASSERT(m->head_dim <= 4096);
  for (uint32_t d = 0; d < m->head_dim; d++)
    q[d] = (float)((int)((d * 7 + layer * 3 + head * 5) % 11) - 5) / 4.0f;
  uint32_t *pos = calloc(k, sizeof *pos);
  float *sc = calloc(k, sizeof *sc);
  ASSERT(pos != NULL && sc != NULL);
  ASSERT_OK(kvdb_score(db, m, key, layer, head, q, KVDB_F32, k, pos, sc));
  uint64_t h = fnv(FNV0, pos, k * sizeof *pos);
  h = fnv(h, sc, k * sizeof *sc);
  free(pos);
  free(sc);
  return h;
}

/* ---- writing ------------------------------------------------------------------------------ */

static kvdb_options golden_opts(void)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0; /* every read comes from the files */
  o.log_level = -1;
  return o;
}

static kvdb_put_info put_cfg(kvdb *db, const uint32_t *tok, size_t n, uint64_t seed,
                             const char *cfg, uint32_t flags)
{
  uint16_t *kv = make_kv(WM, n, seed);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse(cfg, &po.config));
  po.flags = flags;
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, kv, WM, n, KVDB_LAYOUT_LKTHD));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, WM, tok, n, &v, &po, &info));
  free(kv);
  return info;
}

static void emit_get(FILE *mf, kvdb *db, const uint32_t *tok, size_t n)
{
  size_t hit = 0;
  uint64_t h = get_hash(db, WM, tok, n, &hit);
  fprintf(mf, "get %zu %zu %016" PRIx64, n, hit, h);
  for (size_t i = 0; i < n; i++)
    fprintf(mf, " %" PRIu32, tok[i]);
  fputc('\n', mf);
}

static void emit_context(FILE *mf, kvdb *db, const kvdb_key *key)
{
  char hex[33], cfg[48];
  uint64_t n = 0;
  uint64_t h = context_hash(db, WM, key, cfg, &n);
  fprintf(mf, "context %s %s %" PRIu64 " %016" PRIx64 "\n", kvdb_key_hex(key, hex), cfg, n, h);
}

static void emit_profile(FILE *mf, kvdb *db, const kvdb_key *key)
{
  kvdb_profile_entry e[64];
  size_t n = 0;
  ASSERT_OK(kvdb_profile_get(db, key, e, 64, &n));
  ASSERT(n > 0 && n <= 64);
  char hex[33], cfg[48];
  for (size_t i = 0; i < n; i++)
    fprintf(mf, "profile %s %s %" PRIu64 " %a %a %a %" PRIu32 "\n", kvdb_key_hex(key, hex),
            kvdb_config_name(&e[i].config, cfg, sizeof cfg), e[i].bytes, e[i].quality,
            e[i].rel_l2, e[i].reported_quality, e[i].n_reports);
}

static void emit_stats(FILE *mf, kvdb *db)
{
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  fprintf(mf, "stats %" PRIu32 " %" PRIu64 " %" PRIu64 "\n", st.format_version, st.n_contexts,
          st.n_blocks);
}

static void write_format1(const char *dir)
{
  kvdb *db;
  kvdb_options o = golden_opts();
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t a[80], b[112], c[40], e[20], q[60];
  make_tokens(a, 80, 1);          /* 2 full blocks + a partial one */
  memcpy(b, a, 64 * sizeof *a);   /* shares a's two full blocks */
  make_tokens(b + 64, 48, 2);
  make_tokens(c, 40, 3);          /* deleted below: dead bytes in the segment */
  make_tokens(e, 20, 4);
  memcpy(q, a, 50 * sizeof *a);   /* a query that leaves a's path inside block 2 */
  make_tokens(q + 50, 10, 5);
  kvdb_put_info ia = put_cfg(db, a, 80, 1, "raw", 0);
  kvdb_put_info ib = put_cfg(db, b, 112, 2, "raw", 0);
  kvdb_put_info ic = put_cfg(db, c, 40, 3, "raw", 0);
  kvdb_key ek;
  for (int i = 0; i < 16; i++)
    ek.b[i] = (uint8_t)(0x11 * (i + 1));
  uint16_t *ekv = make_kv(&GM, GM.block_tokens, 4);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, ekv, &GM, GM.block_tokens, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_put_block(db, &GM, &ek, e, 20, &v));
  free(ekv);
  ASSERT_OK(kvdb_delete(db, &ic.context));

  char path[4200];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *mf = fopen(path, "w");
  ASSERT(mf != NULL);
  fprintf(mf, "model %s %u %u %u %u %u\n", GM.id, GM.n_layers, GM.n_kv_heads, GM.head_dim,
          (unsigned)GM.dtype, GM.block_tokens);
  emit_stats(mf, db);
  emit_get(mf, db, a, 80);
  emit_get(mf, db, b, 112);
  emit_get(mf, db, q, 60);
  emit_get(mf, db, c, 40); /* deleted: a miss */
  emit_context(mf, db, &ia.context);
  emit_context(mf, db, &ib.context);
  char hex[33];
  kvdb_key stored;
  ASSERT_OK(kvdb_block_context(&GM, &ek, &stored));
  fprintf(mf, "block %s 20 %016" PRIx64, kvdb_key_hex(&ek, hex), block_hash(db, &GM, &ek, e, 20));
  for (int i = 0; i < 20; i++)
    fprintf(mf, " %" PRIu32, e[i]);
  fputc('\n', mf);
  emit_context(mf, db, &stored);
  fprintf(mf, "absent %s\n", kvdb_key_hex(&ic.context, hex));
  ASSERT(fclose(mf) == 0);
  kvdb_close(db);
}

static void write_format2(const char *dir)
{
  kvdb *db;
  kvdb_options o = golden_opts();
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t p[64], qt[70], r[64], s[64], t[96];
  make_tokens(p, 64, 11);
  make_tokens(qt, 70, 12);
  make_tokens(r, 64, 13);
  make_tokens(s, 64, 14);
  memcpy(t, qt, 32 * sizeof *t); /* shares q's first block; stored raw, so that block is rewritten raw */
  make_tokens(t + 32, 64, 15);
  kvdb_put_info ip = put_cfg(db, p, 64, 11, "lossless", KVDB_PUT_PROFILE);
  kvdb_put_info iq = put_cfg(db, qt, 70, 12, "int4", 0);
  kvdb_put_info ir = put_cfg(db, r, 64, 13, "knorm50+int8", 0);
  kvdb_put_info is = put_cfg(db, s, 64, 14, "raw", 0);
  kvdb_put_info it = put_cfg(db, t, 96, 15, "raw", 0);
  kvdb_config cfg;
  ASSERT_OK(kvdb_config_parse("int8", &cfg));
  ASSERT_OK(kvdb_recompress(db, &GM, &is.context, &cfg, NULL));
  ASSERT_OK(kvdb_config_parse("int4", &cfg));
  ASSERT_OK(kvdb_report_quality(db, &ip.context, &cfg, 0.9375));

  char path[4200];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *mf = fopen(path, "w");
  ASSERT(mf != NULL);
  fprintf(mf, "model %s %u %u %u %u %u\n", GM.id, GM.n_layers, GM.n_kv_heads, GM.head_dim,
          (unsigned)GM.dtype, GM.block_tokens);
  emit_stats(mf, db);
  emit_get(mf, db, p, 64);
  emit_get(mf, db, qt, 70);
  emit_get(mf, db, r, 64); /* dropped tokens: kvdb_get stops at the first block */
  emit_get(mf, db, s, 64);
  emit_get(mf, db, t, 96);
  const kvdb_key *keys[] = {&ip.context, &iq.context, &ir.context, &is.context, &it.context};
  for (size_t i = 0; i < 5; i++)
    emit_context(mf, db, keys[i]);
  emit_profile(mf, db, &ip.context);
  ASSERT(fclose(mf) == 0);
  kvdb_close(db);
}

/* ---- verifying ---------------------------------------------------------------------------- */

static int copy_file(const char *from, const char *to)
{
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  if (in == NULL || out == NULL)
    return -1;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n)
      return -1;
  fclose(in);
  return fclose(out);
}

/* Copies a golden database (files and one level of sub-folders), skipping MANIFEST. */
/* Format 3: score regions (a scoring model) and the SmartSSD tier. */
static void write_format3(const char *dir)
{
  kvdb *db;
  kvdb_options o = golden_opts();
  o.smartssd_bytes = 64 << 20; /* DIR/smartssd, recorded as the database's */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  WM = &GM3;
  uint32_t p[64], q[40], r[70];
  make_tokens(p, 64, 31);
  make_tokens(q, 40, 32);
  memcpy(r, p, 32 * sizeof *r); /* shares p's first block */
  make_tokens(r + 32, 38, 33);
  kvdb_put_info ip = put_cfg(db, p, 64, 31, "raw", 0);
  kvdb_put_info iq = put_cfg(db, q, 40, 32, "int8", 0);
  kvdb_put_info ir = put_cfg(db, r, 70, 33, "lossless", 0);
  kvdb_config cfg;
  ASSERT_OK(kvdb_config_parse("int8", &cfg));
  ASSERT_OK(kvdb_relocate(db, WM, &iq.context, &cfg, KVDB_TIER_SMARTSSD, NULL));
  ASSERT_OK(kvdb_config_parse("lossless", &cfg));
  ASSERT_OK(kvdb_relocate(db, WM, &ir.context, &cfg, KVDB_TIER_SMARTSSD, NULL));

  char path[4200];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *mf = fopen(path, "w");
  ASSERT(mf != NULL);
  fprintf(mf, "model %s %u %u %u %u %u %u\n", WM->id, WM->n_layers, WM->n_kv_heads, WM->head_dim,
          (unsigned)WM->dtype, WM->block_tokens, WM->score_bits);
  emit_stats(mf, db);
  emit_get(mf, db, p, 64);
  emit_get(mf, db, q, 40);
  emit_get(mf, db, r, 70);
  const kvdb_key *keys[] = {&ip.context, &iq.context, &ir.context};
  char hex[33];
  for (size_t i = 0; i < 3; i++) {
    emit_context(mf, db, keys[i]);
    kvdb_context_info ci;
    ASSERT_OK(kvdb_context_stat(db, keys[i], &ci));
    fprintf(mf, "tier %s %u\n", kvdb_key_hex(keys[i], hex), ci.tier);
    for (uint32_t l = 0; l < WM->n_layers; l++)
      for (uint32_t h = 0; h < WM->n_kv_heads; h++)
        fprintf(mf, "score %s %u %u 10 %016" PRIx64 "\n", hex, l, h,
                score_hash(db, WM, keys[i], l, h, 10));
  }
  ASSERT(fclose(mf) == 0);
  kvdb_close(db);
  WM = &GM;
}

/* Format 4 (catalog indexes `next` and `segblocks`; block format 2 with one zstd frame per byte
 * plane of each page group of each section): every config kind as this format writes it, so
 * that a later section or block format (issue 16) keeps reading them and `kvdb_recompress`
 * can migrate them. */
static void write_format4(const char *dir)
{
  kvdb *db;
  kvdb_options o = golden_opts();
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t p[70], q[64], r[64], s[64], t[64], u[80];
  make_tokens(p, 70, 41);
  make_tokens(q, 64, 42);
  make_tokens(r, 64, 43);
  make_tokens(s, 64, 44);
  make_tokens(t, 64, 45);
  memcpy(u, p, 32 * sizeof *u); /* shares p's first (lossless) block */
  make_tokens(u + 32, 48, 46);
  kvdb_put_info ip = put_cfg(db, p, 70, 41, "lossless", KVDB_PUT_PROFILE);
  kvdb_put_info iq = put_cfg(db, q, 64, 42, "lossless:z9", 0);
  kvdb_put_info ir = put_cfg(db, r, 64, 43, "int4:r16", 0);
  kvdb_put_info is = put_cfg(db, s, 64, 44, "keydiff50+int4", 0);
  kvdb_put_info it = put_cfg(db, t, 64, 45, "int2", 0);
  kvdb_put_info iu = put_cfg(db, u, 80, 46, "raw", 0);

  char path[4200];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *mf = fopen(path, "w");
  ASSERT(mf != NULL);
  fprintf(mf, "model %s %u %u %u %u %u\n", GM.id, GM.n_layers, GM.n_kv_heads, GM.head_dim,
          (unsigned)GM.dtype, GM.block_tokens);
  emit_stats(mf, db);
  emit_get(mf, db, p, 70);
  emit_get(mf, db, q, 64);
  emit_get(mf, db, r, 64);
  emit_get(mf, db, s, 64); /* dropped tokens: kvdb_get stops at the first block */
  emit_get(mf, db, t, 64);
  emit_get(mf, db, u, 80);
  const kvdb_key *keys[] = {&ip.context, &iq.context, &ir.context, &is.context, &it.context,
                            &iu.context};
  for (size_t i = 0; i < 6; i++)
    emit_context(mf, db, keys[i]);
  emit_profile(mf, db, &ip.context);
  ASSERT(fclose(mf) == 0);
  kvdb_close(db);
}

static void copy_db(const char *from, const char *to)
{
  ASSERT(mkdir(to, 0755) == 0 || errno == EEXIST);
  DIR *d = opendir(from);
  ASSERT(d != NULL);
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.' || strcmp(de->d_name, "MANIFEST") == 0)
      continue;
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", from, de->d_name);
    snprintf(b, sizeof b, "%s/%s", to, de->d_name);
    struct stat st;
    ASSERT(stat(a, &st) == 0);
    if (S_ISDIR(st.st_mode))
      copy_db(a, b);
    else
      ASSERT(copy_file(a, b) == 0);
  }
  closedir(d);
}

typedef struct manifest {
  char **lines;
  size_t n;
  kvdb_model model;
  char model_id[64];
} manifest;

static void read_manifest(const char *dir, manifest *mf)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/MANIFEST", dir);
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "test_golden_db: cannot open %s: %s\n", path, strerror(errno));
    exit(T_EXIT_FAIL);
  }
  memset(mf, 0, sizeof *mf);
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    line[strcspn(line, "\n")] = 0;
    mf->lines = realloc(mf->lines, (mf->n + 1) * sizeof *mf->lines);
    mf->lines[mf->n++] = strdup(line);
  }
  free(line);
  fclose(f);
  unsigned l, h, d, dt, bt, sb = 0; /* score_bits: format 3 on */
  ASSERT(mf->n > 0 && sscanf(mf->lines[0], "model %63s %u %u %u %u %u %u", mf->model_id, &l, &h,
                             &d, &dt, &bt, &sb) >= 6);
  mf->model = (kvdb_model){mf->model_id, l, h, d, (kvdb_dtype)dt, bt, sb};
}

static size_t parse_tokens(char **save, uint32_t **tok, size_t n)
{
  *tok = malloc((n ? n : 1) * sizeof **tok);
  ASSERT(*tok != NULL);
  for (size_t i = 0; i < n; i++) {
    char *w = strtok_r(NULL, " ", save);
    ASSERT(w != NULL);
    (*tok)[i] = (uint32_t)strtoul(w, NULL, 10);
  }
  return n;
}

/* A config name as a manifest of formats 1 to 4 writes it, in today's names: those formats
 * were written before issue 16, when "int4" and "int2" were KIVI, which is named "kivi4" and
 * "kivi2" since int4 and int2 became KVQuant (the stored config is the same 12 bytes; only its
 * name changed). Dropping with quantized rows ("keydiff50+int4") kept its name. */
static const char *today_name(const char *want, char *buf, size_t cap)
{
  if ((strncmp(want, "int4", 4) == 0 || strncmp(want, "int2", 4) == 0) &&
      (want[4] == 0 || want[4] == ':')) {
    snprintf(buf, cap, "kivi%s", want + 3);
    return buf;
  }
  return want;
}

/* Checks every manifest line against an open handle. `written`: 0 as written; 2 opened
 * read-write (upgraded to KVDB_FORMAT_VERSION, same contents); 1 this build wrote to it
 * (lifted to a later format, more contexts: stats lines then check >=). */
static void check_all(kvdb *db, const manifest *mf, int written)
{
  const kvdb_model *m = &mf->model;
  for (size_t i = 1; i < mf->n; i++) {
    char *line = strdup(mf->lines[i]), *save = NULL;
    char *op = strtok_r(line, " ", &save);
    if (op == NULL) {
      free(line);
      continue;
    }
    if (strcmp(op, "stats") == 0) {
      unsigned fmt;
      uint64_t nc, nb;
      ASSERT(sscanf(save, "%u %" SCNu64 " %" SCNu64, &fmt, &nc, &nb) == 3);
      kvdb_stats st;
      ASSERT_OK(kvdb_stat(db, &st));
      if (written != 1) { /* 2: opened read-write, so upgraded to format 4 (its block
                           * indexes; format 5 comes with the first lossless frames) */
        ASSERT_EQ(st.format_version, written == 2 ? (fmt > 4 ? fmt : 4) : fmt);
        ASSERT_EQ(st.n_contexts, nc);
        ASSERT_EQ(st.n_blocks, nb);
      } else {
        ASSERT(st.format_version >= fmt && st.n_contexts > nc);
      }
    } else if (strcmp(op, "get") == 0) {
      size_t n = strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      size_t want_hit = strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      uint64_t want = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
      uint32_t *tok;
      parse_tokens(&save, &tok, n);
      size_t hit = 0;
      uint64_t h = get_hash(db, m, tok, n, &hit);
      if (hit != want_hit || h != want) {
        fprintf(stderr, "test_golden_db: line %zu: get: hit %zu hash %016" PRIx64
                        ", expected hit %zu hash %016" PRIx64 "\n",
                i + 1, hit, h, want_hit, want);
        abort();
      }
      free(tok);
    } else if (strcmp(op, "context") == 0) {
      kvdb_key key;
      ASSERT_OK(kvdb_key_parse(strtok_r(NULL, " ", &save), &key));
      char today[48];
      const char *want_cfg = today_name(strtok_r(NULL, " ", &save), today, sizeof today);
      uint64_t want_n = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
      uint64_t want = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
      char cfg[48];
      uint64_t n = 0;
      uint64_t h = context_hash(db, m, &key, cfg, &n);
      if (strcmp(cfg, want_cfg) != 0 || n != want_n || h != want) {
        fprintf(stderr, "test_golden_db: line %zu: context: %s %" PRIu64 " %016" PRIx64
                        ", expected %s %" PRIu64 " %016" PRIx64 "\n",
                i + 1, cfg, n, h, want_cfg, want_n, want);
        abort();
      }
    } else if (strcmp(op, "block") == 0) {
      kvdb_key key;
      ASSERT_OK(kvdb_key_parse(strtok_r(NULL, " ", &save), &key));
      size_t n = strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      uint64_t want = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
      uint32_t *tok;
      parse_tokens(&save, &tok, n);
      uint64_t h = block_hash(db, m, &key, tok, n);
      if (h != want) {
        fprintf(stderr, "test_golden_db: line %zu: block hash %016" PRIx64 ", expected %016" PRIx64
                        "\n", i + 1, h, want);
        abort();
      }
      free(tok);
    } else if (strcmp(op, "tier") == 0) {
      kvdb_key key;
      ASSERT_OK(kvdb_key_parse(strtok_r(NULL, " ", &save), &key));
      unsigned want = (unsigned)strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      kvdb_context_info ci;
      ASSERT_OK(kvdb_context_stat(db, &key, &ci));
      ASSERT_EQ(ci.tier, want);
    } else if (strcmp(op, "score") == 0) {
      kvdb_key key;
      ASSERT_OK(kvdb_key_parse(strtok_r(NULL, " ", &save), &key));
      uint32_t l = (uint32_t)strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      uint32_t hd = (uint32_t)strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      uint32_t k = (uint32_t)strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      uint64_t want = strtoull(strtok_r(NULL, " ", &save), NULL, 16);
      kvdb_context_info ci; /* written before version 2: its blocks score with version 1 */
      ASSERT_OK(kvdb_context_stat(db, &key, &ci));
      ASSERT_EQ(ci.score_versions, 1);
      uint64_t h = score_hash(db, m, &key, l, hd, k);
      if (h != want) {
        fprintf(stderr, "test_golden_db: line %zu: score hash %016" PRIx64 ", expected %016" PRIx64
                        "\n", i + 1, h, want);
        abort();
      }
    } else if (strcmp(op, "absent") == 0) {
      kvdb_key key;
      ASSERT_OK(kvdb_key_parse(strtok_r(NULL, " ", &save), &key));
      kvdb_context_info ci;
      ASSERT_STATUS(KVDB_NOTFOUND, kvdb_context_stat(db, &key, &ci));
    } else if (strcmp(op, "profile") == 0) {
      kvdb_key key;
      ASSERT_OK(kvdb_key_parse(strtok_r(NULL, " ", &save), &key));
      char today[48];
      const char *want_cfg = today_name(strtok_r(NULL, " ", &save), today, sizeof today);
      uint64_t bytes = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
      double q = strtod(strtok_r(NULL, " ", &save), NULL);
      double l2 = strtod(strtok_r(NULL, " ", &save), NULL);
      double rq = strtod(strtok_r(NULL, " ", &save), NULL);
      uint32_t nr = (uint32_t)strtoul(strtok_r(NULL, " ", &save), NULL, 10);
      kvdb_profile_entry e[64];
      size_t n = 0;
      ASSERT_OK(kvdb_profile_get(db, &key, e, 64, &n));
      int found = 0;
      for (size_t j = 0; j < n && j < 64; j++) {
        char cfg[48];
        if (strcmp(kvdb_config_name(&e[j].config, cfg, sizeof cfg), want_cfg) != 0)
          continue;
        found = 1;
        ASSERT_EQ(e[j].bytes, bytes);
        ASSERT(e[j].quality == q || (isnan(q) && isnan(e[j].quality)));
        ASSERT(e[j].rel_l2 == l2 || (isnan(l2) && isnan(e[j].rel_l2)));
        ASSERT(e[j].reported_quality == rq || (isnan(rq) && isnan(e[j].reported_quality)));
        ASSERT_EQ(e[j].n_reports, nr);
      }
      if (!found) {
        fprintf(stderr, "test_golden_db: line %zu: no profile entry %s\n", i + 1, want_cfg);
        abort();
      }
    } else {
      fprintf(stderr, "test_golden_db: line %zu: unknown line '%s'\n", i + 1, op);
      abort();
    }
    free(line);
  }
}

static void verify_clean(kvdb *db)
{
  kvdb_verify_report rep;
  memset(&rep, 0, sizeof rep);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  ASSERT(rep.blocks_checked > 0);
}

static void verify_one(const char *golden, const char *scratch, unsigned format)
{
  manifest mf;
  read_manifest(golden, &mf);
  copy_db(golden, scratch);
  kvdb_options o = golden_opts();
  kvdb *db;

  /* read-only first: nothing may be written, not even the format-1 catalog's lift */
  o.flags = KVDB_O_RDONLY;
  ASSERT_OK(kvdb_open(scratch, &o, &db));
  check_all(db, &mf, 0);
  kvdb_close(db);

  /* read-write: the open upgrades the catalog to the current format (builds its block
   * indexes in one transaction); every answer stays the same and it verifies clean (verify
   * checks the indexes against the block records) */
  o = golden_opts();
  ASSERT_OK(kvdb_open(scratch, &o, &db));
  check_all(db, &mf, 2);
  verify_clean(db);

  /* write: a compressed context (a format-1 catalog becomes format 2), then compaction */
  kvdb_model m = mf.model;
  uint32_t tok[50];
  make_tokens(tok, 50, 99);
  uint16_t *kv = make_kv(&m, 50, 99), *out = calloc(50, kvdb_model_token_bytes(&m));
  ASSERT(out != NULL);
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  ASSERT_OK(kvdb_config_parse("int4", &po.config));
  po.flags = KVDB_PUT_PROFILE;
  kvdb_kv_view v, ov;
  ASSERT_OK(kvdb_kv_view_packed(&v, kv, &m, 50, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_kv_view_packed(&ov, out, &m, 50, KVDB_LAYOUT_LKTHD));
  kvdb_put_info info;
  ASSERT_OK(kvdb_put_ex(db, &m, tok, 50, &v, &po, &info));
  /* and a lossless one (lossless frames: format 5) */
  uint32_t ltok[40];
  make_tokens(ltok, 40, 98);
  uint16_t *lkv = make_kv(&m, 40, 98), *lout = calloc(40, kvdb_model_token_bytes(&m));
  ASSERT(lout != NULL);
  kvdb_put_opts lpo;
  kvdb_put_opts_init(&lpo);
  ASSERT_OK(kvdb_config_parse("lossless", &lpo.config));
  kvdb_kv_view lv, lov;
  ASSERT_OK(kvdb_kv_view_packed(&lv, lkv, &m, 40, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_kv_view_packed(&lov, lout, &m, 40, KVDB_LAYOUT_LKTHD));
  kvdb_put_info linfo;
  ASSERT_OK(kvdb_put_ex(db, &m, ltok, 40, &lv, &lpo, &linfo));
  size_t hit = 0;
  ASSERT_OK(kvdb_get(db, &m, ltok, 40, &lov, &hit));
  ASSERT_EQ(hit, 40);
  ASSERT(memcmp(lout, lkv, 40 * kvdb_model_token_bytes(&m)) == 0);
  free(lkv);
  free(lout);
  ASSERT_OK(kvdb_get(db, &m, tok, 50, &ov, &hit));
  ASSERT_EQ(hit, 50);
  uint64_t new_hash = hash_lkthd(&m, out, 50, 50);
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  /* upgraded by the read-write open to format 4, then 5 by the lossless put (frames), and 6
   * only where the int4 put wrote version-2 score copies (FORMAT.md, format 6); 9 where the
   * model has no score copies: its small lossless blocks are packed (block format 5, §3f) */
  kvdb_context_info wci;
  ASSERT_OK(kvdb_context_stat(db, &info.context, &wci));
  ASSERT_EQ(st.format_version, m.score_bits == 0 ? 9u : (wci.score_versions & 2u) ? 6u : 5u);
  ASSERT(st.format_version <= KVDB_FORMAT_VERSION);
  kvdb_compact_report cr;
  ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, &cr));
  if (format == 1)
    ASSERT(cr.bytes_reclaimed > 0); /* the deleted context's blocks */
  kvdb_close(db);

  ASSERT_OK(kvdb_open(scratch, &o, &db));
  check_all(db, &mf, 1);
  memset(out, 0, 50 * kvdb_model_token_bytes(&m));
  ASSERT_OK(kvdb_get(db, &m, tok, 50, &ov, &hit));
  ASSERT_EQ(hit, 50);
  ASSERT_EQ(hash_lkthd(&m, out, 50, 50), new_hash);
  kvdb_profile_entry e[64];
  size_t ne = 0;
  ASSERT_OK(kvdb_profile_get(db, &info.context, e, 64, &ne));
  ASSERT(ne > 0);
  verify_clean(db);
  kvdb_close(db);
  free(kv);
  free(out);
  for (size_t i = 0; i < mf.n; i++)
    free(mf.lines[i]);
  free(mf.lines);
  printf("ok golden format%u (%zu manifest lines)\n", format, mf.n - 1);
}

/* ---- fuzz seeds ---------------------------------------------------------------------------- */

static void put_seed(const char *out, const char *name, unsigned flags, const uint8_t *b,
                     size_t n)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", out, name);
  FILE *f = fopen(path, "wb");
  uint8_t fl = (uint8_t)flags;
  ASSERT(f != NULL && fwrite(&fl, 1, 1, f) == 1 && fwrite(b, 1, n, f) == n && fclose(f) == 0);
}

/* Block objects start on 4 KiB boundaries; the format-2 ones are found by their header. */
static void write_corpus(const char *golden, const char *out)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/format2/ssd/seg-0000000000000001.kvs", golden);
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  ASSERT(fseek(f, 0, SEEK_END) == 0);
  long size = ftell(f);
  ASSERT(size > 0 && fseek(f, 0, SEEK_SET) == 0);
  uint8_t *seg = malloc((size_t)size);
  ASSERT(seg != NULL && fread(seg, 1, (size_t)size, f) == (size_t)size);
  fclose(f);
  ASSERT(mkdir(out, 0755) == 0 || errno == EEXIST);
  /* in write order: lossless (2 blocks), int4 (2 + a 6-token one), knorm50+int8 (2), int8 (2);
   * seeds from one block of each kind keep the corpus small */
  unsigned n = 0, found = 0;
  for (long off = 0; off + 4096 <= size; off += 4096) {
    kv_block_hdr h;
    if (kv_block_parse_header(seg + off, (size_t)(size - off), &h) != KVDB_OK || !KV_HDR_CPR(&h) ||
        off + (long)h.obj.total_bytes > size)
      continue;
    unsigned idx = found++;
    if (idx != 0 && idx != 2 && idx != 4 && idx != 5)
      continue;
    uint8_t *b = seg + off;
    size_t tot = h.obj.total_bytes, meta = h.obj.meta_bytes;
    char name[64];
    snprintf(name, sizeof name, "block%u_whole.bin", n);
    put_seed(out, name, 0, b, tot);
    snprintf(name, sizeof name, "block%u_meta_only.bin", n);
    put_seed(out, name, 0, b, meta);
    snprintf(name, sizeof name, "block%u_one_page.bin", n);
    put_seed(out, name, 0, b, meta + 4096 < tot ? meta + 4096 : tot);
    uint8_t *d = malloc(tot);
    ASSERT(d != NULL);
    /* a flipped byte in the first section's header, with pages and meta repaired: the
     * section decoder sees it */
    memcpy(d, b, tot);
    d[meta + 5] ^= 0x40;
    snprintf(name, sizeof name, "block%u_sect_hdr_repair.bin", n);
    put_seed(out, name, 7, d, tot);
    /* a flipped byte deep in the data, unrepaired (a page mismatch) and repaired */
    memcpy(d, b, tot);
    d[tot - 4096 / 2 - 1 > meta ? tot - 4096 / 2 - 1 : meta] ^= 0x01;
    snprintf(name, sizeof name, "block%u_data_flip.bin", n);
    put_seed(out, name, 0, d, tot);
    snprintf(name, sizeof name, "block%u_data_flip_repair.bin", n);
    put_seed(out, name, 7, d, tot);
    /* a section length moved by one, meta repaired: the table no longer tiles the data */
    memcpy(d, b, tot);
    kv_put_le32(d + h.cl.sectab_off + 8, kv_get_le32(d + h.cl.sectab_off + 8) + 1);
    snprintf(name, sizeof name, "block%u_sectab_repair.bin", n);
    put_seed(out, name, 6, d, tot);
    free(d);
    n++;
  }
  ASSERT(n > 0);
  free(seg);
  printf("wrote %u compressed blocks' seeds to %s\n", n, out);
}

int main(int argc, char **argv)
{
  if (argc == 4 && strcmp(argv[1], "--write-corpus") == 0) {
    write_corpus(argv[2], argv[3]);
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "--write") == 0) {
    /* only the formats not written yet: released formats are never rewritten (format 1 can
     * only be written by a build of that format) */
    void (*writers[])(const char *) = {write_format1, write_format2, write_format3,
                                          write_format4};
    for (unsigned f = 1; f <= GOLDEN_FORMATS; f++) {
      char dir[4096], lock[4200];
      snprintf(dir, sizeof dir, "%s/format%u", argv[2], f);
      struct stat st;
      if (stat(dir, &st) == 0) {
        printf("format%u exists: kept\n", f);
        continue;
      }
      writers[f - 1](dir);
      snprintf(lock, sizeof lock, "%s/catalog.mdb-lock", dir);
      unlink(lock);
      printf("format%u written\n", f);
    }
    return 0;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: test_golden_db DIR | --write DIR\n");
    return T_EXIT_FAIL;
  }
  char *tmpl = t_tmpdir("golden");
  for (unsigned f = 1; f <= GOLDEN_FORMATS; f++) {
    char golden[4096], scratch[4200];
    snprintf(golden, sizeof golden, "%s/format%u", argv[1], f);
    snprintf(scratch, sizeof scratch, "%s/format%u", tmpl, f);
    verify_one(golden, scratch, f);
  }
  t_rmdir(tmpl);
  return 0;
}
