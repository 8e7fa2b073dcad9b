"""swarmrl: asynchronous GRPO post-training on a swarm of untrusted machines."""

__version__ = "0.1.0"
