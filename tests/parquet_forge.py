"""Rewrite a Parquet file's footer, as a hostile worker can: the footer is Thrift compact
protocol, read here into plain lists of [field id, type, value] with Apache Thrift's
reader and written back after a change."""

from __future__ import annotations

import struct
from pathlib import Path

from thrift.protocol.TCompactProtocol import TCompactProtocol
from thrift.Thrift import TType
from thrift.transport.TTransport import TMemoryBuffer

_SCALARS = {
    TType.BOOL: ("readBool", "writeBool"),
    TType.BYTE: ("readByte", "writeByte"),
    TType.I16: ("readI16", "writeI16"),
    TType.I32: ("readI32", "writeI32"),
    TType.I64: ("readI64", "writeI64"),
    TType.DOUBLE: ("readDouble", "writeDouble"),
    TType.STRING: ("readBinary", "writeBinary"),
}


def _read(p: TCompactProtocol, kind: int):
    if kind in _SCALARS:
        return getattr(p, _SCALARS[kind][0])()
    if kind == TType.STRUCT:
        fields = []
        p.readStructBegin()
        while True:
            _, inner, fid = p.readFieldBegin()
            if inner == TType.STOP:
                break
            fields.append([fid, inner, _read(p, inner)])
            p.readFieldEnd()
        p.readStructEnd()
        return fields
    if kind == TType.LIST:
        element, count = p.readListBegin()
        items = [_read(p, element) for _ in range(count)]
        p.readListEnd()
        return (element, items)
    raise ValueError(f"Thrift type {kind} is not used in a Parquet footer")


def _write(p: TCompactProtocol, kind: int, value) -> None:
    if kind in _SCALARS:
        getattr(p, _SCALARS[kind][1])(value)
    elif kind == TType.STRUCT:
        p.writeStructBegin("s")
        for fid, inner, v in value:
            p.writeFieldBegin("f", inner, fid)
            _write(p, inner, v)
            p.writeFieldEnd()
        p.writeFieldStop()
        p.writeStructEnd()
    elif kind == TType.LIST:
        element, items = value
        p.writeListBegin(element, len(items))
        for item in items:
            _write(p, element, item)
        p.writeListEnd()
    else:
        raise ValueError(kind)


def _field(fields: list, fid: int) -> list:
    return next(f for f in fields if f[0] == fid)


def understate_footer(src: Path, dst: Path, values: int, uncompressed: int) -> Path:
    """A copy of `src` whose footer claims at most `values` values and `uncompressed`
    bytes per column chunk (ColumnMetaData fields 5 and 6), pages untouched."""
    data = src.read_bytes()
    length = struct.unpack("<i", data[-8:-4])[0]
    meta = _read(TCompactProtocol(TMemoryBuffer(data[-8 - length : -8])), TType.STRUCT)
    for group in _field(meta, 4)[2][1]:  # FileMetaData.row_groups
        for chunk in _field(group, 1)[2][1]:  # RowGroup.columns
            column = _field(chunk, 3)[2]  # ColumnChunk.meta_data
            _field(column, 5)[2] = min(_field(column, 5)[2], values)
            _field(column, 6)[2] = min(_field(column, 6)[2], uncompressed)
    out = TMemoryBuffer()
    _write(TCompactProtocol(out), TType.STRUCT, meta)
    footer = out.getvalue()
    dst.write_bytes(data[: -8 - length] + footer + struct.pack("<i", len(footer)) + b"PAR1")
    return dst
