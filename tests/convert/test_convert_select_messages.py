"""Audit 7 of Pyro models of one's own (predict()'s checks of their draws and logits) and of
bayesian()'s ``select=`` (its messages for layers, tensors, callables, parametrized weights,
buffers and a bare convolution)."""

from __future__ import annotations

import copy
import functools

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import sampled_linear
from pyro import poutine
from pyro.infer import config_enumerate
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from torch import nn
from torch.nn.utils import parametrizations

import pyrouq


def data(n=12, d=4, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


class Switch(PyroModule):
    """Two weight matrices and a global discrete switch ``k`` between them, enumerated as in
    Pyro's recipe (guide: ``AutoNormal(poutine.block(model, hide=["k"]))``)."""

    @config_enumerate
    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 3, 4), 1.0).to_event(3))
        k = pyro.sample("k", dist.Categorical(torch.ones(2) / 2))
        logits = torch.where(k[..., None].bool(), x @ w[1].mT, x @ w[0].mT)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_predict_refuses_draws_leaving_a_discrete_site_to_enumeration_with_pyros_way():
    """predict() said "the guide does not fit Switch: the model's latent site 'k' () is not in
    it. Pass the guide fitted with this model", of the very guide fitted with it (fit() and the
    diagnostics named the enumeration and Pyro's way)."""
    x, y = data()
    model = Switch()
    guide = AutoNormal(poutine.block(model, hide=["k"]))
    guide(x, y)
    with pytest.raises(ValueError) as err:
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert str(err.value) == (
        "predict(): Switch has discrete latent site(s) ['k'], which the guide leaves out for "
        "enumeration; pyrouq does not enumerate (nor take score-function gradients), so they "
        "would be drawn from the prior. Use Pyro's own tools for such a model: pyro.infer.SVI "
        "with pyro.infer.TraceEnum_ELBO, and pyro.infer.Predictive."
    )
    draws = {"w": torch.randn(2, 2, 3, 4)}  # as Pyro's NUTS gives them: no draws of k
    with pytest.raises(ValueError, match=r"\['k'\], which posterior_samples leave out for enum"):
        pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    # with its draws, the model predicts under them: k = 1 picks w[1]
    draws["k"] = torch.ones(2, dtype=torch.long)
    preds = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    torch.testing.assert_close(preds.probs, (x @ draws["w"][:, 1].mT).softmax(-1))


class Softmax(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = sampled_linear(4, 3)

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_nan_draws_of_a_model_of_ones_own_are_refused_naming_the_site():
    """NaN draws (a diverged fit) failed inside the model, in torch.multinomial's "probability
    tensor contains either inf, nan or element < 0" and a table of trace shapes."""
    x, _ = data()
    weights = torch.randn(2, 3, 4)
    weights[1, 0, 2] = float("nan")
    weights[0, 1, 1] = float("nan")
    with pytest.raises(ValueError) as err:
        pyrouq.predict(Softmax(), x, posterior_samples={"fc.weight": weights}, progress=False)
    assert str(err.value) == (
        "predict(): posterior_samples give site 'fc.weight' 2 NaN values (of 24 drawn), which "
        "the model would run on; did the fit diverge? Refit (e.g. with a smaller learning "
        "rate), or pass draws without NaN."
    )
    weights[1, 0, 2] = weights[0, 1, 1] = 0.5  # finite draws: the model's softmax
    model = Softmax()
    preds = pyrouq.predict(model, x, posterior_samples={"fc.weight": weights}, progress=False)
    torch.testing.assert_close(preds.probs, (x @ weights.mT + model.fc.bias).softmax(-1))


class Binary(PyroModule):
    """A Bernoulli classifier whose ``Linear(4, 1)`` gives one logit a row, ``(B, 1)``;
    ``two``: returns the two-column logits ``[0, l]`` the refusal advises."""

    def __init__(self, two=False):
        super().__init__()
        self.fc = sampled_linear(4, 1)
        self.two = two

    def forward(self, x, y=None):
        logit = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            obs = None if y is None else y.float()
            pyro.sample("obs", dist.Bernoulli(logits=logit.squeeze(-1)), obs=obs)
        return torch.cat([torch.zeros_like(logit), logit], -1) if self.two else logit


def test_one_logit_a_row_of_a_bernoulli_model_of_ones_own_gets_the_binary_way_out():
    """(B, 1) logits were refused with "a regression model takes a Gaussian likelihood, e.g.
    bayesian(net, likelihood='gaussian')" alone; (B,) ones got the binary way out."""
    x, _ = data()
    draws = {"fc.weight": torch.randn(3, 1, 4)}
    with pytest.raises(ValueError) as err:
        pyrouq.predict(Binary(), x, posterior_samples=draws, progress=False)
    message = str(err.value)
    assert message.startswith(
        "predict(): Binary returned logits of shape (12, 1): one class, every probability "
        "would be 1; predict() needs class logits (B, C), C >= 2. A binary classifier "
        "observing Bernoulli(logits=l): return or record torch.cat([torch.zeros_like(l), l], "
        "-1) (its classes 0 and 1)."
    ), message
    model = Binary(two=True)  # the advice taken: p(class 1) is the Bernoulli's sigmoid
    preds = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    logit = x @ draws["fc.weight"].mT + model.fc.bias
    torch.testing.assert_close(preds.probs[..., 1:], torch.sigmoid(logit))


def _net():
    return nn.Sequential(nn.Linear(3, 30), nn.ReLU(), nn.Linear(30, 2))


def test_select_given_a_layer_or_a_tensor_names_it():
    """select=net[2] (a layer is callable) ran Linear.forward(name, param): "forward() takes 2
    positional arguments but 3 were given"; select=[net[2].weight] printed the tensor. They
    are named by identity in the network given (by value, a layer alike could be named)."""
    net = _net()
    lead = (
        "select= takes None, 'last_layer', module names or a callable (name, param) -> bool, "
        "not the layers or tensors themselves: got "
    )
    for select in (net[2], [net[2]], ("0", net[2])):
        with pytest.raises(TypeError) as err:
            pyrouq.bayesian(net, select=select)
        assert str(err.value) == lead + "the Linear layer. Here it is named '2': select=['2']."
    with pytest.raises(TypeError) as err:
        pyrouq.bayesian(net, select=[net[2].weight])
    assert str(err.value) == lead + (
        "a tensor (2, 30). Here it is named '2.weight': select=['2.weight']."
    )
    with pytest.raises(TypeError, match=r"Sequential layer\. It is the network itself: select="):
        pyrouq.bayesian(net, select=net)
    alike = copy.deepcopy(net[2])  # the same values, another layer: not named
    with pytest.raises(TypeError) as err:
        pyrouq.bayesian(net, select=alike)
    assert str(err.value).endswith(
        "Pass its name, as net.named_modules() gives it (e.g. select=['fc'])."
    )
    assert list(pyrouq.bayesian(net, select=["2"]).latent_sites()) == ["2.weight", "2.bias"]


def test_a_recurrent_or_transformer_layer_given_to_select_is_refused_as_a_layer():
    """An LSTM's forward(input, hx=None) can be called as (name, param): it was taken for a
    selector, and failed inside LSTM.forward ("'str' object has no attribute 'dim'")."""
    net = nn.Sequential(nn.LSTM(3, 4), nn.TransformerEncoderLayer(4, 2, 8))
    for layer, name in ((net[0], "LSTM"), (net[1], "TransformerEncoderLayer")):
        with pytest.raises(TypeError, match=rf"got the {name} layer\. Here it is named"):
            pyrouq.bayesian(net, select=layer)


def test_a_decorated_one_argument_select_callable_says_how_it_is_called():
    """A wrapper of (*args, **kwargs) was read as taking (name, param)."""

    def one(name):
        return name.startswith("2")

    @functools.wraps(one)
    def wrapper(*args, **kwargs):
        return one(*args, **kwargs)

    with pytest.raises(TypeError, match=r"one\(name\) cannot take those two arguments"):
        pyrouq.bayesian(_net(), select=wrapper)


def test_a_module_whose_forward_takes_name_and_param_still_selects():
    class Pick(nn.Module):
        def forward(self, name, param):
            return name.startswith("2")

    class Optional(nn.Module):  # (name, param=None): a selector, not one of the network's
        def forward(self, name, param=None):
            return name.startswith("2")

    for pick in (Pick(), Optional()):
        assert list(pyrouq.bayesian(_net(), select=pick).latent_sites()) == ["2.weight", "2.bias"]


def test_a_layer_without_parameters_given_to_select_is_told_it_has_none():
    """A ReLU was told "Here it is named '1': select=['1']", which matches no parameter."""
    net = _net()
    with pytest.raises(TypeError) as err:
        pyrouq.bayesian(net, select=net[1])
    assert str(err.value).endswith("got the ReLU layer. It is '1', which has no parameters to "
                                   "make Bayesian.")  # fmt: skip


def test_a_decorated_select_callable_is_read_by_its_own_signature():
    """inspect.signature followed __wrapped__ to pick(prefix, name, param) and refused it."""

    def pick(prefix, name, param):
        return name.startswith(prefix)

    @functools.wraps(pick)
    def wrapper(name, param):
        return pick("2", name, param)

    assert list(pyrouq.bayesian(_net(), select=wrapper).latent_sites()) == ["2.weight", "2.bias"]


def test_a_select_callable_that_cannot_take_name_and_param_says_how_it_is_called():
    net = _net()
    with pytest.raises(TypeError) as err:
        pyrouq.bayesian(net, select=lambda name: name.startswith("2"))
    assert str(err.value) == (
        "The select callable is called as select(name, param) for each parameter, and "
        "<lambda>(name) cannot take those two arguments. Pass e.g. lambda name, param: "
        "name.startswith('fc')."
    )
    takes = lambda name, param, prefix="2": name.startswith(prefix)  # noqa: E731
    assert list(pyrouq.bayesian(net, select=takes).latent_sites()) == ["2.weight", "2.bias"]
    with pytest.raises(ZeroDivisionError):  # the callable's own error comes through
        pyrouq.bayesian(net, select=lambda name, param: 1 / 0)


def test_last_layer_of_a_bare_convolution_advises_select_none_which_works():
    """It advised select=[''], which matches no parameter."""
    conv = nn.Conv2d(1, 2, 3)
    with pytest.raises(ValueError) as err:
        pyrouq.bayesian(conv, select="last_layer")
    assert str(err.value) == (
        "select='last_layer' needs an nn.Linear, and Conv2d has none. Pass select= the names "
        "of the layers or parameters to make Bayesian. The network itself is a Conv2d: "
        "select=None (all of it)."
    )
    assert list(pyrouq.bayesian(conv, select=None).latent_sites()) == ["weight", "bias"]
    with pytest.raises(ValueError, match=r"as select=\['1'\], if it makes the outputs\)\.$"):
        pyrouq.bayesian(nn.Sequential(nn.Flatten(), nn.Conv1d(1, 2, 3)), select="last_layer")


def test_a_select_entry_naming_a_parametrized_weight_or_a_buffer_says_which_it_is():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    parametrizations.weight_norm(net[2])
    with pytest.raises(ValueError) as err:
        pyrouq.bayesian(net, select=["2.weight"])
    own = "'2.parametrizations.weight.original0', '2.parametrizations.weight.original1'"
    assert str(err.value).startswith("select entry '2.weight' matches no parameter of Sequen")
    assert str(err.value).endswith(
        "'2.weight' is computed by a parametrization (e.g. weight_norm), not stored as a "
        f"parameter: name the parametrization's own tensors ({own}), or remove it before "
        "converting (torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight'))."
    )
    with pytest.raises(ValueError, match=r"'1\.running_mean' is a buffer, not a parameter: "):
        pyrouq.bayesian(net, select=["1.running_mean"])
    names = ["2.parametrizations.weight.original0", "2.parametrizations.weight.original1"]
    assert list(pyrouq.bayesian(net, select=names).latent_sites()) == names
    with pytest.raises(ValueError, match=r"these\.$"):  # other keys: as before
        pyrouq.bayesian(net, select=["3"])


def test_prefixes_overlapping_and_alike_select_each_parameter_once_in_order():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer1, self.layer10 = nn.Linear(2, 3), nn.Linear(3, 3)
            self.head = nn.Linear(3, 2)

        def forward(self, x):
            return self.head(self.layer10(self.layer1(x)))

    net = Net()
    chosen = pyrouq.bayesian(net, select=["layer1", "layer1.weight", "head.bias"])
    assert list(chosen.latent_sites()) == ["layer1.weight", "layer1.bias", "head.bias"]
    priors = pyrouq.bayesian(net, prior={"layer1": 0.1, "layer10": 0.2, "layer10.bias": 0.3})
    scales = {
        s: float(p.scale) for s, p in zip(priors.latent_sites(), priors.site_priors, strict=True)
    }
    assert scales == {
        "layer1.weight": pytest.approx(0.1), "layer1.bias": pytest.approx(0.1),
        "layer10.weight": pytest.approx(0.2), "layer10.bias": pytest.approx(0.3),
        "head.weight": 1.0, "head.bias": 1.0,
    }  # fmt: skip


class WideScale(PyroModule):
    """A model whose heavy-tailed prior draws overflow to inf, which its logits absorb."""

    def forward(self, x, y=None):
        tau = pyro.sample("tau", dist.LogNormal(0.0, 80.0))
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 4), 1.0).to_event(2))
        logits = x @ w.mT / (1 + tau)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_infinite_draws_that_the_model_handles_are_not_refused():
    """The NaN check counted inf too: prior draws of tau = inf (its logits 0) were refused;
    posterior draws of inf warn, naming the site (a model that fails on them fails in torch)."""
    x, _ = data()
    torch.manual_seed(0)
    preds = pyrouq.predict(WideScale(), x, num_samples=64, progress=False)
    assert bool(torch.isfinite(preds.probs).all())
    tau = torch.tensor([float("inf"), 1.0])
    w = torch.randn(2, 3, 4)
    with pytest.warns(UserWarning, match=r"posterior_samples give site 'tau' 1 infinite values"):
        preds = pyrouq.predict(
            WideScale(), x, posterior_samples={"tau": tau, "w": w}, progress=False
        )
    torch.testing.assert_close(preds.probs[0], torch.full((x.shape[0], 3), 1 / 3))
