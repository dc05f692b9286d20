"""Third audit of bring-your-own-network conversion, as a user with torchvision models and
networks of their own: draws against a copy with the weights loaded, a tied decoder under local
reparameterisation, parameters held outside torch's registry, a forward that reads
next(self.parameters())."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _toy import loaded_copy
from pyro import poutine
from torch import nn

from pyrouq import KLWeightedELBO, bayesian, mean_field_guide, predict


@pytest.mark.parametrize("which", ["mobilenet_v3_small", "vit"])
def test_a_guide_draw_runs_the_torchvision_network_with_those_weights_loaded(which):
    """Every parameter latent (BatchNorm, the class token and MultiheadAttention's
    in_proj_weight included): one guide draw gives the outputs of a copy with that draw loaded,
    with and without gradients (MultiheadAttention's fused eval path)."""
    tvm = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    if which == "vit":
        net = tvm.VisionTransformer(
            image_size=32, patch_size=16, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32,
            num_classes=10,
        )  # fmt: skip
    else:
        net = tvm.mobilenet_v3_small(num_classes=10)
    with torch.no_grad():  # away from the zero head and tiny logits of torchvision's init
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, p[0].numel() ** -0.5)
    model = bayesian(net, select=lambda name, p: True)
    guide = mean_field_guide(model, init_scale=0.05)
    x = torch.randn(2, 3, 32, 32)
    trace = poutine.trace(guide).get_trace(x)
    draw = {s: trace.nodes[s]["value"].detach() for s in model.network_sites()}
    assert len(draw) == len(list(net.parameters()))
    model.eval()
    ref = loaded_copy(net, draw)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(model.outputs(x, draw), ref(x), rtol=1e-5, atol=1e-5)
    assert predict(model, x, guide, num_samples=3, progress=False).probs.shape == (3, 2, 10)


class _TiedDecoder(nn.Module):
    """An autoencoder-like classifier whose decoder is the encoder's weight, transposed."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 3)

    def forward(self, x):
        return F.linear(torch.tanh(self.enc(x)), self.enc.weight.t())


def test_local_reparameterisation_draws_whole_a_layer_whose_weight_the_forward_also_reads():
    """enc is called once, and the forward also reads enc.weight as a tensor: drawing enc's
    pre-activations left that read at the network's initial weight, never the guide's (the
    decoder never trained). With scales near 0 both paths must give the NLL at the means."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randint(0, 6, (8,))
    local = bayesian(_TiedDecoder(), local_reparameterization=True, num_data=8)
    whole = bayesian(local.plain_network(), num_data=8)
    nll = []
    for model in (local, whole):
        guide = mean_field_guide(model, init_scale=1e-8)
        with torch.no_grad():
            guide.site_loc("enc.weight").mul_(-3.0)  # away from the initial weights
        nll.append(KLWeightedELBO(kl_weight=0.0).terms(model, guide, x, y).nll)
    loc = -3.0 * whole.template()["enc.weight"]
    logits = F.linear(torch.tanh(F.linear(x, loc, whole.template()["enc.bias"])), loc.t())
    expected = F.cross_entropy(logits, y, reduction="sum")  # N/B = 1
    torch.testing.assert_close(nll[1], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll[0], expected, rtol=1e-5, atol=1e-5)

    # a forward that reads only the weight's shape, dtype and size draws it by pre-activations:
    # under a seed, the NLL of one noise per unit and example (a whole draw gives another)
    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            assert self.fc.weight.shape[1] == x.shape[1] == self.fc.weight.size(1)
            return self.fc(x.to(self.fc.weight.dtype))

    y = y.clamp(max=2)
    model = bayesian(Reads(), local_reparameterization=True, num_data=8)
    guide = mean_field_guide(model, init_scale=0.5)
    torch.manual_seed(1)
    nll = KLWeightedELBO().terms(model, guide, x, y).nll
    with torch.no_grad():
        loc = [guide.site_loc(f"fc.{p}") for p in ("weight", "bias")]
        scale = [guide.site_scale(f"fc.{p}") for p in ("weight", "bias")]
        torch.manual_seed(1)
        mean, var = F.linear(x, *loc), F.linear(x**2, scale[0] ** 2, scale[1] ** 2)
        by_units = F.cross_entropy(mean + var.sqrt() * torch.randn(8, 3), y, reduction="sum")
        torch.manual_seed(1)
        drawn = [m + s * torch.randn_like(m) for m, s in zip(loc, scale, strict=True)]
        whole = F.cross_entropy(F.linear(x, *drawn), y, reduction="sum")
    assert abs(by_units - whole) > 1.0  # the two paths tell apart under this seed
    torch.testing.assert_close(nll, by_units, rtol=1e-5, atol=1e-5)


def test_a_latent_parameter_also_held_in_a_list_attribute_is_refused():
    """The list holds the parameter object the draws never replace: its forward ran with the
    initial weight, off by 18 from the draw, silently. torch's LSTM, which keeps its weights in
    a list too but refreshes it, converts and reads the draw."""

    class Listed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.fc = nn.Linear(6, 8), nn.Linear(8, 10)
            self.weights = [self.fc.weight]

        def forward(self, x):
            return F.linear(torch.relu(self.body(x)), self.weights[0], self.fc.bias)

    with pytest.raises(ValueError, match=r"'fc.weight' of Listed is also held in 'weights'") as e:
        bayesian(Listed())
    assert "self.fc.weight" in str(e.value) and "select=" in str(e.value)
    bayesian(Listed(), select=["body"])  # not latent: a point estimate, read where it is

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc = nn.LSTM(4, 5, batch_first=True), nn.Linear(5, 3)

        def forward(self, x):
            return self.fc(self.lstm(x)[0][:, -1])

    torch.manual_seed(0)
    net = Recurrent()
    model = bayesian(net, select=["lstm"])
    weights = {site: value + 0.5 for site, value in model.template().items()}
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(model.outputs(x, weights), loaded_copy(net, weights)(x))


def test_a_forward_reading_next_parameters_of_a_network_with_none_left_is_told_why():
    class NextParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(x.to(next(self.parameters()).dtype))

    x = torch.randn(2, 6)
    model = bayesian(NextParam())
    guide = mean_field_guide(model)
    with pytest.raises(RuntimeError, match=r"next\(self.parameters\(\)\).*x.device, x.dtype"):
        predict(model, x, guide, num_samples=2, progress=False)
    local = bayesian(NextParam(), local_reparameterization=True, num_data=2)
    with pytest.raises(RuntimeError, match=r"raised StopIteration\. If it reads"):
        KLWeightedELBO().terms(local, mean_field_guide(local), x, torch.tensor([0, 1]))
    model = bayesian(NextParam(), select=["fc.weight"])  # a parameter left there: runs
    probs = predict(model, x, mean_field_guide(model), num_samples=2, progress=False).probs
    assert probs.shape == (2, 2, 3)


def test_a_layer_registered_twice_in_a_sequential_is_told_how_to_call_it():
    block = nn.Linear(4, 4)
    net = nn.Sequential(block, nn.ReLU(), block, nn.Linear(4, 3))
    with pytest.raises(ValueError, match="one module called twice") as e:
        bayesian(net)
    assert "self.0" not in str(e.value)
