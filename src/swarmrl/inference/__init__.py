"""Inference: the worker process that turns assignments into rollout files, and the cheats it can play."""
