"""Metric gate (`--ci-metric-checker-key K --ci-metric-checker-threshold X [--ci-metric-checker-expect-num N]`).

Miles `metric_checker.py` (notes-miles-slime-areal.md 3.4): every eval records whether
`metrics[K] >= X`; at the end of the run at least one check must have passed and a run with no
eval fails; with `--ci-metric-checker-expect-num N` exactly N checks must have happened and all
passed (newer Miles).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpolab.checkers.errors import CheckFailure


@dataclass
class MetricChecker:
    """Collects eval results for one key and judges them at the end of the run."""

    key: str
    threshold: float
    expect_num: int | None = None
    results: list[tuple[int, float, bool]] = field(default_factory=list)

    def record(self, rollout_id: int, metrics: dict[str, float]) -> bool:
        """Record one eval; return whether it passed.

        Raises:
            CheckFailure: when the eval did not produce the key (names the keys it did produce).
        """
        if self.key not in metrics:
            raise CheckFailure(
                "metric",
                f"--ci-metric-checker-key {self.key!r} is not among the eval metrics at rollout {rollout_id}: {sorted(metrics)}",
            )
        value = metrics[self.key]
        ok = value >= self.threshold
        self.results.append((rollout_id, value, ok))
        return ok

    def finish(self) -> None:
        """Judge the run.

        Raises:
            CheckFailure: no eval ran, the wrong number ran, or none (or not all, with expect_num) passed.
        """
        table = ", ".join(f"rollout {r}: {v:.4f} {'ok' if ok else 'below'}" for r, v, ok in self.results)
        if not self.results:
            raise CheckFailure(
                "metric",
                f"--ci-metric-checker-key {self.key!r}: no eval ran (set --eval-interval and --eval-prompt-data)",
            )
        if self.expect_num is not None:
            if len(self.results) != self.expect_num or not all(ok for _, _, ok in self.results):
                raise CheckFailure(
                    "metric",
                    f"{self.key} >= {self.threshold}: expected {self.expect_num} passing evals, got {len(self.results)} ({table})",
                )
        elif not any(ok for _, _, ok in self.results):
            raise CheckFailure("metric", f"{self.key} never reached {self.threshold} ({table})")
