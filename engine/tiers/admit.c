/* SPDX-License-Identifier: MIT */
/*
 * engine/tiers/admit.c — the prefetch's admission control: a token bucket whose rate follows
 * the foreground load (tiers.h, "prefetch admission").
 */
#include "tiers.h"

/* Weight of the past in each window's update: 0.97 per 10 ms window is a time constant of about
 * a third of a second, so the rate follows the foreground's load, not each get's burst (while a
 * get reads, the prefetch waits anyway: prefetch.c). 0.75 (40 ms) left the prefetch at its
 * floor for most of a serving step after the step's gets. */
#define EWMA_KEEP 0.97

static void set_rate(kv_bucket *b)
{
  double cap = b->capacity_bps;
  double r = KV_ADMIT_HIGH_WATER * cap - b->fg_bps;
  if (r < KV_ADMIT_FLOOR * cap)
    r = KV_ADMIT_FLOOR * cap;
  if (b->ceiling_bps > 0 && r > b->ceiling_bps)
    r = b->ceiling_bps;
  b->rate_bps = r;
}

void kv_bucket_init(kv_bucket *b, double capacity_bps, double ceiling_bps, double burst,
                    uint64_t now_ns)
{
  b->ceiling_bps = ceiling_bps > 0 ? ceiling_bps : 0;
  b->capacity_bps = capacity_bps > 0 ? capacity_bps : 1e9;
  if (b->ceiling_bps > 0 && b->ceiling_bps > b->capacity_bps)
    b->capacity_bps = b->ceiling_bps;
  b->fg_bps = 0;
  b->burst = burst > 0 ? burst : 1;
  b->tokens = b->burst;
  b->last_ns = now_ns;
  b->win_ns = now_ns;
  b->win_fg = b->win_all = 0;
  b->started = 0;
  set_rate(b);
}

void kv_bucket_observe(kv_bucket *b, uint64_t fg_total, uint64_t all_total, uint64_t now_ns)
{
  if (!b->started) { /* the first call: the counters' origin */
    b->started = 1;
    b->win_fg = fg_total;
    b->win_all = all_total;
    b->win_ns = now_ns;
    return;
  }
  if (now_ns < b->win_ns + KV_ADMIT_WINDOW_NS)
    return;
  double secs = (double)(now_ns - b->win_ns) / 1e9;
  double fg = fg_total >= b->win_fg ? (double)(fg_total - b->win_fg) / secs : 0;
  double all = all_total >= b->win_all ? (double)(all_total - b->win_all) / secs : 0;
  b->fg_bps = EWMA_KEEP * b->fg_bps + (1 - EWMA_KEEP) * fg;
  if (all > b->capacity_bps) /* the tier read faster than believed: it can */
    b->capacity_bps = all;
  b->win_ns = now_ns;
  b->win_fg = fg_total;
  b->win_all = all_total;
  set_rate(b);
}

uint64_t kv_bucket_take(kv_bucket *b, uint64_t bytes, uint64_t now_ns)
{
  if (now_ns > b->last_ns) {
    b->tokens += b->rate_bps * (double)(now_ns - b->last_ns) / 1e9;
    if (b->tokens > b->burst)
      b->tokens = b->burst;
    b->last_ns = now_ns;
  }
  double need = (double)bytes < b->burst ? (double)bytes : b->burst;
  if (b->tokens >= need) {
    b->tokens -= (double)bytes; /* may go below 0: a big take is paid back before the next */
    return 0;
  }
  double wait = (need - b->tokens) / b->rate_bps * 1e9;
  return wait < 1 ? 1 : (uint64_t)wait;
}
