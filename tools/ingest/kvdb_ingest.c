/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/kvdb_ingest.c — kvdb-ingest: a corpus of documents (or KV computed elsewhere, as
 * safetensors files) into a kvdb database, resumable. Manual: kvdb-ingest.1.md beside this file.
 *
 * The work is ingest.c's; this file parses the command line, shows progress (a bar when stderr
 * is a terminal, a plain line every --progress-interval seconds otherwise) and prints the
 * summary (text, or one JSON object with --json). Uses only kvdb.h (through ingest.h).
 *
 * EXIT STATUS: 0 done, 1 error (the reason on stderr; everything stored before it stays stored
 * and a rerun resumes), 2 usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin_out.h"
#include "ingest.h"
#include "shared_paths.h"

#define PROG "kvdb-ingest"

static void usage(FILE *f)
{
  fprintf(f,
          "usage: " PROG " [options] DB INPUT...\n"
          "\n"
          "Compute the KV cache of every document in INPUT (files or folders of .txt, .jsonl\n"
          "and .safetensors) and store it in the kvdb database DB (created if absent).\n"
          "A rerun with the same inputs and options resumes: stored windows are skipped.\n"
          "\n"
          "text documents (.txt: separated by blank lines; .jsonl: one per row):\n"
          "  --model FILE         llama2.c checkpoint (default: stories260K from the shared\n"
          "                       data, see KVDB_MODEL_DIR / KVDB_SHARED_DIR)\n"
          "  --tokenizer FILE     its tokenizer (needed with --model)\n"
          "  --text-field NAME    JSONL member holding the text (default: text)\n"
          "  --window N           tokens per context, BOS included (default: the model's seq_len)\n"
          "  --stride N           text tokens between window starts (default: window - 1)\n"
          "  --storage S          element type of the stored KV: f32 (default), f16 or bf16\n"
          "  --quality-steps N    lossy storage or config: measure each window's real-model\n"
          "                       quality over N steps from its stored KV (token agreement,\n"
          "                       KL) and report it to kvdb's quality profile (default: 0)\n"
          "  --max-docs N         only the first N documents (default: all)\n"
          "  --jobs N             worker threads (default: 1)\n"
          "all inputs:\n"
          "  --model-id ID        store under this model id (default: the checkpoint's name and\n"
          "                       digest; for safetensors __metadata__.model_id)\n"
          "  --block-tokens N     kvdb block size in tokens (default: 16)\n"
          "  --config NAME        kvdb storage config of new blocks: raw (default), lossless,\n"
          "                       int8, int4, int2, int4:g64, snapkv50, knorm70+int4, ...\n"
          "  --no-profile         do not record each context's quality profile (recorded by\n"
          "                       default: what kvdb's placement policy decides from)\n"
          "  --sync full|none     durable puts (default) or none (survives a process crash only)\n"
          "  --progress-interval S  seconds between plain progress lines (default: 10)\n"
          "  -q, --quiet          no progress\n"
          "  --json               print the summary as one JSON object on stdout\n"
          "  -h, --help           this text\n");
}

typedef struct cli {
  int json, quiet, tty;
  double interval;
  int bar_shown;
} cli;

static void fmt_eta(double s, char *buf, size_t cap)
{
  if (!(s >= 0) || s > 360000)
    snprintf(buf, cap, "?");
  else if (s >= 3600)
    snprintf(buf, cap, "%d:%02d:%02d", (int)s / 3600, ((int)s / 60) % 60, (int)s % 60);
  else
    snprintf(buf, cap, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void on_progress(void *ctx, const ingest_stats *s, int final)
{
  cli *c = ctx;
  if (c->quiet)
    return;
  double frac = s->bytes_total ? (double)s->bytes_done / (double)s->bytes_total : 1.0;
  double rate = s->seconds > 0 ? (double)s->tokens_computed / s->seconds : 0;
  double eta = frac > 0 ? s->seconds * (1 - frac) / frac : -1;
  char e[32];
  fmt_eta(eta, e, sizeof e);
  if (c->tty) {
    char bar[21];
    int full = (int)(frac * 20 + 0.5);
    for (int i = 0; i < 20; i++)
      bar[i] = i < full ? '#' : '-';
    bar[20] = '\0';
    fprintf(stderr,
            "\r\033[K" PROG " [%s] %5.1f%%  %" PRIu64 "/%" PRIu64 " docs  %.0f tokens/s  ETA %s",
            bar, frac * 100, s->docs, s->docs_total, rate, final ? "0:00" : e);
    c->bar_shown = 1;
    if (final) {
      fputc('\n', stderr);
      c->bar_shown = 0;
    }
  } else if (!final) {
    fprintf(stderr,
            PROG ": %" PRIu64 "/%" PRIu64 " documents (%.1f%%), %" PRIu64
                 " contexts stored, %" PRIu64 " skipped, %.0f tokens/s, ETA %s\n",
            s->docs, s->docs_total, frac * 100, s->windows_stored, s->windows_present, rate, e);
  }
  fflush(stderr);
}

static int parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out)
{
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    fprintf(stderr, PROG ": %s '%s': expected a whole number from %lld to %lld\n", opt, v, lo, hi);
    return -1;
  }
  *out = x;
  return 0;
}

static void print_text(const ingest_opts *o, const ingest_stats *s, const char *err)
{
  char a[32], b[32];
  double rate = s->seconds > 0 ? (double)s->tokens_computed / s->seconds : 0;
  printf(PROG ": %s%" PRIu64 " of %" PRIu64 " documents (%" PRIu64 " empty) from %" PRIu64
              " file%s in %.2f s, %d job%s\n",
         err != NULL ? "STOPPED after " : "", s->docs, s->docs_total, s->docs_empty, s->files,
         s->files == 1 ? "" : "s", s->seconds, s->jobs, s->jobs == 1 ? "" : "s");
  if (s->model_id[0] != '\0')
    printf("  model     %s (%s, %u-token blocks)\n", s->model_id, s->storage, o->block_tokens);
  printf("  contexts  %" PRIu64 ": %" PRIu64 " stored now, %" PRIu64 " already stored (skipped)\n",
         s->windows, s->windows_stored, s->windows_present);
  printf("  tokens    %" PRIu64 " in contexts: %" PRIu64 " computed, %" PRIu64
         " restored from stored prefixes; %.0f tokens/s computed\n",
         s->tokens, s->tokens_computed, s->tokens_restored, rate);
  if (s->windows_stored > 0)
    printf("  puts      %.2f s in all (%.2f ms each, %s)\n", s->put_seconds,
           s->put_seconds * 1e3 / (double)s->windows_stored,
           o->sync_mode == KVDB_SYNC_FULL ? "durable" : "not synced");
  printf("  KV bytes  %s stored now (raw), %s written to segments (%" PRIu64
         " blocks written, %" PRIu64 " shared)\n",
         fmt_size(s->kv_bytes, a, sizeof a), fmt_size(s->bytes_written, b, sizeof b),
         s->blocks_written, s->blocks_shared);
  if (s->quality_windows > 0)
    printf("  quality   %" PRIu64 " contexts, %d steps each from stored KV vs float32: token "
           "agreement %.4f, mean KL %.3g nats (max %.3g); reported to kvdb\n",
           s->quality_windows, o->quality_steps, s->quality_agreement / (double)s->quality_windows,
           s->quality_kl / (double)s->quality_windows, s->quality_max_kl);
  if (s->files_ignored > 0)
    printf("  ignored   %" PRIu64 " files with other endings\n", s->files_ignored);
}

static void print_json(const ingest_opts *o, const ingest_stats *s, const char *err)
{
  jw w;
  jw_init(&w, stdout);
  jw_obj(&w, NULL);
  jw_bool(&w, "ok", err == NULL);
  if (err != NULL)
    jw_str(&w, "error", err);
  jw_u64(&w, "files", s->files);
  jw_u64(&w, "files_ignored", s->files_ignored);
  jw_u64(&w, "documents", s->docs);
  jw_u64(&w, "documents_total", s->docs_total);
  jw_u64(&w, "documents_empty", s->docs_empty);
  jw_u64(&w, "contexts", s->windows);
  jw_u64(&w, "contexts_stored", s->windows_stored);
  jw_u64(&w, "contexts_present", s->windows_present);
  jw_u64(&w, "tokens", s->tokens);
  jw_u64(&w, "tokens_computed", s->tokens_computed);
  jw_u64(&w, "tokens_restored", s->tokens_restored);
  jw_u64(&w, "kv_bytes", s->kv_bytes);
  jw_u64(&w, "bytes_written", s->bytes_written);
  jw_u64(&w, "blocks_written", s->blocks_written);
  jw_u64(&w, "blocks_shared", s->blocks_shared);
  jw_num(&w, "seconds", s->seconds);
  jw_num(&w, "put_seconds", s->put_seconds);
  jw_num(&w, "tokens_per_s", s->seconds > 0 ? (double)s->tokens_computed / s->seconds : 0);
  jw_u64(&w, "jobs", (uint64_t)s->jobs);
  jw_str(&w, "model_id", s->model_id);
  jw_str(&w, "storage", s->storage);
  jw_str(&w, "config", o->config != NULL ? o->config : "raw");
  jw_bool(&w, "profile", o->profile);
  jw_u64(&w, "quality_steps", (uint64_t)o->quality_steps);
  jw_u64(&w, "quality_contexts", s->quality_windows);
  if (s->quality_windows > 0) {
    jw_num(&w, "quality_agreement", s->quality_agreement / (double)s->quality_windows);
    jw_num(&w, "quality_mean_kl", s->quality_kl / (double)s->quality_windows);
    jw_num(&w, "quality_max_kl", s->quality_max_kl);
  }
  jw_u64(&w, "block_tokens", o->block_tokens);
  jw_u64(&w, "window", (uint64_t)s->window);
  jw_u64(&w, "stride", (uint64_t)s->stride);
  jw_end(&w);
}

int main(int argc, char **argv)
{
  enum {
    O_MODEL = 256,
    O_TOK,
    O_FIELD,
    O_WINDOW,
    O_STRIDE,
    O_STORAGE,
    O_MAXDOCS,
    O_JOBS,
    O_ID,
    O_BT,
    O_SYNC,
    O_INTERVAL,
    O_JSON,
    O_CONFIG,
    O_PROFILE,
    O_NO_PROFILE,
    O_QSTEPS
  };
  static const struct option opts[] = {
      {"model", required_argument, NULL, O_MODEL},
      {"tokenizer", required_argument, NULL, O_TOK},
      {"text-field", required_argument, NULL, O_FIELD},
      {"window", required_argument, NULL, O_WINDOW},
      {"stride", required_argument, NULL, O_STRIDE},
      {"storage", required_argument, NULL, O_STORAGE},
      {"max-docs", required_argument, NULL, O_MAXDOCS},
      {"jobs", required_argument, NULL, O_JOBS},
      {"model-id", required_argument, NULL, O_ID},
      {"block-tokens", required_argument, NULL, O_BT},
      {"sync", required_argument, NULL, O_SYNC},
      {"progress-interval", required_argument, NULL, O_INTERVAL},
      {"json", no_argument, NULL, O_JSON},
      {"config", required_argument, NULL, O_CONFIG},
      {"profile", no_argument, NULL, O_PROFILE},
      {"no-profile", no_argument, NULL, O_NO_PROFILE},
      {"quality-steps", required_argument, NULL, O_QSTEPS},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  ingest_opts o;
  ingest_opts_init(&o);
  cli c = {0};
  c.interval = 10;
  long long v;
  int ch;
  opterr = 0;
  while ((ch = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
    switch (ch) {
    case O_MODEL:
      o.model_path = optarg;
      break;
    case O_TOK:
      o.tokenizer_path = optarg;
      break;
    case O_FIELD:
      if (optarg[0] == '\0') {
        fprintf(stderr, PROG ": --text-field must not be empty\n");
        return 2;
      }
      o.text_field = optarg;
      break;
    case O_WINDOW:
      if (parse_int("--window", optarg, 2, 1 << 20, &v) != 0)
        return 2;
      o.window = (int)v;
      break;
    case O_STRIDE:
      if (parse_int("--stride", optarg, 1, 1 << 20, &v) != 0)
        return 2;
      o.stride = (int)v;
      break;
    case O_STORAGE:
      if (refkv_storage_parse(optarg, &o.storage) != KVDB_OK) {
        fprintf(stderr, PROG ": --storage: %s\n", refkv_errmsg());
        return 2;
      }
      break;
    case O_MAXDOCS:
      if (parse_int("--max-docs", optarg, 1, INT64_MAX, &v) != 0)
        return 2;
      o.max_docs = (uint64_t)v;
      break;
    case O_JOBS:
      if (parse_int("--jobs", optarg, 1, 256, &v) != 0)
        return 2;
      o.jobs = (int)v;
      break;
    case O_ID:
      if (strlen(optarg) < 1 || strlen(optarg) > 63) {
        fprintf(stderr, PROG ": --model-id '%s': must be 1..63 bytes\n", optarg);
        return 2;
      }
      o.model_id = optarg;
      break;
    case O_BT:
      if (parse_int("--block-tokens", optarg, 16, 4096, &v) != 0)
        return 2;
      if ((v & (v - 1)) != 0) {
        fprintf(stderr, PROG ": --block-tokens %lld: must be a power of two\n", v);
        return 2;
      }
      o.block_tokens = (uint32_t)v;
      break;
    case O_SYNC:
      if (strcmp(optarg, "full") == 0) {
        o.sync_mode = KVDB_SYNC_FULL;
      } else if (strcmp(optarg, "none") == 0) {
        o.sync_mode = KVDB_SYNC_NONE;
      } else {
        fprintf(stderr, PROG ": --sync '%s': expected full or none\n", optarg);
        return 2;
      }
      break;
    case O_INTERVAL: {
      char *end;
      double d = strtod(optarg, &end);
      if (end == optarg || *end != '\0' || !(d >= 0.1 && d <= 86400)) {
        fprintf(stderr, PROG ": --progress-interval '%s': expected seconds from 0.1 to 86400\n",
                optarg);
        return 2;
      }
      c.interval = d;
      break;
    }
    case O_JSON:
      c.json = 1;
      break;
    case O_CONFIG:
      o.config = optarg;
      break;
    case O_PROFILE: /* the default; accepted for scripts that say it */
      o.profile = 1;
      break;
    case O_NO_PROFILE:
      o.profile = 0;
      break;
    case O_QSTEPS:
      if (parse_int("--quality-steps", optarg, 0, 4096, &v) != 0)
        return 2;
      o.quality_steps = (int)v;
      break;
    case 'q':
      c.quiet = 1;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      if (optopt != 0 && optopt < 256)
        fprintf(stderr, PROG ": unknown option '-%c'\n", optopt);
      else
        fprintf(stderr, PROG ": unknown option or missing value: '%s'\n", argv[optind - 1]);
      usage(stderr);
      return 2;
    }
  }
  if (argc - optind < 2) {
    fprintf(stderr, PROG ": %s\n",
            argc - optind < 1 ? "no database directory and no input"
                              : "no input (files or folders)");
    usage(stderr);
    return 2;
  }
  if (o.model_path != NULL && o.tokenizer_path == NULL) {
    fprintf(stderr, PROG ": --model needs --tokenizer too\n");
    return 2;
  }
  o.db_dir = argv[optind];
  o.inputs = (const char *const *)(argv + optind + 1);
  o.n_inputs = (size_t)(argc - optind - 1);

  char model[4200], tok[4200], looked[8192] = "";
  if (o.model_path == NULL && o.tokenizer_path == NULL &&
      shared_find_model(model, tok, sizeof model, looked, sizeof looked) == 0) {
    o.model_path = model;
    o.tokenizer_path = tok;
  }
  c.tty = isatty(STDERR_FILENO);
  o.progress = on_progress;
  o.progress_ctx = &c;
  o.progress_interval_s = c.tty ? 0.1 : c.interval;

  ingest_stats s;
  char err[2048] = "";
  int rc = ingest_run(&o, &s, err, sizeof err);
  if (rc != 0 && c.bar_shown)
    fputc('\n', stderr);
  if (rc != 0) {
    if (o.model_path == NULL && strstr(err, "need a model") != NULL)
      fprintf(stderr, PROG ": %s; the default stories260K was not found (looked for %s)\n", err,
              looked);
    else
      fprintf(stderr, PROG ": %s\n", err);
  }
  if (c.json)
    print_json(&o, &s, rc != 0 ? err : NULL);
  else if (s.docs > 0 || rc == 0)
    print_text(&o, &s, rc != 0 ? err : NULL);
  return rc == 0 ? 0 : 1;
}
