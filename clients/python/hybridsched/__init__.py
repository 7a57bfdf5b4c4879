"""Python client of the hybrid scheduler's application protocol, version 1
(docs/protocol.md). Dependency: msgpack."""

from .aio import AsyncClient, AsyncClientPool
from .client import Client, ClientPool, open_socket
from .errors import (ERROR_CODES, ClientError, ConnectError, ConnectionClosed,
                     ProtocolViolation, RequestTimeout, ServerError)
from .protocol import (CONTAINER_TYPES, MAX_FRAME, PROTOCOL_VERSION, Allocation, Endpoint,
                       Event, Grant, encode_frame)

__all__ = [
    "AsyncClient", "AsyncClientPool", "Client", "ClientPool", "open_socket", "ERROR_CODES", "ClientError", "ConnectError",
    "ConnectionClosed", "ProtocolViolation", "RequestTimeout", "ServerError", "CONTAINER_TYPES",
    "MAX_FRAME", "PROTOCOL_VERSION", "Allocation", "Endpoint", "Event", "Grant", "encode_frame",
]
__version__ = "0.1.0"
