/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_frame.c — untrusted bytes into the lossless frame decoder (compress/frames.c,
 * section format version 2): byte planes and exponent pairs (KV_FRAME_CODING_EXPPAIRS).
 *
 * Must never crash, hang or read or write outside its buffers (run it under ASan, or with
 * libFuzzer via -Dfuzzing=true). Per input: kv_frame_parse(); when the frame parses and its rows
 * fit KV_FUZZ_MAX_OUT, kv_frame_decode() into an exact-size buffer with a built-in context and
 * with a kv_codec_dctx (same status and, on success, same bytes), every section's place by
 * kv_frame_section(); then the same input with the exponent-pairs flag toggled (byte 6), so the
 * pairs decoder sees every seed. Seeds: `test_codec_frames --write-corpus DIR`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "fuzz_util.h"

static void one(const uint8_t *data, size_t size)
{
  kv_frame_info info;
  kv_codec_err err;
  if (kv_frame_parse(data, size, &info, &err) != KV_CODEC_OK)
    return;
  uint64_t off_sum = 0;
  for (uint32_t i = 0; i < info.n_sections; i++) {
    uint32_t r, d;
    kv_section_kind k;
    uint64_t off;
    if (kv_frame_section(data, &info, i, &r, &d, &k, &off) != KV_CODEC_OK || off != off_sum)
      abort();
    off_sum += (uint64_t)r * d * kv_codec_dtype_bytes(info.dtype);
  }
  size_t bytes = (size_t)info.n_elems * kv_codec_dtype_bytes(info.dtype);
  if (off_sum != bytes)
    abort();
  if (bytes > KV_FUZZ_MAX_OUT)
    return;
  size_t sb = kv_frame_decode_scratch_bytes(&info);
  uint8_t *scratch = xmalloc(sb), *a = xmalloc(bytes), *b = xmalloc(bytes);
  void *mem = xmalloc(kv_codec_dctx_bytes());
  kv_codec_dctx *ctx = kv_codec_dctx_init(mem, kv_codec_dctx_bytes());
  /* an exact-size copy: a read past the frame is an ASan error */
  uint8_t *src = xmalloc(size);
  memcpy(src, data, size);
  kv_codec_status s1 = kv_frame_decode(NULL, src, size, scratch, sb, a, bytes, &err);
  kv_codec_status s2 = kv_frame_decode(ctx, src, size, scratch, sb, b, bytes, &err);
  if (s1 != s2 || (s1 == KV_CODEC_OK && memcmp(a, b, bytes) != 0))
    abort();
  free(src);
  free(mem);
  free(scratch);
  free(a);
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  one(data, size);
  if (size > 6 && size <= (64u << 20)) {
    uint8_t *t = xmalloc(size);
    memcpy(t, data, size);
    t[6] ^= KV_FRAME_CODING_EXPPAIRS;
    one(t, size);
    free(t);
  }
  return 0;
}
