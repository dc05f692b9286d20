"""Review of 48b7a2e (LayerInputError built from one message; diagnostics naming x and the
guide; fit()'s look putting a guide module in eval mode; KLWeightedELBO(guide=None) refusing
a model observing nothing and a plain network). Each test fails on 48b7a2e."""

from __future__ import annotations

import pickle
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from torch import nn

import pyrouq

# -- KLWeightedELBO(guide=None): a Pyro model written as a plain nn.Module ----------------------


class _KeywordLabels(nn.Module):
    """A Pyro model written as an nn.Module (not a PyroModule) whose labels are keyword-only."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, *, y=None):
        pyro.module("keyword_labels", self)
        with pyro.plate("data", len(x)):
            return pyro.sample("obs", dist.Categorical(logits=self.fc(x)), obs=y)


class _LabelsInKwargs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, **kwargs):
        pyro.module("labels_in_kwargs", self)
        with pyro.plate("data", len(x)):
            return pyro.sample("obs", dist.Categorical(logits=self.fc(x)), obs=kwargs.get("y"))


class _LabelsHeld(nn.Module):
    """Observes labels it holds (a closure), forward(x) only."""

    def __init__(self, y):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.y = y

    def forward(self, x):
        pyro.module("labels_held", self)
        with pyro.plate("data", len(x)):
            return pyro.sample("obs", dist.Categorical(logits=self.fc(x)), obs=self.y)


@pytest.mark.parametrize("which", ["keyword-only y", "**kwargs", "closure"])
def test_unguided_elbo_does_not_refuse_a_pyro_model_written_as_a_module(which):
    """_refuse_plain_network decides by signature alone (positional parameters): a Pyro model
    written as an nn.Module that takes y keyword-only, in **kwargs, or observes labels it
    holds, samples and observes like any Pyro model (its parent trained it), but is now
    refused as "a plain network ... no likelihood observes them, so it has no ELBO"."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    model, kwargs = {
        "keyword-only y": (_KeywordLabels(), {"y": y}),
        "**kwargs": (_LabelsInKwargs(), {"y": y}),
        "closure": (_LabelsHeld(y), {}),
    }[which]
    svi = SVI(model, None, pyro.optim.Adam({"lr": 1e-2}), pyrouq.KLWeightedELBO())
    loss = svi.step(x, **kwargs)
    assert loss > 0 and torch.isfinite(torch.tensor(loss))


# -- diagnostics: a model sizing its weights from x, as x @ w with w a vector ---------------------


def _linear_regression(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)


def test_diagnostics_name_x_for_a_matrix_vector_model_on_x_of_other_width():
    """The new message (x's shape and the guide) is reached only where torch's error reads as
    an input mismatch: Bayesian linear regression's ``x @ w`` (torch.mv) says "size mismatch,
    got input (8), mat (8x5), vec (3)", which _MISMATCH does not know, so psis_diagnostic
    still ends in torch's bare RuntimeError with Pyro's shape table."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8)
    guide = AutoNormal(_linear_regression)
    guide(x, y)
    with warnings.catch_warnings(), pytest.raises(ValueError, match=r"\(8, 5\)") as caught:
        warnings.simplefilter("ignore")
        pyrouq.diagnostics.psis_diagnostic(
            _linear_regression, guide, torch.randn(8, 5), y, num_samples=30
        )
    assert "guide" in str(caught.value)


# -- a layer's refusal, pickled ------------------------------------------------------------------


class _OwnEnsemble(PyroModule):
    def __init__(self):
        super().__init__()
        self.l1 = pyrouq.BatchEnsembleLinear(3, 4, 2)
        self.l2 = pyrouq.BatchEnsembleLinear(5, 2, 2)

    def forward(self, x, y=None):
        return self.l2(self.l1(x.repeat(2, 1)))


def test_a_layers_refusal_keeps_its_notes_when_pickled():
    """LayerInputError.__reduce__ returns ``(type(self), self.args)``, dropping the instance
    dict, so notes added before pickling (as _mcmc_workers._pickled_failure adds the chain
    process's traceback) are lost; a ValueError keeps them."""
    with pytest.raises(ValueError) as caught:
        _OwnEnsemble()(torch.randn(4, 3))
    err = caught.value
    err.add_note("(raised in the process of chain 0)")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err)
    assert getattr(back, "__notes__", None) == ["(raised in the process of chain 0)"]
