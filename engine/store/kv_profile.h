/* SPDX-License-Identifier: MIT */
/*
 * engine/store/kv_profile.h — the quality profile of a context (profile.c): for each config of
 * a space, the context's size in it and the attention-output fidelity of its decoded KV.
 */
#ifndef KV_PROFILE_H
#define KV_PROFILE_H

#include "kv_cblock.h"

#define KV_PROFILE_HEADS_DEFAULT 16
#define KV_PROFILE_MAX_CONFIGS 64

/* The configs of a space string (names separated by commas; NULL or "" = the default space,
 * with the snapkv configs only when queries exist). KVDB_INVALID names a bad name. */
kvdb_status kv_profile_space(const char *space, int have_queries, const kvdb_model *m,
                             kvdb_config *out, uint32_t cap, uint32_t *n);

/* What a profile is measured from: the whole context in the caller's layout (or decoded). */
typedef struct kv_profile_src {
  const kvdb_model *m;
  uint32_t block_tokens;
  const kvdb_kv_view *kv; /* n_tokens tokens */
  uint64_t n_tokens;
  const kv_queries *q;    /* NULL: probes derived from the keys */
  const char *space;      /* NULL: the default space */
  uint32_t heads;         /* sampled (layer, KV head) pairs; 0 = KV_PROFILE_HEADS_DEFAULT */
  const kvdb_config *not_below; /* NULL, or the config the KV already went through: configs
                                   that would need what it lost are recorded unmeasured */
} kv_profile_src;

kvdb_status kv_profile_measure(const kv_profile_src *src, kv_profile_rec *out);

/* Record profile p for an existing context in its own transaction: its stored config and
 * exact bytes come from the catalog; reports of an earlier profile are kept. */
kvdb_status kv_profile_store(kvdb *db, const uint8_t key[16], kv_profile_rec *p);

/* The queries of put options, checked against the model (*out NULL when there are none). */
kvdb_status kv_opts_queries(const kvdb_put_opts *o, const kvdb_model *m, kv_queries *q,
                            const kv_queries **out);

/* Mark the entry of cfg as the stored config with exact bytes (adding it when missing). */
void kv_profile_mark_stored(kv_profile_rec *p, const kvdb_config *cfg, uint64_t bytes);

/* Whether two configs are the same. */
int kv_config_equal(const kvdb_config *a, const kvdb_config *b);

/* Whether KV stored with `have` still holds everything `want` needs: precision cannot come
 * back (a lossy config can only become lossier, dropped tokens stay dropped). */
int kv_config_reachable(const kvdb_config *have, const kvdb_config *want);

#endif
