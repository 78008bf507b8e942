"""`grpolab train`'s inputs checked before any run directory exists and before transformers is imported.

A bad flag or input file should cost a second, not a model load, and leave no failed run folder
under runs/. `check_inputs` checks, in this order: the device, every output path
(run dir, checkpoints, recording/grad-norm/event folders) and the checkpoint paths
(`launch.check_on_this_machine`), the rollout engine kind, the model folder (config, tokenizer and
whole weights, `model_files.check_model`), that `--rollout-decode-path grpolab` names a model the
decoder runs (`decode_support.check_decode_path`), `--train-forward shared-prefix` one the packed
forward runs (`check_train_forward`), `--rollout-max-response-len` against the model's
`max_position_embeddings` (`check_response_length`), that every `--ci-ft-test-actions` item can
fire (`faults.check_reachable`), the trainer's padding id inside the vocabulary
(`check_padding_id`), a chat template where `--apply-chat-template` needs one
(`check_chat_template`), every prompt file (`--prompt-data` and each
`--eval-prompt-data NAME PATH`: readable, UTF-8 JSON lines or parquet, rows with the prompt and
label keys), the reward (`--custom-rm-path` imports and is callable, else `--rm-type` is
registered) and the monitoring flags (`monitor.check_monitoring`: wandb / tensorboard import when
asked for, `--custom-rollout-log-function-path` imports and takes Miles' five arguments) and the
profiling flags (`monitor.checks`: every `--profile-ranks` rank exists in the world, the
`--memory-recorder` can run here), and last the rollout servers (`check_rollout_servers`: the router
at `--sglang-router-ip`/`--sglang-router-port` answers as an sglang-router with engines, or the router
`--rollout-num-engines` launches can start on `--sglang-router-port`). The config itself (ranges,
finite numbers) was checked when it was built.

Cost: a .jsonl prompt file is parsed here and again when the run builds its dataset (GSM8K's train
split, 4 MB and 7473 rows, takes about 0.08 s); a parquet file is only checked for its magic bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import grpolab.checkers.grad_norm  # noqa: F401  (registers its value checks, as faults and paths do)
import grpolab.replay.paths  # noqa: F401  (config validation runs them: core/config/validation.py)
from grpolab.checkers.faults import check_actions_can_fire, check_reachable, parse_fault_actions
from grpolab.core.data import check_rows, prompt_file, read_rows_and_lines
from grpolab.core.model_files import (
    check_model,
    has_chat_template,
    max_position_embeddings,
    model_config,
    padding_id_problem,
    split_checkpoint,
)
from grpolab.core.turns.tools import load_episode_function, load_tools
from grpolab.monitor.checks import check_profiling_start
from grpolab.monitor.hub import check_monitoring
from grpolab.train.launch import check_on_this_machine

if TYPE_CHECKING:
    from grpolab.core.config import Config


def check_inputs(
    config: Config, *, world_size: int = 1, rank: int | None = None, launching: bool = True
) -> None:
    """Check what `config` names on this machine, in its files and on the network (see the module docstring).

    `world_size`: the ranks the run will have (`launch.planned_world_size`: --nproc-per-node or
    torchrun's WORLD_SIZE; 1 otherwise), for `--profile-ranks`. `rank`: this process's rank (None: torchrun's
    RANK, 0 outside torchrun and in the launcher of `--nproc-per-node`); the rollout servers are checked
    on rank 0 only (`check_rollout_servers`). `launching` False (`grpolab estimate memory`: no run
    directory made, no server reached) skips `--run-dir` and the rollout servers.
    Imports no torch or transformers; imports the user's `--custom-rm-path` and tool modules.

    Raises:
        ValueError / FileNotFoundError: naming the flag and the file or address (`grpolab train` exits 2).
    """
    from grpolab.core.engine.decode_support import check_decode_path, check_train_forward
    from grpolab.core.engine.factory import ENGINES

    check_on_this_machine(config)
    if launching:
        check_run_dir(config)
    ENGINES.get(config.rollout.rollout_engine)  # an unknown kind lists the known ones
    check_model(config.model.hf_checkpoint)
    if config.rollout.sglang_router_ip is None:  # engines this run builds or launches load the model
        check_decode_path(
            config.model.rollout_decode_path, config.model.hf_checkpoint, "--rollout-decode-path"
        )
    check_train_forward(config.model.train_forward, config.model.hf_checkpoint)
    check_response_length(config)
    if config.ci.ci_ft_test_actions is not None:
        actions = parse_fault_actions(config.ci.ci_ft_test_actions)
        check_reachable(actions, config.rollout.num_rollout)
        check_actions_can_fire(actions, launches_engines=config.rollout.rollout_num_engines > 0,
                               world_size=world_size, trains=not config.debug.debug_rollout_only)  # fmt: skip
    check_padding_id(config)
    check_chat_template(config)
    check_prompt_data(config)
    check_reward(config)
    check_dynamic_sampling(config)
    check_fault_tolerance(config, world_size)
    load_tools(config.agent)  # --generate-execute-tool-function-path imports, its specs are tool specs
    load_episode_function(config.agent)  # --custom-generate-function-path / --custom-agent-function-path
    check_monitoring(config)  # --use-wandb / --use-tensorboard import, --custom-rollout-log-function-path
    check_profiling_start(config, world_size=world_size)  # --profile-ranks, --memory-recorder
    if launching and (int(os.environ.get("RANK", "0")) if rank is None else rank) == 0:
        check_rollout_servers(config)  # last: a router that does not answer may take seconds


def check_run_dir(config: Config) -> None:
    """A new run's `--run-dir` does not hold another run (`rundir.continuation.new_run_refusal`); a start
    with `--load` may continue its own run, which `RunDirectory.create` checks against run.json.

    Raises:
        ValueError: naming --run-dir and what to do instead.
    """
    from grpolab.rundir.continuation import new_run_refusal

    if config.run.run_dir is None or config.checkpoint.load is not None:
        return
    refusal = new_run_refusal(Path(config.run.run_dir))
    if refusal is not None:
        raise ValueError(refusal)


def check_rollout_servers(config: Config) -> None:
    """The rollout servers the run uses can be reached or started: with `--sglang-router-ip`, the router
    there answers `GET /workers` as an sglang-router with at least one engine (`factory.router_engine_urls`);
    with `--rollout-num-engines`, sglang-router is installed and `--sglang-router-port` is free
    (`fleet.check_can_launch`). Nothing for the in-process engine.

    Only rank 0 builds a server run's engine (rollout/central.py) and calls this: the port check
    binds the port for an instant, so two ranks checking at once could each find it taken. The same
    functions check again when the engine is built (a fleet can go, a port be taken, in between), so
    each message has one source. Engines' model fingerprints are compared then, not here (that needs
    transformers).

    Raises:
        ValueError: naming the flag, the address and what was expected (`fleet.PortInUseError` for a
            taken port).
    """
    from grpolab.core.engine.factory import router_engine_urls, router_url
    from grpolab.core.engine.fleet import check_can_launch

    rollout = config.rollout
    if rollout.rollout_num_engines:
        check_can_launch(rollout.sglang_router_port)
    elif rollout.sglang_router_ip is not None:
        assert rollout.sglang_router_port is not None  # RolloutConfig requires it with the ip
        router_engine_urls(router_url(rollout.sglang_router_ip, rollout.sglang_router_port))


def check_response_length(config: Config) -> None:
    """`--rollout-max-response-len` leaves room for a prompt within the model's `max_position_embeddings`
    (config.json; not known here for a .gguf file, which is then not checked).

    The response alone is checked here; `check_prompt_lengths` adds the longest prompt. Without it a
    cap of 10^8 tokens got the process OOM-killed (exit 137) and one of 2000 on a 512-position model
    ran without a word.

    Raises:
        ValueError: naming the flag, its value, the model's limit and config.json.
    """
    limit = max_position_embeddings(config.model.hf_checkpoint)
    length = config.rollout.rollout_max_response_len
    if limit is not None and length >= limit:
        raise ValueError(
            f"--rollout-max-response-len {length}: the response alone reaches the model's limit of {limit} "
            f"tokens for prompt + response (max_position_embeddings in {config.model.hf_checkpoint}"
            f"/config.json); use at most {limit - 1} minus the longest prompt's length"
        )


def check_padding_id(config: Config) -> None:
    """The id the trainer pads with (`model_files.padding_id`) indexes the model's embedding.

    Raises:
        ValueError: naming --hf-checkpoint's config.json, the id and how to fix it.
    """
    model = model_config(config.model.hf_checkpoint)
    problem = None if model is None else padding_id_problem(model)
    if problem:
        raise ValueError(f"--hf-checkpoint: {config.model.hf_checkpoint}/config.json: {problem}")


def check_chat_template(config: Config) -> None:
    """With `--apply-chat-template` (the built-in prompt set's default), the model directory's tokenizer
    has a chat template (`model_files.has_chat_template`; a .gguf carries its own and is not checked).

    Raises:
        ValueError: naming the flag, the checkpoint and how to turn the template off.
    """
    if not config.data.apply_chat_template:
        return
    directory, gguf = split_checkpoint(config.model.hf_checkpoint)
    if gguf is None and not has_chat_template(directory):
        raise ValueError(
            f"--apply-chat-template: the tokenizer of --hf-checkpoint {config.model.hf_checkpoint} has no chat "
            "template (no chat_template in tokenizer_config.json, no chat_template.jinja); add one, or pass "
            "--no-apply-chat-template to feed the prompts as they are"
        )


def check_prompt_data(config: Config) -> None:
    """Read and check `--prompt-data` and every `--eval-prompt-data` file (messages name their flag).

    Raises:
        ValueError / FileNotFoundError: from `data.prompt_file`, `data.read_rows_and_lines` or `data.check_rows`.
    """
    data = config.data
    files = [("--prompt-data", data.prompt_data)]
    files += [(f"--eval-prompt-data {name}", path) for name, path in config.eval.datasets]
    for flag, path in files:
        assert path is not None  # DataConfig resolves the default file
        if prompt_file(path, flag).suffix == ".parquet":
            continue  # reading it needs pyarrow; the run reads and checks it when it builds the dataset
        rows, lines = read_rows_and_lines(path, flag)
        check_rows(
            rows,
            path,
            input_key=data.input_key,
            label_key=data.label_key,
            apply_chat_template=bool(data.apply_chat_template),
            flag=flag,
            lines=lines,
        )
        check_prompt_lengths(config, flag, path, rows, lines)


def check_prompt_lengths(config: Config, flag: str, path: str, rows: list[dict], lines: list[int]) -> None:
    """The longest prompt of a .jsonl file plus `--rollout-max-response-len` fits the model's
    `max_position_embeddings` (config.json).

    Prompts are counted with tokenizer.json (the `tokenizers` library, no transformers) as raw text,
    without special tokens or the chat template, which only add tokens: a lower bound, so a refused
    run would certainly overflow and a borderline one is not refused here: train/startup.py checks again
    on the prompts as the rollout sends them (core/data.check_model_room). A .gguf file or a model without
    tokenizer.json is not checked. Only prompts that could overflow are tokenized: a BPE, WordPiece or
    Unigram token covers at least one byte of the normalized text (byte fallback: exactly one), so a
    prompt has at most its normalized UTF-8 length + 4 tokens (a prepended "▁" is 3 bytes). Tokenizing
    all 7473 rows of a GSM8K-sized file takes ~2.4 s on a loaded 2-core machine; none of them needs it
    with the tiny model's 512 positions and the default 32-token cap.

    Raises:
        ValueError: naming --rollout-max-response-len, the file, the prompt's line and the limit.
    """
    limit = max_position_embeddings(config.model.hf_checkpoint)
    directory, _ = split_checkpoint(config.model.hf_checkpoint)
    if limit is None or not (directory / "tokenizer.json").is_file():
        return
    from tokenizers import Tokenizer

    key = config.data.input_key
    texts = [r[key] if isinstance(r[key], str) else json.dumps(r[key], ensure_ascii=False) for r in rows]
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()  # a tokenizer.json may pad a batch to its longest or truncate: count each prompt
    tokenizer.no_truncation()
    response = config.rollout.rollout_max_response_len
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer else str
    suspects = [i for i, text in enumerate(texts) if len(normalize(text).encode()) + 4 + response > limit]
    if not suspects:
        return
    counted = tokenizer.encode_batch([texts[i] for i in suspects], add_special_tokens=False)
    tokens, longest = max((len(e.ids), i) for e, i in zip(counted, suspects))
    where = f"{path} line {lines[longest]}"
    model_limit = (
        f"the model's limit of {limit} tokens (max_position_embeddings in {directory / 'config.json'})"
    )
    if tokens >= limit:
        raise ValueError(
            f"{flag}: {where} is a prompt of {tokens} tokens before any chat template, at or past "
            f"{model_limit}; shorten it or drop that row"
        )
    if tokens + response > limit:
        raise ValueError(
            f"--rollout-max-response-len {response}: the longest prompt of {flag} ({where}) is {tokens} "
            f"tokens before any chat template, and {tokens} + {response} exceeds {model_limit}; use at most "
            f"{limit - tokens} less the chat template's tokens"
        )


def check_dynamic_sampling(config: Config) -> None:
    """`--dynamic-sampling-filter-path` imports a plain function (on any number of ranks: rank 0 fills
    every rollout and sends it to the others, rollout/dynamic_path.py).

    Raises:
        ValueError: naming the flag (from `rollout.filters.load_filter`).
    """
    from grpolab.rollout.filters import load_filter

    path = config.dynamic_sampling.dynamic_sampling_filter_path
    if path is not None:
        load_filter(path)


def check_fault_tolerance(config: Config, world_size: int) -> None:
    """`--use-fault-tolerance` runs where a restarted engine can get the trainer's weights: one rank (rank 0
    alone reads them while the others generate nothing to wait on; on more ranks reading them is a
    collective) and a trainer (`--debug-rollout-only` has none).

    Raises:
        ValueError: naming the flag and why.
    """
    if not config.rollout.use_fault_tolerance:
        return
    if world_size > 1:
        raise ValueError(f"--use-fault-tolerance runs on one rank: a restarted engine is loaded with rank 0's "
                         f"weights, which {world_size} ranks gather together (drop --nproc-per-node)")  # fmt: skip
    if config.debug.debug_rollout_only:
        raise ValueError("--use-fault-tolerance loads a restarted engine with the trainer's weights, and "
                         "--debug-rollout-only builds no trainer")  # fmt: skip


def check_reward(config: Config) -> None:
    """`--custom-rm-path` imports and names a callable; else `--rm-type` is a built-in reward.

    Raises:
        ValueError: naming the flag (from `rewards.load_custom_reward` / `rewards.get_reward_fn`).
    """
    from grpolab.core import rewards

    reward = config.reward
    if reward.custom_rm_path:
        rewards.load_custom_reward(reward.custom_rm_path)
    else:
        assert reward.rm_type is not None  # RewardConfig requires one of the two
        rewards.get_reward_fn(reward.rm_type)
