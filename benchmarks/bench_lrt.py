"""Local reparameterisation: gradient variance of the ELBO and time per training epoch.

* Gradient variance. A BayesianMLP (784-256-10) and a BayesianLeNet, each with a mean-field
  guide fixed at two points: its initialisation (init_scale 1e-2) and after one MNIST epoch of
  training by weight sampling (the defaults of fit). On one fixed minibatch of 128 training
  images, R repeated evaluations (default 50) of the gradient of the exact negative ELBO
  (kl_weight = 1, one particle) with respect to the guide locations, once with weight sampling
  and once with local reparameterisation. Reported per layer and in total: the summed variance
  over the location entries (trace of the gradient's covariance, estimated from the R
  gradients; weight and bias together) and its ratio local / weight sampling. The KL part of
  the gradient is deterministic, so all the variance comes from the likelihood term.
* Time. One MNIST epoch (batch 512) of a plain LeNet (torch cross-entropy and Adam), of a
  BayesianLeNet through pyrouq.fit with weight sampling, and with local reparameterisation
  (interleaved rounds after a warm-up; ratio = median of the per-round ratios).

    python benchmarks/bench_lrt.py [--grads R] [--reps ROUNDS] [--train-size N]
"""

from __future__ import annotations

import argparse
import statistics

import pyro
import torch
import torch.nn.functional as F
from _common import ratio_to, report, rounds

from pyrouq import (
    BayesianLeNet,
    BayesianMLP,
    KLWeightedELBO,
    LeNet,
    fit,
    load_mnist,
    mean_field_guide,
)

BATCH = 128
"""Size of the fixed minibatch on which the gradient variance is measured."""


def gradient_variance(model, guide, x, y, grads: int) -> dict[str, float]:
    """Summed per-entry variance of ``grads`` gradients of the loss w.r.t. each layer's loc."""
    elbo = KLWeightedELBO()
    layers = list(dict.fromkeys(site.split(".")[0] for site in guide.sites))  # forward order
    params = {name: [guide.loc[f"{name}__weight"], guide.loc[f"{name}__bias"]] for name in layers}
    flat = [p for ps in params.values() for p in ps]
    draws: list[list[torch.Tensor]] = []
    with pyro.validation_enabled(False):
        for _ in range(grads):
            loss = elbo.differentiable_loss(model, guide, x, y)
            draws.append([g.detach() for g in torch.autograd.grad(loss, flat)])
    variances = [torch.stack(g).var(0).sum().item() for g in zip(*draws, strict=True)]
    out: dict[str, float] = {}
    for i, name in enumerate(layers):
        out[name] = variances[2 * i] + variances[2 * i + 1]
    out["total"] = sum(variances)
    return out


def variance_rows(name: str, state: str, model, guide, x, y, grads: int) -> list[dict[str, object]]:
    model.local_reparameterization = False
    pyro.set_rng_seed(1)
    weights = gradient_variance(model, guide, x, y, grads)
    model.local_reparameterization = True
    pyro.set_rng_seed(1)
    local = gradient_variance(model, guide, x, y, grads)
    model.local_reparameterization = False
    return [
        {
            "model": name,
            "guide": state,
            "layer": layer,
            "var_weight_sampling": f"{weights[layer]:.4g}",
            "var_local": f"{local[layer]:.4g}",
            "ratio_local_over_weights": f"{local[layer] / weights[layer]:.3g}",
        }
        for layer in weights
    ]


def guides(make, loader):
    """(state, model, guide): the guide at initialisation, then fitted for one epoch by weight
    sampling."""
    model = make(num_data=len(loader.dataset))
    yield "init", model, mean_field_guide(model)
    model = make()
    guide = mean_field_guide(model)
    fit(model, guide, loader, epochs=1, progress=False, seed=0)
    yield "1 epoch", model, guide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grads", type=int, default=50, help="gradients per estimator")
    parser.add_argument("--reps", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--train-size", type=int, default=None, help="MNIST subset (smoke runs)")
    args = parser.parse_args()

    torch.manual_seed(0)
    train, _ = load_mnist(batch_size=512, seed=0, train_size=args.train_size)
    train_flat, _ = load_mnist(batch_size=512, seed=0, flatten=True, train_size=args.train_size)
    x, y = next(iter(train))
    x, y = x[:BATCH], y[:BATCH]

    rows = []
    for name, make, loader, inputs in (
        ("BayesianMLP 784-256-10", BayesianMLP, train_flat, x.flatten(1)),
        ("BayesianLeNet", BayesianLeNet, train, x),
    ):
        for state, model, guide in guides(make, loader):
            rows += variance_rows(name, state, model, guide, inputs, y, args.grads)
    print(
        f"Variance of d(-ELBO)/d(guide loc) over {args.grads} gradients on one minibatch of "
        f"{BATCH} (summed over entries):"
    )
    report("lrt_gradient_variance", rows)

    net = LeNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def plain_epoch() -> None:
        for xb, yb in train:
            optimizer.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            optimizer.step()

    def bayes(local: bool):
        model = BayesianLeNet(local_reparameterization=local)
        guide = mean_field_guide(model)
        return lambda: fit(model, guide, train, epochs=1, progress=False)

    times = rounds(
        {
            "plain LeNet": plain_epoch,
            "BayesianLeNet, weight sampling": bayes(False),
            "BayesianLeNet, local reparameterisation": bayes(True),
        },
        reps=args.reps,
    )
    vs_plain = ratio_to(times, "plain LeNet")
    vs_weights = ratio_to(times, "BayesianLeNet, weight sampling")
    steps = len(train)
    rows = [
        {
            "workload": name,
            "seconds": round(statistics.median(ts), 3),
            "ms_per_step": round(1000 * statistics.median(ts) / steps, 2),
            "ratio_vs_plain": round(vs_plain[name], 2),
            "ratio_vs_weight_sampling": round(vs_weights[name], 2),
        }
        for name, ts in times.items()
    ]
    print(
        f"One MNIST epoch, batch 512 ({args.reps} interleaved rounds after a warm-up; ratio = "
        "median of the per-round ratios):"
    )
    report("lrt_train_epoch", rows)


if __name__ == "__main__":
    main()
