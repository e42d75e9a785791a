/* SPDX-License-Identifier: MIT */
/*
 * tools/kvdb-admin/kvdb_admin.c — kvdb-admin, the operator tool: info, ls, show, verify,
 * compact, and the placement's rebalance, stats and probe on a database directory. Manual:
 * kvdb-admin.1.md beside this file.
 *
 * It uses only the public header kvdb.h, so it also shows that the public API is enough to
 * run a database. info, ls, show and verify (without --repair) open the database with
 * KVDB_O_RDONLY: they work on read-only media and never write. compact and verify --repair
 * open it read-write but never create one.
 * The tool holds no DRAM tier (options.dram_bytes = 0): it reads each block once.
 *
 * OUTPUT
 *   Results go to stdout; errors, warnings and the progress bar to stderr. With --json every
 *   run that gets past argument parsing prints exactly one JSON object on stdout, also when
 *   it fails (then with an "error" member), so a script can always parse stdout.
 *   The progress bar is drawn only when stderr is a terminal and -q is not given.
 *
 * EXIT STATUS
 *   0 ok, 1 error (kvdb status named on stderr), 2 usage error, 3 corruption found (verify).
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvdb.h"

#include "admin_metrics.h"
#include "admin_out.h"

#if defined(__GNUC__)
#define ADMIN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ADMIN_PRINTF(f, a)
#endif

enum { EXIT_OKAY = 0, EXIT_ERROR = 1, EXIT_USAGE = 2, EXIT_CORRUPT = 3 };

#define PROG "kvdb-admin"
#define KEY_PREFIX_MIN 8    /* hex digits of the shortest key prefix `show` accepts */
#define AMBIGUOUS_LIST 4    /* candidates named when a key prefix is ambiguous */
#define LABEL_WIDTH 18      /* label column of key-value output */

struct command;

/* The parsed command line. */
typedef struct cli {
  const struct command *cmd;
  const char *pos[2];
  int n_pos;
  int json;
  int quiet;
  int have_threshold;
  double threshold;
  int dry_run; /* rebalance --dry-run, verify --repair --dry-run */
  int repair;  /* verify --repair */
  uint64_t step_moves; /* rebalance --step N (moves per kvdb_rebalance_step) */
  const char *metrics_addr; /* serve --metrics ADDR */
  const char *remote_addr;  /* rebalance --remote ADDR */
  const char *remote_ns;    /* rebalance --remote-namespace NS */
} cli;

typedef struct command {
  const char *name;
  const char *args;    /* synopsis after the name */
  int n_pos;           /* positional arguments it takes */
  const char *summary; /* one line for the general help */
  const char *help;    /* the paragraph of `COMMAND --help` */
  int (*run)(const cli *c);
} command;

/* One run of a command: the JSON document under construction and the open handle. */
typedef struct run {
  const cli *c;
  jw j;
  kvdb *db;
} run;

static progress *g_bar; /* the bar on screen, erased before a log line is printed */

/* ---- errors ------------------------------------------------------------------------------- */

/*
 * Report a failure: "kvdb-admin: KVDB_X: message" on stderr and, with --json, an "error"
 * member closing the document. Returns EXIT_ERROR. `fmt` may use kvdb_errmsg(): it is
 * formatted before anything else is called.
 */
static int fail(run *r, kvdb_status st, const char *fmt, ...) ADMIN_PRINTF(3, 4);
static int fail(run *r, kvdb_status st, const char *fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (msg[0] == 0)
    snprintf(msg, sizeof msg, "%s", kvdb_strerror(st));
  if (g_bar != NULL)
    progress_clear(g_bar);
  fprintf(stderr, "%s: %s: %s\n", PROG, kvdb_status_name(st), msg);
  if (r->c->json && r->j.depth > 0) {
    jw_unwind(&r->j, 1);
    jw_obj(&r->j, "error");
    jw_str(&r->j, "status", kvdb_status_name(st));
    jw_u64(&r->j, "code", (uint64_t)st);
    jw_str(&r->j, "message", msg);
    jw_unwind(&r->j, 0);
  }
  return EXIT_ERROR;
}

/* fail() with the message of the kvdb call that just failed. */
static int fail_kv(run *r, kvdb_status st)
{
  return fail(r, st, "%s", kvdb_errmsg());
}

static void print_usage(FILE *f);
static void print_command_help(FILE *f, const command *cmd);

/* A usage error: the message, then the usage text, on stderr. Returns EXIT_USAGE. */
static int usage_error(const command *cmd, const char *fmt, ...) ADMIN_PRINTF(2, 3);
static int usage_error(const command *cmd, const char *fmt, ...)
{
  va_list ap;
  fprintf(stderr, "%s: ", PROG);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n\n", stderr);
  if (cmd != NULL)
    print_command_help(stderr, cmd);
  else
    print_usage(stderr);
  return EXIT_USAGE;
}

/* Engine log lines (e.g. "O_DIRECT is not supported ... using buffered I/O"): errors always,
 * warnings unless -q. */
static void on_log(void *ctx, int level, const char *msg)
{
  const cli *c = ctx;
  if (level > 0 && c->quiet)
    return;
  if (g_bar != NULL)
    progress_clear(g_bar);
  fprintf(stderr, "%s: %s: %s\n", PROG, level == 0 ? "error" : level == 1 ? "warning" : "info",
          msg);
}

/* ---- common pieces ------------------------------------------------------------------------ */

static const char *tier_name(uint32_t t)
{
  switch (t) {
  case KVDB_TIER_DRAM: return "dram";
  case KVDB_TIER_SSD: return "ssd";
  case KVDB_TIER_SMARTSSD: return "smartssd";
  case KVDB_TIER_REMOTE: return "remote";
  default: return "unknown";
  }
}

/* Start the run: with --json, the document and the members every command has. */
static void begin(run *r, const cli *c)
{
  memset(r, 0, sizeof *r);
  r->c = c;
  jw_init(&r->j, stdout);
  if (c->json) {
    jw_obj(&r->j, NULL);
    jw_str(&r->j, "command", c->cmd->name);
    jw_str(&r->j, "database", c->pos[0]);
  }
}

/* End the run: close the document and the handle; a failed write to stdout is an error. */
static int finish(run *r, int code)
{
  if (r->c->json)
    jw_unwind(&r->j, 0);
  kvdb_close(r->db);
  r->db = NULL;
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "%s: cannot write to standard output: %s\n", PROG, strerror(errno));
    return code == EXIT_OKAY ? EXIT_ERROR : code;
  }
  return code;
}

/* Open the database of the run. Read-only unless `write`; never creates one. */
static kvdb_status open_db(run *r, int write)
{
  kvdb_options opt;
  kvdb_options_init(&opt);
  opt.flags = write ? 0u : (uint32_t)KVDB_O_RDONLY;
  opt.dram_bytes = 0;
  opt.log_fn = on_log;
  opt.log_ctx = (void *)r->c;
  opt.log_level = 1;
  opt.remote_addr = r->c->remote_addr; /* rebalance: the remote tier in the plan's model */
  opt.remote_namespace = r->c->remote_ns;
  return kvdb_open(r->c->pos[0], &opt, &r->db);
}

static void kv_line(const char *label, const char *fmt, ...) ADMIN_PRINTF(2, 3);
static void kv_line(const char *label, const char *fmt, ...)
{
  va_list ap;
  printf("%-*s  ", LABEL_WIDTH, label);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fputc('\n', stdout);
}

/* "108.0 KiB (110592 bytes)" */
static char *size_exact(uint64_t bytes, char *buf, size_t cap)
{
  char h[32];
  if (bytes < 1024)
    snprintf(buf, cap, "%" PRIu64 " B", bytes);
  else
    snprintf(buf, cap, "%s (%" PRIu64 " bytes)", fmt_size(bytes, h, sizeof h), bytes);
  return buf;
}

static void json_time(jw *j, const char *key, uint64_t unix_ms)
{
  char t[40];
  if (unix_ms == 0)
    jw_null(j, key);
  else
    jw_str(j, key, fmt_time(unix_ms, 1, t, sizeof t));
}

static void json_context(jw *j, const char *key, const kvdb_context_info *ci)
{
  char hx[33];
  jw_obj(j, key);
  jw_str(j, "key", kvdb_key_hex(&ci->key, hx));
  jw_str(j, "model", ci->model_id);
  jw_u64(j, "tokens", ci->n_tokens);
  jw_u64(j, "blocks", ci->n_blocks);
  jw_u64(j, "bytes", ci->bytes);
  jw_str(j, "tier", tier_name(ci->tier));
  json_time(j, "created", ci->created_unix_ms);
  jw_u64(j, "created_unix_ms", ci->created_unix_ms);
  json_time(j, "last_access", ci->last_access_unix_ms);
  jw_u64(j, "last_access_unix_ms", ci->last_access_unix_ms);
  jw_bool(j, "explicit_key", ci->explicit_key != 0);
  char cfg[48];
  jw_str(j, "config", kvdb_config_name(&ci->config, cfg, sizeof cfg));
  jw_bool(j, "has_profile", ci->has_profile != 0);
  jw_u64(j, "score_bits", ci->score_bits);
  jw_u64(j, "score_versions", ci->score_versions); /* bit 0: version 1, bit 1: version 2 */
  jw_end(j);
}

/* "version 2 (centered, rotated)", "version 1", "versions 1 and 2", or "none". */
static const char *score_versions_text(uint32_t v, char *buf, size_t cap)
{
  snprintf(buf, cap, "%s",
           v == 1   ? "version 1 (plain)"
           : v == 2 ? "version 2 (centered, Hadamard-rotated)"
           : v == 3 ? "versions 1 (older blocks) and 2"
                    : "none");
  return buf;
}

/* "8 (int8 key copies for kvdb_score)" or "0 (none)". */
static const char *score_text(uint32_t bits, char *buf, size_t cap)
{
  if (bits == 0)
    snprintf(buf, cap, "0 (no score copies)");
  else
    snprintf(buf, cap, "%" PRIu32 " (int%" PRIu32 " key copies for kvdb_score)", bits, bits);
  return buf;
}

/* ---- info --------------------------------------------------------------------------------- */

/* ---- what compaction leaves and what it would reclaim (info, compact) ---------------------- */

typedef struct seg_list {
  kvdb_segment_info *s;
  size_t n;
} seg_list;

static kvdb_status seg_load(kvdb *db, seg_list *l)
{
  l->s = NULL;
  l->n = 0;
  size_t n = 0;
  for (int tries = 0; tries < 4; tries++) { /* another process may add segments meanwhile */
    kvdb_status st = kvdb_segments(db, NULL, 0, &n);
    if (st != KVDB_OK)
      return st;
    kvdb_segment_info *s = calloc(n + 16, sizeof *s);
    if (s == NULL)
      return KVDB_NOMEM;
    size_t got = 0;
    st = kvdb_segments(db, s, n + 16, &got);
    if (st != KVDB_OK) {
      free(s);
      return st;
    }
    if (got <= n + 16) {
      l->s = s;
      l->n = got;
      return KVDB_OK;
    }
    free(s);
  }
  return KVDB_BUSY;
}

/* What kvdb_compact(t) would do to tier `tier` (-1: all): segments rewritten, live bytes
 * moved, bytes reclaimed (each file's bytes less its live bytes). */
typedef struct comp_at {
  uint64_t segs, moved, reclaim;
} comp_at;

static comp_at comp_plan(const seg_list *l, int tier, double t)
{
  comp_at a = {0, 0, 0};
  for (size_t i = 0; i < l->n; i++) {
    const kvdb_segment_info *g = &l->s[i];
    if ((tier >= 0 && g->tier != (uint32_t)tier) || !g->sealed || g->bytes == 0 ||
        !((double)g->live_bytes < t * (double)g->bytes))
      continue;
    a.segs++;
    a.moved += g->live_bytes;
    a.reclaim += g->bytes - g->live_bytes;
  }
  return a;
}

static int cmp_frac(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The smallest threshold (3 decimals, rounded up) at which kvdb_compact reclaims at least
 * `part` of the dead bytes of sealed segments; 0 when there are none. */
static double thr_for(const seg_list *l, double part)
{
  double *f = calloc(l->n + 1, 2 * sizeof *f);
  if (f == NULL)
    return 0;
  size_t m = 0;
  uint64_t dead = 0;
  for (size_t i = 0; i < l->n; i++) {
    const kvdb_segment_info *g = &l->s[i];
    if (!g->sealed || g->bytes == 0 || g->live_bytes >= g->bytes)
      continue;
    f[2 * m] = (double)g->live_bytes / (double)g->bytes;
    f[2 * m + 1] = (double)(g->bytes - g->live_bytes);
    dead += g->bytes - g->live_bytes;
    m++;
  }
  qsort(f, m, 2 * sizeof *f, cmp_frac);
  double acc = 0, t = 0;
  for (size_t i = 0; i < m && dead > 0; i++) {
    acc += f[2 * i + 1];
    if (acc >= part * (double)dead) {
      t = floor(f[2 * i] * 1000.0 + 1.0) / 1000.0; /* strictly above its live fraction */
      break;
    }
  }
  free(f);
  return t > 1 ? 1 : t;
}

static const double comp_thr[] = {0.25, 0.5, 0.75, 0.9, 1.0};
#define N_COMP_THR (sizeof comp_thr / sizeof comp_thr[0])

/* info: dead bytes per tier, sealed segments by live fraction, what each threshold reclaims */
static void print_compaction(const cli *c, run *r, const seg_list *l)
{
  uint64_t dead[KVDB_TIER_COUNT] = {0}, dead_open[KVDB_TIER_COUNT] = {0};
  uint64_t bucket[KVDB_TIER_COUNT][4] = {{0}}, open_n[KVDB_TIER_COUNT] = {0};
  for (size_t i = 0; i < l->n; i++) {
    const kvdb_segment_info *g = &l->s[i];
    uint32_t t = g->tier < KVDB_TIER_COUNT ? g->tier : KVDB_TIER_SSD;
    uint64_t d = g->bytes > g->live_bytes ? g->bytes - g->live_bytes : 0;
    if (!g->sealed) {
      open_n[t]++;
      dead_open[t] += d;
      continue;
    }
    dead[t] += d;
    double f = g->bytes ? (double)g->live_bytes / (double)g->bytes : 1.0;
    bucket[t][f < 0.25 ? 0 : f < 0.5 ? 1 : f < 0.75 ? 2 : 3]++;
  }
  double t50 = thr_for(l, 0.5), t90 = thr_for(l, 0.9), t100 = thr_for(l, 1.0);
  if (c->json) {
    jw *j = &r->j;
    jw_obj(j, "compaction");
    jw_obj(j, "tiers");
    for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++) {
      jw_obj(j, tier_name(t));
      jw_u64(j, "dead_bytes_sealed", dead[t]);
      jw_u64(j, "dead_bytes_open", dead_open[t]);
      jw_u64(j, "open_segments", open_n[t]);
      jw_u64(j, "sealed_live_under_25pct", bucket[t][0]);
      jw_u64(j, "sealed_live_25_50pct", bucket[t][1]);
      jw_u64(j, "sealed_live_50_75pct", bucket[t][2]);
      jw_u64(j, "sealed_live_75pct_up", bucket[t][3]);
      jw_end(j);
    }
    jw_end(j);
    jw_arr(j, "at_threshold");
    for (size_t k = 0; k < N_COMP_THR; k++) {
      comp_at a = comp_plan(l, -1, comp_thr[k]);
      jw_obj(j, NULL);
      jw_num(j, "threshold", comp_thr[k]);
      jw_u64(j, "segments", a.segs);
      jw_u64(j, "bytes_moved", a.moved);
      jw_u64(j, "bytes_reclaimed", a.reclaim);
      jw_end(j);
    }
    jw_end(j);
    jw_num(j, "threshold_for_half_the_dead_bytes", t50);
    jw_num(j, "threshold_for_90pct_of_the_dead_bytes", t90);
    jw_num(j, "threshold_for_all_the_dead_bytes", t100);
    jw_end(j);
    return;
  }
  char b[32], b2[32];
  printf("\nCOMPACTION (sealed segments by live fraction; open ones are being appended to)\n");
  printf("%-9s  %10s  %6s  %6s  %6s  %6s  %10s  %10s\n", "TIER", "DEAD", "<25%", "25-50%",
         "50-75%", ">=75%", "OPEN SEGS", "OPEN DEAD");
  for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++)
    printf("%-9s  %10s  %6" PRIu64 "  %6" PRIu64 "  %6" PRIu64 "  %6" PRIu64 "  %10" PRIu64
           "  %10s\n", tier_name(t), fmt_size(dead[t], b, sizeof b), bucket[t][0], bucket[t][1],
           bucket[t][2], bucket[t][3], open_n[t], fmt_size(dead_open[t], b2, sizeof b2));
  for (size_t k = 0; k < N_COMP_THR; k++) {
    comp_at a = comp_plan(l, -1, comp_thr[k]);
    char lab[48];
    snprintf(lab, sizeof lab, "at threshold %g", comp_thr[k]);
    kv_line(lab, "rewrites %" PRIu64 " segments, moves %s, reclaims %s%s", a.segs,
            fmt_size(a.moved, b, sizeof b), fmt_size(a.reclaim, b2, sizeof b2),
            comp_thr[k] == 0.5 ? " (the default)" : "");
  }
  if (t100 > 0)
    kv_line("to reclaim", "half the dead bytes: --threshold %.3g; 90%%: %.3g; all: %.3g", t50, t90,
            t100);
}

static int cmd_info(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 0);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_stats s;
  st = kvdb_stat(r.db, &s);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  uint64_t dead = s.segment_file_bytes > s.live_bytes ? s.segment_file_bytes - s.live_bytes : 0;
  double dead_frac = s.segment_file_bytes > 0 ? (double)dead / (double)s.segment_file_bytes : 0.0;
  /* contexts by their model's score_bits (kvdb_score copies): 0, 4, 8 */
  uint64_t by_bits[3] = {0, 0, 0};
  kvdb_iter *it;
  st = kvdb_iter_open(r.db, &it);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  for (;;) {
    kvdb_context_info ci;
    st = kvdb_iter_next(it, &ci);
    if (st == KVDB_NOTFOUND)
      break;
    if (st != KVDB_OK) {
      kvdb_iter_close(it);
      return finish(&r, fail_kv(&r, st));
    }
    by_bits[ci.score_bits == 8 ? 2 : ci.score_bits == 4 ? 1 : 0]++;
  }
  kvdb_iter_close(it);
  seg_list segs;
  st = seg_load(r.db, &segs);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));

  if (c->json) {
    jw *j = &r.j;
    jw_u64(j, "format_version", s.format_version);
    jw_u64(j, "models", s.n_models);
    jw_u64(j, "contexts", s.n_contexts);
    jw_u64(j, "blocks", s.n_blocks);
    jw_u64(j, "segments", s.n_segments);
    jw_u64(j, "segment_file_bytes", s.segment_file_bytes);
    jw_u64(j, "live_bytes", s.live_bytes);
    jw_u64(j, "dead_bytes", dead);
    jw_num(j, "dead_fraction", dead_frac);
    jw_u64(j, "catalog_bytes", s.catalog_bytes);
    jw_bool(j, "direct_io", s.direct_io);
    jw_bool(j, "io_uring", s.io_uring);
    jw_obj(j, "score_bits_contexts"); /* contexts by their model's score_bits */
    jw_u64(j, "0", by_bits[0]);
    jw_u64(j, "4", by_bits[1]);
    jw_u64(j, "8", by_bits[2]);
    jw_end(j);
    jw_obj(j, "tiers");
    for (int t = 0; t < KVDB_TIER_COUNT; t++) {
      jw_obj(j, tier_name((uint32_t)t));
      jw_u64(j, "capacity_bytes", s.tier[t].capacity_bytes);
      jw_u64(j, "bytes", s.tier[t].bytes);
      jw_u64(j, "blocks", s.tier[t].blocks);
      jw_u64(j, "contexts", s.tier[t].contexts);
      jw_end(j);
    }
    jw_end(j);
    print_compaction(c, &r, &segs);
    free(segs.s);
    return finish(&r, EXIT_OKAY);
  }

  char b[64], path[512];
  kv_line("database", "%s", safe_text(c->pos[0], path, sizeof path));
  kv_line("format version", "%" PRIu32, s.format_version);
  kv_line("models", "%" PRIu32, s.n_models);
  kv_line("contexts", "%" PRIu64, s.n_contexts);
  kv_line("score copies", "%" PRIu64 " contexts int8 (score_bits 8), %" PRIu64 " int4, %" PRIu64
          " none", by_bits[2], by_bits[1], by_bits[0]);
  kv_line("blocks", "%" PRIu64, s.n_blocks);
  kv_line("segments", "%" PRIu64, s.n_segments);
  kv_line("segment files", "%s", size_exact(s.segment_file_bytes, b, sizeof b));
  kv_line("live bytes", "%s", size_exact(s.live_bytes, b, sizeof b));
  kv_line("dead bytes", "%s, %.1f%% of segment files", size_exact(dead, b, sizeof b),
          dead_frac * 100.0);
  kv_line("catalog", "%s", size_exact(s.catalog_bytes, b, sizeof b));
  kv_line("direct I/O", "%s", s.direct_io ? "yes (O_DIRECT)" : "no (buffered)");
  kv_line("io_uring", "%s", s.io_uring ? "yes" : "no (pread/pwrite)");
  printf("\n%-9s  %-10s  %10s  %10s  %10s\n", "TIER", "CAPACITY", "BYTES", "BLOCKS", "CONTEXTS");
  for (int t = 0; t < KVDB_TIER_COUNT; t++) {
    const kvdb_tier_stats *ts = &s.tier[t];
    char cap[32], by[32];
    if (ts->capacity_bytes > 0)
      fmt_size(ts->capacity_bytes, cap, sizeof cap);
    else /* 0 means: DRAM tier off in this tool, SSD unlimited, SmartSSD absent */
      snprintf(cap, sizeof cap, "%s",
               t == KVDB_TIER_DRAM ? "off" : t == KVDB_TIER_SSD ? "unlimited" : "-");
    printf("%-9s  %-10s  %10s  %10" PRIu64 "  %10" PRIu64 "\n", tier_name((uint32_t)t), cap,
           fmt_size(ts->bytes, by, sizeof by), ts->blocks, ts->contexts);
  }
  print_compaction(c, &r, &segs);
  free(segs.s);
  return finish(&r, EXIT_OKAY);
}

/* ---- ls ----------------------------------------------------------------------------------- */

/* The cells of one row of the human table. */
enum { COL_KEY, COL_MODEL, COL_TOKENS, COL_BLOCKS, COL_SIZE, COL_TIER, COL_CREATED, COL_ACCESS,
       COL_EXPLICIT, COL_CONFIG, N_COLS };
static const char *const col_head[N_COLS] = {"KEY", "MODEL", "TOKENS", "BLOCKS", "SIZE", "TIER",
                                             "CREATED", "LAST ACCESS", "EXPLICIT", "CONFIG"};
static const int col_right[N_COLS] = {0, 0, 1, 1, 1, 0, 0, 0, 0, 0};

static void row_cells(const kvdb_context_info *ci, char cell[N_COLS][80])
{
  char hx[33];
  snprintf(cell[COL_KEY], 80, "%s", kvdb_key_hex(&ci->key, hx));
  safe_text(ci->model_id, cell[COL_MODEL], 80);
  snprintf(cell[COL_TOKENS], 80, "%" PRIu64, ci->n_tokens);
  snprintf(cell[COL_BLOCKS], 80, "%" PRIu32, ci->n_blocks);
  fmt_size(ci->bytes, cell[COL_SIZE], 80);
  snprintf(cell[COL_TIER], 80, "%s", tier_name(ci->tier));
  fmt_time(ci->created_unix_ms, 0, cell[COL_CREATED], 80);
  fmt_time(ci->last_access_unix_ms, 0, cell[COL_ACCESS], 80);
  snprintf(cell[COL_EXPLICIT], 80, "%s", ci->explicit_key ? "yes" : "no");
  kvdb_config_name(&ci->config, cell[COL_CONFIG], 80);
}

static void print_row(char cell[N_COLS][80], const int *width)
{
  for (int k = 0; k < N_COLS; k++) {
    int last = k == N_COLS - 1;
    if (col_right[k])
      printf("%*s", width[k], cell[k]);
    else
      printf("%-*s", last ? 0 : width[k], cell[k]);
    fputs(last ? "\n" : "  ", stdout);
  }
}

static int cmd_ls(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 0);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_iter *it;
  st = kvdb_iter_open(r.db, &it);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  /* The human table is aligned, so it is kept until every width is known; --json and -q
   * stream. */
  int keep = !c->json && !c->quiet;
  kvdb_context_info *rows = NULL;
  size_t n = 0, cap = 0;
  uint64_t total_bytes = 0;
  int code = EXIT_OKAY;
  if (c->json)
    jw_arr(&r.j, "contexts");
  for (;;) {
    kvdb_context_info ci;
    st = kvdb_iter_next(it, &ci);
    if (st == KVDB_NOTFOUND)
      break;
    if (st != KVDB_OK) {
      code = fail_kv(&r, st);
      break;
    }
    total_bytes += ci.bytes;
    if (c->json) {
      json_context(&r.j, NULL, &ci);
    } else if (c->quiet) {
      char hx[33];
      puts(kvdb_key_hex(&ci.key, hx));
    } else {
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 256;
        kvdb_context_info *nr = realloc(rows, ncap * sizeof *nr);
        if (nr == NULL) {
          code = fail(&r, KVDB_NOMEM, "cannot hold %zu contexts for the table (try --json)", ncap);
          break;
        }
        rows = nr;
        cap = ncap;
      }
      rows[n] = ci;
    }
    n++;
  }
  kvdb_iter_close(it);
  if (code == EXIT_OKAY && c->json) {
    jw_end(&r.j);
    jw_u64(&r.j, "count", n);
    jw_u64(&r.j, "bytes", total_bytes);
  }
  if (code == EXIT_OKAY && keep) {
    static char cell[N_COLS][80];
    int width[N_COLS];
    for (int k = 0; k < N_COLS; k++)
      width[k] = (int)strlen(col_head[k]);
    for (size_t i = 0; i < n; i++) {
      row_cells(&rows[i], cell);
      for (int k = 0; k < N_COLS; k++)
        if ((int)strlen(cell[k]) > width[k])
          width[k] = (int)strlen(cell[k]);
    }
    for (int k = 0; k < N_COLS; k++)
      snprintf(cell[k], 80, "%s", col_head[k]);
    print_row(cell, width);
    for (size_t i = 0; i < n; i++) {
      row_cells(&rows[i], cell);
      print_row(cell, width);
    }
  }
  free(rows);
  return finish(&r, code);
}

/* ---- show --------------------------------------------------------------------------------- */

/* KEY is 32 hex digits, or 8..31 hex digits naming a unique prefix. */
static int key_arg_ok(const char *s)
{
  size_t n = strlen(s);
  if (n < KEY_PREFIX_MIN || n > 32)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)s[i]))
      return 0;
  return 1;
}

/* Find the one context whose key starts with `arg` (through the iterator). */
static int resolve_prefix(run *r, const char *arg, kvdb_key *out)
{
  char want[33], hx[33];
  size_t n = strlen(arg);
  for (size_t i = 0; i <= n; i++)
    want[i] = (char)tolower((unsigned char)arg[i]);
  kvdb_iter *it;
  kvdb_status st = kvdb_iter_open(r->db, &it);
  if (st != KVDB_OK)
    return fail_kv(r, st);
  uint64_t matches = 0;
  char names[AMBIGUOUS_LIST * 34 + 1] = "";
  for (;;) {
    kvdb_context_info ci;
    st = kvdb_iter_next(it, &ci);
    if (st == KVDB_NOTFOUND)
      break;
    if (st != KVDB_OK) {
      int code = fail_kv(r, st);
      kvdb_iter_close(it);
      return code;
    }
    kvdb_key_hex(&ci.key, hx);
    if (strncmp(hx, want, n) != 0)
      continue;
    if (matches == 0)
      *out = ci.key;
    if (matches < AMBIGUOUS_LIST) {
      if (matches > 0)
        strcat(names, ", ");
      strcat(names, hx);
    }
    matches++;
  }
  kvdb_iter_close(it);
  if (matches == 0)
    return fail(r, KVDB_NOTFOUND, "no context key starts with '%s'", want);
  if (matches > 1)
    return fail(r, KVDB_INVALID, "key prefix '%s' is ambiguous: %" PRIu64 " contexts match (%s%s)",
                want, matches, names, matches > AMBIGUOUS_LIST ? ", ..." : "");
  return EXIT_OKAY;
}

static int cmd_show(const cli *c)
{
  const char *arg = c->pos[1];
  if (!key_arg_ok(arg))
    return usage_error(c->cmd, "KEY '%s' is not 32 hex digits or a prefix of at least %d", arg,
                       KEY_PREFIX_MIN);
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 0);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_key key;
  if (strlen(arg) == 32) {
    st = kvdb_key_parse(arg, &key);
    if (st != KVDB_OK)
      return finish(&r, fail_kv(&r, st));
  } else {
    int code = resolve_prefix(&r, arg, &key);
    if (code != EXIT_OKAY)
      return finish(&r, code);
  }
  kvdb_context_info ci;
  st = kvdb_context_stat(r.db, &key, &ci);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_profile_entry prof[256];
  size_t n_prof = 0;
  if (ci.has_profile) {
    st = kvdb_profile_get(r.db, &key, prof, 256, &n_prof);
    if (st != KVDB_OK)
      return finish(&r, fail_kv(&r, st));
    if (n_prof > 256)
      n_prof = 256;
  }
  uint64_t raw_bytes = 0; /* the ratio column is against the raw entry when there is one */
  for (size_t i = 0; i < n_prof; i++)
    if (prof[i].config.method == KVDB_METHOD_RAW)
      raw_bytes = prof[i].bytes;
  if (c->json) {
    json_context(&r.j, "context", &ci);
    jw_arr(&r.j, "profile");
    for (size_t i = 0; i < n_prof; i++) {
      char nm[48];
      const kvdb_profile_entry *e = &prof[i];
      jw_obj(&r.j, NULL);
      jw_str(&r.j, "config", kvdb_config_name(&e->config, nm, sizeof nm));
      jw_u64(&r.j, "bytes", e->bytes);
      jw_bool(&r.j, "bytes_exact", (e->flags & KVDB_PROFILE_EXACT) != 0);
      jw_bool(&r.j, "stored", (e->flags & KVDB_PROFILE_STORED) != 0);
      if (isnan(e->quality))
        jw_null(&r.j, "quality");
      else
        jw_num(&r.j, "quality", e->quality);
      if (isnan(e->rel_l2))
        jw_null(&r.j, "rel_l2");
      else
        jw_num(&r.j, "rel_l2", e->rel_l2);
      /* the output-weighted quality (a model with output gains) and the per-head cosine */
      jw_bool(&r.j, "weighted", (e->flags & KVDB_PROFILE_WEIGHTED) != 0);
      if (isnan(e->cosine))
        jw_null(&r.j, "cosine");
      else
        jw_num(&r.j, "cosine", e->cosine);
      if (isnan(e->worst_head))
        jw_null(&r.j, "worst_head");
      else
        jw_num(&r.j, "worst_head", e->worst_head);
      if (e->n_reports == 0)
        jw_null(&r.j, "reported_quality");
      else
        jw_num(&r.j, "reported_quality", e->reported_quality);
      jw_u64(&r.j, "reports", e->n_reports);
      jw_u64(&r.j, "probes", e->n_probes);
      jw_end(&r.j);
    }
    jw_end(&r.j);
    return finish(&r, EXIT_OKAY);
  }
  char hx[33], b[64], model[80];
  kv_line("key", "%s", kvdb_key_hex(&ci.key, hx));
  kv_line("model", "%s", safe_text(ci.model_id, model, sizeof model));
  kv_line("tokens", "%" PRIu64, ci.n_tokens);
  kv_line("blocks", "%" PRIu32, ci.n_blocks);
  kv_line("size", "%s", size_exact(ci.bytes, b, sizeof b));
  if (ci.n_tokens > 0)
    kv_line("bytes per token", "%" PRIu64, ci.bytes / ci.n_tokens);
  kv_line("tier", "%s", tier_name(ci.tier));
  kv_line("explicit key", "%s", ci.explicit_key ? "yes (one block stored by kvdb_put_block)" : "no");
  kv_line("created", "%s", fmt_time(ci.created_unix_ms, 1, b, sizeof b));
  kv_line("last access", "%s", fmt_time(ci.last_access_unix_ms, 1, b, sizeof b));
  char nm[48];
  kv_line("config", "%s", kvdb_config_name(&ci.config, nm, sizeof nm));
  kv_line("score bits", "%s", score_text(ci.score_bits, b, sizeof b));
  if (ci.score_bits != 0)
    kv_line("score copies", "%s", score_versions_text(ci.score_versions, b, sizeof b));
  if (n_prof == 0) {
    kv_line("profile", "none (kvdb_put_ex with KVDB_PUT_PROFILE, or kvdb_profile)");
    return finish(&r, EXIT_OKAY);
  }
  int weighted = 0;
  for (size_t i = 0; i < n_prof; i++)
    weighted |= (prof[i].flags & KVDB_PROFILE_WEIGHTED) != 0;
  kv_line("profile", "%zu configs; quality = %s on %u probes per sampled head", n_prof,
          weighted ? "the output-weighted quality (the model's output gains; --json: its "
                     "per-head cosine)"
                   : "attention-output cosine",
          prof[0].n_probes);
  printf("\n  %-16s %12s %7s %9s %8s %9s\n", "CONFIG", "BYTES", "RATIO", "QUALITY", "REL L2",
         "REPORTED");
  for (size_t i = 0; i < n_prof; i++) {
    const kvdb_profile_entry *e = &prof[i];
    char q[16] = "-", l2[16] = "-", rep[24] = "-", ratio[16] = "-", by[32];
    if (!isnan(e->quality))
      snprintf(q, sizeof q, "%.5f", e->quality);
    if (!isnan(e->rel_l2))
      snprintf(l2, sizeof l2, "%.4f", e->rel_l2);
    if (e->n_reports)
      snprintf(rep, sizeof rep, "%.4f (%u)", e->reported_quality, e->n_reports);
    if (raw_bytes && e->bytes)
      snprintf(ratio, sizeof ratio, "%.2fx", (double)raw_bytes / (double)e->bytes);
    snprintf(by, sizeof by, "%s%" PRIu64, (e->flags & KVDB_PROFILE_EXACT) ? "" : "~", e->bytes);
    printf("%s %-16s %12s %7s %9s %8s %9s\n", (e->flags & KVDB_PROFILE_STORED) ? "*" : " ",
           kvdb_config_name(&e->config, nm, sizeof nm), e->bytes ? by : "-", ratio, q, l2, rep);
  }
  printf("  (* stored config; ~ bytes extrapolated from the sampled heads)\n");
  return finish(&r, EXIT_OKAY);
}

/* ---- verify ------------------------------------------------------------------------------- */

typedef struct verify_state {
  run *r;
  progress bar;
} verify_state;

static void on_problem(void *ctx, const kvdb_problem *p)
{
  verify_state *v = ctx;
  progress_clear(&v->bar);
  if (v->r->c->json) {
    jw_obj(&v->r->j, NULL);
    jw_str(&v->r->j, "status", kvdb_status_name(p->status));
    jw_str(&v->r->j, "message", p->message);
    jw_end(&v->r->j);
  } else {
    printf("%s: %s\n", kvdb_status_name(p->status), p->message);
    fflush(stdout); /* problems appear as they are found, between redraws of the bar */
  }
}

static void on_verify_progress(void *ctx, uint64_t done, uint64_t total)
{
  verify_state *v = ctx;
  progress_update(&v->bar, done, total);
}

static void on_action(void *ctx, const kvdb_problem *p)
{
  verify_state *v = ctx;
  progress_clear(&v->bar);
  if (v->r->c->json) {
    jw_str(&v->r->j, NULL, p->message);
  } else {
    printf("repair: %s\n", p->message);
    fflush(stdout);
  }
}

/*
 * verify [--repair [--dry-run]]: the check (problems as found, then a summary); with --repair
 * the repair of what it found (each change as made, or as it would be made), and with changes
 * made the check again, whose result decides the exit status.
 */
static int cmd_verify(const cli *c)
{
  run r;
  begin(&r, c);
  int repair = c->repair, dry = c->dry_run;
  kvdb_status st = open_db(&r, repair && !dry);
  if (st != KVDB_OK) {
    int code = fail_kv(&r, st);
    /* a catalog that cannot be opened because it is damaged is corruption found */
    return finish(&r, st == KVDB_CORRUPT ? EXIT_CORRUPT : code);
  }
  verify_state v;
  v.r = &r;
  progress_init(&v.bar, "verify", "blocks", !c->quiet && isatty(STDERR_FILENO));
  g_bar = &v.bar;
  if (c->json)
    jw_arr(&r.j, "problems");
  kvdb_verify_report rep;
  memset(&rep, 0, sizeof rep);
  st = kvdb_verify(r.db, on_problem, on_verify_progress, &v, &rep);
  progress_clear(&v.bar);
  g_bar = NULL;
  if (st != KVDB_OK && st != KVDB_CORRUPT)
    return finish(&r, fail_kv(&r, st));
  if (st == KVDB_CORRUPT && rep.problems == 0) /* not expected: say why anyway */
    fprintf(stderr, "%s: %s: %s\n", PROG, kvdb_status_name(st), kvdb_errmsg());
  int code = st == KVDB_OK ? EXIT_OKAY : EXIT_CORRUPT;
  if (c->json) {
    jw_end(&r.j);
    jw_u64(&r.j, "blocks_checked", rep.blocks_checked);
    jw_u64(&r.j, "bytes_checked", rep.bytes_checked);
    jw_u64(&r.j, "contexts_checked", rep.contexts_checked);
    jw_u64(&r.j, "segments_checked", rep.segments_checked);
    jw_u64(&r.j, "problem_count", rep.problems);
  } else if (!c->quiet) {
    char b[64];
    if (rep.problems > 0)
      fputc('\n', stdout);
    kv_line("blocks checked", "%" PRIu64, rep.blocks_checked);
    kv_line("bytes checked", "%s", size_exact(rep.bytes_checked, b, sizeof b));
    kv_line("contexts checked", "%" PRIu64, rep.contexts_checked);
    kv_line("segments checked", "%" PRIu64, rep.segments_checked);
    kv_line("problems", "%" PRIu64, rep.problems);
  }
  kvdb_repair_report rr;
  memset(&rr, 0, sizeof rr);
  uint64_t after = rep.problems;
  if (repair && code != EXIT_OKAY) {
    if (c->json) {
      jw_obj(&r.j, "repair");
      jw_bool(&r.j, "dry_run", dry);
      jw_arr(&r.j, "actions");
    } else if (!c->quiet) {
      fputc('\n', stdout);
    }
    progress_init(&v.bar, "repair", "blocks", !c->quiet && isatty(STDERR_FILENO));
    g_bar = &v.bar;
    st = kvdb_repair(r.db, dry ? KVDB_REPAIR_DRY_RUN : 0, on_action, on_verify_progress, &v, &rr);
    progress_clear(&v.bar);
    g_bar = NULL;
    if (st != KVDB_OK)
      return finish(&r, fail_kv(&r, st));
    if (!dry) { /* what the repair left */
      kvdb_verify_report rep2;
      st = kvdb_verify(r.db, NULL, NULL, NULL, &rep2);
      if (st != KVDB_OK && st != KVDB_CORRUPT)
        return finish(&r, fail_kv(&r, st));
      after = rep2.problems;
      code = st == KVDB_OK ? EXIT_OKAY : EXIT_CORRUPT;
    }
    if (c->json) {
      jw_end(&r.j);
      jw_u64(&r.j, "blocks_rebuilt", rr.blocks_rebuilt);
      jw_u64(&r.j, "contexts_rebuilt", rr.contexts_rebuilt);
      jw_u64(&r.j, "contexts_dropped", rr.contexts_dropped);
      jw_u64(&r.j, "blocks_dropped", rr.blocks_dropped);
      jw_u64(&r.j, "refcounts_fixed", rr.refcounts_fixed);
      jw_u64(&r.j, "segments_fixed", rr.segments_fixed);
      jw_u64(&r.j, "skipped", rr.skipped);
      jw_u64(&r.j, "problems_after", after);
      jw_end(&r.j);
    } else if (!c->quiet) {
      const char *w = dry ? " (dry run: would be)" : "";
      fputc('\n', stdout);
      kv_line("blocks rebuilt", "%" PRIu64 "%s", rr.blocks_rebuilt, w);
      kv_line("contexts rebuilt", "%" PRIu64 "%s", rr.contexts_rebuilt, w);
      kv_line("contexts dropped", "%" PRIu64 "%s", rr.contexts_dropped, w);
      kv_line("blocks dropped", "%" PRIu64 "%s", rr.blocks_dropped, w);
      kv_line("refcounts fixed", "%" PRIu64 "%s", rr.refcounts_fixed, w);
      kv_line("segments fixed", "%" PRIu64 "%s", rr.segments_fixed, w);
      if (rr.skipped)
        kv_line("skipped", "%" PRIu64 " (changed by another process meanwhile: run again)",
                rr.skipped);
      if (!dry)
        kv_line("problems after", "%" PRIu64, after);
    }
  }
  if (c->json) {
    jw_bool(&r.j, "ok", code == EXIT_OKAY);
    return finish(&r, code);
  }
  if (!c->quiet)
    kv_line("result", "%s",
            code == EXIT_OKAY ? (repair && rep.problems ? "repaired" : "ok")
            : dry && repair   ? "CORRUPTION FOUND (dry run: nothing repaired)"
                              : "CORRUPTION FOUND");
  return finish(&r, code);
}

/* ---- compact ------------------------------------------------------------------------------ */

static void on_compact_progress(void *ctx, uint64_t done, uint64_t total)
{
  progress_update(ctx, done, total);
}

static int cmd_compact(const cli *c)
{
  double threshold = c->have_threshold ? c->threshold : 0.0;
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 1);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_stats before, after;
  st = kvdb_stat(r.db, &before);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  progress bar;
  progress_init(&bar, "compact", "segments", !c->quiet && isatty(STDERR_FILENO));
  g_bar = &bar;
  kvdb_compact_report rep;
  memset(&rep, 0, sizeof rep);
  st = kvdb_compact(r.db, threshold, on_compact_progress, &bar, &rep);
  progress_clear(&bar);
  g_bar = NULL;
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  st = kvdb_stat(r.db, &after);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  double eff = threshold > 0 ? threshold : 0.5; /* kvdb_compact: 0 means the default 0.5 */
  /* what is left: dead bytes in sealed segments at or above the threshold, in open ones, and
   * what a higher threshold would reclaim */
  seg_list segs;
  st = seg_load(r.db, &segs);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  uint64_t left_sealed = 0, left_open = 0, n_left = 0;
  for (size_t i = 0; i < segs.n; i++) {
    const kvdb_segment_info *g = &segs.s[i];
    uint64_t d = g->bytes > g->live_bytes ? g->bytes - g->live_bytes : 0;
    if (!g->sealed)
      left_open += d;
    else if (d > 0) {
      left_sealed += d;
      n_left++;
    }
  }
  double t50 = thr_for(&segs, 0.5), t100 = thr_for(&segs, 1.0);
  comp_at next = comp_plan(&segs, -1, t100 > 0 ? t100 : 1.0);
  free(segs.s);
  if (c->json) {
    jw *j = &r.j;
    jw_num(j, "threshold", eff);
    jw_u64(j, "dead_bytes_left_sealed", left_sealed);
    jw_u64(j, "dead_bytes_left_open", left_open);
    jw_u64(j, "segments_left_with_dead_bytes", n_left);
    jw_num(j, "threshold_for_half_the_dead_bytes", t50);
    jw_num(j, "threshold_for_all_the_dead_bytes", t100);
    jw_u64(j, "bytes_reclaimable_at_that_threshold", next.reclaim);
    jw_u64(j, "bytes_moved_at_that_threshold", next.moved);
    jw_u64(j, "segments_rewritten", rep.segments_rewritten);
    jw_u64(j, "blocks_moved", rep.blocks_moved);
    jw_u64(j, "bytes_moved", rep.bytes_moved);
    jw_u64(j, "bytes_reclaimed", rep.bytes_reclaimed);
    jw_u64(j, "segments_before", before.n_segments);
    jw_u64(j, "segments_after", after.n_segments);
    jw_u64(j, "segment_file_bytes_before", before.segment_file_bytes);
    jw_u64(j, "segment_file_bytes_after", after.segment_file_bytes);
    return finish(&r, EXIT_OKAY);
  }
  if (!c->quiet) {
    char b[64], b2[32];
    kv_line("threshold", "%.3g (segments less than %.1f%% live)", eff, eff * 100.0);
    kv_line("segments rewritten", "%" PRIu64, rep.segments_rewritten);
    kv_line("blocks moved", "%" PRIu64, rep.blocks_moved);
    kv_line("bytes moved", "%s", size_exact(rep.bytes_moved, b, sizeof b));
    kv_line("bytes reclaimed", "%s", size_exact(rep.bytes_reclaimed, b, sizeof b));
    kv_line("segment files", "%s -> %s (%" PRIu64 " -> %" PRIu64 " segments)",
            fmt_size(before.segment_file_bytes, b, sizeof b),
            fmt_size(after.segment_file_bytes, b2, sizeof b2), before.n_segments,
            after.n_segments);
    kv_line("dead bytes left", "%s in %" PRIu64 " sealed segments (each at least %.1f%% live), "
            "%s in open segments (compacted once sealed)", fmt_size(left_sealed, b, sizeof b),
            n_left, eff * 100.0, fmt_size(left_open, b2, sizeof b2));
    if (t100 > 0)
      kv_line("to reclaim them", "--threshold %.3g reclaims %s (moving %s); --threshold %.3g "
              "half of it", t100, fmt_size(next.reclaim, b, sizeof b),
              fmt_size(next.moved, b2, sizeof b2), t50);
  }
  return finish(&r, EXIT_OKAY);
}

/* ---- recompress ----------------------------------------------------------------------------- */

/* Every lossless context re-encoded to its own config: this build writes it in its lossless
 * format (lossless frames, format 5), the KV bit for bit (kvdb_recompress's migration). */
static int cmd_recompress(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 1);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  /* the contexts first (the iterator's snapshot), then one re-encoding each */
  kvdb_iter *it;
  st = kvdb_iter_open(r.db, &it);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_context_info *ctxs = NULL;
  size_t n = 0, cap = 0, seen = 0;
  int code = EXIT_OKAY;
  for (;;) {
    kvdb_context_info ci;
    st = kvdb_iter_next(it, &ci);
    if (st == KVDB_NOTFOUND)
      break;
    if (st != KVDB_OK) {
      code = fail_kv(&r, st);
      break;
    }
    seen++;
    if (ci.config.method != KVDB_METHOD_LOSSLESS)
      continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      kvdb_context_info *t = realloc(ctxs, ncap * sizeof *t);
      if (t == NULL) {
        code = fail(&r, KVDB_NOMEM, "cannot hold %zu contexts", ncap);
        break;
      }
      ctxs = t;
      cap = ncap;
    }
    ctxs[n++] = ci;
  }
  kvdb_iter_close(it);
  uint64_t before = 0, after = 0;
  size_t done = 0;
  for (size_t i = 0; code == EXIT_OKAY && i < n; i++) {
    kvdb_model m;
    char hx[33];
    st = kvdb_model_get(r.db, ctxs[i].model_id, &m);
    if (st == KVDB_OK)
      st = kvdb_recompress(r.db, &m, &ctxs[i].key, &ctxs[i].config, NULL);
    kvdb_context_info ci;
    if (st == KVDB_OK)
      st = kvdb_context_stat(r.db, &ctxs[i].key, &ci);
    if (st == KVDB_NOTFOUND) /* deleted meanwhile by another process */
      continue;
    if (st != KVDB_OK) {
      code = fail(&r, st, "context %s: %s", kvdb_key_hex(&ctxs[i].key, hx), kvdb_errmsg());
      break;
    }
    before += ctxs[i].bytes;
    after += ci.bytes;
    done++;
  }
  free(ctxs);
  if (code != EXIT_OKAY)
    return finish(&r, code);
  if (c->json) {
    jw *j = &r.j;
    jw_u64(j, "contexts", seen);
    jw_u64(j, "contexts_rewritten", done);
    jw_u64(j, "bytes_before", before);
    jw_u64(j, "bytes_after", after);
  } else if (!c->quiet) {
    char b[64], b2[64];
    kv_line("contexts", "%zu (%zu lossless, rewritten as lossless frames)", seen, done);
    kv_line("their bytes", "%s -> %s", size_exact(before, b, sizeof b),
            size_exact(after, b2, sizeof b2));
  }
  return finish(&r, EXIT_OKAY);
}

/* ---- placement: rebalance, stats, probe --------------------------------------------------- */

static const char *place_name(uint32_t tier, uint32_t cached, const kvdb_config *c, char *buf,
                              size_t cap)
{
  char nm[48];
  if (tier == KVDB_TIER_NONE)
    snprintf(buf, cap, "(deleted)");
  else
    snprintf(buf, cap, "%s/%s%s", tier_name(tier), kvdb_config_name(c, nm, sizeof nm),
             cached ? "+dram" : "");
  return buf;
}

static void json_tier_bytes(jw *j, const char *key, const uint64_t *v)
{
  jw_obj(j, key);
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    jw_u64(j, tier_name(t), v[t]);
  jw_end(j);
}

static int cmd_rebalance(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, !c->dry_run);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_place_plan plan;
  st = kvdb_rebalance_plan(r.db, &plan);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_rebalance_report rep;
  memset(&rep, 0, sizeof rep);
  /* carried out in bounded steps: serving handles' puts and placements go on between them */
  size_t next = 0, steps = 0;
  double step_ms_max = 0;
  while (!c->dry_run && next < plan.n_moves) {
    kvdb_rebalance_report sr;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = kvdb_rebalance_step(r.db, &plan, &next, c->step_moves, 0, &sr);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    step_ms_max = ms > step_ms_max ? ms : step_ms_max;
    steps++;
    rep.relocated += sr.relocated;
    rep.deleted += sr.deleted;
    rep.skipped += sr.skipped;
    rep.cache_changes += sr.cache_changes;
    rep.to_remote += sr.to_remote;
    rep.remote_unwritten += sr.remote_unwritten;
    if (st != KVDB_OK) {
      kvdb_place_plan_free(&plan);
      return finish(&r, fail_kv(&r, st));
    }
  }
  char hx[33], a[96], b[96], s1[32], s2[32];
  if (c->json) {
    jw *j = &r.j;
    jw_bool(j, "dry_run", c->dry_run);
    jw_u64(j, "contexts", plan.n_contexts);
    json_tier_bytes(j, "capacity", plan.capacity);
    json_tier_bytes(j, "bytes_before", plan.bytes_before);
    json_tier_bytes(j, "bytes_after", plan.bytes_after);
    jw_num(j, "utility_before", plan.utility_before);
    jw_num(j, "utility_after", plan.utility_after);
    if (plan.remote) {
      jw_obj(j, "remote");
      jw_u64(j, "capacity", plan.remote_capacity);
      jw_u64(j, "bytes_after", plan.remote_bytes_after);
      jw_num(j, "read_bps", plan.remote_perf.read_bps);
      jw_num(j, "latency_s", plan.remote_perf.latency_s);
      jw_num(j, "model_read_bps", plan.remote_model.read_bps);
      jw_num(j, "model_latency_s", plan.remote_model.latency_s);
      jw_end(j);
    }
    jw_arr(j, "moves");
    for (size_t i = 0; i < plan.n_moves; i++) {
      const kvdb_place_move *m = &plan.moves[i];
      jw_obj(j, NULL);
      jw_str(j, "key", kvdb_key_hex(&m->context, hx));
      jw_str(j, "from", place_name(m->from_tier, m->from_cached, &m->from_config, a, sizeof a));
      jw_str(j, "to", place_name(m->to_tier, m->to_cached, &m->to_config, b, sizeof b));
      jw_u64(j, "bytes_from", m->from_bytes);
      jw_u64(j, "bytes_to", m->to_bytes);
      jw_num(j, "utility_from", m->utility_from);
      jw_num(j, "utility_to", m->utility_to);
      jw_end(j);
    }
    jw_end(j);
    if (!c->dry_run) {
      jw_obj(j, "done");
      jw_u64(j, "relocated", rep.relocated);
      jw_u64(j, "deleted", rep.deleted);
      jw_u64(j, "skipped", rep.skipped);
      jw_u64(j, "cache_changes", rep.cache_changes);
      jw_u64(j, "to_remote", rep.to_remote);
      jw_u64(j, "remote_unwritten", rep.remote_unwritten);
      jw_u64(j, "steps", steps);
      jw_u64(j, "step_moves", c->step_moves);
      jw_num(j, "step_ms_max", step_ms_max);
      jw_end(j);
    }
    kvdb_place_plan_free(&plan);
    return finish(&r, EXIT_OKAY);
  }
  for (size_t i = 0; i < plan.n_moves; i++) {
    const kvdb_place_move *m = &plan.moves[i];
    kvdb_key_hex(&m->context, hx);
    hx[16] = 0; /* a prefix is enough to tell them apart */
    printf("%s  %-26s -> %-26s  %9s -> %-9s  U %+.6g (%.6g -> %.6g)\n", hx,
           place_name(m->from_tier, m->from_cached, &m->from_config, a, sizeof a),
           place_name(m->to_tier, m->to_cached, &m->to_config, b, sizeof b),
           fmt_size(m->from_bytes, s1, sizeof s1), fmt_size(m->to_bytes, s2, sizeof s2),
           m->utility_to - m->utility_from, m->utility_from, m->utility_to);
  }
  if (!c->quiet) {
    kv_line("contexts", "%" PRIu64 " placed, %zu to move%s", plan.n_contexts, plan.n_moves,
            c->dry_run ? " (dry run: nothing moved)" : "");
    for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
      if (plan.capacity[t] == 0 && plan.bytes_before[t] == 0 && plan.bytes_after[t] == 0)
        continue;
      char lab[32], cp[32];
      snprintf(lab, sizeof lab, "%s bytes", tier_name(t));
      kv_line(lab, "%s -> %s of %s", fmt_size(plan.bytes_before[t], s1, sizeof s1),
              fmt_size(plan.bytes_after[t], s2, sizeof s2),
              plan.capacity[t] ? fmt_size(plan.capacity[t], cp, sizeof cp) : "unlimited");
    }
    if (plan.remote) {
      char cp[32];
      kv_line("remote bytes", "-> %s of %s; measured %.3g GB/s, %.3g us (modelled %.3g GB/s, "
              "%.3g us)", fmt_size(plan.remote_bytes_after, s2, sizeof s2),
              plan.remote_capacity ? fmt_size(plan.remote_capacity, cp, sizeof cp) : "unlimited",
              plan.remote_perf.read_bps / 1e9, plan.remote_perf.latency_s * 1e6,
              plan.remote_model.read_bps / 1e9, plan.remote_model.latency_s * 1e6);
    }
    kv_line("utility", "%.6g -> %.6g", plan.utility_before, plan.utility_after);
    if (!c->dry_run) {
      kv_line("done", "%" PRIu64 " relocated, %" PRIu64 " deleted, %" PRIu64 " skipped (changed "
              "since the plan), %" PRIu64 " DRAM changes; %" PRIu64 " of the deleted to the "
              "remote tier", rep.relocated, rep.deleted, rep.skipped, rep.cache_changes,
              rep.to_remote);
      kv_line("steps", "%zu of at most %" PRIu64 " moves, the longest %.1f ms", steps,
              c->step_moves, step_ms_max);
    }
  }
  kvdb_place_plan_free(&plan);
  return finish(&r, EXIT_OKAY);
}

#define STATS_USES 256

static int cmd_stats(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 0);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_placement_stats ps;
  kvdb_config_use *uses = calloc(STATS_USES, sizeof *uses);
  if (uses == NULL)
    return finish(&r, fail(&r, KVDB_NOMEM, "out of memory"));
  st = kvdb_placement_stat(r.db, &ps, uses, STATS_USES);
  if (st != KVDB_OK) {
    free(uses);
    return finish(&r, fail_kv(&r, st));
  }
  size_t n_uses = ps.n_uses < STATS_USES ? ps.n_uses : STATS_USES;
  uint64_t reads = 0;
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++)
    reads += ps.blocks_read[t];
  char nm[48], s1[32];
  if (c->json) {
    jw *j = &r.j;
    jw_u64(j, "contexts", ps.contexts);
    jw_num(j, "utility", ps.utility);
    jw_num(j, "frequency", ps.frequency);
    jw_obj(j, "tiers");
    for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
      jw_obj(j, tier_name(t));
      jw_u64(j, "served_contexts", ps.served_from[t]);
      jw_num(j, "utility", ps.utility_from[t]);
      jw_u64(j, "blocks_read", ps.blocks_read[t]);
      if (reads > 0)
        jw_num(j, "hit_rate", (double)ps.blocks_read[t] / (double)reads);
      else
        jw_null(j, "hit_rate");
      jw_num(j, "read_gbps", ps.perf[t].read_bps / 1e9);
      jw_num(j, "latency_us", ps.perf[t].latency_s * 1e6);
      jw_end(j);
    }
    jw_end(j);
    jw_arr(j, "configs");
    for (size_t k = 0; k < n_uses; k++) {
      jw_obj(j, NULL);
      jw_str(j, "tier", tier_name(uses[k].tier));
      jw_bool(j, "cached", uses[k].cached != 0);
      jw_str(j, "config", kvdb_config_name(&uses[k].config, nm, sizeof nm));
      jw_u64(j, "contexts", uses[k].contexts);
      jw_u64(j, "bytes", uses[k].bytes);
      jw_end(j);
    }
    jw_end(j);
    free(uses);
    return finish(&r, EXIT_OKAY);
  }
  kv_line("contexts", "%" PRIu64 " (utility %.6g, decayed accesses %.6g)", ps.contexts,
          ps.utility, ps.frequency);
  printf("%-9s %9s %12s %12s %9s %10s %10s\n", "tier", "contexts", "utility", "blocks read",
         "hit rate", "GB/s", "latency us");
  for (uint32_t t = 0; t < KVDB_TIER_COUNT; t++) {
    char hr[16];
    if (reads > 0)
      snprintf(hr, sizeof hr, "%.1f%%", 100.0 * (double)ps.blocks_read[t] / (double)reads);
    else
      snprintf(hr, sizeof hr, "-");
    printf("%-9s %9" PRIu64 " %12.6g %12" PRIu64 " %9s %10.3g %10.3g\n", tier_name(t),
           ps.served_from[t], ps.utility_from[t], ps.blocks_read[t], hr,
           ps.perf[t].read_bps / 1e9, ps.perf[t].latency_s * 1e6);
  }
  printf("configs in use (tier, config, contexts, bytes):\n");
  for (size_t k = 0; k < n_uses; k++) {
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%s%s", kvdb_config_name(&uses[k].config, nm, sizeof nm),
             uses[k].cached ? "+dram" : "");
    printf("  %-9s %-20s %6" PRIu64 "  %s\n", tier_name(uses[k].tier), cfg, uses[k].contexts,
           fmt_size(uses[k].bytes, s1, sizeof s1));
  }
  free(uses);
  return finish(&r, EXIT_OKAY);
}

static int cmd_probe(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 1);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  kvdb_tier_perf f[KVDB_TIER_COUNT];
  st = kvdb_tier_probe(r.db, 1, f);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  if (c->json) {
    jw *j = &r.j;
    jw_obj(j, "tiers");
    for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++) {
      if (f[t].read_bps <= 0)
        continue;
      jw_obj(j, tier_name(t));
      jw_num(j, "read_gbps", f[t].read_bps / 1e9);
      jw_num(j, "latency_us", f[t].latency_s * 1e6);
      jw_u64(j, "probed_unix_ms", f[t].probed_unix_ms);
      jw_end(j);
    }
    jw_end(j);
    return finish(&r, EXIT_OKAY);
  }
  for (uint32_t t = KVDB_TIER_SSD; t < KVDB_TIER_COUNT; t++)
    if (f[t].read_bps > 0)
      kv_line(tier_name(t), "%.3g GB/s, %.3g us", f[t].read_bps / 1e9, f[t].latency_s * 1e6);
  return finish(&r, EXIT_OKAY);
}

static int cmd_metrics(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 0);
  if (st == KVDB_OK)
    st = admin_metrics_print(r.db);
  return finish(&r, st == KVDB_OK ? EXIT_OKAY : fail_kv(&r, st));
}

static int cmd_serve(const cli *c)
{
  run r;
  begin(&r, c);
  kvdb_status st = open_db(&r, 0);
  if (st != KVDB_OK)
    return finish(&r, fail_kv(&r, st));
  char err[256];
  if (admin_metrics_serve(r.db, c->metrics_addr, err, sizeof err) != 0)
    return finish(&r, fail(&r, KVDB_INVALID, "%s", err));
  return finish(&r, EXIT_OKAY);
}

/* ---- command line ------------------------------------------------------------------------- */

static const command commands[] = {
  {"info", "DIR", 1, "format version, tiers, segments, space and I/O mode",
   "Print the on-disk format version, the number of models, contexts (and how many keep int8\n"
   "or int4 score copies for kvdb_score: their model's score_bits), blocks and segments,\n"
   "the bytes of the segment files against the live bytes in them (the dead fraction is what\n"
   "compact can reclaim), the catalog size, whether segment I/O uses O_DIRECT and io_uring,\n"
   "and per tier its capacity, bytes, blocks and contexts. Opens the database read-only.\n",
   cmd_info},
  {"ls", "DIR", 1, "list contexts: key, model, tokens, blocks, size, tier, times",
   "List every stored context in key order: key (32 hex digits), model id, tokens, blocks,\n"
   "stored bytes (shared blocks count in each context), tier, creation and last access time\n"
   "(ISO-8601 UTC), and whether it is an explicit-key block (kvdb_put_block). With -q only the\n"
   "keys are printed, one per line. Opens the database read-only.\n",
   cmd_ls},
  {"show", "DIR KEY", 2, "one context in detail",
   "Print one context in detail. KEY is the context key, 32 hex digits as ls prints it, or a\n"
   "prefix of at least 8 hex digits that only one context key starts with. An ambiguous prefix\n"
   "is an error that names the candidates. Also shows its config, its model's score bits (8 or\n"
   "4: int8 or int4 key copies kvdb_score ranks tokens on; 0: none) and its quality profile.\n"
   "Opens the database read-only.\n",
   cmd_show},
  {"verify", "DIR [--repair [--dry-run]]", 1,
   "check every checksum and the catalog against the segments; repair",
   "Read every block and check every checksum, and check the catalog against the segment\n"
   "files: each block record against the block object it points at (tokens, token count, bytes,\n"
   "parent, model, flags, tier) and its reference count, each context against its blocks (all\n"
   "present, the hash chain, the token count), segment live bytes, no block past the end of its\n"
   "file. Each problem is printed on its own line, naming the context, the block and the field\n"
   "(or the segment and the offset); then a summary. A progress bar is drawn on stderr when it\n"
   "is a terminal. Opens the database read-only. Exit status 3 when corruption is found.\n"
   "\n"
   "  --repair        then repair what was found, in one catalog transaction: a block record is\n"
   "                  rebuilt from its block object where that object verifies; a context that\n"
   "                  cannot be rebuilt is dropped; reference counts and live bytes are set to\n"
   "                  what the records add up to. Each change is printed (\"repair: ...\"), then\n"
   "                  the check runs again: exit status 0 when it is clean. Opens the database\n"
   "                  read-write; other processes may keep using it.\n"
   "  --dry-run       with --repair: print what it would change (\"repair: would ...\"), write\n"
   "                  nothing (opens the database read-only)\n",
   cmd_verify},
  {"compact", "DIR [--threshold F]", 1, "rewrite segments whose live fraction is below F",
   "Rewrite the live blocks of sealed segments whose live fraction is below F (0..1, default\n"
   "0.5) into a new segment and delete the old files, then report the segments rewritten, the\n"
   "blocks and bytes moved and the bytes reclaimed. Online: other processes may keep using the\n"
   "database. A progress bar is drawn on stderr when it is a terminal. Opens the database\n"
   "read-write; it never creates one.\n"
   "\n"
   "  --threshold F   live fraction under which a segment is rewritten (0 = default 0.5)\n",
   cmd_compact},
  {"rebalance", "DIR [--dry-run] [--step N] [--remote ADDR [--remote-namespace NS]]", 1, "place every context anew (EvicPress), or print the plan",
   "Plan a rebalance of the placement (every context takes its best tier and config by the\n"
   "utility (alpha * quality - TTFT) * frequency, then over-full tiers are resolved from the\n"
   "top by the cheapest recompression or move down) with the settings the database recorded\n"
   "when it was last opened with placement on, and print each move: key prefix, from -> to\n"
   "(tier/config, +dram when the DRAM tier holds it, (deleted) when it leaves the last tier),\n"
   "stored bytes before and after, and the change of its utility; then the bytes per tier\n"
   "before and after against the capacities, and the total utility. Without --dry-run the\n"
   "plan is then carried out, each move in its own transaction (a crash leaves every context\n"
   "where it was or where the plan puts it); moves of contexts that changed since the plan are\n"
   "skipped. The moves are made in steps of at most N (kvdb_rebalance_step): the database\n"
   "is never held by the rebalance for longer than one step, and serving processes' puts and\n"
   "placements go on between steps. Opens the database read-write (read-only with --dry-run).\n"
   "\n"
   "  --dry-run       print the plan only\n"
   "  --step N        moves per step (default 64)\n"
   "  --remote ADDR   the remote tier (Redis host:port, as kvdb_options.remote_addr) is a tier\n"
   "                  of the plan: its bandwidth and latency measured now against the server;\n"
   "                  a context that leaves the local tiers goes there (\"remote/...\": written\n"
   "                  to Redis, then deleted here) when that beats dropping it\n"
   "  --remote-namespace NS  the tenant namespace of those keys (default \"\")\n",
   cmd_rebalance},
  {"recompress", "DIR", 1, "rewrite lossless contexts in this build's lossless format",
   "Re-encode every context stored lossless (kvdb_recompress to its own config): this build\n"
   "writes it as lossless frames (block format 3, catalog format 5), the same KV bit for bit,\n"
   "so a database written by an earlier build (zstd-planes sections, format 2 blocks) gets the\n"
   "faster format. Blocks a context shares with another are kept as they are. The old copies\n"
   "become dead bytes (kvdb-admin compact reclaims them). Opens the database read-write.\n",
   cmd_recompress},
  {"stats", "DIR", 1, "placement: configs in use per tier, tier hit rates, utility",
   "Print the placement's view: per tier the contexts served from it (DRAM: those the\n"
   "placement keeps there), their utility, the blocks gets read from it (every handle with\n"
   "placement on, as flushed to the catalog) as hit rates, and the read figures; then the\n"
   "configs in use per tier with their contexts and bytes (EvicPress Figure 11's view). Uses\n"
   "the recorded placement settings. Opens the database read-only.\n",
   cmd_stats},
  {"probe", "DIR", 1, "measure the tiers' read bandwidth and latency again",
   "Probe the SSD tier's directory (and the SmartSSD tier's, when the database has one): a\n"
   "32 MiB file written, synced, dropped from the page cache and read back, then removed; and\n"
   "record the figures for the placement (replacing the cached ones). Opens the database\n"
   "read-write.\n",
   cmd_probe},
  {"metrics", "DIR", 1, "print the metrics once in Prometheus' text format",
   "Print kvdb_metrics' text (Prometheus exposition format 0.0.4): per tier the blocks,\n"
   "bytes and contexts the catalog counts, and this process's hits, misses, latency\n"
   "histograms and remote-tier counters (zero for a process that only opened the database).\n"
   "Opens the database read-only. --json does not apply.\n",
   cmd_metrics},
  {"serve", "DIR --metrics ADDR", 1, "serve the metrics at http://ADDR/metrics",
   "Serve kvdb_metrics' text at http://ADDR/metrics (libmicrohttpd) until SIGINT or SIGTERM,\n"
   "each scrape read anew from the catalog. ADDR is IPv4:PORT or :PORT (every interface).\n"
   "Opens the database read-only.\n"
   "\n"
   "  --metrics ADDR  where to listen (required)\n",
   cmd_serve},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const char options_text[] =
    "options:\n"
    "  --json        print one JSON object on standard output\n"
    "  -q, --quiet   no progress bar, no warnings, no summaries (ls: keys only)\n"
    "  -h, --help    show this help; after a command, that command's help\n"
    "  --version     show the versions of kvdb-admin, libkvdb and the on-disk format\n";

static const char exit_text[] =
    "exit status: 0 ok, 1 error, 2 usage error, 3 corruption found (verify)\n";

static void print_usage(FILE *f)
{
  fprintf(f, "usage: %s [-q] [--json] COMMAND DIR [ARGS]\n", PROG);
  fprintf(f, "       %s --help | --version | COMMAND --help\n\n", PROG);
  fputs("Inspect, check, compact and rebalance a kvdb database directory.\n\ncommands:\n", f);
  for (size_t i = 0; i < N_COMMANDS; i++) {
    char syn[64];
    snprintf(syn, sizeof syn, "%s %s", commands[i].name, commands[i].args);
    fprintf(f, "  %-29s %s\n", syn, commands[i].summary);
  }
  fputc('\n', f);
  fputs(options_text, f);
  fputs("\ninfo, ls, show and verify (without --repair) open the database read-only and never\n"
        "write to it.\n",
        f);
  fputs(exit_text, f);
}

static void print_command_help(FILE *f, const command *cmd)
{
  fprintf(f, "usage: %s [-q] [--json] %s %s\n\n", PROG, cmd->name, cmd->args);
  fputs(cmd->help, f);
  fputc('\n', f);
  fputs(options_text, f);
  fputc('\n', f);
  fputs(exit_text, f);
}

static int print_version(int json)
{
  unsigned lib = kvdb_version_number();
  char libs[32], tool[32];
  snprintf(libs, sizeof libs, "%u.%u.%u", lib / 10000, lib / 100 % 100, lib % 100);
  snprintf(tool, sizeof tool, "%d.%d.%d", KVDB_VERSION_MAJOR, KVDB_VERSION_MINOR,
           KVDB_VERSION_PATCH);
  if (json) {
    jw j;
    jw_init(&j, stdout);
    jw_obj(&j, NULL);
    jw_str(&j, "command", "version");
    jw_str(&j, "kvdb_admin", tool);
    jw_str(&j, "libkvdb", libs);
    jw_u64(&j, "libkvdb_version_number", lib);
    jw_u64(&j, "format_version", KVDB_FORMAT_VERSION);
    jw_end(&j);
  } else {
    printf("%s %s (libkvdb %s, on-disk format %d)\n", PROG, tool, libs, KVDB_FORMAT_VERSION);
  }
  return fflush(stdout) == 0 ? EXIT_OKAY : EXIT_ERROR;
}

static const command *find_command(const char *name)
{
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

/* Options may come before or after the command; "--" ends them. */
int main(int argc, char **argv)
{
  cli c;
  memset(&c, 0, sizeof c);
  int help = 0, version = 0, opts_done = 0, n_extra = 0;
  const char *bad_option = NULL, *bad_command = NULL, *threshold_arg = NULL, *extra = NULL;
  const char *step_arg = NULL;
  const char *missing_value = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!opts_done && a[0] == '-' && a[1] != 0) {
      if (strcmp(a, "--") == 0)
        opts_done = 1;
      else if (strcmp(a, "--json") == 0)
        c.json = 1;
      else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0)
        c.quiet = 1;
      else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
        help = 1;
      else if (strcmp(a, "--version") == 0)
        version = 1;
      else if (strcmp(a, "--dry-run") == 0)
        c.dry_run = 1;
      else if (strcmp(a, "--repair") == 0)
        c.repair = 1;
      else if (strcmp(a, "--threshold") == 0) {
        if (i + 1 < argc)
          threshold_arg = argv[++i];
        else
          missing_value = a;
      } else if (strncmp(a, "--threshold=", 12) == 0)
        threshold_arg = a + 12;
      else if (strcmp(a, "--remote") == 0 || strcmp(a, "--remote-namespace") == 0) {
        if (i + 1 < argc)
          *(a[8] == 0 ? &c.remote_addr : &c.remote_ns) = argv[++i];
        else
          missing_value = a;
      } else if (strcmp(a, "--step") == 0) {
        if (i + 1 < argc)
          step_arg = argv[++i];
        else
          missing_value = a;
      } else if (strncmp(a, "--step=", 7) == 0)
        step_arg = a + 7;
      else if (strcmp(a, "--metrics") == 0) {
        if (i + 1 < argc)
          c.metrics_addr = argv[++i];
        else
          missing_value = a;
      } else if (strncmp(a, "--metrics=", 10) == 0)
        c.metrics_addr = a + 10;
      else if (bad_option == NULL)
        bad_option = a;
      continue;
    }
    if (c.cmd == NULL && bad_command == NULL) {
      c.cmd = find_command(a);
      if (c.cmd == NULL)
        bad_command = a;
    } else if (c.n_pos < 2) {
      c.pos[c.n_pos++] = a;
    } else {
      if (extra == NULL)
        extra = a;
      n_extra++;
    }
  }

  if (help) {
    if (c.cmd != NULL)
      print_command_help(stdout, c.cmd);
    else
      print_usage(stdout);
    return fflush(stdout) == 0 ? EXIT_OKAY : EXIT_ERROR;
  }
  if (version)
    return print_version(c.json);
  if (bad_command != NULL)
    return usage_error(NULL, "unknown command '%s'", bad_command);
  if (bad_option != NULL)
    return usage_error(c.cmd, "unknown option '%s'", bad_option);
  if (missing_value != NULL)
    return usage_error(c.cmd, "option '%s' needs a value", missing_value);
  if (c.cmd == NULL)
    return usage_error(NULL, "no command given");
  if (threshold_arg != NULL) {
    if (c.cmd->run != cmd_compact)
      return usage_error(c.cmd, "option '--threshold' applies to compact only");
    char *end;
    errno = 0;
    double t = strtod(threshold_arg, &end);
    if (errno != 0 || end == threshold_arg || *end != 0 || !(t >= 0.0 && t <= 1.0))
      return usage_error(c.cmd, "--threshold '%s' is not a number from 0 to 1", threshold_arg);
    c.threshold = t;
    c.have_threshold = 1;
  }
  if (c.repair && c.cmd->run != cmd_verify)
    return usage_error(c.cmd, "option '--repair' applies to verify only");
  if (c.dry_run && c.cmd->run != cmd_rebalance && !(c.cmd->run == cmd_verify && c.repair))
    return usage_error(c.cmd,
                       "option '--dry-run' applies to rebalance only (and to verify --repair)");
  if ((c.remote_addr != NULL || c.remote_ns != NULL) && c.cmd->run != cmd_rebalance)
    return usage_error(c.cmd, "options '--remote' and '--remote-namespace' apply to rebalance "
                       "only");
  if (c.remote_ns != NULL && c.remote_addr == NULL)
    return usage_error(c.cmd, "option '--remote-namespace' needs '--remote ADDR'");
  if (c.metrics_addr != NULL && c.cmd->run != cmd_serve)
    return usage_error(c.cmd, "option '--metrics' applies to serve only");
  if (c.cmd->run == cmd_serve && c.metrics_addr == NULL)
    return usage_error(c.cmd, "serve: missing --metrics ADDR");
  c.step_moves = 64;
  if (step_arg != NULL) {
    if (c.cmd->run != cmd_rebalance)
      return usage_error(c.cmd, "option '--step' applies to rebalance only");
    char *end;
    errno = 0;
    unsigned long long n = strtoull(step_arg, &end, 10);
    if (errno != 0 || end == step_arg || *end != 0 || step_arg[0] == '-' || n == 0 ||
        n > 1000000000ull)
      return usage_error(c.cmd, "--step '%s' is not a number of moves from 1 to 1e9", step_arg);
    c.step_moves = n;
  }
  if (c.n_pos < c.cmd->n_pos)
    return usage_error(c.cmd, "%s: missing %s", c.cmd->name, c.n_pos == 0 ? "DIR" : "KEY");
  if (c.n_pos > c.cmd->n_pos || n_extra > 0)
    return usage_error(c.cmd, "%s: unexpected argument '%s'", c.cmd->name,
                       extra != NULL ? extra : c.pos[c.cmd->n_pos]);
  if (c.pos[0][0] == 0)
    return usage_error(c.cmd, "%s: DIR is empty", c.cmd->name);
  return c.cmd->run(&c);
}
