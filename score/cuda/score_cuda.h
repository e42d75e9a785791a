/* SPDX-License-Identifier: MIT */
/*
 * score/cuda/score_cuda.h — the optional CUDA scorer (issue 6, Must have 6): scores
 * int8 / int4 score copies that are already resident in GPU memory against a query, and selects
 * their top k on the GPU. Only the k winners (8 bytes each) cross back to the host.
 *
 * SAME API, SAME RESULTS. Everything here is the score/score.h API moved to the device:
 * the same kv_score_layout (the page-grouped code pages of "THE SCORE COPY"), the same
 * kv_score_query (made by kv_score_query_create(); its public codes and scales are uploaded per
 * call), the same kv_score_status / kv_score_err, the same spans. The scores are those of
 * score.h "SCORE OF TOKEN t", bit for bit: the exact integer dot (int32), then
 * (float)dot * qscale (one rounding), the greater-than max over the query's vectors, then
 * * scale[t] (one rounding) — no FMA can form (no addition follows a product), and nvcc's
 * defaults keep denormals (no -use_fast_math, no -ftz). The top k is that of kv_score_topk()
 * for the same spans: same ORDER (score, then lower position; -0 below +0; NaN last and
 * reported as a quiet NaN), same positions, same score bits. The one difference: a NaN score
 * returned by kv_score_cuda_tokens() may carry another NaN payload than the CPU's.
 *
 * HOW. kv_score_cuda_topk(): one thread per token computes the score and its 64-bit order entry
 * (sortable score << 32 | ~pos, the CPU accumulator's key) into device memory (8 bytes per
 * token, 1/16 of the int8 keys at d = 128); an MSB radix select finds the k-th largest entry in
 * at most 8 passes of 8 bits (each: a histogram kernel, 1 KiB back to the host, the host picks
 * the digit); a collect kernel gathers the k winners; the host orders them with
 * kv_score_acc_finish() — the CPU's own code. The device never holds less than the whole entry
 * array: this is a select over materialized device scores, not a streaming accumulator
 * (device memory is plentiful; host memory stays O(k)).
 *
 * DEVICE MEMORY. kv_score_cuda_upload() copies a host view's code pages and scales into one
 * cudaMalloc; kv_score_cuda_view_wrap() describes codes and scales some other code already put
 * on the device (same page-grouped layout). Each top-k call allocates 8 bytes per token plus
 * O(k) and frees it before returning.
 *
 * ERRORS. Argument errors are KV_SCORE_EINVAL and are found before any CUDA call. Then:
 *   - no CUDA driver, no device, or a device older than compute capability 7.5 (the build holds
 *     sm_75 and sm_90 code and compute_90 PTX): KV_SCORE_EUNSUPPORTED; err->what names the check
 *     ("cudaGetDeviceCount failed" with err->value = the cudaError_t, e.g. 35,
 *     cudaErrorInsufficientDriver, on a machine without the NVIDIA driver);
 *   - cudaMalloc failing: KV_SCORE_ENOMEM (err->value = the bytes asked for);
 *   - any other CUDA runtime error: KV_SCORE_EUNSUPPORTED with err->what naming the call and
 *     err->value = its cudaError_t (kv_score_cuda_error_name() gives its name). A sticky error
 *     (e.g. an illegal address from a wrapped pointer that is not device memory) leaves the
 *     CUDA context unusable, as it does for any CUDA program.
 *
 * THREADS AND DEVICES. Every call sets the calling thread's current device to the view's for
 * its duration and restores the previous one. Work goes to opts->stream (a cudaStream_t of that
 * device; NULL: the legacy default stream) and each call synchronizes that stream before it
 * returns: nothing is left in flight and nothing keeps a pointer to caller memory.
 *
 * HOST EMULATION. kv_score_cuda_emu_tokens() / kv_score_cuda_emu_topk() run the very same
 * __host__ __device__ scoring, entry, histogram-digit and collect functions and the same
 * radix-select driver sequentially on the CPU, over host views. They exist so the algorithm is
 * tested on machines without a GPU (tests/unit/test_score_cuda.c); what they cannot test is the
 * launch and copy glue and the device's atomics.
 */
#ifndef KV_SCORE_CUDA_H
#define KV_SCORE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "score.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Quantized keys in device memory: score.h's layout, device pointers. */
typedef struct kv_score_cuda_view {
  kv_score_layout layout;
  const uint8_t *codes; /**< device: code page p at codes + p * 4096 */
  const float *scales;  /**< device: scales[n_tokens] */
  int device;           /**< CUDA device ordinal holding them */
  void *owned;          /**< the device allocation of kv_score_cuda_upload (NULL when wrapped) */
} kv_score_cuda_view;

/** Tokens [first, first + n) of *view, token t at position pos_base + t (as kv_score_span). */
typedef struct kv_score_cuda_span {
  const kv_score_cuda_view *view;
  uint32_t first, n;
  uint32_t pos_base;
} kv_score_cuda_span;

/** Options of the calls that touch the device. Fill with kv_score_cuda_opts_init(). */
typedef struct kv_score_cuda_opts {
  void *stream; /**< a cudaStream_t of the view's device; NULL (default): the default stream */
} kv_score_cuda_opts;
void kv_score_cuda_opts_init(kv_score_cuda_opts *o);

/**
 * @brief Is there a CUDA device this build can run on? *n_devices (if not NULL) receives the
 * number of devices (0 on failure).
 * @return KV_SCORE_OK (at least one device), KV_SCORE_EUNSUPPORTED (no driver: err->value has
 * cudaGetDeviceCount's cudaError_t; or zero devices).
 */
kv_score_status kv_score_cuda_available(int *n_devices, kv_score_err *err);

/** @brief The CUDA name of a cudaError_t value, e.g. "cudaErrorInsufficientDriver" for 35.
 * Needs no driver. Never NULL. */
const char *kv_score_cuda_error_name(uint64_t cuda_error);

/**
 * @brief Copy a host view (kv_score_view_init() or kv_score_copy_parse()) to device `device`:
 * its code pages (up to the last token's row; the rest of the last page is zeroed) and scales,
 * in one allocation that kv_score_cuda_view_free() releases. On error *out is zeroed.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (NULL, a layout kv_score_layout_init would not give,
 * device < 0 or past the devices), KV_SCORE_ENOMEM, KV_SCORE_EUNSUPPORTED (see ERRORS).
 */
kv_score_status kv_score_cuda_upload(const kv_score_view *src, int device,
                                     const kv_score_cuda_opts *opts, kv_score_cuda_view *out,
                                     kv_score_err *err);

/**
 * @brief Describe keys already in device memory (allocated by the caller, in score.h's
 * page-grouped layout of (n_tokens, head_dim, bits)): codes and scales must be memory device
 * `device` can read (checked with cudaPointerGetAttributes) and must outlive every use of the
 * view. kv_score_cuda_view_free() on it frees nothing. On error *out is zeroed.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (shape, NULL, device < 0, a host pointer the device
 * cannot read), KV_SCORE_EUNSUPPORTED (see ERRORS).
 */
kv_score_status kv_score_cuda_view_wrap(kv_score_cuda_view *out, uint32_t n_tokens,
                                        uint32_t head_dim, unsigned bits, const uint8_t *codes,
                                        const float *scales, int device, kv_score_err *err);

/** @brief Free what kv_score_cuda_upload allocated and zero the view. NULL, a zeroed or a
 * wrapped view: only zeroed. */
void kv_score_cuda_view_free(kv_score_cuda_view *v);

/**
 * @brief Scores of tokens [first, first + n) of a device view into out[0..n) (host memory), as
 * kv_score_tokens() computes them.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (NULL, range outside the view, head_dim mismatch, a
 * view not made by upload or wrap), KV_SCORE_ENOMEM, KV_SCORE_EUNSUPPORTED (see ERRORS).
 */
kv_score_status kv_score_cuda_tokens(const kv_score_query *q, const kv_score_cuda_view *v,
                                     uint32_t first, uint32_t n, const kv_score_cuda_opts *opts,
                                     float *out, kv_score_err *err);

/**
 * @brief The top k tokens of the spans (all on one device) by score against q, selected on the
 * device; out_pos / out_scores (host memory, either may be NULL but not both) receive k entries
 * in ORDER, equal to what kv_score_topk() returns for host views of the same bytes. *n_out (if
 * not NULL) receives k.
 * @return KV_SCORE_OK, KV_SCORE_EINVAL (q/spans/outputs NULL, k = 0, k > total tokens, a span
 * outside its view, a head_dim differing from q's, spans on different devices, total > 2^32 - 1,
 * positions past 2^32), KV_SCORE_ENOMEM, KV_SCORE_EUNSUPPORTED (see ERRORS).
 */
kv_score_status kv_score_cuda_topk(const kv_score_query *q, const kv_score_cuda_span *spans,
                                   size_t n_spans, uint32_t k, const kv_score_cuda_opts *opts,
                                   uint32_t *out_pos, float *out_scores, uint32_t *n_out,
                                   kv_score_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Host emulation of the device algorithm (see HOST EMULATION)                                 */

/** @brief kv_score_cuda_tokens' device code, run on the CPU over a host view. Same errors
 * (less the device ones). */
kv_score_status kv_score_cuda_emu_tokens(const kv_score_query *q, const kv_score_view *v,
                                         uint32_t first, uint32_t n, float *out,
                                         kv_score_err *err);

/** @brief kv_score_cuda_topk's device code and driver, run on the CPU over host spans (it holds
 * the 8-byte entry of every token, as the device does). Same errors (less the device ones). */
kv_score_status kv_score_cuda_emu_topk(const kv_score_query *q, const kv_score_span *spans,
                                       size_t n_spans, uint32_t k, uint32_t *out_pos,
                                       float *out_scores, uint32_t *n_out, kv_score_err *err);

#ifdef __cplusplus
}
#endif

#endif /* KV_SCORE_CUDA_H */
