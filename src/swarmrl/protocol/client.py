"""The one HTTP client every role uses to talk to the orchestrator; every request signed.

Methods mirror the API, one per endpoint, and return the shared pydantic models. A
refusal raises `PoolRefused` carrying the HTTP status and the orchestrator's reason.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlencode

import httpx
from pydantic import BaseModel

from swarmrl.identity import Identity, body_digest, sign_request
from swarmrl.protocol import models as api


class PoolRefused(RuntimeError):
    """The orchestrator refused a request: `status` and its one-line reason."""

    def __init__(self, status: int, detail: str, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class PoolClient:
    def __init__(self, url: str, identity: Identity | None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.identity = identity
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

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
        content=None,
        content_sha256: str | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        if query:
            path = f"{path}?{urlencode(query)}"
        headers = {}
        if body is not None:
            content = body.model_dump_json().encode()
            headers["Content-Type"] = "application/json"
        digest = content_sha256 or body_digest(content or b"")
        if self.identity is not None:
            headers.update(sign_request(self.identity, method, path, digest))
        request = self.http.build_request(method, path, content=content, headers=headers)
        response = self.http.send(request, stream=stream)
        if response.status_code >= 400:
            if stream:
                response.read()
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise PoolRefused(response.status_code, str(detail), method, path)
        return response

    # -- every member -------------------------------------------------------------------

    def register(self, role: api.Role, url: str | None = None) -> api.Member:
        r = self._send("POST", "/v1/register", body=api.RegisterRequest(role=role, url=url))
        return api.Member.model_validate_json(r.content)

    def heartbeat(self, policy_step: int | None = None) -> api.HeartbeatResponse:
        r = self._send("POST", "/v1/heartbeat", body=api.HeartbeatRequest(policy_step=policy_step))
        return api.HeartbeatResponse.model_validate_json(r.content)

    def status(self) -> api.PoolStatus:
        r = self._send("GET", "/v1/status")
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
        with open(path, "rb") as fh:
            r = self._send(
                "PUT",
                f"/v1/assignments/{assignment_id}/rollout",
                query={"sha256": sha256},
                content=fh,
                content_sha256=sha256,
            )
        return api.SubmissionInfo.model_validate_json(r.content)

    # -- the trainer --------------------------------------------------------------------

    def submissions_for_step(self, step: int) -> api.SubmissionList:
        r = self._send("GET", f"/v1/steps/{step}/submissions")
        return api.SubmissionList.model_validate_json(r.content)

    def download(self, file_hash: str, dest: Path) -> Path:
        """Fetch a submission's file to `dest` (written whole, then renamed); checks its hash."""
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.part")
        digest = hashlib.sha256()
        response = self._send("GET", f"/v1/submissions/{file_hash}/file", stream=True)
        try:
            with open(tmp, "wb") as fh:
                for block in response.iter_bytes():
                    digest.update(block)
                    fh.write(block)
        finally:
            response.close()
        if digest.hexdigest() != file_hash:
            tmp.unlink()
            raise PoolRefused(
                502, f"downloaded bytes hash to {digest.hexdigest()}", "GET", file_hash
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

    def next_for_validation(self) -> api.ValidationTask:
        r = self._send("POST", "/v1/validation/next")
        return api.ValidationTask.model_validate_json(r.content)

    def post_verdict(self, file_hash: str, accepted: bool, reason: str = "") -> api.VerdictResponse:
        r = self._send(
            "POST",
            "/v1/verdicts",
            body=api.VerdictRequest(file_hash=file_hash, accepted=accepted, reason=reason),
        )
        return api.VerdictResponse.model_validate_json(r.content)
