/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_api_ops.c — random sequences of public calls on a small database, checked
 * against an in-memory model of what must be stored.
 *
 * Each input is a fresh database in a temporary directory ($TMPDIR, else /tmp; removed at the
 * end). Byte 0 chooses the options (bit 0 KVDB_SYNC_FULL, bit 1 no DRAM tier, bit 2 O_DIRECT,
 * bit 3 io_uring); then each op is an opcode byte and its argument bytes (missing bytes read
 * as 0; at most MAX_OPS ops). Contexts are built from "recipes" (a family, a variant, a length)
 * so that they share prefixes: whole blocks, partial blocks and blocks that continue part-way.
 *
 * The model is the set of live contexts (token sequences) and explicit-key blocks. Checked
 * after every call while nothing was damaged:
 *   put/put_block/delete/compact/verify/reopen return what the model says (OK, NOTFOUND, or
 *   INVALID for an explicit key stored with other tokens); lookup and get hit exactly the
 *   longest common prefix of the query with a live context; get, get_tokens and get_block
 *   return bit-exact KV; the iterator and kvdb_stat count exactly the live contexts.
 * Two ops damage the database on purpose:
 *   - flip a byte of a segment file: from then on a get may hit less (never more) and
 *     get_tokens/verify may say KVDB_CORRUPT, but every hit must still be bit-exact and lookup
 *     (catalog only) exact: the "never wrong KV" promise;
 *   - change a catalog record's bytes through LMDB (a flipped byte, a truncation, a
 *     replacement): from then on only "every call returns a status, nothing crashes, leaks or
 *     reads out of bounds" is checked, because LMDB pages carry no checksum (README,
 *     Reliability), and that kvdb_verify reports the damage (OK or KVDB_CORRUPT) instead of
 *     stopping on it.
 * KVDB_FUZZ_TRACE=1 prints each op as it runs.
 * Seeds: tests/fuzz/corpora/api_ops/ (made by `fuzz_make_seeds DIR`, tests/fuzz/make_seeds.c).
 */
#include "kvdb_test.h"
#include "catalog/catalog_int.h" /* white-box: LMDB directly */

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>

#include "place/place.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Making and checking KV is the test's own arithmetic: kept out of the coverage map, where it
 * cost libFuzzer most of its time and told it nothing about the engine. */
#if defined(__clang__)
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define NO_COVERAGE
#endif
NO_COVERAGE static uint16_t kv_value(const uint32_t *tok, uint64_t pos, uint32_t layer, uint32_t kv,
                                     uint32_t head, uint32_t dim);
NO_COVERAGE static size_t kv_index(size_t stride, uint32_t l, uint32_t kv, size_t t, uint32_t h,
                                   uint32_t d);
NO_COVERAGE static void fill_kv(const uint32_t *tok, size_t n, uint16_t *buf);
NO_COVERAGE static size_t check_kv(const uint32_t *tok, size_t n, size_t stride,
                                   const uint16_t *buf);

static const kvdb_model M = {"fuzz-model", 2, 2, 64, KVDB_F16, 16};

#define MAXN 96    /* tokens of a context at most (6 blocks) */
#define MAX_CTX 48 /* live contexts the model tracks */
#define MAX_KEYS 8 /* explicit keys */
#define MAX_OPS 64

enum {
  OP_PUT,
  OP_PUT2,
  OP_GET,
  OP_LOOKUP,
  OP_DELETE,
  OP_GET_TOKENS,
  OP_COMPACT,
  OP_REOPEN,
  OP_VERIFY,
  OP_PUT_BLOCK,
  OP_GET_BLOCK,
  OP_DELETE_BLOCK,
  OP_COUNT,
  OP_CORRUPT_SEGMENT,
  OP_CORRUPT_CATALOG,
  OP_N
};

typedef struct input {
  const uint8_t *p;
  size_t n, i;
} input;

static unsigned u8(input *in)
{
  return in->i < in->n ? in->p[in->i++] : 0;
}

typedef struct mctx {
  uint32_t tok[MAXN];
  uint32_t n;
} mctx;

typedef struct state {
  char *dir;
  kvdb_options o;
  kvdb *db;
  mctx ctx[MAX_CTX];
  size_t n_ctx;
  mctx key[MAX_KEYS]; /* n == 0: absent */
  int bad_segment;    /* a segment byte was flipped */
  int bad_catalog;    /* a catalog record was changed */
  uint16_t *buf;      /* MAXN tokens of KV */
} state;

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "fuzz_api_ops:%d: ", __LINE__);                                                \
    fprintf(stderr, __VA_ARGS__);                                                                  \
    fprintf(stderr, " (%s)\n", kvdb_errmsg());                                                     \
    abort();                                                                                       \
  } while (0)

/* A call whose status the model predicts: checked unless the catalog was damaged. */
static void expect(const state *s, kvdb_status got, kvdb_status want, const char *what)
{
  if (s->bad_catalog)
    return;
  if (got != want)
    FAIL("%s: %s, expected %s", what, kvdb_status_name(got), kvdb_status_name(want));
}

/* the value of element (layer, kv, position, head, dim): a function of the tokens up to the
 * position, as in kvdb_test.h (equal prefixes, equal KV) */
static uint16_t kv_value(const uint32_t *tok, uint64_t pos, uint32_t layer, uint32_t kv,
                         uint32_t head, uint32_t dim)
{
  uint64_t z = (tok[pos] * 0x100000001b3ull) ^ (pos > 0 ? tok[pos - 1] * 0x9e3779b97f4a7c15ull : 0);
  z ^= ((uint64_t)layer << 48) ^ ((uint64_t)kv << 40) ^ ((uint64_t)head << 24) ^ dim ^ (pos << 12);
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  return (uint16_t)((z ^ (z >> 29)) & 0x7bff);
}

/* packed LKTHD, `stride` tokens of room */
static size_t kv_index(size_t stride, uint32_t l, uint32_t kv, size_t t, uint32_t h, uint32_t d)
{
  return ((((size_t)l * 2 + kv) * stride + t) * M.n_kv_heads + h) * M.head_dim + d;
}

static void fill_kv(const uint32_t *tok, size_t n, uint16_t *buf)
{
  for (uint32_t l = 0; l < M.n_layers; l++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++)
            buf[kv_index(n, l, kv, t, h, d)] = kv_value(tok, t, l, kv, h, d);
}

/* the first of tokens [0, n) whose KV is wrong, or n */
static size_t check_kv(const uint32_t *tok, size_t n, size_t stride, const uint16_t *buf)
{
  for (size_t t = 0; t < n; t++)
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++)
            if (buf[kv_index(stride, l, kv, t, h, d)] != kv_value(tok, t, l, kv, h, d))
              return t;
  return n;
}

static uint32_t recipe_tokens(unsigned recipe, unsigned len, uint32_t *tok)
{
  unsigned fam = recipe & 3, var = (recipe >> 2) & 7;
  uint32_t n = 1 + len % MAXN;
  for (uint32_t i = 0; i < n; i++) {
    if (i < 24) /* families share a block and a half */
      tok[i] = fam * 97 + i;
    else if (i < 40) /* pairs of variants share two and a half blocks */
      tok[i] = 1000 + fam * 97 + (var & 1) * 31 + i;
    else
      tok[i] = 2000 + fam * 997 + var * 101 + i;
  }
  return n;
}

/* A recipe and a length from the input, in that order. */
static uint32_t read_recipe(input *in, uint32_t *tok)
{
  unsigned recipe = u8(in);
  unsigned len = u8(in);
  return recipe_tokens(recipe, len, tok);
}

static uint32_t lcp(const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb)
{
  uint32_t i = 0;
  while (i < na && i < nb && a[i] == b[i])
    i++;
  return i;
}

/* The longest prefix of q stored: the longest common prefix with a live context. */
static uint32_t expect_hit(const state *s, const uint32_t *q, uint32_t n)
{
  uint32_t best = 0;
  for (size_t i = 0; i < s->n_ctx; i++) {
    uint32_t l = lcp(s->ctx[i].tok, s->ctx[i].n, q, n);
    if (l > best)
      best = l;
  }
  return best;
}

static long find_ctx(const state *s, const uint32_t *tok, uint32_t n)
{
  for (size_t i = 0; i < s->n_ctx; i++)
    if (s->ctx[i].n == n && memcmp(s->ctx[i].tok, tok, 4 * (size_t)n) == 0)
      return (long)i;
  return -1;
}

static kvdb_key ctx_key(const uint32_t *tok, uint32_t n)
{
  kvdb_key h[MAXN / 16 + 1];
  if (kvdb_chain_hashes(&M, tok, n, h, MAXN / 16 + 1) != KVDB_OK)
    FAIL("chain hashes");
  return h[(n + M.block_tokens - 1) / M.block_tokens - 1];
}

static kvdb_key explicit_key(unsigned id)
{
  kvdb_key k;
  memset(&k, 0, sizeof k);
  k.b[0] = (uint8_t)id;
  k.b[15] = 0xe5;
  return k;
}

static void db_open(state *s)
{
  kvdb_status rc = kvdb_open(s->dir, &s->o, &s->db);
  if (rc != KVDB_OK && !s->bad_catalog)
    FAIL("open: %s", kvdb_status_name(rc));
  if (rc != KVDB_OK)
    s->db = NULL;
}

static void op_put(state *s, input *in)
{
  uint32_t tok[MAXN];
  uint32_t n = read_recipe(in, tok);
  fill_kv(tok, n, s->buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, s->buf, &M, n, KVDB_LAYOUT_LKTHD);
  kvdb_put_info info;
  kvdb_status rc = kvdb_put(s->db, &M, tok, n, &v, &info);
  expect(s, rc, KVDB_OK, "put");
  if (rc != KVDB_OK)
    return;
  long at = find_ctx(s, tok, n);
  if (!s->bad_catalog && at >= 0 && info.blocks_written != 0)
    FAIL("put of a stored context wrote %u blocks", info.blocks_written);
  if (at < 0 && s->n_ctx < MAX_CTX) {
    memcpy(s->ctx[s->n_ctx].tok, tok, 4 * (size_t)n);
    s->ctx[s->n_ctx++].n = n;
  } else if (at < 0) {
    s->bad_catalog = 1; /* the model is full: stop predicting */
  }
}

static void op_get(state *s, input *in, int lookup_only)
{
  uint32_t tok[MAXN];
  uint32_t n = read_recipe(in, tok);
  uint32_t want = expect_hit(s, tok, n);
  size_t hit = 0;
  if (lookup_only) {
    kvdb_status rc = kvdb_lookup(s->db, &M, tok, n, &hit);
    expect(s, rc, KVDB_OK, "lookup");
    if (!s->bad_catalog && hit != want)
      FAIL("lookup hit %zu of %u, expected %u", hit, n, want);
    return;
  }
  memset(s->buf, 0xab, (size_t)n * kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, s->buf, &M, n, KVDB_LAYOUT_LKTHD);
  kvdb_status rc = kvdb_get(s->db, &M, tok, n, &v, &hit);
  expect(s, rc, KVDB_OK, "get");
  if (s->bad_catalog || rc != KVDB_OK)
    return;
  if (hit > want || (!s->bad_segment && hit != want))
    FAIL("get hit %zu of %u, expected %u", hit, n, want);
  if (check_kv(tok, hit, n, s->buf) != hit)
    FAIL("get: wrong KV at token %zu of a %zu-token hit", check_kv(tok, hit, n, s->buf),
         hit);
}

static void op_delete(state *s, input *in)
{
  unsigned pick = u8(in);
  uint32_t tok[MAXN], n;
  if (s->n_ctx > 0 && pick < 192) {
    mctx *c = &s->ctx[pick % s->n_ctx];
    n = c->n;
    memcpy(tok, c->tok, 4 * (size_t)n);
  } else {
    n = recipe_tokens(pick, u8(in), tok);
  }
  kvdb_key k = ctx_key(tok, n);
  long at = find_ctx(s, tok, n);
  kvdb_status rc = kvdb_delete(s->db, &k);
  expect(s, rc, at >= 0 ? KVDB_OK : KVDB_NOTFOUND, "delete");
  if (at >= 0 && rc == KVDB_OK)
    s->ctx[at] = s->ctx[--s->n_ctx];
}

static void op_get_tokens(state *s, input *in)
{
  unsigned pick = u8(in);
  uint32_t tok[MAXN], n;
  if (s->n_ctx > 0 && pick < 192) {
    mctx *c = &s->ctx[pick % s->n_ctx];
    n = c->n;
    memcpy(tok, c->tok, 4 * (size_t)n);
  } else {
    n = recipe_tokens(pick, u8(in), tok);
  }
  uint32_t layer = u8(in) % M.n_layers;
  uint32_t k = 1 + u8(in) % 4, pos[4];
  for (uint32_t i = 0; i < k; i++)
    pos[i] = u8(in) % n;
  uint16_t out[4 * 2 * 2 * 2 * 64]; /* k tokens, packed for 2 layers (layer 0's room is used) */
  memset(out, 0xab, sizeof out);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, out, &M, k, KVDB_LAYOUT_LKTHD);
  kvdb_key key = ctx_key(tok, n);
  long at = find_ctx(s, tok, n);
  kvdb_status rc = kvdb_get_tokens(s->db, &M, &key, layer, pos, k, &v);
  if (s->bad_catalog)
    return;
  if (s->bad_segment && rc == KVDB_CORRUPT)
    return;
  expect(s, rc, at >= 0 ? KVDB_OK : KVDB_NOTFOUND, "get_tokens");
  if (rc != KVDB_OK)
    return;
  for (uint32_t kv = 0; kv < 2; kv++)
    for (uint32_t i = 0; i < k; i++)
      for (uint32_t h = 0; h < M.n_kv_heads; h++)
        for (uint32_t d = 0; d < M.head_dim; d++) {
          size_t e = (((size_t)kv * k + i) * M.n_kv_heads + h) * M.head_dim + d;
          if (out[e] != kv_value(tok, pos[i], layer, kv, h, d))
            FAIL("get_tokens: wrong KV for position %u of layer %u", pos[i], layer);
        }
}

static void op_put_block(state *s, input *in)
{
  unsigned id = u8(in) % MAX_KEYS;
  uint32_t full[MAXN];
  recipe_tokens(u8(in), MAXN - 1, full);
  uint32_t n = 1 + u8(in) % M.block_tokens;
  const uint32_t *tok = full + u8(in) % (MAXN - n + 1); /* a window of a recipe */
  fill_kv(tok, n, s->buf);
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, s->buf, &M, n, KVDB_LAYOUT_LKTHD);
  kvdb_key k = explicit_key(id);
  mctx *e = &s->key[id];
  kvdb_status want = KVDB_OK;
  if (e->n != 0 && (e->n != n || memcmp(e->tok, tok, 4 * (size_t)n) != 0))
    want = KVDB_INVALID; /* an existing key with other tokens is refused */
  kvdb_status rc = kvdb_put_block(s->db, &M, &k, tok, n, &v);
  expect(s, rc, want, "put_block");
  if (rc == KVDB_OK && e->n == 0) {
    memcpy(e->tok, tok, 4 * (size_t)n);
    e->n = n;
  }
}

static void op_get_block(state *s, input *in)
{
  unsigned id = u8(in) % MAX_KEYS, how = u8(in) % 3;
  mctx *e = &s->key[id];
  kvdb_key k = explicit_key(id);
  uint32_t other[MAXN];
  recipe_tokens(u8(in), M.block_tokens - 1, other);
  const uint32_t *expect_tok = NULL;
  size_t expect_n = 0;
  kvdb_status want = e->n ? KVDB_OK : KVDB_NOTFOUND;
  if (how == 1 && e->n) {
    expect_tok = e->tok;
    expect_n = e->n;
  } else if (how == 2) {
    expect_tok = other;
    expect_n = 1 + u8(in) % M.block_tokens;
    if (!e->n || e->n != expect_n || memcmp(e->tok, other, 4 * expect_n) != 0)
      want = KVDB_NOTFOUND; /* other tokens: a miss */
  }
  memset(s->buf, 0xab, (size_t)M.block_tokens * kvdb_model_token_bytes(&M));
  kvdb_kv_view v;
  kvdb_kv_view_packed(&v, s->buf, &M, M.block_tokens, KVDB_LAYOUT_LKTHD);
  size_t got = 0;
  kvdb_status rc = kvdb_get_block(s->db, &M, &k, expect_tok, expect_n, &v, &got);
  if (s->bad_catalog || (s->bad_segment && rc == KVDB_CORRUPT))
    return;
  expect(s, rc, want, "get_block");
  if (rc != KVDB_OK)
    return;
  if (got != e->n || check_kv(e->tok, e->n, M.block_tokens, s->buf) != e->n)
    FAIL("get_block: %zu tokens or wrong KV (stored %u)", got, e->n);
}

static void op_delete_block(state *s, input *in)
{
  unsigned id = u8(in) % MAX_KEYS;
  kvdb_key k = explicit_key(id), c;
  if (kvdb_block_context(&M, &k, &c) != KVDB_OK)
    FAIL("block_context");
  kvdb_status rc = kvdb_delete(s->db, &c);
  expect(s, rc, s->key[id].n ? KVDB_OK : KVDB_NOTFOUND, "delete explicit block");
  if (rc == KVDB_OK)
    s->key[id].n = 0;
}

static void op_count(state *s)
{
  size_t want = s->n_ctx;
  for (unsigned i = 0; i < MAX_KEYS; i++)
    want += s->key[i].n != 0;
  kvdb_iter *it;
  kvdb_status rc = kvdb_iter_open(s->db, &it);
  expect(s, rc, KVDB_OK, "iter_open");
  if (rc != KVDB_OK)
    return;
  size_t n = 0;
  kvdb_context_info ci;
  while ((rc = kvdb_iter_next(it, &ci)) == KVDB_OK)
    n++;
  kvdb_iter_close(it);
  expect(s, rc, KVDB_NOTFOUND, "iter_next at the end");
  if (!s->bad_catalog && n != want)
    FAIL("the iterator lists %zu contexts, the model has %zu", n, want);
  kvdb_stats st;
  rc = kvdb_stat(s->db, &st);
  expect(s, rc, KVDB_OK, "stat");
  if (!s->bad_catalog && rc == KVDB_OK && st.n_contexts != want)
    FAIL("stat counts %llu contexts, the model has %zu", (unsigned long long)st.n_contexts, want);
}

static int cmp_names(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void op_corrupt_segment(state *s, input *in)
{
  char path[4200];
  snprintf(path, sizeof path, "%s/ssd", s->dir);
  DIR *d = opendir(path);
  if (d == NULL)
    return;
  char *names[64];
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL && n < 64)
    if (de->d_name[0] != '.')
      names[n++] = strdup(de->d_name);
  closedir(d);
  unsigned pick = u8(in), hi = u8(in), lo = u8(in), x = u8(in) | 1;
  if (n > 0) {
    qsort(names, n, sizeof *names, cmp_names);
    snprintf(path, sizeof path, "%s/ssd/%s", s->dir, names[pick % n]);
    int fd = open(path, O_RDWR);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
      /* the offset: a page (hi) and a byte in it (lo, with the page's first bytes likelier) */
      uint64_t pages = ((uint64_t)st.st_size + KV_PAGE - 1) / KV_PAGE;
      uint64_t off = (hi % pages) * KV_PAGE + (lo < 128 ? lo : (lo * 16u) % KV_PAGE);
      if (off >= (uint64_t)st.st_size)
        off = (uint64_t)st.st_size - 1;
      uint8_t b;
      if (pread(fd, &b, 1, (off_t)off) == 1) {
        b ^= (uint8_t)x;
        if (pwrite(fd, &b, 1, (off_t)off) == 1)
          s->bad_segment = 1;
      }
    }
    if (fd >= 0)
      close(fd);
  }
  for (size_t i = 0; i < n; i++)
    free(names[i]);
}

static void op_corrupt_catalog(state *s, input *in)
{
  kv_catalog *c = &s->db->cat;
  MDB_dbi dbis[5] = {c->models, c->blocks, c->contexts, c->segments, c->next};
  MDB_dbi dbi = dbis[u8(in) % 5];
  unsigned pick = u8(in), how = u8(in) % 3, at = u8(in), x = u8(in) | 1;
  MDB_txn *txn;
  if (mdb_txn_begin(kv_menv(c->env), NULL, 0, &txn) != 0)
    FAIL("begin");
  MDB_stat ms;
  MDB_cursor *cur;
  MDB_val k, v;
  if (mdb_stat(txn, dbi, &ms) != 0 || ms.ms_entries == 0 || mdb_cursor_open(txn, dbi, &cur) != 0) {
    mdb_txn_abort(txn);
    return;
  }
  int mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
  for (size_t i = 0; mrc == 0 && i < pick % ms.ms_entries; i++)
    mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  if (mrc != 0 || v.mv_size == 0 || dbi == c->next) {
    /* the lookup index (dupsort, fixed 16-byte values): remove the entry instead */
    if (mrc == 0 && dbi == c->next && mdb_cursor_del(cur, 0) == 0 && mdb_txn_commit(txn) == 0)
      s->bad_catalog = 1;
    else
      mdb_txn_abort(txn);
    return;
  }
  uint8_t val[72 + 4 * 4096];
  size_t len = v.mv_size < sizeof val ? v.mv_size : sizeof val;
  memcpy(val, v.mv_data, len);
  uint8_t key[64];
  size_t klen = k.mv_size < sizeof key ? k.mv_size : sizeof key;
  memcpy(key, k.mv_data, klen);
  mdb_cursor_close(cur);
  if (how == 0) {
    val[at % len] ^= (uint8_t)x; /* a flipped byte */
  } else if (how == 1) {
    len = at % len; /* truncated */
  } else {
    len = 1 + at % 8; /* replaced by a few input bytes */
    for (size_t i = 0; i < len; i++)
      val[i] = (uint8_t)u8(in);
  }
  MDB_val mk = {klen, key}, mv = {len, val};
  if (mdb_put(txn, dbi, &mk, &mv, 0) == 0 && mdb_txn_commit(txn) == 0)
    s->bad_catalog = 1;
  else
    mdb_txn_abort(txn);
}

static int rm_entry(const char *p, const struct stat *st, int type, struct FTW *f)
{
  (void)st;
  (void)type;
  (void)f;
  return remove(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  input in = {data, size, 0};
  static state s; /* big: not on the stack; reset per input */
  memset(&s, 0, sizeof s);
  unsigned cfg = u8(&in);
  kvdb_options_init(&s.o);
  s.o.sync_mode = (cfg & 1) ? KVDB_SYNC_FULL : KVDB_SYNC_NONE;
  s.o.dram_bytes = (cfg & 2) ? 0 : 64 << 10; /* a tiny DRAM tier: eviction is common */
  s.o.use_direct_io = (cfg >> 2) & 1;
  s.o.use_io_uring = (cfg >> 3) & 1;
  s.o.segment_bytes = 1 << 20; /* the minimum: segments seal, compaction has work */
  s.o.catalog_map_bytes = 16 << 20;
  s.o.log_level = -1;
  s.buf = malloc((size_t)MAXN * kvdb_model_token_bytes(&M));
  const char *base = getenv("TMPDIR");
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/kvdb-fuzz-api-XXXXXX", base && *base ? base : "/tmp");
  if (s.buf == NULL || mkdtemp(tmpl) == NULL)
    FAIL("cannot make a temporary directory under %s", tmpl);
  s.dir = tmpl;
  db_open(&s);
  static const char *const names[OP_N] = {
    "put", "put", "get", "lookup", "delete", "get_tokens", "compact", "reopen", "verify",
    "put_block", "get_block", "delete_block", "count", "damage segment", "damage catalog"};
  int trace = getenv("KVDB_FUZZ_TRACE") != NULL; /* to read what an input does */
  for (int n_ops = 0; s.db != NULL && in.i < in.n && n_ops < MAX_OPS; n_ops++) {
    unsigned op = u8(&in) % OP_N;
    if (trace) {
      kvdb_stats st;
      kvdb_stat(s.db, &st);
      fprintf(stderr, "op %d: %s (model: %zu contexts; db: %llu contexts, %llu segments, "
              "%llu blocks%s%s)\n", n_ops, names[op], s.n_ctx, (unsigned long long)st.n_contexts,
              (unsigned long long)st.n_segments, (unsigned long long)st.n_blocks,
              s.bad_segment ? ", segment damaged" : "", s.bad_catalog ? ", catalog damaged" : "");
    }
    switch (op) {
    case OP_PUT:
    case OP_PUT2:
      op_put(&s, &in);
      break;
    case OP_GET:
    case OP_LOOKUP:
      op_get(&s, &in, op == OP_LOOKUP);
      break;
    case OP_DELETE:
      op_delete(&s, &in);
      break;
    case OP_GET_TOKENS:
      op_get_tokens(&s, &in);
      break;
    case OP_COMPACT: {
      kvdb_compact_report rep;
      kvdb_status rc = kvdb_compact(s.db, u8(&in) / 255.0, NULL, NULL, &rep);
      if (!(s.bad_segment && rc == KVDB_CORRUPT)) /* a damaged block stays in place */
        expect(&s, rc, KVDB_OK, "compact");
      break;
    }
    case OP_REOPEN:
      kvdb_close(s.db);
      s.db = NULL;
      db_open(&s);
      break;
    case OP_VERIFY: {
      kvdb_verify_report rep;
      kvdb_status rc = kvdb_verify(s.db, NULL, NULL, NULL, &rep);
      if (s.bad_catalog && rc != KVDB_OK && rc != KVDB_CORRUPT)
        FAIL("verify stopped on a damaged catalog: %s", kvdb_status_name(rc)); /* reports it */
      if (!(s.bad_segment && rc == KVDB_CORRUPT))
        expect(&s, rc, KVDB_OK, "verify");
      break;
    }
    case OP_PUT_BLOCK:
      op_put_block(&s, &in);
      break;
    case OP_GET_BLOCK:
      op_get_block(&s, &in);
      break;
    case OP_DELETE_BLOCK:
      op_delete_block(&s, &in);
      break;
    case OP_COUNT:
      op_count(&s);
      break;
    case OP_CORRUPT_SEGMENT:
      op_corrupt_segment(&s, &in);
      break;
    case OP_CORRUPT_CATALOG:
      op_corrupt_catalog(&s, &in);
      break;
    }
  }
  /* the end: a reopened database still holds every live context whole (nothing damaged) */
  if (s.db != NULL) {
    kvdb_close(s.db);
    s.db = NULL;
    db_open(&s);
  }
  if (s.db != NULL && !s.bad_catalog) {
    for (size_t i = 0; i < s.n_ctx; i++) {
      size_t hit = 0;
      kvdb_status rc = kvdb_lookup(s.db, &M, s.ctx[i].tok, s.ctx[i].n, &hit);
      if (rc != KVDB_OK || hit != s.ctx[i].n)
        FAIL("after reopen: context %zu hit %zu of %u", i, hit, s.ctx[i].n);
    }
    if (!s.bad_segment) {
      kvdb_status rc = kvdb_verify(s.db, NULL, NULL, NULL, NULL);
      if (rc != KVDB_OK)
        FAIL("verify at the end: %s", kvdb_status_name(rc));
    }
  }
  kvdb_close(s.db);
  nftw(s.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(s.buf);
  return 0;
}
