"""fit()'s set-up (its look at the first examples, its ``lr`` beside ``optim=``) and the
BatchEnsemble layers' refusals of an input, audit 10."""

from __future__ import annotations

import inspect
import re
import warnings

import pyro
import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader, tiny_mlp, toy_data
from torch import nn

import pyrouq


class AlwaysDrop(nn.Module):
    """A network whose dropout stays on in evaluation (MC dropout written by hand)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.b(F.dropout(torch.relu(self.a(x)), 0.5, training=True))


class CountsCalls(nn.Module):
    """A network counting its calls in a buffer, in any mode."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls += 1
        return self.a(x)


# -- lr beside optim= ---------------------------------------------------------------------


def _fit_with(**kwargs):
    x, y = toy_data(20)
    torch.manual_seed(0)
    model = tiny_mlp()
    built = []

    def optim(params):
        built.append(torch.optim.SGD(params, lr=1e-3))
        return built[-1]

    pyrouq.fit(model, pyrouq.mean_field_guide(model), ListLoader(x, y, 20), epochs=1,
               optim=optim, lr_schedule="constant", progress=False, **kwargs)  # fmt: skip
    return built[0]


@pytest.mark.parametrize("lr", [0.1, 2e-2])
def test_an_lr_given_beside_optim_is_warned_of_as_having_no_effect(lr):
    """fit(optim=..., lr=0.1) trained at optim's 1e-3 and said nothing: lr is the default
    Adam's alone. An lr given explicitly is warned of, the default's own value included."""
    with pytest.warns(UserWarning) as caught:
        optimizer = _fit_with(lr=lr)
    texts = [str(w.message) for w in caught]
    assert any(
        t.startswith(f"fit(lr={lr!r}) has no effect beside optim=: lr is the learning rate of "
                     "the default Adam only") and f"torch.optim.AdamW(params, lr={lr!r})" in t
        for t in texts
    ), texts  # fmt: skip
    assert optimizer.param_groups[0]["lr"] == 1e-3  # optim's own, as documented
    assert {w.filename for w in caught if "beside optim" in str(w.message)} == {__file__}


def test_the_default_lr_beside_optim_is_not_warned_of_and_reads_as_its_value():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = _fit_with()
    assert optimizer.param_groups[0]["lr"] == 1e-3
    default = inspect.signature(pyrouq.fit).parameters["lr"].default
    assert default == 2e-2 and repr(default) == "0.02"


# -- the set-up's passes leave the random streams as found -------------------------------


def _unseeded_run(num_classes):
    x, y = toy_data(40)
    torch.manual_seed(0)
    model = pyrouq.bayesian(AlwaysDrop())
    if num_classes is not None:
        model.num_classes = num_classes
    torch.manual_seed(5)  # the user's seed, fit(seed=None)
    result = pyrouq.fit(model, pyrouq.mean_field_guide(model), ListLoader(x, y, 20), epochs=2,
                        progress=False)  # fmt: skip
    return result.losses, torch.rand(3)


def test_counting_the_classes_draws_nothing_from_torchs_stream():
    """Counting the classes (num_classes unset) ran the network on torch's stream: with an
    always-on dropout the run's losses depended on whether num_classes was set (32.33 / 29.83
    against 32.93 / 30.63)."""
    counted, told = _unseeded_run(None), _unseeded_run(2)
    assert counted[0] == told[0]
    assert torch.equal(counted[1], told[1])


def test_the_set_up_pass_is_a_forward_like_any_other():
    """Counting the classes runs the network once, in evaluation mode: what a forward changes
    happens there too, as documented (putting buffers back and not the attributes beside them
    left a first-call initialisation half undone)."""
    x, y = toy_data(40)
    torch.manual_seed(0)
    model = pyrouq.bayesian(CountsCalls())
    pyrouq.fit(model, pyrouq.mean_field_guide(model), ListLoader(x, y, 20), epochs=1, seed=0,
               progress=False)  # fmt: skip
    assert model.net.calls.item() == 3  # the look's call, then the two steps'


def _autoguide_ranks_worker(rank: int, init: str, out: str) -> None:
    """Two ranks whose generators differ before fit(seed=0), an AutoNormal drawing its start
    values (init_to_sample) in the set-up pass; then no seed, the generators alike."""
    import torch.distributed as dist
    from _processes import exit_quietly
    from pyro.infer.autoguide import AutoNormal, init_to_sample

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    outcomes = {}
    try:
        x, y = toy_data(16)
        for name, seed, stream in (("seeded", 0, 100 + rank), ("unseeded", None, 7)):
            pyro.clear_param_store()
            torch.manual_seed(0)
            model = tiny_mlp()
            guide = AutoNormal(model, init_loc_fn=init_to_sample)
            torch.manual_seed(stream)
            pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 4, seed=0), epochs=1, seed=seed,
                       lr_schedule="constant", progress=False)  # fmt: skip
            outcomes[name] = guide.locs.fc1.weight.detach().clone()
        torch.save(outcomes, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_the_set_up_passs_draws_are_alike_on_every_rank(tmp_path):
    """The pass draws from streams seeded apart from the run's: from fit()'s seed on every
    rank alike (the ranks' own seeds, seed + r, would start their guides apart and fit()
    refuse them), and without a seed from each rank's generator (alike when seeded alike)."""
    from _processes import spawn_ranks

    spawn_ranks(_autoguide_ranks_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name in ("seeded", "unseeded"):
        assert torch.equal(ranks[0][name], ranks[1][name]), name


# -- a BatchEnsemble layer refusing its input ---------------------------------------------


def _deep(norms="per_member"):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Sequential(nn.Conv2d(5, 4, 3)), nn.Flatten(), nn.Linear(4, 2),
    )  # fmt: skip
    return pyrouq.batchensemble(net, 2, norms=norms)


def test_a_layer_run_member_by_member_names_its_path_and_one_members_batch():
    """On the CPU the members run one after another, each on the batch B of 3: the layer
    said "expects inputs of shape (M * B, 5, H, W)" and named no path."""
    model = _deep().eval()
    with pytest.raises(ValueError) as info:
        model(torch.randn(3, 3, 6, 6))
    assert str(info.value) == (
        "BatchEnsembleConv2d(5, 4, kernel_size=(3, 3), stride=(1, 1), num_members=2) at "
        "'net.3.0' of the model expects inputs of shape (B, 5, H, W) (one member's "
        "batch: on the CPU the network runs its members in turn), got shape (3, 4, 4, 4). "
        "Check the output size of the layer before it, or this layer's input size."
    )


def test_a_layer_run_on_the_folded_batch_names_its_path_and_the_folded_batch():
    """A BatchNorm shared by the members computes its statistics over the folded batch:
    the network runs on M * B = 6 inputs at once."""
    model = _deep(norms="shared").train()
    with pytest.raises(ValueError) as info:
        model(torch.randn(3, 3, 6, 6))
    message = str(info.value)
    assert message.startswith(
        "BatchEnsembleConv2d(5, 4, kernel_size=(3, 3), stride=(1, 1), num_members=2) at "
        "'net.3.0' of the model expects inputs of shape (M * B, 5, H, W), got "
        "shape (6, 4, 4, 4)."
    ), message


def test_a_layer_of_a_hand_built_network_is_named_by_its_class_and_settings():
    """No converter runs it: no path is looked up (no walk of the callers' frames)."""
    net = nn.Sequential(pyrouq.BatchEnsembleLinear(3, 4, 2), pyrouq.BatchEnsembleLinear(5, 2, 2))
    with pytest.raises(ValueError, match=re.escape(
        "BatchEnsembleLinear(5, 2, num_members=2) expects inputs of shape "
        "(M * B, ..., 5), got shape (4, 4)."
    )):  # fmt: skip
        net(torch.randn(4, 3))


@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_a_first_layer_refusing_the_models_input_names_its_channels_and_the_fix(norms):
    """A network for colour images given greyscale ones (MNIST): its first layer said "Check
    the output size of the layer before it", which it has none of."""
    model = _deep(norms=norms).train()  # (shared: the members run on the folded batch)
    batch, rows = ("B", 3) if norms == "per_member" else ("M * B", 6)
    with pytest.raises(ValueError) as info:
        model(torch.randn(3, 1, 6, 6))
    assert re.sub(r" \(one member's batch: [^)]*\)", "", str(info.value)) == (
        "BatchEnsembleConv2d(3, 4, kernel_size=(3, 3), stride=(1, 1), num_members=2) at "
        f"'net.0' of the model expects inputs of shape ({batch}, 3, H, W), got shape ({rows}, "
        "1, 6, 6): the model's input, of 1 channel where this layer takes 3. Repeat the grey "
        "channel, x.expand(-1, 3, -1, -1), or build the network for 1 input channel (its first "
        "layer's in_channels=1)."
    )
    told = (
        rf"got shape \({rows}, 2, 6, 6\): the model's input, of 2 channels where this layer "
        r"takes 3\. Pass inputs of 3 channels, or build the network for 2 input channels \(its "
        r"first layer's in_channels=2\)\.$"
    )
    with pytest.raises(ValueError, match=told):
        model(torch.randn(3, 2, 6, 6))
    flat = pyrouq.batchensemble(nn.Sequential(nn.Linear(36, 2)), 2)
    told = (
        r"got shape \(3, 1, 6, 6\): the model's input, of 6 features where this layer takes "
        r"36\. Flatten it, x\.flatten\(1\), or put nn\.Flatten\(\) first in the network\.$"
    )
    with pytest.raises(ValueError, match=told):
        flat(torch.randn(3, 1, 6, 6))
    # ... of several channels: an image's features are all its channels' pixels
    told = r"of 3 features where this layer takes 18\. Flatten it, x\.flatten\(1\), or put "
    with pytest.raises(ValueError, match=told):
        pyrouq.batchensemble(nn.Sequential(nn.Linear(18, 2)), 2)(torch.randn(3, 2, 3, 3))
    # no channels, or no features: was told to build the network for 0 input channels
    told = (
        rf"got shape \({rows}, 0, 6, 6\): the model's input, of no channels \(it holds no "
        r"values\) where this layer takes 3\. Check the step that made it \(an empty slice or "
        r"selection of the channels, such as x\[:, 3:\] of 3-channel images, leaves none\) "
        r"and pass inputs of 3 channels\.$"
    )
    with pytest.raises(ValueError, match=told):
        model(torch.randn(3, 0, 6, 6))
    told = r"got shape \(3, 0\): the model's input, of no features .* pass inputs of 36 features"
    with pytest.raises(ValueError, match=told):
        flat(torch.randn(3, 0))
    # one example without its batch dim: was told to "Reshape it to that shape, or build the
    # network's first layer for inputs of this one" (folded, shared: repeated per member)
    one = r": the model's input, one example without its batch dim\. Pass it as a batch of "
    with pytest.raises(ValueError, match=rf"got shape \({rows}, 6, 6\){one}one, x\.unsqueeze\(0\)"):
        model(torch.randn(3, 6, 6))
    with pytest.raises(ValueError, match=rf"got shape \(36,\){one}one, x\.unsqueeze\(0\)"):
        flat(torch.randn(36))
    assert flat(torch.randn(36).unsqueeze(0)).shape == (2, 1, 2)
    # ... not one of another shape (no batch of one would fit it)
    told = rf"got shape \({rows * 2 // 3}, 6, 6\): the model's input\. Reshape it to that shape"
    with pytest.raises(ValueError, match=told):
        model(torch.randn(2, 6, 6))
    # a later layer given an output of the input's shape is told as before (the first layer's
    # input holds the model's values, not only its shape)
    net = nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(3, 2, 3))
    told = r"at 'net\.1' of the model .*got shape \(3, 1, 6, 6\)\. Check the output size of"
    with pytest.raises(ValueError, match=told):
        pyrouq.batchensemble(net, 2)(torch.randn(3, 1, 6, 6))
    # ... even one whose input holds the input's values: zeros through a layer without a bias
    # (was told to build the network for 1 input channel, which its first layer already takes)
    net = nn.Sequential(nn.Conv2d(1, 1, 3, padding=1, bias=False), nn.Conv2d(3, 2, 3))
    told = r"at 'net\.1' of the model .*got shape \(3, 1, 6, 6\)\. Check the output size of"
    with pytest.raises(ValueError, match=told):
        pyrouq.batchensemble(net, 2)(torch.zeros(3, 1, 6, 6))
    # an empty batch of images to a network of flat inputs: refused as before (was an
    # IndexError, "index 0 is out of bounds for dimension 0 with size 0")
    told = r"at 'net\.0' of the model .*got shape \(0, 1, 6, 6\)\. Check the output size of"
    with pytest.raises(ValueError, match=told):
        flat(torch.randn(0, 1, 6, 6))


def test_a_bayesian_first_layer_refusing_the_models_input_says_the_fix_in_fit_and_predict():
    """A Bayesian network for colour images given greyscale ones got torch's words and the
    layer's path, and 'Check that the network takes x', not the fix a BatchEnsemble network
    gets (the grey channel repeated, or a first layer of 1 channel)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    model = pyrouq.bayesian(net)
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(4, 1, 6, 6), torch.tensor([0, 1, 2, 0])
    fix = (
        "(in Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1)) at 'net.0' of the model): the "
        "model's input, of 1 channel where this layer takes 3. Repeat the grey channel, "
        "x.expand(-1, 3, -1, -1), or build the network for 1 input channel (its first layer's "
        "in_channels=1)"
    )
    with pytest.raises(ValueError, match=re.escape(f"{fix}; nothing was trained.") + "$"):
        pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 4), epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"^predict\(\): BayesianNetwork failed on x .*"
                       + re.escape(f"{fix}.") + "$"):  # fmt: skip
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    flat = pyrouq.bayesian(nn.Sequential(nn.Linear(36, 2)))
    told = (
        r"\(in Linear\(in_features=36, .*\) at 'net\.0' of the model\): the model's input, of 6 "
        r"features where this layer takes 36\. Flatten it, x\.flatten\(1\), or put "
        r"nn\.Flatten\(\) first in the network\.$"
    )
    with pytest.raises(ValueError, match=told):
        pyrouq.predict(flat, x, pyrouq.mean_field_guide(flat), num_samples=2, progress=False)
    # a later layer, given an output of the input's shape, is told as before
    later = pyrouq.bayesian(nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Conv2d(3, 2, 3)))
    told = r"at 'net\.1' of the model\)\. Check that the network takes x \(shape, channels, "
    with pytest.raises(ValueError, match=told):
        pyrouq.predict(later, x, pyrouq.mean_field_guide(later), num_samples=2, progress=False)
    # ... even one given values equal to the input's: zeros through a layer without a bias
    # (the check of values alone told it to build the first layer for 1 input channel)
    zeros = pyrouq.bayesian(
        nn.Sequential(nn.Conv2d(1, 1, 3, padding=1, bias=False), nn.Conv2d(3, 2, 3))
    )
    with pytest.raises(ValueError, match=told):
        pyrouq.predict(
            zeros,
            torch.zeros(4, 1, 6, 6),
            pyrouq.mean_field_guide(zeros),
            num_samples=2,
            progress=False,
        )


class _AttentionFirst(nn.Module):
    """Attention registered before the input's Linear: its out_proj, a Linear that its
    forward reads as tensors (never called), comes first in module order."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.embed, self.head = nn.Linear(5, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        return self.head(self.attn(h, h, h)[0].mean(1))


@pytest.mark.parametrize("convert", ["batchensemble", "rank1", "bayesian"])
def test_a_first_layer_after_an_attentions_out_proj_says_the_fix(convert):
    """135bb8c took the first Linear in module order as the network's first layer: an
    attention's out_proj registered before it, which no input reaches, made the layer taking
    x a later one (a BatchEnsemble network's told 'Check the output size of the layer before
    it', as before 1f3bbe0; a Bayesian one's, no fix)."""
    torch.manual_seed(0)
    if convert == "bayesian":
        model = pyrouq.bayesian(_AttentionFirst())
    else:
        model = getattr(pyrouq, convert)(_AttentionFirst(), 2)
    guide = pyrouq.mean_field_guide(model) if convert != "batchensemble" else None
    told = (
        r"at 'net\.embed' of the model.*: the model's input, of 4 features where this layer "
        r"takes 5\. Pass inputs of 5 features, or build the network for 4 \(its first layer's "
        r"in_features=4\)\.$"
    )
    with pytest.raises(ValueError, match=told):
        pyrouq.predict(
            model,
            torch.randn(3, 7, 4),
            guide,
            num_samples=None if guide is None else 2,
            progress=False,
        )


@pytest.mark.parametrize("convert", ["batchensemble", "bayesian"])
def test_a_first_layers_fix_fits_grouped_convolutions_and_images_of_another_size(convert):
    """A depthwise first convolution given grey images was told in_channels=1, which torch
    refuses beside groups=3; colour images to a network of 784 flat inputs were told 'build
    the network for 28 (in_features=28)', their last dim."""

    def run(net: nn.Module, x: torch.Tensor) -> None:
        if convert == "batchensemble":
            pyrouq.batchensemble(net, 2)(x)
        else:
            model = pyrouq.bayesian(net)
            pyrouq.predict(model, x, pyrouq.mean_field_guide(model), num_samples=2,
                           progress=False)  # fmt: skip

    torch.manual_seed(0)
    depthwise = nn.Sequential(nn.Conv2d(3, 6, 3, groups=3), nn.Flatten(), nn.Linear(216, 2))
    told = (
        r"of 1 channel where this layer takes 3\. Repeat the grey channel, x\.expand\(-1, 3, -1, "
        r"-1\), or build the network for 1 input channel \(its first layer's in_channels=1, "
        r"groups=1\)\.$"
    )
    with pytest.raises(ValueError, match=told):
        run(depthwise, torch.randn(2, 1, 8, 8))
    # the advice works: a network built for 1 channel with groups=1 takes the grey images
    nn.Sequential(nn.Conv2d(1, 6, 3, groups=1), nn.Flatten(), nn.Linear(216, 2))(
        torch.randn(2, 1, 8, 8)
    )
    flat = nn.Sequential(nn.Linear(784, 2))
    with pytest.raises(ValueError, match=r"of shape \(3, 28, 28\) an example \(2352 values\), "
                       r"where this layer takes 784 features\. Pass inputs of 784 values an "
                       r"example, or build the network for 2352 \(its first layer's "
                       r"in_features=2352\) with nn\.Flatten\(\) before it\.$"):  # fmt: skip
        run(flat, torch.randn(2, 3, 28, 28))
