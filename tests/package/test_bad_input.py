"""The bad-input catalogue: one case per refusal across the package.

Every case asserts the exception type and that the message names the argument, what was
expected and what came (the regular expression spans those parts).
"""

from __future__ import annotations

import collections
import math
import re
import tempfile
from decimal import Decimal
from pathlib import Path

import pyro
import pytest
import torch
import torchvision
from torch import nn

import pyrouq
from pyrouq import (
    MLP,
    BatchEnsembleMLP,
    BayesianLeNet,
    BayesianMLP,
    CheckpointError,
    KLWeightedELBO,
    batchensemble,
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
from pyrouq.data import TensorLoader, normalize
from pyrouq.likelihoods import Categorical, get_likelihood


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


class _AuxNet(torch.nn.Module):
    """A network of one's own whose forward returns a namedtuple with an auxiliary head, in
    either mode, and has no aux_logits flag."""

    Outputs = collections.namedtuple("Outputs", ["main", "aux"])

    def __init__(self):
        super().__init__()
        self.fc, self.head = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.Outputs(self.fc(x), self.head(x))


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


def one_lit_pixel():  # dark images whose first row holds one lit pixel: it sums to 1
    images = torch.zeros(3, 1, 8, 8)
    images[..., 0, 0] = 1.0
    return images


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
    "elbo: kl_weight as a tensor": (
        lambda tmp: KLWeightedELBO(kl_weight=torch.tensor(1.0)),
        TypeError,
        r"Expected kl_weight to be a float >= 0, got tensor\(1\.\) \(a tensor: pass a Python "
        r"number, float\(t\)\)\.",
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
    "metrics: targets None (predictions of inputs without labels)": (  # was: torch.as_tensor
        lambda tmp: metrics.ece(
            pyrouq.Predictions(uniform()), pyrouq.Predictions(uniform()).targets
        ),
        ValueError,  # evaluate()'s words (a TypeError in words of their own before)
        r"No targets: pass targets=\(N,\) labels, or Predictions that carry them \(predict "
        r"from a loader of \(x, y\) batches\)\.",
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
    "metrics: OOD score without OOD predictions": (
        lambda tmp: metrics.evaluate(uniform(), torch.tensor([0, 1, 2]), ood_score="entropy"),
        ValueError,
        r"ood_score='entropy' given without ood: it scores the in- and out-of-distribution "
        r"inputs for the OOD metrics\. Pass ood=\(predictions on the OOD inputs\), or leave "
        r"ood_score out\.",
    ),
    "metrics: OOD inputs where their predictions go": (  # was: stack draws on dim 0
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=torch.rand(3, 1, 8, 8)),
        ValueError,
        r"got a tensor of shape \(3, 1, 8, 8\): the inputs\? evaluate\(\) scores predictions, "
        r"not inputs: predict on them first, ood=pyrouq\.predict\(model, ood_inputs, guide\)",
    ),
    "metrics: flattened OOD inputs where their predictions go": (  # was: apply a softmax
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=torch.randn(3, 64)),
        ValueError,
        r"probabilities over the C=4 classes of the in-distribution ones, got a tensor of shape "
        r"\(3, 64\) that holds no probabilities: the inputs\? evaluate\(\) scores predictions, "
        r"not inputs: predict on them first, ood=pyrouq\.predict\(model, ood_inputs, guide\)",
    ),
    "metrics: flattened OOD inputs as a numpy array": (  # was: pass torch.as_tensor(ood)
        # (then: predict(model, ood_inputs), which refuses an array: "Convert an array first")
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=torch.rand(3, 64).numpy()),
        ValueError,
        r"got an array \(ndarray\) of shape \(3, 64\) that holds no probabilities: the inputs\? "
        r"evaluate\(\) scores predictions, not inputs: predict on them first, "
        r"ood=pyrouq\.predict\(model, torch\.as_tensor\(ood_inputs\), guide\)",
    ),
    "metrics: flattened OOD inputs as a list": (  # was: an array (list), predict on ood_inputs
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=torch.rand(3, 64).tolist()),
        ValueError,
        r"got a list of shape \(3, 64\) that holds no probabilities: the inputs\? evaluate\(\) "
        r"scores predictions, not inputs: predict on them first, "
        r"ood=pyrouq\.predict\(model, torch\.as_tensor\(ood_inputs\), guide\)",
    ),
    "metrics: uint8 OOD images of 3 dims where their predictions go": (  # was: .double()
        lambda tmp: metrics.evaluate(
            uniform(), labels(3), ood=torch.full((3, 8, 8), 200, dtype=torch.uint8)
        ),
        ValueError,
        r"got a tensor of shape \(3, 8, 8\) that holds no probabilities: the inputs\? "
        r"evaluate\(\) scores predictions, not inputs",
    ),
    "metrics: empty OOD inputs of another width than C": (  # told empty, not as inputs
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=torch.zeros(0, 64)),
        ValueError,
        r"^Expected a non-empty ood, got shape \(0, 64\)",
    ),
    "metrics: OOD inputs of another width than C on the meta device": (  # told meta, as before
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=torch.zeros(3, 64, device="meta")),
        ValueError,
        r"^Expected ood on a real device \(cpu or cuda\), got them on the meta device",
    ),
    "metrics: OOD inputs with a row that sums to 1": (  # not every row: not probabilities
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=one_lit_pixel()),
        ValueError,
        r"got a tensor of shape \(3, 1, 8, 8\): the inputs\? evaluate\(\) scores predictions",
    ),
    "metrics: OOD probabilities as a numpy array": (  # not told it is a loader of inputs
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=uniform().numpy()),
        TypeError,
        r"probability tensor or an object with a \.probs attribute .*got ndarray; pass "
        r"torch\.as_tensor\(ood\)",
    ),
    "metrics: OOD probabilities stacked on one dim too many": (  # not told they are inputs
        lambda tmp: metrics.evaluate(uniform(), labels(3), ood=uniform()[None]),
        ValueError,
        r"Expected ood of shape \(S, N, C\) \(3 dims\) or \(N, C\) \(2 dims\), got shape "
        r"\(1, .*\)\. Stack the draws/members on dim 0",
    ),
    "metrics: a loader of OOD inputs": (  # was: 'or an object with a .probs attribute'
        lambda tmp: pyrouq.Predictions(uniform(), torch.tensor([0, 1, 2])).evaluate(
            ood=pyrouq.ood_loader(8)
        ),
        TypeError,
        r"got TensorLoader, a loader or batches of inputs\? evaluate\(\) scores predictions, "
        r"not inputs: predict on them first",
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
    "checkpoint: metadata that is no dict": (
        lambda tmp: save(tmp / "x.pt", BayesianMLP(hidden_features=4), metadata=[1]),
        CheckpointError,
        r"Expected metadata to be a dict of JSON values, got list; load\(\) gives it back as "
        r"Checkpoint.metadata, a dict\. Pass e\.g\. metadata=\{'note': 'run 1'\}\.",
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
    "checkpoint: a learned noise scale not created yet": (
        lambda tmp: save(
            tmp / "x.pt", bayesian(torch.nn.Linear(3, 2), likelihood=pyrouq.Gaussian("learned"))
        ),
        CheckpointError,
        r"save\(\) got a BayesianNetwork whose parameters \['likelihood.raw_scale'\] are not "
        r"created yet .* fit it, or call it on a batch, before saving",
    ),
    "checkpoint: plain network without a skeleton": (
        lambda tmp: load(save(tmp / "x.pt", _residual())),
        CheckpointError,
        r"holds a plain network, a .*_Residual\. pyrouq never unpickles code.*"
        r"load\(path, module=net\)",
    ),
    "checkpoint: skeleton that does not match": (
        lambda tmp: load(save(tmp / "x.pt", bayesian(_residual())), module=_residual(width=5)),
        CheckpointError,
        r"skeleton .* does not match .*parameter 'conv.weight' is shape \(4, 1, 3, 3\) in the "
        r"checkpoint and shape \(5, 1, 3, 3\) in the skeleton",
    ),
    "checkpoint: skeleton with another activation": (
        lambda tmp: load(
            save(tmp / "x.pt", bayesian(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))),
            module=nn.Sequential(nn.Linear(2, 3), nn.Tanh()),
        ),
        CheckpointError,
        r"skeleton \(torch.nn.modules.container.Sequential\) does not match .*module '1' is a "
        r"ReLU in the checkpoint and a Tanh in the skeleton \(layers without parameters",
    ),
    "checkpoint: a guide saved with a BatchEnsemble": (
        lambda tmp: save(
            tmp / "x.pt",
            batchensemble(nn.Sequential(nn.Linear(2, 3)), 2),
            mean_field_guide(bayesian(nn.Sequential(nn.Linear(2, 3)))),
        ),
        CheckpointError,
        r"save\(\) got a guide for a BatchEnsemble \(BatchEnsembleNetwork\), whose members are "
        r"the draws. Leave it out \(guide=None\)",
    ),
    "checkpoint: a guide saved with a plain network taking an optional input": (
        lambda tmp: save(
            tmp / "x.pt",
            _Masked(),
            mean_field_guide(bayesian(nn.Sequential(nn.Linear(2, 3)))),
        ),
        CheckpointError,
        r"save\(\) got a guide for _Masked, which has no latent sites to draw \(if it is a Pyro "
        r"model of your own, save\(\) cannot rebuild it: save model.state_dict\(\) and "
        r"pyro.get_param_store\(\) with torch.save\). Save the model alone \(guide=None\)",
    ),
    "checkpoint: skeleton with an extra layer": (
        lambda tmp: load(
            save(tmp / "x.pt", batchensemble(nn.Sequential(nn.Linear(2, 3)), 2)),
            module=nn.Sequential(nn.Linear(2, 3), nn.Softmax(-1)),
        ),
        CheckpointError,
        r"module '1' is absent in the checkpoint and a Softmax in the skeleton",
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
        r"^fit\(checkpoint=\.\.\.\) saves with pyrouq\.save\(\), which refuses this run: save\(\) "
        r"cannot describe a _Subclass: .* Or leave checkpoint= out\.$",
    ),
    # bring your own network
    "bayesian: nothing to select": (
        lambda tmp: bayesian(torch.nn.Sequential(torch.nn.LayerNorm(3), torch.nn.ReLU())),
        ValueError,
        r"Sequential has no nn.Linear or convolution layer, so select=None picks nothing.*"
        r"Its parameters are '0.weight', '0.bias'; pass select=",
    ),
    "bayesian: last_layer of a network without a Linear": (
        lambda tmp: bayesian(torchvision.models.squeezenet1_1(num_classes=3), select="last_layer"),
        ValueError,
        r"select='last_layer' needs an nn.Linear, and SqueezeNet has none\. Pass select= the "
        r"names.*its last convolution, as select=\['classifier.1'\], if it makes the outputs",
    ),
    "bayesian: a forward of two inputs": (
        lambda tmp: bayesian(_TwoInputs()),
        TypeError,
        r"Cannot make Bayesian _TwoInputs: its forward takes 2 inputs \(a, b\), and pyrouq runs "
        r"a network on one input tensor x.*Wrap it in a module whose forward\(x\)",
    ),
    "batchensemble: a forward of two inputs": (
        lambda tmp: batchensemble(_TwoInputs(), 2),
        TypeError,
        r"Cannot convert into a BatchEnsemble _TwoInputs: its forward takes 2 inputs \(a, b\)",
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
        r"^prior= has batch_shape \(7,\), which does not broadcast to the shape \(4, 1, 3, 3\) "
        r"of site 'conv.weight', one of the sites it is the prior of\. Pass a scalar "
        r"distribution, or a dict of priors by site name",  # (one prior=, not the site's alone)
    ),
    "bayesian: a site's prior that does not fit it": (
        lambda tmp: bayesian(
            _residual(), prior={"conv.weight": pyro.distributions.Normal(torch.zeros(7), 1.0)}
        ),
        ValueError,
        r"The prior of 'conv.weight' has batch_shape \(7,\), which does not broadcast to the "
        r"site's shape \(4, 1, 3, 3\)\. Pass a scalar distribution or one of the site's shape",
    ),
    "bayesian: negative prior scale": (
        lambda tmp: bayesian(_residual(), prior={"conv.bias": -1.0}),
        ValueError,
        r"Expected the prior scale of 'conv.bias' > 0 .*got -1.0",
    ),
    "bayesian: a Delta prior": (
        lambda tmp: bayesian(
            _residual(), prior={"conv": pyro.distributions.Delta(torch.tensor(0.0))}
        ),
        ValueError,
        r"The prior of 'conv.weight' is a Delta, which fixes the weight: a guide's KL to it is "
        r"infinite\. Leave the parameter out of select=",
    ),
    "bayesian: one Delta prior for every site": (  # (was told to leave 'the parameter' out)
        lambda tmp: bayesian(_residual(), prior=pyro.distributions.Delta(torch.tensor(0.0))),
        ValueError,
        r"^prior= is a Delta, which would fix every latent weight: a guide's KL to it is "
        r"infinite\. Pass a prior with a spread, e\.g\. prior=1\.0; a parameter you mean",
    ),
    "KLWeightedELBO: vectorize_particles not a flag": (
        lambda tmp: KLWeightedELBO(vectorize_particles="yes"),
        TypeError,
        r"vectorize_particles.*True or False.*'yes'",
    ),
    "bayesian: forward returns no tensor": (
        lambda tmp: bayesian(_TupleNet())(torch.randn(2, 3)),
        TypeError,
        r"_TupleNet.forward returned tuple; pyrouq needs a network whose forward\(x\) returns "
        r"one tensor of outputs \(B, D\)",
    ),
    "bayesian: forward returns auxiliary logits": (
        lambda tmp: bayesian(torchvision.models.googlenet(num_classes=3, init_weights=True))(
            torch.randn(2, 3, 32, 32)
        ),
        TypeError,
        r"GoogLeNet.forward returned GoogLeNetOutputs; pyrouq needs a network whose forward\(x\) "
        r"returns one tensor .* It returns auxiliary outputs \('aux_logits2', 'aux_logits1'\) "
        r"beside the main ones in training mode: build it with aux_logits=False, or wrap it in "
        r"a small nn.Module whose forward returns the main logits \(net\(x\)\.logits\)\.$",
    ),
    "bayesian: forward returns outputs per pixel": (
        lambda tmp: bayesian(torch.nn.Conv2d(1, 3, 1))(torch.randn(2, 1, 4, 4)),
        ValueError,
        r"Conv2d.forward returned outputs of shape \(2, 3, 4, 4\) for 2 inputs; pyrouq needs one "
        r"row of outputs per input, \(2, D\)\. Outputs per pixel .*pool or flatten them",
    ),
    "batchensemble: forward returns outputs per pixel": (
        lambda tmp: pyrouq.batchensemble(torch.nn.Conv2d(1, 3, 1), 2)(torch.randn(2, 1, 4, 4)),
        ValueError,
        r"returned outputs of shape \(2, 3, 4, 4\) for 2 inputs; pyrouq needs one row of "
        r"outputs per input",
    ),
    "bayesian: not a module": (
        lambda tmp: bayesian("resnet18"),  # type: ignore[arg-type]
        TypeError,
        r"Expected an nn.Module to make Bayesian, got str",
    ),
    "predict: posterior_samples shaped (chain, draw, ...)": (
        lambda tmp: (
            lambda m: predict(
                m,
                torch.randn(3, 4),
                posterior_samples={
                    site: torch.zeros(1, 5, *shape) for site, shape in m.latent_sites().items()
                },
            )
        )(bayesian(torch.nn.Linear(4, 2))),
        ValueError,
        r"posterior_samples: site 'weight' has shape \(1, 5, 2, 4\), read as \(chain, draw\) = "
        r"\(1, 5\) before the site's shape \(2, 4\): predict\(\) takes the draws flattened, "
        r"\(S, \*shape\)\. Pass value.reshape\(-1, \*value.shape\[2:\]\)",
    ),
    "bayesian: lazy modules not yet materialised": (
        lambda tmp: bayesian(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(3))),
        ValueError,
        r"Cannot make Bayesian Sequential: its lazy modules have not created their parameters "
        r"yet \('1.weight', '1.bias'\). Run one batch through the network first",
    ),
    "batchensemble: lazy modules not yet materialised": (
        lambda tmp: pyrouq.batchensemble(torch.nn.Sequential(torch.nn.LazyConv2d(2, 3)), 2),
        ValueError,
        r"Cannot convert into a BatchEnsemble Sequential: its lazy modules .*'0.weight'",
    ),
    "bayesian: a network wrapped in nn.DataParallel": (
        lambda tmp: bayesian(torch.nn.DataParallel(torch.nn.Linear(4, 2))),
        TypeError,
        r"Cannot make Bayesian DataParallel: pass the network inside it \(net.module\). To "
        r"train on several devices, run fit\(\) under torch.distributed",
    ),
    "batchensemble: a network wrapped in nn.DataParallel": (
        lambda tmp: pyrouq.batchensemble(torch.nn.DataParallel(torch.nn.Linear(4, 2)), 2),
        TypeError,
        r"Cannot convert into a BatchEnsemble DataParallel: pass the network inside it",
    ),
    "rank1: a network wrapped in nn.DataParallel": (
        lambda tmp: pyrouq.rank1(torch.nn.DataParallel(torch.nn.Linear(4, 2)), 2),
        TypeError,
        r"Cannot convert into a rank-1 network DataParallel: pass the network inside it",
    ),
    "rank1: a TorchScript module": (
        lambda tmp: pyrouq.rank1(torch.jit.trace(torch.nn.Linear(4, 2), torch.randn(1, 4)), 2),
        TypeError,
        r"Cannot convert into a rank-1 network TopLevelTracedModule: it is a TorchScript "
        r"module, whose layers are compiled code.*Convert the nn.Module before torch.jit.script",
    ),
    "fit: a training batch of one input through a BatchNorm": (
        lambda tmp: (
            lambda m: fit(
                m,
                mean_field_guide(m),
                [
                    (torch.randn(4, 3), torch.tensor([0, 1, 0, 1])),
                    (torch.randn(1, 3), torch.tensor([1])),
                ],
                epochs=1,
                num_data=5,
                progress=False,
            )
        )(bayesian(_batchnorm_mlp())),
        ValueError,
        r"Batch 2 of epoch 1 holds 1 input\(s\) of shape \(3,\), and a BatchNorm in training mode "
        r"needs more than one value per channel.*drop_last=True",
    ),
    "fit: particles for a model without latent sites": (
        lambda tmp: _fit_a_linear_ensemble(2, num_particles=3),
        ValueError,
        r"num_particles=3 given for BatchEnsembleNetwork, which has no latent sites .*nothing to "
        r"draw.*Leave num_particles=1",
    ),
    "fit: a classifier with one output": (
        lambda tmp: _fit_a_linear_ensemble(1),
        ValueError,
        r"labels in \[0, 1\], expected class indices in \[0, 0\] for a model with 1 classes "
        r"\(a network with one output is a single logit.*give its last layer 2 outputs",
    ),
    "bayesian: unknown likelihood": (
        lambda tmp: bayesian(_residual(), likelihood="poisson"),  # type: ignore[arg-type]
        ValueError,
        r"Unknown likelihood 'poisson': expected one of \['categorical', 'gaussian'\]",
    ),
}


def _fit_a_linear_ensemble(outputs, **options):
    """fit() a 2-member BatchEnsemble of Linear(3, outputs) on one batch of 4 binary labels."""
    model = pyrouq.batchensemble(torch.nn.Linear(3, outputs), 2)
    batch = (torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    return fit(model, None, [batch], epochs=1, num_data=4, progress=False, **options)


class _Batches(torch.utils.data.IterableDataset):
    """Streams three pre-made batches of four examples."""

    def __iter__(self):
        for _ in range(3):
            yield torch.randn(4, 5), torch.tensor([0, 1, 2, 0])

    def __len__(self):
        return 3


class _Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 3)

    def forward(self, x, mask=None):
        return self.fc(x)


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, a, b):
        return self.fc(a + b)


def _batchnorm_mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_refused_with_a_clear_message(name, tmp_path):
    call, error, pattern = CASES[name]
    with pytest.raises(error) as info:
        call(tmp_path)
    assert re.search(pattern, str(info.value)), str(info.value)


@pytest.mark.parametrize("train", [False, True])
def test_auxiliary_outputs_are_refused_in_words_true_of_the_network(train):
    """The refusal of a namedtuple with aux... fields names the mode the network ran in, and
    offers aux_logits=False only to a network built with that flag (torchvision's)."""
    model = bayesian(_AuxNet()).train(train)
    with pytest.raises(TypeError) as info:
        model(torch.randn(2, 3))
    mode = "training" if train else "eval"
    assert str(info.value).endswith(
        f"It returns auxiliary outputs ('aux') beside the main ones in {mode} mode: wrap it "
        "in a small nn.Module whose forward returns the main logits (net(x).main)."
    ), str(info.value)


CLI_CASES = {
    "cli: unknown model": (["fit", "resnet"], r"unknown model 'resnet'; choose one of: bayes"),
    "cli: non-positive epochs": (["fit", "mlp", "--epochs", "0"], r"--epochs must be a positive"),
    "cli: batch size": (["fit", "mlp", "--batch-size", "x"], r"--batch-size must be a positive"),
    "cli: unknown dataset": (
        ["fit", "mlp", "--dataset", "cifar"],
        r"argument --dataset: invalid choice: 'cifar' \(choose from 'mnist', 'fashion-mnist'\)",
    ),
    "cli: --method for a built-in model": (
        ["fit", "mlp", "--method", "bayesian"],
        r"--method applies to a factory \(package.module:factory\); mlp is a built-in model",
    ),
    "cli: --norms for a model without members": (
        ["fit", "tests._factories:flat_mlp", "--norms", "per_member"],
        r"--norms per_member applies to --method batchensemble or rank1 with a factory",
    ),
    "cli: factory that does not exist": (
        ["fit", "tests._factories:nope"],
        r"'tests._factories' has no attribute 'nope' \(factory 'tests._factories:nope'\)",
    ),
    "cli: evaluate a missing folder": (
        ["evaluate", "/nonexistent/run"],
        r"RUN_DIR '/nonexistent/run' is not a folder; pass a folder of `pyrouq fit`",
    ),
    "cli: evaluate a folder without checkpoint": (
        ["evaluate", "tests"],
        r"'tests' has no checkpoint.pt; pass a folder of `pyrouq fit`",
    ),
    "cli: data from a missing root": (
        ["data", "--data-root", "/nonexistent"],
        r"^pyrouq: error: MNIST train file not found: expected /nonexistent/MNIST/raw/.*"
        r"To fix: pass a --data-root in torchvision layout",
    ),
}


# refused by argparse (its argument types and choices), which exits; main returns the others
ARGPARSE_REFUSALS = {
    "cli: unknown model", "cli: non-positive epochs", "cli: batch size", "cli: unknown dataset",
}  # fmt: skip


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_cli_refuses_with_one_line_and_exit_code_2(name, capsys):
    argv, pattern = CLI_CASES[name]
    exited = False
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code, exited = exit_.code, True
    assert code == 2
    assert exited == (name in ARGPARSE_REFUSALS)
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


# --------------------------------------------------------------------------------------------
# The public API, name by name (issue "bad input, round 2")
# --------------------------------------------------------------------------------------------
#
# One row per (public name, kind of bad argument): the kinds are type, shape, dtype, range,
# empty, nan (NaN/inf) and companion (a mismatched guide, model or data). Each row asserts a
# pyrouq error (CheckpointError is a ValueError) or ValueError / TypeError whose message says
# what was expected and what to do. test_every_public_name_has_a_case fails when a name is
# added to pyrouq.__all__ without a row here (or a reason in NOT_CALLED_WITH_USER_DATA).

NAN = float("nan")
U8_IMAGES = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
DTYPE_HINT = r"expects floating-point inputs, got a torch.uint8 tensor .*pyrouq.data.normalize"
MISMATCH = r"the guide does not belong to BayesianMLP: site 'fc1.weight' has shape \(120, 256\)"


def mlp_and_guide():
    model = BayesianMLP(hidden_features=4, num_data=10)
    return model, mean_field_guide(model)


def lenet_guide():
    return mean_field_guide(BayesianLeNet())


def flat_x(n=6):
    return torch.randn(n, 784)


def labels(n=6):
    return torch.arange(n) % 10


def flat_loader(images, targets):  # (torch.rand images: raw pixels are 0-255)
    return TensorLoader(
        images * 255, targets, 3, shuffle=False, flatten=True, normalize=False, seed=0
    )


def preds(n=6):
    return pyrouq.Predictions(torch.full((2, n, 10), 0.1), labels(n))


def gaussian_preds(n=6):
    return pyrouq.GaussianPredictions(torch.zeros(2, n, 1), torch.ones(2, n, 1))


class NeedsScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, *, scale):
        return self.fc(x) * scale


def pruned():
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    torch.nn.utils.prune.l1_unstructured(net[0], "weight", amount=0.5)
    return net


def pruned_after_a_pass():
    """Pruned, then run once without gradients: its weight is then a plain tensor, so the
    network copies, but the layer's hook still recomputes it."""
    net = pruned()
    with torch.no_grad():
        net(torch.randn(2, 4))
    return net


class Squeezed(torch.nn.Module):
    """A regression network whose forward drops its single output's dimension: (B,)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def with_model_guide(call):
    """``call(model, guide)`` on a tiny Bayesian MLP and its guide."""
    return lambda tmp: call(*mlp_and_guide())


API_CASES = [
    # -- networks ------------------------------------------------------------------------
    ("MLP", "range", lambda tmp: pyrouq.MLP(in_features=0), ValueError,
     r"Expected in_features to be a positive integer, got 0"),
    ("MLP", "shape", lambda tmp: pyrouq.MLP()(torch.randn(2, 5)), ValueError,
     r"MLP expects inputs of shape \(B, 784\).*got shape \(2, 5\). Flatten the images"),
    ("MLP", "dtype", lambda tmp: pyrouq.MLP()(torch.zeros(2, 784, dtype=torch.uint8)),
     TypeError, "MLP " + DTYPE_HINT),
    ("LeNet", "range", lambda tmp: pyrouq.LeNet(in_channels=-1), ValueError,
     r"Expected in_channels to be a positive integer, got -1"),
    ("LeNet", "shape", lambda tmp: pyrouq.LeNet()(torch.randn(2, 28, 28)), ValueError,
     r"LeNet expects images of shape \(B, 1, 28, 28\), got shape \(2, 28, 28\). Use load_mnist"),
    ("LeNet", "dtype", lambda tmp: pyrouq.LeNet()(U8_IMAGES), TypeError, "LeNet " + DTYPE_HINT),
    ("ResidualCNN", "range", lambda tmp: pyrouq.ResidualCNN(width=0), ValueError,
     r"Expected width to be a positive integer, got 0"),
    ("ResidualCNN", "shape", lambda tmp: pyrouq.ResidualCNN()(torch.randn(2, 28, 28)),
     ValueError, r"ResidualCNN expects images of shape \(B, 1, H, W\), got shape \(2, 28, 28\)"),
    ("ResidualCNN", "dtype", lambda tmp: pyrouq.ResidualCNN()(U8_IMAGES), TypeError,
     "ResidualCNN " + DTYPE_HINT),
    # -- layers --------------------------------------------------------------------------
    ("BatchEnsembleLinear", "range", lambda tmp: pyrouq.BatchEnsembleLinear(2, 3, 0),
     ValueError, r"Expected num_members to be an integer >= 1, got 0.*4 is a common choice"),
    ("BatchEnsembleLinear", "shape",
     lambda tmp: pyrouq.BatchEnsembleLinear(2, 3, 2)(torch.randn(4, 5)), ValueError,
     r"BatchEnsembleLinear\(2, 3, num_members=2\) expects inputs of shape \(M \* B, \.\.\., 2\), "
     r"got shape \(4, 5\)"),
    ("BatchEnsembleLinear", "companion",
     lambda tmp: pyrouq.BatchEnsembleLinear(4, 3, 2, base=nn.Linear(10, 7)), ValueError,
     r"BatchEnsembleLinear got sizes \(4, 3\) and base=Linear of sizes \(10, 7\): they must "
     r"agree. Use BatchEnsembleLinear.from_module\(base, M\)"),
    ("BatchEnsembleLinear", "type",
     lambda tmp: pyrouq.BatchEnsembleLinear.from_module(nn.Conv2d(2, 6, 3), 2), TypeError,
     r"BatchEnsembleLinear copies a Linear, got base=Conv2d"),
    ("BatchEnsembleConv2d", "companion",
     lambda tmp: pyrouq.BatchEnsembleConv2d.from_module(nn.Conv2d(2, 6, 3), 2, stride=2),
     ValueError, r"BatchEnsembleConv2d got base= and the settings \{'stride': 2\}: base brings "
     r"its own \(stride=\(1, 1\)\)"),
    ("BatchEnsembleConvTranspose2d", "type",
     lambda tmp: pyrouq.BatchEnsembleConvTranspose2d.from_module(nn.Conv2d(2, 6, 3), 2),
     TypeError, r"BatchEnsembleConvTranspose2d copies a ConvTranspose2d, got base=Conv2d"),
    ("BatchEnsembleLinear", "shape",
     lambda tmp: pyrouq.BatchEnsembleLinear(4, 3, 2)(torch.randn(4)), ValueError,
     r"BatchEnsembleLinear\(4, 3, num_members=2\) expects inputs of shape \(M \* B, \.\.\., 4\), "
     r"got shape \(4,\)"),
    ("BatchEnsembleLinear", "type",
     lambda tmp: pyrouq.BatchEnsembleLinear(2, 3, 2, init="zeros"),  # type: ignore[arg-type]
     ValueError, r"Unknown init 'zeros': expected 'normal' .* or 'random_sign'"),
    ("BatchEnsembleConv1d", "shape",
     lambda tmp: pyrouq.BatchEnsembleConv1d(2, 3, 3, 2)(torch.randn(3, 2, 8)), ValueError,
     r"with 2 members expects a folded batch of M \* B inputs .*got shape \(3, 2, 8\)"),
    ("BatchEnsembleConv2d", "type",
     lambda tmp: pyrouq.BatchEnsembleConv2d(2, 3, 3, num_members="4"),  # type: ignore[arg-type]
     ValueError, r"Expected num_members to be an integer >= 1, got '4'"),
    ("BatchEnsembleConv2d", "shape",
     lambda tmp: pyrouq.BatchEnsembleConv2d(2, 3, 3, 2)(torch.randn(4, 5, 8, 8)), ValueError,
     r"BatchEnsembleConv2d\(2, 3, kernel_size=\(3, 3\), .*num_members=2\) expects inputs of shape "
     r"\(M \* B, 2, H, W\), got shape \(4, 5, 8, 8\)"),
    ("BatchEnsembleConv3d", "range", lambda tmp: pyrouq.BatchEnsembleConv3d(2, 3, 3, 2, r_std=-1.0),
     ValueError, r"Expected r_std >= 0 \(a finite float\), got -1.0. It is the standard deviation"),
    ("BatchEnsembleConv3d", "shape",
     lambda tmp: pyrouq.BatchEnsembleConv3d(2, 3, 3, 2)(torch.randn(4, 2, 8, 8)), ValueError,
     r"expects inputs of shape \(M \* B, 2, D, H, W\), got shape \(4, 2, 8, 8\)"),
    ("BatchEnsembleConvTranspose1d", "shape",
     lambda tmp: pyrouq.BatchEnsembleConvTranspose1d(2, 3, 3, 2)(torch.randn(4, 5, 8)),
     ValueError,
     r"ConvTranspose1d\(2, 3, .*\) expects inputs of shape \(M \* B, 2, L\), got shape "
     r"\(4, 5, 8\)"),
    ("BatchEnsembleConvTranspose2d", "range",
     lambda tmp: pyrouq.BatchEnsembleConvTranspose2d(2, 3, 3, 0),
     ValueError, r"Expected num_members to be an integer >= 1, got 0"),
    ("BatchEnsembleConvTranspose2d", "shape",
     lambda tmp: pyrouq.BatchEnsembleConvTranspose2d(2, 3, 3, 2)(torch.randn(3, 2, 8, 8)),
     ValueError, r"with 2 members expects a folded batch of M \* B inputs .*\(3, 2, 8, 8\)"),
    ("BatchEnsembleConvTranspose3d", "range",
     lambda tmp: pyrouq.BatchEnsembleConvTranspose3d(2, 3, 3, 2, s_std=-1.0),
     ValueError, r"Expected s_std >= 0 \(a finite float\), got -1.0"),
    ("BayesianLinear", "nan", lambda tmp: pyrouq.BayesianLinear(2, 3, prior_scale=NAN),
     ValueError, r"Expected prior_scale > 0 \(a finite float\), got nan.*prior_scale=1.0"),
    ("BayesianLinear", "shape", lambda tmp: pyrouq.BayesianLinear(2, 3)(torch.randn(2, 5)),
     ValueError, r"BayesianLinear expects inputs of shape \(\.\.\., 2\), got shape \(2, 5\)"),
    ("BayesianConv2d", "range", lambda tmp: pyrouq.BayesianConv2d(1, 2, 3, prior_scale=-1.0),
     ValueError, r"Expected prior_scale > 0 \(a finite float\), got -1.0"),
    ("BayesianLinear", "type", lambda tmp: pyrouq.BayesianLinear(3.5, 2), ValueError,
     r"Expected BayesianLinear's in_features to be a positive integer, got 3.5\. Pass in_f"),
    ("BayesianConv2d", "range", lambda tmp: pyrouq.BayesianConv2d(1, 0, 3), ValueError,
     r"Expected BayesianConv2d's out_channels to be a positive integer, got 0\."),
    ("BayesianConv2d", "shape", lambda tmp: pyrouq.BayesianConv2d(1, 2, (3, 3, 3)), ValueError,
     r"kernel_size to be a positive int or a pair of them \(kh, kw\), got \(3, 3, 3\)\. Pass"),
    ("BayesianConv2d", "shape", lambda tmp: pyrouq.BayesianConv2d(1, 2, 3)(torch.randn(2, 3, 8, 8)),
     ValueError,
     r"BayesianConv2d expects inputs of shape \(B, 1, H, W\) .*got shape \(2, 3, 8, 8\)"),
    # -- models --------------------------------------------------------------------------
    ("BayesianMLP", "dtype",
     lambda tmp: BayesianMLP()(torch.zeros(2, 784, dtype=torch.uint8)), TypeError,
     "BayesianMLP " + DTYPE_HINT),
    ("BayesianMLP", "range", lambda tmp: BayesianMLP(hidden_features=0), ValueError,
     r"Expected hidden_features to be a positive integer, got 0"),
    ("BayesianLeNet", "range", lambda tmp: BayesianLeNet(prior_scale=0), ValueError,
     r"Expected prior_scale > 0 \(a finite float\), got 0"),
    ("BayesianLeNet", "dtype", lambda tmp: BayesianLeNet()(U8_IMAGES), TypeError,
     "BayesianLeNet " + DTYPE_HINT),
    ("BatchEnsembleMLP", "shape", lambda tmp: BatchEnsembleMLP()(torch.randn(2, 5)), ValueError,
     r"BatchEnsembleMLP expects inputs of shape \(B, 784\).*got shape \(2, 5\)"),
    ("BatchEnsembleMLP", "companion", lambda tmp: BatchEnsembleMLP(base=pyrouq.LeNet()),
     TypeError, r"BatchEnsembleMLP\(base=\) takes a pyrouq\.MLP, got LeNet\. For another "
     r"network, use pyrouq\.batchensemble\(net, num_members\)\."),
    ("BatchEnsembleMLP", "companion",
     lambda tmp: BatchEnsembleMLP(in_features=6, base=pyrouq.MLP(4, 8, 3)), ValueError,
     r"BatchEnsembleMLP: base= has another architecture than the arguments given beside it: "
     r"in_features=6 \(base has 4\)\. Pass base alone"),
    ("BatchEnsembleLeNet", "companion", lambda tmp: pyrouq.BatchEnsembleLeNet(base=pyrouq.MLP()),
     TypeError, r"BatchEnsembleLeNet\(base=\) takes a pyrouq\.LeNet, got MLP\."),
    ("BatchEnsembleLeNet", "range", lambda tmp: pyrouq.BatchEnsembleLeNet(num_members=0),
     ValueError, r"Expected num_members to be an integer >= 1, got 0"),
    ("BatchEnsembleLeNet", "dtype", lambda tmp: pyrouq.BatchEnsembleLeNet()(U8_IMAGES),
     TypeError, "BatchEnsembleLeNet " + DTYPE_HINT),
    ("BayesianNetwork", "type", lambda tmp: pyrouq.BayesianNetwork(3), TypeError,
     r"Expected an nn.Module to make Bayesian, got int"),
    ("BayesianNetwork", "dtype",
     lambda tmp: bayesian(pyrouq.MLP(4, 3, 2))(torch.zeros(2, 4, dtype=torch.int64)), TypeError,
     r"BayesianNetwork expects floating-point inputs, got a torch.int64 tensor.*x.float\(\)"),
    ("bayesian", "companion", lambda tmp: bayesian(pyrouq.MLP(4, 3, 2), select=["conv"]),
     ValueError, r"select entry 'conv' matches no parameter of MLP. Its parameters are 'fc1"),
    ("BatchEnsembleNetwork", "type", lambda tmp: pyrouq.BatchEnsembleNetwork("net", 4),
     TypeError, r"Expected an nn.Module to convert into a BatchEnsemble, got str"),
    ("batchensemble", "range", lambda tmp: pyrouq.batchensemble(pyrouq.MLP(), 0), ValueError,
     r"Expected num_members to be an integer >= 1, got 0"),
    ("batchensemble", "range", lambda tmp: pyrouq.batchensemble(pyrouq.ResidualCNN(), 2,
                                                                  norms="own"), ValueError,
     r"Unknown norms 'own': expected 'shared' \(one normalisation layer for all members"),
    ("batchensemble", "nan", lambda tmp: pyrouq.batchensemble(pyrouq.MLP(), 2, r_mean=NAN),
     ValueError, r"Expected r_mean to be a finite float, got nan\. It is the mean of the rank-1"),
    ("batchensemble", "type", lambda tmp: pyrouq.batchensemble(pyrouq.MLP(), 2, r_std="0.5"),
     ValueError, r"Expected r_std >= 0 \(a finite float\), got '0\.5' \(a string: pass a float, "
     r"r_std=0\.5\)\. It is the standard deviation"),
    ("BatchEnsembleLinear", "nan",
     lambda tmp: pyrouq.BatchEnsembleLinear(2, 3, 2, s_mean=float("inf")), ValueError,
     r"Expected s_mean to be a finite float, got inf\."),
    ("batchensemble", "type",
     lambda tmp: pyrouq.batchensemble(torch.nn.utils.weight_norm(torch.nn.Linear(3, 2)), 2),
     ValueError, r"Linear cannot be copied, so pyrouq cannot convert it into a BatchEnsemble "
     r"\(it converts a copy .*: '' is under the legacy torch\.nn\.utils\.weight_norm, and its "
     r"hook .* Use torch.nn.utils.parametrizations.weight_norm"),
    ("batchensemble", "type", lambda tmp: pyrouq.batchensemble(pruned_after_a_pass(), 2),
     ValueError, r"A BatchEnsemble cannot be built of layers whose weight a hook recomputes .*: "
     r"'0' \(pruned by torch\.nn\.utils\.prune\)\. Make the pruning permanent first, "
     r"torch\.nn\.utils\.prune\.remove\(layer, name\)\.$"),
    ("bayesian", "type", lambda tmp: pyrouq.bayesian(NeedsScale()), TypeError,
     r"Cannot make Bayesian NeedsScale: its forward requires the keyword argument\(s\) scale, "
     r"and pyrouq runs a network on one input tensor x alone\. Give them defaults"),
    ("bayesian", "type", lambda tmp: pyrouq.bayesian(pruned()), ValueError,
     r"Sequential cannot be copied, .*: '0' is pruned by torch\.nn\.utils\.prune, and its hook "
     r"keeps the weight as a computed tensor\. Make the pruning permanent first"),
    ("batchensemble", "empty", lambda tmp: pyrouq.batchensemble(torch.nn.ReLU(), 4), ValueError,
     r"ReLU has no nn.Linear or convolution layer to turn into BatchEnsemble layers. Pass a "),
    ("batchensemble", "dtype",
     lambda tmp: pyrouq.batchensemble(pyrouq.MLP(4, 3, 2), 2)(torch.zeros(2, 4, dtype=torch.bool)),
     TypeError, r"expects floating-point inputs, got a torch.bool tensor. Scale and normalise"),
    ("rank1", "range", lambda tmp: pyrouq.rank1(pyrouq.MLP(4, 3, 2), 2, prior_scale=0.0),
     ValueError, r"Expected prior_scale > 0 \(a finite float\), got 0.0. It is the standard "),
    ("rank1", "range", lambda tmp: pyrouq.rank1(pyrouq.MLP(4, 3, 2), 0), ValueError,
     r"Expected num_members to be an integer >= 1, got 0\. A rank-1 network needs at least one "
     r"member"),  # (it said "BatchEnsemble needs at least one member")
    ("rank1", "empty", lambda tmp: pyrouq.rank1(torch.nn.ReLU(), 4), ValueError,
     r"ReLU has no nn.Linear or convolution layer to turn into rank-1 layers\. Pass a "),
    ("rank1", "empty",
     lambda tmp: pyrouq.rank1(pyrouq.batchensemble(torch.nn.Sequential(torch.nn.Linear(2, 2)),
                                                   2).net, 2),
     ValueError, r"Sequential has no plain nn.Linear or convolution layer to turn into rank-1 "
     r"layers: its layers '0' are BatchEnsemble layers already"),
    ("rank1", "type", lambda tmp: pyrouq.rank1(pyrouq.batchensemble(pyrouq.MLP(4, 3, 2), 2), 2),
     TypeError, r"rank1\(\) converts a plain network and got a BatchEnsembleMLP, already a "),
    ("rank1", "companion",
     lambda tmp: bayesian(pyrouq.batchensemble(pyrouq.MLP(4, 3, 2), 2),
                          local_reparameterization=True),
     ValueError, r"a BatchEnsemble's layers draw their rank-1 factors instead. Leave local_"),
    ("rank1", "dtype",
     lambda tmp: pyrouq.rank1(pyrouq.MLP(4, 3, 2), 2)(torch.zeros(2, 4, dtype=torch.uint8)),
     TypeError, r"BayesianNetwork expects floating-point inputs, got a torch.uint8 tensor"),
    # -- inference -----------------------------------------------------------------------
    ("MeanFieldGuide", "type", lambda tmp: pyrouq.MeanFieldGuide(pyrouq.MLP()), TypeError,
     r"mean_field_guide\(\) needs a pyrouq Bayesian model .*got MLP. For other Pyro models"),
    ("MeanFieldGuide", "companion",
     lambda tmp: pyrouq.MeanFieldGuide(BayesianMLP(hidden_features=4), init_from=pyrouq.LeNet()),
     ValueError, r"init_from parameter 'fc1.weight' has shape \(120, 256\), expected \(4, 784\)"),
    ("mean_field_guide", "range", lambda tmp: mean_field_guide(BayesianMLP(), init_scale=0.0),
     ValueError, r"Expected init_scale > 0 \(a finite float\), got 0.0.*the default is 1e-2"),
    ("mean_field_guide", "nan", lambda tmp: mean_field_guide(BayesianMLP(), init_scale=math.inf),
     ValueError, r"Expected init_scale > 0 \(a finite float\), got inf"),
    ("mean_field_guide", "type",  # a Decimal: no float to pyrouq, told the float to pass
     lambda tmp: mean_field_guide(BayesianMLP(), init_scale=Decimal("1e-3")), ValueError,
     r"got Decimal\('0\.001'\) \(a Decimal: pass a float, init_scale=0\.001\)\. It is the"),
    ("KLWeightedELBO", "nan", lambda tmp: KLWeightedELBO(kl_weight=NAN), ValueError,
     r"Expected kl_weight to be a finite float >= 0, got nan. kl_weight = 1 is the exact ELBO"),
    ("KLWeightedELBO", "range", lambda tmp: KLWeightedELBO(num_particles=0), ValueError,
     r"Expected num_particles to be an integer >= 1, got 0"),
    ("fit", "type", lambda tmp: fit("model", None, [], epochs=1), TypeError,
     r"fit\(\) expects model to be an nn.Module .*got str; build it with e.g. bayesian\(net\)"),
    ("predict", "shape", lambda tmp: predict(nn.Linear(4, 1), torch.randn(3, 4)), ValueError,
     r"predict\(\) got logits of one class \(outputs of shape \(1, 3, 1\)\): every probability "
     r"would be 1. .*bayesian\(net, likelihood='gaussian'\)"),
    ("fit", "type", lambda tmp: fit(lambda x, y=None: None, None, [], epochs=1), TypeError,
     r"got function; .* A Pyro model written as a function: wrap it in a PyroModule whose "
     r"forward\(x, y\) calls it, or train it with pyro.infer.SVI"),
    ("fit", "type",
     with_model_guide(lambda m, g: fit(m, g, [{"x": torch.rand(6, 784), "y": labels()}],
                                       epochs=1, num_data=6, progress=False)),
     TypeError, r"batch 1 of epoch 1 is a dict with keys 'x', 'y'\. Map it to pairs, e\.g\. "
     r"a collate_fn .*\.default_collate\(items\); return b\['x'\], b\['y'\]; then "),
    ("fit", "companion",
     lambda tmp: fit(BayesianMLP(), lenet_guide(), flat_loader(torch.rand(6, 784), labels()),
                     epochs=1, progress=False),
     ValueError, r"fit\(\): the guide does not belong to BayesianMLP: site 'fc1.weight'"),
    ("fit", "companion",
     with_model_guide(lambda m, g: fit(BatchEnsembleMLP(num_members=2), g,
                                       flat_loader(torch.rand(6, 784), labels()), epochs=1,
                                       progress=False)),
     ValueError, r"fit\(\) got a guide for a BatchEnsemble \(BatchEnsembleMLP\), whose members "
     r"are the draws. Leave it out \(guide=None\); to draw weights, make the network Bayesian "
     r"first: pyrouq.bayesian\(net\), or pyrouq.rank1\(net, M\)"),
    ("fit", "companion",
     with_model_guide(lambda m, g: fit(MLP(), g, flat_loader(torch.rand(6, 784), labels()),
                                       epochs=1, progress=False)),
     ValueError, r"fit\(\) got a guide for a plain network \(MLP\), which has no weights to "
     r"draw. Leave it out \(guide=None\)"),
    ("fit", "dtype",
     with_model_guide(lambda m, g: fit(m, g, torch.utils.data.DataLoader(
         torch.utils.data.TensorDataset(torch.zeros(6, 784, dtype=torch.uint8), labels()),
         batch_size=3), epochs=1, progress=False)),
     TypeError, "fit\\(\\) " + DTYPE_HINT),
    ("fit", "nan",
     with_model_guide(lambda m, g: fit(m, g, flat_loader(torch.rand(6, 784), labels()),
                                       epochs=1, lr=NAN, progress=False)),
     ValueError, r"Expected lr > 0 \(a finite float\), got nan"),
    ("fit", "empty",
     with_model_guide(lambda m, g: fit(m, g, torch.utils.data.DataLoader(
         torch.utils.data.TensorDataset(torch.zeros(0, 784), torch.zeros(0, dtype=torch.long)),
         batch_size=3), epochs=1, progress=False)),
     ValueError, r"train_loader is empty \(its dataset holds 0 examples\). Pass a loader"),
    ("fit", "shape",
     lambda tmp: fit(torch.nn.Sequential(torch.nn.Linear(784, 10)), None,
                     load_mnist(batch_size=4, train_size=8)[0], epochs=1, progress=False),
     ValueError, r"fit\(\): Sequential failed on the first examples of train_loader \(x "
     r"of shape \(2, 1, 28, 28\).*at '0' of the network\): the model's input, of 28 features "
     r"where this layer takes 784\. Flatten it, x\.flatten\(1\), or put nn\.Flatten\(\) first"),
    # -- prediction ----------------------------------------------------------------------
    ("predict", "dtype", lambda tmp: predict(BayesianLeNet(), U8_IMAGES, lenet_guide()),
     TypeError, r"predict\(\) " + DTYPE_HINT + r".*load_mnist\(\)"),
    ("predict", "companion", lambda tmp: predict(BayesianMLP(), flat_x(), lenet_guide()),
     ValueError, r"predict\(\): " + MISMATCH + r" in the guide but \(256, 784\) in the model. "
     r"Pass the guide built for this model"),
    ("predict", "nan",
     with_model_guide(lambda m, g: predict(m, torch.full((2, 784), NAN), g)), ValueError,
     r"predict\(\): x holds NaN or inf in 2 of the 2 inputs of its batch from input 0 \(rows "
     r"\[0, 1\]\).*torch.nan_to_num"),
    ("predict", "nan",  # the rows of x, not of the batch
     with_model_guide(lambda m, g: predict(
         m, torch.cat([flat_x(20), torch.full((1, 784), NAN)]), g, batch_size=8)),
     ValueError, r"x holds NaN or inf in 1 of the 5 inputs of its batch from input 16 "
     r"\(rows \[20\]\)"),
    ("predict", "companion", with_model_guide(lambda m, g: predict(MLP(), flat_x(), g)),
     ValueError, r"predict\(\) got a guide for a plain network \(MLP\), which has no weights to "
     r"draw. Leave it out"),
    ("predict", "companion",
     with_model_guide(lambda m, g: predict(BatchEnsembleMLP(num_members=2), flat_x(), g)),
     ValueError, r"got a guide for a BatchEnsemble \(BatchEnsembleMLP\), whose members are the "
     r"draws"),
    ("predict", "shape",
     lambda tmp: predict(bayesian(torch.nn.Linear(4, 3)), torch.randn(5, 4), posterior_samples={
         "weight": torch.zeros(0, 3, 4), "bias": torch.zeros(0, 3)}),
     ValueError, r"posterior_samples: site 'weight' has no draws \(S = 0\), shape \(0, 3, 4\)"),
    ("predict", "empty", with_model_guide(lambda m, g: predict(m, torch.zeros(0, 784), g)),
     ValueError, r"predict\(\) got no inputs: x is empty"),
    ("predict", "shape", with_model_guide(lambda m, g: predict(m, torch.tensor(0.5), g)),
     ValueError, r"predict\(\) expects a batch of inputs, the examples on dim 0, got a 0-d "
     r"tensor \(0.5\)\. Pass one example as x.reshape\(1, \*shape\)"),
    ("predict", "type", with_model_guide(lambda m, g: predict(m, [1, 2], g)), TypeError,
     r"predict\(\) expects x as a tensor or an iterable of tensors / \(x, y\) batches; a batch "
     r"was an int\.$"),
    ("predict", "type", with_model_guide(lambda m, g: predict(m, (flat_x(), labels()), g)),
     TypeError, r"got a tuple of two tensors that looks like one \(x, y\) pair \(shapes "
     r"\(6, 784\) and \(6,\)\).* Pass the inputs alone, x=x, or the pair as a list of "
     r"batches, \[\(x, y\)\]\.$"),
    ("predict", "type",
     with_model_guide(lambda m, g: predict(m, [{"image": torch.rand(2, 784)}], g)), TypeError,
     r"a batch was a dict with keys 'image'\. Map it to tensors of inputs, e\.g\. a collate_fn"),
    ("predict", "range", with_model_guide(lambda m, g: predict(m, flat_x(), g, num_samples=0)),
     ValueError, r"Expected num_samples to be a positive integer, got 0"),
    ("Predictions", "shape", lambda tmp: pyrouq.Predictions(torch.full((6, 10), 0.1)),
     ValueError, r"probs"),
    ("Predictions", "companion",
     lambda tmp: pyrouq.Predictions(torch.full((2, 6, 10), 0.1), torch.arange(5)), ValueError,
     r"Expected targets of shape \(N,\) = \(6,\), one label per input of probs, got shape \(5,\)"),
    ("Predictions", "range", lambda tmp: pyrouq.Predictions(torch.full((2, 6, 10), 0.5)),
     ValueError, r"probs"),
    ("Predictions", "nan", lambda tmp: pyrouq.Predictions(torch.full((2, 6, 10), NAN)),
     ValueError, r"Expected finite probs, got 120 NaN or inf entries; check the model outputs"),
    ("evaluate", "type", lambda tmp: pyrouq.evaluate("probs", labels()), TypeError,
     r"Expected predictions to be an \(S, N, C\) or \(N, C\) probability tensor .*got str"),
    ("evaluate", "dtype", lambda tmp: pyrouq.evaluate(preds().probs, torch.zeros(6)), TypeError,
     r"Expected integer targets \(class indices\), got dtype torch.float32; convert them"),
    ("evaluate", "companion", lambda tmp: pyrouq.evaluate(preds(), torch.arange(5)), ValueError,
     r"Expected targets of shape \(N,\) = \(6,\), one label per input of predictions, got "
     r"shape \(5,\)"),  # (its argument is predictions: it said "of probs")
    ("evaluate", "shape", lambda tmp: pyrouq.evaluate(preds(), labels()[:, None]), ValueError,
     r"got shape \(6, 1\); labels in a column \(or a row\)\? pass them as one dim, "
     r"targets.reshape\(-1\)"),  # was told to pass the labels of the inputs, which it held
    ("evaluate", "shape", lambda tmp: pyrouq.evaluate(preds(), labels()[None]), ValueError,
     r"got shape \(1, 6\); labels in a column \(or a row\)\? pass them as one dim"),
    ("evaluate", "shape", lambda tmp: pyrouq.evaluate(preds(1), labels(1)[0]), ValueError,
     r"got shape \(\); one label as a 0-d tensor \(y\[i\]\)\? pass it as one dim, "
     r"targets.reshape\(-1\)"),  # was told to pass the label of the input, which it held
    ("evaluate", "shape", lambda tmp: pyrouq.evaluate(preds(), labels().reshape(2, 3)),
     ValueError, r"got shape \(2, 3\); pass the labels of exactly the inputs that were predicted"),
    ("evaluate", "shape",
     lambda tmp: pyrouq.evaluate(preds(), torch.nn.functional.one_hot(labels(), 10)), ValueError,
     r"got shape \(6, 10\); one-hot targets\? pass their class indices, targets.argmax\(-1\)"),
    ("decompose", "nan", lambda tmp: decompose(torch.full((2, 6, 10), NAN)), ValueError,
     r"Expected finite probs, got 120 NaN or inf entries"),
    ("decompose", "range",
     lambda tmp: decompose(torch.tensor([[[1.0009, 0.0]], [[0.0, 1.0009]]], dtype=torch.float64)),
     ValueError, r"Expected probs to be probabilities of at most 1, got a maximum of 1.0009. "
     r"Normalise them exactly"),
    ("decompose", "range", lambda tmp: decompose(preds().probs, base=-1.0), ValueError,
     r"Expected a logarithm base > 1, got -1.0 \(a logarithm needs a positive base\); use math.e"),
    ("Decomposition", "shape",
     lambda tmp: pyrouq.Decomposition(torch.ones(3), torch.ones(2), torch.ones(3)), ValueError,
     r"Expected total, aleatoric and epistemic of one shape \(N,\), got .*made by decompose"),
    ("Decomposition", "type",
     lambda tmp: pyrouq.Decomposition([1.0], torch.ones(1), torch.ones(1)),  # type: ignore[arg-type]
     TypeError, r"Expected total to be a torch.Tensor, got list"),
    ("evaluate_rotations", "nan",
     with_model_guide(lambda m, g: pyrouq.evaluate_rotations(m, flat_x(), labels(), g,
                                                             angles=[NAN])),
     ValueError, r"Expected each angle to be a finite number of degrees, got nan"),
    ("evaluate_rotations", "companion",
     with_model_guide(lambda m, g: pyrouq.evaluate_rotations(m, flat_x(), labels(3), g)),
     ValueError, r"Expected y of shape \(N,\) = \(6,\), one label per image of x, got shape "
     r"\(3,\); pass the labels of exactly the images of x\.$"),  # (it said no what to do)
    ("evaluate_rotations", "shape",
     with_model_guide(lambda m, g: pyrouq.evaluate_rotations(
         m, flat_x(), torch.nn.functional.one_hot(labels(), 10), g)),
     ValueError, r"got shape \(6, 10\); one-hot targets\? pass their class indices, "
     r"y.argmax\(-1\)\.$"),
    ("evaluate_rotations", "shape",
     with_model_guide(lambda m, g: pyrouq.evaluate_rotations(m, flat_x(), labels()[:, None], g)),
     ValueError, r"got shape \(6, 1\); labels in a column \(or a row\)\? pass them as one "
     r"dim, y.reshape\(-1\)\.$"),
    ("evaluate_rotations", "dtype",
     lambda tmp: pyrouq.evaluate_rotations(BayesianLeNet(), U8_IMAGES, labels(2), lenet_guide()),
     TypeError, r"Expected floating-point images, got dtype torch.uint8"),
    ("format_table", "type", lambda tmp: pyrouq.format_table([1, 2]), TypeError,
     r"Expected metrics to be a dict of name -> value, got list; pass what evaluate\(\)"),
    ("format_rotation_table", "empty", lambda tmp: pyrouq.format_rotation_table([]), ValueError,
     r"Expected at least one row, got none; pass evaluate_rotations"),
    # -- diagnostics ---------------------------------------------------------------------
    ("psis_diagnostic", "companion",
     lambda tmp: psis_diagnostic(BayesianMLP(hidden_features=4), lenet_guide(), flat_x(),
                                 labels()),
     ValueError, r"psis_diagnostic\(\): the guide does not belong to BayesianMLP"),
    ("psis_diagnostic", "range",
     with_model_guide(lambda m, g: psis_diagnostic(m, g, flat_x(), labels(), num_samples=3)),
     ValueError, r"Expected num_samples to be an integer >= 25, got 3"),
    ("psis_diagnostic", "nan",
     with_model_guide(lambda m, g: psis_diagnostic(m, g, torch.full((6, 784), NAN), labels())),
     ValueError, r"psis_diagnostic\(\): x holds NaN or inf in 6 of 6 inputs"),
    ("to_inference_data", "companion",
     lambda tmp: to_inference_data(BayesianMLP(hidden_features=4), lenet_guide(), flat_x(),
                                   labels(), num_samples=2),
     ValueError, r"to_inference_data\(\): the guide does not belong to BayesianMLP"),
    ("to_inference_data", "nan",
     with_model_guide(lambda m, g: to_inference_data(m, g, torch.full((6, 784), math.inf),
                                                     labels(), num_samples=2)),
     ValueError, r"to_inference_data\(\): x holds NaN or inf in 6 of 6 inputs"),
    ("to_inference_data", "dtype",
     lambda tmp: to_inference_data(BayesianLeNet(), lenet_guide(), U8_IMAGES, labels(2),
                                   num_samples=2),
     TypeError, r"to_inference_data\(\) " + DTYPE_HINT),
    ("summary", "type", lambda tmp: pyrouq.summary("idata"), TypeError,
     r"Expected idata to be an arviz.InferenceData, got str; make one with to_inference_data"),
    # -- checkpoints ---------------------------------------------------------------------
    ("save", "companion", lambda tmp: save(tmp / "a.pt", BayesianMLP(), lenet_guide()),
     ValueError, r"save\(\): the guide does not belong to BayesianMLP"),
    ("save", "type", lambda tmp: save(tmp / "b.pt", "model"), CheckpointError,
     r"save\(\) cannot describe a str: expected a model made by pyrouq.bayesian\(\)"),
    ("save", "range", with_model_guide(lambda m, g: save(Path(tempfile.gettempdir()), m, g)),
     CheckpointError, r"save\(\) needs a file path, got the folder .*pass e.g. .*checkpoint.pt"),
    ("load", "empty", lambda tmp: load(tmp), CheckpointError, r"No checkpoint at .*: the path "
     r"is a folder\. Pass the path that pyrouq.save\(\)"),
    ("load", "companion", other_class_checkpoint, CheckpointError, r"BayesianMLP"),
    ("load", "type", lambda tmp: load(save(tmp / "m.pt", BayesianMLP()), model_class=3),
     TypeError, r"Expected model_class to be a model class or its name, got 3\. Pass e\.g\. "
     r"model_class=pyrouq\.BayesianLeNet, or leave it out\."),

    # -- data and plots ------------------------------------------------------------------
    ("load_mnist", "range", lambda tmp: load_mnist(batch_size=0), ValueError,
     r"Expected batch_size to be a positive integer, got 0"),
    ("load_fashion_mnist", "range", lambda tmp: pyrouq.load_fashion_mnist(batch_size=-3),
     ValueError, r"Expected batch_size to be a positive integer, got -3. Pass e.g. batch_size"),
    ("load_fashion_mnist", "empty", lambda tmp: pyrouq.load_fashion_mnist(root=tmp),
     FileNotFoundError, r"FashionMNIST train file not found: .*To fix: pass a root="),
    ("mnist_arrays", "range", lambda tmp: pyrouq.mnist_arrays("dev"), ValueError,  # type: ignore[arg-type]
     r"Unknown split 'dev': expected 'train' or 'test'"),
    ("fashion_mnist_arrays", "range", lambda tmp: pyrouq.fashion_mnist_arrays("val"),  # type: ignore[arg-type]
     ValueError, r"Unknown split 'val': expected 'train' or 'test'"),
    ("ood_loader", "range", lambda tmp: pyrouq.ood_loader(dataset="cifar"),  # type: ignore[arg-type]
     ValueError, r"Unknown dataset 'cifar': expected 'fashion-mnist' .* or 'mnist'"),
    ("rotate", "nan", lambda tmp: pyrouq.rotate(torch.randn(2, 28, 28), NAN), ValueError,
     r"Expected angle to be a finite number of degrees, got nan"),
    ("rotate", "shape", lambda tmp: pyrouq.rotate(torch.randn(2, 4, 5, 5), 10.0), ValueError,
     r"Expected images of shape \(N, 1, H, W\) or \(N, 3, H, W\) \(grey or RGB\), .*got shape "
     r"\(2, 4, 5, 5\); 4 channels are not supported, only 1 \(grey\) or 3 \(RGB\)"),
    ("rotate", "dtype", lambda tmp: pyrouq.rotate(U8_IMAGES, 10.0), TypeError,
     r"Expected floating-point images, got dtype torch.uint8; for raw uint8 pixels"),
    ("plot_image_grid", "companion",
     lambda tmp: pyrouq.plot_image_grid(preds(), torch.randn(3, 28, 28)), ValueError,
     r"Expected images with N=6 entries, one per input of the predictions, got shape"),
    ("plot_image_grid", "range", lambda tmp: pyrouq.plot_image_grid(preds(), torch.randn(6, 28, 28),
                                                                      rows=0),
     ValueError, r"Expected rows to be a positive integer, got 0"),
    ("plot_most_uncertain", "range",
     lambda tmp: pyrouq.plot_most_uncertain(preds(), torch.randn(6, 28, 28), k=0), ValueError,
     r"Expected k to be a positive integer, got 0. It is the number of images to show"),
    ("plot_most_uncertain", "type",
     lambda tmp: pyrouq.plot_most_uncertain(preds(), torch.randn(6, 28, 28), component="x"),  # type: ignore[arg-type]
     ValueError, r"Unknown component 'x'; expected one of 'total', 'aleatoric', 'epistemic'"),
    ("plot_reliability", "range", lambda tmp: pyrouq.plot_reliability(preds(), num_bins=0),
     ValueError, r"Expected num_bins to be a positive integer, got 0"),
    ("plot_reliability", "empty", lambda tmp: pyrouq.plot_reliability(preds().probs), ValueError,
     r"No targets: pass targets=\(N,\) labels, or Predictions that carry them"),
    ("plot_risk_coverage", "companion",
     lambda tmp: pyrouq.plot_risk_coverage(preds().probs, torch.arange(3)), ValueError,
     r"Expected targets of shape \(N,\) = \(6,\)"),
    ("plot_rotation", "empty", lambda tmp: pyrouq.plot_rotation([]), ValueError,
     r"Expected at least one row, got none"),
    ("plot_rotation", "shape", lambda tmp: pyrouq.plot_rotation([{"angle": 0}]), ValueError,
     r"A rotation row lacks the key\(s\) \['acc', 'ece', 'epistemic', 'total'\]"),
    ("plot_training_curves", "empty", lambda tmp: pyrouq.plot_training_curves([]), ValueError,
     r"Expected fit_result with at least one epoch, got an empty history"),
    ("plot_training_curves", "type", lambda tmp: pyrouq.plot_training_curves("x"), TypeError,  # type: ignore[arg-type]
     r"Expected fit_result to be a FitResult .*got str"),
    ("plot_uncertainty_distributions", "type",
     lambda tmp: pyrouq.plot_uncertainty_distributions(preds(), kind="pie"),  # type: ignore[arg-type]
     ValueError, r"Unknown kind 'pie'; expected one of 'hist', 'ecdf'"),
    ("plot_uncertainty_distributions", "range",
     lambda tmp: pyrouq.plot_uncertainty_distributions(preds(), bins=0), ValueError,
     r"Expected bins to be a positive integer, got 0"),
    ("plot_uncertainty_distributions", "companion",
     lambda tmp: pyrouq.plot_uncertainty_distributions(preds(), torch.full((4, 5), 0.2)),
     ValueError, r"Expected ood with C=10 classes like in_dist, got shape \(4, 5\); predict "
     r"both with the same model\."),  # (other draw counts: warned, as evaluate() does)
    ("save_figures", "type", lambda tmp: pyrouq.save_figures([1], tmp), TypeError,  # type: ignore[arg-type]
     r"Expected figures to be a dict of name -> Figure, got list"),
    ("save_figures", "companion",
     lambda tmp: pyrouq.save_figures({}, save(tmp / "c.pt", *mlp_and_guide())), ValueError,
     r"Expected out_dir to be a folder, got the file .*c.pt"),
    ("likelihoods.get_likelihood", "range", lambda tmp: get_likelihood("poisson"), ValueError,
     r"Unknown likelihood 'poisson': expected one of \['categorical', 'gaussian'\] or a "),
    ("likelihoods.get_likelihood", "type", lambda tmp: get_likelihood(3), ValueError,  # type: ignore[arg-type]
     r"Unknown likelihood 3: expected one of"),
    ("likelihoods.Categorical", "dtype",
     lambda tmp: BayesianMLP(hidden_features=4, num_data=4)(flat_x(2), torch.zeros(2)),
     ValueError, r"BayesianMLP: labels of dtype torch.float32, expected an integer dtype .*y.long"),
    ("likelihoods.Categorical", "shape",
     lambda tmp: Categorical().check_targets(labels(3), torch.zeros(2, 10), "my model"),
     ValueError, r"my model: expected labels y of shape \(2,\) to match the 2 inputs, got shape "
     r"\(3,\). Pass one integer label per input"),
    ("likelihoods.Categorical", "shape",
     lambda tmp: Categorical().check_targets(torch.eye(3)[[0, 2]], torch.zeros(2, 3), "m"),
     ValueError, r"expected labels y of shape \(2,\) .*got shape \(2, 3\)\. Pass one integer label "
     r"per input \(one-hot labels: y.argmax\(-1\)\)"),
    ("likelihoods.Categorical", "shape",
     lambda tmp: Categorical().observe(torch.zeros(4), torch.zeros(4, dtype=torch.long), 4, "m"),
     ValueError, r"m: the outputs have shape \(4,\), expected \(B, D\).*outputs.unsqueeze\(-1\)"),
    ("likelihoods.Gaussian", "shape",
     lambda tmp: pyrouq.Gaussian(0.5).check_targets(torch.tensor(1.0), torch.zeros(1, 1), "m"),
     ValueError, r"m: a 0-d target tensor \(1\), expected one target per input.*y.reshape\(1\)"),
    ("likelihoods.Categorical", "range",
     lambda tmp: Categorical().check_targets(torch.tensor([0, 12]), torch.zeros(2, 10), "m"),
     ValueError, r"m: labels in \[0, 12\], expected class indices in \[0, 9\] for a model"),
    # -- regression ----------------------------------------------------------------------
    ("Gaussian", "type", lambda tmp: pyrouq.Gaussian(torch.tensor([0.5, 0.2])), TypeError,
     r"got a torch.float32 tensor of shape \(2,\); for one noise scale per output pass "
     r"'learned', or a prior of batch shape \(D,\), e.g. dist.HalfNormal\(torch.ones\(D\)\)"),
    ("Gaussian", "range", lambda tmp: pyrouq.Gaussian(scale=0.0), ValueError,
     r"Expected the Gaussian noise scale > 0 \(a finite float\), got 0.0. Pass the noise"),
    ("Gaussian", "shape",
     lambda tmp: bayesian(torch.nn.Linear(3, 3), likelihood=pyrouq.Gaussian("heteroscedastic"),
                          num_data=4)(torch.randn(4, 3), torch.randn(4)),
     ValueError, r"needs a network with 2D outputs \(D means, then D raw scales\), got 3"),
    ("Gaussian", "shape",  # 2 outputs read as 1 mean and 1 scale, for targets (N, 2)
     lambda tmp: pyrouq.Gaussian("heteroscedastic").check_targets(
         torch.zeros(3, 2), torch.zeros(3, 2), "m"),
     ValueError, r"m: targets of shape \(3, 2\), expected \(N, 1\) or \(N,\): the network has 2 "
     r"outputs, read as 1 mean\(s\) then 1 scale\(s\).*its last layer needs 2D outputs"),
    ("fit", "shape",  # a regression network that squeezes its single output away
     lambda tmp: fit(*(lambda m: (m, mean_field_guide(m)))(
         bayesian(Squeezed(), likelihood=pyrouq.Gaussian(0.3))),
         pyrouq.ArrayLoader(torch.randn(8, 2), torch.randn(8), 4), epochs=1, progress=False),
     TypeError, r"Squeezed.forward returned shape \(\d+,\) for \d+ inputs: one value per input, "
     r"without the outputs' dimension.*drop the forward's .squeeze\(-1\) or return "
     r"outputs.unsqueeze\(-1\)"),
    ("fit", "dtype",  # real-valued targets on a classifier: the regression likelihood is named
     lambda tmp: fit(*(lambda m: (m, mean_field_guide(m)))(bayesian(torch.nn.Linear(2, 1))),
                     pyrouq.ArrayLoader(torch.randn(8, 2), torch.randn(8), 4), epochs=1,
                     progress=False),
     ValueError, r"labels of dtype torch.float32, expected an integer dtype \(class indices: "
     r"y.long\(\); real-valued targets are regression, for a model built with "
     r"likelihood='gaussian' \(bayesian\(net, likelihood='gaussian'\) or "
     r"batchensemble\(net, M, likelihood='gaussian'\)\)\)"),
    ("likelihoods.Gaussian", "dtype",
     lambda tmp: bayesian(torch.nn.Linear(3, 1), likelihood="gaussian", num_data=4)(
         torch.randn(4, 3), torch.arange(4)),
     ValueError, r"targets of dtype torch.int64, expected real values .*Categorical likelihood"),
    ("likelihoods.Gaussian", "nan",
     lambda tmp: bayesian(torch.nn.Linear(3, 1), likelihood="gaussian", num_data=4)(
         torch.randn(4, 3), torch.tensor([0.0, NAN, 0.0, 0.0])),
     ValueError, r"NaN or inf targets at rows \[1\]; remove or repair them"),
    ("Categorical", "range",
     lambda tmp: pyrouq.Categorical().check_targets(torch.tensor([0, 12]), torch.zeros(2, 10), "m"),
     ValueError, r"m: labels in \[0, 12\], expected class indices in \[0, 9\]"),
    ("GaussianPredictions", "range",
     lambda tmp: pyrouq.GaussianPredictions(torch.zeros(2, 3, 1), -torch.ones(2, 3, 1)),
     ValueError, r"Expected scale > 0 everywhere: they are standard deviations"),
    ("GaussianPredictions", "shape",
     lambda tmp: pyrouq.GaussianPredictions(torch.zeros(3, 1), torch.ones(3, 1)), ValueError,
     r"Expected loc of shape \(S, N, D\) with S, N, D >= 1, got shape \(3, 1\)"),
    ("GaussianPredictions", "companion",
     lambda tmp: pyrouq.GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1),
                                            torch.zeros(4)),
     ValueError, r"Expected targets of shape \(3, 1\) or \(3,\), one per input and output, "
     r"got shape \(4,\)"),
    ("GaussianPredictions", "nan",
     lambda tmp: pyrouq.GaussianPredictions(torch.full((2, 3, 1), NAN), torch.ones(2, 3, 1)),
     ValueError, r"Expected finite loc, got NaN or inf at inputs \[0, 1, 2\] \(3 of 3 inputs\); "
     r"check the model outputs there"),
    ("ArrayLoader", "dtype",
     lambda tmp: pyrouq.ArrayLoader(torch.randn(4, 3), torch.zeros(4, dtype=torch.bool)),
     TypeError, r"ArrayLoader: expected floating-point or integer y, got dtype torch.bool; use "
     r"y.float\(\)"),
    ("ArrayLoader", "companion",
     lambda tmp: pyrouq.ArrayLoader(torch.randn(4, 3), torch.randn(5)), ValueError,
     r"ArrayLoader: x and y must hold the same number of rows, got 4 and 5"),
    ("ArrayLoader", "type",  # "no" is true: it shuffled
     lambda tmp: pyrouq.ArrayLoader(torch.randn(4, 3), torch.randn(4), shuffle="no"),
     TypeError, r"Expected shuffle to be True or False, got 'no'\."),
    ("ArrayLoader", "empty", lambda tmp: pyrouq.ArrayLoader(torch.randn(0, 3), torch.randn(0)),
     ValueError, r"expected x with a leading dimension of N >= 1 rows, got shape \(0, 3\)"),
    ("train_test_split", "range",
     lambda tmp: pyrouq.train_test_split(torch.randn(4, 3), torch.randn(4), test_fraction=0.0),
     ValueError, r"Expected test_fraction in \(0, 1\), got 0.0; e.g. 0.2 holds out a fifth"),
    ("train_test_split", "type",  # a number in a string: the float to pass (it said nothing)
     lambda tmp: pyrouq.train_test_split(torch.randn(4, 3), torch.randn(4), test_fraction="0.2"),
     ValueError, r"got '0.2' \(a string: pass a float, test_fraction=0\.2\); e\.g\. 0\.2 holds"),
    ("train_test_split", "nan",
     lambda tmp: pyrouq.train_test_split(torch.full((4, 3), NAN), torch.randn(4)), ValueError,
     r"train_test_split\(\): x holds NaN or inf; remove or repair those rows first"),
    ("Standardizer", "companion",
     lambda tmp: pyrouq.Standardizer.fit(torch.randn(5, 1), torch.randn(5, 2)).inverse(
         gaussian_preds()),
     ValueError, r"Standardizer.inverse\(\): the predictions have 1 output\(s\), the scaler "
     r"was fitted on targets of 2 column\(s\).* Fit it on those targets"),
    ("GaussianPredictions", "companion",
     lambda tmp: gaussian_preds().rescale(torch.zeros(2), torch.ones(2)),
     ValueError, r"rescale's mean has shape \(2,\), but the predictions have 1 output\(s\): "
     r"pass one value, or one per output, \(1,\)"),
    ("GaussianPredictions", "type", lambda tmp: gaussian_preds().rescale("a", 1.0),
     TypeError, r"Expected rescale's mean to be a float or a tensor of one value per output, "
     r"got str"),
    ("GaussianPredictions", "range", lambda tmp: gaussian_preds().rescale(0.0, -1.0),
     ValueError, r"rescale's std must be finite and > 0, got -1.0"),
    ("Standardizer", "empty",
     lambda tmp: pyrouq.Standardizer.fit(torch.randn(1, 3), torch.randn(1)), ValueError,
     r"Standardizer.fit\(\) needs at least 2 rows to measure a spread, got 1"),
    ("Standardizer", "type", lambda tmp: pyrouq.Standardizer.fit(torch.randn(4, 3),
                                                                 torch.randn(4)).inverse(preds()),
     TypeError, r"Expected GaussianPredictions \(what predict\(\) returns for a Gaussian "
     r"model\), got Predictions"),
    ("plot_regression", "type", lambda tmp: pyrouq.plot_regression(preds(), torch.zeros(6)),
     TypeError, r"plot_regression\(\) expects GaussianPredictions .*got Predictions"),
    ("plot_regression", "shape",
     lambda tmp: pyrouq.plot_regression(gaussian_preds(), torch.zeros(6, 2)), ValueError,
     r"Expected x with one value per point, \(N,\) or \(N, 1\) with N = 6, got shape \(6, 2\)"),
    ("evaluate_rotations", "type",
     lambda tmp: pyrouq.evaluate_rotations(pyrouq.MLP(), torch.randn(2, 1, 28, 28),
                                           torch.tensor([0, 1]), angles=30), TypeError,
     r"Expected angles to be an iterable of degrees, got 30; pass e.g. angles=\[30\] for one "
     r"angle, or angles=range\(0, 181, 15\)"),
    ("fit", "range",
     with_model_guide(lambda m, g: fit(m, g, [(torch.randn(4, 784), torch.tensor([0, 1, 0, 1]))],
                                       epochs=1, num_data=4, seed=1.5)), ValueError,
     r"fit\(\): expected seed to be an integer in \[0, 2\*\*32 - 1\], got 1.5. Pass e.g. seed=0"),
    ("conformal", "range", lambda tmp: pyrouq.conformal(gaussian_preds(), torch.zeros(6), lam=-1),
     ValueError, r"Expected lam >= 0, the RAPS penalty per rank, got -1"),
    ("fit", "type",
     with_model_guide(lambda m, g: fit(m, g, [(torch.randn(4, 784), torch.tensor([0, 1, 0, 1]))],
                                       epochs=1, num_data=4, optim=pyro.optim.Adam({"lr": 0.01}))),
     TypeError, r"optim got a Pyro optimizer \(PyroOptim\), which wraps one for "
     r"pyro.infer.SVI; fit\(\) takes a function building a torch optimizer, e.g. "
     r"optim=lambda params: torch.optim.AdamW\(params, lr=1e-3\)"),
    ("fit", "type",
     with_model_guide(lambda m, g: fit(m, g, [(torch.randn(4, 784), torch.tensor([0, 1, 0, 1]))],
                                       epochs=1, num_data=4, optim=lambda params: None)),
     TypeError, r"optim returned None, expected a torch optimizer \(a torch.optim.Optimizer\)"),
    ("fit", "type",
     with_model_guide(lambda m, g: fit(m, g, [(torch.randn(4, 784), torch.tensor([0, 1, 0, 1]))],
                                       epochs=1, num_data=4, check_inputs="no")),
     TypeError, r"Expected check_inputs to be True or False, got 'no'"),
    ("load_mnist", "type", lambda tmp: load_mnist(batch_size=8, shuffle="no"), TypeError,
     r"Expected shuffle to be True or False, got 'no'"),
    ("fit", "companion",
     lambda tmp: fit(torch.nn.Linear(5, 3), None, torch.utils.data.DataLoader(
         _Batches(), batch_size=None), epochs=1, progress=False), ValueError,
     r"train_loader is a DataLoader with batch_size=None \(automatic batching off\): it serves "
     r"its dataset's items as they are, so the size of its dataset \(3 items\) counts the "
     r"training examples only if they are single examples, not pre-made batches"),
    ("fit", "companion",
     lambda tmp: fit(torch.nn.Linear(5, 3), None, torch.utils.data.DataLoader(
         [(torch.randn(4, 5), torch.tensor([0, 1, 2, 0]))] * 3, batch_size=None), epochs=1,
         progress=False), ValueError,
     r"train_loader is a DataLoader with batch_size=None \(automatic batching off\): it serves "
     r"its dataset's items as they are, so the size of its dataset \(3 items\) counts the "
     r"training examples only if they are single examples, not pre-made batches. Pass "
     r"num_data=N"),
    ("conformal", "companion", lambda tmp: pyrouq.conformal(gaussian_preds(), alpha=0.2),
     ValueError, r"No val_targets: pass val_targets=\(N, D\) values, or predict from a loader of "
     r"\(x, y\) batches"),
    ("fit", "shape",
     lambda tmp: (lambda m: fit(m, mean_field_guide(m), [(torch.randn(20, 1), torch.randn(19))],
                                epochs=1, num_data=20, progress=False))(
         bayesian(torch.nn.Linear(1, 1), likelihood="gaussian")), ValueError,
     r"expected targets y of 20 rows to match the 20 inputs, got shape \(19,\)\. Pass one "
     r"target per input"),
    ("predict", "type",
     lambda tmp: predict(bayesian(torch.nn.Linear(1, 1), likelihood="gaussian"),
                         torch.randn(3, 1), posterior_samples={"weight": [[[1.0]]],
                                                               "bias": torch.zeros(1, 1)}),
     TypeError, r"posterior_samples: site 'weight' holds a list, expected its draws as a tensor "
     r"\(or numpy array\) of shape \(S, \*shape\)\. Convert it with torch.as_tensor"),
    ("plot_regression", "companion",
     lambda tmp: pyrouq.plot_regression(gaussian_preds(), torch.zeros(6), train_x=torch.zeros(3),
                                        train_y=torch.zeros(6)), ValueError,
     r"Expected train_y of shape \(3, 1\) or \(3,\), one row of the 1 output\(s\) per point "
     r"of train_x, got shape \(6,\)"),
    ("plot_regression", "companion",
     lambda tmp: pyrouq.plot_regression(gaussian_preds(), torch.zeros(6), train_y=torch.zeros(6)),
     ValueError, r"got train_y without train_x: .* Pass both, or neither"),
    ("plot_regression", "nan",
     lambda tmp: pyrouq.plot_regression(gaussian_preds(), torch.zeros(6),
                                        train_x=torch.tensor([0.0, float("nan")]),
                                        train_y=torch.zeros(2)), ValueError,
     r"train_x holds 1 NaN or infinite value\(s\) \(first at row 1\); plot_regression draws "
     r"finite points only. Drop those rows first"),
    ("plot_regression", "range",
     lambda tmp: pyrouq.plot_regression(gaussian_preds(), torch.zeros(6), num_sd=-2),
     ValueError, r"Expected num_sd > 0, the bands' half-width in standard deviations, got -2"),
    ("plot_regression", "type",
     lambda tmp: pyrouq.plot_regression(gaussian_preds(), torch.zeros(6), num_sd="2"),
     ValueError, r"got '2' \(a string: pass a float, num_sd=2\.0\); pass a finite number"),
    ("plot_reliability", "type", lambda tmp: pyrouq.plot_reliability(gaussian_preds()), TypeError,
     r"Expected predictions_or_probs to be class probabilities, got GaussianPredictions, a "
     r"Gaussian likelihood.s predictions: .*plot_regression\(\) / plot_calibration\(\)"),
    ("plot_calibration", "empty", lambda tmp: pyrouq.plot_calibration(gaussian_preds()),
     ValueError, r"No targets: pass targets=\(N, D\) values, or predict from a loader"),
    # -- calibration and conformal prediction -------------------------------------------
    ("temperature_scale", "type", lambda tmp: pyrouq.temperature_scale(gaussian_preds()),
     TypeError, r"Expected val_preds to be Predictions \(class probabilities, what predict"),
    ("temperature_scale", "empty",
     lambda tmp: pyrouq.temperature_scale(pyrouq.Predictions(torch.full((1, 6, 10), 0.1))),
     ValueError, r"No val_targets: pass the \(N,\) labels of the held-out split"),
    ("TemperatureScaler", "type", lambda tmp: pyrouq.TemperatureScaler(2.0)(gaussian_preds()),
     TypeError, r"Expected preds to be Predictions"),
    ("conformal", "range", lambda tmp: pyrouq.conformal(preds(), alpha=0.0), ValueError,
     r"Expected alpha in \(0, 1\), the allowed miscoverage \(0.1: 90 % coverage\), got 0.0"),
    ("conformal", "empty", lambda tmp: pyrouq.conformal(preds(), alpha=0.05), ValueError,
     r"alpha=0.05 needs at least 19 calibration points for a finite threshold, got 6"),
    ("conformal", "companion", lambda tmp: pyrouq.conformal(preds(), preds().targets[:3]),
     ValueError, r"Expected val_targets of shape \(N,\) = \(6,\)"),
    ("ConformalClassifier", "type",
     lambda tmp: pyrouq.ConformalClassifier("lac", 0.1, 0.5, 0.0, 1, 0).predict_sets(
         gaussian_preds()),
     TypeError, r"Expected preds to be Predictions"),
    ("ConformalClassifier", "companion",
     lambda tmp: pyrouq.conformal(preds(40), alpha=0.1).predict_sets(
         pyrouq.Predictions(torch.full((2, 6, 5), 0.2))),
     ValueError, r"The predictions have 5 classes, the calibration predictions had 10: a "),
    ("ConformalClassifier", "range",
     lambda tmp: pyrouq.conformal(preds(40), alpha=0.1, score="aps").predict_sets(
         preds(), seed=-5),
     ValueError, r"ConformalClassifier.predict_sets\(\): expected seed to be an integer in "),
    ("ConformalClassifier", "type",
     lambda tmp: pyrouq.conformal(preds(40), alpha=0.1, score="raps").scores(preds(), 1.5),
     ValueError, r"ConformalClassifier.scores\(\): expected seed .* got 1.5\. Pass e.g."),
    ("ConformalClassifier", "range",  # built by hand: its default predict_sets seed overflowed
     lambda tmp: pyrouq.ConformalClassifier("aps", 0.1, 0.5, 0.0, 1, 2**32),
     ValueError, r"ConformalClassifier: expected seed to be an integer in \[0, 2\*\*32 - 1\], "
     r"got 4294967296\. Pass e\.g\. seed=0\."),
    ("ConformalClassifier", "type",  # built by hand, its lam a string
     lambda tmp: pyrouq.ConformalClassifier("raps", 0.1, 0.5, "0.1", 1, 0),
     ValueError, r"ConformalClassifier: expected lam >= 0 \(finite\), the RAPS penalty per rank, "
     r"got '0\.1' \(a string: pass a float, lam=0\.1\)\.$"),
    ("ConformalRegressor", "companion",
     lambda tmp: pyrouq.ConformalRegressor("abs", 0.1, torch.ones(2)).intervals(gaussian_preds()),
     ValueError, r"The predictions have 1 outputs, the calibration predictions had 2"),
    ("ConformalRegressor", "type",
     lambda tmp: pyrouq.ConformalRegressor("abs", 0.1, torch.ones(1)).intervals(preds()),
     TypeError, r"Expected GaussianPredictions, got Predictions; a classifier's predictions get "
     r"prediction sets"),
    ("coverage", "shape",
     lambda tmp: pyrouq.coverage(torch.ones(3, 2, dtype=torch.bool), torch.zeros(3, 1).long()),
     ValueError, r"coverage\(\): expected labels of shape \(3,\), one per prediction set, got "
     r"\(3, 1\); labels in a column \(or a row\)\? pass them as one dim, labels.reshape"),
    ("coverage", "shape",
     lambda tmp: pyrouq.coverage(torch.ones(1, 2, dtype=torch.bool), torch.tensor(1)),
     ValueError, r"coverage\(\): expected labels of shape \(1,\), one per prediction set, got "
     r"\(\); one label as a 0-d tensor \(y\[i\]\)\? pass it as one dim, labels.reshape"),
    ("coverage", "dtype", lambda tmp: pyrouq.coverage(torch.ones(3, 2), torch.zeros(3)),
     TypeError, r"Expected prediction sets as an \(N, C\) boolean tensor .*got torch.float32"),
    ("mean_set_size", "shape", lambda tmp: pyrouq.mean_set_size(torch.ones(3, dtype=torch.bool)),
     ValueError, r"Expected prediction sets as an \(N, C\) boolean tensor, one row per input "
     r".*got shape \(3,\)"),
    ("class_conditional_coverage", "type",
     lambda tmp: pyrouq.class_conditional_coverage([[True]], torch.zeros(1)), TypeError,
     r"Expected prediction sets as an \(N, C\) boolean tensor .*got list"),
    ("coverage", "empty",
     lambda tmp: pyrouq.coverage(torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0).long()),
     ValueError, r"Expected at least one prediction set, got shape \(0, 3\): a coverage or a "
     r"mean size of no sets is undefined"),
    ("mean_set_size", "empty",
     lambda tmp: pyrouq.mean_set_size(torch.zeros(0, 3, dtype=torch.bool)), ValueError,
     r"Expected at least one prediction set, got shape \(0, 3\)"),
    ("coverage", "empty",
     lambda tmp: pyrouq.coverage((torch.zeros(0, 1), torch.ones(0, 1)), torch.zeros(0)),
     ValueError, r"coverage\(\): expected at least one interval, got shape \(0, 1\)"),
    # -- MCMC ----------------------------------------------------------------------------
    ("mcmc", "range",
     lambda tmp: pyrouq.mcmc(BayesianMLP(hidden_features=4), flat_x(), labels(), num_samples=5,
                             warmup_steps=5, num_chains=0),
     ValueError, r"Expected num_chains to be an integer >= 1, got 0"),
    ("mcmc", "type",
     lambda tmp: pyrouq.mcmc(BayesianMLP(hidden_features=4),
                             flat_loader(torch.rand(6, 784), labels()), labels(), num_samples=5,
                             warmup_steps=5),
     TypeError, r"mcmc\(\) needs the full data as tensors x and y, got TensorLoader"),
    ("mcmc", "shape",
     lambda tmp: pyrouq.mcmc(BayesianMLP(), flat_x(), labels(), num_samples=5, warmup_steps=5),
     ValueError, r"latent values, above the 10,000 that NUTS handles .*pass force=True"),
    ("mcmc", "nan",
     lambda tmp: pyrouq.mcmc(BayesianMLP(hidden_features=4), torch.full((6, 784), NAN),
                             labels(), num_samples=5, warmup_steps=5),
     ValueError, r"mcmc\(\): x holds NaN or inf in 6 of 6 inputs"),
    ("pyrouq.data.normalize", "dtype", lambda tmp: normalize(torch.rand(2, 28, 28)), TypeError,
     r"Expected raw integer pixels in \[0, 255\] \(e.g. uint8\), got dtype torch.float32"),
    ("pyrouq.data.normalize", "range",
     lambda tmp: normalize(torch.full((2, 28, 28), 300, dtype=torch.int32)), ValueError,
     r"Expected pixel values in \[0, 255\], got values in \[300, 300\]"),
]  # fmt: skip

#: Public names that users do not call with data of their own, so no bad argument applies.
NOT_CALLED_WITH_USER_DATA = {
    "__version__": "a string",
    "Checkpoint": "what load() returns",
    "CheckpointError": "an exception class",
    "TrainingInterrupted": "an exception class, raised by fit()",
    "NoGradLayersWarning": "a warning class, warned by fit() and mcmc()",
    "EpochRecord": "a record fit() returns",
    "FitResult": "what fit() returns",
    "PSISResult": "what psis_diagnostic() returns",
    "MCMCResult": "what mcmc() returns (save/load and predict check it)",
}


#: pyrouq.likelihoods names that take no argument a user could get wrong.
ABSTRACT_LIKELIHOOD = {
    "likelihoods.Likelihood": "the abstract base class, subclassed, not called",
    "likelihoods.LikelihoodName": "a typing alias",
}


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("case", API_CASES, ids=[f"{name}-{kind}" for name, kind, *_ in API_CASES])
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_public_name_refuses_bad_input(case, tmp_path):
    _name, _kind, call, error, pattern = case
    assert issubclass(error, (ValueError, TypeError, FileNotFoundError)), error
    with pytest.raises(error) as info:
        call(tmp_path)
    assert re.search(pattern, str(info.value)), str(info.value)


def test_every_public_name_has_a_case():
    covered = {name for name, *_ in API_CASES}
    missing = [
        name
        for name in pyrouq.__all__
        if name not in covered and name not in NOT_CALLED_WITH_USER_DATA
    ]
    likelihoods = [f"likelihoods.{name}" for name in pyrouq.likelihoods.__all__]
    missing += [
        name for name in likelihoods if name not in covered and name not in ABSTRACT_LIKELIHOOD
    ]
    assert not missing, f"public names without a bad-input case in API_CASES: {missing}"
    extra = {"pyrouq.data.normalize", *likelihoods}
    assert not covered - set(pyrouq.__all__) - extra, "stale names"
    kinds = {kind for _, kind, *_ in API_CASES}
    assert kinds == {"type", "shape", "dtype", "range", "empty", "nan", "companion"}


def test_every_cli_command_has_a_case(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    # [^{]*: the usage line wraps in a narrow terminal; [^}]+: any command name
    commands = re.search(r"usage: pyrouq\b[^{]*\{([^}]+)\}", usage).group(1).split(",")
    assert "fit" in commands and "evaluate" in commands, usage
    covered = {argv[0] for argv, _ in CLI_CASES.values()}
    assert set(commands) <= covered, f"CLI commands without a case: {set(commands) - covered}"


# --------------------------------------------------------------------------------------------
# Inputs of another dtype, and nothing lost on a refusal
# --------------------------------------------------------------------------------------------


def test_float64_and_float16_inputs_are_cast_to_the_models_dtype():
    model = BayesianLeNet()
    guide = mean_field_guide(model)
    x = torch.randn(5, 1, 28, 28)
    pyro.set_rng_seed(0)
    as_float32 = predict(model, x, guide, num_samples=3).probs
    pyro.set_rng_seed(0)
    as_float64 = predict(model, x.double(), guide, num_samples=3).probs
    assert as_float64.dtype == torch.float32 and as_float64.shape == (3, 5, 10)
    assert not torch.equal(as_float64[0], as_float64[1])  # three draws, not one repeated
    torch.testing.assert_close(as_float64, as_float32, rtol=0, atol=0)
    net = pyrouq.ResidualCNN(width=4).eval()
    torch.testing.assert_close(net(x.half()), net(x.half().float()), rtol=0, atol=0)


def _state(*modules):
    return [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]


def _same(before, modules):
    return all(
        all(torch.equal(v, m.state_dict()[k]) for k, v in state.items())
        for state, m in zip(before, modules, strict=True)
    )


class _TwoBatches:
    """A loader (not in memory, so checked batch by batch) of two fixed batches; the second
    holds a NaN when ``nan``; ``first_only`` yields the first batch alone."""

    def __init__(self, nan: bool, first_only: bool = False):
        generator = torch.Generator().manual_seed(0)
        self.batches = [(torch.rand(3, 784, generator=generator), torch.arange(3)) for _ in "ab"]
        if nan:
            self.batches[1][0][0, 0] = float("nan")
        if first_only:
            self.batches = self.batches[:1]
        self.dataset = list(range(6))

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


REFUSED_FITS = {
    "mismatched guide": (ValueError, r"fit\(\): " + MISMATCH),
    "uint8 images": (TypeError, r"fit\(\) " + DTYPE_HINT),
    "NaN in the first batch": (
        ValueError,
        r"train_loader holds NaN or inf in 1 of 6 examples, e.g. example indices \[1\].*"
        r"nothing was trained",
    ),
    "network does not fit": (
        ValueError,
        r"fit\(\): BayesianNetwork failed on the first examples of train_loader "
        r"\(x of shape \(2, 1, 28, 28\).*the model's input, of 28 features where this layer "
        r"takes 784\. Flatten it, x\.flatten\(1\), or put nn\.Flatten\(\) first in the network; "
        r"nothing was trained",
    ),
}


@pytest.mark.parametrize("refusal", list(REFUSED_FITS))
def test_a_refused_fit_leaves_the_model_and_guide_unchanged(refusal):
    error, pattern = REFUSED_FITS[refusal]
    model, guide = mlp_and_guide()
    if refusal == "network does not fit":  # a flat network on (B, 1, 28, 28) images
        model = bayesian(torch.nn.Sequential(torch.nn.Linear(784, 10)))
        guide = mean_field_guide(model)
    other = mean_field_guide(BayesianLeNet())
    before = _state(model, guide, other)
    images = torch.rand(6, 784)
    kwargs = {"epochs": 1, "progress": False}
    with pytest.raises(error, match=pattern):
        if refusal == "mismatched guide":
            fit(model, other, flat_loader(images, labels()), **kwargs)
        elif refusal == "uint8 images":
            data = torch.utils.data.TensorDataset((images * 255).to(torch.uint8), labels())
            fit(model, guide, torch.utils.data.DataLoader(data, batch_size=3), **kwargs)
        elif refusal == "NaN in the first batch":
            images[1, 3] = float("nan")
            fit(model, guide, flat_loader(images, labels()), **kwargs)
        else:
            fit(model, guide, load_mnist(batch_size=4, train_size=8)[0], **kwargs)
    assert _same(before, (model, guide, other))


def test_a_batch_refused_mid_epoch_keeps_the_previous_steps_parameters():
    model, guide = mlp_and_guide()
    reference, reference_guide = mlp_and_guide()
    reference.load_state_dict(model.state_dict())
    reference_guide.load_state_dict(guide.state_dict())
    initial = _state(guide)
    kwargs = {"epochs": 1, "progress": False, "seed": 0, "lr_schedule": "constant"}
    with pytest.raises(ValueError, match=r"Batch 2 of epoch 1 holds NaN or inf in 1 of 3"):
        fit(model, guide, _TwoBatches(nan=True), num_data=6, **kwargs)
    fit(reference, reference_guide, _TwoBatches(nan=False, first_only=True), num_data=6, **kwargs)
    assert _same(_state(reference, reference_guide), (model, guide))
    assert not _same(initial, (guide,))  # the one step taken did change the guide


def test_a_refused_save_writes_nothing_and_keeps_the_existing_file(tmp_path):
    model, guide = mlp_and_guide()
    path = save(tmp_path / "run.pt", model, guide)
    data = path.read_bytes()
    with pytest.raises(ValueError, match="does not belong"):
        save(path, model, mean_field_guide(BayesianLeNet()))
    with pytest.raises(CheckpointError, match="JSON"):
        save(path, model, guide, metadata={"x": object()})
    with pytest.raises(ValueError, match="does not belong"):
        save(tmp_path / "new.pt", model, mean_field_guide(BayesianLeNet()))
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]


def test_a_cli_fit_refused_before_training_leaves_no_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["fit", "tests._factories:flat_mlp", "--method", "bayesian", "--out", str(out)]
    argv += ["--train-size", "64", "--epochs", "1", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: fit(): BayesianNetwork failed on the first examples")
    assert "nothing was trained" in err and err.count("\n") == 1
    assert not out.exists()


def test_integer_inputs_reach_a_network_that_starts_from_an_embedding():
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(12, 3))
    model = bayesian(net)
    guide = mean_field_guide(model)
    tokens = torch.randint(0, 10, (5, 3))
    assert list(model.latent_sites()) == ["2.weight", "2.bias"]
    assert predict(model, tokens, guide, num_samples=2).probs.shape == (2, 5, 3)
    result = fit(model, guide, [(tokens, torch.arange(5) % 3)], epochs=1, num_data=5,
                 progress=False)  # fmt: skip
    assert math.isfinite(result.history[-1].loss)
