"""Fifth newcomer's journey through the README: the fixes to its text that can be checked."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
import torchvision

import pyrouq

README = Path(__file__).resolve().parents[2] / "README.md"


def _text() -> str:
    return README.read_text(encoding="utf-8")


def test_the_resnet18_one_channel_line_runs_on_mnist_shaped_input():
    # before: the block's resnet18 failed on MNIST / Fashion-MNIST batches (3 channels expected)
    line = re.search(r"for MNIST's 1: (net\.conv1 = [^\n]+)", _text())
    assert line, "the README says how to give resnet18 one input channel"
    net = torchvision.models.resnet18(num_classes=10)
    exec(line.group(1), {"net": net, "torch": torch})
    model = pyrouq.bayesian(net)
    guide = pyrouq.mean_field_guide(model)
    preds = pyrouq.predict(model, torch.randn(2, 1, 28, 28), guide, num_samples=2, progress=False)
    assert preds.probs.shape == (2, 2, 10)


def test_the_resnet18_skeleton_is_built_as_the_one_channel_net_was(tmp_path):
    # before: the block's load() built a stock resnet18 (3 channels) as the skeleton, which a
    # network given MNIST's one channel by the line above is refused with ('conv1.weight' is
    # shape (64, 1, 7, 7) in the checkpoint and (64, 3, 7, 7) in the skeleton)
    text = _text()
    assert "resnet18(num_classes=10)  # built as net was (its conv1 too)" in text
    line = re.search(r"for MNIST's 1: (net\.conv1 = [^\n]+)", text)
    assert line and 'pyrouq.load("resnet.pt", module=skeleton)' in text
    net, skeleton = (torchvision.models.resnet18(num_classes=10) for _ in range(2))
    for module in (net, skeleton):
        exec(line.group(1), {"net": module, "torch": torch})
    model = pyrouq.bayesian(net, select="last_layer")
    path = pyrouq.save(tmp_path / "resnet.pt", model, pyrouq.mean_field_guide(model))
    with pytest.raises(pyrouq.CheckpointError, match=r"shape \(64, 1, 7, 7\) in the checkpoint"):
        pyrouq.load(path, module=torchvision.models.resnet18(num_classes=10))
    restored = pyrouq.load(path, module=skeleton)
    assert torch.equal(restored.model.net.conv1.weight, model.net.conv1.weight)


def test_the_calibration_block_names_what_its_inputs_are():
    # before: val_preds, test_preds, small_model, x_new appeared from nowhere
    block = _text().split("## Calibration, conformal sets and MCMC", 1)[1].split("```", 2)[1]
    small = re.search(
        r"small_model: a small Bayesian network, (pyrouq\.bayesian\([^\n;]+\));", block
    )
    assert small and "val_preds, test_preds: predict()" in block
    model = eval(small.group(1), {"pyrouq": pyrouq, "nn": torch.nn})
    assert model.latent_sites()
    # before: "# >= 0.9": one split's coverage is only >= 1 - alpha on average over splits
    assert ">= 0.9, ..." not in block


def test_data_section_train_size_and_fashion_mnist_are_true():
    text = " ".join(_text().split())
    assert "`train_size=2000` keeps the first 2,000 training images" in text
    assert "`load_fashion_mnist` takes the same arguments" in text
    assert inspect.signature(pyrouq.load_fashion_mnist) == inspect.signature(pyrouq.load_mnist)
    train, _ = pyrouq.load_mnist(batch_size=500, shuffle=False, train_size=2000)
    assert sum(len(y) for _, y in train) == 2000


def test_data_section_says_how_to_normalise_ones_own_images_as_the_loaders_do():
    # before: nothing said that raw images of one's own need the loaders' normalisation, and
    # predict() takes floats in [0, 1] without a word (ECE 0.56 % -> 34.25 % in the README's run)
    text = " ".join(_text().split())
    assert "through `pyrouq.data.normalize(images)` before `predict()`" in text
    images, _ = pyrouq.data.mnist_arrays("test")
    _, test = pyrouq.load_mnist(batch_size=64, seed=0)
    x, _ = next(iter(test))
    assert torch.equal(pyrouq.data.normalize(images[:64]), x)  # the recipe gives their batches
    assert not torch.equal(images[:64].unsqueeze(1) / 255, x)  # and [0, 1] floats are not them


def test_your_own_network_says_fit_and_predict_set_the_mode_themselves():
    # before: nothing said whether model.train() / model.eval() were needed around the calls
    text = " ".join(_text().split())
    assert "No `model.train()` or `model.eval()` is needed around the calls" in text
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)
    )
    model = pyrouq.bayesian(net)
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(32, 4), torch.arange(32) % 3
    stats = [b.clone() for b in model.buffers() if b.is_floating_point()]
    model.eval()  # forgotten: fit() trains in training mode all the same (BatchNorm's moved)
    pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, batch_size=16, seed=0), epochs=1,
               progress=False)  # fmt: skip
    assert not model.training
    after = [b for b in model.buffers() if b.is_floating_point()]
    assert any(not torch.equal(a, b) for a, b in zip(stats, after, strict=True))
    # it said each call left the model in the mode it came in: fit() leaves it in eval mode
    assert "`fit()` trains in training mode and leaves the model in eval mode" in text
    model.train()
    pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, batch_size=16, seed=0), epochs=1,
               progress=False)  # fmt: skip
    assert not model.training
    model.train()  # forgotten: predict() runs in eval mode, dropout off, the same draws
    one = pyrouq.predict(model, x, guide, num_samples=2, seed=0, progress=False)
    assert model.training
    model.eval()
    two = pyrouq.predict(model, x, guide, num_samples=2, seed=0, progress=False)
    assert torch.equal(one.probs, two.probs)


def test_the_seed_paragraph_says_fit_seed_leaves_the_initial_weights_to_the_global_stream():
    # before: "A seed makes a run repeat exactly" after the Example, whose BayesianLeNet() took
    # its initial weights from torch's global stream, which torch seeds anew in each process:
    # the block, run twice, ended elsewhere though fit() and predict() were given seed=0
    text = " ".join(_text().split())
    assert "The network's initial weights are not such a draw" in text
    assert "seed that stream before building the network (`torch.manual_seed(0)`" in text
    installation = README.parent / "docs" / "installation.md"
    assert "`seed=` seeds the training and the draws, not the initial weights" in " ".join(
        installation.read_text(encoding="utf-8").split()
    )
    x, y = torch.randn(32, 1, 28, 28), torch.arange(32) % 10

    def run(build_seed):
        if build_seed is not None:
            torch.manual_seed(build_seed)
        model = pyrouq.BayesianLeNet()
        guide = pyrouq.mean_field_guide(model)
        loader = pyrouq.ArrayLoader(x, y, batch_size=16, seed=0)
        pyrouq.fit(model, guide, loader, epochs=1, seed=0, progress=False)
        return pyrouq.predict(model, x, guide, num_samples=2, seed=0, progress=False).probs

    torch.manual_seed(1)
    first = run(None)  # the global stream as another process (or an earlier cell) left it
    assert not torch.equal(first, run(None))  # seed=0 alone: another run
    assert torch.equal(run(0), run(0))  # the stream seeded before building: the same run


def test_the_readme_says_metrics_json_num_samples_counts_draws_times_members():
    # before: nothing said it; a rank-1 run's metrics.json num_samples (16) passed back as
    # --num-samples quadrupled its draws (config.json's 4); and a BatchEnsemble run's, passed
    # back as told (4 / 4: --num-samples 1), was refused: it takes no --num-samples
    from pyrouq.cli._build import DEFAULT_MEMBERS, DEFAULT_NUM_SAMPLES

    text = " ".join(_text().split())
    draws = DEFAULT_NUM_SAMPLES // DEFAULT_MEMBERS  # rank1-lenet's, each running every member
    assert (
        "Their `num_samples` is S, the predictions the figures average: a Bayesian model's "
        "posterior draws, a BatchEnsemble's members, and a rank-1 model's draws x members "
        f"(`rank1-lenet`: {draws} draws of {DEFAULT_MEMBERS} members, {DEFAULT_NUM_SAMPLES}), "
        "while `--num-samples` and `config.json` count draws, so pass a rank-1 run's "
        "`num_samples / members` back (a BatchEnsemble or plain run takes no `--num-samples`: "
        "its S is fixed); `members` records M (null for a model without members)."
    ) in text
