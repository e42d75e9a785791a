# SPDX-License-Identifier: MIT
"""ctypes declarations of engine/include/kvdb.h and the search for libkvdb.so.

The library is looked for, in this order:
  1. the file named by the environment variable KVDB_LIB;
  2. libkvdb.so* next to this package (a wheel or a copy that ships the library);
  3. build/engine/libkvdb.so in this package's directory or any directory above it (the
     repository's meson build when the package is installed editable, or into a virtual
     environment inside the repository);
  4. the system's search path (ctypes.util.find_library("kvdb"), e.g. /usr/local/lib).

Calls go through ctypes.CDLL, which releases the GIL for the duration of every foreign call
(ctypes.PyDLL is the variant that keeps it), so I/O in one thread does not stop the others.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int8,
                    c_int64, c_size_t, c_uint, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import List, Optional

# ---- structures (field for field as in kvdb.h) ------------------------------------------------


class Key(Structure):
    _fields_ = [("b", c_uint8 * 16)]


class Model(Structure):
    _fields_ = [("id", c_char_p), ("n_layers", c_uint32), ("n_kv_heads", c_uint32),
                ("head_dim", c_uint32), ("dtype", c_int), ("block_tokens", c_uint32),
                ("score_bits", c_uint32), ("rope_base", c_float), ("rope_style", c_uint32)]


class TensorView(Structure):
    _fields_ = [("base", c_void_p), ("layer_bases", POINTER(c_void_p)),
                ("layer_stride", c_int64), ("token_stride", c_int64),
                ("head_stride", c_int64), ("dim_stride", c_int64)]


class KVView(Structure):
    _fields_ = [("k", TensorView), ("v", TensorView)]


class Config(Structure):
    _fields_ = [("method", c_uint8), ("bits", c_uint8), ("drop", c_uint8), ("zstd_level", c_int8),
                ("keep_permille", c_uint16), ("group", c_uint16), ("residual", c_uint32)]


LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class TierPerf(Structure):
    _fields_ = [("read_bps", c_double), ("latency_s", c_double), ("probed_unix_ms", c_uint64),
                ("reads", c_uint64)]


class Options(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("dram_bytes", c_uint64),
                ("ssd_bytes", c_uint64), ("sync_mode", c_int), ("segment_bytes", c_uint64),
                ("catalog_map_bytes", c_uint64), ("use_direct_io", c_int),
                ("use_io_uring", c_int), ("log_fn", c_void_p), ("log_ctx", c_void_p),
                ("log_level", c_int), ("smartssd_dir", c_char_p), ("smartssd_bytes", c_uint64),
                ("placement", c_int), ("placement_alpha", c_double),
                ("freq_half_life_s", c_double), ("reprofile_drift_pct", c_double),
                ("prefill_tokens_per_s", c_double), ("placement_slack_pct", c_double),
                ("lossless_frame_bytes", c_uint32), ("remote_addr", c_char_p),
                ("remote_namespace", c_char_p), ("remote_timeout_ms", c_uint32),
                ("remote_queue_blocks", c_uint32), ("remote_put_wait_ms", c_uint32),
                ("prefetch_bps", c_double), ("remote_write", c_uint32),
                ("remote_copy_hits", c_uint32), ("remote_hash_tag", c_uint32),
                ("remote_bytes", c_uint64), ("remote_poll_us", c_uint32),
                ("placement_profile", c_uint32), ("packed_block_bytes", c_uint32),
                ("tier_perf", TierPerf * 3)]


class PutInfo(Structure):
    _fields_ = [("context", Key), ("n_blocks", c_uint32), ("blocks_written", c_uint32),
                ("blocks_shared", c_uint32), ("bytes_written", c_uint64)]


class PutOpts(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("config", Config),
                ("queries", POINTER(c_float)), ("n_queries", c_uint32), ("n_q_heads", c_uint32),
                ("profile_space", c_char_p), ("profile_heads", c_uint32),
                ("probe_queries", POINTER(c_float)), ("probe_positions", POINTER(c_uint32)),
                ("n_probe_queries", c_uint32)]


class ProfileEntry(Structure):
    _fields_ = [("config", Config), ("flags", c_uint32), ("bytes", c_uint64),
                ("quality", c_double), ("rel_l2", c_double), ("reported_quality", c_double),
                ("n_reports", c_uint32), ("n_probes", c_uint32), ("cosine", c_double),
                ("worst_head", c_double)]


class CalibContext(Structure):
    _fields_ = [("kv", POINTER(KVView)), ("n_tokens", c_uint32), ("queries", POINTER(c_float)),
                ("positions", POINTER(c_uint32)), ("n_queries", c_uint32)]


class CalibOpts(Structure):
    _fields_ = [("struct_size", c_uint32), ("flags", c_uint32), ("n_q_heads", c_uint32),
                ("int4_bits", c_float), ("int2_bits", c_float)]


class CalibInfo(Structure):
    _fields_ = [("calibrated", c_uint32), ("flags", c_uint32), ("n_contexts", c_uint32),
                ("n_probes", c_uint32), ("int4_bits", c_float), ("int2_bits", c_float),
                ("int4_planned_bits", c_float), ("int2_planned_bits", c_float)]


class ContextInfo(Structure):
    _fields_ = [("key", Key), ("model_id", c_char * 64), ("n_tokens", c_uint64),
                ("n_blocks", c_uint32), ("explicit_key", c_uint32), ("bytes", c_uint64),
                ("created_unix_ms", c_uint64), ("last_access_unix_ms", c_uint64),
                ("in_dram_blocks", c_uint32), ("tier", c_uint32), ("config", Config),
                ("has_profile", c_uint32), ("cached", c_uint32), ("frequency", c_double),
                ("score_bits", c_uint32), ("score_versions", c_uint32)]


class TierStats(Structure):
    _fields_ = [("capacity_bytes", c_uint64), ("bytes", c_uint64), ("blocks", c_uint64),
                ("contexts", c_uint64), ("hits", c_uint64), ("misses", c_uint64)]


class Stats(Structure):
    _fields_ = [("format_version", c_uint32), ("n_models", c_uint32), ("n_contexts", c_uint64),
                ("n_blocks", c_uint64), ("n_segments", c_uint64),
                ("segment_file_bytes", c_uint64), ("live_bytes", c_uint64),
                ("catalog_bytes", c_uint64), ("corrupt_blocks", c_uint64),
                ("bytes_read", c_uint64), ("bytes_written", c_uint64), ("direct_io", c_int),
                ("io_uring", c_int), ("tier", TierStats * 3)]


class Problem(Structure):
    _fields_ = [("status", c_int), ("message", c_char_p)]


PROBLEM_FN = ctypes.CFUNCTYPE(None, c_void_p, POINTER(Problem))
PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, c_uint64, c_uint64)


class VerifyReport(Structure):
    _fields_ = [("blocks_checked", c_uint64), ("bytes_checked", c_uint64),
                ("contexts_checked", c_uint64), ("segments_checked", c_uint64),
                ("problems", c_uint64)]


def out_struct(cls):
    """An instance of `cls` inside a zeroed buffer 1 KiB larger than the structure: structures the
    library fills (and whose struct_size it sets) only ever grow at the end, so a newer library
    writing a longer one stays inside the buffer."""
    buf = ctypes.create_string_buffer(ctypes.sizeof(cls) + 1024)
    obj = cls.from_buffer(buf)
    obj._kvdb_buf = buf  # keep the buffer alive with the structure
    return obj


# ---- the library ---------------------------------------------------------------------------


def _candidates() -> List[str]:
    out: List[str] = []
    env = os.environ.get("KVDB_LIB")
    if env:
        out.append(env)
    here = Path(__file__).resolve().parent
    out += [str(p) for p in sorted(here.glob("libkvdb.so*"))]
    for d in [here] + list(here.parents):
        p = d / "build" / "engine" / "libkvdb.so"
        if p.exists():
            out.append(str(p))
    sys_name = ctypes.util.find_library("kvdb")
    if sys_name:
        out.append(sys_name)
    return out


def _load() -> ctypes.CDLL:
    tried = []
    env = os.environ.get("KVDB_LIB")
    for cand in _candidates():
        try:
            return ctypes.CDLL(cand)
        except OSError as e:
            if env and cand == env:
                raise ImportError(f"kvdb: KVDB_LIB={env!r} cannot be loaded: {e}") from e
            tried.append(f"{cand} ({e})")
    raise ImportError(
        "kvdb: libkvdb.so not found; set KVDB_LIB to its path, or build the repository "
        "(meson setup build && ninja -C build) so that build/engine/libkvdb.so exists"
        + ("; tried: " + ", ".join(tried) if tried else ""))


lib = _load()
path: Optional[str] = getattr(lib, "_name", None)

_S = c_int  # kvdb_status
_protos = {
    "kvdb_version_number": (c_uint, []),
    "kvdb_status_name": (c_char_p, [c_int]),
    "kvdb_errmsg": (c_char_p, []),
    "kvdb_model_token_bytes": (c_size_t, [POINTER(Model)]),
    "kvdb_chain_hashes": (_S, [POINTER(Model), POINTER(c_uint32), c_size_t, POINTER(Key), c_size_t]),
    "kvdb_kv_view_packed": (_S, [POINTER(KVView), c_void_p, POINTER(Model), c_size_t, c_int]),
    "kvdb_config_parse": (_S, [c_char_p, POINTER(Config)]),
    "kvdb_config_name": (c_char_p, [POINTER(Config), c_char_p, c_size_t]),
    "kvdb_options_init": (None, [c_void_p]),
    "kvdb_open": (_S, [c_char_p, c_void_p, POINTER(c_void_p)]),
    "kvdb_close": (None, [c_void_p]),
    "kvdb_put": (_S, [c_void_p, POINTER(Model), POINTER(c_uint32), c_size_t, POINTER(KVView),
                      c_void_p]),
    "kvdb_put_opts_init": (None, [c_void_p]),
    "kvdb_put_ex": (_S, [c_void_p, POINTER(Model), POINTER(c_uint32), c_size_t, POINTER(KVView),
                         c_void_p, c_void_p]),
    "kvdb_calib_opts_init": (None, [c_void_p]),
    "kvdb_model_calibrate": (_S, [c_void_p, POINTER(Model), POINTER(CalibContext), c_size_t,
                                  c_void_p]),
    "kvdb_model_calibration": (_S, [c_void_p, c_char_p, c_void_p]),
    "kvdb_model_set_output_gains": (_S, [c_void_p, POINTER(Model), POINTER(c_float), c_uint32,
                                         c_uint32]),
    "kvdb_model_output_gains": (_S, [c_void_p, c_char_p, POINTER(c_float), c_size_t,
                                     POINTER(c_size_t), POINTER(c_uint32), POINTER(c_uint32)]),
    "kvdb_lookup": (_S, [c_void_p, POINTER(Model), POINTER(c_uint32), c_size_t,
                         POINTER(c_size_t)]),
    "kvdb_get": (_S, [c_void_p, POINTER(Model), POINTER(c_uint32), c_size_t, POINTER(KVView),
                      POINTER(c_size_t)]),
    "kvdb_lookup_kept": (_S, [c_void_p, POINTER(Model), POINTER(c_uint32), c_size_t,
                              POINTER(c_size_t), POINTER(c_size_t)]),
    "kvdb_get_kept": (_S, [c_void_p, POINTER(Model), POINTER(c_uint32), c_size_t,
                           POINTER(KVView), c_void_p, c_size_t, POINTER(c_size_t),
                           POINTER(c_size_t)]),
    "kvdb_get_tokens": (_S, [c_void_p, POINTER(Model), POINTER(Key), c_uint32,
                             POINTER(c_uint32), c_size_t, POINTER(KVView)]),
    "kvdb_delete": (_S, [c_void_p, POINTER(Key)]),
    "kvdb_context_stat": (_S, [c_void_p, POINTER(Key), c_void_p]),
    "kvdb_iter_open": (_S, [c_void_p, POINTER(c_void_p)]),
    "kvdb_iter_next": (_S, [c_void_p, c_void_p]),
    "kvdb_iter_close": (None, [c_void_p]),
    "kvdb_stat": (_S, [c_void_p, c_void_p]),
    "kvdb_verify": (_S, [c_void_p, PROBLEM_FN, PROGRESS_FN, c_void_p, c_void_p]),
    "kvdb_profile": (_S, [c_void_p, POINTER(Model), POINTER(Key), c_void_p]),
    "kvdb_profile_get": (_S, [c_void_p, POINTER(Key), POINTER(ProfileEntry), c_size_t,
                              POINTER(c_size_t)]),
    "kvdb_score": (_S, [c_void_p, POINTER(Model), POINTER(Key), c_uint32, c_uint32, c_void_p,
                        c_int, c_uint32, POINTER(c_uint32), POINTER(c_float)]),
}
for _name, (_res, _args) in _protos.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
