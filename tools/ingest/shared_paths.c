/* SPDX-License-Identifier: MIT */
/*
 * tools/ingest/shared_paths.c — default locations of ../shared's model and corpus
 * (shared_paths.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "shared_paths.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef KVDB_DEFAULT_SHARED_DIR
#define KVDB_DEFAULT_SHARED_DIR "../shared"
#endif

static int is_file(const char *p)
{
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static const char *env(const char *name)
{
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

/* Candidate folders: $dir_var/sub, $KVDB_SHARED_DIR/kind/sub, default/kind/sub. */
static int candidates(const char *dir_var, const char *kind, const char *sub, char out[3][4096])
{
  int n = 0;
  const char *d = env(dir_var), *s = env("KVDB_SHARED_DIR");
  if (d != NULL)
    snprintf(out[n++], 4096, "%.3000s/%s", d, sub);
  if (s != NULL)
    snprintf(out[n++], 4096, "%.3000s/%s/%s", s, kind, sub);
  snprintf(out[n++], 4096, "%.3000s/%s/%s", KVDB_DEFAULT_SHARED_DIR, kind, sub);
  return n;
}

static void note(char *looked, size_t cap, size_t *used, const char *path)
{
  if (*used < cap) {
    int k = snprintf(looked + *used, cap - *used, "%s'%s'", *used ? ", " : "", path);
    if (k > 0)
      *used += (size_t)k;
  }
}

int shared_find_model(char *model, char *tok, size_t cap, char *looked, size_t looked_cap)
{
  char dirs[3][4096];
  int n = candidates("KVDB_MODEL_DIR", "models", "stories260K", dirs);
  size_t used = 0;
  if (looked_cap > 0)
    looked[0] = '\0';
  for (int i = 0; i < n; i++) {
    snprintf(model, cap, "%.4000s/stories260K.bin", dirs[i]);
    snprintf(tok, cap, "%.4000s/tok512.bin", dirs[i]);
    if (is_file(model) && is_file(tok))
      return 0;
    note(looked, looked_cap, &used, is_file(model) ? tok : model);
  }
  return -1;
}

int shared_find_corpus(char *corpus, size_t cap, char *looked, size_t looked_cap)
{
  char dirs[3][4096];
  int n = candidates("KVDB_CORPUS_DIR", "corpora", "tinystories", dirs);
  size_t used = 0;
  if (looked_cap > 0)
    looked[0] = '\0';
  for (int i = 0; i < n; i++) {
    snprintf(corpus, cap, "%.4000s/tinystories_validation_head.txt", dirs[i]);
    if (is_file(corpus))
      return 0;
    note(looked, looked_cap, &used, corpus);
  }
  return -1;
}
