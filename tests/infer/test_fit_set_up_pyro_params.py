"""Review 9d: fit()'s set-up pass that looks for the pyro.params of a converted network of
the user's own (run where nothing else needed it: a model stating its number of classes) draws
nothing from the global random streams, so training draws what it drew without that pass."""

from __future__ import annotations

import pyro
import torch
import torch.nn.functional as F
from torch import nn

import pyrouq

torch.set_num_threads(1)


class AlwaysOnDropout(nn.Module):
    """Dropout kept on at evaluation too (MC dropout): it draws in eval mode, and in training
    draws exactly what ``nn.Dropout(0.2)`` draws."""

    def forward(self, h):
        return F.dropout(h, 0.2, training=True)


def _fit(own_class: bool):
    """fit() without a seed, from torch's global stream, of a Bayesian network stating its
    classes; ``own_class``: its dropout a class of the user's own (fit() then runs its set-up
    pass, in eval mode), else torch's ``nn.Dropout`` (no pass): the same draws in training."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    dropout = AlwaysOnDropout() if own_class else nn.Dropout(0.2)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), dropout, nn.Linear(8, 2))
    model = pyrouq.bayesian(net)
    model.num_classes = 2
    guide = pyrouq.mean_field_guide(model)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    y = (x[:, 0] > 0).long()
    loader = pyrouq.ArrayLoader(x, y, batch_size=10, shuffle=False)
    torch.manual_seed(1)
    result = pyrouq.fit(model, guide, loader, epochs=2, progress=False)
    locs = {k: v.clone() for k, v in guide.state_dict().items()}
    return result.losses, locs, torch.get_rng_state()


def test_the_set_up_pass_for_a_networks_pyro_params_draws_nothing():
    """The pass ran the always-on dropout in eval mode and advanced torch's stream before the
    first step: every loss and the trained guide moved (31.35 -> 30.67 in the first epoch)."""
    own_losses, own_guide, own_rng = _fit(own_class=True)
    torch_losses, torch_guide, torch_rng = _fit(own_class=False)
    assert own_losses == torch_losses
    assert own_guide.keys() == torch_guide.keys()
    assert all(torch.equal(own_guide[k], torch_guide[k]) for k in own_guide)
    assert torch.equal(own_rng, torch_rng)
