"""Deterministic collectives: the `det_gloo` (CPU) and `det_nccl` (CUDA) torch.distributed backends.

What it guarantees. For floating-point tensors, SUM, AVG and PREMUL_SUM `all_reduce`, `reduce` and
`reduce_scatter` (every form: list, `_reduce_scatter_base` / `reduce_scatter_tensor` /
`reduce_scatter_single`, and the coalesced forms FSDP2 and the coalescing manager use) give every
element as `fold_in_fixed_order` of the ranks' values (`det_fold`: pairwise tree for a power-of-two
world, ascending ranks otherwise; AVG divides afterwards, PREMUL_SUM multiplies before). The result
depends only on the inputs and the world size, not on the transport, its version, the bucket layout
or the timing, and a reduce_scatter shard equals the matching slice of an all_reduce bit for bit.
With FSDP2 that needs a SUM reduce-scatter: `set_gradient_divide_factor(1.0)` and
`set_force_sum_reduction_for_comms(True)` on every FSDP module; its default AVG rounds differently
from dividing a sum by the count. The fold follows Miles' `det_nccl`
(miles/utils/test_utils/det_process_group.py).

Everything else passes through to the wrapped gloo or NCCL group unchanged: broadcast, all-gather,
barrier, send/recv, all-to-all, MAX/MIN/PRODUCT/bitwise reductions, and reductions of integer and
bool tensors (integer addition is associative, so their order does not matter). PREMUL_SUM needs
the factor, which torch 2.13 exposes and 2.11 does not; there it raises (`PREMUL_SUM_FOLDED`).

How and what it costs: `det_transport` (only the slots a rank folds travel; an all_reduce moves
2(W-1)/W of the tensor per rank, as a ring does). Every reduction is synchronous, in two steps (no
overlap with compute; `Work` objects come back already completed). It does not make kernels
deterministic: set `torch.use_deterministic_algorithms(True)` and pin the thread count as well. For
debugging and tests; keep it off in production runs.

C++ callers (DDP's reducer, functional collectives under DTensor and clip_grad_norm_) reach these
methods through torch's pybind trampoline; checked with DDP, FSDP2 and functional collectives on
torch 2.11 and 2.13. Every collective entry point stays in this file: the hang diagnosis recognizes
the det backend's frames by this path.

Use: call `register()` once per process (idempotent), then
`torch.distributed.init_process_group("det_gloo")` (or `"det_nccl"`); `new_group()` and
`init_device_mesh()` on that world use the same backend.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from grpolab.core.det_fold import (
    PREMUL_SUM_FOLDED,
    fold_in_fixed_order,
    fold_slot,
    is_folded_op,
    is_premul_sum,
    premul_factor,
    reduce_op,
    slot_sizes,
)
from grpolab.core.det_transport import SlotExchange, first_method, make_inner_gloo, make_inner_nccl

DET_GLOO = "det_gloo"
DET_NCCL = "det_nccl"

# fold_in_fixed_order and PREMUL_SUM_FOLDED live in det_fold; importable from here as before.
__all__ = [
    "DET_GLOO",
    "DET_NCCL",
    "PREMUL_SUM_FOLDED",
    "DetProcessGroup",
    "backend_for",
    "fold_in_fixed_order",
    "register",
]

_register_lock = threading.Lock()


def _completed_work(result: list[torch.Tensor], device: torch.device) -> dist.Work:
    """A Work whose future already holds `result` (what DDP's reducer reads back)."""
    fut = torch.futures.Future(devices=[device]) if device.type != "cpu" else torch.futures.Future()
    fut.set_result(result)
    return c10d._create_work_from_future(fut)


# ---------------------------------------------------------------------------------------------
# The process group.


class DetProcessGroup(dist.ProcessGroup):
    """A ProcessGroup that folds SUM/AVG/PREMUL_SUM reductions in a fixed order and forwards the rest.

    `inner` is the real c10d backend (`ProcessGroupGloo` or `ProcessGroupNCCL`); it carries all
    traffic. Collectives are looked up by name on this Python object by `torch.distributed` and
    through the pybind trampoline by C++ callers (DDP's reducer, functional collectives), so both
    the torch 2.13 names (`all_gather_single`, `reduce_scatter_single`, ...) and the older ones
    (`_allgather_base`, `_reduce_scatter_base`, ...) are defined here.
    """

    def __init__(self, inner: object, rank: int, world_size: int, backend_name: str, device_type: str):
        super().__init__(rank, world_size)
        self._inner = inner
        self._rank = rank
        self._world = world_size
        self._backend_name = backend_name
        self._lock = threading.Lock()
        self._slots = SlotExchange(inner, rank, world_size, device_type)
        if device_type != "cpu":
            # Object collectives pick their device from `_device_types`, and without a cuda entry
            # they would hand CPU tensors to NCCL; so the NCCL backend is registered for cuda.
            # Collectives still come to the methods below (torch.distributed calls them by name,
            # C++ callers through the trampoline). det_gloo registers nothing: a C++ path that
            # bypasses both then fails loudly instead of reducing in gloo's own order.
            custom = dist.ProcessGroup.BackendType.CUSTOM
            self._set_default_backend(custom)
            self._register_backend(torch.device(device_type), custom, inner)

    # -- identity -------------------------------------------------------------------------------

    def size(self) -> int:
        return self._world

    def rank(self) -> int:
        return self._rank

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return self._backend_name

    @property
    def group_name(self) -> str:
        # DeviceMesh and FSDP2 need it; the C++ name is set by init_process_group/new_group.
        try:
            name = super().group_name
        except RuntimeError:  # "ProcessGroup name not set"
            name = ""
        return name or dist.distributed_c10d._world.pg_names[self]

    def __repr__(self) -> str:
        return f"DetProcessGroup({self._backend_name}, rank={self._rank}, world_size={self._world})"

    # -- the fixed-order reductions ----------------------------------------------------------------

    def _folds(self, opts: object, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether this reduction is folded here (else it goes to the wrapped backend)."""
        op = reduce_op(opts)
        if not tensors or not is_folded_op(op):
            return False
        if any(not (t.is_floating_point() or t.is_complex()) for t in tensors):
            return False
        if is_premul_sum(op) and premul_factor(op) is None:
            # Handing it to the wrapped backend would reduce in that backend's own order.
            raise RuntimeError(
                f"{self._backend_name}: torch {torch.__version__} does not expose the PREMUL_SUM "
                "factor to Python, so this reduction cannot be folded in a fixed order. For FSDP2, "
                "call set_force_sum_reduction_for_comms(True) on every FSDP module (SUM plus a "
                "separate division) instead of relying on a custom gradient divide factor."
            )
        return True

    def _fold_my_slot(self, flat: torch.Tensor, slots: list[int], op: object, out: torch.Tensor) -> None:
        """Fold slot `rank` of every rank's `flat` (cut into `slots`) into `out` (numel slots[rank]).

        `out` may be our own slot of `flat` (all_reduce, in-place reduce_scatter).
        """
        fold_slot(self._slots.gather_rows(flat, slots), op, out)

    def _allreduce_flat(self, flat: torch.Tensor, op: object) -> None:
        """Fixed-order all_reduce of a contiguous 1-D tensor, in place."""
        if flat.numel() == 0:
            return
        slots = slot_sizes(flat.numel(), self._world)
        start = sum(slots[: self._rank])
        # Our own slot of `flat` takes the fold (the other slots have been sent by then), and
        # the all-gather then fills in the others.
        self._fold_my_slot(flat, slots, op, flat[start : start + slots[self._rank]])
        self._slots.share_slot(flat, slots)

    def _allreduce_tensors(self, tensors: Sequence[torch.Tensor], op: object) -> None:
        """All-reduce several tensors with one exchange per dtype (flattened together)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for group in by_dtype.values():
            if len(group) == 1 and group[0].is_contiguous():
                self._allreduce_flat(group[0].view(-1), op)
                continue
            flat = torch.cat([t.reshape(-1) for t in group])
            self._allreduce_flat(flat, op)
            offset = 0
            for t in group:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def allreduce(self, tensors, opts=None):
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        opts = c10d.AllreduceOptions() if opts is None else opts
        if not self._folds(opts, tensors):
            return self._inner.allreduce(tensors, opts)
        with self._lock:
            self._allreduce_tensors(tensors, reduce_op(opts))
        return _completed_work(tensors, tensors[0].device)

    def allreduce_coalesced(self, tensors, opts=None):
        tensors = list(tensors)
        opts = c10d.AllreduceCoalescedOptions() if opts is None else opts
        if not self._folds(opts, tensors):
            return self._inner.allreduce_coalesced(tensors, opts)
        with self._lock:
            self._allreduce_tensors(tensors, reduce_op(opts))
        return _completed_work(tensors, tensors[0].device)

    def reduce(self, tensors, opts=None):
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        opts = c10d.ReduceOptions() if opts is None else opts
        if not self._folds(opts, tensors):
            return self._inner.reduce(tensors, opts)
        # An all_reduce on a copy; only the root keeps the result, as with a real reduce.
        with self._lock:
            copies = [t.clone() for t in tensors]
            self._allreduce_tensors(copies, reduce_op(opts))
            if self._rank == opts.rootRank:
                for t, c in zip(tensors, copies):
                    t.copy_(c)
        return _completed_work(tensors, tensors[0].device)

    def _reduce_scatter_flat(self, output: torch.Tensor, flat: torch.Tensor, slots: list[int], op) -> None:
        """Our `output` = fold over ranks of slot `rank` of their `flat` (cut into `slots`)."""
        if slots[self._rank] != output.numel():
            raise ValueError(
                f"reduce_scatter: slot {self._rank} has {slots[self._rank]} elements, output {output.numel()}"
            )
        if sum(slots) == 0:
            return
        if output.is_contiguous():
            self._fold_my_slot(flat, slots, op, output.view(-1))
        else:
            target = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
            self._fold_my_slot(flat, slots, op, target)
            output.copy_(target.view(output.shape))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        outputs = [output_tensors] if isinstance(output_tensors, torch.Tensor) else list(output_tensors)
        inputs = input_tensors
        if isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], torch.Tensor):
            inputs = [inputs]
        opts = c10d.ReduceScatterOptions() if opts is None else opts
        if not self._folds(opts, outputs + [t for ts in inputs for t in ts]):
            return self._inner.reduce_scatter(outputs, [list(ts) for ts in inputs], opts)
        with self._lock:
            for out, ins in zip(outputs, inputs, strict=True):
                flat = torch.cat([t.reshape(-1) for t in ins])
                self._reduce_scatter_flat(out, flat, [t.numel() for t in ins], reduce_op(opts))
        return _completed_work(outputs, outputs[0].device)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = c10d.ReduceScatterOptions() if opts is None else opts
        if not self._folds(opts, [output, input]):
            return first_method(self._inner, "_reduce_scatter_base", "reduce_scatter_single")(
                output, input, opts
            )
        if input.numel() != self._world * output.numel():
            raise ValueError(
                f"reduce_scatter: input has {input.numel()} elements, expected {self._world} x {output.numel()}"
            )
        with self._lock:
            flat = input.reshape(-1).contiguous()  # a view when `input` is contiguous
            self._reduce_scatter_flat(output, flat, [output.numel()] * self._world, reduce_op(opts))
        return _completed_work([output], output.device)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = c10d.ReduceScatterOptions() if opts is None else opts
        for output, input in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(output, input, opts).wait()
        return _completed_work(list(outputs), outputs[0].device)

    # torch < 2.13 names of the same operations.
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- pass-through ------------------------------------------------------------------------------

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._inner.allgather(output_tensors, input_tensors, opts or c10d.AllgatherOptions())

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._inner.allgather_coalesced(output_lists, input_list, opts or c10d.AllgatherOptions())

    def all_gather_single(self, output, input, opts=None):
        fn = first_method(self._inner, "_allgather_base", "all_gather_single")
        return fn(output, input, opts or c10d.AllgatherOptions())

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        # The wrapped backends have no coalesced tensor all-gather in Python; issue them one by one.
        for output, input in zip(outputs, inputs, strict=True):
            work = self.all_gather_single(output, input, opts)
            if work is not None:
                work.wait()
        return _completed_work(list(outputs), outputs[0].device)

    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        fn = first_method(self._inner, "alltoall_base", "all_to_all_single")
        return fn(output, input, output_split_sizes, input_split_sizes, opts or c10d.AllToAllOptions())

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._inner.alltoall(output_tensors, input_tensors, opts or c10d.AllToAllOptions())

    def broadcast(self, tensors, opts=None):
        return self._inner.broadcast(tensors, opts or c10d.BroadcastOptions())

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._inner.gather(output_tensors, input_tensors, opts or c10d.GatherOptions())

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._inner.scatter(output_tensors, input_tensors, opts or c10d.ScatterOptions())

    def barrier(self, opts=None):
        return self._inner.barrier(opts or c10d.BarrierOptions())

    def monitored_barrier(self, *args, **kwargs):
        return self._inner.monitored_barrier(*args, **kwargs)

    def send(self, tensors, dst_rank, tag=0):
        return self._inner.send(tensors, dst_rank, tag)

    def recv(self, tensors, src_rank, tag=0):
        return self._inner.recv(tensors, src_rank, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._inner.recv_anysource(tensors, tag)

    def _start_coalescing(self, device) -> None:
        # The coalescing manager queues ops in Python and flushes them through the *_coalesced
        # methods above, which complete synchronously; nothing to open here.
        return None

    def _end_coalescing(self, device) -> dist.Work:
        return _completed_work([], torch.device(device) if isinstance(device, str) else device)

    def abort(self) -> None:
        if hasattr(self._inner, "abort"):
            self._inner.abort()

    def shutdown(self) -> None:
        if hasattr(self._inner, "shutdown"):
            self._inner.shutdown()


# ---------------------------------------------------------------------------------------------
# Registration.


def _create_det_gloo(backend_opts: object, pg_options: object = None) -> DetProcessGroup:
    inner, rank, size = make_inner_gloo(backend_opts)
    return DetProcessGroup(inner, rank, size, DET_GLOO, "cpu")


def _create_det_nccl(backend_opts: object, pg_options: object = None) -> DetProcessGroup:
    inner, rank, size = make_inner_nccl(backend_opts, pg_options)
    return DetProcessGroup(inner, rank, size, DET_NCCL, "cuda")


def register() -> None:
    """Register `det_gloo` (CPU) and, when this torch has NCCL, `det_nccl` (CUDA). Idempotent."""
    with _register_lock:
        plugins = dist.Backend._plugins
        if DET_GLOO.upper() not in plugins:
            dist.Backend.register_backend(DET_GLOO, _create_det_gloo, extended_api=True, devices=["cpu"])
        if DET_NCCL.upper() not in plugins and dist.is_nccl_available():
            dist.Backend.register_backend(DET_NCCL, _create_det_nccl, extended_api=True, devices=["cuda"])


def backend_for(device_type: str) -> str:
    """The det backend name for a device type ("cpu" -> det_gloo, "cuda" -> det_nccl)."""
    if device_type == "cpu":
        return DET_GLOO
    if device_type == "cuda":
        return DET_NCCL
    raise ValueError(f"no deterministic collective backend for device type {device_type!r}")
