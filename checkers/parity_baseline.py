"""`grpolab check parity --baseline FILE`: which rungs moved since an earlier `--json` report, and what
changed between the two in the ladder's flags and the environment manifest (rundir/writer.environment_fingerprint, compared
key by key as `grpolab diff` compares two runs' set-ups: core/nested.differing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpolab.core.nested import differing

MOVED_FIELDS = ("equal", "total", "max_abs", "passed")
"""What a rung's numbers are: a change in any of them is a move."""


def read_baseline(path: str) -> dict[str, Any]:
    """An earlier `grpolab check parity --json` report.

    Raises:
        FileNotFoundError: no such file. ValueError: not JSON, or without `rungs` (a list of objects
            with a `name`) and `environment` (an object), naming the file.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--baseline {path}: no such file")
    try:
        report = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"--baseline {path}: not JSON ({e}); expected a `grpolab check parity --json` report"
        ) from None
    ok = isinstance(report, dict) and isinstance(report.get("environment"), dict)
    rungs = report.get("rungs") if ok else None
    numbers = ("equal", "total", "max_abs")
    if not (isinstance(rungs, list) and all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                            and all(_number(r.get(k)) for k in numbers) for r in rungs)):  # fmt: skip
        raise ValueError(
            f"--baseline {path}: expected a `grpolab check parity --json` report (an object with `rungs` and "
            "`environment`; each rung a `name` and numbers `equal`, `total`, `max_abs`)"
        )
    return report


def moved_lines(baseline: dict[str, Any], report: dict[str, Any], path: str) -> list[str]:
    """Lines saying which rungs moved from `baseline` to `report` (bitwise-equal counts, max |Δ|, verdict)
    and, when any did, every environment key that differs; one line when nothing moved."""
    before = {r["name"]: r for r in baseline["rungs"]}
    lines = []
    for rung in report["rungs"]:
        old = before.get(rung["name"])
        if old is None:
            lines.append(f"  {rung['name']}: not in the baseline")
        elif any(old.get(k) != rung[k] for k in MOVED_FIELDS):
            lines.append(f"  {rung['name']}: bitwise {old.get('equal')}/{old.get('total')} -> {rung['equal']}/"
                         f"{rung['total']}, max |Δ| {old.get('max_abs'):.3g} -> {rung['max_abs']:.3g}"
                         f"{'' if old.get('passed') == rung['passed'] else ', ' + _verdict(rung)}")  # fmt: skip
    if not lines:
        return [f"parity: every rung as in --baseline {path}"]
    changes = [("flags", *d) for d in differing(baseline.get("settings") or {}, report["settings"])]
    changes += [("env", *d) for d in differing(baseline["environment"], report["environment"])]
    env = [f"  {section} {key}: {a!r} -> {b!r}" for section, key, a, b, _ in changes] or [
        "  nothing recorded: the same flags, versions, threads, switches and numerics variables (look at the "
        "model's files and the prompts' contents)"
    ]
    return [f"parity moved since --baseline {path}:", *lines, "what changed (flags, environment):", *env]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _verdict(rung: dict[str, Any]) -> str:
    return "now passes" if rung["passed"] else "now FAILS"
