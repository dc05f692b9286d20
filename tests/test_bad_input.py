"""The bad-input catalogue: one case per refusal across the package.

Every case asserts the exception type and that the message names the argument, what was
expected and what came (the regular expression spans those parts).
"""

from __future__ import annotations

import re

import pyro
import pytest
import torch

from pyrouq import (
    MLP,
    BatchEnsembleMLP,
    BayesianLeNet,
    BayesianMLP,
    CheckpointError,
    KLWeightedELBO,
    bayesian,
    decompose,
    fit,
    load,
    load_mnist,
    mean_field_guide,
    metrics,
    predict,
    psis_diagnostic,
    save,
    to_inference_data,
)
from pyrouq.cli import main
from pyrouq.data import TensorLoader


class _Subclass(BayesianMLP):
    """A user subclass of a front door: save() cannot rebuild it from a description."""


class _Residual(torch.nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, width, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(width)

    def forward(self, x):
        return (x + self.norm(self.conv(x)).mean(1, keepdim=True)).flatten(1)


def _residual(width=4):
    return _Residual(width)


class _TupleNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x), x


def tiny():
    model = BayesianMLP(hidden_features=4, num_data=10)
    return model, mean_field_guide(model)


def uniform(s=1, n=3, c=4):
    return torch.full((s, n, c), 1.0 / c)


def fit_with_nan():
    images = torch.rand(8, 28, 28)
    images[5, 0, 0] = float("inf")
    loader = TensorLoader(
        images, torch.arange(8) % 10, 4, shuffle=False, flatten=True, normalize=False, seed=0
    )
    model, guide = tiny()
    fit(model, guide, loader, epochs=1, progress=False)


def pickled_checkpoint(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"format": "pyrouq.checkpoint", "x": Evil()}, tmp_path / "evil.pt")
    load(tmp_path / "evil.pt")


def truncated_checkpoint(tmp_path):
    model, guide = tiny()
    data = save(tmp_path / "ok.pt", model, guide).read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[:100])
    load(tmp_path / "cut.pt")


def other_class_checkpoint(tmp_path):
    model, guide = tiny()
    load(save(tmp_path / "mlp.pt", model, guide), model_class=BayesianLeNet)


CASES = {
    # data
    "data: batch_size": (
        lambda tmp: load_mnist(batch_size=0),
        ValueError,
        r"Expected batch_size to be a positive integer, got 0",
    ),
    "data: train_size": (
        lambda tmp: load_mnist(train_size=70000),
        ValueError,
        r"Expected train_size to be an integer in \[1, 60000\], got 70000",
    ),
    "data: missing files": (
        lambda tmp: load_mnist(root=tmp),
        FileNotFoundError,
        r"MNIST train file not found: expected .*train-images-idx3-ubyte.* To fix: pass a root=",
    ),
    # models
    "model: prior_scale": (
        lambda tmp: BayesianMLP(prior_scale=-1.0),
        ValueError,
        r"Expected prior_scale > 0 \(a finite float\), got -1.0",
    ),
    "model: num_members": (
        lambda tmp: BatchEnsembleMLP(num_members=0),
        ValueError,
        r"Expected num_members to be an integer >= 1, got 0",
    ),
    "model: input shape": (
        lambda tmp: BayesianLeNet(num_data=4)(torch.randn(4, 784)),
        ValueError,
        r"BayesianLeNet expects images of shape \(B, 1, 28, 28\), got shape \(4, 784\)",
    ),
    # guide
    "guide: init_scale": (
        lambda tmp: mean_field_guide(BayesianMLP(hidden_features=4), init_scale=0.0),
        ValueError,
        r"Expected init_scale > 0 \(a finite float\), got 0.0",
    ),
    "guide: not a Bayesian model": (
        lambda tmp: mean_field_guide(MLP()),
        TypeError,
        r"needs a pyrouq Bayesian model \(made by pyrouq.bayesian\(\), BayesianMLP.*got MLP",
    ),
    # ELBO
    "elbo: kl_weight": (
        lambda tmp: KLWeightedELBO(kl_weight=-1),
        ValueError,
        r"Expected kl_weight to be a finite float >= 0, got -1",
    ),
    "elbo: num_particles": (
        lambda tmp: KLWeightedELBO(num_particles=0),
        ValueError,
        r"Expected num_particles to be an integer >= 1, got 0",
    ),
    # fit
    "fit: epochs": (
        lambda tmp: fit(*tiny(), [], epochs=0),
        ValueError,
        r"Expected epochs to be an integer >= 1, got 0",
    ),
    "fit: missing guide": (
        lambda tmp: fit(tiny()[0], None, load_mnist(batch_size=8, train_size=8)[0], epochs=1),
        ValueError,
        r"BayesianMLP has latent sites but guide is None\. Pass guide=mean_field_guide",
    ),
    "fit: NaN inputs": (
        lambda tmp: fit_with_nan(),
        ValueError,
        r"train_loader holds NaN or inf in 1 of 8 examples, e\.g\. example indices \[5\] "
        r"\(the first in batch 2 of every epoch\); nothing was trained",
    ),
    # predict
    "predict: num_samples for an ensemble": (
        lambda tmp: predict(BatchEnsembleMLP(), torch.randn(2, 784), num_samples=3),
        ValueError,
        r"num_samples=3 given for a BatchEnsemble: its 4 members are fixed, not sampled",
    ),
    "predict: Bayesian model without guide": (
        lambda tmp: predict(tiny()[0], torch.randn(2, 784)),
        ValueError,
        r"BayesianMLP has latent sites: pass its fitted guide",
    ),
    # metrics
    "metrics: probabilities not summing to 1": (
        lambda tmp: metrics.ece(torch.full((3, 4), 0.5), torch.tensor([0, 1, 2])),
        ValueError,
        r"Expected probs to sum to 1 over the class dim -1 .*got sums between 2 and 2",
    ),
    "metrics: targets of the wrong length": (
        lambda tmp: metrics.acc(torch.full((3, 4), 0.25), torch.tensor([0, 1])),
        ValueError,
        r"Expected targets of shape \(N,\) = \(3,\).*got shape \(2,\)",
    ),
    "metrics: targets out of range": (
        lambda tmp: metrics.nll(torch.full((3, 4), 0.25), torch.tensor([0, 1, 7])),
        ValueError,
        r"Expected targets in \[0, 4\) .*got values in \[0, 7\]",
    ),
    "metrics: empty OOD set": (
        lambda tmp: metrics.evaluate(uniform(), torch.tensor([0, 1, 2]), ood=torch.empty(1, 0, 4)),
        ValueError,
        r"Expected a non-empty ood, got shape \(1, 0, 4\)",
    ),
    "metrics: unknown OOD score": (
        lambda tmp: metrics.evaluate(
            uniform(), torch.tensor([0, 1, 2]), ood=uniform(), ood_score="foo"
        ),
        ValueError,
        r"Unknown ood_score 'foo'; expected one of 'mutual_information', 'entropy'",
    ),
    # decompositions
    "decompose: unknown measure": (
        lambda tmp: decompose(uniform(), "foo"),
        ValueError,
        r"Unknown measure 'foo'; expected one of 'entropy', 'variance', 'zero_one'",
    ),
    "decompose: wrong rank": (
        lambda tmp: decompose(torch.full((3, 4), 0.25)),
        ValueError,
        r"Expected probs of shape \(S, N, C\) \(3 dims\), got shape \(3, 4\)",
    ),
    # diagnostics
    "diagnostics: x and y lengths": (
        lambda tmp: to_inference_data(*tiny(), torch.randn(3, 784), torch.tensor([0, 1])),
        ValueError,
        r"x and y must hold the same number of points, got x with 3 .* and y with 2",
    ),
    "diagnostics: unknown var_names": (
        lambda tmp: to_inference_data(
            *tiny(), torch.randn(3, 784), torch.tensor([0, 1, 2]), var_names=["nope"]
        ),
        ValueError,
        r"Unknown var_names \['nope'\]: the latent sites are \['fc1.weight'",
    ),
    "diagnostics: PSIS without a guide": (
        lambda tmp: psis_diagnostic(tiny()[0], None, torch.randn(3, 784), torch.tensor([0, 1, 2])),
        ValueError,
        r"psis_diagnostic\(\): guide is None\. .*pass the fitted guide",
    ),
    # checkpoints
    "checkpoint: missing file": (
        lambda tmp: load(tmp / "nope.pt"),
        CheckpointError,
        r"No checkpoint at '.*nope\.pt': the file does not exist",
    ),
    "checkpoint: truncated": (
        truncated_checkpoint,
        CheckpointError,
        r"cut\.pt' is not a readable checkpoint: it is truncated or corrupted",
    ),
    "checkpoint: another model class": (
        other_class_checkpoint,
        CheckpointError,
        r"holds a BayesianMLP, expected a BayesianLeNet",
    ),
    "checkpoint: pickled Python object": (
        pickled_checkpoint,
        CheckpointError,
        r"evil\.pt' contains pickled Python objects, which pyrouq refuses to load",
    ),
    "checkpoint: unsupported model": (
        lambda tmp: save(tmp / "x.pt", _Subclass(hidden_features=4)),
        CheckpointError,
        r"cannot describe a _Subclass: expected a model made by pyrouq.bayesian\(\)",
    ),
    "checkpoint: converted network without a skeleton": (
        lambda tmp: load(save(tmp / "x.pt", bayesian(_residual()))),
        CheckpointError,
        r"holds a network converted from a .*_Residual.*load\(path, module=net\)",
    ),
    "checkpoint: skeleton that does not match": (
        lambda tmp: load(save(tmp / "x.pt", bayesian(_residual())), module=_residual(width=5)),
        CheckpointError,
        r"skeleton .* does not match .*parameter 'conv.weight' is shape \(4, 1, 3, 3\) in the "
        r"checkpoint and shape \(5, 1, 3, 3\) in the skeleton",
    ),
    "fit: checkpoint of a model it cannot save": (
        lambda tmp: fit(
            (m := _Subclass(hidden_features=4)),
            mean_field_guide(m),
            [(torch.randn(2, 784), torch.tensor([0, 1]))],
            epochs=1,
            num_data=2,
            checkpoint=tmp / "c.pt",
        ),
        CheckpointError,
        r"cannot describe a _Subclass",
    ),
    # bring your own network
    "bayesian: nothing to select": (
        lambda tmp: bayesian(torch.nn.Sequential(torch.nn.LayerNorm(3), torch.nn.ReLU())),
        ValueError,
        r"Sequential has no nn.Linear or convolution layer, so select=None picks nothing.*"
        r"Its parameters are '0.weight', '0.bias'; pass select=",
    ),
    "bayesian: no parameters at all": (
        lambda tmp: bayesian(torch.nn.ReLU()),
        ValueError,
        r"ReLU has no parameters, so there is nothing to make Bayesian",
    ),
    "bayesian: select entry that matches nothing": (
        lambda tmp: bayesian(_residual(), select=["conv", "fc2"]),
        ValueError,
        r"select entry 'fc2' matches no parameter of _Residual. Its parameters are 'conv.weight'",
    ),
    "bayesian: unknown select string": (
        lambda tmp: bayesian(_residual(), select="conv"),
        ValueError,
        r"Unknown select 'conv': expected None .*pass a list: select=\[name\]",
    ),
    "bayesian: prior key that matches nothing": (
        lambda tmp: bayesian(_residual(), prior={"conv": 0.1, "head": 1.0}),
        ValueError,
        r"prior key 'head' matches no latent site: it matches no parameter. The latent sites "
        r"are 'conv.weight'",
    ),
    "bayesian: prior key naming a point estimate": (
        lambda tmp: bayesian(_residual(), prior={"norm": 0.1}),
        ValueError,
        r"prior key 'norm' matches no latent site: it names parameters that are not latent "
        r"\('norm.weight', 'norm.bias'; widen select=",
    ),
    "bayesian: prior that does not fit its site": (
        lambda tmp: bayesian(_residual(), prior=pyro.distributions.Normal(torch.zeros(7), 1.0)),
        ValueError,
        r"prior of 'conv.weight' has batch_shape \(7,\), which does not broadcast to the site's "
        r"shape \(4, 1, 3, 3\)",
    ),
    "bayesian: negative prior scale": (
        lambda tmp: bayesian(_residual(), prior={"conv.bias": -1.0}),
        ValueError,
        r"Expected the prior scale of 'conv.bias' > 0 .*got -1.0",
    ),
    "bayesian: forward returns no tensor": (
        lambda tmp: bayesian(_TupleNet())(torch.randn(2, 3)),
        TypeError,
        r"_TupleNet.forward returned tuple; pyrouq needs a network whose forward\(x\) returns "
        r"one tensor of outputs \(B, D\)",
    ),
    "bayesian: not a module": (
        lambda tmp: bayesian("resnet18"),  # type: ignore[arg-type]
        TypeError,
        r"Expected an nn.Module to make Bayesian, got str",
    ),
    "bayesian: unknown likelihood": (
        lambda tmp: bayesian(_residual(), likelihood="poisson"),  # type: ignore[arg-type]
        ValueError,
        r"Unknown likelihood 'poisson': expected one of \['categorical'\]",
    ),
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("name", list(CASES))
def test_refused_with_a_clear_message(name, tmp_path):
    call, error, pattern = CASES[name]
    with pytest.raises(error) as info:
        call(tmp_path)
    assert re.search(pattern, str(info.value)), str(info.value)


CLI_CASES = {
    "cli: unknown model": (["fit", "resnet"], r"unknown model 'resnet'; choose one of: bayes"),
    "cli: non-positive epochs": (["fit", "mlp", "--epochs", "0"], r"--epochs must be a positive"),
    "cli: batch size": (["fit", "mlp", "--batch-size", "x"], r"--batch-size must be a positive"),
}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_refuses_with_one_line_and_exit_code_2(name, capsys):
    argv, pattern = CLI_CASES[name]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1
    assert re.search(pattern, err), err


def test_the_catalogue_has_at_least_twelve_cases():
    assert len(CASES) + len(CLI_CASES) >= 12
    areas = {name.split(":")[0] for name in [*CASES, *CLI_CASES]}
    assert areas >= {
        "data", "model", "guide", "elbo", "fit", "predict", "metrics", "decompose",
        "diagnostics", "cli", "checkpoint",
    }  # fmt: skip
