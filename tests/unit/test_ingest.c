/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_ingest.c — kvdb-ingest end to end, run as a separate process the way a user
 * runs it, on a tiny model and corpus the test writes itself (tinymodel.h):
 *
 *   text       .txt (blank-line documents, CRLF, inner line breaks) and .jsonl (escapes, an empty
 *              row) in a folder with an ignored file; every expected window — computed here
 *              independently from the document texts — is stored, with KV bit-identical to a
 *              recompute; nothing else is stored; a rerun skips everything; --max-docs
 *   SIGKILL    rounds that kill the ingest (1 and 2 jobs) at a random point, then rerun it: the
 *              rerun skips exactly the contexts committed before the kill and stores exactly the
 *              others (no duplicates, no gaps), kvdb_verify finds nothing wrong
 *   safetensors  stacked LTHD / LHTD and per-layer files in F16, BF16 and F32 round-trip bit-exact;
 *              18 malformed files are each refused with a message naming what is wrong
 *   errors     bad options and bad inputs: exit status and message
 *   demo       kvdb-demo prefix on the ingested database: identical continuations
 *
 * usage: test_ingest KVDB_INGEST KVDB_DEMO
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <jansson.h>
#include "kvdb_test.h"
#include "refkv.h"
#include "refmodel.h"
#include "tinymodel.h"

static const char *g_ingest, *g_demo;
static char *g_dir;
static char g_model[4200], g_tok[4200];
static refmodel_model *g_rm;
static refmodel_tokenizer *g_tk;

#define WINDOW 48
#define STRIDE 40

/* ---- processes and files ------------------------------------------------------------------ */

/* Every string path_in() made, freed together at the end (paths_free) so that the sanitizer
 * run's leak check stays clean. */
static char **g_paths;
static size_t g_n_paths, g_paths_cap;

/* g_dir/name in a new string, valid until paths_free(). */
static char *path_in(const char *name)
{
  if (g_n_paths == g_paths_cap) {
    g_paths_cap = g_paths_cap ? 2 * g_paths_cap : 64;
    g_paths = realloc(g_paths, g_paths_cap * sizeof *g_paths);
    ASSERT(g_paths != NULL);
  }
  char *b = malloc(strlen(g_dir) + strlen(name) + 2);
  ASSERT(b != NULL);
  sprintf(b, "%s/%s", g_dir, name);
  g_paths[g_n_paths++] = b;
  return b;
}

static void paths_free(void)
{
  for (size_t i = 0; i < g_n_paths; i++)
    free(g_paths[i]);
  free(g_paths);
  g_paths = NULL;
  g_n_paths = g_paths_cap = 0;
}

static void write_file(const char *path, const void *data, size_t len)
{
  FILE *f = fopen(path, "wb");
  ASSERT(f != NULL);
  ASSERT(fwrite(data, 1, len, f) == len);
  ASSERT(fclose(f) == 0);
}

static char *read_file(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  ASSERT(b != NULL && fread(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  b[n] = '\0';
  if (len != NULL)
    *len = (size_t)n;
  return b;
}

/* Start argv (NULL-terminated) with stdout and stderr to files; returns the pid. */
static pid_t spawn(char *const argv[], const char *out, const char *err)
{
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0)
      _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

static int wait_exit(pid_t pid)
{
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* stdout and stderr of the last run() */
static char *out, *err;

/* Run a tool; `out` and `err` receive its output. Returns the exit status. */
static int run(char *const argv[])
{
  const char *o = path_in("run.out"), *e = path_in("run.err");
  int rc = wait_exit(spawn(argv, o, e));
  free(out);
  free(err);
  out = read_file(o, NULL);
  err = read_file(e, NULL);
  ASSERT(out != NULL && err != NULL);
  return rc;
}

/*
 * kvdb-ingest with the given arguments (NULL-terminated) and --json -q --sync none: these runs
 * test what is stored, not durability, and a machine busy with other I/O makes every fdatasync
 * slow. (The SIGKILL rounds start kvdb-ingest with its default, durable puts.)
 */
static int ingest(const char *first, ...)
{
  char *argv[64];
  int n = 0;
  argv[n++] = (char *)g_ingest;
  argv[n++] = "--json";
  argv[n++] = "-q";
  argv[n++] = "--sync";
  argv[n++] = "none";
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a != NULL && n < 62; a = va_arg(ap, const char *))
    argv[n++] = (char *)a;
  va_end(ap);
  argv[n] = NULL;
  return run(argv);
}

/* A number member of the JSON summary (the last line of out). */
static uint64_t jnum(const char *text, const char *key)
{
  const char *line = text, *p;
  while ((p = strchr(line, '\n')) != NULL && p[1] != '\0')
    line = p + 1;
  json_error_t je;
  json_t *d = json_loads(line, 0, &je);
  if (d == NULL) {
    fprintf(stderr, "summary is not JSON (line %d, column %d: %s): %s\n", je.line, je.column,
            je.text, line);
    abort();
  }
  json_t *v = json_object_get(d, key);
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    fprintf(stderr, "summary has no number '%s': %s\n", key, line);
    abort();
  }
  uint64_t x = (uint64_t)json_integer_value(v);
  json_decref(d);
  return x;
}

/* A number member of the JSON summary as a double. */
static double jnumf(const char *text, const char *key)
{
  const char *line = text, *p;
  while ((p = strchr(line, '\n')) != NULL && p[1] != '\0')
    line = p + 1;
  json_t *d = json_loads(line, 0, NULL);
  ASSERT(d != NULL);
  json_t *v = json_object_get(d, key);
  if (!json_is_number(v)) {
    fprintf(stderr, "summary has no number '%s': %s\n", key, line);
    abort();
  }
  double x = json_number_value(v);
  json_decref(d);
  return x;
}

static void expect_fail(int rc, int want_rc, const char *want)
{
  if (rc != want_rc || strstr(err, want) == NULL) {
    fprintf(stderr, "expected exit %d and a message containing \"%s\"; got exit %d, stderr:\n%s\n",
            want_rc, want, rc, err);
    abort();
  }
}

/* ---- the expected contexts ---------------------------------------------------------------- */

typedef struct ctxlist {
  uint32_t *tok[4096];
  size_t n_tok[4096];
  size_t n;
} ctxlist;

/* The windows of one document text, computed from the definition in ingest.h. */
static void windows_of(const char *text, size_t len, ctxlist *cl)
{
  if (len == 0)
    return;
  size_t cap = refmodel_encode_bound(len), n = 0;
  int *t = malloc(cap * sizeof *t);
  ASSERT(refmodel_encode(g_tk, text, len, 0, t, cap, &n) == REFMODEL_OK);
  size_t per = WINDOW - 1;
  for (size_t start = 0;; start += STRIDE) {
    size_t m = n - start < per ? n - start : per;
    uint32_t *c = malloc((m + 1) * sizeof *c);
    c[0] = 1;
    for (size_t i = 0; i < m; i++)
      c[1 + i] = (uint32_t)t[start + i];
    ASSERT(cl->n < 4096);
    cl->tok[cl->n] = c;
    cl->n_tok[cl->n++] = m + 1;
    if (start + per >= n)
      break;
  }
  free(t);
}

static void ctxlist_free(ctxlist *cl)
{
  for (size_t i = 0; i < cl->n; i++)
    free(cl->tok[i]);
  cl->n = 0;
}

static kvdb *open_ro(const char *dir)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.flags = KVDB_O_RDONLY;
  o.dram_bytes = 0;
  kvdb *db = NULL;
  if (kvdb_open(dir, &o, &db) != KVDB_OK)
    return NULL;
  return db;
}

static uint64_t n_contexts(const char *dir)
{
  kvdb *db = open_ro(dir);
  if (db == NULL)
    return 0;
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  kvdb_close(db);
  return st.n_contexts;
}

/* Every expected context is stored (with its quality profile: kvdb-ingest's default) with the
 * KV a recompute gives (when check_kv), and the database holds nothing else. */
static void check_db(const char *dir, const ctxlist *cl, int check_kv)
{
  kvdb *db = open_ro(dir);
  ASSERT(db != NULL);
  refkv_model m;
  ASSERT_OK(refkv_model_init(&m, g_rm, NULL, g_model, REFKV_STORE_F32, 16));
  refmodel_state *a, *b;
  ASSERT(refmodel_state_new(g_rm, WINDOW, &a) == REFMODEL_OK);
  ASSERT(refmodel_state_new(g_rm, WINDOW, &b) == REFMODEL_OK);
  size_t distinct = 0;
  for (size_t i = 0; i < cl->n; i++) {
    kvdb_key h[8];
    ASSERT_OK(kvdb_chain_hashes(&m.km, cl->tok[i], cl->n_tok[i], h, 8));
    kvdb_context_info info;
    size_t nb = (cl->n_tok[i] + 15) / 16;
    kvdb_status rc = kvdb_context_stat(db, &h[nb - 1], &info);
    if (rc != KVDB_OK) {
      fprintf(stderr, "expected context %zu (%zu tokens) is not stored: %s\n", i, cl->n_tok[i],
              kvdb_status_name(rc));
      abort();
    }
    ASSERT_EQ(info.n_tokens, cl->n_tok[i]);
    ASSERT_EQ(info.has_profile, 1); /* by default every put records its quality profile */
    int dup = 0;
    for (size_t j = 0; j < i && !dup; j++)
      dup = cl->n_tok[j] == cl->n_tok[i] &&
            memcmp(cl->tok[j], cl->tok[i], cl->n_tok[i] * sizeof(uint32_t)) == 0;
    distinct += !dup;
    if (!check_kv)
      continue;
    int p[WINDOW];
    for (size_t k = 0; k < cl->n_tok[i]; k++)
      p[k] = (int)cl->tok[i][k];
    ASSERT(refmodel_prefill(a, p, (int)cl->n_tok[i], 0, NULL) == REFMODEL_OK);
    size_t hit = 0;
    if (refkv_get(db, &m, b, cl->tok[i], cl->n_tok[i], &hit) != KVDB_OK) {
      fprintf(stderr, "refkv_get: %s\n", refkv_errmsg());
      abort();
    }
    ASSERT_EQ(hit, cl->n_tok[i]);
    for (int l = 0; l < TM_LAYERS; l++) {
      ASSERT(memcmp(refmodel_state_key(a, l, 0), refmodel_state_key(b, l, 0),
                    cl->n_tok[i] * m.kv_dim * sizeof(float)) == 0);
      ASSERT(memcmp(refmodel_state_value(a, l, 0), refmodel_state_value(b, l, 0),
                    cl->n_tok[i] * m.kv_dim * sizeof(float)) == 0);
    }
  }
  kvdb_stats st;
  ASSERT_OK(kvdb_stat(db, &st));
  ASSERT_EQ(st.n_contexts, distinct);
  refmodel_state_free(a);
  refmodel_state_free(b);
  kvdb_close(db);
}

static void verify_clean(const char *dir)
{
  kvdb *db = open_ro(dir);
  ASSERT(db != NULL);
  kvdb_verify_report rep;
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, &rep));
  ASSERT_EQ(rep.problems, 0);
  kvdb_close(db);
}

/* ---- the corpus --------------------------------------------------------------------------- */

/* corpus/a.txt (n_txt paragraphs), corpus/b.jsonl (n_jsonl rows + an empty one), corpus/c.md.
 * Appends every document's windows to cl in ingest order. */
static void make_corpus(const char *dir, int n_txt, int n_jsonl, uint64_t seed, ctxlist *cl)
{
  mkdir(dir, 0755);
  char path[4300];
  size_t cap = (size_t)(n_txt + n_jsonl) * 2000 + 1000;
  char *txt = malloc(cap), *jl = malloc(cap);
  size_t t = 0, j = 0;
  t += (size_t)snprintf(txt + t, cap - t, "\n  \n"); /* leading blank lines */
  for (int i = 0; i < n_txt; i++) {
    char *p = tm_paragraph(seed, (uint64_t)i, 3 + i % 4);
    /* an inner line break (CRLF in odd paragraphs) after the first sentence */
    char *dot = strchr(p, '.');
    size_t first = (size_t)(dot - p) + 1;
    const char *br = i % 2 ? "\r\n" : "\n";
    t += (size_t)snprintf(txt + t, cap - t, "%.*s%s%s\n%s", (int)first, p, br, p + first + 1,
                          i % 3 == 0 ? "\r\n \t\n\n" : "\n");
    /* the document as ingest sees it: CRLF -> LF, lines joined with \n */
    char *doc = malloc(strlen(p) + 2);
    sprintf(doc, "%.*s\n%s", (int)first, p, p + first + 1);
    windows_of(doc, strlen(doc), cl);
    free(doc);
    free(p);
  }
  for (int i = 0; i < n_jsonl; i++) {
    char *p = tm_paragraph(seed + 1, (uint64_t)i, 2 + i % 5);
    /* JSON escapes: a quote, a newline, é as \u00e9 and U+1F600 as a surrogate pair (at the
     * start: a shared opening, and no two windows of the corpus are equal) */
    char *doc = malloc(strlen(p) + 32);
    sprintf(doc, "\"Hi\"\n\xc3\xa9\xf0\x9f\x98\x80 %s", p);
    j += (size_t)snprintf(jl + j, cap - j,
                          "{\"id\": %d, \"text\": \"\\\"Hi\\\"\\n\\u00e9\\ud83d\\ude00 %s\", "
                          "\"meta\": {\"x\": [1, 2.5e3, null, true]}}\n%s",
                          i, p, i == 0 ? "\n" : "");
    windows_of(doc, strlen(doc), cl);
    free(doc);
    free(p);
  }
  j += (size_t)snprintf(jl + j, cap - j, "{\"text\": \"\"}\r\n");
  snprintf(path, sizeof path, "%s/a.txt", dir);
  write_file(path, txt, t);
  snprintf(path, sizeof path, "%s/b.jsonl", dir);
  write_file(path, jl, j);
  snprintf(path, sizeof path, "%s/c.md", dir);
  write_file(path, "# not an input\n", 15);
  free(txt);
  free(jl);
}

/* ---- text ingest --------------------------------------------------------------------------- */

static void test_text(void)
{
  ctxlist cl = {0};
  const char *corpus = path_in("corpus");
  make_corpus(corpus, 30, 12, 7, &cl);
  const char *db = path_in("db-text");
  int rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
                  "--jobs", "2", (char *)db, (char *)corpus, NULL);
  if (rc != 0)
    fprintf(stderr, "%s\n%s\n", out, err);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(jnum(out, "files"), 2);
  ASSERT_EQ(jnum(out, "files_ignored"), 1);
  ASSERT_EQ(jnum(out, "documents"), 30 + 12 + 1);
  ASSERT_EQ(jnum(out, "documents_total"), 43);
  ASSERT_EQ(jnum(out, "documents_empty"), 1);
  ASSERT_EQ(jnum(out, "contexts"), cl.n);
  ASSERT_EQ(jnum(out, "contexts_stored"), cl.n);
  ASSERT_EQ(jnum(out, "contexts_present"), 0);
  ASSERT_EQ(jnum(out, "window"), 48);
  ASSERT_EQ(jnum(out, "stride"), 40);
  ASSERT(strstr(out, "\"profile\":true") != NULL);
  uint64_t tokens = 0;
  for (size_t i = 0; i < cl.n; i++)
    tokens += cl.n_tok[i];
  ASSERT_EQ(jnum(out, "tokens"), tokens);
  ASSERT_EQ(jnum(out, "tokens_computed") + jnum(out, "tokens_restored"), tokens);
  ASSERT(jnum(out, "tokens_restored") > 0); /* documents share their "Story" opening */
  ASSERT(cl.n > 43);                        /* some documents need several windows */
  check_db(db, &cl, 1);

  /* a rerun stores nothing and computes nothing */
  rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
              (char *)db, (char *)corpus, NULL);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(jnum(out, "contexts_present"), cl.n);
  ASSERT_EQ(jnum(out, "contexts_stored"), 0);
  ASSERT_EQ(jnum(out, "tokens_computed"), 0);
  ASSERT_EQ(jnum(out, "bytes_written"), 0);

  /* --max-docs: exactly the first documents' windows */
  /* the first 5 documents are the first 5 paragraphs of a.txt */
  static ctxlist first;
  make_corpus(path_in("corpus5"), 5, 0, 7, &first);
  const char *db5 = path_in("db-max");
  rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
              "--max-docs", "5", (char *)db5, (char *)corpus, NULL);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(jnum(out, "documents"), 5);
  ASSERT_EQ(jnum(out, "contexts"), first.n);
  check_db(db5, &first, 0);

  /* kvdb-demo prefix on the database: prompts extending ingested documents hit and continue
   * identically (the tiny model's windows are 48 tokens; a prompt's hit is its first window) */
  char *dargv[] = {(char *)g_demo,
                   "prefix",
                   (char *)db,
                   "--model",
                   g_model,
                   "--tokenizer",
                   g_tok,
                   "--corpus",
                   path_in("corpus/a.txt"),
                   "--max-docs",
                   "30",
                   "--new-tokens",
                   "8",
                   "--prompts",
                   "3",
                   NULL};
  rc = run(dargv);
  if (rc != 0 || strstr(out, "identical both ways") == NULL || strstr(out, "(ingested)") == NULL ||
      strstr(out, "DIFFERENT") != NULL) {
    fprintf(stderr, "kvdb-demo prefix: exit %d\n%s\n%s\n", rc, out, err);
    abort();
  }
  ctxlist_free(&first);
  ctxlist_free(&cl);
}

/* ---- storage configs, profiles, quality ---------------------------------------------------- */

/* Every context of dir is stored with config `want`; with_profile: each has a profile whose
 * stored entry carries n_reports reported qualities (0 or 1) in [0, 1]. Returns the number of
 * contexts. */
static size_t check_configs(const char *dir, const char *want, int with_profile,
                            uint32_t n_reports)
{
  kvdb *db = open_ro(dir);
  ASSERT(db != NULL);
  kvdb_iter *it;
  ASSERT_OK(kvdb_iter_open(db, &it));
  kvdb_context_info ci;
  size_t n = 0;
  while (kvdb_iter_next(it, &ci) == KVDB_OK) {
    char name[64];
    kvdb_config_name(&ci.config, name, sizeof name);
    if (strcmp(name, want) != 0) {
      fprintf(stderr, "a context is stored as '%s', expected '%s'\n", name, want);
      abort();
    }
    ASSERT_EQ(ci.has_profile, with_profile);
    if (with_profile) {
      kvdb_profile_entry pe[64];
      size_t n_pe = 0, stored = 0;
      ASSERT_OK(kvdb_profile_get(db, &ci.key, pe, 64, &n_pe));
      for (size_t i = 0; i < n_pe && i < 64; i++)
        if (pe[i].flags & KVDB_PROFILE_STORED) {
          stored++;
          ASSERT_EQ(pe[i].n_reports, n_reports);
          if (n_reports > 0)
            ASSERT(pe[i].reported_quality >= 0 && pe[i].reported_quality <= 1);
        }
      ASSERT_EQ(stored, 1);
    }
    n++;
  }
  kvdb_iter_close(it);
  kvdb_close(db);
  return n;
}

static void test_configs(void)
{
  char *corpus = path_in("corpus/a.txt");
  const char *db = path_in("db-int8");
  int rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
                  "--max-docs", "6", "--config", "int8", "--quality-steps", "6",
                  "--jobs", "2", db, corpus, NULL);
  if (rc != 0)
    fprintf(stderr, "%s\n%s\n", out, err);
  ASSERT_EQ(rc, 0);
  uint64_t n = jnum(out, "contexts_stored");
  ASSERT(n >= 6);
  ASSERT_EQ(jnum(out, "quality_contexts"), n);
  ASSERT_EQ(jnum(out, "quality_steps"), 6);
  ASSERT_EQ(jnum(out, "tokens_restored"), 0); /* lossy: no prefix is reused */
  double agree = jnumf(out, "quality_agreement");
  ASSERT(agree >= 0 && agree <= 1);
  ASSERT(jnumf(out, "quality_mean_kl") > 0);
  ASSERT(strstr(out, "\"storage\":\"f32 int8\"") != NULL);
  ASSERT_EQ(check_configs(db, "int8", 1, 1), n);

  /* SnapKV gets the windows' last queries from the model; --no-profile records no profile */
  db = path_in("db-snapkv");
  rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
              "--max-docs", "4", "--config", "snapkv50", "--no-profile", db, corpus, NULL);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(check_configs(db, "snapkv50", 0, 0), jnum(out, "contexts_stored"));
  /* kvdb-demo prefix over the dropped contexts: prompts of ingested documents hit (kvdb_get_kept,
   * the dropped rows absent to the model; the demo exits 1 when no ingested prompt hits) and
   * their quality is measured */
  char *sargv[] = {(char *)g_demo, "prefix", (char *)db, "--model", g_model, "--tokenizer", g_tok,
                   "--corpus", corpus, "--max-docs", "4", "--config", "snapkv50",
                   "--new-tokens", "4", "--prompts", "2", NULL};
  rc = run(sargv);
  if (rc != 0 || strstr(out, "(ingested)") == NULL || strstr(out, "quality of") == NULL) {
    fprintf(stderr, "kvdb-demo prefix (snapkv50): exit %d\n%s\n%s\n", rc, out, err);
    abort();
  }

  /* f16 elements are lossy too: quality measured; raw config */
  db = path_in("db-f16");
  rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
              "--max-docs", "3", "--storage", "f16", "--quality-steps", "4", db, corpus, NULL);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(jnum(out, "quality_contexts"), jnum(out, "contexts_stored"));
  ASSERT(strstr(out, "\"storage\":\"f16 raw\"") != NULL);

  /* lossless storage: no quality to measure (it would be exact) */
  db = path_in("db-lossless");
  rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
              "--max-docs", "3", "--config", "lossless", "--quality-steps", "4", "--no-profile", db,
              corpus, NULL);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(jnum(out, "quality_contexts"), 0);
  ASSERT_EQ(check_configs(db, "lossless", 0, 0), jnum(out, "contexts_stored"));

  expect_fail(ingest("--model", g_model, "--tokenizer", g_tok, "--config", "int5",
                     path_in("db-cfg-bad"), corpus, NULL),
              1, "--config: config 'int5'");
  expect_fail(ingest("--model", g_model, "--tokenizer", g_tok, "--config", "int4:g64",
                     path_in("db-cfg-bad"), corpus, NULL),
              1, "group 64 is larger than the model's block_tokens 16");
  expect_fail(ingest("--quality-steps", "-1", path_in("db-cfg-bad"), corpus, NULL), 2,
              "--quality-steps '-1'");
}

/* ---- SIGKILL and resume ------------------------------------------------------------------- */

static void test_kill_resume(void)
{
  ctxlist cl = {0};
  const char *corpus = path_in("corpus-kill");
  make_corpus(corpus, 48, 18, 99, &cl);
  uint64_t seed = (uint64_t)time(NULL);
  const char *s = getenv("KVDB_SEED");
  if (s != NULL && s[0] != '\0')
    seed = strtoull(s, NULL, 0);
  printf("  kill/resume: %zu contexts per run, KVDB_SEED=%llu\n", cl.n, (unsigned long long)seed);
  int killed_mid_run = 0;
  for (int round = 0; round < 4; round++) {
    char name[64];
    snprintf(name, sizeof name, "db-kill-%d", round);
    const char *db = path_in(name);
    const char *jobs = round % 2 ? "2" : "1";
    uint64_t k = cl.n / 10 + t_rand(&seed) % (cl.n * 6 / 10);
    char *argv[] = {(char *)g_ingest, "-q",           "--model",  g_model,
                    "--tokenizer",    g_tok,          "--window", "48",
                    "--stride",       "40",           "--jobs",   (char *)jobs,
                    (char *)db,       (char *)corpus, NULL};
    pid_t pid = spawn(argv, path_in("kill.out"), path_in("kill.err"));
    int done = 0;
    for (;;) {
      int st;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        done = 1;
        break;
      }
      if (n_contexts(db) >= k)
        break;
      usleep(500);
    }
    if (!done) {
      kill(pid, SIGKILL);
      int st = wait_exit(pid);
      ASSERT(st == 128 + SIGKILL || st == 0);
      done = st == 0;
    }
    uint64_t committed = n_contexts(db);
    printf("  round %d (%s job%s): killed after %llu of %zu contexts%s\n", round, jobs,
           round % 2 ? "s" : "", (unsigned long long)committed, cl.n,
           done ? " (it had finished)" : "");
    killed_mid_run += committed < cl.n;
    int rc = ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "40",
                    "--jobs", (char *)jobs, (char *)db, (char *)corpus, NULL);
    if (rc != 0)
      fprintf(stderr, "%s\n%s\n", out, err);
    ASSERT_EQ(rc, 0);
    /* nothing committed is computed again; everything else is stored now */
    ASSERT_EQ(jnum(out, "contexts_present"), committed);
    ASSERT_EQ(jnum(out, "contexts_stored"), cl.n - committed);
    check_db(db, &cl, round == 0);
    verify_clean(db);
  }
  ASSERT(killed_mid_run >= 2);

  /* the human-readable run: plain progress lines on a non-terminal, the summary on stdout */
  char *argv[] = {(char *)g_ingest,
                  "--model",
                  g_model,
                  "--tokenizer",
                  g_tok,
                  "--window",
                  "48",
                  "--stride",
                  "40",
                  "--sync",
                  "none",
                  "--progress-interval",
                  "0.1",
                  path_in("db-plain"),
                  (char *)corpus,
                  NULL};
  ASSERT_EQ(run(argv), 0);
  double secs = 0;
  const char *in = strstr(out, " files in ");
  ASSERT(in != NULL && sscanf(in, " files in %lf s", &secs) == 1);
  ASSERT(strstr(out, "  contexts  ") != NULL &&
         strstr(out, " stored now, 0 already stored") != NULL);
  ASSERT(strstr(out, "  KV bytes  ") != NULL && strstr(out, "ignored   1 files") != NULL);
  if (secs >= 0.5 && strstr(err, "documents (") == NULL) {
    fprintf(stderr, "no progress line in %.2f s:\n%s\n", secs, err);
    abort();
  }
  ctxlist_free(&cl);
}

/* ---- safetensors --------------------------------------------------------------------------- */

typedef struct st_tensor {
  const char *name;
  const char *dtype;
  int ndim;
  uint64_t shape[4];
  const void *data;
  size_t bytes;
  long long begin_override, end_override; /* -1: computed */
} st_tensor;

/* Write a safetensors file; metadata is raw JSON members (without braces) or NULL; a non-NULL
 * raw_header replaces the generated one. pad: bytes of spaces after the JSON. */
static void write_st(const char *path, const st_tensor *t, int n, const char *metadata,
                     const char *raw_header, int pad)
{
  char hdr[16384];
  size_t h = 0, off = 0;
  if (raw_header != NULL) {
    h = (size_t)snprintf(hdr, sizeof hdr, "%s", raw_header);
  } else {
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    if (metadata != NULL)
      h += (size_t)snprintf(hdr + h, sizeof hdr - h, "\"__metadata__\": {%s}%s", metadata,
                            n > 0 ? ", " : "");
    for (int i = 0; i < n; i++) {
      long long b = t[i].begin_override >= 0 ? t[i].begin_override : (long long)off;
      long long e = t[i].end_override >= 0 ? t[i].end_override : (long long)(off + t[i].bytes);
      h += (size_t)snprintf(hdr + h, sizeof hdr - h, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [",
                            i ? ", " : "", t[i].name, t[i].dtype);
      for (int d = 0; d < t[i].ndim; d++)
        h += (size_t)snprintf(hdr + h, sizeof hdr - h, "%s%llu", d ? ", " : "",
                              (unsigned long long)t[i].shape[d]);
      h += (size_t)snprintf(hdr + h, sizeof hdr - h, "], \"data_offsets\": [%lld, %lld]}", b, e);
      off += t[i].bytes;
    }
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
  }
  for (int i = 0; i < pad; i++)
    hdr[h++] = ' ';
  FILE *f = fopen(path, "wb");
  ASSERT(f != NULL);
  unsigned char len[8];
  for (int i = 0; i < 8; i++)
    len[i] = (unsigned char)((uint64_t)h >> (8 * i));
  fwrite(len, 1, 8, f);
  fwrite(hdr, 1, h, f);
  for (int i = 0; raw_header == NULL && i < n; i++)
    fwrite(t[i].data, 1, t[i].bytes, f);
  ASSERT(fclose(f) == 0);
}

#define ST_T 37 /* tokens */
#define ST_L 3
#define ST_H 2
#define ST_D 8

/* Value of element (kv, l, t, h, d) as f32 (exact in bf16 and f16: a multiple of 1/8 < 256). */
static float st_val(int kv, int l, int t, int h, int d)
{
  return (float)(((kv * 7 + l * 5 + t * 3 + h * 11 + d) % 200) - 100) / 8.0f;
}

static void st_store(void *buf, const char *dtype, size_t idx, float v)
{
  if (strcmp(dtype, "F32") == 0)
    memcpy((char *)buf + idx * 4, &v, 4);
  else {
    uint16_t h = strcmp(dtype, "F16") == 0 ? refkv_f32_to_f16(v) : refkv_f32_to_bf16(v);
    memcpy((char *)buf + idx * 2, &h, 2);
  }
}

/* K/V data of the forms: 0 stacked LTHD, 1 stacked LHTD, 2 per-layer [1,H,T,D], 3 per-layer
 * [H,T,D]; kv 0 = K. For per-layer forms, one layer (layer_only). */
static void *st_data(const char *dtype, int form, int kv, int layer_only, size_t *bytes)
{
  size_t es = strcmp(dtype, "F32") == 0 ? 4 : 2;
  int nl = form >= 2 ? 1 : ST_L;
  *bytes = (size_t)nl * ST_T * ST_H * ST_D * es;
  void *buf = malloc(*bytes);
  for (int li = 0; li < nl; li++) {
    int l = form >= 2 ? layer_only : li;
    for (int t = 0; t < ST_T; t++)
      for (int h = 0; h < ST_H; h++)
        for (int d = 0; d < ST_D; d++) {
          size_t idx = form == 0 ? (((size_t)li * ST_T + t) * ST_H + h) * ST_D + d
                                 : (((size_t)li * ST_H + h) * ST_T + t) * ST_D + d;
          st_store(buf, dtype, idx, st_val(kv, l, t, h, d));
        }
  }
  return buf;
}

static int32_t st_tokens[ST_T];

/* Check that DB holds the context st_tokens under id/dtype with the st_val values. */
static void st_check(const char *db, const char *id, kvdb_dtype dt)
{
  kvdb *h = open_ro(db);
  ASSERT(h != NULL);
  kvdb_model m = {id, ST_L, ST_H, ST_D, dt, 16};
  size_t es = dt == KVDB_F32 ? 4 : 2;
  size_t bytes = (size_t)ST_T * kvdb_model_token_bytes(&m);
  unsigned char *buf = malloc(bytes);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &m, ST_T, KVDB_LAYOUT_LKTHD));
  uint32_t u[ST_T];
  for (int i = 0; i < ST_T; i++)
    u[i] = (uint32_t)st_tokens[i];
  size_t hit = 0;
  ASSERT_OK(kvdb_get(h, &m, u, ST_T, &v, &hit));
  ASSERT_EQ(hit, ST_T);
  const char *dname = dt == KVDB_F32 ? "F32" : dt == KVDB_F16 ? "F16" : "BF16";
  unsigned char want[4];
  for (int l = 0; l < ST_L; l++)
    for (int kv = 0; kv < 2; kv++)
      for (int t = 0; t < ST_T; t++)
        for (int hh = 0; hh < ST_H; hh++)
          for (int d = 0; d < ST_D; d++) {
            st_store(want, dname, 0, st_val(kv, l, t, hh, d));
            size_t idx = ((((size_t)l * 2 + kv) * ST_T + t) * ST_H + hh) * ST_D + d;
            ASSERT(memcmp(buf + idx * es, want, es) == 0);
          }
  free(buf);
  kvdb_close(h);
}

/* A complete file of one form and dtype; metadata optional. */
static void st_write_form(const char *path, const char *dtype, int form, const char *metadata)
{
  st_tensor t[2 + 2 * ST_L];
  void *bufs[2 + 2 * ST_L] = {0};
  int n = 0;
  t[n++] = (st_tensor){"tokens", "I32", 1, {ST_T}, st_tokens, sizeof st_tokens, -1, -1};
  if (form < 2) {
    for (int kv = 0; kv < 2; kv++) {
      size_t bytes;
      bufs[n] = st_data(dtype, form, kv, 0, &bytes);
      t[n] = (st_tensor){
          kv ? "v" : "k", dtype, 4,  {ST_L, form ? ST_H : ST_T, form ? ST_T : ST_H, ST_D},
          bufs[n],        bytes, -1, -1};
      n++;
    }
  } else {
    static char names[2 * ST_L][64];
    for (int kv = 0; kv < 2; kv++)
      for (int l = 0; l < ST_L; l++) {
        size_t bytes;
        bufs[n] = st_data(dtype, form, kv, l, &bytes);
        char *nm = names[kv * ST_L + l];
        snprintf(nm, 64, "past_key_values.%d.%s", l, kv ? "value" : "key");
        if (form == 2)
          t[n] = (st_tensor){nm, dtype, 4, {1, ST_H, ST_T, ST_D}, bufs[n], bytes, -1, -1};
        else
          t[n] = (st_tensor){nm, dtype, 3, {ST_H, ST_T, ST_D}, bufs[n], bytes, -1, -1};
        n++;
      }
  }
  write_st(path, t, n, metadata, NULL, form == 3 ? 3 : 0); /* odd padding: unaligned data */
  for (int i = 0; i < n; i++)
    free(bufs[i]);
}

static void test_safetensors(void)
{
  for (int i = 0; i < ST_T; i++)
    st_tokens[i] = 1 + (i * 37) % 300;
  mkdir(path_in("st"), 0755);
  const char *dts[3] = {"F16", "BF16", "F32"};
  kvdb_dtype kdts[3] = {KVDB_F16, KVDB_BF16, KVDB_F32};
  for (int form = 0; form < 4; form++)
    for (int di = 0; di < 3; di++) {
      char name[64], dbn[64], id[64];
      snprintf(name, sizeof name, "st/ctx-%d-%s.safetensors", form, dts[di]);
      snprintf(dbn, sizeof dbn, "db-st-%d-%d", form, di);
      snprintf(id, sizeof id, "ext-model-%d", form);
      char *file = path_in(name), *db = path_in(dbn);
      int with_meta = (form + di) % 2;
      char meta[128];
      snprintf(meta, sizeof meta, "\"model_id\": \"%s\", \"format\": \"pt\"%s", id,
               form == 1 ? ", \"kv_layout\": \"LHTD\"" : "");
      if (form == 1 || with_meta)
        st_write_form(file, dts[di], form, meta);
      else
        st_write_form(file, dts[di], form, NULL);
      int rc = form == 1 || with_meta ? ingest(db, file, NULL)
                                      : ingest("--model-id", id, db, file, NULL);
      if (rc != 0)
        fprintf(stderr, "form %d %s: %s\n%s\n", form, dts[di], out, err);
      ASSERT_EQ(rc, 0);
      ASSERT_EQ(jnum(out, "contexts_stored"), 1);
      ASSERT_EQ(jnum(out, "tokens"), ST_T);
      st_check(db, id, kdts[di]);
      /* again: already stored */
      rc = ingest("--model-id", id, db, file, NULL);
      ASSERT_EQ(rc, 0);
      ASSERT_EQ(jnum(out, "contexts_present"), 1);
    }

  /* a compression config applies to safetensors contexts too */
  {
    char *file = path_in("st/ctx-0-F16.safetensors"), *db = path_in("db-st-lossless");
    ASSERT_EQ(ingest("--model-id", "ext-model-0", "--config", "lossless", db, file, NULL), 0);
    ASSERT_EQ(jnum(out, "contexts_stored"), 1);
    st_check(db, "ext-model-0", KVDB_F16);
    ASSERT_EQ(check_configs(db, "lossless", 1, 0), 1); /* profiled by default, no queries */
  }

  /* malformed files: each refused, naming what is wrong */
  size_t kb;
  void *k16 = st_data("F16", 0, 0, 0, &kb), *v16 = st_data("F16", 0, 1, 0, &kb);
  void *v32 = st_data("F32", 0, 1, 0, &kb);
  size_t kb32 = kb;
  kb = (size_t)ST_L * ST_T * ST_H * ST_D * 2;
  int32_t neg[ST_T];
  memcpy(neg, st_tokens, sizeof neg);
  neg[5] = -3;
  st_tensor tok = {"tokens", "I32", 1, {ST_T}, st_tokens, sizeof st_tokens, -1, -1};
  st_tensor k = {"k", "F16", 4, {ST_L, ST_T, ST_H, ST_D}, k16, kb, -1, -1};
  st_tensor v = {"v", "F16", 4, {ST_L, ST_T, ST_H, ST_D}, v16, kb, -1, -1};
  struct {
    const char *what;
    st_tensor t[4];
    int n;
    const char *meta, *raw;
    const char *want;
  } bad[] = {
      {"no tokens", {k, v}, 2, NULL, NULL, "no 'tokens' tensor"},
      {"tokens F32",
       {{"tokens", "F32", 1, {ST_T}, st_tokens, sizeof st_tokens, -1, -1}, k, v},
       3,
       NULL,
       NULL,
       "tensor 'tokens' has dtype F32, expected I32"},
      {"negative token",
       {{"tokens", "I32", 1, {ST_T}, neg, sizeof neg, -1, -1}, k, v},
       3,
       NULL,
       NULL,
       "token 5 is negative (-3)"},
      {"no K/V", {tok}, 1, NULL, NULL, "no K/V tensors"},
      {"k without v", {tok, k}, 2, NULL, NULL, "tensor 'k' without 'v'"},
      {"wrong T",
       {tok,
        {"k",
         "F16",
         4,
         {ST_L, ST_T - 1, ST_H + 0, ST_D},
         k16,
         kb - (size_t)ST_L * ST_H * ST_D * 2,
         -1,
         -1},
        v},
       3,
       NULL,
       NULL,
       "tensor 'k' has shape [3, 36, 2, 8], expected [3, 37, 2, 8]"},
      {"size mismatch",
       {tok, {"k", "F16", 4, {ST_L, ST_T, ST_H, ST_D}, k16, kb - 2, -1, -1}, v},
       3,
       NULL,
       NULL,
       "F16 [3, 37, 2, 8] needs 3552 bytes, data_offsets give 3550"},
      {"offsets outside",
       {tok,
        k,
        {"v", "F16", 4, {ST_L, ST_T, ST_H, ST_D}, v16, kb, (long long)kb * 2, (long long)kb * 3}},
       3,
       NULL,
       NULL,
       "are not inside the"},
      {"dtypes differ",
       {tok, k, {"v", "F32", 4, {ST_L, ST_T, ST_H, ST_D}, v32, kb32, -1, -1}},
       3,
       NULL,
       NULL,
       "must share one dtype"},
      {"I8 K",
       {tok, {"k", "I8", 4, {ST_L, ST_T, ST_H, ST_D}, k16, kb / 2, -1, -1}, v},
       3,
       NULL,
       NULL,
       "K and V must be F16, BF16 or F32"},
      {"missing layer",
       {tok,
        {"past_key_values.0.key", "F16", 3, {ST_H, ST_T, ST_D}, k16, kb / 3, -1, -1},
        {"past_key_values.0.value", "F16", 3, {ST_H, ST_T, ST_D}, v16, kb / 3, -1, -1},
        {"past_key_values.1.key", "F16", 3, {ST_H, ST_T, ST_D}, k16, kb / 3, -1, -1}},
       4,
       NULL,
       NULL,
       "'past_key_values.1.value' is missing"},
      {"both forms",
       {tok, k, v, {"past_key_values.0.key", "F16", 3, {ST_H, ST_T, ST_D}, k16, kb / 3, -1, -1}},
       4,
       NULL,
       NULL,
       "use one form"},
      {"bad layout", {tok, k, v}, 3, "\"kv_layout\": \"XYZ\"", NULL, "'XYZ' is not LTHD or LHTD"},
      {"no model id", {tok, k, v}, 3, "", NULL, "no model id"},
      {"not JSON",
       {tok},
       0,
       NULL,
       "{\"tokens\": {\"dtype\": \"I32\",, }",
       "header is not valid JSON: line 1, column 28: string or '}' expected near ','"},
      {"array header", {tok}, 0, NULL, "[1, 2, 3]", "header is a JSON array, not an object"},
      {"duplicate", {tok, k, k, v}, 4, NULL, NULL, "duplicate object key near '\"k\"'"},
      {"shape not ints",
       {tok},
       0,
       NULL,
       "{\"tokens\": {\"dtype\": \"I32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}",
       "shape[0] is not a non-negative integer"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *file = path_in("st-bad.safetensors");
    write_st(file, bad[i].t, bad[i].n, bad[i].meta, bad[i].raw, 0);
    int rc = strcmp(bad[i].what, "no model id") == 0
                 ? ingest(path_in("db-st-bad"), (char *)file, NULL)
                 : ingest("--model-id", "x", path_in("db-st-bad"), (char *)file, NULL);
    if (rc != 1 || strstr(err, bad[i].want) == NULL || strstr(err, "st-bad.safetensors") == NULL) {
      fprintf(stderr, "malformed case '%s': exit %d, stderr: %s\n", bad[i].what, rc, err);
      abort();
    }
    ASSERT(strstr(out, "\"ok\":false") != NULL);
  }
  /* raw byte-level damage */
  const char *file = path_in("st-raw.safetensors");
  write_file(file, "\x05\0\0\0\0", 5);
  expect_fail(ingest("--model-id", "x", path_in("db-st-bad"), (char *)file, NULL), 1,
              "truncated: 5 bytes");
  write_file(file, "\0\0\0\0\0\1\0\0{}", 10);
  expect_fail(ingest("--model-id", "x", path_in("db-st-bad"), (char *)file, NULL), 1,
              "header length 1099511627776 is outside");
  write_file(file, "\x40\0\0\0\0\0\0\0{}", 10);
  expect_fail(ingest("--model-id", "x", path_in("db-st-bad"), (char *)file, NULL), 1,
              "truncated: the header says 64 bytes, the file has 2");
  /* nothing of the refused files was stored */
  ASSERT_EQ(n_contexts(path_in("db-st-bad")), 0);
  free(k16);
  free(v16);
  free(v32);
}

/* ---- bad options and inputs ---------------------------------------------------------------- */

static void test_errors(void)
{
  const char *db = path_in("db-err");
  char *argv0[] = {(char *)g_ingest, NULL};
  expect_fail(run(argv0), 2, "no database directory and no input");
  expect_fail(ingest((char *)db, path_in("nonexistent.txt"), NULL), 1,
              "nonexistent.txt': No such file or directory");
  ASSERT(strstr(out, "\"ok\":false") != NULL && strstr(out, "\"error\":") != NULL);
  write_file(path_in("x.csv"), "a,b\n", 4);
  expect_fail(ingest((char *)db, path_in("x.csv"), NULL), 1, "unknown kind of file");
  mkdir(path_in("empty-dir"), 0755);
  expect_fail(ingest((char *)db, path_in("empty-dir"), NULL), 1,
              "no .txt, .jsonl or .safetensors files");

  const char *jl = path_in("bad.jsonl");
  struct {
    const char *text, *want;
  } rows[] = {
      {"{\"text\": \"ok\"}\n\n{\"text\": \"a\" \"b\"}\n",
       "bad.jsonl' line 3: not valid JSON: line 1, column 16: '}' expected near '\"b\"'"},
      {"{\"body\": \"x\"}\n", "line 1: no \"text\" member"},
      {"{\"text\": 42}\n", "line 1: \"text\" is a JSON number, expected a string"},
      {"[\"text\"]\n", "line 1: a JSON array, expected an object"},
      {"{\"text\": \"x\\q\"}\n", "line 1, column 13: invalid escape near '\"x\\q'"},
      {"{\"text\": \"unterminated}\n", "premature end of input near '\"unterminated}'"},
      {"{\"text\": \"a\", \"text\": \"b\"}\n", "line 1, column 20: duplicate object key near '\"text\"'"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    write_file(jl, rows[i].text, strlen(rows[i].text));
    expect_fail(ingest("--model", g_model, "--tokenizer", g_tok, (char *)db, (char *)jl, NULL), 1,
                rows[i].want);
  }
  /* --text-field picks another member */
  write_file(jl, "{\"body\": \"Tim ran.\"}\n", 21);
  ASSERT_EQ(ingest("--model", g_model, "--tokenizer", g_tok, "--text-field", "body", (char *)db,
                   (char *)jl, NULL),
            0);
  ASSERT_EQ(jnum(out, "contexts_stored"), 1);

  const char *txt = path_in("corpus/a.txt");
  expect_fail(ingest("--model", g_model, "--tokenizer", g_tok, "--window", "1000", (char *)db,
                     (char *)txt, NULL),
              1, "--window 1000: must be 2..128");
  expect_fail(ingest("--model", g_model, "--tokenizer", g_tok, "--window", "48", "--stride", "48",
                     (char *)db, (char *)txt, NULL),
              1, "--stride 48: must be 1..47");
  expect_fail(ingest("--stride", "0", (char *)db, (char *)txt, NULL), 2,
              "--stride '0': expected a whole number from 1");
  expect_fail(ingest("--storage", "q4", (char *)db, (char *)txt, NULL), 2,
              "unknown storage 'q4' (expected f32, f16 or bf16)");
  expect_fail(ingest("--block-tokens", "24", (char *)db, (char *)txt, NULL), 2,
              "--block-tokens 24: must be a power of two");
  expect_fail(ingest("--model", g_model, (char *)db, (char *)txt, NULL), 2,
              "--model needs --tokenizer");
  expect_fail(ingest("--bogus", (char *)db, (char *)txt, NULL), 2,
              "unknown option or missing value: '--bogus'");
  /* a truncated checkpoint and a tokenizer of another vocabulary */
  size_t mlen;
  char *mbytes = read_file(g_model, &mlen);
  write_file(path_in("short.bin"), mbytes, mlen - 7);
  free(mbytes);
  expect_fail(
      ingest("--model", path_in("short.bin"), "--tokenizer", g_tok, (char *)db, (char *)txt, NULL),
      1, "model: REFMODEL_ETRUNCATED");
  write_file(path_in("tok-small.bin"), "\7\0\0\0\0\0\0\0\1\0\0\0a", 13);
  expect_fail(ingest("--model", g_model, "--tokenizer", path_in("tok-small.bin"), (char *)db,
                     (char *)txt, NULL),
              1, "tokenizer: REFMODEL_ETRUNCATED");
  /* stored: the row before the bad line 3 (kept: a rerun after fixing the file resumes) and the
   * --text-field run; nothing from the runs refused before they started */
  ASSERT_EQ(n_contexts(db), 2);
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: test_ingest KVDB_INGEST KVDB_DEMO\n");
    return 2;
  }
  g_ingest = argv[1];
  g_demo = argv[2];
  g_dir = t_tmpdir("ingest");
  snprintf(g_model, sizeof g_model, "%s/tiny.bin", g_dir);
  snprintf(g_tok, sizeof g_tok, "%s/tok.bin", g_dir);
  ASSERT(tm_write_model(g_model, 3) == 0 && tm_write_tokenizer(g_tok) == 0);
  ASSERT(refmodel_model_load(g_model, &g_rm) == REFMODEL_OK);
  ASSERT(refmodel_tokenizer_load(g_tok, TM_VOCAB, &g_tk) == REFMODEL_OK);

  test_text();
  printf("  text ingest: ok\n");
  test_kill_resume();
  printf("  kill and resume: ok\n");
  test_configs();
  printf("  configs and quality: ok\n");
  test_safetensors();
  printf("  safetensors: ok\n");
  test_errors();
  printf("  errors: ok\n");

  refmodel_tokenizer_free(g_tk);
  refmodel_model_free(g_rm);
  free(out);
  free(err);
  paths_free();
  t_rmdir(g_dir);
  printf("test_ingest: ok\n");
  return T_EXIT_PASS;
}
