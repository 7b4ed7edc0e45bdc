#!/usr/bin/env bash
# The engine-facing tests (the family matrix, packing, both engines, replay, compile with recompute, the version
# check) in a fresh venv at one end of the supported ranges (runner/versions.py):
#   oldest: each library at its lower bound (.ci/oldest.txt);
#   newest: a fresh install without constraints, as a user who installs today gets it (with `kernels`, which newer
#           transformers pull in and which changes how their layers run).
# torch is the CPU build on disk (torch==2.13.0, the lower bound). Only an install that cannot reach PyPI is skipped;
# a release that installs and breaks a test fails the job.
set -uo pipefail
cd "$(dirname "$0")/.."
end=${1:?usage: .ci/versions.sh oldest|newest}
py=${PYTHON:-python3}
venv=.venv-$end
probe=$(mktemp -d)
if ! "$py" -m pip download -q --no-deps --dest "$probe" trl >/dev/null 2>&1; then
    echo "test-$end: skipped (PyPI not reachable)"
    rm -rf "$probe"
    exit 0
fi
rm -rf "$probe" "$venv"
set -e
start=$(date +%s)
"$py" -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
tools=(pytest pytest-timeout hypothesis)
if [ "$end" = oldest ]; then
    "$venv/bin/pip" install -q -c .ci/oldest.txt -e . "${tools[@]}"
else
    "$venv/bin/pip" install -q -e . kernels "${tools[@]}"
fi
"$venv/bin/python" - <<'PY'
from runner.versions import imported_version
names = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "kernels")
print("versions:", ", ".join(f"{n} {imported_version(n)}" for n in names))
PY
echo "test-$end: installed in $(( $(date +%s) - start )) s"
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/unit/test_families.py \
    tests/unit/test_packcheck.py \
    tests/unit/test_loss.py::test_recompute_inside_the_compiled_layer_skips_what_backward_does_not_read \
    tests/unit/test_versions.py \
    tests/dist/test_trl.py::test_trl_run_trains_with_fsdp2_and_lora_on_experts \
    tests/dist/test_trl.py::test_replay_reproduces_the_trl_loss_curve_exactly \
    tests/dist/test_run.py::test_run_writes_events_and_record_and_loss_falls \
    tests/dist/test_run.py::test_replay_reproduces_bit_for_bit
echo "test-$end: $(( $(date +%s) - start )) s in all"
