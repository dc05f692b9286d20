"""Audit 13: likelihoods and data.

The likelihoods' log-probabilities against torch.distributions / scipy, the N/B scaling of the
``"obs"`` site against a hand-computed Pyro ``Trace_ELBO``, the bundled MNIST / Fashion-MNIST
against the raw ubyte files, and the loaders' errors on hostile data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import toy_data
from scipy import stats
from torch.func import functional_call
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from pyrouq import (
    ArrayLoader,
    Categorical,
    Gaussian,
    KLWeightedELBO,
    bayesian,
    fashion_mnist_arrays,
    fit,
    load_mnist,
    mean_field_guide,
    mnist_arrays,
)
from pyrouq.data import TensorLoader

RAW = Path(__file__).resolve().parents[3] / "shared" / "data"


def _net(out: int = 2) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, out))


# -- log-probabilities against independent references ------------------------------------------


def test_categorical_nll_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)  # S = 3 draws
    y = torch.tensor([0, 3, 1, 2, 3])
    ref = -torch.distributions.Categorical(logits=logits).log_prob(y).sum()
    assert Categorical().nll(logits, y).item() == pytest.approx(ref.item(), rel=1e-12)
    assert Categorical().nll(logits[0], y.int()).item() == pytest.approx(
        -torch.distributions.Categorical(logits=logits[0]).log_prob(y).sum().item(), rel=1e-12
    )


def test_gaussian_nll_of_every_noise_mode_matches_scipy():
    g = torch.Generator().manual_seed(1)
    out = torch.randn(6, 2, generator=g, dtype=torch.float64)
    t = torch.randn(6, 2, generator=g, dtype=torch.float64)
    o, tn = out.numpy(), t.numpy()
    fixed = -stats.norm(o, 0.3).logpdf(tn).sum()
    assert Gaussian(0.3).nll(out, t).item() == pytest.approx(fixed, rel=1e-12)

    learned = Gaussian("learned")
    learned.prepare(out)
    raw = torch.tensor([0.1, -1.0], dtype=torch.float64)
    with torch.no_grad():
        learned.raw_scale.copy_(raw)
    scale = np.log1p(np.exp(raw.numpy()))  # softplus
    ref = -stats.norm(o, scale).logpdf(tn).sum()
    assert learned.nll(out, t).item() == pytest.approx(ref, rel=1e-12)

    hetero = Gaussian("heteroscedastic", min_scale=0.01)
    o4 = torch.randn(6, 4, generator=g, dtype=torch.float64)
    scale4 = 0.01 + np.log1p(np.exp(o4[:, 2:].numpy()))  # D means, then D raw scales
    ref = -stats.norm(o4[:, :2].numpy(), scale4).logpdf(tn).sum()
    assert hetero.nll(o4, t).item() == pytest.approx(ref, rel=1e-12)
    loc, sd = hetero.predictive(o4)
    assert torch.allclose(loc, o4[:, :2]) and np.allclose(sd.numpy(), scale4)

    latent = Gaussian(dist.HalfNormal(torch.ones(2)))  # one latent noise per output
    draws = torch.randn(2, 6, 2, generator=g, dtype=torch.float64)  # S = 2
    sigma = torch.tensor([[0.7, 1.3], [0.2, 0.5]], dtype=torch.float64)
    ref = -sum(stats.norm(draws[s].numpy(), sigma[s].numpy()).logpdf(tn).sum() for s in range(2))
    assert latent.nll(draws, t, {"sigma": sigma}).item() == pytest.approx(ref, rel=1e-12)

    one = torch.randn(6, 1, generator=g, dtype=torch.float64)
    y1 = torch.randn(6, generator=g, dtype=torch.float64)  # (B,) targets of one output
    ref = -stats.norm(one[:, 0].numpy(), 0.5).logpdf(y1.numpy()).sum()
    assert Gaussian(0.5).nll(one, y1).item() == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize(
    "likelihood, out, target",
    [
        ("categorical", 2, lambda: torch.tensor([0, 1, 1, 0, 1])),
        ("gaussian", 2, lambda: torch.randn(5, 2)),
    ],
)
def test_trace_elbo_is_hand_elbo_with_obs_scaled_n_over_b(likelihood, out, target):
    """Pyro's Trace_ELBO of a pyrouq model, by hand: -(N/B) sum log p(y | f(x; w)) + log q(w)
    - log p(w) at the guide's draws (prior Normal(0, 1)); and pyrouq's own ELBO with
    kl_weight=1 equals Pyro's TraceMeanField_ELBO (analytic KL) on the same seed."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = _net(out)
    lik = Gaussian(0.7) if likelihood == "gaussian" else "categorical"
    model = bayesian(net, likelihood=lik)
    model.num_data = 50
    guide = mean_field_guide(model)
    x, y = torch.randn(5, 3), target()

    trace = pyro.poutine.trace(pyro.poutine.seed(model, 0)).get_trace(x, y)
    assert trace.nodes["obs"]["scale"] == pytest.approx(50 / 5)

    pyro.set_rng_seed(3)
    loss = pyro.infer.Trace_ELBO().loss(model, guide, x, y)
    pyro.set_rng_seed(3)
    guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
    sites = {
        n: s for n, s in guide_trace.nodes.items() if s["type"] == "sample" and not s["is_observed"]
    }
    assert set(sites) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    weights = {n: s["value"] for n, s in sites.items()}
    log_q = sum(s["fn"].log_prob(s["value"]).sum() for s in sites.values())
    log_p = sum(torch.distributions.Normal(0.0, 1.0).log_prob(w).sum() for w in weights.values())
    f = functional_call(net, weights, (x,))
    if likelihood == "gaussian":
        log_lik = torch.distributions.Normal(f, 0.7).log_prob(y).sum()
    else:
        log_lik = torch.distributions.Categorical(logits=f).log_prob(y).sum()
    hand = -(50 / 5) * log_lik + log_q - log_p
    assert loss == pytest.approx(hand.item(), rel=1e-5)

    pyro.set_rng_seed(5)
    ours = KLWeightedELBO(1.0).loss(model, guide, x, y)
    pyro.set_rng_seed(5)
    mean_field = pyro.infer.TraceMeanField_ELBO().loss(model, guide, x, y)
    assert ours == pytest.approx(mean_field, rel=1e-5)


# -- the fast NLL refuses what the observation site refuses (fixes) -----------------------------


def test_categorical_nll_refuses_float_labels_instead_of_truncating_them():
    logits = torch.tensor([[0.0, 3.0], [3.0, 0.0]])
    fragment = r"Categorical\.nll\(\): labels of dtype torch\.float32, expected an integer dtype"
    with pytest.raises(ValueError, match=fragment):
        Categorical().nll(logits, torch.tensor([0.9, 0.2]))  # was .long(): classes 0 and 0
    with pytest.raises(ValueError, match=r"labels of dtype torch\.bool"):
        Categorical().nll(logits, torch.tensor([True, False]))


def test_categorical_nll_names_out_of_range_labels():
    logits = torch.zeros(3, 2)
    with pytest.raises(ValueError) as info:  # was torch's IndexError "Target 2 is out of bounds."
        Categorical().nll(logits, torch.tensor([0, 2, 1]))
    assert str(info.value) == (
        "Categorical.nll(): labels in [0, 2], expected class indices in [0, 1] for a model "
        "with 2 classes. Check the targets or the model's number of classes."
    )
    with pytest.raises(ValueError, match=r"labels in \[-1, 1\], expected class indices in"):
        Categorical().nll(logits, torch.tensor([0, -1, 1]))


def test_categorical_nll_refuses_logits_of_one_class():
    with pytest.raises(ValueError, match="got logits of one class"):  # was 0.0, every time
        Categorical().nll(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long))


def test_gaussian_nll_refuses_integer_targets():
    with pytest.raises(ValueError) as info:  # was scored as reals
        Gaussian(0.5).nll(torch.zeros(4, 1), torch.tensor([0, 1, 1, 0]))
    assert str(info.value) == (
        "Gaussian.nll(): targets of dtype torch.int64, expected real values (a floating dtype): "
        "class labels belong to a Categorical likelihood; for real targets use y.float()."
    )


# -- bundled data against the raw files ---------------------------------------------------------


def _raw(folder: str, stem: str, offset: int) -> np.ndarray:
    path = RAW / folder / "raw" / stem
    if not path.exists():
        pytest.skip(f"no raw files at {path}")
    return np.frombuffer(path.read_bytes(), dtype=np.uint8, offset=offset)


@pytest.mark.parametrize(
    "folder, arrays, split, n",
    [
        ("MNIST", mnist_arrays, "train", 60000),
        ("MNIST", mnist_arrays, "test", 10000),
        ("FashionMNIST", fashion_mnist_arrays, "test", 10000),
    ],
)
def test_bundled_arrays_equal_the_raw_ubyte_files_bit_for_bit(folder, arrays, split, n):
    prefix = "train" if split == "train" else "t10k"
    raw_images = _raw(folder, f"{prefix}-images-idx3-ubyte", 16).reshape(-1, 28, 28)
    raw_labels = _raw(folder, f"{prefix}-labels-idx1-ubyte", 8)
    images, labels = arrays(split)
    assert images.shape == (n, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (n,) and labels.dtype == torch.int64
    assert (int(labels.min()), int(labels.max())) == (0, 9)
    assert np.array_equal(images.numpy(), raw_images)
    assert np.array_equal(labels.numpy(), raw_labels.astype(np.int64))


def test_fashion_mnist_train_read_from_a_torchvision_root():
    raw = _raw("FashionMNIST", "train-labels-idx1-ubyte", 8)
    images, labels = fashion_mnist_arrays("train", root=RAW)
    assert images.shape == (60000, 28, 28) and np.array_equal(labels.numpy(), raw.astype(np.int64))


def test_loader_normalisation_and_sizes():
    raw = _raw("MNIST", "train-images-idx3-ubyte", 16).reshape(-1, 28, 28)
    train, test = load_mnist(batch_size=100, shuffle=False, seed=0)
    sizes = (len(train.dataset), len(test.dataset), len(train), len(test))
    assert sizes == (60000, 10000, 600, 100)
    x, y = next(iter(train))
    ref = (torch.from_numpy(raw[:100].astype(np.float32)) / 255 - 0.1307) / 0.3081
    assert x.shape == (100, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.allclose(x[:, 0], ref, atol=1e-6, rtol=0)
    pixels = torch.from_numpy(raw.astype(np.float64)) / 255  # the constants' source
    assert (pixels.mean().item(), pixels.std().item()) == (
        pytest.approx(0.1307, abs=1e-4),
        pytest.approx(0.3081, abs=1e-4),
    )


# -- loaders on hostile data --------------------------------------------------------------------


def test_tensor_loader_refuses_an_empty_split():
    images, labels = torch.zeros(0, 28, 28, dtype=torch.uint8), torch.zeros(0, dtype=torch.long)
    with pytest.raises(ValueError) as info:  # was accepted, and fit() found it empty later
        TensorLoader(images, labels, 4, shuffle=False, flatten=False, normalize=True, seed=0)
    assert str(info.value).startswith(
        "TensorLoader: expected at least one image, got none (images of shape (0, 28, 28), "
        "labels (0,))."
    )


def test_array_loader_bool_labels_suggest_long():
    x, y = toy_data(8)
    with pytest.raises(TypeError) as info:
        ArrayLoader(x, y.bool())
    assert str(info.value) == (
        "ArrayLoader: expected floating-point or integer y, got dtype torch.bool; use y.float() "
        "for real-valued targets, y.long() for class labels."
    )


def _fit(loader, likelihood="categorical", out=2, **kw):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = bayesian(_net(out), likelihood=likelihood)
    kw.setdefault("lr_schedule", "constant")  # (some of these loaders have no length)
    fit(model, mean_field_guide(model), loader, epochs=1, progress=False, seed=0, **kw)
    return model


class _Dicts(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class _Stream(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y, strict=True))


def test_fit_refuses_hostile_loaders_before_training():
    x, y = toy_data(20)
    bad = x.clone()
    bad[3, 1] = float("nan")
    cases = [
        (DataLoader(TensorDataset(bad, y), batch_size=8), "holds NaN or inf in 1 of 20 examples"),
        (DataLoader(TensorDataset(x, y + 1), batch_size=8), "labels in [1, 2], expected class"),
        (DataLoader(TensorDataset(x, y.float()), batch_size=8), "labels of dtype torch.float32"),
        (DataLoader(_Dicts(x, y), batch_size=8), "is a dict with keys 'x', 'y'"),
        (DataLoader(TensorDataset(x, y, y), batch_size=8), "is a list of 3"),
        (DataLoader(_Stream(x, y), batch_size=8), "Pass num_data=N"),
        (DataLoader(TensorDataset(x[:0], y[:0]), batch_size=8), "train_loader is empty"),
    ]
    for loader, fragment in cases:
        with pytest.raises((ValueError, TypeError)) as info:
            _fit(loader)
        assert fragment in str(info.value), str(info.value)
    with pytest.raises(ValueError, match=r"targets of dtype torch\.int64, expected real values"):
        _fit(DataLoader(TensorDataset(x, y), batch_size=8), likelihood="gaussian", out=1)
    with pytest.raises(ValueError, match=r"expected labels y of shape \(8,\) to match the 8"):
        _fit([(x[:8], y[:7])], num_data=20)


def test_fit_scales_by_the_dataset_size_with_drop_last_batch_size_1_and_generators():
    x, y = toy_data(20)
    assert _fit(DataLoader(TensorDataset(x, y), batch_size=8, drop_last=True)).num_data == 20
    assert _fit(DataLoader(TensorDataset(x, y), batch_size=1)).num_data == 20
    batches = ((x[i : i + 8], y[i : i + 8]) for i in range(0, 20, 8))
    assert _fit(batches, num_data=20).num_data == 20
    assert _fit(ArrayLoader(x, y, batch_size=1, seed=0)).num_data == 20
