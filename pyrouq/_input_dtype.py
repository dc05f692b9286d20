"""Which non-floating inputs a network takes (an embedding's integer indices) and what the
others are told: :func:`pyrouq._util.model_input`'s refusal."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["not_floating", "takes_indices"]


def _holds_embedding(module: Any) -> bool:
    if not isinstance(module, nn.Module):
        return False
    return any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in module.modules())


def _embedding_kinds(module: Any) -> str:
    """The embedding classes ``module`` holds and their verb, as the bool refusal names them:
    "nn.Embedding reads", "nn.EmbeddingBag reads", or both "read" (a subclass named by the
    torch class it extends)."""
    kinds = {
        "nn.EmbeddingBag" if isinstance(m, nn.EmbeddingBag) else "nn.Embedding"
        for m in module.modules()
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
    }
    return f"{' and '.join(sorted(kinds))} {'read' if len(kinds) > 1 else 'reads'}"


def takes_indices(x: torch.Tensor, module: Any) -> bool:
    """Whether the non-floating ``x`` is taken as it is: integer inputs to a network holding an
    ``nn.Embedding`` / ``nn.EmbeddingBag`` (its indices; not bool, nor complex)."""
    return not x.is_complex() and x.dtype != torch.bool and _holds_embedding(module)


def not_floating(x: torch.Tensor, module: Any, name: str) -> str:
    """Why ``name`` (a network, ``"predict()"``) refuses the non-floating ``x`` it got, and
    what to do: for a bool ``x`` to a network holding an embedding, a padding mask's fix; for
    other integers, the ways of a network that reads ids without an ``nn.Embedding``."""
    if x.dtype == torch.bool and _holds_embedding(module):
        return (
            f"{name} got a torch.bool tensor as its input x, but the network's "
            f"{_embedding_kinds(module)} integer indices (torch.long or torch.int). A padding "
            "mask? pyrouq runs the network on one input tensor: pass the token ids alone and "
            "compute the mask from them in forward (mask = x == pad_id). Bool tokens or flags "
            "that are the data itself: pass x.long()."
        )
    hint = " (raw 0-255 pixels?)" if x.dtype == torch.uint8 else ""
    ids = x.dtype not in (torch.uint8, torch.bool) and not x.is_complex()
    return (
        f"{name} expects floating-point inputs, got a {x.dtype} tensor{hint}. Scale and "
        "normalise images first, pyrouq.data.normalize(images), or load them with "
        "load_mnist() / load_fashion_mnist(), which do it; for inputs that are already "
        "features, x.float()."
    ) + (
        " Integer inputs are taken as they are by a network holding an nn.Embedding or "
        "nn.EmbeddingBag; one that reads ids otherwise (F.one_hot(x, V), F.embedding(x, "
        "table)) can hold its table as an nn.Embedding (F.one_hot(x, V).float() is "
        "nn.Embedding.from_pretrained(torch.eye(V))(x)), or take x.float() and call x.long() "
        "in its forward."
        if ids
        else ""
    )
