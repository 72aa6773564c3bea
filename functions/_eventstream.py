"""Lambda's response event stream (``application/vnd.amazon.eventstream``), written for InvokeWithResponseStream.

One message on the wire (big-endian; both CRCs are CRC-32 of the bytes before them):

    total length (4) | headers length (4) | prelude CRC (4) | headers | payload | message CRC (4)

and one header is ``name length (1) | name | type 7 = string (1) | value length (2) | value``. An event carries
the headers ``:event-type`` (``PayloadChunk`` or ``InvokeComplete``), ``:message-type`` = ``event`` and
``:content-type``; botocore's own event-stream parser reads what this writes.
"""

from __future__ import annotations

import zlib

_STRING = 7


def _header(name: str, value: str) -> bytes:
    key, text = name.encode(), value.encode()
    return bytes([len(key)]) + key + bytes([_STRING]) + len(text).to_bytes(2, "big") + text


def stream_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string `headers` and `payload`."""
    head = b"".join(_header(k, v) for k, v in headers.items())
    prelude = (12 + len(head) + len(payload) + 4).to_bytes(4, "big") + len(head).to_bytes(4, "big")
    message = prelude + zlib.crc32(prelude).to_bytes(4, "big") + head + payload
    return message + zlib.crc32(message).to_bytes(4, "big")


def stream_event(event_type: str, payload: bytes, *, content_type: str = "application/octet-stream") -> bytes:
    """An ``event`` message of type `event_type` (``PayloadChunk``, ``InvokeComplete``)."""
    return stream_message({":event-type": event_type, ":content-type": content_type, ":message-type": "event"},
                          payload)
