"""`grpolab estimate memory [TRAIN FLAGS]`: what a run will hold, before launching it (the Miles-101 manual's
long-runs chapter: count memory first, parameters x 16 bytes, half of the GPU as a first guess).

Per component, in bytes, from the model's config (parameters counted on the meta device: no weights
loaded) and the flags:

- trainer weights P x b_train, gradients P x b_train, Adam's two moments 2 P x b_train (torch's AdamW keeps
  them in the parameter dtype; none under `--debug-disable-optimizer`), the reference model P x b_train
  when something reads it (`--use-kl-loss`, the `--ci-test` log-prob checker);
- the in-process engine's weights P x b_rollout (none with engine servers);
- with `--rollout-num-engines N`, the fleet the run launches on this machine: N `grpolab serve` processes
  (each: the process baseline, the weights P x b_rollout and the KV cache of its share of the samples) and
  the router (`ROUTER_BYTES`); a fleet at `--sglang-router-ip` runs elsewhere and is not counted;
- the rollout's KV cache: layers x 2 x kv_heads x head_dim x b_rollout per token, for the rollout's samples
  (at most 256 decode together) at the longest prompt (tokenized as the run will, chat template
  applied) plus `--rollout-max-response-len`;
- one micro-batch's training activations, 4 bytes each: its tokens x layers x (12 hidden + 4 intermediate)
  (what a decoder layer keeps for backward) plus its scored positions (the response window the padded
  forward computes logits for: response length + 1 per sample) x 3 vocab (float32 logits, their
  log-softmax and its gradient): grpolab's estimate; the logits term dominates small models;
- the model load's transient copy (P x 4 bytes: a GGUF file is dequantized, then copied into a plain model);
- the process itself: the resident size of a fresh Python that imports what a run imports, measured here.

On CPU everything shares RAM: the peak is the process, the persistent parts, and the largest of the
transient ones (load, rollout, training), which do not overlap. `benchmarks/bench_memory_estimate.py`
compares the total with the measured peak RSS of the run.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from grpolab.core.config import Config

IMPORTS = "import grpolab.train.loop, grpolab.core.engine.torch_engine, grpolab.core.actor"
"""What the process baseline imports (a run's modules)."""
MAX_DECODE_BATCH = 256
"""Samples one in-process decode holds at once (core/engine/torch_engine.py's max batch)."""
ROUTER_BYTES = 100 * 2**20
"""Resident size of a launched sglang-router 0.3.2 (its Rust process, idle to busy): 97 MiB RSS measured
during a 2-engine tiny-model run on CPU, rounded up."""


@dataclass
class Part:
    """One component: its name, bytes, whether it stays for the whole run, and how it was counted."""

    name: str
    bytes: int
    persistent: bool
    how: str


def _dtype_bytes(name: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[name]


def process_baseline_bytes() -> int:
    """Peak RSS (bytes) of a fresh interpreter importing a run's modules, as it reports it (Linux
    `ru_maxrss` is in KiB)."""
    code = f"{IMPORTS}; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) * 1024


def estimate(config: Config, *, baseline: int | None = None, world_size: int = 1) -> tuple[list[Part], int]:
    """The run's components (see the module docstring) and its parameter count, over `world_size` ranks
    (`--nproc-per-node`): FSDP2 shards the trainer's weights, gradients and Adam across them (their sum is
    one rank's count), each rank is its own process and holds its own micro-batch.

    Raises:
        ValueError / FileNotFoundError: the model or the prompt data cannot be read (naming the flag).
    """
    import torch
    import transformers

    from grpolab.core.data import PromptDataset
    from grpolab.core.model_files import split_checkpoint
    from grpolab.core.modeling import load_tokenizer
    from grpolab.train.train_phase import reference_needed

    directory, gguf = split_checkpoint(config.model.hf_checkpoint)
    extra = {"gguf_file": gguf} if gguf else {}
    hf = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True, **extra)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    P = sum(p.numel() for p in model.parameters())  # shared (tied) parameters once
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    layers, hidden, vocab = text.num_hidden_layers, text.hidden_size, text.vocab_size
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    inter = getattr(text, "intermediate_size", 4 * hidden)
    bt, br = _dtype_bytes(config.model.train_dtype), _dtype_bytes(config.model.rollout_dtype)
    data = PromptDataset(config.data.prompt_data, load_tokenizer(config.model.hf_checkpoint), input_key=config.data.input_key,
                         label_key=config.data.label_key, apply_chat_template=config.data.apply_chat_template)  # fmt: skip
    longest = max(len(data[i].prompt_ids) for i in range(len(data)))
    seq = longest + config.rollout.rollout_max_response_len
    samples = config.rollout.samples_per_rollout
    optimizer = not config.debug.debug_disable_optimizer
    in_process = not config.rollout.uses_servers
    micro = min(config.optimizer.micro_batch_size, samples)
    mb_tokens, mb_scored = micro * seq, micro * (config.rollout.rollout_max_response_len + 1)
    kv_per_sample = layers * 2 * kv_heads * head_dim * br * seq
    base = process_baseline_bytes() if baseline is None else baseline
    parts = [
        Part("process (Python, torch, transformers, grpolab)", base, True,
             "measured: RSS of a fresh interpreter importing a run's modules"),
        Part("trainer weights", P * bt, True, f"{P:,} parameters x {bt} bytes"),
        Part("gradients", P * bt * optimizer, True, "one per parameter"),
        Part("Adam moments", 2 * P * bt * optimizer, True, "exp_avg and exp_avg_sq, parameter dtype"),
        Part("reference model", P * bt * reference_needed(config), True, "--use-kl-loss or the --ci-test checker"),
        Part("engine weights", P * br * in_process, True, "the in-process engine's own copy"),
        Part("model load (transient)", P * 4, False, "a dequantized / loaded copy while building a model"),
        Part("rollout KV cache (transient)", kv_per_sample * min(samples, MAX_DECODE_BATCH) * in_process, False,
             f"{min(samples, MAX_DECODE_BATCH)} samples x {seq} tokens (longest prompt {longest})"),
        Part("training micro-batch (transient)", (mb_tokens * layers * (12 * hidden + 4 * inter) + mb_scored * 3 * vocab) * 4,
             False, f"{mb_tokens} tokens' hidden states, {mb_scored} scored positions' float32 logits, log-softmax, gradient"),
    ]  # fmt: skip
    if world_size > 1:  # the micro-batch line is the last so far: every rank trains one at the same time
        micro_part = parts[-1]
        micro_part.bytes *= world_size
        micro_part.how = f"{world_size} ranks x ({micro_part.how})"
        others = world_size - 1
        parts.append(Part(f"other ranks' processes ({others})", others * base, True,
                          f"{others} more trainer process{'es' * (others > 1)}; weights, gradients and Adam are "
                          "sharded (FSDP2): their sum above is one copy"))  # fmt: skip
    if n := config.rollout.rollout_num_engines:  # the fleet this run launches, on this machine
        share = min(-(-samples // n), MAX_DECODE_BATCH)
        parts += [
            Part(f"engine servers ({n} x grpolab serve)", n * (base + P * br + kv_per_sample * share), True,
                 f"each: the process, the weights ({P:,} x {br} bytes), the KV cache of {share} samples"),
            Part("sglang-router", ROUTER_BYTES, True, "its Rust process (measured once: 97 MiB RSS)"),
        ]  # fmt: skip
    return parts, P


def peak_bytes(parts: list[Part]) -> int:
    """The persistent parts plus the largest transient one (they do not overlap)."""
    return sum(p.bytes for p in parts if p.persistent) + max(
        (p.bytes for p in parts if not p.persistent), default=0
    )


def device_bytes(device: str) -> int:
    """The memory of `device`: the GPU's (torch) or this machine's RAM (sysconf)."""
    import os

    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def table(parts: list[Part], params: int, device: str) -> str:
    """The report: one line per component, the peak against the device, and the manual's 16 bytes per
    parameter beside it."""
    lines = [f"  {p.name:48s} {p.bytes / 2**20:10.1f} MiB  {'' if p.persistent else '(transient) '}{p.how}"
             for p in parts]  # fmt: skip
    peak, total = peak_bytes(parts), device_bytes(device)
    lines.append(f"  {'estimated peak (persistent + largest transient)':48s} {peak / 2**20:10.1f} MiB  "
                 f"({100 * peak / total:.1f} % of {device}'s {total / 2**30:.1f} GiB)")  # fmt: skip
    lines.append(f"  {'the manual rule: parameters x 16 bytes':48s} {params * 16 / 2**20:10.1f} MiB  (weights, "
                 "gradients and Adam in float32, without activations, engine or process)")  # fmt: skip
    return "\n".join(lines)


def run_estimate_command(config: Config, *, world_size: int = 1) -> int:
    """`grpolab estimate memory [TRAIN FLAGS]` on the parsed flags (grpolab.cli parses them as `train`
    does) for `world_size` ranks: print the table; 0, or 2 when the model or the prompt data cannot be read."""
    try:
        parts, params = estimate(config, world_size=world_size)
    except (ValueError, FileNotFoundError) as e:
        print(f"grpolab estimate memory: error: {e}", file=sys.stderr)
        return 2
    print(
        f"grpolab estimate memory: {config.model.hf_checkpoint}, {params:,} parameters, on {config.model.device}"
    )
    print(table(parts, params, config.model.device))
    return 0
