"""Protobuf's wire format written by hand: for bytes protobuf itself would never write (fields
repeated, out of order, of the wrong wire type) and for a request built around a large payload
without copying it twice."""

from __future__ import annotations


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, content: bytes) -> bytes:
    return tag(number, 2) + varint(len(content)) + content
