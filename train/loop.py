"""One colocated GRPO run: rollout → rewards → advantages → record → log-probs → train → save → sync.

What it computes (nanochat style): GRPO with group-normalized rewards (no epsilon, see
algorithms.grpo_advantages), the PPO clipped surrogate against the trainer's own pre-update
log-probs, sample-mean loss by default (token mean with `--calculate-per-token-loss`), KL to the
frozen initial weights only with `--use-kl-loss`. Engine and trainer take turns on one device
(colocation.py); the engine holds its own copy of the weights and receives the trainer's at the
end of every step, after the checkpoint of that step is saved (and once before the first rollout).

Debug modes cut the loop in half (Miles debugging page): `--debug-rollout-only` builds no
trainer, `--load-debug-rollout-data` builds no engine and trains on recordings,
`--ci-inject-rollout-data-path` generates, compares with a recording and trains on the recording:
each is a rollout path (rollout/), and the loop reads the same whichever runs. `--ci-test` checkers
run at their points (checkers/harness.py). What is built for a run, and how the run directory is
opened, is startup.py.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grpolab.checkers.faults import FaultAction, FaultInjector, parse_fault_actions
from grpolab.checkers.harness import CheckHarness
from grpolab.core import checkpoint
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.dist import DistContext, all_gather_objects, shutdown
from grpolab.core.evaluation import evaluate
from grpolab.core.interrupts import hold_interrupts, interrupt_on_sigterm, restore_handlers
from grpolab.core.metrics import PhaseTimer, RunSummary
from grpolab.core.save_dir import acquire_save_lock, release_save_lock
from grpolab.core.weight_sync import sync_weights
from grpolab.diagnose.gpu import start_run_sampler
from grpolab.monitor import open_monitor
from grpolab.monitor.profiler import RunProfiling
from grpolab.replay.paths import eval_rollout_id
from grpolab.rollout import assign_advantages, candidates_rollout_id, check_recordings, planned_rollout_ids
from grpolab.rollout.central import join_weight_sync, joins_engine_of_rank_zero
from grpolab.rundir.writer import RunDirectory
from grpolab.train.engine_faults import kill_engine, restart_metrics, stop_engine
from grpolab.train.preflight import check_inputs
from grpolab.train.run_end import close_engine, end_run_with_error
from grpolab.train.startup import build_parts, open_run, resume
from grpolab.train.step_report import StepReporter
from grpolab.train.train_phase import TrainPhase

log = logging.getLogger("grpolab")


@dataclass
class RunState:
    """Counters that move with the run and are checkpointed."""

    next_rollout_id: int = 0
    weight_version: int = 0
    resumed: bool = False
    engine_version: int | None = None  # acknowledged at the last sync; None before one (not checkpointed)


class GRPORun:
    """Everything one run holds; `run()` executes it. Build with `GRPORun.create(config, argv)`."""

    def __init__(self, config: Config, run_dir: RunDirectory, dist_ctx: DistContext | None = None) -> None:
        summary = RunSummary()  # its clock counts the loading too
        self.cfg, self.run_dir = config, run_dir
        self.dist = dist_ctx or DistContext()
        self.timer, self.state = PhaseTimer(), RunState()
        self.harness = CheckHarness(config, run_dir)
        self.faults = FaultInjector(
            parse_fault_actions(config.ci.ci_ft_test_actions or "[]"),
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            on_stop_engine=None
            if config.debug.debug_train_only
            else lambda: stop_engine(self.engine, run_dir),
            on_kill_engine=(lambda when_queued: kill_engine(self.engine, when_queued))
            if config.rollout.rollout_num_engines
            else None,
            on_fire=self._record_fault,
        )
        parts = build_parts(config, run_dir, self.dist, self.timer)
        self.fingerprint, self.tokenizer, self.data = parts.fingerprint, parts.tokenizer, parts.data
        self.eval_sets, self.sampling = parts.eval_sets, parts.sampling
        self.harness.know_run(
            vocab_size=len(parts.tokenizer),
            chat_template_unapplied=parts.chat_template_unapplied,
            filters_support=parts.sampling.filters_support,
            tokenizer=parts.tokenizer,
        )
        # every rollout/sync/eval call goes through the engine's client (fails after --engine-failure-timeout)
        self.engine, self.actor, self.colocation = parts.engine, parts.actor, parts.colocation
        self.rollout_path, self.recorder = parts.rollout_path, parts.recorder
        self.custom_reward = parts.custom_reward
        self.joins_sync = joins_engine_of_rank_zero(config, self.dist)  # rollout/central.py
        self.profiling = RunProfiling(config, run_dir, self.dist.rank, self.actor)  # torch.profiler, memory
        # wandb / TensorBoard / --custom-rollout-log-function-path (rank 0); closed by run_dir.finish
        self.monitor = open_monitor(config, run_dir, primary=self.dist.is_primary)
        self.reporter = StepReporter(run_dir, self.monitor, self.timer, config.rollout.num_rollout, summary)
        self.train_phase = TrainPhase(  # log-probs, the rollout line, the optimizer steps (train_phase.py)
            config,
            self.actor,
            harness=self.harness,
            faults=self.faults,
            reporter=self.reporter,
            timer=self.timer,
            colocation=self.colocation,
            run_dir=run_dir,
            dist=self.dist,
            gather=self._gather,
        )

    # ------------------------------------------------------------------ setup
    @classmethod
    def create(cls, config: Config, argv: list[str]) -> GRPORun:
        """Join the world, pin threads and seeds, make the run directory (run.json first), build engine and actor."""
        ctx, run_dir = open_run(config, argv)
        run: GRPORun | None = None
        try:
            if ctx.is_primary and config.checkpoint.save is not None:  # rank 0 writes the checkpoints
                # every rank passed preflight's live_writer check before open_run's rendezvous, so
                # this lock never refuses the run's own ranks; released where run() ends
                acquire_save_lock(config.checkpoint.save, run_dir.path)
            if config.rollout.rollout_batch_size % ctx.world_size:
                raise ValueError(
                    f"--rollout-batch-size {config.rollout.rollout_batch_size} must be divisible by the world size {ctx.world_size}"
                )
            RunProfiling.check(config, world_size=ctx.world_size)
            run = cls(config, run_dir, ctx)
            run._maybe_resume()
            run._check_recordings()
        except BaseException as e:
            close_engine(run.engine if run is not None else None)
            _release_save_lock(config)
            end_run_with_error(run_dir, e, None)
            raise
        return run

    def _maybe_resume(self) -> None:
        restored = resume(self.cfg, self.run_dir, self.harness, self.actor, self.fingerprint, self.data)
        if restored is not None:
            version = restored.weight_version - 1
            self.state = RunState(
                next_rollout_id=restored.next_rollout_id, weight_version=version, resumed=True
            )
            if hasattr(self.rollout_path, "data_position"):  # dynamic sampling: the prompt stream's position
                self.rollout_path.data_position = restored.data_position
            elif (saved_b := (restored.data_identity or {}).get("rollout_batch_size")) is not None and (
                restored.data_position != restored.next_rollout_id * saved_b
            ):  # a checkpoint without a data identity predates dynamic sampling
                raise ValueError(
                    f"--load: the checkpoint's prompt stream is at position {restored.data_position}, not rollout "
                    f"{restored.next_rollout_id} x its --rollout-batch-size {saved_b}: it "
                    "was saved by a run that drew prompts by dynamic sampling; resume with its "
                    "--dynamic-sampling-filter-path, or this run would train on prompts it already drew"
                )

    def _check_recordings(self) -> None:
        """Before the first rollout: recordings to read exist; recordings to write replace no other run's."""
        start, evals = self.state.next_rollout_id, self.engine is not None
        for path in check_recordings(self.cfg, self.rollout_path, self.recorder, start=start, evals=evals):
            log.info(f"warning: --overwrite-debug-rollout-data: this run will replace {path}")
            self.run_dir.event("recording_replaced", path=str(path))

    # ------------------------------------------------------------------ the loop
    def run(self) -> Path:
        """Run the remaining rollouts; return the run directory. The last event is always `status`."""
        cfg = self.cfg
        previous_handlers = interrupt_on_sigterm()
        interval = cfg.run.gpu_sample_interval
        gpu_sampler = start_run_sampler(self.run_dir.path, interval) if self.dist.is_primary else None
        try:
            log.info(f"grpolab train: run directory {self.run_dir.path}")
            if self.state.resumed and self.state.next_rollout_id >= cfg.rollout.num_rollout:
                return self._nothing_left()
            if self.joins_sync:  # rank 0 checks its engine's weights (--ci-test); this rank only gathers
                self._sync_weights()
            else:
                self.harness.first_sync(self.engine, self._sync_weights, resumed=self.state.resumed)
            self.run_dir.event("startup_sync", **self.timer.pop())
            ids = planned_rollout_ids(
                self.state.next_rollout_id, cfg.rollout.num_rollout, cfg.debug.debug_exit_after_rollout
            )
            for rollout_id in ids:
                with self.profiling.rollout_step(rollout_id):
                    if self._eval_due(rollout_id):
                        self.evaluate(rollout_id)
                    self.step(rollout_id)
                exit_after = cfg.debug.debug_exit_after_rollout
                if exit_after is not None and rollout_id >= exit_after:
                    log.info(f"--debug-exit-after-rollout {exit_after}: stopping after rollout {rollout_id}")
                    break
            if cfg.eval.eval_interval is not None and self.engine is not None:
                self.evaluate(self.state.next_rollout_id)
            if self.actor is not None and cfg.ci.ci_save_model_hash:
                # a collective on multi-rank runs: every rank gathers
                self.harness.final_weights(list(self.actor.named_weights()))
            self.harness.finish()
            for action in self.faults.pending():
                log.info(
                    f"warning: --ci-ft-test-actions: {action.action} at rollout {action.at_rollout} never fired"
                )
        except BaseException as e:
            hold_interrupts()  # a second SIGTERM/SIGINT must not cut the status write short
            restart_metrics(self.engine, self.run_dir)  # --use-fault-tolerance: restarts not yet reported
            self.profiling.on_error(e, self.state.next_rollout_id)  # a CUDA OOM dumps the torch snapshot
            end_run_with_error(self.run_dir, e, self.state.next_rollout_id)
            raise
        finally:
            self.profiling.close(self.state.next_rollout_id)
            if gpu_sampler is not None:
                gpu_sampler.stop()
            close_engine(self.engine)  # engine servers the run launched end with it, however it ends
            _release_save_lock(cfg)
            restore_handlers(previous_handlers)
        self.run_dir.heartbeat("finished", self.state.next_rollout_id)  # left normally (diagnose hang)
        untrained = self.reporter.summary.untrained_warning()  # said again where the run ends
        if untrained is not None:
            log.warning(f"warning: {untrained}")
            self.run_dir.event("warning", code="grad_norm_always_zero", message=untrained)
        for line in self.reporter.summary.lines(self.run_dir.path, cfg.rollout.num_rollout):
            log.info(line)
        self.run_dir.finish("finished", rollouts=self.state.next_rollout_id)
        shutdown(self.dist)
        return self.run_dir.path

    def _nothing_left(self) -> Path:
        """End a run resumed from a checkpoint of its last rollout: no rollout, status finished."""
        n, total = self.state.next_rollout_id, self.cfg.rollout.num_rollout
        log.info(
            f"--load {self.cfg.checkpoint.load}: the checkpoint is at rollout {n} of --num-rollout {total}; "
            "nothing left to train"
        )
        self.run_dir.event("nothing_to_train", next_rollout_id=n, num_rollout=total)
        self.run_dir.heartbeat("finished", n)  # left normally, as at the end of run()
        self.run_dir.finish("finished", rollouts=n)
        shutdown(self.dist)
        return self.run_dir.path

    def step(self, rollout_id: int) -> None:
        """One GRPO iteration, phase by phase (the table of contents of a step)."""
        start = time.perf_counter()
        samples = self._rollout(rollout_id)  # this rank's share
        samples = self.rollout_path.rewards(rollout_id, samples)  # the samples to train on, scored
        with self.timer("reward"):
            assign_advantages(self.cfg, samples)
        everyone = self._record(rollout_id, samples)  # the whole rollout, for metrics, checks and recordings
        extra = (
            self.rollout_path.extra_metrics(rollout_id) if hasattr(self.rollout_path, "extra_metrics") else {}
        )
        line, steps = self.train_phase.run(
            rollout_id, samples, everyone, extra
        )  # log-probs, rollout line, train
        self.profiling.after_train(rollout_id)  # --record-memory-history: the snapshot after rollout N-1
        self.state.next_rollout_id = rollout_id + 1
        self._save(rollout_id)
        self._sync(rollout_id)
        self.reporter.report(rollout_id, start, line, steps, self.engine)
        self.faults.maybe_fire("end_of_rollout", rollout_id)

    # ------------------------------------------------------------------ the phases of a step
    def _rollout(self, rollout_id: int) -> list[Sample]:
        """This rank's samples, generated (or replayed); then the engine's memory goes to the trainer."""
        self.run_dir.heartbeat("rollout", rollout_id)
        self.faults.maybe_fire("rollout", rollout_id)
        samples = self.rollout_path.rollout(rollout_id)
        if self.rollout_path.generates and self.state.engine_version is not None:  # generated, synced
            self.harness.after_generate(rollout_id, samples, self.state.engine_version, self._gather)
        self.colocation.after_rollout()
        return samples

    def _record(self, rollout_id: int, samples: list[Sample]) -> list[Sample]:
        """Gather the whole rollout, guard its rewards and advantages, save it (`--save-debug-rollout-data`)."""
        everyone = self._gather(samples)
        self.harness.after_advantages(rollout_id, everyone)
        if self.recorder is not None and self.dist.is_primary:
            candidates = getattr(self.rollout_path, "candidates", None)  # dynamic sampling's every group
            for rid, kept, event in [(rollout_id, everyone, "rollout_recorded")] + [
                (candidates_rollout_id(rollout_id), candidates, "candidates_recorded")
            ] * bool(candidates):
                with self.timer("save_rollout_data"):
                    path, size = self.recorder.save(
                        kept, rollout_id=rid, weight_version=self.state.weight_version
                    )
                self.run_dir.event(event, rollout_id=rollout_id, path=str(path), bytes=size)
        return everyone

    def _save(self, rollout_id: int) -> None:
        """`--save`: a checkpoint after the last rollout and every `--save-interval` rollouts."""
        ckpt, actor = self.cfg.checkpoint, self.actor
        if actor is None or ckpt.save is None:
            return
        num, exit_after = self.cfg.rollout.num_rollout, self.cfg.debug.debug_exit_after_rollout
        if not checkpoint.save_due(
            rollout_id, num_rollout=num, save_interval=ckpt.save_interval, exit_after=exit_after
        ):
            return
        nxt, schedule = self.state.next_rollout_id, self.cfg.lr_schedule()
        state = checkpoint.TrainerState(
            next_rollout_id=nxt,
            data_position=getattr(self.rollout_path, "data_position", None)
            or nxt * self.cfg.rollout.rollout_batch_size,
            weight_version=self.state.weight_version + 1,
            model_fingerprint=self.fingerprint,
            data_identity=self.data.to_dict(),
            hf_checkpoint=self.cfg.model.hf_checkpoint,
            lr_schedule=schedule.as_dict(),
            next_lr=schedule.lr_at(actor.scheduler.last_epoch if actor.scheduler else 0),
        )
        with self.timer("save_model"):
            start = time.perf_counter()
            path = checkpoint.save_checkpoint(ckpt.save, actor, state)
            seconds = time.perf_counter() - start
            self.harness.after_checkpoint(path, lambda: list(actor.local_named_weights()))
        size = checkpoint.directory_bytes(path) if self.dist.is_primary else 0
        log.info(f"saved checkpoint {path.name} to {ckpt.save} ({size / 1e6:.1f} MB, {seconds:.1f} s)")
        self.run_dir.event("checkpoint", rollout_id=rollout_id, path=str(path), bytes=size, seconds=seconds)

    def _sync(self, rollout_id: int) -> None:
        """The device goes back to the engine, which receives the trainer's new weights."""
        self.colocation.before_sync()
        self.run_dir.heartbeat("update_weights", rollout_id)
        if self.faults.maybe_fire("weight_sync", rollout_id) and self.state.engine_version is not None:
            self.state.weight_version = self.state.engine_version = self.state.weight_version + 1  # lost
            return
        self._sync_weights()

    # ------------------------------------------------------------------ between steps
    def evaluate(self, rollout_id: int) -> None:
        """`eval N:` line on the held-out sets with the engine's current weights."""
        if self.engine is None or not self.dist.is_primary:
            return  # train-only: no engine to evaluate with (Miles skips eval the same way); rank 0 evaluates
        cfg = self.cfg
        self.run_dir.heartbeat("eval", rollout_id)
        with self.timer("eval"):
            result = evaluate(
                self.engine,
                self.eval_sets,
                self.sampling,
                rollout_id=rollout_id,
                run_seed=cfg.run.seed,
                n_samples=cfg.eval.n_samples_per_eval_prompt,
                max_prompts=cfg.eval.eval_max_prompts,
                rm_type=cfg.reward.rm_type,
                custom_fn=self.custom_reward,
                reward_key=cfg.reward.reward_key,
            )
        if self.recorder is not None:  # `eval_<id>` (Miles); evaluation runs on rank 0 only
            eval_id = eval_rollout_id(rollout_id)
            path, size = self.recorder.save(
                result.samples, rollout_id=eval_id, weight_version=self.state.weight_version
            )
            self.run_dir.event("eval_recorded", rollout_id=rollout_id, id=eval_id, path=str(path), bytes=size)
        self.reporter.emit("eval", rollout_id, result.metrics)
        self.harness.after_eval(rollout_id, result.metrics)

    def _eval_due(self, rollout_id: int) -> bool:
        interval = self.cfg.eval.eval_interval
        return interval is not None and rollout_id % interval == 0

    # ------------------------------------------------------------------ helpers
    def _gather(self, items: list) -> list:
        """Concatenate every rank's list in rank order (a no-op for one rank)."""
        if not self.dist.distributed:
            return items
        return [x for part in all_gather_objects(items, self.dist) for x in part]

    def _sync_weights(self) -> None:
        """Send the trainer's weights to the engine as the next weight version (one bucket at a time);
        a rank without the engine of a multi-rank server run joins rank 0's gathers instead."""
        if (self.engine is None and not self.joins_sync) or self.actor is None:
            return  # rollout-only or train-only: one side is missing, nothing to sync
        if self.cfg.debug.debug_skip_weight_update:
            self.run_dir.event("weight_update_skipped", weight_version=self.state.weight_version)
            return
        with self.timer("update_weights"):
            version = self.state.weight_version + 1
            if self.engine is None:  # rank 0's engine echoes the version, or rank 0 fails the run
                self.state.weight_version = self.state.engine_version = join_weight_sync(self.actor, version)
                return
            buffer = self.cfg.colocate.update_weight_buffer_size
            stats = sync_weights(
                self.actor.named_weights(), self.engine, weight_version=version, buffer_bytes=buffer
            )
            self.state.weight_version = self.state.engine_version = stats.weight_version
        self.run_dir.event("weight_update", weight_version=version, buckets=stats.buckets, bytes=stats.bytes)

    def _record_fault(self, action: FaultAction, rollout_id: int) -> None:
        """A fault about to fire: an event (rank 0) and the firing rank's heartbeat, which every rank writes."""
        self.run_dir.event("fault", action=action.action, rollout_id=rollout_id, rank=action.rank)
        self.run_dir.heartbeat(f"fault:{action.action}", rollout_id)


def _release_save_lock(config: Config) -> None:
    if config.checkpoint.save is not None:
        release_save_lock(config.checkpoint.save)  # only this process's lock: other ranks hold none


def train(config: Config, argv: list[str] | None = None, *, checked: bool = False) -> Path:
    """Run GRPO with `config`; return the run directory.

    `checked`: the caller already ran `preflight.check_inputs(config)` (the CLI does, before it
    imports this module); otherwise it runs here, before the run directory is made.

    Raises:
        ValueError / FileNotFoundError: what the config names is not on this machine (`--device`,
            `--load`, `--save`), bad input files (model, prompt data, reward; train/preflight.py) or bad
            input found while starting (checkpoint, run directory); RuntimeError: the run failed;
            KeyboardInterrupt: SIGINT/SIGTERM (the run directory's last event says so).
    """
    if not checked:
        check_inputs(config)
    run = GRPORun.create(config, list(sys.argv if argv is None else argv))
    return run.run()
