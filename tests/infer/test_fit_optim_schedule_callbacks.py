"""Audit of fit()'s options besides the objective: ``optim=``, ``lr_schedule=``, ``callbacks=``
(each checked against a hand-written torch loop or the documented behaviour)."""

from __future__ import annotations

import copy
import functools
import math
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader, toy_data
from torch import nn

import pyrouq
from pyrouq import fit


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Tanh(),
                         nn.Linear(8, 2))  # fmt: skip


def _run(net, **kw):
    x, y = toy_data(20)
    return fit(net, None, pyrouq.ArrayLoader(x, y, 5, seed=0), epochs=3, progress=False, seed=0,
               **kw)  # fmt: skip


# --------------------------------------------------------------------------------------------
# optim= and lr_schedule= against a hand-written loop
# --------------------------------------------------------------------------------------------


def test_sgd_with_momentum_under_warmup_cosine_is_the_hand_written_loop():
    x, y = toy_data(20)
    loader = [(x[i : i + 5], y[i : i + 5]) for i in range(0, 20, 5)]
    torch.manual_seed(0)
    ours = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    theirs = copy.deepcopy(ours)
    result = fit(ours, None, loader, epochs=3, num_data=20, progress=False, seed=0,
                 optim=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))  # fmt: skip
    sgd = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    total, warmup, losses = 12, 2, []  # 20 % of 12 steps, rounded down
    for epoch in range(3):
        epoch_losses = []
        for i, (xb, yb) in enumerate(loader):
            s = 4 * epoch + i
            cos = 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))
            sgd.param_groups[0]["lr"] = 0.1 * ((s + 1) / warmup if s < warmup else cos)
            sgd.zero_grad()
            loss = F.cross_entropy(theirs(xb), yb, reduction="sum") * 20 / 5
            loss.backward()
            sgd.step()
            epoch_losses.append(loss.item())
        losses.append(sum(epoch_losses) / 4)
    assert result.losses == pytest.approx(losses, rel=1e-6)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


class _SignSGD(torch.optim.Optimizer):
    """An optimizer of one's own with a step size of its own and no ``lr``."""

    def __init__(self, params, step_size=0.01):
        super().__init__(params, {"step_size": step_size})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(group["step_size"] * p.grad.sign())


def test_an_optimizer_without_an_lr_steps_as_it_is_and_is_refused_under_a_schedule():
    x, y = toy_data(20)
    torch.manual_seed(0)
    ours = nn.Linear(3, 2)
    theirs = copy.deepcopy(ours)
    fit(ours, None, ListLoader(x, y, 5), epochs=2, optim=_SignSGD, lr_schedule="constant",
        progress=False)  # fmt: skip
    for _ in range(2):
        for i in range(0, 20, 5):
            theirs.zero_grad()
            F.cross_entropy(theirs(x[i : i + 5]), y[i : i + 5], reduction="sum").backward()
            with torch.no_grad():
                for p in theirs.parameters():
                    p.sub_(0.01 * p.grad.sign())
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    before = copy.deepcopy(ours.state_dict())
    with pytest.raises(TypeError, match=r"optim returned an optimizer \(_SignSGD\) whose "
                       r"parameter group 0 has no learning rate \(its 'lr' is 'missing', not a "
                       r"number\), which lr_schedule='cosine' multiplies at every step\. Pass "
                       r"lr_schedule='constant'"):  # fmt: skip
        fit(ours, None, ListLoader(x, y, 5), epochs=1, optim=_SignSGD, lr_schedule="cosine",
            progress=False)  # fmt: skip
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items())


def test_an_optimizer_holding_none_of_its_parameters_is_refused_and_one_holding_some_warned():
    x, y = toy_data(20)
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)))
    guide = pyrouq.mean_field_guide(model)
    outside = nn.Linear(1, 1)
    with pytest.raises(ValueError, match=r"optim returned an optimizer \(SGD\) that holds none "
                       r"of the 10 parameters fit\(\) called it with \(the model's and the "
                       r"guide's\): nothing would be trained\. Build it from the "):  # fmt: skip
        fit(model, guide, ListLoader(x, y, 5), epochs=1, progress=False,
            optim=lambda p: torch.optim.SGD(outside.parameters(), lr=0.1))  # fmt: skip
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.warns(UserWarning, match=r"optim returned an optimizer \(Adam\) that holds 2 of "
                      r"the 10 parameters fit\(\) called it with: the other 8 \(guide's "
                      r"loc\.0__weight, guide's loc\.0__bias, guide's loc\.2__weight, \.\.\.\) "
                      r"are not trained\..*freeze them before fit\(\)"):  # fmt: skip
        fit(model, guide, ListLoader(x, y, 5), epochs=1, progress=False,
            optim=lambda p: torch.optim.Adam(model.parameters(), lr=0.1))  # fmt: skip
    assert all(torch.equal(v, before[k]) for k, v in guide.state_dict().items())


def test_an_optimizer_needing_a_closure_and_an_optim_taking_no_parameters_are_refused():
    x, y = toy_data(20)
    net = nn.Linear(3, 2)
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(TypeError, match=r"optim returned an optimizer \(LBFGS\) whose step\(\) "
                       r"cannot be called without arguments \(missing a required argument: "
                       r"'closure'\): fit\(\) calls optimizer\.step\(\) after each backward "
                       r"pass.*Use a first-order optimizer"):  # fmt: skip
        fit(net, None, ListLoader(x, y, 5), epochs=1, optim=torch.optim.LBFGS, progress=False)
    with pytest.raises(TypeError, match=r"optim cannot be called as optim\(params\) \(too many "
                       r"positional arguments\); fit\(\) calls it with the list of "):  # fmt: skip
        fit(net, None, ListLoader(x, y, 5), epochs=1, progress=False,
            optim=lambda: torch.optim.SGD(net.parameters(), lr=0.1))  # fmt: skip
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_pyro_optims_makers_passed_uncalled_are_refused_naming_the_torch_optimizer():
    """pyro.optim.ClippedAdam / Adam / ExponentialLR passed as optim= (as torch.optim.Adam is)
    got Pyro's bare AssertionError ('optim_args must be function that returns defaults') or
    TypeError ("'str' object cannot be interpreted as an integer")."""
    import pyro.optim

    x, y = toy_data(20)
    net = nn.Linear(3, 2)
    before = copy.deepcopy(net.state_dict())
    for maker, expected in (
        (pyro.optim.ClippedAdam, r"pyro\.optim\.clipped_adam\.ClippedAdam\(params, lr=1e-3\)"),
        (pyro.optim.Adam, r"torch\.optim\.Adam\(params, lr=1e-3\)"),
        (pyro.optim.ExponentialLR, r"AdamW\(params, lr=1e-3\)\. fit\(\) schedules the "
         r"learning rate itself: lr_schedule='warmup_cosine' \(default\), 'cosine' or "
         r"'constant'"),
        (pyro.optim.AdagradRMSProp, r"optim=pyro\.optim\.adagrad_rmsprop\.AdagradRMSProp with "
         r"lr_schedule='constant'\.$"),  # (no lr: its eta)
    ):  # fmt: skip
        with pytest.raises(TypeError, match=rf"optim got pyro\.optim\.{maker.__name__}, which "
                           r"makes a Pyro optimizer for pyro\.infer\.SVI from a dict of "
                           rf"options; fit\(\) takes a function .*{expected}"):  # fmt: skip
            fit(net, None, ListLoader(x, y, 5), epochs=1, optim=maker, progress=False)
    scheduler = pyro.optim.ExponentialLR(
        {"optimizer": torch.optim.SGD, "optim_args": {"lr": 0.1}, "gamma": 0.9}
    )
    with pytest.raises(TypeError, match=r"Pyro optimizer \(PyroLRScheduler\).*fit\(\) "
                       r"schedules the learning rate itself"):  # fmt: skip
        fit(net, None, ListLoader(x, y, 5), epochs=1, optim=scheduler, progress=False)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    # Pyro's own torch optimizer, as the refusal names it, trains
    clipped = pyro.optim.clipped_adam.ClippedAdam
    result = fit(net, None, ListLoader(x, y, 5), epochs=1, progress=False,
                 optim=lambda params: clipped(params, lr=1e-3))  # fmt: skip
    assert result.steps == 4
    result = fit(net, None, ListLoader(x, y, 5), epochs=1, progress=False, optim=clipped)
    assert result.steps == 4  # (the class itself, passed as torch.optim.Adam is: not refused)


# --------------------------------------------------------------------------------------------
# callbacks=
# --------------------------------------------------------------------------------------------


def test_a_callback_that_evaluates_in_eval_mode_leaves_the_training_as_it_was():
    x, _ = toy_data(20)
    plain = _net()
    expected = _run(plain)
    net = _net()

    def evaluate(record):  # a validation pass of one's own, as in a torch loop
        net.eval()
        with torch.no_grad():
            net(x)

    result = _run(net, callbacks=[evaluate])
    assert result.losses == expected.losses
    for k, v in net.state_dict().items():
        assert torch.equal(v, plain.state_dict()[k]), k
    # a submodule put in eval mode on purpose (a BatchNorm frozen after epoch 1) stays so
    net, seen = _net(), []

    def freeze(record):
        seen.append((net.training, net[1].training))
        net[1].eval()

    _run(net, callbacks=[freeze])
    assert seen == [(True, True), (True, False), (True, False)]


def test_a_second_fit_that_trains_a_layer_the_first_kept_frozen_warns_and_names_it():
    # fit() leaves the model in eval mode, and a model in eval mode trains in training mode
    # throughout (documented): the BatchNorm frozen for the first fit trained at the second
    # without a word; it still does (its running mean moves), with a warning naming it
    net = _net()
    net[1].eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the first fit: no warning
        _run(net)
    assert not net.training and not net[1].training
    frozen = net[1].running_mean.clone()
    assert torch.equal(frozen, torch.zeros(8))
    words = (
        r"fit\(\) trains Sequential, in eval mode \(as the last fit\(\) left it\), in "
        r"training mode throughout, and with it 1, which the last fit\(\) trained in eval mode "
        r"\(frozen\): they train now .* call model.train\(\), then .eval\(\) on each \(here "
        r"model.get_submodule\('1'\).eval\(\)\), before fit\(\)"
    )
    with pytest.warns(UserWarning, match=words) as seen:
        _run(net)
    assert seen[0].filename == __file__  # the user's line
    assert not torch.equal(net[1].running_mean, frozen)  # trained, as documented
    net.train()  # as told: kept frozen, no warning
    net[1].eval()
    kept = net[1].running_mean.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(net)
    assert torch.equal(net[1].running_mean, kept)
    net.train()  # all layers trained on purpose: no warning at the next fit either
    _run(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(net)


def test_the_warning_names_a_frozen_layer_as_the_wrapper_the_user_holds_does():
    # a pyrouq model in DataParallel (trained as the model inside) was named BayesianNetwork,
    # with model.get_submodule('net.1'), which the DataParallel the user holds has not
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    held = nn.DataParallel(model)
    model.net[1].eval()
    x, y = toy_data(20)
    loader = pyrouq.ArrayLoader(x, y, 5, seed=0)
    fit(held, guide, loader, epochs=1, progress=False, seed=0)
    words = (
        "fit() trains BayesianNetwork (in DataParallel), in eval mode (as the last fit() left "
        "it), in training mode throughout, and with it module.net.1, which the last fit() "
    )
    with pytest.warns(UserWarning) as seen:
        fit(held, guide, loader, epochs=1, progress=False, seed=0)
    assert str(seen[0].message).startswith(words)
    assert "(here model.get_submodule('module.net.1').eval())" in str(seen[0].message)
    assert held.get_submodule("module.net.1") is model.net[1]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_an_error_raised_by_a_callback_says_where_fit_stopped(tmp_path):
    net, path = _net(), tmp_path / "run.pt"

    def fails(record):
        if record.epoch == 2:
            raise RuntimeError("my monitor failed")

    with pytest.raises(RuntimeError, match="my monitor failed") as info:
        _run(net, callbacks=[fails], checkpoint=path)
    assert info.value.__notes__ == [
        "(raised by the callback fails at the end of epoch 2 of fit(): training stopped, the "
        f"model and guide keep epoch 2's parameters; checkpoint {str(path)!r} holds that "
        "epoch's end. A callback stops a run and keeps its FitResult by raising "
        "KeyboardInterrupt: fit() then raises TrainingInterrupted carrying it.)"
    ]
    assert not net.training
    assert len(pyrouq.load(path, module=_net()).training["history"]) == 2


def test_a_callback_that_takes_no_record_is_refused_before_training():
    net = _net()
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(TypeError, match=r"callbacks\[1\] \(<lambda>\) cannot be called as "
                       r"callback\(record\) \(too many positional arguments\): fit\(\) calls "
                       r"each callback with the epoch's EpochRecord after every epoch\. Give it "
                       r"one parameter"):  # fmt: skip
        _run(net, callbacks=[print, lambda: None])
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_a_callback_that_puts_only_the_guide_in_eval_mode_leaves_it_training():
    """Only the model's mode was looked at: a guide left in eval mode trained on so."""
    x, y = toy_data(20)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)))
    guide = pyrouq.mean_field_guide(model)
    seen = []

    def evaluate(record):
        seen.append(guide.training)
        guide.eval()

    fit(model, guide, pyrouq.ArrayLoader(x, y, 5, seed=0), epochs=3, progress=False,
        callbacks=[evaluate])  # fmt: skip
    assert seen == [True, True, True] and guide.training


def test_decorated_callbacks_and_optim_factories_supplying_an_argument_still_run():
    """The signature checks followed __wrapped__ to the inner function, which takes an
    argument the decorator supplies: valid callables were refused before training."""

    def inject(f):
        @functools.wraps(f)
        def wrapper(record):
            return f(record, "logger")

        return wrapper

    def with_lr(f):
        @functools.wraps(f)
        def wrapper(params):
            return f(params, 0.1)

        return wrapper

    seen = []

    @inject
    def log(record, logger):
        seen.append((logger, record.epoch))

    @with_lr
    def make(params, lr):
        return torch.optim.SGD(params, lr=lr)

    result = _run(_net(), callbacks=[log], optim=make)
    assert seen == [("logger", 1), ("logger", 2), ("logger", 3)]
    assert all(math.isfinite(v) for v in result.losses)


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_values_a_callback_sets_in_pyros_param_store_are_those_the_next_epoch_trains(kind):
    """fit() registers the model's and guide's parameters in Pyro's param store at the first
    step of each epoch, not at the later ones (which find them there): values a callback sets
    in the store between epochs (a store loaded from a file) are still taken up by the next
    epoch's steps. With an optimizer of lr 0 the run ends on those values."""
    import pyro

    pyro.clear_param_store()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    if kind == "bayesian":
        model = pyrouq.bayesian(net, select="last_layer")
        guide = pyrouq.mean_field_guide(model)
    else:
        model, guide = pyrouq.batchensemble(net, 2), None
    store = pyro.get_param_store()

    def set_store(record):
        if record.epoch == 1:
            for name, value in list(store.items()):
                store[name] = torch.full_like(value.detach(), 0.25)

    x, y = toy_data(20)
    loader = pyrouq.ArrayLoader(x, y, 5, seed=0)
    still = functools.partial(torch.optim.SGD, lr=0.0)
    fit(model, guide, loader, epochs=2, optim=still, lr_schedule="constant",
        callbacks=[set_store], progress=False, seed=0)  # fmt: skip
    trained = [p for m in (model, guide) if m is not None for p in m.parameters()]
    assert len(trained) >= 2 and len(store.keys()) == len(trained)
    for param in trained:
        assert torch.equal(param.detach(), torch.full_like(param, 0.25))
