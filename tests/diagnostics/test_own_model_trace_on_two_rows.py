"""Review 11a: a batch_size of 1 before a BatchNorm without running statistics, 1-d outputs
given to the likelihoods' nll(), draws grouped by chain told apart from a site of another
shape, and to_inference_data() of a model of one's own without a guide (traced on two rows,
the param store untouched, a plain network not run, an untraceable model told so)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyrouq import Categorical, Gaussian, bayesian, mean_field_guide, predict, to_inference_data

QUIET = {"progress": False}

# --------------------------------------------------------------------------------------------
# 1. batch_size=1 and a BatchNorm without running statistics
# --------------------------------------------------------------------------------------------


def _net_without_running_stats(d_in: int = 4) -> nn.Module:
    return nn.Sequential(
        nn.Linear(d_in, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.ReLU(), nn.Linear(8, 3)
    )


def test_predict_with_batch_size_1_says_each_input_is_alone():
    torch.manual_seed(0)
    with pytest.raises(ValueError) as err:
        predict(_net_without_running_stats(), torch.randn(5, 4), batch_size=1, **QUIET)
    said = str(err.value)
    assert said.startswith("predict(): batch 1 of x holds 1 input of shape (4,), ")
    assert (
        "batch_size=1 predicts each of x's 5 inputs alone: pass a batch_size of 2 or more (one "
        "that leaves no remainder of 1)."
    ) in said
    assert "leaves 1 of x's 5 inputs alone" not in said
    assert "(torch: 'Expected more than 1 value per channel')" in said


def test_to_inference_data_with_batch_size_1_says_each_input_is_exported_alone():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = bayesian(_net_without_running_stats(3))
    guide = mean_field_guide(model)
    x, y = torch.randn(5, 3), torch.randint(0, 3, (5,))
    with pytest.raises(ValueError) as err:
        to_inference_data(model, guide, x, y, num_samples=2, batch_size=1)
    said = str(err.value)
    assert said.startswith("to_inference_data(): batch 1 of x holds 1 input of shape (3,), ")
    assert (
        "batch_size=1 exports each of x's 5 inputs alone: pass a batch_size of 2 or more (one "
        "that leaves no remainder of 1)."
    ) in said


# --------------------------------------------------------------------------------------------
# 2. 1-d outputs given to nll()
# --------------------------------------------------------------------------------------------


def test_gaussian_nll_of_1d_outputs_is_refused_in_words():
    with pytest.raises(ValueError) as err:
        Gaussian().nll(torch.randn(5), torch.randn(5))
    assert str(err.value) == (
        "Gaussian.nll(): expected outputs of shape (B, D) or (S, B, D) (B inputs, S draws), got "
        "shape (5,). Give them a batch dim: outputs.unsqueeze(-1) if they are B inputs of one "
        "output each, outputs.unsqueeze(0) if they are one input's D outputs."
    )
    # what it says to do is taken
    expected = Gaussian().nll(torch.zeros(5, 1), torch.zeros(5))
    assert torch.isfinite(expected)


@pytest.mark.parametrize("y", [torch.tensor([1]), torch.tensor(1)], ids=["(1,)", "()"])
def test_categorical_nll_of_1d_logits_is_refused_in_words(y):
    with pytest.raises(ValueError) as err:
        Categorical().nll(torch.randn(5), y)
    assert str(err.value) == (
        "Categorical.nll(): expected logits of shape (B, C) or (S, B, C) (B inputs, S draws), "
        "got shape (5,). Give them a batch dim: logits.unsqueeze(0) if they are one input's C "
        "logits (its label then y of shape (1,))."
    )


def test_gaussian_nll_of_0d_outputs_is_told_to_pass_a_batch():
    with pytest.raises(ValueError, match=r"got shape \(\)\. Pass the outputs of a batch of "):
        Gaussian().nll(torch.tensor(0.5), torch.tensor(0.5))


# --------------------------------------------------------------------------------------------
# 3. draws grouped by chain, or a site of another shape
# --------------------------------------------------------------------------------------------


def _two_sites(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(2, 2), 1.0).to_event(2))
    s = pyro.sample("s", dist.Normal(0.0, 1.0))
    logits = x @ w + s
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def test_one_site_of_another_shape_is_not_read_as_chains():
    draws = {"w": torch.randn(40, 2, 2), "s": torch.randn(40, 3)}  # w: 40 flat draws
    with pytest.raises(ValueError) as err:
        predict(_two_sites, torch.randn(6, 2), posterior_samples=draws, **QUIET)
    said = str(err.value)
    assert "site 's' has shape (3,) there but () in the model" in said
    assert "chain" not in said


def test_every_site_grouped_by_two_chains_is_told_to_flatten():
    g = torch.Generator().manual_seed(0)
    grouped = {"w": torch.randn(2, 20, 2, 2, generator=g), "s": torch.randn(2, 20, generator=g)}
    x = torch.randn(6, 2, generator=g)
    with pytest.raises(ValueError) as err:
        predict(_two_sites, x, posterior_samples=grouped, **QUIET)
    assert str(err.value) == (
        "predict(): posterior_samples: site 'w' has shape (2, 20, 2, 2), read as (chain, draw) "
        "= (2, 20) before the site's shape (2, 2): predict() takes the draws flattened, "
        "(S, *shape). Pass the pyro.infer.MCMC run itself (or its get_samples(), chains not "
        "grouped), or value.reshape(-1, *value.shape[2:]) for every site (chain after chain; "
        "every site given here is grouped as (2, 20))."
    )
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in grouped.items()}
    probs = predict(_two_sites, x, posterior_samples=flat, **QUIET).probs
    expected = torch.softmax(x @ flat["w"] + flat["s"][:, None, None], -1)
    torch.testing.assert_close(probs, expected)


# --------------------------------------------------------------------------------------------
# 4. to_inference_data(model, None, x, y) of a model of one's own
# --------------------------------------------------------------------------------------------


def _data(n: int = 30):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 2, generator=g), torch.randint(0, 2, (n,), generator=g)


def test_own_model_is_traced_on_two_rows_only():
    seen = []

    def counted(x, y=None):
        seen.append(x.shape[0])
        return _two_sites(x, y)

    x, y = _data()
    with pytest.raises(ValueError, match=r"counted samples the latent sites \['w', 's'\]"):
        to_inference_data(counted, None, x, y)
    assert seen == [2]  # a model that runs on two rows is traced on them alone


def test_own_models_param_is_not_left_in_the_param_store():
    pyro.clear_param_store()
    pyro.param("kept", torch.ones(3))

    def with_param(x, y=None):
        shift = pyro.param("review11a_shift", torch.zeros(2))
        return _two_sites(x, y) + shift

    x, y = _data()
    with pytest.raises(ValueError, match=r"with_param samples the latent sites"):
        to_inference_data(with_param, None, x, y)
    store = pyro.get_param_store()
    assert "review11a_shift" not in store
    assert list(store.keys()) == ["kept"]
    torch.testing.assert_close(pyro.param("kept"), torch.ones(3))
    pyro.clear_param_store()


class _Masked(nn.Module):
    """A plain network whose forward takes a mask second."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.masks = []

    def forward(self, x, mask=None):
        self.masks.append(mask)
        return self.fc(x)


def test_a_plain_networks_forward_is_not_called_with_y():
    net = _Masked()
    x, y = _data()
    with pytest.raises(ValueError, match=r"_Masked has no posterior to export: no latent sites"):
        to_inference_data(net, None, x, y)
    assert net.masks == []


def test_a_model_of_x_alone_names_its_latent_sites():
    def of_x(x):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 2), 1.0).to_event(2))
        return x @ w

    x, y = _data()
    with pytest.raises(ValueError) as err:
        to_inference_data(of_x, None, x, y)
    assert str(err.value).startswith(
        "to_inference_data(): of_x samples the latent sites ['w'] but guide is None"
    )
    assert "arviz.from_pyro(run)" in str(err.value)


class _Broken(PyroModule):
    """A PyroModule of one's own with a bug of its own."""

    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](2, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))

    def forward(self, x, y=None):
        raise RuntimeError("review11a: a bug of the model's own")


def test_an_untraceable_model_is_told_so_not_called_a_plain_network():
    x, y = _data()
    with pytest.raises(ValueError) as err:
        to_inference_data(_Broken(), None, x, y)
    said = str(err.value)
    assert said.startswith(
        "to_inference_data(): _Broken could not be traced to find its latent sites (run as "
        "model(x, y), it raised RuntimeError: review11a: a bug of the model's own), and "
        "guide is None."
    )
    assert "plain network" not in said
    assert "to_inference_data(model, guide, x, y)" in said
    assert "arviz.from_pyro(run)" in said
    assert isinstance(err.value.__cause__, RuntimeError)
    assert str(err.value.__cause__).startswith("review11a: a bug of the model's own")


def test_a_model_of_x_alone_with_a_bug_is_run_as_model_of_x():
    def of_x_broken(x):
        raise KeyError("review11a")

    x, y = _data()
    with pytest.raises(ValueError, match=r"of_x_broken could not be traced .*model\(x\),") as err:
        to_inference_data(of_x_broken, None, x, y)
    assert isinstance(err.value.__cause__, KeyError)
