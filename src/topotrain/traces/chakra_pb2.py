"""Chakra's execution-trace messages (``et_def.proto``, shipped beside this module) as Python classes.

This module holds what ``protoc`` makes of ``et_def.proto``: its ``FileDescriptorProto``, serialized
(:data:`SERIALIZED`; made with ``libprotoc 35.1`` from grpcio-tools 1.85.4 and protobuf 7.36.2 by
``python -m grpc_tools.protoc -I src/topotrain/traces --descriptor_set_out=OUT et_def.proto``, then
``FileDescriptorSet.FromString(OUT).file[0].SerializeToString()``; ``tests/test_chakra.py`` checks it
against the ``.proto`` field by field). :func:`messages` builds the message classes from it at run time
in a descriptor pool of its own, instead of shipping ``protoc``'s ``et_def_pb2.py``: that generated file
refuses every protobuf runtime older than the ``protoc`` that wrote it (``ValidateProtobufRuntimeVersion``),
while a descriptor works with any protobuf >= 4.25, and a private pool never clashes with Chakra's own
``et_def_pb2`` loaded in the same process. ``protobuf`` is imported only when :func:`messages` is first
called, so importing this module (or the CLI) costs nothing.

The enum numbers below are the schema's (``NodeType``, ``CollectiveCommType``); the test checks them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from topotrain.util.errors import ConfigError

#: ``NodeType`` of et_def.proto.
INVALID_NODE, METADATA_NODE, MEM_LOAD_NODE, MEM_STORE_NODE, COMP_NODE = 0, 1, 2, 3, 4
COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 5, 6, 7
NODE_TYPES = {0: "INVALID_NODE", 1: "METADATA_NODE", 2: "MEM_LOAD_NODE", 3: "MEM_STORE_NODE", 4: "COMP_NODE",
              5: "COMM_SEND_NODE", 6: "COMM_RECV_NODE", 7: "COMM_COLL_NODE"}
#: ``CollectiveCommType`` of et_def.proto.
COMM_TYPES = {0: "ALL_REDUCE", 1: "REDUCE", 2: "ALL_GATHER", 3: "GATHER", 4: "SCATTER", 5: "BROADCAST",
              6: "ALL_TO_ALL", 7: "REDUCE_SCATTER", 8: "REDUCE_SCATTER_BLOCK", 9: "BARRIER"}

#: The serialized ``FileDescriptorProto`` of et_def.proto (package ``ChakraProtoMsg``).
SERIALIZED = (
    b'\n\x0cet_def.proto\x12\x0eChakraProtoMsg"\xec\x0b\n\x0eAttributeProto\x12\x12\n\x04name\x18\x01 \x01(\tR\x04name\x12\x1d\n\ndoc_string\x18\x02 \x01(\tR'
    b'\tdocString\x12\x1f\n\ndouble_val\x18\x03 \x01(\x01H\x00R\tdoubleVal\x12=\n\x0bdouble_list\x18\x04 \x01(\x0b2\x1a.ChakraProtoMsg.DoubleLi'
    b'stH\x00R\ndoubleList\x12\x1d\n\tfloat_val\x18\x05 \x01(\x02H\x00R\x08floatVal\x12:\n\nfloat_list\x18\x06 \x01(\x0b2\x19.ChakraProtoMsg.Float'
    b'ListH\x00R\tfloatList\x12\x1d\n\tint32_val\x18\x07 \x01(\x05H\x00R\x08int32Val\x12:\n\nint32_list\x18\x08 \x01(\x0b2\x19.ChakraProtoMsg.Int3'
    b'2ListH\x00R\tint32List\x12\x1d\n\tint64_val\x18\t \x01(\x03H\x00R\x08int64Val\x12:\n\nint64_list\x18\n \x01(\x0b2\x19.ChakraProtoMsg.Int'
    b'64ListH\x00R\tint64List\x12\x1f\n\nuint32_val\x18\x0b \x01(\rH\x00R\tuint32Val\x12=\n\x0buint32_list\x18\x0c \x01(\x0b2\x1a.ChakraProtoMsg'
    b'.Uint32ListH\x00R\nuint32List\x12\x1f\n\nuint64_val\x18\r \x01(\x04H\x00R\tuint64Val\x12=\n\x0buint64_list\x18\x0e \x01(\x0b2\x1a.ChakraPr'
    b'otoMsg.Uint64ListH\x00R\nuint64List\x12\x1f\n\nsint32_val\x18\x0f \x01(\x11H\x00R\tsint32Val\x12=\n\x0bsint32_list\x18\x10 \x01(\x0b2\x1a.Ch'
    b'akraProtoMsg.Sint32ListH\x00R\nsint32List\x12\x1f\n\nsint64_val\x18\x11 \x01(\x12H\x00R\tsint64Val\x12=\n\x0bsint64_list\x18\x12 \x01('
    b'\x0b2\x1a.ChakraProtoMsg.Sint64ListH\x00R\nsint64List\x12!\n\x0bfixed32_val\x18\x13 \x01(\x07H\x00R\nfixed32Val\x12@\n\x0cfixed32_'
    b'list\x18\x14 \x01(\x0b2\x1b.ChakraProtoMsg.Fixed32ListH\x00R\x0bfixed32List\x12!\n\x0bfixed64_val\x18\x15 \x01(\x06H\x00R\nfixed64Val\x12'
    b'@\n\x0cfixed64_list\x18\x16 \x01(\x0b2\x1b.ChakraProtoMsg.Fixed64ListH\x00R\x0bfixed64List\x12#\n\x0csfixed32_val\x18\x17 \x01(\x0fH\x00R'
    b'\x0bsfixed32Val\x12C\n\rsfixed32_list\x18\x18 \x01(\x0b2\x1c.ChakraProtoMsg.Sfixed32ListH\x00R\x0csfixed32List\x12#\n\x0csfixe'
    b'd64_val\x18\x19 \x01(\x10H\x00R\x0bsfixed64Val\x12C\n\rsfixed64_list\x18\x1a \x01(\x0b2\x1c.ChakraProtoMsg.Sfixed64ListH\x00R\x0csfixe'
    b'd64List\x12\x1b\n\x08bool_val\x18\x1b \x01(\x08H\x00R\x07boolVal\x127\n\tbool_list\x18\x1c \x01(\x0b2\x18.ChakraProtoMsg.BoolListH\x00R\x08boolL'
    b'ist\x12\x1f\n\nstring_val\x18\x1d \x01(\tH\x00R\tstringVal\x12=\n\x0bstring_list\x18\x1e \x01(\x0b2\x1a.ChakraProtoMsg.StringListH\x00R\ns'
    b'tringList\x12\x1d\n\tbytes_val\x18\x1f \x01(\x0cH\x00R\x08bytesVal\x12:\n\nbytes_list\x18  \x01(\x0b2\x19.ChakraProtoMsg.BytesListH\x00R'
    b'\tbytesListB\x07\n\x05value"$\n\nDoubleList\x12\x16\n\x06values\x18\x01 \x03(\x01R\x06values"#\n\tFloatList\x12\x16\n\x06values\x18\x01 \x03(\x02R\x06va'
    b'lues"#\n\tInt32List\x12\x16\n\x06values\x18\x01 \x03(\x05R\x06values"#\n\tInt64List\x12\x16\n\x06values\x18\x01 \x03(\x03R\x06values"$\n\nUint32Li'
    b'st\x12\x16\n\x06values\x18\x01 \x03(\rR\x06values"$\n\nUint64List\x12\x16\n\x06values\x18\x01 \x03(\x04R\x06values"$\n\nSint32List\x12\x16\n\x06values\x18\x01'
    b' \x03(\x11R\x06values"$\n\nSint64List\x12\x16\n\x06values\x18\x01 \x03(\x12R\x06values"%\n\x0bFixed32List\x12\x16\n\x06values\x18\x01 \x03(\x07R\x06values"'
    b'%\n\x0bFixed64List\x12\x16\n\x06values\x18\x01 \x03(\x06R\x06values"&\n\x0cSfixed32List\x12\x16\n\x06values\x18\x01 \x03(\x0fR\x06values"&\n\x0cSfixed64'
    b'List\x12\x16\n\x06values\x18\x01 \x03(\x10R\x06values""\n\x08BoolList\x12\x16\n\x06values\x18\x01 \x03(\x08R\x06values"$\n\nStringList\x12\x16\n\x06values\x18\x01'
    b' \x03(\tR\x06values"#\n\tBytesList\x12\x16\n\x06values\x18\x01 \x03(\x0cR\x06values"^\n\x0eGlobalMetadata\x12\x18\n\x07version\x18\x01 \x01(\tR\x07vers'
    b'ion\x122\n\x04attr\x18\x02 \x03(\x0b2\x1e.ChakraProtoMsg.AttributeProtoR\x04attr"\xfd\x02\n\x04Node\x12\x0e\n\x02id\x18\x01 \x01(\x04R\x02id\x12\x12\n\x04name\x18\x02'
    b' \x01(\tR\x04name\x12,\n\x04type\x18\x03 \x01(\x0e2\x18.ChakraProtoMsg.NodeTypeR\x04type\x12\x1b\n\tctrl_deps\x18\x04 \x03(\x04R\x08ctrlDeps\x12\x1b\n\td'
    b"ata_deps\x18\x05 \x03(\x04R\x08dataDeps\x12*\n\x11start_time_micros\x18\x06 \x01(\x04R\x0fstartTimeMicros\x12'\n\x0fduration_micros\x18\x07 "
    b'\x01(\x04R\x0edurationMicros\x12.\n\x06inputs\x18\x08 \x01(\x0b2\x16.ChakraProtoMsg.IOInfoR\x06inputs\x120\n\x07outputs\x18\t \x01(\x0b2\x16.Cha'
    b'kraProtoMsg.IOInfoR\x07outputs\x122\n\x04attr\x18\n \x03(\x0b2\x1e.ChakraProtoMsg.AttributeProtoR\x04attr"N\n\x06IOInfo\x12'
    b'\x16\n\x06values\x18\x01 \x01(\tR\x06values\x12\x16\n\x06shapes\x18\x02 \x01(\tR\x06shapes\x12\x14\n\x05types\x18\x03 \x01(\tR\x05types"\xae\x01\n\x06Tensor\x12\x1b\n\ttensor'
    b'_id\x18\x01 \x01(\x04R\x08tensorId\x12\x1d\n\nstorage_id\x18\x02 \x01(\x04R\tstorageId\x12\x16\n\x06offset\x18\x03 \x01(\x04R\x06offset\x12\x19\n\x08num_elem\x18\x04 \x01'
    b'(\x04R\x07numElem\x12\x1d\n\nelem_bytes\x18\x05 \x01(\x04R\telemBytes\x12\x16\n\x06device\x18\x06 \x01(\tR\x06device*\xa1\x01\n\x08NodeType\x12\x10\n\x0cINVALID'
    b'_NODE\x10\x00\x12\x11\n\rMETADATA_NODE\x10\x01\x12\x11\n\rMEM_LOAD_NODE\x10\x02\x12\x12\n\x0eMEM_STORE_NODE\x10\x03\x12\r\n\tCOMP_NODE\x10\x04\x12\x12\n\x0eCOMM_S'
    b'END_NODE\x10\x05\x12\x12\n\x0eCOMM_RECV_NODE\x10\x06\x12\x12\n\x0eCOMM_COLL_NODE\x10\x07*\xb3\x01\n\x12CollectiveCommType\x12\x0e\n\nALL_REDUCE\x10\x00\x12'
    b'\n\n\x06REDUCE\x10\x01\x12\x0e\n\nALL_GATHER\x10\x02\x12\n\n\x06GATHER\x10\x03\x12\x0b\n\x07SCATTER\x10\x04\x12\r\n\tBROADCAST\x10\x05\x12\x0e\n\nALL_TO_ALL\x10\x06\x12\x12\n\x0eRED'
    b'UCE_SCATTER\x10\x07\x12\x18\n\x14REDUCE_SCATTER_BLOCK\x10\x08\x12\x0b\n\x07BARRIER\x10\tb\x06proto3'
)


@dataclass(frozen=True)
class Messages:
    """The message classes of et_def.proto (each a protobuf message class)."""

    GlobalMetadata: Any
    Node: Any
    AttributeProto: Any
    IOInfo: Any
    Tensor: Any
    DecodeError: Any


@cache
def messages() -> Messages:
    """The classes, built once per process from :data:`SERIALIZED` in a pool of their own."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from google.protobuf.message import DecodeError
    except ImportError:
        raise ConfigError("protobuf", "is not installed, and Chakra execution traces are protobuf",
                          "pip install 'protobuf>=4.25'") from None
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(SERIALIZED))

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ChakraProtoMsg.{name}"))

    return Messages(cls("GlobalMetadata"), cls("Node"), cls("AttributeProto"), cls("IOInfo"), cls("Tensor"),
                    DecodeError)
