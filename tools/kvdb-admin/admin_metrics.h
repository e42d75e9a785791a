/* SPDX-License-Identifier: MIT */
/*
 * tools/kvdb-admin/admin_metrics.h — `kvdb-admin metrics` and `kvdb-admin serve --metrics`:
 * kvdb_metrics' Prometheus text once on stdout, or served at /metrics over HTTP
 * (libmicrohttpd) until SIGINT or SIGTERM.
 */
#ifndef KVDB_ADMIN_METRICS_H
#define KVDB_ADMIN_METRICS_H

#include "kvdb.h"

/* Print the metrics of db on stdout: KVDB_OK or kvdb_metrics' status. */
kvdb_status admin_metrics_print(kvdb *db);
/* Serve them at http://ADDR/metrics (ADDR "host:port", host an IPv4 address, or ":port" for
 * every interface) until SIGINT or SIGTERM; 0, or -1 with a message in err (a bad ADDR, the
 * port taken). */
int admin_metrics_serve(kvdb *db, const char *addr, char *err, size_t cap);

#endif
