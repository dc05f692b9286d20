"""What :func:`pyrouq.fit` does differently under torch.distributed (a process group
initialised by torchrun or ``init_process_group``): each rank trains on its own shard of every
epoch, its gradients are averaged with the other ranks' after each backward pass (one bucketed
``all_reduce``; a second, small one gathers the rows a sparse gradient looked up), its
floating buffers (BatchNorm's running statistics) are averaged at the end of every epoch and
when a refused step stops every rank, and only rank 0 shows progress and writes checkpoints.

Per rank the loss is ``-(N / B_local) * sum_batch log p(y | x, w) + kl_weight * KL``; the
average over R ranks of its gradient is ``-(N / (R * B_local)) * sum over the global batch +
kl_weight * grad KL``: in expectation the gradient of the one-process ELBO on the global batch,
with the KL counted once.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyro
import torch
import torch.distributed as dist
from torch import nn

from pyrouq._util import ShardedOrder, example_sampler, len_or, warn_caller
from pyrouq._words import slip_hint
from pyrouq.infer._fit_inputs import unsharded_loader_message
from pyrouq.infer._rank_models import model_summary, models_differ


@dataclass(frozen=True)
class Group:
    """This process's place: rank ``rank`` of ``world`` (``world == 1``: no process group).
    ``device`` is where the backend reduces: a GPU for nccl, which takes no CPU tensor (None:
    where the tensor is; gloo reduces CPU and CUDA tensors alike)."""

    rank: int = 0
    world: int = 1
    device: torch.device | None = None

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def leader(self) -> bool:
        """Whether this rank prints, shows progress and writes checkpoints (rank 0)."""
        return self.rank == 0


def current(device: torch.device | None = None) -> Group:
    """The process group fit() runs in (a group of one without torch.distributed), for a model
    on ``device``. A group with no CPU backend (nccl, ``"cuda:nccl"``, or a bare
    ``init_process_group()`` on a GPU machine) reduces no CPU tensor: its collectives then run
    on the model's GPU (``device=None``, a model without tensors yet, whose guide makes them on
    the first batch: on the current GPU), and a model on the CPU is refused."""
    if not (dist.is_available() and dist.is_initialized()):
        return Group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if _reduces_cpu_tensors():
        return Group(rank, world)
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device is not None and device.type == "cuda":
        return Group(rank, world, device)
    if world > 1:
        raise ValueError(
            f"fit() runs on {world} ranks in a process group whose backend "
            f"({dist.get_backend()}) reduces GPU tensors only, but the model is on "
            f"{device or 'no device'}. Put it on this rank's GPU first "
            "(torch.cuda.set_device(local_rank); model.to('cuda')), or train on the CPU in a "
            "gloo group: init_process_group('gloo')."
        )
    return Group(rank, world)


def _reduces_cpu_tensors() -> bool:
    """Whether the default process group has a backend for CPU tensors (gloo, or a mixed
    ``"cpu:gloo,cuda:nccl"``), read off its backend configuration (its name alone would miss a
    bare ``init_process_group()``, named "undefined", which gets nccl alone on a GPU machine)."""
    config = getattr(dist, "get_backend_config", None)
    if config is None:  # older torch: the name tells
        return dist.get_backend() != "nccl"
    devices = {part.split(":")[0].strip() for part in str(config()).split(",")}
    return "cpu" in devices


def _all_reduce(t: torch.Tensor, group: Group, op: Any = None) -> torch.Tensor:
    """``t`` reduced over the ranks (summed, or by ``op``) on the backend's device, returned
    on ``t``'s device (``t`` itself is reduced in place when it is already there)."""
    work = t if group.device is None else t.to(group.device)
    dist.all_reduce(work, op=dist.ReduceOp.SUM if op is None else op)
    return work.to(t.device)


@contextlib.contextmanager
def shards(loader: Iterable, group: Group) -> Iterator[None]:
    """While inside, ``loader`` serves this rank's shard of every epoch: pyrouq's in-memory
    loaders shard themselves; a ``DataLoader`` needs a ``DistributedSampler`` of this group;
    any other loader is refused (it may give every rank the same data, or each rank data
    sharded beforehand: fit() cannot tell, and takes no such data). The ranks decide
    together (one ``all_reduce``): a loader refused on one rank only stops every rank, instead
    of leaving the others in the next collective (which would meet the refused rank's next
    one, and read its numbers). Without ranks, a ``DistributedSampler`` of several replicas
    (rank r's share, built with ``num_replicas=``) is warned of: the run would see that
    share alone."""
    if not group.active:
        _warn_of_a_lone_share(loader)
        yield
        return
    error = None
    sampler = None if isinstance(loader, ShardedOrder) else example_sampler(loader)
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        if (sampler.num_replicas, sampler.rank) != (group.world, group.rank):
            error = ValueError(
                f"train_loader's DistributedSampler is set for rank {sampler.rank} of "
                f"{sampler.num_replicas}, but this process is rank {group.rank} of "
                f"{group.world}. Build it with DistributedSampler(dataset) inside the process "
                "group (it reads both from torch.distributed)."
            )
    elif not isinstance(loader, ShardedOrder):
        error = ValueError(unsharded_loader_message(loader, group.world))
    raise_together(error, group, "its train_loader does not shard the data for its rank")
    if isinstance(loader, ShardedOrder):
        with loader.sharded(group.rank, group.world):
            yield
    else:
        yield


def _warn_of_a_lone_share(loader: Iterable) -> None:
    """Warn when fit() runs on one process with a loader whose ``DistributedSampler`` serves
    one rank's share of several: it would train on that share alone, silently."""
    sampler = example_sampler(loader)
    if isinstance(sampler, torch.utils.data.DistributedSampler) and sampler.num_replicas > 1:
        size = len(sampler.dataset)  # type: ignore[arg-type]
        warn_caller(
            f"fit(): train_loader's DistributedSampler serves rank {sampler.rank}'s share of "
            f"{sampler.num_replicas} ({len(sampler)} of {size} examples), "
            "but fit() runs on one process (no process group of several ranks is "
            "initialised): it trains on that share alone. Initialise the group on every rank "
            "first (torchrun, then dist.init_process_group), or pass DataLoader(dataset, "
            "batch_size, shuffle=True) to train on the whole set."
        )


@contextlib.contextmanager
def together(group: Group, why: str) -> Iterator[None]:
    """Run the block on every rank, then stop every rank when it raised on any (one
    ``all_reduce`` at its end, through :func:`raise_together`): the rank that failed raises
    its own error, the others one naming that rank. For fit()'s set-up, before its first
    collective, and every epoch's end (the checkpoint, the callbacks): a failure on one rank
    only (an argument, a checkpoint file, a first batch or a callback of its own) would
    otherwise leave the others waiting in the next collective. ``why`` says what failed, in
    the others' message. A ``KeyboardInterrupt`` in the block (a callback
    stopping the run) interrupts every rank: each raises one (fit()'s ``TrainingInterrupted``)."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as err:
        raise_together(err, group, why)
        raise  # raise_together has raised err; for the type checker
    raise_together(None, group, why)


def raise_together(error: BaseException | None, group: Group, why: str) -> None:
    """Raise ``error`` on this rank, and on every other rank an error naming a rank that
    failed, when any rank has one (one ``all_reduce``): a check that fails on one rank only
    would otherwise leave the others waiting in the next collective. ``why`` says what failed
    (in the others' message). A ``KeyboardInterrupt`` on a rank (and no error on any) is
    raised on every rank."""
    if not group.active:
        if error is not None:
            raise error
        return
    failed = float(group.rank) if isinstance(error, Exception) else -1.0
    stopped = 1.0 if isinstance(error, KeyboardInterrupt) else 0.0
    try:
        most, _ = extremes(torch.tensor([failed, stopped], dtype=torch.float64), group)
    except RuntimeError as err:  # gloo's "Timed out waiting 1800000ms for recv operation"
        if error is not None or "timed out" not in str(err).lower():
            raise error or err from None
        raise RuntimeError(
            f"fit() on rank {group.rank} of {group.world} waited for the other ranks in vain "
            f"({why.split(':')[0]}), until the process group's timeout: every rank of the "
            "group must call fit(), and it was called on this one alone, or another rank "
            "failed or is still busy elsewhere. To train on one process inside the job, "
            "destroy the group first (dist.destroy_process_group() on every rank); for a "
            "slow rank, pass a longer init_process_group(timeout=...)."
        ) from err
    if error is not None:
        raise error
    if most[0].item() >= 0:
        raise ValueError(
            f"fit() stopped on every rank: rank {int(most[0].item())} failed ({why}); its error "
            "says what to change."
        )
    if most[1].item() > 0:
        raise KeyboardInterrupt(f"another rank was interrupted ({why})")


def set_epoch(loader: Iterable, epoch: int) -> None:
    """Tell a ``DistributedSampler`` which epoch starts (its shuffling depends on it)."""
    sampler = example_sampler(loader)
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        sampler.set_epoch(epoch)


def average_gradients(
    params: list[torch.Tensor], group: Group, loss: torch.Tensor, interrupted: bool = False
) -> torch.Tensor:
    """Replace every gradient by its mean over the ranks: one ``all_reduce`` of all of them
    flattened into one buffer (a gradient missing on some ranks counts as zeros there; one
    missing on every rank stays missing, ``None``, as in one process, where the optimizer
    leaves such a parameter and its state alone, and as under DDP). A sparse gradient
    (``nn.Embedding(..., sparse=True)``) is averaged dense and handed back sparse, on every rank
    where it was sparse or missing (for an optimizer of sparse gradients, ``SGD``,
    ``SparseAdam``, ``Adagrad``), holding the rows some rank's gradient held (a second, small
    ``all_reduce``, only where some rank's gradient is sparse and none's dense, which holds them
    all): those its batch looked up, zeros included (a masked token's), as one process's
    gradient holds them: ``SparseAdam`` moves such a row on its moments.
    Returns a scalar flag reduced in the same buffer, so that every rank stops at the same step
    (a rank raising alone would leave the others waiting in the next collective): NaN when any
    rank's ``loss`` is not finite, else above 0 when any rank was ``interrupted`` (a Ctrl-C),
    else 0. The flag, not the loss, travels: in the gradients' dtype, it neither widens the
    buffer nor overflows a float16 sum. Without ranks, ``loss`` itself (finite exactly when its
    flag would be; ``interrupted`` is then fit()'s own to act on): nothing added per step."""
    loss = loss.detach()
    if not group.active or not params:
        return loss
    present = [p.grad is not None for p in params]
    sparse = [p.grad is not None and p.grad.is_sparse for p in params]
    looked_up: dict[int, torch.Tensor] = {}  # the rows each sparse gradient holds
    grads = []
    for i, p in enumerate(params):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:  # one buffer of one size on every rank: dense while averaged
            looked_up[i] = p.grad._indices()[0]
            p.grad = p.grad.to_dense()
        grads.append(p.grad)
    like, checked = grads[0], any(sparse) or not all(present)
    if not checked:  # no host value to send: no wait for the device
        dense = torch.ones(len(params), dtype=like.dtype, device=like.device)
        layouts = torch.zeros(len(params), dtype=like.dtype, device=like.device)
    else:  # which gradients are dense here, which sparse (neither: missing)
        here = [h and not s for h, s in zip(present, sparse, strict=True)]
        dense = torch.tensor(here, dtype=like.dtype).to(like.device)
        layouts = torch.tensor(sparse, dtype=like.dtype).to(like.device)
    flag = torch.where(torch.isfinite(loss), float(interrupted), math.nan).to(like).reshape(1)
    _average_in_place([*grads, dense, layouts, flag], group)
    if checked:  # which gradients no rank had, which to hand back sparse
        dense_on, sparse_on = dense.tolist(), layouts.tolist()  # alike on every rank
        # the rows to gather of a gradient sparse on some rank and dense on none: a rank that
        # skips this (every gradient dense there) leaves none, and the ranks here agree
        which = [i for i, n in enumerate(sparse_on) if n > 0 and dense_on[i] == 0]
        kept = _rows_held(params, which, looked_up, group) if which else {}
        for i, p in enumerate(params):
            if sparse_on[i] == 0 and dense_on[i] == 0:
                p.grad = None
            elif sparse[i] or (not present[i] and sparse_on[i] > 0):
                # not kept: dense on some rank, whose gradient holds every row
                rows = kept[i] if i in kept else torch.ones(p.shape[0], dtype=torch.bool)
                p.grad = _sparse_rows(p.grad, rows)  # type: ignore[arg-type]
    return flag[0]


def _rows_held(
    params: list[torch.Tensor],
    which: list[int],
    looked_up: dict[int, torch.Tensor],
    group: Group,
) -> dict[int, torch.Tensor]:
    """For each parameter ``params[i]``, ``i`` in ``which`` (those whose gradient is sparse on
    some rank and dense on none), whether some rank's gradient held each of its rows (one
    ``all_reduce`` of the maxima): a rank's sparse gradient holds the rows it lists, a missing
    one none."""
    marks = []
    for i in which:
        p = params[i]
        mark = torch.zeros(p.shape[0], device=p.device)
        if i in looked_up:
            mark[looked_up[i].to(p.device)] = 1.0
        marks.append(mark)
    flat = _all_reduce(torch.cat(marks), group, dist.ReduceOp.MAX)
    kept, offset = {}, 0
    for i, mark in zip(which, marks, strict=True):
        kept[i] = flat[offset : offset + mark.numel()] > 0
        offset += mark.numel()
    return kept


def _sparse_rows(dense: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``dense`` as a sparse gradient holding the rows marked in ``rows`` (zeros included).
    Its indices are valid by construction: no invariant check, said explicitly (left implicit,
    torch warns "Sparse invariant checks are implicitly disabled" on the first step)."""
    index = rows.nonzero().flatten().to(dense.device)
    values = dense.index_select(0, index)
    return torch.sparse_coo_tensor(
        index.unsqueeze(0), values, dense.shape, check_invariants=False
    ).coalesce()


def _average_in_place(tensors: list[torch.Tensor], group: Group) -> None:
    """Each of ``tensors`` replaced by its mean over the ranks: one ``all_reduce`` of all of
    them flattened into one buffer (float64 when they mix dtypes). Each rank's share is
    divided by the number of ranks before the sum (as DDP does): R float16 gradients of
    40,000 would sum to inf, past float16's 65,504, where their mean is finite."""
    dtype = tensors[0].dtype if len({t.dtype for t in tensors}) == 1 else torch.float64
    flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors]) / group.world
    flat = _all_reduce(flat, group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def extremes(values: torch.Tensor, group: Group) -> tuple[torch.Tensor, torch.Tensor]:
    """The elementwise maxima and minima of ``values`` (float64, 1-d) over the ranks, in one
    ``all_reduce``: the maximum of ``-values`` is minus their minimum."""
    both = _all_reduce(torch.cat([values, -values]), group, dist.ReduceOp.MAX)
    return both[: values.numel()], -both[values.numel() :]


def average_buffers(modules: list[nn.Module], group: Group) -> None:
    """Replace every floating buffer of ``modules`` (BatchNorm's running statistics) by its
    mean over the ranks: each rank has updated them on its own shard only, and every rank
    should end an epoch with the same model, whose statistics saw the whole epoch. A value
    that every rank holds alike (a prior's scale, a fixed noise) is kept as it is: the mean of
    R equal floats need not be that float (three 0.9s average to 0.89999992 in float32)."""
    if not group.active:
        return
    buffers = [b for m in modules for b in m.buffers() if b.is_floating_point()]
    if not buffers:
        return
    before = torch.cat([b.detach().reshape(-1).double() for b in buffers])
    _average_in_place(buffers, group)
    high, low = extremes(before, group)
    alike = high == low
    offset = 0
    for b in buffers:
        end = offset + b.numel()
        keep = alike[offset:end].view(b.shape)
        if bool(keep.any()):
            b.copy_(torch.where(keep, high[offset:end].view(b.shape).to(b.dtype), b))
        offset = end


def epoch_figures(values: torch.Tensor, seconds: float, group: Group) -> tuple[list[float], float]:
    """The figures of an epoch's record, alike on every rank: the mean of ``values`` (float64,
    1-d) over the ranks, and the longest of the ranks' ``seconds`` (wall times measured per
    rank, which a callback stopping on time would otherwise read differently on each rank),
    gathered in one ``all_gather``."""
    if not group.active:
        return values.tolist(), seconds
    table = _gather(torch.cat([values, torch.tensor([seconds], dtype=torch.float64)]), group)
    return (table[:, :-1].sum(0) / group.world).tolist(), float(table[:, -1].max())


def _gather(values: torch.Tensor, group: Group) -> torch.Tensor:
    """Every rank's ``values`` (1-d, of one size on every rank), a row per rank, on the CPU:
    one ``all_gather``."""
    work = values if group.device is None else values.to(group.device)
    rows = [torch.empty_like(work) for _ in range(group.world)]
    dist.all_gather(rows, work)
    return torch.stack(rows).cpu()


def _ranks_hold(ranks: list[int]) -> str:
    """``rank 2 holds`` or ``ranks 1, 3 hold``."""
    many = len(ranks) > 1
    return f"rank{'s' if many else ''} {', '.join(str(r) for r in ranks)} hold{'' if many else 's'}"


def check_same_arguments(
    values: dict[str, float], group: Group, fix: str, notes: dict[str, str] | None = None
) -> None:
    """Refuse to start when a number of ``values`` (the same names on every rank) differs
    between ranks, compared exactly; ``fix`` says what to do, after ``notes[name]`` for each
    name that differs and has a note on every rank (what the ranks' values stand for, where
    none was given: a note on some ranks only would tell of a cause that is not the one).
    Where every name that differs has such a note, the notes say what to do, not ``fix``."""
    if not group.active:
        return
    notes = notes or {}
    noted = [float(k in notes) for k in values]  # (1 on every rank: a minimum of 1)
    both = torch.tensor([*values.values(), *noted], dtype=torch.float64)
    high, low = (v.tolist() for v in extremes(both, group))
    differ = [k for k, h, lo in zip(values, high, low, strict=False) if h != lo]
    if differ:
        everywhere = {k for k, lo in zip(values, low[len(values) :], strict=True) if lo == 1}
        told = "".join(f" {notes[k]}" for k in differ if k in everywhere)
        if not everywhere.issuperset(differ):
            told += f" {fix}"
        raise ValueError(f"fit(): the arguments differ between ranks: {', '.join(differ)}.{told}")


def _code(dtype: torch.dtype) -> float:
    """A number per dtype, the same on every rank (float32 and float64 values compare equal,
    but their gradients would fill all_reduce buffers of two sizes)."""
    return float(zlib.crc32(str(dtype).encode()) % 2**24)


STORE = "param store: "
"""How :func:`check_same_everywhere`'s names begin for the parameters of Pyro's param store."""


def check_same_everywhere(named: list[tuple[str, torch.Tensor]], group: Group, what: str) -> None:
    """Refuse to start when ``named`` tensors differ between ranks (a model built with other
    arguments or another seed, a loader seeded differently): their sums and sums of squares
    are gathered from every rank (one ``all_gather`` of their number, one of them) and
    compared with rank 0's; the error names the first that differs and the ranks that hold
    other values."""
    if not group.active:
        return
    summary = torch.tensor(
        [
            [float(t.double().sum()), float(t.double().square().sum()), t.numel(), _code(t.dtype)]
            for _, t in named
        ]
        or [[0.0, 0.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    counts = _gather(torch.tensor([float(len(named))], dtype=torch.float64), group)[:, 0]
    if bool((counts != counts[0]).any()):
        other = [r for r in range(group.world) if counts[r] != counts[0]]
        raise ValueError(
            f"fit(): the {what} differ between ranks: {_ranks_hold(other)} "
            f"{', '.join(str(int(counts[r])) for r in other)} tensors, rank 0 holds "
            f"{int(counts[0])}. Build the same model, guide and loader on every rank."
        )
    table = _gather(summary.reshape(-1), group).view(group.world, *summary.shape)
    close = table[0].isfinite() & ((table - table[0]).abs() <= 1e-9 * (1 + table[0].abs()))
    alike = close | (table == table[0]) | (table.isnan() & table[0].isnan())  # inf: equal only
    differ = (~alike).any(-1)  # (rank, tensor)
    if bool(differ.any()):
        first = int(differ.any(0).nonzero()[0])
        name = named[first][0] if named else "?"
        other = differ[:, first].nonzero()[:, 0].tolist()
        stored = (
            " A parameter of Pyro's param store (pyro.param) takes its start value where it is "
            "created: when fit() first runs the guide or model, pass the same fit(seed=...) "
            "on every rank, which seeds them alike before that; if it was created before "
            "fit(), seed every rank alike before creating it (or pyro.clear_param_store()); "
            "if its start value is computed from the data, compute it from data every rank "
            "holds, not from the first batch of its own shard."
            if name.startswith(STORE)
            else ""
        )
        held, sizes = "other values than rank 0", table[:, first, 2].tolist()
        if any(sizes[r] != sizes[0] for r in other):  # a model of other sizes (not seeds)
            theirs = ", ".join(f"{int(sizes[r]):,}" for r in other)
            held = f"{theirs} values where rank 0 holds {int(sizes[0]):,}"
        elif bool((table[other, first, 3] != table[0, first, 3]).any()):
            here = f"{named[first][1].dtype} on rank {group.rank}"
            held = f"values of another dtype than rank 0 ({here})"
        raise ValueError(
            f"fit(): the {what} differ between ranks, first at {name!r}, where "
            f"{_ranks_hold(other)} {held}. Build them the same way on every rank (same "
            "arguments and seed: torch.manual_seed before building, a seeded loader such as "
            f"load_mnist(seed=0)); ranks then draw their own weights from there.{stored}"
        )


def check_same_model(
    model: Any, guide: Any, named: list[tuple[str, torch.Tensor]], group: Group
) -> None:
    """Refuse to start when the ranks' models differ: their parameters (``named``, see
    :func:`check_same_everywhere`), then what defines their objective beyond them, which no
    tensor holds (:func:`~pyrouq.infer._rank_models.model_summary`: the model's likelihood,
    priors, local reparameterisation and network, the guide's kind). Once, at set-up: one
    ``all_gather`` of a digest, and the descriptions themselves (to name what differs) only
    when they differ; every rank takes part, whether pyrouq can describe its model or not."""
    check_same_everywhere(named, group, "model and guide parameters")
    if not group.active:
        return
    text = model_summary(model, guide).encode()
    code = torch.tensor([float(zlib.crc32(text)), float(len(text))], dtype=torch.float64)
    codes = _gather(code, group)
    if bool((codes == codes[0]).all()):
        return
    padded = torch.zeros(int(codes[:, 1].max()), dtype=torch.uint8)
    padded[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    rows = _gather(padded, group)
    sizes = codes[:, 1].long().tolist()
    raise ValueError(
        models_differ([bytes(rows[r, : sizes[r]].tolist()).decode() for r in range(group.world)])
    )


def loader_state(loader: Iterable) -> list[tuple[str, torch.Tensor]]:
    """What decides the ranks' shards, compared across ranks: a pyrouq loader's generator
    state, a ``DistributedSampler``'s seed, shuffling and ``drop_last``."""
    sampler = example_sampler(loader)
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        values = [float(sampler.seed), float(sampler.shuffle), float(sampler.drop_last)]
        return [
            (
                "the DistributedSampler's seed, shuffle and drop_last",
                torch.tensor(values, dtype=torch.float64),
            )
        ]
    get = getattr(loader, "get_rng_state", None)
    if not callable(get) or not getattr(loader, "shuffle", True):  # unshuffled: no matter
        return []
    return [("the loader's shuffling generator", get().to(torch.float64))]


def check_same_steps(loader: Iterable, epochs: int, group: Group) -> None:
    """Refuse to start when the ranks would take different numbers of steps (their shards
    give different numbers of batches, or ``epochs`` differs): every step ends in a
    collective, and a rank with a step more would wait for the others forever or fail in it.
    Every rank takes part in the one ``all_reduce``, whether its loader has a length or not
    (a rank that skipped it would meet its peers' check with its first step's collective):
    ``epochs`` are compared always, the batches when every rank's loader has a length, and
    loaders with a length on some ranks only are refused (their steps cannot be compared, and
    the learning-rate schedule, planned over the length, would differ). Call it with the
    shards active."""
    if not group.active:
        return
    batches: int | None = len_or(loader, None)
    sized = batches is not None
    values = [epochs, float(sized), batches if sized else 0]
    most, fewest = extremes(torch.tensor(values, dtype=torch.float64), group)
    if bool(most[1] != fewest[1]):
        raise ValueError(
            f"fit() runs on {group.world} ranks, but train_loader has a length (len()) on some "
            f"ranks and none on others ({'a length' if sized else 'none'} on rank "
            f"{group.rank}): the ranks' numbers of steps cannot be compared before they run, "
            "and the learning-rate schedule, planned over the length, would differ between "
            "them. Build the same kind of loader on every rank."
        )
    if bool((most[[0, 2]] != fewest[[0, 2]]).any()):
        counts = (
            f"{int(fewest[2])} to {int(most[2])} batches per epoch ({batches} on this rank), "
            if sized
            else ""
        )
        raise ValueError(
            f"fit() runs on {group.world} ranks, but they would take different numbers of "
            f"steps: {counts}{int(fewest[0])} to {int(most[0])} epochs ({epochs} on this rank). "
            "Every step ends in a collective, so every rank must take the same number: pass "
            "the same epochs everywhere and give every rank as many batches (pyrouq's loaders "
            "pad their shards to one size; a DistributedSampler does too unless its dataset "
            "differs between ranks)."
        )


def draws_option(option: str, group: Group, seed: int | None) -> bool:
    """Whether ranks draw their own weights (True) or all the same ones (the check of
    gradient equivalence in the tests). fit() calls it inside its set-up's :func:`together`,
    so a refusal on one rank stops every rank."""
    if option not in ("independent", "identical"):
        hint = slip_hint(option, ("independent", "identical"))
        raise ValueError(
            f"Unknown distributed_draws {option!r}{hint}: expected 'independent' (each rank a "
            "particle, the default) or 'identical' (every rank the same draws)."
        )
    if option == "identical" and group.active and seed is None:
        raise ValueError(
            "distributed_draws='identical' needs seed=...: every rank must start its random "
            "generator from the same state."
        )
    return option == "independent"


def rank_seed(seed: int, group: Group, independent: bool) -> int:
    """The seed of this rank's generators: ``seed + rank`` with independent draws (its own
    stream), wrapped around into ``[0, 2**32 - 1]`` (numpy's range, which ``seed=2**32 - 1``
    on rank 1 would leave); ``seed`` itself on every rank with identical draws."""
    return (seed + group.rank) % 2**32 if independent else seed


def own_streams(group: Group) -> int | None:
    """Give every rank its own random stream, derived from the state the ranks share (rank r
    seeds ``offset + r``, with ``offset`` drawn from its generator): ranks whose generators
    run in lockstep (seeded alike for the same initial weights, or restored from one
    checkpoint) would otherwise draw the same weights, one particle instead of R. Returns a
    second number drawn after ``offset`` (None in one process), alike on such ranks: the seed
    that joins their streams again when fit() ends."""
    if not group.active:
        return None
    offset = int(torch.randint(0, 2**31 - 1, ()).item())
    rejoin = int(torch.randint(0, 2**31 - 1, ()).item())
    pyro.set_rng_seed(offset + group.rank)
    return rejoin
