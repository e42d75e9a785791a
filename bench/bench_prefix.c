/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_prefix.c — `kvdb-bench prefix`: what prefix reuse buys a real model, and ingest
 * throughput.
 *
 * Time to first token (TTFT) of the stories260K model (tools/refmodel, float32) for prompts of
 * 64, 128, 256 and 512 tokens (BOS + TinyStories text): with the whole prompt but its last token
 * found in kvdb (a full prefix hit: lookup + get into the model's cache + one forward step,
 * refkv_continue), against a full prefill of the same prompt (the baseline, measured in the same
 * run, alternating with the hit, prompt by prompt). The hit is measured on a fresh handle with no
 * DRAM tier (every get reads the segment files with O_DIRECT: the cross-session case) and again
 * with the DRAM tier warm. Every hit is checked: first token and logits bit-identical to the full
 * prefill's.
 *
 * Ingest throughput: kvdb-ingest's engine with its defaults (tools/ingest, float32 KV, 16-token
 * blocks, durable puts, each context's quality profile recorded) over the first TinyStories
 * documents with 1 and 2 jobs, against computing the same windows' KV with the model alone (one
 * thread, nothing stored); and 2 jobs without the profiles (kvdb-ingest --no-profile).
 *
 * Needs ../shared's model and corpus (--model-dir, $KVDB_MODEL_DIR, $KVDB_CORPUS_DIR,
 * $KVDB_SHARED_DIR, the build's default); without them it says where it looked and reports
 * "skipped".
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "docs.h"
#include "ingest.h"
#include "kvdb.h"
#include "refkv.h"
#include "refmodel.h"
#include "shared_paths.h"

#define N_LENGTHS 4
static const int LENGTHS[N_LENGTHS] = {64, 128, 256, 512};
#define TARGET_SPEEDUP_512 5.0

typedef struct prompt {
  int *tok;
  uint32_t *utok;
  int n;
  int first;     /* first new token of the full prefill */
  float *logits; /* its logits */
} prompt;

typedef struct plen {
  prompt *p;
  int n_prompts;
  bench_samples full, hit, hit_get, dram;
} plen;

static int find_inputs(const bench_env *env, char *model, char *tok, char *corpus, size_t cap,
                       char *looked, size_t looked_cap)
{
  if (env->model_dir != NULL) {
    snprintf(model, cap, "%.4000s/stories260K/stories260K.bin", env->model_dir);
    snprintf(tok, cap, "%.4000s/stories260K/tok512.bin", env->model_dir);
    if (!bench_file_exists(model) || !bench_file_exists(tok)) {
      snprintf(looked, looked_cap, "model: '%.4000s' and '%.4000s'", model, tok);
      return -1;
    }
    snprintf(corpus, cap, "%.4000s/../corpora/tinystories/tinystories_validation_head.txt",
             env->model_dir);
    if (bench_file_exists(corpus))
      return 0;
  } else {
    char where[8000];
    if (shared_find_model(model, tok, cap, where, sizeof where) != 0) {
      snprintf(looked, looked_cap, "model: %.7900s", where);
      return -1;
    }
  }
  char where[8000];
  if (shared_find_corpus(corpus, cap, where, sizeof where) != 0) {
    snprintf(looked, looked_cap, "corpus: %.7900s", where);
    return -1;
  }
  return 0;
}

static char *read_text(const char *path, size_t max, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  char *b = malloc(max + 1);
  if (b == NULL) {
    fclose(f);
    return NULL;
  }
  *len = fread(b, 1, max, f);
  b[*len] = '\0';
  fclose(f);
  return b;
}

static double ms(uint64_t ns)
{
  return (double)ns / 1e6;
}

static int fail_rk(const char *what)
{
  bench_log("prefix: %s: %s", what, refkv_errmsg());
  return -1;
}

static kvdb *open_db(const char *dir, uint64_t dram_bytes)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = dram_bytes;
  kvdb *db = NULL;
  kvdb_status rc = kvdb_open(dir, &o, &db);
  if (rc != KVDB_OK)
    bench_log("prefix: cannot open '%s': %s", dir, kvdb_errmsg());
  return db;
}

/* One hit measurement (and its checks) and one full prefill of prompt p. */
static int measure(kvdb *db, const refkv_model *km, refmodel_state *st, refmodel_state *st_full,
                   prompt *p, bench_samples *hit, bench_samples *hit_get, bench_samples *full,
                   int order)
{
  int out;
  refkv_run rh, rf;
  for (int k = 0; k < 2; k++) {
    if ((k == 0) == (order == 0)) {
      if (refkv_continue(db, km, st, p->tok, (size_t)p->n, 1, -1, &out, &rh) != KVDB_OK)
        return fail_rk("continue from the store");
      int vocab = refmodel_model_config(km->rm)->vocab_size;
      if (rh.hit_tokens != (size_t)p->n - 1 || out != p->first ||
          memcmp(refmodel_state_logits(st), p->logits, (size_t)vocab * sizeof(float)) != 0) {
        bench_log("prefix: a %d-token prompt continued from the store: hit %zu (want %d), first "
                  "token %d (want %d)%s",
                  p->n, rh.hit_tokens, p->n - 1, out, p->first,
                  out == p->first ? ", logits differ" : "");
        return -1;
      }
    } else if (full != NULL) {
      if (refkv_continue(NULL, km, st_full, p->tok, (size_t)p->n, 1, -1, &out, &rf) != KVDB_OK)
        return fail_rk("full prefill");
      if (out != p->first) {
        bench_log("prefix: the full prefill is not deterministic");
        return -1;
      }
    }
  }
  bench_samples_push(hit, (uint64_t)(rh.ttft_s * 1e9));
  if (hit_get != NULL)
    bench_samples_push(hit_get, (uint64_t)(rh.get_s * 1e9));
  if (full != NULL)
    bench_samples_push(full, (uint64_t)(rf.ttft_s * 1e9));
  return 0;
}

/* Compute-only baseline: the windows kvdb-ingest would compute for the first n_docs documents
 * (same splitting, window 512 = seq_len, stride 511), prefilled from scratch, nothing stored. */
static int compute_only(const char *corpus, uint64_t n_docs, refmodel_model *rm,
                        refmodel_tokenizer *tk, uint64_t *tokens, double *seconds)
{
  src_list l;
  char err[1024];
  const char *in[1] = {corpus};
  if (src_list_build(in, 1, &l, err, sizeof err) != 0) {
    bench_log("prefix: %s", err);
    return -1;
  }
  refmodel_state *st;
  if (refmodel_state_new(rm, 512, &st) != REFMODEL_OK) {
    src_list_free(&l);
    return -1;
  }
  doc_reader r;
  doc_reader_open(&r, &l, NULL, n_docs);
  doc d;
  int rc = 0, win[512];
  uint64_t t0 = bench_now_ns(), total = 0;
  while ((rc = doc_reader_next(&r, &d, err, sizeof err)) == 1) {
    size_t cap = refmodel_encode_bound(d.len), n = 0;
    int *t = malloc(cap * sizeof *t);
    if (t == NULL || refmodel_encode(tk, d.text, d.len, 0, t, cap, &n) != REFMODEL_OK) {
      free(t);
      free(d.text);
      rc = -1;
      break;
    }
    for (size_t start = 0;; start += 511) {
      size_t m = n - start < 511 ? n - start : 511;
      win[0] = REFMODEL_TOKEN_BOS;
      memcpy(win + 1, t + start, m * sizeof *t);
      refmodel_prefill(st, win, (int)m + 1, 0, NULL);
      total += m + 1;
      if (start + 511 >= n)
        break;
    }
    free(t);
    free(d.text);
  }
  *seconds = (double)(bench_now_ns() - t0) / 1e9;
  *tokens = total;
  doc_reader_close(&r);
  refmodel_state_free(st);
  src_list_free(&l);
  return rc < 0 ? -1 : 0;
}

static int run_ingest(const bench_env *env, const char *name, const char *model, const char *tok,
                      const char *corpus, uint64_t n_docs, int jobs, int profile,
                      ingest_stats *s)
{
  char dir[4200], err[2048];
  bench_path(dir, sizeof dir, env->dir, name);
  ingest_opts o;
  ingest_opts_init(&o);
  const char *in[1] = {corpus};
  o.db_dir = dir;
  o.inputs = in;
  o.n_inputs = 1;
  o.model_path = model;
  o.tokenizer_path = tok;
  o.max_docs = n_docs;
  o.jobs = jobs;
  o.profile = profile;
  if (ingest_run(&o, s, err, sizeof err) != 0) {
    bench_log("prefix: ingest: %s", err);
    return -1;
  }
  return 0;
}

int bench_prefix(const bench_env *env, bench_json *j)
{
  FILE *out = env->out;
  char model[4200], tok[4200], corpus[4200], looked[8192];
  if (find_inputs(env, model, tok, corpus, sizeof model, looked, sizeof looked) != 0) {
    fprintf(out,
            "prefix: SKIPPED: the stories260K model or the TinyStories corpus was not found "
            "(set --model-dir, KVDB_MODEL_DIR and KVDB_CORPUS_DIR, or KVDB_SHARED_DIR).\n"
            "  looked for %s\n",
            looked);
    bench_json_str(j, "skipped", looked);
    return 0;
  }
  int n_prompts = env->quick ? 3 : 8, reps = env->quick ? 2 : 5;
  uint64_t ingest_docs = env->quick ? 150 : 600;
  int rc = -1;
  refmodel_model *rm = NULL;
  refmodel_tokenizer *tk = NULL;
  refmodel_state *st = NULL, *st_full = NULL;
  kvdb *db = NULL;
  char *text = NULL;
  int *stream = NULL;
  plen pl[N_LENGTHS];
  memset(pl, 0, sizeof pl);
  prompt warm = {0};

  if (refmodel_model_load(model, &rm) != REFMODEL_OK ||
      refmodel_tokenizer_load(tok, refmodel_model_config(rm)->vocab_size, &tk) != REFMODEL_OK) {
    bench_log("prefix: %s", refmodel_errmsg());
    goto out;
  }
  refkv_model km;
  if (refkv_model_init(&km, rm, NULL, model, REFKV_STORE_F32, 16) != KVDB_OK) {
    fail_rk("model");
    goto out;
  }
  int vocab = refmodel_model_config(rm)->vocab_size;
  if (refmodel_state_new(rm, 512, &st) != REFMODEL_OK ||
      refmodel_state_new(rm, 512, &st_full) != REFMODEL_OK)
    goto out;

  /* Prompts: BOS + consecutive text tokens from spread-out offsets (no two share a prefix). */
  size_t text_len = 0, n_stream = 0;
  text = read_text(corpus, 400000, &text_len);
  if (text == NULL) {
    bench_log("prefix: cannot read '%s'", corpus);
    goto out;
  }
  stream = malloc(refmodel_encode_bound(text_len) * sizeof *stream);
  if (stream == NULL || refmodel_encode(tk, text, text_len, 0, stream,
                                        refmodel_encode_bound(text_len), &n_stream) != REFMODEL_OK)
    goto out;
  int total_prompts = N_LENGTHS * n_prompts + 1;
  size_t spacing = n_stream / (size_t)total_prompts;
  if (spacing < 512) {
    bench_log("prefix: the corpus has only %zu tokens", n_stream);
    goto out;
  }
  int k = 0;
  for (int li = 0; li <= N_LENGTHS; li++) {
    int len = li < N_LENGTHS ? LENGTHS[li] : 64;
    int count = li < N_LENGTHS ? n_prompts : 1;
    if (li < N_LENGTHS) {
      pl[li].p = calloc((size_t)count, sizeof *pl[li].p);
      pl[li].n_prompts = count;
      if (pl[li].p == NULL)
        goto out;
    }
    for (int i = 0; i < count; i++, k++) {
      prompt *p = li < N_LENGTHS ? &pl[li].p[i] : &warm;
      p->n = len;
      p->tok = malloc((size_t)len * sizeof *p->tok);
      p->utok = malloc((size_t)len * sizeof *p->utok);
      p->logits = malloc((size_t)vocab * sizeof *p->logits);
      if (p->tok == NULL || p->utok == NULL || p->logits == NULL)
        goto out;
      p->tok[0] = REFMODEL_TOKEN_BOS;
      memcpy(p->tok + 1, stream + (size_t)k * spacing, (size_t)(len - 1) * sizeof *p->tok);
      for (int t = 0; t < len; t++)
        p->utok[t] = (uint32_t)p->tok[t];
    }
  }

  /* Store every prompt's KV (one process), recording its first token and logits. */
  char dbdir[4200];
  bench_path(dbdir, sizeof dbdir, env->dir, "prefix-db");
  if ((db = open_db(dbdir, 0)) == NULL)
    goto out;
  bench_log("prefix: storing %d prompts", total_prompts);
  for (int li = 0; li <= N_LENGTHS; li++)
    for (int i = 0; i < (li < N_LENGTHS ? n_prompts : 1); i++) {
      prompt *p = li < N_LENGTHS ? &pl[li].p[i] : &warm;
      const float *lg;
      if (refmodel_prefill(st, p->tok, p->n, 0, &lg) != REFMODEL_OK)
        goto out;
      memcpy(p->logits, lg, (size_t)vocab * sizeof *lg);
      p->first = refmodel_argmax(lg, vocab);
      if (refkv_put(db, &km, st, p->utok, (size_t)p->n, NULL) != KVDB_OK) {
        fail_rk("put");
        goto out;
      }
    }
  kvdb_close(db);
  db = NULL;
  const char *cache = bench_drop_cache(env->dir);

  /* A fresh handle without a DRAM tier: every get reads the segment files. Its first get
   * (which allocates the handle's read buffers) is the warm-up prompt's, untimed. */
  if ((db = open_db(dbdir, 0)) == NULL)
    goto out;
  kvdb_stats ks;
  kvdb_stat(db, &ks);
  {
    int o1;
    if (refkv_continue(db, &km, st, warm.tok, (size_t)warm.n, 1, -1, &o1, NULL) != KVDB_OK) {
      fail_rk("warm-up");
      goto out;
    }
  }
  bench_log("prefix: TTFT, %d prompts x %d repetitions per length, hit (SSD) vs full prefill",
            n_prompts, reps);
  for (int r = 0; r < reps; r++)
    for (int li = 0; li < N_LENGTHS; li++)
      for (int i = 0; i < n_prompts; i++)
        if (measure(db, &km, st, st_full, &pl[li].p[i], &pl[li].hit, &pl[li].hit_get, &pl[li].full,
                    (r + i) % 2) != 0)
          goto out;
  kvdb_close(db);
  db = NULL;

  /* The DRAM tier: one untimed get per prompt fills it, then the timed ones. */
  if ((db = open_db(dbdir, 256ull << 20)) == NULL)
    goto out;
  for (int r = 0; r <= reps; r++)
    for (int li = 0; li < N_LENGTHS; li++)
      for (int i = 0; i < n_prompts; i++) {
        bench_samples scratch = {0};
        if (measure(db, &km, st, st_full, &pl[li].p[i], r == 0 ? &scratch : &pl[li].dram, NULL,
                    NULL, 0) != 0) {
          bench_samples_free(&scratch);
          goto out;
        }
        bench_samples_free(&scratch);
      }
  kvdb_stats ks2;
  kvdb_stat(db, &ks2);
  kvdb_close(db);
  db = NULL;

  fprintf(out,
          "model %s (float32 KV, %u-token blocks, %zu B of KV per token); %d prompts per "
          "length, %d repetitions; median time to first token\n",
          km.id, km.km.block_tokens, refkv_token_bytes(&km), n_prompts, reps);
  fprintf(out,
          "  SSD: fresh handle, no DRAM tier, O_DIRECT %s (page cache: %s); DRAM: tier warm "
          "(%llu DRAM hits)\n",
          ks.direct_io ? "on" : "off", cache, (unsigned long long)ks2.tier[KVDB_TIER_DRAM].hits);
  fprintf(out, "  %-7s %12s %14s %10s %9s %12s %9s\n", "tokens", "full (ms)", "hit SSD (ms)",
          "get (ms)", "speedup", "hit DRAM", "speedup");
  double speedup[N_LENGTHS];
  for (int li = 0; li < N_LENGTHS; li++) {
    uint64_t f = bench_samples_pct(&pl[li].full, 50), h = bench_samples_pct(&pl[li].hit, 50);
    uint64_t g = bench_samples_pct(&pl[li].hit_get, 50), d = bench_samples_pct(&pl[li].dram, 50);
    speedup[li] = bench_ratio((double)f, (double)h);
    double sd = bench_ratio((double)f, (double)d);
    fprintf(out, "  %-7d %12.3f %14.3f %10.3f %8.1fx %12.3f %8.1fx\n", LENGTHS[li], ms(f), ms(h),
            ms(g), speedup[li], ms(d), sd);
    char key[64];
    snprintf(key, sizeof key, "ttft_full_ms_%d", LENGTHS[li]);
    bench_json_num(j, key, ms(f));
    snprintf(key, sizeof key, "ttft_hit_ms_%d", LENGTHS[li]);
    bench_json_num(j, key, ms(h));
    snprintf(key, sizeof key, "ttft_hit_get_ms_%d", LENGTHS[li]);
    bench_json_num(j, key, ms(g));
    snprintf(key, sizeof key, "ttft_hit_dram_ms_%d", LENGTHS[li]);
    bench_json_num(j, key, ms(d));
    snprintf(key, sizeof key, "ttft_speedup_%d", LENGTHS[li]);
    bench_json_num(j, key, speedup[li]);
    snprintf(key, sizeof key, "ttft_speedup_dram_%d", LENGTHS[li]);
    bench_json_num(j, key, sd);
  }
  fprintf(out, "  every hit: first token and logits bit-identical to the full prefill's\n");

  /* Ingest throughput. */
  ingest_stats s1, s2, s3;
  uint64_t ctoks = 0;
  double csec = 0;
  bench_log("prefix: ingest of %llu documents, compute only", (unsigned long long)ingest_docs);
  if (compute_only(corpus, ingest_docs, rm, tk, &ctoks, &csec) != 0)
    goto out;
  bench_log("prefix: ingest, 1 job");
  if (run_ingest(env, "ingest-1", model, tok, corpus, ingest_docs, 1, 1, &s1) != 0)
    goto out;
  bench_log("prefix: ingest, 2 jobs");
  if (run_ingest(env, "ingest-2", model, tok, corpus, ingest_docs, 2, 1, &s2) != 0)
    goto out;
  bench_log("prefix: ingest, 2 jobs, no quality profiles");
  if (run_ingest(env, "ingest-3", model, tok, corpus, ingest_docs, 2, 0, &s3) != 0)
    goto out;
  double c_tps = csec > 0 ? (double)ctoks / csec : 0;
  double t1 = s1.seconds > 0 ? (double)s1.tokens / s1.seconds : 0;
  double t2 = s2.seconds > 0 ? (double)s2.tokens / s2.seconds : 0;
  double t3 = s3.seconds > 0 ? (double)s3.tokens / s3.seconds : 0;
  fprintf(out,
          "ingest: %llu documents, %llu tokens in %llu contexts (%llu computed, %llu from "
          "stored prefixes), durable puts, quality profiles\n",
          (unsigned long long)s1.docs, (unsigned long long)s1.tokens,
          (unsigned long long)s1.windows, (unsigned long long)s1.tokens_computed,
          (unsigned long long)s1.tokens_restored);
  fprintf(out, "  compute only (1 thread, nothing stored): %.0f tokens/s\n", c_tps);
  fprintf(out,
          "  kvdb-ingest 1 job:  %.0f tokens/s (%.2fx compute only), %.1f s, of which "
          "puts %.1f s (%.2f ms each)\n",
          t1, bench_ratio(t1, c_tps), s1.seconds, s1.put_seconds,
          s1.windows_stored ? s1.put_seconds * 1e3 / (double)s1.windows_stored : 0);
  fprintf(out,
          "  kvdb-ingest 2 jobs: %.0f tokens/s (%.2fx 1 job), %.1f s, puts %.1f s in both "
          "jobs (%.2f ms each)\n",
          t2, bench_ratio(t2, t1), s2.seconds, s2.put_seconds,
          s2.windows_stored ? s2.put_seconds * 1e3 / (double)s2.windows_stored : 0);
  fprintf(out,
          "  kvdb-ingest 2 jobs, --no-profile: %.0f tokens/s (%.2fx with profiles), %.1f s, puts "
          "%.1f s in both jobs (%.2f ms each)\n",
          t3, bench_ratio(t3, t2), s3.seconds, s3.put_seconds,
          s3.windows_stored ? s3.put_seconds * 1e3 / (double)s3.windows_stored : 0);

  bench_json_str(j, "model", km.id);
  bench_json_bool(j, "real_model", 1);
  bench_json_int(j, "block_tokens", km.km.block_tokens);
  bench_json_int(j, "prompts_per_length", n_prompts);
  bench_json_int(j, "repetitions", reps);
  bench_json_bool(j, "direct_io", ks.direct_io);
  bench_json_str(j, "cache_drop", cache);
  bench_json_int(j, "ingest_documents", (int64_t)s1.docs);
  bench_json_int(j, "ingest_tokens", (int64_t)s1.tokens);
  bench_json_num(j, "compute_tokens_per_s", c_tps);
  bench_json_num(j, "ingest_tokens_per_s_1job", t1);
  bench_json_num(j, "ingest_tokens_per_s_2jobs", t2);
  bench_json_num(j, "ingest_vs_compute", bench_ratio(t1, c_tps));
  bench_json_num(j, "ingest_put_ms_1job",
                 s1.windows_stored ? s1.put_seconds * 1e3 / (double)s1.windows_stored : 0);
  bench_json_num(j, "ingest_2jobs_vs_1job", bench_ratio(t2, t1));
  bench_json_num(j, "ingest_tokens_per_s_2jobs_noprofile", t3);
  bench_json_num(j, "ingest_noprofile_vs_profile", bench_ratio(t3, t2));
  bench_json_num(j, "ingest_tokens_per_s", t2);
  int met = speedup[3] >= TARGET_SPEEDUP_512;
  bench_json_bool(j, "target_ttft_speedup_512_met", met);
  bench_json_int(j, "targets_met", met);
  bench_json_int(j, "targets_total", 1);
  bench_json_num(j, "ttft_speedup_512", speedup[3]);
  bench_json_num(j, "ttft_speedup_128", speedup[1]);
  fprintf(out, "target ttft_speedup_512 >= %.0f: %s (%.1fx)\n", TARGET_SPEEDUP_512,
          met ? "met" : "NOT met", speedup[3]);
  rc = 0;
out:
  kvdb_close(db);
  for (int li = 0; li < N_LENGTHS; li++) {
    for (int i = 0; pl[li].p != NULL && i < pl[li].n_prompts; i++) {
      free(pl[li].p[i].tok);
      free(pl[li].p[i].utok);
      free(pl[li].p[i].logits);
    }
    free(pl[li].p);
    bench_samples_free(&pl[li].full);
    bench_samples_free(&pl[li].hit);
    bench_samples_free(&pl[li].hit_get);
    bench_samples_free(&pl[li].dram);
  }
  free(warm.tok);
  free(warm.utok);
  free(warm.logits);
  free(stream);
  free(text);
  refmodel_state_free(st);
  refmodel_state_free(st_full);
  refmodel_tokenizer_free(tk);
  refmodel_model_free(rm);
  if (rc != 0)
    bench_log("prefix: failed");
  return rc;
}
