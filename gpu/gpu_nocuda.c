/* SPDX-License-Identifier: MIT */
/*
 * gpu/gpu_nocuda.c — kvdb_gpu_open of a build without CUDA (nvcc not found, or -Dcuda=disabled).
 */
#include "gpu_backend.h"

kvdb_status kvdb_gpu_open(int device, kvdb_gpu **out)
{
  (void)device;
  if (out != NULL)
    *out = NULL;
  return kv_gpu_fail(KVDB_UNSUPPORTED, "this build of libkvgpu has no CUDA (nvcc was not found "
                     "or -Dcuda=disabled)");
}
