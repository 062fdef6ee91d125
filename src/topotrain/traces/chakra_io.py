"""Chakra's on-disk encoding: one file per rank, a stream of length-delimited protobuf messages — a
``GlobalMetadata`` first, then ``Node`` after ``Node`` — each preceded by its length as a base-128 varint
(protobuf's own varint: 7 bits a byte, low bits first, the high bit set on every byte but the last; what
Chakra's ``protolib.encodeMessage`` and its C++ ``ProtoInputStream`` write and read). A file may be
gzipped (Chakra's reader opens either).

A file that breaks the encoding — a length cut off, a message running past the end, bytes that do not
parse as the message — is one :class:`~topotrain.util.errors.ConfigError` naming the file and the byte
offset of the message at fault.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topotrain.traces.chakra_pb2 import INVALID_NODE, NODE_TYPES, messages
from topotrain.util.atomic import atomic_write
from topotrain.util.errors import ConfigError

_FIX = "give a Chakra execution trace (GlobalMetadata then Nodes, each length-prefixed), e.g. one written by " \
       "`topotrain trace export`"
#: A varint of more bytes than this encodes more than 64 bits: not a length.
_MAX_VARINT_BYTES = 10


def encode_varint(value: int) -> bytes:
    """``value`` (>= 0, < 2**64) as a protobuf base-128 varint."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | low)
        else:
            out.append(low)
            return bytes(out)


def decode_varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """The varint at ``data[pos:]`` and the position after it; ``None`` when the data ends inside it or it is
    longer than 10 bytes."""
    value = shift = 0
    for i in range(pos, min(len(data), pos + _MAX_VARINT_BYTES)):
        b = data[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i + 1
        shift += 7
    return None


@dataclass(frozen=True)
class EtFile:
    """One rank's Chakra file, read: its metadata message, its nodes in file order, and each node's byte
    offset (for error messages)."""

    path: str
    metadata: Any
    nodes: tuple[Any, ...]
    offsets: tuple[int, ...]


def _bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(str(path), f"cannot be read: {e.strerror or e}", "give an existing Chakra trace") from None
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ConfigError(str(path), f"is a damaged gzip file ({e})", _FIX) from None
    return data


def read_et(path: str | Path) -> EtFile:
    """Read one Chakra file (gzipped or not)."""
    p = Path(path)
    data = _bytes(p)
    m = messages()
    metadata: Any = None
    nodes: list[Any] = []
    offsets: list[int] = []
    pos = 0
    while pos < len(data):
        got = decode_varint(data, pos)
        kind = "GlobalMetadata" if metadata is None else "Node"
        if got is None:
            raise ConfigError(f"{p}: byte {pos}", f"the length of a {kind} message is cut off or is not a varint "
                              f"(the file has {len(data)} bytes)", _FIX)
        size, start = got
        if start + size > len(data):
            raise ConfigError(f"{p}: byte {pos}", f"a {kind} message of {size} bytes runs past the end of the file "
                              f"({len(data)} bytes: truncated?)", _FIX)
        msg = m.GlobalMetadata() if metadata is None else m.Node()
        try:
            msg.ParseFromString(data[start:start + size])
        except (m.DecodeError, RuntimeError, ValueError) as e:
            raise ConfigError(f"{p}: byte {pos}", f"the {size} bytes there are not a {kind} message ({e})",
                              _FIX) from None
        if metadata is None:
            metadata = msg
        else:
            if msg.type == INVALID_NODE or msg.type not in NODE_TYPES:
                raise ConfigError(f"{p}: byte {pos}", f"node {msg.id} ({msg.name!r}) has node type {msg.type} "
                                  f"({NODE_TYPES.get(msg.type, 'unknown')})", _FIX)
            nodes.append(msg)
            offsets.append(pos)
        pos = start + size
    if metadata is None:
        raise ConfigError(f"{p}: byte 0", "the file is empty: no GlobalMetadata message", _FIX)
    return EtFile(str(p), metadata, tuple(nodes), tuple(offsets))


def encode_stream(metadata: Any, nodes: Iterable[Any]) -> bytes:
    """The metadata and nodes as Chakra's length-delimited stream."""
    out = bytearray()
    for msg in (metadata, *nodes):
        body = msg.SerializeToString(deterministic=True)
        out += encode_varint(len(body))
        out += body
    return bytes(out)


def write_et(path: str | Path, metadata: Any, nodes: Iterable[Any]) -> Path:
    """Write one Chakra file atomically (:func:`topotrain.util.atomic.atomic_write`)."""
    data = encode_stream(metadata, nodes)
    return atomic_write(path, lambda fh: fh.write(data), make_parents=True, field="--out")
