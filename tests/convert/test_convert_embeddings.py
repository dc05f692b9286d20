"""Review of the text/sequence journey: a latent ``nn.Embedding(max_norm=...)`` (torch renormalised
the draws in place: the caller's posterior_samples, MCMC's state), the padding-row warning (given
again by every load(), and falsely for a weight tied to an output layer), and the message for a
bool input that is the data itself."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pyrouq import bayesian, fit, load, mean_field_guide, predict, save

V, D, T, C = 12, 4, 3, 3


class _Text(nn.Module):
    def __init__(self, padding_idx=None, max_norm=None, tied=False):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=padding_idx, max_norm=max_norm)
        self.head = nn.Linear(D, V if tied else C, bias=False)
        if tied:  # a language model's decoder sharing the table
            self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def _ids(n=16):
    ids = torch.randint(1, V, (n, T), generator=torch.Generator().manual_seed(0))
    return ids, ids[:, 0] % C


def test_a_latent_embedding_with_max_norm_is_refused_and_the_point_estimate_kept():
    # predict(posterior_samples=d) renormalised the rows of d the network read, in place, and
    # mcmc()'s stored draws of those rows all had norms <= max_norm (its state changed)
    # (its words named MCMC's state, though bayesian() raises it before any sampler is chosen)
    with pytest.raises(ValueError, match=r"'emb.weight' of _Text would be latent, but it has "
                       r"max_norm=1.0, and torch renormalises the rows it reads in place, on the "
                       r"weight: every posterior draw the network runs with would be changed "
                       r"under it, one's own posterior_samples too\. Leave the embedding a "
                       r"point estimate"):  # fmt: skip
        bayesian(_Text(max_norm=1.0), select=["emb"])
    net = _Text(max_norm=1.0)
    model = bayesian(net)  # the default select: the embedding stays a point estimate
    assert list(model.latent_sites()) == ["head.weight"]
    ids, y = _ids()
    fit(model, mean_field_guide(model), [(ids, y)], num_data=16, epochs=1, progress=False)
    draws = {"head.weight": torch.randn(2, C, D)}
    kept = draws["head.weight"].clone()
    predict(model, ids, posterior_samples=draws, progress=False)
    assert torch.equal(draws["head.weight"], kept)
    assert net.emb.max_norm == 1.0


def test_the_padding_row_warning_is_not_given_again_by_load(tmp_path):
    with pytest.warns(UserWarning, match="padding row"):
        model = bayesian(_Text(padding_idx=0), select=["emb"])
    save(tmp_path / "m.pt", model, mean_field_guide(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = load(tmp_path / "m.pt", module=_Text(padding_idx=0))
    assert list(restored.model.latent_sites()) == ["emb.weight"]


def test_no_padding_row_warning_for_a_table_tied_to_the_output_layer():
    # the decoder gives the padding row its gradient from the data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = bayesian(_Text(padding_idx=0, tied=True), select=["emb"])
    guide = mean_field_guide(model)
    ids = _ids()[0]
    start = guide.means()["emb.weight"][0].clone()
    fit(model, guide, [(ids, ids[:, 0])], num_data=16, epochs=2, kl_weight=0.0, progress=False)
    assert not torch.equal(guide.means()["emb.weight"][0], start)


class _Flags(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2, D)
        self.head = nn.Linear(D, C)

    def forward(self, x):
        return self.head(self.emb(x).mean(1))


def test_bool_data_to_a_network_with_an_embedding_is_told_x_long():
    model = bayesian(_Flags())
    guide = mean_field_guide(model)
    flags = torch.rand(8, T) > 0.5
    with pytest.raises(TypeError, match=r"Bool tokens or flags that are the data itself: pass "
                       r"x.long\(\)"):  # fmt: skip
        predict(model, flags, guide, num_samples=2, progress=False)
    assert predict(model, flags.long(), guide, num_samples=2, progress=False).probs.shape == (
        2,
        8,
        C,
    )
