//! The one frame codec of every protocol: a 4-byte big-endian length, then that many bytes of
//! msgpack with named fields (a map per struct, so any language can read it).
//!
//! Sans-IO: [`encode_frame`] returns bytes; [`FrameDecoder`] is fed bytes as they arrive and
//! yields whole payloads, refusing any frame over its cap before buffering it.

use serde::{Serialize, de::DeserializeOwned};

/// Default cap for application frames (1 MiB).
pub const APP_MAX_FRAME: usize = 1 << 20;
/// Default cap for cluster frames (16 MiB: heartbeats of busy nodes, views of large clusters).
pub const CLUSTER_MAX_FRAME: usize = 16 << 20;
/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 4;

/// Codec failures. `Oversized` and `Malformed` are the peer's fault and not retryable on the
/// same connection; the receiver answers with an error frame and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    Oversized { size: usize, limit: usize },
    #[error("malformed msgpack message: {0}")]
    Malformed(String),
    #[error("could not encode message: {0}")]
    Encode(String),
    #[error("connection closed in the middle of a frame ({buffered} of {expected} bytes received)")]
    Truncated { buffered: usize, expected: usize },
}

/// Encode a message as msgpack with named fields (no length prefix).
pub fn to_payload<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    rmp_serde::to_vec_named(msg).map_err(|e| CodecError::Encode(e.to_string()))
}

/// Deepest nesting of arrays and maps a payload may have. No message of either protocol nests
/// deeper than a handful of levels; the cap keeps a hostile frame from costing deep recursion.
pub const MAX_NESTING_DEPTH: usize = 32;

/// Decode a msgpack payload: exactly one value, nested at most [`MAX_NESTING_DEPTH`] deep.
/// Bytes after the value are `Malformed` (a frame carries one message, docs/protocol.md).
pub fn from_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    let mut deserializer = rmp_serde::Deserializer::new(std::io::Cursor::new(payload));
    deserializer.set_max_depth(MAX_NESTING_DEPTH);
    let value =
        T::deserialize(&mut deserializer).map_err(|e| CodecError::Malformed(e.to_string()))?;
    let consumed = usize::try_from(deserializer.position()).unwrap_or(usize::MAX);
    let trailing = payload.len().saturating_sub(consumed);
    if trailing > 0 {
        return Err(CodecError::Malformed(format!(
            "{trailing} trailing bytes after the message (a frame carries exactly one msgpack value)"
        )));
    }
    Ok(value)
}

/// Encode a message as one length-prefixed frame, refusing to produce one over `limit`.
pub fn encode_frame<T: Serialize>(msg: &T, limit: usize) -> Result<Vec<u8>, CodecError> {
    let payload = to_payload(msg)?;
    if payload.len() > limit {
        return Err(CodecError::Oversized {
            size: payload.len(),
            limit,
        });
    }
    let mut out = Vec::with_capacity(LENGTH_PREFIX + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Incremental frame splitter.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    limit: usize,
}

impl FrameDecoder {
    pub fn new(limit: usize) -> FrameDecoder {
        FrameDecoder {
            buf: Vec::new(),
            limit,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Change the cap for the frames not yet returned (e.g. a small cap until a peer has
    /// authenticated, the normal one after).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// The bytes received and not yet returned as payloads (a partial frame, its prefix first).
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Append received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete payload, `Ok(None)` if more bytes are needed, or an error if the
    /// announced length is over the cap (checked before the body arrives).
    pub fn next_payload(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        if self.buf.len() < LENGTH_PREFIX {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.limit {
            return Err(CodecError::Oversized {
                size: len,
                limit: self.limit,
            });
        }
        if self.buf.len() < LENGTH_PREFIX + len {
            return Ok(None);
        }
        let payload = self.buf[LENGTH_PREFIX..LENGTH_PREFIX + len].to_vec();
        self.buf.drain(..LENGTH_PREFIX + len);
        Ok(Some(payload))
    }

    /// The next complete message.
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, CodecError> {
        match self.next_payload()? {
            Some(p) => from_payload(&p).map(Some),
            None => Ok(None),
        }
    }

    /// Call at end of stream: an error if a partial frame is buffered.
    pub fn finish(&self) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let expected = if self.buf.len() >= LENGTH_PREFIX {
            LENGTH_PREFIX
                + u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize
        } else {
            LENGTH_PREFIX
        };
        Err(CodecError::Truncated {
            buffered: self.buf.len(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        a: u32,
        b: String,
    }

    #[test]
    fn trailing_bytes_after_the_message_are_malformed() {
        let mut payload = to_payload(&Msg {
            a: 1,
            b: "x".into(),
        })
        .unwrap();
        assert!(from_payload::<Msg>(&payload).is_ok());
        payload.push(0xc0); // a msgpack nil after the map
        let err = from_payload::<Msg>(&payload).unwrap_err();
        assert!(
            matches!(&err, CodecError::Malformed(m) if m.contains("1 trailing bytes")),
            "{err:?}"
        );
    }

    #[test]
    fn nesting_deeper_than_the_cap_is_malformed() {
        // Arrays of one element nested ever deeper, decoded as a dynamic value.
        let nested = |depth: usize| {
            let mut bytes = vec![0x91; depth];
            bytes.push(0xc0);
            bytes
        };
        assert!(from_payload::<rmpv_free::Any>(&nested(MAX_NESTING_DEPTH - 1)).is_ok());
        let err = from_payload::<rmpv_free::Any>(&nested(MAX_NESTING_DEPTH + 1)).unwrap_err();
        assert!(matches!(err, CodecError::Malformed(_)), "{err:?}");
    }

    /// A self-describing value without extra dependencies: deserialises any msgpack value.
    mod rmpv_free {
        use serde::de::{Deserialize, Deserializer, IgnoredAny};

        #[derive(Debug)]
        pub struct Any;

        impl<'de> Deserialize<'de> for Any {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Any, D::Error> {
                IgnoredAny::deserialize(d).map(|_| Any)
            }
        }
    }

    #[test]
    fn round_trip_byte_by_byte() {
        let m = Msg {
            a: 7,
            b: "x".into(),
        };
        let mut bytes = encode_frame(&m, 1024).unwrap();
        bytes.extend(
            encode_frame(
                &Msg {
                    a: 8,
                    b: "y".into(),
                },
                1024,
            )
            .unwrap(),
        );
        let mut d = FrameDecoder::new(1024);
        let mut got = vec![];
        for b in bytes {
            d.push(&[b]);
            while let Some(m) = d.next_message::<Msg>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            vec![
                Msg {
                    a: 7,
                    b: "x".into()
                },
                Msg {
                    a: 8,
                    b: "y".into()
                }
            ]
        );
        d.finish().unwrap();
    }

    #[test]
    fn named_fields_are_on_the_wire() {
        let payload = to_payload(&Msg {
            a: 1,
            b: "z".into(),
        })
        .unwrap();
        // fixmap of 2, then the key "a"
        assert_eq!(payload[0], 0x82);
        assert_eq!(&payload[1..3], &[0xa1, b'a']);
    }

    #[test]
    fn oversized_is_refused_before_the_body_arrives() {
        let mut d = FrameDecoder::new(16);
        d.push(&(1_000_000u32).to_be_bytes());
        assert_eq!(
            d.next_payload(),
            Err(CodecError::Oversized {
                size: 1_000_000,
                limit: 16
            })
        );
        assert!(matches!(
            encode_frame(&"x".repeat(100), 16),
            Err(CodecError::Oversized { .. })
        ));
    }

    #[test]
    fn malformed_and_truncated_are_reported() {
        let mut d = FrameDecoder::new(64);
        d.push(&[0, 0, 0, 2, 0xc1, 0xc1]); // 0xc1 is never valid msgpack
        assert!(matches!(
            d.next_message::<Msg>(),
            Err(CodecError::Malformed(_))
        ));
        let mut d = FrameDecoder::new(64);
        d.push(&[0, 0, 0, 9, 1, 2]);
        assert_eq!(d.next_payload(), Ok(None));
        assert_eq!(
            d.finish(),
            Err(CodecError::Truncated {
                buffered: 6,
                expected: 13
            })
        );
    }
}
