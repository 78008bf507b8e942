"""`grpolab agent run`: debug an agent workflow against a running server, outside training.

    grpolab agent run --agent pkg.mod.run --server URL --prompt-data F [--num-prompts N]
        [--n-samples-per-prompt K] [--save-debug-rollout-data PATH] [--hf-checkpoint M]

The AReaL guide's first steps: the workflow (`--custom-agent-function-path`'s contract,
rollout/agent_episode.py) runs against a `grpolab serve` that is already up, each episode in a
token-in/token-out session; every turn is printed (source, tokens, text) with the episode's reward,
and `--save-debug-rollout-data` writes the recording a training rollout would (`grpolab check turns`,
`--load-debug-rollout-data` read it). Everything runs in this process, no subprocess, so the command
runs under a debugger with breakpoints in the agent. The server must serve `/sessions` (grpolab
serve): a server without them cannot give the exact ids. Exit 0 done, 1 the agent failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from itertools import groupby
from pathlib import Path

PROG = "grpolab agent run"


def add_agent_parser(sub: argparse._SubParsersAction) -> None:
    """Add `grpolab agent run` to the `grpolab` subparsers (imports no torch)."""
    agent = sub.add_parser("agent", help="run an agent workflow against a running server (grpolab agent run)")
    kinds = agent.add_subparsers(dest="agent_command", required=True, metavar="{run}")
    run = kinds.add_parser(
        "run",
        help="run --agent on prompts against --server, print every turn, optionally record the rollout",
        description=__doc__.split("\n\n")[2].replace("\n", " "),
    )
    run.add_argument("--agent", required=True, metavar="pkg.mod.run",
                     help="async def run(base_url, prompt, request_kwargs, metadata, **kw) -> reward")  # fmt: skip
    run.add_argument(
        "--server", required=True, metavar="URL", help="a running grpolab serve, e.g. http://127.0.0.1:30000"
    )
    run.add_argument("--prompt-data", required=True, metavar="F", help="prompt .jsonl (question/answer rows)")
    run.add_argument("--input-key", default="question", help="prompt field (default: question)")
    run.add_argument("--label-key", default="answer", help="label field (default: answer)")
    run.add_argument("--num-prompts", type=int, default=2, metavar="N", help="first N rows (default: 2)")
    run.add_argument(
        "--n-samples-per-prompt", type=int, default=1, metavar="K", help="episodes per prompt (default: 1)"
    )
    run.add_argument(
        "--hf-checkpoint", metavar="M", help="tokenizer and chat template (default: the server's model_path)"
    )
    run.add_argument("--rollout-temperature", type=float, default=1.0, help="default: 1.0")
    run.add_argument("--rollout-top-p", type=float, default=1.0, help="default: 1.0")
    run.add_argument(
        "--rollout-max-response-len",
        type=int,
        default=96,
        help="response tokens per episode, all turns together, as in training (default: 96)",
    )
    run.add_argument("--seed", type=int, default=1, help="seeds every episode's requests (default: 1)")
    run.add_argument("--agent-timeout", type=float, default=300.0, help="seconds per episode (default: 300)")
    run.add_argument(
        "--save-debug-rollout-data",
        metavar="PATH",
        help="write the episodes as a .grz recording (a {rollout_id} in PATH is 0)",
    )
    run.add_argument("--force", action="store_true", help="replace an existing recording")


def _server_facts(server: str) -> dict:
    """The server's /model_info, and whether it serves sessions.

    Raises:
        ValueError: it does not answer, or has no /sessions (naming the URL).
    """
    try:
        with urllib.request.urlopen(f"{server}/model_info", timeout=10) as answer:
            info = json.loads(answer.read())
        req = urllib.request.Request(f"{server}/sessions/grpolab-probe", method="GET")
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        if e.code != 404 or not e.url.endswith("/sessions/grpolab-probe"):
            raise ValueError(f"--server {server}: {e.url} answered HTTP {e.code}") from e
        body = e.read().decode("utf-8", "replace")
        if "session" not in body:  # a 404 of the route itself, not of the probe's session id
            raise ValueError(f"--server {server} serves no /sessions (grpolab serve does): the exact ids of "
                             "each turn need token-in/token-out sessions") from e  # fmt: skip
        return info
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ValueError(f"--server {server}: no answer from /model_info ({e})") from e
    return info


def run_agent_command(args: argparse.Namespace) -> int:
    """Run `grpolab agent run`; return the exit code (see the module docstring)."""
    from grpolab.core.config import Config, DataConfig, RolloutConfig, RunConfig
    from grpolab.core.config.agent import AgentConfig
    from grpolab.core.data import PromptDataset
    from grpolab.core.engine.base import SamplingParams
    from grpolab.core.modeling import load_tokenizer
    from grpolab.core.turns.tools import AGENT_FLAG, load_episode_function
    from grpolab.rollout.agent_episode import run_agents
    from grpolab.rollout.sample_plan import plan_samples

    server = args.server.rstrip("/")
    out = None
    try:
        if args.save_debug_rollout_data:  # a training template's {rollout_id} is this run's rollout 0
            from grpolab.replay.paths import format_path

            path = args.save_debug_rollout_data
            out = Path(format_path(path, 0) if "{rollout_id}" in path else path)
        if args.num_prompts < 1 or args.n_samples_per_prompt < 1:
            raise ValueError("--num-prompts and --n-samples-per-prompt must be >= 1")
        if out is not None and out.is_dir():  # --force replaces a recording, never a directory
            raise ValueError(
                f"--save-debug-rollout-data {out} is a directory; give the recording file to write, "
                f"e.g. {out / 'rollout_0.grz'}"
            )
        if out is not None and out.exists() and not args.force:
            raise ValueError(f"--save-debug-rollout-data {out} exists; pass --force to replace it")
        found = load_episode_function(AgentConfig(custom_agent_function_path=args.agent))
        assert found is not None
        info = _server_facts(server)
        model = args.hf_checkpoint or info.get("model_path")
        if not model or not Path(model).exists():
            raise ValueError(
                f"the server's model_path {model!r} is not on this machine; pass --hf-checkpoint"
            )
        tokenizer = load_tokenizer(model)
        dataset = PromptDataset(args.prompt_data, tokenizer, input_key=args.input_key, label_key=args.label_key,
                                apply_chat_template=True)  # fmt: skip
        n = min(args.num_prompts, len(dataset))
        config = Config(
            data=DataConfig(prompt_data=args.prompt_data, input_key=args.input_key, label_key=args.label_key,
                            apply_chat_template=True),
            rollout=RolloutConfig(rollout_batch_size=n, n_samples_per_prompt=args.n_samples_per_prompt,
                                  rollout_temperature=args.rollout_temperature, rollout_top_p=args.rollout_top_p,
                                  rollout_max_response_len=args.rollout_max_response_len),
            run=RunConfig(seed=args.seed),
        )  # fmt: skip
    except (ValueError, FileNotFoundError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    plan = plan_samples(config, dataset, rollout_id=0, indices=list(range(n)), first=0)
    sampling = SamplingParams(temperature=args.rollout_temperature, top_p=args.rollout_top_p,
                              max_new_tokens=args.rollout_max_response_len)  # fmt: skip
    version = str(info.get("weight_version", ""))
    engine_version = int(version) if version.isdigit() else 0  # a fresh server's "default" counts as 0
    from grpolab.core.interrupts import interrupt_exit_code, interrupt_on_sigterm, restore_handlers

    previous = interrupt_on_sigterm()  # SIGTERM too cancels the episodes, so their sessions are deleted
    try:
        samples = run_agents(found[1], server, plan, sampling, args.agent_timeout, engine_version)
    except RuntimeError as e:
        print(f"{PROG}: {AGENT_FLAG.lstrip('-')} failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"{PROG}: interrupted; the episodes were cancelled and nothing was written", file=sys.stderr)
        return interrupt_exit_code(e)
    finally:
        restore_handlers(previous)
    for s in samples:
        print(episode_text(s, tokenizer))
    mean = sum(s.reward for s in samples) / len(samples)
    print(f"{PROG}: {len(samples)} episodes, mean reward {mean:.3f}")
    if out is not None:
        facts = {"model_fingerprint": str(info.get("model_fingerprint", "")), "n": args.n_samples_per_prompt}
        write_recording(out, samples, tokenizer, seed=args.seed, sampling=sampling, **facts)
        print(f"{PROG}: wrote {out} (grpolab check turns {out} --hf-checkpoint {model})")
    return 0


def episode_text(sample, tokenizer) -> str:
    """One episode as text: its reward, then each run of tokens (turn, source, count, text)."""
    from grpolab.core.turns.episode import KEY, response_sources

    lines = [f"sample {sample.index} (prompt row {sample.prompt_index}) reward {sample.reward:g}: "
             f"{(sample.metadata.get('messages') or [{}])[0].get('content', '')[:100]!r}"]  # fmt: skip
    sources = response_sources(sample.metadata[KEY])
    r = 0
    for (source, turn), run in groupby(sources):
        count = len(list(run))
        text = tokenizer.decode(sample.response_ids[r : r + count], skip_special_tokens=False)
        lines.append(f"  turn {turn} {source:<8} {count:4d} tokens  {text[:160]!r}")
        r += count
    return "\n".join(lines)


def write_recording(
    path: Path, samples: list, tokenizer, *, seed: int, sampling, model_fingerprint: str, n: int
) -> None:
    """The episodes as rollout 0 of a `.grz` recording (atomic)."""
    from grpolab.replay.fingerprints import chat_template_hash, tokenizer_fingerprint
    from grpolab.replay.recording import save_rollout

    path.parent.mkdir(parents=True, exist_ok=True)
    fingerprints = {"model_fingerprint": model_fingerprint, "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
                    "chat_template_hash": chat_template_hash(tokenizer)}  # fmt: skip
    sampler = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": 0,
        "max_new_tokens": sampling.max_new_tokens,
    }
    save_rollout(path, samples, rollout_id=0, weight_version=max((s.weight_version for s in samples), default=0),
                 run_seed=seed, sampler=sampler, fingerprints=fingerprints,
                 train_config={"n_samples_per_prompt": n, "apply_chat_template": True},
                 extra={"source": "grpolab agent run", "cwd": os.getcwd()})  # fmt: skip
