"""The Compare page's `grpolab diff` drill-down on the session's real runs: step → sample → token → layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpolab.replay.recording import load_rollout
from grpolab.ui import run_diff
from grpolab.ui.runstore import RunStore

APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"


def _compare(monkeypatch: pytest.MonkeyPatch, root: Path, a: str, b: str) -> AppTest:
    """The Compare page with runs a and b chosen (Run A = a, Run B = b)."""
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", str(root))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["selected_runs"] = [a, b]
    at.run()
    return at.switch_page("app_pages/compare.py").run()


def _texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def _frame(at: AppTest, first_columns: list[str]):
    """The one table whose columns start with `first_columns`."""
    (table,) = [d.value for d in at.dataframe if list(d.value.columns[: len(first_columns)]) == first_columns]
    return table


def _first_token(root: Path) -> tuple[int, int, int, int]:
    """(prompt index, token index, id in a, id in b) of the first response token where the first samples of
    rollout 0 differ (the seeds pick other prompts and answers)."""
    sa, sb = (load_rollout(root / r / "rollouts" / "rollout_0.grz").samples[0] for r in "ab")
    i = next(i for i, (x, y) in enumerate(zip(sa.response_ids, sb.response_ids)) if x != y)
    return sa.prompt_index, i, sa.response_ids[i], sb.response_ids[i]


def _first_parameter(root: Path) -> tuple[str, str, str]:
    """(name, hash in a, hash in b) of the first parameter, in the file's layer order, that differs after
    step 0."""
    a, b = (
        json.loads((root / r / "checks" / "model_hash_step_0.json").read_text())["parameters"] for r in "ab"
    )
    name = next(n for n in a if a[n] != b.get(n))
    return name, a[name], b[name]


def test_a_different_seed_drills_down_to_token_and_layer(
    ui_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _compare(monkeypatch, ui_root, "a", "b")
    assert not at.exception
    assert any(e.startswith("**Differs** (bitwise,") for e in _texts(at, "error"))
    setup = _frame(at, ["section", "key", "run A", "run B"]).set_index(["section", "key"])
    assert setup.loc[("flags", "run.seed")].tolist() == ["1234", "7"]
    assert setup.loc[("data", "seed")].tolist() == ["1234", "7"]
    metric = next(m for m in at.metric if m.label == "First divergent step (grpolab diff)")
    assert int(metric.value) == 0
    metrics = _frame(at, ["key", "step", "run A", "run B"])
    assert metrics["step"].iloc[0] == 0 and metrics["step"].is_monotonic_increasing
    store = RunStore([ui_root])
    for row in metrics.itertuples():  # each value is the run's logged one at its first divergent step
        kind = "step" if row.key.startswith("train/") else "rollout"
        logged = [store.frame(r).loc[(kind, row.step), row.key] for r in "ab"]
        assert [row[3], row[4]] == logged and logged[0] != logged[1]
    prompt, index, token_a, token_b = _first_token(ui_root)
    assert any(
        m.startswith(f"**Sample**: rollout 0, prompt {prompt}, sample 0 · **token {index}**")
        for m in _texts(at, "markdown")
    )
    tokens = _frame(at, ["run", "token id"])
    assert tokens["token id"].tolist() == [token_a, token_b]
    texts = [m for m in _texts(at, "markdown") if ":orange-background[" in m]
    assert [t.split(":")[0] for t in texts] == ["a", "b"]  # both texts, the token highlighted
    name, hash_a, hash_b = _first_parameter(ui_root)
    assert any(
        m.startswith(f"**Layer**: after step 0, the first parameter that differs is `{name}`")
        for m in _texts(at, "markdown")
    )
    assert f"a: {hash_a}\nb: {hash_b}" in _texts(at, "code")


def test_edited_metrics_part_at_step_3_with_the_same_samples_and_weights(
    ui_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _compare(monkeypatch, ui_root, "a", "a-step3")
    assert not at.exception
    metric = next(m for m in at.metric if m.label == "First divergent step (grpolab diff)")
    assert int(metric.value) == 3
    metrics = _frame(at, ["key", "step", "run A", "run B"]).set_index("key")
    assert {"rollout/raw_reward", "train/loss"} <= set(metrics.index) and set(metrics["step"]) == {3}
    assert metrics.loc["rollout/raw_reward", "|Δ|"] == pytest.approx(0.25)
    assert metrics.loc["train/loss", "|Δ|"] == pytest.approx(1e-3)
    assert not any(m.startswith(("**Sample**", "**Layer**")) for m in _texts(at, "markdown"))  # same files
    at.number_input(key="diff_tol").set_value(1.0).run()
    successes = _texts(at, "success")  # the verdict alone is green (not the per-step table too)
    assert len(successes) == 1 and successes[0].startswith("**Identical** (tolerance 1, 4 common steps)")


def test_no_common_steps_cannot_be_judged(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _compare(monkeypatch, ui_root, "a", "a-late")
    assert not at.exception
    warnings = _texts(at, "warning")
    assert any(w.startswith("**Cannot judge**") for w in warnings)
    assert len(warnings) >= 2  # the verdict and at least one note saying why


def test_highlighted() -> None:
    assert run_diff.highlighted("x_1 «[y]» z") == r"x\_1 :orange-background[\[y\]] z"
    assert run_diff.highlighted("[1, 2, 3]") == r"\[1, 2, 3\]"  # ids shown without a tokenizer: no marks
    assert run_diff.highlighted("ab«»") == "ab:orange-background[ ]"
    assert run_diff.highlighted("1\n- 2«\n»# x") == r"1↵\- 2:orange-background[↵]\# x"


def test_a_run_diff_cannot_read_is_an_error_naming_it(ui_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = _compare(monkeypatch, ui_root, "a", "no-runjson")
    assert not at.exception
    errors = [e for e in _texts(at, "error") if e.startswith("grpolab diff cannot compare these runs: ")]
    assert len(errors) == 1 and str(ui_root / "no-runjson") in errors[0]
    assert not any(m.label == "First divergent step (grpolab diff)" for m in at.metric)
