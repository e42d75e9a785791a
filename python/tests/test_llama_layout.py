# SPDX-License-Identifier: MIT
"""kvdb.llama's parser and builder of llama.cpp sequence-state bytes, without llama.cpp: built
bytes parse back to the same views, a kvdb round trip through them is exact, and bytes of
another layout are refused naming what differed. (tests/llama runs them against llama.cpp.)"""
import struct

import numpy as np
import pytest

import kvdb
from kvdb import llama as kl

SHAPE = kl.KVShape(n_layer=4, n_head_kv=3, head_dim=8)


def filled(n, v_trans, seed=0):
    st = kl.build_seq_state(n, SHAPE, v_trans)
    rng = np.random.default_rng(seed)
    for l in range(SHAPE.n_layer):
        st.k[l][...] = rng.standard_normal(st.k[l].shape).astype(np.float16)
        st.v[l][...] = rng.standard_normal(st.v[l].shape).astype(np.float16)
    return st


@pytest.mark.parametrize("v_trans", [False, True])
def test_build_parse_and_kvdb_round_trip(tmp_path, v_trans):
    n = 37
    st = filled(n, v_trans)
    assert len(st.buf) == kl.state_size(n, SHAPE, v_trans)
    p = kl.parse_seq_state(st.buf, SHAPE)
    assert p.n_cells == n and p.v_trans == v_trans
    for l in range(SHAPE.n_layer):
        assert np.shares_memory(p.k[l], st.buf) and np.shares_memory(p.v[l], st.buf)
        np.testing.assert_array_equal(p.k[l], st.k[l])
        np.testing.assert_array_equal(p.v[l], st.v[l])
    if v_trans:  # V of layer 0, dimension (head 1, dim 2), is one run of n elements
        off = p.v[0].__array_interface__["data"][0] - st.buf.ctypes.data
        run = np.frombuffer(st.buf, np.float16, n, off + (1 * SHAPE.head_dim + 2) * n * 2)
        np.testing.assert_array_equal(run, st.v[0][:, 1, 2])
    m = kvdb.Model("llama-layout", SHAPE.n_layer, SHAPE.n_head_kv, SHAPE.head_dim, "f16", 16)
    toks = np.arange(n, dtype=np.uint32) + 5
    with kvdb.open(tmp_path / "db", sync="none") as db:
        db.put(m, toks, p.k, p.v)  # views into the state bytes, no copy
        for h in (n, 20):  # the whole sequence, and a prefix of it
            b = kl.build_seq_state(h, SHAPE, v_trans)
            assert db.get(m, toks[:h], b.k, b.v) == h
            if h == n:
                assert np.array_equal(b.buf, st.buf)
            for l in range(SHAPE.n_layer):
                np.testing.assert_array_equal(b.k[l], st.k[l][:h])
                np.testing.assert_array_equal(b.v[l], st.v[l][:h])


def test_other_layouts_refused():
    st = filled(5, True)
    good = st.buf
    cases = []
    b = good.copy(); b[0] ^= 1
    cases.append((b, "magic 0xAF143CD9"))
    b = good.copy(); struct.pack_into("<I", b, 8, 2)
    cases.append((b, "n_stream 2"))
    b = good.copy(); struct.pack_into("<I", b, 16 + 4, 2)  # cell 0 in two sequences
    cases.append((b, "cell 0 belongs to 2 sequences"))
    b = good.copy(); struct.pack_into("<i", b, 16 + 12, 7)  # cell 1 at position 7
    cases.append((b, "cell 1 is at position 7"))
    o = 16 + 12 * 5
    b = good.copy(); struct.pack_into("<I", b, o, 2)
    cases.append((b, "v_trans 2"))
    b = good.copy(); struct.pack_into("<i", b, o + 8, 8)  # layer 0's K type: q8_0
    cases.append((b, r"K cache type q8_0 \(ggml type 8\) at layer 0"))
    b = good.copy(); struct.pack_into("<Q", b, o + 12, 96)
    cases.append((b, "K row size 96"))
    cases.append((np.concatenate([good, np.zeros(3, np.uint8)]), "3 bytes follow"))
    cases.append((good[:-1].copy(), "end at"))
    for b, msg in cases:
        with pytest.raises(kl.StateLayoutError, match=msg) as e:
            kl.parse_seq_state(b, SHAPE)
        assert e.value.status == kvdb.Status.UNSUPPORTED
    with pytest.raises(kl.StateLayoutError, match="n_layer 4, the model has 5"):
        kl.parse_seq_state(good, kl.KVShape(5, 3, 8))


def test_unknown_llama_cpp_version_refused():
    with pytest.raises(kl.StateLayoutError, match="llama-cpp-python 0.2.90"):
        kl.check_version("0.2.90")
    assert kl.check_version("0.3.36") == "0.3.36"
