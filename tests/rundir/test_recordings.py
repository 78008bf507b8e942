"""Finding a run's recordings and checkpoints from the paths its events hold."""

from __future__ import annotations

from pathlib import Path

from grpolab.rundir.recordings import locate, recorded_rollouts


def test_recordings_are_found_as_written_under_parents_and_in_rollouts(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "runs" / "a"
    (run / "rollouts").mkdir(parents=True)
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "r_0.grz").write_bytes(b"x")  # relative to the trainer's cwd (tmp_path)
    (run / "rollouts" / "r_1.grz").write_bytes(b"x")  # moved in with the run
    (run / "rollouts" / "r_eval_2.grz").write_bytes(b"x")  # an eval recording: not a rollout
    events = [
        {"event": "rollout_recorded", "rollout_id": 0, "path": "rec/r_0.grz"},
        {"event": "rollout_recorded", "rollout_id": 1, "path": "/gone/r_1.grz"},
        {"event": "rollout_recorded", "rollout_id": 3, "path": "rec/r_3.grz"},  # not on this machine
    ]
    monkeypatch.chdir(run)  # the lookup must not depend on the inspecting shell's directory
    found = recorded_rollouts(run, events)
    assert found == {0: tmp_path / "rec" / "r_0.grz", 1: run / "rollouts" / "r_1.grz"}
    assert locate(run, "") is None and locate(run, "rec/nope.grz") is None
