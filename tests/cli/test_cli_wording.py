"""The `pyrouq` command, sixth audit of its wording: library errors that reached command-line
users in Python's terms (fit()'s guide, num_members=, select=, rank1(), bayesian(net),
predict()'s advice) told in the command's: the factory, --method, --members, --lr."""

from __future__ import annotations

import pytest
import torch
from test_cli_sigterm_and_config import own_weight  # noqa: F401 (a factory of these tests, weights of its own)
from torch import nn

import pyrouq
from pyrouq.cli import main


def one_line_error(capsys, argv):
    assert main([*argv, "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    one_line_error.out = out  # what it printed before the error
    return err


def fit_error(capsys, tmp_path, factory, method, *more):
    argv = ["fit", f"test_cli_wording:{factory}", "--method", method, "--epochs", "1"]
    err = one_line_error(capsys, [*argv, "--train-size", "64", "--out", str(tmp_path / "r"), *more])
    assert not (tmp_path / "r").exists()  # refused before training: no run folder
    return err


# factories of these tests (`pyrouq fit test_cli_wording:...`)


def frozen() -> nn.Module:
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    return net.requires_grad_(False)


class _Attention(nn.Module):
    """Linear layers only inside nn.MultiheadAttention, which reads them as tensors."""

    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(28, 2, batch_first=True)
        self.w = nn.Parameter(torch.zeros(28, 10))

    def forward(self, x):
        s = x.squeeze(1)
        return self.att(s, s, s)[0].mean(1) @ self.w


def attention() -> nn.Module:
    return _Attention()


def batchensemble_net() -> nn.Module:
    return pyrouq.batchensemble(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), 4)


def bayesian_model() -> nn.Module:
    return pyrouq.BayesianMLP()


def three_member_layer() -> nn.Module:
    from pyrouq.nn import BatchEnsembleLinear

    return nn.Sequential(nn.Flatten(), nn.Linear(784, 8), BatchEnsembleLinear(8, 10, 3))


def shared_layer() -> nn.Module:
    fc = nn.Linear(784, 784)
    return nn.Sequential(nn.Flatten(), fc, nn.ReLU(), fc, nn.Linear(784, 10))


def data_parallel() -> nn.Module:
    return nn.DataParallel(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)))


def weight_normed() -> nn.Module:
    from torch.nn.utils.parametrizations import weight_norm

    return nn.Sequential(nn.Flatten(), weight_norm(nn.Linear(784, 10, bias=False)))


def test_a_frozen_network_under_plain_is_told_in_the_commands_words(tmp_path, capsys):
    """fit()'s 'Sequential and the guide have only frozen parameters' (the command has no
    guide), after the command had printed that it was fitting."""
    err = fit_error(capsys, tmp_path, "frozen", "plain")
    assert (
        "factory 'test_cli_wording:frozen' builds Sequential, whose parameters are all "
        "frozen (requires_grad=False): nothing for --method plain to train; leave the layers "
        "to train unfrozen in the factory, or pick a --method that adds factors to train "
        "(batchensemble or rank1)" in err
    )
    assert "guide" not in err and "fit()" not in err
    assert "fitting" not in one_line_error.out  # refused before it said it was fitting


@pytest.mark.parametrize("method", ["batchensemble", "rank1"])
def test_no_layer_for_a_batchensemble_names_the_factory_and_method(method, tmp_path, capsys):
    """'_OwnWeight has no nn.Linear or convolution layer to turn into BatchEnsemble layers.
    Pass a network with such layers.' named neither the factory nor --method."""
    err = fit_error(capsys, tmp_path, "own_weight", method)
    made = "rank-1" if method == "rank1" else "BatchEnsemble"  # (rank1's said BatchEnsemble)
    assert err.rstrip().endswith(
        f"factory 'test_cli_wording:own_weight', --method {method}: _OwnWeight has no "
        f"nn.Linear or convolution layer to turn into {made} layers. Make the factory "
        "return a network with such layers, or pick --method plain."
    )


@pytest.mark.parametrize(
    "factory, method, expected, python",
    [
        ("attention", "batchensemble", "kept shared. Give the network a plain nn.Linear / "
         "convolution that its forward calls (a head, or the subclass's extra computation "
         "moved outside the layer), or pick --method bayesian.", "pyrouq.bayesian(net)"),
        ("batchensemble_net", "rank1", "--method rank1: it converts a plain network, and the "
         "factory returned a BatchEnsembleNetwork, already a BatchEnsemble. Make the factory "
         "return the plain network, or pick --method bayesian to make the BatchEnsemble's "
         "factors latent.", "bayesian(ensemble)"),
        ("bayesian_model", "batchensemble", "--method batchensemble: BayesianMLP is already a "
         "pyrouq model, which --method batchensemble would convert again; make the factory "
         "return the plain network it was made from.", "pass the plain network"),
        ("three_member_layer", "batchensemble", "of another size than --members 4: '2' (3 "
         "members). They would mix the members of the folded batch. Make the factory return "
         "the plain network they were made from, or pass --members 3.", "num_members"),
        ("shared_layer", "rank1", "Register the layer once and call it as often as forward "
         "needs (one module called twice; one draw serves every call), or pick another "
         "--method (--method rank1 makes every layer's factors latent).", "select="),
        ("shared_layer", "bayesian", "one draw serves every call), or pick another --method.",
         "select="),
        ("data_parallel", "bayesian", "Cannot make Bayesian DataParallel: make the factory "
         "return the network inside it (net.module). To train on several devices, run "
         "`pyrouq fit` under torchrun: it shards the data and averages the gradients itself.",
         "fit()"),
    ],
)  # fmt: skip
def test_conversion_errors_speak_the_commands_words(
    factory, method, expected, python, tmp_path, capsys
):
    """The conversions' advice was Python's (bayesian(net), rank1(), num_members=, select=,
    fit() under torch.distributed), and the factory and --method went unnamed."""
    err = fit_error(capsys, tmp_path, factory, method)
    assert err.startswith(
        f"pyrouq: error: factory 'test_cli_wording:{factory}', --method {method}: "
    )
    assert expected in err
    assert python not in err and "rank1()" not in err


def test_the_select_rewording_is_not_cut_at_an_eg(tmp_path, capsys):
    """The first sentence of bayesian()'s error was cut at 'e.g.': '... computed by a
    parametrization (e.g; make the network fit --method bayesian ...'."""
    err = fit_error(capsys, tmp_path, "weight_normed", "bayesian")
    assert (
        "computed by a parametrization (e.g. weight_norm), not stored as parameters, and no "
        "bias; make the network fit --method bayesian, pick another --method" in err
    )


def test_a_diverged_network_is_told_to_lower_the_learning_rate(tmp_path, capsys):
    """The evaluation of a run whose last update made its weights non-finite (its loss was
    still finite) said predict()'s 'Expected finite probs, got 100000 NaN or inf entries;
    check the model outputs of inputs [0, 1, 2, 3, 4, ...]', at fit and at evaluate."""
    out = tmp_path / "r"
    argv = ["fit", "mlp", "--lr", "1e30", "--epochs", "1", "--train-size", "256"]
    err = one_line_error(capsys, [*argv, "--out", str(out)])
    told = (
        "pyrouq: error: the trained network predicts NaN or inf probabilities for 10000 of the "
        "10000 test images (did its weights diverge in training, after the last finite "
        "loss?); fit the run again with a lower --lr\n"
    )
    assert err == told
    assert (out / "checkpoint.pt").exists()  # the diverged run stays, as fit() saved it
    assert one_line_error(capsys, ["evaluate", str(out), "--ood", "none"]) == told


class _Bright(nn.Module):
    """Finite weights; NaN outputs for images brighter than MNIST's (some of Fashion-MNIST's)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(785, 10)

    def forward(self, x):
        h = x.flatten(1)
        return self.fc(torch.cat([h, torch.sqrt(1.5 - h.mean(1, keepdim=True))], 1))


def bright() -> nn.Module:
    return _Bright()


def test_nan_outputs_of_finite_weights_keep_predicts_message(tmp_path, capsys):
    # the weights did not diverge: "a lower --lr" would not help, and the inputs named are
    # what the user needs
    argv = ["fit", "test_cli_wording:bright", "--method", "plain", "--epochs", "1"]
    err = one_line_error(capsys, [*argv, "--train-size", "256", "--out", str(tmp_path / "r")])
    assert err.startswith("pyrouq: error: Expected finite probs, got "), err
    assert "check the model outputs of inputs [" in err and "--lr" not in err


def test_evaluate_of_a_bayesian_model_saved_without_its_guide(tmp_path, capsys):
    """predict()'s 'pass its fitted guide, predict(model, x, guide)' reached `evaluate`."""
    tmp_path.joinpath("run").mkdir()
    path = tmp_path / "run" / "checkpoint.pt"
    with pytest.warns(UserWarning, match=r"^save\(\): BayesianMLP .* saved without a guide"):
        pyrouq.save(path, pyrouq.BayesianMLP(), None, metadata={"note": "no config"})
    err = one_line_error(capsys, ["evaluate", str(tmp_path / "run")])
    assert err == (
        f"pyrouq: error: {str(path)!r} holds BayesianMLP, a Bayesian model, without its guide "
        "(`pyrouq fit` saves both), so there is no posterior to draw from; evaluate a run of "
        "`pyrouq fit`, or save the model with its fitted guide\n"
    )
    assert "predict(" not in err


class _CountedLast(nn.Module):
    """An integer counter held as a (frozen) parameter of its last layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.fc.count = nn.Parameter(torch.zeros(3, dtype=torch.long), requires_grad=False)

    def forward(self, x):
        return self.fc(x.flatten(1))


def counted_last() -> nn.Module:
    return _CountedLast()


def test_an_integer_parameter_is_told_to_be_a_buffer_not_made_floating_point(tmp_path, capsys):
    # "Make those layers floating-point" turned the counter into a latent site, drawn from
    # the prior, where the library's advice was to leave it out
    err = fit_error(capsys, tmp_path, "counted_last", "last-layer")
    assert "'fc.count' (torch.int64)" in err
    assert err.endswith(
        "Hold them as buffers (register_buffer), not parameters, or pick another --method "
        "(--method bayesian leaves them out).\n"
    ), err


@pytest.mark.parametrize(
    ("model", "method", "told"),
    [
        ("bayesian-mlp", "bayesian", ", its network as --method bayesian makes it already: leave "
         "--method out"),
        ("mlp", "batchensemble", ". Its --method batchensemble conversion is built in too: "
         "pyrouq fit batchensemble-mlp"),
        ("bayesian-lenet", "plain", ". Its --method plain conversion is built in too: pyrouq fit "
         "lenet"),
        ("lenet", "last-layer", ", and its --method last-layer conversion is not (the built-in "
         "models: bayesian-lenet, bayesian-mlp, batchensemble-lenet, batchensemble-mlp, "
         "rank1-lenet, lenet, mlp). Convert its network as a factory: pyrouq fit "
         "pyrouq.models:LeNet --method last-layer"),
    ],
)  # fmt: skip
def test_a_built_in_model_given_method_is_told_what_to_write_instead(
    model, method, told, tmp_path, capsys
):
    """'Leave --method out' named nothing to write for what was asked: the built-in model that
    is that conversion (mlp --method batchensemble: batchensemble-mlp), or the way to it."""
    err = one_line_error(capsys, ["fit", model, "--method", method, "--out", str(tmp_path / "r")])
    assert err == (
        "pyrouq: error: --method applies to a factory (package.module:factory); "
        f"{model} is a built-in model{told}\n"
    )
    assert not (tmp_path / "r").exists()
