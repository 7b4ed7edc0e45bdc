"""The TrainJob `runner job --to kubeflow` writes, for every shipped recipe, against the Kubeflow Trainer TrainJob
CRD's own OpenAPI schema (v2.3.0, vendored in tests/fixtures/kubeflow) with unknown fields refused, as the API
server's strict field validation refuses them; and every pod name JobSet makes from it within 63 characters."""

from __future__ import annotations

import functools
import gzip
import re

import pytest
import yaml

from runner.launch.jobs import POD_NAME_TAIL, job_name, label_value
from runner.spec import load_spec, recipe_names
from tests.conftest import REPO, run_cli

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the dev extra) is not installed")

CRD = REPO / "tests" / "fixtures" / "kubeflow" / "trainer.kubeflow.org_trainjobs.yaml.gz"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _strict(node):
    """The schema with every object that lists its properties closed to others (what `kubectl apply
    --validate=strict` refuses), except where the CRD keeps unknown fields on purpose."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def _validator():
    crd = yaml.safe_load(gzip.decompress(CRD.read_bytes()))
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def problems(doc: dict) -> list[str]:
    """Schema errors (with their paths), and what the CRD's schema leaves to the API server: the name a DNS label,
    label values valid."""
    out = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(doc)]
    meta = doc.get("metadata") or {}
    if not DNS_1035.match(meta.get("name", "")) or len(meta["name"]) > 63:
        out.append(f"metadata.name {meta.get('name')!r} is not a DNS-1035 label")
    out += [f"label {k}={v!r}" for k, v in (meta.get("labels") or {}).items() if not LABEL_VALUE.match(v)]
    return out


def pod_names(doc: dict) -> list[str]:
    """JobSet's pod names for the TrainJob: `<name>-node-<job index 0>-<pod index>-<5 characters>`."""
    return [f"{doc['metadata']['name']}-node-0-{i}-abcde" for i in range(doc["spec"]["trainer"]["numNodes"])]


def _trainjob(tmp_path, recipe: str, *sets: str) -> dict:
    out = tmp_path / f"{recipe}.yaml"
    args = ["job", recipe, "--to", "kubeflow", "--image", "ghcr.io/you/sft-tui:1", "--volume", "sft-runs",
            "-o", str(out), "--runs-dir", str(tmp_path / "runs"), "--records-dir", str(tmp_path / "records")]
    if load_spec(recipe).hardware.nproc_per_node == "auto":
        sets = ("hardware.nproc_per_node=8", *sets)
    code = run_cli([*args, *(a for s in sets for a in ("--set", s))])[0]
    assert code == 0
    return yaml.safe_load(out.read_text())


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_writes_a_schema_valid_trainjob_with_short_pod_names(tmp_path, recipe):
    for nodes in (None, 128):
        doc = _trainjob(tmp_path, recipe, *([f"hardware.nodes={nodes}"] if nodes else []))
        assert problems(doc) == []
        names = pod_names(doc)
        assert all(len(n) <= 63 and DNS_1035.match(n) for n in names), max(names, key=len)
        assert doc["metadata"]["labels"]["sft-tui/name"] == label_value(load_spec(recipe).name)


def test_a_misspelt_field_fails_the_schema(tmp_path):
    doc = _trainjob(tmp_path, "tiny-cpu")
    doc["spec"]["trainer"]["numNode"] = 2
    assert problems(doc) == ["spec.trainer: Additional properties are not allowed ('numNode' was unexpected)"]
    del doc["spec"]["trainer"]["numNode"]
    doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert len(problems(doc)) == 1


def test_long_names_are_cut_with_a_hash_the_same_every_time():
    spec = load_spec("tiny-cpu")
    run_id = "20261207-042504-gpt-oss-120b-lora-8xh100-with-a-long-tail-667c3b"
    name = job_name(spec, run_id, "kubeflow")
    assert name == job_name(spec, run_id, "kubeflow") != job_name(spec, run_id.replace("tail", "tale"), "kubeflow")
    assert len(name + POD_NAME_TAIL) == 63 and DNS_1035.match(name) and name.startswith("sft-20261207-042504-gpt")
    assert job_name(spec, "20261207-042504-tiny-cpu-abc123", "kubeflow") == "sft-20261207-042504-tiny-cpu-abc123"
