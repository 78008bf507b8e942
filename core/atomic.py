"""Atomic file writes: write a temp file in the same directory, fsync, then rename over the target.

The temp file is `.<name>.<random>.tmp` beside the target; a writer killed before the rename
(kill -9) leaves it behind, and `leftover_temps` finds it for whoever writes that target next.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` so readers see either the old or the new file, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def leftover_temps(path: str | Path) -> list[Path]:
    """The temp files `atomic_write_bytes(path, ...)` calls left beside `path` (their writer was
    killed before the rename), sorted by name. The caller decides whether their writer is gone."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[A-Za-z0-9_]+\.tmp")
    if not path.parent.is_dir():
        return []
    return sorted(
        p for p in path.parent.glob(f".{path.name}.*.tmp") if pattern.fullmatch(p.name) and p.is_file()
    )


def current_umask() -> int:
    """The process's umask (read by setting and restoring it: os has no getter), for files and folders made
    private by `tempfile` that should get the usual permissions."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """`atomic_write_bytes` of `json.dumps(obj, indent=2)`."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())
