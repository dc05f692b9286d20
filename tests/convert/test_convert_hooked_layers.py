"""Fifth audit of bayesian(): layers whose weight a hook recomputes (torch.nn.utils.prune, the
legacy spectral_norm) copy after training, select= given a layer class, outputs() with a site
left out."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import pyrouq
from pyrouq import bayesian, mean_field_guide


def _fit_one_step(model: pyrouq.BayesianNetwork) -> None:
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 2, (8,), generator=torch.Generator().manual_seed(2))
    loader = pyrouq.ArrayLoader(x, y, batch_size=8, seed=0)
    pyrouq.fit(model, mean_field_guide(model), loader, epochs=1, progress=False)


def _legacy_spectral_norm() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.utils.spectral_norm(nn.Linear(4, 2)))


def _pruned_after_a_pass() -> nn.Sequential:
    """Pruned, then run once without gradients: its weight is a plain tensor, so it copies."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    prune.l1_unstructured(net[0], "weight", amount=0.5)
    with torch.no_grad():
        net(torch.randn(2, 3))
    return net


@pytest.mark.parametrize("build", [_legacy_spectral_norm, _pruned_after_a_pass])
def test_a_layer_whose_hook_recomputes_a_latent_weight_copies_after_training(build):
    """After a forward with gradients the hook leaves a computed (non-leaf) weight in the
    layer, which copy.deepcopy and pickle refused: plain_network() and copies failed after
    fit() with torch's 'graph leaves' error."""
    model = bayesian(build())
    assert any(site.endswith("weight_orig") for site in model.latent_sites())
    _fit_one_step(model)
    copied = copy.deepcopy(model)
    plain = model.plain_network().eval()
    pickle.loads(pickle.dumps(model))
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))
    model.eval()
    expected = model.outputs(x, model.template())
    torch.testing.assert_close(plain(x), expected, rtol=0, atol=0)
    torch.testing.assert_close(copied.eval().outputs(x, copied.template()), expected)
    if build is _pruned_after_a_pass:  # the mask still applies: half of the weight is zero
        assert int((plain[0].weight == 0).sum()) == 6


def test_a_frozen_hooked_layer_still_converts_and_the_model_copies_after_training():
    for net, hooked in ((_legacy_spectral_norm(), 2), (_pruned_after_a_pass(), 0)):
        net[hooked].requires_grad_(False)
        model = bayesian(net)
        assert not any("weight_orig" in site for site in model.latent_sites())
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))
        net.eval()
        model.eval()
        torch.testing.assert_close(model.outputs(x, model.template()), net(x))
        _fit_one_step(model)
        plain = model.plain_network().eval()  # deep copies: no computed tensor left in it
        copy.deepcopy(model)
        torch.testing.assert_close(plain(x), model.outputs(x, model.template()))


def test_select_given_a_layer_class_says_to_pass_the_names_of_its_layers():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4)), nn.Linear(4, 2))
    expected = (
        "select= takes None, 'last_layer', module names or a callable (name, param) -> bool, "
        "not a class: got Linear. For the layers of a type, pass their names (here '0', "
        "'2.0', '3')"
    )
    for select in (nn.Linear, [nn.Linear], ("0", nn.Linear)):  # a class is callable
        with pytest.raises(TypeError, match=re.escape(expected)):
            bayesian(net, select=select)
    with pytest.raises(TypeError, match=r"got Conv2d\. .*\(Sequential has none\)"):
        bayesian(net, select=nn.Conv2d)
    with pytest.raises(TypeError, match=r"not a class: got bool\.$"):
        bayesian(net, select=bool)
    with pytest.raises(TypeError, match=r"got Linear\. The network itself is a Linear: "
                       r"select=None \(all of it\)\.$"):  # fmt: skip
        bayesian(nn.Linear(3, 2), select=nn.Linear)
    advice = r"\(here '2'\): select=\[name for name, m in net\.named_modules\(\) if name and "
    with pytest.raises(TypeError, match=advice + r"isinstance\(m, nn\.Sequential\)\]"):
        bayesian(net, select=nn.Sequential)  # the advice, taken literally, works (below)
    with pytest.raises(TypeError, match=r"got Linear, Sequential\. .* isinstance\(m, \(nn\.Linear, "
                       r"nn\.Sequential\)\)\]"):  # fmt: skip
        bayesian(net, select=[nn.Linear, nn.Sequential])  # each type named in the advice
    names = [n for n, m in net.named_modules() if n and isinstance(m, nn.Sequential)]
    assert list(bayesian(net, select=names).latent_sites()) == ["2.0.weight", "2.0.bias"]
    # names and callables as before
    names = [n for n, m in net.named_modules() if isinstance(m, nn.Linear)]
    assert list(bayesian(net, select=names).latent_sites()) == [
        "0.weight", "0.bias", "2.0.weight", "2.0.bias", "3.weight", "3.bias"
    ]  # fmt: skip


def test_outputs_with_a_site_left_out_names_it_and_with_all_matches_the_plain_network():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net)
    x = torch.randn(5, 3)
    weights = {site: torch.randn_like(value) for site, value in model.template().items()}
    plain = copy.deepcopy(net)
    with torch.no_grad():
        for name, param in plain.named_parameters():
            param.copy_(weights[name])
    torch.testing.assert_close(model.outputs(x, weights), plain(x), rtol=0, atol=1e-6)
    partial = {site: value for site, value in weights.items() if not site.endswith("2.bias")}
    (left_out,) = set(weights) - set(partial)
    with pytest.raises(ValueError, match=re.escape(f"got no weights for '{left_out}'")):
        model.outputs(x, partial)  # read the initial bias there, without a word
