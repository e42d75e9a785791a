/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_verify.c — kvdb_verify against a damaged catalog, and kvdb_repair.
 *
 * A database of three contexts (A: 64 tokens in 4 blocks; B: A's first 2 blocks and 2 of its
 * own; C: 40 tokens) has one field of one catalog record changed through LMDB directly (the
 * way a bad sector, a stray write or a bug would). Each time: kvdb_verify reports it, naming
 * the context, the block and the field; a dry-run repair (on a read-only handle) says what it
 * would do and changes no byte of the catalog; the repair makes verify clean, and then every
 * context's get returns its full, correct KV, or the damaged context is gone and its get
 * misses (or hits the prefix another context shares, with correct KV) — never other KV.
 */
#include "kvdb_test.h"
#include "cat_edit.h" /* white-box: LMDB directly */

#include <sys/stat.h>
#include <sys/wait.h>

#include "catalog/catalog.h"

static kvdb_model M = {"test-verify", 2, 2, 64, KVDB_F16, 16};

static kvdb_options opts(int rdonly)
{
  kvdb_options o;
  kvdb_options_init(&o);
  o.dram_bytes = 0;
  o.log_level = -1;
  o.flags = rdonly ? (uint32_t)KVDB_O_RDONLY : (uint32_t)KVDB_O_CREATE;
  return o;
}

static kvdb *t_open(const char *dir, int rdonly)
{
  kvdb_options o = opts(rdonly);
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  return db;
}

static uint32_t TA[64], TB[64], TC[40];

static void make_db(const char *dir)
{
  uint64_t s = 77;
  for (int i = 0; i < 64; i++)
    TA[i] = (uint32_t)(t_rand(&s) % 32000);
  memcpy(TB, TA, 32 * 4);
  for (int i = 32; i < 64; i++)
    TB[i] = (uint32_t)(t_rand(&s) % 32000);
  for (int i = 0; i < 40; i++)
    TC[i] = (uint32_t)(t_rand(&s) % 32000);
  kvdb *db = t_open(dir, 0);
  t_put_kv(db, &M, TA, 64, NULL);
  t_put_kv(db, &M, TB, 64, NULL);
  t_put_kv(db, &M, TC, 40, NULL);
  kvdb_close(db);
}

/* ---- damage through LMDB ---- */

typedef void (*edit_fn)(uint8_t *rec, size_t *len);

/* Rewrite record `key` of the blocks or (contexts) the contexts: edit changes its bytes. */
static void edit_record(const char *dir, int contexts, const uint8_t key[16], edit_fn edit)
{
  t_cat_edit(dir, contexts ? T_CAT_CONTEXTS : T_CAT_BLOCKS, key, 16, edit);
}

static void add_le32(uint8_t *p, uint32_t d)
{
  uint32_t x;
  memcpy(&x, p, 4);
  x += d;
  memcpy(p, &x, 4);
}
static void add_le64(uint8_t *p, uint64_t d)
{
  uint64_t x;
  memcpy(&x, p, 8);
  x += d;
  memcpy(p, &x, 8);
}

/* block record: 4 refcount, 8 n_tokens, 16 segment, 24 offset, 32 bytes, 40 parent, 56 model,
 * 72 tokens (FORMAT.md §2) */
static void e_token(uint8_t *r, size_t *len) { (void)len; add_le32(r + 72 + 4 * 5, 1); }
static void e_n_tokens(uint8_t *r, size_t *len) { (void)len; add_le32(r + 8, (uint32_t)-1); }
static void e_n_tokens_len(uint8_t *r, size_t *len) /* 15 tokens, record cut to match */
{
  add_le32(r + 8, (uint32_t)-1);
  *len -= 4;
}
static void e_offset(uint8_t *r, size_t *len) { (void)len; add_le64(r + 24, 4096); }
static void e_offset_prev(uint8_t *r, size_t *len) /* onto the block before */
{
  (void)len;
  add_le64(r + 24, (uint64_t)-20480);
}
static void e_offset_far(uint8_t *r, size_t *len) { (void)len; add_le64(r + 24, 1ull << 40); }
static void e_bytes(uint8_t *r, size_t *len) { (void)len; add_le64(r + 32, 4096); }
static void e_segment(uint8_t *r, size_t *len) { (void)len; add_le64(r + 16, 1000); }
static void e_refcount(uint8_t *r, size_t *len) { (void)len; add_le32(r + 4, 4); }
static void e_refcount0(uint8_t *r, size_t *len) { (void)len; memset(r + 4, 0, 4); }
static void e_parent(uint8_t *r, size_t *len) { (void)len; r[40 + 3] ^= 0x10; }
static void e_model(uint8_t *r, size_t *len) { (void)len; r[56 + 9] ^= 0x01; }
/* context record (version 1): 8 n_tokens, 56 block hashes */
static void e_ctx_n_tokens(uint8_t *r, size_t *len)
{
  (void)len;
  add_le64(r + 8, (uint64_t)-29);
}
static void e_ctx_n_tokens_big(uint8_t *r, size_t *len) { (void)len; add_le64(r + 8, 1ull << 40); }
static void e_ctx_hash(uint8_t *r, size_t *len) { (void)len; r[56 + 16 * 2 + 7] ^= 0x40; }

/* ---- problems ---- */

#define MAX_MSGS 64
typedef struct msgs {
  int n;
  char m[MAX_MSGS][720];
} msgs;

static void collect(void *ctx, const kvdb_problem *p)
{
  msgs *s = ctx;
  ASSERT(p->status == KVDB_CORRUPT || p->status == KVDB_IOERR);
  if (s->n < MAX_MSGS)
    snprintf(s->m[s->n++], sizeof s->m[0], "%s", p->message);
}

/* a message that has all of a, b, c (NULL: any) */
static int has_msg(const msgs *s, const char *a, const char *b, const char *c)
{
  for (int i = 0; i < s->n; i++)
    if ((a == NULL || strstr(s->m[i], a)) && (b == NULL || strstr(s->m[i], b)) &&
        (c == NULL || strstr(s->m[i], c)))
      return 1;
  return 0;
}

static void dump(const msgs *s)
{
  for (int i = 0; i < s->n; i++)
    fprintf(stderr, "  %s\n", s->m[i]);
}

static char *read_file(const char *path, size_t *len)
{
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  ASSERT(fread(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

enum { REBUILT, DROPPED, COUNTS };

typedef struct dcase {
  const char *name;
  int contexts;   /* damage A's context record, else the block record of A's block `blk` */
  int blk;
  edit_fn edit;
  const char *field; /* what the problem names */
  int outcome;       /* REBUILT: A whole again; DROPPED: A gone; COUNTS: only counts fixed */
} dcase;

static void run_case(const dcase *c)
{
  char *dir = t_tmpdir("verify");
  make_db(dir);
  kvdb_key ha[4], hb[4], hc[3];
  ASSERT_OK(kvdb_chain_hashes(&M, TA, 64, ha, 4));
  ASSERT_OK(kvdb_chain_hashes(&M, TB, 64, hb, 4));
  ASSERT_OK(kvdb_chain_hashes(&M, TC, 40, hc, 3));
  const uint8_t *target = c->contexts ? ha[3].b : ha[c->blk].b;
  edit_record(dir, c->contexts, target, c->edit);

  /* verify names the context, the block and the field */
  char ka[33], kb[33];
  kvdb_key_hex(&ha[3], ka); /* A's key: its last block's hash */
  if (!c->contexts)
    kvdb_key_hex(&ha[c->blk], kb);
  kvdb *db = t_open(dir, 1);
  msgs s = {0};
  kvdb_verify_report vr;
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, collect, NULL, &s, &vr));
  ASSERT(vr.problems > 0 && (uint64_t)s.n == vr.problems);
  char kbb[33]; /* a block A shares with B may be named with either context */
  kvdb_key_hex(&hb[3], kbb);
  if (!has_msg(&s, ka, c->contexts ? NULL : kb, c->field) &&
      !(c->blk < 2 && !c->contexts && has_msg(&s, kbb, kb, c->field))) {
    fprintf(stderr, "%s: no problem names context %s, block %s and '%s':\n", c->name, ka,
            c->contexts ? "-" : kb, c->field);
    dump(&s);
    abort();
  }
  { /* never wrong KV, even before the repair: a hit, a miss or an error */
    uint16_t *buf = calloc(64, kvdb_model_token_bytes(&M));
    kvdb_kv_view v;
    ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, 64, KVDB_LAYOUT_LKTHD));
    size_t hit = 0;
    if (kvdb_get(db, &M, TA, 64, &v, &hit) == KVDB_OK)
      ASSERT_EQ(t_check_kv(&M, TA, hit, 64, buf), hit);
    free(buf);
  }

  /* a dry run on a read-only handle: says what it would do, writes nothing */
  char path[4200];
  snprintf(path, sizeof path, "%s/catalog.mdb", dir);
  size_t l0, l1;
  char *before = read_file(path, &l0);
  msgs acts = {0};
  kvdb_repair_report dry, real;
  ASSERT_OK(kvdb_repair(db, KVDB_REPAIR_DRY_RUN, collect, NULL, &acts, &dry));
  ASSERT(acts.n > 0 && strncmp(acts.m[0], "would ", 6) == 0);
  if (dry.problems != vr.problems)
    dump(&s);
  ASSERT_EQ(dry.problems, vr.problems);
  ASSERT_STATUS(KVDB_READONLY, kvdb_repair(db, 0, NULL, NULL, NULL, &real));
  ASSERT_MSG_HAS("read-only");
  kvdb_close(db);
  char *after = read_file(path, &l1);
  ASSERT(l0 == l1 && memcmp(before, after, l0) == 0);
  free(before);
  free(after);

  /* the repair */
  db = t_open(dir, 0);
  msgs done = {0};
  ASSERT_OK(kvdb_repair(db, 0, collect, NULL, &done, &real));
  ASSERT_EQ(real.blocks_rebuilt, dry.blocks_rebuilt);
  ASSERT_EQ(real.contexts_rebuilt, dry.contexts_rebuilt);
  ASSERT_EQ(real.contexts_dropped, dry.contexts_dropped);
  ASSERT_EQ(real.blocks_dropped, dry.blocks_dropped);
  ASSERT_EQ(real.skipped, 0);
  kvdb_close(db);
  db = t_open(dir, 0);
  msgs again = {0};
  kvdb_status vs = kvdb_verify(db, collect, NULL, &again, &vr);
  if (vs != KVDB_OK) {
    fprintf(stderr, "%s: verify after repair: %s\n", c->name, kvdb_status_name(vs));
    dump(&again);
    abort();
  }
  kvdb_context_info ci;
  if (c->outcome == DROPPED) {
    ASSERT_EQ(real.contexts_dropped, 1);
    ASSERT_STATUS(KVDB_NOTFOUND, kvdb_context_stat(db, &ha[3], &ci));
    size_t hit = t_get_check(db, &M, TA, 64);
    ASSERT(hit == 0 || hit == 32); /* B's shared prefix at most */
  } else {
    ASSERT_EQ(real.contexts_dropped, 0);
    ASSERT_OK(kvdb_context_stat(db, &ha[3], &ci));
    ASSERT_EQ(ci.n_tokens, 64);
    ASSERT_EQ(t_get_check(db, &M, TA, 64), 64);
    size_t hit;
    ASSERT_OK(kvdb_lookup(db, &M, TA, 64, &hit));
    ASSERT_EQ(hit, 64);
  }
  if (c->outcome == REBUILT)
    ASSERT(real.blocks_rebuilt + real.contexts_rebuilt >= 1);
  /* the others are whole */
  ASSERT_EQ(t_get_check(db, &M, TB, 64), 64);
  ASSERT_EQ(t_get_check(db, &M, TC, 40), 40);
  ASSERT_OK(kvdb_context_stat(db, &hb[3], &ci));
  ASSERT_EQ(ci.n_tokens, 64);
  /* a second repair finds nothing to do; compaction and puts go on */
  ASSERT_OK(kvdb_repair(db, 0, NULL, NULL, NULL, &real));
  ASSERT_EQ(real.problems + real.blocks_rebuilt + real.contexts_dropped + real.blocks_dropped +
                real.refcounts_fixed + real.segments_fixed,
            0);
  if (c->outcome == DROPPED) {
    t_put_kv(db, &M, TA, 64, NULL);
    ASSERT_EQ(t_get_check(db, &M, TA, 64), 64);
  }
  ASSERT_OK(kvdb_compact(db, 1.0, NULL, NULL, NULL));
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  ASSERT_EQ(t_get_check(db, &M, TB, 64), 64);
  kvdb_close(db);
  printf("  %-22s ok (%d problems, e.g. %s)\n", c->name, s.n, s.m[0]);
  t_rmdir(dir);
}

/* The case: one token of a block record changed turns a 64-token context into a
 * shorter hit while stat says 64 and verify said OK. */
static void test_token_flip_short_hit(void)
{
  char *dir = t_tmpdir("verify");
  make_db(dir);
  kvdb_key ha[4];
  ASSERT_OK(kvdb_chain_hashes(&M, TA, 64, ha, 4));
  edit_record(dir, 0, ha[2].b, e_token);
  kvdb *db = t_open(dir, 0);
  ASSERT_EQ(t_get_check(db, &M, TA, 64), 37); /* the walk stops at the changed token */
  kvdb_context_info ci;
  ASSERT_OK(kvdb_context_stat(db, &ha[3], &ci));
  ASSERT_EQ(ci.n_tokens, 64);
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_repair_report r;
  ASSERT_OK(kvdb_repair(db, 0, NULL, NULL, NULL, &r));
  ASSERT_EQ(r.blocks_rebuilt, 1);
  ASSERT_EQ(t_get_check(db, &M, TA, 64), 64);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}


/* Another process deletes context A (whose block record the repair plans to rebuild) and puts
 * a new context while the repair reads its snapshot (from its progress callback): the write
 * transaction finds A's record changed and leaves it (skipped), so the deleted block is not
 * brought back; what still stands is repaired; the new context is untouched. */
static const char *g_dir;
static int g_forked;
static uint32_t TD[48];
static void fork_writer(void *ctx, uint64_t done, uint64_t total)
{
  (void)ctx;
  (void)done;
  (void)total;
  if (g_forked++)
    return;
  pid_t pid = fork();
  if (pid == 0) {
    kvdb *db = t_open(g_dir, 0);
    kvdb_key ha[4];
    if (kvdb_chain_hashes(&M, TA, 64, ha, 4) != KVDB_OK || kvdb_delete(db, &ha[3]) != KVDB_OK)
      _exit(1);
    t_put_kv(db, &M, TD, 48, NULL);
    kvdb_close(db);
    _exit(0);
  }
  int status;
  ASSERT(waitpid(pid, &status, 0) == pid);
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_repair_rechecks(void)
{
  char *dir = t_tmpdir("verify");
  make_db(dir);
  uint64_t seed = 5;
  for (int i = 0; i < 48; i++)
    TD[i] = (uint32_t)(t_rand(&seed) % 32000);
  kvdb_key ha[4], hc[3], hd[3];
  ASSERT_OK(kvdb_chain_hashes(&M, TA, 64, ha, 4));
  ASSERT_OK(kvdb_chain_hashes(&M, TC, 40, hc, 3));
  ASSERT_OK(kvdb_chain_hashes(&M, TD, 48, hd, 3));
  edit_record(dir, 0, ha[2].b, e_token);        /* A: planned for a rebuild */
  edit_record(dir, 1, hc[2].b, e_ctx_n_tokens); /* C: planned for a new count */
  g_dir = dir;
  g_forked = 0;
  kvdb *db = t_open(dir, 0);
  kvdb_repair_report r;
  ASSERT_OK(kvdb_repair(db, 0, NULL, fork_writer, NULL, &r));
  ASSERT_EQ(g_forked > 0, 1);
  ASSERT_EQ(r.skipped, 1);        /* A's block record changed (deleted) meanwhile */
  ASSERT_EQ(r.blocks_rebuilt, 0);
  ASSERT_EQ(r.contexts_rebuilt, 1); /* C's count */
  ASSERT_EQ(r.contexts_dropped, 0);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  kvdb_context_info ci;
  ASSERT_STATUS(KVDB_NOTFOUND, kvdb_context_stat(db, &ha[3], &ci));
  ASSERT_EQ(t_get_check(db, &M, TA, 64), 32); /* B's blocks; A's own stay deleted */
  ASSERT_OK(kvdb_context_stat(db, &hc[2], &ci));
  ASSERT_EQ(ci.n_tokens, 40);
  ASSERT_EQ(t_get_check(db, &M, TD, 48), 48);
  ASSERT_EQ(t_get_check(db, &M, TC, 40), 40);
  kvdb_close(db);
  t_rmdir(dir);
}

/* A block stored twice in one segment (int8 first, then rewritten raw by a raw put sharing it):
 * when its record's offset is damaged, which copy it meant cannot be told, so the contexts
 * listing it are dropped rather than rebuilt on a copy that may be the int8 one. */
static void test_two_copies_not_guessed(void)
{
  char *dir = t_tmpdir("verify");
  uint64_t seed = 9;
  uint32_t td[32], te[48];
  for (int i = 0; i < 32; i++)
    td[i] = (uint32_t)(t_rand(&seed) % 32000);
  memcpy(te, td, 16 * 4);
  for (int i = 16; i < 48; i++)
    te[i] = (uint32_t)(t_rand(&seed) % 32000);
  kvdb *db = t_open(dir, 0);
  uint16_t *buf = malloc(32 * kvdb_model_token_bytes(&M));
  t_fill_kv(&M, td, 32, buf);
  kvdb_kv_view v;
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, 32, KVDB_LAYOUT_LKTHD));
  kvdb_put_opts o;
  kvdb_put_opts_init(&o);
  o.config.method = KVDB_METHOD_QUANT;
  o.config.bits = 8;
  ASSERT_OK(kvdb_put_ex(db, &M, td, 32, &v, &o, NULL));
  free(buf);
  kvdb_put_info info;
  buf = malloc(48 * kvdb_model_token_bytes(&M));
  t_fill_kv(&M, te, 48, buf);
  ASSERT_OK(kvdb_kv_view_packed(&v, buf, &M, 48, KVDB_LAYOUT_LKTHD));
  ASSERT_OK(kvdb_put(db, &M, te, 48, &v, &info));
  free(buf);
  ASSERT_EQ(info.blocks_written, 3); /* block 0 rewritten raw beside its int8 copy */
  kvdb_close(db);
  kvdb_key hd[2], he[3];
  ASSERT_OK(kvdb_chain_hashes(&M, td, 32, hd, 2));
  ASSERT_OK(kvdb_chain_hashes(&M, te, 48, he, 3));
  ASSERT(memcmp(hd[0].b, he[0].b, 16) == 0);
  edit_record(dir, 0, hd[0].b, e_offset_far);
  db = t_open(dir, 0);
  msgs s = {0};
  ASSERT_STATUS(KVDB_CORRUPT, kvdb_verify(db, collect, NULL, &s, NULL));
  if (!has_msg(&s, "field segment/offset", "several copies of it", NULL)) {
    dump(&s);
    abort();
  }
  kvdb_repair_report r;
  ASSERT_OK(kvdb_repair(db, 0, NULL, NULL, NULL, &r));
  ASSERT_EQ(r.blocks_rebuilt, 0);
  ASSERT_EQ(r.contexts_dropped, 2);
  ASSERT_OK(kvdb_verify(db, NULL, NULL, NULL, NULL));
  ASSERT_EQ(t_get_check(db, &M, te, 48), 0);
  kvdb_close(db);
  t_rmdir(dir);
}

static void test_bad_input(void)
{
  char *dir = t_tmpdir("verify");
  make_db(dir);
  kvdb *db = t_open(dir, 0);
  kvdb_repair_report r;
  ASSERT_STATUS(KVDB_INVALID, kvdb_repair(db, 0x10, NULL, NULL, NULL, &r));
  ASSERT_MSG_HAS("flags");
  ASSERT_STATUS(KVDB_INVALID, kvdb_repair(NULL, 0, NULL, NULL, NULL, &r));
  /* a clean database: nothing to do */
  ASSERT_OK(kvdb_repair(db, 0, NULL, NULL, NULL, &r));
  ASSERT_EQ(r.problems + r.blocks_rebuilt + r.contexts_dropped + r.refcounts_fixed, 0);
  ASSERT_OK(kvdb_repair(db, 0, NULL, NULL, NULL, NULL));
  kvdb_close(db);
  t_rmdir(dir);
}

int main(void)
{
  static const dcase cases[] = {
    {"block tokens", 0, 2, e_token, "field tokens", REBUILT},
    {"shared block tokens", 0, 0, e_token, "field tokens", REBUILT},
    {"block n_tokens", 0, 2, e_n_tokens, "field n_tokens", REBUILT},
    {"block n_tokens + len", 0, 3, e_n_tokens_len, "field n_tokens", REBUILT},
    {"block offset", 0, 3, e_offset, "field offset", REBUILT},
    {"block offset: other block", 0, 2, e_offset_prev, "field offset", REBUILT},
    {"block offset: past end", 0, 1, e_offset_far, "field offset", REBUILT},
    {"block bytes", 0, 2, e_bytes, "field bytes", REBUILT},
    {"block segment", 0, 2, e_segment, "field segment", DROPPED},
    {"block refcount", 0, 1, e_refcount, "field refcount", COUNTS},
    {"block refcount 0", 0, 3, e_refcount0, "field refcount", REBUILT},
    {"block parent", 0, 2, e_parent, "field parent", REBUILT},
    {"block model", 0, 3, e_model, "field model", REBUILT},
    {"context n_tokens", 1, -1, e_ctx_n_tokens, "field n_tokens", REBUILT},
    {"context n_tokens huge", 1, -1, e_ctx_n_tokens_big, "field n_tokens", REBUILT},
    {"context block hash", 1, 2, e_ctx_hash, "field blocks[2]", DROPPED},
  };
  test_bad_input();
  test_token_flip_short_hit();
  test_repair_rechecks();
  test_two_copies_not_guessed();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_case(&cases[i]);
  printf("test_verify: all passed\n");
  return 0;
}
