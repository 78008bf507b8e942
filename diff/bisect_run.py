"""One tested commit of `grpolab bisect`: its replay (or `--cmd`), run with that commit's code, cached.

For the grpolab repository itself the worktree is imported as the package: a temporary directory holds
a symlink `grpolab -> worktree` and comes first on PYTHONPATH (before the editable install's finder,
which Python consults after PYTHONPATH), and the run's recorded `environment.git_commit` is checked
against the tested commit. For another repository (a custom reward or loss module) the installed
grpolab runs with the worktree on PYTHONPATH.

Results are cached by a key over the commit, the recording's bytes, the flags and the command
(`cache_key`): a second bisect over the same range re-runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from grpolab.diff.bisect_git import BisectInputError

TAIL_LINES = 20
"""Lines of a failed run's output kept in the report (enough for a Python traceback's last frames)."""


@dataclass(frozen=True)
class ReplaySpec:
    """What every tested commit runs.

    Attributes:
        recording: absolute `--recording` template with `{rollout_id}` (None with `--cmd` alone).
        recording_digest: sha256 over the recording files' bytes ("" without a recording).
        num_rollout: rollouts replayed (`--num-rollout`).
        train_flags: flags after `--`, passed to `grpolab train` as given.
        cmd: the `--cmd` template (with `{run_dir}`), or None for the pinned grpolab replay.
        timeout_s: wall-clock limit of one run in seconds (`--timeout`); past it the commit is skipped.
        self_repo: the repository is grpolab itself (its worktree is imported as the package).
    """

    recording: str | None
    recording_digest: str
    num_rollout: int
    train_flags: tuple[str, ...]
    cmd: str | None
    timeout_s: float
    self_repo: bool


@dataclass
class Outcome:
    """How one commit's run went.

    Attributes:
        commit: full hash. status: "ran" (exit 0), "crashed" (non-zero exit), "timeout", or
            "wrong_code" (the run imported grpolab from elsewhere than the worktree).
        seconds: wall time of the run (of the original run when cached).
        run_path: the run directory or log file the comparison reads.
        output: the file holding the run's stdout and stderr.
        exit_code: the process's exit code (None on timeout). tail: last output lines when not "ran".
        cached: the result came from the cache.
    """

    commit: str
    status: str
    seconds: float
    run_path: str
    output: str
    exit_code: int | None
    tail: str = ""
    cached: bool = False


def recording_files(template: str, num_rollout: int | None) -> list[Path]:
    """The files `template` names for rollouts 0..N-1 (N = `num_rollout`, or as many as exist in a row).

    Raises:
        BisectInputError: the template has no `{rollout_id}`, matches no file, or lacks one of the
            first `num_rollout` rollouts (the message names `--recording` and the missing file).
    """
    from grpolab.replay.paths import LOAD_FLAG, format_path

    try:
        first = Path(format_path(template, 0, flag=LOAD_FLAG))
    except ValueError as e:
        raise BisectInputError(f"--recording: {e}") from None
    if not first.is_file():
        raise BisectInputError(f"--recording {template}: matches nothing ({first} does not exist)")
    files = []
    for i in range(num_rollout if num_rollout is not None else 1 << 20):
        path = Path(format_path(template, i, flag=LOAD_FLAG))
        if not path.is_file():
            if num_rollout is None:
                break
            raise BisectInputError(f"--recording {template}: --num-rollout {num_rollout} needs {path}")
        files.append(path)
    return files


def digest_files(files: list[Path]) -> str:
    """sha256 (hex) over the files' names and bytes, in order: the recording's identity."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def cache_key(commit: str, spec: ReplaySpec) -> str:
    """sha256 (hex) of everything that decides a commit's result: the commit, the recording's bytes,
    the rollouts, the flags, the command and the Python that runs it (not the timeout)."""
    ident = {
        "commit": commit,
        "recording": spec.recording_digest,
        "num_rollout": spec.num_rollout,
        "train_flags": list(spec.train_flags),
        "cmd": spec.cmd,
        "self_repo": spec.self_repo,
        "python": sys.executable,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def replay_argv(spec: ReplaySpec, run_dir: Path) -> list[str]:
    """The pinned train-only replay: `python -m grpolab train --load-debug-rollout-data T
    --debug-deterministic-collective --num-rollout N --run-dir RUN [TRAIN FLAGS]`. On Python >= 3.11,
    `-P` keeps the current directory off sys.path so a `grpolab` folder there cannot shadow the worktree."""
    python = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else [])]
    return [
        *python,
        "-m",
        "grpolab",
        "train",
        "--load-debug-rollout-data",
        str(spec.recording),
        "--debug-deterministic-collective",
        "--num-rollout",
        str(spec.num_rollout),
        "--run-dir",
        str(run_dir),
        *spec.train_flags,
    ]


def run_pythonpath(spec: ReplaySpec, worktree: Path, scratch: Path) -> str:
    """PYTHONPATH for a run at `worktree`, then the caller's own PYTHONPATH.

    For grpolab itself (`spec.self_repo`): `scratch/pkg`, made here, holding the link
    `grpolab -> worktree`; for another repository: the worktree itself.

    Raises:
        FileExistsError: `scratch/pkg/grpolab` exists already (one scratch directory per run).
    """
    if spec.self_repo:
        link_dir = scratch / "pkg"
        link_dir.mkdir(parents=True, exist_ok=True)
        (link_dir / "grpolab").symlink_to(worktree, target_is_directory=True)
        first = str(link_dir)
    else:
        first = str(worktree)
    rest = os.environ.get("PYTHONPATH")
    return first if not rest else first + os.pathsep + rest


def _run(argv: list[str] | str, env: dict[str, str], cwd: Path, log: Path, timeout_s: float) -> int | None:
    """Run a command (a shell string for `--cmd`) with output to `log`; its exit code, None on timeout.
    The command gets its own process group, killed on timeout or when bisect itself is interrupted."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            shell=isinstance(argv, str),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        except BaseException:  # Ctrl-C reaches only our group: end the run's group too
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def _tail(log: Path) -> str:
    """The last TAIL_LINES lines of a run's output."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-TAIL_LINES:])
    except OSError:
        return ""


def _ran_commit(run_dir: Path) -> str | None:
    """`environment.git_commit` of a grpolab run directory (None when unreadable)."""
    from grpolab.rundir.reader import RunDirError, read_run_meta

    try:
        return read_run_meta(run_dir).environment.get("git_commit")
    except RunDirError:
        return None


def run_commit(commit: str, spec: ReplaySpec, worktree: Path, scratch: Path, run_dir: Path) -> Outcome:
    """Run `spec` with `commit`'s code (checked out at `worktree`), writing `run_dir`.

    `--cmd` runs in the worktree with `{run_dir}` replaced (shell-quoted); its result is `run_dir`
    when the command wrote it (a run directory or a Miles/slime log), else its captured output, read
    as a log. The grpolab replay runs in the current directory (relative paths in TRAIN FLAGS work).
    """
    log = run_dir.parent / f"{run_dir.name}.out"
    env = dict(os.environ, PYTHONPATH=run_pythonpath(spec, worktree, scratch), PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    if spec.cmd is not None:
        command: list[str] | str = spec.cmd.replace("{run_dir}", shlex.quote(str(run_dir)))
        code = _run(command, env, worktree, log, spec.timeout_s)
    else:
        code = _run(replay_argv(spec, run_dir), env, Path.cwd(), log, spec.timeout_s)
    seconds = time.monotonic() - t0
    status = "timeout" if code is None else "ran" if code == 0 else "crashed"
    run_path = run_dir if run_dir.exists() or spec.cmd is None else log
    if status == "ran" and spec.cmd is None and spec.self_repo and _ran_commit(run_dir) != commit:
        status = "wrong_code"  # the editable install (or a folder on sys.path) won over the worktree
        with log.open("a") as out:
            out.write(f"\ngrpolab bisect: the run recorded git_commit {_ran_commit(run_dir)}, not {commit}\n")
    tail = "" if status == "ran" else _tail(log)
    return Outcome(commit, status, round(seconds, 3), str(run_path), str(log), code, tail)


def load_cached(cache_dir: Path, key: str) -> Outcome | None:
    """The cached outcome under `key`, if its run directory or log still exists."""
    file = cache_dir / f"{key}.json"
    try:
        raw = json.loads(file.read_text())
        outcome = Outcome(**{k: raw[k] for k in Outcome.__dataclass_fields__ if k in raw})
    except (OSError, ValueError, TypeError):
        return None
    if not Path(outcome.run_path).exists() and outcome.status == "ran":
        return None
    outcome.cached = True
    return outcome


def store_cached(cache_dir: Path, key: str, outcome: Outcome) -> None:
    """Write `outcome` under `key` (timeouts are not cached: a longer --timeout may finish)."""
    if outcome.status == "timeout":
        return
    from grpolab.core.atomic import atomic_write_json

    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cache_dir / f"{key}.json", {**asdict(outcome), "cached": False})


_PYPROJECT_NAME = re.compile(r'^name\s*=\s*"grpolab"\s*$', re.MULTILINE)


def is_grpolab_repo(repo: Path) -> bool:
    """Whether `repo` is a grpolab checkout: its pyproject.toml names the project "grpolab"."""
    try:
        return bool(_PYPROJECT_NAME.search((repo / "pyproject.toml").read_text()))
    except OSError:
        return False
