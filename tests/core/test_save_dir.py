"""The `--save` lock (core/save_dir.py): one writer per checkpoint folder, stale locks cleared, a
lock from another host refused with how to clear it, and a reused pid not taken for the writer."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import pytest

from grpolab.core.save_dir import (
    SAVE_LOCK_FILE,
    SaveDirBusy,
    acquire_save_lock,
    live_writer,
    release_save_lock,
)


def plant(save: Path, **record: object) -> Path:
    save.mkdir(parents=True, exist_ok=True)
    (save / SAVE_LOCK_FILE).write_text(json.dumps(record))
    return save / SAVE_LOCK_FILE


def test_the_lock_names_this_process_and_is_released(tmp_path: Path) -> None:
    lock = acquire_save_lock(tmp_path / "ckpt", "runs/a")
    record = json.loads(lock.read_text())
    assert (
        record["pid"] == os.getpid()
        and record["host"] == socket.gethostname()
        and record["run_dir"] == "runs/a"
    )
    assert [p.name for p in lock.parent.iterdir()] == [SAVE_LOCK_FILE]  # no temp file left beside it
    release_save_lock(tmp_path / "ckpt")
    assert not lock.exists()


def test_a_live_writer_on_this_host_is_refused(tmp_path: Path) -> None:
    plant(tmp_path, pid=os.getppid(), host=socket.gethostname(), run_dir="runs/first", started=time.time())
    with pytest.raises(SaveDirBusy, match=rf"pid {os.getppid()} on .*\(run directory runs/first\)"):
        acquire_save_lock(tmp_path, "runs/second")
    release_save_lock(tmp_path)  # not this process's lock: left alone
    assert json.loads((tmp_path / SAVE_LOCK_FILE).read_text())["run_dir"] == "runs/first"


def test_a_lock_from_another_host_is_refused_with_how_to_clear_it(tmp_path: Path) -> None:
    lock = plant(tmp_path, pid=1, host="node-that-is-not-here", run_dir="runs/far", started=time.time())
    message = live_writer(tmp_path)
    assert message is not None and "on node-that-is-not-here" in message and f"remove {lock}" in message


def test_stale_locks_are_removed_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the parent is alive but started long after this lock was taken (1970): the pid was reused
    plant(tmp_path, pid=os.getppid(), host=socket.gethostname(), run_dir="runs/old", started=1.0)
    assert live_writer(tmp_path) is None
    with caplog.at_level(logging.INFO, logger="grpolab"):
        acquire_save_lock(tmp_path, "runs/new")
    assert "removed the stale lock of pid" in caplog.text and "(run directory runs/old)" in caplog.text
    assert json.loads((tmp_path / SAVE_LOCK_FILE).read_text())["run_dir"] == "runs/new"
    (tmp_path / SAVE_LOCK_FILE).write_text("not json")  # not a lock grpolab wrote
    assert live_writer(tmp_path) is None
    acquire_save_lock(tmp_path, "runs/newer")
    assert json.loads((tmp_path / SAVE_LOCK_FILE).read_text())["run_dir"] == "runs/newer"
