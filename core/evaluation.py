"""Held-out evaluation: generate on `--eval-prompt-data` sets and report `eval/<name>` (mean reward).

Eval samples use the rollout's sampling settings, `--n-samples-per-eval-prompt` answers per
prompt, and seeds derived like training seeds but in a separate namespace (rollout id −1 − n), so
an eval never perturbs training randomness. Metric names follow Miles (notes 4.2):
`eval/<name>`, `eval/<name>-truncated_ratio`, `eval/<name>/response_len/mean`.
"""

from __future__ import annotations

from grpolab.core import rewards
from grpolab.core.data import PromptDataset
from grpolab.core.engine.base import GenerationRequest, RolloutEngine, SamplingParams
from grpolab.core.seeding import derive_sample_seed


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
) -> dict[str, float]:
    """Mean reward, truncation ratio and mean response length (tokens) per eval set."""
    out: dict[str, float] = {}
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
        out[f"eval/{name}"] = sum(scores) / len(scores)
        out[f"eval/{name}-truncated_ratio"] = sum(r.finish_reason == "length" for r in results) / len(results)
        out[f"eval/{name}/response_len/mean"] = sum(len(r.response_ids) for r in results) / len(results)
    return out
