/* SPDX-License-Identifier: MIT */
/*
 * fpga/tests/test_fpga_hie.c — HIE (HillInfer §4.2): a context's blocks split at random between
 * the host (in-memory views) and the device (sections in a file, emulated device), random chunk
 * sizes, k below and above the on-chip capacity; kv_hie_topk must equal kv_score_topk over all
 * tokens bit for bit, and its statistics must account for every token and byte. APP (§4.3):
 * Eq. 4 against hand-computed values, Eq. 2 balanced by the split, Eq. 3 binding, the alpha = 0
 * case beta = f_c / f_s, the skewness correction, bad profiles.
 */
#include "fpga_test.h"

#include <math.h>

static void test_hie_random_splits(void)
{
  t_rng r = {17};
  kv_fpga_dev *dev = t_emu_open();
  kv_fpga_err e;
  const uint32_t shapes[][4] = {{6000, 128, 8, 256}, {5000, 128, 4, 512}, {3000, 64, 8, 1000},
                                {2000, 8, 4, 300}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    t_ctx c;
    t_ctx_make(&c, &r, shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
    uint32_t d = c.head_dim, N = c.n_tokens;
    float *q = malloc((size_t)4 * d * 4);
    for (uint32_t j = 0; j < 4 * d; j++)
      q[j] = t_gauss(&r);
    kv_score_query *qq;
    REQUIRE(kv_score_query_create(KV_SCORE_F32, q, 4, d, (size_t)d * 4,
                                  si % 2 ? KV_SCORE_MAX : KV_SCORE_SUM, &qq, NULL) == KV_SCORE_OK,
            "query");
    /* the reference: every block on the host */
    kv_score_span *all = malloc(c.n_blocks * sizeof *all);
    for (uint32_t b = 0; b < c.n_blocks; b++)
      all[b] = (kv_score_span){&c.views[b], 0, c.views[b].layout.n_tokens, b * c.block_tokens};
    uint32_t *rpos = malloc((size_t)N * 4), *pos = malloc((size_t)N * 4);
    float *rsc = malloc((size_t)N * 4), *sc = malloc((size_t)N * 4);
    kv_score_span *host = malloc(2 * c.n_blocks * sizeof *host); /* up to two per block */
    kv_hie_dev_span *ds = malloc(c.n_blocks * sizeof *ds);
    const uint32_t ks[] = {1, 10, 64, 65, N / 20, N / 10, N};
    for (int trial = 0; trial < 12; trial++) {
      uint32_t k = ks[trial % 7];
      uint32_t got = 0;
      REQUIRE(kv_score_topk(qq, all, c.n_blocks, k, NULL, NULL, 0, rpos, rsc, &got, NULL) ==
                  KV_SCORE_OK,
              "reference");
      /* random split: 0 %, 100 % or a random share of the blocks on the device; host blocks
       * further cut into two spans at a random token */
      size_t nh = 0, nd = 0;
      int mode = trial % 4;
      for (uint32_t b = 0; b < c.n_blocks; b++) {
        int on_dev = mode == 0 ? 0 : mode == 1 ? 1 : (int)t_below(&r, 2);
        if (on_dev) {
          ds[nd++] = (kv_hie_dev_span){c.file_off[b], c.views[b].layout, b * c.block_tokens};
        } else {
          uint32_t m = c.views[b].layout.n_tokens, cut = t_below(&r, m + 1);
          if (cut > 0)
            host[nh++] = (kv_score_span){&c.views[b], 0, cut, b * c.block_tokens};
          if (cut < m)
            host[nh++] = (kv_score_span){&c.views[b], cut, m - cut, b * c.block_tokens};
        }
      }
      kv_hie_job job = {0};
      job.q = qq;
      job.host = host;
      job.n_host = nh;
      job.fd = c.fd;
      job.dev = ds;
      job.n_dev = nd;
      job.chunk_tokens = 64 * (1 + t_below(&r, 12));
      kv_score_opts_init(&job.host_opts);
      job.host_opts.n_threads = 1 + t_below(&r, 3);
      kv_hie_stats st;
      uint32_t got2 = 0;
      kv_fpga_status rc = kv_hie_topk(dev, &job, k, pos, sc, &got2, &st, &e);
      REQUIRE(rc == KV_FPGA_OK, "hie: %s", t_fpga_errtext(&e));
      int bad = -1;
      for (uint32_t i = 0; i < k && bad < 0; i++)
        if (pos[i] != rpos[i] || memcmp(&sc[i], &rsc[i], 4) != 0)
          bad = (int)i;
      CHECK(got2 == k && bad < 0,
            "shape %zu trial %d (k=%u, %zu host spans, %zu device sections, chunk %u): rank %d "
            "got (%u, %.9g) want (%u, %.9g)",
            si, trial, k, nh, nd, job.chunk_tokens, bad, pos[bad < 0 ? 0 : bad],
            (double)sc[bad < 0 ? 0 : bad], rpos[bad < 0 ? 0 : bad], (double)rsc[bad < 0 ? 0 : bad]);
      uint64_t dev_tok = 0, p2p = 0;
      for (size_t i = 0; i < nd; i++) {
        dev_tok += ds[i].layout.n_tokens;
        p2p += ds[i].layout.total_bytes;
      }
      CHECK(st.host_tokens + st.dev_tokens == N && st.dev_tokens == dev_tok && st.p2p_bytes == p2p,
            "stats: host %llu + device %llu tokens, p2p %llu bytes",
            (unsigned long long)st.host_tokens, (unsigned long long)st.dev_tokens,
            (unsigned long long)st.p2p_bytes);
      uint64_t per_chunk = k <= KV_FPGA_MAX_TOPK ? (uint64_t)k * 8 : 0;
      if (nd > 0 && per_chunk > 0)
        CHECK(st.to_host_bytes <= st.dev_runs * per_chunk,
              "k <= 64: only the on-chip top k crosses (%llu bytes for %llu runs)",
              (unsigned long long)st.to_host_bytes, (unsigned long long)st.dev_runs);
      if (nd > 0 && per_chunk == 0)
        CHECK(st.to_host_bytes == (k < dev_tok ? k : dev_tok) * 8 && st.dev_selects == 1,
              "k > 64: the blocks stay on the device, its top k crosses once (%llu bytes, %llu "
              "selections)",
              (unsigned long long)st.to_host_bytes, (unsigned long long)st.dev_selects);
    }
    free(q);
    free(all);
    free(rpos);
    free(pos);
    free(rsc);
    free(sc);
    free(host);
    free(ds);
    kv_score_query_free(qq);
    t_ctx_free(&c);
  }
  /* bad input */
  kv_hie_job job = {0};
  uint32_t pos[4];
  CHECK(kv_hie_topk(dev, &job, 1, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL, "no query");
  float qf[128] = {1};
  kv_score_query *qq;
  kv_score_query_create(KV_SCORE_F32, qf, 1, 128, 0, KV_SCORE_SUM, &qq, NULL);
  job.q = qq;
  CHECK(kv_hie_topk(dev, &job, 0, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "k is 0") != NULL,
        "k = 0: %s", t_fpga_errtext(&e));
  CHECK(kv_hie_topk(dev, &job, 1, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "larger than the number of tokens") != NULL,
        "k > N: %s", t_fpga_errtext(&e));
  kv_hie_dev_span ds1 = {100, {0}, 0};
  kv_score_layout_init(&ds1.layout, 10, 128, 8, NULL);
  job.dev = &ds1;
  job.n_dev = 1;
  CHECK(kv_hie_topk(dev, &job, 1, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "4096") != NULL,
        "unaligned device span: %s", t_fpga_errtext(&e));
  CHECK(kv_hie_topk(NULL, &job, 1, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL,
        "device spans without a device");
  job.chunk_tokens = 100;
  ds1.file_off = 0;
  CHECK(kv_hie_topk(dev, &job, 1, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "multiple of 64") != NULL,
        "chunk not a multiple of 64: %s", t_fpga_errtext(&e));
  job.chunk_tokens = 64;
  job.fd = -1;
  CHECK(kv_hie_topk(dev, &job, 1, pos, NULL, NULL, NULL, &e) == KV_FPGA_EINVAL,
        "device error surfaces (bad fd)");
  kv_score_query_free(qq);
  kv_fpga_close(dev);
}

/* The section reads run ahead of the kernel (HIE_READERS threads, HIE_SLOTS slots): a job of
 * more sections than slots, repeated on one device (its kept buffer), equals kv_score_topk;
 * a read that fails in the middle (a section past the end of the file) fails the job with
 * KV_FPGA_EIO, whichever reader met it, and the device still works afterwards. */
static void test_hie_read_ahead(void)
{
  t_rng r = {29};
  kv_fpga_dev *dev = t_emu_open();
  kv_fpga_err e;
  t_ctx c;
  t_ctx_make(&c, &r, 40 * 64, 128, 4, 64); /* 40 sections */
  uint32_t d = c.head_dim, N = c.n_tokens;
  float q[4 * 128];
  for (uint32_t j = 0; j < 4 * d; j++)
    q[j] = t_gauss(&r);
  kv_score_query *qq;
  REQUIRE(kv_score_query_create(KV_SCORE_F32, q, 4, d, (size_t)d * 4, KV_SCORE_SUM, &qq, NULL) ==
              KV_SCORE_OK,
          "query");
  kv_score_span *all = malloc(c.n_blocks * sizeof *all);
  kv_hie_dev_span *ds = malloc(c.n_blocks * sizeof *ds);
  for (uint32_t b = 0; b < c.n_blocks; b++) {
    all[b] = (kv_score_span){&c.views[b], 0, c.views[b].layout.n_tokens, b * c.block_tokens};
    ds[b] = (kv_hie_dev_span){c.file_off[b], c.views[b].layout, b * c.block_tokens};
  }
  uint32_t rpos[300], pos[300], got = 0;
  float rsc[300], sc[300];
  for (int rep = 0; rep < 3; rep++) {
    uint32_t k = rep == 0 ? 10 : rep == 1 ? 300 : 64;
    REQUIRE(kv_score_topk(qq, all, c.n_blocks, k, NULL, NULL, 0, rpos, rsc, &got, NULL) ==
                KV_SCORE_OK,
            "reference");
    kv_hie_job job = {0};
    job.q = qq;
    job.fd = c.fd;
    job.dev = ds;
    job.n_dev = c.n_blocks;
    job.chunk_tokens = 64;
    kv_hie_stats st;
    REQUIRE(kv_hie_topk(dev, &job, k, pos, sc, &got, &st, &e) == KV_FPGA_OK, "hie: %s",
            t_fpga_errtext(&e));
    CHECK(got == k && memcmp(pos, rpos, k * 4) == 0 && memcmp(sc, rsc, k * 4) == 0,
          "40 sections, k %u: equal to kv_score_topk", k);
    CHECK(st.dev_tokens == N, "every token scored on the device (%llu)",
          (unsigned long long)st.dev_tokens);
  }
  kv_hie_job job = {0};
  job.q = qq;
  job.fd = c.fd;
  job.dev = ds;
  job.n_dev = c.n_blocks;
  job.chunk_tokens = 64;
  uint64_t keep = ds[27].file_off;
  ds[27].file_off = (uint64_t)1 << 40; /* past the end of the file */
  CHECK(kv_hie_topk(dev, &job, 10, pos, sc, &got, NULL, &e) == KV_FPGA_EIO,
        "a failed section read fails the job: %s", t_fpga_errtext(&e));
  ds[27].file_off = keep;
  CHECK(kv_hie_topk(dev, &job, 10, pos, sc, &got, NULL, &e) == KV_FPGA_OK && got == 10,
        "the device works after a failed job: %s", t_fpga_errtext(&e));
  free(all);
  free(ds);
  kv_score_query_free(qq);
  t_ctx_free(&c);
  kv_fpga_close(dev);
}

/* Threads of this process (/proc/self/status), or -1. */
static int n_threads(void)
{
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "Threads: %d", &n) == 1)
      break;
  if (f != NULL)
    fclose(f);
  return n;
}

/* The device's reader pool (kv_hie_topk_batch): many jobs on one device, one call after another
 * and many in one call (host parts, device parts, both; k on chip and selected), each equal to
 * kv_score_topk over its tokens; a read failing in the middle of a call (a section of its fourth
 * job past the end of the file) fails the call with KV_FPGA_EIO and the next call works; the
 * pool's threads start with the first job, stay while the device is idle and are gone after
 * kv_fpga_close (closing a device that never ran a job too). */
static void test_hie_pool(void)
{
  t_rng r = {71};
  kv_fpga_err e;
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  o.backend = KV_FPGA_EMULATED;
  int th0 = n_threads();
  kv_fpga_dev *dev;
  REQUIRE(kv_fpga_open(&o, &dev, &e) == KV_FPGA_OK, "open");
  kv_fpga_close(dev); /* idle, never ran a job */
  CHECK(n_threads() == th0, "no thread left by a device that never ran a job");
  REQUIRE(kv_fpga_open(&o, &dev, &e) == KV_FPGA_OK, "open");
  t_ctx c;
  t_ctx_make(&c, &r, 24 * 256, 128, 4, 256); /* 24 sections */
  uint32_t d = c.head_dim;
  enum { NJ = 12 };
  kv_score_query *qq[NJ];
  for (int j = 0; j < NJ; j++) {
    float q[4 * 128];
    for (uint32_t i = 0; i < 4 * d; i++)
      q[i] = t_gauss(&r);
    REQUIRE(kv_score_query_create(KV_SCORE_F32, q, 4, d, (size_t)d * 4,
                                  j % 2 ? KV_SCORE_MAX : KV_SCORE_SUM, &qq[j], NULL) == KV_SCORE_OK,
            "query");
  }
  kv_hie_dev_span *ds = malloc(c.n_blocks * sizeof *ds);
  kv_score_span *hs = malloc(c.n_blocks * sizeof *hs);
  for (uint32_t b = 0; b < c.n_blocks; b++) {
    ds[b] = (kv_hie_dev_span){c.file_off[b], c.views[b].layout, b * c.block_tokens};
    hs[b] = (kv_score_span){&c.views[b], 0, c.views[b].layout.n_tokens, b * c.block_tokens};
  }
  /* job j: blocks [a_j, b_j), the first h_j of them on the host, the rest on the device */
  kv_hie_job jobs[NJ];
  kv_hie_result res[NJ];
  uint32_t *pos = malloc((size_t)NJ * 500 * 4), *rpos = malloc(500 * 4), got = 0;
  float *sc = malloc((size_t)NJ * 500 * 4), *rsc = malloc(500 * 4);
  int th_run = -1, bad = 0;
  for (int call = 0; call < 40; call++) {
    size_t nj = call < 20 ? 1 : 1 + t_below(&r, NJ); /* 20 calls of one job, then batches */
    uint32_t span[NJ][3];
    for (size_t j = 0; j < nj; j++) {
      uint32_t a = t_below(&r, c.n_blocks - 1), b = a + 1 + t_below(&r, c.n_blocks - a);
      uint32_t h = t_below(&r, 3) == 0 ? t_below(&r, b - a + 1) : 0; /* mostly device-only */
      span[j][0] = a, span[j][1] = b, span[j][2] = h;
      jobs[j] = (kv_hie_job){.q = qq[j], .host = hs + a, .n_host = h, .fd = c.fd,
                             .dev = ds + a + h, .n_dev = b - a - h, .chunk_tokens = 64 * (1 + j % 4)};
      kv_score_opts_init(&jobs[j].host_opts);
      uint32_t toks = (b - a) * c.block_tokens, k = t_below(&r, 2) ? 1 + t_below(&r, 64)
                                                                    : 65 + t_below(&r, 435);
      res[j] = (kv_hie_result){.k = k < toks ? k : toks, .pos = pos + j * 500, .scores = sc + j * 500};
    }
    REQUIRE(kv_hie_topk_batch(dev, jobs, nj, res, &e) == KV_FPGA_OK, "call %d: %s", call,
            t_fpga_errtext(&e));
    if (call == 0)
      th_run = n_threads();
    for (size_t j = 0; j < nj; j++) {
      REQUIRE(kv_score_topk(qq[j], hs + span[j][0], span[j][1] - span[j][0], res[j].k, NULL, NULL,
                            0, rpos, rsc, &got, NULL) == KV_SCORE_OK,
              "reference");
      if (res[j].n != got || memcmp(res[j].pos, rpos, got * 4) || memcmp(res[j].scores, rsc, got * 4))
        bad++;
      if (res[j].stats.dev_tokens != (uint64_t)(span[j][1] - span[j][0] - span[j][2]) * c.block_tokens)
        bad++;
    }
  }
  CHECK(bad == 0, "%d jobs differ from kv_score_topk (or their device token counts)", bad);
  CHECK(th_run > th0 && th_run <= th0 + 8, "the pool's threads started (%d -> %d)", th0, th_run);
  CHECK(n_threads() == th_run, "no thread started or left per call (%d, %d)", th_run, n_threads());
  /* a failing read in the middle of a call: the fourth job's third section */
  for (int j = 0; j < 6; j++) {
    jobs[j] = (kv_hie_job){.q = qq[j], .fd = c.fd, .dev = ds + 4 * j, .n_dev = 4, .chunk_tokens = 64};
    res[j] = (kv_hie_result){.k = 30, .pos = pos + j * 500, .scores = sc + j * 500};
  }
  kv_hie_dev_span keep = ds[14];
  ds[14].file_off = (uint64_t)1 << 40;
  CHECK(kv_hie_topk_batch(dev, jobs, 6, res, &e) == KV_FPGA_EIO,
        "a failed section read fails the call: %s", t_fpga_errtext(&e));
  ds[14] = keep;
  CHECK(kv_hie_topk_batch(dev, jobs, 6, res, &e) == KV_FPGA_OK, "the next call works: %s",
        t_fpga_errtext(&e));
  for (int j = 0; j < 6; j++) {
    REQUIRE(kv_score_topk(qq[j], hs + 4 * j, 4, 30, NULL, NULL, 0, rpos, rsc, &got, NULL) ==
                KV_SCORE_OK,
            "reference");
    CHECK(res[j].n == 30 && memcmp(res[j].pos, rpos, 30 * 4) == 0 &&
              memcmp(res[j].scores, rsc, 30 * 4) == 0,
          "after the failure, job %d equal to kv_score_topk", j);
  }
  CHECK(n_threads() == th_run, "the pool is intact after a failed call (%d)", n_threads());
  kv_fpga_close(dev); /* idle: its pool is joined */
  CHECK(n_threads() == th0, "close joined the pool (%d threads, %d before open)", n_threads(), th0);
  for (int j = 0; j < NJ; j++)
    kv_score_query_free(qq[j]);
  free(ds);
  free(hs);
  free(pos);
  free(rpos);
  free(sc);
  free(rsc);
  t_ctx_free(&c);
}

static int near(double a, double b)
{
  return fabs(a - b) <= 1e-9 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

static void test_app(void)
{
  /* HillInfer-like numbers: CPU scoring 20 GB/s, SmartSSD 3 GB/s, PCIe 4.0 x16 25 GB/s to the
   * GPU, SmartSSD 3 GB/s to the host */
  kv_app_profile p = {20e9, 3e9, 25e9, 3e9};
  double alpha = 0.1;
  double want = p.B_c * p.f_c * (p.B_s + alpha * p.f_s) / (p.B_s * p.f_s * (p.B_c + alpha * p.f_c));
  CHECK(near(kv_app_beta(&p, alpha), want), "Eq. 4: %.12g vs %.12g", kv_app_beta(&p, alpha), want);
  /* by hand: 25e9*20e9*(3e9+0.3e9) / (3e9*3e9*(25e9+2e9)) = 1.65e30 / 2.43e29 */
  CHECK(near(kv_app_beta(&p, alpha), 1.65e30 / 2.43e29), "Eq. 4 by hand");
  CHECK(near(kv_app_beta(&p, 0), p.f_c / p.f_s), "alpha = 0: beta = f_c / f_s (seed 000)");
  kv_app_split s;
  kv_fpga_err e;
  double M = 64e9;
  REQUIRE(kv_app_split_compute(&p, alpha, alpha, M, 1e12, &s, &e) == KV_FPGA_OK, "split");
  CHECK(!s.capped && near(s.beta, want) && near(s.M_c + s.M_s, M) && near(s.M_c / s.M_s, want),
        "split follows Eq. 4");
  CHECK(near(s.T_cpu, s.T_ssd), "Eq. 2 balanced: T_cpu %.9g T_ssd %.9g", s.T_cpu, s.T_ssd);
  CHECK(near(s.T_cpu, s.M_c / p.f_c + alpha * s.M_c / p.B_c), "T_CPU as in Eq. 2");
  /* Eq. 3 binds */
  REQUIRE(kv_app_split_compute(&p, alpha, alpha, M, 8e9, &s, &e) == KV_FPGA_OK, "split capped");
  CHECK(s.capped && near(s.M_c, 8e9) && near(s.M_s, M - 8e9) && near(s.beta, 8e9 / (M - 8e9)) &&
            s.T_ssd > s.T_cpu,
        "Eq. 3: M_c = M_0, the SmartSSD path is the longer");
  /* skewness correction: more selected data in the hot pool -> a smaller CPU share */
  kv_app_split s2;
  REQUIRE(kv_app_split_compute(&p, 0.2, 0.05, M, 1e12, &s2, &e) == KV_FPGA_OK, "skew");
  CHECK(near(s2.T_cpu, s2.T_ssd) &&
            near(s2.beta, (1 / p.f_s + 0.05 / p.B_s) / (1 / p.f_c + 0.2 / p.B_c)),
        "per-side alpha balances Eq. 2");
  /* bad input */
  kv_app_profile bad = p;
  bad.f_s = 0;
  CHECK(kv_app_split_compute(&bad, alpha, alpha, M, M, &s, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "rate") != NULL,
        "zero rate: %s", t_fpga_errtext(&e));
  bad = p;
  bad.B_c = NAN;
  CHECK(kv_app_split_compute(&bad, alpha, alpha, M, M, &s, &e) == KV_FPGA_EINVAL, "NaN rate");
  CHECK(kv_app_split_compute(&p, 1.5, alpha, M, M, &s, &e) == KV_FPGA_EINVAL, "alpha > 1");
  CHECK(kv_app_split_compute(&p, alpha, alpha, -1, M, &s, &e) == KV_FPGA_EINVAL, "M < 0");
  CHECK(kv_app_split_compute(NULL, alpha, alpha, M, M, &s, &e) == KV_FPGA_EINVAL, "NULL");
  /* profile update from HIE statistics */
  kv_app_profile pr = {0, 0, 1, 1};
  kv_hie_stats st = {0};
  st.host_bytes = 2000000000;
  st.host_ns = 100000000; /* 20 GB/s */
  st.dev_bytes = 300000000;
  st.dev_ns = 100000000; /* 3 GB/s */
  kv_app_profile_update(&pr, &st, 0.5);
  CHECK(near(pr.f_c, 20e9) && near(pr.f_s, 3e9), "first measurement taken as is");
  st.host_ns = 200000000; /* 10 GB/s */
  kv_app_profile_update(&pr, &st, 0.5);
  CHECK(near(pr.f_c, 15e9) && near(pr.f_s, 3e9), "moving average");
}

int main(void)
{
  test_hie_random_splits();
  test_hie_read_ahead();
  test_hie_pool();
  test_app();
  return t_finish("test_fpga_hie");
}
