"""Identities: key files, EIP-191 request signatures, and the header parser (hostile input)."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat

import pytest
from coincurve import PublicKey
from eth_hash.auto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.identity import (
    Identity,
    KeyFileError,
    SignatureError,
    body_digest,
    canonical_request,
    generate_key_file,
    load_identity,
    parse_signed_headers,
    recover_signer,
    sign_request,
)
from swarmrl.identity.cli import register

POOL = "0123456789abcdef" * 2  # a pool id: the signed text names it


def test_key_file_is_owner_only_and_never_overwritten(tmp_path):
    path = tmp_path / "worker.key"
    identity = generate_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_identity(path).address == identity.address
    before = path.read_bytes()
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        generate_key_file(path)
    assert path.read_bytes() == before


def test_keygen_command(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["keygen", "--out", str(tmp_path / "k")])
    assert args.func(args) == 0
    address = capsys.readouterr().out.strip()
    assert load_identity(tmp_path / "k").address == address
    assert args.func(args) == 1  # exists: refused
    assert "refusing to overwrite" in capsys.readouterr().err


def test_key_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "k"
    generate_key_file(path)
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_identity(path)


@pytest.mark.parametrize("content", ["", "0x1234", "not hex at all", "0x" + "00" * 32])
def test_malformed_key_file_is_refused(tmp_path, content):
    path = tmp_path / "k"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match=str(path)):
        load_identity(path)


def test_signature_is_a_standard_eip191_signature():
    """Checked with coincurve directly (not through eth-account): keccak of the EIP-191
    prefix and the canonical text, public key recovered, address = last 20 bytes."""
    identity = Identity.generate()
    body = b'{"policy_step": 3}'
    headers = sign_request(identity, "POST", "/v1/assignments?x=1", body_digest(body), pool=POOL)
    text = canonical_request(
        POOL,
        "POST",
        "/v1/assignments?x=1",
        body_digest(body),
        int(headers["X-Timestamp"]),
        headers["X-Nonce"],
    )
    assert text.startswith(f"swarmrl/2\n{POOL}\nPOST\n/v1/assignments?x=1\n")
    assert headers["X-Pool"] == POOL
    message = text.encode()
    digest = keccak(b"\x19Ethereum Signed Message:\n" + str(len(message)).encode() + message)
    sig = bytes.fromhex(headers["X-Signature"][2:])
    recoverable = sig[:64] + bytes([sig[64] - 27])
    public = PublicKey.from_signature_and_message(recoverable, digest, hasher=None)
    address = keccak(public.format(compressed=False)[1:])[-20:]
    assert "0x" + address.hex() == identity.address.lower()
    assert len(headers["X-Nonce"]) >= 32


@pytest.mark.parametrize("field", ["pool", "method", "path", "body", "timestamp", "nonce"])
def test_signature_covers_every_field(field):
    identity = Identity.generate()
    parts = {
        "pool": POOL,
        "method": "POST",
        "path": "/v1/heartbeat",
        "body": body_digest(b"{}"),
        "timestamp": 1_800_000_000,
        "nonce": "ab" * 16,
    }
    headers = sign_request(
        identity,
        parts["method"],
        parts["path"],
        parts["body"],
        pool=parts["pool"],
        timestamp=parts["timestamp"],
        nonce=parts["nonce"],
    )
    signed = parse_signed_headers(headers)
    changed = dict(parts)
    changed[field] = {
        "pool": "ef" * 16,
        "method": "PUT",
        "path": "/v1/assignments",
        "body": body_digest(b"{ }"),
        "timestamp": 1_800_000_001,
        "nonce": "cd" * 16,
    }[field]
    text = canonical_request(*changed.values())
    assert recover_signer(text, signed.signature) != identity.address
    same = canonical_request(*parts.values())
    assert recover_signer(same, signed.signature) == identity.address


# -- hostile input: the header parser and the canonical text --------------------------------


HONEST = sign_request(
    Identity.from_hex("0x" + "11" * 32), "GET", "/v1/status", body_digest(b""), pool=POOL
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    drop=st.sets(st.sampled_from(sorted(HONEST))),
    replace=st.dictionaries(st.sampled_from(sorted(HONEST)), st.text(max_size=200), max_size=4),
    extra=st.dictionaries(st.text(max_size=20), st.text(max_size=50), max_size=3),
)
def test_header_parser_never_crashes(drop, replace, extra):
    headers = {k: v for k, v in HONEST.items() if k not in drop} | replace | extra
    try:
        signed = parse_signed_headers(headers)
    except SignatureError:
        return
    assert signed.address.startswith("0x") and len(signed.signature) == 65
    assert signed.pool == headers["X-Pool"]


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 200), char=st.characters(), key=st.sampled_from(sorted(HONEST)))
def test_mutated_header_value_never_crashes(position, char, key):
    value = HONEST[key]
    mutated = value[: position % (len(value) + 1)] + char + value[position % (len(value) + 1) + 1 :]
    try:
        signed = parse_signed_headers(HONEST | {key: mutated})
        text = canonical_request(
            signed.pool, "GET", "/v1/status", body_digest(b""), signed.timestamp, signed.nonce
        )
        recover_signer(text, signed.signature)
    except SignatureError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    pool=st.text(max_size=40) | st.just(POOL),
    method=st.text(max_size=10),
    path=st.text(max_size=50),
    digest=st.text(max_size=70),
    timestamp=st.integers(-(2**70), 2**70),
    nonce=st.text(max_size=140),
    signature=st.binary(max_size=70),
)
def test_canonical_text_and_recovery_never_crash(
    pool, method, path, digest, timestamp, nonce, signature
):
    try:
        text = canonical_request(pool, method, path, digest, timestamp, nonce)
    except SignatureError:
        return
    assert text.count("\n") == 6
    with contextlib.suppress(SignatureError):
        recover_signer(text, signature)


@pytest.mark.parametrize(
    "text", ["0x" + "1" * 63, "0x" + "11" * 31 + " 1", "11" * 31 + "1g", "0x" + "0" * 64, ""]
)
def test_a_key_is_exactly_64_hex_digits_of_a_valid_key(text):
    with pytest.raises(ValueError):
        Identity.from_hex(text)


def test_signatures_and_addresses_agree_with_eth_account():
    """The same key signs the same bytes as eth-account's EIP-191 signer (RFC 6979 nonces,
    low s), and both recover the same signer, with v written as 27/28 or as 0/1."""
    from eth_account import Account
    from eth_account.messages import encode_defunct

    for i in range(20):
        identity = Identity.generate()
        assert Account.from_key(identity.key.secret).address == identity.address
        assert Identity.from_hex(identity.key_hex()) == identity
        text = canonical_request(
            POOL, "POST", f"/v1/x?{i}", body_digest(b"%d" % i), 1000 + i, "ab" * 16
        )
        headers = sign_request(
            identity,
            "POST",
            f"/v1/x?{i}",
            body_digest(b"%d" % i),
            pool=POOL,
            timestamp=1000 + i,
            nonce="ab" * 16,
        )
        ours = bytes.fromhex(headers["X-Signature"][2:])
        theirs = bytes(
            Account.sign_message(encode_defunct(text=text), identity.key.secret).signature
        )
        assert ours == theirs
        assert recover_signer(text, ours) == identity.address
        bare = ours[:64] + bytes([ours[64] - 27])
        assert recover_signer(text, bare) == Account.recover_message(
            encode_defunct(text=text), signature=bare
        )


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 64), value=st.integers(0, 255))
def test_a_mutated_signature_recovers_as_eth_account_recovers_it(position, value):
    """A byte of an honest signature replaced: the result (another address, or a refusal)
    is eth-account's, except that v values past 0, 1, 27, 28 are refused outright."""
    from eth_account import Account
    from eth_account.messages import encode_defunct

    identity = Identity.from_hex("0x" + "11" * 32)
    text = canonical_request(POOL, "GET", "/v1/status", body_digest(b""), 5, "cd" * 16)
    honest = bytes.fromhex(
        sign_request(
            identity, "GET", "/v1/status", body_digest(b""), pool=POOL, timestamp=5, nonce="cd" * 16
        )["X-Signature"][2:]
    )
    forged = honest[:position] + bytes([value]) + honest[position + 1 :]
    try:
        ours = recover_signer(text, forged)
    except SignatureError:
        ours = None
    try:
        theirs = Account.recover_message(encode_defunct(text=text), signature=forged)
    except Exception:  # noqa: BLE001 (whatever eth-keys raises: a refusal)
        theirs = None
    if position == 64 and value not in (0, 1, 27, 28):
        assert ours is None
    else:
        assert ours == theirs
