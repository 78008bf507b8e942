"""The `grpolab` command. `grpolab train [Miles-style flags]` runs GRPO and writes a run directory.

Flags use Miles names and meanings; a repeated flag keeps its last value (argparse semantics).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from grpolab.core.config import (
    AlgorithmConfig,
    CheckpointConfig,
    CIConfig,
    ColocateConfig,
    Config,
    DataConfig,
    DebugConfig,
    EvalConfig,
    ModelConfig,
    OptimizerConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
)

BOOL = "bool"

# (flag, config section, field, type, help). Defaults come from the dataclasses.
TRAIN_FLAGS: list[tuple[str, str, str, Any, str]] = [
    (
        "--hf-checkpoint",
        "model",
        "hf_checkpoint",
        str,
        "model directory or .gguf file (default: the tiny fixture model)",
    ),
    ("--rollout-dtype", "model", "rollout_dtype", str, "engine dtype: float32 | bfloat16"),
    ("--train-dtype", "model", "train_dtype", str, "trainer dtype: float32 | bfloat16"),
    ("--device", "model", "device", str, "cpu or cuda[:N]; engine and trainer are colocated on it"),
    (
        "--prompt-data",
        "data",
        "prompt_data",
        str,
        "prompts, .jsonl or .parquet (default: the fixture arithmetic set)",
    ),
    ("--input-key", "data", "input_key", str, "prompt field"),
    ("--label-key", "data", "label_key", str, "label field"),
    ("--rollout-shuffle", "data", "rollout_shuffle", BOOL, "shuffle prompts each epoch"),
    ("--num-rollout", "rollout", "num_rollout", int, "number of rollouts"),
    ("--rollout-batch-size", "rollout", "rollout_batch_size", int, "prompts per rollout"),
    ("--n-samples-per-prompt", "rollout", "n_samples_per_prompt", int, "answers per prompt (group size)"),
    ("--rollout-max-response-len", "rollout", "rollout_max_response_len", int, "max generated tokens"),
    ("--rollout-temperature", "rollout", "rollout_temperature", float, "sampling temperature"),
    ("--rollout-top-p", "rollout", "rollout_top_p", float, "nucleus sampling mass"),
    ("--rollout-top-k", "rollout", "rollout_top_k", int, "top-k sampling (0 or -1 disables)"),
    ("--rm-type", "reward", "rm_type", str, "built-in reward: math | boxed_math"),
    ("--custom-rm-path", "reward", "custom_rm_path", str, "pkg.module.function reward (sync or async)"),
    ("--group-rm", "reward", "group_rm", BOOL, "the custom reward scores a whole group at once"),
    ("--reward-key", "reward", "reward_key", str, "key to read when the reward function returns a dict"),
    ("--advantage-estimator", "algorithm", "advantage_estimator", str, "grpo"),
    (
        "--disable-grpo-std-normalization",
        "algorithm",
        "disable_grpo_std_normalization",
        BOOL,
        "Dr.GRPO: subtract the group mean only",
    ),
    ("--eps-clip", "algorithm", "eps_clip", float, "PPO clip range"),
    ("--eps-clip-high", "algorithm", "eps_clip_high", float, "upper clip (default: --eps-clip)"),
    ("--eps-clip-c", "algorithm", "eps_clip_c", float, "dual-clip constant (> 1)"),
    ("--use-kl-loss", "algorithm", "use_kl_loss", BOOL, "add KL to the reference to the loss"),
    ("--kl-loss-coef", "algorithm", "kl_loss_coef", float, "KL loss coefficient"),
    ("--kl-loss-type", "algorithm", "kl_loss_type", str, "k1 | k2 | k3 | low_var_kl"),
    ("--use-tis", "algorithm", "use_tis", BOOL, "truncated importance sampling against engine log-probs"),
    ("--tis-clip", "algorithm", "tis_clip", float, "TIS upper clip"),
    ("--tis-clip-low", "algorithm", "tis_clip_low", float, "TIS lower clip"),
    ("--entropy-coef", "algorithm", "entropy_coef", float, "entropy bonus coefficient"),
    (
        "--calculate-per-token-loss",
        "algorithm",
        "calculate_per_token_loss",
        BOOL,
        "token mean instead of sample mean",
    ),
    (
        "--global-batch-size",
        "optimizer",
        "global_batch_size",
        int,
        "samples per optimizer step (default: all of a rollout)",
    ),
    ("--micro-batch-size", "optimizer", "micro_batch_size", int, "samples per forward/backward"),
    ("--lr", "optimizer", "lr", float, "AdamW learning rate"),
    ("--clip-grad", "optimizer", "clip_grad", float, "gradient norm clip (0 disables)"),
    ("--weight-decay", "optimizer", "weight_decay", float, "AdamW weight decay"),
    ("--colocate", "colocate", "colocate", BOOL, "engine and trainer share devices (offload around phases)"),
    ("--offload-train", "colocate", "offload_train", BOOL, "offload trainer state during rollout"),
    ("--offload-rollout", "colocate", "offload_rollout", BOOL, "release engine memory during training"),
    (
        "--update-weight-buffer-size",
        "colocate",
        "update_weight_buffer_size",
        int,
        "bytes per weight-sync bucket",
    ),
    ("--save", "checkpoint", "save", str, "checkpoint directory"),
    ("--load", "checkpoint", "load", str, "resume from the newest checkpoint here (empty dir: start fresh)"),
    ("--save-interval", "checkpoint", "save_interval", int, "save every N rollouts (and at the end)"),
    (
        "--debug-rollout-only",
        "debug",
        "debug_rollout_only",
        BOOL,
        "generation only; no optimizer or backward",
    ),
    ("--debug-train-only", "debug", "debug_train_only", BOOL, "training only; no engine"),
    (
        "--save-debug-rollout-data",
        "debug",
        "save_debug_rollout_data",
        str,
        "record every rollout to this template (must contain {rollout_id})",
    ),
    (
        "--load-debug-rollout-data",
        "debug",
        "load_debug_rollout_data",
        str,
        "train from recordings (implies --debug-train-only)",
    ),
    (
        "--load-debug-rollout-data-subsample",
        "debug",
        "load_debug_rollout_data_subsample",
        float,
        "keep about this fraction of samples",
    ),
    (
        "--allow-recording-mismatch",
        "debug",
        "allow_recording_mismatch",
        BOOL,
        "replay recordings made with another model/tokenizer/config",
    ),
    (
        "--ci-inject-rollout-data-path",
        "debug",
        "ci_inject_rollout_data_path",
        str,
        "generate, compare with this recording, train on it",
    ),
    (
        "--ci-inject-rollout-data-start-rollout-id",
        "debug",
        "ci_inject_rollout_data_start_rollout_id",
        int,
        "first rollout to inject",
    ),
    (
        "--ci-inject-rollout-data-min-match-ratio",
        "debug",
        "ci_inject_rollout_data_min_match_ratio",
        float,
        "mean token match must exceed this",
    ),
    (
        "--debug-skip-weight-update",
        "debug",
        "debug_skip_weight_update",
        BOOL,
        "keep offload/onload, skip sending weights",
    ),
    (
        "--debug-disable-optimizer",
        "debug",
        "debug_disable_optimizer",
        BOOL,
        "no optimizer step; forward/backward still run",
    ),
    ("--debug-exit-after-rollout", "debug", "debug_exit_after_rollout", int, "stop after this rollout id"),
    (
        "--save-debug-event-data",
        "debug",
        "save_debug_event_data",
        str,
        "also write events.jsonl into this directory",
    ),
    ("--eval-interval", "eval", "eval_interval", int, "evaluate every N rollouts (and after the last)"),
    ("--n-samples-per-eval-prompt", "eval", "n_samples_per_eval_prompt", int, "answers per eval prompt"),
    ("--eval-max-prompts", "eval", "eval_max_prompts", int, "use at most this many prompts per eval set"),
    ("--ci-test", "ci", "ci_test", BOOL, "in-run invariant checkers (KL, log-probs, weight update)"),
    ("--ci-disable-kl-checker", "ci", "ci_disable_kl_checker", BOOL, "escape hatch for the KL checker"),
    (
        "--ci-disable-logprobs-checker",
        "ci",
        "ci_disable_logprobs_checker",
        BOOL,
        "escape hatch for the log-prob checker",
    ),
    (
        "--ci-logprobs-checker-abs-tol",
        "ci",
        "ci_logprobs_checker_abs_tol",
        float,
        "trainer-vs-engine mean gap tolerance",
    ),
    ("--ci-disable-weight-update-checker", "ci", "ci_disable_weight_update_checker", BOOL, "escape hatch"),
    (
        "--check-weight-update-equal",
        "ci",
        "check_weight_update_equal",
        BOOL,
        "weight-update checker without --ci-test",
    ),
    (
        "--ci-metric-checker-key",
        "ci",
        "ci_metric_checker_key",
        str,
        "eval metric to gate on, e.g. eval/arith",
    ),
    ("--ci-metric-checker-threshold", "ci", "ci_metric_checker_threshold", float, "the key must reach this"),
    (
        "--ci-metric-checker-expect-num",
        "ci",
        "ci_metric_checker_expect_num",
        int,
        "exactly this many passing evals",
    ),
    ("--ci-save-grad-norm", "ci", "ci_save_grad_norm", str, "template with {role} {rollout_id} {step_id}"),
    ("--ci-load-grad-norm", "ci", "ci_load_grad_norm", str, "compare grad norms with these files"),
    ("--ci-grad-norm-rtol", "ci", "ci_grad_norm_rtol", float, "rel and abs tolerance (0 = bitwise)"),
    ("--ci-save-model-hash", "ci", "ci_save_model_hash", BOOL, "per-layer hashes with every checkpoint"),
    ("--ci-check-model-hash", "ci", "ci_check_model_hash", BOOL, "verify per-layer hashes after --load"),
    (
        "--ci-max-abs-advantage",
        "ci",
        "ci_max_abs_advantage",
        float,
        "numeric guard: largest allowed |advantage|",
    ),
    ("--ci-ft-test-actions", "ci", "ci_ft_test_actions", str, "JSON list of fault-injection actions"),
    (
        "--engine-failure-timeout",
        "rollout",
        "engine_failure_timeout",
        float,
        "seconds of failed engine calls before the run stops (default 60)",
    ),
    (
        "--gpu-sample-interval",
        "run",
        "gpu_sample_interval",
        float,
        "seconds between GPU samples in gpu.jsonl (0 disables, else >= 0.1; default 1)",
    ),
    ("--run-dir", "run", "run_dir", str, "run directory (default runs/<time>-s<seed>)"),
    ("--seed", "run", "seed", int, "run seed"),
    (
        "--debug-deterministic-collective",
        "run",
        "debug_deterministic_collective",
        BOOL,
        "fold SUM/AVG reductions in a fixed order (det_gloo/det_nccl); slow, for bitwise comparisons",
    ),
    ("--num-threads", "run", "num_threads", int, "torch CPU threads (pin for bitwise-reproducible CPU runs)"),
    ("--progress", "run", "show_progress", BOOL, "progress bar during generation"),
]

SECTIONS: dict[str, Callable[..., Any]] = {
    "model": ModelConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "reward": RewardConfig,
    "algorithm": AlgorithmConfig,
    "optimizer": OptimizerConfig,
    "colocate": ColocateConfig,
    "checkpoint": CheckpointConfig,
    "debug": DebugConfig,
    "eval": EvalConfig,
    "ci": CIConfig,
    "run": RunConfig,
}


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """Register every `grpolab train` flag; unset flags stay None so dataclass defaults apply."""
    for flag, _section, _field, kind, help_text in TRAIN_FLAGS:
        if kind == BOOL:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="run N ranks on this machine through torchrun (the same as `torchrun --nproc-per-node N -m grpolab train ...`)",
    )
    parser.add_argument(
        "--eval-prompt-data",
        nargs="+",
        default=None,
        metavar="NAME PATH",
        help="held-out prompt sets as NAME PATH pairs; metric eval/<NAME> is the mean reward",
    )
    parser.add_argument(
        "--apply-chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap prompts in the tokenizer's chat template (default: on for the built-in prompt set, off for --prompt-data)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """Build the validated Config from parsed flags (ValueError names the offending flag)."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for flag, section, field, _kind, _help in TRAIN_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            sections[section][field] = value
    if args.eval_prompt_data is not None:
        sections["eval"]["eval_prompt_data"] = list(args.eval_prompt_data)
    chat = args.apply_chat_template
    sections["data"]["apply_chat_template"] = (args.prompt_data is None) if chat is None else chat
    return Config(**{name: cls(**sections[name]) for name, cls in SECTIONS.items()})


def add_hash_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `hash diff A B [--json]` to an argparse subparsers object (sets `args.command = "hash"`)."""
    parser = subparsers.add_parser("hash", help="per-layer model hashes: find where two checkpoints differ")
    sub = parser.add_subparsers(dest="hash_command", required=True)
    diff = sub.add_parser(
        "diff",
        help="first differing layer between two checkpoints (exit 0 identical, 1 different, 2 bad input)",
    )
    for side in ("a", "b"):
        diff.add_argument(
            side, metavar=side.upper(), help="checkpoint iter_<N> dir, HF model dir, or .safetensors file"
        )
    diff.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpolab", description="A GRPO trainer built for debugging and reproducing RL runs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="run GRPO and write a run directory",
        usage="%(prog)s [--FLAG VALUE ...]  (grpolab train --help lists the flags)",
        allow_abbrev=False,
    )
    add_train_flags(train)
    from grpolab.replay.cli import add_replay_parser

    add_replay_parser(sub)
    from grpolab.ui.launch import add_ui_parser

    add_ui_parser(sub)
    add_hash_parser(sub)
    from grpolab.checkers.gate import add_gate_parser

    add_gate_parser(sub)
    from grpolab.diagnose.cli import add_diagnose_parsers

    add_diagnose_parsers(sub)
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # "required: {train,…}", not the dest's name
    return parser


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of `grpolab <name>` inside `build_parser()`'s parser (its errors show its own usage).

    Raises:
        KeyError: no such subcommand.
    """
    for action in parser._actions:  # argparse keeps subparsers only there
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """Re-run this `grpolab train` command under torchrun with `nproc` ranks; return its exit code."""
    if nproc < 1:
        print(f"grpolab train: error: --nproc-per-node must be >= 1, got {nproc}", file=sys.stderr)
        return 2
    rest, skip = [], False
    for a in argv[1:]:  # argv[0] is "train"
        if skip or a.startswith("--nproc-per-node="):
            skip = False
            continue
        if a == "--nproc-per-node":
            skip = True
            continue
        rest.append(a)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "grpolab",
        "train",
        *rest,
    ]
    return _run_forwarding_signals(cmd)


def _run_forwarding_signals(cmd: list[str]) -> int:
    """Run `cmd` and pass SIGTERM/SIGHUP sent to this wrapper on to it, so `kill`, a watchdog's
    `--stop-pid` or a scheduler stops the whole torchrun world, not only the wrapper (torchrun then
    stops its ranks, which write status `interrupted`). SIGINT is not forwarded: Ctrl+C in a
    terminal already reaches torchrun through the foreground process group."""
    proc = subprocess.Popen(cmd)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    forwarded = (signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue  # torchrun got the same Ctrl+C and is stopping its ranks: wait for it
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `grpolab` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "hash":
        from grpolab.checkers.model_hash import run_hash_command

        return run_hash_command(args)
    if args.command == "gate":
        from grpolab.checkers.gate import run_gate_command

        return run_gate_command(args)
    if args.command == "replay":
        from grpolab.replay.cli import run_replay_command

        return run_replay_command(args)
    if args.command == "ui":
        from grpolab.ui.launch import run_ui_command

        return run_ui_command(args)
    if args.command in ("diagnose", "watchdog"):
        from grpolab.diagnose.cli import run_diagnose_command

        return run_diagnose_command(args)
    if args.command == "train":
        from grpolab.core.loop import train

        try:
            config = config_from_args(args)
        except ValueError as e:
            subcommand_parser(parser, "train").error(str(e))  # usage: grpolab train …
        if args.nproc_per_node is not None and "LOCAL_RANK" not in os.environ:
            return launch_torchrun(args.nproc_per_node, argv)
        from grpolab.checkers.errors import CheckFailure

        try:
            train(config, ["grpolab", *argv])
        except CheckFailure as e:
            print(f"grpolab train: {e}", file=sys.stderr)
            return 1
        except (ValueError, FileNotFoundError, FileExistsError) as e:
            print(f"grpolab train: error: {e}", file=sys.stderr)
            return 2  # bad input: a flag, a file, a run directory
        except RuntimeError as e:
            print(f"grpolab train: error: {e}", file=sys.stderr)
            return 1  # the run failed: the engine, a fault, a non-finite loss, a weight sync
        except KeyboardInterrupt:
            print("grpolab train: interrupted; the run directory's last event says so", file=sys.stderr)
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
