/* SPDX-License-Identifier: MIT */
/*
 * engine/tiers/perf.c — tier read figures: the open-time probe and the online fit (tiers.h).
 */
#define _GNU_SOURCE
#include "tiers/tiers.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define PROBE_CHUNK (2u << 20) /* the engine's read size (a cold get's requests) */
#define PROBE_QD 8u            /* eight requests in flight: a 16 MiB wave, as kvdb_get reads */

int kv_probe_dir(kv_io *io, const char *dir, int direct, uint64_t bytes, kv_tier_perf *out)
{
  if (bytes < 2 * PROBE_CHUNK || bytes % PROBE_CHUNK != 0)
    return -EINVAL;
  char path[4096];
  static unsigned seq;
  int n = snprintf(path, sizeof path, "%s/.kvdb-probe-%ld-%u", dir, (long)getpid(), seq++);
  if (n < 0 || (size_t)n >= sizeof path)
    return -ENAMETOOLONG;
  uint8_t *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, (size_t)PROBE_CHUNK * PROBE_QD) != 0)
    return -ENOMEM;
  kv_file *f = NULL;
  int is_direct = 0, rc;
  rc = io->ops->open(io, path, KV_IO_CREATE | (direct ? KV_IO_DIRECT : 0), &is_direct, &f);
  if (rc < 0)
    goto out;

  /* incompressible bytes, so no layer below can shortcut the reads */
  uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
  for (size_t i = 0; i < PROBE_CHUNK / 8; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(buf + 8 * i, &x, 8);
  }
  for (uint64_t off = 0; off < bytes; off += PROBE_CHUNK) {
    buf[0] = (uint8_t)(off >> 21); /* chunks differ */
    if ((rc = io->ops->pwrite(io, f, buf, PROBE_CHUNK, off)) < 0)
      goto out;
  }
  if ((rc = io->ops->sync(io, f)) < 0)
    goto out;
  int fd = kv_io_os_fd(f);
  if (fd >= 0 && !is_direct)
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* clean pages: dropped */

  /* latency: random 4 KiB reads at queue depth 1, the median */
  double lat[KV_PROBE_SMALL_READS];
  uint64_t pages = bytes / 4096, r = x | 1;
  for (unsigned i = 0; i < KV_PROBE_SMALL_READS; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    double t0 = now_s();
    if ((rc = io->ops->pread(io, f, buf, 4096, (r % pages) * 4096)) < 0)
      goto out;
    lat[i] = now_s() - t0;
  }
  qsort(lat, KV_PROBE_SMALL_READS, sizeof lat[0], cmp_double);

  /* bandwidth: the file once more in waves of PROBE_QD requests of PROBE_CHUNK bytes. The
   * small reads above touched a few pages of it; without O_DIRECT those may be cached, which
   * is at most KV_PROBE_SMALL_READS * 4 KiB of the total. */
  if (fd >= 0 && !is_direct)
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  kv_batch *b = kv_batch_begin(io);
  if (b == NULL) {
    rc = -ENOMEM;
    goto out;
  }
  double t0 = now_s();
  for (uint64_t off = 0; off < bytes && rc >= 0;) {
    for (unsigned q = 0; q < PROBE_QD && off < bytes; q++, off += PROBE_CHUNK)
      kv_batch_read(io, b, f, buf + (size_t)q * PROBE_CHUNK, PROBE_CHUNK, off);
    rc = kv_batch_wait(io, b);
  }
  double took = now_s() - t0;
  kv_batch_end(io, b);
  if (rc < 0)
    goto out;
  out->latency_s = lat[KV_PROBE_SMALL_READS / 2];
  out->read_bps = took > 0 ? (double)bytes / took : 1e12;
  rc = 0;
out:
  if (f != NULL) {
    io->ops->close(io, f);
    int urc = io->ops->unlink(io, path);
    if (rc == 0 && urc < 0)
      rc = urc;
  }
  free(buf);
  return rc;
}

void kv_probe_memory(size_t bytes, kv_tier_perf *out)
{
  if (bytes < 8192)
    bytes = 8192;
  uint8_t *a = malloc(bytes), *b = malloc(bytes);
  if (a == NULL || b == NULL) {
    free(a);
    free(b);
    out->read_bps = 10e9; /* a conservative DRAM figure when even this fails */
    out->latency_s = 1e-6;
    return;
  }
  memset(a, 1, bytes);
  memset(b, 2, bytes); /* both touched: no first-touch faults in the timing */
  double best = 1e30, page = 1e30;
  for (int i = 0; i < 3; i++) {
    double t0 = now_s();
    memcpy(b, a, bytes);
    double t1 = now_s();
    memcpy(b + (size_t)i * 4096 % (bytes - 4096), a, 4096);
    double t2 = now_s();
    best = t1 - t0 < best ? t1 - t0 : best;
    page = t2 - t1 < page ? t2 - t1 : page;
    a[i] ^= b[bytes / 2]; /* keep the copies */
  }
  free(a);
  free(b);
  out->read_bps = best > 0 ? (double)bytes / best : 1e12;
  out->latency_s = page;
}

/* ---- the online fit ---- */

static void add(kv_perf_fit *f, double w, double b, double t)
{
  f->w += w;
  f->sb += w * b;
  f->st += w * t;
  f->sbb += w * b * b;
  f->sbt += w * b * t;
}

void kv_perf_fit_init(kv_perf_fit *f, const kv_tier_perf *prior, double weight)
{
  memset(f, 0, sizeof *f);
  if (!(weight > 0) || !(prior->read_bps > 0))
    return;
  /* the prior as two points on its line, one small read and one large one */
  const double small = 4096.0, large = 16.0 * 1048576.0;
  add(f, weight / 2, small, prior->latency_s + small / prior->read_bps);
  add(f, weight / 2, large, prior->latency_s + large / prior->read_bps);
}

void kv_perf_observe(kv_perf_fit *f, uint64_t bytes, double seconds)
{
  if (bytes == 0 || !(seconds > 0) || !isfinite(seconds))
    return;
  f->w *= KV_PERF_DECAY;
  f->sb *= KV_PERF_DECAY;
  f->st *= KV_PERF_DECAY;
  f->sbb *= KV_PERF_DECAY;
  f->sbt *= KV_PERF_DECAY;
  add(f, 1.0, (double)bytes, seconds);
  f->n++;
}

void kv_perf_estimate(const kv_perf_fit *f, const kv_tier_perf *prior, kv_tier_perf *out)
{
  *out = *prior;
  if (!(f->w > 0))
    return;
  double mb = f->sb / f->w, mt = f->st / f->w;
  double var = f->sbb / f->w - mb * mb, cov = f->sbt / f->w - mb * mt;
  /* the sizes must spread (coefficient of variation above 10%) to separate the two terms */
  if (var > 0.01 * mb * mb) {
    double slope = cov / var, icpt = mt - slope * mb;
    if (slope > 0 && icpt >= 0) {
      out->read_bps = 1.0 / slope;
      out->latency_s = icpt;
      return;
    }
  }
  /* the line through the prior's latency: minimize sum w (t - L0 - b s)^2 over s */
  double s = (f->sbt - prior->latency_s * f->sb) / f->sbb;
  if (f->sbb > 0 && s > 0)
    out->read_bps = 1.0 / s;
}
