"""Options and keywords in the words refusing them: the keywords a BatchEnsemble convolution
does not take (torch's device, dtype and a transposed convolution's output_padding; a misspelt
one told before any work)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pyrouq.nn import BatchEnsembleConv2d, BatchEnsembleConvTranspose2d

# -- 1. keywords of torch's convolutions a BatchEnsemble convolution does not take -------------


@pytest.mark.parametrize("keyword", [{"device": "cpu"}, {"dtype": torch.float64}])
def test_a_conv_given_device_or_dtype_is_told_how_to_get_them(keyword):
    # was: "... Leave them out.", which leaves the layer float32 on the default device
    with pytest.raises(
        TypeError,
        match=r"\(a Conv2d to copy\)\. For another device or dtype, copy a Conv2d made there, "
        r"base=nn\.Conv2d\(\.\.\., device=\.\.\., dtype=\.\.\.\), or move the layer: "
        r"\.to\(device, dtype\)\.$",
    ):
        BatchEnsembleConv2d(3, 4, 3, 2, **keyword)
    # both ways the words give do make a float64 layer
    copied = BatchEnsembleConv2d(3, 4, 3, 2, base=nn.Conv2d(3, 4, 3, dtype=torch.float64))
    moved = BatchEnsembleConv2d(3, 4, 3, 2).to(torch.float64)
    for layer in (copied, moved):
        assert {p.dtype for p in layer.parameters()} == {torch.float64}


def test_a_conv_given_output_padding_is_sent_to_the_transposed_one_not_to_padding():
    # was: "... Did you mean 'padding'?", another setting altogether
    with pytest.raises(TypeError) as caught:
        BatchEnsembleConv2d(3, 4, 3, 2, stride=2, output_padding=1)
    text = str(caught.value)
    assert "Did you mean" not in text
    assert text.endswith(
        "(a Conv2d to copy). output_padding is a transposed convolution's setting: for one, "
        "use BatchEnsembleConvTranspose2d."
    )
    # which takes it, as torch's ConvTranspose2d: (5 - 1) * 2 + 3 + 1 = 12
    layer = BatchEnsembleConvTranspose2d(3, 4, 3, 2, stride=2, output_padding=1)
    assert layer(torch.randn(2, 3, 5, 5)).shape == (2, 4, 12, 12)
    assert (
        nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1)(torch.randn(1, 3, 5, 5)).shape[-1]
        == 12
    )


@pytest.mark.parametrize("layer", [BatchEnsembleConv2d, BatchEnsembleConvTranspose2d])
def test_a_misspelt_keyword_is_told_before_the_settings_are_checked_or_torch_builds_a_layer(
    layer,
):
    # was, for the transposed one: the settings checked and torch's layer built first (stride=0
    # refused, the misspelling never told; 0.56 s to build a 1024 x 1024 x 7 x 7 one and then
    # refuse 'strid')
    told = rf"^{layer.__name__} got the keyword argument\(s\) 'paddin', which it does not take"
    with pytest.raises(TypeError, match=told + r": .* Did you mean 'padding'\?$"):
        layer(3, 4, 3, 2, stride=0, paddin=1)
    with pytest.raises(TypeError, match=r"there is no bias= to set: leave it out\.$"):
        layer(3, 4, 3, 2, stride=0, bias=False)
