from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from grpolab.cli import build_parser, config_from_args, main, subcommand_parser
from grpolab.core.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS
from grpolab.core.config import DEFAULT_PROMPT_DATA, Config, DataConfig, sections
from grpolab.core.config.flags import attribute_docs, finite_float, train_flags
from grpolab.core.dtypes import DTYPES

# Every flag `grpolab train --help` listed before the flags were generated from the config, by the kind
# of value it takes ("bool": --x/--no-x, "pairs": NAME PATH pairs). None may disappear or change kind.
FLAGS_BEFORE: dict[str, str] = {
    **dict.fromkeys(
        "--hf-checkpoint --rollout-dtype --train-dtype --device --prompt-data --input-key --label-key "
        "--rm-type --custom-rm-path --reward-key --advantage-estimator --kl-loss-type --save --load "
        "--save-debug-rollout-data --load-debug-rollout-data --ci-inject-rollout-data-path "
        "--save-debug-event-data --ci-metric-checker-key --ci-save-grad-norm --ci-load-grad-norm "
        "--ci-ft-test-actions --run-dir".split(),
        "str",
    ),
    **dict.fromkeys(
        "--rollout-shuffle --group-rm --disable-grpo-std-normalization --use-kl-loss --use-tis "
        "--calculate-per-token-loss --colocate --offload-train --offload-rollout --debug-rollout-only "
        "--debug-train-only --allow-recording-mismatch --debug-skip-weight-update --debug-disable-optimizer "
        "--ci-test --ci-disable-kl-checker --ci-disable-logprobs-checker --ci-disable-weight-update-checker "
        "--check-weight-update-equal --ci-save-model-hash --ci-check-model-hash "
        "--debug-deterministic-collective --progress --apply-chat-template".split(),
        "bool",
    ),
    **dict.fromkeys(
        "--num-rollout --rollout-batch-size --n-samples-per-prompt --rollout-max-response-len --rollout-top-k "
        "--global-batch-size --micro-batch-size --update-weight-buffer-size --save-interval "
        "--ci-inject-rollout-data-start-rollout-id --debug-exit-after-rollout --eval-interval "
        "--n-samples-per-eval-prompt --eval-max-prompts --ci-metric-checker-expect-num --seed --num-threads "
        "--nproc-per-node".split(),
        "int",
    ),
    **dict.fromkeys(
        "--rollout-temperature --rollout-top-p --eps-clip --eps-clip-high --eps-clip-c --kl-loss-coef "
        "--tis-clip --tis-clip-low --entropy-coef --lr --clip-grad --weight-decay "
        "--load-debug-rollout-data-subsample --ci-inject-rollout-data-min-match-ratio "
        "--ci-logprobs-checker-abs-tol --ci-metric-checker-threshold --ci-grad-norm-rtol "
        "--ci-max-abs-advantage --engine-failure-timeout --gpu-sample-interval".split(),
        "float",
    ),
    "--eval-prompt-data": "pairs",
}


def parse(*argv: str) -> Config:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def train_actions() -> dict[str, argparse.Action]:
    parser = subcommand_parser(build_parser(), "train")
    return {s: a for a in parser._actions for s in a.option_strings}


def test_defaults_are_the_embedded_tiny_run() -> None:
    cfg = parse()
    assert cfg.rollout.num_rollout == 8
    assert cfg.data.apply_chat_template is True
    assert (
        cfg.optimizer.global_batch_size == cfg.rollout.rollout_batch_size * cfg.rollout.n_samples_per_prompt
    )
    assert cfg.steps_per_rollout == 1
    assert cfg.algorithm.eps_clip_high == cfg.algorithm.eps_clip == 0.2
    assert cfg == Config()  # no flag given: the dataclass defaults, the one table of defaults


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


def test_every_field_has_a_flag_with_help() -> None:
    actions = train_actions()
    for cls in sections().values():
        docs = attribute_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no attribute docstring"
            flag = "--progress" if f.name == "show_progress" else "--" + f.name.replace("_", "-")
            action = actions[flag]
            assert action.dest == f.name and action.default is None
            assert action.help and docs[f.name].split()[0] in action.help
    flags = train_flags()
    assert len(flags) == sum(len(dataclasses.fields(cls)) for cls in sections().values())
    by_flag = {tf.flag: tf for tf in flags}
    assert (
        by_flag["--lr"].help
        == "AdamW learning rate (the peak of a schedule: --lr-decay-style) (default: 0.0002)."
    )
    assert by_flag["--colocate"].help.endswith("(default: on).")
    assert by_flag["--eps-clip-high"].help == "Upper clip (default: --eps-clip, as in Miles)."
    assert "train/launch.py" not in by_flag["--device"].help  # later docstring paragraphs are for the code


def test_help_lists_every_flag_listed_before_with_the_same_kind() -> None:
    actions = train_actions()
    for flag, kind in FLAGS_BEFORE.items():
        action = actions[flag]
        if kind == "bool":
            assert isinstance(action, argparse.BooleanOptionalAction), flag
            assert "--no-" + flag[2:] in actions
        elif kind == "pairs":
            assert action.nargs == "+" and action.metavar == "NAME PATH"
        else:
            # float flags parse with finite_float: a float, refusing inf and nan
            assert {finite_float: "float"}.get(action.type, action.type.__name__) == kind, flag
            assert action.nargs is None, flag
    text = subcommand_parser(build_parser(), "train").format_help()
    for flag in FLAGS_BEFORE:
        assert flag in text
    assert "--eval-prompt-data NAME PATH [NAME PATH ...]" in text


def test_adam_flags_reach_the_optimizer_config() -> None:
    cfg = parse("--adam-beta1", "0.8", "--adam-beta2", "0.95", "--adam-eps", "1e-6")
    assert (cfg.optimizer.adam_beta1, cfg.optimizer.adam_beta2, cfg.optimizer.adam_eps) == (0.8, 0.95, 1e-6)
    assert Config.from_dict(cfg.to_dict()).optimizer.adam_beta2 == 0.95  # and run.json keeps them
    assert (parse().optimizer.adam_beta1, parse().optimizer.adam_beta2) == (0.9, 0.98)
    with pytest.raises(ValueError, match=r"--adam-beta2 must be in \[0, 1\), got 1.0"):
        parse("--adam-beta2", "1")


def test_chat_template_on_for_the_built_in_prompts_off_for_prompt_data() -> None:
    assert parse().data.apply_chat_template is True
    assert parse("--no-apply-chat-template").data.apply_chat_template is False
    assert parse("--prompt-data", "x.jsonl").data.apply_chat_template is False
    assert parse("--prompt-data", "x.jsonl", "--apply-chat-template").data.apply_chat_template is True
    # the rule is the config's, so the library and a run.json read back follow it too
    assert DataConfig().apply_chat_template is True
    assert DataConfig().prompt_data == str(DEFAULT_PROMPT_DATA)
    assert DataConfig(prompt_data="x.jsonl").apply_chat_template is False
    again = Config.from_dict(parse("--prompt-data", "x.jsonl").to_dict())
    assert again.data.apply_chat_template is False and again.data.prompt_data == "x.jsonl"


def test_booleans_have_no_forms() -> None:
    cfg = parse("--no-offload-train", "--no-colocate", "--no-progress")
    assert cfg.colocate.offload_train is False and cfg.colocate.colocate is False
    assert cfg.run.show_progress is False


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
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse(*argv)


@pytest.mark.parametrize("flag", ["--lr", "--gpu-sample-interval", "--rollout-temperature", "--clip-grad"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_float_flags_must_be_finite(flag: str, value: str, capsys) -> None:
    """inf passes range checks written as comparisons (`--lr inf` is >= 0): every float flag refuses it."""
    with pytest.raises(SystemExit) as info:
        parse(f"{flag}={value}")  # "=": argparse reads a lone "-inf" as an option
    assert info.value.code == 2
    assert f"argument {flag}: must be a finite number, got {value}" in capsys.readouterr().err


def test_configs_built_without_flags_must_be_finite_too() -> None:
    """Library callers and run.json files do not go through argparse: the Config refuses them itself."""
    from grpolab.core.config import OptimizerConfig

    with pytest.raises(ValueError, match="--lr must be a finite number, got inf"):
        Config(optimizer=OptimizerConfig(lr=math.inf))
    with pytest.raises(ValueError, match="--ci-max-abs-advantage must be a finite number, got inf"):
        Config.from_dict({"ci": {"ci_max_abs_advantage": math.inf}})


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--kl-loss-type", "k9"], KL_ESTIMATORS.names()),
        (["--advantage-estimator", "ppo"], ADVANTAGE_ESTIMATORS.names()),
        (["--rollout-dtype", "float16"], list(DTYPES)),
        (["--train-dtype", "float16"], list(DTYPES)),
    ],
)
def test_unknown_names_list_the_registry_and_exit_2(argv: list[str], names: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: grpolab train ")
    assert argv[0] in err and ", ".join(names) in err


def test_the_names_in_the_help_are_the_registries() -> None:
    help_of = {tf.flag: tf.help for tf in train_flags()}
    assert f"KL estimator: {' | '.join(KL_ESTIMATORS.names())} (" in help_of["--kl-loss-type"]
    assert (
        f"Advantage estimator: {' | '.join(ADVANTAGE_ESTIMATORS.names())} ("
        in help_of["--advantage-estimator"]
    )
    for flag in ("--rollout-dtype", "--train-dtype"):
        assert f"dtype: {' | '.join(DTYPES)} (" in help_of[flag]


def test_the_configs_builtin_names_are_the_registries() -> None:
    """The config accepts these without importing core/algorithms.py (torch); they must be its names."""
    from grpolab.core.config.training import BUILTIN_ADVANTAGE_ESTIMATORS, BUILTIN_KL_ESTIMATORS

    assert sorted(BUILTIN_ADVANTAGE_ESTIMATORS) == ADVANTAGE_ESTIMATORS.names()
    assert sorted(BUILTIN_KL_ESTIMATORS) == KL_ESTIMATORS.names()


def test_parse_dtype_maps_every_name_to_the_torch_dtype() -> None:
    import torch

    from grpolab.core.dtypes import parse_dtype

    assert [parse_dtype(name, "--train-dtype") for name in DTYPES] == [torch.float32, torch.bfloat16]
    with pytest.raises(ValueError, match="--train-dtype must be one of float32, bfloat16, got 'float16'"):
        parse_dtype("float16", "--train-dtype")


def test_a_gpu_runs_config_reads_back_on_this_machine() -> None:
    """run.json of a CUDA run parses anywhere: the device is checked when `grpolab train` starts."""
    data = parse().to_dict()
    data["model"]["device"] = "cuda:1"
    assert Config.from_dict(data).model.device == "cuda:1"
    for bad in ("tpu", "cuda:x", "cuda:"):
        data["model"]["device"] = bad
        with pytest.raises(ValueError, match=f"--device must be cpu, cuda or cuda:N, got '{bad}'"):
            Config.from_dict(data)


def test_a_run_whose_checkpoints_live_elsewhere_reads_back(tmp_path) -> None:
    """run.json naming --load/--save directories of another host parses; `grpolab train` checks them."""
    data = parse().to_dict()
    data["checkpoint"].update(load="/elsewhere/ckpt", save="/elsewhere/ckpt", save_interval=2)
    assert Config.from_dict(data).checkpoint.load == "/elsewhere/ckpt"
    with pytest.raises(ValueError, match="--save-interval must be >= 1"):
        Config.from_dict({**data, "checkpoint": {"save": "x", "save_interval": 0}})


def test_config_round_trips_through_dict() -> None:
    cfg = parse("--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01")
    again = Config.from_dict(cfg.to_dict())
    assert again == cfg
    with pytest.raises(ValueError, match="unknown fields"):
        Config.from_dict({"optimizer": {"learning_rate": 1}})
    with pytest.raises(ValueError, match="unknown sections"):
        Config.from_dict({"optimiser": {}})


def test_gpu_sample_interval_zero_or_from_a_tenth_of_a_second() -> None:
    assert parse("--gpu-sample-interval", "0").run.gpu_sample_interval == 0
    assert parse("--gpu-sample-interval", "0.1").run.gpu_sample_interval == 0.1
    assert parse().run.gpu_sample_interval == 1.0


def test_ci_entropy_range_takes_exactly_two_values_and_says_so(capsys) -> None:
    """Its help showed `LOW HIGH [LOW HIGH ...]` though only two values are accepted."""
    action = train_actions()["--ci-entropy-range"]
    assert action.nargs == 2 and action.metavar == ("LOW", "HIGH")
    assert "--ci-entropy-range LOW HIGH\n" in subcommand_parser(build_parser(), "train").format_help()
    assert parse("--ci-entropy-range", "0.1", "2").ci.ci_entropy_range == [0.1, 2.0]
    with pytest.raises(SystemExit) as info:
        parse("--ci-entropy-range", "0.1")
    assert info.value.code == 2 and "--ci-entropy-range: expected 2 arguments" in capsys.readouterr().err
