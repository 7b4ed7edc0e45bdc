#!/usr/bin/env bash
# The family matrix and the packing check against the newest transformers release, in a second venv: a release
# that breaks a family (a moved function, a new mask builder) fails here before users meet it. Only an install
# that cannot reach PyPI is skipped; a release that installs and breaks a family fails the job.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${NEWEST_VENV:-.venv-newest}
py=${PYTHON:-python3}
probe=$(mktemp -d)
if ! $py -m pip download -q --no-deps --dest "$probe" transformers >/dev/null 2>&1; then
    echo "test-newest: skipped (PyPI not reachable: the newest transformers could not be fetched)"
    exit 0
fi
rm -rf "$probe"
set -e
test -x "$venv/bin/python" || $py -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.13.0
grep -v '^transformers' .ci/constraints.txt > "$venv/constraints-newest.txt"
"$venv/bin/python" -m pip install -q -c "$venv/constraints-newest.txt" -e ".[dev]"
"$venv/bin/python" -m pip install -q --upgrade transformers
echo "test-newest: transformers $("$venv/bin/python" -c 'import transformers; print(transformers.__version__)')"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit/test_families.py tests/unit/test_packcheck.py \
    -k "registry or packs_exactly or planted"
