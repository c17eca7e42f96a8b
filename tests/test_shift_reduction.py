"""The sigma shift and the log-prob reduction, each computed in one place (algorithms/engine/sde.py), against formulas."""

import pytest
import torch

from flowzoo.algorithms.engine.losses import gaussian_mean_kl
from flowzoo.algorithms.engine.sde import gaussian_log_prob, inverse_time_shift, reduce_latent_dims, time_shift


@pytest.mark.parametrize("t, shift, s", [(0.5, 3.0, 0.75), (0.25, 3.0, 0.5), (0.5, 1.0, 0.5), (0.2, 5.0, 5 / 9)])
def test_time_shift_and_its_inverse_give_the_formula(t, shift, s):
    # s = shift t / (1 + (shift - 1) t); the inverse t = s / (shift - (shift - 1) s)
    assert time_shift(t, shift) == pytest.approx(s, abs=1e-12)
    assert inverse_time_shift(s, shift) == pytest.approx(t, abs=1e-12)


def test_inverse_time_shift_inverts_on_a_grid():
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    for shift in (0.5, 3.0, 7.0):
        torch.testing.assert_close(inverse_time_shift(time_shift(t, shift), shift), t, atol=1e-12, rtol=0)


def test_reduction_is_the_mean_or_sum_over_non_batch_dims():
    x = torch.arange(12.0).reshape(2, 2, 3)  # sample 0 holds 0..5, sample 1 holds 6..11
    torch.testing.assert_close(reduce_latent_dims(x, "mean"), torch.tensor([2.5, 8.5]))
    torch.testing.assert_close(reduce_latent_dims(x, "sum"), torch.tensor([15.0, 51.0]))


def test_log_prob_and_kl_reduce_the_same_way():
    x, mean = torch.zeros(2, 4), torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 2]])
    std = torch.tensor([1.0, 2.0])
    kl = [gaussian_mean_kl(x, mean, std, r) for r in ("mean", "sum")]
    # sum of (x - mean)^2 / (2 std^2): 4 / 2 = 2 and 4 / 8 = 0.5; the mean is a quarter of it (4 latent dims)
    torch.testing.assert_close(kl[1], torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(kl[0], kl[1] / 4)
    lp = [gaussian_log_prob(x, mean, std, r) for r in ("mean", "sum")]
    torch.testing.assert_close(lp[1], torch.distributions.Normal(mean, std[:, None]).log_prob(x).sum(1))
    torch.testing.assert_close(lp[0], lp[1] / 4)


@pytest.mark.parametrize("call", [lambda: reduce_latent_dims(torch.zeros(2, 3), "max"),
                                  lambda: gaussian_mean_kl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), "max")])
def test_unknown_reduction_names_the_choices(call):
    with pytest.raises(ValueError, match="unknown reduction 'max'; known: mean, sum"):
        call()
