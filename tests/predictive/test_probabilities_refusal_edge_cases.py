"""Second review of the day's audits: a binary classifier of one's own with one label column is
not taken for a multi-label model; a likelihood copied from a trained model still refuses a
network ending in a softmax (and the refusal names a sigmoid too); fit() of a network with one
value per input is told the fix that applies; a run resumed in Python keeps `pyrouq fit`'s
config; the command's advice for BatchNorm and an interrupted run is the one that works."""

from __future__ import annotations

import copy
import json
import pickle
import shlex

import _factories
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq
from pyrouq import cli
from pyrouq.cli import main


class _Binary(PyroModule):
    """A binary classifier: one logit column l (B, 1) observed against labels (B, 1); it returns
    [0, l], the two-column logits predict()'s message for a single logit asks for."""

    def __init__(self):
        super().__init__()
        self.lin = PyroModule[nn.Linear](4, 1)
        self.lin.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 4]).to_event(2))
        self.lin.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        self.num_data = 16

    def forward(self, x, y=None):
        logit = self.lin(x)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Bernoulli(logits=logit).to_event(1), obs=y)
        return torch.cat([torch.zeros_like(logit), logit], -1)


def test_a_binary_classifier_with_one_label_column_is_not_taken_for_multi_label():
    """Its labels (B, 1) were read as 2 labels per input (its outputs' width) and refused."""
    model = _Binary()
    x, y = torch.randn(16, 4), (torch.rand(16, 1) > 0.5).float()
    AutoNormal(model)(x, y)
    draws = {"lin.weight": torch.randn(3, 1, 4), "lin.bias": torch.randn(3, 1)}
    preds = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    expected = torch.sigmoid(x @ draws["lin.weight"].transpose(1, 2) + draws["lin.bias"][:, None])
    torch.testing.assert_close(preds.probs[..., 1:], expected)


def _softmax_net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 3), nn.Softmax(-1))


def test_a_likelihood_copied_from_a_trained_model_still_refuses_probabilities():
    """The likelihood of a model that had seen logits kept its 'checked' flag in the copy
    bayesian() makes, so a network ending in a softmax trained silently with it."""
    x, y = torch.randn(16, 6), torch.arange(16) % 3
    trained = pyrouq.bayesian(nn.Linear(6, 3))
    pyrouq.fit(trained, pyrouq.mean_field_guide(trained), [(x, y)], epochs=1, num_data=16,
               progress=False)  # fmt: skip
    model = pyrouq.bayesian(_softmax_net(), likelihood=trained.likelihood)
    with pytest.raises(ValueError, match=r"^The network returned class probabilities"):
        pyrouq.fit(model, pyrouq.mean_field_guide(model), [(x, y)], epochs=1, num_data=16,
                   progress=False)  # fmt: skip
    for copied in (copy.deepcopy(trained), pickle.loads(pickle.dumps(trained))):
        with pytest.raises(ValueError, match="returned class probabilities"):
            copied.likelihood.prepare(torch.softmax(torch.randn(2, 3), -1))


def test_the_refusal_names_a_sigmoid_of_two_outputs():
    """A saturated sigmoid of two outputs sums to 1 as a softmax does: the message named only
    a softmax, which such a network does not have."""
    net = nn.Sequential(nn.Linear(1, 2), nn.Sigmoid())
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[40.0], [-40.0]]))
        net[0].bias.zero_()
    x = torch.rand(8, 1) + 1.0  # every row (1, 0) in float32
    with pytest.raises(ValueError, match=r"in a sigmoid of 2 outputs\?\).*\(or nn\.Sigmoid;"):
        pyrouq.predict(net, x, progress=False)


def test_fit_of_a_network_with_one_value_per_input_is_not_told_to_wrap_it():
    x, y = torch.randn(16, 6), torch.arange(16) % 2
    net = nn.Sequential(nn.Linear(6, 1), nn.Flatten(0))
    with pytest.raises(TypeError) as info:
        pyrouq.fit(net, None, [(x, y)], epochs=1, num_data=16, progress=False)
    message = (
        "Sequential.forward returned shape (16,) for 16 inputs: one value per input, without "
        "the outputs' dimension. pyrouq needs outputs (B, D): for a single output (regression), "
        "return (16, 1), e.g. drop the forward's .squeeze(-1) or return outputs.unsqueeze(-1) "
        "(under Gaussian('heteroscedastic'), (16, 2): a mean, then a raw scale, from a last "
        "layer of 2 outputs); a classifier returns (B, C) logits, C >= 2."
    )
    assert str(info.value) == message  # fit and predict alike, one message (not 'wrap it')
    with pytest.raises(TypeError) as info:
        pyrouq.predict(net, x, progress=False)
    assert str(info.value) == message


class _Squeezed(nn.Module):
    def __init__(self, outputs: int):
        super().__init__()
        self.fc = nn.Linear(6, outputs)

    def forward(self, x):
        out = self.fc(x)
        return out.squeeze(-1) if out.shape[-1] == 1 else out


def test_a_heteroscedastic_network_with_one_value_per_input_is_told_the_shape_that_fits():
    """Under Gaussian('heteroscedastic') the refusal said to return (B, 1), which the
    likelihood then refuses ('an odd number' of outputs): it needs a mean and a raw scale per
    input, (B, 2). Its advice, followed, now fits."""
    x, y = torch.randn(16, 6), torch.randn(16)

    def fitted(outputs):
        model = pyrouq.bayesian(_Squeezed(outputs), likelihood=pyrouq.Gaussian("heteroscedastic"))
        loader = [(x, y)]
        return pyrouq.fit(
            model, pyrouq.mean_field_guide(model), loader, epochs=1, num_data=16, progress=False
        )

    with pytest.raises(TypeError, match=r"under Gaussian\('heteroscedastic'\), \(2, 2\): a mean"):
        fitted(1)  # (fit() first runs the network on 2 examples)
    assert fitted(2).steps == 1


def test_a_run_resumed_in_python_keeps_its_metadata(tmp_path):
    """fit(resume_from=path, checkpoint=path) without metadata= wrote {}: `pyrouq evaluate`
    of a resumed Fashion-MNIST run then evaluated it on MNIST (its config gone)."""
    x, y = torch.randn(32, 6), torch.arange(32) % 3
    path = tmp_path / "run.pt"

    def stop(record):
        raise KeyboardInterrupt

    def built():
        torch.manual_seed(0)
        model = pyrouq.bayesian(nn.Linear(6, 3))
        return model, pyrouq.mean_field_guide(model)

    config = {"config": {"dataset": "fashion-mnist", "seed": 3}}
    model, guide = built()
    with pytest.raises(pyrouq.TrainingInterrupted):
        pyrouq.fit(model, guide, [(x, y)], epochs=3, num_data=32, progress=False,
                   checkpoint=path, metadata=config, callbacks=[stop])  # fmt: skip
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes())
    model, guide = built()
    pyrouq.fit(model, guide, [(x, y)], epochs=3, num_data=32, progress=False,
               checkpoint=path, resume_from=path)  # fmt: skip
    saved = pyrouq.load(path, module=nn.Linear(6, 3))
    assert saved.training["epochs_done"] == 3
    assert saved.metadata == config
    model, guide = built()  # metadata= given: the caller's
    pyrouq.fit(model, guide, [(x, y)], epochs=3, num_data=32, progress=False,
               checkpoint=tmp_path / "other.pt", resume_from=cut, metadata={"note": 1})  # fmt: skip
    assert pyrouq.load(tmp_path / "other.pt", module=nn.Linear(6, 3)).metadata == {"note": 1}


def test_batchnorm_with_batch_size_one_is_told_to_raise_it(tmp_path, capsys, monkeypatch):
    """'That is the last batch of the epoch' was said of batch 1 of 64 under --batch-size 1,
    whose every batch is one input (and 64 % 1 leaves no remainder to remove)."""
    monkeypatch.chdir(tmp_path)
    argv = ["fit", "_factories:batchnorm_mlp", "--method", "plain", "--epochs", "1"]
    argv += ["--train-size", "8", "--batch-size", "1", "--out", "run", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: Batch 1 of epoch 1 holds 1 input of shape"), err
    assert err.endswith(
        "--batch-size 1 makes every batch one input: pass a --batch-size of 2 or more.\n"
    )


def test_evaluate_of_an_interrupted_run_names_the_resume_that_saves_it(
    tmp_path, capsys, monkeypatch
):
    _factories.stop_fit_after_first_epoch(monkeypatch)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "2", "--train-size", "256", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == cli.EXIT_INTERRUPTED
    resume = shlex.join(["pyrouq", *argv, "--no-progress", "--resume"])
    assert f"(resume it: {resume})" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["evaluate", str(out), "--ood", "none", "--no-progress"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    path = str(out / "checkpoint.pt")
    assert line == (
        "(an interrupted run: its weights after 1 of 2 epochs and 1 step; resume the training: "
        f"{resume})"
    )
    metrics = json.loads((out / "metrics-evaluate.json").read_text())
    assert metrics["interrupted_run"] == {"epochs": 2, "epochs_done": 1, "steps": 1}
    # the advice followed: the run's folder holds the finished run, with its config
    config = json.loads((out / "config.json").read_text())
    assert main(shlex.split(resume)[1:]) == 0
    assert pyrouq.load(path).metadata["config"] == config
    assert main(["evaluate", str(out), "--ood", "none", "--no-progress"]) == 0
    assert "interrupted" not in capsys.readouterr().out
    assert "interrupted_run" not in json.loads((out / "metrics-evaluate.json").read_text())


class _Fixed(torch.nn.Module):
    """Logits (0.3, 0.7) for every input: a row that sums to 1, as one honest row can."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones((), dtype=dtype))

    def forward(self, x):
        row = torch.tensor([0.3, 0.7], dtype=self.scale.dtype) * self.scale
        return row.expand(x.shape[0], 2)


@pytest.mark.parametrize("dtype, enough", [(torch.float32, 2), (torch.bfloat16, 4)])
def test_too_few_inputs_are_not_judged_probabilities(dtype, enough):
    """One row of honest logits sums to 1 within rounding now and then (a 2-class bfloat16
    row 3 times in 1,000): predict() judged single examples, refusing some at random."""
    net = _Fixed(dtype)
    x = torch.zeros(enough, 3, dtype=dtype)
    probs = pyrouq.predict(net, x[: enough - 1], progress=False).probs
    assert probs.shape == (1, enough - 1, 2)
    with pytest.raises(ValueError, match=r"returned class probabilities, not logits"):
        pyrouq.predict(net, x, progress=False)
    lik = pyrouq.likelihoods.Categorical()
    lik.prepare(net(x[: enough - 1]))  # not enough to tell: the next call checks
    with pytest.raises(ValueError, match=r"^The network returned class probabilities"):
        lik.prepare(net(x))
