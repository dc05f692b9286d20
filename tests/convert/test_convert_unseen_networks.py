"""Audit 12, a new user's networks: the documented recipes run on networks unlike the suite's
(a bilinear head, a backbone kept fixed under ``torch.no_grad()``, a text classifier given
token ids outside its vocabulary, a deep bidirectional LSTM, an embedding + Conv1d + GroupNorm +
PReLU + ConvTranspose1d network as a BatchEnsemble).

Found: ``select=None`` and ``select="last_layer"`` left an ``nn.Bilinear`` (torch's other
linear layer) a point estimate without a word, so a network with a bilinear head predicted
with a deterministic head (``last_layer`` made an earlier Linear latent instead); and a
forward that runs latent layers under ``torch.no_grad()``, the torch way of keeping a
pretrained backbone fixed, trained their guide on the KL alone: the backbone drifted to the
prior and accuracy fell from 0.95 to 0.45 without a word (now a warning at the first run with
gradients in training mode and in mcmc(), not for a layer also read as a tensor with
gradients, nor in eval mode elsewhere); and ids outside an embedding's table met torch's bare
"index out of range in self". The checks compare the draws with the plain torch network given
the drawn weights."""

from __future__ import annotations

import copy
import warnings

import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

from pyrouq import (
    ArrayLoader,
    batchensemble,
    bayesian,
    fit,
    mcmc,
    mean_field_guide,
    predict,
    rank1,
    temperature_scale,
    to_inference_data,
)


def _guide_draw(guide, x):
    """One draw of every latent site from ``guide`` (Pyro's own trace)."""
    trace = poutine.trace(guide).get_trace(x)
    return {k: v["value"] for k, v in trace.nodes.items() if v["type"] == "sample"}


def _plain_with(net, draw):
    """A copy of the plain ``net`` holding the drawn weights (the independent reference)."""
    ref = copy.deepcopy(net)
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for name, value in draw.items():
            params[name].copy_(value)
    return ref


# ---------------------------------------------------------------------------------------------
# nn.Bilinear


class _BilinearHead(nn.Module):
    """Two feature branches joined by a bilinear output layer (a PReLU between)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 8)
        self.b = nn.Linear(3, 8)
        self.act = nn.PReLU(8)
        self.bil = nn.Bilinear(8, 8, 2)

    def forward(self, x):
        return self.bil(self.act(self.a(x[:, :3])), self.act(self.b(x[:, 3:])))


def test_select_none_makes_a_bilinear_layer_latent_and_draws_it():
    torch.manual_seed(0)
    net = _BilinearHead()
    model = bayesian(net)
    sites = model.latent_sites()
    assert list(sites) == ["a.weight", "a.bias", "b.weight", "b.bias", "bil.weight", "bil.bias"]
    assert tuple(sites["bil.weight"]) == (2, 8, 8)
    guide = mean_field_guide(model)
    x = torch.randn(5, 6)
    draw = _guide_draw(guide, x)
    with torch.no_grad(), poutine.condition(data=draw):
        out = model(x)
    reference = _plain_with(net, draw)(x).detach()
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-6)
    assert (out - net(x)).abs().max() > 1e-4  # the head's draw moved the outputs


def test_last_layer_of_a_network_with_a_bilinear_head_is_that_head():
    torch.manual_seed(0)
    model = bayesian(_BilinearHead(), select="last_layer")
    assert list(model.latent_sites()) == ["bil.weight", "bil.bias"]


# ---------------------------------------------------------------------------------------------
# A block run under torch.no_grad()


def _data(n=80):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long()


class _FixedByNoGrad(nn.Module):
    """Keeps its backbone fixed the way torch code often does: no gradients through it."""

    def __init__(self, both=False):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)
        self.both = both

    def forward(self, x):
        with torch.no_grad():
            h = self.backbone(x)
        if self.both:  # the backbone also runs with gradients: it trains
            h = h + self.backbone(x)
        return self.head(h)


_WARNING = (
    "_FixedByNoGrad's forward ran the layers 'backbone.0', 'backbone.2', which hold latent "
    "weights, only under torch.no_grad() (or torch.inference_mode()) in its first run with "
    "gradients: their draws get no gradient from the data there, so fit() would train their "
    "guide on the KL alone, toward the prior (random weights), and mcmc() would miss their part "
    "of the gradient."
)
_ADVICE = (
    "To keep those weights fixed, freeze them before converting (layer.requires_grad_(False); "
    "select=None leaves frozen parameters out) or leave them out of select=; to make them "
    "Bayesian, run them with gradients. If a later step runs them with gradients (staged "
    "fine-tuning: a backbone unfrozen after some steps), ignore this warning."
)


def _no_grad_warnings(caught):
    """The warnings of ``caught`` about latent layers run only under torch.no_grad()."""
    return [w for w in caught if "only under torch.no_grad()" in str(w.message)]


def test_fit_warns_once_of_latent_layers_run_only_under_no_grad():
    x, y = _data()
    model = bayesian(_FixedByNoGrad())
    guide = mean_field_guide(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, guide, ArrayLoader(x, y, batch_size=40, seed=0), epochs=2, progress=False)
    (warning,) = _no_grad_warnings(caught)  # once, not at each of the 4 steps
    text = " ".join(str(warning.message).split())
    assert _WARNING in text and _ADVICE in text
    assert issubclass(warning.category, UserWarning) and warning.filename == __file__  # fit()
    # eval mode with gradients is not fit()'s: not watched, and predicting warns of nothing
    model.eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x)
        predict(model, x, guide, num_samples=2, progress=False)
    assert not _no_grad_warnings(caught)


def test_no_grad_warning_as_an_error_stops_fit_before_a_step_each_time():
    x, y = _data()
    model = bayesian(_FixedByNoGrad())
    guide = mean_field_guide(model)
    loader = ArrayLoader(x, y, batch_size=40, seed=0)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    for _ in range(2):  # (python -W error): an error at every try, not once
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(UserWarning, match=r"only under torch\.no_grad\(\)"):
                fit(model, guide, loader, epochs=1, progress=False)
    assert all(torch.equal(v, guide.state_dict()[k]) for k, v in before.items())  # no step
    with warnings.catch_warnings():  # silenced by its words, as the docs say: it trains
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*only under torch.no_grad")
        fit(model, guide, loader, epochs=1, progress=False)
    assert any(not torch.equal(v, guide.state_dict()[k]) for k, v in before.items())


def test_no_grad_warning_covers_local_reparameterization_rank1_pyro_svi_and_mcmc():
    x, y = _data(40)
    loader = ArrayLoader(x, y, batch_size=40, seed=0)
    local = bayesian(_FixedByNoGrad(), local_reparameterization=True)
    with pytest.warns(UserWarning, match=r"only under torch\.no_grad"):
        fit(local, mean_field_guide(local), loader, epochs=1, progress=False)
    ranked = rank1(_FixedByNoGrad(), 2)
    named = r"'backbone\.0', 'backbone\.2'.*only under torch\.no_grad"
    with pytest.warns(UserWarning, match=named):
        fit(ranked, mean_field_guide(ranked), loader, epochs=1, progress=False)
    model = bayesian(_FixedByNoGrad())
    model.num_data = len(x)
    svi = pyro.infer.SVI(
        model, mean_field_guide(model), pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO()
    )
    with pytest.warns(UserWarning, match=r"only under torch\.no_grad"):
        svi.step(x, y)
    small = bayesian(_FixedByNoGrad())  # mcmc() runs the network in eval mode: watched too
    with pytest.warns(UserWarning, match=r"only under torch\.no_grad") as caught:
        result = mcmc(small, x, y, num_samples=2, warmup_steps=2, num_chains=1, progress=False)
    assert len(_no_grad_warnings(caught)) == 1
    assert result.samples["backbone.0.weight"].shape[:2] == (1, 2)


class _Staged(nn.Module):
    """Holds its backbone fixed for its first 3 training steps, then fine-tunes it."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)
        self.steps = 0

    def forward(self, x):
        self.steps += int(self.training and torch.is_grad_enabled())
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.steps > 3):
            h = self.backbone(x)
        return self.head(h)


def test_staged_fine_tuning_trains_with_one_warning():
    x, y = _data()
    model = bayesian(_Staged())
    guide = mean_field_guide(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, guide, ArrayLoader(x, y, batch_size=10, seed=0), epochs=2, progress=False)
    (warning,) = _no_grad_warnings(caught)
    assert "'backbone.0'" in str(warning.message) and "staged fine-tuning" in str(warning.message)
    assert model.net.steps == 16  # every step ran


class _TiedMonitor(nn.Module):
    """Reads a layer's weight and bias with gradients (``F.linear``) and calls the layer only
    under torch.no_grad(), for a monitored statistic: the weights still get gradients."""

    def __init__(self, bias_read=True):
        super().__init__()
        self.mon = nn.Linear(4, 8)
        self.head = nn.Linear(8, 2)
        self.bias_read = bias_read

    def forward(self, x):
        with torch.no_grad():
            self.last_norm = self.mon(x).norm()
        h = nn.functional.linear(x, self.mon.weight, self.mon.bias if self.bias_read else None)
        return self.head(h.relu())


@pytest.mark.parametrize("local", [False, True])
def test_a_layer_read_as_a_tensor_with_gradients_besides_a_no_grad_call_is_not_warned(local):
    x, y = _data(40)
    loader = ArrayLoader(x, y, batch_size=40, seed=0)
    model = bayesian(_TiedMonitor(), local_reparameterization=local)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, mean_field_guide(model), loader, epochs=1, progress=False)
    assert not _no_grad_warnings(caught)
    partly = bayesian(_TiedMonitor(bias_read=False), local_reparameterization=local)
    with pytest.warns(UserWarning, match=r"the layer 'mon', which holds latent weights, only"):
        fit(partly, mean_field_guide(partly), loader, epochs=1, progress=False)


class _EvalMonitor(nn.Module):
    """Computes a monitored score under torch.no_grad() in eval mode only, from a layer of
    its own: a network whose gradients in eval mode (a saliency map) are the user's."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)
        self.monitor = nn.Linear(4, 1)

    def forward(self, x):
        if not self.training:
            with torch.no_grad():
                self.last_score = self.monitor(x).mean()
        return self.head(self.backbone(x))


class _NoGradInEval(nn.Module):
    """Runs every layer under torch.no_grad() in eval mode, with gradients in training mode."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.training):
            return self.head(self.backbone(x))


def test_eval_mode_with_gradients_is_not_warned_but_mcmc_is():
    x, y = _data(40)
    model = bayesian(_EvalMonitor())
    guide = mean_field_guide(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, guide, ArrayLoader(x, y, batch_size=40), epochs=1, progress=False)
        model.eval()  # a saliency map: the outputs' gradient with respect to the input
        inputs = x.clone().requires_grad_()
        with poutine.replay(trace=poutine.trace(guide).get_trace(x)):
            model(inputs).sum().backward()
    assert not _no_grad_warnings(caught) and inputs.grad.abs().sum() > 0
    # NUTS runs the network in eval mode, where this one gets no gradient
    fresh = bayesian(_NoGradInEval())
    with pytest.warns(UserWarning, match=r"the layers 'backbone\.0', 'head', which hold latent"):
        mcmc(fresh, x, y, num_samples=2, warmup_steps=2, num_chains=1, progress=False)


def test_no_grad_blocks_that_hold_no_latent_weight_or_also_run_with_gradients_train():
    x, y = _data()
    loader = ArrayLoader(x, y, batch_size=40, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the torch recipe the message gives: freeze the backbone, a Bayesian head on it
        net = _FixedByNoGrad()
        net.backbone.requires_grad_(False)
        frozen = bayesian(net)
        assert list(frozen.latent_sites()) == ["head.weight", "head.bias"]
        fit(frozen, mean_field_guide(frozen), loader, epochs=1, progress=False)
        both = bayesian(_FixedByNoGrad(both=True))
        fit(both, mean_field_guide(both), loader, epochs=1, progress=False)
        plain_ensemble = batchensemble(_FixedByNoGrad(), 2)  # no latent sites: torch's semantics
        fit(plain_ensemble, None, loader, epochs=1, progress=False)
        model = bayesian(_FixedByNoGrad())  # predicting runs without gradients anyway
        guide = mean_field_guide(model)
        preds = predict(model, x, guide, num_samples=2, progress=False)
        assert preds.probs.shape == (2, 80, 2)
        temperature_scale(preds, y)
        to_inference_data(model, guide, x, y, num_samples=2)
    assert not _no_grad_warnings(caught)


# ---------------------------------------------------------------------------------------------
# Token ids outside an embedding's table


class _Bag(nn.Module):
    """Mean-pooled token embeddings: a text classifier on integer ids."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.emb(x).mean(1))


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_ids_outside_the_vocabulary_name_the_embedding_and_the_ids(kind):
    x = torch.tensor([[1, 2, 3], [4, 11, 0]])  # 11: a token unseen in a vocabulary of 10
    y = torch.tensor([0, 1])
    model = bayesian(_Bag()) if kind == "bayesian" else batchensemble(_Bag(), 2)
    guide = mean_field_guide(model) if kind == "bayesian" else None
    expected = (
        "index out of range in self: Embedding(10, 4) at 'net.emb' of the model has rows for "
        "ids 0 to 9, and its input held others (ids from 0 to 11). Map ids outside the "
        "vocabulary to one in [0, 10)"
    )
    with pytest.raises(IndexError) as info:  # torch's type, kept
        fit(model, guide, [(x, y)], num_data=2, epochs=1, progress=False)
    assert expected in str(info.value)
    with pytest.raises(IndexError) as info:
        predict(model, x, guide, num_samples=2 if guide else None, progress=False)
    assert expected in str(info.value)


# ---------------------------------------------------------------------------------------------
# Networks that already worked: the draws and members against plain torch


def test_latent_weights_of_a_deep_bidirectional_lstm_are_the_drawn_ones():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    torch.manual_seed(0)
    net = Net()
    model = bayesian(net, select=["rnn"])
    assert len(model.latent_sites()) == 16  # 2 layers x 2 directions x (w_ih, w_hh, b_ih, b_hh)
    x = torch.randn(6, 5, 3)
    draw = _guide_draw(mean_field_guide(model), x)
    with torch.no_grad(), poutine.condition(data=draw):
        out = model(x)
    torch.testing.assert_close(out, _plain_with(net, draw)(x).detach(), rtol=0, atol=1e-6)
    assert (out - net(x)).abs().max() > 1e-4


@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_batchensemble_members_of_an_embedding_conv1d_groupnorm_network(norms):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(12, 6)
            self.conv = nn.Conv1d(6, 8, 3, padding=1)
            self.gn = nn.GroupNorm(2, 8)
            self.act = nn.PReLU(8)
            self.up = nn.ConvTranspose1d(8, 4, 2, stride=2)
            self.ln = nn.LayerNorm(4)
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            h = self.act(self.gn(self.conv(self.emb(x).transpose(1, 2))))
            return self.head(self.ln(self.up(h).transpose(1, 2)).mean(1))

    torch.manual_seed(0)
    net = Net()
    ens = batchensemble(net, 3, norms=norms).eval()
    x = torch.randint(0, 12, (7, 5))  # token ids, taken as they are
    with torch.no_grad():
        out = ens(x)
    assert out.shape == (3, 7, 3)
    for m in range(3):
        ref = copy.deepcopy(net).eval()
        with torch.no_grad():
            for name in ("conv", "up", "head"):
                weights, biases = getattr(ens.net, name).folded_weights()
                getattr(ref, name).weight.copy_(weights[m])
                getattr(ref, name).bias.copy_(biases[m])
            for name in ("gn", "ln"):
                norm = getattr(ens.net, name)
                own = norm.norms[m] if norms == "per_member" else norm
                getattr(ref, name).load_state_dict(own.state_dict())
            torch.testing.assert_close(out[m], ref(x), rtol=0, atol=1e-6)
