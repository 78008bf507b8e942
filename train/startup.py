"""Before the first rollout: join the world, open the run directory, build the run's parts, restore.

`open_run` joins the (torchrun) world, pins threads and seeds, and creates the run directory with
run.json first (rank 0 names it, every rank uses that name). `build_parts` builds what a run
holds from its config: datasets, the engine (engine/factory.py; none with `--debug-train-only`),
the trainer (none with `--debug-rollout-only`), the rollout path (rollout/: the engine, a fleet,
a recording or inject), the rollout recorder and the colocation schedule. `resume` restores what `--load` names (`checkpoint_to_resume` finds it). The loop
(loop.py) runs the rest.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpolab.core import checkpoint
from grpolab.core.actor import Actor
from grpolab.core.algorithms import advantages_always_zero
from grpolab.core.config import Config
from grpolab.core.data import PromptDataset, check_context_room, check_model_room
from grpolab.core.data_identity import DataIdentity, data_identity
from grpolab.core.dist import DistContext, all_gather_objects, barrier, init_distributed
from grpolab.core.engine.base import RestartsEngines, RolloutEngine, SamplingParams, capability
from grpolab.core.engine.factory import build_engine
from grpolab.core.lr_schedule import LRSchedule, resume_mismatch
from grpolab.core.metrics import PhaseTimer
from grpolab.core.model_files import max_position_embeddings, split_checkpoint
from grpolab.core.modeling import load_tokenizer, model_fingerprint, parse_dtype, stop_token_ids
from grpolab.core.seeding import seed_everything
from grpolab.core.shared_prefix import unsupported_reason
from grpolab.core.turns.tools import load_episode_function, load_tools
from grpolab.replay.fingerprints import chat_template_hash, tokenizer_fingerprint
from grpolab.replay.replayer import RolloutRecorder, RunIdentity
from grpolab.rollout import RolloutInputs, RolloutPath, build_rollout_path, load_reward
from grpolab.rollout.central import builds_engine
from grpolab.rollout.custom_generate import CustomGeneration
from grpolab.rundir.reader import read_run_meta
from grpolab.rundir.writer import RunDirectory, setup_console_logging
from grpolab.train.colocation import Colocation
from grpolab.train.train_phase import reference_needed

if TYPE_CHECKING:
    from grpolab.checkers.harness import CheckHarness

log = logging.getLogger("grpolab")


def open_run(config: Config, argv: list[str]) -> tuple[DistContext, RunDirectory]:
    """Join the world, pin threads and seeds, make the run directory (rank 0 writes run.json first).

    Sets `config.run.run_dir` (default `runs/<time>-s<seed>`, rank 0's name on every rank) and, with
    `--debug-deterministic-collective`, deterministic algorithms and one thread unless
    `--num-threads` says otherwise (CPU results differ between thread counts). With `--load`, a run
    directory that holds the same run (a crashed start of this command) is continued, not refused.

    Raises:
        FileExistsError: the run directory holds another run, or one that is still running.
    """
    run_cfg = config.run
    ctx = init_distributed(config.model.device, deterministic=run_cfg.debug_deterministic_collective)
    setup_console_logging(quiet=not ctx.is_primary)
    if run_cfg.debug_deterministic_collective:
        torch.use_deterministic_algorithms(True)
        run_cfg.num_threads = run_cfg.num_threads or 1
    if run_cfg.num_threads:
        torch.set_num_threads(run_cfg.num_threads)
    seed_everything(run_cfg.seed)
    path = run_cfg.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-s{run_cfg.seed}"
    run_cfg.run_dir = path = str(all_gather_objects(path, ctx)[0])  # rank 0 names the directory
    if ctx.is_primary:
        run_dir = RunDirectory.create(
            path,
            config=config.to_dict(),
            argv=argv,
            seed=run_cfg.seed,
            mirror_events_to=config.debug.save_debug_event_data,
            # run_id: names this run in every recording it writes (replays refuse mixed runs)
            extra={"world_size": ctx.world_size, "backend": ctx.backend, "run_id": uuid.uuid4().hex[:16]},
            continuing=config.checkpoint.load is not None,
        )
    barrier(ctx)
    if not ctx.is_primary:
        run_dir = RunDirectory(path, rank=ctx.rank)
    return ctx, run_dir


@dataclass(kw_only=True)
class RunParts:
    """What one run holds besides its counters; `engine` / `actor` are None where the run builds none."""

    fingerprint: str
    tokenizer: Any
    chat_template_unapplied: bool
    data: DataIdentity
    eval_sets: dict[str, PromptDataset]
    sampling: SamplingParams
    engine: RolloutEngine | None
    actor: Actor | None
    rollout_path: RolloutPath
    custom_reward: Any | None
    recorder: RolloutRecorder | None
    colocation: Colocation


def build_parts(config: Config, run_dir: RunDirectory, dist: DistContext, timer: PhaseTimer) -> RunParts:
    """Build datasets, engine, trainer, rollout path, recorder and colocation from `config`.

    Raises:
        ValueError / FileNotFoundError: bad model, data or reward settings, naming the flag.
    """
    cfg, debug = config, config.debug
    log.info(f"loading model {cfg.model.hf_checkpoint}: fingerprint and tokenizer")
    fingerprint = model_fingerprint(cfg.model.hf_checkpoint)
    tokenizer = load_tokenizer(cfg.model.hf_checkpoint)
    template_unapplied = _warn_unapplied_template(cfg, tokenizer, run_dir)
    if not debug.debug_rollout_only:
        _warn_cannot_learn(cfg, run_dir)
    dataset_kw = {
        "input_key": cfg.data.input_key,
        "label_key": cfg.data.label_key,
        "apply_chat_template": cfg.data.apply_chat_template,
    }
    tools = load_tools(cfg.agent)  # the tool loop's specs and executor, or None for single-turn rollouts
    dataset = PromptDataset(
        cfg.data.prompt_data, tokenizer, tools=tools.specs if tools else None, **dataset_kw
    )
    if cfg.agent.rollout_max_context_len is not None:
        check_context_room(dataset, cfg.agent.rollout_max_context_len)
    eval_sets = {
        name: PromptDataset(path, tokenizer, flag=f"--eval-prompt-data {name}", **dataset_kw)
        for name, path in cfg.eval.datasets
    }
    limit = max_position_embeddings(cfg.model.hf_checkpoint)  # None for a .gguf file: not checked
    if limit is not None:  # the template's tokens come on top of preflight's count
        where = f"max_position_embeddings in {split_checkpoint(cfg.model.hf_checkpoint)[0] / 'config.json'}"
        for data in (dataset, *eval_sets.values()):
            check_model_room(data, cfg.rollout.rollout_max_response_len, limit, where)
    for name, data in [("prompt data", dataset), *((f"eval data {n}", d) for n, d in eval_sets.items())]:
        log.info(f"{name}: {data.path} ({len(data)} rows)")
    engine = _build_engine(cfg) if builds_engine(cfg, dist) else None  # rollout/central.py
    actor = None if debug.debug_rollout_only else _build_actor(cfg, dist)
    if cfg.rollout.use_fault_tolerance and engine is not None and actor is not None:
        _attach_restarter(cfg, engine, actor)
    rollout = cfg.rollout
    sampling = SamplingParams(
        temperature=rollout.rollout_temperature,
        top_p=rollout.rollout_top_p,
        top_k=rollout.rollout_top_k,
        max_new_tokens=rollout.rollout_max_response_len,
        stop_token_ids=stop_token_ids(cfg.model.hf_checkpoint, tokenizer),
    )
    identity = _run_identity(cfg, tokenizer, fingerprint)
    custom_reward = load_reward(cfg)  # the --custom-rm-path function, or None for --rm-type
    rollout_path = build_rollout_path(
        RolloutInputs(
            config=cfg,
            engine=engine,
            dataset=dataset,
            sampling=sampling,
            identity=identity,
            run_dir=run_dir,
            timer=timer,
            dist=dist,
            custom_reward=custom_reward,
            tools=tools,
            custom=_custom_generation(cfg, fingerprint),
        )
    )
    recorder = None
    if debug.save_debug_rollout_data:
        sampler = {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}
        sampler["max_new_tokens"] = sampling.max_new_tokens
        recorder = RolloutRecorder(
            debug.save_debug_rollout_data,
            identity,
            run_seed=cfg.run.seed,
            sampler=sampler,
            run_id=str(read_run_meta(run_dir.path).raw.get("run_id") or ""),  # written by open_run
            run_dir=str(cfg.run.run_dir),
        )
    data = data_identity(
        dataset.path,
        num_rows=len(dataset),
        rollout_batch_size=rollout.rollout_batch_size,
        seed=cfg.run.seed,
        shuffle=cfg.data.rollout_shuffle,
        **dataset_kw,
    )
    run_dir.add_to_run_json(data_identity=data.to_dict())  # `grpolab diff` compares the data files
    return RunParts(
        fingerprint=fingerprint,
        tokenizer=tokenizer,
        chat_template_unapplied=template_unapplied,
        data=data,
        eval_sets=eval_sets,
        sampling=sampling,
        engine=engine,
        actor=actor,
        rollout_path=rollout_path,
        custom_reward=custom_reward,
        recorder=recorder,
        colocation=Colocation(cfg.colocate, engine=engine, actor=actor, timer=timer),
    )


def _warn_unapplied_template(cfg: Config, tokenizer: Any, run_dir: RunDirectory) -> bool:
    """Warn (console and a `warning` event) when the tokenizer has a chat template that the run does
    not apply (`--apply-chat-template` off); return whether that is the case."""
    if cfg.data.apply_chat_template or not getattr(tokenizer, "chat_template", None):
        return False
    model = cfg.model.hf_checkpoint
    message = (
        f"the tokenizer of --hf-checkpoint {model} has a chat template, but --apply-chat-template is off: "
        "prompts reach the model raw. An instruct model answers raw prompts with much higher -log-prob "
        f"per token and entropy (compare: grpolab check template --hf-checkpoint {model}); pass "
        "--apply-chat-template unless the prompts are already rendered"
    )
    log.warning(f"warning: {message}")
    run_dir.event("warning", code="chat_template_unapplied", message=message)
    return True


def _warn_cannot_learn(cfg: Config, run_dir: RunDirectory) -> None:
    """Warn (console and a `warning` event, code `advantages_always_zero`) when the advantage estimator
    gives every sample an advantage of 0 whatever the rewards (`algorithms.advantages_always_zero`:
    GRPO with groups of one sample), so the policy-gradient loss trains nothing."""
    algo, n = cfg.algorithm, cfg.rollout.n_samples_per_prompt
    std_normalize = not algo.disable_grpo_std_normalization
    if not advantages_always_zero(algo.advantage_estimator, n, std_normalize=std_normalize):
        return
    others = [
        term
        for term, on in (
            ("--use-kl-loss", algo.use_kl_loss and algo.kl_loss_coef != 0),
            ("--entropy-coef", algo.entropy_coef != 0),
        )
        if on
    ]
    tail = f"only {' and '.join(others)} can move the weights" if others else "train/grad_norm will stay 0"
    message = (
        f"--n-samples-per-prompt {n}: the {algo.advantage_estimator} advantage estimator gives every sample "
        f"an advantage of 0 with groups of {n} (a sample is its group's baseline), so the policy-gradient "
        f"loss trains nothing and {tail}; use --n-samples-per-prompt 2 or more"
    )
    log.warning(f"warning: {message}")
    run_dir.event("warning", code="advantages_always_zero", message=message)


def _custom_generation(cfg: Config, fingerprint: str) -> CustomGeneration | None:
    """The run's --custom-generate-function-path / --custom-agent-function-path function, or None."""
    found = load_episode_function(cfg.agent)
    return None if found is None else CustomGeneration(cfg, found[0], found[1], fingerprint)


def _build_engine(cfg: Config) -> RolloutEngine:
    model, kind = cfg.model, cfg.rollout.rollout_engine
    log.info(f"building the rollout engine: {kind}, {model.rollout_dtype} on {model.device}")
    return build_engine(cfg)


def _attach_restarter(cfg: Config, engine: RolloutEngine, actor: Actor) -> None:
    """--use-fault-tolerance: the fleet's engines restart with the trainer's weights (core/engine/restart.py)."""
    from grpolab.core.engine.restart import WeightSource

    fleet = capability(engine, RestartsEngines)
    assert fleet is not None  # --use-fault-tolerance needs --rollout-num-engines (RolloutConfig)
    source = WeightSource(named=actor.named_weights, buffer_bytes=cfg.colocate.update_weight_buffer_size)
    assert cfg.rollout.max_engine_restarts is not None  # set with --use-fault-tolerance (RolloutConfig)
    fleet.enable_fault_tolerance(source, max_restarts=cfg.rollout.max_engine_restarts)
    log.info(f"--use-fault-tolerance: an engine that exits is restarted (at most {cfg.rollout.max_engine_restarts} "
             "times), loaded with the trainer's weights and checked before it rejoins the router")  # fmt: skip


def _build_actor(cfg: Config, dist: DistContext) -> Actor:
    ranks = f", {dist.world_size} ranks (FSDP2)" if dist.world_size > 1 else ""
    log.info(f"building the trainer: {cfg.model.train_dtype} on {cfg.model.device}{ranks}")
    actor = Actor(
        cfg.model.hf_checkpoint,
        dtype=parse_dtype(cfg.model.train_dtype, "--train-dtype"),
        device=cfg.model.device,
        optimizer=cfg.optimizer,
        algorithm=cfg.algorithm,
        temperature=cfg.rollout.rollout_temperature,
        build_optimizer=not cfg.debug.debug_disable_optimizer,
        dist_ctx=dist,
        with_reference=reference_needed(cfg),  # no reference model when nothing reads it
        train_forward=cfg.model.train_forward,
        true_on_policy=cfg.model.true_on_policy_mode,
        schedule=cfg.lr_schedule(),
    )
    schedule = cfg.lr_schedule()
    if not cfg.debug.debug_disable_optimizer and (schedule.style != "constant" or schedule.warmup_iters):
        log.info(
            schedule.describe(cfg.rollout.num_rollout * cfg.steps_per_rollout)
        )  # a constant lr says nothing new
    forward = "padded"
    if actor.shared_prefix:
        forward = "shared-prefix (a prompt runs once for its samples in micro-batches where that pays)"
    elif cfg.model.train_forward == "auto":
        forward += f"; the packed forward does not run this model: {unsupported_reason(actor.model)}"
    log.info(f"the trainer's forward: {forward} (--train-forward {cfg.model.train_forward})")
    return actor


def _run_identity(cfg: Config, tokenizer: Any, fingerprint: str) -> RunIdentity:
    """What a recording must share with this run to be replayed into it."""
    return RunIdentity(
        fingerprints={
            "model_fingerprint": fingerprint,
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "chat_template_hash": chat_template_hash(tokenizer),
        },
        # what changes the training computation on the same samples
        train_config={
            "rollout_temperature": cfg.rollout.rollout_temperature,
            "n_samples_per_prompt": cfg.rollout.n_samples_per_prompt,
            "apply_chat_template": cfg.data.apply_chat_template,
        },
    )


def checkpoint_to_resume(config: Config, actor: Actor | None, run_dir: RunDirectory) -> Path | None:
    """The checkpoint directory `--load` resumes from (its latest), or None: no `--load`, or none there yet.

    (`--save` holding another run's checkpoints is refused before the run directory is made:
    `launch.check_on_this_machine`.)

    Raises:
        ValueError: `--load` with `--debug-rollout-only` (no trainer to restore into).
    """
    load = config.checkpoint.load
    if load is None:
        return None
    if actor is None:
        raise ValueError(
            "--load: --debug-rollout-only builds no trainer, so there is nothing to restore a checkpoint into"
        )
    latest = checkpoint.find_latest(load)
    if run_dir.rank == 0:  # one rank cleans what killed saves left (logged)
        checkpoint.remove_stale_temps(load if latest is None else latest.parent)
    if latest is None:
        log.info(f"--load {load}: no checkpoint there yet, starting fresh from --hf-checkpoint")
        run_dir.resumed(found=False, load=str(load), next_rollout_id=0, first_step=0)
        return None
    return latest


def _check_schedule(config: Config, actor: Actor, restored: checkpoint.TrainerState, path: Path) -> None:
    """The checkpoint's stamped lr schedule continues as this run's (core/lr_schedule.resume_mismatch); a
    checkpoint saved before schedules were stamped is taken as constant at this --lr, with a warning.

    Raises:
        checkpoint.CheckpointError: the schedules disagree at or after the next step (both lrs named).
    """
    schedule = config.lr_schedule()
    steps = actor.scheduler.last_epoch if actor.scheduler is not None else 0
    saved = restored.lr_schedule
    if saved is None:
        log.warning(f"warning: --load {path} was saved before lr schedules were stamped: it is taken as trained at "
                    f"a constant --lr {schedule.lr:g}")  # fmt: skip
        saved = LRSchedule(style="constant", lr=schedule.lr, decay_iters=schedule.decay_iters).as_dict()
    why = resume_mismatch(saved, restored.next_lr, schedule, steps)
    if why is not None:
        raise checkpoint.CheckpointError(
            f"--load {path}: {why}; resume with the schedule flags it was saved with"
        )


def resume(
    config: Config,
    run_dir: RunDirectory,
    harness: CheckHarness,
    actor: Actor | None,
    fingerprint: str,
    data: DataIdentity,
) -> checkpoint.TrainerState | None:
    """Restore `--load`'s latest checkpoint into `actor` (this run's model `fingerprint`, prompt
    stream `data`, see `RunParts`) and write the `resume` event.

    Returns:
        The restored counters, or None: no `--load`, or no checkpoint there yet (a fresh start).

    Raises:
        ValueError: see `checkpoint_to_resume`; checkpoint.CheckpointError (a ValueError): the
            checkpoint is of another model, of other data (without `--allow-data-change`) or unreadable.
    """
    latest = checkpoint_to_resume(config, actor, run_dir)
    if latest is None or actor is None:
        return None
    restored = checkpoint.load_checkpoint(
        latest,
        actor,
        model_fingerprint=fingerprint,
        data=data,
        allow_data_change=config.checkpoint.allow_data_change,
    )
    _check_schedule(config, actor, restored, latest)
    harness.after_load(latest, lambda: list(actor.local_named_weights()))
    n = restored.next_rollout_id
    log.info(f"--load {config.checkpoint.load}: resumed from {latest.name}, continuing at rollout {n}")
    first_step = n * config.steps_per_rollout if n < config.rollout.num_rollout else None
    run_dir.resumed(found=True, path=str(latest), next_rollout_id=n, first_step=first_step)
    return restored
