"""`grpolab serve`: the torch engine as an HTTP server speaking SGLang 0.5.23's native API.

`command.py` (flags, loading, uvicorn) -> `app.build_app(state)` (routes, auth) -> `generation.py`
(`/generate`, health), `control.py` (cache, pause, memory, weights), `openai.py` (`/v1/*`) ->
`batching.Batcher` (the one engine thread; concurrent requests share a decode) and `protocol.py`
(SGLang's request and response shapes, pure). May import `grpolab.core` only.
"""
