"""JsonlTail / DirTail: partial lines, truncation, replacement, bad lines, and the 8-rank interleaved stress test."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from runner.events.monitor import RunView
from runner.events.tail import DirTail, JsonlTail
from tests.unit.events_fixtures import end, line, start, step


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_missing_file_then_created(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []
    append(path, b'{"a": 1}\n')
    assert tail.read_new() == [{"a": 1}]
    assert tail.read_new() == []


def test_partial_line_waits_for_newline(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    append(path, b'{"step": 1}\n{"ste')
    assert tail.read_new() == [{"step": 1}]
    append(path, b'p": 2')
    assert tail.read_new() == []
    append(path, b'}\n{"step": 3}\n')
    assert tail.read_new() == [{"step": 2}, {"step": 3}]
    assert tail.bad_lines == 0


def test_multibyte_utf8_split_across_reads(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    data = (json.dumps({"message": "ünïcødé — ok"}, ensure_ascii=False) + "\n").encode()
    cut = data.index("—".encode()) + 1  # inside the 3-byte character
    append(path, data[:cut])
    assert tail.read_new() == []
    append(path, data[cut:])
    assert tail.read_new() == [{"message": "ünïcødé — ok"}]


def test_truncation_restarts_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    append(path, b'{"step": 1}\n{"step": 2}\n')
    assert len(tail.read_new()) == 2
    path.write_bytes(b'{"step": 9}\n')
    assert tail.read_new() == [{"step": 9}]


def test_replacement_restarts_from_zero(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    append(path, b'{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert len(tail.read_new()) == 3
    # Same size or larger than the offset: only the inode tells that it is another file.
    other = tmp_path / "new.jsonl"
    other.write_bytes(b'{"step": 7}\n{"step": 8}\n{"step": 9}\n{"step": 10}\n')
    keep_old_inode_alive = open(path, "rb")  # so that the new file cannot reuse the old inode number
    try:
        os.replace(other, path)
        assert tail.read_new() == [{"step": 7}, {"step": 8}, {"step": 9}, {"step": 10}]
    finally:
        keep_old_inode_alive.close()


def test_deleted_file_reads_empty_and_partial_is_dropped_on_replacement(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    append(path, b'{"step": 1}\n{"step": 2')
    assert tail.read_new() == [{"step": 1}]
    keep = open(path, "rb")
    try:
        path.unlink()
        assert tail.read_new() == []
        append(path, b'{"step": 5}\n')
        assert tail.read_new() == [{"step": 5}]  # no '{"step": 2' glued in front
    finally:
        keep.close()


def test_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    append(path, b'{"step": 1}\nnot json\n[1, 2]\n"str"\n\n\xff\xfe\n{"step": 2, "loss": NaN}\r\n')
    records = tail.read_new()
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["loss"] != records[1]["loss"]  # NaN reaches the view
    assert tail.bad_lines == 4  # blank lines are not bad


def test_max_read_bytes_continues_on_next_call(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    append(path, b"".join(line({"step": s}) for s in range(1, 101)))
    tail = JsonlTail(path, max_read_bytes=64)
    got: list[int] = []
    for _ in range(1000):
        got += [r["step"] for r in tail.read_new()]
    assert got == list(range(1, 101))


def test_dirtail_discovers_files_as_they_appear(tmp_path: Path) -> None:
    events = tmp_path / "events"
    tail = DirTail(events)
    assert tail.read_new() == []  # directory not there yet
    events.mkdir()
    append(events / "rank1.jsonl", line({"step": 1}))
    append(events / "rank1.jsonl.tmp", line({"step": 99}))
    append(events / "notes.txt", b"hello\n")
    assert tail.read_new() == [("rank1", {"step": 1})]
    append(events / "rank10.jsonl", line({"step": 1}))
    append(events / "rank2.jsonl", line({"step": 1}))
    append(events / "node0.jsonl", line({"node": 0}))
    assert [s for s, _ in tail.read_new()] == ["node0", "rank2", "rank10"]
    assert tail.read_new() == []


def test_dirtail_kinds_filter(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    append(events / "rank0.jsonl", line({"step": 1}))
    append(events / "node0.jsonl", line({"node": 0}))
    assert DirTail(events, kinds=("rank",)).read_new() == [("rank0", {"step": 1})]


def test_stress_8_ranks_1000_steps_random_chunks(tmp_path: Path) -> None:
    """Writers append random-sized chunks (cutting lines anywhere) interleaved with polls; every rank must end with
    exactly steps 1..1000, none lost, none twice, even with some lines written twice."""
    rng = random.Random(1234)
    world_size, max_steps = 8, 1000
    events = tmp_path / "events"
    events.mkdir()
    streams: dict[int, bytes] = {}
    for r in range(world_size):
        records = [start(r, world_size=world_size, max_steps=max_steps)]
        for s in range(1, max_steps + 1):
            records.append(step(r, s, loss=10.0 / s))
            if rng.random() < 0.01:  # a writer that repeats a line must not create a duplicate step
                records.append(step(r, s, loss=10.0 / s))
        records.append(end(r, max_steps))
        streams[r] = b"".join(line(rec) for rec in records)

    view = RunView(tmp_path, clock=lambda: 0.0)
    files = {r: open(events / f"rank{r}.jsonl", "ab") for r in range(world_size)}
    offsets = dict.fromkeys(range(world_size), 0)
    try:
        while any(offsets[r] < len(streams[r]) for r in range(world_size)):
            r = rng.choice([r for r in range(world_size) if offsets[r] < len(streams[r])])
            n = rng.randint(1, 400)
            files[r].write(streams[r][offsets[r] : offsets[r] + n])
            files[r].flush()
            offsets[r] += n
            if rng.random() < 0.2:
                view.poll()
    finally:
        for f in files.values():
            f.close()
    view.poll()
    assert view.poll() is False

    assert sorted(view.ranks) == list(range(world_size))
    for r, rs in view.ranks.items():
        assert [s for s, _ in rs.losses] == list(range(1, max_steps + 1)), f"rank {r}"
        assert rs.step == max_steps and rs.status == "done"
        assert rs.tokens_total == max_steps * 1000
    assert view.global_step == max_steps and view.finished
    assert view.bad_lines == 0
