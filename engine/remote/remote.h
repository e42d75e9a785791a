/* SPDX-License-Identifier: MIT */
/*
 * engine/remote/remote.h — the remote floor (LAYERS: above io, below model): a Redis client
 * over hiredis for the remote tier, standalone or Redis Cluster, with no knowledge of blocks.
 * engine/ops/rtier.c decides what is stored (block objects in an envelope) and verifies what
 * comes back; this floor moves bytes under keys.
 *
 * One call = one pipelined round trip: every command of a batch is written to its node's
 * connection before any reply is read (a Cluster batch goes to each node that owns one of its
 * keys' slots at once). A MOVED reply updates the slot map (and asks for a refresh of the whole
 * map with CLUSTER SLOTS before the next batch) and the command is sent again to the named node;
 * an ASK reply sends ASKING and the command to the named node; both are extra round trips,
 * counted. The address is a seed: CLUSTER SLOTS tells whether it is a cluster.
 *
 * Replies: hiredis connects and writes the commands; the batch's replies are read by resp.h
 * straight from the socket, each value into a 64-byte-aligned buffer of the client's pool
 * (one copy; a released value's buffer takes the next one), polling the socket for a while
 * before sleeping in a blocking read (kv_remote_set_poll).
 *
 * Failure isolation: every connect, write and read has a timeout (redisSetTimeout). A node
 * whose connection fails is closed and marked down for a backoff (50 ms, doubling to 2 s, reset
 * by the next success); while down its commands fail at once without touching the network
 * (KV_RCMD_ERR, counted in `down_skips`). An error reply (OOM under maxmemory noeviction, say)
 * fails its command only. Nothing here ever blocks longer than the timeout per round trip.
 *
 * Threads: any number at once; each call takes a connection set of the pool (created when none
 * is idle), the slot map and backoff states are under one mutex, never held across I/O.
 */
#ifndef KV_REMOTE_H
#define KV_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_common.h"

typedef struct kv_remote kv_remote;

enum { KV_RCMD_GET = 0, KV_RCMD_GETRANGE = 1, KV_RCMD_SET = 2, KV_RCMD_DEL = 3 };
enum { KV_RCMD_OK = 0, KV_RCMD_NIL = 1, KV_RCMD_ERR = -1 };

/* One command of a batch. In: op, key, val (SET), range_end (GETRANGE 0..range_end). Out:
 * status, data/len (GET, GETRANGE: the value, valid until kv_remote_release); DEL's status is
 * OK whether or not the key was there. */
typedef struct kv_rcmd {
  int op;
  const char *key;
  size_t klen;
  const void *val;
  size_t vlen;
  int64_t range_end;
  int status;
  const uint8_t *data;
  size_t len;
  uint8_t *reply_; /* the buffer holding data (resp.h: kv_resp_data_free) */
} kv_rcmd;

/* Counters since open (monotonic). */
typedef struct kv_remote_counters {
  uint64_t round_trips;  /* batches sent (each one pipelined round trip, plus redirects) */
  uint64_t commands;
  uint64_t errors;       /* connection failures, timeouts and error replies */
  uint64_t reconnects;   /* connections (re)opened after a failure */
  uint64_t down_skips;   /* commands failed at once: their node was backing off */
  uint64_t redirects;    /* MOVED and ASK replies followed */
  uint64_t bytes_out, bytes_in;
  uint64_t nodes;        /* nodes known (1 standalone) */
  int cluster;
} kv_remote_counters;

/* Parse "host:port" (the seed) and make the client; nothing is connected yet (the first batch
 * connects), so a server that is down does not fail the open. KVDB_INVALID names a bad address
 * or timeout (1..60000 ms). */
kvdb_status kv_remote_open(const char *addr, uint32_t timeout_ms, const kv_logger *log,
                           kv_remote **out);
void kv_remote_close(kv_remote *r);
/* Poll a socket for up to us µs before a blocking read of a reply (resp.h; 0, the default:
 * always a blocking read). Takes effect at the next batch. */
void kv_remote_set_poll(kv_remote *r, uint32_t us);
/* Run cmds[0..n) as one pipelined round trip. Returns KVDB_OK when every command has its
 * status; KVDB_NOMEM. Failures are per command (status KV_RCMD_ERR) and counted. */
kvdb_status kv_remote_exec(kv_remote *r, kv_rcmd *cmds, size_t n);
/* kv_remote_exec, calling cb(ctx, i) as soon as command i's reply is final (in the order the
 * replies arrive: command order per node), so a caller can use each value while the next ones
 * are still on the wire; a command that gets no call (its node down) is final on return. */
typedef void (*kv_rcmd_fn)(void *ctx, size_t i);
kvdb_status kv_remote_exec_cb(kv_remote *r, kv_rcmd *cmds, size_t n, kv_rcmd_fn cb, void *ctx);
/* Free the replies of cmds[0..n) (their data). */
void kv_remote_release(kv_rcmd *cmds, size_t n);
void kv_remote_counters_get(kv_remote *r, kv_remote_counters *out);

#endif
