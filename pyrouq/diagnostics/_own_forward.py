"""``to_inference_data`` on a :class:`~pyrouq.BayesianNetwork` whose ``forward`` is its own (a
subclass's, or one set on the instance: :func:`~pyrouq._forwards.forward_module`; the model
compiled or not): that forward runs under each draw, as
:func:`pyrouq.predict` runs it (and Pyro's ``Predictive``), not the network alone
(``outputs()``), and the sites it samples beside the weights (a temperature) are latent sites
of the export like the weights."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
from pyro import poutine
from torch import Tensor

from pyrouq._distribution_parts import innermost_distribution
from pyrouq._forwards import forward_module
from pyrouq._own_likelihood import _close
from pyrouq._own_models import fitting_draws, traced_latent_sites
from pyrouq._runners import own_forward_outputs
from pyrouq._util import class_name, rng_state, set_rng_state, warn_caller
from pyrouq.diagnostics._common import _prepared
from pyrouq.likelihoods import Categorical, likelihood_of

_CALLER = "to_inference_data()"


def exported_forward(model: Any) -> Any | None:
    """The module whose own ``forward`` the export runs under each draw
    (:func:`~pyrouq._forwards.forward_module`), or None for a network run alone with each draw
    (``outputs()``); a BatchEnsemble or rank-1 network with a forward of its own is refused."""
    return forward_module(model, _CALLER)


def _classes(model: Any) -> bool:
    return isinstance(likelihood_of(model), Categorical)


def exported_sites(model: Any, x: Tensor, n: int) -> list[str]:
    """The latent sites of ``model``: :meth:`latent_sites`, then, for a model whose own forward
    runs (:func:`exported_forward`), the sites that forward samples beside them (a temperature), as
    a trace of it on the first inputs of ``x`` finds them (in eval mode, with ``num_data`` ``n``,
    the random state kept)."""
    names = list(model.latent_sites())
    own = exported_forward(model)
    if own is None:
        return names
    with _prepared(own, n):
        traced = traced_latent_sites(own, x, _classes(own)) or {}
    return names + [site for site in traced if site not in names]


def conditioned_sites(
    own: Any, weights: dict[str, Tensor], x: Tensor, caller: str, source: str, guide: Any = None
) -> list[str]:
    """The sites of one draw ``weights`` that the forward of ``own`` runs conditioned on: its
    latent sites, every one of them required of the draws, as predict() requires them
    (:func:`~pyrouq._own_models.fitting_draws`: a site missing or of another shape refused;
    ``guide``, the guide drawn from, tells why its draws do not fit)."""
    drawn = {name: value[None] for name, value in weights.items()}
    return list(fitting_draws(own, drawn, x, caller, source, _classes(own), guide))


def forward_outputs(
    own: Any, x: Tensor, weights: dict[str, Tensor], warn: bool
) -> tuple[Tensor, Any]:
    """The outputs of ``own``'s forward run on ``x`` under the draw ``weights``
    (:func:`~pyrouq._runners.own_forward_outputs`), and the ``"obs"`` site it samples (its
    distribution: :class:`ObservedDensity`), or None. What it samples moves the random state:
    the export runs a draw's batches within :func:`draw_stream`."""
    with poutine.trace() as tracer:
        outputs = own_forward_outputs(own, x, weights, warn, _CALLER)
    site = tracer.trace.nodes.get("obs")
    return outputs, site if site is not None and site["type"] == "sample" else None


@contextlib.contextmanager
def draw_stream(device: torch.device, forward: Any, draw: int) -> Iterator[None]:
    """The batches of one draw run by the own ``forward`` (none for a network run alone) on a
    stream of their own, seeded from the export's random state at that draw and the draw's
    index ``draw`` (MCMC draws and a Delta guide move no state), the state being put back
    after them: what the forward samples without targets (``"obs"``, a local site drawn per
    input) takes new values batch after batch and draw after draw, apart from the numbers the
    guide's next draw takes, and the export's next draws are as they would be without it."""
    if forward is None:
        yield
        return
    state = rng_state(device)
    try:
        _reseed(device, state, draw)
        yield
    finally:
        set_rng_state(device, state)


def _reseed(device: torch.device, state: tuple[Tensor, Tensor | None], draw: int) -> None:
    """torch's CPU generator, and ``device``'s on an accelerator, seeded from a digest of
    ``state`` (the CPU's and the device's: a guide on CUDA moves only the latter) and of the
    index ``draw`` (a state no draw moves gives each draw its own seed all the same)."""
    digest = hashlib.blake2b(draw.to_bytes(8, "little"), digest_size=8)
    for part in state:
        if part is not None:
            digest.update(part.cpu().numpy().tobytes())
    seed = int.from_bytes(digest.digest(), "little") >> 1  # (a non-negative int64)
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)
    elif device.type == "mps":
        torch.mps.manual_seed(seed)


class ObservedDensity:
    """The pointwise log-likelihood of a model whose own forward samples ``"obs"``: the
    density of that site's distribution at the targets (its scale, the forward's N/B, left
    out: ``log p(y_i | w)``, as the likelihood's), where its likelihood's differs (a forward
    observing ``Normal(out, 3.0)`` beside ``Gaussian(0.5)``), with a warning the first time;
    the likelihood's, to float64 precision, where the two agree or the site's density is not
    one per input. A point masked out (``poutine.mask``, or the distribution's ``.mask()``)
    scores 0; outputs in a plate of their own are summed, as an event's are."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.warned = False

    def __call__(
        self, site: dict[str, Any], cols: slice, target: Tensor, log_lik: Tensor
    ) -> Tensor:
        value = site["value"]
        if not torch.is_tensor(value) or value.numel() != target.numel():
            return log_lik
        target = target.reshape(value.shape).to(value.device)
        if value.is_floating_point():
            target = target.to(value.dtype)
        try:
            own = site["fn"].log_prob(target).detach()
            if site.get("mask") is not None:  # (poutine.mask's: a masked point scores 0, as
                keep = torch.broadcast_to(
                    torch.as_tensor(site["mask"], device=own.device), own.shape
                )
                own = own.masked_fill(~keep, 0.0)  # under a .mask() of its distribution)
        except (ValueError, RuntimeError):  # (a target outside its support, a shape)
            return log_lik
        if own.dim() > log_lik.dim() and own.shape[: log_lik.dim()] == log_lik.shape:
            own = own.flatten(log_lik.dim()).sum(-1)  # outputs in a plate of their own
        if own.shape != log_lik.shape or _close(own, log_lik):
            return log_lik
        if not self.warned:
            self.warned = True
            self._warn(site, cols, own, log_lik)
        return own.to(log_lik)

    def _warn(self, site: dict[str, Any], cols: slice, own: Tensor, log_lik: Tensor) -> None:
        own, log_lik = own.double(), log_lik.double()
        gap = (own - log_lik).abs().masked_fill(own == log_lik, 0).nan_to_num(float("inf"))
        i = int(gap.argmax())
        likelihood = likelihood_of(self.model)
        warn_caller(
            f"{_CALLER}: {class_name(self.model)}'s forward draws 'obs' from "
            f"{type(innermost_distribution(site['fn'])).__name__}, whose log-density at the "
            f"targets differs from that of its likelihood {likelihood!r} (the largest gap at "
            f"input {(cols.start or 0) + i}: {float(own[i]):.4g} vs {float(log_lik[i]):.4g}). "
            "log_likelihood is that of 'obs', the density the model observes its targets "
            "with; posterior_predictive (probs, or loc and scale, and obs) is its "
            "likelihood's. Give the network the likelihood its forward observes (or observe "
            "through self.likelihood.observe(...)); if the difference is meant, filter this "
            "warning."
        )
