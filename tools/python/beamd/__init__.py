"""beamd client package: the wire protocol (beamd.proto) for tools and tests.

Pure Python plus numpy and lz4; no sockets here, so it can be used with any
ZeroMQ binding (pyzmq's send_multipart / recv_multipart take the part lists).
"""

from .proto import (  # noqa: F401
    FRAME, RESULT, SERIES_END, SERIES_START, Header, Limits, ProtocolError,
    decode_header, decode_message, encode_message, parse_message)

__all__ = ["FRAME", "RESULT", "SERIES_END", "SERIES_START", "Header",
           "Limits", "ProtocolError", "decode_header", "decode_message",
           "encode_message", "parse_message"]
