/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_decode.h — the model part of `kvdb-bench decode` (issue 18): greedy agreement of
 * stories260K decoding with sparse attention over KV kept in kvdb against dense attention
 * (bench_decode_model.c, through tools/refkv/refdecode.h).
 */
#ifndef BENCH_DECODE_H
#define BENCH_DECODE_H

#include <stdio.h>

#include "bench.h"

/*
 * Measure the agreement curve (fetch budgets 5, 10, 20, 30, 50 and 100% of the context, recent
 * window included) and the selection designs at 20% on stories260K: 12 prompts of 320 tokens
 * from TinyStories, 128 generated tokens (quick: 6 prompts, 64 tokens), in a database made
 * under db_dir. shared_dir: the folder holding models/ and corpora/ (NULL: $KVDB_MODEL_DIR,
 * $KVDB_CORPUS_DIR, $KVDB_SHARED_DIR, else the build's ../shared). Prints the tables to out and
 * adds the figures to j (may be NULL): agreement_free_20pct, agreement_<B>pct and
 * agreement_free_<B>pct for the other budgets, one field per design, but NOT agreement_20pct
 * itself (the caller's JSON line carries it once: *agreement_20pct).
 * *agreement_20pct (optional) receives the headline figure (teacher-forced, the baseline
 * design), NaN when skipped. Returns 0 (also when the model or corpus is absent: "SKIPPED" is
 * printed and j gets decode_agreement_skipped), 1 on an error (printed).
 */
int bench_decode_agreement_run(const char *shared_dir, const char *db_dir, int quick, FILE *out,
                               bench_json *j, double *agreement_20pct);

/* The same from a kvdb-bench environment (--model-dir, the run's directory, --quick, stdout):
 * the hook `kvdb-bench decode` (bench_decode.c) calls. */
int bench_decode_agreement(const bench_env *env, bench_json *j, double *agreement_20pct);

/* `kvdb-bench decode-model`: bench_decode_agreement alone, plus agreement_20pct in j. */
int bench_decode_model(const bench_env *env, bench_json *j);

#endif /* BENCH_DECODE_H */
