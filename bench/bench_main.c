/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_main.c — kvdb-bench: option parsing, the data directory, subcommand dispatch,
 * and the JSON line.
 *
 *   kvdb-bench SUBCOMMAND [--quick] [--json] [--dir PATH] [--keep] [--seed N] [--model-dir DIR]
 *              [--keys model|independent]
 *
 * Each run makes a fresh directory kvdb-bench-XXXXXX under PATH (default $TMPDIR, else
 * /var/tmp; never a tmpfs when it can be avoided, since O_DIRECT and real disk speed matter)
 * and deletes it at the end unless --keep is given. A new subcommand is one bench_cmd entry
 * below and one file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "bench_decode.h"
#include "bench_frames.h"
#include "bench_rev.h"
#include "kvdb.h"

#ifndef BENCH_BUILDTYPE
#define BENCH_BUILDTYPE "unknown"
#endif
#ifndef BENCH_MODEL_DIR
#define BENCH_MODEL_DIR "../shared/models"
#endif

static const bench_cmd CMDS[] = {
  {"store", "put/get/lookup/get_tokens against raw O_DIRECT I/O, memcpy, file-per-block and LMDB",
   bench_store},
  {"compact", "kvdb_compact of the same dead segments in databases of 25k to 200k blocks",
   bench_compact},
  {"compress", "section codecs: ratio, encode/decode GB/s and quality on real and synthetic KV",
   bench_compress},
  {"layout", "compress's stored bytes over logical bytes per config alone (stories260K), packed "
   "objects against whole pages, and their get / get_tokens speeds", bench_layout},
  {"getspeed", "compress's cold get vs raw O_DIRECT read alone (int4_logical_get_vs_raw_read, "
   "synthetic Llama-3-8B-shaped context)", bench_getspeed},
  {"truth", "compress's issue-16 part alone: kvquant int4 targets, the causal quality metric vs "
   "stories260K's next-token agreement and KL", bench_truth},
  {"truth-llama", "the quality truth on SmolLM2-135M (numpy forward of its GGUF, KV through "
   "kvdb): agreement and KL per config, Spearman of the profiled quality vs agreement",
   bench_truth_llama},
  {"decode-model", "stories260K decoding with sparse attention over KV kept in kvdb: greedy "
                   "agreement with dense at 5-100% budgets, selection designs", bench_decode_model},
  {"score", "near-data top-k scoring: int8/int4 scan GB/s vs a streaming read, recall vs exact, "
   "the emulated SmartSSD", bench_score},
  {"prefix", "time to first token with a stored prefix vs a full prefill (stories260K); ingest "
   "tokens/s", bench_prefix},
  {"policy", "EvicPress placement vs LRU and fixed compression + LRU on a trace (measured tiers, "
   "real-KV profiles)", bench_policy},
  {"background", "kvdb_stat latency and rebalance planning against the store's size; rebalance "
   "step times", bench_background},
  {"growth", "put, lookup, compact, verify and catalog size from 10k to 1M blocks (tiny model); "
   "catalog size over delete-and-compact cycles", bench_growth},
  {"llama", "kvdb as llama.cpp's prefix cache (SmolLM2-135M): TTFT at 25-99% hit, the Python "
   "package's put/get vs the C API", bench_llama},
  {"remote", "the remote tier on a local redis-server: get vs redis-benchmark, chain lookup round "
   "trips, wrong KV under 10k injected faults, put p99 with Redis down", bench_remote},
  {"remote-get", "the get phase of remote alone (for perf record): kvdb_get blocks/s from Redis "
   "and one redis-benchmark GET run", bench_remote_get},
  {"remote-tags", "Redis Cluster hash tags on a local 3-master cluster: 64-block chain lookups "
   "and gets with keys spread over the slots vs one tag per chain root", bench_remote_tags},
  {"prefetch", "TierKV prefetch: foreground p99 under prefetch, prefetched vs DRAM TTFT, serving "
              "simulation (LRU/LFU/static/oracle/K=1..8), gets into GPU memory", bench_prefetch},
  {"decode", "decode steps from the store (Llama-3-8B shape, 32k tokens): hot-pool hits, read "
   "amplification, host bytes and step I/O vs reading the whole context", bench_decode},
};
#define N_CMDS (sizeof CMDS / sizeof CMDS[0])

static void usage(FILE *f)
{
  fprintf(f,
          "usage: kvdb-bench SUBCOMMAND [--quick] [--json] [--dir PATH] [--keep] [--seed N]\n"
          "                  [--model-dir DIR] [--keys model|independent]\n"
          "\n"
          "subcommands:\n");
  for (size_t i = 0; i < N_CMDS; i++)
    fprintf(f, "  %-8s %s\n", CMDS[i].name, CMDS[i].summary);
  fprintf(f,
          "\n"
          "options:\n"
          "  --quick     fewer contexts and repetitions (store: under a minute)\n"
          "  --json      print one JSON object with every figure as the last line of stdout\n"
          "  --dir PATH  put the data in a fresh directory under PATH (default $TMPDIR,\n"
          "              else /var/tmp); it is deleted at the end\n"
          "  --keep      do not delete the data directory at the end\n"
          "  --seed N    seed of the synthetic data and random choices (default 1)\n"
          "  --model-dir DIR  compress, prefix, policy: the folder holding stories260K/ (default\n"
          "              $KVDB_MODEL_DIR, else " BENCH_MODEL_DIR ")\n"
          "  --keys K    decode: the synthetic keys, 'model' (default: the reference model's\n"
          "              recency and clustering reproduced) or 'independent' (datagen's, the worst\n"
          "              case for page groups)\n"
          "  -h, --help  this text\n"
          "\n"
          "Human-readable figures go to stdout, progress to stderr. See bench/README.md.\n");
}

/* A directory on a disk file system under which to create the run directory. */
static const char *pick_base(const char *user, char *fs, size_t fs_cap, int *in_mem)
{
  if (user != NULL) {
    if (mkdir(user, 0755) != 0 && errno != EEXIST) {
      bench_log("cannot create --dir '%s': %s", user, strerror(errno));
      return NULL;
    }
    return user;
  }
  const char *cand[2] = {getenv("TMPDIR"), "/var/tmp"};
  for (int i = 0; i < 2; i++) {
    if (cand[i] == NULL || cand[i][0] == 0)
      continue;
    if (bench_fs_type(cand[i], fs, fs_cap, in_mem) != 0)
      continue;
    if (!*in_mem)
      return cand[i];
    bench_log("%s is on %s (memory): not using it for disk figures", cand[i], fs);
  }
  return "/var/tmp";
}

int main(int argc, char **argv)
{
  const char *cmd_name = NULL, *dir_opt = NULL, *model_dir = NULL, *keys = "model";
  int quick = 0, json = 0, keep = 0;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0) {
      quick = 1;
    } else if (strcmp(a, "--json") == 0) {
      json = 1;
    } else if (strcmp(a, "--keep") == 0) {
      keep = 1;
    } else if (strcmp(a, "--dir") == 0 || strcmp(a, "--seed") == 0) {
      if (i + 1 >= argc) {
        bench_log("%s needs a value", a);
        return 2;
      }
      if (a[2] == 'd') {
        dir_opt = argv[++i];
      } else {
        char *end;
        errno = 0;
        seed = strtoull(argv[++i], &end, 0);
        if (errno != 0 || *end != 0) {
          bench_log("--seed '%s' is not a number", argv[i]);
          return 2;
        }
      }
    } else if (strncmp(a, "--dir=", 6) == 0) {
      dir_opt = a + 6;
    } else if (strcmp(a, "--model-dir") == 0) {
      if (i + 1 >= argc) {
        bench_log("%s needs a value", a);
        return 2;
      }
      model_dir = argv[++i];
    } else if (strncmp(a, "--model-dir=", 12) == 0) {
      model_dir = a + 12;
    } else if (strcmp(a, "--keys") == 0 || strncmp(a, "--keys=", 7) == 0) {
      if (a[6] == '=') {
        keys = a + 7;
      } else if (i + 1 >= argc) {
        bench_log("%s needs a value", a);
        return 2;
      } else {
        keys = argv[++i];
      }
      if (strcmp(keys, "model") != 0 && strcmp(keys, "independent") != 0) {
        bench_log("--keys '%s' is neither 'model' nor 'independent'", keys);
        return 2;
      }
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (a[0] == '-') {
      bench_log("unknown option '%s'", a);
      usage(stderr);
      return 2;
    } else if (cmd_name == NULL) {
      cmd_name = a;
    } else {
      bench_log("unexpected argument '%s'", a);
      return 2;
    }
  }
  if (cmd_name == NULL) {
    usage(stderr);
    return 2;
  }
  const bench_cmd *cmd = NULL;
  for (size_t i = 0; i < N_CMDS; i++)
    if (strcmp(CMDS[i].name, cmd_name) == 0)
      cmd = &CMDS[i];
  if (cmd == NULL) {
    bench_log("unknown subcommand '%s'", cmd_name);
    usage(stderr);
    return 2;
  }

  char fs[32] = "";
  int in_mem = 0;
  const char *base = pick_base(dir_opt, fs, sizeof fs, &in_mem);
  if (base == NULL)
    return 1;
  char dir[4096];
  int n = snprintf(dir, sizeof dir, "%s/kvdb-bench-XXXXXX", base);
  if (n < 0 || (size_t)n >= sizeof dir) {
    bench_log("--dir '%s' is too long", base);
    return 2;
  }
  if (mkdtemp(dir) == NULL) {
    bench_log("cannot create a directory under '%s': %s", base, strerror(errno));
    return 1;
  }
  if (bench_fs_type(dir, fs, sizeof fs, &in_mem) != 0)
    snprintf(fs, sizeof fs, "unknown");
  if (in_mem)
    bench_log("WARNING: %s is on %s, a memory file system: reads cannot be made cold and the "
              "disk figures measure memory, not a disk. Use --dir on a disk.", dir, fs);

  bench_env env = {
    .dir = dir, .fs_type = fs, .is_tmpfs = in_mem, .quick = quick, .json = json, .keep = keep, .seed = seed,
    .out = stdout, .revision = BENCH_REVISION, .buildtype = BENCH_BUILDTYPE,
    .model_dir = model_dir, .keys = keys,
  };
  fprintf(stdout, "kvdb-bench %s%s — kvdb %u.%u.%u, revision %s, %s build; data in %s (%s)\n",
          cmd->name, quick ? " --quick" : "", KVDB_VERSION_MAJOR, KVDB_VERSION_MINOR,
          KVDB_VERSION_PATCH, env.revision, env.buildtype, dir, fs);
  fflush(stdout);

  bench_json j = {0};
  bench_json_str(&j, "bench", cmd->name);
  bench_json_str(&j, "revision", env.revision);
  bench_json_str(&j, "build_type", env.buildtype);
  bench_json_int(&j, "kvdb_version", (int64_t)kvdb_version_number());
  bench_json_bool(&j, "quick", quick);
  bench_json_int(&j, "seed", (int64_t)seed);
  bench_json_str(&j, "fs_type", fs);
  bench_json_bool(&j, "data_in_memory", in_mem);
  bench_json_int(&j, "nproc", (int64_t)sysconf(_SC_NPROCESSORS_ONLN));

  int rc = cmd->run(&env, &j);

  if (keep) {
    bench_log("kept the data in %s", dir);
  } else if (bench_rmtree(dir) != 0) {
    bench_log("could not delete %s: %s", dir, strerror(errno));
  }
  if (rc == 77) { /* skipped: the subcommand said what it looked for */
    bench_json_free(&j);
    fflush(stdout);
    return 77;
  }
  if (rc == 0 && json && bench_json_print(&j, stdout) != 0) {
    bench_log("out of memory building the JSON line");
    rc = 1;
  }
  bench_json_free(&j);
  fflush(stdout);
  return rc == 0 ? 0 : 1;
}
