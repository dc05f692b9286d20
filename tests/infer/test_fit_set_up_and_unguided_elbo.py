"""Review of 93e17de (fit()'s set-up pass seeded apart, buffers no longer put back; a
BatchEnsemble layer's refusal a LayerInputError named by run_members) and d243c5f (diagnostics
run the model under its priors to tell x from the guide; KLWeightedELBO(guide=None) for a Pyro
model of one's own). Each test fails on 93e17de."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.utils.data as tud
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroParam
from torch import nn

import pyrouq

# -- a BatchEnsemble layer's refusal outside a converted network ------------------------------


class _OwnEnsemble(PyroModule):
    """A Pyro model of one's own built from pyrouq's BatchEnsemble layers (no converter runs
    it): the second layer takes 5 features, the first gives 4."""

    def __init__(self):
        super().__init__()
        self.l1 = pyrouq.BatchEnsembleLinear(3, 4, 2)
        self.l2 = pyrouq.BatchEnsembleLinear(5, 2, 2)

    def forward(self, x, y=None):
        logits = self.l2(self.l1(x.repeat(2, 1)))
        with pyro.plate("data", logits.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits),
                        obs=None if y is None else y.repeat(2))  # fmt: skip
        return logits


def _trace(model, x, y):
    poutine.trace(model).get_trace(x, y)


def _predict(model, x, y):
    pyrouq.predict(model, x)


def _fit(model, x, y):
    pyrouq.fit(model, None, [(x, y)], epochs=1, num_data=len(x), progress=False)


@pytest.mark.parametrize("route", [_trace, _predict, _fit], ids=["trace", "predict", "fit"])
def test_a_layers_refusal_inside_a_pyro_model_is_not_a_type_error(route):
    """Pyro's trace re-raises a ValueError as ``type(err)(message + shapes)``:
    LayerInputError(layer, detail) cannot be built from one string, so the layer's refusal
    became "TypeError: LayerInputError.__init__() missing 1 required positional argument:
    'detail'" under poutine.trace, SVI, Predictive, predict() and fit() (the parent raised a
    ValueError naming the layer)."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    with warnings.catch_warnings(), pytest.raises(ValueError) as caught:
        warnings.simplefilter("ignore")
        route(_OwnEnsemble(), x, y)
    message = str(caught.value)
    assert "missing 1 required positional argument" not in message, message
    assert "BatchEnsembleLinear(5, 2, num_members=2)" in message, message
    assert "expects inputs of shape" in message, message


class _RunsALayer(tud.Dataset):
    def __init__(self):
        self.layer = pyrouq.BatchEnsembleLinear(5, 2, 2)

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.layer(torch.randn(2, 4))


def test_a_layers_refusal_in_a_dataloader_worker_stays_a_value_error():
    """A DataLoader re-raises a worker's error as ``exc_type(message)``; a type it cannot
    build so becomes a RuntimeError: ``except ValueError`` no longer catches the refusal."""
    loader = tud.DataLoader(_RunsALayer(), batch_size=2, num_workers=1,
                            multiprocessing_context="fork")  # fmt: skip
    with pytest.raises(ValueError, match="expects inputs of shape"):
        next(iter(loader))


# -- diagnostics: the prior run told x from the guide --------------------------------------


def _sized_by_x(x, y=None):
    """A regression whose weights take their size from x (as many Pyro examples write it)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[-1], 1]).to_event(2))
    mu = (x @ w).squeeze(-1)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)
    return mu


@pytest.mark.parametrize("export", [pyrouq.psis_diagnostic, pyrouq.to_inference_data])
def test_an_x_of_other_features_is_not_blamed_on_the_guide(export):
    """The guide was built on x of 3 features and x of 4 is given: the model runs under its
    priors on the new x (w sized 4 x 1), so _draws_fit calls the guide one of another model
    ("Pass a guide built for this model"), which it is not; x is not named. The parent said
    the model failed on x (shape (30, 4))."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(30, 3), torch.randn(30)
    guide = AutoNormal(_sized_by_x)
    guide(x, y)
    with warnings.catch_warnings(), pytest.raises(Exception) as caught:
        warnings.simplefilter("ignore")
        export(_sized_by_x, guide, torch.randn(30, 4), y, num_samples=25)
    message = str(caught.value)
    assert "(30, 4)" in message, message
    pyro.clear_param_store()


# -- fit()'s set-up pass and a guide's buffers ---------------------------------------------


class _Model(PyroModule):
    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        with pyro.plate("data", 40, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)


class _NormGuide(PyroModule):
    """A guide with a BatchNorm over its inputs (amortisation features, say)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.loc = PyroParam(torch.zeros(3, 2))

    def forward(self, x, y=None):
        features = self.bn(x)
        pyro.sample("w", dist.Normal(self.loc + 0 * features.mean(), 0.1).to_event(2))


def test_the_set_up_pass_does_not_update_a_guides_batchnorm():
    """The pass is documented as a forward in evaluation mode, but only the model is put in
    it: the guide runs twice in training mode (its autoguide-like first call, then the sites
    check), and with buffers_kept gone its BatchNorm keeps those updates: after one step,
    num_batches_tracked is 3 and the running mean weighs the first batch three times."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(20, 3) + 2.0, torch.randint(0, 2, (20,))
    guide = _NormGuide()
    pyrouq.fit(_Model(), guide, [(x, y)], epochs=1, num_data=40, progress=False, seed=0)
    assert int(guide.bn.num_batches_tracked) == 1
    torch.testing.assert_close(guide.bn.running_mean, 0.1 * x.mean(0))
    pyro.clear_param_store()


# -- KLWeightedELBO(guide=None) for a Pyro model of one's own ------------------------------


class _ObservesNothing(PyroModule):
    """A model that forgot to observe its targets."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x, y=None):
        return self.lin(x)


def test_guide_none_refuses_a_model_that_observes_nothing():
    """fit(model, None, ...) refuses it ("observes nothing ... Nothing was trained");
    KLWeightedELBO(guide=None), said to take such models as fit() does, returns a loss of 0.0
    (SVI steps that change nothing; the parent refused guide=None here)."""
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    with pytest.raises(ValueError):
        pyrouq.KLWeightedELBO().loss(_ObservesNothing(), None, x, y)


class _NoLatent(PyroModule):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x, y=None):
        logits = self.lin(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_guide_none_without_y_asks_for_the_labels_not_a_guide_of_obs():
    """Called without y, the 'obs' site is unobserved: refuse_unguided calls it a latent site
    and asks for an AutoNormal (which would learn 'obs' as a latent); the ELBO has a refusal
    for this very case (needs_labels: "Pass them, e.g. elbo.loss(model, guide, x, y)")."""
    x = torch.randn(8, 3)
    with warnings.catch_warnings(), pytest.raises(ValueError) as caught:
        warnings.simplefilter("ignore")
        pyrouq.KLWeightedELBO().loss(_NoLatent(), None, x)
    message = str(caught.value)
    assert "latent sites ('obs')" not in message, message
    assert "label" in message, message
