/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_util.c — the harness helpers declared in bench.h: samples, the timed loop, the
 * JSON line, directories, file-system type, page-cache dropping.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "bench.h"

/* ---- samples -------------------------------------------------------------------------- */

int bench_samples_push(bench_samples *s, uint64_t ns)
{
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    uint64_t *n = realloc(s->ns, cap * sizeof *n);
    if (n == NULL)
      return -1;
    s->ns = n;
    s->cap = cap;
  }
  s->ns[s->n++] = ns;
  s->sorted = 0;
  return 0;
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

uint64_t bench_samples_pct(bench_samples *s, double p)
{
  if (s->n == 0)
    return 0;
  if (!s->sorted) {
    qsort(s->ns, s->n, sizeof *s->ns, cmp_u64);
    s->sorted = 1;
  }
  /* nearest rank: the smallest sample with at least p% of the samples at or below it */
  double r = ceil(p / 100.0 * (double)s->n);
  size_t k = r < 1 ? 0 : (size_t)r - 1;
  return s->ns[k < s->n ? k : s->n - 1];
}

double bench_samples_mean(const bench_samples *s)
{
  if (s->n == 0)
    return 0;
  double t = 0;
  for (size_t i = 0; i < s->n; i++)
    t += (double)s->ns[i];
  return t / (double)s->n;
}

void bench_samples_free(bench_samples *s)
{
  free(s->ns);
  memset(s, 0, sizeof *s);
}

int bench_fn_run(const bench_fn_opts *o, bench_samples *out)
{
  uint64_t spent = 0;
  for (size_t i = 0; o->max_iters == 0 || i < o->max_iters; i++) {
    if (i >= o->min_iters && spent >= o->min_ns)
      break;
    uint64_t t0 = bench_now_ns();
    int rc = o->fn(o->payload, i);
    uint64_t dt = bench_now_ns() - t0;
    if (rc != 0)
      return rc;
    if (bench_samples_push(out, dt) != 0)
      return -1;
    spent += dt;
  }
  return 0;
}

/* ---- the JSON line ------------------------------------------------------------------------ */

static void jputs(bench_json *j, const char *s, size_t n)
{
  if (j->oom)
    return;
  if (j->len + n + 1 > j->cap) {
    size_t cap = j->cap ? j->cap : 256;
    while (j->len + n + 1 > cap)
      cap *= 2;
    char *b = realloc(j->buf, cap);
    if (b == NULL) {
      j->oom = 1;
      return;
    }
    j->buf = b;
    j->cap = cap;
  }
  memcpy(j->buf + j->len, s, n);
  j->len += n;
  j->buf[j->len] = 0;
}

static void jstr(bench_json *j, const char *s)
{
  jputs(j, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\';
      esc[1] = (char)*p;
      jputs(j, esc, 2);
    } else if (*p < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      jputs(j, esc, 6);
    } else {
      jputs(j, (const char *)p, 1);
    }
  }
  jputs(j, "\"", 1);
}

static void jkey(bench_json *j, const char *key)
{
  if (j->n_fields++ > 0)
    jputs(j, ",", 1);
  jstr(j, key);
  jputs(j, ":", 1);
}

void bench_json_num(bench_json *j, const char *key, double v)
{
  jkey(j, key);
  if (!isfinite(v)) {
    jputs(j, "null", 4);
    return;
  }
  char b[64];
  int n = snprintf(b, sizeof b, "%.6g", v);
  jputs(j, b, (size_t)n);
}

void bench_json_int(bench_json *j, const char *key, int64_t v)
{
  jkey(j, key);
  char b[32];
  int n = snprintf(b, sizeof b, "%lld", (long long)v);
  jputs(j, b, (size_t)n);
}

void bench_json_bool(bench_json *j, const char *key, int v)
{
  jkey(j, key);
  jputs(j, v ? "true" : "false", v ? 4 : 5);
}

void bench_json_str(bench_json *j, const char *key, const char *v)
{
  jkey(j, key);
  jstr(j, v != NULL ? v : "");
}

int bench_json_print(const bench_json *j, FILE *f)
{
  if (j->oom)
    return -1;
  fprintf(f, "{%s}\n", j->buf != NULL ? j->buf : "");
  return 0;
}

void bench_json_free(bench_json *j)
{
  free(j->buf);
  memset(j, 0, sizeof *j);
}

/* ---- files, memory, page cache ------------------------------------------------------------ */

void bench_log(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fputs("kvdb-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void *bench_alloc(size_t bytes)
{
  void *p = NULL;
  size_t n = (bytes + 4095) / 4096 * 4096;
  /* Big buffers get huge pages, as kvdb's own I/O buffers do: every store and baseline then
   * moves data from the same kind of memory, and O_DIRECT requests from it are not cut at the
   * queue's segment limit (254 x 4 KiB on this machine's virtio disk). */
  size_t align = n >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 4096;
  if (n == 0 || posix_memalign(&p, align, n) != 0)
    return NULL;
  if (align > 4096)
    madvise(p, n, MADV_HUGEPAGE); /* advisory */
  memset(p, 0, n); /* first touch now, not inside a timed region */
  return p;
}

void bench_free(void *p)
{
  free(p);
}

char *bench_path(char *buf, size_t cap, const char *a, const char *b)
{
  int n = snprintf(buf, cap, "%s/%s", a, b);
  if (n < 0 || (size_t)n >= cap) {
    bench_log("path '%s/%s' is too long", a, b);
    exit(2);
  }
  return buf;
}

int bench_file_exists(const char *path)
{
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char *bench_met(int ok)
{
  return ok ? "met" : "MISSED";
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)ftw;
  int rc = (flag == FTW_DP) ? rmdir(path) : unlink(path);
  return rc == 0 || errno == ENOENT ? 0 : -1;
}

int bench_rmtree(const char *path)
{
  return nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

int bench_fs_type(const char *path, char *name, size_t cap, int *in_memory)
{
  struct statfs sf;
  *in_memory = 0;
  if (statfs(path, &sf) != 0)
    return -1;
  static const struct {
    unsigned long magic;
    const char *name;
    int mem;
  } known[] = {
    {0xEF53, "ext4", 0},          {0x58465342, "xfs", 0},     {0x9123683E, "btrfs", 0},
    {0xF2F52010, "f2fs", 0},      {0x2FC12FC1, "zfs", 0},     {0x6969, "nfs", 0},
    {0x794C7630, "overlayfs", 0}, {0x01021994, "tmpfs", 1},   {0x858458F6, "ramfs", 1},
    {0x65735546, "fuse", 0},      {0xFF534D42, "cifs", 0},    {0x5346544E, "ntfs", 0},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if ((unsigned long)sf.f_type == known[i].magic) {
      snprintf(name, cap, "%s", known[i].name);
      *in_memory = known[i].mem;
      return 0;
    }
  snprintf(name, cap, "0x%lx", (unsigned long)sf.f_type);
  return 0;
}

uint64_t bench_free_bytes(const char *path)
{
  struct statvfs sv;
  if (statvfs(path, &sv) != 0)
    return 0;
  return (uint64_t)sv.f_bavail * sv.f_frsize;
}

static int fadvise_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)ftw;
  if (flag != FTW_F || !S_ISREG(st->st_mode))
    return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  return 0;
}

const char *bench_drop_cache(const char *path)
{
  sync();
  nftw(path, fadvise_one, 32, FTW_PHYS);
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return "fadvise";
  ssize_t w = write(fd, "1\n", 2);
  close(fd);
  return w == 2 ? "fadvise+drop_caches" : "fadvise";
}

int bench_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
  const char *p = buf;
  while (len > 0) {
    ssize_t n = pwrite(fd, p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

int bench_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
  char *p = buf;
  while (len > 0) {
    ssize_t n = pread(fd, p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    if (n == 0)
      return -EIO;
    p += n;
    len -= (size_t)n;
    off += (uint64_t)n;
  }
  return 0;
}

/* ---- the Python parts ---- */

#ifndef BENCH_SOURCE_ROOT
#define BENCH_SOURCE_ROOT "."
#endif
#ifndef BENCH_LIBKVDB
#define BENCH_LIBKVDB ""
#endif

int bench_python(char *buf, size_t cap)
{
  const char *py = getenv("KVDB_PYTHON");
  if (py != NULL && py[0] != 0)
    snprintf(buf, cap, "%s", py);
  else
    snprintf(buf, cap, "%s/.venv/bin/python", BENCH_SOURCE_ROOT);
  if (getenv("KVDB_LIB") == NULL)
    setenv("KVDB_LIB", BENCH_LIBKVDB, 1);
  setenv("KVDB_BENCH_FIELDS", "1", 1);
  return access(buf, X_OK) == 0;
}

/* One '@json NAME VALUE' line (line + 6 = NAME) into j, or to take. */
static void take_field(bench_json *j, char *line, bench_py_take take, void *arg)
{
  char *name = line + 6, *val = strchr(name, ' ');
  if (val == NULL)
    return;
  *val++ = 0;
  val[strcspn(val, "\n")] = 0;
  if (take != NULL && take(arg, name, val))
    return;
  if (strcmp(val, "true") == 0 || strcmp(val, "false") == 0) {
    bench_json_bool(j, name, val[0] == 't');
  } else if (val[0] == '"') {
    size_t n = strlen(val);
    if (n >= 2 && val[n - 1] == '"')
      val[n - 1] = 0;
    bench_json_str(j, name, val + 1);
  } else {
    bench_json_num(j, name, strtod(val, NULL));
  }
}

int bench_run_py(const bench_env *env, bench_json *j, const char *cmd, bench_py_take take,
                 void *arg)
{
  fflush(env->out);
  FILE *p = popen(cmd, "r");
  if (p == NULL) {
    bench_log("cannot run %s", cmd);
    return 1;
  }
  char line[4096];
  while (fgets(line, sizeof line, p) != NULL) {
    if (strncmp(line, "@json ", 6) == 0)
      take_field(j, line, take, arg);
    else
      fputs(line, env->out);
  }
  int st = pclose(p);
  if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 77)
    return 77;
  if (st != 0) {
    bench_log("the Python part (%s) failed (status %d)", cmd, st);
    return 1;
  }
  return 0;
}
