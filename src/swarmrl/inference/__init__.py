"""Inference: the batched sampling loop and the worker process that writes rollout files."""
