"""`grpolab replay filter TEMPLATE --filter pkg.mod.fn`: another dynamic sampling filter over recorded
rollouts, offline (no engine, no trainer): which groups would flip.

A run with `--dynamic-sampling-filter-path` and `--save-debug-rollout-data TEMPLATE` records beside
each rollout N its candidates, `candidates_N`: every scored group, kept or not, each sample's fate in
its metadata (rollout/dynamic_path.py). Each group goes to the new filter as it went to the run's
(rollout/filters.apply_filter, the same `args`: the recording's training config by Miles' names); a
group flips when the run's filter said keep (kept or surplus) and the new one drops it, or the other
way round. For a rollout without candidates (a run without a filter) the kept recording N is read, and
only keep → drop flips can show (said once). Exit 0 when no group flips, 1 when some do (listed with
rewards), 2 bad input (template, filter, recordings). The parser is replay/cli.py's; `grpolab.cli`
dispatches here.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROG = "grpolab replay filter"


@dataclass
class Flip:
    """One group whose decision changes: where it is, its rewards, the run's verdict and the new one."""

    rollout_id: int
    group_index: int
    prompt_index: int
    rewards: list[float]
    was: str
    now: str


@dataclass
class FilterReplay:
    """What the new filter decided over every recorded group."""

    rollouts: list[int] = field(default_factory=list)
    groups: int = 0
    flips: list[Flip] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _recordings(template: str) -> dict[int, Path]:
    """rollout id -> the file to read: `candidates_N` where recorded, else `N`.

    Raises:
        ValueError: the template lacks `{rollout_id}` or names no recording.
    """
    from grpolab.replay.paths import format_path

    format_path(template, 0, flag="TEMPLATE")
    head, _, tail = template.partition("{rollout_id}")
    pattern = re.compile(re.escape(head) + r"(candidates_)?(\d+)" + re.escape(tail))
    found: dict[int, Path] = {}
    for name in sorted(glob.glob(glob.escape(head) + "*" + glob.escape(tail))):
        match = pattern.fullmatch(name)
        if match and (match.group(1) or int(match.group(2)) not in found):
            found[int(match.group(2))] = Path(name)
    if not found:
        raise ValueError(
            f"TEMPLATE {template}: no recording matches (expected files like {format_path(template, 0)})"
        )
    return dict(sorted(found.items()))


def replay_filter(template: str, filter_path: str) -> FilterReplay:
    """Run `filter_path` over every recorded group (see the module docstring).

    Raises:
        ValueError: bad template or filter (named); RecordingError: an unreadable recording.
        FilterError: the filter raised or returned something else (named, with its file:line).
    """
    from grpolab.replay.recording import load_rollout
    from grpolab.rollout.dynamic_path import FATE_KEY
    from grpolab.rollout.filters import apply_filter, load_filter

    files = _recordings(template)
    fn = load_filter(filter_path, "--filter")
    out = FilterReplay(rollouts=list(files))
    for rollout_id, path in files.items():
        rec = load_rollout(path)
        if str(rec.rollout_id) not in (str(rollout_id), f"candidates_{rollout_id}"):
            raise ValueError(
                f"{path}: its header is rollout {rec.rollout_id!r}, not rollout {rollout_id} (renamed or copied?)"
            )
        if not str(rec.rollout_id).startswith("candidates_"):
            out.notes.append(
                f"rollout {rollout_id}: only its kept groups are recorded (no candidates_{rollout_id})"
            )
        args = argparse.Namespace(**_flat(rec.train_config))
        groups: dict[int, list] = {}
        for s in rec.samples:
            groups.setdefault(s.group_index, []).append(s)
        for g, members in groups.items():
            fate = members[0].metadata.get(FATE_KEY) or {"fate": "kept", "reason": None}
            verdict = apply_filter(fn, args, members, "--filter")
            was_keep = fate["fate"] != "filtered"
            out.groups += 1
            if verdict.keep != was_keep:
                was = "keep" if was_keep else f"drop ({fate.get('reason') or 'no reason'})"
                now = "keep" if verdict.keep else f"drop ({verdict.reason or 'no reason'})"
                out.flips.append(
                    Flip(rollout_id, g, members[0].prompt_index, [s.reward for s in members], was, now)
                )
    return out


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded config, sections flattened to Miles' flag attribute names."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value))
        else:
            flat[key] = value
    return flat


def run_filter_command(args: argparse.Namespace) -> int:
    """Run `grpolab replay filter`; return the exit code (see the module docstring)."""
    from grpolab.replay.format import RecordingError
    from grpolab.rollout.filters import FilterError

    try:
        result = replay_filter(args.template, args.filter)
    except (ValueError, RecordingError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except FilterError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"rollouts": result.rollouts, "groups": result.groups, "notes": result.notes,
                          "flips": [f.__dict__ for f in result.flips]}))  # fmt: skip
    else:
        print(f"{PROG}: {args.filter} over {result.groups} groups of {len(result.rollouts)} rollouts: "
              f"{len(result.flips)} would flip")  # fmt: skip
        for note in result.notes:
            print(f"  note: {note}")
        for f in result.flips:
            rewards = ", ".join(f"{r:g}" for r in f.rewards)
            print(f"  rollout {f.rollout_id} group {f.group_index} (prompt row {f.prompt_index}): {f.was} -> "
                  f"{f.now}; rewards [{rewards}]")  # fmt: skip
    return 1 if result.flips else 0
