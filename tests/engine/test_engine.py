"""The converted networks compute what plain PyTorch computes, whatever the engine's CPU
speed paths do underneath (pooling kernels, the ReLU / max-pooling swap, the channels-last
layout, chunked batches, the folded BatchEnsemble batch): compared on networks that once
fooled one of them."""

from __future__ import annotations

import copy

import pyro
import pytest
import torch
from torch import nn

from pyrouq import batchensemble, bayesian, fit, mean_field_guide, predict, rank1


def _plain_and_bayesian(net):
    """The network and ``bayesian(net)``'s outputs at its own weights (eval mode)."""
    model = bayesian(net).eval()
    with torch.no_grad():
        return net.eval(), lambda x: model.outputs(x, model.template())


def _ensemble_of_one_weight(net, members=2):
    """``batchensemble(net)`` whose factors are 1 and biases the network's: every member is
    the network."""
    return batchensemble(net, members, r_std=0.0, s_std=0.0).eval()


def test_user_hooks_on_pools_relus_and_converted_layers_still_run():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3, padding=1),
        nn.MaxPool2d(3, 2, 1), nn.Flatten(), nn.Linear(4 * 2 * 2, 3),
    )  # fmt: skip
    net[2].register_forward_hook(lambda m, i, o: o * 2)  # on a pool
    net[1].register_forward_hook(lambda m, i, o: -o)  # on the ReLU before a 2x2 pool
    net[4].register_forward_pre_hook(lambda m, i: (i[0] + 1,))
    net[6].register_forward_hook(lambda m, i, o: o + 5)  # on a layer batchensemble converts
    x = torch.randn(3, 1, 9, 9)
    plain, outputs = _plain_and_bayesian(net)
    with torch.no_grad():
        expected = plain(x)
        torch.testing.assert_close(outputs(x), expected)
        members = _ensemble_of_one_weight(copy.deepcopy(net))(x)
    torch.testing.assert_close(members, expected.expand(2, -1, -1))


class _Taps(nn.Module):
    """A parent that runs its Sequential in slices (a feature tap), as perceptual losses do."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Linear(4 * 3 * 3 + 4 * 7 * 7, 3)

    def forward(self, x):
        tap = self.f[:2](x)  # conv and ReLU: before the pooling
        return self.head(torch.cat([tap.flatten(1), self.f[2:](tap)], 1))


def test_a_sequential_read_by_position_keeps_its_order():
    torch.manual_seed(0)
    net, x = _Taps(), torch.randn(3, 1, 9, 9)
    plain, outputs = _plain_and_bayesian(net)
    with torch.no_grad():
        expected = plain(x)
        torch.testing.assert_close(outputs(x), expected)
        torch.testing.assert_close(_ensemble_of_one_weight(copy.deepcopy(net))(x)[1], expected)
    assert type(bayesian(net).net.f[1]) is nn.ReLU  # the children keep their places


def test_a_batchnorm_without_running_statistics_normalises_the_whole_batch():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.ReLU(), nn.Linear(8, 3)
    )
    x = torch.randn(600, 4)  # above the CPU chunk of 512 inputs
    plain, outputs = _plain_and_bayesian(net)
    with torch.no_grad():
        expected = plain(x)
        torch.testing.assert_close(outputs(x), expected)
    model = bayesian(net)
    probs = predict(model, x, mean_field_guide(model, init_scale=1e-8), num_samples=1).probs[0]
    torch.testing.assert_close(probs, torch.softmax(expected, -1), rtol=1e-5, atol=1e-6)


def test_members_of_a_folded_batch_keep_their_own_dropout_masks():
    # a shared train-mode BatchNorm runs the members as one folded batch; an in-place
    # dropout on the repeated input must still give each member its own mask
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Dropout(0.5, inplace=True), nn.Linear(1, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)
    )
    ensemble = batchensemble(net, 2, norms="shared", r_std=0.0, s_std=0.0).train()
    out = ensemble(torch.ones(64, 1))
    assert (out[0] - out[1]).abs().max() > 0.1  # identical factors: only the masks differ


class _Viewer(nn.Module):
    """Convolutions wide enough for the engine's channels-last layout, then ``.view``."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.drop = nn.Conv2d(16, 16, 3, padding=1), nn.Dropout(0.3)
        self.fc = nn.Linear(16 * 8 * 8, 3)

    def forward(self, x):
        h = torch.relu(self.c2(self.drop(torch.relu(self.bn(self.c1(x))))))
        return self.fc(h.view(h.size(0), -1))  # fails on a channels-last activation


def test_a_forward_that_views_its_activations_runs_and_trains_as_in_torch():
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 3, (16,))

    def run(nchw):
        torch.manual_seed(0)
        model = bayesian(_Viewer())
        guide = mean_field_guide(model)
        if nchw:  # the layout the engine falls back to, from the start
            model.net._pyrouq_nchw_only = True
        losses = fit(model, guide, [(x, y)], epochs=2, num_data=16, progress=False, seed=0).losses
        pyro.set_rng_seed(1)
        probs = predict(model, x, guide, num_samples=2).probs
        return losses, model.net.bn.running_mean.clone(), probs

    fallen_back, torch_layout = run(False), run(True)
    assert fallen_back[0] == torch_layout[0]  # the failed first attempt left no trace
    assert torch.equal(fallen_back[1], torch_layout[1]) and torch.equal(
        fallen_back[2], torch_layout[2]
    )
    torch.manual_seed(0)
    net = _Viewer().eval()
    with torch.no_grad():
        torch.testing.assert_close(_ensemble_of_one_weight(net)(x)[0], net(x))


class _SequenceFirst(nn.Module):
    """A transformer layer that takes (T, B, F), as torch's default batch_first=False does."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.enc = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):  # (B, T, F)
        x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        return self.fc(self.enc(x.transpose(0, 1)).mean(0))


def test_sequence_first_activations_keep_the_members_apart_in_a_folded_batch():
    from pyrouq import _engine

    torch.manual_seed(0)
    ensemble = batchensemble(_SequenceFirst(), 2).eval()
    with torch.no_grad():  # members with norms of their own, as after training
        for p in ensemble.net.enc.parameters():
            if p.dim() == 2 and p.shape[0] == 2:  # the per-member copies' and factors' rows
                p.add_(torch.randn_like(p) * 0.3)
        for norms in (ensemble.net.enc.norm1.norms, ensemble.net.enc.norm2.norms):
            norms[1].weight.mul_(2.0)
    for t in (4, 12):  # T a multiple of M (once mixed the members), T = M * B (once looped)
        x = torch.randn(6, t, 4)
        with torch.no_grad(), _engine.schedule("cpu"):
            member_passes = ensemble(x)
        with torch.no_grad(), _engine.schedule("accelerator"):
            folded = ensemble(x)  # one folded batch (M * B): the members on dim 1 inside
        torch.testing.assert_close(folded, member_passes, rtol=1e-5, atol=1e-6)
    # a shared train-mode BatchNorm folds the batch on CPU too; T = 5 once crashed there
    model = rank1(_SequenceFirst(), 2)
    x, y = torch.randn(32, 5, 4), torch.randint(0, 3, (32,))
    fit(model, mean_field_guide(model), [(x, y)], epochs=1, num_data=32, progress=False)


def test_predict_and_fit_keep_a_batchnorm_the_user_froze_in_eval_mode():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model = bayesian(net)
    guide = mean_field_guide(model)
    model.train()
    model.net[1].eval()  # its running statistics are to stay as they are
    before = model.net[1].running_mean.clone()
    predict(model, torch.randn(10, 6), guide, num_samples=2)
    assert model.training and not model.net[1].training
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    fit(model, guide, [(x, y)], epochs=2, num_data=32, progress=False)
    assert torch.equal(model.net[1].running_mean, before)  # trained with it in eval mode
    assert not model.training  # fit leaves the model in eval mode


def test_a_pooling_with_nothing_to_pool_fails_as_in_torch():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2, 3))
    model = bayesian(net)
    x = torch.randn(2, 1, 3, 3)  # a 1 x 1 map into a 2 x 2 pooling
    with pytest.raises(RuntimeError, match="Output size is too small"):
        net(x)
    with pytest.raises(RuntimeError, match="Output size is too small"):
        model.outputs(x, model.template())  # not an empty map, met later as a shape error


def test_a_network_left_in_eval_mode_is_converted_into_a_model_that_trains():
    # fit() leaves a network in eval mode; its conversion must not train with BatchNorm and
    # dropout stuck there (pre-train, then convert, as tutorial 2 does)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 3))
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    fit(net, None, [(x, y)], epochs=1, num_data=32, progress=False)
    assert not net[1].training
    for model in (bayesian(net), batchensemble(net, 2, norms="shared")):
        assert all(m.training for m in model.modules())
        before = model.net[1].running_mean.clone()
        guide = mean_field_guide(model) if hasattr(model, "latent_sites") else None
        fit(model, guide, [(x, y)], epochs=1, num_data=32, progress=False)
        assert not torch.equal(model.net[1].running_mean, before)  # trained in training mode


def test_the_plain_network_given_back_is_made_of_torchs_own_modules(tmp_path):
    def make():
        return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Sequential(nn.Linear(8, 3)))  # fmt: skip

    plain = bayesian(make()).plain_network()
    assert {type(m) for m in plain.modules()} == {type(m) for m in make().modules()}
    from pyrouq import load, save

    back = load(save(tmp_path / "p.pt", plain), module=make()).model
    x = torch.randn(2, 1, 6, 6)
    torch.testing.assert_close(back(x), plain(x))


class _Shifting(_Viewer):
    """A forward that changes its input in place before it views an activation."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)  # one input channel: channels-last in place

    def forward(self, x):
        return super().forward(x.sub_(0.5))


def test_the_fallback_retries_on_the_input_as_it_was():
    torch.manual_seed(0)
    model = bayesian(_Shifting()).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        fallen_back = model.outputs(x.clone(), model.template())
        model.net._pyrouq_nchw_only = True  # torch's layout from the start
        torch_layout = model.outputs(x.clone(), model.template())
    assert torch.equal(fallen_back, torch_layout)


class _Windows(nn.Module):
    """Windows merged into the batch (member-major still), tokens on dim 1, as window
    attention does: (B * P, T, F)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):  # (B, P * T, 3)
        n = x.shape[0]
        h = self.lin(x.reshape(n * 2, 4, 3))
        return self.head(h.reshape(n, 8, 3).mean(1))


def test_windows_merged_into_the_batch_keep_the_members_apart():
    from pyrouq import _engine

    torch.manual_seed(0)
    ensemble = batchensemble(_Windows(), 2, init="random_sign").eval()
    x = torch.randn(2, 8, 3)  # M * B = 4 = T: no sequence-first activations here
    with torch.no_grad(), _engine.schedule("cpu"):
        member_passes = ensemble(x)
    with torch.no_grad(), _engine.schedule("accelerator"):
        folded = ensemble(x)
    torch.testing.assert_close(folded, member_passes, rtol=1e-5, atol=1e-6)


def test_pooling_fast_paths_route_nan_gradients_and_take_torch_func_as_torch_does():
    """A 2x2 window's gradient goes to its last NaN, as torch's kernel sends it; torch.func
    transforms and forward-mode AD run through the swapped-in pools (torch's own there)."""
    import torch.autograd.forward_ad as fwAD

    from pyrouq._engine import MaxPool2x2

    nan = float("nan")
    x = torch.tensor([[1.0, nan, 2.0, 3.0], [4.0, 0.0, nan, nan], [0.0, 1.0, 5.0, 6.0],
                      [2.0, 2.0, 7.0, 8.0]]).view(1, 1, 4, 4)  # fmt: skip
    grads = []
    for pool in (MaxPool2x2(), nn.MaxPool2d(2)):
        leaf = x.clone().requires_grad_()
        pool(leaf).sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(4 * 3 * 3, 3))  # fmt: skip
    model, images = batchensemble(net, 2), torch.randn(2, 1, 8, 8)
    saliency = torch.func.grad(lambda z: model.outputs(z).sum())(images)
    leaf = images.clone().requires_grad_()
    model.outputs(leaf).sum().backward()
    torch.testing.assert_close(saliency, leaf.grad)
    with fwAD.dual_level():
        dual = fwAD.make_dual(images, torch.ones_like(images))
        tangent = fwAD.unpack_dual(model.outputs(dual)).tangent
    assert tangent.shape == (2, 2, 3) and torch.isfinite(tangent).all()


def test_swapping_relu_and_pooling_stays_invisible():
    """ReLU then 2x2 pooling runs pooling first on CPU only where no one could tell: not under
    a global module hook, and an in-place ReLU not after a layer that hands on its input."""
    from torch.nn.modules.module import register_module_forward_hook

    seen = []
    handle = register_module_forward_hook(lambda m, i, o: seen.append(m._get_name()))
    try:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(8, 3))  # fmt: skip
        model = bayesian(net)
        predict(model, torch.randn(1, 1, 6, 6), mean_field_guide(model), num_samples=1)
    finally:
        handle.remove()
    order = [name for name in seen if name in ("ReLU", "MaxPool2d")]
    assert order[:2] == ["ReLU", "MaxPool2d"]
    torch.manual_seed(0)
    hands_on = nn.Sequential(nn.Identity(), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(4, 3))  # fmt: skip
    model = bayesian(hands_on, select=["4"])
    x = torch.randn(2, 1, 4, 4)
    predict(model, x, mean_field_guide(model), num_samples=1)
    assert x.min() == 0  # rectified in place, as torch does through the Identity

    class Keeps(nn.Conv2d):  # a convolution of one's own that keeps its output
        def forward(self, x):
            self.kept = super().forward(x)
            return self.kept

    torch.manual_seed(0)
    keeps = nn.Sequential(Keeps(1, 2, 3), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8, 3))  # fmt: skip
    model = bayesian(keeps, select=["4"])
    predict(model, torch.randn(2, 1, 6, 6), mean_field_guide(model), num_samples=1)
    assert model.net[0].kept.min() == 0  # rectified in place, as in torch
    # a global backward pre-hook sees the gradients in torch's order too
    order = []
    hook = torch.nn.modules.module.register_module_full_backward_pre_hook(
        lambda m, g: order.append((m._get_name(), tuple(g[0].shape))) and None
    )
    try:
        model = bayesian(net)
        leaf = torch.randn(1, 1, 6, 6, requires_grad=True)
        model.outputs(leaf, {k: torch.ones(v) for k, v in model.latent_sites().items()}).sum(
        ).backward()  # fmt: skip
    finally:
        hook.remove()
    pooling = [entry for entry in order if entry[0] in ("ReLU", "MaxPool2d")]
    assert pooling == [("MaxPool2d", (1, 2, 2, 2)), ("ReLU", (1, 2, 4, 4))]


def test_a_transformer_ensemble_predicting_beside_another_thread_calls_its_layers():
    """torch's fused transformer path is switched off while a BatchEnsemble transformer runs
    (it would read the layers' weights as tensors); a thread leaving must not switch it back
    on under another thread still running."""
    import threading
    import time

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.enc(x).mean(1))

    torch.manual_seed(0)
    a, b = batchensemble(Net(), 2).eval(), batchensemble(Net(), 2).eval()
    x = torch.randn(5, 4, 8)
    with torch.no_grad():
        alone = b.outputs(x)
        a.outputs(x)
    b_inside, a_left = threading.Event(), threading.Event()
    a.net.enc.register_forward_pre_hook(lambda m, i: b_inside.wait(5) and None)
    b.net.enc.register_forward_pre_hook(lambda m, i: (b_inside.set(), a_left.wait(5)) and None)
    out = {}

    def run_a():
        with torch.no_grad():
            a.outputs(x)
        a_left.set()

    def run_b():
        try:
            with torch.no_grad():
                out["b"] = b.outputs(x)
        except Exception as err:  # compared below
            out["b"] = err

    first = threading.Thread(target=run_a)
    first.start()
    time.sleep(0.3)  # A inside its forward, waiting for B
    second = threading.Thread(target=run_b)
    second.start()
    first.join(), second.join()
    assert isinstance(out["b"], torch.Tensor), out["b"]
    torch.testing.assert_close(out["b"], alone)


class _IntegerOutputs(nn.Module):
    """Outputs cast at the forward's end: ``(B, D)`` of another dtype than floating point."""

    def __init__(self, cast):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.cast = cast

    def forward(self, x):
        return self.cast(self.fc(x) * 3)


@pytest.mark.parametrize(
    ("cast", "dtype"),
    [(lambda t: t.round().long(), "torch.int64"), (lambda t: t > 0, "torch.bool")],
)
def test_outputs_that_are_not_floating_point_are_refused(cast, dtype):
    """A forward ending in .round().long() was taken: its integer logits met the likelihood,
    fit() trained nothing through them (a BatchEnsemble's loss stayed 13.7496 every epoch; a
    Bayesian network's weights moved by the KL alone) and predict() gave probabilities, with
    no word; plain torch's cross_entropy refuses them."""
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    for model in (
        bayesian(_IntegerOutputs(cast), num_data=6),
        batchensemble(_IntegerOutputs(cast), 2),
    ):
        with pytest.raises(TypeError) as err:
            model(x, y)
        assert str(err.value).startswith(
            f"_IntegerOutputs.forward returned outputs of dtype {dtype}; pyrouq needs "
            "floating-point outputs (logits for classification, means for regression)"
        )
        assert "before any rounding, .long(), .argmax()" in str(err.value)
