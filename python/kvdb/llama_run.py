# SPDX-License-Identifier: MIT
"""The llama.cpp + SmolLM2 workload of kvdb's demo, tests and benchmark.

    python -m kvdb.llama_run ingest DB [--states DIR]   process 1: documents in, questions answered
    python -m kvdb.llama_run ask DB                      process 2: new questions, hit tokens, TTFT
    python -m kvdb.llama_run bench [--quick] [--json]    TTFT at 25..99% hit, Python vs C put/get

Documents are excerpts of the public-domain texts of the Canterbury corpus (../shared/corpora/
canterbury: Carroll's Alice, Shakespeare's As You Like It, the Library of Congress workshop
report lcet10, Milton's Paradise Lost), found through KVDB_CORPUS_DIR, KVDB_SHARED_DIR/corpora
or ../shared/corpora beside the repository. Prompts use SmolLM2's ChatML template; the
document part of each prompt is tokenized on its own, so every prompt about one document starts
with the same tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

import kvdb
from kvdb import llama as kl

DOCS = [  # (file, offset of the excerpt, title)
    ("alice29.txt", 2000, "Alice's Adventures in Wonderland (Lewis Carroll)"),
    ("asyoulik.txt", 3000, "As You Like It (William Shakespeare)"),
    ("lcet10.txt", 8000, "Workshop on Electronic Texts (Library of Congress, 1992)"),
    ("plrabn12.txt", 1500, "Paradise Lost, Book I (John Milton)"),
]
QUESTIONS_FIRST = ["Summarize the text in one sentence.", "Who is mentioned in the text?",
                   "What is the main topic of the text?"]
QUESTIONS_NEW = ["What is the mood of the text?", "Give the text a short title.",
                 "What happens first in the text?"]
FOLLOW_UP = "Explain your answer in more detail."
SYSTEM = "You are a helpful assistant. Answer questions about the text the user gives."
GEN_TOKENS = 8


def corpus_dir() -> Optional[Path]:
    cands = []
    if os.environ.get("KVDB_CORPUS_DIR"):
        cands.append(Path(os.environ["KVDB_CORPUS_DIR"]))
    if os.environ.get("KVDB_SHARED_DIR"):
        cands.append(Path(os.environ["KVDB_SHARED_DIR"]) / "corpora")
    here = Path(__file__).resolve()
    cands += [p / ".." / "shared" / "corpora" for p in here.parents]
    for c in cands:
        if (c / "canterbury" / "alice29.txt").is_file():
            return c.resolve()
    return None


def excerpt(path: Path, offset: int, chars: int) -> str:
    text = path.read_bytes().decode("latin-1").replace("\r\n", "\n")
    start = text.find("\n\n", offset) + 2
    end = text.rfind("\n\n", start, start + chars)
    if end <= start:
        end = start + chars
    return " ".join(text[start:end].split())


class Prompts:
    """Token lists of the documents' shared prefixes and of the question suffixes."""

    def __init__(self, llm: kl.Llama, chars: int = 1600):
        """Documents of about `chars` characters each (1,600: 270-450 tokens)."""
        cdir = corpus_dir()
        if cdir is None:
            raise FileNotFoundError("the Canterbury corpus (../shared/corpora/canterbury) was not "
                                    "found; set KVDB_CORPUS_DIR or KVDB_SHARED_DIR")
        self.llm = llm
        self.docs: List[Tuple[str, List[int]]] = []
        for fname, off, title in DOCS:
            text = excerpt(cdir / "canterbury" / fname, off, chars)
            pre = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
                   f"Text ({title}):\n{text}\n")
            self.docs.append((title, llm.tokenize(pre)))

    def question(self, q: str, first: bool = True) -> List[int]:
        if first:
            return self.llm.tokenize(f"\nQuestion: {q}<|im_end|>\n<|im_start|>assistant\n")
        return self.llm.tokenize(f"<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
                                 "<|im_start|>assistant\n")


def answer(llm: kl.Llama, cache: Optional[kl.LlamaPrefixCache], prompt: List[int],
           gen: int = GEN_TOKENS):
    """TTFT (s), hit tokens, the greedy answer and the first position's logits, with kvdb
    (cache) or by a full prefill (cache None)."""
    t0 = time.perf_counter()
    if cache is not None:
        h = cache.restore(prompt)
    else:
        llm.clear()
        h = 0
    logits = llm.decode(prompt[h:])
    t1 = time.perf_counter() - t0
    toks, steps = llm.greedy(logits, gen)
    return t1, h, toks, steps


def open_llm(**kw) -> kl.Llama:
    return kl.Llama(kl.smollm2_path(), **kw)


def cmd_ingest(args) -> int:
    """Process 1: every document's prefix is prefilled once and stored; each first question is
    answered from the stored prefix and the conversation (prompt + answer) stored; a follow-up
    turn of the first question's chat too. With --states, llama.cpp's own saved state of every
    stored sequence goes to DIR (the tests' oracle)."""
    llm = open_llm()
    states = Path(args.states) if args.states else None
    if states:
        states.mkdir(parents=True, exist_ok=True)
    manifest = []
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    with kvdb.open(args.db) as db:
        cache = kl.LlamaPrefixCache(db, llm)
        P = Prompts(llm, args.chars)

        def keep(tokens: List[int]) -> None:
            cache.store(tokens)
            if states:
                name = f"seq{len(manifest):03d}"
                np.save(states / f"{name}.npy", llm.state_bytes())
                manifest.append({"name": name, "tokens": [int(t) for t in tokens]})

        t_all = time.perf_counter()
        for di, (title, doc) in enumerate(P.docs):
            llm.clear()
            t0 = time.perf_counter()
            llm.decode(doc)
            dt = time.perf_counter() - t0
            keep(doc)
            print(f"[ingest] document {di}: {title}: {len(doc)} tokens prefilled in "
                  f"{dt * 1000:.0f} ms and stored")
            for qi, q in enumerate(QUESTIONS_FIRST):
                prompt = doc + P.question(q)
                ttft, h, toks, _ = answer(llm, cache, prompt)
                conv = prompt + toks[:-1]  # what the sequence holds (the last token not decoded)
                keep(conv)
                print(f"[ingest]   Q: {q}  hit {h}/{len(prompt)}  TTFT {ttft * 1000:.0f} ms\n"
                      f"[ingest]   A: {llm.detokenize(toks).strip()!r}")
                if qi == 0:
                    follow = conv + [toks[-1]] + P.question(FOLLOW_UP, first=False)
                    ttft, h, toks2, _ = answer(llm, cache, follow)
                    keep(follow + toks2[:-1])
                    print(f"[ingest]   Q (turn 2): {FOLLOW_UP}  hit {h}/{len(follow)}  TTFT "
                          f"{ttft * 1000:.0f} ms\n[ingest]   A: {llm.detokenize(toks2).strip()!r}")
        print(f"[ingest] {len(P.docs)} documents, {len(manifest) or 'all'} sequences stored in "
              f"{time.perf_counter() - t_all:.1f} s")
    if states:
        (states / "manifest.json").write_text(json.dumps(manifest))
    llm.close()
    return 0


def ask_prompts(llm: kl.Llama, P: Prompts) -> List[Tuple[str, List[int]]]:
    """The second process's prompts: per document the new questions, one question asked before
    and a second turn of a stored chat (built from the stored answer, regenerated greedily)."""
    out = []
    for di, (title, doc) in enumerate(P.docs):
        for q in QUESTIONS_NEW:
            out.append((f"doc {di} new: {q}", doc + P.question(q)))
        out.append((f"doc {di} again: {QUESTIONS_FIRST[1]}", doc + P.question(QUESTIONS_FIRST[1])))
    return out


def cmd_ask(args) -> int:
    """Process 2: new questions about the stored documents, each answered from kvdb and by a
    full prefill: hit tokens, both TTFTs, identical answers."""
    llm = open_llm()
    P = Prompts(llm, args.chars)
    rows = []
    with kvdb.open(args.db) as db:
        cache = kl.LlamaPrefixCache(db, llm)
        for name, prompt in ask_prompts(llm, P):
            tk, h, ak, sk = answer(llm, cache, prompt)
            tf, _, af, sf = answer(llm, None, prompt)
            same = ak == af
            rows.append((tk, tf, same))
            print(f"[ask] {name}\n[ask]   hit {h}/{len(prompt)} tokens  TTFT {tk * 1000:.0f} ms "
                  f"with kvdb, {tf * 1000:.0f} ms without ({tf / tk:.1f}x)  answers "
                  f"{'identical' if same else 'differ'}; first-token logits differ by at most "
                  f"{float(np.max(np.abs(sk[0] - sf[0]))):.3f}\n[ask]   A: "
                  f"{llm.detokenize(ak).strip()!r}")
            if not same:
                # llama.cpp's prefill arithmetic depends on the batch (a restored prefix + the
                # rest vs one batch): where the two best tokens nearly tie, greedy may flip
                i = next((j for j, (x, y) in enumerate(zip(ak, af)) if x != y),
                         min(len(ak), len(af), len(sk), len(sf)) - 1)
                i = min(i, len(sk) - 1, len(sf) - 1)
                top = np.argsort(sf[i])[-2:][::-1]
                print(f"[ask]   full prefill: {llm.detokenize(af).strip()!r}\n[ask]   they part "
                      f"at token {i}: a near-tie, the full prefill's two best logits "
                      f"{sf[i][top[0]]:.4f} ({llm.detokenize([top[0]])!r}) and {sf[i][top[1]]:.4f} "
                      f"({llm.detokenize([top[1]])!r}); with kvdb "
                      f"{sk[i][top[0]]:.4f} and {sk[i][top[1]]:.4f}")
    tk = sum(r[0] for r in rows)
    tf = sum(r[1] for r in rows)
    n_same = sum(r[2] for r in rows)
    print(f"[ask] {len(rows)} prompts: TTFT {tk / len(rows) * 1000:.0f} ms with kvdb, "
          f"{tf / len(rows) * 1000:.0f} ms without (mean; {tf / tk:.1f}x); {n_same}/{len(rows)} "
          "answers identical (the others: near-ties, shown above)")
    llm.close()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvdb.llama_run")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("ingest")
    a.add_argument("db")
    a.add_argument("--states")
    a.add_argument("--chars", type=int, default=1600)
    a = sub.add_parser("ask")
    a.add_argument("db")
    a.add_argument("--chars", type=int, default=1600)
    a = sub.add_parser("bench")
    a.add_argument("--quick", action="store_true")
    a.add_argument("--json", action="store_true")
    a.add_argument("--dir", default=None)
    a.add_argument("--part", choices=("all", "putget", "ttft"), default="all")
    a.add_argument("--get-db", default=None,
                   help="get from this database (kvdb-bench llama's C side wrote it) instead "
                        "of the one the Python put wrote, so both sides read the same files")
    a.add_argument("--flash-attn", choices=("on", "off"), default=None,
                   help="llama.cpp's flash attention for the TTFT part (default: off)")
    a.add_argument("--n-ubatch", type=int, default=None, help="llama.cpp's n_ubatch")
    a.add_argument("--n-threads", type=int, default=None, help="llama.cpp's threads")
    a.add_argument("--hits", default=None, help="hit percentages, e.g. 90 (default 25,50,75,90,99)")
    a.add_argument("--reps", type=int, default=None, help="repetitions per hit (default 3, quick 1)")
    args = ap.parse_args(argv)
    if args.cmd == "ingest":
        return cmd_ingest(args)
    if args.cmd == "ask":
        return cmd_ask(args)
    from kvdb import llama_bench
    return llama_bench.main(args)


if __name__ == "__main__":
    sys.exit(main())
