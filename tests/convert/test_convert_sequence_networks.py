"""Eighth audit, a user journey with networks that are not image CNNs: a text classifier on
token ids (``nn.Embedding`` with a padding index, mean pooling or a GRU / LSTM, a Linear head),
a 1-D convolutional regression net with several outputs and a small transformer encoder whose
padding mask is derived from its ids. Values are checked against the plain torch network run
with the guide's means or a BatchEnsemble member's weights; refusals by their messages."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from _toy import loaded_copy
from torch import nn

import pyrouq
from pyrouq import batchensemble, bayesian, fit, load, mcmc, mean_field_guide, predict, save

V, D, T, C = 20, 6, 5, 3


class _Text(nn.Module):
    """Token ids (B, T) -> logits (B, C): an embedding (index 0 pads), then a GRU / LSTM read at
    its last step, or a mean over the tokens that are not padding."""

    def __init__(self, rnn: str | None = None, padding_idx: int | None = 0, sparse=False):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=padding_idx, sparse=sparse)
        self.rnn = {None: None, "gru": nn.GRU, "lstm": nn.LSTM}[rnn]
        if self.rnn is not None:
            self.rnn = self.rnn(D, D, batch_first=True)
        self.head = nn.Linear(D, C)

    def forward(self, ids):
        h = self.emb(ids)
        if self.rnn is not None:
            return self.head(self.rnn(h)[0][:, -1])
        keep = (ids != 0).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def _ids(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (n, T), generator=g)
    ids[::2, -2:] = 0  # every other sequence padded
    return ids, ids[:, 0] % C


def _batches(ids, y, size=8):
    return [(ids[i : i + size], y[i : i + size]) for i in range(0, len(ids), size)]


def _dense_weights(p):
    return p.dim() > 1


@pytest.mark.parametrize("rnn", [None, "gru", "lstm"])
def test_text_classifier_under_the_guides_means_is_the_plain_network(rnn):
    torch.manual_seed(0)
    net = _Text(rnn, padding_idx=None)
    ids, y = _ids()
    model = bayesian(net, select=lambda name, p: _dense_weights(p))
    assert set(model.latent_sites()) >= {"emb.weight", "head.weight"}
    guide = mean_field_guide(model)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, y), batch_size=8)
    fit(model, guide, loader, epochs=1, progress=False)
    means = {k: v.detach() for k, v in guide.means().items()}
    got = predict(
        model, ids, posterior_samples={k: v[None] for k, v in means.items()}, progress=False
    )
    ref = loaded_copy(net, {**model.net.state_dict(), **means})
    with torch.no_grad():
        want = ref(ids).softmax(-1)
    torch.testing.assert_close(got.probs[0], want, atol=1e-5, rtol=0)


def test_text_classifier_default_select_leaves_embedding_and_gru_point_estimates():
    # the README: select=None takes Linear and convolution weights; nn.Embedding and the GRU's
    # weights stay point estimates that fit() trains
    net = _Text("gru")
    model = bayesian(net)
    assert list(model.latent_sites()) == ["head.weight", "head.bias"]
    before = model.net.emb.weight.detach().clone()
    ids, y = _ids()
    fit(model, mean_field_guide(model), _batches(ids, y), epochs=1, num_data=32, progress=False)
    assert not torch.equal(model.net.emb.weight, before)


@pytest.mark.parametrize("rnn", [None, "gru"])
def test_batchensemble_text_member_is_the_plain_network_with_its_weights(rnn):
    torch.manual_seed(0)
    net = _Text(rnn)
    ensemble = batchensemble(net, 3)
    # the embedding and the recurrent layer stay one layer the members share (README)
    assert type(ensemble.net.emb) is nn.Embedding
    assert rnn is None or type(ensemble.net.rnn) is nn.GRU
    ids, y = _ids()
    fit(ensemble, None, _batches(ids, y), epochs=1, num_data=32, progress=False)
    got = predict(ensemble, ids, progress=False).probs
    head = ensemble.net.head
    for m in range(3):
        weights = {"head.weight": head.effective_weight(m).detach(), "head.bias": head.bias[m]}
        shared = {k: v for k, v in ensemble.net.state_dict().items() if not k.startswith("head")}
        ref = loaded_copy(net, {**shared, **weights})
        with torch.no_grad():
            torch.testing.assert_close(got[m], ref(ids).softmax(-1), atol=1e-5, rtol=0)


def test_text_checkpoint_reloads_from_a_skeleton_to_the_bit(tmp_path):
    torch.manual_seed(0)
    model = bayesian(_Text("lstm", padding_idx=None), select=["emb", "head"])
    guide = mean_field_guide(model)
    ids, y = _ids()
    fit(model, guide, _batches(ids, y), epochs=1, num_data=32, progress=False)
    save(tmp_path / "text.pt", model, guide)
    restored = load(tmp_path / "text.pt", module=_Text("lstm", padding_idx=None))
    torch.manual_seed(3)
    want = predict(model, ids, guide, num_samples=4, progress=False).probs
    torch.manual_seed(3)
    got = predict(restored.model, ids, restored.guide, num_samples=4, progress=False).probs
    assert torch.equal(got, want)


def test_mcmc_takes_token_ids():
    torch.manual_seed(0)
    small = nn.Sequential(nn.Embedding(4, 2), nn.Flatten(), nn.Linear(4, 2))
    model = bayesian(small, select=lambda name, p: True)
    x = torch.randint(0, 4, (12, 2))
    y = x[:, 0] % 2
    result = mcmc(model, x, y, num_samples=5, warmup_steps=5, num_chains=1, progress=False)
    preds = predict(model, x, posterior_samples=result, progress=False)
    draw = {k: v[0, 2] for k, v in result.samples.items()}  # chain 0, draw 2
    ref = loaded_copy(small, draw)
    with torch.no_grad():
        torch.testing.assert_close(preds.probs[2], ref(x).softmax(-1), atol=1e-5, rtol=0)


# -- 1-D sequence regression ---------------------------------------------------------------


def _conv1d(outputs):
    return nn.Sequential(
        nn.Conv1d(3, 8, 5, padding=2),
        nn.BatchNorm1d(8),
        nn.ReLU(),
        nn.Conv1d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(8, outputs),
    )


def test_conv1d_heteroscedastic_regression_of_two_outputs_is_the_plain_network():
    torch.manual_seed(0)
    x = torch.randn(48, 3, 16)
    y = torch.stack([x[:, 0].mean(-1), x[:, 1].std(-1)], -1)
    net = _conv1d(4)  # D = 2 means, then 2 raw scales
    model = bayesian(net, likelihood=pyrouq.Gaussian("heteroscedastic"))
    guide = mean_field_guide(model)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    fit(model, guide, loader, epochs=1, progress=False)
    means = {k: v.detach() for k, v in guide.means().items()}
    preds = predict(
        model, x, posterior_samples={k: v[None] for k, v in means.items()}, progress=False
    )
    assert preds.loc.shape == preds.scale.shape == (1, 48, 2)
    ref = loaded_copy(net, {**model.net.state_dict(), **means})  # eval: running statistics
    with torch.no_grad():
        out = ref(x)
    torch.testing.assert_close(preds.loc[0], out[:, :2], atol=1e-5, rtol=0)
    torch.testing.assert_close(preds.scale[0], 1e-3 + F.softplus(out[:, 2:]), atol=1e-5, rtol=0)


# -- several inputs: a transformer with a padding mask -------------------------------------


class _Encoder(nn.Module):
    def __init__(self, mask_inside=True):
        super().__init__()
        self.emb = nn.Embedding(V, 8, padding_idx=0)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(8, C)
        self.mask_inside = mask_inside

    def forward(self, ids, pad_mask=None):
        if self.mask_inside:
            pad_mask = ids == 0  # the fix the messages name
        return self.head(self.enc(self.emb(ids), src_key_padding_mask=pad_mask)[:, 0])


class _TwoInputs(_Encoder):
    def forward(self, ids, pad_mask):
        return super().forward(ids, pad_mask)


def test_a_forward_of_two_inputs_is_told_to_derive_the_mask_from_x():
    with pytest.raises(TypeError, match=r"takes 2 inputs \(ids, pad_mask\).*compute the other "
                       r"inputs from x \(a padding mask: x == pad_id\)"):  # fmt: skip
        bayesian(_TwoInputs())


class _Bag(nn.Module):
    """Ids pooled by an nn.EmbeddingBag (``x[:, :3]``), the rest sent to a Linear as they are."""

    def __init__(self):
        super().__init__()
        self.bag, self.fc = nn.EmbeddingBag(10, 3), nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(self.bag(x) if x.shape[1] == 4 else x)


def test_an_embedding_bags_network_is_told_of_its_embedding_bag():
    # a bool x was told "the network's nn.Embedding reads integer indices", a network holding
    # none; integer ids sent to a Linear, "send ids through the nn.Embedding"
    model = bayesian(_Bag())
    guide = mean_field_guide(model)
    with pytest.raises(TypeError, match=r"got a torch.bool tensor as its input x, but the "
                       r"network's nn.EmbeddingBag reads integer indices"):  # fmt: skip
        predict(model, torch.zeros(2, 4, dtype=torch.bool), guide, num_samples=2, progress=False)
    to_linear = r"nn.Embedding or nn.EmbeddingBag takes integer inputs\).* send ids through the"
    with pytest.raises(ValueError, match=to_linear):
        predict(model, torch.zeros(2, 3, dtype=torch.long), guide, num_samples=2, progress=False)
    assert predict(model, torch.zeros(2, 4, dtype=torch.long), guide, num_samples=2,
                   progress=False).probs.shape == (2, 2, 2)  # fmt: skip


def test_a_padding_mask_given_beside_the_ids_is_refused_with_the_fix():
    # predict((ids, mask)) read the mask as a second batch of ids: torch's "Expected tensor
    # for argument #1 'indices' to have one of the following scalar types: Long, Int; but got
    # CPUBoolType"; a loader of ((ids, mask), y) was told to torch.as_tensor a tuple
    torch.manual_seed(0)
    model = bayesian(_Encoder(mask_inside=False))
    guide = mean_field_guide(model)
    ids, y = _ids(16)
    mask_fix = (
        r"predict\(\) got a torch.bool tensor as its input x, but the network's nn.Embedding "
        r"reads integer indices .*A padding mask\? .*compute the mask from them in forward "
        r"\(mask = x == pad_id\)"
    )
    with pytest.raises(TypeError, match=mask_fix):
        predict(model, (ids, ids == 0), guide, num_samples=2, progress=False)
    with pytest.raises(TypeError, match=r"batch 1 of epoch 1 is \(tuple of 2 tensors, Tensor\), "
                       r"and pyrouq runs the network on one input tensor x\. Serve one tensor: "
                       r"compute the other inputs from x in forward"):  # fmt: skip
        fit(model, guide, [((ids, ids == 0), y)], num_data=16, epochs=1, progress=False)


def test_the_encoder_with_its_mask_inside_trains_and_matches_plain_torch():
    torch.manual_seed(0)
    net = _Encoder()
    ids, y = _ids(16)
    ensemble = batchensemble(net, 2)  # attention projections shared, feed-forward converted
    fit(ensemble, None, [(ids, y)], num_data=16, epochs=1, progress=False)
    model = bayesian(net, select="last_layer")
    guide = mean_field_guide(model)
    fit(model, guide, [(ids, y)], num_data=16, epochs=1, progress=False)
    means = {k: v.detach() for k, v in guide.means().items()}
    got = predict(model, ids, posterior_samples={k: v[None] for k, v in means.items()})
    ref = loaded_copy(net, {**model.net.state_dict(), **means})
    with torch.no_grad():
        torch.testing.assert_close(got.probs[0], ref(ids).softmax(-1), atol=1e-5, rtol=0)


# -- integer inputs without an nn.Embedding --------------------------------------------------


class _OneHot(nn.Module):
    def __init__(self, table=False):
        super().__init__()
        self.table = nn.Embedding.from_pretrained(torch.eye(V)) if table else None
        self.head = nn.Linear(V, C)

    def forward(self, ids):
        hot = F.one_hot(ids, V).float() if self.table is None else self.table(ids)
        return self.head(hot.mean(1))


def test_integer_ids_to_a_network_without_an_embedding_are_told_the_ways_in():
    ids = _ids(8)[0]
    model = bayesian(_OneHot())
    guide = mean_field_guide(model)
    with pytest.raises(TypeError, match=r"predict\(\) expects floating-point inputs, got a "
                       r"torch.int64 tensor.*Integer inputs are taken as they are by a network "
                       r"holding an nn.Embedding.*nn.Embedding.from_pretrained\(torch.eye\(V\)\)"
                       r".*x.long\(\) in its forward"):  # fmt: skip
        predict(model, ids, guide, num_samples=2, progress=False)
    # and the way named works: the same logits as the one-hot network's
    torch.manual_seed(0)
    onehot = _OneHot()
    tabled = _OneHot(table=True)
    tabled.head.load_state_dict(onehot.head.state_dict())
    model = bayesian(tabled)
    assert list(model.latent_sites()) == ["head.weight", "head.bias"]  # the eye stays frozen
    means = {k: v.detach() for k, v in mean_field_guide(model).means().items()}
    got = predict(model, ids, posterior_samples={k: v[None] for k, v in means.items()})
    with torch.no_grad():
        torch.testing.assert_close(got.probs[0], onehot(ids).softmax(-1), atol=1e-6, rtol=0)


# -- what a latent embedding brings -----------------------------------------------------------


def test_a_latent_sparse_embedding_trains_as_the_dense_one():
    # fit() failed in the guide's backward: "Could not run 'aten::addcmul' with arguments from
    # the 'SparseCPU' backend"
    ids, y = _ids()
    trained = []
    for sparse in (False, True):
        torch.manual_seed(0)
        model = bayesian(_Text(padding_idx=None, sparse=sparse), select=["emb"])
        guide = mean_field_guide(model)
        fit(model, guide, _batches(ids, y), epochs=1, num_data=32, seed=0, progress=False)
        trained.append({k: v.detach() for k, v in guide.state_dict().items()})
    assert trained[0].keys() == trained[1].keys()
    for key in trained[0]:
        assert torch.equal(trained[0][key], trained[1][key]), key


def test_a_sparse_point_estimate_embedding_is_told_an_optimizer_that_works():
    ids, y = _ids()
    model = bayesian(_Text(sparse=True))
    guide = mean_field_guide(model)
    with pytest.raises(RuntimeError, match=r"got a sparse gradient .*optim=lambda p: "
                       r"torch.optim.Adagrad\(p, lr=1e-2\) \(or SGD; not SparseAdam"):  # fmt: skip
        fit(model, guide, _batches(ids, y), epochs=1, num_data=32, progress=False)
    before = model.net.emb.weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on sparse invariant checks
        fit(model, guide, _batches(ids, y), epochs=1, num_data=32, progress=False,
            optim=lambda p: torch.optim.Adagrad(p, lr=1e-2))  # fmt: skip
    assert not torch.equal(model.net.emb.weight, before)


def test_a_latent_embedding_with_a_padding_row_is_warned_of():
    with pytest.warns(UserWarning, match=r"bayesian\(\): the embedding weight 'emb.weight' "
                      r"\(padding_idx=0\) of _Text is latent, but torch gives its padding row "
                      r"no gradient from the data.*Keep the forward from reading padding "
                      r"positions"):  # fmt: skip
        bayesian(_Text("gru"), select=["emb"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bayesian(_Text("gru"))  # the embedding a point estimate: torch's padding row
        bayesian(_Text("gru", padding_idx=None), select=["emb"])
