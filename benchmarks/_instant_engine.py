"""An engine server that answers at once (for `bench_http_engine.py`'s floor, not a benchmark itself).

`python benchmarks/_instant_engine.py PORT [TOKENS]`: uvicorn on httptools + uvloop, as `grpolab serve` runs
it, with no model: `POST /generate` reads the body and returns one canned SGLang answer of TOKENS tokens
(default 14, the default run's mean response length) with their log-probs; every other path answers `{"status": "ok"}`
(what the router's registration and health checks read). What is left of a rollout's time through it
is the HTTP path's own: client, router, server, sockets.
"""

from __future__ import annotations

import json
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 14
ANSWER = json.dumps(
    {
        "text": " 42" * TOKENS,
        "output_ids": list(range(3, 3 + TOKENS)),
        "meta_info": {
            "id": "instant",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 40,
            "completion_tokens": TOKENS,
            "weight_version": "0",
            "output_token_logprobs": [[-0.123456789, 3 + i, None] for i in range(TOKENS)],
        },
    }
).encode()


async def generate(request: Request) -> Response:
    """POST /generate: read the body, answer the canned TOKENS-token SGLang answer."""
    await request.body()
    return Response(ANSWER, media_type="application/json")


async def anything(request: Request) -> Response:
    """Any other path: 200 {"status": "ok"} (the router's registration and health checks)."""
    return JSONResponse({"status": "ok"})


app = Starlette(
    routes=[
        Route("/generate", generate, methods=["POST"]),
        Route("/{path:path}", anything, methods=["GET", "POST"]),
    ]
)

if __name__ == "__main__":
    uvicorn.run(
        app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools", log_level="error"
    )
