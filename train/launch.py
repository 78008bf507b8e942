"""Starting `grpolab train` on this machine: the device and path checks and the torchrun re-launch.

Every path flag the run writes under (`output_directories`: run dir, checkpoints, the folders of the
recording and grad-norm templates, the event mirror) is checked here, in one place, before the run
directory is made; so are `--save` holding another run's checkpoints and `--load`.

`--nproc-per-node N` re-runs the same command under torchrun (`torch.distributed.run --standalone`,
through `torchrun_main`: a failed world ends in one line, not torchrun's traceback) and forwards
SIGTERM/SIGHUP to it. The device and path checks live here, not in the config: they are
facts about this machine, not about the run, and a GPU run's run.json must read back on a CPU machine.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from grpolab.core.devices import check_device_present
from grpolab.core.save_dir import LATEST_FILE, live_writer

if TYPE_CHECKING:
    from grpolab.core.config import Config


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--nproc-per-node N` (ranks on this machine through torchrun) to the `train` parser."""
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="run N ranks on this machine through torchrun (the same as `torchrun --nproc-per-node N -m grpolab train ...`)",
    )


def check_on_this_machine(config: Config) -> None:
    """Check what the config names on this machine: the `--device`, every output path and `--load`.

    These are facts about the machine, not about the run, so `Config` does not check them: a GPU
    run's run.json, or one whose `--load` directory lives on another host, must read back here.
    Imports torch only for a CUDA device.

    Raises:
        ValueError: a CUDA `--device` on a torch build or machine without CUDA; an output path
            that cannot be a directory (`check_output_paths`); `--save` written by another live
            trainer (its lock, core/save_dir.py) or holding another run's checkpoints; `--load` naming a file or nothing (each message names the flag).
    """
    check_device_present(config.model.device, "--device")
    check_output_paths(config)
    save, load = config.checkpoint.save, config.checkpoint.load
    busy = live_writer(save) if save is not None else None
    if busy is not None:
        raise ValueError(busy)
    continuing = load is not None and save is not None and Path(load).resolve() == Path(save).resolve()
    if save is not None and not continuing and (Path(save) / LATEST_FILE).exists():
        raise ValueError(
            f"--save {save} already holds another run's checkpoints; pass --load {save} to continue that run "
            "or choose another --save (they would be overwritten)"
        )
    if load is not None and not Path(load).is_dir():
        if Path(load).exists():
            raise ValueError(
                f"--load {load}: is a file; expected a checkpoint directory (the --save directory of a run, "
                "or one of its iter_* folders)"
            )
        raise ValueError(
            f"--load {load}: no such directory (give the --save directory of a run; "
            "an existing empty directory starts fresh)"
        )


def output_directories(config: Config) -> list[tuple[str, str, Path, str]]:
    """(flag, its value, directory, purpose) of every directory the run writes into.

    `--run-dir` (without it, runs/, where the default run directory goes), `--save`,
    `--save-debug-event-data`, `--wandb-dir`, `--tensorboard-dir` and `--memory-snapshot-dir` are directories; for a path template
    (`--save-debug-rollout-data`, `--ci-save-grad-norm`) it is the template's folder up to its
    first `{placeholder}` (a folder named by a placeholder is made per file, inside that one).
    """
    run, debug, ci, prof = config.run, config.debug, config.ci, config.profiling
    snapshots = prof.memory_snapshot_dir if prof.record_memory_history else None  # used only then
    out = []
    for flag, path, purpose in (
        ("--run-dir", run.run_dir, "") if run.run_dir is not None else ("--run-dir (default)", "runs", ""),
        ("--save", config.checkpoint.save, " for checkpoints"),
        ("--save-debug-event-data", debug.save_debug_event_data, " for events.jsonl"),
        ("--wandb-dir", config.monitoring.wandb_dir, " for wandb's files"),
        ("--tensorboard-dir", config.monitoring.tensorboard_dir, " for TensorBoard files"),
        ("--memory-snapshot-dir", snapshots, " for memory snapshots"),
    ):
        if path is not None:
            out.append((flag, str(path), Path(path), purpose))
    for flag, template in (
        ("--save-debug-rollout-data", debug.save_debug_rollout_data),
        ("--ci-save-grad-norm", ci.ci_save_grad_norm),
    ):
        if template is not None:
            out.append((flag, template, _template_folder(template), " for its files"))
    return out


def _template_folder(template: str) -> Path:
    parts = Path(template).parent.parts
    fixed = parts[: next((i for i, p in enumerate(parts) if "{" in p), len(parts))]
    return Path(*fixed) if fixed else Path(".")


def check_output_paths(config: Config) -> None:
    """Every directory of `output_directories` exists as a writable directory or can be made.

    Raises:
        ValueError: naming the flag, the path and what is wrong (a file, a dangling symbolic link,
            a folder where nothing can be made, such as /proc).
    """
    for flag, value, path, purpose in output_directories(config):
        _check_can_hold_directory(path, flag, purpose, value=value)


def _check_can_hold_directory(path: Path, flag: str, purpose: str, *, value: str | None = None) -> None:
    """`path` is a directory, or can become one: its nearest existing ancestor is a directory.

    `purpose` ends the message: "--save X: is a file; expected a directory for checkpoints"; without
    one, "--run-dir X is a file; expected a directory". `value` is the flag's value when it is not
    `path` (a path template: "--ci-save-grad-norm T: F is a file; expected a directory"). Whether something can be made there is
    tried, not guessed from permissions (root may write anywhere but /proc): a folder with a name of
    its own is made in `path`, or in its nearest existing ancestor, and removed at once.

    Raises:
        ValueError: `path` or an ancestor exists and is not a directory (a file, /dev/null), is a
            symbolic link to nothing, or nothing can be made there (names the OS's reason).
    """
    shown = str(path) if value is None else value
    if path.exists():
        if not path.is_dir():
            what = "is a file" if path.is_file() else "exists and is not a directory"
            if value is not None and value != str(path):
                raise ValueError(f"{flag} {value}: {path} {what}; expected a directory{purpose}")
            raise ValueError(f"{flag} {path}{':' if purpose else ''} {what}; expected a directory{purpose}")
        _try_making(path, shown, flag, purpose)
        return
    for candidate in (path, *path.parents):
        if candidate.is_symlink() and not candidate.exists():
            raise ValueError(
                f"{flag} {shown}: {candidate} is a symbolic link to {os.readlink(candidate)}, which does not "
                f"exist; expected a directory{purpose} (remove the link or make its target)"
            )
        if candidate.exists():
            if not candidate.is_dir():
                raise ValueError(
                    f"{flag} {shown}: {candidate} is a file, so the directory cannot be made there"
                )
            _try_making(candidate, shown, flag, purpose)
            return


def _try_making(folder: Path, shown: str, flag: str, purpose: str) -> None:
    """Make a uniquely named folder in `folder` and remove it; a failure is a ValueError naming `flag`."""
    probe = folder / f".grpolab-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise ValueError(
            f"{flag} {shown}: cannot make a directory{purpose} there ({e.strerror} in {folder})"
        ) from None


def planned_world_size(nproc_per_node: int | None) -> int:
    """The ranks the run will have, known before launch: `--nproc-per-node` (this process re-launches
    under torchrun), else torchrun's WORLD_SIZE (this process is a rank), else 1."""
    if nproc_per_node is not None and "LOCAL_RANK" not in os.environ:
        return max(nproc_per_node, 1)
    return int(os.environ.get("WORLD_SIZE", "1"))


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs `grpolab train` (argv[0] == "train") with `nproc` ranks.

    Every `--nproc-per-node` of `argv` is dropped (the ranks must not re-launch). It runs torchrun's
    arguments through `torchrun_main` (`python -m grpolab.train.launch`), not `-m torch.distributed.run`.
    """
    rest, skip = [], False
    for a in argv[1:]:  # argv[0] is "train"
        if skip or a.startswith("--nproc-per-node="):
            skip = False
            continue
        if a == "--nproc-per-node":
            skip = True
            continue
        rest.append(a)
    return [
        sys.executable,
        "-m",
        "grpolab.train.launch",  # torchrun's own `run`, ending a failed world in one line (`torchrun_main`)
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "grpolab",
        "train",
        *rest,
    ]


def launch_torchrun(nproc: int, argv: list[str]) -> int:
    """Re-run this `grpolab train` command under torchrun with `nproc` ranks; return its exit code.

    Returns 2 (with a message on stderr naming the flag) when `nproc` < 1.
    """
    if nproc < 1:
        print(f"grpolab train: error: --nproc-per-node must be >= 1, got {nproc}", file=sys.stderr)
        return 2
    # what torchrun gives its ranks when OMP_NUM_THREADS is unset, set here so that it does not print
    # its 4-line banner saying so at every start
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return run_forwarding_signals(torchrun_command(nproc, argv), env=env)


def torchrun_main(args: list[str]) -> int:
    """torchrun (`torch.distributed.run`'s `run`) with `args`; a world whose rank failed ends in one line.

    torchrun's own `main` ended a failed world with ~40 lines (its `ChildFailedError` traceback and failure
    table) after the rank's error. Here the failure is one line on stderr naming the first rank that failed
    and its exit code, pointing at the run directory's console.log and events.jsonl, and the exit code is 1
    (what torchrun returned). A signal that stops the world (SIGTERM from the `--nproc-per-node`
    wrapper, Ctrl+C) ends it with 128 + the signal's number and no traceback: torchrun has stopped the
    ranks, and rank 0 already said `interrupted` (torchrun's own `main` ended in its 27-line
    SignalException traceback).
    """
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # its failure report: below
    # torch's elastic loggers each set their own level: the agent's "Received 15 death signal, shutting
    # down workers" line would precede rank 0's `interrupted` line
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.ERROR)
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = (
            f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        )
        others = len(e.failures) - 1
        rest = f"; {others} other rank(s) ended after it" if others else ""
        print(
            f"grpolab train: error: rank {rank} failed ({how}){rest}: its error is above, and in the run "
            "directory's console.log and events.jsonl (`grpolab diagnose log RUN_DIR`)",
            file=sys.stderr,
        )
        return 1
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""gloo's words when another rank's process ended mid-collective (pair.cc: "Connection closed by peer")."""


def peer_gone_message(exc: BaseException) -> str | None:
    """One line for a rank (of a world of 2 or more) whose collective failed because another rank ended,
    else None (a rank > 0 whose rank 0 failed on an engine, or rank 0 whose peer crashed).

    "rank 1 stopped: another rank ended (its error says why)" instead of quoting gloo's internals
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:...").
    """
    rank = int(os.environ.get("RANK", "0"))
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not any(words in str(exc) for words in PEER_GONE):
        return None
    return (
        f"rank {rank} stopped: another rank's process ended during a collective (that rank's error says why)"
    )


def run_forwarding_signals(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Run `cmd` (with the environment `env`, None: this one's) and pass SIGTERM/SIGHUP sent to this
    wrapper on to it; return its exit code.

    So `kill`, a watchdog's `--stop-pid` or a scheduler stops the whole torchrun world, not only the
    wrapper (torchrun then stops its ranks, which write status `interrupted`). SIGINT is not
    forwarded: Ctrl+C in a terminal already reaches torchrun through the foreground process group.
    """
    proc = subprocess.Popen(cmd, env=env)

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


if __name__ == "__main__":  # torchrun_command's entry point: torchrun's arguments
    sys.exit(torchrun_main(sys.argv[1:]))
