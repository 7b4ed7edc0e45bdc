"""The torchrun command builder (pure) and run ids."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from runner.launch.command import build_command, new_run_id
from runner.spec import load_spec, resolve


def _spec(**hw):
    return resolve(load_spec("tiny-cpu", [f"hardware.{k}={v}" for k, v in hw.items()]), cuda_available=False,
                   gpu_count=0)


def test_single_node_is_standalone():
    argv = build_command(_spec(), Path("runs/x/spec.json"), "x")
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in argv and "--nproc-per-node=2" in argv and "--max-restarts=0" in argv
    assert argv[-4:] == ["-m", "runner.train", "--spec", "runs/x/spec.json"]


def test_multi_node_uses_c10d_rendezvous_per_node():
    spec = _spec(nodes=2, nproc_per_node=1, rdzv_endpoint="head:29400")
    a = build_command(spec, Path("s.json"), "rid", node_rank=0)
    b = build_command(spec, Path("s.json"), "rid", node_rank=1)
    assert "--standalone" not in a
    for argv, k in ((a, 0), (b, 1)):
        assert {"--nnodes=2", f"--node-rank={k}", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400",
                "--rdzv-id=rid"} <= set(argv)
    assert [x for x in a if "node-rank" not in x] == [x for x in b if "node-rank" not in x]


def test_build_command_is_pure(tmp_path: Path, monkeypatch):
    """The argv depends on its arguments alone: not on the working directory or the environment (torchrun's own
    variables included), and building it neither changes the spec nor writes anything."""
    spec = _spec(nodes=2, nproc_per_node=3, rdzv_endpoint="head:29400")
    before = spec.to_dict()
    expected = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", "--max-restarts=0",
                "--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--rdzv-id=id",
                "-m", "runner.train", "--spec", "s.json"]
    monkeypatch.chdir(tmp_path)
    assert build_command(spec, Path("s.json"), "id", node_rank=1) == expected
    for key, value in (("MASTER_ADDR", "elsewhere"), ("MASTER_PORT", "1"), ("WORLD_SIZE", "99"),
                       ("NPROC_PER_NODE", "7"), ("PET_NNODES", "5"), ("CUDA_VISIBLE_DEVICES", "0")):
        monkeypatch.setenv(key, value)
    assert build_command(spec, Path("s.json"), "id", node_rank=1) == expected
    assert spec.to_dict() == before and list(tmp_path.iterdir()) == []


def test_run_ids_never_collide_in_the_same_second(tmp_path: Path):
    ids: list[str] = []
    lock = threading.Lock()

    def make() -> None:
        for _ in range(50):
            rid = new_run_id("same", tmp_path / "runs", tmp_path / "records")
            with lock:
                ids.append(rid)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 200 and len(set(ids)) == 200
    assert all((tmp_path / "runs" / i).is_dir() for i in ids)


def test_ranks_get_expandable_allocator_segments_unless_the_user_chose(monkeypatch):
    """Long blocks strand reserved memory between the caching allocator's fixed-size blocks (an H100 run out of
    memory with 10.3 GiB reserved but unallocated trained with expandable segments): every run gets them, a
    user's own PYTORCH_CUDA_ALLOC_CONF wins, and what the ranks get is what the record keeps."""
    from runner.launch.command import run_env
    from runner.record.pins import relevant_env

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    env = run_env()
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert relevant_env(env)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert run_env()["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
