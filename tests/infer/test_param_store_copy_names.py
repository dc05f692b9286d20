"""Review 11d: the names of copies in Pyro's param store, and the clean-up of a name two live
objects share.

A ``copy.deepcopy`` of a model or guide is named ``<name>_copy<k>`` with a counter of its own:
it used to take the next number of the counter that names built models and guides, so every
one built after a copy was named otherwise than in a run without it, and a param store saved
in one run gave, loaded in the other, a model another model's values (same shapes: no error).
A model or guide unpickled beside its live original is named apart too (review 11g; it kept
the original's name, and the store held one of the two); the original's clean-up, when it
was garbage collected, used to delete the store entries a live copy used, which a shallow
``copy.copy`` shares (and a guide that had run could not be pickled at all)."""

from __future__ import annotations

import copy
import gc
import pickle
import re
import subprocess
import sys
import textwrap

import pyro
import pytest
import torch
from _toy import ListLoader, toy_data
from torch import nn

import pyrouq

N = 40


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))


def _build(kind):
    """A model with point estimates in its network, and its guide (None: a BatchEnsemble)."""
    if kind == "batchensemble":
        model = pyrouq.batchensemble(_net(), 2)
        model.num_data = N
        return model, None
    model = pyrouq.bayesian(_net(), select="last_layer", num_data=N)
    return model, pyrouq.mean_field_guide(model, init_scale=0.05)


def _number(name):
    return int(re.fullmatch(r"[A-Za-z]+_(\d+)", name).group(1))


def _entries(*names):
    """The param store's entries under these models' or guides' names, by name."""
    store = pyro.get_param_store()
    return {
        key: store[key]
        for key in store.keys()
        if any(key.startswith((f"{name}.", f"{name}$$$")) for name in names)
    }


def _probs(model, guide, x):
    draws = None if guide is None else 3
    return pyrouq.predict(model, x, guide, num_samples=draws, seed=0, progress=False).probs


# --------------------------------------------------------------------------------------------
# A copy does not shift the names of the models and guides built after it
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_a_copy_leaves_the_names_of_those_built_after_it_as_without_it(kind):
    """a, copy.deepcopy(a), b: b is the next number after a (it used to be one more, the
    copy's), and so is b's guide; the copies are <name>_copy<k>. Each one's clean-up leaves
    the other's entries alone (no name is a prefix of another's with its separator)."""
    x, y = toy_data(N)
    a, ga = _build(kind)
    best, gbest = copy.deepcopy(a), copy.deepcopy(ga)
    b, gb = _build(kind)
    assert _number(b._pyro_name) == _number(a._pyro_name) + 1
    assert re.fullmatch(rf"{a._pyro_name}_copy\d+", best._pyro_name)
    if ga is not None:
        assert _number(gb.name) == _number(ga.name) + 1
        assert re.fullmatch(rf"{ga.name}_copy\d+", gbest.name)

    for model, guide in ((a, ga), (best, gbest)):
        pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, seed=0, progress=False)
    names = [a._pyro_name, best._pyro_name] + ([] if ga is None else [ga.name, gbest.name])
    held = {name: _entries(name) for name in names}
    assert all(held.values())
    own = {id(p) for m in (best, gbest) if m is not None for p in m.parameters()}
    expected = _probs(a, ga, x)  # the copy was fitted as the original, from the same values
    del a, ga
    gc.collect()
    kept = {**_entries(best._pyro_name), **(_entries(gbest.name) if gbest else {})}
    assert kept.keys() == {k for n in names[1::2] for k in held[n]}
    assert {id(t) for t in kept.values()} <= own
    torch.testing.assert_close(_probs(best, gbest, x), expected)


_RUN = textwrap.dedent(
    """
    import copy, sys
    import pyro, torch
    from torch import nn
    import pyrouq

    saving, path = sys.argv[1] == "save", sys.argv[2]
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)

    def build(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
        model = pyrouq.bayesian(net, select="last_layer", num_data=32)
        return model, pyrouq.mean_field_guide(model)

    a, ga = build(0)
    if saving:  # the run that keeps a snapshot of a: a copy
        pyrouq.fit(a, ga, data, epochs=2, seed=0, progress=False)
        best, gbest = copy.deepcopy(a), copy.deepcopy(ga)
    b, gb = build(1)
    if saving:
        pyrouq.fit(b, gb, data, epochs=20, lr=0.1, seed=1, progress=False)
        pyro.get_param_store().save(path + ".store")
    else:  # a new process: the models and guides built in the same order, no copy
        pyro.get_param_store().load(path + ".store")
    probs = pyrouq.predict(b, x, gb, num_samples=4, seed=0, progress=False).probs
    torch.save(probs, path + (".saved" if saving else ".loaded"))
    """
)


def test_a_store_saved_in_a_run_that_copied_loads_into_a_run_that_did_not(tmp_path):
    """README: in a new process, build the models and guides in the same order and load the
    store. The saving run also deep-copied its first model and guide (a snapshot); the
    loading run, which did not, gives its second model the values the saving run's had (it
    used to give it the snapshot's: its name was the copy's there)."""
    script, path = tmp_path / "run.py", str(tmp_path / "b")
    script.write_text(_RUN)
    for step in ("save", "load"):
        done = subprocess.run(
            [sys.executable, str(script), step, path], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stderr[-2000:]
    saved, loaded = torch.load(path + ".saved"), torch.load(path + ".loaded")
    assert not torch.allclose(saved, torch.full_like(saved, 0.5), atol=0.05)  # (trained)
    torch.testing.assert_close(loaded, saved)


def test_a_store_value_of_another_shape_names_copies_in_its_advice():
    """The refusal of a loaded value whose shape differs says that copies do not count in
    the build order (they are named <name>_copy<k>)."""
    x, y = toy_data(N)
    model, _ = _build("bayesian")
    pyro.get_param_store()[f"{model._pyro_name}.net$$$0.weight"] = torch.zeros(5, 5)
    with pytest.raises(ValueError, match=r"copy\.deepcopy do not count.*<name>_copy<k>"):
        model(x[:2], y[:2])


# --------------------------------------------------------------------------------------------
# Unpickled in the same process: a name of its own (review 11g); a shallow copy shares the
# original's name, whose entries go when the last holder is gone
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_an_unpickled_models_entries_outlive_the_original(kind):
    """pickle.loads(pickle.dumps(m)) beside a live m is named <name>_copy<k>; with m garbage
    collected, the store still holds the copy's point estimates (its own tensors), predict()
    and fit() work on it, and they go when the copy goes too."""
    x, y = toy_data(N)
    model, guide = _build(kind)
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, seed=0, progress=False)
    loaded = pickle.loads(pickle.dumps(model))
    name = loaded._pyro_name
    assert re.fullmatch(rf"{model._pyro_name}_copy\d+", name)
    before = _probs(loaded, guide, x)  # (registers the copy's own tensors)
    torch.testing.assert_close(before, _probs(model, guide, x))
    held = _entries(name)
    assert held and {id(t) for t in held.values()} <= {id(p) for p in loaded.parameters()}
    del model
    gc.collect()
    assert _entries(name).keys() == held.keys()
    torch.testing.assert_close(_probs(loaded, guide, x), before)
    pyrouq.fit(loaded, guide, ListLoader(x, y, 20), epochs=1, seed=1, progress=False)
    assert _entries(name).keys() == held.keys()
    del loaded
    gc.collect()
    assert not _entries(name)


def test_an_unpickled_guides_entries_outlive_the_original():
    """A guide that has run pickles (Pyro's param store gave its parameters weak references,
    which pickle refused), is named <name>_copy<k> beside the live original, and its entries
    stay when the original is garbage collected, until the copy goes too."""
    x, y = toy_data(N)
    model, guide = _build("bayesian")
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, seed=0, progress=False)
    loaded = pickle.loads(pickle.dumps(guide))
    name = loaded.name
    assert re.fullmatch(rf"{guide.name}_copy\d+", name)
    before = _probs(model, loaded, x)
    torch.testing.assert_close(before, _probs(model, guide, x))
    held = _entries(name)
    assert held and {id(t) for t in held.values()} <= {id(p) for p in loaded.parameters()}
    del guide
    gc.collect()
    assert _entries(name).keys() == held.keys()
    torch.testing.assert_close(_probs(model, loaded, x), before)
    pyrouq.fit(model, loaded, ListLoader(x, y, 20), epochs=1, seed=1, progress=False)
    del loaded
    gc.collect()
    assert not _entries(name)


def test_a_shallow_copys_shared_entries_go_with_the_last_holder():
    """copy.copy of a model and of a guide shares their tensors and so their names: the
    entries stay while either lives, and go when both are garbage collected."""
    x, y = toy_data(N)
    model, guide = _build("bayesian")
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, seed=0, progress=False)
    shallow, shallow_guide = copy.copy(model), copy.copy(guide)
    names = (model._pyro_name, guide.name)
    assert (shallow._pyro_name, shallow_guide.name) == names
    held = _entries(*names)
    assert held
    del model, guide
    gc.collect()
    assert _entries(*names).keys() == held.keys()
    del shallow, shallow_guide
    gc.collect()
    assert not _entries(*names)
