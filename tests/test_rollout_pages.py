"""The page-header walk (rollouts/pages.py): honest chunks sum to what their footer says;
mutated chunk bytes give a PageError, never another exception."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmrl.rollouts.files import _chunk_start
from swarmrl.rollouts.pages import PageError, chunk_pages


def _file(tmp_path, rows: int = 64, page_bytes: int = 1 << 20):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = pa.table(
        {
            "tokens": pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(rng.integers(0, 5000, offsets[-1], dtype=np.int32))
            ),
            "name": [f"p{i % 7}" for i in range(rows)],
            "reward": rng.normal(size=rows),
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, data_page_size=page_bytes, compression="zstd")
    return path


def _chunks(path):
    md = pq.ParquetFile(path).metadata
    data = path.read_bytes()
    for g in range(md.num_row_groups):
        for i in range(md.num_columns):
            c = md.row_group(g).column(i)
            start = _chunk_start(c)
            yield c, data[start : start + c.total_compressed_size]


@pytest.mark.parametrize("page_bytes", [1 << 20, 1024], ids=["one-page", "many-pages"])
def test_an_honest_chunks_pages_sum_to_its_footer(tmp_path, page_bytes):
    for chunk, data in _chunks(_file(tmp_path, page_bytes=page_bytes)):
        pages = chunk_pages(data, max_pages=1000)
        assert pages.values == chunk.num_values
        assert pages.uncompressed_bytes == chunk.total_uncompressed_size - _headers(data, pages)
        assert pages.pages >= 1
    with pytest.raises(PageError, match="more than 1 pages"):
        chunk_pages(
            next(
                d
                for c, d in _chunks(_file(tmp_path, page_bytes=1024))
                if c.path_in_schema.startswith("tokens")
            ),
            max_pages=1,
        )


def _headers(data: bytes, pages) -> int:
    """Bytes of the chunk that are page headers: the footer's uncompressed size counts them."""
    return len(data) - _compressed_payload(data)


def _compressed_payload(data: bytes) -> int:
    from thrift.protocol.TCompactProtocol import TCompactProtocol

    from swarmrl.rollouts.pages import _Cursor, _read_header

    total = position = 0
    while position < len(data):
        cursor = _Cursor(data, position)
        _, compressed, _, _ = _read_header(TCompactProtocol(cursor))
        total += compressed
        position = cursor.position + compressed
    return total


MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "truncate"]),
        st.integers(0, 1 << 16),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mutations=MUTATIONS)
def test_mutated_chunks_give_a_page_error_never_another_exception(tmp_path, mutations):
    honest = [bytearray(d) for _, d in _chunks(_file(tmp_path, page_bytes=4096))]
    for data in honest:
        for kind, where, byte in mutations:
            if not data:
                break
            at = where % len(data)
            if kind == "flip":
                data[at] ^= byte or 1
            elif kind == "insert":
                data[at:at] = bytes([byte])
            elif kind == "delete":
                del data[at]
            else:
                del data[at:]
        try:
            pages = chunk_pages(bytes(data), max_pages=64)
        except PageError:
            continue
        assert pages.pages <= 64 and min(pages.values, pages.uncompressed_bytes) >= 0
