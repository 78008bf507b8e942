"""A running engine server as the parity ladder's engine side: `grpolab check parity --server URL`.

The engine rungs (checkers/parity.py) ask three things of an engine: answers (`/generate`, through
core/engine/http_engine.py, one concurrent request per sample as the trainer sends them), its prefill
of an answer, and its most likely next tokens. Over SGLang's native API:

- prefill: Miles' prefill re-scoring (`generate_utils/prefill_logprobs.py`,
  ../shared/reference/notes-miles-slime-areal.md §6.5): `input_ids` = prompt + answer,
  `max_new_tokens` 0, `return_logprob`, `logprob_start_len` = prompt length - 1; the
  answer's log-probs are the tail of `meta_info.input_token_logprobs` (its first entry is null); sent
  with the ladder's temperature (Miles sends 0, greedy, which SGLang scores at temperature 1). Over
  the whole vocabulary: a server cannot prefill over the kept top-p/top-k support, so with filtering
  on the prefill rungs are skipped, saying so;
- next tokens: one greedy token with `top_logprobs_num` k (`meta_info.output_top_logprobs[0]`).

`URL` is one engine (not a router): requests that ask for sampling masks need the engine itself
(sglang-router 0.3.2 drops `return_sampling_mask`). Its `/model_info` `model_fingerprint` must be
`--hf-checkpoint`'s (a real SGLang reports none: a warning says the model is not checked), and its
`/server_info` `true_on_policy_mode` says whether its answers' log-probs are already its prefill's.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from grpolab.core.engine.base import GenerationRequest, GenerationResult, SamplingParams
from grpolab.core.engine.http_calls import HttpCallError, call_json
from grpolab.core.engine.http_engine import HttpEngine
from grpolab.core.sequence_forward import Answer

log = logging.getLogger("grpolab")


class ServerEngine:
    """The engine server at `url`, seen by the ladder as `parity.LocalEngine` sees the in-process one.

    Args:
        url: "http://HOST:PORT" of one engine (`--server`).
        checkpoint: `--hf-checkpoint`, whose fingerprint the server's model must have.
        timeout_s: seconds any one call may take.

    Raises:
        ValueError: the server does not answer `/model_info`, or serves another model (both named).
    """

    def __init__(self, url: str, checkpoint: str, *, timeout_s: float = 120.0) -> None:
        from grpolab.core.modeling import model_fingerprint

        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.name = f"the server at {self.url}"
        model_info = self._get("/model_info")
        theirs, ours = model_info.get("model_fingerprint"), model_fingerprint(checkpoint)
        if theirs is None:
            log.warning(f"warning: --server {self.url} reports no model_fingerprint (a real SGLang): the model it "
                        f"serves ({model_info.get('model_path')!r}) is not checked against --hf-checkpoint")  # fmt: skip
        elif theirs != ours:
            raise ValueError(f"--server {self.url} serves {model_info.get('model_path')!r} (fingerprint {theirs}), "
                             f"not --hf-checkpoint {checkpoint} (fingerprint {ours})")  # fmt: skip
        self.rescores_by_prefill = self._get("/server_info").get("true_on_policy_mode") is True
        self._http = HttpEngine(router_url=self.url, engine_urls=[self.url], fleet=None,
                                request_timeout_s=timeout_s, failure_timeout_s=timeout_s)  # fmt: skip

    def _get(self, path: str) -> dict[str, Any]:
        try:
            answer = call_json("GET", self.url + path, None, timeout=self.timeout_s)
        except (HttpCallError, ValueError) as e:
            raise ValueError(f"--server {self.url} does not answer {path}: {e}") from None
        return answer if isinstance(answer, dict) else {}

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        """One concurrent `/generate` per request (HttpEngine.generate)."""
        return self._http.generate(requests, params)

    def prefill(self, answers: list[Answer], temperature: float) -> list[torch.Tensor] | None:
        """Each answer's float32 [T] log-probs by the server's prefill of prompt + answer (module docstring);
        None when an answer was sampled from a filtered support (the server scores the whole vocabulary).

        Raises:
            RuntimeError: an answer without `input_token_logprobs` ending in the answer's tokens.
        """
        if any(a.kept_token_ids is not None for a in answers):
            return None
        out = []
        for a in answers:
            if not a.response_ids:
                out.append(torch.zeros(0, dtype=torch.float32))
                continue
            body = {"input_ids": a.prompt_ids + a.response_ids, "return_logprob": True,
                    "logprob_start_len": len(a.prompt_ids) - 1,
                    "sampling_params": {"max_new_tokens": 0, "temperature": temperature}}  # fmt: skip
            meta = self._post(body).get("meta_info") or {}
            triples = (meta.get("input_token_logprobs") or [])[1:]
            if [t[1] for t in triples] != a.response_ids or any(t[0] is None for t in triples):
                raise RuntimeError(f"--server {self.url}: the prefill's input_token_logprobs do not score the "
                                   "answer's tokens (does the server support logprob_start_len?)")  # fmt: skip
            out.append(torch.tensor([t[0] for t in triples], dtype=torch.float32))
        return out

    def top_ids(self, ids: list[int], k: int) -> set[int]:
        """The server's k most likely next tokens after `ids` (one greedy token's `output_top_logprobs`)."""
        body = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": k,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip
        rows = (self._post(body).get("meta_info") or {}).get("output_top_logprobs") or [[]]
        return {t[1] for t in rows[0]}

    def _post(self, body: dict) -> dict[str, Any]:
        try:
            answer = call_json("POST", self.url + "/generate", body, timeout=self.timeout_s)
        except (HttpCallError, ValueError) as e:
            raise RuntimeError(f"--server {self.url}: /generate failed: {e}") from None
        return answer if isinstance(answer, dict) else {}

    def close(self) -> None:
        self._http.close()
