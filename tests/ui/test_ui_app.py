"""AppTest smoke tests: every page on the session's real runs and Miles log, asserting the numbers shown."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from grpolab.ui.runstore import RunStore

APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"


def _app(monkeypatch: pytest.MonkeyPatch, *roots: Path, selected: list[str] | None = None) -> AppTest:
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", ":".join(str(r) for r in roots))
    at = AppTest.from_file(str(APP), default_timeout=120)
    if selected is not None:
        at.session_state["selected_runs"] = selected
    return at.run()


def _texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def test_runs_page(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root)
    assert not at.exception
    table = at.dataframe[0].value.set_index("run")
    assert {"a", "b", "a-step3", "a-late", "no-runjson", "logs/miles_plain.log"} <= set(table.index)
    assert table.loc["a", "status"] == "finished" and table.loc["a", "steps"] == 4
    assert table.loc["a", "source"] == "grpolab" and table.loc["a", "seed"] == 1234
    assert table.loc["b", "seed"] == 7
    assert table.loc["no-runjson", "status"] == "incomplete"
    assert table.loc["logs/miles_plain.log", "source"] == "miles log"
    assert table.loc["logs/miles_plain.log", "status"] == "ended"
    assert table.loc["logs/miles_plain.log", "steps"] == 10
    assert table.loc["logs/miles_plain.log", "last reward"] == pytest.approx(171 / 256)
    assert table.loc["logs/miles_plain.log", "model"] == "/root/models/Qwen3-0.6B"
    store = RunStore([ui_root])
    assert table.loc["a", "last reward"] == store.frame("a").loc[("rollout", 3), "rollout/raw_reward"]
    warnings = _texts(at, "warning")
    assert any("miles_dead_engine.log" in w and "no metric lines" in w for w in warnings)
    assert any("no-runjson" in w and "run.json is missing" in w for w in warnings)
    at.text_input(key="runs_filter").input("miles").run()
    assert set(at.dataframe[0].value["run"]) == {"logs/miles_plain.log", "logs/miles_dead_engine.log"}


def test_compare_first_divergence_is_step_3(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root, selected=["a", "a-step3", "b"])
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception
    assert at.multiselect(key="compare_runs").value == ["a", "a-step3", "b"]
    assert (at.selectbox(key="diff_a").value, at.selectbox(key="diff_b").value) == ("a", "a-step3")
    assert len(at.get("plotly_chart")) >= 1
    metric = at.metric[0]
    assert metric.label == "First divergence step" and int(metric.value) == 3
    assert any("rollout/raw_reward" in c and "train/loss" in c for c in _texts(at, "caption"))
    diff = next(d.value for d in at.dataframe if "diverged" in d.value.columns)
    assert list(diff.index[diff["diverged"]]) == [3]
    at.number_input(key="diff_tol").set_value(1.0).run()
    assert any("No key differs over 4 common steps" in s for s in _texts(at, "markdown"))
    # a different seed diverges at once
    at.selectbox(key="diff_b").set_value("b").run()
    at.number_input(key="diff_tol").set_value(0.0).run()
    assert int(at.metric[0].value) == 0


def test_compare_with_a_miles_log_and_a_seed_band(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root, selected=["a", "b", "logs/miles_plain.log"])
    at.switch_page("app_pages/compare.py").run()
    at.multiselect(key="compare_baseline").set_value(["a", "b"]).run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 2  # raw_reward and response_lengths, on steps 0-3 of all three
    verdicts = [d.value for d in at.dataframe if "outside the seed spread" in d.value.columns]
    assert verdicts and verdicts[0]["run"].tolist() == ["logs/miles_plain.log"]
    assert bool(verdicts[0]["outside the seed spread"].iloc[0])  # 0.6-0.7 reward vs tiny runs near 0
    store = RunStore([ui_root])
    expect = (
        store.frame("logs/miles_plain.log").xs("rollout", level="kind")["rollout/raw_reward"].loc[0:3].mean()
    )
    assert verdicts[0]["mean of last 4 steps"].iloc[0] == pytest.approx(expect)
    diff = [d.value for d in at.dataframe if "a" in d.value.columns and "b" in d.value.columns][0]
    assert (
        "run.seed" in diff.index and diff.loc["run.seed", "a"] == "1234" and diff.loc["run.seed", "b"] == "7"
    )
    assert diff.loc["flags.hf-checkpoint", "logs/miles_plain.log"] == "/root/models/Qwen3-0.6B"
    assert diff.loc["flags.hf-checkpoint", "a"] == "—"  # a key the run does not have
    assert len(at.get("download_button")) >= 1


def test_compare_without_common_steps(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root, selected=["a", "a-late"])
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception
    warnings = _texts(at, "warning")
    assert any("rollout/raw_reward: no step number is common" in w for w in warnings)
    assert any("a and a-late have no common step numbers" in w for w in warnings)
    assert len(at.get("plotly_chart")) == 0


def test_health_page_on_the_miles_log(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root, selected=["logs/miles_plain.log"])
    at.switch_page("app_pages/health.py").run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("signal")
    assert len(table) == 8
    assert table.loc["pg_clipfrac", "status"].endswith("ok") and table.loc[
        "pg_clipfrac", "evidence"
    ].startswith("max 0 ")
    assert table.loc["entropy collapse", "status"].endswith("n/a")
    assert "logged 0 at every step" in table.loc["entropy collapse", "evidence"]
    assert table.loc["kl_loss jumps", "status"].endswith("n/a")
    assert table.loc["log-prob gap climbing", "status"].endswith("ok")
    assert "max 0.0161 (step 1)" in table.loc["log-prob gap climbing", "evidence"]
    assert "first rollout 0.312" in table.loc["zero-std group share", "evidence"]  # 10 of 32 groups
    assert "of 32 groups" in table.loc["zero-std group share", "evidence"]
    assert "0 of 10 steps ≥ clip 1" in table.loc["grad_norm hitting the clip", "evidence"]
    step0 = at.dataframe[1].value.set_index("signal")
    assert step0.loc["step 0 train/ppo_kl", "status"].endswith("ok")
    assert step0.loc["step 0 gap vs baseline", "evidence"].startswith("0.0153365")
    at.multiselect(key="health_baseline").set_value(["a", "b"]).run()
    step0 = at.dataframe[1].value.set_index("signal")
    assert step0.loc["step 0 gap vs baseline", "status"].endswith("red")  # 0.0153 vs ~6e-7 on the tiny model
    assert len(at.get("plotly_chart")) == 1


def test_health_page_on_a_tiny_run(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root, selected=["a"])
    at.switch_page("app_pages/health.py").run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("signal")
    assert "4 rollouts logged; a trend needs ≥ 5" in table.loc["reward trend and collapse", "evidence"]
    assert "of 2 groups" in table.loc["zero-std group share", "evidence"]
    assert _texts(at, "success") == ["Run status: finished, 4/4 rollouts."] and not at.error


def test_health_page_says_a_failed_run_fails_the_gate(
    ui_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Health page showed a failed run's healthy signals and nothing else: it says the status
    and the reason, by the rule of `grpolab gate`'s status row."""
    failed = shutil.copytree(ui_root / "a", tmp_path / "failed")
    events = [json.loads(line) for line in (failed / "events.jsonl").read_text().splitlines()]
    end = {**events[-1], "status": "failed", "rollout_id": 3, "error": "RuntimeError: engine died"}
    end.pop("rollouts", None)
    (failed / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [*events[:-1], end]))
    at = _app(monkeypatch, tmp_path, selected=["failed"])
    at.switch_page("app_pages/health.py").run()
    assert not at.exception and not at.success
    assert _texts(at, "error") == [
        "Run status: failed, 3/4 rollouts: it failed at rollout 3: RuntimeError: engine died. "
        "`grpolab gate` fails this run (its status row)."
    ]


def test_rollouts_page_runs_replay_logprobs(
    ui_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(ui_root / "a", tmp_path / "a")  # the command writes into the run directory
    at = _app(monkeypatch, tmp_path, selected=["a"])
    at.switch_page("app_pages/rollouts.py").run()
    assert not at.exception
    answers = at.dataframe[0].value
    assert len(answers) == 4 and set(answers["finish"]) <= {"stop", "length"}
    assert len(at.get("plotly_chart")) == 1
    captions = " ".join(_texts(at, "caption"))
    assert "Ranked by the lowest engine log-prob" in captions
    assert f"grpolab replay logprobs {(tmp_path / 'a').resolve()} --rollout 0" in captions
    at.button(key="rollouts_recompute").click().run()  # starts the command, polls it until it ends
    assert not at.exception
    assert (tmp_path / "a" / "logprobs" / "rollout_0.json").is_file()
    assert len(at.get("plotly_chart")) == 2
    line = next(m for m in _texts(at, "markdown") if m.startswith("Recomputed mean |gap|"))
    number = r"([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"
    recomputed = float(re.search(r"of token means\): " + number, line).group(1))
    logged = float(re.search(r"logprob_abs_diff of this rollout: step 0: " + number, line).group(1))
    assert recomputed == pytest.approx(logged, rel=1e-4)  # both printed with 6 significant digits
    assert "Weights: initial weights of --hf-checkpoint" in line
    worst = at.dataframe[-1].value
    assert len(worst) == 20 and worst["|gap|"].is_monotonic_decreasing
    # rollout 1: the weights changed after rollout 0 and no checkpoint was saved: the command fails
    at.selectbox(key="rollouts_id").set_value(1).run()
    at.button(key="rollouts_recompute").click().run()
    assert not at.exception
    assert any("failed (exit 2)" in e for e in _texts(at, "error"))
    assert any("no checkpoint of the weights before rollout 1" in c for c in _texts(at, "code"))
    assert not (tmp_path / "a" / "logprobs" / "rollout_1.json").exists()


def _plain(markdown: str) -> str:
    """Markdown as the page wrote it, without its backslash escapes."""
    return re.sub(r"\\(.)", r"\1", markdown)


def test_diagnose_page_shows_hang_reports_and_log_findings(
    hang_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _app(monkeypatch, hang_run.parent, selected=["hung"])
    at.switch_page("app_pages/diagnose.py").run()
    assert not at.exception
    titles = [_plain(t) for t in _texts(at, "subheader")]
    assert titles == [  # newest report first
        "Mismatched collectives (pattern B): rank 1 waits in barrier, ranks 0, 2 in all_reduce",
        "Not hung: the ranks progressed between the two samples",
    ]
    assert any(e.startswith("**Hung** · AReaL pattern B · every rank's stack") for e in _texts(at, "error"))
    assert any(e.startswith("**Not hung** · rank 0 moved") for e in _texts(at, "success"))
    assert any(
        c.startswith("Taken 2026-11-30 02:46:35 UTC · diagnose/20261130T024635Z/")
        for c in _texts(at, "caption")
    )
    rows = at.dataframe[0].value.set_index("rank")
    assert list(rows.columns) == ["pid", "state", "heartbeat age (s)", "where"]
    assert rows.loc[1, "pid"] == 14580 and rows.loc[1, "state"] == "collective"
    assert rows.loc[1, "where"].startswith("barrier (torch/distributed/distributed_c10d.py:5356)")
    assert rows.loc[1, "heartbeat age (s)"] == pytest.approx(3.859)
    markdown = [_plain(m) for m in _texts(at, "markdown")]
    assert any(
        "1. Make the code path that reaches save_checkpoint (hang_world.py:173)" in m and "\n2. Set " in m
        for m in markdown
    )
    assert any(m.startswith("**Evidence**") and "- rank 1 waits in barrier" in m for m in markdown)
    assert any("- rank 3's rank file does not parse" in m for m in markdown)  # the notes
    labels = [e.label for e in at.expander]
    assert labels[:3] == [f"rank {r}: py-spy dump (rank{r}.txt)" for r in range(3)]
    assert not any("rank0.json" in label or "verdict.json" in label for label in labels)
    assert "diagnose/extra/summary.json" in labels  # any other JSON keeps the generic view
    assert any(c.startswith("# rank 1, pid 14580") and "barrier (torch" in c for c in _texts(at, "code"))
    # the log doctor on console.log: the FlashAttention 3 signature on line 3
    assert any(e.startswith("**ERROR** · `fa3_sm` · ") for e in _texts(at, "error"))
    assert "3  AssertionError: FlashAttention v3 Backend requires SM>=80" in _texts(at, "code")[-1]
    assert any("4 lines scanned" in c for c in _texts(at, "caption"))


@pytest.mark.parametrize("text", ["{garbage", "[1,2]"])
def test_diagnose_page_shows_an_unreadable_verdict_as_unreadable(
    hang_run: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    verdict = hang_run / "diagnose" / "20261129T100000Z" / "verdict.json"
    verdict.write_text(text)
    at = _app(monkeypatch, hang_run.parent, selected=["hung"])
    at.switch_page("app_pages/diagnose.py").run()
    assert not at.exception
    assert [_plain(t) for t in _texts(at, "subheader")][
        1
    ] == "diagnose/20261129T100000Z: unreadable hang report"
    warnings = [_plain(w) for w in _texts(at, "warning")]
    assert any(w.startswith(f"No verdict: {verdict} ") for w in warnings)
    assert not any("Not hung" in s for s in _texts(at, "success"))  # no verdict shown for it
    assert sum(e.startswith("**Hung**") for e in _texts(at, "error")) == 1  # the readable report


def test_health_page_on_a_first_step_whose_ppo_kl_is_not_a_number(
    ui_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Path(shutil.copytree(ui_root / "a", tmp_path / "a"))
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    n, first = next((i, r) for i, r in enumerate(rows, 1) if r["kind"] == "step")
    first["metrics"]["train/ppo_kl"] = None
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    at = _app(monkeypatch, tmp_path, selected=["a"])
    at.switch_page("app_pages/health.py").run()
    assert not at.exception
    step0 = at.dataframe[1].value.set_index("signal")
    assert step0.loc["step 0 train/ppo_kl", "status"].endswith("red")
    evidence = step0.loc["step 0 train/ppo_kl", "evidence"]
    assert evidence == f"not a number: null in the first step record (step 0, line {n})"
    assert f"The first step record (line {n}) holds values that are not numbers: train/ppo_kl = null" in (
        _texts(at, "warning")
    )
    assert "1 red, 0 watch, 1 ok, 1 n/a" in _texts(at, "markdown")


def test_diagnose_page_on_a_clean_run_and_a_miles_log(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _app(monkeypatch, ui_root, selected=["a"])
    at.switch_page("app_pages/diagnose.py").run()
    assert not at.exception
    assert any(i.startswith("No hang reports yet for a") for i in _texts(at, "info"))
    lines = len((ui_root / "a" / "console.log").read_text().splitlines())
    assert lines > 0
    expect = f"No known failure signature in console.log ({lines:,} lines scanned)."
    assert expect in _texts(at, "success")
    at.selectbox(key="diagnose_run").set_value("logs/miles_dead_engine.log").run()
    assert not at.exception
    assert not _texts(at, "subheader")  # a console log has no hang reports
    assert any(e.startswith("**ERROR** · `fa3_sm` · ") for e in _texts(at, "error"))
    assert any(i.startswith("**INFO** · `engine_503_bursts` · 2 × 503") for i in _texts(at, "info"))
    assert _texts(at, "code")[0].startswith("3  AssertionError: FlashAttention v3")


def test_bad_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    at = _app(monkeypatch, empty)
    assert not at.exception
    assert any("No runs found under" in w for w in _texts(at, "warning"))
    for page in ("compare", "health", "rollouts", "diagnose", "bisect"):
        at.switch_page(f"app_pages/{page}.py").run()
        assert not at.exception, page
    at = _app(monkeypatch, tmp_path / "missing")
    assert not at.exception
    assert any("does not exist" in e for e in _texts(at, "error"))


def _trace_x(chart) -> dict[str, list[float]]:
    """name → x values of each trace of a plotly chart element (plotly may ship arrays as base64)."""
    spec = json.loads(chart.proto.spec)
    out = {}
    for trace in spec["data"]:
        x = trace.get("x", [])
        if isinstance(x, dict) and "bdata" in x:
            x = np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"])).tolist()
        out[trace.get("name")] = list(x)
    return out


def test_compare_clean_steps_use_gpu_throttle_marks(
    ui_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b"):
        shutil.copytree(ui_root / name, tmp_path / name)
    perf = RunStore([tmp_path]).frame("b").xs("perf", level="kind")
    mark = perf.loc[1, "time"] - perf.loc[1, "perf/step_time"] / 2  # inside b's step 1
    samples = [
        {"time": mark, "gpu": 0, "throttle_reasons": ["sw_thermal_slowdown"]},
        {"time": mark + 1e6, "gpu": 0},
    ]
    (tmp_path / "b" / "gpu.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    at = _app(monkeypatch, tmp_path, selected=["a", "b"])
    at.switch_page("app_pages/compare.py").run()
    at.selectbox(key="compare_ns").set_value("perf/").run()
    assert at.multiselect(key="compare_keys").value == ["perf/step_time", "perf/rollout_time"]
    assert _trace_x(at.get("plotly_chart")[0]) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    at.toggle(key="compare_clean").set_value(True).run()
    assert not at.exception
    assert _trace_x(at.get("plotly_chart")[0]) == {"a": [0, 2, 3], "b": [0, 2, 3]}  # same clean steps only
    at.toggle(key="compare_same").set_value(False).run()
    assert _trace_x(at.get("plotly_chart")[0]) == {"a": [0, 1, 2, 3], "b": [0, 2, 3]}
