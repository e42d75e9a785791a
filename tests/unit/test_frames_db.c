/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_frames_db.c — lossless frames in the engine (block format 3, catalog format
 * 5; FORMAT.md §3d): a lossless put writes block objects of frames cut at
 * kvdb_options.lossless_frame_bytes (several frames per block at 4 KiB, one at the default);
 * get, get_tokens of every layer and get_context return the KV bit for bit; verify is clean;
 * a bad frame size is KVDB_INVALID; and the migration: the lossless contexts of the golden
 * format-4 database (zstd-planes sections, block format 2) read as before, and
 * kvdb_recompress to their own config rewrites them as frames with the same KV.
 *
 *   test_frames_db GOLDEN_DIR     (tests/golden/db)
 */
#include "kvdb_test.h" /* first: it defines _GNU_SOURCE */
#include "block.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

/* 4 layers x 2 KV heads x head_dim 32, f16, 32-token blocks: 16 sections of 2 KiB per block */
static const kvdb_model M_SMALL = {"test-frames", 4, 2, 32, KVDB_F16, 32};
/* 8 layers x 4 KV heads x head_dim 64, f16, 64-token blocks: 64 sections of 8 KiB (512 KiB) per
 * block, so that a get decodes its frames on every core (KV_CDEC_MT_MIN_BYTES) */
static const kvdb_model M_BIG = {"test-frames-big", 8, 4, 64, KVDB_F16, 64};
static const kvdb_model *M = &M_SMALL;
static size_t N = 80; /* M_SMALL: 2 full blocks and one of 16 tokens */

static kvdb_options opts(uint32_t frame_bytes)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.log_level = -1;
  o.lossless_frame_bytes = frame_bytes;
  o.packed_block_bytes = 1; /* whole-page frames (block format 3); packed ones (format 5):
                               tests/unit/test_packed.c */
  return o;
}

/* Frames per block object of the segment files under dir/ssd: for every block object of
 * format `version`, the number of frames of its section table is added to *frames and 1 to
 * *blocks. */
static void scan_blocks(const char *dir, uint32_t version, uint32_t *blocks, uint32_t *frames)
{
  char sd[4200];
  snprintf(sd, sizeof sd, "%s/ssd", dir);
  DIR *d = opendir(sd);
  ASSERT(d != NULL);
  struct dirent *de;
  *blocks = *frames = 0;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, "seg-", 4) != 0)
      continue;
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", sd, de->d_name);
    int fd = open(path, O_RDONLY);
    ASSERT(fd >= 0);
    struct stat st;
    ASSERT(fstat(fd, &st) == 0);
    uint8_t *seg = malloc((size_t)st.st_size + 1);
    ASSERT(seg != NULL && pread(fd, seg, (size_t)st.st_size, 0) == st.st_size);
    close(fd);
    for (off_t off = 0; off + 4096 <= st.st_size; off += 4096) {
      kv_block_hdr h;
      if (kv_block_parse_header(seg + off, (size_t)(st.st_size - off), &h) != KVDB_OK ||
          h.version != version || off + (off_t)h.obj.meta_bytes > st.st_size)
        continue;
      (*blocks)++;
      for (uint32_t s = 0; s < h.g.n_sections; s++)
        if (kv_cblock_frame_index(&h, seg + off, s) == 0)
          (*frames)++;
    }
    free(seg);
  }
  closedir(d);
  kv_clear_error();
}

static void check_reads(kvdb *db, const uint32_t *tok, const uint16_t *src, const kvdb_key *ctx)
{
  size_t tb = kvdb_model_token_bytes(M);
  uint16_t *out = malloc(N * tb);
  ASSERT(out != NULL);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, out, M, N, KVDB_LAYOUT_LKTHD));
  size_t hit = 0;
  memset(out, 0xA5, N * tb);
  ASSERT_OK(kvdb_get(db, M, tok, N, &v, &hit));
  ASSERT_EQ(hit, N);
  ASSERT(memcmp(out, src, N * tb) == 0);
  memset(out, 0xA5, N * tb);
  ASSERT_OK(kvdb_get_context(db, M, ctx, &v, NULL, NULL));
  ASSERT(memcmp(out, src, N * tb) == 0);
  /* every layer, positions spread over all three blocks, in any order, repeated */
  uint32_t pos[7] = {79, 0, 33, 31, 64, 33, 50};
  size_t row = (size_t)M->n_kv_heads * M->head_dim; /* elements of one token of one layer, K or V */
  uint16_t *rows = calloc(7 * 2 * row, 2);
  ASSERT(rows != NULL);
  kvdb_kv_view rv;
  ASSERT_OK(kvdb_kv_view_packed(&rv, rows, M, 7, KVDB_LAYOUT_LKTHD));
  for (uint32_t l = 0; l < M->n_layers; l++) {
    memset(rows, 0, 7 * 2 * row * 2);
    ASSERT_OK(kvdb_get_tokens(db, M, ctx, l, pos, 7, &rv));
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t i = 0; i < 7; i++) /* LKTHD: layer 0 of the view holds the layer read */
        ASSERT(memcmp(rows + ((size_t)kv * 7 + i) * row,
                      src + (((size_t)l * 2 + kv) * N + pos[i]) * row, row * 2) == 0);
  }
  free(rows);
  free(out);
}

static void test_frames_put_read(uint32_t frame_bytes, uint32_t want_frames)
{
  char *dir = t_tmpdir("frames");
  kvdb_options o = opts(frame_bytes);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t *tok = malloc(N * sizeof *tok);
  ASSERT(tok != NULL);
  uint64_t seed = 5 + frame_bytes;
  for (size_t i = 0; i < N; i++)
    tok[i] = (uint32_t)(t_rand(&seed) % 30000);
  uint16_t *src = malloc(N * kvdb_model_token_bytes(M));
  ASSERT(src != NULL);
  t_fill_kv(M, tok, N, src);
  kvdb_key ctx;
  ASSERT_OK(t_put_config(db, M, tok, N, "lossless", &ctx));
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.format_version, 5); /* lossless frames */
  check_reads(db, tok, src, &ctx);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  uint32_t blocks, frames;
  scan_blocks(dir, 3, &blocks, &frames);
  ASSERT_EQ(blocks, 3);
  ASSERT_EQ(frames, want_frames);
  /* a reopen (any frame size) reads the same */
  o = opts(0);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  check_reads(db, tok, src, &ctx);
  kvdb_close(db);
  free(src);
  free(tok);
  t_rmdir(dir);
}

static void test_bad_frame_bytes(void)
{
  char *dir = t_tmpdir("framesopt");
  kvdb *db = NULL;
  kvdb_options o = opts(100);
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(dir, &o, &db));
  ASSERT_MSG_HAS("lossless_frame_bytes 100");
  o = opts((16u << 20) + 1);
  ASSERT_STATUS(KVDB_INVALID, kvdb_open(dir, &o, &db));
  o = opts(16u << 20);
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_close(db);
  t_rmdir(dir);
}

static int copy_tree(const char *from, const char *to)
{
  if (mkdir(to, 0755) != 0 && errno != EEXIST)
    return -1;
  DIR *d = opendir(from);
  if (d == NULL)
    return -1;
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.' || strcmp(de->d_name, "MANIFEST") == 0)
      continue;
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/%s", from, de->d_name);
    snprintf(b, sizeof b, "%s/%s", to, de->d_name);
    struct stat st;
    if (stat(a, &st) != 0)
      return -1;
    if (S_ISDIR(st.st_mode)) {
      rc = copy_tree(a, b);
      continue;
    }
    FILE *in = fopen(a, "rb"), *out = fopen(b, "wb");
    if (in == NULL || out == NULL)
      return -1;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
      if (fwrite(buf, 1, n, out) != n)
        rc = -1;
    fclose(in);
    if (fclose(out) != 0)
      rc = -1;
  }
  closedir(d);
  return rc;
}

/* The golden format-4 database's lossless contexts: read as before, then migrated. */
static void test_migrate_golden(const char *golden)
{
  static const kvdb_model GM = {"test/golden", 2, 2, 32, KVDB_F16, 32};
  char src[4200];
  snprintf(src, sizeof src, "%s/format4", golden);
  char *dir = t_tmpdir("framesmig");
  ASSERT(copy_tree(src, dir) == 0);
  uint32_t blocks0, frames0;
  scan_blocks(dir, 3, &blocks0, &frames0);
  ASSERT_EQ(blocks0, 0); /* format 4: no frames */
  kvdb_options o = opts(0);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  kvdb_iter *it;
  ASSERT_OK(kvdb_iter_open(db, &it));
  kvdb_key keys[16];
  kvdb_config cfgs[16];
  uint64_t ntok[16];
  size_t n = 0;
  kvdb_context_info ci;
  while (kvdb_iter_next(it, &ci) == KVDB_OK)
    if (ci.config.method == KVDB_METHOD_LOSSLESS && n < 16) {
      keys[n] = ci.key;
      cfgs[n] = ci.config;
      ntok[n++] = ci.n_tokens;
    }
  kvdb_iter_close(it);
  kv_clear_error();
  ASSERT_EQ(n, 2); /* "lossless" and "lossless:z9" */
  size_t tb = kvdb_model_token_bytes(&GM);
  for (size_t i = 0; i < n; i++) {
    uint16_t *before = calloc(ntok[i], tb), *after = calloc(ntok[i], tb);
    ASSERT(before != NULL && after != NULL);
    kvdb_kv_view vb, va;
    ASSERT_OK(kvdb_kv_view_packed(&vb, before, &GM, ntok[i], KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_kv_view_packed(&va, after, &GM, ntok[i], KVDB_LAYOUT_LKTHD));
    ASSERT_OK(kvdb_get_context(db, &GM, &keys[i], &vb, NULL, NULL));
    ASSERT_OK(kvdb_recompress(db, &GM, &keys[i], &cfgs[i], NULL));
    ASSERT_OK(kvdb_get_context(db, &GM, &keys[i], &va, NULL, NULL));
    ASSERT(memcmp(before, after, ntok[i] * tb) == 0);
    kvdb_context_info cj;
    ASSERT_OK(kvdb_context_stat(db, &keys[i], &cj));
    ASSERT(cj.config.method == KVDB_METHOD_LOSSLESS && cj.config.zstd_level == cfgs[i].zstd_level);
    free(before);
    free(after);
  }
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.format_version, 5);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  uint32_t blocks, frames;
  scan_blocks(dir, 3, &blocks, &frames);
  /* "lossless" (70 tokens): its second and third blocks; its first is shared with the raw
   * context (u) and stays; "lossless:z9" (64 tokens): both blocks */
  ASSERT(blocks >= 3);
  ASSERT_EQ(frames, blocks); /* 8 sections of 2 KiB: one frame per block */
  t_rmdir(dir);
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: test_frames_db GOLDEN_DIR\n");
    return 1;
  }
  /* 2 sections (4 KiB) per frame: 8 frames in each full block, 4 in the 16-token one */
  test_frames_put_read(4096, 8 + 8 + 4);
  printf("ok frames of 4 KiB\n");
  test_frames_put_read(0, 3); /* the default (64 KiB): one frame per block (32 KiB) */
  printf("ok frames of the default size\n");
  /* 512 KiB blocks in frames of 16 KiB (2 sections): 32 frames per full block, decoded on
   * every core by a get (with 2 or more CPUs); the 22-token block: 64 sections of 2816 bytes,
   * 6 per frame (16896 bytes), 11 frames */
  M = &M_BIG;
  N = 150;
  test_frames_put_read(16384, 32 + 32 + 11);
  printf("ok frames of 16 KiB, decoded in parallel\n");
  M = &M_SMALL;
  N = 80;
  test_bad_frame_bytes();
  printf("ok bad frame sizes\n");
  test_migrate_golden(argv[1]);
  printf("ok golden format 4 migrated\n");
  return 0;
}
