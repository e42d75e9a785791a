/* SPDX-License-Identifier: MIT */
/*
 * fpga/tests/fakexrt.c — a fake libxrt_coreutil for the XRT backend's tests, compiled against
 * Debian's real XRT headers (so every signature is XRT's). It implements the C functions
 * fpga/xrt.c calls, records each call in a log, and behaves like a device where it matters:
 *   - a normal BO has a host copy (what xrtBOMap returns) and a device copy; only xrtBOSync moves
 *     bytes between them, so a missing or misdirected sync changes the results;
 *   - a P2P BO's mapping IS device memory (pread lands there); syncing it is logged as a misuse;
 *   - xrtRunStart runs the real kernel (fpga/kernel/score_kernel.c) on the device copies with the
 *     arguments set by xrtRunSetArg (buffer handles for 0..4, unsigned ints for 5..12), or for
 *     kv_gather_kernel / kv_select_kernel the real gather / selection (fpga/kernel/
 *     gather_kernel.c, select_kernel.c: buffers 0..2, ints 3..4); sub-buffers share their
 *     parent's host and device memory;
 *   - faults on demand: fakexrt_fail("xrtBOAlloc", 3) makes the 3rd xrtBOAlloc from now fail,
 *     fakexrt_fail("xrtRunWait", 1) returns ERT_CMD_STATE_ERROR, "xrtDeviceOpen" returns NULL.
 * The test reads the log with fakexrt_log() (dlsym on the same library handle).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <xrt/xrt_bo.h>
#include <xrt/xrt_device.h>
#include <xrt/xrt_kernel.h>

#include "kernel/gather_kernel.h"
#include "kernel/score_kernel.h"
#include "kernel/select_kernel.h"

/* Test hooks (not XRT functions). */
const char *fakexrt_log(void);
void fakexrt_reset(void);
void fakexrt_fail(const char *fn, int nth);
int fakexrt_live_objects(void);

static char log_buf[1 << 20];
static size_t log_len;
static char fail_fn[64];
static int fail_nth;
static int live;

__attribute__((format(printf, 1, 2))) static void logf_(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(log_buf + log_len, sizeof log_buf - log_len, fmt, ap);
  va_end(ap);
  if (n > 0 && (size_t)n < sizeof log_buf - log_len)
    log_len += (size_t)n;
}

const char *fakexrt_log(void)
{
  return log_buf;
}
void fakexrt_reset(void)
{
  log_len = 0;
  log_buf[0] = 0;
  fail_fn[0] = 0;
  fail_nth = 0;
}
void fakexrt_fail(const char *fn, int nth)
{
  snprintf(fail_fn, sizeof fail_fn, "%s", fn);
  fail_nth = nth;
}
int fakexrt_live_objects(void)
{
  return live;
}

static int should_fail(const char *fn)
{
  if (fail_nth > 0 && strcmp(fn, fail_fn) == 0 && --fail_nth == 0) {
    logf_("FAULT %s\n", fn);
    return 1;
  }
  return 0;
}

typedef struct fdev {
  int magic;
  int xclbin_loaded;
} fdev;
typedef struct fkernel {
  int magic;
  fdev *d;
  int kind; /* 0 kv_score_kernel, 1 kv_gather_kernel, 2 kv_select_kernel */
} fkernel;
typedef struct fbo {
  int magic;
  size_t size;
  uint64_t flags;
  uint32_t grp;
  uint8_t *host; /* the mapping */
  uint8_t *dev;  /* device memory (== host for P2P) */
  int sub;       /* a sub-buffer: the memory is its parent's */
} fbo;
typedef struct frun {
  int magic;
  fkernel *k;
  fbo *bo[5];
  uint32_t scalar[8];
  int started;
} frun;

enum { M_DEV = 0x44455631, M_KER = 0x4b455231, M_BO = 0x424f3031, M_RUN = 0x52554e31 };

xrtDeviceHandle xrtDeviceOpen(unsigned int index)
{
  logf_("xrtDeviceOpen(%u)\n", index);
  if (should_fail("xrtDeviceOpen"))
    return NULL;
  fdev *d = calloc(1, sizeof *d);
  d->magic = M_DEV;
  live++;
  return d;
}

int xrtDeviceClose(xrtDeviceHandle dhdl)
{
  fdev *d = dhdl;
  logf_("xrtDeviceClose\n");
  if (d == NULL || d->magic != M_DEV)
    logf_("MISUSE xrtDeviceClose: bad handle\n");
  else {
    d->magic = 0;
    free(d);
    live--;
  }
  return 0;
}

int xrtDeviceLoadXclbinFile(xrtDeviceHandle dhdl, const char *xclbin_fnm)
{
  fdev *d = dhdl;
  struct stat st;
  logf_("xrtDeviceLoadXclbinFile(%s)\n", xclbin_fnm ? xclbin_fnm : "(null)");
  if (should_fail("xrtDeviceLoadXclbinFile") || xclbin_fnm == NULL || stat(xclbin_fnm, &st) != 0)
    return -2; /* -ENOENT */
  d->xclbin_loaded = 1;
  return 0;
}

int xrtDeviceGetXclbinUUID(xrtDeviceHandle dhdl, xuid_t out)
{
  fdev *d = dhdl;
  logf_("xrtDeviceGetXclbinUUID\n");
  if (!d->xclbin_loaded)
    return -22;
  for (int i = 0; i < 16; i++)
    out[i] = (unsigned char)(0xa0 + i);
  return 0;
}

xrtKernelHandle xrtPLKernelOpen(xrtDeviceHandle dhdl, const xuid_t xclbinId, const char *name)
{
  fdev *d = dhdl;
  logf_("xrtPLKernelOpen(%s)\n", name ? name : "(null)");
  if (xclbinId[0] != 0xa0 || xclbinId[15] != 0xaf)
    logf_("MISUSE xrtPLKernelOpen: uuid not the loaded xclbin's\n");
  if (should_fail("xrtPLKernelOpen") || name == NULL ||
      (strcmp(name, "kv_score_kernel") != 0 && strcmp(name, "kv_gather_kernel") != 0 &&
       strcmp(name, "kv_select_kernel") != 0))
    return NULL;
  fkernel *k = calloc(1, sizeof *k);
  k->magic = M_KER;
  k->d = d;
  k->kind = strcmp(name, "kv_gather_kernel") == 0 ? 1 : strcmp(name, "kv_select_kernel") == 0 ? 2 : 0;
  live++;
  return k;
}

int xrtKernelClose(xrtKernelHandle kh)
{
  fkernel *k = kh;
  logf_("xrtKernelClose\n");
  if (k == NULL || k->magic != M_KER)
    logf_("MISUSE xrtKernelClose: bad handle\n");
  else {
    k->magic = 0;
    free(k);
    live--;
  }
  return 0;
}

int xrtKernelArgGroupId(xrtKernelHandle kh, int argno)
{
  (void)kh;
  logf_("xrtKernelArgGroupId(%d)\n", argno);
  return argno == 0 || argno == 1 ? 1 : 0; /* keys in bank 1 (P2P), the rest in bank 0 */
}

xrtBufferHandle xrtBOAlloc(xrtDeviceHandle dhdl, size_t size, xrtBufferFlags flags,
                           xrtMemoryGroup grp)
{
  (void)dhdl;
  logf_("xrtBOAlloc(%zu, %s, %u)\n", size, (flags & XRT_BO_FLAGS_P2P) ? "P2P" : "NONE", grp);
  if (should_fail("xrtBOAlloc"))
    return NULL;
  fbo *b = calloc(1, sizeof *b);
  b->magic = M_BO;
  b->size = size;
  b->flags = flags;
  b->grp = grp;
  if (posix_memalign((void **)&b->host, 4096, size) != 0)
    abort();
  memset(b->host, 0xcd, size);
  if (flags & XRT_BO_FLAGS_P2P) {
    b->dev = b->host;
  } else {
    if (posix_memalign((void **)&b->dev, 4096, size) != 0)
      abort();
    memset(b->dev, 0xdc, size);
  }
  live++;
  return b;
}

int xrtBOFree(xrtBufferHandle bhdl)
{
  fbo *b = bhdl;
  logf_("xrtBOFree\n");
  if (b == NULL || b->magic != M_BO) {
    logf_("MISUSE xrtBOFree: bad handle\n");
    return -22;
  }
  if (!b->sub) {
    if (b->dev != b->host)
      free(b->dev);
    free(b->host);
  }
  b->magic = 0;
  free(b);
  live--;
  return 0;
}

xrtBufferHandle xrtBOSubAlloc(xrtBufferHandle parent, size_t size, size_t offset)
{
  fbo *p = parent;
  logf_("xrtBOSubAlloc(%zu, %zu)\n", size, offset);
  if (p == NULL || p->magic != M_BO || offset > p->size || size > p->size - offset) {
    logf_("MISUSE xrtBOSubAlloc: bad parent or range\n");
    return NULL;
  }
  if (should_fail("xrtBOSubAlloc"))
    return NULL;
  fbo *b = calloc(1, sizeof *b);
  *b = *p;
  b->size = size;
  b->host = p->host + offset;
  b->dev = p->dev + offset;
  b->sub = 1;
  live++;
  return b;
}

void *xrtBOMap(xrtBufferHandle bhdl)
{
  fbo *b = bhdl;
  logf_("xrtBOMap\n");
  return b && b->magic == M_BO ? b->host : NULL;
}

int xrtBOSync(xrtBufferHandle bhdl, enum xclBOSyncDirection dir, size_t size, size_t offset)
{
  fbo *b = bhdl;
  logf_("xrtBOSync(%s, %zu, %zu)\n", dir == XCL_BO_SYNC_BO_TO_DEVICE ? "TO_DEVICE" : "FROM_DEVICE",
        size, offset);
  if (b == NULL || b->magic != M_BO || offset > b->size || size > b->size - offset) {
    logf_("MISUSE xrtBOSync: bad handle or range\n");
    return -22;
  }
  if (b->flags & XRT_BO_FLAGS_P2P)
    logf_("MISUSE xrtBOSync of a P2P buffer\n");
  if (should_fail("xrtBOSync"))
    return -5;
  if (dir == XCL_BO_SYNC_BO_TO_DEVICE)
    memcpy(b->dev + offset, b->host + offset, size);
  else
    memcpy(b->host + offset, b->dev + offset, size);
  return 0;
}

xrtRunHandle xrtRunOpen(xrtKernelHandle kh)
{
  logf_("xrtRunOpen\n");
  if (should_fail("xrtRunOpen"))
    return NULL;
  frun *r = calloc(1, sizeof *r);
  r->magic = M_RUN;
  r->k = kh;
  live++;
  return r;
}

int xrtRunSetArg(xrtRunHandle rhdl, int index, ...)
{
  frun *r = rhdl;
  va_list ap;
  va_start(ap, index);
  if (r->k->kind != 0) { /* source (gather: P2P, bank 1), descriptors, output, two ints */
    const char *kn = r->k->kind == 1 ? "gather" : "select";
    if (index >= 0 && index < 3) {
      fbo *b = va_arg(ap, void *);
      r->bo[index] = b;
      logf_("xrtRunSetArg(%s %d, bo%s)\n", kn, index,
            b && b->magic == M_BO ? ((b->flags & XRT_BO_FLAGS_P2P) ? " P2P" : "") : " BAD");
      int p2p = r->k->kind == 1 && index == 0;
      if (b && b->magic == M_BO && !(b->flags & XRT_BO_FLAGS_P2P) != !p2p)
        logf_("MISUSE %s argument %d: P2P flag\n", kn, index);
      if (b && b->magic == M_BO && b->grp != (uint32_t)(p2p ? 1 : 0))
        logf_("MISUSE %s argument %d in memory bank %u\n", kn, index, b->grp);
    } else if (index >= 3 && index < 5) {
      unsigned v = va_arg(ap, unsigned);
      r->scalar[index - 3] = v;
      logf_("xrtRunSetArg(%s %d, %u)\n", kn, index, v);
    } else {
      logf_("MISUSE xrtRunSetArg: kv_%s_kernel has no argument %d\n", kn, index);
      va_end(ap);
      return -22;
    }
    va_end(ap);
    return 0;
  }
  if (index >= 0 && index < 5) {
    fbo *b = va_arg(ap, void *);
    r->bo[index] = b;
    logf_("xrtRunSetArg(%d, bo%s)\n", index,
          b && b->magic == M_BO ? ((b->flags & XRT_BO_FLAGS_P2P) ? " P2P" : "") : " BAD");
    if (index <= 1 && b && !(b->flags & XRT_BO_FLAGS_P2P))
      logf_("MISUSE keys argument is not a P2P buffer\n");
    if (b && b->magic == M_BO && b->grp != (uint32_t)(index <= 1 ? 1 : 0))
      logf_("MISUSE argument %d in memory bank %u\n", index, b->grp);
  } else if (index >= 5 && index < 13) {
    unsigned v = va_arg(ap, unsigned);
    r->scalar[index - 5] = v;
    logf_("xrtRunSetArg(%d, %u)\n", index, v);
  } else {
    logf_("MISUSE xrtRunSetArg: no argument %d\n", index);
    va_end(ap);
    return -22;
  }
  va_end(ap);
  return 0;
}

int xrtRunStart(xrtRunHandle rhdl)
{
  frun *r = rhdl;
  logf_("xrtRunStart%s\n", r->k->kind == 1 ? " gather" : r->k->kind == 2 ? " select" : "");
  if (r->k->kind != 0) {
    for (int i = 0; i < 3; i++)
      if (r->bo[i] == NULL || r->bo[i]->magic != M_BO) {
        logf_("MISUSE xrtRunStart: argument %d not set\n", i);
        return -22;
      }
    if (should_fail("xrtRunStart"))
      return -5;
    if (r->k->kind == 1)
      kv_gather_kernel((const kvk_word *)(void *)r->bo[0]->dev,
                       (const kvk_word *)(void *)r->bo[1]->dev, (kvk_word *)(void *)r->bo[2]->dev,
                       r->scalar[0], r->scalar[1]);
    else
      kv_select_kernel((const kvk_pair *)(void *)r->bo[0]->dev,
                       (const kvk_word *)(void *)r->bo[1]->dev, (kvk_pair *)(void *)r->bo[2]->dev,
                       r->scalar[0], r->scalar[1]);
    r->started = 1;
    return 0;
  }
  for (int i = 0; i < 5; i++)
    if (r->bo[i] == NULL || r->bo[i]->magic != M_BO) {
      logf_("MISUSE xrtRunStart: argument %d not set\n", i);
      return -22;
    }
  if (should_fail("xrtRunStart"))
    return -5;
  const uint32_t *s = r->scalar;
  kv_score_kernel((const kvk_word *)(void *)r->bo[0]->dev, (const kvk_word *)(void *)r->bo[1]->dev,
                  (const kvk_word *)(void *)r->bo[2]->dev, (kvk_pair *)(void *)r->bo[3]->dev,
                  (kvk_pair *)(void *)r->bo[4]->dev, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
  r->started = 1;
  return 0;
}

enum ert_cmd_state xrtRunWait(xrtRunHandle rhdl)
{
  frun *r = rhdl;
  logf_("xrtRunWait\n");
  if (!r->started)
    logf_("MISUSE xrtRunWait before xrtRunStart\n");
  if (should_fail("xrtRunWait"))
    return ERT_CMD_STATE_ERROR;
  return ERT_CMD_STATE_COMPLETED;
}

int xrtRunClose(xrtRunHandle rhdl)
{
  frun *r = rhdl;
  logf_("xrtRunClose\n");
  if (r == NULL || r->magic != M_RUN) {
    logf_("MISUSE xrtRunClose: bad handle\n");
    return -22;
  }
  r->magic = 0;
  free(r);
  live--;
  return 0;
}
