"""Trainer-side test input: samples the in-process engine generates on a model, as a rollout makes them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from grpolab.core.batch import Sample
from grpolab.core.engine.base import GenerationRequest, SamplingParams
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.core.modeling import load_tokenizer


def engine_samples(
    model_dir: Path, questions: list[str], prompt_of: list[int], seeds: list[int], params: SamplingParams
) -> list[Sample]:
    """One sample per entry of `prompt_of` (the index of its question, chat template applied), sampled
    with `seeds[i]` and `params` (the tokenizer's eos is added as a stop token); group and prompt index
    are the question's, advantages alternate +1, +1, -1."""
    tok = load_tokenizer(model_dir)
    prompts = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        for q in questions
    ]
    reqs = [GenerationRequest(prompt_ids=prompts[p], seed=s) for p, s in zip(prompt_of, seeds)]
    params = dataclasses.replace(params, stop_token_ids=(tok.eos_token_id,))
    results = TorchEngine(model_dir, show_progress=False).generate(reqs, params)
    return [
        Sample(
            index=i,
            prompt_index=prompt_of[i],
            group_index=prompt_of[i],
            sample_index=prompt_of[:i].count(prompt_of[i]),
            seed=req.seed,
            prompt_ids=list(req.prompt_ids),
            response_ids=res.response_ids,
            rollout_log_probs=res.log_probs,
            loss_mask=torch.ones(len(res.response_ids)),
            finish_reason=res.finish_reason,
            kept_token_ids=res.kept_token_ids,
            advantage=1.0 if i % 3 else -1.0,
        )
        for i, (req, res) in enumerate(zip(reqs, results))
    ]
