"""What ``pyrouq fit`` trains: the built-in models with their measured recipes, a user's
``package.module:factory`` and the ``--method`` that converts its network."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from pyrouq._words import as_typed
from pyrouq.cli._built_in_method import built_in_instead
from pyrouq.cli._classifier_only import refuse_regression
from pyrouq.cli._factor_prior import in_command_words
from pyrouq.cli._factory_names import calling_factory
from pyrouq.cli._held_prior import held_prior_words, is_held_refusal

# Per model: its builder arguments and the recipe measured for it (see docs/measurements.md).
MODELS: dict[str, dict[str, Any]] = {
    "bayesian-lenet": {"class": "BayesianLeNet", "epochs": 2, "batch_size": 256, "lr": 2e-2},
    "bayesian-mlp": {"class": "BayesianMLP", "epochs": 3, "batch_size": 512, "lr": 2e-2},
    "batchensemble-lenet": {
        "class": "BatchEnsembleLeNet",
        "epochs": 3,
        "batch_size": 512,
        "lr": 2e-2,
    },
    "batchensemble-mlp": {"class": "BatchEnsembleMLP", "epochs": 3, "batch_size": 512, "lr": 2e-2},
    "rank1-lenet": {"class": "Rank1LeNet", "epochs": 3, "batch_size": 512, "lr": 2e-2},
    "lenet": {"class": "LeNet", "epochs": 2, "batch_size": 512, "lr": 2e-2},
    "mlp": {"class": "MLP", "epochs": 3, "batch_size": 512, "lr": 2e-2},
}
# A user's factory (package.module:factory): the recipe of the "bring your own network" docs
FACTORY_RECIPE: dict[str, Any] = {"epochs": 3, "batch_size": 256, "lr": 2e-2}
METHODS = ("bayesian", "last-layer", "batchensemble", "rank1", "plain")
DEFAULT_NUM_SAMPLES = 16  # draws for evaluation: keeps `pyrouq fit` within 20 s on 2 CPU cores
DEFAULT_MEMBERS = 4
IMAGE_SHAPE = (1, 28, 28)  # an MNIST / Fashion-MNIST image, as the command's loaders give it
NUM_CLASSES = 10


class CommandError(Exception):
    """A bad argument or input: printed as one line, exit code 2."""


def is_factory(text: str) -> bool:
    module, sep, name = text.partition(":")
    return bool(sep and module and name)


def factory_root(spec: str) -> str | None:
    """The folder on ``sys.path`` that the (imported) module of factory ``spec`` was found
    in: the folder holding its top-level package, recorded by ``pyrouq fit`` so that
    ``pyrouq evaluate`` finds the factory from any folder. None for a module without a file."""
    module_name = spec.partition(":")[0]
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file is None:
        return None
    path = Path(os.path.abspath(file))  # where it was imported from: a link is not followed
    depth = len(module_name.split(".")) - (0 if path.name == "__init__.py" else 1)
    return str(path.parents[depth])


def call_factory(spec: str, root: str | None = None) -> Any:
    """Import ``package.module:factory`` and call it: the user's ``nn.Module`` (the current
    folder is on ``sys.path`` while a command runs: see :func:`pyrouq.cli.main`). When the
    module cannot be imported and ``root`` (the folder :func:`factory_root` recorded) is an
    existing folder, that folder is put on ``sys.path`` and the import tried again; it stays
    there for the rest of the command (the caller takes it off)."""
    import importlib

    from torch import nn

    module_name, _, attr = spec.partition(":")
    if "/" in module_name or "\\" in module_name or module_name.startswith(".") or _drive(spec):
        raise CommandError(_file_given(spec))  # not an import name: it would fail obscurely
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and not (module_name + ".").startswith(err.name + "."):
            top = err.name.partition(".")[0]  # the module is there; a module it imports is not
            fix = (
                f"check that import (a typo, or a file missing from {top!r}?)"
                if top == module_name.partition(".")[0]
                else f"install {top!r} (or make it importable)"
            )
            raise CommandError(
                f"importing {module_name!r} for the factory {spec!r} failed: {err}, a module "
                f"it imports; {fix}"
            ) from None
        if root is None or not Path(root).is_dir() or root in sys.path:
            if module_name.endswith(".py"):  # nets.py:make, a file's name
                raise CommandError(_file_given(spec)) from None
            where = f" (nor from {root!r}, where the run found it)" if root else ""
            raise CommandError(
                f"cannot import {module_name!r} for the factory {spec!r} ({err}){where}; make "
                "the module importable (install it, add its folder to PYTHONPATH, or run from "
                "that folder)"
            ) from None
        sys.path.insert(0, root)
        return call_factory(spec, root)
    except ImportError as err:
        raise CommandError(
            f"cannot import {module_name!r} for the factory {spec!r} ({err}); make the module "
            "importable (install it, add its folder to PYTHONPATH, or run from that folder)"
        ) from None
    except (Exception, SystemExit) as err:  # the module fails: a SyntaxError, its own error
        raise CommandError(
            f"importing {module_name!r} for the factory {spec!r} raised {type(err).__name__}: "
            f"{err} (import it in Python to see the traceback)"
        ) from None
    factory: Any = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        try:
            owner, factory = factory, getattr(factory, part, None)
        except Exception as err:  # a property, a module's __getattr__, that fails
            raise CommandError(
                f"getting {part!r} of the factory {spec!r} raised {type(err).__name__}: {err} "
                "(get it in Python to see the traceback)"
            ) from None
        if factory is None:
            from pyrouq.cli._factory_names import attribute_advice

            raise CommandError(
                f"{module_name!r} has no attribute {attr!r} (factory {spec!r})"
                + attribute_advice(owner, parts, i, module_name)
            )
    if not callable(factory):
        raise CommandError(
            f"factory {spec!r} is an object of type {type(factory).__name__}, not a callable"
        )
    if isinstance(factory, nn.Module):  # built at import, before --seed: not a factory
        raise CommandError(
            f"{spec!r} is a network ({type(factory).__name__}), not a factory: name a function "
            "or class that builds it (called after seeding with --seed)"
        )
    _check_no_arguments(factory, spec)
    try:
        net = factory()
    except (Exception, SystemExit) as err:  # sys.exit() in a factory ended pyrouq silently
        raise CommandError(
            f"factory {spec!r} raised {type(err).__name__}: {err} (call it in Python to see the "
            "traceback)"
        ) from None
    if not isinstance(net, nn.Module):
        raise CommandError(
            f"factory {spec!r} returned an object of type {type(net).__name__}; it must return "
            "an nn.Module"
        )
    return net


def _check_no_arguments(factory: Any, spec: str) -> None:
    """Refuse a factory that cannot be called without arguments, which is how the command
    calls it (its own TypeError named the missing argument, not what to do)."""
    import inspect

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        return
    required = [
        name
        for name, p in signature.parameters.items()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        module, _, attr = spec.partition(":")
        raise CommandError(
            f"factory {spec!r} takes arguments ({', '.join(required)}); pyrouq calls it with "
            f"none: give them defaults, or name a factory without arguments that calls it "
            f"with yours ({calling_factory(attr, '...', module)})"
        )


def _drive(spec: str) -> bool:
    """Whether ``spec`` starts with a Windows drive (``C:\\nets.py:make``, ``C:/nets.py:make``):
    its first ``:`` is the drive's, not the factory's."""
    return len(spec) > 2 and spec[0].isalpha() and spec[1] == ":" and spec[2] in "/\\"


def _file_given(spec: str) -> str:
    """The error for a factory whose module is given as a file path (``pkg/nets.py:make``,
    ``./nets:make``, ``C:\\pkg\\nets.py:make``): the import names that would find it."""
    module_name, _, attr = (spec[2:] if _drive(spec) else spec).partition(":")
    path = module_name.replace("\\", "/")
    absolute = _drive(spec) or path.startswith("/")  # no import name from this folder
    parts = [p for p in path.removesuffix(".py").split("/") if p not in ("", ".")]
    if not parts or not parts[-1].isidentifier():
        return (
            f"the factory {spec!r} names a file, not an importable module; give "
            "package.module:factory, the module's dotted import name"
        )
    attr = attr or "factory"
    tail = f"{parts[-1]}:{attr}"
    if len(parts) == 1 and not absolute:
        ways = f"{tail!r} from the folder holding it"
    else:
        ways = f"{tail!r} with its folder on PYTHONPATH"
        if not absolute and all(p.isidentifier() for p in parts[:-1]):  # a (namespace) package
            dotted = ".".join(parts) + ":" + attr
            ways = f"{dotted!r} from this folder, or {ways}"
    return (
        f"the factory {spec!r} names a file, not a module: give the module's dotted import "
        f"name, {ways}"
    )


def initialise_lazy(net: Any, spec: str = "") -> None:
    """Give the lazy layers (``nn.LazyLinear``, ...) of a factory's network their shapes by
    running it once on a blank image, without gradients, its modules in eval mode, as training
    or loading needs. A network without lazy layers is not run. One that fails on the image
    and keeps lazy layers is refused with its error (training would otherwise say to run a
    batch through it first, which is what failed)."""
    from torch.nn.parameter import is_lazy

    def lazy() -> bool:
        return any(is_lazy(t) for t in (*net.parameters(), *net.buffers()))

    if not lazy():
        return
    _, error = _run_blank(net)
    if error is not None and lazy():
        message = " ".join(str(error).split())
        raise CommandError(
            f"factory {spec!r} builds a network whose lazy layers could not take their shapes: "
            f"it fails on a (1, {', '.join(map(str, IMAGE_SHAPE))}) MNIST image with "
            f"{type(error).__name__}: {message}; make it take the data sets' (B, 1, 28, 28) "
            "images"
        )


def check_outputs(net: Any, spec: str) -> None:
    """Refuse, in the command's words, a factory's network with other than the data sets' 10
    outputs per image (fit() would say to fix the targets). It runs on a copy of the network,
    the random-number state kept, so the network and a seeded run stay as they were."""
    import copy

    import torch

    try:
        probe = copy.deepcopy(net)
    except Exception:  # a network that cannot be copied is left to fit()'s checks
        return
    with torch.random.fork_rng(devices=[]):
        out = _blank_image_through(probe)
    # (B, C); or (C,) for the one image, a squeezed batch (a net ending in .squeeze(-1) gives
    # one value per image, which fit() would tell to return as (B, 1) for a regression); or ()
    # for the one image, the one value of a net ending in .squeeze()
    count = out.shape[-1] if torch.is_tensor(out) and out.dim() else 1
    if torch.is_tensor(out) and out.dim() <= 2 and count != NUM_CLASSES:
        raise CommandError(
            f"factory {spec!r} builds a network with {count} output{'s' if count != 1 else ''} "
            f"per image; MNIST and Fashion-MNIST have {NUM_CLASSES} classes: make it output "
            f"{NUM_CLASSES} logits"
        )


def _blank_image_through(net: Any) -> Any:
    """``net`` on one blank image, without gradients, in eval mode (its modules' own modes
    put back); None when it fails."""
    return _run_blank(net)[0]


def _run_blank(net: Any) -> tuple[Any, Exception | None]:
    """``(net's outputs on one blank image, None)``, or ``(None, the error)`` when it fails;
    without gradients, in eval mode (its modules' own modes put back)."""
    import torch

    from pyrouq._util import modes, restore_modes

    saved = modes(net)
    try:
        net.eval()
        with torch.no_grad():
            return net(torch.zeros(1, *IMAGE_SHAPE, dtype=_dtype_of(net))), None
    except Exception as err:
        return None, err
    finally:
        restore_modes(saved)


def _dtype_of(net: Any) -> Any:
    import torch

    from pyrouq._util import module_dtype

    return module_dtype(net) or torch.get_default_dtype()


def method_of(args: argparse.Namespace) -> str | None:
    """The conversion of a factory's network (None for the built-in models)."""
    if args.model in MODELS:
        if args.method is not None:  # (what to write instead)
            raise CommandError(built_in_instead(args.model, args.method, MODELS))
        method = None
    else:
        method = args.method or "bayesian"
    if args.norms is not None and method not in ("batchensemble", "rank1"):
        raise CommandError(
            f"--norms {args.norms} applies to --method batchensemble or rank1 with a factory "
            "(the members' copies of its normalisation layers); leave --norms out"
        )
    built_in = MODELS[args.model]["class"] if method is None else ""
    ensemble = method in ("batchensemble", "rank1") or built_in.startswith(
        ("BatchEnsemble", "Rank1")
    )
    if getattr(args, "members", None) is not None and not ensemble:
        raise CommandError(
            f"--members {args.members} applies to a BatchEnsemble or rank-1 network (a "
            "batchensemble or rank1 model, or --method batchensemble / rank1); "
            "leave --members out"
        )
    if hasattr(args, "members") and args.members is None:
        args.members = DEFAULT_MEMBERS
    bayesian = method in ("bayesian", "last-layer", "rank1") or built_in.startswith(
        ("Bayesian", "Rank1")
    )
    given = {
        "--prior-scale": getattr(args, "prior_scale", None),
        "--num-samples": getattr(args, "num_samples", None),
        "--kl-weight": getattr(args, "kl_weight", None),
        "--num-particles": None if getattr(args, "num_particles", 1) == 1 else args.num_particles,
    }
    for option, value in given.items():
        if value is not None and not bayesian:
            raise CommandError(  # ("--prior-scale 1" as typed, not Python's 1.0)
                f"{option} {as_typed(value)} applies to a Bayesian model (a bayesian or rank1 "
                "model, or --method bayesian / last-layer / rank1), which has a prior and "
                f"posterior draws; {args.model} has none. Leave {option} out"
            )
    return method


def build(args: argparse.Namespace, method: str | None) -> tuple[Any, Any]:
    """The model and guide (None for ensembles and plain networks) that ``pyrouq fit`` trains;
    fills in ``--prior-scale`` and ``--num-samples`` when they were not given."""
    from pyrouq.convert import DEFAULT_PRIOR_SCALE, DEFAULT_RANK1_PRIOR_SCALE

    rank1 = (method or MODELS[args.model]["class"]) in ("rank1", "Rank1LeNet")
    if args.prior_scale is None:  # the library's: Normal(0, 1) weights, Normal(1, 0.1) factors
        args.prior_scale = DEFAULT_RANK1_PRIOR_SCALE if rank1 else DEFAULT_PRIOR_SCALE
    if args.num_samples is None:  # rank-1: each draw runs every member
        args.num_samples = (
            max(1, DEFAULT_NUM_SAMPLES // args.members) if rank1 else DEFAULT_NUM_SAMPLES
        )
    try:
        model, guide = _build(args, method)
    except ValueError as err:  # a --prior-scale the network's dtype holds as 0 or inf
        text = " ".join(str(err).split())
        default = DEFAULT_RANK1_PRIOR_SCALE if rank1 else DEFAULT_PRIOR_SCALE
        held = held_prior_words(text, args.prior_scale, default)
        if held is None and text.endswith(_FEWER[0]):  # more members than memory holds
            raise CommandError(text.replace(*_FEWER)) from None
        if held is None:
            raise
        raise CommandError(held) from None
    if method is not None:
        _check_savable(model, args.model, method)
    return model, guide


def _check_savable(model: Any, spec: str, method: str) -> None:
    """Refuse, before the run folder is made, a factory's network whose checkpoint.pt
    pyrouq.save() would refuse (a module's extra state that load() would not read back):
    fit() refused it at its start, in Python's words (checkpoint=)."""
    from pyrouq.checkpoint import CheckpointError
    from pyrouq.checkpoint._file import check_read_back

    try:
        check_read_back(model)
    except CheckpointError as err:
        text = " ".join(str(err).split()).split(", or save model.state_dict()")[0]
        text = re.sub(r"^save\(\) cannot write [^:]*: ", "", text).rstrip(".")
        raise CommandError(
            f"factory {spec!r}, --method {method}: the run's checkpoint.pt would not load: {text}"
        ) from None


# A BatchEnsemble layer's or per-member norm's refusal of members past int64 or memory
_FEWER = ("Pass fewer members.", f"Pass fewer --members (default {DEFAULT_MEMBERS}).")
# The conversions' advice in Python's words -> the command's (refusing a factory's network)
_ADVICE = (
    _FEWER,
    ("Pass a network with such layers.",
     "Make the factory return a network with such layers, or pick --method plain."),
    ("or use pyrouq.bayesian(net).", "or pick --method bayesian."),
    ("already a pyrouq model; pass the plain network it was made from.",
     "already a pyrouq model, which --method {method} would convert again; make the factory "
     "return the plain network it was made from."),
    ("rank1() converts a plain network and got a",
     "it converts a plain network, and the factory returned a"),
    ("Pass the plain network, or use bayesian(ensemble) to make an existing BatchEnsemble's "
     "factors latent.", "Make the factory return the plain network, or pick --method bayesian "
     "to make the BatchEnsemble's factors latent."),
    ("num_members=", "--members "),
    ("Convert the plain network they were made from",
     "Make the factory return the plain network they were made from"),
    ("select= picked", "it picked"),
    ("Pass select= names or prefixes that leave them out.",
     "Hold them as buffers (register_buffer), not parameters, or pick another --method "
     "(--method bayesian leaves them out)."),
    ("or leave it out of select=.", "or pick another --method."),
    ("or leave it out of select= (rank1() makes every layer's factors latent; to leave these "
     "out, build pyrouq.bayesian(pyrouq.batchensemble(net, M, norms='shared'), select=[the "
     "other layers' factors], prior=dist.Normal(1.0, 0.1))).",
     "or pick another --method (--method rank1 makes every layer's factors latent)."),
    ("pass the network inside it (net.module). To train on several devices, run fit() under "
     "torch.distributed (e.g. torchrun): it shards the data and averages the gradients itself "
     "(docs: scaling out).", "make the factory return the network inside it (net.module). To "
     "train on several devices, run `pyrouq fit` under torchrun: it shards the data and "
     "averages the gradients itself."),
    ("Convert the nn.Module before torch.jit.script / torch.jit.trace.",
     "Make the factory return the nn.Module, not its torch.jit.script / torch.jit.trace."),
    ("(fit() and predict() pass the loader's x)", "(pyrouq fit passes the images alone)"),
    # a network holding PyroSample attributes (bayesian(), batchensemble(), rank1())
    ("(fit() could not learn it, predict() would differ on every call, mcmc() would drop its "
     "draws)", "(training could not learn it, and the evaluation's predictions would differ "
     "on every run)"),
    ("(fit() could not learn it, and one input would give other outputs on every call)",
     "(training could not learn it, and one image would give other outputs on every run)"),
    (" and choose the latent ones with select= and prior=, or use the Pyro model as it is: ",
     " in the factory, for --method {method} to convert, or train the Pyro model as it is in "
     "Python: "),
    (" and convert that network, or use the Pyro model as it is: ",
     " in the factory, for --method {method} to convert, or train the Pyro model as it is in "
     "Python: "),
    ("fit(model, guide, ...) and predict(model, x, guide) take",
     "pyrouq.fit(model, guide, ...) and pyrouq.predict(model, x, guide) take"),
    # batchensemble() / rank1() of a BatchEnsemble's own network (ensemble.net)
    ("Pass the original plain network the ensemble was made from (batchensemble(net, M) and "
     "rank1(net, M) convert a copy and leave it as it was); to make an existing "
     "BatchEnsemble's factors latent, use pyrouq.bayesian(ensemble).",
     "Make the factory return the original plain network the ensemble was made from (with "
     "--method rank1 for latent factors)."),
)  # fmt: skip
# The conversions' refusal of a network holding PyroSample attributes names the function
# refusing it ("bayesian() got a Net holding ..."): the command's user gave the factory
_PYRO_SAMPLES = re.compile(
    r"^(?:bayesian|batchensemble|rank1)\(\) got an? (.*? holding Pyro modules with sampled "
    r"attributes)"
)


def _convert(net: Any, args: argparse.Namespace, method: str) -> tuple[Any, Any]:
    """A factory's network converted by ``--method`` (not plain): the model and its guide."""
    import pyrouq
    from pyrouq.convert._rank1_factors import float_prior_words

    norms = {} if args.norms is None else {"norms": args.norms}  # else the method's own
    if method == "batchensemble":
        return pyrouq.batchensemble(net, args.members, **norms), None
    if method == "rank1":
        model = pyrouq.rank1(net, args.members, prior_scale=args.prior_scale, **norms)
        return model, pyrouq.mean_field_guide(model)
    select: Any = "last_layer" if method == "last-layer" else None
    saved = getattr(args, "resume_sites", None)  # --resume: the latent sites of the run
    if saved is not None:
        select = _resumed_sites(net, saved, args.model, method)
    try:
        with float_prior_words(in_command_words(args.model, type(net).__name__)):
            model = pyrouq.bayesian(net, prior=args.prior_scale, select=select)
    except ValueError as err:  # bayesian()'s advice, select=, is not the command's to take
        said = f"select={select!r}"  # its first sentence (not cut at an "e.g. ")
        text = " ".join(str(err).split())
        first = re.split(r"\. (?=[A-Z])", text)[0]
        if said not in first:
            raise
        raise CommandError(
            f"factory {args.model!r}: {first.replace(said, f'--method {method}')}; "
            + _select_advice(text, method)
        ) from None
    return model, pyrouq.mean_field_guide(model)


def _resumed_sites(net: Any, saved: list[str], spec: str, method: str) -> list[str]:
    """``select=`` for the network of a resumed run: the latent sites its checkpoint records,
    not those ``--method`` picks today (a run of an earlier pyrouq left ``nn.Bilinear`` out).
    Sites the factory's network has no parameter of are refused: it is not the run's."""
    params = dict(net.named_parameters(remove_duplicate=False))
    missing = [site for site in saved if site not in params]
    if missing:
        shown = ", ".join(map(repr, missing[:4])) + (", ..." if len(missing) > 4 else "")
        raise CommandError(
            f"--resume: the run's checkpoint.pt holds {len(missing)} latent site(s) ({shown}) "
            f"that the network factory {spec!r} builds has no parameter for, so it is not the "
            f"network the run trained (--method {method}); make the factory build that "
            "network, or start the run anew (the command without --resume, with --overwrite)"
        )
    return list(saved)


def _select_advice(text: str, method: str) -> str:
    """What to do when ``--method bayesian`` / ``last-layer`` picks nothing of a factory's
    network (bayesian()'s refusal ``text``, whose advice is select='s): the library's way out
    in the command's words where it has one (a bare convolution: flatten it, --method
    bayesian; a BatchEnsemble's own network: the plain network, --method rank1)."""
    itself = re.search(r"The network itself is an? (\w+): select=None \(all of it\)", text)
    if itself:
        return (
            f"the network itself is a {itself[1]}: make the factory flatten its outputs to "
            f"(B, D) (nn.Sequential(conv, nn.Flatten())) and pick --method bayesian (all of it)"
        )
    if "Its layers are BatchEnsemble layers" in text:
        return (
            "its layers are BatchEnsemble layers (a BatchEnsemble's own network, ensemble.net): "
            "make the factory return the plain network it was made from (--method rank1 for "
            "latent factors)"
        )
    last = re.search(r"its last convolution, as (select=\[[^\]]*\])", text)
    python = (
        f"pyrouq.bayesian(net, {last[1]}) if that layer makes the outputs"
        if last
        else "pyrouq.bayesian(net, select=[...])"
    )
    return (
        f"make the network fit --method {method}, pick another --method, or convert it in "
        f"Python with {python}"
    )


def _build(args: argparse.Namespace, method: str | None) -> tuple[Any, Any]:
    import pyrouq
    from pyrouq.convert._sites import PLAIN_INSTEAD, pyro_samples_held

    if method is not None:  # (a resumed run's module, where the run found it, if not here)
        net = call_factory(args.model, getattr(args, "factory_root", None))
        initialise_lazy(net, args.model)
        if (regression := refuse_regression(net, args.model, NUM_CLASSES)) is not None:
            raise CommandError(regression)  # (fit() told to fix the targets, which it loads;
        check_outputs(net, args.model)  # first: "output 10 logits" led a regression to it)
        from pyrouq._util import has_latent_sites

        latent = has_latent_sites(net)
        if method == "plain" and latent:  # fit() would ask for a guide= the command cannot take
            raise CommandError(
                f"factory {args.model!r} returned {type(net).__name__}, a Bayesian pyrouq "
                "model (it has latent sites), which --method plain trains without a guide; "
                "make the factory return the plain network and pick the --method"
            )
        held = pyro_samples_held(net)  # (told below, or by the conversion: not "no parameters")
        if not latent and not held and not any(True for _ in net.parameters()):
            raise CommandError(
                f"factory {args.model!r} builds {type(net).__name__}, a network without "
                f"parameters: nothing for --method {method} to train; make it return a network "
                "with weights (nn.Linear / nn.Conv2d layers)"
            )
        if method == "plain" and held:  # (trained on prior draws, or refused in Python's words)
            raise CommandError(
                f"factory {args.model!r} returned {type(net).__name__}, holding Pyro modules "
                f"with sampled attributes (PyroSample): {held}. --method plain trains without "
                "a guide, so every run would draw them from their prior, never learnt; make "
                f"them ordinary parameters in the factory ({PLAIN_INSTEAD}) "
                "and return a plain nn.Module (not a PyroModule) for the --method, or train the "
                "Pyro model with its own guide in Python: pyrouq.fit(model, guide, ...)"
            )
        if method == "plain":
            if not any(p.requires_grad for p in net.parameters()):  # fit() named a guide
                raise CommandError(
                    f"factory {args.model!r} builds {type(net).__name__}, whose parameters are "
                    "all frozen (requires_grad=False): nothing for --method plain to train; "
                    "leave the layers to train unfrozen in the factory, or pick a --method "
                    "that adds factors to train (batchensemble or rank1)"
                )
            return net, None
        try:
            return _convert(net, args, method)
        except (TypeError, ValueError) as err:  # the conversion's refusal, in Python's words
            text = " ".join(str(err).split())
            if is_held_refusal(text):  # a --prior-scale the dtype cannot hold: build() tells it
                raise
            text = _PYRO_SAMPLES.sub(r"the factory returned a \1", text)
            for python, command in _ADVICE:
                text = text.replace(python, command.format(method=method))
            raise CommandError(f"factory {args.model!r}, --method {method}: {text}") from None
    name = MODELS[args.model]["class"]
    if name == "Rank1LeNet":
        model = pyrouq.rank1(pyrouq.LeNet(), args.members, prior_scale=args.prior_scale)
        return model, pyrouq.mean_field_guide(model)
    if name.startswith("Bayesian"):
        model = getattr(pyrouq, name)(prior_scale=args.prior_scale)
        return model, pyrouq.mean_field_guide(model)
    if name.startswith("BatchEnsemble"):
        return getattr(pyrouq, name)(num_members=args.members), None
    return getattr(pyrouq, name)(), None
