"""`grpolab serve`: its flags, loading the engine into a `ServerState`, and running the app with uvicorn.

Order of the checks, cheapest first, so bad input fails in well under a second: the host/api-key
rule (a non-loopback `--host` needs `--api-key`), the checkpoint path, then the port (bound before
the model loads, and handed to uvicorn as that socket, so nothing else can take it in between).
Each is exit 2 with a message naming the flag. The bound address is printed as
`grpolab serve: listening on http://HOST:PORT` once the server answers (with `--port 0` this is how a
caller learns the port).
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import shlex
import socket
import sys

from grpolab.core.engine.base import DECODE_PATHS, DecodePath
from grpolab.serve.batching import BATCH_WAIT_S
from grpolab.serve.state import ServerState, ServeSettings

DEFAULT_PORT = 30000
"""SGLang's default `--port`."""


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `grpolab serve` to the `grpolab` subcommands (imports no torch)."""
    p = sub.add_parser(
        "serve",
        help="serve the torch engine over SGLang's HTTP API (/generate, weight updates, ...)",
        description="Serve --hf-checkpoint with grpolab's torch engine behind SGLang 0.5.23's HTTP API.",
        allow_abbrev=False,
    )
    p.add_argument("--hf-checkpoint", required=True, help="model directory (save_pretrained) or .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port to bind; 0 = any free (default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (needed for a non-loopback --host)"
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="SGLang's flag: a request without sampling_seed gets seed 42 (without it, a fresh random seed)",
    )
    p.add_argument("--served-model-name", default=None, help="model id in /model_info and /v1/models")
    p.add_argument("--device", default="cpu", help="engine device: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default="float32", help="engine dtype: float32 or bfloat16 (default float32)")
    p.add_argument(
        "--decode-path",
        choices=DECODE_PATHS,
        default="auto",
        help="engine forward: grpolab's own decoder, transformers' forward, or auto (grpolab's where the "
        "model is supported; default)",
    )
    p.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="torch CPU intra-op threads of the engine (default: torch's; grpolab train --rollout-num-engines "
        "passes its own --num-threads, so engines and trainer do not oversubscribe the cores)",
    )
    p.add_argument(
        "--batch-wait-ms", type=float, default=BATCH_WAIT_S * 1000, help="gather window before a batch starts"
    )
    return p


def port_number(text: str) -> int:
    """`--port`'s argparse type: an int in 0..65535 (argparse turns its ArgumentTypeError into exit 2).

    Raises:
        argparse.ArgumentTypeError: not an integer, or out of the TCP port range.
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer in 0..65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be in 0..65535, got {port}")
    return port


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port).

    Raises:
        OSError: the port is taken or the address cannot be bound (the message names both).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(f"--port {port} on {host} cannot be bound: {e.strerror or e}") from e
    sock.set_inheritable(True)
    return sock


def load_state(
    settings: ServeSettings, *, device: str = "cpu", dtype: str = "float32", decode_path: DecodePath = "auto"
) -> ServerState:
    """Load the engine, tokenizer and model facts for `settings.model_path`.

    Raises:
        FileNotFoundError / ValueError: `--hf-checkpoint` is not a model; an unknown `--dtype`.
    """
    from grpolab.core.engine.torch_engine import TorchEngine
    from grpolab.core.modeling import load_tokenizer, model_fingerprint, parse_dtype, stop_token_ids
    from grpolab.serve.batching import Batcher

    engine = TorchEngine(
        settings.model_path,
        dtype=parse_dtype(dtype, "--dtype"),
        device=device,
        show_progress=False,
        decode_path=decode_path,
    )
    tokenizer = load_tokenizer(settings.model_path)
    config = engine.model.config
    return ServerState(
        settings=settings,
        engine=engine,
        batcher=Batcher(engine, batch_wait_s=settings.batch_wait_s),
        tokenizer=tokenizer,
        eos_ids=stop_token_ids(settings.model_path, tokenizer),
        fingerprint=model_fingerprint(settings.model_path),
        vocab_size=int(engine.model.get_output_embeddings().weight.shape[0]),
        context_len=int(getattr(config, "max_position_embeddings", 0) or 0),
        model_type=getattr(config, "model_type", None),
        architectures=list(getattr(config, "architectures", None) or []) or None,
    )


def run_server(state: ServerState, sock: socket.socket) -> None:
    """Serve `state`'s app on the bound `sock` until SIGINT/SIGTERM (uvicorn's graceful shutdown)."""
    import uvicorn

    from grpolab.serve.app import build_app

    host, port = sock.getsockname()[:2]

    class AnnouncingServer(uvicorn.Server):
        """uvicorn's server, printing the bound address once it accepts connections, and answering the
        requests still queued with an abort when it shuts down: uvicorn waits for every open request
        before it stops, and a request held by `/pause_generation` would never finish (SIGTERM left the
        process running). A batch that is decoding finishes first."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            print(f"grpolab serve: listening on http://{host}:{port}", flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            state.batcher.abort(abort_all=True, message="the server is shutting down")
            await super().shutdown(sockets=sockets)

    config = uvicorn.Config(
        build_app(state),
        http="httptools",  # C parser: h11's pure-Python one cost ~1 ms a request (a rollout is 64)
        loop="asyncio" if sys.platform == "win32" else "uvloop",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
        proxy_headers=False,  # nothing in front sets X-Forwarded-*: the router connects from 127.0.0.1
    )
    AnnouncingServer(config).run(sockets=[sock])


def run_serve_command(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run `grpolab serve`; return the exit code: 0 after a shutdown by SIGINT, 2 on bad input (after
    SIGTERM the process ends with 143: uvicorn raises the signal again once it has shut down)."""
    prog = "grpolab serve: error:"
    if not is_loopback(args.host) and not args.api_key:
        given = " (an empty one was given)" if args.api_key == "" else ""
        print(
            f"{prog} --host {args.host} is not a loopback address; it needs --api-key{given}", file=sys.stderr
        )
        return 2
    if args.served_model_name is not None and not args.served_model_name.strip():
        print(f"{prog} --served-model-name must not be empty", file=sys.stderr)
        return 2
    if args.num_threads is not None and args.num_threads < 1:
        print(f"{prog} --num-threads must be >= 1, got {args.num_threads}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.batch_wait_ms) and args.batch_wait_ms >= 0):  # nan or inf: requests hung
        print(
            f"{prog} --batch-wait-ms must be a finite number >= 0, got {args.batch_wait_ms}", file=sys.stderr
        )
        return 2
    try:
        from grpolab.core.devices import check_device, check_device_present
        from grpolab.core.dtypes import check_dtype
        from grpolab.core.engine.decode_support import check_decode_path
        from grpolab.core.model_files import check_model

        # the flags and the model folder first, without transformers (a mistake answers in < 1 s)
        check_dtype(args.dtype, "--dtype")
        check_device(args.device, "--device")
        check_model(args.hf_checkpoint)  # config, tokenizer and weight files: each named when wrong
        check_decode_path(args.decode_path, args.hf_checkpoint, "--decode-path")
        check_device_present(args.device, "--device")  # imports torch only for a CUDA device
        sock = bind_socket(args.host, args.port)  # a port in use answers before transformers loads, too
    except (FileNotFoundError, ValueError, OSError) as e:
        print(f"{prog} {e}", file=sys.stderr)
        return 2
    try:
        from grpolab.core.modeling import model_fingerprint

        model_fingerprint(args.hf_checkpoint)  # transformers reads config.json (or the GGUF)
    except (FileNotFoundError, ValueError, OSError) as e:
        sock.close()
        print(f"{prog} {e}", file=sys.stderr)
        return 2
    settings = ServeSettings(
        model_path=args.hf_checkpoint,
        host=args.host,
        port=sock.getsockname()[1],
        api_key=args.api_key,
        deterministic=args.enable_deterministic_inference,
        served_model_name=args.served_model_name,
        batch_wait_s=args.batch_wait_ms / 1000,
        launch_command=shlex.join(["grpolab", *(argv or sys.argv[1:])]),
    )
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    try:
        state = load_state(settings, device=args.device, dtype=args.dtype, decode_path=args.decode_path)
    except (FileNotFoundError, ValueError) as e:
        sock.close()
        print(f"{prog} {e}", file=sys.stderr)
        return 2
    run_server(state, sock)
    return 0
