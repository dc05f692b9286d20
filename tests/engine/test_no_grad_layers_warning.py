"""Self-review 12a: a layer's settings added to torch's words never change how the error is
read, and the engine's no-grad warning is a class a filter can name, holding the layers it
names."""

import warnings

import pytest
import torch
from torch import nn

import pyrouq

# --------------------------------------------------------------------------------------------
# Torch's own words decide an error's kind, not the settings of the layer added to them
# --------------------------------------------------------------------------------------------


class _Rows(nn.Module):
    """Takes exactly ``rows`` rows (torch's "shape '[40, -1]' is invalid for input of size 6"
    on others); its settings read as a dtype's."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def extra_repr(self):
        return f"dtype_hint={self.rows}"

    def forward(self, x):
        return x.reshape(self.rows, -1)


class _PlainRows(_Rows):
    def extra_repr(self):
        return f"rows={self.rows}"


@pytest.mark.parametrize("layer", [_Rows, _PlainRows])
def test_a_layer_whose_settings_say_dtype_refusing_two_rows_is_traced_on_the_whole_data(layer):
    """The own-model trace retries on the whole data after a size error on two rows, not
    after a dtype error: torch's words say which, not the layer's "dtype_hint=40"."""
    model = pyrouq.bayesian(nn.Sequential(layer(40), nn.Linear(3, 2)), num_data=40)

    def own(x, y=None):
        return model(x, y)

    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    with pytest.raises(ValueError, match=r"samples the latent sites \['1.weight', '1.bias'\]"):
        pyrouq.to_inference_data(own, None, x, y)
    if layer is _Rows:  # the error names the layer, settings and all
        with pytest.raises(RuntimeError, match=r"\(in _Rows\(dtype_hint=40\) at 'net.0' of the"):
            model(x[:2], y[:2])


# --------------------------------------------------------------------------------------------
# The no-grad warning is a class of its own, holding the layers it names
# --------------------------------------------------------------------------------------------


class _Fixed(nn.Module):
    """Runs ``blocks`` linear layers only under torch.no_grad(), then a head with gradients."""

    def __init__(self, blocks=2):
        super().__init__()
        self.backbone = nn.Sequential(*[nn.Linear(4, 4) for _ in range(blocks)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        with torch.no_grad():
            h = self.backbone(x)
        return self.head(h)


def _fit(model, **kwargs):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    loader = pyrouq.ArrayLoader(x, (x[:, 0] > 0).long(), batch_size=20, seed=0)
    guide = pyrouq.mean_field_guide(model)
    return pyrouq.fit(model, guide, loader, epochs=1, progress=False, **kwargs)


def test_the_no_grad_warning_is_a_public_class_holding_the_layers_it_names():
    assert "NoGradLayersWarning" in pyrouq.__all__
    assert issubclass(pyrouq.NoGradLayersWarning, UserWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(pyrouq.bayesian(_Fixed()))
    (warning,) = [w for w in caught if w.category is pyrouq.NoGradLayersWarning]
    said = warning.message
    assert said.network == "_Fixed" and said.layers == ("backbone.0", "backbone.1")
    assert str(said).startswith(f"{said.finding} To keep those weights fixed, freeze them")
    assert said.finding.startswith(
        "_Fixed's forward ran the layers 'backbone.0', 'backbone.1', which hold latent weights, "
        "only under torch.no_grad()"
    )
    assert said.finding.endswith("and mcmc() would miss their part of the gradient.")


def test_the_no_grad_warning_is_silenced_by_its_class_and_by_its_words():
    for ignored in ({"category": pyrouq.NoGradLayersWarning}, {"message": ".*only under torch"}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.filterwarnings("ignore", **ignored)
            _fit(pyrouq.bayesian(_Fixed()))  # trains: not raised
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(pyrouq.NoGradLayersWarning):
            _fit(pyrouq.bayesian(_Fixed()))


def test_the_no_grad_warning_shows_five_layers_and_holds_them_all():
    with pytest.warns(pyrouq.NoGradLayersWarning) as caught:
        _fit(pyrouq.bayesian(_Fixed(blocks=7)))
    (said,) = [w.message for w in caught if w.category is pyrouq.NoGradLayersWarning]
    assert said.layers == tuple(f"backbone.{i}" for i in range(7))
    assert (
        "the layers 'backbone.0', 'backbone.1', 'backbone.2', 'backbone.3', 'backbone.4', ..., "
        "which hold latent weights" in str(said)
    )
