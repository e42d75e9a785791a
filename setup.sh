#!/bin/sh
# SPDX-License-Identifier: MIT
# kvdb set-up on a fresh Debian 12 machine, then the main job or the whole test suite.
#
#   ./setup.sh demo    install what is missing, build, run the main job on ./demo-db
#   ./setup.sh test    install what is missing, build, run every test suite
#
# Packages are installed with apt-get when run as root; otherwise the exact apt-get line is
# printed and nothing else happens. The build goes to ./build (meson + ninja).
set -eu

cd "$(dirname "$0")"
mode=${1:-}
case "$mode" in
  demo|test) ;;
  *) echo "usage: ./setup.sh demo|test" >&2; exit 2 ;;
esac

pkgs="meson ninja-build pkgconf gcc liblmdb-dev libzstd-dev liburing-dev libxxhash-dev python3 libxrt-dev uuid-dev"
missing=""
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "kvdb needs these Debian packages:$missing" >&2
    echo "run:  sudo apt-get update && sudo apt-get install -y --no-install-recommends$missing" >&2
    exit 1
  fi
  echo "setup: installing$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=debugoptimized
fi
ninja -C build

if [ "$mode" = demo ]; then
  db=${KVDB_DEMO_DIR:-./demo-db}
  rm -rf "$db"
  echo "== one process stores prompts that share a prefix"
  ./build/tools/demo/kvdb-demo put "$db"
  echo "== a fresh process looks them up and reads their KV back"
  ./build/tools/demo/kvdb-demo get "$db"
  echo "== kvdb-admin info $db"
  ./build/tools/kvdb-admin/kvdb-admin info "$db"
  echo "== kvdb-admin ls $db"
  ./build/tools/kvdb-admin/kvdb-admin ls "$db"
else
  meson test -C build --print-errorlogs --num-processes 2
fi
