"""The sampling ledger: where a rollout's generated groups and tokens went (issue: dynamic sampling).

Under `--dynamic-sampling-filter-path` a rollout generates more than it trains on. Per rollout the
ledger counts groups, samples and response tokens generated, kept, filtered (by the filter's reason),
and surplus (kept by the filter after the rollout already had `--rollout-batch-size` groups: an engine
that streams would have aborted them mid-decode, Miles does; this one decodes a round as one call, so
their tokens were spent), the generation rounds, and, over the run, the prompt rows drawn but never
trained. `metrics()` is what the `rollout N:` line gets (`rollout/dynamic_filter/drop_<reason>`, Miles'
group counts, and `rollout/ledger/*`); `record()` is the run's `ledger` event. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from grpolab.core.batch import Sample

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")
UNSPECIFIED = "unspecified"
"""The reason counted for a group dropped without one."""


@dataclass
class Tally:
    """Groups, samples and response tokens of one fate."""

    groups: int = 0
    samples: int = 0
    tokens: int = 0

    def add(self, group: list[Sample]) -> None:
        self.groups += 1
        self.samples += len(group)
        self.tokens += sum(s.response_length for s in group)


@dataclass
class RolloutLedger:
    """One rollout's accounts (see the module docstring)."""

    rollout_id: int
    generated: Tally = field(default_factory=Tally)
    kept: Tally = field(default_factory=Tally)
    surplus: Tally = field(default_factory=Tally)
    filtered: dict[str, Tally] = field(default_factory=dict)
    rounds: int = 0
    truncated_generated: int = 0
    truncated_kept: int = 0
    kept_lengths: list[int] = field(default_factory=list)
    generated_lengths: list[int] = field(default_factory=list)

    def add(self, group: list[Sample], fate: str, reason: str | None = None) -> None:
        """Count one scored group: `fate` "kept", "filtered" (with the filter's `reason`) or "surplus"."""
        self.generated.add(group)
        self.truncated_generated += sum(s.truncated for s in group)
        self.generated_lengths += [s.response_length for s in group]
        if fate not in ("kept", "filtered", "surplus"):
            raise ValueError(f"unknown fate {fate!r}: expected kept, filtered or surplus")
        if fate == "kept":
            self.kept.add(group)
            self.truncated_kept += sum(s.truncated for s in group)
            self.kept_lengths += [s.response_length for s in group]
        elif fate == "filtered":  # a reason is a metric key's suffix: one line, no slashes or spaces
            self.filtered.setdefault(_UNSAFE.sub("_", reason or "") or UNSPECIFIED, Tally()).add(group)
        else:
            self.surplus.add(group)

    def metrics(self, never_trained: int) -> dict[str, float]:
        """The rollout line's keys: Miles' `rollout/dynamic_filter/drop_<reason>` (groups) and the ledger's
        `rollout/ledger/*` (groups, tokens, the generated/kept token ratio, mean lengths, rounds, and
        `never_trained_prompts`: rows drawn so far in the run but never kept)."""
        out = {f"rollout/dynamic_filter/drop_{r}": float(t.groups) for r, t in sorted(self.filtered.items())}
        filtered_tokens = sum(t.tokens for t in self.filtered.values())
        out.update({
            "rollout/ledger/rounds": float(self.rounds),
            "rollout/ledger/generated_groups": float(self.generated.groups),
            "rollout/ledger/kept_groups": float(self.kept.groups),
            "rollout/ledger/filtered_groups": float(sum(t.groups for t in self.filtered.values())),
            "rollout/ledger/surplus_groups": float(self.surplus.groups),
            "rollout/ledger/generated_tokens": float(self.generated.tokens),
            "rollout/ledger/kept_tokens": float(self.kept.tokens),
            "rollout/ledger/filtered_tokens": float(filtered_tokens),
            "rollout/ledger/surplus_tokens": float(self.surplus.tokens),
            "rollout/ledger/truncated_generated": float(self.truncated_generated),
            "rollout/ledger/generated_response_len_mean": _mean(self.generated_lengths),
            "rollout/ledger/kept_response_len_mean": _mean(self.kept_lengths),
            "rollout/ledger/never_trained_prompts": float(never_trained),
        })  # fmt: skip
        if self.kept.tokens:  # no ratio when nothing was kept
            out["rollout/ledger/generated_per_kept_token"] = self.generated.tokens / self.kept.tokens
        return out

    def record(self, never_trained: list[int], never_count: int, epoch: int) -> dict[str, Any]:
        """The `ledger` event: every tally, the filter's reasons, the prompt stream's epoch, and the rows
        drawn but never trained so far (`never_count` of them; `never_trained` lists the first ones)."""
        return {
            "rollout_id": self.rollout_id,
            "rounds": self.rounds,
            "generated": self.generated.__dict__,
            "kept": self.kept.__dict__,
            "surplus": self.surplus.__dict__,
            "filtered": {r: t.__dict__ for r, t in sorted(self.filtered.items())},
            "truncated": {"generated": self.truncated_generated, "kept": self.truncated_kept},
            "epoch": epoch,
            "never_trained_count": never_count,
            "never_trained_prompts": never_trained,
        }

    def summary(self) -> str:
        """One line for a log or an error: kept / generated groups and tokens, drops by reason."""
        drops = ", ".join(f"{r} {t.groups}" for r, t in sorted(self.filtered.items())) or "none"
        return (f"{self.kept.groups} of {self.generated.groups} groups kept over {self.rounds} rounds "
                f"({self.kept.tokens} of {self.generated.tokens} tokens); dropped by reason: {drops}; "
                f"surplus {self.surplus.groups}")  # fmt: skip


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0
