"""Refusals that said what was wrong but not what to do: an empty x or batchnorm_data given to
predict(), and mcmc() given a BatchEnsemble (whose latent-factor sibling, rank1, NUTS samples)."""

from __future__ import annotations

import pytest
import torch

import pyrouq


def plain():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def test_predict_of_an_empty_x_says_what_to_pass():
    model = pyrouq.batchensemble(plain(), 2)
    with pytest.raises(ValueError, match=r"x is empty\. Expected at least one input") as info:
        pyrouq.predict(model, torch.zeros(0, 4))
    assert "pass the inputs to predict" in str(info.value)


def test_predict_of_an_empty_batchnorm_data_says_what_to_pass():
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    model = pyrouq.bayesian(net, num_data=16)
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(ValueError, match="holds no inputs: it is empty") as info:
        pyrouq.predict(model, torch.randn(5, 4), guide, batchnorm_data=torch.zeros(0, 4))
    assert "leave batchnorm_data=None to use the running statistics" in str(info.value)


def test_mcmc_of_a_batchensemble_names_rank1_too():
    model = pyrouq.batchensemble(plain(), 2)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(TypeError, match="its members are point estimates") as info:
        pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2)
    assert "pyrouq.rank1(net, num_members) of the network given to batchensemble()" in str(
        info.value
    )


def test_the_command_tells_a_train_size_of_one_what_to_pass(tmp_path, capsys, monkeypatch):
    """fit()'s words for a first batch of one input ('Give batches of 2 or more ... larger
    batch_size') in the command's terms: the command's loader is --train-size's."""
    from pyrouq.cli import main

    monkeypatch.chdir(tmp_path)
    argv = ["fit", "_factories:batchnorm_mlp", "--method", "plain", "--epochs", "1"]
    argv += ["--train-size", "1", "--batch-size", "4", "--out", "run", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: Batch 1 of epoch 1 holds 1 input of shape"), err
    assert err.endswith("--train-size 1 leaves one example: pass a --train-size of 2 or more.\n"), (
        err
    )
