"""The orchestrator's HTTP API (FastAPI): thin routes over `Pool`, signed requests only.

Every route except the public pool status and the dashboard (`dashboard.py`) takes a
signed request (see `auth.py`).
Uploads stream to a temporary file while their size is capped and their SHA-256
computed; the signature covers the hash the sender claims in the query, and the bytes
must hash to it. The OpenAPI schema is served at `/openapi.json`.
"""

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from swarmrl.identity import PROTOCOL, body_digest
from swarmrl.ledger import Ledger
from swarmrl.orchestrator.arrivals import MAX_WAIT_SECONDS
from swarmrl.orchestrator.auth import Caller, RateLimiter, RequestVerifier, pool_id
from swarmrl.orchestrator.config import OrchestratorConfig
from swarmrl.orchestrator.dashboard import add_dashboard
from swarmrl.orchestrator.errors import Refusal
from swarmrl.orchestrator.gate import CALLER, SignedJsonGate, request_path
from swarmrl.orchestrator.membership import read_allowlist
from swarmrl.orchestrator.pool import Pool
from swarmrl.orchestrator.store import RolloutStore
from swarmrl.orchestrator.uploads import UploadedFile
from swarmrl.protocol import models as api

log = logging.getLogger("swarmrl.orchestrator")

MAX_JSON_BYTES = 1 << 20
HASH = r"^[0-9a-f]{64}$"
# The gate answers 400 for a body that is not bounded JSON; `invalid` answers 422 in one
# line (not FastAPI's default list of errors).
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": api.Problem, "description": "the body is not JSON, or nested too deep"},
    401: {"model": api.Problem, "description": "bad signature, timestamp or nonce"},
    403: {"model": api.Problem, "description": "unregistered sender or wrong role"},
    422: {"model": api.Problem, "description": "a malformed parameter or body"},
    429: {"model": api.Problem, "description": "over the sender's rate limit"},
}


def load_or_create_secret(path: Path) -> bytes:
    """The orchestrator's secret (hex in a 0600 file), made on first start."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
    try:
        secret = bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise ValueError(f"{path} must hold the orchestrator secret as hex") from None
    if len(secret) < 16:
        raise ValueError(f"{path}: the secret must be at least 16 bytes")
    return secret


def signed_path(request: Request) -> str:
    """The path and query exactly as sent: what the sender signed."""
    return request_path(request.scope)


class BodyLimit:
    """ASGI middleware: refuse a body over the route's limit, declared or streamed, before
    the application buffers it (rollout uploads get the upload limit, the rest 1 MiB)."""

    def __init__(self, app, upload_limit: int) -> None:
        self.app = app
        self.upload_limit = upload_limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.upload_limit if scope["path"].endswith("/rollout") else MAX_JSON_BYTES
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            too_large = Refusal(
                413, "too_large", f"body of {int(declared)} bytes is over the {limit}-byte limit"
            )
            response = JSONResponse(too_large.problem(), status_code=too_large.status)
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise Refusal(413, "too_large", f"body is over the {limit}-byte limit")
            return message

        await self.app(scope, limited_receive, send)


def create_app(config: OrchestratorConfig, clock: Callable[[], float] = time.time) -> FastAPI:
    ledger = Ledger(config.ledger)
    store = RolloutStore(config.store)
    secret = load_or_create_secret(Path(config.secret_file))
    pool = Pool(
        config,
        ledger,
        store,
        secret,
        read_allowlist(config.allowlist),
        clock=clock,
        limiter=RateLimiter(config.rate_per_second, config.rate_burst),
        joins=RateLimiter(config.join_rate_per_second, config.join_burst),
    )
    signing = api.SigningInfo(protocol=PROTOCOL, pool=pool_id(secret, config.run_id))
    verifier = RequestVerifier(config.timestamp_window, signing.pool)
    spool = tempfile.TemporaryDirectory(prefix="swarmrl-uploads-")

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async def sweep_forever() -> None:
            while True:
                try:
                    await run_in_threadpool(pool.sweep)
                except Exception:  # a transient database error must not stop the sweeps
                    log.exception("sweep failed; retrying")
                await asyncio.sleep(config.sweep_seconds)

        task = asyncio.create_task(sweep_forever())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            spool.cleanup()
            ledger.close()

    app = FastAPI(
        title="swarmrl orchestrator",
        version="1",
        description="The pool's front door: identities, heartbeats, assignments, uploads, "
        "submissions for the trainer, validation and verdicts. Requests are signed (X-Pool, "
        "X-Address, X-Timestamp, X-Nonce, X-Signature: EIP-191 over 'swarmrl/2\\n<pool id>"
        "\\n<METHOD>\\n<path?query>\\n<sha256 of body>\\n<timestamp>\\n<nonce>'; the pool id "
        "is served at GET /v1/signing).",
        lifespan=lifespan,
    )
    app.state.pool = pool
    # Added last, run first: the body limit, then the gate (signature, bounded JSON).
    app.add_middleware(SignedJsonGate, verifier=verifier, routes=lambda: app.routes)
    app.add_middleware(BodyLimit, upload_limit=config.max_upload_bytes)

    @app.exception_handler(Refusal)
    async def refused(_request: Request, exc: Refusal) -> JSONResponse:
        return JSONResponse(exc.problem(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def unrouted(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The router's own answers (no such route, method not allowed) carry a code too.
        code: api.RefusalCode = "not_found" if exc.status_code == 404 else "invalid"
        return JSONResponse(
            api.Problem(code=code, detail=str(exc.detail)).model_dump(),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # One line naming each bad field; the sender's values are not echoed back (they
        # may not even be JSON-encodable, e.g. NaN).
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(Refusal(422, "invalid", problems).problem(), status_code=422)

    async def signed(request: Request) -> Caller:
        # On the event loop: the checks need no ledger (a fraction of a millisecond), and a
        # thread hand-off would cost more than they do. The route's act spends the nonce.
        # A request with a body was proven by the gate before its body was parsed.
        if CALLER in request.scope:
            return request.scope[CALLER]
        body = await request.body()
        return verifier.verify(
            request.method, signed_path(request), request.headers, body_digest(body)
        )

    Signed = Annotated[Caller, Depends(signed)]
    add_dashboard(app, pool)

    @app.get("/v1/signing", response_model=api.SigningInfo, tags=["public"])
    def signing_info() -> api.SigningInfo:
        """What a request to this pool signs: the protocol and the pool id its text names."""
        return signing

    @app.get("/v1/status", response_model=api.PoolStatus, tags=["public"])
    def status() -> api.PoolStatus:
        """The pool at a glance: members, health, steps, submissions, verdicts, contributions."""
        return pool.status()

    @app.get("/v1/recipe", response_model=api.Recipe, tags=["public"])
    def recipe() -> api.Recipe:
        """What every member must agree on (run id, steps, batch samples, prompts per
        assignment, group size, async level): a registration stating another is refused."""
        return pool.recipe

    @app.post(
        "/v1/register",
        response_model=api.Member,
        responses={
            **ERRORS,
            402: {"model": api.Problem, "description": "balance short of the worker stake"},
            409: {"model": api.Problem, "description": "registered in another role"},
        },
        tags=["members"],
    )
    def register(req: api.RegisterRequest, caller: Signed) -> api.Member:
        """Join the pool: workers by signature; trainer, validators and relays by allowlist."""
        return pool.register(caller, req)

    @app.post(
        "/v1/heartbeat", response_model=api.HeartbeatResponse, responses=ERRORS, tags=["members"]
    )
    def heartbeat(req: api.HeartbeatRequest, caller: Signed) -> api.HeartbeatResponse:
        """Alive: answers the current step, async bound, newest checkpoint and relays."""
        return pool.heartbeat(caller, req)

    @app.post(
        "/v1/assignments", response_model=api.AssignmentResponse, responses=ERRORS, tags=["workers"]
    )
    def assignment(req: api.AssignmentRequest, caller: Signed) -> api.AssignmentResponse:
        """Ask for work: an assignment (id, step, seed) if a step still needs samples."""
        return pool.request_assignment(caller, req)

    @app.put(
        "/v1/assignments/{assignment_id}/rollout",
        response_model=api.SubmissionInfo,
        status_code=201,
        responses={
            **ERRORS,
            400: {"model": api.Problem, "description": "the bytes do not hash to sha256"},
            404: {"model": api.Problem, "description": "assignment never issued"},
            409: {
                "model": api.Problem,
                "description": "assignment closed, or file already submitted",
            },
            413: {"model": api.Problem, "description": "file over the size limit"},
            422: {"model": api.Problem, "description": "unreadable file, or metadata disagrees"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            }
        },
        tags=["workers"],
    )
    async def upload(
        request: Request,
        assignment_id: Annotated[int, PathParam(ge=1, le=2**31 - 1)],
        sha256: Annotated[str, Query(pattern=HASH, description="SHA-256 hex of the file (signed)")],
    ) -> api.SubmissionInfo:
        """Upload the rollout file of an open assignment (raw bytes, streamed)."""
        caller = verifier.verify(request.method, signed_path(request), request.headers, sha256)
        await run_in_threadpool(pool.check_upload_target, caller, assignment_id)
        limit = config.max_upload_bytes
        fd, tmp = tempfile.mkstemp(dir=spool.name, suffix=".parquet")
        try:
            digest, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as fh:
                try:
                    async for chunk in request.stream():
                        size += len(chunk)
                        if size > limit:
                            raise Refusal(413, "too_large", f"file is over the {limit}-byte limit")
                        digest.update(chunk)
                        fh.write(chunk)
                except ClientDisconnect:
                    raise Refusal(400, "invalid", "the sender disconnected mid-upload") from None
            if digest.hexdigest() != sha256:
                raise Refusal(
                    400, "invalid", f"the uploaded bytes hash to {digest.hexdigest()}, not {sha256}"
                )
            return await run_in_threadpool(
                pool.accept_upload,
                caller.address,
                assignment_id,
                UploadedFile(Path(tmp), sha256, size),
            )
        finally:
            os.unlink(tmp)

    @app.get(
        "/v1/steps/{step}/submissions",
        response_model=api.SubmissionList,
        responses=ERRORS,
        tags=["trainer"],
    )
    def submissions(
        step: Annotated[int, PathParam(ge=0, le=10**9)], caller: Signed
    ) -> api.SubmissionList:
        """The usable (not rejected, not voided) submissions of a step."""
        return pool.submissions_for_step(caller, step)

    @app.get(
        "/v1/submissions/{file_hash}/file",
        response_class=StreamingResponse,
        responses={
            **ERRORS,
            200: {"content": {"application/octet-stream": {}}},
            404: {"model": api.Problem, "description": "no such submission"},
        },
        tags=["trainer"],
    )
    def download(
        file_hash: Annotated[str, PathParam(pattern=HASH)], caller: Signed
    ) -> StreamingResponse:
        """A submitted rollout file (trainer and validators)."""
        name, size = pool.stored_file(caller, file_hash)
        fh = store.open(name)

        def chunks():
            with fh:
                while block := fh.read(1 << 20):
                    yield block

        return StreamingResponse(
            chunks(),
            media_type="application/octet-stream",
            headers={"Content-Length": str(size), "X-Content-SHA256": file_hash},
        )

    @app.get(
        "/v1/submissions/{file_hash}/assignment",
        response_model=api.ValidationTask,
        responses={**ERRORS, 404: {"model": api.Problem, "description": "no such submission"}},
        tags=["validator"],
    )
    def submission(
        file_hash: Annotated[str, PathParam(pattern=HASH)], caller: Signed
    ) -> api.ValidationTask:
        """A submission and its assignment with the issued seed, by file hash (validator and
        trainer keys): to judge a file held elsewhere, `swarmrl validate --orchestrator`."""
        return pool.submission_of(caller, file_hash)

    @app.post(
        "/v1/submissions/trained",
        response_model=api.MarkTrainedResponse,
        responses={
            **ERRORS,
            404: {"model": api.Problem, "description": "a named file is no submission"},
            409: {"model": api.Problem, "description": "a named file must not be trained"},
        },
        tags=["trainer"],
    )
    def trained(req: api.MarkTrainedRequest, caller: Signed) -> api.MarkTrainedResponse:
        """Mark submissions consumed by a training step (idempotent for the same step)."""
        return api.MarkTrainedResponse(marked=pool.mark_trained(caller, req))

    @app.post(
        "/v1/steps/{step}/progress",
        response_model=api.StepStatus,
        responses={
            **ERRORS,
            422: {"model": api.Problem, "description": "a named file is no submission of the step"},
        },
        tags=["trainer"],
    )
    def progress(
        step: Annotated[int, PathParam(ge=0, le=10**9)],
        req: api.ProgressReport,
        caller: Signed,
    ) -> api.StepStatus:
        """The trainer's own count of a step: it replaces the workers' claims for the files
        it names, sets the observed yield, and `full` stops issuance for the step."""
        return pool.report_progress(caller, step, req)

    @app.post("/v1/metrics", status_code=204, responses=ERRORS, tags=["trainer"])
    def metrics(req: api.MetricsReport, caller: Signed) -> None:
        """The trainer's metrics of a trained step: the dashboard's learning curves."""
        pool.report_metrics(caller, req)

    @app.post(
        "/v1/checkpoints",
        response_model=api.HeartbeatResponse,
        responses={
            **ERRORS,
            409: {
                "model": api.Problem,
                "description": "announced before with another hash, or older than the newest",
            },
        },
        tags=["trainer"],
    )
    def checkpoint(req: api.CheckpointAnnouncement, caller: Signed) -> api.HeartbeatResponse:
        """Publish checkpoint n (its BLAKE3): workers now generate for step n."""
        return pool.announce_checkpoint(caller, req)

    @app.post(
        "/v1/validation/next",
        response_model=api.ValidationTask,
        responses=ERRORS,
        tags=["validator"],
    )
    def next_for_validation(
        caller: Signed,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=MAX_WAIT_SECONDS,
                description="with nothing to judge, hold the request up to this many seconds "
                "for an upload (a long poll; answered at once when too many wait already)",
            ),
        ] = 0.0,
    ) -> api.ValidationTask:
        """The next file to check, with its assignment; handed out again if no verdict comes."""
        return pool.next_for_validation(caller, wait)

    @app.post(
        "/v1/pool/fund",
        response_model=api.Account,
        responses={**ERRORS, 403: {"model": api.Problem, "description": "not the pool owner"}},
        tags=["owner"],
    )
    def fund(req: api.FundRequest, caller: Signed) -> api.Account:
        """Add to an address's balance (the pool owner's key only); a worker registers by
        locking `min_stake` of it."""
        return pool.fund(caller, req)

    @app.post(
        "/v1/verdicts",
        response_model=api.VerdictResponse,
        responses={
            **ERRORS,
            404: {"model": api.Problem, "description": "no such submission"},
            409: {
                "model": api.Problem,
                "description": "already judged, or not chosen for validation",
            },
        },
        tags=["validator"],
    )
    async def verdict(
        request: Request, req: api.VerdictRequest, caller: Signed
    ) -> api.VerdictResponse:
        """Record a validator's verdict: accepted work is credited to the worker; a reject
        slashes and ejects it; a soft verdict voids the file only."""
        body = (await request.body()).decode("utf-8", "replace")
        return await run_in_threadpool(lambda: pool.record_verdict(caller, req, body=body))

    return app
