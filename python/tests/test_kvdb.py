# SPDX-License-Identifier: MIT
"""The kvdb Python package against libkvdb: round trips through three layouts, views of
transposed tensors, errors as exceptions, two threads on one handle, torch tensors."""
import ctypes
import threading
import time

import numpy as np
import pytest

import kvdb
from kvdb import _lib

M = kvdb.Model("py-test", n_layers=3, n_kv_heads=2, head_dim=8, dtype="f16", block_tokens=16)


def logical(n, seed=1, model=M):
    """Reference K and V, shape (layer, token, head, dim), distinct values."""
    rng = np.random.default_rng(seed)
    shape = (model.n_layers, n, model.n_kv_heads, model.head_dim)
    return (rng.standard_normal(shape).astype(np.float16),
            rng.standard_normal(shape).astype(np.float16))


def toks(n, start=1000):
    return np.arange(start, start + n, dtype=np.uint32)


# The three layouts: each a packed buffer and the logical (layer, token, head, dim) views of it.
def lkthd(n, model=M):
    """[layer][K,V][token][head][dim] (vLLM/LMCache-like)."""
    buf = np.zeros((model.n_layers, 2, n, model.n_kv_heads, model.head_dim), np.float16)
    return buf, buf[:, 0], buf[:, 1]


def lkhtd(n, model=M):
    """[layer][K,V][head][token][dim] (Hugging Face-like): the views are transposes."""
    buf = np.zeros((model.n_layers, 2, model.n_kv_heads, n, model.head_dim), np.float16)
    return buf, buf[:, 0].transpose(0, 2, 1, 3), buf[:, 1].transpose(0, 2, 1, 3)


def llama_vt(n, model=M):
    """llama.cpp-like: per layer a K block [token][head*dim] and a transposed V block
    [head*dim][token], each layer its own allocation (a list of per-layer views)."""
    ks = [np.zeros((n, model.n_kv_heads * model.head_dim), np.float16) for _ in range(model.n_layers)]
    vs = [np.zeros((model.n_kv_heads * model.head_dim, n), np.float16) for _ in range(model.n_layers)]
    kv = [a.reshape(n, model.n_kv_heads, model.head_dim) for a in ks]
    vv = [a.reshape(model.n_kv_heads, model.head_dim, n).transpose(2, 0, 1) for a in vs]
    return (ks, vs), kv, vv


LAYOUTS = {"lkthd": lkthd, "lkhtd": lkhtd, "llama_vt": llama_vt}


def fill(views_k, views_v, k, v):
    for l in range(M.n_layers):
        views_k[l][...] = k[l]
        views_v[l][...] = v[l]


def as_logical(views):
    return np.stack([np.asarray(x) for x in views])


@pytest.fixture
def db(tmp_path):
    with kvdb.open(tmp_path / "db", sync="none") as d:
        yield d


@pytest.mark.parametrize("src", sorted(LAYOUTS))
@pytest.mark.parametrize("dst", sorted(LAYOUTS))
def test_round_trip_layouts(db, src, dst):
    n = 40  # two full blocks and a partial one
    k, v = logical(n)
    _, sk, sv = LAYOUTS[src](n)
    fill(sk, sv, k, v)
    info = db.put(M, toks(n), sk, sv)
    assert info.n_blocks == 3 and info.context == M.context_key(toks(n))
    # the views were read in place: no array was copied (they still alias their buffers)
    for x in (sk if isinstance(sk, list) else [sk]):
        assert x.base is not None
    buf, dk, dv = LAYOUTS[dst](n + 5)
    q = np.concatenate([toks(n), [7, 8, 9, 10, 11]]).astype(np.uint32)
    assert db.lookup(M, q) == n
    assert db.get(M, q, dk, dv) == n
    np.testing.assert_array_equal(as_logical(dk)[:, :n], k)
    np.testing.assert_array_equal(as_logical(dv)[:, :n], v)


def test_prefix_hit_and_token_granularity(db):
    n = 37
    k, v = logical(n)
    _, sk, sv = lkthd(n)
    fill(sk, sv, k, v)
    db.put(M, toks(n), sk, sv)
    q = np.concatenate([toks(21), [1, 2, 3]]).astype(np.uint32)  # diverges inside block 2
    _, dk, dv = lkhtd(len(q))
    assert db.get(M, q, dk, dv) == 21
    np.testing.assert_array_equal(dk[:, :21], k[:, :21])
    np.testing.assert_array_equal(dv[:, :21], v[:, :21])


def test_transposed_view_put_and_get(db):
    """A tensor stored as (head, dim, layer, token) put through its transpose — negative and
    non-unit strides included — and read back into a reversed-token view."""
    n = 20
    k, v = logical(n)
    kt = np.ascontiguousarray(k.transpose(2, 3, 0, 1))  # (head, dim, layer, token)
    vt = np.ascontiguousarray(v.transpose(2, 3, 0, 1))
    kview = kt.transpose(2, 3, 0, 1)  # back to (layer, token, head, dim): strides only
    assert not kview.flags.c_contiguous and np.shares_memory(kview, kt)
    db.put(M, toks(n), kview, vt.transpose(2, 3, 0, 1))
    out_k = np.zeros((M.n_layers, n, M.n_kv_heads, M.head_dim), np.float16)
    out_v = np.zeros_like(out_k)
    rev_k = out_k[:, ::-1]  # negative token stride
    rev_v = out_v[:, ::-1]
    assert db.get(M, toks(n)[::-1].copy(), rev_k, rev_v) == 0  # reversed tokens: a miss
    # get into the reversed views with the right tokens: token i lands at out[:, n-1-i]
    assert db.get(M, toks(n), rev_k, rev_v) == n
    np.testing.assert_array_equal(out_k[:, ::-1], k)
    np.testing.assert_array_equal(out_v[:, ::-1], v)


def test_get_tokens_and_iterate_stat_delete_verify(db):
    n = 33
    k, v = logical(n)
    _, sk, sv = lkthd(n)
    fill(sk, sv, k, v)
    info = db.put(M, toks(n), sk, sv)
    pos = [32, 0, 5, 5]
    ok = np.zeros((M.n_kv_heads, M.head_dim, len(pos)), np.float16).transpose(2, 0, 1)
    ov = np.zeros((len(pos), M.n_kv_heads, M.head_dim), np.float16)
    db.get_tokens(M, info.context, 1, pos, ok, ov)
    np.testing.assert_array_equal(ok, k[1, pos])
    np.testing.assert_array_equal(ov, v[1, pos])
    ctxs = list(db.iterate())
    assert [c.key for c in ctxs] == [info.context]
    assert ctxs[0].n_tokens == n and ctxs[0].model_id == "py-test" and ctxs[0].config == "raw"
    assert db.context_stat(info.context.hex()).n_blocks == 3
    st = db.stat()
    assert st.n_contexts == 1 and st.n_blocks == 3 and st.format_version >= 1
    rep = db.verify()
    assert rep.ok and rep.blocks_checked == 3 and rep.contexts_checked == 1
    db.delete(info)
    assert db.lookup(M, toks(n)) == 0
    with pytest.raises(kvdb.NotFoundError) as e:
        db.delete(info.context)
    assert e.value.status == kvdb.Status.NOTFOUND


def test_lossless_config_and_persistence(tmp_path):
    n = 50
    k, v = logical(n, seed=4)
    _, sk, sv = lkthd(n)
    fill(sk, sv, k, v)
    with kvdb.open(tmp_path / "db") as d:
        d.put(M, toks(n), sk, sv, config="lossless")
    with kvdb.open(tmp_path / "db", readonly=True) as d:  # reopened: the put was durable
        _, dk, dv = lkthd(n)
        assert d.get(M, toks(n), dk, dv) == n
        np.testing.assert_array_equal(dk, k)
        assert next(d.iterate()).config.startswith("lossless")
        with pytest.raises(kvdb.ReadOnlyError) as e:
            d.put(M, toks(n, 5), sk, sv)
        assert e.value.status == kvdb.Status.READONLY and e.value.message


def test_int4_with_rope_model(tmp_path):
    """int4 is KVQuant: with the model's RoPE it quantizes K before RoPE (the struct mirror
    carries rope_base/rope_style); kivi4 stays reachable; a bad rope_style is refused."""
    n = 48
    k, v = logical(n, seed=9)
    _, sk, sv = lkthd(n)
    fill(sk, sv, k, v)
    mr = kvdb.Model("py-rope", n_layers=3, n_kv_heads=2, head_dim=8, dtype="f16",
                    block_tokens=16, rope_base=10000.0, rope_style="adjacent")
    with kvdb.open(tmp_path / "db") as d:
        d.put(mr, toks(n), sk, sv, config="int4")
        d.put(mr, toks(n, 5000), sk, sv, config="kivi4")
        _, dk, dv = lkthd(n)
        assert d.get(mr, toks(n), dk, dv) == n
        ko = as_logical(dk).astype(np.float32)
        rel = np.linalg.norm(ko - k.astype(np.float32)) / np.linalg.norm(k.astype(np.float32))
        assert 0 < rel < 0.2  # lossy, close
        names = sorted(c.config for c in d.iterate())
        assert names == ["int4", "kivi4"]
        with pytest.raises(kvdb.InvalidError):
            d.put(kvdb.Model("py-rope2", 3, 2, 8, rope_base=10000.0, rope_style="spiral"),
                  toks(n), sk, sv)
        with pytest.raises(kvdb.InvalidError):  # a base without a style (C's check)
            d.put(kvdb.Model("py-rope3", 3, 2, 8, rope_base=10000.0), toks(n), sk, sv)


def test_calibrate_int4(tmp_path):
    """DB.calibrate (kvdb_model_calibrate): stored with the model, reported by
    model_calibration, reused by the next handle; a calibrated model's int4 puts read back
    close to the original and differ from an uncalibrated database's; bad inputs raise."""
    mr = kvdb.Model("py-cal", n_layers=3, n_kv_heads=2, head_dim=8, dtype="f16",
                    block_tokens=16, rope_base=10000.0, rope_style="adjacent")
    rng = np.random.default_rng(3)
    n, qh = 64, 4
    ctxs = []
    for c in range(2):
        k, v = logical(n, seed=20 + c)
        q = (rng.standard_normal((n, 3, qh, 8)) * np.linspace(3, 0.3, 8)).astype(np.float32)
        ctxs.append((k, v, q, np.arange(n)))
    k, v = logical(n, seed=40)
    with kvdb.open(tmp_path / "plain") as d:
        d.put(mr, toks(n), k, v, config="int4")
        pk, pv = np.zeros_like(k), np.zeros_like(v)
        assert d.get(mr, toks(n), pk, pv) == n
        assert d.model_calibration("py-cal")["calibrated"] is False
    with kvdb.open(tmp_path / "db") as d:
        with pytest.raises(kvdb.InvalidError):
            d.calibrate(mr, [], qh)
        with pytest.raises(kvdb.InvalidError):  # no queries
            d.calibrate(mr, [(ctxs[0][0], ctxs[0][1], ctxs[0][2][:0], [])], qh)
        with pytest.raises(kvdb.InvalidError):  # queries of the wrong shape
            d.calibrate(mr, [(ctxs[0][0], ctxs[0][1], ctxs[0][2][:, :, :3], np.arange(n))], qh)
        with pytest.raises(kvdb.InvalidError):  # n_q_heads not a multiple of n_kv_heads
            d.calibrate(mr, [(ctxs[0][0], ctxs[0][1], ctxs[0][2][:, :, :3], np.arange(n))], 3)
        d.calibrate(mr, ctxs, qh)
        info = d.model_calibration("py-cal")
        assert info["calibrated"] and info["int4"] and info["int2"]
        assert info["n_contexts"] == 2 and abs(info["int4_bits"] - 4.5) < 1e-6
    with kvdb.open(tmp_path / "db") as d:  # persisted
        assert d.model_calibration("py-cal")["calibrated"]
        d.put(mr, toks(n), k, v, config="int4")
        ck, cv = np.zeros_like(k), np.zeros_like(v)
        assert d.get(mr, toks(n), ck, cv) == n
        kf = k.astype(np.float32)
        rel = np.linalg.norm(ck.astype(np.float32) - kf) / np.linalg.norm(kf)
        assert 0 < rel < 0.2
        assert not np.array_equal(ck, pk)  # coded with the calibration's widths
        with pytest.raises(kvdb.NotFoundError):
            d.model_calibration("no-such-model")


def test_score(db):
    ms = kvdb.Model("py-score", 2, 2, 16, "f16", block_tokens=16, score_bits=8)
    n = 48
    k, v = logical(n, seed=9, model=ms)
    info = db.put(ms, toks(n), k, v)
    q = k[1, 17, 0].astype(np.float32)
    pos, sc = db.score(ms, info.context, 1, 0, q, 5)
    assert len(pos) == 5 and np.all(np.diff(sc) <= 0)
    exact = k[1, :, 0].astype(np.float32) @ q
    assert pos[0] == int(np.argmax(exact))
    # head_dim 16 and no SmartSSD tier: the blocks carry version-2 score copies
    assert db.context_stat(info.context).score_versions == 2


def test_errors_are_exceptions(db, tmp_path):
    n = 16
    k, v = logical(n)
    # wrong shape: named by the package before the call
    with pytest.raises(kvdb.InvalidError, match=r"k: shape"):
        db.put(M, toks(n), k[:, :, :1], v)
    # wrong dtype
    with pytest.raises(kvdb.InvalidError, match="dtype float32"):
        db.put(M, toks(n), k.astype(np.float32), v)
    # a read-only output
    ro = np.zeros_like(k)
    ro.flags.writeable = False
    with pytest.raises(kvdb.InvalidError, match="read-only"):
        db.get(M, toks(n), ro, np.zeros_like(v))
    # from the library: the model's id is stored with another shape -> KVDB_MISMATCH + message
    db.put(M, toks(n), k, v)
    other = kvdb.Model("py-test", n_layers=3, n_kv_heads=2, head_dim=8, dtype="f32",
                       block_tokens=16)
    with pytest.raises(kvdb.MismatchError) as e:
        db.put(other, toks(n, 9), k.astype(np.float32), v.astype(np.float32))
    assert e.value.status == kvdb.Status.MISMATCH == 12
    assert "py-test" in e.value.message
    # a bad model (block_tokens not a power of two): KVDB_INVALID from the library
    bad = kvdb.Model("py-bad", 3, 2, 8, "f16", block_tokens=17)
    with pytest.raises(kvdb.InvalidError) as e:
        db.lookup(bad, toks(4))
    assert e.value.status == kvdb.Status.INVALID and "block_tokens" in e.value.message
    # a missing database without create
    with pytest.raises(kvdb.NotFoundError):
        kvdb.open(tmp_path / "absent", create=False)
    with pytest.raises(TypeError, match="unknown option"):
        kvdb.open(tmp_path / "x", no_such_option=1)
    # remote_write: names or bits; unknown ones refused naming the option (no server needed:
    # kvdb_open never connects)
    with kvdb.open(tmp_path / "rw", remote_addr="127.0.0.1:1", remote_write="evict"):
        pass
    with pytest.raises(kvdb.InvalidError, match="remote_write"):
        kvdb.open(tmp_path / "rw2", remote_write="never")
    with pytest.raises(kvdb.InvalidError, match="remote_write"):
        kvdb.open(tmp_path / "rw3", remote_write=4)
    # remote_poll_us: the mirror of kvdb_options is as long as the library's (the field
    # reaches the C side), its bound refused naming it
    opt = _lib.out_struct(_lib.Options)
    _lib.lib.kvdb_options_init(ctypes.byref(opt))
    assert opt.struct_size == ctypes.sizeof(_lib.Options) and opt.remote_poll_us == 50
    with kvdb.open(tmp_path / "rp", remote_addr="127.0.0.1:1", remote_poll_us=0):
        pass
    with pytest.raises(kvdb.InvalidError, match="remote_poll_us"):
        kvdb.open(tmp_path / "rp2", remote_addr="127.0.0.1:1", remote_poll_us=10001)
    with pytest.raises(kvdb.InvalidError, match="hex"):
        db.delete("zz")
    db.close()
    with pytest.raises(kvdb.MisuseError):
        db.lookup(M, toks(2))


def test_gil_released_during_calls(tmp_path):
    """ctypes.CDLL calls release the GIL (ctypes.PyDLL would keep it): the functions carry no
    FUNCFLAG_PYTHONAPI, and a Python thread keeps running while another is inside kvdb_put."""
    assert not (_lib.lib._func_flags_ & ctypes._FUNCFLAG_PYTHONAPI)
    big = kvdb.Model("py-gil", n_layers=16, n_kv_heads=8, head_dim=128, block_tokens=256)
    n = 2048  # 128 MiB of KV, written and synced in one call
    k = np.ones((big.n_layers, n, big.n_kv_heads, big.head_dim), np.float16)
    with kvdb.open(tmp_path / "db") as d:
        window = []
        started = threading.Event()

        def writer():
            started.set()
            a = time.perf_counter()
            d.put(big, toks(n), k, k)
            window.append((a, time.perf_counter()))

        th = threading.Thread(target=writer)
        ticks = []
        th.start()
        started.wait()
        while th.is_alive():
            ticks.append(time.perf_counter())
        th.join()
        a, b = window[0]
        inside = [t for t in ticks if a < t < b]
        # with the GIL held through the call this thread could not tick inside it at all
        assert len(inside) > 100, (len(inside), b - a)


def test_two_threads_one_handle(db):
    n = 64
    errors = []

    def worker(wid):
        try:
            for i in range(12):
                t = toks(n, 10_000 * (wid + 1) + 100 * i)
                k, v = logical(n, seed=wid * 100 + i)
                layout = LAYOUTS[sorted(LAYOUTS)[i % 3]]
                _, sk, sv = layout(n)
                fill(sk, sv, k, v)
                db.put(M, t, sk, sv)
                _, dk, dv = lkthd(n)
                assert db.get(M, t, dk, dv) == n
                np.testing.assert_array_equal(dk, k)
                np.testing.assert_array_equal(dv, v)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert not errors, errors
    assert db.stat().n_contexts == 24


def test_torch_tensors(db):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional)")
    n = 24
    k, v = logical(n)
    tk = torch.from_numpy(k.copy()).permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)
    tv = torch.from_numpy(v.copy())
    db.put(M, toks(n), tk, tv)
    out = torch.zeros((M.n_layers, M.n_kv_heads, n, M.head_dim), dtype=torch.float16)
    outv = torch.zeros((M.n_layers, n, M.n_kv_heads, M.head_dim), dtype=torch.float16)
    assert db.get(M, toks(n), out.transpose(1, 2), outv) == n
    assert np.array_equal(out.transpose(1, 2).numpy(), k)
    assert np.array_equal(outv.numpy(), v)
    with pytest.raises(kvdb.InvalidError, match="dtype"):
        db.put(M, toks(n), tk.float(), tv)


# ---- contexts stored with token dropping: lookup_kept / get_kept (kvdb_lookup_kept,
# kvdb_get_kept) ----------------------------------------------------------------------------------

SENTINEL = np.float16(-1234.0)  # never a standard normal draw


def knorm_keep(k, n, permille, model=M):
    """The rows a knorm put keeps, computed here independently of the engine: per layer, KV
    head and block [b0, b0 + t), the R(b0 + t) - R(b0) (at least 1) keys of lowest L2 norm, ties
    to the lower position, with R(x) = x * permille / 1000 rounded half up, so the context keeps
    its ratio exactly (format 8, issue 16). Shape (n_layers, n_kv_heads, n), bool."""
    bt = model.block_tokens
    mask = np.zeros((model.n_layers, model.n_kv_heads, n), bool)
    for l in range(model.n_layers):
        for h in range(model.n_kv_heads):
            for b0 in range(0, n, bt):
                rows = k[l, b0:b0 + bt, h].astype(np.float64)
                t = len(rows)
                r = lambda x: (x * permille + 500) // 1000
                keep = max(1, r(b0 + t) - r(b0))
                order = np.lexsort((np.arange(t), (rows * rows).sum(axis=1)))
                mask[l, h, b0 + order[:keep]] = True
    return mask


@pytest.mark.parametrize("config,permille", [("knorm50", 500), ("knorm30", 300)])
def test_lookup_get_kept_dropped_context(db, config, permille):
    n = 40  # two full blocks and a partial one (8 tokens: 30% keeps R(40) - R(32) = 12 - 10)
    k, v = logical(n, seed=21)
    info = db.put(M, toks(n), k, v, config=config)
    assert db.context_stat(info).config == config
    want = knorm_keep(k, n, permille)
    n_kept = int(want[0, 0].sum())
    assert n_kept == (n * permille + 500) // 1000  # the ratio exactly, not per block rounded up
    assert n_kept < n and np.all(want.sum(axis=2) == n_kept)
    q = np.concatenate([toks(n), [5, 6, 7]]).astype(np.uint32)  # goes on past the context
    # the prefix API ends the hit at the first dropped block; lookup_kept serves it
    assert db.lookup(M, q) == 0
    assert db.lookup_kept(M, q) == kvdb.KeptHit(hit=n, kept=n_kept)

    buf, dk, dv = lkhtd(len(q))  # Hugging Face-like transposed views, filled with a sentinel
    buf[...] = SENTINEL
    r = db.get_kept(M, q, dk, dv)
    assert (r.hit, r.kept) == (n, n_kept)
    assert r.present.dtype == np.bool_ and r.present.shape == (M.n_layers, M.n_kv_heads, len(q))
    np.testing.assert_array_equal(r.present[:, :, :n], want)  # absent exactly where dropped
    assert not r.present[:, :, n:].any()  # and past the hit
    pres = r.present[:, :, :n].transpose(0, 2, 1)  # (layer, token, head)
    for out, ref in ((dk, k), (dv, v)):
        got = out[:, :n]
        np.testing.assert_array_equal(got[pres], ref[pres])  # kept rows at their positions
        assert np.all(got[~pres] == SENTINEL)  # dropped rows left as the caller had them

    # the mask into the caller's own buffer (uint8, flat), reused
    mine = np.full(M.n_layers * M.n_kv_heads * len(q), 9, np.uint8)
    r2 = db.get_kept(M, q, dk, dv, present=mine)
    assert r2.present is mine and (r2.hit, r2.kept) == (n, n_kept)
    np.testing.assert_array_equal(mine.reshape(r.present.shape), r.present.astype(np.uint8))

    # a query ending inside a dropped block ends the hit before that block
    assert db.lookup_kept(M, toks(21)) == (16, int(want[0, 0, :16].sum()))
    r3 = db.get_kept(M, toks(21), *lkthd(21)[1:])
    assert (r3.hit, r3.kept) == (16, int(want[0, 0, :16].sum()))
    np.testing.assert_array_equal(r3.present[:, :, :16], want[:, :, :16])
    assert not r3.present[:, :, 16:].any()
    assert db.lookup_kept(M, toks(10)) == (0, 0)
    r4 = db.get_kept(M, toks(10), *lkthd(10)[1:])
    assert (r4.hit, r4.kept) == (0, 0) and not r4.present.any()
    # another context's tokens: no hit
    assert db.lookup_kept(M, toks(n, start=5000)) == (0, 0)


def test_get_kept_raw_context_full_mask(db):
    n = 37
    k, v = logical(n, seed=22)
    db.put(M, toks(n), k, v)
    assert db.lookup_kept(M, toks(n)) == (n, n) == (db.lookup(M, toks(n)),) * 2
    _, dk, dv = llama_vt(n)
    r = db.get_kept(M, toks(n), dk, dv)
    assert (r.hit, r.kept) == (n, n) and r.present.all()
    np.testing.assert_array_equal(as_logical(dk), k)
    np.testing.assert_array_equal(as_logical(dv), v)
    # a raw block still hits in part, as in lookup/get
    q = np.concatenate([toks(21), [1, 2, 3]]).astype(np.uint32)
    assert db.lookup_kept(M, q) == (21, 21) == (db.lookup(M, q),) * 2
    _, dk2, dv2 = lkthd(len(q))
    r = db.get_kept(M, q, dk2, dv2)
    assert (r.hit, r.kept) == (21, 21)
    assert r.present[:, :, :21].all() and not r.present[:, :, 21:].any()
    np.testing.assert_array_equal(dk2[:, :21], k[:, :21])
    np.testing.assert_array_equal(dv2[:, :21], v[:, :21])


def test_kept_errors_are_exceptions(db):
    n = 16
    k, v = logical(n)
    db.put(M, toks(n), k, v, config="knorm50")
    _, dk, dv = lkthd(n)
    L, H = M.n_layers, M.n_kv_heads
    # from the library: no tokens
    for call in (lambda: db.lookup_kept(M, []), lambda: db.get_kept(M, [], dk, dv)):
        with pytest.raises(kvdb.InvalidError) as e:
            call()
        assert e.value.status == kvdb.Status.INVALID and "n is 0" in e.value.message
    # a mask too small for the query: the library names present_cap
    with pytest.raises(kvdb.InvalidError, match="present_cap") as e:
        db.get_kept(M, toks(n), dk, dv, present=np.zeros(L * H * n - 1, np.uint8))
    assert str(L * H) in e.value.message
    # the model's id stored with another shape
    other = kvdb.Model("py-test", n_layers=3, n_kv_heads=2, head_dim=16, dtype="f16",
                       block_tokens=16)
    ok, ov = logical(n, model=other)
    with pytest.raises(kvdb.MismatchError) as e:
        db.lookup_kept(other, toks(n))
    assert e.value.status == kvdb.Status.MISMATCH and "py-test" in e.value.message
    with pytest.raises(kvdb.MismatchError, match="py-test"):
        db.get_kept(other, toks(n), np.zeros_like(ok), np.zeros_like(ov))
    bad = kvdb.Model("py-bad", 3, 2, 8, "f16", block_tokens=17)
    with pytest.raises(kvdb.InvalidError, match="block_tokens"):
        db.lookup_kept(bad, toks(4))
    # named by the package before the call
    with pytest.raises(kvdb.InvalidError, match=r"k: shape"):
        db.get_kept(M, toks(n), dk[:, :, :1], dv)
    with pytest.raises(kvdb.InvalidError, match="present: dtype float32"):
        db.get_kept(M, toks(n), dk, dv, present=np.zeros((L, H, n), np.float32))
    with pytest.raises(kvdb.InvalidError, match="not C-contiguous"):
        db.get_kept(M, toks(n), dk, dv, present=np.zeros((L, H, 2 * n), bool)[:, :, ::2])
    ro = np.zeros((L, H, n), bool)
    ro.flags.writeable = False
    with pytest.raises(kvdb.InvalidError, match="read-only"):
        db.get_kept(M, toks(n), dk, dv, present=ro)
    with pytest.raises(kvdb.InvalidError, match="negative"):
        db.lookup_kept(M, [-1, 2])
    db.close()
    with pytest.raises(kvdb.MisuseError):
        db.lookup_kept(M, toks(2))
    with pytest.raises(kvdb.MisuseError):
        db.get_kept(M, toks(n), dk, dv)


def test_put_profile_and_profile_get(db):
    """put's kvdb_put_opts keywords: the model's queries as the profile's probes, the profile
    read back (kvdb_profile_get), measured again on demand (kvdb_profile)."""
    n, QH = 48, 4  # 4 query heads over 2 KV heads
    k, v = logical(n, seed=31)
    rng = np.random.default_rng(32)
    pos = np.array([3, 10, 20, 30, 40, 47], np.uint32)
    probes = rng.standard_normal((len(pos), M.n_layers, QH, M.head_dim)).astype(np.float32)
    window = rng.standard_normal((4, M.n_layers, QH, M.head_dim)).astype(np.float32)
    space = "lossless,int8,kivi2,knorm50,snapkv50"
    info = db.put(M, toks(n), k, v, queries=window, probe_queries=probes, probe_positions=pos,
                  profile=True, profile_space=space, profile_heads=M.n_layers * M.n_kv_heads)
    prof = {e.config: e for e in db.profile_get(info)}
    assert set(prof) >= {"lossless", "int8", "kivi2", "knorm50", "snapkv50"}
    assert all(isinstance(e, kvdb.ProfileEntry) for e in prof.values())
    assert prof["lossless"].quality == pytest.approx(1.0, abs=1e-9)
    assert prof["lossless"].n_probes > 0
    assert 0.99 < prof["int8"].quality <= 1.0
    assert prof["kivi2"].quality < prof["int8"].quality
    assert prof["knorm50"].quality < 1.0 and prof["snapkv50"].quality < 1.0
    assert prof["int8"].bytes < prof["lossless"].bytes * 2
    # measured again, on demand, with other probes: recorded in place of the first
    db.profile(M, info, probe_queries=probes[:3], probe_positions=pos[:3],
               profile_space="int8,kivi2")
    again = {e.config: e for e in db.profile_get(info)}
    assert {"int8", "kivi2"} <= set(again) and again["int8"].quality > again["kivi2"].quality
    # a config put with options (and SnapKV with its window)
    n2 = 32
    k2, v2 = logical(n2, seed=33)
    i2 = db.put(M, toks(n2, start=9000), k2, v2, config="snapkv50", queries=window)
    assert db.context_stat(i2).config == "snapkv50"
    assert db.lookup_kept(M, toks(n2, start=9000)) == (n2, n2 // 2)


def test_profile_errors_are_exceptions(db):
    n, QH = 16, 2
    k, v = logical(n)
    q = np.zeros((2, M.n_layers, QH, M.head_dim), np.float32)
    with pytest.raises(kvdb.InvalidError, match="go together"):
        db.put(M, toks(n), k, v, probe_queries=q)
    with pytest.raises(kvdb.InvalidError, match="probe_queries: shape"):
        db.put(M, toks(n), k, v, probe_queries=q[0], probe_positions=[1])
    with pytest.raises(kvdb.InvalidError, match="2 probe queries"):
        db.put(M, toks(n), k, v, probe_queries=q, probe_positions=[1])
    with pytest.raises(kvdb.InvalidError):  # from the library: positions not increasing
        db.put(M, toks(n), k, v, probe_queries=q, probe_positions=[5, 2], profile=True)
    with pytest.raises(kvdb.InvalidError):  # SnapKV without queries
        db.put(M, toks(n), k, v, config="snapkv50")
    with pytest.raises(kvdb.InvalidError):  # a config name the library does not know
        db.put(M, toks(n), k, v, profile=True, profile_space="int3")
    info = db.put(M, toks(n), k, v)
    with pytest.raises(kvdb.NotFoundError):  # stored without a profile
        db.profile_get(info)
    db.delete(info)
    with pytest.raises(kvdb.NotFoundError):
        db.profile(M, info)


def test_output_gains(tmp_path):
    """DB.set_output_gains / output_gains (kvdb_model_set_output_gains): the round trip, a
    second process, bad inputs; a profile of a model with gains reports the output-weighted
    quality (weighted, the cosine and the worst head beside it) and matches numpy's
    computation of it (causal attention, heads pooled per layer, 1 - r^2 / 2)."""
    import subprocess
    import sys
    n, QH = 48, 4
    rng = np.random.default_rng(41)
    wo = [rng.standard_normal((QH * M.head_dim, 16)).astype(np.float32) * (1 + l)
          for l in range(M.n_layers)]
    g = np.stack([kvdb.output_gains_from_wo(w, QH) for w in wo])
    assert g.shape == (M.n_layers, QH)
    gc = np.stack([kvdb.output_gains_from_wo(w, QH, per_channel=True) for w in wo])
    assert gc.shape == (M.n_layers, QH, M.head_dim) and np.allclose(gc.mean(-1), g, rtol=1e-5)
    with pytest.raises(kvdb.InvalidError, match="wo of shape"):
        kvdb.output_gains_from_wo(wo[0][:5], QH)
    path = tmp_path / "db"
    with kvdb.open(path, sync="none") as db:
        with pytest.raises(kvdb.NotFoundError):
            db.output_gains(M.id)
        db.set_output_gains(M, gc)
        assert np.array_equal(db.output_gains(M.id), gc)
        db.set_output_gains(M, None)
        assert db.output_gains(M.id) is None
        bad = g.copy()
        bad[1, 2] = np.nan
        with pytest.raises(kvdb.InvalidError, match="finite"):
            db.set_output_gains(M, bad)
        with pytest.raises(kvdb.InvalidError, match="multiple"):
            db.set_output_gains(M, g[:, :3])
        with pytest.raises(kvdb.InvalidError, match="shape"):
            db.set_output_gains(M, g[:1])
        with pytest.raises(kvdb.InvalidError, match="channels"):
            db.set_output_gains(M, gc[:, :, :3])
        db.set_output_gains(M, g)
        k, v = logical(n, seed=42)
        pos = np.array([3, 10, 20, 30, 40, 47], np.uint32)
        probes = rng.standard_normal((len(pos), M.n_layers, QH, M.head_dim)).astype(np.float32)
        with pytest.raises(kvdb.InvalidError, match="query heads"):
            db.put(M, toks(n), k, v, probe_queries=probes[:, :, :2], probe_positions=pos,
                   profile=True)
        info = db.put(M, toks(n), k, v, probe_queries=probes, probe_positions=pos,
                      profile=True, profile_space="int8,kivi2",
                      profile_heads=M.n_layers * M.n_kv_heads)
        prof = {e.config: e for e in db.profile_get(info)}
        e = prof["kivi2"]
        assert e.weighted and e.worst_head <= e.cosine and e.quality < 1
        # numpy: kivi2's KV as a put stores it, from a second database
        with kvdb.open(tmp_path / "dec", sync="none") as d2:
            d2.put(M, toks(n), k, v, config="kivi2")
            dk, dv = np.zeros_like(k), np.zeros_like(v)
            assert d2.get(M, toks(n), dk, dv) == n

        def outs(kk, vv):
            o = np.zeros((M.n_layers, len(pos), QH, M.head_dim))
            for l in range(M.n_layers):
                for qh in range(QH):
                    h = qh // (QH // M.n_kv_heads)
                    for i, p in enumerate(pos):
                        s = kk[l, :p + 1, h].astype(np.float64) @ probes[i, l, qh] / np.sqrt(
                            M.head_dim)
                        w = np.exp(s - s.max())
                        o[l, i, qh] = (w / w.sum()) @ vv[l, :p + 1, h].astype(np.float64)
            return o
        a, b = outs(k, v), outs(dk, dv)
        e2 = (g[:, None, :] * ((a - b) ** 2).sum(-1)).sum(-1)   # (L, probes)
        r2 = (g[:, None, :] * (a ** 2).sum(-1)).sum(-1)
        r = np.mean(np.sqrt(e2).sum(-1) / np.sqrt(r2).sum(-1))
        assert e.quality == pytest.approx(max(0.0, 1 - r * r / 2), abs=2e-6)
        cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        assert e.cosine == pytest.approx(cos.mean(), abs=2e-6)
    # a second process reads the gains
    code = ("import kvdb, sys, numpy as np\n"
            f"with kvdb.open({str(path)!r}) as db:\n"
            f"    g = db.output_gains({M.id!r})\n"
            "    print(g.shape, float(g.sum()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split(")")[0] == f"({M.n_layers}, {QH}"
    assert float(out.split()[-1]) == pytest.approx(float(g.sum()), rel=1e-6)
