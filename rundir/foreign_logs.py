"""Read Miles/slime console logs (and our own console.log) into the records of a run's metrics.

What it parses: every line whose message is `<kind> <N>: {python dict repr}` with kind one of
`rollout`, `step`, `perf`, `eval`, `multi_turn`, `critic-step`, with or without the prefixes
Miles and Ray put in front (`(FSDPTrainRayActor pid=2551) [2026-10-17 15:56:48.271
actor_cell00000_rank00000] log_utils.py:125 - rollout 0: {...}`). Dict reprs are read without
`eval`: a literal parser that accepts Python constants, `nan`/`inf` tokens and numeric wrappers
such as `np.float64(0.5)` or `tensor(0.5)`; a non-numeric value is dropped from the record.

Record shape (the same as a run directory's metrics records, `rundir.reader`): `kind`,
`rollout_id`, `step` (train step for `step` lines, None otherwise), `time` (the prefix timestamp
read as UTC, or None), `metrics`. Extra fields: `side` for perf lines — Miles prints two different
`perf N:` lines, the rollout side's (`rollout/*` sample stats, `perf/rollout_time`, generation
throughput) and the trainer side's (`perf/<timer>_time`, `perf/step_time`, tflops); our own single
perf line holds both (`"combined"`) — and `line_no` (1-based).

Quirks handled: Ray's log deduplication suffix (` [repeated 2x across cluster]`) is dropped;
Miles prints each `step N` line twice (an identical repeat of the previous record
for the same kind and index is dropped), a live log's last line may be half-written (a line
without its newline is never consumed by `LogParser.feed`; `parse_file` skips a final line that
does not parse), and a log can hold no metric line at all (`parse_file(...).records == []`).
Pure text → records; no pandas, so `grpolab gate` and the UI share it.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

KINDS = ("rollout", "step", "perf", "eval", "multi_turn", "critic-step")
_LINE = re.compile(
    r"(?:^|[\s\]\)])(?P<kind>rollout|step|perf|eval|multi_turn|critic-step) (?P<index>\d+): (?P<body>\{.*)$"
)
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_STAMP = re.compile(r"\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?)[\s\]]")
_SPECIAL = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf}
_WRAPPERS = {"float", "int", "tensor", "float64", "float32", "float16", "bfloat16", "int64", "int32"}
ROLLOUT_PERF_KEYS = frozenset(
    {
        "perf/rollout_time",
        "perf/tokens_per_gpu_per_sec",
        "perf/longest_sample_tokens_per_sec",
        "perf/effective_tokens_per_gpu_per_sec",
        "perf/longest_effective_sample_tokens_per_sec",
        "perf/longest_sample_non_generation_time",
    }
)
TRAINER_PERF_KEYS = frozenset(
    {
        "perf/step_time",
        "perf/train_time",
        "perf/train_wait_time",
        "perf/actor_train_time",
        "perf/log_probs_time",
        "perf/ref_log_probs_time",
        "perf/update_weights_time",
        "perf/sleep_time",
        "perf/wake_up_time",
        "perf/wait_time_ratio",
    }
)
_ROLLOUT_PERF_PREFIXES = ("rollout/", "passrate/", "perf/non_generation_time/", "perf/longest_sample_")


@dataclass(frozen=True)
class MetricRecord:
    """One metric line, in the shape of a run's metrics record plus where it came from.

    Attributes:
        kind: rollout | step | perf | eval | multi_turn | critic-step.
        rollout_id: the line's index for rollout/perf/eval/multi_turn lines; for step lines the
            rollout id is unknown in a foreign log (None) unless `train/step` maps 1:1.
        step: the train step for step/critic-step lines (the printed index), else None.
        metrics: metric key → float (nan/inf kept).
        time: unix seconds from the line's timestamp prefix (read as UTC), or None.
        side: for perf lines "rollout" | "trainer" | "combined" (our single line); else None.
        line_no: 1-based line number in the log.
    """

    kind: str
    rollout_id: int | None
    step: int | None
    metrics: dict[str, float]
    time: float | None = None
    side: str | None = None
    line_no: int = 0

    @property
    def index(self) -> int:
        """The printed index: the step for step lines, the rollout id otherwise."""
        value = self.step if self.step is not None else self.rollout_id
        assert value is not None
        return value

    def as_jsonl(self) -> dict[str, Any]:
        """A run's metrics line shape: {kind, rollout_id, step, time, metrics} (+ side for perf)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "rollout_id": self.rollout_id,
            "step": self.step,
            "time": self.time,
            "metrics": dict(self.metrics),
        }
        if self.side is not None:
            out["side"] = self.side
        return out


class LiteralError(ValueError):
    """A dict body that is not a literal of numbers (names the offending node)."""


def _number(node: ast.AST) -> float | None:
    """The float a value node stands for; None for a non-numeric literal (string, list, None)."""
    if isinstance(node, ast.Constant):
        v = node.value
        return float(v) if isinstance(v, int | float) and not isinstance(v, complex) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _number(node.operand)
        if inner is None:
            return None
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Name):
        if node.id in _SPECIAL:
            return _SPECIAL[node.id]
        raise LiteralError(f"name {node.id!r} is not a number")
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in _WRAPPERS:
            return _number(node.args[0])
        raise LiteralError(f"call {name!r} is not a numeric wrapper")
    if isinstance(node, ast.List | ast.Tuple | ast.Dict | ast.Set):
        return None
    raise LiteralError(f"{type(node).__name__} is not a literal")


def parse_metrics_dict(body: str) -> dict[str, float]:
    """Read a Python dict repr of metrics (single quotes, nan/inf tokens) without evaluating code.

    Returns:
        key → float for every string key with a numeric value (bools become 0.0/1.0).

    Raises:
        LiteralError: the text is not one dict literal (e.g. a half-written line) or holds code.
    """
    try:
        tree = ast.parse(body.strip(), mode="eval")
    except SyntaxError as e:
        raise LiteralError(f"not a complete dict: {e.msg}") from None
    if not isinstance(tree.body, ast.Dict):
        raise LiteralError("not a dict")
    out: dict[str, float] = {}
    for k, v in zip(tree.body.keys, tree.body.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            continue
        value = _number(v)
        if value is not None:
            out[k.value] = value
    return out


def perf_side(metrics: dict[str, float]) -> str:
    """Which `perf N:` line this is: "rollout" (rollout manager), "trainer" or "combined" (grpolab).

    Decided by key set: rollout-side lines carry `rollout/*`, `passrate/*` or generation keys
    (`perf/rollout_time`, `perf/tokens_per_gpu_per_sec`, ...); trainer-side lines carry timer keys
    (`perf/step_time`, `perf/train_time`, ...). A line with both is grpolab's one perf line.
    """
    keys = metrics.keys()
    rollout = any(k in ROLLOUT_PERF_KEYS or k.startswith(_ROLLOUT_PERF_PREFIXES) for k in keys)
    trainer = any(k in TRAINER_PERF_KEYS or k.endswith(("_tflops", "_mfu")) for k in keys)
    if rollout and trainer:
        return "combined"
    return "rollout" if rollout else "trainer"


def _timestamp(prefix: str) -> float | None:
    m = _STAMP.search(prefix)
    if m is None:
        return None
    ts = m.group("ts").replace("T", " ")
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in ts else "%Y-%m-%d %H:%M:%S"
    try:
        return datetime.strptime(ts, fmt).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def parse_line(line: str, line_no: int = 0) -> MetricRecord | None:
    """One log line → a MetricRecord, or None when it holds no (complete) metric dict."""
    if ": {" not in line:
        return None
    m = _LINE.search(_RAY_REPEAT.sub("", line.rstrip("\r\n")))
    if m is None:
        return None
    try:
        metrics = parse_metrics_dict(m.group("body"))
    except LiteralError:
        return None
    kind, index = m.group("kind"), int(m.group("index"))
    is_step = kind in ("step", "critic-step")
    return MetricRecord(
        kind=kind,
        rollout_id=None if is_step else index,
        step=index if is_step else None,
        metrics=metrics,
        time=_timestamp(line[: m.start()]),
        side=perf_side(metrics) if kind == "perf" else None,
        line_no=line_no,
    )


@dataclass
class LogParser:
    """Streaming parser: feed text chunks as a log grows; complete lines come out as records.

    A trailing piece without a newline stays buffered until the next `feed` (a live run's
    half-written last line is never read early). Identical repeats of the previous record of the
    same (kind, index) are dropped (Miles prints `step N` twice).

    Attributes:
        lines: complete lines consumed so far.
        duplicates: identical repeats dropped.
        unparsed: lines that looked like metric lines (`<kind> N: {`) but did not parse.
        flags: `--flag value` pairs of the first launch command line (the first line holding
            `--hf-checkpoint`), e.g. {"hf-checkpoint": "...", "seed": "1"}; {} when none.
    """

    lines: int = 0
    duplicates: int = 0
    unparsed: int = 0
    flags: dict[str, str] = field(default_factory=dict)
    _buffer: str = ""
    _last: dict[tuple[str, int, str | None], dict[str, float]] = field(default_factory=dict)

    def feed(self, text: str) -> list[MetricRecord]:
        """Consume `text`; return the records of the lines it completed."""
        data = self._buffer + text
        cut = data.rfind("\n")
        if cut < 0:
            self._buffer = data
            return []
        self._buffer = data[cut + 1 :]
        return list(self._consume(data[:cut].split("\n")))

    def flush(self) -> list[MetricRecord]:
        """Parse the buffered last line as final (a finished log's line without a newline)."""
        rest, self._buffer = self._buffer, ""
        return list(self._consume([rest])) if rest else []

    def _consume(self, lines: Iterable[str]) -> Iterator[MetricRecord]:
        for line in lines:
            self.lines += 1
            if not self.flags and "--hf-checkpoint" in line:
                self.flags = parse_flags(line)
            record = parse_line(line, self.lines)
            if record is None:
                if _LINE.search(line.rstrip("\r\n")):
                    self.unparsed += 1
                continue
            key = (record.kind, record.index, record.side)
            if self._last.get(key) == record.metrics:
                self.duplicates += 1
                continue
            self._last[key] = record.metrics
            yield record


@dataclass(frozen=True)
class ParsedLog:
    """Everything read from one log file.

    Attributes:
        records: metric records in file order (duplicates dropped).
        lines: lines read; duplicates: identical repeats dropped; unparsed: metric-looking
            lines that did not parse (a half-written last line counts here).
        flags: `--flag value` pairs of the first launch command line found (the line holding
            `--hf-checkpoint`), e.g. {"hf-checkpoint": "...", "seed": "1"}; {} when none.
        first_time / last_time: first and last timestamps seen on metric lines (or None).
    """

    records: list[MetricRecord]
    lines: int
    duplicates: int
    unparsed: int
    flags: dict[str, str]
    first_time: float | None
    last_time: float | None


def parse_flags(line: str) -> dict[str, str]:
    """`--name value` pairs (and bare `--switch` as "true") from a launch command line."""
    tokens = line.replace("\\", " ").split()
    out: dict[str, str] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                out[name] = tokens[i + 1].rstrip(";&|")
            else:
                out[name] = "true"
    return out


def parse_file(path: str | Path, *, chunk_bytes: int = 1 << 20) -> ParsedLog:
    """Stream a log file (any size) into records; a final line that does not parse is skipped.

    Raises:
        OSError: the file cannot be read.
    """
    parser = LogParser()
    records: list[MetricRecord] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        while chunk := f.read(chunk_bytes):
            records += parser.feed(chunk)
    records += parser.flush()
    times = [r.time for r in records if r.time is not None]
    return ParsedLog(
        records=records,
        lines=parser.lines,
        duplicates=parser.duplicates,
        unparsed=parser.unparsed,
        flags=parser.flags,
        first_time=min(times) if times else None,
        last_time=max(times) if times else None,
    )
