/* SPDX-License-Identifier: MIT */
/*
 * engine/db/metrics.c — kvdb_metrics: the handle's figures in Prometheus' text exposition
 * format 0.0.4 (HELP and TYPE lines, one family at a time, histograms with cumulative `le`
 * buckets, _sum and _count). What it reads: kvdb_stat (the catalog's per-tier counters and the
 * handle's hits), kvdb_remote_stat, the handle's latency histograms and move counter.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/ops.h"

typedef struct mbuf {
  char *p;
  size_t cap, len;
} mbuf;

static void put(mbuf *b, const char *fmt, ...) KV_PRINTF(2, 3);
static void put(mbuf *b, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  char *dst = b->len < b->cap ? b->p + b->len : NULL;
  size_t room = b->len < b->cap ? b->cap - b->len : 0;
  int n = vsnprintf(dst, room, fmt, ap);
  va_end(ap);
  if (n > 0)
    b->len += (size_t)n;
}

static void family(mbuf *b, const char *name, const char *type, const char *help)
{
  put(b, "# HELP kvdb_%s %s\n# TYPE kvdb_%s %s\n", name, help, name, type);
}

static const char *const tier_names[4] = {"dram", "ssd", "smartssd", "remote"};

static void histogram(mbuf *b, const kv_lat *l, const char *name, const char *help)
{
  family(b, name, "histogram", help);
  uint64_t cum = 0;
  for (unsigned i = 0; i < KV_LAT_BUCKETS; i++) {
    cum += l->b[i];
    put(b, "kvdb_%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)kv_lat_bounds_ns[i] / 1e9,
        cum);
  }
  cum += l->b[KV_LAT_BUCKETS];
  put(b, "kvdb_%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
  put(b, "kvdb_%s_sum %.9f\n", name, (double)l->sum_ns / 1e9);
  put(b, "kvdb_%s_count %" PRIu64 "\n", name, cum);
}

kvdb_status kvdb_metrics(kvdb *db, char *buf, size_t cap, size_t *len)
{
  KV_RET(kv_check_db(db));
  if (len == NULL || (buf == NULL && cap > 0))
    return kv_fail(KVDB_INVALID, "buf or len is NULL");
  kvdb_stats st;
  kvdb_status rc = kvdb_stat(db, &st);
  if (rc != KVDB_OK && rc != KVDB_CORRUPT)
    return rc;
  kvdb_remote_stats rs;
  KV_RET(kvdb_remote_stat(db, &rs));
  mbuf b = {buf, cap, 0};
  uint64_t hits[4], misses[4];
  for (int t = 0; t < KVDB_TIER_COUNT; t++) {
    hits[t] = st.tier[t].hits;
    misses[t] = st.tier[t].misses;
  }
  hits[3] = rs.hits;
  misses[3] = rs.misses + rs.rejected;
  int n_tiers = rs.enabled ? 4 : 3;
  family(&b, "tier_hits_total", "counter", "Blocks served from each tier by this handle.");
  for (int t = 0; t < n_tiers; t++)
    put(&b, "kvdb_tier_hits_total{tier=\"%s\"} %" PRIu64 "\n", tier_names[t], hits[t]);
  family(&b, "tier_misses_total", "counter",
         "Blocks looked for on each tier and not found there, by this handle.");
  for (int t = 0; t < n_tiers; t++)
    put(&b, "kvdb_tier_misses_total{tier=\"%s\"} %" PRIu64 "\n", tier_names[t], misses[t]);
  family(&b, "tier_bytes", "gauge", "Bytes of blocks each local tier holds.");
  for (int t = 0; t < KVDB_TIER_COUNT; t++)
    put(&b, "kvdb_tier_bytes{tier=\"%s\"} %" PRIu64 "\n", tier_names[t], st.tier[t].bytes);
  family(&b, "tier_blocks", "gauge", "Blocks each local tier holds.");
  for (int t = 0; t < KVDB_TIER_COUNT; t++)
    put(&b, "kvdb_tier_blocks{tier=\"%s\"} %" PRIu64 "\n", tier_names[t], st.tier[t].blocks);
  family(&b, "tier_contexts", "gauge", "Contexts each local tier holds.");
  for (int t = 0; t < KVDB_TIER_COUNT; t++)
    put(&b, "kvdb_tier_contexts{tier=\"%s\"} %" PRIu64 "\n", tier_names[t],
        st.tier[t].contexts);
  family(&b, "tier_capacity_bytes", "gauge", "Capacity of each local tier (0: unlimited).");
  for (int t = 0; t < KVDB_TIER_COUNT; t++)
    put(&b, "kvdb_tier_capacity_bytes{tier=\"%s\"} %" PRIu64 "\n", tier_names[t],
        st.tier[t].capacity_bytes);
  family(&b, "contexts", "gauge", "Contexts stored.");
  put(&b, "kvdb_contexts %" PRIu64 "\n", st.n_contexts);
  family(&b, "live_bytes", "gauge", "Bytes of referenced blocks in segment files.");
  put(&b, "kvdb_live_bytes %" PRIu64 "\n", st.live_bytes);
  family(&b, "segment_file_bytes", "gauge", "Bytes of all segment files (live and dead).");
  put(&b, "kvdb_segment_file_bytes %" PRIu64 "\n", st.segment_file_bytes);
  family(&b, "corrupt_blocks_total", "counter", "Blocks this handle found corrupt.");
  put(&b, "kvdb_corrupt_blocks_total %" PRIu64 "\n", st.corrupt_blocks);
  family(&b, "bytes_read_total", "counter", "Bytes this handle read from segment files.");
  put(&b, "kvdb_bytes_read_total %" PRIu64 "\n", st.bytes_read);
  family(&b, "bytes_written_total", "counter", "Bytes this handle appended to segment files.");
  put(&b, "kvdb_bytes_written_total %" PRIu64 "\n", st.bytes_written);
  family(&b, "placement_moves_total", "counter",
         "Contexts moved between tiers or re-encoded by this handle.");
  put(&b, "kvdb_placement_moves_total %" PRIu64 "\n", (uint64_t)db->relocations);
  family(&b, "prefetch_hits_total", "counter",
         "Blocks served from the DRAM tier (what was read ahead or kept) by this handle.");
  put(&b, "kvdb_prefetch_hits_total %" PRIu64 "\n", hits[KVDB_TIER_DRAM]);
  histogram(&b, &db->lat[KV_LAT_GET], "get_seconds", "Latency of kvdb_get calls.");
  histogram(&b, &db->lat[KV_LAT_PUT], "put_seconds", "Latency of kvdb_put calls.");
  histogram(&b, &db->lat[KV_LAT_LOOKUP], "lookup_seconds", "Latency of kvdb_lookup calls.");
  family(&b, "remote_enabled", "gauge", "1 when the handle has a remote tier (Redis).");
  put(&b, "kvdb_remote_enabled %d\n", rs.enabled);
  if (rs.enabled) {
    static const struct {
      const char *name, *help;
      size_t off;
    } rc_fields[] = {
        {"remote_rejected_total", "Remote values that failed verification (misses).",
         offsetof(kvdb_remote_stats, rejected)},
        {"remote_errors_total", "Remote connection failures, timeouts and error replies.",
         offsetof(kvdb_remote_stats, errors)},
        {"remote_reconnects_total", "Remote connections opened again after a failure.",
         offsetof(kvdb_remote_stats, reconnects)},
        {"remote_down_skips_total", "Remote commands not sent while their node backed off.",
         offsetof(kvdb_remote_stats, down_skips)},
        {"remote_round_trips_total", "Pipelined round trips to the remote tier.",
         offsetof(kvdb_remote_stats, round_trips)},
        {"remote_redirects_total", "Redis Cluster MOVED and ASK replies followed.",
         offsetof(kvdb_remote_stats, redirects)},
        {"remote_queued_total", "Blocks queued for write-through.",
         offsetof(kvdb_remote_stats, queued)},
        {"remote_written_total", "Blocks written through to the remote tier.",
         offsetof(kvdb_remote_stats, written)},
        {"remote_dropped_total", "Blocks not written through (queue full, failures).",
         offsetof(kvdb_remote_stats, dropped)},
        {"remote_received_bytes_total", "Value bytes received from the remote tier.",
         offsetof(kvdb_remote_stats, bytes_in)},
        {"remote_sent_bytes_total", "Value bytes sent to the remote tier.",
         offsetof(kvdb_remote_stats, bytes_out)},
        {"remote_copied_total", "Remote-hit blocks copied to the local store.",
         offsetof(kvdb_remote_stats, copied)},
        {"remote_copy_failed_total", "Remote-hit blocks not copied (queue full, write failed).",
         offsetof(kvdb_remote_stats, copy_failed)},
    };
    for (size_t i = 0; i < sizeof rc_fields / sizeof rc_fields[0]; i++) {
      uint64_t v;
      memcpy(&v, (const char *)&rs + rc_fields[i].off, sizeof v);
      family(&b, rc_fields[i].name, "counter", rc_fields[i].help);
      put(&b, "kvdb_%s %" PRIu64 "\n", rc_fields[i].name, v);
    }
    family(&b, "remote_queue_blocks", "gauge", "Blocks waiting for write-through.");
    put(&b, "kvdb_remote_queue_blocks %" PRIu64 "\n", rs.queue_len);
    family(&b, "remote_nodes", "gauge", "Redis nodes known (1: standalone).");
    put(&b, "kvdb_remote_nodes %" PRIu64 "\n", rs.nodes);
  }
  *len = b.len;
  if (b.len >= cap) {
    if (cap > 0)
      buf[cap - 1] = 0;
    return kv_fail(KVDB_FULL, "the metrics need %zu bytes, buf has %zu", b.len + 1, cap);
  }
  return KVDB_OK;
}
