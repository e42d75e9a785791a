#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/admin/test_admin_recompress.sh — `kvdb-admin recompress` migrates a database written by
# an earlier build: a copy of the golden format-4 database (tests/golden/db/format4, lossless
# contexts as zstd-planes sections) gets its 2 lossless contexts rewritten as lossless frames
# (catalog format 5), verifies clean, and a second run rewrites them again (idempotent); the
# other contexts are left alone. The KV staying bit for bit is test frames-db's.
#
# usage: test_admin_recompress.sh KVDB_ADMIN GOLDEN_DB_DIR      (meson: `meson test admin-recompress`)
set -eu

ADMIN=$1
GOLDEN=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kvdb-admin-recompress-XXXXXX")
trap 'chmod -R u+w "$T" 2>/dev/null || true; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

. "$(dirname "$0")/admin_lib.sh"

DB=$T/db
mkdir -p "$DB"
cp -R "$GOLDEN/format4/." "$DB/" || fail "copy the golden database"
rm -f "$DB/MANIFEST"
expect 0 info --json "$DB"
pyjson 'd["format_version"] == 4 and d["contexts"] == 6'
expect 0 recompress "$DB"
has '^contexts +6 \(2 lossless, rewritten as lossless frames\)$'
expect 0 info --json "$DB"
pyjson 'd["format_version"] == 9 and d["contexts"] == 6'  # frames, packed (FORMAT.md §3f)
expect 0 verify "$DB"
expect 0 recompress --json "$DB"
pyjson 'd["command"] == "recompress" and d["contexts"] == 6 and d["contexts_rewritten"] == 2
  and d["bytes_after"] == d["bytes_before"]'
expect 0 verify "$DB"
# a database that is not there: an error naming it, nothing created
expect 1 recompress "$T/none"
echo "PASS: kvdb-admin recompress"
