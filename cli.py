"""The `grpolab` command: parses the command line and dispatches to the module of each subcommand.

`grpolab train [Miles-style flags]` runs GRPO and writes a run directory. Its flags are generated from
the config dataclasses (`core/config/flags.py`) and use Miles names and meanings; a repeated flag keeps
its last value (argparse semantics). `--nproc-per-node N` re-launches under torchrun (`train/launch.py`).
The other subcommands bring their own parsers: replay, ui, hash, gate, diagnose/watchdog, diff, bisect.
"""

from __future__ import annotations

import argparse
import os
import sys

from grpolab.checkers.hash_command import add_hash_parser, run_hash_command
from grpolab.core.config.flags import add_train_flags, config_from_args
from grpolab.train.launch import add_launch_flags, launch_torchrun, peer_gone_message, planned_world_size


def build_parser() -> argparse.ArgumentParser:
    """The `grpolab` parser with every subcommand (imports no torch)."""
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
    add_launch_flags(train)
    from grpolab.replay.cli import add_replay_parser

    add_replay_parser(sub)
    from grpolab.convert.command import add_convert_parser

    add_convert_parser(sub)
    estimate = sub.add_parser(
        "estimate",
        help="before launch: what a run will hold in memory, per component (grpolab estimate memory TRAIN FLAGS)",
        description="Estimate a run's memory per component (train/estimate.py) from the same flags as grpolab train.",
    )
    estimate.add_argument("what", choices=["memory"])
    estimate.add_argument("train_flags", nargs=argparse.REMAINDER, metavar="TRAIN FLAGS")
    from grpolab.ui.launch import add_ui_parser

    add_ui_parser(sub)
    add_hash_parser(sub)
    from grpolab.checkers.gate_command import add_gate_parser

    add_gate_parser(sub)
    from grpolab.checkers.template_command import add_check_parser

    add_check_parser(sub)
    from grpolab.diagnose.cli import add_diagnose_parsers

    add_diagnose_parsers(sub)
    from grpolab.serve.command import add_serve_parser

    add_serve_parser(sub)
    from grpolab.rollout.agent_command import add_agent_parser

    add_agent_parser(sub)
    from grpolab.diff.command import add_diff_parser

    add_diff_parser(sub)
    from grpolab.diff.bisect import add_bisect_parser

    add_bisect_parser(sub)
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


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser `args` was parsed with (`grpolab diagnose log`'s for `diagnose log ...`):
    at each level, the subparser whose name the level's `dest` holds (every level sets one)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None:
            return parser
        parser = subs[0].choices[name]


def run_train_command(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """Run `grpolab train` (`argv` starts with "train"); return the exit code.

    Exit codes: 0 done, 1 a check failed or the run failed, 2 bad input (a flag, a file, a run
    directory; a bad flag value, input file, router address or router port exits through argparse with
    the train usage, before torch is imported or a run directory made: train/preflight.py), 128 + the
    signal's number when a signal ended it (130 Ctrl+C, 143 SIGTERM).
    """
    from grpolab.train.preflight import check_inputs

    try:
        config = config_from_args(args)
        world = planned_world_size(args.nproc_per_node)
        check_inputs(config, world_size=world)  # flags, files, servers: before torch, any run dir
    except (ValueError, FileNotFoundError) as e:
        subcommand_parser(parser, "train").error(str(e))  # usage: grpolab train …, exit 2
    if args.nproc_per_node is not None and "LOCAL_RANK" not in os.environ:
        return launch_torchrun(args.nproc_per_node, argv)
    if os.environ.get("RANK", "0") == "0":  # one line per run, not per torchrun rank
        print("importing torch and transformers ...", flush=True)  # seconds before the run's first line
    from grpolab.checkers.errors import CheckFailure
    from grpolab.core.interrupts import hold_interrupts, interrupt_exit_code, restore_handlers
    from grpolab.train.loop import train

    try:
        train(config, ["grpolab", *argv], checked=True)
    except CheckFailure as e:
        print(f"grpolab train: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"grpolab train: error: {e}", file=sys.stderr)
        return 2  # bad input: a flag, a file, a run directory
    except RuntimeError as e:
        print(f"grpolab train: error: {peer_gone_message(e) or e}", file=sys.stderr)
        return 1  # the run failed: the engine, a fault, a non-finite loss, a weight sync
    except KeyboardInterrupt as e:
        held = hold_interrupts()  # torchrun signals its ranks again as it stops them: no second traceback
        if os.environ.get("RANK", "0") == "0":  # one line per run, not per torchrun rank
            print("grpolab train: interrupted; the run directory's last event says so", file=sys.stderr)
        if "LOCAL_RANK" in os.environ:  # a torchrun rank: its status is written, its files closed
            # Interpreter teardown with gloo's threads still joinable printed libstdc++'s "terminate
            # called without an active exception" (and aborted) in about 1 run in 3 after SIGTERM.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(interrupt_exit_code(e))
        restore_handlers(held)  # a library caller keeps its handlers
        return interrupt_exit_code(e)  # 130 for Ctrl+C, 143 for SIGTERM
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `grpolab` console script; returns the exit code.

    Ctrl+C (or SIGTERM where the command turns it into KeyboardInterrupt) ends a command with one line
    and 130 (143), never a traceback. A reader that closes stdout early (`grpolab replay inspect F | head`)
    ends the command quietly with 141 (128 + SIGPIPE, what a shell reports for `yes | head`), the way the Python docs
    recommend: stdout is pointed at /dev/null so the interpreter's final flush cannot fail again.
    """
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a pipe closed after the last write surfaces here, inside the try
        return code
    except KeyboardInterrupt as e:  # a command without its own handling (`train` and `serve` have theirs)
        from grpolab.core.interrupts import interrupt_exit_code

        print(f"grpolab {(argv or sys.argv[1:] or [''])[0]}: interrupted".rstrip(), file=sys.stderr)
        return interrupt_exit_code(e)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


SECRET_FLAGS = {
    "--wandb-key": "set WANDB_API_KEY in the environment (or run `wandb login`)",
    "--wandb-host": "set WANDB_BASE_URL in the environment",
}
"""Miles' wandb flags that grpolab does not take: the key stays wandb's business (monitor/wandb_sink.py)."""


def refuse_secret_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Exit 2 on Miles' `--wandb-key` / `--wandb-host`, saying what to set instead, without echoing the
    value (argparse's "unrecognized arguments" line would print the API key)."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            command = argv[0] if argv and argv[0] in ("train", "serve") else None
            target = subcommand_parser(parser, command) if command else parser
            target.error(f"{flag} is not a grpolab flag (its value is not shown): {SECRET_FLAGS[flag]}")


def _dispatch(argv: list[str] | None) -> int:
    """Parse the command line and run the subcommand; returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    refuse_secret_flags(parser, argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse's parse_args would print the top-level usage, not the subcommand's
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "train":
        return run_train_command(parser, args, argv)
    if args.command == "hash":
        return run_hash_command(args)
    if args.command == "agent":
        from grpolab.rollout.agent_command import run_agent_command

        return run_agent_command(args)
    if args.command == "check" and args.check_kind == "parity":
        from grpolab.checkers.parity_command import run_parity_command

        return run_parity_command(args)
    if args.command == "check" and args.check_kind == "resume":
        from grpolab.checkers.resume_command import run_resume_command

        return run_resume_command(args)
    if args.command == "check" and args.check_kind == "turns":
        from grpolab.rollout.turns_command import run_turns_command

        return run_turns_command(args)
    if args.command == "check":
        from grpolab.checkers.template_command import run_check_command

        return run_check_command(args)
    if args.command == "gate":
        from grpolab.checkers.gate_command import run_gate_command

        return run_gate_command(args)
    if args.command == "estimate":
        train_parser = subcommand_parser(parser, "train")
        train_parser.prog, train_parser.usage = (
            "grpolab estimate memory",
            "%(prog)s [TRAIN FLAGS]",
        )  # its errors
        flags = train_parser.parse_args(args.train_flags)
        from grpolab.train.preflight import check_inputs

        world = planned_world_size(flags.nproc_per_node)
        try:
            config = config_from_args(flags)
            check_inputs(config, world_size=world, launching=False)  # what train refuses, refused here too
        except (ValueError, FileNotFoundError) as e:
            train_parser.error(str(e))
        from grpolab.train.estimate import run_estimate_command

        return run_estimate_command(config, world_size=world)
    if args.command == "convert":
        from grpolab.convert.command import run_convert_command

        return run_convert_command(args)
    if args.command == "replay" and args.replay_command == "filter":
        from grpolab.rollout.filter_replay import run_filter_command

        return run_filter_command(args)
    if args.command == "replay":
        from grpolab.replay.cli import run_replay_command

        return run_replay_command(args)
    if args.command == "ui":
        from grpolab.ui.launch import run_ui_command

        return run_ui_command(args)
    if args.command == "serve":
        from grpolab.serve.command import run_serve_command

        return run_serve_command(args, argv)
    if args.command in ("diagnose", "watchdog"):
        from grpolab.diagnose.cli import run_diagnose_command

        return run_diagnose_command(args)
    if args.command == "diff":
        from grpolab.diff.command import run_diff_command

        return run_diff_command(args)
    if args.command == "bisect":
        from grpolab.diff.bisect import run_bisect_command

        return run_bisect_command(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
