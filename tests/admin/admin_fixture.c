/* SPDX-License-Identifier: MIT */
/*
 * tests/admin/admin_fixture.c — builds and damages databases for tests/admin/test_admin.sh.
 * Uses only kvdb.h (plus POSIX file calls for `corrupt`).
 *
 *   admin_fixture create DIR            a database with four contexts; prints "NAME KEYHEX" lines:
 *                                         long    48 tokens (3 blocks)
 *                                         branch  48 tokens sharing the first 2 blocks of long
 *                                         other   40 tokens (2 blocks + a partial one)
 *                                         block   one explicit-key block (kvdb_put_block)
 *   admin_fixture scored DIR            two contexts under models with score_bits 8 and 4
 *                                       (prints "s8 KEYHEX", "s4 KEYHEX")
 *   admin_fixture twins DIR             a database with two explicit-key blocks whose context
 *                                       keys share their first 8 hex digits (found by a birthday
 *                                       search over kvdb_block_context); prints both keys
 *   admin_fixture delete DIR KEYHEX...  kvdb_delete each context
 *   admin_fixture corrupt DIR [OFFSET]  flip one byte (default offset 8192) of the lowest-
 *                                       numbered segment file; prints "SEGMENT_ID OFFSET"
 *
 * The model (2 layers, 2 KV heads, head_dim 128, f16, 16-token blocks) makes every section of
 * a block exactly one 4 KiB page after a one-page meta region, so offset 8192 of the first
 * segment is the first byte of section 1 of the first block written, and verify names that
 * same offset (it reports the start of the failing checksum group).
 *
 * Exit status 0 on success, 1 on any failure (the kvdb status and message on stderr).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvdb.h"

static const kvdb_model model = {
  .id = "test/tiny-llama", .n_layers = 2, .n_kv_heads = 2, .head_dim = 128,
  .dtype = KVDB_F16, .block_tokens = 16,
};

static int check(kvdb_status rc, const char *what)
{
  if (rc == KVDB_OK)
    return 0;
  fprintf(stderr, "admin_fixture: %s: %s: %s\n", what, kvdb_status_name(rc), kvdb_errmsg());
  return 1;
}

/* Deterministic fp16 payload for `n` tokens, packed LKTHD. */
static uint16_t *make_kv(const uint32_t *tokens, size_t n, kvdb_kv_view *view)
{
  size_t elems = n * kvdb_model_token_bytes(&model) / sizeof(uint16_t);
  uint16_t *buf = malloc(elems * sizeof *buf);
  if (buf == NULL)
    return NULL;
  for (size_t i = 0; i < elems; i++)
    buf[i] = (uint16_t)((tokens[(i / 256) % n] * 2654435761u + i) & 0x7bff);
  if (kvdb_kv_view_packed(view, buf, &model, n, KVDB_LAYOUT_LKTHD) != KVDB_OK) {
    free(buf);
    return NULL;
  }
  return buf;
}

static int put_ctx(kvdb *db, const char *name, const uint32_t *tokens, size_t n)
{
  kvdb_kv_view v;
  uint16_t *buf = make_kv(tokens, n, &v);
  if (buf == NULL) {
    fprintf(stderr, "admin_fixture: cannot build the KV of '%s'\n", name);
    return 1;
  }
  kvdb_put_info info;
  int bad = check(kvdb_put(db, &model, tokens, n, &v, &info), name);
  free(buf);
  if (!bad) {
    char hx[33];
    printf("%s %s\n", name, kvdb_key_hex(&info.context, hx));
  }
  return bad;
}

static kvdb_status open_db(const char *dir, uint32_t flags, kvdb **db)
{
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.flags = flags;
  opt.dram_bytes = 0;
  opt.packed_block_bytes = 1; /* whole pages (the figures test_admin.sh checks; packed blocks:
                                 KVDB_ADMIN_FIXTURE_PACKED) */
  if (getenv("KVDB_ADMIN_FIXTURE_PACKED") != NULL)
    opt.packed_block_bytes = 0;
  return kvdb_open(dir, &opt, db);
}

static int do_create(const char *dir)
{
  kvdb *db;
  if (check(open_db(dir, KVDB_O_CREATE, &db), "open"))
    return 1;
  uint32_t lng[48], branch[48], other[40], blk[16];
  for (uint32_t i = 0; i < 48; i++)
    lng[i] = 1000 + i;
  for (uint32_t i = 0; i < 48; i++)
    branch[i] = i < 32 ? 1000 + i : 2000 + i;
  for (uint32_t i = 0; i < 40; i++)
    other[i] = 3000 + i;
  for (uint32_t i = 0; i < 16; i++)
    blk[i] = 4000 + i;
  int bad = put_ctx(db, "long", lng, 48) || put_ctx(db, "branch", branch, 48) ||
            put_ctx(db, "other", other, 40);
  if (!bad) {
    kvdb_key key, ctx;
    for (int i = 0; i < 16; i++)
      key.b[i] = (uint8_t)(0xa0 + i);
    kvdb_kv_view v;
    uint16_t *buf = make_kv(blk, 16, &v);
    bad = buf == NULL || check(kvdb_put_block(db, &model, &key, blk, 16, &v), "put_block") ||
          check(kvdb_block_context(&model, &key, &ctx), "block_context");
    free(buf);
    if (!bad) {
      char hx[33];
      printf("block %s\n", kvdb_key_hex(&ctx, hx));
    }
  }
  kvdb_close(db);
  return bad;
}

/* Two contexts of 32 tokens under models of the same shape that keep score copies (score_bits
 * 8 and 4); prints "s8 KEYHEX" and "s4 KEYHEX". */
static int do_scored(const char *dir)
{
  kvdb *db;
  if (check(open_db(dir, KVDB_O_CREATE, &db), "open"))
    return 1;
  int bad = 0;
  for (uint32_t bits = 8; bits >= 4 && !bad; bits -= 4) {
    kvdb_model m = model;
    m.id = bits == 8 ? "test/tiny-llama-s8" : "test/tiny-llama-s4";
    m.score_bits = bits;
    uint32_t tok[32];
    for (uint32_t i = 0; i < 32; i++)
      tok[i] = 5000 + bits * 100 + i;
    kvdb_kv_view v;
    uint16_t *buf = make_kv(tok, 32, &v);
    kvdb_put_info info;
    bad = buf == NULL || check(kvdb_put(db, &m, tok, 32, &v, &info), m.id);
    free(buf);
    if (!bad) {
      char hx[33];
      printf("s%u %s\n", bits, kvdb_key_hex(&info.context, hx));
    }
  }
  kvdb_close(db);
  return bad;
}

/* Explicit key number i: its index in the first 8 bytes, a fixed pattern in the rest. */
static void twin_key(uint32_t i, kvdb_key *k)
{
  for (int b = 0; b < 16; b++)
    k->b[b] = (uint8_t)(b < 4 ? i >> (8 * b) : 0x5a);
}

#define TWIN_SLOTS (1u << 21)
#define TWIN_TRIES (1u << 20) /* a 32-bit prefix collision is near certain by 2^18 */

static int do_twins(const char *dir)
{
  /* open addressing on the first 32 bits of the context key; slot value i + 1, 0 = empty */
  uint32_t *slot = calloc(TWIN_SLOTS, sizeof *slot);
  if (slot == NULL)
    return 1;
  uint32_t a = 0, b = 0;
  int found = 0;
  for (uint32_t i = 0; i < TWIN_TRIES && !found; i++) {
    kvdb_key k, c;
    twin_key(i, &k);
    if (check(kvdb_block_context(&model, &k, &c), "block_context")) {
      free(slot);
      return 1;
    }
    uint32_t pre = (uint32_t)c.b[0] << 24 | (uint32_t)c.b[1] << 16 | (uint32_t)c.b[2] << 8 | c.b[3];
    for (uint32_t h = pre & (TWIN_SLOTS - 1);; h = (h + 1) & (TWIN_SLOTS - 1)) {
      if (slot[h] == 0) {
        slot[h] = i + 1;
        break;
      }
      kvdb_key k2, c2;
      twin_key(slot[h] - 1, &k2);
      kvdb_block_context(&model, &k2, &c2);
      if (memcmp(c2.b, c.b, 4) == 0) {
        a = slot[h] - 1;
        b = i;
        found = 1;
        break;
      }
    }
  }
  free(slot);
  if (!found) {
    fprintf(stderr, "admin_fixture: no 32-bit context key collision in %u tries\n", TWIN_TRIES);
    return 1;
  }
  kvdb *db;
  if (check(open_db(dir, KVDB_O_CREATE, &db), "open"))
    return 1;
  int bad = 0;
  uint32_t twins[2] = {a, b};
  for (int t = 0; t < 2 && !bad; t++) {
    uint32_t tok[16];
    for (uint32_t j = 0; j < 16; j++)
      tok[j] = 5000 + 100 * (uint32_t)t + j;
    kvdb_key k, c;
    twin_key(twins[t], &k);
    kvdb_kv_view v;
    uint16_t *buf = make_kv(tok, 16, &v);
    bad = buf == NULL || check(kvdb_put_block(db, &model, &k, tok, 16, &v), "put_block") ||
          check(kvdb_block_context(&model, &k, &c), "block_context");
    free(buf);
    if (!bad) {
      char hx[33];
      printf("%s\n", kvdb_key_hex(&c, hx));
    }
  }
  kvdb_close(db);
  return bad;
}

static int do_delete(const char *dir, char **keys, int n)
{
  kvdb *db;
  if (check(open_db(dir, 0, &db), "open"))
    return 1;
  int bad = 0;
  for (int i = 0; i < n && !bad; i++) {
    kvdb_key k;
    bad = check(kvdb_key_parse(keys[i], &k), keys[i]) || check(kvdb_delete(db, &k), keys[i]);
  }
  kvdb_close(db);
  return bad;
}

static int do_corrupt(const char *dir, uint64_t off)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/ssd", dir);
  DIR *d = opendir(path);
  if (d == NULL) {
    perror(path);
    return 1;
  }
  uint64_t best = UINT64_MAX;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    uint64_t id;
    char tail[8];
    if (sscanf(e->d_name, "seg-%16" SCNx64 ".%4s", &id, tail) == 2 && strcmp(tail, "kvs") == 0 &&
        id < best)
      best = id;
  }
  closedir(d);
  if (best == UINT64_MAX) {
    fprintf(stderr, "admin_fixture: no segment file in %s\n", path);
    return 1;
  }
  snprintf(path, sizeof path, "%s/ssd/seg-%016" PRIx64 ".kvs", dir, best);
  int fd = open(path, O_RDWR);
  struct stat st;
  unsigned char byte;
  if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size <= off ||
      pread(fd, &byte, 1, (off_t)off) != 1) {
    fprintf(stderr, "admin_fixture: cannot read offset %" PRIu64 " of %s\n", off, path);
    if (fd >= 0)
      close(fd);
    return 1;
  }
  byte ^= 0xff;
  int bad = pwrite(fd, &byte, 1, (off_t)off) != 1 || fsync(fd) != 0;
  close(fd);
  if (bad) {
    fprintf(stderr, "admin_fixture: cannot write %s\n", path);
    return 1;
  }
  printf("%" PRIu64 " %" PRIu64 "\n", best, off);
  return 0;
}

/* A context of 48 tokens stored int4 with its quality profile and one reported quality. */
static int do_profiled(const char *dir)
{
  kvdb *db;
  if (check(open_db(dir, KVDB_O_CREATE, &db), "open"))
    return 1;
  uint32_t tok[48];
  for (uint32_t i = 0; i < 48; i++)
    tok[i] = 5000 + i * 7;
  /* KV-like values (|x| < 2, a larger spread on some key channels), not make_kv's raw bit
   * patterns: the profile's attention is meaningless over fp16 values near 65504 */
  size_t elems = 48 * kvdb_model_token_bytes(&model) / sizeof(uint16_t);
  uint16_t *buf = malloc(elems * sizeof *buf);
  kvdb_kv_view v;
  if (buf != NULL) {
    uint64_t x = 99;
    for (size_t i = 0; i < elems; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      uint16_t mant = (uint16_t)((x >> 40) & 0x3ff), sign = (uint16_t)((x >> 60) & 1) << 15;
      uint16_t expo = (i % 128) % 16 == 0 ? 0x3c00 : 0x3400; /* [1, 2) or [0.25, 0.5) */
      buf[i] = (uint16_t)(sign | expo | mant);
    }
    if (kvdb_kv_view_packed(&v, buf, &model, 48, KVDB_LAYOUT_LKTHD) != KVDB_OK) {
      free(buf);
      buf = NULL;
    }
  }
  kvdb_put_opts po;
  kvdb_put_opts_init(&po);
  po.flags = KVDB_PUT_PROFILE;
  po.profile_space = "raw,lossless,int8,int4,knorm50";
  kvdb_put_info info;
  int bad = buf == NULL || check(kvdb_config_parse("int4", &po.config), "config") ||
            check(kvdb_put_ex(db, &model, tok, 48, &v, &po, &info), "put_ex") ||
            check(kvdb_report_quality(db, &info.context, &po.config, 0.75), "report");
  free(buf);
  if (!bad) {
    char hx[33];
    printf("profiled %s\n", kvdb_key_hex(&info.context, hx));
  }
  kvdb_close(db);
  return bad;
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "profiled") == 0)
    return do_profiled(argv[2]);
  if (argc == 3 && strcmp(argv[1], "scored") == 0)
    return do_scored(argv[2]);
  if (argc == 3 && strcmp(argv[1], "create") == 0)
    return do_create(argv[2]);
  if (argc == 3 && strcmp(argv[1], "twins") == 0)
    return do_twins(argv[2]);
  if (argc >= 4 && strcmp(argv[1], "delete") == 0)
    return do_delete(argv[2], argv + 3, argc - 3);
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "corrupt") == 0)
    return do_corrupt(argv[2], argc == 4 ? strtoull(argv[3], NULL, 0) : 8192);
  fprintf(stderr, "usage: admin_fixture create DIR | twins DIR | delete DIR KEYHEX... | "
                  "corrupt DIR [OFFSET] | profiled DIR\n");
  return 2;
}
