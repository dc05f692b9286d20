"""Audit of the Bayesian layers and named models, the Categorical likelihood and fit()'s
argument handling: values against hand-written torch, and the messages of refused input."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader, recording_sgd, tiny_mlp, toy_data
from pyro import poutine
from torch.utils.data import DataLoader, TensorDataset

import pyrouq
from pyrouq.likelihoods import Categorical
from pyrouq.models import MLP, BayesianLeNet, BayesianMLP
from pyrouq.nn import BayesianConv2d

# --------------------------------------------------------------------------------------------
# Bayesian layers and models
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stride": 0}, r"stride to be a positive int or a pair of them \(sh, sw\), got 0\. Pass"),
        ({"stride": "a"}, r"stride to be a positive int .*got 'a'\. Pass e\.g\. stride=2"),
        ({"stride": (1, 2, 3)}, r"stride to be .*got \(1, 2, 3\)"),
        ({"padding": -1}, r"padding to be an int >= 0 or a pair .* or 'same' or 'valid', got -1"),
        ({"padding": "full"}, r"padding to be .*got 'full'"),
        ({"padding": "same", "stride": 2}, r"padding='same' with stride=2: torch pads 'same' for"),
    ],
)
def test_conv_stride_and_padding_are_checked_when_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BayesianConv2d(2, 3, 3, **kwargs)


def test_conv_repr_shows_stride_and_padding_and_same_padding_runs():
    layer = BayesianConv2d(2, 3, 3, stride=(2, 1), padding=[1, 0])
    assert "stride=(2, 1), padding=(1, 0)" in repr(layer)
    assert layer(torch.randn(2, 2, 7, 6)).shape == (2, 3, 4, 4)
    same = BayesianConv2d(2, 3, 3, padding="same")
    assert "padding='same'" in repr(same)
    assert same(torch.randn(1, 2, 6, 5)).shape == (1, 3, 6, 5)


def test_bayesian_mlp_computes_its_docstring_in_float64():
    model = BayesianMLP(4, 5, 3, num_hidden=2, prior_scale=0.5, num_data=10).double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    trace = poutine.trace(model).get_trace(x, y)
    w = {k: v["value"] for k, v in trace.nodes.items() if k.startswith("fc")}
    h = torch.relu(x @ w["fc1.weight"].T + w["fc1.bias"])
    h = torch.relu(h @ w["fc2.weight"].T + w["fc2.bias"])
    logits = h @ w["fc3.weight"].T + w["fc3.bias"]
    assert torch.equal(trace.nodes["_RETURN"]["value"], logits)
    trace.compute_log_prob()
    expected = -F.cross_entropy(logits, y, reduction="sum") * 10 / 6  # N/B
    assert trace.nodes["obs"]["log_prob_sum"].item() == pytest.approx(expected.item(), rel=1e-12)
    prior = torch.distributions.Normal(torch.tensor(0.0).double(), torch.tensor(0.5).double())
    for name, value in w.items():
        got = trace.nodes[name]["fn"].log_prob(value)
        assert got.item() == pytest.approx(prior.log_prob(value).sum().item(), rel=1e-12)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_config_holds_a_python_bool(cls):
    kw = {"in_features": 3, "hidden_features": 4, "out_features": 2} if cls is BayesianMLP else {}
    model = cls(**kw, local_reparameterization=np.bool_(True))
    assert type(model.config["local_reparameterization"]) is bool
    assert model.config["local_reparameterization"] is True
    assert model.local_reparameterization is True  # the flag itself, a bool too


def test_bayesian_keeps_a_python_bool_for_a_numpy_flag():
    model = pyrouq.bayesian(torch.nn.Linear(3, 2), local_reparameterization=np.bool_(True))
    assert type(model.local_reparameterization) is bool


# --------------------------------------------------------------------------------------------
# Categorical
# --------------------------------------------------------------------------------------------


def test_categorical_nll_is_cross_entropy_over_draws():
    logits = torch.randn(3, 5, 4, dtype=torch.float64)
    y = torch.tensor([0, 3, 1, 2, 2])
    expected = sum(F.cross_entropy(logits[s], y, reduction="sum") for s in range(3))
    for labels in (y, y.int(), y.to(torch.uint8)):
        assert Categorical().nll(logits, labels).item() == pytest.approx(expected.item(), 1e-12)


@pytest.mark.parametrize(
    ("labels", "error", "message"),
    [
        (np.array([0, 1, 2, 0, 1]), TypeError, r"got ndarray\. Convert them with torch\.as_tens"),
        (torch.tensor([[0], [1], [2], [0], [1]]), ValueError, r"\(a column of labels: y\.squeeze"),
        (torch.eye(3)[[0, 1, 2, 0, 1]].long(), ValueError, r"\(one-hot labels: y\.argmax\(-1\)\)"),
        # bools: torch has no argmax of them ('y.argmax(-1)' was told, which fails)
        (
            torch.eye(3, dtype=torch.bool)[[0, 1, 2, 0, 1]],
            ValueError,
            r"\(one-hot labels: y\.long\(\)\.argmax\(-1\)\)",
        ),
    ],
)
def test_categorical_label_messages_say_what_to_do(labels, error, message):
    model = BayesianMLP(4, 5, 3, num_data=10)
    with pytest.raises(error, match=message):
        model(torch.randn(5, 4), labels)
    if labels.dtype == torch.bool:  # the fix it names runs
        assert model(torch.randn(5, 4), labels.long().argmax(-1)).shape == (5, 3)


_ONE_HOT = (
    r"has one-hot labels of dtype torch.float32 and shape \(8, 2\), expected class indices of "
    r"shape \(8,\) in an integer dtype: pass y\.argmax\(dim=1\); "
)


@pytest.mark.parametrize(
    ("make", "kw", "message"),
    [
        (lambda x, y: pyrouq.ArrayLoader(x, y, 4), {}, rf"^train_loader {_ONE_HOT}nothing was"),
        (lambda x, y: [(x, y)], {"num_data": 8}, rf"^Batch 1 of epoch 1 {_ONE_HOT}training stop"),
    ],
    ids=["in memory", "batch by batch"],
)
def test_fit_names_argmax_for_one_hot_float_targets_at_once(make, kw, message):
    """It said 'y.long()', after which the shape (N, C) was refused with 'y.argmax(-1)'."""
    x, labels = toy_data(8)
    model = tiny_mlp()
    with pytest.raises(ValueError, match=message):
        pyrouq.fit(model, pyrouq.mean_field_guide(model), make(x, F.one_hot(labels, 2).float()),
                   epochs=1, progress=False, **kw)  # fmt: skip
    flags = F.one_hot(labels, 2).bool()  # (argmax takes no bool: told to take long first)
    said = r"torch\.bool and shape \(8, 2\), .* integer dtype: pass y\.long\(\)\.argmax\(dim=1\);"
    with pytest.raises(ValueError, match=said):
        pyrouq.fit(model, pyrouq.mean_field_guide(model), [(x, flags)], epochs=1, num_data=8,
                   progress=False)  # fmt: skip
    assert torch.equal(flags.long().argmax(dim=1), labels)
    two_ones = F.one_hot(labels, 2).float()
    two_ones[3] = 1.0  # (not one-hot: the dtype's words)
    with pytest.raises(ValueError, match=r"labels of dtype torch.float32, expected an integer "):
        pyrouq.fit(model, pyrouq.mean_field_guide(model), [(x, two_ones)], epochs=1,
                   num_data=8, progress=False)  # fmt: skip


# --------------------------------------------------------------------------------------------
# fit()
# --------------------------------------------------------------------------------------------


def _fit(loader, **kw):
    model = tiny_mlp()
    return pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, progress=False, **kw)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checkpoint": 3}, r"Expected fit\(checkpoint=\.\.\.\) to be a file path .*got int\."),
        ({"resume_from": 3}, r"fit\(resume_from=\.\.\.\) to be a file path .*Checkpoint .*got int"),
        ({"resume_from": {"a": 1}}, r"resume_from=\.\.\.\) to be a file path .*got dict\. Pass"),
        (
            {"metadata": [1], "checkpoint": "run.pt"},
            r"Expected fit\(metadata=\.\.\.\) to be a dict of JSON values, got list\.",
        ),
    ],
)
def test_fit_refuses_a_path_or_metadata_of_another_type(kwargs, message, tmp_path):
    if "checkpoint" in kwargs and isinstance(kwargs["checkpoint"], str):
        kwargs["checkpoint"] = tmp_path / kwargs["checkpoint"]
    x, y = toy_data(20)
    with pytest.raises(TypeError, match=message):
        _fit(ListLoader(x, y, 10), epochs=1, **kwargs)
    assert not list(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda x, y: TensorDataset(x, y), r"a TensorDataset of single examples"),
        (lambda x, y: (x, y), r"a tuple of 2 Tensors \(one \(x, y\) pair\?\)"),
        (lambda x, y: [x.numpy(), y.numpy()], r"a list of 2 ndarrays"),
        (lambda x, y: list(zip(x, y, strict=True)), r"a list of single examples"),
    ],
)
def test_fit_refuses_examples_served_as_batches(make, message):
    x, y = toy_data(20)
    with pytest.raises(TypeError, match=message + r".*Serve batches: pyrouq\.ArrayLoader"):
        _fit(make(x, y), epochs=1, num_data=20)


def test_fit_warns_of_a_kl_weight_without_latent_sites():
    x, y = toy_data(20)
    with pytest.warns(UserWarning, match=r"fit\(kl_weight=0\.5\) has no effect on MLP, which") as w:
        pyrouq.fit(MLP(3, 4, 2), None, ListLoader(x, y, 10), epochs=1, kl_weight=0.5,
                   progress=False)  # fmt: skip
    assert {r.filename for r in w if "kl_weight" in str(r.message)} == {__file__}  # here
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyrouq.fit(MLP(3, 4, 2), None, ListLoader(x, y, 10), epochs=1, progress=False)


def test_resuming_a_network_without_latent_sites_does_not_ask_for_its_kl_weight(tmp_path):
    # the resume asked "Pass kl_weight=0.5 to continue the run as it was", and fit() then
    # warned that kl_weight=0.5 "has no effect": there is no KL term to change
    x, y = toy_data(20)
    path = tmp_path / "run.pt"
    with pytest.warns(UserWarning, match="has no effect"):
        pyrouq.fit(MLP(3, 4, 2), None, ListLoader(x, y, 10), epochs=1, kl_weight=0.5,
                   checkpoint=path, progress=False, seed=0)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = pyrouq.fit(MLP(3, 4, 2), None, ListLoader(x, y, 10), epochs=2,
                            resume_from=path, progress=False, seed=0)  # fmt: skip
    assert result.steps == 4


def _learning_rates(loader):
    seen: list[float] = []
    optim = recording_sgd(seen)
    torch.manual_seed(0)
    pyrouq.fit(MLP(3, 4, 2), None, loader, epochs=1, optim=optim, num_data=40, progress=False)
    return seen


def test_a_sized_iterator_keeps_the_learning_rate_schedule():
    x, y = toy_data(40)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    cosine = [0.05 * (1 + math.cos(math.pi * s / 4)) for s in range(4)]
    assert _learning_rates(loader) == pytest.approx(cosine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it has a length: no "stays constant" warning
        assert _learning_rates(iter(loader)) == pytest.approx(cosine)


def test_plain_network_fit_is_a_hand_written_adam_loop():
    x, y = toy_data(40)
    loader = ListLoader(x, y, 10)
    torch.manual_seed(0)
    net = MLP(3, 8, 2).double()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    total, warm = 3 * len(loader), int(0.2 * 3 * len(loader))
    step = 0
    for _ in range(3):
        for xb, yb in loader:
            p = (step - warm) / (total - warm)
            f = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * p))
            opt.param_groups[0]["lr"] = 0.02 * f
            loss = F.cross_entropy(net(xb.double()), yb, reduction="sum") * 40 / len(yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    torch.manual_seed(0)
    fitted = MLP(3, 8, 2).double()
    result = pyrouq.fit(fitted, None, loader, epochs=3, progress=False)
    assert result.steps == 12 and len(result.history) == 3
    for a, b in zip(net.parameters(), fitted.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_features_computed_under_inference_mode_train_as_their_clones():
    """Features a frozen backbone computed under torch.inference_mode (a Bayesian head on
    embeddings): autograd refused them ('Inference tensors cannot be saved for backward')."""
    x, y = torch.randn(32, 4), torch.arange(32) % 3
    with torch.inference_mode():
        frozen = [(x.clone(), y.clone())]
    runs = []
    for batches in (frozen, [(x, y)]):
        torch.manual_seed(0)
        model = pyrouq.bayesian(torch.nn.Sequential(torch.nn.Linear(4, 3)), num_data=32)
        runs.append(
            pyrouq.fit(model, pyrouq.mean_field_guide(model), batches, epochs=2, progress=False)
        )
    assert runs[0].losses == runs[1].losses


def test_a_plain_network_returning_a_dict_is_told_how_to_wrap_it():
    class Dict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 3)

        def forward(self, x):
            return {"logits": self.head(x)}

    x, y = torch.randn(8, 4), torch.arange(8) % 3
    with pytest.raises(TypeError) as info:
        pyrouq.fit(Dict(), None, [(x, y)], epochs=1, progress=False, num_data=8)
    assert str(info.value) == (
        "Dict.forward returned dict (keys 'logits'); pyrouq needs a network whose forward(x) "
        "returns one tensor of outputs (B, D) (logits for classification). Wrap it in a small "
        "nn.Module whose forward returns that tensor (net(x)['logits'] of a dict, net(x)[0] of "
        "a tuple)."
    )


def test_a_tensor_given_as_the_loader_is_told_to_serve_batches():
    """It was asked for num_data, then refused batch 1 as 'a Tensor'."""
    model = pyrouq.bayesian(torch.nn.Sequential(torch.nn.Linear(4, 3)))
    for x, kind in ((torch.randn(8, 4), "a Tensor"), (np.zeros((8, 4), np.float32), "an ndarray")):
        with pytest.raises(TypeError) as info:
            pyrouq.fit(model, pyrouq.mean_field_guide(model), x, epochs=1, progress=False)
        assert str(info.value) == (
            f"train_loader is {kind} (the inputs alone?), not (x, y) batches. "
            "Serve batches: pyrouq.ArrayLoader(x, y, batch_size=64), or "
            "torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)."
        )
