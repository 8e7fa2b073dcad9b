"""The refusals a request can meet: an HTTP status, a code and a one-line reason the sender
can act on.

Their own module so that the signature checks (`auth`), the request gate (`gate`), the
app and the pool's rules all raise the same types without importing one another. The
code (`api.RefusalCode`) travels in the refused request's body with the reason, so a
client branches on the kind of refusal, never on its wording.
"""

from __future__ import annotations

from swarmrl.protocol.models import Problem, RefusalCode


class Refusal(Exception):
    """A request the pool refuses: HTTP status, the kind of refusal and a one-line reason."""

    def __init__(self, status: int, code: RefusalCode, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail

    def problem(self) -> dict[str, str]:
        """The refused request's JSON body (`api.Problem`)."""
        return Problem(code=self.code, detail=self.detail).model_dump()


class Replayed(Refusal):
    """A signed request whose nonce its sender already used inside the window."""

    def __init__(self) -> None:
        super().__init__(401, "replayed", "nonce already used by this address (replayed request)")
