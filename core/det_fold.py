"""The fixed-order fold of the det backends: what every folded element is, as pure tensor math.

What is computed. For W ranks' values of one element, `fold_in_fixed_order` gives a pairwise tree
((r0+r1)+(r2+r3))... when W is a power of two, a left-to-right ascending-rank sum otherwise. Each
`+` is one elementwise IEEE addition in the tensors' dtype, so the result depends only on the
inputs and W, never on a transport, bucket layout or timing. `fold_slot` applies a reduction op on
top: AVG divides the fold by W afterwards, PREMUL_SUM multiplies each rank's value by the factor
before it, SUM is the fold itself. What the trainer relies on: with SUM-reduced gradients divided
by a global count, 2 ranks with one micro-batch each give the same weights, bit for bit, as one
rank that adds its two micro-batch gradients as `g0 + g1` (for more micro-batches, add them with
`fold_in_fixed_order` to match a wider world). The fold follows Miles' `det_nccl`
(miles/utils/test_utils/det_process_group.py, `_fold_gathered_sum`).

Also here: how a flat tensor is cut into W slots (`slot_sizes`) and which c10d reduce ops fold
(`folds_op`, `PREMUL_SUM_FOLDED`). No communication: `det_transport` moves the slots and
`det_backend` wires both into a process group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

# Reductions whose floating-point result depends on the order of the additions.
_FOLDED_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM)


def fold_in_fixed_order(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum `tensors` (one per rank, in rank order) in the fixed order the det backends use.

    Power-of-two count: a pairwise tree, ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7)), level by
    level. Any other count: left to right, ((t0 + t1) + t2) + t3 ... Each `+` is one elementwise
    IEEE addition in the tensors' dtype, so every element of the result depends only on the same
    element of the inputs and on their count. This is the fold of Miles' `det_nccl`
    (miles/utils/test_utils/det_process_group.py, `_fold_gathered_sum`). Pure: returns a new
    tensor and leaves the inputs alone.

    Args:
        tensors: W same-shape, same-dtype tensors, rank 0 first.

    Returns:
        A new tensor of their shape and dtype.

    Raises:
        ValueError: `tensors` is empty.
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


def slot_sizes(numel: int, world: int) -> list[int]:
    """How a flat tensor of `numel` elements is cut into `world` slots: the first `numel % world`
    slots get one element more. Slot r is rank r's share of a reduce_scatter / all_reduce."""
    base, extra = divmod(numel, world)
    return [base + (1 if j < extra else 0) for j in range(world)]


# ---------------------------------------------------------------------------------------------
# c10d reduce ops.


def reduce_op(opts: object) -> object:
    """The ReduceOp inside a c10d options object (or the object itself when a bare ReduceOp is passed)."""
    op = getattr(opts, "reduceOp", opts)
    return dist.ReduceOp.SUM if op is None else op


def _op_type(op: object) -> object:
    # A ReduceOp compares equal to its RedOpType; PREMUL_SUM ops only expose it through `.op`.
    return getattr(op, "op", op)


def premul_factor(op: object) -> float | torch.Tensor | None:
    """The PREMUL_SUM factor, or None when this torch does not expose it to Python."""
    try:
        factor = op.factor  # torch >= 2.13 exposes it; older builds may not
    except (AttributeError, RuntimeError, TypeError):
        return None
    return factor if isinstance(factor, (float, int, torch.Tensor)) else None


def _premul_sum_folds() -> bool:
    make = getattr(dist, "_make_nccl_premul_sum", None)
    return make is not None and premul_factor(make(0.5)) is not None


PREMUL_SUM_FOLDED = _premul_sum_folds()
"""Whether PREMUL_SUM reductions are folded (torch 2.13 exposes the factor); where False they raise."""


def is_folded_op(op: object) -> bool:
    """SUM, AVG or PREMUL_SUM: the reductions whose floating-point result depends on the order."""
    return _op_type(op) in _FOLDED_OPS


def is_premul_sum(op: object) -> bool:
    """A PREMUL_SUM op (whose factor `premul_factor` reads)."""
    return _op_type(op) == dist.ReduceOp.PREMUL_SUM


def fold_slot(rows: list[torch.Tensor], op: object, out: torch.Tensor) -> None:
    """Reduce one slot: `out` = the fixed-order fold of `rows` (one per rank, rank order) under `op`.

    SUM: the fold. AVG: the fold divided by the number of rows afterwards. PREMUL_SUM: every row
    times the factor, then the fold (the rows are left alone). `out` may be one of the rows' memory
    (a rank folding into its own slot): a row the ascending fold would read after writing `out` is
    copied first.

    Args:
        rows: W same-shape floating-point tensors, rank 0 first.
        op: a c10d ReduceOp for which `is_folded_op` holds.
        out: a contiguous tensor of the rows' shape and dtype.

    Raises:
        ValueError: a PREMUL_SUM op whose factor this torch does not expose.
    """
    world = len(rows)
    if is_premul_sum(op):
        factor = premul_factor(op)
        if factor is None:
            raise ValueError(f"torch {torch.__version__} does not expose the PREMUL_SUM factor")
        rows = [row * factor for row in rows]  # not in place: a row may be the caller's input
    elif not _is_power_of_two(world) and out.numel():
        # The ascending fold writes `out` (t0 + t1) before it reads rows 2, 3, ...: keep copies.
        target = out.untyped_storage().data_ptr()
        rows = [
            row.clone() if i >= 2 and row.numel() and row.untyped_storage().data_ptr() == target else row
            for i, row in enumerate(rows)
        ]
    _fold(rows, out=out)
    if _op_type(op) == dist.ReduceOp.AVG:
        out.div_(world)
