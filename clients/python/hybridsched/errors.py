"""Exceptions raised by the clients.

Every failure is a :class:`ClientError`. When the worker refused a request (or the connection)
with an ``error`` frame (docs/protocol.md §7.7, §9) the exception is a :class:`ServerError`
carrying the frame's ``code``, ``retryable``, ``message`` and ``request_id``.
"""

#: Error codes of docs/protocol.md §9 (a worker may add codes; they are passed through as text).
ERROR_CODES = frozenset({
    "version_mismatch", "bad_credentials", "hello_required", "malformed_frame",
    "frame_too_large", "unknown_message", "invalid_request", "ask_too_large",
    "quota_exceeded", "invalid_token", "unknown_container", "promotion_refused",
    "guaranteed_capacity_exceeded", "coordinator_unavailable", "internal",
    "reservation_rejected", "unknown_reservation", "too_many_connections",
})


class ClientError(Exception):
    """Base class of everything the client raises (besides ValueError/TypeError for bad
    arguments, which are raised before anything is sent)."""

    #: Whether the same request may succeed when sent again later (perhaps on a new connection).
    retryable = False


class ServerError(ClientError):
    """The worker answered with an ``error`` frame."""

    def __init__(self, code, message, retryable, request_id=None):
        self.code = code
        self.message = message
        self.retryable = bool(retryable)
        self.request_id = request_id
        super().__init__(code, message, retryable, request_id)

    @classmethod
    def from_frame(cls, frame):
        return cls(
            code=str(frame.get("code")),
            message=str(frame.get("message", "")),
            retryable=bool(frame.get("retryable", False)),
            request_id=frame.get("request_id"),
        )

    def __str__(self):
        extra = ", retryable" if self.retryable else ""
        rid = "" if self.request_id is None else f", request {self.request_id}"
        return f"the worker refused: {self.message} ({self.code}{extra}{rid})"

    def __repr__(self):
        return (f"ServerError(code={self.code!r}, message={self.message!r}, "
                f"retryable={self.retryable!r}, request_id={self.request_id!r})")


class ConnectError(ClientError):
    """The endpoint could not be reached (or the TLS handshake failed)."""

    retryable = True

    def __init__(self, endpoint, message):
        self.endpoint = endpoint
        super().__init__(f"cannot connect to {endpoint}: {message}")


class ConnectionClosed(ClientError):
    """The connection ended before the answer arrived (or was already closed)."""

    retryable = True

    def __init__(self, endpoint, reason=None):
        self.endpoint = endpoint
        self.reason = reason
        super().__init__(f"connection to {endpoint} closed" + (f": {reason}" if reason else ""))


class RequestTimeout(ClientError, TimeoutError):
    """No (complete) answer or event within the given timeout. The connection stays usable:
    a late answer is kept and returned by a later call for the same request."""

    retryable = True


class ProtocolViolation(ClientError):
    """The worker sent something this client cannot understand: an undecodable or oversized
    frame, or a frame of the wrong type for the request."""
