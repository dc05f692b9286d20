"""The CUDA paths, where a GPU is (every test here is skipped on a machine without one):
training, prediction, checkpoints and resumption, seeds, converted networks, regression,
MCMC chains, metrics and diagnostics, torch.distributed and the CLI, each on ``cuda``, and
where a CPU result exists, the same figures as the CPU.

TF32 is switched off for these tests (``torch.backends.*.allow_tf32``), so that a CUDA result
can be held to the CPU's to float32 rounding; with TF32 on (cuDNN's default for convolutions)
they differ in the third or fourth digit, which is TF32's precision, not pyrouq's."""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
import torchvision
from _toy import StopAfter
from torch import nn

from pyrouq import (
    ArrayLoader,
    BayesianLeNet,
    BayesianMLP,
    Gaussian,
    LeNet,
    Standardizer,
    TrainingInterrupted,
    batchensemble,
    bayesian,
    conformal,
    evaluate,
    fit,
    load,
    load_mnist,
    mcmc,
    mean_field_guide,
    predict,
    psis_diagnostic,
    rank1,
    save,
    temperature_scale,
    to_inference_data,
)

# PYROUQ_TEST_DEVICE=cpu runs this file on the CPU: a dry run of the tests themselves
CUDA = torch.device(os.environ.get("PYROUQ_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(
    CUDA.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
)


@pytest.fixture(autouse=True)
def _full_float32():
    keep = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = keep


@pytest.fixture(scope="module")
def mnist():
    """512 training images as a loader on the GPU, and 64 test images with labels (CPU)."""
    train, test = load_mnist(batch_size=64, train_size=512, seed=3, device=CUDA)
    return train, test.transform(test.images[:64]).cpu(), test.labels[:64].cpu()


def _state(*modules):
    return {
        f"{i}.{k}": v.detach().clone() for i, m in enumerate(modules) for k, v in
        m.state_dict().items()
    }  # fmt: skip


def _lenet(seed=0):
    pyro.set_rng_seed(seed)
    model = BayesianLeNet().to(CUDA)
    return model, mean_field_guide(model)


def test_a_bayesian_lenet_trains_on_cuda_and_predicts_as_on_the_cpu(mnist):
    train, x, y = mnist
    model, guide = _lenet()
    result = fit(model, guide, train, epochs=2, progress=False, seed=0)
    assert all(p.device.type == CUDA.type for p in [*model.parameters(), *guide.parameters()])
    assert all(math.isfinite(r.loss) for r in result.history)
    assert result.history[-1].train_acc > 0.3  # chance: 0.1

    preds = predict(model, x, guide, num_samples=8, progress=False)
    assert preds.probs.shape == (8, 64, 10) and preds.probs.device.type == "cpu"  # x's device
    on_gpu = predict(model, x.to(CUDA), guide, num_samples=8, progress=False)
    assert on_gpu.probs.device.type == CUDA.type
    torch.testing.assert_close(on_gpu.probs.sum(-1), torch.ones(8, 64, device=CUDA))

    draws = guide.sample(6)  # the same weights on both devices
    cuda_probs = predict(model, x, posterior_samples=draws, progress=False).probs
    cpu_model = copy.deepcopy(model).cpu()
    cpu_draws = {k: v.cpu() for k, v in draws.items()}
    cpu_probs = predict(cpu_model, x, posterior_samples=cpu_draws, progress=False).probs
    torch.testing.assert_close(cuda_probs, cpu_probs, rtol=1e-4, atol=1e-5)

    metrics = evaluate(on_gpu, y.to(CUDA))
    cpu_metrics = evaluate(on_gpu.to("cpu"), y)
    for key, value in cpu_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("network", ["mlp", "lenet"])
def test_a_seed_repeats_a_cuda_run_exactly(network, mnist):
    _, x, _ = mnist
    flat = network == "mlp"
    inputs = x.flatten(1) if flat else x
    cudnn = torch.backends.cudnn
    flags = cudnn.deterministic, cudnn.benchmark
    cudnn.benchmark = True  # a user's autotuning: off while a seeded run trains, then back
    seen = []
    runs = []
    for _ in range(2):
        pyro.set_rng_seed(0)
        model = (BayesianMLP(hidden_features=32) if flat else BayesianLeNet()).to(CUDA)
        guide = mean_field_guide(model)
        loader = load_mnist(batch_size=64, train_size=256, seed=3, flatten=flat, device=CUDA)[0]
        flags_now = lambda record: seen.append((cudnn.deterministic, cudnn.benchmark))  # noqa: E731
        fit(model, guide, loader, epochs=1, progress=False, seed=5, callbacks=[flags_now])
        runs.append(_state(model, guide))
    # cuDNN kept to its deterministic kernels while a seeded run trains on a GPU, then put back
    on_gpu = CUDA.type == "cuda"
    assert seen == [(on_gpu, not on_gpu)] * 2
    assert (cudnn.deterministic, cudnn.benchmark) == (flags[0], True)
    cudnn.benchmark = flags[1]
    for key, value in runs[0].items():
        assert torch.equal(value, runs[1][key]), key
    draws = []
    for _ in range(2):  # predict's draws and forward passes repeat under one seed
        pyro.set_rng_seed(7)
        draws.append(predict(model, inputs, guide, num_samples=4, progress=False).probs)
    assert torch.equal(draws[0], draws[1])


def _loader():
    return load_mnist(batch_size=64, train_size=256, seed=3, device=CUDA)[0]


def test_a_cuda_run_resumes_exactly_and_its_checkpoint_loads_on_the_cpu(tmp_path, mnist):
    _, x, _ = mnist
    model, guide = _lenet()
    full = fit(model, guide, _loader(), epochs=3, progress=False, seed=1)
    want = _state(model, guide)

    model, guide = _lenet()
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted):
        fit(model, guide, _loader(), epochs=3, progress=False, seed=1, checkpoint=path,
            callbacks=[StopAfter(1)])  # fmt: skip
    torch.cuda.manual_seed_all(123)  # the CUDA random state is the checkpoint's to restore
    model, guide = _lenet(seed=9)
    resumed = fit(model, guide, _loader(), epochs=3, progress=False, resume_from=path)
    assert [r.loss for r in resumed.history] == [r.loss for r in full.history]
    for key, value in _state(model, guide).items():
        torch.testing.assert_close(value, want[key], rtol=1e-6, atol=1e-7, msg=key)

    saved = load(path, device="cpu")
    assert all(p.device.type == "cpu" for p in saved.model.parameters())
    draws = guide.sample(4)
    on_gpu = predict(model, x, posterior_samples=draws, progress=False).probs
    cpu_draws = {k: v.cpu() for k, v in draws.items()}
    on_cpu = predict(saved.model, x, posterior_samples=cpu_draws, progress=False).probs
    torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-4, atol=1e-5)


def _images(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("local_reparameterization", [False, True])
def test_a_bayesian_resnet18_trains_and_predicts_on_cuda(local_reparameterization):
    torch.manual_seed(0)
    model = bayesian(
        torchvision.models.resnet18(num_classes=10),
        local_reparameterization=local_reparameterization,
    ).to(CUDA)
    guide = mean_field_guide(model)
    x, y = _images()
    norm = dict(model.named_parameters())["net.bn1.weight"]
    norm_before = norm.detach().clone()
    fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False, seed=0)
    assert not torch.equal(norm.detach(), norm_before)  # BatchNorm trained
    preds = predict(model, x[:4].to(CUDA), guide, num_samples=3, progress=False)
    assert preds.probs.shape == (3, 4, 10) and preds.probs.device.type == CUDA.type


def test_a_batchensemble_resnet18_on_cuda_has_members_equal_to_the_base_network():
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10).eval()
    ensemble = batchensemble(net, 4, r_std=0.0, s_std=0.0).to(CUDA).eval()
    x, _ = _images(4)
    with torch.no_grad():
        want = net.to(CUDA)(x.to(CUDA))
    probs = predict(ensemble, x.to(CUDA), progress=False).probs
    assert probs.shape == (4, 4, 10)
    for member in probs:
        torch.testing.assert_close(member, want.softmax(-1), rtol=1e-4, atol=1e-5)


def test_rank1_on_cuda_trains_and_repeats_its_draws():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 30 * 30, 10))  # fmt: skip
    model = rank1(net, 4).to(CUDA)
    guide = mean_field_guide(model)
    x, y = _images()
    fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=2, progress=False, seed=0)
    runs = []
    for _ in range(2):
        pyro.set_rng_seed(3)
        runs.append(predict(model, x.to(CUDA), guide, num_samples=2, progress=False).probs)
    assert runs[0].shape == (8, 8, 10)  # K = 2 draws x M = 4 members
    assert torch.equal(runs[0], runs[1])


def test_regression_on_cuda_fits_predicts_and_calibrates():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(256, 1, generator=g) * 6 - 3
    y = torch.sin(x) + 0.1 * torch.randn(256, 1, generator=g)
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1)),
                     likelihood=Gaussian(0.1)).to(CUDA)  # fmt: skip
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, 64, seed=0), epochs=150, progress=False, seed=0)
    preds = predict(model, x.to(CUDA), guide, num_samples=16, progress=False)
    assert preds.loc.shape == (16, 256, 1) and preds.loc.device.type == CUDA.type
    rmse = (preds.loc.mean(0).cpu() - y).pow(2).mean().sqrt().item()
    assert rmse < 0.3, rmse
    metrics = preds.evaluate(y.to(CUDA))
    cpu_metrics = preds.to("cpu").evaluate(y)
    for key, value in cpu_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    intervals = conformal(preds, y.to(CUDA), alpha=0.2)
    lower, upper = intervals.intervals(preds)
    covered = ((lower <= y.to(CUDA)) & (y.to(CUDA) <= upper)).float().mean().item()
    assert covered >= 0.8


def test_metrics_calibration_and_diagnostics_take_a_cuda_model(mnist):
    train, x, y = mnist
    model, guide = _lenet()
    fit(model, guide, train, epochs=1, progress=False, seed=0)
    xc, yc = x.to(CUDA), y.to(CUDA)
    preds = predict(model, xc, guide, num_samples=8, progress=False)
    scaler = temperature_scale(preds, yc)
    assert 0.05 < scaler.temperature < 20
    sets = conformal(preds, yc, alpha=0.1).predict_sets(preds)
    assert sets.shape == (64, 10)
    idata = to_inference_data(model, guide, xc, yc, num_samples=5)
    assert idata.posterior.sizes["draw"] == 5
    assert idata.log_likelihood["obs"].shape[-1] == 64
    psis = psis_diagnostic(model, guide, xc, yc, num_samples=100)
    assert math.isfinite(psis.k_hat)


def _mcmc_on_gpu(n: int, steps: int, **options):
    """A Bayesian linear classifier on the GPU, its NUTS draws on ``n`` toy inputs (on the
    CPU) and their labels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    model = bayesian(nn.Linear(2, 2)).to(CUDA)
    result = mcmc(model, x.to(CUDA), y.to(CUDA), num_samples=steps, warmup_steps=steps,
                  seed=0, progress=False, **options)  # fmt: skip
    return model, x, y, result


@pytest.mark.parametrize("parallel", [False, True])
def test_mcmc_chains_run_on_cuda(parallel):
    model, x, y, result = _mcmc_on_gpu(64, 20, num_chains=2, parallel=parallel)
    preds = predict(model, x.to(CUDA), posterior_samples=result, progress=False)
    assert preds.probs.shape == (40, 64, 2)
    assert evaluate(preds, y.to(CUDA))["acc"] > 0.9


def test_seeded_mcmc_of_a_convolution_repeats_exactly_on_cuda():
    """Chains of a network with latent convolution weights repeat bit for bit under one seed
    (cuDNN's deterministic kernels while they run; the user's autotuning put back after)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 6, 6, generator=g), torch.randint(0, 2, (16,), generator=g)
    cudnn = torch.backends.cudnn
    flags = cudnn.deterministic, cudnn.benchmark
    cudnn.benchmark = True
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(32, 2))
        model = bayesian(net).to(CUDA)
        result = mcmc(model, x.to(CUDA), y.to(CUDA), num_samples=5, warmup_steps=5, seed=1,
                      progress=False)  # fmt: skip
        runs.append(result.samples)
    assert (cudnn.deterministic, cudnn.benchmark) == (flags[0], True)
    cudnn.benchmark = flags[1]
    for site, draws in runs[0].items():
        assert torch.equal(draws, runs[1][site]), site


# ---------------------------------------------------------------------------------------------
# torch.distributed: two ranks on the GPU(s), gloo on CUDA tensors (nccl needs a GPU per rank)
# ---------------------------------------------------------------------------------------------

N = 16


def _rank_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, generator=g), torch.randint(0, 2, (N,), generator=g)


def _rank_build():
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))).to(CUDA)
    return model, mean_field_guide(model)


def _rank_step(loader, **kwargs):
    model, guide = _rank_build()
    fit(model, guide, loader, epochs=1, optim=lambda ps: torch.optim.SGD(ps, lr=0.1),
        lr_schedule="constant", progress=False, seed=0, **kwargs)  # fmt: skip
    return {k: v.cpu() for k, v in _state(model, guide).items()}


def _rank_worker(rank: int, backend: str, init: str, out: str) -> None:
    if CUDA.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    torch_dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        x, y = _rank_data()
        one = _rank_step(ArrayLoader(x, y, N // 2, shuffle=False),
                         distributed_draws="identical")  # fmt: skip
        model, guide = _rank_build()
        fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=3, progress=False, seed=0)
        after = {k: v.cpu() for k, v in _state(model, guide).items()}
        torch.save({"one": one, "after": after}, Path(out) / f"rank{rank}.pt")
    finally:
        torch_dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_two_cuda_ranks_train_as_one_process(backend, tmp_path):
    if backend == "nccl" and (CUDA.type != "cuda" or torch.cuda.device_count() < 2):
        pytest.skip("nccl needs a GPU per rank (it refuses two ranks on one GPU)")
    context = mp.spawn(_rank_worker, args=(backend, str(tmp_path / "init"), str(tmp_path)),
                       nprocs=2, join=False)  # fmt: skip
    deadline = time.monotonic() + 180
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two ranks did not finish within 180 s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    x, y = _rank_data()
    single = _rank_step(ArrayLoader(x, y, N, shuffle=False))
    for r in ranks:  # the averaged gradient of 2 x B/2 is the one-process gradient of B
        for key, value in single.items():
            torch.testing.assert_close(r["one"][key], value, rtol=0, atol=1e-6)
    for key, value in ranks[0]["after"].items():
        assert torch.equal(value, ranks[1]["after"][key]), key


def test_the_cli_fits_on_cuda_and_evaluates_the_run_on_the_cpu(tmp_path):
    from pyrouq.cli import main

    out = tmp_path / "run"
    argv = ["fit", "bayesian-lenet", "--epochs", "1", "--train-size", "512", "--device", CUDA.type,
            "--num-samples", "4", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert (out / "metrics.json").exists()
    plain = ["fit", "lenet", "--epochs", "1", "--train-size", "512", "--device", CUDA.type,
             "--out", str(tmp_path / "plain"), "--no-progress"]  # fmt: skip
    assert main(plain) == 0
    code = main(["evaluate", str(out), "--device", "cpu", "--num-samples", "2", "--ood", "none",
                 "--no-progress"])  # fmt: skip
    assert code == 0


def test_a_plain_network_and_a_cpu_made_noise_prior_train_on_cuda(mnist):
    train, _, _ = mnist
    torch.manual_seed(0)
    net = LeNet().to(CUDA)  # no KL term: fit() reports a zero one on the GPU
    first, second = fit(net, None, train, epochs=2, progress=False, seed=0).history
    assert first.kl == second.kl == 0.0 and second.nll < first.nll
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(64, 3, generator=g), torch.randn(64, 2, generator=g)
    # converted after the network moved to the GPU: the (CPU-made) noise prior follows it
    model = bayesian(nn.Linear(3, 2).to(CUDA), likelihood=Gaussian(dist.HalfNormal(torch.ones(2))))
    fit(model, mean_field_guide(model), ArrayLoader(xs, ys, 16, seed=0), epochs=2,
        progress=False, seed=0)  # fmt: skip
    stats = Standardizer.fit(xs, ys)  # fitted on the CPU, applied on the GPU
    torch.testing.assert_close(stats.transform_x(xs.to(CUDA)).cpu(), stats.transform_x(xs))
    torch.testing.assert_close(stats.transform_y(ys.to(CUDA)).cpu(), stats.transform_y(ys))


def test_mcmc_draws_saved_from_the_gpu_predict_with_a_model_on_either_device(tmp_path):
    model, x, _, result = _mcmc_on_gpu(32, 10, num_chains=1)
    want = predict(model, x, posterior_samples=result, progress=False).probs
    save(tmp_path / "mcmc.pt", result)
    loaded = load(tmp_path / "mcmc.pt")  # draws on the CPU
    assert all(v.device.type == "cpu" for v in loaded.samples.values())
    got = predict(model, x, posterior_samples=loaded, progress=False).probs  # model on GPU
    torch.testing.assert_close(got, want)
    on_gpu = load(tmp_path / "mcmc.pt", device=CUDA)
    assert all(v.device.type == CUDA.type for v in on_gpu.samples.values())
    cpu_model = copy.deepcopy(model).cpu()
    got = predict(cpu_model, x, posterior_samples=on_gpu, progress=False).probs
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class Observed(pyro.nn.PyroModule):
    """A Pyro model of one's own with no latent site: a network observed in a plate."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):  # its subsample indices are made on the CPU
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_a_pyro_model_with_no_latent_site_trains_on_cuda():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    model = Observed().to(CUDA)
    history = fit(model, None, ArrayLoader(x, y, 32, seed=0), epochs=3, progress=False,
                  seed=0).history  # fmt: skip
    assert all(r.kl == 0.0 for r in history) and history[-1].nll < history[0].nll
