"""Checkpoint folders on disk: what a killed save leaves behind, permissions, and the data's identity.

A small stand-in actor (two tensors, no optimizer) keeps these tests to milliseconds; the end-to-end
behaviour through `grpolab train` is in test_checkpoint_resume.py.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grpolab.core import checkpoint
from grpolab.core.data_identity import data_identity, identity_differences
from grpolab.core.dist import DistContext


class TinyActor:
    """What save_checkpoint / load_checkpoint use of an Actor: weights, no optimizer, one rank."""

    def __init__(self, fill: float = 1.0) -> None:
        self.weights = {"a.weight": torch.full((64, 64), fill), "b.bias": torch.full((64,), fill)}
        self.dist, self.device = DistContext(), "cpu"
        self.optimizer = self.scheduler = None

    def named_weights(self):
        return iter(self.weights.items())

    def optimizer_state(self) -> None:
        return None

    def load_state(self, weights: dict[str, torch.Tensor], optimizer_state: None) -> None:
        self.weights = dict(weights)


def state(next_rollout_id: int, identity: dict | None) -> checkpoint.TrainerState:
    return checkpoint.TrainerState(
        next_rollout_id=next_rollout_id,
        data_position=next_rollout_id * 4,
        weight_version=next_rollout_id,
        model_fingerprint="fp",
        data_identity=identity,
    )


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(6))
    )
    return path


def ident(
    path: Path,
    *,
    rows: int = 6,
    batch: int = 4,
    seed: int = 1234,
    shuffle: bool = True,
    template: bool = False,
    input_key: str = "question",
):
    return data_identity(
        path,
        num_rows=rows,
        rollout_batch_size=batch,
        seed=seed,
        shuffle=shuffle,
        input_key=input_key,
        label_key="answer",
        apply_chat_template=template,
    )


# ---------------------------------------------------------------- item 3: temp folders, permissions
def test_checkpoint_folders_get_the_usual_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = checkpoint.save_checkpoint(tmp_path / "ckpt", TinyActor(), state(1, None))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # tempfile.mkdtemp made 0700
    assert stat.S_IMODE((path / "model.safetensors").stat().st_mode) == 0o644


def test_a_save_killed_midway_is_cleaned_by_the_next_save(tmp_path: Path, caplog) -> None:
    ckpt = tmp_path / "ckpt"
    checkpoint.save_checkpoint(ckpt, TinyActor(), state(1, None))
    # a real process, killed (SIGKILL) while it writes the weights of iter_0000002
    script = textwrap.dedent(f"""
        import os, signal, torch
        from grpolab.core import checkpoint
        def killed(weights, path, metadata=None):
            open(path, "wb").write(b"x" * 300_000)
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save_file = killed
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_checkpoint_files import TinyActor, state
        checkpoint.save_checkpoint({str(ckpt)!r}, TinyActor(), state(2, None))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    left = [p.name for p in ckpt.iterdir() if p.name.startswith(".iter_0000002.")]
    assert len(left) == 1 and f"@{socket.gethostname()}." in left[0]
    # an older grpolab named them with tempfile.mkdtemp: no owner recorded
    legacy = ckpt / ".iter_0000003.k2j_x9zq"
    legacy.mkdir()
    (legacy / "rng.pt").write_bytes(b"y" * 2_000_000)
    with caplog.at_level(logging.INFO, logger="grpolab"):
        checkpoint.save_checkpoint(ckpt, TinyActor(), state(4, None))
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "iter_0000001",
        "iter_0000004",
        checkpoint.LATEST_FILE,
    ]
    text = caplog.text
    assert f"removed {left[0]} (0.3 MB) from {ckpt}, left by a save that did not finish" in text
    assert f"removed {legacy.name} (2.0 MB) from {ckpt}" in text


def test_a_save_still_in_progress_is_kept(tmp_path: Path, caplog) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = ckpt / f".iter_0000002.{sleeper.pid}@{socket.gethostname()}.0123abcd"
        busy.mkdir()
        elsewhere = ckpt / ".iter_0000002.77@other-host.example.0123abcd"  # just written on another host
        elsewhere.mkdir()
        with caplog.at_level(logging.INFO, logger="grpolab"):
            assert checkpoint.remove_stale_temps(ckpt) == []
    finally:
        sleeper.kill()
        sleeper.wait()
    assert busy.is_dir() and elsewhere.is_dir()
    assert f"pid {sleeper.pid} on this host is alive" in caplog.text
    assert "host other-host.example, changed " in caplog.text
    old = 2 * checkpoint.FOREIGN_TEMP_STALE_S
    os.utime(elsewhere, (os.path.getatime(elsewhere) - old, os.path.getmtime(elsewhere) - old))
    assert [name for name, _ in checkpoint.remove_stale_temps(ckpt)] == sorted([busy.name, elsewhere.name])


# ---------------------------------------------------------------- item 4: the data's identity
def test_identity_names_every_field_that_changes_the_order(prompts: Path, tmp_path: Path) -> None:
    saved = ident(prompts).to_dict()
    assert saved["num_rows"] == 6 and saved["file_bytes"] == prompts.stat().st_size
    assert identity_differences(saved, ident(prompts)) == []
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(prompts.read_bytes())
    assert identity_differences(saved, ident(moved)) == []  # same rows in the same order
    other = tmp_path / "other.jsonl"
    other.write_text(prompts.read_text().replace("0+1", "9+9"))
    got = identity_differences(saved, ident(other, batch=8, seed=7, shuffle=False))
    assert [g.split(":")[0] for g in got] == [
        "--prompt-data",
        "SHA-256 of --prompt-data",
        "--rollout-batch-size",
        "--seed",
        "--rollout-shuffle",
    ]
    assert "--seed: 1234 in the checkpoint, 7 now" in got
    assert f"--prompt-data: {prompts} in the checkpoint, {other} now" in got


def test_load_refuses_other_data_unless_allowed(prompts: Path, tmp_path: Path, caplog) -> None:
    ckpt = checkpoint.save_checkpoint(tmp_path / "ckpt", TinyActor(2.0), state(3, ident(prompts).to_dict()))
    shorter = tmp_path / "shorter.jsonl"
    shorter.write_text("".join(prompts.read_text().splitlines(keepends=True)[:5]))
    actor = TinyActor(0.0)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_checkpoint(ckpt, actor, model_fingerprint="fp", data=ident(shorter, rows=5))
    msg = str(e.value)
    assert "rows of --prompt-data: 6 in the checkpoint, 5 now" in msg and "--allow-data-change" in msg
    assert "from rollout 3 on" in msg and float(actor.weights["b.bias"][0]) == 0.0  # nothing restored
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        got = checkpoint.load_checkpoint(
            ckpt, actor, model_fingerprint="fp", data=ident(shorter, rows=5), allow_data_change=True
        )
    assert got.next_rollout_id == 3 and float(actor.weights["b.bias"][0]) == 2.0
    assert (
        "--allow-data-change: resuming anyway" in caplog.text and "6 in the checkpoint, 5 now" in caplog.text
    )


def test_an_old_checkpoint_without_identity_loads_with_a_warning(
    prompts: Path, tmp_path: Path, caplog
) -> None:
    ckpt = checkpoint.save_checkpoint(tmp_path / "ckpt", TinyActor(), state(2, None))
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    del saved["data_identity"]  # as grpolab wrote it before the identity was stored
    (ckpt / "trainer_state.json").write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        got = checkpoint.load_checkpoint(ckpt, TinyActor(), model_fingerprint="fp", data=ident(prompts))
    assert got.next_rollout_id == 2 and got.data_identity is None
    assert "records no data identity" in caplog.text


# ---------------------------------------------------------------- fixpaths: what a row becomes, a bad state file
def test_identity_covers_the_chat_template_and_the_keys(prompts: Path, tmp_path: Path) -> None:
    """A resume with a copy of the data at another path silently turned the chat template off
    (giving --prompt-data changes its default): the identity now names it."""
    saved = ident(prompts, template=True).to_dict()
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(prompts.read_bytes())
    got = identity_differences(saved, ident(moved, input_key="prompt"))
    assert got == [
        f"--prompt-data: {prompts} in the checkpoint, {moved} now",
        "--input-key: question in the checkpoint, prompt now",
        "--apply-chat-template: True in the checkpoint, False now",
    ]


def test_an_identity_without_the_prompt_fields_loads_with_a_warning(
    prompts: Path, tmp_path: Path, caplog
) -> None:
    old = ident(prompts).to_dict()
    for key in ("input_key", "label_key", "apply_chat_template"):
        del old[key]  # as grpolab saved it before these were stored
    ckpt = checkpoint.save_checkpoint(tmp_path / "ckpt", TinyActor(2.0), state(3, old))
    with caplog.at_level(logging.WARNING, logger="grpolab"):
        got = checkpoint.load_checkpoint(
            ckpt, TinyActor(), model_fingerprint="fp", data=ident(prompts, template=True)
        )
    assert got.next_rollout_id == 3
    assert f"--load: {ckpt} does not record --input-key, --label-key, --apply-chat-template" in caplog.text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"next_rollout_id": 3,', "is not valid JSON (Expecting"),
        ("[3]", "should hold a JSON object, found list"),
        (
            '{"next_rollout_id": 3, "colour": 1}',
            "counters (missing data_position, model_fingerprint, weight_version",
        ),
    ],
)
def test_a_corrupt_trainer_state_names_the_file(
    prompts: Path, tmp_path: Path, text: str, problem: str
) -> None:
    ckpt = checkpoint.save_checkpoint(tmp_path / "ckpt", TinyActor(), state(1, None))
    (ckpt / "trainer_state.json").write_text(text)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_checkpoint(ckpt, TinyActor(), model_fingerprint="fp", data=ident(prompts))
    assert f"--load: {ckpt / 'trainer_state.json'} " in str(e.value) and problem in str(e.value)
    assert "colour" in str(e.value) or "colour" not in text


def test_a_pickle_inside_a_checkpoint_is_refused_naming_the_file(prompts: Path, tmp_path: Path) -> None:
    """It said torch's "re-run with weights_only=False" advice: now the file, why, and never that."""
    import datetime

    ckpt = checkpoint.save_checkpoint(tmp_path / "ckpt", TinyActor(), state(1, ident(prompts).to_dict()))
    torch.save({"torch": torch.get_rng_state(), "python": datetime.date(2026, 12, 6)}, ckpt / "rng.pt")
    actor = TinyActor(0.0)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_checkpoint(ckpt, actor, model_fingerprint="fp", data=ident(prompts))
    msg = str(e.value)
    assert msg.startswith(f"--load: {ckpt / 'rng.pt'}: refused on purpose: ") and "datetime.date" in msg
    assert "weights_only=False" not in msg and "weights_only=True" in msg
    assert float(actor.weights["b.bias"][0]) == 0.0  # nothing restored before the refusal
    (ckpt / "rng.pt").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(checkpoint.CheckpointError, match="rng.pt: not a readable torch.save file"):
        checkpoint.load_checkpoint(ckpt, actor, model_fingerprint="fp", data=ident(prompts))
