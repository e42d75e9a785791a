/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_codec_roundtrip.c — arbitrary sections through every encoder and back.
 *
 * Input: 5 config bytes, then elements (little-endian):
 *   [0] dtype = b % 3 + 1          [1] head_dim = b % 64 + 1
 *   [2] page_tokens (0 = default)  [3] zstd level = b % 23 (0 = default)
 *   [4] bit0 V section, bits 1..2 kivi bits (0,1 -> 8, 2 -> 4, 3 -> 2), bit 4 residual of 3 rows,
 *       bit 5 kvquant with per-channel widths (mean width [3] % 7 + 1), bit 6 its K pre-RoPE
 * n_tokens = the whole elements that follow (at least one row).
 * Checks: raw and zstd-planes round trip bit for bit (NaN payloads too) and encode the same
 * bytes twice; kivi and kvquant (codec 5, with or without per-channel widths), when every
 * value is finite and within the fp16 range, encode to exactly bound() bytes and decode; knorm selection + the drop codec return exactly the kept rows.
 * Any violation aborts.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "fuzz_util.h"

/* encode with codec id and params; decode; return the decoded rows (caller frees) or NULL when
 * encode refused the input with EINVAL (e.g. kivi on values it cannot take). */
static uint8_t *roundtrip(unsigned id, const kv_section_shape *s, const void *src, size_t len,
                          const kv_codec_params *p, size_t *out_len, uint32_t *n_rows)
{
  const kv_codec *c = kv_codec_by_id(id);
  kv_codec_err err;
  size_t bound = kv_codec_bound(c, s, p), scr = kv_codec_scratch_bytes(c, s, p, KV_CODEC_OP_ENCODE);
  if (bound == 0 || scr == 0)
    abort(); /* every config built below is valid */
  uint8_t *enc = xmalloc(bound), *enc2 = xmalloc(bound), *scratch = xmalloc(scr);
  size_t n, n2;
  kv_codec_status rc = c->encode(s, src, len, p, scratch, scr, enc, bound, &n, &err);
  if (rc == KV_CODEC_EINVAL && (id == KV_CODEC_ID_KIVI || id == KV_CODEC_ID_KVQUANT)) {
    free(enc);
    free(enc2);
    free(scratch);
    return NULL;
  }
  if (rc != KV_CODEC_OK || n > bound)
    abort();
  if ((id == KV_CODEC_ID_KIVI || id == KV_CODEC_ID_KVQUANT) && n != bound)
    abort(); /* kivi and kvquant sizes are exact */
  if (c->encode(s, src, len, p, scratch, scr, enc2, bound, &n2, &err) != KV_CODEC_OK || n2 != n ||
      memcmp(enc, enc2, n) != 0)
    abort(); /* deterministic */
  kv_section_info info;
  if (kv_section_parse(enc, n, &info, &err) != KV_CODEC_OK || info.section_bytes != n)
    abort();
  *out_len = kv_section_rows_bytes(&info, 0, info.n_groups);
  *n_rows = info.n_rows;
  size_t dscr = kv_section_scratch_bytes(&info);
  uint8_t *dst = xmalloc(*out_len), *ds = xmalloc(dscr);
  if (kv_section_decode(enc, n, ds, dscr, dst, *out_len, NULL, &err) != KV_CODEC_OK)
    abort();
  free(ds);
  free(enc);
  free(enc2);
  free(scratch);
  return dst;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 5)
    return 0;
  kv_codec_dtype dt = (kv_codec_dtype)(data[0] % 3 + 1);
  uint32_t d = data[1] % 64u + 1;
  size_t es = kv_codec_dtype_bytes(dt), row = d * es;
  uint32_t n = (uint32_t)((size - 5) / row);
  if (n == 0 || n > 4096)
    return 0;
  size_t len = (size_t)n * row;
  uint8_t *src = xmalloc(len);
  memcpy(src, data + 5, len); /* little-endian input bytes = host order on LE hosts */
  kv_section_shape s = {dt, (data[4] & 1) ? KV_SECTION_V : KV_SECTION_K, n, d};
  kv_codec_params p;
  kv_codec_params_init(&p);
  p.page_tokens = data[2];

  size_t out;
  uint32_t rows;
  uint8_t *dec = roundtrip(KV_CODEC_ID_RAW, &s, src, len, &p, &out, &rows);
  if (out != len || memcmp(dec, src, len) != 0)
    abort();
  free(dec);
  p.zstd_level = data[3] % 23;
  dec = roundtrip(KV_CODEC_ID_ZSTD_PLANES, &s, src, len, &p, &out, &rows);
  if (out != len || memcmp(dec, src, len) != 0)
    abort();
  free(dec);

  /* kivi: any group size must divide the page for K, so keep the default group */
  static const unsigned bitsel[4] = {8, 8, 4, 2};
  kv_codec_params q;
  kv_codec_params_init(&q);
  q.bits = bitsel[(data[4] >> 1) & 3];
  q.residual = (data[4] & 0x10) && n >= 3 ? 3 : 0;
  dec = roundtrip(KV_CODEC_ID_KIVI, &s, src, len, &q, &out, &rows);
  if (dec != NULL) {
    if (out != len)
      abort();
    if (q.residual && memcmp(dec + len - 3 * row, src + len - 3 * row, 3 * row) != 0)
      abort(); /* residual rows are exact */
    free(dec);
  }

  /* kvquant (default group and pages), uniform or with per-channel widths */
  kv_codec_params k;
  kv_codec_params_init(&k);
  k.bits = q.bits;
  k.residual = q.residual;
  if (data[4] & 0x20) {
    k.alloc = 1;
    k.bits = data[3] % 7u + 1;
  }
  if ((data[4] & 0x40) && s.kind == KV_SECTION_K && d % 2 == 0) {
    k.rope_base = 10000.0f;
    k.rope_style = KV_ROPE_ADJACENT;
    k.rope_pos0 = data[2];
  }
  dec = roundtrip(KV_CODEC_ID_KVQUANT, &s, src, len, &k, &out, &rows);
  if (dec != NULL) {
    if (out != len)
      abort();
    for (size_t i = 0; i < len / es; i++) /* finite decoded values */
      if (es == 4) {
        float f;
        memcpy(&f, dec + 4 * i, 4);
        if (!isfinite(f))
          abort();
      } else {
        uint16_t h;
        memcpy(&h, dec + 2 * i, 2);
        if (dt == KV_CODEC_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u)
          abort();
      }
    free(dec);
  }

  /* knorm selection at 50%, then the drop codec keeps exactly those rows */
  kv_section_shape ks = s;
  ks.kind = KV_SECTION_K;
  size_t scr = kv_drop_scratch_bytes(KV_DROP_KNORM, n, d, NULL);
  void *scratch = xmalloc(scr);
  uint32_t *pos = xmalloc(4 * (size_t)n), nk;
  kv_codec_err err;
  if (kv_drop_select(KV_DROP_KNORM, &ks, src, len, 500, NULL, scratch, scr, pos, n, &nk, &err) !=
      KV_CODEC_OK)
    abort();
  kv_codec_params r;
  kv_codec_params_init(&r);
  r.keep_pos = pos;
  r.n_keep = nk;
  r.keep_permille = 500;
  r.drop_method = KV_DROP_KNORM;
  dec = roundtrip(KV_CODEC_ID_DROP, &s, src, len, &r, &out, &rows);
  if (rows != nk)
    abort();
  for (uint32_t i = 0; i < nk; i++)
    if (memcmp(dec + (size_t)i * row, src + (size_t)pos[i] * row, row) != 0)
      abort();
  free(dec);
  free(pos);
  free(scratch);
  free(src);
  return 0;
}
