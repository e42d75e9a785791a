/* SPDX-License-Identifier: MIT */
/*
 * gpu/kvdb_gpu.h — kvdb gets into and puts from GPU memory (libkvgpu, optional: built with
 * CUDA when nvcc is found, -Dcuda). The second hop of TierKV's two-hop pipeline (seed 003
 * §3.5): SSD -> DRAM is kvdb_get's (or kvdb_prefetch's) reading, DRAM -> GPU is this.
 *
 * A get (kvdb_gpu_get) runs kvdb_get_lend. From a database ATTACHED to the kvdb_gpu
 * (kvdb_gpu_attach: its DRAM tier page-locked) each block the DRAM tier holds is lent and copied
 * to the device straight from the tier — one copy of its data region into a device scratch
 * buffer, then a kernel that rearranges it into the destination's layout, on two streams in
 * turn — so no host thread copies it. Every other block (read from a disk tier, or from a
 * database not attached) lands in a pinned host staging buffer (page-locked, kept by the kvdb_gpu
 * object and grown to the largest get), whose copy to the device is queued as it lands
 * (cudaMemcpy2DAsync), so the copy of block i overlaps the read of block i + 1. The call returns
 * once every copy has completed (and every lent block is given back). A put (kvdb_gpu_put) copies the device buffer into the staging buffer in
 * block-sized pieces on the two streams, waits, then kvdb_put's from there.
 *
 * Device buffers are packed layouts (kvdb_layout), n tokens, as kvdb_kv_view_packed describes
 * them for host memory: n * kvdb_model_token_bytes(m) bytes. Every call's errors are a
 * kvdb_status and a message for the calling thread (kvdb_gpu_errmsg; kvdb's own failures keep
 * kvdb_errmsg's). One kvdb_gpu is used by one thread at a time.
 */
#ifndef KVDB_GPU_H
#define KVDB_GPU_H

#include "kvdb.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvdb_gpu kvdb_gpu;

/**
 * Open CUDA device `device` (0-based) for gets and puts. @return KVDB_OK; KVDB_UNSUPPORTED (this
 * build has no CUDA, or no usable driver or device: the message says which); KVDB_NOMEM.
 */
kvdb_status kvdb_gpu_open(int device, kvdb_gpu **out);
/** Detach every database, free the staging and scratch buffers and the streams. NULL is a
 * no-op. */
void kvdb_gpu_close(kvdb_gpu *g);
/** The message of this thread's last failed kvdb_gpu call (kvdb_errmsg when kvdb failed). */
const char *kvdb_gpu_errmsg(void);
/** The backend's name ("cuda", or a test's). */
const char *kvdb_gpu_name(const kvdb_gpu *g);

/**
 * Attach `db`: page-lock its DRAM tier (kvdb_dram_memory; cudaHostRegister of the whole tier,
 * which commits and locks all of options.dram_bytes of host memory) so that kvdb_gpu_get copies
 * the blocks it holds to the device without a host copy (LMCache keeps its CPU tier pinned for
 * the same reason). Attaching twice is a no-op. Detach (or close g) before kvdb_close(db).
 * @return KVDB_OK; KVDB_UNSUPPORTED when db has no DRAM tier; KVDB_IOERR when the memory cannot
 * be page-locked (the message names the call; RLIMIT_MEMLOCK is the usual cause); KVDB_NOMEM
 * past 8 attached databases; KVDB_INVALID for NULL.
 */
kvdb_status kvdb_gpu_attach(kvdb_gpu *g, kvdb *db);
/** Undo kvdb_gpu_attach (unlock the tier's memory); a database not attached is a no-op. */
void kvdb_gpu_detach(kvdb_gpu *g, kvdb *db);

/**
 * kvdb_get of tokens[0..n) into device memory `dev` (layout, room for n tokens): positions
 * [0, *hit_tokens) receive the hit's KV; the rest is unspecified as kvdb_get's (untouched
 * unless a retried read ended sooner: kvdb_get_notify). Returns as kvdb_get, and
 * KVDB_IOERR for a failed CUDA call (the message names it and its error), KVDB_NOMEM when the
 * staging buffer cannot grow, KVDB_INVALID for NULL arguments or a bad layout.
 */
kvdb_status kvdb_gpu_get(kvdb_gpu *g, kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                         size_t n, void *dev, kvdb_layout layout, size_t *hit_tokens);

/** kvdb_put of tokens[0..n) whose KV is in device memory `dev` (layout). Returns as kvdb_put,
 * and KVDB_IOERR, KVDB_NOMEM, KVDB_INVALID as kvdb_gpu_get. */
kvdb_status kvdb_gpu_put(kvdb_gpu *g, kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                         size_t n, const void *dev, kvdb_layout layout, kvdb_put_info *info);

/* Device and pinned memory, and plain copies, for callers that have no CUDA headers (tests,
 * kvdb-bench). Each returns KVDB_OK, KVDB_NOMEM or KVDB_IOERR. */
kvdb_status kvdb_gpu_alloc(kvdb_gpu *g, size_t bytes, void **dev);
void kvdb_gpu_free(kvdb_gpu *g, void *dev);
kvdb_status kvdb_gpu_host_alloc(kvdb_gpu *g, size_t bytes, void **host); /* pinned */
void kvdb_gpu_host_free(kvdb_gpu *g, void *host);
/** Copy `bytes` host -> device (to_device 1) or device -> host (0), synchronously. */
kvdb_status kvdb_gpu_copy(kvdb_gpu *g, void *dst, const void *src, size_t bytes, int to_device);

#ifdef __cplusplus
}
#endif
#endif
