"""Review 11b: a frozen SyncBatchNorm (eval mode) passes fit()'s CPU process-group check, a
model of one's own with a plate or a latent of a fixed size N (or reading a parameter already
in Pyro's param store) has its latent sites named by to_inference_data(model, None, x, y), and
fit() words a first batch of one input on its own."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import ArrayLoader, Gaussian, bayesian, fit, mean_field_guide, to_inference_data

QUIET = {"progress": False}

# --------------------------------------------------------------------------------------------
# 1. SyncBatchNorm on the CPU in a process group: refused only where it would train
# --------------------------------------------------------------------------------------------


def _sync_model() -> nn.Module:
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    return bayesian(nn.SyncBatchNorm.convert_sync_batchnorm(net))


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


def test_a_frozen_sync_batchnorm_trains_on_the_cpu_in_a_gloo_group(gloo_group):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = _sync_model()
    model.net[1].eval()  # frozen, as fit() documents
    before = model.net[1].running_mean.clone()
    x, y = _data(8)
    result = fit(model, mean_field_guide(model), [(x, y)], epochs=1, num_data=8, **QUIET)
    assert len(result.losses) == 1
    torch.testing.assert_close(model.net[1].running_mean, before)  # not trained


def _refusal(held: nn.Module, model: nn.Module) -> str:
    """fit()'s refusal of ``held`` (``model``, or a wrapper of it) on 8 examples, in words."""
    x, y = _data(8)
    with pytest.raises(ValueError) as info:
        fit(held, mean_field_guide(model), [(x, y)], epochs=1, num_data=8, **QUIET)
    return str(info.value)


def test_a_sync_batchnorm_in_training_mode_is_still_refused(gloo_group):
    pyro.clear_param_store()
    model = _sync_model()
    text = _refusal(model, model)
    assert "holds SyncBatchNorm layers (net.1)," in text
    assert "Torch synchronises them in training mode only, and these are in training mode" in text
    assert "For a run on cpu, build the network with BatchNorm layers instead" in text
    assert "or freeze such a layer with .eval()" in text
    assert "in eval mode: fit() switches" not in text


def test_a_frozen_sync_batchnorm_of_a_model_left_in_eval_mode_is_refused(gloo_group):
    pyro.clear_param_store()
    model = _sync_model()
    model.eval()  # fit() switches it all to training mode: the layer would train
    assert (
        "BayesianNetwork is in eval mode (model.eval() leaves a model so, and so do fit() "
        "and load()), and fit() switches a model in eval mode to training mode throughout"
    ) in _refusal(model, model)
    # in DataParallel (DDP takes no SyncBatchNorm on the CPU), named as the wrapper the user
    held = nn.DataParallel(model)  # holds names it (was: BayesianNetwork, 'net.1')
    held.eval()
    text = _refusal(held, model)
    assert "fit() runs BayesianNetwork (in DataParallel) on cpu in a " in text
    assert "SyncBatchNorm layers (module.net.1), which " in text
    assert "(here model.get_submodule('module.net.1').eval(); " in text


# --------------------------------------------------------------------------------------------
# 2. to_inference_data(model, None, x, y) of a model of one's own
# --------------------------------------------------------------------------------------------

N = 20


def _own_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 3, generator=g), torch.randint(0, 2, (N,), generator=g)


def test_a_model_with_a_plate_of_fixed_size_has_its_sites_named():
    seen = []

    def fixed_plate(x, y=None):
        seen.append(x.shape[0])
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        with pyro.plate("data", N):
            pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)

    x, y = _own_data()
    with pytest.raises(ValueError, match=r"fixed_plate samples the latent sites \['w'\] but"):
        to_inference_data(fixed_plate, None, x, y)
    assert seen == [2, N]  # two rows first, then the whole data once


def test_a_model_with_a_latent_per_training_point_has_its_sites_named():
    def local_latent(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        z = pyro.sample("z", dist.Normal(torch.zeros(N, 2), 1.0).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=x @ w + z), obs=y)

    x, y = _own_data()
    with pytest.raises(ValueError, match=r"local_latent samples the latent sites \['w', 'z'\]"):
        to_inference_data(local_latent, None, x, y)


def test_a_model_reading_a_stored_param_has_its_sites_named_and_the_store_kept():
    pyro.clear_param_store()
    noise = pyro.param("review11b_noise", torch.ones(2))

    def with_noise(x, y=None):
        scale = pyro.param("review11b_noise")  # made before: read, no initial value
        shift = pyro.param("review11b_new", torch.zeros(2))
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=(x @ w + shift) * scale), obs=y)

    x, y = _own_data()
    try:
        with pytest.raises(ValueError, match=r"with_noise samples the latent sites \['w'\]"):
            to_inference_data(with_noise, None, x, y)
        store = pyro.get_param_store()
        assert list(store.keys()) == ["review11b_noise"]  # the new one not left behind
        assert pyro.param("review11b_noise") is noise
    finally:
        pyro.clear_param_store()


def test_a_model_failing_on_its_whole_data_too_is_told_it_ran_on_x_y():
    def broken(x, y=None):
        pyro.sample("w", dist.Normal(0.0, 1.0))
        raise RuntimeError("review11b: the model's own bug")

    x, y = _own_data()
    with pytest.raises(ValueError) as info:
        to_inference_data(broken, None, x, y)
    assert str(info.value).startswith(
        "to_inference_data(): broken could not be traced to find its latent sites (run as "
        "model(x, y), it raised RuntimeError: review11b: the model's own bug), and guide is None."
    )
    assert isinstance(info.value.__cause__, RuntimeError)


# --------------------------------------------------------------------------------------------
# 3. fit()'s first batch of one input, worded on its own
# --------------------------------------------------------------------------------------------

_FIRST_OF_ONE = (
    "Batch 1 of epoch 1 holds 1 input of shape (3,), and a BatchNorm in training mode needs 2 "
    "or more inputs per batch to normalise them (torch: 'Expected more than 1 value per "
    "channel'). Give batches of 2 or more inputs (more examples, or a larger batch_size), or "
    "freeze the BatchNorm with .eval() (it then normalises with its running statistics; one "
    "built with track_running_stats=False takes its batch's statistics in eval mode too)."
)


def _bn_model() -> nn.Module:
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    return bayesian(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)))


def test_fit_words_a_loader_of_one_example_as_a_first_batch():
    model = _bn_model()
    x, y = _data(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    with pytest.raises(ValueError) as info:
        fit(model, mean_field_guide(model), loader, epochs=1, **QUIET)
    assert str(info.value) == _FIRST_OF_ONE
    assert "drop_last" not in str(info.value)


def test_a_frozen_batchnorm_trains_on_a_first_batch_of_one_as_told():
    model = _bn_model()
    model.net[1].eval()
    x, y = _data(3)
    loader = [(x[:1], y[:1]), (x[1:], y[1:])]
    result = fit(model, mean_field_guide(model), loader, epochs=1, num_data=3, **QUIET)
    assert len(result.losses) == 1


def test_fit_words_a_later_batch_of_one_as_before():
    model = _bn_model()
    x, y = _data(5)
    with pytest.raises(ValueError) as info:
        fit(
            model,
            mean_field_guide(model),
            [(x[:4], y[:4]), (x[4:], y[4:])],
            epochs=1,
            num_data=5,
            **QUIET,
        )
    assert str(info.value) == (
        "Batch 2 of epoch 1 holds 1 input(s) of shape (3,), and a BatchNorm in training mode "
        "needs more than one value per channel to normalise it (torch: 'Expected more than 1 "
        "value per channel'). That is usually the last batch of an epoch: drop it "
        "(DataLoader(..., drop_last=True)) or pick a batch size that leaves no remainder of 1."
    )


def test_an_array_loaders_last_batch_of_one_is_told_batch_sizes_not_drop_last():
    """A regression's ArrayLoader of 17 rows in batches of 8 was told to 'drop it
    (DataLoader(..., drop_last=True))', an option ArrayLoader has not; it is told the batch
    sizes nearest its own that leave no batch of one."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net, likelihood=Gaussian("heteroscedastic"))
    x, _ = _data(17)
    loader = ArrayLoader(x, x[:, 0], batch_size=8, seed=0)
    with pytest.raises(ValueError) as info:
        fit(model, mean_field_guide(model), loader, epochs=1, **QUIET)
    assert str(info.value).endswith(
        "(torch: 'Expected more than 1 value per channel'). That is the last batch of the "
        "epoch: 17 examples in batches of 8 leave 1, and ArrayLoader has no drop_last: pass "
        "batch_size=7 or batch_size=9 (no batch of one), or leave one example out."
    )
    assert "DataLoader" not in str(info.value)


@pytest.mark.parametrize(
    ("n", "size", "told"),
    [(3, 2, "pass batch_size=3 (no batch"), (13, 12, "pass batch_size=11 or batch_size=13 (no"),
     (43, 6, "pass batch_size=5 or batch_size=8 (no")],  # (4 and 8 as near: the larger told)
)  # fmt: skip
def test_the_batch_sizes_told_for_a_batch_of_one_include_one_batch_of_all(n, size, told):
    """The sizes told were looked for below N only: 3 examples in batches of 2 were told
    'pass  (no batch of one)', no size at all, and 13 in batches of 12 sizes 10 and 11, not
    13 (one batch of all), nearer than 10."""
    pyro.clear_param_store()
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net, likelihood=Gaussian("heteroscedastic"))
    x, _ = _data(n)
    loader = ArrayLoader(x, x[:, 0], batch_size=size, seed=0)
    with pytest.raises(ValueError) as info:
        fit(model, mean_field_guide(model), loader, epochs=1, **QUIET)
    assert f"{n} examples in batches of {size} leave 1, and ArrayLoader has no drop_last: " in str(
        info.value
    )
    assert told in str(info.value)


@pytest.mark.parametrize("kind", ["ArrayLoader", "DataLoader"])
def test_a_last_batch_of_one_known_from_the_sizes_is_refused_before_any_step(kind, tmp_path):
    """17 examples in batches of 8 were refused at batch 3, after the epoch's first two steps
    had trained the guide and the BatchNorm's statistics; an in-memory loader's sizes tell the
    batch of one before training: the same words come at the first step, before its update
    (no parameter, no statistic changed, no callback, no checkpoint)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = _bn_model()
    guide = mean_field_guide(model)
    x, y = _data(17)
    if kind == "ArrayLoader":
        loader = ArrayLoader(x, y, batch_size=8, seed=0)
        advice = "and ArrayLoader has no drop_last: pass batch_size=7 or batch_size=9"
    else:
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True
        )
        advice = "drop it (DataLoader(..., drop_last=True)) or pick a batch size that leaves"
    guide(x[:2])  # (its parameters made, to compare)
    before = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    statistics = {k: v.clone() for k, v in model.state_dict().items()}
    seen: list[object] = []
    path = tmp_path / "run.pt"
    with pytest.raises(ValueError) as info:
        fit(model, guide, loader, epochs=2, callbacks=[seen.append], checkpoint=path, **QUIET)
    text = str(info.value)
    assert text.startswith(
        "Batch 3 of epoch 1 holds 1 input(s) of shape (3,), and a BatchNorm in training mode "
        "needs more than one value per channel to normalise it (torch: 'Expected more than 1 "
        "value per channel')."
    )
    assert advice in text
    after = dict(pyro.get_param_store().items())
    assert all(torch.equal(before[k], after[k].detach()) for k in before)  # nothing trained
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in statistics.items())
    assert seen == [] and not path.exists()


def test_a_batchnorm_of_images_takes_a_last_batch_of_one_as_before():
    # (1, C, H, W) holds H * W values per channel: torch normalises it, nothing is refused
    pyro.clear_param_store()
    net = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2)
    )
    model = bayesian(net)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(17, 1, 6, 6, generator=g), torch.arange(17) % 2
    loader = ArrayLoader(x, y, batch_size=8, seed=0)
    result = fit(model, mean_field_guide(model), loader, epochs=1, **QUIET)
    assert result.steps == 3


def _two_views(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    # each example twice (two augmented views): a last example alone is a batch of 2 rows
    xb, yb = torch.utils.data.default_collate(items)
    return torch.cat([xb, xb + 0.1]), torch.cat([yb, yb])


@pytest.mark.parametrize("kind", ["collate_fn of two views", "sampler of 16 of 17"])
def test_a_loader_whose_last_batch_is_not_one_row_is_not_refused_at_its_first_step(kind):
    """The first-step watch read 17 examples in batches of 8 as a last batch of one where
    the loader's collate_fn serves two rows an example (its last batch: 2 rows) or its sampler
    serves 16 of the 17 (no third batch): both trained were refused 'Batch 3 of epoch 1 holds
    1 input(s)' before any step. Where the batches are not the dataset's sizes, nothing is
    watched: they train."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = _bn_model()
    x, y = _data(17)
    data = torch.utils.data.TensorDataset(x, y)
    if kind == "collate_fn of two views":
        loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=_two_views)
        n, steps = 34, 3
    else:
        order = torch.utils.data.SequentialSampler(range(16))
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=order)
        n, steps = 16, 2
    with warnings.catch_warnings():  # (num_data=16 of the dataset's 17: warned of, as meant)
        warnings.filterwarnings("ignore", "fit\\(num_data=16\\) is below the 17 examples")
        result = fit(model, mean_field_guide(model), loader, epochs=1, num_data=n, **QUIET)
    assert result.steps == steps
