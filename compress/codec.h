/* SPDX-License-Identifier: MIT */
/*
 * compress/codec.h — KV-cache section codecs: the header of compress/ for everything above it
 * (codec_int.h is private to the files of compress/ and their unit tests).
 *
 * A SECTION is the KV of one layer x one KV head x K or V: a row-major matrix of n_tokens rows
 * of head_dim elements (f16, bf16 or f32, in host byte order in memory). This module turns a
 * section into self-describing bytes and back, and holds the pure functions the compression
 * policy needs around that: token selection for dropping (knorm, keydiff, snapkv), the
 * byte-plane entropy bound, and the attention-output quality proxy.
 *
 * Everything here is a pure function: no I/O, no global state, no allocation. Work memory is a
 * caller-provided scratch buffer whose size a *_scratch_bytes() function states; outputs go to
 * caller buffers sized by a bound function (zstd's dst/dst_cap/bound shape). Equal inputs give
 * equal bytes (for a given libzstd version), on every machine: the SIMD and the portable
 * decoders produce identical bits. All functions are reentrant; a scratch buffer must not be
 * used by two calls at once. Nothing keeps a pointer to caller memory after returning. The one
 * state that outlives a call is caller-owned and optional: a decoding context (kv_codec_dctx,
 * "DECODING CONTEXT" below), which changes only the speed.
 *
 * CODECS (ids are stored on disk: pinned, never renumbered or reused; 0 is never valid)
 *   1 "raw"          the elements, little-endian. Lossless.
 *   2 "zstd-planes"  each element split into byte planes (plane b = byte b of the little-endian
 *                    element); every plane compressed alone with zstd, stored raw when zstd does
 *                    not make it smaller. Lossless, bit-exact (NaN payloads included).
 *   3 "kivi"         KIVI (Liu et al. 2024) asymmetric min/max quantization to 8, 4 or 2 bits:
 *                    K per channel (a scale/zero pair per channel per `group` tokens), V per token
 *                    (a pair per token per `group` channels); fp16 scale and zero; the last
 *                    `residual` rows are kept in full precision. Lossy, error bound below.
 *   4 "drop"         token dropping: a keep bitmap over the section's tokens plus the kept rows,
 *                    stored raw (bits 0) or KIVI-quantized (bits 8/4/2). The positions come from
 *                    kv_drop_select() run once on K and are used for both K and V of the head.
 *   5 "kvquant"      per-channel quantization of K AND V (KVQuant, Hooper et al. 2024; issue 16):
 *                    a scale/zero pair per channel per `group` tokens (default 128) for both
 *                    kinds, the encoder clipping each channel's range to the one of least
 *                    squared error (bits <= 4), and the last `residual` rows kept at 8 bits
 *                    (one per-channel chunk per page group) instead of full precision. At
 *                    4 bits, group 128, residual 16 of 512 tokens: 4.47 bits per element
 *                    (headers included) against kivi int4's 6.5. Lossy; values a clip range
 *                    cut off saturate (no per-element bound for them), the others keep
 *                    KIVI's bound with the chosen range.
 *
 * KIVI ERROR BOUND. For a quantization unit (one channel x `group` tokens for K; one token x
 * `group` channels for V) with minimum m and maximum M, the stored fp16 zero z is m rounded
 * toward -inf and the stored fp16 scale s is (M - z)/(2^bits - 1) rounded toward +inf, so
 * [z, z + (2^bits-1)s] covers [m, M], and s <= (M - m + u16(m)) / (2^bits - 1) * (1 + 2^-10)
 * + 2^-24: the exact scale plus one fp16 rounding of the scale and of the zero (u16(m) = fp16
 * ulp at |m|). Codes are the nearest integers to (x - z)/s, computed in double. Decoding
 * computes y = code*s + z in float and rounds y to the section dtype, so every element satisfies
 *       |x - decoded(x)| <= s/2 + ulp_f32(|y|)/2 + ulp_dtype(|y|)/2
 * (ulp_dtype: unit in the last place of the section dtype at |y|, 0 for f32); y is clamped
 * to [-65504, 65504] (the range inputs must lie in) first, so every decoded element is finite
 * and still within the bound (a clamp moves y toward x). Residual rows
 * are exact. Quantization needs finite inputs with |x| <= 65504 (the fp16 range of the stored
 * zero point); others give KV_CODEC_EINVAL. tests/unit/test_codec_quant.c asserts this bound.
 *
 * PAGE GROUPS (partial decoding). Each section's rows are cut into GROUPS of `page_tokens` rows
 * (G; the last group may be shorter). Every group is coded on its own — its own zstd frames,
 * its own KIVI scales and zeros (for K, G is a multiple of `group`, so no quantization unit
 * crosses a group) — and the header holds a table of the groups' byte lengths. Decoding the
 * tokens [a, b) therefore reads the header and only the groups a/G .. (b-1)/G
 * (kv_section_group_span() gives their byte range) and decodes just those
 * (kv_section_decode_groups()). Default G: the smallest power of two >= 16 rows whose raw bytes
 * reach 4 KiB — one page, 16 tokens for head_dim 128 in f16 — for raw, kivi and drop (rounded
 * up to a multiple of the KIVI key group: 32 tokens for K by default), and 32 KiB for
 * zstd-planes (128 tokens for head_dim 128 in f16). What it costs: 4 header bytes per group
 * everywhere; for zstd-planes each group also pays a zstd frame and Huffman table per plane,
 * which is why its groups are larger: at 32 KiB the ratio is within ~0.7% of the byte-plane
 * entropy bound and decoding runs near zstd's full speed, whereas 4 KiB groups lose ~2% of ratio
 * and decode at less than half the speed. So a get of one token decodes 4 KiB of a quantized or raw section
 * but 32 KiB (8 pages) of a zstd-planes one. The engine can pick another G per section with
 * kv_codec_params.page_tokens (e.g. 16 tokens for contexts read by sparse top-k gets).
 *
 * ENCODED SECTION LAYOUT — all integers little-endian, written byte by byte (never a struct
 * overlaid on bytes). compress/FORMAT-codecs.md "Compressed sections" is the full spec.
 *
 *   OFF  SIZE  FIELD
 *     0    1   codec_id       1 raw, 2 zstd-planes, 3 kivi, 4 drop
 *     1    1   version        KV_SECTION_VERSION (1)
 *     2    1   dtype          1 f16, 2 bf16, 3 f32 (= kvdb_dtype)
 *     3    1   flags          bit0 0 = K section, 1 = V section; kvquant: bit 1 pre-RoPE K,
 *                             bit 2 its half pairs, bit 3 per-channel widths; others 0
 *     4    4   n_tokens       tokens of the original section, 1 .. KV_CODEC_MAX_TOKENS
 *     8    4   head_dim       1 .. KV_CODEC_MAX_HEAD_DIM
 *    12    4   n_rows         rows stored and decoded: n_tokens, or the kept tokens (drop)
 *    16    4   page_tokens    G, rows per group, 1 .. KV_CODEC_MAX_PAGE_TOKENS
 *    20    1   bits           0, or 8 / 4 / 2 (kivi, kvquant; drop with quantized rows);
 *                             kvquant with per-channel widths: 1..7, the mean width
 *    21    1   drop_method    0, or 1 knorm / 2 keydiff / 3 snapkv (drop)
 *    22    2   group          quantization group (K: tokens, V: channels); 0 when bits = 0
 *    24    4   residual       last rows kept in full precision (kivi, quantized drop); else 0
 *    28    2   keep_permille  drop: keep ratio x 1000 (1 .. 1000); else 0
 *    30    1   zstd_level     zstd-planes: signed, -7 .. 22, not 0; else 0
 *    31    1   reserved       0
 *    32    B   keep bitmap    drop only: B = ceil(n_tokens / 8); bit (t % 8) of byte t/8 set =
 *                             token t kept; bits past n_tokens are 0; n_rows bits are set
 *   32+B  4N   group table    N = ceil(n_rows / G) u32 group payload lengths
 *    ...       group payloads, in order, with no gaps and nothing after the last
 *
 * Group payloads (t = rows in the group, d = head_dim, e = element bytes):
 *   raw          t*d elements, little-endian
 *   zstd-planes  e u32 plane lengths L[0..e-1], then the e planes; plane p holds byte p of each
 *                of the t*d elements; L[p] == t*d means stored raw, L[p] < t*d means one or more
 *                zstd frames that decode to exactly t*d bytes
 *   kivi, drop with bits 8/4/2
 *                [scales and zeros][codes][raw rows]; q = rows of the group below n_rows -
 *                residual are quantized; scales and zeros are fp16:
 *                  K: for each chunk c of up to `group` rows (rows c*group ..): d scales, then
 *                     d zeros (one per channel)
 *                  V: for each quantized row: ng scales, then ng zeros, ng = ceil(d/group)
 *                codes: q rows x ceil(d*bits/8) bytes; code of channel j at bit (j*bits) % 8
 *                of byte j*bits/8 (low bits first); padding bits are 0
 *                raw rows: (t - q) rows x d elements, little-endian
 *   drop, bits 0 t*d elements of the kept rows, little-endian
 *
 * ERRORS. Every fallible function returns a kv_codec_status and fills an optional
 * kv_codec_err (NULL allowed) naming what was wrong; kv_codec_errmsg() formats it. Decoders
 * treat their input as untrusted: anything malformed is KV_CODEC_ECORRUPT, never a crash,
 * never a read outside [src, src + src_len).
 */
#ifndef KV_CODEC_H
#define KV_CODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status and error detail                                                                     */

/** Status of every fallible function of this module. Values are pinned. */
typedef enum kv_codec_status {
  KV_CODEC_OK = 0,
  KV_CODEC_EINVAL = 1,   /**< bad argument or a configuration the shape cannot take */
  KV_CODEC_ECORRUPT = 2, /**< decoder input malformed: truncated, oversized, unknown id, bad header */
  KV_CODEC_ETOOSMALL = 3,/**< dst too small; kv_codec_err.limit holds the size that suffices */
  KV_CODEC_ENOMEM = 4,   /**< scratch smaller than the *_scratch_bytes() it needs */
} kv_codec_status;

/**
 * What went wrong, filled by the failing function when its `err` argument is not NULL (left
 * untouched on success). `what` is a static string naming the problem ("group table entry
 * exceeds the section"); `value` is the offending number and `limit` the bound it broke (0 when
 * meaningless); file and line locate the check. Caller-owned; no pointer into caller memory.
 */
typedef struct kv_codec_err {
  kv_codec_status code;
  const char *what;
  uint64_t value;
  uint64_t limit;
  const char *file;
  int line;
} kv_codec_err;

/** @brief Static name of a status, e.g. "KV_CODEC_ECORRUPT". Never NULL. Cannot fail. */
const char *kv_codec_status_name(kv_codec_status rc);

/**
 * @brief Write a one-line message naming what was wrong into buf (always NUL-terminated when
 * cap > 0), e.g. "corrupt section: group table entry exceeds the section (value 70000,
 * limit 1234) [compress/codec.c:412]". err NULL or err->code OK gives "ok".
 * @return the length of the full message (snprintf rule: >= cap means it was cut). Cannot fail.
 */
size_t kv_codec_errmsg(const kv_codec_err *err, char *buf, size_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Elements and shapes                                                                         */

/** Element type. Values equal kvdb_dtype's and are stored on disk. */
typedef enum kv_codec_dtype { KV_CODEC_F16 = 1, KV_CODEC_BF16 = 2, KV_CODEC_F32 = 3 } kv_codec_dtype;

/** Which half of the head a section holds; it chooses the KIVI quantization axis. */
typedef enum kv_section_kind { KV_SECTION_K = 0, KV_SECTION_V = 1 } kv_section_kind;

#define KV_CODEC_MAX_TOKENS (1u << 30)      /**< n_tokens limit */
#define KV_CODEC_MAX_HEAD_DIM 65536u        /**< head_dim limit */
#define KV_CODEC_MAX_PAGE_TOKENS 65536u     /**< page_tokens limit; also G*row bytes <= 2^30 */
#define KV_SECTION_VERSION 1                /**< section format version this build writes/reads */
#define KV_SECTION_FIXED_BYTES 32           /**< bytes of the fixed header */

/** The shape of one section. Passed by pointer; never retained. */
typedef struct kv_section_shape {
  kv_codec_dtype dtype;
  kv_section_kind kind;
  uint32_t n_tokens; /**< rows of the section, >= 1 */
  uint32_t head_dim; /**< elements per row, >= 1 */
} kv_section_shape;

/** @brief Bytes of one element of dtype, or 0 for an unknown dtype. Cannot fail. */
size_t kv_codec_dtype_bytes(kv_codec_dtype dtype);

/* Exact conversions (round to nearest even; NaN stays NaN with its sign; overflow gives inf).
 * These are the conversions every codec uses, so callers can reproduce decoder output. */
float kv_codec_f16_to_f32(uint16_t h);
uint16_t kv_codec_f32_to_f16(float f);
float kv_codec_bf16_to_f32(uint16_t b);
uint16_t kv_codec_f32_to_bf16(float f);

/** @brief Convert n elements of dtype (host order) at src to float. Unknown dtype: no-op. */
void kv_codec_to_f32(kv_codec_dtype dtype, const void *src, size_t n, float *dst);
/** @brief Convert n floats to dtype elements (host order) at dst. Unknown dtype: no-op. */
void kv_codec_from_f32(kv_codec_dtype dtype, const float *src, size_t n, void *dst);

/* ------------------------------------------------------------------------------------------ */
/* Parameters                                                                                  */

/** Token-dropping method; stored in the drop codec's header. Values are pinned. */
typedef enum kv_drop_method {
  KV_DROP_NONE = 0,
  KV_DROP_KNORM = 1,   /**< keep the keys with the lowest L2 norm (Devoto et al. 2024) */
  KV_DROP_KEYDIFF = 2, /**< keep the keys least similar (cosine) to the mean key (Park et al. 2025) */
  KV_DROP_SNAPKV = 3,  /**< keep the keys the observation window attends to most (Li et al. 2024) */
} kv_drop_method;

#define KV_CODEC_ZSTD_LEVEL_DEFAULT 3
#define KV_CODEC_GROUP_DEFAULT 32
#define KV_CODEC_KVQ_GROUP_DEFAULT 128 /**< kvquant: tokens per scale/zero pair, K and V */

/**
 * Encoding parameters. Fill with kv_codec_params_init(), then change fields. A field a codec
 * does not use must keep its init value (0), else the encoder returns KV_CODEC_EINVAL — so a
 * config cannot silently mean something else. Zero means "default" where noted.
 */
typedef struct kv_codec_params {
  int zstd_level;         /**< zstd-planes: -7..22; 0 = KV_CODEC_ZSTD_LEVEL_DEFAULT */
  unsigned bits;          /**< kivi: 8, 4 or 2 (required); drop: 0 = rows raw, or 8/4/2 */
  unsigned group;         /**< kivi/drop+quant: K tokens / V channels per scale-zero pair;
                               0 = KV_CODEC_GROUP_DEFAULT (clipped to head_dim for V) */
  unsigned residual;      /**< kivi/drop+quant: last rows kept in full precision (<= rows) */
  unsigned keep_permille; /**< drop: keep ratio x 1000, 1..1000 (required; recorded) */
  kv_drop_method drop_method; /**< drop: the method that chose the positions (recorded) */
  unsigned page_tokens;   /**< rows per independently decodable group; 0 = default rule above */
  const uint32_t *keep_pos; /**< drop, encode only: the kept positions, strictly increasing,
                                 < n_tokens (from kv_drop_select()); read, not retained */
  uint32_t n_keep;        /**< drop: entries of keep_pos */
  unsigned sink;          /**< kvquant: the section's first rows (0..255, attention sinks, as
                               KVQuant keeps the first token) stored at 8 bits; else 0 */
  /* kvquant K sections, optional: quantize K before RoPE (KVQuant's pre-RoPE keys). The
   * encoder un-rotates row r by the angles of token position rope_pos0 + r, the decoder
   * re-rotates; keys then keep their per-channel structure instead of spinning through it.
   * rope_base 0 = off (and the other two 0); else base (1 < base <= 1e9, finite; head_dim
   * even), style KV_ROPE_ADJACENT (pairs 2i, 2i+1: llama2.c, GPT-J) or KV_ROPE_HALF (pairs i,
   * i + d/2: NeoX, HF Llama), and the first row's position (rope_pos0 + n_tokens <= 2^31). */
  float rope_base;
  unsigned rope_style;
  uint32_t rope_pos0;
  /* kvquant at 4 or 2 bits, optional (issue 16): per-channel bit allocation (flags bit 3).
   * Each quantized chunk of `group` rows spends bits x 8 bits per row on every block of 8
   * channels, split among them by least squared error (0..8 bits a channel: wide channels get
   * more, near-constant ones fewer); the widths are stored with the chunk's scales.
   * 0 = off (every channel `bits` wide: codec 5's first layout), 1 = on. */
  unsigned alloc;
  /* with alloc, encode only, optional: each channel's sensitivity (head_dim finite floats >= 0,
   * read, not retained), the weight of its squared error in the allocation — KVQuant's
   * sensitivity weighting; for K, the mean square of the queries that meet it (calibration
   * data, never the queries a quality probe uses). NULL = every channel alike. */
  const float *chan_weight;
} kv_codec_params;

#define KV_ROPE_ADJACENT 1
#define KV_ROPE_HALF 2

/** @brief Set every field to its default (levels/groups 0 = default, bits 0, no drop). */
void kv_codec_params_init(kv_codec_params *p);

/* ------------------------------------------------------------------------------------------ */
/* The codec interface and the registry                                                        */

#define KV_CODEC_ID_RAW 1
#define KV_CODEC_ID_ZSTD_PLANES 2
#define KV_CODEC_ID_KIVI 3
#define KV_CODEC_ID_DROP 4
#define KV_CODEC_ID_KVQUANT 5

#define KV_CODEC_LOSSLESS 1u     /**< decode(encode(x)) == x, bit for bit */
#define KV_CODEC_LOSSY 2u        /**< values change within a stated bound */
#define KV_CODEC_DROPS_TOKENS 4u /**< decodes fewer rows than tokens; positions are stored */

typedef enum kv_codec_op { KV_CODEC_OP_ENCODE = 1, KV_CODEC_OP_DECODE = 2 } kv_codec_op;

struct kv_section_info;

/**
 * One codec. The members are the implementation; every member validates its own arguments, so
 * calling them directly is as safe as the kv_codec_* / kv_section_* wrappers below.
 *
 * bound(shape, params): the largest encoded size for any data of that shape, or 0 when the
 *   shape or params are invalid. A dst of bound() bytes never gives KV_CODEC_ETOOSMALL.
 *   (drop: sized for params.n_keep rows, or kv_drop_keep_count(keep_permille) when n_keep is 0;
 *   keep_pos may be NULL for bound and scratch_bytes, never for encode.)
 * scratch_bytes(shape, params, op): scratch that encode (op ENCODE) or decode (op DECODE)
 *   needs, or 0 when invalid. For decode pass the shape and params of kv_section_info.
 * encode: section src (src_len = n_tokens*head_dim*element bytes) -> dst; *out_len = bytes
 *   written. EINVAL (bad shape/params/src_len, e.g. a group larger than the tokens), ENOMEM
 *   (scratch too small), ETOOSMALL (dst too small; err->limit = bound()). dst is garbage on
 *   error.
 * decode: groups [g0, g1) of a section: `hdr` is the section's first hdr_len bytes (at least
 *   its header, see kv_section_info.header_bytes; it may be the whole section); `payload` is
 *   the payload_len bytes of groups g0..g1-1 (kv_section_group_span()). Writes rows
 *   g0*G .. min(g1*G, n_rows)-1 to dst, row-major, in the section dtype, host order.
 *   ECORRUPT (malformed, or the header names another codec), ETOOSMALL, ENOMEM, EINVAL
 *   (g0 >= g1 or g1 > n_groups).
 */
typedef struct kv_codec {
  uint8_t id;        /**< on-disk id, KV_CODEC_ID_* */
  const char *name;  /**< "raw", "zstd-planes", "kivi", "drop" */
  unsigned flags;    /**< KV_CODEC_LOSSLESS / _LOSSY / _DROPS_TOKENS */
  size_t (*bound)(const kv_section_shape *shape, const kv_codec_params *p);
  size_t (*scratch_bytes)(const kv_section_shape *shape, const kv_codec_params *p, kv_codec_op op);
  kv_codec_status (*encode)(const kv_section_shape *shape, const void *src, size_t src_len,
                            const kv_codec_params *p, void *scratch, size_t scratch_cap, void *dst,
                            size_t dst_cap, size_t *out_len, kv_codec_err *err);
  kv_codec_status (*decode)(const void *hdr, size_t hdr_len, const void *payload,
                            size_t payload_len, uint32_t g0, uint32_t g1, void *scratch,
                            size_t scratch_cap, void *dst, size_t dst_cap, kv_codec_err *err);
  /* Codec-specific header checks, called by kv_section_parse() once the common fields are
   * valid: hdr is the section start, at least info->header_bytes long (bitmap, group table). */
  kv_codec_status (*check)(const struct kv_section_info *info, const uint8_t *hdr,
                           kv_codec_err *err);
} kv_codec;

/** @brief The codec with on-disk id `id`, or NULL when unknown. Cannot fail. */
const kv_codec *kv_codec_by_id(unsigned id);
/** @brief The codec named `name` (exact match), or NULL. Cannot fail. */
const kv_codec *kv_codec_by_name(const char *name);
/** @brief Number of registered codecs; kv_codec_at(i) for i < count. Cannot fail. */
size_t kv_codec_count(void);
/** @brief The i-th registered codec (ascending id), or NULL when i >= kv_codec_count(). */
const kv_codec *kv_codec_at(size_t i);

/** @brief c->bound(shape, p); 0 when c is NULL or the arguments are invalid. */
size_t kv_codec_bound(const kv_codec *c, const kv_section_shape *shape, const kv_codec_params *p);
/** @brief c->scratch_bytes(shape, p, op); 0 when c is NULL or the arguments are invalid. */
size_t kv_codec_scratch_bytes(const kv_codec *c, const kv_section_shape *shape,
                              const kv_codec_params *p, kv_codec_op op);
/** @brief c->encode(...); EINVAL when c is NULL. See kv_codec for the contract. */
kv_codec_status kv_codec_encode(const kv_codec *c, const kv_section_shape *shape, const void *src,
                                size_t src_len, const kv_codec_params *p, void *scratch,
                                size_t scratch_cap, void *dst, size_t dst_cap, size_t *out_len,
                                kv_codec_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Reading encoded sections                                                                    */

/** What a section header says, after validation by kv_section_parse(). */
typedef struct kv_section_info {
  uint8_t codec_id;
  uint8_t version;
  kv_section_shape shape;  /**< the original section */
  uint32_t n_rows;         /**< rows decode yields: n_tokens, or kept tokens for drop */
  uint32_t n_groups;       /**< ceil(n_rows / params.page_tokens) */
  kv_codec_params params;  /**< as stored, defaults resolved; keep_pos NULL, n_keep = n_rows
                                for drop */
  size_t header_bytes;     /**< fixed header + keep bitmap + group table */
  uint64_t section_bytes;  /**< header_bytes + all group payloads */
} kv_section_info;

/**
 * @brief Bytes of header (fixed part + bitmap + group table) of the section starting at src,
 * from its first KV_SECTION_FIXED_BYTES bytes — for reading a header before the payloads.
 * @return OK, or ECORRUPT (src_len < KV_SECTION_FIXED_BYTES, or fields out of range).
 */
kv_codec_status kv_section_header_bytes(const void *src, size_t src_len, size_t *out,
                                        kv_codec_err *err);

/**
 * @brief Validate the header of the section at src (src_len >= header_bytes; the payloads
 * need not be present) and describe it in *info. Checks every field, reserved bits, the keep
 * bitmap and each group-table entry against what the codec can produce.
 * @return OK, ECORRUPT (unknown codec id, bad version or field, truncated header, oversized
 * lengths), EINVAL (NULL pointers).
 */
kv_codec_status kv_section_parse(const void *src, size_t src_len, kv_section_info *info,
                                 kv_codec_err *err);

/** @brief Decode scratch for this section: its codec's scratch_bytes(DECODE). 0 when invalid. */
size_t kv_section_scratch_bytes(const kv_section_info *info);

/** @brief Bytes a decode of groups [g0, g1) writes; 0 when the range is invalid. */
size_t kv_section_rows_bytes(const kv_section_info *info, uint32_t g0, uint32_t g1);

/**
 * @brief Decode a whole section: src_len must be exactly info.section_bytes. dst receives
 * n_rows x head_dim elements (dst_cap >= kv_section_rows_bytes(info, 0, n_groups)).
 * `info` may be NULL; when not NULL it receives the parsed header.
 * @return OK, ECORRUPT, ETOOSMALL, ENOMEM, EINVAL.
 */
kv_codec_status kv_section_decode(const void *src, size_t src_len, void *scratch,
                                  size_t scratch_cap, void *dst, size_t dst_cap,
                                  kv_section_info *info, kv_codec_err *err);

/**
 * @brief Byte range [*off, *off + *len) of groups [g0, g1) within the section (offsets from
 * the section start). hdr holds at least the header. @return OK, EINVAL, ECORRUPT.
 */
kv_codec_status kv_section_group_span(const void *hdr, size_t hdr_len, uint32_t g0, uint32_t g1,
                                      uint64_t *off, uint64_t *len, kv_codec_err *err);

/** @brief Decode groups [g0, g1) through the codec named in hdr. See kv_codec.decode. */
kv_codec_status kv_section_decode_groups(const void *hdr, size_t hdr_len, const void *payload,
                                         size_t payload_len, uint32_t g0, uint32_t g1,
                                         void *scratch, size_t scratch_cap, void *dst,
                                         size_t dst_cap, kv_codec_err *err);

/*
 * DECODING CONTEXT (optional). zstd-planes decodes with a zstd context (ZSTD_DCtx). Without a
 * kv_codec_dctx, every decode call builds one in its scratch, and building one runs libzstd's
 * CPU feature check (CPUID instructions): well under a microsecond on bare metal, but 20 us in
 * virtual machines where CPUID traps to the hypervisor (measured on the reference VM: 9 us per
 * CPUID; longer than decoding a whole 8 KiB section). A caller that decodes many sections keeps
 * one kv_codec_dctx per thread and passes it to the *_dctx functions, which then build nothing.
 * The context also carries the choice of output stores (kv_codec_dctx_set_stream()), and the
 * angle tables of kvquant's pre-RoPE keys (cos and sin per position and pair, built on first use
 * and reused by every layer and head at the same positions; a decode through a context writes
 * them, so a context serves one thread at a time, as its zstd state already requires). Output
 * is identical with or without a context.
 *
 * A context lives in caller memory of kv_codec_dctx_bytes() (any alignment; it is aligned
 * inside); kv_codec_dctx_init() makes it one. It points only into that memory (so it must not
 * be copied elsewhere) and owns no resources: the memory may be freed or reused at any time
 * between calls. One thread at a time; a failed decode leaves it valid.
 */
typedef struct kv_codec_dctx kv_codec_dctx;

/** @brief Bytes of memory a kv_codec_dctx needs (alignment slack included). Cannot fail. */
size_t kv_codec_dctx_bytes(void);

/**
 * @brief Make the cap bytes at mem a decoding context. @return the context (inside mem), or NULL
 * when mem is NULL or cap < kv_codec_dctx_bytes().
 */
kv_codec_dctx *kv_codec_dctx_init(void *mem, size_t cap);

/**
 * @brief How decoders through ctx write their output. stream = 0 (the default): ordinary
 * stores, which leave the decoded rows in the CPU cache for a consumer that reads them next.
 * stream = 1: non-temporal (streaming) stores where a kernel can — the AVX2 dequantizers of
 * kivi and quantized drop sections, when dst and the rows are 16-byte aligned — for large
 * outputs nobody reads soon (a get of a whole context into the caller's buffer): they skip
 * the read-for-ownership of every output cache line, a third of the memory traffic of an
 * int4 decode, and each decode call ends with a store fence, so its rows are ordered before
 * anything the caller does next. Calls that write less than 64 KiB keep ordinary stores (the
 * fence would cost more than the stores save). Worth it only when the output does not stay
 * in the caches: on the reference VM, int4 on 256 KiB sections into 134 MB went from ~7.6 to
 * ~8.9 GB/s, while cache-resident outputs got slower. Same bytes either way. Cannot fail;
 * ctx NULL is a no-op.
 */
void kv_codec_dctx_set_stream(kv_codec_dctx *ctx, int stream);

/** @brief kv_section_decode() through a context (ctx NULL: the same as kv_section_decode()). */
kv_codec_status kv_section_decode_dctx(kv_codec_dctx *ctx, const void *src, size_t src_len,
                                       void *scratch, size_t scratch_cap, void *dst,
                                       size_t dst_cap, kv_section_info *info, kv_codec_err *err);

/**
 * @brief Decode the first n_rows rows of a whole section (src_len exactly its section_bytes)
 * into a strided output: row r at dst + r * dst_stride (dst_stride >= head_dim x element
 * bytes; the rows between are not touched), so a get can decode straight into a caller's
 * layout (a token-major [token][head][dim] buffer: the stride of a token) instead of into
 * contiguous rows and a copy. Codecs raw, kivi and kvquant only (the others give EINVAL: their
 * callers decode contiguous rows). The page groups wholly inside [0, n_rows) are decoded in
 * place; a group that n_rows cuts is decoded into the scratch and its first rows copied, so
 * scratch_cap must be kv_section_rows_scratch_bytes(info, n_rows). Same bytes as
 * kv_section_decode_dctx() gives for those rows. `info` may be NULL; when not NULL it
 * receives the parsed header. @return OK, ECORRUPT, ENOMEM, EINVAL (codec, n_rows above the
 * section's rows, dst_stride below a row, NULL pointers).
 */
kv_codec_status kv_section_decode_rows_dctx(kv_codec_dctx *ctx, const void *src, size_t src_len,
                                            uint32_t n_rows, void *scratch, size_t scratch_cap,
                                            void *dst, size_t dst_stride, kv_section_info *info,
                                            kv_codec_err *err);

/** @brief kv_section_decode_rows_dctx() of a section whose header the caller has parsed:
 * `info` must be what kv_section_parse() gave for these src_len bytes at src (a get checks
 * each section against its block first; this saves parsing it twice). */
kv_codec_status kv_section_decode_rows_parsed(kv_codec_dctx *ctx, const kv_section_info *info,
                                              const void *src, size_t src_len, uint32_t n_rows,
                                              void *scratch, size_t scratch_cap, void *dst,
                                              size_t dst_stride, kv_codec_err *err);

/** @brief Scratch of kv_section_decode_rows_dctx() for the first n_rows rows of a section;
 * 0 when info is invalid. */
size_t kv_section_rows_scratch_bytes(const kv_section_info *info, uint32_t n_rows);

/** @brief Whether kv_section_decode_rows_dctx() decodes sections of this codec id. */
int kv_section_decodes_strided(uint8_t codec_id);

/** @brief kv_section_decode_groups() through a context (ctx NULL: the same). */
kv_codec_status kv_section_decode_groups_dctx(kv_codec_dctx *ctx, const void *hdr, size_t hdr_len,
                                              const void *payload, size_t payload_len, uint32_t g0,
                                              uint32_t g1, void *scratch, size_t scratch_cap,
                                              void *dst, size_t dst_cap, kv_codec_err *err);

/**
 * @brief Token positions of decoded rows [row0, row0 + n): pos[i] = token of row row0 + i
 * (the identity unless the section drops tokens). @return OK, EINVAL (range), ECORRUPT.
 */
kv_codec_status kv_section_positions(const void *hdr, size_t hdr_len, uint32_t row0, uint32_t n,
                                     uint32_t *pos, kv_codec_err *err);

#define KV_SECTION_DROPPED UINT32_MAX

/**
 * @brief The decoded row holding token `token` (*row = KV_SECTION_DROPPED when the token was
 * dropped); its group is *row / params.page_tokens. @return OK, EINVAL (token >= n_tokens),
 * ECORRUPT.
 */
kv_codec_status kv_section_row_of_token(const void *hdr, size_t hdr_len, uint32_t token,
                                        uint32_t *row, kv_codec_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Lossless: the byte-plane entropy bound                                                      */

/**
 * @brief The order-0 byte-plane entropy bound of a section, in bytes: for each byte plane
 * (byte b of every little-endian element), its length times its empirical Shannon entropy
 * (bits per byte) / 8, summed over planes. No coder that models bytes of one plane
 * independently of one another can do better; raw_bytes / bound is the "entropy bound ratio".
 * @return OK, EINVAL.
 */
kv_codec_status kv_lossless_entropy_bound(const kv_section_shape *shape, const void *src,
                                          size_t src_len, double *out_bytes, kv_codec_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Token dropping: choosing the positions                                                      */

/** @brief Kept tokens at keep_permille / 1000: ceil(n * permille / 1000), at least 1; 0 when
 * n is 0 or permille is outside 1..1000. Cannot fail. */
uint32_t kv_drop_keep_count(uint32_t n_tokens, unsigned keep_permille);

/**
 * @brief Kept tokens of the block of n_tokens tokens that starts at token t0 of its context,
 * so that a context's kept tokens honour the ratio exactly (issue 16): with R(x) =
 * floor((x * permille + 500) / 1000) (x * permille / 1000 rounded half up), the block keeps
 * R(t0 + n) - R(t0), at least 1. The blocks [0, T) of a context thus keep R(T) tokens, unless
 * a block's share rounds to none (then it keeps 1: a ratio under 1 token per block, or a short
 * last block). 0 when n is 0, permille is outside 1..1000 or t0 + n exceeds 2^53. Cannot fail.
 */
uint32_t kv_drop_keep_span(uint64_t t0, uint32_t n_tokens, unsigned keep_permille);

typedef enum kv_pool { KV_POOL_MAX = 0, KV_POOL_AVG = 1 } kv_pool;

#define KV_SNAPKV_KERNEL_DEFAULT 7

/**
 * SnapKV's observation window for one KV head: the last queries of the prompt, in the same
 * rotary/scaling state as the keys. q is float [n_obs][n_q_heads][head_dim]; n_q_heads is the
 * number of query heads that share this KV head (GQA group size).
 *
 * Scores: for every query row, softmax(q . K^T / sqrt(head_dim)) over the keys; summed over
 * the n_obs x n_q_heads rows; then a 1-D pool of width `kernel` (odd; 0 = 7), stride 1, padding
 * kernel/2 (max pool, or average pool counting the padding as zeros as F.avg_pool1d does);
 * the top-scoring keys are kept.
 * With tail_window = 1 the queries are the section's own last n_obs tokens, as in SnapKV's
 * prefill (Li et al. 2024, Alg. 1): query j, at token n_tokens - n_obs + j, sees only the keys
 * up to itself (causal mask); scores and pooling cover the keys before the window; the window
 * tokens are always kept and the other kept tokens are the prefix's best. When fewer tokens are
 * kept than the window holds, the most recent ones are kept.
 */
typedef struct kv_snapkv_window {
  const float *q;
  uint32_t n_obs;
  uint32_t n_q_heads;
  unsigned kernel;
  kv_pool pool;
  int tail_window;
} kv_snapkv_window;

/** @brief Scratch kv_drop_select() needs; 0 when arguments are invalid. */
size_t kv_drop_scratch_bytes(kv_drop_method m, uint32_t n_tokens, uint32_t head_dim,
                             const kv_snapkv_window *win);

/**
 * @brief Choose the tokens to keep for one KV head from its K section (shape->kind must be
 * KV_SECTION_K); encode both the K and the V section of the head with the drop codec and
 * params.keep_pos = keep_pos, so the selection is computed once.
 *
 * knorm: score = -||k_t||; keydiff: score = -cos(k_t, a) with a = mean of k_t/||k_t|| (cos = 0
 * for a zero key; ranks tokens exactly as the mean cosine similarity to all other keys does);
 * snapkv: see kv_snapkv_window (win required for snapkv, must be NULL otherwise). The
 * kv_drop_keep_count() tokens with the highest scores are kept; ties keep the earlier token;
 * a NaN score ranks lowest. Norms and cosines are computed in double.
 * keep_pos receives the kept positions in increasing order (keep_cap >= the keep count).
 * @return OK, EINVAL (method, shape, permille, window, caps), ENOMEM (scratch).
 */
kv_codec_status kv_drop_select(kv_drop_method m, const kv_section_shape *shape, const void *k,
                               size_t k_len, unsigned keep_permille, const kv_snapkv_window *win,
                               void *scratch, size_t scratch_cap, uint32_t *keep_pos,
                               uint32_t keep_cap, uint32_t *n_keep, kv_codec_err *err);

/**
 * @brief kv_drop_select() keeping exactly `keep` tokens (1..n_tokens) instead of
 * kv_drop_keep_count(n_tokens, permille): the engine's context-exact counts
 * (kv_drop_keep_span()). Same selection rule, arguments and errors (EINVAL: keep 0 or more than
 * the tokens).
 */
kv_codec_status kv_drop_select_n(kv_drop_method m, const kv_section_shape *shape, const void *k,
                                 size_t k_len, uint32_t keep, const kv_snapkv_window *win,
                                 void *scratch, size_t scratch_cap, uint32_t *keep_pos,
                                 uint32_t keep_cap, uint32_t *n_keep, kv_codec_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Quality: attention-output fidelity                                                          */

/**
 * Quality of a decoded head against the original, on probe queries q (float [n][head_dim]):
 * o(q) = softmax(q . K^T / sqrt(head_dim)) . V over the original rows, o'(q) the same over the
 * decoded rows (dropped tokens simply absent).
 *   cos_mean = mean over probes of cos(o, o') (1 when both are zero, 0 when one is)
 *   cos_min  = the smallest of those cosines
 *   rel_l2   = sqrt(sum ||o - o'||^2 / sum ||o||^2) over probes (0 when both sums are 0)
 */
typedef struct kv_quality {
  double cos_mean;
  double cos_min;
  double rel_l2;
  uint32_t n_probes;
} kv_quality;

#define KV_QUALITY_DERIVED_RECENT 8
#define KV_QUALITY_DERIVED_SPREAD 8
#define KV_QUALITY_MAX_DERIVED (KV_QUALITY_DERIVED_RECENT + KV_QUALITY_DERIVED_SPREAD)

/**
 * @brief Probe queries derived from the context itself, used when the caller has none: the
 * keys of the last 8 tokens (what a decoder's next queries resemble: recent tokens) plus the
 * keys at the evenly spaced tokens floor(j * n / 8), j = 0..7, that are not among those
 * (coverage of the whole context), as float rows in that order; n <= 16 gives every key, in
 * token order. Each probe keeps its key's direction and is scaled to norm sqrt(head_dim), the
 * norm of a unit-variance query: raw keys carry the head's large outlier-channel means, so
 * q.k would track |k|^2 and turn the softmax into a near-argmax that exaggerates every error
 * (on the synthetic KV of the tests int4 scores ~0.985 with raw keys, ~0.994 normalized, 0.999
 * with random unit-variance queries). Keys stand in for queries because both live in the head's
 * rotary frame, and they reward keeping tokens like the recent ones; a caller with real
 * queries (e.g. the prompt's last ones) should pass those instead. A zero key stays zero.
 * probes must hold KV_QUALITY_MAX_DERIVED rows of head_dim floats.
 * @return OK, EINVAL.
 */
kv_codec_status kv_quality_derive_probes(const kv_section_shape *k_shape, const void *k,
                                         size_t k_len, float *probes, uint32_t probes_cap,
                                         uint32_t *n_probes, kv_codec_err *err);

/** @brief Scratch kv_quality_attend() needs for n_rows rows and n_probes probes. */
size_t kv_quality_attend_scratch_bytes(uint32_t n_rows, uint32_t head_dim, uint32_t n_probes);

/**
 * @brief Attention outputs out[p] = softmax(q_p . K^T / sqrt(d)) . V (float [n_probes][d])
 * over n_rows rows of K and V in dtype (host order). Logits and outputs in float, softmax sums
 * in double. Compute the original head's outputs once and compare many decodings against them.
 * @return OK, EINVAL, ENOMEM.
 */
kv_codec_status kv_quality_attend(kv_codec_dtype dtype, uint32_t n_rows, uint32_t head_dim,
                                  const void *k, const void *v, const float *probes,
                                  uint32_t n_probes, void *scratch, size_t scratch_cap, float *out,
                                  kv_codec_err *err);

/** @brief Compare two sets of attention outputs (float [n_probes][head_dim]). OK, EINVAL. */
kv_codec_status kv_quality_compare(const float *ref, const float *test, uint32_t n_probes,
                                   uint32_t head_dim, kv_quality *q, kv_codec_err *err);

/** @brief Scratch kv_quality_attention() needs (n_probes 0 = derived probes). */
size_t kv_quality_scratch_bytes(uint32_t n_tokens, uint32_t head_dim, uint32_t n_probes);

/**
 * @brief The whole measurement for one head: original K and V (shape: n_tokens rows, the same
 * dtype for K and V; shape->kind is ignored), decoded rows k_dec/v_dec (n_dec rows, same dtype),
 * probes float [n_probes][head_dim] or NULL with n_probes 0 to derive them from the original K
 * (kv_quality_derive_probes()).
 * @return OK, EINVAL, ENOMEM.
 */
kv_codec_status kv_quality_attention(const kv_section_shape *shape, const void *k, const void *v,
                                     uint32_t n_dec, const void *k_dec, const void *v_dec,
                                     const float *probes, uint32_t n_probes, void *scratch,
                                     size_t scratch_cap, kv_quality *q, kv_codec_err *err);

/*
 * THE CAUSAL METRIC (issue 16). What a model sees of a stored context: queries at positions
 * spread over the whole context (not the last ones, which SnapKV also uses to choose what to
 * keep), each attending causally to the keys at positions <= its own, over all of the
 * context's keys as stored (dropped ones absent, quantized ones decoded). Per head: the
 * attention outputs over the decoded rows against those over the original rows, compared by
 * kv_quality_compare() (mean cosine over the probes, relative L2). A context's quality is the
 * mean over heads; the worst head is reported beside it. The probes are the model's real
 * queries at those positions when the caller has them (kvdb_put_opts.probe_queries), else the
 * keys at those positions scaled to norm sqrt(head_dim) (kv_quality_spread_probes()).
 */
#define KV_QUALITY_SPREAD_PROBES 64 /**< probe positions of the causal metric */

/**
 * @brief n_probes positions spread evenly over [0, n_tokens): floor((2j+1) n / (2 n_probes)),
 * j = 0..n_probes-1 (every position when n_probes >= n_tokens), increasing, into pos.
 * @return how many (0 when an argument is 0 or NULL). Cannot fail.
 */
uint32_t kv_quality_probe_positions(uint32_t n_tokens, uint32_t n_probes, uint32_t *pos);

/** @brief Scratch kv_quality_causal_attend() needs; 0 when an argument is 0. */
size_t kv_quality_causal_scratch_bytes(uint32_t n_rows, uint32_t head_dim);

/**
 * @brief Causal attention outputs: out[p] = softmax(q_p . K_S^T / sqrt(d)) . V_S over the rows
 * S whose token position (row_pos[i], or i when row_pos is NULL; strictly increasing) is
 * <= q_pos[p]; a zero row when S is empty. K and V: n_rows rows of dtype (host order); q and
 * out: float [n_q][head_dim]. Logits in float, sums in double.
 * @return OK, EINVAL (NULLs, empty, row positions not increasing), ENOMEM (scratch).
 */
kv_codec_status kv_quality_causal_attend(kv_codec_dtype dtype, uint32_t n_rows, uint32_t head_dim,
                                         const void *k, const void *v, const uint32_t *row_pos,
                                         const float *q, const uint32_t *q_pos, uint32_t n_q,
                                         void *scratch, size_t scratch_cap, float *out,
                                         kv_codec_err *err);

/**
 * @brief Probes for the causal metric without real queries: the keys at
 * kv_quality_probe_positions(n_tokens, n_probes) scaled to norm sqrt(head_dim) (see
 * kv_quality_derive_probes() for why), their positions into pos; *n_out = how many.
 * probes holds n_probes rows of head_dim floats, pos n_probes entries. @return OK, EINVAL.
 */
kv_codec_status kv_quality_spread_probes(const kv_section_shape *k_shape, const void *k,
                                         size_t k_len, uint32_t n_probes, float *probes,
                                         uint32_t *pos, uint32_t *n_out, kv_codec_err *err);

/*
 * THE OUTPUT-WEIGHTED QUALITY (issue 16, helper wt-wo16). What the residual stream receives of
 * a layer is sum_h o_h W_o,h: a head counts by what the model's output projection passes on.
 * Given gains per query head h (g_h,c >= 0 per channel c, or one gain g_h for all of them,
 * e.g. ||W_o,h||_F^2 / head_dim), the squared error and energy a probe at position p adds to
 * its layer l are E_lp = sum_h sum_c g_h,c (o - o')_h,c^2 and R_lp = sum_h sum_c g_h,c o_h,c^2,
 * pooled over the layer's heads (W_o's cross-head terms ignored). Per layer the relative L2
 * error r_l = sum_p sqrt(E_lp) / sum_p sqrt(R_lp) (what W_o's `oproj` variant measures with
 * W_o itself, bench/RESULTS.md), r = the mean over the layers measured, and the quality is
 * max(0, 1 - r^2 / 2): on the cosine's scale (a norm-keeping error of relative size r has
 * cosine 1 - r^2 / 2), which placement consumes. Probes a profile derives from the keys (no
 * real queries) weigh by the mean gain of the KV head's query heads.
 */

/**
 * @brief Add one head's probes to its layer's sums: ref, test float [n_pos][grp][head_dim]
 * (position-major: row i * grp + j is query head j of the group at position i), gains the
 * group's first query head's gains (query head j's at gains + j * channels; channels 1 or
 * head_dim), e and r the layer's n_pos sums (E_lp, R_lp above). Cannot fail.
 */
void kv_quality_gain_add(const float *ref, const float *test, uint32_t n_pos, uint32_t grp,
                         uint32_t head_dim, const float *gains, uint32_t channels, double *e,
                         double *r);

/**
 * @brief The output-weighted quality of sums e, r [n_layers][n_pos] (kv_quality_gain_add);
 * layers whose `seen` entry is 0 (no head measured) are left out (NULL: all measured). 1 when
 * no layer was measured.
 */
double kv_quality_gain_finish(const double *e, const double *r, uint32_t n_layers,
                              uint32_t n_pos, const uint8_t *seen);

/*
 * CALIBRATION (issue 16; calib.c). KVQuant's offline, per-model calibration of kvquant at 4 and
 * 2 bits with per-channel widths (params.alloc), computed from a few calibration contexts (their
 * K and V and the model's queries over them) and then applied to every section a writer codes:
 *  - K's channel weights (params.chan_weight, KVQuant's sensitivity weighting): the mean square
 *    of the queries that meet each channel, over every query of the KV head's query heads in the
 *    calibration contexts, summed over each RoPE pair (a rotation mixes a pair's two channels,
 *    so only the pair's sum survives every position), normalized to mean 1 (kv_calib_chan_weights);
 *  - a plan per (layer, KV head): K's and V's mean widths and groups, one option of
 *    kv_calib_options(bits) per head, chosen by least mean quality loss (the causal metric's
 *    1 - cosine on the calibration contexts' queries) + lambda x bytes, lambda bisected so that
 *    the whole plan stays within a budget of bits per element (kv_calib_plan_choose), one plan
 *    per width (int4: bits 4, budget 4.5; int2: bits 2, budget 2.5). Each option is measured
 *    on the sections a put stores (kv_calib_input.block: the model's block_tokens; a group
 *    never spans a block, so at short blocks every group shrinks and its scales cost more),
 *    and the engine gives the sections the budget less what its block objects add
 *    (kv_calib_block_reserve), so that a put stores at most the budget whatever the block
 *    size (bench/RESULTS.md, helper wt-cb16). A calibration stored before (session 28) keeps
 *    its plan: its groups shrink to the block at each put, as they always did.
 * The coded sections record their widths and groups (FORMAT-codecs.md "kvquant with per-channel
 * widths"): decoding never needs the calibration. kv_calib_run() is the whole computation;
 * kv_calib_section_params() the parameters of one section. A writer must never calibrate on the
 * context it then measures (its queries are the metric's probes).
 */
#define KV_CALIB_N_PLANS 2 /**< plan 0: 4 bits (int4), plan 1: 2 bits (int2) */
#define KV_CALIB_GROUP 256 /**< the options' group (tokens) unless an option names its own */
#define KV_CALIB_MAX_PROBES 64 /**< probe positions per context (spread over its queries) */

/** One head's choice: K's and V's mean widths (1..7) and groups (tokens, >= 1). */
typedef struct kv_calib_opt {
  uint8_t kb, vb;
  uint16_t kg, vg;
} kv_calib_opt;

/** A model's calibration (heads = n_layers * n_heads, head h = layer * n_heads + KV head). */
typedef struct kv_calib {
  uint32_t n_layers, n_heads, head_dim;
  float *weight;                        /**< [heads][head_dim]: K's channel weights, mean 1 */
  kv_calib_opt *plan[KV_CALIB_N_PLANS]; /**< [heads], or NULL: no plan for that width */
  float budget[KV_CALIB_N_PLANS];       /**< bits per element each plan was chosen under */
  uint32_t n_contexts, n_probes;        /**< what it was computed from (for information) */
  float planned[KV_CALIB_N_PLANS];      /**< kv_calib_run: bits per element of each plan's
                                             sections on the calibration contexts (above the
                                             budget only when no plan fits); not stored */
} kv_calib;

/** @brief Free the arrays of c (kv_calib_run's, or a decoder's) and zero it. NULL is a no-op. */
void kv_calib_free(kv_calib *c);
/** @brief The plan index of a width: 0 for 4 bits, 1 for 2, -1 otherwise. */
int kv_calib_plan_of(unsigned bits);
/** @brief The options a plan of `bits` (4 or 2) chooses from, *n of them (NULL, 0 otherwise);
 * groups 0 there mean the run's group. */
const kv_calib_opt *kv_calib_options(unsigned bits, size_t *n);

/** @brief acc[j] += sum over the n_rows rows of q (floats, head_dim each) of q[j]^2. */
void kv_calib_q2_add(const float *q, uint32_t n_rows, uint32_t head_dim, double *acc);
/**
 * @brief K's channel weights from sums of squared queries: acc holds n_acc such sums (head_dim
 * doubles each, `stride` doubles apart), all but number `skip` (none when skip >= n_acc, or when
 * n_acc is 1) are added up per RoPE pair of rope_style (KV_ROPE_ADJACENT: 2i, 2i+1;
 * KV_ROPE_HALF: i, i + d/2; 0: each channel alone), and the result normalized to mean 1 (all 1
 * when the sums are 0). w: head_dim floats. Cannot fail (an odd head_dim pairs nothing).
 */
void kv_calib_chan_weights(const double *acc, size_t n_acc, size_t stride, size_t skip,
                           uint32_t head_dim, unsigned rope_style, float *w);

/** One calibration head: its rows, how K is coded, the probes and their reference outputs. */
typedef struct kv_calib_head_data {
  kv_codec_dtype dtype;
  uint32_t n_tokens, head_dim;
  const void *k, *v;         /**< n_tokens rows each, dtype, host order */
  float rope_base;           /**< K before RoPE when not 0 (params.rope_*) */
  unsigned rope_style;
  uint32_t rope_pos0;
  const float *chan_weight;  /**< K's weights (head_dim), or NULL */
  const float *q;            /**< n_q probe queries (head_dim floats each) */
  const uint32_t *q_pos;     /**< their token positions (non-decreasing, < n_tokens) */
  uint32_t n_q;
  const float *ref;          /**< kv_quality_causal_attend() over k, v: n_q x head_dim */
  unsigned metric;           /**< the loss: 0 1 - mean cosine (the causal metric); 1 the
                                  norm-aware cosine 1 - |e|^2/(2|o|^2); 2 1 - |e|^2/|o|^2 */
  uint32_t block;            /**< the rows are coded as consecutive sections of `block` tokens
                                  (the model's block_tokens; the last may be shorter, each K
                                  section's RoPE from its first token, groups at most its
                                  rows), as a put stores them; 0 = one section of n_tokens */
} kv_calib_head_data;

/** @brief Scratch kv_calib_eval() needs for h and option o (0 when invalid). */
size_t kv_calib_eval_scratch(const kv_calib_head_data *h, const kv_calib_opt *o);
/**
 * @brief Code h's K and V with option o (kvquant, widths per channel, K weighted by
 * h->chan_weight) in sections of h->block tokens (0: one section each), decode them, and
 * measure: *loss = 1 - the metric over h's probes, *bytes = all the sections' encoded bytes.
 * @return OK, EINVAL, ENOMEM (scratch).
 */
kv_codec_status kv_calib_eval(const kv_calib_head_data *h, const kv_calib_opt *o, void *scratch,
                              size_t scratch_cap, double *loss, size_t *bytes, kv_codec_err *err);

/**
 * @brief The plan of least total loss within budget_bytes: loss and bytes are [n_opt][heads];
 * each head gets the option of least loss + lambda x bytes, lambda bisected (60 steps) to the
 * least whose plan fits (lambda 0 when the plan of least loss fits). choice: heads entries.
 * @return the plan's bytes (over the budget only when no plan fits).
 */
double kv_calib_plan_choose(const double *loss, const double *bytes, size_t n_opt,
                            uint32_t heads, double budget_bytes, uint8_t *choice);

/**
 * @brief The parameters of one section of (layer, KV head) coded with calibration c at `bits`
 * (4 or 2): alloc on, K's chan_weight (c->weight's row; it must outlive the encode), and, when c
 * has a plan for `bits`, that head's width (p->bits) and group (p->group, unless `group` is not
 * 0: a config's explicit group), each group at most `rows`. rows: the section's quantized rows.
 * @return 1 when applied, 0 when c is NULL, does not match, or has nothing for these bits.
 */
int kv_calib_section_params(const kv_calib *c, unsigned bits, uint32_t layer, uint32_t head,
                            int is_v, uint32_t rows, unsigned group, kv_codec_params *p);

/** What kv_calib_run() calibrates from. */
typedef struct kv_calib_input {
  uint32_t n_layers, n_heads, head_dim, n_q_heads; /**< n_q_heads: a multiple of n_heads */
  kv_codec_dtype dtype;
  float rope_base;       /**< the model's RoPE (0: K coded as given, after RoPE) */
  unsigned rope_style;   /**< KV_ROPE_ADJACENT / KV_ROPE_HALF, or 0 */
  uint32_t n_contexts;
  const uint32_t *n_tokens;        /**< [n_contexts] */
  const float *const *q;           /**< [n_contexts]: n_q[c] x n_layers x n_q_heads x head_dim */
  const uint32_t *const *q_pos;    /**< [n_contexts]: n_q[c] positions, increasing, < n_tokens */
  const uint32_t *n_q;             /**< [n_contexts], >= 1 */
  /** Fill K and V of (layer, head) of context c (n_tokens[c] rows each, dtype); 0 = done. */
  int (*head)(void *user, uint32_t c, uint32_t layer, uint32_t head, void *k, void *v);
  void *user;
  unsigned plans;        /**< bit p: choose plan p (bit 0 int4, bit 1 int2); 0 = weights only */
  float budget[KV_CALIB_N_PLANS]; /**< bits per element; 0 = the plan's bits + 0.5 */
  unsigned group;        /**< the options' group; 0 = KV_CALIB_GROUP */
  unsigned metric;       /**< kv_calib_head_data.metric */
  uint32_t block;        /**< the model's block_tokens: every option is measured (loss and
                              bytes) on sections of this many tokens, as a put stores them, so
                              the plan's budget holds at this block size and the plan's groups
                              are at most the block; 0 = each context one section */
} kv_calib_input;

/**
 * @brief Calibrate: K's weights from every query of every context; each chosen plan from the
 * loss of every option on every head of every context (probes: up to KV_CALIB_MAX_PROBES of a
 * context's queries, spread over them, every query head of the KV head's group), averaged over
 * the contexts, and the bytes summed, under the budget over all their elements. out is filled
 * (kv_calib_free() it). @return OK, EINVAL (bad input, named), ENOMEM, or the callback's failure
 * as EINVAL ("head callback").
 */
kv_codec_status kv_calib_run(const kv_calib_input *in, kv_calib *out, kv_codec_err *err);

#ifdef __cplusplus
}
#endif

/* ---- LOSSLESS FRAMES (section format version 2; frames.c; FORMAT-codecs.md) -------------------
 *
 * A FRAME holds the KV of several sections (any n_rows x head_dim each, one dtype) losslessly:
 * byte plane b of every element of the K sections, then of the V sections (each in section
 * order), is stored as one zstd frame per kind (K and V bytes have their own statistics: one
 * Huffman table for both lost ~4% of ratio on stories260K), or raw when zstd does not save 1/32
 * of the plane. One frame's fixed costs (zstd frame, Huffman table) are
 * paid once for all its sections; a reader of one section decodes its whole frame. The frame
 * size is chosen by the writer (kv_frames_plan(): consecutive sections until their raw bytes
 * reach frame_bytes); KV_FRAME_BYTES_DEFAULT is measured by `kvdb-bench compress` (decode speed
 * and ratio vs the read amplification of token-subset reads).
 */
#define KV_CODEC_ID_FRAME 6        /**< byte 0 of a frame: never a section codec id */
#define KV_FRAME_VERSION 2         /**< byte 1: the section format version that frames are */
#define KV_FRAME_FIXED_BYTES 8
#define KV_FRAME_MAX_SECTIONS 4096u
#define KV_FRAME_MAX_ELEMS (1ull << 28) /**< elements of a frame (all planes fit a u32) */
#define KV_FRAME_MIN_SAVING 32     /**< a plane is compressed only when zstd saves >= 1/32 */
#define KV_FRAME_LEVEL_DEFAULT 1   /**< measured: level 3 gains < 0.3% of ratio, decodes no faster */
#define KV_FRAME_MIN_MATCH 7       /**< zstd minMatch at encode: measured 3-12% faster decoding */
#define KV_FRAME_BYTES_DEFAULT (64u << 10) /**< raw bytes per frame (measured; RESULTS.md) */
#define KV_FRAME_MAX_THREADS 256u
#define KV_FRAME_V_BIT 0x80000000u  /**< in a section's stored row count: a V section */
/** Header byte 6 (plane coding flags): plane 1 of an f16 frame is EXPONENT PAIRS coded — the
 * 5 exponent bits of two adjacent elements as one byte of two 4-bit codes (relative to the
 * stream's most common window of 16 exponents; the rest listed apart), that byte plane through
 * zstd, sign and 2 mantissa bits as raw bitmaps (FORMAT-codecs.md): half as many Huffman
 * symbols per element as the high byte plane, and a SIMD join. */
#define KV_FRAME_CODING_EXPPAIRS 0x01u
/** The encoder takes exponent pairs over the plain high plane when its bytes are at most
 * 1 + 1/KV_FRAME_EP_SLACK times the plain plane's (measured; bench/RESULTS.md, issue 16). */
#define KV_FRAME_EP_SLACK 32
/** kv_frame_encode_ex()'s choice of plane coding. */
typedef enum kv_frame_coding {
  KV_FRAME_AUTO = 0,     /**< exponent pairs where they pay (f16, KV_FRAME_EP_SLACK), else planes */
  KV_FRAME_PLANES = 1,   /**< byte planes only (what frames were before the flag) */
  KV_FRAME_EXPPAIRS = 2  /**< exponent pairs for every f16 frame whose pairs fit the raw plane */
} kv_frame_coding;

/** @brief One section of a frame being encoded: n_rows x head_dim elements in host order; its
 * kind (K or V) puts its bytes in the K or the V stream of each plane. */
typedef struct kv_frame_sec {
  const void *rows;
  uint32_t n_rows, head_dim;
  kv_section_kind kind;
} kv_frame_sec;

/** @brief What a frame's header says (kv_frame_parse()). */
typedef struct kv_frame_info {
  kv_codec_dtype dtype;
  int zstd_level;
  uint32_t n_sections;
  uint64_t n_elems;       /**< elements of all its sections */
  uint64_t k_elems;       /**< elements of its K sections (the K stream of each plane) */
  size_t header_bytes;    /**< 8 + 8 x n_sections + 4 x element bytes */
  size_t frame_bytes;     /**< the whole frame (header + planes) */
  uint32_t plane_len[4];  /**< stored bytes of plane b (n_elems = raw) */
  uint32_t coding;        /**< header byte 6: KV_FRAME_CODING_* flags */
} kv_frame_info;

/** @brief Bytes of a frame's header for n_sections sections of dtype. */
size_t kv_frame_header_bytes(kv_codec_dtype dtype, uint32_t n_sections);
/** @brief Most bytes a frame of these sections can take; 0 for invalid arguments. */
size_t kv_frame_bound(kv_codec_dtype dtype, const kv_frame_sec *secs, uint32_t n_sections);
/** @brief Scratch kv_frame_encode() needs; 0 for invalid arguments. */
size_t kv_frame_encode_scratch_bytes(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                     uint32_t n_sections, int level);
/**
 * @brief Encode sections secs[0 .. n_sections) into one frame at dst (*out_len bytes).
 * level: zstd level -7..22, 0 = KV_FRAME_LEVEL_DEFAULT. KV_CODEC_EINVAL (bad arguments),
 * KV_CODEC_ENOMEM (scratch too small), KV_CODEC_ETOOSMALL (dst_cap < what it needs; the bound
 * always suffices).
 */
kv_codec_status kv_frame_encode(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                uint32_t n_sections, int level, void *scratch, size_t scratch_cap,
                                void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err);
/** @brief kv_frame_encode() with the plane coding chosen (kv_frame_encode() = KV_FRAME_AUTO). */
kv_codec_status kv_frame_encode_ex(kv_codec_dtype dtype, const kv_frame_sec *secs,
                                   uint32_t n_sections, int level, kv_frame_coding coding,
                                   void *scratch, size_t scratch_cap, void *dst, size_t dst_cap,
                                   size_t *out_len, kv_codec_err *err);
/** @brief Parse and check a frame's header against its length len (exact). KV_CODEC_ECORRUPT. */
kv_codec_status kv_frame_parse(const void *src, size_t len, kv_frame_info *info,
                               kv_codec_err *err);
/** @brief Rows, dims, kind and the byte offset in the decoded output of section i of a parsed
 * frame (NULL outputs are skipped). */
kv_codec_status kv_frame_section(const void *src, const kv_frame_info *info, uint32_t i,
                                 uint32_t *n_rows, uint32_t *head_dim, kv_section_kind *kind,
                                 uint64_t *byte_offset);
/** @brief Scratch kv_frame_decode() needs for a parsed frame. */
size_t kv_frame_decode_scratch_bytes(const kv_frame_info *info);
/**
 * @brief Decode a whole frame: the rows of its sections back to back (host order) into dst
 * (dst_cap >= n_elems x element bytes). ctx: a decoding context (NULL: one is built in the
 * scratch). KV_CODEC_ECORRUPT, KV_CODEC_ENOMEM, KV_CODEC_ETOOSMALL.
 */
kv_codec_status kv_frame_decode(kv_codec_dctx *ctx, const void *src, size_t len, void *scratch,
                                size_t scratch_cap, void *dst, size_t dst_cap, kv_codec_err *err);
/**
 * @brief Cut n_sections sections (raw bytes sec_bytes[s]) into frames of consecutive sections
 * whose raw bytes reach frame_bytes (0 = KV_FRAME_BYTES_DEFAULT; the last frame may be smaller;
 * at most KV_FRAME_MAX_SECTIONS each). first[f] (NULL: only count) = the first section of frame
 * f. Returns the number of frames.
 */
uint32_t kv_frames_plan(const uint64_t *sec_bytes, uint32_t n_sections, uint64_t frame_bytes,
                        uint32_t *first);

/** @brief One frame to decode (kv_frames_decode_mt()). */
typedef struct kv_frame_job {
  const void *src;
  size_t len;
  void *dst;
  size_t dst_cap;
} kv_frame_job;
/** @brief One decoding thread's state: a context (or NULL) and scratch for the largest frame. */
typedef struct kv_frame_worker {
  kv_codec_dctx *ctx;
  void *scratch;
  size_t scratch_cap;
} kv_frame_worker;
/**
 * @brief Decode jobs[0 .. n_jobs) on n_threads threads (the caller's and n_threads - 1 it
 * starts and joins; fewer when threads cannot be started), thread t with w[t]. Frames are
 * handed out one at a time. On failure: the status and message of the lowest failing job
 * (later jobs may be left undecoded). KV_CODEC_EINVAL for bad arguments.
 */
kv_codec_status kv_frames_decode_mt(const kv_frame_job *jobs, size_t n_jobs, kv_frame_worker *w,
                                    unsigned n_threads, kv_codec_err *err);

#endif /* KV_CODEC_H */
