"""The engine's decoder against the same decoder at another commit, alternated in one process.

What it measures: this tree's `core/engine/decoder.py` (A) against the file at `--against REV` (B,
read with `git show REV:core/engine/decoder.py`), each wrapped by a `TorchEngine` on the same model
(`--model tiny`: fixtures/tiny-qwen3, the first 64 prompts of the arithmetic set with the chat
template, 32 new tokens, no eos stop; `--model smollm2`: the first 8 prompts), calls alternating
A, B, A, B ... `--reps` times after a warm-up each. Printed: the median seconds of a whole engine call,
of the prefill alone (the decoders' `prefill` on the batch, left-padded) and of one decode step (64 or
8 rows, the cache filled to the prompt length + 16), each as the ratio A / B; and whether both sample
the same tokens with the same log-probs (bitwise).

Why: on this project's shared 2-core machine the speed of two runs of a benchmark minutes apart varied
by up to 40 % (benchmarks/README.md), so a change worth a few per cent can only be seen with both
versions alternating in one process. Baseline: the decoder at `--against` (default HEAD).

Run:  python benchmarks/bench_decoder_ab.py [--against REV] [--model tiny|smollm2] [--reps 15]
About 1 minute (tiny). The rest of the engine (sampling, the runner) is this tree's on both sides.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DECODE_BATCH as BATCH  # noqa: E402
from _common import REPO, arithmetic_prompts, decode_checkpoint, machine, median  # noqa: E402

from grpolab.core.engine import model_runner  # noqa: E402
from grpolab.core.engine.base import GenerationRequest, SamplingParams  # noqa: E402
from grpolab.core.engine.torch_engine import TorchEngine  # noqa: E402


def decoder_at(rev: str, folder: Path) -> type:
    """The `Decoder` class of core/engine/decoder.py at git revision `rev` (exits when git cannot show it)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:core/engine/decoder.py"], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"--against {rev}: git cannot show core/engine/decoder.py there: {done.stderr.strip()}")
    path = folder / "decoder_baseline.py"
    path.write_text(done.stdout)
    spec = importlib.util.spec_from_file_location("decoder_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["decoder_baseline"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Decoder


def engine_with(decoder_cls: type, checkpoint: str) -> TorchEngine:
    """A TorchEngine whose decoder is an instance of `decoder_cls` (built at its first call)."""
    model_runner.Decoder = decoder_cls
    return TorchEngine(checkpoint, show_progress=False, decode_path="grpolab")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", default="HEAD", help="git revision of the baseline decoder (default HEAD)")
    ap.add_argument("--model", choices=sorted(BATCH), default="tiny")
    ap.add_argument("--reps", type=int, default=15, help="alternated repetitions per side")
    args = ap.parse_args()
    torch.set_num_threads(1)
    checkpoint = decode_checkpoint(args.model)
    prompts = arithmetic_prompts(checkpoint, BATCH[args.model])
    reqs = [GenerationRequest(prompt_ids=p, seed=i) for i, p in enumerate(prompts)]
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=32, stop_token_ids=())
    current = model_runner.Decoder
    with tempfile.TemporaryDirectory() as folder:
        sides = {"this tree": current, f"{args.against}": decoder_at(args.against, Path(folder))}
        engines = {name: engine_with(cls, checkpoint) for name, cls in sides.items()}
        outputs = {name: e.generate(reqs, params) for name, e in engines.items()}  # warm-up, and compared
        L = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        tok = torch.zeros(len(prompts), dtype=torch.long)
        pos = mask.sum(-1) + 16
        times: dict[str, dict[str, list[float]]] = {n: {"call": [], "prefill": [], "step": []} for n in sides}
        for _ in range(args.reps):
            for name, engine in engines.items():
                model_runner.Decoder = sides[name]
                t0 = time.perf_counter()
                engine.generate(reqs, params)
                times[name]["call"].append(time.perf_counter() - t0)
                decoder = engine._decoder
                with torch.inference_mode():
                    cache = decoder.new_cache(mask, L + 32)
                    t0 = time.perf_counter()
                    decoder.prefill(ids, mask, cache)
                    times[name]["prefill"].append(time.perf_counter() - t0)
                    cache.length = L + 16
                    t0 = time.perf_counter()
                    for _ in range(8):
                        decoder.step(tok, pos, cache)
                    times[name]["step"].append((time.perf_counter() - t0) / 8)
        model_runner.Decoder = current
    a, b = sides
    for what in ("call", "prefill", "step"):
        ma, mb = median(times[a][what]), median(times[b][what])
        print(f"ratio {a}/{b} {what} time: {ma / mb:.3f}x   ({1000 * ma:.2f} vs {1000 * mb:.2f} ms, medians)")
    same = all(
        x.response_ids == y.response_ids and torch.equal(x.log_probs, y.log_probs)
        for x, y in zip(outputs[a], outputs[b])
    )
    print(f"same tokens and log-probs, bitwise: {same}")
    print(
        f"\ncontext: {machine()}; {args.model}, {len(prompts)} prompts x 32 tokens, {args.reps} alternated reps"
    )


if __name__ == "__main__":
    main()
