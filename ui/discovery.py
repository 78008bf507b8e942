"""Find runs under RUNS_ROOTs: our run directories and foreign console logs (read-only).

A run directory is a folder holding any of the run-directory files (`rundir.reader.RUN_MARKERS`:
run.json, the metrics, events.jsonl or ranks/; so a crashed run without run.json is still found,
and shown as "incomplete"); its insides are not searched further. A console log is a `*.log` or `*.out` file outside run directories.
Folders are searched 3 levels deep, skipping hidden ones and bulky run sub-folders.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from grpolab.rundir.reader import is_run_dir

LOG_SUFFIXES = (".log", ".out")
SKIP_DIRS = {"checkpoints", "rollouts", "wandb", "diagnose", "checks", "__pycache__", "node_modules"}
MAX_DEPTH = 3
Found = dict[str, tuple[Path, str]]


def discover(roots: Sequence[Path]) -> tuple[Found, list[str]]:
    """run id → (path, source) for everything under `roots`, and the problems met (unreadable or
    missing roots, said in words). Run ids are paths relative to their root, prefixed by the
    root's name when several roots are given. Source is "grpolab" or "miles log"."""
    found: Found = {}
    problems: list[str] = []
    for root in roots:
        prefix = f"{root.name}/" if len(roots) > 1 else ""
        if not root.exists():
            problems.append(f"RUNS_ROOT {root} does not exist")
        elif root.is_file():
            found[prefix or root.name] = (root, "miles log")
        elif is_run_dir(root):
            found[prefix or root.name] = (root, "grpolab")
        else:
            try:
                _walk(root, root, prefix, 0, found, problems)
            except OSError as e:
                problems.append(f"cannot read RUNS_ROOT {root}: {e.strerror or e}")
    return found, problems


def _walk(root: Path, folder: Path, prefix: str, depth: int, found: Found, problems: list[str]) -> None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        if depth == 0:
            raise
        problems.append(f"cannot read {folder}: {e.strerror or e}")
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(entry.path)
        rel = prefix + path.relative_to(root).as_posix()
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir:
            if is_run_dir(path):
                found[rel] = (path, "grpolab")
            elif depth + 1 < MAX_DEPTH and entry.name not in SKIP_DIRS:
                _walk(root, path, prefix, depth + 1, found, problems)
        elif entry.name.endswith(LOG_SUFFIXES):
            found[rel] = (path, "miles log")
