"""The refusals a request can meet: an HTTP status and a one-line reason the sender can act on.

Their own module so that the signature checks (`auth`), the request gate (`gate`), the
app and the pool's rules all raise the same types without importing one another.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request the pool refuses: HTTP status and a one-line reason."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Replayed(Refusal):
    """A signed request whose nonce its sender already used inside the window."""

    def __init__(self) -> None:
        super().__init__(401, "nonce already used by this address (replayed request)")
