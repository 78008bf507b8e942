"""Stop strings (SGLang's `sampling_params.stop`, OpenAI's `stop`) applied to a finished decode (pure).

This engine decodes a batch as one call and stops rows on token ids only, so a stop string is found
after the decode: the answer is cut after the first token whose decoded text contains one of the stop
strings, as SGLang cuts it while decoding (`srt/managers/schedule_batch.py`, `check_finished`: the
tokens up to and including the one that completes the match are kept; the text is trimmed before the
match unless `no_stop_trim`). Each sample's tokens depend on its own prompt, seed and earlier tokens
only, so the kept tokens and their log-probs are the ones a decode that stopped there would return;
the tokens decoded after the match are compute spent and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from grpolab.core.engine.base import GenerationResult

MAX_STOP_STRINGS = 16
"""How many stop strings one request may give (grpolab's bound; OpenAI allows 4, SGLang any number)."""


@dataclass(frozen=True)
class StopCut:
    """Where a stop string ended an answer.

    Attributes:
        keep: how many generated tokens stay (the last one completes the match), >= 1.
        matched: the stop string found (the earliest in the text when several are).
        text: the decoded text of the kept tokens, trimmed before the match unless `no_stop_trim`.
    """

    keep: int
    matched: str
    text: str


def _first_match(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(character offset, stop string) of the earliest stop string in `text`, or None."""
    found = [(text.find(s), s) for s in stops if s and s in text]
    return min(found) if found else None


def find_stop(
    ids: Sequence[int], decode: Callable[[Sequence[int]], str], stops: Sequence[str], *, no_stop_trim: bool
) -> StopCut | None:
    """The first stop string in the decoded answer `ids`, or None when none occurs.

    Args:
        ids: the generated token ids (R of them).
        decode: token ids -> text (the server's `tokenizer.decode` with the request's special-token rule).
        stops: the request's stop strings (empty strings never match).
        no_stop_trim: keep the matched string at the end of `text` (SGLang's `no_stop_trim`).

    Returns:
        The cut: the shortest prefix of `ids` whose text contains a stop string (found by bisection
        over prefix lengths: a longer prefix's text contains a shorter one's, so containment only
        grows with the length; O(log R) decodes).
    """
    if not ids or _first_match(decode(ids), stops) is None:
        return None
    lo, hi = 1, len(ids)  # the prefix of length hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if _first_match(decode(ids[:mid]), stops) is not None:
            hi = mid
        else:
            lo = mid + 1
    text = decode(ids[:hi])
    match = _first_match(text, stops)
    assert match is not None
    offset, matched = match
    return StopCut(keep=hi, matched=matched, text=text if no_stop_trim else text[:offset])


def cut_result(result: GenerationResult, keep: int) -> GenerationResult:
    """`result` with only its first `keep` tokens (log-probs, kept sets and top log-probs cut alike),
    finish reason "stop"."""
    top = result.top_log_probs
    return replace(
        result,
        response_ids=result.response_ids[:keep],
        log_probs=result.log_probs[:keep].clone(),
        finish_reason="stop",
        kept_token_ids=None if result.kept_token_ids is None else result.kept_token_ids[:keep],
        top_log_probs=None if top is None else (top[0][:keep].clone(), top[1][:keep].clone()),
    )


def stop_strings(value: object, what: str) -> tuple[str, ...]:
    """A request's `stop` (null, a string, or a list of strings) as a tuple of non-empty strings.

    Raises:
        ValueError: another type, a list element that is not a string, or more than
            `MAX_STOP_STRINGS` strings; the message names `what` (the field).
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ValueError(f"{what} must be a string or a list of strings, got {value!r}")
    if len(items) > MAX_STOP_STRINGS:
        raise ValueError(f"{what} has {len(items)} strings; at most {MAX_STOP_STRINGS} are accepted")
    return tuple(s for s in items if s)
