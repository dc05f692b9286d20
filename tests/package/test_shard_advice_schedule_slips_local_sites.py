"""Review of five commits: the command's BatchNorm advice under torchrun (a first batch of one
on a rank whose shard holds one image, with --batch-size 1, was told a larger batch size, which
cannot help); fit()'s lr_schedule refusal (a name with spaces around it was told the names are
lower case; a hyphen was not asked about); predict()'s warning of a guide's per-input latent
draws, once per call and not for pyrouq's own networks."""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.distributed as dist_
from _processes import exit_quietly, spawn_ranks
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq
from pyrouq import bayesian, fit

# --------------------------------------------------------------------------------------------
# 1. `pyrouq fit` under torchrun: a first batch of one on a rank whose shard holds one image
# --------------------------------------------------------------------------------------------

HEAD = (
    "pyrouq: error: Batch 1 of epoch 1 holds 1 input of shape (1, 28, 28), and a BatchNorm in "
    "training mode needs 2 or more inputs per batch to normalise them (torch: 'Expected more "
    "than 1 value per channel')."
)


def _rank(rank: int, init: str, out: str, train_size: str, batch_size: str) -> None:
    """`pyrouq fit` on this rank of a gloo group of 2 (as torchrun starts it), its stderr and
    exit code saved."""
    torch.set_num_threads(1)
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
    dist_.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    from pyrouq.cli import main

    os.chdir(out)
    argv = ["fit", "_factories:batchnorm_mlp", "--method", "plain", "--epochs", "1"]
    argv += ["--train-size", train_size, "--batch-size", batch_size, "--out", "run"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([*argv, "--no-progress"])
        Path(out, f"rank{rank}.txt").write_text(f"{code}\n{err.getvalue()}")
    finally:
        dist_.destroy_process_group()
    exit_quietly()


def test_batch_size_1_on_ranks_whose_shard_is_one_image_is_told_the_train_size_too(tmp_path):
    """--train-size 2 on 2 ranks, --batch-size 1: each shard is one image. It said 'pass a
    --batch-size of 2 or more', which leaves each rank a batch of one all the same."""
    spawn_ranks(_rank, (str(tmp_path / "init"), str(tmp_path), "2", "1"))
    for rank in range(2):
        code, err = Path(tmp_path, f"rank{rank}.txt").read_text().split("\n", 1)
        assert code == "2", err
        assert err == HEAD + (
            " --batch-size 1 makes every batch one input, and the command splits the "
            "--train-size images among its 2 ranks, ceil(--train-size / 2) on each, which "
            "leaves one image on this rank: pass a --train-size of 3 or more and a --batch-size "
            "of 2 or more (or start fewer ranks).\n"
        ), err


# --------------------------------------------------------------------------------------------
# 2. fit()'s lr_schedule: how a near-miss differs from the name
# --------------------------------------------------------------------------------------------


def _fit(lr_schedule):
    net = bayesian(nn.Linear(4, 3))
    batches = [(torch.randn(4, 4), torch.randint(0, 3, (4,)))]
    return fit(net, None, batches, epochs=1, lr_schedule=lr_schedule, progress=False)


@pytest.mark.parametrize(
    "given, meant, how",
    [
        ("cosine ", "cosine", "have no spaces around them"),
        ("warmup-cosine", "warmup_cosine", "join their words with '_'"),
        ("warmup cosine", "warmup_cosine", "join their words with '_'"),
        (" Constant", "constant", "are lower case and have no spaces around them"),
        (
            "Warmup-Cosine ",
            "warmup_cosine",
            "are lower case, have no spaces around them and join their words with '_'",
        ),
        ("Cosine", "cosine", "are lower case"),
    ],
)
def test_an_lr_schedule_near_a_name_is_told_how_the_names_are_written(given, meant, how):
    """'cosine ' was told 'the names are lower case' (it is); 'warmup-cosine' got no hint."""
    with pytest.raises(ValueError) as info:
        _fit(given)
    assert str(info.value).startswith(
        f"Unknown lr_schedule {given!r} (did you mean {meant!r}? the names {how}): fit() takes "
        "one of 'warmup_cosine' (the default: "
    )


# --------------------------------------------------------------------------------------------
# 3. predict()'s warning of a guide's per-input latent draws
# --------------------------------------------------------------------------------------------


class _Local(PyroModule):
    """Global weights and a per-input latent offset z."""

    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](3, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", dist.Normal(0.0, 3.0))
            logits = logits + z[:, None] * torch.tensor([1.0, -1.0])
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_the_per_input_warning_comes_once_per_call_and_not_for_pyrouqs_own_networks():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(9, 3), torch.randint(0, 2, (9,))
    model = _Local()
    guide = AutoNormal(model)
    guide(x, y)
    batches = [x[:3], x[3:6], x[6:]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyrouq.predict(model, batches, guide, num_samples=2, progress=False, seed=0)
    told = [w for w in caught if "hold a value per input" in str(w.message)]
    assert len(told) == 1, [str(w.message) for w in caught]
    assert "the guide draws _Local's latent site(s) ['z']" in str(told[0].message)
    # pyrouq's own network under an AutoNormal of its own: global sites only, no warning
    net = bayesian(nn.Linear(3, 2))
    net.num_data = 9
    own = AutoNormal(net)
    own(x, y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyrouq.predict(net, x, own, num_samples=2, progress=False, seed=0)
    assert not [w for w in caught if "hold a value per input" in str(w.message)]
