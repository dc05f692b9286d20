"""The words of refusals outside the data helpers: the function called is the one named
(to_inference_data and psis_diagnostic of integer inputs named the network's class), "an int"
(not "a int"), fit() of a batch of (x, y) examples left uncollated (told "several inputs"),
and `pyrouq fit`'s Ctrl-C line before a first step, which now says what fit() says."""

from __future__ import annotations

import pytest
import torch
from _cli import CtrlCAt
from _toy import tiny_mlp, toy_data

import pyrouq
import pyrouq.data
from pyrouq.cli import main

UINT8_REFUSAL = (
    "{fn} expects floating-point inputs, got a torch.uint8 tensor (raw 0-255 pixels?). Scale "
    "and normalise images first, pyrouq.data.normalize(images), or load them with "
    "load_mnist() / load_fashion_mnist(), which do it; for inputs that are already features, "
    "x.float()."
)


def test_diagnostics_of_integer_inputs_name_the_function_called():
    model = tiny_mlp()
    guide = pyrouq.mean_field_guide(model)
    x, y = toy_data(8)
    raw = (x.abs() * 50).to(torch.uint8)
    # it said "BayesianMLP expects floating-point inputs", from inside the network's forward
    with pytest.raises(TypeError) as info:
        pyrouq.to_inference_data(model, guide, raw, y, num_samples=2)
    assert str(info.value) == UINT8_REFUSAL.format(fn="to_inference_data()")
    with pytest.raises(TypeError) as info:
        pyrouq.psis_diagnostic(model, guide, raw, y, num_samples=30)
    assert str(info.value) == UINT8_REFUSAL.format(fn="psis_diagnostic()")
    # as predict() says it
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, raw, guide, 2)
    assert str(info.value) == UINT8_REFUSAL.format(fn="predict()")


def test_predict_of_a_draw_count_as_the_guide_says_an_int():
    model = tiny_mlp()
    x, _ = toy_data(4)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, x, 10)
    assert str(info.value) == (
        "predict() expects the guide to be callable (mean_field_guide(model), a Pyro autoguide "
        "or guide function), got an int. The draw count comes after the guide: "
        "predict(model, x, guide, 10)."
    )
    with pytest.raises(TypeError, match=r"got a str\.$"):
        pyrouq.predict(model, x, "guide")


class _ExamplesWithIntLabels(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def _as_they_came(items):
    return items


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_fit_of_uncollated_example_pairs_says_what_came_and_to_use_the_default_collate(
    batch_size,
):
    # two examples were told "several inputs" (compute the others from x in forward), one
    # "the inputs alone?", three "serve (x, y) without the other 1 item(s)"
    x, y = toy_data(12)
    model = tiny_mlp()
    guide = pyrouq.mean_field_guide(model)
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=_as_they_came)
    with pytest.raises(TypeError) as info:
        pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    examples = f"{batch_size} (x, y) example{'s' if batch_size > 1 else ''}"
    assert str(info.value) == (
        f"train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is a list of "
        f"{examples} (a tensor of shape (3,) and a tensor of shape ()): the examples of a batch "
        "as they came, uncollated (a collate_fn that returns its items as they are, as "
        "collate_fn=lambda b: b), not one (x, y) pair. Leave collate_fn out: the DataLoader's "
        "default one stacks the examples into (x, y); or return "
        "torch.utils.data.default_collate(items) from yours."
    )
    ints = torch.utils.data.DataLoader(_ExamplesWithIntLabels(x, y), batch_size=2,
                                       collate_fn=_as_they_came)  # fmt: skip
    with pytest.raises(TypeError, match=r"is a list of 2 \(x, y\) examples \(a tensor of shape "
                       r"\(3,\) and an int\): the examples"):  # fmt: skip
        pyrouq.fit(model, guide, ints, epochs=1, progress=False)
    # the fix it names trains
    fixed = torch.utils.data.DataLoader(dataset, batch_size=batch_size)
    assert len(pyrouq.fit(model, guide, fixed, epochs=1, progress=False).history) == 1


def test_several_inputs_are_still_told_as_several_inputs():
    x, y = toy_data(4)
    model = tiny_mlp()
    with pytest.raises(TypeError, match=r"is \(tuple of 2 tensors, Tensor\), and pyrouq runs"):
        pyrouq.fit(model, pyrouq.mean_field_guide(model), [((x, x), y)], epochs=1,
                   num_data=4, progress=False)  # fmt: skip


def test_pyrouq_fit_interrupted_before_a_first_step_says_so_as_fit_does(
    tmp_path, capsys, monkeypatch
):
    # a second Ctrl-C while the loader fetches an epoch's first batch: the command said
    # "after step 0", fit() "before its first step"
    served = pyrouq.data.TensorLoader.__iter__
    epochs = []

    def interrupted_in_epoch_2(loader):
        epochs.append(1)
        if len(epochs) == 2:
            raise KeyboardInterrupt
        return served(loader)

    monkeypatch.setattr(CtrlCAt, "at", 0)
    monkeypatch.setattr(pyrouq.data.TensorLoader, "__iter__", interrupted_in_epoch_2)
    argv = ["fit", "_cli:ctrl_c_net", "--epochs", "2", "--train-size", "64", "--batch-size"]
    argv += ["64", "--seed", "5", "--num-samples", "2", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert (
        "\npyrouq: interrupted in epoch 2 before its first step; the partial run is saved at "
        f"{tmp_path / 'run' / 'checkpoint.pt'} (resume it: pyrouq fit _cli:ctrl_c_net"
    ) in err
    assert "after step" not in err
    # fit() in Python, stopped alike, says the same
    epochs.clear()
    x, y = torch.zeros(8, 28, 28, dtype=torch.uint8), torch.zeros(8, dtype=torch.long)
    loader = pyrouq.data.TensorLoader(x, y, 8, shuffle=False, flatten=False, normalize=True,
                                      seed=0)  # fmt: skip
    model = pyrouq.bayesian(CtrlCAt())
    with pytest.raises(pyrouq.TrainingInterrupted) as info:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), loader, epochs=2, progress=False)
    assert str(info.value).startswith("Training interrupted in epoch 2 before its first step: ")


def test_a_stop_between_epochs_says_the_epoch_ended():
    """A callback raising KeyboardInterrupt after epoch 1's last step was told "interrupted in
    epoch 1 after step 2", as if inside it, though epoch 1 was whole (and saved as done)."""
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    batches = [(torch.randn(4, 4), torch.randint(0, 3, (4,))) for _ in range(2)]

    def stop(record):
        raise KeyboardInterrupt

    with pytest.raises(pyrouq.TrainingInterrupted) as info:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), batches, epochs=3, num_data=8,
                   progress=False, callbacks=[stop])  # fmt: skip
    assert (info.value.epoch, info.value.step, info.value.epoch_complete) == (1, 2, True)
    assert str(info.value).startswith(
        "Training interrupted at the end of epoch 1 (after its last step, 2): the model and "
        "guide keep the parameters of that step; pass checkpoint=PATH"
    )
    assert len(info.value.result.history) == 1
