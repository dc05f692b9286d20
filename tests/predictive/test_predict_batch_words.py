"""predict() of a loader whose batches are its examples as they came (a collate_fn that returns
its items as they are, ``collate_fn=lambda b: b``): (x, y) examples, (x,) examples of a
TensorDataset of the inputs alone, single tensors of a DataLoader over x, dicts. It was told "a
batch was a list of 4. Make them tensors (torch.as_tensor)" (or, for single tensors, the
network's own shape error on one example); it is now told, in fit()'s words, to leave
collate_fn out. fit() of (x,) examples was told to serve (x, y) "without the other 2 item(s)"
through default_collate(items)[:2]."""

from __future__ import annotations

import pytest
import torch
from _toy import tiny_mlp, toy_data
from torch.utils.data import DataLoader, TensorDataset

import pyrouq

_CAME = (
    "the examples of a batch as they came, uncollated (a collate_fn that returns its items as "
    "they are, as collate_fn=lambda b: b), not one stacked batch. Leave collate_fn out: the "
    "DataLoader's default one stacks the examples into {into}; or return "
    "torch.utils.data.default_collate(items) from yours."
)
_EXPECTS = "predict() expects {what} as a tensor or an iterable of tensors / (x, y) batches; "


def _as_they_came(items):
    return items


def _fitted():
    x, y = toy_data(12)
    model = tiny_mlp()
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=12, progress=False, seed=0)
    return model, guide, x, y


@pytest.mark.parametrize(
    ("dataset", "held", "into"),
    [
        ("pairs", "4 (x, y) examples (a tensor of shape (3,) and a tensor of shape ())", "(x, y)"),
        ("inputs", "4 (x,) examples (a tensor of shape (3,))", "one batch of inputs"),
        ("tensor", "4 tensors of shape (3,)", "one batch of inputs"),
    ],
)
def test_uncollated_examples_are_told_to_leave_collate_fn_out(dataset, held, into):
    model, guide, x, y = _fitted()
    data = {"pairs": TensorDataset(x, y), "inputs": TensorDataset(x), "tensor": x}[dataset]
    loader = DataLoader(data, batch_size=4, collate_fn=_as_they_came)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, loader, guide, num_samples=2, progress=False)
    assert str(info.value) == (
        _EXPECTS.format(what="x") + f"a batch was a list of {held}: " + _CAME.format(into=into)
    )
    # the fix it names: the default collate_fn; the predictions are those of x itself
    fixed = DataLoader(data, batch_size=4, generator=torch.Generator())  # (no seed drawn)
    got = pyrouq.predict(model, fixed, guide, num_samples=2, progress=False, seed=1)
    expected = pyrouq.predict(model, x, guide, num_samples=2, progress=False, seed=1)
    torch.testing.assert_close(got.probs, expected.probs, rtol=0, atol=0)


def test_uncollated_batchnorm_data_is_named_as_such():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    model = pyrouq.bayesian(net, num_data=12)
    guide = pyrouq.mean_field_guide(model)
    x, y = toy_data(12)
    loader = DataLoader(TensorDataset(x, y), batch_size=3, collate_fn=_as_they_came)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, x, guide, num_samples=2, batchnorm_data=loader, progress=False)
    assert str(info.value).startswith(
        _EXPECTS.format(what="batchnorm_data") + "a batch was a list of 3 (x, y) examples "
    )


def test_uncollated_dicts_are_told_to_stack_the_inputs():
    model, guide, x, y = _fitted()
    items = [{"x": x[i], "y": y[i]} for i in range(len(x))]
    loader = DataLoader(items, batch_size=4, collate_fn=_as_they_came)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, loader, guide, num_samples=2, progress=False)
    assert str(info.value) == _EXPECTS.format(what="x") + (
        "a batch was a list of 4 dicts with the same keys ('x', 'y'): the examples of a batch "
        "as they came (a collate_fn that returns its items as they are), not one stacked "
        "batch. Serve each batch as a tensor of inputs (or an (x, y) pair of tensors), e.g. a "
        "collate_fn returning torch.stack([item['x'] for item in items]) with your inputs' key."
    )


def _stack_pair(items):
    return [torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])]


@pytest.mark.parametrize("batch_size", [2, 3])
def test_a_collate_fn_of_ones_own_serving_x_and_y_of_one_shape_still_predicts(batch_size):
    # [x, y] as a list of two tensors of one shape (a regression of as many outputs as
    # inputs) is a batch, not two examples: 2 rows each, and a last batch of 1
    model = pyrouq.bayesian(torch.nn.Linear(3, 3), likelihood=pyrouq.Gaussian(0.3), num_data=5)
    guide = pyrouq.mean_field_guide(model)
    x, targets = torch.randn(5, 3), torch.randn(5, 3)
    loader = DataLoader(TensorDataset(x, targets), batch_size=batch_size,
                        collate_fn=_stack_pair, generator=torch.Generator())  # fmt: skip
    got = pyrouq.predict(model, loader, guide, num_samples=2, progress=False, seed=1)
    expected = pyrouq.predict(model, x, guide, num_samples=2, progress=False, seed=1)
    torch.testing.assert_close(got.loc, expected.loc, rtol=0, atol=0)
    torch.testing.assert_close(got.targets, targets, rtol=0, atol=0)


def test_a_list_that_is_not_examples_is_still_told_to_make_tensors():
    model, guide, _, _ = _fitted()
    with pytest.raises(TypeError, match=r"a batch was a list of 3\. Make them tensors"):
        pyrouq.predict(model, [[0.1, 0.2, 0.3]], guide, num_samples=2, progress=False)


def test_fit_of_uncollated_inputs_alone_says_so_and_that_it_needs_targets():
    x, _ = toy_data(12)
    model = tiny_mlp()
    loader = DataLoader(TensorDataset(x), batch_size=4, collate_fn=_as_they_came)
    with pytest.raises(TypeError) as info:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=1, num_data=12,
                   progress=False)  # fmt: skip
    assert str(info.value) == (
        "train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is a list of 4 (x,) "
        "examples (a tensor of shape (3,)): the examples of a batch as they came, uncollated "
        "(a collate_fn that returns its items as they are, as collate_fn=lambda b: b), not one "
        "(x, y) pair. Leave collate_fn out: the DataLoader's default one stacks the examples "
        "into one batch of inputs; or return torch.utils.data.default_collate(items) from "
        "yours. fit() needs the targets too: serve (x, y) examples, e.g. "
        "DataLoader(TensorDataset(x, y), batch_size=64)."
    )


class _SeveralInputs(torch.utils.data.Dataset):
    """(x, label) examples whose x is a dict of two tensors, a pair of them, or one in a tuple:
    the default collate_fn makes ({ids, mask}, y), ([ids, mask], y) and ([ids], y) batches."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 4

    def __getitem__(self, index):
        ids = torch.arange(3) + index
        inputs = {"dict": {"ids": ids, "mask": ids > 2}, "pair": (ids, ids > 2), "one": (ids,)}
        return inputs[self.kind], index % 2


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("dict", "(dict of 2 entries, Tensor), and pyrouq runs the network on one input tensor "
                 "x. Wrap the network in a small nn.Module whose forward takes one tensor and "
                 "builds the dict from it, convert that wrapper, and serve that tensor as x."),
        ("pair", "(list of 2 tensors, Tensor), and pyrouq runs the network on one input tensor "
                 "x. Serve one tensor: compute the other inputs from x in forward (a padding "
                 "mask: x == pad_id), or concatenate them into x and split it there."),
        ("one", "(list of 1 tensor, Tensor): the input tensor inside a list, and pyrouq runs the "
                "network on the tensor itself. Serve it as x, not inside a tuple or list (x[0])."),
    ],
)  # fmt: skip
def test_predict_of_batches_of_several_inputs_says_what_fit_says(kind, words):
    # a loader of a network of several inputs, which fit() refuses in these words, was told
    # "a batch was a list of 2. Make them tensors (torch.as_tensor)", which fails on a dict
    model = pyrouq.bayesian(torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Flatten(),
                                                torch.nn.Linear(12, 2)))  # fmt: skip
    guide = pyrouq.mean_field_guide(model)
    loader = DataLoader(_SeveralInputs(kind), batch_size=2)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, loader, guide, num_samples=2, progress=False)
    assert str(info.value) == _EXPECTS.format(what="x") + f"a batch was {words}"
    with pytest.raises(TypeError) as info:
        pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    assert str(info.value).endswith(f"batch 1 of epoch 1 is {words}")


@pytest.mark.parametrize("layout", ["x_extra_y", "x_y_extra"])
def test_batches_of_three_items_are_refused_in_fits_words(layout):
    # predict() read batch[1] as the labels: of (x, extra, y) it warned that the float extras
    # were no valid targets, of (x, y, weights) it dropped the weights quietly, where fit()
    # refuses both
    model, guide, x, y = _fitted()
    extra = torch.ones(12)
    items = (x, extra, y) if layout == "x_extra_y" else (x, y, extra)
    loader = DataLoader(TensorDataset(*items), batch_size=4)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, loader, guide, num_samples=2, progress=False)
    assert str(info.value) == _EXPECTS.format(what="x") + (
        "batch 1 of x is a list of 3. Serve (x, y) without the other 1 item(s): "
        "DataLoader(..., collate_fn=first_two) with a function of your module, def "
        "first_two(items): return torch.utils.data.default_collate(items)[:2] where x and y "
        "come first (pick their places otherwise; worker processes need it by name)."
    )
    with pytest.raises(TypeError, match=r"batch 1 of epoch 1 is a list of 3\. Serve \(x, y\) "):
        pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    # the fix it names (its places picked for (x, extra, y)), for fit() and predict() alike:
    # the predictions those of x with y as their targets
    first_two = _first_two if layout == "x_y_extra" else _first_and_last
    picked = DataLoader(
        TensorDataset(*items), batch_size=4, collate_fn=first_two, generator=torch.Generator()
    )
    got = pyrouq.predict(model, picked, guide, num_samples=2, progress=False, seed=1)
    expected = pyrouq.predict(model, x, guide, num_samples=2, progress=False, seed=1)
    torch.testing.assert_close(got.probs, expected.probs, rtol=0, atol=0)
    assert torch.equal(got.targets, y)
    assert len(pyrouq.fit(model, guide, picked, epochs=1, progress=False).history) == 1


def _first_two(items):
    return torch.utils.data.default_collate(items)[:2]


def _first_and_last(items):
    x, _, y = torch.utils.data.default_collate(items)
    return x, y
