"""A handler whose worker dies in the middle of posting its result (run inside a local-runtime worker)."""

from __future__ import annotations

import os
import socket
from typing import Any


def torn_reply(event: Any, context: Any) -> dict[str, Any]:
    """Post the first bytes of a result that announces more, then exit before sending the rest."""
    host, port = os.environ["AWS_LAMBDA_RUNTIME_API"].rsplit(":", 1)
    body = b'{"ok": true, "rollout_id": "r-'
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(f"POST /2018-06-01/runtime/invocation/{context.aws_request_id}/response HTTP/1.1\r\n"
                     f"Host: {host}\r\nContent-Length: 4096\r\nContent-Type: application/json\r\n\r\n".encode()
                     + body)
        conn.shutdown(socket.SHUT_WR)  # the shim sees the end of the stream after 30 of 4096 bytes
        conn.recv(4096)  # its answer: it has taken the torn reply
    os._exit(1)
