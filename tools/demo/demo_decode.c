/* SPDX-License-Identifier: MIT */
/*
 * tools/demo/demo_decode.c — `kvdb-demo decode DIR`: stories260K continues a TinyStories prompt
 * twice, side by side: with dense attention over its whole KV cache, and with sparse attention
 * over KV kept in the kvdb database at DIR, where every layer and KV head attends only to a
 * budget of positions (the recent window plus the top-scoring rest by the store's int8/int4
 * copies), fetched from the store at every step (tools/refkv/refdecode.h). Prints both texts,
 * the greedy agreement (teacher-forced: per step, for the same history; free-running: the two
 * generations token by token, and where they part) and the bytes kvdb read, against reading the
 * whole context's K and V every step.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvdb.h"
#include "refdecode.h"
#include "refkv.h"
#include "refmodel.h"
#include "shared_paths.h"

static void usage(FILE *f)
{
  fprintf(f,
          "usage: kvdb-demo decode DIR [--budget F] [--window N] [--sinks N] [--score-bits 8|4]\n"
          "                 [--prompt I] [--prompt-tokens N] [--steps N] [--model-dir D] "
          "[--corpus F]\n"
          "                 [--no-session]\n"
          "  DIR             the database (created if absent); the prompt's KV is stored there\n"
          "  --budget F      share of the context each layer and KV head attends to, recent\n"
          "                  window included (default 0.2)\n"
          "  --window N      recent positions always attended (default 16)\n"
          "  --sinks N       first positions always attended (default 0)\n"
          "  --score-bits B  the store's score copies, 8 or 4 (default 8)\n"
          "  --prompt I      which TinyStories prompt (default 0); --prompt-tokens N (320)\n"
          "  --steps N       tokens generated (default 128; prompt + steps <= 512)\n"
          "  --model-dir D   the folder holding stories260K/ (default: ../shared's)\n"
          "  --corpus F      the TinyStories text (default: ../shared's)\n"
          "  --no-session    select and fetch with kvdb_score_batch and kvdb_get_head_tokens on\n"
          "                  the context re-put per completed block, instead of a kvdb decode\n"
          "                  session (kvdb_decode_select / fetch / append)\n");
}

static int fail(const char *what, const char *msg)
{
  fprintf(stderr, "kvdb-demo decode: %s: %s\n", what, msg);
  return 1;
}

static void print_text(const refmodel_tokenizer *tk, int prev, const int *t, size_t n)
{
  char buf[8192];
  size_t len = 0;
  if (refmodel_detokenize(tk, prev, t, n, buf, sizeof buf, &len) != REFMODEL_OK &&
      len > sizeof buf)
    len = sizeof buf;
  for (size_t i = 0; i < len; i++)
    putchar(buf[i] == '\n' ? ' ' : buf[i]);
  putchar('\n');
}

int demo_decode(int argc, char **argv);

int demo_decode(int argc, char **argv)
{
  static const struct option lopts[] = {
    {"budget", required_argument, NULL, 'b'},   {"window", required_argument, NULL, 'w'},
    {"sinks", required_argument, NULL, 's'},    {"score-bits", required_argument, NULL, 'q'},
    {"prompt", required_argument, NULL, 'p'},   {"prompt-tokens", required_argument, NULL, 'n'},
    {"steps", required_argument, NULL, 'g'},    {"model-dir", required_argument, NULL, 'm'},
    {"corpus", required_argument, NULL, 'c'},   {"help", no_argument, NULL, 'h'},
    {"no-session", no_argument, NULL, 'S'},
    {NULL, 0, NULL, 0}};
  refdecode_opts o;
  refdecode_opts_init(&o);
  o.session = 1;
  int bits = 8, which = 0, plen = 320, steps = 128;
  const char *model_dir = NULL, *corpus_opt = NULL;
  optind = 2;
  for (int c; (c = getopt_long(argc, argv, "h", lopts, NULL)) != -1;) {
    char *end = NULL;
    long v = 0;
    double f = 0;
    if (c == 'b')
      f = strtod(optarg, &end);
    else if (c != 'm' && c != 'c' && c != 'h' && c != 'S')
      v = strtol(optarg, &end, 10);
    if (end != NULL && (*end != '\0' || end == optarg)) {
      fprintf(stderr, "kvdb-demo decode: --%s '%s' is not a number\n",
              c == 'b' ? "budget" : "option", optarg);
      return 2;
    }
    switch (c) {
    case 'b': o.budget = f; break;
    case 'w': o.window = (uint32_t)v; break;
    case 's': o.sinks = (uint32_t)v; break;
    case 'q': bits = (int)v; break;
    case 'p': which = (int)v; break;
    case 'n': plen = (int)v; break;
    case 'g': steps = (int)v; break;
    case 'm': model_dir = optarg; break;
    case 'c': corpus_opt = optarg; break;
    case 'S': o.session = 0; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return 2;
  }
  const char *dir = argv[optind];
  if ((bits != 8 && bits != 4) || which < 0 || which > 100 || plen < 2 || steps < 1 ||
      plen + steps > 512 || !(o.budget > 0 && o.budget <= 1) || o.window < 1) {
    fprintf(stderr, "kvdb-demo decode: --score-bits must be 8 or 4, --budget in (0, 1], "
                    "--window >= 1, --prompt 0..100, prompt tokens + steps <= 512\n");
    return 2;
  }
  char model[4200], tok[4200], corpus[4200], looked[8000];
  if (model_dir != NULL) {
    snprintf(model, sizeof model, "%.4000s/stories260K/stories260K.bin", model_dir);
    snprintf(tok, sizeof tok, "%.4000s/stories260K/tok512.bin", model_dir);
  } else if (shared_find_model(model, tok, sizeof model, looked, sizeof looked) != 0) {
    return fail("the stories260K model was not found; looked for", looked);
  }
  if (corpus_opt != NULL)
    snprintf(corpus, sizeof corpus, "%s", corpus_opt);
  else if (shared_find_corpus(corpus, sizeof corpus, looked, sizeof looked) != 0)
    return fail("the TinyStories corpus was not found; looked for", looked);

  refmodel_model *rm = NULL;
  refmodel_tokenizer *tk = NULL;
  refmodel_state *a = NULL, *b = NULL;
  kvdb *db = NULL;
  refdecode *d = NULL;
  char *text = NULL;
  int *prompts = NULL, *dense = NULL, *sparse = NULL, rc = 1;
  if (refmodel_model_load(model, &rm) != REFMODEL_OK ||
      refmodel_tokenizer_load(tok, 512, &tk) != REFMODEL_OK ||
      refmodel_state_new(rm, 0, &a) != REFMODEL_OK ||
      refmodel_state_new(rm, 0, &b) != REFMODEL_OK) {
    fail("model", refmodel_errmsg());
    goto done;
  }
  FILE *f = fopen(corpus, "rb");
  if (f == NULL) {
    fail(corpus, "cannot open");
    goto done;
  }
  size_t cap = 1u << 20, len;
  text = malloc(cap + 1);
  len = text != NULL ? fread(text, 1, cap, f) : 0;
  fclose(f);
  int n_prompts = which + 1, got = 0;
  prompts = malloc((size_t)n_prompts * (size_t)plen * sizeof(int));
  dense = malloc((size_t)steps * sizeof(int));
  sparse = malloc((size_t)steps * sizeof(int));
  if (text == NULL || prompts == NULL || dense == NULL || sparse == NULL) {
    fail("memory", "out of memory");
    goto done;
  }
  if (refdecode_prompts(tk, text, len, n_prompts, plen, prompts, &got) != KVDB_OK ||
      got < n_prompts) {
    fail("prompts", got < n_prompts ? "the corpus is too short for that prompt" : refkv_errmsg());
    goto done;
  }
  const int *prompt = prompts + (size_t)which * (size_t)plen;

  kvdb_options ko;
  kvdb_options_init(&ko);
  ko.dram_bytes = 0; /* every byte of a step is read from the segment files, and counted */
  ko.use_direct_io = 0;
  kvdb_status s = kvdb_open(dir, &ko, &db);
  if (s != KVDB_OK) {
    fail(dir, kvdb_errmsg());
    goto done;
  }
  refkv_model m, fr;
  char id[64];
  snprintf(id, sizeof id, "stories260K-decode-s%d", bits);
  if (refkv_model_init(&m, rm, id, NULL, REFKV_STORE_F32, 16) != KVDB_OK) {
    fail("model", refkv_errmsg());
    goto done;
  }
  m.km.score_bits = (uint32_t)bits;
  /* The free-running side's KV is its own (computed sparsely): a model id of its own, per run
   * settings, so that its blocks never stand for the dense KV of the same tokens. */
  snprintf(id, sizeof id, "decode-free-s%d-b%.3f-w%u-k%u-%s", bits, o.budget, o.window, o.sinks,
           o.session ? "session" : "api");
  if (refkv_model_init(&fr, rm, id, NULL, REFKV_STORE_F32, 16) != KVDB_OK) {
    fail("model", refkv_errmsg());
    goto done;
  }
  fr.km.score_bits = (uint32_t)bits;

  /* Dense. */
  int n_dense = 0, vocab = refmodel_model_config(rm)->vocab_size;
  if (refmodel_prefill(a, prompt, plen - 1, 0, NULL) != REFMODEL_OK ||
      refmodel_generate(a, prompt[plen - 1], plen - 1, steps, -1, dense, &n_dense) !=
          REFMODEL_OK) {
    fail("dense", refmodel_errmsg());
    goto done;
  }
  /* Sparse, free-running, reading from kvdb. */
  kvdb_stats s0, s1;
  if (refmodel_prefill(b, prompt, plen - 1, 0, NULL) != REFMODEL_OK) {
    fail("sparse", refmodel_errmsg());
    goto done;
  }
  if ((s = refdecode_open(db, &fr, b, &o, &d)) != KVDB_OK ||
      (s = refdecode_begin(d, prompt, (size_t)plen - 1)) != KVDB_OK ||
      (s = kvdb_stat(db, &s0)) != KVDB_OK) {
    fail("sparse", s == KVDB_OK ? kvdb_errmsg() : refkv_errmsg());
    goto done;
  }
  int t = prompt[plen - 1];
  for (int i = 0; i < steps; i++) {
    const float *lg;
    if ((s = refdecode_step(d, t, &lg)) != KVDB_OK || (s = refdecode_append(d, t)) != KVDB_OK) {
      fail("sparse step", refkv_errmsg());
      goto done;
    }
    sparse[i] = t = refmodel_argmax(lg, vocab);
  }
  if (kvdb_stat(db, &s1) != KVDB_OK) {
    fail("kvdb_stat", kvdb_errmsg());
    goto done;
  }
  const refdecode_stats *st = refdecode_get_stats(d);
  int same = 0, first = steps;
  for (int i = 0; i < steps; i++) {
    same += sparse[i] == dense[i];
    if (sparse[i] != dense[i] && first == steps)
      first = i;
  }
  /* Teacher-forced agreement (the headline of kvdb-bench decode). */
  refdecode_agree ag;
  if ((s = refdecode_agreement(db, &m, NULL, &o, a, NULL, prompt, (size_t)plen, steps, &ag)) !=
      KVDB_OK) {
    fail("agreement", refkv_errmsg());
    goto done;
  }

  printf("kvdb-demo decode: stories260K, TinyStories prompt %d (%d tokens), %d greedy tokens\n"
         "sparse: budget %.0f%% of the context per layer and KV head (window %u, sinks %u), "
         "top-k by the store's int%d copies, K and V fetched from kvdb at every step (%s)\n\n",
         which, plen, steps, o.budget * 100, o.window, o.sinks, bits,
         o.session ? "a kvdb decode session: select, fetch, append"
                   : "kvdb_score_batch, kvdb_get_head_tokens, a put per completed block");
  printf("prompt (end): ...");
  print_text(tk, prompt[plen - 41], prompt + plen - 40, 40);
  printf("\ndense:  ");
  print_text(tk, prompt[plen - 1], dense, (size_t)steps);
  printf("\nsparse: ");
  print_text(tk, prompt[plen - 1], sparse, (size_t)steps);
  double dense_bytes = (double)st->context * 2.0 * (double)m.km.head_dim * sizeof(float);
  printf("\nagreement: teacher-forced %d/%d = %.3f (mean KL %.4f nats); free-running %d/%d "
         "tokens equal, first difference at step %d%s\n",
         ag.tf_agree, ag.steps, (double)ag.tf_agree / ag.steps, ag.tf_mean_kl, same, steps,
         first, first == steps ? " (none)" : "");
  printf("attended: %.1f%% of the context's rows (%llu read from the store, %llu from DRAM: %s)\n",
         100.0 * (double)st->attended / (double)st->context,
         (unsigned long long)st->rows_store, (unsigned long long)st->rows_dram,
         o.session ? "the session's hot pool and recent window" : "not yet stored");
  printf("bytes read from kvdb over the %d sparse steps: %llu (score copies %llu, rows %llu; "
         "kvdb_stat bytes_read %llu); dense attention reads the whole context's K and V: %.0f "
         "bytes (x%.2f)\n",
         steps, (unsigned long long)(st->score_bytes + st->fetch_bytes),
         (unsigned long long)st->score_bytes, (unsigned long long)st->fetch_bytes,
         (unsigned long long)(s1.bytes_read - s0.bytes_read), dense_bytes,
         dense_bytes > 0 ? (double)(s1.bytes_read - s0.bytes_read) / dense_bytes : 0);
  printf("(stories260K's rows are 64 bytes per KV head, so a step's reads are whole 4 KiB "
         "pages of copies and rows: a read amplification a model with 128-wide heads and long "
         "contexts does not have)\n");
  rc = 0;
done:
  refdecode_close(d);
  if (db != NULL)
    kvdb_close(db);
  refmodel_state_free(a);
  refmodel_state_free(b);
  refmodel_tokenizer_free(tk);
  refmodel_model_free(rm);
  free(text);
  free(prompts);
  free(dense);
  free(sparse);
  return rc;
}
