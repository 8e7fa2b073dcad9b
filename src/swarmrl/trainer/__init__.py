"""The GRPO trainer: reads accepted rollouts, takes optimizer steps, writes checkpoints."""
