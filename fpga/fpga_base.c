/* SPDX-License-Identifier: MIT */
/*
 * fpga/fpga_base.c — what every file of fpga/ uses, below the backends: status names, error
 * messages and kv_fpga_fail_at(), the check that the XRT run-time environment is real
 * (kv_fpga_xrt_env_ok(), read before anything touches libxrt), and the kernel's scalar
 * arguments of a checked run (kv_fpga_kargs_of()). Calls no other file of fpga/.
 */
#define _GNU_SOURCE
#include "fpga_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------------------------------ */
/* Status and errors                                                                           */

const char *kv_fpga_status_name(kv_fpga_status rc)
{
  switch (rc) {
  case KV_FPGA_OK: return "KV_FPGA_OK";
  case KV_FPGA_EINVAL: return "KV_FPGA_EINVAL";
  case KV_FPGA_ENODEV: return "KV_FPGA_ENODEV";
  case KV_FPGA_EIO: return "KV_FPGA_EIO";
  case KV_FPGA_ENOMEM: return "KV_FPGA_ENOMEM";
  case KV_FPGA_EDEVICE: return "KV_FPGA_EDEVICE";
  case KV_FPGA_EUNSUPPORTED: return "KV_FPGA_EUNSUPPORTED";
  case KV_FPGA_ECORRUPT: return "KV_FPGA_ECORRUPT";
  }
  return "KV_FPGA_E?";
}

size_t kv_fpga_errmsg(const kv_fpga_err *err, char *buf, size_t cap)
{
  int n;
  if (err == NULL || err->code == KV_FPGA_OK)
    n = snprintf(buf, cap, "ok");
  else if (err->sys_errno != 0)
    n = snprintf(buf, cap, "%s: %s (value %llu, limit %llu): %s [%s:%d]",
                 kv_fpga_status_name(err->code), err->what ? err->what : "?",
                 (unsigned long long)err->value, (unsigned long long)err->limit,
                 strerror(err->sys_errno), err->file ? err->file : "?", err->line);
  else
    n = snprintf(buf, cap, "%s: %s (value %llu, limit %llu) [%s:%d]",
                 kv_fpga_status_name(err->code), err->what ? err->what : "?",
                 (unsigned long long)err->value, (unsigned long long)err->limit,
                 err->file ? err->file : "?", err->line);
  return n < 0 ? 0 : (size_t)n;
}

kv_fpga_status kv_fpga_fail_at(kv_fpga_err *err, kv_fpga_status code, const char *what,
                               uint64_t value, uint64_t limit, int sys_errno, const char *file,
                               int line)
{
  if (err != NULL) {
    err->code = code;
    err->what = what;
    err->value = value;
    err->limit = limit;
    err->sys_errno = sys_errno;
    err->file = file;
    err->line = line;
  }
  return code;
}
/* ------------------------------------------------------------------------------------------ */
/* The XRT environment and the kernel's arguments                                              */

int kv_fpga_xrt_env_ok(const char **why)
{
  const char *emu = getenv("XCL_EMULATION_MODE");
  if (emu != NULL && emu[0] != 0) {
    if (why)
      *why = "XCL_EMULATION_MODE is set: XRT emulation needs Vitis and hangs without it; unset it";
    return 0;
  }
  const char *x = getenv("XILINX_XRT");
  if (x == NULL || x[0] == 0) {
    if (why)
      *why = "XRT runtime not configured: set XILINX_XRT (XRT aborts the process without it)";
    return 0;
  }
  char path[4096];
  struct stat st;
  int n = snprintf(path, sizeof path, "%s/lib/libxrt_core.so.2", x);
  if (n < 0 || (size_t)n >= sizeof path || stat(path, &st) != 0) {
    if (why)
      *why = "XILINX_XRT has no lib/libxrt_core.so.2 (XRT would abort the process): point it at "
             "an XRT install, e.g. /opt/xilinx/xrt";
    return 0;
  }
  return 1;
}

void kv_fpga_kargs_of(const kv_fpga_run_args *a, kv_fpga_kargs *out)
{
  out->scale_word = (uint32_t)((a->sect_off + KV_SCORE_COPY_HDR_BYTES) / 64);
  out->code_word = (uint32_t)((a->sect_off + a->layout.meta_bytes) / 64);
  out->t0 = a->t0;
  out->n = a->n;
  out->pos_base = a->pos_base;
  out->row_bytes = a->layout.row_bytes;
  out->bits = a->layout.bits;
  out->k = a->k;
}
