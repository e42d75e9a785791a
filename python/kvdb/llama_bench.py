# SPDX-License-Identifier: MIT
"""The Python half of `kvdb-bench llama` (also `python -m kvdb.llama_run bench`).

1. Python put/get throughput through numpy views of >= 256 MiB of SmolLM2-shaped KV (30 layers,
   3 KV heads, head_dim 64, f16; contexts of 1,024 tokens in the packed [layer][K,V][token][head]
   [dim] layout), against the C API's figures on the same bytes, options and shape, which
   kvdb-bench measures in rounds alternating with this part (--part putget): py_put_vs_c,
   py_get_vs_c. The bytes of element i of context c are ((i * 2654435761 + c * 40503) >> 7) &
   0x3BFF as f16 bits on both sides (bench/bench_llama.c).
2. TTFT of SmolLM2 through llama.cpp with kvdb at 25/50/75/90/99% prefix hit on prompts of
   ~2,000 tokens against a full prefill of the same prompt, in the same run: ttft_ratio_hitNN =
   TTFT with kvdb / TTFT without (median of the repetitions); the greedy continuations of both
   compared (continuations_identical, n_prompts).
Figures print as text; with --json, lines '@json NAME VALUE' carry them to kvdb-bench (or one
JSON object is printed last when run alone).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

import kvdb

SHAPE = dict(n_layers=30, n_kv_heads=3, head_dim=64)
CTX_TOKENS = 1024


def pattern(c: int, n_elems: int) -> np.ndarray:
    i = np.arange(n_elems, dtype=np.uint64)
    bits = ((i * np.uint64(2654435761) + np.uint64(c * 40503)) >> np.uint64(7)) & np.uint64(0x3BFF)
    return bits.astype(np.uint16).view(np.float16)


def put_get(dirpath: Path, n_ctx: int, get_db: Optional[Path] = None) -> Dict[str, float]:
    """The put and get figures through numpy views. The gets read `get_db` when given (the
    database kvdb-bench llama's C side wrote and read just before, with the same contexts),
    else the second database the puts wrote."""
    m = kvdb.Model("bench-llama-smollm2", dtype="f16", block_tokens=64, **SHAPE)
    L, H, D = SHAPE["n_layers"], SHAPE["n_kv_heads"], SHAPE["head_dim"]
    shape = (L, 2, CTX_TOKENS, H, D)
    bufs = []
    for c in range(n_ctx):  # page-aligned, as bench_llama.c's bench_alloc
        b = kvdb.empty(shape, np.float16)
        b[...] = pattern(c, b.size).reshape(shape)
        bufs.append(b)
    toks = [np.arange(CTX_TOKENS, dtype=np.uint32) + np.uint32(c * 100000) for c in range(n_ctx)]
    total = sum(b.nbytes for b in bufs)
    out = kvdb.empty(shape, np.float16)
    out.fill(0)
    dirpath.mkdir(parents=True, exist_ok=True)
    put_ns = None
    for rnd in range(2):  # as bench_llama.c: the best of two puts, of three get passes
        with kvdb.open(dirpath / f"r{rnd}", dram_bytes=0) as db:
            t0 = time.perf_counter_ns()
            for c in range(n_ctx):
                db.put(m, toks[c], bufs[c][:, 0], bufs[c][:, 1])
            ns = time.perf_counter_ns() - t0
            put_ns = ns if put_ns is None else min(put_ns, ns)
    with kvdb.open(get_db if get_db is not None else dirpath / "r1", dram_bytes=0) as db:
        best = None
        for _ in range(3):
            t0 = time.perf_counter_ns()
            for c in range(n_ctx):
                if db.get(m, toks[c], out[:, 0], out[:, 1]) != CTX_TOKENS:
                    raise RuntimeError(f"context {c}: short hit")
            ns = time.perf_counter_ns() - t0
            best = ns if best is None else min(best, ns)
        if not np.array_equal(out.view(np.uint16), bufs[-1].view(np.uint16)):
            raise RuntimeError("the KV read back differs")
    return {"bytes": total, "put_gbps": total / put_ns, "get_gbps": total / best}


def ttft_curve(quick: bool, dirpath: Path) -> Dict[str, object]:
    from kvdb import llama as kl
    from kvdb import llama_run as lr
    llm = kl.Llama(kl.smollm2_path(), n_ctx=4096)
    cdir = lr.corpus_dir()
    if cdir is None:
        raise FileNotFoundError("the Canterbury corpus was not found")
    target = 1000 if quick else 2000
    doc_text = lr.excerpt(cdir / "canterbury" / "alice29.txt", 2000, target * 5)
    other_text = lr.excerpt(cdir / "canterbury" / "plrabn12.txt", 1500, target * 5)
    head = llm.tokenize(f"<|im_start|>system\n{lr.SYSTEM}<|im_end|>\n<|im_start|>user\n")
    doc = (head + llm.tokenize(doc_text))[:target]
    other = llm.tokenize(other_text)
    reps = 1 if quick else 3
    res: Dict[str, object] = {"prompt_tokens": len(doc)}
    ident = n = 0
    with kvdb.open(dirpath) as db:
        cache = kl.LlamaPrefixCache(db, llm)
        llm.clear()
        llm.decode(doc)
        cache.store(doc)
        for pct in (25, 50, 75, 90, 99):
            h = len(doc) * pct // 100
            prompt = doc[:h] + other[: len(doc) - h]
            tk, tf = [], []
            for _ in range(reps):
                t_k, hit, a_k, _ = lr.answer(llm, cache, prompt, gen=8)
                t_f, _, a_f, _ = lr.answer(llm, None, prompt, gen=8)
                if hit != h:
                    raise RuntimeError(f"hit {hit}, expected {h}")
                tk.append(t_k)
                tf.append(t_f)
                n += 1
                ident += a_k == a_f
            mk, mf = statistics.median(tk), statistics.median(tf)
            res[f"ttft_ratio_hit{pct}"] = mk / mf
            res[f"ttft_ms_hit{pct}"] = mk * 1000
            res[f"ttft_full_ms_hit{pct}"] = mf * 1000
            print(f"  hit {pct:2d}% ({h} of {len(doc)} tokens): TTFT {mk * 1000:7.1f} ms with kvdb, "
                  f"{mf * 1000:7.1f} ms full prefill: ratio {mk / mf:.3f} ({mf / mk:.1f}x)",
                  flush=True)
    llm.close()
    res["continuations_identical"] = ident == n
    res["n_prompts"] = n
    return res


def main(args) -> int:
    quick = bool(args.quick)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kvdb-llama-bench-",
                                                                  dir=os.environ.get("TMPDIR", "/var/tmp")))
    base.mkdir(parents=True, exist_ok=True)
    fields: Dict[str, object] = {}
    try:
        if args.part in ("all", "putget"):
            n_ctx = 4 if quick else 12  # 94 MB / 283 MB (>= 256 MiB)
            get_db = getattr(args, "get_db", None)
            r = put_get(base / "putget", n_ctx, Path(get_db) if get_db else None)
            print(f"Python put/get through numpy views: {r['bytes'] / 1e6:.0f} MB, put "
                  f"{r['put_gbps']:.3f} GB/s, get {r['get_gbps']:.3f} GB/s", flush=True)
            fields["py_put_gbps"] = r["put_gbps"]
            fields["py_get_gbps"] = r["get_gbps"]
        if args.part == "putget":
            pass
        else:
          try:
            import llama_cpp  # noqa: F401
            from kvdb import llama as kl
            kl.check_version()
            kl.smollm2_path()
          except (ImportError, FileNotFoundError, kvdb.Error) as e:
            print(f"TTFT part skipped: {e}", flush=True)
            fields["llama_skipped"] = str(e)
          else:
            print("TTFT of SmolLM2-135M (llama.cpp) with kvdb vs a full prefill:", flush=True)
            fields.update(ttft_curve(quick, base / "ttft"))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        if os.environ.get("KVDB_BENCH_FIELDS"):  # kvdb-bench reads '@json NAME VALUE' lines
            for k, v in fields.items():
                print(f"@json {k} {json.dumps(v)}")
        else:
            print(json.dumps(fields))
    return 0
