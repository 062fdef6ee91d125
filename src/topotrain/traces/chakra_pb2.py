"""Chakra's execution-trace messages (``et_def.proto``, shipped beside this module) as Python classes.

This module holds what ``protoc`` makes of ``et_def.proto``: its ``FileDescriptorProto``, serialized
(:data:`SERIALIZED`; made with ``libprotoc 35.1`` from grpcio-tools 1.85.4 and protobuf 7.36.2 by
``python -m grpc_tools.protoc -I src/topotrain/traces --descriptor_set_out=OUT et_def.proto``, then
``FileDescriptorSet.FromString(OUT).file[0].SerializeToString()``, in base64; ``tests/test_chakra.py`` checks it
against the ``.proto`` field by field). :func:`messages` builds the message classes from it at run time
in a descriptor pool of its own, instead of shipping ``protoc``'s ``et_def_pb2.py``: that generated file
refuses every protobuf runtime older than the ``protoc`` that wrote it (``ValidateProtobufRuntimeVersion``),
while a descriptor works with any protobuf >= 4.25, and a private pool never clashes with Chakra's own
``et_def_pb2`` loaded in the same process. ``protobuf`` is imported only when :func:`messages` is first
called, so importing this module (or the CLI) costs nothing.

The enum numbers below are the schema's (``NodeType``, ``CollectiveCommType``); the test checks them too.
"""

from __future__ import annotations

import base64
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
SERIALIZED = base64.b64decode(
    "CgxldF9kZWYucHJvdG8SDkNoYWtyYVByb3RvTXNnIuwLCg5BdHRyaWJ1dGVQcm90bxISCgRuYW1lGAEgASgJUgRuYW1lEh0KCmRv"
    "Y19zdHJpbmcYAiABKAlSCWRvY1N0cmluZxIfCgpkb3VibGVfdmFsGAMgASgBSABSCWRvdWJsZVZhbBI9Cgtkb3VibGVfbGlzdBgE"
    "IAEoCzIaLkNoYWtyYVByb3RvTXNnLkRvdWJsZUxpc3RIAFIKZG91YmxlTGlzdBIdCglmbG9hdF92YWwYBSABKAJIAFIIZmxvYXRW"
    "YWwSOgoKZmxvYXRfbGlzdBgGIAEoCzIZLkNoYWtyYVByb3RvTXNnLkZsb2F0TGlzdEgAUglmbG9hdExpc3QSHQoJaW50MzJfdmFs"
    "GAcgASgFSABSCGludDMyVmFsEjoKCmludDMyX2xpc3QYCCABKAsyGS5DaGFrcmFQcm90b01zZy5JbnQzMkxpc3RIAFIJaW50MzJM"
    "aXN0Eh0KCWludDY0X3ZhbBgJIAEoA0gAUghpbnQ2NFZhbBI6CgppbnQ2NF9saXN0GAogASgLMhkuQ2hha3JhUHJvdG9Nc2cuSW50"
    "NjRMaXN0SABSCWludDY0TGlzdBIfCgp1aW50MzJfdmFsGAsgASgNSABSCXVpbnQzMlZhbBI9Cgt1aW50MzJfbGlzdBgMIAEoCzIa"
    "LkNoYWtyYVByb3RvTXNnLlVpbnQzMkxpc3RIAFIKdWludDMyTGlzdBIfCgp1aW50NjRfdmFsGA0gASgESABSCXVpbnQ2NFZhbBI9"
    "Cgt1aW50NjRfbGlzdBgOIAEoCzIaLkNoYWtyYVByb3RvTXNnLlVpbnQ2NExpc3RIAFIKdWludDY0TGlzdBIfCgpzaW50MzJfdmFs"
    "GA8gASgRSABSCXNpbnQzMlZhbBI9CgtzaW50MzJfbGlzdBgQIAEoCzIaLkNoYWtyYVByb3RvTXNnLlNpbnQzMkxpc3RIAFIKc2lu"
    "dDMyTGlzdBIfCgpzaW50NjRfdmFsGBEgASgSSABSCXNpbnQ2NFZhbBI9CgtzaW50NjRfbGlzdBgSIAEoCzIaLkNoYWtyYVByb3Rv"
    "TXNnLlNpbnQ2NExpc3RIAFIKc2ludDY0TGlzdBIhCgtmaXhlZDMyX3ZhbBgTIAEoB0gAUgpmaXhlZDMyVmFsEkAKDGZpeGVkMzJf"
    "bGlzdBgUIAEoCzIbLkNoYWtyYVByb3RvTXNnLkZpeGVkMzJMaXN0SABSC2ZpeGVkMzJMaXN0EiEKC2ZpeGVkNjRfdmFsGBUgASgG"
    "SABSCmZpeGVkNjRWYWwSQAoMZml4ZWQ2NF9saXN0GBYgASgLMhsuQ2hha3JhUHJvdG9Nc2cuRml4ZWQ2NExpc3RIAFILZml4ZWQ2"
    "NExpc3QSIwoMc2ZpeGVkMzJfdmFsGBcgASgPSABSC3NmaXhlZDMyVmFsEkMKDXNmaXhlZDMyX2xpc3QYGCABKAsyHC5DaGFrcmFQ"
    "cm90b01zZy5TZml4ZWQzMkxpc3RIAFIMc2ZpeGVkMzJMaXN0EiMKDHNmaXhlZDY0X3ZhbBgZIAEoEEgAUgtzZml4ZWQ2NFZhbBJD"
    "Cg1zZml4ZWQ2NF9saXN0GBogASgLMhwuQ2hha3JhUHJvdG9Nc2cuU2ZpeGVkNjRMaXN0SABSDHNmaXhlZDY0TGlzdBIbCghib29s"
    "X3ZhbBgbIAEoCEgAUgdib29sVmFsEjcKCWJvb2xfbGlzdBgcIAEoCzIYLkNoYWtyYVByb3RvTXNnLkJvb2xMaXN0SABSCGJvb2xM"
    "aXN0Eh8KCnN0cmluZ192YWwYHSABKAlIAFIJc3RyaW5nVmFsEj0KC3N0cmluZ19saXN0GB4gASgLMhouQ2hha3JhUHJvdG9Nc2cu"
    "U3RyaW5nTGlzdEgAUgpzdHJpbmdMaXN0Eh0KCWJ5dGVzX3ZhbBgfIAEoDEgAUghieXRlc1ZhbBI6CgpieXRlc19saXN0GCAgASgL"
    "MhkuQ2hha3JhUHJvdG9Nc2cuQnl0ZXNMaXN0SABSCWJ5dGVzTGlzdEIHCgV2YWx1ZSIkCgpEb3VibGVMaXN0EhYKBnZhbHVlcxgB"
    "IAMoAVIGdmFsdWVzIiMKCUZsb2F0TGlzdBIWCgZ2YWx1ZXMYASADKAJSBnZhbHVlcyIjCglJbnQzMkxpc3QSFgoGdmFsdWVzGAEg"
    "AygFUgZ2YWx1ZXMiIwoJSW50NjRMaXN0EhYKBnZhbHVlcxgBIAMoA1IGdmFsdWVzIiQKClVpbnQzMkxpc3QSFgoGdmFsdWVzGAEg"
    "AygNUgZ2YWx1ZXMiJAoKVWludDY0TGlzdBIWCgZ2YWx1ZXMYASADKARSBnZhbHVlcyIkCgpTaW50MzJMaXN0EhYKBnZhbHVlcxgB"
    "IAMoEVIGdmFsdWVzIiQKClNpbnQ2NExpc3QSFgoGdmFsdWVzGAEgAygSUgZ2YWx1ZXMiJQoLRml4ZWQzMkxpc3QSFgoGdmFsdWVz"
    "GAEgAygHUgZ2YWx1ZXMiJQoLRml4ZWQ2NExpc3QSFgoGdmFsdWVzGAEgAygGUgZ2YWx1ZXMiJgoMU2ZpeGVkMzJMaXN0EhYKBnZh"
    "bHVlcxgBIAMoD1IGdmFsdWVzIiYKDFNmaXhlZDY0TGlzdBIWCgZ2YWx1ZXMYASADKBBSBnZhbHVlcyIiCghCb29sTGlzdBIWCgZ2"
    "YWx1ZXMYASADKAhSBnZhbHVlcyIkCgpTdHJpbmdMaXN0EhYKBnZhbHVlcxgBIAMoCVIGdmFsdWVzIiMKCUJ5dGVzTGlzdBIWCgZ2"
    "YWx1ZXMYASADKAxSBnZhbHVlcyJeCg5HbG9iYWxNZXRhZGF0YRIYCgd2ZXJzaW9uGAEgASgJUgd2ZXJzaW9uEjIKBGF0dHIYAiAD"
    "KAsyHi5DaGFrcmFQcm90b01zZy5BdHRyaWJ1dGVQcm90b1IEYXR0ciL9AgoETm9kZRIOCgJpZBgBIAEoBFICaWQSEgoEbmFtZRgC"
    "IAEoCVIEbmFtZRIsCgR0eXBlGAMgASgOMhguQ2hha3JhUHJvdG9Nc2cuTm9kZVR5cGVSBHR5cGUSGwoJY3RybF9kZXBzGAQgAygE"
    "UghjdHJsRGVwcxIbCglkYXRhX2RlcHMYBSADKARSCGRhdGFEZXBzEioKEXN0YXJ0X3RpbWVfbWljcm9zGAYgASgEUg9zdGFydFRp"
    "bWVNaWNyb3MSJwoPZHVyYXRpb25fbWljcm9zGAcgASgEUg5kdXJhdGlvbk1pY3JvcxIuCgZpbnB1dHMYCCABKAsyFi5DaGFrcmFQ"
    "cm90b01zZy5JT0luZm9SBmlucHV0cxIwCgdvdXRwdXRzGAkgASgLMhYuQ2hha3JhUHJvdG9Nc2cuSU9JbmZvUgdvdXRwdXRzEjIK"
    "BGF0dHIYCiADKAsyHi5DaGFrcmFQcm90b01zZy5BdHRyaWJ1dGVQcm90b1IEYXR0ciJOCgZJT0luZm8SFgoGdmFsdWVzGAEgASgJ"
    "UgZ2YWx1ZXMSFgoGc2hhcGVzGAIgASgJUgZzaGFwZXMSFAoFdHlwZXMYAyABKAlSBXR5cGVzIq4BCgZUZW5zb3ISGwoJdGVuc29y"
    "X2lkGAEgASgEUgh0ZW5zb3JJZBIdCgpzdG9yYWdlX2lkGAIgASgEUglzdG9yYWdlSWQSFgoGb2Zmc2V0GAMgASgEUgZvZmZzZXQS"
    "GQoIbnVtX2VsZW0YBCABKARSB251bUVsZW0SHQoKZWxlbV9ieXRlcxgFIAEoBFIJZWxlbUJ5dGVzEhYKBmRldmljZRgGIAEoCVIG"
    "ZGV2aWNlKqEBCghOb2RlVHlwZRIQCgxJTlZBTElEX05PREUQABIRCg1NRVRBREFUQV9OT0RFEAESEQoNTUVNX0xPQURfTk9ERRAC"
    "EhIKDk1FTV9TVE9SRV9OT0RFEAMSDQoJQ09NUF9OT0RFEAQSEgoOQ09NTV9TRU5EX05PREUQBRISCg5DT01NX1JFQ1ZfTk9ERRAG"
    "EhIKDkNPTU1fQ09MTF9OT0RFEAcqswEKEkNvbGxlY3RpdmVDb21tVHlwZRIOCgpBTExfUkVEVUNFEAASCgoGUkVEVUNFEAESDgoK"
    "QUxMX0dBVEhFUhACEgoKBkdBVEhFUhADEgsKB1NDQVRURVIQBBINCglCUk9BRENBU1QQBRIOCgpBTExfVE9fQUxMEAYSEgoOUkVE"
    "VUNFX1NDQVRURVIQBxIYChRSRURVQ0VfU0NBVFRFUl9CTE9DSxAIEgsKB0JBUlJJRVIQCWIGcHJvdG8z"
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
