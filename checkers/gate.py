"""Offline CI gate: `grpolab gate RUN_OR_LOG [--baseline ...] [--step0-kl T] [--gap-range ...] [--metric ...]`.

Inputs: our run directories (recognised by `run.json` or their metrics file, read with
`rundir.reader`), a run's metrics file (`.jsonl`), or a Miles/slime console log read with
`rundir.foreign_logs.parse_file` (`step N: {...}` lines with or without the Ray/timestamp prefixes).
Every input must hold at least one `step` record, otherwise the gate cannot judge it (exit 2; for
a run directory the message says why, from its status).

A run directory's first row is `status` (`checkers/gate_status.py`): the run finished and ran
every rollout it was asked for, else the row fails naming the status and its reason (failed at
rollout 3 with its error, crashed, interrupted, still running, 3 of 40 rollouts); `--allow-status
S ...` accepts those statuses (`any` also fewer rollouts). Foreign logs, and a directory holding a
metrics file without the trainer's events.jsonl, record no status: no row (a note says so).

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

Exit codes: 0 every check passed, 1 a check failed (the `status` row included), 2 cannot judge (unreadable input, no step
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

from grpolab.checkers import gate_status, step0
from grpolab.checkers.gate_input import GateInputError, RunMetrics, load_run
from grpolab.checkers.step0 import DEFAULT_GAP_MARGIN, GAP_KEY, KL_LOSS_KEY, PPO_KL_TOL
from grpolab.rundir import reader
from grpolab.rundir.completion import RunCompletion, run_completion

METRIC_FORM = "KEY>=X, KEY<=X, KEY>X, KEY<X or KEY==X with a number X (e.g. 'eval/arith>=0.5')"
_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "==": operator.eq}
_OPS.update({">": operator.gt, "<": operator.lt})
_METRIC_RE = re.compile(
    r"^\s*(?P<key>[^<>=\s](?:[^<>=]*[^<>=\s])?)\s*(?P<op>>=|<=|==|>|<)\s*(?P<value>\S+)\s*$"
)
_KEYS_SHOWN = 40


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
        records held the key (`--metric` only); shown: the table's VALUE when it is not a number
        (the `status` row: the run's status).
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
    shown: str | None = None

    @property
    def evidence(self) -> str:
        """`step 0 @ file.log:4` (with `last of N:` for --metric), or `-` when nothing was found."""
        if self.record is None:
            return "-"
        last = f"last of {self.count}: " if self.count is not None else ""
        line = "" if self.line_no is None else f":{self.line_no}"
        return f"{last}{self.record} @ {Path(self.file or '').name}{line}"


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


def check_status(run: RunMetrics, completion: RunCompletion, allowed: frozenset[str]) -> CheckResult:
    """The `status` row: value = rollouts done, shown = the status (`gate_status.status_verdict`)."""
    passed, detail = gate_status.status_verdict(completion, allowed)
    events = str(Path(run.run_dir or ".") / reader.EVENTS_FILE)
    return CheckResult(
        "status", "status", float(completion.rollouts_done), gate_status.expectation(completion), passed,
        record=completion.rollouts, file=events, line_no=None, detail=detail, shown=completion.status,
    )  # fmt: skip


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
    completion: RunCompletion | None = None

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
            "run_status": None
            if (done := self.completion) is None
            else {**asdict(done), "complete": done.complete},
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
    allow_status: Sequence[str] = (),
) -> GateReport:
    """Run the requested checks on `target` (see the module docstring for each rule); a run
    directory's `status` row comes first (`allow_status`: `--allow-status` values).

    Raises:
        GateInputError: the gate cannot judge (exit 2); the message names the file or the flag.
    """
    notes: list[str] = []
    exprs = [parse_metric_expr(m) for m in metrics]
    try:
        allowed = gate_status.parse_allow_status(allow_status)
    except ValueError as e:
        raise GateInputError(str(e)) from None
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
    completion = None
    if run.run_dir is not None and (Path(run.run_dir) / reader.EVENTS_FILE).is_file():
        completion = run_completion(run.run_dir, run.records)
        checks.append(check_status(run, completion, allowed))
    elif run.run_dir is not None:
        notes.append(f"no {reader.EVENTS_FILE} in {run.run_dir}: its status is not known; no status row")
    if step0_kl is not None:
        checks += check_step0_kl(run, step0_kl)
    gap: GapRange | None = None
    if gap_range is not None:
        gap = GapRange(*explicit, "explicit") if explicit else derive_gap_range(base_runs, gap_margin)
        checks.append(check_gap(run, gap))
    checks += [check_metric(run, e) for e in exprs]
    return GateReport(str(target), run.source, checks, gap, notes, completion)
