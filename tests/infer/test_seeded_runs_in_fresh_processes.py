"""Audit 12: a seed makes a run repeat exactly, in fresh processes too.

Two processes run the same seeded script, differing in what should not matter: Python's hash
seed (the order of a set of strings), the working folder, the temporary folder, the import
order (arviz before torch), draws taken from every global stream before the seeded calls, the
order of the keyword arguments, the checkpoint's file name and folder, and how the command
line's options are ordered and its ``--out`` spelled. Both set one torch thread: another
number of threads may change a convolution's sums in the last bits (README). They must agree
to the bit: training, draws, MCMC chains, the arviz export (its values and the order of its
groups, variables and coordinates), ``pyrouq.save``'s bytes, ``fit(checkpoint=)``'s file and
``pyrouq fit``'s run folder, save for what records the time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

_SCRIPT = r"""
import sys

if __name__ == "__main__" and "arviz_first" in sys.argv:
    import arviz  # noqa: F401

import hashlib
import json
import warnings

import numpy as np
import torch
from torch import nn

import pyrouq
from pyrouq.cli import main as cli


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = a.detach().cpu().numpy() if torch.is_tensor(a) else np.asarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def network():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 3))


def structure(idata):
    return [
        [g, list(idata[g].data_vars), list(idata[g].coords),
         [list(idata[g][v].dims) for v in idata[g].data_vars]]
        for g in idata.groups()
    ]


def values(idata):
    return digest(*[idata[g][v].values for g in idata.groups() for v in idata[g].data_vars])


def main():
    warnings.simplefilter("ignore")
    save_as, flags = sys.argv[1], set(sys.argv[2:])
    torch.set_num_threads(1)
    if "draws_first" in flags:  # the seeded calls must not follow the global streams
        import random
        torch.rand(7)
        np.random.rand(3)  # noqa: NPY002
        random.random()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 0.7).long()
    if "kwargs_reversed" in flags:
        options = dict(progress=False, seed=3, epochs=2)
    else:
        options = dict(epochs=2, seed=3, progress=False)
    out, kept = {}, {}
    for kind in ("bayesian", "batchensemble", "rank1"):
        if kind == "bayesian":
            model = pyrouq.bayesian(network())
        elif kind == "rank1":
            model = pyrouq.rank1(network(), 2)
        else:
            model = pyrouq.batchensemble(network(), 2)
        guide = None if kind == "batchensemble" else pyrouq.mean_field_guide(model)
        extra = {"checkpoint": "fit.pt"} if kind == "bayesian" else {}
        result = pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 16, seed=1), **options, **extra)
        draws = {} if guide is None else {"num_samples": 3, "seed": 4}
        probs = pyrouq.predict(model, x, guide, progress=False, **draws).probs
        states = [*model.state_dict().values(), *(guide.state_dict().values() if guide else ())]
        out[kind] = [digest(torch.tensor(result.losses, dtype=torch.float64)), digest(*states),
                     digest(probs)]
        out[kind + " names"] = [*model.state_dict(), *(guide.state_dict() if guide else ())]
        kept[kind] = model, guide
    out["rng"] = digest(torch.get_rng_state())  # rank-1's fit(seed=3), which predict(seed=) kept
    model, guide = kept["bayesian"]
    other = pyrouq.bayesian(network())
    other_guide = pyrouq.mean_field_guide(other)
    pyrouq.fit(other, other_guide, pyrouq.ArrayLoader(x, y, 16, seed=1), epochs=2, seed=4,
               progress=False)
    out["another seed differs"] = digest(*other_guide.state_dict().values()) != out["bayesian"][1]
    path = pyrouq.save(save_as, model, guide, metadata={"note": "audit"})
    out["save"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    torch.manual_seed(0)
    small = pyrouq.BayesianMLP(in_features=4, hidden_features=3, out_features=3)
    chains = pyrouq.mcmc(small, x, y, num_samples=3, warmup_steps=3, num_chains=2, seed=5,
                         progress=False, parallel=False, max_tree_depth=2)
    out["mcmc"] = [list(chains.samples), digest(*chains.samples.values())]
    for name, idata in (
        ("mcmc export", pyrouq.to_inference_data(chains)),
        ("guide export", pyrouq.to_inference_data(model, guide, x, y, num_samples=3, seed=6)),
    ):
        out[name] = [structure(idata), values(idata)]
    val = pyrouq.predict(model, x[:24], guide, num_samples=4, seed=7, progress=False)
    test = pyrouq.predict(model, x[24:], guide, num_samples=4, seed=8, progress=False)
    sets = pyrouq.conformal(val, y[:24], alpha=0.3, score="raps", seed=9).predict_sets(test)
    temperature = pyrouq.temperature_scale(val, y[:24]).temperature
    out["calibration"] = [digest(sets), float(temperature)]
    out["loader"] = digest(torch.cat([b for _, b in pyrouq.ArrayLoader(x, y, 10, seed=2)]))
    args = ["--epochs", "1", "--train-size", "64", "--num-samples", "2", "--seed", "0"]
    if "options_reversed" in flags:
        args = [a for i in range(len(args) - 2, -1, -2) for a in args[i : i + 2]]
    out["cli exit"] = cli(["fit", "bayesian-mlp", *args, "--out", sys.argv[-1], "--no-progress"])
    with open("out.json", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
"""


def _start(folder: Path, hash_seed: str, save_as: str, out: str, *flags: str) -> subprocess.Popen:
    """The script in a fresh process, in ``folder`` (its working and temporary folder)."""
    folder.mkdir()
    (folder / "tmp").mkdir()
    script = folder / "script.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "TMPDIR": str(folder / "tmp")}
    command = [sys.executable, str(script), save_as, *flags, out]
    return subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _json(path: Path) -> list[tuple[str, object]]:
    return json.loads(path.read_text(), object_pairs_hook=list)


def _without(pairs: list[tuple[str, object]], *keys: str) -> list[tuple[str, object]]:
    return [(k, v) for k, v in pairs if k not in keys]


def _checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _same(a: object, b: object) -> bool:
    """Equal to the bit, and in the same order: nested dicts, lists and tensors."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def test_a_seeded_script_repeats_to_the_bit_in_fresh_processes(tmp_path):
    first = _start(tmp_path / "a", "0", "model.pt", "run")
    second = _start(
        tmp_path / "b", "1", str(tmp_path / "b" / "elsewhere" / "other.pth"),
        str(tmp_path / "b" / "runs" / "run"),
        "arviz_first", "draws_first", "kwargs_reversed", "options_reversed",
    )  # fmt: skip
    errors = [process.communicate(timeout=240)[1] for process in (first, second)]
    for process, err in zip((first, second), errors, strict=True):
        assert process.returncode == 0, err[-3000:]
    a, b = tmp_path / "a", tmp_path / "b"
    got, want = _json(b / "out.json"), _json(a / "out.json")
    assert [k for k, _ in got] == [k for k, _ in want]
    for (key, value), (_, expected) in zip(got, want, strict=True):
        assert value == expected, key
    out = dict(want)
    assert out["another seed differs"] is True and out["cli exit"] == 0
    assert out["mcmc"][0] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    posterior = out["guide export"][0][0]
    assert posterior[0] == "posterior" and posterior[1] == ["0.weight", "0.bias", "3.weight",
                                                            "3.bias"]  # fmt: skip

    # fit(checkpoint=): the same file but for the epochs' times
    ours, theirs = _checkpoint(a / "fit.pt"), _checkpoint(b / "fit.pt")
    for checkpoint in (ours, theirs):
        history = checkpoint["training"]["history"]
        assert [r.pop("seconds") > 0 for r in history] == [True, True]
    assert list(ours) == ["format", "format_version", "description", "model", "guide",
                          "optimizer", "metadata", "training"]  # fmt: skip
    for key in ours:
        assert _same(ours[key], theirs[key]), key

    # pyrouq fit: the same run folder, but for the times and the command as typed
    ours_run, theirs_run = a / "run", b / "runs" / "run"
    timing = ("train_seconds", "eval_seconds")
    assert _without(_json(ours_run / "metrics.json"), *timing) == _without(
        _json(theirs_run / "metrics.json"), *timing
    )
    assert [k for k, _ in _json(ours_run / "metrics.json")][:3] == ["acc", "nll", "brier"]
    assert _without(_json(ours_run / "config.json"), "command") == _without(
        _json(theirs_run / "config.json"), "command"
    )
    for plot in ("reliability", "risk_coverage", "image_grid", "most_uncertain", "uncertainty"):
        png = f"{plot}.png"
        assert (ours_run / png).read_bytes() == (theirs_run / png).read_bytes(), png
    ours = _checkpoint(ours_run / "checkpoint.pt")
    theirs = _checkpoint(theirs_run / "checkpoint.pt")
    meta = [json.loads(c.pop("metadata"), object_pairs_hook=list) for c in (ours, theirs)]
    assert _same(ours, theirs)
    for m in meta:
        assert [k for k, _ in m] == ["config", "metrics"]
        m[0] = ("config", _without(m[0][1], "command"))
        m[1] = ("metrics", _without(m[1][1], *timing))
    assert meta[0] == meta[1]
