"""Containers: `Sequential` chains modules, `ModuleList` holds them for a forward written by hand.

Both register their items as children named ``"0"``, ``"1"``, ..., so parameter names read
``blocks.0.attn.qkv.weight`` exactly as in PyTorch.

>>> import glassllm.nn as nn
>>> blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
>>> _ = blocks.append(nn.ReLU())
>>> len(blocks), [name for name, _ in blocks.named_parameters()]
(3, ['0.weight', '0.bias', '1.weight', '1.bias'])
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, overload

from glassllm.nn.module import Module


def _check_module(item: Any, container: str) -> Module:
    if not isinstance(item, Module):
        raise TypeError(f"{container} holds Modules, got {type(item).__name__}")
    return item


class ModuleList(Module):
    """A list of modules registered as children ``"0"``, ``"1"``, ...; it has no forward of its own.

    Supports ``append``, ``extend``, ``insert``, ``len``, iteration, indexing (negative indices
    too), slicing (returns a new ModuleList sharing the same modules) and ``list[i] = module``.
    """

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, index: int) -> int:
        if not isinstance(index, int):
            raise TypeError(
                f"ModuleList indices must be integers or slices, got {type(index).__name__}"
            )
        length = len(self)
        if not -length <= index < length:
            raise IndexError(f"ModuleList index {index} out of range for length {length}")
        return index % length

    @overload
    def __getitem__(self, index: int) -> Module: ...

    @overload
    def __getitem__(self, index: slice) -> ModuleList: ...

    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        return self._modules[str(self._index(index))]

    def __setitem__(self, index: int, module: Module) -> None:
        self._modules[str(self._index(index))] = _check_module(module, "ModuleList")

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> ModuleList:
        self._modules[str(len(self))] = _check_module(module, "ModuleList")
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        items = [_check_module(module, "ModuleList") for module in modules]  # check all, then add
        for module in items:
            self._modules[str(len(self))] = module
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, _check_module(module, "ModuleList"))
        self._modules.clear()
        for position, item in enumerate(items):
            self._modules[str(position)] = item

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ModuleList has no forward(): iterate over it in your own module's forward"
        )


class Sequential(Module):
    """Run modules one after another: ``Sequential(a, b, c)(x) == c(b(a(x)))``.

    Children are named ``"0"``, ``"1"``, ...; pass a single mapping (e.g. a dict) to choose names.
    Supports ``len``, iteration and indexing like `ModuleList`.

    >>> import numpy as np, glassllm.nn as nn
    >>> from glassllm import Tensor
    >>> mlp = nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2))
    >>> mlp(Tensor(np.ones((4, 3), dtype=np.float32))).shape
    (4, 2)
    """

    def __init__(self, *modules: Module | Mapping[str, Module]) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            named = list(modules[0].items())
        else:
            named = [(str(position), module) for position, module in enumerate(modules)]
        for name, module in named:
            _check_module(module, "Sequential")
            setattr(self, name, module)

    def __getitem__(self, index: int) -> Module:
        if not isinstance(index, int):
            raise TypeError(f"Sequential indices must be integers, got {type(index).__name__}")
        items = list(self._modules.values())
        if not -len(items) <= index < len(items):
            raise IndexError(f"Sequential index {index} out of range for length {len(items)}")
        return items[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x
