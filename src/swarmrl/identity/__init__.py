"""Identities: secp256k1 keys with Ethereum-style addresses, and signed HTTP requests (docs/architecture.md §4.5)."""

from swarmrl.identity.keys import Identity, KeyFileError, generate_key_file, load_identity
from swarmrl.identity.signing import (
    HEADER_ADDRESS,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SignatureError,
    SignedHeaders,
    body_digest,
    canonical_request,
    parse_signed_headers,
    recover_signer,
    sign_request,
)

__all__ = [
    "HEADER_ADDRESS",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "Identity",
    "KeyFileError",
    "SignatureError",
    "SignedHeaders",
    "body_digest",
    "canonical_request",
    "generate_key_file",
    "load_identity",
    "parse_signed_headers",
    "recover_signer",
    "sign_request",
]
