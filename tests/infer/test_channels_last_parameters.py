"""Review of the param-store interop (pyrouq/_param_store.py): Pyro keeps a contiguous copy
of a non-contiguous tensor (a channels-last convolution's weight), which pyrouq put there and
must not take back as a "loaded" value; a lazy learned noise scale made from a stored value
takes the network's dtype, not the file's."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

import pyrouq

X = torch.randn(16, 3, 6, 6, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0, 0, 0] > 0).long()


def _conv_net(channels_last):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
    return net.to(memory_format=torch.channels_last) if channels_last else net


def _fitted(select, channels_last):
    model = pyrouq.bayesian(_conv_net(channels_last), select=select, num_data=16)
    guide = pyrouq.MeanFieldGuide(model)
    start = {
        k: v.detach().clone() for k, v in [*model.named_parameters(), *guide.named_parameters()]
    }
    pyrouq.fit(model, guide, [(X, Y)], epochs=10, lr=0.05, progress=False, seed=0)
    pyro.clear_param_store()
    end = {k: v.detach().clone() for k, v in [*model.named_parameters(), *guide.named_parameters()]}
    return start, end


@pytest.mark.parametrize("select", ["last_layer", None])
def test_fit_trains_channels_last_parameters_as_contiguous_ones(select):
    """fit() of a channels-last network trained neither its point estimates nor the guide's
    locations of its convolution: each step's update was undone at the next forward, which
    took the store's contiguous copy of the old value for one loaded there."""
    start, plain = _fitted(select, channels_last=False)
    _, laid_out = _fitted(select, channels_last=True)
    for name, value in plain.items():
        assert (value - start[name]).abs().max() > 1e-2, name  # (it trains)
        torch.testing.assert_close(laid_out[name], value, rtol=1e-4, atol=1e-4, msg=name)


def test_pyro_svi_of_a_channels_last_model_keeps_its_values_and_takes_loaded_ones(tmp_path):
    """A forward does not move a channels-last point estimate back to the value the store
    copied at the last one; a value loaded into the store is still taken."""
    model = pyrouq.bayesian(_conv_net(True), select="last_layer", num_data=16)
    model(X, Y)
    pyro.get_param_store().save(tmp_path / "store.pt")
    weight = model.net[0].weight
    with torch.no_grad():
        weight.add_(1.0)  # (an optimizer's step)
    changed = weight.detach().clone()
    model(X, Y)
    torch.testing.assert_close(weight.detach(), changed, rtol=0, atol=0)
    pyro.get_param_store().load(tmp_path / "store.pt")
    model(X, Y)
    torch.testing.assert_close(weight.detach(), changed - 1.0)
    assert not weight.is_contiguous()  # (its layout kept)


def test_lazy_noise_scale_from_the_store_takes_the_networks_dtype(tmp_path):
    """A learned noise scale not yet sized, whose value is in Pyro's param store (float32,
    saved by a float32 run), is made float64 in a float64 model, as its outputs would make it,
    not float32 from the file."""

    def build():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        return pyrouq.bayesian(net, likelihood=pyrouq.Gaussian("learned"), num_data=8)

    x, y = torch.randn(8, 3), torch.randn(8)
    first = build()
    first(x, y)
    pyro.get_param_store().save(tmp_path / "store.pt")
    pyro.clear_param_store()
    model = build().double()
    model._pyro_name = first._pyro_name  # (a new process names its first model alike)
    pyro.get_param_store().load(tmp_path / "store.pt")
    model(x.double(), y.double())
    scale = model.likelihood.raw_scale
    assert scale.dtype == torch.float64
    torch.testing.assert_close(scale, first.likelihood.raw_scale.detach().double())


def test_pyro_svi_trains_the_guide_of_a_channels_last_convolution():
    """Pyro's SVI left a channels-last convolution's guide location where it started: the
    guide's location took the weight's layout, the store kept a contiguous copy of it, which
    SVI optimised while the guide read its own."""
    from pyro.infer import SVI, Trace_ELBO

    locs = []
    for channels_last in (False, True):
        pyro.clear_param_store()
        model = pyrouq.bayesian(_conv_net(channels_last), num_data=16)
        guide = pyrouq.MeanFieldGuide(model)
        assert guide.site_loc("0.weight").is_contiguous()
        start = guide.site_loc("0.weight").detach().clone()
        pyro.set_rng_seed(0)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
        for _ in range(3):
            svi.step(X, Y)
        locs.append(guide.site_loc("0.weight").detach())
        assert (locs[-1] - start).abs().max() > 1e-2
    torch.testing.assert_close(locs[1], locs[0], rtol=1e-4, atol=1e-4)


def test_fit_trains_a_channels_last_batchensemble_as_a_contiguous_one():
    """The same for a BatchEnsemble's shared weights (its forward registers them too)."""
    weights = []
    for channels_last in (False, True):
        model = pyrouq.batchensemble(_conv_net(channels_last), 2)
        start = model.net[0].weight.detach().clone()
        pyrouq.fit(model, None, [(X, Y)], epochs=10, lr=0.05, num_data=16, progress=False, seed=0)
        weights.append(model.net[0].weight.detach())
        assert (weights[-1] - start).abs().max() > 1e-2
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-4, atol=1e-4)
