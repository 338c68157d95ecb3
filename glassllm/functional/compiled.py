"""The old home of the compiled kernels' switch, now `glassllm.kernels.compiled`: its functions
under this name too (they act on the one switch there)."""

from glassllm.kernels.compiled import enabled, kernels, kernels_for, load, set_enabled

__all__ = ["enabled", "kernels", "kernels_for", "load", "set_enabled"]
