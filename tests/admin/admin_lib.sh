# SPDX-License-Identifier: MIT
# tests/admin/admin_lib.sh — helpers of the kvdb-admin end-to-end tests (test_admin.sh,
# test_admin_place.sh, test_admin_repair.sh, test_admin_space.sh), sourced after they set ADMIN (the kvdb-admin binary) and T (a scratch
# folder): run and expect kvdb-admin, check its stdout, stderr and JSON.

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# run ARGS...: kvdb-admin with stdout in $T/out, stderr in $T/err, exit status in $rc
run() {
  set +e
  "$ADMIN" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
}

# expect STATUS ARGS...: run, and fail unless it exits with STATUS
expect() {
  want=$1
  shift
  run "$@"
  if [ "$rc" -ne "$want" ]; then
    echo "--- stdout" >&2
    cat "$T/out" >&2
    echo "--- stderr" >&2
    cat "$T/err" >&2
    fail "kvdb-admin $* exited $rc, expected $want"
  fi
}

# pyjson EXPR [ARGS...]: stdout of the last run is exactly one JSON object `d` and EXPR holds
# (ARGS are in the list `a`)
pyjson() {
  expr=$1
  shift
  python3 -c '
import json, sys
d = json.load(sys.stdin)
a = sys.argv[2:]
if not isinstance(d, dict) or not eval("(" + sys.argv[1] + ")"):
    sys.exit("JSON check failed: " + sys.argv[1] + "\n" + json.dumps(d, indent=1))
' "$expr" "$@" <"$T/out" || fail "JSON check: $expr"
}

# has RE / has_err RE: a line of stdout / stderr of the last run matches RE (grep -E)
has() {
  grep -Eq -- "$1" "$T/out" || { cat "$T/out" >&2; fail "stdout lacks /$1/"; }
}
has_err() {
  grep -Eq -- "$1" "$T/err" || { cat "$T/err" >&2; fail "stderr lacks /$1/"; }
}
lines() {
  wc -l <"$T/out" | tr -d ' '
}

# snapshot DIR: the files of a database except LMDB's lock file (readers register there), with
# checksums
snapshot() {
  find "$1" -type f ! -name '*-lock' -exec cksum {} + | sort
}

# key_of NAME: the key admin_fixture create printed for NAME (its output in $T/keys)
key_of() {
  awk -v n="$1" '$1 == n { print $2 }' "$T/keys"
}
