"""Read a run directory: the one parser of run.json, metrics.jsonl, events.jsonl and ranks/*.json.

The writer (`rundir/writer.py`) and this module are the only code that knows the file layout:
`run.json` (written first: name, config, argv, seed, start_time, environment, world_size,
backend of the first start; "starts": every start's argv, start_time, pid), `metrics.jsonl` (one
record per line: kind, rollout_id, step, time, metrics; `RESUME_KIND` marks a continued start),
`events.jsonl` (lifecycle events, a final `status` event last), `ranks/<rank>.json` (pid, host,
role, heartbeat, error), `console.log`. Everything else (gate, UI, diagnose, benchmarks) reads a
run through the functions here; a run's status is decided here only (`rundir/status.py`).

Files may be read while the run writes them: a JSON-lines file may end in a half-written line
(no trailing newline), which is skipped and flagged, never raised. Importing this module imports
neither torch, pandas nor transformers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.rundir.foreign_logs import MetricRecord

# The events' final status, the rank files and the status rule live in status.py; they are part
# of the reader's API.
from grpolab.rundir.status import (
    EVENTS_FILE,
    FINAL_STATUSES,
    HEARTBEAT_TIMEOUT_S,
    RANKS_DIR,
    TAIL_BYTES,
    RankRecord,
    RunStatus,
    decide_status,
    final_status_event,
    live_heartbeat_times,
    rank_is_gone,
    read_ranks,
    run_status,
    status_event_of,
)

if TYPE_CHECKING:
    from grpolab.core.config import Config

RUN_JSON = "run.json"
METRICS_FILE = "metrics.jsonl"
CONSOLE_LOG = "console.log"
RESUME_KIND = "resume"
"""The kind of the metrics.jsonl line a `--load` start writes when it continues a run directory
(`RunDirectory.resumed`): the records above it with rollout_id >= its rollout_id were logged by an
earlier start after its last checkpoint, and this start re-runs them; `read_metrics_file` drops them."""
RUN_MARKERS = (RUN_JSON, METRICS_FILE, EVENTS_FILE, RANKS_DIR)
"""A folder holding any of these is a run directory (a run that crashed before run.json counts)."""


class RunDirError(ValueError):
    """A run directory or one of its files cannot be read as such; the message names the file."""


def is_run_dir(path: str | Path) -> bool:
    """True when `path` is a folder holding any of `RUN_MARKERS`."""
    p = Path(path)
    return p.is_dir() and any((p / name).exists() for name in RUN_MARKERS)


# ---------------------------------------------------------------------------------- JSON lines
@dataclass
class JsonLines:
    """Parsed objects of a .jsonl file and what was skipped.

    Attributes:
        rows: the JSON objects in file order.
        line_nos: 1-based line number of each row (same length as `rows`).
        partial_last_line: the file ended in a line without newline that did not parse
            (a writer mid-line); it was skipped.
        bad_lines: 1-based numbers of other lines that did not parse as a JSON object.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    line_nos: list[int] = field(default_factory=list)
    partial_last_line: bool = False
    bad_lines: list[int] = field(default_factory=list)


def _parse_lines(data: bytes, *, first_line_no: int = 1) -> JsonLines:
    out = JsonLines()
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            out.rows.append(obj)
            out.line_nos.append(i + first_line_no)
        elif i == last and not complete:
            out.partial_last_line = True
        else:
            out.bad_lines.append(i + first_line_no)
    return out


def read_jsonl(path: str | Path) -> JsonLines:
    """Read a JSON-lines file; a missing file gives an empty result. Blank lines are ignored.

    Raises:
        OSError: the file exists but cannot be read.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return JsonLines()
    return _parse_lines(data)


def read_jsonl_tail(path: str | Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The JSON objects among the last `max_bytes` bytes of a .jsonl file, oldest first.

    For big live files where only the newest records matter (ages, the last status). A line cut
    by the start of the window and a half-written last line are skipped; a missing or unreadable
    file gives [].
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    if start > 0:
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return _parse_lines(data).rows


# ---------------------------------------------------------------------------------- run.json
@dataclass(frozen=True)
class RunMeta:
    """run.json, read once.

    Attributes:
        path: the run directory; name: the run's name (the folder's name when run.json has none).
        argv: the command line as recorded; seed: the run's seed; start_time: unix seconds.
        world_size: ranks in the run (None for runs written before it was recorded).
        backend: torch.distributed backend of the run (gloo | nccl | det_gloo), None when unknown.
        environment: the environment fingerprint (versions, devices, determinism switches).
        config: the resolved config (`Config.from_dict` of run.json's "config"), None when it does
            not parse here; config_error then says why (e.g. a CUDA run read on a CPU machine).
        raw: run.json as parsed (for fields this class does not name).
    """

    path: Path
    name: str
    argv: list[str]
    seed: int | None
    start_time: float | None
    world_size: int | None
    backend: str | None
    environment: dict[str, Any]
    config: Config | None
    config_error: str | None
    raw: dict[str, Any]

    @property
    def config_dict(self) -> dict[str, Any]:
        """run.json's "config" as written (component → field → value; {} when absent)."""
        cfg = self.raw.get("config")
        return cfg if isinstance(cfg, dict) else {}

    def _model_field(self, name: str) -> Any:
        if self.config is not None:
            return getattr(self.config.model, name)
        model = self.config_dict.get("model")
        return model.get(name) if isinstance(model, dict) else None

    @property
    def device(self) -> str | None:
        """The run's device, config.model.device (cpu, cuda, cuda:0 …). When the config does not
        parse here, the same field of run.json's nested config as written; None when absent."""
        value = self._model_field("device")
        return value if isinstance(value, str) else None

    @property
    def model(self) -> str | None:
        """The run's --hf-checkpoint (config.model.hf_checkpoint), None when absent."""
        value = self._model_field("hf_checkpoint")
        return value if isinstance(value, str) else None


def _opt(raw: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = raw.get(key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _parse_config(raw: dict[str, Any]) -> tuple[Config | None, str | None]:
    from grpolab.core.config import Config

    data = raw.get("config")
    if not isinstance(data, dict):
        return None, f"{RUN_JSON} has no config object"
    try:
        return Config.from_dict(data), None
    except (ValueError, TypeError) as e:
        return None, f"{RUN_JSON} config does not parse here: {e}"


def read_run_meta(run_dir: str | Path) -> RunMeta:
    """Read `run_dir/run.json`.

    Raises:
        RunDirError: run.json is missing, unreadable, not JSON or not an object (the message names
            the file). A config that does not parse is not an error: `config` is None and
            `config_error` says why.
    """
    path = Path(run_dir)
    file = path / RUN_JSON
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunDirError(
            f"{file}: no such file (not a run directory, or the run died before writing it)"
        ) from None
    except OSError as e:
        raise RunDirError(f"{file}: unreadable ({e.strerror or e})") from None
    except ValueError as e:
        raise RunDirError(f"{file}: not valid JSON ({e}); half-written?") from None
    if not isinstance(raw, dict):
        raise RunDirError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    config, error = _parse_config(raw)
    argv = raw.get("argv")
    env = raw.get("environment")
    return RunMeta(
        path=path,
        name=str(raw.get("name") or path.name),
        argv=[str(a) for a in argv] if isinstance(argv, list) else [],
        seed=_opt(raw, "seed", int),
        start_time=_opt(raw, "start_time", (int, float)),
        world_size=_opt(raw, "world_size", int),
        backend=_opt(raw, "backend", str),
        environment=env if isinstance(env, dict) else {},
        config=config,
        config_error=error,
        raw=raw,
    )


# ---------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class MetricsFile:
    """metrics.jsonl read as records.

    Attributes:
        path: the file read; records: every metric record in file order (`MetricRecord.line_no`
            is its 1-based line); bad_lines: (line, why) of complete lines that are not metric
            records; partial_last_line: a half-written last line was skipped (a live writer);
        non_numeric: line → {key: the value as JSON} of metric values that are not numbers (null,
            a string, an object...), which `metric_record` drops from that line's record.
        replaced: lines of records that a later start of the run re-ran (left out of `records`; see
            `RESUME_KIND`).
    """

    path: Path
    records: list[MetricRecord]
    bad_lines: list[tuple[int, str]]
    partial_last_line: bool
    non_numeric: dict[int, dict[str, str]] = field(default_factory=dict)
    replaced: list[int] = field(default_factory=list)


def _index(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"index {value!r} is not a number")
    return int(value)


def _is_number(value: Any) -> bool:
    """A metric value a record keeps (bools count, as 0/1)."""
    return isinstance(value, int | float)


def metric_record(obj: dict[str, Any], line_no: int = 0) -> MetricRecord:
    """One metrics.jsonl object → MetricRecord (non-numeric metric values are dropped).

    Raises:
        ValueError: "kind" is not a string, "metrics" is not an object, or step / rollout_id is
            neither a number nor null.
    """
    kind, metrics = obj.get("kind"), obj.get("metrics")
    if not isinstance(kind, str):
        raise ValueError(f"'kind' must be a string, got {kind!r}")
    if not isinstance(metrics, dict):
        raise ValueError(f"'metrics' must be an object, got {type(metrics).__name__}")
    values = {str(k): float(v) for k, v in metrics.items() if _is_number(v)}
    t = obj.get("time")
    side = obj.get("side")
    return MetricRecord(
        kind=kind,
        rollout_id=_index(obj.get("rollout_id")),
        step=_index(obj.get("step")),
        metrics=values,
        time=float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None,
        side=side if isinstance(side, str) else None,
        line_no=line_no,
    )


def read_metrics_file(path: str | Path) -> MetricsFile:
    """Read a metrics.jsonl file (a missing file gives no records).

    In a continued run directory each `RESUME_KIND` line replaces the records above it whose
    rollout_id is at least its own: `records` holds each rollout's records of the start that
    ran it last, and the marker lines themselves are no records.

    Raises:
        OSError: the file exists but cannot be read.
    """
    lines = read_jsonl(path)
    records: list[MetricRecord] = []
    bad = [(n, "not a JSON object") for n in lines.bad_lines]
    dropped: dict[int, dict[str, str]] = {}
    replaced: list[int] = []
    for obj, n in zip(lines.rows, lines.line_nos, strict=True):
        try:
            record = metric_record(obj, n)
        except ValueError as e:
            bad.append((n, str(e)))
            continue
        if record.kind == RESUME_KIND and record.rollout_id is not None:
            first = record.rollout_id
            replaced += [r.line_no for r in records if r.rollout_id is not None and r.rollout_id >= first]
            records = [r for r in records if r.rollout_id is None or r.rollout_id < first]
            continue
        records.append(record)
        odd = {str(k): json.dumps(v) for k, v in obj["metrics"].items() if not _is_number(v)}
        if odd:
            dropped[n] = odd
    return MetricsFile(Path(path), records, sorted(bad), lines.partial_last_line, dropped, sorted(replaced))


def read_metrics(run_dir: str | Path, kind: str | None = None) -> list[MetricRecord]:
    """The run's metric records in file order, all or those of one `kind` (rollout | step | perf |
    eval); lines that are not records are skipped (see `read_metrics_file` for them).

    Raises:
        OSError: metrics.jsonl exists but cannot be read.
    """
    records = read_metrics_file(Path(run_dir) / METRICS_FILE).records
    return records if kind is None else [r for r in records if r.kind == kind]


# ---------------------------------------------------------------------------------- events
def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """events.jsonl objects in file order ([] when missing; a half-written last line is skipped).

    Raises:
        OSError: the file exists but cannot be read.
    """
    return read_jsonl(Path(run_dir) / EVENTS_FILE).rows


__all__ = [
    "FINAL_STATUSES",
    "HEARTBEAT_TIMEOUT_S",
    "RankRecord",
    "RunStatus",
    "decide_status",
    "live_heartbeat_times",
    "rank_is_gone",
    "read_ranks",
    "run_status",
    "CONSOLE_LOG",
    "EVENTS_FILE",
    "METRICS_FILE",
    "RANKS_DIR",
    "RUN_JSON",
    "RESUME_KIND",
    "RUN_MARKERS",
    "JsonLines",
    "MetricsFile",
    "RunDirError",
    "RunMeta",
    "final_status_event",
    "is_run_dir",
    "metric_record",
    "read_events",
    "read_jsonl",
    "read_jsonl_tail",
    "read_metrics",
    "read_metrics_file",
    "read_run_meta",
    "status_event_of",
]
