/* SPDX-License-Identifier: MIT */
/*
 * policy/policy.c — the EvicPress model: parameters and their checks, utility and TTFT
 * of a placement (§4.2), evaluation of a set of placements, the enumeration of a context's
 * placement choices, decayed access counts, which stored config can become which
 * (kv_policy_config_*). The greedy is in greedy.c, the exact solver and
 * the upper bound in exact.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy_int.h"

kvdb_status pol_fail(kv_policy_err *err, kvdb_status st, const char *fmt, ...)
{
  if (err != NULL) {
    va_list ap;
    va_start(ap, fmt);
    err->status = st;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return st;
}

void kv_policy_params_init(kv_policy_params *p)
{
  memset(p, 0, sizeof *p);
  p->alpha = 1.0;
  p->prefill_tokens_per_s = 10000.0;
  p->recompute_quality = 1.0;
  p->rule = KV_POLICY_REFILL;
}

static const char *tier_name(const kv_policy_tier *t, uint32_t i, char *buf, size_t cap)
{
  if (t->name != NULL && t->name[0] != 0)
    snprintf(buf, cap, "tier %u '%.40s'", i, t->name);
  else
    snprintf(buf, cap, "tier %u", i);
  return buf;
}

static int finite_nonneg(double x)
{
  return isfinite(x) && x >= 0.0;
}

static kvdb_status check_params(const kv_policy_params *p, kv_policy_err *err)
{
  char nm[64];
  if (p == NULL)
    return pol_fail(err, KVDB_INVALID, "params is NULL");
  if (p->n_tiers == 0 || p->n_tiers > KV_POLICY_MAX_TIERS)
    return pol_fail(err, KVDB_INVALID, "n_tiers %u is not in 1..%d", p->n_tiers,
                    KV_POLICY_MAX_TIERS);
  if (p->tiers == NULL)
    return pol_fail(err, KVDB_INVALID, "tiers is NULL");
  for (uint32_t t = 0; t < p->n_tiers; t++) {
    const kv_policy_tier *tr = &p->tiers[t];
    tier_name(tr, t, nm, sizeof nm);
    if (tr->capacity_bytes == 0)
      return pol_fail(err, KVDB_INVALID,
                      "%s has zero capacity (leave the tier out, or KV_POLICY_UNLIMITED)", nm);
    if (!(isfinite(tr->read_bps) && tr->read_bps > 0.0))
      return pol_fail(err, KVDB_INVALID, "%s: read bandwidth %g is not a positive number", nm,
                      tr->read_bps);
    if (!finite_nonneg(tr->latency_s))
      return pol_fail(err, KVDB_INVALID, "%s: latency %g is not a number >= 0", nm,
                      tr->latency_s);
    if (tr->flags & ~(uint32_t)(KV_POLICY_TIER_INCLUSIVE | KV_POLICY_TIER_DECODED))
      return pol_fail(err, KVDB_INVALID, "%s: unknown flags 0x%x", nm, tr->flags);
    if ((tr->flags & KV_POLICY_TIER_INCLUSIVE) && t != 0)
      return pol_fail(err, KVDB_INVALID, "%s: only tier 0 may be inclusive", nm);
    if ((tr->flags & KV_POLICY_TIER_INCLUSIVE) && p->n_tiers < 2)
      return pol_fail(err, KVDB_INVALID,
                      "%s is inclusive but there is no tier below it for the persistent copy",
                      nm);
  }
  if (!finite_nonneg(p->alpha))
    return pol_fail(err, KVDB_INVALID, "alpha %g is not a number >= 0", p->alpha);
  if (!(isfinite(p->prefill_tokens_per_s) && p->prefill_tokens_per_s > 0.0))
    return pol_fail(err, KVDB_INVALID, "prefill_tokens_per_s %g is not a positive number",
                    p->prefill_tokens_per_s);
  if (!(p->recompute_quality >= 0.0 && p->recompute_quality <= 1.0))
    return pol_fail(err, KVDB_INVALID, "recompute_quality %g is not in [0, 1]",
                    p->recompute_quality);
  for (int i = 0; i < 4; i++)
    if (!finite_nonneg(p->decode_bps[i]))
      return pol_fail(err, KVDB_INVALID, "decode_bps[%d] %g is not a number >= 0", i,
                      p->decode_bps[i]);
  if (p->rule != KV_POLICY_LEAST_DROP && p->rule != KV_POLICY_PER_BYTE &&
      p->rule != KV_POLICY_REFILL)
    return pol_fail(err, KVDB_INVALID, "unknown rule %d", (int)p->rule);
  return KVDB_OK;
}

kvdb_status pol_place_valid(const pol_model *m, size_t i, const kv_policy_place *pl,
                            const char *what, kv_policy_err *err)
{
  const kv_policy_context *c = &m->ctx[i];
  if (pl->tier == KV_POLICY_NONE) {
    if (pl->cached)
      return pol_fail(err, KVDB_INVALID, "context %zu: %s is not stored but marked cached", i,
                      what);
    return KVDB_OK;
  }
  if (pl->tier < (int32_t)m->first || pl->tier >= (int32_t)m->T)
    return pol_fail(err, KVDB_INVALID, "context %zu: %s tier %d is not a %stier (0..%u)", i,
                    what, pl->tier, m->incl ? "persistent " : "", m->T - 1);
  if (pl->option < 0 || (uint32_t)pl->option >= c->n_options)
    return pol_fail(err, KVDB_INVALID, "context %zu: %s option %d is not in 0..%u", i, what,
                    pl->option, c->n_options - 1);
  if (pl->cached && !m->incl)
    return pol_fail(err, KVDB_INVALID,
                    "context %zu: %s is marked cached but tier 0 is not inclusive", i, what);
  return KVDB_OK;
}

kvdb_status pol_model_init(pol_model *m, const kv_policy_params *p, const kv_policy_context *ctx,
                           size_t n, kv_policy_err *err)
{
  return pol_model_init_ex(m, p, ctx, n, 1, err);
}

kvdb_status pol_model_init_ex(pol_model *m, const kv_policy_params *p,
                              const kv_policy_context *ctx, size_t n, int check_options,
                              kv_policy_err *err)
{
  memset(m, 0, sizeof *m);
  kvdb_status st = check_params(p, err);
  if (st != KVDB_OK)
    return st;
  if (n > 0 && ctx == NULL)
    return pol_fail(err, KVDB_INVALID, "contexts is NULL");
  if (n > (size_t)UINT32_MAX - 1)
    return pol_fail(err, KVDB_INVALID, "%zu contexts: at most %u", n, UINT32_MAX - 1);
  m->p = p;
  m->ctx = ctx;
  m->n = n;
  m->options_checked = check_options;
  m->T = p->n_tiers;
  m->incl = (p->tiers[0].flags & KV_POLICY_TIER_INCLUSIVE) != 0;
  m->first = m->incl ? 1u : 0u;
  for (uint32_t t = 0; t < m->T; t++) {
    m->cap[t] = p->tiers[t].capacity_bytes;
    m->inv_bw[t] = 1.0 / p->tiers[t].read_bps;
    m->lat[t] = p->tiers[t].latency_s;
    m->decoded[t] = (p->tiers[t].flags & KV_POLICY_TIER_DECODED) != 0;
  }
  for (size_t i = 0; i < n; i++) {
    const kv_policy_context *c = &ctx[i];
    if (c->n_options == 0 || c->options == NULL)
      return pol_fail(err, KVDB_INVALID, "context %zu has no options", i);
    if (c->n_options > KV_POLICY_MAX_OPTIONS)
      return pol_fail(err, KVDB_INVALID, "context %zu has %u options: at most %u", i,
                      c->n_options, KV_POLICY_MAX_OPTIONS);
    if (c->raw_bytes == 0)
      return pol_fail(err, KVDB_INVALID, "context %zu: raw_bytes is 0", i);
    if (c->n_tokens == 0)
      return pol_fail(err, KVDB_INVALID, "context %zu: n_tokens is 0", i);
    if (!finite_nonneg(c->frequency))
      return pol_fail(err, KVDB_INVALID, "context %zu: frequency %g is not a number >= 0", i,
                      c->frequency);
    for (uint32_t o = 0; check_options && o < c->n_options; o++)
      if ((st = pol_check_option(i, o, &c->options[o], err)) != KVDB_OK)
        return st;
    st = pol_place_valid(m, i, &c->current, "current placement", err);
    if (st != KVDB_OK)
      return st;
  }
  return KVDB_OK;
}

kvdb_status kv_policy_check(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                            kv_policy_err *err)
{
  pol_model m;
  return pol_model_init(&m, p, ctx, n, err);
}

size_t pol_n_choices(const pol_model *m, const kv_policy_context *c)
{
  size_t per = (size_t)(m->T - m->first) * c->n_options;
  return 1 + per * (m->incl ? 2u : 1u);
}

size_t pol_choices(const pol_model *m, const kv_policy_context *c, pol_choice *out)
{
  size_t k = 0;
  memset(&out[k], 0, sizeof out[k]);
  out[k].place = kv_policy_place_none();
  out[k].u = pol_util_none(m, c);
  k++;
  for (int cached = 0; cached <= (m->incl ? 1 : 0); cached++)
    for (uint32_t t = m->first; t < m->T; t++)
      for (uint32_t o = 0; o < c->n_options; o++) {
        pol_choice *ch = &out[k++];
        memset(ch, 0, sizeof *ch);
        ch->place.tier = (int32_t)t;
        ch->place.option = (int32_t)o;
        ch->place.cached = (uint32_t)cached;
        ch->u = pol_util_place(m, c, &ch->place);
        pol_use(m, c, &ch->place, ch->use, +1);
      }
  return k;
}

double kv_policy_utility(const kv_policy_params *p, const kv_policy_context *c,
                         kv_policy_place place)
{
  pol_model m;
  if (p == NULL || c == NULL || pol_model_init(&m, p, c, 1, NULL) != KVDB_OK ||
      pol_place_valid(&m, 0, &place, "placement", NULL) != KVDB_OK)
    return NAN;
  return pol_util_place(&m, c, &place);
}

double kv_policy_ttft(const kv_policy_params *p, const kv_policy_context *c, kv_policy_place place)
{
  pol_model m;
  if (p == NULL || c == NULL || pol_model_init(&m, p, c, 1, NULL) != KVDB_OK ||
      pol_place_valid(&m, 0, &place, "placement", NULL) != KVDB_OK)
    return NAN;
  if (place.tier == KV_POLICY_NONE)
    return pol_ttft_none(&m, c);
  return pol_ttft(&m, pol_serving(&place), c, (uint32_t)place.option);
}

kvdb_status kv_policy_evaluate(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                               const kv_policy_place *place, kv_policy_eval *out,
                               kv_policy_err *err)
{
  pol_model m;
  kvdb_status st = pol_model_init(&m, p, ctx, n, err);
  if (st != KVDB_OK)
    return st;
  if (out == NULL)
    return pol_fail(err, KVDB_INVALID, "out is NULL");
  kv_policy_eval e;
  memset(&e, 0, sizeof e);
  double fsum = 0, ft = 0, fq = 0;
  for (size_t i = 0; i < n; i++) {
    const kv_policy_context *c = &ctx[i];
    const kv_policy_place *pl = place != NULL ? &place[i] : &c->current;
    if (place != NULL && (st = pol_place_valid(&m, i, pl, "placement", err)) != KVDB_OK)
      return st;
    double ttft, q;
    if (pl->tier == KV_POLICY_NONE) {
      ttft = pol_ttft_none(&m, c);
      q = m.p->recompute_quality;
      e.served[m.T]++;
    } else {
      uint32_t s = pol_serving(pl);
      ttft = pol_ttft(&m, s, c, (uint32_t)pl->option);
      q = c->options[pl->option].quality;
      e.served[s]++;
    }
    e.utility += pol_util_place(&m, c, pl);
    fsum += c->frequency;
    ft += c->frequency * ttft;
    fq += c->frequency * q;
    pol_use(&m, c, pl, e.used, +1);
  }
  if (fsum > 0) {
    e.mean_ttft_s = ft / fsum;
    e.mean_quality = fq / fsum;
  }
  for (uint32_t t = 0; t < m.T; t++)
    if (e.used[t] > m.cap[t])
      e.over_capacity |= 1u << t;
  *out = e;
  return KVDB_OK;
}

double kv_policy_decay(double f, double elapsed, double half_life, int access)
{
  if (isfinite(half_life) && half_life > 0 && elapsed > 0)
    f *= exp2(-elapsed / half_life);
  return access ? f + 1.0 : f;
}

int kv_policy_config_exact(const kvdb_config *c)
{
  return c->method == KVDB_METHOD_RAW || c->method == KVDB_METHOD_LOSSLESS;
}

int kv_policy_config_equal(const kvdb_config *a, const kvdb_config *b)
{
  return a->method == b->method && a->bits == b->bits && a->drop == b->drop &&
         a->zstd_level == b->zstd_level && a->keep_permille == b->keep_permille &&
         a->group == b->group && a->residual == b->residual;
}

int kv_policy_config_reachable(const kvdb_config *have, const kvdb_config *want)
{
  if (kv_policy_config_exact(have))
    return 1;
  if (have->method == KVDB_METHOD_DROP) /* dropped tokens do not come back */
    return kv_policy_config_equal(have, want);
  /* quantized: only coarser quantization, with or without dropping, loses nothing more */
  if (kv_policy_config_exact(want))
    return 0;
  return want->bits != 0 ? want->bits <= have->bits : want->method == KVDB_METHOD_DROP;
}

void kv_policy_plan_free(kv_policy_plan *plan)
{
  if (plan == NULL)
    return;
  free(plan->place);
  free(plan->moves);
  memset(plan, 0, sizeof *plan);
}
