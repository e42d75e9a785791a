/* SPDX-License-Identifier: MIT */
/*
 * fpga/device.c — the device seam (fpga/device.h), above the backends: backend choice and
 * opening (loading the xclbin for either backend), the buffer / P2P / run API that calls the
 * chosen backend's ops, query packing, argument checks, and the EMULATED backend: 4 KiB-aligned
 * host buffers, P2P = pread from the caller's O_DIRECT fd into them (the syscall the SmartSSD
 * path uses, with another destination), runs = the kernel's function on those buffers:
 * emu_kernel.c's CPU version by default (the same outputs bit for bit), the HLS kernel file
 * compiled by gcc with KVDB_FPGA_EMU_KERNEL=hls. Status and errors, the XRT environment check and the kernel's scalar
 * arguments are fpga_base.c's, below xrt.c and this file.
 */
#define _GNU_SOURCE
#include "fpga_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define FAIL KV_FPGA_FAIL

/* ------------------------------------------------------------------------------------------ */
/* The emulated backend                                                                        */

static kv_fpga_status emu_load_kernel(kv_fpga_dev *dev, const char *xclbin, const char *name,
                                      kv_fpga_err *err)
{
  (void)dev;
  (void)xclbin;
  if (strcmp(name, "kv_score_kernel") != 0)
    return FAIL(err, KV_FPGA_EDEVICE, "the emulated device has only kv_score_kernel", 0, 0);
  return KV_FPGA_OK;
}

static kv_fpga_status emu_buf_alloc(kv_fpga_dev *dev, kv_fpga_buf *b, kv_fpga_err *err)
{
  (void)dev;
  void *p = NULL;
  if (posix_memalign(&p, 4096, b->size) != 0)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for an emulated device buffer", b->size, 0);
  memset(p, 0, b->size);
  b->host = p;
  return KV_FPGA_OK;
}

static void emu_buf_free(kv_fpga_buf *b)
{
  free(b->host);
}

static kv_fpga_status emu_buf_write(kv_fpga_buf *b, size_t off, const void *src, size_t len,
                                    kv_fpga_err *err)
{
  (void)err;
  memcpy(b->host + off, src, len);
  return KV_FPGA_OK;
}

static kv_fpga_status emu_buf_read(kv_fpga_buf *b, size_t off, void *dst, size_t len,
                                   kv_fpga_err *err)
{
  (void)err;
  memcpy(dst, b->host + off, len);
  return KV_FPGA_OK;
}

static kv_fpga_status emu_run_start(kv_fpga_dev *dev, const kv_fpga_run_args *a, kv_fpga_run *run,
                                    kv_fpga_err *err)
{
  (void)dev;
  (void)run;
  (void)err;
  kv_fpga_kargs k;
  kv_fpga_kargs_of(a, &k);
  const kvk_word *sect = (const kvk_word *)(const void *)a->sect->host;
  kvk_pair *blocks = (kvk_pair *)(void *)(a->blocks->host + a->blocks_off);
  kvk_pair *tk = a->topk ? (kvk_pair *)(void *)a->topk->host : blocks;
  const char *which = getenv("KVDB_FPGA_EMU_KERNEL"); /* "hls": the HLS C file itself */
  (which != NULL && strcmp(which, "hls") == 0 ? kv_score_kernel : kv_score_kernel_emu)(
      sect, sect, (const kvk_word *)(const void *)a->query->host, blocks, tk, k.scale_word,
      k.code_word, k.t0, k.n, k.pos_base, k.row_bytes, k.bits, k.k);
  return KV_FPGA_OK;
}

static kv_fpga_status emu_run_wait(kv_fpga_run *run, kv_fpga_err *err)
{
  (void)run;
  (void)err;
  return KV_FPGA_OK;
}

/* The emulated device checks each group's XXH3-64 against the checksum table page the same
 * P2P pass read (what a kernel XXH3 unit would do, gather_kernel.c), then runs the kernel. */
static kv_fpga_status emu_gather(kv_fpga_dev *dev, const kv_fpga_gather_args *a, int *verified,
                                 kv_fpga_err *err)
{
  (void)dev;
  const uint8_t *src = a->src->host;
  for (uint32_t i = 0; i < a->n_checks; i++) {
    const kv_fpga_gcheck *c = &a->checks[i];
    uint64_t want = 0;
    for (int b = 7; b >= 0; b--)
      want = (want << 8) | src[c->sum_off + (unsigned)b];
    if (XXH3_64bits_withSeed(src + c->data_off, c->len, c->seed) != want)
      return FAIL(err, KV_FPGA_ECORRUPT,
                  "page group checksum mismatch on the device (value: check, limit: its offset "
                  "in the P2P buffer)",
                  i, c->data_off);
  }
  kv_gather_kernel((const kvk_word *)(const void *)src,
                   (const kvk_word *)(const void *)a->desc->host, (kvk_word *)(void *)a->dst->host,
                   a->n_rows, a->row_bytes);
  *verified = 1;
  return KV_FPGA_OK;
}

static kv_fpga_status emu_select(kv_fpga_dev *dev, const kv_fpga_select_args *a,
                                 kv_fpga_err *err)
{
  (void)dev;
  (void)err;
  kv_select_kernel((const kvk_pair *)(const void *)a->in->host,
                   (const kvk_word *)(const void *)a->desc->host, (kvk_pair *)(void *)a->out->host,
                   a->n_segs, a->k);
  return KV_FPGA_OK;
}

static void emu_close(kv_fpga_dev *dev)
{
  (void)dev;
}

static const kv_fpga_ops emu_ops = {emu_load_kernel, emu_buf_alloc, emu_buf_free,
                                    emu_buf_write,   emu_buf_read,  emu_run_start,
                                    emu_run_wait,    emu_gather,    emu_select,
                                    emu_close};

/* ------------------------------------------------------------------------------------------ */
/* Opening                                                                                     */

void kv_fpga_opts_init(kv_fpga_opts *o)
{
  if (o == NULL)
    return;
  memset(o, 0, sizeof *o);
  o->backend = KV_FPGA_AUTO;
  o->kernel_name = "kv_score_kernel";
}

const char *kv_fpga_backend_name(kv_fpga_backend b)
{
  switch (b) {
  case KV_FPGA_AUTO: return "auto";
  case KV_FPGA_EMULATED: return "emulated";
  case KV_FPGA_XRT: return "xrt";
  }
  return "?";
}

kv_fpga_backend kv_fpga_dev_backend(const kv_fpga_dev *dev)
{
  return dev ? dev->backend : KV_FPGA_AUTO;
}

/* An xocl-bound PCI function: a cheap hint that a real device exists (no XRT call). */
static int xocl_device_present(void)
{
  DIR *d = opendir("/sys/bus/pci/drivers/xocl");
  if (d == NULL)
    return 0;
  int found = 0;
  struct dirent *e;
  while (!found && (e = readdir(d)) != NULL)
    found = strchr(e->d_name, ':') != NULL; /* a BDF such as 0000:3b:00.1 */
  closedir(d);
  return found;
}

kv_fpga_status kv_fpga_open(const kv_fpga_opts *opts, kv_fpga_dev **out, kv_fpga_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL output device", 0, 0);
  *out = NULL;
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  if (opts != NULL)
    o = *opts;
  if (o.kernel_name == NULL || o.kernel_name[0] == 0)
    o.kernel_name = "kv_score_kernel";
  if (strlen(o.kernel_name) >= sizeof((kv_fpga_dev *)0)->kernel_name)
    return FAIL(err, KV_FPGA_EINVAL, "kernel name too long", strlen(o.kernel_name), 127);
  if (o.backend != KV_FPGA_AUTO && o.backend != KV_FPGA_EMULATED && o.backend != KV_FPGA_XRT)
    return FAIL(err, KV_FPGA_EINVAL, "unknown backend", o.backend, KV_FPGA_XRT);
  kv_fpga_backend b = o.backend;
  if (b == KV_FPGA_AUTO)
    b = (o.xclbin_path != NULL && kv_fpga_xrt_env_ok(NULL) && xocl_device_present()) ? KV_FPGA_XRT
                                                                                       : KV_FPGA_EMULATED;
  kv_fpga_dev *dev = calloc(1, sizeof *dev);
  if (dev == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for the device", sizeof *dev, 0);
  dev->backend = b;
  snprintf(dev->kernel_name, sizeof dev->kernel_name, "%s", o.kernel_name);
  kv_fpga_status rc = KV_FPGA_OK;
  if (b == KV_FPGA_XRT) {
    rc = kv_fpga_xrt_open(dev, &o, err);
  } else {
    dev->ops = &emu_ops;
    dev->kernel_loaded = 1; /* the kernel is linked in; an xclbin path is only recorded */
  }
  if (rc == KV_FPGA_OK && o.xclbin_path != NULL)
    rc = kv_fpga_load_kernel(dev, o.xclbin_path, o.kernel_name, err);
  if (rc != KV_FPGA_OK) {
    if (dev->ops != NULL)
      dev->ops->close(dev);
    free(dev);
    return rc;
  }
  *out = dev;
  return KV_FPGA_OK;
}

void kv_fpga_close(kv_fpga_dev *dev)
{
  if (dev == NULL)
    return;
  if (dev->hie_pool != NULL) /* idle: no job runs while the device is closed */
    dev->hie_pool_free(dev->hie_pool);
  dev->hie_pool = NULL;
  kv_fpga_buf_free(dev->hie_sect);
  dev->hie_sect = NULL;
  dev->ops->close(dev);
  free(dev);
}

kv_fpga_status kv_fpga_load_kernel(kv_fpga_dev *dev, const char *xclbin_path,
                                   const char *kernel_name, kv_fpga_err *err)
{
  if (dev == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL device", 0, 0);
  if (kernel_name == NULL || kernel_name[0] == 0)
    kernel_name = dev->kernel_name;
  if (dev->backend == KV_FPGA_XRT && (xclbin_path == NULL || xclbin_path[0] == 0))
    return FAIL(err, KV_FPGA_EINVAL, "XRT needs an .xclbin path", 0, 0);
  kv_fpga_status rc = dev->ops->load_kernel(dev, xclbin_path, kernel_name, err);
  if (rc == KV_FPGA_OK) {
    dev->kernel_loaded = 1;
    snprintf(dev->kernel_name, sizeof dev->kernel_name, "%s", kernel_name);
  }
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffers and P2P                                                                             */

kv_fpga_status kv_fpga_buf_alloc(kv_fpga_dev *dev, size_t bytes, unsigned flags,
                                 kv_fpga_buf **out, kv_fpga_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL output buffer", 0, 0);
  *out = NULL;
  if (dev == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL device", 0, 0);
  if (bytes == 0 || bytes > ((size_t)1 << 40))
    return FAIL(err, KV_FPGA_EINVAL, "buffer size out of range", bytes, (uint64_t)1 << 40);
  if (flags == 0 || (flags & ~(KV_FPGA_BUF_P2P | KV_FPGA_BUF_IN | KV_FPGA_BUF_OUT)) != 0 ||
      ((flags & KV_FPGA_BUF_P2P) && flags != KV_FPGA_BUF_P2P))
    return FAIL(err, KV_FPGA_EINVAL, "buffer flags: P2P alone, or IN and/or OUT", flags, 0);
  if (dev->backend == KV_FPGA_XRT && !dev->kernel_loaded)
    return FAIL(err, KV_FPGA_EINVAL, "load the kernel before allocating XRT buffers (memory "
                                     "banks come from its arguments)", 0, 0);
  kv_fpga_buf *b = calloc(1, sizeof *b);
  if (b == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for a buffer", sizeof *b, 0);
  b->dev = dev;
  b->size = (bytes + 4095) / 4096 * 4096;
  b->flags = flags;
  kv_fpga_status rc = dev->ops->buf_alloc(dev, b, err);
  if (rc != KV_FPGA_OK) {
    free(b);
    return rc;
  }
  *out = b;
  return KV_FPGA_OK;
}

void kv_fpga_buf_free(kv_fpga_buf *buf)
{
  if (buf == NULL)
    return;
  buf->dev->ops->buf_free(buf);
  free(buf);
}

size_t kv_fpga_buf_size(const kv_fpga_buf *buf)
{
  return buf ? buf->size : 0;
}

kv_fpga_status kv_fpga_p2p_read(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t buf_off, int fd,
                                 uint64_t file_off, size_t len, kv_fpga_err *err)
{
  if (dev == NULL || buf == NULL || buf->dev != dev)
    return FAIL(err, KV_FPGA_EINVAL, "NULL device or buffer, or a buffer of another device", 0, 0);
  if (!(buf->flags & KV_FPGA_BUF_P2P))
    return FAIL(err, KV_FPGA_EINVAL, "P2P read into a buffer not allocated with KV_FPGA_BUF_P2P",
                buf->flags, 0);
  if (buf_off % 4096 || file_off % 4096 || len % 4096)
    return FAIL(err, KV_FPGA_EINVAL, "P2P read not 4096-aligned (buffer offset, file offset or "
                                     "length)", buf_off % 4096 ? buf_off : file_off % 4096 ? file_off : len,
                4096);
  if (buf_off > buf->size || len > buf->size - buf_off)
    return FAIL(err, KV_FPGA_EINVAL, "P2P read past the end of the buffer", buf_off + len,
                buf->size);
  if (fd < 0)
    return FAIL(err, KV_FPGA_EINVAL, "bad file descriptor", 0, 0);
  /* On a SmartSSD, buf->host is the mapped P2P BAR window: NVMe DMA goes SSD -> FPGA DDR. */
  size_t done = 0;
  while (done < len) {
    ssize_t r = pread(fd, buf->host + buf_off + done, len - done, (off_t)(file_off + done));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return KV_FPGA_FAIL_ERRNO(err, KV_FPGA_EIO, "P2P read failed (value: file offset)",
                                file_off + done, 0, errno);
    }
    if (r == 0)
      return FAIL(err, KV_FPGA_EIO, "P2P read past the end of the file (value: file offset)",
                  file_off + done, file_off + len);
    done += (size_t)r;
  }
  return KV_FPGA_OK;
}

static kv_fpga_status check_host_io(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t off, const void *p,
                                    size_t len, kv_fpga_err *err)
{
  if (dev == NULL || buf == NULL || buf->dev != dev || (p == NULL && len > 0))
    return FAIL(err, KV_FPGA_EINVAL, "NULL device, buffer or host pointer", 0, 0);
  if (buf->flags & KV_FPGA_BUF_P2P)
    return FAIL(err, KV_FPGA_EINVAL, "host access to a P2P buffer (slow and not synced; P2P "
                                     "buffers are filled by kv_fpga_p2p_read only)", 0, 0);
  if (off > buf->size || len > buf->size - off)
    return FAIL(err, KV_FPGA_EINVAL, "host copy past the end of the buffer", off + len, buf->size);
  return KV_FPGA_OK;
}

kv_fpga_status kv_fpga_buf_write(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t off, const void *src,
                                 size_t len, kv_fpga_err *err)
{
  kv_fpga_status rc = check_host_io(dev, buf, off, src, len, err);
  if (rc != KV_FPGA_OK)
    return rc;
  if (!(buf->flags & KV_FPGA_BUF_IN))
    return FAIL(err, KV_FPGA_EINVAL, "write to a buffer without KV_FPGA_BUF_IN", buf->flags, 0);
  return len ? dev->ops->buf_write(buf, off, src, len, err) : KV_FPGA_OK;
}

kv_fpga_status kv_fpga_buf_read(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t off, void *dst,
                                size_t len, kv_fpga_err *err)
{
  kv_fpga_status rc = check_host_io(dev, buf, off, dst, len, err);
  if (rc != KV_FPGA_OK)
    return rc;
  if (!(buf->flags & KV_FPGA_BUF_OUT))
    return FAIL(err, KV_FPGA_EINVAL, "read of a buffer without KV_FPGA_BUF_OUT", buf->flags, 0);
  return len ? dev->ops->buf_read(buf, off, dst, len, err) : KV_FPGA_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Query and runs                                                                              */

kv_fpga_status kv_fpga_query_pack(const kv_score_query *q, void *dst, size_t cap,
                                  kv_fpga_err *err)
{
  if (q == NULL || dst == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL query or destination", 0, 0);
  if (cap < KV_FPGA_QUERY_BYTES)
    return FAIL(err, KV_FPGA_EINVAL, "query destination too small", cap, KV_FPGA_QUERY_BYTES);
  uint32_t nv = kv_score_query_n_vec(q), d = kv_score_query_head_dim(q);
  if (nv > KVK_MAX_VEC)
    return FAIL(err, KV_FPGA_EUNSUPPORTED, "the kernel holds at most 8 query vectors", nv,
                KVK_MAX_VEC);
  if (d > KVK_MAX_D)
    return FAIL(err, KV_FPGA_EUNSUPPORTED, "the kernel holds at most 1024 query elements", d,
                KVK_MAX_D);
  uint8_t *p = dst;
  memset(p, 0, KV_FPGA_QUERY_BYTES);
  memcpy(p, &nv, 4);
  memcpy(p + 4, &d, 4);
  for (uint32_t v = 0; v < nv; v++) {
    float s = kv_score_query_scale(q, v);
    memcpy(p + 8 + 4 * v, &s, 4);
    memcpy(p + 64 + (size_t)v * KVK_MAX_D, kv_score_query_codes(q, v), d);
  }
  return KV_FPGA_OK;
}

kv_fpga_status kv_fpga_run_check(const kv_fpga_run_args *a, kv_fpga_err *err)
{
  if (a == NULL || a->sect == NULL || a->query == NULL || a->blocks == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL run arguments or buffers", 0, 0);
  const kv_score_layout *l = &a->layout;
  kv_score_layout chk;
  if (l->variant != 0)
    return FAIL(err, KV_FPGA_EUNSUPPORTED,
                "centered (version 2) score copies are scored on the host only", l->variant, 0);
  if (kv_score_layout_init(&chk, l->n_tokens, l->head_dim, l->bits, NULL) != KV_SCORE_OK ||
      memcmp(&chk, l, sizeof chk) != 0)
    return FAIL(err, KV_FPGA_EINVAL, "run layout is not a kv_score_layout_init() result", 0, 0);
  if (l->row_bytes > KVK_MAX_ROW || (l->row_bytes & (l->row_bytes - 1)) != 0)
    return FAIL(err, KV_FPGA_EUNSUPPORTED,
                "the kernel needs a power-of-two row of at most 512 bytes (value: row bytes)",
                l->row_bytes, KVK_MAX_ROW);
  if (!(a->sect->flags & KV_FPGA_BUF_P2P))
    return FAIL(err, KV_FPGA_EINVAL, "the section buffer is not a P2P buffer", a->sect->flags, 0);
  if (a->sect_off % 64 != 0)
    return FAIL(err, KV_FPGA_EINVAL, "section offset not a multiple of 64", a->sect_off, 64);
  if (a->sect_off > a->sect->size || l->total_bytes > a->sect->size - a->sect_off)
    return FAIL(err, KV_FPGA_EINVAL, "section past the end of its buffer", a->sect_off + l->total_bytes,
                a->sect->size);
  if ((a->sect_off + l->meta_bytes) / 64 > UINT32_MAX)
    return FAIL(err, KV_FPGA_EINVAL, "section offset beyond the kernel's 32-bit word index",
                a->sect_off, (uint64_t)UINT32_MAX * 64);
  if (a->n == 0 || (uint64_t)a->t0 + a->n > l->n_tokens)
    return FAIL(err, KV_FPGA_EINVAL, "chunk empty or past the end of the section",
                (uint64_t)a->t0 + a->n, l->n_tokens);
  if ((uint64_t)a->t0 * l->row_bytes % 64 != 0)
    return FAIL(err, KV_FPGA_EINVAL, "chunk does not start on a 64-byte word (t0 * row_bytes)",
                a->t0, 64);
  if ((uint64_t)a->pos_base + a->t0 + a->n > (uint64_t)UINT32_MAX + 1)
    return FAIL(err, KV_FPGA_EINVAL, "positions exceed 32 bits", a->pos_base, 0);
  if (a->k > KV_FPGA_MAX_TOPK)
    return FAIL(err, KV_FPGA_EUNSUPPORTED, "on-chip top-k holds at most 64", a->k, KV_FPGA_MAX_TOPK);
  if (!(a->query->flags & KV_FPGA_BUF_IN) || a->query->size < KV_FPGA_QUERY_BYTES)
    return FAIL(err, KV_FPGA_EINVAL, "query buffer not IN or smaller than KV_FPGA_QUERY_BYTES",
                a->query->size, KV_FPGA_QUERY_BYTES);
  if (a->blocks_off % 64 != 0)
    return FAIL(err, KV_FPGA_EINVAL, "score block offset not a multiple of 64", a->blocks_off, 64);
  if (!(a->blocks->flags & KV_FPGA_BUF_OUT) || a->blocks->size < a->blocks_off ||
      (a->blocks->size - a->blocks_off) / 8 < a->n)
    return FAIL(err, KV_FPGA_EINVAL, "score block buffer not OUT or smaller than 8 bytes per token "
                                     "from its offset", a->blocks->size, a->blocks_off + (size_t)a->n * 8);
  if (a->k > 0 && (a->topk == NULL || !(a->topk->flags & KV_FPGA_BUF_OUT) ||
                   a->topk->size < (size_t)a->k * 8))
    return FAIL(err, KV_FPGA_EINVAL, "top-k buffer missing, not OUT or smaller than 8k bytes", a->k,
                0);
  kv_fpga_dev *d = a->sect->dev;
  if (a->query->dev != d || a->blocks->dev != d || (a->topk && a->topk->dev != d))
    return FAIL(err, KV_FPGA_EINVAL, "buffers of different devices", 0, 0);
  return KV_FPGA_OK;
}

kv_fpga_status kv_fpga_run_start(kv_fpga_dev *dev, const kv_fpga_run_args *a, kv_fpga_run **out,
                                 kv_fpga_err *err)
{
  if (out == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL output run", 0, 0);
  *out = NULL;
  if (dev == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL device", 0, 0);
  if (!dev->kernel_loaded)
    return FAIL(err, KV_FPGA_EINVAL, "no kernel loaded (kv_fpga_load_kernel)", 0, 0);
  kv_fpga_status rc = kv_fpga_run_check(a, err);
  if (rc != KV_FPGA_OK)
    return rc;
  if (a->sect->dev != dev)
    return FAIL(err, KV_FPGA_EINVAL, "buffers of another device", 0, 0);
  kv_fpga_run *run = calloc(1, sizeof *run);
  if (run == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for a run", sizeof *run, 0);
  run->dev = dev;
  rc = dev->ops->run_start(dev, a, run, err);
  if (rc != KV_FPGA_OK) {
    free(run);
    return rc;
  }
  *out = run;
  return KV_FPGA_OK;
}

kv_fpga_status kv_fpga_run_wait(kv_fpga_run *run, kv_fpga_err *err)
{
  if (run == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL run", 0, 0);
  kv_fpga_status rc = run->dev->ops->run_wait(run, err);
  free(run);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Gathering rows                                                                              */

kv_fpga_status kv_fpga_gather(kv_fpga_dev *dev, const kv_fpga_gather_args *a, int *verified,
                              kv_fpga_err *err)
{
  if (verified != NULL)
    *verified = 0;
  if (dev == NULL || a == NULL || a->src == NULL || a->desc == NULL || a->dst == NULL ||
      a->row_off == NULL || (a->checks == NULL && a->n_checks > 0))
    return FAIL(err, KV_FPGA_EINVAL, "NULL device, gather arguments, buffers or offsets", 0, 0);
  if (a->src->dev != dev || a->desc->dev != dev || a->dst->dev != dev)
    return FAIL(err, KV_FPGA_EINVAL, "buffers of another device", 0, 0);
  if (!dev->kernel_loaded)
    return FAIL(err, KV_FPGA_EINVAL, "no kernel loaded (kv_fpga_load_kernel)", 0, 0);
  if (!(a->src->flags & KV_FPGA_BUF_P2P) || !(a->desc->flags & KV_FPGA_BUF_IN) ||
      !(a->dst->flags & KV_FPGA_BUF_OUT))
    return FAIL(err, KV_FPGA_EINVAL, "gather buffers: src P2P, desc IN, dst OUT", 0, 0);
  if (a->n_rows == 0 || a->n_rows > (1u << 24))
    return FAIL(err, KV_FPGA_EINVAL, "gather of 0 or more than 2^24 rows", a->n_rows, 1u << 24);
  if (a->row_bytes == 0 || a->row_bytes > KVG_MAX_ROW)
    return FAIL(err, KV_FPGA_EINVAL, "gather row size out of range", a->row_bytes, KVG_MAX_ROW);
  if (a->desc->size < (size_t)a->n_rows * 8)
    return FAIL(err, KV_FPGA_EINVAL, "gather descriptor buffer smaller than 8 bytes per row",
                a->desc->size, (size_t)a->n_rows * 8);
  if (a->dst->size / KV_FPGA_ROW_STRIDE(a->row_bytes) < a->n_rows)
    return FAIL(err, KV_FPGA_EINVAL, "gather output buffer too small (value: its size)",
                a->dst->size, (size_t)a->n_rows * KV_FPGA_ROW_STRIDE(a->row_bytes));
  for (uint32_t i = 0; i < a->n_rows; i++)
    if (a->row_off[i] > a->src->size || a->row_bytes > a->src->size - a->row_off[i])
      return FAIL(err, KV_FPGA_EINVAL, "gathered row past the end of the P2P buffer (value: "
                                       "its offset)", a->row_off[i], a->src->size);
  for (uint32_t i = 0; i < a->n_checks; i++) {
    const kv_fpga_gcheck *c = &a->checks[i];
    if (c->data_off > a->src->size || c->len > a->src->size - c->data_off ||
        c->sum_off > a->src->size - 8 || a->src->size < 8)
      return FAIL(err, KV_FPGA_EINVAL, "checked group or its checksum past the end of the P2P "
                                       "buffer (value: check)", i, a->src->size);
  }
  /* the offsets, little-endian, 8 per 64-byte word */
  uint8_t *d = malloc((size_t)a->n_rows * 8);
  if (d == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for the gather descriptors", a->n_rows, 0);
  for (uint32_t i = 0; i < a->n_rows; i++)
    for (int b = 0; b < 8; b++)
      d[(size_t)i * 8 + (unsigned)b] = (uint8_t)(a->row_off[i] >> (8 * b));
  kv_fpga_status rc = kv_fpga_buf_write(dev, a->desc, 0, d, (size_t)a->n_rows * 8, err);
  free(d);
  if (rc != KV_FPGA_OK)
    return rc;
  int v = 0;
  rc = dev->ops->gather(dev, a, &v, err);
  if (rc == KV_FPGA_OK && verified != NULL)
    *verified = v;
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Selecting the top k of many score blocks                                                    */

kv_fpga_status kv_fpga_select(kv_fpga_dev *dev, const kv_fpga_select_args *a, kv_fpga_err *err)
{
  if (dev == NULL || a == NULL || a->in == NULL || a->desc == NULL || a->out == NULL ||
      a->segs == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL device, select arguments, buffers or segments", 0, 0);
  if (a->in->dev != dev || a->desc->dev != dev || a->out->dev != dev)
    return FAIL(err, KV_FPGA_EINVAL, "buffers of another device", 0, 0);
  if (!dev->kernel_loaded)
    return FAIL(err, KV_FPGA_EINVAL, "no kernel loaded (kv_fpga_load_kernel)", 0, 0);
  if (!(a->in->flags & KV_FPGA_BUF_OUT) || !(a->desc->flags & KV_FPGA_BUF_IN) ||
      !(a->out->flags & KV_FPGA_BUF_OUT))
    return FAIL(err, KV_FPGA_EINVAL, "select buffers: in OUT, desc IN, out OUT", 0, 0);
  if (a->n_segs == 0 || a->n_segs > (1u << 24))
    return FAIL(err, KV_FPGA_EINVAL, "select of 0 or more than 2^24 segments", a->n_segs, 1u << 24);
  if (a->desc->size / 8 < a->n_segs)
    return FAIL(err, KV_FPGA_EINVAL, "select descriptor buffer smaller than 8 bytes per segment",
                a->desc->size, (size_t)a->n_segs * 8);
  uint64_t pairs = 0;
  for (uint32_t i = 0; i < a->n_segs; i++) {
    uint64_t first = a->segs[2 * i], count = a->segs[2 * i + 1];
    if ((first + count) * 8 > a->in->size)
      return FAIL(err, KV_FPGA_EINVAL, "select segment past the end of its buffer (value: "
                                       "segment)", i, a->in->size);
    pairs += count;
  }
  if (a->k == 0 || a->k > pairs)
    return FAIL(err, KV_FPGA_EINVAL, "select k is 0 or more than the pairs", a->k, pairs);
  if (a->out->size / 8 < a->k)
    return FAIL(err, KV_FPGA_EINVAL, "select output buffer smaller than 8 k bytes", a->out->size,
                (size_t)a->k * 8);
  uint8_t *d = malloc((size_t)a->n_segs * 8);
  if (d == NULL)
    return FAIL(err, KV_FPGA_ENOMEM, "out of memory for the select descriptors", a->n_segs, 0);
  for (size_t i = 0; i < (size_t)a->n_segs * 2; i++)
    for (int b = 0; b < 4; b++)
      d[i * 4 + (unsigned)b] = (uint8_t)(a->segs[i] >> (8 * b));
  kv_fpga_status rc = kv_fpga_buf_write(dev, a->desc, 0, d, (size_t)a->n_segs * 8, err);
  free(d);
  return rc == KV_FPGA_OK ? dev->ops->select(dev, a, err) : rc;
}
