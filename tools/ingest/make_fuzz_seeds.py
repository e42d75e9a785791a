#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/ingest/make_fuzz_seeds.py — write the seed corpora of the kvdb-ingest fuzz targets.

Every file is synthetic and deterministic; rerun after a format change:

    python3 tools/ingest/make_fuzz_seeds.py tests/fuzz/corpora

writes tests/fuzz/corpora/ingest_json/*.json (valid and invalid JSON for Jansson as kvdb-ingest
calls it: escapes, surrogates, numbers, nesting at and past Jansson's 2048 levels, duplicate keys,
bytes that are not UTF-8, a text past the fuzz target's 1 MiB parse bound, JSONL rows, a
safetensors header; "valid" means valid for both of kvdb-ingest's flag sets) and
tests/fuzz/corpora/safetensors/*.safetensors (every accepted form and dtype, and files that must be
refused: truncated, bad lengths, missing or mismatched tensors, offsets outside the data).
"""
import json
import os
import struct
import sys

JSON_SEEDS = {
    "valid_row.json": b'{"text": "Once upon a time, there was a little girl.", "id": 7}',
    "valid_escapes.json": b'{"text": "q\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00 nul \\u0000 end"}',
    "reject_lone_surrogate.json": b'{"text": "lone \\ud800 end"}',
    "reject_not_utf8.json": b'{"text": "caf\xe9"}',
    "valid_numbers.json": b'[0, -0, 12, -3.25, 1e9, 2.5E-3, 9223372036854775807]',
    # JSONL rows read these as reals; safetensors headers refuse them (offsets fit 63 bits)
    "row_big_integers.json": b'{"id": 18446744073709551615, "n": 18446744073709551616, "text": "x"}',
    "reject_real_overflow.json": b'[1e400]',
    "reject_parse_bound.json": b"[" + b"0," * 40000 + b"0]",
    "valid_literals.json": b' \t\r\n[true, false, null, {}, [], "", {"a": {"b": [1, {"c": null}]}}] \n',
    "reject_duplicate_keys.json": b'{"text": "first", "text": "second"}',
    "reject_key_with_nul.json": b'{"a\\u0000b": 1}',
    "valid_deep.json": b"[" * 63 + b"1" + b"]" * 63,
    "valid_st_header.json": b'{"__metadata__": {"model_id": "m", "format": "pt"}, "tokens": {"dtype": "I32", "shape": [3], "data_offsets": [0, 12]}}',
    "valid_deep_2048.json": b"[" * 2048 + b"]" * 2048,
    "reject_too_deep.json": b"[" * 2049 + b"]" * 2049,
    "reject_trailing_comma.json": b'{"a": 1,}',
    "reject_unterminated.json": b'{"text": "abc',
    "reject_bad_escape.json": b'"\\x41"',
    "reject_short_unicode.json": b'"\\u12"',
    "reject_control_char.json": b'"a\x01b"',
    "reject_leading_zero.json": b"012",
    "reject_bare_minus.json": b"-",
    "reject_fraction.json": b"1.",
    "reject_exponent.json": b"1e+",
    "reject_literal.json": b"tru",
    "reject_two_values.json": b"1 2",
    "reject_empty.json": b"",
    "reject_key_not_string.json": b"{1: 2}",
    "reject_missing_colon.json": b'{"a" 1}',
}


def safetensors(tensors, metadata=None, pad=0, header=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    h = {}
    if metadata is not None:
        h["__metadata__"] = metadata
    off = 0
    data = b""
    for name, dtype, shape, raw, *over in tensors:
        begin, end = (over[0] if over else (off, off + len(raw)))
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        off += len(raw)
        data += raw
    hb = header if header is not None else json.dumps(h).encode() + b" " * pad
    return struct.pack("<Q", len(hb)) + hb + data


def vals(n, fmt, seed):
    out = b""
    for i in range(n):
        v = ((i * 7 + seed * 13) % 64 - 32) / 8.0
        if fmt == "F32":
            out += struct.pack("<f", v)
        elif fmt == "F16":
            out += struct.pack("<e", v)
        else:  # BF16: the high half of the f32
            out += struct.pack("<f", v)[2:]
    return out


def tokens(t, neg=False):
    return b"".join(struct.pack("<i", -1 if neg and i == 1 else 1 + i * 5) for i in range(t))


def st_seeds():
    L, T, H, D = 2, 5, 2, 4
    n = L * T * H * D
    s = {}
    tok = ("tokens", "I32", [T], tokens(T))
    s["valid_lthd_f16.safetensors"] = safetensors(
        [tok, ("k", "F16", [L, T, H, D], vals(n, "F16", 1)), ("v", "F16", [L, T, H, D], vals(n, "F16", 2))],
        {"model_id": "seed-model"})
    s["valid_lhtd_bf16.safetensors"] = safetensors(
        [tok, ("k", "BF16", [L, H, T, D], vals(n, "BF16", 1)), ("v", "BF16", [L, H, T, D], vals(n, "BF16", 2))],
        {"model_id": "seed-model", "kv_layout": "LHTD"}, pad=3)
    per = [tok]
    for l in range(L):
        per.append((f"past_key_values.{l}.key", "F32", [1, H, T, D], vals(n // L, "F32", l)))
        per.append((f"past_key_values.{l}.value", "F32", [1, H, T, D], vals(n // L, "F32", l + 9)))
    s["valid_per_layer_f32.safetensors"] = safetensors(per)
    per3 = [tok] + [(f"past_key_values.{l}.{w}", "F16", [H, T, D], vals(n // L, "F16", l))
                    for l in range(L) for w in ("key", "value")]
    s["valid_per_layer_hdt.safetensors"] = safetensors(per3, {"model_id": "x"}, pad=1)
    s["valid_extra_tensor.safetensors"] = safetensors(
        [tok, ("k", "F16", [L, T, H, D], vals(n, "F16", 1)), ("v", "F16", [L, T, H, D], vals(n, "F16", 2)),
         ("attention_mask", "U8", [T], b"\x01" * T)])
    good = s["valid_lthd_f16.safetensors"]
    s["reject_truncated.safetensors"] = good[:-1][:7]
    s["reject_cut_data.safetensors"] = good[:-3]
    s["reject_header_len.safetensors"] = struct.pack("<Q", 1 << 40) + good[8:]
    s["reject_header_not_json.safetensors"] = safetensors([], header=b'{"tokens": [}')
    s["reject_no_tokens.safetensors"] = safetensors(
        [("k", "F16", [L, T, H, D], vals(n, "F16", 1)), ("v", "F16", [L, T, H, D], vals(n, "F16", 2))])
    s["reject_negative_token.safetensors"] = safetensors(
        [("tokens", "I32", [T], tokens(T, True)), ("k", "F16", [L, T, H, D], vals(n, "F16", 1)),
         ("v", "F16", [L, T, H, D], vals(n, "F16", 2))])
    s["reject_shape_mismatch.safetensors"] = safetensors(
        [tok, ("k", "F16", [L, T, H, D], vals(n, "F16", 1)), ("v", "F16", [L, T, D, H], vals(n, "F16", 2))])
    s["reject_dtype_mismatch.safetensors"] = safetensors(
        [tok, ("k", "F16", [L, T, H, D], vals(n, "F16", 1)), ("v", "F32", [L, T, H, D], vals(n, "F32", 2))])
    s["reject_offsets_outside.safetensors"] = safetensors(
        [tok, ("k", "F16", [L, T, H, D], vals(n, "F16", 1)),
         ("v", "F16", [L, T, H, D], vals(n, "F16", 2), (1000, 1000 + 2 * n))])
    s["reject_size_mismatch.safetensors"] = safetensors(
        [tok, ("k", "F16", [L, T, H, D], vals(n - 1, "F16", 1)), ("v", "F16", [L, T, H, D], vals(n, "F16", 2))])
    s["reject_missing_layer.safetensors"] = safetensors(per[:-1])
    s["reject_huge_shape.safetensors"] = safetensors(
        [tok, ("k", "F16", [1 << 40, 1 << 40, 1 << 40, 8], b""), ("v", "F16", [L, T, H, D], vals(n, "F16", 2))])
    dup = b'{"dtype": "I32", "shape": [3], "data_offsets": [0, 12]}'
    s["reject_duplicate_tensor.safetensors"] = safetensors(
        [("tokens", "I32", [3], bytes(12))], header=b'{"tokens": ' + dup + b', "tokens": ' + dup + b"}")
    return s


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_fuzz_seeds.py CORPORA_DIR")
    root = sys.argv[1]
    for sub, seeds in (("ingest_json", JSON_SEEDS), ("safetensors", st_seeds())):
        d = os.path.join(root, sub)
        os.makedirs(d, exist_ok=True)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{d}: {len(seeds)} files")


if __name__ == "__main__":
    main()
