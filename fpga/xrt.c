/* SPDX-License-Identifier: MIT */
/*
 * fpga/xrt.c — the XRT backend of fpga/device.h over XRT's native C API (Debian's libxrt-dev
 * 2.13: xrt/xrt_device.h, xrt/xrt_bo.h, xrt/xrt_kernel.h), loaded at run time with dlopen.
 *
 * Why dlopen (../shared/design/HARDWARE.md §1): linking libxrt_coreutil would make every user of
 * libkvdb load boost, protobuf, curl and libstdc++, and XRT ABORTS the process on the first
 * xrtDeviceOpen() when XILINX_XRT is unset or has no lib/libxrt_core.so.2. So nothing here runs
 * before kv_fpga_xrt_env_ok() says the environment is real, and the library is then opened by
 * path. The prototypes still come from the real headers: each pointer is declared with
 * __typeof__ of the XRT function, so a signature change in XRT is a compile error here.
 *
 * P2P (Xilinx XRT p2p.rst; Vitis_Accel_Examples host_xrt/p2p_simple_xrt): key buffers are
 * xrtBOAlloc(dev, size, XRT_BO_FLAGS_P2P, xrtKernelArgGroupId(kernel, 0)) and mapped with
 * xrtBOMap(); kv_fpga_p2p_read() preads the O_DIRECT file straight into that mapping (NVMe DMA
 * into FPGA DDR through the P2P BAR), and the P2P buffer is never synced or touched by the CPU.
 * Query and result buffers are normal BOs in the bank of their kernel argument, synced
 * TO_DEVICE after a write and FROM_DEVICE before a read.
 *
 * Built only when the XRT headers are found (meson: KV_FPGA_HAVE_XRT_HEADERS); otherwise the
 * backend reports KV_FPGA_EUNSUPPORTED.
 */
#define _GNU_SOURCE
#include "fpga_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef KV_FPGA_HAVE_XRT_HEADERS

kv_fpga_status kv_fpga_xrt_open(kv_fpga_dev *dev, const kv_fpga_opts *o, kv_fpga_err *err)
{
  (void)dev;
  (void)o;
  return KV_FPGA_FAIL(err, KV_FPGA_EUNSUPPORTED,
                      "built without the XRT headers (install libxrt-dev and reconfigure)", 0, 0);
}

#else

#include <dlfcn.h>
#include <pthread.h>

#include <xrt/xrt_bo.h>
#include <xrt/xrt_device.h>
#include <xrt/xrt_kernel.h>

/* The XRT functions this backend calls, typed from XRT's own declarations. */
#define XRT_FUNCS(X)                                                                               \
  X(xrtDeviceOpen)                                                                                 \
  X(xrtDeviceClose)                                                                                \
  X(xrtDeviceLoadXclbinFile)                                                                       \
  X(xrtDeviceGetXclbinUUID)                                                                        \
  X(xrtPLKernelOpen)                                                                               \
  X(xrtKernelClose)                                                                                \
  X(xrtKernelArgGroupId)                                                                           \
  X(xrtBOAlloc)                                                                                    \
  X(xrtBOFree)                                                                                     \
  X(xrtBOSubAlloc)                                                                                 \
  X(xrtBOMap)                                                                                      \
  X(xrtBOSync)                                                                                     \
  X(xrtRunOpen)                                                                                    \
  X(xrtRunSetArg)                                                                                  \
  X(xrtRunStart)                                                                                   \
  X(xrtRunWait)                                                                                    \
  X(xrtRunClose)

typedef struct xrt_api {
#define X(name) __typeof__(name) *name;
  XRT_FUNCS(X)
#undef X
} xrt_api;

/* Kernel argument indices (fpga/kernel/score_kernel.h). */
enum { ARG_KEYS = 0, ARG_META, ARG_QUERY, ARG_BLOCKS, ARG_TOPK, ARG_SCALE_WORD, ARG_CODE_WORD,
       ARG_T0, ARG_N, ARG_POS_BASE, ARG_ROW_BYTES, ARG_BITS, ARG_K };

/* kv_gather_kernel and kv_select_kernel have the same argument shape: three buffers (source,
 * descriptors, output), then two unsigned ints (gather_kernel.h, select_kernel.h). */
enum { XARG_SRC = 0, XARG_DESC, XARG_DST, XARG_N, XARG_M };
enum { XK_GATHER = 0, XK_SELECT = 1 };
static const char *const xk_name[2] = {"kv_gather_kernel", "kv_select_kernel"};

typedef struct xrt_state {
  void *lib;
  xrt_api api;
  xrtDeviceHandle dev;
  xrtKernelHandle kernel;
  xrtKernelHandle extra[2]; /* XK_*: kernels of the same xclbin, opened at their first use */
  int extra_missing[2];     /* the xclbin has no such kernel */
  xuid_t uuid;              /* of the loaded xclbin */
} xrt_state;

#define FAIL KV_FPGA_FAIL

/* One library handle per process: XRT does not survive dlclose, so it is never closed. */
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
static void *lib_handle;
static char lib_path_loaded[4096];

static kv_fpga_status load_library(const kv_fpga_opts *o, xrt_state *x, kv_fpga_err *err)
{
  char path[4096];
  const char *p = o->xrt_library;
  if (p == NULL || p[0] == 0)
    p = getenv("KVDB_XRT_LIBRARY");
  if (p == NULL || p[0] == 0) {
    struct stat st;
    int n = snprintf(path, sizeof path, "%s/lib/libxrt_coreutil.so.2", getenv("XILINX_XRT"));
    p = (n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0) ? path : "libxrt_coreutil.so.2";
  }
  pthread_mutex_lock(&lib_lock);
  if (lib_handle != NULL && strcmp(lib_path_loaded, p) != 0) {
    pthread_mutex_unlock(&lib_lock);
    return FAIL(err, KV_FPGA_EINVAL, "another XRT library is already loaded in this process", 0, 0);
  }
  if (lib_handle == NULL) {
    lib_handle = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (lib_handle != NULL)
      snprintf(lib_path_loaded, sizeof lib_path_loaded, "%s", p);
  }
  x->lib = lib_handle;
  pthread_mutex_unlock(&lib_lock);
  if (x->lib == NULL)
    return FAIL(err, KV_FPGA_ENODEV, "cannot dlopen the XRT library libxrt_coreutil.so.2 (set "
                                     "KVDB_XRT_LIBRARY or XILINX_XRT)", 0, 0);
#define X(name)                                                                                    \
  *(void **)(&x->api.name) = dlsym(x->lib, #name);                                                 \
  if (x->api.name == NULL)                                                                         \
    return FAIL(err, KV_FPGA_ENODEV, "the XRT library lacks " #name, 0, 0);
  XRT_FUNCS(X)
#undef X
  return KV_FPGA_OK;
}

static kv_fpga_status xrt_load_kernel(kv_fpga_dev *dev, const char *xclbin, const char *name,
                                      kv_fpga_err *err)
{
  xrt_state *x = dev->impl;
  if (x->kernel != NULL) {
    x->api.xrtKernelClose(x->kernel);
    x->kernel = NULL;
  }
  for (int i = 0; i < 2; i++) {
    if (x->extra[i] != NULL)
      x->api.xrtKernelClose(x->extra[i]);
    x->extra[i] = NULL;
    x->extra_missing[i] = 0;
  }
  int rc = x->api.xrtDeviceLoadXclbinFile(x->dev, xclbin);
  if (rc != 0)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtDeviceLoadXclbinFile failed (value: its return)",
                (uint64_t)(int64_t)rc, 0);
  xuid_t uuid;
  memset(uuid, 0, sizeof(xuid_t));
  rc = x->api.xrtDeviceGetXclbinUUID(x->dev, uuid);
  if (rc != 0)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtDeviceGetXclbinUUID failed (value: its return)",
                (uint64_t)(int64_t)rc, 0);
  memcpy(x->uuid, uuid, sizeof(xuid_t));
  x->kernel = x->api.xrtPLKernelOpen(x->dev, uuid, name);
  if (x->kernel == NULL)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtPLKernelOpen found no such kernel in the xclbin", 0, 0);
  return KV_FPGA_OK;
}

static kv_fpga_status xrt_buf_alloc(kv_fpga_dev *dev, kv_fpga_buf *b, kv_fpga_err *err)
{
  xrt_state *x = dev->impl;
  int arg = (b->flags & KV_FPGA_BUF_P2P) ? ARG_KEYS : (b->flags & KV_FPGA_BUF_IN) ? ARG_QUERY
                                                                                  : ARG_BLOCKS;
  int grp = x->api.xrtKernelArgGroupId(x->kernel, arg);
  if (grp < 0)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtKernelArgGroupId failed (value: argument)", arg, 0);
  xrtBufferFlags fl = (b->flags & KV_FPGA_BUF_P2P) ? XRT_BO_FLAGS_P2P : XRT_BO_FLAGS_NONE;
  xrtBufferHandle bo = x->api.xrtBOAlloc(x->dev, b->size, fl, (xrtMemoryGroup)grp);
  if (bo == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, (b->flags & KV_FPGA_BUF_P2P)
                                         ? "xrtBOAlloc of a P2P buffer failed (is P2P enabled: "
                                           "xbutil p2p --enable?)"
                                         : "xrtBOAlloc failed",
                b->size, 0);
  void *map = x->api.xrtBOMap(bo);
  if (map == NULL) {
    x->api.xrtBOFree(bo);
    return FAIL(err, KV_FPGA_EDEVICE, "xrtBOMap failed", b->size, 0);
  }
  b->bo = bo;
  b->host = map;
  return KV_FPGA_OK;
}

static void xrt_buf_free(kv_fpga_buf *b)
{
  xrt_state *x = b->dev->impl;
  x->api.xrtBOFree(b->bo);
}

static kv_fpga_status xrt_buf_write(kv_fpga_buf *b, size_t off, const void *src, size_t len,
                                    kv_fpga_err *err)
{
  xrt_state *x = b->dev->impl;
  memcpy(b->host + off, src, len);
  int rc = x->api.xrtBOSync(b->bo, XCL_BO_SYNC_BO_TO_DEVICE, len, off);
  if (rc != 0)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtBOSync to the device failed (value: its return)",
                (uint64_t)(int64_t)rc, 0);
  return KV_FPGA_OK;
}

static kv_fpga_status xrt_buf_read(kv_fpga_buf *b, size_t off, void *dst, size_t len,
                                   kv_fpga_err *err)
{
  xrt_state *x = b->dev->impl;
  int rc = x->api.xrtBOSync(b->bo, XCL_BO_SYNC_BO_FROM_DEVICE, len, off);
  if (rc != 0)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtBOSync from the device failed (value: its return)",
                (uint64_t)(int64_t)rc, 0);
  memcpy(dst, b->host + off, len);
  return KV_FPGA_OK;
}

static kv_fpga_status xrt_run_start(kv_fpga_dev *dev, const kv_fpga_run_args *a, kv_fpga_run *run,
                                    kv_fpga_err *err)
{
  xrt_state *x = dev->impl;
  kv_fpga_kargs k;
  kv_fpga_kargs_of(a, &k);
  /* blocks at an offset: a sub-buffer there (freed after the wait) */
  void *blocks = a->blocks->bo, *sub = NULL;
  if (a->blocks_off != 0) {
    sub = x->api.xrtBOSubAlloc(a->blocks->bo, (size_t)a->n * 8, a->blocks_off);
    if (sub == NULL)
      return FAIL(err, KV_FPGA_EDEVICE, "xrtBOSubAlloc of the score blocks failed (value: "
                                        "offset)", a->blocks_off, a->blocks->size);
    blocks = sub;
  }
  xrtRunHandle r = x->api.xrtRunOpen(x->kernel);
  if (r == NULL) {
    if (sub != NULL)
      x->api.xrtBOFree(sub);
    return FAIL(err, KV_FPGA_EDEVICE, "xrtRunOpen failed", 0, 0);
  }
  /* buffers go by handle, scalars as unsigned int (the varargs promotion of uint32_t) */
  void *topk = a->topk ? a->topk->bo : blocks; /* k = 0: never written */
  int bad = -1;
  bad = x->api.xrtRunSetArg(r, ARG_KEYS, a->sect->bo) ? ARG_KEYS : bad;
  bad = x->api.xrtRunSetArg(r, ARG_META, a->sect->bo) ? ARG_META : bad;
  bad = x->api.xrtRunSetArg(r, ARG_QUERY, a->query->bo) ? ARG_QUERY : bad;
  bad = x->api.xrtRunSetArg(r, ARG_BLOCKS, blocks) ? ARG_BLOCKS : bad;
  bad = x->api.xrtRunSetArg(r, ARG_TOPK, topk) ? ARG_TOPK : bad;
  const uint32_t sc[8] = {k.scale_word, k.code_word, k.t0, k.n, k.pos_base, k.row_bytes, k.bits, k.k};
  for (int i = 0; i < 8; i++)
    bad = x->api.xrtRunSetArg(r, ARG_SCALE_WORD + i, (unsigned)sc[i]) ? ARG_SCALE_WORD + i : bad;
  int rc = bad >= 0 ? -1 : x->api.xrtRunStart(r);
  if (rc != 0) {
    x->api.xrtRunClose(r);
    if (sub != NULL)
      x->api.xrtBOFree(sub);
    return bad >= 0 ? FAIL(err, KV_FPGA_EDEVICE, "xrtRunSetArg failed (value: argument index)",
                           bad, 0)
                    : FAIL(err, KV_FPGA_EDEVICE, "xrtRunStart failed (value: its return)",
                           (uint64_t)(int64_t)rc, 0);
  }
  run->handle = r;
  run->sub = sub;
  return KV_FPGA_OK;
}

static kv_fpga_status xrt_run_wait(kv_fpga_run *run, kv_fpga_err *err)
{
  xrt_state *x = run->dev->impl;
  enum ert_cmd_state st = x->api.xrtRunWait(run->handle);
  x->api.xrtRunClose(run->handle);
  if (run->sub != NULL)
    x->api.xrtBOFree(run->sub);
  if (st != ERT_CMD_STATE_COMPLETED)
    return FAIL(err, KV_FPGA_EDEVICE,
                "kernel run did not complete (value: ert_cmd_state, 4 = completed)", st,
                ERT_CMD_STATE_COMPLETED);
  return KV_FPGA_OK;
}

/*
 * The row gather (kv_fpga_gather) and the selection (kv_fpga_select): kv_gather_kernel /
 * kv_select_kernel of the loaded xclbin on the source buffer (the P2P buffer the pages were read
 * into, or the BO the score runs wrote their blocks to), the descriptors (synced TO_DEVICE by
 * kv_fpga_buf_write) and the output BO, which the caller then syncs FROM_DEVICE for just the
 * rows or the k pairs (a partial xrtBOSync range). Their buffer arguments must be connected to
 * the banks the buffers were allocated in (kv_score_kernel's keys / query / blocks banks: on the
 * SmartSSD's single DDR bank they are all DDR[0], fpga/README.md).
 */
static kv_fpga_status xrt_run3(kv_fpga_dev *dev, int which, void *bo0, void *bo1, void *bo2,
                               uint32_t n, uint32_t m, kv_fpga_err *err)
{
  xrt_state *x = dev->impl;
  if (x->extra[which] == NULL && !x->extra_missing[which]) {
    x->extra[which] = x->api.xrtPLKernelOpen(x->dev, x->uuid, xk_name[which]);
    x->extra_missing[which] = x->extra[which] == NULL;
  }
  if (x->extra[which] == NULL)
    return FAIL(err, KV_FPGA_EUNSUPPORTED, which == XK_GATHER
                                               ? "the xclbin has no kv_gather_kernel (link "
                                                 "gather_kernel.xo into it, fpga/README.md)"
                                               : "the xclbin has no kv_select_kernel (link "
                                                 "select_kernel.xo into it, fpga/README.md)",
                0, 0);
  xrtRunHandle r = x->api.xrtRunOpen(x->extra[which]);
  if (r == NULL)
    return FAIL(err, KV_FPGA_EDEVICE, "xrtRunOpen failed (gather or select kernel)", 0, 0);
  int bad = -1;
  bad = x->api.xrtRunSetArg(r, XARG_SRC, bo0) ? XARG_SRC : bad;
  bad = x->api.xrtRunSetArg(r, XARG_DESC, bo1) ? XARG_DESC : bad;
  bad = x->api.xrtRunSetArg(r, XARG_DST, bo2) ? XARG_DST : bad;
  bad = x->api.xrtRunSetArg(r, XARG_N, (unsigned)n) ? XARG_N : bad;
  bad = x->api.xrtRunSetArg(r, XARG_M, (unsigned)m) ? XARG_M : bad;
  if (bad >= 0) {
    x->api.xrtRunClose(r);
    return FAIL(err, KV_FPGA_EDEVICE, "xrtRunSetArg of the gather or select kernel failed "
                                      "(value: argument index)", bad, 0);
  }
  int rc = x->api.xrtRunStart(r);
  if (rc != 0) {
    x->api.xrtRunClose(r);
    return FAIL(err, KV_FPGA_EDEVICE, "xrtRunStart of the gather or select kernel failed (value: "
                                      "its return)", (uint64_t)(int64_t)rc, 0);
  }
  enum ert_cmd_state st = x->api.xrtRunWait(r);
  x->api.xrtRunClose(r);
  if (st != ERT_CMD_STATE_COMPLETED)
    return FAIL(err, KV_FPGA_EDEVICE, "the gather or select kernel did not complete (value: "
                                      "ert_cmd_state, 4 = completed)", st, ERT_CMD_STATE_COMPLETED);
  return KV_FPGA_OK;
}

/* No checksum unit in the gather kernel (gather_kernel.c): *verified = 0. */
static kv_fpga_status xrt_gather(kv_fpga_dev *dev, const kv_fpga_gather_args *a, int *verified,
                                 kv_fpga_err *err)
{
  *verified = 0;
  return xrt_run3(dev, XK_GATHER, a->src->bo, a->desc->bo, a->dst->bo, a->n_rows, a->row_bytes,
                  err);
}

static kv_fpga_status xrt_select(kv_fpga_dev *dev, const kv_fpga_select_args *a, kv_fpga_err *err)
{
  return xrt_run3(dev, XK_SELECT, a->in->bo, a->desc->bo, a->out->bo, a->n_segs, a->k, err);
}

static void xrt_close(kv_fpga_dev *dev)
{
  xrt_state *x = dev->impl;
  if (x == NULL)
    return;
  for (int i = 0; i < 2; i++)
    if (x->extra[i] != NULL)
      x->api.xrtKernelClose(x->extra[i]);
  if (x->kernel != NULL)
    x->api.xrtKernelClose(x->kernel);
  if (x->dev != NULL)
    x->api.xrtDeviceClose(x->dev);
  free(x);
  dev->impl = NULL;
}

static const kv_fpga_ops xrt_ops = {xrt_load_kernel, xrt_buf_alloc, xrt_buf_free,
                                    xrt_buf_write,   xrt_buf_read,  xrt_run_start,
                                    xrt_run_wait,    xrt_gather,    xrt_select,
                                    xrt_close};

kv_fpga_status kv_fpga_xrt_open(kv_fpga_dev *dev, const kv_fpga_opts *o, kv_fpga_err *err)
{
  const char *why = NULL;
  if (!kv_fpga_xrt_env_ok(&why))
    return FAIL(err, KV_FPGA_ENODEV, why, 0, 0);
  xrt_state *x = calloc(1, sizeof *x);
  if (x == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for the XRT state", sizeof *x, 0);
  dev->impl = x;
  dev->ops = &xrt_ops;
  kv_fpga_status rc = load_library(o, x, err);
  if (rc != KV_FPGA_OK)
    return rc;
  x->dev = x->api.xrtDeviceOpen(o->device_index);
  if (x->dev == NULL)
    return FAIL(err, KV_FPGA_ENODEV, "xrtDeviceOpen found no FPGA device (value: index)",
                o->device_index, 0);
  return KV_FPGA_OK; /* kv_fpga_open() loads o->xclbin_path next, through dev->ops */
}

#endif
