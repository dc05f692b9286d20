"""Checkpoints, resume, interruption, input refusal, determinism and isolation (issue 9)."""

from __future__ import annotations

import functools
import json
import math
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pyro
import pytest
import torch
from _toy import StopAfter
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyrouq
from pyrouq import (
    MLP,
    BatchEnsembleLeNet,
    BatchEnsembleMLP,
    BayesianLeNet,
    BayesianMLP,
    CheckpointError,
    LeNet,
    TrainingInterrupted,
    bayesian,
    fit,
    load,
    load_mnist,
    mean_field_guide,
    predict,
    rank1,
    save,
)
from pyrouq.data import TensorLoader


def small_mlp(**kw):
    return BayesianMLP(hidden_features=16, **kw)


@pytest.fixture(scope="module")
def mnist_small():
    """512 MNIST training images (flattened), in an in-memory loader factory."""
    train, test = load_mnist(batch_size=64, train_size=512, seed=3, flatten=True)
    return train, test.transform(test.images[:64]), test.labels[:64]


def loader_like(train, seed=3):
    return TensorLoader(
        train.images, train.labels, 64, shuffle=True, flatten=True, normalize=True, seed=seed
    )


def params_of(model, guide):
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    if guide is not None:
        state.update({f"guide.{k}": v.clone() for k, v in guide.state_dict().items()})
    return state


def history_values(result):
    return [(r.epoch, r.loss, r.nll, r.kl, r.train_acc) for r in result.history]


# --------------------------------------------------------------------------------------------
# save / load
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: (MLP(hidden_features=8), None),
        lambda: (LeNet(), None),
        lambda: (BayesianMLP(hidden_features=8, prior_scale=0.3), "guide"),
        lambda: (BayesianLeNet(local_reparameterization=True), "guide"),
        lambda: (BatchEnsembleMLP(hidden_features=8, num_members=3), None),
        lambda: (BatchEnsembleLeNet(num_members=2), None),
    ],
    ids=["mlp", "lenet", "bayesian-mlp", "bayesian-lenet", "be-mlp", "be-lenet"],
)
def test_round_trip_rebuilds_class_config_and_parameters(tmp_path, build):
    model, want_guide = build()
    guide = mean_field_guide(model) if want_guide else None
    if guide is not None:
        with torch.no_grad():
            for p in guide.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    path = save(tmp_path / "c.pt", model, guide, metadata={"acc": 0.5, "tags": ["a"]})
    ckpt = load(path)
    assert type(ckpt.model) is type(model)
    assert getattr(ckpt.model, "config", None) == getattr(model, "config", None)
    assert ckpt.metadata == {"acc": 0.5, "tags": ["a"]}
    assert ckpt.description["versions"]["pyrouq"] == pyrouq.__version__
    assert ckpt.description["versions"]["torch"] == torch.__version__
    for key, value in params_of(model, guide).items():
        assert torch.equal(params_of(ckpt.model, ckpt.guide)[key], value), key
    assert (ckpt.guide is None) == (guide is None)
    assert not ckpt.model.training


def test_a_relative_guide_keeps_its_option_through_a_checkpoint(tmp_path):
    model = BayesianMLP(hidden_features=8)
    guide = mean_field_guide(model, init_scale_relative=0.1)
    ckpt = load(save(tmp_path / "c.pt", model, guide))
    assert ckpt.guide.init_scale_relative == 0.1
    for key, value in params_of(model, guide).items():
        assert torch.equal(params_of(ckpt.model, ckpt.guide)[key], value), key


def test_a_checkpoints_repr_is_one_line_of_classes_and_sizes(tmp_path):
    # the dataclass's repr held the whole model's and guide's reprs and the optimizer state's
    # tensors (~2,000 characters for a 4-3 linear layer); it names classes and sizes now
    model = bayesian(nn.Linear(4, 3))
    guide = mean_field_guide(model)
    data = pyrouq.ArrayLoader(torch.randn(8, 4), torch.arange(8) % 3, batch_size=4, seed=0)
    fit(model, guide, data, epochs=2, progress=False, checkpoint=tmp_path / "run.pt")
    ckpt = load(tmp_path / "run.pt", module=nn.Linear(4, 3))
    assert repr(ckpt) == (
        "Checkpoint(model=<BayesianNetwork, 2 latent sites (15 values)>, guide=<MeanFieldGuide, "
        "30 parameters>, optimizer_state=<saved>, metadata={}, training=<2 of 2 epochs done>, "
        f"path={str(tmp_path / 'run.pt')!r})"
    )
    assert ckpt.optimizer_state["param_groups"] and ckpt.training["epochs_done"] == 2
    metadata = {"config": {f"option_{i}": i for i in range(20)}, "metrics": {"acc": 0.9}}
    ensemble = load(save(tmp_path / "e.pt", BatchEnsembleMLP(4, 8, 3), metadata=metadata))
    # 4 members, 4-8-3: W 32 + 24, r 16 + 32, s 32 + 12, biases 32 + 12
    assert repr(ensemble).startswith(
        "Checkpoint(model=<BatchEnsembleMLP, 192 parameters>, guide=None, optimizer_state=None, "
        "metadata=<keys 'config', 'metrics'>, training=None, path="
    )
    assert ensemble.metadata == metadata


@pytest.mark.skipif(not hasattr(nn, "RMSNorm"), reason="nn.RMSNorm needs torch >= 2.4")
def test_a_norm_saved_shared_by_per_member_ensembles_loads_as_each_members_copy(tmp_path):
    # a per-member BatchEnsemble saved when nn.RMSNorm stayed one shared layer
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 5), nn.RMSNorm(5), nn.Linear(5, 3))
    ensemble = pyrouq.batchensemble(net, 2)
    path = tmp_path / "old.pt"
    pyrouq.save(path, ensemble)
    payload = torch.load(path, weights_only=True)
    shared = torch.rand(5) + 0.5
    for member in (0, 1):
        del payload["model"][f"net.1.norms.{member}.weight"]
    payload["model"]["net.1.weight"] = shared
    torch.save(payload, path)
    loaded = pyrouq.load(path, module=net).model
    for member in (0, 1):
        assert torch.equal(loaded.net[1].norms[member].weight, shared)
    with torch.no_grad():
        ensemble.net[1].norms[0].weight.copy_(shared), ensemble.net[1].norms[1].weight.copy_(shared)
    x = torch.randn(4, 6)
    assert torch.equal(loaded(x), ensemble(x))
    # a run's checkpoint of that time loads, but its optimizer state cannot go on
    y = torch.randint(0, 3, (4,))
    fit(ensemble, None, [(x, y)], epochs=1, num_data=4, progress=False, checkpoint=path)
    payload = torch.load(path, weights_only=True)
    for member in (0, 1):
        del payload["model"][f"net.1.norms.{member}.weight"]
    payload["model"]["net.1.weight"] = shared
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"was saved when the members shared the norms at "
                       r"\['net.1'\] .* start a new fit\(\) from the loaded model"):  # fmt: skip
        fit(pyrouq.batchensemble(net, 2), None, [(x, y)], epochs=2, num_data=4, progress=False,
            resume_from=path)  # fmt: skip
    loaded = pyrouq.load(path, module=net)  # shared out on load: refused for resume all the same
    with pytest.raises(CheckpointError, match=r"shared the norms at \['net.1'\]"):
        fit(pyrouq.batchensemble(net, 2), None, [(x, y)], epochs=2, num_data=4, progress=False,
            resume_from=loaded)  # fmt: skip


def test_file_loads_with_plain_torch_weights_only(tmp_path):
    model = BayesianMLP(hidden_features=8)
    path = save(tmp_path / "c.pt", model, mean_field_guide(model))
    payload = torch.load(path, weights_only=True)
    assert payload["format"] == "pyrouq.checkpoint"
    assert json.loads(payload["description"])["model"]["config"]["prior_scale"] == 1.0


def test_prior_scale_survives_the_round_trip(tmp_path):
    model = BayesianMLP(hidden_features=8, prior_scale=0.25)
    ckpt = load(save(tmp_path / "c.pt", model, mean_field_guide(model)))
    prior = ckpt.model.priors()["fc1.weight"]
    assert float(prior.base_dist.scale.flatten()[0]) == 0.25


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_save_refuses_what_it_cannot_rebuild(tmp_path):
    import pyro.distributions as dist

    from pyrouq import bayesian

    mixture = dist.MixtureSameFamily(
        dist.Categorical(torch.tensor([0.5, 0.5])), dist.Normal(torch.zeros(2), torch.ones(2))
    )
    odd = bayesian(torch.nn.Linear(2, 3), prior={"bias": mixture})
    with pytest.raises(CheckpointError, match=r"cannot describe the prior of site 'bias'"):
        save(tmp_path / "c.pt", odd)
    model = BayesianMLP(hidden_features=8)
    with pytest.raises(CheckpointError, match="metadata must hold JSON values"):
        save(tmp_path / "c.pt", model, mean_field_guide(model), metadata={"t": torch.ones(1)})
    # what JSON would give back changed: refused, not loaded back otherwise
    for metadata, what in (({1: "one"}, r"metadata has the key 1, which would load back as "
                            r'"1"'), ({"a": [{"b": (2, 3)}]}, r"metadata\['a'\]\[0\]\['b'\] "
                            r"is a tuple, which would load back as a list")):  # fmt: skip
        with pytest.raises(CheckpointError, match=r"metadata must hold JSON values, which load "
                           r"back as saved; " + what):  # fmt: skip
            save(tmp_path / "c.pt", model, mean_field_guide(model), metadata=metadata)
    circular: dict = {}
    circular["self"] = circular
    with pytest.raises(CheckpointError, match=r"metadata must hold JSON values .*Circular"):
        save(tmp_path / "c.pt", model, mean_field_guide(model), metadata=circular)
    # an optimizer state load() would refuse to unpickle: refused when saving
    with pytest.raises(
        CheckpointError,
        match=r"save\(optimizer=\) takes a torch optimizer, a "
        r"Pyro optimizer or a state dict .* got object, .* Pass optimizer",
    ):
        save(tmp_path / "c.pt", model, optimizer=object())
    # a Pyro model of one's own with an autoguide: it cannot be described (it has latent sites)
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroModule, PyroSample

    own = PyroModule[torch.nn.Linear](2, 3)
    own.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
    with pytest.raises(CheckpointError, match=r"save\(\) cannot describe a PyroLinear: .* For a "
                       r"Pyro model of your own, keep torch.save\(model.state_dict\(\)\) and the "
                       r"guide's parameters \(pyro.get_param_store\(\).save\(path\)"):  # fmt: skip
        save(tmp_path / "c.pt", own, AutoNormal(own))
    assert not (tmp_path / "c.pt").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind
    pyro_adam = pyro.optim.Adam({"lr": 0.1})
    back = load(save(tmp_path / "p.pt", model, optimizer=pyro_adam))
    assert back.optimizer_state == {}  # a Pyro optimizer's get_state(): no parameter seen yet


def test_saved_models_predict_bit_identically_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    bayes = BayesianLeNet()
    guide = mean_field_guide(bayes, init_scale=0.05)
    ensemble = BatchEnsembleLeNet(num_members=3)
    save(tmp_path / "bayes.pt", bayes, guide)
    save(tmp_path / "ens.pt", ensemble)
    x = torch.rand(20, 1, 28, 28)
    torch.save(x, tmp_path / "x.pt")
    torch.manual_seed(123)
    here_bayes = predict(bayes, x, guide, num_samples=8).probs
    here_ens = predict(ensemble, x).probs
    # on this process's thread count: bit-identical needs the same split of the matrix
    # products (MKL's float results vary with it on some CPUs: a fresh process on every core
    # against a suite left on one thread differed)
    script = textwrap.dedent(
        f"""
        import torch, pyrouq
        torch.set_num_threads({torch.get_num_threads()})
        x = torch.load({str(tmp_path / "x.pt")!r})
        b = pyrouq.load({str(tmp_path / "bayes.pt")!r})
        e = pyrouq.load({str(tmp_path / "ens.pt")!r})
        torch.manual_seed(123)
        pb = pyrouq.predict(b.model, x, b.guide, num_samples=8).probs
        pe = pyrouq.predict(e.model, x).probs
        torch.save({{"bayes": pb, "ens": pe}}, {str(tmp_path / "out.pt")!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    there = torch.load(tmp_path / "out.pt")
    assert torch.equal(there["bayes"], here_bayes)
    assert torch.equal(there["ens"], here_ens)


# --------------------------------------------------------------------------------------------
# refused checkpoints
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_path_too_long_to_look_up_is_a_checkpoint_error(tmp_path, where):
    """A name of more than 255 bytes raised pathlib's bare OSError (File name too long) from
    save() and load(), whose docstring promises CheckpointError for files it cannot read."""
    long = tmp_path / ("a" * 300 + ".pt") if where == "file" else tmp_path / ("d" * 300) / "m.pt"
    said = r"Expected a path the system can look up, got '.*' for {} \(File name too long\)\. "
    said += r"Pass a shorter path \(each name at most 255 bytes; one here is 30[03]\)\.$"
    with pytest.raises(CheckpointError, match=said.format(r"save\(\)")):
        save(long, MLP(4, 8, 3))
    with pytest.raises(CheckpointError, match=said.format("reading a checkpoint")):
        load(long)
    short = save(tmp_path / "m.pt", MLP(4, 8, 3))  # as told: a shorter path, written and read
    assert load(short).guide is None


def test_a_name_too_long_below_a_folder_not_made_yet_is_refused_before_it_is_made(tmp_path):
    """The system tells only the missing folder of tmp/new/<257 bytes>.pt: save() passed it,
    made tmp/new, then failed on a bare OSError (File name too long) at its rename; a path
    whose names fit but whose whole is past the system's 4096 bytes was told to keep 'each
    name at most 255 bytes', which each was."""
    said = r"got '.*' for save\(\) \(File name too long\)\. Pass a shorter path \({}\)\.$"
    with pytest.raises(CheckpointError, match=said.format("each name at most 255 bytes; one here "
                       "is 257")):  # fmt: skip
        save(tmp_path / "new" / ("é" * 127 + ".pt"), MLP(4, 8, 3))  # (257 bytes, 130 letters)
    assert not (tmp_path / "new").exists()
    deep = tmp_path.joinpath(*["é" * 100] * 21, "m.pt")  # (names of 200 bytes, 100 letters)
    size = len(str(deep).encode())  # bytes, not letters
    whole = rf"this one is {size} bytes in all, its names each at most 255: fewer or "
    with pytest.raises(CheckpointError, match=said.format(whole + "shorter folders")):
        save(deep, MLP(4, 8, 3))
    assert not (tmp_path / ("é" * 100)).exists()
    # a name of 255 bytes, the most one may take, below a folder not made yet is written
    most = save(tmp_path / "made" / ("a" * 252 + ".pt"), MLP(4, 8, 3))
    assert load(most).guide is None


def test_missing_truncated_and_corrupted_files_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"No checkpoint at .*nope\.pt.*does not exist"):
        load(tmp_path / "nope.pt")
    model = BayesianMLP(hidden_features=8)
    good = save(tmp_path / "good.pt", model, mean_field_guide(model)).read_bytes()
    (tmp_path / "short.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupted") as info:
        load(tmp_path / "short.pt")
    # no earlier epoch's checkpoint to point to: fit(checkpoint=) and a run folder keep one file
    assert "previous epoch" not in str(info.value)
    assert str(info.value).endswith(
        "Use an intact copy, or write it again: save() the model anew, or rerun the training "
        "that wrote it (a run keeps one checkpoint, its last epoch's, and no earlier one)."
    )
    (tmp_path / "noise.pt").write_bytes(b"\x80\x02" + bytes(range(256)) * 8)  # a pickle's start
    with pytest.raises(CheckpointError, match="truncated or corrupted") as info:
        load(tmp_path / "noise.pt")
    assert "weights_only" not in str(info.value)  # not torch's advice to unpickle it anyway
    # a flipped byte inside a tensor: torch.load reads it as another value, the CRC tells
    flipped = bytearray(good)
    loc = mean_field_guide(model).site_loc("fc1.weight")  # the guide saved starts there
    start = good.find(loc.detach().numpy().tobytes()[:64])
    assert start > 0
    flipped[start : start + 4] = b"\x00\x00\xc8\x42"  # 100.0
    (tmp_path / "flipped.pt").write_bytes(bytes(flipped))
    with pytest.raises(
        CheckpointError,
        match=r"truncated or corrupted \(its entry .*data/\d+' "
        r"fails its checksum\)",
    ):
        load(tmp_path / "flipped.pt")
    # written without CRCs (a torch option): nothing to check, it loads
    saved_guide = mean_field_guide(model)
    with torch.no_grad():  # moved off its initial values, which a fresh guide would have
        for param in saved_guide.parameters():
            param.add_(0.1)
    torch.serialization.set_crc32_options(False)
    try:
        unchecked = save(tmp_path / "no_crc.pt", model, saved_guide)
    finally:
        torch.serialization.set_crc32_options(True)
    back = load(unchecked).guide
    for site in ("fc1.weight", "fc2.bias"):
        assert torch.equal(back.site_loc(site), saved_guide.site_loc(site)), site
    want = saved_guide.state_dict()  # the scales too, not only the means
    assert back.state_dict().keys() == want.keys()
    assert all(torch.equal(v, want[k]) for k, v in back.state_dict().items())
    # files that are not torch's: a clear error naming what they are, never a raw KeyError
    for name, content, what in (
        ("notes.txt", b"hello world", r"it begins with b'hello world'"),
        ("abc.txt", b"abc", r"it begins with b'abc'"),
        ("empty.pt", b"", "it is empty"),
    ):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(
            CheckpointError,
            match=rf"is not a pyrouq checkpoint: {what}, not a "
            r"file torch.save\(\) writes\. Pass the file that pyrouq.save\(\)",
        ):
            load(tmp_path / name)
    import numpy as np

    np.savez(tmp_path / "arrays.npz", a=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"it is a zip archive of a\.npy, not a file"):
        load(tmp_path / "arrays.npz")
    with pytest.raises(
        CheckpointError,
        match=r"No checkpoint at .*: the path is a folder\. "
        r"Pass the path",
    ):
        load(tmp_path)


class Payload:
    """Anything that is not a tensor: unpickling it would import and run code."""

    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickled_python_object_is_refused_without_running_it(tmp_path, capsys):
    torch.save({"format": "pyrouq.checkpoint", "evil": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"contains pickled Python objects.*arbitrary code"):
        load(tmp_path / "evil.pt")
    assert "pwned" not in capsys.readouterr().out
    with open(tmp_path / "plain.pkl", "wb") as f:
        pickle.dump({"model": Payload()}, f)
    with pytest.raises(CheckpointError, match="contains pickled Python objects"):
        load(tmp_path / "plain.pkl")


def test_other_files_and_other_model_classes_are_refused(tmp_path):
    torch.save({"weights": torch.ones(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"is not a pyrouq checkpoint: expected a dict"):
        load(tmp_path / "other.pt")
    model = BayesianMLP(hidden_features=8)
    path = save(tmp_path / "mlp.pt", model, mean_field_guide(model))
    with pytest.raises(CheckpointError, match="holds a BayesianMLP, expected a BayesianLeNet"):
        load(path, model_class=BayesianLeNet)
    # edited parameters that no longer fit the description
    payload = torch.load(path, weights_only=True)
    payload["model"]["fc1.prior_scale"] = torch.ones(3)
    torch.save(payload, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match="do not fit the BayesianMLP"):
        load(tmp_path / "edited.pt")


def test_a_model_class_name_no_checkpoint_holds_is_told_so_with_the_names_it_can_be(tmp_path):
    # it read "holds a MLP, expected a Nope. ... pick the checkpoint of a Nope."
    path = save(tmp_path / "mlp.pt", pyrouq.MLP(3, 4, 2))
    for given, name in (("Nope", "Nope"), ("mlp", "mlp"), (nn.Sequential, "Sequential")):
        with pytest.raises(CheckpointError) as caught:
            load(path, model_class=given)
        message = str(caught.value)
        assert message.startswith(f"model_class={name!r} is no class a pyrouq checkpoint holds: ")
        assert "'BayesianMLP', 'LeNet', 'MLP', 'BayesianNetwork', 'BatchEnsembleNetwork'" in message
        assert message.endswith(
            f"{str(path)!r} holds an MLP: pass model_class='MLP', or leave it out."
        )
    with pytest.raises(CheckpointError, match="holds an MLP, expected a BayesianMLP"):  # known
        load(path, model_class="BayesianMLP")
    # a file of a class this pyrouq does not know, asked for by that name: told it is unknown,
    # not to pass the very model_class given
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["class"] = "Nope"
    payload["description"] = json.dumps(description)
    torch.save(payload, tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="describes an unknown model class 'Nope'; expected"):
        load(tmp_path / "nope.pt", model_class="Nope")
    # "holds a MLP, expected a LeNet", and "expected a MLP ... the checkpoint of a MLP"
    with pytest.raises(CheckpointError, match=r"holds an MLP, expected a LeNet\. Load it"):
        load(path, model_class=pyrouq.LeNet)
    lenet = save(tmp_path / "lenet.pt", pyrouq.LeNet())
    with pytest.raises(CheckpointError) as caught:
        load(lenet, model_class="MLP")
    assert str(caught.value) == (
        f"{str(lenet)!r} holds a LeNet, expected an MLP. Load it without model_class, or pick "
        "the checkpoint of an MLP."
    )


class _Encoder(nn.Sequential):
    __module__ = "app"  # (a class of a module named with a vowel first: "an app.Encoder")


def test_a_network_without_a_skeleton_is_named_with_the_article_its_class_takes(tmp_path):
    # it read "holds a network converted from a app._Encoder" (and "a plain network, a ...")
    net = _Encoder(nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match=r"holds a network converted from an app\._Encoder\."):
        load(save(tmp_path / "c.pt", pyrouq.batchensemble(net, 2)))
    with pytest.raises(CheckpointError, match=r"holds a plain network, an app\._Encoder\. pyrouq"):
        load(save(tmp_path / "p.pt", net))
    with pytest.raises(CheckpointError, match=r"converted from a torch\.nn\.modules\.linear\."):
        load(save(tmp_path / "t.pt", pyrouq.batchensemble(nn.Linear(3, 2), 2)))


def test_a_refusal_for_want_of_a_skeleton_names_the_held_class_as_attributes(tmp_path):
    # pyrouq evaluate read the class out of the message's text; the error now carries it
    net = _Encoder(nn.Linear(3, 2))
    with pytest.raises(CheckpointError) as converted:
        load(save(tmp_path / "c.pt", pyrouq.batchensemble(net, 2)))
    assert (converted.value.held_class, converted.value.held_plain) == ("app._Encoder", False)
    with pytest.raises(CheckpointError) as plain:
        load(save(tmp_path / "p.pt", net))
    assert (plain.value.held_class, plain.value.held_plain) == ("app._Encoder", True)
    with pytest.raises(CheckpointError) as other:  # another refusal: neither is set
        load(save(tmp_path / "m.pt", pyrouq.MLP(3, 4, 2)), model_class=pyrouq.BayesianMLP)
    assert (other.value.held_class, other.value.held_plain) == (None, None)


def test_a_refused_skeleton_and_a_held_wrapper_are_attributes_of_the_error(tmp_path):
    # pyrouq evaluate read them out of the message's text ("The skeleton " ... "Build the
    # module exactly", "never unpickles code", "Pass load(path, module=torch...(net))")
    def make_net(hidden=4):
        return nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    net = make_net()
    path = save(tmp_path / "p.pt", net)
    with pytest.raises(CheckpointError) as other:  # why, without the advice
        load(path, module=make_net(5))
    fault = (
        "The skeleton (torch.nn.modules.container.Sequential) does not match "
        f"{str(path)!r}, which holds a torch.nn.modules.container.Sequential: parameter "
        "'0.weight' is shape (4, 3) in the checkpoint and shape (5, 3) in the skeleton."
    )
    assert other.value.skeleton_mismatch == fault
    assert str(other.value) == f"{fault} Build the module exactly as the saved one was built."
    assert (other.value.held_class, other.value.held_wrapper) == (None, None)
    with torch.device("meta"):
        meta = make_net()
    with pytest.raises(CheckpointError) as no_values:
        load(path, module=meta)
    assert no_values.value.skeleton_mismatch == (
        "The skeleton (Sequential) has tensors on the meta device ('0.weight', '0.bias', "
        "'2.weight', ...), which hold no values and cannot take the saved ones."
    )
    lazy = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(CheckpointError) as uninitialised:
        load(path, module=lazy)
    assert uninitialised.value.skeleton_mismatch == (
        "The skeleton (Sequential) has lazy modules that have not created their parameters "
        "yet ('0.weight', '0.bias')."
    )
    ensemble = save(tmp_path / "e.pt", pyrouq.batchensemble(net, 2))
    with pytest.raises(CheckpointError) as members:
        load(ensemble, module=pyrouq.batchensemble(make_net(), 3))
    assert members.value.skeleton_mismatch == (
        f"The skeleton (a BatchEnsemble, num_members=3) does not match {str(ensemble)!r}, "
        "which holds a BatchEnsemble of num_members=2."
    )
    # a file of an earlier pyrouq holding its wrapper ('module.', '_orig_mod.' names)
    for wrapper, wrap, prefix in [
        ("torch.nn.DataParallel", nn.DataParallel, "module"),
        ("torch.compile", lambda n: torch.compile(n, backend="eager"), "_orig_mod"),
    ]:
        payload = torch.load(path, weights_only=True)
        description = json.loads(payload["description"])
        description["model"]["module"] = pyrouq.convert.module_record(wrap(make_net()))
        payload["description"] = json.dumps(description)
        payload["model"] = {f"{prefix}.{k}": v for k, v in payload["model"].items()}
        torch.save(payload, tmp_path / "w.pt")
        for module in (None, make_net()):  # no skeleton, or one not in the wrapper
            with pytest.raises(CheckpointError) as held:
                load(tmp_path / "w.pt", module=module)
            assert held.value.held_wrapper == wrapper
            assert (held.value.held_class, held.value.skeleton_mismatch) == (None, None)
    with warnings.catch_warnings():  # (saved without a guide: warned, not the point here)
        warnings.simplefilter("ignore")
        converted = save(tmp_path / "c.pt", bayesian(torch.compile(make_net(), backend="eager")))
    for module in (None, make_net()):  # bayesian(torch.compile(net)): its network's wrapper
        with pytest.raises(CheckpointError, match="made from a Sequential compiled") as held:
            load(converted, module=module)
        assert held.value.held_wrapper == "torch.compile"
    with pytest.raises(CheckpointError) as neither:  # a refusal for want of a skeleton
        load(path)
    assert (neither.value.held_wrapper, neither.value.skeleton_mismatch) == (None, None)


def test_a_hand_edited_description_or_metadata_is_refused_as_such(tmp_path):
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net)
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False,
        checkpoint=tmp_path / "run.pt")  # fmt: skip
    payload = torch.load(tmp_path / "run.pt", weights_only=True)
    description = json.loads(payload["description"])

    def edited(name, payload_edit=None, description_edit=None):
        changed, described = dict(payload), json.loads(json.dumps(description))
        if description_edit is not None:
            description_edit(described)
            changed["description"] = json.dumps(described)
        if payload_edit is not None:
            payload_edit(changed)
        torch.save(changed, tmp_path / name)
        return tmp_path / name

    def family(d):
        d["model"]["config"]["priors"]["0.weight"]["family"] = "Weird"

    def metadata(p):
        p["metadata"] = "{not json"

    cases = {
        "family.pt": edited("family.pt", description_edit=family),  # AttributeError came
        "guide.pt": edited("guide.pt", description_edit=lambda d: d.update(guide="x")),
        "metadata.pt": edited("metadata.pt", payload_edit=metadata),  # JSONDecodeError came
    }
    for name, path in cases.items():
        with pytest.raises(CheckpointError) as caught:
            load(path, module=net)
        assert str(caught.value).startswith(
            f"{str(path)!r} cannot be rebuilt from its description or metadata ("
        ), name
        assert "edited by hand, or written by another program?" in str(caught.value)
    with pytest.raises(CheckpointError, match=r"cannot be rebuilt .*JSONDecodeError"):
        fit(model, guide, [(x, y)], epochs=2, num_data=8, progress=False,
            resume_from=cases["metadata.pt"])  # fmt: skip
    # the caller's own mistake keeps its own error
    with pytest.raises(TypeError, match="Expected model_class to be a model class or its name"):
        load(tmp_path / "run.pt", model_class=3, module=net)


def test_a_lazy_skeleton_not_yet_run_is_refused_with_the_fix(tmp_path):
    net = nn.Sequential(nn.Flatten(), nn.LazyLinear(3))
    net(torch.zeros(2, 4))
    model = bayesian(net)
    path = save(tmp_path / "lazy.pt", model, mean_field_guide(model))
    fresh = nn.Sequential(nn.Flatten(), nn.LazyLinear(3))
    with pytest.raises(CheckpointError) as caught:  # torch's RuntimeError on the shape came
        load(path, module=fresh)
    assert str(caught.value) == (
        "The skeleton (Sequential) has lazy modules that have not created their parameters yet "
        "('1.weight', '1.bias'): run one batch through it first (net(x)), then "
        "load(path, module=net)."
    )
    fresh(torch.zeros(2, 4))
    loaded = load(path, module=fresh)
    assert torch.equal(loaded.model.plain_network()[1].weight, net[1].weight)


# --------------------------------------------------------------------------------------------
# resume and interruption
# --------------------------------------------------------------------------------------------


def test_resume_equals_an_uninterrupted_run(tmp_path, mnist_small):
    train, _, _ = mnist_small
    pyro.set_rng_seed(0)
    model = small_mlp()
    guide = mean_field_guide(model)
    full = fit(model, guide, loader_like(train), epochs=4, progress=False, seed=1)
    want = params_of(model, guide)

    pyro.set_rng_seed(0)  # the same initial parameters
    model = small_mlp()
    guide = mean_field_guide(model)
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted, match="interrupted at the end of epoch 2") as stopped:
        fit(model, guide, loader_like(train), epochs=4, progress=False, seed=1,
            checkpoint=path, callbacks=[StopAfter(2)])  # fmt: skip
    assert stopped.value.checkpoint == path
    assert len(stopped.value.result.history) == 2
    # stopped at the end of epoch 2: its last completed step is its 8th (of 8)
    assert (stopped.value.epoch, stopped.value.step) == (2, 8)
    assert "interrupted at the end of epoch 2 (after its last step, 8):" in str(stopped.value)
    assert stopped.value.epoch_complete

    # a new process would rebuild everything: new model, guide and loader
    model = small_mlp()
    guide = mean_field_guide(model)
    resumed = fit(model, guide, loader_like(train), epochs=4, progress=False, resume_from=path)
    assert history_values(resumed) == history_values(full)
    assert resumed.steps == full.steps == 32
    for key, value in params_of(model, guide).items():
        torch.testing.assert_close(value, want[key], rtol=1e-6, atol=1e-7, msg=key)


def test_callbacks_that_draw_or_read_the_loader_leave_the_training_and_its_resume_exact(
    tmp_path, mnist_small
):
    train, x_test, _ = mnist_small

    def run(callbacks, **kwargs):
        pyro.set_rng_seed(0)
        model = small_mlp()
        guide = mean_field_guide(model)
        loader = loader_like(train)
        monitor = [lambda r: predict(model, x_test, guide, num_samples=2, progress=False),
                   lambda r: sum(1 for _ in loader)]  # fmt: skip
        result = fit(model, guide, loader, epochs=3, progress=False, seed=1,
                     callbacks=monitor if callbacks else [], **kwargs)  # fmt: skip
        return history_values(result), params_of(model, guide)

    quiet, want = run(callbacks=False)
    watched, got = run(callbacks=True)
    assert watched == quiet
    assert all(torch.equal(got[k], v) for k, v in want.items())
    path = tmp_path / "run.pt"  # stopped after epoch 1 (a crash), then resumed: the same run
    pyro.set_rng_seed(0)
    model = small_mlp()
    guide = mean_field_guide(model)
    loader = loader_like(train)
    with pytest.raises(TrainingInterrupted):
        fit(model, guide, loader, epochs=3, progress=False, seed=1, checkpoint=path,
            callbacks=[lambda r: predict(model, x_test, guide, num_samples=2, progress=False),
                       StopAfter(1)])  # fmt: skip
    model = small_mlp()
    guide = mean_field_guide(model)
    resumed = fit(model, guide, loader_like(train), epochs=3, progress=False, resume_from=path)
    assert history_values(resumed) == quiet
    assert all(torch.equal(params_of(model, guide)[k], v) for k, v in want.items())


def test_fit_refuses_a_checkpoint_path_it_cannot_write_before_training(tmp_path):
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))
    model = small_mlp()
    guide = mean_field_guide(model)
    before = params_of(model, guide)
    (tmp_path / "a_file").write_text("")
    for path, message in [
        (tmp_path, r"fit\(checkpoint=...\) needs a file path, got the folder .*checkpoint.pt"),
        (tmp_path / "a_file" / "run.pt", r"cannot write .*: '.*a_file' is a file, not a folder"),
    ]:
        with pytest.raises(CheckpointError, match=message):
            fit(model, guide, [(x, y)], num_data=32, epochs=1, progress=False, checkpoint=path)
    assert all(torch.equal(params_of(model, guide)[k], v) for k, v in before.items())
    finished = tmp_path / "runs" / "done.pt"  # a missing folder is made
    fit(model, guide, [(x, y)], num_data=32, epochs=2, progress=False, checkpoint=finished)
    with pytest.raises(ValueError) as err:
        fit(model, guide, [(x, y)], num_data=32, epochs=2, progress=False, resume_from=finished)
    assert "completed 2 epochs, but epochs=2: it finished the run it was planned for (2 " in (
        str(err.value)
    )
    assert "pass a larger total, e.g. epochs=3" in str(err.value)


def test_the_num_data_a_model_was_built_with_survives_a_checkpoint(tmp_path):
    def net():
        return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))

    model = bayesian(net(), num_data=1000)
    batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,)))]
    back = load(save(tmp_path / "m.pt", model, mean_field_guide(model)), module=net())
    assert back.model.given_num_data == 1000
    assert fit(back.model, back.guide, batches, epochs=1, progress=False).num_data == 1000


def test_resume_from_the_middle_of_an_epoch(tmp_path, mnist_small):
    train, _, _ = mnist_small
    pyro.set_rng_seed(0)
    model = small_mlp()
    guide = mean_field_guide(model)
    fit(model, guide, loader_like(train), epochs=2, progress=False, seed=1)
    want = params_of(model, guide)

    class Interrupting(TensorLoader):
        calls = 0

        def __iter__(self):
            for batch in super().__iter__():
                Interrupting.calls += 1
                if Interrupting.calls == 12:  # epoch 2, after step 3 completed
                    raise KeyboardInterrupt
                yield batch

    loader = Interrupting(
        train.images, train.labels, 64, shuffle=True, flatten=True, normalize=True, seed=3
    )
    pyro.set_rng_seed(0)
    model = small_mlp()
    guide = mean_field_guide(model)
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted) as stopped:
        fit(model, guide, loader, epochs=2, progress=False, seed=1, checkpoint=path)
    assert (stopped.value.epoch, stopped.value.step) == (2, 3)
    assert load(path).training["epoch_steps"] == 3
    model = small_mlp()
    guide = mean_field_guide(model)
    fit(model, guide, loader_like(train), epochs=2, progress=False, resume_from=path)
    for key, value in params_of(model, guide).items():
        torch.testing.assert_close(value, want[key], rtol=1e-6, atol=1e-7, msg=key)


def test_interruption_keeps_the_last_completed_step(mnist_small):
    train, _, _ = mnist_small
    model = small_mlp()
    guide = mean_field_guide(model)
    seen = {}

    def remember(record):
        seen.update(params_of(model, guide))
        raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted, match="pass checkpoint=PATH") as stopped:
        fit(model, guide, loader_like(train), epochs=3, progress=False, callbacks=[remember])
    assert isinstance(stopped.value, KeyboardInterrupt)
    assert stopped.value.checkpoint is None
    assert stopped.value.result.steps == 8
    for key, value in params_of(model, guide).items():
        assert torch.equal(value, seen[key]), key


def test_ctrl_c_lets_the_step_finish(mnist_small):
    """A real SIGINT during a step: the step completes, then fit stops."""
    import os
    import signal

    train, _, _ = mnist_small
    model = small_mlp()
    guide = mean_field_guide(model)

    class SignalOnce(TensorLoader):
        def __iter__(self):
            for i, batch in enumerate(super().__iter__()):
                if i == 2:
                    os.kill(os.getpid(), signal.SIGINT)  # arrives while batch 3 is served
                yield batch

    loader = SignalOnce(
        train.images, train.labels, 64, shuffle=True, flatten=True, normalize=True, seed=3
    )
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a job started in the background
    with pytest.raises(TrainingInterrupted) as stopped:
        fit(model, guide, loader, epochs=2, progress=False)
    assert (stopped.value.epoch, stopped.value.step) == (1, 3)
    assert stopped.value.result.steps == 3
    assert signal.getsignal(signal.SIGINT) is before  # fit() put the caller's handler back


def test_a_second_ctrl_c_inside_a_step_writes_nothing(tmp_path, mnist_small):
    """Two SIGINTs during a step's forward: fit stops at once with a plain KeyboardInterrupt
    and keeps the last epoch's checkpoint, from which the run resumes exactly (the half-done
    step, its weights drawn, was saved before as if it were the previous step's state)."""
    import os
    import signal

    train, _, _ = mnist_small
    torch.manual_seed(0)
    reference = small_mlp()
    reference_guide = mean_field_guide(reference)
    whole = fit(reference, reference_guide, loader_like(train), epochs=2, progress=False, seed=0)
    torch.manual_seed(0)
    model = small_mlp()
    guide = mean_field_guide(model)
    calls = []

    def press_twice(module, inputs):
        calls.append(1)
        if len(calls) == 11:  # in epoch 2 (8 steps an epoch), after the weights are drawn
            for _ in range(2):
                os.kill(os.getpid(), signal.SIGINT)

    hook = model.net.register_forward_pre_hook(press_twice)
    path = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt) as stopped:
        fit(model, guide, loader_like(train), epochs=2, progress=False, seed=0, checkpoint=path)
    hook.remove()
    assert not isinstance(stopped.value, TrainingInterrupted)
    resumed = fit(model, guide, loader_like(train), epochs=2, progress=False, resume_from=path)
    assert history_values(resumed) == history_values(whole)
    for key, value in params_of(reference, reference_guide).items():
        assert torch.equal(value, params_of(model, guide)[key]), key


def test_resume_refuses_a_checkpoint_that_does_not_fit(tmp_path, mnist_small):
    train, _, _ = mnist_small
    model = small_mlp()
    guide = mean_field_guide(model)
    path = tmp_path / "run.pt"
    fit(model, guide, loader_like(train), epochs=1, progress=False, checkpoint=path)
    other = BayesianMLP(hidden_features=32)
    with pytest.raises(
        CheckpointError,
        match=r"holds a BayesianMLP of another config: config"
        r"\['hidden_features'\] is 16 there and 32 in the model\. Rebuild",
    ):
        fit(other, mean_field_guide(other), loader_like(train), epochs=2, resume_from=path)
    lenet = BayesianLeNet()
    with pytest.raises(CheckpointError, match="holds a BayesianMLP, but the model is a BayesianLe"):
        fit(lenet, mean_field_guide(lenet), loader_like(train), epochs=2, resume_from=path)
    with pytest.raises(ValueError, match=r"already completed 1 epochs, but epochs=1"):
        fit(small_mlp(), mean_field_guide(small_mlp()), loader_like(train), epochs=1,
            resume_from=path)  # fmt: skip
    plain = save(tmp_path / "plain.pt", model, guide)
    with pytest.raises(CheckpointError, match="holds no training state"):
        fit(model, guide, loader_like(train), epochs=2, resume_from=plain)


def test_resume_of_a_dataloader_with_its_own_generator_is_exact(tmp_path):
    # DataLoader(..., generator=g) shuffles with g, not torch's global state: the checkpoint
    # stores g's state at the epoch's start, so the resumed epochs see the same batches
    x, y = torch.randn(60, 4), torch.randint(0, 3, (60,))

    def run(epochs, **kw):
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        guide = mean_field_guide(model)
        loader = DataLoader(TensorDataset(x, y), batch_size=20, shuffle=True,
                            generator=torch.Generator().manual_seed(5))  # fmt: skip
        result = fit(model, guide, loader, epochs=epochs, progress=False, seed=0, **kw)
        return [record.loss for record in result.history], guide.site_loc("0.weight").detach()

    straight, weights = run(3)
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted):
        run(3, checkpoint=path, callbacks=[StopAfter(1)])
    resumed, resumed_weights = run(3, resume_from=path)
    assert resumed == straight
    torch.testing.assert_close(resumed_weights, weights, rtol=1e-6, atol=1e-7)


def _interrupted_run_warnings(x, y, batch_size=8, **kw):
    """The interrupted-run warnings of a 3-epoch fit() of a fresh Bayesian linear model on
    (x, y) (a Ctrl-C's TrainingInterrupted, from a callback, let through)."""
    model = bayesian(nn.Linear(4, 3))
    data = pyrouq.ArrayLoader(x, y, batch_size=batch_size, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit(model, mean_field_guide(model), data, epochs=3, progress=False, **kw)
        except TrainingInterrupted:
            pass
    return [str(w.message) for w in caught if "interrupted run" in str(w.message)]


def test_a_fresh_run_over_an_interrupted_runs_checkpoint_warns_once_before_training(tmp_path):
    # a notebook cell with fit(..., checkpoint=p) run again after an interrupted run wrote p
    # trained afresh and wrote over it without a word; it warns now, before training, of what
    # p holds and how to continue it, and not for a finished run, a resume or no file
    x, y = torch.randn(16, 4), torch.arange(16) % 3
    path = tmp_path / "run.pt"
    run = functools.partial(_interrupted_run_warnings, x, y)
    assert run(checkpoint=path, callbacks=[StopAfter(2)]) == []  # no file yet
    assert load(path, module=nn.Linear(4, 3)).training["epochs_done"] == 2
    assert run(checkpoint=path, resume_from=path, callbacks=[StopAfter(3)]) == []  # resumed
    assert run(checkpoint=path) == []  # a finished run: 3 of 3 epochs
    run(checkpoint=path, callbacks=[StopAfter(1)])
    (told,) = run(checkpoint=path)
    assert told == (
        f"fit(checkpoint={str(path)!r}): that file holds an interrupted run (1 of 3 epochs done, "
        "2 steps), and no resume_from was given, so this run starts afresh and writes over it "
        f"with its own checkpoints. To continue that run instead, pass resume_from={str(path)!r} "
        "(and epochs=3, its total); to keep it, pass another checkpoint= path; to start anew "
        "without this warning, delete the file."
    )
    assert load(path, module=nn.Linear(4, 3)).training["epochs_done"] == 3  # written over
    model = bayesian(nn.Linear(4, 3))
    save(path, model, mean_field_guide(model))  # save()'s own file: no training state
    assert run(checkpoint=path) == []
    # one step: "1 step", as `pyrouq evaluate` says of such a run (it said "1 steps")
    run(batch_size=16, checkpoint=path, callbacks=[StopAfter(1)])
    (told,) = run(checkpoint=path)
    assert "holds an interrupted run (1 of 3 epochs done, 1 step), and no" in told
    # an interrupted run's file cut short, or bytes of no checkpoint: quiet, written over
    run(checkpoint=path, callbacks=[StopAfter(1)])
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert run(checkpoint=path) == []
    path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    assert run(checkpoint=path) == []
    assert load(path, module=nn.Linear(4, 3)).training["epochs_done"] == 3


def test_the_interrupted_run_warning_waits_for_the_checks_and_is_given_when_resuming_another(
    tmp_path, monkeypatch
):
    # fit(checkpoint=p) warned that it would write over p's interrupted run before checks
    # that refused the call later (labels out of range here), so nothing was written over;
    # and fit(checkpoint=p, resume_from=other) wrote over p's interrupted run without a word
    x, y = torch.randn(16, 4), torch.arange(16) % 3
    path, other = tmp_path / "run.pt", tmp_path / "other.pt"
    run = functools.partial(_interrupted_run_warnings, x, y)
    run(checkpoint=path, callbacks=[StopAfter(1)])  # p: 1 of 3 epochs, 2 steps
    run(checkpoint=other, callbacks=[StopAfter(2)])  # another run, stopped after 2 epochs
    bad = y.clone()
    bad[3] = 7  # a label of no class: refused after fit()'s checkpoint checks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"labels in \[0, 7\], expected class indices"):
            model = bayesian(nn.Linear(4, 3))
            fit(model, mean_field_guide(model), pyrouq.ArrayLoader(x, bad, batch_size=8),
                epochs=3, progress=False, checkpoint=path)  # fmt: skip
    assert [str(w.message) for w in caught if "interrupted run" in str(w.message)] == []
    assert load(path, module=nn.Linear(4, 3)).training["epochs_done"] == 1  # not written over
    # resuming another file writes over p's run: warned, naming the file resumed
    (told,) = run(checkpoint=path, resume_from=other, callbacks=[StopAfter(3)])
    assert told == (
        f"fit(checkpoint={str(path)!r}): that file holds an interrupted run (1 of 3 epochs done, "
        f"2 steps), and this run resumes another ({str(other)!r}), so it writes over that file "
        f"with its own checkpoints. To continue that run instead, pass resume_from={str(path)!r} "
        "(and epochs=3, its total); to keep it, pass another checkpoint= path; to start anew "
        "without this warning, delete the file."
    )
    assert load(path, module=nn.Linear(4, 3)).training["epochs_done"] == 3  # written over
    # resuming p itself, by another name or as the Checkpoint load() read from it: quiet
    run(checkpoint=path, callbacks=[StopAfter(1)])
    monkeypatch.chdir(tmp_path)
    assert run(checkpoint=path, resume_from="run.pt", callbacks=[StopAfter(2)]) == []
    saved = load(path, module=nn.Linear(4, 3))
    assert run(checkpoint="run.pt", resume_from=saved, callbacks=[StopAfter(3)]) == []


@pytest.mark.parametrize(
    "check",
    ["check_same_resume", "check_same_model", "check_same_arguments", "check_same_steps"],
)
def test_the_interrupted_run_warning_waits_for_the_cross_rank_checks(tmp_path, monkeypatch, check):
    # under torch.distributed, fit(checkpoint=p) warned that it writes over p's interrupted run
    # before the checks that compare the ranks (the resumed point, the models, the arguments,
    # the steps), so a call they refused had warned of a write it never made; each check is
    # made to refuse here as it does for ranks that differ
    import sys

    x, y = torch.randn(16, 4), torch.arange(16) % 3
    path = tmp_path / "run.pt"
    model = bayesian(nn.Linear(4, 3))
    data = pyrouq.ArrayLoader(x, y, batch_size=8, seed=0)
    with pytest.raises(TrainingInterrupted):
        stop = [StopAfter(1)]
        fit(model, mean_field_guide(model), data, epochs=3, checkpoint=path, callbacks=stop)

    def differ(*args, **kwargs):
        raise ValueError("the ranks differ")

    where = sys.modules["pyrouq.infer.fit"] if check == "check_same_resume" else None
    monkeypatch.setattr(where or sys.modules["pyrouq.infer._distributed"], check, differ)
    model = bayesian(nn.Linear(4, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="the ranks differ"):
            fit(model, mean_field_guide(model), data, epochs=3, checkpoint=path, progress=False)
    assert [str(w.message) for w in caught if "interrupted run" in str(w.message)] == []
    assert load(path, module=nn.Linear(4, 3)).training["epochs_done"] == 1  # not written over


class _Augmented(TensorDataset):
    """Each example with noise drawn from torch's, numpy's and Python's global streams, as a
    dataset's random augmentations draw."""

    def __getitem__(self, index):
        import random

        x, y = super().__getitem__(index)
        noise = float(torch.randn(())) + np.random.randn() + random.gauss(0.0, 1.0)  # noqa: NPY002
        return x + 0.1 * noise, y


@pytest.mark.parametrize("own", ["loader", "sampler", "batch_sampler"])
def test_a_dataloader_with_a_generator_resumes_inside_an_epoch_exactly(tmp_path, own):
    """Ctrl-C in the middle of epoch 2: the resumed run equals the one never stopped, for a
    DataLoader given a generator and for one whose sampler has it (that DataLoader draws its
    seed from torch's stream, which the resumed run did again and was shifted by), with a
    dataset drawing its augmentations from torch, numpy and Python (the batches the resumed
    run skips drew them again, before 2026-12-05) and a callback drawing from numpy and
    Python (they were not put back)."""
    import os
    import random
    import signal

    from torch.utils.data import BatchSampler, RandomSampler

    data = _Augmented(torch.randn(96, 4), torch.randint(0, 3, (96,)))

    def run(interrupt_at=None, **kw):
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        guide = mean_field_guide(model)
        g = torch.Generator().manual_seed(5)
        if own == "loader":
            loader = DataLoader(data, batch_size=16, shuffle=True, generator=g)
        elif own == "sampler":
            loader = DataLoader(data, batch_size=16, sampler=RandomSampler(data, generator=g))
        else:
            batches = BatchSampler(RandomSampler(data, generator=g), 16, drop_last=False)
            loader = DataLoader(data, batch_sampler=batches)
        calls = []

        def press(module, inputs):
            calls.append(1)
            if len(calls) == interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)

        model.net.register_forward_pre_hook(press)
        result = fit(model, guide, loader, epochs=2, progress=False, seed=0, **kw)
        return history_values(result), params_of(model, guide)

    def draw(record):
        return np.random.rand(), random.random()  # noqa: NPY002

    straight = run()
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted) as stopped:
        run(interrupt_at=10, checkpoint=path, callbacks=[draw])
    assert stopped.value.epoch == 2 and stopped.value.step > 0  # inside epoch 2
    history, params = run(resume_from=path, callbacks=[draw])
    assert history == straight[0]
    for key, value in straight[1].items():
        assert torch.equal(value, params[key]), key


def test_resume_with_another_lr_says_the_runs_lr_carries_on(tmp_path):
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    loader = DataLoader(TensorDataset(x, y), batch_size=20)

    def run(lr, **kw):
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        guide = mean_field_guide(model)
        fit(model, guide, loader, epochs=kw.pop("epochs", 2), lr=lr, progress=False, seed=0,
            **kw)  # fmt: skip
        return guide.site_loc("0.weight").detach()

    path = tmp_path / "run.pt"
    run(0.01, epochs=1, checkpoint=path)
    with pytest.warns(UserWarning, match=r"continues the run at its learning rate 0.01; "
                      r"lr=0.05 is ignored"):  # fmt: skip
        other = run(0.05, resume_from=path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = run(0.01, resume_from=path)
    assert torch.equal(other, same)


def test_resume_refuses_another_optimizer_and_warns_of_another_kl_weight(tmp_path):
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    loader = DataLoader(TensorDataset(x, y), batch_size=20)

    def run(**kw):
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        guide = mean_field_guide(model)
        fit(model, guide, loader, epochs=kw.pop("epochs", 2), progress=False, seed=0, **kw)
        return model, guide

    def sgd(params):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)

    adam_run, sgd_run = tmp_path / "adam.pt", tmp_path / "sgd.pt"
    run(epochs=1, checkpoint=adam_run)
    run(epochs=1, checkpoint=sgd_run, optim=sgd)
    model, guide = run(epochs=1)  # a fresh run's weights: resuming must not touch them
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"adam.pt' was trained with the optimizer "
                       r"pyrouq.infer._adam.Adam, but this fit\(\) builds torch.optim.sgd.SGD: "
                       r"the saved optimizer state \(moments, step counts\) belongs to the other "
                       r"one. Leave optim=None, as the run did, or start a new run."):  # fmt: skip
        fit(model, guide, loader, epochs=2, optim=sgd, progress=False, resume_from=adam_run)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(CheckpointError, match=r"sgd.pt' was trained with the optimizer "
                       r"torch.optim.sgd.SGD, but this fit\(\) builds pyrouq.infer._adam.Adam "
                       r"\(optim=None: pyrouq's Adam\): .* Pass the run's optim, e.g. lambda "
                       r"params: SGD\(params, ...\), or start a new run."):  # fmt: skip
        fit(model, guide, loader, epochs=2, progress=False, resume_from=sgd_run)
    run(resume_from=sgd_run, optim=sgd)  # the run's optimizer: accepted
    with pytest.warns(UserWarning, match=r"continues a run trained with kl_weight=0.02 under "
                      r"kl_weight=0.5: the objective changes from here on. Pass "
                      r"kl_weight=0.02"):  # fmt: skip
        run(resume_from=adam_run, kl_weight=0.5)
    cut = tmp_path / "cut.pt"  # a run of 2 epochs stopped after the first
    with pytest.raises(TrainingInterrupted):
        run(epochs=2, checkpoint=cut, callbacks=[StopAfter(1)])
    for option, effect in (
        ({"epochs": 3}, r"epochs=2 under epochs=3: the learning-rate schedule, planned over"),
        ({"lr_schedule": "constant"}, r"lr_schedule='warmup_cosine' under lr_schedule='const"),
        ({"num_particles": 2}, r"num_particles=1 under num_particles=2: each step averages"),
        ({"num_data": 400}, r"num_data=40 under num_data=400: the likelihood is scaled"),
    ):
        with pytest.warns(UserWarning, match=r"continues a run trained with " + effect) as seen:
            run(resume_from=cut, **option)
        assert len(seen) == 1, [str(w.message) for w in seen]  # that setting alone
    pairs = tmp_path / "pairs.pt"  # two particles a step, one after the other
    with pytest.raises(TrainingInterrupted):
        run(epochs=2, checkpoint=pairs, callbacks=[StopAfter(1)], num_particles=2)
    with pytest.warns(UserWarning, match=r"continues a run trained with vectorize_particles="
                      r"False under vectorize_particles=True: the particles are drawn in "
                      r"another order") as seen:  # fmt: skip
        run(resume_from=pairs, num_particles=2, vectorize_particles=True)
    assert len(seen) == 1, [str(w.message) for w in seen]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(resume_from=cut)
        run(resume_from=cut, vectorize_particles=True)  # one particle: the same draws
        run(resume_from=pairs, num_particles=2)
        # a finished run of 2 steps trained on: planned anew, its lr no higher than at the end
        run(resume_from=adam_run, epochs=2)


def test_resuming_a_finished_run_warns_that_the_learning_rate_rises_again(tmp_path):
    # a warm-up/cosine run ends near lr 0; trained on for more epochs its schedule is planned
    # anew over them, so the learning rate rose again without a word
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    loader = DataLoader(TensorDataset(x, y), batch_size=10)  # 4 steps an epoch
    lrs: list[float] = []

    class Recorded(torch.optim.SGD):
        def step(self, closure=None):
            lrs.append(self.param_groups[0]["lr"])
            return super().step(closure)

    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(4, 3)))
    guide = mean_field_guide(model)
    path = tmp_path / "run.pt"
    kw = {"progress": False, "optim": lambda p: Recorded(p, lr=0.1)}
    fit(model, guide, loader, epochs=2, checkpoint=path, **kw)
    assert lrs[-1] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 6 / 7)))  # 0.00495
    lrs.clear()
    with pytest.warns(UserWarning, match=r"trains a finished run of 2 epochs on to epochs=4: "
                      r"lr_schedule='warmup_cosine' is planned anew over the 4 epochs, so the "
                      r"learning rate, which the run ended at 0.00495156, rises to 0.0677302 at "
                      r"the next step, then decays towards 0 again. To train on at a low, flat "
                      r"learning rate instead, call fit\(\) without resume_from"):  # fmt: skip
        fit(model, guide, loader, epochs=4, resume_from=path, **kw)
    assert lrs[0] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 5 / 13)))  # 0.0677
    # trained on to 20 epochs (80 steps, a warm-up of 16), step 9 lies inside the new warm-up:
    # the rate climbs on to the full 0.1, where the warning said it decayed from 0.05625
    lrs.clear()
    with pytest.warns(UserWarning, match=r"which the run ended at 0.00495156, rises to 0.05625 "
                      r"at the next step and on to 0.1 at the end of the warm-up \(step 16 of "
                      r"80\), then decays towards 0 again\."):  # fmt: skip
        fit(model, guide, loader, epochs=20, resume_from=path, **kw)
    assert lrs[0] == pytest.approx(0.1 * 9 / 16) and lrs[7] == max(lrs) == pytest.approx(0.1)
    # the advice followed: a flat, low learning rate from the fitted parameters, quietly
    lrs.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = {"progress": False, "optim": lambda p: Recorded(p, lr=0.005)}
        fit(model, guide, loader, epochs=2, lr_schedule="constant", **flat)
    assert lrs == [0.005] * 8
    # another schedule than the run's is warned of apart, not as this run's planned anew
    with pytest.warns(UserWarning) as told:
        fit(model, guide, loader, epochs=4, resume_from=path, lr_schedule="cosine", **kw)
    assert [str(w.message) for w in told if "planned anew" in str(w.message)] == []
    # a rise of a fifth (a run of 2 steps, its cosine ended at 0.05; a new warm-up of 5 steps
    # is at 0.06 on its third) is warned of too
    one_step = DataLoader(TensorDataset(x, y), batch_size=40)
    short = tmp_path / "short.pt"
    fit(model, guide, one_step, epochs=2, checkpoint=short, **kw)
    with pytest.warns(UserWarning, match=r"ended at 0.05, rises to 0.06 at the next step and on "
                      r"to 0.1 at the end of the warm-up \(step 5 of 25\)"):  # fmt: skip
        fit(model, guide, one_step, epochs=25, resume_from=short, **kw)


def test_resume_names_the_config_entry_that_differs(tmp_path):
    # the long entries (sites, priors) agree: the message shows the one that does not
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    loader = DataLoader(TensorDataset(x, y), batch_size=20)

    def build(local):
        net = nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)], nn.Linear(4, 3))
        return bayesian(net, local_reparameterization=local)

    model = build(False)
    path = tmp_path / "run.pt"
    fit(model, mean_field_guide(model), loader, epochs=1, progress=False, checkpoint=path)
    other = build(True)
    with pytest.raises(CheckpointError, match=r"of another config: config\['local_reparameteri"
                       r"zation'\] is false there and true in the model\. Rebuild"):  # fmt: skip
        fit(other, mean_field_guide(other), loader, epochs=2, progress=False, resume_from=path)
    # a network of another structure: the layer that differs, not the start of both records
    wider = bayesian(nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)], nn.Linear(4, 5)))
    with pytest.raises(
        CheckpointError,
        match=r"of another module: module\['parameters'\]\['12"
        r"\.weight'\] is \[3, 4\] there and \[5, 4\] in the model; module\["
        r"'parameters'\]\['12\.bias'\] is \[3\] there and \[5\] in the model",
    ):
        fit(wider, mean_field_guide(wider), loader, epochs=2, progress=False, resume_from=path)


@pytest.mark.parametrize("kind", ["bayesian", "rank1"])
def test_resume_refuses_a_model_built_with_other_priors(tmp_path, kind):
    # a prior's parameters are buffers: loading the run's state would swap them in silently
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))

    def build(scale):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        if kind == "bayesian":
            return bayesian(net, prior=scale)
        return rank1(net, 2, prior_scale=scale)

    model = build(0.2)
    loader = DataLoader(TensorDataset(x, y), batch_size=20)
    path = tmp_path / "run.pt"
    fit(model, mean_field_guide(model), loader, epochs=1, progress=False, checkpoint=path)
    other = build(0.5)
    message = (
        r"trained with the prior Normal\(loc=[01], scale=0.2\) of site '0\.\w+', but the model "
        r"has Normal\(loc=[01], scale=0.5\)\. Rebuild the model with the run's prior"
    )
    with pytest.raises(CheckpointError, match=message):
        fit(other, mean_field_guide(other), loader, epochs=2, progress=False, resume_from=path)
    again = build(0.2)  # the run's own prior resumes
    result = fit(again, mean_field_guide(again), loader, epochs=2, progress=False,
                 resume_from=path)  # fmt: skip
    assert len(result.history) == 2


# --------------------------------------------------------------------------------------------
# non-finite inputs
# --------------------------------------------------------------------------------------------


def test_nan_inputs_are_refused_before_training(mnist_small):
    train, _, _ = mnist_small
    images = train.images.float().clone()
    images[70, 3, 3] = float("nan")
    loader = TensorLoader(
        images, train.labels, 64, shuffle=False, flatten=True, normalize=True, seed=0
    )
    model = small_mlp()
    guide = mean_field_guide(model)
    before = params_of(model, guide)
    with pytest.raises(ValueError, match=r"NaN or inf in 1 of 512 examples.*\[70\].*batch 2"):
        fit(model, guide, loader, epochs=1, progress=False)
    for key, value in params_of(model, guide).items():
        assert torch.equal(value, before[key])


def test_nan_in_a_streamed_batch_is_refused_before_its_step():
    x = torch.randn(40, 3)
    y = (x[:, 0] > 0).long()
    x[25, 1] = float("inf")
    batches = [(x[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10)]

    class Stream(list):
        dataset = range(40)

    model = BayesianMLP(in_features=3, hidden_features=4, out_features=2)
    with pytest.raises(ValueError, match=r"Batch 3 of epoch 1 holds NaN or inf in 1 of 10"):
        fit(model, mean_field_guide(model), Stream(batches), epochs=1, progress=False)


def test_labels_out_of_range_are_refused(mnist_small):
    train, _, _ = mnist_small
    model = BayesianMLP(hidden_features=8, out_features=5)  # MNIST has 10 classes
    with pytest.raises(ValueError, match=r"labels in \[0, 9\], expected class indices in \[0, 4\]"):
        fit(model, mean_field_guide(model), loader_like(train), epochs=1, progress=False)


# --------------------------------------------------------------------------------------------
# determinism and isolation
# --------------------------------------------------------------------------------------------


def test_same_seed_same_history_and_predictions(mnist_small):
    train, x_test, _ = mnist_small
    runs = []
    for _ in range(2):
        pyro.set_rng_seed(0)
        model = small_mlp()
        guide = mean_field_guide(model)
        result = fit(model, guide, loader_like(train), epochs=2, progress=False, seed=5)
        pyro.set_rng_seed(9)
        runs.append((history_values(result), predict(model, x_test, guide).probs))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])
    model = small_mlp()
    guide = mean_field_guide(model)
    other = fit(model, guide, loader_like(train, seed=4), epochs=2, progress=False, seed=6)
    assert history_values(other) != runs[0][0]


def test_two_models_in_one_process_never_share_parameters(mnist_small):
    train, _, _ = mnist_small
    a, b = small_mlp(), small_mlp()
    guide_a, guide_b = mean_field_guide(a), mean_field_guide(b)
    assert guide_a.name != guide_b.name
    fit(a, guide_a, loader_like(train), epochs=1, progress=False, seed=0)
    b_before = params_of(b, guide_b)
    ens_a, ens_b = BatchEnsembleMLP(hidden_features=8), BatchEnsembleMLP(hidden_features=8)
    ens_b_before = params_of(ens_b, None)
    fit(ens_a, None, loader_like(train), epochs=1, progress=False, seed=0)
    for key, value in params_of(b, guide_b).items():
        assert torch.equal(value, b_before[key]), key
    for key, value in params_of(ens_b, None).items():
        assert torch.equal(value, ens_b_before[key]), key
    names = set(pyro.get_param_store().keys())
    assert any(n.startswith(f"{guide_a.name}$$$") for n in names)
    assert not any(n.startswith(f"{guide_b.name}$$$") for n in names)  # b was never run


def test_rebuilding_in_a_rerun_notebook_cell_works(mnist_small):
    """Re-running `model = ...; guide = ...; fit(...)` must not trip over old param names."""
    train, _, _ = mnist_small
    for _ in range(3):
        model = small_mlp()
        guide = mean_field_guide(model)
        fit(model, guide, loader_like(train), epochs=1, progress=False, seed=0)
        ensemble = BatchEnsembleMLP(hidden_features=8, num_members=2)
        fit(ensemble, None, loader_like(train), epochs=1, progress=False, seed=0)
        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), pyrouq.KLWeightedELBO())
        x, y = next(iter(loader_like(train)))
        assert torch.isfinite(torch.tensor(svi.step(x, y)))


@pytest.mark.parametrize("kind", ["batchensemble", "rank1"])
def test_a_checkpoint_from_before_the_norms_option_loads_with_shared_norms(kind, tmp_path):
    """Checkpoints written before ``norms`` existed hold networks whose members shared the
    normalisation layers: they load so, whatever today's default."""
    net = pyrouq.ResidualCNN(width=4)
    if kind == "batchensemble":
        model, guide = pyrouq.batchensemble(net, 2, norms="shared"), None
    else:
        model = pyrouq.rank1(net, 2)
        guide = mean_field_guide(model)
    path = save(tmp_path / "old.pt", model, guide)
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    config = description["model"]["config"]
    del (config if kind == "batchensemble" else config["ensemble"])["norms"]
    payload["description"] = json.dumps(description)
    torch.save(payload, path)
    back = load(path, module=pyrouq.ResidualCNN(width=4))
    options = back.model.options if kind == "batchensemble" else back.model.ensemble_options
    assert options["norms"] == "shared"
    x = torch.randn(3, 1, 28, 28)
    model.eval()
    if guide is None:
        torch.testing.assert_close(back.model(x), model(x))
    else:
        point = guide.means()
        torch.testing.assert_close(back.model.outputs(x, point), model.outputs(x, point))


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_skeleton_with_other_settings_is_refused_and_older_files_are_not_checked(tmp_path):
    """The same layers set up otherwise (a BatchNorm's eps, a convolution's padding mode)
    compute another function with the saved weights; files written before the settings were
    recorded load and resume as they did."""

    class Tagged(nn.Module):  # prints what differs between builds: not a setting read
        def forward(self, h):
            return h

        def extra_repr(self):
            return f"built at {id(self)}"

    def net(eps=1e-5, padding_mode="zeros", inplace=False):
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(1, 2, 3, padding=1, padding_mode=padding_mode),
            nn.BatchNorm2d(2, eps=eps),
            nn.ReLU(inplace=inplace),  # the same function either way
            Tagged(),
            nn.Flatten(),
            nn.Linear(32, 3),
        )

    model = bayesian(net())
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 1, 4, 4), torch.randint(0, 3, (8,))
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted):
        fit(model, guide, [(x, y)], epochs=2, num_data=8, progress=False, seed=0,
            checkpoint=path, callbacks=[StopAfter(1)])  # fmt: skip
    with pytest.raises(CheckpointError, match=r"module '1' \(BatchNorm2d\) has eps=1e-05 in the "
                       r"checkpoint and eps=0.5 in the skeleton, and may compute another "
                       r"function with the saved weights"):  # fmt: skip
        load(path, module=net(eps=0.5))
    reflect = r"module '0' \(Conv2d\) has padding_mode='zeros' in the checkpoint and "
    with pytest.raises(CheckpointError, match=reflect + r"padding_mode='reflect' in the skel"):
        load(path, module=net(padding_mode="reflect"))
    assert load(path, module=net(inplace=True)).model.net[2].inplace  # another build: taken

    def pooled(size, pool):
        return nn.Sequential(nn.Conv2d(1, 2, size), nn.MaxPool2d(pool), nn.Flatten(),
                             nn.Linear(2, 3))  # fmt: skip

    import numpy as np

    saved = save(tmp_path / "pooled.pt", bayesian(pooled(np.int64(3), 2)))  # numpy's 3, pool 2
    load(saved, module=pooled(3, (2, 2)))  # the same layers, spelled otherwise
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    del description["model"]["module"]["settings"]  # as written before 2026-12-04
    payload["description"] = json.dumps(description)
    torch.save(payload, path)
    assert load(path, module=net(eps=0.5)).model.net[1].eps == 0.5  # not recorded: unchecked
    resumed = bayesian(net())
    result = fit(resumed, mean_field_guide(resumed), [(x, y)], epochs=2, num_data=8,
                 progress=False, resume_from=path)  # fmt: skip
    assert [r.epoch for r in result.history] == [1, 2]


def test_a_float64_network_comes_back_float64_to_the_bit(tmp_path):
    """load() rebuilds float32 modules; every tensor takes its saved dtype back."""

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))

    x = torch.randn(5, 4, dtype=torch.float64)
    for kind in ("bayesian", "batchensemble", "rank1", "front door"):
        if kind == "bayesian":
            model = pyrouq.bayesian(net(), likelihood=pyrouq.Gaussian("learned"))
            model(x)  # the learned noise scale takes its shape from the first batch
            model.double()
        elif kind == "batchensemble":
            model = pyrouq.batchensemble(net(), 2).double()
        elif kind == "rank1":
            model = pyrouq.rank1(net(), 2).double()
        else:
            model = BayesianMLP(in_features=4, hidden_features=8, out_features=2).double()
        guide = None if kind == "batchensemble" else pyrouq.mean_field_guide(model).double()
        if guide is not None:
            with torch.no_grad():
                for p in guide.parameters():
                    p.add_(1e-12)  # a detail only float64 holds
        pyrouq.save(tmp_path / f"{kind}.pt", model, guide)
        back = pyrouq.load(tmp_path / f"{kind}.pt", module=None if kind == "front door" else net())
        for original, restored in ((model, back.model), (guide, back.guide)):
            if original is None:
                continue
            for (name, a), (_, b) in zip(
                original.state_dict().items(), restored.state_dict().items(), strict=True
            ):
                assert a.dtype == b.dtype and torch.equal(a, b), (kind, name)
        draws = None if guide is None else 2
        pyro.set_rng_seed(0)
        before = predict(model.eval(), x, guide, num_samples=draws, progress=False)
        pyro.set_rng_seed(0)
        after = predict(back.model, x, back.guide, num_samples=draws, progress=False)
        first = before.probs if hasattr(before, "probs") else before.loc
        again = after.probs if hasattr(after, "probs") else after.loc
        assert again.dtype == torch.float64 and torch.equal(first, again), kind


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_loaded_bayesian_network_keeps_the_weights_it_was_converted_from(tmp_path):
    """The latent sites' start values (the trained network a model was converted from) are
    saved: a loaded model's plain_network() and a new guide start from them, not from the
    skeleton's fresh weights. A version-2 file, which lacked them, still loads (taking the
    skeleton's, as it did)."""

    def net(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    trained = net(0)
    path = save(tmp_path / "converted.pt", bayesian(trained, select="last_layer"))
    back = load(path, module=net(1))
    plain = back.model.plain_network()
    for name, value in trained.state_dict().items():
        assert torch.equal(plain.state_dict()[name], value), name
    guide = mean_field_guide(back.model)
    assert torch.equal(guide.site_loc("2.weight"), trained[2].weight)

    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 2
    payload["model"] = {
        k: v for k, v in payload["model"].items() if k not in ("net.2.weight", "net.2.bias")
    }
    torch.save(payload, tmp_path / "v2.pt")
    old = load(tmp_path / "v2.pt", module=net(1))
    assert torch.equal(old.model.plain_network()[2].weight, net(1)[2].weight)
    assert torch.equal(old.model.plain_network()[0].weight, trained[0].weight)


def as_version_2(path, out, model):
    """The file at ``path`` as pyrouq wrote it before version 3: without the latent sites'
    start values."""
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 2
    starts = {f"net.{site}" for site in model.network_sites()}
    payload["model"] = {k: v for k, v in payload["model"].items() if k not in starts}
    torch.save(payload, out)
    return out


def test_version_2_runs_resume_and_float64_ones_load_float64(tmp_path):
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))

    def run():
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        return model, mean_field_guide(model)

    loader = pyrouq.ArrayLoader(x, y, 16, seed=0)
    model, guide = run()
    fit(model, guide, loader, epochs=1, progress=False, seed=0, checkpoint=tmp_path / "r.pt")
    old = as_version_2(tmp_path / "r.pt", tmp_path / "r2.pt", model)
    again, again_guide = run()
    result = fit(again, again_guide, loader, epochs=2, progress=False, seed=0, resume_from=old)
    assert len(result.history) == 2  # it failed: "Missing key(s) net.0.weight"

    double = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double())
    path = save(tmp_path / "d.pt", double, mean_field_guide(double))
    skeleton = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))  # float32
    back = load(as_version_2(path, tmp_path / "d2.pt", double), module=skeleton)
    assert {v.dtype for v in back.model.state_dict().values()} == {torch.float64}
    probs = predict(back.model, torch.randn(3, 4, dtype=torch.float64), back.guide,
                    num_samples=2, progress=False).probs  # fmt: skip
    assert probs.dtype == torch.float64
    # a float64 network beside a float32 noise prior: the starts take the network's dtype
    import pyro.distributions as dist

    mixed = bayesian(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).double(),
        likelihood=pyrouq.Gaussian(dist.HalfNormal(1.0)),
    )
    path = save(tmp_path / "m.pt", mixed, mean_field_guide(mixed))
    skeleton = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    back = load(as_version_2(path, tmp_path / "m2.pt", mixed), module=skeleton)
    loc = predict(back.model, torch.randn(3, 4, dtype=torch.float64), back.guide,
                  num_samples=2, progress=False).loc  # fmt: skip
    assert loc.dtype == torch.float64
    # priors were float32 whatever the network before 2026-12-02: the network's saved tensors
    # tell its dtype (the last layer latent, the first a point estimate)
    last = bayesian(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double(), select="last_layer"
    )
    path = save(tmp_path / "l.pt", last, mean_field_guide(last))
    as_version_2(path, tmp_path / "l2.pt", last)
    payload = torch.load(tmp_path / "l2.pt", weights_only=True)
    payload["model"] = {
        k: v.float() if k.startswith("site_priors.") else v for k, v in payload["model"].items()
    }
    torch.save(payload, tmp_path / "l2.pt")
    skeleton = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    back = load(tmp_path / "l2.pt", module=skeleton)
    assert back.model.template()["2.weight"].dtype == torch.float64


def test_a_float64_network_with_a_float32_noise_prior_predicts_after_a_round_trip(tmp_path):
    """A float64 network beside a float32 noise prior is saved with mixed dtypes, so load()
    casts tensor by tensor: the latent sites' start values, unsaved before, stayed float32
    and the prediction failed on float32 times float64."""
    import pyro.distributions as dist

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    model = bayesian(net().double(), likelihood=pyrouq.Gaussian(dist.HalfNormal(1.0)))
    guide = mean_field_guide(model)
    back = load(save(tmp_path / "mixed.pt", model, guide), module=net())
    x = torch.randn(5, 4, dtype=torch.float64)
    pyro.set_rng_seed(0)
    before = predict(model.eval(), x, guide, num_samples=2, progress=False)
    pyro.set_rng_seed(0)
    after = predict(back.model, x, back.guide, num_samples=2, progress=False)
    assert after.loc.dtype == torch.float64 and torch.equal(before.loc, after.loc)


def test_a_converted_model_as_the_skeleton_is_refused_with_the_fix(tmp_path):
    def net():
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    model = bayesian(net())
    save(tmp_path / "m.pt", model, mean_field_guide(model))
    for wrong in (bayesian(net()), pyrouq.batchensemble(net(), 2)):
        expected = (
            r"module= got a (BayesianNetwork|BatchEnsembleNetwork), a pyrouq model, but it "
            r"takes the plain network the saved model was made from \(torch.nn.modules."
            r"container.Sequential\): load\(path, module=make_net\(\)\)"
        )
        with pytest.raises(CheckpointError, match=expected):
            load(tmp_path / "m.pt", module=wrong)
    # a converted model's .net: named as the user's class (the engine's SwappingSequential
    # was named before), with the same fix
    for wrong in (model, pyrouq.batchensemble(net(), 2)):
        with pytest.raises(CheckpointError) as refused:
            load(tmp_path / "m.pt", module=wrong.net)
        assert str(refused.value).startswith(
            "module= got the network inside a converted pyrouq model (its .net, a Sequential "
            "that the conversion rewrote), but it takes the plain network the saved model was "
            "made from (torch.nn.modules.container.Sequential): load(path, module=make_net())"
        )
        assert "Swapping" not in str(refused.value)
    assert load(tmp_path / "m.pt", module=net()).model.network_sites() == model.network_sites()
    # a converted network saved as it sits inside its model (its record holds the rewritten
    # classes) still loads into another model's .net, which holds them too
    loaded = load(save(tmp_path / "net.pt", model.net), module=bayesian(net()).net).model
    pairs = zip(loaded.state_dict().values(), model.net.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize("latent", [False, True])
def test_a_batchensemble_is_the_skeleton_of_a_saved_batchensemble_or_rank1_network(
    tmp_path, latent
):
    """load(module=batchensemble(net, 2)), the network a factory returning the ensemble
    builds (`pyrouq evaluate` of such a run passes it), was refused: 'module= got a
    BatchEnsembleNetwork, a pyrouq model, but it takes the plain network'. It rebuilds the
    saved model when the network it was made from matches the record and its members and
    norms the saved ones; else it is refused, saying what differs."""

    def net(width=8):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3))

    ensemble = pyrouq.batchensemble(net(), 2, r_std=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a Normal(0, 1) prior on the factors: its warning)
        model = bayesian(ensemble) if latent else ensemble
    guide = mean_field_guide(model) if latent else None
    path = save(tmp_path / "m.pt", model, guide)
    back = load(path, module=pyrouq.batchensemble(net(), 2))
    x = torch.randn(5, 4)
    draws = 2 if latent else None  # (a BatchEnsemble's members are not sampled)
    pyro.set_rng_seed(0)
    before = predict(model.eval(), x, guide, num_samples=draws, progress=False)
    pyro.set_rng_seed(0)
    after = predict(back.model, x, back.guide, num_samples=draws, progress=False)
    assert torch.equal(before.probs, after.probs)
    options = back.model.ensemble_options if latent else back.model.options
    assert options["r_std"] == 0.3  # the saved factors' options, not the skeleton's 0.5
    made = "a rank-1 network" if latent else "a BatchEnsemble"
    with pytest.raises(CheckpointError) as refused:
        load(path, module=pyrouq.batchensemble(net(), 3, norms="shared"))
    assert str(refused.value) == (
        f"The skeleton (a BatchEnsemble, num_members=3, norms='shared') does not match "
        f"{str(path)!r}, which holds {made} of num_members=2, norms='per_member'. Build the "
        "skeleton as the saved one was built (batchensemble(net, 2, norms='per_member')), or "
        "pass the plain network it was made from: load(path, module=net)."
    )
    with pytest.raises(CheckpointError, match=r"parameter '0.weight' is shape \(8, 4\) in th"):
        load(path, module=pyrouq.batchensemble(net(width=6), 2))
    # nothing else loosened: an ensemble built on the meta device (no values: it took none of
    # the saved ones, silently) is refused as a plain skeleton is, and the skeleton's num_data
    # is not the loaded model's (the file's: none here)
    with torch.device("meta"):
        on_meta = pyrouq.batchensemble(net(), 2)
    with pytest.raises(CheckpointError, match=r"has tensors on the meta device \('net.0.weight'"):
        load(path, module=on_meta)
    counted = pyrouq.batchensemble(net(), 2)
    counted.num_data = counted.given_num_data = 100
    back = load(path, module=counted)
    assert back.model.num_data is None and back.model.given_num_data is None


class _TwoLayers(nn.Module):  # a network of one's own class: no Sequential, no pooling
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("convert", ["bayesian", "batchensemble", "rank1"])
def test_the_net_of_a_converted_network_of_ones_own_class_is_refused_with_the_fix(
    tmp_path, convert
):
    # 8563add named a converted model's .net by the engine's rewritten Sequential or pooling
    # classes alone: the .net of a network of one's own class, holding neither, was still
    # told 'parameter 'fc1.weight' is shape (8, 4) in the checkpoint and absent in the
    # skeleton. Build the module exactly as the saved one was built.', which it was
    make = {"bayesian": bayesian, "batchensemble": pyrouq.batchensemble, "rank1": pyrouq.rank1}
    model = make[convert](_TwoLayers(), *([] if convert == "bayesian" else [2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (saved without a guide: the structure is enough)
        save(tmp_path / "m.pt", model)
    with pytest.raises(CheckpointError) as refused:
        load(tmp_path / "m.pt", module=model.net)
    assert str(refused.value).startswith(
        "module= got the network inside a converted pyrouq model (its .net, a _TwoLayers that "
        "the conversion rewrote), but it takes the plain network the saved model was made from "
        f"({__name__}._TwoLayers): load(path, module=make_net())"
    )
    # the fix it names: the model rebuilt, its weights the saved ones
    loaded = load(tmp_path / "m.pt", module=_TwoLayers()).model
    assert type(loaded) is type(model)
    for (name, a), (_, b) in zip(
        loaded.state_dict().items(), model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.filterwarnings("ignore:fit\\(resume_from=\\.\\.\\.\\) trains a finished run")
def test_resume_with_another_batch_size_warns_that_the_run_is_not_continued_exactly(tmp_path):
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))

    def run(batch_size, **kw):
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        loader = pyrouq.ArrayLoader(x, y, batch_size, seed=0)
        fit(model, mean_field_guide(model), loader, progress=False, seed=0, **kw)

    path = tmp_path / "run.pt"
    run(10, epochs=1, checkpoint=path)
    with pytest.warns(UserWarning, match=r"continues a run of 4 batches an epoch with a loader "
                      r"of 2: the learning-rate schedule no longer matches the run's. Resume "
                      r"with the run's loader"):  # fmt: skip
        run(20, epochs=2, resume_from=path)
    # 40 rows at 11 a batch are 4 batches too: the batch size tells
    with pytest.warns(
        UserWarning,
        match=r"continues a run of batch size 10 with a loader of "
        r"batch size 11: its steps see other batches than the run's would have",
    ):
        run(11, epochs=2, resume_from=path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r".*trains a finished run")  # (its own test)
        run(10, epochs=2, resume_from=path)


def test_a_run_stopped_inside_an_epoch_on_other_ranks_is_told_its_steps_skip_other_batches(
    tmp_path,
):
    # the warning of a resume on another number of ranks (0509c6c) said what changes; the
    # steps of the stopped epoch skipped anew are one, only where the run stopped inside one
    # (its checkpoint's ranks edited: one process stands for 2 ranks' shards)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))

    class Stopping(pyrouq.ArrayLoader):  # Ctrl-C before its 3rd batch
        def __iter__(self):
            for step, batch in enumerate(super().__iter__()):
                if step == 2:
                    raise KeyboardInterrupt
                yield batch

    def run(loader, **kw):
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
        fit(model, mean_field_guide(model), loader, progress=False, seed=0, epochs=2, **kw)

    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted):
        run(Stopping(x, y, 10, seed=0), checkpoint=path)
    payload = torch.load(path, weights_only=True)
    assert (payload["training"]["epoch_steps"], payload["training"]["world"]) == (2, 1)
    torch.save({**payload, "training": {**payload["training"], "world": 2}}, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(pyrouq.ArrayLoader(x, y, 10, seed=0), resume_from=path)
    assert [str(w.message) for w in caught if "continues" in str(w.message)] == [
        "fit(resume_from=...) continues in one process a run trained on 2 ranks: its epochs "
        "are split otherwise than the run's: the 2 steps the run took of epoch 1 skip other "
        "batches than it saw; every step sees other batches than the run's would have. Resume "
        "on 2 ranks (torchrun --nproc_per_node 2), with the run's loader, to continue it as it "
        "was, or give this loader batch_size=20, whose steps then see the run's batches."
    ]


def _run_batches_of(size, path, **kw):
    """fit() on 16 rows through a DataLoader of ``batch_sampler=`` batches of ``size``."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(x), size, False)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=batches)
    model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    fit(model, mean_field_guide(model), loader, progress=False, seed=0, checkpoint=path, **kw)


@pytest.mark.filterwarnings("ignore:fit\\(resume_from=\\.\\.\\.\\) trains a finished run")
def test_a_batch_sampler_loaders_batch_size_is_recorded_and_compared_on_resume(tmp_path):
    # recorded as 0 (told none) before: a resume with other batches of as many a epoch
    # (16 rows at 6 or at 7 are 3 batches) went on without a word
    path = tmp_path / "run.pt"
    _run_batches_of(6, path, epochs=1)
    assert torch.load(path, weights_only=True)["training"]["batch_size"] == 6
    with pytest.warns(
        UserWarning,
        match=r"continues a run of batch size 6 with a loader of batch size 7: its steps see "
        r"other batches than the run's would have",
    ):
        _run_batches_of(7, tmp_path / "other.pt", epochs=2, resume_from=path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r".*trains a finished run")  # (its own test)
        _run_batches_of(6, tmp_path / "same.pt", epochs=2, resume_from=path)


def test_a_checkpoint_that_recorded_no_batch_size_resumes_without_comparing_it(tmp_path):
    # checkpoints written before a batch_sampler= loader's batch size was read recorded 0
    path = tmp_path / "run.pt"
    _run_batches_of(6, path, epochs=1)
    payload = torch.load(path, weights_only=True)
    payload["training"]["batch_size"] = 0
    torch.save(payload, path)
    for size in (6, 7):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.filterwarnings("ignore", message=r".*trains a finished run")  # (its own test)
            _run_batches_of(size, tmp_path / f"resumed{size}.pt", epochs=2, resume_from=path)
        resumed = torch.load(tmp_path / f"resumed{size}.pt", weights_only=True)["training"]
        assert (resumed["epochs_done"], resumed["batch_size"]) == (2, size)


def test_numpy_sizes_and_seeds_train_save_and_load_as_python_numbers(tmp_path):
    """Sizes, counts and seeds may be numpy's (read from an array or a config): the run is the
    one of the Python numbers they equal, and the checkpoint writes them as such."""
    import numpy as np

    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))

    def run(number):
        torch.manual_seed(0)  # the network's initial weights
        model = BayesianMLP(in_features=number(4), hidden_features=number(8), out_features=3)
        guide = mean_field_guide(model)
        loader = pyrouq.ArrayLoader(x, y, batch_size=number(8), seed=number(0))
        fit(model, guide, loader, epochs=number(2), seed=number(1), progress=False)
        return model, guide

    model, guide = run(np.int64)
    save(tmp_path / "np.pt", model, guide)
    loaded = load(tmp_path / "np.pt")
    assert loaded.model.config["hidden_features"] == 8
    assert type(loaded.model.config["hidden_features"]) is int
    _, plain_guide = run(int)
    ours, plain = loaded.guide.state_dict(), plain_guide.state_dict()
    assert list(ours) == list(plain)
    assert all(torch.equal(ours[k], plain[k]) for k in ours)


def test_a_batchensemble_of_numpy_settings_predicts_its_members_and_resumes_checked(tmp_path):
    import numpy as np

    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loader = pyrouq.ArrayLoader(x, y, batch_size=8, seed=0)
    model = pyrouq.batchensemble(MLP(4, 8, 3), np.int64(3), r_std=np.float32(0.25))
    fit(model, None, loader, epochs=1, progress=False, checkpoint=tmp_path / "be.pt")
    assert predict(model, x, progress=False).probs.shape == (3, 16, 3)  # S = M
    bayes = BayesianMLP(4, 8, 3)
    fit(bayes, mean_field_guide(bayes), loader, epochs=1, progress=False,
        checkpoint=tmp_path / "bayes.pt")  # fmt: skip
    other = BayesianMLP(4, np.int64(16), 3)
    pattern = r"config\['hidden_features'\] is 8 there and 16 in the model"
    with pytest.raises(CheckpointError, match=pattern):
        fit(other, mean_field_guide(other), loader, epochs=2, progress=False,
            resume_from=tmp_path / "bayes.pt")  # fmt: skip
    fit(model, None, loader, epochs=1, progress=False, metadata={"fold": np.int64(2)},
        checkpoint=tmp_path / "meta.pt")  # fmt: skip
    assert load(tmp_path / "meta.pt").metadata == {"fold": 2}
    unused = r"holds pyrouq's BatchEnsembleMLP, which it rebuilds from its description: the "
    with pytest.warns(UserWarning, match=unused + r"module= skeleton \(MLP\) is not used"):
        load(tmp_path / "meta.pt", module=MLP(4, 8, 3))


def test_a_resume_refused_for_its_guide_class_or_dtype_changes_nothing_and_says_why(tmp_path):
    from pyro.infer.autoguide import AutoNormal

    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    torch.manual_seed(0)
    model = bayesian(net, num_data=8)
    fit(model, mean_field_guide(model), [(x, y)], epochs=1, progress=False,
        checkpoint=tmp_path / "run.pt")  # fmt: skip
    torch.manual_seed(1)
    fresh = bayesian(net, num_data=8)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"was trained with a MeanFieldGuide guide, but "
                       r"guide is of class AutoNormal: the saved guide state belongs to the "
                       r"other class\. Build the guide as the run did \(a MeanFieldGuide, "
                       r"mean_field_guide\(model\)\)"):  # fmt: skip
        fit(fresh, AutoNormal(fresh), [(x, y)], epochs=2, progress=False,
            resume_from=tmp_path / "run.pt")  # fmt: skip
    after = fresh.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing loaded
    # a guide subclass holds the guide's state: it resumes
    subclass = type("MyGuide", (pyrouq.MeanFieldGuide,), {})
    fit(fresh, subclass(fresh), [(x, y)], epochs=2, progress=False,
        resume_from=tmp_path / "run.pt")  # fmt: skip
    # a float64 model (a Bayesian MLP has no nn.Parameter) takes the float32 run's dtype, said
    wide = BayesianMLP(3, 4, 2, num_data=8).double()
    mlp = BayesianMLP(3, 4, 2, num_data=8)
    fit(mlp, mean_field_guide(mlp), [(x, y)], epochs=1, progress=False,
        checkpoint=tmp_path / "mlp.pt")  # fmt: skip
    with pytest.warns(UserWarning, match=r"holds float32 tensors where the model was built in "
                      r"float64: it takes the run's dtype"):  # fmt: skip
        fit(wide, mean_field_guide(wide), [(x.double(), y)], epochs=2, progress=False,
            resume_from=tmp_path / "mlp.pt")  # fmt: skip
    # a guide state that does not fit: the model and guide stay as built, float64 too
    payload = torch.load(tmp_path / "mlp.pt", weights_only=True)
    first = next(iter(payload["guide"]))
    payload["guide"][first] = payload["guide"][first][:1]
    torch.save(payload, tmp_path / "damaged.pt")
    wide = BayesianMLP(3, 4, 2, num_data=8).double()
    guide = mean_field_guide(wide)
    built = {k: v.clone() for k, v in [*wide.state_dict().items(), *guide.state_dict().items()]}
    with pytest.raises(CheckpointError, match=r"the saved guide parameters do not fit the "
                       r"MeanFieldGuide the guide given"), warnings.catch_warnings():  # fmt: skip
        warnings.simplefilter("ignore")  # (the dtype)
        fit(wide, guide, [(x.double(), y)], epochs=2, progress=False,
            resume_from=tmp_path / "damaged.pt")  # fmt: skip
    now = {**wide.state_dict(), **guide.state_dict()}
    assert all(now[k].dtype == v.dtype and torch.equal(now[k], v) for k, v in built.items())
