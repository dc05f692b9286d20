"""fit() of a Pyro model of one's own whose weights are all ``PyroSample`` (no parameters of its
own) on inputs of another dtype than its priors' (float64 from numpy). It failed in torch's
"mat1 and mat2 must have the same dtype, but got Double and Float", on a first fit and on a
second one alike, while predict() casts the inputs to the guide's dtype. Now a guide that holds
parameters (a second fit(), an AutoNormal already built) has the inputs cast to its dtype, as
predict() and as fit() of a pyrouq model (cast to the model's) do; an AutoNormal not built yet
has no dtype to give, and the first fit() says so, naming the priors' dtype and what to do."""

from __future__ import annotations

import re

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import PyroClassifier, sampled_linear, toy_data
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch.utils.data import TensorDataset

import pyrouq


def _fit(model, guide, x, y, **kw):
    return pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=len(x), progress=False, seed=0,
                      **kw)  # fmt: skip


def test_a_first_fit_on_float64_inputs_says_the_priors_dtype_and_what_to_do():
    x, y = toy_data(12)
    model = PyroClassifier(3, 2)
    guide = AutoNormal(model)
    with pytest.raises(TypeError) as info:
        _fit(model, guide, x.double(), y)
    assert str(info.value) == (
        "fit(): PyroClassifier draws its latent sites ('fc.weight', 'fc.bias') in torch.float32, "
        "its priors' dtype, but train_loader's inputs are torch.float64, and torch does not mix "
        "the two (RuntimeError: mat1 and mat2 must have the same dtype, but got Double and "
        "Float). Its guide holds no parameters yet to take the dtype from (a model without "
        "parameters of its own has its inputs cast to its guide's dtype, as predict() and a "
        "later fit() do). Serve the inputs in torch.float32 (x.float(), e.g. "
        "TensorDataset(x.float(), y)), or build PyroClassifier's priors in torch.float64 "
        "(their parameters as torch.float64 tensors). Nothing was trained."
    )
    assert not list(guide.parameters())  # nothing built, nothing trained
    # the fix it names trains
    loader = torch.utils.data.DataLoader(TensorDataset(x.double().float(), y), batch_size=12)
    assert len(pyrouq.fit(model, guide, loader, epochs=1, progress=False).history) == 1


class _Float64Priors(PyroModule):
    """A softmax regression whose priors are float64."""

    def __init__(self):
        super().__init__()
        self.fc = PyroModule[torch.nn.Linear](3, 2)
        zero = torch.zeros((), dtype=torch.float64)
        self.fc.weight = PyroSample(dist.Normal(zero, 1.0).expand([2, 3]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(zero, 1.0).expand([2]).to_event(1))

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_float32_inputs_of_float64_priors_are_told_to_cast_to_float64():
    x, y = toy_data(12)
    model = _Float64Priors()
    with pytest.raises(TypeError) as info:
        _fit(model, AutoNormal(model), x, y)
    message = str(info.value)
    assert message.startswith(
        "fit(): _Float64Priors draws its latent sites ('fc.weight', 'fc.bias') in "
        "torch.float64, its priors' dtype, but train_loader's inputs are torch.float32"
    )
    assert "Serve the inputs in torch.float64 (x.double(), e.g. TensorDataset(x.double(), y))" in (
        message
    )
    # in its own dtype it trains, float64 throughout
    guide = AutoNormal(model)
    _fit(model, guide, x.double(), y)
    assert {p.dtype for p in guide.parameters()} == {torch.float64}


@pytest.mark.parametrize("built_by", ["a first fit", "a call"])
def test_a_guide_holding_parameters_has_float64_inputs_cast_to_its_dtype(built_by):
    """The run on float64 inputs is, to the bit, the run on the same inputs in float32 (the
    reference: x is float32, so x.double() casts back exactly)."""
    x, y = toy_data(12)
    runs = []
    for inputs in (x, x.double()):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = PyroClassifier(3, 2)
        guide = AutoNormal(model)
        if built_by == "a call":
            guide(x, y)  # built on float32 inputs
        else:
            _fit(model, guide, x, y)
        result = _fit(model, guide, inputs, y)
        runs.append(([r.loss for r in result.history], [p.detach() for p in guide.parameters()]))
    assert runs[1][0] == runs[0][0]
    for got, expected in zip(runs[1][1], runs[0][1], strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _OwnBias(PyroClassifier):
    """:class:`PyroClassifier` with a bias that is an ordinary float32 parameter."""

    def __init__(self):
        super().__init__(3, 2)
        self.fc = sampled_linear(3, 2)


def test_a_model_with_a_parameter_of_its_own_is_cast_to_it_on_a_first_fit_as_before():
    """The first fit on float64 inputs is, to the bit, the one on float32 inputs."""
    x, y = toy_data(12)
    runs = []
    for inputs in (x, x.double()):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        model = _OwnBias()
        guide = AutoNormal(model)
        result = _fit(model, guide, inputs, y)
        params = [p.detach() for p in (*model.parameters(), *guide.parameters())]
        runs.append(([r.loss for r in result.history], params))
    assert len(runs[1][0]) == 2 and runs[1][0] == runs[0][0]
    assert len(runs[1][1]) == len(runs[0][1]) > 1
    for got, expected in zip(runs[1][1], runs[0][1], strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _function_guide(dtype):
    """A guide of :class:`PyroClassifier`'s two sites written as a function, whose parameters
    are ``dtype`` tensors."""

    def guide(x, y=None):
        loc = pyro.param("loc", torch.zeros(2, 3, dtype=dtype))
        bias = pyro.param("bias", torch.zeros(2, dtype=dtype))
        pyro.sample("fc.weight", dist.Normal(loc, 0.1).to_event(2))
        pyro.sample("fc.bias", dist.Normal(bias, 0.1).to_event(1))

    return guide


def test_a_function_guide_drawing_in_another_dtype_than_the_inputs_says_so():
    """A guide written as a function has no dtype pyrouq can read to cast the inputs to: fit()
    said torch's 'mat1 and mat2 must have the same dtype' as a failure of the sites' check."""
    x, y = toy_data(12)
    pyro.clear_param_store()
    with pytest.raises(TypeError) as info:
        _fit(PyroClassifier(3, 2), _function_guide(torch.float32), x.double(), y)
    assert str(info.value) == (
        "fit(): the guide function guide() draws PyroClassifier's latent sites ('fc.weight', "
        "'fc.bias') in torch.float32, but train_loader's inputs are torch.float64, and torch "
        "does not mix the two (RuntimeError: mat1 and mat2 must have the same dtype, but got "
        "Double and Float). pyrouq casts the inputs to the dtype of a guide that is a module "
        "holding parameters (an autoguide), not to a function's, whose parameters it cannot "
        "see. Serve the inputs in torch.float32 (x.float(), e.g. TensorDataset(x.float(), y)), "
        "or create the guide's parameters in torch.float64 (pyro.param(name, init) with init a "
        "torch.float64 tensor). Nothing was trained."
    )
    # both fixes it names train, to the same losses (float32 inputs: x itself)
    pyro.clear_param_store()
    served = _fit(PyroClassifier(3, 2), _function_guide(torch.float32), x, y).history
    pyro.clear_param_store()
    created = _fit(PyroClassifier(3, 2), _function_guide(torch.float64), x.double(), y).history
    assert pyro.param("loc").dtype == torch.float64
    assert [r.loss for r in created] == pytest.approx([r.loss for r in served], rel=1e-5)


def test_predict_with_a_function_guide_drawing_in_another_dtype_says_so_as_fit_does():
    """predict() of the same model and guide on float64 inputs said torch's words with 'Check
    that the network takes x (shape, channels, flattening ...)', a fix for shapes."""
    x, _ = toy_data(12)
    pyro.clear_param_store()
    model, guide = PyroClassifier(3, 2), _function_guide(torch.float32)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, x.double(), guide, num_samples=3, progress=False)
    assert str(info.value) == (
        "predict(): the guide function guide() draws PyroClassifier's latent sites ('fc.weight', "
        "'fc.bias') in torch.float32, but x's inputs are torch.float64, and torch does not mix "
        "the two (RuntimeError: mat1 and mat2 must have the same dtype, but got Double and "
        "Float). pyrouq casts the inputs to the dtype of a guide that is a module holding "
        "parameters (an autoguide), not to a function's, whose parameters it cannot see. Pass x "
        "in torch.float32 (x.float()), or create the guide's parameters in torch.float64 "
        "(pyro.param(name, init) with init a torch.float64 tensor)."
    )
    # both fixes it names predict, the same probabilities (float32 inputs: x itself)
    served = pyrouq.predict(model, x, guide, num_samples=3, progress=False, seed=0).probs
    pyro.clear_param_store()
    created = pyrouq.predict(model, x.double(), _function_guide(torch.float64), num_samples=3,
                             progress=False, seed=0).probs  # fmt: skip
    assert served.shape == created.shape == (3, 12, 2)
    torch.testing.assert_close(created.float(), served, rtol=1e-5, atol=1e-6)


def test_predict_from_the_priors_of_a_model_without_weights_names_the_draws_dtype_not_a_cast():
    """predict() of a Pyro model of one's own under its priors (every weight a PyroSample of
    Python floats: float32 draws) on float64 inputs, which it has no weights to cast to, said
    'Give the model one dtype (model.to(torch.float64)) and x that dtype': model.to() leaves
    the priors' draws float32 and it failed the same. It named x in 'the dtype of its draws'
    then, not which (float32), as fit()'s refusal does; it now names the sites, both dtypes and
    both fixes in fit()'s words (a TypeError, as predict()'s other refusals of draws' dtypes)."""
    x, _ = toy_data(12)
    model = PyroClassifier(3, 2)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model.to(torch.float64), x.double(), num_samples=3, progress=False)
    assert str(info.value) == (
        "predict(): PyroClassifier draws its latent sites ('fc.weight', 'fc.bias') in "
        "torch.float32, its priors' dtype, but x is torch.float64, and torch does not mix the "
        "two (RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Float). "
        "It holds no floating parameters to cast x to, nor is there a guide. Pass x in "
        "torch.float32 (x.float()), or build PyroClassifier's priors in torch.float64 (their "
        "parameters as torch.float64 tensors)."
    )
    assert "model.to(" not in str(info.value)
    probs = pyrouq.predict(model, x.float(), num_samples=3, progress=False, seed=0).probs
    assert probs.shape == (3, 12, 2) and probs.dtype == torch.float32


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (lambda: PyroClassifier(3, 2), "It holds no floating parameters"),  # no weights
        (_OwnBias, "its priors draw its latent sites ('fc.weight')"),  # float64 bias
    ],
)
def test_a_refused_predict_from_the_priors_draws_nothing_past_the_run_that_failed(build, said):
    """predict()'s refusal of priors of another dtype than x's reads their sites off a second
    run of the model, which drew from torch's stream: a user who caught the error, cast x and
    ran predict() again got other draws than after the failed run alone. The stream is now
    where that run left it (reference: the model run once on x, failing the same)."""
    x, _ = toy_data(12)
    model = build().to(torch.float64)
    pyro.set_rng_seed(0)
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        model(x.double())
    expected = torch.get_rng_state()
    pyro.set_rng_seed(0)
    with pytest.raises(TypeError, match=re.escape(said)):
        pyrouq.predict(model, x.double(), num_samples=3, progress=False)
    assert torch.equal(torch.get_rng_state(), expected)


def test_a_run_resumed_from_the_param_store_on_float64_inputs_goes_on_as_in_one_process(tmp_path):
    """A run resumed as Pyro's users resume one (the guide's values saved from the param store,
    loaded into it, a new AutoNormal built) on float64 inputs was refused as a first fit is:
    its guide holds no parameters before its first call, which takes the stored float32 ones.
    Now the inputs are cast to theirs; the run is, to the bit, the one continued in-process."""
    x, y = toy_data(12)
    path = tmp_path / "store.pt"
    pyro.clear_param_store()
    model = PyroClassifier(3, 2)
    guide = AutoNormal(model)
    _fit(model, guide, x, y)
    pyro.get_param_store().save(path)
    in_one_process = _fit(model, guide, x.double(), y).history
    expected = {name: value.detach().clone() for name, value in guide.named_parameters()}
    pyro.clear_param_store()
    pyro.get_param_store().load(path)
    model = PyroClassifier(3, 2)
    guide = AutoNormal(model)
    with pytest.warns(UserWarning, match="values you loaded into the store to resume a run"):
        resumed = _fit(model, guide, x.double(), y).history
    assert len(resumed) == 2 and [r.loss for r in resumed] == [r.loss for r in in_one_process]
    got = dict(guide.named_parameters())
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name].detach(), value, rtol=0, atol=0)


def test_the_function_guides_float64_fix_trains_without_clearing_the_store():
    """The refusal's second fix, the guide's parameters created in float64, met the float32
    ones the refused fit() had put in Pyro's param store under those names (pyro.param hands
    the stored value back, not its init): the same refusal again. Now the refused fit() takes
    out what it put there, and leaves the store's other entries as they were."""
    x, y = toy_data(12)
    pyro.clear_param_store()
    pyro.param("kept", torch.ones(2))  # the user's own, from before
    with pytest.raises(TypeError, match=r"create the guide's parameters in torch\.float64"):
        _fit(PyroClassifier(3, 2), _function_guide(torch.float32), x.double(), y)
    assert list(pyro.get_param_store().keys()) == ["kept"]
    history = _fit(PyroClassifier(3, 2), _function_guide(torch.float64), x.double(), y).history
    assert len(history) == 2 and pyro.param("loc").dtype == torch.float64


def test_predicts_refusal_of_a_function_guide_leaves_the_store_as_it_found_it():
    """predict()'s refusal named the same fix as fit()'s, the guide's parameters created in
    float64, but left the float32 ones its refused call had created in Pyro's param store,
    which pyro.param then handed back to the fix: the same refusal again. It takes them out
    now, as fit() does, and leaves the store's other entries."""
    x, _ = toy_data(12)
    pyro.clear_param_store()
    pyro.param("kept", torch.ones(2))  # the user's own, from before
    model = PyroClassifier(3, 2)
    with pytest.raises(TypeError, match=r"create the guide's parameters in torch\.float64"):
        pyrouq.predict(model, x.double(), _function_guide(torch.float32), num_samples=3,
                       progress=False)  # fmt: skip
    assert list(pyro.get_param_store().keys()) == ["kept"]
    probs = pyrouq.predict(model, x.double(), _function_guide(torch.float64), num_samples=3,
                           progress=False).probs  # fmt: skip
    assert probs.shape == (3, 12, 2) and pyro.param("loc").dtype == torch.float64


def test_another_autoguides_entries_in_the_store_leave_a_first_fits_inputs_as_they_are():
    """The resumed run's cast took the dtype of any store entry under 'AutoNormal.': a float64
    one of another model's AutoNormal had a first fit on float32 inputs, which trained before,
    refused as if its inputs were float64. The cast is tried where the inputs as they come
    fail; this fit trains as it does on a store without that entry."""
    x, y = toy_data(12)
    runs = []
    for other in (None, torch.zeros(3, dtype=torch.float64)):
        pyro.clear_param_store()
        if other is not None:
            pyro.param("AutoNormal.locs.w", other)  # another model's guide's, float64
        model = PyroClassifier(3, 2)
        guide = AutoNormal(model)
        runs.append([r.loss for r in _fit(model, guide, x, y).history])
        assert {p.dtype for p in guide.parameters()} == {torch.float32}
    assert len(runs[1]) == 2 and runs[1] == runs[0]


class _PyroConv(PyroModule):
    """A Pyro model of one's own whose one layer is a convolution with a bias, both sampled
    (torch says its dtype error its own way there: 'Input type (double) and bias type (float)
    should be the same')."""

    def __init__(self):
        super().__init__()
        self.conv = PyroModule[torch.nn.Conv2d](1, 2, 3)
        self.conv.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 1, 3, 3]).to_event(4))
        self.conv.bias = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))

    def forward(self, x, y=None):
        logits = self.conv(x).flatten(1)  # (B, 1, 3, 3) images: (B, 2) logits
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _conv_guide(x, y=None):
    """A function guide of :class:`_PyroConv`, drawing in float32."""
    weight = pyro.param("conv_loc", torch.zeros(2, 1, 3, 3))
    bias = pyro.param("conv_bias", torch.zeros(2))
    pyro.sample("conv.weight", dist.Normal(weight, 0.1).to_event(4))
    pyro.sample("conv.bias", dist.Normal(bias, 0.1).to_event(1))


@pytest.mark.parametrize("call", ["fit, a function guide", "predict, a function guide",
                                  "fit, a new AutoNormal"])  # fmt: skip
def test_a_convolutions_words_on_dtypes_get_the_same_refusal(call):
    """The refusals above read torch's words on dtypes as 'dtype' or 'scalar type', which a
    convolution with a bias does not say: fit() said its sites' check failed, predict() to pass
    x in the priors' dtype, not that the guide function draws float32."""
    x = torch.randn(8, 1, 3, 3, dtype=torch.float64)
    y = torch.arange(8) % 2
    pyro.clear_param_store()
    model = _PyroConv()
    said = (
        "draws _PyroConv's latent sites ('conv.weight', 'conv.bias') in torch.float32"
        if "function" in call
        else "_PyroConv draws its latent sites ('conv.weight', 'conv.bias') in torch.float32"
    )
    with pytest.raises(TypeError) as info:
        if call.startswith("predict"):
            pyrouq.predict(model, x, _conv_guide, num_samples=2, progress=False)
        else:
            guide = _conv_guide if "function" in call else AutoNormal(model)
            _fit(model, guide, x, y)
    message = str(info.value)
    assert said in message
    assert "(RuntimeError: Input type (double) and bias type (float) should be the same)" in message


class _CallableGuide:
    """:func:`_function_guide`'s guide as an instance whose class has ``__call__``."""

    def __call__(self, x, y=None):
        return _function_guide(torch.float32)(x, y)


@pytest.mark.parametrize(
    "kind, named",
    [
        ("partial", "the guide function guide()"),
        ("lambda", "the guide function"),
        ("callable", "the guide _CallableGuide, a callable,"),
    ],
)
def test_a_function_guide_is_named_by_what_it_runs(kind, named):
    """A functools.partial of the guide was named 'the guide function partial()', a lambda
    '<lambda>()' and a callable instance 'G()', as if a class were called."""
    import functools

    x, _ = toy_data(12)
    guide = {
        "partial": functools.partial(_function_guide(torch.float32), y=None),
        "lambda": lambda x, y=None: _function_guide(torch.float32)(x, y),
        "callable": _CallableGuide(),
    }[kind]
    pyro.clear_param_store()
    with pytest.raises(TypeError) as info:
        pyrouq.predict(PyroClassifier(3, 2), x.double(), guide, num_samples=2, progress=False)
    assert str(info.value).startswith(
        f"predict(): {named} draws PyroClassifier's latent sites ('fc.weight', 'fc.bias') in "
        "torch.float32, but x's inputs are torch.float64"
    ), str(info.value)


class _SampledIds(PyroModule):
    """Ids through a sampled embedding, then a sampled linear layer: no weights of its own."""

    def __init__(self, through_embedding=True):
        super().__init__()
        self.through_embedding = through_embedding
        self.emb = PyroModule[torch.nn.Embedding](5, 3)
        self.emb.weight = PyroSample(dist.Normal(0.0, 1.0).expand([5, 3]).to_event(2))
        self.fc = sampled_linear(3, 2, bias_scale=1.0)

    def forward(self, x, y=None):
        h = self.fc(self.emb(x).sum(-2) if self.through_embedding else x[:, :3])
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=h), obs=y)
        return h


def test_integer_ids_at_a_layer_of_draws_are_told_of_draws_not_of_floating_weights():
    """Integer ids sent past the embedding of a model made only of PyroSample weights were told
    'a layer of floating weights got it': it holds none. The words name its draws now, and the
    forward the fix names (ids through the embedding first) predicts."""
    ids = torch.randint(0, 5, (6, 4), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError) as info:
        pyrouq.predict(_SampledIds(through_embedding=False), ids, num_samples=2, progress=False)
    assert str(info.value).endswith(
        "x reached the model as torch.int64, as it came (a model holding an nn.Embedding or "
        "nn.EmbeddingBag takes integer inputs), and a layer computing with floating draws of its "
        "priors got it (the model holds no weights of its own: every weight is a PyroSample). In "
        "the forward, send ids through the embedding before such a layer, and features to it as "
        "floats of its draws' dtype (x.float(): priors of Python numbers draw in torch's default "
        "dtype, torch.float32)."
    )
    assert "floating weights got it" not in str(info.value)
    probs = pyrouq.predict(_SampledIds(), ids, num_samples=2, progress=False, seed=0).probs
    assert probs.shape == (2, 6, 2) and probs.dtype == torch.float32


class _MakesDouble(PyroClassifier):
    """A model of PyroSample weights whose forward makes a float64 tensor (or one in x's dtype)."""

    def __init__(self, in_x_dtype=False):
        super().__init__(3, 2)
        self.in_x_dtype = in_x_dtype

    def forward(self, x, y=None):
        dtype = x.dtype if self.in_x_dtype else torch.float64
        return super().forward(x.to(dtype) @ torch.eye(3, dtype=dtype), y)


def test_inputs_cast_to_the_guide_of_a_model_of_draws_are_not_told_to_call_model_to():
    """predict() of a model of PyroSample weights with a fitted AutoNormal (x cast to its
    float32) whose forward makes a float64 tensor said 'Give the model one dtype
    (model.to(torch.float32))', which changes no draw and no tensor the forward makes: it failed
    the same. It names the tensors its forward makes now, and the forward that makes them in
    x's dtype predicts."""
    x, y = toy_data(12)
    pyro.clear_param_store()
    model = _MakesDouble(in_x_dtype=True)
    guide = AutoNormal(model)
    _fit(model, guide, x, y)
    model.in_x_dtype = False
    with pytest.raises(ValueError) as info:
        pyrouq.predict(model.to(torch.float32), x, guide, num_samples=2, progress=False)
    assert str(info.value).endswith(
        "x reached the model as torch.float32, its guide's dtype, which it was cast to (the "
        "model holds no floating weights for model.to() to change: every weight is a PyroSample "
        "the guide draws), and a draw or a tensor its forward makes is of another dtype. Make "
        "the tensors in x's dtype (torch.ones(..., dtype=x.dtype), t.to(x.dtype)), and the guide "
        "and the priors of that dtype."
    )
    assert "model.to(torch" not in str(info.value)
    model.in_x_dtype = True  # the fix followed: the forward's tensor in x's dtype
    probs = pyrouq.predict(model, x.double(), guide, num_samples=2, progress=False, seed=0).probs
    assert probs.shape == (2, 12, 2) and probs.dtype == torch.float32


def test_a_model_under_poutine_condition_is_named_with_its_handler_in_the_dtype_refusal():
    """The refusal named a poutine-wrapped model by the partial Pyro makes of it
    ('_bound_partial draws its latent sites ...; build _bound_partial's priors'), and a model
    function as 'function'; it now names both as name_of() does, the priors by the model's."""
    from pyro import poutine

    x, _ = toy_data(12)
    model = PyroClassifier(3, 2)
    held = poutine.condition(model, data={"fc.bias": torch.zeros(2)})
    with pytest.raises(TypeError) as info:
        pyrouq.predict(held, x.double(), num_samples=3, progress=False)
    assert str(info.value).startswith(
        "predict(): PyroClassifier (under poutine.condition) draws its latent sites "
        "('fc.weight') in torch.float32, its priors' dtype, but x is torch.float64"
    )
    assert str(info.value).endswith(
        "or build PyroClassifier's priors in torch.float64 (their parameters as torch.float64 "
        "tensors)."
    )
