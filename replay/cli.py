"""`grpolab replay convert IN.pt OUT.grz [--force]`, `grpolab replay inspect FILE [--sample K]` and
`grpolab replay logprobs RUN_DIR --rollout N [--force]`.

Wiring: `add_replay_parser(subparsers)` adds the `replay` command (sets `args.command = "replay"`);
`run_replay_command(args)` runs it and returns the exit code (0 ok, 2 on any error, with the
message on stderr). `python -m grpolab.replay.cli ...` runs it standalone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from grpolab.replay.logprobs import LogprobsResult
    from grpolab.replay.recording import RolloutRecording


def add_replay_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `replay {convert,inspect,logprobs,filter}` to an argparse subparsers object; returns the `replay`
    parser (`filter` runs in rollout/filter_replay.py, dispatched by grpolab.cli)."""
    replay = subparsers.add_parser(
        "replay",
        help="rollout recordings: convert Miles dumps, inspect .grz files, recompute the trainer log-prob gap",
    )
    sub = replay.add_subparsers(dest="replay_command", required=True)
    conv = sub.add_parser("convert", help="convert a Miles/slime .pt rollout dump to a .grz recording")
    conv.add_argument("input", help="Miles .pt file (loaded with torch.load(weights_only=True) only)")
    conv.add_argument("output", help="destination .grz file")
    conv.add_argument("--reward-key", default=None, help="key to read when a sample's reward is a dict")
    conv.add_argument("--force", action="store_true", help="replace an existing output file")
    insp = sub.add_parser("inspect", help="print a recording's header, reward and length summaries")
    insp.add_argument("file", help=".grz recording (or a Miles .pt dump)")
    insp.add_argument(
        "--sample", type=int, default=None, metavar="K", help="also print sample K token by token"
    )
    insp.add_argument("--tokenizer", default=None, metavar="DIR", help="decode tokens with this tokenizer")
    insp.add_argument("--reward-key", default=None, help="for Miles .pt input whose rewards are dicts")
    lp = sub.add_parser(
        "logprobs",
        help="recompute the trainer's log-probs of a recorded rollout on the weights it was trained with; "
        "writes RUN_DIR/logprobs/rollout_<N>.json",
    )
    lp.add_argument(
        "run_dir", metavar="RUN_DIR", help="run directory of a run with --save-debug-rollout-data"
    )
    lp.add_argument("--rollout", type=rollout_id_arg, required=True, metavar="N", help="recorded rollout id")
    lp.add_argument("--force", action="store_true", help="replace an existing result file")
    flt = sub.add_parser(
        "filter",
        help="run another --dynamic-sampling-filter-path over recorded rollouts: the groups that would flip",
        description="Run FILTER over every group of the recordings TEMPLATE names (a dynamic-sampling run's "
        "candidates_N files, else its rollout files) and list the groups whose keep/drop decision flips; "
        "exit 0 none, 1 some, 2 bad input (rollout/filter_replay.py).",
    )
    flt.add_argument("template", metavar="TEMPLATE", help="the run's --save-debug-rollout-data template")
    flt.add_argument(
        "--filter", required=True, metavar="pkg.mod.fn", help="the filter to try (Miles' contract)"
    )
    flt.add_argument("--json", action="store_true", help="print one JSON object instead of the list")
    return replay


def rollout_id_arg(text: str) -> int:
    """argparse type of `--rollout`: a training rollout id, an int >= 0.

    Raises:
        argparse.ArgumentTypeError: not an int, or negative (argparse names the flag, exit 2).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a rollout id (an integer >= 0), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a rollout id (an integer >= 0), got {value}")
    return value


def run_replay_command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run `replay convert` / `replay inspect`; returns 0, or 2 after printing the error to stderr."""
    from grpolab.replay.format import RecordingError  # NumPy: only when a replay command runs, not for --help

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if args.replay_command == "convert":
            from grpolab.replay.miles_import import convert_miles

            n = convert_miles(args.input, args.output, reward_key=args.reward_key, force=args.force)
            print(f"wrote {args.output} ({n} bytes)", file=out)
            return 0
        if args.replay_command == "inspect":
            inspect_file(
                args.file,
                sample=args.sample,
                tokenizer_dir=args.tokenizer,
                reward_key=args.reward_key,
                out=out,
            )
            return 0
        if args.replay_command == "logprobs":
            from grpolab.replay.logprobs import recompute

            result, path = recompute(
                args.run_dir, args.rollout, force=args.force, progress=lambda line: print(line, file=err)
            )
            print_gap_summary(result, path, args.run_dir, out=out)
            return 0
        raise ValueError(f"unknown replay command {args.replay_command!r}")
    except BrokenPipeError:
        raise  # stdout closed by its reader (`| head`): not an error of the input; grpolab.cli.main ends quietly
    except (RecordingError, ValueError, OSError) as e:
        print(f"grpolab replay {args.replay_command}: error: {e}", file=err)
        return 2


def print_gap_summary(result: LogprobsResult, path: Path, run_dir: str | Path, *, out: TextIO) -> None:
    """A few lines: the recomputed gap of the rollout and of each optimizer step next to the value the
    run logged for that step (read with `rundir.reader.read_metrics`), the weights, the file.

    Raises:
        OSError: the run's metrics file exists but cannot be read.
    """
    from grpolab.replay.logprobs import GAP_KEY
    from grpolab.rundir.reader import read_metrics

    logged = {
        r.step: r.metrics[GAP_KEY]
        for r in read_metrics(run_dir, "step")
        if r.rollout_id == result.rollout_id and GAP_KEY in r.metrics
    }
    n = len(result.samples)
    print(
        f"rollout {result.rollout_id}: mean |trainer - engine| log-prob {result.mean_abs_gap:.6g} "
        f"({result.reduction} over {n} samples)",
        file=out,
    )
    for step, gap in result.steps:
        was = f"the run logged {logged[step]:.6g}" if step in logged else "the run did not log it"
        print(f"  step {step}: recomputed {GAP_KEY} {gap:.6g}; {was}", file=out)
    print(f"weights: {result.weights.description}", file=out)
    print(f"wrote {path}", file=out)


def _load_any(path: Path, reward_key: str | None) -> RolloutRecording:
    import numpy as np

    from grpolab.replay.format import MAGIC, RecordingError
    from grpolab.replay.miles_import import load_miles_pt, miles_samples
    from grpolab.replay.recording import RolloutRecording, load_rollout

    if not path.is_file():
        raise RecordingError(f"{path}: no such recording")
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    if head != MAGIC and path.suffix == ".pt":
        dump = load_miles_pt(path)
        samples = miles_samples(dump, name=str(path), reward_key=reward_key)
        return RolloutRecording(
            rollout_id=dump.get("rollout_id", 0),
            weight_version=max((s.weight_version for s in samples), default=0),
            run_seed=0,
            seeds=np.zeros(len(samples), np.uint64),
            sampler={},
            model_fingerprint="",
            tokenizer_fingerprint="",
            chat_template_hash="",
            train_config={},
            created=0.0,
            samples=samples,
            extra={"source": "miles (read directly, not converted)", "seeds_known": False},
        )
    return load_rollout(path)


def _run_line(rec: RolloutRecording) -> str:
    """Which run made the recording: its run id and --run-dir, or why that is unknown."""
    if rec.run_id:
        return f"run {rec.run_id} (run dir {rec.run_dir or '?'})"
    if rec.extra.get("source"):
        return f"no grpolab run ({rec.extra['source']})"
    return "(not recorded)"


def _stats(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "n/a"
    a = np.asarray(values, dtype=np.float64)
    return f"mean {a.mean():.6g}  min {a.min():.6g}  max {a.max():.6g}"


def inspect_file(
    path: str | Path,
    *,
    sample: int | None = None,
    tokenizer_dir: str | None = None,
    reward_key: str | None = None,
    out: TextIO,
) -> None:
    """Print a recording's header, sample count, reward and response-length summaries; with `sample`,
    that sample's texts and a per-token table (position, token id, decoded token, engine log-prob, mask).

    Raises:
        RecordingError: unreadable recording (see `load_rollout` / `load_miles_pt`).
        ValueError: `sample` out of range.
        OSError: the tokenizer directory cannot be loaded.
    """
    path = Path(path)
    rec = _load_any(path, reward_key)
    samples = rec.samples
    p = lambda *a: print(*a, file=out)  # noqa: E731
    kind = (
        "Miles .pt dump, read directly"
        if path.suffix == ".pt" and rec.created == 0.0
        else f"format v{rec.format_version}"
    )
    created = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.created)) if rec.created else "(not recorded)"
    )
    p(f"file: {path} ({path.stat().st_size} bytes, {kind})")
    p(f"rollout id: {rec.rollout_id}   weight version: {rec.weight_version}   created: {created}")
    seeds = rec.seeds.tolist()
    if rec.extra.get("seeds_known") is False:
        seed_line = "unknown (not recorded by the source)"
    elif seeds:
        seed_line = f"{len(set(seeds))} distinct over {len(seeds)} samples, first {seeds[0]}, min {min(seeds)}, max {max(seeds)}"
    else:
        seed_line = "none"
    p(f"run seed: {rec.run_seed}   sample seeds: {seed_line}")
    p(f"recorded by: {_run_line(rec)}")
    p("sampler: " + (", ".join(f"{k}={v}" for k, v in rec.sampler.items()) or "(not recorded)"))
    from grpolab.replay.fingerprints import FINGERPRINT_FIELDS

    for k in FINGERPRINT_FIELDS:
        p(f"{k}: {getattr(rec, k) or '(not recorded)'}")
    if rec.train_config:
        p("train_config: " + ", ".join(f"{k}={v}" for k, v in rec.train_config.items()))
    if rec.extra:
        p("extra: " + ", ".join(f"{k}={v}" for k, v in rec.extra.items()))
    groups: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        groups[s.group_index].append(s.reward)
    p(f"samples: {len(samples)} in {len(groups)} groups")
    p(f"reward: {_stats([s.reward for s in samples])}")
    for g, rs in sorted(groups.items()):
        p(f"  group {g}: n={len(rs)}  {_stats(rs)}")
    lengths = [s.response_length for s in samples]
    trunc = sum(s.truncated for s in samples)
    frac = trunc / len(samples) if samples else 0.0
    p(
        f"response length (tokens): {_stats([float(x) for x in lengths])}   truncated: {trunc}/{len(samples)} ({frac:.1%})"
    )
    if sample is not None:
        if not 0 <= sample < len(samples):
            raise ValueError(
                f"--sample {sample} is out of range: the recording has {len(samples)} samples (0..{len(samples) - 1})"
            )
        _print_sample(samples[sample], tokenizer_dir, p)


def _print_sample(s: Any, tokenizer_dir: str | None, p: Any) -> None:
    tok = None
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    p("")
    p(
        f"sample {s.index}: group {s.group_index}  sample_index {s.sample_index}  prompt_index {s.prompt_index}  "
        f"seed {s.seed}  finish {s.finish_reason}  reward {s.reward:.6g}  advantage {s.advantage:.6g}  "
        f"weight_version {s.weight_version}  label {s.label!r}"
    )
    if s.metadata:
        p(f"metadata: {s.metadata}")
    p(f"prompt ({len(s.prompt_ids)} tokens):")
    p(s.prompt_text or (tok.decode(s.prompt_ids) if tok else "(no text recorded)"))
    p(f"response ({s.response_length} tokens):")
    p(s.response_text or (tok.decode(s.response_ids) if tok else "(no text recorded)"))
    p("")
    head = (
        f"{'pos':>5} {'token_id':>9} " + (f"{'token':<16} " if tok else "") + f"{'logprob':>10} {'mask':>5}"
    )
    if s.kept_token_ids is not None:
        head += f" {'kept':>5}"
    p(head)
    for r, (tid, lp, m) in enumerate(zip(s.response_ids, s.rollout_log_probs.tolist(), s.loss_mask.tolist())):
        line = f"{r:>5} {tid:>9} " + (f"{tok.decode([tid])!r:<16} " if tok else "") + f"{lp:>10.4f} {m:>5g}"
        if s.kept_token_ids is not None:
            line += f" {s.kept_token_ids[r].numel():>5}"
        p(line)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: `python -m grpolab.replay.cli replay {convert,inspect,logprobs} ...` or
    without `replay`."""
    parser = argparse.ArgumentParser(prog="grpolab")
    sub = parser.add_subparsers(dest="command", required=True)
    add_replay_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] != "replay":
        argv = ["replay", *argv]
    return run_replay_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
