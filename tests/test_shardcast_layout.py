"""SHARDCAST formats and server choice: pure functions, checked against the reference's own parser."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shardcast import utils as reference_utils

from swarmrl.shardcast.choice import ServerChooser
from swarmrl.shardcast.layout import (
    LayoutError,
    Manifest,
    ShardInfo,
    VersionEntry,
    format_distribution,
    parse_distribution,
    shard_count,
    shard_index,
    shard_name,
    shard_span,
)

HEX = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
ENTRIES = st.dictionaries(
    st.integers(0, 10**9), st.tuples(HEX, st.integers(1, 10**6)), max_size=8
).map(lambda d: {v: VersionEntry(v, h, n) for v, (h, n) in d.items()})


@given(ENTRIES)
def test_distribution_round_trips(entries):
    assert parse_distribution(format_distribution(entries)) == entries


@given(entries=ENTRIES)
def test_reference_parser_reads_our_distribution(entries, tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "distribution.txt"
    path.write_text(format_distribution(entries))
    parsed = reference_utils.parse_distribution_file(str(path))
    assert parsed == {f"v{v}": f"{e.blake3}|{e.num_shards}" for v, e in entries.items()}


def test_we_read_what_the_reference_writes(tmp_path):
    path = tmp_path / "distribution.txt"
    for version, digest in [(1, "a" * 64), (2, "b" * 64), (3, "c" * 64)]:
        reference_utils.update_distribution_file(str(path), f"v{version}", digest, 2, version * 10)
    assert parse_distribution(path.read_text()) == {
        2: VersionEntry(2, "b" * 64, 20),
        3: VersionEntry(3, "c" * 64, 30),
    }


@pytest.mark.parametrize(
    "text",
    [
        "v1: " + "a" * 64,
        "v1 " + "a" * 64 + "|2",
        "x1: " + "a" * 64 + "|2",
        "v1: " + "A" * 64 + "|2",
        "v1: " + "a" * 64 + "|2\nv1: " + "b" * 64 + "|3",
    ],
)
def test_bad_distribution_lines_are_rejected(text):
    with pytest.raises(LayoutError, match=r"distribution\.txt line"):
        parse_distribution(text)


def test_shard_names_are_one_based_five_digits():
    assert shard_name(0) == "shard_00001.bin"
    assert shard_name(12344) == "shard_12345.bin"
    assert shard_index("shard_00001.bin") == 0
    assert shard_index("shard_00000.bin") is None
    assert shard_index("../shard_00001.bin") is None
    assert shard_count(100, 30) == 4 and shard_span(3, 100, 30) == (90, 10)


def _manifest(sizes, shard_size=10, file_size=None):
    shards = tuple(ShardInfo(s, "0" * 64) for s in sizes)
    return Manifest(1, sum(sizes) if file_size is None else file_size, shard_size, "1" * 64, shards)


def test_manifest_round_trips_and_rejects_inconsistency():
    manifest = _manifest([10, 10, 3])
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest.entry == VersionEntry(1, "1" * 64, 3)
    with pytest.raises(LayoutError, match="shard 2 is 9 bytes"):
        _manifest([10, 9, 3])
    with pytest.raises(LayoutError, match="2 shards listed"):
        _manifest([10, 10], file_size=23)
    with pytest.raises(LayoutError):
        Manifest.from_json('{"format": "something else"}')
    with pytest.raises(LayoutError):
        Manifest.from_json("[1, 2]")


def test_server_choice_follows_success_times_bandwidth_with_healing():
    chooser = ServerChooser(["a", "b"], alpha=0.3, heal=0.02, rng=random.Random(0))
    chooser.set_estimate("a", 100.0, True)
    chooser.set_estimate("b", 300.0, True)
    assert chooser.weights() == {"a": 100.0, "b": 300.0}
    draws = [chooser.pick() for _ in range(4000)]
    assert 0.70 < draws.count("b") / len(draws) < 0.80  # expect 3/4

    chooser.record("b", False)  # success 0.7 · 1 + 0.3 · 0 = 0.7, then healed to 0.72
    assert chooser.scores["b"].success_rate == pytest.approx(0.72)
    assert chooser.scores["b"].bandwidth == 300.0  # a failure says nothing about bandwidth
    chooser.record("a", True, 200.0)  # bandwidth 0.3 · 200 + 0.7 · 100 = 130
    assert chooser.scores["a"].bandwidth == pytest.approx(130.0)
    assert chooser.scores["b"].success_rate == pytest.approx(
        0.74
    )  # healing lets a failed server back in
    assert chooser.pick(avoid={"a"}) == "b"
    assert chooser.pick(avoid={"a", "b"}) in {"a", "b"}  # every server failed: any may be retried
