"""Identities: secp256k1 keys with Ethereum-style addresses, and signed HTTP requests (docs/architecture.md §4.5).

Names are loaded on first use (PEP 562): `swarmrl`'s argument parser registers `keygen`
for every subcommand and should not load the signing libraries to do it.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_WHERE = {
    "HEADER_ADDRESS": "signing",
    "HEADER_NONCE": "signing",
    "HEADER_POOL": "signing",
    "HEADER_SIGNATURE": "signing",
    "HEADER_TIMESTAMP": "signing",
    "Identity": "keys",
    "KeyFileError": "keys",
    "OldProtocolError": "signing",
    "PROTOCOL": "signing",
    "SignatureError": "signing",
    "SignedHeaders": "signing",
    "body_digest": "signing",
    "canonical_request": "signing",
    "generate_key_file": "keys",
    "load_identity": "keys",
    "parse_signed_headers": "signing",
    "recover_signer": "signing",
    "sign_request": "signing",
}

if TYPE_CHECKING:
    from swarmrl.identity.keys import (
        Identity,
        KeyFileError,
        generate_key_file,
        load_identity,
    )
    from swarmrl.identity.signing import (
        HEADER_ADDRESS,
        HEADER_NONCE,
        HEADER_POOL,
        HEADER_SIGNATURE,
        HEADER_TIMESTAMP,
        PROTOCOL,
        OldProtocolError,
        SignatureError,
        SignedHeaders,
        body_digest,
        canonical_request,
        parse_signed_headers,
        recover_signer,
        sign_request,
    )


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


__all__ = [
    "HEADER_ADDRESS",
    "HEADER_NONCE",
    "HEADER_POOL",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "PROTOCOL",
    "Identity",
    "KeyFileError",
    "OldProtocolError",
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
