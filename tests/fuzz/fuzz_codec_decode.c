/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_codec_decode.c — untrusted bytes into every section decoder.
 *
 * Must never crash, hang or read outside the input (run it under ASan, or with libFuzzer via
 * -Dfuzzing=true). Three passes per input:
 *   1. the generic path: kv_section_parse(), kv_section_decode() of the whole section, which
 *      kv_section_decode_dctx() through a decoding context must match (status and bytes), and
 *      if that succeeds, each group alone through kv_section_group_span() and
 *      kv_section_decode_groups() from exact-size copies, which must equal the whole decode;
 *      positions and row lookups on the parsed header;
 *   2. every registered codec's own decode member, with the codec id byte set to that codec,
 *      so each decoder sees the input whatever its first byte was;
 *   3. kv_section_header_bytes() on the raw input.
 * Sections whose decoded rows would exceed KV_FUZZ_MAX_OUT are parsed but not decoded (a few
 * bytes of zstd can describe gigabytes of zeros; that is valid, not a bug).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "fuzz_util.h"

static void generic(const uint8_t *data, size_t size)
{
  kv_section_info info;
  kv_codec_err err;
  if (kv_section_parse(data, size, &info, &err) != KV_CODEC_OK)
    return;
  size_t out = kv_section_rows_bytes(&info, 0, info.n_groups);
  size_t scr = kv_section_scratch_bytes(&info);
  if (out == 0 || scr == 0)
    abort(); /* a parsed section always has rows and a scratch size */
  if (info.n_rows > 0) {
    uint32_t pos[4], row;
    uint32_t n = info.n_rows < 4 ? info.n_rows : 4;
    if (kv_section_positions(data, size, info.n_rows - n, n, pos, &err) != KV_CODEC_OK)
      abort();
    for (uint32_t i = 0; i < n; i++)
      if (kv_section_row_of_token(data, size, pos[i], &row, &err) != KV_CODEC_OK ||
          row != info.n_rows - n + i)
        abort(); /* positions and row lookups agree */
  }
  if (out > KV_FUZZ_MAX_OUT || scr > KV_FUZZ_MAX_OUT)
    return;
  uint8_t *all = xmalloc(out), *part = xmalloc(out), *scratch = xmalloc(scr);
  void *cmem = xmalloc(kv_codec_dctx_bytes());
  kv_codec_dctx *ctx = kv_codec_dctx_init(cmem, kv_codec_dctx_bytes());
  if (ctx == NULL)
    abort();
  kv_codec_dctx_set_stream(ctx, 1); /* streaming stores where the kernels can: same bytes */
  kv_codec_status rc = kv_section_decode(data, size, scratch, scr, all, out, NULL, &err);
  if (kv_section_decode_dctx(ctx, data, size, scratch, scr, part, out, NULL, &err) != rc ||
      (rc == KV_CODEC_OK && memcmp(part, all, out) != 0))
    abort(); /* a decoding context changes nothing but the speed */
  free(cmem);
  if (rc == KV_CODEC_OK) {
    uint8_t *hdr = xmalloc(info.header_bytes);
    memcpy(hdr, data, info.header_bytes);
    for (uint32_t g = 0; g < info.n_groups && g < 64; g++) {
      uint64_t off, len;
      if (kv_section_group_span(hdr, info.header_bytes, g, g + 1, &off, &len, &err) != KV_CODEC_OK ||
          off + len > size)
        abort();
      uint8_t *pl = xmalloc((size_t)len);
      memcpy(pl, data + off, (size_t)len);
      size_t n = kv_section_rows_bytes(&info, g, g + 1);
      size_t at = kv_section_rows_bytes(&info, 0, g + 1) - n;
      if (kv_section_decode_groups(hdr, info.header_bytes, pl, (size_t)len, g, g + 1, scratch, scr,
                                   part, n, &err) != KV_CODEC_OK ||
          memcmp(part, all + at, n) != 0)
        abort(); /* a group decodes alone to the same rows */
      free(pl);
    }
    free(hdr);
  }
  free(all);
  free(part);
  free(scratch);
}

static void each_codec(const uint8_t *data, size_t size)
{
  if (size == 0 || size > (1u << 20))
    return;
  uint8_t *buf = xmalloc(size);
  memcpy(buf, data, size);
  for (size_t i = 0; i < kv_codec_count(); i++) {
    const kv_codec *c = kv_codec_at(i);
    kv_section_info info;
    kv_codec_err err;
    buf[0] = c->id;
    uint32_t g1 = 1;
    size_t hdr = size, out = 1, scr = 64;
    if (kv_section_parse(buf, size, &info, &err) == KV_CODEC_OK) {
      g1 = info.n_groups;
      hdr = info.header_bytes;
      out = kv_section_rows_bytes(&info, 0, g1);
      scr = kv_section_scratch_bytes(&info);
      if (out > KV_FUZZ_MAX_OUT || scr > KV_FUZZ_MAX_OUT)
        continue;
    } else if (kv_section_header_bytes(buf, size, &hdr, &err) != KV_CODEC_OK || hdr > size) {
      hdr = size;
    }
    uint8_t *dst = xmalloc(out), *scratch = xmalloc(scr);
    (void)c->decode(buf, size, buf + hdr, size - hdr, 0, g1, scratch, scr, dst, out, &err);
    free(dst);
    free(scratch);
  }
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  size_t hdr;
  kv_codec_err err;
  generic(data, size);
  each_codec(data, size);
  (void)kv_section_header_bytes(data, size, &hdr, &err);
  return 0;
}
