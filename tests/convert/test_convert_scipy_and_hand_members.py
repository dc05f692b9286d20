"""Second audit of the converters (bayesian, batchensemble, rank1): independent references
(scipy log-densities, members built by hand from W * outer(s, r)), the rank-1 composition
against rank1(), and the messages of what cannot be converted."""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from scipy import stats
from torch import nn
from torch.nn.utils import parametrizations

import pyrouq
from pyrouq import batchensemble, bayesian, mean_field_guide, predict, rank1


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.ReLU(), nn.Linear(6, 3))


def _x() -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


# -- independent references ----------------------------------------------------------------------


def test_the_log_prior_of_a_trace_is_the_sum_of_scipys_log_densities_under_overlapping_keys():
    net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 3)))
    prior = {  # the longest matching key wins
        "2": dist.Cauchy(0.5, 2.0),
        "2.1": 0.3,
        "2.1.bias": dist.Laplace(0.1, 0.5),
        "0.weight": dist.StudentT(3.0, 0.0, 2.0),
    }
    model = bayesian(net, prior=prior)
    pyro.set_rng_seed(0)
    trace = poutine.trace(model).get_trace(_x())
    trace.compute_log_prob()
    reference = {
        "0.weight": lambda v: stats.t.logpdf(v, 3.0, 0.0, 2.0),
        "0.bias": lambda v: stats.norm.logpdf(v, 0.0, 1.0),  # no key: Normal(0, 1)
        "2.0.weight": lambda v: stats.cauchy.logpdf(v, 0.5, 2.0),
        "2.0.bias": lambda v: stats.cauchy.logpdf(v, 0.5, 2.0),
        "2.1.weight": lambda v: stats.norm.logpdf(v, 0.0, 0.3),
        "2.1.bias": lambda v: stats.laplace.logpdf(v, 0.1, 0.5),
    }
    assert list(model.latent_sites()) == list(reference)
    ours = sum(trace.nodes[s]["log_prob_sum"].item() for s in reference)
    hand = sum(
        f(trace.nodes[s]["value"].detach().double().numpy()).sum() for s, f in reference.items()
    )
    assert ours == pytest.approx(hand, rel=1e-6)


def _hand_member(model, draw, member, x):
    """Member ``member`` of a rank-1 model of _net() under the factors ``draw``, built from
    W * outer(s, r) with torch's functional layers."""
    net = model.net
    first, norm, last = net[0], net[1], net[3]
    w0 = first.weight * torch.outer(draw["0.s"][member], draw["0.r"][member])
    w3 = last.weight * torch.outer(draw["3.s"][member], draw["3.r"][member])
    h = F.linear(x, w0, first.bias[member])
    h = F.layer_norm(h, (6,), norm.weight, norm.bias, norm.eps).relu()
    return F.linear(h, w3, last.bias[member])


def test_predict_order_is_draw_major_against_members_built_by_hand():
    members, k = 3, 4
    model = rank1(_net(), members).eval()
    guide = mean_field_guide(model, init_scale=0.3)
    pyro.set_rng_seed(3)
    draws = {s: torch.stack([guide.sample()[s] for _ in range(k)]) for s in guide.sites}
    x = _x()
    probs = predict(model, x, posterior_samples=draws, progress=False).probs
    assert probs.shape == (k * members, 5, 3)
    with torch.no_grad():
        for d in range(k):
            for m in range(members):
                hand = _hand_member(model, {s: v[d] for s, v in draws.items()}, m, x)
                torch.testing.assert_close(probs[d * members + m], hand.softmax(-1))


def test_unit_factors_make_every_member_the_base_network():
    net = _net().eval()
    model = rank1(net, 3)
    ones = {site: torch.ones(shape) for site, shape in model.latent_sites().items()}
    torch.testing.assert_close(model.outputs(_x(), ones), net(_x()).expand(3, 5, 3), rtol=0, atol=0)
    ensemble = batchensemble(net, 3, r_std=0.0, s_std=0.0)
    torch.testing.assert_close(ensemble.outputs(_x()), net(_x()).expand(3, 5, 3), rtol=0, atol=0)


@pytest.mark.parametrize(
    "options",
    [{}, {"use_base_weights": False}, {"init": "random_sign"}, {"norms": "per_member"}],
)
def test_the_composition_is_rank1_site_for_site_and_draw_for_draw(options):
    composed = {"norms": "shared", **options}
    pyro.set_rng_seed(1)
    front = rank1(_net(), 3, **options)
    pyro.set_rng_seed(1)
    ensemble = batchensemble(_net(), 3, **composed)
    sites = ["0.r", "0.s", "3.r", "3.s"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a prior centred on 1: no warning
        built = bayesian(ensemble, select=sites, prior=dist.Normal(1.0, 0.1))
    assert list(front.latent_sites()) == list(built.latent_sites()) == sites
    assert [str(front.prior_of(s)) for s in sites] == [str(built.prior_of(s)) for s in sites]
    assert str(front.prior_of("0.r")) == "SitePrior(Normal(loc=1, scale=0.1))"
    a, b = front.state_dict(), built.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if options.get("init") == "random_sign":
        assert set(front.template()["0.r"].unique().tolist()) == {-1.0, 1.0}
    guides = []
    for model in (front, built):
        pyro.set_rng_seed(2)
        guides.append(mean_field_guide(model.eval(), init_scale=0.2))
    out = []
    for model, guide in zip((front, built), guides, strict=True):
        pyro.set_rng_seed(4)
        out.append(predict(model, _x(), guide, num_samples=3, progress=False).probs)
    assert out[0].shape == (9, 5, 3)
    assert torch.equal(out[0], out[1])


def test_a_checkpoint_of_a_composition_with_a_dict_prior_round_trips_bit_exactly(tmp_path):
    model = bayesian(
        batchensemble(_net(), 3),
        select=["3.r", "3.s", "1"],
        prior={"3": dist.Normal(1.0, 0.1), "3.s": dist.Normal(1.0, 0.3), "1": 0.5},
    )
    guide = mean_field_guide(model, init_scale=0.2)
    pyrouq.save(tmp_path / "c.pt", model, guide)
    back = pyrouq.load(tmp_path / "c.pt", module=_net())
    a, b = model.state_dict(), back.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert str(back.model.prior_of("3.s")) == "SitePrior(Normal(loc=1, scale=0.3))"
    preds = []
    for m, g in ((model, guide), (back.model, back.guide)):
        pyro.set_rng_seed(5)
        preds.append(predict(m.eval(), _x(), g, num_samples=2, progress=False).probs)
    assert torch.equal(preds[0], preds[1])


# -- defects found -----------------------------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        return self.att(x[:, None], x[:, None], x[:, None])[0][:, 0]


class _Scaled(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def test_a_network_whose_only_linears_stay_plain_is_told_why_not_that_it_has_none():
    # it said "has no nn.Linear or convolution layer", which it has
    with pytest.raises(ValueError, match=r"'att.out_proj' inside a module that reads its layers'"):
        batchensemble(_Attention(), 2)
    with pytest.raises(ValueError, match=r"no nn.Linear or convolution layer a BatchEnsemble can"):
        rank1(_Attention(), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warning naming the subclass kept as it is)
        with pytest.raises(ValueError, match=r"'0' \(_Scaled\): subclasses with a forward of"):
            batchensemble(nn.Sequential(_Scaled(4, 3)), 2)


def _weight_normed():
    return nn.Sequential(parametrizations.weight_norm(nn.Linear(4, 3, bias=False)))


def test_select_that_finds_only_a_parametrized_weight_without_bias_refuses():
    # select="last_layer" made a model with no latent site at all; select=None said the
    # network had no nn.Linear
    with pytest.raises(ValueError, match=r"select='last_layer' picks nothing.*'0.weight' computed"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bayesian(_weight_normed(), select="last_layer")
    with pytest.raises(ValueError, match=r"select=None picks nothing.*remove_parametrizations"):
        bayesian(_weight_normed())
    model = bayesian(_weight_normed(), select=["0"])  # the parametrization's own tensors
    assert list(model.latent_sites()) == [
        "0.parametrizations.weight.original0",
        "0.parametrizations.weight.original1",
    ]


class _Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = self.a
        self.h = nn.Linear(4, 3)

    def forward(self, x):
        return self.h(self.b(self.a(x).relu()))


def test_rank1_of_a_layer_registered_twice_names_the_composition_that_leaves_it_out():
    # rank1() has no select=, which the message told the user to use
    with pytest.raises(ValueError, match=r"rank1\(\) makes every layer's factors latent.*"
                       r"pyrouq.bayesian\(pyrouq.batchensemble\(net, M"):  # fmt: skip
        rank1(_Shared(), 2)
    built = bayesian(batchensemble(_Shared(), 2), select=["h.r", "h.s"], prior=dist.Normal(1, 0.1))
    assert list(built.latent_sites()) == ["h.r", "h.s"]


def test_prior_of_a_site_the_model_does_not_have_is_a_key_error():
    # it returned None (the likelihood's noise prior) for any unknown name
    model = bayesian(_net())
    with pytest.raises(KeyError, match=r"'0.wieght' is not a latent site.*'0.weight'"):
        model.prior_of("0.wieght")
    noisy = bayesian(_net(), likelihood=pyrouq.Gaussian(dist.HalfNormal(1.0)))
    assert str(noisy.prior_of("sigma")) == "SitePrior(HalfNormal(scale=1))"
    assert np.isclose(float(noisy.prior_of("0.bias").scale), 1.0)


def test_a_float_prior_warns_about_the_factors_only_where_factors_are_latent():
    # it warned that the factors were pulled to 0 where only W or the norms were latent
    ensemble = batchensemble(_net(), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = bayesian(ensemble, select=["0.weight", "3.weight"], prior=0.5)
        norms = bayesian(ensemble, select=lambda name, p: name.startswith("1."))
    assert list(weights.latent_sites()) == ["0.weight", "3.weight"]
    assert str(weights.prior_of("3.weight")) == "SitePrior(Normal(loc=0, scale=0.5))"
    assert next(iter(norms.latent_sites())) == "1.norms.0.weight"
    with pytest.warns(
        UserWarning, match=r"prior=0.5 for a BatchEnsemble puts a Normal\(0, 0.5\) prior on the"
    ) as record:
        bayesian(ensemble, select=["0"], prior=0.5)  # 0.weight, 0.r, 0.s, 0.bias
        pyrouq.convert.BayesianNetwork(ensemble, select=["0"], prior=0.5)  # the class itself
    # at the caller's lines: the class built directly named pytest's (stacklevel=4, one frame
    # past bayesian()'s caller)
    said = [w for w in record if "rank-1 factors" in str(w.message)]
    assert {w.filename for w in said} == {__file__}
    # in words for either route: it said "bayesian(BatchEnsemble, prior=0.5) puts ..." to the
    # class built directly too
    assert [str(w.message).split(" puts ")[0] for w in said] == [
        "A float prior=0.5 for a BatchEnsemble"
    ] * 2
    with pytest.warns(UserWarning, match=r"^The prior=\.\.\. for a BatchEnsemble gives the rank-1"):
        pyrouq.convert.BayesianNetwork(ensemble, select=["0"], prior={"0.weight": 0.5})


class _TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        return self.out(self.emb(x).relu())


def test_two_equally_long_prior_keys_naming_one_tied_site_otherwise_are_refused():
    # the key listed last in the dict won, silently
    with pytest.raises(ValueError, match=r"prior keys 'emb' and 'out' both match 'emb.weight'"):
        bayesian(_TiedLM(), prior={"emb": 0.1, "out": 0.2})
    same = bayesian(_TiedLM(), prior={"emb": 0.1, "out": 0.1})
    assert str(same.prior_of("emb.weight")) == "SitePrior(Normal(loc=0, scale=0.1))"
    named = bayesian(_TiedLM(), prior={"emb": 0.1, "out": 0.2, "emb.weight": 0.3})
    assert str(named.prior_of("emb.weight")) == "SitePrior(Normal(loc=0, scale=0.3))"
    longer = bayesian(_TiedLM(), prior={"emb": 0.1, "out.weight": 0.2})  # the longest wins
    assert str(longer.prior_of("emb.weight")) == "SitePrior(Normal(loc=0, scale=0.2))"
    assert str(longer.prior_of("emb.bias")) == "SitePrior(Normal(loc=0, scale=0.1))"


def test_a_noise_prior_takes_the_dtype_of_a_float64_network():
    # HalfNormal(1.0) is made float32: the guide's sigma was float32 in a float64 model
    from pyrouq import ArrayLoader, fit, mean_field_guide
    from pyrouq.likelihoods import Gaussian

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    model = bayesian(net, likelihood=Gaussian(dist.HalfNormal(1.0)))
    assert model.likelihood.noise_prior.scale.dtype == torch.float64
    guide = mean_field_guide(model)
    x, y = torch.randn(20, 2, dtype=torch.float64), torch.randn(20, 1, dtype=torch.float64)
    fit(model, guide, ArrayLoader(x, y, 10, seed=0), epochs=1, progress=False)
    assert guide.site_loc("sigma").dtype == torch.float64
