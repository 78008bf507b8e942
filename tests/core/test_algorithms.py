"""Closed-form and invariance tests for grpolab.core.algorithms (B samples, T tokens, V vocab)."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.core import algorithms as alg
from grpolab.core.algorithms import (
    aggregate_loss,
    entropy_from_logits,
    get_advantage_estimator,
    get_kl_estimator,
    grpo_advantages,
    grpo_advantages_reference,
    masked_mean_per_sample,
    policy_loss,
    tis_metrics,
    tis_weights,
    token_log_probs,
)

# ------------------------------------------------------------------------------ registries


def test_registry_lookup_duplicate_and_unknown() -> None:
    assert get_advantage_estimator("grpo") is grpo_advantages
    assert set(alg.KL_ESTIMATORS.names()) == {"k1", "k2", "k3", "low_var_kl"}
    with pytest.raises(ValueError, match="already registered"):
        alg.register_advantage_estimator("grpo")(lambda r, g: r)
    with pytest.raises(
        ValueError, match=r"unknown KL estimator 'k9' \(--kl-loss-type\); valid: k1, k2, k3, low_var_kl"
    ):
        get_kl_estimator("k9")
    with pytest.raises(ValueError, match="valid: grpo"):
        get_advantage_estimator("gae")


# ------------------------------------------------------------------------------ advantages


@pytest.mark.parametrize("rewards", [[0.2] * 8, [0.2] * 7, [0.35] * 7, [0.3] * 6])
@pytest.mark.parametrize("std_normalize", [True, False])
def test_constant_group_is_exactly_zero(rewards: list[float], std_normalize: bool) -> None:
    for dtype in (torch.float32, torch.float64):
        r_B = torch.tensor(rewards, dtype=dtype)
        adv_B = grpo_advantages(r_B, torch.zeros(len(rewards), dtype=torch.long), std_normalize=std_normalize)
        assert adv_B.dtype == torch.float32
        assert torch.equal(adv_B, torch.zeros(len(rewards)))


def test_constant_groups_in_one_batch_are_exactly_zero() -> None:
    groups = [[0.2] * 8, [0.2] * 7, [0.35] * 7, [0.3] * 6, [0.0, 1.0]]
    r_B = torch.tensor([r for g in groups for r in g])
    ids_B = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    adv_B = grpo_advantages(r_B, ids_B)
    assert torch.equal(adv_B[:-2], torch.zeros(28))
    s = 1 / math.sqrt(0.5)  # [0, 1]: mean 0.5, unbiased std sqrt(0.5)
    torch.testing.assert_close(adv_B[-2:], torch.tensor([-0.5 * s, 0.5 * s]))


def test_bfloat16_rewards_are_exact() -> None:
    r_B = torch.tensor([1, 1, 1, 1.0078125], dtype=torch.bfloat16)
    adv_B = grpo_advantages(r_B, torch.zeros(4, dtype=torch.long))
    assert torch.equal(adv_B, torch.tensor([-0.5, -0.5, -0.5, 1.5]))
    # Dr.GRPO: mean only (mean 1.001953125).
    adv_B = grpo_advantages(r_B, torch.zeros(4, dtype=torch.long), std_normalize=False)
    assert torch.equal(adv_B, torch.tensor([-0.001953125] * 3 + [0.005859375]))


def test_one_sample_group_and_empty_batch() -> None:
    adv_B = grpo_advantages(torch.tensor([0.7, 1.0, 0.0]), torch.tensor([5, 9, 9]))
    assert adv_B[0].item() == 0.0 and not torch.isnan(adv_B).any()
    assert grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_reward_names_index(bad: float) -> None:
    with pytest.raises(ValueError, match="sample index 2"):
        grpo_advantages(torch.tensor([0.0, 1.0, bad, 1.0]), torch.tensor([0, 0, 1, 1]))


def test_bad_shapes_and_dtypes() -> None:
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(2, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(torch.zeros(3), torch.zeros(3))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("std_normalize", [True, False])
def test_vectorized_matches_loop_reference(seed: int, std_normalize: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_groups, dtype = 7, [torch.float32, torch.bfloat16, torch.float16, torch.float64][seed % 4]
    ids_B = torch.randint(0, num_groups, (40,), generator=gen) * 3 - 5  # non-contiguous, negative ids
    r_B = torch.randn(40, generator=gen).to(dtype)
    r_B[ids_B == ids_B[0]] = 0.25  # one constant group
    r_B[:6] = torch.randint(0, 2, (6,), generator=gen).to(dtype)  # some binary rewards
    fast_B = grpo_advantages(r_B, ids_B, std_normalize=std_normalize)
    slow_B = grpo_advantages_reference(r_B, ids_B, std_normalize=std_normalize)
    torch.testing.assert_close(fast_B, slow_B)
    assert not torch.isnan(fast_B).any()


# ------------------------------------------------------------------------------ policy loss


def _ppo(logp: list[float], old: list[float], adv: list[float], **kw):
    kw = {"eps_clip": 0.2, "eps_clip_high": 0.2, "eps_clip_c": None} | kw
    return policy_loss(torch.tensor([logp]), torch.tensor([old]), torch.tensor([adv]), **kw)


def test_ppo_ratio_one_has_zero_kl_and_clipfrac() -> None:
    logp = [-1.0, -2.5, -0.1]
    loss, clipfrac, ppo_kl = _ppo(logp, logp, [1.0, -1.0, 0.5])
    assert torch.equal(loss, torch.tensor([[-1.0, 1.0, -0.5]]))
    assert torch.equal(clipfrac, torch.zeros(1, 3))
    assert torch.equal(ppo_kl, torch.zeros(1, 3))


def test_ppo_clip_hand_computed() -> None:
    # Tokens: ratio 1.1 (inside), 1.5 (above 1+0.2), 0.5 (below 1-0.2), with A = +2 and A = -2.
    ratio = torch.tensor([1.1, 1.5, 0.5, 1.1, 1.5, 0.5], dtype=torch.float64)
    logp = ratio.log().float()
    r = logp.double().exp()  # the ratio the float32 log-probs actually encode
    adv = [2.0, 2.0, 2.0, -2.0, -2.0, -2.0]
    loss, clipfrac, ppo_kl = _ppo(logp.tolist(), [0.0] * 6, adv)
    expected = [-2 * r[0], -2 * 1.2, -2 * r[2], 2 * r[3], 2 * r[4], 2 * 0.8]
    torch.testing.assert_close(
        loss[0].double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0
    )
    assert clipfrac.tolist() == [[0.0, 1.0, 0.0, 0.0, 0.0, 1.0]]
    torch.testing.assert_close(ppo_kl, -logp[None])


def test_ppo_asymmetric_clip_high() -> None:
    logp = [math.log(1.25), math.log(1.35)]
    loss, clipfrac, _ = _ppo(logp, [0.0, 0.0], [1.0, 1.0], eps_clip=0.2, eps_clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, -1.28]]))
    assert clipfrac.tolist() == [[0.0, 1.0]]


def test_ppo_dual_clip() -> None:
    # ratio 5, A = -1: clipped loss max(5, 1.2) = 5, dual clip caps at c * |A| = 3.
    # ratio 2, A = -1: loss 2 < 3 stays; ratio 5, A = +1: dual clip does not apply (-1.2).
    logp = [math.log(5.0), math.log(2.0), math.log(5.0)]
    loss, clipfrac, _ = _ppo(logp, [0.0] * 3, [-1.0, -1.0, 1.0], eps_clip_c=3.0)
    torch.testing.assert_close(loss, torch.tensor([[3.0, 2.0, -1.2]]))
    assert clipfrac.tolist() == [[0.0, 0.0, 1.0]]  # dual-clipped tokens are not counted (as Miles)
    with pytest.raises(ValueError, match="eps-clip-c"):
        _ppo(logp, [0.0] * 3, [1.0] * 3, eps_clip_c=1.0)


def test_ppo_log_ratio_is_clamped() -> None:
    loss, _, ppo_kl = _ppo([0.0, float("nan")], [-100.0, 0.0], [-1.0, -1.0])
    torch.testing.assert_close(loss, torch.tensor([[math.exp(20.0), 1.0]]))
    assert ppo_kl[0, 0].item() == -100.0


def _token_mean_loss(logp_BT, adv_BT, mask_BT, denominator):
    loss_BT, _, _ = policy_loss(
        logp_BT, logp_BT.detach(), adv_BT, eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None
    )
    return aggregate_loss(loss_BT, mask_BT, mode="token_mean", denominator=denominator)


def test_token_mean_is_micro_batch_invariant() -> None:
    # A: one token, A=+1; B: three tokens, A=-1; ratio 1 -> (-1 + 3) / 4 = 0.5.
    logp_a = torch.tensor([[-0.7]])
    logp_b = torch.tensor([[-1.1, -0.3, -2.0]])
    adv_a, adv_b = torch.ones(1, 1), -torch.ones(1, 3)

    joint = torch.cat([torch.nn.functional.pad(logp_a, (0, 2), value=-9.0), logp_b]).requires_grad_()
    adv = torch.cat([torch.nn.functional.pad(adv_a, (0, 2)), adv_b])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    loss_joint = _token_mean_loss(joint, adv, mask, denominator=4)
    loss_joint.backward()

    a, b = logp_a.clone().requires_grad_(), logp_b.clone().requires_grad_()
    loss_a = _token_mean_loss(a, adv_a, torch.ones(1, 1, dtype=torch.bool), denominator=4)
    loss_b = _token_mean_loss(b, adv_b, torch.ones(1, 3, dtype=torch.bool), denominator=4)
    (loss_a + loss_b).backward()

    assert loss_joint.item() == 0.5 and (loss_a + loss_b).item() == 0.5
    assert torch.equal(joint.grad[0, :1], a.grad[0]) and torch.equal(joint.grad[1], b.grad[0])
    assert torch.equal(joint.grad[0, 1:], torch.zeros(2))
    assert torch.equal(b.grad, torch.full((1, 3), 0.25))


# ------------------------------------------------------------------------------ aggregation


@pytest.mark.parametrize("mode", ["token_mean", "sample_mean"])
@pytest.mark.parametrize("masked_value", [100.0, float("inf"), float("nan")])
def test_aggregate_loss_masks_exactly(mode: str, masked_value: float) -> None:
    values = torch.tensor([[1.0, masked_value], [1.0, -50.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [1, 0]])
    loss = aggregate_loss(values, mask, mode=mode, denominator=2)
    assert loss.item() == 1.0
    loss.backward()
    assert torch.equal(values.grad, torch.tensor([[0.5, 0.0], [0.5, 0.0]]))


def test_sample_mean_weights_samples_equally() -> None:
    values = torch.tensor([[2.0, 4.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate_loss(values, mask, mode="sample_mean", denominator=2).item() == 3.0  # (3 + 3) / 2
    assert aggregate_loss(values, mask, mode="token_mean", denominator=3).item() == 3.0  # 9 / 3


def test_windows_of_micro_batches_sum_to_one() -> None:
    sizes, accumulation = [10, 30, 5, 55], 2
    for w in range(0, len(sizes), accumulation):
        window = sizes[w : w + accumulation]
        total = sum(
            aggregate_loss(torch.ones(1, n), torch.ones(1, n), mode="token_mean", denominator=sum(window))
            for n in window
        )
        assert total.item() == 1.0, window
        samples = sum(
            aggregate_loss(torch.ones(1, n), torch.ones(1, n), mode="sample_mean", denominator=len(window))
            for n in window
        )
        assert samples.item() == 1.0, window


def test_aggregate_loss_errors() -> None:
    with pytest.raises(ValueError, match="valid: sample_mean, token_mean"):
        aggregate_loss(torch.ones(1, 1), torch.ones(1, 1), mode="seq_sum", denominator=1)
    with pytest.raises(ValueError, match="denominator"):
        aggregate_loss(torch.ones(1, 1), torch.ones(1, 1), mode="token_mean", denominator=0)
    with pytest.raises(ValueError, match="shape mismatch"):
        aggregate_loss(torch.ones(1, 2), torch.ones(1, 1), mode="token_mean", denominator=1)


def test_masked_mean_per_sample() -> None:
    values = torch.tensor([[1.0, 3.0, float("nan")], [5.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert torch.equal(masked_mean_per_sample(values, mask), torch.tensor([2.0, 5.0, 0.0]))
    halves = masked_mean_per_sample(values.bfloat16(), mask)
    assert halves.dtype == torch.bfloat16 and halves.tolist() == [2.0, 5.0, 0.0]
    assert masked_mean_per_sample(mask.bool(), mask).tolist() == [1.0, 1.0, 0.0]  # bool values -> float32
    # the sample_mean loss is the sum of these per-sample means over the window's sample count
    assert aggregate_loss(values, mask, mode="sample_mean", denominator=4).item() == (2.0 + 5.0 + 0.0) / 4


# ------------------------------------------------------------------------------ KL and TIS


def test_kl_estimators_hand_computed() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])  # d = [0.5, -1.0, 0.0]
    d = [0.5, -1.0, 0.0]
    expected = {
        "k1": d,
        "k2": [x * x / 2 for x in d],
        "k3": [math.exp(-x) - 1 + x for x in d],
        "low_var_kl": [math.exp(-x) - 1 + x for x in d],
    }
    for name, values in expected.items():
        torch.testing.assert_close(get_kl_estimator(name)(logp, ref), torch.tensor([values]))
    assert torch.equal(get_kl_estimator("k3")(logp, logp), torch.zeros(1, 3))


def test_low_var_kl_clamps() -> None:
    # d = -30: r clamped to 20 -> exp(20) - 21 -> clamped to 10. d = +30: r = -20 -> exp(-20) + 19 -> 10.
    # d = -2.5: exp(2.5) - 3.5 = 8.68 (inside). d = 12: r = -12 -> exp(-12) + 11 -> 10.
    logp = torch.tensor([[-30.0, 30.0, -2.5, 12.0]])
    kl = get_kl_estimator("low_var_kl")(logp, torch.zeros_like(logp))
    torch.testing.assert_close(kl, torch.tensor([[10.0, 10.0, math.exp(2.5) - 3.5, 10.0]]))
    assert get_kl_estimator("k3")(logp, torch.zeros_like(logp))[0, 0].item() > 1e12


def test_tis_weights_and_metrics() -> None:
    old = torch.tensor([[math.log(3.0), math.log(0.5), 0.0, 9.0]])
    weights, raw = tis_weights(old, torch.zeros_like(old), clip_low=0.6, clip_high=2.0)
    torch.testing.assert_close(raw[0, :3], torch.tensor([3.0, 0.5, 1.0]))
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.6, 1.0, 2.0]]))
    metrics = tis_metrics(raw, clip_low=0.6, clip_high=2.0)
    assert list(metrics) == ["tis", "tis_abs", "tis_clipfrac"]
    assert metrics["tis"] is raw
    torch.testing.assert_close(metrics["tis_abs"][0, :3], torch.tensor([2.0, 0.5, 0.0]))
    assert metrics["tis_clipfrac"].tolist() == [[1.0, 1.0, 0.0, 1.0]]  # exp(9) > 2 is clipped too
    # reduced over the loss mask like the loss: per-sample mean over the 3 kept tokens
    mask = torch.tensor([[1, 1, 1, 0]])
    means = {k: aggregate_loss(v, mask, mode="sample_mean", denominator=1) for k, v in metrics.items()}
    torch.testing.assert_close(means["tis"], torch.tensor(1.5))
    torch.testing.assert_close(means["tis_clipfrac"], torch.tensor(2 / 3))
    torch.testing.assert_close(means["tis_abs"], torch.tensor((2.0 + 0.5 + 0.0) / 3))
    with pytest.raises(ValueError, match="tis-clip"):
        tis_weights(old, old, clip_low=3.0, clip_high=2.0)


# ------------------------------------------------------------------------------ logits


def test_entropy_uniform_and_one_hot() -> None:
    for vocab in (2, 7, 1000):
        entropy = entropy_from_logits(torch.zeros(2, 3, vocab, dtype=torch.bfloat16))
        assert entropy.dtype == torch.float32
        torch.testing.assert_close(entropy, torch.full((2, 3), math.log(vocab)))
    logits = torch.tensor([[[0.0, -math.inf, -math.inf]]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert entropy.item() == 0.0
    entropy.sum().backward()
    assert not torch.isnan(logits.grad).any()


def test_token_log_probs_uses_previous_row() -> None:
    # Row 0 puts all mass on token 2, row 1 on token 0, row 2 on token 1 (V = 3).
    big = 50.0
    logits = torch.tensor([[[0, 0, big], [big, 0, 0], [0, big, 0]]], dtype=torch.float32)
    ids = torch.tensor([[1, 2, 0]])  # token 1 scored by row 0 (p~1), token 2 by row 1 (p~0)
    logp = token_log_probs(logits, ids, temperature=1.0)
    assert logp.shape == (1, 3) and logp.dtype == torch.float32
    assert logp[0, 0].item() == 0.0
    torch.testing.assert_close(logp[0, 1:], torch.tensor([0.0, 0.0]), atol=1e-6, rtol=0)  # p ~ 1 each
    logp_wrong = token_log_probs(logits, torch.tensor([[1, 0, 1]]), temperature=1.0)
    assert (logp_wrong[0, 1:] < -40).all()


def test_token_log_probs_hand_values_and_temperature() -> None:
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]], dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1]])
    for temperature in (1.0, 0.5, 2.0):
        z = [1.0 / temperature, 2.0 / temperature, 3.0 / temperature]
        expected = z[1] - math.log(sum(math.exp(x) for x in z))
        logp = token_log_probs(logits, ids, temperature=temperature)
        torch.testing.assert_close(logp, torch.tensor([[0.0, expected]]))
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(logits, ids, temperature=0.0)


def test_token_log_probs_keep_mask_renormalizes() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    ids = torch.randint(0, 6, (2, 4))
    keep = torch.rand(2, 4, 6) > 0.5
    keep[1, 2] = False  # only the target survives at this position -> log-prob 0
    logp = token_log_probs(logits, ids, temperature=0.7, keep_mask_BLV=keep)
    p = torch.softmax(logits.detach() / 0.7, dim=-1)
    for b in range(2):
        for t in range(1, 4):
            kept = keep[b, t].clone()
            kept[ids[b, t]] = True
            expected = math.log(p[b, t - 1, ids[b, t]] / p[b, t - 1][kept].sum())
            assert abs(logp[b, t].item() - expected) < 1e-5
    assert logp[1, 2].item() == 0.0
    logp.sum().backward()
    assert not torch.isnan(logits.grad).any()
    all_kept = token_log_probs(
        logits, ids, temperature=0.7, keep_mask_BLV=torch.ones(2, 4, 6, dtype=torch.bool)
    )
    assert torch.equal(all_kept, token_log_probs(logits, ids, temperature=0.7))
    with pytest.raises(ValueError, match="keep_mask"):
        token_log_probs(logits, ids, temperature=1.0, keep_mask_BLV=keep.float())


def test_advantages_always_zero_is_probed_from_the_estimator() -> None:
    from grpolab.core.algorithms import advantages_always_zero

    assert advantages_always_zero("grpo", 1, std_normalize=True)
    assert advantages_always_zero("grpo", 1, std_normalize=False)
    assert not advantages_always_zero("grpo", 2, std_normalize=True)
    assert not advantages_always_zero("grpo", 8, std_normalize=False)
    with pytest.raises(ValueError, match="unknown advantage estimator 'rloo'"):
        advantages_always_zero("rloo", 4, std_normalize=True)
