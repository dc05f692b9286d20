"""The call dynamo skips, for :func:`pyrouq._untraced.untraced`: imported only while dynamo
traces (``torch.compiler.disable`` imports torch._dynamo, some 2 s)."""

from __future__ import annotations

from typing import Any

import torch


@torch.compiler.disable
def call(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, run eagerly with everything it calls, where dynamo traces the caller."""
    return fn(*args)
