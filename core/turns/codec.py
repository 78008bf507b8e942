"""A tokenizer's text <-> ids for turn records: what sessions, the tool loop and the drift auditor share.

`encode` tokenises a piece of template text alone, with no special tokens added (a turn's segment is
tokenised on its own: core/turns/record.py); `decode` keeps special tokens (a reply's `<|im_end|>`
is text the template's tail is matched against). `render` is the chat template's text of messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatCodec:
    """One tokenizer's chat template, encoder and decoder (`tools` go to every rendering).

    Attributes:
        tokenizer: a transformers tokenizer with a chat template.
        tools: OpenAI tool specs passed to the template as `tools` (None: none).
    """

    tokenizer: Any
    tools: list[dict] | None = None

    def render(self, messages: list, generation_prompt: bool) -> str:
        """The chat template's text of `messages` (with the generation prompt when asked).

        Raises:
            what `apply_chat_template` raises (jinja2.TemplateError, ValueError, ...).
        """
        extra = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **extra
        )

    def encode(self, text: str) -> list[int]:
        """`text`'s ids, no special tokens added (a fast tokenizer's Rust side: the same ids, less Python)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return list(backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens kept."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def content(self, ids: Sequence[int]) -> str:
        """The text of a reply's `ids` as a message's content: special tokens (its EOS) dropped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
