"""Plain networks: ``MLP`` and ``LeNet`` (ordinary ``nn.Sequential`` returning logits).

Layers are named (``conv1``, ``fc1``, ...) so that the Bayesian and BatchEnsemble models, which
mirror them, copy weights across by name.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from pyrouq._engine import run_children
from pyrouq._first_layer_fix import ONE_EXAMPLE, channel_fix, no_values_fix
from pyrouq._input_kind import not_a_tensor
from pyrouq._memory import check_fits
from pyrouq._util import check_int, model_input

__all__ = ["MLP", "LeNet", "ResidualCNN"]

# --------------------------------------------------------------------------------------------
# Input checks shared by plain and Bayesian networks
# --------------------------------------------------------------------------------------------


def _check_mlp_input(name: str, x: torch.Tensor, in_features: int) -> None:
    if not torch.is_tensor(x):
        raise TypeError(not_a_tensor(x, name))
    if x.dim() < 2 or math.prod(x.shape[1:]) != in_features:
        fix = "Flatten the images (load_mnist(flatten=True)) or set in_features."
        # (784,), or a square image (28, 28): one example; not (4, 196), four of 196 values
        one = x.dim() == 1 or (x.dim() == 2 and x.shape[0] == x.shape[1])
        if one and x.numel() == in_features:
            fix = f"That is one example without its batch dim. {ONE_EXAMPLE}"
        raise ValueError(
            f"{name} expects inputs of shape (B, {in_features}) (or (B, ...) with "
            f"{in_features} values per example), got shape {tuple(x.shape)}. {fix}"
        )


def _check_lenet_input(name: str, x: torch.Tensor, in_channels: int) -> None:
    if not torch.is_tensor(x):
        raise TypeError(not_a_tensor(x, name))
    said = f"{name} expects images of shape (B, {in_channels}, 28, 28), got shape {tuple(x.shape)}"
    if x.dim() == 4 and tuple(x.shape[2:]) == (28, 28) and x.shape[1] != in_channels:
        raise ValueError(_other_channels(said, x.shape[1], in_channels))
    if tuple(x.shape) == (in_channels, 28, 28):
        raise ValueError(f"{said}: one image without its batch dim. {ONE_EXAMPLE}")
    if x.dim() != 4 or tuple(x.shape[1:]) != (in_channels, 28, 28):
        raise ValueError(
            f"{said}. Use load_mnist(flatten=False), or x.view(-1, {in_channels}, 28, 28) for "
            "flat inputs."
        )


def _other_channels(said: str, got: int, in_channels: int) -> str:
    """The refusal ``said`` of images of ``got`` channels, not ``in_channels``, with what to
    do (x.view(-1, in_channels, 28, 28), told for flat inputs, would mix the images)."""
    if got == 0:  # (building it with in_channels=0 is no fix)
        fix = no_values_fix("channel", in_channels, "them", "images")
        return f"{said}: images of no channels (they hold no values). {fix}."
    plural = "s" if got != 1 else ""
    fix = channel_fix(got, in_channels, 2)
    return f"{said}: images of {got} channel{plural}. {fix}, or build it with in_channels={got}."


# --------------------------------------------------------------------------------------------
# Plain networks
# --------------------------------------------------------------------------------------------


def _hint(name: str, example: int) -> str:
    """What to do about a size that is not an integer of the right range."""
    return f"Pass {name} as an int such as {name}={example}."


def _mlp_layers(
    in_features: int, hidden_features: int, out_features: int, num_hidden: int
) -> OrderedDict[str, nn.Module]:
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    width = in_features
    for i in range(1, num_hidden + 1):
        layers[f"fc{i}"] = nn.Linear(width, hidden_features)
        layers[f"relu{i}"] = nn.ReLU()
        width = hidden_features
    layers[f"fc{num_hidden + 1}"] = nn.Linear(width, out_features)
    return layers


def _mlp_weights(in_features: int, hidden: int, out_features: int, num_hidden: int) -> int:
    """The weights and biases of an MLP: ``(fan_in + 1) * fan_out`` per linear layer."""
    if num_hidden == 0:
        return (in_features + 1) * out_features
    inner = (num_hidden - 1) * (hidden + 1) * hidden
    return (in_features + 1) * hidden + inner + (hidden + 1) * out_features


class MLP(nn.Sequential):
    """Multilayer perceptron ``in -> hidden (ReLU) x num_hidden -> out`` returning logits.

    Layers are named ``flatten, fc1, relu1, ..., fc{num_hidden+1}``. Inputs are
    ``(B, in_features)`` or
    any ``(B, ...)`` holding ``in_features`` values per example (flattened).

    Parameters
    ----------
    in_features, hidden_features, out_features : int, default 784, 256 and 10
        Layer widths, each at least 1 and at most ``2**63 - 1`` (torch's int64).
    num_hidden : int, default 1
        Hidden layers, 0 or more. A network whose weights and biases would take more bytes
        (in torch's default dtype) than the whole memory of torch's default device (the
        machine's RAM; a GPU's under ``torch.set_default_device("cuda")``) is refused before
        any layer is built: its layers would otherwise be built one by one until memory ran out.

    Examples
    --------
    >>> import torch
    >>> MLP()(torch.randn(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden_features: int = 256,
        out_features: int = 10,
        num_hidden: int = 1,
    ):
        in_features, hidden_features, out_features = (
            check_int(name, value, hint=_hint(name, example))
            for name, value, example in (
                ("in_features", in_features, 784),
                ("hidden_features", hidden_features, 256),
                ("out_features", out_features, 10),
            )
        )
        num_hidden = check_int("num_hidden", num_hidden, minimum=0, hint=_hint("num_hidden", 1))
        check_fits(  # (before building num_hidden layers one by one)
            f"MLP({in_features}, {hidden_features}, {out_features}, num_hidden={num_hidden})",
            _mlp_weights(in_features, hidden_features, out_features, num_hidden),
            "Pass fewer or narrower hidden layers.",
        )
        super().__init__(_mlp_layers(in_features, hidden_features, out_features, num_hidden))
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.out_features = out_features
        self.num_hidden = num_hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, out_features)``; floating inputs of another dtype are cast to the
        network's, integer ones refused."""
        x = model_input(x, self, type(self).__name__)
        _check_mlp_input(type(self).__name__, x, self.in_features)
        return run_children(self, x)


def _lenet_layers(in_channels: int, num_classes: int) -> OrderedDict[str, nn.Module]:
    return OrderedDict(
        conv1=nn.Conv2d(in_channels, 6, 5),
        relu1=nn.ReLU(),
        pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(6, 16, 5),
        relu2=nn.ReLU(),
        pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(),
        fc1=nn.Linear(256, 120),
        relu3=nn.ReLU(),
        fc2=nn.Linear(120, 84),
        relu4=nn.ReLU(),
        fc3=nn.Linear(84, num_classes),
    )


class LeNet(nn.Sequential):
    """The classic LeNet for 28x28 images, returning logits.

    conv 6@5x5, ReLU, max-pool 2, conv 16@5x5, ReLU, max-pool 2, fc 256 -> 120 -> 84 -> C
    (ReLU between), as in torch-uncertainty. Input ``(B, in_channels, 28, 28)``.

    Examples
    --------
    >>> import torch
    >>> LeNet()(torch.randn(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        in_channels = check_int("in_channels", in_channels, hint=_hint("in_channels", 1))
        num_classes = check_int("num_classes", num_classes, hint=_hint("num_classes", 10))
        super().__init__(_lenet_layers(in_channels, num_classes))
        self.in_channels = in_channels
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)``; floating inputs of another dtype are cast to the
        network's, integer ones refused."""
        x = model_input(x, self, type(self).__name__)
        _check_lenet_input(type(self).__name__, x, self.in_channels)
        return run_children(self, x)


class _Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a skip connection (1x1 conv when the shape
    changes), as in ResNet's basic block."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResidualCNN(nn.Module):
    """A small residual CNN with BatchNorm for 28x28 images: the "bring your own network"
    example (not an ``nn.Sequential``: skip connections and nested blocks).

    A 3x3 stem convolution, three basic blocks (two 3x3 convolutions each, a 1x1 convolution
    on the skip path where the resolution halves: widths ``width``, ``2 * width``,
    ``4 * width`` at 28, 14 and 7 pixels), global average pooling and a linear layer; nine
    convolutions in all, each followed by BatchNorm.

    Examples
    --------
    >>> import torch
    >>> net = ResidualCNN()
    >>> net(torch.randn(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    >>> sum(isinstance(m, nn.Conv2d) for m in net.modules())
    9
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16):
        super().__init__()
        in_channels, num_classes, width = (
            check_int(name, value, hint=_hint(name, example))
            for name, value, example in (
                ("in_channels", in_channels, 1),
                ("num_classes", num_classes, 10),
                ("width", width, 16),
            )
        )
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.layer1 = _Block(width, width, 1)
        self.layer2 = _Block(width, 2 * width, 2)
        self.layer3 = _Block(2 * width, 4 * width, 2)
        self.fc = nn.Linear(4 * width, num_classes)
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, num_classes)`` of images ``(B, in_channels, H, W)`` (any H, W >= 1);
        floating inputs of another dtype are cast to the network's, integer ones refused."""
        x = model_input(x, self, type(self).__name__)
        said = f"ResidualCNN expects images of shape (B, {self.in_channels}, H, W), got shape "
        said += str(tuple(x.shape))
        if x.dim() == 4 and x.shape[1] != self.in_channels:
            raise ValueError(_other_channels(said, x.shape[1], self.in_channels))
        if x.dim() == 3 and x.shape[0] == self.in_channels:
            raise ValueError(f"{said}: one image without its batch dim. {ONE_EXAMPLE}")
        if x.dim() != 4:
            raise ValueError(
                f"{said}. Use load_mnist(flatten=False), or x.view(-1, {self.in_channels}, 28, "
                "28) for flat 28x28 inputs."
            )
        h = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(h.mean((-2, -1)))
