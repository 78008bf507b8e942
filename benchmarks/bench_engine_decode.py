"""Decode throughput: grpolab's TorchEngine vs transformers `model.generate(do_sample=True)`.

What it measures: generated tokens per second (prefill included, as a rollout sees it) for the
same model (fixtures/tiny-qwen3, float32, CPU) and the same batch: the first 64 prompts of the
arithmetic set with the chat template applied, 32 new tokens each, sampled at temperature 1.0
over the full vocabulary (top_p 1, top_k 0). Stop tokens are disabled for both, so each side
generates exactly 64 × 32 tokens (checked). Baseline: `generate` on its own copy of the same
weights, left-padded, with `use_cache=True`. Repetitions alternate engine / generate after one
warm-up call each; figures are medians. Both use the same torch thread count (default 1, robust
on a shared machine; `--threads 2` for torch's default on these 2-core machines).

With `--stop-at-eos` both stop at the model's eos instead and the actual generated tokens are
counted on each side (the engine compacts finished rows; `generate` keeps padding them).

Goal: engine tokens/s ≥ 1.5 × generate's.

Run:  python benchmarks/bench_engine_decode.py [--reps 7] [--threads N] [--stop-at-eos]
About 1 minute on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ARITHMETIC, TINY_MODEL, machine, median  # noqa: E402

from grpolab.core.data import PromptDataset  # noqa: E402
from grpolab.core.engine.base import GenerationRequest, SamplingParams  # noqa: E402
from grpolab.core.engine.torch_engine import TorchEngine  # noqa: E402
from grpolab.core.modeling import load_causal_lm, load_tokenizer  # noqa: E402

BATCH, NEW_TOKENS = 64, 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per side (alternating)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (default 1: robust on a shared machine; "
        f"{torch.get_num_threads()} = torch's default here)",
    )
    ap.add_argument("--stop-at-eos", action="store_true", help="stop at eos and count actual tokens")
    opts = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)

    tok = load_tokenizer(TINY_MODEL)
    ds = PromptDataset(ARITHMETIC, tok, input_key="question", label_key="answer", apply_chat_template=True)
    prompts = [ds[i].prompt_ids for i in range(BATCH)]
    eos = int(tok.eos_token_id)
    stops = (eos,) if opts.stop_at_eos else ()

    engine = TorchEngine(TINY_MODEL, show_progress=False)
    params = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=NEW_TOKENS, stop_token_ids=stops
    )
    model = load_causal_lm(TINY_MODEL)  # transformers' own copy of the same weights
    pad = engine.pad_token_id
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    gen_cfg = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=0 if opts.stop_at_eos else NEW_TOKENS,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
    )

    def run_engine(seed: int) -> int:
        reqs = [GenerationRequest(prompt_ids=p, seed=seed * 1000 + i) for i, p in enumerate(prompts)]
        out = engine.generate(reqs, params)
        return sum(len(r.response_ids) for r in out)

    def run_hf(seed: int) -> int:
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)
        new = out[:, L:]
        if not opts.stop_at_eos:
            return new.numel()
        n = 0
        for row in new.tolist():  # tokens up to and including the first eos
            n += row.index(eos) + 1 if eos in row else len(row)
        return n

    load0 = os.getloadavg()[0]
    run_engine(0), run_hf(0)  # warm-up
    tps = {"engine": [], "generate": []}
    toks = {"engine": [], "generate": []}
    for rep in range(opts.reps):
        order = ("engine", "generate") if rep % 2 == 0 else ("generate", "engine")
        for who in order:
            t0 = time.perf_counter()
            n = run_engine(rep + 1) if who == "engine" else run_hf(rep + 1)
            dt = time.perf_counter() - t0
            tps[who].append(n / dt)
            toks[who].append(n)
    if not opts.stop_at_eos:
        assert set(toks["engine"]) == {BATCH * NEW_TOKENS} == set(toks["generate"]), toks

    e, g = median(tps["engine"]), median(tps["generate"])
    print(f"ratio engine/generate tokens/s: {e / g:.3f}x   (goal >= 1.5x)")
    print()
    mode = "stop at eos, actual tokens counted" if opts.stop_at_eos else "no eos stop, exactly 32 tokens"
    print(f"context: {machine()}, torch threads {opts.threads}, load avg at start {load0:.2f}")
    print(f"  batch {BATCH} prompts (padded len {L}), {NEW_TOKENS} new tokens, {mode}, {opts.reps} reps")
    print(
        f"  engine   median {e:8.0f} tok/s  (min {min(tps['engine']):.0f}, max {max(tps['engine']):.0f}),"
        f" median tokens {median(toks['engine']):.0f}"
    )
    print(
        f"  generate median {g:8.0f} tok/s  (min {min(tps['generate']):.0f}, max {max(tps['generate']):.0f}),"
        f" median tokens {median(toks['generate']):.0f}"
    )


if __name__ == "__main__":
    main()
