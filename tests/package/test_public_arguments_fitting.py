"""The building / fitting / inference surface given the arguments users get wrong: each is
refused before any work, in words naming the argument, what came and what to pass, and the
numbers that stand for a documented one (numpy's) are taken as that number."""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from torch import nn

import pyrouq
from pyrouq import CheckpointError, KLWeightedELBO, bayesian, fit, mean_field_guide


def _fitted_pair():
    """A tiny Bayesian MLP and its guide, the guide's parameters made (one call)."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    x, y = toy_data(8)
    guide(x, y)
    return model, guide


def _values(module):
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        ("train.csv",
         r"Expected train_loader to be an iterable of \(x, y\) batches, got str 'train\.csv': "
         r"iterated, it gives one character at a time, not batches\. Serve batches: "
         r"pyrouq\.ArrayLoader"),
        ({"x": torch.zeros(4, 3), "y": torch.zeros(4, dtype=torch.long)},
         r"Expected train_loader to be an iterable of \(x, y\) batches, got dict with keys "
         r"\['x', 'y'\]: iterated, it gives its keys, not batches\."),
        (b"train.csv",
         r"^Expected train_loader to be an iterable of \(x, y\) batches, got bytes "
         r"b'train\.csv': iterated, it gives one byte \(an int\) at a time, not batches\. "
         r"Serve batches: pyrouq\.ArrayLoader\(x, y, batch_size=64\)"),
        (bytearray(b"train.csv"),
         r"^Expected train_loader to be an iterable of \(x, y\) batches, got bytearray "
         r"bytearray\(b'train\.csv'\): iterated, it gives one byte \(an int\) at a time, not "
         r"batches\. Serve batches: pyrouq\.ArrayLoader\(x, y, batch_size=64\)"),
    ],
    ids=["str", "dict", "bytes", "bytearray"],
)  # fmt: skip
def test_fit_refuses_a_string_bytes_or_a_dict_as_train_loader(loader, message):
    """A str and a dict were told "Cannot tell the training-set size N ... Pass num_data=N",
    which, once followed, led to "batch 1 of epoch 1 is a str"; a bytearray was told to pass
    num_data=N too (iterated, bytes give ints, not characters)."""
    model, guide = _fitted_pair()
    before = _values(guide)
    with pytest.raises(TypeError, match=message):
        fit(model, guide, loader, epochs=1, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters(), strict=True))


def test_fit_refuses_an_empty_list_of_batches_as_empty():
    """It was told to pass num_data=N, which only led to "yielded no batches"."""
    model, guide = _fitted_pair()
    with pytest.raises(
        ValueError,
        match=r"^train_loader is an empty list: it holds no batches\. Pass a loader with data",
    ):
        fit(model, guide, [], epochs=1, progress=False)


def test_fit_refuses_a_tensor_as_callbacks_in_its_own_words():
    """A 0-d tensor raised torch's "iteration over a 0-d tensor", naming no argument."""
    model, guide = _fitted_pair()
    x, y = toy_data(8)
    with pytest.raises(
        TypeError,
        match=r"Expected callbacks to be a sequence of callables, got tensor\(1\): each is "
        r"called as callback\(record\) after every epoch\. Pass a list",
    ):
        fit(model, guide, ListLoader(x, y, 4), epochs=1, progress=False, callbacks=torch.tensor(1))


@pytest.mark.parametrize(
    ("prior", "name"),
    [(dist.Normal, "Normal"), ({"0": dist.Laplace}, "Laplace")],
)
def test_bayesian_refuses_a_distribution_class_as_the_prior(prior, name):
    """``prior=dist.Normal`` was called as a prior function, dist.Normal('0.weight', param),
    and torch's "Input arguments must all be instances of Number" came out."""
    subject = r"The prior of '0\.weight'" if isinstance(prior, dict) else r"prior="
    with pytest.raises(
        TypeError,
        match=rf"{subject} must be a float \(the scale of Normal\(0, s\)\) or a "
        rf"pyro\.distributions distribution.*, got the class {name} itself; pass an instance, "
        rf"e\.g\. dist\.{name}\(0\.0, 1\.0\)\.",
    ):
        bayesian(nn.Sequential(nn.Linear(3, 2)), prior=prior)


def test_a_prior_function_still_gives_each_site_its_prior():
    """A callable ``(name, param) -> prior`` is still called (the class check spares it)."""
    model = bayesian(
        nn.Sequential(nn.Linear(3, 2)),
        prior=lambda name, param: dist.Laplace(0.0, 0.3 if name.endswith("weight") else 2.0),
    )
    priors = model.priors()
    assert float(priors["0.weight"].base_dist.scale.unique()) == pytest.approx(0.3)
    assert float(priors["0.bias"].base_dist.scale.unique()) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("training", "got"),
    [
        ("3", "got str"),
        ({"note": object()},
         r"got a dict whose training\['note'\] is an object, which load\(\) would refuse to "
         r"unpickle"),
    ],
)  # fmt: skip
def test_save_refuses_a_training_state_fit_could_not_resume_from(tmp_path, training, got):
    """save() wrote either: load() then refused the second file as holding pickled objects,
    and fit(resume_from=) failed on the first with "'str' object has no attribute 'get'"."""
    model, guide = _fitted_pair()
    path = tmp_path / "run.pt"
    with pytest.raises(
        CheckpointError,
        match=rf"Expected save\(training=\.\.\.\) to be the dict of resume state that fit\(\) "
        rf"writes, {got}\. Leave training out: fit\(checkpoint=PATH\) writes it",
    ):
        pyrouq.save(path, model, guide, training=training)
    assert not path.exists()


def test_resume_refuses_a_training_state_fit_did_not_write(tmp_path):
    """A hand-made training dict was resumed from until Python's KeyError: 'epochs_done'."""
    model, guide = _fitted_pair()
    path = pyrouq.save(tmp_path / "run.pt", model, guide, training={"epoch": 3})
    before = _values(guide)
    x, y = toy_data(8)
    with pytest.raises(
        CheckpointError,
        match=r"holds a training state that fit\(\) did not write \(no 'epochs_done', 'steps', "
        r"'epoch_steps', 'history', 'base_lrs', 'rng'\)",
    ):
        fit(model, guide, ListLoader(x, y, 4), epochs=2, progress=False, resume_from=path)
    assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters(), strict=True))
    # a state fit() wrote (its optimizer's too), edited: a count of None, no torch random
    # state, no sums of the epoch it stopped inside, learning rates or a history not in a
    # list failed in Python's words ("int() argument must be ... not 'NoneType'", KeyError:
    # 'torch', KeyError: 'sums', "'NoneType' object is not iterable"), on every rank alike
    run = tmp_path / "fit.pt"
    fit(model, guide, ListLoader(x, y, 4), epochs=1, progress=False, checkpoint=run)
    payload = torch.load(run, weights_only=True)
    first = payload["training"]["history"][0]
    before = _values(guide)
    for edit, told in [
        ({"epoch_steps": None}, r"'epoch_steps' is None, not a count"),
        ({"steps": -1}, r"'steps' is -1, not a count"),
        ({"rng": {}}, r"'rng' holds no torch random state"),
        ({"rng": {"torch": torch.zeros(3)}}, r"'rng' holds no torch random state"),
        ({"epoch_steps": 1, "sums": None}, r"no 'sums' of the epoch it stopped inside"),
        ({"base_lrs": None}, r"'base_lrs' is None, not a list of learning rates"),
        ({"history": None}, r"'history' is None, not a list of epoch records"),
        ({"steps": True}, r"'steps' is True, not a count"),  # (a bool is no count)
        ({"base_lrs": [None]}, r"'base_lrs' is \[None\], not a list of learning rates"),
        ({"history": [None]}, r"'history' is \[None\], not a list of epoch records"),
        # EpochRecord.__init__()'s TypeError ("got an unexpected keyword argument 'acc'",
        # "missing 1 required positional argument: 'seconds'"); zip()'s ValueError on resume
        (
            {"history": [{**first, "acc": 0.5}]},
            r"'history' record 1 has the keys \['epoch', 'loss', 'nll', 'kl', 'train_acc', "
            r"'seconds', 'acc'\], where an epoch record has \['epoch', 'loss', 'nll', 'kl', "
            r"'train_acc', 'seconds'\]",
        ),
        (
            {"history": [{k: v for k, v in first.items() if k != "seconds"}]},
            r"'history' record 1 has the keys \['epoch', 'loss', 'nll', 'kl', 'train_acc'\], where "
            r"an epoch record has \[.*, 'seconds'\]",
        ),
        (
            {"base_lrs": [0.01, 0.01]},
            r"'base_lrs' holds 2 learning rate\(s\), one per parameter "
            r"group, but its optimizer state has 1 parameter group\(s\)",
        ),
        # float(kl_weight)'s "could not convert string to float: 'x'" in the warning of a
        # changed kl_weight; an N or particles of none passed unseen
        ({"kl_weight": "x"}, r"'kl_weight' is 'x', not a weight of 0 or more"),
        ({"kl_weight": float("nan")}, r"'kl_weight' is nan, not a weight of 0 or more"),
        ({"num_data": None}, r"'num_data' is None, not a count from 1"),
        ({"num_particles": 0}, r"'num_particles' is 0, not a count from 1"),
        # the ranks the run trained on (recorded since 2026-12-07): taken as the warning's
        # "not recorded", so a resume on other ranks went on without it
        ({"world": 0}, r"'world' is 0, not a count from 1"),
        ({"world": "2"}, r"'world' is '2', not a count from 1"),
        ({"world": True}, r"'world' is True, not a count from 1"),
        (
            {"base_lrs": []},
            r"'base_lrs' holds 0 learning rate\(s\), one per parameter "
            r"group, but its optimizer state has 1 parameter group\(s\)",
        ),
    ]:
        path = tmp_path / "edited.pt"
        torch.save({**payload, "training": {**payload["training"], **edit}}, path)
        said = rf"holds a training state that fit\(\) did not write \({told}\): save\(train"
        with pytest.raises(CheckpointError, match=said):
            fit(model, guide, ListLoader(x, y, 4), epochs=2, progress=False, resume_from=path)
        assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters(), strict=True))
    # a file of a pyrouq that recorded no ranks (before 2026-12-07) resumes as it did
    older = tmp_path / "older.pt"
    training = {k: v for k, v in payload["training"].items() if k != "world"}
    torch.save({**payload, "training": training}, older)
    fit(model, guide, ListLoader(x, y, 4), epochs=2, progress=False, resume_from=older)
    fit(model, guide, ListLoader(x, y, 4), epochs=2, progress=False, resume_from=run)  # as is


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: KLWeightedELBO(kl_weight="1"), TypeError,
         r"^Expected kl_weight to be a float >= 0, got '1' \(a string: pass a float, "
         r"kl_weight=1\.0\)\. Pass a number, e\.g\. "
         r"kl_weight=1\.0 \(the exact ELBO\)\.$"),
        (lambda: KLWeightedELBO(num_particles=0), ValueError,
         r"^Expected num_particles to be an integer >= 1, got 0\. Pass the number of draws "
         r"from the guide per step, e\.g\. num_particles=1\.$"),
        (lambda: pyrouq.mcmc(tiny_mlp(), *toy_data(8), 2, 2, 1, max_tree_depth=0), ValueError,
         r"^Expected max_tree_depth to be a positive integer, got 0\. It caps NUTS's "
         r"trajectory doublings: e\.g\. 10\.$"),
        (lambda: bayesian(nn.Linear(3, 2), num_data=0), ValueError,
         r"^Expected num_data to be a positive integer, got 0\. Pass the training-set size N, "
         r"or leave num_data out \(fit\(\) sets it\)\.$"),
        (lambda: pyrouq.BatchEnsembleMLP(3, 4, 2, num_members=2, num_data=True), ValueError,
         r"^Expected num_data to be a positive integer, got True\. Pass the training-set size"),
    ],
)  # fmt: skip
def test_refusals_that_said_no_fix_now_say_what_to_pass(call, error, message):
    """These said what was expected and what came, but not what to do."""
    with pytest.raises(error, match=message):
        call()


def test_numpy_numbers_train_as_the_python_numbers_they_stand_for():
    """numpy's scalars (a value read from a config array, a grid) are the numbers they hold:
    the same run, loss for loss and weight for weight, as Python's."""
    x, y = toy_data(16)

    def run(**numbers):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = tiny_mlp()
        guide = mean_field_guide(model, init_scale=numbers.pop("init_scale"))
        result = fit(model, guide, ListLoader(x, y, 8), progress=False, **numbers)
        return [r.loss for r in result.history], _values(guide)

    python = run(epochs=2, lr=0.05, kl_weight=0.5, num_particles=2, seed=3, init_scale=0.02)
    numpy = run(
        epochs=np.int64(2),
        lr=np.float64(0.05),
        kl_weight=np.float32(0.5),
        num_particles=np.int32(2),
        seed=np.uint16(3),
        init_scale=np.float64(0.02),
    )
    assert python[0] == numpy[0]
    assert all(torch.equal(a, b) for a, b in zip(python[1], numpy[1], strict=True))
