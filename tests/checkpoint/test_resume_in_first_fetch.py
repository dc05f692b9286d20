"""Audit of reproducibility and resumption: a seed repeats a run, a resumed run is the run."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pyrouq import ArrayLoader, TrainingInterrupted, bayesian, fit, load, mean_field_guide


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 5, generator=g)
    return x, (x[:, 0] > 0).long()


def _model_and_guide():
    with torch.random.fork_rng():
        torch.manual_seed(123)
        net = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        model = bayesian(net)
        return model, mean_field_guide(model)


class _Stops:
    """Raises KeyboardInterrupt (as a loader stopped by Ctrl-C does) at its ``stop``-th fetch."""

    def __init__(self, stop: int | None):
        self.stop, self.fetched = stop, 0

    def wrap(self, batches):
        for batch in batches:
            self.fetched += 1
            if self.fetched == self.stop:
                raise KeyboardInterrupt
            yield batch


def _loader(kind: str, stops: _Stops):
    x, y = _data()
    if kind == "ArrayLoader":

        class Loader(ArrayLoader):
            def __iter__(self):
                return stops.wrap(super().__iter__())

        return Loader(x, y, batch_size=16, seed=3)

    class Data(DataLoader):
        def __iter__(self):
            return stops.wrap(super().__iter__())

    generator = torch.Generator().manual_seed(5) if kind == "DataLoader(generator=)" else None
    return Data(TensorDataset(x, y), batch_size=16, shuffle=True, generator=generator)


def _state(model, guide):
    return {
        **{f"model.{k}": v.clone() for k, v in model.state_dict().items()},
        **{f"guide.{k}": v.clone() for k, v in guide.state_dict().items()},
    }


def _history(result):
    return [
        (r.epoch, r.loss, r.nll, r.kl, -1.0 if math.isnan(r.train_acc) else r.train_acc)
        for r in result.history
    ]


@pytest.mark.parametrize("kind", ["ArrayLoader", "DataLoader(generator=)", "DataLoader"])
@pytest.mark.parametrize("epoch", [1, 2])
def test_a_run_stopped_in_an_epochs_first_fetch_resumes_as_the_run_never_stopped(
    tmp_path, kind, epoch
):
    # the epoch's first fetch draws its order (from the loader's generator, or torch's for a
    # DataLoader without one): the checkpoint must hold the state from before that draw, or
    # the resumed epoch runs in another order (it did: parameters 0.036 apart)
    model, guide = _model_and_guide()
    full = fit(model, guide, _loader(kind, _Stops(None)), epochs=3, seed=7, progress=False)
    want = _state(model, guide)

    model, guide = _model_and_guide()
    path = tmp_path / "run.pt"
    stop = 1 + 4 * (epoch - 1)  # 4 batches an epoch: the first fetch of `epoch`
    with pytest.raises(TrainingInterrupted) as stopped:
        fit(model, guide, _loader(kind, _Stops(stop)), epochs=3, seed=7, progress=False,
            checkpoint=path)  # fmt: skip
    assert (stopped.value.epoch, stopped.value.step) == (epoch, 0)
    saved = load(path, module=nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                            nn.Linear(8, 2))).training  # fmt: skip
    assert (saved["epochs_done"], saved["epoch_steps"]) == (epoch - 1, 0)

    model, guide = _model_and_guide()
    resumed = fit(
        model, guide, _loader(kind, _Stops(None)), epochs=3, progress=False, resume_from=path
    )
    got = _state(model, guide)
    assert _history(resumed) == _history(full)
    assert resumed.steps == full.steps == 12
    for key, value in want.items():
        assert torch.equal(got[key], value), key
