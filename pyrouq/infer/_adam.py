"""The default optimizer of :func:`pyrouq.fit`: Adam, the update of ``torch.optim.Adam`` (no
weight decay, no AMSGrad) with the same numbers, in a class that does not derive from
``torch.optim.Optimizer``.

Why not ``torch.optim.Adam`` itself: in torch 2.x every ``torch.optim.Optimizer`` imports
``torch._dynamo`` when it is built (``add_param_group`` is wrapped by ``torch._disable_dynamo``),
which costs about 1.9 s on the 2-core CPU machine of ``benchmarks/``, once per process: a tenth
of ``make demo``. Nothing else ``fit()`` and ``predict()`` do needs it. The state dict has
``torch.optim.Adam``'s layout, so a checkpoint written by either loads into the other, and a
user who wants torch's optimizers passes ``optim=`` to :func:`pyrouq.fit`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from pyrouq._engine import fusable_adam, fused_adam


class Adam:
    """Adam (Kingma & Ba 2015) on a list of tensors, step for step ``torch.optim.Adam``.

    ``m = lerp(m, g, 1 - beta1)``, ``v = beta2 v + (1 - beta2) g^2``, and
    ``p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``, in the order of
    operations of torch's multi-tensor implementation. On CPU the update runs in torch's fused
    kernel (one pass over each tensor and its state) where the gradient shares its parameter's
    memory layout: the values of ``torch.optim.Adam(fused=True)`` to the bit, which differ from
    ``torch.optim.Adam()``'s default path in the last bits of some entries (float rounding).
    A half-precision (float16, bfloat16) parameter keeps its moments in float32 and is updated
    in float32, the result rounded once into it (:func:`state_dtype` says why). A complex
    parameter is updated as its real and imaginary parts (``torch.view_as_real``), as torch's.

    Parameters
    ----------
    params : iterable of Tensor
        The tensors to optimise (one parameter group).
    lr : float, default 1e-3
    betas : (float, float), default (0.9, 0.999)
    eps : float, default 1e-8
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.defaults: dict[str, Any] = {"lr": lr, "betas": tuple(betas), "eps": eps}
        self.param_groups: list[dict[str, Any]] = [{"params": list(params), **self.defaults}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:  # before any state moves: the step is refused whole
                    raise RuntimeError(
                        f"pyrouq's Adam (fit()'s default optimizer) got a sparse gradient for "
                        f"a parameter of shape {tuple(p.shape)} (an nn.Embedding(..., "
                        "sparse=True)?), as torch.optim.Adam refuses them: build the layer "
                        "with sparse=False, or pass an optimizer that takes sparse and dense "
                        "gradients, optim=lambda p: torch.optim.Adagrad(p, lr=1e-2) (or SGD; "
                        "not SparseAdam, which refuses the dense ones of the other layers)."
                    )
                state = self.state.get(p)
                if state is None:
                    dtype, kept = state_dtype(p), torch.preserve_format
                    state = self.state[p] = {
                        "step": torch.zeros(()),
                        "exp_avg": torch.zeros_like(p, dtype=dtype, memory_format=kept),
                        "exp_avg_sq": torch.zeros_like(p, dtype=dtype, memory_format=kept),
                    }
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if not params:
                continue
            # a complex parameter is updated as its real and imaginary parts, as torch's Adam
            # does (view_as_real): its second moment is |g|^2 per part, not the complex g^2
            params, grads, exp_avgs, exp_avg_sqs = (
                [torch.view_as_real(t) if t.is_complex() else t for t in ts]
                for ts in (params, grads, exp_avgs, exp_avg_sqs)
            )
            torch._foreach_add_(steps, 1)
            fused = [
                fusable_adam(*four)
                for four in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)
            ]
            if any(fused):
                lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
                fused_adam(*_where(lists, fused, True), lr=lr, betas=(beta1, beta2), eps=eps)
                params, grads, exp_avgs, exp_avg_sqs, steps = _where(lists, fused, False)
            half = [p.dtype in _HALF for p in params]
            if any(half):  # in float32, then rounded once into the parameter
                lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
                narrow, narrow_grads, moments, moments_sq, counts = _where(lists, half, True)
                wide = [p.float() for p in narrow]
                wide_grads = [g.float() for g in narrow_grads]
                _update(wide, wide_grads, moments, moments_sq, counts, lr, (beta1, beta2), eps)
                torch._foreach_copy_(narrow, wide)
                params, grads, exp_avgs, exp_avg_sqs, steps = _where(lists, half, False)
            if params:
                _update(params, grads, exp_avgs, exp_avg_sqs, steps, lr, (beta1, beta2), eps)

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.Adam``'s layout: per-parameter state keyed by position, and the
        groups with ``params`` as positions."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed.update(_TORCH_FLAGS)
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {
            index[id(p)]: dict(s)
            for group in self.param_groups
            for p in group["params"]
            if (s := self.state.get(p)) is not None
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` (or ``torch.optim.Adam.state_dict``) returned for
        parameters of the same shapes, in the same order. A state of other shapes, or of an
        Adam with weight decay, AMSGrad or ``maximize``, is refused (``ValueError``) and this
        optimizer left as it was."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(group["params"])
            for saved, group in zip(groups, self.param_groups, strict=True)
        ):
            raise ValueError(
                "The optimizer state holds other parameter groups than this optimizer's "
                f"({[len(g['params']) for g in groups]} parameters per group, expected "
                f"{[len(g['params']) for g in self.param_groups]}); resume with the model and "
                "guide the state was saved with."
            )
        saved_state = state_dict["state"]
        for saved in groups:
            changing = ("weight_decay", "amsgrad", "maximize")  # the others: how, not what
            other = {
                k: saved[k] for k in changing if saved.get(k, _TORCH_FLAGS[k]) != _TORCH_FLAGS[k]
            }
            if other:
                raise ValueError(
                    f"The optimizer state was saved by an Adam with {other}, which this Adam "
                    "does not implement (no weight decay, AMSGrad nor maximize): its steps "
                    "would silently differ. Resume with the optimizer the state was saved with "
                    "(optim=...)."
                )
        state = {}
        for saved, group in zip(groups, self.param_groups, strict=True):
            for position, p in zip(saved["params"], group["params"], strict=True):
                s = saved_state.get(position)
                if s is None:
                    continue
                for key in ("exp_avg", "exp_avg_sq"):  # another shape would be read past its end
                    if tuple(s[key].shape) != tuple(p.shape):
                        raise ValueError(
                            f"The optimizer state's {key} at position {position} has shape "
                            f"{tuple(s[key].shape)}, but the parameter there has shape "
                            f"{tuple(p.shape)}; resume with the model and guide the state was "
                            "saved with (the same parameters, in the same order)."
                        )
                state[p] = {
                    "step": torch.tensor(float(s["step"])),
                    "exp_avg": s["exp_avg"].to(p.device, state_dtype(p)).clone(),
                    "exp_avg_sq": s["exp_avg_sq"].to(p.device, state_dtype(p)).clone(),
                }
        self.state = state  # set once every entry is checked: a refused state changes nothing
        for saved, group in zip(groups, self.param_groups, strict=True):
            for key in ("lr", "betas", "eps"):
                if key in saved:
                    group[key] = tuple(saved[key]) if key == "betas" else saved[key]


def _update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """One Adam update by torch's multi-tensor ops, whose ``steps`` already count this step."""
    beta1, beta2 = betas
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    counts = [float(t) for t in steps]  # CPU scalars: no device sync
    step_sizes = [-(lr / (1 - beta1**t)) for t in counts]
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, [(1 - beta2**t) ** 0.5 for t in counts])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, step_sizes)


_HALF = (torch.float16, torch.bfloat16)


def state_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype of a parameter's ``exp_avg`` and ``exp_avg_sq``: float32 for a half-precision
    parameter (its update is computed in float32 and rounded once into it), the parameter's
    own otherwise. In float16, eps = 1e-8 is 0 (an entry of zero gradient gets 0 / 0 = NaN, as
    in ``torch.optim.Adam()`` on float16; its fused kernel computes in float32) and
    ``(1 - beta2) g^2`` overflows past ``|g|`` = 8,093; in bfloat16, ``beta2 v`` rounds back to
    ``v`` (0.999 is within half a step of 1 there), so the second moment never decays."""
    return torch.float32 if param.dtype in _HALF else param.dtype


def _where(
    lists: tuple[list[torch.Tensor], ...], flags: list[bool], flag: bool
) -> list[list[torch.Tensor]]:
    """Each of ``lists`` cut to the positions whose entry in ``flags`` is ``flag``."""
    return [[t for t, f in zip(ts, flags, strict=True) if f == flag] for ts in lists]


#: The switches ``torch.optim.Adam`` records in each group, at the values this Adam implements,
#: so that its state dict loads into torch's optimizer too.
_TORCH_FLAGS: dict[str, Any] = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": None,
    "decoupled_weight_decay": False,
}
