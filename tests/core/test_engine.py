"""TorchEngine: seeded batched sampling, exact log-probs, top-k/top-p kept sets, weight sync, offload;
the engine seam: the factory, optional capabilities found through the client, the weights checker.

Uses a random tiny Qwen3 (V=300) saved to a temp dir, so it runs without the trained fixture.
Batch invariance: tokens are compared exactly; log-probs across different batch compositions are
compared with atol 1e-5 (padding and batch size change float rounding, not the sampled tokens).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers

from grpolab.checkers.errors import CheckFailure
from grpolab.checkers.harness import CheckHarness
from grpolab.core.algorithms import token_log_probs
from grpolab.core.batch import Sample, collate
from grpolab.core.config import Config
from grpolab.core.engine.base import (
    ChecksWeights,
    GenerationRequest,
    ReportsStats,
    SamplingParams,
    Stoppable,
    capability,
)
from grpolab.core.engine.client import EngineClient
from grpolab.core.engine.factory import ENGINES, build_engine
from grpolab.core.engine.sampling import filtered_log_probs, kept_ids, top_p_kept_count
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.core.modeling import load_causal_lm
from grpolab.rundir.writer import RunDirectory

V = 300


def _tiny_config() -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    )


def _save_random_model(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(_tiny_config())
    with torch.no_grad():  # sharper than the default init, so top-p sets are not the whole vocab
        model.model.embed_tokens.weight.mul_(4.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_random_model(tmp_path_factory.mktemp("tiny-a"), seed=0)


@pytest.fixture(scope="module")
def ckpt_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_random_model(tmp_path_factory.mktemp("tiny-b"), seed=1)


@pytest.fixture(scope="module")
def engine(ckpt: Path) -> TorchEngine:
    return TorchEngine(ckpt, show_progress=False)


@pytest.fixture(scope="module")
def ref_model(ckpt: Path) -> torch.nn.Module:
    return load_causal_lm(ckpt)


def _requests(n: int, seed0: int = 100) -> list[GenerationRequest]:
    rng = random.Random(seed0)
    return [
        GenerationRequest(prompt_ids=[rng.randrange(1, V) for _ in range(rng.randint(2, 9))], seed=seed0 + i)
        for i in range(n)
    ]


def _full_forward_logits(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """[R, V] float32 logits predicting each response token: one forward, no cache, no padding."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(response) - 1]


def _assert_same(a, b, *, exact: bool) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.response_ids == y.response_ids
        assert x.finish_reason == y.finish_reason
        if exact:
            assert torch.equal(x.log_probs, y.log_probs)
        else:
            torch.testing.assert_close(x.log_probs, y.log_probs, atol=1e-5, rtol=0)


def test_same_seeds_reproduce_exactly(engine: TorchEngine) -> None:
    reqs, params = _requests(6), SamplingParams(temperature=1.0, max_new_tokens=16)
    a, b = engine.generate(reqs, params), engine.generate(reqs, params)
    _assert_same(a, b, exact=True)
    assert all(r.log_probs.dtype == torch.float32 and r.log_probs.shape == (16,) for r in a)
    assert len({tuple(r.response_ids) for r in a}) == 6  # different seeds, different samples
    assert engine.last_stats["tokens"] == 6 * 16 and engine.last_stats["tokens_per_s"] > 0


def test_output_independent_of_batch_composition_and_order(engine: TorchEngine) -> None:
    reqs = _requests(8)
    params = SamplingParams(temperature=0.9, max_new_tokens=12, stop_token_ids=tuple(range(1, V, 23)))
    base = engine.generate(reqs, params)
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    extra = _requests(5, seed0=900)
    mixed = engine.generate(extra[:2] + [reqs[i] for i in order] + extra[2:], params)[2:10]
    _assert_same([base[i] for i in order], mixed, exact=False)
    alone = [engine.generate([r], params)[0] for r in reqs]
    _assert_same(base, alone, exact=False)
    engine.max_batch_size = 3  # chunked: different batch sizes again
    try:
        _assert_same(base, engine.generate(reqs, params), exact=False)
    finally:
        engine.max_batch_size = 256


def test_log_probs_match_full_forward(engine: TorchEngine, ref_model: torch.nn.Module) -> None:
    reqs = _requests(5)
    results = engine.generate(reqs, SamplingParams(temperature=0.7, max_new_tokens=20))
    for req, res in zip(reqs, results):
        logits = _full_forward_logits(ref_model, req.prompt_ids, res.response_ids)
        expected = torch.log_softmax(logits / 0.7, dim=-1).gather(1, torch.tensor(res.response_ids)[:, None])
        torch.testing.assert_close(res.log_probs, expected.squeeze(1), atol=1e-5, rtol=0)
        assert res.kept_token_ids is None


def test_top_k_kept_sets(engine: TorchEngine, ref_model: torch.nn.Module) -> None:
    reqs = _requests(4)
    results = engine.generate(reqs, SamplingParams(temperature=0.8, top_k=5, max_new_tokens=10))
    for req, res in zip(reqs, results):
        assert res.kept_token_ids is not None and len(res.kept_token_ids) == len(res.response_ids)
        scaled = _full_forward_logits(ref_model, req.prompt_ids, res.response_ids) / 0.8
        for t, (tok, kept) in enumerate(zip(res.response_ids, res.kept_token_ids)):
            assert kept.dtype == torch.int64 and kept.numel() == 5
            assert torch.equal(kept, kept.sort().values) and tok in kept.tolist()
            assert set(kept.tolist()) == set(scaled[t].topk(5).indices.tolist())
            expected = torch.log_softmax(scaled[t][kept], dim=-1)[kept.tolist().index(tok)]
            assert abs(res.log_probs[t].item() - expected.item()) < 1e-5


def test_top_p_kept_sets_are_minimal(engine: TorchEngine, ref_model: torch.nn.Module) -> None:
    reqs = _requests(4)
    results = engine.generate(reqs, SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=10))
    sizes = []
    for req, res in zip(reqs, results):
        assert res.kept_token_ids is not None
        probs = torch.softmax(_full_forward_logits(ref_model, req.prompt_ids, res.response_ids), dim=-1)
        for t, (tok, kept) in enumerate(zip(res.response_ids, res.kept_token_ids)):
            p_kept = probs[t][kept]
            mass = p_kept.sum().item()
            assert tok in kept.tolist()
            assert mass >= 0.5 - 1e-6
            assert mass - p_kept.min().item() < 0.5  # dropping the least likely kept token falls short
            outside = torch.ones(V, dtype=torch.bool)
            outside[kept] = False
            if outside.any():
                assert p_kept.min() >= probs[t][outside].max()  # the kept set is the most likely tokens
            expected = (probs[t][tok] / mass).log().item()
            assert abs(res.log_probs[t].item() - expected) < 1e-5
            sizes.append(kept.numel())
    assert max(sizes) > 1  # the rule was exercised beyond the always-kept top token


def test_top_k_and_top_p_keep_the_intersection(engine: TorchEngine, ref_model: torch.nn.Module) -> None:
    """SGLang's joint rule: top-p mass is measured on the full distribution, then capped at top-k."""
    reqs = _requests(3)
    results = engine.generate(reqs, SamplingParams(temperature=1.0, top_k=3, top_p=0.8, max_new_tokens=8))
    for req, res in zip(reqs, results):
        assert res.kept_token_ids is not None
        probs = torch.softmax(_full_forward_logits(ref_model, req.prompt_ids, res.response_ids), dim=-1)
        for t, kept in enumerate(res.kept_token_ids):
            sorted_p = probs[t].sort(descending=True).values
            n_top_p = int(top_p_kept_count(sorted_p[None], 0.8))
            assert kept.numel() == min(3, n_top_p)
            assert set(kept.tolist()) == set(probs[t].topk(kept.numel()).indices.tolist())


def _kept(logits: list[float], **params: float) -> list[int]:
    """The engine's kept ids for one next-token row of `logits` (float32)."""
    logp_AV, n_A, order_AV = filtered_log_probs(torch.tensor([logits]), SamplingParams(**params))
    assert n_A is not None and order_AV is not None
    n, ids = kept_ids(n_A, order_AV, len(logits))
    kept = ids[0, : int(n[0])].tolist()
    assert torch.isfinite(logp_AV[0]).nonzero().flatten().tolist() == kept  # -inf exactly outside the set
    return kept


def test_top_p_exact_boundary_is_reached() -> None:
    """[0.5, 0.3, 0.1, 0.1] with top_p 0.8: 0.5 + 0.3 is 0.8 in float32, so exactly {0, 1} are kept."""
    probs = torch.tensor([0.5, 0.3, 0.1, 0.1])
    logits = probs.log()
    assert torch.softmax(logits, -1)[:2].sum() == torch.tensor(0.8)  # the boundary is exact in float32
    p = torch.softmax(logits, -1)
    assert int(((p.cumsum(0) - p) < 0.8).sum()) == 3  # the old `cumsum - p` rounded under 0.8: 3 kept
    assert _kept(logits.tolist(), top_p=0.8) == [0, 1]
    assert _kept(logits[[3, 1, 2, 0]].tolist(), top_p=0.8) == [1, 3]  # same set wherever the ids sit
    logp_AV, _, _ = filtered_log_probs(logits[None], SamplingParams(top_p=0.8))
    torch.testing.assert_close(logp_AV[0, :2], torch.tensor([0.5 / 0.8, 0.3 / 0.8]).log(), atol=0, rtol=1e-6)
    assert _kept(logits.tolist(), top_p=0.81) == [0, 1, 2]  # past the boundary: the third token is needed
    assert _kept(logits.tolist(), top_p=0.5) == [0]  # the top token alone reaches 0.5 exactly
    assert _kept(logits.tolist(), top_p=0.9) == [0, 1, 2]  # 0.5 + 0.3 + 0.1 reaches 0.9 in float32


def test_top_p_boundaries_on_exact_quarters() -> None:
    """Four tied tokens of 0.25 (exact in binary): a prefix sum equal to top_p ends the kept set; ties
    are ordered by ascending id (stable sort), so the lowest ids are kept."""
    quarters = [0.0, 0.0, 0.0, 0.0]
    assert _kept(quarters, top_p=0.25) == [0]
    assert _kept(quarters, top_p=0.5) == [0, 1]
    assert _kept(quarters, top_p=0.75) == [0, 1, 2]
    assert _kept(quarters, top_p=0.5001) == [0, 1, 2]
    assert _kept(quarters, top_p=1.0, top_k=4) == [0, 1, 2, 3]
    counts = top_p_kept_count(torch.full((1, 4), 0.25), 0.4999)
    assert counts.tolist() == [2]


def test_top_k_ties_keep_exactly_k_lowest_ids() -> None:
    """Tokens tied at the k-th value: exactly k are kept, the lower ids first (SGLang keeps k; transformers'
    TopKLogitsWarper would keep all three tied tokens here)."""
    logits = [1.0, 3.0, 2.0, 2.0, 2.0, 0.5]
    assert _kept(logits, top_k=2) == [1, 2]
    assert _kept(logits, top_k=3) == [1, 2, 3]
    assert _kept(logits, top_k=4) == [1, 2, 3, 4]
    assert _kept([0.0] * 6, top_k=3) == [0, 1, 2]
    assert _kept(logits, top_k=3, top_p=0.5) == [1, 2]  # intersection with top-p, still the lower tied id


def test_trainer_scores_over_the_engines_boundary_set() -> None:
    """The trainer does not re-derive the kept set: collate's keep mask from the engine's kept ids gives
    the same log-prob as the engine at the exact top-p boundary (log 0.3/0.8, not log 0.3/0.9)."""
    V4 = 4
    logits = torch.tensor([0.5, 0.3, 0.1, 0.1]).log()
    params = SamplingParams(top_p=0.8)
    logp_AV, n_A, order_AV = filtered_log_probs(logits[None], params)
    assert n_A is not None and order_AV is not None
    n, ids = kept_ids(n_A, order_AV, V4)
    kept = ids[0, : int(n[0])]
    sample = Sample(
        index=0,
        prompt_index=0,
        group_index=0,
        sample_index=0,
        seed=0,
        prompt_ids=[2],
        response_ids=[1],
        rollout_log_probs=logp_AV[0, 1:2],
        loss_mask=torch.ones(1),
        finish_reason="length",
        kept_token_ids=[kept],
    )
    batch = collate([sample], pad_id=3, vocab_size=V4)
    trainer = token_log_probs(
        logits.expand(1, 2, V4), batch.input_ids_BL, temperature=1.0, keep_mask_BLV=batch.keep_mask_BLV
    )
    assert batch.keep_mask_BLV is not None and batch.keep_mask_BLV[0, 1].tolist() == [
        True,
        True,
        False,
        False,
    ]
    assert trainer[0, 1].item() == pytest.approx(float(torch.tensor(0.3 / 0.8).log()), abs=1e-6)
    assert trainer[0, 1].item() == pytest.approx(logp_AV[0, 1].item(), abs=1e-6)


def test_finish_reasons(engine: TorchEngine) -> None:
    stop = tuple(range(0, V, 12))
    reqs = _requests(16)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=stop)
    results = engine.generate(reqs, params)
    reasons = {r.finish_reason for r in results}
    assert reasons == {"stop", "length"}
    for res in results:
        ids = res.response_ids
        assert len(ids) == res.log_probs.numel()
        if res.finish_reason == "length":
            assert len(ids) == 12 and not set(ids) & set(stop)
        else:
            assert ids[-1] in stop and not set(ids[:-1]) & set(stop) and len(ids) <= 12
    alone = [engine.generate([r], params)[0] for r in reqs]  # early-finish compaction kept rows intact
    _assert_same(results, alone, exact=False)


def test_update_weights(ckpt: Path, ckpt_b: Path) -> None:
    eng = TorchEngine(ckpt, show_progress=False)
    trainer_model = load_causal_lm(ckpt_b)
    assert eng.model is not trainer_model
    ids = torch.tensor([[5, 17, 42, 99, 3]])

    def logits(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids).logits

    assert not torch.allclose(logits(eng.model), logits(trainer_model))
    state = trainer_model.state_dict()
    items = list(state.items())
    assert eng.update_weights(items[: len(items) // 2], weight_version=1) == 1
    assert eng.update_weights(items[len(items) // 2 :], weight_version=2) == 2
    torch.testing.assert_close(logits(eng.model), logits(trainer_model), atol=0, rtol=0)
    assert eng.health().weight_version == 2
    assert eng.generate(_requests(1), SamplingParams(max_new_tokens=2))[0].weight_version == 2
    # the copy is real: changing the trainer's weights afterwards does not reach the engine
    with torch.no_grad():
        trainer_model.model.norm.weight.add_(1.0)
    assert not torch.equal(eng.model.model.norm.weight, trainer_model.model.norm.weight)

    # tied embeddings: either name updates both
    new_emb = torch.randn(V, 64)
    eng.update_weights([("lm_head.weight", new_emb.to(torch.bfloat16))], weight_version=3)
    assert torch.equal(eng.model.model.embed_tokens.weight, new_emb.to(torch.bfloat16).float())
    eng.update_weights([("model.embed_tokens.weight", new_emb)], weight_version=4)
    assert torch.equal(eng.model.lm_head.weight, new_emb)

    before = eng.model.model.norm.weight.clone()
    good = ("model.norm.weight", torch.zeros(64))
    with pytest.raises(KeyError, match="model.not_a_weight"):
        eng.update_weights([good, ("model.not_a_weight", torch.zeros(3))], weight_version=5)
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(65,\)"):
        eng.update_weights([("model.norm.weight", torch.zeros(65))], weight_version=5)
    assert torch.equal(eng.model.model.norm.weight, before)  # a bad bucket copies nothing
    assert eng.health().weight_version == 4


def test_release_and_resume(ckpt: Path) -> None:
    eng = TorchEngine(ckpt, show_progress=False)
    reqs, params = _requests(4), SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=8)
    before = eng.generate(reqs, params)
    eng.flush_cache()
    eng.release_memory()
    health = eng.health()
    assert health.ok and health.memory_released
    with pytest.raises(RuntimeError, match="resume_memory"):
        eng.generate(reqs, params)
    eng.resume_memory()
    assert not eng.health().memory_released
    after = eng.generate(reqs, params)
    _assert_same(before, after, exact=True)
    for x, y in zip(before, after):
        assert x.kept_token_ids is not None and y.kept_token_ids is not None
        assert all(torch.equal(a, b) for a, b in zip(x.kept_token_ids, y.kept_token_ids))


def test_edge_cases(engine: TorchEngine) -> None:
    assert engine.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([GenerationRequest(prompt_ids=[], seed=0)], SamplingParams())
    with pytest.raises(ValueError, match="max_batch_size"):
        TorchEngine("unused", max_batch_size=0)
    res = engine.generate(_requests(2), SamplingParams(top_k=1, max_new_tokens=5))
    assert all(torch.equal(r.log_probs, torch.zeros(5)) for r in res)  # greedy: log-prob 0 exactly


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine(ckpt: Path, ref_model: torch.nn.Module) -> None:
    eng = TorchEngine(ckpt, device="cuda", show_progress=False)
    reqs, params = _requests(6), SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16)
    a = eng.generate(reqs, params)
    _assert_same(a, eng.generate(reqs, params), exact=True)
    _assert_same(a, [eng.generate([r], params)[0] for r in reqs], exact=False)
    for req, res in zip(reqs, a):
        assert res.kept_token_ids is not None
        scaled = _full_forward_logits(ref_model, req.prompt_ids, res.response_ids) / 0.7
        for t, (tok, kept) in enumerate(zip(res.response_ids, res.kept_token_ids)):
            expected = torch.log_softmax(scaled[t][kept.cpu()], dim=-1)[kept.tolist().index(tok)]
            assert abs(res.log_probs[t].item() - expected.item()) < 1e-4
    eng.release_memory()
    assert next(eng.model.parameters()).device.type == "cpu"
    eng.resume_memory()
    _assert_same(a, eng.generate(reqs, params), exact=True)


# ---------------------------------------------------------------------- the engine seam
def _config(ckpt: Path, **ci: object) -> Config:
    config = Config()
    config.model.hf_checkpoint = str(ckpt)
    config.run.show_progress = False
    config.rollout.engine_failure_timeout = 7.0
    for name, value in ci.items():
        setattr(config.ci, name, value)
    return config


def test_factory_builds_the_kind_behind_a_client(ckpt: Path) -> None:
    engine = build_engine(_config(ckpt))
    assert isinstance(engine, EngineClient) and engine.failure_timeout == 7.0
    assert isinstance(engine.wrapped, TorchEngine) and engine.name == f"torch engine ({ckpt.name}, cpu)"
    assert ENGINES.names() == ["sglang", "torch"]
    config = _config(ckpt)
    config.rollout.rollout_engine = "http"
    with pytest.raises(
        ValueError, match=r"unknown rollout engine kind 'http' \(--rollout-engine\); valid: sglang, torch"
    ):
        build_engine(config)


def test_capabilities_are_found_through_the_client(engine: TorchEngine) -> None:
    client = EngineClient(engine, failure_timeout=1.0)
    for kind in (ChecksWeights, ReportsStats, Stoppable):
        assert capability(client, kind) is engine and capability(engine, kind) is engine
    assert capability(EngineClient(client, failure_timeout=1.0), ReportsStats) is engine  # any depth
    bare = EngineClient(object(), failure_timeout=1.0)  # an engine with the protocol only
    assert capability(bare, ChecksWeights) is None and capability(None, Stoppable) is None


def test_weight_update_checker_runs_through_the_client(tmp_path: Path, ckpt: Path) -> None:
    config = _config(ckpt, ci_test=True)
    harness = CheckHarness(config, RunDirectory(tmp_path))
    client = build_engine(config)
    trainer = list(load_causal_lm(ckpt).state_dict().items())  # the engine's start weights, another copy
    harness.first_sync(client, lambda: client.update_weights(trainer, weight_version=1), resumed=False)
    with pytest.raises(CheckFailure, match=r"model.norm.weight: shape \(64,\)"):  # the sync misses one tensor
        partial = [(n, t) for n, t in trainer if n != "model.norm.weight"]
        harness.first_sync(client, lambda: client.update_weights(partial, weight_version=2), resumed=False)
    with pytest.raises(ValueError, match="--ci-disable-weight-update-checker"):
        harness.first_sync(EngineClient(object(), failure_timeout=1.0), lambda: None, resumed=False)
    verdicts = [e for e in _events(tmp_path) if e["event"] == "check"]
    assert [(v["checker"], v["ok"]) for v in verdicts] == [("weight_update", True), ("weight_update", False)]


def _events(run: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_weights_of_another_model_are_a_clear_error_naming_the_checkpoint(tmp_path, tiny_model_dir) -> None:
    """A model.safetensors of another model beside config.json: transformers' RuntimeError (and, in a
    server, a NotImplementedError on meta tensors) reached the user as a traceback, exit 1."""
    import shutil

    from grpolab.core.modeling import load_causal_lm

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_model_dir, mixed)
    shutil.copy(tmp_path / "llama" / "model.safetensors", mixed / "model.safetensors")
    with pytest.raises(
        ValueError, match=rf"--hf-checkpoint {mixed}: transformers could not load its weights"
    ):
        load_causal_lm(mixed)
