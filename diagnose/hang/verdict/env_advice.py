"""Next-step advice that depends on the communication backend (NCCL or gloo). Pure.

The AReaL debugging guide's step 4 ("用于获取更多详细信息的环境变量") lists NCCL_DEBUG=INFO,
TORCH_DISTRIBUTED_DEBUG=DETAIL, NCCL_TIMEOUT=300 and CUDA_LAUNCH_BLOCKING=1. Not all of them fit
every run: NCCL_DEBUG only affects NCCL, and NCCL_TIMEOUT is not read by torch itself (only by
launchers that pass it to `init_process_group`). torch's own default process-group timeout is
10 min for NCCL and 30 min for gloo and the other backends (torch.distributed.init_process_group's
documentation; torch/distributed/constants.py `default_pg_timeout` = 30 min,
`default_pg_nccl_timeout` = 10 min in CUDA builds). The gloo advice uses torch's documented
TORCH_CPP_LOG_LEVEL (c10d's C++ log) and GLOO_SOCKET_IFNAME (the interface gloo uses).

`backend` is "nccl", "gloo" or None (not known: advice that holds for both, nothing NCCL-only).
"""

from __future__ import annotations

BACKENDS = ("nccl", "gloo")

DEFAULT_TIMEOUT_TEXT = {
    "nccl": "10 min for NCCL",
    "gloo": "30 min for gloo",
    None: "10 min for NCCL, 30 min for gloo",
}
"""torch's default process-group timeout per backend (see the module docstring)."""

TORCH_DEBUG_STEP = (
    "Set TORCH_DISTRIBUTED_DEBUG=DETAIL: torch.distributed logs every collective with its ranks and "
    "shapes, and reports collectives that do not match across ranks (NCCL and gloo)."
)
CUDA_BLOCKING_STEP = (
    "On GPU, CUDA_LAUNCH_BLOCKING=1 makes CUDA errors surface at the line that caused them "
    "(slow; debugging only)."
)


def _check_backend(backend: str | None) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)} or None")


def timeout_step(backend: str | None) -> str:
    """How to make a hang fail fast: a shorter `timeout=` to init_process_group.

    Raises:
        ValueError: `backend` is not "nccl", "gloo" or None.
    """
    _check_backend(backend)
    return (
        "Make hangs fail fast: pass a shorter timeout to init_process_group, e.g. "
        "init_process_group(..., timeout=timedelta(seconds=300)) (torch's default is "
        f"{DEFAULT_TIMEOUT_TEXT[backend]}); NCCL_TIMEOUT=300, as in the AReaL guide, works only where "
        "the launcher reads it and passes it on."
    )


def detail_step(backend: str | None) -> str:
    """How to get the backend's own log on the next run (NCCL_DEBUG for NCCL, c10d's log for gloo).

    Raises:
        ValueError: `backend` is not "nccl", "gloo" or None.
    """
    _check_backend(backend)
    if backend == "nccl":
        return "Before the next run set NCCL_DEBUG=INFO (NCCL logs each collective and its transport)."
    what = "gloo" if backend == "gloo" else "the backend"
    return (
        "Before the next run set TORCH_CPP_LOG_LEVEL=INFO with TORCH_DISTRIBUTED_DEBUG=DETAIL: c10d's own "
        f"log shows {what}'s connection setup and errors."
    )


def transport_step(backend: str | None, *, agreeing: str = "every rank") -> str:
    """Where to look when the code agrees on every rank (pattern C): the transport between the ranks.

    `agreeing` names the ranks seen waiting in the same collective ("every rank", or e.g. "ranks 0,
    2 (the ranks whose stacks were read)" when some rank could not be inspected).

    Raises:
        ValueError: `backend` is not "nccl", "gloo" or None.
    """
    _check_backend(backend)
    if backend == "nccl":
        return (
            f"The code agrees on {agreeing}; check the transport: NCCL_DEBUG=INFO shows the network path "
            "and errors, and compare the ranks' hosts and interfaces (NCCL_SOCKET_IFNAME)."
        )
    if backend == "gloo":
        return (
            f"The code agrees on {agreeing}; check the transport: gloo talks TCP between the ranks "
            "(GLOO_SOCKET_IFNAME picks the interface); compare the ranks' hosts and interfaces, and look "
            "for a rank whose host is overloaded."
        )
    return (
        f"The code agrees on {agreeing}; check the transport between the ranks: compare their hosts and "
        "network interfaces, and look for a rank whose host is overloaded."
    )


def env_steps(backend: str | None, *names: str) -> list[str]:
    """The AReaL guide's step-4 advice for `backend`, in the order named: timeout, torch_debug,
    detail (NCCL_DEBUG or c10d's log), cuda_blocking (NCCL runs only: a gloo run has no CUDA).

    Raises:
        ValueError: an unknown name, or `backend` is not "nccl", "gloo" or None.
    """
    steps = []
    for name in names:
        if name == "timeout":
            steps.append(timeout_step(backend))
        elif name == "torch_debug":
            steps.append(TORCH_DEBUG_STEP)
        elif name == "detail":
            steps.append(detail_step(backend))
        elif name == "cuda_blocking":
            if backend == "nccl":
                steps.append(CUDA_BLOCKING_STEP)
        else:
            raise ValueError(f"unknown advice {name!r}")
    return steps
