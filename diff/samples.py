"""Layer 3 of `grpolab diff`: the first sample and token where two recordings of a rollout differ.

Samples are paired in recording order (`Sample.index`); in a pair, the response token ids are
compared exactly and the engine log-probs within the tolerance (|Δ| ≤ tol; tol 0 = bitwise), token
by token; a pair whose responses agree is then checked for its prompt ids and reward. Texts around
the token are decoded with the run's tokenizer when its --hf-checkpoint folder is on this machine,
else shown as token ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from grpolab.core.batch import Sample
from grpolab.diff.report import SampleDivergence
from grpolab.replay.recording import load_rollout

Decode = Callable[[Sequence[int]], str]
BEFORE, AFTER = 8, 4
"""Tokens shown before and after the first differing token."""


def ids_as_text(ids: Sequence[int]) -> str:
    """Token ids as text (no tokenizer on this machine): "[1, 2, 3]"."""
    return "[" + ", ".join(str(i) for i in ids) + "]"


def tokenizer_decoder(folder: Path | None) -> Decode:
    """`tokenizer.decode` of the tokenizer in `folder` (a local --hf-checkpoint), else `ids_as_text`.

    A folder whose tokenizer does not load falls back to ids (the report still names the token ids).
    """
    if folder is None:
        return ids_as_text
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError):
        return ids_as_text
    return lambda ids: str(tok.decode(list(ids)))


def _around(ids: list[int], i: int, decode: Decode) -> str:
    """The text of `ids` around index i, the token at i in «»; "" for an empty response."""
    if not ids:
        return ""
    head, tok, tail = ids[max(0, i - BEFORE) : i], ids[i : i + 1], ids[i + 1 : i + 1 + AFTER]
    return f"{decode(head)}«{decode(tok) if tok else '(end)'}»{decode(tail)}"


def _logprob(sample: Sample, i: int) -> float | None:
    lp = sample.rollout_log_probs
    return float(lp[i]) if i < len(lp) else None


def _first_token(a: Sample, b: Sample, tol: float) -> tuple[int, str] | None:
    """(index, "tokens" | "logprobs") of the first response position that differs, or None."""
    ra, rb = a.response_ids, b.response_ids
    for i in range(max(len(ra), len(rb))):
        if i >= len(ra) or i >= len(rb) or ra[i] != rb[i]:
            return i, "tokens"
        la, lb = _logprob(a, i), _logprob(b, i)
        if la is not None and lb is not None and (la != lb if tol == 0 else abs(la - lb) > tol):
            return i, "logprobs"
    return None


def _no_token(rollout_id: int, sample: Sample, field: str, text_a: str, text_b: str) -> SampleDivergence:
    """A divergence that names no token (prompt, reward or sample count)."""
    return SampleDivergence(
        rollout_id,
        sample.prompt_index,
        sample.sample_index,
        None,
        None,
        None,
        None,
        None,
        text_a,
        text_b,
        field,
    )


def _pair_divergence(
    rollout_id: int, sa: Sample, sb: Sample, *, tol: float, decode: Decode
) -> SampleDivergence | None:
    """What differs first in one pair of samples: a response token (ids, or log-probs beyond tol; the
    prompt named too when it differs), else the prompt, else the reward; None when they agree."""
    found = _first_token(sa, sb, tol)
    fields = ["prompt"] if sa.prompt_ids != sb.prompt_ids else []
    if found is None:
        if fields:
            return _no_token(rollout_id, sa, "prompt", decode(sa.prompt_ids), decode(sb.prompt_ids))
        if sa.reward != sb.reward:
            return _no_token(rollout_id, sa, "reward", f"reward {sa.reward!r}", f"reward {sb.reward!r}")
        return None
    i, what = found
    ra, rb = sa.response_ids, sb.response_ids
    return SampleDivergence(
        rollout_id=rollout_id,
        prompt_index=sa.prompt_index,
        sample_index=sa.sample_index,
        token_index=i,
        token_a=ra[i] if i < len(ra) else None,
        token_b=rb[i] if i < len(rb) else None,
        logprob_a=_logprob(sa, i),
        logprob_b=_logprob(sb, i),
        text_a=_around(ra, i, decode),
        text_b=_around(rb, i, decode),
        field=", ".join([*fields, what]),
    )


def sample_divergence(
    rollout_id: int, a: list[Sample], b: list[Sample], *, tol: float, decode: Decode
) -> SampleDivergence | None:
    """The first differing sample of one rollout's two recordings; None when they agree.

    Args:
        a / b: the recordings' samples in order; tol: log-prob tolerance (0 = bitwise).
        decode: token ids → text (`tokenizer_decoder`).
    """
    for sa, sb in zip(a, b):
        found = _pair_divergence(rollout_id, sa, sb, tol=tol, decode=decode)
        if found is not None:
            return found
    if len(a) != len(b):
        extra = (a if len(a) > len(b) else b)[min(len(a), len(b))]  # the first sample one side lacks
        return _no_token(rollout_id, extra, "count", f"{len(a)} samples", f"{len(b)} samples")
    return None


def compare_recordings(
    rec_a: dict[int, Path], rec_b: dict[int, Path], *, tol: float, tokenizer_dir: Path | None
) -> tuple[SampleDivergence | None, list[str]]:
    """Compare the rollouts both runs recorded, in rollout order; stop at the first that differs.

    Returns:
        (the first divergence or None, notes): a note says what could not be compared (recordings on
        one side only, rollouts recorded by one run only); no recordings on either side gives no note.

    Raises:
        RecordingError: a recording does not read (the message names the file).
    """
    notes: list[str] = []
    if not rec_a and not rec_b:
        return None, notes
    only_a, only_b = sorted(set(rec_a) - set(rec_b)), sorted(set(rec_b) - set(rec_a))
    if not rec_a or not rec_b:
        side, ids = ("A", only_a) if rec_a else ("B", only_b)
        notes.append(f"recordings on one side only: run {side} recorded rollouts {ids}, the other none")
        return None, notes
    for side, ids in (("A", only_a), ("B", only_b)):
        if ids:
            notes.append(f"run {side} alone recorded rollouts {ids}: they were not compared")
    decode: Decode | None = None
    for rid in sorted(set(rec_a) & set(rec_b)):
        a, b = load_rollout(rec_a[rid]).samples, load_rollout(rec_b[rid]).samples
        cheap = sample_divergence(rid, a, b, tol=tol, decode=ids_as_text)
        if cheap is not None:
            decode = decode or tokenizer_decoder(tokenizer_dir)
            return sample_divergence(rid, a, b, tol=tol, decode=decode), notes
    return None, notes
