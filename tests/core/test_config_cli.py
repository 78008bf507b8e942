from __future__ import annotations

import pytest

from grpolab.cli import build_parser, config_from_args
from grpolab.core.config import Config


def parse(*argv: str) -> Config:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_defaults_are_the_embedded_tiny_run() -> None:
    cfg = parse()
    assert cfg.rollout.num_rollout == 8
    assert cfg.data.apply_chat_template is True
    assert (
        cfg.optimizer.global_batch_size == cfg.rollout.rollout_batch_size * cfg.rollout.n_samples_per_prompt
    )
    assert cfg.steps_per_rollout == 1
    assert cfg.algorithm.eps_clip_high == cfg.algorithm.eps_clip == 0.2


def test_last_value_wins_and_miles_names() -> None:
    cfg = parse(
        "--rollout-batch-size",
        "4",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "4",
    )
    assert cfg.rollout.rollout_batch_size == 2
    assert cfg.steps_per_rollout == 2


def test_prompt_data_turns_chat_template_off_unless_asked(tmp_path) -> None:
    assert parse("--prompt-data", "x.jsonl").data.apply_chat_template is False
    assert parse("--prompt-data", "x.jsonl", "--apply-chat-template").data.apply_chat_template is True


def test_booleans_have_no_forms() -> None:
    cfg = parse("--no-offload-train", "--no-colocate")
    assert cfg.colocate.offload_train is False and cfg.colocate.colocate is False


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--global-batch-size", "7"], "--global-batch-size 7 must divide"),
        (["--kl-loss-type", "k9"], "--kl-loss-type"),
        (["--eps-clip-c", "0.5"], "--eps-clip-c"),
        (["--rollout-top-p", "0"], "--rollout-top-p"),
        (["--save-interval", "2"], "--save-interval needs --save"),
        (["--train-dtype", "int8"], "--train-dtype"),
        (
            ["--gpu-sample-interval", "1e-9"],
            r"--gpu-sample-interval must be 0 \(no GPU sampling\) or .* >= 0.1",
        ),
        (["--gpu-sample-interval", "-1"], "--gpu-sample-interval must be 0"),
        (["--gpu-sample-interval", "nan"], "--gpu-sample-interval must be 0"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse(*argv)


def test_config_round_trips_through_dict() -> None:
    cfg = parse("--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01")
    again = Config.from_dict(cfg.to_dict())
    assert again == cfg
    with pytest.raises(ValueError, match="unknown fields"):
        Config.from_dict({"optimizer": {"learning_rate": 1}})


def test_gpu_sample_interval_zero_or_from_a_tenth_of_a_second() -> None:
    assert parse("--gpu-sample-interval", "0").run.gpu_sample_interval == 0
    assert parse("--gpu-sample-interval", "0.1").run.gpu_sample_interval == 0.1
    assert parse().run.gpu_sample_interval == 1.0
