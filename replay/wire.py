"""Samples as bytes for another process: the `.grz` recording format (recording.py), held in memory.

Multi-rank runs whose engine fleet is driven by rank 0 alone (rollout/central.py) send each
rollout to the other ranks in these bytes: the same arrays and header a recording file holds, so
every field a recording keeps survives exactly (token ids, float32 log-probs bit for bit, kept
token sets, seeds, texts, metadata) and nothing is pickled. The header carries the rollout id and
weight version; fingerprints and the train config are left empty (sender and receiver are one run).
"""

from __future__ import annotations

from grpolab.core.batch import Sample
from grpolab.replay.format import decode_container, encode_container
from grpolab.replay.recording import recording_from_container, rollout_container

WIRE_LEVEL = 1
"""zstd level of the bytes: the fastest, as they live for one broadcast (recording files use 3)."""


def encode_samples(samples: list[Sample], *, rollout_id: int, weight_version: int) -> bytes:
    """The bytes of `samples` (a `.grz` container, as `replay.recording.save_rollout` writes to a file).

    Raises:
        ValueError: a sample `recording.rollout_arrays` rejects (index named), a bad rollout id.
        TypeError: metadata that is not JSON-serializable.
    """
    header, arrays = rollout_container(
        samples,
        rollout_id=rollout_id,
        weight_version=weight_version,
        run_seed=0,
        sampler={},
        fingerprints={},
        train_config={},
        extra={"source": "wire"},
    )
    return encode_container(header, arrays, level=WIRE_LEVEL)


def decode_samples(data: bytes, *, name: str = "<broadcast rollout>") -> tuple[list[Sample], int]:
    """The samples `encode_samples` made `data` from, and the rollout id it names.

    Tensors come back as `load_rollout` rebuilds them: rollout_log_probs / loss_mask float32 [R],
    kept_token_ids a list of int64 [k] tensors or None.

    Raises:
        RecordingError: `data` is cut, corrupt (checksums) or not a rollout container (`name` in the message).
    """
    header, arrays = decode_container(data, name=name)
    recording = recording_from_container(header, arrays, name=name)
    return recording.samples, int(recording.rollout_id)
