//! Wire messages: one enum per direction, every variant a documented struct, msgpack with named
//! fields, internally tagged by a `type` field. See `docs/protocol.md` for the app protocol.

pub mod app;
pub mod cluster;
pub mod limits;
pub(crate) mod tag_first;

use serde::Deserialize;

/// The part of any frame needed to route or reject it before decoding it fully: its `type` tag
/// and, if present, its `request_id`. Lets a server name an unknown message type in its error.
#[derive(Debug, Clone, Deserialize)]
pub struct Envelope {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub request_id: Option<u64>,
}
