"""Recording rollouts during a run, replaying them into training, and checking injected rollouts.

- `RolloutRecorder` writes each rollout to `--save-debug-rollout-data` (template with `{rollout_id}`).
- `RolloutReplayer` loads `--load-debug-rollout-data` / `--ci-inject-rollout-data-path` recordings,
  refusing one whose model, tokenizer, chat template or training-relevant config differs from this
  run (the message lists the differing fields; `--allow-recording-mismatch` overrides).
- `compare_rollouts` is the inject-mode check (Miles `RolloutDataInjectionUtil`, notes 1.5): prompt
  tokens must match exactly; per sample, response match ratio = positions where both responses hold
  the same token (compared up to the shorter length) / the longer length (1.0 if both are empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.core.batch import Sample
from grpolab.core.model_files import compare_model_fingerprints, config_only_warning
from grpolab.replay.recording import compare_fingerprints, format_path, load_rollout, save_rollout


class RecordingMismatchError(ValueError):
    """A recording made with another model, tokenizer, chat template or training config."""


class InjectMismatchError(RuntimeError):
    """Inject mode: fresh generation and the recording disagree beyond the allowed threshold."""


@dataclass(frozen=True, kw_only=True)
class RunIdentity:
    """What a recording must share with the run that replays it."""

    fingerprints: dict[str, str]
    train_config: dict[str, Any]


class RolloutRecorder:
    """Writes every rollout of a run to `template.format(rollout_id=...)` (atomic, non-pickle)."""

    def __init__(
        self, template: str, identity: RunIdentity, *, run_seed: int, sampler: dict[str, Any]
    ) -> None:
        format_path(template, 0)  # validate the template before any work
        self.template = template
        self.identity = identity
        self.run_seed = run_seed
        self.sampler = sampler

    def save(self, samples: list[Sample], *, rollout_id: int | str, weight_version: int) -> tuple[Path, int]:
        """Write one rollout; return (path, bytes written)."""
        path = Path(format_path(self.template, rollout_id))
        path.parent.mkdir(parents=True, exist_ok=True)
        size = save_rollout(
            path,
            samples,
            rollout_id=rollout_id,
            weight_version=weight_version,
            run_seed=self.run_seed,
            sampler=self.sampler,
            fingerprints=self.identity.fingerprints,
            train_config=self.identity.train_config,
        )
        return path, size


class RolloutReplayer:
    """Loads recorded rollouts by id and checks they belong to this run's model and config.

    Args:
        template: path template with `{rollout_id}`.
        identity: this run's fingerprints and training-relevant config.
        allow_mismatch: `--allow-recording-mismatch`: warn instead of refusing.
        subsample: `--load-debug-rollout-data-subsample F` (keep about F of the samples).
        flag: the flag named in error messages.
    """

    def __init__(
        self,
        template: str,
        identity: RunIdentity,
        *,
        allow_mismatch: bool = False,
        subsample: float | None = None,
        flag: str,
    ) -> None:
        format_path(template, 0)
        self.template = template
        self.identity = identity
        self.allow_mismatch = allow_mismatch
        self.subsample = subsample
        self.flag = flag
        self.warnings: list[str] = []

    def load(self, rollout_id: int) -> tuple[list[Sample], int]:
        """Samples of recorded rollout `rollout_id` and the weight version they were generated with.

        Raises:
            FileNotFoundError: naming the expected path when the recording is missing.
            RecordingMismatchError: listing every differing field (unless allow_mismatch).
            grpolab.replay.format.RecordingError: for a corrupt, truncated or future-version file.
        """
        path = Path(format_path(self.template, rollout_id))
        if not path.is_file():
            raise FileNotFoundError(f"{self.flag}: no recording for rollout {rollout_id}: expected {path}")
        recording = load_rollout(path)
        recorded = {**recording.fingerprints, "train_config": recording.train_config}
        current = {**self.identity.fingerprints, "train_config": self.identity.train_config}
        model = current.get("model_fingerprint", "")
        if compare_model_fingerprints(recorded.get("model_fingerprint", ""), model) == "config-only":
            recorded["model_fingerprint"] = model  # made before weights were fingerprinted: warn, not refuse
            note = config_only_warning(f"{self.flag}: {path}")
            if note not in self.warnings:
                self.warnings.append(note)
        diffs = compare_fingerprints(recorded, current)
        if diffs:
            message = f"{self.flag}: {path} was recorded with a different setup:\n  " + "\n  ".join(diffs)
            if not self.allow_mismatch:
                raise RecordingMismatchError(
                    message + "\n(pass --allow-recording-mismatch to replay it anyway)"
                )
            self.warnings.append(message)
        samples = recording.samples
        if self.subsample is not None:
            samples = subsample_samples(samples, self.subsample)
        return samples, recording.weight_version


def subsample_samples(samples: list[Sample], fraction: float) -> list[Sample]:
    """Keep about `fraction` of the samples: the first half from the head, the rest from the tail (Miles).

    Raises:
        ValueError: naming `--load-debug-rollout-data-subsample` unless 0 < fraction <= 1.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"--load-debug-rollout-data-subsample must be in (0, 1], got {fraction}")
    keep = max(1, round(len(samples) * fraction))
    head = (keep + 1) // 2
    tail = keep - head
    return samples[:head] + (samples[len(samples) - tail :] if tail else [])


@dataclass(frozen=True, kw_only=True)
class SampleMatch:
    """Match of one fresh sample against its recording."""

    index: int
    ratio: float
    first_diff: int | None
    """First response position whose token differs (None when the responses are identical)."""


@dataclass(frozen=True, kw_only=True)
class InjectReport:
    """Inject-mode comparison of one rollout."""

    rollout_id: int
    mean_ratio: float
    min_ratio: float
    worst: list[SampleMatch]
    num_samples: int

    def describe(self, threshold: float) -> str:
        worst = ", ".join(
            f"sample {m.index}: {m.ratio:.3f} (first diff at token {m.first_diff})"
            for m in self.worst
            if m.ratio < 1.0
        )
        return (
            f"rollout {self.rollout_id}: mean response-token match ratio {self.mean_ratio:.4f} "
            f"(min {self.min_ratio:.4f}, threshold {threshold}, {self.num_samples} samples)"
            + (f"; lowest: {worst}" if worst else "")
        )


def sample_match(fresh: list[int], recorded: list[int]) -> tuple[float, int | None]:
    """(positional match ratio, first differing position) of two responses."""
    longest = max(len(fresh), len(recorded))
    if longest == 0:
        return 1.0, None
    same = [a == b for a, b in zip(fresh, recorded)]
    first = next((i for i, s in enumerate(same) if not s), None)
    if first is None and len(fresh) != len(recorded):
        first = min(len(fresh), len(recorded))
    return sum(same) / longest, first


def compare_rollouts(
    fresh: list[Sample], recorded: list[Sample], *, rollout_id: int, worst: int = 5
) -> InjectReport:
    """Compare a fresh generation with the recorded rollout that will replace it.

    Raises:
        InjectMismatchError: different sample counts or any prompt whose tokens differ (names the sample).
    """
    if len(fresh) != len(recorded):
        raise InjectMismatchError(
            f"rollout {rollout_id}: engine generated {len(fresh)} samples, the recording holds {len(recorded)}"
        )
    matches = []
    for i, (f, r) in enumerate(zip(fresh, recorded)):
        if f.prompt_ids != r.prompt_ids:
            raise InjectMismatchError(
                f"rollout {rollout_id}: sample {i} prompt tokens differ from the recording "
                f"(lengths {len(f.prompt_ids)} vs {len(r.prompt_ids)}); the data order or chat template changed"
            )
        ratio, first = sample_match(f.response_ids, r.response_ids)
        matches.append(SampleMatch(index=i, ratio=ratio, first_diff=first))
    ratios = [m.ratio for m in matches]
    return InjectReport(
        rollout_id=rollout_id,
        mean_ratio=sum(ratios) / len(ratios) if ratios else 1.0,
        min_ratio=min(ratios, default=1.0),
        worst=sorted(matches, key=lambda m: m.ratio)[:worst],
        num_samples=len(matches),
    )
