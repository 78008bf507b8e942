"""One colocated GRPO run: rollout → reward → advantages → log-probs → train → sync → log → save.

Debug modes cut the loop in half (Miles debugging page): `--debug-rollout-only` builds no
trainer, `--debug-train-only` / `--load-debug-rollout-data` build no engine and train on
recordings, `--ci-inject-rollout-data-path` generates, compares with a recording and trains on the
recording.

What it computes (nanochat style): GRPO with group-normalized rewards (no epsilon, see
algorithms.grpo_advantages), the PPO clipped surrogate against the trainer's own pre-update
log-probs, sample-mean loss by default (token mean with `--calculate-per-token-loss`), KL to the
frozen initial weights only with `--use-kl-loss`. Engine and trainer take turns on one device;
the engine holds its own copy of the weights and receives the trainer's after every rollout.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpolab.core import algorithms, checkpoint, rewards
from grpolab.core.actor import Actor
from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.data import PromptDataset, rollout_prompt_indices
from grpolab.core.engine.base import GenerationRequest, RolloutEngine, SamplingParams
from grpolab.core.engine.torch_engine import TorchEngine
from grpolab.core.metrics import PhaseTimer, format_line, rollout_metrics, summary_row
from grpolab.core.modeling import load_tokenizer, model_fingerprint, parse_dtype
from grpolab.core.rundir import RunDirectory, setup_console_logging
from grpolab.core.seeding import derive_sample_seed, seed_everything
from grpolab.core.weight_sync import sync_weights
from grpolab.replay.recording import chat_template_hash, tokenizer_fingerprint
from grpolab.replay.replayer import (
    InjectMismatchError,
    RolloutRecorder,
    RolloutReplayer,
    RunIdentity,
    compare_rollouts,
)

log = logging.getLogger("grpolab")


@dataclass
class RunState:
    """Counters that move with the run and are checkpointed."""

    next_rollout_id: int = 0
    weight_version: int = 0


class GRPORun:
    """Everything one run holds; `run()` executes it. Build with `GRPORun.create(config, argv)`."""

    def __init__(self, config: Config, run_dir: RunDirectory) -> None:
        self.cfg = config
        self.run_dir = run_dir
        self.timer = PhaseTimer()
        self.state = RunState()
        cfg = config
        self.fingerprint = model_fingerprint(cfg.model.hf_checkpoint)
        self.tokenizer = load_tokenizer(cfg.model.hf_checkpoint)
        self.dataset = PromptDataset(
            cfg.data.prompt_data,
            self.tokenizer,
            input_key=cfg.data.input_key,
            label_key=cfg.data.label_key,
            apply_chat_template=cfg.data.apply_chat_template,
        )
        self.custom_reward = (
            rewards.load_custom_reward(cfg.reward.custom_rm_path) if cfg.reward.custom_rm_path else None
        )
        if self.custom_reward is None:
            rewards.get_reward_fn(cfg.reward.rm_type)  # unknown --rm-type fails here, before any work
        debug = cfg.debug
        self.engine: RolloutEngine | None = None
        if not debug.debug_train_only:
            self.engine = TorchEngine(
                cfg.model.hf_checkpoint,
                dtype=parse_dtype(cfg.model.rollout_dtype, "--rollout-dtype"),
                device=cfg.model.device,
                show_progress=cfg.run.show_progress,
            )
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
            )
        self.sampling = SamplingParams(
            temperature=cfg.rollout.rollout_temperature,
            top_p=cfg.rollout.rollout_top_p,
            top_k=cfg.rollout.rollout_top_k,
            max_new_tokens=cfg.rollout.rollout_max_response_len,
            stop_token_ids=self._stop_token_ids(),
        )
        self.identity = RunIdentity(
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
        sampler = {
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "top_k": self.sampling.top_k,
        }
        sampler["max_new_tokens"] = self.sampling.max_new_tokens
        self.recorder = None
        if debug.save_debug_rollout_data:
            self.recorder = RolloutRecorder(
                debug.save_debug_rollout_data, self.identity, run_seed=cfg.run.seed, sampler=sampler
            )
        self.replayer = None
        if debug.load_debug_rollout_data:
            self.replayer = RolloutReplayer(
                debug.load_debug_rollout_data,
                self.identity,
                allow_mismatch=debug.allow_recording_mismatch,
                subsample=debug.load_debug_rollout_data_subsample,
                flag="--load-debug-rollout-data",
            )
        self.injector = None
        if debug.ci_inject_rollout_data_path:
            self.injector = RolloutReplayer(
                debug.ci_inject_rollout_data_path,
                self.identity,
                allow_mismatch=debug.allow_recording_mismatch,
                flag="--ci-inject-rollout-data-path",
            )

    def _stop_token_ids(self) -> tuple[int, ...]:
        """eos of the tokenizer and of the model's generation config (either may be a list)."""
        candidates = [self.tokenizer.eos_token_id]
        from transformers import GenerationConfig

        try:
            candidates.append(
                GenerationConfig.from_pretrained(self._checkpoint_dir(), local_files_only=True).eos_token_id
            )
        except (OSError, ValueError):
            pass
        flat: set[int] = set()
        for c in candidates:
            flat.update(c if isinstance(c, list) else [c] if c is not None else [])
        return tuple(sorted(flat))

    def _checkpoint_dir(self) -> str:
        path = Path(self.cfg.model.hf_checkpoint)
        return str(path.parent if path.is_file() else path)

    # ------------------------------------------------------------------ setup
    @classmethod
    def create(cls, config: Config, argv: list[str]) -> GRPORun:
        """Pin threads and seeds, make the run directory (run.json first), build engine and actor."""
        setup_console_logging()
        if config.run.num_threads:
            torch.set_num_threads(config.run.num_threads)
        seed_everything(config.run.seed)
        path = config.run.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-s{config.run.seed}"
        config.run.run_dir = str(path)
        run_dir = RunDirectory.create(
            path,
            config=config.to_dict(),
            argv=argv,
            seed=config.run.seed,
            mirror_events_to=config.debug.save_debug_event_data,
        )
        try:
            run = cls(config, run_dir)
            run._maybe_resume()
        except BaseException as e:
            run_dir.finish("failed", error=f"{type(e).__name__}: {e}")
            raise
        return run

    def _maybe_resume(self) -> None:
        load = self.cfg.checkpoint.load
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
        self.state = RunState(
            next_rollout_id=restored.next_rollout_id, weight_version=restored.weight_version - 1
        )
        log.info(
            f"--load {load}: resumed from {latest.name}, continuing at rollout {restored.next_rollout_id}"
        )
        self.run_dir.event("resume", found=True, path=str(latest), next_rollout_id=restored.next_rollout_id)

    # ------------------------------------------------------------------ the loop
    def run(self) -> Path:
        """Run the remaining rollouts; return the run directory. The last event is always `status`."""
        cfg = self.cfg
        try:
            log.info(f"grpolab train: run directory {self.run_dir.path}")
            self._sync_weights()  # the engine starts from the trainer's weights (Miles: version 1 at startup)
            self.run_dir.event("startup_sync", **self.timer.pop())
            for rollout_id in range(self.state.next_rollout_id, cfg.rollout.num_rollout):
                self.step(rollout_id)
                if (
                    cfg.debug.debug_exit_after_rollout is not None
                    and rollout_id >= cfg.debug.debug_exit_after_rollout
                ):
                    log.info(
                        f"--debug-exit-after-rollout {cfg.debug.debug_exit_after_rollout}: stopping after rollout {rollout_id}"
                    )
                    break
        except KeyboardInterrupt:
            self.run_dir.finish("interrupted", rollout_id=self.state.next_rollout_id)
            raise
        except BaseException as e:
            self.run_dir.finish(
                "failed", rollout_id=self.state.next_rollout_id, error=f"{type(e).__name__}: {e}"
            )
            raise
        self.run_dir.finish("finished", rollouts=self.state.next_rollout_id)
        return self.run_dir.path

    def step(self, rollout_id: int) -> None:
        """One GRPO iteration (the table of contents of a step)."""
        cfg, timer = self.cfg, self.timer
        colocated = cfg.colocate.colocate
        start = time.perf_counter()
        self.run_dir.heartbeat("rollout", rollout_id)
        samples = self.rollout(rollout_id)
        if self.recorder is not None:
            with timer("save_rollout_data"):
                path, size = self.recorder.save(
                    samples, rollout_id=rollout_id, weight_version=self.state.weight_version
                )
            self.run_dir.event("rollout_recorded", rollout_id=rollout_id, path=str(path), bytes=size)
        steps: list[dict[str, float]] = []
        if self.actor is None:
            rollout_line = rollout_metrics(
                samples, log_probs=None, ref_log_probs=None, entropy=None, rollout_id=rollout_id
            )
            self._emit("rollout", rollout_id, rollout_line)
        else:
            rollout_line, steps = self.train(rollout_id, samples)
        self.state.next_rollout_id = rollout_id + 1
        if self.actor is not None and self._save_due(rollout_id):
            with timer("save_model"):
                path = checkpoint.save_checkpoint(cfg.checkpoint.save, self.actor, self._trainer_state())
            self.run_dir.event("checkpoint", rollout_id=rollout_id, path=str(path))
        if self.actor is not None and colocated and cfg.colocate.offload_train:
            with timer("sleep"):
                self.actor.offload()
        if self.engine is not None and colocated and cfg.colocate.offload_rollout:
            with timer("engine_resume"):
                self.engine.resume_memory()
        self.run_dir.heartbeat("update_weights", rollout_id)
        self._sync_weights()
        perf = timer.pop()
        perf["perf/train_time"] = sum(
            perf.get(k, 0.0)
            for k in ("perf/log_probs_time", "perf/ref_log_probs_time", "perf/actor_train_time")
        )
        perf["perf/step_time"] = time.perf_counter() - start
        stats = getattr(self.engine, "last_stats", {}) if self.engine is not None else {}
        if stats:
            perf["perf/rollout_tokens_per_sec"] = float(stats.get("tokens_per_s", 0.0))
        self._emit("perf", rollout_id, perf)
        log.info(summary_row(rollout_id, cfg.rollout.num_rollout, rollout_line, steps, perf))

    def rollout(self, rollout_id: int) -> list[Sample]:
        """This rollout's scored samples: generated, replayed from a recording, or injected."""
        cfg, timer = self.cfg, self.timer
        if self.replayer is not None:
            with timer("load_rollout_data"):
                samples, version = self.replayer.load(rollout_id)
            self._warn_mismatch(self.replayer)
            self.run_dir.event(
                "rollout_replayed", rollout_id=rollout_id, weight_version=version, samples=len(samples)
            )
            with timer("reward"):
                self.assign_advantages(samples)
            return samples
        with timer("rollout"):
            samples = self.generate(rollout_id)
        if cfg.colocate.colocate and cfg.colocate.offload_rollout:
            with timer("engine_release"):
                self.engine.release_memory()
        with timer("reward"):
            self.score(samples)
        if self.injector is None or rollout_id < cfg.debug.ci_inject_rollout_data_start_rollout_id:
            return samples
        recorded, _ = self.injector.load(rollout_id)
        self._warn_mismatch(self.injector)
        report = compare_rollouts(samples, recorded, rollout_id=rollout_id)
        threshold = cfg.debug.ci_inject_rollout_data_min_match_ratio
        self.run_dir.event(
            "inject_check",
            rollout_id=rollout_id,
            mean_ratio=report.mean_ratio,
            min_ratio=report.min_ratio,
            threshold=threshold,
            worst=[m.__dict__ for m in report.worst],
        )
        log.info(f"inject {report.describe(threshold)}")
        if not report.mean_ratio > threshold:
            raise InjectMismatchError(
                f"--ci-inject-rollout-data-min-match-ratio: {report.describe(threshold)}; the engine holds other weights than the recording run's"
            )
        self.assign_advantages(recorded)
        return recorded

    def train(
        self, rollout_id: int, samples: list[Sample]
    ) -> tuple[dict[str, float], list[dict[str, float]]]:
        """Log-probs, the rollout line, and the optimizer steps of one rollout."""
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
        rollout_line = rollout_metrics(
            samples,
            log_probs=old.log_probs,
            ref_log_probs=ref.log_probs,
            entropy=old.entropy,
            rollout_id=rollout_id,
        )
        self._emit("rollout", rollout_id, rollout_line)
        with timer("actor_train"):
            steps = actor.train(
                samples,
                old.log_probs,
                ref.log_probs,
                step_offset=rollout_id * cfg.steps_per_rollout,
                apply_update=not cfg.debug.debug_disable_optimizer,
            )
        for step_metrics in steps:
            self._emit("step", int(step_metrics["train/step"]), step_metrics, rollout_id=rollout_id)
        return rollout_line, steps

    def _warn_mismatch(self, replayer: RolloutReplayer) -> None:
        for message in replayer.warnings:
            log.info(f"warning: {message} (--allow-recording-mismatch)")
            self.run_dir.event("recording_mismatch_allowed", detail=message)
        replayer.warnings.clear()

    # ------------------------------------------------------------------ phases
    def generate(self, rollout_id: int) -> list[Sample]:
        """Generate `--n-samples-per-prompt` answers for each prompt of this rollout."""
        cfg = self.cfg
        indices = rollout_prompt_indices(
            num_rows=len(self.dataset),
            rollout_id=rollout_id,
            rollout_batch_size=cfg.rollout.rollout_batch_size,
            seed=cfg.run.seed,
            shuffle=cfg.data.rollout_shuffle,
        )
        prompts = [self.dataset[i] for i in indices]
        n = cfg.rollout.n_samples_per_prompt
        requests, meta = [], []
        for g, prompt in enumerate(prompts):
            for k in range(n):
                seed = derive_sample_seed(cfg.run.seed, rollout_id, prompt.index, k)
                requests.append(GenerationRequest(prompt_ids=prompt.prompt_ids, seed=seed))
                meta.append((g, k, prompt, seed))
        assert self.engine is not None
        results = self.engine.generate(requests, self.sampling)
        samples = []
        for i, ((g, k, prompt, seed), res) in enumerate(zip(meta, results)):
            samples.append(
                Sample(
                    index=i,
                    prompt_index=prompt.index,
                    group_index=g,
                    sample_index=k,
                    seed=seed,
                    prompt_ids=list(prompt.prompt_ids),
                    response_ids=list(res.response_ids),
                    rollout_log_probs=res.log_probs.float().cpu(),
                    loss_mask=torch.ones(len(res.response_ids), dtype=torch.float32),
                    finish_reason=res.finish_reason,
                    prompt_text=prompt.text,
                    response_text=self.tokenizer.decode(res.response_ids, skip_special_tokens=True),
                    label=prompt.label,
                    kept_token_ids=res.kept_token_ids,
                    weight_version=res.weight_version,
                )
            )
        return samples

    def score(self, samples: list[Sample]) -> None:
        """Fill `reward` (rm or custom function) and `advantage` (GRPO, per group) in place."""
        cfg = self.cfg
        records = [
            {
                "prompt": s.prompt_text,
                "response": s.response_text,
                "label": s.label,
                "index": s.index,
                "group_index": s.group_index,
                "metadata": s.metadata,
            }
            for s in samples
        ]
        values = rewards.score_samples_sync(
            records,
            rm_type=cfg.reward.rm_type,
            custom_fn=self.custom_reward,
            group_rm=cfg.reward.group_rm,
            group_size=cfg.rollout.n_samples_per_prompt,
            reward_key=cfg.reward.reward_key,
        )
        for s, r in zip(samples, values):
            s.reward = float(r)
        self.assign_advantages(samples)

    def assign_advantages(self, samples: list[Sample]) -> None:
        """GRPO advantages from the samples' rewards and group ids (recomputed on replay too, as Miles)."""
        cfg = self.cfg
        rewards_B = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        group_ids_B = torch.tensor([s.group_index for s in samples])
        estimator = algorithms.get_advantage_estimator(cfg.algorithm.advantage_estimator)
        advantages_B = estimator(
            rewards_B, group_ids_B, std_normalize=not cfg.algorithm.disable_grpo_std_normalization
        )
        for s, a in zip(samples, advantages_B.tolist()):
            s.advantage = float(a)

    def _sync_weights(self) -> None:
        if self.engine is None or self.actor is None:
            return  # rollout-only or train-only: one side is missing, nothing to sync
        if self.cfg.debug.debug_skip_weight_update:
            self.run_dir.event("weight_update_skipped", weight_version=self.state.weight_version)
            return
        with self.timer("update_weights"):
            version = self.state.weight_version + 1
            stats = sync_weights(
                self.actor.named_weights(),
                self.engine,
                weight_version=version,
                buffer_bytes=self.cfg.colocate.update_weight_buffer_size,
            )
            self.state.weight_version = version
        self.run_dir.event("weight_update", weight_version=version, buckets=stats.buckets, bytes=stats.bytes)

    def _save_due(self, rollout_id: int) -> bool:
        ckpt = self.cfg.checkpoint
        if ckpt.save is None:
            return False
        if self.cfg.debug.debug_exit_after_rollout == rollout_id:
            return True
        last = rollout_id == self.cfg.rollout.num_rollout - 1
        return last or (ckpt.save_interval is not None and (rollout_id + 1) % ckpt.save_interval == 0)

    def _trainer_state(self) -> checkpoint.TrainerState:
        nxt = self.state.next_rollout_id
        return checkpoint.TrainerState(
            next_rollout_id=nxt,
            data_position=nxt * self.cfg.rollout.rollout_batch_size,
            weight_version=self.state.weight_version + 1,
            model_fingerprint=self.fingerprint,
        )

    def _emit(
        self, kind: str, index: int, metrics: dict[str, float], *, rollout_id: int | None = None
    ) -> None:
        log.info(format_line(kind, index, metrics))
        self.run_dir.log_metrics(
            kind, index if rollout_id is None else rollout_id, metrics, step=index if kind == "step" else None
        )


def train(config: Config, argv: list[str] | None = None) -> Path:
    """Run GRPO with `config`; return the run directory."""
    run = GRPORun.create(config, list(sys.argv if argv is None else argv))
    return run.run()
