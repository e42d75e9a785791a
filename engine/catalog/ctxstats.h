/* SPDX-License-Identifier: MIT */
/*
 * engine/catalog/ctxstats.h — what the placement policy keeps per context in the catalog
 * (the `ctxstats` database), and the catalog's meta entries of the policy: the SmartSSD
 * tier's directory and the cached tier read figures (FORMAT.md §2).
 *
 * A ctxstats record holds a context's decayed access count (EvicPress §4.2's "frequency": a
 * count halved every half-life, kept as of `freq_ms`) and where the policy placed it (the tier
 * of its persistent copy, and whether the DRAM tier is to hold it). Records are advisory: a
 * context without one counts as accessed once at its last access time; a record whose context
 * is gone is ignored (and removed by the next rebalance).
 *
 * Pure codecs and typed gets/puts, like catalog.h; the databases are opened by catalog.c.
 */
#ifndef KV_CTXSTATS_H
#define KV_CTXSTATS_H

#include "catalog.h"

#define KV_CTXSTATS_REC_VERSION 1u
#define KV_CTXSTATS_REC_BYTES 32u

/* kv_ctxstats.flags */
enum { KV_CTXS_CACHED = 1 };

typedef struct kv_ctxstats {
  uint32_t flags;    /* KV_CTXS_*: the plan keeps it in the DRAM tier */
  uint32_t tier;     /* kvdb_tier of its persistent copy as last placed */
  double freq;       /* decayed access count as of freq_ms (finite, >= 0) */
  uint64_t freq_ms;  /* Unix ms */
  uint64_t accesses; /* accesses counted (not decayed) */
} kv_ctxstats;

void kv_ctxstats_encode(const kv_ctxstats *r, uint8_t dst[KV_CTXSTATS_REC_BYTES]);
kvdb_status kv_ctxstats_decode(const uint8_t *src, size_t len, kv_ctxstats *r);

/* The decayed count of r as of now_ms, with half-life half_life_ms (<= 0: no decay). */
double kv_ctxstats_freq_at(const kv_ctxstats *r, uint64_t now_ms, double half_life_ms);

/* Typed access; KVDB_NOTFOUND when absent (also when the catalog has no ctxstats database:
 * a format-1/2 catalog opened read-only). Puts need the database (KVDB_READONLY without). */
kvdb_status kv_cat_get_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                kv_ctxstats *r);
kvdb_status kv_cat_put_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                const kv_ctxstats *r);
kvdb_status kv_cat_del_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16]);

/* One access at now_ms: decay, + 1, count it (creating the record, tier SSD, when absent). */
kvdb_status kv_cat_touch_ctxstats(kv_catalog *c, kv_txn *txn, const uint8_t key[16],
                                  uint64_t now_ms, double half_life_ms);

/* Meta strings (a NUL-free byte string up to cap - 1 bytes, NUL added). KVDB_NOTFOUND when
 * absent, KVDB_CORRUPT when too long or holding a NUL. */
kvdb_status kv_cat_get_str(kv_catalog *c, kv_txn *txn, const char *name, char *buf, size_t cap);
kvdb_status kv_cat_put_str(kv_catalog *c, kv_txn *txn, const char *name, const char *v);

/* Meta blobs of fixed size (the tier figures): KVDB_CORRUPT when the size differs. */
kvdb_status kv_cat_get_blob(kv_catalog *c, kv_txn *txn, const char *name, void *buf, size_t len);
kvdb_status kv_cat_put_blob(kv_catalog *c, kv_txn *txn, const char *name, const void *buf,
                            size_t len);

#endif
