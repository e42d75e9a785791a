# SPDX-License-Identifier: MIT
"""kvdb for Python: the embeddable, persistent store for LLM KV caches (ctypes over libkvdb).

    import numpy as np, kvdb
    m = kvdb.Model("my-model", n_layers=30, n_kv_heads=3, head_dim=64, dtype="f16")
    with kvdb.open("/tmp/db") as db:
        info = db.put(m, tokens, k, v)          # k, v: [layer][token][head][dim], any strides
        hit = db.lookup(m, new_tokens)          # leading tokens stored
        hit = db.get(m, new_tokens, k2, v2)     # copies those tokens' KV into k2, v2
        hit, kept, present = db.get_kept(m, new_tokens, k2, v2)  # also token-dropped contexts

K and V are passed as *views*: any object with numpy's array interface or the buffer protocol,
or a CPU torch tensor, whose logical shape is (n_layers, n_tokens, n_kv_heads, head_dim) — a
transposed, sliced or permuted view works as it is (its byte strides become the kvdb_kv_view's
strides), and nothing is copied. A sequence of n_layers arrays of shape
(n_tokens, n_kv_heads, head_dim) with equal strides works too (layers in separate allocations,
as in Hugging Face's past_key_values). Errors raise kvdb.Error subclasses that carry the
kvdb_status and kvdb's message. The GIL is released during every library call.
"""
from __future__ import annotations

import ctypes
import enum
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._lib import lib

__all__ = ["open", "DB", "Model", "Status", "Error", "InvalidError", "NotFoundError",
           "MisuseError", "NoMemError", "FullError", "BusyError", "IOError_", "CorruptError",
           "VersionError", "UnsupportedError", "MismatchError", "ReadOnlyError", "PanicError",
           "PutInfo", "ContextInfo", "ProfileEntry", "Stats", "VerifyReport", "KeptHit",
           "KeptGet", "version", "library_path", "empty", "output_gains_from_wo"]


class Status(enum.IntEnum):
    """kvdb_status (values pinned by kvdb.h)."""
    OK = 0
    NOTFOUND = 1
    INVALID = 3
    MISUSE = 4
    NOMEM = 5
    FULL = 6
    BUSY = 7
    IOERR = 8
    CORRUPT = 9
    VERSION = 10
    UNSUPPORTED = 11
    MISMATCH = 12
    READONLY = 13
    PANIC = 14


class Error(Exception):
    """A failed kvdb call: `status` (a Status) and `message` (kvdb_errmsg(), naming what was
    wrong). Subclasses per status; InvalidError is also a ValueError, NotFoundError a
    LookupError, IOError_ an OSError."""

    status: Status = Status.PANIC

    def __init__(self, status: int, message: str):
        try:
            self.status = Status(status)
        except ValueError:
            self.status = status  # type: ignore[assignment]
        self.message = message
        name = self.status.name if isinstance(self.status, Status) else str(status)
        super().__init__(f"KVDB_{name}: {message}")


class InvalidError(Error, ValueError): pass
class NotFoundError(Error, LookupError): pass
class MisuseError(Error): pass
class NoMemError(Error, MemoryError): pass
class FullError(Error): pass
class BusyError(Error): pass
class IOError_(Error, OSError): pass
class CorruptError(Error): pass
class VersionError(Error): pass
class UnsupportedError(Error): pass
class MismatchError(Error): pass
class ReadOnlyError(Error): pass
class PanicError(Error): pass


_ERRORS = {Status.INVALID: InvalidError, Status.NOTFOUND: NotFoundError,
           Status.MISUSE: MisuseError, Status.NOMEM: NoMemError, Status.FULL: FullError,
           Status.BUSY: BusyError, Status.IOERR: IOError_, Status.CORRUPT: CorruptError,
           Status.VERSION: VersionError, Status.UNSUPPORTED: UnsupportedError,
           Status.MISMATCH: MismatchError, Status.READONLY: ReadOnlyError,
           Status.PANIC: PanicError}


def _raise(rc: int, message: Optional[str] = None) -> None:
    if message is None:
        message = (lib.kvdb_errmsg() or b"").decode("utf-8", "replace")
    cls = _ERRORS.get(rc, Error)  # type: ignore[call-overload]
    raise cls(rc, message)


def _check(rc: int) -> None:
    if rc != 0:
        _raise(rc)


def _invalid(message: str) -> None:
    raise InvalidError(Status.INVALID, message)


def version() -> str:
    """The library's version, e.g. "0.1.0"."""
    n = lib.kvdb_version_number()
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}"


def empty(shape: Any, dtype: Any = np.float16, align: int = 4096) -> np.ndarray:
    """An uninitialized numpy array whose data starts on an `align`-byte boundary (default a
    4 KiB page): kvdb reads O_DIRECT pages straight into page-aligned caller memory, and
    through a bounce buffer otherwise."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n].view(dt).reshape(shape)


def library_path() -> Optional[str]:
    """The path libkvdb was loaded from."""
    return _lib.path


# ---- models ---------------------------------------------------------------------------------

_DTYPES = {"f16": 1, "bf16": 2, "f32": 3}
_ROPE_STYLES = {"": 0, "adjacent": 1, "half": 2}
_DTYPE_SIZE = {1: 2, 2: 2, 3: 4}


@dataclass(frozen=True)
class Model:
    """The shape of a model's KV cache (kvdb_model). Everything stored belongs to one
    fingerprint: id, n_layers, n_kv_heads, head_dim, dtype ("f16", "bf16", "f32"),
    block_tokens (0 = 256) and score_bits (0, 8 or 4). Optional, not part of the fingerprint:
    the model's RoPE, rope_base (e.g. 10000.0) and rope_style ("adjacent": pairs 2i, 2i+1 as
    llama2.c; "half": pairs i, i + head_dim/2 as Hugging Face Llama), with which int4 and int2
    quantize K before RoPE."""
    id: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "f16"
    block_tokens: int = 0
    score_bits: int = 0
    rope_base: float = 0.0
    rope_style: str = ""

    def _c(self) -> _lib.Model:
        if self.dtype not in _DTYPES:
            _invalid(f"Model.dtype {self.dtype!r}: expected one of {sorted(_DTYPES)}")
        if self.rope_style not in _ROPE_STYLES:
            _invalid(f"Model.rope_style {self.rope_style!r}: expected one of "
                     f"{sorted(_ROPE_STYLES)}")
        c = _lib.Model(self.id.encode(), self.n_layers, self.n_kv_heads, self.head_dim,
                       _DTYPES[self.dtype], self.block_tokens, self.score_bits,
                       float(self.rope_base), _ROPE_STYLES[self.rope_style])
        return c

    @property
    def token_bytes(self) -> int:
        """Bytes of K and V of one token, all layers and heads (0 if the model is invalid)."""
        return int(lib.kvdb_model_token_bytes(ctypes.byref(self._c())))

    @property
    def elem_size(self) -> int:
        return _DTYPE_SIZE[_DTYPES[self.dtype]]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of elements (bf16 has none in numpy: uint16, the raw bits)."""
        return np.dtype({"f16": np.float16, "bf16": np.uint16, "f32": np.float32}[self.dtype])

    def chain_hashes(self, tokens: Any) -> List[bytes]:
        """The chained block hashes of tokens (no I/O); the last is the context key."""
        t = _tokens(tokens)
        bt = self.block_tokens or 256
        cap = max(1, (len(t) + bt - 1) // bt)
        keys = (_lib.Key * cap)()
        _check(lib.kvdb_chain_hashes(ctypes.byref(self._c()), _tok_ptr(t), len(t), keys, cap))
        return [bytes(k.b) for k in keys[: (len(t) + bt - 1) // bt]]

    def context_key(self, tokens: Any) -> bytes:
        """The key kvdb_put reports for a context of these tokens."""
        return self.chain_hashes(tokens)[-1]


# ---- arrays as views --------------------------------------------------------------------------


def _tokens(tokens: Any) -> np.ndarray:
    a = np.asarray(tokens)
    if a.ndim != 1:
        _invalid(f"tokens: expected a 1-D sequence of token ids, got shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        _invalid(f"tokens: expected integers, got dtype {a.dtype}")
    if a.size and a.dtype.kind == "i" and int(a.min()) < 0:
        _invalid(f"tokens: negative token id {int(a.min())}")
    if a.size and int(a.max()) > 0xFFFFFFFF:
        _invalid(f"tokens: token id {int(a.max())} does not fit 32 bits")
    return np.ascontiguousarray(a, dtype=np.uint32)


def _tok_ptr(t: np.ndarray):
    return t.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))


def _torch_dtype_code(t: Any) -> Optional[int]:
    name = str(t.dtype)
    return {"torch.float16": 1, "torch.bfloat16": 2, "torch.float32": 3}.get(name)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "stride")


def _array_info(x: Any, what: str, dtype_code: int, writable: bool):
    """(address, shape, byte strides, keepalive) of an array-like without copying it."""
    if _is_torch(x):
        if x.device.type != "cpu":
            _invalid(f"{what}: a tensor on {x.device} (kvdb reads and writes host memory: "
                     "pass a CPU tensor)")
        code = _torch_dtype_code(x)
        if code != dtype_code:
            _invalid(f"{what}: dtype {x.dtype} does not match the model's "
                     f"{[k for k, v in _DTYPES.items() if v == dtype_code][0]}")
        es = x.element_size()
        return x.data_ptr(), tuple(x.shape), tuple(s * es for s in x.stride()), x
    if isinstance(x, np.ndarray):
        a = x
    elif hasattr(x, "__array_interface__") or hasattr(x, "__buffer__") or isinstance(
            x, (bytes, bytearray, memoryview)):
        a = np.asarray(x)  # a view of the same memory (array interface / buffer protocol)
    else:
        try:
            memoryview(x)
        except TypeError:
            _invalid(f"{what}: expected an array (numpy, torch, array interface or buffer "
                     f"protocol), got {type(x).__name__}")
        a = np.asarray(x)
    if writable and not a.flags.writeable:
        _invalid(f"{what}: the array is read-only, kvdb writes into it")
    ok = {1: ("f2", "u2", "i2"), 2: ("u2", "i2", "V2"), 3: ("f4",)}[dtype_code]
    code = a.dtype.kind + str(a.dtype.itemsize)
    if a.dtype.name == "bfloat16" and dtype_code == 2:
        code = "u2"
    if code not in ok or (a.dtype.itemsize > 1 and a.dtype.byteorder == ">"):
        _invalid(f"{what}: dtype {a.dtype} does not match the model's "
                 f"{[k for k, v in _DTYPES.items() if v == dtype_code][0]}")
    return a.__array_interface__["data"][0], a.shape, a.strides, a


def _tensor_view(x: Any, m: Model, n_tokens: int, what: str, writable: bool,
                 per_layer: bool = True):
    """A kvdb_tensor_view of x, logical shape (n_layers, >= n_tokens, n_kv_heads, head_dim), or
    a sequence of n_layers arrays (>= n_tokens, n_kv_heads, head_dim) with equal strides.
    With per_layer False (kvdb_get_tokens) x has shape (>= n_tokens, n_kv_heads, head_dim)."""
    code = _DTYPES[m.dtype]
    tv = _lib.TensorView()
    keep: List[Any] = []
    want = (m.n_kv_heads, m.head_dim)
    if not per_layer or isinstance(x, (list, tuple)):
        arrs = [x] if not per_layer else list(x)
        if per_layer and len(arrs) != m.n_layers:
            _invalid(f"{what}: {len(arrs)} layer arrays for a model of {m.n_layers} layers")
        ptrs = (ctypes.c_void_p * max(1, len(arrs)))()
        strides0 = None
        for i, xi in enumerate(arrs):
            p, shape, strides, ka = _array_info(xi, f"{what}[{i}]" if per_layer else what,
                                                code, writable)
            keep.append(ka)
            if len(shape) != 3 or shape[0] < n_tokens or tuple(shape[1:]) != want:
                _invalid(f"{what}: shape {tuple(shape)}, expected ({n_tokens} or more, "
                         f"{want[0]}, {want[1]}) (token, head, dim)")
            if strides0 is None:
                strides0 = strides
            elif tuple(strides) != tuple(strides0):
                _invalid(f"{what}: layer {i} has strides {strides}, layer 0 {strides0}: "
                         "the layers of a view share their strides")
            ptrs[i] = p
        assert strides0 is not None
        if per_layer:
            tv.layer_bases = ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
            keep.append(ptrs)
        else:
            tv.base = ptrs[0]
        tv.token_stride, tv.head_stride, tv.dim_stride = strides0
    else:
        p, shape, strides, ka = _array_info(x, what, code, writable)
        keep.append(ka)
        if (len(shape) != 4 or shape[0] != m.n_layers or shape[1] < n_tokens
                or tuple(shape[2:]) != want):
            _invalid(f"{what}: shape {tuple(shape)}, expected ({m.n_layers}, {n_tokens} or more, "
                     f"{want[0]}, {want[1]}) (layer, token, head, dim)")
        tv.base = p
        tv.layer_stride, tv.token_stride, tv.head_stride, tv.dim_stride = strides
    if tv.dim_stride == 0 and m.head_dim > 1:
        _invalid(f"{what}: dim stride 0 (a broadcast array) cannot be stored as a view; "
                 "copy it first")
    return tv, keep


def _kv_view(k: Any, v: Any, m: Model, n: int, writable: bool, per_layer: bool = True):
    kv = _lib.KVView()
    kv.k, keep_k = _tensor_view(k, m, n, "k", writable, per_layer)
    kv.v, keep_v = _tensor_view(v, m, n, "v", writable, per_layer)
    return kv, (keep_k, keep_v)


def _key(key: Union[bytes, str, "ContextInfo", "PutInfo"]) -> _lib.Key:
    if isinstance(key, (ContextInfo, PutInfo)):
        key = key.context if isinstance(key, PutInfo) else key.key
    if isinstance(key, str):
        try:
            key = bytes.fromhex(key)
        except ValueError:
            _invalid(f"key {key!r}: expected 32 hex digits")
    if not isinstance(key, (bytes, bytearray)) or len(key) != 16:
        _invalid(f"key: expected 16 bytes or 32 hex digits, got {key!r}")
    k = _lib.Key()
    ctypes.memmove(k.b, bytes(key), 16)
    return k


# ---- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PutInfo:
    """What a put did (kvdb_put_info)."""
    context: bytes
    n_blocks: int
    blocks_written: int
    blocks_shared: int
    bytes_written: int


_CONFIG_NAMES = ("raw", "lossless", "quant", "drop")


class KeptHit(NamedTuple):
    """What DB.lookup_kept found (kvdb_lookup_kept): the hit covers query positions
    [0, hit); `kept` of them are stored per layer and KV head (the same count for every one;
    equal to `hit` when no block of the hit was stored with token dropping)."""
    hit: int
    kept: int


class KeptGet(NamedTuple):
    """What DB.get_kept delivered (kvdb_get_kept): `hit` and `kept` as in KeptHit (of the
    blocks delivered), and `present`, the mask of shape (n_layers, n_kv_heads, len(tokens)):
    present[l, h, t] is true where the row (K and V) of layer l, KV head h, position t was
    written, false where the put dropped it (the output keeps what the caller had there) and at
    every position from `hit` on."""
    hit: int
    kept: int
    present: np.ndarray


@dataclass(frozen=True)
class ProfileEntry:
    """One entry of a context's quality profile (kvdb_profile_entry): the config's name, its
    stored bytes for the context, the proxy's quality (mean cosine of attention outputs, 1 =
    exact; NaN if unmeasured) and relative L2 error, the caller's reported quality (NaN if
    none) and how many reports it averages, probes per sampled head (0: predicted, not
    measured), and the flags: stored (the context's own config), exact (bytes measured, not
    extrapolated), rescaled (quality re-profiled from reports), weighted (quality is the
    output-weighted quality of a model with output gains: DB.set_output_gains); cosine: the
    mean per-head cosine (= quality when not weighted); worst_head: the lowest head's mean
    cosine (NaN unless weighted)."""
    config: str
    bytes: int
    quality: float
    rel_l2: float
    reported_quality: float
    n_reports: int
    n_probes: int
    stored: bool
    exact: bool
    rescaled: bool
    weighted: bool = False
    cosine: float = float("nan")
    worst_head: float = float("nan")

    @staticmethod
    def _of(e: _lib.ProfileEntry) -> "ProfileEntry":
        buf = ctypes.create_string_buffer(64)
        name = lib.kvdb_config_name(ctypes.byref(e.config), buf, 64).decode()
        return ProfileEntry(name, e.bytes, e.quality, e.rel_l2, e.reported_quality, e.n_reports,
                            e.n_probes, bool(e.flags & 1), bool(e.flags & 2), bool(e.flags & 4),
                            bool(e.flags & 8), e.cosine, e.worst_head)


def output_gains_from_wo(wo: Any, n_q_heads: int, per_channel: bool = False) -> np.ndarray:
    """The output gains of one layer's output projection for DB.set_output_gains: wo of shape
    (n_q_heads * head_dim, n_embd) (the heads' concatenated outputs times wo is what the layer
    adds to the residual stream; a (n_embd, n_q_heads * head_dim) weight as PyTorch stores it
    must be transposed first). Returns (n_q_heads,) = ||W_o,h||_F^2 / head_dim, or
    (n_q_heads, head_dim) = each channel's squared row norm with per_channel. Stack the layers'
    for the model."""
    w = np.asarray(wo, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] % n_q_heads != 0:
        _invalid(f"wo of shape {w.shape}: expected (n_q_heads * head_dim, n_embd)")
    diag = (w * w).sum(1).reshape(n_q_heads, -1)
    return (diag if per_channel else diag.mean(1)).astype(np.float32)


def _f32_rows(x: Any, m: Model, what: str) -> np.ndarray:
    """x as C-contiguous float32 of shape (n, n_layers, n_q_heads, head_dim)."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim != 4 or a.shape[1] != m.n_layers or a.shape[3] != m.head_dim:
        _invalid(f"{what}: shape {a.shape}, expected (n, {m.n_layers}, n_q_heads, "
                 f"{m.head_dim}) (position, layer, query head, dim)")
    return a


def _put_opts(m: Model, config: Optional[str], queries: Any, probe_queries: Any,
              probe_positions: Any, profile: bool, profile_space: Optional[str],
              profile_heads: int):
    """A kvdb_put_opts of the keywords of DB.put / DB.profile, and what must stay alive."""
    po = _lib.out_struct(_lib.PutOpts)
    lib.kvdb_put_opts_init(ctypes.byref(po))
    keep: List[Any] = []
    if config is not None:
        _check(lib.kvdb_config_parse(str(config).encode(), ctypes.byref(po.config)))
    if profile:
        po.flags |= 1  # KVDB_PUT_PROFILE
    n_q_heads = 0
    if queries is not None:
        q = _f32_rows(queries, m, "queries")
        keep.append(q)
        po.queries = q.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        po.n_queries = q.shape[0]
        n_q_heads = q.shape[2]
    if (probe_queries is None) != (probe_positions is None):
        _invalid("probe_queries and probe_positions go together")
    if probe_queries is not None:
        pq = _f32_rows(probe_queries, m, "probe_queries")
        pp = _tokens(probe_positions)
        if len(pp) != pq.shape[0]:
            _invalid(f"probe_positions: {len(pp)} positions for {pq.shape[0]} probe queries")
        if n_q_heads and pq.shape[2] != n_q_heads:
            _invalid(f"probe_queries: {pq.shape[2]} query heads, queries {n_q_heads}")
        keep += [pq, pp]
        po.probe_queries = pq.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        po.probe_positions = _tok_ptr(pp)
        po.n_probe_queries = len(pp)
        n_q_heads = pq.shape[2]
    po.n_q_heads = n_q_heads
    if profile_space is not None:
        b = str(profile_space).encode()
        keep.append(b)
        po.profile_space = b
    po.profile_heads = int(profile_heads)
    return po, keep


@dataclass(frozen=True)
class ContextInfo:
    """One stored context (kvdb_context_info)."""
    key: bytes
    model_id: str
    n_tokens: int
    n_blocks: int
    explicit_key: bool
    bytes: int
    created_unix_ms: int
    last_access_unix_ms: int
    in_dram_blocks: int
    tier: int
    config: str
    score_bits: int
    score_versions: int = 0  # bit 0: version-1 score copies, bit 1: version 2

    @staticmethod
    def _of(c: _lib.ContextInfo) -> "ContextInfo":
        buf = ctypes.create_string_buffer(64)
        name = lib.kvdb_config_name(ctypes.byref(c.config), buf, 64).decode()
        return ContextInfo(bytes(c.key.b), c.model_id.decode("utf-8", "replace"), c.n_tokens,
                           c.n_blocks, bool(c.explicit_key), c.bytes, c.created_unix_ms,
                           c.last_access_unix_ms, c.in_dram_blocks, c.tier, name, c.score_bits,
                           c.score_versions)


@dataclass(frozen=True)
class Stats:
    """Database statistics (kvdb_stats); `tiers` has DRAM, SSD, SmartSSD dicts."""
    format_version: int
    n_models: int
    n_contexts: int
    n_blocks: int
    n_segments: int
    segment_file_bytes: int
    live_bytes: int
    catalog_bytes: int
    corrupt_blocks: int
    bytes_read: int
    bytes_written: int
    direct_io: bool
    io_uring: bool
    tiers: Tuple[dict, ...]


@dataclass(frozen=True)
class VerifyReport:
    """What kvdb_verify checked and the problems it found (status name, message)."""
    blocks_checked: int
    bytes_checked: int
    contexts_checked: int
    segments_checked: int
    problems: List[Tuple[str, str]]

    @property
    def ok(self) -> bool:
        return not self.problems


# ---- the database -----------------------------------------------------------------------------

_OPTION_ENUMS = {
    "sync_mode": {"full": 0, "none": 1},
    "placement": {"off": 0, "evicpress": 1, "per_byte": 2},
    "remote_write": {"put": 1, "evict": 2, "put+evict": 3},
}


class DB:
    """An open kvdb database (a kvdb handle). Use kvdb.open(); close() or a `with` block ends
    it. One DB may be used from any number of threads at once (the library's handle is)."""

    def __init__(self, path: str, **options: Any):
        opt = _lib.out_struct(_lib.Options)
        lib.kvdb_options_init(ctypes.byref(opt))
        self._keep: List[Any] = []
        names = {f[0] for f in _lib.Options._fields_} - {"struct_size", "log_fn", "log_ctx"}
        for name, value in options.items():
            if name == "create":
                opt.flags = (opt.flags | 1) if value else (opt.flags & ~1)
            elif name == "readonly":
                opt.flags = (opt.flags | 2) if value else (opt.flags & ~2)
            elif name in ("sync", "sync_mode", "placement", "remote_write"):
                key = "sync_mode" if name == "sync" else name
                if isinstance(value, str):
                    if value not in _OPTION_ENUMS[key]:
                        _invalid(f"option {name}={value!r}: expected one of "
                                 f"{sorted(_OPTION_ENUMS[key])}")
                    value = _OPTION_ENUMS[key][value]
                setattr(opt, key, int(value))
            elif name in ("smartssd_dir", "remote_addr", "remote_namespace"):
                b = None if value is None else str(value).encode()
                self._keep.append(b)
                setattr(opt, name, b)
            elif name in names:
                setattr(opt, name, type(getattr(opt, name))(value))
            else:
                raise TypeError(f"kvdb.open: unknown option {name!r} (known: create, readonly, "
                                f"sync, {', '.join(sorted(names - {'flags'}))})")
        h = ctypes.c_void_p()
        self.path = str(path)
        _check(lib.kvdb_open(self.path.encode(), ctypes.byref(opt), ctypes.byref(h)))
        self._h: Optional[ctypes.c_void_p] = h
        self._lock = threading.Lock()

    # context manager
    def __enter__(self) -> "DB":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Close the handle (not concurrently with other calls on it). Idempotent."""
        with self._lock:
            h, self._h = self._h, None
        if h:
            lib.kvdb_close(h)

    @property
    def _handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise MisuseError(Status.MISUSE, "the database is closed")
        return self._h

    # put / lookup / get
    def put(self, model: Model, tokens: Any, k: Any, v: Any, *,
            config: Optional[str] = None, queries: Any = None, probe_queries: Any = None,
            probe_positions: Any = None, profile: bool = False,
            profile_space: Optional[str] = None, profile_heads: int = 0) -> PutInfo:
        """Store the KV of `tokens` as one context. k and v: views of logical shape
        (n_layers, n_tokens, n_kv_heads, head_dim) (see the module's doc); read during the call
        only. config: a storage config name ("raw", "lossless", "int8", ...; default raw).
        The other keywords are kvdb_put_opts' (kvdb_put_ex): queries, SnapKV's observation
        window, float32 of shape (n_queries, n_layers, n_q_heads, head_dim) in the keys'
        rotary state; probe_queries (same layout) at probe_positions (strictly increasing),
        the quality profile's probes (the model's own queries spread over the context);
        profile=True measures the context's quality profile in the same transaction
        (profile_space: config names separated by commas, None = the default space;
        profile_heads: (layer, KV head) pairs sampled, 0 = 16). Read it with profile_get.
        Returns the PutInfo; raises on any error (then nothing of this put is visible)."""
        t = _tokens(tokens)
        if len(t) == 0:
            _invalid("tokens: empty (a put stores at least one token)")
        mc = model._c()
        kv, keep = _kv_view(k, v, model, len(t), writable=False)
        info = _lib.PutInfo()
        if (config is None and queries is None and probe_queries is None and not profile
                and profile_space is None):
            _check(lib.kvdb_put(self._handle, ctypes.byref(mc), _tok_ptr(t), len(t),
                                ctypes.byref(kv), ctypes.byref(info)))
        else:
            po, keep_o = _put_opts(model, config, queries, probe_queries, probe_positions,
                                   profile, profile_space, profile_heads)
            _check(lib.kvdb_put_ex(self._handle, ctypes.byref(mc), _tok_ptr(t), len(t),
                                   ctypes.byref(kv), ctypes.byref(po), ctypes.byref(info)))
            del keep_o
        del keep
        return PutInfo(bytes(info.context.b), info.n_blocks, info.blocks_written,
                       info.blocks_shared, info.bytes_written)

    def calibrate(self, model: Model, contexts: Any, n_q_heads: int, *, int4: bool = True,
                  int2: bool = True, int4_bits: float = 0.0, int2_bits: float = 0.0) -> None:
        """Calibrate `model`'s int4 and int2 (kvdb_model_calibrate) and store the calibration
        with it. contexts: (k, v, queries, positions) per calibration context: k and v views of
        logical shape (n_layers, n_tokens, n_kv_heads, head_dim) as for put; queries float32 of
        shape (n_queries, n_layers, n_q_heads, head_dim) (the model's own queries, after RoPE);
        positions: their token positions (increasing, < n_tokens). Never calibrate on the
        contexts whose quality you then measure."""
        ctx = list(contexts)
        if not ctx:
            _invalid("contexts: none (the calibration needs at least one)")
        arr = (_lib.CalibContext * len(ctx))()
        keep: List[Any] = []
        for i, c in enumerate(ctx):
            try:
                k, v, q, pos = c
            except (TypeError, ValueError):
                _invalid(f"contexts[{i}]: expected (k, v, queries, positions)")
            pos_a = np.ascontiguousarray(np.asarray(pos, dtype=np.uint32).reshape(-1))
            q_a = np.ascontiguousarray(np.asarray(q, dtype=np.float32))
            want = (len(pos_a), model.n_layers, n_q_heads, model.head_dim)
            if q_a.shape != want:
                _invalid(f"contexts[{i}]: queries of shape {q_a.shape}, expected {want} "
                         "(position, layer, query head, dim)")
            shp = tuple(getattr(k, "shape", ()))
            if len(shp) != 4:
                _invalid(f"contexts[{i}]: k of shape {shp}, expected (layer, token, head, dim)")
            n_tok = int(shp[1])
            kv, kp = _kv_view(k, v, model, n_tok, writable=False)
            kv_box = _lib.KVView()
            ctypes.memmove(ctypes.byref(kv_box), ctypes.byref(kv), ctypes.sizeof(kv))
            keep += [pos_a, q_a, kp, kv_box]
            arr[i].kv = ctypes.pointer(kv_box)
            arr[i].n_tokens = n_tok
            arr[i].queries = q_a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].positions = pos_a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
            arr[i].n_queries = len(pos_a)
        o = _lib.out_struct(_lib.CalibOpts)
        lib.kvdb_calib_opts_init(ctypes.byref(o))
        o.flags = (1 if int4 else 0) | (2 if int2 else 0)
        o.n_q_heads = int(n_q_heads)
        o.int4_bits = float(int4_bits)
        o.int2_bits = float(int2_bits)
        _check(lib.kvdb_model_calibrate(self._handle, ctypes.byref(model._c()), arr, len(ctx),
                                        ctypes.byref(o)))
        del keep

    def model_calibration(self, model_id: str) -> Dict[str, Any]:
        """The calibration stored with model `model_id` (kvdb_model_calibration) as a dict:
        calibrated, int4, int2 (plans held), n_contexts, n_probes, int4_bits, int2_bits (budgets),
        int4_planned_bits, int2_planned_bits (mean widths of the plans)."""
        ci = _lib.out_struct(_lib.CalibInfo)
        _check(lib.kvdb_model_calibration(self._handle, str(model_id).encode(), ctypes.byref(ci)))
        return {"calibrated": bool(ci.calibrated), "int4": bool(ci.flags & 1),
                "int2": bool(ci.flags & 2), "n_contexts": ci.n_contexts, "n_probes": ci.n_probes,
                "int4_bits": ci.int4_bits, "int2_bits": ci.int2_bits,
                "int4_planned_bits": ci.int4_planned_bits,
                "int2_planned_bits": ci.int2_planned_bits}

    def set_output_gains(self, model: Model, gains: Any, n_q_heads: Optional[int] = None) -> None:
        """Store `model`'s output-projection gains (kvdb_model_set_output_gains): float32 of
        shape (n_layers, n_q_heads) (one gain per query head, ||W_o,h||_F^2 / head_dim) or
        (n_layers, n_q_heads, head_dim) (per channel); None removes them. Profiles of the
        model then report the output-weighted quality as `quality` (output_gains_from_wo makes
        them from the layers' W_o)."""
        if gains is None:
            _check(lib.kvdb_model_set_output_gains(self._handle, ctypes.byref(model._c()), None,
                                                   0, 0))
            return
        g = np.ascontiguousarray(np.asarray(gains, dtype=np.float32))
        if g.ndim not in (2, 3) or g.shape[0] != model.n_layers:
            _invalid(f"gains of shape {g.shape}: expected (n_layers={model.n_layers}, n_q_heads"
                     "[, head_dim])")
        if n_q_heads is not None and g.shape[1] != n_q_heads:
            _invalid(f"gains of shape {g.shape} for {n_q_heads} query heads")
        ch = 1 if g.ndim == 2 else g.shape[2]
        _check(lib.kvdb_model_set_output_gains(
            self._handle, ctypes.byref(model._c()),
            g.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), g.shape[1], ch))

    def output_gains(self, model_id: str) -> Optional[np.ndarray]:
        """The output gains stored with model `model_id` (kvdb_model_output_gains): float32 of
        shape (n_layers, n_q_heads) or (n_layers, n_q_heads, head_dim); None when it has none."""
        n = ctypes.c_size_t()
        q = ctypes.c_uint32()
        ch = ctypes.c_uint32()
        mid = str(model_id).encode()
        _check(lib.kvdb_model_output_gains(self._handle, mid, None, 0, ctypes.byref(n),
                                           ctypes.byref(q), ctypes.byref(ch)))
        if n.value == 0:
            return None
        out = np.empty(n.value, np.float32)
        _check(lib.kvdb_model_output_gains(self._handle, mid,
                                           out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                           n.value, ctypes.byref(n), ctypes.byref(q),
                                           ctypes.byref(ch)))
        shape = (n.value // (q.value * ch.value), q.value) + ((ch.value,) if ch.value > 1 else ())
        return out.reshape(shape)

    def profile(self, model: Model, context: Any, *, queries: Any = None,
                probe_queries: Any = None, probe_positions: Any = None,
                profile_space: Optional[str] = None, profile_heads: int = 0) -> None:
        """Measure a stored context's quality profile now and record it (kvdb_profile), with
        the probes and space of the keywords (as put's). The reference is the context as
        stored: exact for raw and lossless contexts. Raises NotFoundError when the context is
        not stored, InvalidError for bad probes or a config the model cannot take."""
        ck = _key(context)
        po, keep = _put_opts(model, None, queries, probe_queries, probe_positions, False,
                             profile_space, profile_heads)
        _check(lib.kvdb_profile(self._handle, ctypes.byref(model._c()), ctypes.byref(ck),
                                ctypes.byref(po)))
        del keep

    def profile_get(self, context: Any) -> List[ProfileEntry]:
        """The recorded quality profile of a stored context (kvdb_profile_get), one entry per
        config of its space. Raises NotFoundError when the context or its profile is absent."""
        ck = _key(context)
        n = ctypes.c_size_t()
        cap = 32
        while True:
            arr = (_lib.ProfileEntry * cap)()
            _check(lib.kvdb_profile_get(self._handle, ctypes.byref(ck), arr, cap,
                                        ctypes.byref(n)))
            if n.value <= cap:
                return [ProfileEntry._of(arr[i]) for i in range(n.value)]
            cap = n.value

    def lookup(self, model: Model, tokens: Any) -> int:
        """How many leading tokens of `tokens` are stored (verified token by token)."""
        t = _tokens(tokens)
        hit = ctypes.c_size_t()
        _check(lib.kvdb_lookup(self._handle, ctypes.byref(model._c()), _tok_ptr(t), len(t),
                               ctypes.byref(hit)))
        return hit.value

    def get(self, model: Model, tokens: Any, k: Any, v: Any) -> int:
        """Copy the KV of the longest stored prefix of `tokens` into the views k and v (room for
        len(tokens) tokens, logical shape (n_layers, n_tokens, n_kv_heads, head_dim)).
        Returns the hit: tokens [0, hit) were written; the rest are unspecified."""
        t = _tokens(tokens)
        kv, keep = _kv_view(k, v, model, len(t), writable=True)
        hit = ctypes.c_size_t()
        _check(lib.kvdb_get(self._handle, ctypes.byref(model._c()), _tok_ptr(t), len(t),
                            ctypes.byref(kv), ctypes.byref(hit)))
        del keep
        return hit.value

    def lookup_kept(self, model: Model, tokens: Any) -> KeptHit:
        """Like lookup, but a block stored with token dropping (a "knorm50", "keydiff30",
        "snapkv70"... put) continues the hit instead of ending it, when the query matches it
        whole: a full block, or a context's last (partial) block all of whose tokens start the
        rest of the query. A query that ends inside such a block ends the hit before it.
        Returns KeptHit(hit, kept): query positions [0, hit) hit, and `kept` rows of them are
        stored per layer and KV head (get_kept delivers exactly these). Reads no block data;
        local tiers only (no remote tier). Raises as lookup (MismatchError: the model id is
        stored with another shape)."""
        t = _tokens(tokens)
        hit = ctypes.c_size_t()
        kept = ctypes.c_size_t()
        _check(lib.kvdb_lookup_kept(self._handle, ctypes.byref(model._c()), _tok_ptr(t), len(t),
                                    ctypes.byref(hit), ctypes.byref(kept)))
        return KeptHit(hit.value, kept.value)

    def get_kept(self, model: Model, tokens: Any, k: Any, v: Any,
                 present: Optional[np.ndarray] = None) -> KeptGet:
        """Copy the hit of lookup_kept into the views k and v (room for len(tokens) tokens,
        logical shape (n_layers, n_tokens, n_kv_heads, head_dim), any strides), each stored row
        at its own position, and say which rows are there.

        For every layer l, KV head h and position t of the hit whose row was kept, K and V go
        to k[l, t, h] and v[l, t, h] and present[l, h, t] is set; a row the put dropped leaves
        k and v there as the caller had them (present false). From `hit` on the mask is false
        and k, v are unspecified. Every byte is verified; a block that fails verification ends
        the hit before it (a shorter hit, not an exception). Lossy configs deliver their
        decoded rows. Local tiers only; the hit does not count as an access for the placement.

        present: optional output for the mask, written in place (reuse one across calls): a
        writable C-contiguous array of 1-byte elements (bool or uint8) with at least
        n_layers * n_kv_heads * len(tokens) elements, indexed as
        ((l * n_kv_heads + h) * len(tokens) + t); by default a new bool array of shape
        (n_layers, n_kv_heads, len(tokens)). Returns KeptGet(hit, kept, present)."""
        t = _tokens(tokens)
        if present is None:
            mask = np.zeros((model.n_layers, model.n_kv_heads, len(t)), np.bool_)
        else:
            mask = present
            if not isinstance(mask, np.ndarray):
                _invalid(f"present: expected a numpy array, got {type(mask).__name__}")
            if mask.dtype.itemsize != 1 or mask.dtype.kind not in "biu":
                _invalid(f"present: dtype {mask.dtype}, expected bool or uint8")
            if not mask.flags.c_contiguous:
                _invalid("present: the array is not C-contiguous")
            if not mask.flags.writeable:
                _invalid("present: the array is read-only, kvdb writes into it")
        kv, keep = _kv_view(k, v, model, len(t), writable=True)
        hit = ctypes.c_size_t()
        kept = ctypes.c_size_t()
        _check(lib.kvdb_get_kept(self._handle, ctypes.byref(model._c()), _tok_ptr(t), len(t),
                                 ctypes.byref(kv), mask.ctypes.data_as(ctypes.c_void_p),
                                 mask.size, ctypes.byref(hit), ctypes.byref(kept)))
        del keep
        return KeptGet(hit.value, kept.value, mask)

    def get_tokens(self, model: Model, context: Any, layer: int, positions: Any,
                   k: Any, v: Any) -> None:
        """K and V of chosen positions of one layer of a stored context, all KV heads: k and v
        have shape (len(positions), n_kv_heads, head_dim), any strides; row i receives
        position positions[i]."""
        pos = _tokens(positions)
        ck = _key(context)
        kv, keep = _kv_view(k, v, model, len(pos), writable=True, per_layer=False)
        _check(lib.kvdb_get_tokens(self._handle, ctypes.byref(model._c()), ctypes.byref(ck),
                                   int(layer), _tok_ptr(pos), len(pos), ctypes.byref(kv)))
        del keep

    def delete(self, context: Any) -> None:
        """Remove a context (key: 16 bytes, 32 hex digits, a PutInfo or a ContextInfo).
        Raises NotFoundError when it is not stored."""
        ck = _key(context)
        _check(lib.kvdb_delete(self._handle, ctypes.byref(ck)))

    def score(self, model: Model, context: Any, layer: int, kv_head: int, q: Any,
              k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The top k positions of a stored context for query vector q (head_dim elements of
        f32, or of the model's dtype) against one layer and KV head: (positions uint32,
        scores float32), best first. Needs a model with score_bits 8 or 4."""
        ck = _key(context)
        qa = np.ascontiguousarray(q)
        if qa.ndim != 1 or qa.shape[0] != model.head_dim:
            _invalid(f"q: shape {qa.shape}, expected ({model.head_dim},)")
        qcode = {"float32": 3, "float16": 1}.get(qa.dtype.name)
        if qcode is None:
            qa = qa.astype(np.float32)
            qcode = 3
        positions = np.empty(max(0, int(k)), np.uint32)
        scores = np.empty(max(0, int(k)), np.float32)
        _check(lib.kvdb_score(self._handle, ctypes.byref(model._c()), ctypes.byref(ck),
                              int(layer), int(kv_head), qa.ctypes.data, qcode, int(k),
                              positions.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
                              scores.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
        return positions, scores

    # inspection
    def context_stat(self, context: Any) -> ContextInfo:
        """Information about one context; NotFoundError when absent."""
        ck = _key(context)
        ci = _lib.out_struct(_lib.ContextInfo)
        _check(lib.kvdb_context_stat(self._handle, ctypes.byref(ck), ctypes.byref(ci)))
        return ContextInfo._of(ci)

    def iterate(self) -> Iterator[ContextInfo]:
        """Every stored context in key order (a snapshot taken at the first next())."""
        it = ctypes.c_void_p()
        _check(lib.kvdb_iter_open(self._handle, ctypes.byref(it)))
        try:
            while True:
                ci = _lib.out_struct(_lib.ContextInfo)
                rc = lib.kvdb_iter_next(it, ctypes.byref(ci))
                if rc == Status.NOTFOUND:
                    return
                _check(rc)
                yield ContextInfo._of(ci)
        finally:
            lib.kvdb_iter_close(it)

    def stat(self) -> Stats:
        """Database statistics."""
        s = _lib.out_struct(_lib.Stats)
        _check(lib.kvdb_stat(self._handle, ctypes.byref(s)))
        tiers = tuple({f: getattr(t, f) for f, _ in _lib.TierStats._fields_} for t in s.tier)
        return Stats(s.format_version, s.n_models, s.n_contexts, s.n_blocks, s.n_segments,
                     s.segment_file_bytes, s.live_bytes, s.catalog_bytes, s.corrupt_blocks,
                     s.bytes_read, s.bytes_written, bool(s.direct_io), bool(s.io_uring), tiers)

    def verify(self, raise_on_problem: bool = False) -> VerifyReport:
        """Read every block and check every checksum and the catalog. Returns the report with
        the problems found (raise_on_problem: raise CorruptError instead when there are any);
        raises for an error that stopped the check."""
        problems: List[Tuple[str, str]] = []

        def on_problem(_ctx, p):
            st = p.contents.status
            problems.append((Status(st).name if st in Status._value2member_map_ else str(st),
                             (p.contents.message or b"").decode("utf-8", "replace")))

        cb = _lib.PROBLEM_FN(on_problem)
        rep = _lib.out_struct(_lib.VerifyReport)
        rc = lib.kvdb_verify(self._handle, cb, _lib.PROGRESS_FN(), None, ctypes.byref(rep))
        if rc not in (0, Status.CORRUPT) or (rc == Status.CORRUPT and not problems):
            _check(rc)
        if problems and raise_on_problem:
            _raise(Status.CORRUPT, "; ".join(m for _, m in problems))
        return VerifyReport(rep.blocks_checked, rep.bytes_checked, rep.contexts_checked,
                            rep.segments_checked, problems)


def open(path: Union[str, "os.PathLike[str]"], **options: Any) -> DB:  # noqa: A001
    """Open (and by default create) the database in directory `path`; use as a context manager.

    Options (kvdb_options fields): create (default True), readonly, dram_bytes, ssd_bytes,
    sync ("full" default, or "none"), segment_bytes, catalog_map_bytes, use_direct_io,
    use_io_uring, log_level, smartssd_dir, smartssd_bytes, placement ("off", "evicpress",
    "per_byte"), placement_alpha, freq_half_life_s, reprofile_drift_pct, prefill_tokens_per_s,
    placement_slack_pct, lossless_frame_bytes, remote_addr, remote_namespace, remote_timeout_ms,
    remote_queue_blocks, remote_put_wait_ms, prefetch_bps, remote_write ("put" default,
    "evict", "put+evict"), remote_copy_hits (1 default, 0), remote_hash_tag (0 default, 1),
    remote_bytes (0 default: unlimited), remote_poll_us (50 default, 0..10000),
    placement_profile (0 default: sampled; 1: every put). An unknown option is a TypeError; a
    bad value raises InvalidError."""
    return DB(str(path), **options)


import os  # noqa: E402  (used in the annotation above)
