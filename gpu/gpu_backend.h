/* SPDX-License-Identifier: MIT */
/*
 * gpu/gpu_backend.h — what gpu.c asks of a device (private to gpu/ and its tests): the CUDA
 * backend (gpu_cuda.cu), or a test's host emulation. Every function returns 0 or -1 with the
 * failure's text in the backend's err (which call, which error).
 */
#ifndef KV_GPU_BACKEND_H
#define KV_GPU_BACKEND_H

#include <stddef.h>

#include "kvdb_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_GPU_STREAMS 2

/* Tokens [0, n_tokens) of a block's data region (kvdb_lent_block's layout) into positions
 * [t0, t0 + n_tokens) of a packed buffer of n tokens in `layout`. */
typedef struct kv_gpu_scatter {
  uint32_t n_sections, n_kv_heads, group_tokens, row_bytes, group_stride, n_tokens;
  uint64_t section_bytes;
  uint64_t n, t0;
  int layout; /* kvdb_layout */
} kv_gpu_scatter;
/* The scatter on the host: the definition the device's kernel follows. */
void kv_gpu_scatter_ref(void *dst, const void *src, const kv_gpu_scatter *a);

typedef struct kv_gpu_backend {
  const char *name;
  void *self;
  char err[256];
  int (*host_alloc)(struct kv_gpu_backend *b, size_t bytes, void **p); /* pinned */
  void (*host_free)(struct kv_gpu_backend *b, void *p);
  int (*dev_alloc)(struct kv_gpu_backend *b, size_t bytes, void **p);
  void (*dev_free)(struct kv_gpu_backend *b, void *p);
  /* Queue a copy of `height` rows of `width` bytes, row r from src + r * pitch to
   * dst + r * pitch, on stream s (0 .. KV_GPU_STREAMS - 1); to_device 1: host -> device. */
  int (*copy2d)(struct kv_gpu_backend *b, int s, void *dst, const void *src, size_t pitch,
                size_t width, size_t height, int to_device);
  /* Page-lock [p, p + bytes) of host memory for DMA (cudaHostRegister) / undo it. */
  int (*host_register)(struct kv_gpu_backend *b, void *p, size_t bytes);
  void (*host_unregister)(struct kv_gpu_backend *b, void *p);
  /* Queue on stream s the rearrangement of a block's data region `src` (device memory, a copy
   * of the block's region) into the packed buffer `dst` (device memory) as `a` says
   * (kv_gpu_scatter_ref is its definition). */
  int (*scatter)(struct kv_gpu_backend *b, int s, void *dst, const void *src,
                 const kv_gpu_scatter *a);
  /* Wait until everything queued on stream s has completed. */
  int (*sync)(struct kv_gpu_backend *b, int s);
  void (*destroy)(struct kv_gpu_backend *b);
} kv_gpu_backend;

/* A kvdb_gpu over backend b (which it destroys at close). KVDB_NOMEM. */
kvdb_status kv_gpu_wrap(kv_gpu_backend *b, kvdb_gpu **out);
/* Set this thread's kvdb_gpu_errmsg; returns rc. */
kvdb_status kv_gpu_fail(kvdb_status rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The copy of tokens [t0, t0 + c) of a packed buffer of n tokens: `height` rows of `width`
 * bytes at offset `off`, one every `pitch` bytes (the same in host and device buffers). */
typedef struct kv_gpu_plan {
  size_t off, width, height, pitch;
} kv_gpu_plan;
/* -1 for a bad layout. */
int kv_gpu_plan_range(const kvdb_model *m, kvdb_layout layout, size_t n, size_t t0, size_t c,
                      kv_gpu_plan *out);

#ifdef __cplusplus
}
#endif
#endif
