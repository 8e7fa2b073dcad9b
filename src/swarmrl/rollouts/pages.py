"""The page headers of a Parquet column chunk, read before any page of it is decoded.

A file's footer states, per column chunk, how many values it holds and how many bytes
its pages take decompressed, but those are the writer's claims: a hostile worker can
understate them and hold pages that decode to gigabytes (a 4.7 kB file with an honest
footer's figures cut down decoded to 430 MiB before this check). The decoder allocates
what each page's own header says (``uncompressed_page_size``) and decodes as many
values as it says (``num_values``), so those, summed over a chunk's pages, bound what
decoding the chunk can cost. This module walks the chunk's byte range header by header
(Thrift compact protocol, parsed with Apache Thrift's reader; the field numbers are
parquet-format's ``PageHeader``) without decompressing anything, and the caller
compares the sums with the assignment's bounds.

Every byte here comes from an untrusted worker: any malformed header, a page running
past the chunk, too many pages or a nesting too deep is a ``PageError``, never another
exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from thrift.protocol.TCompactProtocol import TCompactProtocol
from thrift.Thrift import TType
from thrift.transport.TTransport import TTransportBase

# PageHeader fields (parquet-format, parquet.thrift)
_UNCOMPRESSED_SIZE = 2
_COMPRESSED_SIZE = 3
_DATA_PAGE = 5  # DataPageHeader: 1 num_values
_DICTIONARY_PAGE = 7  # DictionaryPageHeader: 1 num_values
_DATA_PAGE_V2 = 8  # DataPageHeaderV2: 1 num_values
_NUM_VALUES = 1
# A page header holds no containers and nests two deep (the header, a page kind's header,
# its statistics); anything deeper or with long lists is not a page header.
_MAX_DEPTH = 8
_MAX_CONTAINER = 1024
# How a scalar of each Thrift type is read (and so skipped).
_READ = {
    TType.BOOL: "readBool",
    TType.BYTE: "readByte",
    TType.I16: "readI16",
    TType.I32: "readI32",
    TType.I64: "readI64",
    TType.DOUBLE: "readDouble",
    TType.STRING: "readBinary",  # as bytes: statistics are not UTF-8
}


class PageError(ValueError):
    """A column chunk's pages cannot be walked, or there are more of them than allowed."""


@dataclass(frozen=True)
class ChunkPages:
    """What a column chunk's page headers say, summed over its pages."""

    pages: int
    values: int  # data pages' values (levels included)
    dictionary_values: int
    uncompressed_bytes: int


class _Cursor(TTransportBase):
    """Reads a bytes object from a position, never past its end."""

    def __init__(self, data: bytes | memoryview, position: int) -> None:
        self.data = data
        self.position = position

    def isOpen(self) -> bool:  # Thrift's name
        return True

    def read(self, sz: int) -> bytes:
        out = bytes(self.data[self.position : self.position + sz])
        self.position += len(out)
        return out


def chunk_pages(data: bytes | memoryview, max_pages: int) -> ChunkPages:
    """Walk the pages of one column chunk (its whole byte range, ``data``): each header,
    then the page's compressed bytes, until the range ends exactly at a page's end."""
    pages = values = dictionary_values = uncompressed = 0
    position = 0
    while position < len(data):
        if pages == max_pages:
            raise PageError(f"more than {max_pages} pages in a column chunk")
        cursor = _Cursor(data, position)
        try:
            header = _read_header(TCompactProtocol(cursor, len(data), _MAX_CONTAINER))
        except PageError:
            raise
        except Exception as exc:  # noqa: BLE001 - hostile bytes: any failure is the file's
            raise PageError(f"page header {pages} is malformed ({type(exc).__name__})") from None
        size, compressed, page_values, dictionary = header
        if size < 0 or compressed < 0 or page_values < 0:
            raise PageError(f"page {pages} states a negative size or count")
        position = cursor.position + compressed
        if position > len(data):
            raise PageError(f"page {pages} runs past the end of its column chunk")
        pages += 1
        uncompressed += size
        if dictionary:
            dictionary_values += page_values
        else:
            values += page_values
    return ChunkPages(pages, values, dictionary_values, uncompressed)


def _read_header(p: TCompactProtocol) -> tuple[int, int, int, bool]:
    """(uncompressed_page_size, compressed_page_size, num_values, is a dictionary page)."""
    size = compressed = None
    page_values = 0
    dictionary = False
    p.readStructBegin()
    while True:
        _, kind, field = p.readFieldBegin()
        if kind == TType.STOP:
            break
        if field in (_UNCOMPRESSED_SIZE, _COMPRESSED_SIZE) and kind == TType.I32:
            if field == _UNCOMPRESSED_SIZE:
                size = p.readI32()
            else:
                compressed = p.readI32()
        elif field in (_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2) and kind == TType.STRUCT:
            page_values += _num_values(p)
            dictionary = dictionary or field == _DICTIONARY_PAGE
        else:
            _skip(p, kind, _MAX_DEPTH)
        p.readFieldEnd()
    p.readStructEnd()
    if size is None or compressed is None:
        raise PageError("a page header without its sizes")
    return size, compressed, page_values, dictionary


def _num_values(p: TCompactProtocol) -> int:
    found = 0
    p.readStructBegin()
    while True:
        _, kind, field = p.readFieldBegin()
        if kind == TType.STOP:
            break
        if field == _NUM_VALUES and kind == TType.I32:
            found = p.readI32()
        else:
            _skip(p, kind, _MAX_DEPTH - 1)
        p.readFieldEnd()
    p.readStructEnd()
    return found


def _skip(p: TCompactProtocol, kind: int, depth: int) -> None:
    """Thrift's skip, but binaries are read as bytes (statistics are not UTF-8) and the
    depth is bounded."""
    if depth <= 0:
        raise PageError("a page header nested too deep")
    if kind in _READ:
        getattr(p, _READ[kind])()
    elif kind == TType.STRUCT:
        p.readStructBegin()
        while True:
            _, inner, _ = p.readFieldBegin()
            if inner == TType.STOP:
                break
            _skip(p, inner, depth - 1)
            p.readFieldEnd()
        p.readStructEnd()
    elif kind in (TType.LIST, TType.SET):
        listed = kind == TType.LIST
        element, count = p.readListBegin() if listed else p.readSetBegin()
        for _ in range(count):
            _skip(p, element, depth - 1)
        p.readListEnd() if listed else p.readSetEnd()
    elif kind == TType.MAP:
        key, value, count = p.readMapBegin()
        for _ in range(count):
            _skip(p, key, depth - 1)
            _skip(p, value, depth - 1)
        p.readMapEnd()
    else:
        raise PageError(f"unknown Thrift type {kind} in a page header")
