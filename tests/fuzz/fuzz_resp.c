/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_resp.c — a Redis server's replies from untrusted bytes, read as the remote
 * tier reads a batch's replies (engine/remote/resp.c: header lines from the read-ahead buffer,
 * a bulk string's rest straight from the socket into its own allocation). The input is the
 * byte stream a server sends; it is written into one end of a socketpair (what fits in the
 * socket's buffer), that end shut, and replies are read from the other end until the reader
 * fails (a protocol error, or the end of the stream).
 *
 * Must never crash or read outside what it read. Properties (abort when broken):
 *   - every reply is one of the five types; a bulk string's bytes are exactly the input's
 *     bytes before the CRLF that ends it, its length at most max_bulk, NUL-terminated, its
 *     allocation 64-byte aligned; a status or error line is the input's line;
 *   - the reader never claims more bytes than were written, and stops (EOF is a failure).
 * Seeds: tests/fuzz/corpora/resp/ (fuzz_make_seeds: a batch of GETs' replies with 68 KiB
 * values, nil, errors, MOVED/ASK, +OK, integers, and cut or damaged forms of them).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "remote/resp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    abort();
  int big = 1 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  size_t sent = 0;
  while (sent < size) {
    ssize_t k = write(sv[0], data + sent, size - sent);
    if (k <= 0)
      break;
    sent += (size_t)k;
  }
  shutdown(sv[0], SHUT_WR);
  kv_resp_rd rd;
  kv_resp_init(&rd, sv[1]);
  rd.max_bulk = 1u << 20;
  static kv_resp rep;
  char err[160];
  for (int n = 0; n < 100000; n++) {
    size_t before = (size_t)rd.bytes_in - (rd.len - rd.pos);
    if (kv_resp_read(&rd, &rep, err, sizeof err) != 0) {
      if (rep.data != NULL || err[0] == 0)
        abort();
      break;
    }
    size_t after = (size_t)rd.bytes_in - (rd.len - rd.pos);
    if (rd.bytes_in > sent || after > sent || after <= before)
      abort();
    switch (rep.type) {
    case KV_RESP_BULK:
      if (rep.len > rd.max_bulk || after < rep.len + 2 + before ||
          memcmp(rep.data, data + after - 2 - rep.len, rep.len) != 0 || rep.data[rep.len] != 0 ||
          ((uintptr_t)rep.data & 63) != 0 || data[after - 2] != '\r' || data[after - 1] != '\n')
        abort();
      kv_resp_data_free(rep.data);
      break;
    case KV_RESP_STATUS:
    case KV_RESP_ERROR: {
      size_t ll = strlen(rep.line);
      if (after - before != ll + 3 || memcmp(rep.line, data + before + 1, ll) != 0 ||
          data[before] != (rep.type == KV_RESP_STATUS ? '+' : '-'))
        abort();
      break;
    }
    case KV_RESP_INT:
    case KV_RESP_NIL:
      if (data[before] != (rep.type == KV_RESP_INT ? ':' : '$'))
        abort();
      break;
    default:
      abort();
    }
    if (rep.type != KV_RESP_BULK && rep.data != NULL)
      abort();
  }
  kv_resp_free(&rd);
  close(sv[0]);
  close(sv[1]);
  return 0;
}
