"""Experiments on a GPT through its hook points (`glassllm.models.hooks`)."""
