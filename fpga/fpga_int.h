/* SPDX-License-Identifier: MIT */
/*
 * fpga/fpga_int.h — private to fpga/: the device and buffer objects and the backend table.
 * device.h is the header of fpga/ for everything above it.
 *
 * The files of fpga/, lowest first, each calling only files below it:
 *   kernel/       the HLS kernels (score, select, gather), plain C11
 *   fpga_base.c   status and errors, the XRT environment check, the kernel's scalar arguments
 *   xrt.c         the XRT backend (dlopen of libxrt_coreutil): its kv_fpga_ops
 *   device.c      the seam: opening (backend choice, then the xclbin), the buffer / P2P / run
 *                 API over dev->ops, and the emulated backend
 *   app.c, hie.c  APP's split (fpga_base.c only) and HIE's top k (through the device API)
 */
#ifndef KV_FPGA_INT_H
#define KV_FPGA_INT_H

#include "device.h"
#include "kernel/gather_kernel.h"
#include "kernel/score_kernel.h"
#include "kernel/select_kernel.h"

struct kv_fpga_buf {
  kv_fpga_dev *dev;
  size_t size;    /* bytes (a multiple of 4096) */
  unsigned flags; /* KV_FPGA_BUF_* */
  uint8_t *host;  /* emulated: the memory; XRT: xrtBOMap() of the BO */
  void *bo;       /* XRT: xrtBufferHandle */
};

struct kv_fpga_run {
  kv_fpga_dev *dev;
  void *handle; /* XRT: xrtRunHandle */
  void *sub;    /* XRT: the sub-buffer of blocks at blocks_off (freed after the wait) */
};

typedef struct kv_fpga_ops {
  kv_fpga_status (*load_kernel)(kv_fpga_dev *dev, const char *xclbin, const char *name,
                                kv_fpga_err *err);
  kv_fpga_status (*buf_alloc)(kv_fpga_dev *dev, kv_fpga_buf *b, kv_fpga_err *err);
  void (*buf_free)(kv_fpga_buf *b);
  kv_fpga_status (*buf_write)(kv_fpga_buf *b, size_t off, const void *src, size_t len,
                              kv_fpga_err *err);
  kv_fpga_status (*buf_read)(kv_fpga_buf *b, size_t off, void *dst, size_t len, kv_fpga_err *err);
  kv_fpga_status (*run_start)(kv_fpga_dev *dev, const kv_fpga_run_args *a, kv_fpga_run *run,
                              kv_fpga_err *err);
  kv_fpga_status (*run_wait)(kv_fpga_run *run, kv_fpga_err *err);
  /* rows of a checked gather (device.c wrote a->row_off to a->desc); sets *verified */
  kv_fpga_status (*gather)(kv_fpga_dev *dev, const kv_fpga_gather_args *a, int *verified,
                           kv_fpga_err *err);
  /* a checked selection (device.c wrote the segments to a->desc) */
  kv_fpga_status (*select)(kv_fpga_dev *dev, const kv_fpga_select_args *a, kv_fpga_err *err);
  void (*close)(kv_fpga_dev *dev);
} kv_fpga_ops;

struct kv_fpga_dev {
  kv_fpga_backend backend;
  const kv_fpga_ops *ops;
  int kernel_loaded;
  char kernel_name[128];
  void *impl; /* backend state */
  kv_fpga_buf *hie_sect; /* hie.c: the section slots' P2P buffer, kept for the next job (its
                            allocation, zeroed, cost more than the reads); freed at close */
  struct kv_hie_pool *hie_pool; /* hie.c: the section reader threads, started at the first job,
                                   waiting between jobs; joined at close by hie_pool_free */
  void (*hie_pool_free)(struct kv_hie_pool *); /* set by hie.c with hie_pool (a call up the
                                                  floors would be a cycle: device.c <- hie.c) */
};

kv_fpga_status kv_fpga_fail_at(kv_fpga_err *err, kv_fpga_status code, const char *what,
                               uint64_t value, uint64_t limit, int sys_errno, const char *file,
                               int line);
#define KV_FPGA_FAIL(err, code, what, value, limit)                                               \
  kv_fpga_fail_at((err), (code), (what), (uint64_t)(value), (uint64_t)(limit), 0, __FILE__,       \
                  __LINE__)
#define KV_FPGA_FAIL_ERRNO(err, code, what, value, limit, e)                                      \
  kv_fpga_fail_at((err), (code), (what), (uint64_t)(value), (uint64_t)(limit), (e), __FILE__,     \
                  __LINE__)

/* The kernel's scalar arguments of a checked run (fpga_base.c). */
typedef struct kv_fpga_kargs {
  uint32_t scale_word, code_word, t0, n, pos_base, row_bytes, bits, k;
} kv_fpga_kargs;
void kv_fpga_kargs_of(const kv_fpga_run_args *a, kv_fpga_kargs *out);

/* emu_kernel.c: kv_score_kernel's function for the CPU (same arguments, same outputs bit for
 * bit), what the emulated device runs unless KVDB_FPGA_EMU_KERNEL=hls. */
void kv_score_kernel_emu(const kvk_word *keys, const kvk_word *meta, const kvk_word *query,
                         kvk_pair *blocks, kvk_pair *topk, uint32_t scale_word, uint32_t code_word,
                         uint32_t t0, uint32_t n, uint32_t pos_base, uint32_t row_bytes,
                         uint32_t bits, uint32_t k);

/* xrt.c: open the XRT backend into dev (env checks, dlopen, device); kv_fpga_open() then loads
 * the xclbin, if one is named, through dev->ops. */
kv_fpga_status kv_fpga_xrt_open(kv_fpga_dev *dev, const kv_fpga_opts *o, kv_fpga_err *err);

#endif
