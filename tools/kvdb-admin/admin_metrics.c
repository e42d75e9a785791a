/* SPDX-License-Identifier: MIT */
/*
 * tools/kvdb-admin/admin_metrics.c — `kvdb-admin metrics` and `serve --metrics` (see
 * admin_metrics.h). Each scrape calls kvdb_metrics on the one handle (libmicrohttpd's own
 * thread; the handle is thread-safe); the buffer grows to what kvdb_metrics asks for.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_metrics.h"

/* The metrics text in a malloc'd buffer (*len bytes), or NULL with *st set. */
static char *metrics_text(kvdb *db, size_t *len, kvdb_status *st)
{
  size_t cap = 16384;
  for (int tries = 0; tries < 4; tries++) {
    char *buf = malloc(cap);
    if (buf == NULL) {
      *st = KVDB_NOMEM;
      return NULL;
    }
    *st = kvdb_metrics(db, buf, cap, len);
    if (*st == KVDB_OK)
      return buf;
    free(buf);
    if (*st != KVDB_FULL)
      return NULL;
    cap = *len + 4096;
  }
  return NULL;
}

kvdb_status admin_metrics_print(kvdb *db)
{
  size_t len;
  kvdb_status st;
  char *buf = metrics_text(db, &len, &st);
  if (buf == NULL)
    return st;
  fwrite(buf, 1, len, stdout);
  free(buf);
  return KVDB_OK;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
  (void)version;
  (void)upload_data;
  (void)upload_data_size;
  (void)con_cls;
  kvdb *db = cls;
  int code = MHD_HTTP_OK;
  char *body = NULL;
  size_t len = 0;
  const char *type = "text/plain; version=0.0.4; charset=utf-8";
  static const char not_found[] = "not found: kvdb-admin serves /metrics\n";
  static const char bad_method[] = "only GET and HEAD\n";
  struct MHD_Response *resp;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
    resp = MHD_create_response_from_buffer(sizeof bad_method - 1, (void *)bad_method,
                                           MHD_RESPMEM_PERSISTENT);
  } else if (strcmp(url, "/metrics") != 0) {
    code = MHD_HTTP_NOT_FOUND;
    resp = MHD_create_response_from_buffer(sizeof not_found - 1, (void *)not_found,
                                           MHD_RESPMEM_PERSISTENT);
  } else {
    kvdb_status st;
    body = metrics_text(db, &len, &st);
    if (body == NULL) {
      char msg[512];
      int n = snprintf(msg, sizeof msg, "kvdb_metrics: %s: %s\n", kvdb_status_name(st),
                       kvdb_errmsg());
      code = MHD_HTTP_INTERNAL_SERVER_ERROR;
      resp = MHD_create_response_from_buffer((size_t)n, msg, MHD_RESPMEM_MUST_COPY);
    } else {
      resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    }
  }
  if (resp == NULL) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(resp, "Content-Type", type);
  enum MHD_Result r = MHD_queue_response(conn, (unsigned)code, resp);
  MHD_destroy_response(resp);
  return r;
}

int admin_metrics_serve(kvdb *db, const char *addr, char *err, size_t cap)
{
  const char *colon = strrchr(addr, ':');
  char *end;
  long port = colon ? strtol(colon + 1, &end, 10) : -1;
  if (colon == NULL || colon[1] == 0 || *end != 0 || port < 1 || port > 65535) {
    snprintf(err, cap, "--metrics '%s' is not HOST:PORT or :PORT (port 1..65535)", addr);
    return -1;
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  char host[64];
  size_t hl = (size_t)(colon - addr);
  if (hl == 0) {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (hl >= sizeof host) {
    snprintf(err, cap, "--metrics '%s': the host is too long", addr);
    return -1;
  } else {
    memcpy(host, addr, hl);
    host[hl] = 0;
    if (strcmp(host, "localhost") == 0)
      snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
      snprintf(err, cap, "--metrics '%s': '%s' is not an IPv4 address", addr, host);
      return -1;
    }
  }
  /* SIGINT and SIGTERM are waited for, not delivered */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL,
                                          NULL, on_request, db, MHD_OPTION_SOCK_ADDR, &sa,
                                          MHD_OPTION_END);
  if (d == NULL) {
    snprintf(err, cap, "cannot serve on '%s' (port taken, or no such address)", addr);
    return -1;
  }
  fprintf(stderr, "kvdb-admin: serving metrics at http://%s/metrics (SIGINT or SIGTERM stops)\n",
          addr);
  int sig;
  sigwait(&set, &sig);
  MHD_stop_daemon(d);
  return 0;
}
