"""The deterministic collective backend (core/det_backend.py).

Multi-rank checks run in processes started with torch.multiprocessing.spawn over a FileStore;
each pins 1 thread and `torch.use_deterministic_algorithms(True)`. Every rank builds every rank's
input from a seed, so it can compute the expected reduction locally with `reference_fold` below,
which is written out independently of the module (and never goes through float64).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpolab.core import det_backend
from grpolab.core.det_backend import fold_in_fixed_order


def reference_fold(ts: list[torch.Tensor]) -> torch.Tensor:
    """The order the backend promises: pairwise for 1, 2, 4 and 8 ranks, ascending otherwise."""
    n = len(ts)
    if n == 1:
        return ts[0].clone()
    if n == 2:
        return ts[0] + ts[1]
    if n == 4:
        return (ts[0] + ts[1]) + (ts[2] + ts[3])
    if n == 8:
        return ((ts[0] + ts[1]) + (ts[2] + ts[3])) + ((ts[4] + ts[5]) + (ts[6] + ts[7]))
    acc = ts[0] + ts[1]
    for t in ts[2:]:
        acc = acc + t
    return acc


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (torch.equal calls -0.0 and 0.0 equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def rank_input(rank: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rank `rank`'s input: magnitudes spread over 8 decades, so the summation order shows in the bits."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    n = 1
    for s in shape:
        n *= s
    scale = torch.pow(10.0, torch.randint(-4, 5, (n,), generator=g).float())
    x = (torch.randn(n, generator=g) * scale).to(dtype).view(shape)
    if n >= 1:  # one element where pairwise and ascending orders differ: 1e8, 1, -1e8, 1, ...
        x.view(-1)[0] = [1e8, 1.0, -1e8, 1.0][rank % 4]
    return x


# ---------------------------------------------------------------------------------------------
# The pure fold.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_fold_matches_the_reference_bitwise(n: int) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        ts = [rank_input(r, (257,), dtype) for r in range(n)]
        before = [t.clone() for t in ts]
        assert same_bits(fold_in_fixed_order(ts), reference_fold(ts))
        assert all(same_bits(t, b) for t, b in zip(ts, before))  # pure


def test_fold_order_is_pairwise_for_four_and_ascending_for_three() -> None:
    big, one = torch.tensor([1e8]), torch.tensor([1.0])
    # float32: 1e8 + 1 == 1e8. Pairwise: (1e8 + 1) + (-1e8 + 1) = 0; ascending would give 1.
    assert fold_in_fixed_order([big, one, -big, one]).item() == 0.0
    # Ascending: (1e8 + -1e8) + 1 = 1; the other bracketing would give 0.
    assert fold_in_fixed_order([big, -big, one]).item() == 1.0
    out = fold_in_fixed_order([one])
    assert out.item() == 1.0 and out.data_ptr() != one.data_ptr()
    with pytest.raises(ValueError):
        fold_in_fixed_order([])


def test_register_is_idempotent() -> None:
    det_backend.register()
    det_backend.register()
    assert dist.Backend.DET_GLOO == "det_gloo"
    assert "det_gloo" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["det_gloo"] == ["cpu"]
    assert det_backend.backend_for("cpu") == "det_gloo" and det_backend.backend_for("cuda") == "det_nccl"


# ---------------------------------------------------------------------------------------------
# Multi-process harness.
# ---------------------------------------------------------------------------------------------


def _entry(rank: int, world: int, store: str, job: str, out_dir: str, backend: str) -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (GPU test)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    det_backend.register()
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        globals()[job](rank, world, Path(out_dir))
    finally:
        dist.destroy_process_group()


_PRELOAD = ["torch", "torch.distributed.fsdp", "transformers.models.qwen3.modeling_qwen3", __name__]


def launch(job: str, world: int, tmp_path: Path, backend: str = "det_gloo") -> Path:
    """Run `job(rank, world, out_dir)` on `world` ranks of a `backend` world; returns out_dir.

    Ranks fork from a forkserver that has torch and transformers imported already (a fresh spawn
    costs several seconds of imports per rank on a 2-core box); the server itself never computes,
    so no OpenMP pool is forked.
    """
    out = tmp_path / f"{job}-w{world}"
    out.mkdir()
    mp.get_context("forkserver").set_forkserver_preload(_PRELOAD)
    mp.start_processes(
        _entry,
        args=(world, str(out / "store"), job, str(out), backend),
        nprocs=world,
        start_method="forkserver",
    )
    return out


def _reduce_scatter_tensor():
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_gather_tensor():
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def job_collectives(rank: int, world: int, out: Path) -> None:
    pg = dist.group.WORLD
    assert isinstance(pg, det_backend.DetProcessGroup) and pg.getBackendName() == "det_gloo"
    assert dist.get_backend() == "det_gloo" and pg.group_name
    import torch.distributed._functional_collectives as funcol

    rs, ag = _reduce_scatter_tensor(), _all_gather_tensor()
    c10d = torch._C._distributed_c10d
    for dtype in (torch.float32, torch.bfloat16):
        for shape in [(1,), (2,), (1001,), (world * 6, 5)]:
            inputs = [rank_input(r, shape, dtype, seed=len(shape)) for r in range(world)]
            expected = reference_fold(inputs)
            summed = inputs[rank].clone()
            dist.all_reduce(summed)
            assert same_bits(summed, expected), (dtype, shape)
            avg = inputs[rank].clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            assert same_bits(avg, expected / world), (dtype, shape)
            # Non-contiguous input (staged through a contiguous copy).
            if len(shape) == 2:
                t = torch.empty(shape[::-1], dtype=dtype).t().copy_(inputs[rank])
                assert not t.is_contiguous()
                dist.all_reduce(t)
                assert same_bits(t, expected)
            if shape[0] % world:
                continue
            # Reduce-scatter in every form: the shard is the matching slice of the all_reduce.
            want = summed.reshape(-1).chunk(world)[rank]
            shard, inp = torch.empty_like(want), inputs[rank].clone()
            rs(shard, inp)
            assert same_bits(shard, want) and same_bits(inp, inputs[rank]), (dtype, shape)
            if len(shape) == 2:  # a non-contiguous output
                nc = torch.empty(shape[1], shape[0] // world, dtype=dtype).t()
                rs(nc, inputs[rank].clone())
                assert same_bits(nc.reshape(-1), want)
            inp = inputs[rank].clone().reshape(-1)  # in place: the output is our slot of the input
            rs(inp.chunk(world)[rank], inp)
            assert same_bits(inp.chunk(world)[rank], want)
            shard = torch.empty_like(want)
            dist.reduce_scatter(shard, [c.clone() for c in inputs[rank].reshape(-1).chunk(world)])
            assert same_bits(shard, want)
            for name in ("reduce_scatter_single", "_reduce_scatter_base"):
                shard = torch.empty_like(want)
                opts = c10d.ReduceScatterOptions()
                getattr(pg, name)(shard, inputs[rank].clone(), opts).wait()
                assert same_bits(shard, want), name
            shard = torch.empty_like(want)
            rs(shard, inputs[rank].clone(), op=dist.ReduceOp.AVG)
            assert same_bits(shard, avg.reshape(-1).chunk(world)[rank])

    # Coalesced forms: several tensors in one call, each element folded as above.
    a_in = [rank_input(r, (33,), torch.float32, seed=7) for r in range(world)]
    b_in = [rank_input(r, (world * 4,), torch.float32, seed=8) for r in range(world)]
    a, b = a_in[rank].clone(), b_in[rank].clone()
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    assert same_bits(a, reference_fold(a_in)) and same_bits(b, reference_fold(b_in))
    a, b = a_in[rank].clone(), b_in[rank].clone()
    pg.allreduce_coalesced([a, b], c10d.AllreduceCoalescedOptions()).wait()
    assert same_bits(a, reference_fold(a_in)) and same_bits(b, reference_fold(b_in))
    s1, s2 = torch.empty(4), torch.empty(4)
    with dist._coalescing_manager():
        rs(s1, b_in[rank].clone())
        rs(s2, b_in[rank] * 3)
    assert same_bits(s1, reference_fold(b_in).chunk(world)[rank])
    assert same_bits(s2, reference_fold([t * 3 for t in b_in]).chunk(world)[rank])

    # PREMUL_SUM (FSDP2 with a custom divide factor): each input scaled, then folded.
    # Where torch hides the factor (2.11), every rank refuses before any traffic.
    premul = dist._make_nccl_premul_sum(0.5)
    p = a_in[rank].clone()
    if det_backend.PREMUL_SUM_FOLDED:
        dist.all_reduce(p, op=premul)
        assert same_bits(p, reference_fold([t * 0.5 for t in a_in]))
    else:
        with pytest.raises(RuntimeError, match="PREMUL_SUM"):
            dist.all_reduce(p, op=premul)

    # Functional collectives (DTensor, clip_grad_norm_) reach the fold through the C++ trampoline.
    f = funcol.wait_tensor(funcol.all_reduce(a_in[rank].clone(), "sum", pg))
    assert same_bits(f, reference_fold(a_in))

    # reduce: the root gets the fold, the others keep their input.
    r = a_in[rank].clone()
    dist.reduce(r, dst=0)
    assert same_bits(r, reference_fold(a_in) if rank == 0 else a_in[rank])

    # Pass-through: MAX, integer SUM, broadcast, all-gather, objects, send/recv.
    m = a_in[rank].clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert torch.equal(m, torch.stack(a_in).amax(0))
    n = torch.arange(5) * (rank + 1)
    dist.all_reduce(n)
    assert torch.equal(n, torch.arange(5) * sum(range(1, world + 1)))
    bc = a_in[rank].clone()
    dist.broadcast(bc, src=world - 1)
    assert same_bits(bc, a_in[world - 1])
    gathered = torch.empty(world * 33)
    ag(gathered, a_in[rank])
    assert same_bits(gathered, torch.cat(a_in))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]
    if world >= 2 and rank < 2:
        buf = torch.full((3,), float(rank))
        if rank == 0:
            dist.send(buf, dst=1)
        else:
            dist.recv(buf, src=0)
            assert torch.equal(buf, torch.zeros(3))
    # Async work objects complete and carry the result (DDP's reducer reads the future).
    w = torch.ones(2)
    work = dist.all_reduce(w, async_op=True)
    work.wait()
    assert torch.equal(work.get_future().value()[0], torch.full((2,), float(world)))
    dist.barrier()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_fold_in_fixed_order(world: int, tmp_path: Path) -> None:
    launch("job_collectives", world, tmp_path)


# ---------------------------------------------------------------------------------------------
# DDP and FSDP2 on det_gloo.
# ---------------------------------------------------------------------------------------------


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _same_on_every_rank(tensors: list[torch.Tensor]) -> bool:
    mine = torch.cat([t.detach().reshape(-1) for t in tensors])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return all(same_bits(mine, other) for other in everyone)


_RECORDED = (
    "allreduce", "allreduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_single",
    "_reduce_scatter_base", "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced",
    "allgather", "allgather_coalesced", "all_gather_single", "_allgather_base",
    "all_gather_single_coalesced", "allgather_into_tensor_coalesced", "all_to_all_single",
    "alltoall_base", "alltoall", "broadcast", "gather", "scatter", "barrier", "send", "recv",
    "_fold_my_slot",
)  # fmt: skip


def record_calls(calls: Counter) -> None:
    """Count, in this process, every DetProcessGroup method called (by the name it was called by)."""
    cls = det_backend.DetProcessGroup
    for name in _RECORDED:
        fn = getattr(cls, name)

        def wrapper(self, *args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(self, *args, **kwargs)

        setattr(cls, name, wrapper)


def job_train_ddp_fsdp2(rank: int, world: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def batch(step: int) -> torch.Tensor:
        return torch.randn(5, 8, generator=torch.Generator().manual_seed(10 * step + rank))

    calls: Counter = Counter()
    record_calls(calls)
    start = [p.detach().clone() for p in _mlp().parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    for step in range(2):
        ddp(batch(step)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    params = list(ddp.module.parameters())
    ddp_calls = dict(calls)
    assert _same_on_every_rank(params)
    assert not all(same_bits(p.detach(), s) for p, s in zip(params, start))

    model = _mlp()
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    calls.clear()
    for step in range(2):
        model(batch(step)).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    fsdp2_calls = dict(calls)
    full = [p.full_tensor() for p in model.parameters()]
    assert _same_on_every_rank(full)
    assert not all(same_bits(p, s) for p, s in zip(full, start))
    if rank == 0:
        (out / "calls.json").write_text(json.dumps({"ddp": ddp_calls, "fsdp2": fsdp2_calls}, indent=1))


def test_ddp_and_fsdp2_train_on_det_gloo(tmp_path: Path) -> None:
    calls = json.loads((launch("job_train_ddp_fsdp2", 2, tmp_path) / "calls.json").read_text())
    print(f"torch {torch.__version__} DetProcessGroup calls over 2 steps: {calls}")
    # The gradient reductions reached the fold (not the wrapped backend's own reduction).
    for setup in ("ddp", "fsdp2"):
        assert calls[setup].get("_fold_my_slot", 0) > 0, calls[setup]
    assert {"reduce_scatter_single", "_reduce_scatter_base"} & calls["fsdp2"].keys(), calls["fsdp2"]


def job_nccl(rank: int, world: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    pg = dist.group.WORLD
    assert isinstance(pg, det_backend.DetProcessGroup) and pg.getBackendName() == "det_nccl"
    inputs = [rank_input(r, (world * 333,), torch.float32).to(device) for r in range(world)]
    expected = reference_fold(inputs)
    x = inputs[rank].clone()
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    assert same_bits(x, expected) and same_bits(work.get_future().value()[0], expected)
    a = inputs[rank].clone()
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert same_bits(a, expected / world)
    shard = torch.empty(333, device=device)
    _reduce_scatter_tensor()(shard, inputs[rank].clone())
    assert same_bits(shard, expected.chunk(world)[rank])
    m = inputs[rank].clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert torch.equal(m, torch.stack(inputs).amax(0))
    gathered = torch.empty(world * world * 333, device=device)
    _all_gather_tensor()(gathered, inputs[rank])
    assert same_bits(gathered, torch.cat(inputs))
    objs = [None] * world
    dist.all_gather_object(objs, rank)
    assert objs == list(range(world))

    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(_mlp().to(device), device_ids=[rank])
    fsdp = _mlp().to(device)
    mesh = init_device_mesh("cuda", (world,))
    fully_shard(fsdp[0], mesh=mesh)
    fully_shard(fsdp[2], mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    for model in (ddp, fsdp):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step in range(2):
            batch = torch.randn(5, 8, generator=torch.Generator().manual_seed(10 * step + rank)).to(device)
            model(batch).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    full = [p.full_tensor() for p in fsdp.parameters()]
    assert _same_on_every_rank(list(ddp.parameters())) and _same_on_every_rank(full)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_det_nccl_collectives_ddp_and_fsdp2(tmp_path: Path) -> None:
    # NCCL refuses two ranks on one GPU, so a 1-GPU machine runs a world of 1 (exchange, fold,
    # stream and Work handling on CUDA); with more GPUs the fold is checked across them.
    world = min(torch.cuda.device_count(), 4)
    launch("job_nccl", world, tmp_path, backend="det_nccl")


# ---------------------------------------------------------------------------------------------
# The invariance: 1 rank x 2 micro-batches == 2 ranks x 1 micro-batch, bit for bit.
# ---------------------------------------------------------------------------------------------

STEPS, MICRO, SEQ, VOCAB = 2, 2, 12, 64


def _tiny_qwen3() -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


def _recorded_rollout(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One micro-batch of a fixed 'rollout': tokens (2, SEQ), loss mask and per-token advantages."""
    g = torch.Generator().manual_seed(100 * step + micro)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    mask = torch.zeros(2, SEQ - 1)
    mask[:, 4 + micro :] = 1.0  # response tokens; the two micro-batches have different counts
    adv = torch.randn(2, 1, generator=g).expand(2, SEQ - 1)
    return tokens, mask, adv


def _summed_loss(model: torch.nn.Module, tokens, mask, adv) -> torch.Tensor:
    """A policy-gradient style loss SUMMED over tokens; normalised later by the global token count."""
    logits = model(input_ids=tokens).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return -(adv * logp * mask).sum()


def _train_plain(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Whole model on every rank; gradients SUM-all-reduced by hand, then divided by the global count."""
    model = _tiny_qwen3()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    mine = range(MICRO) if world == 1 else [rank]
    for step in range(STEPS):
        grads = []
        count = torch.zeros((), dtype=torch.int64)
        for micro in mine:
            tokens, mask, adv = _recorded_rollout(step, micro)
            grads.append(torch.autograd.grad(_summed_loss(model, tokens, mask, adv), params))
            count += int(mask.sum())
        if world == 1:
            # The single rank sums its micro-batch gradients as g0 + g1: the 2-rank fold's order.
            # (With more micro-batches, sum them with fold_in_fixed_order to match a wider world.)
            summed = [g0 + g1 for g0, g1 in zip(*grads)]
        else:
            summed = [g.clone() for g in grads[0]]
        for g in summed:  # world 1: an identity; world 2: the fixed-order fold g0 + g1
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
        dist.all_reduce(count)  # integers: exact in any order
        for p, g in zip(params, summed):
            p.grad = g / count.item()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train_fsdp2(rank: int, world: int) -> dict[str, torch.Tensor]:
    """FSDP2, one shard group per decoder layer; the gradient reduce-scatter made a plain SUM.

    FSDP2's default for float32 is an AVG reduce-scatter, (g0 + g1) / 2, and dividing that by
    count / 2 rounds differently from (g0 + g1) / count. On every FSDP module, a divide factor of 1
    with force-sum turns it into SUM (and a division by 1, skipped); a divide factor alone would
    use PREMUL_SUM(1.0), which torch 2.11 cannot fold. World 1 accumulates its two micro-batches
    in autograd (sync off for the first): g0 + g1, the same bits as the 2-rank fold.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = _tiny_qwen3()
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    mine = list(range(MICRO)) if world == 1 else [rank]
    for step in range(STEPS):
        count = torch.zeros((), dtype=torch.int64)
        for i, micro in enumerate(mine):
            model.set_requires_gradient_sync(i == len(mine) - 1)
            tokens, mask, adv = _recorded_rollout(step, micro)
            _summed_loss(model, tokens, mask, adv).backward()
            count += int(mask.sum())
        dist.all_reduce(count)
        for p in params:
            p.grad.div_(count.item())
        opt.step()
        opt.zero_grad()
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def job_invariance(rank: int, world: int, out: Path) -> None:
    """world 1: micro-batches 0 and 1 on this rank; world 2: micro-batch `rank`. Same global batch."""
    plain, fsdp2 = _train_plain(rank, world), _train_fsdp2(rank, world)
    if rank == 0:
        torch.save({"plain": plain, "fsdp2": fsdp2}, out / "weights.pt")


def test_world_size_does_not_change_the_weights(tmp_path: Path) -> None:
    one = torch.load(launch("job_invariance", 1, tmp_path) / "weights.pt")
    two = torch.load(launch("job_invariance", 2, tmp_path) / "weights.pt")
    init = _tiny_qwen3().state_dict()
    reference = one["plain"]
    assert any(not same_bits(reference[k], init[k]) for k in init), "training did not move the weights"
    for label, weights in [
        ("2 ranks", two["plain"]),
        ("FSDP2 1 rank", one["fsdp2"]),
        ("FSDP2 2 ranks", two["fsdp2"]),
    ]:
        assert weights.keys() == reference.keys()
        differing = [k for k in reference if not same_bits(weights[k], reference[k])]
        assert not differing, f"{label} vs 1 rank x 2 micro-batches: these weights differ: {differing}"
