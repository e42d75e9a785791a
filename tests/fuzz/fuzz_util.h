/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_util.h — what the codec fuzz targets share: the libFuzzer entry point's
 * prototype, an allocation that aborts instead of returning NULL (a fuzz run must not confuse
 * an allocation failure with a finding), and the cap on a decoded output.
 */
#ifndef KV_FUZZ_UTIL_H
#define KV_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef KV_FUZZ_MAX_OUT
#define KV_FUZZ_MAX_OUT (64u << 20) /* decoded bytes a target allocates at most per input */
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline void *xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (p == NULL)
    abort();
  return p;
}

#endif
