"""Offline CI gate: `grpolab gate RUN_OR_LOG [--baseline ...] [--step0-kl T] [--gap-range ...] [--metric ...]`.

Inputs: our run directories (recognised by `run.json` or their metrics file, read with
`rundir.reader`), a run's metrics file (`.jsonl`), or a Miles/slime console log read with
`rundir.foreign_logs.parse_file` (`step N: {...}` lines with or without the Ray/timestamp prefixes).
Every input must hold at least one `step` record, otherwise the gate cannot judge it (exit 2).

Checks (all on step 0, the FIRST `step` record in file order, except `--metric`; the step number is
shown). The rules are `checkers/step0.py`'s, shared with the in-run KL checker and the UI:
- `--step0-kl T`: |train/ppo_kl| < T, |train/pg_clipfrac| < 1e-10, and |train/kl_loss| < 1e-9 when
  the run logs it. Before the first update the trainer's old and new probabilities are the same, so
  all must be 0; Miles asserts ppo_kl < 1e-9 and pg_clipfrac < 1e-10 in its `--ci-test` (Miles 101
  manual section 5.2, "Check two values at step 0"; our in-run twin is `checkers/kl.py`). When no
  check flag is given, `--step0-kl 1e-9` runs.
- `--gap-range LO:HI`: LO <= train/train_rollout_logprob_abs_diff <= HI. The trainer-vs-engine gap is
  never 0 outside true on-policy mode, but at step 0 it must sit inside the range of your healthy
  runs (manual section 5.2 "Compare the gap with your range"; section 8.3: "measure the gap at step
  0 and keep it inside the range of your healthy runs"; the manual's Qwen3-0.6B seeds gave
  0.0148-0.0157). `--gap-range auto` takes [min, max] of the baselines' first-step gaps widened by
  the relative `--gap-margin` m: [lo*(1-m), hi*(1+m)].
- `--metric 'KEY>=X'` (also `<=`, `>`, `<`, `==`): the LAST value of KEY in the run, over records
  of any kind in file order; a missing key fails and lists the keys present.

Exit codes: 0 every check passed, 1 a check failed, 2 cannot judge (unreadable input, no step
records, a bad flag value; the message names the file or the flag).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpolab.checkers import step0
from grpolab.checkers.step0 import DEFAULT_GAP_MARGIN, GAP_KEY, KL_LOSS_KEY, PPO_KL_TOL
from grpolab.rundir import reader
from grpolab.rundir.foreign_logs import MetricRecord, parse_file

METRIC_FORM = "KEY>=X, KEY<=X, KEY>X, KEY<X or KEY==X with a number X (e.g. 'eval/arith>=0.5')"
_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "==": operator.eq}
_OPS.update({">": operator.gt, "<": operator.lt})
_METRIC_RE = re.compile(
    r"^\s*(?P<key>[^<>=\s](?:[^<>=]*[^<>=\s])?)\s*(?P<op>>=|<=|==|>|<)\s*(?P<value>\S+)\s*$"
)
_KEYS_SHOWN = 40


class GateInputError(ValueError):
    """The gate cannot judge: unreadable input, no step records, or a bad flag value (exit 2)."""


@dataclass(frozen=True)
class RunMetrics:
    """The records of one run or log.

    Attributes:
        path: the input as given; source: the file read (the run's metrics file or the log);
        records: file order.
    """

    path: str
    source: str
    records: list[MetricRecord]

    @property
    def first_step(self) -> MetricRecord:
        """Step 0: the first `step` record in file order (load_run guarantees one exists)."""
        rec = step0.first_step(self.records)
        assert rec is not None
        return rec

    def where(self, record: MetricRecord) -> dict[str, Any]:
        """Evidence fields of a record: `record` ("step 0", "rollout 3"), `file`, `line_no`."""
        label = f"step {record.step}" if record.kind == "step" else f"{record.kind} {record.index}"
        return {"record": label, "file": self.source, "line_no": record.line_no}


def _no_step_reason(run_dir: Path) -> str:
    """Why a run directory holds no `step` record, from its status (`reader.run_status`) and its
    final status event's "error": failed (with that error), interrupted, crashed (no final status),
    still running, or finished without training (`--debug-rollout-only`)."""
    status = reader.run_status(run_dir)
    event = reader.final_status_event(run_dir) or {}
    rollout = f" (at rollout {event['rollout_id']})" if isinstance(event.get("rollout_id"), int) else ""
    if status == "failed":
        why = event.get("error") or "no error recorded"
        return f"the run failed before its first step{rollout}: {why}"
    if status == "interrupted":
        return f"the run was interrupted before its first step{rollout}"
    if status == "running":
        return "the run has not reached its first step yet (it is still running)"
    if status == "crashed":
        return (
            "the run stopped before its first step without a final status event (killed or crashed; "
            f"see {run_dir / reader.CONSOLE_LOG})"
        )
    return "the run finished without a training step (a --debug-rollout-only run does not train)"


def _read_records(p: Path, fmt: str) -> list[MetricRecord]:
    """The records of a metrics file (`fmt` "run") or a console log ("log").

    Raises:
        GateInputError: the file cannot be read, or a complete line of a metrics file is not a record.
    """
    try:
        if not p.is_file():
            p.open().close()  # the OSError that names why (no such file, a folder, no permission)
        if fmt == "log":
            return parse_file(p).records
        got = reader.read_metrics_file(p)
    except OSError as e:
        raise GateInputError(f"cannot read {p}: {e.strerror or e}") from None
    if got.bad_lines:  # a complete line that is not a record: cannot judge
        n, why = got.bad_lines[0]
        raise GateInputError(f"{p}:{n}: not a {reader.METRICS_FILE} record ({why})")
    return got.records


def load_run(path: str | Path) -> RunMetrics:
    """Read a run directory, a run's metrics file (.jsonl) or a Miles/slime console log.

    Raises:
        GateInputError: the path is missing or unreadable, a directory is not a run directory, or
            the input holds no `step` record (for a run directory: why, from its status, e.g. "the
            run failed before its first step: <its status event's error>").
    """
    p = Path(path)
    if p.is_dir():
        if not reader.is_run_dir(p):
            raise GateInputError(f"{p} is not a run directory (none of {', '.join(reader.RUN_MARKERS)})")
        p, fmt = p / reader.METRICS_FILE, "run"
    else:
        fmt = "run" if p.suffix == ".jsonl" else "log"
    run_dir = p.parent if fmt == "run" and reader.is_run_dir(p.parent) else None
    # a run that failed before its first metric has no metrics file: said below, from its status
    records = [] if run_dir is not None and not p.exists() else _read_records(p, fmt)
    if not any(r.kind == "step" for r in records):
        if run_dir is not None:
            raise GateInputError(f"no step record in {run_dir}: {_no_step_reason(run_dir)}; nothing to judge")
        what = 'records of kind "step"' if fmt == "run" else "`step N: {...}` lines"
        raise GateInputError(f"no {what} in {p}; nothing to judge (did the run reach its first step?)")
    return RunMetrics(path=str(path), source=str(p), records=records)


@dataclass(frozen=True)
class MetricExpr:
    """A parsed `--metric` expression: KEY OP THRESHOLD."""

    key: str
    op: str
    threshold: float


def parse_metric_expr(text: str) -> MetricExpr:
    """`'eval/arith>=0.5'` → MetricExpr; GateInputError naming `--metric` and the expected form."""
    m = _METRIC_RE.match(text)
    try:
        threshold = float(m.group("value")) if m else math.nan
    except ValueError:
        threshold = math.nan
    if m is None or math.isnan(threshold):
        raise GateInputError(f"--metric {text!r}: expected {METRIC_FORM}")
    return MetricExpr(m.group("key"), m.group("op"), threshold)


def parse_gap_range(text: str) -> tuple[float, float] | None:
    """`'auto'` → None; `'LO:HI'` → (LO, HI); GateInputError naming `--gap-range` otherwise."""
    if text.strip() == "auto":
        return None
    lo_s, sep, hi_s = text.partition(":")
    try:
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        lo = hi = math.nan
    if not sep or not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise GateInputError(
            f"--gap-range {text!r}: expected 'auto' or LO:HI with finite numbers LO <= HI (e.g. 0.013:0.017)"
        )
    return lo, hi


@dataclass(frozen=True)
class CheckResult:
    """One row of the gate table.

    Attributes:
        check: the flag's name (step0-kl | gap-range | metric); key: the metric checked;
        value: the value found (None when missing); expectation: the rule, in words;
        passed: the verdict; record / file / line_no: where the value came from ("step 0");
        detail: why it failed (e.g. the keys present when the key is missing); count: how many
        records held the key (`--metric` only).
    """

    check: str
    key: str
    value: float | None
    expectation: str
    passed: bool
    record: str | None = None
    file: str | None = None
    line_no: int | None = None
    detail: str = ""
    count: int | None = None

    @property
    def evidence(self) -> str:
        """`step 0 @ file.log:4` (with `last of N:` for --metric), or `-` when nothing was found."""
        if self.record is None:
            return "-"
        last = f"last of {self.count}: " if self.count is not None else ""
        return f"{last}{self.record} @ {Path(self.file or '').name}:{self.line_no}"


@dataclass(frozen=True)
class GapRange:
    """The range --gap-range checks against, and where it came from."""

    lo: float
    hi: float
    mode: str  # "explicit" | "auto"
    margin: float | None = None
    baselines: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        """One paragraph for the text output."""
        if self.mode == "explicit":
            return f"gap range: [{self.lo:.6g}, {self.hi:.6g}] (explicit --gap-range)"
        vals = [b["value"] for b in self.baselines]
        head = (
            f"gap range (auto): [{self.lo:.6g}, {self.hi:.6g}] = baseline first-step {GAP_KEY} "
            f"min {min(vals):.6g} .. max {max(vals):.6g}, widened by --gap-margin {self.margin:g} "
            f"(lo*(1-m), hi*(1+m)) from {len(vals)} baseline(s):"
        )
        rows = [
            f"  {b['path']}: {b['value']:.6g} at {b['record']}, line {b['line_no']}" for b in self.baselines
        ]
        return "\n".join([head, *rows])


def _missing(keys: list[str]) -> str:
    more = f", ... (+{len(keys) - _KEYS_SHOWN} more)" if len(keys) > _KEYS_SHOWN else ""
    return f"key not found; keys present: {', '.join(keys[:_KEYS_SHOWN]) or '(none)'}{more}"


_KL_LOSS_CAUSE = "the reference model is not the initial policy (another checkpoint, or changed weights)"
_ON_POLICY_CAUSE = (
    "must be on-policy: old and new log-probs come from the same weights, so the two forwards are "
    "not the same computation (micro-batching, padding, dropout, nondeterministic kernels) or the "
    "step was not the first of its rollout"
)


def check_step0_kl(run: RunMetrics, tol: float) -> list[CheckResult]:
    """The step-0 rule (`checkers/step0.py`) on the first step record: |train/ppo_kl| < tol,
    |train/pg_clipfrac| < 1e-10 and, when logged, |train/kl_loss| < 1e-9 (manual 5.2, Miles check_kl)."""
    rec = run.first_step
    out = []
    for check in step0.step0_checks(rec.metrics, ppo_kl_tol=tol):
        expect = f"|x| < {check.limit:g}" + ("" if check.key == step0.PPO_KL_KEY else " (Miles)")
        detail = ""
        if not check.logged:
            detail = _missing(sorted(rec.metrics))
        elif not check.passed:
            cause = _KL_LOSS_CAUSE if check.key == KL_LOSS_KEY else _ON_POLICY_CAUSE
            detail = f"first step (step {rec.step}) {cause}"
        out.append(
            CheckResult(
                "step0-kl", check.key, check.value, expect, check.passed, detail=detail, **run.where(rec)
            )
        )
    return out


def derive_gap_range(baselines: Sequence[RunMetrics], margin: float) -> GapRange:
    """[min, max] of the baselines' first-step gaps widened to [lo*(1-m), hi*(1+m)] (manual 5.2, 8.3;
    `step0.gap_range_from`)."""
    if not baselines:
        raise GateInputError(
            "--gap-range auto needs at least one --baseline RUN_OR_LOG (healthy runs of your setup)"
        )
    rows = []
    for b in baselines:
        rec = b.first_step
        value = rec.metrics.get(GAP_KEY, math.nan)
        if not math.isfinite(value):
            got = _missing(sorted(rec.metrics)) if GAP_KEY not in rec.metrics else value
            raise GateInputError(f"baseline {b.path}: first-step {GAP_KEY}: {got}")
        rows.append({"path": b.path, "value": value, **b.where(rec)})
    lo, hi = step0.gap_range_from([r["value"] for r in rows], margin)
    return GapRange(lo, hi, "auto", margin, rows)


def check_gap(run: RunMetrics, gap: GapRange) -> CheckResult:
    """LO <= first-step train/train_rollout_logprob_abs_diff <= HI (`step0.gap_place`)."""
    rec = run.first_step
    value = rec.metrics.get(GAP_KEY)
    expect = f"{gap.lo:.6g} <= x <= {gap.hi:.6g} ({gap.mode})"
    ok = value is not None and step0.gap_place(value, gap.lo, gap.hi) == "inside"
    detail = ""
    if value is None:
        detail = _missing(sorted(rec.metrics))
    elif value > gap.hi:
        detail = (
            f"{value / gap.hi:.1f}x the upper bound: the trainer and the engine may not compute the same model "
            "(wrong checkpoint path on one side, a format one side reads differently; manual 5.2)"
        )
    elif not ok:
        detail = "outside the healthy range: are the baselines the same setup (model, sampler, dtypes)?"
    return CheckResult("gap-range", GAP_KEY, value, expect, ok, detail=detail, **run.where(rec))


def check_metric(run: RunMetrics, expr: MetricExpr) -> CheckResult:
    """The LAST value of expr.key in the run (any record kind, file order) OP threshold."""
    expect = f"last value {expr.op} {expr.threshold:g}"
    hits = [r for r in run.records if expr.key in r.metrics]
    if not hits:
        keys = sorted({k for r in run.records for k in r.metrics})
        return CheckResult("metric", expr.key, None, expect, False, detail=_missing(keys), count=0)
    rec = hits[-1]
    value = rec.metrics[expr.key]
    ok = _OPS[expr.op](value, expr.threshold)
    return CheckResult("metric", expr.key, value, expect, ok, count=len(hits), **run.where(rec))


def verdict_word(passed: bool) -> str:
    """ "PASS" or "FAIL", as the CI-log table and the JSON report print a verdict."""
    return "PASS" if passed else "FAIL"


@dataclass(frozen=True)
class GateReport:
    """Everything `grpolab gate` decided; `passed` is True when every check passed."""

    target: str
    source: str
    checks: list[CheckResult]
    gap_range: GapRange | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        """The `--json` document (strict JSON: a non-finite value becomes "nan" / "inf" / "-inf")."""
        num = lambda v: v if v is None or math.isfinite(v) else str(v)  # noqa: E731
        return {
            "target": self.target,
            "source": self.source,
            "verdict": verdict_word(self.passed),
            "exit_code": 0 if self.passed else 1,
            "checks": [
                {**asdict(c), "value": num(c.value), "evidence": c.evidence, "result": verdict_word(c.passed)}
                for c in self.checks
            ],
            "gap_range": None if self.gap_range is None else asdict(self.gap_range),
            "notes": self.notes,
        }


def gate(
    target: str | Path,
    *,
    baselines: Sequence[str | Path] = (),
    step0_kl: float | None = None,
    gap_range: str | None = None,
    gap_margin: float = DEFAULT_GAP_MARGIN,
    metrics: Sequence[str] = (),
) -> GateReport:
    """Run the requested checks on `target` (see the module docstring for each rule).

    Raises:
        GateInputError: the gate cannot judge (exit 2); the message names the file or the flag.
    """
    notes: list[str] = []
    exprs = [parse_metric_expr(m) for m in metrics]
    explicit = parse_gap_range(gap_range) if gap_range is not None else None
    if step0_kl is not None and not step0_kl > 0:
        raise GateInputError(f"--step0-kl {step0_kl!r}: expected a positive tolerance (Miles uses 1e-9)")
    if not (math.isfinite(gap_margin) and gap_margin >= 0):
        raise GateInputError(f"--gap-margin {gap_margin!r}: expected a relative margin >= 0 (e.g. 0.1)")
    if step0_kl is None and gap_range is None and not exprs:
        step0_kl = PPO_KL_TOL
        notes.append(f"no check requested: running the default --step0-kl {PPO_KL_TOL:g}")
    run = load_run(target)
    base_runs = [load_run(b) for b in baselines]
    if base_runs and not (gap_range is not None and explicit is None):
        notes.append("--baseline is only used by --gap-range auto; ignored")
    checks: list[CheckResult] = []
    if step0_kl is not None:
        checks += check_step0_kl(run, step0_kl)
    gap: GapRange | None = None
    if gap_range is not None:
        gap = GapRange(*explicit, "explicit") if explicit else derive_gap_range(base_runs, gap_margin)
        checks.append(check_gap(run, gap))
    checks += [check_metric(run, e) for e in exprs]
    return GateReport(str(target), run.source, checks, gap, notes)
