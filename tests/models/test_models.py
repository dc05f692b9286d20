from __future__ import annotations

import re

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyrouq.infer import mean_field_guide
from pyrouq.models import MLP, BayesianLeNet, BayesianMLP, LeNet, ResidualCNN
from pyrouq.nn import BayesianConv2d, BayesianLinear


def tiny_mlp(**kw):
    return BayesianMLP(in_features=4, hidden_features=6, out_features=3, **kw)


def test_plain_networks_shapes_and_names():
    assert MLP()(torch.randn(2, 784)).shape == (2, 10)
    assert MLP(num_hidden=2)(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert [n for n, _ in MLP(num_hidden=2).named_parameters()] == [
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
        "fc3.weight",
        "fc3.bias",
    ]
    lenet = LeNet()
    assert lenet(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    shapes = {n: tuple(p.shape) for n, p in lenet.named_parameters()}
    assert shapes["conv1.weight"] == (6, 1, 5, 5)
    assert shapes["conv2.weight"] == (16, 6, 5, 5)
    assert shapes["fc1.weight"] == (120, 256)
    assert shapes["fc3.weight"] == (10, 84)
    assert sum(p.numel() for p in lenet.parameters()) == 44426


def test_bayesian_conv_takes_a_rectangular_kernel():
    layer = BayesianConv2d(2, 3, (1, 3), stride=(1, 2), padding=(0, 1))
    assert layer.prior("weight").event_shape == (3, 2, 1, 3)
    w, b = torch.randn(4, 3, 2, 1, 3), torch.randn(4, 3)
    x = torch.randn(5, 2, 6, 6)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(x)
    loop = torch.stack([torch.conv2d(x, w[s], b[s], (1, 2), (0, 1)) for s in range(4)])
    assert out.shape == (4, 5, 3, 6, 3)
    torch.testing.assert_close(out, loop)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_bayesian_sites_mirror_plain_parameters(cls):
    model = cls()
    plain = model.plain_network()
    expected = {n: p.shape for n, p in plain.named_parameters()}
    assert model.latent_sites() == expected
    x = torch.randn(2, 1, 28, 28)
    trace = poutine.trace(model).get_trace(x)
    latent = {
        n: s["value"].shape
        for n, s in trace.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and n not in ("data", "obs")
    }
    assert latent == expected
    assert trace.nodes["logits"]["value"].shape == (2, 10)
    assert trace.nodes["obs"]["value"].shape == (2,)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_priors_are_normal_with_prior_scale(cls):
    model = cls(prior_scale=0.3)
    trace = poutine.trace(model).get_trace(torch.randn(1, 1, 28, 28))
    fn = trace.nodes["fc1.weight"]["fn"]
    assert isinstance(fn, dist.Independent) and isinstance(fn.base_dist, dist.Normal)
    assert torch.all(fn.base_dist.scale == 0.3) and torch.all(fn.base_dist.loc == 0)
    assert fn.event_shape == trace.nodes["fc1.weight"]["value"].shape


def test_obs_is_scaled_by_n_over_b():
    model = tiny_mlp(num_data=100)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    trace = poutine.trace(model).get_trace(x, y)
    site = trace.nodes["obs"]
    assert site["scale"] == pytest.approx(100 / 5)
    assert [f.name for f in site["cond_indep_stack"]] == ["data"]
    torch.testing.assert_close(site["fn"].probs, trace.nodes["logits"]["value"].softmax(-1))


def test_observing_without_num_data_is_an_error():
    with pytest.raises(ValueError, match=r"BayesianMLP.num_data is not set.*num_data=N"):
        tiny_mlp()(torch.randn(2, 4), torch.tensor([0, 1]))
    # prediction needs no N
    assert tiny_mlp()(torch.randn(2, 4)).shape == (2, 3)


def test_bayesian_linear_with_sample_dim_matches_loop():
    layer = BayesianLinear(4, 3)
    w, b = torch.randn(5, 3, 4), torch.randn(5, 3)
    x = torch.randn(7, 4)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(x)
    expected = torch.stack([x @ w[s].T + b[s] for s in range(5)])
    torch.testing.assert_close(out, expected)
    xs = torch.randn(5, 7, 4)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(xs)
    torch.testing.assert_close(out, torch.stack([xs[s] @ w[s].T + b[s] for s in range(5)]))
    # inputs with more dims: (B, T, in) meets every draw; (S, B, T, in) pairs draw s with s
    seq = torch.randn(2, 6, 4)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(seq)
    torch.testing.assert_close(out, torch.stack([seq @ w[s].T + b[s] for s in range(5)]))
    per_draw = torch.randn(5, 2, 6, 4)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(per_draw)
    torch.testing.assert_close(out, torch.stack([per_draw[s] @ w[s].T + b[s] for s in range(5)]))
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(torch.ones(4))
    torch.testing.assert_close(out, w.sum(-1) + b)


def test_bayesian_layers_pickle_with_their_priors(tmp_path):
    for layer in (BayesianLinear(4, 3, prior_scale=0.5), BayesianConv2d(2, 3, 3)):
        torch.save(layer, tmp_path / "layer.pt")
        back = torch.load(tmp_path / "layer.pt", weights_only=False)
        assert type(back) is type(layer)
        assert back.prior("weight").base_dist.scale.unique().tolist() == (
            layer.prior("weight").base_dist.scale.unique().tolist()
        )


def test_bayesian_conv_grouped_matches_loop():
    layer = BayesianConv2d(2, 3, 3, padding=1)
    w, b = torch.randn(4, 3, 2, 3, 3), torch.randn(4, 3)
    x = torch.randn(5, 2, 6, 6)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(x)
    loop = torch.stack([torch.conv2d(x, w[s], b[s], padding=1) for s in range(4)])
    torch.testing.assert_close(out, loop)
    xs = torch.randn(4, 5, 2, 6, 6)
    with poutine.condition(data={"weight": w, "bias": b}):
        out = layer(xs)
    loop = torch.stack([torch.conv2d(xs[s], w[s], b[s], padding=1) for s in range(4)])
    torch.testing.assert_close(out, loop)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_stacked_forward_equals_per_draw_forward(cls):
    """A model run with S weight draws at once equals S runs with one draw each."""
    model = cls()
    x = torch.randn(3, 1, 28, 28)
    sites = model.latent_sites()
    draws = {n: torch.randn(4, 1, *shape) * 0.1 for n, shape in sites.items()}
    with poutine.condition(data=draws):
        stacked = model(x)
    assert stacked.shape == (4, 3, 10)
    for s in range(4):
        with poutine.condition(data={n: v[s, 0] for n, v in draws.items()}):
            torch.testing.assert_close(model(x), stacked[s], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_predictive_parallel_runs(cls):
    model = cls()
    x = torch.randn(5, 1, 28, 28)
    samples = pyro.infer.Predictive(model, num_samples=6, parallel=True)(x)
    assert samples["logits"].shape == (6, 5, 10)
    assert samples["obs"].shape == (6, 5)
    assert samples["fc1.weight"].shape[0] == 6


def test_bad_inputs_name_expected_shape():
    with pytest.raises(ValueError, match=r"expects images of shape \(B, 1, 28, 28\), got shape"):
        BayesianLeNet()(torch.randn(2, 784))
    with pytest.raises(ValueError, match=r"BayesianMLP expects inputs of shape \(B, 4\)"):
        tiny_mlp()(torch.randn(2, 5))
    # images of other channels: was "Use load_mnist(flatten=False), or x.view(-1, 3, 28, 28) for
    # flat inputs", which mixes the images of a batch
    told = (
        r"^LeNet expects images of shape \(B, 3, 28, 28\), got shape \(2, 1, 28, 28\): images "
        r"of 1 channel\. Repeat the grey channel, x\.expand\(-1, 3, -1, -1\), or build it with "
        r"in_channels=1\.$"
    )
    with pytest.raises(ValueError, match=told):
        LeNet(in_channels=3)(torch.randn(2, 1, 28, 28))
    # ... not where the images are not 28 x 28 either (its channels alone would not fix them)
    told = r"got shape \(2, 3, 32, 32\)\. Use load_mnist\(flatten=False\), or x\.view"
    with pytest.raises(ValueError, match=told):
        LeNet()(torch.randn(2, 3, 32, 32))
    told = (
        r"^ResidualCNN expects .* got shape \(2, 3, 8, 8\): images of 3 channels\. Make them "
        r"grey, x\.mean\(1, keepdim=True\), or build it with in_channels=3\.$"
    )
    with pytest.raises(ValueError, match=told):
        ResidualCNN()(torch.randn(2, 3, 8, 8))


@pytest.mark.parametrize(
    "make, x",
    [
        (lambda: MLP(), torch.randn(784)),
        (lambda: MLP(), torch.randn(28, 28)),
        (lambda: BayesianMLP(), torch.randn(784)),
        (lambda: LeNet(), torch.randn(1, 28, 28)),
        (lambda: BayesianLeNet(), torch.randn(1, 28, 28)),
        (lambda: LeNet(in_channels=3), torch.randn(3, 28, 28)),
        (lambda: ResidualCNN(), torch.randn(1, 8, 8)),
    ],
)
def test_one_example_without_its_batch_dim_is_told_to_unsqueeze(make, x):
    """Was told to flatten the images, set in_features or x.view(-1, 1, 28, 28) for flat
    inputs: the fix is a batch of one."""
    told = rf"got shape {re.escape(str(tuple(x.shape)))}[.:] .*x\.unsqueeze\(0\)\.$"
    with pytest.raises(ValueError, match=told):
        make()(x)
    assert make()(x.unsqueeze(0)).shape == (1, 10)
    # an input of another shape is told as before (no batch of one would fit it)
    with pytest.raises(ValueError, match=r"(Flatten the images|Use load_mnist)"):
        make()(torch.randn(5, *x.shape[1:]))


@pytest.mark.parametrize("shape", [(4, 196), (16, 49), (2, 392)])
def test_a_batch_of_other_features_is_not_told_it_is_one_example(shape):
    """Inputs holding 784 values in all, four examples of 196 (14x14 images), were told
    "That is one example without its batch dim", and x.unsqueeze(0) made them one."""
    told = re.escape(f"got shape {shape}. Flatten the images (load_mnist(flatten=True)) or set")
    with pytest.raises(ValueError, match=told):
        MLP()(torch.randn(shape))


@pytest.mark.parametrize("cls", [LeNet, BayesianLeNet, ResidualCNN])
def test_images_of_no_channels_are_not_told_to_build_for_none(cls):
    """Was "Make them grey, x.mean(1, keepdim=True), or build it with in_channels=0"."""
    told = (
        r"got shape \(2, 0, 28, 28\): images of no channels \(they hold no values\)\. Check "
        r"the step that made them \(an empty slice or selection of the channels, such as "
        r"x\[:, 3:\] of 3-channel images, leaves none\) and pass images of 1 channel\.$"
    )
    with pytest.raises(ValueError, match=told):
        cls()(torch.zeros(2, 0, 28, 28))


def test_bad_labels():
    model = tiny_mlp(num_data=10)
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"labels in \[0, 3\], expected class indices in \[0, 2\]"):
        model(x, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"expected labels y of shape \(3,\) .* got shape \(2,\)"):
        model(x, torch.tensor([0, 1]))
    with pytest.raises(
        ValueError, match=r"labels of dtype torch\.float32, expected an integer dtype"
    ):
        model(x, torch.tensor([0.0, 1.0, 2.0]))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"Expected prior_scale > 0 .*got -1"):
        BayesianMLP(prior_scale=-1.0)
    with pytest.raises(ValueError, match=r"Expected num_data to be a positive integer, got 0"):
        BayesianMLP(num_data=0)
    with pytest.raises(ValueError, match=r"Expected hidden_features to be a positive integer"):
        MLP(hidden_features=0)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_outputs_equal_the_conditioned_model(cls):
    model = cls()
    x = torch.randn(3, 1, 28, 28)
    sites = model.latent_sites()
    single = {n: torch.randn(shape) * 0.1 for n, shape in sites.items()}
    stacked = {n: torch.randn(4, 1, *shape) * 0.1 for n, shape in sites.items()}
    for draws in (single, stacked):
        with poutine.condition(data=draws):
            expected = model(x)
        torch.testing.assert_close(model.outputs(x, draws), expected)


@pytest.mark.parametrize("shape", [(3, 6, 24, 24), (2, 4, 7, 9), (5, 16, 8, 8), (6, 9, 9)])
@pytest.mark.parametrize("ties", [False, True])
def test_fast_max_pool_equals_torch_with_and_without_gradients(shape, ties):
    import torch.nn.functional as F

    from pyrouq._engine import MaxPool2x2

    g = torch.Generator().manual_seed(0)
    # with ties (small integers) the gradient must reach the same element of each window
    x = torch.randint(0, 3, shape, generator=g).float() if ties else torch.randn(*shape)
    grad = torch.randn(*shape[:-2], shape[-2] // 2, shape[-1] // 2, generator=g)
    pool = MaxPool2x2()
    with torch.no_grad():
        assert torch.equal(pool(x), F.max_pool2d(x, 2))
    xg = x.clone().requires_grad_()
    pool(xg).backward(grad)
    ref = x.clone().requires_grad_()
    F.max_pool2d(ref, 2).backward(grad)
    assert torch.equal(xg.grad, ref.grad)


@pytest.mark.parametrize(
    "window",
    [
        {"kernel_size": 3, "stride": 2, "padding": 1},  # a resnet's stem
        {"kernel_size": 3, "stride": 1, "padding": 1},
        {"kernel_size": (3, 2), "stride": (2, 1)},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
        {"kernel_size": 2, "stride": 2, "dilation": 2},
    ],
)
@pytest.mark.parametrize("values", ["normal", "ties", "nan"])
@pytest.mark.parametrize("channels", [16, 3])  # 3: below the channels-last route
def test_channels_last_max_pool_equals_torch_with_and_without_gradients(window, values, channels):
    import torch.nn.functional as F

    from pyrouq._engine import MaxPool2dChannelsLast

    g = torch.Generator().manual_seed(0)
    shape = (3, channels, 11, 10)
    x = torch.randn(*shape, generator=g)
    if values == "ties":  # the gradient must reach the same element of each window
        x = torch.randint(0, 3, shape, generator=g).float()
    elif values == "nan":
        x[torch.rand(*shape, generator=g) < 0.05] = float("nan")
    pool = MaxPool2dChannelsLast(**window)
    with torch.no_grad():
        fast = pool(x)
        assert fast.is_contiguous()
        assert torch.equal(fast.nan_to_num(7.0), F.max_pool2d(x, **window).nan_to_num(7.0))
    grad = torch.randn(fast.shape, generator=g)
    xg = x.clone().requires_grad_()
    out = pool(xg)
    out.backward(grad)
    ref = x.clone().requires_grad_()
    F.max_pool2d(ref, **window).backward(grad)
    assert out.is_contiguous()
    assert torch.equal(xg.grad, ref.grad)


def test_networks_use_the_fast_pool_and_large_cpu_batches_are_split():
    from pyrouq import _engine

    model = BayesianLeNet()
    pools = [m for m in model.net.modules() if isinstance(m, _engine.MaxPool2x2)]
    assert len(pools) == 2
    # ReLU then 2x2 pooling runs as pooling then ReLU (the same function, on a quarter of the
    # values), the layers in their places
    names = [name for name, _ in model.net.named_children()]
    assert names.index("relu1") < names.index("pool1")
    seen = []  # (not by a hook: a hooked ReLU, or any under a global hook, is not swapped)
    relu = model.net.relu1
    relu.forward = lambda h: (seen.append(tuple(h.shape)), type(relu).forward(relu, h))[1]
    try:
        model.outputs(torch.randn(2, 1, 28, 28), model.template())
    finally:
        del relu.forward
    assert seen == [(2, 6, 12, 12)]  # pooled: the convolution gives 24 x 24
    guide = mean_field_guide(model)
    weights = guide.means()
    x = torch.randn(_engine.CPU_CHUNK + 7, 1, 28, 28)
    with torch.no_grad():
        split = model.outputs(x, weights)
    whole = model.outputs(x, weights)  # gradients enabled: one pass
    torch.testing.assert_close(split, whole.detach(), rtol=1e-5, atol=1e-5)
    plain = LeNet()
    plain.load_state_dict(model.plain_network().state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model.net(x[:9]), plain(x[:9]), rtol=1e-5, atol=1e-6)
