/* SPDX-License-Identifier: MIT */
/*
 * bench/bench.h — the kvdb-bench harness: timing, samples and percentiles, GB/s, the JSON line,
 * the data directory and page-cache helpers shared by every subcommand.
 *
 * A subcommand is a bench_cmd: it gets the run environment (bench_env: a fresh, empty data
 * directory, --quick, the output stream) and a JSON object to add its figures to. It prints
 * its human-readable lines to env->out; bench_main.c prints the JSON object as the last line of
 * stdout (with --json) and deletes the data directory afterwards. Progress goes to stderr.
 *
 * Units: 1 GB = 1e9 bytes; GB/s = bytes / ns. Latencies are in ns inside, µs in reports.
 */
#ifndef BENCH_H
#define BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* ---- time ----------------------------------------------------------------------------- */

static inline uint64_t bench_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Bytes per nanosecond is GB/s (1 GB = 1e9 bytes). 0 when no time passed. */
static inline double bench_gbps(uint64_t bytes, uint64_t ns)
{
  return ns > 0 ? (double)bytes / (double)ns : 0.0;
}

/* a / b, or 0 when b is 0 (a ratio against a baseline that could not be measured). */
static inline double bench_ratio(double a, double b)
{
  return b > 0 ? a / b : 0.0;
}

/* ---- samples -------------------------------------------------------------------------- */

/* A growable list of durations (ns). */
typedef struct bench_samples {
  uint64_t *ns;
  size_t n, cap;
  int sorted;
} bench_samples;

/* Append one sample. Returns 0, or -1 when out of memory. */
int bench_samples_push(bench_samples *s, uint64_t ns);
/* The p-th percentile (0 < p <= 100, nearest rank) in ns; sorts the samples. 0 when empty. */
uint64_t bench_samples_pct(bench_samples *s, double p);
/* Mean in ns; 0 when empty. */
double bench_samples_mean(const bench_samples *s);
void bench_samples_free(bench_samples *s);

/*
 * A timed loop in the manner of zstd's benchfn: call fn(payload, i) for i = 0, 1, ... and time
 * each call, until at least min_iters calls were made and min_ns nanoseconds spent (max_iters
 * caps it; 0 = no cap). fn returns 0 on success; a non-zero return stops the loop and is
 * returned. Each call's duration is appended to *out.
 */
typedef int (*bench_fn)(void *payload, size_t i);
typedef struct bench_fn_opts {
  bench_fn fn;
  void *payload;
  size_t min_iters;
  size_t max_iters;
  uint64_t min_ns;
} bench_fn_opts;
int bench_fn_run(const bench_fn_opts *o, bench_samples *out);

/* ---- the JSON line ------------------------------------------------------------------------ */

/* One flat JSON object, built field by field. Field order is insertion order. */
typedef struct bench_json {
  char *buf;
  size_t len, cap;
  int n_fields;
  int oom;
} bench_json;

void bench_json_num(bench_json *j, const char *key, double v);   /* non-finite -> null */
void bench_json_int(bench_json *j, const char *key, int64_t v);
void bench_json_bool(bench_json *j, const char *key, int v);
void bench_json_str(bench_json *j, const char *key, const char *v); /* escaped */
/* Print the object and a newline to f. Returns 0, or -1 when a field could not be stored. */
int bench_json_print(const bench_json *j, FILE *f);
void bench_json_free(bench_json *j);

/* ---- the run environment and subcommands -------------------------------------------------- */

typedef struct bench_env {
  const char *dir;       /* fresh, empty directory for this run's data (deleted afterwards) */
  const char *fs_type;   /* file system of dir, e.g. "ext4" */
  int is_tmpfs;          /* dir is on tmpfs/ramfs: disk figures are meaningless */
  int quick;             /* --quick: fewer contexts and repetitions */
  int json;              /* --json: the JSON object is the last line of stdout */
  int keep;              /* --keep: leave the data in dir (do not delete it as a run goes) */
  uint64_t seed;         /* --seed: data and choices are a function of it */
  FILE *out;             /* human-readable report */
  const char *revision;  /* git describe of the build, or "unknown" */
  const char *buildtype; /* meson buildtype */
  const char *model_dir; /* --model-dir, or NULL (compress, prefix: then $KVDB_MODEL_DIR, the
                            default) */
  const char *keys;      /* --keys: decode's synthetic keys, "model" (default) or "independent";
                            NULL reads as "model" */
} bench_env;

/* Returns 0 on success; on failure prints why to stderr and returns non-zero; 77: skipped
 * (what was looked for printed; kvdb-bench exits 77, meson's "skipped"). */
typedef int (*bench_cmd_fn)(const bench_env *env, bench_json *j);

typedef struct bench_cmd {
  const char *name;
  const char *summary;
  bench_cmd_fn run;
} bench_cmd;

/*
 * The Python parts of a bench (python/kvdb: kvdb.llama_run, kvdb.llama_truth): the interpreter
 * is $KVDB_PYTHON or the repository's .venv/bin/python (bench_python: into buf, 1 when it can
 * be run), with KVDB_LIB naming this build's libkvdb.so and KVDB_BENCH_FIELDS=1 set.
 * bench_run_py runs cmd, echoes its report to env->out and makes each '@json NAME VALUE' line a
 * field of j (VALUE a JSON number, true/false, a string or NaN), or hands it to take (its
 * NAME and VALUE, NUL-terminated) first: take returns 1 when it kept the field itself. Returns
 * 0, 77 when the script exited 77 (skipped: it said what it looked for), else 1.
 */
int bench_python(char *buf, size_t cap);
typedef int (*bench_py_take)(void *arg, const char *name, const char *value);
int bench_run_py(const bench_env *env, bench_json *j, const char *cmd, bench_py_take take,
                 void *arg);

/* Subcommands (one file each). */
int bench_store(const bench_env *env, bench_json *j);
int bench_compact(const bench_env *env, bench_json *j);
int bench_compress(const bench_env *env, bench_json *j);
int bench_truth(const bench_env *env, bench_json *j); /* part of compress (issue 16) */
/* SmolLM2-135M's quality truth (python/kvdb/llama_truth.py); 77: skipped (said why) */
int bench_truth_llama(const bench_env *env, bench_json *j);
int bench_getspeed(const bench_env *env, bench_json *j); /* part of compress (issue 16) */
int bench_score(const bench_env *env, bench_json *j);
int bench_prefix(const bench_env *env, bench_json *j);
int bench_policy(const bench_env *env, bench_json *j);
int bench_policy_puts(const bench_env *env, bench_json *j); /* part of policy */
int bench_background(const bench_env *env, bench_json *j);
int bench_growth(const bench_env *env, bench_json *j);
int bench_llama(const bench_env *env, bench_json *j);
int bench_remote(const bench_env *env, bench_json *j);
int bench_remote_tags(const bench_env *env, bench_json *j);
int bench_remote_get(const bench_env *env, bench_json *j); /* part 1 of remote alone */
int bench_prefetch(const bench_env *env, bench_json *j);
int bench_decode(const bench_env *env, bench_json *j);

/* "met" or "MISSED": a target's verdict in the reports. Never NULL. */
const char *bench_met(int ok);

/* ---- files, memory, page cache ------------------------------------------------------------ */

/* Progress and warnings to stderr, prefixed "kvdb-bench: ". */
void bench_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 4 KiB-aligned allocation (suitable for O_DIRECT), every page touched. NULL on failure. */
void *bench_alloc(size_t bytes);
void bench_free(void *p);

/* "a/b" into buf. Returns buf; exits the program if it does not fit (paths are ours). */
char *bench_path(char *buf, size_t cap, const char *a, const char *b);

/* 1 when `path` is a regular file (stat follows links), else 0. */
int bench_file_exists(const char *path);

/* Remove a directory tree. Returns 0 or -1 (errno set). */
int bench_rmtree(const char *path);

/* Name of the file system holding `path` ("ext4", "xfs", "tmpfs", ... or "0x<magic>"),
 * and whether it is memory-backed (tmpfs, ramfs). Returns 0 or -1. */
int bench_fs_type(const char *path, char *name, size_t cap, int *in_memory);

/* Free bytes for an unprivileged user on the file system of `path`; 0 when unknown. */
uint64_t bench_free_bytes(const char *path);

/*
 * Make the files under `path` cold: fsync nothing (callers have synced what they wrote), then
 * posix_fadvise(POSIX_FADV_DONTNEED) on every regular file, then `sync` and
 * `echo 1 > /proc/sys/vm/drop_caches` when that file is writable (root).
 * Returns the method used: "fadvise+drop_caches" or "fadvise".
 */
const char *bench_drop_cache(const char *path);

/* Write all of buf at off (pwrite loop). Returns 0 or -errno. */
int bench_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* Read exactly len bytes at off (pread loop; a short file is -EIO). Returns 0 or -errno. */
int bench_pread_all(int fd, void *buf, size_t len, uint64_t off);

#endif
