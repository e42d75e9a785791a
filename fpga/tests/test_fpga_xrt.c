/* SPDX-License-Identifier: MIT */
/*
 * fpga/tests/test_fpga_xrt.c — the XRT backend's call sequence against a fake libxrt_coreutil
 * built from the real Debian headers (fakexrt.c; its path is argv[1]): open, xclbin, kernel,
 * P2P buffers in the keys argument's bank, query synced to the device, results synced back,
 * runs with 13 arguments, k > 64 selected on the device (blocks in sub-buffers, kv_select_kernel),
 * everything freed; HIE through XRT equals the CPU top k bit for bit
 * (the fake runs the real kernel on its device copies); the row gather's sequence (its kernel,
 * descriptors synced in, rows synced out, unverified); faults (no device, BO allocation, run
 * error, bad xclbin, wrong kernel) give clean errors and leak nothing; and without the XRT
 * environment the library is never called.
 */
#include "fpga_test.h"

#include <dlfcn.h>
#include <sys/stat.h>

typedef const char *(*log_fn)(void);
typedef void (*reset_fn)(void);
typedef void (*fail_fn)(const char *, int);
typedef int (*live_fn)(void);
static log_fn flog;
static reset_fn freset;
static fail_fn ffail;
static live_fn flive;

static int log_has(const char *s)
{
  return strstr(flog(), s) != NULL;
}

/* s1 appears, then later s2. */
static int log_order(const char *s1, const char *s2)
{
  const char *a = strstr(flog(), s1);
  return a != NULL && strstr(a + strlen(s1), s2) != NULL;
}

static char xclbin[4200];

static kv_fpga_status open_xrt(kv_fpga_dev **dev, kv_fpga_err *e, const char *kernel)
{
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  o.backend = KV_FPGA_XRT;
  o.xclbin_path = xclbin;
  if (kernel)
    o.kernel_name = kernel;
  return kv_fpga_open(&o, dev, e);
}

static void test_sequence_and_results(void)
{
  t_rng r = {8};
  t_ctx c;
  t_ctx_make(&c, &r, 4000, 128, 8, 1000);
  float q[2 * 128];
  for (int j = 0; j < 256; j++)
    q[j] = t_gauss(&r);
  kv_score_query *qq;
  kv_score_query_create(KV_SCORE_F32, q, 2, 128, 512, KV_SCORE_MAX, &qq, NULL);
  kv_score_span all[4], host[1];
  kv_hie_dev_span ds[3];
  for (uint32_t b = 0; b < 4; b++)
    all[b] = (kv_score_span){&c.views[b], 0, c.views[b].layout.n_tokens, b * 1000};
  host[0] = all[0];
  for (uint32_t b = 1; b < 4; b++)
    ds[b - 1] = (kv_hie_dev_span){c.file_off[b], c.views[b].layout, b * 1000};

  freset();
  int live0 = flive();
  kv_fpga_dev *dev;
  kv_fpga_err e;
  REQUIRE(open_xrt(&dev, &e, NULL) == KV_FPGA_OK, "open: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_dev_backend(dev) == KV_FPGA_XRT, "XRT backend");
  CHECK(log_order("xrtDeviceOpen(0)", "xrtDeviceLoadXclbinFile(") &&
            log_order("xrtDeviceLoadXclbinFile(", "xrtDeviceGetXclbinUUID") &&
            log_order("xrtDeviceGetXclbinUUID", "xrtPLKernelOpen(kv_score_kernel)"),
        "open sequence:\n%s", flog());
  const uint32_t ks[] = {10, 500};
  for (int i = 0; i < 2; i++) {
    uint32_t k = ks[i], rpos[500], pos[500], got = 0;
    float rsc[500], sc[500];
    REQUIRE(kv_score_topk(qq, all, 4, k, NULL, NULL, 0, rpos, rsc, &got, NULL) == KV_SCORE_OK,
            "cpu");
    kv_hie_job job = {0};
    job.q = qq;
    job.host = host;
    job.n_host = 1;
    job.fd = c.fd;
    job.dev = ds;
    job.n_dev = 3;
    job.chunk_tokens = 256;
    kv_score_opts_init(&job.host_opts);
    kv_hie_stats st;
    REQUIRE(kv_hie_topk(dev, &job, k, pos, sc, &got, &st, &e) == KV_FPGA_OK, "hie: %s",
            t_fpga_errtext(&e));
    int same = got == k;
    for (uint32_t j = 0; j < k && same; j++)
      same = pos[j] == rpos[j] && memcmp(&sc[j], &rsc[j], 4) == 0;
    CHECK(same, "k=%u: HIE through XRT equals the CPU top k", k);
    CHECK(st.dev_runs == 12, "3 sections of 1000 tokens in chunks of 256: %llu runs",
          (unsigned long long)st.dev_runs);
  }
  CHECK(log_has("xrtKernelArgGroupId(0)") && log_has("P2P, 1)"),
        "P2P buffer in the keys argument's bank");
  CHECK(log_order("xrtBOSync(TO_DEVICE, 8256, 0)", "xrtRunStart"), "query synced before a run");
  CHECK(log_order("xrtRunWait", "xrtBOSync(FROM_DEVICE"), "results synced back after a wait");
  CHECK(log_has("xrtRunSetArg(0, bo P2P)") && log_has("xrtRunSetArg(1, bo P2P)") &&
            log_has("xrtRunSetArg(12, 10)") && log_has("xrtRunSetArg(12, 0)"),
        "arguments: keys/meta P2P, k = 10 on chip, k = 500 through whole blocks");
  CHECK(log_has("xrtBOSubAlloc(") && log_order("xrtPLKernelOpen(kv_select_kernel)", "xrtRunStart select") &&
            log_order("xrtRunStart select", "xrtBOSync(FROM_DEVICE, 4000, 0)"),
        "k = 500: blocks at offsets (sub-buffers), one selection, 500 pairs synced back:\n%s",
        flog());
  CHECK(!log_has("MISUSE"), "no misuse:\n%s", strstr(flog(), "MISUSE"));
  /* the row gather: kv_gather_kernel of the same xclbin, descriptors synced to the device
   * before the run, only the rows synced back; no checksum unit (verified = 0), so a damaged
   * group is gathered as it is */
  freset();
  int verified = -1;
  CHECK(t_gather_run(dev, &r, 0, &verified, &e) == KV_FPGA_OK, "gather: %s", t_fpga_errtext(&e));
  CHECK(verified == 0, "XRT gathers unverified");
  CHECK(log_order("xrtPLKernelOpen(kv_gather_kernel)", "xrtBOSync(TO_DEVICE") &&
            log_order("xrtBOSync(TO_DEVICE", "xrtRunStart gather") &&
            log_order("xrtRunStart gather", "xrtRunWait") &&
            log_order("xrtRunWait", "xrtBOSync(FROM_DEVICE"),
        "gather sequence:\n%s", flog());
  CHECK(log_has("xrtRunSetArg(gather 0, bo P2P)") && log_has("xrtRunSetArg(gather 4, 256)"),
        "gather arguments:\n%s", flog());
  CHECK(!log_has("MISUSE"), "no misuse in the gather:\n%s", strstr(flog(), "MISUSE"));
  CHECK(t_gather_run(dev, &r, 1, &verified, &e) == KV_FPGA_OK && verified == 0,
        "a damaged group is not caught on XRT: %s", t_fpga_errtext(&e));
  kv_fpga_close(dev);
  CHECK(log_order("xrtKernelClose", "xrtDeviceClose"), "close sequence");
  CHECK(flive() == live0, "every XRT object freed (%d live)", flive() - live0);

  /* faults */
  freset();
  ffail("xrtDeviceOpen", 1);
  CHECK(open_xrt(&dev, &e, NULL) == KV_FPGA_ENODEV && strstr(t_fpga_errtext(&e), "no FPGA") != NULL,
        "no device: %s", t_fpga_errtext(&e));
  CHECK(flive() == live0, "no leak after a failed open");
  freset();
  CHECK(open_xrt(&dev, &e, "another_kernel") == KV_FPGA_EDEVICE &&
            strstr(t_fpga_errtext(&e), "xrtPLKernelOpen") != NULL,
        "wrong kernel: %s", t_fpga_errtext(&e));
  CHECK(flive() == live0, "no leak after a wrong kernel");
  freset();
  ffail("xrtDeviceLoadXclbinFile", 1);
  CHECK(open_xrt(&dev, &e, NULL) == KV_FPGA_EDEVICE &&
            strstr(t_fpga_errtext(&e), "xrtDeviceLoadXclbinFile") != NULL,
        "xclbin load failure: %s", t_fpga_errtext(&e));
  for (int which = 0; which < 3; which++) {
    static const char *fn[3] = {"xrtBOAlloc", "xrtRunWait", "xrtBOSync"};
    static const int nth[3] = {3, 2, 2};
    static const kv_fpga_status want[3] = {KV_FPGA_ENOMEM, KV_FPGA_EDEVICE, KV_FPGA_EDEVICE};
    freset();
    REQUIRE(open_xrt(&dev, &e, NULL) == KV_FPGA_OK, "open");
    ffail(fn[which], nth[which]);
    kv_hie_job job = {0};
    job.q = qq;
    job.fd = c.fd;
    job.dev = ds;
    job.n_dev = 3;
    job.chunk_tokens = 512;
    kv_score_opts_init(&job.host_opts);
    uint32_t pos[10];
    kv_fpga_status rc = kv_hie_topk(dev, &job, 10, pos, NULL, NULL, NULL, &e);
    CHECK(rc == want[which], "fault in %s: %s", fn[which], t_fpga_errtext(&e));
    kv_fpga_close(dev);
    CHECK(flive() == live0, "fault in %s: %d XRT objects leaked", fn[which], flive() - live0);
    CHECK(!log_has("MISUSE"), "fault in %s: misuse:\n%s", fn[which], flog());
  }
  CHECK(strstr(t_fpga_errtext(&e), "xrtBOSync") != NULL, "message names xrtBOSync: %s",
        t_fpga_errtext(&e));
  /* an xclbin without kv_gather_kernel */
  freset();
  REQUIRE(open_xrt(&dev, &e, NULL) == KV_FPGA_OK, "open");
  ffail("xrtPLKernelOpen", 1);
  verified = -1;
  CHECK(t_gather_run(dev, &r, 0, &verified, &e) == KV_FPGA_EUNSUPPORTED &&
            strstr(t_fpga_errtext(&e), "kv_gather_kernel") != NULL,
        "no gather kernel: %s", t_fpga_errtext(&e));
  kv_fpga_close(dev);
  CHECK(flive() == live0, "no leak after a missing gather kernel");
  /* buffers need the kernel's memory banks: open without an xclbin, allocate */
  freset();
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  o.backend = KV_FPGA_XRT;
  REQUIRE(kv_fpga_open(&o, &dev, &e) == KV_FPGA_OK, "open without xclbin");
  kv_fpga_buf *b;
  CHECK(kv_fpga_buf_alloc(dev, 4096, KV_FPGA_BUF_P2P, &b, &e) == KV_FPGA_EINVAL &&
            strstr(t_fpga_errtext(&e), "load the kernel") != NULL,
        "alloc before load: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_load_kernel(dev, NULL, NULL, &e) == KV_FPGA_EINVAL, "XRT load needs a path");
  CHECK(kv_fpga_load_kernel(dev, xclbin, NULL, &e) == KV_FPGA_OK, "load: %s", t_fpga_errtext(&e));
  CHECK(kv_fpga_buf_alloc(dev, 4096, KV_FPGA_BUF_P2P, &b, &e) == KV_FPGA_OK, "alloc after load");
  kv_fpga_buf_free(b);
  kv_fpga_close(dev);
  CHECK(flive() == live0, "no leak");
  kv_score_query_free(qq);
  t_ctx_free(&c);
}

static void test_no_env(const char *xrt_root)
{
  /* without XILINX_XRT the backend must not call XRT at all */
  freset();
  unsetenv("XILINX_XRT");
  kv_fpga_dev *dev;
  kv_fpga_err e;
  CHECK(open_xrt(&dev, &e, NULL) == KV_FPGA_ENODEV && strstr(t_fpga_errtext(&e), "XILINX_XRT"),
        "no XILINX_XRT: %s", t_fpga_errtext(&e));
  CHECK(flog()[0] == 0, "XRT was called without its environment:\n%s", flog());
  setenv("XCL_EMULATION_MODE", "hw_emu", 1);
  setenv("XILINX_XRT", xrt_root, 1);
  CHECK(open_xrt(&dev, &e, NULL) == KV_FPGA_ENODEV &&
            strstr(t_fpga_errtext(&e), "XCL_EMULATION_MODE"),
        "emulation mode refused: %s", t_fpga_errtext(&e));
  CHECK(flog()[0] == 0, "XRT was called in emulation mode");
  unsetenv("XCL_EMULATION_MODE");
}

/* `test_fpga_xrt --real DIR[:DIR...]`: the real libxrt (the first DIR holding
 * libxrt_coreutil.so.2) with an XRT tree whose lib is that DIR (HARDWARE.md §1: then
 * xrtDeviceOpen returns NULL instead of aborting). Without a device the backend must report
 * ENODEV; with one, the open must succeed. Skips when libxrt is absent. */
static int real_no_device(const char *dirs)
{
  char lib[4200], libdir[4096] = "";
  for (const char *p = dirs; *p;) {
    size_t n = strcspn(p, ":");
    snprintf(lib, sizeof lib, "%.*s/libxrt_coreutil.so.2", (int)n, p);
    if (access(lib, R_OK) == 0) {
      snprintf(libdir, sizeof libdir, "%.*s", (int)n, p);
      break;
    }
    p += n + (p[n] == ':');
  }
  if (libdir[0] == 0) {
    printf("skipped: libxrt_coreutil.so.2 not found in %s (libxrt1 not installed)\n", dirs);
    return T_EXIT_SKIP;
  }
  const char *base = getenv("TMPDIR");
  char root[4096], link[4200];
  snprintf(root, sizeof root, "%s/kvdb-xrtreal-XXXXXX", base && *base ? base : "/tmp");
  REQUIRE(mkdtemp(root) != NULL, "mkdtemp");
  snprintf(link, sizeof link, "%s/lib", root);
  REQUIRE(symlink(libdir, link) == 0, "symlink");
  setenv("XILINX_XRT", root, 1);
  unsetenv("KVDB_XRT_LIBRARY");
  unsetenv("XCL_EMULATION_MODE");
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  o.backend = KV_FPGA_XRT;
  kv_fpga_dev *dev = NULL;
  kv_fpga_err e;
  kv_fpga_status rc = kv_fpga_open(&o, &dev, &e);
  printf("real XRT open: %s\n", t_fpga_errtext(&e));
  if (rc == KV_FPGA_OK) {
    printf("an FPGA device is present\n");
    kv_fpga_close(dev);
  } else {
    CHECK(rc == KV_FPGA_ENODEV && strstr(t_fpga_errtext(&e), "no FPGA device") != NULL,
          "no device: %s", t_fpga_errtext(&e));
  }
  unlink(link);
  rmdir(root);
  return t_finish("test_fpga_xrt --real");
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "--real") == 0)
    return real_no_device(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: test_fpga_xrt PATH/libfakexrt.so | --real LIBDIR\n");
    return 2;
  }
  /* an XRT tree: $XILINX_XRT/lib/libxrt_core.so.2 must exist */
  const char *base = getenv("TMPDIR");
  char root[4096], lib[4200], core[4300];
  snprintf(root, sizeof root, "%s/kvdb-xrt-XXXXXX", base && *base ? base : "/tmp");
  REQUIRE(mkdtemp(root) != NULL, "mkdtemp");
  snprintf(lib, sizeof lib, "%s/lib", root);
  REQUIRE(mkdir(lib, 0755) == 0, "mkdir");
  snprintf(core, sizeof core, "%s/libxrt_core.so.2", lib);
  REQUIRE(symlink(argv[1], core) == 0, "symlink");
  snprintf(xclbin, sizeof xclbin, "%s/score.xclbin", root);
  FILE *f = fopen(xclbin, "w");
  REQUIRE(f != NULL && fputs("fake", f) >= 0 && fclose(f) == 0, "xclbin");
  setenv("XILINX_XRT", root, 1);
  setenv("KVDB_XRT_LIBRARY", argv[1], 1);
  unsetenv("XCL_EMULATION_MODE");

  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != NULL, "dlopen %s: %s", argv[1], dlerror());
  *(void **)(&flog) = dlsym(h, "fakexrt_log");
  *(void **)(&freset) = dlsym(h, "fakexrt_reset");
  *(void **)(&ffail) = dlsym(h, "fakexrt_fail");
  *(void **)(&flive) = dlsym(h, "fakexrt_live_objects");
  REQUIRE(flog && freset && ffail && flive, "fake hooks");

  test_sequence_and_results();
  test_no_env(root);

  unlink(xclbin);
  unlink(core);
  rmdir(lib);
  rmdir(root);
  return t_finish("test_fpga_xrt");
}
