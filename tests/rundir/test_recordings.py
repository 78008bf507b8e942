"""Finding a run's recordings and checkpoints from the paths its events hold."""

from __future__ import annotations

from pathlib import Path

from grpolab.rundir.recordings import locate, recorded_rollouts, rollout_id_of_name


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


def test_a_recording_copied_with_its_run_is_found_in_the_run_directory(tmp_path: Path, monkeypatch) -> None:
    # recorded with --save-debug-rollout-data 'runs/recA/r_{rollout_id}.grz' --run-dir runs/recA,
    # then `cp -r runs/recA /tmp/copyA` and inspected from /tmp
    copy = tmp_path / "copyA"
    copy.mkdir()
    (copy / "r_0.grz").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert locate(copy, "runs/recA/r_0.grz") == copy / "r_0.grz"
    events = [{"event": "rollout_recorded", "rollout_id": 0, "path": "runs/recA/r_0.grz"}]
    assert recorded_rollouts(copy, events) == {0: copy / "r_0.grz"}


def test_template_fallback_when_events_name_no_recording(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "runs" / "recA"
    (tmp_path / "elsewhere" / "rec").mkdir(parents=True)
    run.mkdir(parents=True)
    for name in ("r_0.grz", "r_1.grz", "r_eval_1.grz", "r_2.txt", "s_3.grz"):
        (tmp_path / "elsewhere" / "rec" / name).write_bytes(b"x")
    monkeypatch.chdir(tmp_path / "elsewhere")  # the trainer's working directory
    template = "rec/r_{rollout_id}.grz"
    rec = tmp_path / "elsewhere" / "rec"
    assert recorded_rollouts(run, [], template) == {0: rec / "r_0.grz", 1: rec / "r_1.grz"}
    assert recorded_rollouts(run, []) == {}  # the events name nothing and rollouts/ is empty
    # an absolute template; a run whose events do name a recording keeps it
    (run / "mine.grz").write_bytes(b"x")
    events = [{"event": "rollout_recorded", "rollout_id": 1, "path": str(run / "mine.grz")}]
    found = recorded_rollouts(run, events, str(rec / "r_{rollout_id}.grz"))
    assert found == {0: rec / "r_0.grz", 1: run / "mine.grz"}


def test_rollout_id_is_the_number_in_the_rollout_id_position(tmp_path: Path) -> None:
    assert rollout_id_of_name("rollout_0_take2.grz", "x/rollouts/rollout_{rollout_id}.grz") == 0
    assert rollout_id_of_name("rollout_12.grz", "rollout_{rollout_id}.grz") == 12
    assert rollout_id_of_name("other_3.grz", "rollout_{rollout_id}.grz") is None  # not this run's name
    assert rollout_id_of_name("run2_r_5.grz") == 5  # no template: the last run of digits
    assert rollout_id_of_name("rollout_eval_3.grz") is None and rollout_id_of_name("notes.grz") is None
    folder = tmp_path / "run" / "rollouts"
    folder.mkdir(parents=True)
    for name in ("rollout_0_take2.grz", "rollout_2.grz", "rollout_eval_2.grz"):
        (folder / name).write_bytes(b"x")
    found = recorded_rollouts(tmp_path / "run", [], "/gone/rollout_{rollout_id}.grz")
    assert found == {0: folder / "rollout_0_take2.grz", 2: folder / "rollout_2.grz"}
    (folder / "rollout_0.grz").write_bytes(b"x")  # the template's exact name wins over a prefix match
    assert (
        recorded_rollouts(tmp_path / "run", [], "/gone/rollout_{rollout_id}.grz")[0]
        == folder / "rollout_0.grz"
    )
