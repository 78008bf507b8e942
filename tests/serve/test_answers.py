"""`/generate` answers built from engine results (serve/protocol.py), without a server."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpolab.core.engine.base import GenerationResult, SamplingParams
from grpolab.serve.protocol import GenerateItem
from grpolab.serve.responses import generate_response


def _answer(log_probs: list[float], *, logprob: bool) -> dict:
    item = GenerateItem(
        rid="r1", prompt_ids=[1, 2], params=SamplingParams(max_new_tokens=3), seed=0, return_logprob=logprob
    )
    result = GenerationResult(
        response_ids=[5, 6, 7], log_probs=torch.tensor(log_probs), finish_reason="length", weight_version=0
    )
    return generate_response(item, result, weight_version="0", text="x", vocab_size=16, seconds=0.1)


def test_finite_log_probs_are_written_exactly() -> None:
    lp = [-0.1, -2.5, -1e-7]
    answer = json.loads(json.dumps(_answer(lp, logprob=True), allow_nan=False))
    got = [t[0] for t in answer["meta_info"]["output_token_logprobs"]]
    assert got == [float(torch.tensor(x)) for x in lp]  # float32 values, exactly


@pytest.mark.parametrize("bad", [math.nan, -math.inf])
def test_non_finite_log_probs_are_a_clear_error_not_an_http_500(bad: float) -> None:
    """NaN weights loaded through /update_weights_from_disk made /generate answer a bare HTTP 500 (JSON
    has no NaN); the handler now answers 400 with this message."""
    with pytest.raises(ValueError, match=r"request r1: 1 of its 3 log-probs are NaN or infinite .*weights"):
        _answer([-0.1, bad, -0.2], logprob=True)
    answer = _answer([-0.1, bad, -0.2], logprob=False)  # nothing non-finite is written: answered
    assert answer["output_ids"] == [5, 6, 7] and "output_token_logprobs" not in answer["meta_info"]
