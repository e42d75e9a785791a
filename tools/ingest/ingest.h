/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/ingest.h — the ingest engine behind kvdb-ingest (and kvdb-bench prefix): documents
 * in, KV caches out, through the public kvdb.h only.
 *
 * Text documents (docs.h) are tokenized with the reference model's tokenizer (no BOS; the
 * llama2.c dummy-prefix space), then cut into windows: window i is BOS followed by text tokens
 * [i * stride, i * stride + window - 1), the last window being the first that reaches the end of
 * the document. Each window is one context: its KV is computed by tools/refmodel from position 0
 * and stored with kvdb_put (refkv_put). A safetensors file is one context whose KV is stored as
 * given.
 *
 * RESUMING. The catalog is the record of what is done: before computing a window, its context
 * key (the chained hash of its tokens, kvdb_chain_hashes) is looked up (kvdb_context_stat); a
 * window that is stored is skipped. A put is atomic and durable when it returns (KVDB_SYNC_FULL,
 * the default), so after a crash or a SIGKILL a rerun with the same inputs and options skips
 * exactly the windows that were committed and computes the others: nothing committed is
 * computed twice and nothing is missed. (A separate progress file could not be updated in the
 * same transaction as the put, so it could lag behind or run ahead of the catalog.) With float32
 * storage a window also continues from the longest stored prefix of its tokens (kvdb_get), so
 * windows sharing an opening with stored ones compute only the rest. Documents are handed out in
 * a fixed order, so --max-docs selects the same documents on every run.
 *
 * STORAGE AND QUALITY. Text windows are stored as opts.storage (f32, f16, bf16) with the
 * engine's compression config opts.config (kvdb_put_ex; raw by default, safetensors contexts
 * too). With opts.profile (the default) each put also records the context's quality profile
 * (KVDB_PUT_PROFILE: what the placement policy decides from), probed with the window's own last
 * queries (up to 8, from the model); SnapKV configs get the same queries as their observation
 * window. When the stored KV is lossy (not f32 with raw or lossless),
 * opts.quality_steps > 0 measures each window's real-model quality — the window continued for
 * that many steps from its stored KV against float32, greedy-token agreement and next-token KL
 * (refkv_quality_measure) — and reports the agreement to kvdb as the caller's quality
 * (kvdb_report_quality), which the placement policy prefers to its proxy.
 */
#ifndef KVDB_INGEST_H
#define KVDB_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "kvdb.h"
#include "refkv.h"

typedef struct ingest_stats {
  uint64_t files, files_ignored;
  uint64_t docs_total;  /* documents this run will see (--max-docs applied) */
  uint64_t bytes_total; /* input bytes they span */
  uint64_t docs;        /* documents done (text and safetensors) */
  uint64_t docs_empty;  /* text documents with no text (a JSONL "" row) */
  uint64_t bytes_done;
  uint64_t windows;         /* contexts seen (text windows and safetensors files) */
  uint64_t windows_stored;  /* stored by this run */
  uint64_t windows_present; /* already stored before: skipped */
  uint64_t tokens;          /* tokens of all windows (BOS included) */
  uint64_t tokens_computed; /* positions run through the model */
  uint64_t tokens_restored; /* positions taken from stored prefixes instead */
  uint64_t kv_bytes;        /* KV bytes of the stored windows (tokens x token bytes) */
  uint64_t bytes_written;   /* bytes appended to kvdb's segment files (shared blocks: 0) */
  uint64_t blocks_written, blocks_shared;
  uint64_t quality_windows; /* windows whose quality was measured (quality_steps) */
  double quality_agreement; /* sum over them of the greedy-token agreement */
  double quality_kl;        /* sum over them of the mean next-token KL (nats) */
  double quality_max_kl;    /* largest step KL seen */
  double put_seconds;       /* time spent in puts, summed over workers (durable: fdatasync) */
  double seconds;           /* wall time so far */
  int jobs;
  int window, stride; /* in effect for text documents (0 without text input) */
  char storage[64];   /* text windows: "f32 raw", "f16 int8", ... ("" without text input) */
  char model_id[64];  /* the id text windows are stored under ("" without text input) */
} ingest_stats;

typedef void (*ingest_progress_fn)(void *ctx, const ingest_stats *s, int final);

typedef struct ingest_opts {
  const char *db_dir;        /* created if absent */
  const char *const *inputs; /* files and folders */
  size_t n_inputs;
  const char *model_path;      /* llama2.c checkpoint; needed only for text inputs */
  const char *tokenizer_path;  /* its tokenizer */
  const char *model_id;        /* NULL: refkv_default_id for text, __metadata__.model_id
                                  for safetensors; otherwise used for every context */
  const char *text_field;      /* JSONL member; NULL = "text" */
  refkv_storage storage;       /* text windows; default REFKV_STORE_F32 */
  const char *config;          /* kvdb config of text windows and safetensors contexts
                                  (kvdb_config_parse); NULL = "raw" */
  int profile;                 /* record each context's quality profile (default 1) */
  int quality_steps;           /* lossy text windows: measure and report quality; 0 = no */
  uint32_t block_tokens;       /* 0 = 16 */
  int window;                  /* tokens per context, BOS included; 0 = the model's seq_len */
  int stride;                  /* text tokens between window starts; 0 = window - 1 */
  int jobs;                    /* worker threads; 0 = 1 */
  uint64_t max_docs;           /* 0 = all */
  kvdb_sync_mode sync_mode;    /* default KVDB_SYNC_FULL */
  double progress_interval_s;  /* between progress calls; 0 = 1 s */
  ingest_progress_fn progress; /* optional; called from worker threads, one at a time */
  void *progress_ctx;
} ingest_opts;

/* Zero *o and set the defaults above. */
void ingest_opts_init(ingest_opts *o);

/*
 * Run an ingest. On success returns 0 with the totals in *stats. On failure returns -1 with the
 * reason in err (the first error of any worker: a bad option, an unreadable or malformed input
 * naming the file and line or tensor, a kvdb error with its message); *stats then holds what was
 * done before it, all of which is stored.
 */
int ingest_run(const ingest_opts *o, ingest_stats *stats, char *err, size_t err_cap);

#endif
