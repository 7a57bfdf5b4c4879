//! Client failures.

use scheduler_core::codec::CodecError;
use scheduler_core::protocol::app::{ErrorCode, ErrorFrame};

/// Why a request (or a connection) failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The endpoint could not be reached.
    #[error("cannot connect to {endpoint}: {message}")]
    Connect { endpoint: String, message: String },
    /// The connection ended before the answer arrived (or was already closed).
    #[error("connection to {endpoint} closed{}", .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed {
        endpoint: String,
        reason: Option<String>,
    },
    /// The worker refused the request (or the connection) with an error frame.
    #[error("the worker refused: {} ({:?}{})", .0.message, .0.code, if .0.retryable { ", retryable" } else { "" })]
    Server(ErrorFrame),
    /// The worker answered with a frame that does not answer this request.
    #[error("unexpected answer from the worker: {0}")]
    Unexpected(String),
    /// A frame could not be encoded or decoded.
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
}

impl ClientError {
    /// The worker's error frame, if that is what this is.
    pub fn server(&self) -> Option<&ErrorFrame> {
        match self {
            ClientError::Server(e) => Some(e),
            _ => None,
        }
    }

    /// The worker's error code, if the worker refused.
    pub fn code(&self) -> Option<ErrorCode> {
        self.server().map(|e| e.code)
    }

    /// Whether sending the same request again later may succeed: the worker said so, or the
    /// transport failed (a new connection may work).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Server(e) => e.retryable,
            ClientError::Connect { .. } | ClientError::Closed { .. } => true,
            ClientError::Unexpected(_) | ClientError::Codec(_) => false,
        }
    }
}
