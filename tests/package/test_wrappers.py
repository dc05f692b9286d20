"""A model in the wrappers a user trains with (DistributedDataParallel, DataParallel,
torch.compile), passed on to the rest of the API: pyrouq's models give the results of the
module they wrap (pyrouq/_wrappers.py). DDP runs in a one-process gloo group (no ranks
spawned)."""

import re

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq import ArrayLoader, batchensemble, bayesian, mean_field_guide, predict, rank1
from pyrouq._wrappers import given_model, uncompiled, under_handlers

DDP = nn.parallel.DistributedDataParallel
DP = nn.DataParallel


def _net():
    torch.manual_seed(0)  # (a LayerNorm: DDP refuses a module without a trained parameter)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def _data(n=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_a_wrapped_ensemble_or_rank1_network_predicts_as_the_module_it_wraps(gloo_group):
    # predict(DDP(batchensemble(net, 2)), x) took the wrapper's forward, (M, B, C), for one
    # batch's outputs: "Outputs per pixel or per time step ... are not supported"; a rank-1
    # network's 'logits' site of shape (2, 6, 3) was refused the same way
    x, y = _data(6)
    ensemble = batchensemble(_net(), 2)
    low_rank = rank1(_net(), 2, num_data=6)
    guide = mean_field_guide(low_rank)
    want = predict(ensemble, x, progress=False).probs
    drawn = predict(low_rank, x, guide, num_samples=2, seed=0, progress=False).probs
    for wrap in (DDP, DP):
        assert torch.equal(predict(wrap(ensemble), x, progress=False).probs, want)
        got = predict(wrap(low_rank), x, guide, num_samples=2, seed=0, progress=False).probs
        assert torch.equal(got, drawn)
    rows = pyrouq.evaluate_rotations(DDP(ensemble), x, y, angles=(0,), normalized=False,
                                     progress=False)  # fmt: skip
    same = pyrouq.evaluate_rotations(ensemble, x, y, angles=(0,), normalized=False,
                                     progress=False)  # fmt: skip
    assert rows == same


def test_the_diagnostics_and_mcmc_take_a_wrapped_bayesian_model(gloo_group):
    # to_inference_data(DDP(bayesian(net)), guide) exported other draws than the module under
    # one seed (it went the way of a Pyro model of one's own), and of a rank-1 network it
    # refused 'obs' of shape (2, 6); mcmc() refused the wrapper as no pyrouq Bayesian model
    x, y = _data(6)
    model = bayesian(_net(), num_data=6)
    guide = mean_field_guide(model)
    want = pyrouq.to_inference_data(model, guide, x, y, num_samples=3, seed=0)
    for wrap in (DDP, DP):
        got = pyrouq.to_inference_data(wrap(model), guide, x, y, num_samples=3, seed=0)
        assert got.posterior["0.bias"].values.tolist() == want.posterior["0.bias"].values.tolist()
        k = pyrouq.psis_diagnostic(wrap(model), guide, x, y, num_samples=25, seed=0).k_hat
        assert k == pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25, seed=0).k_hat
    low_rank = rank1(_net(), 2, num_data=6)
    low_guide = mean_field_guide(low_rank)
    want = pyrouq.to_inference_data(low_rank, low_guide, x, y, num_samples=2, seed=0)
    got = pyrouq.to_inference_data(DDP(low_rank), low_guide, x, y, num_samples=2, seed=0)
    assert got.log_likelihood["obs"].shape == want.log_likelihood["obs"].shape == (1, 2, 6)
    assert got.log_likelihood["obs"].values.tolist() == want.log_likelihood["obs"].values.tolist()
    small = bayesian(nn.Sequential(nn.Linear(4, 2), nn.LayerNorm(2)), num_data=6)
    runs = [
        pyrouq.mcmc(m, x, y % 2, num_samples=3, warmup_steps=2, num_chains=1, seed=0,
                    progress=False, parallel=False, max_tree_depth=2)
        for m in (small, DDP(small))
    ]  # fmt: skip
    assert torch.equal(runs[1].samples["0.weight"], runs[0].samples["0.weight"])


def test_mean_field_guide_of_a_wrapped_model_or_from_a_wrapped_trained_network(gloo_group):
    # mean_field_guide(DDP(model)) said it "needs a pyrouq Bayesian model ... got
    # DistributedDataParallel"; init_from=DDP(trained) "has no parameter(s) ['0.weight', ...]"
    model = bayesian(_net())
    trained = _net()
    with torch.no_grad():
        trained[0].weight.add_(1.0)
    want = mean_field_guide(model, init_from=trained)
    for wrap in (DDP, DP):
        guide = mean_field_guide(wrap(model), init_from=wrap(trained))
        assert torch.equal(guide.site_loc("0.weight"), want.site_loc("0.weight"))
    with pytest.raises(TypeError, match=r"init_from is a Bayesian model \(BayesianNetwork\)"):
        mean_field_guide(model, init_from=DDP(model))


def test_fit_trains_a_pyrouq_model_in_data_parallel_as_its_module():
    # fit(DataParallel(batchensemble(net, 2))) read the wrapper's (M, B, C) outputs as one
    # batch's ("Outputs per pixel ... are not supported"), and of a Bayesian model it failed
    # on the first batch ("num_data is not set": the wrapper's forward, not the model's)
    x, y = _data()
    losses = []
    for wrap in (lambda m: m, DP):
        for make in (lambda: batchensemble(_net(), 2), lambda: bayesian(_net())):
            model = make()
            guide = mean_field_guide(model) if isinstance(model, pyrouq.BayesianNetwork) else None
            result = pyrouq.fit(wrap(model), guide, ArrayLoader(x, y, 4, shuffle=False),
                                epochs=1, progress=False, seed=0)  # fmt: skip
            losses.append(result.history[-1].loss)
    assert losses[2:] == losses[:2]


def test_which_wrappers_the_api_sees_through(gloo_group):
    # a pyrouq model comes out of every wrapper (fit() keeps torch.compile's); any other
    # network out of DDP only (its forward would broadcast the buffers to the other ranks),
    # a DataParallel kept (its forward splits the batch over devices, the same outputs)
    ensemble = batchensemble(_net(), 2)
    assert given_model(DP(DDP(ensemble))) is ensemble
    plain = _net()
    assert given_model(DDP(plain)) is plain
    kept = DP(plain)
    assert given_model(kept) is kept
    assert given_model(DDP(kept)) is kept
    assert given_model(plain) is plain and given_model(None) is None


def test_a_compiled_batchensemble_predicts_as_the_module():
    # predict(torch.compile(batchensemble(net, 2)), x) failed as DDP's did: "OptimizedModule.
    # forward returned outputs of shape (2, 6, 3) for 6 inputs"
    x, _ = _data(6)
    ensemble = batchensemble(_net(), 2)
    try:
        compiled = torch.compile(ensemble, backend="eager")
    except Exception as err:  # pragma: no cover - a torch without dynamo
        pytest.skip(f"torch.compile unavailable: {err}")
    assert given_model(compiled) is ensemble
    assert given_model(compiled, keep_compiled=True) is compiled
    want = predict(ensemble, x, progress=False).probs
    assert torch.equal(predict(compiled, x, progress=False).probs, want)


def _compile(module):
    try:
        return torch.compile(module, backend="eager")
    except Exception as err:  # pragma: no cover - a torch without dynamo
        pytest.skip(f"torch.compile unavailable: {err}")


def test_fit_trains_a_compiled_batchensemble_as_the_module(gloo_group):
    # fit(torch.compile(batchensemble(net, 2))) took the compiled wrapper (no PyroModule) for
    # a plain network and its (M, B, C) outputs for one batch's: "Outputs per pixel or per
    # time step ... are not supported"; torch.compile(DDP(...)) failed on "num_data is not set"
    x, y = _data()
    loader = ArrayLoader(x, y, 8, shuffle=False)
    reference = batchensemble(_net(), 2)
    want = pyrouq.fit(reference, None, loader, epochs=1, progress=False, seed=0).history[-1].loss
    probs = predict(reference, x, progress=False).probs
    wraps = (_compile, lambda m: DDP(_compile(m)), lambda m: _compile(DDP(m)))
    for wrap in wraps:
        wrapped = wrap(batchensemble(_net(), 2))
        got = pyrouq.fit(wrapped, None, loader, epochs=1, progress=False, seed=0).history[-1]
        assert got.loss == pytest.approx(want, rel=1e-6)
        assert torch.allclose(predict(wrapped, x, progress=False).probs, probs, atol=1e-6)


def _compiled_entries(function):
    """How many compiled versions of ``function`` dynamo holds."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(function.__code__))


@pytest.mark.parametrize("kind", ["batchensemble", "bayesian"])
def test_a_compiled_models_pyro_statements_are_not_compiled_once_per_name(kind):
    # fit(torch.compile(batchensemble(net, M))) traced the model's Pyro statements: each of its
    # parameter names (12 here) compiled pyro.param again, until dynamo's recompile_limit (8)
    # warned; bayesian(net)'s priors compiled SitePrior.distribution once per site shape. Both
    # now run untraced (pyrouq/_untraced.py), and fit as the module does
    import pyro.primitives

    from pyrouq.convert._select import SitePrior

    x, y = _data()
    loader = ArrayLoader(x, y, 8, shuffle=False)
    convert = (lambda net: batchensemble(net, 2)) if kind == "batchensemble" else bayesian
    losses = []
    for wrap in (lambda m: m, _compile):
        torch._dynamo.reset()
        model = convert(_net())
        guide = None if kind == "batchensemble" else mean_field_guide(model)
        losses.append(pyrouq.fit(wrap(model), guide, loader, epochs=2, progress=False, seed=0))
    assert _compiled_entries(pyro.primitives.param) == 0
    assert _compiled_entries(SitePrior.distribution) == 0
    assert losses[1].losses == pytest.approx(losses[0].losses, rel=1e-6)


def test_fit_compiles_the_model_inside_a_compiled_parallel_wrapper(gloo_group):
    # fit() keeps torch.compile's wrapper; one around DDP(model) is made again around the
    # model, with the same settings (DDP's forward would average the gradients twice)
    model = rank1(_net(), 2)
    compiled = _compile(DDP(model))
    inner = given_model(compiled, keep_compiled=True)
    assert inner._orig_mod is model and inner.dynamo_ctx is compiled.dynamo_ctx
    assert given_model(_compile(model), keep_compiled=True)._orig_mod is model
    del compiled.dynamo_ctx  # a torch keeping the settings elsewhere: told what to pass
    with pytest.raises(TypeError, match=r"compile inside the parallel wrapper"):
        given_model(compiled, keep_compiled=True)


def _counted(reductions, bucket):
    reductions.append(bucket.buffer().numel())
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def test_fit_trains_a_ddp_wrapped_guide_as_its_module(gloo_group):
    # fit(model, DDP(guide)) ran DDP's forward: its hooks reduced the guide's gradients, on
    # top of fit()'s own averaging (a rank stopping before backward would hang in them)
    x, y = _data()
    losses, reductions = [], []
    for wrap in (lambda g: g, DDP):
        model = bayesian(_net())
        guide = wrap(mean_field_guide(model))
        if isinstance(guide, DDP):  # (DDP's reduction of a bucket of gradients, counted)
            guide.register_comm_hook(reductions, _counted)
        result = pyrouq.fit(model, guide, ArrayLoader(x, y, 4, shuffle=False), epochs=1,
                            progress=False, seed=0)  # fmt: skip
        losses.append(result.history[-1].loss)
    assert reductions == [] and losses[1] == losses[0]


def test_own_pyro_model_sees_a_pyrouq_model_through_every_wrapper(gloo_group):
    # its docstring said a pyrouq model in DataParallel was none of the user's own; the
    # function said it was (an nn.Module given with a guide)
    from pyrouq.infer._probe import own_pyro_model

    model = bayesian(_net())
    guide = mean_field_guide(model)
    for wrapped in (DP(model), DDP(model), DP(DDP(model))):
        assert not own_pyro_model(wrapped, guide)
    assert own_pyro_model(DP(_net()), guide)


def test_fit_refuses_a_guide_for_a_compiled_batchensemble():
    # the compiled wrapper is no BatchEnsembleNetwork: a guide of another model was trained
    # beside it (its KL alone) where the module itself is refused
    x, y = _data()
    guide = mean_field_guide(bayesian(_net()))
    compiled = _compile(batchensemble(_net(), 2))
    with pytest.raises(ValueError, match=r"got a guide for a BatchEnsemble \(BatchEnsembleNet"):
        pyrouq.fit(compiled, guide, ArrayLoader(x, y, 4), epochs=1, progress=False)


def test_a_compiled_ddp_of_a_plain_network_runs_the_network_compiled_again(gloo_group):
    # torch.compile(DDP(net)) (the order torch advises) given to predict() or fit() ran DDP's
    # forward inside: a buffer broadcast each pass (a rank predicting alone waits on it) and a
    # gradient average on top of fit()'s own
    x, y = _data()
    loader = ArrayLoader(x, y, 4, shuffle=False)
    want = pyrouq.fit(_net(), None, loader, epochs=1, progress=False, seed=0).history[-1].loss
    net = _net()
    probs = predict(net, x, progress=False).probs
    parallel = DDP(net)
    compiled = _compile(parallel)
    for keep in (False, True):
        inner = given_model(compiled, keep_compiled=keep)
        assert inner._orig_mod is net and inner.dynamo_ctx is compiled.dynamo_ctx
        # made as torch.compile makes its wrapper (its settings called on net), not by
        # OptimizedModule's constructor, which left out torch's get_compiler_config()
        assert inner.get_compiler_config() is compiled.get_compiler_config()
    kept = _compile(DP(net))  # (a DataParallel's forward is run as it is)
    assert given_model(kept) is kept and given_model(DDP(kept)) is kept
    calls, reductions = [], []
    parallel.register_forward_pre_hook(lambda module, args: calls.append(1))
    parallel.register_comm_hook(reductions, _counted)
    with torch.compiler.set_stance("force_eager"):
        assert torch.equal(predict(compiled, x, progress=False).probs, probs)
        got = pyrouq.fit(compiled, None, loader, epochs=1, progress=False, seed=0).history[-1]
    assert calls == [] and reductions == [] and got.loss == pytest.approx(want, rel=1e-6)
    del compiled.dynamo_ctx  # a torch keeping the settings elsewhere: told what to pass
    with pytest.raises(TypeError, match=r"DistributedDataParallel\(torch.compile\(model\)\)"):
        predict(compiled, x, progress=False)


def test_a_ddp_wrapped_guide_is_taken_as_its_module_outside_fit(gloo_group, tmp_path):
    # save(path, model, DDP(guide)) said "save() can store a MeanFieldGuide, got
    # DistributedDataParallel"; predict(), to_inference_data() and psis_diagnostic() ran the
    # wrapper's forward (a buffer broadcast each draw: a collective on one rank alone)
    x, y = _data(6)
    model = bayesian(_net(), num_data=6)
    guide = mean_field_guide(model)
    wrapped, calls = DDP(guide), []
    wrapped.register_forward_pre_hook(lambda module, args: calls.append(1))
    want = predict(model, x, guide, num_samples=2, seed=0, progress=False).probs
    got = predict(model, x, wrapped, num_samples=2, seed=0, progress=False).probs
    assert torch.equal(got, want)
    k = pyrouq.psis_diagnostic(model, wrapped, x, y, num_samples=25, seed=0).k_hat
    assert k == pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25, seed=0).k_hat
    data = pyrouq.to_inference_data(model, wrapped, x, y, num_samples=2, seed=0)
    same = pyrouq.to_inference_data(model, guide, x, y, num_samples=2, seed=0)
    assert data.posterior["0.bias"].values.tolist() == same.posterior["0.bias"].values.tolist()
    assert calls == []
    restored = pyrouq.load(pyrouq.save(tmp_path / "m.pt", DDP(model), wrapped), module=_net())
    assert torch.equal(restored.guide.site_loc("0.weight"), guide.site_loc("0.weight"))


def test_a_wrapped_autoguide_of_another_model_is_refused_by_name(gloo_group):
    # an AutoNormal built for another network, in DDP or DataParallel, was read for its
    # prototype trace as the wrapper (none): KLWeightedELBO, and fit() given a DataParallel
    # one, ran it and failed in the model on "Site '0.weight' takes draws of shape (8, 4)
    # ... got shape (5, 4)" under a dump of trace shapes; cf27ebc reads the module inside
    x, y = _data(6)
    pyro.clear_param_store()
    net = nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    other = AutoNormal(bayesian(net, num_data=6))
    other(x, y)  # built: its prototype trace holds (5, 4) weights
    model = bayesian(_net(), num_data=6)
    said = "the guide does not belong to BayesianNetwork: site '0.weight' has shape (5, 4) in "
    for wrapped in (DDP(other), DP(other)):
        with pytest.raises(ValueError, match=re.escape("KLWeightedELBO: " + said)):
            pyrouq.KLWeightedELBO().loss(model, wrapped, x, y)
        with pytest.raises(ValueError, match=re.escape("fit(): " + said)):
            pyrouq.fit(model, wrapped, ArrayLoader(x, y, 3), epochs=1, progress=False)


def test_save_stores_a_guide_in_any_wrapper_as_the_guide(tmp_path):
    # save(path, model, DataParallel(guide)) or torch.compile(guide) said "save() can store a
    # MeanFieldGuide, got DataParallel. Build the guide with mean_field_guide(model)" (it was
    # one): 70340ab took DDP(guide) alone out of its wrapper, as save() takes a model out of all
    model = bayesian(_net(), num_data=6)
    guide = mean_field_guide(model)
    for wrapped in (DP(guide), _compile(guide), DP(_compile(guide))):
        restored = pyrouq.load(pyrouq.save(tmp_path / "m.pt", model, wrapped), module=_net())
        assert torch.equal(restored.guide.site_loc("0.weight"), guide.site_loc("0.weight"))


def test_fit_checkpoints_and_resumes_a_guide_in_any_wrapper(tmp_path):
    # fit(model, DataParallel(guide) or torch.compile(guide), checkpoint=...) was refused
    # before training with "save() can store a MeanFieldGuide, got DataParallel. Build the
    # guide with mean_field_guide(model)" (it was one), though save() stores it; resuming
    # with one said "guide is of class OptimizedModule ... Build the guide as the run did"
    x, y = _data(6)
    for wrap in (DP, _compile):
        model = bayesian(_net(), num_data=6)
        guide = mean_field_guide(model)
        loader = ArrayLoader(x, y, batch_size=3)
        path = tmp_path / "c.pt"
        pyrouq.fit(model, wrap(guide), loader, epochs=1, checkpoint=path, progress=False)
        saved = pyrouq.load(path, module=_net()).guide.site_loc("0.weight")
        assert torch.equal(saved, guide.site_loc("0.weight"))
        resumed = []
        for given in (lambda g: g, wrap):  # one more epoch from the file: as a plain guide's
            model = bayesian(_net(), num_data=6)
            again = mean_field_guide(model)
            fit_args = {"resume_from": path, "seed": 0, "progress": False}
            pyrouq.fit(model, given(again), loader, epochs=2, **fit_args)
            resumed.append(again.site_loc("0.weight"))
        assert torch.allclose(resumed[1], resumed[0], rtol=0, atol=1e-6)  # (last bits: DP)
        assert (resumed[0] - saved).abs().max() > 1e-3  # (it trained on)


class _Holder(nn.Module):
    """A module of one's own keeping a pyrouq model as ``_orig_mod`` (no compiled wrapper)."""

    def __init__(self, model):
        super().__init__()
        self._orig_mod = model


def test_only_torch_compiles_wrapper_is_looked_through_as_compiled():
    # uncompiled(), own_model() and _network_of_its_own() followed any `_orig_mod`
    # attribute: a user's module holding a pyrouq model so was taken for that model
    from pyrouq.infer._elbo_checks import own_model
    from pyrouq.infer._probe import _network_of_its_own

    model = bayesian(nn.Sequential(nn.Linear(4, 3), _Holder(nn.Linear(3, 3))))
    holder = _Holder(model)
    assert uncompiled(holder) is holder and own_model(holder) is None
    assert not _network_of_its_own(holder)
    compiled = _compile(model)
    assert uncompiled(compiled) is model and own_model(compiled) is model
    assert _network_of_its_own(compiled) and _network_of_its_own(model)
    assert own_model(DP(model)) is None  # (own_model looks through compile alone)


def test_the_model_under_pyros_handlers_is_found_through_an_unflattened_partial():
    # poutine.condition(model) is partial(_context_wrap, messenger, model) in a _bound_partial,
    # which functools flattens into one partial only where the inner one has no __dict__ (and
    # not at all in some Pythons): the model and its handler are found in both forms
    from functools import partial

    from pyro import poutine
    from pyro.poutine.messenger import _bound_partial, _context_wrap

    def model(x, y=None):
        pass

    flat = poutine.condition(model, data={})
    assert under_handlers(flat) == (model, ["poutine.condition"])
    inner = partial(_context_wrap, flat.args[0], model)
    inner.note = "a __dict__: not flattened"
    nested = _bound_partial(inner)
    assert nested.func is inner and not nested.args
    assert under_handlers(nested) == (model, ["poutine.condition"])
    assert under_handlers(model) == (model, [])
