"""Small checkpoint problems earlier audits noticed and left: numpy numbers in an optimizer's
state, an object that is no optimizer, an MCMC file of a future format, an MCMC result passed
as the guide, a non-numeric ``default_kl_weight``, and ``torch.compile``'d modules."""

import gc
import json
import re
import warnings
import weakref

import numpy as np
import pytest
import torch

import pyrouq
from pyrouq import BayesianMLP, CheckpointError, MCMCResult, load, mean_field_guide, save
from pyrouq.convert import module_record

torch.set_num_threads(1)


def _loader(n=32, batch_size=16):
    torch.manual_seed(0)
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def _net():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _run(model, epochs, **kwargs):
    """fit() of the toy ``model`` for ``epochs`` at a constant rate, seeded (the resume tests)."""
    return pyrouq.fit(model, None, _loader(), epochs=epochs, progress=False, seed=0,
                      lr_schedule="constant", **kwargs)  # fmt: skip


def _mlp():
    return BayesianMLP(in_features=4, hidden_features=8, out_features=3)


# 1. the optimizer -----------------------------------------------------------------------------


def test_numpy_numbers_in_an_optimizer_are_saved_as_the_same_python_numbers(tmp_path):
    # lr=np.float64(1e-3) sat in param_groups as a numpy scalar: save() wrote it, and load()
    # then refused the whole file as holding pickled Python objects
    model = _mlp()
    guide = mean_field_guide(model)
    params = list(guide.parameters())
    betas = (np.float64(0.9), np.float64(0.99))
    opt = torch.optim.Adam(params, lr=np.float64(1e-3), betas=betas, eps=np.float32(1e-6))
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    back = load(save(tmp_path / "c.pt", model, guide, optimizer=opt))
    group = back.optimizer_state["param_groups"][0]
    assert group["lr"] == 1e-3 and type(group["lr"]) is float
    assert group["betas"] == (0.9, 0.99) and all(type(b) is float for b in group["betas"])
    assert group["eps"] == float(np.float32(1e-6)) and type(group["eps"]) is float  # widened
    again = torch.optim.Adam(list(back.guide.parameters()), lr=0.5)
    again.load_state_dict(back.optimizer_state)
    assert again.param_groups[0]["lr"] == 1e-3
    saved_state = back.optimizer_state["state"][0]
    assert torch.equal(saved_state["exp_avg"], opt.state[params[0]]["exp_avg"])
    # a number no Python number holds exactly is refused when saving, saying where it lies
    state = {"state": {}, "param_groups": [{"lr": np.longdouble(1e-3), "params": [0]}]}
    longdouble = type(np.longdouble(0)).__name__  # (numpy 1.x names the class float128)
    with pytest.raises(
        CheckpointError,
        match=r"save\(optimizer=\) got a state whose optimizer\['param_groups'\]\[0\]\['lr'\] "
        rf"is a numpy\.{longdouble}, which load\(\) would refuse to unpickle.*Make it one of "
        r"those \(float\(x\)",
    ):
        save(tmp_path / "d.pt", model, guide, optimizer=state)
    assert not (tmp_path / "d.pt").exists()
    state = {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0], "note": object()}]}
    with pytest.raises(CheckpointError, match=r"\['note'\] is an object, which load\(\)"):
        save(tmp_path / "e.pt", model, guide, optimizer=state)


def test_fit_with_an_optimizer_factory_of_numpy_numbers_writes_a_checkpoint_that_resumes(tmp_path):
    def optim(params):
        return torch.optim.Adam(params, lr=np.float64(1e-2), betas=(np.float64(0.9), 0.999))

    path = tmp_path / "run.pt"
    model = _mlp()
    guide = mean_field_guide(model)
    pyrouq.fit(model, guide, _loader(), epochs=1, optim=optim, checkpoint=path, progress=False)
    saved = load(path)  # was refused: "contains pickled Python objects"
    assert type(saved.optimizer_state["param_groups"][0]["lr"]) is float
    assert saved.training["epochs_done"] == 1
    model2 = _mlp()
    guide2 = mean_field_guide(model2)
    result = pyrouq.fit(
        model2, guide2, _loader(), epochs=2, optim=optim, resume_from=path, progress=False
    )
    assert len(result.history) == 2


def test_save_refuses_a_scheduler_or_a_module_given_as_the_optimizer(tmp_path):
    model = _mlp()
    guide = mean_field_guide(model)
    opt = torch.optim.SGD(list(guide.parameters()), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    # both have a state_dict(), which was saved as if it were the optimizer's
    with pytest.raises(
        CheckpointError,
        match=r"save\(optimizer=\) takes a torch optimizer, a Pyro optimizer or a state dict "
        r".*; got StepLR, a learning-rate scheduler. Pass the optimizer it schedules, "
        r"optimizer=scheduler.optimizer; to keep the scheduler's state too, pass "
        r"optimizer=\{'optimizer': opt.state_dict\(\), 'scheduler': scheduler.state_dict\(\)\}",
    ):
        save(tmp_path / "c.pt", model, guide, optimizer=scheduler)
    with pytest.raises(
        CheckpointError,
        match=r"save\(optimizer=\) takes a torch optimizer.*; got Linear, a module, not an "
        r"optimizer. Pass the model as model= \(its guide as guide=\)",
    ):
        save(tmp_path / "c.pt", model, guide, optimizer=torch.nn.Linear(2, 2))
    assert not (tmp_path / "c.pt").exists()
    # what the message says to pass is saved
    both = {"optimizer": opt.state_dict(), "scheduler": scheduler.state_dict()}
    back = load(save(tmp_path / "c.pt", model, guide, optimizer=both))
    assert back.optimizer_state["scheduler"]["step_size"] == 3
    assert back.optimizer_state["optimizer"]["param_groups"][0]["lr"] == 0.1
    back = load(save(tmp_path / "c.pt", model, guide, optimizer=scheduler.optimizer))
    assert back.optimizer_state["param_groups"][0]["lr"] == 0.1

    class OwnOptimizer:  # not a torch.optim.Optimizer, but what fit(optim=) accepts
        def __init__(self, params):
            self.param_groups = [{"params": list(params), "lr": np.float64(0.25)}]

        def step(self):
            pass

        def state_dict(self):
            return {"state": {}, "param_groups": [{"lr": self.param_groups[0]["lr"]}]}

    back = load(save(tmp_path / "c.pt", model, guide, optimizer=OwnOptimizer(opt.param_groups)))
    assert back.optimizer_state == {"state": {}, "param_groups": [{"lr": 0.25}]}


# 2. and 3. MCMC results ----------------------------------------------------------------------


def _result():
    stats = {"diverging": torch.zeros(2, 3, dtype=torch.bool), "step_size": torch.ones(2, 3)}
    return MCMCResult({"w": torch.randn(2, 3)}, stats, "nuts", 10, [1.0, 2.0])


def test_an_mcmc_result_of_a_future_format_version_is_refused(tmp_path):
    path = save(tmp_path / "mcmc.pt", _result())
    assert load(path).kernel == "nuts"
    payload = torch.load(path, weights_only=True)
    assert payload["format_version"] == 1
    for version in (99, None, "1"):  # loaded as if it were version 1
        payload["format_version"] = version
        torch.save(payload, path)
        with pytest.raises(
            CheckpointError,
            match=rf"mcmc.pt' has MCMC result format version {re.escape(repr(version))}; this "
            r"pyrouq reads version 1. Load it with the pyrouq version that wrote it.",
        ):
            load(path)


def test_an_mcmc_result_passed_as_the_guide_is_refused_saying_to_save_it_alone(tmp_path):
    # was: "save() can store a MeanFieldGuide, got MCMCResult. Build the guide with
    # mean_field_guide(model)"
    with pytest.raises(
        CheckpointError,
        match=r"save\(\) got an MCMCResult as the guide of BayesianMLP: an MCMC result is saved "
        r"alone, its draws and sampler statistics, without the model: save\(path, result\)",
    ):
        save(tmp_path / "c.pt", _mlp(), _result())
    assert not (tmp_path / "c.pt").exists()


# 4. default_kl_weight ------------------------------------------------------------------------


def test_a_default_kl_weight_that_is_no_number_is_refused_naming_the_attribute(tmp_path):
    model = _mlp()
    guide = mean_field_guide(model)
    for value, example in (("auto", "1.0"), ("0.5", "0.5"), (-1.0, "1.0"), (float("nan"), "1.0")):
        model.default_kl_weight = value
        with pytest.raises(
            CheckpointError,
            match=r"save\(\) cannot write BayesianMLP: model.default_kl_weight \(fit\(\)'s "
            r"kl_weight when none is given\) is expected to be a finite float >= 0, got "
            rf"{re.escape(repr(value))} \({type(value).__name__}\). Set "
            rf"model.default_kl_weight = {example} \(say\), or None for the likelihood's default",
        ):
            save(tmp_path / "c.pt", model, guide)
    model.default_kl_weight = torch.tensor(0.5)
    with pytest.raises(CheckpointError, match=r"got tensor\(0.5000\) \(Tensor\) \(a tensor: "):
        save(tmp_path / "c.pt", model, guide)
    assert not (tmp_path / "c.pt").exists()
    # one set on the likelihood is named there
    model.default_kl_weight = None
    model.likelihood.default_kl_weight = "high"
    with pytest.raises(CheckpointError, match=r"model.likelihood.default_kl_weight \(fit"):
        save(tmp_path / "c.pt", model, guide)
    model.likelihood.__dict__.pop("default_kl_weight")
    model.default_kl_weight = np.float64(0.25)  # a numpy number is a number
    assert load(save(tmp_path / "c.pt", model, guide)).model.default_kl_weight == 0.25


# 5. torch.compile ----------------------------------------------------------------------------


def test_a_compiled_module_is_saved_as_the_module_it_compiled(tmp_path):
    torch.manual_seed(0)
    net = _net()
    compiled = torch.compile(net, backend="eager")
    path = save(tmp_path / "c.pt", compiled)
    assert sorted(torch.load(path, weights_only=True)["model"]) == sorted(net.state_dict())
    back = load(path, module=_net())  # was refused: "... absent in the skeleton"
    assert type(back.model) is torch.nn.Sequential
    for key, value in net.state_dict().items():
        assert torch.equal(back.model.state_dict()[key], value)
    # a compiled skeleton (how such a file had to be loaded) still loads it
    back = load(path, module=torch.compile(_net(), backend="eager"))
    assert torch.equal(back.model[0].weight, net[0].weight)
    # a compiled Bayesian network with its guide: rebuilt as the Bayesian network
    model = pyrouq.bayesian(_net())
    guide = mean_field_guide(model)
    path = save(tmp_path / "b.pt", torch.compile(model, backend="eager"), guide)
    back = load(path, module=_net())
    assert type(back.model).__name__ == "BayesianNetwork"
    assert torch.equal(back.guide.site_loc("0.weight"), guide.site_loc("0.weight"))


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")
def test_a_compiled_run_resumes_and_loads_into_a_plain_skeleton(tmp_path):
    path = tmp_path / "run.pt"
    model = pyrouq.bayesian(_net())
    guide = mean_field_guide(model)
    compiled = torch.compile(model, backend="eager")
    pyrouq.fit(compiled, guide, _loader(), epochs=1, checkpoint=path, progress=False, seed=0)
    assert type(load(path, module=_net()).model).__name__ == "BayesianNetwork"
    model2 = pyrouq.bayesian(_net())
    guide2 = mean_field_guide(model2)
    compiled2 = torch.compile(model2, backend="eager")
    result = pyrouq.fit(compiled2, guide2, _loader(), epochs=2, resume_from=path, progress=False)
    assert len(result.history) == 2
    model3 = pyrouq.bayesian(_net())  # and a plain model resumes it too
    guide3 = mean_field_guide(model3)
    result = pyrouq.fit(model3, guide3, _loader(), epochs=2, resume_from=path, progress=False)
    assert len(result.history) == 2


def test_a_file_of_an_earlier_pyrouq_holding_the_compiled_wrapper_still_loads(tmp_path):
    # such a file recorded the wrapper (OptimizedModule) and its "_orig_mod." names
    torch.manual_seed(0)
    net = _net()
    path = save(tmp_path / "old.pt", net)
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["module"] = module_record(torch.compile(net, backend="eager"))
    payload["description"] = json.dumps(description)
    payload["model"] = {f"_orig_mod.{k}": v for k, v in payload["model"].items()}
    torch.save(payload, path)
    back = load(path, module=torch.compile(_net(), backend="eager"))
    assert torch.equal(back.model._orig_mod[2].weight, net[2].weight)
    with pytest.raises(
        CheckpointError,
        match=r"old.pt' holds a Sequential compiled by torch.compile, saved with its wrapper "
        r"\(OptimizedModule, parameters named '_orig_mod.'...\) by an earlier pyrouq, but the "
        r"skeleton \(Sequential\) is not compiled. Pass load\(path, "
        r"module=torch.compile\(net\)\); save the loaded model again",
    ):
        load(path, module=_net())
    # without module=, it said to pass load(path, module=net), which the refusal above met
    with pytest.raises(CheckpointError, match=re.escape(
        "by an earlier pyrouq, and load() got no skeleton (module=): pyrouq never unpickles "
        "code. Pass load(path, module=torch.compile(net)), with net a freshly built Sequential"
    )):  # fmt: skip
        load(path)
    # a hand-edited record whose "modules" is no mapping: the same refusal, the class unnamed
    # (it failed as AttributeError: 'str' object has no attribute 'get')
    description["model"]["module"]["modules"] = "hand-edited"
    payload["description"] = json.dumps(description)
    torch.save(payload, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match=r"holds a module compiled by torch.compile, saved"):
        load(tmp_path / "edited.pt", module=_net())
    # saved again, as the message says: it loads into a plain skeleton
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = load(save(tmp_path / "new.pt", back.model), module=_net())
    assert torch.equal(again.model[2].weight, net[2].weight)


def test_a_run_of_an_earlier_pyrouq_holding_the_data_parallel_wrapper_resumes(tmp_path):
    # fit(DataParallel(net), checkpoint=) before adb6175 wrote the wrapper and its "module."
    # names; resuming it with fit(DataParallel(net), resume_from=) said it "holds a Module of
    # another module ... Rebuild the model with the saved arguments" (the model unwrapped)
    torch.manual_seed(0)
    want = [h.loss for h in _run(_net(), 2).history]
    torch.manual_seed(0)
    path = _earlier_data_parallel_run(tmp_path / "old.pt")
    resumed = _run(torch.nn.DataParallel(_net()), 2, resume_from=path)
    assert [h.loss for h in resumed.history] == pytest.approx(want, rel=1e-6)


def _earlier_data_parallel_run(path):
    """A 1-epoch run's file as fit(DataParallel(net), checkpoint=) wrote it before adb6175."""
    _run(_net(), 1, checkpoint=path)
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["module"] = module_record(torch.nn.DataParallel(_net()))
    payload["description"] = json.dumps(description)
    payload["model"] = {f"module.{k}": v for k, v in payload["model"].items()}
    torch.save(payload, path)
    return path


def test_a_plain_model_resuming_a_data_parallel_file_is_told_to_wrap_it(tmp_path):
    # it said the file "holds a Sequential of another module ... Rebuild the model with the
    # saved arguments", which no rebuilt network mends: only DataParallel(net) takes the names
    path = _earlier_data_parallel_run(tmp_path / "old.pt")
    want = (
        "but the model (Sequential) is not in DataParallel. Resume with "
        "fit(torch.nn.DataParallel(net), resume_from=...)"
    )
    with pytest.raises(CheckpointError, match=re.escape(want)) as info:
        _run(_net(), 2, resume_from=path)
    assert "holds a Sequential in DataParallel, saved with its wrapper" in str(info.value)
    # load(path) said to pass load(path, module=net), which was refused in turn: the wrapper
    with pytest.raises(CheckpointError, match=re.escape(
        "and load() got no skeleton (module=): pyrouq never unpickles code. Pass load(path, "
        "module=torch.nn.DataParallel(net)), with net a freshly built Sequential of the same"
    )):  # fmt: skip
        load(path)
    saved = load(path, module=torch.nn.DataParallel(_net()))  # a Checkpoint: the same words
    with pytest.raises(CheckpointError, match=re.escape(want)):
        _run(_net(), 2, resume_from=saved)
    # what it advises then writes files that a plain model resumes from
    _run(torch.nn.DataParallel(_net()), 2, resume_from=path, checkpoint=tmp_path / "new.pt")
    assert [h.epoch for h in _run(_net(), 3, resume_from=tmp_path / "new.pt").history] == [1, 2, 3]


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")
def test_a_plain_model_resuming_a_compiled_file_is_told_to_compile_it(tmp_path):
    # it said the file "holds a Module of another module ... Rebuild the model with the saved
    # arguments", which no rebuilt network mends: only torch.compile(net) takes the names
    torch.manual_seed(0)
    want = [h.loss for h in _run(_net(), 2).history]
    torch.manual_seed(0)
    path = tmp_path / "old.pt"
    _run(_net(), 1, checkpoint=path)
    payload = torch.load(path, weights_only=True)  # as an earlier pyrouq wrote it
    description = json.loads(payload["description"])
    description["model"]["module"] = module_record(torch.compile(_net(), backend="eager"))
    payload["description"] = json.dumps(description)
    payload["model"] = {f"_orig_mod.{k}": v for k, v in payload["model"].items()}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=re.escape(
        "holds a Sequential compiled by torch.compile, saved with its wrapper (OptimizedModule, "
        "parameters named '_orig_mod.'...) by an earlier pyrouq, but the model (Sequential) is "
        "not compiled. Resume with fit(torch.compile(net), resume_from=...)"
    )):  # fmt: skip
        _run(_net(), 2, resume_from=path)
    # what it advises resumes the run, and writes files that a plain model resumes from
    compiled = torch.compile(_net(), backend="eager")
    resumed = _run(compiled, 2, resume_from=path, checkpoint=tmp_path / "new.pt")
    assert [h.loss for h in resumed.history] == pytest.approx(want, rel=1e-6)
    assert [h.epoch for h in _run(_net(), 3, resume_from=tmp_path / "new.pt").history] == [1, 2, 3]


# 6. resuming from a loader that cannot tell N -------------------------------------------------


class _Stream(torch.utils.data.IterableDataset):
    """32 examples in batches of 16, no length: fit() cannot count them."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)
        return iter([(x[:16], y[:16]), (x[16:], y[16:])])


def test_a_run_resumed_from_an_unsized_loader_takes_its_n_from_the_checkpoint(tmp_path):
    # the checkpoint records N = 32, yet resuming without num_data= was told "Cannot tell the
    # training-set size N ... Pass num_data=N"
    stream = torch.utils.data.DataLoader(_Stream(), batch_size=None)
    torch.manual_seed(0)
    model = _mlp()
    guide = mean_field_guide(model)
    path = tmp_path / "run.pt"
    pyrouq.fit(model, guide, stream, epochs=1, num_data=32, seed=0, progress=False,
               lr_schedule="constant", checkpoint=path)  # fmt: skip
    torch.manual_seed(1)
    fresh = _mlp()
    fresh_guide = mean_field_guide(fresh)
    other = _mlp()
    with pytest.raises(ValueError, match="Cannot tell the training-set size N"):
        pyrouq.fit(other, mean_field_guide(other), stream, epochs=2, progress=False,
                   lr_schedule="constant")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "num_data differs" warning either
        result = pyrouq.fit(fresh, fresh_guide, stream, epochs=2, resume_from=path,
                            progress=False, lr_schedule="constant")  # fmt: skip
    assert len(result.history) == 2
    assert fresh.num_data == 32


def test_a_file_without_a_run_resumed_from_an_unsized_loader_is_refused_not_asked_for_n(tmp_path):
    # a save() file holds no training state: fit() asked for num_data=N ("Cannot tell the
    # training-set size N"), then, given it, refused the file; now it says so first
    stream = torch.utils.data.DataLoader(_Stream(), batch_size=None)
    model = _mlp()
    saved = save(tmp_path / "saved.pt", model, mean_field_guide(model))
    edited = tmp_path / "edited.pt"  # a training state fit() did not write
    pyrouq.fit(model, mean_field_guide(model), stream, epochs=1, num_data=32, progress=False,
               lr_schedule="constant", checkpoint=edited)  # fmt: skip
    payload = torch.load(edited, weights_only=True)
    torch.save({**payload, "training": {**payload["training"], "history": "none"}}, edited)
    unsaved = "holds no training state (it was written by save(), not by fit(checkpoint=...))"
    unfit = "holds a training state that fit() did not write ('history' is 'none', not a list"
    uncounted = tmp_path / "uncounted.pt"  # an N of none: read as no N, fit() asked for one
    torch.save({**payload, "training": {**payload["training"], "num_data": 0}}, uncounted)
    zero = "holds a training state that fit() did not write ('num_data' is 0, not a count from 1"
    mcmc = save(tmp_path / "mcmc.pt", _result())
    sampled = "holds an MCMC result, not a training run; resume from a checkpoint that fit("
    cases = (
        (saved, unsaved),
        (load(saved), unsaved),
        (edited, unfit),
        (uncounted, zero),
        (mcmc, sampled),
    )
    for path, words in cases:
        fresh = _mlp()
        with pytest.raises(CheckpointError, match=re.escape(words)):
            pyrouq.fit(fresh, mean_field_guide(fresh), stream, epochs=2, resume_from=path,
                       progress=False, lr_schedule="constant")  # fmt: skip


def test_a_run_resumed_from_a_file_read_once_holds_no_second_copy_of_its_weights(tmp_path):
    # fit --resume passes the checkpoint read once (a ReadFile): restore() let go of the
    # payload it rebuilt the run from, or the file's tensors lived beside the model's for the
    # whole resumed run
    from pyrouq.checkpoint._file import ReadFile

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))]
    model = _mlp()
    pyrouq.fit(model, mean_field_guide(model), batches, epochs=1, num_data=16, progress=False,
               checkpoint=tmp_path / "run.pt")  # fmt: skip
    file = ReadFile(tmp_path / "run.pt")
    saved = [weakref.ref(t) for key in ("model", "guide") for t in file.payload[key].values()]
    alive = []

    def counted(record):
        gc.collect()
        alive.append(sum(ref() is not None for ref in saved))

    fresh = _mlp()
    pyrouq.fit(fresh, mean_field_guide(fresh), batches, epochs=2, progress=False,
               resume_from=file, callbacks=[counted])  # fmt: skip
    assert len(saved) > 4 and alive == [0]  # (all held when restore() kept the payload)
    assert file.payload is None


# 6. DistributedDataParallel ------------------------------------------------------------------


def test_a_ddp_wrapped_model_is_saved_as_the_module_it_wraps(tmp_path, gloo_group):
    # fit() trains a DDP-wrapped network as its .module (docs: scaling out), but save() of
    # the wrapper wrote "a plain network, a torch.nn.parallel.distributed.DistributedDataParallel"
    # with "module." names: a pyrouq model lost its kind (load() asked for a skeleton of the
    # wrapper), and a Bayesian one's guide was refused ("no latent sites")
    ddp = torch.nn.parallel.DistributedDataParallel
    torch.manual_seed(0)
    mlp = pyrouq.MLP(4, 8, 3)
    back = load(save(tmp_path / "mlp.pt", ddp(mlp))).model
    assert type(back) is pyrouq.MLP
    assert torch.equal(back.fc1.weight, mlp.fc1.weight)
    ensemble = pyrouq.batchensemble(_net(), 2)
    back = load(save(tmp_path / "be.pt", ddp(ensemble)), module=_net()).model
    assert type(back).__name__ == "BatchEnsembleNetwork"
    assert torch.equal(back.net[0].r, ensemble.net[0].r)

    def norm_net():
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))

    model = pyrouq.bayesian(norm_net())
    guide = mean_field_guide(model)
    back = load(save(tmp_path / "b.pt", ddp(model), guide), module=norm_net())
    assert torch.equal(back.guide.site_loc("0.weight"), guide.site_loc("0.weight"))
    assert torch.equal(back.model.net[1].weight, model.net[1].weight)


def test_a_file_of_an_earlier_pyrouq_holding_the_ddp_wrapper_still_loads(tmp_path, gloo_group):
    # save(path, DDP(net)) before adb6175 recorded the wrapper and its "module." names: it
    # loaded with module=DDP(net), which load() then unwrapped (refused: "absent in the
    # skeleton"), and no skeleton rebuilt the file
    ddp = torch.nn.parallel.DistributedDataParallel
    torch.manual_seed(0)
    net = _net()
    path = save(tmp_path / "old.pt", net)
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["module"] = module_record(ddp(net))
    payload["description"] = json.dumps(description)
    payload["model"] = {f"module.{k}": v for k, v in payload["model"].items()}
    torch.save(payload, path)
    back = load(path, module=ddp(_net()))
    assert torch.equal(back.model.module[2].weight, net[2].weight)
    with pytest.raises(
        CheckpointError,
        match=r"old.pt' holds a Sequential in DistributedDataParallel, saved with its wrapper "
        r"\(parameters named 'module.'...\) by an earlier pyrouq, but the skeleton "
        r"\(Sequential\) is not wrapped. Pass load\(path, "
        r"module=torch.nn.parallel.DistributedDataParallel\(net\)\) in a process group",
    ):
        load(path, module=_net())
    with pytest.raises(CheckpointError, match=re.escape(
        "and load() got no skeleton (module=): pyrouq never unpickles code. Pass load(path, "
        "module=torch.nn.parallel.DistributedDataParallel(net)) in a process group (one of one "
        "process will do), with net a freshly built Sequential"
    )):  # fmt: skip
        load(path)  # (it said to pass module=net, refused in turn)
    again = load(save(tmp_path / "new.pt", back.model), module=_net())  # as the message says
    assert torch.equal(again.model[2].weight, net[2].weight)


def test_a_run_of_an_earlier_pyrouq_holding_the_ddp_wrapper_resumes_as_told(tmp_path, gloo_group):
    # its refusal of a plain model says "Resume with fit(DistributedDataParallel(net),
    # resume_from=...)", but fit() took the wrapper off before it read the file, and told the
    # wrapped model the very same thing
    ddp = torch.nn.parallel.DistributedDataParallel

    torch.manual_seed(0)
    want = [h.loss for h in _run(_net(), 2).history]
    torch.manual_seed(0)
    path = tmp_path / "old.pt"
    _run(_net(), 1, checkpoint=path)
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["module"] = module_record(ddp(_net()))
    payload["description"] = json.dumps(description)
    payload["model"] = {f"module.{k}": v for k, v in payload["model"].items()}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"the model \(Sequential\) is not in Distributed"):
        _run(_net(), 2, resume_from=path)
    resumed = _run(ddp(_net()), 2, resume_from=path)
    assert [h.loss for h in resumed.history] == pytest.approx(want, rel=1e-6)
    # torch.compile(DDP(net)) holds the wrapper too (it was told 'the model (OptimizedModule)
    # is not in DistributedDataParallel'); DDP(torch.compile(net)), whose names are
    # 'module._orig_mod.'..., was told to rebuild the model with the saved arguments
    compiled = _run(torch.compile(ddp(_net()), backend="eager"), 2, resume_from=path)
    assert [h.loss for h in compiled.history] == pytest.approx(want, rel=1e-6)
    told = r"is a DistributedDataParallel of a network compiled by torch\.compile .*will do\)"
    with pytest.raises(CheckpointError, match=told):
        _run(ddp(torch.compile(_net(), backend="eager")), 2, resume_from=path)
