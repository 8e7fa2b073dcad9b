"""The front gate: a request with a body is proven signed, and its body checked as
bounded JSON, before the application parses a byte of it.

FastAPI parses a route's JSON body before the route's dependencies run, so a signature
check in a dependency comes too late: a stranger's body would reach Python's JSON
scanner first. That scanner recurses once per nested bracket, and a library may raise the
interpreter's recursion limit past what the C stack holds (`py_ecc`, which eth-account
imported, set 100,000): one unsigned body of 70,000 nested brackets crashed the process. The
gate runs first, as ASGI middleware, on every request that carries a JSON body to parse
(a request a POST route takes: the other routes take none; the rollout upload is a PUT
of raw bytes, whose signature covers the hash it claims and is checked before the stream
is read; a path or method no route takes gets its 404 or 405 from the application, which
reads no body):

1. the body is read whole (the body limit in front of the gate caps it at 1 MiB);
2. the signature is checked over its bytes (`RequestVerifier`: no ledger, no parse);
   a refusal answers at once and nothing is parsed;
3. a non-empty body must be JSON that `pydantic_core.from_json` parses: it is linear in
   the body's size and refuses nesting deeper than about 200 without recursing deeper;
4. the proven caller is handed to the route in the request's scope (`CALLER`), and the
   buffered body is handed on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pydantic_core
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute, Match

from swarmrl.identity import body_digest
from swarmrl.orchestrator.auth import RequestVerifier
from swarmrl.orchestrator.errors import Refusal

CALLER = "swarmrl.caller"  # scope key: the `Caller` the gate proved


def request_path(scope) -> str:
    """The path and query exactly as sent: what the sender signed."""
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    text = path.decode("latin-1")
    return f"{text}?{query.decode('latin-1')}" if query else text


class SignedJsonGate:
    """ASGI middleware: see the module docstring. `routes` gives the application's routes
    (asked per request: they are added after the middleware)."""

    def __init__(self, app, verifier: RequestVerifier, routes: Callable[[], Sequence[BaseRoute]]):
        self.app = app
        self.verifier = verifier
        self.routes = routes

    def _gated(self, scope) -> bool:
        # Only POST routes parse a body; the others' dependency checks the signature.
        if scope["type"] != "http" or scope["method"] != "POST":
            return False
        return any(route.matches(scope)[0] == Match.FULL for route in self.routes())

    async def __call__(self, scope, receive, send) -> None:
        if not self._gated(scope):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(receive)
            if body is None:
                return  # the sender went away: nobody to answer
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            caller = self.verifier.verify(
                scope["method"], request_path(scope), headers, body_digest(body)
            )
            if body:
                try:
                    pydantic_core.from_json(body)
                except ValueError as exc:
                    raise Refusal(
                        400, "invalid", f"the body is not JSON: {str(exc)[:200]}"
                    ) from None
        except Refusal as refused:
            response = JSONResponse(refused.problem(), status_code=refused.status)
            await response(scope, receive, send)
            return
        delivered = False

        async def replay():
            nonlocal delivered
            if delivered:
                return await receive()  # after the body: the disconnect, when it comes
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope | {CALLER: caller}, replay, send)

    @staticmethod
    async def _read(receive) -> bytes | None:
        parts: list[bytes] = []
        while True:
            message = await receive()  # the body limit raises Refusal(413) past its cap
            if message["type"] == "http.disconnect":
                return None
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(parts)
