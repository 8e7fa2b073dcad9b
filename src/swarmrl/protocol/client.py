"""The one HTTP client every role uses to talk to the orchestrator; every request signed.

Methods mirror the API, one per endpoint, and return the shared pydantic models. A
refusal raises `PoolRefused` carrying the HTTP status, the refusal's code (`api.RefusalCode`:
callers branch on it, never on the wording) and the orchestrator's reason.
A connection error (the orchestrator restarting) is retried with doubling delays for up
to `retry_seconds`, each attempt signed afresh; then `PoolUnreachable` is raised.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO
from urllib.parse import urlencode

import httpx
import pydantic_core
from pydantic import BaseModel

from swarmrl.backoff import backoff_delay
from swarmrl.identity import PROTOCOL, Identity, body_digest, sign_request
from swarmrl.protocol import models as api

log = logging.getLogger("swarmrl.protocol")


class PoolRefused(RuntimeError):
    """The orchestrator refused a request: `status`, its `code` and its one-line reason.

    `code` is None where the answer carried no known code (a proxy's error page, or an
    orchestrator's own failure)."""

    def __init__(
        self,
        status: int,
        detail: str,
        method: str,
        path: str,
        code: api.RefusalCode | None = None,
    ) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail


def _refusal_code(problem: object) -> api.RefusalCode | None:
    code = problem.get("code") if isinstance(problem, dict) else None
    return next((c for c in api.REFUSAL_CODES if c == code), None)


class PoolUnreachable(ConnectionError):
    """The orchestrator did not answer within the client's retry budget."""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.cache
def shared_tls() -> ssl.SSLContext:
    """One TLS context for every client of the process: building one (httpx's default,
    certifi's bundle) costs ~30-90 ms, paid per client otherwise."""
    return httpx.create_ssl_context()


class PoolClient:
    def __init__(
        self,
        url: str,
        identity: Identity | None,
        timeout: float = 60.0,
        retry_seconds: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.identity = identity
        self.http = httpx.Client(base_url=self.url, timeout=timeout, verify=shared_tls())
        self.retry_seconds = retry_seconds
        self.sleep = sleep
        self._pool: str | None = None  # the pool id requests sign, asked for on first use

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> PoolClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def address(self) -> str:
        if self.identity is None:
            raise ValueError("this client has no key; pass an Identity to sign requests")
        return self.identity.address

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        query: dict | None = None,
        open_content: Callable[[], IO[bytes]] | None = None,
        content_sha256: str | None = None,
        stream: bool = False,
        signed: bool = True,
    ) -> httpx.Response:
        """One request, signed when this client has a key (and `signed`), retried on
        connection errors; `open_content` opens a streamed body anew for each attempt."""
        if query:
            path = f"{path}?{urlencode(query)}"
        give_up = time.monotonic() + self.retry_seconds
        failures = 0
        while True:
            try:
                response = self._attempt(
                    method, path, body, open_content, content_sha256, stream, signed
                )
                break
            except httpx.TransportError as exc:
                failures += 1
                delay = backoff_delay(failures, 0.25, 5.0)
                if time.monotonic() + delay > give_up:
                    raise PoolUnreachable(
                        f"{method} {path}: orchestrator at {self.url} unreachable for "
                        f"{self.retry_seconds:.0f} s ({exc.__class__.__name__}: {exc})"
                    ) from exc
                log.warning("%s %s: %s; retrying in %.2f s", method, path, exc, delay)
                self.sleep(delay)
        if response.status_code >= 400:
            if stream:
                response.read()
            try:
                problem = pydantic_core.from_json(response.content)  # bounded nesting
            except ValueError:
                problem = None
            detail = problem.get("detail") if isinstance(problem, dict) else None
            if detail is None:
                detail = response.text[:1000]
            raise PoolRefused(
                response.status_code, str(detail), method, path, code=_refusal_code(problem)
            )
        return response

    def _attempt(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        open_content: Callable[[], IO[bytes]] | None,
        content_sha256: str | None,
        stream: bool,
        signed: bool,
    ) -> httpx.Response:
        headers = {}
        content: bytes | IO[bytes] | None = None
        if body is not None:
            content = body.model_dump_json().encode()
            headers["Content-Type"] = "application/json"
        digest = content_sha256 or body_digest(content if isinstance(content, bytes) else b"")
        if self.identity is not None and signed:
            headers.update(sign_request(self.identity, method, path, digest, pool=self.pool()))
        fh = open_content() if open_content is not None else None
        try:
            request = self.http.build_request(
                method, path, content=fh if fh is not None else content, headers=headers
            )
            return self.http.send(request, stream=stream)
        finally:
            if fh is not None:
                fh.close()

    def pool(self) -> str:
        """The id of the pool this orchestrator serves, which every signed request names
        (asked once: it changes only with the orchestrator's secret or run id)."""
        if self._pool is None:
            try:
                r = self._send("GET", "/v1/signing", signed=False)
            except PoolRefused as exc:
                if exc.status != 404:
                    raise
                raise PoolRefused(
                    426,
                    f"the orchestrator at {self.url} does not say which pool it serves: it is "
                    f"older than this client, which signs {PROTOCOL}; upgrade the orchestrator",
                    "GET",
                    "/v1/signing",
                    code="old_protocol",
                ) from None
            info = api.SigningInfo.model_validate_json(r.content)
            if info.protocol != PROTOCOL:
                raise PoolRefused(
                    426,
                    f"the orchestrator at {self.url} speaks {info.protocol}, this client "
                    f"{PROTOCOL}: run the same swarmrl version on both",
                    "GET",
                    "/v1/signing",
                    code="old_protocol",
                )
            self._pool = info.pool
        return self._pool

    # -- every member -------------------------------------------------------------------

    def register(
        self, role: api.Role, url: str | None = None, recipe: api.Recipe | None = None
    ) -> api.Member:
        """Join the pool; `recipe` (this member's) is refused with 409 where it differs
        from the pool's."""
        r = self._send(
            "POST", "/v1/register", body=api.RegisterRequest(role=role, url=url, recipe=recipe)
        )
        return api.Member.model_validate_json(r.content)

    def recipe(self) -> api.Recipe:
        r = self._send("GET", "/v1/recipe")
        return api.Recipe.model_validate_json(r.content)

    def heartbeat(
        self, policy_step: int | None = None, bytes_served: int | None = None
    ) -> api.HeartbeatResponse:
        body = api.HeartbeatRequest(policy_step=policy_step, bytes_served=bytes_served)
        r = self._send("POST", "/v1/heartbeat", body=body)
        return api.HeartbeatResponse.model_validate_json(r.content)

    def status(self) -> api.PoolStatus:
        r = self._send("GET", "/v1/status", signed=False)
        return api.PoolStatus.model_validate_json(r.content)

    # -- workers ------------------------------------------------------------------------

    def assignment(self, policy_step: int) -> api.AssignmentResponse:
        r = self._send(
            "POST", "/v1/assignments", body=api.AssignmentRequest(policy_step=policy_step)
        )
        return api.AssignmentResponse.model_validate_json(r.content)

    def upload(self, assignment_id: int, path: Path) -> api.SubmissionInfo:
        """Stream a rollout file for an open assignment; its SHA-256 is signed."""
        path = Path(path)
        sha256 = _file_sha256(path)
        r = self._send(
            "PUT",
            f"/v1/assignments/{assignment_id}/rollout",
            query={"sha256": sha256},
            open_content=lambda: open(path, "rb"),  # noqa: SIM115 (_attempt closes it)
            content_sha256=sha256,
        )
        return api.SubmissionInfo.model_validate_json(r.content)

    # -- the trainer --------------------------------------------------------------------

    def submissions_for_step(self, step: int) -> api.SubmissionList:
        r = self._send("GET", f"/v1/steps/{step}/submissions")
        return api.SubmissionList.model_validate_json(r.content)

    def download(self, file_hash: str, dest: Path) -> Path:
        """Fetch a submission's file to `dest` (written whole, then renamed); checks its hash.
        A connection lost mid-file starts the download again (within the retry budget)."""
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.part")
        give_up = time.monotonic() + self.retry_seconds
        failures = 0
        while True:
            digest = hashlib.sha256()
            response = self._send("GET", f"/v1/submissions/{file_hash}/file", stream=True)
            try:
                with open(tmp, "wb") as fh:
                    for block in response.iter_bytes():
                        digest.update(block)
                        fh.write(block)
                break
            except httpx.TransportError as exc:
                failures += 1
                delay = backoff_delay(failures, 0.25, 5.0)
                if time.monotonic() + delay > give_up:
                    raise PoolUnreachable(f"download of {file_hash} kept failing: {exc}") from exc
                self.sleep(delay)
            finally:
                response.close()
        if digest.hexdigest() != file_hash:
            tmp.unlink()
            raise PoolRefused(
                502,
                f"downloaded bytes hash to {digest.hexdigest()}",
                "GET",
                file_hash,
                code="bad_file",
            )
        tmp.replace(dest)
        return dest

    def mark_trained(self, step: int, file_hashes: list[str]) -> int:
        r = self._send(
            "POST",
            "/v1/submissions/trained",
            body=api.MarkTrainedRequest(step=step, file_hashes=file_hashes),
        )
        return api.MarkTrainedResponse.model_validate_json(r.content).marked

    def report_progress(
        self, step: int, usable: int, read: int, files: Sequence[str] = (), full: bool = False
    ) -> api.StepStatus:
        """The trainer's own count of a step (`files`: the submissions it covers)."""
        r = self._send(
            "POST",
            f"/v1/steps/{step}/progress",
            body=api.ProgressReport(usable=usable, read=read, files=list(files), full=full),
        )
        return api.StepStatus.model_validate_json(r.content)

    def report_metrics(self, report: api.MetricsReport) -> None:
        """The trainer's metrics of a trained step, for the dashboard's curves."""
        self._send("POST", "/v1/metrics", body=report)

    def announce_checkpoint(
        self, step: int, blake3: str, final: bool = False
    ) -> api.HeartbeatResponse:
        r = self._send(
            "POST",
            "/v1/checkpoints",
            body=api.CheckpointAnnouncement(step=step, blake3=blake3, final=final),
        )
        return api.HeartbeatResponse.model_validate_json(r.content)

    # -- validators ---------------------------------------------------------------------

    def next_for_validation(self, wait: float = 0.0) -> api.ValidationTask:
        """The next file to judge; `wait` > 0: with none, the orchestrator holds the
        request up to that many seconds for an upload (a long poll)."""
        path = "/v1/validation/next" + (f"?wait={wait:g}" if wait > 0 else "")
        r = self._send("POST", path)
        return api.ValidationTask.model_validate_json(r.content)

    def submission(self, file_hash: str) -> api.ValidationTask:
        """The submission with this file hash and its assignment (with the issued seed)."""
        r = self._send("GET", f"/v1/submissions/{file_hash}/assignment")
        return api.ValidationTask.model_validate_json(r.content)

    def post_verdict(
        self, file_hash: str, accepted: bool, reason: str = "", soft: bool = False
    ) -> api.VerdictResponse:
        """A verdict; `soft` (not accepted, not the worker's proven fault) voids the file
        without slashing."""
        r = self._send(
            "POST",
            "/v1/verdicts",
            body=api.VerdictRequest(
                file_hash=file_hash, accepted=accepted, reason=reason, soft=soft
            ),
        )
        return api.VerdictResponse.model_validate_json(r.content)

    # -- the pool owner -----------------------------------------------------------------

    def fund(self, address: str, amount: float) -> api.Account:
        """Add `amount` to an address's balance (the pool owner's key only)."""
        r = self._send(
            "POST", "/v1/pool/fund", body=api.FundRequest(address=address, amount=amount)
        )
        return api.Account.model_validate_json(r.content)
