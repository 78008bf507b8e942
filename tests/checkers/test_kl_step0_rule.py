"""One step-0 rule: the in-run KL checker, `grpolab gate` and the UI's Health page give the same
verdict on the same run directory (a real `grpolab train` run and doctored copies of it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpolab.checkers import step0
from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.kl import check_kl
from grpolab.cli import main
from grpolab.rundir import reader
from grpolab.ui import health
from grpolab.ui.runstore import RunStore


def _in_run(run_dir: Path) -> bool:
    """The KL checker on the run's first step, called as the harness calls it at that step."""
    first = step0.first_step(reader.read_metrics(run_dir))
    assert first is not None and first.rollout_id is not None
    try:
        check_kl(first.metrics, rollout_id=first.rollout_id, step_in_rollout=0, first_step_of_run=True)
    except CheckFailure:
        return False
    return True


def _gate(run_dir: Path, *flags: str) -> bool:
    code = main(["gate", str(run_dir), "--step0-kl", "1e-9", *flags])
    assert code in (0, 1)
    return code == 0


def _ui(run_dir: Path, gap_range: tuple[float, float] | None = None) -> list[health.Signal]:
    """The Health page's step-0 table, computed as the page does (through the RunStore)."""
    store = RunStore([run_dir])
    (info,) = store.list_runs()
    first = step0.first_step(store.records(info.run_id))
    odd = {} if first is None else store.non_numeric(info.run_id).get(first.line_no, {})
    return health.step0_checks(first, gap_range=gap_range, non_numeric=odd)


_DELETE = object()
"""A `_doctor` value: remove the key from the first step record."""


def _doctor(short_run: Path, dest: Path, **first_step: object) -> Path:
    """A copy whose first step record holds `first_step` (keys with __ for /; the value _DELETE removes
    the key); a `step` key renumbers it."""
    run = Path(shutil.copytree(short_run, dest))
    path = run / reader.METRICS_FILE
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    first = next(r for r in rows if r["kind"] == "step")
    if "step" in first_step:
        first["step"] = int(first_step.pop("step"))  # type: ignore[call-overload]
    for key, value in first_step.items():
        if value is _DELETE:
            del first["metrics"][key.replace("__", "/")]
        else:
            first["metrics"][key.replace("__", "/")] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_real_run_passes_everywhere(short_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _in_run(short_run) and _gate(short_run)
    signals = _ui(short_run)
    assert [s.status for s in signals] == ["ok", "ok", "n/a"]  # no baseline range chosen
    assert signals[0].evidence == "0 (step 0)"


@pytest.mark.parametrize(
    "doctored",
    [
        {"train__ppo_kl": 2e-9},
        {"train__pg_clipfrac": 1e-9},
        {"train__kl_loss": 1e-6},  # logged (--use-kl-loss): the reference is not the initial policy
        {"train__ppo_kl": 5e-9, "step": 7},  # the first step record is step 0 whatever its number
    ],
)
def test_a_broken_first_step_fails_everywhere(
    short_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], doctored: dict[str, float]
) -> None:
    run = _doctor(short_run, tmp_path / "bad", **doctored)
    assert not _in_run(run) and not _gate(run)
    statuses = {s.key: s.status for s in _ui(run)}
    assert "red" in statuses.values()
    bad_key = next(k for k in doctored if k != "step").replace("__", "/")
    assert statuses[bad_key] == "red"


@pytest.mark.parametrize(
    ("key", "value", "evidence"),
    [
        ("train__ppo_kl", None, "not a number: null in"),
        ("train__ppo_kl", "abc", 'not a number: "abc" in'),
        ("train__pg_clipfrac", {"a": 1}, 'not a number: {"a": 1} in'),
        ("train__ppo_kl", _DELETE, "missing from"),
    ],
)
def test_a_first_step_without_the_number_fails_in_the_gate_and_the_ui(
    short_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    key: str,
    value: object,
    evidence: str,
) -> None:
    """A step-0 key that is missing from the first step record, or not a number there: the gate fails it
    ("key not found") and the Health page shows it red, saying which. (The in-run checker judges the
    trainer's own numbers, never the file, so it has no such case.)"""
    run = _doctor(short_run, tmp_path / "odd", **{key: value})
    assert not _gate(run)
    assert f"FAIL step0-kl {key.replace('__', '/')}: key not found" in capsys.readouterr().out
    row = next(s for s in _ui(run) if s.key == key.replace("__", "/"))
    first = step0.first_step(reader.read_metrics(run))
    assert first is not None
    assert row.status == "red"
    assert row.evidence == f"{evidence} the first step record (step 0, line {first.line_no})"
    (info,) = RunStore([run]).list_runs()
    dropped = [w for w in info.warnings if "not a number" in w]
    assert bool(dropped) == (value is not _DELETE)


def test_gap_range_rule_is_the_gates_in_the_ui(
    short_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The healthy run as baseline: its own gap passes the auto range (widened by the gate's default
    margin) in both; a copy whose step-0 gap is 2x or 5x the baseline's fails in both."""
    gap = step0.first_step(reader.read_metrics(short_run)).metrics[step0.GAP_KEY]  # type: ignore[union-attr]
    assert gap > 0
    base = [str(short_run), "--baseline", str(short_run), "--gap-range", "auto"]
    ui_range = health.baseline_gap_range([step0.first_step(reader.read_metrics(short_run))])
    assert ui_range == pytest.approx((gap * 0.9, gap * 1.1))
    assert main(["gate", *base]) == 0
    assert _ui(short_run, ui_range)[-1].status == "ok"
    for factor, ui_status in ((2.0, "watch"), (5.0, "red")):
        run = _doctor(
            short_run, tmp_path / f"gap{factor:g}", **{"train__train_rollout_logprob_abs_diff": gap * factor}
        )
        assert main(["gate", str(run), "--baseline", str(short_run), "--gap-range", "auto"]) == 1
        assert _ui(run, ui_range)[-1].status == ui_status  # watch or red: both fail the gate
