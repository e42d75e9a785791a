/* SPDX-License-Identifier: MIT */
/*
 * fpga/tests/test_fpga_emu.c — the emulated device through the device seam: score copies written
 * to a file, P2P-read (O_DIRECT pread) into device buffers, scored by the emulated device's
 * kernel (emu_kernel.c; the HLS kernel file compiled with gcc under KVDB_FPGA_EMU_KERNEL=hls,
 * test fpga-emu-hls; the two equal bit for bit on arbitrary bytes, test_emu_equals_hls); the
 * score blocks and on-chip top k equal the CPU scorer's bit for bit. Then
 * every misuse gets a clear error: misaligned P2P reads, host access to P2P buffers, a short
 * file, shapes the kernel cannot take, chunks off a word, k > 64, small buffers, XRT asked for
 * without its environment.
 */
#include "fpga_test.h"

#include <math.h>

#include "fpga_int.h" /* kv_score_kernel_emu */

static void test_equal_cpu(void)
{
  t_rng r = {31};
  const uint32_t shapes[][3] = {{3000, 128, 8}, {2500, 128, 4}, {1111, 64, 8}, {700, 8, 8},
                                {900, 8, 4},    {640, 256, 8}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    t_ctx c;
    t_ctx_make(&c, &r, shapes[si][0], shapes[si][1], shapes[si][2], 1024);
    if (si == 0)
      printf("file %s opened with%s O_DIRECT\n", c.path, c.direct ? "" : "out (not supported here)");
    kv_fpga_opts o;
    kv_fpga_opts_init(&o);
    kv_fpga_dev *dev;
    kv_fpga_err e;
    REQUIRE(kv_fpga_open(&o, &dev, &e) == KV_FPGA_OK, "open: %s", t_fpga_errtext(&e));
    CHECK(kv_fpga_dev_backend(dev) == KV_FPGA_EMULATED, "AUTO without xclbin/device = emulated");
    float q[2 * 256];
    for (uint32_t j = 0; j < 2 * c.head_dim; j++)
      q[j] = t_gauss(&r);
    kv_score_query *qq;
    REQUIRE(kv_score_query_create(KV_SCORE_F32, q, 2, c.head_dim, c.head_dim * 4,
                                  si % 2 ? KV_SCORE_MAX : KV_SCORE_SUM, &qq, NULL) == KV_SCORE_OK,
            "query");
    uint8_t qpack[KV_FPGA_QUERY_BYTES];
    REQUIRE(kv_fpga_query_pack(qq, qpack, sizeof qpack, &e) == KV_FPGA_OK, "pack");
    kv_fpga_buf *sect, *qb, *blk, *tk;
    REQUIRE(kv_fpga_buf_alloc(dev, 1 << 20, KV_FPGA_BUF_P2P, &sect, &e) == KV_FPGA_OK, "alloc: %s",
            t_fpga_errtext(&e));
    REQUIRE(kv_fpga_buf_alloc(dev, KV_FPGA_QUERY_BYTES, KV_FPGA_BUF_IN, &qb, &e) == KV_FPGA_OK, "q");
    REQUIRE(kv_fpga_buf_alloc(dev, 1024 * 8, KV_FPGA_BUF_OUT, &blk, &e) == KV_FPGA_OK, "blk");
    REQUIRE(kv_fpga_buf_alloc(dev, 64 * 8, KV_FPGA_BUF_OUT, &tk, &e) == KV_FPGA_OK, "tk");
    REQUIRE(kv_fpga_buf_write(dev, qb, 0, qpack, sizeof qpack, &e) == KV_FPGA_OK, "write q");
    kv_score_pair *got = malloc(1024 * sizeof *got);
    float *ref = malloc(1024 * 4);
    int bad_blocks = 0;
    for (uint32_t b = 0; b < c.n_blocks; b++) {
      const kv_score_layout *l = &c.views[b].layout;
      /* the section at a nonzero offset inside the device buffer */
      REQUIRE(kv_fpga_p2p_read(dev, sect, 8192, c.fd, c.file_off[b], (size_t)l->total_bytes, &e) ==
                  KV_FPGA_OK,
              "p2p: %s", t_fpga_errtext(&e));
      REQUIRE(kv_score_tokens(qq, &c.views[b], 0, l->n_tokens, KV_SCORE_IMPL_AUTO, ref, NULL) ==
                  KV_SCORE_OK,
              "cpu");
      uint32_t chunk = 64 * (1 + t_below(&r, 8));
      for (uint32_t t0 = 0; t0 < l->n_tokens; t0 += chunk) {
        uint32_t n = l->n_tokens - t0 < chunk ? l->n_tokens - t0 : chunk;
        kv_fpga_run_args a = {sect, 8192, *l, t0, n, b * c.block_tokens, 5, qb, blk, tk};
        kv_fpga_run *run;
        REQUIRE(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_OK, "run: %s", t_fpga_errtext(&e));
        REQUIRE(kv_fpga_run_wait(run, &e) == KV_FPGA_OK, "wait");
        REQUIRE(kv_fpga_buf_read(dev, blk, 0, got, (size_t)n * 8, &e) == KV_FPGA_OK, "read");
        for (uint32_t i = 0; i < n; i++)
          if (got[i].pos != b * c.block_tokens + t0 + i || memcmp(&got[i].score, &ref[t0 + i], 4))
            bad_blocks++;
        kv_score_pair top[5];
        REQUIRE(kv_fpga_buf_read(dev, tk, 0, top, sizeof top, &e) == KV_FPGA_OK, "read top");
        uint64_t mem[2 * 5 + 256];
        kv_score_acc acc;
        kv_score_acc_init(&acc, 5, mem, sizeof mem, NULL);
        kv_score_acc_push_scores(&acc, b * c.block_tokens + t0, ref + t0, n);
        uint32_t pos[5];
        float sc[5];
        uint32_t m = kv_score_acc_finish(&acc, pos, sc);
        for (uint32_t i = 0; i < m; i++)
          CHECK(top[i].pos == pos[i] && memcmp(&top[i].score, &sc[i], 4) == 0,
                "shape %zu block %u chunk %u: top-k rank %u", si, b, t0, i);
      }
    }
    CHECK(bad_blocks == 0, "shape %zu: %d score block entries differ from the CPU scorer", si,
          bad_blocks);
    free(got);
    free(ref);
    kv_fpga_buf_free(sect);
    kv_fpga_buf_free(qb);
    kv_fpga_buf_free(blk);
    kv_fpga_buf_free(tk);
    kv_fpga_close(dev);
    kv_score_query_free(qq);
    t_ctx_free(&c);
  }
}

static void test_errors(void)
{
  t_rng r = {5};
  t_ctx c;
  t_ctx_make(&c, &r, 500, 96, 8, 500); /* d = 96: a row of 96 bytes, not a power of two */
  kv_fpga_dev *dev;
  kv_fpga_err e;
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  o.backend = KV_FPGA_EMULATED;
  REQUIRE(kv_fpga_open(&o, &dev, &e) == KV_FPGA_OK, "open");
  kv_fpga_buf *sect, *qb, *blk, *tk, *small;
  REQUIRE(kv_fpga_buf_alloc(dev, 1 << 20, KV_FPGA_BUF_P2P, &sect, &e) == KV_FPGA_OK, "alloc");
  REQUIRE(kv_fpga_buf_alloc(dev, KV_FPGA_QUERY_BYTES, KV_FPGA_BUF_IN, &qb, &e) == KV_FPGA_OK, "q");
  REQUIRE(kv_fpga_buf_alloc(dev, 1024 * 8, KV_FPGA_BUF_OUT, &blk, &e) == KV_FPGA_OK, "blk");
  REQUIRE(kv_fpga_buf_alloc(dev, 64 * 8, KV_FPGA_BUF_OUT, &tk, &e) == KV_FPGA_OK, "tk");
  REQUIRE(kv_fpga_buf_alloc(dev, 100, KV_FPGA_BUF_OUT, &small, &e) == KV_FPGA_OK, "small");
  CHECK(kv_fpga_buf_size(small) == 4096, "sizes round up to 4 KiB");
  const kv_score_layout *l = &c.views[0].layout;
  CHECK(kv_fpga_p2p_read(dev, sect, 100, c.fd, c.file_off[0], 4096, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "aligned") != NULL,
        "misaligned buffer offset: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_p2p_read(dev, sect, 0, c.fd, 100, 4096, &e) == KV_FPGA_EINVAL,
        "misaligned file offset");
  CHECK(kv_fpga_p2p_read(dev, sect, 0, c.fd, 0, 1000, &e) == KV_FPGA_EINVAL, "misaligned length");
  CHECK(kv_fpga_p2p_read(dev, sect, 1 << 20, c.fd, 0, 4096, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "end of the buffer") != NULL,
        "past the buffer: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_p2p_read(dev, qb, 0, c.fd, 0, 4096, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "P2P") != NULL,
        "P2P into a normal buffer: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_p2p_read(dev, sect, 0, c.fd, 1 << 30, 4096, &e) == KV_FPGA_EIO &&
            strstr(t_fpga_errtext(&e), "end of the file") != NULL,
        "short file: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_p2p_read(dev, sect, 0, -1, 0, 4096, &e) == KV_FPGA_EINVAL, "bad fd");
  uint8_t x[64];
  CHECK(kv_fpga_buf_write(dev, sect, 0, x, 64, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "P2P") != NULL,
        "host write to a P2P buffer: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_buf_read(dev, qb, 0, x, 64, &e) == KV_FPGA_EINVAL, "read of an IN-only buffer");
  CHECK(kv_fpga_buf_write(dev, blk, 0, x, 64, &e) == KV_FPGA_EINVAL, "write of an OUT-only buffer");
  CHECK(kv_fpga_buf_read(dev, small, 4000, x, 200, &e) == KV_FPGA_EINVAL, "read past the end");
  kv_fpga_buf *bad;
  CHECK(kv_fpga_buf_alloc(dev, 4096, KV_FPGA_BUF_P2P | KV_FPGA_BUF_OUT, &bad, &e) ==
                KV_FPGA_EINVAL &&
            bad == NULL,
        "P2P combined with OUT");
  CHECK(kv_fpga_buf_alloc(dev, 0, KV_FPGA_BUF_OUT, &bad, &e) == KV_FPGA_EINVAL, "0 bytes");

  /* runs */
  REQUIRE(kv_fpga_p2p_read(dev, sect, 0, c.fd, c.file_off[0], (size_t)l->total_bytes, &e) ==
              KV_FPGA_OK,
          "p2p");
  kv_fpga_run *run;
  kv_fpga_run_args a = {sect, 0, *l, 0, 100, 0, 0, qb, blk, NULL};
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EUNSUPPORTED &&
            strstr(t_fpga_errtext(&e), "power-of-two") != NULL && run == NULL,
        "96-byte rows: %s", t_fpga_errtext(&e));
  kv_score_layout l8;
  kv_score_layout_init(&l8, 1000, 8, 8, NULL); /* 8-byte rows: chunks start on multiples of 8 */
  a.layout = l8;
  a.t0 = 3;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "word") != NULL,
        "chunk off a word: %s", t_fpga_errtext(&e));
  a.t0 = 0;
  a.k = 65;
  a.topk = tk;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EUNSUPPORTED, "k = 65");
  a.k = 64;
  a.topk = small;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_OK, "k = 64 with 4096 bytes: %s",
        t_fpga_errtext(&e));
  if (run)
    kv_fpga_run_wait(run, NULL);
  a.k = 0;
  a.n = 1001;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "past the end of the section") != NULL,
        "chunk past the section: %s", t_fpga_errtext(&e));
  a.blocks = small; /* 4096 bytes: 512 pairs */
  a.n = 600;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "8 bytes per token") != NULL,
        "block buffer too small: %s", t_fpga_errtext(&e));
  a.blocks = blk;
  a.n = 100;
  a.sect = qb;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL, "section in a non-P2P buffer");
  a.sect = sect;
  a.sect_off = 32;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL, "section offset not 64-aligned");
  a.sect_off = (1 << 20) - 4096;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "past the end of its buffer") != NULL,
        "section past its buffer: %s", t_fpga_errtext(&e));
  a.sect_off = 0;
  a.layout.page_tokens = 7;
  CHECK(kv_fpga_run_start(dev, &a, &run, &e) == KV_FPGA_EINVAL, "forged layout");

  /* queries the kernel cannot hold */
  float q[9 * 128];
  for (int i = 0; i < 9 * 128; i++)
    q[i] = 1.0f;
  kv_score_query *q9;
  kv_score_query_create(KV_SCORE_F32, q, 9, 128, 512, KV_SCORE_MAX, &q9, NULL);
  uint8_t qpack[KV_FPGA_QUERY_BYTES];
  CHECK(kv_fpga_query_pack(q9, qpack, sizeof qpack, &e) == KV_FPGA_EUNSUPPORTED &&
            strstr(t_fpga_errtext(&e), "8 query vectors") != NULL,
        "9 vectors: %s", t_fpga_errtext(&e));
  kv_score_query_free(q9);

  kv_fpga_buf_free(sect);
  kv_fpga_buf_free(qb);
  kv_fpga_buf_free(blk);
  kv_fpga_buf_free(tk);
  kv_fpga_buf_free(small);
  kv_fpga_close(dev);
  kv_fpga_close(NULL);

  /* XRT without its environment: a clean ENODEV, XRT never touched */
  unsetenv("XILINX_XRT");
  o.backend = KV_FPGA_XRT;
  o.xclbin_path = "/nonexistent.xclbin";
  kv_fpga_dev *xd = (kv_fpga_dev *)&e;
  kv_fpga_status rc = kv_fpga_open(&o, &xd, &e);
  CHECK((rc == KV_FPGA_ENODEV && strstr(t_fpga_errtext(&e), "XILINX_XRT") != NULL) ||
            rc == KV_FPGA_EUNSUPPORTED,
        "XRT without XILINX_XRT: %s", t_fpga_errtext(&e));
  CHECK(xd == NULL, "failed open sets *out = NULL");
  setenv("XILINX_XRT", "/nonexistent-xrt", 1);
  rc = kv_fpga_open(&o, &xd, &e);
  CHECK(rc == KV_FPGA_ENODEV || rc == KV_FPGA_EUNSUPPORTED, "XILINX_XRT without libxrt_core: %s",
        t_fpga_errtext(&e));
  setenv("XCL_EMULATION_MODE", "sw_emu", 1);
  const char *why = NULL;
  CHECK(!kv_fpga_xrt_env_ok(&why) && strstr(why, "XCL_EMULATION_MODE") != NULL,
        "sw_emu refused: %s", why ? why : "");
  unsetenv("XCL_EMULATION_MODE");
  /* AUTO with an xclbin but no device: emulated */
  o.backend = KV_FPGA_AUTO;
  REQUIRE(kv_fpga_open(&o, &xd, &e) == KV_FPGA_OK, "auto");
  CHECK(kv_fpga_dev_backend(xd) == KV_FPGA_EMULATED, "AUTO falls back to the emulated device");
  kv_fpga_close(xd);
  o.kernel_name = "other_kernel";
  CHECK(kv_fpga_open(&o, &xd, &e) == KV_FPGA_EDEVICE, "emulated device has only kv_score_kernel");
  t_ctx_free(&c);
}

/* Rows gathered on the device equal the file's; a group whose bytes differ from its checksum is
 * KV_FPGA_ECORRUPT before anything is gathered; bad gather arguments are refused. */
static void test_gather(void)
{
  t_rng r = {77};
  kv_fpga_dev *dev = t_emu_open();
  kv_fpga_err e;
  int verified = -1;
  for (int round = 0; round < 3; round++)
    CHECK(t_gather_run(dev, &r, 0, &verified, &e) == KV_FPGA_OK, "gather: %s", t_fpga_errtext(&e));
  CHECK(verified == 1, "the emulated device verifies the groups");
  CHECK(t_gather_run(dev, &r, 1, &verified, &e) == KV_FPGA_ECORRUPT &&
            strstr(t_fpga_errtext(&e), "checksum") != NULL && e.limit == 3 * 4096,
        "a damaged group: %s", t_fpga_errtext(&e));
  /* misuse */
  kv_fpga_buf *src, *in, *out;
  REQUIRE(kv_fpga_buf_alloc(dev, 8192, KV_FPGA_BUF_P2P, &src, &e) == KV_FPGA_OK &&
              kv_fpga_buf_alloc(dev, 4096, KV_FPGA_BUF_IN, &in, &e) == KV_FPGA_OK &&
              kv_fpga_buf_alloc(dev, 4096, KV_FPGA_BUF_OUT, &out, &e) == KV_FPGA_OK,
          "buffers");
  uint64_t off[2] = {0, 8192 - 256};
  kv_fpga_gcheck ck = {4096, 0, 1, 4096};
  kv_fpga_gather_args a = {src, in, out, off, 2, 256, &ck, 1};
  kv_fpga_gather_args b = a;
  b.row_off = (const uint64_t[]){0, 8000};
  CHECK(kv_fpga_gather(dev, &b, NULL, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "past the end") != NULL,
        "row past the buffer: %s", t_fpga_errtext(&e));
  b = a;
  b.n_rows = 17; /* 17 x 256 > 4096 */
  b.row_off = (const uint64_t[17]){0};
  CHECK(kv_fpga_gather(dev, &b, NULL, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "output buffer too small") != NULL,
        "small output: %s", t_fpga_errtext(&e));
  b = a;
  b.src = in;
  CHECK(kv_fpga_gather(dev, &b, NULL, &e) == KV_FPGA_EINVAL, "source not P2P");
  b = a;
  b.checks = (const kv_fpga_gcheck[]){{4096, 8190, 1, 4096}};
  CHECK(kv_fpga_gather(dev, &b, NULL, &e) == KV_FPGA_EINVAL, "checksum past the end");
  b = a;
  b.row_bytes = 0;
  CHECK(kv_fpga_gather(dev, &b, NULL, &e) == KV_FPGA_EINVAL, "row of 0 bytes");
  b = a;
  b.checks = NULL;
  CHECK(kv_fpga_gather(dev, &b, NULL, &e) == KV_FPGA_EINVAL, "NULL checks");
  CHECK(kv_fpga_gather(dev, NULL, NULL, &e) == KV_FPGA_EINVAL, "NULL arguments");
  kv_fpga_buf_free(src);
  kv_fpga_buf_free(in);
  kv_fpga_buf_free(out);
  kv_fpga_close(dev);
}

/* kv_fpga_select: the best k of segments of pairs (gaps between them, equal scores, -0 and +0,
 * NaN, infinities) equals the CPU accumulator's top k as a set; bad arguments are refused. */
static void test_select(void)
{
  t_rng r = {91};
  kv_fpga_dev *dev = t_emu_open();
  kv_fpga_err e;
  enum { SLOTS = 3000 };
  kv_score_pair *in = malloc(SLOTS * sizeof *in), *all = malloc(SLOTS * sizeof *all);
  kv_score_pair *got = malloc(SLOTS * sizeof *got);
  uint32_t *rpos = malloc(SLOTS * 4);
  float *rsc = malloc(SLOTS * 4);
  void *mem = malloc(kv_score_acc_bytes(SLOTS));
  kv_fpga_buf *bin, *desc, *out;
  REQUIRE(kv_fpga_buf_alloc(dev, SLOTS * 8, KV_FPGA_BUF_IN | KV_FPGA_BUF_OUT, &bin, &e) ==
                  KV_FPGA_OK &&
              kv_fpga_buf_alloc(dev, 4096, KV_FPGA_BUF_IN, &desc, &e) == KV_FPGA_OK &&
              kv_fpga_buf_alloc(dev, SLOTS * 8, KV_FPGA_BUF_OUT, &out, &e) == KV_FPGA_OK,
          "buffers");
  for (int trial = 0; trial < 20; trial++) {
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e30f, -1e30f};
    for (uint32_t i = 0; i < SLOTS; i++) {
      uint32_t c = t_below(&r, 12);
      float f = c < 6 ? special[c] : c == 6 ? NAN : c == 7 ? INFINITY : (float)t_below(&r, 50) - 25;
      in[i] = (kv_score_pair){1000000u + i * 7u, f};
    }
    REQUIRE(kv_fpga_buf_write(dev, bin, 0, in, SLOTS * 8, &e) == KV_FPGA_OK, "write");
    uint32_t segs[64], n_segs = 0, n = 0;
    for (uint32_t at = t_below(&r, 50); at < SLOTS && n_segs < 32;) { /* segments with gaps */
      uint32_t cnt = 1 + t_below(&r, 200);
      if (at + cnt > SLOTS)
        cnt = SLOTS - at;
      segs[2 * n_segs] = at;
      segs[2 * n_segs + 1] = cnt;
      n_segs++;
      for (uint32_t i = 0; i < cnt; i++)
        all[n++] = in[at + i];
      at += cnt + t_below(&r, 40);
    }
    uint32_t k = trial == 0 ? n : trial == 1 ? 1 : 1 + t_below(&r, n);
    kv_fpga_select_args a = {bin, desc, out, segs, n_segs, k};
    REQUIRE(kv_fpga_select(dev, &a, &e) == KV_FPGA_OK, "select: %s", t_fpga_errtext(&e));
    REQUIRE(kv_fpga_buf_read(dev, out, 0, got, (size_t)k * 8, &e) == KV_FPGA_OK, "read");
    kv_score_acc acc, acc2;
    REQUIRE(kv_score_acc_init(&acc, k, mem, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "acc");
    kv_score_acc_push_pairs(&acc, all, n);
    uint32_t m = kv_score_acc_finish(&acc, rpos, rsc);
    /* the device's k pairs, ordered by the same accumulator, must be the same list */
    uint32_t *gpos = malloc((size_t)k * 4);
    float *gsc = malloc((size_t)k * 4);
    REQUIRE(kv_score_acc_init(&acc2, k, mem, kv_score_acc_bytes(k), NULL) == KV_SCORE_OK, "acc");
    kv_score_acc_push_pairs(&acc2, got, k);
    uint32_t m2 = kv_score_acc_finish(&acc2, gpos, gsc);
    CHECK(m == k && m2 == k && memcmp(gpos, rpos, (size_t)k * 4) == 0 &&
              memcmp(gsc, rsc, (size_t)k * 4) == 0,
          "trial %d: select k=%u of %u pairs in %u segments equals the CPU top k", trial, k, n,
          n_segs);
    free(gpos);
    free(gsc);
  }
  uint32_t bad_seg[2] = {3070, 5}; /* the buffer holds 24576 / 8 = 3072 pairs */
  kv_fpga_select_args b = {bin, desc, out, bad_seg, 1, 5};
  CHECK(kv_fpga_select(dev, &b, &e) == KV_FPGA_EINVAL && strstr(t_fpga_errtext(&e), "past the end"),
        "segment past the buffer: %s", t_fpga_errtext(&e));
  uint32_t seg[2] = {0, 10};
  b = (kv_fpga_select_args){bin, desc, out, seg, 1, 11};
  CHECK(kv_fpga_select(dev, &b, &e) == KV_FPGA_EINVAL, "k above the pairs");
  b.k = 0;
  CHECK(kv_fpga_select(dev, &b, &e) == KV_FPGA_EINVAL, "k = 0");
  b = (kv_fpga_select_args){bin, out, out, seg, 1, 5};
  CHECK(kv_fpga_select(dev, &b, &e) == KV_FPGA_EINVAL, "descriptors not IN");
  kv_fpga_buf_free(bin);
  kv_fpga_buf_free(desc);
  kv_fpga_buf_free(out);
  kv_fpga_close(dev);
  free(in);
  free(all);
  free(got);
  free(rpos);
  free(rsc);
  free(mem);
}

/* The emulated device's kernel (emu_kernel.c, the default) equals the HLS C kernel bit for bit,
 * on arbitrary bytes: every row size from 1 to 512 bytes, int8 and int4, 1 to 8 query vectors,
 * scales that are NaN, infinite, negative or zero, chunks at word offsets, k 0 to 64. */
static void test_emu_equals_hls(void)
{
  t_rng r = {43};
  const uint32_t rows[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  enum { SECT_WORDS = 4096 };
  kvk_word *sect = malloc(SECT_WORDS * sizeof *sect);
  kvk_word *query = malloc(KVK_QUERY_WORDS * sizeof *query);
  kvk_pair *b1 = malloc(1024 * sizeof *b1), *b2 = malloc(1024 * sizeof *b2);
  kvk_pair t1[KVK_MAX_TOPK], t2[KVK_MAX_TOPK];
  REQUIRE(sect != NULL && query != NULL && b1 != NULL && b2 != NULL, "oom");
  int bad = 0, cases = 0;
  for (int rep = 0; rep < 400; rep++) {
    uint32_t rb = rows[t_below(&r, 10)], bits = t_below(&r, 2) ? 8 : 4;
    for (size_t i = 0; i < SECT_WORDS * sizeof *sect; i++)
      ((uint8_t *)sect)[i] = (uint8_t)t_next(&r);
    for (size_t i = 0; i < KVK_QUERY_WORDS * sizeof *query; i++)
      ((uint8_t *)query)[i] = (uint8_t)t_next(&r);
    uint32_t n_vec = t_below(&r, 10); /* 0 and 9 are clamped by both */
    memcpy(query[0].b, &n_vec, 4);
    const uint32_t scale_word = 1, code_word = 64; /* scales: words 1..63 (1008 tokens) */
    for (uint32_t t = 0; t < 1008; t++) { /* mostly ordinary scales, some special ones */
      float f = (float)t_gauss(&r);
      uint32_t u = t_below(&r, 16);
      if (u == 0)
        f = NAN;
      else if (u == 1)
        f = t_below(&r, 2) ? INFINITY : -INFINITY;
      else if (u == 2)
        f = t_below(&r, 2) ? 0.0f : -0.0f;
      memcpy((uint8_t *)(sect + scale_word) + 4 * t, &f, 4);
    }
    for (uint32_t v = 0; v < KVK_MAX_VEC; v++) {
      float f = t_below(&r, 12) == 0 ? NAN : (float)t_gauss(&r);
      memcpy(query[0].b + 8 + 4 * v, &f, 4);
    }
    uint32_t per_word = rb >= 64 ? 1 : 64 / rb, max_t = (SECT_WORDS - code_word) * 64 / rb;
    if (max_t > 1008)
      max_t = 1008;
    uint32_t t0 = t_below(&r, max_t / 2) / per_word * per_word;
    uint32_t n = 1 + t_below(&r, max_t - t0);
    uint32_t k = t_below(&r, 4) == 0 ? 0 : 1 + t_below(&r, KVK_MAX_TOPK);
    memset(b1, 0xa5, 1024 * sizeof *b1);
    memset(b2, 0xa5, 1024 * sizeof *b2);
    memset(t1, 0x5a, sizeof t1);
    memset(t2, 0x5a, sizeof t2);
    kv_score_kernel(sect, sect, query, b1, t1, scale_word, code_word, t0, n, 1000, rb, bits, k);
    kv_score_kernel_emu(sect, sect, query, b2, t2, scale_word, code_word, t0, n, 1000, rb, bits,
                        k);
    uint32_t m = k < n ? k : n;
    if (memcmp(b1, b2, (size_t)n * sizeof *b1) != 0 || memcmp(t1, t2, m * sizeof *t1) != 0) {
      if (bad++ < 5)
        printf("differs: row %u bits %u n_vec %u t0 %u n %u k %u\n", rb, bits, n_vec, t0, n, k);
    }
    cases++;
  }
  CHECK(bad == 0, "%d of %d runs: the emulated kernel differs from the HLS C kernel", bad, cases);
  free(sect);
  free(query);
  free(b1);
  free(b2);
}

int main(void)
{
  test_emu_equals_hls();
  test_equal_cpu();
  test_errors();
  test_gather();
  test_select();
  return t_finish("test_fpga_emu");
}
