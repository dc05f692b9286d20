"""What :func:`pyrouq.fit` compares across the ranks of a process group before its first step,
beside its arguments and the models' descriptions: the tensors every rank must hold alike, and
the point of a run each rank resumes from."""

from __future__ import annotations

import zlib
from typing import Any

import pyro
import torch
from torch import nn

from pyrouq.infer import _distributed
from pyrouq.infer._probe import Probe


def compared_parameters(
    model: nn.Module, guide: Any, probe: Probe
) -> list[tuple[str, torch.Tensor]]:
    """What every rank must hold alike before the first step, named: the model's and a guide
    module's state, and the parameters kept in Pyro's param store that the guide or a Pyro
    model of the user's own creates or reads (``pyro.param``: a guide written as a function, a
    model's own parameter), which no module holds. A converted model's latent sites' start
    values are left out when a guide module has a state of its own: they are its values to
    train from (``init_from`` may set them), and its own state is compared instead."""
    own_state = isinstance(guide, nn.Module) and bool(guide.state_dict())  # (not pyro.param)
    starts = {f"net.{s}" for s in getattr(model, "network_sites", dict)()} if own_state else set()
    named = [(f"model: {k}", v) for k, v in model.state_dict().items() if k not in starts]
    if isinstance(guide, nn.Module):
        named += [(f"guide: {k}", v) for k, v in guide.state_dict().items()]
    modules = [m for m in (model, guide) if isinstance(m, nn.Module)]
    seen = {id(p) for m in modules for p in m.parameters()}  # compared above
    store = pyro.get_param_store()
    for p in probe.created_params:
        if id(p) not in seen:
            seen.add(id(p))
            named.append((f"{_distributed.STORE}{store.param_name(p) or '?'}", p.detach()))
    return named


def check_same_resume(resume: Any, group: _distributed.Group) -> None:
    """Refuse to start when the ranks resume from different points of a run, or from
    different runs: ``resume_from`` given on some ranks only (rank 0 alone writes the
    checkpoints, so a script may pass it on rank 0 alone), or checkpoints of different steps
    (a stale copy on another machine's disk) or of other runs at the same step (told apart by
    :func:`_fingerprint`). Their models then differ, which
    :func:`~pyrouq.infer._distributed.check_same_model` would tell as models built otherwise;
    here the cause is named first (one ``all_reduce``). One checkpoint read on every rank,
    from paths that differ or not, passes."""
    if not group.active:
        return
    state = None if resume is None else resume.training
    if state is None:
        here, code = "no resume_from", -1.0
    else:
        steps, done, into = (int(state[k]) for k in ("steps", "epochs_done", "epoch_steps"))
        code = float(_fingerprint(state))
        if into:
            point = f"step {into} of epoch {done + 1}"
        else:  # saved at an epoch's end, or before the run's first step (interrupted there)
            point = f"the end of epoch {done}" if done else "before the first step"
        here = f"a checkpoint after {steps} steps ({point})"
    _distributed.check_same_arguments(
        {"resume_from": code},
        group,
        f"The ranks would resume from different points of a run, or from different runs "
        f"(rank {group.rank} has {here}), so their models differ. Pass the same resume_from on "
        "every rank, a checkpoint every rank can read (rank 0 alone writes checkpoint=: on "
        "several machines, a shared file system or a copy of that file on each), or none on "
        "any.",
    )


def _fingerprint(state: dict[str, Any]) -> int:
    """A CRC-32 of a checkpoint's point in its run (steps, epochs done, steps into the next)
    and of the random state it saved (torch's: another run's, or another step's, differs),
    alike for copies of one checkpoint."""
    point = repr([int(state[k]) for k in ("steps", "epochs_done", "epoch_steps")]).encode()
    rng = state.get("rng")
    torch_state = rng.get("torch") if isinstance(rng, dict) else None
    if isinstance(torch_state, torch.Tensor):
        point += torch_state.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return zlib.crc32(point)
