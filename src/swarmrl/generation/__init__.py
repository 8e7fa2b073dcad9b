"""Generation: the sampling loop every role that runs the policy shares.

``sampler`` draws batched, KV-cached samples with per-sample counter-based randomness and
the final-norm hidden states TOPLOC hashes; ``fast_llama`` is the Llama-family decoder
it runs on, which the validator's teacher-forced prefill reuses; ``rollout`` turns one
assignment into scored, grouped samples. The worker (``inference/``) writes what
``rollout`` makes, the validator (``validator/``) replays ``sampler``'s draws, and the
difficulty filter (``tasks/filtering.py``) measures pass rates on the same path, so the
three can never drift apart. No module here imports a role.
"""
