"""Log-prob checker (`--ci-test`, off with `--ci-disable-logprobs-checker`).

Miles `log_utils.py::log_rollout_data` (notes-miles-slime-areal.md 3.2): at rollout 0 the actor's
mean log-prob equals the reference's within 1e-8; every rollout the trainer-vs-engine mean gap
|rollout/log_probs − rollout/rollout_log_probs| is within `--ci-logprobs-checker-abs-tol` (0.03);
mean entropy lies in `--ci-entropy-range` (Miles: (0, 0.7)). Beyond Miles, a failure names the worst
samples and token positions with both values, tells a bias (per-token gaps of one sign) from noise,
and orders the likely causes by what the numbers and the run's settings show:

- stale engine weights first when the run's first gap was small and the gap jumped after weight
  syncs (`step0.gap_jumped`): the trainer's updates did not reach the engine;
- a different support when top-p/top-k is on and the per-token gaps equal log(kept mass) (see
  `support_evidence`);
- an unapplied chat template first when the tokenizer has one and the run does not apply it (an
  instruct model fed raw prompts answers with high entropy; `grpolab check template` measures it).
  Settings only make a suspect; evidence in the numbers (the two above) comes before it.

An entropy above the range is called "close to uniform noise" only when it is, that is at least
`NEAR_UNIFORM_SHARE` of ln(vocab size) nats (the entropy of the uniform distribution).

Legend: `R` one sample's response length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.step0 import gap_jumped
from grpolab.core.config.debugging import MILES_ENTROPY_RANGE

REF_ABS_TOL = 1e-8
DEFAULT_ABS_TOL = 0.03
ENTROPY_RANGE = MILES_ENTROPY_RANGE
"""Miles' `--ci-test` range for rollout/entropy, (0, 0.7) nats (the `--ci-entropy-range` default)."""
BIAS_SHARE = 0.95
"""Share of token gaps with one sign above which the gap is called a bias, not noise."""
NEAR_UNIFORM_SHARE = 0.9
"""Entropy at or above this share of ln(vocab) is "close to uniform noise" (grpolab's threshold)."""
KEPT_SIDE_TOL = 1e-6
"""|log-prob| at or below this is the log of 1: a token scored over a kept set holding only itself."""
INFORMATIVE_TOL = 1e-4
"""A full-vocabulary log-prob below −this tells a single-token kept set's mass apart from 1."""

TEMPERATURE_CAUSE = (
    "temperature applied on one side only (trainer log-probs should use logits / --rollout-temperature)"
)
SUPPORT_CAUSE = (
    "scoring over a different support than the sampler kept (top-p/top-k: the gap ≈ log of the kept mass)"
)
TOKENIZATION_CAUSE = "a chat-template or tokenization mismatch between engine and trainer"
STALE_CAUSE = (
    "stale engine weights: a weight sync that did not reach the engine, so it samples with older "
    "weights than the trainer scores with (the gap grows after each update)"
)
BIAS_CAUSES = (TEMPERATURE_CAUSE, SUPPORT_CAUSE, TOKENIZATION_CAUSE)
"""The usual causes of a one-signed gap between two scorings of the same tokens, in their order when
nothing points at one; a trainer-vs-engine gap adds `STALE_CAUSE` (two sides, two copies of the weights)."""


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What the checker knows about the run besides the numbers.

    Attributes:
        vocab_size: the tokenizer's vocabulary size V (uniform noise is ln V nats), None if unknown.
        chat_template_unapplied: the tokenizer has a chat template and `--apply-chat-template` is off.
        filters_support: `--rollout-top-p` < 1 or `--rollout-top-k` > 0 (the sampler keeps a subset).
        weight_sync_skipped: `--debug-skip-weight-update` (the engine never receives new weights).
    """

    vocab_size: int | None = None
    chat_template_unapplied: bool = False
    filters_support: bool = False
    weight_sync_skipped: bool = False


@dataclass(frozen=True)
class GapSeen:
    """The mean per-token |trainer − engine| log-prob gap (nats) of one checked rollout."""

    rollout_id: int
    gap: float


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


def mean_abs_gap(trainer: list[torch.Tensor], engine: list[torch.Tensor]) -> float:
    """Mean over all response tokens of |trainer − engine| (float32 [R] per sample); 0.0 without tokens."""
    diffs = [(t.double() - e.double()).abs().reshape(-1) for t, e in zip(trainer, engine)]
    flat = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    return float(flat.mean()) if flat.numel() else 0.0


def support_evidence(
    trainer: list[torch.Tensor],
    engine: list[torch.Tensor],
    kept_token_ids: list[list[torch.Tensor] | None] | None,
) -> str | None:
    """Whether one side scores over the sampler's kept set and the other over the full vocabulary.

    If side K renormalizes over the kept set S and side F does not, F − K = log p(S) (the kept mass)
    at every token. Where the sampler kept a single token, p(S) is that token's probability, so K is
    log 1 = 0 and the gap equals F exactly; elsewhere log p(S) lies between F and 0. The evidence
    holds when, at the single-token positions where F tells p(S) from 1 (F < −INFORMATIVE_TOL), at
    least BIAS_SHARE of them have |K| <= KEPT_SIDE_TOL, and at least BIAS_SHARE of the other
    differing positions have F − K of the sign of log p(S) (negative).

    Args:
        trainer, engine: float32 [R] log-probs per sample.
        kept_token_ids: per sample, per response token, the kept vocabulary ids (or None: nothing
            recorded, top-p/top-k off).

    Returns:
        One sentence naming which side scores over which support, with the counts; None when the
        evidence is absent (no kept sets, no informative single-token position, or it does not hold).
    """
    if not kept_token_ids:
        return None
    sides = (("trainer", trainer, "engine", engine), ("engine", engine, "trainer", trainer))
    for full_name, full, kept_name, kept in sides:
        singles, matched, wider, wider_ok, full_sum = 0, 0, 0, 0, 0.0
        for f, k, ids in zip(full, kept, kept_token_ids):
            for pos, kept_ids in enumerate(ids or []):
                fv, kv = float(f[pos]), float(k[pos])
                if kept_ids.numel() == 1 and fv < -INFORMATIVE_TOL:
                    singles += 1
                    matched += abs(kv) <= KEPT_SIDE_TOL
                    full_sum += fv
                elif kept_ids.numel() > 1 and fv != kv:
                    wider += 1
                    wider_ok += fv - kv < 0
        if singles and matched >= BIAS_SHARE * singles and wider_ok >= BIAS_SHARE * wider:
            return (
                f"the supports differ: the {full_name} scores over the full vocabulary and the {kept_name} "
                f"over the kept set (top-p/top-k). At the {matched} of {singles} positions where the sampler "
                f"kept a single token, the {kept_name}'s log-prob is 0 (log 1) while the {full_name}'s is "
                f"log p = {full_sum / singles:.4f} on average, so the per-token gap equals log(kept mass); "
                f"{wider_ok} of {wider} other differing tokens have its sign. Score both sides over the "
                "kept set (the trainer masks logits outside Sample.kept_token_ids)"
            )
    return None


def _gap_causes(stale: str | None, support: str | None, facts: RunFacts) -> list[str]:
    """The causes of a trainer-vs-engine gap, most likely first: evidence, then settings, then the rest."""
    first = [c for c in (stale, support) if c is not None]
    if facts.chat_template_unapplied:
        first.append(_template_suspect("a high-entropy policy magnifies every numerical difference"))
    rest = [c for c in BIAS_CAUSES if not (c == SUPPORT_CAUSE and support)]
    return first + rest + ([] if stale else [STALE_CAUSE])


def _template_suspect(why: str) -> str:
    return (
        "the chat template is not applied: the tokenizer has one and --apply-chat-template is off, so an "
        f"instruct model reads raw prompts ({why}); pass --apply-chat-template, or compare with "
        "`grpolab check template --hf-checkpoint M`"
    )


def describe_gap(
    trainer: list[torch.Tensor],
    engine: list[torch.Tensor],
    response_ids: list[list[int]],
    causes: list[str] | None = None,
) -> str:
    """Worst tokens with both values, whether the gaps share one sign (a bias) or not, and the likely
    causes, most likely first (`causes`; default `BIAS_CAUSES`, listed under a bias only)."""
    lines = ["worst tokens (sample, position, token id: trainer vs engine log-prob):"]
    for g in worst_tokens(trainer, engine, response_ids):
        lines.append(
            f"  sample {g.sample}, position {g.position}, token {g.token_id}: {g.trainer:.6f} vs {g.engine:.6f} (gap {g.gap:+.6f})"
        )
    diffs = torch.cat([(t - e).reshape(-1) for t, e in zip(trainer, engine)]) if trainer else torch.zeros(0)
    nonzero = diffs[diffs != 0]
    bias = False
    if nonzero.numel():
        positive = float((nonzero > 0).float().mean())
        share = max(positive, 1 - positive)
        sign = "trainer above engine" if positive >= 0.5 else "trainer below engine"
        bias = share >= BIAS_SHARE
        if bias:
            lines.append(
                f"{100 * share:.1f}% of the {nonzero.numel()} differing tokens have one sign ({sign}): a bias, not noise."
            )
        else:
            lines.append(
                f"gaps have mixed signs ({100 * positive:.1f}% positive): not a one-sided bias; numerical "
                "noise if small, else the two sides run different weights"
            )
    if causes is not None or bias:
        lines.append("Likely causes, most likely first:")
        lines += [f"  - {c}" for c in (BIAS_CAUSES if causes is None else causes)]
    return "\n".join(lines)


def _stale_evidence(rollout_id: int, gap: float, first: GapSeen | None, facts: RunFacts) -> str | None:
    """The stale-weights sentence when the run's first gap was small and this one jumped after syncs."""
    if first is None or rollout_id <= first.rollout_id or not gap_jumped(first.gap, gap):
        return None
    syncs = rollout_id - first.rollout_id
    skipped = (
        " (this run has --debug-skip-weight-update: no weights are sent)" if facts.weight_sync_skipped else ""
    )
    return (
        f"stale engine weights{skipped}: the mean per-token gap was {first.gap:.3e} at rollout "
        f"{first.rollout_id} (trainer and engine on the same weights) and is {gap:.3e} now, after "
        f"{syncs} weight sync(s): the sync did not reach the engine, which still samples with older weights"
    )


def describe_entropy(entropy: float, low: float, high: float, facts: RunFacts) -> str:
    """Why rollout/entropy (nats per token) is outside (low, high), naming uniform noise only when it is."""
    head = f"rollout/entropy {entropy:.4f} outside ({low}, {high}) (--ci-entropy-range; Miles' CI range is (0, 0.7))"
    if entropy <= low:
        return f"{head}: the policy collapsed to deterministic outputs"
    uniform = math.log(facts.vocab_size) if facts.vocab_size else None
    if uniform is not None and entropy >= NEAR_UNIFORM_SHARE * uniform:
        what = f"the policy is close to uniform noise (ln({facts.vocab_size}) = {uniform:.2f} nats)"
    elif uniform is not None:
        what = (
            f"the policy is unsure, not random: uniform noise would be ln({facts.vocab_size}) = "
            f"{uniform:.2f} nats ({100 * entropy / uniform:.0f}% of it)"
        )
    else:
        what = "the policy is less certain than Miles' CI models"
    suspects = [
        "a model or prompts unlike Miles' CI models (a base model, open-ended prompts): widen --ci-entropy-range",
        "--rollout-temperature above 1",
    ]
    if facts.chat_template_unapplied:
        suspects.insert(0, _template_suspect("it answers raw prompts with much less certainty"))
    return f"{head}: {what}. Likely causes, most likely first:\n" + "\n".join(f"  - {s}" for s in suspects)


def check_logprobs(
    rollout_id: int,
    rollout_line: dict[str, float],
    *,
    trainer: list[torch.Tensor],
    reference: list[torch.Tensor] | None,
    engine: list[torch.Tensor],
    response_ids: list[list[int]],
    abs_tol: float = DEFAULT_ABS_TOL,
    entropy_range: tuple[float, float] = ENTROPY_RANGE,
    facts: RunFacts = RunFacts(),
    first_gap: GapSeen | None = None,
    kept_token_ids: list[list[torch.Tensor] | None] | None = None,
) -> None:
    """Assert the log-prob invariants of one rollout (means from the `rollout N` line, details from tensors).

    Args:
        trainer / reference / engine: float32 [R] log-probs per sample; response_ids: their tokens.
        abs_tol: `--ci-logprobs-checker-abs-tol` (nats); entropy_range: `--ci-entropy-range` (nats).
        facts: the run's settings that rank the causes; first_gap: the run's first checked rollout
            (`LogprobChecker` keeps it); kept_token_ids: per sample the sampler's kept sets (top-p/top-k).

    Raises:
        CheckFailure: naming the metric, both values, the tolerance, the worst tokens and the likely causes.
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
        stale = _stale_evidence(rollout_id, mean_abs_gap(trainer, engine), first_gap, facts)
        support = support_evidence(trainer, engine, kept_token_ids) if facts.filters_support else None
        raise CheckFailure(
            "logprobs",
            f"rollout {rollout_id}: trainer-vs-engine gap |rollout/log_probs {lp:.6f} − rollout/rollout_log_probs "
            f"{engine_mean:.6f}| = {abs(lp - engine_mean):.6f} > --ci-logprobs-checker-abs-tol {abs_tol}\n"
            + describe_gap(trainer, engine, response_ids, _gap_causes(stale, support, facts)),
        )
    entropy = rollout_line.get("rollout/entropy")
    low, high = entropy_range
    if entropy is not None and not low < entropy < high:
        raise CheckFailure(
            "logprobs", f"rollout {rollout_id}: " + describe_entropy(entropy, low, high, facts)
        )


class LogprobChecker:
    """The log-prob checker of one run: its settings, what it knows of the run, the first gap it saw.

    Args:
        abs_tol: `--ci-logprobs-checker-abs-tol`; entropy_range: `--ci-entropy-range` (LOW, HIGH) nats.
        facts: see `RunFacts` (replace with `dataclasses.replace` once the tokenizer is known).
    """

    def __init__(self, *, abs_tol: float, entropy_range: tuple[float, float], facts: RunFacts) -> None:
        self.abs_tol, self.entropy_range, self.facts = abs_tol, entropy_range, facts
        self.first_gap: GapSeen | None = None

    def check(
        self,
        rollout_id: int,
        rollout_line: dict[str, float],
        *,
        trainer: list[torch.Tensor],
        reference: list[torch.Tensor] | None,
        engine: list[torch.Tensor],
        response_ids: list[list[int]],
        kept_token_ids: list[list[torch.Tensor] | None] | None = None,
    ) -> None:
        """`check_logprobs` with this run's settings; the first rollout that passes becomes `first_gap`.

        Raises:
            CheckFailure: see `check_logprobs`.
        """
        check_logprobs(
            rollout_id,
            rollout_line,
            trainer=trainer,
            reference=reference,
            engine=engine,
            response_ids=response_ids,
            abs_tol=self.abs_tol,
            entropy_range=self.entropy_range,
            facts=self.facts,
            first_gap=self.first_gap,
            kept_token_ids=kept_token_ids,
        )
        if self.first_gap is None:
            self.first_gap = GapSeen(rollout_id, mean_abs_gap(trainer, engine))
