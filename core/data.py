"""Prompt datasets (jsonl or parquet) and the seeded order in which rollouts consume them.

Rollout n takes prompts at global positions [n·B, (n+1)·B) of an endless sequence of epochs,
each epoch a permutation seeded by (run seed, epoch) when `--rollout-shuffle` is on. The data
position is therefore a pure function of the rollout id, which is what makes resume exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """One prompt ready for the engine.

    Attributes:
        index: row number in the prompt file (0-based).
        text: the prompt string given to the tokenizer (chat template applied when asked).
        prompt_ids: token ids of `text`.
        label: the reference answer as a string (from `--label-key`).
    """

    index: int
    text: str
    prompt_ids: list[int]
    label: str


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read all rows of a .jsonl or .parquet file.

    Raises:
        FileNotFoundError: naming `--prompt-data` when the file is missing.
        ValueError: for another suffix or a line that is not a JSON object (with its line number).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"--prompt-data: {p} does not exist (expected a .jsonl or .parquet file)")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.suffix not in (".jsonl", ".json"):
        raise ValueError(f"--prompt-data: {p} must end in .jsonl or .parquet")
    rows = []
    with open(p, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--prompt-data: {p} line {line_no} is not valid JSON: {e}") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"--prompt-data: {p} line {line_no} is a {type(row).__name__}, expected a JSON object"
                )
            rows.append(row)
    return rows


class PromptDataset:
    """Rows of a prompt file, tokenized on demand.

    Args:
        path: `--prompt-data`.
        tokenizer: a transformers tokenizer (chat template needed with `apply_chat_template`).
        input_key / label_key: `--input-key` / `--label-key`.
        apply_chat_template: wrap the input as a user message and add the generation prompt.

    Raises:
        ValueError: empty file, or a row missing a key (names the key, the row and the keys present).
    """

    def __init__(
        self, path: str | Path, tokenizer, *, input_key: str, label_key: str, apply_chat_template: bool
    ) -> None:
        self.path = Path(path)
        self.rows = read_rows(path)
        if not self.rows:
            raise ValueError(f"--prompt-data: {path} holds no rows")
        for i, row in enumerate(self.rows):
            for flag, key in (("--input-key", input_key), ("--label-key", label_key)):
                if key not in row:
                    raise ValueError(
                        f"{flag} {key!r}: row {i} of {path} has no such field (fields: {sorted(row)})"
                    )
                if row[key] is None:
                    raise ValueError(f"{flag} {key!r}: row {i} of {path} is null")
            content = row[input_key]
            if isinstance(content, list) and not apply_chat_template:
                raise ValueError(
                    f"--input-key {input_key!r}: row {i} of {path} is a list of chat messages; pass --apply-chat-template"
                )
            if isinstance(content, str) and not content.strip():
                raise ValueError(f"--input-key {input_key!r}: row {i} of {path} is an empty prompt")
        if apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("--apply-chat-template: the tokenizer of --hf-checkpoint has no chat template")
        self.tokenizer = tokenizer
        self.input_key = input_key
        self.label_key = label_key
        self.apply_chat_template = apply_chat_template

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Prompt:
        row = self.rows[index]
        content = row[self.input_key]
        if self.apply_chat_template:
            messages = content if isinstance(content, list) else [{"role": "user", "content": str(content)}]
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = str(content)
        prompt_ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return Prompt(index=index, text=text, prompt_ids=prompt_ids, label=str(row[self.label_key]))


def rollout_prompt_indices(
    *, num_rows: int, rollout_id: int, rollout_batch_size: int, seed: int, shuffle: bool
) -> list[int]:
    """Row indices of the prompts that rollout `rollout_id` uses.

    Global position g = rollout_id·B + j (j < B) maps to epoch g // num_rows and offset g % num_rows
    in that epoch's order: a permutation from numpy's PCG64 seeded with (seed, epoch) when shuffling,
    the file order otherwise.
    """
    start = rollout_id * rollout_batch_size
    indices = []
    cached_epoch, order = -1, None
    for g in range(start, start + rollout_batch_size):
        epoch, offset = divmod(g, num_rows)
        if epoch != cached_epoch:
            order = (
                np.random.default_rng([seed, epoch]).permutation(num_rows) if shuffle else np.arange(num_rows)
            )
            cached_epoch = epoch
        indices.append(int(order[offset]))
    return indices
