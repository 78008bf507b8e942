"""RunStore: the one read-only door the UI pages use to reach runs (TensorBoard DataProvider style).

Sources under each RUNS_ROOT: our run directories (a folder holding run.json, the metrics,
events.jsonl or ranks/; read with `grpolab.rundir.reader`) and foreign console logs (`*.log`,
`*.out` files outside run directories: Miles/slime logs, read with `grpolab.rundir.foreign_logs`,
the parser `grpolab gate` uses). Both come out in one shape: `read_scalars` → a frame indexed by
(run, kind, step) where step is the train step for `step` rows and the rollout id for every other
kind.

Diagnose outputs: `read_hang_reports` gives each `grpolab diagnose hang` report kept under
RUN_DIR/diagnose/<UTC stamp>/ (verdict.json and the rank<r>.txt dumps), `read_diagnose` any other
JSON there, and `read_log_findings` runs the log doctor (`grpolab diagnose log`) on a run's
console.log or on a console log itself.

Every file read is cached by (size, mtime_ns): a call returns the very same object until one
of the files behind it changes. Caches are bounded (LRU). A half-written last line of a live run
is skipped. Nothing here writes.

Status of a run directory: `rundir.reader.decide_status` (the final `status` event's value:
finished | failed | interrupted; without one, "running" when a rank heartbeat is younger than
`heartbeat_timeout_s` (5 min), else "crashed"); "incomplete" when run.json is missing or unreadable.
A console log carries no status: "running" when it grew in the last 5 minutes, else "ended".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from grpolab.diagnose.gpu import GPU_FILE
from grpolab.diagnose.logdoctor import FileScan, read_run_outcome, scan_file
from grpolab.replay import logprobs
from grpolab.replay.recording import RolloutRecording, load_rollout
from grpolab.rundir import reader, recordings
from grpolab.rundir.completion import RunCompletion, run_completion
from grpolab.rundir.foreign_logs import MetricRecord, ParsedLog, parse_file
from grpolab.ui import discovery, readers, stored_reports
from grpolab.ui.run_summary import RunInfo, directory_summary, log_summary
from grpolab.ui.stored_reports import HANG_VERDICT, RANK_DUMP, StoredHangReport, read_text, stamp_order


def _read_meta(run_json: Path) -> reader.RunMeta | str:
    """run.json read by the reader, or why it cannot be (the RunDirError's message)."""
    try:
        return reader.read_run_meta(run_json.parent)
    except reader.RunDirError as e:
        return str(e)


def _scan_log(path: Path) -> FileScan:
    """The log doctor's scan of one file; an unreadable file gives a FileScan with `error` set. A run
    directory's console.log is scanned with the run's rank errors, as `grpolab diagnose log RUN_DIR`."""
    run = read_run_outcome(path.parent) if (path.parent / reader.RANKS_DIR).is_dir() else None
    try:
        return scan_file(path, name=path.name, run=run)
    except OSError as e:
        return FileScan(file=path.name, error=e.strerror or str(e))


class RunStore:
    """Read-only access to the runs under one or more RUNS_ROOTs.

    Args:
        roots: run directories, log files, or folders holding them (searched 3 levels deep).
        heartbeat_timeout_s: a run without a status event whose newest heartbeat is older is "crashed".
        cache_entries: bound of each cache.
    """

    def __init__(
        self,
        roots: Sequence[str | Path],
        *,
        heartbeat_timeout_s: float = reader.HEARTBEAT_TIMEOUT_S,
        cache_entries: int = 256,
    ) -> None:
        self.roots = [Path(r).expanduser() for r in roots]
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._files = readers.LRU(cache_entries)
        self._scalars = readers.LRU(32)
        self._recomputed = readers.LRU(16)
        self._paths: dict[str, tuple[Path, str]] = {}
        self.problems: list[str] = []

    # ------------------------------------------------------------------ cached file access
    def _cached(self, path: Path, kind: str, load: Callable[[Path], Any], sig: Any = False) -> Any:
        """`load(path)`, cached until `sig` (default: the file's size and mtime) changes."""
        sig = readers.file_signature(path) if sig is False else sig
        key = (kind, str(path))
        hit = self._files.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1]
        return self._files.put(key, (sig, load(path)))[1]

    def _jsonl(self, path: Path) -> reader.JsonLines:
        return self._cached(path, "jsonl", reader.read_jsonl)

    def _metrics(self, path: Path) -> reader.MetricsFile:
        return self._cached(path / reader.METRICS_FILE, "metrics", reader.read_metrics_file)

    def _meta(self, path: Path) -> reader.RunMeta | str:
        return self._cached(path / reader.RUN_JSON, "meta", _read_meta)

    def _ranks(self, path: Path) -> list[reader.RankRecord]:
        files = sorted((path / reader.RANKS_DIR).glob("*.json"))
        sig = tuple((f.name, readers.file_signature(f)) for f in files)
        return self._cached(
            path / reader.RANKS_DIR, "ranks", lambda p: reader.read_ranks(p.parent, retries=0)[0], sig
        )

    def _json(self, path: Path) -> dict[str, Any] | None:
        return self._cached(path, "json", readers.read_json)

    def _log(self, path: Path) -> ParsedLog:
        return self._cached(path, "log", parse_file)

    # ------------------------------------------------------------------ discovery
    def _discover(self) -> dict[str, tuple[Path, str]]:
        self._paths, self.problems = discovery.discover(self.roots)
        return self._paths

    def _locate(self, run_id: str) -> tuple[Path, str]:
        if run_id not in self._paths:
            self._discover()
        if run_id not in self._paths:
            raise KeyError(f"no run {run_id!r} under {', '.join(map(str, self.roots))}")
        return self._paths[run_id]

    # ------------------------------------------------------------------ public API
    def list_runs(self) -> list[RunInfo]:
        """Every run and log under the roots (problems with the roots go to `self.problems`)."""
        return [self._info(run_id, path, source) for run_id, (path, source) in self._discover().items()]

    def frame(self, run_id: str) -> pd.DataFrame:
        """One run's (kind, step) frame (metric columns + `time`); cached; do not mutate."""
        path, source = self._locate(run_id)
        if source == "miles log":
            return self._cached(path, "log_frame", lambda p: readers.log_frame(self._log(p)))
        return self._cached(
            path / reader.METRICS_FILE,
            "frame",
            lambda p: readers.records_to_frame(self._metrics(path).records),
        )

    def records(self, run_id: str) -> list[MetricRecord]:
        """One run's metric records in file order (a run directory's or a console log's); cached."""
        path, source = self._locate(run_id)
        return self._log(path).records if source == "miles log" else self._metrics(path).records

    def non_numeric(self, run_id: str) -> dict[int, dict[str, str]]:
        """Metric values a run directory's metrics file holds that are not numbers, left out of
        `records` (`reader.MetricsFile.non_numeric`: line → key → value as JSON); {} for a log."""
        path, source = self._locate(run_id)
        return {} if source == "miles log" else self._metrics(path).non_numeric

    def read_scalars(self, run_ids: Sequence[str], keys: Sequence[str] | None = None) -> pd.DataFrame:
        """Metrics of several runs → frame indexed by (run, kind, step), columns `keys` + `time`.

        `keys=None` gives every metric. A key no run logged is left out. The result is cached
        and is the same object until a file behind it changes; treat it as read-only.
        """
        sigs = tuple(self._signature(r) for r in run_ids)
        cache_key = (tuple(run_ids), None if keys is None else tuple(keys), sigs)
        hit = self._scalars.get(cache_key)
        if hit is not None:
            return hit
        frames = [self.frame(r) for r in run_ids]
        if keys is not None:
            wanted = [*dict.fromkeys(keys), readers.TIME_COLUMN]
            frames = [f[[k for k in wanted if k in f.columns]] for f in frames]
        if frames:
            out = pd.concat(frames, keys=list(run_ids), names=["run", *readers.INDEX_NAMES], sort=False)
        else:
            out = pd.concat([readers.empty_frame()], keys=["_"], names=["run", *readers.INDEX_NAMES]).iloc[:0]
        return self._scalars.put(cache_key, out)

    def _signature(self, run_id: str) -> tuple[int, int] | None:
        path, source = self._locate(run_id)
        return readers.file_signature(path if source == "miles log" else path / reader.METRICS_FILE)

    def metric_keys(self, run_ids: Sequence[str]) -> list[str]:
        """Sorted metric keys logged by any of the runs (without `time`)."""
        keys: set[str] = set()
        for r in run_ids:
            keys.update(self.frame(r).columns)
        keys.discard(readers.TIME_COLUMN)
        return sorted(keys)

    def read_run_json(self, run_id: str) -> dict[str, Any]:
        """run.json of a run directory as written ({} when missing, unreadable or a log)."""
        meta = self.read_meta(run_id)
        return {} if meta is None else meta.raw

    def read_meta(self, run_id: str) -> reader.RunMeta | None:
        """run.json read by `rundir.reader` (config through Config.from_dict); None when missing,
        unreadable or a log."""
        path, source = self._locate(run_id)
        meta = self._meta(path) if source == "grpolab" else None
        return meta if isinstance(meta, reader.RunMeta) else None

    def read_config(self, run_id: str) -> dict[str, Any]:
        """The resolved config: run.json `config` sections plus `seed`; a log: {"flags": {...}}."""
        path, source = self._locate(run_id)
        if source != "grpolab":
            return {"flags": dict(self._log(path).flags)}
        meta = self.read_meta(run_id)
        config = {} if meta is None else dict(meta.config_dict)
        if meta is not None and "seed" in meta.raw:
            config["seed"] = meta.raw["seed"]
        return config

    def read_events(self, run_id: str) -> list[dict[str, Any]]:
        """events.jsonl objects in order ([] for logs or when missing)."""
        path, source = self._locate(run_id)
        return [] if source != "grpolab" else self._jsonl(path / reader.EVENTS_FILE).rows

    def list_rollouts(self, run_id: str) -> dict[int, Path]:
        """Recorded rollouts of a run: rollout id → .grz path, by `grpolab replay logprobs`' rule
        (`rundir.recordings.recorded_rollouts` with run.json's `--save-debug-rollout-data`)."""
        path, source = self._locate(run_id)
        if source != "grpolab":
            return {}
        debug = self.read_config(run_id).get("debug")
        template = debug.get("save_debug_rollout_data") if isinstance(debug, dict) else None
        template = template if isinstance(template, str) else None
        return recordings.recorded_rollouts(path, self.read_events(run_id), template)

    def read_rollout(self, run_id: str, rollout_id: int) -> RolloutRecording | None:
        """The recorded rollout (`replay.recording.load_rollout`), or None when not recorded.

        Raises:
            RecordingError: the recording exists but is damaged.
        """
        path = self.list_rollouts(run_id).get(rollout_id)
        return None if path is None else self._cached(path, "rollout", load_rollout)

    def has_logprobs(self, run_id: str, rollout_id: int) -> bool:
        """Whether `grpolab replay logprobs RUN_DIR --rollout N` has written its result for this rollout."""
        path, source = self._locate(run_id)
        return source == "grpolab" and logprobs.result_path(path, rollout_id).is_file()

    def read_logprobs(self, run_id: str, rollout_id: int) -> logprobs.LogprobsResult | None:
        """The trainer-vs-engine log-probs of a recorded rollout as `grpolab replay logprobs` wrote them
        (`replay.logprobs.read_result`), None when not computed; cached until the file changes.

        Raises:
            LogprobsError: the file exists but cannot be read as a result (names the file and field).
        """
        if not self.has_logprobs(run_id, rollout_id):
            return None
        return self._cached(
            logprobs.result_path(self.run_path(run_id), rollout_id), "logprobs", logprobs.read_result
        )

    def token_texts(self, run_id: str, token_ids: Sequence[int]) -> list[str] | None:
        """Token ids decoded one by one with the run's tokenizer (None when it is not on disk)."""
        key = ("tokens", run_id, tuple(token_ids))
        hit = self._recomputed.get(key)
        if hit is None:
            path = self.run_path(run_id)
            hit = self._recomputed.put(key, logprobs.token_texts(path, list(token_ids)) or [])
        return hit or None

    def step_records(self, run_id: str, rollout_id: int) -> list[dict[str, Any]]:
        """The run's `step` records of one rollout, in order, in the metrics file's shape ([] for logs)."""
        path, source = self._locate(run_id)
        if source != "grpolab":
            return []
        records = self._metrics(path).records
        return [r.as_jsonl() for r in records if r.kind == "step" and r.rollout_id == rollout_id]

    def read_gpu(self, run_id: str) -> pd.DataFrame:
        """gpu.jsonl samples (time, throttle fields, ...) as a frame; empty when absent."""
        path, source = self._locate(run_id)
        rows = [] if source != "grpolab" else self._jsonl(path / GPU_FILE).rows
        return pd.DataFrame(rows) if rows else pd.DataFrame({"time": pd.Series([], dtype="float64")})

    def _diagnose_files(self, run_id: str) -> list[Path]:
        path, source = self._locate(run_id)
        folder = path / "diagnose"
        return sorted(folder.rglob("*.json")) if source == "grpolab" and folder.is_dir() else []

    def read_hang_reports(self, run_id: str) -> list[StoredHangReport]:
        """The `grpolab diagnose hang` reports under RUN_DIR/diagnose/ (folders holding verdict.json),
        newest first ([] for logs); an unreadable verdict.json sets `error`. Files are read through the cache."""
        path, _ = self._locate(run_id)
        out = []
        for verdict in (f for f in self._diagnose_files(run_id) if f.name == HANG_VERDICT):
            folder = verdict.parent
            dumps = {}
            for f in folder.glob("rank*.txt"):
                m = RANK_DUMP.fullmatch(f.name)
                if m:
                    dumps[int(m[1])] = self._cached(f, "text", read_text)
            order = stamp_order(folder)
            rel = folder.relative_to(path).as_posix()
            got = self._cached(verdict, "verdict", stored_reports.read_verdict)
            report = StoredHangReport.of(rel, order[0], got, dict(sorted(dumps.items())))
            out.append((order, report))
        return [report for _, report in sorted(out, key=lambda t: t[0], reverse=True)]

    def read_diagnose(self, run_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Other JSON files under RUN_DIR/diagnose/ (any depth): (relative path, object), sorted by path.

        A hang report's verdict.json and its parsed stacks (rank<r>.json next to rank<r>.txt) are
        left out: `read_hang_reports` gives them. An unreadable file gives {"error": "unreadable"}.
        """
        path, _ = self._locate(run_id)
        out = []
        for f in self._diagnose_files(run_id):
            m = RANK_DUMP.fullmatch(f.name)
            if f.name == HANG_VERDICT or (m and (f.parent / f"rank{m[1]}.txt").exists()):
                continue
            obj = self._json(f)
            out.append((f.relative_to(path).as_posix(), obj if obj is not None else {"error": "unreadable"}))
        return out

    def log_file(self, run_id: str) -> Path:
        """The console log the log doctor reads: RUN_DIR/console.log, or the log file itself."""
        path, source = self._locate(run_id)
        return path / "console.log" if source == "grpolab" else path

    def read_log_findings(self, run_id: str) -> FileScan | None:
        """The log doctor's findings on `log_file(run_id)` (`grpolab diagnose log`, rules of
        grpolab.diagnose.logdoctor.rules), evidence named by the file's name; None when there is no such
        file. Cached until the file's (size, mtime) changes; `error` is set when it cannot be read."""
        log = self.log_file(run_id)
        return self._cached(log, "logscan", _scan_log) if log.is_file() else None

    def completion(self, run_id: str) -> RunCompletion | None:
        """Did the run do what it was asked (status, reason, rollouts done of asked;
        `rundir.completion`, the rule of `grpolab gate`'s status row)? None for a console log."""
        path, source = self._locate(run_id)
        if source == "miles log":
            return None
        records = self._metrics(path).records
        return run_completion(path, records, heartbeat_timeout_s=self.heartbeat_timeout_s)

    def run_path(self, run_id: str) -> Path:
        """The run directory or log file behind `run_id`."""
        return self._locate(run_id)[0]

    # ------------------------------------------------------------------ summaries
    def _info(self, run_id: str, path: Path, source: str) -> RunInfo:
        if source == "miles log":
            try:
                parsed: ParsedLog | OSError = self._log(path)
            except OSError as e:
                parsed = e
            sig = readers.file_signature(path)
            recent = sig is not None and time.time() - sig[1] / 1e9 < self.heartbeat_timeout_s
            frame = None if isinstance(parsed, OSError) else self.frame(run_id)  # an unreadable log has none
            return log_summary(run_id, path, parsed, frame, recent=recent)
        meta = self._meta(path)
        status = "incomplete" if isinstance(meta, str) else self._status(path)
        return directory_summary(run_id, path, meta, self._metrics(path), self.frame(run_id), status)

    def _status(self, path: Path) -> str:
        """`reader.decide_status` over the cached events and rank files."""
        final = reader.status_event_of(self._jsonl(path / reader.EVENTS_FILE).rows)
        beats = reader.live_heartbeat_times(self._ranks(path))
        return reader.decide_status(
            final, beats, now=time.time(), heartbeat_timeout_s=self.heartbeat_timeout_s
        )
