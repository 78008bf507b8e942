"""`grpolab gate`: step-0 KL, step-0 gap ranges (explicit and from baselines), metric gates, exit codes.

The fixture logs `fixtures/logs/gate_*.log` are Miles console logs (Ray actor + Miles timestamp
prefix, both `perf N:` lines, `step N` printed twice) built on the Miles 101 manual's numbers:
healthy Qwen3-0.6B seeds have a step-0 `train/train_rollout_logprob_abs_diff` of 0.0148-0.0157
(troubleshooting entry "The gap at step 0 is far above your range"; `gate_seed1/2/3.log` carry
0.0148, 0.0157, 0.0151, seed 3 without any prefix), the manual's own first step logged 0.015336457639932632 (`gate_candidate_ok.log`), and a
gap several times the range means the two sides do not compute the same model
(`gate_candidate_bad_gap.log`, 0.05).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.checkers.gate import GAP_KEY, GateInputError, gate, parse_gap_range, parse_metric_expr
from grpolab.cli import main

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
SEEDS = [str(LOGS / f"gate_seed{i}.log") for i in (1, 2, 3)]
OK = str(LOGS / "gate_candidate_ok.log")
BAD_GAP = str(LOGS / "gate_candidate_bad_gap.log")
PREFIX = (
    "(FSDPTrainRayActor pid=2551) [2026-10-17 15:58:15.687 actor_cell00000_rank00000] log_utils.py:554 - "
)


def miles_log(tmp_path: Path, steps: dict[int, dict[str, float]], name: str = "run.log") -> str:
    """Write a Miles log with one `rollout N` and two identical `step N` lines per entry."""
    lines = ["[2026-10-17 15:53:16.726 launcher] common.py:290 - EXEC: python3 train.py --seed 1"]
    for n, metrics in steps.items():
        lines.append(f"{PREFIX.replace('554', '125')}rollout {n}: {{'rollout/raw_reward': 0.62890625}}")
        lines += [f"{PREFIX}step {n}: {metrics!r}"] * 2
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def step0(**overrides: float) -> dict[str, float]:
    base = {"train/loss": -0.0021, "train/pg_clipfrac": 0.0, "train/ppo_kl": 0.0, GAP_KEY: 0.0153}
    return {**base, **{k.replace("__", "/"): v for k, v in overrides.items()}}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["gate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def auto(*extra: str) -> list[str]:
    return [*(a for s in SEEDS for a in ("--baseline", s)), "--gap-range", "auto", *extra]


# --- gap range ---------------------------------------------------------------------------------


def test_manual_step0_gap_inside_the_healthy_seeds_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, OK, *auto())
    assert code == 0, out
    # [0.0148 * 0.9, 0.0157 * 1.1]; the derived range and its source runs are printed.
    assert "gap range (auto): [0.01332, 0.01727]" in out
    assert "min 0.0148 .. max 0.0157" in out and "--gap-margin 0.1" in out
    for seed in SEEDS:
        assert seed in out
    row = next(line for line in out.splitlines() if line.startswith("gap-range"))
    assert "0.0153365" in row and "PASS" in row and "step 0 @ gate_candidate_ok.log:4" in row
    assert out.rstrip().endswith("gate: PASS (1/1 checks passed)")


def test_baselines_after_one_flag_or_repeated_flags_are_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's `--baseline A B C` and `--baseline A --baseline B --baseline C` give one report."""
    code, together, _ = run(capsys, OK, "--baseline", *SEEDS, "--gap-range", "auto")
    assert code == 0 and together == run(capsys, OK, *auto())[1]
    assert f"from {len(SEEDS)} baseline(s)" in together


def test_gap_several_times_the_range_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, BAD_GAP, *auto())
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("gap-range"))
    assert "0.05" in row and "FAIL" in row
    assert "2.9x the upper bound" in out and "checkpoint path" in out
    assert "gate: FAIL (0/1 checks passed)" in out


def test_gap_margin_changes_the_derived_range(capsys: pytest.CaptureFixture[str]) -> None:
    # With margin 0 the range is exactly [0.0148, 0.0157]; 0.0153 is still inside.
    code, out, _ = run(capsys, OK, *auto("--gap-margin", "0"))
    assert code == 0 and "gap range (auto): [0.0148, 0.0157]" in out
    report = gate(OK, baselines=SEEDS[:1], gap_range="auto", gap_margin=0.0)  # one seed: [0.0148, 0.0148]
    assert not report.passed and report.gap_range is not None and report.gap_range.hi == 0.0148


@pytest.mark.parametrize(("spec", "code"), [("0.014:0.016", 0), ("0.0155:0.016", 1), ("0.01:0.0153", 1)])
def test_explicit_gap_range(capsys: pytest.CaptureFixture[str], spec: str, code: int) -> None:
    got, out, _ = run(capsys, OK, "--gap-range", spec)
    assert got == code, out
    assert "(explicit --gap-range)" in out


def test_auto_without_baseline_cannot_judge(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, OK, "--gap-range", "auto")
    assert code == 2 and out == ""
    assert "--gap-range auto needs at least one --baseline" in err


def test_baseline_without_a_gap_cannot_serve(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = miles_log(tmp_path, {0: {"train/ppo_kl": 0.0}}, "base.log")
    code, _, err = run(capsys, OK, "--baseline", base, "--gap-range", "auto")
    assert code == 2 and f"baseline {base}" in err and "key not found; keys present: train/ppo_kl" in err


def test_explicit_range_ignores_baselines_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, OK, "--baseline", SEEDS[0], "--gap-range", "0.01:0.02")
    assert code == 0 and "--baseline is only used by --gap-range auto" in out


# --- step-0 KL ---------------------------------------------------------------------------------


def test_step0_kl_passes_on_the_manual_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, OK, "--step0-kl", "1e-9")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("step0-kl")]
    assert len(rows) == 2  # train/ppo_kl with the given T, train/pg_clipfrac with Miles' 1e-10
    assert "train/ppo_kl" in rows[0] and "|x| < 1e-09" in rows[0] and "step 0 @" in rows[0]
    assert "train/pg_clipfrac" in rows[1] and "|x| < 1e-10" in rows[1]


def test_step0_kl_fails_and_names_the_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = miles_log(tmp_path, {0: step0(train__ppo_kl=2.3e-06), 1: step0()})
    code, out, _ = run(capsys, log, "--step0-kl", "1e-9")
    assert code == 1
    row = next(line for line in out.splitlines() if "train/ppo_kl" in line)
    assert "2.3e-06" in row and "FAIL" in row and "step 0 @ run.log:3" in row
    assert "1/2 checks passed" in out


def test_step0_clipfrac_is_checked_too(tmp_path: Path) -> None:
    report = gate(miles_log(tmp_path, {0: step0(train__pg_clipfrac=0.0123)}), step0_kl=1e-9)
    assert [c.passed for c in report.checks] == [True, False]


def test_step0_kl_loss_is_checked_when_logged(tmp_path: Path) -> None:
    # --use-kl-loss runs log train/kl_loss: at step 0 the policy is the reference (Miles check_kl, < 1e-9)
    report = gate(miles_log(tmp_path, {0: step0(train__kl_loss=1e-6)}), step0_kl=1e-9)
    assert [(c.key, c.passed) for c in report.checks] == [
        ("train/ppo_kl", True),
        ("train/pg_clipfrac", True),
        ("train/kl_loss", False),
    ]
    assert report.checks[2].expectation == "|x| < 1e-09 (Miles)" and "reference" in report.checks[2].detail
    assert gate(miles_log(tmp_path, {0: step0(train__kl_loss=0.0)}, "ok.log"), step0_kl=1e-9).passed


def test_first_step_of_a_resumed_log_is_the_one_checked(tmp_path: Path) -> None:
    # A resumed Miles run's first step line is `step 2` (manual: save/restart test); that step is checked.
    report = gate(miles_log(tmp_path, {2: step0(train__ppo_kl=0.5), 3: step0()}), step0_kl=1e-9)
    assert not report.passed and report.checks[0].record == "step 2"


def test_no_check_requested_runs_the_miles_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, OK)
    assert code == 0 and "running the default --step0-kl 1e-09" in out and "train/ppo_kl" in out


def test_step0_kl_missing_key_fails(tmp_path: Path) -> None:
    report = gate(miles_log(tmp_path, {0: {GAP_KEY: 0.0153}}), step0_kl=1e-9)
    assert not report.passed
    assert report.checks[0].value is None and "keys present: " + GAP_KEY in report.checks[0].detail


# --- metric ------------------------------------------------------------------------------------


def test_metric_uses_the_last_value(capsys: pytest.CaptureFixture[str]) -> None:
    # rollout/raw_reward is 0.62890625 at rollout 0 and 0.59375 at rollout 1 (the last).
    code, out, _ = run(capsys, OK, "--metric", "rollout/raw_reward>=0.5", "--metric", "train/grad_norm<1")
    assert code == 0
    assert "last value >= 0.5" in out and "last of 2: rollout 1 @ gate_candidate_ok.log:8" in out
    code, out, _ = run(capsys, OK, "--metric", "rollout/raw_reward > 0.6")
    assert code == 1 and "0.59375" in out and "FAIL" in out


def test_metric_missing_key_lists_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, OK, "--metric", "eval/gsm8k>=0.7")
    assert code == 1
    detail = next(line for line in out.splitlines() if line.startswith("FAIL metric eval/gsm8k"))
    assert "key not found; keys present: perf/" in detail and "rollout/raw_reward" in detail


@pytest.mark.parametrize(
    "expr", ["rollout/raw_reward=>0.5", "rollout/raw_reward", ">=0.5", "k>=abc", "k!=1", "k>=nan"]
)
def test_bad_metric_expression_names_the_flag(capsys: pytest.CaptureFixture[str], expr: str) -> None:
    code, out, err = run(capsys, OK, "--metric", expr)
    assert code == 2 and out == ""
    assert f"--metric {expr!r}: expected KEY>=X, KEY<=X, KEY>X, KEY<X or KEY==X" in err


def test_metric_expression_forms() -> None:
    assert parse_metric_expr(" eval/arith >= 0.5 ") == parse_metric_expr("eval/arith>=0.5")
    assert parse_metric_expr("a<=1e-3").op == "<=" and parse_metric_expr("a==2").threshold == 2.0
    assert parse_gap_range("auto") is None and parse_gap_range("0.013:0.017") == (0.013, 0.017)


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--gap-range", "0.02:0.01", "--gap-range '0.02:0.01': expected 'auto' or LO:HI"),
        ("--gap-range", "0.01", "--gap-range '0.01': expected 'auto' or LO:HI"),
        ("--gap-margin", "-0.1", "--gap-margin -0.1: expected a relative margin >= 0"),
        ("--step0-kl", "0", "--step0-kl 0.0: expected a positive tolerance"),
    ],
)
def test_bad_flag_values_name_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, needle: str
) -> None:
    code, _, err = run(capsys, OK, flag, value)
    assert code == 2 and needle in err


# --- inputs ------------------------------------------------------------------------------------


def test_log_without_step_lines_cannot_judge(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "early.log"
    path.write_text(f"{PREFIX.replace('554', '125')}rollout 0: {{'rollout/raw_reward': 0.6}}\n")
    code, _, err = run(capsys, str(path), "--step0-kl", "1e-9")
    assert code == 2 and f"no `step N: {{...}}` lines in {path}" in err
    code, _, err = run(capsys, str(LOGS / "miles_dead_engine.log"))
    assert code == 2 and "no `step N: {...}` lines in" in err


def test_unreadable_inputs_cannot_judge(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, str(tmp_path / "missing.log"))
    assert code == 2 and "cannot read" in err and "missing.log" in err
    code, _, err = run(capsys, str(tmp_path))
    assert code == 2 and "is not a run directory" in err
    code, _, err = run(capsys, OK, "--baseline", str(tmp_path / "nope.log"), "--gap-range", "auto")
    assert code == 2 and "nope.log" in err


def test_log_without_any_prefix_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "bare.log"
    path.write_text(f"step 0: {step0()!r}\n")
    report = gate(str(path), step0_kl=1e-9, gap_range="0.015:0.016")
    assert report.passed and report.checks[-1].value == 0.0153


def test_metrics_jsonl_half_written_last_line_is_skipped_but_a_bad_middle_line_is_not(tmp_path: Path) -> None:
    good = json.dumps({"kind": "step", "rollout_id": 0, "step": 0, "time": 1.0, "metrics": step0()})
    (tmp_path / "metrics.jsonl").write_text(good + '\n{"kind": "perf", "metr')
    assert gate(str(tmp_path), step0_kl=1e-9).passed
    (tmp_path / "metrics.jsonl").write_text('{"kind": \n' + good + "\n")
    with pytest.raises(GateInputError, match=r"metrics.jsonl:1: not a metrics.jsonl record"):
        gate(str(tmp_path), step0_kl=1e-9)


# --- JSON --------------------------------------------------------------------------------------


def test_json_holds_the_same_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [BAD_GAP, *auto("--step0-kl", "1e-9", "--metric", "rollout/raw_reward>=0.5", "--metric", "nope>1")]
    code, text, _ = run(capsys, *argv)
    code_json, out, _ = run(capsys, *argv, "--json")
    doc = json.loads(out)
    assert code == code_json == doc["exit_code"] == 1 and doc["verdict"] == "FAIL"
    results = [(c["check"], c["key"], c["result"]) for c in doc["checks"]]
    assert results == [
        ("step0-kl", "train/ppo_kl", "PASS"),
        ("step0-kl", "train/pg_clipfrac", "PASS"),
        ("gap-range", GAP_KEY, "FAIL"),
        ("metric", "rollout/raw_reward", "PASS"),
        ("metric", "nope", "FAIL"),
    ]
    for check, key, result in results:
        assert any(check in line and key in line and result in line for line in text.splitlines())
    gap = doc["checks"][2]
    assert gap["value"] == 0.05 and gap["record"] == "step 0" and gap["line_no"] == 4
    assert doc["gap_range"]["mode"] == "auto" and [b["value"] for b in doc["gap_range"]["baselines"]] == [
        0.0148,
        0.0157,
        0.0151,
    ]
    assert doc["checks"][4]["value"] is None and "key not found" in doc["checks"][4]["detail"]


def test_json_error_document_and_nan_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, OK, "--metric", "bad", "--json")
    assert code == 2 and json.loads(out)["verdict"] == "ERROR" and "--metric" in json.loads(out)["error"]
    log = miles_log(tmp_path, {0: step0(train__ppo_kl=float("nan"))})
    code, out, _ = run(capsys, log, "--step0-kl", "1e-9", "--json")
    doc = json.loads(out)  # strict JSON: NaN is written as the string "nan"
    assert code == 1 and doc["checks"][0]["value"] == "nan" and doc["checks"][0]["result"] == "FAIL"


# --- our own run directory ---------------------------------------------------------------------


def test_own_run_dir_passes_step0_kl(capsys: pytest.CaptureFixture[str], short_run: Path) -> None:
    own_run = short_run  # a real `grpolab train` run directory (tests/conftest.py)
    code, out, _ = run(capsys, str(own_run), "--step0-kl", "1e-9")
    assert code == 0, out
    assert f"(read {own_run / 'metrics.jsonl'})" in out and "step 0 @ metrics.jsonl:" in out
    status_row = next(line for line in out.splitlines() if line.startswith("status"))
    assert status_row.split()[:3] == ["status", "status", "finished"] and "2/2 rollouts @ events.jsonl" in out
    assert out.rstrip().endswith("gate: PASS (3/3 checks passed)")
    code, out, _ = run(capsys, str(own_run), "--step0-kl", "1e-9", "--metric", "perf/step_time>0", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "PASS" and len(doc["checks"]) == 4
    assert doc["checks"][0]["check"] == "status" and doc["checks"][0]["shown"] == "finished"
    assert doc["run_status"] == {
        "status": "finished", "reason": "", "rollouts_done": 2, "rollouts_asked": 2, "complete": True
    }  # fmt: skip
    # Our run also serves as a baseline (a CPU float32 run: its gap is far below the GPU range).
    report = gate(str(own_run), baselines=[str(own_run)], gap_range="auto")
    assert (
        report.passed and report.gap_range is not None and report.gap_range.baselines[0]["record"] == "step 0"
    )


# --- a run that never reached its first step -----------------------------------------------------


@pytest.fixture(scope="module")
def early_failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real `grpolab train` runs that failed before their first optimizer step: a fault raised in
    train at rollout 0 (metrics.jsonl holds the rollout record only) and a reward function that
    raised (no metrics.jsonl at all); and one that failed after it (`train1`: the fault at rollout 1,
    so step 0 is healthy)."""
    import sys

    from runs import train_short

    root = tmp_path_factory.mktemp("early")
    (root / "badrm.py").write_text("def reward(sample):\n    raise RuntimeError('verifier crashed')\n")
    fault = '[{"at_rollout": 0, "action": "raise_in_train"}]'
    runs = {"train": (root / "train", "--ci-ft-test-actions", fault)}
    runs["train1"] = (
        root / "train1",
        "--ci-ft-test-actions",
        fault.replace('"at_rollout": 0', '"at_rollout": 1'),
    )
    runs["reward"] = (root / "reward", "--custom-rm-path", "badrm.reward")
    sys.path.insert(0, str(root))
    try:
        for run_dir, *extra in runs.values():
            with pytest.raises(Exception):  # noqa: B017 (the runs fail on purpose; the gate reads why)
                train_short(run_dir, *extra)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("badrm", None)
    return {name: spec[0] for name, spec in runs.items()}


def test_a_run_failed_before_its_first_step_says_so_and_why(
    capsys: pytest.CaptureFixture[str], early_failures: dict[str, Path]
) -> None:
    """It said `cannot read RUN/metrics.jsonl` (or only that no step record was found): it names the
    failure and its recorded error, still exit 2 (cannot judge)."""
    train_run, reward_run = early_failures["train"], early_failures["reward"]
    assert not (reward_run / "metrics.jsonl").exists() and (train_run / "metrics.jsonl").exists()
    code, out, err = run(capsys, str(reward_run))
    assert code == 2 and out == "" and "cannot read" not in err
    head = f"grpolab gate: error: no step record in {reward_run}: the run never reached its first step"
    assert err.startswith(head + ": it failed at rollout 0: ")  # then the status event's error, quoted whole:
    error = json.loads((reward_run / "events.jsonl").read_text().splitlines()[-1])["error"]
    assert "reward" in error and "verifier crashed" in error and f"at rollout 0: {error}; nothing" in err
    assert err.rstrip().endswith("; nothing to judge")
    code, _, err = run(capsys, str(train_run / "metrics.jsonl"))
    assert (
        code == 2 and f"no step record in {train_run}: the run never reached its first step: it failed" in err
    )
    assert "InjectedFault: injected fault: raise_in_train on rank 0 at rollout 0" in err
    code, out, _ = run(capsys, str(early_failures["train"]), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["exit_code"] == 2 and "never reached its first step: it failed" in doc["error"]
    # a baseline that failed early is named the same way
    code, _, err = run(capsys, OK, "--baseline", str(reward_run), "--gap-range", "auto")
    assert code == 2 and f"no step record in {reward_run}: the run never reached its first step" in err


def test_a_run_without_a_final_status_and_no_step_is_crashed_or_interrupted(
    capsys: pytest.CaptureFixture[str], early_failures: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    killed = shutil.copytree(early_failures["reward"], tmp_path / "killed")
    events = (killed / "events.jsonl").read_text().splitlines()
    (killed / "events.jsonl").write_text("\n".join(events[:-1]) + "\n")  # no final status: killed
    old = json.loads((killed / "ranks" / "0.json").read_text())
    old["heartbeat"]["time"] -= 3600  # its heartbeat an hour old: not running any more
    (killed / "ranks" / "0.json").write_text(json.dumps(old))
    code, _, err = run(capsys, str(killed))
    assert code == 2 and "never reached its first step: it stopped without a final status event" in err
    assert str(killed / "console.log") in err
    last = json.loads(events[-1])
    (killed / "events.jsonl").write_text(
        "\n".join([*events[:-1], json.dumps({**last, "status": "interrupted", "error": None})]) + "\n"
    )
    code, _, err = run(capsys, str(killed))
    assert code == 2 and "never reached its first step: it was interrupted at rollout 0" in err


# --- the status row: a run that failed, crashed or ran short does not pass ------------------------


def test_a_run_that_failed_after_a_healthy_step_fails_the_gate(
    capsys: pytest.CaptureFixture[str], early_failures: dict[str, Path]
) -> None:
    """It said `gate: PASS (2/2 checks passed)`: step 0 is healthy, but the run failed at rollout 1."""
    failed = early_failures["train1"]
    code, out, _ = run(capsys, str(failed))
    assert code == 1, out
    assert "FAIL status status: the run is failed, 1/2 rollouts: it failed at rollout 1: " in out
    assert "InjectedFault: injected fault: raise_in_train on rank 0 at rollout 1" in out
    assert "--allow-status failed accepts it" in out
    assert "step0-kl  train/ppo_kl" in out and out.rstrip().endswith("gate: FAIL (2/3 checks passed)")
    code, out, _ = run(capsys, str(failed), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "FAIL" and doc["run_status"]["status"] == "failed"
    assert doc["run_status"]["complete"] is False and doc["checks"][0]["result"] == "FAIL"
    for allowed in (["failed"], ["any"], ["crashed,failed"], ["crashed", "failed"]):
        code, out, _ = run(capsys, str(failed), "--allow-status", *allowed)
        assert code == 0 and "(accepted by --allow-status)" in out, (allowed, out)
    code, out, _ = run(capsys, str(failed), "--allow-status", "crashed")
    assert code == 1


def test_a_finished_run_with_fewer_rollouts_than_asked_fails(
    capsys: pytest.CaptureFixture[str], short_run: Path, tmp_path: Path
) -> None:
    import shutil

    short = shutil.copytree(short_run, tmp_path / "short")
    events = [json.loads(line) for line in (short / "events.jsonl").read_text().splitlines()]
    assert events[-1]["status"] == "finished" and events[-1]["rollouts"] == 2
    events[-1]["rollouts"] = 1
    (short / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    code, out, _ = run(capsys, str(short))
    assert (
        code == 1 and "the run is finished, 1/2 rollouts: it ran 1 of the 2 rollouts it was asked for" in out
    )
    assert "--allow-status any accepts it" in out
    code, _, err = run(capsys, str(short), "--allow-status", "finished")
    assert code == 2  # not a status --allow-status takes: the flag is named
    assert (
        "--allow-status 'finished': expected one or more of failed, interrupted, running, crashed, any" in err
    )
    code, _, _ = run(capsys, str(short), "--allow-status", "any")
    assert code == 0


def test_a_killed_run_is_crashed_at_once_and_fails(
    capsys: pytest.CaptureFixture[str], short_run: Path, tmp_path: Path
) -> None:
    """No final status event and its rank's pid gone on this host: crashed, not "running"."""
    import shutil
    import subprocess
    import sys

    killed = shutil.copytree(short_run, tmp_path / "killed")
    events = (killed / "events.jsonl").read_text().splitlines()
    (killed / "events.jsonl").write_text("\n".join(events[:-1]) + "\n")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    rank = json.loads((killed / "ranks" / "0.json").read_text())
    rank["pid"] = int(gone.stdout)  # a pid that ran on this host and is over; its heartbeat is recent
    (killed / "ranks" / "0.json").write_text(json.dumps(rank))
    code, out, _ = run(capsys, str(killed))
    assert code == 1 and "the run is crashed, 2/2 rollouts: it stopped without a final status event" in out


def test_a_foreign_log_has_no_status_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, OK, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["run_status"] is None and all(c["check"] != "status" for c in doc["checks"])
