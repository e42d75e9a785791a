#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/admin/test_admin.sh — kvdb-admin end to end, on databases built (and damaged) by
# tests/admin/admin_fixture.c: every subcommand in human and --json form, the exit statuses
# (0 ok, 1 error, 2 usage, 3 corruption found), read-only commands writing nothing, the
# progress bar only on a terminal, and compaction after deletions.
#
# usage: test_admin.sh KVDB_ADMIN ADMIN_FIXTURE      (meson: `meson test admin`)
set -eu

ADMIN=$1
FIX=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/kvdb-admin-test-XXXXXX")
trap 'chmod -R u+w "$T" 2>/dev/null || true; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

# fail, run, expect, pyjson, has, has_err, lines, snapshot, key_of
. "$(dirname "$0")/admin_lib.sh"

# ---- a database: long (3 blocks), branch (shares 2), other (2 + partial), block (explicit)
DB=$T/db
"$FIX" create "$DB" >"$T/keys" || fail "admin_fixture create"
[ "$(wc -l <"$T/keys" | tr -d ' ')" -eq 4 ] || fail "fixture printed: $(cat "$T/keys")"
LONG=$(key_of long)
BRANCH=$(key_of branch)
OTHER=$(key_of other)
BLOCK=$(key_of block)
snapshot "$DB" >"$T/before"

# ---- info
expect 0 info "$DB"
has '^format version +4$'
has '^contexts +4$'
has '^blocks +8$'
has '^models +1$'
has '^ssd +unlimited +[0-9.]+ [KMG]iB +8 +4$'
expect 0 info --json "$DB"
pyjson 'd["command"] == "info" and d["contexts"] == 4 and d["models"] == 1 and d["blocks"] == 8
  and d["format_version"] == 4 and d["segments"] >= 1 and d["live_bytes"] > 0
  and d["segment_file_bytes"] >= d["live_bytes"] and 0 <= d["dead_fraction"] <= 1
  and d["tiers"]["ssd"]["contexts"] == 4 and d["tiers"]["ssd"]["blocks"] == 8
  and isinstance(d["direct_io"], bool) and isinstance(d["io_uring"], bool)'

# ---- ls
expect 0 ls "$DB"
[ "$(lines)" -eq 5 ] || fail "ls printed $(lines) lines, expected a header and 4 rows"
has '^KEY +MODEL +TOKENS +BLOCKS +SIZE +TIER +CREATED +LAST ACCESS +EXPLICIT +CONFIG$'
for k in "$LONG" "$BRANCH" "$OTHER" "$BLOCK"; do
  has "^$k +test/tiny-llama "
done
# columns: key model tokens blocks size(2 words) tier created last-access explicit config
awk -v k="$LONG" '$1 == k && $3 == 48 && $4 == 3 && $7 == "ssd" && $10 == "no" && $11 == "raw" { f = 1 }
  END { exit !f }' "$T/out" || fail "ls row of long is wrong"
awk -v k="$BLOCK" '$1 == k && $3 == 16 && $4 == 1 && $10 == "yes" { f = 1 }
  END { exit !f }' "$T/out" || fail "ls row of the explicit-key block is wrong"
has ' [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z +[0-9]{4}-[0-9]{2}-[0-9]{2}T'
expect 0 ls --json "$DB"
pyjson 'd["count"] == 4 and sorted(c["key"] for c in d["contexts"]) == sorted(a)
  and [c["explicit_key"] for c in d["contexts"]].count(True) == 1
  and all(c["model"] == "test/tiny-llama" and c["tier"] == "ssd" and c["created"].endswith("Z")
          for c in d["contexts"])' "$LONG" "$BRANCH" "$OTHER" "$BLOCK"
pyjson '[(c["tokens"], c["blocks"]) for c in d["contexts"] if c["key"] == a[0]] == [(40, 3)]' "$OTHER"
expect 0 -q ls "$DB"
printf '%s\n' "$LONG" "$BRANCH" "$OTHER" "$BLOCK" | sort >"$T/keys.sorted"
cmp -s "$T/out" "$T/keys.sorted" || fail "ls -q does not print exactly the keys in key order"

# ---- show: a full key, an 8-digit prefix (any case), errors
expect 0 show "$DB" "$LONG"
has "^key +$LONG$"
has '^model +test/tiny-llama$'
has '^tokens +48$'
has '^blocks +3$'
has '^explicit key +no$'
cp "$T/out" "$T/show.full"
P8=$(printf '%s' "$LONG" | cut -c1-8)
expect 0 show "$DB" "$P8"
cmp -s "$T/out" "$T/show.full" || fail "show with prefix $P8 differs from show with the key"
expect 0 show "$DB" "$(printf '%s' "$P8" | tr a-f A-F)"
cmp -s "$T/out" "$T/show.full" || fail "show with an upper-case prefix differs"
expect 0 show --json "$DB" "$P8"
pyjson 'd["context"]["key"] == a[0] and d["context"]["tokens"] == 48 and d["context"]["blocks"] == 3
  and d["context"]["explicit_key"] is False' "$LONG"
expect 0 show "$DB" "$BLOCK"
has '^explicit key +yes'
expect 2 show "$DB" "$(printf '%s' "$LONG" | cut -c1-7)"
has_err 'prefix of at least 8'
expect 2 show "$DB" zzzzzzzz
NOPE=
for p in 00000000 ffffffff 12345678 9abcdef0 13572468; do
  if ! grep -q "^$p" "$T/keys.sorted"; then NOPE=$p; break; fi
done
[ -n "$NOPE" ] || fail "no unused key prefix found"
expect 1 show "$DB" "$NOPE"
has_err "^kvdb-admin: KVDB_NOTFOUND: .*'$NOPE'"
expect 1 show "$DB" "${NOPE}${NOPE}${NOPE}${NOPE}"
has_err '^kvdb-admin: KVDB_NOTFOUND: '
expect 1 show --json "$DB" "$NOPE"
pyjson 'd["command"] == "show" and d["error"]["status"] == "KVDB_NOTFOUND"'

# ---- a compressed context with its quality profile: ls shows the config, show the profile
DB4=$T/db4
"$FIX" profiled "$DB4" >"$T/prof" || fail "admin_fixture profiled"
PK=$(cut -d' ' -f2 "$T/prof")
expect 0 ls "$DB4"
has "^$PK .* int4$"
expect 0 show "$DB4" "$PK"
has '^config +int4$'
has '^profile +5 configs'
has '^\* int4 +[0-9]+ +[0-9.]+x +0\.9[0-9]+ +[0-9.]+ +0\.7500 \(1\)$'
has '^  raw +[0-9]+ +1\.00x +1\.00000 '
has '^  knorm50 +~[0-9]+ '
expect 0 show --json "$DB4" "$PK"
pyjson 'd["context"]["config"] == "int4" and d["context"]["has_profile"] and len(d["profile"]) == 5'
pyjson '[e for e in d["profile"] if e["stored"]][0]["config"] == "int4"'
pyjson '[e for e in d["profile"] if e["config"] == "int4"][0]["reported_quality"] == 0.75'
pyjson '[e for e in d["profile"] if e["config"] == "lossless"][0]["quality"] == 1'
pyjson 'all(e["reported_quality"] is None for e in d["profile"] if e["config"] != "int4")'
expect 0 info --json "$DB4"
pyjson 'd["format_version"] == 4'
expect 0 verify "$DB4"

# ---- score bits: contexts whose models keep int8 / int4 score copies (and the plain ones)
expect 0 show "$DB" "$LONG"
has '^score bits +0 \(no score copies\)$'
expect 0 info "$DB"
has '^score copies +0 contexts int8 \(score_bits 8\), 0 int4, 4 none$'
DB5=$T/db5
"$FIX" scored "$DB5" >"$T/scored" || fail "admin_fixture scored"
S8=$(awk '$1 == "s8" { print $2 }' "$T/scored")
S4=$(awk '$1 == "s4" { print $2 }' "$T/scored")
[ -n "$S8" ] && [ -n "$S4" ] || fail "fixture scored printed: $(cat "$T/scored")"
expect 0 show "$DB5" "$S8"
has '^model +test/tiny-llama-s8$'
has '^score bits +8 \(int8 key copies for kvdb_score\)$'
has '^score copies +version 2 \(centered, Hadamard-rotated\)$'
expect 0 show "$DB5" "$S4"
has '^score bits +4 \(int4 key copies for kvdb_score\)$'
expect 0 show --json "$DB5" "$S8"
pyjson 'd["context"]["score_bits"] == 8 and d["context"]["model"] == "test/tiny-llama-s8"'
pyjson 'd["context"]["score_versions"] == 2'
expect 0 ls --json "$DB5"
pyjson 'sorted(c["score_bits"] for c in d["contexts"]) == [4, 8]'
expect 0 info "$DB5"
has '^score copies +1 contexts int8 \(score_bits 8\), 1 int4, 0 none$'
expect 0 info --json "$DB5"
pyjson 'd["score_bits_contexts"] == {"0": 0, "4": 1, "8": 1} and d["models"] == 2'
expect 0 info --json "$DB"
pyjson 'd["score_bits_contexts"] == {"0": 4, "4": 0, "8": 0}'
expect 0 verify "$DB5"

# ---- show with an ambiguous prefix: two contexts whose keys share 8 hex digits
DB3=$T/db3
"$FIX" twins "$DB3" >"$T/twins" || fail "admin_fixture twins"
TW1=$(sed -n 1p "$T/twins")
TW2=$(sed -n 2p "$T/twins")
P=$(printf '%s' "$TW1" | cut -c1-8)
[ -n "$TW2" ] && [ "$(printf '%s' "$TW2" | cut -c1-8)" = "$P" ] || fail "twins: $(cat "$T/twins")"
expect 1 show "$DB3" "$P"
has_err "^kvdb-admin: KVDB_INVALID: key prefix '$P' is ambiguous: 2 contexts match"
has_err "$TW1"
has_err "$TW2"
n=9 # the shortest prefix that tells them apart
while [ "$(printf '%s' "$TW1" | cut -c1-$n)" = "$(printf '%s' "$TW2" | cut -c1-$n)" ]; do
  n=$((n + 1))
done
expect 0 show "$DB3" "$(printf '%s' "$TW2" | cut -c1-$n)"
has "^key +$TW2$"
expect 0 show "$DB3" "$(printf '%s' "$TW1" | cut -c1-$n)"
has "^key +$TW1$"

# ---- verify on a good database
expect 0 verify "$DB"
has '^blocks checked +8$'
has '^contexts checked +4$'
has '^problems +0$'
has '^result +ok$'
if grep -q 'blocks/s' "$T/err"; then fail "a progress bar was drawn on a non-terminal"; fi
expect 0 verify --json "$DB"
pyjson 'd["ok"] is True and d["problems"] == [] and d["problem_count"] == 0
  and d["blocks_checked"] == 8 and d["contexts_checked"] == 4 and d["bytes_checked"] > 0
  and d["segments_checked"] >= 1'

# ---- info, ls, show and verify wrote nothing
snapshot "$DB" >"$T/after"
cmp -s "$T/before" "$T/after" || { diff "$T/before" "$T/after" >&2 || true; fail "a read-only command changed the database"; }

# ---- the progress bar, on a terminal made by script(1) when it is available
if script -qec true /dev/null >/dev/null 2>&1; then
  script -qec "'$ADMIN' verify '$DB'" /dev/null >"$T/tty" 2>&1 || fail "verify on a terminal"
  grep -q 'verify \[#*\] 8/8 blocks 100.0%' "$T/tty" || { cat "$T/tty" >&2; fail "no progress bar on a terminal"; }
  grep -q 'blocks/s' "$T/tty" || fail "the progress bar has no rate"
  script -qec "'$ADMIN' -q verify '$DB'" /dev/null >"$T/tty" 2>&1 || fail "verify -q on a terminal"
  if grep -q 'blocks/s' "$T/tty"; then fail "-q still drew a progress bar"; fi
else
  echo "note: script(1) unavailable, progress bar on a terminal not checked" >&2
fi

# ---- usage errors: exit 2, usage text on stderr, nothing on stdout
cd "$T" # relative "db": the argument lists below are split on spaces
for args in "" "frobnicate db" "info" "info db extra" "show db" "info --bogus db" \
            "compact db --threshold abc" "compact db --threshold 1.5" "compact db --threshold" \
            "ls --threshold 0.5 db"; do
  # shellcheck disable=SC2086 # word splitting of $args is intended
  expect 2 $args
  has_err '^usage: kvdb-admin'
  [ ! -s "$T/out" ] || fail "usage error of '$args' printed on stdout"
done
expect 2 frobnicate "$DB"
has_err "unknown command 'frobnicate'"

# ---- help and version
expect 0 --help
has '^usage: kvdb-admin'
for c in info ls show verify compact; do
  has "^  $c "
done
expect 0 -h
for c in info ls show verify compact; do
  expect 0 "$c" --help
  has "^usage: kvdb-admin .*$c"
  [ ! -s "$T/err" ] || fail "$c --help wrote to stderr"
done
expect 0 verify --help "$DB"
expect 0 --version
has '^kvdb-admin [0-9]+\.[0-9]+\.[0-9]+ \(libkvdb [0-9]+\.[0-9]+\.[0-9]+, on-disk format 9\)$'
expect 0 --version --json
pyjson 'd["command"] == "version" and d["format_version"] == 9 and "libkvdb" in d'

# ---- errors: exit 1, "kvdb-admin: STATUS: message"; nothing is ever created
expect 1 info "$T/nope"
has_err '^kvdb-admin: KVDB_NOTFOUND: .*nope'
expect 1 verify "$T/nope"
expect 1 compact "$T/nope"
[ ! -e "$T/nope" ] || fail "a command created a database"
expect 1 info --json "$T/nope"
pyjson 'd["command"] == "info" and d["error"]["status"] == "KVDB_NOTFOUND" and d["error"]["code"] == 1'
: >"$T/plain"
expect 1 ls "$T/plain"
has_err '^kvdb-admin: KVDB_INVALID: '

# ---- read-only media: needs a user that permissions apply to (not root)
if [ "$(id -u)" -ne 0 ]; then
  cp -R "$DB" "$T/ro"
  chmod -R a-w "$T/ro"
  expect 0 info "$T/ro"
  expect 0 ls "$T/ro"
  expect 0 show "$T/ro" "$P8"
  expect 0 verify "$T/ro"
  expect 1 compact "$T/ro"
  has_err '^kvdb-admin: KVDB_READONLY: '
  chmod -R u+w "$T/ro"
else
  echo "note: running as root, read-only directory not checked" >&2
fi

# ---- compact after deletions: only the explicit-key block stays live in segment 1
"$FIX" delete "$DB" "$LONG" "$BRANCH" "$OTHER" || fail "admin_fixture delete"
expect 0 info --json "$DB"
pyjson 'd["contexts"] == 1 and d["blocks"] == 1 and d["dead_fraction"] > 0.5'
expect 0 compact --json "$DB"
pyjson 'd["threshold"] == 0.5 and d["segments_rewritten"] == 1 and d["blocks_moved"] == 1
  and d["bytes_moved"] > 0 and d["bytes_reclaimed"] > d["bytes_moved"]
  and d["segment_file_bytes_after"] < d["segment_file_bytes_before"]'
expect 0 compact "$DB" --threshold 0.9
has '^segments rewritten +0$'
has '^bytes reclaimed +0 B$'
expect 0 verify "$DB"
expect 0 -q ls "$DB"
[ "$(cat "$T/out")" = "$BLOCK" ] || fail "after compaction ls -q shows: $(cat "$T/out")"
expect 0 info --json "$DB"
pyjson 'd["contexts"] == 1 and d["blocks"] == 1 and d["dead_fraction"] == 0'

# ---- corruption: one flipped byte; verify names the segment and the offset, exits 3
DB2=$T/db2
"$FIX" create "$DB2" >/dev/null || fail "admin_fixture create db2"
"$FIX" corrupt "$DB2" >"$T/where" || fail "admin_fixture corrupt"
read -r SEG OFF <"$T/where"
expect 3 verify "$DB2"
has "^KVDB_CORRUPT: .*segment $SEG[^0-9].*offset $OFF([^0-9]|\$)"
has '^problems +1$'
has '^result +CORRUPTION FOUND$'
expect 3 verify --json "$DB2"
pyjson 'd["ok"] is False and d["problem_count"] == len(d["problems"]) == 1
  and d["problems"][0]["status"] == "KVDB_CORRUPT"
  and ("segment %s " % a[0]) in d["problems"][0]["message"]
  and ("offset %s " % a[1]) in d["problems"][0]["message"]' "$SEG" "$OFF"
expect 3 -q verify "$DB2"
[ "$(lines)" -eq 1 ] || fail "verify -q printed more than the problem line"
has '^KVDB_CORRUPT: '
expect 0 ls "$DB2"

# ---- packed raw blocks (format 7, FORMAT.md §3e): info, verify, a flipped byte, compact
DBP=$T/dbp
KVDB_ADMIN_FIXTURE_PACKED=1 "$FIX" create "$DBP" >"$T/pkeys" || fail "admin_fixture create (packed)"
expect 0 info "$DBP"
has '^format version +7$'
expect 0 verify "$DBP"
has '^problems +0$'
cp -R "$DBP" "$T/dbp2"
"$FIX" corrupt "$T/dbp2" 5000 || fail "admin_fixture corrupt (packed)"
expect 3 verify "$T/dbp2"
has '^KVDB_CORRUPT: '
"$FIX" delete "$DBP" "$(awk '/^long /{print $2}' "$T/pkeys")" || fail "admin_fixture delete (packed)"
expect 0 compact --json "$DBP"
expect 0 verify "$DBP"
has '^problems +0$'

echo "PASS: kvdb-admin"
