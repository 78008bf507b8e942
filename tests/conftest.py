"""Shared fixtures: the tiny model shipped in fixtures/ and small configs around it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "fixtures" / "tiny-qwen3"
ARITHMETIC_TRAIN = REPO / "fixtures" / "data" / "arithmetic_train.jsonl"
GSM8K_TRAIN = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    assert (TINY_MODEL / "config.json").exists(), (
        f"fixture model missing at {TINY_MODEL}; run python -m grpolab.fixtures.make_fixtures"
    )
    return TINY_MODEL


@pytest.fixture(scope="session")
def gpt2_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised GPT-2 checkpoint with the fixture's tokenizer: a model type outside
    the Llama/Qwen families grpolab's decoder and shared-prefix forward are written for."""
    import shutil

    import transformers

    out = tmp_path_factory.mktemp("gpt2") / "gpt2"
    cfg = transformers.GPT2Config(
        vocab_size=256, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=2
    )
    transformers.GPT2LMHeadModel(cfg).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_MODEL / name, out)
    return out


@pytest.fixture(scope="session")
def gsm8k_train() -> Path:
    if not GSM8K_TRAIN.exists():
        pytest.skip(f"real GSM8K not found at {GSM8K_TRAIN} (it lives in ../shared/data/gsm8k)")
    return GSM8K_TRAIN


@pytest.fixture(scope="session")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory written once per session by a real `grpolab train` (runs.SHORT: 2 rollouts,
    one optimizer step each, status finished). Shared: copy it before editing."""
    from runs import train_short

    return train_short(tmp_path_factory.mktemp("short") / "run")
