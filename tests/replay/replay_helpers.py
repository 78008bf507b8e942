"""Synthetic rollouts and Miles dumps for the replay tests (imported by test files; not a conftest so the name stays unique)."""

from __future__ import annotations

import random

import torch

from grpolab.core.batch import Sample


def build_samples(
    n: int = 16,
    *,
    group: int = 4,
    prompt_len: int = 12,
    resp_len: int = 20,
    kept: bool = False,
    seed: int = 0,
) -> list[Sample]:
    """`n` samples in groups of `group`; ~resp_len response tokens; kept sets on odd samples when `kept`."""
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    out: list[Sample] = []
    for i in range(n):
        R = max(0, resp_len + rnd.randint(-3, 3))
        if i % group == 0:
            prompt = [rnd.randrange(150_000) for _ in range(prompt_len)]
        out.append(
            Sample(
                index=i,
                prompt_index=100 + i // group,
                group_index=i // group,
                sample_index=i % group,
                seed=rnd.getrandbits(63),
                prompt_ids=list(prompt),
                response_ids=[rnd.randrange(150_000) for _ in range(R)],
                rollout_log_probs=(-torch.rand(R, generator=g) * 4).float(),
                loss_mask=torch.ones(R, dtype=torch.float32),
                finish_reason="length" if i % 5 == 0 else "stop",
                prompt_text=f"What is {i // group} + 1? ünïcode ✓",
                response_text=f"answer {i}",
                label=str(i // group + 1),
                kept_token_ids=[
                    torch.sort(torch.randint(0, 1000, (rnd.randint(0, 6),), generator=g)).values
                    for _ in range(R)
                ]
                if kept and i % 2
                else None,
                reward=float(i % 3 == 0),
                advantage=rnd.uniform(-1, 1),
                weight_version=7,
                metadata={"note": i, "nested": {"x": [1, 2]}} if i % 4 == 1 else {},
            )
        )
    return out


def miles_sample(i: int, group: int, prompt_ids: list[int], response: list[int], **over: object) -> dict:
    R = len(response)
    d = {
        "group_index": group,
        "index": 1000 + i,
        "prompt": f"prompt {group}",
        "tokens": prompt_ids + response,
        "response": f"response {i}",
        "response_length": R,
        "label": str(group),
        "reward": float(i % 2),
        "loss_mask": [1] * R,
        "rollout_log_probs": [-0.125 * (t + 1) for t in range(R)],
        "weight_versions": ["4"],
        "status": "completed",
        "metadata": {"source": "gsm8k"},
    }
    d.update(over)
    return d


def make_dump() -> dict:
    samples = [
        miles_sample(0, 0, [1, 2, 3], [10, 11, 12, 13]),
        miles_sample(
            1, 0, [1, 2, 3], [14, 15], status="Status.TRUNCATED", tokens=torch.tensor([1, 2, 3, 14, 15])
        ),
        miles_sample(
            2,
            1,
            [5, 6],
            [20, 21, 22],
            loss_mask=torch.tensor([1, 0, 1], dtype=torch.int32),
            reward={"acc": 1.0, "fmt": 0.5},
        ),
        miles_sample(
            3,
            1,
            [5, 6],
            [23],
            status="aborted",
            rollout_log_probs=torch.tensor([-0.5]),
            loss_mask=None,
            remove_sample=True,
        ),
        miles_sample(
            4,
            1,
            [5, 6],
            [],
            response_length=0,
            loss_mask=[],
            rollout_log_probs=[],
            prompt=[{"role": "user", "content": "hi"}],
        ),
    ]
    return {"rollout_id": 5, "metadata": {"dynamic_global_batch_size": 4}, "samples": samples}
