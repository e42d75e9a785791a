/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_perf.c — tier read figures (engine/tiers/tiers.h): the online fit recovers a
 * tier's latency and bandwidth from reads of mixed sizes, keeps the probe's latency when the
 * reads are all one size, and ignores nonsense; the directory probe measures, cleans up after
 * itself, and reports a full disk instead of a figure.
 */
#include "kvdb_test.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>

#include "io_test.h"
#include "tiers/tiers.h"

static double rel(double a, double b) { return fabs(a - b) / b; }

/* seconds of a read of b bytes on a tier of `bps` and `lat` */
static double line(double lat, double bps, double b) { return lat + b / bps; }

static void test_fit_mixed_sizes(void)
{
  kv_tier_perf prior = {1e9, 100e-6}, est;
  kv_perf_fit f;
  kv_perf_fit_init(&f, &prior, 8);
  kv_perf_estimate(&f, &prior, &est);
  ASSERT(rel(est.read_bps, prior.read_bps) < 1e-6 && rel(est.latency_s, prior.latency_s) < 1e-6);
  /* the tier is really 3 GB/s with 20 us latency; reads of four sizes, 1% multiplicative noise */
  const double sizes[] = {4096, 65536, 2 << 20, 16 << 20};
  uint64_t seed = 1;
  for (int i = 0; i < 400; i++) {
    double b = sizes[i % 4];
    double noise = 1.0 + ((double)(t_rand(&seed) % 2001) - 1000.0) * 1e-5;
    kv_perf_observe(&f, (uint64_t)b, line(20e-6, 3e9, b) * noise);
  }
  kv_perf_estimate(&f, &prior, &est);
  ASSERT(rel(est.read_bps, 3e9) < 0.03);
  ASSERT(fabs(est.latency_s - 20e-6) < 5e-6);
  ASSERT_EQ(f.n, 400);
}

static void test_fit_one_size(void)
{
  /* every read is a 16 MiB wave: latency cannot be told from bandwidth, so the probe's latency
   * is kept and the bandwidth fitted through it; after enough reads the prior's large point
   * has decayed away */
  kv_tier_perf prior = {1e9, 100e-6}, est;
  kv_perf_fit f;
  kv_perf_fit_init(&f, &prior, 8);
  for (int i = 0; i < 1000; i++)
    kv_perf_observe(&f, 16u << 20, line(100e-6, 2.5e9, 16 << 20));
  kv_perf_estimate(&f, &prior, &est);
  ASSERT(rel(est.read_bps, 2.5e9) < 0.01);
  ASSERT(fabs(est.latency_s - 100e-6) < 1e-9);
}

static void test_fit_ignores_nonsense(void)
{
  kv_tier_perf prior = {2e9, 50e-6}, est;
  kv_perf_fit f;
  kv_perf_fit_init(&f, &prior, 8);
  kv_perf_observe(&f, 0, 1.0);
  kv_perf_observe(&f, 4096, 0.0);
  kv_perf_observe(&f, 4096, -1.0);
  kv_perf_observe(&f, 4096, NAN);
  kv_perf_observe(&f, 4096, INFINITY);
  ASSERT_EQ(f.n, 0);
  kv_perf_estimate(&f, &prior, &est);
  ASSERT(rel(est.read_bps, 2e9) < 1e-9);
  /* small reads slower than large ones per byte in a way no line with positive latency fits
   * (a negative intercept): the fitted line is refused, the bandwidth comes through the prior's
   * latency and stays positive */
  kv_perf_fit g;
  kv_perf_fit_init(&g, &prior, 0);
  for (int i = 0; i < 50; i++) {
    kv_perf_observe(&g, 1u << 20, 1e-3);
    kv_perf_observe(&g, 2u << 20, 3e-3);
  }
  kv_perf_estimate(&g, &prior, &est);
  ASSERT(est.read_bps > 0 && isfinite(est.read_bps));
  ASSERT(fabs(est.latency_s - 50e-6) < 1e-12);
  /* no observations and no prior weight: the prior itself */
  kv_perf_fit z;
  kv_perf_fit_init(&z, &prior, 0);
  kv_perf_estimate(&z, &prior, &est);
  ASSERT(est.read_bps == prior.read_bps && est.latency_s == prior.latency_s);
}

static size_t count_entries(const char *dir)
{
  DIR *d = opendir(dir);
  ASSERT(d != NULL);
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
  closedir(d);
  return n;
}

static void test_probe_dir(void)
{
  char *dir = t_tmpdir("probe");
  kv_io *io = kv_io_os_create(1);
  ASSERT(io != NULL);
  kv_tier_perf p = {0, 0};
  ASSERT_EQ(kv_probe_dir(io, dir, 1, KV_PROBE_BYTES, &p), 0);
  ASSERT(p.read_bps > 1e6 && isfinite(p.read_bps)); /* any disk reads 1 MB/s */
  ASSERT(p.latency_s > 0 && p.latency_s < 1.0);
  ASSERT_EQ(count_entries(dir), 0); /* the probe file is gone */
  printf("probe of %s: %.2f GB/s, %.1f us\n", dir, p.read_bps / 1e9, p.latency_s * 1e6);
  /* sizes it refuses */
  ASSERT_EQ(kv_probe_dir(io, dir, 1, 1u << 20, &p), -EINVAL);
  ASSERT_EQ(kv_probe_dir(io, dir, 1, (8u << 20) + 4096, &p), -EINVAL);
  /* a directory that does not exist */
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/no/such/dir", dir);
  ASSERT(kv_probe_dir(io, missing, 1, 8u << 20, &p) < 0);
  kv_io_destroy(io);

  kv_tier_perf m;
  kv_probe_memory(8u << 20, &m);
  ASSERT(m.read_bps > 1e8 && m.latency_s > 0 && m.latency_s < 1e-2);
  printf("memory: %.2f GB/s, %.2f us per page\n", m.read_bps / 1e9, m.latency_s * 1e6);
  t_rmdir(dir);
}

static void test_probe_full_disk(void)
{
  char *dir = t_tmpdir("probe-full");
  iot_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.fail_kind = IOT_WRITE;
  cfg.fail_at = 3;
  cfg.fail_errno = ENOSPC;
  iot_install(&cfg);
  kv_io *io = kv_io_test_wrap(kv_io_os_create(1));
  kv_tier_perf p = {-1, -1};
  ASSERT_EQ(kv_probe_dir(io, dir, 1, 8u << 20, &p), -ENOSPC);
  ASSERT(p.read_bps == -1 && p.latency_s == -1); /* no figure from a failed probe */
  ASSERT(iot_fired());
  ASSERT_EQ(count_entries(dir), 0); /* removed all the same */
  /* a failing sync and a failing read likewise */
  iot_set_fault(IOT_SYNC, iot_count(IOT_SYNC) + 1, EIO, 0);
  ASSERT_EQ(kv_probe_dir(io, dir, 1, 8u << 20, &p), -EIO);
  ASSERT_EQ(count_entries(dir), 0);
  iot_set_fault(IOT_READ, iot_count(IOT_READ) + 10, EIO, 0);
  ASSERT_EQ(kv_probe_dir(io, dir, 1, 8u << 20, &p), -EIO);
  ASSERT_EQ(count_entries(dir), 0);
  iot_uninstall();
  t_rmdir(dir);
}

int main(void)
{
  test_fit_mixed_sizes();
  test_fit_one_size();
  test_fit_ignores_nonsense();
  test_probe_dir();
  test_probe_full_disk();
  printf("test_perf: all passed\n");
  return 0;
}
