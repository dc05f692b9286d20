"""A Pyro user's own model (PyroSample priors, obs in a subsampled plate) and autoguides through
fit() and KLWeightedELBO: param-store clashes, forwards fit cannot call, messenger guides and
targets outside the likelihood's support."""

from __future__ import annotations

import math
import re
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import PyroClassifier, RaisesItsOwn
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoGuideList,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
    AutoNormal,
    AutoNormalMessenger,
)
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq
from pyrouq._param_store import store_taken_fix


def sampled(layer: nn.Linear) -> nn.Linear:
    out, inp = layer.weight.shape
    layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([out, inp]).to_event(2))
    layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([out]).to_event(1))
    return layer


class BNN(PyroModule):
    """Pyro's tutorial classifier: PyroSample weights, obs in plate("data", N, subsample)."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.fc1 = sampled(PyroModule[nn.Linear](4, hidden))
        self.fc2 = sampled(PyroModule[nn.Linear](hidden, 3))
        self.num_data = 48

    def forward(self, x, y=None):
        logits = self.fc2(F.relu(self.fc1(x)))
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


class Counts(PyroModule):
    """One linear predictor observed through ``likelihood(predictor)``: Poisson or Bernoulli."""

    def __init__(self, likelihood):
        super().__init__()
        self.fc = sampled(PyroModule[nn.Linear](4, 1))
        self.observe = likelihood
        self.num_data = 48

    def forward(self, x, y=None):
        out = self.fc(x).squeeze(-1)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", self.observe(out), obs=y)
        return out


def data(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def batches(x, y, size=24):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def fit(model, guide, x, y, **kw):
    return pyrouq.fit(model, guide, batches(x, y), epochs=1, num_data=48, progress=False, **kw)


# -- Pyro's global param store ----------------------------------------------------------------


def _bayesian(hidden):
    return pyrouq.bayesian(nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3)))


@pytest.mark.parametrize(
    "build, autoguide, problem",
    [
        (BNN, AutoNormal, r"shapes disagree at site 'fc[12]\.(weight|bias)'"),
        (BNN, AutoDiagonalNormal, r"RuntimeError: shape '\[16\]' is invalid"),
        (_bayesian, AutoNormal, r"\(the guide draws site '0\.weight' of shape \(8, 4\), the "
         r"model samples it of shape \(16, 4\)\)\. Call"),
    ],
)  # fmt: skip
def test_a_new_autoguide_that_took_another_sized_models_parameters_is_told_why(
    build, autoguide, problem
):
    """A second model of the same class but other sizes, with a new autoguide, in the same
    session: the autoguide took the first one's tensors from the param store by name. fit()
    said "Pass a guide built for this model (AutoNormal(model) ...)", which the user had done
    (AutoNormal), or gave torch's bare "shape '[16]' is invalid for input of size 3"
    (AutoDiagonalNormal) or "The size of tensor a (8) must match ..." (pyrouq.bayesian)."""
    x, y = data()
    first = build(8)
    fit(first, autoguide(first), x, y)
    second = build(16)
    with pytest.raises(ValueError, match=r"took \d+ parameter\(s\) \(") as err:
        fit(second, autoguide(second), x, y)
    message = str(err.value)
    assert "from Pyro's param store" in message
    assert "pyro.clear_param_store()" in message
    assert "module_local_params=True" in message
    assert "Pass a guide built for this model" not in message
    assert f"do not fit {type(second).__name__} (" in message
    assert re.search(problem, message)
    pyro.clear_param_store()  # the way out it names
    second = build(16)
    assert fit(second, autoguide(second), x, y).steps == 2


def test_an_error_the_store_cannot_cause_is_not_blamed_on_it():
    """A guide list whose parts both sample '2.bias' (a mean-field guide of every site and an
    AutoDelta of that one), built again in a store that holds the first build's tensors (a
    notebook's cell run twice): fit() said the new guide's taking them did not fit and told
    to clear the store, which changes nothing; Pyro's own words, as in an empty store, name
    the fault. (A guide that took tensors of other shapes is still told of the store: the
    test above.)"""
    x, y = data()

    def build(hidden):
        model = _bayesian(hidden)
        guide = AutoGuideList(model)
        guide.append(pyrouq.mean_field_guide(model))
        guide.append(AutoDelta(pyro.poutine.block(model, expose=["2.bias"])))
        return model, guide

    for _ in range(2):  # an empty store, then one holding the first build's tensors
        with pytest.raises(RuntimeError, match=r"Multiple sample sites named '2\.bias'"):
            fit(*build(8), x, y)


def _caller(call, model, x, y):
    """``call`` (predict, to_inference_data or psis_diagnostic) of ``model`` on ``x, y``, as a
    function of the guide."""
    return {
        "predict": lambda g: pyrouq.predict(model, x, g, num_samples=2, progress=False),
        "to_inference_data": lambda g: pyrouq.to_inference_data(model, g, x, y, num_samples=2),
        "psis_diagnostic": lambda g: pyrouq.psis_diagnostic(model, g, x, y, num_samples=25),
    }[call]


def test_a_store_loaded_from_a_model_of_other_sizes_is_told_how_to_keep_its_values():
    # it was told to build the models in the run's order or to clear the store, which loses
    # the loaded values; building them as the run did (its sizes too) keeps them
    model = _bayesian(16)
    model.num_data = 48
    guide = pyrouq.mean_field_guide(model)
    pyro.get_param_store()[f"{guide.name}$$$loc.0__weight"] = torch.zeros(8, 4)  # (a run's)
    with pytest.raises(ValueError) as err:
        pyrouq.predict(model, torch.randn(3, 4), guide, num_samples=2, progress=False)
    assert str(err.value).startswith(
        f"Pyro's param store holds '{guide.name}$$$loc.0__weight' of shape (8, 4), but the "
        "parameter of that name has shape (16, 4): the store was loaded from another model"
    )
    assert str(err.value).endswith(
        "To use the stored values, build them as the run that saved the store did (the same "
        "sizes, in the same order) before loading it; or call pyro.clear_param_store() and "
        "restore them with pyrouq.save() / pyrouq.load()."
    )


@pytest.mark.parametrize("call", ["predict", "to_inference_data", "psis_diagnostic"])
def test_an_autoguide_built_for_the_model_that_took_another_ones_values_is_told_why(call):
    """A second pyrouq model of other sizes and its new AutoNormal, run once, in the session
    of a first one fitted: the autoguide took the first one's tensors from the param store by
    name. predict() and the diagnostics said "Pass the guide built for this model", which it
    was; they now say what fit() says (clear the store). A guide built for another model
    keeps the old words."""
    x, y = data()
    first = _bayesian(8)
    first_guide = AutoNormal(first)
    fit(first, first_guide, x, y)
    second = _bayesian(16)
    second.num_data = 48
    guide = AutoNormal(second)
    guide(x[:2], y[:2])  # (predict() asks for an autoguide that has run)
    run = _caller(call, second, x, y)
    with pytest.raises(
        ValueError, match=r"site '0\.weight' has shape \(8, 4\) in the guide"
    ) as err:
        run(guide)
    message = str(err.value)
    assert "The guide (AutoNormal) was built for this model, but took the values" in message
    assert "('AutoNormal.locs.0.weight', " in message and "pyro.clear_param_store()" in message
    assert "Pass the guide built for this model" not in message
    with pytest.raises(ValueError, match="Pass the guide built for this model"):
        run(first_guide)  # (another model's guide: the advice stands)
    # the store is named for the model the guide was built for only; and only where a draw's
    # shape differs from the one it was built with (leading dims of 1 aside)
    assert store_taken_fix(_bayesian(16), guide, {"0.weight": (8, 4)}) is None
    assert store_taken_fix(second, guide, {"0.weight": (1, 16, 4)}) is None
    assert store_taken_fix(second, guide, {"0.weight": (2, 16, 4)}) is not None
    pyro.clear_param_store()  # the way out it names
    second = _bayesian(16)
    guide = AutoNormal(second)
    fit(second, guide, x, y)
    _caller(call, second, x, y)(guide)  # (of the model built anew, not the first run's)


class _OwnForward(pyrouq.BayesianNetwork):
    """A pyrouq model with a forward of its own (the built-in one's steps, spelt out)."""

    def forward(self, x, y=None):
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        logits = self.outputs(x, weights)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_an_autoguide_that_took_another_ones_values_is_told_why_where_its_forward_runs():
    """to_inference_data() of a pyrouq model with a forward of its own checks the draws on
    that forward (conditioned_sites), which was not given the guide: an AutoNormal built for
    it that took the first model's tensors from the param store was told "Pass the guide
    fitted with this model", which it was, where the other paths say to clear the store."""
    x, y = data()
    first = _OwnForward(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=48)
    first_guide = AutoNormal(first)
    fit(first, first_guide, x, y)
    second = _OwnForward(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)), num_data=48)
    guide = AutoNormal(second)
    guide(x[:2], y[:2])

    def run(g):
        return pyrouq.to_inference_data(second, g, x, y, num_samples=2)

    with pytest.raises(ValueError, match=r"site '0\.weight' has shape \(8, 4\) there") as err:
        run(guide)
    message = str(err.value)
    assert "The guide (AutoNormal) was built for this model, but took the values" in message
    assert "('AutoNormal.locs.0.weight', " in message and "pyro.clear_param_store()" in message
    assert "Pass " not in message
    with pytest.raises(ValueError, match="Pass the guide built for this model"):
        run(first_guide)  # (another model's guide: the advice stands)
    pyro.clear_param_store()  # the way out it names
    second = _OwnForward(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)), num_data=48)
    guide = AutoNormal(second)
    fit(second, guide, x, y)
    run(guide)


@pytest.mark.parametrize(
    "call, problem",
    [
        ("predict", r"site 'fc1\.weight' has shape \(8, 4\) there but \(16, 4\) in the model"),
        # (the site Pyro names first is one of a set's: fc2's in some processes)
        ("to_inference_data", r"shapes disagree at site 'fc[12]\.(weight|bias)'"),
        ("psis_diagnostic", r"shapes disagree at site 'fc[12]\.(weight|bias)'"),
    ],
)
def test_an_autoguide_built_for_ones_own_model_that_took_another_ones_values_is_told_why(
    call, problem
):
    """As for a pyrouq model, so for a Pyro model of one's own: a second BNN of other sizes
    and its new AutoNormal took the first one's tensors from the param store by name.
    predict() and the diagnostics said "Pass the guide fitted with this model" / "Pass a
    guide built for this model", which it was; they now say to clear the store. A guide
    built for another model keeps the old words."""
    x, y = data()
    first = BNN(8)
    first_guide = AutoNormal(first)
    fit(first, first_guide, x, y)
    second = BNN(16)
    guide = AutoNormal(second)
    guide(x[:2], y[:2])  # (predict() asks for an autoguide that has run)
    run = _caller(call, second, x, y)
    with pytest.raises(ValueError, match=problem) as err:
        run(guide)
    message = str(err.value)
    assert "The guide (AutoNormal) was built for this model, but took the values" in message
    assert "('AutoNormal.locs.fc1.weight', " in message and "pyro.clear_param_store()" in message
    assert "module_local_params=True" in message and "Pass " not in message
    old = "Pass the guide fitted with this model" if call == "predict" else "Pass a guide built"
    with pytest.raises(ValueError, match=old):
        run(first_guide)  # (another model's guide: the advice stands)
    # clearing the store loses its values (the fitted or loaded ones): it says how to keep them
    assert (
        "another model's, fitted or loaded before. To use the stored values, build the model "
        "with the sizes they have (the guide's shapes above) and a new guide, which takes them; "
        "to fit this model instead, call pyro.clear_param_store()" in message
    )
    again = BNN(8)
    taken = AutoNormal(again)
    taken(x[:2], y[:2])
    assert torch.equal(taken.locs.fc1.weight, first_guide.locs.fc1.weight)  # the stored values
    _caller(call, again, x, y)(taken)
    pyro.clear_param_store()  # the other way out it names
    second = BNN(16)
    guide = AutoNormal(second)
    fit(second, guide, x, y)
    _caller(call, second, x, y)(guide)  # (of the model built anew, not the first run's)


class _SizedByX(PyroModule):
    """A linear classifier with one weight row per column of x: its site's shape is x's."""

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1], 3]).to_event(2))
        logits = x @ w
        with pyro.plate("data", 48, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_an_autoguide_drawing_the_shapes_it_was_built_with_is_not_said_to_have_taken_the_store():
    """The param store was named for any autoguide built for the model whose draws did not
    fit: predict() of a model sized by x, given wider x, said the guide "took the values
    Pyro's param store held ...: another model's" and to clear the store, which is untrue and
    no fix. Its guide draws the shapes it was built with: it took nothing."""
    x, y = data()
    model = _SizedByX()
    guide = AutoNormal(model)
    fit(model, guide, x, y)
    wide = torch.randn(5, 6)
    with pytest.raises(ValueError, match=r"site 'w' has shape \(4, 3\) there but \(6, 3\)") as err:
        pyrouq.predict(model, wide, guide, num_samples=2, progress=False)
    assert "param store" not in str(err.value), str(err.value)
    # nor to pass the guide fitted with this model, which it is (as the message said after the
    # store's words went): the x it was fitted on, which the line below passes
    assert "Pass the guide fitted with this model" not in str(err.value)
    assert str(err.value).endswith(
        "The guide (AutoNormal) was built for this model and draws the shapes it was built "
        "with; the model's sites take other shapes now (on x of another shape than the guide "
        "was fitted on, or the model changed since). Pass x of the shape the guide was fitted "
        "on, or a guide built and fitted for the model as it is now."
    )
    assert pyrouq.predict(model, wide[:, :4], guide, num_samples=2, progress=False).probs.shape == (
        2,
        5,
        3,
    )


class _SizedByAnAttribute(_SizedByX):
    """As :class:`_SizedByX` with ``classes`` outputs: changing it changes the site's shape."""

    def __init__(self, classes=3):
        super().__init__()
        self.classes = classes

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1], self.classes]).to_event(2))
        with pyro.plate("data", 48, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)
        return x @ w


def test_an_autoguide_of_a_model_changed_since_is_not_told_only_to_pass_other_x():
    """bd2efce told a guide drawing the shapes it was built with that the model's sites take
    other shapes "on this x" and to pass x of the shape the guide was fitted on: for a model
    changed since it was fitted (here its number of classes), x is that shape already, and
    passing it again fails the same way. The message names both causes and the way out that
    works for a changed model: a guide fitted for the model as it is now."""
    x, y = data()
    model = _SizedByAnAttribute()
    guide = AutoNormal(model)
    fit(model, guide, x[:, :4], y)
    model.classes = 5
    with pytest.raises(ValueError, match=r"site 'w' has shape \(4, 3\) there but \(4, 5\)") as err:
        pyrouq.predict(model, x[:5, :4], guide, num_samples=2, progress=False)
    assert "on this x. " not in str(err.value), str(err.value)
    assert "or the model changed since" in str(err.value), str(err.value)
    pyro.clear_param_store()
    guide = AutoNormal(model)  # the way out: a guide fitted for the model as it is now
    fit(model, guide, x[:, :4], y % 5)
    assert pyrouq.predict(model, x[:5, :4], guide, num_samples=2, progress=False).probs.shape == (
        2,
        5,
        5,
    )


def test_a_new_autoguide_of_a_same_sized_model_is_still_warned_of_not_refused():
    x, y = data()
    first = BNN()
    fit(first, AutoNormal(first), x, y)
    second = BNN()
    with pytest.warns(UserWarning, match=r"BNN's guide took 8 parameter\(s\).*shares the tensors"):
        fit(second, AutoNormal(second), x, y)


# -- forwards that fit() cannot call as model(x, y) ----------------------------------------


def test_a_forward_of_the_inputs_alone_is_refused_before_training_naming_y():
    """fit() calls model(x, y): a PyroModule whose forward takes x alone failed with Python's
    bare "forward() takes 2 positional arguments but 3 were given"."""

    class InputsOnly(PyroModule):
        def __init__(self):
            super().__init__()
            self.num_data = 48

        def forward(self, x):
            mu = pyro.sample("mu", dist.Normal(torch.zeros(4), 1.0).to_event(1))
            with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
                pyro.sample("obs", dist.Normal(mu, 1.0).to_event(1), obs=x)
            return mu

    x, y = data()
    model = InputsOnly()
    with pytest.raises(TypeError, match=r"forward\(x\) takes them otherwise: it takes no targets"):
        fit(model, AutoNormal(model), x, y)

    class KeywordOnly(InputsOnly):
        def forward(self, x, *, y=None):
            return super().forward(x)

    model = KeywordOnly()
    with pytest.raises(TypeError, match=r"its y is keyword-only, and fit\(\) passes it second"):
        fit(model, AutoNormal(model), x, y)


# -- guides that run the model (pyro.infer.autoguide's messenger guides) ---------------------


def test_a_messenger_guide_trains_without_a_false_guide_site_warning():
    """AutoNormalMessenger runs the model inside the guide, so the guide's trace holds the
    model's observed 'obs'. Pyro's Trace_ELBO leaves it out (GuideMessenger.get_traces);
    KLWeightedELBO in SVI and fit() warned "Found non-auxiliary vars in guide but not model,
    consider marking these infer={'is_auxiliary': True}: {'obs'}" at every run."""
    x, y = data()
    model = BNN()
    guide = AutoNormalMessenger(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), pyrouq.KLWeightedELBO(1.0))
        svi.step(x[:24], y[:24])
        fit(model, guide, x, y)
    pyro.set_rng_seed(3)
    ours = pyrouq.KLWeightedELBO(1.0).loss(model, guide, x[:24], y[:24])
    pyro.set_rng_seed(3)
    pyros = Trace_ELBO().loss(model, guide, x[:24], y[:24])
    assert ours == pytest.approx(pyros, rel=1e-6)


# -- targets outside the model's likelihood ---------------------------------------------------


@pytest.mark.parametrize("shift, low, high", [(2, 2, 4), (-1, -1, 1)])
@pytest.mark.parametrize("in_memory", [False, True])
def test_labels_outside_an_own_classifiers_classes_are_refused_before_training(
    shift, low, high, in_memory
):
    """The model's Categorical 'obs' states C = 3: fit() failed on torch's "index 4 is out of
    bounds for dimension 1 with size 3" (or "index -1"), naming no label."""
    x, y = data()
    model = BNN()
    loader = pyrouq.ArrayLoader(x, y + shift, batch_size=24) if in_memory else batches(x, y + shift)
    with pytest.raises(
        ValueError,
        match=rf"labels in \[{low}, {high}\], expected class indices in \[0, 2\] for a model with "
        r"3 classes",
    ):
        pyrouq.fit(model, AutoNormal(model), loader, epochs=1, num_data=48, progress=False)


@pytest.mark.parametrize(
    "family, targets, described, shown",
    [
        ("categorical", lambda y: y.float() + 0.5, "Categorical: integers in [0, 2]", "0.5"),
        ("poisson", lambda y: y.float() + 0.5, "Poisson: integers >= 0", "0.5"),
        ("bernoulli", lambda y: y.float(), "Bernoulli: 0 or 1", "2.0"),
    ],
)
def test_real_valued_targets_outside_a_discrete_likelihoods_support_are_refused(
    family, targets, described, shown
):
    """fit() trains with Pyro's validation off, which would have refused these: a Categorical
    read 0.5 as class 0 and 2.5 as class 2, a Poisson took 2.5 as a count, a Bernoulli a 2
    as a label, and fit() trained on them without a word."""
    x, y = data()
    if family == "categorical":
        model = BNN()
    else:
        make = dist.Poisson if family == "poisson" else dist.Bernoulli
        model = Counts(
            (lambda out: make(out.exp())) if family == "poisson" else (lambda o: make(logits=o))
        )
    with pytest.raises(ValueError, match=r"target\(s\) outside the support of") as err:
        fit(model, AutoNormal(model), x, targets(y))
    message = str(err.value)
    assert f"'s 'obs' site ({described})" in message
    assert f"e.g. [{shown}" in message
    assert "give targets in that support" in message


def test_real_valued_targets_inside_a_discrete_support_still_train():
    x, y = data()
    model = BNN()
    assert fit(model, AutoNormal(model), x, y.float()).history[0].loss > 0  # as Pyro takes them
    model = Counts(lambda o: dist.Bernoulli(logits=o))
    assert fit(model, AutoNormal(model), x, (y > 0).float()).history[0].loss > 0


class _TakesItsOwn(PyroModule):
    """A Bernoulli/Binomial 'obs' the model judges itself: soft labels with validate_args=False,
    labels -1 masked as missing, or a count bound per example (the inputs' last column)."""

    def __init__(self, kind):
        super().__init__()
        self.fc = sampled(PyroModule[nn.Linear](4, 1))
        self.kind = kind

    def forward(self, x, y=None):
        out = self.fc(x).squeeze(-1)
        with pyro.plate("data", 48, subsample_size=x.shape[0]):
            if self.kind == "soft":
                fn = dist.Bernoulli(logits=out, validate_args=False)
            elif self.kind == "masked":
                fn = dist.Bernoulli(logits=out).mask(y >= 0 if y is not None else True)
            else:
                fn = dist.Binomial(x[:, -1].round().abs() + 1, logits=out)
            pyro.sample("obs", fn, obs=y)
        return out


@pytest.mark.parametrize("kind", ["soft", "masked", "per_example"])
def test_targets_the_model_takes_itself_are_not_judged_by_the_support(kind):
    """Pyro's SVI trains these, and fit() did before its support check refused them: soft
    labels under validate_args=False, missing labels masked out, and a per-example count
    bound read from a first batch of one example (its bound then held for every batch)."""
    x, y = data()
    if kind == "soft":
        t = x[:, 0].sigmoid()
    elif kind == "masked":
        t = torch.where(y == 2, -1.0, (y > 0).float())
    else:
        x[:, -1] = torch.where(torch.arange(48) == 0, 0.0, 8.0)  # bounds 1, then 9
        t = torch.where(torch.arange(48) == 0, 1.0, 5.0)
    model = _TakesItsOwn(kind)
    loader = [(x[:1], t[:1]), (x[1:], t[1:])]
    result = pyrouq.fit(model, AutoNormal(model), loader, epochs=1, num_data=48, progress=False)
    assert math.isfinite(result.history[0].loss)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("my own check: x must be standardised"),
        RuntimeError("Expected setup() to be called before forward()"),  # 'Expected': not torch's
        NotImplementedError("no half here"),
    ],
)
def test_fit_passes_a_networks_own_error_through_unchanged(error):
    # fit()'s first pass restated every RuntimeError as a ValueError about the loader's shapes
    model = pyrouq.bayesian(RaisesItsOwn(error, out_features=3))
    loader = pyrouq.ArrayLoader(torch.randn(8, 2), torch.randint(0, 3, (8,)), 4, seed=0)
    with pytest.raises(type(error), match=f"^{re.escape(str(error))}$"):
        pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=1, progress=False)
    # torch's own shape error is still restated, naming x
    shaped = pyrouq.bayesian(nn.Linear(5, 3))
    with pytest.raises(ValueError, match=r"failed on the first examples of train_loader \(x of "):
        pyrouq.fit(shaped, pyrouq.mean_field_guide(shaped), loader, epochs=1, progress=False)


class _TargetsRequired(PyroClassifier):
    def forward(self, x, y):  # no default: fit() runs, predictions cannot
        return super().forward(x, y)


def test_predict_tells_how_to_use_a_guide_that_never_ran_or_runs_the_model():
    # Pyro's "Continuous inference cannot handle discrete sample site 'obs'" and its advice
    # to enumerate or hide the site, which do not apply
    pyro.clear_param_store()
    model, x = PyroClassifier(), torch.randn(6, 2)
    advice = r"Run it once on training data first, guide\(x_train\[:2\], y_train\[:2\]\)"
    with pytest.raises(ValueError, match=r"the guide AutoNormal has not run yet: .* " + advice):
        pyrouq.predict(model, x, AutoNormal(model), num_samples=2, progress=False)
    guide = AutoNormal(model)
    guide(x, torch.randint(0, 3, (6,)))  # the advice, taken: predictions run
    assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 6, 3)
    with pytest.raises(ValueError, match=r"AutoNormalMessenger runs the model at every call"):
        pyrouq.predict(model, x, AutoNormalMessenger(model), num_samples=2, progress=False)


@pytest.mark.parametrize(
    "autoguide",
    [AutoNormal, AutoDiagonalNormal, AutoMultivariateNormal, AutoLowRankMultivariateNormal,
     AutoDelta],
)  # fmt: skip
def test_the_guide_that_never_ran_follows_the_advice_itself_and_predicts(autoguide):
    # predict() ran it on x alone; every autoguide but AutoNormal kept the trace it took,
    # without the parameters it failed to make: Pyro's own words, and the advice followed
    # (guide(x, y)), predict() and fit() raised "object has no attribute 'loc'"
    pyro.clear_param_store()
    model, x, y = PyroClassifier(), torch.randn(6, 2), torch.randint(0, 3, (6,))
    guide = autoguide(model)
    with pytest.raises(ValueError, match=rf"the guide {autoguide.__name__} has not run yet: "):
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert guide.prototype_trace is None  # as it came
    guide(x[:2], y[:2])  # the advice, taken by this guide
    assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 6, 3)
    result = pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=6, progress=False)
    assert math.isfinite(result.history[-1].loss)


class _LabelSite(PyroClassifier):
    """Its labels observed at a site of another name than "obs": no trace of the model tells
    the guide's run on x alone that it would meet them."""

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("label", dist.Categorical(logits=logits), obs=y)
        return logits


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDiagonalNormal, AutoDelta])
def test_a_guide_that_never_ran_failing_on_a_site_not_named_obs_is_told_it_has_not_run(autoguide):
    # past the check of "obs", the guide's own run fails on the labels' site: that failed run
    # (not predict()) is what leaves it unbuilt, its store entries gone; AutoDiagonalNormal and
    # AutoDelta set their trace before failing, and were told the words of a GuideMessenger
    # ("runs the model at every call ... AutoNormalMessenger(...)"), which they are not
    pyro.clear_param_store()
    model, x, y = _LabelSite(), torch.randn(6, 2), torch.randint(0, 3, (6,))
    guide = autoguide(model)
    with pytest.raises(ValueError, match=rf"the guide {autoguide.__name__} has not run yet: .*"
                       r"guide\(x_train\[:2\], y_train\[:2\]\)") as told:  # fmt: skip
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert "AutoNormalMessenger" not in str(told.value)
    assert guide.prototype_trace is None  # as it came
    assert list(pyro.get_param_store().keys()) == []
    guide(x[:2], y[:2])  # the advice, taken by this guide
    assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 6, 3)


def test_a_messenger_whose_labels_site_is_not_named_obs_is_told_to_hide_that_site():
    # its words named hide=['obs'], whatever site Pyro's words named: that advice, taken, met
    # the same refusal (the labels' site 'label' still unhidden)
    pyro.clear_param_store()
    model, x = _LabelSite(), torch.randn(6, 2)
    with pytest.raises(ValueError, match=r"runs the model at every call") as told:
        pyrouq.predict(model, x, AutoNormalMessenger(model), num_samples=2, progress=False)
    assert "AutoNormalMessenger(poutine.block(model, hide=['label']))" in str(told.value)
    guide = AutoNormalMessenger(pyro.poutine.block(model, hide=["label"]))  # the advice
    assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 6, 3)


class _LearnedNoise(Counts):
    """A regression whose noise scale is a ``pyro.param`` of the model's own."""

    def __init__(self):
        super().__init__(None)

    def forward(self, x, y=None):
        out = self.fc(x).squeeze(-1)
        noise = pyro.param("noise", torch.tensor(1.0), constraint=dist.constraints.positive)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Normal(out, noise), obs=y)
        return out


def test_the_refusal_of_a_guide_that_never_ran_leaves_no_parameter_of_the_models_trace():
    # predict() traces the model on x alone to find "obs" unobserved before the guide runs;
    # the model's own pyro.param made in that trace goes with the refusal, as the guide's do
    pyro.clear_param_store()
    model, x = _LearnedNoise(), data()[0]
    with pytest.raises(
        ValueError, match=r"AutoNormal has not run yet: .*'obs' on the inputs alone\)\.$"
    ):
        pyrouq.predict(model, x, AutoNormal(model), num_samples=2, progress=False)
    assert list(pyro.get_param_store().keys()) == []


class _LabelSiteTempered(_LabelSite):
    """A ``_LabelSite`` whose logits are divided by a ``pyro.param`` of the model's own."""

    def forward(self, x, y=None):
        logits = self.fc(x) / pyro.param("temperature", torch.tensor(2.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("label", dist.Categorical(logits=logits), obs=y)
        return logits


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDiagonalNormal])
def test_a_guide_refused_past_the_check_of_obs_leaves_no_parameter_of_the_models_trace(autoguide):
    # the trace of the model looking for "obs" found none (the labels' site is 'label') and
    # kept the pyro.param it made; the guide's failed run then removed only its own entries
    pyro.clear_param_store()
    model, x = _LabelSiteTempered(), torch.randn(6, 2)
    with pytest.raises(ValueError, match=rf"the guide {autoguide.__name__} has not run yet"):
        pyrouq.predict(model, x, autoguide(model), num_samples=2, progress=False)
    assert list(pyro.get_param_store().keys()) == []


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDiagonalNormal, AutoDelta])
def test_a_regression_guide_that_never_ran_is_refused_by_predict_and_left_unbuilt(autoguide):
    # real-valued targets: the run on x alone went through, the guide took the model's "obs"
    # (sampled, no targets) for a latent site of 6 values for good, and predict() said nothing;
    # fit() and Pyro's Predictive after it met that site (AutoDiagonalNormal's loc of 9 values)
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood="gaussian")
    x, y = torch.randn(6, 2), torch.randn(6, 1)
    guide = autoguide(model)
    with pytest.raises(
        ValueError,
        match=rf"the guide {autoguide.__name__} has not run yet: .*guide\(x_train\[:2\], "
        r"y_train\[:2\]\).*\(its model samples the targets' site 'obs' on the inputs alone\)",
    ):
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert guide.prototype_trace is None  # as it came, and its parameters out of the store
    assert [k for k in pyro.get_param_store().keys() if "obs" in k] == []
    assert list(pyro.get_param_store().keys()) == []
    model.num_data = 6  # (the model's own refusal says so, where the guide's run meets it)
    guide(x[:2], y[:2])  # the advice
    assert "obs" not in guide.prototype_trace.nodes  # (observed: not the guide's)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "Found non-auxiliary vars in guide but not model")
        preds = pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        result = pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=6, progress=False)
    assert preds.loc.shape == (2, 6, 1)
    assert math.isfinite(result.history[-1].loss)


def _classifier_or_regression(targets: str) -> tuple:
    """A model of one's own with its data: class labels, or real-valued targets."""
    if targets == "classes":
        return PyroClassifier(in_features=4), *data()
    return Counts(lambda out: dist.Normal(out, 1.0)), data()[0], torch.randn(48)


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDiagonalNormal, AutoDelta])
@pytest.mark.parametrize("targets", ["classes", "real"])
def test_the_elbo_without_labels_leaves_a_guide_that_never_ran_unbuilt(autoguide, targets):
    # built on x alone, the guide took "obs" for a latent site: Pyro's words to enumerate it
    # (classes; AutoDiagonalNormal and AutoDelta then broken for good), or a number (real
    # targets), then at every call with the labels a warning of a guide site 'obs'
    pyro.clear_param_store()
    model, x, y = _classifier_or_regression(targets)
    guide, elbo = autoguide(model), pyrouq.KLWeightedELBO()
    told = rf"not given \(y=None\), and the guide {autoguide.__name__} has not run yet: "
    told += r".*place \('obs'\) for"  # (quoted as predict()'s words quote it; it was "obs")
    with pytest.raises(ValueError, match=r"needs the labels, which were " + told):
        elbo.loss(model, guide, x)
    assert guide.prototype_trace is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "Found non-auxiliary vars in guide but not model")
        assert math.isfinite(elbo.loss(model, guide, x, y))
    assert (
        "obs" not in guide.prototype_trace.nodes
        or guide.prototype_trace.nodes["obs"]["is_observed"]
    )


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDiagonalNormal, AutoDelta])
def test_predict_leaves_a_guide_that_never_ran_unbuilt_for_real_targets(autoguide):
    # built on x alone, the guide took the regression's "obs" (real-valued: no error of
    # Pyro's) for a latent site, its entries in the param store, and predict() warned of a
    # guide site 'obs' holding a value per input before refusing the outputs; fit() after it
    # warned "Found non-auxiliary vars in guide but not model"
    pyro.clear_param_store()
    model = Counts(lambda out: dist.Normal(out, 1.0))
    x, y = data()[0], torch.randn(48)
    guide = autoguide(model)
    told = rf"{autoguide.__name__} has not run yet: .*\(its model samples the targets' site 'obs' "
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning of a latent site 'obs')
        with pytest.raises(ValueError, match=told + r"on the inputs alone\)\.$"):
            pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        assert guide.prototype_trace is None
        assert list(pyro.get_param_store().keys()) == []
        result = fit(model, guide, x, y)
    assert math.isfinite(result.history[-1].loss)
    assert "obs" not in guide.prototype_trace.nodes  # (observed: hidden from it)
    messenger = AutoNormalMessenger(model)
    told = r"AutoNormalMessenger runs the model at every call.*site 'obs' on the inputs alone\)"
    with pytest.raises(ValueError, match=told):
        pyrouq.predict(model, x, messenger, num_samples=2, progress=False)
    assert not [k for k in pyro.get_param_store().keys() if k.endswith("obs")]


@pytest.mark.parametrize("targets", ["classes", "real"])
def test_the_elbo_without_labels_refuses_a_messenger_that_would_guide_the_targets(targets):
    # it runs the model at every call: on x alone it drew "obs" as a latent site, Pyro's words
    # to enumerate it (classes) or a number (real targets), and kept a loc and scale for it
    pyro.clear_param_store()
    model, x, y = _classifier_or_regression(targets)
    guide, elbo = AutoNormalMessenger(model), pyrouq.KLWeightedELBO()
    told = r"not given \(y=None\), and the guide AutoNormalMessenger runs the model at every"
    with pytest.raises(ValueError, match=r"needs the labels, which were " + told):
        elbo.loss(model, guide, x)
    assert list(pyro.get_param_store().keys()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isfinite(elbo.loss(model, guide, x, y))  # the way out given
    assert not any("obs" in name for name in pyro.get_param_store().keys())
    blocked = AutoNormalMessenger(pyro.poutine.block(model, hide=["obs"]))
    with warnings.catch_warnings(), pytest.raises(ValueError, match=r"site 'obs' was not obs"):
        warnings.simplefilter("ignore")  # (Pyro's "Found vars in model but not guide" first)
        elbo.loss(model, blocked, x)  # it does not draw "obs": refused as before


def test_predict_of_a_forward_whose_targets_have_no_default_names_the_contract():
    pyro.clear_param_store()
    model, x = _TargetsRequired(), torch.randn(6, 2)
    guide = AutoNormal(model)
    guide(x, torch.randint(0, 3, (6,)))
    with pytest.raises(TypeError, match=r"_TargetsRequired cannot run on the inputs alone .*"
                       r"Write forward\(x, y=None\)"):  # fmt: skip
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)


class _HelperMissesAnArgument(PyroClassifier):
    def helper(self, logits, scale):
        return logits * scale

    def forward(self, x, y=None):
        return self.helper(super().forward(x, y))  # the user's own bug, inside the forward


class _RefusesLargeInputs(PyroClassifier):
    def forward(self, x, y=None):
        if x.abs().max() > 50:
            raise ValueError("this model expects standardised inputs")
        return super().forward(x, y)


def test_errors_from_inside_a_model_are_not_relabelled_as_its_contract_or_its_guides():
    # an inner call's TypeError was told "Write forward(x, y=None)", which it has; a guide
    # that runs the model was told it "runs the model at every call" for the model's own error
    pyro.clear_param_store()
    model, x = _HelperMissesAnArgument(), torch.randn(6, 2)
    with pytest.raises(TypeError, match=r"^_HelperMissesAnArgument\.helper\(\) missing 1 requ"):
        pyrouq.predict(model, x, num_samples=2, progress=False)  # (from its priors)
    pyro.clear_param_store()
    model = _RefusesLargeInputs()
    guide = AutoNormalMessenger(pyro.poutine.block(model, hide=["obs"]))  # the advice given
    assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 6, 3)
    with pytest.raises(ValueError, match=r"^this model expects standardised inputs\s"):
        pyrouq.predict(model, x * 100, guide, num_samples=2, progress=False)


class _NamesItsLikelihood(PyroClassifier):
    """A Pyro model of the user's own with an attribute of its own named ``likelihood``."""

    def __init__(self):
        super().__init__()
        self.likelihood = "categorical"  # a note of the user's, no pyrouq Likelihood


def test_an_attribute_named_likelihood_of_the_users_own_is_not_taken_for_pyrouqs():
    # fit() and predict() read it as a pyrouq likelihood: "'str' object has no attribute ..."
    pyro.clear_param_store()
    x, y = torch.randn(16, 2), torch.randint(0, 3, (16,))
    model = _NamesItsLikelihood()
    guide = AutoNormal(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=16, progress=False)  # all N
    preds = pyrouq.predict(model, x, guide, num_samples=3, progress=False)
    assert preds.probs.shape == (3, 16, 3)
    torch.testing.assert_close(preds.probs.sum(-1), torch.ones(3, 16))
