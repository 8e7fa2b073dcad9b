"""Tasks: a prompt source plus a verifier (docs/architecture.md §3)."""
