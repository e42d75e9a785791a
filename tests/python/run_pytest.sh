#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs a pytest suite of the Python package against this build's libkvdb:
#   run_pytest.sh SOURCE_ROOT LIBKVDB PYTEST_ARGS...
# with the repository's virtual environment (.venv, made by ./setup.sh), or the interpreter
# KVDB_PYTHON names. Exit 77 (meson: skipped)
# with the reason when .venv, numpy, pytest or the kvdb package is missing (PyPI unreachable at
# set-up); pytest's own skips (torch, llama-cpp-python) are reported in its summary line.
root=$1; libkvdb=$2; shift 2
py=${KVDB_PYTHON:-$root/.venv/bin/python}
if [ ! -x "$py" ]; then
  echo "SKIP: no virtual environment at $root/.venv (./setup.sh makes it; it needs PyPI)"
  exit 77
fi
# KVDB_PYTHON_NEEDS: more modules this run needs (e.g. torch), else it is skipped the same way
for mod in numpy pytest kvdb ${KVDB_PYTHON_NEEDS:-}; do
  if ! "$py" -c "import $mod" >/dev/null 2>&1; then
    echo "SKIP: '$mod' is not installed in $py (./setup.sh installs it)"
    exit 77
  fi
done
cd "$root/python" || exit 1
KVDB_LIB=$libkvdb "$py" -m pytest -q -rs "$@"
rc=$?
# 5: no test collected (every module skipped at import) -- a skip, not a failure
[ $rc -eq 5 ] && { echo "SKIP: pytest collected no test"; exit 77; }
exit $rc
