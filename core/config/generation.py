"""Config sections of what is generated and scored: model, prompt data, rollouts, reward, eval.

The string after each field is its documentation and the help text of its `grpolab train` flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from grpolab.core.config.validation import require

FIXTURES_DIR = Path(__file__).resolve().parent.parent.parent / "fixtures"
DEFAULT_CHECKPOINT = FIXTURES_DIR / "tiny-qwen3"
DEFAULT_PROMPT_DATA = FIXTURES_DIR / "data" / "arithmetic_train.jsonl"
TRAIN_FORWARDS = ("auto", "shared-prefix", "padded")
"""`--train-forward` choices (core/shared_prefix.py)."""


@dataclass(kw_only=True)
class ModelConfig:
    """Which weights to load, in which precision, on which device."""

    hf_checkpoint: str = str(DEFAULT_CHECKPOINT)
    """Model directory (save_pretrained layout) or a .gguf file (default: the tiny fixture model)."""
    rollout_dtype: str = "float32"
    """Engine parameter dtype: float32 | bfloat16.

    The valid names are core/dtypes.py's DTYPES (validated against it; a test checks the list above)."""
    rollout_decode_path: str = "auto"
    """Forward the in-process engine decodes with: auto | grpolab | transformers. grpolab: its own
    Llama/Qwen2/Qwen3 decoder (fused, prepacked projections; preallocated KV cache); transformers:
    the model's own forward (any causal LM, the reference the first is tested against); auto:
    grpolab's where the model is supported. Switch to transformers to rule the decoder out when the
    engine's log-probs disagree with the trainer's."""
    train_forward: str = "auto"
    """Forward the trainer computes log-probs with: auto | shared-prefix | padded. shared-prefix: the
    samples of a micro-batch that share a prompt are packed in one row, so the prompt runs once for
    its group instead of once per sample (same log-probs up to float rounding; Prefix Grouper,
    arXiv:2506.05433), in micro-batches where that costs fewer FLOPs (long answers to short prompts
    stay padded); padded: one padded row per sample, the layout TRL and transformers use; auto:
    shared-prefix where the model supports it (Llama/Qwen2/Qwen3, full attention, SDPA), else padded,
    while shared-prefix refuses other models. Switch to padded to rule the packing out when the
    trainer's log-probs look wrong; a bitwise replay needs the recorded run's setting."""
    train_dtype: str = "float32"
    """Trainer parameter dtype: float32 | bfloat16 (log-probs are always computed in float32).

    The valid names are core/dtypes.py's DTYPES, as for rollout_dtype."""
    true_on_policy_mode: bool = False
    """Engine and trainer compute log-probs with the same operations in the same order, so
    train/train_rollout_logprob_abs_diff is exactly 0.0: the engine re-scores each answer by a prefill of
    prompt + answer alone, and the trainer scores each sample alone with the same forward (one more
    forward per answer; never packed). Sampling itself keeps the decode's numbers. Needs
    --rollout-dtype equal to --train-dtype; under --ci-test a non-zero gap fails the run.

    Miles' `--true-on-policy-mode` reaches 0 with batch-invariant kernels on the engine; this mode
    gets there the way Miles' `--recompute-logprobs-via-prefill` does, with a batch-invariant prefill
    (core/sequence_forward.py; README "True on-policy")."""
    device: str = "cpu"
    """cpu, cuda or cuda:N (`core.devices.check_device`); engine and trainer are colocated on it.

    Whether this machine has the device is checked when `grpolab train` starts (train/launch.py), not
    here, so a GPU run's run.json reads back on any machine."""

    def __post_init__(self) -> None:
        from grpolab.core.devices import check_device  # no torch either
        from grpolab.core.dtypes import check_dtype  # no torch: a flag error answers before it loads

        check_dtype(self.rollout_dtype, "--rollout-dtype")  # ValueError lists the valid names
        check_dtype(self.train_dtype, "--train-dtype")
        from grpolab.core.engine.base import DECODE_PATHS  # torch-free

        require(
            self.rollout_decode_path in DECODE_PATHS,
            f"--rollout-decode-path must be one of {', '.join(DECODE_PATHS)}, got {self.rollout_decode_path!r}",
        )
        require(
            self.train_forward in TRAIN_FORWARDS,
            f"--train-forward must be one of {', '.join(TRAIN_FORWARDS)}, got {self.train_forward!r}",
        )
        check_device(self.device, "--device")  # ValueError: cpu, cuda or cuda:N
        if self.true_on_policy_mode:
            require(
                self.rollout_dtype == self.train_dtype,
                f"--true-on-policy-mode needs --rollout-dtype equal to --train-dtype (got {self.rollout_dtype} "
                f"and {self.train_dtype}): the same operations in another precision give other numbers",
            )
            require(
                self.train_forward != "shared-prefix",
                "--true-on-policy-mode scores each sample alone; --train-forward shared-prefix packs samples "
                "(use auto or padded)",
            )


@dataclass(kw_only=True)
class DataConfig:
    """Prompt dataset (.jsonl or .parquet)."""

    prompt_data: str | None = None
    """Prompts, a .jsonl or .parquet file (default: the built-in arithmetic set,
    fixtures/data/arithmetic_train.jsonl).

    None (not given) is resolved to that path, after it has decided `apply_chat_template`, so run.json
    always names a file."""
    input_key: str = "question"
    """Field holding the prompt text (or a list of chat messages)."""
    label_key: str = "answer"
    """Field holding the reference answer passed to the reward function."""
    apply_chat_template: bool | None = None
    """Wrap prompts in the tokenizer's chat template (default: on for the built-in prompt set, off for
    --prompt-data)."""
    rollout_shuffle: bool = True
    """Shuffle prompts each epoch (seeded by --seed and the epoch)."""

    def __post_init__(self) -> None:
        if self.apply_chat_template is None:
            self.apply_chat_template = self.prompt_data is None
        if self.prompt_data is None:
            self.prompt_data = str(DEFAULT_PROMPT_DATA)
        require(bool(self.input_key), "--input-key must not be empty")
        require(bool(self.label_key), "--label-key must not be empty")


@dataclass(kw_only=True)
class RolloutConfig:
    """How many prompts and answers each rollout produces and how they are sampled."""

    num_rollout: int = 8
    """Number of rollouts (= GRPO iterations) in the run."""
    rollout_batch_size: int = 8
    """Prompts per rollout."""
    n_samples_per_prompt: int = 8
    """Answers per prompt (the GRPO group size)."""
    rollout_max_response_len: int = 32
    """Generation cap in tokens; answers that hit it are truncated."""
    rollout_temperature: float = 1.0
    """Sampling temperature (> 0)."""
    rollout_top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    rollout_top_k: int = 0
    """Top-k sampling (0 disables; Miles uses -1 for the same, which is read as 0)."""
    engine_failure_timeout: float = 60.0
    """Seconds of failed engine calls and health checks before the run stops with an error naming the
    engine (never retry forever: Miles 101 manual, section 1.2)."""
    rollout_engine: str = "torch"
    """Rollout engine kind: torch (the in-process engine on --device) or sglang (SGLang-API engine
    servers behind a router: implied by --rollout-num-engines or --sglang-router-ip); an unknown kind
    stops the run at start, listing the known ones (core/engine/factory.py registers them)."""
    rollout_num_engines: int = 0
    """Launch this many `grpolab serve` engine servers plus the real sglang-router for the run (logs in
    RUN_DIR/engines/<i>.log and RUN_DIR/router.log; all ended when the run ends); 0 = in-process engine."""
    sglang_router_ip: str | None = None
    """Use the already running router (and its registered SGLang engines) at this host instead of
    launching any; needs --sglang-router-port. A bare host name or address, as Miles takes it
    (`10.0.0.5`, `router.local`): a URL (`http://...`) or a `host:port` is refused."""
    sglang_router_port: int | None = None
    """Port of the router at --sglang-router-ip, or of the router --rollout-num-engines launches
    (default: a free port)."""
    sglang_router_request_timeout_secs: float = 600.0
    """Seconds one /generate request may take (the router's --request-timeout-secs; the trainer's own
    HTTP timeout); a request that takes longer counts as an engine failure."""
    use_fault_tolerance: bool = False
    """Restart an engine of the launched fleet (--rollout-num-engines) that exits: it is loaded with the
    trainer's current weights and checked (weight version and every tensor's checksum) before it rejoins
    the router, and the requests it left unanswered are sent again (core/engine/restart.py)."""
    ft_components: str | None = None
    """What --use-fault-tolerance watches and replaces: rollout, the default and the only one (the engines;
    Miles' train component needs Megatron's independent data-parallel groups, which grpolab does not have)."""
    max_engine_restarts: int | None = None
    """With --use-fault-tolerance: how many engine restarts the whole run may make (default 3; each start
    of a restart counts); past it, a dead engine fails the run as without fault tolerance."""

    def __post_init__(self) -> None:
        require(
            0 < self.engine_failure_timeout < math.inf,
            f"--engine-failure-timeout must be a finite number of seconds > 0, got {self.engine_failure_timeout}",
        )
        require(self.num_rollout >= 1, f"--num-rollout must be >= 1, got {self.num_rollout}")
        require(
            self.rollout_batch_size >= 1, f"--rollout-batch-size must be >= 1, got {self.rollout_batch_size}"
        )
        require(
            self.n_samples_per_prompt >= 1,
            f"--n-samples-per-prompt must be >= 1, got {self.n_samples_per_prompt}",
        )
        require(
            self.rollout_max_response_len >= 1,
            f"--rollout-max-response-len must be >= 1, got {self.rollout_max_response_len}",
        )
        require(
            self.rollout_temperature > 0, f"--rollout-temperature must be > 0, got {self.rollout_temperature}"
        )
        require(0 < self.rollout_top_p <= 1, f"--rollout-top-p must be in (0, 1], got {self.rollout_top_p}")
        if self.rollout_top_k < 0:
            self.rollout_top_k = 0
        self._check_servers()

    @property
    def uses_servers(self) -> bool:
        """True when rollouts go to engine servers over HTTP (launched or already running)."""
        return self.rollout_num_engines > 0 or self.sglang_router_ip is not None

    def _check_servers(self) -> None:
        """The engine-server flags agree with each other; they imply --rollout-engine sglang."""
        require(
            self.rollout_num_engines >= 0,
            f"--rollout-num-engines must be >= 0, got {self.rollout_num_engines}",
        )
        require(
            not (self.rollout_num_engines and self.sglang_router_ip is not None),
            "--rollout-num-engines launches engines and a router; --sglang-router-ip uses running ones: pass one",
        )
        ip = self.sglang_router_ip
        require(
            ip is None or not ("/" in ip or " " in ip or ip.count(":") == 1),  # IPv6 has 2+ colons
            f"--sglang-router-ip takes a bare host name or address, as Miles does (e.g. 10.0.0.5), not a URL "
            f"or host:port: got {ip!r} (grpolab adds http://; the port goes in --sglang-router-port)",
        )
        require(
            ip is None or self.sglang_router_port is not None, "--sglang-router-ip needs --sglang-router-port"
        )
        port = self.sglang_router_port
        require(
            port is None or self.uses_servers,
            "--sglang-router-port needs --rollout-num-engines N (launch the router there) or --sglang-router-ip",
        )
        require(port is None or 1 <= port <= 65535, f"--sglang-router-port must be in 1..65535, got {port}")
        timeout = self.sglang_router_request_timeout_secs
        require(timeout > 0, f"--sglang-router-request-timeout-secs must be > 0, got {timeout}")
        for flag, value in (
            ("--ft-components", self.ft_components),
            ("--max-engine-restarts", self.max_engine_restarts),
        ):
            require(value is None or self.use_fault_tolerance, f"{flag} needs --use-fault-tolerance")
        require(
            self.ft_components in (None, "rollout"),
            f"--ft-components {self.ft_components}: grpolab has rollout fault tolerance only (Miles' train "
            "component needs Megatron's independent data-parallel groups)",
        )
        if self.use_fault_tolerance and self.max_engine_restarts is None:
            self.max_engine_restarts = 3
        require(
            self.max_engine_restarts is None or self.max_engine_restarts >= 1,
            f"--max-engine-restarts must be >= 1, got {self.max_engine_restarts}",
        )
        require(
            not self.use_fault_tolerance or self.rollout_num_engines > 0,
            "--use-fault-tolerance needs --rollout-num-engines N: grpolab restarts only the engines it launched"
            + (" (--sglang-router-ip names a running fleet)" if self.sglang_router_ip is not None else ""),
        )
        if self.uses_servers and self.rollout_engine == "torch":
            self.rollout_engine = "sglang"
        require(
            self.rollout_engine != "sglang" or self.uses_servers,
            "--rollout-engine sglang needs --rollout-num-engines N or --sglang-router-ip HOST "
            "--sglang-router-port P",
        )

    @property
    def samples_per_rollout(self) -> int:
        """rollout_batch_size × n_samples_per_prompt."""
        return self.rollout_batch_size * self.n_samples_per_prompt


@dataclass(kw_only=True)
class RewardConfig:
    """Reward model selection: a built-in reward or a custom function."""

    rm_type: str | None = "math"
    """Built-in reward: math (#### N, else the last number) | boxed_math."""
    custom_rm_path: str | None = None
    """pkg.module.function reward, sync or async (replaces --rm-type)."""
    group_rm: bool = False
    """The custom reward scores a whole group at once (needs --custom-rm-path)."""
    reward_key: str | None = None
    """Key to read when the reward function returns a dict."""
    reward_timeout: float = 300.0
    """Seconds one --custom-rm-path call may take; past it the run fails (exit 1) naming the function,
    the sample index and the timeout. 0 waits forever. Default 300: far above a verifier's seconds, so
    only a stuck call hits it. Async functions are cancelled; sync ones run one at a time on a daemon
    worker thread, which is abandoned on timeout (a thread cannot be killed) while the run ends. With 0
    sync functions run on the main thread, as reward code using signal-based timeouts needs."""

    def __post_init__(self) -> None:
        require(
            0 <= self.reward_timeout < math.inf,
            f"--reward-timeout must be a finite number of seconds >= 0 (0 waits forever), got {self.reward_timeout}",
        )
        require(
            self.rm_type is not None or self.custom_rm_path is not None,
            "one of --rm-type or --custom-rm-path is required",
        )
        require(
            not self.group_rm or self.custom_rm_path is not None,
            "--group-rm needs --custom-rm-path (a function scoring a whole group)",
        )

    @property
    def call_timeout(self) -> float | None:
        """`--reward-timeout` in seconds, None when it is 0 (wait forever)."""
        return self.reward_timeout or None


@dataclass(kw_only=True)
class EvalConfig:
    """Held-out evaluation on named prompt sets."""

    eval_interval: int | None = None
    """Evaluate before rollouts whose id is a multiple of this, and after the last rollout."""
    eval_prompt_data: list[str] = field(default_factory=list, metadata={"metavar": "NAME PATH"})
    """Held-out prompt sets as NAME PATH pairs; metric eval/<NAME> is the mean reward."""
    n_samples_per_eval_prompt: int = 1
    """Answers per eval prompt."""
    eval_max_prompts: int | None = None
    """Use at most this many prompts of each eval set (file order)."""

    def __post_init__(self) -> None:
        require(
            self.eval_interval is None or self.eval_interval >= 1,
            f"--eval-interval must be >= 1, got {self.eval_interval}",
        )
        require(
            len(self.eval_prompt_data) % 2 == 0,
            f"--eval-prompt-data takes NAME PATH pairs, got {len(self.eval_prompt_data)} values: {self.eval_prompt_data}",
        )
        require(
            self.eval_interval is None or bool(self.eval_prompt_data),
            "--eval-interval needs --eval-prompt-data NAME PATH",
        )
        require(self.n_samples_per_eval_prompt >= 1, "--n-samples-per-eval-prompt must be >= 1")
        require(
            self.eval_max_prompts is None or self.eval_max_prompts >= 1, "--eval-max-prompts must be >= 1"
        )

    @property
    def datasets(self) -> list[tuple[str, str]]:
        """(name, path) pairs."""
        it = iter(self.eval_prompt_data)
        return list(zip(it, it))
