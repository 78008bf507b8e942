"""One colocated GRPO run: rollout → reward → advantages → log-probs → train → sync → log → save.

What it computes (nanochat style): GRPO with group-normalized rewards (no epsilon, see
algorithms.grpo_advantages), the PPO clipped surrogate against the trainer's own pre-update
log-probs, sample-mean loss by default (token mean with `--calculate-per-token-loss`), KL to the
frozen initial weights only with `--use-kl-loss`. Engine and trainer take turns on one device;
the engine holds its own copy of the weights and receives the trainer's after every rollout.

Debug modes cut the loop in half (Miles debugging page): `--debug-rollout-only` builds no
trainer, `--load-debug-rollout-data` builds no engine and trains on recordings,
`--ci-inject-rollout-data-path` generates, compares with a recording and trains on the recording
(rollout.py). `--ci-test` checkers run at their points (checkers/harness.py).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpolab.checkers.faults import FaultAction, FaultInjector, parse_fault_actions
from grpolab.checkers.harness import CheckHarness
from grpolab.core import checkpoint
from grpolab.core.actor import Actor
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.data import PromptDataset
from grpolab.core.dist import DistContext, all_gather_objects, barrier, init_distributed, shutdown
from grpolab.core.engine.base import SamplingParams
from grpolab.core.engine.client import EngineClient
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.core.evaluation import evaluate
from grpolab.core.metrics import PhaseTimer, format_line, rollout_metrics, summary_row
from grpolab.core.modeling import load_tokenizer, model_fingerprint, parse_dtype, stop_token_ids
from grpolab.core.rollout import RolloutProducer
from grpolab.core.seeding import seed_everything
from grpolab.core.weight_sync import sync_weights
from grpolab.diagnose.gpu import start_run_sampler
from grpolab.replay.recording import chat_template_hash, tokenizer_fingerprint
from grpolab.replay.replayer import RolloutRecorder, RunIdentity
from grpolab.rundir.writer import CONSOLE_LOG_ONLY, RunDirectory, describe_exception, setup_console_logging

log = logging.getLogger("grpolab")


@dataclass
class RunState:
    """Counters that move with the run and are checkpointed."""

    next_rollout_id: int = 0
    weight_version: int = 0
    resumed: bool = False


class GRPORun:
    """Everything one run holds; `run()` executes it. Build with `GRPORun.create(config, argv)`."""

    def __init__(self, config: Config, run_dir: RunDirectory, dist_ctx: DistContext | None = None) -> None:
        cfg, debug = config, config.debug
        self.cfg, self.run_dir = cfg, run_dir
        self.dist = dist_ctx or DistContext()
        self.timer, self.state = PhaseTimer(), RunState()
        self.harness = CheckHarness(cfg, run_dir)
        self.fingerprint = model_fingerprint(cfg.model.hf_checkpoint)
        self.tokenizer = load_tokenizer(cfg.model.hf_checkpoint)
        data = cfg.data
        dataset_kw = {
            "input_key": data.input_key,
            "label_key": data.label_key,
            "apply_chat_template": data.apply_chat_template,
        }
        dataset = PromptDataset(data.prompt_data, self.tokenizer, **dataset_kw)
        self.eval_sets = {
            name: PromptDataset(path, self.tokenizer, **dataset_kw) for name, path in cfg.eval.datasets
        }
        self.faults = FaultInjector(
            parse_fault_actions(cfg.ci.ci_ft_test_actions or "[]"),
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            on_stop_engine=None if debug.debug_train_only else self._stop_engine,
            on_fire=self._record_fault,
        )
        # every rollout/sync/eval call goes through the client (fails after --engine-failure-timeout);
        # torch_engine is kept for what only the in-process engine has (weights_checker, last_stats, shutdown)
        self.engine: EngineClient | None = None
        self.torch_engine: TorchEngine | None = None
        if not debug.debug_train_only:
            rollout_dtype = parse_dtype(cfg.model.rollout_dtype, "--rollout-dtype")
            self.torch_engine = TorchEngine(
                cfg.model.hf_checkpoint,
                dtype=rollout_dtype,
                device=cfg.model.device,
                show_progress=cfg.run.show_progress,
            )
            self.engine = EngineClient(self.torch_engine, failure_timeout=cfg.rollout.engine_failure_timeout)
        self.actor: Actor | None = None
        if not debug.debug_rollout_only:
            self.actor = Actor(
                cfg.model.hf_checkpoint,
                dtype=parse_dtype(cfg.model.train_dtype, "--train-dtype"),
                device=cfg.model.device,
                optimizer=cfg.optimizer,
                algorithm=cfg.algorithm,
                temperature=cfg.rollout.rollout_temperature,
                build_optimizer=not debug.debug_disable_optimizer,
                dist_ctx=self.dist,
            )
        self.sampling = SamplingParams(
            temperature=cfg.rollout.rollout_temperature,
            top_p=cfg.rollout.rollout_top_p,
            top_k=cfg.rollout.rollout_top_k,
            max_new_tokens=cfg.rollout.rollout_max_response_len,
            stop_token_ids=stop_token_ids(cfg.model.hf_checkpoint, self.tokenizer),
        )
        identity = RunIdentity(
            fingerprints={
                "model_fingerprint": self.fingerprint,
                "tokenizer_fingerprint": tokenizer_fingerprint(self.tokenizer),
                "chat_template_hash": chat_template_hash(self.tokenizer),
            },
            # what changes the training computation on the same samples
            train_config={
                "rollout_temperature": cfg.rollout.rollout_temperature,
                "n_samples_per_prompt": cfg.rollout.n_samples_per_prompt,
                "apply_chat_template": cfg.data.apply_chat_template,
            },
        )
        self.producer = RolloutProducer(
            cfg,
            engine=self.engine,
            dataset=dataset,
            sampling=self.sampling,
            identity=identity,
            run_dir=run_dir,
            timer=self.timer,
            dist_ctx=self.dist,
        )
        self.recorder = None
        if debug.save_debug_rollout_data:
            sampler = {
                "temperature": self.sampling.temperature,
                "top_p": self.sampling.top_p,
                "top_k": self.sampling.top_k,
            }
            sampler["max_new_tokens"] = self.sampling.max_new_tokens
            self.recorder = RolloutRecorder(
                debug.save_debug_rollout_data, identity, run_seed=cfg.run.seed, sampler=sampler
            )

    # ------------------------------------------------------------------ setup
    @classmethod
    def create(cls, config: Config, argv: list[str]) -> GRPORun:
        """Join the world, pin threads and seeds, make the run directory (run.json first), build engine and actor."""
        run_cfg = config.run
        ctx = init_distributed(config.model.device, deterministic=run_cfg.debug_deterministic_collective)
        setup_console_logging(quiet=not ctx.is_primary)
        if run_cfg.debug_deterministic_collective:
            torch.use_deterministic_algorithms(True)
            run_cfg.num_threads = run_cfg.num_threads or 1  # CPU results differ between thread counts
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
                extra={"world_size": ctx.world_size, "backend": ctx.backend},
            )
        barrier(ctx)
        if not ctx.is_primary:
            run_dir = RunDirectory(path, rank=ctx.rank)
        try:
            if config.rollout.rollout_batch_size % ctx.world_size:
                raise ValueError(
                    f"--rollout-batch-size {config.rollout.rollout_batch_size} must be divisible by the world size {ctx.world_size}"
                )
            run = cls(config, run_dir, ctx)
            run._maybe_resume()
        except BaseException as e:
            _log_end(e)
            run_dir.heartbeat("error", None, error=describe_exception(e))
            run_dir.finish("failed", error=f"{type(e).__name__}: {e}")
            raise
        return run

    def _maybe_resume(self) -> None:
        load, save = self.cfg.checkpoint.load, self.cfg.checkpoint.save
        continuing = load is not None and save is not None and Path(load).resolve() == Path(save).resolve()
        if save is not None and not continuing and (Path(save) / checkpoint.LATEST_FILE).exists():
            raise ValueError(
                f"--save {save} already holds another run's checkpoints; pass --load {save} to continue that run "
                "or choose another --save (they would be overwritten)"
            )
        if load is None:
            return
        if self.actor is None:
            raise ValueError(
                "--load: --debug-rollout-only builds no trainer, so there is nothing to restore a checkpoint into"
            )
        latest = checkpoint.find_latest(load)
        if latest is None:
            log.info(f"--load {load}: no checkpoint there yet, starting fresh from --hf-checkpoint")
            self.run_dir.event("resume", found=False, load=str(load))
            return
        restored = checkpoint.load_checkpoint(latest, self.actor, model_fingerprint=self.fingerprint)
        self.harness.after_load(latest, lambda: list(self.actor.local_named_weights()))
        self.state = RunState(
            next_rollout_id=restored.next_rollout_id, weight_version=restored.weight_version - 1, resumed=True
        )
        log.info(
            f"--load {load}: resumed from {latest.name}, continuing at rollout {restored.next_rollout_id}"
        )
        self.run_dir.event("resume", found=True, path=str(latest), next_rollout_id=restored.next_rollout_id)

    # ------------------------------------------------------------------ the loop
    def run(self) -> Path:
        """Run the remaining rollouts; return the run directory. The last event is always `status`."""
        cfg = self.cfg
        _interrupt_on_sigterm()
        interval = cfg.run.gpu_sample_interval
        gpu_sampler = start_run_sampler(self.run_dir.path, interval) if self.dist.is_primary else None
        try:
            log.info(f"grpolab train: run directory {self.run_dir.path}")
            self.harness.first_sync(self.torch_engine, self._sync_weights, resumed=self.state.resumed)
            self.run_dir.event("startup_sync", **self.timer.pop())
            for rollout_id in range(self.state.next_rollout_id, cfg.rollout.num_rollout):
                if self._eval_due(rollout_id):
                    self.evaluate(rollout_id)
                self.step(rollout_id)
                if (
                    cfg.debug.debug_exit_after_rollout is not None
                    and rollout_id >= cfg.debug.debug_exit_after_rollout
                ):
                    log.info(
                        f"--debug-exit-after-rollout {cfg.debug.debug_exit_after_rollout}: stopping after rollout {rollout_id}"
                    )
                    break
            if cfg.eval.eval_interval is not None and self.engine is not None:
                self.evaluate(self.state.next_rollout_id)
            if self.actor is not None and cfg.ci.ci_save_model_hash:
                weights = list(
                    self.actor.named_weights()
                )  # a collective on multi-rank runs: every rank gathers
                self.harness.final_weights(weights)
            self.harness.finish()
            for action in self.faults.pending():
                log.info(
                    f"warning: --ci-ft-test-actions: {action.action} at rollout {action.at_rollout} never fired"
                )
        except KeyboardInterrupt as e:
            _log_end(e)
            self.run_dir.finish("interrupted", rollout_id=self.state.next_rollout_id)
            raise
        except BaseException as e:
            _log_end(e)
            self.run_dir.heartbeat("error", self.state.next_rollout_id, error=describe_exception(e))
            self.run_dir.finish(
                "failed", rollout_id=self.state.next_rollout_id, error=f"{type(e).__name__}: {e}"
            )
            raise
        finally:
            if gpu_sampler is not None:
                gpu_sampler.stop()
        self.run_dir.finish("finished", rollouts=self.state.next_rollout_id)
        shutdown(self.dist)
        return self.run_dir.path

    def step(self, rollout_id: int) -> None:
        """One GRPO iteration (the table of contents of a step)."""
        cfg, timer = self.cfg, self.timer
        start = time.perf_counter()
        self.run_dir.heartbeat("rollout", rollout_id)
        samples = self.producer.produce(rollout_id)  # this rank's share
        everyone = self._gather(samples)  # the whole rollout, for metrics, checks and recordings
        self.harness.after_advantages(rollout_id, everyone)
        if self.recorder is not None and self.dist.is_primary:
            with timer("save_rollout_data"):
                path, size = self.recorder.save(
                    everyone, rollout_id=rollout_id, weight_version=self.state.weight_version
                )
            self.run_dir.event("rollout_recorded", rollout_id=rollout_id, path=str(path), bytes=size)
        steps: list[dict[str, float]] = []
        if self.actor is None:
            rollout_line = rollout_metrics(
                everyone, log_probs=None, ref_log_probs=None, entropy=None, rollout_id=rollout_id
            )
            self._emit("rollout", rollout_id, rollout_line)
        else:
            rollout_line, steps = self.train(rollout_id, samples, everyone)
        self.state.next_rollout_id = rollout_id + 1
        self._maybe_save(rollout_id)
        if self.actor is not None and cfg.colocate.colocate and cfg.colocate.offload_train:
            with timer("sleep"):
                self.actor.offload()
        if self.engine is not None and cfg.colocate.colocate and cfg.colocate.offload_rollout:
            with timer("engine_resume"):
                self.engine.resume_memory()
        self.run_dir.heartbeat("update_weights", rollout_id)
        self._sync_weights()
        perf = timer.pop()
        perf["perf/train_time"] = sum(
            perf.get(f"perf/{k}_time", 0.0) for k in ("log_probs", "ref_log_probs", "actor_train")
        )
        perf["perf/step_time"] = time.perf_counter() - start
        if self.torch_engine is not None and "perf/rollout_time" in perf:
            perf["perf/rollout_tokens_per_sec"] = float(self.torch_engine.last_stats.get("tokens_per_s", 0.0))
        self._emit("perf", rollout_id, perf)
        log.info(summary_row(rollout_id, cfg.rollout.num_rollout, rollout_line, steps, perf))
        self.faults.maybe_fire("end_of_rollout", rollout_id)

    def train(
        self, rollout_id: int, samples: list[Sample], everyone: list[Sample]
    ) -> tuple[dict[str, float], list[dict[str, float]]]:
        """Log-probs, the rollout line (over `everyone`), and the optimizer steps on this rank's `samples`."""
        cfg, timer, actor = self.cfg, self.timer, self.actor
        assert actor is not None
        if cfg.colocate.colocate and cfg.colocate.offload_train and actor.offloaded:
            with timer("wake_up"):
                actor.onload()
        self.run_dir.heartbeat("train", rollout_id)
        with timer("log_probs"):
            old = actor.compute_log_probs(samples, with_entropy=True)
        with timer("ref_log_probs"):
            ref = actor.compute_log_probs(samples, reference=True)
        all_old, all_ref = self._gather(old.log_probs), self._gather(ref.log_probs)
        all_entropy = self._gather(old.entropy or [])
        line = rollout_metrics(
            everyone, log_probs=all_old, ref_log_probs=all_ref, entropy=all_entropy, rollout_id=rollout_id
        )
        self._emit("rollout", rollout_id, line)
        self.harness.after_rollout_line(rollout_id, line, everyone, all_old, all_ref)
        self.faults.maybe_fire("train", rollout_id)
        self.faults.maybe_fire("before_allreduce", rollout_id)  # the first backward reduces gradients
        with timer("actor_train"):
            steps = actor.train(
                samples,
                old.log_probs,
                ref.log_probs,
                step_offset=rollout_id * cfg.steps_per_rollout,
                apply_update=not cfg.debug.debug_disable_optimizer,
            )
        for step_in_rollout, step_metrics in enumerate(steps):
            self._emit("step", int(step_metrics["train/step"]), step_metrics, rollout_id=rollout_id)
            self.harness.after_step(rollout_id, step_in_rollout, step_metrics)
        return line, steps

    def evaluate(self, rollout_id: int) -> None:
        """`eval N:` line on the held-out sets with the engine's current weights."""
        if self.engine is None or not self.dist.is_primary:
            return  # train-only: no engine to evaluate with (Miles skips eval the same way); rank 0 evaluates
        cfg = self.cfg
        self.run_dir.heartbeat("eval", rollout_id)
        with self.timer("eval"):
            metrics = evaluate(
                self.engine,
                self.eval_sets,
                self.sampling,
                rollout_id=rollout_id,
                run_seed=cfg.run.seed,
                n_samples=cfg.eval.n_samples_per_eval_prompt,
                max_prompts=cfg.eval.eval_max_prompts,
                rm_type=cfg.reward.rm_type,
                custom_fn=self.producer.custom_reward,
                reward_key=cfg.reward.reward_key,
            )
        self._emit("eval", rollout_id, metrics)
        self.harness.after_eval(rollout_id, metrics)

    # ------------------------------------------------------------------ helpers
    def _gather(self, items: list) -> list:
        """Concatenate every rank's list in rank order (a no-op for one rank)."""
        if not self.dist.distributed:
            return items
        return [x for part in all_gather_objects(items, self.dist) for x in part]

    def _sync_weights(self) -> None:
        if self.engine is None or self.actor is None:
            return  # rollout-only or train-only: one side is missing, nothing to sync
        if self.cfg.debug.debug_skip_weight_update:
            self.run_dir.event("weight_update_skipped", weight_version=self.state.weight_version)
            return
        with self.timer("update_weights"):
            version = self.state.weight_version + 1
            buffer = self.cfg.colocate.update_weight_buffer_size
            stats = sync_weights(
                self.actor.named_weights(), self.engine, weight_version=version, buffer_bytes=buffer
            )
            self.state.weight_version = version
        self.run_dir.event("weight_update", weight_version=version, buckets=stats.buckets, bytes=stats.bytes)

    def _record_fault(self, action: FaultAction, rollout_id: int) -> None:
        """A fault about to fire: an event (rank 0) and the firing rank's heartbeat, which every rank writes."""
        self.run_dir.event("fault", action=action.action, rollout_id=rollout_id, rank=action.rank)
        self.run_dir.heartbeat(f"fault:{action.action}", rollout_id)

    def _stop_engine(self) -> None:
        if self.torch_engine is not None:
            self.torch_engine.shutdown(reason="fault injection stop_engine_at_end")
            self.run_dir.event("engine_stopped", reason="fault injection stop_engine_at_end")

    def _eval_due(self, rollout_id: int) -> bool:
        interval = self.cfg.eval.eval_interval
        return interval is not None and rollout_id % interval == 0

    def _maybe_save(self, rollout_id: int) -> None:
        ckpt = self.cfg.checkpoint
        if self.actor is None or ckpt.save is None:
            return
        last = (
            rollout_id == self.cfg.rollout.num_rollout - 1
            or rollout_id == self.cfg.debug.debug_exit_after_rollout
        )
        if not (last or (ckpt.save_interval is not None and (rollout_id + 1) % ckpt.save_interval == 0)):
            return
        nxt = self.state.next_rollout_id
        state = checkpoint.TrainerState(
            next_rollout_id=nxt,
            data_position=nxt * self.cfg.rollout.rollout_batch_size,
            weight_version=self.state.weight_version + 1,
            model_fingerprint=self.fingerprint,
        )
        with self.timer("save_model"):
            path = checkpoint.save_checkpoint(ckpt.save, self.actor, state)
            self.harness.after_checkpoint(path, lambda: list(self.actor.local_named_weights()))
        self.run_dir.event("checkpoint", rollout_id=rollout_id, path=str(path))

    def _emit(
        self, kind: str, index: int, metrics: dict[str, float], *, rollout_id: int | None = None
    ) -> None:
        log.info(format_line(kind, index, metrics))
        self.run_dir.log_metrics(
            kind, index if rollout_id is None else rollout_id, metrics, step=index if kind == "step" else None
        )


def _log_end(exc: BaseException) -> None:
    """The line that ends a failed or interrupted run, into console.log (before `finish` closes it).

    `grpolab train: error: <Type>: <message>` (or `grpolab train: interrupted (<why>)`), so that
    `grpolab diagnose log RUN/console.log` sees why the run ended. It skips stdout: the `grpolab train`
    command prints the error on stderr itself, and the terminal should show it once.
    """
    if isinstance(exc, KeyboardInterrupt):
        log.warning(f"grpolab train: interrupted ({str(exc) or 'Ctrl+C'})", extra=CONSOLE_LOG_ONLY)
    else:
        log.error(f"grpolab train: error: {type(exc).__name__}: {exc}", extra=CONSOLE_LOG_ONLY)


def _interrupt_on_sigterm() -> None:
    """Treat SIGTERM (`timeout`, a scheduler) like Ctrl-C, so the final status event is written."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def train(config: Config, argv: list[str] | None = None) -> Path:
    """Run GRPO with `config`; return the run directory."""
    run = GRPORun.create(config, list(sys.argv if argv is None else argv))
    return run.run()
