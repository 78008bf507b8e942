"""The wrapped c10d backend under the det backends: building it, and moving slots over it.

Building. `make_inner_gloo` / `make_inner_nccl` construct the real ProcessGroupGloo / NCCL from
the options torch hands a registered backend, as `init_process_group` would for plain gloo/nccl.

Moving slots. Every element comes out as if each rank had all-gathered every rank's full input and folded
locally (Miles' method), but only the data a rank folds travels: the flat input is cut into W slots
(`det_fold.slot_sizes`), rank r receives slot r of every rank (`SlotExchange.gather_rows`, pure
data movement), folds those W rows into its slot in the fixed order, and for all_reduce the folded
slots are all-gathered (`SlotExchange.share_slot`). det_gloo moves the slots with paired send/recv
(gloo's all-to-all and all-gather add copies); det_nccl with NCCL's all-to-all. The transport never
adds anything, so its algorithm and version cannot change a bit.

What it costs. Per rank, an all_reduce moves 2(W-1)/W of the tensor, as a ring all-reduce does
(a reduce_scatter moves (W-1)/W); Miles' gather moves W-1 times the tensor. Every exchange is
synchronous (no overlap with compute), and a scratch buffer holds W times one slot (about the
input's size; kept between calls on CPU, where fresh pages cost more than the copy). Measured by
benchmarks/bench_det_allreduce.py (16M float32, 2 ranks, 1 thread each): 1.25-1.36x plain gloo
on an idle 16-core machine (torch 2.11), 0.85-1.4x on a busy 2-core one (torch 2.13).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._C import _distributed_c10d as c10d

# Tag of the send/recv pairs det_gloo exchanges slots with (far from the tags user code picks).
_TAG = 0x64657467


def _backend_args(backend_opts: object) -> tuple[object, int, int, object, str | None, list[int] | None]:
    return (
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        getattr(backend_opts, "group_id", None),
        getattr(backend_opts, "global_ranks_in_group", None),
    )


def make_inner_gloo(backend_opts: object) -> tuple[object, int, int]:
    """(ProcessGroupGloo, rank, world size) from a registered backend's `backend_opts`.

    Blocks until every rank of the group has connected (the store rendezvous).
    """
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
    return inner, rank, size


def make_inner_nccl(backend_opts: object, pg_options: object = None) -> tuple[object, int, int]:
    """(ProcessGroupNCCL, rank, world size) from a registered backend's `backend_opts`; `pg_options`
    (`init_process_group(pg_options=...)`) is used when it is a ProcessGroupNCCL.Options."""
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
    return inner, rank, size


def first_method(obj: object, *names: str) -> Callable:
    """The first of `names` that `obj` has (torch renames collectives between releases).

    Raises:
        AttributeError: `obj` has none of them.
    """
    for name in names:
        fn = getattr(obj, name, None)
        if fn is not None:
            return fn
    raise AttributeError(f"{type(obj).__name__} has none of {names}")


class SlotExchange:
    """Moves slots of flat tensors between the ranks of one wrapped c10d backend.

    Not thread-safe (the CPU scratch buffer is reused between calls): the caller serializes, as
    DetProcessGroup does with its lock.

    Args:
        inner: the wrapped `ProcessGroupGloo` or `ProcessGroupNCCL`; it carries all traffic.
        rank / world_size: this rank and the group size.
        device_type: "cpu" (paired send/recv) or "cuda" (NCCL all-to-all).
    """

    def __init__(self, inner: object, rank: int, world_size: int, device_type: str) -> None:
        self._inner = inner
        self._rank = rank
        self._world = world_size
        self._device_type = device_type
        self._scratch: dict[torch.dtype, torch.Tensor] = {}

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
        fn = first_method(self._inner, "alltoall_base", "all_to_all_single")
        fn(out, inp, out_splits, in_splits, c10d.AllToAllOptions()).wait()

    def gather_rows(self, flat: torch.Tensor, slots: list[int]) -> list[torch.Tensor]:
        """Slot `rank` of every rank's `flat` (cut into `slots`), one row per rank, in rank order.

        Pure data movement. gloo: paired send/recv with each peer, our own row read in place
        (its all-to-all copies the local slot and is slower). NCCL: one all-to-all. The other
        ranks' rows are views of the scratch buffer, valid until the next call.

        Args:
            flat: this rank's contiguous 1-D input.
            slots: W slot sizes summing to `flat.numel()`, the same on every rank.
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

    def share_slot(self, flat: torch.Tensor, slots: list[int]) -> None:
        """All-gather in place: every rank's slot `rank` of `flat` lands in slot `rank` of everyone's `flat`."""
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
