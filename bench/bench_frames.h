/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_frames.h — `kvdb-bench compress`'s lossless frames (bench_frames.c): issue 16's
 * lossless figures on one KV set, beside the section codecs of bench_compress.c.
 */
#ifndef BENCH_FRAMES_H
#define BENCH_FRAMES_H

#include "kvset.h"

typedef struct bench_frames_figures {
  int ok;
  double dec_gbps; /* one core, default frame size and level */
  double vs_bound; /* ratio / byte-plane entropy bound */
} bench_frames_figures;

/* Measure lossless frames on set s, print the table, add the JSON fields (s->prefix). 0, or -1
 * logged. */
int bench_frames_set(const bench_env *env, bench_json *j, const bench_kvset *s,
                     bench_frames_figures *fig);

/* bench_layout.c: the real set's contexts put through kvdb in each config; stored bytes over
 * logical bytes (issue 16, must-have 3), JSON raw_bytes_vs_logical and layout_*. 0, or -1
 * logged. */
int bench_layout_set(const bench_env *env, bench_json *j, const bench_kvset *s);
/* `kvdb-bench layout`: bench_layout_set alone on the real set. */
int bench_layout(const bench_env *env, bench_json *j);
/* bench_layout.c: a cold kvdb_get of one context of set s (int4, raw, lossless) in logical
 * bytes per second over the O_DIRECT read bandwidth of a plain file of its stored size (JSON
 * int4_logical_get_vs_raw_read, ...). 0, or -1 logged. */
int bench_get_vs_read(const bench_env *env, bench_json *j, const bench_kvset *s);

#endif
