"""Leftovers of earlier notes: a regression's uncertainty() takes the measure argument of the
classification one; predict(posterior_samples=) refuses arviz's (chain, draw, ...) layout and
non-finite draws by name, where it predicted with them silently."""

import pytest
import torch

from pyrouq import BayesianMLP, GaussianPredictions, predict


def test_regression_uncertainty_takes_the_variance_measure_and_names_the_others():
    loc = torch.tensor([[[0.0], [1.0]], [[2.0], [5.0]]])  # S=2, N=2, D=1
    scale = torch.tensor([[[1.0], [2.0]], [[1.0], [2.0]]])
    p = GaussianPredictions(loc, scale)
    by_name = p.uncertainty("variance")
    # by hand: aleatoric = mean of scale^2, epistemic = population variance of the means
    assert by_name.aleatoric.tolist() == [1.0, 4.0]
    assert by_name.epistemic.tolist() == [1.0, 4.0]
    assert torch.equal(by_name.total, p.uncertainty().total)
    with pytest.raises(ValueError, match=r"variance only, got measure='entropy' .*uncertainty\(\)"):
        p.uncertainty("entropy")


def _model_and_draws(chains=2, draws=3):
    torch.manual_seed(0)
    model = BayesianMLP(in_features=4, hidden_features=5, out_features=3)
    samples = {
        site: 0.3 * torch.randn(chains, draws, *shape)
        for site, shape in model.latent_sites().items()
    }
    return model, samples, torch.randn(6, 4)


def test_chain_draw_layout_is_refused_with_the_reshape_to_pass():
    model, samples, x = _model_and_draws()
    with pytest.raises(
        ValueError,
        match=r"site 'fc1.weight' has shape \(2, 3, 5, 4\), read as "
        r"\(chain, draw\) = \(2, 3\).*value.reshape\(-1, \*value.shape\[2:\]\)",
    ):
        predict(model, x, posterior_samples=samples, progress=False)
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in samples.items()}
    p = predict(model, x, posterior_samples=flat, progress=False)
    assert p.probs.shape == (6, 6, 3)
    # draw s = chain * 3 + draw: draw 4 is chain 1, draw 1
    one = {k: v[1, 1][None] for k, v in samples.items()}
    assert torch.allclose(p.probs[4], predict(model, x, posterior_samples=one).probs[0])


def test_predictives_plate_padding_of_one_draw_dim_still_reads_as_s_draws():
    model, samples, x = _model_and_draws(chains=4, draws=1)  # (S, 1, *shape): Predictive's
    padded = predict(model, x, posterior_samples=samples, progress=False)
    plain = {k: v[:, 0] for k, v in samples.items()}
    assert torch.equal(padded.probs, predict(model, x, posterior_samples=plain).probs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_draws_are_refused_naming_site_and_draw(bad):
    model, samples, x = _model_and_draws()
    flat = {k: v.reshape(-1, *v.shape[2:]).clone() for k, v in samples.items()}
    flat["fc2.bias"][4, 1] = bad
    flat["fc2.bias"][5, 0] = bad
    with pytest.raises(
        ValueError,
        match=r"site 'fc2.bias' holds NaN or inf in 2 of 6 draws, "
        r"the first at draw 4: .*keep the finite draws",
    ):
        predict(model, x, posterior_samples=flat, progress=False)


def test_finite_draws_whose_sum_overflows_are_kept_beside_a_non_finite_one():
    """The check sums each draw (no full-size temporaries): a float16 draw of 6e4 twice sums
    to inf, and only a value-by-value look at it tells it finite from draw 5's NaN."""
    model, samples, x = _model_and_draws()
    flat = {k: v.reshape(-1, *v.shape[2:]).half() for k, v in samples.items()}
    flat["fc2.bias"][2, :2] = 6e4
    flat["fc2.bias"][5, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or inf in 1 of 6 draws, the first at draw 5"):
        predict(model, x, posterior_samples=flat, progress=False)
    flat["fc2.bias"][5, 0] = 0.0
    assert predict(model, x, posterior_samples=flat, progress=False).probs[2].isfinite().all()


@pytest.mark.parametrize("seed", [-1, "x", 2.5])
def test_lac_scores_refuse_a_bad_seed_as_predict_sets_does(seed):
    """LAC's scores draw nothing, and returned before the seed was checked: a bad seed passed
    there silently and was refused by predict_sets() of the same predictor."""
    from pyrouq import Predictions, conformal

    torch.manual_seed(0)
    p = Predictions(torch.softmax(torch.randn(2, 30, 4), -1), torch.randint(0, 4, (30,)))
    predictor = conformal(p, alpha=0.2)
    with pytest.raises(ValueError, match=r"^ConformalClassifier.scores\(\): expected seed to be "):
        predictor.scores(p, seed=seed)
    assert torch.equal(predictor.scores(p, seed=7), 1 - p.probs.double().mean(0))


def test_non_finite_regression_predictions_name_their_inputs_as_classification_ones_do():
    loc, scale = torch.zeros(2, 9, 2), torch.ones(2, 9, 2)
    loc[1, 4, 1] = float("nan")
    scale[0, 7, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^Expected finite loc, got NaN or inf at inputs \[4\] "):
        GaussianPredictions(loc, torch.ones(2, 9, 2))
    loc[1, 4, 1] = 0.0
    with pytest.raises(ValueError, match=r"inputs \[7\] \(1 of 9 inputs\); check the model"):
        GaussianPredictions(loc, scale)


def test_array_loader_keeps_its_seed_as_tensor_loader_does():
    from pyrouq import ArrayLoader

    x, y = torch.randn(10, 3), torch.randn(10)
    assert ArrayLoader(x, y, batch_size=4, seed=3).seed == 3
    torch.manual_seed(0)
    drawn = ArrayLoader(x, y, batch_size=4)
    again = ArrayLoader(x, y, batch_size=4, seed=drawn.seed)  # repeats the drawn order
    assert [b[1].tolist() for b in drawn] == [b[1].tolist() for b in again]


def test_ints_too_large_for_a_float_are_refused_in_words_by_factors_and_save(tmp_path):
    """Python's OverflowError ('int too large to convert to float') came out before."""
    import pyrouq

    with pytest.raises(ValueError, match=r"Expected r_std >= 0 \(a finite float\), got about "):
        pyrouq.batchensemble(torch.nn.Linear(3, 2), 2, r_std=10**400)
    with pytest.raises(ValueError, match=r"s_mean to be a finite float, got about -10\*\*400\."):
        pyrouq.batchensemble(torch.nn.Linear(3, 2), 2, s_mean=-(10**400))
    model = pyrouq.bayesian(torch.nn.Linear(3, 2))
    model.default_kl_weight = 10**400
    with pytest.raises(
        ValueError, match=r"expected to be a finite float >= 0, got about 10\*\*400 "
    ):
        pyrouq.save(tmp_path / "x.pt", model, pyrouq.mean_field_guide(model))


def test_predict_names_inputs_the_network_does_not_take_as_fit_does():
    """torch's bare 'expected input[4, 1, 8, 8] to have 3 channels' came out of predict(),
    where fit() restates it naming x; an error pyrouq words itself passes unchanged."""
    import pyrouq

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    net(torch.randn(1, 3, 8, 8))
    model = pyrouq.bayesian(net)
    for m, g in ((model, pyrouq.mean_field_guide(model)), (net, None)):
        with pytest.raises(ValueError) as err:
            predict(m, torch.randn(4, 1, 8, 8), g, progress=False)
        message = str(err.value)
        assert message.startswith(
            f"predict(): {type(m).__name__} failed on x (a batch of shape (4, 1, 8, 8), dtype "
            "torch.float32): Given groups=1, weight of size [4, 3, 3, 3], expected input"
        )
        assert message.endswith(
            f"at {'net.0' if m is model else '0'!r} of the "
            f"{'model' if m is model else 'network'}): the model's input, of 1 channel where "
            "this layer takes 3. Repeat the grey channel, x.expand(-1, 3, -1, -1), or build the "
            "network for 1 input channel (its first layer's in_channels=1)."
        )  # (the first layer says what to do about the model's input; the plain network's
        # said 'Check that the network takes x (shape, channels, flattening ...)' before)
