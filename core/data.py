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
        messages: the chat messages `text` renders (with `apply_chat_template`), else None; a
            multi-turn rollout's history starts from them.
    """

    index: int
    text: str
    prompt_ids: list[int]
    label: str
    messages: list[dict] | None = None


def prompt_file(path: str | Path, flag: str = "--prompt-data") -> Path:
    """`path` as a prompt file that exists, is a regular readable file and ends in .jsonl/.json/.parquet.

    `flag` names the flag in messages ("--prompt-data", or "--eval-prompt-data NAME").

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a directory, another suffix, an unreadable file, or a .parquet file without the
            parquet magic bytes `PAR1` at both ends (the Apache Parquet file format).
    """
    p = Path(path).expanduser()
    expected = "expected a .jsonl or .parquet file"
    if p.is_dir():
        raise ValueError(f"{flag}: {p} is a directory ({expected})")
    if not p.exists():
        raise FileNotFoundError(f"{flag}: {p} does not exist ({expected})")
    if p.suffix not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"{flag}: {p} must end in .jsonl or .parquet")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
            size = f.seek(0, 2)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except OSError as e:
        raise ValueError(f"{flag}: {p} cannot be read ({e.strerror or e})") from None
    if p.suffix == ".parquet" and (head != b"PAR1" or tail != b"PAR1" or size < 8):
        raise ValueError(f"{flag}: {p} is not a parquet file (it does not start and end with PAR1)")
    if head[:2] == b"\x1f\x8b":
        raise ValueError(f"{flag}: {p} is gzip-compressed; expected UTF-8 JSON lines (gunzip it first)")
    return p


def read_rows(path: str | Path, flag: str = "--prompt-data") -> list[dict[str, Any]]:
    """Read all rows of a .jsonl or .parquet file (`read_rows_and_lines` without the line numbers).

    Raises:
        FileNotFoundError / ValueError: as `read_rows_and_lines`.
    """
    return read_rows_and_lines(path, flag)[0]


def read_rows_and_lines(
    path: str | Path, flag: str = "--prompt-data"
) -> tuple[list[dict[str, Any]], list[int] | None]:
    """(rows, each row's 1-based line in the file) of a .jsonl file, (rows, None) of a .parquet file
    (`prompt_file` checks the file first).

    A .jsonl file is UTF-8 (a leading byte-order mark is allowed) with one JSON object per line;
    blank lines are skipped. Line numbers in messages are the file's (1-based).

    Raises:
        FileNotFoundError / ValueError: naming `flag`, the file and, for a .jsonl, the line: a line
            that is not UTF-8 (the byte and column), not JSON (the column), or not a JSON object.
    """
    p = prompt_file(path, flag)
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist(), None
    rows, lines = [], []
    with open(p, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            text = _decode_line(raw, line_no, where=f"{flag}: {p} line {line_no}")
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:  # one line: its column is the position in the file's line
                raise ValueError(
                    f"{flag}: {p} line {line_no} column {e.colno} is not valid JSON ({e.msg}); "
                    "expected one JSON object per line"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{flag}: {p} line {line_no} is a {type(row).__name__}, expected a JSON object"
                )
            rows.append(row)
            lines.append(line_no)
    return rows, lines


def _decode_line(raw: bytes, line_no: int, *, where: str) -> str:
    """One line of a .jsonl file as text without its line ending (UTF-8; a BOM on line 1 is dropped)."""
    try:
        text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
    except UnicodeDecodeError as e:
        if b"\0" in raw:
            raise ValueError(f"{where} holds binary data (a NUL byte); expected UTF-8 JSON lines") from None
        raise ValueError(
            f"{where} is not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1} "
            "(Latin-1 or another encoding?); expected UTF-8 JSON lines (convert it, e.g. iconv -t UTF-8)"
        ) from None
    if "\0" in text:
        raise ValueError(f"{where} holds binary data (a NUL byte); expected UTF-8 JSON lines")
    return text.rstrip("\r\n")


class PromptDataset:
    """Rows of a prompt file, tokenized on demand.

    Args:
        path: `--prompt-data` (or one `--eval-prompt-data` file).
        tokenizer: a transformers tokenizer (chat template needed with `apply_chat_template`).
        input_key / label_key: `--input-key` / `--label-key`.
        apply_chat_template: wrap the input as a user message and add the generation prompt.
        flag: the flag named in messages ("--prompt-data", or "--eval-prompt-data NAME").
        tools: OpenAI tool specs passed to the chat template as `tools` (a multi-turn tool rollout's
            `--generate-tool-specs-path`), or None.

    Raises:
        ValueError / FileNotFoundError: the file (`read_rows`) or its rows (`check_rows`) are bad, or
            `apply_chat_template` with a tokenizer that has no chat template.
    """

    def __init__(
        self,
        path: str | Path,
        tokenizer,
        *,
        input_key: str,
        label_key: str,
        apply_chat_template: bool,
        flag: str = "--prompt-data",
        tools: list[dict] | None = None,
    ) -> None:
        self.path = Path(path)
        self.rows, lines = read_rows_and_lines(path, flag)
        check_rows(
            self.rows,
            path,
            input_key=input_key,
            label_key=label_key,
            apply_chat_template=apply_chat_template,
            flag=flag,
            lines=lines,
        )
        if apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("--apply-chat-template: the tokenizer of --hf-checkpoint has no chat template")
        self.lines = lines
        self.flag = flag
        self.tokenizer = tokenizer
        self.input_key = input_key
        self.label_key = label_key
        self.apply_chat_template = apply_chat_template
        self.tools = tools

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Prompt:
        row = self.rows[index]
        content = row[self.input_key]
        messages = None
        if self.apply_chat_template:
            messages = content if isinstance(content, list) else [{"role": "user", "content": str(content)}]
            extra = {"tools": self.tools} if self.tools else {}
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **extra
            )
        else:
            text = str(content)
        prompt_ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        label = str(row[self.label_key])
        return Prompt(index=index, text=text, prompt_ids=prompt_ids, label=label, messages=messages)


def check_context_room(dataset: PromptDataset, max_context_len: int) -> None:
    """Check that every prompt leaves room for a reply under `--rollout-max-context-len` (Miles' cap on a
    sample's prompt + response tokens): a prompt of that many tokens or more could never be answered.
    Tokenizes every row once (the chat template applied as the rollout applies it).

    Raises:
        ValueError: naming the flag, the first such row (file line, or row index of a parquet file),
            its length in tokens and the longest prompt's.
    """
    lengths = [len(dataset[i].prompt_ids) for i in range(len(dataset))]
    full = [i for i, n in enumerate(lengths) if n >= max_context_len]
    if full:
        i = full[0]
        where = f"line {dataset.lines[i]}" if dataset.lines is not None else f"row {i}"
        raise ValueError(
            f"--rollout-max-context-len {max_context_len}: {dataset.flag} {dataset.path} {where} is already "
            f"{lengths[i]} tokens, leaving no room for a reply ({len(full)} of {len(dataset)} prompts are that "
            f"long; the longest is {max(lengths)} tokens): raise it above the prompts' length"
        )


def check_model_room(dataset: PromptDataset, max_response_len: int, limit: int, where_limit: str) -> None:
    """Check that the longest prompt, as the rollout sends it (the chat template and tool specs applied),
    plus `--rollout-max-response-len` fits the model's `limit` (its max_position_embeddings): the check
    train/preflight.py makes before the template, made again on the ids the engine gets. A multi-turn or
    agent sample keeps at most that many response tokens over all its turns, so this bounds every
    sample.

    Raises:
        ValueError: naming the flag, the row (file line, or row index of a parquet file), its tokens with
            the template, the limit (`where_limit`: its config file) and the largest response length that fits.
    """
    lengths = [len(dataset[i].prompt_ids) for i in range(len(dataset))]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    tokens = lengths[longest]
    if tokens + max_response_len <= limit:
        return
    where = f"line {dataset.lines[longest]}" if dataset.lines is not None else f"row {longest}"
    room = f"use --rollout-max-response-len at most {limit - tokens}" if tokens < limit else "shorten it"
    raise ValueError(
        f"--rollout-max-response-len {max_response_len}: the longest prompt of {dataset.flag} ({dataset.path} "
        f"{where}) is {tokens} tokens as the rollout sends it (chat template applied), and {tokens} + "
        f"{max_response_len} exceeds the model's limit of {limit} tokens ({where_limit}); {room}"
    )


def check_rows(
    rows: list[dict[str, Any]],
    path: str | Path,
    *,
    input_key: str,
    label_key: str,
    apply_chat_template: bool,
    flag: str = "--prompt-data",
    lines: list[int] | None = None,
) -> None:
    """Check that every row has a non-null prompt and label, the prompt in a form the run can use.

    `lines` are the rows' 1-based lines in a .jsonl file (`read_rows_and_lines`): messages name
    "PATH line N", as the file's UTF-8 and JSON errors do; without them (a parquet file) "row I of
    PATH", I 0-based.

    Raises:
        ValueError: no rows; a row without `input_key`/`label_key` (names the key, the line or row and
            the keys present) or with null; a list of chat messages without `apply_chat_template`; an
            empty prompt.
    """
    if not rows:
        raise ValueError(f"{flag}: {path} holds no rows")
    for i, row in enumerate(rows):
        where = f"{path} line {lines[i]}" if lines is not None else f"row {i} of {path}"
        for key_flag, key in (("--input-key", input_key), ("--label-key", label_key)):
            if key not in row:
                raise ValueError(f"{key_flag} {key!r}: {where} has no such field (fields: {sorted(row)})")
            if row[key] is None:
                raise ValueError(f"{key_flag} {key!r}: {where} is null")
        content = row[input_key]
        if isinstance(content, list) and not apply_chat_template:
            raise ValueError(
                f"--input-key {input_key!r}: {where} is a list of chat messages; pass --apply-chat-template"
            )
        if isinstance(content, str) and not content.strip():
            raise ValueError(f"--input-key {input_key!r}: {where} is an empty prompt")


def rollout_prompt_indices(
    *, num_rows: int, rollout_id: int, rollout_batch_size: int, seed: int, shuffle: bool
) -> list[int]:
    """Row indices of the prompts that rollout `rollout_id` uses: the prompt stream's positions
    rollout_id·B .. rollout_id·B + B − 1 (`prompt_stream_indices`)."""
    return prompt_stream_indices(
        num_rows=num_rows, start=rollout_id * rollout_batch_size, count=rollout_batch_size, seed=seed,
        shuffle=shuffle,
    )  # fmt: skip


def prompt_stream_indices(*, num_rows: int, start: int, count: int, seed: int, shuffle: bool) -> list[int]:
    """Row indices at positions start .. start + count − 1 of the run's prompt stream.

    Global position g maps to epoch g // num_rows and offset g % num_rows in that epoch's order: a
    permutation from numpy's PCG64 seeded with (seed, epoch) when shuffling, the file order otherwise.
    A run without dynamic sampling reads B positions per rollout; one with it reads as many as its
    rounds draw (Miles' data source offset, `TrainerState.data_position`).
    """
    indices = []
    cached_epoch, order = -1, None
    for g in range(start, start + count):
        epoch, offset = divmod(g, num_rows)
        if epoch != cached_epoch:
            order = (
                np.random.default_rng([seed, epoch]).permutation(num_rows) if shuffle else np.arange(num_rows)
            )
            cached_epoch = epoch
        indices.append(int(order[offset]))
    return indices
