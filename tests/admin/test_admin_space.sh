#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/admin/test_admin_space.sh — kvdb-admin says what compaction leaves and how to reclaim
# it (issue 13 E4): info lists the dead bytes per tier, the sealed segments by live fraction
# and what each threshold would reclaim; compact says what is left and the threshold that
# reclaims it, and that threshold does.
#
# usage: test_admin_space.sh KVDB_ADMIN SPACE_FIXTURE      (meson: `meson test admin-space`)
set -eu

ADMIN=$1
FIX=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kvdb-admin-space-XXXXXX")
trap 'rm -rf "$T"' EXIT
trap 'exit 1' INT TERM
. "$(dirname "$0")/admin_lib.sh"

DB=$T/db
"$FIX" sparse "$DB" || fail "space_fixture sparse"
MIB=1048576

# ---- info: 8 sealed segments 0/10/30/60/80/100/40/70 % live, one open
expect 0 info "$DB"
has '^COMPACTION'
has '^ssd +[0-9.]+ MiB +2 +2 +2 +2 +1 '
has '^at threshold 0.5 +rewrites 4 segments.*\(the default\)'
has '^to reclaim +half the dead bytes: --threshold 0\.[0-9]+; 90%: 0\.[0-9]+; all: 0\.(79|80)[0-9]'
expect 0 info "$DB" --json
pyjson 'd["compaction"]["tiers"]["ssd"]["sealed_live_under_25pct"] == 2 and d["compaction"]["tiers"]["ssd"]["sealed_live_75pct_up"] == 2'
pyjson '[x["segments"] for x in d["compaction"]["at_threshold"]] == [2, 4, 6, 7, 7]'
# at 0.5: segments 0, 10, 30, 40 % live go: 1 + 0.9 + 0.7 + 0.6 MiB of dead bytes
pyjson 'abs(d["compaction"]["at_threshold"][1]["bytes_reclaimed"] - 3.2 * int(a[0])) < 0.02 * int(a[0])' $MIB
pyjson '0.79 < d["compaction"]["threshold_for_all_the_dead_bytes"] <= 0.81'

# ---- compact at the default: what is left, and the threshold that reclaims it
expect 0 compact "$DB"
has '^segments rewritten +4$'
has '^dead bytes left +[0-9.]+ [KM]iB in 3 sealed segments \(each at least 50\.0% live\)'
has '^to reclaim them +--threshold 0\.(79|80)[0-9] reclaims'
thr=$(sed -n 's/^to reclaim them *--threshold \([0-9.]*\) .*/\1/p' "$T/out")
expect 0 compact "$DB" --json --threshold "$thr"
pyjson 'd["segments_rewritten"] == 3 and d["dead_bytes_left_sealed"] == 0'
pyjson 'd["threshold_for_all_the_dead_bytes"] == 0'
expect 0 verify "$DB"
echo "test_admin_space: ok"
