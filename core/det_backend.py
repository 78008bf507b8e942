"""Deterministic collectives: the `det_gloo` (CPU) and `det_nccl` (CUDA) torch.distributed backends.

What it guarantees. For floating-point tensors, SUM, AVG and PREMUL_SUM `all_reduce`, `reduce` and
`reduce_scatter` (every form: list, `_reduce_scatter_base` / `reduce_scatter_tensor` /
`reduce_scatter_single`, and the coalesced forms FSDP2 and the coalescing manager use) give every
element as `fold_in_fixed_order` of the ranks' values: a pairwise tree ((r0+r1)+(r2+r3))... when the
world size is a power of two, a left-to-right ascending-rank sum otherwise; AVG divides the fold by
the world size afterwards, PREMUL_SUM multiplies each rank's value by the factor before it. The
result depends only on the inputs and the world size, not on the transport, its version, the bucket
layout or the timing, and a reduce_scatter shard equals the matching slice of an all_reduce bit for
bit. What the trainer relies on: with SUM-reduced gradients divided by a global count, a world of 2
ranks with one micro-batch each gives the same weights, bit for bit, as one rank that adds its two
micro-batch gradients as `g0 + g1` (for more micro-batches, add them with `fold_in_fixed_order`
to match a wider world). With FSDP2 that needs a SUM reduce-scatter: `set_gradient_divide_factor(1.0)`
and `set_force_sum_reduction_for_comms(True)` on every FSDP module; its default AVG rounds
differently from dividing a sum by the count. The fold follows Miles' `det_nccl`
(miles/utils/test_utils/det_process_group.py).

Everything else passes through to the wrapped gloo or NCCL group unchanged: broadcast, all-gather,
barrier, send/recv, all-to-all, MAX/MIN/PRODUCT/bitwise reductions, and reductions of integer and
bool tensors (integer addition is associative, so their order does not matter). PREMUL_SUM needs
the factor, which torch 2.13 exposes and 2.11 does not; there it raises (`PREMUL_SUM_FOLDED`).

How. Every element comes out as if each rank had all-gathered every rank's full input and folded
locally (Miles' method), but only the data a rank folds travels: the flat input is cut into W
slots, rank r receives slot r of every rank (pure data movement), folds those W rows into its
slot in the fixed order, and for all_reduce the folded slots are all-gathered. det_gloo moves the
slots with paired send/recv (gloo's all-to-all and all-gather add copies); det_nccl with NCCL's
all-to-all. The transport never adds anything, so its algorithm and version cannot change a bit.

What it costs. Per rank, an all_reduce moves 2(W-1)/W of the tensor, as a ring all-reduce does
(a reduce_scatter moves (W-1)/W); Miles' gather moves W-1 times the tensor. Every reduction is
synchronous, in two steps (no overlap with compute; `Work` objects come back already completed),
the fold is (W-1)/W of the tensor in adds, and a scratch buffer holds W times one slot (about the
input's size; kept between calls on CPU, where fresh pages cost more than the copy). Measured by
benchmarks/bench_det_allreduce.py (16M float32, 2 ranks, 1 thread each): 1.25-1.36x plain gloo
on an idle 16-core machine (torch 2.11), 0.85-1.4x on a busy 2-core one (torch 2.13). It does not
make kernels deterministic: set `torch.use_deterministic_algorithms(True)` and pin the thread
count as well. For debugging and tests; keep it off in production runs.

C++ callers (DDP's reducer, functional collectives under DTensor and clip_grad_norm_) reach these
methods through torch's pybind trampoline; checked with DDP, FSDP2 and functional collectives on
torch 2.11 and 2.13.

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

DET_GLOO = "det_gloo"
DET_NCCL = "det_nccl"

# Reductions whose floating-point result depends on the order of the additions.
_FOLDED_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM)
_register_lock = threading.Lock()
# Tag of the send/recv pairs det_gloo exchanges slots with (far from the tags user code picks).
_TAG = 0x64657467


def fold_in_fixed_order(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum `tensors` (one per rank, in rank order) in the fixed order the det backends use.

    Power-of-two count: a pairwise tree, ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7)), level by
    level. Any other count: left to right, ((t0 + t1) + t2) + t3 ... Each `+` is one elementwise
    IEEE addition in the tensors' dtype, so every element of the result depends only on the same
    element of the inputs and on their count. This is the fold of Miles' `det_nccl`
    (miles/utils/test_utils/det_process_group.py, `_fold_gathered_sum`). Pure: returns a new
    tensor and leaves the inputs alone.
    """
    if len(tensors) == 0:
        raise ValueError("fold_in_fixed_order needs at least one tensor")
    return _fold(list(tensors))


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _fold(rows: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """`fold_in_fixed_order`, writing the last addition into `out` when given (it must alias no row)."""
    if len(rows) == 1:
        return rows[0].clone() if out is None else out.copy_(rows[0])
    if _is_power_of_two(len(rows)):
        while len(rows) > 2:
            rows = [torch.add(rows[i], rows[i + 1]) for i in range(0, len(rows), 2)]
        return torch.add(rows[0], rows[1], out=out)
    acc = torch.add(rows[0], rows[1], out=out)
    for row in rows[2:]:
        acc.add_(row)
    return acc


# ---------------------------------------------------------------------------------------------
# Small helpers around the c10d option objects and Work.
# ---------------------------------------------------------------------------------------------


def _reduce_op(opts: object) -> object:
    """The ReduceOp inside an options object (or the object itself when a bare ReduceOp is passed)."""
    op = getattr(opts, "reduceOp", opts)
    return dist.ReduceOp.SUM if op is None else op


def _op_type(op: object) -> object:
    # A ReduceOp compares equal to its RedOpType; PREMUL_SUM ops only expose it through `.op`.
    return getattr(op, "op", op)


def _premul_factor(op: object) -> float | torch.Tensor | None:
    """The PREMUL_SUM factor, or None when this torch does not expose it to Python."""
    try:
        factor = op.factor  # torch >= 2.13 exposes it; older builds may not
    except (AttributeError, RuntimeError, TypeError):
        return None
    return factor if isinstance(factor, (float, int, torch.Tensor)) else None


def _premul_sum_folds() -> bool:
    make = getattr(dist, "_make_nccl_premul_sum", None)
    return make is not None and _premul_factor(make(0.5)) is not None


# Whether PREMUL_SUM reductions are folded (torch 2.13 exposes the factor); where False they raise.
PREMUL_SUM_FOLDED = _premul_sum_folds()


def _completed_work(result: list[torch.Tensor], device: torch.device) -> dist.Work:
    """A Work whose future already holds `result` (what DDP's reducer reads back)."""
    fut = torch.futures.Future(devices=[device]) if device.type != "cpu" else torch.futures.Future()
    fut.set_result(result)
    return c10d._create_work_from_future(fut)


def _method(obj: object, *names: str):
    """The first of `names` that `obj` has (torch renames collectives between releases)."""
    for name in names:
        fn = getattr(obj, name, None)
        if fn is not None:
            return fn
    raise AttributeError(f"{type(obj).__name__} has none of {names}")


def _slot_sizes(numel: int, world: int) -> list[int]:
    base, extra = divmod(numel, world)
    return [base + (1 if j < extra else 0) for j in range(world)]


# ---------------------------------------------------------------------------------------------
# The process group.
# ---------------------------------------------------------------------------------------------


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
        self._device_type = device_type
        self._lock = threading.Lock()
        self._scratch: dict[torch.dtype, torch.Tensor] = {}
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
        op = _reduce_op(opts)
        if not tensors or _op_type(op) not in _FOLDED_OPS:
            return False
        if any(not (t.is_floating_point() or t.is_complex()) for t in tensors):
            return False
        if _op_type(op) == dist.ReduceOp.PREMUL_SUM and _premul_factor(op) is None:
            # Handing it to the wrapped backend would reduce in that backend's own order.
            raise RuntimeError(
                f"{self._backend_name}: torch {torch.__version__} does not expose the PREMUL_SUM "
                "factor to Python, so this reduction cannot be folded in a fixed order. For FSDP2, "
                "call set_force_sum_reduction_for_comms(True) on every FSDP module (SUM plus a "
                "separate division) instead of relying on a custom gradient divide factor."
            )
        return True

    def _scratch_buffer(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A flat buffer of `numel` elements; reused between calls on CPU (fresh pages cost more)."""
        if like.device.type != "cpu":
            return torch.empty(numel, dtype=like.dtype, device=like.device)
        buf = self._scratch.get(like.dtype)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=like.dtype)
            self._scratch[like.dtype] = buf
        return buf[:numel]

    def _wait_all(self, works: list) -> None:
        for work in works:
            work.wait()

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]):
        fn = _method(self._inner, "alltoall_base", "all_to_all_single")
        fn(out, inp, out_splits, in_splits, c10d.AllToAllOptions()).wait()

    def _gather_rows(self, flat: torch.Tensor, slots: list[int]) -> list[torch.Tensor]:
        """Slot `rank` of every rank's `flat` (cut into `slots`), one row per rank, in rank order.

        Pure data movement. gloo: paired send/recv with each peer, our own row read in place
        (its all-to-all copies the local slot and is slower). NCCL: one all-to-all.
        """
        world, rank = self._world, self._rank
        mine = slots[rank]
        offsets = [sum(slots[:j]) for j in range(world)]
        recv = self._scratch_buffer(world * mine, flat).view(world, mine)
        if self._device_type != "cpu":
            self._all_to_all(recv.view(-1), flat, [mine] * world, slots)
            return list(recv.unbind(0))
        works = []
        for peer in range(world):
            if peer == rank:
                continue
            if slots[peer]:
                works.append(
                    self._inner.send([flat[offsets[peer] : offsets[peer] + slots[peer]]], peer, _TAG)
                )
            if mine:
                works.append(self._inner.recv([recv[peer]], peer, _TAG))
        self._wait_all(works)
        rows = list(recv.unbind(0))
        rows[rank] = flat[offsets[rank] : offsets[rank] + mine]
        return rows

    def _share_slot(self, flat: torch.Tensor, slots: list[int]) -> None:
        """All-gather: every rank's slot `rank` of `flat` lands in slot `rank` of everyone's `flat`."""
        world, rank = self._world, self._rank
        mine = slots[rank]
        offsets = [sum(slots[:j]) for j in range(world)]
        slot = flat[offsets[rank] : offsets[rank] + mine]
        if self._device_type != "cpu":
            # An all-to-all that sends our slot to every rank (slots may differ in size by one).
            send = self._scratch_buffer(world * mine, flat)
            send.view(world, mine).copy_(slot.expand(world, mine))
            self._all_to_all(flat, send, slots, [mine] * world)
            return
        works = []
        for peer in range(world):
            if peer == rank:
                continue
            if mine:
                works.append(self._inner.send([slot], peer, _TAG))
            if slots[peer]:
                works.append(
                    self._inner.recv([flat[offsets[peer] : offsets[peer] + slots[peer]]], peer, _TAG)
                )
        self._wait_all(works)

    def _fold_my_slot(self, flat: torch.Tensor, slots: list[int], op: object, out: torch.Tensor) -> None:
        """Fold slot `rank` of every rank's `flat` (cut into `slots`) into `out` (numel slots[rank]).

        `out` may be our own slot of `flat` (all_reduce, in-place reduce_scatter).
        """
        rows = self._gather_rows(flat, slots)
        own = rows[self._rank]
        if _op_type(op) == dist.ReduceOp.PREMUL_SUM:
            factor = _premul_factor(op)
            rows = [row * factor for row in rows]  # not in place: a row may be the caller's input
        elif (
            not _is_power_of_two(self._world)
            and self._rank >= 2
            and own.numel()
            and out.untyped_storage().data_ptr() == own.untyped_storage().data_ptr()
        ):
            # The ascending fold writes `out` before it reads row `rank` (>= 2): keep a copy.
            rows[self._rank] = own.clone()
        _fold(rows, out=out)
        if _op_type(op) == dist.ReduceOp.AVG:
            out.div_(self._world)

    def _allreduce_flat(self, flat: torch.Tensor, op: object) -> None:
        """Fixed-order all_reduce of a contiguous 1-D tensor, in place."""
        if flat.numel() == 0:
            return
        slots = _slot_sizes(flat.numel(), self._world)
        start = sum(slots[: self._rank])
        # Our own slot of `flat` takes the fold (the other slots have been sent by then), and
        # the all-gather then fills in the others.
        self._fold_my_slot(flat, slots, op, flat[start : start + slots[self._rank]])
        self._share_slot(flat, slots)

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
            self._allreduce_tensors(tensors, _reduce_op(opts))
        return _completed_work(tensors, tensors[0].device)

    def allreduce_coalesced(self, tensors, opts=None):
        tensors = list(tensors)
        opts = c10d.AllreduceCoalescedOptions() if opts is None else opts
        if not self._folds(opts, tensors):
            return self._inner.allreduce_coalesced(tensors, opts)
        with self._lock:
            self._allreduce_tensors(tensors, _reduce_op(opts))
        return _completed_work(tensors, tensors[0].device)

    def reduce(self, tensors, opts=None):
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        opts = c10d.ReduceOptions() if opts is None else opts
        if not self._folds(opts, tensors):
            return self._inner.reduce(tensors, opts)
        # An all_reduce on a copy; only the root keeps the result, as with a real reduce.
        with self._lock:
            copies = [t.clone() for t in tensors]
            self._allreduce_tensors(copies, _reduce_op(opts))
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
                self._reduce_scatter_flat(out, flat, [t.numel() for t in ins], _reduce_op(opts))
        return _completed_work(outputs, outputs[0].device)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = c10d.ReduceScatterOptions() if opts is None else opts
        if not self._folds(opts, [output, input]):
            return _method(self._inner, "_reduce_scatter_base", "reduce_scatter_single")(output, input, opts)
        if input.numel() != self._world * output.numel():
            raise ValueError(
                f"reduce_scatter: input has {input.numel()} elements, expected {self._world} x {output.numel()}"
            )
        with self._lock:
            flat = input.reshape(-1).contiguous()  # a view when `input` is contiguous
            self._reduce_scatter_flat(output, flat, [output.numel()] * self._world, _reduce_op(opts))
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
        fn = _method(self._inner, "_allgather_base", "all_gather_single")
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
        fn = _method(self._inner, "alltoall_base", "all_to_all_single")
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
# ---------------------------------------------------------------------------------------------


def _backend_args(backend_opts: object) -> tuple[object, int, int, object, str | None, list[int] | None]:
    return (
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        getattr(backend_opts, "group_id", None),
        getattr(backend_opts, "global_ranks_in_group", None),
    )


def _create_det_gloo(backend_opts: object, pg_options: object = None) -> DetProcessGroup:
    store, rank, size, timeout, group_name, global_ranks = _backend_args(backend_opts)
    inner = c10d.ProcessGroupGloo(store, rank, size, timeout)
    # What init_process_group does for a plain gloo group (names for logs and the flight recorder).
    for attr, value in (("global_ranks_in_group", global_ranks), ("group_name", group_name)):
        if value is not None:
            try:
                setattr(inner.options, attr, value)
            except (AttributeError, TypeError):
                pass
    if hasattr(inner, "_set_sequence_number_for_group"):
        inner._set_sequence_number_for_group()
    return DetProcessGroup(inner, rank, size, DET_GLOO, "cpu")


def _create_det_nccl(backend_opts: object, pg_options: object = None) -> DetProcessGroup:
    store, rank, size, timeout, group_name, global_ranks = _backend_args(backend_opts)
    nccl = c10d.ProcessGroupNCCL
    if pg_options is not None and isinstance(pg_options, nccl.Options):
        options = pg_options
    else:
        options = nccl.Options()
        options.is_high_priority_stream = False
    options._timeout = timeout
    if global_ranks is not None:
        options.global_ranks_in_group = global_ranks
    if group_name is not None:
        options.group_name = group_name
    inner = nccl(store, rank, size, options)
    if hasattr(inner, "_set_sequence_number_for_group"):
        inner._set_sequence_number_for_group()
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
