/* SPDX-License-Identifier: MIT */
/*
 * tests/unit/test_io.c — the engine's I/O layer (engine/io/io.h) on its own, for both OS
 * backends (io_uring and plain pread/pwrite): batches whose requests are split into pieces,
 * waiting for the front of a batch only, request numbering across waits, a read past the end
 * of a file, and reserving space with alloc.
 */
#include "kvdb_test.h"

#include <errno.h>

#include "io/io.h"

#define MIB (1u << 20)
#define FILE_BYTES (20u * MIB)

static uint8_t pattern(uint64_t off)
{
  return (uint8_t)((off * 2654435761u) >> 13);
}

static int check(const uint8_t *buf, size_t len, uint64_t off)
{
  for (size_t i = 0; i < len; i++)
    if (buf[i] != pattern(off + i))
      return 0;
  return 1;
}

static void run(int use_uring)
{
  char *dir = t_tmpdir("io");
  char path[4200];
  snprintf(path, sizeof path, "%s/f", dir);
  kv_io *io = kv_io_os_create(use_uring);
  ASSERT(io != NULL);
  if (use_uring && !io->uring) {
    printf("test_io: io_uring is not available here (liburing missing or refused): skipped\n");
    kv_io_destroy(io);
    t_rmdir(dir);
    return;
  }
  kv_file *f;
  ASSERT_EQ(io->ops->open(io, path, KV_IO_CREATE | KV_IO_DIRECT, NULL, &f), 0);

  /* alloc reserves space: the size grows, the bytes read as zeros */
  ASSERT_EQ(io->ops->alloc(io, f, 0, FILE_BYTES), 0);
  uint64_t size = 0;
  ASSERT_EQ(io->ops->size(io, f, &size), 0);
  ASSERT_EQ(size, FILE_BYTES);

  uint8_t *src = NULL, *dst = NULL;
  ASSERT(posix_memalign((void **)&src, 4096, FILE_BYTES) == 0);
  ASSERT(posix_memalign((void **)&dst, 4096, FILE_BYTES) == 0);
  for (uint64_t i = 0; i < FILE_BYTES; i++)
    src[i] = pattern(i);

  /* writes in one batch, several of them longer than one piece */
  kv_batch *b = kv_batch_begin(io);
  ASSERT(b != NULL);
  ASSERT_EQ(kv_batch_write(io, b, f, src, 9 * MIB, 0), 0);
  ASSERT_EQ(kv_batch_write(io, b, f, src + 9 * MIB, 4096, 9 * MIB), 1);
  ASSERT_EQ(kv_batch_write(io, b, f, src + 9 * MIB + 4096, FILE_BYTES - 9 * MIB - 4096,
                           9 * MIB + 4096),
            2);
  ASSERT_EQ(kv_batch_wait(io, b), 0);
  ASSERT_EQ(io->ops->sync(io, f), 0);

  /* reads: numbering starts again after a full wait; the front can be waited for alone */
  memset(dst, 0, FILE_BYTES);
  ASSERT_EQ(kv_batch_read(io, b, f, dst, 9 * MIB, 0), 0);
  ASSERT_EQ(kv_batch_read(io, b, f, dst + 9 * MIB, 4096, 9 * MIB), 1);
  ASSERT_EQ(kv_batch_read(io, b, f, dst + 9 * MIB + 4096, 6 * MIB, 9 * MIB + 4096), 2);
  ASSERT_EQ(kv_batch_wait_first(io, b, 1), 0);
  ASSERT(check(dst, 9 * MIB, 0)); /* request 0 is complete */
  ASSERT_EQ(kv_batch_wait_first(io, b, 2), 0);
  ASSERT(check(dst + 9 * MIB, 4096, 9 * MIB));
  /* a later request queued while earlier ones may still be in flight */
  size_t tail = 9 * MIB + 4096 + 6 * MIB;
  ASSERT_EQ(kv_batch_read(io, b, f, dst + tail, FILE_BYTES - tail, tail), 3);
  ASSERT_EQ(kv_batch_wait_first(io, b, 4), 0);
  ASSERT(check(dst, FILE_BYTES, 0));
  ASSERT_EQ(kv_batch_wait(io, b), 0);

  /* a read past the end of the file is an error, reported by the wait */
  ASSERT_EQ(kv_batch_read(io, b, f, dst, MIB, FILE_BYTES), 0);
  ASSERT_EQ(kv_batch_wait(io, b), -EIO);
  /* and the batch is usable again afterwards */
  memset(dst, 0, MIB);
  ASSERT_EQ(kv_batch_read(io, b, f, dst, MIB, 4 * MIB), 0);
  ASSERT_EQ(kv_batch_wait(io, b), 0);
  ASSERT(check(dst, MIB, 4 * MIB));

  /* a later request's failure is not an earlier one's: waiting for the front reports 0, the
   * failed request's wait (and the full wait) its error */
  memset(dst, 0, 2 * MIB);
  ASSERT_EQ(kv_batch_read(io, b, f, dst, MIB, 0), 0);
  ASSERT_EQ(kv_batch_read(io, b, f, dst + MIB, MIB, FILE_BYTES), 1); /* past the end */
  ASSERT_EQ(kv_batch_read(io, b, f, dst + MIB, MIB, MIB), 2);
  ASSERT_EQ(kv_batch_wait_first(io, b, 1), 0);
  ASSERT(check(dst, MIB, 0));
  ASSERT_EQ(kv_batch_wait_first(io, b, 2), -EIO);
  ASSERT_EQ(kv_batch_wait_first(io, b, 3), -EIO);
  ASSERT_EQ(kv_batch_wait(io, b), -EIO);

  kv_batch_end(io, b);

  io->ops->close(io, f);
  kv_io_destroy(io);
  free(src);
  free(dst);
  t_rmdir(dir);
  printf("test_io: %s backend ok\n", use_uring ? "io_uring" : "synchronous");
}

int main(void)
{
  run(0);
  run(1);
  return 0;
}
