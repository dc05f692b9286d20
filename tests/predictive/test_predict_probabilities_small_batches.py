"""Review 3: the class-probabilities refusal where batches are too small to tell alone."""

import pytest
import torch
from torch import nn

import pyrouq


def _softmax_net(dtype=torch.float32):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(-1))
    return net.to(dtype)


def test_predict_of_a_batch_size_1_loader_refuses_probabilities():
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loader = pyrouq.ArrayLoader(x, y, batch_size=1, shuffle=False)
    with pytest.raises(ValueError, match="returned class probabilities, not logits"):
        pyrouq.predict(_softmax_net(), loader, progress=False)


def test_predict_of_a_batch_size_1_loader_of_logits_passes():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loader = pyrouq.ArrayLoader(x, y, batch_size=1, shuffle=False)
    preds = pyrouq.predict(net, loader, progress=False)
    assert preds.probs.shape[-2:] == (6, 3)


def test_fit_refuses_a_bfloat16_softmax_network():
    model = pyrouq.bayesian(_softmax_net(torch.bfloat16))
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(8, 4).bfloat16(), torch.randint(0, 3, (8,))
    loader = pyrouq.ArrayLoader(x, y, batch_size=8)
    with pytest.raises(ValueError, match="The network returned class probabilities"):
        pyrouq.fit(model, guide, loader, epochs=1, progress=False)
