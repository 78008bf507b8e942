"""`grpolab serve`: its flags, loading the engine into a `ServerState`, and running the app with uvicorn.

Order of the checks, cheapest first, so bad input fails in well under a second: the API key (from
`--api-key`, `--api-key-file` or `GRPOLAB_API_KEY`; a non-loopback `--host` needs one), the
checkpoint path, then the port (bound before the model loads, and handed to uvicorn as that socket,
so nothing else can take it in between). Each is exit 2 with a message naming the flag. The bound
address is printed as `grpolab serve: listening on http://HOST:PORT` once the server answers (with
`--port 0` this is how a caller learns the port).

Exit codes: 0 never (the server runs until a signal), 2 bad input, 130 after SIGINT (Ctrl+C) and 143
after SIGTERM, each after the graceful shutdown: 128 + the signal's number, as `grpolab train`.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import shlex
import signal
import socket
import sys
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from pathlib import Path

from grpolab.core.engine.base import DECODE_PATHS, DecodePath
from grpolab.serve.batching import BATCH_WAIT_S
from grpolab.serve.state import ServerState, ServeSettings

DEFAULT_PORT = 30000
"""SGLang's default `--port`."""
API_KEY_ENV = "GRPOLAB_API_KEY"
"""The environment variable `grpolab serve` reads its API key from when no flag gives one (SGLang
0.5.23 reads its `--api-key` from the command line only, so there is no SGLang name to follow); a
key in the environment or a file stays out of process listings, where `--api-key` shows."""
_KEY_FLAGS = ("--api-key",)


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
        "--api-key",
        default=None,
        help="require Authorization: Bearer KEY (needed for a non-loopback --host); visible in process "
        f"listings: prefer --api-key-file or ${API_KEY_ENV}",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help=f"read the API key from PATH (surrounding whitespace stripped); else ${API_KEY_ENV} is read",
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
        "--true-on-policy-mode",
        action="store_true",
        help="re-score every sampled answer by a prefill of prompt + answer alone (the trainer's forward "
        "under grpolab train --true-on-policy-mode): log-probs that do not depend on the batch, one more "
        "forward per answer",
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


def resolve_api_key(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str | None:
    """The server's API key: `--api-key`, else `--api-key-file`'s content (whitespace stripped),
    else `$GRPOLAB_API_KEY` (`API_KEY_ENV`); None when none is given. An empty `--api-key` stays ""
    (the caller's host rule names it).

    Raises:
        ValueError: both flags given; the file is missing, unreadable or holds only whitespace; the
            variable is set but empty (each names the flag or variable and the path, never the key).
    """
    env = os.environ if environ is None else environ
    if args.api_key is not None and args.api_key_file is not None:
        raise ValueError("--api-key and --api-key-file: give one of them")
    if args.api_key is not None:
        return args.api_key
    if args.api_key_file is not None:
        path = Path(args.api_key_file)
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ValueError(f"--api-key-file {path}: cannot read it ({why})") from None
        if not key:
            raise ValueError(f"--api-key-file {path}: the file is empty; expected the key on its own")
        return key
    if API_KEY_ENV in env:
        if not env[API_KEY_ENV].strip():
            raise ValueError(f"${API_KEY_ENV} is set but empty; unset it or give the key")
        return env[API_KEY_ENV].strip()
    return None


def redacted_command(argv: list[str]) -> str:
    """The command line for /server_info's `launch_command`, the value of `--api-key` replaced by
    `REDACTED` (both `--api-key KEY` and `--api-key=KEY`)."""
    out, hide = [], False
    for arg in argv:
        if hide:
            out.append("REDACTED")
        elif any(arg.startswith(f"{flag}=") for flag in _KEY_FLAGS):
            out.append(arg.split("=", 1)[0] + "=REDACTED")
        else:
            out.append(arg)
        hide = arg in _KEY_FLAGS
    return shlex.join(out)


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
    settings: ServeSettings, *, device: str = "cpu", dtype: str = "float32", decode_path: DecodePath = "auto",
    true_on_policy: bool = False,
) -> ServerState:  # fmt: skip
    """Load the engine, tokenizer and model facts for `settings.model_path` (`true_on_policy`:
    `--true-on-policy-mode`, the engine re-scores its answers by prefill).

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
        true_on_policy=true_on_policy,
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


def run_server(state: ServerState, sock: socket.socket) -> int | None:
    """Serve `state`'s app on the bound `sock` until SIGINT/SIGTERM (uvicorn's graceful shutdown);
    return the number of the first signal that stopped it (None if it stopped otherwise)."""
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

        @contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            """uvicorn's, without raising the signal again after the shutdown (that killed the
            process by the signal, SIGINT with a KeyboardInterrupt traceback): the signal is kept
            in `stopped_by` and the command exits 128 + its number."""
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig: int, frame: object) -> None:
            stopped_by.append(sig)
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    stopped_by: list[int] = []

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
    return stopped_by[0] if stopped_by else None


def run_serve_command(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run `grpolab serve`; return the exit code: 2 on bad input, 130 after SIGINT and 143 after
    SIGTERM (128 + the signal number, once the server has shut down gracefully)."""
    prog = "grpolab serve: error:"
    try:
        api_key = resolve_api_key(args)
    except ValueError as e:
        print(f"{prog} {e}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and not api_key:
        given = " (an empty one was given)" if api_key == "" else ""
        print(
            f"{prog} --host {args.host} is not a loopback address; it needs an API key (--api-key-file "
            f"PATH, ${API_KEY_ENV} or --api-key){given}",
            file=sys.stderr,
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
        api_key=api_key or None,
        deterministic=args.enable_deterministic_inference,
        served_model_name=args.served_model_name,
        batch_wait_s=args.batch_wait_ms / 1000,
        launch_command=redacted_command(["grpolab", *(argv or sys.argv[1:])]),
    )
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    try:
        state = load_state(settings, device=args.device, dtype=args.dtype, decode_path=args.decode_path,
                           true_on_policy=args.true_on_policy_mode)  # fmt: skip
    except (FileNotFoundError, ValueError) as e:
        sock.close()
        print(f"{prog} {e}", file=sys.stderr)
        return 2
    stopped_by = run_server(state, sock)
    if stopped_by is None:
        return 0
    print(f"grpolab serve: stopped by {signal.Signals(stopped_by).name}", file=sys.stderr, flush=True)
    return 128 + stopped_by
