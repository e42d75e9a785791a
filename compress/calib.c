/* SPDX-License-Identifier: MIT */
/*
 * compress/calib.c — KVQuant's offline, per-model calibration of kvquant int4 / int2 (issue 16;
 * codec.h CALIBRATION): K's channel weights from the model's queries, and the per-(layer, KV
 * head) plan of K and V widths and groups chosen under a budget of bits per element from the
 * quality loss of every option on calibration contexts. Pure functions over the codecs and the
 * causal metric (quality.c); the engine (kvdb_model_calibrate) and `kvdb-bench truth` call them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "codec_int.h"

/* The options of a 4-bit plan (K bits, V bits, K group; 0 = the run's group): measured on
 * stories260K (bench/RESULTS.md, issue 16, designs 5-9). */
static const kv_calib_opt OPTS4[] = {
    {3, 3, 0, 0},   {3, 4, 0, 0},   {4, 3, 0, 0},   {4, 4, 0, 0},   {5, 3, 0, 0},   {5, 4, 0, 0},
    {6, 4, 0, 0},   {5, 5, 0, 0},   {6, 5, 0, 0},   {3, 3, 128, 0}, {3, 4, 128, 0}, {4, 3, 128, 0},
    {4, 4, 128, 0}, {5, 3, 128, 0}, {5, 4, 128, 0}, {6, 4, 128, 0}, {5, 5, 128, 0}, {6, 5, 128, 0},
    {6, 3, 0, 0},   {7, 4, 0, 0},   {4, 5, 0, 0},   {6, 6, 0, 0},   {2, 4, 0, 0},   {3, 5, 0, 0}};
/* ... of a 2-bit plan: the same shape two bits lower where both widths stay >= 1 */
static const kv_calib_opt OPTS2[] = {
    {1, 1, 0, 0},   {1, 2, 0, 0},   {2, 1, 0, 0},   {2, 2, 0, 0},   {3, 1, 0, 0},   {3, 2, 0, 0},
    {4, 2, 0, 0},   {3, 3, 0, 0},   {4, 3, 0, 0},   {1, 1, 128, 0}, {1, 2, 128, 0}, {2, 1, 128, 0},
    {2, 2, 128, 0}, {3, 1, 128, 0}, {3, 2, 128, 0}, {4, 2, 128, 0}, {3, 3, 128, 0}, {4, 3, 128, 0},
    {4, 1, 0, 0},   {5, 2, 0, 0},   {2, 3, 0, 0},   {4, 4, 0, 0},   {1, 3, 0, 0}};

_Static_assert(sizeof OPTS4 / sizeof OPTS4[0] <= 64 && sizeof OPTS2 / sizeof OPTS2[0] <= 64,
               "kv_calib_run measures at most 64 options per plan");

static const unsigned PLAN_BITS[KV_CALIB_N_PLANS] = {4, 2};

void kv_calib_free(kv_calib *c)
{
  if (c == NULL)
    return;
  free(c->weight);
  for (int p = 0; p < KV_CALIB_N_PLANS; p++)
    free(c->plan[p]);
  memset(c, 0, sizeof *c);
}

int kv_calib_plan_of(unsigned bits)
{
  return bits == 4 ? 0 : bits == 2 ? 1 : -1;
}

const kv_calib_opt *kv_calib_options(unsigned bits, size_t *n)
{
  if (bits == 4) {
    *n = sizeof OPTS4 / sizeof OPTS4[0];
    return OPTS4;
  }
  if (bits == 2) {
    *n = sizeof OPTS2 / sizeof OPTS2[0];
    return OPTS2;
  }
  *n = 0;
  return NULL;
}

void kv_calib_q2_add(const float *q, uint32_t n_rows, uint32_t head_dim, double *acc)
{
  for (uint32_t r = 0; r < n_rows; r++)
    for (uint32_t j = 0; j < head_dim; j++)
      acc[j] += (double)q[(size_t)r * head_dim + j] * q[(size_t)r * head_dim + j];
}

void kv_calib_chan_weights(const double *acc, size_t n_acc, size_t stride, size_t skip,
                           uint32_t head_dim, unsigned rope_style, float *w)
{
  uint32_t d = head_dim;
  int paired = (rope_style == KV_ROPE_ADJACENT || rope_style == KV_ROPE_HALF) && d % 2 == 0;
  uint32_t np = paired ? d / 2 : d;
  double tot = 0;
  for (uint32_t i = 0; i < np; i++) {
    uint32_t a = !paired ? i : rope_style == KV_ROPE_ADJACENT ? 2 * i : i;
    uint32_t b = !paired ? i : rope_style == KV_ROPE_ADJACENT ? 2 * i + 1 : i + d / 2;
    double s = 0;
    for (size_t c = 0; c < n_acc; c++)
      if (c != skip || n_acc == 1) {
        const double *o = acc + c * stride;
        s += paired ? o[a] + o[b] : o[a];
      }
    w[a] = w[b] = (float)s;
    tot += paired ? 2 * s : s;
  }
  for (uint32_t j = 0; j < d; j++) /* normalized: mean 1 */
    w[j] = tot > 0 ? (float)(w[j] * d / tot) : 1.0f;
}

/* ---- one head, one option ---- */

/* A head coded in sections of `blk` rows (h->block, or n_tokens when 0 or larger): the shape
 * and parameters of a section of `rows` rows starting at token b0. */
typedef struct eval_geom {
  kv_section_shape sh[2];
  kv_codec_params p[2];
  uint32_t blk;
  size_t bound, ws, rows_bytes, out_bytes, causal;
} eval_geom;

static void eval_section(const kv_calib_head_data *h, const kv_calib_opt *o, uint32_t b0,
                         uint32_t rows, eval_geom *g)
{
  for (int kv = 0; kv < 2; kv++) {
    g->sh[kv] = (kv_section_shape){h->dtype, kv ? KV_SECTION_V : KV_SECTION_K, rows,
                                   h->head_dim};
    kv_codec_params_init(&g->p[kv]);
    g->p[kv].bits = kv ? o->vb : o->kb;
    unsigned grp = kv ? o->vg : o->kg;
    g->p[kv].group = grp < rows ? grp : rows;
    g->p[kv].alloc = 1;
  }
  g->p[0].chan_weight = h->chan_weight;
  if (h->rope_base != 0.0f) {
    g->p[0].rope_base = h->rope_base;
    g->p[0].rope_style = h->rope_style;
    g->p[0].rope_pos0 = h->rope_pos0 + b0;
  }
}

static int eval_setup(const kv_calib_head_data *h, const kv_calib_opt *o, eval_geom *g)
{
  if (h == NULL || o == NULL || h->n_tokens == 0 || h->head_dim == 0 || o->kb < 1 ||
      o->kb > 7 || o->vb < 1 || o->vb > 7 || o->kg == 0 || o->vg == 0)
    return -1;
  const kv_codec *codec = kv_codec_by_id(KV_CODEC_ID_KVQUANT);
  if (codec == NULL)
    return -1;
  memset(g, 0, sizeof *g);
  g->blk = h->block != 0 && h->block < h->n_tokens ? h->block : h->n_tokens;
  /* the largest section and the trailing partial one bound the buffers */
  uint32_t rows[2] = {g->blk, h->n_tokens % g->blk};
  for (int r = 0; r < 2 && rows[r] != 0; r++) {
    eval_section(h, o, 0, rows[r], g);
    for (int kv = 0; kv < 2; kv++) {
      size_t b = kv_codec_bound(codec, &g->sh[kv], &g->p[kv]);
      size_t es = kv_codec_scratch_bytes(codec, &g->sh[kv], &g->p[kv], KV_CODEC_OP_ENCODE);
      size_t ds = kv_codec_scratch_bytes(codec, &g->sh[kv], &g->p[kv], KV_CODEC_OP_DECODE);
      if (b == 0 || es == 0 || ds == 0)
        return -1;
      g->bound = b > g->bound ? b : g->bound;
      g->ws = es > g->ws ? es : g->ws;
      g->ws = ds > g->ws ? ds : g->ws;
    }
  }
  g->rows_bytes = (size_t)h->n_tokens * h->head_dim * kv_codec_dtype_bytes(h->dtype);
  g->out_bytes = (size_t)h->n_q * h->head_dim * sizeof(float);
  g->causal = kv_quality_causal_scratch_bytes(h->n_tokens, h->head_dim);
  if (g->causal == 0 || h->n_q == 0)
    return -1;
  g->ws = g->causal > g->ws ? g->causal : g->ws;
  return 0;
}

#define CAL_ALIGN(x) (((x) + 63) & ~(size_t)63)

size_t kv_calib_eval_scratch(const kv_calib_head_data *h, const kv_calib_opt *o)
{
  eval_geom g;
  if (eval_setup(h, o, &g) != 0)
    return 0;
  return CAL_ALIGN(g.bound) + 2 * CAL_ALIGN(g.rows_bytes) + CAL_ALIGN(g.out_bytes) +
         CAL_ALIGN(g.ws) + 64;
}

kv_codec_status kv_calib_eval(const kv_calib_head_data *h, const kv_calib_opt *o, void *scratch,
                              size_t scratch_cap, double *loss, size_t *bytes, kv_codec_err *err)
{
  eval_geom g;
  if (eval_setup(h, o, &g) != 0 || h->k == NULL || h->v == NULL || h->q == NULL ||
      h->q_pos == NULL || h->ref == NULL || loss == NULL || bytes == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "calibration head or option", 0, 0);
  size_t need = kv_calib_eval_scratch(h, o);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "calibration scratch", scratch_cap, need);
  size_t cap = scratch_cap;
  uint8_t *base = kv_codec_scratch_align(scratch, &cap);
  uint8_t *enc = base;
  uint8_t *kd = enc + CAL_ALIGN(g.bound), *vd = kd + CAL_ALIGN(g.rows_bytes);
  float *test = (float *)(void *)(vd + CAL_ALIGN(g.rows_bytes));
  uint8_t *ws = (uint8_t *)test + CAL_ALIGN(g.out_bytes);
  size_t wcap = cap - (size_t)(ws - base);
  const kv_codec *codec = kv_codec_by_id(KV_CODEC_ID_KVQUANT);
  size_t row = (size_t)h->head_dim * kv_codec_dtype_bytes(h->dtype);
  *bytes = 0;
  for (uint32_t b0 = 0; b0 < h->n_tokens; b0 += g.blk) { /* the sections a put stores */
    uint32_t rows = h->n_tokens - b0 < g.blk ? h->n_tokens - b0 : g.blk;
    eval_section(h, o, b0, rows, &g);
    size_t sec = (size_t)rows * row;
    for (int kv = 0; kv < 2; kv++) {
      size_t el = 0;
      const uint8_t *src = (const uint8_t *)(kv ? h->v : h->k) + (size_t)b0 * row;
      kv_codec_status st = kv_codec_encode(codec, &g.sh[kv], src, sec, &g.p[kv], ws, wcap, enc,
                                           g.bound, &el, err);
      if (st != KV_CODEC_OK)
        return st;
      kv_section_info info;
      st = kv_section_decode(enc, el, ws, wcap, (kv ? vd : kd) + (size_t)b0 * row, sec, &info,
                             err);
      if (st != KV_CODEC_OK)
        return st;
      *bytes += el;
    }
  }
  kv_codec_status st =
      kv_quality_causal_attend(h->dtype, h->n_tokens, h->head_dim, kd, vd, NULL, h->q, h->q_pos,
                               h->n_q, ws, wcap, test, err);
  if (st != KV_CODEC_OK)
    return st;
  uint32_t d = h->head_dim;
  if (h->metric == 0) {
    kv_quality qy;
    if ((st = kv_quality_compare(h->ref, test, h->n_q, d, &qy, err)) != KV_CODEC_OK)
      return st;
    *loss = 1 - qy.cos_mean;
    return KV_CODEC_OK;
  }
  double acc = 0; /* the norm-aware cosine (1) or 1 - squared relative error (2), floored at 0 */
  for (uint32_t i = 0; i < h->n_q; i++) {
    const float *a = h->ref + (size_t)i * d, *b = test + (size_t)i * d;
    double aa = 0, dd = 0;
    for (uint32_t j = 0; j < d; j++) {
      aa += (double)a[j] * a[j];
      dd += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
    }
    acc += aa > 0 ? fmax(0, 1 - dd / (h->metric == 1 ? 2 * aa : aa)) : 1;
  }
  *loss = 1 - acc / h->n_q;
  return KV_CODEC_OK;
}

/* ---- the plan ---- */

/* Each head's option of least loss + lam x bytes into choice; returns the plan's bytes. */
static double plan_at(double lam, const double *loss, const double *bytes, size_t n_opt,
                      uint32_t heads, uint8_t *choice)
{
  double tot = 0;
  for (uint32_t hh = 0; hh < heads; hh++) {
    size_t best = 0;
    double bv = HUGE_VAL;
    for (size_t o = 0; o < n_opt; o++) {
      double v = loss[o * heads + hh] + lam * bytes[o * heads + hh];
      if (v < bv) {
        bv = v;
        best = o;
      }
    }
    choice[hh] = (uint8_t)best;
    tot += bytes[best * heads + hh];
  }
  return tot;
}

double kv_calib_plan_choose(const double *loss, const double *bytes, size_t n_opt,
                            uint32_t heads, double budget_bytes, uint8_t *choice)
{
  double lo = 0, hi = 1, tot = 0; /* lambda: loss per byte */
  for (int it = 0; it < 60; it++) {
    double lam = it == 0 ? 0 : (lo + hi) / 2;
    tot = plan_at(lam, loss, bytes, n_opt, heads, choice);
    if (it == 0 && tot <= budget_bytes)
      break;
    if (tot <= budget_bytes)
      hi = lam;
    else
      lo = lam;
    if (it == 59) /* end on a plan within the budget: lambda = hi */
      tot = plan_at(hi, loss, bytes, n_opt, heads, choice);
  }
  return tot;
}

int kv_calib_section_params(const kv_calib *c, unsigned bits, uint32_t layer, uint32_t head,
                            int is_v, uint32_t rows, unsigned group, kv_codec_params *p)
{
  int pl = kv_calib_plan_of(bits);
  if (c == NULL || p == NULL || pl < 0 || layer >= c->n_layers || head >= c->n_heads ||
      c->weight == NULL || rows == 0)
    return 0;
  size_t hh = (size_t)layer * c->n_heads + head;
  p->alloc = 1;
  p->chan_weight = is_v ? NULL : c->weight + hh * c->head_dim;
  if (c->plan[pl] != NULL) {
    const kv_calib_opt *o = &c->plan[pl][hh];
    p->bits = is_v ? o->vb : o->kb;
    unsigned g = group ? group : is_v ? o->vg : o->kg;
    p->group = g < rows ? g : rows;
  } else {
    p->bits = bits;
    if (group)
      p->group = group < rows ? group : rows;
  }
  return 1;
}

/* ---- the whole calibration ---- */

static int input_ok(const kv_calib_input *in)
{
  if (in == NULL || in->n_layers == 0 || in->n_heads == 0 || in->head_dim == 0 ||
      in->n_layers > 1024 || in->n_heads > 1024 || in->head_dim > 4096 || in->n_q_heads == 0 ||
      in->n_q_heads % in->n_heads != 0 || in->n_contexts == 0 || in->n_tokens == NULL ||
      in->q == NULL || in->q_pos == NULL || in->n_q == NULL || in->head == NULL ||
      kv_codec_dtype_bytes(in->dtype) == 0 || (in->plans & ~3u) != 0 || in->group > 4096 ||
      in->metric > 2 || in->block > (1u << 20))
    return 0;
  if (in->rope_base != 0.0f &&
      ((in->rope_style != KV_ROPE_ADJACENT && in->rope_style != KV_ROPE_HALF) ||
       in->head_dim % 2 != 0))
    return 0;
  for (uint32_t c = 0; c < in->n_contexts; c++) {
    if (in->n_tokens[c] == 0 || in->n_q[c] == 0 || in->q[c] == NULL || in->q_pos[c] == NULL)
      return 0;
    for (uint32_t i = 0; i < in->n_q[c]; i++)
      if (in->q_pos[c][i] >= in->n_tokens[c] ||
          (i > 0 && in->q_pos[c][i] <= in->q_pos[c][i - 1]))
        return 0;
  }
  return 1;
}

kv_codec_status kv_calib_run(const kv_calib_input *in, kv_calib *out, kv_codec_err *err)
{
  if (out == NULL || !input_ok(in))
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "calibration input", 0, 0);
  memset(out, 0, sizeof *out);
  uint32_t d = in->head_dim, heads = in->n_layers * in->n_heads, grp = in->n_q_heads / in->n_heads;
  unsigned group = in->group ? in->group : KV_CALIB_GROUP;
  size_t esz = kv_codec_dtype_bytes(in->dtype), max_tok = 0, max_q = 0;
  for (uint32_t c = 0; c < in->n_contexts; c++) {
    max_tok = in->n_tokens[c] > max_tok ? in->n_tokens[c] : max_tok;
    max_q = in->n_q[c] > max_q ? in->n_q[c] : max_q;
  }
  size_t n_opt[KV_CALIB_N_PLANS] = {0}, all_opt = 0;
  const kv_calib_opt *opts[KV_CALIB_N_PLANS] = {0};
  for (int p = 0; p < KV_CALIB_N_PLANS; p++)
    if (in->plans & (1u << p)) {
      opts[p] = kv_calib_options(PLAN_BITS[p], &n_opt[p]);
      all_opt += n_opt[p];
    }
  kv_codec_status rc = KV_CODEC_ENOMEM;
  double *q2 = calloc((size_t)heads * d, sizeof *q2);
  double *loss = calloc(all_opt * heads + 1, sizeof *loss);
  double *bytes = calloc(all_opt * heads + 1, sizeof *bytes);
  uint8_t *k = malloc(max_tok * d * esz * 2 + 64), *v = k ? k + max_tok * d * esz : NULL;
  uint32_t np = KV_CALIB_MAX_PROBES, idx[KV_CALIB_MAX_PROBES];
  float *pq = malloc((size_t)np * grp * d * sizeof(float) * 2), *ref = pq ? pq + (size_t)np * grp * d : NULL;
  uint32_t *ppos = malloc((size_t)np * grp * sizeof *ppos);
  uint8_t *choice = malloc(heads);
  void *ws = NULL;
  size_t ws_cap = 0;
  kv_calib_opt done[64]; /* one plan's options as measured on the head at hand */
  double dl[64], db[64];
  out->weight = malloc((size_t)heads * d * sizeof(float));
  if (!q2 || !loss || !bytes || !k || !pq || !ppos || !choice || !out->weight)
    goto fail;
  /* K's weights: every query of every context */
  for (uint32_t c = 0; c < in->n_contexts; c++)
    for (uint32_t i = 0; i < in->n_q[c]; i++)
      for (uint32_t l = 0; l < in->n_layers; l++)
        for (uint32_t qh = 0; qh < in->n_q_heads; qh++)
          kv_calib_q2_add(in->q[c] + (((size_t)i * in->n_layers + l) * in->n_q_heads + qh) * d, 1,
                          d, q2 + ((size_t)l * in->n_heads + qh / grp) * d);
  for (uint32_t hh = 0; hh < heads; hh++)
    kv_calib_chan_weights(q2 + (size_t)hh * d, 1, d, 1, d,
                          in->rope_base != 0.0f ? in->rope_style : 0, out->weight + (size_t)hh * d);
  /* each option's loss on each head of each context */
  for (uint32_t c = 0; c < in->n_contexts && all_opt > 0; c++) {
    uint32_t n = in->n_tokens[c];
    uint32_t npr = kv_quality_probe_positions(in->n_q[c], KV_CALIB_MAX_PROBES, idx);
    for (uint32_t hh = 0; hh < heads; hh++) {
      uint32_t l = hh / in->n_heads, h = hh % in->n_heads, nq = 0;
      if (in->head(in->user, c, l, h, k, v) != 0) {
        rc = KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "head callback", hh, heads);
        goto fail;
      }
      for (uint32_t i = 0; i < npr; i++)
        for (uint32_t j = 0; j < grp; j++, nq++) {
          memcpy(pq + (size_t)nq * d,
                 in->q[c] + (((size_t)idx[i] * in->n_layers + l) * in->n_q_heads + h * grp + j) * d,
                 d * sizeof(float));
          ppos[nq] = in->q_pos[c][idx[i]];
        }
      kv_calib_head_data hd = {in->dtype, n, d, k, v, in->rope_base,
                               in->rope_base != 0.0f ? in->rope_style : 0, 0,
                               out->weight + (size_t)hh * d, pq, ppos, nq, ref, in->metric,
                               in->block};
      size_t cs = kv_quality_causal_scratch_bytes(n, d);
      size_t at = 0;
      for (int p = 0; p < KV_CALIB_N_PLANS; p++)
        for (size_t o = 0; o < n_opt[p]; o++) {
          kv_calib_opt op = opts[p][o];
          op.kg = op.kg ? op.kg : (uint16_t)group;
          op.vg = op.vg ? op.vg : (uint16_t)group;
          if (in->block != 0) { /* a group never spans a block */
            op.kg = op.kg < in->block ? op.kg : (uint16_t)in->block;
            op.vg = op.vg < in->block ? op.vg : (uint16_t)in->block;
          }
          size_t same = o; /* an earlier option that codes the same at this block size */
          for (size_t j = 0; j < o && same == o; j++)
            if (done[j].kb == op.kb && done[j].vb == op.vb && done[j].kg == op.kg &&
                done[j].vg == op.vg)
              same = j;
          done[o] = op;
          if (same != o) {
            loss[at * heads + hh] += dl[same] / in->n_contexts;
            bytes[at * heads + hh] += db[same];
            dl[o] = dl[same];
            db[o] = db[same];
            at++;
            continue;
          }
          size_t need = kv_calib_eval_scratch(&hd, &op);
          need = need > cs ? need : cs;
          if (need == 0) {
            rc = KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "calibration section", n, d);
            goto fail;
          }
          if (need > ws_cap) {
            free(ws);
            ws = malloc(need);
            ws_cap = ws ? need : 0;
            if (ws == NULL)
              goto fail;
          }
          if (at == 0 && (rc = kv_quality_causal_attend(in->dtype, n, d, k, v, NULL, pq, ppos,
                                                        nq, ws, ws_cap, ref, err)) != KV_CODEC_OK)
            goto fail;
          double ls;
          size_t b;
          if ((rc = kv_calib_eval(&hd, &op, ws, ws_cap, &ls, &b, err)) != KV_CODEC_OK)
            goto fail;
          loss[(at)*heads + hh] += ls / in->n_contexts;
          bytes[(at)*heads + hh] += (double)b;
          dl[o] = ls;
          db[o] = (double)b;
          at++;
        }
      out->n_probes += nq;
    }
  }
  /* each plan within its budget over all the contexts' elements */
  double elems = 0;
  for (uint32_t c = 0; c < in->n_contexts; c++)
    elems += 2.0 * in->n_tokens[c] * d * heads;
  size_t at = 0;
  for (int p = 0; p < KV_CALIB_N_PLANS; p++) {
    if (n_opt[p] == 0)
      continue;
    float bud = in->budget[p] > 0 ? in->budget[p] : (float)PLAN_BITS[p] + 0.5f;
    double pb = kv_calib_plan_choose(loss + at * heads, bytes + at * heads, n_opt[p], heads,
                                     bud / 8.0 * elems, choice);
    out->planned[p] = (float)(8 * pb / elems);
    out->plan[p] = malloc((size_t)heads * sizeof(kv_calib_opt));
    if (out->plan[p] == NULL)
      goto fail;
    for (uint32_t hh = 0; hh < heads; hh++) { /* groups as a put stores them */
      kv_calib_opt op = opts[p][choice[hh]];
      op.kg = op.kg ? op.kg : (uint16_t)group;
      op.vg = op.vg ? op.vg : (uint16_t)group;
      if (in->block != 0) {
        op.kg = op.kg < in->block ? op.kg : (uint16_t)in->block;
        op.vg = op.vg < in->block ? op.vg : (uint16_t)in->block;
      }
      out->plan[p][hh] = op;
    }
    out->budget[p] = bud;
    at += n_opt[p];
  }
  out->n_layers = in->n_layers;
  out->n_heads = in->n_heads;
  out->head_dim = d;
  out->n_contexts = in->n_contexts;
  rc = KV_CODEC_OK;
fail:
  if (rc == KV_CODEC_ENOMEM)
    KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "calibration buffers", 0, 0);
  if (rc != KV_CODEC_OK)
    kv_calib_free(out);
  free(q2);
  free(loss);
  free(bytes);
  free(k);
  free(pq);
  free(ppos);
  free(choice);
  free(ws);
  return rc;
}
