"""Networks written the way a newcomer writes them, through bayesian() / batchensemble() /
rank1(); and a network site named as one of the model's own sites.

The references are computed without pyrouq's engine: the original network run by
``torch.func.functional_call`` with the drawn weights put in by hand, one draw at a time.
"""

from __future__ import annotations

import copy
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parametrizations

from pyrouq import (
    Gaussian,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    rank1,
    save,
)

# -- a network site named as one of the model's own --------------------------------------------


class _Named(nn.Module):
    """A linear layer scaled by a top-level parameter named ``name``."""

    def __init__(self, name: str, out: int = 1):
        super().__init__()
        self.fc = nn.Linear(3, out)
        self.own = name
        setattr(self, name, nn.Parameter(torch.ones(2)))

    def forward(self, x):
        return self.fc(x) * getattr(self, self.own)[0]


def test_a_parameter_named_like_the_latent_noise_is_refused_naming_both_owners():
    noise = Gaussian(dist.HalfNormal(1.0))
    with pytest.raises(ValueError) as caught:
        bayesian(_Named("sigma"), select=["sigma", "fc"], likelihood=noise)
    text = str(caught.value)
    for fragment in (
        "the parameter 'sigma' of _Named would be a latent site named 'sigma'",
        "a latent site of the likelihood Gaussian (its noise scale, from its prior)",
        "Rename the network's parameter (self.sigma -> e.g. self.sigma_net)",
        "leave it out of select=",
    ):
        assert fragment in text
    # the rank-1 composition meets the same clash
    with pytest.raises(ValueError, match="a latent site of the likelihood Gaussian"):
        bayesian(batchensemble(_Named("sigma"), 2), select=["sigma", "fc"], likelihood=noise)
    # left out of select=, the network's sigma is a point estimate beside the noise site
    model = bayesian(_Named("sigma"), select=["fc"], likelihood=Gaussian(dist.HalfNormal(1.0)))
    assert {s: tuple(v) for s, v in model.latent_sites().items()} == {
        "fc.weight": (1, 3),
        "fc.bias": (1,),
        "sigma": (),
    }
    assert tuple(model.net.sigma.shape) == (2,)
    # a noise trained as a point estimate has no site: the network's sigma may be latent
    model = bayesian(_Named("sigma"), select=["sigma", "fc"], likelihood="gaussian")
    assert tuple(model.latent_sites()["sigma"]) == (2,)


@pytest.mark.parametrize(
    ("name", "likelihood", "owner"),
    [
        ("obs", "gaussian", "the site where the model observes the targets"),
        ("outputs", "gaussian", "the site where the model records its outputs"),
        ("logits", "categorical", "the site where the model records its outputs"),
        ("data", "categorical", "the model's plate of data points"),
    ],
)
def test_a_parameter_named_like_the_models_own_sites_is_refused(name, likelihood, owner):
    with pytest.raises(ValueError) as caught:
        bayesian(_Named(name, out=2), select=[name, "fc"], likelihood=likelihood)
    assert f"latent site named {name!r}, which is already {owner}" in str(caught.value)


def test_members_is_refused_only_where_the_model_has_a_members_plate():
    with pytest.raises(ValueError, match="which is already the rank-1 model's plate of members"):
        bayesian(batchensemble(_Named("members", out=2), 2), select=["members", "fc"])
    # a single network has no such plate: Pyro traces it with the site as it is
    model = bayesian(_Named("members", out=2), select=["members", "fc"], num_data=4)
    trace = pyro.poutine.trace(model).get_trace(torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
    assert tuple(trace.nodes["members"]["value"].shape) == (2,)
    assert trace.nodes["obs"]["is_observed"]


# -- layers held where torch does not register them --------------------------------------------


class _ListHeld(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 4)]  # a newcomer's list: torch does not register it
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


@pytest.mark.parametrize("convert", ["bayesian", "batchensemble", "rank1"])
def test_layers_held_in_a_plain_list_are_warned_of(convert):
    make = {
        "bayesian": lambda net: bayesian(net),
        "batchensemble": lambda net: batchensemble(net, 2),
        "rank1": lambda net: rank1(net, 2),
    }[convert]
    with pytest.warns(UserWarning) as caught:
        make(_ListHeld())
    texts = [str(w.message) for w in caught if "plain Python containers" in str(w.message)]
    assert len(texts) == 1
    assert "_ListHeld holds layers or parameters in plain Python containers ('layers'" in texts[0]
    assert "Hold them in nn.ModuleList / nn.ModuleDict" in texts[0]
    assert "save() does not keep them" in texts[0]


def test_a_list_naming_registered_layers_is_not_warned_of():
    class Ordered(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)
            self.order = [self.a, self.b]  # the same layers, registered: nothing is lost

        def forward(self, x):
            for layer in self.order:
                x = layer(x)
            return x

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = bayesian(Ordered())
    assert list(model.latent_sites()) == ["a.weight", "a.bias", "b.weight", "b.bias"]


# -- newcomers' networks, checked against functional_call --------------------------------------


class _ByHand(nn.Module):
    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(0.3 * torch.randn(4, 3))
        self.b = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return x @ self.W + self.b


class _Lists(nn.Module):
    def __init__(self):
        super().__init__()
        self.ws = nn.ParameterList([nn.Parameter(0.3 * torch.randn(4, 4)) for _ in range(2)])
        self.bs = nn.ParameterDict({"out": nn.Parameter(torch.zeros(3))})
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        for w in self.ws:
            x = torch.tanh(x @ w)
        return F.linear(x, self.head.weight) + self.head.bias + self.bs["out"]


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.block(torch.relu(self.block(x)))))


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(6, 2, batch_first=True)
        self.rnn = nn.LSTM(6, 5, batch_first=True)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        h, _ = self.att(x, x, x)
        out, _ = self.rnn(h)
        return self.head(out[:, -1])


def _normed():
    return nn.Sequential(
        parametrizations.weight_norm(nn.Linear(4, 4)),
        nn.ReLU(),
        parametrizations.spectral_norm(nn.Linear(4, 3)),
    )


def _channels_last():
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    ).to(memory_format=torch.channels_last)


def _everything(name, param):
    return True


NETWORKS = {  # make, inputs, select
    "by_hand": (_ByHand, lambda: torch.randn(6, 4), ["W", "b"]),
    "parameter_lists": (_Lists, lambda: torch.randn(6, 4), _everything),
    "tied": (_Tied, lambda: torch.randint(0, 10, (6, 5)), None),
    "layer_called_twice": (_Twice, lambda: torch.randn(6, 4), None),
    "attention_lstm": (_Attention, lambda: torch.randn(6, 5, 6), _everything),
    "parametrized": (_normed, lambda: torch.randn(6, 4), _everything),
    "float64": (
        lambda: nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double(),
        lambda: torch.randn(6, 4, dtype=torch.float64),
        None,
    ),
    "channels_last": (
        _channels_last,
        lambda: torch.randn(6, 3, 5, 5).to(memory_format=torch.channels_last),
        None,
    ),
}


@pytest.mark.parametrize("case", list(NETWORKS))
def test_a_newcomers_network_draws_trains_predicts_and_round_trips(case, tmp_path):
    make, inputs, select = NETWORKS[case]
    torch.manual_seed(0)
    net = make().eval()
    x, y = inputs(), torch.arange(6) % 3
    model = bayesian(net, select=select).eval()
    # three draws at once against the original run one draw at a time by hand
    sites = model.network_sites()
    start = model.template()
    draws = {s: start[s] + 0.1 * torch.randn(3, *sites[s], dtype=start[s].dtype) for s in sites}
    with torch.no_grad():
        got = model.outputs(x, draws)
        expected = torch.stack(
            [functional_call(net, {s: d[i] for s, d in draws.items()}, (x,)) for i in range(3)]
        )
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    # a few steps of fit(), predict(), and a round trip through a skeleton initialised anew
    guide = mean_field_guide(model)
    batches = [(x[:3], y[:3]), (x[3:], y[3:])]
    fit(model, guide, batches, epochs=1, num_data=6, progress=False, seed=0)
    before = predict(model, x, guide, num_samples=2, progress=False, seed=1).probs
    assert before.shape == (2, 6, 3) or (case == "tied" and before.shape == (2, 6, 10))
    save(tmp_path / "m.pt", model, guide)
    torch.manual_seed(1)
    loaded = load(tmp_path / "m.pt", module=make())
    after = predict(loaded.model, x, loaded.guide, num_samples=2, progress=False, seed=1).probs
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    # the guide's means give the original network run with those means (and the loaded
    # point estimates and buffers: spectral_norm's power iteration moved on in training)
    means = {s: v.detach() for s, v in loaded.guide.means().items()}
    state = dict(loaded.model.net.named_parameters()) | dict(loaded.model.net.named_buffers())
    with torch.no_grad():
        expected = functional_call(copy.deepcopy(net), state | means, (x,))
        torch.testing.assert_close(loaded.model.eval().outputs(x, means), expected)
