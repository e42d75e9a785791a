#!/bin/sh
# SPDX-License-Identifier: MIT
# check-abi.sh LIBKVDB_SO KVDB_MAP KVDB_H: the ABI guard (the test `abi`).
# Three lists of names must be equal:
#   - the symbols LIBKVDB_SO exports (nm -D --defined-only, less version nodes),
#   - the names KVDB_MAP lists under global: (one `name;` a line, no wildcard),
#   - the functions KVDB_H declares with KVDB_API (one declaration a line starting KVDB_API).
# A symbol dropped from the map (kvdb.map only grows), a public function not listed there (so
# not exported), or an exported name not declared fails, naming each name and the list it is
# missing from. Every exported symbol must also carry a version node of the map (name@@NODE).
# Exit 0: equal; 1: they differ; 2: usage or unreadable input; 77 (skipped): no nm.
set -u
if [ $# -ne 3 ]; then
  echo "usage: check-abi.sh LIBKVDB_SO KVDB_MAP KVDB_H" >&2
  exit 2
fi
lib=$1 map=$2 hdr=$3
for f in "$lib" "$map" "$hdr"; do
  if [ ! -r "$f" ]; then echo "check-abi: cannot read $f" >&2; exit 2; fi
done
if ! command -v nm >/dev/null 2>&1; then
  echo "check-abi: nm not found; skipped" >&2
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-abi.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM

# Exported: defined dynamic symbols; type A entries are the version nodes themselves.
nm -D --defined-only "$lib" > "$tmp/nm" || { echo "check-abi: nm failed on $lib" >&2; exit 2; }
awk '$2 != "A" { print $3 }' "$tmp/nm" | sort > "$tmp/exported.ver"
sed 's/@.*//' "$tmp/exported.ver" | sort -u > "$tmp/exported"
# Listed: the names between `global:` and `local:` of every version node (comments stripped).
sed 's|/\*.*\*/||; s|^ *\*.*||; s|/\*.*||' "$map" |
  awk '/global:/ { g = 1; next } /local:/ { g = 0; next } /}/ { g = 0; next }
       g { gsub(/[ \t;]/, ""); if ($0 != "") print }' | sort > "$tmp/listed"
grep '^[A-Za-z_][A-Za-z0-9_.]* *{' "$map" | sed 's/ *{.*//' | sort -u > "$tmp/nodes"
# Declared: KVDB_API functions of the header.
grep '^KVDB_API ' "$hdr" | sed 's/(.*//; s/.*[ *]//' | sort > "$tmp/declared"

fail=0
report() { # report FILE WHAT
  if [ -s "$1" ]; then
    fail=1
    while IFS= read -r name; do echo "check-abi: $name: $2"; done < "$1"
  fi
}
if grep -q '[*?]' "$tmp/listed"; then
  grep '[*?]' "$tmp/listed" | sed 's/^/check-abi: pattern /; s/$/ in the map: list each name/'
  fail=1
fi
comm -23 "$tmp/listed" "$tmp/exported" > "$tmp/a"
report "$tmp/a" "listed in $map but not exported by $lib"
comm -13 "$tmp/listed" "$tmp/exported" > "$tmp/a"
report "$tmp/a" "exported by $lib but not listed in $map"
comm -23 "$tmp/declared" "$tmp/listed" > "$tmp/a"
report "$tmp/a" "declared KVDB_API in $hdr but not listed in $map (not exported)"
comm -13 "$tmp/declared" "$tmp/listed" > "$tmp/a"
report "$tmp/a" "listed in $map but not declared KVDB_API in $hdr"
# Versions: where nm shows them, each exported name carries a node of the map.
grep '@' "$tmp/exported.ver" | sed 's/^[^@]*@@*//' | sort -u > "$tmp/used_nodes"
comm -23 "$tmp/used_nodes" "$tmp/nodes" > "$tmp/a"
report "$tmp/a" "a version node of exported symbols that $map does not define"

n=$(wc -l < "$tmp/exported" | tr -d ' ')
if [ "$fail" -ne 0 ]; then
  echo "check-abi: FAIL: exports, $map and the KVDB_API declarations of $hdr differ (above)"
  exit 1
fi
if [ "$n" -eq 0 ]; then echo "check-abi: FAIL: $lib exports nothing"; exit 1; fi
echo "check-abi: ok: $n symbols exported, listed and declared alike"
