/* SPDX-License-Identifier: MIT */
/*
 * policy/policy.h — the EvicPress placement policy: per context, which tier holds it and
 * in which storage config, chosen by a utility function and a greedy multiple-choice knapsack
 * that cascades down the tiers. Pure functions over plain arrays: no I/O, no locking, no global
 * state, nothing of the engine but the public types of kvdb.h (kvdb_config, kvdb_status).
 *
 * Source: Feng, Liu et al., "EvicPress: Joint KV-Cache Compression and Eviction for Efficient
 * LLM Serving" (shared/seeds/004_*.txt): the utility function (§4.2), the configuration
 * selection module (§4.4) and its policy optimizer (Appendix A, Algorithm 1).
 *
 * THE MODEL
 *
 *   A context i has options o = 0..k_i-1: the configs of its quality profile, each with the
 *   context's stored bytes B(o) in that config and its quality Q(o) in [0, 1] (the caller
 *   decides which quality: kvdb_profile_entry.reported_quality when present, else .quality).
 *   It also has its raw (uncompressed) bytes R, its token count N and a frequency f (the caller
 *   passes a decayed access count; kv_policy_decay() helps).
 *
 *   Tiers t = 0..T-1 are ordered fast to slow (DRAM, SSD, SmartSSD), each with a capacity C_t
 *   (bytes), a read bandwidth W_t (bytes/s) and a latency L_t (s). Below the last tier is
 *   "not stored": the context is recomputed by a prefill.
 *
 *     TTFT(t, o)  = L_t + bytes_t(o) / W_t + decode(o)
 *                   bytes_t(o) = B(o), or the decoded bytes for a KV_POLICY_TIER_DECODED tier
 *                   decode(o)  = R / D(o), D = the method's decode throughput in bytes of
 *                                ORIGINAL KV per second (0 = free); 0 on a DECODED tier
 *     TTFT(none)  = N / prefill_tokens_per_s           quality(none) = recompute_quality
 *     U(t, o)     = (alpha * Q(o) - TTFT(t, o)) * f    (EvicPress §4.2)
 *     U(none)     = (alpha * recompute_quality - TTFT(none)) * f
 *
 *   alpha is in seconds per unit of quality: a config that loses 0.01 of quality is worth it
 *   when it saves more than 0.01 * alpha seconds of TTFT.
 *
 * THE INCLUSIVE TIER (kvdb's DRAM tier)
 *
 *   kvdb's DRAM tier is an inclusive cache: a context held there also keeps its persistent copy
 *   on a lower tier, and the DRAM copy is made from that copy, so both have the same config.
 *   Tier 0 may carry KV_POLICY_TIER_INCLUSIVE (no other tier may). A placement is then
 *     (tier p >= 1, option o, cached c): the persistent copy on tier p in option o, and when
 *     c = 1 a copy in the same option on tier 0 as well;
 *   it is served from tier 0 when cached, else from tier p. A cached context uses bytes on both
 *   tiers. Without an inclusive tier a placement is (tier p >= 0, option o), cached = 0.
 *   Either way tier = KV_POLICY_NONE means not stored (recomputed).
 *
 * THE GREEDY (Algorithm 1, cascading as in §4.4)
 *
 *   1. An incoming context takes its best option on the top tier: o* = argmax_o U(0, o) (with
 *      an inclusive tier 0: cached, its persistent copy on tier 1 in the same option).
 *      Algorithm 1 line 1 writes argmax Q; §4.4's text ("the configuration corresponding to the
 *      highest utility function score") and issue 5 say utility, which is what is done here.
 *   2. For t = 0, 1, ..., T-1: while tier t holds more than C_t bytes, among the contexts on
 *      tier t apply the operation of least cost (Algorithm 1 line 6):
 *        - recompress in place to an option that is smaller ON TIER t (options that do not
 *          save space on t are filtered out, as §4.4 says);
 *        - evict = demote to the next tier, where the context takes its best option there
 *          (§4.4: "the same update process is applied recursively if the lower-tier storage is
 *          also full"); from the last tier, to "not stored".
 *      On the inclusive tier, evicting drops the cached copy only (frees tier-0 bytes); the
 *      persistent copy then takes its best option on its own tier. A cached context whose
 *      persistent copy is demoted keeps its option (it is still served from tier 0) and loses
 *      its cached copy only when it leaves the last tier. Recompressing a cached context changes
 *      both copies and is allowed only when it grows neither.
 *      Cost = the utility drop U(before) - U(after) (KV_POLICY_LEAST_DROP: Algorithm 1), or the
 *      drop per byte freed on tier t (KV_POLICY_PER_BYTE: the classic MCKP greedy, which walks
 *      down the convex hull of a context's (bytes, utility) points).
 *   Operations only ever move bytes downwards, so a tier that fits stays fitting while the
 *   tiers below it are resolved; the last tier can always evict to "not stored", so the result
 *   always fits every capacity.
 *   One addition outside the paper's assumptions (it assumes loading always beats a prefill):
 *   whenever a context takes its best option on a tier (admission, demotion, leaving the
 *   inclusive tier), it is not stored instead when recomputing it has a higher utility than
 *   every option there. Nothing is ever placed where it is worth less than a recompute.
 *
 * THE DEFAULT RULE (KV_POLICY_REFILL). Algorithm 1 as written (KV_POLICY_LEAST_DROP) and the
 * per-byte greedy both stop once every tier fits: neither ever fills a tier again after the
 * cascade emptied it further than needed (a coarse tier: one large context leaves, most of the
 * tier stays empty), and per-byte alone can prefer a small dense context to a large valuable
 * one that no longer fits. The default runs the per-byte greedy above with five additions:
 *   a. an incoming context starts on the tier where its best option has the highest utility
 *      (ties: the upper one) rather than always on the top tier: when a probe measures the top
 *      tier slower than recomputing (or than the tier below), the context is not dropped (or
 *      cached in the slow tier) while a lower tier serves it;
 *   b. a refill pass: every context whose best placement ignoring capacities beats where it is,
 *      by gain per byte added (highest first, ties lower index), takes the placement of highest
 *      utility among those that fit in the room left (any tier, option, cached or not, or not
 *      stored); passes repeat while they change something (at most 3); a pass stops once no
 *      option of any context fits in any tier;
 *   c. the best-single-item guard: among the 8 contexts of highest gain alone (the utility of
 *      its best placement that fits the empty tiers, minus recomputing it), each one the greedy
 *      left below that and whose gain alone is at least 1/4 of what the whole placement gains
 *      over storing nothing is placed alone and every other context refilled around it (b from
 *      "nothing stored"); the result replaces the placement when it is worth more by over 1e-4
 *      of the total (near-equal alternatives keep the greedy's: a rebalance of a rebalanced
 *      store, with tier figures measured a little apart, moves nothing);
 *   d. re-insertion: the 8 contexts that would gain most from a better place (their best
 *      placement without capacities), one at a time, take that place; the cascade makes room
 *      (shrinking or moving others, or the context itself) and b fills what is left; kept when
 *      worth more by over 1e-4 of the total.
 *   e. up to 256 contexts, all of the above runs a second time from a least-drop cascade
 *      (Algorithm 1's order) instead of the per-byte one; the better result is kept (by over
 *      1e-4 of the total).
 *   f. up to 16 contexts, after d (in each run of e): exchange steps. One context takes any
 *      other placement that fits beside the rest, a second its best placement in the room
 *      left; while all contexts' placements number at most 128, also two contexts take any
 *      placements that fit and a third its best in the room left. The step of largest total
 *      gain (over 1e-4 of the gain over storing nothing) is made and b fills what is left; at
 *      most 4 steps. Part 7's min share 0.911 -> 0.9147.
 *   g. up to 32 contexts, last: a search (search.c's branch and bound) from the placement found,
 *      which keeps only placements worth more by over 1e-4 of the gain over storing nothing.
 *      Its bound on what the contexts not yet placed can add is the smaller of the sum of their
 *      best utilities and the Lagrangian one: with the LP relaxation's prices lambda_t (the
 *      coordinate descent of kv_policy_upper_bound, at most 32 cycles, then, when that bound
 *      leaves a gap, its pattern search within about 2 million multiply-adds), sum_t lambda_t *
 *      (room left on t) + the sum of their best U - lambda . bytes; choices that fit no empty tier
 *      or that another choice of the same context dominates are left out. It looks at most at
 *      100,000 choices (a few ms) and keeps the best placement found by then: on small
 *      instances it finishes and the rule is the optimum (within the margin); the changes it
 *      finds are the ones no step of b-f makes, e.g. four contexts changing through a loss (one
 *      large context out, three smaller in). Part 7's min share 0.9147 -> 0.9999; on random
 *      instances of 16-28 contexts (3 tiers) 0.909 -> 0.998.
 *   Above 256 contexts the effort is bounded: one refill pass, one guard trial, no
 *   re-insertion, no second run (each trial costs about one greedy).
 *   Every rule but KV_POLICY_LEAST_DROP: a stored context the plan keeps on its persistent tier
 *   keeps its stored config when the chosen one gains no more than 1e-4 of its utility there
 *   and keeping it fits (a re-encoding is a write and a sync for a near-tie).
 * b to g only ever raise the total utility of what the cascade found; a changes where it
 * starts (measured above the per-byte greedy in 1015 and below it in 1 of 3000 random small
 * instances, test policy-refill). plan.n_recompress / n_evict count the operations of every
 * cascade run. `kvdb-bench policy` (part 7) reports each rule's share of the
 * exact optimum.
 *
 * DETERMINISM. Identical input gives identical output (on one build and platform). Ties break
 * as follows: best option = highest utility, then lowest option index. Among one context's
 * operations: lowest cost, then recompress before evict, then the recompression that keeps
 * more bytes on the tier, then the lower option index. Among contexts: lowest cost, then
 * lowest context index.
 *
 * COST. With KV_POLICY_LEAST_DROP and KV_POLICY_PER_BYTE, kv_policy_rebalance and
 * kv_policy_admit are O(T * K + m * log n) for n contexts with
 * K options in all and m greedy operations: every option is read a constant number of times
 * per tier (its utility on each tier once; a scan for the first operation of each context on
 * an over-full tier; a sort of the candidates of a context the first time it is recompressed
 * there), then each operation costs O(1) plus a heap step (one 4-ary heap per over-full tier;
 * O(k) instead for a cached context on a persistent tier when a tier is DECODED).
 * Memory O(n + K). An admit into a store of n contexts costs the same O(T * K) as a rebalance:
 * every context on an over-full tier is a candidate (measured by `kvdb-bench policy`:
 * place_100k_ms, admit_100k_ms). kv_policy_exact is exponential (branch and bound, for small
 * instances). The default rule's search (g) costs O(S^2 / n) for S choices in all (dominance,
 * up to 32 contexts), the prices (bounded as above) and at most 100,000 choices looked at:
 * 0.27 ms against 0.23 without it, median over part 7's instances. KV_POLICY_REFILL adds O(n * T)
 * per refill pass (each candidate's gain from its
 * best option per tier, kept from the first pass; a radix sort by gain per byte; the options of
 * a candidate are scanned only when a tier it could gain on has the free bytes its smallest
 * option needs) and a greedy's cost per guard trial or re-insertion (up to 3 passes, 8 trials,
 * 8 re-insertions up to 256 contexts; 1 pass, 1 trial above): 1.2-1.3x the per-byte greedy
 * at 100k contexts (`kvdb-bench policy`: place_100k_ms). These shortcuts decide nothing: the
 * greedy built without them (POL_REFERENCE) gives the same plans (test policy-same).
 * kv_policy_upper_bound is O(cycles * T * S * h) with S the (context, placement)
 * choices and h the length of a context's hull, and holds the S choices in memory
 * (8 * (T + 1) bytes each).
 *
 * USAGE (the engine's side)
 *
 *   kvdb's tiers today: tier 0 = the DRAM tier (KV_POLICY_TIER_INCLUSIVE, and
 *   KV_POLICY_TIER_DECODED while it caches decoded blocks), tier 1 = SSD, tier 2 = SmartSSD.
 *   Bandwidths and latencies from the tier probes (measured at open, EWMA-updated); capacities
 *   from kvdb_options (KV_POLICY_UNLIMITED for ssd_bytes = 0); options from kvdb_profile_get
 *   (entries with a NaN quality left out); frequencies kept decayed in the catalog.
 *
 *   Put of context x (it was stored by the put in some config; `current` says where; the others
 *   as they are):
 *     kv_policy_context *c = ...;           // every stored context + x, with `current` set
 *     size_t in = index_of_x;
 *     kv_policy_plan plan;
 *     kv_policy_err err;
 *     if (kv_policy_admit(&params, c, n, &in, 1, &plan, &err) != KVDB_OK) { log err.msg; }
 *     for (size_t k = 0; k < plan.n_moves; k++) {   // already in execution order
 *       const kv_policy_move *mv = &plan.moves[k];
 *       // to.tier NONE: delete the context; else re-encode to options[to.option].config if it
 *       // changed, move the persistent copy to to.tier if it changed, and fill or drop the
 *       // DRAM copy as to.cached says
 *     }
 *     kv_policy_plan_free(&plan);
 *
 *   Rebalance (background, or kvdb-admin rebalance [--dry-run]): the same array with every
 *   stored context, kv_policy_rebalance(&params, c, n, &plan, &err); print plan.moves (from,
 *   to, bytes_delta, utility_from -> utility_to) for --dry-run, else execute them in order,
 *   each in its own transaction. A plan is computed from the state passed in: if contexts
 *   changed meanwhile, compute it again rather than apply a stale one.
 *
 *   Option indices (current.option, to.option) index the context's own `options` array, which
 *   may be a subset of its profile (see the next paragraph). Frequencies may be in any unit as
 *   long as all contexts share it: utilities scale with them.
 *
 * OPTIONS THAT CANNOT BE REACHED. kvdb_recompress cannot give a lossy context back precision
 * or tokens it no longer has. Pass, for a stored context, only the options its current config
 * can be re-encoded to (and the current one). A new context (whose raw KV is in hand) may use
 * every option.
 *
 * ERRORS. Every function that can fail returns a kvdb_status: KVDB_OK, KVDB_INVALID (bad
 * input, named in err->msg), KVDB_NOMEM (allocation failed), KVDB_UNSUPPORTED (kv_policy_exact
 * only: the instance is too large), KVDB_PANIC (an internal check failed: a bug). On failure
 * every output is left empty (plans) or untouched (scalars), and `err` (optional, may be NULL)
 * holds a one-line message naming the context, option or tier at fault.
 *
 * THREADING. No shared state: concurrent calls are safe as long as they do not write the same
 * output or use the same workspace (kv_policy_ws). Inputs are only read during the call and
 * never retained.
 */
#ifndef KV_POLICY_H
#define KV_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "kvdb.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits. */
#define KV_POLICY_MAX_TIERS 4           /**< at most this many tiers */
#define KV_POLICY_MAX_OPTIONS 65535u    /**< at most this many options per context */
#define KV_POLICY_NONE (-1)             /**< placement tier / option: not stored */
#define KV_POLICY_UNLIMITED UINT64_MAX  /**< a tier capacity without a limit */

/** Tier flags. */
enum {
  /** An inclusive cache over the tiers below it (kvdb's DRAM tier): a context here also keeps
   * its persistent copy, in the same option, on a lower tier. Tier 0 only; needs a tier 1. */
  KV_POLICY_TIER_INCLUSIVE = 1u << 0,
  /** The tier holds decoded KV (kvdb's DRAM tier today caches decoded blocks): a context there
   * occupies the option's decoded_bytes (0 = the context's raw_bytes) and costs no decode. */
  KV_POLICY_TIER_DECODED = 1u << 1,
};

/** One tier, fastest first. */
typedef struct kv_policy_tier {
  const char *name;        /**< for messages ("dram"); NULL = "tier <index>" */
  uint64_t capacity_bytes; /**< > 0; KV_POLICY_UNLIMITED = no limit */
  double read_bps;         /**< read bandwidth, bytes per second, finite and > 0 */
  double latency_s;        /**< per-read latency, seconds, finite and >= 0 */
  uint32_t flags;          /**< KV_POLICY_TIER_* */
} kv_policy_tier;

/** One option of a context: a config of its quality profile (kvdb_profile_entry). */
typedef struct kv_policy_option {
  kvdb_config config;     /**< not interpreted, except config.method for the decode table */
  uint64_t bytes;         /**< the context's stored bytes in this config, > 0 */
  uint64_t decoded_bytes; /**< bytes on a KV_POLICY_TIER_DECODED tier; 0 = raw_bytes */
  double quality;         /**< in [0, 1]; NaN is refused (an unmeasured entry: leave it out) */
  double decode_bps;      /**< decode throughput, bytes of original KV per second; 0 = the
                               params' decode_bps[config.method]; finite and >= 0 */
} kv_policy_option;

/** Where a context is (or goes). */
typedef struct kv_policy_place {
  int32_t tier;    /**< the persistent copy's tier, or KV_POLICY_NONE (not stored) */
  int32_t option;  /**< index into the context's options; KV_POLICY_NONE when not stored */
  uint32_t cached; /**< 1 = also held by the inclusive tier 0 (same option) */
} kv_policy_place;

/** One context, as the caller describes it. */
typedef struct kv_policy_context {
  const kv_policy_option *options; /**< n_options entries, read during the call only */
  uint32_t n_options;              /**< 1..KV_POLICY_MAX_OPTIONS */
  uint64_t raw_bytes;              /**< uncompressed KV bytes (decode time, decoded size), > 0 */
  uint64_t n_tokens;               /**< tokens (prefill time when not stored), > 0 */
  double frequency;                /**< decayed access count, finite and >= 0 */
  kv_policy_place current;         /**< where it is now; {KV_POLICY_NONE, KV_POLICY_NONE, 0}
                                        for a context not stored yet */
} kv_policy_context;

/** The operation cost the greedy minimizes. */
typedef enum kv_policy_rule {
  KV_POLICY_LEAST_DROP = 0, /**< least utility drop (EvicPress Algorithm 1, Appendix A) */
  KV_POLICY_PER_BYTE = 1,   /**< least utility drop per byte freed (MCKP convex-hull greedy) */
  KV_POLICY_REFILL = 2,     /**< the default: the per-byte greedy, incoming contexts start on
                                 their best tier, then a refill pass and the best-single-item
                                 guard (see THE DEFAULT RULE) */
} kv_policy_rule;

/** Parameters of a placement. Fill with kv_policy_params_init(), then set the fields. */
typedef struct kv_policy_params {
  const kv_policy_tier *tiers; /**< n_tiers tiers, fastest first; read during the call only */
  uint32_t n_tiers;            /**< 1..KV_POLICY_MAX_TIERS */
  double alpha;                /**< quality weight (s per unit quality), finite, >= 0; default 1 */
  double prefill_tokens_per_s; /**< recompute throughput, > 0; default 10000 (Llama-3.1-8B on
                                    one H100, long prompts: an order of magnitude, set yours) */
  double recompute_quality;    /**< quality of a recomputed context, [0, 1]; default 1 (exact) */
  double decode_bps[4];        /**< per kvdb_method (RAW, LOSSLESS, QUANT, DROP): decode
                                    throughput in original bytes/s, 0 = free; default all 0 */
  kv_policy_rule rule;         /**< default KV_POLICY_REFILL */
} kv_policy_params;

/** What went wrong (filled on failure when the caller passes one). */
typedef struct kv_policy_err {
  kvdb_status status;
  char msg[192]; /**< one line, lowercase, no trailing period: "context 3 option 2: quality
                      nan is not in [0, 1]" */
} kv_policy_err;

/** One context whose placement a plan changes. */
typedef struct kv_policy_move {
  uint32_t context;                          /**< index into the caller's contexts */
  kv_policy_place from, to;                  /**< from = the context's `current` */
  int64_t bytes_delta[KV_POLICY_MAX_TIERS];  /**< bytes it adds (> 0) or frees (< 0) per tier */
  double utility_from, utility_to;           /**< U of `from` and of `to` (same frequency) */
} kv_policy_move;

/**
 * A placement plan. Filled by kv_policy_rebalance / kv_policy_admit; free the arrays with
 * kv_policy_plan_free(). All figures use the parameters and frequencies of the call.
 */
typedef struct kv_policy_plan {
  size_t n_contexts;
  kv_policy_place *place;  /**< [n_contexts]: every context's final placement */
  kv_policy_move *moves;   /**< [n_moves]: the contexts whose placement changes, in an order
                                that frees room before using it: contexts leaving the store
                                first, then by destination tier from the slowest up (uncached
                                before cached), then by context index */
  size_t n_moves;
  uint64_t used_before[KV_POLICY_MAX_TIERS]; /**< bytes per tier of the `current` placements */
  uint64_t used_after[KV_POLICY_MAX_TIERS];  /**< bytes per tier after the plan (<= capacity) */
  double utility_before, utility_after;      /**< sum of U over all contexts */
  uint64_t n_recompress;   /**< greedy operations applied: in-place recompressions */
  uint64_t n_evict;        /**< greedy operations applied: evictions (incl. leaving tier 0) */
} kv_policy_plan;

/** Evaluation of a set of placements (kv_policy_evaluate). Means are frequency-weighted. */
typedef struct kv_policy_eval {
  double utility;                      /**< sum of U */
  double mean_ttft_s;                  /**< sum f*TTFT / sum f (0 when every f is 0) */
  double mean_quality;                 /**< sum f*quality / sum f */
  uint64_t used[KV_POLICY_MAX_TIERS];  /**< bytes per tier */
  uint32_t over_capacity;              /**< bit t set: tier t holds more than its capacity */
  size_t served[KV_POLICY_MAX_TIERS + 1]; /**< contexts served from tier t; [n_tiers] = none */
} kv_policy_eval;

/* ------------------------------------------------------------------------------------------ */

/** @brief Defaults: no tiers (set them), alpha 1, prefill 10000 tokens/s, recompute quality 1,
 * free decoding, the KV_POLICY_REFILL rule. Cannot fail. */
void kv_policy_params_init(kv_policy_params *p);

/**
 * @brief Check parameters and contexts (what every other function checks first): tiers (1..4,
 * capacity > 0, bandwidth > 0, latency >= 0, the inclusive flag on tier 0 only and with a
 * tier below), alpha, prefill, recompute quality, decode table; each context's options (at
 * least one, bytes > 0, quality in [0, 1], decode_bps >= 0), raw bytes and tokens > 0,
 * frequency finite >= 0, and its `current` placement (a tier that exists and is not the
 * inclusive one, an option that exists, cached only with an inclusive tier 0).
 * @return KVDB_OK; KVDB_INVALID naming the first problem.
 */
kvdb_status kv_policy_check(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                            kv_policy_err *err);

/**
 * @brief Rebalance: place every context from scratch (EvicPress §4.4 on the whole set): each
 * takes its best option on the top tier, then Algorithm 1 resolves each over-full tier from
 * the top down. The `current` placements only give the plan's `from`.
 * @param[out] plan filled on KVDB_OK (free with kv_policy_plan_free); zeroed on failure.
 * @return KVDB_OK; KVDB_INVALID; KVDB_NOMEM; KVDB_PANIC.
 */
kvdb_status kv_policy_rebalance(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                                kv_policy_plan *plan, kv_policy_err *err);

/**
 * @brief Admit: place incoming contexts given everyone else's current placement (the put
 * path; Algorithm 1 as written). Contexts listed in `incoming` (distinct indices; their
 * `current` is ignored) take their best option on the top tier; every other context starts
 * where it is; then each over-full tier is resolved from the top down, over all contexts on it.
 * With n_incoming = 0 this only repairs over-full tiers (e.g. after a capacity shrank).
 * @param[out] plan as for kv_policy_rebalance.
 * @return KVDB_OK; KVDB_INVALID (also: an index >= n or listed twice); KVDB_NOMEM; KVDB_PANIC.
 */
kvdb_status kv_policy_admit(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                            const size_t *incoming, size_t n_incoming, kv_policy_plan *plan,
                            kv_policy_err *err);

/** @brief Free a plan's arrays and zero it. NULL or an already freed plan is a no-op. */
void kv_policy_plan_free(kv_policy_plan *plan);

/**
 * Scratch memory for kv_policy_rebalance_ws / kv_policy_admit_ws, kept between calls: ~48 bytes
 * per option and ~100 per context (plus the moves), grown as needed, never shrunk. Without one
 * every call allocates and frees it, and fresh pages cost the kernel's zeroing (~30 ms for
 * 100k contexts x 19 options here). One workspace serves one call at a time (one per thread);
 * it holds nothing of a call once the call returns.
 */
typedef struct kv_policy_ws kv_policy_ws;

/** @brief A new, empty workspace. @return it, or NULL when out of memory. Free it with
 * kv_policy_ws_free(). */
kv_policy_ws *kv_policy_ws_create(void);
/** @brief Free a workspace. NULL is a no-op. */
void kv_policy_ws_free(kv_policy_ws *ws);

/** @brief kv_policy_rebalance with a workspace (NULL: one of the call's own). Same results. */
kvdb_status kv_policy_rebalance_ws(kv_policy_ws *ws, const kv_policy_params *p,
                                   const kv_policy_context *ctx, size_t n, kv_policy_plan *plan,
                                   kv_policy_err *err);
/** @brief kv_policy_admit with a workspace (NULL: one of the call's own). Same results. */
kvdb_status kv_policy_admit_ws(kv_policy_ws *ws, const kv_policy_params *p,
                               const kv_policy_context *ctx, size_t n, const size_t *incoming,
                               size_t n_incoming, kv_policy_plan *plan, kv_policy_err *err);

/**
 * @brief The optimum: the placement of every context (same choices as the greedy: not stored,
 * any option on any persistent tier, cached or not) that maximizes total utility within every
 * capacity. Branch and bound (the default rule's search (g) without its budget and margin, the
 * prices refined as kv_policy_upper_bound's), exact on the instance as given (no rounding of
 * sizes), started from the greedy's solution (without (g)). For small instances: at most 32
 * contexts, and it stops after `max_nodes` search nodes (0 = 50 million).
 * @param[out] place [n] the optimal placements (ties: the first found in search order).
 * @param[out] utility their total utility.
 * @return KVDB_OK; KVDB_INVALID; KVDB_NOMEM; KVDB_UNSUPPORTED (more than 32 contexts, or the
 *   node budget ran out: nothing is written).
 */
kvdb_status kv_policy_exact(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                            uint64_t max_nodes, kv_policy_place *place, double *utility,
                            kv_policy_err *err);

/**
 * @brief An upper bound on the optimum's total utility, for instances of any size: the
 * Lagrangian dual of the capacities (which equals the LP relaxation of this multiple-choice
 * knapsack): UB(lambda) = sum_t lambda_t C_t + sum_i max_choice (U - sum_t lambda_t bytes_t).
 * Every lambda >= 0 gives a valid bound; the function lowers it by coordinate descent, each
 * step exactly solving one tier's LP (the convex-hull greedy with a fractional last item).
 * Tiers without a limit keep lambda = 0. With one limited tier the result is that tier's LP
 * relaxation exactly; with more it is a valid bound at least as high as the LP's.
 * @param[out] bound the bound (>= the optimum).
 * @param[out] lambda optional (NULL), [n_tiers]: the prices (utility per byte) used.
 * @return KVDB_OK; KVDB_INVALID; KVDB_NOMEM.
 */
kvdb_status kv_policy_upper_bound(const kv_policy_params *p, const kv_policy_context *ctx,
                                  size_t n, double *bound, double *lambda, kv_policy_err *err);

/**
 * @brief Utility, TTFT and usage of given placements (e.g. plan->place, or the `current`
 * placements when `place` is NULL).
 * @return KVDB_OK; KVDB_INVALID (bad input or a malformed placement). Over-full tiers are not
 *   an error: see out->over_capacity.
 */
kvdb_status kv_policy_evaluate(const kv_policy_params *p, const kv_policy_context *ctx, size_t n,
                               const kv_policy_place *place, kv_policy_eval *out,
                               kv_policy_err *err);

/** @brief U of one placement of one context (EvicPress §4.2; see THE MODEL). Checks p, c and
 * place (O(options)); NaN when any of them is invalid (kv_policy_check says why). */
double kv_policy_utility(const kv_policy_params *p, const kv_policy_context *c,
                         kv_policy_place place);
/** @brief TTFT in seconds of one placement (served from tier 0 when cached). As above. */
double kv_policy_ttft(const kv_policy_params *p, const kv_policy_context *c,
                      kv_policy_place place);

/**
 * @brief Decay an access count: f * 2^(-elapsed / half_life) (+ 1 when `access` is nonzero).
 * elapsed and half_life in the same unit; half_life <= 0 or not finite = no decay.
 * Cannot fail; a negative elapsed counts as 0.
 */
double kv_policy_decay(double f, double elapsed, double half_life, int access);

/* ---- storage configs: what a context's stored config can still become ----------------- */

/** @brief 1 when the config decodes to exactly what was put (RAW or LOSSLESS), else 0. */
int kv_policy_config_exact(const kvdb_config *c);
/** @brief 1 when two configs are the same (every field of kvdb_config), else 0. */
int kv_policy_config_equal(const kvdb_config *a, const kvdb_config *b);
/**
 * @brief 1 when KV stored with `have` still holds everything `want` needs, else 0: precision
 * cannot come back and dropped tokens stay dropped. An exact `have` reaches every config; a
 * DROP `have` only itself; a quantized `have` no exact config, a quantized one (QUANT, or DROP
 * with rows quantized) of at most its bits, and token dropping with exact rows (bits 0: the
 * kept rows are its quantized ones). kvdb_recompress and the placer apply this rule.
 */
int kv_policy_config_reachable(const kvdb_config *have, const kvdb_config *want);

/** @brief A placement for "not stored". */
static inline kv_policy_place kv_policy_place_none(void)
{
  kv_policy_place p = {KV_POLICY_NONE, KV_POLICY_NONE, 0};
  return p;
}

#ifdef __cplusplus
}
#endif
#endif /* KV_POLICY_H */
