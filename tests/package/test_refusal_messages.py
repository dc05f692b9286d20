"""Refusals that named the wrong fault or gave no way out: a BatchNorm's batch of one input
under torch.distributed (the remainder is the rank's shard's), a number passed where the
targets go, an unknown MCMC kernel, and labels of an unsigned integer dtype."""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, Predictions, bayesian, fit, mcmc, mean_field_guide
from pyrouq.calibration import temperature_scale
from pyrouq.metrics import evaluate

WORLD = 2


def _bn_fit_refusal(kind: str) -> str:
    """fit() on 34 examples in batches of 8: one process would be fine (34 % 8 == 2), but each
    of 2 ranks trains on 17 (17 % 8 == 1)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(34, 3, generator=g), torch.randint(0, 2, (34,), generator=g)
    if kind == "array":
        loader = ArrayLoader(x, y, 8, seed=0)
    else:
        dataset = torch.utils.data.TensorDataset(x, y)
        sampler = torch.utils.data.DistributedSampler(dataset, seed=0)
        loader = torch.utils.data.DataLoader(dataset, 8, sampler=sampler)
    try:
        fit(model, mean_field_guide(model), loader, epochs=1, progress=False, seed=0)
    except ValueError as err:
        return str(err)
    return "no error"


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        told = {kind: _bn_fit_refusal(kind) for kind in ("array", "sampler")}
        torch.save(told, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_batch_of_one_under_ranks_names_the_ranks_shard(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    for rank in range(WORLD):
        told = torch.load(tmp_path / f"rank{rank}.pt")
        for kind in ("array", "sampler"):
            assert told[kind] == (
                "Batch 3 of epoch 1 holds 1 input(s) of shape (3,), and a BatchNorm in training "
                "mode needs more than one value per channel to normalise it (torch: 'Expected "
                "more than 1 value per channel'). fit() runs on 2 ranks (torch.distributed is "
                "initialised): each rank trains on its own shard of the 34 examples (17 on this "
                "rank), in batches of 8 (the batch size is per rank), so the remainder that "
                "counts is the shard's, not the whole data set's. That is usually the last "
                "batch of this rank's shard in an epoch: drop it (DataLoader(..., "
                "drop_last=True)) or pick a batch size that leaves no remainder of 1 from this "
                "rank's 17 examples."
            ), (rank, kind)


def _class_preds() -> Predictions:
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 6, 3, generator=g), -1)
    return Predictions(probs, torch.tensor([0, 1, 2, 0, 1, 2]))


@pytest.mark.parametrize(
    ("call", "name", "shown"),
    [
        (lambda p: temperature_scale(p, 0.5), "val_targets", "float 0.5"),
        (lambda p: evaluate(p, 2), "targets", "int 2"),
    ],
)
def test_a_number_where_the_targets_go_is_told_as_a_number(call, name, shown):
    # it was told "got float; wrap it with torch.as_tensor(...)": labels made of the number
    with pytest.raises(TypeError) as info:
        call(_class_preds())
    assert str(info.value) == (
        f"Expected {name} to be a tensor of labels, one per input, got a number ({shown}) in "
        f"their place. Pass the labels as a tensor ({name}=torch.as_tensor(labels)), or leave "
        f"{name} out to use those the predictions carry; a number meant for another parameter "
        "goes by that parameter's name."
    )


def _mcmc_refusal(kernel) -> str:
    pyro.clear_param_store()
    model = bayesian(nn.Sequential(nn.Linear(3, 2)))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError) as info:
        mcmc(model, x, y, 2, 2, 1, kernel=kernel, progress=False)
    return str(info.value)


def test_an_unknown_mcmc_kernel_is_told_what_to_pass():
    # "Unknown kernel 'NUTS': expected 'nuts' or 'hmc'." said nothing of the case, nor what to do
    assert _mcmc_refusal("NUTS") == (
        "Unknown kernel 'NUTS' (did you mean 'nuts'? the names are lower case): expected 'nuts' "
        "or 'hmc'. Pass kernel='nuts'."
    )
    assert _mcmc_refusal("Hmc").endswith(
        "lower case): expected 'nuts' or 'hmc'. Pass kernel='hmc'."
    )
    assert _mcmc_refusal("gibbs") == (
        "Unknown kernel 'gibbs': expected 'nuts' or 'hmc'. Pass kernel='nuts' (the No-U-Turn "
        "sampler, the default) or kernel='hmc' (Hamiltonian Monte Carlo with a fixed "
        "trajectory length)."
    )
    told = _mcmc_refusal(pyro.infer.NUTS(lambda: None))
    assert told.startswith("Unknown kernel NUTS: mcmc() takes a kernel's name, 'nuts' or 'hmc'")
    assert told.endswith("Pass kernel='nuts', or run pyro.infer.MCMC with a kernel of your own.")


def test_a_loader_yielding_a_dict_of_inputs_is_told_to_wrap_the_network():
    """A training batch whose x is a dict (a network of named inputs) is told to wrap the
    network, not to torch.as_tensor a dict."""
    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)))
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 2), torch.randint(0, 3, (8,))
    loader = [({"x": x}, y)]
    with pytest.raises(TypeError) as info:
        fit(model, guide, loader, epochs=1, num_data=8, progress=False)
    message = str(info.value)
    assert "batch 1 of epoch 1 is (dict of 1 entry, Tensor)" in message
    assert "Wrap the network in a small nn.Module whose forward takes one tensor" in message
    assert "as_tensor" not in message


def test_predict_names_what_came_with_its_article_and_tells_a_dict_to_wrap_the_network():
    """predict() of a dict, an int or None says what came in plain words, and a dict of
    inputs is told to wrap the network."""
    import numpy as np

    from pyrouq import predict

    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)))
    guide = mean_field_guide(model)
    with pytest.raises(TypeError) as info:
        predict(model, {"x": torch.randn(4, 2)}, guide, num_samples=2)
    assert "got a dict. Pass a tensor (N, ...) or a DataLoader. pyrouq runs networks of one" in (
        str(info.value)
    )
    assert "wrap it in a small nn.Module whose forward takes one tensor" in str(info.value)
    with pytest.raises(TypeError, match=r"got an int\. Pass a tensor"):
        predict(model, 3, guide, num_samples=2)
    with pytest.raises(TypeError, match=r"got None\. Pass a tensor"):
        predict(model, None, guide, num_samples=2)
    with pytest.raises(TypeError, match=r"got an ndarray of shape \(4, 2\)\. Convert an array"):
        predict(model, np.zeros((4, 2), dtype=np.float32), guide, num_samples=2)


def test_training_stopped_before_its_first_step_says_so_not_after_step_0():
    """A Ctrl-C at the loader's first fetch stops fit() before any step: its message says
    so, not "after step 0"."""
    from pyrouq import TrainingInterrupted

    class StopAtFirstFetch(ArrayLoader):
        def __iter__(self):
            raise KeyboardInterrupt

    x = torch.randn(8, 2)
    loader = StopAtFirstFetch(x, (x[:, 0] > 0).long(), 4, seed=0)
    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)))
    with pytest.raises(TrainingInterrupted) as info:
        fit(model, mean_field_guide(model), loader, epochs=1, progress=False)
    assert info.value.epoch == 1 and info.value.step == 0
    assert "Training interrupted in epoch 1 before its first step: the model and guide keep " in (
        str(info.value)
    )
    assert "after step 0" not in str(info.value)


def test_a_kernel_name_with_spaces_or_a_kernel_class_is_told_what_to_pass():
    # both were "expected 'nuts' or 'hmc'. Pass kernel='nuts' (...)": no word on the slip
    assert _mcmc_refusal("nuts ") == (
        "Unknown kernel 'nuts ' (did you mean 'nuts'? the names have no spaces around them): "
        "expected 'nuts' or 'hmc'. Pass kernel='nuts'."
    )
    assert _mcmc_refusal(" HMC").endswith(
        "(did you mean 'hmc'? the names are lower case and have no spaces around them): expected "
        "'nuts' or 'hmc'. Pass kernel='hmc'."
    )
    assert _mcmc_refusal("NUTS").endswith(
        "(did you mean 'nuts'? the names are lower case): expected 'nuts' or 'hmc'. Pass "
        "kernel='nuts'."
    )
    assert _mcmc_refusal(pyro.infer.NUTS) == (
        "Unknown kernel NUTS (a kernel class): mcmc() takes a kernel's name, 'nuts' or 'hmc', "
        "and builds it for the model (NUTS's depth: max_tree_depth). Pass kernel='nuts', or run "
        "pyro.infer.MCMC with a kernel of your own."
    )
    assert _mcmc_refusal(pyro.infer.HMC(lambda: None)).startswith("Unknown kernel HMC: ")
    assert _mcmc_refusal(None).startswith("Unknown kernel None: expected 'nuts' or 'hmc'. Pass")
