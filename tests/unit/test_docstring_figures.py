"""No benchmark figure in runner/'s docstrings: a docstring says what a thing does and why (field docstrings are the
help text of `runner fields` and the wizard); what was measured lives in docs/ and benchmarks/, beside the file that
holds the measurement, where it can be read as a result of its date and machine and cannot go stale unseen."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPU = re.compile(r"\b(?:[AH]\d{2,3}|B[12]00|B300|GB[23]00|L40S?|MI\d{3}X?)\b")
# A number, a range of numbers or an approximate one: 0.681, 11-28, 16 to 31, ~19, +4, −5.
NUM = r"(?<![\w.\-])[+\-−~≈]?\d[\d,]*(?:\.\d+)?(?:\s?(?:-|–|to)\s?\d[\d,]*(?:\.\d+)?)?"
RATE = re.compile(NUM + r"\s?(?:tokens/s|TFLOP/s|TB/s|GB/s|MB/s)")
TIME = re.compile(NUM + r"\s?(?:ms|µs|s)(?![\w/²])")
# Memory and shares as results report them ("17.3 GiB", "13-44%"); "80GB" in a device name is not a result.
AMOUNT = re.compile(NUM + r"(?:\s(?:GiB|GB|MiB)|\s?%)(?!\w)")
FIGURE = re.compile(f"{RATE.pattern}|{TIME.pattern}|{AMOUNT.pattern}|\\d(?:\\.\\d+)?e-\\d|{NUM}\\s?×")
# A duration is a benchmark figure where the sentence says it was seen on a machine; "within 30 s" is a contract.
SEEN = re.compile(r"\b(?:measured|took|fitted|median|cost|ran)\b|\b(?:s|ms|time) a step\b", re.I)


def figures(doc: str) -> list[str]:
    """The sentences of a docstring that report a measured figure."""
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", " ".join(doc.split())):
        named_gpu = GPU.search(sentence)
        if (RATE.search(sentence)
                or (TIME.search(sentence) and (named_gpu or SEEN.search(sentence)))
                or (re.search(r"\bmeasured\b", sentence, re.I) and FIGURE.search(sentence))
                or (named_gpu and AMOUNT.search(sentence))):
            found.append(sentence)
    return found


def docstrings(source: str) -> list[tuple[int, str]]:
    """Every docstring of a module: the module's, each class's and function's, and each attribute's (the string
    after an assignment, which pydantic fields and constants use)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)  # a lambda's body is one expression, not statements
        for statement in body if isinstance(body, list) else []:
            if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)):
                out.append((statement.lineno, statement.value.value))
    return out


def test_no_benchmark_figure_in_runner_docstrings():
    found = [f"{path.relative_to(REPO)}:{line}: {sentence}"
             for path in sorted((REPO / "runner").rglob("*.py"))
             for line, doc in docstrings(path.read_text())
             for sentence in figures(doc)]
    assert found == [], "move what was measured to docs/ or benchmarks/README.md:\n" + "\n".join(found)


def test_the_check_tells_figures_from_definitions():
    measured = [
        "Measured on one H200: flex beats varlen at 8,192 tokens per forward (1.1 vs 2.7 ms).",
        "Measured for TRL's full fine-tune on an H200: unwrapped 13-44% faster at 8k tokens.",
        "A full collection over them took 330-420 ms on the host.",
        "Its compile takes 16 to 31 s for a head layout in a new process on an H100.",
        "One launch per parameter cost ~19 ms of host time a step for 310 tensors.",
        "512 elements per program with 4 warps moves 3.2 TB/s.",
        "The attention kernels reach about 225 TFLOP/s forward.",
        "Copies come back at 55.3 GB/s each way alone.",
        "The H200 plain-loop peaks (Qwen3 1.72B, 36.5 GiB at 8k and 88.0 GiB at 32k) rise by 2.25 MB per token.",
        "Fitted on the 1.72B runs: 0.681 s at 32k.",
        "Sums round differently (measured: 6.6e-7 by step 3 of the embedded recipe).",
        "A dense layer no longer recomputes its last projection (measured −5% step time on the 1.72B model).",
        "Measured: the embedded demo's ranks peak at 0.58 GiB with 0.02 GiB of tensors.",
    ]
    plain = [
        "GPU type for planning (H100-80GB, H200, B300, ...); auto = detect through NVML.",
        "Map an NVML device name (e.g. 'NVIDIA H100 80GB HBM3') to a catalog entry, or None.",
        "Memory per GPU (or CPU rank) the planner leaves free when it picks the speed levers; None = 5% of it.",
        "The k and v gradients of every query head, in bf16 (2 × 2 bytes × q_dim).",
        "The ranks stop at a step boundary; whatever is left gets SIGKILL (everything gone within 30 s).",
        "A fast answer before anything waits on the hub client's retries (about 50 s per file when offline).",
        "Per-step timings after warm-up, tokens/s per GPU, MFU, peak memory and the share of time spent on data.",
        "Lower bounds are measured: trl before 1.15 logs no loss through the TRL engine.",
        "What a finished run measured (metrics_from_events, plus wall_s).",
        "Distinct lengths past 1,024 tokens are rounded down to 10 significant bits (under 0.1% off).",
        "Checked on the H200 with TRL's liger kernels at 8k and 32k (benchmarks/estimator-notes.md).",
    ]
    assert [s for s in measured if not figures(s)] == []
    assert [s for s in plain if figures(s)] == []
    assert docstrings('"""m"""\nX = 1\n"""x"""\nclass C:\n    """c"""\n    def f(self):\n        """f"""\n') == [
        (1, "m"), (3, "x"), (5, "c"), (7, "f")]
