"""A new user's journey with networks pyrouq's authors did not write: the mistakes such a
user makes with the network's outputs are refused with a message that says what to do, and
the pipeline (fit, predict, decompositions, save/load, resume) holds its promises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.likelihoods import Categorical


def _softmax_net() -> nn.Module:
    """A classifier written Keras-style: its forward ends in a softmax."""
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(-1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)


def _built(kind: str, net: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    if kind == "plain":
        return net, None
    if kind == "bayesian":
        model = pyrouq.bayesian(net)
        return model, pyrouq.mean_field_guide(model)
    if kind == "batchensemble":
        return pyrouq.batchensemble(net, 2), None
    model = pyrouq.rank1(net, 2)
    return model, pyrouq.mean_field_guide(model)


KINDS = ["plain", "bayesian", "batchensemble", "rank1"]
PROBABILITIES = r"returned class probabilities, not logits.*drop the final nn\.Softmax"


@pytest.mark.parametrize("kind", KINDS)
def test_fit_refuses_a_network_that_returns_probabilities(kind):
    # before: trained silently on a softmax of the softmax (cross-entropy of probabilities)
    x, y = _data()
    model, guide = _built(kind, _softmax_net())
    with pytest.raises(ValueError, match=PROBABILITIES):
        pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=16, progress=False)


@pytest.mark.parametrize("kind", KINDS)
def test_predict_refuses_a_network_that_returns_probabilities(kind):
    # before: softmax applied a second time, every row flattened towards uniform (a 0.9
    # probability of 3 classes came out as 0.54)
    x, _ = _data()
    model, guide = _built(kind, _softmax_net())
    samples = None if guide is None else 2
    with pytest.raises(ValueError, match=r"predict\(\): .*" + PROBABILITIES):
        pyrouq.predict(model, x, guide, num_samples=samples, progress=False)


@pytest.mark.parametrize("kind", KINDS)
def test_log_softmax_outputs_are_logits(kind):
    # log-probabilities are logits: no false alarm, and predict() gives back exp of them
    x, y = _data()
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.LogSoftmax(-1))
    model, guide = _built(kind, net)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=16, progress=False)
    preds = pyrouq.predict(model, x, guide, num_samples=None if guide is None else 2)
    if kind == "plain":
        net.eval()
        expected = net(x).exp().unsqueeze(0)
        torch.testing.assert_close(preds.probs, expected, rtol=0, atol=1e-6)
    assert torch.allclose(preds.probs.sum(-1), torch.ones(()), atol=1e-6)


def test_refuse_probabilities_looks_at_every_row():
    probs = torch.softmax(torch.randn(2, 5, 4), -1)
    with pytest.raises(ValueError, match=r"^ResNet returned class probabilities"):
        Categorical.refuse_probabilities(probs, "ResNet")
    logits = probs.clone()
    logits[1, 3] = torch.tensor([2.0, -1.0, 0.5, 0.1])  # one row of logits: not probabilities
    Categorical.refuse_probabilities(logits, "ResNet")
    Categorical.refuse_probabilities(torch.full((3, 1), 1.0), "ResNet")  # one class: no rule
    Categorical.refuse_probabilities(torch.zeros(3, 2), "ResNet")  # a zero-initialised head


class _DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return {"logits": self.fc(x), "hidden": x}


class _TupleOut(_DictOut):
    def forward(self, x):
        h = self.fc(x)
        return h, h.softmax(-1)


def test_plain_predict_says_how_to_wrap_a_dict_or_tuple_output():
    # before: "_DictOut must return logits of shape (B, C), got dict." and nothing to do
    x, _ = _data()
    with pytest.raises(TypeError, match=r"returned dict \(keys 'logits', 'hidden'\); .*Wrap it"):
        pyrouq.predict(_DictOut(), x, progress=False)
    with pytest.raises(TypeError, match=r"returned tuple; .*net\(x\)\[0\] of a tuple\)\.$"):
        pyrouq.predict(_TupleOut(), x, progress=False)


def test_plain_predict_explains_per_pixel_and_per_input_outputs():
    x = torch.randn(5, 2, 8, 8)
    per_pixel = nn.Conv2d(2, 3, 3, padding=1)
    with pytest.raises(ValueError, match=r"shape \(5, 3, 8, 8\) for 5 inputs; .* per pixel"):
        pyrouq.predict(per_pixel, x, progress=False)
    one_value = nn.Sequential(nn.Flatten(), nn.Linear(128, 1), nn.Flatten(0))
    with pytest.raises(TypeError, match=r"shape \(5,\) for 5 inputs: one value per input"):
        pyrouq.predict(one_value, x, progress=False)


class _Sequence(nn.Module):
    """A 1-d CNN on sequences, GroupNorm and dropout: nothing pyrouq knows by name."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(2, 8, 5, padding=2),
            nn.GroupNorm(2, 8),
            nn.SiLU(),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Dropout(0.2),
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.features(x))


def test_journey_of_a_sequence_network(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 2, 20, generator=g), torch.randint(0, 3, (24,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)

    def built():
        torch.manual_seed(0)
        model = pyrouq.bayesian(_Sequence())
        return model, pyrouq.mean_field_guide(model)

    def stop(record):
        raise KeyboardInterrupt

    whole, whole_guide = built()
    pyrouq.fit(whole, whole_guide, loader, epochs=2, seed=0, progress=False)
    cut, cut_guide = built()
    with pytest.raises(pyrouq.TrainingInterrupted):
        pyrouq.fit(
            cut,
            cut_guide,
            loader,
            epochs=2,
            seed=0,
            progress=False,
            checkpoint=tmp_path / "run.pt",
            callbacks=[stop],
        )
    resumed, resumed_guide = built()
    pyrouq.fit(
        resumed,
        resumed_guide,
        loader,
        epochs=2,
        seed=0,
        progress=False,
        resume_from=tmp_path / "run.pt",
    )
    whole_state, resumed_state = whole_guide.state_dict(), resumed_guide.state_dict()
    assert list(whole_state) == list(resumed_state)
    for name, value in whole_state.items():
        assert torch.equal(value, resumed_state[name]), name

    torch.manual_seed(1)
    preds = pyrouq.predict(whole, x, whole_guide, num_samples=4, progress=False)
    assert preds.probs.shape == (4, 24, 3)
    assert not torch.equal(preds.probs[0], preds.probs[1])  # the draws differ
    d = preds.uncertainty("entropy")
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic)
    pyrouq.save(tmp_path / "model.pt", whole, whole_guide)
    restored = pyrouq.load(tmp_path / "model.pt", module=_Sequence())
    torch.manual_seed(1)
    again = pyrouq.predict(restored.model, x, restored.guide, num_samples=4, progress=False)
    assert torch.equal(again.probs, preds.probs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_refuse_probabilities_in_other_dtypes(dtype):
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 100, generator=g, dtype=torch.float64), -1)
    with pytest.raises(ValueError, match="returned class probabilities"):
        Categorical.refuse_probabilities(probs.to(dtype), "Net")
    # small non-negative logits of a half-precision network (a ReLU head) whose rows sum to
    # 1.5: no probabilities, though within 16 C eps of 1 in float16 (1.6 for C = 100)
    relu_logits = torch.full((4, 100), 0.015, dtype=dtype)
    Categorical.refuse_probabilities(relu_logits, "Net")
