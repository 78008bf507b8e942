"""SHA-256 of whole files, cached by (path, size, mtime) so that a large model is read once.

The cache is one JSON file, `$XDG_CACHE_HOME/grpolab/file-hashes.json` (`~/.cache/grpolab/...` when
XDG_CACHE_HOME is unset), never in the model's folder. An entry is used only when the file's
resolved path, size in bytes and modification time in nanoseconds all equal what was recorded, so a
file rewritten in place is hashed again. A cache that cannot be read is treated as empty, and one
that cannot be written is skipped with a warning: the cache only saves time, it never fails a run.
Ranks of one run may write it at once; each writes a private temporary file and renames it over the
cache, so a reader sees one whole version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("grpolab")

CACHE_NAME = "file-hashes.json"


def cache_file() -> Path:
    """Where the hash cache lives: $XDG_CACHE_HOME/grpolab/file-hashes.json, or under ~/.cache."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "grpolab" / CACHE_NAME


def file_sha256(paths: list[Path]) -> list[str]:
    """The SHA-256 (64 hex digits) of each file's bytes, in order; cached files are not read again.

    Raises:
        OSError: a file cannot be stat'ed or read (the cache's own errors never raise).
    """
    cache = _read_cache()
    out, changed = [], False
    for path in paths:
        key = str(path.resolve())
        st = path.stat()
        entry = cache.get(key)
        if (
            isinstance(entry, dict)
            and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
        ):
            out.append(str(entry["sha256"]))
            continue
        digest = sha256_of(path)
        cache[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        out.append(digest)
        changed = True
    if changed:
        _write_cache(cache)
    return out


def sha256_of(path: str | Path) -> str:
    """The SHA-256 (64 hex digits) of one file's bytes, read now (no cache).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_cache() -> dict:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache: dict) -> None:
    path = cache_file()
    tmp = path.with_name(f".{CACHE_NAME}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache, indent=0, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        log.warning(
            f"warning: cannot write the weight-hash cache {path} ({e}); the weights are hashed again next run"
        )
