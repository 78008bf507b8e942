"""The Sampling page on a dynamic-sampling run: the ledger's stacked bar and tables are the run's
`ledger` events (ui/ledger_view.py), rollout by rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import events, train_short
from streamlit.testing.v1 import AppTest

from grpolab.ui.ledger_view import ledger_figure, ledger_frame

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "ui" / "app.py"
FLAGS = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "16",
         "--dynamic-sampling-filter-path", "grpolab.rollout.filters.check_reward_nonzero_std",
         "--over-sampling-batch-size", "6"]  # fmt: skip


def test_sampling_page_shows_the_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = train_short(tmp_path / "filtered", *FLAGS)
    ledgers = events(run, "ledger")
    frame = ledger_frame(events(run))
    for e in ledgers:  # every generated token has exactly one fate
        assert frame[frame["rollout"] == e["rollout_id"]]["tokens"].sum() == e["generated"]["tokens"]
    fig = ledger_figure(frame)
    assert fig.layout.barmode == "stack" and "kept" in {t.name for t in fig.data}
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["selected_runs"] = ["filtered"]
    at.run()
    at.switch_page("app_pages/sampling.py").run()
    assert not at.exception
    summary = at.dataframe[0].value
    assert list(summary["rollout"]) == [e["rollout_id"] for e in ledgers]
    assert list(summary["kept groups"]) == [4] * len(ledgers)
    assert list(summary["generated tokens"]) == [e["generated"]["tokens"] for e in ledgers]
    assert len(at.get("plotly_chart")) == 1


def test_sampling_page_without_a_ledger_says_how_to_get_one(tmp_path: Path, monkeypatch) -> None:
    train_short(tmp_path / "plain", "--rollout-batch-size", "2")
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page("app_pages/sampling.py").run()
    assert not at.exception and "--dynamic-sampling-filter-path" in at.info[0].value
