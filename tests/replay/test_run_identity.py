"""Recordings name their run: no overwriting another run's recording, no replaying a mixed set,
every recording checked before the first rollout (issue 15 items 1 and 14)."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_helpers import build_samples

from grpolab.replay.format import RecordingError, read_container, read_header, write_container
from grpolab.replay.inject import frozen_recording_note
from grpolab.replay.recording import load_rollout
from grpolab.replay.replayer import RecordingMismatchError, RolloutRecorder, RolloutReplayer, RunIdentity
from grpolab.rollout import planned_eval_ids, planned_rollout_ids

FP = {"model_fingerprint": "m" * 64, "tokenizer_fingerprint": "t" * 64, "chat_template_hash": "c" * 64}
IDENTITY = RunIdentity(fingerprints=FP, train_config={"rollout_temperature": 1.0})
SAMPLER = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 24}


def recorder(template: str, run_id: str, seed: int = 1) -> RolloutRecorder:
    return RolloutRecorder(
        template, IDENTITY, run_seed=seed, sampler=SAMPLER, run_id=run_id, run_dir=f"runs/{run_id}"
    )


def record(template: str, run_id: str, ids: list[int | str], seed: int = 1) -> list[Path]:
    rec = recorder(template, run_id, seed)
    return [rec.save(build_samples(4), rollout_id=i, weight_version=0)[0] for i in ids]


def replayer(template: str, allow: bool = False) -> RolloutReplayer:
    return RolloutReplayer(template, IDENTITY, allow_mismatch=allow, flag="--load-debug-rollout-data")


def strip_run_identity(path: Path) -> None:
    """Rewrite a recording as one made before run identities existed (no run_id / run_dir)."""
    header, arrays = read_container(path)
    del header["run_id"], header["run_dir"]
    write_container(path, header, arrays)


def test_every_header_names_its_run(tmp_path: Path) -> None:
    (path,) = record(str(tmp_path / "r_{rollout_id}.grz"), "run-a", [0], seed=7)
    rec = load_rollout(path)
    assert (rec.run_id, rec.run_dir, rec.run_seed) == ("run-a", "runs/run-a", 7)
    assert read_header(path) == read_container(path)[0]  # the header-only read gives the same header
    strip_run_identity(path)
    old = load_rollout(path)  # an old recording still loads, its run unknown
    assert (old.run_id, old.run_dir) == ("", "") and len(old.samples) == 4


def test_read_header_errors(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="no such recording"):
        read_header(tmp_path / "absent.grz")
    (tmp_path / "junk.grz").write_bytes(b"not a recording at all, just text" * 4)
    with pytest.raises(RecordingError, match="not a grpolab recording"):
        read_header(tmp_path / "junk.grz")
    (path,) = record(str(tmp_path / "r_{rollout_id}.grz"), "run-a", [0])
    (tmp_path / "cut.grz").write_bytes(path.read_bytes()[:80])
    with pytest.raises(RecordingError, match="truncated|corrupt"):
        read_header(tmp_path / "cut.grz")


def test_recording_over_another_runs_files_is_refused(tmp_path: Path) -> None:
    template = str(tmp_path / "r_{rollout_id}.grz")
    record(template, "run-a", [0, 1, "eval_0"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = recorder(template, "run-b", seed=2)
    assert again.check_free([2, 3, "eval_2"], overwrite=False) == []  # nothing there: free
    with pytest.raises(FileExistsError) as e:
        again.check_free([0, 1, 2, "eval_0", "eval_3"], overwrite=False)
    msg = str(e.value)
    assert msg.startswith(
        "--save-debug-rollout-data: 3 of the 5 recordings this run will write already exist"
    )
    assert f"{tmp_path / 'r_0.grz'}: recorded by run run-a (run dir runs/run-a, seed 1)" in msg
    assert str(tmp_path / "r_eval_0.grz") in msg and "r_2.grz" not in msg
    assert "--overwrite-debug-rollout-data" in msg
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing was written
    replaced = again.check_free([0, 1, 2], overwrite=True)
    assert replaced == [tmp_path / "r_0.grz", tmp_path / "r_1.grz"]


def test_same_run_may_rewrite_its_own_recordings(tmp_path: Path) -> None:
    """A run continued after a crash redoes the rollouts after its checkpoint, under the same run id."""
    template = str(tmp_path / "r_{rollout_id}.grz")
    record(template, "run-a", [0, 1])
    assert recorder(template, "run-a").check_free([1, 2], overwrite=False) == []
    strip_run_identity(tmp_path / "r_1.grz")  # unknown origin: never assumed to be this run's
    with pytest.raises(FileExistsError, match="recorded by an unnamed run"):
        recorder(template, "run-a").check_free([1], overwrite=False)
    (tmp_path / "r_2.grz").write_text("junk")
    with pytest.raises(FileExistsError, match="r_2.grz: not a readable recording"):
        recorder(template, "run-a").check_free([2], overwrite=False)


def test_missing_recordings_are_all_listed_before_the_first_rollout(tmp_path: Path) -> None:
    template = str(tmp_path / "r_{rollout_id}.grz")
    record(template, "run-a", [0, 2])
    with pytest.raises(FileNotFoundError) as e:
        replayer(template).check_ready([0, 1, 2, 3])
    assert str(e.value) == (
        "--load-debug-rollout-data: 2 of the 4 rollouts this run reads have no recording "
        f"(checked before the first rollout):\n  rollout 1: expected {tmp_path / 'r_1.grz'}\n"
        f"  rollout 3: expected {tmp_path / 'r_3.grz'}"
    )
    replayer(template).check_ready([0, 2])


def test_mixed_runs_are_refused_naming_files_and_runs(tmp_path: Path) -> None:
    template = str(tmp_path / "r_{rollout_id}.grz")
    record(template, "run-a", [0, 1, 2], seed=1)
    record(template, "run-b", [0], seed=2)  # what a second recording over r_0 left behind
    with pytest.raises(RecordingMismatchError) as e:
        replayer(template).check_ready([0, 1, 2])
    msg = str(e.value)
    assert "these recordings come from 2 different runs" in msg
    assert f"{tmp_path / 'r_0.grz'}: run run-b (run dir runs/run-b, seed 2)" in msg
    assert f"{tmp_path / 'r_1.grz'}, {tmp_path / 'r_2.grz'}: run run-a (run dir runs/run-a, seed 1)" in msg
    assert "--allow-recording-mismatch" in msg
    allowed = replayer(template, allow=True)
    allowed.check_ready([0, 1, 2])
    assert len(allowed.warnings) == 1 and "2 different runs" in allowed.warnings[0]
    replayer(template).check_ready([1, 2])  # one run: fine


def test_recordings_without_run_identity_load_with_a_note(tmp_path: Path) -> None:
    template = str(tmp_path / "r_{rollout_id}.grz")
    for path in record(template, "run-a", [0, 1]):
        strip_run_identity(path)
    rp = replayer(template)
    rp.check_ready([0, 1])
    assert rp.warnings == [] and len(rp.notes) == 1
    assert "2 recording(s) predate run identities" in rp.notes[0]
    samples, _ = rp.load(1)
    assert len(samples) == 4


def test_setup_mismatch_is_found_before_the_first_rollout(tmp_path: Path) -> None:
    template = str(tmp_path / "r_{rollout_id}.grz")
    record(template, "run-a", [0, 1])
    other = RunIdentity(
        fingerprints={**FP, "tokenizer_fingerprint": "x" * 64}, train_config=IDENTITY.train_config
    )
    rp = RolloutReplayer(template, other, flag="--ci-inject-rollout-data-path")
    with pytest.raises(RecordingMismatchError, match="r_0.grz was recorded with a different setup"):
        rp.check_ready([0, 1])


def test_planned_ids_follow_the_loop() -> None:
    assert planned_rollout_ids(0, 3, None) == [0, 1, 2]
    assert planned_rollout_ids(0, 5, 1) == [0, 1]  # --debug-exit-after-rollout 1
    assert planned_rollout_ids(3, 5, 1) == [3]  # resumed past the exit id: one rollout, then it stops
    assert planned_rollout_ids(5, 5, None) == []
    assert planned_eval_ids([0, 1, 2, 3], 2) == [0, 2, 4]  # before 0 and 2, after the last rollout
    assert planned_eval_ids([3, 4], 3) == [3, 5]
    assert planned_eval_ids([0, 1], None) == [] and planned_eval_ids([], 1) == []


def test_frozen_recording_note() -> None:
    first = (0, 0, 1)  # rollout 0: recorded at weight version 0, engine at version 1
    assert frozen_recording_note(first, 0, 1) == ""  # the first injected rollout itself
    assert frozen_recording_note(first, 1, 2) == ""  # the recording's weights moved too
    note = frozen_recording_note(first, 0, 2)
    assert "its weight version is 0 here as at rollout 0" in note and "--debug-rollout-only" in note
    assert "this run has updated its policy once since rollout 0" in note and "version 1" not in note
    assert "updated its policy 2 times since" in frozen_recording_note(first, 0, 3)
    assert "only rollout 0 is expected to match exactly" in note


def corrupt_middle_byte(path: Path) -> None:
    """Flip one byte inside the compressed payload (the CRC-32 no longer matches)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("flag", ["--load-debug-rollout-data", "--ci-inject-rollout-data-path"])
def test_a_recording_read_as_another_rollout_is_refused(tmp_path: Path, flag: str) -> None:
    """The tester's swap: rollout 2's file copied to r_0, rollout 1's to r_1 (issue 15 fix F6)."""
    a, b = record(str(tmp_path / "a" / "r_{rollout_id}.grz"), "run-a", [0, 1, 2]), tmp_path / "b"
    b.mkdir()
    (b / "r_0.grz").write_bytes(a[2].read_bytes())
    (b / "r_1.grz").write_bytes(a[1].read_bytes())
    template = str(b / "r_{rollout_id}.grz")
    rp = RolloutReplayer(template, IDENTITY, flag=flag)
    with pytest.raises(RecordingMismatchError) as e:
        rp.check_ready([0, 1])
    assert str(e.value).startswith(f"{flag}: 1 recording(s) hold another rollout than the one this run reads")
    assert f"{b / 'r_0.grz'}: read as rollout 0, but its header says rollout 2\n" in str(e.value)
    assert "r_1.grz" not in str(e.value)
    with pytest.raises(RecordingMismatchError, match="read as rollout 0, but its header says rollout 2"):
        rp.load(0)  # the file changed after the start-up check: load refuses it too
    assert len(rp.load(1)[0]) == 4
    allowed = RolloutReplayer(template, IDENTITY, allow_mismatch=True, flag=flag)
    allowed.check_ready([0, 1])  # the explicit flag trains on them as named, with a warning
    assert len(allowed.warnings) == 1 and "header says rollout 2" in allowed.warnings[0]


def test_a_corrupt_recording_is_found_before_the_first_rollout(tmp_path: Path) -> None:
    """Every recording's checksums are verified by the start-up check, not when its rollout comes up."""
    paths = record(str(tmp_path / "r_{rollout_id}.grz"), "run-a", [0, 1, 2])
    corrupt_middle_byte(paths[2])
    read_header(paths[2])  # the header-only read cannot see the damage
    with pytest.raises(RecordingError) as e:
        replayer(str(tmp_path / "r_{rollout_id}.grz")).check_ready([0, 1, 2])
    assert str(e.value).startswith(f"--load-debug-rollout-data: rollout 2: {paths[2]}: corrupt recording")
    replayer(str(tmp_path / "r_{rollout_id}.grz")).check_ready([0, 1])  # the intact ones pass


def test_a_recording_killed_mid_write_leaves_a_temp_the_next_run_removes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It stayed forever: `.r_1.grz.<random>.tmp` from a writer killed before its rename."""
    import subprocess
    import sys

    killed_mid_write = (
        "import os, sys\nfrom grpolab.core import atomic\n"
        "os.replace = lambda *a: os._exit(9)  # killed between the write and the rename\n"
        "atomic.atomic_write_bytes(sys.argv[1], b'half a recording' * 64)\n"
    )
    target = tmp_path / "r_1.grz"
    assert subprocess.run([sys.executable, "-c", killed_mid_write, str(target)]).returncode == 9
    (left,) = tmp_path.glob(".r_1.grz.*.tmp")
    assert not target.exists() and left.stat().st_size == 16 * 64
    other = tmp_path / ".r_7.grz.abc123.tmp"  # a rollout this run does not write: not its business
    other.write_bytes(b"x")
    template = str(tmp_path / "r_{rollout_id}.grz")
    with caplog.at_level("INFO", logger="grpolab"):
        removed = recorder(template, "run-b").remove_leftover_temps([0, 1, 2, "eval_0"])
    assert removed == [(left, 1024)] and not left.exists() and other.exists()
    assert f"--save-debug-rollout-data: removed {left} (1024 bytes), left by a recording write" in caplog.text
    assert recorder(template, "run-b").remove_leftover_temps([1]) == []
