/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_gpu.c — libkvgpu (gpu/kvdb_gpu.h), modes:
 *   host  the pipeline over an emulated device that needs no GPU: "device" memory is host
 *         memory filled with garbage, and every queued copy runs only when its stream is waited
 *         for, reading the staging buffer THEN (a copy queued before its bytes were final, a
 *         missing wait, a wrong plan or a stream mix-up shows as wrong bytes); gets from the
 *         SSD and the DRAM tier, both layouts, a partial hit, puts from the device, injected
 *         copy failures, the plans against a direct computation, bad input
 *   gpu   the same round trips on CUDA device 0 (exit 77, SKIP, when there is none)
 */
#define _GNU_SOURCE
#include "kvdb_test.h"
#include "gpu_backend.h"

static const kvdb_model M = {"gpu-test", 4, 4, 64, KVDB_F16, 16, 0};
#define N_TOK 150 /* 9 full blocks and a partial one */

/* ---- the emulated device ---- */

typedef struct qcopy {
  void *dst;
  const void *src;
  size_t pitch, width, height;
  int is_scatter;
  kv_gpu_scatter a;
} qcopy;

typedef struct emu {
  kv_gpu_backend b;
  qcopy q[KV_GPU_STREAMS][4096];
  size_t nq[KV_GPU_STREAMS];
  int fail_copy_at; /* the Nth copy2d fails (0: none) */
  int copies;
  int streams_used[KV_GPU_STREAMS];
  const char *reg;  /* the page-locked range (one at a time here) */
  size_t reg_bytes;
  int registers, unregisters;
  int from_reg;     /* copies whose source lies in the page-locked range */
  int scatters;
  int fail_register, fail_dev_alloc; /* injected failures */
} emu;

static int e_host_alloc(kv_gpu_backend *b, size_t bytes, void **p)
{
  (void)b;
  *p = malloc(bytes ? bytes : 1);
  if (*p != NULL)
    memset(*p, 0xA5, bytes); /* garbage */
  return *p ? 0 : -1;
}
static int e_dev_alloc(kv_gpu_backend *b, size_t bytes, void **p)
{
  if (((emu *)b)->fail_dev_alloc) {
    *p = NULL;
    snprintf(b->err, sizeof b->err, "injected failure of a device allocation");
    return -1;
  }
  return e_host_alloc(b, bytes, p);
}
static void e_free(kv_gpu_backend *b, void *p)
{
  (void)b;
  free(p);
}
static int e_copy2d(kv_gpu_backend *b, int s, void *dst, const void *src, size_t pitch,
                    size_t width, size_t height, int to_device)
{
  emu *e = (emu *)b;
  (void)to_device;
  ASSERT(s >= 0 && s < KV_GPU_STREAMS);
  ASSERT(width <= pitch || height == 1);
  if (++e->copies == e->fail_copy_at) {
    snprintf(b->err, sizeof b->err, "injected failure of copy %d", e->copies);
    return -1;
  }
  ASSERT(e->nq[s] < 4096);
  if (e->reg != NULL && (const char *)src >= e->reg &&
      (const char *)src + width <= e->reg + e->reg_bytes) {
    ASSERT(height == 1 && to_device == 1);
    e->from_reg++;
  }
  e->q[s][e->nq[s]++] = (qcopy){dst, src, pitch, width, height, 0, {0}};
  e->streams_used[s] = 1;
  return 0;
}
static int e_register(kv_gpu_backend *b, void *p, size_t bytes)
{
  emu *e = (emu *)b;
  if (e->fail_register) {
    snprintf(b->err, sizeof b->err, "injected failure of cudaHostRegister");
    return -1;
  }
  ASSERT(e->reg == NULL);
  e->reg = p;
  e->reg_bytes = bytes;
  e->registers++;
  return 0;
}
static void e_unregister(kv_gpu_backend *b, void *p)
{
  emu *e = (emu *)b;
  ASSERT(e->reg == p);
  e->reg = NULL;
  e->unregisters++;
}
static int e_scatter(kv_gpu_backend *b, int s, void *dst, const void *src, const kv_gpu_scatter *a)
{
  emu *e = (emu *)b;
  ASSERT(s >= 0 && s < KV_GPU_STREAMS);
  ASSERT(e->nq[s] < 4096);
  e->q[s][e->nq[s]++] = (qcopy){dst, src, 0, 0, 0, 1, *a};
  e->scatters++;
  return 0;
}
static int e_sync(kv_gpu_backend *b, int s)
{
  emu *e = (emu *)b;
  for (size_t i = 0; i < e->nq[s]; i++) {
    qcopy *c = &e->q[s][i];
    if (c->is_scatter) /* reads its source (the scratch buffer) now, as a kernel would */
      kv_gpu_scatter_ref(c->dst, c->src, &c->a);
    for (size_t r = 0; r < c->height; r++)
      memcpy((char *)c->dst + r * c->pitch, (const char *)c->src + r * c->pitch, c->width);
  }
  e->nq[s] = 0;
  return 0;
}
static void e_destroy(kv_gpu_backend *b)
{
  free(b);
}

static emu *emu_open(kvdb_gpu **g)
{
  emu *e = calloc(1, sizeof *e);
  ASSERT(e != NULL);
  e->b.name = "emulated";
  e->b.host_alloc = e_host_alloc;
  e->b.host_free = e_free;
  e->b.dev_alloc = e_dev_alloc;
  e->b.dev_free = e_free;
  e->b.copy2d = e_copy2d;
  e->b.host_register = e_register;
  e->b.host_unregister = e_unregister;
  e->b.scatter = e_scatter;
  e->b.sync = e_sync;
  e->b.destroy = e_destroy;
  ASSERT_OK(kv_gpu_wrap(&e->b, g));
  return e;
}

/* ---- checks ---- */

/* Element (l, kv, t, h, d) of a packed buffer of n tokens in `layout`. */
static uint16_t at(const uint16_t *buf, kvdb_layout layout, size_t n, uint32_t l, uint32_t kv,
                   size_t t, uint32_t h, uint32_t d)
{
  size_t i = layout == KVDB_LAYOUT_LKTHD
                 ? ((((size_t)l * 2 + kv) * n + t) * M.n_kv_heads + h) * M.head_dim + d
                 : ((((size_t)l * 2 + kv) * M.n_kv_heads + h) * n + t) * M.head_dim + d;
  return buf[i];
}

/* The first token in [0, hit) whose elements differ from t_kv_value, or hit. */
static size_t check(const uint16_t *buf, kvdb_layout layout, size_t n, const uint32_t *tok,
                    size_t hit)
{
  for (size_t t = 0; t < hit; t++)
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++)
            if (at(buf, layout, n, l, kv, t, h, d) != t_kv_value(tok, t, l, kv, h, d))
              return t;
  return hit;
}

/* Every byte of [hit, n) of a buffer still holds `fill`. */
static int untouched(const uint16_t *buf, kvdb_layout layout, size_t n, size_t hit,
                     uint16_t fill)
{
  for (size_t t = hit; t < n; t++)
    for (uint32_t l = 0; l < M.n_layers; l++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < M.n_kv_heads; h++)
          for (uint32_t d = 0; d < M.head_dim; d++)
            if (at(buf, layout, n, l, kv, t, h, d) != fill)
              return 0;
  return 1;
}

/* The plan of a range, element by element, against the layouts' definitions. */
static void test_plans(void)
{
  size_t es = 2, n = 37;
  for (int li = 0; li < 2; li++) {
    kvdb_layout layout = li ? KVDB_LAYOUT_LKHTD : KVDB_LAYOUT_LKTHD;
    for (size_t t0 = 0; t0 < n; t0 += 5)
      for (size_t c = 1; t0 + c <= n; c += 7) {
        kv_gpu_plan p;
        ASSERT_EQ(kv_gpu_plan_range(&M, layout, n, t0, c, &p), 0);
        /* byte offset of every element of the range must be inside a row of the plan, and the
         * plan must cover exactly c tokens' bytes */
        ASSERT_EQ(p.width * p.height, c * kvdb_model_token_bytes(&M));
        for (uint32_t l = 0; l < M.n_layers; l++)
          for (uint32_t kv = 0; kv < 2; kv++)
            for (size_t t = t0; t < t0 + c; t++)
              for (uint32_t h = 0; h < M.n_kv_heads; h++) {
                size_t i = layout == KVDB_LAYOUT_LKTHD
                               ? ((((size_t)l * 2 + kv) * n + t) * M.n_kv_heads + h) * M.head_dim
                               : ((((size_t)l * 2 + kv) * M.n_kv_heads + h) * n + t) *
                                     M.head_dim;
                size_t off = i * es;
                ASSERT(off >= p.off);
                size_t r = (off - p.off) / p.pitch, in = (off - p.off) % p.pitch;
                ASSERT(r < p.height);
                ASSERT(in + M.head_dim * es <= p.width);
              }
      }
    kv_gpu_plan p;
    ASSERT_EQ(kv_gpu_plan_range(&M, layout, n, 30, 8, &p), -1); /* past n */
    ASSERT_EQ(kv_gpu_plan_range(&M, layout, n, 3, 0, &p), -1);
  }
  kv_gpu_plan p;
  ASSERT_EQ(kv_gpu_plan_range(&M, (kvdb_layout)9, 10, 0, 1, &p), -1);
}

/* kvdb_gpu_get of tok with the emulator's copy number `at` failing: KVDB_IOERR whose message
 * holds `msg`, hit 0, nothing left queued on any stream. */
static void failed_get(kvdb_gpu *g, kvdb *db, const uint32_t *tok, void *dev, emu *e, int at,
                       const char *msg)
{
  size_t hit = 1;
  e->copies = 0;
  e->fail_copy_at = at;
  ASSERT_STATUS(KVDB_IOERR, kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, &hit));
  ASSERT_EQ(hit, 0);
  ASSERT(strstr(kvdb_gpu_errmsg(), msg) != NULL);
  for (int s = 0; s < KV_GPU_STREAMS; s++)
    ASSERT_EQ(e->nq[s], 0);
}

/* What round_trips and attached_trips start from: the options (a 64 MiB DRAM tier), the
 * prompt, host buffers for its KV and device memory for it. */
typedef struct trip {
  kvdb_options o;
  uint32_t tok[N_TOK];
  size_t bytes;
  uint16_t *host, *back;
  void *dev;
} trip;

static void trip_init(kvdb_gpu *g, trip *t)
{
  kvdb_options_init(&t->o);
  t->o.sync_mode = KVDB_SYNC_NONE;
  t->o.dram_bytes = 64u << 20;
  t_family_tokens(7, 7, 0, t->tok, N_TOK);
  t->bytes = N_TOK * kvdb_model_token_bytes(&M);
  t->host = malloc(t->bytes);
  t->back = malloc(t->bytes);
  ASSERT(t->host && t->back);
  t->dev = NULL;
  ASSERT_OK(kvdb_gpu_alloc(g, t->bytes, &t->dev));
}

static void trip_free(kvdb_gpu *g, trip *t)
{
  kvdb_gpu_free(g, t->dev);
  free(t->host);
  free(t->back);
}

/* Round trips through g: put from "device" memory, gets into it (cold, then from the DRAM
 * tier, both layouts), a partial hit. */
static void round_trips(kvdb_gpu *g, const char *dir, emu *e)
{
  trip t;
  trip_init(g, &t);
  kvdb_options o = t.o;
  const uint32_t *tok = t.tok;
  size_t bytes = t.bytes;
  uint16_t *host = t.host, *back = t.back;
  void *dev = t.dev;
  kvdb *db;
  ASSERT_OK(kvdb_open(dir, &o, &db));

  /* put from the device: the KV goes host -> device, then kvdb_gpu_put */
  t_fill_kv(&M, tok, N_TOK, host);
  ASSERT_OK(kvdb_gpu_copy(g, dev, host, bytes, 1));
  kvdb_put_info info;
  ASSERT_OK(kvdb_gpu_put(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, &info));
  ASSERT_EQ(info.n_blocks, 10);
  ASSERT_EQ(t_get_check(db, &M, tok, N_TOK), N_TOK); /* and kvdb has it right */
  kvdb_close(db);

  for (int pass = 0; pass < 4; pass++) {
    /* passes 0 and 2: a fresh handle (from the SSD tier); 1 and 3: from the DRAM tier */
    if (pass % 2 == 0)
      ASSERT_OK(kvdb_open(dir, &o, &db));
    kvdb_layout layout = pass < 2 ? KVDB_LAYOUT_LKTHD : KVDB_LAYOUT_LKHTD;
    memset(host, 0x3C, bytes);
    ASSERT_OK(kvdb_gpu_copy(g, dev, host, bytes, 1)); /* known bytes past any hit */
    size_t hit = 0;
    ASSERT_OK(kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, layout, &hit));
    ASSERT_EQ(hit, N_TOK);
    if (e != NULL)
      for (int s = 0; s < KV_GPU_STREAMS; s++) {
        ASSERT_EQ(e->nq[s], 0);         /* nothing left in flight */
        ASSERT_EQ(e->streams_used[s], 1); /* both streams carried copies */
      }
    memset(back, 0, bytes);
    ASSERT_OK(kvdb_gpu_copy(g, back, dev, bytes, 0));
    ASSERT_EQ(check(back, layout, N_TOK, tok, N_TOK), N_TOK);
    if (pass % 2 == 1)
      kvdb_close(db);
  }

  /* a prompt whose stored prefix is 100 tokens: positions past it are untouched */
  ASSERT_OK(kvdb_open(dir, &o, &db));
  uint32_t q[N_TOK];
  memcpy(q, tok, sizeof q);
  for (size_t i = 100; i < N_TOK; i++)
    q[i] = 40000 + (uint32_t)i;
  memset(host, 0x3C, bytes);
  ASSERT_OK(kvdb_gpu_copy(g, dev, host, bytes, 1));
  size_t hit = 0;
  ASSERT_OK(kvdb_gpu_get(g, db, &M, q, N_TOK, dev, KVDB_LAYOUT_LKTHD, &hit));
  ASSERT_EQ(hit, 100);
  ASSERT_OK(kvdb_gpu_copy(g, back, dev, bytes, 0));
  ASSERT_EQ(check(back, KVDB_LAYOUT_LKTHD, N_TOK, tok, 100), 100);
  ASSERT(untouched(back, KVDB_LAYOUT_LKTHD, N_TOK, 100, 0x3C3C));

  /* bad input */
  ASSERT_STATUS(KVDB_INVALID, kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, (kvdb_layout)7, &hit));
  ASSERT(strstr(kvdb_gpu_errmsg(), "layout") != NULL);
  ASSERT_STATUS(KVDB_INVALID, kvdb_gpu_get(g, db, &M, tok, N_TOK, NULL, KVDB_LAYOUT_LKTHD, &hit));
  ASSERT_STATUS(KVDB_INVALID, kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, NULL));
  ASSERT_STATUS(KVDB_INVALID, kvdb_gpu_put(g, db, &M, tok, 0, dev, KVDB_LAYOUT_LKTHD, NULL));
  /* kvdb's own failure comes through with kvdb's message */
  kvdb_model other = M;
  other.n_layers = 5;
  size_t big = N_TOK * kvdb_model_token_bytes(&other);
  void *dev2 = NULL;
  ASSERT_OK(kvdb_gpu_alloc(g, big, &dev2));
  ASSERT_STATUS(KVDB_MISMATCH, kvdb_gpu_get(g, db, &other, tok, N_TOK, dev2, KVDB_LAYOUT_LKTHD,
                                            &hit));
  ASSERT(strstr(kvdb_gpu_errmsg(), "gpu-test") != NULL);
  kvdb_gpu_free(g, dev2);

  /* a copy that fails: KVDB_IOERR naming it, hit 0, nothing left queued */
  if (e != NULL) {
    failed_get(g, db, tok, dev, e, 3, "injected failure of copy 3");
    e->copies = 0;
    e->fail_copy_at = 2;
    ASSERT_STATUS(KVDB_IOERR, kvdb_gpu_put(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, NULL));
    ASSERT(strstr(kvdb_gpu_errmsg(), "copy from the device") != NULL);
    e->fail_copy_at = 0;
  }
  kvdb_close(db);
  trip_free(g, &t);
}

/* Gets from an ATTACHED database: blocks the DRAM tier holds go to the device straight from
 * the page-locked tier (lent: one copy of the data region, then the scatter), blocks from the
 * SSD through the staging buffer; both layouts; a partial hit (a block lent for 4 of its
 * tokens); a failing copy of a lent block. Run after round_trips (the context is stored). */
static void attached_trips(kvdb_gpu *g, const char *dir, emu *e)
{
  trip t;
  trip_init(g, &t);
  kvdb_options o = t.o;
  const uint32_t *tok = t.tok;
  size_t bytes = t.bytes;
  uint16_t *host = t.host, *back = t.back;
  void *dev = t.dev;
  kvdb *db = NULL;
  size_t hit = 0;
  for (int pass = 0; pass < 4; pass++) {
    /* passes 0 and 2: a fresh handle (blocks from the SSD tier, through the staging buffer);
     * 1 and 3: from the DRAM tier, lent */
    if (pass % 2 == 0) {
      ASSERT_OK(kvdb_open(dir, &o, &db));
      ASSERT_OK(kvdb_gpu_attach(g, db));
      ASSERT_OK(kvdb_gpu_attach(g, db)); /* twice: a no-op */
      void *base;
      size_t tb;
      ASSERT_OK(kvdb_dram_memory(db, &base, &tb));
      ASSERT(tb >= o.dram_bytes - 4096);
      if (e != NULL) {
        ASSERT_EQ(e->registers, pass / 2 + 1);
        ASSERT(e->reg == base && e->reg_bytes == tb);
      }
    }
    kvdb_layout layout = pass < 2 ? KVDB_LAYOUT_LKTHD : KVDB_LAYOUT_LKHTD;
    memset(host, 0x3C, bytes);
    ASSERT_OK(kvdb_gpu_copy(g, dev, host, bytes, 1));
    int fr = e != NULL ? e->from_reg : 0, sc = e != NULL ? e->scatters : 0;
    ASSERT_OK(kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, layout, &hit));
    ASSERT_EQ(hit, N_TOK);
    if (e != NULL) {
      ASSERT_EQ(e->from_reg - fr, pass % 2 ? 10 : 0);
      ASSERT_EQ(e->scatters - sc, pass % 2 ? 10 : 0);
      for (int s = 0; s < KV_GPU_STREAMS; s++) {
        ASSERT_EQ(e->nq[s], 0);
        ASSERT_EQ(e->streams_used[s], 1);
      }
    }
    memset(back, 0, bytes);
    ASSERT_OK(kvdb_gpu_copy(g, back, dev, bytes, 0));
    ASSERT_EQ(check(back, layout, N_TOK, tok, N_TOK), N_TOK);
    if (pass % 2 == 1) {
      kvdb_gpu_detach(g, db);
      if (e != NULL) {
        ASSERT_EQ(e->unregisters, pass / 2 + 1);
        ASSERT(e->reg == NULL);
      }
      kvdb_gpu_detach(g, db); /* not attached: a no-op */
      kvdb_close(db);
    }
  }

  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_OK(kvdb_gpu_attach(g, db));
  ASSERT_OK(kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, &hit)); /* to DRAM */
  /* a prompt whose stored prefix is 100 tokens: 6 whole blocks and 4 tokens of the 7th, all
   * lent; positions past 100 untouched */
  uint32_t q[N_TOK];
  memcpy(q, tok, sizeof q);
  for (size_t i = 100; i < N_TOK; i++)
    q[i] = 40000 + (uint32_t)i;
  for (int li = 0; li < 2; li++) {
    kvdb_layout layout = li ? KVDB_LAYOUT_LKHTD : KVDB_LAYOUT_LKTHD;
    memset(host, 0x3C, bytes);
    ASSERT_OK(kvdb_gpu_copy(g, dev, host, bytes, 1));
    int fr = e != NULL ? e->from_reg : 0;
    ASSERT_OK(kvdb_gpu_get(g, db, &M, q, N_TOK, dev, layout, &hit));
    ASSERT_EQ(hit, 100);
    if (e != NULL)
      ASSERT_EQ(e->from_reg - fr, 7);
    ASSERT_OK(kvdb_gpu_copy(g, back, dev, bytes, 0));
    ASSERT_EQ(check(back, layout, N_TOK, tok, 100), 100);
    ASSERT(untouched(back, layout, N_TOK, 100, 0x3C3C));
  }
  /* the copy of the second lent block fails: KVDB_IOERR naming it, hit 0, nothing queued;
   * then the same get succeeds, exact (the lent blocks were given back: prefetch-lend checks
   * that a given-back block can be evicted) */
  if (e != NULL) {
    failed_get(g, db, tok, dev, e, 2, "DRAM-tier block");
    e->fail_copy_at = 0;
  }
  ASSERT_OK(kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, &hit));
  ASSERT_EQ(hit, N_TOK);
  ASSERT_OK(kvdb_gpu_copy(g, back, dev, bytes, 0));
  ASSERT_EQ(check(back, KVDB_LAYOUT_LKTHD, N_TOK, tok, N_TOK), N_TOK);
  kvdb_gpu_detach(g, db);

  /* a fresh kvdb_gpu (no scratch buffers yet): the tier cannot be page-locked (KVDB_IOERR
   * naming it, nothing attached: gets take the staging path), then the scratch buffer cannot
   * be had (KVDB_NOMEM naming it, hit 0, every lent block given back: the next get is exact) */
  if (e != NULL) {
    kvdb_gpu *g2;
    emu *e2 = emu_open(&g2);
    e2->fail_register = 1;
    ASSERT_STATUS(KVDB_IOERR, kvdb_gpu_attach(g2, db));
    ASSERT(strstr(kvdb_gpu_errmsg(), "page-locking the DRAM tier") != NULL);
    ASSERT(strstr(kvdb_gpu_errmsg(), "injected failure of cudaHostRegister") != NULL);
    int fr = e2->from_reg;
    ASSERT_OK(kvdb_gpu_get(g2, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, &hit));
    ASSERT_EQ(hit, N_TOK);
    ASSERT_EQ(e2->from_reg, fr); /* nothing lent */
    e2->fail_register = 0;
    ASSERT_OK(kvdb_gpu_attach(g2, db));
    e2->fail_dev_alloc = 1;
    ASSERT_STATUS(KVDB_NOMEM, kvdb_gpu_get(g2, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKTHD, &hit));
    ASSERT_EQ(hit, 0);
    ASSERT(strstr(kvdb_gpu_errmsg(), "device scratch buffer") != NULL);
    for (int s = 0; s < KV_GPU_STREAMS; s++)
      ASSERT_EQ(e2->nq[s], 0);
    e2->fail_dev_alloc = 0;
    ASSERT_OK(kvdb_gpu_get(g2, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKHTD, &hit));
    ASSERT_EQ(hit, N_TOK);
    ASSERT_OK(kvdb_gpu_copy(g2, back, dev, bytes, 0));
    ASSERT_EQ(check(back, KVDB_LAYOUT_LKHTD, N_TOK, tok, N_TOK), N_TOK);
    kvdb_gpu_close(g2); /* detaches */
  }
  kvdb_close(db);

  /* no DRAM tier: nothing to attach */
  o.dram_bytes = 0;
  ASSERT_OK(kvdb_open(dir, &o, &db));
  ASSERT_STATUS(KVDB_UNSUPPORTED, kvdb_gpu_attach(g, db));
  ASSERT(strstr(kvdb_gpu_errmsg(), "DRAM tier") != NULL);
  ASSERT_STATUS(KVDB_INVALID, kvdb_gpu_attach(g, NULL));
  ASSERT_OK(kvdb_gpu_get(g, db, &M, tok, N_TOK, dev, KVDB_LAYOUT_LKHTD, &hit));
  ASSERT_EQ(hit, N_TOK);
  kvdb_close(db);
  trip_free(g, &t);
}

int main(int argc, char **argv)
{
  const char *mode = argc > 1 ? argv[1] : "host";
  kvdb_gpu *g = NULL;
  emu *e = NULL;
  if (strcmp(mode, "host") == 0) {
    test_plans();
    e = emu_open(&g);
  } else if (strcmp(mode, "gpu") == 0) {
    kvdb_status rc = kvdb_gpu_open(0, &g);
    if (rc == KVDB_UNSUPPORTED) {
      printf("SKIP: %s\n", kvdb_gpu_errmsg());
      return T_EXIT_SKIP;
    }
    ASSERT_OK(rc);
    printf("device: %s\n", kvdb_gpu_name(g));
  } else {
    fprintf(stderr, "unknown mode %s (host, gpu)\n", mode);
    return T_EXIT_FAIL;
  }
  char *dir = t_tmpdir("gpu");
  round_trips(g, dir, e);
  attached_trips(g, dir, e);
  kvdb_gpu_close(g);
  t_rmdir(dir);
  printf("PASS test_gpu %s\n", mode);
  return T_EXIT_PASS;
}
