"""fit()'s first look at the data, before it builds the optimizer (:class:`Probe`): the number
of classes of a model that does not state it, the parameters a guide or a Pyro model of the
user's own creates on its first call, and that model's sites and N/B scale."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import nn

from pyrouq._batchnorm import ONE_VALUE_PER_CHANNEL, one_value_in_training
from pyrouq._distribution_parts import innermost_distribution
from pyrouq._engine import LayersNamed
from pyrouq._forwards import own_forward
from pyrouq._input_cast import (
    function_guide_refusal,
    latent_dtype_refusal,
    latent_sites_refusal,
    refuse_guide_of_another_dtype,
    stored_dtype,
    typed_by,
)
from pyrouq._mismatch import input_mismatch, inputs_fix, restated
from pyrouq._own_models import (
    GuideMismatch,
    check_traces_match,
    name_of,
    observes_something,
    unobserved_sites,
)
from pyrouq._param_store import forget_params_since
from pyrouq._seeded import derived_seed, seed_apart
from pyrouq._util import (
    ShardedOrder,
    global_streams_kept,
    has_latent_sites,
    model_input,
    modes,
    module_device,
    restore_modes,
    warn_caller,
)
from pyrouq._wrappers import uncompiled, unwrapped
from pyrouq.infer._adopted import adopted, adoption_refusal, adoption_warning, module_params
from pyrouq.infer._elbo_checks import own_model
from pyrouq.infer._own_targets import OwnTargets
from pyrouq.infer._training import (
    loader_rng_state,
    serves_dataset_as_is,
    set_loader_rng_state,
    unpack_batch,
)
from pyrouq.infer.guide import MeanFieldGuide
from pyrouq.likelihoods import Categorical, Gaussian, likelihood_of


class Probe:
    """What fit learns from a couple of training examples (a Pyro model of the user's own:
    from the loader's first batch) before it builds the optimizer: the number of classes of
    a model that does not state it (for the label checks), and the parameters created on the
    first call, by a guide (Pyro's autoguides), by a Pyro model of the user's own
    (``pyro.param`` in its forward) or by the network of a converted model (``pyro.param`` in
    a forward of its modules: named in ``network_params``); such a model's sites are checked
    against the guide's.

    The look runs the network forward on those examples, and the guide on them, in evaluation
    mode (the guide's too where it is a module; both modes put back after), so what a forward
    changes (a count of calls, an initialisation on the first call) happens there. It runs in a
    fork of the global random streams seeded apart (:func:`~pyrouq._seeded.derived_seed`: from
    ``seed``, fit()'s, else from torch's stream, drawing nothing from it): the run draws what
    it would without the look, and the look's draws (an autoguide's or a lazy layer's initial
    values) are none of the run's."""

    def __init__(self, model: nn.Module, guide: Any, loader: Iterable, seed: int | None = None):
        self.likelihood: Any = likelihood_of(model) or Categorical()
        self.num_classes: int | None = getattr(model, "num_classes", None)
        self.created_params: list[torch.Tensor] = []
        self.network_params: list[str] = []
        categorical = isinstance(self.likelihood, Categorical)
        needs_classes = self.num_classes is None or not categorical  # D of a regression too
        lazy_guide = guide is not None and not isinstance(guide, MeanFieldGuide)
        # a lazy layer's parameters are made now, before the optimizer is built and the ranks
        # of a process group compare them (made in the first step, after each rank's own seed,
        # they would start apart)
        lazy_model = any(nn.parameter.is_lazy(t) for t in (*model.parameters(), *model.buffers()))
        # a Pyro model of the user's own: does it scale its likelihood by N/B?
        foreign = own_pyro_model(model, guide)
        if foreign:
            _check_called_with_x_y(model)
        # a converted network whose forward, or a module's in it, is the user's own may
        # create pyro.params
        own = own_model(model)
        own_network = own is not None and (_network_of_its_own(own) or own_forward(own))
        run_network = needs_classes or lazy_model or own_network
        if not (run_network or lazy_guide or foreign):
            return
        # the passes draw nothing from the run's streams (a dropout kept on at evaluation, a
        # dataset's augmentations): training draws as it would without them; what they draw
        # (a guide's, a lazy layer's initial values) comes from streams of their own, not
        # from the numbers the first steps then draw again (seeded alike on every rank)
        apart = derived_seed(seed, "pyrouq.fit: the set-up pass")
        with global_streams_kept(module_device(model, guide)):
            self._look(model, guide, loader, needs_classes, foreign, run_network, apart)

    def _look(
        self,
        model: nn.Module,
        guide: Any,
        loader: Iterable,
        needs_classes: bool,
        foreign: bool,
        run_network: bool,
        apart: int,
    ) -> None:
        """Read the first examples (``foreign``: a Pyro model of the user's own's first batch)
        and run the network on them (``run_network``), the guide, and the model replayed on it
        where that is needed, with the random streams seeded with ``apart`` (the examples read
        from the run's); ``needs_classes``: the number of classes is read off the output."""
        lazy_guide = guide is not None and not isinstance(guide, MeanFieldGuide)
        # a user's model may run on whole batches only (pyro.plate("data", N) over a batch of
        # all N): it is probed on the loader's first batch, the others on two examples
        batch = _first_batch(loader) if foreign else _first_examples(loader)
        if batch is None:
            return
        device = module_device(model, guide)
        seed_apart(device, apart)
        x, y = (t.to(device) if device is not None else t for t in batch)
        if foreign and likelihood_of(model) is None and y.dtype.is_floating_point:
            self.likelihood = OwnTargets()
        x = model_input(x, typed_by(model, guide), "fit()")  # (a guide holding parameters)
        held = {id(p) for p in module_params(model, guide)}
        stored = {id(p) for _, p in pyro.get_param_store().named_parameters()}
        names = set(pyro.get_param_store().keys())
        was = modes(model) + modes(guide)  # (a guide's BatchNorm keeps its statistics too)
        model.eval()
        if isinstance(guide, nn.Module):
            guide.eval()
        try:
            with torch.no_grad(), pyro.validation_enabled(False):
                if run_network:
                    try:
                        with poutine.trace(param_only=True) as network:
                            size = _output_size(model, x, y, self.likelihood, foreign)
                            own = own_model(model)
                            if own is not None and own_forward(own):  # its pyro.params
                                own(x, y)
                    except (RuntimeError, ValueError) as err:  # torch's, e.g. a shape mismatch
                        if not input_mismatch(err):  # the network's own, a CUDA error, ...
                            raise
                        fix = inputs_fix(err, x.dtype, "the loader's inputs")
                        raise ValueError(
                            f"fit(): {name_of(model)} failed on the first examples of "
                            f"train_loader (x of shape {tuple(x.shape)}, dtype {x.dtype}): "
                            f"{restated(err, fix)}; nothing was trained."
                        ) from err
                    if needs_classes:
                        self.num_classes = size
                    if is_pyrouq_model(model):
                        self._network_params(network.trace, held)
            if foreign:
                _check_scaled(model, x, y)
            if lazy_guide:
                with poutine.trace(param_only=True) as capture, poutine.block(hide=["obs"]):
                    try:
                        guide(x, y)
                    except ValueError as err:  # an autoguide runs the model on its first call
                        if not _plate_hint(err, model, x):
                            raise
                        raise ValueError(
                            f"fit(): the guide of {name_of(model)} failed on the first "
                            f"batch of train_loader:{_plate_hint(err, model, x)}\n{err}"
                        ) from err
                    except RuntimeError as err:  # inputs of another dtype than its priors'
                        other = latent_dtype_refusal(err, model, guide, x, y) if foreign else None
                        if other is None:  # parameters of one dtype, draws of another
                            mixed = latent_sites_refusal(err, model, guide, x, y, {}, "fit()")
                            if mixed is None:
                                raise
                            raise TypeError(mixed) from err
                        x = _resumed_input(model, guide, x, y, other, err)
                self.created_params += _unconstrained(capture.trace)
                refuse_guide_of_another_dtype(model, guide, x, y)  # (a model cast since)
            if foreign:
                params, trace = _own_model_params(model, guide, x, y, names)
                self.created_params += params
                self._read_targets(model, trace, y)
            elif guide is not None and adopted(model, guide, held, stored)[0]:
                with torch.no_grad(), pyro.validation_enabled(False):
                    _replayed_check(model, guide, x, y)
        except Exception as err:  # a guide (or model) that took another's parameters
            if x.shape[0] == 1 and str(err).startswith(ONE_VALUE_PER_CHANNEL):  # as the step
                raise one_value_in_training(x, 1, 1) from None  # would say
            refusal = adoption_refusal(err, model, guide, held, stored)
            if refusal is None:  # (none taken, or an error taking them cannot cause)
                raise
            raise refusal from err
        finally:
            restore_modes(was)
        taken, takers = adopted(model, guide, held, stored)
        if taken:
            warn_caller(adoption_warning(taken, takers))

    def _network_params(self, trace: Any, held: set[int]) -> None:
        """The ``pyro.param`` sites a converted network created as it ran (``trace``), that no
        module holds (``held``: a ``PyroParam`` attribute's is its module's parameter): they
        are trained with the rest, as Pyro's SVI trains them."""
        for name, tensor in zip(trace.nodes, _unconstrained(trace), strict=True):
            if id(tensor) not in held and tensor.requires_grad:
                self.network_params.append(name)
                self.created_params.append(tensor)

    def _read_targets(self, model: nn.Module, trace: Any, y: torch.Tensor) -> None:
        """What the model's ``"obs"`` site tells of the targets where it observes them as
        given (``obs=y``): a ``Categorical``'s number of classes, so that labels outside them
        are refused with the fix rather than by torch's index error, and real-valued ones
        the discrete support they must keep (:class:`OwnTargets`)."""
        site = trace.nodes.get("obs")
        if site is None or site["type"] != "sample" or not site["is_observed"]:
            return
        value = site["value"]
        if not torch.is_tensor(value) or value.dtype != y.dtype or value.shape != y.shape:
            return
        if not torch.equal(value, y) or site["mask"] is not None:  # (something else than y,
            return  # or some of it masked: poutine.mask)
        if isinstance(self.likelihood, OwnTargets):
            self.likelihood = OwnTargets(site["fn"], f"{name_of(model)}'s 'obs' site")
            return
        family = innermost_distribution(site["fn"])
        if isinstance(family, torch.distributions.Categorical) and self.num_classes is None:
            self.num_classes = int(family.logits.shape[-1])


def _network_of_its_own(model: Any) -> bool:
    """Whether a converted model's network holds a module of a class that is neither torch's
    nor pyrouq's (a user's own, whose forward may call ``pyro.param``)."""
    net = getattr(uncompiled(model), "net", None)  # (torch.compile's wrapper taken off)
    libraries = ("torch", "pyrouq")
    return isinstance(net, nn.Module) and any(
        type(m).__module__.partition(".")[0] not in libraries for m in net.modules()
    )


def _replayed_check(model: nn.Module, guide: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    """Run ``model(x, y)`` replayed on ``guide(x, y)`` and check their sites (a guide that
    took another model's parameters from the store draws them in those shapes)."""
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(model).get_trace(x, y)  # (its own draws: shapes to compare)
    for name, site in model_trace.nodes.items():
        drawn: Any = guide_trace.nodes.get(name, {}).get("value")
        if site["type"] != "sample" or site["is_observed"] or drawn is None:
            continue
        value: Any = site["value"]
        if drawn.shape != value.shape:
            problem = (
                f"the guide draws site {name!r} of shape {tuple(drawn.shape)}, the model "
                f"samples it of shape {tuple(value.shape)}"
            )
            raise GuideMismatch(problem, problem)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    check_traces_match(model_trace, guide_trace, "fit()", model)


def _check_called_with_x_y(model: nn.Module) -> None:
    """Refuse a Pyro model of the user's own whose ``forward`` cannot be called as fit() and
    Pyro's SVI call it, ``model(x, y)``: a parameter named ``y`` elsewhere than second (``y``
    would fill the second, e.g. ``lengths``, and the likelihood go unobserved: Pyro then
    blames a discrete latent site), a third one without a default, or no second one (a
    ``forward(x)`` of the inputs alone: Python's bare "takes 2 positional arguments but 3 were
    given")."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a builtin or C forward: nothing to read
        return
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = signature.parameters.values()
    positional = [p for p in params if p.kind in kinds]
    names = [p.name for p in positional]
    needed = [p.name for p in positional[2:] if p.default is inspect.Parameter.empty]
    no_second = len(names) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params)
    if needed or no_second or ("y" in names and names.index("y") != 1):
        if needed:
            why = f"it also needs {', '.join(map(repr, needed))}"
        elif no_second and "y" in signature.parameters:
            why = "its y is keyword-only, and fit() passes it second, by position"
        elif no_second:
            why = "it takes no targets (a model of the inputs alone: take y and leave it unused)"
        else:
            why = f"y would fill its parameter {names[1]!r}"
        raise TypeError(
            f"fit() calls {name_of(model)}(x, y), as Pyro's SVI calls a model, but its "
            f"forward{signature} takes them otherwise: {why}. Write forward(x, y=None) (the "
            "inputs, then the targets), and give any other parameter a default, or set what "
            "it needs as an attribute of the model before fit()."
        )


def _unconstrained(trace: Any) -> list[torch.Tensor]:
    """The tensors an optimizer updates of the ``pyro.param`` sites of a param-only trace: a
    param store's (or a ``PyroParam``'s) unconstrained tensor, else, under
    ``pyro.settings.set(module_local_params=True)``, a module's ``nn.Parameter`` itself (its
    site's value, which has no ``unconstrained``)."""
    tensors = []
    for site in trace.nodes.values():
        value = site["value"]
        unconstrained = getattr(value, "unconstrained", None)
        tensors.append(unconstrained() if callable(unconstrained) else value)
    return tensors


def _resumed_input(
    model: nn.Module, guide: Any, x: torch.Tensor, y: torch.Tensor, refusal: str, err: Exception
) -> torch.Tensor:
    """``x`` in the dtype of the values loaded into Pyro's param store to resume a run
    (:func:`~pyrouq._input_cast.stored_dtype`), where an autoguide's first call failed on
    ``x`` as it came (``err``) and runs on those: the dtype the guide takes from them, and the
    steps' inputs then. Only then: another guide's entries under its name (another model's
    AutoNormal) leave inputs that run as they are. Else the ``refusal`` (a TypeError)."""
    resumed = stored_dtype(guide)
    if resumed is None or resumed == x.dtype:
        raise TypeError(refusal) from err
    try:
        guide(x.to(resumed), y)
    except RuntimeError:
        raise TypeError(refusal) from err
    _check_scaled(model, x.to(resumed), y)  # (on x as it came, the model failed: unchecked)
    return x.to(resumed)


def _own_model_params(
    model: nn.Module, guide: Any, x: torch.Tensor, y: torch.Tensor, names: set[str]
) -> tuple[list, Any]:
    """The parameters a Pyro model of the user's own creates with ``pyro.param`` as it runs
    (trained with the rest, as Pyro's SVI does), once its sites are checked against the
    guide's: a latent site the guide lacks or gives another shape is refused here; and the
    model's trace. ``names``: the param store's entries before the set-up pass (a guide
    function's refused in the dtype of its draws leaves none it created)."""
    guide_trace = None
    try:
        guide_trace = poutine.trace(guide).get_trace(x, y) if guide is not None else None
        run = model if guide_trace is None else poutine.replay(model, trace=guide_trace)
        with poutine.trace(param_only=True) as capture:
            model_trace = poutine.trace(run).get_trace(x, y)
    except Exception as err:
        other = function_guide_refusal(err, model, guide, x, guide_trace)
        if other is None:  # a model's parameters of one dtype, the guide's draws of another
            other = latent_sites_refusal(err, model, guide, x, y, {}, "fit()")
        if other is not None:  # a guide written as a function, drawing in another dtype
            forget_params_since(names)
            raise TypeError(other) from err
        raise ValueError(
            f"fit(): {name_of(model)} and its guide failed on the first batch of "
            f"train_loader (x of shape {tuple(x.shape)}), run as model(x, y) replayed on "
            f"guide(x, y) to check their sites: {type(err).__name__}: "
            f"{' '.join(str(err).split())}.{_plate_hint(err, model, x)} Nothing was trained."
        ) from err
    if guide_trace is not None:
        check_traces_match(model_trace, guide_trace, "fit()", model)
    latent = unobserved_sites(model_trace)
    if not observes_something(model_trace):
        raise ValueError(
            f"fit(): {name_of(model)} observes nothing: run as model(x, y) on the first "
            "batch of train_loader, it has no observed site, so the loss would hold no "
            "likelihood of the targets and training would only pull the guide to the prior. "
            "Observe them, e.g. pyro.sample('obs', dist.Categorical(logits=logits), obs=y) "
            "inside pyro.plate('data', self.num_data, subsample_size=len(x)). Nothing was "
            "trained."
        )
    if guide_trace is None and latent:
        raise ValueError(
            f"fit(): {name_of(model)} samples the latent site(s) {latent[:5]} but guide "
            "is None: each step would draw them from their priors, with nothing to learn them. "
            "Pass a guide, e.g. pyro.infer.autoguide.AutoNormal(model)."
        )
    return _unconstrained(capture.trace), model_trace


def _plate_hint(err: Exception, model: nn.Module, x: torch.Tensor) -> str:
    """The way out of Pyro's "Shape mismatch inside plate" where a model of the user's own
    puts a batch in a plate of its ``num_data`` points; "" for other errors."""
    num_data = getattr(model, "num_data", None)
    sizes = re.search(r"Shape mismatch inside plate.*? dim -\d+, (\d+) vs (\d+)", str(err))
    if sizes is None or num_data in (None, x.shape[0]):
        return ""
    if {int(sizes[1]), int(sizes[2])} != {num_data, x.shape[0]}:  # another plate's mismatch
        return ""
    return (
        f" A plate of the N = {num_data} training points holds a batch of {x.shape[0]}: "
        "observe it inside pyro.plate('data', self.num_data, subsample_size=len(x)) (fit() "
        "sets model.num_data; the likelihood is then scaled by N/B)."
    )


def _check_scaled(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Warn when a Pyro model of the user's own observes a minibatch without the factor N/B
    (``pyro.plate("data", B)`` instead of ``pyro.plate("data", N, subsample_size=B)``): its
    likelihood then counts as if the batch were the whole data set, and the KL outweighs it
    N/B times. ``x, y``: the loader's first batch (one of the whole data set needs none)."""
    num_data = getattr(model, "num_data", None)
    if not num_data or num_data <= x.shape[0]:
        return
    try:
        trace = poutine.trace(model).get_trace(x, y)
    except Exception:  # the model's own errors surface, with their context, in the first step
        return
    observed = [
        site
        for site in trace.nodes.values()
        if site["type"] == "sample" and site["is_observed"] and not site_is_subsample(site)
    ]
    if observed and all(_is_one(site["scale"]) for site in observed):
        warn_caller(
            f"fit(): {name_of(model)} observes its targets without the factor N/B: on "
            f"{x.shape[0]} of N = {num_data} examples the likelihood's scale is 1, so every "
            "minibatch counts as the whole data set and the KL outweighs it N/B times. Observe "
            "them inside pyro.plate('data', self.num_data, subsample_size=len(x)) (fit() sets "
            "model.num_data), or under poutine.scale(scale=self.num_data / len(x))."
        )


def _is_one(scale: Any) -> bool:
    """Whether a site's scale is 1 (a number, or a tensor of per-example weights)."""
    if torch.is_tensor(scale):
        return bool((scale == 1).all())
    return float(scale) == 1.0


def _first_examples(loader: Iterable) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two training examples ``(x, y)`` as a batch, read without disturbing the loader: off
    its dataset when its batches are that dataset's items as they are, else off its first
    batch."""
    dataset = getattr(loader, "dataset", None) if _batches_its_dataset(loader) else None
    try:
        items = [dataset[i] for i in range(min(2, len(dataset)))]  # type: ignore[index, arg-type]
        if not all(isinstance(item, (tuple, list)) and len(item) == 2 for item in items):
            raise TypeError  # (a tensor's rows, say: no (x, y) items; the first batch tells)
        xs = torch.stack([torch.as_tensor(item[0]) for item in items])
        ys = torch.stack([torch.as_tensor(item[1]) for item in items])
        return xs, ys
    except Exception:
        pass
    batch = _first_batch(loader)
    if batch is None:
        return None
    x, y = batch
    if x.dim() == 0 or y.dim() == 0:  # an unbatched example: training's own checks say so
        return None
    return x[:2], y[:2]


def _batches_its_dataset(loader: Iterable) -> bool:
    """Whether ``loader``'s batches are its ``.dataset``'s items stacked as they are: a torch
    ``DataLoader`` that :func:`serves_dataset_as_is` passes, or one of pyrouq's in-memory
    loaders. Another object with a ``.dataset`` (a wrapper that flattens, normalises or moves
    a DataLoader's batches) may serve something else than its dataset's items: fit() then
    probes its first batch."""
    known = isinstance(loader, (torch.utils.data.DataLoader, ShardedOrder))
    return known and serves_dataset_as_is(loader)


def _first_batch(loader: Iterable) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The loader's first batch ``(x, y)``, read without disturbing the loader: the global
    random states put back (a shuffling DataLoader without a generator draws from torch's, a
    dataset's augmentations from any), and the own random state of the loader and of the
    loaders a wrapper holds as attributes (a pyrouq loader's generator, a DataLoader's)."""
    inner = vars(loader).values() if hasattr(loader, "__dict__") else ()
    owners: list[Any] = [
        loader,
        *(v for v in inner if isinstance(v, (torch.utils.data.DataLoader, ShardedOrder))),
    ]
    states = [(owner, state) for owner in owners if (state := loader_rng_state(owner)) is not None]
    try:
        with global_streams_kept():  # numpy's and Python's too: a dataset's augmentations
            batch = next(iter(loader))
    except (StopIteration, TypeError, ValueError):
        return None
    finally:
        for owner, state in states:
            set_loader_rng_state(owner, state)
    x, y = unpack_batch(batch, 1, 1)  # what the first step would refuse, refused now
    return x, y


def own_pyro_model(model: Any, guide: Any) -> bool:
    """Whether ``model`` is a Pyro model of the user's own: a ``PyroModule``, or an
    ``nn.Module`` given with a guide (as in Pyro's VAE tutorial), not one of pyrouq's (nor one
    of pyrouq's wrapped by ``torch.compile``, ``DistributedDataParallel`` or
    ``nn.DataParallel``, however they nest: :func:`~pyrouq._wrappers.unwrapped`)."""
    if is_pyrouq_model(unwrapped(model)):
        return False
    return isinstance(model, pyro.nn.PyroModule) or (
        guide is not None and isinstance(model, nn.Module)
    )


def is_pyrouq_model(model: Any) -> bool:
    """Whether ``model`` is a converted pyrouq model, perhaps compiled (``torch.compile``'s
    wrapper)."""
    return own_model(model) is not None


def _output_size(
    model: Any, x: torch.Tensor, y: torch.Tensor, likelihood: Any, own: bool
) -> int | None:
    """The number of outputs D of ``model`` on ``x`` (classes, or regression targets), after
    the likelihood has seen the outputs (it sizes a learned noise scale; a Gaussian's noise
    prior of another shape is left to the targets' check where the targets ``y`` do not fit
    D either, as they are checked next, in full)."""
    run = getattr(model, "outputs", None)
    if callable(run) and has_latent_sites(model):
        out = run(x, model.template())
    elif callable(run):
        out = run(x)
    elif not own and not isinstance(model, pyro.nn.PyroModule):
        with LayersNamed(uncompiled(model), x, plain=True):  # (as predict() names them)
            out = model(x)
    else:
        return None
    if not torch.is_tensor(out) or out.dim() < 2:
        return None
    likelihood.prepare(out)
    if isinstance(likelihood, Gaussian):
        return likelihood.num_outputs(out, targets=y)
    size = getattr(likelihood, "num_outputs", None)
    return int(size(out)) if callable(size) else int(out.shape[-1])
