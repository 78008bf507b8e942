"""The `dynamic` rollout path: dynamic sampling with over-sampling (`--dynamic-sampling-filter-path`).

Miles' loop (`sglang_rollout.generate_rollout_async`, the Miles-101 manual section 4.1) for an engine
that decodes a round as one call. Each round draws `--over-sampling-batch-size` prompts from the run's
prompt stream (core/data.prompt_stream_indices; the position is `TrainerState.data_position`, restored
on resume), generates their groups as the engine path does (same seeds: core/seeding.py), scores them
and asks the filter about each group in prompt order. Kept groups fill the rollout up to
`--rollout-batch-size`; the rest of the round's kept groups are surplus (counted, not trained). Rounds
go on until the rollout is full or `--max-refill-rounds` rounds were spent; then the run fails with
the ledger's summary (`RefillExhausted`), never sampling forever.

The kept groups are renumbered as an ordinary rollout (group g of the rollout, sample index g·n + k),
so advantages, recordings, replays and checks see a rollout of the usual shape whose rewards, masks and
log-probs are exactly the kept groups' (the filtered batch never carries the unfiltered columns).
Rewards are scored inside `rollout` (the filter needs them): `rewards` returns the samples as they are.
With `--save-debug-rollout-data` every scored group of the rollout, kept or not, is recorded too, as
rollout id `candidates_N` (each sample's fate in its metadata), so `grpolab replay filter` can run
another filter over them offline (rollout/filter_replay.py).
Every rollout's `ledger` event and `rollout/ledger/*` metrics say where the generated tokens went
(rollout/ledger.py); the rows drawn but never trained are counted over this process's rollouts (a
resumed run starts counting again). On more than one rank, rank 0 runs every round of the whole
rollout with its engine (the same seeds, prompts and verdicts as one rank), writes the ledger, and sends
the kept rollout to the others (`central.broadcast_samples`, the recording's bytes); each rank keeps its
contiguous share (`base.rank_share`), as a replayed rollout is split. So the ranks agree on the groups
they train, and the rollout is the one-rank run's. A rollout rank 0 cannot fill ends the run from rank 0
(its error names the ledger; torchrun ends the other ranks).
"""

from __future__ import annotations

import dataclasses
import logging

from grpolab.core.batch import Sample
from grpolab.core.config import Config
from grpolab.core.data import prompt_stream_indices
from grpolab.rollout.base import RolloutInputs, newest_weight_version, rank_share
from grpolab.rollout.central import broadcast_samples
from grpolab.rollout.custom_generate import miles_args
from grpolab.rollout.filters import FLAG, apply_filter, load_filter
from grpolab.rollout.ledger import RolloutLedger
from grpolab.rollout.live import LivePath, generate
from grpolab.rollout.scoring import score

log = logging.getLogger("grpolab")
NEVER_LISTED = 100
"""How many never-trained prompt rows a `ledger` event lists (all are counted)."""


FATE_KEY = "dynamic_filter"
"""Sample metadata key of a group's fate: {"fate": "kept" | "filtered" | "surplus", "reason", "round"}."""


def candidates_rollout_id(rollout_id: int) -> str:
    """The recording id of a rollout's candidates (`--save-debug-rollout-data` with `{rollout_id}` =
    "candidates_N"): every group generated for rollout N, kept or not, for `grpolab replay filter`."""
    return f"candidates_{rollout_id}"


class RefillExhausted(RuntimeError):
    """The filter kept fewer than `--rollout-batch-size` groups in `--max-refill-rounds` rounds."""


class DynamicSamplingPath(LivePath):
    """Rounds of over-sampled groups, filtered until the rollout is full (see the module docstring).

    Raises:
        ValueError: the filter does not import (`rollout.filters.load_filter`; train/preflight.py checked it,
            and refused more than one rank).
    """

    name = "dynamic"

    @staticmethod
    def chosen(config: Config, world_size: int) -> bool:
        """When `--dynamic-sampling-filter-path` names a filter."""
        return config.dynamic_sampling.active

    def __init__(self, inputs: RolloutInputs) -> None:
        super().__init__(inputs)
        cfg = self.config.dynamic_sampling
        assert cfg.dynamic_sampling_filter_path is not None  # chosen() holds
        self.filter = load_filter(cfg.dynamic_sampling_filter_path)
        self.args = miles_args(self.config, "127.0.0.1", 0)
        self.data_position: int | None = None
        """The prompt stream's next position (None until the first rollout or a resume sets it)."""
        self.drawn: set[int] = set()
        self.trained: set[int] = set()
        self.ledger: RolloutLedger | None = None
        self.candidates: list[Sample] = []
        """The last rollout's every scored group in generation order (candidate numbering), each sample's
        fate in `metadata["dynamic_filter"]`: recorded beside the rollout (`candidates_rollout_id`)."""

    def rollout(self, rollout_id: int) -> list[Sample]:
        """This rank's share of the rollout's kept groups, renumbered (`perf/rollout_time` generating,
        `perf/reward_time` scoring): all of them on one rank; on more, rank 0 fills the rollout and
        broadcasts it (a collective every rank joins; see the module docstring).

        Raises:
            RefillExhausted: too few groups kept in `--max-refill-rounds` rounds (the ledger is written first).
            FilterError: the filter raised or returned something else (named, with its file:line).
        """
        ctx = self.inputs.dist
        if not ctx.distributed:
            return self._fill(rollout_id)
        whole = self._fill(rollout_id) if ctx.is_primary else None
        version = newest_weight_version(whole or [])
        return rank_share(broadcast_samples(whole, ctx, rollout_id=rollout_id, weight_version=version), ctx)

    def _fill(self, rollout_id: int) -> list[Sample]:
        """The whole rollout's kept groups, renumbered, from rounds of this rank's engine."""
        cfg, inputs = self.config, self.inputs
        target, n = cfg.rollout.rollout_batch_size, cfg.rollout.n_samples_per_prompt
        per_round = cfg.dynamic_sampling.over_sampling_batch_size or target
        if self.data_position is None:
            self.data_position = (
                rollout_id * target
            )  # a fresh run (rollout 0) or one resumed without a position
        ledger = self.ledger = RolloutLedger(rollout_id)
        kept: list[list[Sample]] = []
        self.candidates = []
        while len(kept) < target and ledger.rounds < cfg.dynamic_sampling.max_refill_rounds:
            indices = prompt_stream_indices(num_rows=len(inputs.dataset), start=self.data_position, count=per_round,
                                            seed=cfg.run.seed, shuffle=cfg.data.rollout_shuffle)  # fmt: skip
            self.data_position += per_round
            with inputs.timer("rollout"):
                samples = generate(cfg, inputs.engine, inputs.dataset, inputs.sampling, rollout_id=rollout_id,
                                   indices=indices, first=ledger.rounds * per_round, tools=inputs.tools,
                                   custom=inputs.custom)  # fmt: skip
            with inputs.timer("reward"):
                score(cfg, samples, inputs.custom_reward)
            ledger.rounds += 1
            for group in (samples[g * n : (g + 1) * n] for g in range(len(indices))):
                self.drawn.add(group[0].prompt_index)
                verdict = apply_filter(self.filter, self.args, group)
                fate = "filtered" if not verdict.keep else "kept" if len(kept) < target else "surplus"
                ledger.add(group, fate, verdict.reason)
                for s in group:
                    s.metadata[FATE_KEY] = {
                        "fate": fate,
                        "reason": verdict.reason,
                        "round": ledger.rounds - 1,
                    }
                if fate == "kept":
                    kept.append(group)
                self.candidates += group
        self.trained.update(group[0].prompt_index for group in kept)
        self._write_ledger(ledger)
        if len(kept) < target:
            raise RefillExhausted(
                f"{FLAG}: the filter kept {len(kept)} of the {target} groups rollout {rollout_id} needs in "
                f"--max-refill-rounds {cfg.dynamic_sampling.max_refill_rounds} rounds: {ledger.summary()}"
            )
        return [dataclasses.replace(s, index=g * n + k, group_index=g, sample_index=k)
                for g, group in enumerate(kept) for k, s in enumerate(group)]  # fmt: skip

    def rewards(self, rollout_id: int, samples: list[Sample]) -> list[Sample]:
        """The samples as `rollout` scored them (the filter needed their rewards)."""
        return samples

    def extra_metrics(self, rollout_id: int) -> dict[str, float]:
        """The last rollout's ledger keys for the `rollout N:` line (rollout/ledger.py)."""
        return {} if self.ledger is None else self.ledger.metrics(len(self.drawn - self.trained))

    def _write_ledger(self, ledger: RolloutLedger) -> None:
        epoch = (self.data_position or 0) // max(len(self.inputs.dataset), 1)
        never = sorted(self.drawn - self.trained)
        self.inputs.run_dir.event("ledger", **ledger.record(never[:NEVER_LISTED], len(never), epoch))
        log.info(f"ledger of rollout {ledger.rollout_id}: {ledger.summary()}")
