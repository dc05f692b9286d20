"""Audit 13: pyrouq in unusual but legitimate environments.

A default device other than the model's (``torch.set_default_device('meta')``), a disk that
fills up (a file-size limit, which fails the writes as a full disk does), a stdout that cannot
encode the command's tables (``PYTHONIOENCODING=ascii``, a Latin-1 locale, a Windows console
redirected to a file), and arviz installed without the matplotlib it imports.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.cli import main


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g, device="cpu")
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def _net() -> nn.Module:
    torch.manual_seed(0)
    with torch.device("cpu"):  # on the CPU whatever the default device
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


@contextlib.contextmanager
def _meta_default():
    """torch's default device set to 'meta' (tensors of shapes, no values) for a while."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


# -------------------------------------------------------------------------------------------
# A default device other than the model's
# -------------------------------------------------------------------------------------------


def _trained() -> tuple[list[float], dict[str, torch.Tensor], torch.Tensor]:
    x, y = _data()
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    result = pyrouq.fit(model, guide, [(x, y)], epochs=3, num_data=32, progress=False, seed=0)
    probs = pyrouq.predict(model, x, guide, num_samples=4, progress=False, seed=0).probs
    return result.losses, guide.state_dict(), probs


def test_fit_and_predict_under_a_meta_default_device_match_the_cpu_default():
    """The guide failed to build ("Cannot copy out of meta tensor; no data!", its scales made
    on the default device), and fit()'s first step in torch's backward pass: its running
    sums and the step's loss were made on the default device, not the model's."""
    losses, state, probs = _trained()
    with _meta_default():
        got_losses, got_state, got_probs = _trained()
    assert got_losses == losses and torch.equal(got_probs, probs)
    assert all(torch.equal(got_state[k], v) for k, v in state.items())  # (on the CPU)


def test_load_under_a_meta_default_device_rebuilds_on_the_cpu(tmp_path):
    """The docstring says: on the skeleton's device, else the CPU. A BayesianMLP failed with
    "Tensor.item() cannot be called on meta tensors"; a BatchEnsemble came back on the meta
    device, its saved values dropped (torch's no-op copy warnings only), even with
    device='cpu'."""
    x, _ = _data()
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(in_features=4, hidden_features=5, out_features=3)
    guide = pyrouq.mean_field_guide(model)
    ensemble = pyrouq.batchensemble(_net(), 2)
    bayes_path = pyrouq.save(tmp_path / "bayes.pt", model, guide)
    ensemble_path = pyrouq.save(tmp_path / "ensemble.pt", ensemble)
    expected = pyrouq.predict(model, x, guide, num_samples=3, progress=False, seed=0).probs
    members = pyrouq.predict(ensemble, x, progress=False).probs
    with _meta_default():
        for device in (None, "cpu"):
            saved = pyrouq.load(bayes_path, device=device)
            assert saved.guide is not None
            got = pyrouq.predict(saved.model, x, saved.guide, num_samples=3, progress=False, seed=0)
            assert torch.equal(got.probs, expected)
            loaded = pyrouq.load(ensemble_path, module=_net(), device=device).model
            assert {t.device.type for t in loaded.state_dict().values()} == {"cpu"}
            assert torch.equal(pyrouq.predict(loaded, x, progress=False).probs, members)


def _sampled() -> tuple[dict[str, torch.Tensor], float, float]:
    x, y = _data()
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(4, 3, device="cpu"))
    chain = pyrouq.mcmc(
        model, x[:16], y[:16], num_samples=3, warmup_steps=3, num_chains=1, seed=0, progress=False
    )
    guide = pyrouq.mean_field_guide(model)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=3, seed=1)
    k_hat = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30, seed=0).k_hat
    return chain.samples, float(idata.log_likelihood["obs"].values.sum()), float(k_hat)


def test_mcmc_and_the_diagnostics_under_a_meta_default_device():
    """NUTS's first gradient, the arviz export and PSIS failed on Pyro's tensors made on the
    default device ("Cannot copy out of meta tensor", "Tensor.item() ... meta tensors")."""
    samples, log_lik, k_hat = _sampled()
    with _meta_default():
        got_samples, got_log_lik, got_k_hat = _sampled()
    assert all(torch.equal(got_samples[k], v) for k, v in samples.items())
    assert (got_log_lik, got_k_hat) == (log_lik, k_hat)


# -------------------------------------------------------------------------------------------
# A disk that fills up; a stdout that cannot encode the tables; arviz without matplotlib
# -------------------------------------------------------------------------------------------


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_full_disk_is_an_oserror_naming_the_file_and_a_one_line_command_error(tmp_path):
    """torch.save's writer takes the file's OSError and raises RuntimeError "[enforce fail at
    inline_container.cc:672] . unexpected pos 2432 vs 2326": save() raised that, and
    `pyrouq fit` ended in its traceback (the tests before raised the OSError themselves)."""
    pytest.importorskip("resource")
    code = """
        import json, os, resource, signal, sys
        import torch
        from torch import nn
        import pyrouq
        from pyrouq.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # as a disk that fills
        model = pyrouq.bayesian(nn.Linear(100, 200))
        out = {}
        try:
            pyrouq.save("big.pt", model, pyrouq.mean_field_guide(model))
        except OSError as err:
            out["save"] = [type(err).__name__, err.errno, err.filename, str(err)]
        out["left"] = sorted(os.listdir("."))
        argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", "run",
                "--no-progress"]
        out["exit"] = main(argv)
        out["run"] = os.path.exists("run")
        print(json.dumps(out))
    """
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["save"] == ["OSError", errno.EFBIG, "big.pt", "[Errno 27] File too large: 'big.pt'"]
    assert out["left"] == []  # the temporary file removed, no partial checkpoint
    assert out["exit"] == 2 and out["run"] is False  # nothing kept: no folder left
    assert done.stderr.strip().splitlines()[-1] == (
        "pyrouq: error: cannot write the run into 'run' (File too large: run/checkpoint.pt); "
        "free space on its disk (or make it writable), or pass --out another folder"
    )


def test_the_command_writes_its_tables_in_ascii_where_stdout_cannot_encode_them(tmp_path):
    """A finished training ended in "pyrouq: error: 'ascii' codec can't encode characters
    in position 0-37" (exit 2), its metrics and plots unwritten."""
    out = tmp_path / "run ö"
    argv = ["fit", "bayesian-mlp", "--epochs", "1", "--train-size", "64", "--num-samples", "2",
            "--seed", "0", "--no-progress", "--out", str(out)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pyrouq", *argv],
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        capture_output=True,
        timeout=120,
    )
    stdout = done.stdout.decode("ascii")  # nothing beyond ASCII was written
    assert done.returncode == 0, done.stderr.decode("ascii", "replace")[-2000:]
    lines = stdout.splitlines()
    head = lines.index("| Classification           |   Value |")
    assert lines[head - 1] == lines[head + 1] == "+--------------------------+---------+"
    assert (
        lines[head + 2].startswith("| Acc                      |  ") and lines[head + 2][-1] == "|"
    )
    assert f"wrote {str(out)[:-1]}?/: metrics.json" in stdout  # the folder's ö as ?
    assert json.loads((out / "metrics.json").read_text())["acc"] == pytest.approx(
        float(lines[head + 2].split("|")[2].strip().rstrip("%")) / 100, abs=5e-5
    )
    assert (out / "uncertainty.png").is_file()


def test_an_error_naming_a_path_the_stream_cannot_encode_is_still_one_line(tmp_path, monkeypatch):
    """The error's print raised UnicodeEncodeError out of main(); the streams' handlers are
    put back after."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", stderr)
    run = tmp_path / "nö run"
    assert main(["evaluate", str(run)]) == 2
    assert (stdout.errors, stderr.errors) == ("strict", "strict")
    stderr.seek(0)
    told = stderr.read()
    assert told.startswith("pyrouq: error: ") and str(tmp_path / "n? run") in told


def test_import_and_a_fit_without_matplotlib_and_diagnostics_name_it(tmp_path):
    """With matplotlib missing, arviz (installed) cannot import, and the diagnostics said
    "needs arviz: pip install 'arviz>=0.20,<1'", which pip answers with "already
    satisfied"; under -W error, importing pyrouq and a tiny fit raise nothing."""
    code = """
        import sys
        sys.modules["matplotlib"] = None  # as if not installed
        import torch
        from torch import nn
        import pyrouq
        x = torch.randn(16, 4)
        y = (x[:, 0] > 0).long()
        model = pyrouq.bayesian(nn.Linear(4, 2))
        guide = pyrouq.mean_field_guide(model)
        pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=16, progress=False)
        preds = pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        print(round(pyrouq.evaluate(preds, y)["acc"], 4) >= 0)
        for call in (
            lambda: pyrouq.to_inference_data(model, guide, x, y, num_samples=2),
            lambda: pyrouq.plotting.plot_reliability(preds, y),
        ):
            try:
                call()
            except ImportError as err:
                print(err)
    """
    done = _python(code, tmp_path, PYTHONWARNINGS="error")
    assert done.returncode == 0, done.stderr[-2000:]
    shown, arviz, plotting = done.stdout.splitlines()
    assert shown == "True"
    assert arviz.startswith("pyrouq.diagnostics needs arviz: it imports matplotlib (")
    assert arviz.endswith("): pip install matplotlib.")
    assert plotting == "pyrouq.plotting needs matplotlib; install it with `pip install matplotlib`."
