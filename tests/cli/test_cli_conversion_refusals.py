"""The `pyrouq` command, seventh audit: the day's refusals of the conversions as a command-line
user meets them (a network holding PyroSample attributes, a BatchEnsemble's own network, a bare
convolution under --method last-layer, activation checkpointing, a network for colour images):
exit code 2, one line, no run folder left, and advice the command's user can follow (the
factory, --method) in place of Python's (select=, bayesian(ensemble), fit(checkpoint=...),
x.expand(...))."""

from __future__ import annotations

import traceback
import warnings

import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn
from torch.utils.checkpoint import checkpoint

import pyrouq
from pyrouq.cli import main

SELF = "test_cli_conversion_refusals"


def fit_error(capsys, tmp_path, factory, method, *more):
    """The one line `pyrouq fit SELF:factory --method method [more]` fails with (exit code 2),
    and what it printed before; the run folder must be gone."""
    argv = ["fit", f"{SELF}:{factory}", "--method", method, "--epochs", "1", "--train-size"]
    code = main([*argv, "64", "--no-progress", "--out", str(tmp_path / "r"), *more])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "r").exists()  # refused: no run folder left behind
    return err.rstrip("\n"), out


# factories of these tests (`pyrouq fit test_cli_conversion_refusals:...`)


class _Sampled(PyroModule):
    """A hand-written Pyro model: a PyroSample weight, a plain bias."""

    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](784, 10)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([10, 784]).to_event(2))

    def forward(self, x):
        return self.fc(x.flatten(1))


def sampled() -> nn.Module:
    return _Sampled()


def bare_conv() -> nn.Module:
    return nn.Conv2d(1, 10, 28)  # (B, 10, 1, 1) outputs: no nn.Linear at all


class _ConvHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(1, 10, 28)

    def forward(self, x):
        return self.c(x).flatten(1)


def conv_head() -> nn.Module:
    return _ConvHead()


def ensemble_net() -> nn.Module:
    """A BatchEnsemble's own network (ensemble.net): its layers are BatchEnsemble layers."""
    return pyrouq.batchensemble(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), 4).net


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        return checkpoint(self.fc, x.flatten(1), use_reentrant=False)


def checkpointed() -> nn.Module:
    return _Checkpointed()


def rgb() -> nn.Module:
    """A network for colour images (its first layer takes 3 channels)."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=9), nn.Flatten(), nn.Linear(36, 10))


_PARAMETERS = (
    "Make them ordinary parameters (a plain nn.Linear or nn.Conv2d in place of a "
    "PyroModule[...] or of pyrouq.nn.BayesianLinear / BayesianConv2d) in the factory, for "
    "--method {method} to convert, or train the Pyro model as it is in Python: "
    "pyrouq.fit(model, guide, ...) and pyrouq.predict(model, x, guide) take a Pyro model of "
    "one's own with its own guide (e.g. pyro.infer.autoguide.AutoNormal(model))."
)
_LATENT = (
    "A PyroSample is not a parameter, so it would be no latent site of the converted model: "
    "its module would draw it from its prior at every run, outside the guide (training could "
    "not learn it, and the evaluation's predictions would differ on every run). "
)
_ENSEMBLE = (
    "A PyroSample is not a parameter, so the conversion would lose its prior: a converted "
    "layer would keep one draw from it as its shared weight, and any other module would draw "
    "it anew at every run, outside the guide (training could not learn it, and one image "
    "would give other outputs on every run). "
)


@pytest.mark.parametrize("method", ["bayesian", "last-layer", "batchensemble", "rank1"])
def test_a_pyrosample_network_is_told_to_change_the_factory(method, tmp_path, capsys):
    """bayesian()'s, batchensemble()'s and rank1()'s refusal said 'bayesian() got a ...',
    'choose the latent ones with select= and prior=' and 'fit() could not learn it'."""
    err, _ = fit_error(capsys, tmp_path, "sampled", method)
    why = _ENSEMBLE if method in ("batchensemble", "rank1") else _LATENT
    assert err == (
        f"pyrouq: error: factory '{SELF}:sampled', --method {method}: the factory returned a "
        "_Sampled holding Pyro modules with sampled attributes (PyroSample): 'fc' "
        f"(PyroLinear): weight. {why}{_PARAMETERS.format(method=method)}"
    )
    assert "select=" not in err and "() got" not in err


def test_a_pyrosample_network_under_plain_is_refused_before_training(tmp_path, capsys):
    """fit()'s save refused it in Python's words ('fit(checkpoint=...) saves with
    pyrouq.save() ... Or leave checkpoint= out.'); a plain network holding such a module inside
    trained on prior draws and saved."""
    err, out = fit_error(capsys, tmp_path, "sampled", "plain")
    assert err == (
        f"pyrouq: error: factory '{SELF}:sampled' returned _Sampled, holding Pyro modules with "
        "sampled attributes (PyroSample): 'fc' (PyroLinear): weight. --method plain trains "
        "without a guide, so every run would draw them from their prior, never learnt; make "
        "them ordinary parameters in the factory (a plain nn.Linear or nn.Conv2d in place of a "
        "PyroModule[...] or of pyrouq.nn.BayesianLinear / BayesianConv2d) and return a plain "
        "nn.Module (not a PyroModule) for the --method, or train the Pyro model with its own "
        "guide in Python: pyrouq.fit(model, guide, ...)"
    )
    assert "fitting" not in out


def test_a_bare_convolution_under_last_layer_is_told_to_flatten_it_for_bayesian(tmp_path, capsys):
    """bayesian()'s 'The network itself is a Conv2d: select=None (all of it).' was cut off,
    and the command advised select=[...] in Python for a network that is one layer (a bare
    convolution's outputs keep their spatial dims: flattened, --method bayesian trains it)."""
    err, _ = fit_error(capsys, tmp_path, "bare_conv", "last-layer")
    assert err == (
        f"pyrouq: error: factory '{SELF}:bare_conv': --method last-layer needs an nn.Linear, "
        "and Conv2d has none; the network itself is a Conv2d: make the factory flatten its "
        "outputs to (B, D) (nn.Sequential(conv, nn.Flatten())) and pick --method bayesian (all "
        "of it)"
    )


def test_a_convolution_head_under_last_layer_names_the_layer_to_select(tmp_path, capsys):
    """The library names the last convolution (select=['c']); the command said select=[...]."""
    err, _ = fit_error(capsys, tmp_path, "conv_head", "last-layer")
    assert err == (
        f"pyrouq: error: factory '{SELF}:conv_head': --method last-layer needs an nn.Linear, "
        "and _ConvHead has none; make the network fit --method last-layer, pick another "
        "--method, or convert it in Python with pyrouq.bayesian(net, select=['c']) if that "
        "layer makes the outputs"
    )


@pytest.mark.parametrize("method", ["batchensemble", "rank1"])
def test_a_batchensembles_own_network_is_told_what_the_factory_should_return(
    method, tmp_path, capsys
):
    """'Pass the original plain network ... (batchensemble(net, M) and rank1(net, M) convert a
    copy ...); ... use pyrouq.bayesian(ensemble).'"""
    err, _ = fit_error(capsys, tmp_path, "ensemble_net", method)
    made = "rank-1" if method == "rank1" else "BatchEnsemble"  # (rank1's said BatchEnsemble)
    assert err == (
        f"pyrouq: error: factory '{SELF}:ensemble_net', --method {method}: Sequential has no "
        f"plain nn.Linear or convolution layer to turn into {made} layers: its layers "
        "'1' are BatchEnsemble layers already (the network of a BatchEnsemble, ensemble.net, "
        "or a part of it). Make the factory return the original plain network the ensemble was "
        "made from (with --method rank1 for latent factors)."
    )


def test_a_batchensembles_own_network_under_bayesian_is_told_it_holds_batchensemble_layers(
    tmp_path, capsys
):
    """bayesian()'s 'Its layers are BatchEnsemble layers: ... pass the BatchEnsemble itself'
    was cut off; the command advised select=[...] in Python."""
    err, _ = fit_error(capsys, tmp_path, "ensemble_net", "bayesian")
    assert err == (
        f"pyrouq: error: factory '{SELF}:ensemble_net': Sequential has no nn.Linear or "
        "convolution layer, so --method bayesian picks nothing; its layers are BatchEnsemble "
        "layers (a BatchEnsemble's own network, ensemble.net): make the factory return the "
        "plain network it was made from (--method rank1 for latent factors)"
    )


@pytest.mark.parametrize("method", ["bayesian", "batchensemble", "last-layer"])
def test_a_checkpointed_forward_is_refused_in_one_line_without_a_run_folder(
    method, tmp_path, capsys
):
    """Refused at the first run with gradients (in fit(), once the command said it was
    fitting): exit code 2, one line, the run folder gone, in the command's words (it advised
    bayesian()'s select=)."""
    torch.manual_seed(0)
    err, _ = fit_error(capsys, tmp_path, "checkpointed", method)
    assert err.startswith(
        f"pyrouq: error: factory '{SELF}:checkpointed', --method {method}: _Checkpointed runs "
        "'fc' inside torch.utils.checkpoint (activation checkpointing, called in the network's "
        "own forward)"
    )
    other = (  # (--method last-layer is refused here: its layer is the checkpointed one)
        ""
        if method == "last-layer"
        else ", or pick --method last-layer if the checkpointed layers are not the last nn.Linear"
    )
    assert err.endswith(
        "Turn checkpointing off in the factory (torchvision's DenseNet: memory_efficient=False; "
        f"a forward of your own: call the block directly){other}."
    )


@pytest.mark.parametrize("method", ["batchensemble", "rank1"])
def test_a_network_for_colour_images_is_told_to_change_the_factory(method, tmp_path, capsys):
    """Its first layer's refusal of the MNIST images said "Repeat the grey channel,
    x.expand(-1, 3, -1, -1)", which the command's user cannot do (the command loads them)."""
    err, _ = fit_error(capsys, tmp_path, "rgb", method)
    assert err.endswith(
        "got shape (2, 1, 28, 28): the model's input, of 1 channel where this layer takes 3. "
        "The command's images are MNIST's, of 1 channel: make the factory return a network for "
        "1 input channel (its first layer's in_channels=1)."
    ), err
    assert "x.expand" not in err


def test_a_network_for_colour_images_is_told_the_datasets_name(tmp_path, capsys, shared_data):
    """Under --dataset fashion-mnist the images were said to be "MNIST's"."""
    root = tmp_path / "fashion-only"
    root.mkdir()
    (root / "FashionMNIST").symlink_to(shared_data / "FashionMNIST")
    more = ("--dataset", "fashion-mnist", "--data-root", str(root))
    err, _ = fit_error(capsys, tmp_path, "rgb", "batchensemble", *more)
    assert "The command's images are Fashion-MNIST's, of 1 channel: make the factory" in err, err


def gaussian_ensemble() -> nn.Module:
    """A regression BatchEnsemble (a Gaussian likelihood) of MNIST's image size."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    return pyrouq.batchensemble(net, 2, likelihood=pyrouq.Gaussian("heteroscedastic"))


@pytest.mark.parametrize("method", ["plain", "bayesian"])
def test_a_regression_model_is_told_the_command_trains_classifiers(method, tmp_path, capsys):
    """A factory's model with a Gaussian likelihood (kept by --method plain, and by bayesian()
    of the ensemble) was trained on MNIST's labels and told fit()'s "class labels belong to a
    Categorical likelihood; for real targets use y.float() ... Fix the targets", which the
    command's user cannot do (the command loads them)."""
    err, out = fit_error(capsys, tmp_path, "gaussian_ensemble", method)
    assert err == (
        f"pyrouq: error: factory '{SELF}:gaussian_ensemble' returned BatchEnsembleNetwork with "
        "the likelihood Gaussian(scale='heteroscedastic'), a regression of real-valued "
        "targets; pyrouq fit trains a classifier of the data set's 10 classes on their labels: "
        "build it in the factory with the Categorical likelihood (the default: leave "
        "likelihood= out), or make the factory return the plain network for --method to convert"
    ), err
    assert "y.float()" not in err and "fitting" not in out  # refused before training


def wrapped_gaussian_ensemble() -> nn.Module:
    """The regression BatchEnsemble in DataParallel, whose attributes hide its likelihood."""
    return nn.DataParallel(gaussian_ensemble())


@pytest.mark.parametrize("method", ["plain", "bayesian"])
def test_a_wrapped_regression_model_is_told_the_command_trains_classifiers(
    method, tmp_path, capsys
):
    """The refusal read the factory's net.likelihood, which DataParallel does not forward:
    --method plain trained the model inside and fit() said "for real targets use y.float()
    ... Fix the targets", --method bayesian "Cannot make Bayesian DataParallel"."""
    err, out = fit_error(capsys, tmp_path, "wrapped_gaussian_ensemble", method)
    assert err.startswith(
        f"pyrouq: error: factory '{SELF}:wrapped_gaussian_ensemble' returned DataParallel "
        "holding BatchEnsembleNetwork with the likelihood Gaussian(scale='heteroscedastic'), "
        "a regression of real-valued targets; pyrouq fit trains a classifier"
    ), err
    assert "y.float()" not in err and "fitting" not in out  # refused before training


class LaplaceTargets(pyrouq.likelihoods.Likelihood):
    """A user's own regression likelihood (real targets only; the rest is never reached)."""

    def target_problem(self, y, num_outputs):
        return None if y.dtype.is_floating_point else f"targets of dtype {y.dtype}: y.float()"


class BinaryLabels(pyrouq.likelihoods.Likelihood):
    """A user's own likelihood of labels 0 and 1 (integers only)."""

    def target_problem(self, y, num_outputs):
        if y.dtype.is_floating_point or int(y.max()) > 1:
            return "labels other than 0 and 1: y.clamp(max=1)"
        return None


def laplace_ensemble() -> nn.Module:
    return pyrouq.batchensemble(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), 2,
                                likelihood=LaplaceTargets())  # fmt: skip


def binary_ensemble() -> nn.Module:
    return pyrouq.batchensemble(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), 2,
                                likelihood=BinaryLabels())  # fmt: skip


def test_a_model_whose_own_likelihood_refuses_the_labels_is_told_the_command_trains_classifiers(
    tmp_path, capsys
):
    """The refusal named the Gaussian likelihood: a regression likelihood of the user's own
    was trained on MNIST's labels and told fit()'s "Fix the targets" (its own advice, y.float(),
    the command's user cannot take). The likelihood is asked now, as fit() asks it."""
    err, out = fit_error(capsys, tmp_path, "laplace_ensemble", "plain")
    assert err == (
        f"pyrouq: error: factory '{SELF}:laplace_ensemble' returned BatchEnsembleNetwork with "
        "the likelihood LaplaceTargets(), a regression of real-valued targets; pyrouq fit "
        "trains a classifier of the data set's 10 classes on their labels: build it in the "
        "factory with the Categorical likelihood (the default: leave likelihood= out), or make "
        "the factory return the plain network for --method to convert"
    ), err
    assert "y.float()" not in err and "fitting" not in out  # refused before training
    err, out = fit_error(capsys, tmp_path, "binary_ensemble", "plain")
    assert err.startswith(
        f"pyrouq: error: factory '{SELF}:binary_ensemble' returned BatchEnsembleNetwork with "
        "the likelihood BinaryLabels(), which refuses class labels; pyrouq fit trains a "
        "classifier of the data set's 10 classes"
    ), err
    assert "clamp" not in err and "fitting" not in out


def classifier_ensemble() -> nn.Module:
    """A classifier BatchEnsemble of MNIST's image size (--method bayesian: latent factors)."""
    return pyrouq.batchensemble(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), 2)


def test_bayesian_of_a_batchensemble_warns_in_the_commands_words():
    """bayesian()'s warning of the Normal(0, s) prior on the factors advised "pass
    prior=dist.Normal(1.0, 0.1), or build it with pyrouq.rank1(net, M)", Python that a
    command-line user cannot write; the command's way out is the plain network, --method rank1.
    bayesian() says it in the command's words itself (no warning is caught or shown anew), at
    the command's call of it, and once per place under the "default" filter."""
    from pyrouq.cli._build import build
    from pyrouq.cli._parser import _build_parser

    spec = f"{SELF}:classifier_ensemble"
    args = _build_parser().parse_args(["fit", spec, "--method", "bayesian"])
    with pytest.warns(UserWarning) as caught:
        build(args, "bayesian")
    said = [w for w in caught if "rank-1 factors" in str(w.message)]
    assert [str(w.message) for w in said] == [
        f"factory {spec!r}, --method bayesian: puts a Normal(0, 1.0) prior (--prior-scale "
        "1.0) on the rank-1 factors of the BatchEnsembleNetwork it returned, which start near "
        "1 and scale the shared weights: that prior pulls them to 0. --method rank1 gives them "
        "Normal(1, 0.1): make the factory return the plain network the ensemble was made from "
        "and pick --method rank1."
    ], said
    assert said[0].filename.endswith("_build.py"), said[0].filename
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per place: _build's registry keeps count
        for _ in range(2):
            build(args, "bayesian")
    assert sum("rank-1 factors" in str(w.message) for w in caught) == 1, caught


def test_bayesian_outside_the_command_warns_in_its_own_words():
    """The command's words hold only while it calls bayesian(): after it, and after words given
    to a call that raised, bayesian() of a BatchEnsemble warns in its own (Python) words."""
    from pyrouq.cli._build import build
    from pyrouq.cli._parser import _build_parser
    from pyrouq.convert._rank1_factors import float_prior_words

    args = _build_parser().parse_args(["fit", f"{SELF}:classifier_ensemble"])
    with pytest.warns(UserWarning, match="^factory "):
        build(args, "bayesian")
    with pytest.raises(ValueError, match=r"^refused$"):
        with float_prior_words(lambda prior: f"in other words, {prior}"):
            raise ValueError("refused")
    with pytest.warns(UserWarning, match=r"^A float prior=0\.5 for a BatchEnsemble puts a No"):
        pyrouq.bayesian(classifier_ensemble(), prior=0.5)
    with pytest.warns(UserWarning, match=r"^in other words, 0\.5$"):
        with float_prior_words(lambda prior: f"in other words, {prior}"):
            pyrouq.bayesian(classifier_ensemble(), prior=0.5)


def test_bayesian_of_a_batchensemble_under_warnings_as_errors_raises_in_the_commands_words():
    """Under an "error" filter (python -W error) bayesian()'s warning of the factors is the
    error, in the command's words."""
    from pyrouq.cli._build import build
    from pyrouq.cli._parser import _build_parser

    spec = f"{SELF}:classifier_ensemble"
    args = _build_parser().parse_args(["fit", spec, "--method", "bayesian"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning) as raised:
            build(args, "bayesian")
    assert str(raised.value).startswith(
        f"factory {spec!r}, --method bayesian: puts a Normal(0, 1.0) prior (--prior-scale 1.0) "
        "on the rank-1 factors of the BatchEnsembleNetwork it returned"
    ), raised.value
    shown = "".join(traceback.format_exception(raised.value))  # (no Python advice chained)
    assert "dist.Normal(1.0, 0.1)" not in shown and "pyrouq.rank1(net" not in shown, shown


def test_a_filter_on_the_commands_words_of_the_factor_warning_ignores_it_or_raises_it():
    """The wrapper of showwarning (97ccbd1) gave the filters bayesian()'s words only, which the
    command's user never sees: python -W "ignore:factory" left the warning shown, and
    "error:factory" did not raise it. The filters see the command's words too now."""
    from pyrouq.cli._build import build
    from pyrouq.cli._parser import _build_parser

    spec = f"{SELF}:classifier_ensemble"
    args = _build_parser().parse_args(["fit", spec, "--method", "bayesian"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="factory ")
        build(args, "bayesian")
    assert [str(w.message) for w in caught if "rank-1 factors" in str(w.message)] == []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.filterwarnings("error", message="factory ", module="pyrouq.cli._build")
        with pytest.raises(UserWarning, match=r"^factory '.*', --method bayesian: puts a No"):
            build(args, "bayesian")


def gaussian_of_one_output() -> nn.Module:
    """A regression Bayesian model of one output per image (a Gaussian likelihood)."""
    return pyrouq.bayesian(nn.Sequential(nn.Flatten(), nn.Linear(784, 1)), likelihood="gaussian")


def test_a_regression_of_one_output_is_told_the_command_trains_classifiers(tmp_path, capsys):
    """It was told "make it output 10 logits" first, which, followed, met the refusal of a
    regression: the refusal that says what to change comes first."""
    err, _ = fit_error(capsys, tmp_path, "gaussian_of_one_output", "bayesian")
    assert "with the likelihood Gaussian(scale=" in err, err
    assert "a regression of real-valued targets; pyrouq fit trains a classifier" in err, err
    assert "output 10 logits" not in err, err
