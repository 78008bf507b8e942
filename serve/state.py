"""What one `grpolab serve` process knows: its settings, engine, batcher, weight version and memory tags.

The weight version is SGLang's string (server default "default"); the engine keeps an int, so a
version that is a decimal integer is passed to the engine as that int and any other string as the
engine's previous version + 1. Memory tags are SGLang's (`srt/constants.py`): "weights",
"kv_cache", "cuda_graph"; `None` or `[]` means all three.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpolab.serve.batching import BATCH_WAIT_S, Batcher

if TYPE_CHECKING:
    from grpolab.core.engine.torch_engine import TorchEngine

MEMORY_TAGS: tuple[str, ...] = ("weights", "kv_cache", "cuda_graph")
"""SGLang's memory-occupation tags, in its resume order (cuda_graph -> weights -> kv_cache is the
resume order there; the order only matters on a GPU)."""
DEFAULT_WEIGHT_VERSION = "default"
"""SGLang's initial `weight_version` (`arg_groups/fields/serving.py`)."""
SERVER_VERSION = "0.5.23"
"""The SGLang release whose HTTP API this server speaks (reported as `version` in /server_info)."""


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """`grpolab serve`'s flags.

    Attributes:
        model_path: `--hf-checkpoint` as given.
        host / port: where the server listens (port 0 = any free port, the bound one is reported).
        api_key: `--api-key`; when set, every route but /health* needs `Authorization: Bearer <key>`.
        deterministic: `--enable-deterministic-inference` (a seedless request gets seed 42).
        served_model_name: the model id in /model_info and /v1/models (default: the checkpoint dir name).
        batch_wait_s: the batcher's gather window in seconds.
        launch_command: the command line, echoed by /server_info.
    """

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    deterministic: bool = False
    served_model_name: str | None = None
    batch_wait_s: float = BATCH_WAIT_S
    launch_command: str = ""


@dataclass
class ServerState:
    """The live state every handler reads.

    Attributes:
        settings: the flags.
        engine: the torch engine (called only through `batcher`'s engine thread).
        batcher: the engine thread and batching loop.
        tokenizer: the checkpoint's tokenizer (text prompts, `text` outputs, chat templates).
        eos_ids: the model's stop ids (tokenizer + generation config EOS).
        fingerprint: `core.modeling.model_fingerprint` of the checkpoint.
        vocab_size: logits width V (the full sampling support).
        context_len: the model's `max_position_embeddings` (0 when the config has none).
        model_type / architectures: from the model config, as SGLang's /model_info reports them.
        weight_version: SGLang's string version.
        released: memory tags released now.
        sessions: open token-in/token-out sessions by id (`serve/sessions.py`).
        started: Unix time the server started.
    """

    settings: ServeSettings
    engine: TorchEngine
    batcher: Batcher
    tokenizer: Any
    eos_ids: tuple[int, ...]
    fingerprint: str
    vocab_size: int
    context_len: int = 0
    model_type: str | None = None
    architectures: list[str] | None = None
    weight_version: str = DEFAULT_WEIGHT_VERSION
    released: set[str] = field(default_factory=set)
    sessions: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    @property
    def model_name(self) -> str:
        """The served model id: `--served-model-name`, else the checkpoint's directory name."""
        return self.settings.served_model_name or Path(self.settings.model_path).name

    def engine_version(self, version: str) -> int:
        """The engine's int version for SGLang's string `version` (see the module docstring)."""
        text = version.strip()
        if text.isdigit():
            return int(text)
        current = getattr(self.engine, "weight_version", 0)
        return int(current) + 1

    def blocked_reason(self) -> str:
        """Why `/generate` is refused now ("" when it is not): released memory tags."""
        if not self.released:
            return ""
        tags = ", ".join(t for t in MEMORY_TAGS if t in self.released)
        return f"memory is released ({tags}); call /resume_memory_occupation before /generate"
