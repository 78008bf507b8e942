"""grpolab's own decode path (core/engine/decoder.py) against transformers' forward, the reference.

Random tiny Llama (with biases), Qwen2 (q/k/v bias) and Qwen3 (q/k norms) models, float32 on CPU:
logits at every prompt and decode position agree with one transformers forward over the whole
sequence within atol 1e-4 (fused and prepacked matmuls round differently; measured max ~2e-6 on
these models); the engine's sampled tokens are identical on both paths and its log-probs agree
within 1e-5, also with top-k/top-p kept sets, shared prompts, finished rows dropped mid-decode and
weight updates between calls.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers
from runs import cli_in_fresh_process

from grpolab.core.engine.base import GenerationRequest, SamplingParams
from grpolab.core.engine.decode_support import check_decode_path, unsupported_config_reason
from grpolab.core.engine.decoder import Decoder, unsupported_reason
from grpolab.core.engine.model_runner import DecoderRunner, TransformersRunner
from grpolab.core.engine.torch_engine import TorchEngine

V = 256
_COMMON = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _model(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **_COMMON))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(tie_word_embeddings=False, **_COMMON))
    else:
        cfg = transformers.LlamaConfig(attention_bias=True, mlp_bias=True, rope_theta=500.0, **_COMMON)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper than the default init: peaked distributions, real top-p sets
        model.model.embed_tokens.weight.mul_(4.0)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif name.endswith("norm.weight"):  # not all ones: a norm weight read wrongly must show
                p.normal_(1.0, 0.2)
    return model.eval().requires_grad_(False)


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, V) for _ in range(rng.randint(2, 11))] for _ in range(n)]


def _left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama"])
def test_logits_match_one_transformers_forward(kind: str) -> None:
    model = _model(kind)
    assert unsupported_reason(model) is None
    prompts, steps = _prompts(5), 6
    ids, mask = _left_padded(prompts)
    rng = random.Random(7)
    new = [[rng.randrange(1, V) for _ in range(steps)] for _ in prompts]
    with torch.inference_mode():
        runner = DecoderRunner(Decoder(model))
        got = [runner.prefill(ids, mask, ids.shape[1] + steps)]
        for t in range(steps - 1):
            got.append(runner.step(torch.tensor([row[t] for row in new])))
        for b, (prompt, tail) in enumerate(zip(prompts, new)):
            full = model(input_ids=torch.tensor([prompt + tail])).logits[0]
            want = full[len(prompt) - 1 : len(prompt) - 1 + steps]
            torch.testing.assert_close(torch.stack([g[b] for g in got]), want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = []
    for seed in (0, 1):
        path = tmp_path_factory.mktemp(f"qwen3-{seed}")
        _model("qwen3", seed).save_pretrained(path)
        out.append(path)
    return out[0], out[1]


def _same(a: list, b: list) -> None:
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.finish_reason for r in a] == [r.finish_reason for r in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(x.log_probs, y.log_probs, atol=1e-5, rtol=0)
        if x.kept_token_ids is not None:
            assert all(torch.equal(p, q) for p, q in zip(x.kept_token_ids, y.kept_token_ids, strict=True))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=14, stop_token_ids=tuple(range(1, V, 17))),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=10),
    ],
    ids=["stops", "top-p-top-k"],
)
def test_engine_paths_sample_the_same_tokens(ckpts: tuple[Path, Path], params: SamplingParams) -> None:
    ours = TorchEngine(ckpts[0], show_progress=False, decode_path="grpolab")
    theirs = TorchEngine(ckpts[0], show_progress=False, decode_path="transformers")
    prompts = _prompts(6)
    # groups of samples of one prompt, as a GRPO rollout sends them (their prefill is shared)
    reqs = [GenerationRequest(prompt_ids=p, seed=100 + i) for i, p in enumerate(prompts * 3)]
    a, b = ours.generate(reqs, params), theirs.generate(reqs, params)
    _same(a, b)
    assert {r.finish_reason for r in a} == ({"stop", "length"} if params.stop_token_ids else {"length"})
    alone = [ours.generate([r], params)[0] for r in reqs[:6]]  # no sharing, batch of one
    _same(a[:6], alone)


def test_weight_updates_reach_the_decoder(ckpts: tuple[Path, Path]) -> None:
    eng = TorchEngine(ckpts[0], show_progress=False, decode_path="grpolab")
    want = TorchEngine(ckpts[1], show_progress=False, decode_path="transformers")
    reqs = [GenerationRequest(prompt_ids=p, seed=i) for i, p in enumerate(_prompts(4))]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    before = eng.generate(reqs, params)
    decoder = eng._decoder
    assert decoder is not None and not decoder.refresh()  # nothing changed since the last call
    eng.update_weights(list(want.model.state_dict().items()), weight_version=1)
    assert decoder.refresh()  # the in-place copies were seen
    after = eng.generate(reqs, params)
    _same(after, want.generate(reqs, params))
    assert [r.response_ids for r in after] != [r.response_ids for r in before]
    eng.release_memory()
    eng.resume_memory()
    _same(eng.generate(reqs, params), after)


@pytest.mark.parametrize("norm", ["q_norm", "k_norm"])
def test_a_write_to_one_qk_norm_reaches_the_decoder(norm: str) -> None:
    """The decoder keeps q_norm and k_norm merged per head ([Hq + Hk, D]); a write to one of them alone
    (in place, as a weight sync does) must be seen at the next prefill."""
    model = _model("qwen3")
    ids, mask = _left_padded(_prompts(3))
    runner = DecoderRunner(Decoder(model))
    with torch.inference_mode():
        before = runner.prefill(ids, mask, ids.shape[1] + 1)
    with torch.no_grad():
        getattr(model.model.layers[1].self_attn, norm).weight.mul_(1.5)
    with torch.inference_mode():
        after = runner.prefill(ids, mask, ids.shape[1] + 1)
        want = TransformersRunner(model).prefill(ids, mask, ids.shape[1] + 1)
    assert not torch.allclose(after, before, atol=1e-3)
    torch.testing.assert_close(after, want, atol=1e-4, rtol=0)


def test_bfloat16_runs_close_to_transformers(ckpts: tuple[Path, Path]) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpts[0], dtype=torch.bfloat16)
    ids, mask = _left_padded(_prompts(4))
    with torch.inference_mode():
        ours = DecoderRunner(Decoder(model)).prefill(ids, mask, ids.shape[1] + 1)
        theirs = TransformersRunner(model).prefill(ids, mask, ids.shape[1] + 1)
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), atol=0.25, rtol=0.02)


def test_unsupported_models_decode_with_transformers(tmp_path: Path) -> None:
    # bos/eos inside the vocabulary (GPT-2's default 50256 is refused by the model check)
    cfg = transformers.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=2
    )
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    assert "model_type 'gpt2'" in str(unsupported_reason(transformers.GPT2LMHeadModel(cfg)))
    eng = TorchEngine(tmp_path, show_progress=False)
    assert eng._decoder is None and "decoding with transformers' forward" in eng.log_tail(1)[0]
    out = eng.generate([GenerationRequest(prompt_ids=[1, 2, 3], seed=0)], SamplingParams(max_new_tokens=3))
    assert len(out[0].response_ids) == 3
    with pytest.raises(ValueError, match="grpolab's decoder does not run this model: model_type 'gpt2'"):
        TorchEngine(tmp_path, show_progress=False, decode_path="grpolab")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window layers"),
        ({"use_sliding_window": True, "sliding_window": 64}, "sliding-window attention"),
        ({"pretraining_tp": 2}, "pretraining_tp 2"),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
            "rope_type 'dynamic'",
        ),
        ({"rope_parameters": None, "rope_scaling": {"type": "longrope"}}, "rope_type 'longrope'"),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 1e4,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            },
            None,
        ),
    ],
)
def test_config_rules_match_the_loaded_model(change: dict, reason: str | None) -> None:
    """The torch-free check (preflight, serve) and the loaded model's check give the same answer."""
    config = _model("qwen3").config.to_dict() | change
    got = unsupported_config_reason(config)
    assert (got is None) if reason is None else (reason in str(got))
    if "model_type" not in change and "rope_scaling" not in change:  # the same config as a loaded model
        assert unsupported_reason(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config))) == got


def test_grpolab_path_for_an_unsupported_model_is_refused_before_the_run(
    tmp_path: Path, gpt2_model_dir: Path
) -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        check_decode_path("grpolab", str(gpt2_model_dir), "--rollout-decode-path")
    check_decode_path("auto", str(gpt2_model_dir), "--rollout-decode-path")  # auto falls back: no error
    run_dir = tmp_path / "run"
    argv = ["train", "--hf-checkpoint", str(gpt2_model_dir), "--rollout-decode-path", "grpolab"]
    code, _, proc = cli_in_fresh_process([*argv, "--run-dir", str(run_dir)], cwd=tmp_path)
    assert code == 2 and "Traceback" not in proc.stderr
    assert (
        "grpolab train: error: --rollout-decode-path grpolab: grpolab's decoder does not run "
        f"{gpt2_model_dir}: model_type 'gpt2' (the decoder implements llama, qwen2, qwen3)"
    ) in proc.stderr
    assert not run_dir.exists()
