"""Layer 4 of `grpolab diff`: the first parameter whose per-step hash differs.

Both runs must have written `checks/model_hash_step_<N>.json` (`--save-model-hash-every-step`,
`checkers/step_hash.py`). The common steps are scanned in order; at the first step whose hashes
differ, the first parameter in layer order (`step_hash.parameter_order`) that differs or exists on
one side only is named.
"""

from __future__ import annotations

from pathlib import Path

from grpolab.checkers.step_hash import parameter_order, read_step_hashes
from grpolab.diff.report import LayerDivergence

ABSENT = "(absent)"
"""The hash shown for a parameter one run's file does not list."""


def first_differing_parameter(a: dict[str, str], b: dict[str, str]) -> str | None:
    """The first parameter (layer order) whose digest differs or that one map lacks; None if equal."""
    for name in sorted(set(a) | set(b), key=parameter_order):
        if a.get(name) != b.get(name):
            return name
    return None


def layer_divergence(
    hashes_a: dict[int, Path], hashes_b: dict[int, Path]
) -> tuple[LayerDivergence | None, list[str]]:
    """Scan the steps both runs hashed; return the first differing parameter and notes.

    Notes (fail closed) say when hashes exist on one side only or the hashed steps do not overlap;
    no hashes on either side gives no note.

    Raises:
        ValueError: a hash file is not valid (the message names it); OSError: it cannot be read.
    """
    if not hashes_a and not hashes_b:
        return None, []
    if not hashes_a or not hashes_b:
        side = "A" if hashes_a else "B"
        return None, [f"per-step model hashes on one side only: run {side} has them, the other none"]
    common = sorted(set(hashes_a) & set(hashes_b))
    if not common:
        return None, [
            f"per-step model hashes do not overlap: A hashed steps {sorted(hashes_a)}, B {sorted(hashes_b)}"
        ]
    for step in common:
        a, b = read_step_hashes(hashes_a[step]), read_step_hashes(hashes_b[step])
        name = first_differing_parameter(a, b)
        if name is not None:
            return LayerDivergence(step, name, a.get(name, ABSENT), b.get(name, ABSENT)), []
    return None, []
