"""Recording rollouts during a run and replaying them into training (inject mode's check: inject.py).

- `RolloutRecorder` writes each rollout to `--save-debug-rollout-data` (template with `{rollout_id}`),
  each header naming the run that wrote it (run id, run dir); before the first rollout it refuses
  to replace a recording another run made (`--overwrite-debug-rollout-data` allows it).
- `RolloutReplayer` loads `--load-debug-rollout-data` / `--ci-inject-rollout-data-path` recordings.
  Before the first rollout it checks that every one the run will read exists, is intact (checksums
  verified), holds the rollout it is read as (its header's rollout id), and that they come from one
  run; it refuses a recording whose model, tokenizer, chat template or training-relevant config differs from this run (the message lists the differing fields), and a set recorded by
  different runs (naming the files and both runs); `--allow-recording-mismatch` turns both into
  warnings. Recordings made before run identities existed carry none: they load, with a warning
  that their origin cannot be checked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpolab.core.atomic import leftover_temps
from grpolab.core.batch import Sample
from grpolab.core.model_files import compare_model_fingerprints, config_only_warning
from grpolab.replay.fingerprints import FINGERPRINT_FIELDS, compare_fingerprints
from grpolab.replay.format import RecordingError, read_header
from grpolab.replay.paths import SAVE_FLAG, format_path
from grpolab.replay.recording import load_rollout, save_rollout, verify_rollout

log = logging.getLogger("grpolab")

SHOWN = 8
"""How many files an error message lists before "and N more"."""


class RecordingMismatchError(ValueError):
    """A recording made with another model, tokenizer, chat template or training config."""


@dataclass(frozen=True, kw_only=True)
class RunIdentity:
    """What a recording must share with the run that replays it."""

    fingerprints: dict[str, str]
    train_config: dict[str, Any]


def _listing(lines: list[str]) -> str:
    """Up to `SHOWN` lines, indented, then "and N more"."""
    more = f"\n  ... and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
    return "\n  " + "\n  ".join(lines[:SHOWN]) + more


def describe_run(header: dict[str, Any]) -> str:
    """A recording's run identity for messages: "run <id> (run dir D, seed S)"; older recordings
    have no run id and say so."""
    run_id = header.get("run_id") or ""
    if not run_id:
        return f"an unnamed run (recorded before run identities, seed {header.get('run_seed')})"
    return f"run {run_id} (run dir {header.get('run_dir') or '?'}, seed {header.get('run_seed')})"


class RolloutRecorder:
    """Writes every rollout of a run to `template.format(rollout_id=...)` (atomic, non-pickle).

    Args:
        template: `--save-debug-rollout-data`, a path template with `{rollout_id}`.
        identity: fingerprints and training-relevant config written into every header.
        run_seed: the run's `--seed`.
        sampler: temperature, top_p, top_k, max_new_tokens.
        run_id / run_dir: this run's identity (run.json's run_id, `--run-dir`), in every header.
    """

    def __init__(
        self,
        template: str,
        identity: RunIdentity,
        *,
        run_seed: int,
        sampler: dict[str, Any],
        run_id: str,
        run_dir: str,
    ) -> None:
        format_path(template, 0)  # validate the template before any work
        self.template = template
        self.identity = identity
        self.run_seed = run_seed
        self.sampler = sampler
        self.run_id = run_id
        self.run_dir = run_dir

    def check_free(self, rollout_ids: list[int | str], *, overwrite: bool) -> list[Path]:
        """Before the first rollout: the files this run will write that already hold a recording.

        A file recorded by this same run (its header names this run id: a run continued after a
        crash redoes the rollouts after its last checkpoint) may be replaced.

        Args:
            rollout_ids: every id the run will record (ints, and "eval_N" for evals).
            overwrite: `--overwrite-debug-rollout-data`: return the files instead of refusing.

        Returns:
            The existing files another run (or an unreadable file) holds that will be replaced.

        Raises:
            FileExistsError: some exist and `overwrite` is False (names the files, their runs and
                the flag that allows it).
        """
        taken = []
        for rollout_id in rollout_ids:
            path = Path(format_path(self.template, rollout_id))
            if not path.exists():
                continue
            try:
                header = read_header(path)
            except RecordingError as e:
                taken.append((path, f"not a readable recording ({e})"))
                continue
            if not (self.run_id and header.get("run_id") == self.run_id):
                taken.append((path, f"recorded by {describe_run(header)}"))
        if taken and not overwrite:
            raise FileExistsError(
                f"{SAVE_FLAG}: {len(taken)} of the {len(rollout_ids)} recordings this run will write "
                f"already exist (this run is {self.run_id}):"
                + _listing([f"{p}: {why}" for p, why in taken])
                + "\nchoose another template, or pass --overwrite-debug-rollout-data to replace them"
            )
        return [p for p, _ in taken]

    def remove_leftover_temps(self, rollout_ids: list[int | str]) -> list[tuple[Path, int]]:
        """Before the first rollout: remove the temp files a killed run left beside the recordings
        this run will write (`.<name>.<random>.tmp`, `core.atomic.leftover_temps`), logging each.
        Their writer is over: the files are this run's to write (`check_free`), and the run
        directory's lock keeps a second live run of it out.

        Returns:
            (path, bytes) of each file removed.
        """
        removed = []
        for rollout_id in rollout_ids:
            for tmp in leftover_temps(format_path(self.template, rollout_id)):
                size = tmp.stat().st_size
                tmp.unlink(missing_ok=True)
                log.info(
                    f"{SAVE_FLAG}: removed {tmp} ({size} bytes), left by a recording write that did not finish"
                )
                removed.append((tmp, size))
        return removed

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
            run_id=self.run_id,
            run_dir=self.run_dir,
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
        format_path(template, 0, flag=flag)
        self.template = template
        self.identity = identity
        self.allow_mismatch = allow_mismatch
        self.subsample = subsample
        self.flag = flag
        self.warnings: list[str] = []
        """Mismatches let through by allow_mismatch, for the caller to log (and clear)."""
        self.notes: list[str] = []
        """What could not be checked (recordings without a run id), for the caller to log (and clear)."""

    def path(self, rollout_id: int) -> Path:
        """Where recorded rollout `rollout_id` is read from."""
        return Path(format_path(self.template, rollout_id, flag=self.flag))

    def check_ready(self, rollout_ids: list[int]) -> None:
        """Before the first rollout: every recording the run will read exists, is intact (both
        checksums and the array table are verified: `verify_rollout` reads each file whole, about as
        long as loading it), holds the rollout it is read as, was made with this run's setup, and all
        come from one run.

        Raises:
            FileNotFoundError: listing every missing recording.
            RecordingMismatchError: a recording whose header names another rollout (listing each file,
                the rollout asked for and the one it holds), made with another setup (see `load`), or
                recordings of different runs (naming the files of each run); warnings instead with
                allow_mismatch.
            grpolab.replay.format.RecordingError: a file that is not an intact recording (corrupt,
                truncated, not a recording), named.
        """
        paths = {rollout_id: self.path(rollout_id) for rollout_id in rollout_ids}
        missing = [f"rollout {r}: expected {p}" for r, p in paths.items() if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{self.flag}: {len(missing)} of the {len(paths)} rollouts this run reads have no recording "
                "(checked before the first rollout):" + _listing(missing)
            )
        headers = {}
        for r, p in paths.items():
            try:
                headers[p] = verify_rollout(p)
            except RecordingError as e:
                raise RecordingError(
                    f"{self.flag}: rollout {r}: {e} (checked before the first rollout)"
                ) from None
        self._check_rollout_ids({r: (p, headers[p]["rollout_id"]) for r, p in paths.items()})
        for p, header in headers.items():
            self._check_setup(
                p, {k: header.get(k, "") for k in FINGERPRINT_FIELDS}, header.get("train_config")
            )
        self._check_one_run(headers)

    def _check_rollout_ids(self, recorded: dict[int, tuple[Path, int | str]]) -> None:
        """Refuse (or warn about, with allow_mismatch) files read as rollout r whose header names
        another rollout: a renamed or copied recording would train rollout r on another rollout's data.

        Args:
            recorded: rollout id asked for -> (its file, the rollout id its header names).
        """
        wrong = [
            f"{p}: read as rollout {r}, but its header says rollout {held!r}"
            for r, (p, held) in recorded.items()
            if held != r
        ]
        if not wrong:
            return
        message = (
            f"{self.flag}: {len(wrong)} recording(s) hold another rollout than the one this run reads "
            "them as (a renamed or copied file):" + _listing(wrong)
        )
        if not self.allow_mismatch:
            raise RecordingMismatchError(
                message + "\n(pass --allow-recording-mismatch to train on them as named anyway)"
            )
        if message not in self.warnings:
            self.warnings.append(message)

    def _check_one_run(self, headers: dict[Path, dict[str, Any]]) -> None:
        by_run: dict[str, list[Path]] = {}
        for p, header in headers.items():
            by_run.setdefault(str(header.get("run_id") or ""), []).append(p)
        unnamed = by_run.pop("", [])
        if unnamed:
            self.notes.append(
                f"{self.flag}: {len(unnamed)} recording(s) predate run identities (no run_id in the header), "
                f"so they cannot be checked to come from one run: {', '.join(map(str, unnamed[:SHOWN]))}"
            )
        if len(by_run) < 2:
            return
        runs = [
            f"{', '.join(map(str, ps[:SHOWN]))}: {describe_run(headers[ps[0]])}" for ps in by_run.values()
        ]
        message = f"{self.flag}: these recordings come from {len(by_run)} different runs:" + _listing(runs)
        if not self.allow_mismatch:
            raise RecordingMismatchError(
                message + "\n(one replay trains on one run's rollouts; pass --allow-recording-mismatch "
                "to mix them anyway)"
            )
        self.warnings.append(message)

    def _check_setup(self, path: Path, fingerprints: dict[str, str], train_config: Any) -> None:
        """Refuse (or warn about, with allow_mismatch) a recording made with another setup."""
        recorded = {**fingerprints, "train_config": train_config}
        current = {**self.identity.fingerprints, "train_config": self.identity.train_config}
        model = current.get("model_fingerprint", "")
        if compare_model_fingerprints(recorded.get("model_fingerprint", ""), model) == "config-only":
            recorded["model_fingerprint"] = model  # made before weights were fingerprinted: warn, not refuse
            note = config_only_warning(f"{self.flag}: {path}")
            if note not in self.warnings:
                self.warnings.append(note)
        diffs = compare_fingerprints(recorded, current)
        if not diffs:
            return
        message = f"{self.flag}: {path} was recorded with a different setup:\n  " + "\n  ".join(diffs)
        if not self.allow_mismatch:
            raise RecordingMismatchError(message + "\n(pass --allow-recording-mismatch to replay it anyway)")
        if message not in self.warnings:
            self.warnings.append(message)

    def load(self, rollout_id: int) -> tuple[list[Sample], int]:
        """Samples of recorded rollout `rollout_id` and the weight version they were generated with.

        Raises:
            FileNotFoundError: naming the expected path when the recording is missing.
            RecordingMismatchError: listing every differing field, or a header that names another
                rollout (unless allow_mismatch).
            grpolab.replay.format.RecordingError: for a corrupt, truncated or future-version file.
        """
        path = self.path(rollout_id)
        if not path.is_file():
            raise FileNotFoundError(f"{self.flag}: no recording for rollout {rollout_id}: expected {path}")
        recording = load_rollout(path)
        self._check_rollout_ids({rollout_id: (path, recording.rollout_id)})
        self._check_setup(path, recording.fingerprints, recording.train_config)
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
