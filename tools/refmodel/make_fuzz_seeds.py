#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/refmodel/make_fuzz_seeds.py — write the seed corpora of the refmodel fuzz targets.

Every file is synthetic (random weights from a fixed seed, a made-up 300-token vocabulary), so
nothing from shared/ is copied into the repository. Output is deterministic; rerun after a format
change:

    python3 tools/refmodel/make_fuzz_seeds.py tests/fuzz/corpora

writes tests/fuzz/corpora/refmodel_checkpoint/*.bin and tests/fuzz/corpora/refmodel_tokenizer/*.bin
(valid files and invalid ones: truncated, extra bytes, bad header fields, NaN values), each under
64 KiB.
"""
import math
import os
import random
import struct
import sys


def checkpoint(dim, hidden, layers, heads, kv_heads, vocab, seq_len, seed, shared=True):
    """A llama2.c v0 checkpoint with random weights; vocab < 0 in the header when not shared."""
    rng = random.Random(seed)
    head_size = dim // heads
    kv_dim = kv_heads * head_size
    counts = [
        vocab * dim,  # token_embedding
        layers * dim,  # rms_att_weight
        layers * dim * dim,  # wq
        layers * kv_dim * dim,  # wk
        layers * kv_dim * dim,  # wv
        layers * dim * dim,  # wo
        layers * dim,  # rms_ffn_weight
        layers * hidden * dim,  # w1
        layers * dim * hidden,  # w2
        layers * hidden * dim,  # w3
        dim,  # rms_final_weight
        seq_len * head_size // 2,  # freq_cis_real
        seq_len * head_size // 2,  # freq_cis_imag
    ]
    if not shared:
        counts.append(vocab * dim)  # wcls
    header = struct.pack('<7i', dim, hidden, layers, heads, kv_heads,
                         vocab if shared else -vocab, seq_len)
    n = sum(counts)
    weights = struct.pack('<%df' % n, *(rng.uniform(-1.0, 1.0) for _ in range(n)))
    return header + weights


def patch_i32(data, index, value):
    return data[:4 * index] + struct.pack('<i', value) + data[4 * index + 4:]


def tokenizer(pieces, max_len=None):
    """A llama2.c tokenizer file: max_token_length, then (score, len, bytes) per token."""
    if max_len is None:
        max_len = max(len(p) for p, _ in pieces)
    out = [struct.pack('<i', max_len)]
    for piece, score in pieces:
        out.append(struct.pack('<fi', score, len(piece)) + piece)
    return b''.join(out)


def vocab300():
    """<unk>, BOS, EOS, 256 byte tokens, 20 single characters, then 21 merged pieces."""
    pieces = [(b'<unk>', 0.0), (b'\n<s>\n', 0.0), (b'\n</s>\n', 0.0)]
    pieces += [(b'<0x%02X>' % b, 0.0) for b in range(256)]
    # Single characters score below every merge, as in SentencePiece exports.
    pieces += [(bytes([c]), -100.0 - i) for i, c in enumerate(b' etaonihsrdluwcmTO.,')]
    merges = [
        b' t', b'he', b' a', b' s', b' w', b'nd', b' the', b'ed', b' to', b'in', b'er', b'an',
        b'ou', b' h', b'on', b'at', b' l', b'ce', b'nce', b' O', b' Once',
    ]
    pieces += [(m, -float(i)) for i, m in enumerate(merges)]
    assert len(pieces) == 300
    return pieces


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join('tests', 'fuzz', 'corpora')
    ckpt_dir = os.path.join(root, 'refmodel_checkpoint')
    tok_dir = os.path.join(root, 'refmodel_tokenizer')
    os.makedirs(ckpt_dir, exist_ok=True)
    os.makedirs(tok_dir, exist_ok=True)

    def put(folder, name, data):
        assert len(data) < 64 * 1024, name
        with open(os.path.join(folder, name), 'wb') as f:
            f.write(data)

    tiny = checkpoint(8, 16, 2, 2, 1, 16, 8, seed=1)
    ckpts = {
        'valid_dim8_2layers.bin': tiny,
        'valid_unshared_classifier.bin': checkpoint(8, 16, 2, 2, 1, 16, 8, seed=2, shared=False),
        'valid_dim16_gqa.bin': checkpoint(16, 24, 1, 4, 2, 12, 4, seed=3),
        'valid_mha_1layer.bin': checkpoint(4, 4, 1, 2, 2, 3, 2, seed=4),
        'bad_truncated_1_byte.bin': tiny[:-1],
        'bad_extra_byte.bin': tiny + b'\0',
        'bad_header_only.bin': tiny[:28],
        'bad_short_header.bin': tiny[:27],
        'bad_empty.bin': b'',
        'bad_n_heads_0.bin': patch_i32(tiny, 3, 0),
        'bad_kv_heads_not_dividing.bin': patch_i32(checkpoint(12, 8, 1, 3, 1, 4, 2, seed=5), 4, 2),
        'bad_odd_head_size.bin': patch_i32(tiny, 3, 8),
        'bad_vocab_int_min.bin': patch_i32(tiny, 5, -2**31),
        'bad_vocab_0.bin': patch_i32(tiny, 5, 0),
        'bad_negative_vocab_no_wcls.bin': patch_i32(tiny, 5, -16),
        'bad_huge_dims.bin': struct.pack('<7i', 65536, 1 << 20, 1024, 1, 1, 1 << 22, 1 << 20),
        'bad_dim_too_large.bin': patch_i32(tiny, 0, 65537),
        'bad_nan_weight.bin': tiny[:100] + struct.pack('<f', math.nan) + tiny[104:],
        'bad_inf_weight.bin': tiny[:-4] + struct.pack('<f', math.inf),
    }
    for name, data in ckpts.items():
        put(ckpt_dir, name, data)

    v = vocab300()
    tok = tokenizer(v)
    second_len_off = 4 + 8 + len(v[0][0]) + 4  # length field of token 1
    toks = {
        'valid_300_tokens.bin': tok,
        'valid_small_no_byte_fallback.bin': tokenizer([(b'a', 0.0), (b'b', -1.0), (b' ', -2.0),
                                                       (b'ab', 1.0), (b' ab', 2.0)]),
        'valid_duplicates_and_empty.bin': tokenizer([(b'', 0.0), (b'\n<s>\n', 0.0), (b'x', 0.0),
                                                     (b'x', 5.0), (b'xx', -1e11), (b' x', 1.0),
                                                     (b'', 3.0)] +
                                                    [(b'<0x%02x>' % b, 0.0) for b in range(256)]),
        'bad_truncated_1_byte.bin': tok[:-1],
        'bad_truncated_in_length.bin': tok[:4 + 8 + 5 + 6],
        'bad_negative_length.bin': tok[:second_len_off] + struct.pack('<i', -1) +
                                   tok[second_len_off + 4:],
        'bad_length_over_max.bin': tok[:second_len_off] + struct.pack('<i', 100) +
                                   tok[second_len_off + 4:],
        'bad_max_len_0.bin': struct.pack('<i', 0) + tok[4:],
        'bad_max_len_huge.bin': struct.pack('<i', 1 << 30) + tok[4:],
        'bad_nan_score.bin': tok[:4 + 8 + 5] + struct.pack('<f', math.nan) + tok[4 + 8 + 5 + 4:],
        'bad_empty.bin': b'',
        'bad_header_only.bin': tok[:4],
    }
    for name, data in toks.items():
        put(tok_dir, name, data)


if __name__ == '__main__':
    main()
