#!/usr/bin/env bash
# The family matrix and the packing check against the newest transformers release: a release that breaks a family
# (a moved function, a new mask builder) fails here before users meet it. The newest transformers and its own
# requirements go into a folder put first on the path of the project's venv (torch, trl, peft stay as pinned).
# Only an install that cannot reach PyPI is skipped; a release that installs and breaks a family fails the job.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${VENV_PYTHON:-.venv/bin/python}
site=${NEWEST_SITE:-.venv-newest}
probe=$(mktemp -d)
if ! "$py" -m pip download -q --no-deps --dest "$probe" transformers >/dev/null 2>&1; then
    echo "test-newest: skipped (PyPI not reachable: the newest transformers could not be fetched)"
    rm -rf "$probe"
    exit 0
fi
rm -rf "$probe" "$site"
set -e
"$py" -m pip install -q --target "$site" --upgrade transformers
version=$(PYTHONPATH="$site" "$py" -c 'import transformers; print(transformers.__version__)')
echo "test-newest: transformers $version"
PYTHONPATH="$site:$PWD" exec "$py" -m pytest -q -p no:cacheprovider tests/unit/test_families.py \
    tests/unit/test_packcheck.py -k "registry or packs_exactly or planted"
