/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_frames.c — part of `kvdb-bench compress`: lossless frames (compress/frames.c,
 * section format version 2), the lossless format of issue 16, on the same KV sets as the
 * section codecs (bench/kvset.h) and in the same run.
 *
 * Per set, the sections of each context (one block of the set's contexts: layer -> KV head ->
 * K, V, as a block stores them) are cut into frames by kv_frames_plan() (a frame never spans
 * two contexts) and encoded; then, one thread, median pass:
 *   decode     kv_frame_decode() of every frame with one decoding context into one reused
 *              output buffer (GB/s of original bytes, as every other decode figure here),
 *              checked bit-exact against the source (untimed)
 *   ratio      original bytes / frame bytes (headers included); vs_bound = ratio / the
 *              byte-plane entropy bound of the same sections (order 0, per section)
 *   subset     a token-subset read of one layer of one context (kvdb_get_tokens' pattern)
 *              decodes every frame holding one of the layer's sections: amplification =
 *              bytes decoded / the layer's bytes (zstd-planes v1 decodes just the page groups
 *              of the sections: 1.0 on these sets), and the time of that decode per read
 * swept over frame sizes (raw bytes per frame) at level 1, then levels -1 and 3 at the default
 * frame size; and kv_frames_decode_mt() of every frame at the default size on 2 threads and on
 * every online CPU (one decoding context and scratch per thread).
 *
 * JSON (prefixed by the set's prefix: "" real, "synthetic_"): lossless_decode_gbps,
 * lossless_vs_bound, lossless_ratio, lossless_encode_gbps (the default frame size and level),
 * lossless_frame_bytes, lossless_frame_level, lossless_subset_amplification,
 * lossless_subset_decode_us, lossless_decode_mt_gbps, lossless_decode_mt_threads,
 * lossless_decode_2t_gbps, lossless_frames_sweep (a string per row: size:level:ratio:gbps:
 * amplification:subset_us:coding, coding a(uto) / p(lanes) / e(xponent pairs forced)),
 * lossless_exppairs_share (frames of the default with exponent pairs), and the same-run
 * baselines lossless_planes_decode_gbps / _vs_bound (byte planes only: frames before the coding
 * flag) and lossless_exppairs_forced_decode_gbps / _vs_bound,
 * lossless_frame_bytes_chosen (the sweep's rule: the largest size whose one-layer subset read
 * decodes only that layer, with vs_bound >= 0.98; on the real set it is the default, 64 KiB).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bench_frames.h"
#include "codec.h"

#define BF_SIZES 7
static const uint32_t BF_SIZE[BF_SIZES] = {8u << 10,  16u << 10,  32u << 10, 64u << 10,
                                           128u << 10, 256u << 10, 512u << 10};

typedef struct fset {
  const bench_kvset *s;
  uint32_t n_sec_ctx;  /* sections per context */
  uint32_t n_frames;
  uint32_t *first;     /* [n_frames + 1]: first section (global index) of each frame */
  uint8_t *arena;      /* encoded frames */
  size_t *off, *len;   /* [n_frames] */
  uint8_t *out;        /* decoded rows, the set's layout */
  size_t enc_bytes;
  void *scratch;
  size_t scratch_cap;
  kv_codec_dctx *ctx;
  int level;
  kv_frame_coding coding; /* of the next encode_all */
  uint32_t n_ep;          /* frames of the last encode_all with exponent pairs */
  uint32_t layer_first, layer_n; /* subset pass: the sections of one layer of each context */
} fset;

/* Plan and encode every context's sections at (frame_bytes, level). 0, or -1 logged. */
static int encode_all(fset *f, uint64_t frame_bytes, int level)
{
  const bench_kvset *s = f->s;
  uint32_t nsc = f->n_sec_ctx;
  uint64_t *sb = malloc(nsc * sizeof *sb);
  uint32_t *first = malloc((nsc + 1) * sizeof *first);
  kv_frame_sec *secs = malloc(nsc * sizeof *secs);
  int rc = -1;
  if (sb == NULL || first == NULL || secs == NULL)
    goto out;
  for (uint32_t i = 0; i < nsc; i++)
    sb[i] = s->sec_bytes;
  uint32_t per = kv_frames_plan(sb, nsc, frame_bytes, first);
  first[per] = nsc;
  f->n_frames = per * s->n_ctx;
  free(f->first);
  free(f->off);
  free(f->len);
  f->first = malloc(((size_t)f->n_frames + 1) * sizeof *f->first);
  f->off = malloc((size_t)f->n_frames * sizeof *f->off);
  f->len = malloc((size_t)f->n_frames * sizeof *f->len);
  if (f->first == NULL || f->off == NULL || f->len == NULL)
    goto out;
  size_t pos = 0;
  for (uint32_t c = 0; c < s->n_ctx; c++)
    for (uint32_t k = 0; k < per; k++) {
      uint32_t fi = c * per + k, n = first[k + 1] - first[k];
      f->first[fi] = c * nsc + first[k];
      for (uint32_t i = 0; i < n; i++) {
        secs[i].rows = bench_kvset_sec(s, s->kv, f->first[fi] + i);
        secs[i].n_rows = s->n_tokens;
        secs[i].head_dim = s->head_dim;
        secs[i].kind = ((f->first[fi] + i) & 1) ? KV_SECTION_V : KV_SECTION_K;
      }
      size_t need = kv_frame_encode_scratch_bytes(KV_CODEC_F16, secs, n, level);
      if (need > f->scratch_cap) {
        free(f->scratch);
        f->scratch = malloc(need);
        f->scratch_cap = f->scratch ? need : 0;
        if (f->scratch == NULL)
          goto out;
      }
      size_t bound = kv_frame_bound(KV_CODEC_F16, secs, n), got = 0;
      kv_codec_err err;
      if (kv_frame_encode_ex(KV_CODEC_F16, secs, n, level, f->coding, f->scratch,
                             f->scratch_cap, f->arena + pos, bound, &got, &err) != KV_CODEC_OK) {
        bench_codec_fail("kv_frame_encode", &err);
        goto out;
      }
      f->off[fi] = pos;
      f->len[fi] = got;
      pos += got;
    }
  f->first[f->n_frames] = s->n_ctx * nsc;
  f->enc_bytes = pos;
  f->level = level;
  /* decode scratch for the largest frame */
  f->n_ep = 0;
  for (uint32_t fi = 0; fi < f->n_frames; fi++) {
    kv_frame_info info;
    kv_codec_err err;
    if (kv_frame_parse(f->arena + f->off[fi], f->len[fi], &info, &err) != KV_CODEC_OK) {
      bench_codec_fail("kv_frame_parse", &err);
      goto out;
    }
    f->n_ep += (info.coding & KV_FRAME_CODING_EXPPAIRS) != 0;
    size_t need = kv_frame_decode_scratch_bytes(&info);
    if (need > f->scratch_cap) {
      free(f->scratch);
      f->scratch = malloc(need);
      f->scratch_cap = f->scratch ? need : 0;
      if (f->scratch == NULL)
        goto out;
    }
  }
  rc = 0;
out:
  if (rc != 0)
    bench_log("frames: encoding failed (out of memory or a codec error)");
  free(sb);
  free(first);
  free(secs);
  return rc;
}

static int decode_frame(fset *f, uint32_t fi)
{
  const bench_kvset *s = f->s;
  kv_codec_err err;
  size_t cap = (size_t)(f->first[fi + 1] - f->first[fi]) * s->sec_bytes;
  if (kv_frame_decode(f->ctx, f->arena + f->off[fi], f->len[fi], f->scratch, f->scratch_cap,
                      f->out + (size_t)f->first[fi] * s->sec_bytes, cap, &err) != KV_CODEC_OK)
    return bench_codec_fail("kv_frame_decode", &err);
  return 0;
}

static int decode_pass(void *p, size_t it)
{
  fset *f = p;
  (void)it;
  for (uint32_t fi = 0; fi < f->n_frames; fi++)
    if (decode_frame(f, fi) != 0)
      return -1;
  return 0;
}

/* One subset read per context: the frames holding sections [layer_first, +layer_n). */
static int subset_pass(void *p, size_t it)
{
  fset *f = p;
  (void)it;
  for (uint32_t fi = 0; fi < f->n_frames; fi++) {
    uint32_t c = f->first[fi] / f->n_sec_ctx, a = f->first[fi] - c * f->n_sec_ctx;
    uint32_t b = f->first[fi + 1] - c * f->n_sec_ctx; /* frames never span contexts */
    if (b > f->layer_first && a < f->layer_first + f->layer_n && decode_frame(f, fi) != 0)
      return -1;
  }
  return 0;
}

typedef struct frames_row {
  uint32_t frame_bytes;
  int level;
  kv_frame_coding coding;
  double ep_share; /* frames with exponent pairs */
  double ratio, vs_bound, dec_gbps, enc_gbps, amp, subset_us;
} frames_row;

static double median_ns(const bench_fn_opts *o)
{
  bench_samples sm = {0};
  double r = -1;
  if (bench_fn_run(o, &sm) == 0)
    r = (double)bench_samples_pct(&sm, 50);
  bench_samples_free(&sm);
  return r;
}

typedef struct enc_arg {
  fset *f;
  uint64_t fb;
  int level;
} enc_arg;

static int encode_pass(void *p, size_t it)
{
  enc_arg *a = p;
  (void)it;
  return encode_all(a->f, a->fb, a->level);
}

static int measure(const bench_env *env, fset *f, uint64_t fb, int level, double bound_ratio,
                   frames_row *r)
{
  const bench_kvset *s = f->s;
  uint64_t min_ns = env->quick ? 50000000ull : 300000000ull;
  enc_arg ea = {f, fb, level};
  bench_fn_opts eo = {encode_pass, &ea, 2, 0, env->quick ? 20000000ull : 100000000ull};
  double enc_ns = median_ns(&eo);
  if (enc_ns < 0)
    return -1;
  memset(f->out, 0, s->total);
  if (decode_pass(f, 0) != 0)
    return -1;
  if (memcmp(f->out, s->kv, s->total) != 0) {
    bench_log("frames: decode of frame size %llu level %d is not bit-exact",
              (unsigned long long)fb, level);
    return -1;
  }
  bench_fn_opts o = {decode_pass, f, 3, 0, min_ns};
  double ns = median_ns(&o);
  bench_fn_opts so = {subset_pass, f, 3, 0, min_ns / 4};
  double sns = median_ns(&so);
  if (ns < 0 || sns < 0)
    return -1;
  /* amplification: bytes decoded by a one-layer read over the layer's bytes */
  uint64_t dec = 0;
  for (uint32_t fi = 0; fi < f->n_frames; fi++) {
    uint32_t c = f->first[fi] / f->n_sec_ctx, a = f->first[fi] - c * f->n_sec_ctx;
    uint32_t b = f->first[fi + 1] - c * f->n_sec_ctx;
    if (b > f->layer_first && a < f->layer_first + f->layer_n)
      dec += (uint64_t)(b - a) * s->sec_bytes;
  }
  r->frame_bytes = (uint32_t)fb;
  r->level = level;
  r->coding = f->coding;
  r->ep_share = f->n_frames ? (double)f->n_ep / f->n_frames : 0;
  r->ratio = (double)s->total / (double)f->enc_bytes;
  r->vs_bound = r->ratio / bound_ratio;
  r->dec_gbps = bench_gbps(s->total, (uint64_t)ns);
  r->enc_gbps = bench_gbps(s->total, (uint64_t)enc_ns);
  r->amp = (double)dec / ((double)s->n_ctx * f->layer_n * s->sec_bytes);
  r->subset_us = sns / 1e3 / s->n_ctx;
  return 0;
}

static double mt_gbps(const bench_env *env, fset *f, unsigned nt)
{
  const bench_kvset *s = f->s;
  kv_frame_job *jobs = malloc(f->n_frames * sizeof *jobs);
  kv_frame_worker *w = calloc(nt, sizeof *w);
  void **mem = calloc(nt, sizeof *mem);
  double r = -1;
  if (jobs == NULL || w == NULL || mem == NULL)
    goto out;
  for (uint32_t fi = 0; fi < f->n_frames; fi++) {
    jobs[fi].src = f->arena + f->off[fi];
    jobs[fi].len = f->len[fi];
    jobs[fi].dst = f->out + (size_t)f->first[fi] * s->sec_bytes;
    jobs[fi].dst_cap = (size_t)(f->first[fi + 1] - f->first[fi]) * s->sec_bytes;
  }
  for (unsigned t = 0; t < nt; t++) {
    mem[t] = malloc(kv_codec_dctx_bytes());
    w[t].scratch = malloc(f->scratch_cap);
    w[t].scratch_cap = f->scratch_cap;
    if (mem[t] == NULL || w[t].scratch == NULL)
      goto out;
    w[t].ctx = kv_codec_dctx_init(mem[t], kv_codec_dctx_bytes());
  }
  bench_samples sm = {0};
  uint64_t min_ns = env->quick ? 50000000ull : 300000000ull, spent = 0;
  while (sm.n < 5 || spent < min_ns) {
    uint64_t t0 = bench_now_ns();
    kv_codec_err err;
    if (kv_frames_decode_mt(jobs, f->n_frames, w, nt, &err) != KV_CODEC_OK) {
      bench_codec_fail("kv_frames_decode_mt", &err);
      bench_samples_free(&sm);
      goto out;
    }
    uint64_t dt = bench_now_ns() - t0;
    spent += dt;
    if (bench_samples_push(&sm, dt) != 0)
      break;
  }
  r = bench_gbps(s->total, bench_samples_pct(&sm, 50));
  bench_samples_free(&sm);
  if (memcmp(f->out, s->kv, s->total) != 0) {
    bench_log("frames: parallel decode is not bit-exact");
    r = -1;
  }
out:
  for (unsigned t = 0; w != NULL && mem != NULL && t < nt; t++) {
    free(mem[t]);
    free(w[t].scratch);
  }
  free(mem);
  free(w);
  free(jobs);
  return r;
}

int bench_frames_set(const bench_env *env, bench_json *j, const bench_kvset *s,
                     bench_frames_figures *fig)
{
  FILE *o = env->out;
  fset f;
  memset(&f, 0, sizeof f);
  f.s = s;
  f.n_sec_ctx = 2 * s->heads_per_ctx;
  f.layer_n = 2 * s->n_kv_heads;
  f.layer_first = f.layer_n * (s->n_layers / 2); /* a middle layer */
  size_t mem = kv_codec_dctx_bytes();
  void *ctx_mem = malloc(mem);
  int rc = -1;
  char k[96];
  frames_row rows[BF_SIZES + 4];
  size_t n_rows = 0;
  f.arena = bench_alloc(s->total + (size_t)2 * s->n_heads * 64 + (size_t)s->n_ctx * 4096);
  f.out = bench_alloc(s->total);
  if (ctx_mem == NULL || f.arena == NULL || f.out == NULL)
    goto out;
  f.ctx = kv_codec_dctx_init(ctx_mem, mem);
  /* KVDB_BENCH_FRAMES_DUMP=PREFIX: write the set's KV as PREFIX<prefix>kv.bin (the sections back
   * to back, layer -> KV head -> K, V per context) with a one-line shape file beside it, for
   * studying the frame codings outside the bench */
  const char *dump = getenv("KVDB_BENCH_FRAMES_DUMP");
  if (dump != NULL && *dump != '\0') {
    char pth[512];
    snprintf(pth, sizeof pth, "%s%skv.bin", dump, s->prefix);
    FILE *df = fopen(pth, "wb");
    if (df != NULL) {
      if (fwrite(s->kv, 1, s->total, df) != s->total)
        bench_log("frames: short write of %s", pth);
      fclose(df);
      snprintf(pth, sizeof pth, "%s%sshape.txt", dump, s->prefix);
      if ((df = fopen(pth, "w")) != NULL) {
        fprintf(df, "%u %u %u %u\n", (unsigned)s->n_ctx, (unsigned)f.n_sec_ctx,
                (unsigned)s->n_tokens, (unsigned)s->head_dim);
        fclose(df);
      }
    }
  }

  double bound = 0;
  for (size_t sec = 0; sec < 2 * (size_t)s->n_heads; sec++) {
    kv_section_shape sh = {KV_CODEC_F16, sec & 1 ? KV_SECTION_V : KV_SECTION_K, s->n_tokens,
                           s->head_dim};
    double b;
    kv_codec_err err;
    if (kv_lossless_entropy_bound(&sh, bench_kvset_sec(s, s->kv, sec), s->sec_bytes, &b, &err) !=
        KV_CODEC_OK) {
      bench_codec_fail("kv_lossless_entropy_bound", &err);
      goto out;
    }
    bound += b;
  }
  double bound_ratio = (double)s->total / bound;

  fprintf(o, "\n%s KV, lossless frames (section format 2): the sections of each context cut "
             "into frames of >= F raw bytes; subset = one layer's %u sections of a context "
             "(kvdb_get_tokens' read)\n",
          s->name, f.layer_n);
  fprintf(o, "  %-14s %6s %-9s %8s %9s %9s %9s %7s %10s %6s\n", "frame bytes", "level", "coding",
          "ratio", "vs bound", "enc GB/s", "dec GB/s", "amplif", "subset us", "pairs");
  size_t def_row = 0, planes_row = 0, ep_row = 0;
  static const char *const coding_name[] = {"auto", "planes", "exppairs"};
  for (size_t i = 0; i < BF_SIZES + 4; i++) {
    uint64_t fb = i < BF_SIZES ? BF_SIZE[i] : KV_FRAME_BYTES_DEFAULT;
    int level = i < BF_SIZES ? KV_FRAME_LEVEL_DEFAULT : i == BF_SIZES ? -1
              : i == BF_SIZES + 1                   ? 3
                                                    : KV_FRAME_LEVEL_DEFAULT;
    /* the last two: the default size and level as byte planes only (every frame before the
     * coding flag) and with exponent pairs forced: same-run baselines of the auto choice */
    f.coding = i == BF_SIZES + 2 ? KV_FRAME_PLANES : i == BF_SIZES + 3 ? KV_FRAME_EXPPAIRS
                                                                       : KV_FRAME_AUTO;
    if (i == BF_SIZES + 2)
      planes_row = n_rows;
    if (i == BF_SIZES + 3)
      ep_row = n_rows;
    if (i < BF_SIZES && fb > (uint64_t)f.n_sec_ctx * s->sec_bytes && i > 0 &&
        BF_SIZE[i - 1] >= (uint64_t)f.n_sec_ctx * s->sec_bytes)
      continue; /* one frame per context already */
    bench_log("%s set: frames of %llu bytes, level %d, %s", s->name, (unsigned long long)fb,
              level, coding_name[f.coding]);
    if (measure(env, &f, fb, level, bound_ratio, &rows[n_rows]) != 0)
      goto out;
    frames_row *r = &rows[n_rows];
    int is_def = fb == KV_FRAME_BYTES_DEFAULT && level == KV_FRAME_LEVEL_DEFAULT &&
                 f.coding == KV_FRAME_AUTO;
    fprintf(o, "  %-14u %6d %-9s %8.4f %9.4f %9.3f %9.3f %7.2f %10.2f %6.2f%s\n",
            r->frame_bytes, r->level, coding_name[r->coding], r->ratio, r->vs_bound, r->enc_gbps,
            r->dec_gbps, r->amp, r->subset_us, r->ep_share, is_def ? "  (default)" : "");
    if (is_def)
      def_row = n_rows;
    n_rows++;
  }
  /* the rule the default follows: the largest frame size whose one-layer subset reads decode
   * no more than the layer (amplification 1) with a ratio within 2% of the bound: larger
   * frames decode faster, until a subset read pays for frames it does not need */
  uint32_t chosen = 0;
  for (size_t i = 0; i < n_rows; i++)
    if (rows[i].level == KV_FRAME_LEVEL_DEFAULT && rows[i].coding == KV_FRAME_AUTO &&
        rows[i].amp <= 1.0 + 1e-9 &&
        rows[i].vs_bound >= 0.98 && rows[i].frame_bytes > chosen)
      chosen = rows[i].frame_bytes;

  /* parallel decode at the default size (re-encode: the sweep left the last one) */
  f.coding = KV_FRAME_AUTO;
  if (encode_all(&f, KV_FRAME_BYTES_DEFAULT, KV_FRAME_LEVEL_DEFAULT) != 0)
    goto out;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned nt = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (unsigned)ncpu;
  double g2 = mt_gbps(env, &f, 2), gn = mt_gbps(env, &f, nt);
  if (g2 < 0 || gn < 0)
    goto out;
  const frames_row *d = &rows[def_row];
  fprintf(o, "  default %u bytes, level %d: %.3f GB/s one core, ratio %.4f = %.4f of the "
             "bound; subset reads decode %.2fx the bytes they need; parallel decode of all %u "
             "frames: %.3f GB/s on 2 threads, %.3f GB/s on %u; the sweep's rule picks %u bytes\n",
          d->frame_bytes, d->level, d->dec_gbps, d->ratio, d->vs_bound, d->amp, f.n_frames, g2,
          gn, nt, chosen);

  char sweep[1536] = "";
  size_t sl = 0;
  for (size_t i = 0; i < n_rows && sl < sizeof sweep; i++)
    sl += (size_t)snprintf(sweep + sl, sizeof sweep - sl, "%s%u:%d:%.4f:%.3f:%.2f:%.2f:%c",
                           i ? " " : "", rows[i].frame_bytes, rows[i].level, rows[i].ratio,
                           rows[i].dec_gbps, rows[i].amp, rows[i].subset_us,
                           coding_name[rows[i].coding][0]);
#define JN(name, v)                                                                                \
  do {                                                                                             \
    snprintf(k, sizeof k, "%s%s", s->prefix, name);                                                \
    bench_json_num(j, k, v);                                                                       \
  } while (0)
#define JI(name, v)                                                                                \
  do {                                                                                             \
    snprintf(k, sizeof k, "%s%s", s->prefix, name);                                                \
    bench_json_int(j, k, (int64_t)(v));                                                            \
  } while (0)
  JN("lossless_decode_gbps", d->dec_gbps);
  JN("lossless_vs_bound", d->vs_bound);
  JN("lossless_ratio", d->ratio);
  JN("lossless_encode_gbps", d->enc_gbps);
  JI("lossless_frame_bytes", d->frame_bytes);
  JI("lossless_frame_level", d->level);
  JN("lossless_subset_amplification", d->amp);
  JN("lossless_subset_decode_us", d->subset_us);
  JN("lossless_decode_2t_gbps", g2);
  JN("lossless_decode_mt_gbps", gn);
  JI("lossless_decode_mt_threads", nt);
  JI("lossless_frame_bytes_chosen", chosen);
  JN("lossless_exppairs_share", d->ep_share);
  JN("lossless_planes_decode_gbps", rows[planes_row].dec_gbps);
  JN("lossless_planes_vs_bound", rows[planes_row].vs_bound);
  JN("lossless_exppairs_forced_decode_gbps", rows[ep_row].dec_gbps);
  JN("lossless_exppairs_forced_vs_bound", rows[ep_row].vs_bound);
  snprintf(k, sizeof k, "%slossless_frames_sweep", s->prefix);
  bench_json_str(j, k, sweep);
#undef JN
#undef JI
  fig->ok = 1;
  fig->dec_gbps = d->dec_gbps;
  fig->vs_bound = d->vs_bound;
  rc = 0;
out:
  free(ctx_mem);
  free(f.first);
  free(f.off);
  free(f.len);
  free(f.scratch);
  bench_free(f.arena);
  bench_free(f.out);
  return rc;
}
