"""Audit of checkpoints (writing, views, folder paths, MCMC metadata, resume refusals)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

from pyrouq import (
    MLP,
    ArrayLoader,
    BatchEnsembleMLP,
    BayesianMLP,
    CheckpointError,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    save,
)
from pyrouq.mcmc import MCMCResult


def _mlp():
    torch.manual_seed(0)
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    return model, mean_field_guide(model)


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(20, 4, generator=g), torch.randint(0, 3, (20,), generator=g)


def test_save_flushes_the_new_file_to_the_disk_before_renaming_it(tmp_path, monkeypatch):
    # renamed unflushed, a power cut could leave the checkpoint's name on an empty file (the
    # previous checkpoint lost): the data must reach the disk before the rename
    events = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        return fsync(fd)

    def recording_replace(src, dst):
        events.append(("replace", os.stat(src).st_ino, os.fspath(dst)))
        return replace(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    model, guide = _mlp()
    path = tmp_path / "run.pt"
    save(path, model, guide)
    renames = [e for e in events if e[0] == "replace" and e[2] == os.fspath(path)]
    assert len(renames) == 1
    inode = renames[0][1]
    assert ("fsync", inode) in events
    assert events.index(("fsync", inode)) < events.index(renames[0])
    assert torch.equal(load(path).guide.site_loc("fc1.weight"), guide.site_loc("fc1.weight"))


def test_save_on_a_file_system_that_cannot_flush_still_saves(tmp_path, monkeypatch):
    # some FUSE mounts answer fsync with EINVAL: saving there worked before the flush came
    import errno

    def refusing_fsync(fd):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refusing_fsync)
    model, guide = _mlp()
    path = save(tmp_path / "run.pt", model, guide)
    assert torch.equal(load(path).guide.site_loc("fc1.weight"), guide.site_loc("fc1.weight"))
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(OSError, match="I/O"):  # a real write error is not swallowed
        save(tmp_path / "other.pt", model, guide)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]  # no temporary file left


def test_a_path_ending_in_a_separator_is_a_folder_not_a_file_to_write(tmp_path):
    # save("runs/") wrote a file named "runs", which the next save("runs/ckpt.pt") then
    # found in its way; torch.save refuses such a path
    model, guide = _mlp()
    folder = os.path.join(str(tmp_path), "runs") + os.sep
    expected = repr(os.path.join(str(tmp_path), "runs", "checkpoint.pt"))
    with pytest.raises(CheckpointError) as info:
        save(folder, model, guide)
    assert str(info.value) == (
        f"save() needs a file path, got the folder {folder!r}; pass e.g. {expected}."
    )
    x, y = _data()
    with pytest.raises(CheckpointError, match=r"fit\(checkpoint=\.\.\.\) needs a file path"):
        fit(model, guide, ArrayLoader(x, y, 5), epochs=1, progress=False, checkpoint=folder)
    assert not (tmp_path / "runs").exists()
    assert save(tmp_path / "runs" / "checkpoint.pt", model, guide).is_file()


def test_thinned_draws_are_saved_without_the_draws_thinned_out(tmp_path):
    # torch.save writes all of the memory a view looks at: every 10th draw of 1000 took the
    # room of all 1000 (1.6 MB for 160 kB of values)
    draws = torch.randn(4, 1000, 100)
    thinned = draws[:, ::10]
    stats = {"diverging": torch.zeros(4, 100, dtype=torch.bool), "step_size": torch.rand(4, 100)}
    result = MCMCResult({"w": thinned}, stats, "nuts", 10, [1.0, 2.0])
    path = save(tmp_path / "mcmc.pt", result)
    assert os.path.getsize(path) < 2 * thinned.numel() * thinned.element_size()
    back = load(path)
    assert torch.equal(back.samples["w"], thinned)
    assert torch.equal(draws[:, ::10], thinned)  # the caller's draws untouched
    # a model's tied weights (one tensor under two names) stay one tensor
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    net[1].weight = net[0].weight
    skeleton = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    skeleton[1].weight = skeleton[0].weight
    model = load(save(tmp_path / "tied.pt", net), module=skeleton).model
    assert model[0].weight is model[1].weight
    assert torch.equal(model[0].weight, net[0].weight)


def test_an_mcmc_results_metadata_is_refused_under_the_callers_own_key(tmp_path):
    stats = {"diverging": torch.zeros(2, 3, dtype=torch.bool)}
    result = MCMCResult({"w": torch.randn(2, 3)}, stats, "nuts", 10, metadata={"t": (1, 2)})
    with pytest.raises(CheckpointError) as info:  # it said metadata['metadata']['t']
        save(tmp_path / "mcmc.pt", result)
    assert str(info.value).startswith(
        "metadata must hold JSON values, which load back as saved; metadata['t'] is a tuple"
    )
    with pytest.raises(CheckpointError, match=r"; metadata\['run'\] is a tuple"):
        save(tmp_path / "mcmc.pt", result, metadata={"run": (1,)})
    assert not (tmp_path / "mcmc.pt").exists()


def _two_groups(params):
    params = list(params)
    return torch.optim.Adam([{"params": params[:1]}, {"params": params[1:]}], lr=0.01)


@pytest.mark.filterwarnings("ignore:fit\\(resume_from=\\.\\.\\.\\) trains a finished run")
def test_a_resume_whose_optimizer_groups_differ_is_refused_before_anything_is_loaded(tmp_path):
    # the model and guide took the run's values, then the optimizer's state was refused:
    # the refusal left them changed
    x, y = _data()
    model, guide = _mlp()
    path = tmp_path / "run.pt"
    fit(model, guide, ArrayLoader(x, y, 5, seed=0), epochs=1, progress=False,
        optim=_two_groups, checkpoint=path)  # fmt: skip
    model, guide = _mlp()
    guide(x[:2])  # the guide's parameters made, to compare
    before = {k: v.clone() for k, v in guide.state_dict().items()}

    def one_group(params):
        return torch.optim.Adam(list(params), lr=0.01)

    with pytest.raises(CheckpointError) as info:
        fit(model, guide, ArrayLoader(x, y, 5, seed=0), epochs=2, progress=False,
            optim=one_group, resume_from=path)  # fmt: skip
    count = sum(1 for _ in guide.parameters()) + sum(1 for _ in model.parameters())
    assert str(info.value).startswith(
        f"resume_from={str(path)!r} holds an optimizer state of parameter groups of "
        f"[1, {count - 1}] parameters, but this fit()'s optimizer has [{count}]"
    )
    assert str(info.value).endswith("nothing was loaded.")
    for key, value in guide.state_dict().items():
        assert torch.equal(value, before[key]), key
    model, guide = _mlp()  # the run's grouping: resumed
    result = fit(model, guide, ArrayLoader(x, y, 5, seed=0), epochs=2, progress=False,
                 optim=_two_groups, resume_from=path)  # fmt: skip
    assert len(result.history) == 2


@pytest.mark.parametrize("kind", ["front door", "batchensemble", "rank1"])
def test_load_leaves_torchs_random_state_as_it_was(tmp_path, kind):
    # rebuilding drew fresh initial values (then replaced by the saved ones) from torch's
    # stream: seeding, loading, then drawing gave other draws than seeding, then drawing
    from pyrouq import batchensemble, rank1

    def net():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    if kind == "front door":
        model, guide = _mlp()
    elif kind == "batchensemble":
        model, guide = batchensemble(net(), 2), None
    else:
        model = rank1(net(), 2)
        guide = mean_field_guide(model)
    path = save(tmp_path / "run.pt", model, guide)
    skeleton = None if kind == "front door" else net()  # (built by the user, before seeding)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load(path, module=skeleton)
    assert torch.equal(torch.rand(3), expected)


def test_a_model_with_latent_sites_saved_without_its_guide_is_warned_of(tmp_path):
    """The posterior fit() fits lives in the guide: save(path, model) of a Bayesian model wrote
    its priors and start weights without a word, and a user who saved after fit() lost it."""
    model, guide = _mlp()
    told = (
        r"^save\(\): BayesianMLP has latent sites \('fc1\.weight', 'fc1\.bias', 'fc2\.weight', "
        r"'fc2\.bias'\) and was saved without a guide: the file holds its structure, priors and "
        r"other parameters, not the posterior that fit\(\) fits, which lives in the guide .* "
        r"Pass the guide: save\(path, model, guide\)\. A model kept to go with an MCMCResult, "
        r"its posterior saved apart with save\(path, result\), needs none\.$"
    )
    with pytest.warns(UserWarning, match=told) as caught:
        path = save(tmp_path / "alone.pt", model)
    assert len(caught) == 1 and caught[0].filename == __file__  # (the caller's line)
    assert load(path).guide is None  # written all the same
    converted = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    with pytest.warns(UserWarning, match=r"BayesianNetwork has latent sites \('0\.weight', "):
        save(tmp_path / "converted.pt", converted)
    # quiet with the guide, and for models that hold all they learn (no latent sites)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save(tmp_path / "pair.pt", model, guide)
        save(tmp_path / "ensemble.pt", BatchEnsembleMLP(4, 8, 3))
        save(tmp_path / "members.pt", batchensemble(nn.Sequential(nn.Linear(4, 3)), 2))
        save(tmp_path / "plain.pt", MLP(4, 8, 3))
        x, y = _data()  # fit(checkpoint=) saves its guide every epoch
        fit(model, guide, ArrayLoader(x, y, 10), epochs=1, checkpoint=tmp_path / "run.pt",
            progress=False)  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_or_device_is_written_into_not_replaced_by_a_file(tmp_path):
    # renamed over, save()'s temporary file took the node's place: as root,
    # save("/dev/null", model) left /dev/null a regular file; torch.save writes into it
    import stat

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # (so that save's open does not wait)
    try:
        torch.manual_seed(0)
        net = MLP(2, 3, 2)  # a file smaller than the pipe's buffer (64 KiB)
        save(pipe, net)
        written = b""
        while chunk := os.read(reader, 1 << 16):
            written += chunk
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)  # still the pipe
    copy = tmp_path / "copy.pt"
    copy.write_bytes(written)
    loaded = load(copy).model
    for name, value in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux's /proc/self/fd")
def test_a_pipe_reached_through_a_link_of_proc_is_written_into(tmp_path):
    # save("/dev/stdout", model) in a piped process (python script.py | ...): /dev/stdout leads
    # to /proc/self/fd/1, a link to "pipe:[...]", which realpath cannot resolve: save() then
    # made its temporary file in /proc/<pid>/fd and failed (FileNotFoundError) where
    # torch.save writes into the pipe
    torch.manual_seed(0)
    net = MLP(2, 3, 2)  # a file smaller than the pipe's buffer (64 KiB)
    reader, writer = os.pipe()
    try:
        save(f"/proc/self/fd/{writer}", net)
        os.close(writer)
        writer = -1
        written = b""
        while chunk := os.read(reader, 1 << 16):
            written += chunk
    finally:
        os.close(reader)
        if writer >= 0:
            os.close(writer)
    copy = tmp_path / "copy.pt"
    copy.write_bytes(written)
    loaded = load(copy).model
    for name, value in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
