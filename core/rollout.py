"""Where a rollout's scored samples come from: the engine, a recording, or both (inject).

The loop calls three phases per rollout id, in order:
- `rollout`: live: `--rollout-batch-size` prompts (seeded order, see data.py) × `--n-samples-per-prompt`
  answers from the engine, each with its own seed (seeding.py); replay (`--load-debug-rollout-data`):
  the samples read from the recording, with their recorded rewards;
- `rewards`: live: scored by the reward function; inject (`--ci-inject-rollout-data-path`, from the
  start id on): scored as live, compared with the recording (inject.compare_rollouts), and the
  recording handed back instead;
- `advantages`: GRPO advantages from the rewards (recomputed on replay and inject, as Miles).
Each phase works on this rank's contiguous share of the rollout (on a multi-rank server run rank 0
generates the whole rollout and sends each rank its share: central_rollout.py). Before the first rollout,
`check_recordings` checks every recording the run will replay or inject (`planned_rollout_ids`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from grpolab.core import algorithms, rewards
from grpolab.core.batch import Sample
from grpolab.core.central_rollout import broadcast_samples, is_central
from grpolab.core.config import Config
from grpolab.core.data import PromptDataset, rollout_prompt_indices
from grpolab.core.dist import DistContext
from grpolab.core.engine.base import GenerationRequest, RolloutEngine, SamplingParams
from grpolab.core.metrics import PhaseTimer
from grpolab.core.seeding import derive_sample_seed
from grpolab.replay.inject import InjectMismatchError, compare_rollouts, frozen_recording_note
from grpolab.replay.paths import eval_rollout_id
from grpolab.replay.replayer import RolloutRecorder, RolloutReplayer, RunIdentity
from grpolab.rundir.writer import RunDirectory

log = logging.getLogger("grpolab")


def planned_rollout_ids(start: int, num_rollout: int, exit_after: int | None) -> list[int]:
    """The rollout ids a run produces from `start`: up to `--num-rollout` - 1, and with
    `--debug-exit-after-rollout N` none after the first id >= N (the loop stops there)."""
    end = num_rollout if exit_after is None else min(num_rollout, max(exit_after, start) + 1)
    return list(range(start, end))


def planned_eval_ids(rollout_ids: list[int], eval_interval: int | None) -> list[int]:
    """The evals the loop runs (`--eval-interval`): before each rollout whose id it divides, and one
    after the last rollout; none when no rollout is left (a resumed run that is complete)."""
    if eval_interval is None or not rollout_ids:
        return []
    return [r for r in rollout_ids if r % eval_interval == 0] + [rollout_ids[-1] + 1]


def check_recordings(
    config: Config,
    producer: RolloutProducer,
    recorder: RolloutRecorder | None,
    *,
    start: int,
    evals: bool,
) -> list[Path]:
    """Before the first rollout of a run starting at rollout `start`: every recording it reads exists,
    is intact, holds the rollout it is read as and comes from one run (`RolloutProducer.check_recordings`), and none it writes (rollouts and,
    when `evals` (an engine evaluates), its `eval_<id>` files) replaces another run's recording.

    Returns:
        The files `--overwrite-debug-rollout-data` lets this run replace.

    Raises:
        FileNotFoundError / RecordingMismatchError / RecordingError: see `RolloutReplayer.check_ready`.
        FileExistsError: see `RolloutRecorder.check_free`.
    """
    debug = config.debug
    ids = planned_rollout_ids(start, config.rollout.num_rollout, debug.debug_exit_after_rollout)
    producer.check_recordings(ids)
    if recorder is None:
        return []
    eval_ids = planned_eval_ids(ids, config.eval.eval_interval) if evals else []
    written: list[int | str] = [*ids, *map(eval_rollout_id, eval_ids)]
    return recorder.check_free(written, overwrite=debug.overwrite_debug_rollout_data)


class RolloutProducer:
    """Each rollout's samples in three phases: `rollout`, `rewards`, `advantages` (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        *,
        engine: RolloutEngine | None,
        dataset: PromptDataset,
        sampling: SamplingParams,
        identity: RunIdentity,
        run_dir: RunDirectory,
        timer: PhaseTimer,
        dist_ctx: DistContext | None = None,
    ) -> None:
        cfg, debug = config, config.debug
        self.cfg = cfg
        self.engine = engine
        self.dataset = dataset
        self.sampling = sampling
        self.run_dir = run_dir
        self.timer = timer
        self.dist = dist_ctx or DistContext()
        self.central = is_central(cfg, self.dist.world_size)  # rank 0 generates for every rank
        self.custom_reward = (
            rewards.load_custom_reward(cfg.reward.custom_rm_path, cfg.reward.call_timeout)
            if cfg.reward.custom_rm_path
            else None
        )
        if self.custom_reward is None:
            rewards.get_reward_fn(cfg.reward.rm_type)  # unknown --rm-type fails here, before any work
        self.replayer = None
        if debug.load_debug_rollout_data:
            self.replayer = RolloutReplayer(
                debug.load_debug_rollout_data,
                identity,
                allow_mismatch=debug.allow_recording_mismatch,
                subsample=debug.load_debug_rollout_data_subsample,
                flag="--load-debug-rollout-data",
            )
        self.injector = None
        self._first_inject: tuple[int, int, int] | None = None  # rollout, recorded and engine weight versions
        if debug.ci_inject_rollout_data_path:
            self.injector = RolloutReplayer(
                debug.ci_inject_rollout_data_path,
                identity,
                allow_mismatch=debug.allow_recording_mismatch,
                flag="--ci-inject-rollout-data-path",
            )

    def check_recordings(self, rollout_ids: list[int]) -> None:
        """Before the first rollout: every recording the run will read (`--load-debug-rollout-data`,
        or `--ci-inject-rollout-data-path` from its start id) exists, is intact, holds the rollout it
        is read as and comes from one run with this run's setup (`RolloutReplayer.check_ready`), instead of failing after minutes of work.

        Raises:
            FileNotFoundError / RecordingMismatchError / RecordingError: see `check_ready`.
        """
        if self.replayer is not None:
            self.replayer.check_ready(rollout_ids)
            self._warn_mismatch(self.replayer)
        if self.injector is not None:
            start = self.cfg.debug.ci_inject_rollout_data_start_rollout_id
            self.injector.check_ready([r for r in rollout_ids if r >= start])
            self._warn_mismatch(self.injector)

    def rollout(self, rollout_id: int) -> list[Sample]:
        """This rank's samples of rollout `rollout_id`: generated (`perf/rollout_time`) or replayed."""
        if self.replayer is None:
            with self.timer("rollout"):
                return self.generate(rollout_id)
        with self.timer("load_rollout_data"):
            samples, version = self.replayer.load(rollout_id)
            samples = self._rank_share(samples)
        self._warn_mismatch(self.replayer)
        self.run_dir.event(
            "rollout_replayed", rollout_id=rollout_id, weight_version=version, samples=len(samples)
        )
        return samples

    def rewards(self, rollout_id: int, samples: list[Sample]) -> list[Sample]:
        """Fill `reward` of generated samples in place (`perf/reward_time`); return the samples to train on.

        Replay keeps the recorded rewards. Inject returns the recording (with its recorded rewards)
        after comparing the freshly scored samples with it.

        Raises:
            InjectMismatchError: inject, and the engine's samples do not match the recording.
        """
        if self.replayer is not None:
            return samples
        with self.timer("reward"):
            self.score(samples)
        if self.injector is None or rollout_id < self.cfg.debug.ci_inject_rollout_data_start_rollout_id:
            return samples
        return self._inject(rollout_id, samples)

    def advantages(self, samples: list[Sample]) -> None:
        """Fill `advantage` in place: GRPO, per group, from the rewards (timed with `perf/reward_time`)."""
        with self.timer("reward"):
            self.assign_advantages(samples)

    def _inject(self, rollout_id: int, fresh: list[Sample]) -> list[Sample]:
        assert self.injector is not None
        recorded, version = self.injector.load(rollout_id)
        recorded = self._rank_share(recorded)
        self._warn_mismatch(self.injector)
        report = compare_rollouts(fresh, recorded, rollout_id=rollout_id)
        threshold = self.cfg.debug.ci_inject_rollout_data_min_match_ratio
        engine_version = self.weight_version(fresh)
        self._first_inject = self._first_inject or (rollout_id, version, engine_version)
        note = frozen_recording_note(self._first_inject, version, engine_version)
        self.run_dir.event(
            "inject_check",
            rollout_id=rollout_id,
            mean_ratio=report.mean_ratio,
            min_ratio=report.min_ratio,
            threshold=threshold,
            worst=[m.__dict__ for m in report.worst],
            recorded_weight_version=version,
            engine_weight_version=engine_version,
            note=note,
        )
        log.info(f"inject {report.describe(threshold)}" + (f"\n  note: {note}" if note else ""))
        if not report.mean_ratio > threshold:
            why = note or "the engine holds other weights than the recording run's"
            raise InjectMismatchError(
                f"--ci-inject-rollout-data-min-match-ratio: {report.describe(threshold)}; {why}"
            )
        return recorded

    def generate(self, rollout_id: int) -> list[Sample]:
        """This rank's samples: `--n-samples-per-prompt` answers for each prompt of its share of the rollout.

        In-process engines: each rank generates its own contiguous share of the prompts. A multi-rank
        server run (`central_rollout.is_central`): rank 0 generates the whole rollout, broadcasts it,
        and every rank keeps its share (the same samples, indices and groups as the per-rank way).
        """
        cfg = self.cfg
        indices = rollout_prompt_indices(
            num_rows=len(self.dataset),
            rollout_id=rollout_id,
            rollout_batch_size=cfg.rollout.rollout_batch_size,
            seed=cfg.run.seed,
            shuffle=cfg.data.rollout_shuffle,
        )
        if not self.central:
            share = len(indices) // self.dist.world_size  # data-parallel rollout: a contiguous share per rank
            first = self.dist.rank * share
            return self._generate(rollout_id, indices[first : first + share], first)
        whole = self._generate(rollout_id, indices, 0) if self.dist.is_primary else None
        version = self.weight_version(whole or [])
        return self._rank_share(
            broadcast_samples(whole, self.dist, rollout_id=rollout_id, weight_version=version)
        )

    @staticmethod
    def weight_version(samples: list[Sample]) -> int:
        """The newest engine weight version among `samples` (0 for none)."""
        return max((s.weight_version for s in samples), default=0)

    def _generate(self, rollout_id: int, indices: list[int], first: int) -> list[Sample]:
        """Answers for the prompts at `indices` (rows of the prompt file), the first being prompt `first`
        of the rollout (sample and group indices count from there)."""
        cfg = self.cfg
        assert self.engine is not None
        prompts = [self.dataset[i] for i in indices]
        n = cfg.rollout.n_samples_per_prompt
        meta = [
            (first + g, k, p, derive_sample_seed(cfg.run.seed, rollout_id, p.index, k))
            for g, p in enumerate(prompts)
            for k in range(n)
        ]
        requests = [GenerationRequest(prompt_ids=p.prompt_ids, seed=seed) for _, _, p, seed in meta]
        results = self.engine.generate(requests, self.sampling)
        decode = self.dataset.tokenizer.decode
        return [
            Sample(
                index=first * n + i,
                prompt_index=p.index,
                group_index=g,
                sample_index=k,
                seed=seed,
                prompt_ids=list(p.prompt_ids),
                response_ids=list(res.response_ids),
                rollout_log_probs=res.log_probs.float().cpu(),
                loss_mask=torch.ones(len(res.response_ids), dtype=torch.float32),
                finish_reason=res.finish_reason,
                prompt_text=p.text,
                response_text=decode(res.response_ids, skip_special_tokens=True),
                label=p.label,
                kept_token_ids=res.kept_token_ids,
                weight_version=res.weight_version,
            )
            for i, ((g, k, p, seed), res) in enumerate(zip(meta, results))
        ]

    def score(self, samples: list[Sample]) -> None:
        """Fill `reward` in place (`--rm-type` or `--custom-rm-path` function)."""
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
        values = rewards.score_samples(
            records,
            rm_type=cfg.reward.rm_type,
            custom_fn=self.custom_reward,
            group_rm=cfg.reward.group_rm,
            group_size=cfg.rollout.n_samples_per_prompt,
            reward_key=cfg.reward.reward_key,
        )
        for s, r in zip(samples, values):
            s.reward = float(r)

    def assign_advantages(self, samples: list[Sample]) -> None:
        """GRPO advantages from the samples' rewards and group ids (recomputed on replay too, as Miles)."""
        algo = self.cfg.algorithm
        rewards_B = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        group_ids_B = torch.tensor([s.group_index for s in samples])
        estimator = algorithms.get_advantage_estimator(algo.advantage_estimator)
        advantages_B = estimator(
            rewards_B, group_ids_B, std_normalize=not algo.disable_grpo_std_normalization
        )
        for s, a in zip(samples, advantages_B.tolist()):
            s.advantage = float(a)

    def _rank_share(self, samples: list[Sample]) -> list[Sample]:
        """This rank's contiguous share of a whole recorded rollout (whole groups when groups divide evenly)."""
        share = len(samples) // self.dist.world_size
        return samples[self.dist.rank * share : (self.dist.rank + 1) * share]

    def _warn_mismatch(self, replayer: RolloutReplayer) -> None:
        for message in replayer.notes:
            log.info(f"warning: {message}")
            self.run_dir.event("recording_origin_unknown", detail=message)
        replayer.notes.clear()
        for message in replayer.warnings:
            log.info(f"warning: {message} (--allow-recording-mismatch)")
            self.run_dir.event("recording_mismatch_allowed", detail=message)
        replayer.warnings.clear()
