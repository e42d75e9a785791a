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
   compared (continuations_identical, n_prompts). Beside them the oracle, a restore that costs
   nothing (ttft_oracle_ratio_hitNN: the lower bound of any prefix cache with the same
   llama.cpp settings), kvdb's restore alone (restore_ms_hitNN) and the same ratios in process
   CPU time (ttft_cpu_ratio_hitNN, ttft_oracle_cpu_ratio_hitNN; steadier on a shared machine).
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
from typing import Dict, List, Optional, Sequence

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


def ttft_curve(quick: bool, dirpath: Path, flash_attn: bool = False,
               n_ubatch: Optional[int] = None, n_threads: Optional[int] = None,
               hits: Sequence[int] = (25, 50, 75, 90, 99), reps: Optional[int] = None
               ) -> Dict[str, object]:
    """TTFT at each hit percentage (a prompt whose first pct% tokens are a stored document's
    first tokens), per repetition three ways on the same prompt, one after the other: by a full
    prefill; the oracle -- the prefix's KV already in llama.cpp's context at no cost (the full
    prefill's own cells, llama_memory_seq_rm of the tail) and only the rest decoded: the lower
    bound of any prefix cache with these settings; and with kvdb (restore = lookup + get +
    llama_state_seq_set_data into a cleared sequence, then decode the rest). The prefix is put
    into kvdb (untimed) from the first full prefill's cells. Every way uses the same
    context (flash attention, n_ubatch, threads). Wall-clock and process CPU time (all of
    llama.cpp's threads) are both reported: on a shared machine CPU time is the steadier one."""
    from kvdb import llama as kl
    from kvdb import llama_run as lr
    llm = kl.Llama(kl.smollm2_path(), n_ctx=4096, flash_attn=flash_attn, n_ubatch=n_ubatch,
                   n_threads=n_threads)
    cdir = lr.corpus_dir()
    if cdir is None:
        raise FileNotFoundError("the Canterbury corpus was not found")
    target = 1000 if quick else 2000
    doc_text = lr.excerpt(cdir / "canterbury" / "alice29.txt", 2000, target * 5)
    other_text = lr.excerpt(cdir / "canterbury" / "plrabn12.txt", 1500, target * 5)
    head = llm.tokenize(f"<|im_start|>system\n{lr.SYSTEM}<|im_end|>\n<|im_start|>user\n")
    doc = (head + llm.tokenize(doc_text))[:target]
    other = llm.tokenize(other_text)
    reps = reps or (1 if quick else 3)
    print(f"  llama.cpp context: flash attention {'on' if llm.flash_attn else 'off'} (V "
          f"{'transposed' if llm.v_trans else 'in rows'}), n_batch {llm.n_batch}, n_ubatch "
          f"{llm.n_ubatch}, {llm.n_threads} threads; {reps} repetition(s), medians", flush=True)
    res: Dict[str, object] = {"prompt_tokens": len(doc), "flash_attn": llm.flash_attn,
                              "n_ubatch": llm.n_ubatch, "n_threads": llm.n_threads}
    ident = ident_o = n = 0
    wall, cpu = time.perf_counter, time.process_time
    with kvdb.open(dirpath) as db:
        cache = kl.LlamaPrefixCache(db, llm)
        for pct in hits:
            h = len(doc) * pct // 100
            prompt = doc[:h] + other[: len(doc) - h]
            t: Dict[str, List[float]] = {k: [] for k in ("kvdb", "restore", "full", "oracle",
                                                          "c_kvdb", "c_full", "c_oracle")}
            for rep in range(reps):
                llm.clear()                                 # full prefill
                c0, t0 = cpu(), wall()
                lg = llm.decode(prompt)
                t["full"].append(wall() - t0)
                t["c_full"].append(cpu() - c0)
                a_f, _ = llm.greedy(lg, 8)
                llm.truncate(h)                             # the context holds prompt[:h] now
                if rep == 0 and cache.db.lookup(cache.model, prompt[:h]) < h:
                    cache.store(prompt[:h])                 # (untimed) what kvdb will restore
                c0, t0 = cpu(), wall()                      # oracle: the prefix is already there
                lg = llm.decode(prompt[h:])
                t["oracle"].append(wall() - t0)
                t["c_oracle"].append(cpu() - c0)
                a_o, _ = llm.greedy(lg, 8)
                c0, t0 = cpu(), wall()                      # with kvdb (restore clears first)
                hit = cache.restore(prompt)
                t1 = wall()
                lg = llm.decode(prompt[hit:])
                t["kvdb"].append(wall() - t0)
                t["c_kvdb"].append(cpu() - c0)
                t["restore"].append(t1 - t0)
                a_k, _ = llm.greedy(lg, 8)
                if hit != h:
                    raise RuntimeError(f"hit {hit}, expected {h}")
                n += 1
                ident += a_k == a_f
                ident_o += a_o == a_f
            m = {k: statistics.median(v) for k, v in t.items()}
            r, ro = m["kvdb"] / m["full"], m["oracle"] / m["full"]
            res[f"ttft_ratio_hit{pct}"] = r
            res[f"ttft_oracle_ratio_hit{pct}"] = ro
            res[f"ttft_cpu_ratio_hit{pct}"] = m["c_kvdb"] / m["c_full"]
            res[f"ttft_oracle_cpu_ratio_hit{pct}"] = m["c_oracle"] / m["c_full"]
            res[f"ttft_ms_hit{pct}"] = m["kvdb"] * 1000
            res[f"ttft_full_ms_hit{pct}"] = m["full"] * 1000
            res[f"ttft_oracle_ms_hit{pct}"] = m["oracle"] * 1000
            res[f"restore_ms_hit{pct}"] = m["restore"] * 1000
            for k in ("kvdb", "full", "oracle"):
                res[f"cpu_ms_{k}_hit{pct}"] = m["c_" + k] * 1000
            print(f"  hit {pct:2d}% ({h} of {len(doc)} tokens): TTFT {m['kvdb'] * 1000:7.1f} ms "
                  f"with kvdb (restore {m['restore'] * 1000:.1f}), {m['full'] * 1000:7.1f} ms full "
                  f"prefill: ratio {r:.3f} ({1 / r:.1f}x); oracle (prefix already cached, free) "
                  f"{m['oracle'] * 1000:7.1f} ms: ratio {ro:.3f}; CPU-time ratios "
                  f"{res[f'ttft_cpu_ratio_hit{pct}']:.3f} / oracle "
                  f"{res[f'ttft_oracle_cpu_ratio_hit{pct}']:.3f} (CPU {m['c_kvdb']:.1f} / "
                  f"{m['c_full']:.1f} / {m['c_oracle']:.1f} s)", flush=True)
    llm.close()
    res["continuations_identical"] = ident == n
    res["oracle_continuations_identical"] = ident_o == n
    res["n_prompts"] = n
    return res


def design_args(args) -> Dict[str, object]:
    """The llama.cpp context settings the command line chose (None: the defaults)."""
    out: Dict[str, object] = {}
    if getattr(args, "flash_attn", None) is not None:
        out["flash_attn"] = args.flash_attn == "on"
    for k in ("n_ubatch", "n_threads", "reps"):
        if getattr(args, k, None):
            out[k] = getattr(args, k)
    if getattr(args, "hits", None):
        out["hits"] = [int(x) for x in args.hits.split(",")]
    return out


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
            fields.update(ttft_curve(quick, base / "ttft", **design_args(args)))
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
