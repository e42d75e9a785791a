/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_decode_model.c — `kvdb-bench decode`'s model part (bench_decode.h): stories260K
 * decodes with sparse attention over its KV kept in kvdb (tools/refkv/refdecode.h: top-k by the
 * store's int8/int4 score copies, a recent window, rows fetched with kvdb_get_head_tokens, the
 * context stored block by block as it grows) and is compared with dense attention.
 *
 * Agreement (the issue does not define it). Headline, teacher-forced: the share of the
 * generated steps whose sparse next-token argmax equals the dense one for the same history (the
 * dense greedy continuation, whose KV is what the store holds); every step is an independent
 * trial of the attention approximation. Beside it, free-running: each side decodes its own
 * argmaxes (the sparse side's KV computed sparsely and stored as it grows): the share of the
 * positions where the two generations hold the same token, and the first step where they
 * differ. One flip of a near-tie makes the two stories part for good, so free-running measures
 * how long a story stays identical rather than how good each step is.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvdb.h"
#include "refdecode.h"
#include "refkv.h"
#include "refmodel.h"
#include "shared_paths.h"

#define PROMPT_LEN 320
#define N_PROMPTS 12
#define STEPS 128

typedef struct design {
  const char *name; /* printed */
  const char *key;  /* JSON field of its 20% teacher-forced agreement */
  int session;      /* 1: a kvdb decode session selects, fetches and appends */
  uint32_t score_bits;
  refdecode_scorer scorer;
  refdecode_combine combine;
  uint32_t window, sinks;
} design;

/* The baseline first: its curve is the headline. */
static const design DESIGNS[] = {
  {"session: int8 copies, group sum, window 16", "agreement_20pct", 1, 8, REFDECODE_SCORE_STORE,
   REFDECODE_SUM, 16, 0},
  {"kvdb_score_batch + kvdb_get_head_tokens (no session; the tokens not yet stored scored "
   "exactly), int8, sum, window 16", "agreement_20pct_score_api", 0, 8, REFDECODE_SCORE_STORE,
   REFDECODE_SUM, 16, 0},
  {"session, int8, sum, window 16, 4 sinks", "agreement_20pct_sinks4", 1, 8,
   REFDECODE_SCORE_STORE, REFDECODE_SUM, 16, 4},
  {"session, int8, sum, window 32", "agreement_20pct_window32", 1, 8, REFDECODE_SCORE_STORE,
   REFDECODE_SUM, 32, 0},
  {"session, int8, sum, window 8", "agreement_20pct_window8", 1, 8, REFDECODE_SCORE_STORE,
   REFDECODE_SUM, 8, 0},
  {"session, int8, group max, window 16", "agreement_20pct_max", 1, 8, REFDECODE_SCORE_STORE,
   REFDECODE_MAX, 16, 0},
  {"session, int4 copies, sum, window 16", "agreement_20pct_int4", 1, 4, REFDECODE_SCORE_STORE,
   REFDECODE_SUM, 16, 0},
  {"session, int8, per query head (a select each), budget filled round-robin, window 16",
   "agreement_20pct_per_head", 1, 8, REFDECODE_SCORE_STORE, REFDECODE_PER_HEAD, 16, 0},
  {"no session, exact float q.K (an upper bound), sum, window 16", "agreement_20pct_exact", 0, 8,
   REFDECODE_SCORE_EXACT, REFDECODE_SUM, 16, 0},
};
#define N_DESIGNS (sizeof DESIGNS / sizeof DESIGNS[0])

static const double BUDGETS[] = {0.05, 0.10, 0.20, 0.30, 0.50, 1.0};
#define N_BUDGETS (sizeof BUDGETS / sizeof BUDGETS[0])

typedef struct totals {
  long steps, tf_agree, fr_agree, first_diff, never_diff;
  double kl;
  refdecode_stats st;
} totals;

typedef struct run_ctx {
  kvdb *db;
  refmodel_model *rm;
  refmodel_state *a, *b;
  const int *prompts;
  int n_prompts, steps;
  refkv_model tf8, tf4; /* teacher-forced models (dense KV), by score bits */
  int fr_seq;           /* free-running model ids made so far */
  const char *model_path;
} run_ctx;

static int run_one(run_ctx *rc, const design *d, double budget, totals *t)
{
  memset(t, 0, sizeof *t);
  refdecode_opts o;
  refdecode_opts_init(&o);
  o.budget = budget;
  o.window = d->window;
  o.sinks = d->sinks;
  o.scorer = d->scorer;
  o.combine = d->combine;
  o.session = d->session;
  const refkv_model *tf = d->score_bits == 4 ? &rc->tf4 : &rc->tf8;
  refkv_model fr;
  char id[64];
  snprintf(id, sizeof id, "stories260K-decode-free-%d", rc->fr_seq++);
  kvdb_status s = refkv_model_init(&fr, rc->rm, id, NULL, REFKV_STORE_F32, 16);
  if (s != KVDB_OK) {
    bench_log("decode: %s", refkv_errmsg());
    return -1;
  }
  fr.km.score_bits = d->score_bits;
  for (int i = 0; i < rc->n_prompts; i++) {
    refdecode_agree ag;
    s = refdecode_agreement(rc->db, tf, &fr, &o, rc->a, rc->b, rc->prompts + i * PROMPT_LEN,
                            PROMPT_LEN, rc->steps, &ag);
    if (s != KVDB_OK) {
      bench_log("decode: prompt %d, %s, budget %.2f: %s: %s", i, d->name, budget,
                kvdb_status_name(s), refkv_errmsg());
      return -1;
    }
    t->steps += ag.steps;
    t->tf_agree += ag.tf_agree;
    t->fr_agree += ag.fr_agree;
    t->first_diff += ag.fr_first_diff;
    t->never_diff += ag.fr_first_diff == ag.steps;
    t->kl += ag.tf_mean_kl * ag.steps;
    t->st.steps += ag.tf.steps;
    t->st.heads += ag.tf.heads;
    t->st.attended += ag.tf.attended;
    t->st.context += ag.tf.context;
    t->st.rows_store += ag.tf.rows_store;
    t->st.rows_dram += ag.tf.rows_dram;
    t->st.score_bytes += ag.tf.score_bytes;
    t->st.fetch_bytes += ag.tf.fetch_bytes;
    t->st.appended += ag.tf.appended;
  }
  return 0;
}

static void print_row(FILE *out, const char *label, const totals *t, int n_prompts,
                      size_t row_bytes)
{
  double dense_bytes = (double)t->st.context * (double)row_bytes;
  fprintf(out, "  %-10s %8.4f %9.4f %8.4f %8.1f %6ld/%-3d %9.3f %9.3f\n", label,
          (double)t->tf_agree / (double)t->steps, t->kl / (double)t->steps,
          (double)t->fr_agree / (double)t->steps,
          (double)t->first_diff / (double)n_prompts, t->never_diff, n_prompts,
          (double)t->st.attended / (double)t->st.context,
          dense_bytes > 0 ? (double)(t->st.score_bytes + t->st.fetch_bytes) / dense_bytes : 0);
}

#define HEADER "  %-10s %8s %9s %8s %8s %10s %9s %9s\n"

static char *read_text(const char *path, size_t max, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  char *b = malloc(max + 1);
  if (b != NULL) {
    *len = fread(b, 1, max, f);
    b[*len] = '\0';
  }
  fclose(f);
  return b;
}

int bench_decode_agreement_run(const char *shared_dir, const char *db_dir, int quick, FILE *out,
                               bench_json *j, double *agreement_20pct)
{
  if (agreement_20pct != NULL)
    *agreement_20pct = NAN;
  char model[4200], tok[4200], corpus[4200], looked[13000] = "";
  int found;
  if (shared_dir != NULL) {
    snprintf(model, sizeof model, "%.4000s/models/stories260K/stories260K.bin", shared_dir);
    snprintf(tok, sizeof tok, "%.4000s/models/stories260K/tok512.bin", shared_dir);
    snprintf(corpus, sizeof corpus,
             "%.4000s/corpora/tinystories/tinystories_validation_head.txt", shared_dir);
    found = bench_file_exists(model) && bench_file_exists(tok) && bench_file_exists(corpus);
    snprintf(looked, sizeof looked, "'%s', '%s', '%s'", model, tok, corpus);
  } else {
    char w1[4000] = "", w2[4000] = "";
    found = shared_find_model(model, tok, sizeof model, w1, sizeof w1) == 0 &&
            shared_find_corpus(corpus, sizeof corpus, w2, sizeof w2) == 0;
    snprintf(looked, sizeof looked, "%s %s", w1, w2);
  }
  if (!found) {
    fprintf(out,
            "decode agreement: SKIPPED: the stories260K model or the TinyStories corpus was not "
            "found (set KVDB_SHARED_DIR). Looked for %s\n",
            looked);
    if (j != NULL)
      bench_json_str(j, "decode_agreement_skipped", looked);
    return 0;
  }
  int rc = 1, n_prompts = quick ? 6 : N_PROMPTS, steps = quick ? 64 : STEPS;
  run_ctx r;
  memset(&r, 0, sizeof r);
  r.model_path = model;
  refmodel_tokenizer *tk = NULL;
  char *text = NULL;
  int *prompts = NULL;
  if (refmodel_model_load(model, &r.rm) != REFMODEL_OK ||
      refmodel_tokenizer_load(tok, 512, &tk) != REFMODEL_OK ||
      refmodel_state_new(r.rm, 0, &r.a) != REFMODEL_OK ||
      refmodel_state_new(r.rm, 0, &r.b) != REFMODEL_OK) {
    bench_log("decode: %s", refmodel_errmsg());
    goto done;
  }
  size_t len = 0;
  text = read_text(corpus, 1u << 20, &len);
  prompts = malloc((size_t)n_prompts * PROMPT_LEN * sizeof(int));
  int got = 0;
  if (text == NULL || prompts == NULL ||
      refdecode_prompts(tk, text, len, n_prompts, PROMPT_LEN, prompts, &got) != KVDB_OK ||
      got < n_prompts) {
    bench_log("decode: cannot make %d prompts of %d tokens from '%s' (%d made)", n_prompts,
              PROMPT_LEN, corpus, got);
    goto done;
  }
  r.prompts = prompts;
  r.n_prompts = n_prompts;
  r.steps = steps;
  if (refkv_model_init(&r.tf8, r.rm, "stories260K-decode-s8", NULL, REFKV_STORE_F32, 16) !=
          KVDB_OK ||
      refkv_model_init(&r.tf4, r.rm, "stories260K-decode-s4", NULL, REFKV_STORE_F32, 16) !=
          KVDB_OK) {
    bench_log("decode: %s", refkv_errmsg());
    goto done;
  }
  r.tf8.km.score_bits = 8;
  r.tf4.km.score_bits = 4;
  char path[4200];
  snprintf(path, sizeof path, "%.4000s/decode-agreement", db_dir);
  kvdb_options opts;
  kvdb_options_init(&opts);
  opts.dram_bytes = 0; /* every read goes to the segment files: the bytes are what a step reads */
  opts.use_direct_io = 0; /* through the page cache: thousands of small reads per step */
  opts.sync_mode = KVDB_SYNC_NONE;
  kvdb_status s = kvdb_open(path, &opts, &r.db);
  if (s != KVDB_OK) {
    bench_log("decode: kvdb_open '%s': %s", path, kvdb_errmsg());
    goto done;
  }
  const refmodel_config *c = refmodel_model_config(r.rm);
  size_t row_bytes = 2 * (size_t)c->head_size * sizeof(float); /* K and V of one head */
  fprintf(out,
          "decode agreement: stories260K, %d TinyStories prompts of %d tokens, %d greedy tokens; "
          "sparse attention over KV kept in kvdb vs dense\n"
          "  teacher-forced (tf): share of steps whose argmax equals dense's for the same "
          "history (headline); free-running (fr): each side decodes its own tokens\n"
          "  budget: positions attended per layer and KV head / context, recent window "
          "included; read/dense: bytes kvdb read (score copies + fetched rows) / K and V of the "
          "whole context\n",
          n_prompts, PROMPT_LEN, steps);
  fprintf(out, "\n  design: %s\n", DESIGNS[0].name);
  fprintf(out, HEADER, "budget", "tf agree", "tf KL", "fr agree", "fr 1st", "fr same", "attended",
          "read/dense");
  double base20 = NAN;
  for (size_t bi = 0; bi < N_BUDGETS; bi++) {
    totals t;
    if (run_one(&r, &DESIGNS[0], BUDGETS[bi], &t) != 0)
      goto done;
    char label[16];
    snprintf(label, sizeof label, "%.0f%%", BUDGETS[bi] * 100);
    print_row(out, label, &t, n_prompts, row_bytes);
    fflush(out);
    double tf = (double)t.tf_agree / (double)t.steps;
    double fr = (double)t.fr_agree / (double)t.steps;
    if (BUDGETS[bi] >= 1 && (t.tf_agree != t.steps || t.kl != 0 || t.fr_agree != t.steps)) {
      fprintf(out, "  ERROR: at 100%% the sparse steps differ from dense (tf %ld/%ld, KL %g)\n",
              t.tf_agree, t.steps, t.kl);
      goto done;
    }
    if (j != NULL) {
      char key[64];
      snprintf(key, sizeof key, "agreement_%.0fpct", BUDGETS[bi] * 100);
      if (BUDGETS[bi] < 1 && fabs(BUDGETS[bi] - 0.2) > 1e-9)
        bench_json_num(j, key, tf);
      snprintf(key, sizeof key, "agreement_free_%.0fpct", BUDGETS[bi] * 100);
      bench_json_num(j, key, fr);
      if (fabs(BUDGETS[bi] - 0.2) < 1e-9) {
        bench_json_num(j, "first_divergence_20pct", (double)t.first_diff / n_prompts);
        bench_json_num(j, "decode_read_vs_dense_20pct",
                       (double)(t.st.score_bytes + t.st.fetch_bytes) /
                           ((double)t.st.context * (double)row_bytes));
      }
    }
    if (fabs(BUDGETS[bi] - 0.2) < 1e-9)
      base20 = tf;
  }
  fprintf(out, "\n  designs at a 20%% budget:\n");
  fprintf(out, HEADER, "", "tf agree", "tf KL", "fr agree", "fr 1st", "fr same", "attended",
          "read/dense");
  for (size_t di = 1; di < N_DESIGNS; di++) {
    if (quick && di > 2)
      break;
    totals t;
    if (run_one(&r, &DESIGNS[di], 0.2, &t) != 0)
      goto done;
    print_row(out, "20%", &t, n_prompts, row_bytes);
    fprintf(out, "             ^ %s\n", DESIGNS[di].name);
    fflush(out);
    if (j != NULL)
      bench_json_num(j, DESIGNS[di].key, (double)t.tf_agree / (double)t.steps);
  }
  fprintf(out, "\n  agreement_20pct %.4f (target >= 0.95: %s)\n", base20,
          base20 >= 0.95 ? "met" : "MISSED");
  if (agreement_20pct != NULL)
    *agreement_20pct = base20;
  rc = 0;
done:
  if (r.db != NULL)
    kvdb_close(r.db);
  refmodel_state_free(r.a);
  refmodel_state_free(r.b);
  refmodel_tokenizer_free(tk);
  refmodel_model_free(r.rm);
  free(text);
  free(prompts);
  return rc;
}

int bench_decode_agreement(const bench_env *env, bench_json *j, double *agreement_20pct)
{
  const char *shared = NULL;
  char buf[4200];
  if (env->model_dir != NULL) { /* --model-dir names the folder holding stories260K/ */
    snprintf(buf, sizeof buf, "%.4000s/..", env->model_dir);
    shared = buf;
  }
  return bench_decode_agreement_run(shared, env->dir, env->quick, env->out, j, agreement_20pct);
}

int bench_decode_model(const bench_env *env, bench_json *j)
{
  double a = NAN;
  int rc = bench_decode_agreement(env, j, &a);
  if (rc == 0)
    bench_json_num(j, "agreement_20pct", a);
  return rc;
}
