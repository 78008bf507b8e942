"""The Rollouts page on a multi-turn run: each answer's tokens by source and mask, and its turns."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import train_short
from streamlit.testing.v1 import AppTest

from grpolab.core.turns.episode import KEY
from grpolab.replay.recording import load_rollout
from grpolab.ui.turns_view import token_frame, turn_frame

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "ui" / "app.py"
TOOL_LOOP = [
    "--hf-checkpoint", str(REPO / "fixtures" / "tiny-qwen3-tools"), "--apply-chat-template",
    "--generate-execute-tool-function-path", "grpolab.examples.calculator.tools.execute_tool",
    "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "96",
    "--num-rollout", "1",
]  # fmt: skip


def test_rollouts_page_shows_the_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = train_short(tmp_path / "agent", *TOOL_LOOP, "--save-debug-rollout-data",
                      str(tmp_path / "agent" / "rollouts" / "rollout_{rollout_id}.grz"))  # fmt: skip
    samples = [s for s in load_rollout(run / "rollouts" / "rollout_0.grz").samples if s.group_index == 0]
    monkeypatch.setenv("GRPOLAB_UI_ROOTS", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["selected_runs"] = ["agent"]
    at.run()
    at.switch_page("app_pages/rollouts.py").run()
    assert not at.exception
    turns = at.dataframe[1].value  # after the answers table
    first = samples[0]
    episode = first.metadata[KEY]
    assert list(turns["turn"]) == list(range(1, len(episode["reply_lengths"]) + 1))
    assert list(turns["reply tokens"]) == episode["reply_lengths"]
    assert int(turns["trainable"].sum()) == int(first.loss_mask.sum())
    tokens = token_frame(first, None)
    assert len(tokens) == first.response_length
    assert tokens[tokens["source"] != "model"]["trainable"].sum() == 0
    assert turn_frame(first)["context tokens after"].sum() == (tokens["source"] != "model").sum()
    assert len(at.get("plotly_chart")) == 2  # the source strip and the engine log-prob strip
