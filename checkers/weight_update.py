"""Weight-update checker (`--ci-test` / `--check-weight-update-equal`, off with `--ci-disable-weight-update-checker`).

Miles `check_weight_update_equal` (notes-miles-slime-areal.md 3.3): snapshot the engine's weights
as loaded, overwrite every persistent tensor with random values, run the first trainer→engine
sync, then require every tensor to be bitwise equal to the snapshot. A tensor the sync failed to
reach still holds random values and is named with its max abs error and shape; the tensors an engine
server counted without naming them (`grpolab serve` names 10) are one line, "... and K more tensors
differ (the engine names N)".
"""

from __future__ import annotations

from collections.abc import Callable

from grpolab.checkers.errors import CheckFailure
from grpolab.core.engine.base import ChecksWeights, TensorMismatch
from grpolab.core.engine.sglang_api import UNNAMED


def check_weight_update(engine: ChecksWeights, first_sync: Callable[[], None], *, seed: int = 0) -> None:
    """Snapshot, randomize, sync, compare.

    Raises:
        CheckFailure: listing every tensor that is not bitwise equal after the sync.
    """
    engine.weights_checker("snapshot")
    engine.weights_checker("reset_tensors", seed=seed)
    first_sync()
    mismatches = engine.weights_checker("compare")
    if mismatches:
        raise CheckFailure(
            "weight_update",
            f"{len(mismatches)} engine tensor(s) not overwritten bitwise by the first weight sync "
            f"(they still hold the checker's random values or a different copy):\n{mismatch_rows(mismatches)}",
        )


def mismatch_rows(mismatches: list[TensorMismatch]) -> str:
    """One line per named tensor (shape, max and mean abs error), then one "... and K more tensors differ
    (the engine names N)" line for those an engine server counted without naming (`UNNAMED`)."""
    named = [m for m in mismatches if m.name != UNNAMED]
    rows = [
        f"  {m.name}: shape {m.shape}, max abs err {m.max_abs_err:.4g}, mean abs err {m.mean_abs_err:.4g}"
        for m in named
    ]
    if unnamed := len(mismatches) - len(named):
        rows.append(f"  ... and {unnamed} more tensors differ (the engine names {len(named)})")
    return "\n".join(rows)
