"""Dynamic sampling filters for tests/rollout/test_dynamic_sampling.py, importable as `filter_funcs.X`."""

from __future__ import annotations

from grpolab.rollout.filters import DynamicFilterOutput


def keep_nothing(args, samples, **kwargs):  # noqa: ANN001, ANN201
    return DynamicFilterOutput(keep=False, reason="never")


def keep_even_rows(args, samples, **kwargs):  # noqa: ANN001, ANN201
    """Keep groups of even prompt rows; a plain bool, as Miles allows."""
    return samples[0].prompt_index % 2 == 0


def drop_without_reason(args, samples, **kwargs):  # noqa: ANN001, ANN201
    return DynamicFilterOutput(keep=samples[0].prompt_index % 2 == 0)


def raises(args, samples, **kwargs):  # noqa: ANN001, ANN201
    rewards = [s.get_reward_value(args) for s in samples]
    return rewards["mean"]  # a list indexed by a string: TypeError here


def wrong_shape(args, samples, **kwargs):  # noqa: ANN001, ANN201
    return {"keep": True}


async def is_async(args, samples, **kwargs):  # noqa: ANN001, ANN201
    return True


def one_argument(samples):  # noqa: ANN001, ANN201
    return True
