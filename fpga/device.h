/* SPDX-License-Identifier: MIT */
/*
 * fpga/device.h — the near-data scoring device (a SmartSSD's FPGA, or its emulation): the only
 * header of fpga/. It knows nothing of the engine; it scores score copies (score/score.h
 * "THE SCORE COPY") that lie in a file, without the keys crossing to the host.
 *
 * THE SEAM (one call sequence for every backend; Xilinx's p2p examples do the same)
 *     kv_fpga_open                  pick a backend, open the device
 *     kv_fpga_load_kernel           the .xclbin (XRT) holding kv_score_kernel
 *     kv_fpga_buf_alloc             device buffers: P2P (keys, read from the SSD straight into
 *                                   FPGA DDR) and host-visible ones (query in, score blocks out)
 *     kv_fpga_p2p_read              file range -> device buffer (pread on an O_DIRECT fd)
 *     kv_fpga_buf_write             host -> device (the packed query)
 *     kv_fpga_run_start/_wait       run the kernel on a chunk of a section
 *     kv_fpga_buf_read              device -> host (<pos, score> blocks, the chunk's top k)
 *     kv_fpga_select                the best k of many runs' score blocks (device memory)
 *     kv_fpga_gather                rows of page groups in a P2P buffer -> an output buffer
 *                                   (after checking the groups' checksums where the device
 *                                   can), then kv_fpga_buf_read of just those rows
 *     kv_fpga_close
 *
 * BACKENDS
 *   KV_FPGA_EMULATED  the default where no device exists: buffers are 4 KiB-aligned host memory,
 *                     p2p_read is the same pread of the same O_DIRECT fd into it, and a run calls
 *                     fpga/kernel/score_kernel.c — the very file v++ synthesizes — compiled by gcc.
 *   KV_FPGA_XRT       XRT's native C API (xrtDeviceOpen, xrtBOAlloc with XRT_BO_FLAGS_P2P,
 *                     xrtRunSetArg, ...), loaded at run time with dlopen, so that libkvdb has no
 *                     link-time dependency on libxrt (boost, protobuf, curl, libstdc++) and the
 *                     same binary works with Debian's XRT or AMD's /opt/xilinx/xrt. XRT is never
 *                     touched unless its environment is really present: XILINX_XRT must name a
 *                     directory whose lib/libxrt_core.so.2 exists (else XRT ABORTS the process on
 *                     the first device open: "XILINX_XRT not set"), and XCL_EMULATION_MODE must be
 *                     unset (sw_emu hangs without Vitis). Library: opts.xrt_library, else
 *                     $KVDB_XRT_LIBRARY, else $XILINX_XRT/lib/libxrt_coreutil.so.2, else
 *                     libxrt_coreutil.so.2. The library stays loaded until exit (XRT's static
 *                     destructors do not survive dlclose).
 *   KV_FPGA_AUTO      XRT when the environment is present, an xocl-bound PCI device exists
 *                     (/sys/bus/pci/drivers/xocl/<BDF>) and an xclbin path is given; otherwise
 *                     the emulated device.
 *
 * HIE (HillInfer §4.2, Algorithm 1 of seed 000): kv_hie_topk() scores device-resident tokens on
 * the device in chunks of n tokens while the calling thread (and its helpers) score the
 * host-resident ones; each chunk's on-chip top k (k <= 64) comes back as soon as the chunk is
 * done and is merged incrementally into the device-side top k; with a larger k the chunks'
 * score blocks stay in device memory and kv_fpga_select sends the device's top k once. The two
 * sides are merged at the end. Only positions and scores cross to the host.
 *
 * APP (HillInfer §4.3, Eq. 2-4): kv_app_split() gives the host/device split beta.
 *
 * ERRORS: every fallible call returns a kv_fpga_status and fills an optional kv_fpga_err naming
 * what was wrong (and the errno or XRT return value). THREADS: a device handle is used by one
 * thread at a time (kv_hie_topk uses it from its device thread only, for the call's duration).
 */
#ifndef KV_FPGA_DEVICE_H
#define KV_FPGA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "score.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Status of every fallible function of fpga/. Values are pinned. */
typedef enum kv_fpga_status {
  KV_FPGA_OK = 0,
  KV_FPGA_EINVAL = 1,      /**< bad argument (alignment, range, NULL, order of calls) */
  KV_FPGA_ENODEV = 2,      /**< no device, or the XRT environment is absent */
  KV_FPGA_EIO = 3,         /**< a read of the file failed; err->sys_errno */
  KV_FPGA_ENOMEM = 4,      /**< allocation failed (host or device) */
  KV_FPGA_EDEVICE = 5,     /**< the device or XRT reported an error; err->value has its code */
  KV_FPGA_EUNSUPPORTED = 6,/**< shape the kernel cannot take, or a backend not built in */
  KV_FPGA_ECORRUPT = 7,    /**< a group failed its checksum on the device; err->value: which */
} kv_fpga_status;

typedef struct kv_fpga_err {
  kv_fpga_status code;
  const char *what;
  uint64_t value;
  uint64_t limit;
  int sys_errno;
  const char *file;
  int line;
} kv_fpga_err;

const char *kv_fpga_status_name(kv_fpga_status rc);
/** One-line message into buf; returns the full length (snprintf rule). */
size_t kv_fpga_errmsg(const kv_fpga_err *err, char *buf, size_t cap);

typedef enum kv_fpga_backend {
  KV_FPGA_AUTO = 0,
  KV_FPGA_EMULATED = 1,
  KV_FPGA_XRT = 2,
} kv_fpga_backend;

typedef struct kv_fpga_opts {
  kv_fpga_backend backend;  /**< default AUTO */
  unsigned device_index;    /**< XRT device index (default 0) */
  const char *xclbin_path;  /**< XRT: the .xclbin to load at open (NULL: call load_kernel) */
  const char *kernel_name;  /**< default "kv_score_kernel" */
  const char *xrt_library;  /**< XRT: path of libxrt_coreutil.so.2 (NULL: see BACKENDS) */
} kv_fpga_opts;
void kv_fpga_opts_init(kv_fpga_opts *o);

typedef struct kv_fpga_dev kv_fpga_dev;
typedef struct kv_fpga_buf kv_fpga_buf;

/**
 * @brief Open a device. On KV_FPGA_OK *out is the handle (kv_fpga_close); else NULL.
 * @return KV_FPGA_OK, KV_FPGA_ENODEV (XRT asked for but its environment, library, symbols or
 * device are missing: the message says which), KV_FPGA_EDEVICE (xclbin or kernel failed to
 * load), KV_FPGA_EUNSUPPORTED (XRT backend not built), KV_FPGA_ENOMEM, KV_FPGA_EINVAL.
 */
kv_fpga_status kv_fpga_open(const kv_fpga_opts *opts, kv_fpga_dev **out, kv_fpga_err *err);
/** @brief Close a device (frees its buffers' device side). NULL is a no-op. */
void kv_fpga_close(kv_fpga_dev *dev);
kv_fpga_backend kv_fpga_dev_backend(const kv_fpga_dev *dev);
const char *kv_fpga_backend_name(kv_fpga_backend b);
/** 1 when XILINX_XRT names a usable XRT tree and XCL_EMULATION_MODE is unset (no XRT call is
 * made). why (if not NULL) receives a static reason when 0. */
int kv_fpga_xrt_env_ok(const char **why);

/** @brief Load the kernel: XRT loads the xclbin and opens the kernel; the emulated device only
 * records the names (its kernel is linked in). */
kv_fpga_status kv_fpga_load_kernel(kv_fpga_dev *dev, const char *xclbin_path,
                                   const char *kernel_name, kv_fpga_err *err);

#define KV_FPGA_BUF_P2P 1u /**< filled by kv_fpga_p2p_read (keys); the host never touches it */
#define KV_FPGA_BUF_IN 2u  /**< host -> device (query) */
#define KV_FPGA_BUF_OUT 4u /**< device -> host (score blocks, top k) */

/** @brief A device buffer of bytes (rounded up to 4 KiB). XRT needs the kernel loaded first. */
kv_fpga_status kv_fpga_buf_alloc(kv_fpga_dev *dev, size_t bytes, unsigned flags,
                                 kv_fpga_buf **out, kv_fpga_err *err);
void kv_fpga_buf_free(kv_fpga_buf *buf);
size_t kv_fpga_buf_size(const kv_fpga_buf *buf);

/**
 * @brief Read len bytes of fd at file_off into a P2P buffer at buf_off (SSD -> FPGA DDR on a
 * SmartSSD). fd should be opened with O_DIRECT; buf_off, file_off and len must be multiples of
 * 4096. A short file is KV_FPGA_EIO.
 */
kv_fpga_status kv_fpga_p2p_read(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t buf_off, int fd,
                                 uint64_t file_off, size_t len, kv_fpga_err *err);
kv_fpga_status kv_fpga_buf_write(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t off, const void *src,
                                 size_t len, kv_fpga_err *err);
kv_fpga_status kv_fpga_buf_read(kv_fpga_dev *dev, kv_fpga_buf *buf, size_t off, void *dst,
                                size_t len, kv_fpga_err *err);

/** Size of the packed query block (score_kernel.h "query"). */
#define KV_FPGA_QUERY_BYTES (64u * (1u + 8u * 16u))
/**
 * @brief Pack a query for the kernel into dst (KV_FPGA_QUERY_BYTES). The kernel holds at most
 * 8 vectors of at most 1024 elements.
 * @return KV_FPGA_OK, KV_FPGA_EUNSUPPORTED (too many vectors or elements), KV_FPGA_EINVAL.
 */
kv_fpga_status kv_fpga_query_pack(const kv_score_query *q, void *dst, size_t cap,
                                  kv_fpga_err *err);

/** One kernel run: tokens [t0, t0 + n) of the score copy at byte sect_off of buffer sect. */
typedef struct kv_fpga_run_args {
  kv_fpga_buf *sect;     /**< P2P buffer holding the section */
  uint64_t sect_off;     /**< byte offset of the section in it (a multiple of 64) */
  kv_score_layout layout;/**< the section's layout (the host knows it from its catalog) */
  uint32_t t0, n;        /**< chunk; t0 * row_bytes must be a multiple of 64 */
  uint32_t pos_base;     /**< token t gets position pos_base + t */
  uint32_t k;            /**< on-chip top k of the chunk (0 = none; <= KV_FPGA_MAX_TOPK) */
  kv_fpga_buf *query;    /**< packed query (kv_fpga_query_pack) */
  kv_fpga_buf *blocks;   /**< out: n <pos, score> pairs */
  kv_fpga_buf *topk;     /**< out: min(k, n) pairs (may be NULL when k = 0) */
  size_t blocks_off;     /**< byte offset of the pairs in blocks (a multiple of 64; XRT passes
                              a sub-buffer there, xrtBOSubAlloc), so that many runs' blocks can
                              stay side by side in device memory for kv_fpga_select */
} kv_fpga_run_args;

#define KV_FPGA_MAX_TOPK 64u
/** @brief Check a run's arguments against the kernel's limits and the buffers' sizes. */
kv_fpga_status kv_fpga_run_check(const kv_fpga_run_args *a, kv_fpga_err *err);

typedef struct kv_fpga_run kv_fpga_run;
/** @brief Start a run (XRT: asynchronous; emulated: runs the kernel now). */
kv_fpga_status kv_fpga_run_start(kv_fpga_dev *dev, const kv_fpga_run_args *a, kv_fpga_run **out,
                                 kv_fpga_err *err);
/** @brief Wait for a run and release it (also on error). */
kv_fpga_status kv_fpga_run_wait(kv_fpga_run *run, kv_fpga_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Gathering rows: the token-level step of dual-step loading (InstInfer §IV-C) on the device   */

/** One page group to verify before gathering: XXH3-64 with `seed` of its `len` bytes at
 * data_off must equal the little-endian u64 at sum_off (both byte offsets in the P2P buffer,
 * where the block's checksum table page was read by the same P2P pass). */
typedef struct kv_fpga_gcheck {
  uint64_t data_off;
  uint64_t sum_off;
  uint64_t seed;
  uint32_t len;
} kv_fpga_gcheck;

/** Bytes of one gathered row in the output buffer (rows start on 64-byte words). */
#define KV_FPGA_ROW_STRIDE(row_bytes) (((size_t)(row_bytes) + 63u) / 64u * 64u)

typedef struct kv_fpga_gather_args {
  kv_fpga_buf *src;        /**< P2P buffer holding the page groups */
  kv_fpga_buf *desc;       /**< IN buffer for the row offsets (>= 8 * n_rows bytes) */
  kv_fpga_buf *dst;        /**< OUT buffer: row i at i * KV_FPGA_ROW_STRIDE(row_bytes) */
  const uint64_t *row_off; /**< n_rows byte offsets in src (host memory; written to desc) */
  uint32_t n_rows;         /**< 1 .. 2^24 */
  uint32_t row_bytes;      /**< 1 .. 65536 */
  const kv_fpga_gcheck *checks; /**< groups to verify first (NULL when n_checks is 0) */
  uint32_t n_checks;
} kv_fpga_gather_args;

/**
 * @brief Gather rows of a P2P buffer into an output buffer on the device (kernel
 * kv_gather_kernel, fpga/kernel/gather_kernel.h); the host then reads n_rows *
 * KV_FPGA_ROW_STRIDE(row_bytes) bytes of dst with kv_fpga_buf_read. Synchronous.
 * Checksums: the emulated device verifies every check before gathering and sets *verified to 1;
 * the XRT backend's kernel has no XXH3 unit yet, so it gathers unchecked and sets *verified to 0
 * (a real device needs XXH3-64 over each group in the kernel, gather_kernel.c).
 * @return KV_FPGA_OK; KV_FPGA_ECORRUPT (err->value: the failing check's index, err->limit its
 * data_off); KV_FPGA_EINVAL (a row or check outside src, buffers too small or of the wrong kind);
 * KV_FPGA_EUNSUPPORTED (the loaded xclbin has no kv_gather_kernel); KV_FPGA_EDEVICE.
 */
kv_fpga_status kv_fpga_gather(kv_fpga_dev *dev, const kv_fpga_gather_args *a, int *verified,
                              kv_fpga_err *err);

/** The select kernel's arguments: the best k pairs of segments of score blocks in `in`. */
typedef struct kv_fpga_select_args {
  kv_fpga_buf *in;         /**< OUT buffer the runs wrote their blocks to */
  kv_fpga_buf *desc;       /**< IN buffer for the segments (>= 8 * n_segs bytes) */
  kv_fpga_buf *out;        /**< OUT buffer for the k pairs (>= 8 k bytes) */
  const uint32_t *segs;    /**< n_segs (first pair index, pair count) in `in` (host memory) */
  uint32_t n_segs;         /**< 1 .. 2^24 */
  uint32_t k;              /**< 1 .. the pairs of all segments */
} kv_fpga_select_args;

/**
 * @brief The best k pairs (score.h ORDER) of score blocks kept in device memory, selected on the
 * device (kernel kv_select_kernel, fpga/kernel/select_kernel.h: an exact radix select), written
 * to a->out in segment order (not sorted); the host reads 8 k bytes of it. The pairs' positions
 * must be distinct. Synchronous.
 * @return KV_FPGA_OK; KV_FPGA_EINVAL (a segment outside `in`, k 0 or above the pairs, buffers
 * too small or of the wrong kind); KV_FPGA_EUNSUPPORTED (the xclbin has no kv_select_kernel);
 * KV_FPGA_EDEVICE.
 */
kv_fpga_status kv_fpga_select(kv_fpga_dev *dev, const kv_fpga_select_args *a, kv_fpga_err *err);

/* ------------------------------------------------------------------------------------------ */
/* HIE: hierarchical importance evaluation (HillInfer §4.2)                                    */

/** A device-resident score copy: a whole section in the file, 4 KiB aligned. */
typedef struct kv_hie_dev_span {
  uint64_t file_off;
  kv_score_layout layout;
  uint32_t pos_base; /**< token t at position pos_base + t */
} kv_hie_dev_span;

typedef struct kv_hie_job {
  const kv_score_query *q;
  const kv_score_span *host; /**< host-resident tokens (the CPU scores them) */
  size_t n_host;
  int fd;                    /**< file holding the device-resident sections (O_DIRECT) */
  const kv_hie_dev_span *dev;
  size_t n_dev;
  uint32_t chunk_tokens;     /**< n, tokens per kernel run and score block (multiple of 64;
                                  0 = 16384) */
  kv_score_opts host_opts;   /**< kernel path and threads for the host part */
} kv_hie_job;

/** Device tokens of one job up to which k > 64 is selected on the device (8 bytes of device
 * memory per token). */
#define KV_HIE_SELECT_MAX_TOKENS (1u << 24)

typedef struct kv_hie_stats {
  uint64_t host_tokens, dev_tokens;
  uint64_t host_bytes, dev_bytes;      /**< code bytes scored on each side */
  uint64_t p2p_bytes;                  /**< file bytes read into device memory */
  uint64_t to_host_bytes;              /**< score blocks / top-k lists that crossed to the host */
  uint64_t dev_runs;                   /**< scoring kernel runs */
  uint64_t dev_selects;                /**< selection runs (kv_fpga_select: k > 64) */
  uint64_t host_ns, dev_ns, total_ns;  /**< host scoring; device thread; the whole call */
} kv_hie_stats;

/**
 * @brief Global top k of host and device tokens (score.h ORDER), equal to kv_score_topk over all
 * of them. Chunks whose top k fits on chip
 * (k <= KV_FPGA_MAX_TOPK) return only that list; with a larger k every chunk's score block stays
 * in device memory (side by side, blocks_off) and one kv_fpga_select returns the device's top
 * min(k, device tokens), so 8 bytes per selected token cross instead of 8 per token (beyond
 * KV_HIE_SELECT_MAX_TOKENS device tokens the whole blocks return and are merged as they come).
 * dev may be NULL when n_dev = 0. The device part runs on its own thread while the calling
 * thread scores the host part (on the calling thread when there is no host part); the section
 * reads are done by the device's reader pool (kv_hie_topk_batch).
 * @return KV_FPGA_OK or the first error of either side (k = 0 or k > all tokens: EINVAL).
 */
kv_fpga_status kv_hie_topk(kv_fpga_dev *dev, const kv_hie_job *job, uint32_t k, uint32_t *out_pos,
                           float *out_scores, uint32_t *n_out, kv_hie_stats *stats,
                           kv_fpga_err *err);

/** One job's k, outputs and figures in kv_hie_topk_batch(). */
typedef struct kv_hie_result {
  uint32_t k;          /**< in: the job's k */
  uint32_t *pos;       /**< in: room for k positions (or NULL when scores is not) */
  float *scores;       /**< in: room for k scores (or NULL when pos is not) */
  uint32_t n;          /**< out: entries written */
  kv_hie_stats stats;  /**< out: the job's figures (total_ns: the whole call's) */
} kv_hie_result;

/**
 * @brief kv_hie_topk() of several jobs in one call: each job's result equals kv_hie_topk of it
 * alone. The device runs the jobs one after another and the section reads of all of them form
 * one queue, so that the next job's sections are read while this one is scored (a decode step's
 * per-head jobs of a layer); the host parts are scored on the calling thread meanwhile (with no
 * host part the device part runs on the calling thread). The reader threads are the device's
 * (started at its first job, joined by kv_fpga_close). One call at a time per device.
 * @return KV_FPGA_OK or the first error (then no result is valid).
 */
kv_fpga_status kv_hie_topk_batch(kv_fpga_dev *dev, const kv_hie_job *jobs, size_t n_jobs,
                                 kv_hie_result *res, kv_fpga_err *err);

/* ------------------------------------------------------------------------------------------ */
/* APP: the CPU/SmartSSD split (HillInfer §4.3, Eq. 2-4)                                      */

/** Profiled rates, bytes per second (HillInfer's f_c, f_s, B_c, B_s). */
typedef struct kv_app_profile {
  double f_c; /**< CPU scoring throughput over its pool */
  double f_s; /**< SmartSSD scoring throughput over its pool */
  double B_c; /**< transfer bandwidth of the selected KV from the CPU pool */
  double B_s; /**< transfer bandwidth of the selected KV from the SmartSSD */
} kv_app_profile;

typedef struct kv_app_split {
  double beta;  /**< M_c / M_s */
  double M_c;   /**< bytes for the CPU (hot) pool */
  double M_s;   /**< bytes for the SmartSSD (cold) pool */
  double T_cpu; /**< Eq. 2 left side, seconds */
  double T_ssd; /**< Eq. 2 right side */
  int capped;   /**< 1 when Eq. 3 (M_c <= M_0) bound beta */
} kv_app_split;

/** Eq. 4: beta = B_c f_c (B_s + alpha f_s) / (B_s f_s (B_c + alpha f_c)), unconstrained. */
double kv_app_beta(const kv_app_profile *p, double alpha);

/**
 * @brief Split M bytes of KV between the pools so that T_CPU = T_SmartSSD (Eq. 2) subject to
 * M_c <= M_0 (Eq. 3). alpha_c and alpha_s are the fractions of each pool that get selected
 * (both = alpha gives Eq. 4 exactly; different values are §4.3's "empirical skewness
 * correction": the hot pool holds more of the selected tokens than alpha).
 * @return KV_FPGA_OK or KV_FPGA_EINVAL (a rate <= 0 or not finite, alpha outside [0, 1], M < 0,
 * M_0 < 0).
 */
kv_fpga_status kv_app_split_compute(const kv_app_profile *p, double alpha_c, double alpha_s,
                                    double M, double M0, kv_app_split *out, kv_fpga_err *err);

/**
 * @brief Update f_c and f_s from the measured work of a kv_hie_topk call (exponential moving
 * average with weight w in (0, 1]; a side with no work keeps its value).
 */
void kv_app_profile_update(kv_app_profile *p, const kv_hie_stats *s, double w);

#ifdef __cplusplus
}
#endif

#endif
