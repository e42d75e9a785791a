/* SPDX-License-Identifier: MIT */
/*
 * gpu/gpu_cuda.cu — the CUDA backend of gpu.c (gpu_backend.h) and kvdb_gpu_open: pinned
 * memory (cudaHostAlloc) and page-locked ranges (cudaHostRegister), device memory (cudaMalloc),
 * copies on KV_GPU_STREAMS non-blocking streams (cudaMemcpy2DAsync; cudaMemcpyAsync row by row
 * where a pitch exceeds the device's cudaDevAttrMaxPitch), and one kernel, the scatter of a
 * block's data region into a packed layout (kv_gpu_scatter_ref's definition, in words of 16, 4
 * or 1 bytes as the sizes and addresses allow). Every CUDA call's error is checked and
 * reported with the call's name and cudaGetErrorName; the sticky-free error state is cleared.
 * Every call first makes the backend's device current (the calling thread may have another).
 */
#include "gpu_backend.h"

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_be {
  kv_gpu_backend b;
  int device;
  size_t max_pitch;
  cudaStream_t st[KV_GPU_STREAMS];
  int n_streams; /* created so far */
} cuda_be;

static int cfail(kv_gpu_backend *b, const char *call, cudaError_t e)
{
  (void)cudaGetLastError(); /* clear a non-sticky error for the next call */
  snprintf(b->err, sizeof b->err, "%s failed: %s (%s)", call, cudaGetErrorName(e),
           cudaGetErrorString(e));
  return -1;
}

#define CK(b, call)                                                                                \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess)                                                                         \
      return cfail((b), #call, e_);                                                                \
  } while (0)

static int cur(kv_gpu_backend *b)
{
  CK(b, cudaSetDevice(((cuda_be *)b)->device));
  return 0;
}

static int c_host_alloc(kv_gpu_backend *b, size_t bytes, void **p)
{
  *p = NULL;
  if (cur(b) != 0)
    return -1;
  CK(b, cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocPortable));
  return 0;
}

static void c_host_free(kv_gpu_backend *b, void *p)
{
  (void)b;
  if (p != NULL && cudaFreeHost(p) != cudaSuccess)
    (void)cudaGetLastError();
}

static int c_dev_alloc(kv_gpu_backend *b, size_t bytes, void **p)
{
  *p = NULL;
  if (cur(b) != 0)
    return -1;
  CK(b, cudaMalloc(p, bytes ? bytes : 1));
  return 0;
}

static void c_dev_free(kv_gpu_backend *b, void *p)
{
  if (p != NULL && (cur(b) != 0 || cudaFree(p) != cudaSuccess))
    (void)cudaGetLastError();
}

static int c_copy2d(kv_gpu_backend *b, int s, void *dst, const void *src, size_t pitch,
                    size_t width, size_t height, int to_device)
{
  cuda_be *c = (cuda_be *)b;
  if (s < 0 || s >= c->n_streams) {
    snprintf(b->err, sizeof b->err, "stream %d of %d", s, c->n_streams);
    return -1;
  }
  if (cur(b) != 0)
    return -1;
  cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  if (height == 1) {
    CK(b, cudaMemcpyAsync(dst, src, width, kind, c->st[s]));
    return 0;
  }
  if (pitch <= c->max_pitch) {
    CK(b, cudaMemcpy2DAsync(dst, pitch, src, pitch, width, height, kind, c->st[s]));
    return 0;
  }
  for (size_t r = 0; r < height; r++)
    CK(b, cudaMemcpyAsync((char *)dst + r * pitch, (const char *)src + r * pitch, width, kind,
                          c->st[s]));
  return 0;
}

static int c_host_register(kv_gpu_backend *b, void *p, size_t bytes)
{
  if (cur(b) != 0)
    return -1;
  CK(b, cudaHostRegister(p, bytes, cudaHostRegisterPortable));
  return 0;
}

static void c_host_unregister(kv_gpu_backend *b, void *p)
{
  if (cur(b) != 0 || cudaHostUnregister(p) != cudaSuccess)
    (void)cudaGetLastError();
}

/* One grid row (blockIdx.y, strided) per section; its n_tokens x row words spread over the
 * grid's columns. Word W: 16 (uint4), 4 (uint32_t) or 1 byte. */
template <typename W>
__global__ void scatter_k(char *dst, const char *src, kv_gpu_scatter a)
{
  const uint32_t wpr = a.row_bytes / (uint32_t)sizeof(W); /* words per row */
  const uint64_t total = (uint64_t)a.n_tokens * wpr;
  for (uint32_t s = blockIdx.y; s < a.n_sections; s += gridDim.y) {
    uint32_t nh = a.n_kv_heads, l = s / (2u * nh), h = (s / 2u) % nh, kv = s & 1u;
    uint64_t plane = (uint64_t)l * 2u + kv;
    const char *sec = src + s * a.section_bytes;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
      uint32_t t = (uint32_t)(i / wpr), w = (uint32_t)(i % wpr);
      const char *from = sec + (uint64_t)(t / a.group_tokens) * a.group_stride +
                         (uint64_t)(t % a.group_tokens) * a.row_bytes;
      uint64_t tok = a.t0 + t;
      uint64_t row = a.layout == KVDB_LAYOUT_LKTHD ? (plane * a.n + tok) * nh + h
                                                   : (plane * nh + h) * a.n + tok;
      ((W *)(dst + row * a.row_bytes))[w] = ((const W *)from)[w];
    }
  }
}

static int c_scatter(kv_gpu_backend *b, int s, void *dst, const void *src,
                     const kv_gpu_scatter *a)
{
  cuda_be *c = (cuda_be *)b;
  if (s < 0 || s >= c->n_streams) {
    snprintf(b->err, sizeof b->err, "stream %d of %d", s, c->n_streams);
    return -1;
  }
  if (a->n_tokens == 0 || a->n_sections == 0)
    return 0;
  if (cur(b) != 0)
    return -1;
  uint64_t al = (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src | a->row_bytes |
                a->group_stride | a->section_bytes;
  size_t word = al % 16 == 0 ? 16 : al % 4 == 0 ? 4 : 1;
  uint64_t words = (uint64_t)a->n_tokens * (a->row_bytes / word);
  unsigned threads = 256;
  uint64_t cols = (words + threads - 1) / threads;
  dim3 grid((unsigned)(cols < 8 ? cols : 8), a->n_sections < 65535 ? a->n_sections : 65535);
  if (word == 16)
    scatter_k<uint4><<<grid, threads, 0, c->st[s]>>>((char *)dst, (const char *)src, *a);
  else if (word == 4)
    scatter_k<uint32_t><<<grid, threads, 0, c->st[s]>>>((char *)dst, (const char *)src, *a);
  else
    scatter_k<unsigned char><<<grid, threads, 0, c->st[s]>>>((char *)dst, (const char *)src, *a);
  CK(b, cudaGetLastError());
  return 0;
}

static int c_sync(kv_gpu_backend *b, int s)
{
  cuda_be *c = (cuda_be *)b;
  if (s < 0 || s >= c->n_streams) {
    snprintf(b->err, sizeof b->err, "stream %d of %d", s, c->n_streams);
    return -1;
  }
  if (cur(b) != 0)
    return -1;
  CK(b, cudaStreamSynchronize(c->st[s]));
  return 0;
}

static void c_destroy(kv_gpu_backend *b)
{
  cuda_be *c = (cuda_be *)b;
  if (cudaSetDevice(c->device) == cudaSuccess)
    for (int s = 0; s < c->n_streams; s++)
      if (cudaStreamSynchronize(c->st[s]) != cudaSuccess ||
          cudaStreamDestroy(c->st[s]) != cudaSuccess)
        (void)cudaGetLastError();
  free(c);
}

extern "C" kvdb_status kvdb_gpu_open(int device, kvdb_gpu **out)
{
  if (out == NULL)
    return kv_gpu_fail(KVDB_INVALID, "out is NULL");
  *out = NULL;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kv_gpu_fail(KVDB_UNSUPPORTED, "no usable CUDA driver or device: cudaGetDeviceCount: "
                       "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  if (count == 0)
    return kv_gpu_fail(KVDB_UNSUPPORTED, "no CUDA device: cudaGetDeviceCount found none");
  if (device < 0 || device >= count)
    return kv_gpu_fail(KVDB_INVALID, "device %d: %d CUDA device(s) (0..%d)", device, count,
                       count - 1);
  cuda_be *c = (cuda_be *)calloc(1, sizeof *c);
  if (c == NULL)
    return kv_gpu_fail(KVDB_NOMEM, "CUDA backend");
  kv_gpu_backend *b = &c->b;
  b->name = "cuda";
  b->self = c;
  b->host_alloc = c_host_alloc;
  b->host_free = c_host_free;
  b->dev_alloc = c_dev_alloc;
  b->dev_free = c_dev_free;
  b->copy2d = c_copy2d;
  b->host_register = c_host_register;
  b->host_unregister = c_host_unregister;
  b->scatter = c_scatter;
  b->sync = c_sync;
  b->destroy = c_destroy;
  c->device = device;
  int mp = 0;
  int fail = cur(b) != 0;
  if (!fail && (e = cudaDeviceGetAttribute(&mp, cudaDevAttrMaxPitch, device)) != cudaSuccess)
    fail = cfail(b, "cudaDeviceGetAttribute(cudaDevAttrMaxPitch)", e) != 0;
  c->max_pitch = mp > 0 ? (size_t)mp : 0;
  for (int s = 0; !fail && s < KV_GPU_STREAMS; s++) {
    if ((e = cudaStreamCreateWithFlags(&c->st[s], cudaStreamNonBlocking)) != cudaSuccess)
      fail = cfail(b, "cudaStreamCreateWithFlags", e) != 0;
    else
      c->n_streams++;
  }
  if (fail) {
    kvdb_status rc = kv_gpu_fail(KVDB_UNSUPPORTED, "CUDA device %d: %s", device, b->err);
    c_destroy(b);
    return rc;
  }
  return kv_gpu_wrap(b, out);
}
