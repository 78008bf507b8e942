"""`grpolab check resume --steps N --resume-at K -- [TRAIN FLAGS]`: does a killed and resumed run continue
as if nothing happened? (The Miles-101 manual's long-runs chapter: "the run continues at the next step".)

Three `grpolab train` processes with the same flags, in fresh run and checkpoint folders under
`--work-dir` (a temporary folder by default):

1. straight: N rollouts, `--save` at the end (beside the second: their numbers do not depend on load);
2. killed: N rollouts with a checkpoint after rollout K − 1 (`--save-interval K`), SIGKILLed (its
   whole process group: a torchrun world too) as soon as that checkpoint is complete;
3. resumed: `--load` of that checkpoint, N rollouts, `--save` at the end (`--resume-extra` flags added
   here only, to ask whether changing them on resume changes the run).

Then every `rollout`, `step` and `eval` record of the straight run (timings left out: `perf` records and
`*_time` keys) is compared with the killed run's before rollout K and the resumed run's from K on, key by
key and exactly (NaN equals NaN), and the final weights bitwise. Exit 0 when all agree; 1 naming the
first differing metric (kind, step, key, both values) or tensor; 2 bad input (the train flags: the first
process's own exit-2 message is shown; flags this command sets itself; K outside 1..N−1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROG = "grpolab check resume"
OWN_FLAGS = (
    "--run-dir",
    "--save",
    "--save-interval",
    "--load",
    "--num-rollout",
    "--debug-exit-after-rollout",
)
"""Flags the oracle sets itself: refused among the train flags."""
POLL_S = 0.2
"""Seconds between looks for the checkpoint the killed run must reach."""


def add_resume_parser(kinds: argparse._SubParsersAction) -> None:
    """Add `resume` to `grpolab check`'s kinds (imports no torch)."""
    p = kinds.add_parser(
        "resume",
        help="run N rollouts straight and K + (N - K) with a kill and --load between: every metric and the "
        "final weights must match",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--steps", type=int, required=True, metavar="N", help="rollouts of each run (>= 2)")
    p.add_argument(
        "--resume-at", type=int, required=True, metavar="K", help="the rollout the resumed run starts at"
    )
    p.add_argument(
        "--work-dir", metavar="DIR", help="where the three runs go (default: a temporary folder, removed)"
    )
    p.add_argument("--resume-extra", default="", metavar="FLAGS", help="flags added to the resumed run only")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds each run may take")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("train_flags", nargs=argparse.REMAINDER, metavar="-- TRAIN FLAGS")


def _check_args(args: argparse.Namespace) -> list[str]:
    """The train flags (after `--`), validated.

    Raises:
        ValueError: N < 2, K outside 1..N−1, or a flag the oracle sets itself.
    """
    flags = list(args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags)
    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2 (a kill needs a rollout on each side), got {args.steps}")
    if not 1 <= args.resume_at < args.steps:
        raise ValueError(
            f"--resume-at must be in 1..{args.steps - 1} (--steps {args.steps}), got {args.resume_at}"
        )
    own = sorted({f.split("=", 1)[0] for f in flags} & set(OWN_FLAGS))
    if own:
        raise ValueError(f"{', '.join(own)}: set by {PROG} itself (each run gets its own folders); drop them")
    return flags


def _train(argv: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "grpolab", "train", "--no-progress", *argv], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen, log: Path, what: str, timeout: float) -> None:
    """Wait for a run; a failure raises with its last lines (ValueError for its exit 2: bad input)."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"the {what} run took more than --timeout {timeout:g} s (log: {log})") from None
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
        error = ValueError if code == 2 else RuntimeError
        raise error(f"the {what} run exited {code} (log: {log}):\n{tail}")


def _kill_after_checkpoint(proc: subprocess.Popen, ckpt: Path, log: Path, timeout: float) -> None:
    """SIGKILL `proc`'s process group once `ckpt/trainer_state.json` exists (or let it end first)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not (ckpt / "trainer_state.json").exists():
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    elif proc.returncode != 0:
        _finish(proc, log, "killed", timeout)
    if not (ckpt / "trainer_state.json").exists():
        raise RuntimeError(f"the killed run never wrote its checkpoint {ckpt} (log: {log})")


def _records(run_dir: Path, keep: object) -> dict[tuple[str, int], dict[str, float]]:
    """(kind, step) -> metrics of the rollout, step and eval records whose rollout `keep(rollout_id)`s (a
    rollout or eval record's number is its rollout id, a step record's its optimizer step)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # the killed run's last line, cut by the kill
            continue
        rollout = r.get("rollout_id")
        if r["kind"] in ("rollout", "step", "eval") and rollout is not None and keep(rollout):  # type: ignore[operator]
            number = r["step"] if r.get("step") is not None else rollout  # a rollout record: its rollout id
            out[(r["kind"], number)] = {k: v for k, v in r["metrics"].items() if not k.endswith("_time")}
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare_runs(straight: Path, killed: Path, resumed: Path, k: int) -> list[str]:
    """Every difference, in step order: `kind N key: straight A, resumed B` lines (empty: the same)."""
    want = _records(straight, lambda r: True)
    got = {**_records(killed, lambda r: r < k), **_records(resumed, lambda r: r >= k)}
    lines = []
    for key in sorted(set(want) | set(got), key=lambda t: (t[1], t[0])):
        a, b = want.get(key), got.get(key)
        if a is None or b is None:
            lines.append(f"{key[0]} {key[1]}: only in the {'straight' if b is None else 'resumed'} run")
            continue
        for name in sorted(set(a) | set(b)):
            if not _same(a.get(name), b.get(name)):
                lines.append(f"{key[0]} {key[1]} {name}: straight {a.get(name)!r}, resumed {b.get(name)!r}")
    return lines


def compare_weights(a: Path, b: Path) -> list[str]:
    """The tensors of two model.safetensors files that differ (names, shapes or any bit)."""
    import torch
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    lines = [f"tensor {n}: only in one run" for n in sorted(set(x) ^ set(y))]
    for n in sorted(set(x) & set(y)):
        if x[n].shape != y[n].shape or not torch.equal(x[n], y[n]):
            lines.append(f"tensor {n}: max |Δ| {float((x[n].double() - y[n].double()).abs().max()):.3g}")
    return lines


def run_resume_command(args: argparse.Namespace) -> int:
    """Run `grpolab check resume`; return the exit code (see the module docstring)."""
    try:
        flags = _check_args(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    n, k = args.steps, args.resume_at
    # a temporary work folder is removed once the runs are compared, kept when one failed: its logs are cited
    temporary = not args.work_dir
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="grpolab-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()) and args.work_dir:
        print(
            f"{PROG}: error: --work-dir {work} is not empty (nothing existing is replaced)",
            file=sys.stderr,
        )
        return 2
    common = [*flags, "--num-rollout", str(n)]
    try:
        straight = _train([*common, "--run-dir", str(work / "straight"), "--save", str(work / "ckpt_straight")],
                          work / "straight.log")  # fmt: skip
        killed = _train([*common, "--run-dir", str(work / "killed"), "--save", str(work / "ckpt_killed"),
                         "--save-interval", str(k)], work / "killed.log")  # fmt: skip
        ckpt = work / "ckpt_killed" / f"iter_{k:07d}"
        try:  # the two run side by side: their numbers do not depend on the load
            _kill_after_checkpoint(killed, ckpt, work / "killed.log", args.timeout)
            _finish(straight, work / "straight.log", "straight", args.timeout)
        finally:
            for proc in (straight, killed):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        resumed = _train([*common, *args.resume_extra.split(), "--run-dir", str(work / "resumed"), "--load",
                          str(ckpt), "--save", str(work / "ckpt_resumed")], work / "resumed.log")  # fmt: skip
        _finish(resumed, work / "resumed.log", "resumed", args.timeout)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except BaseException:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
        raise
    diffs = compare_runs(work / "straight", work / "killed", work / "resumed", k)
    final = f"iter_{n:07d}/model.safetensors"
    diffs += compare_weights(work / "ckpt_straight" / final, work / "ckpt_resumed" / final)
    if temporary:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"steps": n, "resume_at": k, "same": not diffs, "differences": diffs}))
    elif diffs:
        print(f"{PROG}: resumed at rollout {k} of {n}, the run is NOT the straight one; first: {diffs[0]}")
        for line in diffs[1:20]:
            print(f"  {line}")
    else:
        print(f"{PROG}: resumed at rollout {k} of {n} after a kill: every metric and the final weights are the "
              "straight run's, bit for bit")  # fmt: skip
    return 1 if diffs else 0
