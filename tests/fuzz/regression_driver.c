/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/regression_driver.c — replays fuzz corpora without libFuzzer (zstd's idea).
 *
 * Linked with each fuzz target in normal builds: `fuzz_x DIR_OR_FILE...` feeds every file
 * (recursively for folders) to LLVMFuzzerTestOneInput. Exit 0 when all inputs ran; a crash or
 * sanitizer report is the failure signal, as under libFuzzer. With -Dfuzzing=true the targets
 * link -fsanitize=fuzzer instead and this file is not used.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static long n_inputs;

static int run_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "regression_driver: cannot open '%s'\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
  if (buf == NULL || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
    fprintf(stderr, "regression_driver: cannot read '%s'\n", path);
    fclose(f);
    free(buf);
    return 1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)len);
  free(buf);
  n_inputs++;
  return 0;
}

static int run_path(const char *path)
{
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "regression_driver: no such file or folder '%s'\n", path);
    return 1;
  }
  if (!S_ISDIR(st.st_mode))
    return run_file(path);
  DIR *d = opendir(path);
  if (d == NULL)
    return 1;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    rc |= run_path(sub);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv)
{
  int rc = 0;
  for (int i = 1; i < argc; i++)
    rc |= run_path(argv[i]);
  printf("%ld inputs replayed\n", n_inputs);
  return rc;
}
