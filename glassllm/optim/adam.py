"""Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019), computed as ``torch.optim``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from glassllm import kernels
from glassllm.autograd import no_grad
from glassllm.optim.optimizer import Optimizer, ParamGroup, Params, check_non_negative


class Adam(Optimizer):
    r"""Adam with an L2 penalty added to the gradient, the update of ``torch.optim.Adam``
    (``amsgrad=False``, ``maximize=False``).

    Pseudocode, for each parameter ``p`` with gradient ``g`` (lr = γ, betas = (β1, β2),
    weight_decay = λ; state: step t, exp_avg m, exp_avg_sq v, starting at 0)::

        t ← t + 1
        g ← g + λ p                              if λ ≠ 0   (L2: decay passes through m and v)
        m ← β1 m + (1 − β1) g                    computed as m + (1 − β1)(g − m), torch's lerp
        v ← β2 v + (1 − β2) g²
        step_size ← γ / (1 − β1^t)
        denom ← sqrt(v) / sqrt(1 − β2^t) + ε
        p ← p − step_size · m / denom

    which is p ← p − γ m̂ / (sqrt(v̂) + ε) with the bias-corrected moments m̂ = m / (1 − β1^t),
    v̂ = v / (1 − β2^t), with ε added exactly where PyTorch adds it.

    The moments have the parameter's dtype (float32 stays float32); the step count is a Python
    int. ``p.grad`` is never modified; ``p.data`` is updated in place. A parameter whose
    ``grad`` is ``None`` is skipped and its step count does not advance. With the ``fast`` extra
    (`glassllm.kernels.compiled`) each parameter's update is one compiled loop of the same
    operations, giving the same bits (`glassllm.kernels.adam`).

    Args:
        params: Tensors, ``(name, Tensor)`` pairs or group dicts (see `Optimizer`).
        lr: learning rate γ.
        betas: (β1, β2), decay rates of the first and second moment, each in [0, 1).
        eps: ε, added to the denominator for numerical stability.
        weight_decay: λ, the L2 penalty (use `AdamW` for decoupled weight decay).

    >>> import numpy as np
    >>> from glassllm import Tensor
    >>> w = Tensor(np.array([1.0, -1.0]), requires_grad=True)
    >>> opt = Adam([w], lr=0.1)
    >>> w.grad = np.array([0.5, -2.0])
    >>> opt.step()
    >>> w.data  # the first Adam step moves each weight by about lr against its gradient's sign
    array([ 0.9, -0.9])
    >>> opt.state["0"]["step"]
    1
    """

    array_state_keys = ("exp_avg", "exp_avg_sq")
    scalar_state_keys = ("step",)
    _decoupled_weight_decay = False

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _check_group(self, group: ParamGroup) -> None:
        check_non_negative(group, "lr", "eps", "weight_decay")
        for index, beta in enumerate(group["betas"]):
            if not 0.0 <= beta < 1.0:
                raise ValueError(
                    f"invalid beta parameter at index {index}: {beta} (need 0 <= beta < 1)"
                )

    @no_grad()
    def step(self) -> None:
        """Apply one Adam (or AdamW) update to every parameter that has a gradient.

        Each parameter's update is `_update`; `glassllm.kernels.adam_in_blocks` runs them in
        blocks over worker threads (and in compiled loops with the ``fast`` extra, same bits).
        """
        for group in self.param_groups:
            updates = []
            # list() first: a bad gradient raises before any parameter's state has moved
            for name, param, grad in list(self._grads(group)):
                state = self.state.get(name)
                if state is None:
                    state = self.state[name] = {
                        "step": 0,
                        "exp_avg": np.zeros_like(param, order="C"),
                        "exp_avg_sq": np.zeros_like(param, order="C"),
                    }
                state["step"] += 1
                updates.append((param, grad, state))
            settings = _Settings.of(group, self._decoupled_weight_decay)
            run = kernels.select(_update_in_order, kernels.adam_in_blocks)
            run(updates, settings, self._update)

    def _update(
        self, param: np.ndarray, grad: np.ndarray, state: dict, settings: _Settings, slot: str
    ) -> None:
        """The pseudocode's arithmetic for one parameter, in place, with scratch ``slot``."""
        lr, eps, weight_decay = settings.lr, settings.eps, settings.weight_decay
        beta1, beta2, step = settings.beta1, settings.beta2, state["step"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        step_size = lr / (1.0 - beta1**step)  # γ / (1 − β1^t)
        bias_correction2_sqrt = (1.0 - beta2**step) ** 0.5  # sqrt(1 − β2^t)
        scratch = self._buffer("scratch" + slot, param)

        if weight_decay != 0.0:
            if settings.decoupled:
                param *= 1.0 - lr * weight_decay  # AdamW: shrink p before the Adam step
            else:
                decayed = np.multiply(param, weight_decay, out=self._buffer("grad" + slot, param))
                decayed += grad  # L2: g + λp, in scratch so p.grad stays untouched
                grad = decayed

        # m ← m + (1 − β1)(g − m)
        np.subtract(grad, exp_avg, out=scratch)
        scratch *= 1.0 - beta1
        exp_avg += scratch
        # v ← β2 v + (1 − β2) g²
        exp_avg_sq *= beta2
        np.multiply(grad, 1.0 - beta2, out=scratch)
        scratch *= grad
        exp_avg_sq += scratch

        # denom ← sqrt(v) / sqrt(1 − β2^t) + ε ;  p ← p − step_size · m / denom
        denom = np.sqrt(exp_avg_sq, out=scratch)
        denom /= bias_correction2_sqrt
        denom += eps
        update = np.divide(exp_avg, denom, out=scratch)
        update *= -step_size
        param += update


@dataclasses.dataclass(frozen=True)
class _Settings:
    """One group's hyperparameters as Python floats (float32 parameters stay float32)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    decoupled: bool

    @classmethod
    def of(cls, group: ParamGroup, decoupled: bool) -> _Settings:
        beta1, beta2 = (float(beta) for beta in group["betas"])
        return cls(
            float(group["lr"]), beta1, beta2, float(group["eps"]),
            float(group["weight_decay"]), decoupled,
        )  # fmt: skip


def _update_in_order(updates: list, settings: _Settings, update_one: Any) -> None:
    """The plain definition of a step: each parameter's update in turn, on this thread."""
    for param, grad, state in updates:
        update_one(param, grad, state, settings, "0")


class AdamW(Adam):
    r"""Adam with decoupled weight decay, the update of ``torch.optim.AdamW`` (``amsgrad=False``).

    Pseudocode, as `Adam` except for where the weight decay acts (state: step t, exp_avg m,
    exp_avg_sq v, starting at 0)::

        t ← t + 1
        p ← p − γ λ p                            decoupled: the decay never enters m or v
        m ← β1 m + (1 − β1) g                    computed as m + (1 − β1)(g − m), torch's lerp
        v ← β2 v + (1 − β2) g²
        step_size ← γ / (1 − β1^t)
        denom ← sqrt(v) / sqrt(1 − β2^t) + ε
        p ← p − step_size · m / denom

    The decay is scaled by the current learning rate γ, so a schedule that lowers γ also lowers
    the decay, as in PyTorch. To exempt biases and LayerNorm gains, put them in a group with
    ``weight_decay=0.0`` (what ``GPT.configure_optimizer`` does).

    Args:
        params: Tensors, ``(name, Tensor)`` pairs or group dicts (see `Optimizer`).
        lr: learning rate γ.
        betas: (β1, β2), decay rates of the first and second moment, each in [0, 1).
        eps: ε, added to the denominator for numerical stability.
        weight_decay: λ, the decoupled weight decay (default 1e-2, as PyTorch).

    >>> import numpy as np
    >>> from glassllm import Tensor
    >>> w = Tensor(np.array([2.0]), requires_grad=True)
    >>> opt = AdamW([w], lr=0.1, weight_decay=0.5)
    >>> w.grad = np.array([0.0])
    >>> opt.step()
    >>> w.data  # zero gradient: only the decay acts, 2 * (1 - 0.1 * 0.5)
    array([1.9])
    """

    _decoupled_weight_decay = True

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
