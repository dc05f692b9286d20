"""The README's, the docs' and the docstrings' words on the refusals and warnings of 2026-12-06,
pinned: the converters' warning of layers in plain containers and bayesian()'s refusal of a
parameter named like one of the model's own sites (and load()'s warning for a checkpoint saved
before it), a model's words for a dict input, a misspelt factory's close names, fit()'s words
for a BatchNorm batch of one on several ranks, the histogram bins' cap, and the named
lr_schedule and kernel choices."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import matplotlib
import pyro.distributions as dist
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq._batchnorm import one_value_in_training
from pyrouq._mcmc_checks import KERNELS
from pyrouq.cli._build import CommandError, call_factory
from pyrouq.convert._sites import rebuilding_saved
from pyrouq.infer._fit_inputs import unsharded_loader_message
from pyrouq.infer._options import LR_SCHEDULES

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SCALING_OUT = (ROOT / "docs" / "scaling_out.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())


class Listed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.layers = [nn.Linear(3, 3)]  # not registered

    def forward(self, x):
        return self.fc(self.layers[0](x))


class Named(nn.Module):
    """A network whose own parameter is called ``name``."""

    def __init__(self, name: str):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.name = name
        setattr(self, name, nn.Parameter(torch.ones(2)))

    def forward(self, x):
        return self.fc(x) * getattr(self, self.name)


def test_readme_layers_in_a_plain_list_are_warned_of_by_every_converter():
    assert "Layers or parameters held in a plain Python list, tuple or dict are warned of" in (
        _flat(README)
    )
    for convert in (pyrouq.bayesian, lambda m: pyrouq.batchensemble(m, 2)):
        with pytest.warns(UserWarning, match="plain Python containers") as caught:
            convert(Listed())
        message = str(caught[0].message)
        assert "'layers'" in message and "nn.ModuleList / nn.ModuleDict" in message
        assert "never latent" in message


@pytest.mark.parametrize(
    ("site", "likelihood"),
    [
        ("obs", "categorical"),
        ("data", "categorical"),
        ("logits", "categorical"),
        ("outputs", "gaussian"),
        ("sigma", None),  # a noise prior's latent sigma
    ],
)
def test_readme_a_parameter_named_like_the_models_own_site_is_refused(site, likelihood):
    text = _flat(README)
    assert "refuses a selected parameter named like one of the model's own sites" in text
    if likelihood is None:
        likelihood = pyrouq.Gaussian(dist.HalfNormal(1.0))
    with pytest.raises(ValueError) as caught:
        pyrouq.bayesian(Named(site), select=lambda name, p: True, likelihood=likelihood)
    message = str(caught.value)
    # naming both owners: the network's parameter and the model's site
    assert f"the parameter {site!r} of Named would be a latent site named {site!r}" in message
    assert "which is already" in message and "leave it out of select=" in message
    # left out of select=, it is a point estimate: no refusal
    pyrouq.bayesian(Named(site), select=["fc"], likelihood=likelihood)


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_readme_a_checkpoint_saved_before_the_clash_was_refused_loads_with_a_warning(tmp_path):
    assert "a checkpoint saved before that refusal loads with a warning" in _flat(README)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with rebuilding_saved():  # as an earlier pyrouq built it
            model = pyrouq.bayesian(Named("obs"), select=lambda name, p: True)
    path = tmp_path / "old.pt"
    pyrouq.save(path, model)
    with pytest.warns(UserWarning, match=r"load\(\): the checkpoint's network Named") as caught:
        pyrouq.load(path, module=Named("obs"))
    assert "loads as it was trained" in str(caught[0].message)


def test_readme_a_converted_model_given_a_dict_says_to_wrap_the_network():
    assert "as a converted model called on such an input says" in _flat(README)
    for model in (pyrouq.bayesian(nn.Linear(3, 2)), pyrouq.batchensemble(nn.Linear(3, 2), 2)):
        for x in ({"a": torch.randn(4, 3)}, (torch.randn(4, 3), torch.randn(4, 3))):
            with pytest.raises(TypeError, match=r"wrap the network in a small nn\.Module"):
                model(x)


def test_readme_a_misspelt_factory_is_told_the_close_names():
    assert "a misspelt name is told the close names the module has" in _flat(README)
    with pytest.raises(CommandError, match=r"\(did you mean 'pyrouq\.models:ResidualCNN'\?\)"):
        call_factory("pyrouq.models:ResidualCN")


def test_scaling_out_a_batchnorm_batch_of_one_names_the_ranks_shard():
    text = _flat(SCALING_OUT)
    assert "the remainder that counts is that of each rank's shard (`ceil(N / world)`" in text
    assert "(a shard of one example: more examples or fewer ranks)" in text
    x = torch.randn(1, 3)
    # 34 examples in batches of 8 on 2 ranks: each rank's 17 leave a last batch of one
    loader = pyrouq.ArrayLoader(torch.randn(34, 3), torch.zeros(34, dtype=torch.long), 8)
    last = str(one_value_in_training(x, 1, 3, loader, 2))
    assert "fit() runs on 2 ranks" in last
    assert "its own shard of the 34 examples (17 on this rank)" in last
    # 2 examples on 2 ranks: a shard of one example, so no batch size gives a batch of 2
    tiny = pyrouq.ArrayLoader(torch.randn(2, 3), torch.zeros(2, dtype=torch.long), 8)
    first = str(one_value_in_training(x, 1, 1, tiny, 2))
    assert "more examples, or fewer ranks" in first and "(1 on this rank)" in first


def test_scaling_out_a_loader_without_a_sampler_is_refused_as_fit_cannot_tell_its_data():
    # the refusal said such a loader "would give every rank the same data", untrue of one
    # holding each rank's data sharded beforehand: fit() sees no DistributedSampler alone
    text = _flat(SCALING_OUT)
    assert (
        "`fit()` cannot tell whether it hands every rank the same batches or each rank data of "
        "its own, and it takes no data sharded beforehand (give every rank the whole set, and "
        "the `DistributedSampler` shards it)"
    ) in text
    batches = [(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))]
    assert unsharded_loader_message(batches, 2) == (
        "fit() runs on 2 ranks (torch.distributed is initialised), but train_loader (list) is "
        "neither one of pyrouq's loaders (load_mnist, ArrayLoader, ...: they shard themselves "
        "by rank) nor a DataLoader with a DistributedSampler, so fit() cannot tell whether it "
        "gives every rank the same data or each rank its own; it takes no data sharded "
        "beforehand. Give every rank the whole data set, as DataLoader(dataset, batch_size, "
        "sampler=DistributedSampler(dataset)) (dataset: e.g. TensorDataset(x, y)) or one of "
        "pyrouq's loaders: each rank then trains on a shard of its own."
    )


def test_readme_and_plotting_say_how_a_notebook_shows_a_returned_figure_once():
    # a plot left as a cell's last expression is shown twice in Jupyter (the inline backend,
    # then the cell's value; checked with nbclient: 2 images, 1 with `fig = ` or `;`), which
    # neither said
    assert (
        "In a notebook, a figure left as a cell's last expression is shown twice (by pyplot's "
        "inline backend, then as the cell's value): assign it, `fig = "
        "pyrouq.plot_reliability(preds, y)`, or end the line with `;`."
    ) in _flat(README)
    assert (
        "one left as a cell's last expression is shown twice (by the inline backend, then as "
        "the cell's value): assign it (``fig = plot_reliability(...)``) or end the line with "
        "``;``."
    ) in _flat(pyrouq.plotting.__doc__ or "")


def test_plot_uncertainty_distributions_bins_at_most_1000_unused_by_ecdf():
    import matplotlib.pyplot as plt

    doc = _flat(inspect.getdoc(pyrouq.plot_uncertainty_distributions) or "")
    assert "Number of histogram bins, at most 1000" in doc and 'unused by ``kind="ecdf"``' in doc
    probs = torch.softmax(torch.randn(2, 20, 3), -1)
    plt.close(pyrouq.plot_uncertainty_distributions(probs, bins=1000))
    with pytest.raises(ValueError, match=r"Expected bins <= 1000 .*got 1001"):
        pyrouq.plot_uncertainty_distributions(probs, bins=1001)
    plt.close(pyrouq.plot_uncertainty_distributions(probs, kind="ecdf", bins=10**6))


def test_the_lr_schedules_named_in_fits_docstring_and_the_readme_are_fits():
    doc = inspect.getdoc(pyrouq.fit) or ""
    named = re.search(r"lr_schedule : \{(.*?)\}", doc)
    assert named is not None
    assert [n.strip().strip('"') for n in named[1].split(",")] == list(LR_SCHEDULES)
    assert '`lr_schedule` | `"warmup_cosine"`: linear warm-up over 20 % of the steps' in README
    assert "20 % of the steps" in LR_SCHEDULES["warmup_cosine"]
    model = pyrouq.bayesian(nn.Linear(3, 2))
    guide, data = pyrouq.mean_field_guide(model), [(torch.randn(4, 3), torch.zeros(4).long())]
    with pytest.raises(ValueError, match=r"did you mean 'cosine'\?"):
        pyrouq.fit(model, guide, data, epochs=1, lr_schedule="Cosine", num_data=4, progress=False)


def test_the_kernels_named_in_mcmcs_docstring_are_mcmcs():
    doc = inspect.getdoc(pyrouq.mcmc) or ""
    assert 'kernel : {"nuts", "hmc"}' in doc
    assert KERNELS == ("nuts", "hmc")
    model = pyrouq.bayesian(nn.Linear(2, 2))
    x, y = torch.randn(4, 2), torch.tensor([0, 1, 0, 1])
    told = r"did you mean 'nuts'\? the names are lower case\): .* Pass kernel='nuts'"
    with pytest.raises(ValueError, match=told):
        pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, kernel="NUTS", progress=False)
