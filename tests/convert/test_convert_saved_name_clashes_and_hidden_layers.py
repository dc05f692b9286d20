"""Review of the converters' new checks (a network site named as one of the model's own; layers
held in plain containers) and of predict()'s split: a checkpoint written before the refusal
still loads, a teacher held apart is warned of, and predict()'s default number of draws is
still read from ``pyrouq.predictive``."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq.convert._bayesian as converting
import pyrouq.predictive
from pyrouq import Gaussian, bayesian, fit, load, mean_field_guide, predict, save


class _Scaled(nn.Module):
    """A linear layer times a scalar top-level parameter named ``name``."""

    def __init__(self, name: str):
        super().__init__()
        self.fc = nn.Linear(3, 1)
        self.own = name
        setattr(self, name, nn.Parameter(torch.tensor(1.0)))

    def forward(self, x):
        return self.fc(x) * getattr(self, self.own)


def _saved_before_the_refusal(name, likelihood, path, monkeypatch):
    """A fitted model whose network site is named ``name``, saved as a pyrouq of before the
    refusal saved it (the check switched off while it is built), and its predictions."""
    with monkeypatch.context() as patch:
        patch.setattr(converting, "check_own_names", lambda *args: None)
        torch.manual_seed(0)
        model = bayesian(_Scaled(name), select=["fc", name], likelihood=likelihood)
    x, y = torch.randn(8, 3), torch.randn(8)
    guide = mean_field_guide(model)
    fit(model, guide, [(x, y)], epochs=2, num_data=8, progress=False, seed=0)
    before = predict(model, x, guide, num_samples=3, progress=False, seed=1).mean
    save(path, model, guide)
    return x, before


@pytest.mark.parametrize(
    ("name", "likelihood", "fragments"),
    [
        (
            "sigma",
            lambda: Gaussian(dist.HalfNormal(1.0)),
            [
                "load(): the checkpoint's network _Scaled has a latent site 'sigma', named as a "
                "latent site of the likelihood Gaussian (its noise scale, from its prior), "
                "which bayesian() refuses since 2026-12-06",
                "It loads as it was trained, but one draw stands for both",
            ],
        ),
        (
            "obs",
            lambda: "gaussian",
            [
                "has a latent site 'obs', named as the site where the model observes the targets",
                "Pyro's trace (mcmc(), to_inference_data(), pyro.infer.Predictive) refuses",
            ],
        ),
    ],
)
def test_a_checkpoint_saved_before_the_name_was_refused_loads_with_a_warning(
    name, likelihood, fragments, tmp_path, monkeypatch
):
    path = tmp_path / "old.pt"
    x, before = _saved_before_the_refusal(name, likelihood(), path, monkeypatch)
    with pytest.warns(UserWarning, match="load\\(\\): the checkpoint's network") as caught:
        loaded = load(path, module=_Scaled(name))
    text = next(str(w.message) for w in caught if "load(): the checkpoint's" in str(w.message))
    for fragment in fragments:
        assert fragment in text
    assert f"Rename the network's parameter (self.{name} -> e.g. self.{name}_net)" in text
    after = predict(loaded.model, x, loaded.guide, num_samples=3, progress=False, seed=1).mean
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    # building such a network anew is still refused, and after load() too
    with pytest.raises(ValueError, match=f"the parameter '{name}' of _Scaled would be"):
        bayesian(_Scaled(name), select=["fc", name], likelihood=likelihood())


# -- layers held in plain containers: a teacher kept apart -------------------------------------


def test_a_hidden_teacher_is_warned_of_with_what_to_do_and_configuration_is_not():
    class Student(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.config = {"sizes": [4, 2], "names": ("a", "b")}  # no layers: not warned of
            self.constants = [torch.ones(2), torch.zeros(2)]  # plain tensors: not warned of
            self._teacher = ({"net": [nn.Linear(4, 2)]},)  # out of torch's sight on purpose

        def forward(self, x):
            return self.fc(x)

    with pytest.warns(UserWarning) as caught:
        bayesian(Student())
    texts = [str(w.message) for w in caught if "plain Python containers" in str(w.message)]
    assert len(texts) == 1
    assert "Student holds layers or parameters in plain Python containers ('_teacher':" in texts[0]
    assert "though forward may run them" in texts[0]
    assert "kept out of torch's sight on purpose (a frozen teacher network), filter" in texts[0]


# -- predict(): the default number of draws, read from pyrouq.predictive ------------------------


class _PriorOnly(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](3, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_the_default_number_of_draws_is_read_from_pyrouq_predictive(monkeypatch):
    monkeypatch.setattr(pyrouq.predictive, "DEFAULT_NUM_SAMPLES", 3)
    x = torch.randn(5, 3)
    priors = predict(_PriorOnly(), x, progress=False, seed=0)  # run from its priors, S times
    assert priors.probs.shape == (3, 5, 2)
    model = bayesian(nn.Linear(3, 2))
    drawn = predict(model, x, mean_field_guide(model), progress=False, seed=0)
    assert drawn.probs.shape == (3, 5, 2)
