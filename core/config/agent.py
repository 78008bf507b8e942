"""Config section of multi-turn tool rollouts (Miles' `generate_hub/multi_turn.py` flags).

The string after each field is its documentation and the help text of its `grpolab train` flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpolab.core.config.validation import require

TOOL_CALL_PARSERS = ("qwen25", "hermes")
"""`--generate-tool-call-parser` names this engine reads: both are the `<tool_call>{json}</tool_call>`
format (SGLang's `qwen25` and `hermes` detectors read the same blocks; core/turns/tool_calls.py)."""


@dataclass(kw_only=True)
class AgentConfig:
    """Multi-turn tool rollouts: the model writes, calls a tool, reads the result and writes again."""

    custom_generate_function_path: str | None = None
    """pkg.module.function that generates one sample, Miles' contract: `async def generate(args, sample,
    sampling_params) -> Sample`. It posts to http://{args.sglang_router_ip}:{args.sglang_router_port}
    /generate (the fleet's router, or the run's own engine served on 127.0.0.1 for the rollout) and
    fills sample.tokens, response, response_length, loss_mask, rollout_log_probs and status; its
    metadata["messages"] (Miles' trajectory) lets grpolab check turns audit the turns."""
    custom_agent_function_path: str | None = None
    """pkg.module.function running one agent episode: `async def run(base_url, prompt, request_kwargs,
    metadata, **kw)` speaking OpenAI chat to base_url (a token-in/token-out session of the run's engine,
    so every turn's ids are kept exactly) and returning the reward, or one reward per model turn (summed:
    each is kept in the sample's metadata)."""
    generate_execute_tool_function_path: str | None = None
    """pkg.module.function that runs one tool call, Miles' contract: `async def execute_tool(name: str,
    params: dict) -> str` (the tool message's content). Setting it turns on the multi-turn tool loop:
    each sample's turns are generated until a reply calls no tool, --generate-max-turns is reached or
    the response budget is spent; model tokens get loss mask 1, tool, user and template tokens 0."""
    generate_tool_specs_path: str | None = None
    """The tools offered to the model, as the chat template's `tools`: a pkg.module.NAME attribute (Miles
    loads it so) or a .json file, holding OpenAI tool specs ([{"type": "function", "function": {"name",
    "description", "parameters"}}]). A reply calling a tool not listed is the model's text, counted in
    rollout/tool_parse_errors."""
    generate_max_turns: int = 16
    """At most this many model turns per sample in the tool loop (Miles' default 16)."""
    generate_tool_call_parser: str = "qwen25"
    """How tool calls are read from a reply: qwen25 | hermes (both the <tool_call>{json}</tool_call>
    format)."""
    rollout_max_context_len: int | None = None
    """Tokens a sample's prompt and response together may hold (Miles' flag; in a multi-turn sample
    every turn's tokens, tool tokens too); a sample whose context reaches it ends with finish "length".
    A prompt already that long is refused at start. Default: no cap but --rollout-max-response-len."""
    agent_timeout: float = 300.0
    """Seconds one tool call, one custom generate call or one agent episode may take; past it the run
    fails naming the function and the sample (a hang guard: far above a real episode's seconds)."""

    def __post_init__(self) -> None:
        require(
            self.generate_max_turns >= 1, f"--generate-max-turns must be >= 1, got {self.generate_max_turns}"
        )
        require(
            self.generate_tool_call_parser in TOOL_CALL_PARSERS,
            f"--generate-tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)} (the <tool_call> "
            f"format), got {self.generate_tool_call_parser!r}",
        )
        require(
            self.rollout_max_context_len is None or self.rollout_max_context_len >= 2,
            f"--rollout-max-context-len must be >= 2 tokens, got {self.rollout_max_context_len}",
        )
        require(
            0 < self.agent_timeout < math.inf,
            f"--agent-timeout must be a finite number of seconds > 0, got {self.agent_timeout}",
        )
        require(
            self.custom_generate_function_path is None or self.custom_agent_function_path is None,
            "--custom-generate-function-path and --custom-agent-function-path both say how a sample is "
            "generated: pass one",
        )
        require(
            self.custom_agent_function_path is None
            or (self.generate_execute_tool_function_path is None and self.generate_tool_specs_path is None),
            "--custom-agent-function-path runs its own tools (they are the agent's code): "
            "--generate-execute-tool-function-path and --generate-tool-specs-path are for the stock tool "
            "loop or a --custom-generate-function-path; drop them",
        )
        loop_only = [  # set away from their defaults (the class attributes), so given on purpose
            f"--{name.replace('_', '-')} {getattr(self, name)}"
            for name in ("generate_max_turns", "generate_tool_call_parser")
            if getattr(self, name) != getattr(AgentConfig, name)
        ]
        require(
            self.custom_agent_function_path is None or not loop_only,
            f"--custom-agent-function-path runs its own turns and parses its own tool calls: {' and '.join(loop_only)} "
            "would have no effect (they are the stock tool loop's); drop them",
        )
        require(
            self.generate_tool_specs_path is None or self.generate_execute_tool_function_path is not None,
            "--generate-tool-specs-path needs --generate-execute-tool-function-path (who runs the tools)",
        )

    @property
    def multi_turn(self) -> bool:
        """Whether rollouts run the stock multi-turn tool loop (a custom generate or agent function
        reads the tool flags itself, as Miles' generate functions do)."""
        return self.generate_execute_tool_function_path is not None and not self.custom

    @property
    def custom(self) -> str | None:
        """The `--custom-generate-function-path` or `--custom-agent-function-path` given, else None."""
        return self.custom_generate_function_path or self.custom_agent_function_path
