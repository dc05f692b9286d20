"""Review of 88d7c24 / d89f98f / d26d56a: ECE counted in direct bins summed the empty bins'
zeros too, which regrouped the float sum (values 1 ulp off the occupied bins' sum, and off
aECE on the same bins); mean_field_guide()'s init_scale default, copied or unpickled (a
signature's defaults forwarded), was taken for an init_scale passed beside
init_scale_relative."""

from __future__ import annotations

import copy
import inspect
import math
import pickle

import pytest
import torch
from _toy import tiny_mlp

from pyrouq import mean_field_guide
from pyrouq.metrics import aece, ece

# one input in each of equal-width bins 5..9 of 10 (sorted by confidence): aECE's 5 equal-mass
# bins are the same bins, so the two sum the same five terms |correct - conf| / 5
_ONE_PER_BIN = [
    [0.5693186052700353, 0.4306813947299647],
    [0.6412998707257997, 0.35870012927420025],
    [0.7933730947844161, 0.2066269052155839],
    [0.8472772906866378, 0.15272270931336218],
    [0.9360102017675448, 0.06398979823245521],
]


def test_ece_sums_the_occupied_bins_as_aece_does_on_the_same_bins():
    probs = torch.tensor(_ONE_PER_BIN, dtype=torch.float64)
    targets = torch.tensor([0, 1, 1, 1, 0])  # every prediction is class 0: right, 3 wrong, right
    terms = [
        1 - probs[0, 0].item(),
        *(probs[i, 0].item() for i in (1, 2, 3)),
        1 - probs[4, 0].item(),
    ]
    reference = math.fsum(terms) / 5  # the exact sum, rounded once
    got = ece(probs, targets, num_bins=10)
    assert got == pytest.approx(reference, rel=0, abs=2e-16)
    assert got == aece(probs, targets, num_bins=5)  # bit for bit: the same terms, the same sum


def test_ece_equals_aece_whenever_their_bins_are_the_same():
    """Random data with m inputs in each of the upper equal-width bins, sorted: ECE over K
    bins and aECE over the occupied ones bin the inputs alike and must agree to the bit."""
    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        num_bins, occupied = [(7, 4), (15, 8), (10, 5), (9, 5)][trial % 4]
        m = int(torch.randint(1, 6, (1,), generator=g))
        conf = torch.cat(
            [
                (b + 0.05 + 0.9 * torch.rand(m, generator=g, dtype=torch.float64).sort().values)
                / num_bins
                for b in range(num_bins - occupied, num_bins)
            ]
        )
        if bool((conf < 0.5).any()):  # (below 1/C = 0.5: not a confidence of two classes)
            continue
        probs = torch.stack([conf, 1 - conf], -1)
        targets = torch.randint(0, 2, (conf.numel(),), generator=g)
        assert ece(probs, targets, num_bins=num_bins) == aece(probs, targets, num_bins=occupied), (
            trial,
            probs.tolist(),
            targets.tolist(),
        )


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_forwarded_init_scale_default_is_not_an_init_scale_passed(how):
    """The signature's default, copied (a config built from the defaults) or sent to another
    process, still means 'not passed': init_scale_relative alone sets the scales."""
    default = inspect.signature(mean_field_guide).parameters["init_scale"].default
    forwarded = copy.deepcopy(default) if how == "deepcopy" else pickle.loads(pickle.dumps(default))
    torch.manual_seed(0)
    model = tiny_mlp()
    guide = mean_field_guide(model, init_scale=forwarded, init_scale_relative=0.1)
    loc = guide.site_loc("fc1.weight").detach().double()
    expected = (0.1 * loc.abs()).clamp_min(1e-6)
    assert torch.allclose(guide.site_scale("fc1.weight").double(), expected, rtol=1e-5)
    assert guide.checkpoint_config() == {"init_scale": 0.01, "init_scale_relative": 0.1}
    assert type(guide.checkpoint_config()["init_scale"]) is float
    with pytest.raises(ValueError, match=r"got init_scale=0.01 and init_scale_relative=0.1: "):
        mean_field_guide(model, init_scale=0.01, init_scale_relative=0.1)  # passed: refused
