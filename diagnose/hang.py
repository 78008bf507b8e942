"""`grpolab diagnose hang`: py-spy every rank of a run, confirm the hang and classify it.

Usage: `grpolab diagnose hang RUN_DIR`, `--pid P [P ...]` or `--match PATTERN`. This module is the
I/O around two pure parts: the py-spy parser (stacks.py) and the classifier (classify.py).

1. Find the ranks. RUN_DIR: `ranks/*.json` (rank, pid, host, role, heartbeat, optional "error"
   written when the rank's training loop raised). `--pid`: ranks numbered in the order given.
   `--match`: processes whose `/proc/<pid>/cmdline` matches the regular expression (this command
   and its parents excluded); when some of them have `RANK` in their environment (torchrun sets
   it) only those are ranks, numbered by it, and the rest (launchers) are listed as skipped.
   A rank whose pid is gone (or a zombie) is "exited"; a rank on another host cannot be py-spied
   and is reported as not inspected.
2. Sample twice. `py-spy dump --json` runs on every live local rank at once (one thread per rank,
   each with its own `--timeout`), then again `--interval` seconds later; `--native` is added to
   the last sample only (the comparison ignores native frames, and native unwinding is the
   expensive part). Measured on a 2-rank gloo hang: one `py-spy dump` of a rank takes 12-16 ms
   with or without `--json`, 0.6-0.7 s with `--native`; so the tool attaches once per sample,
   parses the JSON, and writes the human-readable `rank<r>.txt` from the parsed stacks in
   py-spy's own layout instead of attaching a second time for the text.
3. Decide whether the run progressed (`decide_progress`, grpolab's rule):
   - progressed if any `ranks/*.json`, `metrics.jsonl` or `events.jsonl` changed between the
     two samples (a heartbeat, a metric line or an event was written: the run moves);
   - otherwise hung if every rank's stack is identical in both samples (nothing moved in
     `--interval` seconds: the AReaL guide's step 1 "confirm the hang", done by machine);
   - otherwise (some stacks moved) hung only if the newest heartbeat / metrics / event is at least
     `--stall-seconds` old (a loop that runs but never reaches the next phase), else progressed.
     Heartbeats are written at phase boundaries only, so a long rollout moves its stacks while its
     heartbeat ages: stale heartbeats alone never make a hang while the stacks still move within
     the stall window.
   `--interval 0` takes one sample and decides by `--stall-seconds` alone (needs RUN_DIR).
   Without RUN_DIR (`--pid`, `--match`) there are no heartbeats: the two samples decide.
4. Classify (classify.classify), print the verdict, the evidence, the ranks x frame table, the next
   steps and where the dumps are, and keep the dumps in `RUN_DIR/diagnose/<UTC time>/`:
   `rank<r>.txt` (both samples, py-spy layout, or py-spy's error), `rank<r>.json` (the parsed
   samples) and `verdict.json` (the verdict plus its inputs). Without RUN_DIR nothing is written
   unless `--out DIR` is given.

Exit codes: 0 not hung (progress observed, or the run already ended with its final status),
1 hung and classified, 2 could not inspect (the reason is printed: py-spy missing, permission
denied, no such pid, no rank files, every rank gone without a final status, …).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.core.atomic import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:
    from grpolab.diagnose.classify import Verdict
    from grpolab.diagnose.stacks import ProcessStack

DEFAULT_STALL_SECONDS = 120.0
"""`--stall-seconds`: the issue's default; a grpolab phase (rollout, train) on the default config takes
seconds, so two minutes without a heartbeat, metric or event is far outside normal behaviour."""
DEFAULT_INTERVAL_S = 2.0
"""`--interval`: seconds between the two stack samples (grpolab's: long enough for a running loop to
change its frames, short enough to keep the verdict under the 5 s goal for 4 ranks)."""
DEFAULT_TIMEOUT_S = 10.0
"""`--timeout`: seconds one `py-spy dump` may take before that rank is reported as not dumped."""
ACTIVITY_FILES = ("metrics.jsonl", "events.jsonl")
"""Run-directory files whose growth means progress (besides `ranks/*.json`)."""
PY_SPY_FALLBACK_DIRS: tuple[Path, ...] = (Path(sys.executable).parent,)
"""Where to look for py-spy when it is not on PATH: the bin directory of the Python running grpolab,
where `pip install grpolab` put the py-spy dependency (a venv that is not activated)."""
_PERMISSION_RE = re.compile(r"permission|ptrace|operation not permitted|EPERM", re.IGNORECASE)
_GONE_RE = re.compile(r"no such process|check that the process is running|no such file", re.IGNORECASE)


class InspectError(Exception):
    """The ranks could not be inspected (exit code 2); the message names the flag/file and the reason."""


# ---------------------------------------------------------------------------------------- targets
@dataclass
class RankTarget:
    """One rank process to inspect."""

    rank: int
    pid: int
    host: str | None = None
    """Hostname from the rank file; None when found on this machine (`--pid`, `--match`)."""
    role: str | None = None
    heartbeat: dict[str, Any] | None = None
    """The rank file's heartbeat: phase, rollout_id, step, time (Unix seconds)."""
    error: str | None = None
    """The exception the rank recorded before failing (rank file "error")."""
    source: str = ""
    """Where the rank came from: the rank file's path, `--pid` or `--match`."""
    command: str | None = None
    """The process's command line (/proc/<pid>/cmdline), when readable."""

    @property
    def local(self) -> bool:
        """True when the process runs on this machine, so py-spy can reach it."""
        return self.host is None or self.host in _local_hostnames()

    def heartbeat_age_s(self, now: float) -> float | None:
        """Seconds since the rank's last heartbeat, or None without one."""
        t = (self.heartbeat or {}).get("time")
        return max(0.0, now - float(t)) if isinstance(t, (int, float)) else None


def _local_hostnames() -> set[str]:
    name = socket.gethostname()
    return {name, name.split(".")[0], socket.getfqdn(), "localhost"}


def _read_json_retry(path: Path, *, retries: int = 2, wait_s: float = 0.1) -> Any:
    """json.load with a short retry: a rank file may be mid-rewrite by a writer without atomic rename."""
    for attempt in range(retries + 1):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            if attempt == retries:
                raise
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def read_rank_files(run_dir: Path) -> tuple[list[RankTarget], list[str]]:
    """The ranks listed in `run_dir/ranks/*.json`, sorted by rank, and problems with unreadable files.

    Returns:
        (targets, problems): a problem is one line naming a rank file that could not be used.

    Raises:
        InspectError: `run_dir` does not exist, is not a directory, has no `ranks/*.json`, or none
            of its rank files is usable.
    """
    if not run_dir.exists():
        raise InspectError(f"RUN_DIR {run_dir}: no such directory")
    if not run_dir.is_dir():
        raise InspectError(f"RUN_DIR {run_dir}: not a directory (expected a grpolab run directory)")
    files = sorted((run_dir / "ranks").glob("*.json")) if (run_dir / "ranks").is_dir() else []
    if not files:
        what = "is empty" if not any(run_dir.iterdir()) else "has no ranks/*.json"
        raise InspectError(
            f"RUN_DIR {run_dir}: {what} (expected the run directory of `grpolab train`, whose ranks "
            "write ranks/<rank>.json with their pid; for other processes use --pid or --match)"
        )
    targets: list[RankTarget] = []
    problems: list[str] = []
    for path in files:
        try:
            data = _read_json_retry(path)
        except json.JSONDecodeError as e:
            problems.append(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); half-written? skipped")
            continue
        except OSError as e:
            problems.append(f"{path}: unreadable ({e.strerror}); skipped")
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}: expected a JSON object with rank and pid; skipped")
            continue
        pid = data.get("pid")
        rank = data.get("rank", path.stem)
        try:
            rank = int(rank)
        except (TypeError, ValueError):
            problems.append(f"{path}: 'rank' must be an integer, got {rank!r}; skipped")
            continue
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            problems.append(f"{path}: 'pid' must be a positive integer, got {pid!r}; skipped")
            continue
        heartbeat = data.get("heartbeat") if isinstance(data.get("heartbeat"), dict) else None
        error = data.get("error")
        targets.append(
            RankTarget(
                rank=rank,
                pid=pid,
                host=data.get("host") if isinstance(data.get("host"), str) else None,
                role=data.get("role") if isinstance(data.get("role"), str) else None,
                heartbeat=heartbeat,
                error=str(error) if error else None,
                source=str(path),
            )
        )
    newest: dict[int, RankTarget] = {}
    now = time.time()
    for t in sorted(targets, key=lambda t: (t.heartbeat_age_s(now) is None, t.heartbeat_age_s(now) or 0.0)):
        if t.rank in newest:
            problems.append(
                f"{t.source}: rank {t.rank} is also in {newest[t.rank].source}, whose heartbeat is newer; skipped"
            )
        else:
            newest[t.rank] = t
    targets = list(newest.values())
    if not targets:
        raise InspectError(f"RUN_DIR {run_dir}: no usable rank file in ranks/: " + "; ".join(problems))
    targets.sort(key=lambda t: (t.rank, t.pid))
    return targets, problems


def _proc_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) or None


def _proc_env_rank(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in raw.split(b"\0"):
        if entry.startswith(b"RANK="):
            try:
                return int(entry[5:])
            except ValueError:
                return None
    return None


def _proc_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, Z, T, …), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :][:1] or None


def _proc_parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def is_alive(pid: int) -> bool:
    """True when `pid` runs (a zombie, exited but not yet reaped by its parent, counts as gone)."""
    state = _proc_state(pid)
    if state is not None:
        return state not in ("Z", "X")
    if Path("/proc/self").exists():
        return False
    try:  # no /proc (not Linux): signal 0 only checks existence
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ranks_from_pids(pids: Sequence[int]) -> list[RankTarget]:
    """`--pid P …`: rank i is the i-th pid.

    Raises:
        InspectError: a pid is given twice, is not positive, or no such process exists.
    """
    if len(set(pids)) != len(pids):
        raise InspectError(f"--pid: each pid must be given once, got {' '.join(map(str, pids))}")
    targets = []
    for rank, pid in enumerate(pids):
        if pid <= 0:
            raise InspectError(f"--pid {pid}: expected a positive process id")
        if not is_alive(pid):
            raise InspectError(f"--pid {pid}: no such process (it exited or never existed)")
        targets.append(RankTarget(rank=rank, pid=pid, source="--pid", command=_proc_cmdline(pid)))
    return targets


def _own_lineage() -> set[int]:
    """This process and its ancestors: their command lines contain the --match pattern itself."""
    pids, pid = set(), os.getpid()
    while pid and pid not in pids:
        pids.add(pid)
        pid = _proc_parent(pid) or 0
    return pids


def ranks_from_match(pattern: str) -> tuple[list[RankTarget], list[str]]:
    """`--match PATTERN`: processes whose command line matches the regular expression.

    Ranks come from `RANK` in each process's environment when some matches have it (the others are
    launchers such as torchrun's agent, returned as notes), else from pid order. A match whose
    parent also matches with the same command line and RANK (a forked data-loader worker) is
    skipped with a note.

    Raises:
        InspectError: the pattern is not a valid regular expression, or nothing matches.
    """
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise InspectError(f"--match {pattern!r}: not a valid regular expression ({e})") from None
    exclude = _own_lineage()
    found: list[tuple[int, str, int | None]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        pid = int(entry.name)
        cmd = _proc_cmdline(pid)
        if cmd is None or not regex.search(cmd) or not is_alive(pid):
            continue
        found.append((pid, cmd, _proc_env_rank(pid)))
    if not found:
        raise InspectError(
            f"--match {pattern!r}: no running process's command line (/proc/*/cmdline) matches"
        )
    notes: list[str] = []
    matched = {pid: (cmd, rank) for pid, cmd, rank in found}
    workers = {}  # forked children (data-loader workers) inherit the command line and RANK of their rank
    for pid, cmd, rank in found:
        parent = _proc_parent(pid)
        if parent in matched and rank is not None and matched[parent] == (cmd, rank):
            workers[pid] = parent
    for pid, parent in sorted(workers.items()):
        notes.append(
            f"pid {pid} matches but is a forked child of matching pid {parent} (same command line and "
            "RANK: a worker?): skipped"
        )
    found = [f for f in found if f[0] not in workers]
    with_rank = [f for f in found if f[2] is not None]
    if with_rank:
        for pid, _cmd, rank in found:
            if rank is None:
                notes.append(f"pid {pid} matches but has no RANK in its environment (a launcher?): skipped")
        ranks = sorted(with_rank, key=lambda f: (f[2], f[0]))
        if len({f[2] for f in ranks}) != len(ranks):
            notes.append("several matching processes share one RANK (several jobs?): numbered by pid order")
            ranks = [(pid, cmd, i) for i, (pid, cmd, _) in enumerate(sorted(ranks))]
    else:
        ranks = [(pid, cmd, i) for i, (pid, cmd, _) in enumerate(sorted(found))]
    return [RankTarget(rank=int(r), pid=pid, source="--match", command=cmd) for pid, cmd, r in ranks], notes


# ------------------------------------------------------------------------------------- run context
@dataclass
class RunContext:
    """What the run directory says besides the rank files (None fields: not known)."""

    name: str | None = None
    world_size: int | None = None
    final_status: dict[str, Any] | None = None
    """The last `status` event of events.jsonl (finished | failed | interrupted), if the run wrote one."""
    metrics_age_s: float | None = None
    events_age_s: float | None = None


def _tail_lines(path: Path, max_bytes: int = 65536) -> list[str]:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read()
    lines = data.decode(errors="replace").splitlines()
    return lines[1:] if size > max_bytes else lines


def read_run_context(run_dir: Path, now: float) -> RunContext:
    """run.json's name and world size, the final status event and the ages of metrics/events (s)."""
    ctx = RunContext()
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        ctx.name = meta.get("name")
        ctx.world_size = meta.get("world_size")
    except (OSError, ValueError, AttributeError):
        pass
    for name, attr in (("metrics.jsonl", "metrics_age_s"), ("events.jsonl", "events_age_s")):
        try:
            setattr(ctx, attr, max(0.0, now - (run_dir / name).stat().st_mtime))
        except OSError:
            pass
    try:
        for line in reversed(_tail_lines(run_dir / "events.jsonl")):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "status":
                ctx.final_status = record
                break
    except OSError:
        pass
    return ctx


def activity_snapshot(run_dir: Path | None) -> dict[str, tuple[int, int]]:
    """(mtime in ns, size in bytes) of every file whose change means progress; {} without a run dir."""
    if run_dir is None:
        return {}
    paths = [run_dir / name for name in ACTIVITY_FILES] + sorted((run_dir / "ranks").glob("*.json"))
    snap = {}
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        snap[str(path.relative_to(run_dir))] = (st.st_mtime_ns, st.st_size)
    return snap


def changed_files(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """Files created, removed or modified between two `activity_snapshot`s, sorted."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


# ------------------------------------------------------------------------------------------ py-spy
def find_py_spy(explicit: str | None = None) -> str:
    """The py-spy executable: `--py-spy PATH`, else `py-spy` on PATH, else next to this Python.

    Raises:
        InspectError: not found, or `--py-spy` is not an executable file.
    """
    if explicit is not None:
        found = shutil.which(explicit)
        if found is None:
            raise InspectError(f"--py-spy {explicit}: not an executable file")
        return found
    found = shutil.which("py-spy")
    if found is not None:
        return found
    for directory in PY_SPY_FALLBACK_DIRS:
        candidate = shutil.which("py-spy", path=str(directory))
        if candidate is not None:
            return candidate
    raise InspectError(
        "py-spy not found on PATH (it is a grpolab dependency: `pip install py-spy`, or pass --py-spy PATH)"
    )


def py_spy_version(py_spy: str) -> str | None:
    """`py-spy --version` (e.g. "py-spy 0.4.3"), or None when it does not answer within 5 s."""
    try:
        out = subprocess.run([py_spy, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@dataclass
class DumpResult:
    """One `py-spy dump` of one process: the parsed stack or the reason there is none."""

    pid: int
    stack: ProcessStack | None = None
    error: str | None = None
    """py-spy's message, shortened to its first lines, when it failed."""
    failure: str | None = None
    """Why it failed: permission | timeout | gone | failed | unparsable."""
    seconds: float = 0.0
    time: float = 0.0
    """Unix time at which the dump started."""


def _first_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Stack backtrace")]
    out = []
    for ln in lines:
        if re.match(r"^\d+: ", ln) or ln.startswith("at "):  # rust backtrace frames
            break
        out.append(ln)
    return " ".join(out[:n]) or "(no message)"


def dump_stack(
    py_spy: str, pid: int, *, native: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DumpResult:
    """Run `py-spy dump --json --pid PID [--native]` and parse it; never raises for py-spy failures.

    Args:
        timeout_s: seconds before py-spy is killed and the dump reported as `failure="timeout"`.
    """
    cmd = [py_spy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    started, t0 = time.time(), time.perf_counter()
    result = DumpResult(pid=pid, time=started)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        result.error, result.failure = f"py-spy did not answer within --timeout {timeout_s:g} s", "timeout"
    except OSError as e:
        result.error, result.failure = f"could not run {py_spy}: {e.strerror or e}", "failed"
    else:
        if out.returncode != 0:
            message = _first_lines(out.stderr or out.stdout)
            result.error = f"py-spy exited with {out.returncode}: {message}"
            if _PERMISSION_RE.search(out.stderr or ""):
                result.failure = "permission"
            elif _GONE_RE.search(out.stderr or "") or not is_alive(pid):
                result.failure = "gone"
            else:
                result.failure = "failed"
        else:
            from grpolab.diagnose.stacks import parse_pyspy_json

            try:
                stack = parse_pyspy_json(out.stdout, pid=pid)
            except ValueError as e:
                result.error, result.failure = f"py-spy output could not be parsed: {e}", "unparsable"
            else:
                command = stack.command or _proc_cmdline(pid)  # py-spy's JSON leaves it out
                result.stack = dataclasses.replace(stack, command=command)
    result.seconds = time.perf_counter() - t0
    return result


def dump_all(
    py_spy: str, pids: Sequence[int], *, native: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[int, DumpResult]:
    """`dump_stack` on every pid at once (one thread per pid, each bounded by `timeout_s`)."""
    if not pids:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(pids)), thread_name_prefix="py-spy") as pool:
        futures = {
            pid: pool.submit(dump_stack, py_spy, pid, native=native, timeout_s=timeout_s) for pid in pids
        }
        return {pid: f.result() for pid, f in futures.items()}


def render_stack_text(stack: ProcessStack) -> str:
    """A parsed dump in `py-spy dump`'s text layout (Process line, then each thread and its frames)."""
    from grpolab.diagnose.stacks import format_frame

    lines = [f"Process {stack.pid}: {stack.command or '(command unknown)'}", ""]
    for thread in stack.threads:
        status = "active" if thread.active else "idle"
        if thread.owns_gil:
            status += "+gil"
        name = f': "{thread.name}"' if thread.name else ""
        lines.append(f"Thread {thread.thread_id} ({status}){name}")
        lines += [f"    {format_frame(frame)}" for frame in thread.frames]
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- the decision
@dataclass(frozen=True)
class ProgressCheck:
    """Whether the run moved, and the figures the decision used (ages in seconds)."""

    progressed: bool
    reason: str
    interval_s: float
    stall_seconds: float
    newest_activity_age_s: float | None
    files_changed: tuple[str, ...] = ()
    ranks_compared: tuple[int, ...] = ()
    ranks_moved: tuple[int, ...] = ()
    note: str | None = None
    """A caveat on a hang decided by identical stacks while heartbeats are still fresh."""


def decide_progress(
    *,
    files_changed: Sequence[str],
    ranks_compared: Sequence[int],
    ranks_moved: Sequence[int],
    newest_activity_age_s: float | None,
    stall_seconds: float,
    interval_s: float,
) -> ProgressCheck:
    """grpolab's hang confirmation rule (module docstring, step 3); pure.

    Args:
        files_changed: run-directory files that changed between the two samples.
        ranks_compared: ranks dumped in both samples.
        ranks_moved: those of `ranks_compared` whose stacks differ between the samples.
        newest_activity_age_s: seconds since the freshest heartbeat, metrics or event write; None
            without a run directory.
        stall_seconds: `--stall-seconds`.
        interval_s: `--interval` (0: one sample only).
    """
    common = dict(
        interval_s=interval_s,
        stall_seconds=stall_seconds,
        newest_activity_age_s=newest_activity_age_s,
        files_changed=tuple(files_changed),
        ranks_compared=tuple(ranks_compared),
        ranks_moved=tuple(ranks_moved),
    )
    age = newest_activity_age_s
    stale = age is not None and age >= stall_seconds
    age_text = "" if age is None else f"the newest heartbeat/metrics/event is {age:.1f} s old"
    if files_changed:
        shown = ", ".join(files_changed[:4]) + (" …" if len(files_changed) > 4 else "")
        return ProgressCheck(
            True, f"the run wrote {shown} during the {interval_s:g} s between the two samples", **common
        )
    if not ranks_compared:
        if age is None:
            return ProgressCheck(
                False, "no rank could be sampled twice and there is no heartbeat: not confirmed", **common
            )
        if stale:
            return ProgressCheck(False, f"{age_text} (>= --stall-seconds {stall_seconds:g})", **common)
        return ProgressCheck(True, f"{age_text} (< --stall-seconds {stall_seconds:g})", **common)
    if ranks_moved:
        moved = ", ".join(map(str, ranks_moved))
        if stale:
            return ProgressCheck(
                False,
                f"the stacks of rank(s) {moved} changed between samples {interval_s:g} s apart, but {age_text} "
                f"(>= --stall-seconds {stall_seconds:g}): code runs without reaching the next phase",
                **common,
            )
        tail = f" and {age_text} (< --stall-seconds {stall_seconds:g})" if age is not None else ""
        return ProgressCheck(
            True,
            f"the stacks of rank(s) {moved} changed between samples {interval_s:g} s apart{tail}",
            **common,
        )
    reason = f"every rank's stack is identical in two samples {interval_s:g} s apart"
    note = None
    if age is not None:
        reason += f", and no file of the run changed; {age_text}"
        if not stale:
            note = (
                f"the hang is younger than --stall-seconds {stall_seconds:g}; if the ranks are in a long "
                "but legitimate operation, run this command again later"
            )
    return ProgressCheck(False, reason, note=note, **common)


# ------------------------------------------------------------------------------------ orchestration
@dataclass
class HangReport:
    """Everything one `diagnose hang` found: the verdict, its inputs and where the dumps went."""

    verdict: Verdict
    progress: ProgressCheck
    targets: list[RankTarget]
    samples: list[dict[int, DumpResult]]
    """One dict per sample: rank → dump, for the ranks that were dumped (alive and on this host)."""
    alive: dict[int, bool]
    """rank → alive after the last sample (ranks on other hosts: True, their liveness is unknown)."""
    notes: list[str] = field(default_factory=list)
    """Problems that did not stop the diagnosis (unreadable rank files, ranks not dumped, …)."""
    run_dir: Path | None = None
    run: RunContext | None = None
    out_dir: Path | None = None
    py_spy: str = ""
    py_spy_version: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """1 when hung, 0 when progress was observed."""
        return 1 if self.verdict.hung else 0

    def missing_ranks(self) -> dict[int, str]:
        """rank → why it has no stack (exited, another host, py-spy error in the last sample)."""
        out: dict[int, str] = {}
        last = self.samples[-1] if self.samples else {}
        for t in self.targets:
            if not t.local:
                out[t.rank] = (
                    f"on host {t.host}, not this one ({socket.gethostname()}): py-spy only reaches "
                    "processes on its own host; run grpolab diagnose hang there"
                )
            elif not self.alive.get(t.rank, False):
                out[t.rank] = "exited (pid gone)"
            elif t.rank in last and last[t.rank].stack is None:
                out[t.rank] = last[t.rank].error or "not dumped"
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON object `--json` prints and `verdict.json` stores (verdict plus its inputs)."""
        missing = self.missing_ranks()
        return {
            "verdict": self.verdict.to_dict(),
            "hung": self.verdict.hung,
            "exit_code": self.exit_code,
            "run_dir": None if self.run_dir is None else str(self.run_dir),
            "run": None if self.run is None else dataclasses.asdict(self.run),
            "dumps": None if self.out_dir is None else str(self.out_dir),
            "progress": dataclasses.asdict(self.progress),
            "ranks": [
                {
                    "rank": t.rank,
                    "pid": t.pid,
                    "host": t.host,
                    "role": t.role,
                    "source": t.source,
                    "alive": self.alive.get(t.rank, False),
                    "heartbeat": t.heartbeat,
                    "error": t.error,
                    "dumped": t.rank not in missing,
                    "missing_reason": missing.get(t.rank),
                    "dump_seconds": [round(s[t.rank].seconds, 4) for s in self.samples if t.rank in s],
                }
                for t in self.targets
            ],
            "missing_ranks": {str(r): why for r, why in missing.items()},
            "notes": self.notes,
            "py_spy": {"path": self.py_spy, "version": self.py_spy_version},
            "command": {"argv": sys.argv, "options": self.options},
            "elapsed_s": round(self.elapsed_s, 3),
        }


def _liveness(targets: Sequence[RankTarget]) -> dict[int, bool]:
    """rank → alive; ranks on another host count as alive (this host cannot tell)."""
    return {t.rank: is_alive(t.pid) if t.local else True for t in targets}


def _sample(
    py_spy: str, targets: Sequence[RankTarget], *, native: bool, timeout_s: float
) -> dict[int, DumpResult]:
    """One `dump_all` over `targets`, keyed by rank."""
    by_pid = dump_all(py_spy, [t.pid for t in targets], native=native, timeout_s=timeout_s)
    return {t.rank: by_pid[t.pid] for t in targets}


def diagnose_hang(
    targets: list[RankTarget],
    *,
    run_dir: Path | None = None,
    py_spy: str,
    interval_s: float = DEFAULT_INTERVAL_S,
    stall_seconds: float = DEFAULT_STALL_SECONDS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    native: bool = False,
    notes: Iterable[str] = (),
) -> HangReport:
    """Sample every live local rank (twice unless `interval_s` is 0), decide progress and classify.

    Args:
        targets: the ranks (unique rank numbers), from `read_rank_files`, `ranks_from_pids` or
            `ranks_from_match`.
        interval_s, stall_seconds, timeout_s: `--interval`, `--stall-seconds`, `--timeout` (seconds).

    Raises:
        InspectError: no live rank can be dumped (every py-spy failed: the reasons are joined, with a
            hint for permission errors), no rank is alive and the run wrote no final status, or no
            rank has anything to classify (e.g. all on other hosts).
    """
    started = time.perf_counter()
    notes = list(notes)
    run = read_run_context(run_dir, time.time()) if run_dir is not None else None
    alive = _liveness(targets)
    if not any(alive.values()):
        if run is not None and run.final_status is not None:
            return _ended_report(targets, alive, run, run_dir, py_spy, notes, started)
        pids = ", ".join(f"rank {t.rank} pid {t.pid}" for t in targets)
        raise InspectError(
            f"no rank process is alive ({pids})"
            + ("; the run wrote no final status (killed? see console.log)" if run_dir is not None else "")
        )
    before = activity_snapshot(run_dir)
    live_local = [t for t in targets if t.local and alive[t.rank]]
    # --native only on the last sample: unwinding native frames costs 0.1-0.7 s per rank, and the
    # stack comparison looks at Python frames only (ProcessStack.signature), so sample 1 stays cheap.
    samples = [_sample(py_spy, live_local, native=native and interval_s == 0, timeout_s=timeout_s)]
    if live_local and all(d.stack is None for d in samples[0].values()):
        raise InspectError(_no_dump_reason(samples[0], targets))
    if interval_s > 0:
        time.sleep(interval_s)
        still = [t for t in live_local if is_alive(t.pid)]
        samples.append(_sample(py_spy, still, native=native, timeout_s=timeout_s))
    after = activity_snapshot(run_dir)
    alive = _liveness(targets)
    now = time.time()
    compared, moved = [], []
    if len(samples) == 2:
        for t in live_local:
            a, b = samples[0].get(t.rank), samples[1].get(t.rank)
            if a is not None and b is not None and a.stack is not None and b.stack is not None:
                compared.append(t.rank)
                if a.stack.signature() != b.stack.signature():
                    moved.append(t.rank)
    ages = [
        a for a in (t.heartbeat_age_s(now) for t in _refresh_heartbeats(targets, run_dir)) if a is not None
    ]
    if run_dir is not None:
        run = read_run_context(run_dir, now)
        ages += [a for a in (run.metrics_age_s, run.events_age_s) if a is not None]
    progress = decide_progress(
        files_changed=changed_files(before, after),
        ranks_compared=sorted(compared),
        ranks_moved=sorted(moved),
        newest_activity_age_s=min(ages) if ages else None,
        stall_seconds=stall_seconds,
        interval_s=interval_s if len(samples) == 2 else 0.0,
    )
    from grpolab.diagnose.classify import RankObservation, classify

    observations = [
        RankObservation(
            rank=t.rank,
            pid=t.pid,
            alive=alive[t.rank],
            stacks=tuple(s[t.rank].stack for s in samples if t.rank in s and s[t.rank].stack is not None),
            heartbeat_age_s=t.heartbeat_age_s(now),
            heartbeat_phase=(t.heartbeat or {}).get("phase"),
            exception=t.error,
            exit_code=None,  # not knowable for processes that are not our children
        )
        for t in targets
    ]
    try:
        verdict = classify(observations, progressed=progress.progressed)
    except ValueError as e:  # e.g. every live rank is on another host: no stack at all
        raise InspectError("; ".join([str(e), *notes])) from None
    report = HangReport(
        verdict=verdict,
        progress=progress,
        targets=targets,
        samples=samples,
        alive=alive,
        notes=notes,
        run_dir=run_dir,
        run=run,
        py_spy=py_spy,
    )
    for rank, why in report.missing_ranks().items():
        if alive[rank]:
            notes.append(f"rank {rank} not inspected: {why}")
    report.elapsed_s = time.perf_counter() - started
    return report


def _refresh_heartbeats(targets: list[RankTarget], run_dir: Path | None) -> list[RankTarget]:
    """Re-read the rank files into `targets` (a heartbeat or an error may be newer than discovery)."""
    if run_dir is None:
        return targets
    try:
        fresh, _ = read_rank_files(run_dir)
    except InspectError:
        return targets
    by_rank = {t.rank: t for t in fresh}
    for t in targets:
        if t.rank in by_rank and by_rank[t.rank].pid == t.pid:
            t.heartbeat = by_rank[t.rank].heartbeat
            t.error = by_rank[t.rank].error or t.error
    return targets


def _no_dump_reason(sample: dict[int, DumpResult], targets: list[RankTarget]) -> str:
    failures = {d.failure for d in sample.values()}
    lines = [f"rank {rank} (pid {d.pid}): {d.error}" for rank, d in sorted(sample.items())]
    head = "py-spy could not dump any rank"
    if "permission" in failures:
        head = (
            "permission denied: py-spy may not attach to the ranks (ptrace). Run as the ranks' user with "
            "ptrace allowed: `sudo grpolab diagnose hang …`, `sysctl kernel.yama.ptrace_scope=0`, or in "
            "a container `--cap-add SYS_PTRACE`"
        )
    return head + "; " + "; ".join(lines)


def _ended_report(
    targets: list[RankTarget],
    alive: dict[int, bool],
    run: RunContext,
    run_dir: Path | None,
    py_spy: str,
    notes: list[str],
    started: float,
) -> HangReport:
    """No rank is alive and the run wrote its final status: not hung, the run is over."""
    from grpolab.diagnose.classify import RankObservation, classify

    status = run.final_status or {}
    reason = f"the run ended: final status {status.get('status')!r}" + (
        f" ({status.get('error')})" if status.get("error") else ""
    )
    progress = ProgressCheck(True, reason + "; no rank process is alive", 0.0, 0.0, None)
    now = time.time()
    observations = [
        RankObservation(
            rank=t.rank,
            pid=t.pid,
            alive=False,
            stacks=(),
            heartbeat_age_s=t.heartbeat_age_s(now),
            heartbeat_phase=(t.heartbeat or {}).get("phase"),
            exception=t.error,
        )
        for t in targets
    ]
    verdict = dataclasses.replace(
        classify(observations, progressed=True), title=f"Not hung: {reason}; no rank process is alive"
    )
    return HangReport(
        verdict=verdict,
        progress=progress,
        targets=targets,
        samples=[],
        alive=alive,
        notes=notes,
        run_dir=run_dir,
        run=run,
        py_spy=py_spy,
        elapsed_s=time.perf_counter() - started,
    )


# ------------------------------------------------------------------------------------------ output
def _stamp_dir(parent: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path, n = parent / stamp, 1
    while path.exists():
        n += 1
        path = parent / f"{stamp}-{n}"
    return path


def write_dumps(report: HangReport, out_dir: Path) -> None:
    """Write rank<r>.txt, rank<r>.json and verdict.json into `out_dir` (each file atomically).

    Raises:
        OSError: the directory or a file cannot be written.
    """
    from grpolab.diagnose.stacks import stack_to_dict

    out_dir.mkdir(parents=True, exist_ok=True)
    report.out_dir = out_dir
    for t in report.targets:
        dumps = [s[t.rank] for s in report.samples if t.rank in s]
        head = f"# rank {t.rank}, pid {t.pid}" + (f", host {t.host}" if t.host else "")
        parts = [head]
        if not dumps:
            parts.append(f"# not dumped: {report.missing_ranks().get(t.rank, 'no sample')}")
        for i, d in enumerate(dumps, 1):
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(d.time))
            parts.append(f"# sample {i} of {len(dumps)}, {when}, py-spy took {d.seconds:.3f} s")
            parts.append(render_stack_text(d.stack) if d.stack is not None else f"# py-spy failed: {d.error}")
        if t.error:
            parts.append(
                "# the rank recorded this exception:\n"
                + "\n".join(f"#   {ln}" for ln in t.error.splitlines())
            )
        atomic_write_bytes(out_dir / f"rank{t.rank}.txt", ("\n".join(parts).rstrip() + "\n").encode())
        atomic_write_json(
            out_dir / f"rank{t.rank}.json",
            {
                "rank": t.rank,
                "pid": t.pid,
                "host": t.host,
                "alive": report.alive.get(t.rank, False),
                "samples": [
                    {
                        "time": d.time,
                        "seconds": round(d.seconds, 4),
                        "stack": None if d.stack is None else stack_to_dict(d.stack),
                        "error": d.error,
                        "failure": d.failure,
                    }
                    for d in dumps
                ],
            },
        )
    atomic_write_json(out_dir / "verdict.json", report.to_dict())


def format_report(report: HangReport) -> str:
    """The human-readable report: verdict, evidence, table, notes, next steps, dumps."""
    from grpolab.diagnose.classify import render_table

    v = report.verdict
    where = (
        str(report.run_dir)
        if report.run_dir is not None
        else ", ".join(f"pid {t.pid}" for t in report.targets)
    )
    lines = [f"grpolab diagnose hang: {where} ({len(report.targets)} rank{'s' * (len(report.targets) != 1)})"]
    if report.run is not None and report.run.final_status is not None:
        s = report.run.final_status
        lines.append(f"run status: {s.get('status')}" + (f" — {s.get('error')}" if s.get("error") else ""))
    p = report.progress
    lines.append(("progress observed: " if p.progressed else "hang confirmed: ") + p.reason)
    if p.note:
        lines.append(f"note: {p.note}")
    lines += ["", f"verdict: {v.title}"]
    for t in report.targets:
        if t.error and v.hung:  # the failing rank's own exception first (AReaL guide, pattern A)
            lines.append(f"exception recorded by rank {t.rank}:")
            lines += [f"    {ln}" for ln in t.error.splitlines()]
    if v.evidence:
        lines.append("evidence:")
        lines += [f"  - {e}" for e in v.evidence]
    table = render_table(v)
    if table:
        lines += ["", table.rstrip()]
    if report.notes:
        lines += ["", "not inspected / warnings:"]
        lines += [f"  - {n}" for n in report.notes]
    if v.next_steps:
        lines += ["", "next steps:"]
        lines += [f"  {i}. {s}" for i, s in enumerate(v.next_steps, 1)]
    if report.out_dir is not None:
        lines += ["", f"dumps: {report.out_dir}/ (rank<r>.txt, rank<r>.json, verdict.json)"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- CLI
def add_hang_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `grpolab diagnose hang`."""
    parser.add_argument(
        "run_dir",
        nargs="?",
        metavar="RUN_DIR",
        help="a grpolab run directory: its ranks/*.json give every rank's pid, host and heartbeat",
    )
    parser.add_argument(
        "--pid", nargs="+", type=int, metavar="P", help="inspect these processes instead (rank = position)"
    )
    parser.add_argument(
        "--match",
        metavar="PATTERN",
        help="inspect the processes whose command line matches this regular expression "
        "(ranks from their RANK environment variable when set)",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=DEFAULT_STALL_SECONDS,
        help="heartbeats/metrics older than this (seconds) confirm a hang even when stacks move "
        f"(default {DEFAULT_STALL_SECONDS:g})",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between the two stack samples; 0 takes one sample and relies on --stall-seconds "
        f"(needs RUN_DIR) (default {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one py-spy dump may take (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="include native (C/C++) frames in the last sample (py-spy --native)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write the dumps and verdict.json here (default: RUN_DIR/diagnose/<UTC time>/; without "
        "RUN_DIR nothing is written unless --out is given)",
    )
    parser.add_argument("--py-spy", dest="py_spy", metavar="PATH", help="the py-spy executable to use")


def _validate(args: argparse.Namespace) -> None:
    given = [
        name
        for name, value in (("RUN_DIR", args.run_dir), ("--pid", args.pid), ("--match", args.match))
        if value
    ]
    if len(given) != 1:
        raise InspectError(
            "give exactly one of RUN_DIR, --pid P [P ...] or --match PATTERN"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    for flag, value, low in (
        ("--interval", args.interval, 0.0),
        ("--stall-seconds", args.stall_seconds, 0.0),
    ):
        if not value >= low:
            raise InspectError(f"{flag}: expected a number of seconds >= {low:g}, got {value}")
    if not args.timeout > 0:
        raise InspectError(f"--timeout: expected a number of seconds > 0, got {args.timeout}")
    if args.interval == 0 and not args.run_dir:
        raise InspectError(
            "--interval 0 needs RUN_DIR: without heartbeats only two samples can confirm a hang"
        )


def run_hang_command(args: argparse.Namespace) -> int:
    """Run `grpolab diagnose hang` from parsed flags; print the report; return 0, 1 or 2 (module doc)."""
    try:
        _validate(args)
        py_spy = find_py_spy(args.py_spy)
        notes: list[str] = []
        run_dir = Path(args.run_dir) if args.run_dir else None
        if run_dir is not None:
            targets, notes = read_rank_files(run_dir)
        elif args.pid:
            targets = ranks_from_pids(args.pid)
        else:
            targets, notes = ranks_from_match(args.match)
        report = diagnose_hang(
            targets,
            run_dir=run_dir,
            py_spy=py_spy,
            interval_s=args.interval,
            stall_seconds=args.stall_seconds,
            timeout_s=args.timeout,
            native=args.native,
            notes=notes,
        )
    except InspectError as e:
        if getattr(args, "json", False):
            print(json.dumps({"exit_code": 2, "hung": None, "error": str(e)}))
        else:
            print(f"grpolab diagnose hang: could not inspect: {e}", file=sys.stderr)
        return 2
    report.py_spy_version = py_spy_version(py_spy)
    report.options = {k: v for k, v in vars(args).items() if k in _OPTION_NAMES}
    out = Path(args.out) if args.out else (_stamp_dir(run_dir / "diagnose") if run_dir is not None else None)
    if out is not None and report.samples:
        try:
            write_dumps(report, out)
        except OSError as e:
            report.out_dir = None
            report.notes.append(f"could not keep the dumps in {out}: {e.strerror or e}")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(format_report(report))
    return report.exit_code


_OPTION_NAMES = (
    "run_dir",
    "pid",
    "match",
    "stall_seconds",
    "interval",
    "timeout",
    "native",
    "json",
    "out",
    "py_spy",
)
