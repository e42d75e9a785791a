#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/admin/test_admin_place.sh — kvdb-admin's placement commands end to end (rebalance
# [--dry-run], stats, probe) on databases built by tests/admin/place_fixture.c: the plan
# printed per context (from -> to, bytes, utility change) in human and --json form, a dry run
# writing nothing, execution moving what the plan said, statistics, usage errors.
#
# usage: test_admin_place.sh KVDB_ADMIN PLACE_FIXTURE      (meson: `meson test admin-place`)
set -eu

ADMIN=$1
FIX=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kvdb-admin-place-XXXXXX")
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

# fail, run, expect, pyjson, has, has_err, lines
. "$(dirname "$0")/admin_lib.sh"

DB=$T/db
"$FIX" create "$DB" || fail "fixture create"
"$FIX" shrink "$DB" || fail "fixture shrink"

# a dry run prints the plan and writes nothing
before=$(cksum "$DB/catalog.mdb")
expect 0 rebalance "$DB" --dry-run
has '^[0-9a-f]{16}  (ssd|smartssd)/[a-z0-9:.+]+ +-> +((ssd|smartssd)/[a-z0-9:.+]+|\(deleted\)) +[0-9.]+ [KM]?i?B -> +[0-9.]+ [KM]?i?B +U [-+][0-9.e+-]+ \('
has '^contexts +8 placed, [1-9][0-9]* to move \(dry run: nothing moved\)$'
has '^ssd bytes +[0-9.]+ [KM]iB -> [0-9.]+ [KM]iB of 320\.0 KiB$'
has '^utility +'
[ "$(cksum "$DB/catalog.mdb")" = "$before" ] || fail "rebalance --dry-run changed the catalog"
moves=$(grep -Ec '^[0-9a-f]{16}  ' "$T/out")

expect 0 --json rebalance "$DB" --dry-run
pyjson 'd["command"] == "rebalance" and d["dry_run"] is True and d["contexts"] == 8 and len(d["moves"]) == '"$moves"' and all(set(m) >= {"key", "from", "to", "bytes_from", "bytes_to", "utility_from", "utility_to"} and len(m["key"]) == 32 for m in d["moves"]) and d["capacity"]["ssd"] == 327680 and d["bytes_after"]["ssd"] <= 327680 and d["bytes_after"]["smartssd"] <= 327680 and "done" not in d'

# execution
expect 0 rebalance "$DB"
has '^done +[0-9]+ relocated, [0-9]+ deleted, 0 skipped'
expect 0 --json stats "$DB"
pyjson 'd["command"] == "stats" and 0 < d["contexts"] <= 8 and sum(t["served_contexts"] for t in d["tiers"].values()) == d["contexts"] and sum(c["contexts"] for c in d["configs"]) == d["contexts"] and d["tiers"]["ssd"]["read_gbps"] > 0 and d["tiers"]["dram"]["blocks_read"] + d["tiers"]["ssd"]["blocks_read"] + d["tiers"]["smartssd"]["blocks_read"] > 0'
expect 0 stats "$DB"
has '^tier +contexts +utility +blocks read +hit rate'
has '^ssd +[0-9]+ '
has '^configs in use'
has '^  (ssd|smartssd) +[a-z0-9:.+]+ +[0-9]+  [0-9.]+ [KM]?i?B$'

expect 0 probe "$DB"
has '^ssd +[0-9.e+-]+ GB/s, [0-9.e+-]+ us$'
expect 0 --json probe "$DB"
pyjson 'd["tiers"]["ssd"]["read_gbps"] > 0 and d["tiers"]["ssd"]["probed_unix_ms"] > 0'

# usage and settings errors
expect 2 stats "$DB" --dry-run
has_err "option '--dry-run' applies to rebalance and verify --repair only"
PLAIN=$T/plain
"$FIX" plain "$PLAIN" || fail "fixture plain"
expect 1 rebalance "$PLAIN" --dry-run
has_err 'KVDB_INVALID: .*no placement settings'
expect 1 --json stats "$PLAIN"
pyjson 'd["error"]["status"] == "KVDB_INVALID"'
echo "test_admin_place: ok"
