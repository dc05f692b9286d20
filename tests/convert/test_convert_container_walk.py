"""The conversion's look into the plain containers a network holds (lists, tuples, sets,
dicts, nested), for layers torch does not register and for latent parameters held outside
torch's registry: one walk, in order, reading at most 10,000 items of each attribute's
containers, so a long list (a vocabulary, a table of numbers) is not read through at every
conversion; the copy of a converted model still detaches a cached tensor anywhere in one."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from pyrouq import bayesian

LOOKED_AT = 10_000  # items of one attribute's containers the conversion's checks read


class _Counted(list):
    """A list that counts the items read from it."""

    read = 0

    def __iter__(self):
        for item in super().__iter__():
            _Counted.read += 1
            yield item


class _Vocabulary(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.vocab = _Counted(range(size))  # a long list of plain numbers: nothing to warn of
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def test_a_long_list_is_read_through_by_the_copy_alone():
    size = 100_000
    net = _Vocabulary(size)
    _Counted.read = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = bayesian(net)
    assert list(model.latent_sites()) == ["fc.weight", "fc.bias"]
    # the copy of the network reads it through once; each check (a layer held in a plain
    # container, a latent parameter held there), 10,000 items at most (it was read through
    # twice: the check for latent parameters had no bound)
    assert size < _Counted.read <= size + 2 * LOOKED_AT


class _Holder(nn.Module):
    """A network that also keeps its layer's weight in an attribute of its own, ``kept``."""

    def __init__(self, kept_at: int):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.kept = {"table": list(range(kept_at)), "pair": (None, [self.fc.weight])}

    def forward(self, x):
        return self.fc(x)


def test_a_latent_parameter_held_in_a_nested_container_is_refused_as_before():
    with pytest.raises(ValueError) as caught:
        bayesian(_Holder(kept_at=100))
    assert str(caught.value) == (
        "'fc.weight' of _Holder is also held in 'kept' (a dict), outside the module's "
        "registered parameters. pyrouq runs the network with each draw in place of the "
        "registered parameter, so a forward reading it there would use its initial value, "
        "never a draw. Read it through its module in forward (self.fc.weight), or leave it "
        "out of select=."
    )


def test_a_latent_parameter_held_past_the_first_10000_items_is_not_looked_for():
    # in order: the dict, its table, the table's numbers, the pair, None, the list, the weight:
    # 10,000 items with 9,994 numbers (found), 10,001 with 9,995 (past the bound)
    with pytest.raises(ValueError, match=r"^'fc.weight' of _Holder is also held in 'kept'"):
        bayesian(_Holder(kept_at=LOOKED_AT - 6))
    model = bayesian(_Holder(kept_at=LOOKED_AT - 5))
    assert list(model.latent_sites()) == ["fc.weight", "fc.bias"]


def test_a_layer_held_in_a_plain_container_is_warned_of_within_the_first_10000_items():
    class Hidden(nn.Module):
        def __init__(self, size: int):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.stash = [list(range(size)), [nn.Linear(2, 2)]]  # torch does not register it

        def forward(self, x):
            return self.fc(x)

    # in order: the stash, the list of numbers, its numbers, the list, the layer: 10,000 items
    # with 9,996 numbers (warned of), 10,001 with 9,997 (past the bound; a flat list's edge, for
    # every converter: tests/docs/test_docs_refusal_lists.py)
    with pytest.warns(UserWarning, match=r"Hidden holds layers or parameters in plain Python"):
        bayesian(Hidden(LOOKED_AT - 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bayesian(Hidden(LOOKED_AT - 3))


def test_a_deep_copy_of_a_converted_model_detaches_a_cached_tensor_past_the_bound():
    model = bayesian(nn.Sequential(nn.Linear(4, 2)))
    computed = torch.ones(3, requires_grad=True) * 2  # a value a forward cached (non-leaf)
    model.net.cache = [*range(2 * LOOKED_AT), computed]
    copied = copy.deepcopy(model)
    kept = copied.net.cache[-1]
    assert kept.grad_fn is None and not kept.requires_grad
    assert torch.equal(kept, torch.full((3,), 2.0))
    assert computed.grad_fn is not None  # the model's own cache as it was
