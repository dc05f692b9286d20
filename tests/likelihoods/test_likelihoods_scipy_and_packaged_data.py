"""Audit 11 of the likelihoods and the data: the packaged MNIST / Fashion-MNIST against the IDX
files decoded by hand, every likelihood's scaled log-likelihood against scipy, the ELBO's data
term and KL against their formulas, ArrayLoader's epochs, rotations against torchvision, and
the fixes: nll() refusing targets that would broadcast, and house-style loader messages."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp
from scipy.special import softplus as np_softplus

import pyrouq
from pyrouq import ArrayLoader, KLWeightedELBO, Standardizer, bayesian, mean_field_guide
from pyrouq.data import (
    MNIST_MEAN,
    MNIST_STD,
    fashion_mnist_arrays,
    load_mnist,
    mnist_arrays,
    ood_loader,
)
from pyrouq.likelihoods import Categorical, Gaussian
from pyrouq.rotation import rotate

# --------------------------------------------------------------------------------------------
# The data: packaged copies against the raw IDX files, decoded here with numpy
# --------------------------------------------------------------------------------------------


def _idx(path):
    """An unsigned-byte IDX file decoded by hand: magic 0x00 0x00 0x08 ndim, big-endian dims."""
    raw = path.read_bytes()
    assert raw[:3] == b"\x00\x00\x08"
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


_SPLITS = [
    ("MNIST", "train"),
    ("MNIST", "test"),
    ("FashionMNIST", "train"),
    ("FashionMNIST", "test"),
]


@pytest.mark.parametrize(("folder", "split"), _SPLITS)
def test_packaged_splits_are_the_raw_idx_files(shared_data, folder, split):
    prefix = "train" if split == "train" else "t10k"
    raw = shared_data / folder / "raw"
    want_x = _idx(raw / f"{prefix}-images-idx3-ubyte")
    want_y = _idx(raw / f"{prefix}-labels-idx1-ubyte")
    reader = mnist_arrays if folder == "MNIST" else fashion_mnist_arrays
    # the bundled copy where one ships (not the Fashion-MNIST train split), and root= as well
    roots = [shared_data] if (folder, split) == ("FashionMNIST", "train") else [None, shared_data]
    for root in roots:
        x, y = reader(split, root=root)
        assert x.dtype == torch.uint8 and y.dtype == torch.int64
        assert tuple(x.shape) == (60000 if split == "train" else 10000, 28, 28)
        assert np.array_equal(x.numpy(), want_x)
        assert np.array_equal(y.numpy(), want_y.astype(np.int64))


def test_normalisation_constants_and_batches_are_the_documented_ones(shared_data):
    pixels = _idx(shared_data / "MNIST" / "raw" / "train-images-idx3-ubyte") / 255.0
    assert round(pixels.mean(), 4) == MNIST_MEAN == 0.1307  # 0.130660
    assert round(pixels.std(), 4) == MNIST_STD == 0.3081  # 0.308108
    train, _ = load_mnist(batch_size=500, shuffle=False, seed=0)
    x, y = next(iter(train))
    want = (pixels[:500].astype(np.float32) - np.float32(0.1307)) / np.float32(0.3081)
    np.testing.assert_allclose(x[:, 0].numpy(), want, rtol=0, atol=1e-6)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    fashion = _idx(shared_data / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte")
    x, _ = next(iter(ood_loader(batch_size=300, flatten=True, normalize=False)))
    np.testing.assert_allclose(x.numpy(), fashion[:300].reshape(300, -1) / 255.0, atol=1e-7)


def test_train_size_keeps_the_first_examples_and_a_seed_repeats_every_epoch():
    a, _ = load_mnist(batch_size=30, train_size=100, seed=3)
    b, _ = load_mnist(batch_size=30, train_size=100, seed=3)
    epochs_a = [[y.tolist() for _, y in a] for _ in range(2)]
    assert epochs_a == [[y.tolist() for _, y in b] for _ in range(2)]
    assert epochs_a[0] != epochs_a[1] and len(a) == 4  # reshuffled; ceil(100 / 30) batches
    first = mnist_arrays("train")[1][:100].tolist()
    assert all(sorted(v for batch in e for v in batch) == sorted(first) for e in epochs_a)


def test_a_root_without_the_files_is_a_clear_error_and_downloads_nothing(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(root=tmp_path)
    message = str(info.value)
    assert f"expected {tmp_path}/MNIST/raw/train-images-idx3-ubyte or " in message
    assert "leave root=None to use the bundled copy or pass download=True." in message
    assert list(tmp_path.iterdir()) == []  # nothing fetched, nothing written


# --------------------------------------------------------------------------------------------
# Likelihoods: the "obs" site and the fast NLL against scipy, scaled N/B
# --------------------------------------------------------------------------------------------

N, B = 40, 5


def _obs(lik, outputs, y, members=None, latent=None):
    trace = pyro.poutine.trace(
        lambda: lik.observe(outputs, y, N, "M", members=members, latent=latent)
    ).get_trace()
    trace.compute_log_prob()
    return trace.nodes["obs"]["scale"], float(trace.nodes["obs"]["log_prob_sum"].detach())


def test_categorical_log_likelihood_is_scipys_scaled_n_over_b():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(size=(3, B, 4)), rng.integers(0, 4, B)
    want = sum((lg[np.arange(B), labels] - logsumexp(lg, 1)).sum() for lg in logits)
    lik = Categorical()
    out, y = torch.tensor(logits), torch.tensor(labels)
    scale, log_prob = _obs(lik, out, y, members=3)
    assert scale == N / B == 8.0
    assert log_prob == pytest.approx(N / B * want, rel=1e-12)
    assert float(lik.nll(out, y)) == pytest.approx(-want, rel=1e-12)


def _gaussian_cases(rng):
    out, wide = rng.normal(size=(B, 2)), rng.normal(size=(B, 4))
    learned = Gaussian("learned")
    learned.prepare(torch.tensor(out))
    with torch.no_grad():
        learned.raw_scale.copy_(torch.tensor([0.3, -1.2], dtype=torch.float64))
    sigma = np.array([0.4, 1.3])
    return [
        (Gaussian(0.7), out, out, np.full_like(out, 0.7), None),
        (learned, out, out, np.broadcast_to(np_softplus([0.3, -1.2]), out.shape), None),
        (
            Gaussian("heteroscedastic", min_scale=0.01),
            wide,
            wide[:, :2],
            0.01 + np_softplus(wide[:, 2:]),
            None,
        ),
        (
            Gaussian(dist.HalfNormal(torch.ones(2))),
            out,
            out,
            np.broadcast_to(sigma, out.shape),
            {"sigma": torch.tensor(sigma)},
        ),
    ]


@pytest.mark.parametrize("case", range(4), ids=["fixed", "learned", "hetero", "latent"])
def test_gaussian_log_likelihood_is_scipys_scaled_n_over_b(case):
    rng = np.random.default_rng(1)
    lik, out, loc, sd, latent = _gaussian_cases(rng)[case]
    y = rng.normal(size=(B, 2))
    want = stats.norm.logpdf(y, loc, sd).sum()
    scale, log_prob = _obs(lik, torch.tensor(out), torch.tensor(y), latent=latent)
    assert scale == 8.0
    assert log_prob == pytest.approx(N / B * want, rel=1e-10)
    nll = lik.nll(torch.tensor(out), torch.tensor(y), latent).detach()
    assert float(nll) == pytest.approx(-want, rel=1e-10)


def test_one_output_takes_targets_n_or_n_by_1_alike():
    rng = np.random.default_rng(2)
    out, y = torch.tensor(rng.normal(size=(B, 1))), torch.tensor(rng.normal(size=B))
    want = stats.norm.logpdf(y.numpy(), out.numpy()[:, 0], 0.5).sum()
    lik = Gaussian(0.5)
    for target in (y, y[:, None]):
        assert _obs(lik, out, target)[1] == pytest.approx(N / B * want, rel=1e-12)
        assert float(lik.nll(out, target)) == pytest.approx(-want, rel=1e-12)


@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_the_elbo_data_term_is_n_over_b_and_the_kl_the_normal_formula(likelihood):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    lik = "categorical" if likelihood == "categorical" else Gaussian(0.8)
    model = bayesian(net, likelihood=lik, prior=1.0)
    model.num_data = 50
    guide = mean_field_guide(model)
    x = torch.randn(10, 3)
    y = torch.randint(0, 3, (10,)) if likelihood == "categorical" else torch.randn(10, 3)
    guide(x, y)
    with torch.no_grad():  # draws at the means (sd 2e-9): the data term is the means' network
        for rho in guide.rho.values():
            rho.fill_(-20.0)
    means, sds = guide.means(), guide.scales()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(means[name])
        out = net(x).double()
    if likelihood == "categorical":
        log_lik = torch.log_softmax(out, -1)[torch.arange(10), y].sum()
    else:
        log_lik = torch.distributions.Normal(out, 0.8).log_prob(y.double()).sum()
    kl = sum(  # KL(N(m, s) || N(0, 1)) = -log s + (s^2 + m^2) / 2 - 1/2, weight by weight
        (-sds[k].double().log() + (sds[k].double() ** 2 + means[k].double() ** 2) / 2 - 0.5).sum()
        for k in means
    )
    terms = KLWeightedELBO(0.1).terms(model, guide, x, y)
    assert float(terms.nll) == pytest.approx(-50 / 10 * float(log_lik), rel=1e-5)
    assert float(terms.kl) == pytest.approx(float(kl), rel=1e-5)
    want = -5 * float(log_lik) + 0.1 * float(kl)
    assert float(terms.loss.detach()) == pytest.approx(want, rel=1e-5)


# --------------------------------------------------------------------------------------------
# Fixed: nll() broadcast targets of the wrong shape into a wrong number
# --------------------------------------------------------------------------------------------


def test_gaussian_nll_refuses_targets_that_would_broadcast():
    outputs = torch.zeros(4, 1)
    # (1, 4) targets broadcast against (4, 1) means into 16 terms (before: 29.0, not 7.3)
    with pytest.raises(ValueError, match=r"Gaussian\.nll\(\): targets of shape \(1, 4\), "
                       r"expected \(N, 1\) or \(N,\) for a network with 1 output"):  # fmt: skip
        Gaussian(0.5).nll(outputs, torch.ones(1, 4))
    # (B,) targets of 2 outputs: each target read as both outputs' (before: no error)
    with pytest.raises(ValueError, match=r"Gaussian\.nll\(\): targets of shape \(4,\), "
                       r"expected \(N, 2\) for a network with 2 output"):  # fmt: skip
        Gaussian(0.5).nll(torch.zeros(4, 2), torch.ones(4))
    # the shapes check_targets takes still work, with the value by hand: z = 2 for each of 4
    want = 4 * (0.5 * 4 + math.log(0.5) + 0.5 * math.log(2 * math.pi))
    assert float(Gaussian(0.5).nll(outputs, torch.ones(4))) == pytest.approx(want, rel=1e-6)


def test_categorical_nll_refuses_labels_that_would_expand():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # one label (1,) expanded to every input (before: 0.1269 + 1.3133 + 0.6931, no error)
    with pytest.raises(ValueError, match=r"Categorical\.nll\(\): expected labels y of shape "
                       r"\(3,\) to match the 3 inputs, got shape \(1,\)"):  # fmt: skip
        Categorical().nll(logits, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"got shape \(3, 1\)\. Pass one integer label per "
                       r"input \(a column of labels: y\.squeeze\(-1\)\)"):  # fmt: skip
        Categorical().nll(logits, torch.tensor([[0], [1], [0]]))
    want = -(2 - math.log(1 + math.exp(2))) - (1 - math.log(1 + math.e)) + math.log(2)
    assert float(Categorical().nll(logits, torch.tensor([0, 1, 0]))) == pytest.approx(want)


# --------------------------------------------------------------------------------------------
# ArrayLoader and Standardizer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch_size", "sizes"), [(3, [3, 3, 3, 1]), (4, [4, 4, 2]), (11, [10])])
def test_array_loader_serves_every_example_once_per_epoch(batch_size, sizes):
    x, y = torch.arange(10.0)[:, None], torch.arange(10, dtype=torch.int32)
    loader = ArrayLoader(x, y, batch_size=batch_size, seed=1)
    twin = ArrayLoader(x, y, batch_size=batch_size, seed=1)
    epochs = [[(bx, by) for bx, by in loader] for _ in range(3)]
    assert len(loader) == len(sizes)
    for epoch in epochs:
        assert [len(by) for _, by in epoch] == sizes
        assert sorted(torch.cat([by for _, by in epoch]).tolist()) == list(range(10))
        assert all(by.dtype == torch.int32 and torch.equal(bx[:, 0].int(), by) for bx, by in epoch)
    orders = [torch.cat([by for _, by in e]).tolist() for e in epochs]
    if batch_size < 10:  # one batch of all ten differs only within itself
        assert orders[0] != orders[1]
    assert orders == [torch.cat([by for _, by in twin]).tolist() for _ in range(3)]


def test_loader_and_scaler_shape_messages_say_what_to_pass():
    x, y = torch.randn(10, 2), torch.randn(10)
    with pytest.raises(ValueError, match=r"ArrayLoader: x and y must hold the same number of "
                       r"rows, got 10 and 9; expected one row of y per row of x "
                       r"\(y\[i\] the target of x\[i\]\): pass the x and y of the same "
                       r"examples\."):  # fmt: skip
        ArrayLoader(x, y[:9])
    with pytest.raises(ValueError, match=r"expected y of shape \(N, 1\) as in fit\(\) .* got "
                       r"shape \(10,\)\. Pass y\.unsqueeze\(-1\)\."):  # fmt: skip
        Standardizer.fit(x, y[:, None]).transform_y(y)
    with pytest.raises(ValueError, match=r"expected y of shape \(N,\) as in fit\(\) .* got "
                       r"shape \(10, 1\)\. Pass y\.squeeze\(-1\)\."):  # fmt: skip
        Standardizer.fit(x, y).transform_y(y[:, None])


# --------------------------------------------------------------------------------------------
# Rotations against torchvision
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("angle", [15, 45, 90, 137.5, -30, 400])
def test_rotate_is_torchvisions_bilinear_rotation(angle):
    tf = pytest.importorskip("torchvision.transforms.functional")
    from torchvision.transforms import InterpolationMode

    images = mnist_arrays("test")[0][:8]
    raw = images.float().unsqueeze(1) / 255
    want = tf.rotate(raw, angle, interpolation=InterpolationMode.BILINEAR)
    torch.testing.assert_close(rotate(raw, angle, normalized=False), want, rtol=0, atol=1e-5)
    normalised = pyrouq.data.normalize(images)  # background: black in raw pixels
    torch.testing.assert_close(
        rotate(normalised, angle), (want - MNIST_MEAN) / MNIST_STD, rtol=0, atol=3e-5
    )
