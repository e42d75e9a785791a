/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_compact.c — `kvdb-bench compact`: the time of one kvdb_compact that rewrites the
 * same amount of data in databases of growing size (issue 13 E: it must grow with the blocks
 * it moves, not with the blocks stored).
 *
 * For each size N (25k, 50k, 100k, 200k blocks; --quick: 25k and 50k): a fresh database with
 * the tiny shape (1 layer, 1 KV head, head_dim 16, fp16, 16-token blocks: 8 KiB objects),
 * 1 MiB segments (128 blocks each), KVDB_SYNC_NONE and buffered I/O, filled with N one-block
 * contexts of random tokens (untimed). Then every other context of the first 32 segments is
 * deleted (32 segments half dead: 2,048 live blocks, 16 MiB, to move) and one
 * kvdb_compact(threshold 0.6) is timed, wall clock and the process's CPU time (the catalog
 * work; the wall time also has the disk's noise); it must rewrite exactly those 32 segments.
 * Reported: compact_s and compact_cpu_s per N, and the ratios of the largest N's to the
 * smallest's (1 = flat in N); also the catalog's size per block
 * after the fill (kvdb_stats.catalog_bytes: the file, so LMDB's free pages included).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "datagen.h"
#include "kvdb.h"

static const kvdb_model CT_TINY = {"kvdb-bench/tiny-1L-1H-16D", 1, 1, 16, KVDB_F16, 16};

#define CT_SEGMENTS 32u    /* half-dead segments compacted */
#define CT_PER_SEGMENT 128u /* 8 KiB objects in 1 MiB */

static double cpu_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int one_size(const bench_env *env, uint32_t n, double *secs, double *cpu,
                    kvdb_compact_report *rep, uint64_t *catalog_bytes)
{
  char dir[4200], name[64];
  snprintf(name, sizeof name, "compact-%u", n);
  bench_path(dir, sizeof dir, env->dir, name);
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.sync_mode = KVDB_SYNC_NONE;
  o.use_direct_io = 0;
  o.segment_bytes = 1u << 20;
  o.log_level = 0;
  kvdb *db;
  kvdb_status ks = kvdb_open(dir, &o, &db);
  if (ks != KVDB_OK) {
    bench_log("kvdb_open: %s", kvdb_errmsg());
    return 1;
  }
  uint16_t kv[16 * 2 * 16] = {0};
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, kv, &CT_TINY, 16, KVDB_LAYOUT_LKTHD);
  kvdb_key *keys = malloc((size_t)n * sizeof *keys);
  if (keys == NULL) {
    kvdb_close(db);
    return 1;
  }
  dg_rng rng = {env->seed ^ n};
  uint32_t tok[16];
  uint64_t t0 = bench_now_ns();
  int rc = 0;
  for (uint32_t i = 0; i < n && rc == 0; i++) {
    dg_tokens(tok, 16, dg_next(&rng), 128000);
    kvdb_put_info info;
    ks = kvdb_put(db, &CT_TINY, tok, 16, &v, &info);
    if (ks != KVDB_OK) {
      bench_log("kvdb_put: %s", kvdb_errmsg());
      rc = 1;
    }
    keys[i] = info.context;
  }
  bench_log("compact: %u blocks stored in %.1f s", n, (double)(bench_now_ns() - t0) * 1e-9);
  kvdb_stats st;
  if (rc == 0 && kvdb_stat(db, &st) == KVDB_OK)
    *catalog_bytes = st.catalog_bytes;
  for (uint32_t i = 0; i < CT_SEGMENTS * CT_PER_SEGMENT && rc == 0; i += 2)
    if ((ks = kvdb_delete(db, &keys[i])) != KVDB_OK) {
      bench_log("kvdb_delete: %s", kvdb_errmsg());
      rc = 1;
    }
  if (rc == 0) {
    t0 = bench_now_ns();
    double c0 = cpu_now();
    ks = kvdb_compact(db, 0.6, NULL, NULL, rep);
    *cpu = cpu_now() - c0;
    *secs = (double)(bench_now_ns() - t0) * 1e-9;
    if (ks != KVDB_OK) {
      bench_log("kvdb_compact: %s", kvdb_errmsg());
      rc = 1;
    } else if (rep->segments_rewritten != CT_SEGMENTS) {
      bench_log("kvdb_compact rewrote %" PRIu64 " segments, %u expected",
                rep->segments_rewritten, CT_SEGMENTS);
      rc = 1;
    }
  }
  free(keys);
  kvdb_close(db);
  if (!env->keep)
    bench_rmtree(dir);
  return rc;
}

int bench_compact(const bench_env *env, bench_json *j)
{
  static const uint32_t sizes[] = {25000, 50000, 100000, 200000};
  size_t ns = env->quick ? 2 : 4;
  double t[4] = {0}, cpu[4] = {0};
  FILE *o = env->out;
  fprintf(o, "kvdb_compact of %u half-dead 1 MiB segments (%u live blocks moved), tiny shape, "
             "by blocks stored:\n",
          CT_SEGMENTS, CT_SEGMENTS * CT_PER_SEGMENT / 2);
  for (size_t i = 0; i < ns; i++) {
    kvdb_compact_report rep = {0};
    uint64_t cat = 0;
    if (one_size(env, sizes[i], &t[i], &cpu[i], &rep, &cat) != 0)
      return 1;
    fprintf(o, "  %7u blocks   compact %7.3f s, CPU %7.3f s   (%" PRIu64 " blocks moved, %" PRIu64
               " segments rewritten; catalog after the fill %.0f B per block)\n",
            sizes[i], t[i], cpu[i], rep.blocks_moved, rep.segments_rewritten,
            (double)cat / sizes[i]);
    char f[48];
    snprintf(f, sizeof f, "compact_s_%uk", sizes[i] / 1000);
    bench_json_num(j, f, t[i]);
    snprintf(f, sizeof f, "compact_cpu_s_%uk", sizes[i] / 1000);
    bench_json_num(j, f, cpu[i]);
    snprintf(f, sizeof f, "catalog_bytes_per_block_%uk", sizes[i] / 1000);
    bench_json_num(j, f, (double)cat / sizes[i]);
  }
  double growth = t[0] > 0 ? t[ns - 1] / t[0] : 0, cgrowth = cpu[0] > 0 ? cpu[ns - 1] / cpu[0] : 0;
  fprintf(o, "  at %uk / at %uk (blocks stored x%u): time %.2f, CPU %.2f\n", sizes[ns - 1] / 1000,
          sizes[0] / 1000, sizes[ns - 1] / sizes[0], growth, cgrowth);
  bench_json_num(j, "compact_growth", growth);
  bench_json_num(j, "compact_cpu_growth", cgrowth);
  bench_json_int(j, "compact_blocks_moved", CT_SEGMENTS * CT_PER_SEGMENT / 2);
  return 0;
}
