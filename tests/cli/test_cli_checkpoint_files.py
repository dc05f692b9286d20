"""The `pyrouq` command and checkpoint files, eighth audit: a module's extra state that load()
would refuse is refused by save(), fit(checkpoint=) and `pyrouq fit` instead of written, load()
refuses a device it cannot use (the meta device took the model silently), an unexpanded '~'
is told by load() and expanded by `--out` / RUN_DIR as by --data-root, RUN_DIR given the
checkpoint file names its folder; and what held already, checked against independent runs: a
run of `pyrouq fit` stopped inside an epoch and resumed in Python as the command says ends
where the uninterrupted run ends, to the bit, and every conversion of a network with BatchNorm
predicts the same after save and load."""

from __future__ import annotations

import json
import os

import pyro
import pytest
import torch
from _cli import CtrlCAt, ctrl_c_net, one_line_error
from torch import nn

import pyrouq
from pyrouq.cli import main

TINY = ["--epochs", "1", "--train-size", "64", "--batch-size", "64", "--no-progress"]


# --------------------------------------------------------------------------------------------
# a module's extra state that load() would not read back
# --------------------------------------------------------------------------------------------


class _Calibration:
    """An object of one's own, as a module's get_extra_state() may return."""

    def __init__(self, value):
        self.value = value


class ExtraState(nn.Module):
    """An MNIST-sized network keeping a scale in its extra state, as an object or as a dict."""

    def __init__(self, as_object=True, in_features=784):
        super().__init__()
        self.fc = nn.Linear(in_features, 10)
        self.as_object, self.scale = as_object, 1.0

    def get_extra_state(self):
        return _Calibration(self.scale) if self.as_object else {"scale": self.scale}

    def set_extra_state(self, state):
        self.scale = state.value if isinstance(state, _Calibration) else state["scale"]

    def forward(self, x):
        return self.fc(x.flatten(1)) * self.scale


def extra_state_net() -> nn.Module:  # `pyrouq fit test_cli_checkpoint_files:extra_state_net`
    return ExtraState()


_CONVERSIONS = {
    "plain": lambda net: (net, None),
    "bayesian": lambda net: (m := pyrouq.bayesian(net), pyrouq.mean_field_guide(m)),
    "batchensemble": lambda net: (pyrouq.batchensemble(net, 2), None),
}


@pytest.mark.parametrize("kind", list(_CONVERSIONS))
def test_save_refuses_an_extra_state_load_would_not_read_back(tmp_path, kind):
    """save() wrote the object (pickled) and load() then refused the file as one holding
    pickled Python objects, telling to unpickle it with torch.load."""
    model, guide = _CONVERSIONS[kind](ExtraState(in_features=3))
    prefix = "" if kind == "plain" else "net."
    with pytest.raises(
        pyrouq.CheckpointError,
        match=rf"save\(\) cannot write \w+: its state entry '{prefix}_extra_state' is a "
        r"_Calibration \(what its module's get_extra_state\(\) "
        r"returns\), which load\(\) would refuse to unpickle.*Make get_extra_state\(\) return "
        r"tensors, numbers, strings, lists or dicts",
    ):
        pyrouq.save(tmp_path / "c.pt", model, guide)
    assert os.listdir(tmp_path) == []  # nothing written, no temporary file
    # an extra state of plain data is written and comes back
    model, guide = _CONVERSIONS[kind](ExtraState(as_object=False, in_features=3))
    (model if kind == "plain" else model.net).scale = 2.5
    back = pyrouq.load(pyrouq.save(tmp_path / "c.pt", model, guide), module=ExtraState(False, 3))
    assert (back.model if kind == "plain" else back.model.net).scale == 2.5


def test_fit_with_a_checkpoint_refuses_such_a_model_before_training(tmp_path):
    model = pyrouq.bayesian(ExtraState(in_features=3))
    guide = pyrouq.mean_field_guide(model)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    x, y = torch.randn(8, 3), torch.randint(0, 10, (8,))
    with pytest.raises(
        pyrouq.CheckpointError,
        match=r"fit\(checkpoint=\.\.\.\) saves with pyrouq\.save\(\), which refuses this run: "
        r"save\(\) cannot write BayesianNetwork: its state entry 'net\._extra_state'",
    ):
        pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, batch_size=4), epochs=1,
                   progress=False, checkpoint=tmp_path / "run.pt")  # fmt: skip
    assert all(torch.equal(v, before[k]) for k, v in guide.state_dict().items())  # untrained
    assert os.listdir(tmp_path) == []


def test_pyrouq_fit_refuses_such_a_factory_in_its_own_words(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["fit", "test_cli_checkpoint_files:extra_state_net", *TINY, "--out", str(out)]
    err = one_line_error(capsys, argv)
    assert err.startswith(
        "pyrouq: error: factory 'test_cli_checkpoint_files:extra_state_net', --method bayesian: "
        "the run's checkpoint.pt would not load: its state entry 'net._extra_state' is a "
        "_Calibration (what its module's get_extra_state() returns)"
    ), err
    assert "torch.save yourself" not in err and "checkpoint=" not in err  # Python's advice
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# load(device=...) and '~'
# --------------------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    model = pyrouq.BayesianMLP(in_features=4, hidden_features=5, out_features=3)
    return pyrouq.save(tmp_path / "c.pt", model, pyrouq.mean_field_guide(model))


def test_load_refuses_a_device_it_cannot_put_the_model_on(saved):
    # the meta device gave a model of shapes, every saved value dropped, without a word
    with pytest.raises(
        ValueError,
        match=r"load\(\): device='meta' holds shapes, no values, so the saved values would be "
        r"dropped\. Pass device='cpu' or 'cuda'",
    ):
        pyrouq.load(saved, device="meta")
    with pytest.raises(
        ValueError,
        match=r"load\(\): expected device to be a torch device, e\.g\. 'cpu' or 'cuda', got "
        r"'gpu' \(.*\)\. Pass device='cpu' or leave it out",
    ):
        pyrouq.load(saved, device="gpu")
    if not torch.cuda.is_available():  # torch's own error came after the whole rebuild
        with pytest.raises(ValueError, match=r"load\(\): torch cannot use device='cuda' here \("):
            pyrouq.load(saved, device="cuda")
    loaded = pyrouq.load(saved, device=torch.device("cpu"))
    assert {t.device.type for t in loaded.guide.state_dict().values()} == {"cpu"}


def test_load_of_a_path_with_an_unexpanded_tilde_says_so(saved, monkeypatch):
    monkeypatch.setenv("HOME", str(saved.parent))
    with pytest.raises(
        pyrouq.CheckpointError,
        match=r"No checkpoint at '~/c\.pt': the file does not exist \(its '~' is not expanded: "
        r"pass os\.path\.expanduser\('~/c\.pt'\)\)",
    ):
        pyrouq.load("~/c.pt")
    assert pyrouq.load(os.path.expanduser("~/c.pt")).model.config["hidden_features"] == 5


# --------------------------------------------------------------------------------------------
# the command's paths
# --------------------------------------------------------------------------------------------


def test_out_and_run_dir_expand_a_leading_tilde_as_data_root_does(tmp_path, monkeypatch, capsys):
    """`--out=~/runs/mlp` (no shell expands it) left a folder named '~' in the working folder
    and failed after loading the data, in fit()'s words (os.path.expanduser)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["fit", "mlp", *TINY, "--out=~/runs/mlp"]) == 0
    run = tmp_path / "home" / "runs" / "mlp"
    assert (run / "checkpoint.pt").is_file()
    assert os.listdir(here) == []  # no '~' folder
    config = json.loads((run / "config.json").read_text())
    assert config["command"].endswith("--no-progress '--out=~/runs/mlp'")  # as given
    capsys.readouterr()
    assert main(["evaluate", "~/runs/mlp", "--no-progress"]) == 0
    assert f"evaluating MLP from {run / 'checkpoint.pt'}" in capsys.readouterr().out
    fitted = json.loads((run / "metrics.json").read_text())
    again = json.loads((run / "metrics-evaluate.json").read_text())
    assert (again["acc"], again["nll"]) == (fitted["acc"], fitted["nll"])
    # the checkpoint file for RUN_DIR: its folder is named
    err = one_line_error(capsys, ["evaluate", "~/runs/mlp/checkpoint.pt"])
    assert err == (
        f"pyrouq: error: RUN_DIR {str(run / 'checkpoint.pt')!r} is a file; pass the run's "
        f"folder, {str(run)!r}\n"
    )


# --------------------------------------------------------------------------------------------
# a run of the command stopped inside an epoch, resumed in Python as the command says
# --------------------------------------------------------------------------------------------


def test_a_run_stopped_inside_an_epoch_resumes_in_python_to_the_uninterrupted_run(
    tmp_path, capsys, monkeypatch
):
    argv = ["fit", "_cli:ctrl_c_net", "--epochs", "2", "--train-size"]
    argv += ["256", "--batch-size", "64", "--seed", "5", "--num-samples", "2", "--no-progress"]
    monkeypatch.setattr(CtrlCAt, "at", 0)
    assert main([*argv, "--out", str(tmp_path / "full")]) == 0
    monkeypatch.setattr(CtrlCAt, "at", 3)  # inside epoch 1 (of 4 steps)
    assert main([*argv, "--out", str(tmp_path / "part")]) == 130
    assert (
        "interrupted in epoch 1 after step 3; the partial run is saved" in capsys.readouterr().err
    )
    monkeypatch.setattr(CtrlCAt, "at", 0)
    path = tmp_path / "part" / "checkpoint.pt"
    partial = pyrouq.load(path, module=ctrl_c_net())
    assert (partial.training["epochs_done"], partial.training["steps"]) == (0, 3)
    # what the command trained, rebuilt from its recorded config as a user would
    config = partial.metadata["config"]
    train, _ = pyrouq.load_mnist(config["batch_size"], seed=config["seed"],
                                 train_size=config["train_size"])  # fmt: skip
    model = pyrouq.bayesian(ctrl_c_net(), prior=config["prior_scale"])
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, train, epochs=config["epochs"], lr=config["lr"],
               kl_weight=config["kl_weight"], seed=config["seed"], resume_from=path,
               checkpoint=path, progress=False)  # fmt: skip
    full = pyrouq.load(tmp_path / "full" / "checkpoint.pt", module=ctrl_c_net())
    for want, got in ((full.model, model), (full.guide, guide)):
        want, got = want.state_dict(), got.state_dict()
        assert want.keys() == got.keys()
        assert [k for k in want if not torch.equal(want[k], got[k])] == []
    # and `pyrouq evaluate` of the resumed run prints what the uninterrupted run's printed
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "part"), "--no-progress"]) == 0
    assert "an interrupted run" not in capsys.readouterr().out
    fitted = json.loads((tmp_path / "full" / "metrics.json").read_text())
    again = json.loads((tmp_path / "part" / "metrics-evaluate.json").read_text())
    assert {k: again[k] for k in ("acc", "nll", "ece", "mutual_information")} == {
        k: fitted[k] for k in ("acc", "nll", "ece", "mutual_information")
    }


# --------------------------------------------------------------------------------------------
# round trips of a trained network with BatchNorm, every conversion
# --------------------------------------------------------------------------------------------


def _bn_net():
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 6),
        nn.BatchNorm1d(6, eps=1e-3), nn.ReLU(), nn.Linear(6, 4),
    )  # fmt: skip


_BN_KINDS = {
    "plain": lambda: (_bn_net(), None),
    "bayesian": lambda: (m := pyrouq.bayesian(_bn_net()), pyrouq.mean_field_guide(m)),
    "last-layer": lambda: (
        m := pyrouq.bayesian(_bn_net(), select="last_layer"),
        pyrouq.mean_field_guide(m),
    ),
    "guide-init-from": lambda: (
        m := pyrouq.bayesian(_bn_net()),
        pyrouq.mean_field_guide(m, init_from=_bn_net()),
    ),
    "batchensemble": lambda: (pyrouq.batchensemble(_bn_net(), 2), None),
    "batchensemble-shared": lambda: (pyrouq.batchensemble(_bn_net(), 2, norms="shared"), None),
    "rank1": lambda: (m := pyrouq.rank1(_bn_net(), 2), pyrouq.mean_field_guide(m)),
    "rank1-per-member": lambda: (
        m := pyrouq.rank1(_bn_net(), 2, norms="per_member"),
        pyrouq.mean_field_guide(m),
    ),
}


@pytest.mark.parametrize("kind", list(_BN_KINDS))
def test_a_trained_network_with_batchnorm_predicts_the_same_after_save_and_load(tmp_path, kind):
    torch.manual_seed(0)
    model, guide = _BN_KINDS[kind]()
    x, y = torch.randn(32, 1, 6, 6), torch.randint(0, 4, (32,))
    pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, batch_size=8, seed=0), epochs=1,
               progress=False, seed=0)  # fmt: skip
    model.eval()
    # the running statistics moved off their start, so a load that dropped them would show
    means = [b for n, b in model.named_buffers() if n.endswith("running_mean")]
    assert means and all(bool(m.abs().sum() > 0) for m in means)
    draws = 3 if guide is not None else None
    pyro.set_rng_seed(11)
    want = pyrouq.predict(model, x[:5], guide, num_samples=draws, progress=False).probs
    back = pyrouq.load(pyrouq.save(tmp_path / "run" / "c.pt", model, guide), module=_bn_net())
    pyro.set_rng_seed(11)
    got = pyrouq.predict(back.model, x[:5], back.guide, num_samples=draws, progress=False).probs
    assert torch.equal(got, want)
    # the same tensors as a state dict written and read by torch alone
    torch.save(model.state_dict(), tmp_path / "by_hand.pt")
    by_hand = torch.load(tmp_path / "by_hand.pt", weights_only=True)
    loaded = back.model.state_dict()
    assert by_hand.keys() == loaded.keys()
    assert [k for k in by_hand if not torch.equal(by_hand[k], loaded[k])] == []
    if guide is not None:
        assert all(
            torch.equal(v, back.guide.state_dict()[k]) for k, v in guide.state_dict().items()
        )


# --------------------------------------------------------------------------------------------
# a checkpoint one may not read (another user's run folder)
# --------------------------------------------------------------------------------------------


def test_a_checkpoint_without_read_permission_is_one_line(tmp_path, monkeypatch, capsys):
    """It was a PermissionError from inside the reader: a traceback from `pyrouq evaluate`.
    (The suite may run as root, whom no mode stops: os.access stands in for the file mode.)"""
    run = tmp_path / "run"
    pyrouq.save(run / "checkpoint.pt", pyrouq.MLP())
    access = os.access

    def no_read(path, mode, *args, **kwargs):
        if os.fspath(path).endswith("checkpoint.pt") and mode & os.R_OK:
            return False
        return access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", no_read)
    message = rf"{str(run / 'checkpoint.pt')!r} cannot be read: permission denied"
    with pytest.raises(pyrouq.CheckpointError, match=message.replace(".", r"\.")):
        pyrouq.load(run / "checkpoint.pt")
    err = one_line_error(capsys, ["evaluate", str(run)])
    assert err.startswith(f"pyrouq: error: {str(run / 'checkpoint.pt')!r} cannot be read")
