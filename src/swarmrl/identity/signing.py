"""Signed requests: every call to the orchestrator is signed by its sender's key.

The signed text binds the pool, the method, the path with its query, the SHA-256 of
the body, a timestamp and a nonce (docs/orchestrator.md):

    swarmrl/2\n<pool id>\n<METHOD>\n<path with query>\n<sha256 hex of the body>\n<timestamp>\n<nonce>

It is signed as an EIP-191 personal message, so any Ethereum tool can check it. The
pool id (which the orchestrator serves at `GET /v1/signing`) makes a request signed for
one pool worthless at another, even with the same key; it also travels in the `X-Pool`
header, whose absence marks a client of the old protocol `swarmrl/1`, which named no
pool. The receiver recovers the signer from the signature and requires it to equal
`X-Address`; the timestamp window and the nonce ledger (against replay) are the
orchestrator's job.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

from coincurve import PublicKey
from eth_utils import keccak, to_checksum_address

from swarmrl.identity.keys import Identity, address_of

PROTOCOL = "swarmrl/2"
HEADER_POOL = "X-Pool"
HEADER_ADDRESS = "X-Address"
HEADER_TIMESTAMP = "X-Timestamp"
HEADER_NONCE = "X-Nonce"
HEADER_SIGNATURE = "X-Signature"
NONCE_BYTES = 16

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_NONCE = re.compile(r"[0-9a-f]{32,128}")
_SIGNATURE = re.compile(r"0x[0-9a-fA-F]{130}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_METHOD = re.compile(r"[A-Z]{3,7}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
POOL_ID = re.compile(r"[0-9a-f]{32}")


class SignatureError(ValueError):
    """Signature headers are missing, malformed, or do not prove the claimed address."""


class OldProtocolError(SignatureError):
    """The request is signed by a client of `swarmrl/1`, whose text named no pool."""


@dataclass(frozen=True)
class SignedHeaders:
    """The signature headers of a request, parsed and shape-checked."""

    pool: str
    address: str  # EIP-55 checksummed
    timestamp: int
    nonce: str
    signature: bytes


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def canonical_request(
    pool: str, method: str, path_with_query: str, body_sha256: str, timestamp: int, nonce: str
) -> str:
    """The exact text a request's signature covers."""
    if not POOL_ID.fullmatch(pool):
        raise SignatureError("the pool id must be 32 lowercase hex digits")
    if not _METHOD.fullmatch(method):
        raise SignatureError(f"method {method!r} is not an HTTP method name")
    if not path_with_query.startswith("/") or "\n" in path_with_query:
        raise SignatureError("the signed path must start with '/' and be one line")
    if not _SHA256.fullmatch(body_sha256):
        raise SignatureError("the body digest must be 64 lowercase hex digits")
    if not _NONCE.fullmatch(nonce):
        raise SignatureError("the nonce must be 32 to 128 lowercase hex digits")
    return (
        f"{PROTOCOL}\n{pool}\n{method}\n{path_with_query}\n{body_sha256}\n{int(timestamp)}\n{nonce}"
    )


def eip191_digest(text: str) -> bytes:
    """Keccak-256 of the EIP-191 personal message of ``text`` (what ``personal_sign``
    and eth-account's ``encode_defunct`` sign)."""
    message = text.encode()
    return keccak(b"\x19Ethereum Signed Message:\n" + str(len(message)).encode() + message)


def sign_request(
    identity: Identity,
    method: str,
    path_with_query: str,
    body_sha256: str,
    *,
    pool: str,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers that sign one request for `pool` (a fresh nonce and the current time by
    default)."""
    timestamp = int(time.time()) if timestamp is None else int(timestamp)
    nonce = secrets.token_hex(NONCE_BYTES) if nonce is None else nonce
    text = canonical_request(pool, method, path_with_query, body_sha256, timestamp, nonce)
    recoverable = identity.key.sign_recoverable(eip191_digest(text), hasher=None)
    return {
        HEADER_POOL: pool,
        HEADER_ADDRESS: identity.address,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_NONCE: nonce,
        # Ethereum's layout: r || s || v, v = 27 + the recovery id.
        HEADER_SIGNATURE: "0x" + (recoverable[:64] + bytes([27 + recoverable[64]])).hex(),
    }


def parse_signed_headers(headers: Mapping[str, str]) -> SignedHeaders:
    """Shape-check the signature headers (any case); raises SignatureError naming the bad
    one, OldProtocolError for a signed request without `X-Pool` (a `swarmrl/1` client)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if HEADER_POOL.lower() not in lowered and HEADER_SIGNATURE.lower() in lowered:
        raise OldProtocolError(
            f"the request is signed without {HEADER_POOL}: a client of the old protocol "
            f"swarmrl/1, whose signatures name no pool; this orchestrator speaks {PROTOCOL}: "
            "upgrade swarmrl on the sending machine"
        )
    values = {}
    for name, pattern in (
        (HEADER_POOL, POOL_ID),
        (HEADER_ADDRESS, _ADDRESS),
        (HEADER_TIMESTAMP, _TIMESTAMP),
        (HEADER_NONCE, _NONCE),
        (HEADER_SIGNATURE, _SIGNATURE),
    ):
        value = lowered.get(name.lower())
        if value is None:
            raise SignatureError(f"missing header {name}")
        if not pattern.fullmatch(value):
            raise SignatureError(f"malformed header {name}")
        values[name] = value
    return SignedHeaders(
        pool=values[HEADER_POOL],
        address=to_checksum_address(values[HEADER_ADDRESS]),
        timestamp=int(values[HEADER_TIMESTAMP]),
        nonce=values[HEADER_NONCE],
        signature=bytes.fromhex(values[HEADER_SIGNATURE][2:]),
    )


def recover_signer(text: str, signature: bytes) -> str:
    """The checksummed address whose key made `signature` over `text`."""
    try:
        # r || s || v; v is 27 + the recovery id (some tools write the bare id, 0 or 1).
        if len(signature) != 65 or signature[64] not in (0, 1, 27, 28):
            raise ValueError("not r || s || v with v in 0, 1, 27, 28")
        recovery_id = signature[64] % 27
        public = PublicKey.from_signature_and_message(
            signature[:64] + bytes([recovery_id]), eip191_digest(text), hasher=None
        )
        return address_of(public)
    except Exception as exc:  # noqa: BLE001 (libsecp256k1 refuses bad bytes with several types)
        raise SignatureError(
            f"signature does not recover to any key ({type(exc).__name__})"
        ) from None
