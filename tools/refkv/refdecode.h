/* SPDX-License-Identifier: MIT */
/*
 * tools/refkv/refdecode.h — the reference model decoding with sparse attention over KV kept in
 * kvdb (issue 18): at every step, each layer and KV head attends only to a budget of positions
 * (the recent window, optional attention sinks, and the top-scoring rest by q.K), whose K and V
 * rows are fetched from the store; and agreement with dense attention. Used by kvdb-demo decode,
 * kvdb-bench decode and the tests. Not part of libkvdb; public kvdb.h only, like refkv.h.
 *
 * How a step selects, for layer l, KV head g, position pos (context size c = pos + 1):
 *   budget B = max(1, floor(budget * c)) positions, pos itself included (budget >= 1: all);
 *   the recent window [pos - W + 1, pos] (W = min(window, B)); then the first `sinks`
 *   positions while B allows; then the rest of B by score over the remaining positions:
 *   positions already stored are ranked by kvdb_score_batch on the model's int8/int4 score
 *   copies (refdecode_opts.scorer STORE) or by the exact float q.K (EXACT, an upper bound);
 *   positions not yet flushed to the store (at most a block) are scored on the host at full
 *   precision, as a DRAM hot pool would be. The G query heads sharing g combine as
 *   refdecode_combine says. Every selected stored position's K and V are fetched with
 *   kvdb_get_head_tokens (only that head's page groups are read), the window's included; rows
 *   not yet stored come from the state's cache.
 *
 * The context grows: refdecode_begin stores the prompt (kvdb_put, its KV from the state's
 * cache); refdecode_append adds a token whose KV the state now holds and, when a block of
 * block_tokens is complete, puts the context again (kvdb stores only the new blocks), so the
 * store serves every complete block of the history.
 *
 * Model requirements: f32 storage (REFKV_STORE_F32) and, for the STORE scorer, km.score_bits 8
 * or 4 (set it after refkv_model_init). Errors as refkv.h: a kvdb_status, refkv_errmsg().
 */
#ifndef REFDECODE_H
#define REFDECODE_H

#include <stdio.h>

#include "refkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Who ranks the stored positions. */
typedef enum refdecode_scorer {
  REFDECODE_SCORE_STORE = 0, /* kvdb_score_batch on the model's int8/int4 copies */
  REFDECODE_SCORE_EXACT = 1, /* the float q.K from the state's cache (an upper bound) */
} refdecode_scorer;

/* How the query heads of one KV head choose together. */
typedef enum refdecode_combine {
  REFDECODE_SUM = 0,      /* one ranking by the sum of the heads' scores (KVDB_SCORE_SUM) */
  REFDECODE_MAX = 1,      /* one ranking by the largest of the heads' scores (KVDB_SCORE_MAX) */
  REFDECODE_PER_HEAD = 2, /* each head ranks alone; the union is filled round-robin, the best
                             of head 0, of head 1, ..., then the second best of each, ...
                             (at most 8 query heads per KV head) */
} refdecode_combine;

typedef struct refdecode_opts {
  double budget;     /* share (0, 1] of the context attended per layer and KV head, window,
                        sinks and the current position included; >= 1: every position */
  uint32_t window;   /* the most recent positions always attended (>= 1; the current one
                        counts), as far as the budget allows */
  uint32_t sinks;    /* the first positions always attended, as far as the budget allows */
  refdecode_scorer scorer;
  refdecode_combine combine;
  int session;       /* 1: through a kvdb decode session (kvdb_decode_open): the layer's
                        selection by kvdb_decode_select, rows by kvdb_decode_fetch (the session's
                        hot pool, else the store), each token appended by kvdb_decode_append;
                        needs the STORE scorer (PER_HEAD: one select per query head of each
                        group, n_q_heads = n_kv_heads). 0: through kvdb_score_batch and
                        kvdb_get_head_tokens on the context re-put per completed block */
  uint32_t hot_tokens; /* session: its hot pool per layer and KV head (kvdb_decode_opts) */
} refdecode_opts;

/* Defaults: budget 0.2, window 16, sinks 0, STORE, SUM, session 0, hot_tokens 1024. */
void refdecode_opts_init(refdecode_opts *o);

/* What the steps so far did (bytes as kvdb's stats count them). With a session, rows_store is
 * its cold reads, rows_dram its hot hits, and the bytes its ssd_bytes and score_bytes
 * (kvdb_decode_stats). */
typedef struct refdecode_stats {
  uint64_t steps;        /* sparse steps */
  uint64_t heads;        /* (layer, KV head) selections */
  uint64_t attended;     /* positions attended over all heads (the current one included) */
  uint64_t context;      /* context positions over all heads (what dense attention reads) */
  uint64_t rows_store;   /* rows (K and V) fetched from kvdb */
  uint64_t rows_dram;    /* rows read from the state's cache (not yet stored) */
  uint64_t score_bytes;  /* kvdb_score_stats.host_bytes, summed */
  uint64_t fetch_bytes;  /* kvdb_fetch_stats.host_bytes, summed */
  uint64_t puts;         /* kvdb_put calls (the prompt and, without a session, each completed
                            block) */
  uint64_t appended;     /* session: tokens appended (kvdb_decode_append) */
} refdecode_stats;

typedef struct refdecode refdecode;

/*
 * A decoder over db for model m driving state st (st's model must be m->rm; st must outlive the
 * decoder). Returns KVDB_OK; KVDB_INVALID (NULL, a storage other than f32, the STORE scorer
 * with score_bits 0, budget <= 0 or NaN, window 0); KVDB_NOMEM.
 */
kvdb_status refdecode_open(kvdb *db, const refkv_model *m, refmodel_state *st,
                           const refdecode_opts *o, refdecode **out);

/* Free. NULL is a no-op. */
void refdecode_close(refdecode *d);

/*
 * Start a context: tokens[0..n) (n >= 1) whose KV st's cache holds at [0, n) (a prefill); they
 * are stored (kvdb_put) and become the history. Forgets an earlier history. Returns KVDB_OK;
 * KVDB_INVALID; kvdb_put's errors.
 */
kvdb_status refdecode_begin(refdecode *d, const int *tokens, size_t n);

/*
 * Feed token at the next position (the history's length) with sparse attention
 * (refmodel_forward_sparse); *logits (optional) receives the state's logits. Does not add the
 * token to the history (refdecode_append does). Returns KVDB_OK; KVDB_INVALID (no history, a
 * bad token, the state full); kvdb_score_batch's and kvdb_get_head_tokens's errors.
 */
kvdb_status refdecode_step(refdecode *d, int token, const float **logits);

/*
 * Add token to the history at the next position; st's cache must hold its KV there (after
 * refdecode_step, or a dense refmodel_forward at that position). A completed block is stored.
 * Returns KVDB_OK; KVDB_INVALID (state full); kvdb_put's errors.
 */
kvdb_status refdecode_append(refdecode *d, int token);

/* The history's length (the next position). */
size_t refdecode_length(const refdecode *d);

/* The stats so far (zeroed by refdecode_open only). */
const refdecode_stats *refdecode_get_stats(const refdecode *d);

/* Agreement of sparse with dense greedy decoding for one prompt (refdecode_agreement). */
typedef struct refdecode_agree {
  int steps;          /* generated tokens compared */
  int tf_agree;       /* teacher-forced: steps whose sparse argmax equals the dense one */
  int fr_agree;       /* free-running: positions where the two generations hold the same token */
  int fr_first_diff;  /* free-running: the first step where they differ (steps if none) */
  double tf_mean_kl;  /* teacher-forced: mean KL(dense || sparse) of the next-token
                         distributions, nats */
  refdecode_stats tf; /* the teacher-forced run's stats */
} refdecode_agree;

/*
 * Compare sparse with dense decoding of prompt[0..n) over `steps` greedy tokens (no stop
 * token). Dense: refmodel_forward over the whole cache. Teacher-forced: one state; at every
 * step the sparse step (over the dense history, stored in db as it grows) and then the dense
 * step feed the same token, so each step compares the two next-token distributions for the
 * same context. Free-running (when fr_model is not NULL): a second state decodes its own
 * argmaxes sparsely, its history's KV (computed sparsely) stored under fr_model, which must be
 * a model id of its own (so blocks of the same tokens with dense KV are never shared). The
 * states must hold n + steps positions. Returns KVDB_OK; KVDB_INVALID; kvdb's errors.
 */
kvdb_status refdecode_agreement(kvdb *db, const refkv_model *m, const refkv_model *fr_model,
                                const refdecode_opts *o, refmodel_state *a, refmodel_state *b,
                                const int *prompt, size_t n, int steps, refdecode_agree *out);

/*
 * Up to n_prompts prompts of exactly prompt_len tokens from a corpus text (TinyStories): prompt i
 * is BOS and the encoding of consecutive paragraphs (blank-line separated) of text, cut to
 * prompt_len tokens; the next prompt starts at the paragraph after the last one used, so no two
 * prompts share text. out receives n_prompts * prompt_len ints; *got how many prompts were made
 * (fewer when the text ends). Returns KVDB_OK; KVDB_INVALID (NULL, prompt_len < 2); KVDB_NOMEM.
 */
kvdb_status refdecode_prompts(const refmodel_tokenizer *tok, const char *text, size_t len,
                              int n_prompts, int prompt_len, int *out, int *got);

#ifdef __cplusplus
}
#endif

#endif /* REFDECODE_H */
