"""What a `--save` directory holds, named without torch, and the lock that gives it one writer.

`checkpoint.py` (which imports torch) writes and reads the checkpoints; `train/launch.py` checks a
`--save` directory before the run starts (`live_writer`), without importing the trainer; the run's
rank 0 holds `SAVE_LOCK_FILE` from its start to its end (`acquire_save_lock`, `release_save_lock`),
so a second trainer pointed at the same `--save` is refused instead of replacing its `iter_*`.

The lock is the run directory's rule applied to a folder: a JSON file, linked into place (atomic,
and refused when one exists), naming the writer's pid, host and run directory; a lock whose pid is gone on this host is stale and
is removed with a log line; one from another host cannot be judged from here and is refused with
how to clear it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from grpolab.core.processes import is_this_host, pid_alive, started_after

LATEST_FILE = "latest_checkpointed_iteration.txt"
"""The file in a `--save` directory naming its newest checkpoint (written by `checkpoint.save_checkpoint`)."""

SAVE_LOCK_FILE = ".grpolab-save.lock"
"""The lock file in a `--save` directory: JSON {"pid", "host", "run_dir", "started"} of its writer."""

log = logging.getLogger("grpolab")


class SaveDirBusy(ValueError):
    """Another live trainer writes this `--save` directory (a ValueError: bad input, exit 2)."""


def _read_lock(lock: Path) -> dict | None:
    """The lock's JSON object; {} for a file that is not one; None when there is no lock."""
    try:
        record = json.loads(lock.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _writer_phrase(record: dict) -> str:
    return f"pid {record.get('pid')} on {record.get('host')} (run directory {record.get('run_dir')})"


def live_writer(save: str | Path) -> str | None:
    """Who holds the lock of `save`, as a refusal message, or None when it is free or stale.

    Stale: the lock names a pid on this host that is no longer alive (core.processes.pid_alive) or
    that now belongs to a process started after the lock was taken (the pid was reused), or
    is not a lock grpolab wrote (it is linked in whole, so never half-written); `acquire_save_lock`
    removes it.
    A lock from another host is never stale here: that host's pids cannot be seen.
    """
    lock = Path(save) / SAVE_LOCK_FILE
    record = _read_lock(lock)
    if not record:
        return None
    pid, host = record.get("pid"), record.get("host")
    if is_this_host(host):
        if not isinstance(pid, int) or pid == os.getpid() or not pid_alive(pid):
            return None
        started = record.get("started")
        if isinstance(started, (int, float)) and started_after(pid, started):
            return None  # the pid now names a process that started after the lock: reused
        return (
            f"--save {save}: another trainer is writing checkpoints there, {_writer_phrase(record)}; "
            "wait for it to end, stop it, or choose another --save"
        )
    return (
        f"--save {save}: a trainer on another host holds it, {_writer_phrase(record)}; this machine "
        f"cannot tell whether it still runs. If that run has ended, remove {lock} and start again"
    )


def acquire_save_lock(save: str | Path, run_dir: str | Path) -> Path:
    """Make `save` (if needed) and its lock file naming this process; return the lock's path.

    A stale lock (`live_writer`) is removed first, with a log line naming its writer.

    Raises:
        SaveDirBusy: a live trainer on this host, or one on another host, holds the lock (the
            message names its pid, host and run directory).
    """
    folder = Path(save)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / SAVE_LOCK_FILE
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "run_dir": str(run_dir),
        "started": time.time(),
    }
    tmp = folder / f"{SAVE_LOCK_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record))
    try:
        for _ in range(2):  # a stale lock is removed once, then linked again
            try:
                _link_or_create(tmp, lock)
                return lock
            except FileExistsError:
                busy = live_writer(save)
                if busy is not None:
                    raise SaveDirBusy(busy) from None
                old = _read_lock(lock)
                lock.unlink(missing_ok=True)
                log.info(
                    f"--save {save}: removed the stale lock of {_writer_phrase(old or {})}, which is gone"
                )
    finally:
        tmp.unlink(missing_ok=True)
    raise SaveDirBusy(f"--save {save}: another trainer took {lock} at the same moment; choose another --save")


def _link_or_create(tmp: Path, lock: Path) -> None:
    """Put `tmp`'s content at `lock`, failing with FileExistsError when `lock` exists.

    A hard link is atomic, so no reader sees a half-written lock; a file system without hard links
    (some network and FUSE mounts) gets an O_CREAT | O_EXCL file written in place instead.
    """
    try:
        os.link(tmp, lock)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(tmp.read_text())


def release_save_lock(save: str | Path) -> None:
    """Remove the lock of `save` if this process holds it (another writer's lock is left alone)."""
    lock = Path(save) / SAVE_LOCK_FILE
    record = _read_lock(lock)
    if record and record.get("pid") == os.getpid() and is_this_host(record.get("host")):
        lock.unlink(missing_ok=True)
