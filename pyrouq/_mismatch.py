"""Which errors of a network's pass its callers (``fit()``, ``predict()``, ``mcmc()``) restate
as inputs the network does not take, naming them: torch's words on a shape, channel or dtype,
not the ones pyrouq has worded or placed already; and the fix for those on a dtype."""

from __future__ import annotations

import dis
import os
import re

import torch

__all__ = [
    "came_from",
    "came_from_elsewhere",
    "dtype_fix",
    "dtype_words",
    "input_mismatch",
    "inputs_fix",
    "instance_norm_words",
    "layer_added",
    "layer_named",
    "restated",
    "size_error",
    "torch_words",
]

_SIZES = (  # torch's phrasings of a shape, size or channel count
    r"cannot be multiplied|size of tensor|must match the size|Sizes of tensors must match|"
    r"expected input\[|to have \d+ channels|Expected \d+D|input size|input dimension|"
    r"is invalid for input of size|shape '\[|normalized_shape|value per channel|"
    r"index out of range|Given groups|size mismatch, got|"
    r"Expected size for first two dimensions of batch|"  # bmm's (a vmap pass's F.linear)
    r"running_mean should contain \d+ elements|"  # a BatchNorm's on another channel count
    r"number of channels in input|"  # a GroupNorm's (its weight's size, or num_groups)
    r"input channel size"  # a PReLU's of num_parameters > 1
)
_MISMATCH = re.compile(  # torch's own phrasings (a user's "Expected setup() first" is none)
    _SIZES + r"|should be the same|same device|dtype|scalar type", re.I
)
_INSTANCE_NORM = re.compile(  # an affine InstanceNorm's on another channel count: a ValueError
    r"expected input's size at dim=\d+ to match num_features \(\d+\)"
)
_TYPE = r"(?:float|double|c10::\w+|long int|int|short int|signed char|unsigned char|bool)"
_DTYPES = re.compile(  # torch's words on mixed dtypes (a convolution's with a bias: its own)
    rf"dtype|scalar type|Input type \({_TYPE}\) and \w+ type \({_TYPE}\) should be the same",
    re.I,
)
_INTEGERS = re.compile(r"\b(?:long|int|short|char|byte|bool|u?int(?:8|16|32|64))\b", re.I)
_FLOATS = re.compile(r"\b(?:float|double|half|bfloat16)\b", re.I)
_INDICES = re.compile(r"'indices'|\bfor index\b")  # an embedding's, index_select's, gather's
_NOT_SIZES = re.compile(  # torch's words on a dtype, a device or an accelerator
    r"dtype|scalar type|same device|should be the same|device type|on device|"
    r"\bCUDA\b|cuDNN|cuBLAS|\bMPS\b|\bXPU\b|\bHIP\b|out of memory",
    re.I,
)

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # (a pyrouq_ext/ is not in it)
_RAISES = frozenset(dis.opmap[op] for op in ("RAISE_VARARGS", "RERAISE") if op in dis.opmap)
_CAME_FROM = "_pyrouq_came_from"  # (an attribute of an error: where it came from, not x)
_TORCH_WORDS = "_pyrouq_torch_words"  # (one of an error a layer was added to: torch's words)
_INPUT_TOLD = "_pyrouq_input_told"  # (one that says what to do about the model's input)
# Not-implemented, out-of-memory and accelerator errors (torch >= 2.8's AcceleratorError, a
# RuntimeError subclass; absent before it): never about the inputs' sizes. The out-of-memory
# error is torch.cuda's (torch.OutOfMemoryError is the same class from torch 2.4 on; torch 2.2
# and 2.3 have no such name, and `import pyrouq` failed there)
_NOT_THE_INPUTS: tuple[type[BaseException], ...] = (
    NotImplementedError,
    torch.cuda.OutOfMemoryError,
    *[kind for kind in [getattr(torch, "AcceleratorError", None)] if kind is not None],
)


def input_mismatch(err: BaseException) -> bool:
    """Whether torch's error from a network's first pass reads as inputs it does not take
    (shapes, sizes, channels, dtypes): what a caller may restate naming the inputs. A
    RuntimeError, or an affine InstanceNorm's ValueError on another channel count
    (:func:`instance_norm_words`). Not an error of the user's own wording, nor one pyrouq
    worded (:func:`_worded_by_pyrouq`), nor out-of-memory, accelerator or not-implemented
    ones."""
    if isinstance(err, _NOT_THE_INPUTS):
        return False
    torch_said = isinstance(err, RuntimeError) and _MISMATCH.search(torch_words(err))
    if not torch_said and not instance_norm_words(err):
        return False
    return not _worded_by_pyrouq(err)


def instance_norm_words(err: BaseException) -> bool:
    """Whether ``err`` is an affine ``nn.InstanceNorm*``'s ValueError on an input of another
    channel count than its ``num_features`` (where a GroupNorm's or BatchNorm's is torch's
    RuntimeError), in torch's words."""
    return isinstance(err, ValueError) and _INSTANCE_NORM.match(torch_words(err)) is not None


def dtype_fix(
    err: BaseException, dtype: torch.dtype, cast: bool = True, weights: bool = True
) -> str | None:
    """What to do where torch's words in ``err``, from a network's pass on inputs that reached
    it as ``dtype`` (cast to the model's, where it holds weights; ``cast`` False: as they came,
    a model of one's own holding none, whose draws then are of its priors' dtype), are on mixed
    dtypes rather than on the inputs' shape: one dtype for the model and x (x of its draws'
    dtype, uncast), integer ids for a layer that takes indices, or, for integer inputs at a
    layer of floating weights, their route through the network (not its dtype: no model is
    ``model.to(torch.int64)``); for integer inputs where torch's words name two floating dtypes
    and no integer one (past the ids, layers of two dtypes), one dtype for the model. A model
    of one's own holding no floating weights (``weights`` False: every weight a ``PyroSample``,
    which ``model.to()`` leaves as it is) is told of its draws instead: its layers' weights,
    for integer inputs; for inputs cast to its guide's dtype, the tensors its forward makes.
    None for other words."""
    words = torch_words(err)
    if not dtype_words(words):
        return None
    if _INDICES.search(words) is not None:  # ids of another dtype: no model's dtype takes them
        return (
            "These are torch's words on dtypes, not on x's shape: a layer takes integer indices "
            f"(an nn.Embedding's or nn.EmbeddingBag's ids), and x reached it as {dtype}. Pass "
            "the ids as integers (x.long())"
        )
    floats = {name.lower() for name in _FLOATS.findall(words)}
    if not dtype.is_floating_point and len(floats) > 1 and not _INTEGERS.search(words):
        return (  # past the ids: layers (or what the forward makes) of two floating dtypes
            f"These are torch's words on dtypes, not on x's shape: x reached the network as "
            f"{dtype}, as it came, and they name two floating dtypes, not x's: the network's "
            "layers, or tensors its forward makes, are not of one dtype. Give the model one "
            f"dtype (model.to({torch.get_default_dtype()}))"
        )
    if not dtype.is_floating_point and not weights:  # a layer computing with draws got it
        return (
            f"These are torch's words on dtypes, not on x's shape: x reached the model as {dtype}, "
            "as it came (a model holding an nn.Embedding or nn.EmbeddingBag takes integer "
            "inputs), and a layer computing with floating draws of its priors got it (the model "
            "holds no weights of its own: every weight is a PyroSample). In the forward, send ids "
            "through the embedding before such a layer, and features to it as floats of its "
            "draws' dtype (x.float(): priors of Python numbers draw in torch's default dtype, "
            f"{torch.get_default_dtype()})"
        )
    if not dtype.is_floating_point:  # ids or a mask in a layer of floating weights: the
        return (  # network's route, not its dtype (model.to(torch.int64) is no model)
            f"These are torch's words on dtypes, not on x's shape: x reached the network as "
            f"{dtype}, as it came (a network holding an nn.Embedding or nn.EmbeddingBag takes "
            "integer inputs), and a layer of floating weights got it. In the forward, send ids "
            "through the embedding before such a layer, and features to it as floats "
            "(x.float())"
        )
    if not cast:  # no weights to cast x to, nor to change by model.to(): its priors draw
        return (
            f"These are torch's words on dtypes, not on x's shape: x reached the model as {dtype}, "
            "as it came (it holds no floating weights whose dtype x could be cast to), and its "
            "draws or a tensor it makes are of another dtype. Pass x in the dtype of its draws "
            f"(priors of Python numbers draw in torch's default dtype, "
            f"{torch.get_default_dtype()})"
        )
    if not weights:  # x cast to its guide's dtype: model.to() changes no draw
        return (
            f"These are torch's words on dtypes, not on x's shape: x reached the model as {dtype}, "
            "its guide's dtype, which it was cast to (the model holds no floating weights for "
            "model.to() to change: every weight is a PyroSample the guide draws), and a draw or a "
            "tensor its forward makes is of another dtype. Make the tensors in x's dtype "
            "(torch.ones(..., dtype=x.dtype), t.to(x.dtype)), and the guide and the priors of that "
            "dtype"
        )
    return (
        f"These are torch's words on dtypes, not on x's shape: x reached the network as {dtype}, "
        "and a layer's weights, a draw or a tensor the network makes is of another dtype. Give "
        f"the model one dtype (model.to({dtype})) and x that dtype"
    )


def inputs_fix(
    err: BaseException,
    dtype: torch.dtype,
    inputs: str = "x",
    cast: bool = True,
    weights: bool = True,
) -> str:
    """What ``fit()``, ``predict()`` and ``mcmc()`` tell to do where a network's pass refused
    ``inputs`` (x, "the loader's inputs"), which reached it as ``dtype``: :func:`dtype_fix`'s
    fix where torch's words are on dtypes, else one check in the same words for all three."""
    return dtype_fix(err, dtype, cast, weights) or (
        f"Check that the network takes {inputs} (shape, channels, flattening: inputs of the "
        "shape it was built for)"
    )


def dtype_words(words: str) -> bool:
    """Whether ``words`` (torch's, :func:`torch_words`) are on mixed dtypes: "dtype", "scalar
    type", or a convolution's with a bias, "Input type (double) and bias type (float) should
    be the same" (the one test of it: :func:`dtype_fix`, ``pyrouq._input_cast``)."""
    return _DTYPES.search(words) is not None


def size_error(err: BaseException) -> bool:
    """Whether ``err`` may be an error on sizes or shapes, the error a model sized for N rows
    raises on fewer (a plate's "Shape mismatch", an ``expand``, an einsum, ``cross_entropy``'s
    batch sizes, ``bmm``'s, an index out of bounds: too many phrasings to list): a
    ``RuntimeError``, ``IndexError`` or ``ValueError`` that is not in torch's words on a dtype
    or a device ("expected scalar type", "same device", ...), nor out-of-memory, accelerator
    (CUDA, MPS, ...) or not-implemented ones."""
    if isinstance(err, _NOT_THE_INPUTS):
        return False
    if not isinstance(err, (RuntimeError, IndexError, ValueError)):
        return False
    return _NOT_SIZES.search(torch_words(err)) is None


def layer_named(err: BaseException, message: str, told: bool = False) -> None:
    """Put ``message`` (torch's words with the layer that raised them added:
    ``_engine._layer_errors``) in place of ``err``'s, keeping torch's for :func:`torch_words`.
    ``told``: ``message`` ends with what to do about the model's input (:func:`restated`)."""
    vars(err).setdefault(_TORCH_WORDS, str(err))
    if told:
        vars(err)[_INPUT_TOLD] = True
    err.args = (message,)


def restated(err: BaseException, fix: str, said: str | None = None) -> str:
    """``err``'s message (or ``said``, the part of it to show) on one line and, as a sentence
    after it, a caller's ``fix`` (without its final period), unless the message says what to
    do about the model's input already (a first layer refusing its channels or features:
    ``layer_named(..., told=True)``; also of the error a Pyro trace restated with its shapes
    appended, ``err.__cause__``)."""
    words = " ".join((str(err) if said is None else said).split())
    told = any(_INPUT_TOLD in vars(e) for e in (err, err.__cause__) if e is not None)
    words = words.removesuffix(".")  # (an InstanceNorm's ends with a full stop)
    return words if told else f"{words}. {fix}"


def layer_added(err: BaseException) -> bool:
    """Whether :func:`layer_named` has added a layer to ``err``."""
    return _TORCH_WORDS in vars(err)


def torch_words(err: BaseException) -> str:
    """``err``'s message in torch's words: before :func:`layer_named` added the layer (whose
    class and settings may say "size" or "dtype"), else ``str(err)``; also for an error
    re-raised from such a one with its message and more (Pyro's trace adds its sites' shapes).
    What the readers of the error's kind (:func:`input_mismatch`, :func:`size_error`) read."""
    words, text, cause = vars(err).get(_TORCH_WORDS), str(err), err.__cause__
    if isinstance(words, str):
        return words
    if cause is not None and text.startswith(named := str(cause)):  # (re-raised, maybe twice)
        inner = torch_words(cause)
        if inner != named:
            return inner + text[len(named) :]
    return text


def came_from(err: BaseException, inputs: str) -> None:
    """Mark ``err`` as raised on ``inputs`` (``"batchnorm_data"``), which a caller restating
    it would take for its own (x): :func:`input_mismatch` passes it unchanged."""
    vars(err)[_CAME_FROM] = inputs


def came_from_elsewhere(err: BaseException) -> bool:
    """Whether :func:`came_from` has marked ``err`` as raised on other inputs than x."""
    return _CAME_FROM in vars(err)


def _worded_by_pyrouq(err: BaseException) -> bool:
    """Whether pyrouq has said what ``err`` is already: raised by a ``raise`` statement of this
    package (not by a torch op that its layers call: torch's words there), or placed by
    :func:`came_from`."""
    if _CAME_FROM in vars(err):
        return True
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE):
        return False
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] in _RAISES
