# SPDX-License-Identifier: MIT
"""A numpy forward pass of a Llama-architecture GGUF (SmolLM2-135M), for the quality truth.

llama.cpp's KV cache cannot leave out positions per KV head, and llama.cpp exposes no queries;
the truth (python/kvdb/llama_truth.py) needs both: the model's real queries at positions spread
over a context (kvdb's quality probes) and attention over the KV kvdb returns, with the
positions a token-dropping config left out masked per (layer, KV head). This module runs the
model from the GGUF's own weights, dequantized to float32 with the `gguf` package (the
llama.cpp project's GGUF reader), the way llama.cpp computes it for general.architecture
"llama":

    x = token_embd[token]
    per layer: h = rms_norm(x) * attn_norm
               q, k, v = h Wq, h Wk, h Wv; RoPE on q and k (llama.cpp's LLAMA_ROPE_TYPE_NORM:
               adjacent pairs (2i, 2i+1) rotated by pos * freq_base^(-2i / n_rot); the GGUF
               converter permuted Wq and Wk so that this equals Hugging Face's half rotation)
               K and V rounded to f16 (llama.cpp's f16 cache, kvdb's stored dtype)
               attention: query head i uses KV head i // (n_head / n_head_kv), causal,
               scale 1/sqrt(head_dim), softmax in float32; x += o Wo
               h = rms_norm(x) * ffn_norm; x += (silu(h Wgate) * (h Wup)) Wdown
    logits = (rms_norm(x) * output_norm) output^T   (output = token_embd when tied)

Hyper-parameters come from the GGUF metadata ({arch}.block_count, .embedding_length,
.attention.head_count(_kv), .rope.freq_base, .rope.dimension_count,
.attention.layer_norm_rms_epsilon); anything else (another architecture, RoPE scaling, a
partial rotary dimension) raises ValueError naming it. llama.cpp itself differs by its
quantized matrix products (activations rounded to 8 bits against Q4_1 / Q8_0 weights) and its
f16 Q in K Q^T: test_npllama.py bounds the difference (argmax agreement, KL).

Every call is batched: `forward` takes B sequences of T new tokens each (positions
pos0[b]..pos0[b]+T-1) and, optionally, a stored prefix per sequence and layer with a mask of
present positions per KV head (absent positions never weighted).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Hparams:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_base: float
    eps: float


@dataclass
class Prefix:
    """A stored prefix for `forward`, one entry per layer: k[l], v[l] of shape
    (B, n_head_kv, P, head_dim) (f16 or f32) and present (B, n_head_kv, P) bool, or None
    (every position present)."""
    k: List[np.ndarray]
    v: List[np.ndarray]
    present: Optional[np.ndarray]  # (n_layer, B, n_head_kv, P) or None


@dataclass
class Output:
    """What `forward` returns: logits (B, T, n_vocab) float32 (of the positions asked for);
    per layer q (B, T, n_head, head_dim) float32 after RoPE (when asked) and k, v
    (B, T, n_head_kv, head_dim) f16 after RoPE (K) as the cache holds them."""
    logits: Optional[np.ndarray]
    q: Optional[List[np.ndarray]]
    k: List[np.ndarray]
    v: List[np.ndarray]
    x: Optional[List[np.ndarray]] = None  # per layer, its input (the residual stream), when asked


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


class NpLlama:
    """The model of a GGUF file, weights dequantized to float32 (SmolLM2-135M: ~0.6 GB)."""

    def __init__(self, gguf_path: str):
        import gguf  # the llama.cpp project's GGUF reader (PyPI `gguf`)
        r = gguf.GGUFReader(gguf_path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{gguf_path}: general.architecture {arch!r}; the numpy forward "
                             "implements 'llama' only")

        def need(key: str):
            v = _field(r, f"{arch}.{key}")
            if v is None:
                raise ValueError(f"{gguf_path}: no {arch}.{key} in the GGUF metadata")
            return v

        for key in ("rope.scaling.type", "rope.scaling.factor", "rope.freq_scale"):
            v = _field(r, f"{arch}.{key}")
            if v not in (None, "none", 1.0):
                raise ValueError(f"{gguf_path}: {arch}.{key} = {v!r}: RoPE scaling is not "
                                 "implemented by the numpy forward")
        n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = n_embd // n_head
        n_rot = _field(r, f"{arch}.rope.dimension_count")
        if n_rot is not None and int(n_rot) != head_dim:
            raise ValueError(f"{gguf_path}: rope.dimension_count {n_rot} != head_dim {head_dim}:"
                             " partial rotary embeddings are not implemented")
        t = {x.name: x for x in r.tensors}

        def w(name: str) -> np.ndarray:
            if name not in t:
                raise ValueError(f"{gguf_path}: no tensor {name}")
            x = t[name]
            a = gguf.quants.dequantize(x.data, x.tensor_type)
            return np.ascontiguousarray(a, dtype=np.float32)

        emb = w("token_embd.weight")  # (n_vocab, n_embd)
        self.hp = Hparams(int(need("block_count")), n_embd, n_head,
                          int(need("attention.head_count_kv")), head_dim,
                          int(need("feed_forward_length")), emb.shape[0],
                          float(need("rope.freq_base")),
                          float(need("attention.layer_norm_rms_epsilon")))
        hp = self.hp
        if n_head % hp.n_head_kv:
            raise ValueError(f"head_count {n_head} is not a multiple of head_count_kv "
                             f"{hp.n_head_kv}")
        self.emb = emb
        self.out = w("output.weight") if "output.weight" in t else emb  # tied
        self.out_norm = w("output_norm.weight")
        self.layers = []
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            # matrices stored (out, in); kept as (in, out) for x @ W
            wq, wk, wv = w(p + "attn_q.weight"), w(p + "attn_k.weight"), w(p + "attn_v.weight")
            self.layers.append(dict(
                attn_norm=w(p + "attn_norm.weight"), ffn_norm=w(p + "ffn_norm.weight"),
                wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], 0).T),
                wo=np.ascontiguousarray(w(p + "attn_output.weight").T),
                wgu=np.ascontiguousarray(np.concatenate([w(p + "ffn_gate.weight"),
                                                         w(p + "ffn_up.weight")], 0).T),
                wd=np.ascontiguousarray(w(p + "ffn_down.weight").T)))
        half = hp.head_dim // 2
        # llama.cpp: theta_scale = freq_base^(-2/n_dims); theta_i = pos * theta_scale^i
        self.inv_freq = (np.float64(hp.rope_base) ** (-2.0 * np.arange(half) / hp.head_dim))

    # ---- pieces ----

    def _rms(self, x: np.ndarray, wgt: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x * (1.0 / np.sqrt(ms + self.hp.eps)).astype(np.float32) * wgt

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Adjacent-pair RoPE of x (B, T, heads, head_dim) at positions pos (B, T)."""
        ang = pos[..., None].astype(np.float64) * self.inv_freq  # (B, T, half)
        c = np.cos(ang).astype(np.float32)[:, :, None, :]
        s = np.sin(ang).astype(np.float32)[:, :, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def unrope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The inverse rotation (positions pos (B, T))."""
        return self.rope(x, -pos)

    # ---- the forward pass ----

    def forward(self, tokens: np.ndarray, pos0: Sequence[int], prefix: Optional[Prefix] = None,
                want_q: bool = False, logits: bool = True, want_x: bool = False) -> Output:
        """B sequences of T new tokens (tokens (B, T) int), sequence b at positions
        pos0[b]..pos0[b]+T-1, each attending to every present row of its prefix (P rows whose
        K already carries its position's rotation: P <= pos0[b], P < pos0[b] when rows were
        left out) and causally to its own new tokens."""
        hp = self.hp
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens: shape {tokens.shape}, expected (B, T)")
        B, T = tokens.shape
        pos0 = np.asarray(pos0, dtype=np.int64).reshape(B)
        P = 0
        if prefix is not None:
            P = prefix.k[0].shape[2]
            if np.any(pos0 < P):
                raise ValueError(f"a prefix of {P} rows needs pos0 >= {P}, got {pos0}")
        elif np.any(pos0 != pos0[0]):
            raise ValueError("pos0 must be equal across the batch")
        pos = pos0[:, None] + np.arange(T)[None, :]
        H, QH, d = hp.n_head_kv, hp.n_head, hp.head_dim
        g = QH // H
        x = self.emb[tokens.reshape(-1)].reshape(B, T, hp.n_embd)
        causal = np.tril(np.ones((T, T), dtype=bool))
        scale = np.float32(1.0 / np.sqrt(d))
        qs: Optional[List[np.ndarray]] = [] if want_q else None
        xs: Optional[List[np.ndarray]] = [] if want_x else None
        ks, vs = [], []
        for il, ly in enumerate(self.layers):
            if xs is not None:
                xs.append(x)
            h = self._rms(x, ly["attn_norm"])
            qkv = h.reshape(B * T, -1) @ ly["wqkv"]
            q = qkv[:, :QH * d].reshape(B, T, QH, d)
            k = qkv[:, QH * d:(QH + H) * d].reshape(B, T, H, d)
            v = qkv[:, (QH + H) * d:].reshape(B, T, H, d)
            q = self.rope(q, pos)
            k16 = self.rope(k, pos).astype(np.float16)
            v16 = v.astype(np.float16)
            if qs is not None:
                qs.append(q)
            ks.append(k16)
            vs.append(v16)
            # (B, H, g, T, d) queries against (B, H, P + T, d) keys
            qh = q.reshape(B, T, H, g, d).transpose(0, 2, 3, 1, 4)
            kn = k16.astype(np.float32).transpose(0, 2, 1, 3)
            vn = v16.astype(np.float32).transpose(0, 2, 1, 3)
            s_new = (qh @ kn[:, :, None].transpose(0, 1, 2, 4, 3)) * scale  # (B,H,g,T,T)
            s_new = np.where(causal, s_new, -np.inf)
            if P:
                kp = prefix.k[il].astype(np.float32, copy=False)  # (B, H, P, d)
                vp = prefix.v[il].astype(np.float32, copy=False)
                s_old = (qh @ kp[:, :, None].transpose(0, 1, 2, 4, 3)) * scale  # (B,H,g,T,P)
                if prefix.present is not None:
                    s_old = np.where(prefix.present[il][:, :, None, None, :], s_old, -np.inf)
                m = np.maximum(s_old.max(-1, keepdims=True), s_new.max(-1, keepdims=True))
                e_old, e_new = np.exp(s_old - m), np.exp(s_new - m)
                den = e_old.sum(-1, keepdims=True) + e_new.sum(-1, keepdims=True)
                o = (e_old @ vp[:, :, None] + e_new @ vn[:, :, None]) / den
            else:
                m = s_new.max(-1, keepdims=True)
                e_new = np.exp(s_new - m)
                o = (e_new @ vn[:, :, None]) / e_new.sum(-1, keepdims=True)
            o = o.transpose(0, 3, 1, 2, 4).reshape(B * T, QH * d)  # head i*g+j
            x = x + (o @ ly["wo"]).reshape(B, T, hp.n_embd)
            h = self._rms(x, ly["ffn_norm"]).reshape(B * T, -1)
            gu = h @ ly["wgu"]
            gt, up = gu[:, :hp.n_ff], gu[:, hp.n_ff:]
            act = gt / (1.0 + np.exp(-gt)) * up
            x = x + (act @ ly["wd"]).reshape(B, T, hp.n_embd)
        lg = None
        if logits:
            h = self._rms(x, self.out_norm).reshape(B * T, -1)
            lg = (h @ self.out.T).reshape(B, T, -1)
        return Output(lg, qs, ks, vs, xs)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, float64."""
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
