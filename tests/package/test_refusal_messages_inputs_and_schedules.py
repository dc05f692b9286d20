"""Three refusals that did not say what to do: a network given a dict (or several tensors,
None) as its input; fit() given an lr_schedule of another case or an unknown name; and, under
torchrun, the command's advice for a last training batch of one under a BatchNorm, which
reasoned about the whole data set when the remainder that counts is each rank's shard's."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import BayesianMLP, bayesian, fit
from pyrouq._batchnorm import one_value_in_training
from pyrouq.cli._fit_words import batchnorm_in_command_words
from pyrouq.data import TensorLoader

# --------------------------------------------------------------------------------------------
# 1. a network's input that is not one tensor
# --------------------------------------------------------------------------------------------

WRAP = (
    "wrap the network in a small nn.Module whose forward takes one tensor and builds {} from "
    "it, and convert that wrapper (e.g. bayesian(Wrapped(net)))."
)


class _DictNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, inputs: dict) -> torch.Tensor:
        return self.linear(inputs["x"])


class _Wrapped(nn.Module):
    """What the refusal says to write: one tensor in, the dict built inside."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net({"x": x})


def test_a_converted_network_given_a_dict_is_told_to_wrap_it():
    """It said 'BayesianNetwork expects a torch.Tensor input, got dict.' and no more."""
    x = torch.randn(2, 4)
    with pytest.raises(TypeError) as info:
        bayesian(_DictNet())({"x": x})
    assert str(info.value) == (
        "BayesianNetwork expects a torch.Tensor input, got dict: pyrouq runs networks of one "
        "tensor input (a batch of shape (B, ...)). For a network whose forward takes a dict, "
        + WRAP.format("the dict")
    )
    assert bayesian(_Wrapped(_DictNet()))(x).shape[-2:] == (2, 3)  # what it says works


def test_a_network_given_several_tensors_is_told_to_wrap_a_network_of_several_inputs():
    with pytest.raises(TypeError) as info:
        bayesian(nn.Linear(4, 3))((torch.randn(2, 4), torch.randn(2, 4)))
    message = str(info.value)
    assert message.startswith(
        "BayesianNetwork expects a torch.Tensor input, got tuple of tensors: for a loader's "
        "(x, y) batch, pass x alone (x, y = batch); for one tensor per input, torch.stack(...) "
        "them. "
    )
    assert message.endswith(
        "pyrouq runs networks of one tensor input: for a network whose forward takes several "
        "tensors, " + WRAP.format("them")
    )
    assert "as_tensor" not in message


@pytest.mark.parametrize("net", [BayesianMLP(4, 8, 3), bayesian(nn.Linear(4, 3))])
def test_a_network_given_none_is_told_to_pass_its_batch(net):
    with pytest.raises(TypeError) as info:
        net(None)
    assert str(info.value).endswith(
        "expects a torch.Tensor input, got NoneType: pass the batch of inputs, one tensor of "
        "shape (B, ...), not None."
    )
    assert "as_tensor" not in str(info.value)  # torch.as_tensor(None) fails too


def test_a_network_given_an_array_is_told_to_as_tensor_it_and_no_more():
    with pytest.raises(TypeError) as info:
        bayesian(nn.Linear(4, 3))(np.zeros((2, 4), dtype=np.float32))
    assert str(info.value) == (
        "BayesianNetwork expects a torch.Tensor input, got ndarray; convert it with "
        "torch.as_tensor(x)."
    )


# --------------------------------------------------------------------------------------------
# 2. fit()'s lr_schedule
# --------------------------------------------------------------------------------------------

SCHEDULES = (  # (not "decay to 0": the last step takes 0.038 of the rate in a run of 10)
    "fit() takes one of 'warmup_cosine' (the default: a linear ramp over the first 20 % of the "
    "steps up to the learning rate given, then a half-cosine decay from it towards 0, reached "
    "one step after the last), 'cosine' (a half-cosine decay towards 0 from the first step, "
    "reached one step after the last), 'constant' (the learning rate as given at every step). "
    "Pass one of these names as lr_schedule."
)


def _fit(lr_schedule):
    net = bayesian(nn.Linear(4, 3))
    batches = [(torch.randn(4, 4), torch.randint(0, 3, (4,)))]
    return fit(net, None, batches, epochs=1, lr_schedule=lr_schedule, progress=False)


@pytest.mark.parametrize("given, meant", [("Cosine", "cosine"), ("CONSTANT", "constant")])
def test_an_lr_schedule_of_another_case_is_asked_whether_it_meant_the_name(given, meant):
    """It said "Unknown lr_schedule 'Cosine': expected 'warmup_cosine', 'cosine' or
    'constant'.": no gloss, no what-to-do, no case hint."""
    with pytest.raises(ValueError) as info:
        _fit(given)
    assert str(info.value) == (
        f"Unknown lr_schedule {given!r} (did you mean {meant!r}? the names are lower case): "
        + SCHEDULES
    )


@pytest.mark.parametrize(
    "given, said", [("linear", "'linear'"), (None, "None"), (2, "of type int")]
)
def test_an_unknown_lr_schedule_is_told_the_schedules_and_what_each_does(given, said):
    with pytest.raises(ValueError) as info:
        _fit(given)
    assert str(info.value) == f"Unknown lr_schedule {said}: " + SCHEDULES
    assert "did you mean" not in str(info.value)


# --------------------------------------------------------------------------------------------
# 3. the command's words for a last training batch of one under a BatchNorm, on ranks
# --------------------------------------------------------------------------------------------

HEAD = (
    "Batch 2 of epoch 1 holds 1 input(s) of shape (1, 28, 28), and a BatchNorm in training "
    "mode needs more than one value per channel to normalise it (torch: 'Expected more than 1 "
    "value per channel')."
)
ONE_PROCESS = HEAD + (
    " That is usually the last batch of an epoch: drop it (DataLoader(..., drop_last=True)) "
    "or pick a batch size that leaves no remainder of 1."
)
ON_RANKS = HEAD + (
    " fit() runs on 2 ranks (torch.distributed is initialised): each rank trains on its own "
    "shard of the 203 examples (102 on this rank), in batches of 101 (the batch size is per "
    "rank), so the remainder that counts is the shard's, not the whole data set's. That is "
    "usually the last batch of this rank's shard in an epoch: drop it (DataLoader(..., "
    "drop_last=True)) or pick a batch size that leaves no remainder of 1 from this rank's 102 "
    "examples."
)
SHARD_ADVICE = (
    " The command runs on 2 ranks: each trains on its shard of the 203 images, "
    "ceil(203 / 2) = 102 of them, in batches of --batch-size 101 (per rank), so the remainder "
    "that counts is the shard's, not the whole data set's. That is the last batch of each "
    "rank's shard in the epoch: pick a --batch-size (or --train-size) that leaves no remainder "
    "of 1 from the ceil(203 / 2) = 102 images of each rank."
)
_X = torch.zeros(1, 1, 28, 28)  # fit()'s batch of one input


class _Untold:
    """A loader that tells its batch size, not its shard."""

    batch_size = 101


def _refusal(step: int, loader=None, world: int = 1, says: str | None = None):
    """fit()'s refusal of batch ``step`` of epoch 1, one input (it says ``says``)."""
    refusal = one_value_in_training(_X, 1, step, loader, world)
    assert says is None or str(refusal) == says
    return refusal


def test_one_process_keeps_the_whole_data_sets_remainder():
    assert batchnorm_in_command_words(_refusal(2, says=ONE_PROCESS), 100, 1) == HEAD + (
        " That is the last batch of the epoch: pick a --batch-size (or --train-size) that "
        "leaves no remainder of 1."
    )


def test_on_two_ranks_the_command_tells_the_remainder_of_each_ranks_shard():
    """It kept fit()'s shard words and then said 'pick a --batch-size (or --train-size) that
    leaves no remainder of 1', of the whole data set: 203 % 101 is 1 as much as 102 % 101."""
    images, labels = torch.zeros(203, 28, 28, dtype=torch.uint8), torch.zeros(203).long()
    loader = TensorLoader(
        images, labels, 101, shuffle=False, flatten=False, normalize=False, seed=0
    )  # 203 images on 2 ranks: shards of 102
    said = batchnorm_in_command_words(_refusal(2, loader, 2, ON_RANKS), 101, 2)
    assert said == HEAD + SHARD_ADVICE
    assert "drop_last" not in said and "DataLoader" not in said


def test_on_ranks_a_shard_fit_does_not_count_is_told_by_its_formula():
    uncounted = _refusal(2, _Untold(), 2)
    assert "its own shard of the examples, in batches of 101" in str(uncounted)
    said = batchnorm_in_command_words(uncounted, 101, 2)
    assert said.endswith(
        "each trains on its shard of the images, ceil(--train-size / 2) of them, in batches of "
        "--batch-size 101 (per rank), so the remainder that counts is the shard's, not the whole "
        "data set's. That is the last batch of each rank's shard in the epoch: pick a "
        "--batch-size (or --train-size) that leaves no remainder of 1 from the "
        "ceil(--train-size / 2) images of each rank."
    )


def test_on_ranks_a_first_batch_of_one_is_told_the_train_size_per_rank():
    first = (
        "Batch 1 of epoch 1 holds 1 input of shape (1, 28, 28), and a BatchNorm in training mode "
        "needs 2 or more inputs per batch to normalise them (torch: 'Expected more than 1 value "
        "per channel'). Give batches of 2 or more inputs (more examples, or a larger batch_size)"
        ", or freeze the BatchNorm with .eval()."
    )
    head = first.split(" Give batches")[0]
    refusal = _refusal(1)
    assert str(refusal).startswith(head + " Give batches of 2 or more inputs (more examples, or")
    assert batchnorm_in_command_words(refusal, 4, 1) == head + (
        " --train-size 1 leaves one example: pass a --train-size of 2 or more."
    )
    assert batchnorm_in_command_words(refusal, 4, 2) == head + (
        " The command splits the --train-size images among its 2 ranks, ceil(--train-size / 2) "
        "on each, which leaves one image on this rank: pass a --train-size of 3 or more (or "
        "start fewer ranks)."
    )
    assert batchnorm_in_command_words(refusal, 1, 2).endswith(
        " --batch-size 1 makes every batch one input: pass a --batch-size of 2 or more."
    )


def _rank(rank: int, init: str, out: str) -> None:
    """`pyrouq fit` on this rank of a gloo group of 2 (as torchrun starts it: WORLD_SIZE set,
    the group made here), its stderr and exit code saved."""
    torch.set_num_threads(1)
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    from pyrouq.cli import main

    os.chdir(out)
    argv = ["fit", "_factories:batchnorm_mlp", "--method", "plain", "--epochs", "1"]
    argv += ["--train-size", "203", "--batch-size", "101", "--out", "run", "--no-progress"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        Path(out, f"rank{rank}.txt").write_text(f"{code}\n{err.getvalue()}")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_under_two_ranks_the_command_tells_the_shards_remainder(tmp_path):
    """203 images on 2 ranks: shards of 102, in batches of 101, leave a last batch of 1."""
    spawn_ranks(_rank, (str(tmp_path / "init"), str(tmp_path)))
    for rank in range(2):
        code, err = Path(tmp_path, f"rank{rank}.txt").read_text().split("\n", 1)
        assert code == "2", err
        assert err.count("\n") == 1, err
        assert err.startswith("pyrouq: error: Batch 2 of epoch 1 holds 1 input(s) of shape")
        assert err.endswith(SHARD_ADVICE + "\n"), err
