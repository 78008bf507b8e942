"""Log-prob checker (`--ci-test`, off with `--ci-disable-logprobs-checker`).

Miles `log_utils.py::log_rollout_data` (notes-miles-slime-areal.md 3.2): at rollout 0 the actor's
mean log-prob equals the reference's within 1e-8; every rollout the trainer-vs-engine mean gap
|rollout/log_probs − rollout/rollout_log_probs| is within `--ci-logprobs-checker-abs-tol` (0.03);
mean entropy lies in (0, 0.7). Beyond Miles, a failure names the worst samples and token positions
with both values, and tells a bias (per-token gaps of one sign) from noise, with the usual causes.

Legend: `R` one sample's response length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpolab.checkers.errors import CheckFailure

REF_ABS_TOL = 1e-8
DEFAULT_ABS_TOL = 0.03
ENTROPY_RANGE = (0.0, 0.7)
BIAS_SHARE = 0.95
"""Share of token gaps with one sign above which the gap is called a bias, not noise."""

BIAS_CAUSES = (
    "temperature applied on one side only (trainer log-probs should use logits / --rollout-temperature)",
    "scoring over a different support than the sampler kept (top-p/top-k: the gap ≈ log of the kept mass)",
    "a chat-template or tokenization mismatch between engine and trainer",
)


@dataclass(frozen=True, kw_only=True)
class TokenGap:
    """One response token where trainer and engine disagree."""

    sample: int
    position: int
    token_id: int
    trainer: float
    engine: float

    @property
    def gap(self) -> float:
        return self.trainer - self.engine


def worst_tokens(
    trainer: list[torch.Tensor], engine: list[torch.Tensor], response_ids: list[list[int]], k: int = 5
) -> list[TokenGap]:
    """The k tokens with the largest |trainer − engine| log-prob gap (each list holds float32 [R] per sample)."""
    gaps = []
    for i, (t, e) in enumerate(zip(trainer, engine)):
        for pos in range(len(t)):
            gaps.append(
                TokenGap(
                    sample=i,
                    position=pos,
                    token_id=response_ids[i][pos],
                    trainer=float(t[pos]),
                    engine=float(e[pos]),
                )
            )
    return sorted(gaps, key=lambda g: abs(g.gap), reverse=True)[:k]


def describe_gap(
    trainer: list[torch.Tensor], engine: list[torch.Tensor], response_ids: list[list[int]]
) -> str:
    """Worst tokens with both values, and whether the gaps share one sign (a bias) or not (noise)."""
    lines = ["worst tokens (sample, position, token id: trainer vs engine log-prob):"]
    for g in worst_tokens(trainer, engine, response_ids):
        lines.append(
            f"  sample {g.sample}, position {g.position}, token {g.token_id}: {g.trainer:.6f} vs {g.engine:.6f} (gap {g.gap:+.6f})"
        )
    diffs = torch.cat([(t - e).reshape(-1) for t, e in zip(trainer, engine)]) if trainer else torch.zeros(0)
    nonzero = diffs[diffs != 0]
    if nonzero.numel():
        positive = float((nonzero > 0).float().mean())
        share = max(positive, 1 - positive)
        sign = "trainer above engine" if positive >= 0.5 else "trainer below engine"
        if share >= BIAS_SHARE:
            lines.append(
                f"{100 * share:.1f}% of the {nonzero.numel()} differing tokens have one sign ({sign}): a bias, not noise. Usual causes:"
            )
            lines += [f"  - {c}" for c in BIAS_CAUSES]
        else:
            lines.append(
                f"gaps have mixed signs ({100 * positive:.1f}% positive): numerical noise rather than a systematic bias"
            )
    return "\n".join(lines)


def check_logprobs(
    rollout_id: int,
    rollout_line: dict[str, float],
    *,
    trainer: list[torch.Tensor],
    reference: list[torch.Tensor] | None,
    engine: list[torch.Tensor],
    response_ids: list[list[int]],
    abs_tol: float = DEFAULT_ABS_TOL,
) -> None:
    """Assert the log-prob invariants of one rollout (means from the `rollout N` line, details from tensors).

    Raises:
        CheckFailure: naming the metric, both values, the tolerance, the worst tokens and the likely cause.
    """
    lp = rollout_line["rollout/log_probs"]
    if rollout_id == 0 and reference is not None:
        ref = rollout_line["rollout/ref_log_probs"]
        if not abs(lp - ref) <= REF_ABS_TOL:
            raise CheckFailure(
                "logprobs",
                f"rollout 0: rollout/log_probs {lp!r} != rollout/ref_log_probs {ref!r} (|diff| {abs(lp - ref):.3e} > {REF_ABS_TOL}); "
                "before any update the policy must equal the reference.\n"
                + describe_gap(trainer, reference, response_ids),
            )
    engine_mean = rollout_line["rollout/rollout_log_probs"]
    if not abs(lp - engine_mean) <= abs_tol:
        raise CheckFailure(
            "logprobs",
            f"rollout {rollout_id}: trainer-vs-engine gap |rollout/log_probs {lp:.6f} − rollout/rollout_log_probs "
            f"{engine_mean:.6f}| = {abs(lp - engine_mean):.6f} > --ci-logprobs-checker-abs-tol {abs_tol}\n"
            + describe_gap(trainer, engine, response_ids),
        )
    entropy = rollout_line.get("rollout/entropy")
    low, high = ENTROPY_RANGE
    if entropy is not None and not low < entropy < high:
        raise CheckFailure(
            "logprobs",
            f"rollout {rollout_id}: rollout/entropy {entropy:.4f} outside ({low}, {high}) (Miles' CI range): "
            + (
                "the policy collapsed to deterministic outputs"
                if entropy <= low
                else "the policy is close to uniform noise"
            ),
        )
