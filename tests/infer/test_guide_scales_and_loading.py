"""Ninth audit, the cost of building a mean-field guide and of loading a checkpoint: a guide's
one initial scale is made once and filled (not an inverse softplus in float64 over every entry),
and load() builds the guide without the start values the saved state replaces. The values stay
right: every rho of one scale is one value, the inverse softplus of that scale to rounding (an
elementwise op may round a tensor's tail one ulp apart on some CPUs), the relative scales of
``init_scale_relative`` are still made entry by entry, a saved pair loads bit for bit, and
load() leaves torch's random state alone."""

from __future__ import annotations

import re

import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import (
    MLP,
    BayesianMLP,
    Gaussian,
    MeanFieldGuide,
    bayesian,
    load,
    mean_field_guide,
    predict,
    save,
)
from pyrouq.checkpoint import register_guide

DTYPES = [torch.float32, torch.float64]


def _inverse_softplus(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """softplus^-1 of every entry, in float64, then cast: the guide's documented start."""
    assert scale.dtype == torch.float64
    return (scale + torch.log(-torch.expm1(-scale))).to(dtype)


def _one_scale(rho: torch.Tensor, expected: torch.Tensor) -> None:
    """``rho`` is one value everywhere, the inverse softplus of the scale to the last bits: an
    elementwise op may round a tensor's tail entries (torch's scalar loop) one ulp apart from
    its vectorised ones on some CPUs, so the per-entry reference is compared to rounding."""
    assert bool((rho == rho.reshape(-1)[0]).all())
    eps = torch.finfo(rho.dtype).eps
    torch.testing.assert_close(rho, expected, rtol=2 * eps, atol=0)


def _conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 5 * 5, 3),
    )


def _noise_model() -> nn.Module:
    """A regression network with a learned noise scale: a site on (0, inf), LogNormal guide."""
    net = MLP(in_features=3, hidden_features=5, out_features=2)
    return bayesian(net, likelihood=Gaussian(scale=dist.HalfNormal(torch.tensor(1.0))))


def _equal_states(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("init_scale", [1e-2, 0.05, 0.123456789, 1e-7, 3.0])
def test_one_scale_is_the_inverse_softplus_of_every_entry(dtype, init_scale):
    torch.manual_seed(0)
    model = bayesian(_conv_net()).to(dtype)
    guide = mean_field_guide(model, init_scale=init_scale)
    for site in guide.sites:
        rho = guide.rho[site.replace(".", "__")]
        loc = guide.site_loc(site)
        expected = _inverse_softplus(torch.full(loc.shape, init_scale, dtype=torch.float64), dtype)
        assert rho.dtype == dtype and rho.is_contiguous() and rho.requires_grad
        _one_scale(rho, expected)
        assert torch.equal(loc, model.template()[site])  # the means: the network's values
    # the scale it gives back is the one asked for, to the dtype's rounding
    scale = guide.site_scale(guide.sites[0])
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert torch.allclose(scale, torch.full_like(scale, init_scale), rtol=tol, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relative_scales_stay_entry_by_entry(dtype):
    torch.manual_seed(1)
    trained = MLP(in_features=3, hidden_features=5, out_features=2).to(dtype)
    with torch.no_grad():
        trained.fc1.weight[0, 0] = 0.0  # a weight of 0: the floor of 1e-6
    model = _noise_model().to(dtype)
    guide = mean_field_guide(model, init_from=trained, init_scale_relative=0.1)
    held = dict(trained.named_parameters())
    for site in guide.sites:
        rho = guide.rho[guide._keys[site]]
        if site in guide.positive:  # the noise scale: one relative spread, in log space
            expected = _inverse_softplus(torch.full(rho.shape, 0.1, dtype=torch.float64), dtype)
            _one_scale(rho, expected)
            continue
        assert torch.equal(guide.site_loc(site), held[site])
        scale = (0.1 * held[site].detach().abs().double()).clamp_min(1e-6)
        expected = _inverse_softplus(scale, dtype)
        assert len(expected.unique()) > 1  # per entry, not one value
        assert torch.equal(rho, expected), site  # (one op over the site, as the guide's)
    assert guide.site_scale("fc1.weight")[0, 0].item() == pytest.approx(1e-6, rel=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_init_from_keeps_one_scale_and_takes_the_means(dtype):
    torch.manual_seed(2)
    trained = MLP(in_features=4, hidden_features=6, out_features=3).to(dtype)
    model = BayesianMLP(in_features=4, hidden_features=6, out_features=3).to(dtype)
    guide = mean_field_guide(model, init_scale=0.2, init_from=trained)
    for site in guide.sites:
        loc = guide.site_loc(site)
        assert torch.equal(loc, dict(trained.named_parameters())[site])
        expected = _inverse_softplus(torch.full(loc.shape, 0.2, dtype=torch.float64), dtype)
        _one_scale(guide.rho[guide._keys[site]], expected)


def test_scales_that_are_zero_or_inf_in_the_dtype_are_still_refused():
    model = BayesianMLP(in_features=2, hidden_features=3, out_features=2)
    with pytest.raises(ValueError, match=r"is 0 in torch\.float32"):
        mean_field_guide(model, init_scale=1e-50)
    with pytest.raises(ValueError, match=r"is inf in torch\.float32"):
        mean_field_guide(model, init_scale=1e39)
    guide = mean_field_guide(model.double(), init_scale=1e-50)  # float64 holds it
    assert guide.site_scale("fc1.bias")[0].item() == pytest.approx(1e-50, rel=1e-12)


@pytest.mark.parametrize(
    "dtype, held, lost, least, normal",
    [
        (torch.float16, [1e-6, 5.97e-8, 3e-8], 2.9e-8, "5.96e-08", "6.1e-05"),
        (torch.bfloat16, [1e-39, 9.2e-41, 6.9e-41], 4.5e-41, "9.18e-41", "1.18e-38"),
    ],
)
def test_a_scale_below_the_smallest_normal_is_held_and_the_refusal_names_the_smallest(
    dtype, held, lost, least, normal
):
    # the refusal asked for at least the smallest normal number (float16's 6.1e-05), though
    # the smaller, subnormal scales (1e-06) are held, not 0: only below about half of the
    # smallest positive number (5.96e-08) is a scale 0
    model = BayesianMLP(in_features=2, hidden_features=3, out_features=2).to(dtype)
    smallest = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    for scale in held:
        got = mean_field_guide(model, init_scale=scale).site_scale("fc1.bias").detach()
        assert got.dtype == dtype and float(got.min()) >= smallest  # (rounded, not to 0)
        assert float(got.max()) == pytest.approx(max(scale, smallest), rel=0.5)
    with pytest.raises(ValueError) as info:
        mean_field_guide(model, init_scale=lost)
    assert str(info.value).endswith(
        f"({lost:g}) is 0 in {dtype}, so its KL would be infinite. Pass an init_scale of at "
        f"least {least}, the smallest scale {dtype} holds here; below {normal}, its smallest "
        "normal number, a scale keeps fewer digits and training may overflow (the default "
        "init_scale is 0.01)."
    )
    mean_field_guide(model, init_scale=float(least))  # the advice, taken


def test_the_smallest_float32_scale_named_is_one_the_guide_takes():
    # float32's smallest positive number (1.4e-45) is 0 through torch's vector softplus on a
    # CPU (2.8e-45 is held): the refusal names the smallest scale the same code gives back,
    # not the smallest number, so the advice taken builds the guide whatever the CPU's code
    model = BayesianMLP(in_features=2, hidden_features=3, out_features=2)
    with pytest.raises(ValueError, match=r"is 0 in torch.float32, .* at least ") as info:
        mean_field_guide(model, init_scale=1e-46)
    least = float(re.search(r"at least (\S+), the smallest scale", str(info.value))[1])
    assert least >= torch.finfo(torch.float32).tiny * torch.finfo(torch.float32).eps
    scales = mean_field_guide(model, init_scale=least).site_scale("fc1.weight").detach()
    assert float(scales.min()) > 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "kind, options",
    [
        ("mlp", {}),
        ("conv", {"init_scale": 0.05}),
        ("noise", {"init_scale_relative": 0.1}),
    ],
)
def test_save_load_is_bit_for_bit_and_leaves_the_random_state(tmp_path, dtype, kind, options):
    torch.manual_seed(3)
    makers = {
        "mlp": lambda: BayesianMLP(in_features=3, hidden_features=5, out_features=2),
        "conv": lambda: bayesian(_conv_net()),
        "noise": _noise_model,
    }
    model = makers[kind]().to(dtype)
    if kind == "noise":
        model(torch.randn(4, 3, dtype=dtype))  # the learned scale takes its shape
    guide = mean_field_guide(model, **options)
    with torch.no_grad():  # values no fresh guide has: a trained one
        for param in guide.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    path = save(tmp_path / "c.pt", model, guide)
    skeleton = {"mlp": None, "conv": _conv_net(), "noise": None}[kind]
    if kind == "noise":
        skeleton = MLP(in_features=3, hidden_features=5, out_features=2)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    restored = load(path, module=skeleton)
    assert torch.equal(torch.get_rng_state(), before)
    assert isinstance(restored.guide, MeanFieldGuide)
    _equal_states(restored.guide, guide)
    _equal_states(restored.model, model)
    assert restored.guide.checkpoint_config() == guide.checkpoint_config()
    # and it predicts as the saved pair does, draw for draw
    x = torch.randn(6, 3, 5, 5, dtype=dtype) if kind == "conv" else torch.randn(6, 3, dtype=dtype)
    model.eval()
    torch.manual_seed(11)
    mine = predict(model, x, guide=guide, num_samples=4)
    torch.manual_seed(11)
    theirs = predict(restored.model, x, guide=restored.guide, num_samples=4)
    if kind == "noise":
        assert torch.equal(mine.loc, theirs.loc) and torch.equal(mine.scale, theirs.scale)
    else:
        assert torch.equal(mine.probs, theirs.probs)


@register_guide
class _Audit9Guide(MeanFieldGuide):
    """A registered subclass whose constructor takes its own arguments (and no others)."""

    def __init__(self, model, init_scale=1e-2, init_scale_relative=None, tag="a"):
        super().__init__(model, init_scale, init_scale_relative=init_scale_relative)
        self.tag = tag

    def checkpoint_config(self):
        return {**super().checkpoint_config(), "tag": self.tag}


def test_a_registered_subclass_of_the_guide_still_loads(tmp_path):
    torch.manual_seed(4)
    model = BayesianMLP(in_features=3, hidden_features=4, out_features=2)
    guide = _Audit9Guide(model, init_scale=0.3, tag="b")
    with torch.no_grad():
        for param in guide.parameters():
            param.mul_(1.5)
    restored = load(save(tmp_path / "s.pt", model, guide))
    assert type(restored.guide) is _Audit9Guide and restored.guide.tag == "b"


def _guide_module(tmp_path, monkeypatch, module_name: str, class_name: str):
    """A module ``module_name`` in ``tmp_path``, imported, that registers a MeanFieldGuide
    subclass ``class_name`` (for importlib.reload() of a guide's module)."""
    import importlib

    (tmp_path / f"{module_name}.py").write_text(
        "from pyrouq import MeanFieldGuide\n"
        "from pyrouq.checkpoint import register_guide\n\n\n"
        "@register_guide\n"
        f"class {class_name}(MeanFieldGuide):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(module_name)


def test_a_guide_built_before_its_module_was_reloaded_is_saved(tmp_path, monkeypatch):
    """importlib.reload() of the module of a registered guide class (pyrouq.infer.guide's
    MeanFieldGuide, or one's own, in a notebook) registers the new class under the name: a
    guide built before it was refused by save() and fit(checkpoint=), in self-contradicting
    words ("save() can store a MeanFieldGuide, got MeanFieldGuide"). It is saved now, and
    loads as the class the module now has."""
    import importlib

    module = _guide_module(tmp_path, monkeypatch, "reloaded_guide_module", "ReloadedGuide")
    torch.manual_seed(4)
    model = BayesianMLP(in_features=3, hidden_features=4, out_features=2)
    guide = module.ReloadedGuide(model, init_scale=0.3)
    x = torch.randn(5, 3)
    before = predict(model, x, guide, num_samples=3, progress=False, seed=0)
    module = importlib.reload(module)
    assert type(guide) is not module.ReloadedGuide  # (the old class)
    restored = load(save(tmp_path / "g.pt", model, guide))
    assert type(restored.guide) is module.ReloadedGuide
    again = predict(restored.model, x, restored.guide, num_samples=3, progress=False, seed=0)
    assert torch.equal(again.probs, before.probs)
    _equal_states(restored.guide, guide)


def test_a_run_whose_guide_was_built_before_its_module_was_reloaded_resumes(tmp_path, monkeypatch):
    """fit(resume_from=) asked the guide to be an instance of the class registered under the
    saved name: after importlib.reload() of the guide's module (the twin of save()'s case above)
    a guide built before it was refused as 'trained with a ReloadedRunGuide guide, but guide is
    of class ReloadedRunGuide'. It resumes now, as the run it continues would have gone on."""
    import importlib

    from pyrouq import ArrayLoader, fit

    module = _guide_module(tmp_path, monkeypatch, "reloaded_run_guide", "ReloadedRunGuide")
    torch.manual_seed(4)
    model = BayesianMLP(in_features=3, hidden_features=4, out_features=2)
    guide = module.ReloadedRunGuide(model, init_scale=0.3)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    loader = ArrayLoader(x, y, batch_size=4)
    fit(model, guide, loader, epochs=1, progress=False, seed=0, checkpoint=tmp_path / "r.pt")
    module = importlib.reload(module)
    assert type(guide) is not module.ReloadedRunGuide  # (the old class)
    result = fit(model, guide, loader, epochs=2, progress=False, resume_from=tmp_path / "r.pt")
    assert [record.epoch for record in result.history] == [1, 2]
