/* SPDX-License-Identifier: MIT */
/*
 * fpga/app.c — Adaptive Prefetch-based Pipeline's split of the KV between the CPU (hot) pool and
 * the SmartSSD (cold) pool, HillInfer §4.3 (seed 002), Eq. 2-4:
 *
 *   (2)  T_CPU = M_c / f_c + alpha M_c / B_c   ~=   M_s / f_s + alpha M_s / B_s = T_SmartSSD
 *   (3)  M_c <= M_0
 *   (4)  beta = M_c / M_s = B_c f_c (B_s + alpha f_s) / (B_s f_s (B_c + alpha f_c)),
 *        s.t. beta <= M_0 / M_s
 *
 * Each side's time is the time to score its pool (M / f) plus the time to move the selected
 * alpha fraction of it (alpha M / B). Solving (2) for M_c / M_s gives (4):
 *   M_c (1/f_c + alpha/B_c) = M_s (1/f_s + alpha/B_s)
 *   beta = (1/f_s + alpha/B_s) / (1/f_c + alpha/B_c) = (B_s + alpha f_s) B_c f_c / ((B_c + alpha f_c) B_s f_s).
 * With M = M_c + M_s: M_s = M / (1 + beta), M_c = beta M / (1 + beta); when that M_c exceeds M_0,
 * (3) binds: M_c = M_0, M_s = M - M_0 (beta = M_0 / M_s), and the SmartSSD path is the longer.
 * "Empirical skewness correction" (§4.3, last paragraph): the hot pool holds more of the
 * selected tokens than alpha (recent and high-hit-rate tokens are pinned there); the paper
 * corrects alpha without giving the formula, so the split takes one alpha per side (alpha_c,
 * alpha_s: e.g. the fractions measured at the previous decoding step) in (2), which reduces to (4)
 * when they are equal. The short paper's beta = f_c / f_s (seed 000 §4.3) is alpha = 0.
 */
#include "fpga_int.h"

#include <math.h>

#define FAIL KV_FPGA_FAIL

double kv_app_beta(const kv_app_profile *p, double alpha)
{
  return p->B_c * p->f_c * (p->B_s + alpha * p->f_s) / (p->B_s * p->f_s * (p->B_c + alpha * p->f_c));
}

static int rate_ok(double x)
{
  return isfinite(x) && x > 0;
}

kv_fpga_status kv_app_split_compute(const kv_app_profile *p, double alpha_c, double alpha_s,
                                    double M, double M0, kv_app_split *out, kv_fpga_err *err)
{
  if (p == NULL || out == NULL)
    return FAIL(err, KV_FPGA_EINVAL, "NULL profile or output", 0, 0);
  if (!rate_ok(p->f_c) || !rate_ok(p->f_s) || !rate_ok(p->B_c) || !rate_ok(p->B_s))
    return FAIL(err, KV_FPGA_EINVAL, "a profiled rate (f_c, f_s, B_c, B_s) is not positive and "
                                     "finite", 0, 0);
  if (!(alpha_c >= 0 && alpha_c <= 1) || !(alpha_s >= 0 && alpha_s <= 1))
    return FAIL(err, KV_FPGA_EINVAL, "alpha outside [0, 1]", 0, 1);
  if (!(M >= 0) || !isfinite(M) || !(M0 >= 0))
    return FAIL(err, KV_FPGA_EINVAL, "M or M_0 negative or not finite", 0, 0);
  double cost_c = 1 / p->f_c + alpha_c / p->B_c; /* seconds per byte of the CPU pool */
  double cost_s = 1 / p->f_s + alpha_s / p->B_s;
  double beta = cost_s / cost_c;                 /* Eq. 4 (Eq. 2 solved for M_c / M_s) */
  double Mc = M * beta / (1 + beta), Ms = M - Mc;
  out->capped = 0;
  if (Mc > M0) { /* Eq. 3 */
    Mc = M0;
    Ms = M - M0;
    out->capped = 1;
    beta = Ms > 0 ? Mc / Ms : INFINITY;
  }
  out->beta = beta;
  out->M_c = Mc;
  out->M_s = Ms;
  out->T_cpu = Mc * cost_c;
  out->T_ssd = Ms * cost_s;
  return KV_FPGA_OK;
}

void kv_app_profile_update(kv_app_profile *p, const kv_hie_stats *s, double w)
{
  if (p == NULL || s == NULL || !(w > 0 && w <= 1))
    return;
  if (s->host_bytes > 0 && s->host_ns > 0) {
    double f = (double)s->host_bytes / ((double)s->host_ns * 1e-9);
    p->f_c = rate_ok(p->f_c) ? (1 - w) * p->f_c + w * f : f;
  }
  if (s->dev_bytes > 0 && s->dev_ns > 0) {
    double f = (double)s->dev_bytes / ((double)s->dev_ns * 1e-9);
    p->f_s = rate_ok(p->f_s) ? (1 - w) * p->f_s + w * f : f;
  }
}
