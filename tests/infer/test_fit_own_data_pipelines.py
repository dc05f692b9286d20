"""fit() fed by a user's own data pipelines: empty batches, loaders whose len() is not the
number of batches they serve, batches of one item or of more than two, and an iterable used
up after one epoch."""

from __future__ import annotations

import warnings

import pytest
import torch
from _processes import exit_quietly, spawn_ranks
from _toy import recording_sgd
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

import pyrouq


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _data(n=24):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _plain():
    return _net(), None


def _bayesian():
    model = pyrouq.bayesian(_net())
    return model, pyrouq.mean_field_guide(model)


def _ensemble():
    return pyrouq.batchensemble(_net(), 2), None


class _Batches:
    """A list of batches behind a ``__len__`` that may tell another number."""

    def __init__(self, batches, length):
        self.batches, self.length = batches, length

    def __len__(self):
        return self.length

    def __iter__(self):
        return iter(self.batches)


def _sgd_learning_rates(loader, **kw):
    """The learning rate of every step of a plain network's fit on ``loader``."""
    seen: list[float] = []
    optim = recording_sgd(seen)
    pyrouq.fit(_net(), None, loader, epochs=2, num_data=24, optim=optim, progress=False, **kw)
    return seen


@pytest.mark.parametrize("make", [_plain, _bayesian, _ensemble], ids=["plain", "bayes", "be"])
def test_an_empty_batch_is_refused_before_a_step_is_taken_on_it(make):
    # an empty batch has no B for the N/B scaling: the plain and Bayesian models took a step on
    # it (the KL's alone, a loss of 0 counted in the epoch's mean), the BatchEnsemble failed
    # in torch's reshape ("cannot reshape tensor of 0 elements")
    x, y = _data()
    model, guide = make()
    first = [(x[:8], y[:8])]
    with pytest.raises(ValueError, match=r"Batch 2 of epoch 1 of train_loader holds no examples"):
        pyrouq.fit(model, guide, [*first, (x[:0], y[:0]), (x[8:], y[8:])], epochs=1,
                   num_data=24, lr_schedule="constant", progress=False)  # fmt: skip
    reference, reference_guide = make()
    pyrouq.fit(reference, reference_guide, first, epochs=1, num_data=24,
               lr_schedule="constant", progress=False)  # fmt: skip
    held = [*model.parameters(), *(guide.parameters() if guide is not None else ())]
    kept = [*reference.parameters(), *(reference_guide.parameters() if guide is not None else ())]
    assert held and len(held) == len(kept)
    for ours, theirs in zip(held, kept, strict=True):
        assert torch.equal(ours, theirs)  # the first batch's step alone was taken
    with pytest.raises(ValueError, match=r"Batch 1 of epoch 1 of train_loader holds no examples"):
        pyrouq.fit(*make(), [(x[:0], y[:0])], epochs=1, num_data=24, progress=False)


def test_a_loader_whose_len_is_not_its_number_of_batches_is_warned_of():
    x, y = _data()
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 24, 8)]  # 3 batches an epoch
    # len() says 1: the schedule, planned over 2 steps, trained the last 4 of 6 at lr 0
    with pytest.warns(UserWarning, match=r"served 3 batches in epoch 1, but len\(train_loader\) "
                      r"was 1: .* = 2 steps, so after step 2 the learning rate is 0.*Make "
                      r"len\(train_loader\) the number of batches"):  # fmt: skip
        rates = _sgd_learning_rates(_Batches(batches, 1))
    assert rates == [0.1, 0.05, 0.0, 0.0, 0.0, 0.0]  # what the warning tells
    with pytest.warns(UserWarning, match=r"served 3 batches in epoch 1, but len\(train_loader\) "
                      r"was 100: .*warm-up or decay is cut short"):  # fmt: skip
        _sgd_learning_rates(_Batches(batches, 100))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a true len(), or no schedule: nothing to warn of
        _sgd_learning_rates(_Batches(batches, 3))
        _sgd_learning_rates(_Batches(batches, 1), lr_schedule="constant")


def _first_two(items):  # the fix the message gives, a function of the module
    return default_collate(items)[:2]


def test_batches_of_one_item_or_of_more_than_two_say_what_to_do():
    x, y = _data()
    weights = torch.ones(24)
    triples = DataLoader(TensorDataset(x, y, weights), batch_size=8)
    with pytest.raises(TypeError, match=r"is a list of 3\. Serve \(x, y\) without the other 1 "
                       r"item\(s\): DataLoader\(\.\.\., collate_fn=first_two\) with a function of "
                       r"your module, def first_two\(items\): return torch\.utils\.data\."
                       r"default_collate\(items\)\[:2\]"):  # fmt: skip
        pyrouq.fit(_net(), None, triples, epochs=1, progress=False)
    pairs = DataLoader(TensorDataset(x, y, weights), batch_size=8, collate_fn=_first_two)
    assert pyrouq.fit(_net(), None, pairs, epochs=1, progress=False).steps == 3
    inputs = DataLoader(TensorDataset(x), batch_size=8)
    with pytest.raises(TypeError, match=r"is a list of 1\. The inputs alone\? fit\(\) needs the "
                       r"targets too"):  # fmt: skip
        pyrouq.fit(_net(), None, inputs, epochs=1, progress=False)
    with pytest.raises(TypeError, match=r"is a Tensor\. The inputs alone\?"):
        pyrouq.fit(_net(), None, [x[:8], x[8:16], x[16:]], epochs=1, num_data=24,
                   progress=False)  # fmt: skip


def test_an_iterable_used_up_after_one_epoch_names_the_epoch_left_without_batches():
    x, y = _data()

    class Once:  # iterable, not an iterator: fit() cannot tell it is used up before epoch 2
        def __init__(self):
            self.batches = iter([(x[:12], y[:12]), (x[12:], y[12:])])

        def __iter__(self):
            return self.batches

    with pytest.raises(ValueError, match=r"train_loader yielded no batches \(.*\) in epoch 2\. "):
        pyrouq.fit(_net(), None, Once(), epochs=2, num_data=24, lr_schedule="constant",
                   progress=False)  # fmt: skip


@pytest.mark.parametrize("make", [_plain, _bayesian, _ensemble], ids=["plain", "bayes", "be"])
def test_features_computed_with_autograd_on_train_as_the_same_values_detached(make):
    # features of a network outside the model, computed without torch.no_grad(): the second
    # batch's backward went through the graph the first step had freed (torch: "Trying to
    # backward through the graph a second time ... Specify retain_graph=True")
    x, y = _data()
    extractor = nn.Linear(4, 4)
    features = extractor(x)
    soft = nn.Linear(4, 1)(x)[:, 0]  # regression targets computed so too
    batches = [(features[:12], y[:12]), (features[12:], y[12:])]
    detached = [(a.detach(), b) for a, b in batches]
    model, guide = make()
    ours = pyrouq.fit(model, guide, batches, epochs=2, num_data=24, progress=False, seed=0)
    reference = pyrouq.fit(*make(), detached, epochs=2, num_data=24, progress=False, seed=0)
    assert ours.losses == reference.losses
    assert extractor.weight.grad is None  # nothing flowed into the graph behind the features
    torch.manual_seed(0)
    regression = pyrouq.bayesian(nn.Linear(4, 1), likelihood="gaussian")
    targets = [(x[:12], soft[:12]), (x[12:], soft[12:])]
    result = pyrouq.fit(regression, pyrouq.mean_field_guide(regression), targets, epochs=2,
                        num_data=24, progress=False)  # fmt: skip
    assert result.steps == 4


class _NoLength(torch.utils.data.Sampler):
    """A sampler that cannot tell its length (torch's Sampler.__len__ raises
    NotImplementedError by default in some versions; a stream of indices does)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        raise NotImplementedError


def test_a_sampler_of_no_length_trains_as_a_loader_of_no_length():
    # fit() caught only TypeError from len(train_loader): the NotImplementedError crashed it
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    loader = DataLoader(TensorDataset(x, y), batch_size=5, sampler=_NoLength(20))
    model = pyrouq.bayesian(nn.Linear(4, 3))
    with pytest.warns(UserWarning, match=r"has no length: the learning rate stays constant"):
        result = pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=2, num_data=20,
                            progress=False)  # fmt: skip
    assert result.steps == 8


def test_a_dataloader_over_the_inputs_alone_is_told_to_serve_the_targets():
    # its rows were read as (x, y) items: "failed on the first examples (x of shape (2,))"
    x = torch.randn(20, 4)
    model = pyrouq.bayesian(nn.Linear(4, 3))
    with pytest.raises(TypeError, match=r"batch 1 of epoch 1 is a Tensor\. The inputs alone\? "
                       r"fit\(\) needs the targets too"):  # fmt: skip
        pyrouq.fit(model, pyrouq.mean_field_guide(model), DataLoader(x, batch_size=8),
                   epochs=1, num_data=20, progress=False)  # fmt: skip


class _Bucketing(torch.utils.data.Sampler):
    """A batch sampler of no length (dynamic batching): its __len__ raises."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        indices = list(self.sampler)
        return iter([indices[:3], indices[3:]])

    def __len__(self):
        raise NotImplementedError


def _no_length_rank(rank, init, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
        dataset = TensorDataset(x, y)
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)
        loader = DataLoader(dataset, batch_sampler=_Bucketing(sampler))
        model = pyrouq.bayesian(nn.Linear(4, 3))
        result = pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=1,
                            num_data=16, lr_schedule="constant", progress=False)  # fmt: skip
        torch.save(result.steps, f"{out}/steps{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_ranks_train_on_a_batch_sampler_of_no_length(tmp_path):
    # the ranks' step check caught only TypeError from len(train_loader): both crashed
    spawn_ranks(_no_length_rank, (str(tmp_path / "init"), str(tmp_path)))
    assert [torch.load(tmp_path / f"steps{r}.pt") for r in range(2)] == [2, 2]


class _InterruptedAt:
    """``loader``'s batches, with Ctrl-C pressed once, while fetching a pass's batch ``k``."""

    def __init__(self, loader, k):
        self.loader, self.k, self.pressed = loader, k, False

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for i, batch in enumerate(self.loader, start=1):
            if i == self.k and not self.pressed:
                self.pressed = True
                raise KeyboardInterrupt
            yield batch


def test_a_resumed_epoch_is_not_told_it_served_a_wrong_number_of_batches(tmp_path):
    # the resumed epoch counted its skipped steps as served: "served 5 batches in epoch 1,
    # but len(train_loader) was 3" beside the resume's own warning of the other loader
    x, y = _data()
    checkpoint = tmp_path / "run.pt"
    interrupted = _InterruptedAt(pyrouq.ArrayLoader(x, y, 4, seed=0), 6)  # 6 batches an epoch
    with pytest.raises(pyrouq.TrainingInterrupted):
        pyrouq.fit(_net(), None, interrupted, epochs=2, checkpoint=checkpoint, num_data=24,
                   progress=False)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyrouq.fit(_net(), None, pyrouq.ArrayLoader(x, y, 8, seed=0), epochs=2,
                   resume_from=checkpoint, progress=False)  # fmt: skip
    assert not [w for w in caught if "served" in str(w.message)]


def test_batches_that_require_grad_are_detached_whole_or_sliced():
    x, y = _data()
    leaf = x.clone().requires_grad_()
    pyrouq.fit(_net(), None, [(leaf, y)], epochs=1, num_data=24, progress=False)
    assert leaf.grad is None  # no gradient into the data (a whole leaf batch got one)


class _Lies(torch.utils.data.Sampler):
    """A sampler that yields all ``n`` indices but says it holds ``length``."""

    def __init__(self, n, length):
        self.n, self.length = n, length

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.length


def test_the_length_warning_tells_a_dataloaders_sampler():
    # a map-style DataLoader was told "len() is ceil(len(dataset) / batch_size)" (3, where its
    # len was the sampler's 2)
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=_Lies(24, 10))  # len 2
    told = r"served 3 batches .* was 2: .* A DataLoader's len\(\) is its \(batch\) sampler's: "
    with pytest.warns(UserWarning, match=told + r"make the sampler's __len__ the number"):
        _sgd_learning_rates(loader)


@pytest.mark.filterwarnings("ignore:fit\\(resume_from=\\.\\.\\.\\) trains a finished run")
def test_a_checkpoint_keeps_the_length_the_schedule_was_planned_over(tmp_path):
    # it stored len() read again at saving: a loader grown in between resumed on another plan
    x, y = _data()
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 24, 8)]
    grows = _Batches(list(batches), 3)

    def grow(record):
        grows.batches[3:] = [batches[0]]  # an epoch of 4 batches from now on
        grows.length = 4

    checkpoint = tmp_path / "run.pt"
    with pytest.warns(
        UserWarning, match=r"served 4 batches in epoch 2, but len\(train_loader\) was 3"
    ):
        pyrouq.fit(_net(), None, grows, epochs=2, num_data=24, callbacks=[grow],
                   checkpoint=checkpoint, progress=False)  # fmt: skip
    with pytest.warns(UserWarning, match=r"continues a run of 3 batches an epoch with a "):
        pyrouq.fit(_net(), None, grows, epochs=3, num_data=24, resume_from=checkpoint,
                   progress=False)  # fmt: skip
