"""`grpolab check parity`: run the same prompts through the parity ladder (checkers/parity.py) and
print, per rung, bitwise-equal positions / total, max |Δ log-prob| and the first differing sample and
token. Exit 0 when every rung meets its bar, 1 naming the first failing rung and its likely cause,
2 bad input. `--server URL` puts a running engine server in the engine's rungs (checkers/parity_server.py);
the world-size rung spawns 2 gloo ranks (checkers/parity_world.py). `--json` writes the report with this
machine's environment manifest; `--baseline FILE` (an earlier `--json` report) prints the rungs whose
numbers moved since and what changed in the manifest.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "grpolab check parity"
DEFAULT_DATA = Path(__file__).resolve().parent.parent / "fixtures" / "data" / "arithmetic_train.jsonl"
DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-qwen3"


def add_parity_parser(kinds: argparse._SubParsersAction) -> None:
    """Add `parity` to `grpolab check`'s kinds (imports no torch)."""
    p = kinds.add_parser(
        "parity",
        help="where trainer and engine stop agreeing: the parity ladder, rung by rung",
        description=(
            "Run the same prompts through engine decode vs prefill, alone vs batched, trainer micro-batch "
            "1 vs N and packed vs padded, trainer vs engine, world size 1 vs 2 (gloo), and transformers' forward "
            "and greedy generate, on the in-process engine or a running server (--server); "
            "exit 0 when every rung meets its bar, 1 naming the first that does not, 2 bad input."
        ),
    )
    p.add_argument(
        "--hf-checkpoint", default=str(DEFAULT_MODEL), metavar="M", help="model (default: the tiny fixture)"
    )
    p.add_argument("--prompt-data", default=str(DEFAULT_DATA), metavar="F", help="prompts (.jsonl)")
    p.add_argument("--input-key", default="question")
    p.add_argument("--label-key", default="answer")
    p.add_argument("--num-prompts", type=int, default=8, metavar="N")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="the trainer's micro-batch size N")
    p.add_argument("--rollout-temperature", type=float, default=1.0)
    p.add_argument("--rollout-top-p", type=float, default=1.0, metavar="P")
    p.add_argument("--rollout-top-k", type=int, default=0, metavar="K")
    p.add_argument("--rollout-max-response-len", type=int, default=32)
    p.add_argument("--rollout-dtype", default="float32", metavar="D", help="engine and trainer dtype")
    p.add_argument(
        "--tol",
        type=float,
        default=1e-4,
        metavar="X",
        help="the bar of the non-bitwise rungs "
        "(default 1e-4: float32 noise reaches 1e-5 over ~70 prompts; bfloat16 needs ~1e-2)",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--server", metavar="URL", help="a running `grpolab serve` or SGLang engine (not a router) "
                   "for the engine's rungs, instead of the in-process engine")  # fmt: skip
    p.add_argument("--no-world-size", action="store_true", help="skip the world size 1 vs 2 rung (it spawns "
                   "2 gloo ranks)")  # fmt: skip
    p.add_argument("--baseline", metavar="FILE", help="an earlier `--json` report: print the rungs that moved "
                   "and what changed in the environment manifest")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _inputs(args: argparse.Namespace):  # noqa: ANN202 (tokenizer, dataset, sampling)
    """Validate the flags and load the prompts.

    Raises:
        ValueError / FileNotFoundError: naming the flag or file.
    """
    from grpolab.core.data import PromptDataset
    from grpolab.core.dtypes import check_dtype
    from grpolab.core.engine.base import SamplingParams
    from grpolab.core.modeling import load_tokenizer, stop_token_ids

    for flag, value in (("--num-prompts", args.num_prompts), ("--batch-size", args.batch_size),
                        ("--rollout-max-response-len", args.rollout_max_response_len)):  # fmt: skip
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if not args.tol >= 0:
        raise ValueError(f"--tol must be >= 0, got {args.tol}")
    check_dtype(args.rollout_dtype, "--rollout-dtype")
    if args.server is not None and not args.server.startswith(("http://", "https://")):
        raise ValueError(f"--server {args.server}: expected http://HOST:PORT of a running engine server")
    if not Path(args.hf_checkpoint).exists():
        raise FileNotFoundError(f"--hf-checkpoint {args.hf_checkpoint}: no such model directory or file")
    tokenizer = load_tokenizer(args.hf_checkpoint)
    dataset = PromptDataset(args.prompt_data, tokenizer, input_key=args.input_key, label_key=args.label_key,
                            apply_chat_template=bool(getattr(tokenizer, "chat_template", None)))  # fmt: skip
    sampling = SamplingParams(temperature=args.rollout_temperature, top_p=args.rollout_top_p,
                              top_k=args.rollout_top_k, max_new_tokens=args.rollout_max_response_len,
                              stop_token_ids=stop_token_ids(args.hf_checkpoint, tokenizer))  # fmt: skip
    return tokenizer, dataset, sampling


def run_parity_command(args: argparse.Namespace) -> int:
    """Run `grpolab check parity`; return the exit code (see the module docstring)."""
    from grpolab.checkers.parity_baseline import moved_lines, read_baseline
    from grpolab.rundir.writer import environment_fingerprint

    try:
        baseline = read_baseline(args.baseline) if args.baseline else None
        tokenizer, dataset, sampling = _inputs(args)
        side = _engine_side(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        rungs, greedy = _ladder(args, side, tokenizer, dataset, sampling)
    except RuntimeError as e:  # the server failed mid-ladder
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    finally:
        if hasattr(side, "close"):
            side.close()
    failed = next((r for r in rungs if not r.passed), None)
    report = {"rungs": [r.as_json() for r in rungs], "greedy": [g.__dict__ for g in greedy],
              "failed": failed.name if failed else None, "settings": _settings(args),
              "environment": environment_fingerprint()}  # fmt: skip
    moved = moved_lines(baseline, report, args.baseline) if baseline is not None else []
    if args.json:
        print(json.dumps(report | ({"moved": moved} if baseline is not None else {})))
    else:
        print("\n".join([_table(args, rungs, greedy), *moved]))
        if failed is not None:
            where = (
                f" (first at sample {failed.first[0]}, answer token {failed.first[1]})"
                if failed.first
                else ""
            )
            print(f"{PROG}: the first failing rung is {failed.name!r}{where}: {failed.cause}")
    return 1 if failed else 0


def _settings(args: argparse.Namespace) -> dict:
    """The flags that decide the ladder's numbers (recorded in `--json`, compared by `--baseline`)."""
    keys = ("hf_checkpoint", "prompt_data", "num_prompts", "batch_size", "rollout_temperature", "rollout_top_p",
            "rollout_top_k", "rollout_max_response_len", "rollout_dtype", "tol", "seed", "server")  # fmt: skip
    return {k: getattr(args, k) for k in keys}


def _engine_side(args: argparse.Namespace):  # noqa: ANN202 (parity.LocalEngine | ServerEngine)
    """The engine the engine rungs run on: `--server`'s, or the in-process one.

    Raises:
        ValueError: the server does not answer or serves another model (parity_server.ServerEngine).
    """
    if args.server is not None:
        from grpolab.checkers.parity_server import ServerEngine

        return ServerEngine(args.server, args.hf_checkpoint)
    from grpolab.checkers.parity import LocalEngine
    from grpolab.core.dtypes import parse_dtype
    from grpolab.core.engine.torch_engine import TorchEngine

    dtype = parse_dtype(args.rollout_dtype, "--rollout-dtype")
    return LocalEngine(TorchEngine(args.hf_checkpoint, dtype=dtype, show_progress=False))


def _ladder(args: argparse.Namespace, side, tokenizer, dataset, sampling):  # noqa: ANN001, ANN202
    """Every rung of checkers/parity.py on the first `--num-prompts` prompts, the engine's on `side`."""
    import torch

    from grpolab.checkers import parity
    from grpolab.core.actor import Actor
    from grpolab.core.batch import Sample
    from grpolab.core.config import AlgorithmConfig, OptimizerConfig
    from grpolab.core.dtypes import parse_dtype
    from grpolab.core.modeling import load_causal_lm
    from grpolab.core.rewards import math_reward
    from grpolab.core.seeding import derive_sample_seed
    from grpolab.core.sequence_forward import Answer

    n = min(args.num_prompts, len(dataset))
    prompts = [list(dataset[i].prompt_ids) for i in range(n)]
    labels = [dataset[i].label for i in range(n)]
    seeds = [derive_sample_seed(args.seed, 0, i, 0) for i in range(n)]
    dtype = parse_dtype(args.rollout_dtype, "--rollout-dtype")
    rungs, batch, prefill = parity.engine_rungs(side, prompts, seeds, sampling, tol=args.tol)
    samples = [Sample(index=i, prompt_index=i, group_index=i, sample_index=0, seed=s, prompt_ids=p,
                      response_ids=list(r.response_ids), rollout_log_probs=r.log_probs,
                      loss_mask=torch.ones(len(r.response_ids)), finish_reason=r.finish_reason,
                      kept_token_ids=r.kept_token_ids)
               for i, (p, s, r) in enumerate(zip(prompts, seeds, batch))]  # fmt: skip

    def actor(micro: int, forward: str = "padded", alone: bool = False) -> Actor:
        opt = OptimizerConfig(global_batch_size=len(samples), micro_batch_size=micro)
        return Actor(args.hf_checkpoint, dtype=dtype, device="cpu", optimizer=opt, algorithm=AlgorithmConfig(),
                     temperature=sampling.temperature, build_optimizer=False, with_reference=False,
                     train_forward=forward, true_on_policy=alone)  # fmt: skip

    one = parity.trainer_log_probs(actor(1), samples)
    batched = actor(args.batch_size)
    many = parity.trainer_log_probs(batched, samples)
    rungs.append(parity.compare("trainer micro-batch 1 vs N", one, many, bitwise=False, tol=args.tol,
                                cause="the trainer's numbers depend on its micro-batch (padding length, a "
                                "batch-dependent normalisation)"))  # fmt: skip
    rungs.append(_packed_rung(args, actor, batched, samples, parity))
    engine_lp = [s.rollout_log_probs for s in samples]
    rungs.append(parity.compare("trainer vs engine", many, engine_lp, bitwise=False, tol=args.tol,
                                cause="trainer and engine compute other numbers for the same tokens (weights, "
                                "dtype, a kernel, the kept top-p/top-k support)"))  # fmt: skip
    rungs.append(_alone_rung(args, actor, side, samples, engine_lp if side.rescores_by_prefill else prefill,
                             parity))  # fmt: skip
    rungs.append(_world_rung(args, dtype, sampling, samples, one, parity))
    model = load_causal_lm(args.hf_checkpoint, dtype=dtype)
    answers = [Answer(s.prompt_ids, s.response_ids, s.kept_token_ids) for s in samples]
    hf = parity.hf_forward_log_probs(model, answers, sampling.temperature, int(model.config.vocab_size))
    rungs.append(parity.compare("transformers' own forward vs engine", hf, engine_lp, bitwise=False,
                                tol=args.tol, cause="transformers' default forward (no mask, all positions) "
                                "gives other numbers than the engine"))  # fmt: skip
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    greedy = parity.greedy_rows(model, side, prompts, labels, args.rollout_max_response_len,
                                sampling.stop_token_ids, decode, math_reward)  # fmt: skip
    return rungs, greedy


def _alone_rung(args, actor, side, samples, engine_alone, parity):  # noqa: ANN001, ANN202
    """The bitwise rung: the trainer scoring each answer alone against the engine's prefill of it alone
    (its answers' own log-probs when the server re-scores by prefill, `--true-on-policy-mode`)."""
    name = "trainer vs engine, each answer alone (--true-on-policy-mode)"
    if engine_alone is None:
        return parity.skipped(name, bar="bitwise", note=f"skipped: {side.name} has no prefill over the kept top-p/top-k support "
                              "and does not report true_on_policy_mode")  # fmt: skip
    alone = parity.trainer_log_probs(actor(args.batch_size, alone=True), samples)
    return parity.compare(name, alone, engine_alone, bitwise=True, tol=0.0, cause="under "
                          "--true-on-policy-mode both sides run one function on the same weights; a difference "
                          "means other weights or another forward")  # fmt: skip


def _world_rung(args, dtype, sampling, samples, one, parity):  # noqa: ANN001, ANN202
    """World size 1 vs 2 (gloo, FSDP2), each sample alone on both sides (checkers/parity_world.py)."""
    name = "trainer world size 1 vs 2 (gloo)"
    if args.no_world_size:
        return parity.skipped(name, "skipped: --no-world-size", bar="bitwise")
    from grpolab.checkers.parity_world import world_log_probs

    two = world_log_probs(args.hf_checkpoint, dtype, sampling.temperature, samples)
    return parity.compare(name, one, two, bitwise=True, tol=0.0, cause="the FSDP-sharded trainer computes "
                          "other numbers than one process: the gathered parameters are not the loaded ones "
                          "(a cast while sharding, a reducing gather)")  # fmt: skip


def _packed_rung(args, actor, batched, samples, parity):  # noqa: ANN001, ANN202
    """Packed vs padded on groups of 4 answers sharing a prompt (the layout packing pays on)."""
    import dataclasses

    grouped = [dataclasses.replace(samples[i % len(samples)], index=i, group_index=i // 4, sample_index=i % 4,
                                   prompt_ids=samples[(i // 4) % len(samples)].prompt_ids)
               for i in range(len(samples))]  # fmt: skip
    try:
        packed_actor = actor(args.batch_size, "shared-prefix")
    except ValueError as e:
        return parity.skipped("trainer packed vs padded", f"skipped: {e}")
    packed = parity.trainer_log_probs(packed_actor, grouped)
    rung = parity.compare("trainer packed vs padded", packed, parity.trainer_log_probs(batched,
                          grouped), bitwise=False, tol=args.tol, cause="the packed forward (one row per "
                          "prompt) computes other numbers than one padded row per sample")  # fmt: skip
    rung.note = f"{packed_actor.forwards['packed']} of {sum(packed_actor.forwards.values())} forwards packed"
    return rung


def _table(args: argparse.Namespace, rungs, greedy) -> str:  # noqa: ANN001
    """The report: one line per rung, then the greedy rows."""
    engine = f"engine {args.server}" if args.server else "in-process engine"
    lines = [f"{PROG}: {args.hf_checkpoint}, {engine}, {args.num_prompts} prompts, dtype {args.rollout_dtype}, "
             f"top-p {args.rollout_top_p}, top-k {args.rollout_top_k}, --tol {args.tol:g}"]  # fmt: skip
    for r in rungs:
        verdict = "skip" if r.skipped else "ok  " if r.passed else "FAIL"
        first = f"first beyond the bar: sample {r.first[0]} token {r.first[1]}" if r.first else ""
        lines.append(f"  {verdict} {r.name:62s} [{r.bar:7s}] bitwise {r.equal}/{r.total}  max |Δ| "
                     f"{r.max_abs:.3g}  {first}{'  (' + r.note + ')' if r.note else ''}")  # fmt: skip
    same = sum(g.diverges_at is None for g in greedy)
    lines.append(f"  greedy: transformers' generate and the engine agree on {same} of {len(greedy)} answers; "
                 f"accuracy transformers {sum(g.hf_correct for g in greedy)}/{len(greedy)}, engine "
                 f"{sum(g.engine_correct for g in greedy)}/{len(greedy)}")  # fmt: skip
    for g in greedy:
        if g.diverges_at is not None:
            lines.append(f"    sample {g.sample}: first divergent token {g.diverges_at}, top-5 overlap there "
                         f"{g.top5_overlap}/5")  # fmt: skip
    return "\n".join(lines)
