/* SPDX-License-Identifier: MIT */
/*
 * tools/demo/demo_prefix.c — `kvdb-demo prefix DIR`: the main job's second half. A fresh process
 * takes prompts that extend documents kvdb-ingest stored in DIR, continues each from the stored
 * KV (lookup, get into the model's cache, prefill only the rest) and from scratch, and prints
 * the hit, the time to first token both ways and the continuation, which must be identical when
 * the stored KV is lossless (f32 with a raw or lossless config). With lossy storage (f16, bf16,
 * or a quantizing or token-dropping config) it prints the real-model quality instead:
 * greedy-token agreement and next-token KL divergence against the float32 recompute.
 *
 * The documents are found the way kvdb-ingest found them (docs.h, same --max-docs), so the
 * demo knows which ones were ingested. The prompts: the longest ingested documents, each followed
 * by a newline and the first words of the paragraph after it; and one document that was not
 * ingested (only what it shares with stored ones, e.g. a common opening, can hit).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "docs.h"
#include "kvdb.h"
#include "refkv.h"
#include "refmodel.h"
#include "shared_paths.h"

#define PREFIX_EXTRA_DOCS 50 /* documents after the ingested ones, for the not-ingested prompt */
#define EXT_WORDS 8          /* words of the next paragraph appended to a prompt */

typedef struct cand {
  size_t doc;    /* index into texts */
  size_t tokens; /* prompt tokens */
} cand;

static int die(const char *what, const char *msg)
{
  fprintf(stderr, "kvdb-demo prefix: %s: %s\n", what, msg);
  return 1;
}

/* The prompt of document i: its text, "\n" and the first EXT_WORDS words of document i + 1. */
static char *prompt_text(char **texts, size_t n_texts, size_t i, size_t *len)
{
  const char *next = i + 1 < n_texts ? texts[i + 1] : "";
  size_t words = 0, e = 0;
  while (next[e] != '\0' && words < EXT_WORDS) {
    while (next[e] == ' ')
      e++;
    while (next[e] != '\0' && next[e] != ' ' && next[e] != '\n')
      e++;
    words++;
    if (next[e] == '\n')
      break;
  }
  size_t a = strlen(texts[i]);
  char *p = malloc(a + 1 + e + 1);
  if (p == NULL)
    return NULL;
  memcpy(p, texts[i], a);
  p[a] = '\n';
  memcpy(p + a + 1, next, e);
  p[a + 1 + e] = '\0';
  *len = a + 1 + e;
  return p;
}

static int encode(const refmodel_tokenizer *tok, const char *text, size_t len, int **out, size_t *n)
{
  size_t cap = refmodel_encode_bound(len);
  *out = malloc(cap * sizeof **out);
  if (*out == NULL)
    return -1;
  return refmodel_encode(tok, text, len, REFMODEL_ENCODE_BOS, *out, cap, n) == REFMODEL_OK ? 0 : -1;
}

/* The last `max` bytes of s on one line, for display ("…" + tail, newlines as '/'). */
static void show_tail(const char *s, size_t len, size_t max)
{
  size_t a = len > max ? len - max : 0;
  while (a > 0 && a < len && ((unsigned char)s[a] & 0xc0) == 0x80)
    a++;
  printf("    \"%s", a > 0 ? "..." : "");
  for (size_t i = a; i < len; i++)
    putchar(s[i] == '\n' ? '/' : s[i]);
  printf("\"\n");
}

static void show_tokens(const refmodel_tokenizer *tok, int prev, const int *t, size_t n)
{
  char buf[4096];
  size_t len = 0;
  refmodel_detokenize(tok, prev, t, n, buf, sizeof buf - 1, &len);
  if (len > sizeof buf - 1)
    len = sizeof buf - 1;
  printf("    \"");
  for (size_t i = 0; i < len; i++)
    putchar(buf[i] == '\n' ? '/' : buf[i]);
  printf("\"\n");
}

static int cmp_cand(const void *a, const void *b)
{
  const cand *x = a, *y = b;
  if (x->tokens != y->tokens)
    return x->tokens < y->tokens ? 1 : -1;
  return x->doc < y->doc ? -1 : x->doc > y->doc;
}

static void usage(FILE *f)
{
  fprintf(f, "usage: kvdb-demo prefix DIR [--model FILE --tokenizer FILE] [--corpus FILE]\n"
             "                  [--max-docs N] [--storage f32|f16|bf16] [--config NAME]\n"
             "                  [--block-tokens N] [--prompts N] [--new-tokens N]\n"
             "Options must match the kvdb-ingest run that filled DIR (same model, corpus,\n"
             "--max-docs, --storage, --config, --block-tokens; the defaults are the same).\n");
}

int demo_prefix(int argc, char **argv);

int demo_prefix(int argc, char **argv)
{
  enum { O_MODEL = 256, O_TOK, O_CORPUS, O_CONFIG, O_MAX, O_STORAGE, O_BT, O_PROMPTS, O_NEW };
  static const struct option opts[] = {
      {"model", required_argument, NULL, O_MODEL},
      {"tokenizer", required_argument, NULL, O_TOK},
      {"corpus", required_argument, NULL, O_CORPUS},
      {"max-docs", required_argument, NULL, O_MAX},
      {"storage", required_argument, NULL, O_STORAGE},
      {"block-tokens", required_argument, NULL, O_BT},
      {"prompts", required_argument, NULL, O_PROMPTS},
      {"new-tokens", required_argument, NULL, O_NEW},
      {"config", required_argument, NULL, O_CONFIG},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *model_path = NULL, *tok_path = NULL, *corpus_path = NULL, *config = "raw";
  long max_docs = 400, n_prompts = 4, new_tokens = 32, block_tokens = 16;
  refkv_storage storage = REFKV_STORE_F32;
  int ch;
  opterr = 0;
  optind = 2; /* argv[1] is "prefix" */
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    char *end = NULL;
    long v = 0;
    if (ch >= O_MAX && ch != O_STORAGE && optarg != NULL) {
      v = strtol(optarg, &end, 10);
      if (end == optarg || *end != '\0' || v < 1 || v > 1000000) {
        fprintf(stderr, "kvdb-demo prefix: '%s' is not a positive number\n", optarg);
        return 2;
      }
    }
    switch (ch) {
    case O_MODEL:
      model_path = optarg;
      break;
    case O_TOK:
      tok_path = optarg;
      break;
    case O_CORPUS:
      corpus_path = optarg;
      break;
    case O_CONFIG:
      config = optarg;
      break;
    case O_MAX:
      max_docs = v;
      break;
    case O_STORAGE:
      if (refkv_storage_parse(optarg, &storage) != KVDB_OK)
        return fprintf(stderr, "kvdb-demo prefix: --storage: %s\n", refkv_errmsg()), 2;
      break;
    case O_BT:
      block_tokens = v;
      break;
    case O_PROMPTS:
      n_prompts = v > 16 ? 16 : v;
      break;
    case O_NEW:
      if (v > 256) {
        fprintf(stderr, "kvdb-demo prefix: --new-tokens %ld: at most 256\n", v);
        return 2;
      }
      new_tokens = v;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      fprintf(stderr, "kvdb-demo prefix: unknown option or missing value '%s'\n", argv[optind - 1]);
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return 2;
  }
  const char *dir = argv[optind];
  char mbuf[4200], tbuf[4200], cbuf[4200], looked[8192];
  if (model_path == NULL || tok_path == NULL) {
    if (model_path != NULL || tok_path != NULL)
      return die("options", "--model and --tokenizer go together");
    if (shared_find_model(mbuf, tbuf, sizeof mbuf, looked, sizeof looked) != 0) {
      fprintf(stderr, "kvdb-demo prefix: stories260K not found; looked for %s\n", looked);
      return 77;
    }
    model_path = mbuf;
    tok_path = tbuf;
  }
  if (corpus_path == NULL) {
    if (shared_find_corpus(cbuf, sizeof cbuf, looked, sizeof looked) != 0) {
      fprintf(stderr, "kvdb-demo prefix: TinyStories not found; looked for %s\n", looked);
      return 77;
    }
    corpus_path = cbuf;
  }

  int ret = 1;
  refmodel_model *rm = NULL;
  refmodel_tokenizer *tok = NULL;
  refmodel_state *st = NULL, *st2 = NULL;
  kvdb *db = NULL;
  char **texts = NULL;
  size_t n_texts = 0;
  cand *cands = NULL;
  src_list list = {0};
  int rc;
  if ((rc = refmodel_model_load(model_path, &rm)) != REFMODEL_OK ||
      (rc = refmodel_tokenizer_load(tok_path, refmodel_model_config(rm)->vocab_size, &tok)) !=
          REFMODEL_OK) {
    die("loading the model", refmodel_errmsg());
    goto out;
  }
  const refmodel_config *cfg = refmodel_model_config(rm);
  refkv_model km;
  if (refkv_model_init(&km, rm, NULL, model_path, storage, (uint32_t)block_tokens) != KVDB_OK ||
      refkv_model_set_config(&km, config) != KVDB_OK) {
    die("model", refkv_errmsg());
    goto out;
  }

  /* The documents as kvdb-ingest saw them, and PREFIX_EXTRA_DOCS more. */
  char err[1024];
  const char *inputs[1] = {corpus_path};
  if (src_list_build(inputs, 1, &list, err, sizeof err) != 0) {
    die("corpus", err);
    goto out;
  }
  doc_reader rd;
  doc_reader_open(&rd, &list, NULL, (uint64_t)max_docs + PREFIX_EXTRA_DOCS + 1);
  texts = calloc((size_t)max_docs + PREFIX_EXTRA_DOCS + 1, sizeof *texts);
  if (texts == NULL) {
    doc_reader_close(&rd);
    die("corpus", "out of memory");
    goto out;
  }
  doc d;
  while ((rc = doc_reader_next(&rd, &d, err, sizeof err)) == 1)
    texts[n_texts++] = d.text;
  doc_reader_close(&rd);
  if (rc < 0) {
    die("corpus", err);
    goto out;
  }
  if (n_texts < 3) {
    die("corpus", "fewer than 3 documents");
    goto out;
  }

  /* Candidates: prompts that fit the model's context with the new tokens. */
  size_t n_ingested = n_texts < (size_t)max_docs ? n_texts : (size_t)max_docs;
  cands = calloc(n_texts, sizeof *cands);
  size_t n_in = 0, n_out = 0;
  cand best_out = {0, 0};
  for (size_t i = 0; cands != NULL && i + 1 < n_texts; i++) {
    size_t len, n = 0;
    int *t = NULL;
    char *p = prompt_text(texts, n_texts, i, &len);
    int ok = p != NULL && encode(tok, p, len, &t, &n) == 0;
    free(p);
    free(t);
    if (!ok || n + (size_t)new_tokens > (size_t)cfg->seq_len)
      continue;
    if (i < n_ingested)
      cands[n_in++] = (cand){i, n};
    else if (n > best_out.tokens)
      best_out = (cand){i, n}, n_out = 1;
  }
  if (n_in == 0) {
    die("corpus", "no ingested document fits the model's context with the new tokens");
    goto out;
  }
  qsort(cands, n_in, sizeof *cands, cmp_cand);
  size_t n_show = (size_t)n_prompts - (n_out ? 1 : 0);
  if (n_show < 1)
    n_show = 1;
  if (n_show > n_in)
    n_show = n_in;
  if (n_out)
    cands[n_show++] = best_out;

  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0; /* every get reads the segment files: the cross-session path */
  o.flags &= ~(uint32_t)KVDB_O_CREATE; /* a database kvdb-ingest filled; never a new empty one */
  kvdb_status ks = kvdb_open(dir, &o, &db);
  if (ks != KVDB_OK) {
    die("opening the database", kvdb_errmsg());
    goto out;
  }
  kvdb_stats stats;
  kvdb_stat(db, &stats);
  char desc[96];
  printf("a fresh process (pid %d) opens %s: %" PRIu64 " contexts; model %s (%s KV, %u-token "
         "blocks)\n",
         (int)getpid(), dir, stats.n_contexts, km.id, refkv_model_describe(&km, desc, sizeof desc),
         km.km.block_tokens);
  if (stats.n_contexts == 0)
    printf("  (the database is empty: run kvdb-ingest first; every prompt will miss)\n");

  if (refmodel_state_new(rm, 0, &st) != REFMODEL_OK ||
      refmodel_state_new(rm, 0, &st2) != REFMODEL_OK) {
    die("state", refmodel_errmsg());
    goto out;
  }
  /* Untimed warm-up: the model's weights into the caches, and the handle's first get (kvdb
   * allocates its read buffers there, tens of ms once per handle). */
  {
    int warm[2] = {REFMODEL_TOKEN_BOS, 259};
    int o1[1];
    refkv_continue(db, &km, st, warm, 2, 1, -1, o1, NULL);
  }

  double sum_hit = 0, sum_full = 0;
  int n_identical = 0, n_lossless_bad = 0, n_ingested_hits = 0;
  for (size_t k = 0; k < n_show; k++) {
    size_t i = cands[k].doc, len, n = 0;
    int *prompt = NULL;
    char *text = prompt_text(texts, n_texts, i, &len);
    if (text == NULL || encode(tok, text, len, &prompt, &n) != 0) {
      free(text);
      free(prompt);
      die("prompt", "out of memory");
      goto out;
    }
    int a[256], b[256];
    refkv_run ra, rb;
    if (refkv_continue(db, &km, st, prompt, n, (int)new_tokens, -1, a, &ra) != KVDB_OK ||
        refkv_continue(NULL, &km, st2, prompt, n, (int)new_tokens, -1, b, &rb) != KVDB_OK) {
      free(text);
      free(prompt);
      die("continue", refkv_errmsg());
      goto out;
    }
    int same = ra.n_generated == rb.n_generated && memcmp(a, b, ra.n_generated * sizeof *a) == 0;
    printf("\nprompt %zu: document %zu%s + the first words of the next, %zu tokens\n", k + 1, i + 1,
           i < n_ingested ? " (ingested)" : " (NOT ingested)", n);
    show_tail(text, len, 90);
    printf("  with the cache:    %zu of %zu tokens found stored, KV read in %.2f ms; %zu "
           "prefilled; first token after %.2f ms\n",
           ra.hit_tokens, n, ra.get_s * 1e3, ra.prefill_tokens, ra.ttft_s * 1e3);
    printf("  without the cache: %zu prefilled; first token after %.2f ms  ->  %.1fx faster "
           "with the cache\n",
           rb.prefill_tokens, rb.ttft_s * 1e3, rb.ttft_s / ra.ttft_s);
    printf("  continuation (%zu tokens, %s):\n", ra.n_generated,
           same ? "identical both ways" : "DIFFERENT from the full recompute");
    show_tokens(tok, prompt[n - 1], a, ra.n_generated);
    if (!same) {
      printf("  the full recompute gave:\n");
      show_tokens(tok, prompt[n - 1], b, rb.n_generated);
    }
    if (!refkv_model_lossless(&km)) {
      refkv_quality q;
      if (refkv_quality_measure(db, &km, st2, st, prompt, n, (int)new_tokens, &q) == KVDB_OK)
        printf("  quality of %s KV: %d of %d next tokens agree with float32 (%.4f), mean KL "
               "%.3g nats, max %.3g\n",
               desc, q.agree, q.steps, q.agreement, q.mean_kl, q.max_kl);
    } else if (!same && ra.hit_tokens > 0) {
      n_lossless_bad++;
    }
    n_identical += same;
    if (i < n_ingested && ra.hit_tokens > 1)
      n_ingested_hits++;
    sum_hit += ra.ttft_s;
    sum_full += rb.ttft_s;
    free(text);
    free(prompt);
  }
  printf("\n%zu prompts: mean time to first token %.2f ms with the cache, %.2f ms without "
         "(%.1fx); continuations identical: %d of %zu\n",
         n_show, sum_hit * 1e3 / (double)n_show, sum_full * 1e3 / (double)n_show,
         sum_full / sum_hit, n_identical, n_show);
  if (n_ingested_hits == 0) {
    fprintf(stderr,
            "kvdb-demo prefix: no prompt of an ingested document hit: was %s filled by "
            "kvdb-ingest with the same model, corpus, --max-docs, --storage and "
            "--block-tokens?\n",
            dir);
    goto out;
  }
  if (n_lossless_bad > 0) {
    fprintf(stderr,
            "kvdb-demo prefix: %d continuation(s) from lossless (f32) KV differ from the "
            "full recompute\n",
            n_lossless_bad);
    goto out;
  }
  ret = 0;
out:
  kvdb_close(db);
  refmodel_state_free(st);
  refmodel_state_free(st2);
  refmodel_tokenizer_free(tok);
  refmodel_model_free(rm);
  for (size_t i = 0; i < n_texts; i++)
    free(texts[i]);
  free(texts);
  free(cands);
  src_list_free(&list);
  return ret;
}
