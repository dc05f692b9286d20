"""What a PyTorch user passes: DataLoaders with a collate_fn or a subset sampler, label
columns, loaders whose labels cannot be targets, and one-draw predictions scored for OOD."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
)

import pyrouq


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


def test_fit_checks_what_the_collate_fn_yields_not_the_raw_dataset():
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (64, 16), dtype=torch.uint8, generator=g)  # uint8, flat
    labels = torch.randint(1, 4, (64,), generator=g)  # 1..3: the collate_fn makes them 0..2

    def collate(items):
        x = torch.stack([item[0] for item in items]).float().div(255).view(-1, 1, 4, 4)
        return x, torch.stack([item[1] for item in items]) - 1

    loader = DataLoader(TensorDataset(raw, labels), batch_size=16, collate_fn=collate)
    bayesian = pyrouq.bayesian(net())
    for model, guide in ((net(), None), (bayesian, pyrouq.mean_field_guide(bayesian))):
        result = pyrouq.fit(model, guide, loader, epochs=1, progress=False)
        assert result.num_data == 64 and result.history[-1].train_acc > 0


def test_a_subset_sampler_sets_n_and_only_its_rows_are_checked():
    x, y = torch.randn(64, 16), torch.randint(0, 3, (64,))
    x[60] = float("nan")  # outside the subset the sampler draws from
    y[50:] = -1  # unlabelled rows, outside it too
    sampler = SubsetRandomSampler(range(16), generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=sampler)
    result = pyrouq.fit(net(), None, loader, epochs=1, progress=False)
    assert result.num_data == 16  # the subset's size, not the dataset's 64
    batches = BatchSampler(SubsetRandomSampler(range(16)), 8, drop_last=False)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=batches)  # the subset given so
    assert pyrouq.fit(net(), None, loader, epochs=1, progress=False).num_data == 16
    # drop_last without shuffling never serves the last 4 rows: they are not checked either
    tail = DataLoader(TensorDataset(x[:52], y[:52].clamp(min=0)), batch_size=16, drop_last=True)
    x[48:52] = float("nan")
    assert pyrouq.fit(net(), None, tail, epochs=1, progress=False).num_data == 52


@pytest.mark.parametrize("order", ["in order", "batch sampler", "shuffled"])
def test_nan_inputs_of_a_dataloader_in_order_name_the_batch_as_a_pyrouq_loaders_do(order):
    """The refusal named the first bad example's batch only for a loader with a ``shuffle``
    attribute false (pyrouq's); a DataLoader has none (its order is its sampler's), and its
    refusal never did."""
    x, y = torch.randn(12, 16), torch.randint(0, 3, (12,))
    x[9, 3] = float("nan")  # example 9: batch 3 of 4 examples
    data = TensorDataset(x, y)
    loader = (
        DataLoader(data, batch_size=4) if order == "in order"
        else DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, False))
        if order == "batch sampler" else DataLoader(data, batch_size=4, shuffle=True)
    )  # fmt: skip
    where = "" if order == "shuffled" else " (the first in batch 3 of every epoch)"
    model = pyrouq.bayesian(net())
    with pytest.raises(ValueError) as info:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=1, progress=False)
    assert str(info.value) == (
        f"train_loader holds NaN or inf in 1 of 12 examples, e.g. example indices [9]{where}; "
        "nothing was trained. Remove or repair them (torch.nan_to_num, or drop the rows) before "
        "fit()."
    )


def test_a_plain_network_gets_the_label_and_output_checks_of_the_others():
    x, y = torch.randn(32, 16), torch.randint(0, 3, (32, 1))
    with pytest.raises(ValueError, match=r"fit\(\): expected labels y of shape \(32,\) to match"):
        pyrouq.fit(net(), None, [(x, y)], num_data=32, epochs=1, progress=False)
    per_row = nn.Sequential(nn.Linear(16, 3), nn.Unflatten(1, (1, 3)))  # (B, 1, 3) outputs
    with pytest.raises(ValueError, match=r"returned outputs of shape \(32, 1, 3\) for 32 inputs"):
        pyrouq.fit(per_row, None, [(x, y[:, 0])], num_data=32, epochs=1, progress=False)


def test_labels_that_cannot_be_targets_leave_the_predictions_without_them():
    x = torch.randn(40, 16)
    model = net()
    expected = model(x).softmax(-1)
    for labels in (torch.randint(0, 3, (40, 1)), torch.rand(40)):
        loader = DataLoader(TensorDataset(x, labels), batch_size=16)
        with pytest.warns(UserWarning, match=r"the labels x yields cannot be the predictions'"):
            preds = pyrouq.predict(model, loader, progress=False)
        assert preds.targets is None
        torch.testing.assert_close(preds.probs[0], expected)
    broken = nn.Sequential(net(), nn.Hardtanh(float("nan"), float("nan")))  # NaN outputs
    loader = DataLoader(TensorDataset(x, torch.randint(0, 3, (40,))), batch_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the outputs' own error, no word about the labels
        with pytest.raises(ValueError, match=r"Expected finite probs"):
            pyrouq.predict(broken, loader, progress=False)


def test_one_draw_is_scored_for_ood_by_its_entropy():
    probs = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]])
    ood = torch.tensor([[[0.5, 0.5], [0.55, 0.45]]])
    preds = pyrouq.Predictions(probs, torch.tensor([0, 1, 0]))
    by_default = preds.evaluate(ood=ood)
    assert by_default == preds.evaluate(ood=ood, ood_score="entropy")
    assert by_default["ood_auroc"] == 1.0  # the OOD inputs are the least confident
    for score in ("mutual_information", "variance"):
        with pytest.raises(ValueError, match=rf"ood_score='{score}' of one draw \(S = 1\) is 0"):
            preds.evaluate(ood=ood, ood_score=score)


def test_a_sampler_of_ones_own_with_batch_size_none_is_not_read_and_asks_for_num_data():
    """Behind a sampler of one's own, items may be whole batches (single indices) or
    examples (lists of indices): reading its first index to tell used up a one-shot sampler
    (training got 1 batch of 4) and moved samplers with state; N is asked for instead."""

    class Chunks(torch.utils.data.Sampler):
        passes = 0

        def __iter__(self):
            Chunks.passes += 1
            for start in range(0, 20, 5):
                yield list(range(start, start + 5))

        def __len__(self):
            return 4

    x = torch.randn(20, 3)
    dataset = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    loader = torch.utils.data.DataLoader(dataset, sampler=Chunks(), batch_size=None)
    model = pyrouq.bayesian(torch.nn.Linear(3, 2))
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(ValueError) as caught:
        pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    assert (
        "its sampler of its own (Chunks) is not read to tell whether it fetches whole items "
        "(pre-made batches) or lists of examples, so the size of its dataset (20 items) may "
        "not count the training examples. Pass num_data=N" in str(caught.value)
    )
    assert Chunks.passes == 0
    result = pyrouq.fit(model, guide, loader, epochs=2, num_data=20, progress=False)
    assert result.num_data == 20


def test_pre_made_batches_behind_any_sampler_of_single_indices_ask_for_num_data():
    """A sampler of one's own yielding single indices, or a RandomSampler's subclass, serves
    the dataset's items, here batches: N is not len(dataset) (it trained with N = 4 batches,
    or stacked two batches as a pair of examples)."""

    class Ints(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(range(4))

        def __len__(self):
            return 4

    class Seedable(torch.utils.data.RandomSampler):
        pass

    batches = [(torch.randn(8, 3), torch.randint(0, 2, (8,))) for _ in range(4)]
    net = torch.nn.Linear(3, 2)
    state = torch.get_rng_state()
    for sampler in (Ints(), Seedable(batches)):
        loader = torch.utils.data.DataLoader(batches, sampler=sampler, batch_size=None)
        with pytest.raises(ValueError, match=r"batch_size=None .* Pass num_data=N"):
            pyrouq.fit(net, None, loader, epochs=1, progress=False)
    assert torch.equal(torch.get_rng_state(), state)  # reading a sampler draws nothing


def test_single_unbatched_examples_get_the_networks_shape_error_not_an_index_error():
    """DataLoader(TensorDataset(x, y), batch_size=None) serves one example at a time: fit()'s
    first look sliced its 0-d label (IndexError: slice() cannot be applied to a 0-dim
    tensor)."""
    x, y = torch.randn(24, 16), torch.randint(0, 3, (24,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=None)
    with pytest.raises(ValueError, match=r"returned outputs of shape \(3,\) for 16 inputs; "):
        pyrouq.fit(torch.nn.Linear(16, 3), None, loader, epochs=1, num_data=24, progress=False)
