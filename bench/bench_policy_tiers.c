/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_policy_tiers.c — `kvdb-bench policy` part 1: the tiers' read figures, measured in
 * this run (DRAM: memcpy; SSD: O_DIRECT reads of a file in the data directory).
 */
#define _GNU_SOURCE
#include "bench_policy.h"

static void *(*volatile memcpy_fn)(void *, const void *, size_t) = memcpy;

int pb_probe_dram(const bench_env *env, tiers_m *t)
{
  size_t n = env->quick ? PB_DRAM_PROBE_QUICK : PB_DRAM_PROBE_FULL;
  uint8_t *a = bench_alloc(n), *b = bench_alloc(n);
  if (a == NULL || b == NULL) {
    bench_free(a);
    bench_free(b);
    bench_log("out of memory (DRAM probe, 2 x %zu bytes)", n);
    return -1;
  }
  memset(a, 0x5a, n);
  double g[7];
  for (int r = 0; r < 7; r++) {
    uint64_t t0 = bench_now_ns();
    memcpy_fn(b, a, n);
    g[r] = bench_gbps(n, bench_now_ns() - t0);
  }
  t->dram_bps = median(g, 7) * 1e9;
  /* latency: one 4 KiB copy from a place not copied recently (median of 256) */
  double l[256];
  uint64_t s = env->seed ^ 0x1234;
  for (int r = 0; r < 256; r++) {
    size_t off = (size_t)(rng_next(&s) % (n / 4096)) * 4096;
    uint64_t t0 = bench_now_ns();
    memcpy_fn(b + off, a + off, 4096);
    l[r] = (double)(bench_now_ns() - t0) * 1e-9;
  }
  t->dram_lat_s = median(l, 256);
  bench_free(a);
  bench_free(b);
  return 0;
}

int pb_probe_ssd(const bench_env *env, tiers_m *t)
{
  size_t n = env->quick ? PB_SSD_PROBE_QUICK : PB_SSD_PROBE_FULL;
  char path[4200];
  bench_path(path, sizeof path, env->dir, "ssd-probe");
  int fd = open(path, O_CREAT | O_TRUNC | O_RDWR | O_DIRECT | O_CLOEXEC, 0644);
  t->direct = fd >= 0;
  if (fd < 0)
    fd = open(path, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    bench_log("cannot create '%s': %s", path, strerror(errno));
    return -1;
  }
  if (!t->direct)
    bench_log("WARNING: O_DIRECT is refused in %s: the SSD probe reads through the page cache",
              env->dir);
  uint8_t *buf = bench_alloc(PB_SSD_CHUNK);
  int rc = -1;
  if (buf == NULL)
    goto out;
  for (size_t i = 0; i < PB_SSD_CHUNK; i++)
    buf[i] = (uint8_t)(i * 131 + 7);
  for (size_t off = 0; off < n; off += PB_SSD_CHUNK)
    if (bench_pwrite_all(fd, buf, PB_SSD_CHUNK, off) != 0) {
      bench_log("writing the SSD probe file: %s", strerror(errno));
      goto out;
    }
  if (fdatasync(fd) != 0) {
    bench_log("fdatasync of the SSD probe file: %s", strerror(errno));
    goto out;
  }
  double g[3];
  for (int r = 0; r < 3; r++) {
    t->cache_drop = bench_drop_cache(env->dir);
    uint64_t t0 = bench_now_ns();
    for (size_t off = 0; off < n; off += PB_SSD_CHUNK)
      if (bench_pread_all(fd, buf, PB_SSD_CHUNK, off) != 0) {
        bench_log("reading the SSD probe file: %s", strerror(errno));
        goto out;
      }
    g[r] = bench_gbps(n, bench_now_ns() - t0);
  }
  t->ssd_bps = median(g, 3) * 1e9;
  bench_drop_cache(env->dir);
  double l[64];
  uint64_t s = env->seed ^ 0x5678;
  for (int r = 0; r < 64; r++) {
    uint64_t off = (rng_next(&s) % (n / 4096)) * 4096;
    uint64_t t0 = bench_now_ns();
    if (bench_pread_all(fd, buf, 4096, off) != 0)
      goto out;
    l[r] = (double)(bench_now_ns() - t0) * 1e-9;
  }
  t->ssd_lat_s = median(l, 64);
  rc = 0;
out:
  bench_free(buf);
  close(fd);
  unlink(path);
  return rc;
}
