"""`grpolab estimate memory` (train/estimate.py): the components follow the flags, the peak is the
persistent parts plus the largest transient one, and bad flags or files exit 2."""

from __future__ import annotations

import pytest
import torch

from grpolab.cli import build_parser, main
from grpolab.core.config.flags import config_from_args
from grpolab.train.estimate import estimate, peak_bytes


def parts(*flags: str) -> dict[str, int]:
    config = config_from_args(build_parser().parse_args(["train", *flags]))
    found, params = estimate(config, baseline=0)
    assert params == 918_912  # the tiny model, tied head counted once
    return {p.name: p.bytes for p in found} | {"peak": peak_bytes(found)}


def test_components_follow_the_flags() -> None:
    base = parts()
    weights = 918_912 * 4
    assert base["trainer weights"] == base["gradients"] == base["engine weights"] == weights
    assert base["Adam moments"] == 2 * weights and base["reference model"] == 0
    # tiny-qwen3: 4 layers, 2 KV heads of 32, 64 samples of (42-token prompt + 32) tokens, float32
    assert base["rollout KV cache (transient)"] == 4 * 2 * 2 * 32 * 4 * 64 * (42 + 32)
    transient = [v for k, v in base.items() if "(transient)" in k]
    assert base["peak"] == sum(v for k, v in base.items() if "(transient)" not in k and k != "peak") + max(
        transient
    )
    assert parts("--use-kl-loss")["reference model"] == weights
    frozen = parts("--debug-disable-optimizer")
    assert frozen["gradients"] == frozen["Adam moments"] == 0
    half = parts("--train-dtype", "bfloat16", "--rollout-dtype", "bfloat16")
    assert (
        half["trainer weights"] == weights // 2
        and half["rollout KV cache (transient)"] == base["rollout KV cache (transient)"] // 2
    )


def test_a_launched_fleet_counts_its_engines_and_router() -> None:
    """--rollout-num-engines 2: two `grpolab serve` processes (with baseline=0: weights and the KV cache of
    32 samples each) and the router; no in-process engine weights or KV cache."""
    fleet = parts("--rollout-num-engines", "2")
    kv = 4 * 2 * 2 * 32 * 4 * (42 + 32)
    assert fleet["engine servers (2 x grpolab serve)"] == 2 * (918_912 * 4 + kv * 32)
    assert fleet["sglang-router"] == 100 * 2**20
    assert fleet["engine weights"] == fleet["rollout KV cache (transient)"] == 0


def test_more_ranks_count_their_processes_and_micro_batches() -> None:
    config = config_from_args(build_parser().parse_args(["train"]))
    one = {p.name: p.bytes for p in estimate(config, baseline=100)[0]}
    two = {p.name: p.bytes for p in estimate(config, baseline=100, world_size=2)[0]}
    assert two["other ranks' processes (1)"] == 100 and two["trainer weights"] == one["trainer weights"]
    assert two["training micro-batch (transient)"] == 2 * one["training micro-batch (transient)"]


def test_the_command_prints_the_table(capsys) -> None:
    assert main(["estimate", "memory", "--num-rollout", "1"]) == 0
    out = capsys.readouterr().out
    assert "918,912 parameters" in out and "estimated peak" in out and "parameters x 16 bytes" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rollout-batch-size", "0"], "--rollout-batch-size must be >= 1"),
        (["--hf-checkpoint", "/nonexistent"], "/nonexistent"),
        (["--rollout-batch-size", "x"], "grpolab estimate memory: error: argument --rollout-batch-size"),
        (
            ["--rollout-num-engines", "2", "--use-fault-tolerance", "--nproc-per-node", "2"],
            "runs on one rank",
        ),
        (["--rollout-max-response-len", "30000"], "--rollout-max-response-len"),  # past the model's limit
        (["--load", "/nonexistent"], "--load /nonexistent: no such directory"),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], "--device"),
    ],
)
def test_bad_flags_exit_2(capsys, flags: list[str], message: str) -> None:
    try:
        code = main(["estimate", "memory", *flags])
    except SystemExit as e:
        code = e.code
    assert code == 2 and message in capsys.readouterr().err
