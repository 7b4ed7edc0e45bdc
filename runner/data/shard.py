"""One (rank, dataloader worker)'s streamed, shuffled, disjoint shard of a dataset (hub or local files).

The ranks' stream reads its rows here and the estimator samples the dataset's size through the same reader, so both
see the same rows in the same order. No torch.
"""

from __future__ import annotations

from pathlib import Path


def load_examples(dataset_path: Path | None, dataset_id: str | None, revision: str | None, split: str,
                  shard_rank: int, shard_world: int, seed: int, epoch: int = 0, shuffle_buffer: int = 1000):
    """A streamed, shuffled, disjoint shard of the dataset for one (rank, dataloader worker)."""
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    if dataset_path is not None and dataset_path.is_dir():
        ds = load_dataset(str(dataset_path), split=split, streaming=True)
    elif dataset_path is not None:
        ds = load_dataset(local_builder(dataset_path), data_files=str(dataset_path), split="train", streaming=True)
    else:
        ds = load_dataset(dataset_id, revision=revision, split=split, streaming=True)
    ds = split_dataset_by_node(ds, rank=shard_rank, world_size=shard_world)
    if shuffle_buffer > 1:
        ds = ds.shuffle(seed=seed + epoch, buffer_size=shuffle_buffer)
    return ds


LOCAL_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def local_builder(path: Path) -> str:
    """The `datasets` builder of a local file; a .jsonl.gz / .json.gz / .csv.gz takes its inner format's (the
    builder decompresses it)."""
    from runner.data.datafiles import data_suffix

    builder = LOCAL_BUILDERS.get(data_suffix(path))
    if builder is None:
        raise ValueError(f"unsupported dataset file type {path.suffix!r} (expected one of {', '.join(LOCAL_BUILDERS)},"
                         f" or .gz of a text one)")
    return builder
