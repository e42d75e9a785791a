#!/bin/sh
# SPDX-License-Identifier: MIT
#
# scripts/check-layers.sh — the layer check of LAYERS (the repository root's file: layers lowest
# first, `name path-prefix...`, and `unit PREFIX` lines).
#
#   scripts/check-layers.sh [--root DIR] [--objects LIB.a]
#
# Includes (always): every `#include "x"` of every .c and .h of the tree is resolved to the
# file it names: x beside the including file, else the one file of the tree whose path is x or
# ends in /x (meson's include directories search the tree so; two such files are an error: an
# ambiguous name). A name no file of the tree has is a system or library header and is skipped.
# Fails, naming file:line, when an include points to a layer listed after the includer's; and
# when a .c or .h of the tree is in no layer.
#
# Calls (--objects LIB.a, a static library meson built): `nm` gives each object's defined and
# undefined symbols; a call is an undefined symbol of one object that another defines. Fails
# when a file calls a file of a later layer (naming both and the symbol), and when the calls
# between files make a cycle (naming it). The files under a `unit` prefix count as one node of
# the cycle check.
#
# POSIX sh, awk, grep, find, nm: no other tool. Exit 0 when clean, 1 when a rule is broken, 2 on
# bad usage.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
objects=
while [ $# -gt 0 ]; do
  case $1 in
  --root) root=$2; shift 2 ;;
  --objects) objects=$2; shift 2 ;;
  *) echo "usage: $0 [--root DIR] [--objects LIB.a]" >&2; exit 2 ;;
  esac
done
layers=$root/LAYERS
if [ ! -f "$layers" ]; then
  echo "check-layers: no $layers" >&2
  exit 2
fi

tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM

# The tree's sources: what git tracks or would add, else every .c/.h outside build folders.
cd "$root" || exit 2
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -- '*.c' '*.h' | sort -u >"$tmp/files"
else
  find . -type d \( -name '.git' -o -name 'build*' \) -prune -o -type f \( -name '*.c' -o -name '*.h' \) -print |
    sed 's|^\./||' | sort >"$tmp/files"
fi
# keep the files that exist (git ls-files lists deleted ones until they are staged)
while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done <"$tmp/files" >"$tmp/srcs"

# Shared awk: the layer of a path (longest prefix), from LAYERS.
cat >"$tmp/layers.awk" <<'EOF'
function load_layers(file,   line, n, i, f) {
  nlayers = 0; nunits = 0
  while ((getline line < file) > 0) {
    sub(/#.*/, "", line)
    n = split(line, f, /[ \t]+/)
    i = 1
    if (f[1] == "") i = 2
    if (i > n) continue
    if (f[i] == "unit") { for (i++; i <= n; i++) if (f[i] != "") unit[++nunits] = f[i]; continue }
    lname[++nlayers] = f[i]
    for (i++; i <= n; i++) if (f[i] != "") { pfx[f[i]] = nlayers }
  }
  close(file)
}
# The layer number of path p (0: none); lay_pfx receives the matching prefix.
function layer_of(p,   q, best, bl) {
  best = ""; bl = 0
  for (q in pfx)
    if ((p == q || index(p, q "/") == 1) && length(q) > length(best)) { best = q; bl = pfx[q] }
  lay_pfx = best
  return bl
}
function node_of(p,   i) {
  for (i = 1; i <= nunits; i++)
    if (p == unit[i] || index(p, unit[i] "/") == 1) return unit[i] "/"
  return p
}
EOF

status=0

# ---- (a) includes ----------------------------------------------------------------------------
# file:line:name of every quoted include
xargs grep -n '^[ 	]*#[ 	]*include[ 	]*"' /dev/null <"$tmp/srcs" |
  sed 's/^\([^:]*\):\([0-9]*\):[^"]*"\([^"]*\)".*/\1 \2 \3/' >"$tmp/incs"

cat >"$tmp/prog1.awk" <<'EOF'
BEGIN { load_layers(layers); bad = 0 }
FNR == NR { src[$0] = 1; n = split($0, parts, "/"); base = parts[n]; bybase[base] = bybase[base] " " $0; next }
function dirname(p,   i) { i = match(p, /\/[^\/]*$/); return i ? substr(p, 1, i - 1) : "" }
function norm(p,   n, a, out, i, k, st) {
  n = split(p, a, "/"); k = 0
  for (i = 1; i <= n; i++) {
    if (a[i] == "." || a[i] == "") continue
    if (a[i] == ".." && k > 0 && st[k] != "..") { k--; continue }
    st[++k] = a[i]
  }
  out = ""
  for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") st[i]
  return out
}
{
  f = $1; line = $2; name = $3
  d = dirname(f)
  t = norm((d == "" ? "" : d "/") name)
  if (!(t in src)) {
    # the tree search: files whose path is name or ends in /name
    n = split(name, parts, "/"); base = parts[n]
    m = split(bybase[base], cand, " "); hit = ""; nh = 0
    for (i = 1; i <= m; i++) {
      c = cand[i]
      if (c == name || (length(c) > length(name) && substr(c, length(c) - length(name)) == "/" name)) {
        nh++; hit = hit (nh > 1 ? ", " : "") c; t = c
      }
    }
    if (nh == 0) next  # a system or library header
    if (nh > 1) { printf "%s:%s: #include \"%s\" is ambiguous: %s\n", f, line, name, hit; bad = 1; next }
  }
  lf = layer_of(f); lt = layer_of(t)
  if (lf == 0 || lt == 0) next  # reported below
  if (lt > lf) {
    printf "%s:%s: #include \"%s\" (%s, layer %s) points up from layer %s\n", f, line, name, t, lname[lt], lname[lf]
    bad = 1
  }
}
END { exit bad }
EOF
awk -v layers="$layers" -f "$tmp/layers.awk" -f "$tmp/prog1.awk" "$tmp/srcs" "$tmp/incs" || status=1

cat >"$tmp/prog2.awk" <<'EOF'
BEGIN { load_layers(layers); bad = 0 }
{ if (layer_of($0) == 0) { printf "%s: in no layer of LAYERS\n", $0; bad = 1 } }
END { exit bad }
EOF
awk -v layers="$layers" -f "$tmp/layers.awk" -f "$tmp/prog2.awk" "$tmp/srcs" || status=1

# ---- (b) calls between the objects of a library ----------------------------------------------
if [ -n "$objects" ]; then
  if [ ! -f "$objects" ]; then
    echo "check-layers: no library $objects" >&2
    exit 2
  fi
  # "member sym type" per symbol; an archive's lines read "lib.a:member.o: ... T sym"
  nm -A "$objects" 2>/dev/null | awk '{
    i = index($0, ".o:"); if (i == 0) next
    head = substr($0, 1, i + 1); n = split(head, h, ":"); m = h[n]
    rest = substr($0, i + 3); k = split(rest, w, /[ \t]+/)
    if (w[1] == "") { for (j = 1; j < k; j++) w[j] = w[j + 1]; k-- }
    if (k == 2) print m, w[2], w[1]; else if (k >= 3) print m, w[3], w[2]
  }' >"$tmp/syms"
  if [ ! -s "$tmp/syms" ]; then
    echo "check-layers: nm read no symbols from $objects" >&2
    exit 2
  fi
  # .c files, for the object -> source map
  grep '\.c$' "$tmp/srcs" >"$tmp/csrcs"
  cat >"$tmp/prog3.awk" <<'EOF'
BEGIN { load_layers(layers); bad = 0 }
FNR == NR { csrc[++nc] = $0; next }
# meson names an object after its source path from the target folder, "/" as "_", ".." kept
function source_of(m,   s, i, c, n, a, j, suf, hit, nh) {
  if (m in srcof) return srcof[m]
  s = m; sub(/\.o$/, "", s)
  while (substr(s, 1, 3) == ".._") s = substr(s, 4)
  nh = 0; hit = ""
  for (i = 1; i <= nc; i++) {
    c = csrc[i]; n = split(c, a, "/"); suf = ""
    for (j = n; j >= 1; j--) {
      suf = a[j] (suf == "" ? "" : "_" suf)
      if (suf == s) { nh++; hit = hit (nh > 1 ? ", " : "") c; break }
    }
  }
  if (nh != 1) {
    printf "%s: object %s is %s\n", (nh ? "ambiguous" : "unknown"), m, (nh ? hit : "no source of the tree"); bad = 1
    hit = ""
  }
  srcof[m] = hit
  return hit
}
{
  f = source_of($1); if (f == "") next
  if ($3 == "U") { use[f, $2] = 1; uses[f] = uses[f] " " $2 }
  else if ($3 ~ /^[TDBRVWGSC]$/) def[$2] = f
}
END {
  # edges between files; upward calls
  for (f in uses) {
    m = split(uses[f], s, " ")
    for (i = 1; i <= m; i++) {
      sym = s[i]
      if (!(sym in def) || def[sym] == f) continue
      t = def[sym]
      lf = layer_of(f); lt = layer_of(t)
      if (lf == 0 || lt == 0) continue
      if (lt > lf && !((f, t) in upseen)) {
        upseen[f, t] = 1
        printf "%s calls %s of %s (layer %s) up from layer %s\n", f, sym, t, lname[lt], lname[lf]
        bad = 1
      }
      a = node_of(f); b = node_of(t)
      if (a != b && !((a, b) in edge)) { edge[a, b] = 1; out[a] = out[a] " " b; node[a] = 1; node[b] = 1 }
    }
  }
  # cycles: depth-first search, colour 1 on the stack, 2 done
  for (v in node) if (!colour[v] && dfs(v, 0)) { bad = 1; break }
  exit bad
}
function dfs(v, depth,   m, s, i, w, k, cyc) {
  colour[v] = 1; stack[depth] = v
  m = split(out[v], s, " ")
  for (i = 1; i <= m; i++) {
    w = s[i]
    if (colour[w] == 1) {
      k = depth
      while (k > 0 && stack[k] != w) k--
      cyc = ""
      for (; k <= depth; k++) cyc = cyc stack[k] " -> "
      printf "call cycle: %s%s\n", cyc, w
      return 1
    }
    if (!colour[w] && dfs(w, depth + 1)) return 1
  }
  colour[v] = 2
  return 0
}
EOF
awk -v layers="$layers" -f "$tmp/layers.awk" -f "$tmp/prog3.awk" "$tmp/csrcs" "$tmp/syms" || status=1
fi

if [ $status -eq 0 ]; then
  echo "check-layers: ok ($(wc -l <"$tmp/srcs" | tr -d ' ') files${objects:+, calls of $objects})"
fi
exit $status
