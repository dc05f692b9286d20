"""The per-member copies of a normalisation layer that :func:`pyrouq.batchensemble` puts in
place of every normalisation layer with ``norms="per_member"`` (:class:`BatchEnsembleNorm`), and
the layer types it copies (:data:`NORM_LAYERS`)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from pyrouq import _engine
from pyrouq._memory import check_fits
from pyrouq._util import check_folded_batch
from pyrouq.nn._batchensemble_checks import _check_members

__all__ = ["NORM_LAYERS", "BatchEnsembleNorm"]


NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),  # torch >= 2.4
)
"""The normalisation layers ``batchensemble(..., norms="per_member")`` gives every member a
copy of (subclasses included)."""


class BatchEnsembleNorm(nn.Module):
    """One copy of a normalisation layer per member: member m's rows of a folded batch
    ``(M * B, ...)`` (member-major) go through ``norms[m]``, with its own affine parameters and,
    for BatchNorm, its own batch and running statistics.

    What :func:`pyrouq.batchensemble` puts in place of every normalisation layer with
    ``norms="per_member"``. Each copy starts as a copy of ``norm``; copies that would take more
    memory than ``norm``'s device has are refused before the first is made.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> layer = BatchEnsembleNorm(nn.BatchNorm1d(3), num_members=2)
    >>> x = torch.randn(2 * 4, 3)
    >>> out = layer(x)  # training mode: statistics of each member's 4 rows
    >>> torch.allclose(out[4:], nn.BatchNorm1d(3)(x[4:]), atol=1e-6)
    True
    """

    _is_member_norm = True

    def __init__(self, norm: nn.Module, num_members: int):
        super().__init__()
        if not isinstance(norm, NORM_LAYERS):
            raise TypeError(
                "BatchEnsembleNorm copies a normalisation layer "
                f"({', '.join(t.__name__.lstrip('_') for t in NORM_LAYERS)}), got "
                f"{type(norm).__name__}."
            )
        self.num_members = _check_members(num_members)
        tensors = [*norm.parameters(), *norm.buffers()]  # (copies keep their device, dtype)
        if tensors:  # (before copying it M times)
            what = f"BatchEnsembleNorm of {self.num_members} members"
            held = self.num_members * sum(t.numel() for t in tensors)
            check_fits(what, held, "Pass fewer members.", tensors[0].device, tensors[0].dtype)
        self.norms = nn.ModuleList(copy.deepcopy(norm) for _ in range(self.num_members))
        self._member: int | None = None  # set during the engine's member passes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Folded batch ``(M * B, ...)`` in and out; one member's ``(B, ...)`` during the
        engine's member passes."""
        if self._member is not None:
            return self.norms[self._member](x)  # type: ignore[no-any-return]
        folded = _engine.folded_batch()
        if getattr(self, "_sequence_first", False) and folded is not None:
            if x.dim() >= 3 and x.shape[1] == folded:  # (T, M * B, F) in a transformer layer
                return self._members_on_dim_0(x.transpose(0, 1), folded).transpose(0, 1)
        return self._members_on_dim_0(x, folded)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            norms = self.__dict__.get("_modules", {}).get("norms")
            if norms is None or not len(norms) or not hasattr(norms[0], name):
                raise
            kind = type(norms[0]).__name__
            raise AttributeError(
                f"{type(self).__name__} holds one {kind} per member (.norms[m]), not one "
                f"{kind}: it has no {name!r} of its own. A forward that reads a normalisation "
                f"layer's {name!r} (e.g. F.layer_norm(x, shape, self.norm.weight, "
                "self.norm.bias)) would skip the members' copies: call the layer instead "
                "(self.norm(x)), or convert with norms='shared' (one layer for all members)."
            ) from None

    def _members_on_dim_0(self, x: torch.Tensor, folded: int | None) -> torch.Tensor:
        members = self.num_members
        check_folded_batch(self, x, members, folded)
        return torch.cat([norm(c) for norm, c in zip(self.norms, x.chunk(members), strict=True)])

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}"
