"""nn.Bilinear joined what select=None makes latent and what select="last_layer" picks (the
previous release left it out). `pyrouq fit --resume` of a run that release started refused it
("holds a BayesianNetwork of another config: config['sites'] ... Rebuild the model with the
saved arguments", which a command's user cannot pass): the resumed run's network is now
converted with the latent sites its checkpoint records, and ends as the uninterrupted run did.
In Python, fit(resume_from=)'s refusal of other latent sites names them, bayesian(net,
select=[...]). batchensemble() and rank1(), which leave an nn.Bilinear as one layer all members
share, said nothing of it: they warn, naming it and what to do.

The previous release's runs are made by this one with nn.Bilinear taken out of the layer types
select= looks for (how the previous release picked the sites, to the name).
"""

from __future__ import annotations

import contextlib
import io
import warnings

import pytest
import torch
from torch import nn

import pyrouq
import pyrouq.convert._select as select_module
from pyrouq.cli import main

FACTORY = "test_cli_resume_bilinear:make"
ARGV = ["fit", FACTORY, "--epochs", "2", "--train-size", "128", "--batch-size", "64"]
ARGV += ["--seed", "7", "--num-samples", "2", "--no-progress"]
OLD_SITES = ["f.1.weight", "f.1.bias", "g.1.weight", "g.1.bias"]


class BilinearNet(nn.Module):
    """Two branches joined by an nn.Bilinear head; Ctrl-C (KeyboardInterrupt) at the
    ``stop_at``-th training-mode call (3: in epoch 2 of 2 batches), never when 0."""

    stop_at = 0
    calls = 0
    renamed = False  # the head registered as "head": not the run's network

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.ReLU())
        self.g = nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.ReLU())
        setattr(self, "head" if BilinearNet.renamed else "bil", nn.Bilinear(8, 8, 10))

    def forward(self, x):
        if self.training:
            BilinearNet.calls += 1
            if BilinearNet.calls == BilinearNet.stop_at:
                raise KeyboardInterrupt
        head = self.head if BilinearNet.renamed else self.bil
        return head(self.f(x), self.g(x))


def make() -> nn.Module:  # `pyrouq fit test_cli_resume_bilinear:make`
    return BilinearNet()


def _previous_release(patch):
    """Select's layer types as the previous release had them: no nn.Bilinear."""
    patch.setattr(select_module, "WEIGHTED_TYPES", (nn.Linear, nn.modules.conv._ConvNd))
    patch.setattr(select_module, "LINEAR_TYPES", (nn.Linear,))


def _run(argv, stop_at=0):
    BilinearNet.calls, BilinearNet.stop_at = 0, stop_at
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    BilinearNet.stop_at = 0
    return code, err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs of the previous release: for --method bayesian, uninterrupted (full) and stopped
    in epoch 2 (part); for --method last-layer, stopped in epoch 2 (last)."""
    folder = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYROUQ_DATA", raising=False)
        _previous_release(patch)
        assert _run([*ARGV, "--out", str(folder / "full")])[0] == 0
        for name, method in (("part", "bayesian"), ("last", "last-layer")):
            argv = [*ARGV, "--method", method, "--out", str(folder / name)]
            code, err = _run(argv, stop_at=3)
            assert code == 130 and "interrupted inside a training step" in err, err
    return folder


def _states(path):
    saved = pyrouq.load(path, module=make())
    guide = {"guide." + k: v for k, v in saved.guide.state_dict().items()}
    return saved, {**saved.model.state_dict(), **guide}


def _copy(run, to):
    to.mkdir()
    for name in ("checkpoint.pt", "config.json"):
        (to / name).write_bytes((run / name).read_bytes())
    return to


def test_resume_of_a_previous_release_run_goes_on_with_its_sites(runs, tmp_path, monkeypatch):
    """It was refused: "config['sites'] is [f.1.weight, ...] there and [..., bil.weight,
    bil.bias] in the model ... Rebuild the model with the saved arguments"."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run = _copy(runs / "part", tmp_path / "part")
    code, err = _run([*ARGV, "--method", "bayesian", "--out", str(run), "--resume"])
    assert code == 0, err
    got, got_states = _states(run / "checkpoint.pt")
    assert list(got.model.network_sites()) == OLD_SITES  # not bil.weight, bil.bias
    # the uninterrupted run's weights, guide and metrics, to the bit
    _, want_states = _states(runs / "full" / "checkpoint.pt")
    assert want_states.keys() == got_states.keys()
    assert [k for k in want_states if not torch.equal(want_states[k], got_states[k])] == []
    full = (runs / "full" / "metrics.json").read_text().split('"eval_seconds"')[0]
    assert (run / "metrics.json").read_text().split('"eval_seconds"')[0] == full


def test_resume_of_a_previous_release_last_layer_run_keeps_its_last_layer(
    runs, tmp_path, monkeypatch
):
    """Its last layer was g.1 (the last nn.Linear); this release's is bil: refused."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run = _copy(runs / "last", tmp_path / "last")
    code, err = _run([*ARGV, "--method", "last-layer", "--out", str(run), "--resume"])
    assert code == 0, err
    saved = pyrouq.load(run / "checkpoint.pt", module=make())
    assert list(saved.model.network_sites()) == ["g.1.weight", "g.1.bias"]
    assert saved.training is None and "metrics" in saved.metadata  # the finished run's
    # a new run of this release takes the bilinear head
    code, err = _run([*ARGV, "--method", "last-layer", "--out", str(tmp_path / "new")])
    assert code == 0, err
    new = pyrouq.load(tmp_path / "new" / "checkpoint.pt", module=make())
    assert list(new.model.network_sites()) == ["bil.weight", "bil.bias"]


def test_resume_with_a_network_lacking_the_runs_sites_is_refused_in_the_commands_words(
    tmp_path, monkeypatch
):
    """The run's sites are not all the network's: its factory builds another network (fit()
    refused it in Python's words, "Rebuild the model with the saved arguments")."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    argv = [*ARGV, "--method", "last-layer", "--out", str(tmp_path / "run")]
    assert _run(argv, stop_at=3)[0] == 130  # this release's: bil.weight, bil.bias
    monkeypatch.setattr(BilinearNet, "renamed", True)  # bil is "head" now
    code, err = _run([*argv, "--resume"])
    assert code == 2
    assert err == (
        "pyrouq: error: --resume: the run's checkpoint.pt holds 2 latent site(s) "
        "('bil.weight', 'bil.bias') that the network factory 'test_cli_resume_bilinear:make' "
        "builds has no parameter for, so it is not the network the run trained (--method "
        "last-layer); make the factory build that network, or start the run anew (the command "
        "without --resume, with --overwrite)\n"
    )


# --------------------------------------------------------------------------------------------
# fit(resume_from=) in Python: the refusal of other latent sites names the run's
# --------------------------------------------------------------------------------------------


def _loader(features, classes, n=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *features, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def test_fit_resume_from_of_other_sites_names_the_runs_select(tmp_path):
    path = tmp_path / "run.pt"
    loader = _loader((1, 28, 28), 10)
    old = pyrouq.bayesian(BilinearNet(), select=OLD_SITES)  # the previous release's sites
    BilinearNet.calls, BilinearNet.stop_at = 0, 3  # Ctrl-C in epoch 2
    try:
        with pytest.raises(KeyboardInterrupt):
            pyrouq.fit(old, pyrouq.mean_field_guide(old), loader, epochs=2, progress=False,
                       checkpoint=path)  # fmt: skip
    finally:
        BilinearNet.stop_at = 0
    new = pyrouq.bayesian(BilinearNet())  # bil.weight, bil.bias too
    with pytest.raises(pyrouq.CheckpointError) as refused:
        pyrouq.fit(new, pyrouq.mean_field_guide(new), loader, epochs=2, progress=False,
                   resume_from=path)  # fmt: skip
    message = " ".join(str(refused.value).split())
    assert message.endswith(
        "Its latent sites are not those select= picked here (another select=, or an earlier "
        "pyrouq's select=None or 'last_layer', which left nn.Bilinear out): convert the network "
        "with the run's, "
        "bayesian(net, select=['f.1.weight', 'f.1.bias', 'g.1.weight', 'g.1.bias']), and the "
        "run's other arguments."
    )
    # the way out it names resumes the run
    model = pyrouq.bayesian(BilinearNet(), select=OLD_SITES)
    result = pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=2,
                        progress=False, resume_from=path)  # fmt: skip
    assert [r.epoch for r in result.history] == [1, 2]


def test_fit_resume_from_of_many_other_sites_says_how_to_read_them(tmp_path):
    """More than six sites: how to read them, which evaluates to them (resume_from= a path, or
    the Checkpoint load() gives)."""
    path = tmp_path / "run.pt"
    loader = _loader((4,), 3)

    def make_net():
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Linear(4, 4) for _ in range(4)), nn.Linear(4, 3))

    old = pyrouq.bayesian(make_net(), select=["0", "1", "2", "3"])  # 8 sites, not the head's
    pyrouq.fit(old, pyrouq.mean_field_guide(old), loader, epochs=1, progress=False,
               checkpoint=path)  # fmt: skip
    new = pyrouq.bayesian(make_net())
    select = f"list(pyrouq.load({str(path)!r}, module=net).model.network_sites())"
    for source in (path, pyrouq.load(path, module=make_net())):
        with pytest.raises(pyrouq.CheckpointError) as refused:
            pyrouq.fit(new, pyrouq.mean_field_guide(new), loader, epochs=2, progress=False,
                       resume_from=source)  # fmt: skip
        message = " ".join(str(refused.value).split())
        assert message.endswith(
            f"convert the network with the run's, bayesian(net, select={select}), and the "
            "run's other arguments."
        )
        sites = eval(select, {"pyrouq": pyrouq, "net": make_net(), "resume_from": source})
        assert sites == list(old.network_sites())


# --------------------------------------------------------------------------------------------
# batchensemble() and rank1() keep an nn.Bilinear shared: a warning says so
# --------------------------------------------------------------------------------------------

SHARED = (
    "The nn.Bilinear layer(s) 'bil' of the network, which have no BatchEnsemble version, stay "
    "one layer each, one set of weights that all {m} members share: no factors of their own "
    "(in rank1(), none latent; in batchensemble(), bayesian(ensemble, select='last_layer') "
    "picks the last converted layer's, not theirs). To give each member its own, compute it as an "
    "nn.Linear(in1 * in2, out) of the flattened outer product, torch.einsum('bi,bj->bij', x1, "
    "x2).flatten(1), which is converted; or keep it shared."
)


def _warnings_of(call):
    with pytest.warns(UserWarning) as record:
        result = call()
    return result, [str(w.message) for w in record]


@pytest.mark.parametrize("convert", ["batchensemble", "rank1"])
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_batchensemble_and_rank1_warn_of_a_shared_bilinear(convert, tmp_path):
    members = 3 if convert == "batchensemble" else 2
    model, said = _warnings_of(lambda: getattr(pyrouq, convert)(BilinearNet(), members))
    assert SHARED.format(m=members) in said
    assert isinstance(model.net.bil, nn.Bilinear)  # one layer, all members
    # what the warning says of select="last_layer"
    if convert == "batchensemble":
        with pytest.warns(UserWarning, match="prior"):  # (a Normal(0, 1) prior on factors)
            latent = pyrouq.bayesian(model, select="last_layer")
        assert list(latent.network_sites()) == ["g.1.r", "g.1.s"]
    else:
        assert "bil.weight" not in model.network_sites()
    # a saved one loads without the warning (nothing to do about it then)
    pyrouq.save(tmp_path / "m.pt", model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pyrouq.load(tmp_path / "m.pt", module=BilinearNet())
    assert [str(w.message) for w in record if "nn.Bilinear" in str(w.message)] == []


def test_the_warnings_way_out_computes_the_bilinear_layer():
    """An nn.Linear(in1 * in2, out) of the flattened outer product is the nn.Bilinear (its
    weight flattened), and batchensemble() converts it, without the warning."""
    bil = nn.Bilinear(3, 4, 5)
    linear = nn.Linear(12, 5)
    with torch.no_grad():
        linear.weight.copy_(bil.weight.flatten(1))
        linear.bias.copy_(bil.bias)
    x1, x2 = torch.randn(6, 3), torch.randn(6, 4)
    outer = torch.einsum("bi,bj->bij", x1, x2).flatten(1)
    torch.testing.assert_close(linear(outer), bil(x1, x2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ensemble = pyrouq.batchensemble(nn.Sequential(linear), 2)
    assert type(ensemble.net[0]).__name__ == "BatchEnsembleLinear"
