"""The trainer's shared-prefix forward (core/shared_prefix.py) against the padded forward it replaces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from engine_samples import engine_samples
from runs import cli_in_fresh_process

from grpolab.core import algorithms
from grpolab.core.actor import Actor
from grpolab.core.batch import MicroBatch, Sample, collate
from grpolab.core.config import AlgorithmConfig, Config, OptimizerConfig
from grpolab.core.engine.base import SamplingParams
from grpolab.core.engine.decode_support import check_train_forward
from grpolab.core.modeling import load_causal_lm
from grpolab.core.shared_prefix import pack_shared_prefix, packing_cost, unsupported_reason

QUESTIONS = [
    "Tom has 3 apples and buys 5 more. How many apples does Tom have now?",
    "What is 7 + 8?",
    "A shop had 19 pens. It sold 4 of them in the morning and 6 more later. How many pens are left?",
]
TOLERANCE = 1e-5
"""Largest |log-prob| difference allowed between the packed and the padded forward: they differ by
float32 rounding only (measured on the default run's micro-batches: 3.8e-6)."""


def generated(model_dir: Path, *, per_prompt: int = 4, top_k: int = 0) -> list[Sample]:
    """Engine samples of three prompts of different lengths, `per_prompt` answers each, grouped."""
    prompt_of = [g for g in range(len(QUESTIONS)) for _ in range(per_prompt)]
    seeds = [7 * g + i for g in range(len(QUESTIONS)) for i in range(per_prompt)]
    return engine_samples(
        model_dir, QUESTIONS, prompt_of, seeds, SamplingParams(top_k=top_k, max_new_tokens=12)
    )


def actor(model_dir: Path, train_forward: str, padding_side: str = "right") -> Actor:
    return Actor(
        str(model_dir),
        dtype=torch.float32,
        device="cpu",
        optimizer=OptimizerConfig(micro_batch_size=6, global_batch_size=12),
        algorithm=AlgorithmConfig(),
        temperature=1.0,
        padding_side=padding_side,
        train_forward=train_forward,
    )


@pytest.fixture(scope="module")
def samples(tiny_model_dir: Path) -> list[Sample]:
    return generated(tiny_model_dir)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("top_k", [0, 20])
def test_packed_log_probs_and_entropies_match_the_padded_forward(
    tiny_model_dir: Path, padding_side: str, top_k: int
) -> None:
    batch = generated(tiny_model_dir, top_k=top_k)
    # micro-batches of 6 over groups of 4: a group is split across two micro-batches, and packed in both
    assert [len({tuple(s.prompt_ids) for s in batch[i : i + 6]}) for i in (0, 6)] == [2, 2]
    packed_actor = actor(tiny_model_dir, "shared-prefix", padding_side)
    assert packed_actor.shared_prefix
    packed = packed_actor.compute_log_probs(batch, with_entropy=True)
    padded = actor(tiny_model_dir, "padded", padding_side).compute_log_probs(batch, with_entropy=True)
    assert packed.entropy is not None and padded.entropy is not None
    for s, a, b, ea, eb in zip(batch, packed.log_probs, padded.log_probs, packed.entropy, padded.entropy):
        assert a.shape == b.shape == (len(s.response_ids),)
        torch.testing.assert_close(a, b, rtol=0, atol=TOLERANCE)
        torch.testing.assert_close(ea, eb, rtol=0, atol=TOLERANCE)
        torch.testing.assert_close(a, s.rollout_log_probs, rtol=0, atol=1e-4)  # and both match the engine


def _response_log_probs(model: torch.nn.Module, mb: MicroBatch, packed: bool, mask=None) -> torch.Tensor:
    """[B, L] float32 log-probs of `mb`'s tokens (0 off the responses), packed or padded."""
    B, L = mb.input_ids_BL.shape
    K = min(L, L - int(mb.response_mask_BL.float().argmax(dim=1).min()) + 1)  # as Actor._forward
    if packed:
        pk = pack_shared_prefix(mb, K, pad_id=0)
        assert pk is not None
        ids, attend, pos, keep = pk.inputs()
        attend = attend if mask is None else mask(attend)
        logits = pk.unpack(
            model(input_ids=ids, attention_mask=attend, position_ids=pos, logits_to_keep=keep).logits, B, K
        )
    else:
        logits = model(
            input_ids=mb.input_ids_BL,
            attention_mask=mb.attention_mask_BL,
            position_ids=mb.position_ids_BL,
            logits_to_keep=K,
        ).logits
    out = torch.zeros((B, L))
    out[:, L - K :] = algorithms.token_log_probs(logits, mb.input_ids_BL[:, L - K :], temperature=1.0)
    return out * mb.response_mask_BL


def test_packed_gradients_match_the_padded_forward(tiny_model_dir: Path, samples: list[Sample]) -> None:
    model = load_causal_lm(tiny_model_dir).train()
    mb = collate(samples, pad_id=0)
    grads = []
    for packed in (True, False):
        model.zero_grad()
        _response_log_probs(model, mb, packed).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        ref = grads[1][name]
        assert float((g - ref).norm()) <= 1e-5 * float(ref.norm()), name


def test_an_answer_sees_its_prompt_and_itself_only(tiny_model_dir: Path, samples: list[Sample]) -> None:
    model = load_causal_lm(tiny_model_dir)
    group = samples[:4]  # one prompt, four answers packed in one row, answer 0 first
    changed = [*group]
    first = group[0]
    other = [(t + 1) % 1024 for t in first.response_ids]  # answer 0 replaced, same length
    changed[0] = Sample(**{**first.__dict__, "response_ids": other})
    with torch.no_grad():
        before = _response_log_probs(model, collate(group, pad_id=0), True)
        after = _response_log_probs(model, collate(changed, pad_id=0), True)

        # the same change with every earlier token visible (a plain causal mask over the packed row)
        def causal(m: torch.Tensor) -> torch.Tensor:
            return torch.ones_like(m).tril_()

        leaky = _response_log_probs(model, collate(group, pad_id=0), True, causal)
    assert not torch.equal(before[0], after[0])
    torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=1e-6)  # answers 1-3 never see answer 0
    assert float((leaky[1:] - before[1:]).abs().max()) > 1e-3  # and the check would see a leaking mask


def test_packing_only_when_prompts_repeat(tiny_model_dir: Path, samples: list[Sample]) -> None:
    one_each = [samples[0], samples[4], samples[8]]
    mb = collate(one_each, pad_id=0)
    assert pack_shared_prefix(mb, mb.input_ids_BL.shape[1], pad_id=0) is None
    pk = pack_shared_prefix(collate(samples, pad_id=0), 40, pad_id=0)
    assert pk is not None and pk.input_ids_GT.shape[0] == 3  # one row per distinct prompt
    rows = [
        len(s.prompt_ids) + sum(len(t.response_ids) for t in samples[4 * g : 4 * g + 4])
        for g, s in enumerate(samples[::4])
    ]
    assert pk.input_ids_GT.shape[1] == max(rows)
    assert int(pk.position_ids_GT[0, len(samples[0].prompt_ids)]) == len(
        samples[0].prompt_ids
    )  # answers restart
    assert not actor(tiny_model_dir, "padded").shared_prefix and actor(tiny_model_dir, "auto").shared_prefix
    with pytest.raises(ValueError, match="misses a scored position"):
        pack_shared_prefix(collate(samples, pad_id=0), 2, pad_id=0)


def test_shared_prefix_for_an_unsupported_model_is_refused_before_the_run(
    tmp_path: Path, gpt2_model_dir: Path
) -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        check_train_forward("shared-prefix", str(gpt2_model_dir))
    check_train_forward("auto", str(gpt2_model_dir))  # auto falls back to the padded forward
    run_dir = tmp_path / "run"
    argv = ["train", "--hf-checkpoint", str(gpt2_model_dir), "--train-forward", "shared-prefix"]
    code, _, proc = cli_in_fresh_process([*argv, "--run-dir", str(run_dir)], cwd=tmp_path)
    assert code == 2 and "Traceback" not in proc.stderr
    assert (
        f"grpolab train: error: --train-forward shared-prefix: the packed forward does not run {gpt2_model_dir}: "
        "model_type 'gpt2'"
    ) in proc.stderr
    assert not run_dir.exists()
    code, _, bad = cli_in_fresh_process(["train", "--train-forward", "packed"], cwd=tmp_path)
    assert code == 2
    assert "--train-forward must be one of auto, shared-prefix, padded, got 'packed'" in bad.stderr


def _synthetic(prompt_len: int, answer_len: int, answers: int) -> list[Sample]:
    prompt = [5 + i % 50 for i in range(prompt_len)]
    return [
        Sample(
            index=i,
            prompt_index=0,
            group_index=0,
            sample_index=i,
            seed=i,
            prompt_ids=prompt,
            response_ids=[7 + (i + j) % 90 for j in range(answer_len)],
            rollout_log_probs=torch.zeros(answer_len),
            loss_mask=torch.ones(answer_len),
            finish_reason="length",
        )
        for i in range(answers)
    ]


def test_long_answers_to_a_short_prompt_stay_padded(tiny_model_dir: Path) -> None:
    cost = packing_cost(load_causal_lm(tiny_model_dir).config)
    # 2 (128·256 + 128·128 + 3·128·384) / (4·128) and 2·128·1024 / (4·128·4) for the tiny model
    assert (cost.token, cost.logit) == (768.0, 128.0)
    # 8 answers of 200 tokens to a 5-token prompt: one 1,605-token row against 8 padded rows of 205
    long = collate(_synthetic(5, 200, 8), pad_id=0)
    K = long.input_ids_BL.shape[1] - 5 + 1
    assert pack_shared_prefix(long, K, pad_id=0) is not None  # without a cost: whenever prompts repeat
    assert pack_shared_prefix(long, K, pad_id=0, cost=cost) is None
    # the default run's shape (37-token prompts, 8 answers of ~14) packs
    short = collate(_synthetic(37, 14, 8), pad_id=0)
    assert pack_shared_prefix(short, 15, pad_id=0, cost=cost) is not None
    # an empty prompt is left to the padded forward
    assert pack_shared_prefix(collate(_synthetic(0, 4, 4), pad_id=0), 5, pad_id=0) is None


def test_empty_answers_and_a_prompt_repeated_across_groups_match_the_padded_forward(
    tiny_model_dir: Path, samples: list[Sample]
) -> None:
    model = load_causal_lm(tiny_model_dir)
    empty = Sample(
        **{
            **samples[1].__dict__,
            "response_ids": [],
            "rollout_log_probs": torch.zeros(0),
            "loss_mask": torch.zeros(0),
        }
    )
    again = Sample(
        **{**samples[5].__dict__, "group_index": 7}
    )  # another group, the same prompt as samples[4]
    batch = [samples[0], empty, samples[2], samples[4], again, samples[8]]
    for side in ("right", "left"):
        mb = collate(batch, pad_id=0, padding_side=side)
        with torch.no_grad():
            packed, padded = _response_log_probs(model, mb, True), _response_log_probs(model, mb, False)
        torch.testing.assert_close(packed, padded, rtol=0, atol=TOLERANCE)


def test_an_attention_implementation_other_than_sdpa_is_refused_before_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    eager = tmp_path / "eager"
    shutil.copytree(tiny_model_dir, eager)
    config = json.loads((eager / "config.json").read_text())
    (eager / "config.json").write_text(json.dumps({**config, "attn_implementation": "eager"}))
    with pytest.raises(ValueError, match="attention implementation 'eager' in config.json"):
        check_train_forward("shared-prefix", str(eager))
    check_train_forward("auto", str(eager))  # auto: the padded forward, said at start
    packed = load_causal_lm(eager)
    assert (
        unsupported_reason(packed)
        == "attention implementation 'eager' (needs sdpa, which takes a 4D boolean mask)"
    )


def test_a_run_json_from_before_the_flag_reads_back_padded() -> None:
    old = Config().to_dict()
    del old["model"]["train_forward"]  # what run.json held before --train-forward
    assert Config.from_dict(old).model.train_forward == "padded"  # how those runs trained
    assert Config.from_dict(Config().to_dict()).model.train_forward == "auto"
    assert Config.from_dict({}).model.train_forward == "auto"  # no model section: the defaults
