#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/admin/test_admin_repair.sh — kvdb-admin verify on a damaged catalog, and
# verify --repair [--dry-run]: problems that name the context, block and field; a dry run that
# writes nothing; a repair that rebuilds a record from its block, rewrites a token count or
# drops contexts whose block is damaged, after which verify is clean.
#
# usage: test_admin_repair.sh KVDB_ADMIN ADMIN_FIXTURE CATALOG_EDIT  (meson: `meson test admin-repair`)
set -eu

ADMIN=$1
FIX=$2
EDIT=$3
T=$(mktemp -d "${TMPDIR:-/tmp}/kvdb-admin-repair-XXXXXX")
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

# fail, run, expect, pyjson, has, has_err, lines, snapshot, key_of
. "$(dirname "$0")/admin_lib.sh"

DB=$T/db
"$FIX" create "$DB" >"$T/keys" || fail "admin_fixture create"
LONG=$(key_of long)     # 48 tokens; its key is the hash of its last block
BRANCH=$(key_of branch) # shares long's first 2 blocks
OTHER=$(key_of other)   # 40 tokens
expect 0 verify "$DB"
expect 0 verify --repair "$DB" # nothing to repair
has '^result +ok$'

# ---- usage
expect 2 verify --dry-run "$DB"
has_err "'--dry-run' applies to rebalance only \(and to verify --repair\)"
expect 2 info --repair "$DB"
has_err "'--repair' applies to verify only"

# ---- token 5 of long's last block, in its catalog record (72 + 4 * 5): the old verify said ok
"$EDIT" "$DB" blocks "$LONG" 92 1 || fail "catalog_edit"
expect 3 verify "$DB"
has "^KVDB_CORRUPT: block $LONG of context $LONG: field tokens: token 5 is [0-9]+ in the record, [0-9]+ in the block$"
has '^problems +1$'

# a dry run: says what it would do, writes nothing
snapshot "$DB" >"$T/before"
expect 3 verify --repair --dry-run "$DB"
has "^repair: would rebuild the record of block $LONG of context $LONG from its object"
has '^blocks rebuilt +1 \(dry run: would be\)$'
has '^result +CORRUPTION FOUND \(dry run: nothing repaired\)$'
expect 3 --json verify --repair --dry-run "$DB"
pyjson 'd["ok"] is False and d["problem_count"] == 1 and d["repair"]["dry_run"] is True
  and d["repair"]["blocks_rebuilt"] == 1 and d["repair"]["contexts_dropped"] == 0
  and d["repair"]["actions"][0].startswith("would rebuild the record of block " + a[0])' "$LONG"
snapshot "$DB" >"$T/after"
cmp -s "$T/before" "$T/after" || fail "verify --repair --dry-run changed the database"

# the repair
expect 0 verify --repair "$DB"
has "^repair: rebuild the record of block $LONG of context $LONG from its object"
has '^problems after +0$'
has '^result +repaired$'
expect 0 verify "$DB"

# ---- other's token count (context record byte 8): rewritten from its blocks
"$EDIT" "$DB" contexts "$OTHER" 8 -3 || fail "catalog_edit"
expect 3 verify "$DB"
has "^KVDB_CORRUPT: context $OTHER: field n_tokens: the record says 37, its blocks hold 40$"
expect 0 --json verify --repair "$DB"
pyjson 'd["ok"] is True and d["repair"]["contexts_rebuilt"] == 1
  and d["repair"]["problems_after"] == 0 and d["repair"]["dry_run"] is False'
expect 0 show "$DB" "$OTHER"
has '^tokens +40$'

# ---- a damaged block object (long's first block, shared with branch): both are dropped
"$FIX" corrupt "$DB" >/dev/null || fail "admin_fixture corrupt"
expect 3 verify "$DB"
expect 0 verify --repair "$DB"
has "^repair: drop context $LONG: "
has "^repair: drop context $BRANCH: "
has '^contexts dropped +2$'
has '^result +repaired$'
expect 0 -q ls "$DB"
[ "$(lines)" -eq 2 ] || fail "ls after the repair: $(cat "$T/out")"
has "^$OTHER\$"
expect 0 compact "$DB" --threshold 1
expect 0 verify "$DB"

echo "PASS: kvdb-admin verify --repair"
