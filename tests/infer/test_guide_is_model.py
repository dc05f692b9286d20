"""The model passed as its own guide: predict() and to_inference_data() drew the weights from
the prior silently (their figures looked like a posterior's), fit() said "Nothing to train"
and save() that it stores a MeanFieldGuide; each now names the mistake."""

import pytest
import torch

import pyrouq

CALLS = {
    "predict()": lambda m, x, y: pyrouq.predict(m, x, m, num_samples=3, progress=False),
    "fit()": lambda m, x, y: pyrouq.fit(m, m, [(x, y)], epochs=1, num_data=8, progress=False),
    "save()": lambda m, x, y: pyrouq.save("never-written.pt", m, m),
    "to_inference_data()": lambda m, x, y: pyrouq.to_inference_data(m, m, x, y, num_samples=3),
}


@pytest.mark.parametrize("caller", CALLS)
def test_the_model_as_its_own_guide_is_refused(caller, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = pyrouq.BayesianMLP(in_features=4, hidden_features=5, out_features=3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(ValueError) as err:
        CALLS[caller](model, x, y)
    assert str(err.value) == (
        f"{caller}: the model (BayesianMLP) was passed as its own guide, which would draw the "
        "weights from the prior, not from a posterior. Pass the guide built for it, guide = "
        "mean_field_guide(model), fitted with fit(model, guide, data)."
    )
    assert not (tmp_path / "never-written.pt").exists()
