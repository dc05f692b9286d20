"""The particle-by-particle gradient route of :class:`~pyrouq.KLWeightedELBO`.

With a :class:`~pyrouq.MeanFieldGuide`, a model sampling weights and several particles,
:meth:`~pyrouq.KLWeightedELBO.terms_and_grads` draws every particle's weights first, then runs
each particle's NLL forward and backward into its weight draw before the next particle runs,
and back-propagates the draws into the guide with the KL term: one particle's activations are
held at a time instead of all of them, and the gradients are those of the loss of all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pyrouq._param_store import register_point_estimates
from pyrouq._util import AsItCame
from pyrouq.infer._site_kl import float32_zero

if TYPE_CHECKING:
    from pyrouq.convert import BayesianNetwork
    from pyrouq.infer.elbo import ELBOTerms, KLWeightedELBO
    from pyrouq.infer.guide import MeanFieldGuide

__all__ = ["particle_by_particle"]


def particle_by_particle(
    elbo: KLWeightedELBO, model: BayesianNetwork, guide: MeanFieldGuide, x: Tensor, y: Tensor
) -> ELBOTerms:
    """:meth:`~pyrouq.KLWeightedELBO.terms_and_grads` one particle at a time (see there)."""
    # (lazy: elbo imports this module)
    from pyrouq.infer.elbo import ELBOTerms, observed_nll

    loc, scale, lazy = elbo._guide_moments(model, guide)
    count = elbo.num_particles
    draws, stacked, kl = elbo._draws_and_kl(model, loc, scale, guide.positive)
    nll = float32_zero(x.device)
    outputs: list[Tensor] = []
    output_grads: list[Tensor] = []
    particle_grads: dict[str, list[tuple[Tensor, Tensor | None]]] = {}
    firsts = []
    inputs = AsItCame(x, len(draws))  # as it came to every particle
    for weights in draws:
        # (the network runs with copies of the leaves, _engine.run_draws': a positive site's
        # draw, exp's output that exp's backward reads, stays as drawn should it change them)
        leaves = {s: w.detach().requires_grad_() for s, w in weights.items()}
        out = model.outputs(inputs(), leaves)
        particle_nll = observed_nll(model, out, y, leaves)
        (particle_nll / count).backward()  # frees this particle's activations
        nll = nll + particle_nll.detach()
        firsts.append(out.detach())
        for site, value in weights.items():
            grad = leaves[site].grad
            if stacked is not None:
                particle_grads.setdefault(site, []).append((value, grad))
            elif grad is not None:
                outputs.append(value)
                output_grads.append(grad)
    # vectorised, the stack takes its particles' gradients (zeros where none), not unbind's
    # views of it: the views refuse to back-propagate once the network changed a draw in
    # place, and a Monte Carlo KL's gradient meets the NLL's at the stack, as in elbo.terms()
    for site, pairs in particle_grads.items():
        whole = (stacked or {})[site]
        if whole.requires_grad and any(g is not None for _, g in pairs):
            outputs.append(whole)
            output_grads.append(
                torch.stack([torch.zeros_like(w) if g is None else g for w, g in pairs])
            )
    weighted_kl = elbo._weighted(kl)
    roots = [  # (none with a frozen guide: the NLL reached the model's own parameters)
        (t, g)
        for t, g in zip([weighted_kl, *outputs], [torch.ones_like(kl), *output_grads], strict=True)
        if t.requires_grad
    ]
    if roots:
        torch.autograd.backward([t for t, _ in roots], [g for _, g in roots])
    nll_t = nll / count
    if lazy:  # a learned noise scale, sized by the run
        register_point_estimates(model)
    return ELBOTerms(
        loss=(nll_t + weighted_kl).detach(),
        nll=nll_t,
        kl=kl.detach(),
        outputs=torch.stack(firsts) if elbo.vectorize_particles else firsts[0],
    )
