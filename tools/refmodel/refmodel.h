/* SPDX-License-Identifier: MIT */
/*
 * tools/refmodel/refmodel.h — a small reference Llama-2 model on the CPU, for tools, tests and
 * benchmarks. Not part of libkvdb and independent of kvdb.h.
 *
 * It loads llama2.c "legacy" v0 checkpoints (`.bin`) and llama2.c tokenizer exports
 * (`tok512.bin` format), encodes and decodes text, and runs a float32 forward pass whose KV cache
 * the caller can read and write, so that KV computed by a real model can be stored, restored and
 * compared. The formats and the exact forward-pass semantics are those of
 * shared/models/README.md (llama2.c's run.c): RMSNorm eps 1e-5, RoPE on adjacent pairs computed
 * on the fly, grouped-query attention, SwiGLU FFN, classifier shared with the token embedding
 * unless the header's vocab_size is negative.
 *
 * Checkpoint layout (little-endian): 7 int32 `dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len`, then float32 token_embedding[vocab][dim], rms_att[L][dim],
 * wq[L][dim][dim], wk[L][kv_dim][dim], wv[L][kv_dim][dim], wo[L][dim][dim], rms_ffn[L][dim],
 * w1[L][hidden][dim], w2[L][dim][hidden], w3[L][hidden][dim], rms_final[dim],
 * freq_cis_real[seq_len][head_size/2], freq_cis_imag[same] (both ignored), and wcls[vocab][dim]
 * only when the stored vocab_size is negative. The file size must match exactly.
 *
 * Tokenizer layout (little-endian): int32 max_token_length, then per token in id order float32
 * score, int32 len (0..max_token_length), len raw bytes (no NUL).
 *
 * Errors. Every function that can fail returns an int: REFMODEL_OK (0) or one of the negative
 * REFMODEL_E* codes below. After a failure, refmodel_errmsg() returns a message for the calling
 * thread naming the file (or buffer) and what was wrong, e.g.
 * "'x.bin': truncated: header says 1056540 bytes, file has 1000".
 *
 * Threading. A loaded refmodel_model or refmodel_tokenizer is never modified after loading, so
 * one may be shared by any number of threads. A refmodel_state must be used by one thread at a
 * time. The error message is per thread.
 *
 * Memory. Loaders copy what they need: the caller may free a buffer passed to a *_load_buffer
 * function as soon as it returns. Objects are freed with their *_free function; a state must be
 * freed before the model it was made from.
 */
#ifndef REFMODEL_H
#define REFMODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Values are pinned. */
#define REFMODEL_OK 0
#define REFMODEL_EIO (-1)        /* a file could not be opened or read */
#define REFMODEL_ENOMEM (-2)     /* out of memory */
#define REFMODEL_EFORMAT (-3)    /* a header field, length, size or value is invalid */
#define REFMODEL_ETRUNCATED (-4) /* the data ends before its header says it should */
#define REFMODEL_EINVAL (-5)     /* bad argument (NULL, token or position out of range, ...) */
#define REFMODEL_ENOSPC (-6)     /* the caller's output array is too small; size needed returned */
#define REFMODEL_EABORTED (-7)   /* a caller's callback returned non-zero (refmodel_forward_sparse) */

/* Bounds a checkpoint header must respect (each field must also be >= 1). */
#define REFMODEL_MAX_DIM 65536
#define REFMODEL_MAX_HIDDEN_DIM (1 << 20)
#define REFMODEL_MAX_LAYERS 1024
#define REFMODEL_MAX_VOCAB (1 << 22)
#define REFMODEL_MAX_SEQ_LEN (1 << 20)
/* Bound on a tokenizer's max_token_length (and so on every piece's length). */
#define REFMODEL_MAX_TOKEN_LENGTH 4096

/* Special token ids (llama2.c conventions). */
#define REFMODEL_TOKEN_BOS 1
#define REFMODEL_TOKEN_EOS 2

/* Flags for refmodel_encode(). */
#define REFMODEL_ENCODE_BOS 1u /* start with BOS (1) */
#define REFMODEL_ENCODE_EOS 2u /* end with EOS (2) */

/*
 * Short static name of a status code, e.g. "REFMODEL_ETRUNCATED"; "REFMODEL_E?" for a value that
 * is not a code. Never NULL. Cannot fail.
 */
const char *refmodel_strerror(int rc);

/*
 * Message for the last refmodel call that failed on the calling thread, or "" if none has.
 * Never NULL. The string belongs to the library and stays valid until the next failing refmodel
 * call on this thread.
 */
const char *refmodel_errmsg(void);

/* ---------------------------------------------------------------------------------------- */
/* Checkpoint                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Model hyper-parameters, as read from the header (vocab_size made positive). */
typedef struct refmodel_config {
  int dim;               /* transformer width */
  int hidden_dim;        /* FFN width */
  int n_layers;          /* number of layers */
  int n_heads;           /* query heads */
  int n_kv_heads;        /* key/value heads; divides n_heads */
  int vocab_size;        /* always > 0 here */
  int seq_len;           /* maximum context the model was trained for */
  int head_size;         /* dim / n_heads; even */
  int kv_dim;            /* n_kv_heads * head_size: floats of K (or V) per layer and position */
  int shared_classifier; /* 1: logits use token_embedding (header vocab > 0); 0: a wcls follows */
} refmodel_config;

/* A loaded checkpoint. Immutable once loaded. */
typedef struct refmodel_model refmodel_model;

/*
 * Load a checkpoint from the file at path.
 * On REFMODEL_OK *out receives a new model (free with refmodel_model_free); on error *out is set
 * to NULL. Errors: REFMODEL_EINVAL (path or out NULL), REFMODEL_EIO (cannot open or read),
 * REFMODEL_ETRUNCATED (shorter than the header implies), REFMODEL_EFORMAT (a header field out of
 * bounds, heads not dividing dim, n_kv_heads not dividing n_heads, odd head_size, bytes after the
 * last tensor, or a NaN/infinite weight), REFMODEL_ENOMEM.
 */
int refmodel_model_load(const char *path, refmodel_model **out);

/*
 * Load a checkpoint from size bytes at data (any alignment), with the same checks and errors as
 * refmodel_model_load(). name labels the buffer in error messages (NULL: "(buffer)"). The bytes
 * are copied; data is not retained. data may be NULL only when size is 0 (which fails as
 * truncated).
 */
int refmodel_model_load_buffer(const void *data, size_t size, const char *name,
                               refmodel_model **out);

/* Free a model. NULL is a harmless no-op. Every state made from it must be freed first. */
void refmodel_model_free(refmodel_model *m);

/* The model's configuration. Never NULL for a loaded model; valid until the model is freed. */
const refmodel_config *refmodel_model_config(const refmodel_model *m);

/*
 * A 64-bit digest of the checkpoint's bytes (header and weights, as stored in the file), computed
 * at load: the same file loaded from a path or a buffer, on any host, gives the same value, and a
 * change to any byte almost surely changes it. Used to name a model's stored KV (two checkpoints
 * of the same shape compute different KV for the same tokens). Not cryptographic. Cannot fail for
 * a loaded model.
 */
uint64_t refmodel_model_digest(const refmodel_model *m);

/* ---------------------------------------------------------------------------------------- */
/* Forward pass and KV cache                                                                  */
/* ---------------------------------------------------------------------------------------- */

/*
 * Run state: activations, logits, and the KV cache for positions [0, max_pos).
 *
 * KV cache layout. K and V are two separate float arrays, each laid out [layer][pos][kv_dim]:
 * the K of layer l at position p starts at key(l, 0) + p * kv_dim, and one layer's block is
 * max_pos * kv_dim floats, so refmodel_state_key(st, l, 0) is the start of a contiguous
 * [max_pos][kv_dim] array (same for V). K is stored after RoPE. Within kv_dim, KV head g holds
 * floats [g * head_size, (g + 1) * head_size).
 *
 * Restoring KV. A forward step at position p reads K and V of positions [0, p] of every layer
 * and writes position p. To continue a sequence whose KV comes from elsewhere (a store, another
 * state), write K and V of positions [0, p) of every layer through refmodel_state_key() /
 * refmodel_state_value(), then call refmodel_forward() (or refmodel_prefill(), or
 * refmodel_generate()) from position p with the next token. Nothing else in the state depends
 * on earlier positions. A new state's cache is zeroed; it is never cleared afterwards, and does
 * not need to be: to start a new sequence, feed its first token at position 0.
 */
typedef struct refmodel_state refmodel_state;

/*
 * Create a state for model m holding up to max_pos positions (0 means m's seq_len). max_pos may
 * exceed seq_len (RoPE is computed on the fly) but must be <= REFMODEL_MAX_SEQ_LEN.
 * On REFMODEL_OK *out receives the state (free with refmodel_state_free); on error *out = NULL.
 * Errors: REFMODEL_EINVAL (m or out NULL, max_pos negative or too large), REFMODEL_ENOMEM.
 * The state keeps a pointer to m: m must outlive it.
 */
int refmodel_state_new(const refmodel_model *m, int max_pos, refmodel_state **out);

/* Free a state. NULL is a harmless no-op. */
void refmodel_state_free(refmodel_state *st);

/* Number of positions st holds (its max_pos). Cannot fail for a valid state. */
int refmodel_state_max_pos(const refmodel_state *st);

/*
 * Pointer to the kv_dim floats of K (after RoPE) of layer at position pos, writable; see the
 * layout above. Returns NULL if layer is not in [0, n_layers) or pos not in [0, max_pos) (and
 * then sets the error message). Valid until st is freed.
 */
float *refmodel_state_key(refmodel_state *st, int layer, int pos);

/* Same as refmodel_state_key() for V. */
float *refmodel_state_value(refmodel_state *st, int layer, int pos);

/*
 * The logits (vocab_size floats) of the last successful forward step, all zero before the first.
 * Owned by st; overwritten by the next forward step; valid until st is freed.
 */
const float *refmodel_state_logits(const refmodel_state *st);

/*
 * The query of layer `layer` computed by the last forward step: dim floats (n_heads query heads
 * of head_size, after RoPE, in the same rotary frame as the cached keys; query head h attends
 * with KV head h / (n_heads / n_kv_heads)). All zero before the first step. Overwritten by the
 * next step; valid until st is freed. NULL (and the error message set) for a bad layer. Used to
 * give a store the prompt's last queries (SnapKV's observation window, quality probes).
 */
const float *refmodel_state_query(const refmodel_state *st, int layer);

/*
 * Mark cached position pos of KV head kv_head in layer `layer` absent (absent != 0) or present
 * again. The query heads that share that KV head give an absent position no attention (its
 * score is -inf before the softmax), as if the row had been dropped from the cache: how a
 * token-dropping KV compression (K-norm, KeyDiff, SnapKV keep some rows per layer and KV head)
 * looks to the model. A forward step at pos makes pos present in every layer and head. A new
 * state has every position present; so has one after refmodel_state_clear_absent(). The K and V
 * of an absent row are not read for its weight (0 × them is added: keep them finite).
 * Errors: REFMODEL_EINVAL (st NULL, layer, kv_head or pos out of range), REFMODEL_ENOMEM (the
 * first mark allocates n_layers * n_kv_heads * max_pos bytes).
 */
int refmodel_state_set_absent(refmodel_state *st, int layer, int kv_head, int pos, int absent);

/* Make every position present again (and free the marks). NULL is a harmless no-op. */
void refmodel_state_clear_absent(refmodel_state *st);

/*
 * Feed token at position pos: writes K and V of position pos in every layer, attends over
 * positions [0, pos], and computes the next-token logits. If logits is not NULL, *logits receives
 * refmodel_state_logits(st). Errors: REFMODEL_EINVAL (st NULL, token not in [0, vocab_size), pos
 * not in [0, max_pos)); the state is unchanged on error.
 */
int refmodel_forward(refmodel_state *st, int token, int pos, const float **logits);

/*
 * Sparse attention: what one KV head of one layer attends to in a refmodel_forward_sparse() step
 * at position pos, filled by the caller's select callback.
 *   pos[0..n)   distinct positions in [0, pos) (any order). Position pos itself (the token fed
 *               now, whose K and V this step has just written to the state's cache) is always
 *               attended in addition and must not be listed. n may be 0 (pos attends to itself
 *               only); pos may be NULL when n is 0.
 *   k, v        NULL, or the K (after RoPE) and V rows of the first n_rows listed positions,
 *               each head_size floats of this KV head, row i at k + i * row_stride (same for v):
 *               rows fetched from a store instead of the state's cache. The rows of the other
 *               listed positions (i >= n_rows) are read from the state's cache.
 *   n_rows      0..n; must be 0 when k or v is NULL.
 *   row_stride  floats from one row to the next; 0 means head_size.
 * The arrays must stay valid until the callback is called again or the step returns.
 */
typedef struct refmodel_attend {
  const int *pos;
  int n;
  const float *k;
  const float *v;
  int n_rows;
  size_t row_stride;
} refmodel_attend;

/*
 * The select callback of refmodel_forward_sparse(): called once per layer and KV head, in order
 * (layer 0 KV head 0, layer 0 KV head 1, ..., then layer 1, ...), after the layer's query, K and
 * V of position pos are computed (so the state's cache holds K and V of pos for that layer).
 * q: the n_q query heads (n_heads / n_kv_heads of them) that share kv_head, back to back,
 * head_size floats each, after RoPE (same frame as the cached keys). out arrives zeroed; fill it
 * (see refmodel_attend). Return 0, or non-zero to abort the step (REFMODEL_EABORTED).
 */
typedef int (*refmodel_select_fn)(void *user, int layer, int kv_head, int pos, const float *q,
                                  int n_q, refmodel_attend *out);

/*
 * Feed token at position pos like refmodel_forward(), but each layer's KV head g attends only to
 * the positions its select callback returns for it (plus pos itself), and reads their K and V
 * from the callback's rows where it gives them, else from the state's cache: sparse attention
 * over the tokens a store selects and fetches (top-k by q.K, a recent window, sinks). The
 * softmax runs over the attended positions only. Positions marked absent
 * (refmodel_state_set_absent) get no attention even when listed. With every position [0, pos)
 * listed and rows equal to the cache's, the logits equal refmodel_forward()'s bit for bit (the
 * positions are attended in ascending order, whatever order they are listed in).
 * Writes K and V of position pos in every layer, like refmodel_forward(). If logits is not NULL,
 * *logits receives refmodel_state_logits(st).
 * Errors: REFMODEL_EINVAL (st or select NULL, token or pos out of range, or a callback's list
 * with a position outside [0, pos), a repeated position, n < 0, n_rows outside 0..n, or rows
 * NULL with n_rows > 0: the message names the layer, KV head and position); REFMODEL_EABORTED
 * (the callback returned non-zero: the message gives its value, layer and KV head);
 * REFMODEL_ENOMEM (the first sparse step allocates max_pos * (2 * head_size + 1) scratch
 * floats). After REFMODEL_EABORTED or a bad list the cache rows of position pos and the logits
 * are unspecified; positions other than pos are never changed.
 */
int refmodel_forward_sparse(refmodel_state *st, int token, int pos, refmodel_select_fn select,
                            void *user, const float **logits);

/*
 * Feed n tokens at positions start_pos .. start_pos + n - 1, in order (a prompt). If logits is not
 * NULL, *logits receives the logits after the last token. Errors: REFMODEL_EINVAL (st or tokens
 * NULL, n < 1, start_pos < 0, start_pos + n > max_pos, a token out of range). Tokens and positions
 * are all checked before any is fed, so the state is unchanged on error.
 */
int refmodel_prefill(refmodel_state *st, const int *tokens, int n, int start_pos,
                     const float **logits);

/*
 * Greedy (argmax) generation. Feeds token at pos, takes the argmax as the next token, feeds it at
 * pos + 1, and so on until n tokens are produced; out[i] is the argmax after feeding at pos + i.
 * The last produced token is not fed: producing k tokens writes cache positions
 * pos .. pos + k - 1. If stop_token >= 0 and an argmax equals it, generation stops there and the
 * stop token is not stored (so k + 1 positions were written); llama2.c stops on BOS: pass
 * REFMODEL_TOKEN_BOS, or -1 never to stop early. out must hold n ints. *n_out (if not NULL)
 * receives k. On return refmodel_state_logits() holds the logits of the last step.
 * Errors: REFMODEL_EINVAL (st or out NULL, n < 1, token out of range, pos < 0,
 * pos + n > max_pos); nothing is fed on error.
 */
int refmodel_generate(refmodel_state *st, int token, int pos, int n, int stop_token, int *out,
                      int *n_out);

/*
 * Index of the largest of v[0..n), the lowest index on ties; NaN entries never win unless all
 * are NaN (then 0). Returns REFMODEL_EINVAL if v is NULL or n < 1.
 */
int refmodel_argmax(const float *v, int n);

/*
 * Next-token log-probabilities: out[i] = logits[i] - log(sum_j exp(logits[j])), computed stably
 * (max subtracted, sum in double). out may equal logits (in place). For the KL divergence of
 * distributions p and q over the same logits size: sum_i exp(lp[i]) * (lp[i] - lq[i]).
 * Errors: REFMODEL_EINVAL (NULL pointer or n < 1).
 */
int refmodel_log_softmax(const float *logits, int n, float *out);

/* ---------------------------------------------------------------------------------------- */
/* Tokenizer                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* A loaded tokenizer. Immutable once loaded. */
typedef struct refmodel_tokenizer refmodel_tokenizer;

/*
 * Load a tokenizer from the file at path. If vocab_size > 0 the file must hold exactly that many
 * tokens (use the model's vocab_size); if vocab_size is 0 it holds as many as fit up to the end of
 * the file (at least one). On REFMODEL_OK *out receives the tokenizer (free with
 * refmodel_tokenizer_free); on error *out = NULL. Errors: REFMODEL_EINVAL (NULL argument or
 * vocab_size < 0 or > REFMODEL_MAX_VOCAB), REFMODEL_EIO, REFMODEL_ETRUNCATED (file ends inside
 * the header, a score, a length or a piece, or before vocab_size tokens), REFMODEL_EFORMAT
 * (max_token_length not in 1..REFMODEL_MAX_TOKEN_LENGTH, a piece length negative or larger than
 * max_token_length, a non-finite score, bytes left after vocab_size tokens, more than
 * REFMODEL_MAX_VOCAB tokens), REFMODEL_ENOMEM.
 */
int refmodel_tokenizer_load(const char *path, int vocab_size, refmodel_tokenizer **out);

/*
 * Load a tokenizer from size bytes at data, with the same checks and errors as
 * refmodel_tokenizer_load(). name labels the buffer in messages (NULL: "(buffer)"). The bytes
 * are copied; data is not retained.
 */
int refmodel_tokenizer_load_buffer(const void *data, size_t size, const char *name, int vocab_size,
                                   refmodel_tokenizer **out);

/* Free a tokenizer. NULL is a harmless no-op. */
void refmodel_tokenizer_free(refmodel_tokenizer *tok);

/* Number of tokens in tok. Cannot fail for a loaded tokenizer. */
int refmodel_tokenizer_vocab_size(const refmodel_tokenizer *tok);

/*
 * Encode len bytes of text (need not be NUL-terminated; a NUL byte is an ordinary byte) the
 * llama2.c way: optional BOS; then, if len > 0, a dummy-prefix " "; then one symbol per UTF-8
 * sequence (a lead byte and up to 3 continuation bytes) that is a piece, else one byte-fallback
 * token (byte + 3) per byte; then repeatedly merge the adjacent pair whose concatenated pieces
 * form the best-scoring piece (leftmost on ties; pieces scoring <= -1e10 never merge); then
 * optional EOS. On duplicate pieces the lowest id is used. BOS never takes part in merges (unlike
 * llama2.c, which differs only for a vocab with BOS-prefixed pieces), so with
 * REFMODEL_ENCODE_BOS tokens[0] is BOS. O(n log n) in the text length; temporary memory is about
 * 72 bytes per text byte. At most refmodel_encode_bound(len) tokens are produced.
 * On REFMODEL_OK *n_tokens receives the count and tokens[0..count) the ids.
 * Errors: REFMODEL_EINVAL (tok or n_tokens NULL, text NULL with len > 0, tokens NULL with
 * cap > 0, unknown flag bits, len >= 2^30, BOS/EOS/byte-fallback id needed but outside the
 * vocab), REFMODEL_ENOSPC (count > cap; *n_tokens receives the count needed), REFMODEL_ENOMEM.
 */
int refmodel_encode(const refmodel_tokenizer *tok, const char *text, size_t len, unsigned flags,
                    int *tokens, size_t cap, size_t *n_tokens);

/* Largest number of tokens refmodel_encode() produces for len bytes of text: len + 3. */
size_t refmodel_encode_bound(size_t len);

/*
 * Text of token after prev_token, the llama2.c way: if prev_token is BOS and the piece starts with
 * ' ', that space is dropped; then a piece that is exactly "<0xHH>" (H a hex digit, either case)
 * becomes that one raw byte. *piece receives a pointer to the bytes (not NUL-terminated; owned by
 * tok or static; valid until tok is freed) and *len their count. prev_token may be any value.
 * Errors: REFMODEL_EINVAL (NULL pointer, token not in [0, vocab_size)).
 */
int refmodel_decode(const refmodel_tokenizer *tok, int prev_token, int token, const char **piece,
                    size_t *len);

/*
 * Concatenate refmodel_decode() of tokens[0..n), each decoded after the one before it and
 * tokens[0] after prev_token, into out[0..cap). The output is not NUL-terminated. To get back the
 * text given to refmodel_encode(..., REFMODEL_ENCODE_BOS, ...), pass the tokens after the BOS with
 * prev_token = REFMODEL_TOKEN_BOS. On REFMODEL_OK *out_len receives the byte count. Errors:
 * REFMODEL_EINVAL (NULL pointer, out NULL with cap > 0, a token out of range),
 * REFMODEL_ENOSPC (more than cap bytes; *out_len receives the count needed; out holds the first
 * cap bytes).
 */
int refmodel_detokenize(const refmodel_tokenizer *tok, int prev_token, const int *tokens, size_t n,
                        char *out, size_t cap, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif /* REFMODEL_H */
