"""`grpolab bisect`: the commit that changed a run, found by replaying a recording at each commit.

`grpolab bisect --good REV --bad REV [--repo PATH] --recording TEMPLATE [--num-rollout N]
[--metric KEY ...] [--tol 0] [--timeout S] [--cmd 'TEMPLATE with {run_dir}'] [--output-dir D]
[-- TRAIN FLAGS]`

Each commit git's bisection picks (`bisect_git.next_commit`) is checked out in a temporary worktree and
runs the pinned train-only replay (or `--cmd`) with its own code (`bisect_run`); its run is compared
with the good commit's through `grpolab.diff.diff_runs`. A commit is bad when a metric (one of
`--metric`, or any) differs beyond `--tol` at a common step; skipped when it crashes, does not import,
times out, writes no readable run or shares no step with the good run; good otherwise. With
`--crash-is-bad` (git bisect run's convention) a crash is bad: only a commit that does not import (its
output ends in a SyntaxError/ImportError, or it exits 125), ran another grpolab, or timed out is skipped. Set-up differences alone (the commit
hash is one) never make a commit bad. The good end is run first as the reference, the bad end second
(it must differ, or there is nothing to bisect).

Only committed code runs: a work tree with uncommitted changes is bisected as committed, and the
command says so (stderr and report.json's notes). Everything lands under `--output-dir`
(default ./bisect): `<UTC time>/<hash>` per tested commit (run directory, `.out` with its output),
`<UTC time>/report.json`, and `cache/` (results by `bisect_run.cache_key`).

Exit codes: 0 the first bad commit was named; 1 it could not be (an end's run failed, the bad end does
not differ, or only skipped commits are left); 2 bad input (a --metric the good end's run did not log
included); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 129 hung up (SIGHUP): the run's process
group is killed, the worktree removed and report.json written with the note "interrupted".
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpolab.diff.bisect_git import (
    BisectInputError,
    add_worktree,
    check_range,
    commit_summary,
    find_repo,
    is_dirty,
    next_commit,
    remove_worktree,
    resolve_commit,
)
from grpolab.diff.bisect_interrupt import exit_code, interrupt_on_signals, restore_signals, signals_held
from grpolab.diff.bisect_run import (
    Outcome,
    ReplaySpec,
    cache_key,
    digest_files,
    is_grpolab_repo,
    load_cached,
    recording_files,
    run_commit,
    store_cached,
)

PRIMARY = "train/loss"
"""The metric a bad commit's one-line reason names when it differs at the first divergent step."""
DEFAULT_TIMEOUT_S = 3600.0
"""Per-run limit of `--timeout` when not given: an hour, far above a replay's minutes."""
OWN_FLAGS = ("--run-dir", "--num-rollout", "--load-debug-rollout-data", "--save-debug-rollout-data")
"""Train flags bisect sets for every replay itself: given after `--` they are refused (exit 2)."""
NO_IMPORT = re.compile(r"^(SyntaxError|IndentationError|TabError|ImportError|ModuleNotFoundError)\b", re.M)
"""A crash's last output lines naming one of these: the commit's code does not import (skipped even
with `--crash-is-bad`)."""
WORKTREE_PATH = re.compile(r"\S*/grpolab-bisect-[^/\s]+/worktree(?=/|$|\s)")
"""A tested commit's temporary worktree in a path (`tempfile.mkdtemp(prefix="grpolab-bisect-")`)."""
SKIP_EXIT = 125
"""`git bisect run`'s "cannot test this commit" exit code: always a skip."""


def add_bisect_parser(sub: argparse._SubParsersAction) -> None:
    """Register `grpolab bisect` on the CLI's subparsers."""
    p = sub.add_parser(
        "bisect",
        help="find the commit that changed a run by replaying a recording at each commit",
        description=__doc__.split("\n\n")[1],
        allow_abbrev=False,
    )
    p.add_argument("--good", required=True, metavar="REV", help="a commit whose run is right")
    p.add_argument("--bad", required=True, metavar="REV", help="a later commit whose run differs")
    p.add_argument("--repo", metavar="PATH", help="git repository to bisect (default: the grpolab checkout)")
    p.add_argument("--recording", metavar="TEMPLATE", help="recorded rollouts, a path with {rollout_id}")
    p.add_argument("--num-rollout", type=int, metavar="N", help="rollouts to replay (default: all recorded)")
    p.add_argument("--metric", action="append", default=[], metavar="KEY", help="judge only these metrics")
    p.add_argument("--tol", type=float, default=0.0, help="metric tolerance (default 0: bitwise)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="seconds per run")
    p.add_argument("--cmd", metavar="TEMPLATE", help="shell command writing {run_dir} (a run dir or a log)")
    p.add_argument(
        "--crash-is-bad",
        action="store_true",
        help="a commit whose run crashes is bad, not skipped (skipped: does not import, exit 125, timeout)",
    )
    p.add_argument(
        "--output-dir", default="bisect", metavar="DIR", help="where reports go (default ./bisect)"
    )
    p.add_argument("train_flags", nargs="*", metavar="-- TRAIN FLAGS", help="flags for grpolab train")


@dataclass
class Tested:
    """One tested commit: its summary, outcome, verdict ("good" | "bad" | "skip") and comparison."""

    summary: dict[str, str]
    outcome: Outcome
    verdict: str
    run: str
    reason: str = ""
    diff: Any = None  # grpolab.diff.RunDiff against the good commit's run (None for the good end)

    def to_dict(self) -> dict[str, Any]:
        """JSON form for report.json."""
        s = self.summary
        out = {"commit": s["commit"], "short": s["short"], "subject": s["subject"], "verdict": self.verdict}
        out.update(reason=self.reason, run=self.run, **{k: v for k, v in asdict(self.outcome).items()})
        if self.diff is not None:
            out["first_step"] = self.diff.first_step
            out["metrics"] = [m.key for m in self.diff.metrics]
        return out


@dataclass
class Bisection:
    """The state of one `grpolab bisect`: where it writes, what it runs, what it found."""

    repo: Path
    spec: ReplaySpec
    out_dir: Path
    cache_dir: Path
    metrics: list[str]
    tol: float
    crash_is_bad: bool = False
    notes: list[str] = field(default_factory=list)
    tested: list[Tested] = field(default_factory=list)
    reference: str = ""
    first_bad: Tested | None = None

    def test(self, commit: str) -> Tested:
        """Run (or take from the cache) `commit` and judge it against the reference run."""
        summary = commit_summary(self.repo, commit)
        key = cache_key(commit, self.spec)
        run_dir = self.out_dir / summary["commit"][:12]
        outcome = load_cached(self.cache_dir, key)
        if outcome is not None:
            _link(Path(outcome.run_path), run_dir)
            _link(Path(outcome.output), run_dir.parent / f"{run_dir.name}.out")
        else:
            scratch = Path(tempfile.mkdtemp(prefix="grpolab-bisect-"))
            try:
                worktree = add_worktree(self.repo, commit, scratch / "worktree")
                outcome = run_commit(commit, self.spec, worktree, scratch, run_dir)
            finally:
                with signals_held():
                    remove_worktree(self.repo, scratch / "worktree")
                    shutil.rmtree(scratch, ignore_errors=True)
            store_cached(self.cache_dir, key, outcome)
        tested = self._judge(summary, outcome, str(run_dir if run_dir.exists() else outcome.run_path))
        self.tested.append(tested)
        cached = " (cached)" if outcome.cached else ""
        print(
            f"bisect: {summary['short']} {tested.verdict:<4} {outcome.seconds:7.1f} s{cached}  "
            f"{summary['subject'][:70]}" + (f"  [{tested.reason}]" if tested.reason else ""),
            flush=True,
        )
        return tested

    def _judge(self, summary: dict[str, str], outcome: Outcome, run: str) -> Tested:
        """good / bad / skip of a finished run, against the reference (the good commit's run)."""
        if outcome.status != "ran":
            return self._judge_failed(summary, outcome, run)
        from grpolab.diff import diff_runs
        from grpolab.diff.sources import DiffInputError, read_source

        if not self.reference:
            try:
                read_source(outcome.run_path)
            except DiffInputError as e:
                return Tested(summary, outcome, "skip", run, f"wrote no readable run: {e}")
            return Tested(summary, outcome, "good", run, "reference")
        try:
            d = diff_runs(self.reference, outcome.run_path, tol=self.tol)
        except DiffInputError as e:
            return Tested(summary, outcome, "skip", run, f"wrote no readable run: {e}")
        d.setup = [x for x in d.setup if _unworktree(x.a) != _unworktree(x.b)]
        divergent = [m for m in d.metrics if not self.metrics or m.key in self.metrics]
        if divergent:  # the first step's train/loss when it is among them (the headline), else the first
            first = next(
                (m for m in divergent if m.key == PRIMARY and m.step == divergent[0].step), divergent[0]
            )
            return Tested(summary, outcome, "bad", run, f"{first.key} differs at step {first.step}", d)
        if d.common_steps == 0:
            return Tested(summary, outcome, "skip", run, "no step in common with the good run", d)
        return Tested(summary, outcome, "good", run, "", d)

    def _judge_failed(self, summary: dict[str, str], outcome: Outcome, run: str) -> Tested:
        """A run that did not exit 0: skipped, or bad under `--crash-is-bad` when it crashed after
        importing (not exit 125, no SyntaxError/ImportError in its last output lines)."""
        if outcome.status == "crashed":
            why = f"exit {outcome.exit_code}"
            if outcome.exit_code == SKIP_EXIT:
                return Tested(summary, outcome, "skip", run, f"{why} (cannot be tested)")
            if self.crash_is_bad and not NO_IMPORT.search(outcome.tail):
                return Tested(summary, outcome, "bad", run, f"crashed ({why})")
            return Tested(summary, outcome, "skip", run, why)
        why = "timed out" if outcome.status == "timeout" else "ran another grpolab than the worktree's"
        return Tested(summary, outcome, "skip", run, why)


def _unworktree(value: object) -> object:
    """A set-up value with each commit's temporary worktree path replaced by "<worktree>": a model or
    data path inside the checkout differs between two commits' runs only by that prefix."""
    return WORKTREE_PATH.sub("<worktree>", value) if isinstance(value, str) else value


def _link(target: Path, link: Path) -> None:
    """Point `link` (inside this bisect's directory) at a cached run directory or file."""
    if target.exists() and not link.exists() and target.resolve() != link.resolve():
        link.symlink_to(target.resolve())


def _spec(args: argparse.Namespace, repo: Path) -> ReplaySpec:
    """The replay every commit runs, from the flags (validated).

    Raises:
        BisectInputError: no --recording and no --cmd, --cmd without {run_dir}, --num-rollout < 1,
            --timeout <= 0, or a recording template that matches nothing.
    """
    if args.recording is None and args.cmd is None:
        raise BisectInputError("--recording TEMPLATE is required (or --cmd 'COMMAND {run_dir}')")
    if args.cmd is not None and "{run_dir}" not in args.cmd:
        raise BisectInputError(f"--cmd {args.cmd!r}: must contain {{run_dir}}, where the run is written")
    if args.num_rollout is not None and args.num_rollout < 1:
        raise BisectInputError(f"--num-rollout must be >= 1, got {args.num_rollout}")
    if not args.timeout > 0:
        raise BisectInputError(f"--timeout must be > 0 seconds, got {args.timeout}")
    template, digest, num = None, "", args.num_rollout or 0
    if args.recording is not None:
        template = str(Path(args.recording).expanduser().absolute())
        files = recording_files(template, args.num_rollout)
        digest, num = digest_files(files), len(files)
    flags = [f for f in args.train_flags if f != "--"] if args.train_flags[:1] == ["--"] else args.train_flags
    for flag in flags:
        if flag.split("=", 1)[0] in OWN_FLAGS:
            raise BisectInputError(
                f"-- {flag.split('=', 1)[0]}: bisect sets it for every run itself "
                f"({', '.join(OWN_FLAGS)} are not train flags of a bisection)"
            )
    return ReplaySpec(template, digest, num, tuple(flags), args.cmd, args.timeout, is_grpolab_repo(repo))


def _bisect_dir(output_dir: Path) -> Path:
    """A new `<output_dir>/<UTC time>` directory (suffixed -2, -3 … when that second is taken)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for i in range(1, 1000):
        path = output_dir / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"{output_dir}: could not make a new bisect directory for {stamp}")


def run_bisect_command(args: argparse.Namespace) -> int:
    """Run `grpolab bisect`; returns the exit code (see the module docstring)."""
    try:
        repo = find_repo(args.repo)
        good = resolve_commit(repo, args.good, "--good")
        bad = resolve_commit(repo, args.bad, "--bad")
        check_range(repo, good, bad)
        spec = _spec(args, repo)
    except BisectInputError as e:
        print(f"grpolab bisect: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.output_dir).expanduser().absolute()
    b = Bisection(repo, spec, _bisect_dir(out), out / "cache", list(args.metric), args.tol, args.crash_is_bad)
    if is_dirty(repo):
        b.notes.append(
            f"{repo} has uncommitted changes: bisect runs committed code only (a worktree per commit)"
        )
        print(f"grpolab bisect: note: {b.notes[-1]}", file=sys.stderr)
    previous = interrupt_on_signals()
    try:
        code = _bisect(b, good, bad)
    except KeyboardInterrupt as e:
        b.notes.append("interrupted")
        code = exit_code(e)
        print(f"grpolab bisect: interrupted ({e or 'Ctrl-C'}); tested so far in the report", file=sys.stderr)
    finally:
        restore_signals(previous)
    _write_report(b, good, bad, args, code)
    return code


def _bisect(b: Bisection, good: str, bad: str) -> int:
    """Test the ends, then the commits git picks, and print the result; returns the exit code."""
    ref = b.test(good)
    if ref.verdict != "good":
        return _fail(
            b, f"the --good commit {ref.summary['short']} did not run ({ref.reason}):\n{ref.outcome.tail}"
        )
    b.reference = ref.outcome.run_path
    unlogged = _unlogged_metrics(b)
    if unlogged:
        b.notes.append(unlogged)
        print(f"grpolab bisect: error: {unlogged}", file=sys.stderr)
        return 2
    end = b.test(bad)
    if end.verdict != "bad":
        why = (
            "does not differ from" if end.verdict == "good" else f"could not be compared ({end.reason}) with"
        )
        return _fail(
            b, f"the --bad commit {end.summary['short']} {why} --good: nothing to bisect\n{end.outcome.tail}"
        )
    goods, skipped, bad_now = [good], set(), bad
    while True:
        commit, done = next_commit(b.repo, bad_now, goods, skipped)
        if commit is None:
            break
        t = b.test(commit)
        if t.verdict == "good":
            goods.append(commit)
        elif t.verdict == "bad":
            bad_now = commit
        else:
            skipped.add(commit)
    if len(done) > 1:
        shorts = "\n".join(commit_summary(b.repo, c)["short"] for c in done)
        return _fail(
            b,
            f"There are only 'skip'ped commits left to test.\nThe first bad commit could be any of:\n{shorts}",
        )
    first = next(t for t in b.tested if t.summary["commit"] == bad_now)
    b.first_bad, s = first, first.summary
    print(f"{s['short']} is the first bad commit\n{s['show']}")
    if first.diff is None:  # --crash-is-bad: its run crashed
        print(f"its run {first.reason}:\n{first.outcome.tail}")
        return 0
    print(f"first divergent step: {first.diff.first_step} ({first.reason})")
    print(first.diff.render())
    return 0


def _unlogged_metrics(b: Bisection) -> str:
    """A message naming the `--metric` keys the good end's run did not log ("" when all were)."""
    if not b.metrics:
        return ""
    from grpolab.diff.frames import TIME_COLUMN
    from grpolab.diff.sources import read_source

    logged = {str(k) for k in read_source(b.reference).frame.columns if k != TIME_COLUMN}
    missing = [m for m in b.metrics if m not in logged]
    if not missing:
        return ""
    return f"--metric: no run logged {', '.join(missing)}; logged keys: {', '.join(sorted(logged))}"


def _fail(b: Bisection, message: str) -> int:
    """Say why the bisection cannot name a commit; exit code 1."""
    b.notes.append(message.splitlines()[0])
    print(f"grpolab bisect: {message.rstrip()}", file=sys.stderr)
    return 1


def _write_report(b: Bisection, good: str, bad: str, args: argparse.Namespace, code: int) -> None:
    """`<bisect dir>/report.json`: inputs, every tested commit, the answer, and its diff."""
    from grpolab.core.atomic import atomic_write_json

    first = b.first_bad
    report = {
        "repo": str(b.repo),
        "good": good,
        "bad": bad,
        "recording": b.spec.recording,
        "num_rollout": b.spec.num_rollout,
        "train_flags": list(b.spec.train_flags),
        "cmd": b.spec.cmd,
        "metrics": b.metrics,
        "tol": b.tol,
        "exit_code": code,
        "replays": sum(1 for t in b.tested if not t.outcome.cached),
        "tested": [t.to_dict() for t in b.tested],
        "first_bad": None if first is None else {k: v for k, v in first.summary.items()},
        "diff": None if first is None or first.diff is None else first.diff.to_dict(),
        "notes": b.notes,
    }
    atomic_write_json(b.out_dir / "report.json", report)
    print(f"report: {b.out_dir / 'report.json'}", file=sys.stderr)
