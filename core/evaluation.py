"""Held-out evaluation: generate on `--eval-prompt-data` sets and report `eval/<name>` (mean reward).

Eval samples use the rollout's sampling settings, `--n-samples-per-eval-prompt` answers per
prompt, and seeds derived like training seeds but in a separate namespace (rollout id −1 − n), so
an eval never perturbs training randomness. Metric names follow Miles (notes 4.2):
`eval/<name>`, `eval/<name>-truncated_ratio`, `eval/<name>/response_len/mean`. The scored samples
come back too, so `--save-debug-rollout-data` records each eval as `eval_<id>` (Miles convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpolab.core import rewards
from grpolab.core.batch import Sample
from grpolab.core.data import PromptDataset
from grpolab.core.engine.base import GenerationRequest, GenerationResult, RolloutEngine, SamplingParams
from grpolab.core.seeding import derive_sample_seed


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    """One eval: the `eval N:` metrics and every scored sample of every eval set.

    Attributes:
        metrics: `eval/<name>` (mean reward), `eval/<name>-truncated_ratio` and
            `eval/<name>/response_len/mean` (tokens) per eval set.
        samples: all sets' samples in set order, `index` and `group_index` running over all sets,
            metadata {"eval_set": name}, reward filled, advantage 0.0 (evals do not train).
    """

    metrics: dict[str, float]
    samples: list[Sample]


def evaluate(
    engine: RolloutEngine,
    datasets: dict[str, PromptDataset],
    params: SamplingParams,
    *,
    rollout_id: int,
    run_seed: int,
    n_samples: int,
    max_prompts: int | None,
    rm_type: str | None,
    custom_fn=None,
    reward_key: str | None = None,
) -> EvalResult:
    """Generate on each eval set and score it: metrics and samples (see `EvalResult`)."""
    out: dict[str, float] = {}
    samples: list[Sample] = []
    for name, dataset in datasets.items():
        count = len(dataset) if max_prompts is None else min(max_prompts, len(dataset))
        prompts = [dataset[i] for i in range(count)]
        requests = [
            GenerationRequest(
                prompt_ids=p.prompt_ids, seed=derive_sample_seed(run_seed, -1 - rollout_id, p.index, k)
            )
            for p in prompts
            for k in range(n_samples)
        ]
        results = engine.generate(requests, params)
        tokenizer = dataset.tokenizer
        records = [
            {
                "prompt": prompts[i // n_samples].text,
                "response": tokenizer.decode(r.response_ids, skip_special_tokens=True),
                "label": prompts[i // n_samples].label,
                "index": i,
                "group_index": i // n_samples,
                "metadata": {},
            }
            for i, r in enumerate(results)
        ]
        scores = rewards.score_samples(records, rm_type=rm_type, custom_fn=custom_fn, reward_key=reward_key)
        samples += _eval_samples(name, prompts, requests, results, records, scores, n_samples, len(samples))
        out[f"eval/{name}"] = sum(scores) / len(scores)
        out[f"eval/{name}-truncated_ratio"] = sum(r.finish_reason == "length" for r in results) / len(results)
        out[f"eval/{name}/response_len/mean"] = sum(len(r.response_ids) for r in results) / len(results)
    return EvalResult(metrics=out, samples=samples)


def _eval_samples(
    name: str,
    prompts: list,
    requests: list[GenerationRequest],
    results: list[GenerationResult],
    records: list[dict],
    scores: list[float],
    n_samples: int,
    first: int,
) -> list[Sample]:
    """One eval set's scored answers (`n_samples` per prompt) as samples numbered from `first`."""
    return [
        Sample(
            index=first + i,
            prompt_index=prompts[i // n_samples].index,
            group_index=(first + i) // n_samples,
            sample_index=i % n_samples,
            seed=req.seed,
            prompt_ids=list(req.prompt_ids),
            response_ids=list(res.response_ids),
            rollout_log_probs=res.log_probs.float().cpu(),
            loss_mask=torch.ones(len(res.response_ids), dtype=torch.float32),
            finish_reason=res.finish_reason,
            prompt_text=rec["prompt"],
            response_text=rec["response"],
            label=rec["label"],
            kept_token_ids=res.kept_token_ids,
            reward=float(score),
            weight_version=res.weight_version,
            metadata={"eval_set": name},
        )
        for i, (req, res, rec, score) in enumerate(zip(requests, results, records, scores))
    ]
