"""Starting `grpolab train` on this machine: the device and checkpoint-path checks and the torchrun re-launch.

`--nproc-per-node N` re-runs the same command under torchrun (`torch.distributed.run --standalone`)
and forwards SIGTERM/SIGHUP to it. The device and path checks live here, not in the config: they are
facts about this machine, not about the run, and a GPU run's run.json must read back on a CPU machine.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

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
    """Check what the config names on this machine: the `--device`, `--run-dir` and the checkpoint paths.

    These are facts about the machine, not about the run, so `Config` does not check them: a GPU
    run's run.json, or one whose `--load` directory lives on another host, must read back here.
    Imports torch only for a CUDA device.

    Raises:
        ValueError: a CUDA `--device` on a torch build or machine without CUDA; `--run-dir` or
            `--save` naming a file or a path under one; `--load` naming no directory (each message
            names the flag).
    """
    device = config.model.device
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: this torch build or machine has no CUDA device")
    if config.run.run_dir is not None:
        _check_can_hold_directory(Path(config.run.run_dir), "--run-dir", "")
    save, load = config.checkpoint.save, config.checkpoint.load
    if save is not None:
        _check_can_hold_directory(Path(save), "--save", " for checkpoints")
    if load is not None and not Path(load).is_dir():
        raise ValueError(
            f"--load {load}: no such directory (give the --save directory of a run; "
            "an existing empty directory starts fresh)"
        )


def _check_can_hold_directory(path: Path, flag: str, purpose: str) -> None:
    """`path` is a directory, or can become one: its nearest existing ancestor is a directory.

    `purpose` ends the message: "--save X: is a file; expected a directory for checkpoints"; without
    one, "--run-dir X is a file; expected a directory".

    Raises:
        ValueError: `path` exists and is not a directory (a file, /dev/null), or an ancestor is a file.
    """
    if path.exists():
        if not path.is_dir():
            what = "is a file" if path.is_file() else "exists and is not a directory"
            raise ValueError(f"{flag} {path}{':' if purpose else ''} {what}; expected a directory{purpose}")
        return
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {path}: {parent} is a file, so the directory cannot be made there")
            return


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs `grpolab train` (argv[0] == "train") with `nproc` ranks.

    Every `--nproc-per-node` of `argv` is dropped (the ranks must not re-launch).
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
        "torch.distributed.run",
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
    return run_forwarding_signals(torchrun_command(nproc, argv))


def run_forwarding_signals(cmd: list[str]) -> int:
    """Run `cmd` and pass SIGTERM/SIGHUP sent to this wrapper on to it; return its exit code.

    So `kill`, a watchdog's `--stop-pid` or a scheduler stops the whole torchrun world, not only the
    wrapper (torchrun then stops its ranks, which write status `interrupted`). SIGINT is not
    forwarded: Ctrl+C in a terminal already reaches torchrun through the foreground process group.
    """
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
