"""Inputs the refusals of a guide in the model's place, of integer inputs and of uncollated
or already-scaled data must let through or word for the case at hand: a Pyro model of one's
own (a PyroModule) taking integer group indices in the diagnostics, a guide saved alone, a
Pyro messenger guide swapped with the model in predict(), numpy labels of uncollated
examples, a TensorLoader of flattened images, and one grey image of H != W in normalize()."""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from pyro import poutine
from pyro.infer.autoguide import AutoNormal, AutoNormalMessenger
from pyro.nn import PyroModule

import pyrouq
from pyrouq.data import MNIST_MEAN, MNIST_STD, TensorLoader, normalize

N = 30


@pytest.fixture(autouse=True)
def _fresh_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _group_body(x, y=None):
    """One mean per group, x the group index of each point (int64)."""
    a = pyro.sample("a", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", N, subsample=torch.arange(len(x))):
        return pyro.sample("obs", dist.Normal(a[..., x], 1.0), obs=y)


class Groups(PyroModule):
    def forward(self, x, y=None):
        return _group_body(x, y)


def _groups():
    x = torch.arange(N) % 3
    return x, x.float() + torch.randn(N, generator=torch.Generator().manual_seed(0))


def test_diagnostics_take_integer_group_indices_of_a_pyro_module_of_ones_own():
    # refused as "to_inference_data() expects floating-point inputs ... normalize(images)",
    # though the same body written as a function was let through, and the module ran before
    x, y = _groups()
    model = Groups()
    guide = AutoNormal(model)
    guide(x, y)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=5)
    a = torch.as_tensor(idata.posterior["a"].values[0])  # (S, 3)
    by_hand = dist.Normal(a[:, x], 1.0).log_prob(y)  # (S, N)
    got = torch.as_tensor(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, by_hand.to(got.dtype), rtol=1e-5, atol=1e-5)
    # psis: the k-hat of the same body as a function, same guide values, same seed
    pyro.set_rng_seed(0)
    ours = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=40)
    pyro.set_rng_seed(0)
    as_function = pyrouq.psis_diagnostic(_group_body, guide, x, y, num_samples=40)
    torch.testing.assert_close(ours.log_weights, as_function.log_weights)
    assert ours.k_hat == as_function.k_hat


def test_a_guide_saved_alone_still_saves_and_loads_into_its_skeleton(tmp_path):
    # save(path, guide) was refused as "the model and its guide swapped?"
    x, y = toy_data(20)
    model = tiny_mlp(num_data=20)
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 10), epochs=1, progress=False, seed=0)
    path = pyrouq.save(tmp_path / "guide.pt", guide)
    loaded = pyrouq.load(path, module=pyrouq.mean_field_guide(tiny_mlp(num_data=20))).model
    assert isinstance(loaded, pyrouq.MeanFieldGuide)
    for name, value in guide.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_predict_of_a_messenger_guide_swapped_with_the_model_names_predicts_order():
    # it said "Pass them in order: the model first, then its guide"
    x, _ = toy_data(6)
    model = tiny_mlp(num_data=6)
    guide = AutoNormalMessenger(poutine.block(model, hide=["obs"]))
    with pytest.raises(TypeError) as info:
        pyrouq.predict(guide, x, model, 2, progress=False)
    assert str(info.value) == (
        "predict() expected the model first, got a guide (AutoNormalMessenger) in its place "
        "(the model and its guide swapped?). Pass them in order: predict(model, x, guide)."
    )


class _NumpyLabels(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y.numpy()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]  # a numpy int64 label, as from a numpy array of labels


@pytest.mark.parametrize("batch_size", [1, 2])
def test_uncollated_examples_of_numpy_labels_are_told_so(batch_size):
    # told "a list of 1. The inputs alone?" or "(tuple, tuple). Convert them with
    # torch.as_tensor(...)", as int and tensor labels no longer are
    x, y = toy_data(8)
    model = tiny_mlp()
    data = _NumpyLabels(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, collate_fn=lambda b: b)
    with pytest.raises(TypeError) as info:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=1, progress=False)
    examples = "2 (x, y) examples" if batch_size == 2 else "1 (x, y) example"
    assert str(info.value).startswith(
        f"train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is a list of "
        f"{examples} (a tensor of shape (3,) and an int64): the examples of a batch as they "
        "came, uncollated"
    )
    # the default collate_fn it names serves them
    fixed = torch.utils.data.DataLoader(data, batch_size=batch_size)
    xb, yb = next(iter(fixed))
    assert torch.equal(xb, x[:batch_size]) and torch.equal(yb, y[:batch_size])


def test_tensor_loader_of_flattened_images_names_the_rows_it_would_serve():
    # images (N, H, W) in [0, 1] with flatten=True were told
    # ArrayLoader(images.unsqueeze(1), ...), (B, 1, H, W) for an MLP of H * W inputs
    g = torch.Generator().manual_seed(0)
    images = torch.rand(6, 28, 28, generator=g)
    labels = torch.arange(6) % 10
    with pytest.raises(ValueError) as info:
        TensorLoader(images, labels, 4, shuffle=False, flatten=True, normalize=False, seed=0)
    assert str(info.value).endswith(
        "Pass images * 255, or train on them as they are with "
        "pyrouq.ArrayLoader(images.flatten(1), labels, batch_size)."
    )
    with pytest.raises(ValueError, match=r"ArrayLoader\(images\.flatten\(1\), labels"):
        TensorLoader(images * 4 - 2, labels, 4, shuffle=False, flatten=True, normalize=False,
                     seed=0)  # fmt: skip
    served, _ = next(iter(TensorLoader(images * 255, labels, 4, shuffle=False, flatten=True,
                                       normalize=False, seed=0)))  # fmt: skip
    # the fix serves what the loader serves of images * 255: rows of H * W
    rows, _ = next(iter(pyrouq.ArrayLoader(images.flatten(1), labels, 4, shuffle=False)))
    assert rows.shape == served.shape == (4, 784)
    torch.testing.assert_close(rows, images.flatten(1)[:4])
    torch.testing.assert_close(served, rows, rtol=0, atol=1e-6)
    # without flatten=True, the images gain their channel dim, as before
    with pytest.raises(ValueError, match=r"ArrayLoader\(images\.unsqueeze\(1\), labels"):
        TensorLoader(images, labels, 4, shuffle=False, flatten=False, normalize=False, seed=0)


def test_normalize_of_one_image_of_h_not_w_still_names_unsqueeze():
    # (28, 30) was told "reshape flattened images to (N, H, W) first" alone (it said
    # unsqueeze(0) before, as for (28, 28))
    image = torch.arange(28 * 30).reshape(28, 30).remainder(256).to(torch.uint8)
    with pytest.raises(ValueError) as info:
        normalize(image)
    assert str(info.value) == (
        "Expected images of shape (N, H, W) with N >= 1, got shape (28, 30); reshape flattened "
        "images to (N, H, W) first, images.reshape(-1, H, W); for one image, "
        "images.unsqueeze(0)."
    )
    got = normalize(image.unsqueeze(0))
    by_hand = ((image.double() / 255 - MNIST_MEAN) / MNIST_STD).float()
    assert got.shape == (1, 1, 28, 30)
    torch.testing.assert_close(got[0, 0], by_hand, rtol=0, atol=1e-6)
    assert np.isclose(float(got[0, 0, 0, 0]), (0 - MNIST_MEAN) / MNIST_STD, atol=1e-6)
