/* SPDX-License-Identifier: MIT */
/*
 * engine/ops/fetch.c — kvdb_get_head_tokens: the full-precision K and V rows of chosen
 * positions of one layer and KV head (kvdb.h "Top-k token scoring"), the fetch after a score
 * pass. HillInfer §4.2: "only the top-k full K/V then leave the device"; InstInfer §IV-C:
 * dual-step loading, pages first, then the tokens in them.
 *
 * ONE CALL
 *   1. A read snapshot of the catalog gives the context's blocks; each position is mapped to its
 *      block (binary search over the blocks' first positions) and the positions are visited
 *      block by block.
 *   2. A block with wanted positions is served
 *        DRAM    from the DRAM tier when the handle holds it there (its raw data region);
 *        DEVICE  (raw, opts.device set, its tier in device_tiers, 4 KiB aligned) by the
 *                near-data device: the pages of this head's K and V groups holding the positions
 *                and the page(s) of their checksums are P2P-read into a device buffer (runs a
 *                few pages apart are read as one: device bytes do not cross to the host), the
 *                device checks each group (kv_fpga_gather; the emulated device really does, XRT
 *                cannot yet) and gathers the rows into an output buffer, and the host reads just
 *                those rows. Blocks are batched into waves of kv_score_wave_bytes of P2P reads,
 *                one gather and one read per wave;
 *        HOST    (raw, the rest) by the host: the same pages, read in one batch (the pages of
 *                every such block of the call at once, one io_uring queue), each group
 *                verified with its checksum (seeded with the block hash and its place, so a
 *                page of another block fails: no header read is needed), the rows copied;
 *        DECODE  (compressed, format 2) after the snapshot, by kvdb_get_tokens for those
 *                positions (every KV head of the layer; the head's rows are kept). A per-head
 *                decode needs kv_block_read_tokens (seg/blockio.c) to take a section range.
 *   A read that fails while a compaction moved blocks starts again from a fresh snapshot, up to
 *   three times (as kvdb_get_tokens does).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "ops_int.h"

#define DEV_GAP_BYTES (8u * KV_PAGE) /* device reads: runs this close are read as one */
#define MAX_POS (1u << 23)           /* positions per call (two gathered rows each) */
#define WAVE_ROWS (1u << 16)         /* rows gathered at once at most */

typedef struct frange frange;
struct frange {
  uint64_t off, len; /* in the block object */
  uint64_t at;       /* device: where it lies in the P2P buffer */
};

typedef struct fblk {
  uint8_t hash[16];
  kv_block_rec rec; /* tokens NULL */
  uint64_t pos0;
  kv_block_geom g;
} fblk;

typedef struct fctx {
  kvdb *db;
  const kvdb_model *m;
  kvdb_score_opts o;
  uint32_t sk; /* K section of (layer, head); V is sk + 1 */
  const uint32_t *pos;
  size_t n_pos;
  uint8_t *k_out, *v_out;
  uint32_t row; /* bytes of one row */
  fblk *b;
  uint32_t n_b;
  uint32_t *order; /* position indices, grouped by block */
  uint32_t *blk;   /* block of each position index */
  uint32_t *dec;   /* position indices in compressed blocks */
  size_t n_dec;
  uint8_t *need;   /* per group of the current block */
  kvdb_fetch_stats st;
  kv_ckcache **cc; /* checksum tables kept (kv_get_head_tokens_cc), or NULL */
  int defer;       /* attempt leaves its host blocks (hb, n_hb, hrg) to the caller's batch */
  struct hblk *hb;
  size_t n_hb;
  struct frange *hrg;
} fctx;

/* ---- checksum tables kept (kv_ckcache) ---- */

typedef struct ck_ent {
  uint8_t hash[16];
  uint32_t sec, n; /* section; groups (0: a free entry) */
  uint64_t *sums;
} ck_ent;

struct kv_ckcache {
  ck_ent *e;
  size_t cap, used; /* open addressing, cap a power of two, at most half used */
};

static size_t ck_slot(const kv_ckcache *c, const uint8_t hash[16], uint32_t sec)
{
  uint64_t h = (kv_get_le64(hash) ^ ((uint64_t)sec * 0x9e3779b97f4a7c15ull)) * 0xff51afd7ed558ccdull;
  size_t i = (size_t)(h >> 17) & (c->cap - 1);
  while (c->e[i].n != 0 && (c->e[i].sec != sec || memcmp(c->e[i].hash, hash, 16) != 0))
    i = (i + 1) & (c->cap - 1);
  return i;
}

/* The table of (hash, sec) with n groups, or NULL. */
static const uint64_t *ck_find(const kv_ckcache *c, const uint8_t hash[16], uint32_t sec,
                               uint32_t n)
{
  if (c == NULL || c->cap == 0)
    return NULL;
  const ck_ent *e = &c->e[ck_slot(c, hash, sec)];
  return e->n == n ? e->sums : NULL;
}

/* Keep the table sums[0..n) of (hash, sec). Out of memory only loses the copy. */
static void ck_add(kv_ckcache **cp, const uint8_t hash[16], uint32_t sec, uint32_t n,
                   const uint64_t *sums)
{
  if (*cp == NULL && (*cp = calloc(1, sizeof **cp)) == NULL)
    return;
  kv_ckcache *c = *cp;
  if (2 * (c->used + 1) > c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 256;
    ck_ent *ne = calloc(cap, sizeof *ne);
    if (ne == NULL)
      return;
    kv_ckcache nc = {ne, cap, 0};
    for (size_t i = 0; i < c->cap; i++)
      if (c->e[i].n != 0) {
        nc.e[ck_slot(&nc, c->e[i].hash, c->e[i].sec)] = c->e[i];
        nc.used++;
      }
    free(c->e);
    *c = nc;
  }
  ck_ent *e = &c->e[ck_slot(c, hash, sec)];
  if (e->n != 0)
    return; /* kept already */
  uint64_t *p = malloc((size_t)n * sizeof *p);
  if (p == NULL)
    return;
  memcpy(p, sums, (size_t)n * sizeof *p);
  memcpy(e->hash, hash, 16);
  e->sec = sec;
  e->n = n;
  e->sums = p;
  c->used++;
}

void kv_ckcache_free(kv_ckcache *c)
{
  if (c == NULL)
    return;
  for (size_t i = 0; i < c->cap; i++)
    free(c->e[i].sums);
  free(c->e);
  free(c);
}

static int cmp_range(const void *a, const void *b)
{
  const frange *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

static uint64_t group_seed(const uint8_t hash[16], uint32_t s, uint32_t grp)
{
  return kv_get_le64(hash) ^ (((uint64_t)s << 32) | grp); /* FORMAT.md §3 group checksum */
}

/* The object ranges holding the wanted groups of sections sk, sk + 1 (x->need) and their
 * checksums, page aligned, sorted, merged when at most `gap` bytes apart. rg has room for
 * 1 + 2 * n_groups. Returns the count. Offsets are from the object's start, or for a packed
 * object (FORMAT.md §3e, at obj_off: 64-byte aligned) from the start of its first page (the
 * object's own offsets + lead, lead = obj_off % 4096), so that every range is whole pages. */
static size_t block_ranges_ck(const fctx *x, const kv_block_geom *g, uint64_t gap, frange *rg,
                              int with_ck, uint64_t obj_off)
{
  size_t nr = 0;
  /* a packed object (FORMAT.md §3e) at obj_off, 64-byte aligned: offsets from the start of
   * its first page (+ lead), so that every range is whole pages of the segment */
  uint64_t lead = g->packed ? obj_off % KV_PAGE : 0;
  uint64_t c0 = (lead + kv_block_cksum_off(g, x->sk, 0)) / KV_PAGE * KV_PAGE;
  uint64_t c1 = KV_ALIGN_UP(lead + kv_block_cksum_off(g, x->sk + 1, g->n_groups),
                            (uint64_t)KV_PAGE);
  if (with_ck)
    rg[nr++] = (frange){c0, c1 - c0, 0};
  for (uint32_t s = x->sk; s <= x->sk + 1; s++)
    for (uint32_t grp = 0; grp < g->n_groups; grp++)
      if (x->need[grp]) {
        uint64_t a = (lead + kv_block_group_off(g, s, grp)) / KV_PAGE * KV_PAGE;
        uint64_t e = KV_ALIGN_UP(lead + kv_block_group_off(g, s, grp) + g->group_stride,
                                 (uint64_t)KV_PAGE);
        rg[nr++] = (frange){a, e - a, 0};
      }
  if (nr == 0)
    return 0;
  qsort(rg, nr, sizeof *rg, cmp_range);
  size_t m = 0;
  for (size_t i = 1; i < nr; i++) {
    if (rg[i].off <= rg[m].off + rg[m].len + gap) {
      uint64_t end = rg[i].off + rg[i].len;
      if (end > rg[m].off + rg[m].len)
        rg[m].len = end - rg[m].off;
    } else {
      rg[++m] = rg[i];
    }
  }
  return m + 1;
}

static size_t block_ranges(const fctx *x, const kv_block_geom *g, uint64_t gap, frange *rg)
{
  return block_ranges_ck(x, g, gap, rg, 1, 0); /* (the device's: never packed objects) */
}

/* Mark the groups of block b that hold positions order[i0, i1). */
static void mark_groups(fctx *x, const fblk *b, size_t i0, size_t i1)
{
  memset(x->need, 0, b->g.n_groups);
  for (size_t i = i0; i < i1; i++)
    x->need[(x->pos[x->order[i]] - b->pos0) / b->g.group_tokens] = 1;
}

/* Offset of token t's row of section s in the block object. */
static uint64_t row_off(const kv_block_geom *g, uint32_t s, uint32_t t)
{
  return kv_block_group_off(g, s, t / g->group_tokens) +
         (uint64_t)(t % g->group_tokens) * g->row_bytes;
}

static kvdb_status corrupt_at(fctx *x, const fblk *b, uint64_t off, uint32_t s, const char *where)
{
  char hx[33];
  x->db->corrupt_blocks++;
  return kv_fail(KVDB_CORRUPT,
                 "checksum mismatch%s in segment %" PRIu64 " at offset %" PRIu64
                 " (block %s, section %u)",
                 where, b->rec.segment, b->rec.offset + off, kv_hex16(b->hash, hx), s);
}

/* ---- DRAM and host ---- */

static int from_dram(fctx *x, const fblk *b, size_t i0, size_t i1)
{
  if (x->db->dram == NULL)
    return 0;
  const uint8_t *data;
  uint64_t len;
  kv_dram_entry *e = kv_dram_pin(x->db->dram, b->hash, &data, &len);
  if (e == NULL)
    return 0;
  int ok = len == b->g.data_bytes;
  for (size_t i = i0; ok && i < i1; i++) {
    uint32_t p = x->order[i], t = (uint32_t)(x->pos[p] - b->pos0);
    memcpy(x->k_out + (size_t)p * x->row, data + row_off(&b->g, x->sk, t) - b->g.meta_bytes, x->row);
    memcpy(x->v_out + (size_t)p * x->row, data + row_off(&b->g, x->sk + 1, t) - b->g.meta_bytes,
           x->row);
  }
  kv_dram_unpin(x->db->dram, e);
  if (ok)
    x->st.dram_blocks++;
  return ok;
}

static uint64_t at_of(const frange *rg, size_t nr, uint64_t off);

/* A block the host reads: positions order[i0, i1), its ranges rg[r0, r0 + nr) of the call's
 * list (their `at`: where they lie in the call's buffer). */
typedef struct hblk hblk;
struct hblk {
  uint32_t bi;
  size_t i0, i1, r0, nr;
  kv_segfile *sf;
  const uint64_t *ck[2]; /* its sections' checksum tables kept (x->cc), or NULL: read */
  uint64_t lead;         /* its ranges' offsets are the object's + lead (block_ranges_ck) */
};

/* The host blocks of one or more calls (heads of a layer: kv_get_heads_tokens_cc), read in ONE
 * batch (every block's page groups and checksum pages in flight at once, into one buffer), then
 * each group verified with its checksum and the rows copied. Call i's blocks are hbs[i][0,
 * ns[i]), its ranges go to rgs[i] (room for ns[i] * (1 + 2 * max_groups)). */
static kvdb_status from_host_many(fctx **xs, hblk **hbs, const size_t *ns, frange **rgs,
                                  size_t n_calls)
{
  size_t n_all = 0;
  for (size_t c = 0; c < n_calls; c++)
    n_all += ns[c];
  if (n_all == 0)
    return KVDB_OK;
  kvdb *db = xs[0]->db;
  uint64_t total = 0;
  for (size_t c = 0; c < n_calls; c++) {
  fctx *x = xs[c];
  hblk *hb = hbs[c];
  size_t n = ns[c], nr = 0;
  frange *rg = rgs[c];
  uint64_t mine = total;
  for (size_t j = 0; j < n; j++) {
    const fblk *b = &x->b[hb[j].bi];
    mark_groups(x, b, hb[j].i0, hb[j].i1);
    hb[j].r0 = nr;
    for (int k = 0; k < 2; k++)
      hb[j].ck[k] = x->cc != NULL ? ck_find(*x->cc, b->hash, x->sk + (uint32_t)k, b->g.n_groups)
                                  : NULL;
    int with_ck = hb[j].ck[0] == NULL || hb[j].ck[1] == NULL;
    if (with_ck)
      hb[j].ck[0] = hb[j].ck[1] = NULL;
    hb[j].nr = block_ranges_ck(x, &b->g, 0, rg + nr, with_ck, b->rec.offset);
    hb[j].lead = b->g.packed ? b->rec.offset % KV_PAGE : 0;
    for (size_t i = nr; i < nr + hb[j].nr; i++) {
      rg[i].at = total;
      total += rg[i].len;
    }
    nr += hb[j].nr;
    hb[j].sf = NULL;
  }
  x->st.host_bytes += total - mine; /* (the figures are reported on success only) */
  }
  kv_rbuf *rb = kv_rbuf_acquire(db, total);
  kv_batch *bat = NULL;
  kvdb_status rc = KVDB_OK;
  if (rb == NULL) {
    rc = kv_fail(KVDB_NOMEM, "a read buffer of %" PRIu64 " bytes", total);
    goto out;
  }
  if ((bat = kv_batch_begin(db->io)) == NULL) {
    rc = kv_fail(KVDB_NOMEM, "get_head_tokens batch");
    goto out;
  }
  for (size_t c = 0; c < n_calls; c++)
    for (size_t j = 0; j < ns[c]; j++) {
      const fblk *b = &xs[c]->b[hbs[c][j].bi];
      KV_ERR(kv_segfile_get(db, b->rec.segment, &hbs[c][j].sf));
      for (size_t i = hbs[c][j].r0; i < hbs[c][j].r0 + hbs[c][j].nr; i++)
        kv_batch_read(db->io, bat, hbs[c][j].sf->f, rb->p + rgs[c][i].at, rgs[c][i].len,
                      b->rec.offset - hbs[c][j].lead + rgs[c][i].off);
    }
  int e = kv_batch_wait(db->io, bat);
  if (e != 0) { /* the first block whose file is missing or short, if any */
    for (size_t c = 0; c < n_calls && rc != KVDB_CORRUPT; c++)
      for (size_t j = 0; j < ns[c]; j++) {
        const fblk *b = &xs[c]->b[hbs[c][j].bi];
        rc = kv_seg_read_fail(db, -e, b->rec.segment, b->rec.offset, b->rec.bytes, b->hash);
        if (rc == KVDB_CORRUPT)
          break;
      }
    goto out;
  }
  db->bytes_read += total;
  for (size_t c = 0; c < n_calls; c++) {
  fctx *x = xs[c];
  hblk *hb = hbs[c];
  size_t n = ns[c];
  frange *rg = rgs[c];
  for (size_t j = 0; j < n; j++) {
    const fblk *b = &x->b[hb[j].bi];
    const kv_block_geom *g = &b->g;
    const frange *br = rg + hb[j].r0;
    size_t bn = hb[j].nr;
    mark_groups(x, b, hb[j].i0, hb[j].i1);
    x->st.host_blocks++;
    kv_block_hdr hdr;
    memcpy(hdr.block_hash, b->hash, 16);
    for (uint32_t s = x->sk; s <= x->sk + 1; s++)
      for (uint32_t grp = 0; grp < g->n_groups; grp++) {
        if (!x->need[grp])
          continue;
        uint64_t off = kv_block_group_off(g, s, grp);
        const uint64_t *kept = hb[j].ck[s - x->sk];
        uint64_t want = kept != NULL ? kept[grp]
                                     : kv_get_le64(rb->p + at_of(br, bn, hb[j].lead + kv_block_cksum_off(g, s, grp)));
        if (kv_block_group_checksum(&hdr, s, grp, rb->p + at_of(br, bn, hb[j].lead + off), g->group_stride) !=
            want) {
          rc = corrupt_at(x, b, off, s, "");
          goto out;
        }
      }
    if (x->cc != NULL && hb[j].ck[0] == NULL) { /* the tables read: kept for the next calls */
      uint64_t *sums = malloc((size_t)g->n_groups * sizeof *sums);
      for (uint32_t s = x->sk; sums != NULL && s <= x->sk + 1; s++) {
        for (uint32_t grp = 0; grp < g->n_groups; grp++)
          sums[grp] = kv_get_le64(rb->p + at_of(br, bn, hb[j].lead + kv_block_cksum_off(g, s, grp)));
        ck_add(x->cc, b->hash, s, g->n_groups, sums);
      }
      free(sums);
    }
    for (size_t i = hb[j].i0; i < hb[j].i1; i++) {
      uint32_t p = x->order[i], t = (uint32_t)(x->pos[p] - b->pos0);
      memcpy(x->k_out + (size_t)p * x->row, rb->p + at_of(br, bn, hb[j].lead + row_off(g, x->sk, t)), x->row);
      memcpy(x->v_out + (size_t)p * x->row, rb->p + at_of(br, bn, hb[j].lead + row_off(g, x->sk + 1, t)),
             x->row);
    }
  }
  }
out:
  kv_batch_end(db->io, bat); /* waits for reads still in flight */
  for (size_t c = 0; c < n_calls; c++)
    for (size_t j = 0; j < ns[c]; j++)
      kv_segfile_put(db, hbs[c][j].sf);
  kv_rbuf_release(db, rb);
  return rc;
}

static kvdb_status from_host_all(fctx *x, hblk *hb, size_t n, frange *rg)
{
  return from_host_many(&x, &hb, &n, &rg, 1);
}

/* ---- the near-data device ---- */

typedef struct dwave {
  kv_fpga_dev *dev;
  kv_fpga_buf *src, *desc, *dst;
  size_t cap, max_rows;
  uint64_t fill;      /* bytes of src used */
  uint64_t *roff;     /* per row: offset in src */
  uint32_t *rpos;     /* per row pair: the position index */
  uint32_t n_rows;
  kv_fpga_gcheck *ck; /* per check */
  uint32_t *ckblk;    /* per check: its block */
  uint32_t *cksec;
  uint32_t n_ck, cap_ck;
  uint8_t *rows;      /* host copy of the gathered rows */
  uint64_t seg;       /* the segment fd is open for */
  int fd;
} dwave;

/* Gather the wave's rows on the device, read them, place them. */
static kvdb_status wave_flush(fctx *x, dwave *w)
{
  if (w->n_rows == 0)
    return KVDB_OK;
  kv_fpga_gather_args a = {w->src, w->desc, w->dst, w->roff, w->n_rows, x->row, w->ck, w->n_ck};
  kv_fpga_err err;
  int verified = 0;
  kv_fpga_status st = kv_fpga_gather(w->dev, &a, &verified, &err);
  if (st == KV_FPGA_ECORRUPT && err.value < w->n_ck) { /* name the block and the group */
    const fblk *b = &x->b[w->ckblk[err.value]];
    uint32_t s = w->cksec[err.value];
    uint32_t grp = (uint32_t)(w->ck[err.value].seed ^ kv_get_le64(b->hash)); /* group_seed */
    return corrupt_at(x, b, kv_block_group_off(&b->g, s, grp), s, " on the near-data device");
  }
  if (st != KV_FPGA_OK)
    return kv_score_fpga_fail(st, &err, "gathering rows on the near-data device");
  if (!verified)
    x->st.unverified_groups += w->n_ck;
  size_t stride = KV_FPGA_ROW_STRIDE(x->row), bytes = (size_t)w->n_rows * stride;
  st = kv_fpga_buf_read(w->dev, w->dst, 0, w->rows, bytes, &err);
  if (st != KV_FPGA_OK)
    return kv_score_fpga_fail(st, &err, "reading gathered rows from the near-data device");
  x->st.device_to_host_bytes += bytes;
  for (uint32_t r = 0; r < w->n_rows; r += 2) {
    uint32_t p = w->rpos[r / 2];
    memcpy(x->k_out + (size_t)p * x->row, w->rows + (size_t)r * stride, x->row);
    memcpy(x->v_out + (size_t)p * x->row, w->rows + (size_t)(r + 1) * stride, x->row);
  }
  w->n_rows = 0;
  w->n_ck = 0;
  w->fill = 0;
  return KVDB_OK;
}

/* Where object offset `off` of a block lies in the P2P buffer (its ranges, sorted, read). */
static uint64_t at_of(const frange *rg, size_t nr, uint64_t off)
{
  size_t r = 0;
  while (r + 1 < nr && rg[r + 1].off <= off)
    r++;
  return rg[r].at + (off - rg[r].off);
}

/* The device part of block b: its pages into the wave's P2P buffer (the wave flushed first
 * when they do not fit), its checks and rows queued. */
static kvdb_status wave_add(fctx *x, dwave *w, uint32_t bi, size_t i0, size_t i1, frange *rg)
{
  const fblk *b = &x->b[bi];
  const kv_block_geom *g = &b->g;
  mark_groups(x, b, i0, i1);
  size_t nr = block_ranges(x, g, DEV_GAP_BYTES, rg);
  uint64_t bytes = 0;
  uint32_t n_ck = 0;
  for (size_t i = 0; i < nr; i++)
    bytes += rg[i].len;
  for (uint32_t grp = 0; grp < g->n_groups; grp++)
    n_ck += 2u * x->need[grp];
  if (w->fill + bytes > w->cap || w->n_rows + 2 * (i1 - i0) > w->max_rows)
    KV_RET(wave_flush(x, w));
  if (w->n_ck + n_ck > w->cap_ck) {
    uint32_t cap = (w->n_ck + n_ck) * 2;
    kv_fpga_gcheck *ck = realloc(w->ck, cap * sizeof *ck);
    if (ck != NULL)
      w->ck = ck;
    uint32_t *cb = ck ? realloc(w->ckblk, cap * sizeof *cb) : NULL;
    if (cb != NULL)
      w->ckblk = cb;
    uint32_t *cs = cb ? realloc(w->cksec, cap * sizeof *cs) : NULL;
    if (cs == NULL)
      return kv_fail(KVDB_NOMEM, "device checks of %u groups", cap);
    w->cksec = cs;
    w->cap_ck = cap;
  }
  if (w->fd < 0 || w->seg != b->rec.segment) {
    if (w->fd >= 0)
      close(w->fd);
    w->fd = -1;
    KV_RET(kv_score_open_direct(x->db, b->rec.segment, &w->fd));
    w->seg = b->rec.segment;
  }
  for (size_t i = 0; i < nr; i++) {
    kv_fpga_err err;
    rg[i].at = w->fill;
    kv_fpga_status st = kv_fpga_p2p_read(w->dev, w->src, (size_t)w->fill, w->fd,
                                         b->rec.offset + rg[i].off, (size_t)rg[i].len, &err);
    if (st != KV_FPGA_OK)
      return kv_score_fpga_fail(st, &err, "P2P read of page groups");
    w->fill += rg[i].len;
  }
  x->st.device_bytes += bytes;
  x->st.device_blocks++;
  for (uint32_t s = x->sk; s <= x->sk + 1; s++)
    for (uint32_t grp = 0; grp < g->n_groups; grp++)
      if (x->need[grp]) {
        w->ckblk[w->n_ck] = bi;
        w->cksec[w->n_ck] = s;
        w->ck[w->n_ck++] = (kv_fpga_gcheck){at_of(rg, nr, kv_block_group_off(g, s, grp)),
                                            at_of(rg, nr, kv_block_cksum_off(g, s, grp)),
                                            group_seed(b->hash, s, grp), g->group_stride};
      }
  for (size_t i = i0; i < i1; i++) {
    uint32_t p = x->order[i], t = (uint32_t)(x->pos[p] - b->pos0);
    w->rpos[w->n_rows / 2] = p;
    w->roff[w->n_rows++] = at_of(rg, nr, row_off(g, x->sk, t));
    w->roff[w->n_rows++] = at_of(rg, nr, row_off(g, x->sk + 1, t));
  }
  return KVDB_OK;
}

static void wave_free(dwave *w)
{
  kv_fpga_buf_free(w->src);
  kv_fpga_buf_free(w->desc);
  kv_fpga_buf_free(w->dst);
  free(w->roff);
  free(w->rpos);
  free(w->ck);
  free(w->ckblk);
  free(w->cksec);
  free(w->rows);
  if (w->fd >= 0)
    close(w->fd);
}

static kvdb_status wave_init(fctx *x, dwave *w, kv_fpga_dev *dev, uint64_t biggest)
{
  memset(w, 0, sizeof *w);
  w->fd = -1;
  w->dev = dev;
  w->cap = (size_t)(biggest > kv_score_wave_bytes ? biggest : kv_score_wave_bytes);
  w->max_rows = 2 * x->n_pos < WAVE_ROWS ? 2 * x->n_pos : WAVE_ROWS;
  size_t stride = KV_FPGA_ROW_STRIDE(x->row);
  w->roff = malloc(w->max_rows * sizeof *w->roff);
  w->rpos = malloc(w->max_rows / 2 * sizeof *w->rpos);
  w->rows = kv_alloc_aligned(w->max_rows * stride);
  if (w->roff == NULL || w->rpos == NULL || w->rows == NULL)
    return kv_fail(KVDB_NOMEM, "gather lists of %zu rows", w->max_rows);
  kv_fpga_err err;
  kv_fpga_status st;
  if ((st = kv_fpga_buf_alloc(dev, w->cap, KV_FPGA_BUF_P2P, &w->src, &err)) != KV_FPGA_OK ||
      (st = kv_fpga_buf_alloc(dev, w->max_rows * 8, KV_FPGA_BUF_IN, &w->desc, &err)) !=
          KV_FPGA_OK ||
      (st = kv_fpga_buf_alloc(dev, w->max_rows * stride, KV_FPGA_BUF_OUT, &w->dst, &err)) !=
          KV_FPGA_OK)
    return kv_score_fpga_fail(st, &err, "near-data device buffers for the row gather");
  return KVDB_OK;
}

/* ---- one attempt over a catalog snapshot ---- */

static kvdb_status snapshot(fctx *x, const kvdb_key *context, kv_read_snap *s)
{
  kvdb *db = x->db;
  const kvdb_model *m = x->m;
  uint32_t bt = m->block_tokens ? m->block_tokens : 256;
  kv_txn *txn;
  char hx[33];
  uint8_t mh[16];
  KV_RET(kv_read_begin(db, s));
  txn = s->txn;
  kv_model_hash(m, bt, mh);
  kv_ctx_rec cr;
  kvdb_status rc = kv_ctx_of_model(db, txn, context->b, mh, m, &cr);
  for (size_t i = 0; rc == KVDB_OK && i < x->n_pos; i++)
    if (x->pos[i] >= cr.n_tokens)
      rc = kv_fail(KVDB_INVALID, "positions[%zu] = %u out of range (context has %" PRIu64
                   " tokens)", i, x->pos[i], cr.n_tokens);
  if (rc != KVDB_OK)
    goto out;
  x->b = calloc(cr.n_blocks ? cr.n_blocks : 1, sizeof *x->b);
  if (x->b == NULL) {
    rc = kv_fail(KVDB_NOMEM, "context of %u blocks", cr.n_blocks);
    goto out;
  }
  uint64_t pos = 0;
  for (uint32_t i = 0; i < cr.n_blocks; i++) {
    fblk *b = &x->b[i];
    memcpy(b->hash, cr.blocks + 16 * i, 16);
    rc = kv_ctx_block(db, txn, context->b, b->hash, &b->rec);
    if (rc != KVDB_OK)
      goto out;
    b->rec.tokens = NULL;
    b->pos0 = pos;
    x->n_b = i + 1;
    KV_ERR(kv_block_geom_init(&b->g, m->n_layers, m->n_kv_heads, m->head_dim, m->dtype, bt,
                              b->rec.n_tokens));
    kv_rec_geom(&b->g, &b->rec);
    pos += b->rec.n_tokens;
  }
  if (pos != cr.n_tokens)
    rc = kv_fail(KVDB_CORRUPT, "context %s has %" PRIu64 " tokens in its blocks and %" PRIu64
                 " in its record", kv_hex16(context->b, hx), pos, cr.n_tokens);
out:
  kv_txn_abort(txn);
  return rc;
}

static int by_block(const void *a, const void *b, void *ctx)
{
  const uint32_t *blk = ctx;
  uint32_t x = blk[*(const uint32_t *)a], y = blk[*(const uint32_t *)b];
  return x < y ? -1 : x > y;
}

static kvdb_status attempt(fctx *x, const kvdb_key *context, kv_read_snap *s)
{
  kvdb *db = x->db;
  KV_RET(snapshot(x, context, s));
  /* each position's block (blocks are in position order), then the positions by block */
  for (size_t i = 0; i < x->n_pos; i++) {
    uint32_t lo = 0, hi = x->n_b - 1;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo + 1) / 2;
      if (x->b[mid].pos0 <= x->pos[i])
        lo = mid;
      else
        hi = mid - 1;
    }
    x->blk[i] = lo;
    x->order[i] = (uint32_t)i;
  }
  qsort_r(x->order, x->n_pos, sizeof *x->order, by_block, x->blk);
  uint32_t tiers = x->o.device_tiers ? x->o.device_tiers : 1u << KVDB_TIER_SMARTSSD;
  uint32_t max_groups = 1;
  uint64_t biggest = 0;
  for (uint32_t i = 0; i < x->n_b; i++) {
    if (x->b[i].g.n_groups > max_groups)
      max_groups = x->b[i].g.n_groups;
    if (x->b[i].g.total_bytes > biggest)
      biggest = x->b[i].g.total_bytes;
  }
  frange *rg = malloc((1 + 2 * (size_t)max_groups) * sizeof *rg);
  frange *hrg = malloc((size_t)x->n_b * (1 + 2 * (size_t)max_groups) * sizeof *hrg);
  hblk *hb = malloc((size_t)x->n_b * sizeof *hb);
  size_t n_hb = 0;
  x->need = malloc(max_groups);
  kv_fpga_dev *dev = NULL;
  int slot = 0, kept = 0;
  dwave w;
  memset(&w, 0, sizeof w);
  w.fd = -1;
  kvdb_status rc = KVDB_OK;
  if (rg == NULL || hrg == NULL || hb == NULL || x->need == NULL) {
    rc = kv_fail(KVDB_NOMEM, "page ranges of %u groups", max_groups);
    goto out;
  }
  x->n_dec = 0;
  for (size_t i0 = 0, i1; i0 < x->n_pos; i0 = i1) {
    uint32_t bi = x->blk[x->order[i0]];
    for (i1 = i0 + 1; i1 < x->n_pos && x->blk[x->order[i1]] == bi; i1++)
      ;
    const fblk *b = &x->b[bi];
    if (from_dram(x, b, i0, i1))
      continue;
    if (b->rec.bflags & KV_BLK_COMPRESSED) { /* after the snapshot, by kvdb_get_tokens */
      x->st.decoded_blocks++;
      for (size_t i = i0; i < i1; i++)
        x->dec[x->n_dec++] = x->order[i];
      continue;
    }
    if (x->o.device != KVDB_SCORE_CPU && b->rec.tier < 32 && (tiers >> b->rec.tier & 1) &&
        b->rec.offset % KV_PAGE == 0 && !b->g.packed) {
      if (dev == NULL) {
        KV_ERR(kv_score_dev_acquire(db, &x->o, &dev, &slot, &kept));
        KV_ERR(wave_init(x, &w, dev, biggest));
      }
      for (size_t j0 = i0; j0 < i1; j0 += WAVE_ROWS / 2) /* (many repeats of positions) */
        KV_ERR(wave_add(x, &w, bi, j0, i1 - j0 < WAVE_ROWS / 2 ? i1 : j0 + WAVE_ROWS / 2, rg));
      continue;
    }
    hb[n_hb++] = (hblk){bi, i0, i1, 0, 0, NULL}; /* read below, all in one batch */
  }
  if (dev != NULL)
    KV_ERR(wave_flush(x, &w));
  if (x->defer) { /* the caller reads them with other calls' (kv_get_heads_tokens_cc) */
    x->hb = hb;
    x->n_hb = n_hb;
    x->hrg = hrg;
    hb = NULL;
    hrg = NULL;
  } else {
    KV_ERR(from_host_all(x, hb, n_hb, hrg));
  }
out:
  if (dev != NULL) {
    wave_free(&w);
    kv_score_dev_release(db, &x->o, dev, slot, kept);
  }
  free(rg);
  free(hrg);
  free(hb);
  if (!x->defer || rc != KVDB_OK) {
    free(x->need);
    x->need = NULL;
  }
  return rc;
}

/* The positions of compressed blocks (x->dec), through kvdb_get_tokens: every KV head of the
 * layer into a scratch view, this head's rows kept. */
static kvdb_status decode_rest(fctx *x, const kvdb_key *context, uint32_t layer)
{
  if (x->n_dec == 0)
    return KVDB_OK;
  const kvdb_model *m = x->m;
  size_t hrow = (size_t)m->n_kv_heads * x->row;
  uint32_t *p = malloc(x->n_dec * sizeof *p);
  uint8_t *scratch = malloc(2 * x->n_dec * hrow);
  if (p == NULL || scratch == NULL) {
    free(p);
    free(scratch);
    return kv_fail(KVDB_NOMEM, "decoding %zu positions", x->n_dec);
  }
  for (size_t i = 0; i < x->n_dec; i++)
    p[i] = x->pos[x->dec[i]];
  kvdb_kv_view v;
  memset(&v, 0, sizeof v);
  v.k.base = scratch;
  v.v.base = scratch + x->n_dec * hrow;
  v.k.token_stride = v.v.token_stride = (int64_t)hrow;
  v.k.head_stride = v.v.head_stride = (int64_t)x->row;
  uint64_t before = x->db->bytes_read;
  kvdb_status rc = kvdb_get_tokens(x->db, m, context, layer, p, x->n_dec, &v);
  x->st.host_bytes += x->db->bytes_read - before;
  if (rc == KVDB_OK) {
    uint32_t head = (x->sk / 2) % m->n_kv_heads;
    for (size_t i = 0; i < x->n_dec; i++) {
      size_t q = x->dec[i];
      memcpy(x->k_out + q * x->row, scratch + i * hrow + (size_t)head * x->row, x->row);
      memcpy(x->v_out + q * x->row, scratch + (x->n_dec + i) * hrow + (size_t)head * x->row,
             x->row);
    }
  }
  free(p);
  free(scratch);
  return rc;
}

kvdb_status kvdb_get_head_tokens(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                 uint32_t layer, uint32_t kv_head, const uint32_t *positions,
                                 size_t n_pos, void *k_out, void *v_out,
                                 const kvdb_score_opts *opts, kvdb_fetch_stats *stats)
{
  return kv_get_head_tokens_cc(db, m, context, layer, kv_head, positions, n_pos, k_out, v_out,
                               opts, stats, NULL);
}

kvdb_status kv_get_head_tokens_cc(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                  uint32_t layer, uint32_t kv_head, const uint32_t *positions,
                                  size_t n_pos, void *k_out, void *v_out,
                                  const kvdb_score_opts *opts, kvdb_fetch_stats *stats,
                                  kv_ckcache **cc)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (stats != NULL)
    memset(stats, 0, sizeof *stats);
  if (context == NULL || positions == NULL || k_out == NULL || v_out == NULL)
    return kv_fail(KVDB_INVALID, "%s is NULL",
                   context == NULL ? "context" : positions == NULL ? "positions"
                                                 : k_out == NULL   ? "k_out"
                                                                   : "v_out");
  if (n_pos == 0 || n_pos > MAX_POS)
    return kv_fail(KVDB_INVALID, "n_pos %zu is 0 or more than 2^23", n_pos);
  if (layer >= m->n_layers || kv_head >= m->n_kv_heads)
    return kv_fail(KVDB_INVALID, "layer %u / kv_head %u out of range (model '%s' has %u layers, "
                   "%u KV heads)", layer, kv_head, m->id, m->n_layers, m->n_kv_heads);
  fctx x;
  memset(&x, 0, sizeof x);
  KV_RET(kv_score_opts_get(opts, &x.o));
  x.db = db;
  x.m = m;
  x.cc = cc;
  x.sk = (layer * m->n_kv_heads + kv_head) * 2;
  x.pos = positions;
  x.n_pos = n_pos;
  x.k_out = k_out;
  x.v_out = v_out;
  x.row = m->head_dim * kv_dtype_bytes(m->dtype);
  x.order = malloc(n_pos * sizeof *x.order);
  x.blk = malloc(n_pos * sizeof *x.blk);
  x.dec = malloc(n_pos * sizeof *x.dec);
  kvdb_status rc = KVDB_OK;
  if (x.order == NULL || x.blk == NULL || x.dec == NULL)
    rc = kv_fail(KVDB_NOMEM, "%zu positions", n_pos);
  kv_read_snap s = {0};
  while (rc == KVDB_OK) {
    memset(&x.st, 0, sizeof x.st);
    rc = attempt(&x, context, &s);
    free(x.b);
    x.b = NULL;
    x.n_b = 0;
    if (!kv_read_again(db, &s, rc != KVDB_OK && rc != KVDB_INVALID))
      break;
    rc = KVDB_OK; /* a compaction moved blocks meanwhile: again from a fresh snapshot */
  }
  if (rc == KVDB_OK)
    rc = decode_rest(&x, context, layer);
  if (rc == KVDB_OK) {
    x.st.rows = n_pos;
    kv_note_access(db, context->b);
    if (stats != NULL)
      *stats = x.st;
  }
  free(x.order);
  free(x.blk);
  free(x.dec);
  return rc;
}

/*
 * kv_get_head_tokens_cc for several KV heads of one layer (a decode step's fetch): each head's
 * blocks are planned as one call plans them (DRAM, device, compressed: as there), and the host
 * blocks of every head are read in one batch. If that try fails while a compaction moved blocks,
 * every head is fetched again on its own (kv_get_head_tokens_cc, which retries).
 */
kvdb_status kv_get_heads_tokens_cc(kvdb *db, const kvdb_model *m, const kvdb_key *context,
                                   uint32_t layer, uint32_t n_heads, const uint32_t *heads,
                                   const uint32_t *const *positions, const size_t *n_pos,
                                   void *const *k_out, void *const *v_out,
                                   const kvdb_score_opts *opts, kvdb_fetch_stats *stats,
                                   kv_ckcache **cc)
{
  uint32_t bt;
  KV_RET(kv_check_db(db));
  KV_RET(kv_check_model(m, &bt));
  if (context == NULL || heads == NULL || positions == NULL || n_pos == NULL || k_out == NULL ||
      v_out == NULL || stats == NULL)
    return kv_fail(KVDB_INVALID, "NULL argument to kv_get_heads_tokens_cc");
  for (uint32_t i = 0; i < n_heads; i++) {
    memset(&stats[i], 0, sizeof stats[i]);
    if (positions[i] == NULL || k_out[i] == NULL || v_out[i] == NULL)
      return kv_fail(KVDB_INVALID, "head %u: NULL positions or outputs", i);
    if (n_pos[i] == 0 || n_pos[i] > MAX_POS)
      return kv_fail(KVDB_INVALID, "head %u: n_pos %zu is 0 or more than 2^23", i, n_pos[i]);
    if (layer >= m->n_layers || heads[i] >= m->n_kv_heads)
      return kv_fail(KVDB_INVALID, "layer %u / kv_head %u out of range (model '%s' has %u "
                     "layers, %u KV heads)", layer, heads[i], m->id, m->n_layers, m->n_kv_heads);
  }
  if (n_heads == 1)
    return kv_get_head_tokens_cc(db, m, context, layer, heads[0], positions[0], n_pos[0],
                                 k_out[0], v_out[0], opts, &stats[0], cc);
  fctx *x = calloc(n_heads ? n_heads : 1, sizeof *x);
  fctx **xp = calloc(n_heads ? n_heads : 1, sizeof *xp);
  hblk **hbs = calloc(n_heads ? n_heads : 1, sizeof *hbs);
  frange **rgs = calloc(n_heads ? n_heads : 1, sizeof *rgs);
  size_t *ns = calloc(n_heads ? n_heads : 1, sizeof *ns);
  kv_read_snap *snap = calloc(n_heads ? n_heads : 1, sizeof *snap);
  kvdb_status rc = KVDB_OK;
  uint32_t planned = 0;
  if (x == NULL || xp == NULL || hbs == NULL || rgs == NULL || ns == NULL || snap == NULL) {
    rc = kv_fail(KVDB_NOMEM, "fetch of %u heads", n_heads);
    goto out;
  }
  for (uint32_t i = 0; i < n_heads && rc == KVDB_OK; i++) {
    fctx *y = &x[i];
    xp[i] = y;
    KV_ERR(kv_score_opts_get(opts, &y->o));
    y->db = db;
    y->m = m;
    y->cc = cc;
    y->defer = 1;
    y->sk = (layer * m->n_kv_heads + heads[i]) * 2;
    y->pos = positions[i];
    y->n_pos = n_pos[i];
    y->k_out = k_out[i];
    y->v_out = v_out[i];
    y->row = m->head_dim * kv_dtype_bytes(m->dtype);
    y->order = malloc(n_pos[i] * sizeof *y->order);
    y->blk = malloc(n_pos[i] * sizeof *y->blk);
    y->dec = malloc(n_pos[i] * sizeof *y->dec);
    if (y->order == NULL || y->blk == NULL || y->dec == NULL) {
      rc = kv_fail(KVDB_NOMEM, "%zu positions", n_pos[i]);
      goto out;
    }
    rc = attempt(y, context, &snap[i]);
    planned = i + 1;
    hbs[i] = y->hb;
    rgs[i] = y->hrg;
    ns[i] = y->n_hb;
  }
  if (rc == KVDB_OK)
    rc = from_host_many(xp, hbs, ns, rgs, n_heads);
  if (rc != KVDB_OK && rc != KVDB_INVALID) {
    int again = 0;
    for (uint32_t i = 0; i < planned; i++)
      again |= kv_read_again(db, &snap[i], 1);
    if (again) { /* blocks moved meanwhile: each head on its own, with its retries */
      rc = KVDB_OK;
      for (uint32_t i = 0; i < n_heads && rc == KVDB_OK; i++)
        rc = kv_get_head_tokens_cc(db, m, context, layer, heads[i], positions[i], n_pos[i],
                                   k_out[i], v_out[i], opts, &stats[i], cc);
      goto out;
    }
  }
  for (uint32_t i = 0; i < n_heads && rc == KVDB_OK; i++) {
    free(x[i].b); /* decode_rest reads through kvdb_get_tokens, not the snapshot */
    x[i].b = NULL;
    rc = decode_rest(&x[i], context, layer);
    if (rc == KVDB_OK) {
      x[i].st.rows = n_pos[i];
      stats[i] = x[i].st;
    }
  }
  if (rc == KVDB_OK)
    kv_note_access(db, context->b);
out:
  for (uint32_t i = 0; x != NULL && i < n_heads; i++) {
    free(x[i].b);
    free(x[i].hb);
    free(x[i].hrg);
    free(x[i].need);
    free(x[i].order);
    free(x[i].blk);
    free(x[i].dec);
  }
  free(x);
  free(xp);
  free(hbs);
  free(rgs);
  free(ns);
  free(snap);
  return rc;
}
