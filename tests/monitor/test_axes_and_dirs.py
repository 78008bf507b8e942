"""The x-axis each metrics.jsonl record kind gets in the sinks, and where TensorBoard files go."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpolab.core.config.monitoring import MonitoringConfig
from grpolab.monitor.sinks import with_step_key, x_value
from grpolab.monitor.tensorboard_sink import tensorboard_dir


def test_each_kind_gets_its_step_metric() -> None:
    assert with_step_key("step", 1, 7, {"train/loss": 0.5}) == {"train/loss": 0.5, "train/step": 7.0}
    assert with_step_key("rollout", 3, None, {"rollout/raw_reward": 1.0})["rollout/step"] == 3.0
    assert with_step_key("perf", 3, None, {"perf/step_time": 2.0}) == {
        "perf/step_time": 2.0,
        "rollout/step": 3.0,
    }
    assert with_step_key("eval", 4, None, {"eval/gsm8k": 0.25}) == {"eval/gsm8k": 0.25, "eval/step": 4.0}
    assert x_value("perf", 3, None) == 3 and x_value("step", 3, 9) == 9
    with pytest.raises(ValueError, match="needs its optimizer step"):
        x_value("step", 3, None)


def test_tensorboard_dir_flag_then_environment_then_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    assert tensorboard_dir(MonitoringConfig(), run_dir) == run_dir / "tensorboard"
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "env"))
    assert tensorboard_dir(MonitoringConfig(), run_dir) == tmp_path / "env"
    flag = MonitoringConfig(tensorboard_dir=str(tmp_path / "flag"))
    assert tensorboard_dir(flag, run_dir) == tmp_path / "flag"
