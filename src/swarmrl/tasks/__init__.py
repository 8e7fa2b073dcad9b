"""Tasks: a prompt source plus a verifier (DESIGN §3)."""
