"""`grpolab check turns` over 1,000 recorded 4-turn samples (issue 23): goal <= 2 s.

The recording is built the way the tool loop records (core/turns/record.py): for 1,000 arithmetic
prompts, 4 model turns (three calculator calls, each followed by its tool message, then the answer),
the fixture tokenizer and chat template (tiny-qwen3-tools), one `.grz` file (rollout 0). Timed, `--reps`
times alternated: the whole command in this process (`grpolab check turns FILE --hf-checkpoint M`:
load the recording and the tokenizer, audit, report), and the named baseline, reading the same
recording alone (`load_rollout`), so the ratio says what the audit adds to opening the file.
Run: `python benchmarks/bench_check_turns.py [--samples 1000] [--reps 5]`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import ARITHMETIC, REPO, machine, median

from grpolab.cli import main
from grpolab.core.batch import Sample
from grpolab.core.modeling import load_tokenizer
from grpolab.core.turns.codec import ChatCodec
from grpolab.core.turns.episode import episode_metadata
from grpolab.core.turns.record import TokenRecord, add_reply, append_turn
from grpolab.fixtures.make_tool_fixture import call_text
from grpolab.replay.recording import load_rollout, save_rollout

MODEL = REPO / "fixtures" / "tiny-qwen3-tools"


def episode(codec: ChatCodec, eos: int, row: dict, index: int) -> Sample:
    """A 4-turn calculator episode: three calls and tool results, then the answer."""
    messages = [{"role": "user", "content": row["question"]}]
    prompt = codec.encode(codec.render(messages, True))
    rec = TokenRecord(prompt_length=len(prompt), messages=messages)
    rec.add(prompt, "prompt", 0)
    expr, result = row["answer"].split(" = ")[0], row["answer"].split("#### ")[-1]
    for turn in range(3):
        call = call_text(expr)
        ids = codec.encode(call) + [eos]
        add_reply(rec, ids, [-0.1] * len(ids), "1", {"role": "assistant", "content": call}, "stop")
        tool = {"role": "tool", "tool_call_id": f"call_{turn}", "name": "calc", "content": result}
        append_turn(rec, [tool], codec.render, codec.encode, codec.decode)
    ids = codec.encode(f"#### {result}") + [eos]
    add_reply(rec, ids, [-0.1] * len(ids), "1", {"role": "assistant", "content": f"#### {result}"}, "stop")
    P = rec.prompt_length
    return Sample(
        index=index, prompt_index=index, group_index=index // 8, sample_index=index % 8, seed=index,
        prompt_ids=rec.ids[:P], response_ids=rec.ids[P:],
        rollout_log_probs=torch.tensor([lp or 0.0 for lp in rec.logprobs[P:]]),
        loss_mask=torch.tensor(rec.loss_mask(), dtype=torch.float32), finish_reason="stop",
        metadata=episode_metadata(rec, tools=[], tool_calls=[], parse_errors=0, ended="answer"),
    )  # fmt: skip


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    tok = load_tokenizer(MODEL)
    codec = ChatCodec(tok)
    rows = [json.loads(line) for line in ARITHMETIC.read_text().splitlines()[: args.samples]]
    samples = [episode(codec, tok.eos_token_id, row, i) for i, row in enumerate(rows)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "turns.grz"
        size = save_rollout(path, samples, rollout_id=0, weight_version=1, run_seed=1, sampler={},
                            fingerprints={}, train_config={})  # fmt: skip
        print(
            f"{machine()}; {len(samples)} samples x 4 model turns, {path.stat().st_size / 1e6:.1f} MB ({size} bytes)"
        )
        command, baseline = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            load_rollout(path)
            baseline.append(time.perf_counter() - t0)
            out = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(out):
                code = main(["check", "turns", str(path), "--hf-checkpoint", str(MODEL)])
            command.append(time.perf_counter() - t0)
            assert code == 0, out.getvalue()
        c, b = median(command), median(baseline)
        print(f"grpolab check turns: {c:.3f} s median of {args.reps} (goal <= 2 s); "
              f"load_rollout alone: {b:.3f} s; ratio check/load {c / b:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main_()
