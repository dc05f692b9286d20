"""Memory audit of predict() at scale: the weight draws of an autoguide held once (not as a
list and a stack, nor with the autoguide's unconstrained copies), and the passes over x of
draws taken in chunks (``max_draw_bytes``) let go as they are joined.

The peaks are read in a fresh process (``VmHWM`` of ``/proc/self/status``, reset through
``/proc/self/clear_refs``), as the growth of the resident memory over the call."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq

_PEAK = textwrap.dedent(
    """
    import gc, json, sys
    import torch
    torch.set_num_threads(1)

    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024

    def peak(call):
        gc.collect()
        base = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        out = call()
        return status("VmHWM") - base, out
    """
)


def _linux_peaks() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        with open("/proc/self/status") as f:
            return "VmHWM" in f.read()
    except OSError:
        return False


needs_peaks = pytest.mark.skipif(not _linux_peaks(), reason="needs Linux's VmHWM reset")


def _child(code: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _linear_model() -> tuple[nn.Module, AutoNormal, torch.Tensor]:
    model = pyrouq.bayesian(nn.Linear(6, 3), num_data=10)
    guide = AutoNormal(model)
    x = torch.randn(4, 6)
    guide(x, torch.zeros(4, dtype=torch.long))
    return model, guide, x


def test_predict_draws_an_autoguide_as_its_seeded_traces():
    """predict() with an autoguide predicts under the model's sites of the guide's traces,
    draw after draw from the seed it finds (not under AutoNormal's auxiliary
    ``<site>_unconstrained`` copies, which predict() once held every draw of, then dropped)."""
    model, guide, x = _linear_model()
    torch.manual_seed(3)
    probs = pyrouq.predict(model, x, guide, num_samples=5, progress=False).probs
    torch.manual_seed(3)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(5)]
    assert {n for n, s in traces[0].nodes.items() if s["type"] == "sample"} >= {
        "weight_unconstrained",
        "bias_unconstrained",
    }
    with torch.no_grad():
        expected = torch.stack(
            [
                torch.softmax(F.linear(x, t.nodes["weight"]["value"], t.nodes["bias"]["value"]), -1)
                for t in traces
            ]
        )
    assert probs.shape == (5, 4, 3)
    torch.testing.assert_close(probs, expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(expected[0], expected[1])  # five draws, not one five times


def test_predict_refuses_a_guide_whose_site_changes_shape_between_runs():
    """A guide of one's own whose site changes shape between runs is refused with the site
    and both shapes named (predict() stacks each site's draws)."""
    import pyro
    import pyro.distributions as dist

    def model(x):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        return torch.stack([x[:, 0] * w.sum(), -x[:, 0] * w.sum()], -1)

    sizes = itertools.cycle([2, 3])

    def guide(x):
        pyro.sample("w", dist.Normal(torch.zeros(next(sizes)), 1.0).to_event(1))

    x = torch.ones(3, 1)
    both = r"site 'w' of shape (\(3,\) in one run and \(2,\)|\(2,\) in one run and \(3,\))"
    with pytest.raises(ValueError, match=both):
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    sizes = itertools.cycle([2])  # one shape throughout: predicted
    assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 3, 2)


@needs_peaks
def test_predict_holds_autoguide_draws_once():
    """predict() with an AutoNormal guide held its S draws about four times over at the peak
    (a list of the draws, their stack, and the same again for AutoNormal's unconstrained
    sites): a bayesian resnet18, S = 16 on 64 images, peaked 2.30 GB above its start for
    0.68 GB of weight draws; 0.92 GB now. Here 32 draws of a 1024 x 1024 Linear, 134 MB."""
    out = _child(
        """
        import pyrouq
        from pyro.infer.autoguide import AutoNormal
        from torch import nn
        torch.manual_seed(0)
        model = pyrouq.bayesian(nn.Linear(1024, 1024), num_data=100)
        guide = AutoNormal(model)
        x = torch.randn(8, 1024)
        guide(x, torch.zeros(8, dtype=torch.long))
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        grown, _ = peak(lambda: pyrouq.predict(model, x, guide, num_samples=32, progress=False))
        print(json.dumps({"grown": grown, "draws": 32 * (1024 * 1024 + 1024) * 4}))
        """
    )
    assert out["grown"] < 2.5 * out["draws"], out  # 3.8-4.1x before, 1.3-1.6x now


_CHUNKED = """
import pyrouq
torch.manual_seed(0)
model = pyrouq.BayesianMLP(in_features=8, hidden_features=16, out_features=500)
guide = pyrouq.mean_field_guide(model)
per_draw = sum(guide.site_loc(s).numel() * 4 for s in guide.sites)
x = torch.randn(4096, 8)
pyrouq.predict(model, x[:8], guide, num_samples=2, progress=False)
chunks = {chunks}
grown, probs = peak(
    lambda: pyrouq.predict(
        model, x, guide, num_samples=16, max_draw_bytes=16 // chunks * per_draw, progress=False
    ).probs
)
print(json.dumps({{"grown": grown, "probs": probs.numel() * 4}}))
"""


@needs_peaks
def test_predict_in_chunks_of_draws_peaks_as_in_one():
    """Draws taken in chunks (max_draw_bytes) give a pass over x per chunk; the passes' parts
    were all held while joined, so that predict() peaked one copy of its probabilities above
    the same call in one chunk (16 chunks, 1.2 GB of probabilities: 5.80 GB against 4.58 GB
    above the start). Joined batch by batch, the peak then hung on what glibc kept of the
    freed parts: +0.3 copies on one machine, +1.0 on CI's. Here 8 chunks against 1, 131 MB
    of probabilities, each in a process of its own: the parts and the whole, 2.0x, in both."""
    whole = _child(_CHUNKED.format(chunks=1))
    chunked = _child(_CHUNKED.format(chunks=8))
    assert whole["probs"] == chunked["probs"] == 16 * 4096 * 500 * 4
    # one more copy of the probabilities before (3.0x against 2.0x), none now (2.0x, 2.0x)
    assert chunked["grown"] < whole["grown"] + 0.25 * whole["probs"], (whole, chunked)


def test_predict_in_chunks_of_draws_joins_each_part_in_its_place():
    """The passes of the chunks of draws are joined in one tensor (draws along dim 0, inputs
    along dim 1): the same as one chunk for classes and for a Gaussian's (loc, scale), the
    loader's labels as targets, and no inputs still the error of no inputs."""
    from pyrouq.likelihoods import Gaussian

    torch.manual_seed(0)
    x = torch.randn(10, 4)
    for likelihood, y in (("categorical", torch.randint(0, 3, (10,))), (Gaussian(0.5), x[:, :3])):
        batches = [(x[:4], y[:4]), (x[4:4], y[4:4]), (x[4:], y[4:])]  # an empty one between
        model = pyrouq.bayesian(nn.Linear(4, 3), likelihood=likelihood, num_data=10)
        guide = pyrouq.mean_field_guide(model, init_scale=0.3)
        got = []
        for limit in ({}, {"max_draw_bytes": 1}):
            torch.manual_seed(1)
            got.append(pyrouq.predict(model, batches, guide, num_samples=3, **limit))
        whole, chunked = got
        if likelihood == "categorical":
            assert chunked.probs.shape == (3, 10, 3) and torch.equal(chunked.probs, whole.probs)
        else:
            assert torch.equal(chunked.loc, whole.loc) and torch.equal(chunked.scale, whole.scale)
        assert torch.equal(chunked.targets, y)
        with pytest.raises(ValueError, match=r"predict\(\) got no inputs: x is empty"):
            pyrouq.predict(model, [x[:0]], guide, num_samples=3, max_draw_bytes=1)


def test_predictions_of_one_batch_share_no_memory_with_the_networks_outputs():
    """One batch's part is the predictions as it is (no second copy): a Gaussian's loc was
    then the network's output itself, here its input, which the user changed after."""
    from pyrouq.likelihoods import Gaussian

    class Identity(nn.Module):
        def __init__(self):
            super().__init__()
            self.likelihood = Gaussian(0.5)
            self.unused = nn.Linear(2, 2)

        def forward(self, x):
            return x

    x = torch.full((5, 2), 3.0)
    got = pyrouq.predict(Identity(), x, progress=False)
    x.zero_()
    assert torch.equal(got.loc, torch.full((1, 5, 2), 3.0))


class _ReadsDiffer:
    """Batches that do not shuffle (``shuffle = False``: read once per chunk of draws) but
    differ from one read to the next, as a buggy loader's."""

    shuffle = False

    def __init__(self, x, reads):
        self.x, self.reads, self.count = x, reads, 0

    def __iter__(self):
        cuts = self.reads[min(self.count, len(self.reads) - 1)]
        self.count += 1
        return iter([self.x[a:b] for a, b in cuts])


def test_chunks_of_draws_refuse_an_x_whose_batches_change_between_reads():
    """The batches' sizes were taken from the first read: a later read of other sizes was
    broadcast into them (one input's probabilities copied over two rows) or left part of the
    result unwritten (uninitialised memory, -2.75e38), where the parts were joined by
    torch.cat before (an error)."""
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(3, 4), num_data=10)
    guide = pyrouq.mean_field_guide(model)
    x = torch.randn(4, 3)
    first = [(0, 2), (2, 4)]
    for reads, what in (
        (
            [first, [(0, 3), (3, 4)]],
            r"a batch \(3, 4\) torch.float32 where the first gave \(2, 4\)",
        ),
        ([first, [(0, 2)]], "1 batches where the first gave 2"),
        ([[], first], "2 batches where the first gave 0"),  # (the last read was taken)
    ):
        with pytest.raises(ValueError, match=rf"x gave other batches on its read 2 .*{what}"):
            pyrouq.predict(model, _ReadsDiffer(x, reads), guide, num_samples=4,
                           max_draw_bytes=1, progress=False)  # fmt: skip
    same = pyrouq.predict(model, _ReadsDiffer(x, [first]), guide, num_samples=4, max_draw_bytes=1)
    assert same.probs.shape == (4, 4, 4)
