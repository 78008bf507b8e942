"""The identity of a run's prompt stream, stored in every checkpoint and compared on `--load`.

Rollout n reads the rows `data.rollout_prompt_indices(num_rows, n, B, seed, shuffle)` of the prompt
file, so the order depends on the file's rows, `--rollout-batch-size`, `--seed` and
`--rollout-shuffle`; what the model sees of a row depends on `--input-key`, `--label-key` and
`--apply-chat-template` (whose default follows whether `--prompt-data` is given, so a resume with a
copy of the data at another path silently drops the template). A checkpoint resumed with any of
these changed skips, repeats or rewrites prompts; this module says what changed. The file is identified by its content (size, row count, SHA-256), not its
path: the same file at another path reads the same rows, so a moved file alone is no mismatch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpolab.core.file_hash import sha256_of


@dataclass(frozen=True, kw_only=True)
class DataIdentity:
    """What decides which prompt rows each rollout reads.

    Attributes:
        prompt_data: `--prompt-data`, resolved to an absolute path (reported, never compared alone).
        file_bytes: the file's size in bytes; num_rows: rows read from it.
        sha256: hex SHA-256 of the file's bytes.
        rollout_batch_size / seed / rollout_shuffle: the flags of the same names.
        input_key / label_key / apply_chat_template: the flags of the same names (resolved).
    """

    prompt_data: str
    file_bytes: int
    num_rows: int
    sha256: str
    rollout_batch_size: int
    seed: int
    rollout_shuffle: bool
    input_key: str
    label_key: str
    apply_chat_template: bool

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored as `trainer_state.json`'s "data_identity"."""
        return asdict(self)


ORDER_FIELDS: dict[str, str] = {
    "file_bytes": "size of --prompt-data (bytes)",
    "num_rows": "rows of --prompt-data",
    "sha256": "SHA-256 of --prompt-data",
    "rollout_batch_size": "--rollout-batch-size",
    "seed": "--seed",
    "rollout_shuffle": "--rollout-shuffle",
}
"""The fields that change the prompt order, with the name a message gives each."""
PROMPT_FIELDS: dict[str, str] = {
    "input_key": "--input-key",
    "label_key": "--label-key",
    "apply_chat_template": "--apply-chat-template",
}
"""The fields that change what a row's prompt and label are; checkpoints saved before they were
stored lack them (`unrecorded_fields`: a warning, not a refusal)."""


def data_identity(
    prompt_data: str | Path,
    *,
    num_rows: int,
    rollout_batch_size: int,
    seed: int,
    shuffle: bool,
    input_key: str,
    label_key: str,
    apply_chat_template: bool,
) -> DataIdentity:
    """The identity of the prompt stream of a run reading `num_rows` rows of `prompt_data`.

    Raises:
        OSError: the file cannot be read (the dataset read it just before, so this is rare).
    """
    path = Path(prompt_data).expanduser().resolve()
    return DataIdentity(
        prompt_data=str(path),
        file_bytes=path.stat().st_size,
        num_rows=num_rows,
        sha256=sha256_of(path),  # read each time: prompt files are small
        rollout_batch_size=rollout_batch_size,
        seed=seed,
        rollout_shuffle=shuffle,
        input_key=input_key,
        label_key=label_key,
        apply_chat_template=bool(apply_chat_template),
    )


def identity_differences(saved: dict[str, Any], current: DataIdentity) -> list[str]:
    """What differs between a checkpoint's stored identity and this run's, one phrase per field
    (`--seed: 1234 in the checkpoint, 7 now`); [] when the prompt order is the same.

    `ORDER_FIELDS` and `PROMPT_FIELDS` count; when one of them differs and the path differs too,
    the path is named first. An `ORDER_FIELDS` field missing from `saved` (an edited file) counts
    as different; a missing `PROMPT_FIELDS` one does not (`unrecorded_fields` names it).
    """
    now = current.to_dict()
    recorded = {**ORDER_FIELDS, **{k: v for k, v in PROMPT_FIELDS.items() if k in saved}}
    out = [
        f"{name}: {_show(saved.get(key, '(not recorded)'))} in the checkpoint, {_show(now[key])} now"
        for key, name in recorded.items()
        if saved.get(key) != now[key]
    ]
    if out and saved.get("prompt_data") != current.prompt_data:
        out.insert(
            0, f"--prompt-data: {saved.get('prompt_data')} in the checkpoint, {current.prompt_data} now"
        )
    return out


def unrecorded_fields(saved: dict[str, Any]) -> list[str]:
    """The flags of `PROMPT_FIELDS` that a stored identity lacks (saved by an older grpolab)."""
    return [flag for key, flag in PROMPT_FIELDS.items() if key not in saved]


def _show(value: Any) -> str:
    return value[:12] if isinstance(value, str) and len(value) == 64 else str(value)  # a SHA-256: its prefix
