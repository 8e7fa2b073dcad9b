"""`swarmrl keygen`: make a member's key file."""

from __future__ import annotations

import sys
from pathlib import Path


def _keygen(args) -> int:
    from swarmrl.identity.keys import KeyFileError, generate_key_file

    try:
        identity = generate_key_file(args.out)
    except KeyFileError as exc:
        print(f"swarmrl keygen: {exc}", file=sys.stderr)
        return 1
    print(identity.address)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "keygen",
        help="write a new secp256k1 key (owner-only file) and print its address",
        description="Every pool member (worker, trainer, validator, relay) signs its requests with "
        "its own key; its address is the key's Ethereum-style address. Refuses to overwrite.",
    )
    p.add_argument("--out", type=Path, required=True, help="key file to create (mode 0600)")
    p.set_defaults(func=_keygen)
