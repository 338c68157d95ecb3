"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and L2 weight decay."""

from __future__ import annotations

import numpy as np

from glassllm.autograd import no_grad
from glassllm.optim.optimizer import Optimizer, ParamGroup, Params, check_non_negative


class SGD(Optimizer):
    r"""Stochastic gradient descent, the update of ``torch.optim.SGD`` (``maximize=False``).

    Pseudocode, for each parameter ``p`` with gradient ``g`` (lr = γ, momentum = μ,
    dampening = τ, weight_decay = λ)::

        g ← g + λ p                          if λ ≠ 0   (L2 penalty, added to the gradient)
        if μ ≠ 0:
            b ← g                            on the first step (state "momentum_buffer")
            b ← μ b + (1 − τ) g              afterwards
            g ← g + μ b  if nesterov  else  b
        p ← p − γ g

    ``p.grad`` is never modified; ``p.data`` is updated in place. A parameter whose ``grad`` is
    ``None`` is skipped and gets no state.

    Args:
        params: Tensors, ``(name, Tensor)`` pairs or group dicts (see `Optimizer`).
        lr: learning rate γ.
        momentum: μ >= 0; 0 means plain SGD and no state.
        dampening: τ, scales the new gradient's share of the momentum buffer by (1 − τ).
        weight_decay: λ >= 0, the L2 penalty coefficient.
        nesterov: Nesterov momentum (needs momentum > 0 and dampening = 0, as in PyTorch).

    >>> import numpy as np
    >>> from glassllm import Tensor
    >>> w = Tensor(np.array([1.0]), requires_grad=True)
    >>> opt = SGD([w], lr=0.1, momentum=0.9)
    >>> for _ in range(2):
    ...     w.grad = np.array([1.0])
    ...     opt.step()
    >>> w.data  # 1 - 0.1 * 1 - 0.1 * (0.9 * 1 + 1)
    array([0.71])
    """

    array_state_keys = ("momentum_buffer",)

    def __init__(
        self,
        params: Params,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
        super().__init__(params, defaults)

    def _check_group(self, group: ParamGroup) -> None:
        check_non_negative(group, "lr", "momentum", "weight_decay")
        if group["nesterov"] and (group["momentum"] <= 0.0 or group["dampening"] != 0.0):
            raise ValueError("Nesterov momentum requires momentum > 0 and dampening = 0")

    @no_grad()
    def step(self) -> None:
        """Apply one SGD update to every parameter that has a gradient."""
        for group in self.param_groups:
            lr, momentum = float(group["lr"]), float(group["momentum"])
            dampening, weight_decay = float(group["dampening"]), float(group["weight_decay"])
            nesterov = group["nesterov"]
            for name, param, grad in self._grads(group):
                update = self._buffer("update", param)
                if weight_decay != 0.0:
                    # g + λp into a scratch array: p.grad itself stays untouched.
                    decayed = np.multiply(param, weight_decay, out=self._buffer("grad", param))
                    decayed += grad
                    grad = decayed
                if momentum != 0.0:
                    state = self.state.get(name)
                    if state is None:
                        buf = np.array(grad, dtype=param.dtype, order="C", copy=True)
                        self.state[name] = {"momentum_buffer": buf}
                    else:
                        buf = state["momentum_buffer"]
                        buf *= momentum
                        if dampening == 0.0:
                            buf += grad
                        else:
                            buf += np.multiply(grad, 1.0 - dampening, out=update)
                    if nesterov:
                        np.multiply(buf, momentum, out=update)
                        update += grad
                        grad = update
                    else:
                        grad = buf
                np.multiply(grad, -lr, out=update)
                param += update
