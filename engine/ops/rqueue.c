/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/rqueue.c — a put's write-through: the hashes of the blocks it wrote queued for the
 * remote tier's thread (engine/ops/rtier.c), waiting at most remote_put_wait_ms for room.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <time.h>

#include "rtier_int.h"

static uint64_t rq_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kv_rtier_note_put(kvdb *db, const uint8_t root[16], const uint8_t (*hashes)[16], uint32_t n)
{
  struct kv_rtier *t = db->rtier;
  if (t == NULL || t->cap == 0 || !t->on_put || n == 0)
    return;
  uint64_t deadline = rq_now_ns() + (uint64_t)db->opt.remote_put_wait_ms * 1000000ull;
  struct timespec abs;
  clock_gettime(CLOCK_REALTIME, &abs);
  uint64_t wait_ns = (uint64_t)db->opt.remote_put_wait_ms * 1000000ull;
  abs.tv_sec += (time_t)(wait_ns / 1000000000ull);
  abs.tv_nsec += (long)(wait_ns % 1000000000ull);
  if (abs.tv_nsec >= 1000000000L) {
    abs.tv_sec++;
    abs.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&t->mu);
  uint32_t i = 0;
  while (i < n) {
    while (i < n && t->len < t->cap) {
      memcpy(t->q[(t->head + t->len) % t->cap], hashes[i], 16);
      memcpy(t->q[(t->head + t->len) % t->cap] + 16, root, 16);
      t->len++;
      i++;
      t->queued++;
    }
    pthread_cond_signal(&t->more);
    if (i == n || t->stop || rq_now_ns() >= deadline)
      break;
    if (pthread_cond_timedwait(&t->room, &t->mu, &abs) == ETIMEDOUT && t->len == t->cap)
      break;
  }
  pthread_mutex_unlock(&t->mu);
  t->dropped += n - i;
}

