"""Where a run's files named in its events are on this machine: recordings, checkpoints, the model.

The trainer writes paths as it saw them (absolute, or relative to its working directory). A run
directory copied elsewhere, or inspected from another working directory, still finds them here:
one lookup rule, used by the UI's Rollouts page and `grpolab replay logprobs`.
"""

from __future__ import annotations

import glob
import re
import string
from pathlib import Path
from typing import Any

RECORDINGS_DIR = "rollouts"
"""Folder of a run directory where recordings are looked for by file name."""

FIELD = "{rollout_id}"
"""The one field of a `--save-debug-rollout-data` template (`replay.recording.format_path`)."""


def _roots(run_dir: Path, run_dir_first: bool = False) -> list[Path]:
    """Where a relative path the trainer wrote may be: the current directory, the run directory and
    each of its parents, in that order (`run_dir_first`: the current directory last)."""
    if run_dir_first:
        return [run_dir, *run_dir.parents, Path.cwd()]
    return [Path.cwd(), run_dir, *run_dir.parents]


def locate(run_dir: str | Path, recorded: str, *, run_dir_first: bool = False) -> Path | None:
    """An existing path for `recorded` as the trainer wrote it, or None.

    Tried in order: as given when absolute; else under the current directory, the run directory
    and each of its parents; last `RUN_DIR/rollouts/<file name>` and `RUN_DIR/<file name>` (a
    recording moved or copied with its run). With `run_dir_first` (`grpolab diff`: the same answer
    from any directory, a copied run reads its own copies) a relative path is tried under the run
    directory, then `RUN_DIR/rollouts/<file name>` and `RUN_DIR/<file name>`, then the run
    directory's parents, the current directory last.
    """
    if not recorded:
        return None
    run_dir, p = Path(run_dir), Path(recorded)
    moved = [run_dir / RECORDINGS_DIR / p.name, run_dir / p.name]
    if p.is_absolute():
        candidates = [p, *moved]
    elif run_dir_first:
        candidates = [run_dir / p, *moved, *(root / p for root in _roots(run_dir, True)[1:])]
    else:
        candidates = [*(root / p for root in _roots(run_dir)), *moved]
    return next((c for c in candidates if c.exists()), None)


def _template_parts(template: str) -> list[str | None] | None:
    """The template as literal text pieces and None where `{rollout_id}` stands (`{{`/`}}` read as
    braces, as str.format does); None when it is not a template with exactly that field."""
    parts: list[str | None] = []
    try:
        for literal, field, spec, conv in string.Formatter().parse(template):
            parts.append(literal)
            if field is not None:
                if field != "rollout_id" or spec or conv:
                    return None
                parts.append(None)
    except ValueError:
        return None
    return parts if None in parts else None


def rollout_id_of_name(name: str, template: str | None = None) -> int | None:
    """The training rollout id a recording's file name holds, or None (eval recordings: names with
    `eval`; names without digits).

    With `template` (the run's `--save-debug-rollout-data`) whose file name holds `{rollout_id}`:
    the number in that position, i.e. right after the template's literal text before the field
    (`rollout_{rollout_id}.grz`: `rollout_0_take2.grz` is rollout 0); a name that does not start
    with that text is not this run's recording (None). Otherwise the last run of digits of the stem
    (`run2_r_5.grz` is rollout 5).
    """
    stem = Path(name).stem
    if "eval" in stem:
        return None
    parts = _template_parts(Path(template).name) if template else None
    if parts is not None:
        prefix = "".join(p for p in parts[: parts.index(None)] if p)
        m = re.match(re.escape(prefix) + r"(\d+)", name)
        return int(m.group(1)) if m else None
    runs = re.findall(r"\d+", stem)
    return int(runs[-1]) if runs else None


def _regex(parts: list[str | None]) -> str:
    return "".join(r"(\d+)" if p is None else re.escape(p) for p in parts)


def _template_files(run_dir: Path, template: str, run_dir_first: bool = False) -> dict[int, Path]:
    """Files matching the template exactly, `{rollout_id}` an integer: as given when absolute, else
    under each of `_roots` (the first root holding an id wins, as in `locate`)."""
    parts = _template_parts(template)
    if parts is None:
        return {}
    pattern = "".join("*" if p is None else glob.escape(p) for p in parts)
    roots = (
        [""]
        if Path(template).is_absolute()
        else [str(r).rstrip("/") + "/" for r in _roots(run_dir, run_dir_first)]
    )
    out: dict[int, Path] = {}
    for root in roots:
        for hit in sorted(glob.glob(glob.escape(root) + pattern)):
            m = re.fullmatch(re.escape(root) + _regex(parts), hit)
            if m and len(set(m.groups())) == 1 and Path(hit).is_file():
                out.setdefault(int(m.group(1)), Path(hit))
    return out


def _folder_files(folder: Path, template: str | None) -> list[tuple[int, Path]]:
    """(rollout id, file) of the .grz files in `folder` named by `rollout_id_of_name`; names matching
    the template's file name exactly first, then by name."""
    parts = _template_parts(Path(template).name) if template else None
    exact = re.compile(_regex(parts)) if parts is not None else None
    named = [(rollout_id_of_name(f.name, template), f) for f in folder.glob("*.grz") if f.is_file()]
    found = [(rid, f) for rid, f in named if rid is not None]
    return sorted(found, key=lambda n: (not (exact and exact.fullmatch(n[1].name)), n[1].name))


def recorded_rollouts(
    run_dir: str | Path,
    events: list[dict[str, Any]],
    template: str | None = None,
    *,
    run_dir_first: bool = False,
) -> dict[int, Path]:
    """Recordings of a run on this machine: rollout id → .grz file, in rollout order.

    An id is taken from the first of: its `rollout_recorded` event's path (`locate`); the
    `--save-debug-rollout-data` template's files (for runs whose events lack those events); the
    .grz files in `RUN_DIR/rollouts/` then `RUN_DIR/` (a recording moved or copied with its run),
    named by `rollout_id_of_name`. The CLI (`grpolab replay logprobs`) and the UI use this one rule.

    Args:
        run_dir: the run directory.
        events: its events.jsonl objects (`rundir.reader.read_events`).
        template: the run's `--save-debug-rollout-data` (run.json's config `debug` section), or None.
        run_dir_first: relative paths under the run directory before the current directory, and the
            run directory's own .grz files before the template's (see `locate`; `grpolab diff`).
    """
    run_dir = Path(run_dir)
    out: dict[int, Path] = {}
    for ev in events:  # a rollout recorded again (after a resume): the last recording
        if ev.get("event") == "rollout_recorded" and isinstance(ev.get("rollout_id"), int):
            found = locate(run_dir, str(ev.get("path") or ""), run_dir_first=run_dir_first)
            if found is not None and found.is_file():
                out[ev["rollout_id"]] = found
    by_template = _template_files(run_dir, template, run_dir_first) if template else {}
    by_folder = [
        (rid, f)
        for folder in (run_dir / RECORDINGS_DIR, run_dir)
        for rid, f in _folder_files(folder, template)
    ]
    found_in = [by_folder, by_template.items()] if run_dir_first else [by_template.items(), by_folder]
    for pairs in found_in:
        for rid, found in pairs:
            out.setdefault(rid, found)
    return dict(sorted(out.items()))
