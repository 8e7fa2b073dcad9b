"""Key files: one secp256k1 private key per member, kept readable by its owner only.

A key file holds the private key as one line of hex (`0x` + 64 digits). The member's
address is the key's Ethereum-style address (the last 20 bytes of the Keccak-256 hash
of the public key, EIP-55 checksummed), the same as the reference protocol's.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from coincurve import PrivateKey, PublicKey
from eth_utils import keccak, to_checksum_address

# A library a process imports (py_ecc, through eth-account, raised it to 100,000) must not
# leave the recursion limit past what a thread's C stack holds: recursion in C code (a
# JSON scanner, a parser of a worker's bytes) would then crash the process instead of
# raising RecursionError. Every process that signs or verifies imports this module first:
# the interpreter's default again, for all of them.
RECURSION_LIMIT = 1000
_KEY_DIGITS = re.compile(r"[0-9a-fA-F]{64}")
sys.setrecursionlimit(min(sys.getrecursionlimit(), RECURSION_LIMIT))


class KeyFileError(ValueError):
    """A key file is missing, unreadable, malformed or readable by others."""


def address_of(public: PublicKey) -> str:
    """The Ethereum address of a public key: the last 20 bytes of the Keccak-256 hash of
    its uncompressed form (without the 0x04 prefix), EIP-55 checksummed."""
    return to_checksum_address(keccak(public.format(compressed=False)[1:])[-20:])


@dataclass(frozen=True)
class Identity:
    """A member's signing key and the address it proves."""

    key: PrivateKey
    address: str

    @classmethod
    def of(cls, key: PrivateKey) -> Identity:
        return cls(key, address_of(key.public_key))

    @classmethod
    def generate(cls) -> Identity:
        # coincurve draws the 32 bytes from os.urandom until they are a valid key.
        return cls.of(PrivateKey())

    @classmethod
    def from_hex(cls, key_hex: str) -> Identity:
        """The identity of a key written as 64 hex digits, with or without ``0x``."""
        if not isinstance(key_hex, str):
            raise TypeError(f"a key is a hex string, not {type(key_hex).__name__}")
        digits = key_hex[2:] if key_hex[:2] in ("0x", "0X") else key_hex
        if not _KEY_DIGITS.fullmatch(digits):
            raise ValueError("a key is exactly 64 hex digits")
        # coincurve raises ValueError on a zero key or one past the curve's order.
        return cls.of(PrivateKey(bytes.fromhex(digits)))

    def key_hex(self) -> str:
        return "0x" + self.key.secret.hex()


def generate_key_file(path: Path) -> Identity:
    """Write a new key to `path` with mode 0600; refuses to overwrite an existing file."""
    path = Path(path)
    identity = Identity.generate()
    try:
        # O_EXCL: an existing key (someone's funded identity) is never replaced silently.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path} already exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise KeyFileError(f"cannot create key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(identity.key_hex() + "\n")
    os.chmod(path, 0o600)  # the umask may have narrowed it further; never wider
    return identity


def load_identity(path: Path) -> Identity:
    """Read a key file written by `swarmrl keygen`; refuses one that others can read."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"key file {path} is accessible by group or others (mode {stat.filemode(mode)}); "
            f"run: chmod 600 {path}"
        )
    try:
        return Identity.from_hex(text)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} does not hold a secp256k1 private key in hex ({exc})") from None
