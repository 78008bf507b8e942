"""The det backends' pure slot math (core/det_fold.py): slot cutting, reduce ops, folding one slot."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from grpolab.core.det_fold import (
    PREMUL_SUM_FOLDED,
    fold_in_fixed_order,
    fold_slot,
    is_folded_op,
    reduce_op,
    slot_sizes,
)


def test_slot_sizes_give_the_remainder_to_the_first_slots() -> None:
    assert slot_sizes(10, 4) == [3, 3, 2, 2]
    assert slot_sizes(2, 3) == [1, 1, 0]
    assert slot_sizes(0, 2) == [0, 0]


def test_folded_ops_are_the_order_dependent_ones() -> None:
    assert all(is_folded_op(op) for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG))
    assert not any(is_folded_op(op) for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT))
    assert reduce_op(None) == dist.ReduceOp.SUM  # an options object without an op means SUM
    assert reduce_op(dist.ReduceOp.MAX) == dist.ReduceOp.MAX


def test_fold_slot_into_a_row_it_still_reads() -> None:
    # 3 ranks, ascending: (1e8 + -1e8) + 1 = 1. `out` is row 2's own memory (a rank folding into its
    # own slot): without the copy the fold would write 0 there before reading row 2's 1.
    rows = [torch.tensor([1e8, 2.0]), torch.tensor([-1e8, 2.0]), torch.tensor([1.0, 2.0])]
    out = rows[2]
    fold_slot(rows, dist.ReduceOp.SUM, out)
    assert out.tolist() == [1.0, 6.0]
    rows = [torch.tensor([1.0, 3.0]), torch.tensor([2.0, 3.0]), torch.tensor([3.0, 3.0])]
    out = torch.empty(2)
    fold_slot(rows, dist.ReduceOp.AVG, out)
    assert out.tolist() == [2.0, 3.0] and rows[0].tolist() == [1.0, 3.0]


def test_fold_slot_matches_fold_in_fixed_order_bitwise() -> None:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(33, generator=g) * 10.0 ** (2 * r) for r in range(4)]
    out = torch.empty(33)
    fold_slot(rows, dist.ReduceOp.SUM, out)
    assert torch.equal(out.view(torch.int32), fold_in_fixed_order(rows).view(torch.int32))


@pytest.mark.skipif(not PREMUL_SUM_FOLDED, reason="this torch does not expose the PREMUL_SUM factor")
def test_fold_slot_premul_sum_scales_each_row_first() -> None:
    op = dist._make_nccl_premul_sum(0.5)
    rows = [torch.tensor([1.0]), torch.tensor([3.0])]
    out = torch.empty(1)
    fold_slot(rows, op, out)
    assert out.item() == 2.0 and rows[1].item() == 3.0  # the rows are left alone
