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

/// Decode a msgpack payload: exactly one map with string keys, nested at most
/// [`MAX_NESTING_DEPTH`] deep. Bytes after the value, a payload that is not a map, and a map key
/// that is not a string are `Malformed` (a frame carries one message of named fields,
/// docs/protocol.md): rmp-serde would take an integer key as a struct's field index and an
/// array as a struct's fields in order, so without the check such frames decoded positionally.
pub fn from_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    let end = check_named_fields(payload).map_err(CodecError::Malformed)?;
    // Read from the slice, not through `io::Read`: strings are then lent to the decoder rather
    // than copied into a scratch buffer, so the internally tagged enums of both protocols (which
    // serde buffers before it knows the variant) buffer borrowed keys and strings instead of
    // allocating each one (issue 17: decoding is paid once per heartbeat per node).
    let mut deserializer = rmp_serde::Deserializer::from_read_ref(payload);
    deserializer.set_max_depth(MAX_NESTING_DEPTH);
    let value =
        T::deserialize(&mut deserializer).map_err(|e| CodecError::Malformed(e.to_string()))?;
    // The deserializer reads exactly the one value the walk above measured.
    let trailing = payload.len().saturating_sub(end);
    if trailing > 0 {
        return Err(CodecError::Malformed(format!(
            "{trailing} trailing bytes after the message (a frame carries exactly one msgpack value)"
        )));
    }
    Ok(value)
}

/// The payload is a map, and every map in it (at any depth) has string keys only. Walks the
/// msgpack bytes without allocating; stops at the first problem, including a value that is cut
/// short or nested deeper than [`MAX_NESTING_DEPTH`] (reported as such, as the decoder would).
/// Returns where the value ends.
fn check_named_fields(payload: &[u8]) -> Result<usize, String> {
    match payload.first() {
        Some(0x80..=0x8f | 0xde | 0xdf) => {}
        Some(m) => {
            return Err(format!(
                "the payload is not a msgpack map (marker 0x{m:02x}); a frame carries one map of named fields"
            ));
        }
        None => return Err("empty payload".into()),
    }
    let mut pos = 0;
    skip_value(payload, &mut pos, 0)?;
    Ok(pos)
}

fn read_be(b: &[u8], pos: &mut usize, n: usize) -> Result<usize, String> {
    let bytes = b
        .get(*pos..*pos + n)
        .ok_or_else(|| "the payload ends in the middle of a value".to_string())?;
    *pos += n;
    Ok(bytes.iter().fold(0usize, |acc, &x| (acc << 8) | x as usize))
}

fn skip_bytes(b: &[u8], pos: &mut usize, n: usize) -> Result<(), String> {
    if b.len().saturating_sub(*pos) < n {
        return Err("the payload ends in the middle of a value".into());
    }
    *pos += n;
    Ok(())
}

fn is_str_marker(m: u8) -> bool {
    matches!(m, 0xa0..=0xbf | 0xd9 | 0xda | 0xdb)
}

fn skip_value(b: &[u8], pos: &mut usize, depth: usize) -> Result<(), String> {
    let m = read_be(b, pos, 1)? as u8;
    let (entries, is_map) = match m {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => return Ok(()),
        0x80..=0x8f => ((m & 0x0f) as usize, true),
        0x90..=0x9f => ((m & 0x0f) as usize, false),
        0xa0..=0xbf => return skip_bytes(b, pos, (m & 0x1f) as usize),
        0xc4 | 0xd9 => {
            let n = read_be(b, pos, 1)?;
            return skip_bytes(b, pos, n);
        }
        0xc5 | 0xda => {
            let n = read_be(b, pos, 2)?;
            return skip_bytes(b, pos, n);
        }
        0xc6 | 0xdb => {
            let n = read_be(b, pos, 4)?;
            return skip_bytes(b, pos, n);
        }
        0xc7..=0xc9 => {
            let width = match m {
                0xc7 => 1,
                0xc8 => 2,
                _ => 4,
            };
            let n = read_be(b, pos, width)?;
            return skip_bytes(b, pos, n + 1);
        }
        0xca | 0xce | 0xd2 => return skip_bytes(b, pos, 4),
        0xcb | 0xcf | 0xd3 => return skip_bytes(b, pos, 8),
        0xcc | 0xd0 => return skip_bytes(b, pos, 1),
        0xcd | 0xd1 => return skip_bytes(b, pos, 2),
        0xd4 => return skip_bytes(b, pos, 2),
        0xd5 => return skip_bytes(b, pos, 3),
        0xd6 => return skip_bytes(b, pos, 5),
        0xd7 => return skip_bytes(b, pos, 9),
        0xd8 => return skip_bytes(b, pos, 17),
        0xdc => (read_be(b, pos, 2)?, false),
        0xdd => (read_be(b, pos, 4)?, false),
        0xde => (read_be(b, pos, 2)?, true),
        0xdf => (read_be(b, pos, 4)?, true),
        0xc1 => return Err("0xc1 is not a msgpack marker".into()),
    };
    if depth >= MAX_NESTING_DEPTH {
        return Err(format!(
            "arrays and maps nested deeper than {MAX_NESTING_DEPTH} levels"
        ));
    }
    // Every entry takes at least one byte, so a count that lies ends at the payload's end.
    for _ in 0..entries {
        if is_map {
            let key = *b
                .get(*pos)
                .ok_or_else(|| "the payload ends in the middle of a map".to_string())?;
            if !is_str_marker(key) {
                return Err(format!(
                    "a map key is not a string (marker 0x{key:02x}); fields are named, never positional"
                ));
            }
            skip_value(b, pos, depth + 1)?;
        }
        skip_value(b, pos, depth + 1)?;
    }
    Ok(())
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

/// Capacity a [`FrameDecoder`] keeps once it holds nothing: one large frame (a whole directory
/// answer at a join) must not stay allocated for the life of a connection, since a coordinator
/// holds one decoder per node.
pub const DECODER_RETAINED_CAPACITY: usize = 16 * 1024;

/// Append a message as one length-prefixed frame to `out` (no intermediate buffer), refusing to
/// produce one over `limit`; on an error `out` is left as it was.
pub fn encode_frame_into<T: Serialize>(
    msg: &T,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    encode_frame_with(limit, out, |out| {
        msg.serialize(&mut rmp_serde::Serializer::new(out).with_struct_map())
    })
}

/// Append one length-prefixed frame to `out` whose payload `write` appends, refusing to produce
/// one over `limit`; on an error `out` is left as it was. For hand-assembled payloads (e.g. a
/// heartbeat answer with a shared, pre-encoded part).
pub fn encode_frame_with<E: std::fmt::Display>(
    limit: usize,
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), CodecError> {
    let at = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX]);
    if let Err(e) = write(out) {
        out.truncate(at);
        return Err(CodecError::Encode(e.to_string()));
    }
    let size = out.len() - at - LENGTH_PREFIX;
    if size > limit {
        out.truncate(at);
        return Err(CodecError::Oversized { size, limit });
    }
    out[at..at + LENGTH_PREFIX].copy_from_slice(&(size as u32).to_be_bytes());
    Ok(())
}

/// Incremental frame splitter. Consumed frames advance a read offset (no copy of what follows
/// per frame); the bytes are compacted when new ones arrive, and an empty decoder gives back
/// capacity over [`DECODER_RETAINED_CAPACITY`].
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Start of the bytes not yet returned in `buf`.
    start: usize,
    limit: usize,
}

impl FrameDecoder {
    pub fn new(limit: usize) -> FrameDecoder {
        FrameDecoder {
            buf: Vec::new(),
            start: 0,
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
        &self.buf[self.start..]
    }

    /// Bytes allocated for buffering (what this decoder costs in memory).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Append received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Where the next complete frame's payload lies in `buf`, `Ok(None)` if more bytes are
    /// needed, or an error if the announced length is over the cap (checked before the body
    /// arrives).
    fn next_frame(&self) -> Result<Option<std::ops::Range<usize>>, CodecError> {
        let pending = &self.buf[self.start..];
        if pending.len() < LENGTH_PREFIX {
            return Ok(None);
        }
        let len = u32::from_be_bytes([pending[0], pending[1], pending[2], pending[3]]) as usize;
        if len > self.limit {
            return Err(CodecError::Oversized {
                size: len,
                limit: self.limit,
            });
        }
        if pending.len() < LENGTH_PREFIX + len {
            return Ok(None);
        }
        let at = self.start + LENGTH_PREFIX;
        Ok(Some(at..at + len))
    }

    /// Mark the frame ending at `end` as returned.
    fn consume(&mut self, end: usize) {
        self.start = end;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > DECODER_RETAINED_CAPACITY {
                self.buf.shrink_to(DECODER_RETAINED_CAPACITY);
            }
        }
    }

    /// The next complete payload, `Ok(None)` if more bytes are needed, or an error if the
    /// announced length is over the cap (checked before the body arrives).
    pub fn next_payload(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        let Some(frame) = self.next_frame()? else {
            return Ok(None);
        };
        let payload = self.buf[frame.clone()].to_vec();
        self.consume(frame.end);
        Ok(Some(payload))
    }

    /// `f` of the next complete payload where it lies in the buffer (no copy), `Ok(None)` if
    /// more bytes are needed; the frame is consumed whatever `f` returns.
    pub fn with_next_payload<R>(
        &mut self,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, CodecError> {
        let Some(frame) = self.next_frame()? else {
            return Ok(None);
        };
        let r = f(&self.buf[frame.clone()]);
        self.consume(frame.end);
        Ok(Some(r))
    }

    /// The next complete message, decoded where it lies (no copy of the payload). A frame that
    /// does not decode is consumed all the same, as with [`FrameDecoder::next_payload`].
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, CodecError> {
        let Some(frame) = self.next_frame()? else {
            return Ok(None);
        };
        let decoded = from_payload(&self.buf[frame.clone()]);
        self.consume(frame.end);
        decoded.map(Some)
    }

    /// Call at end of stream: an error if a partial frame is buffered.
    pub fn finish(&self) -> Result<(), CodecError> {
        let pending = self.buffered();
        if pending.is_empty() {
            return Ok(());
        }
        let expected = if pending.len() >= LENGTH_PREFIX {
            LENGTH_PREFIX
                + u32::from_be_bytes([pending[0], pending[1], pending[2], pending[3]]) as usize
        } else {
            LENGTH_PREFIX
        };
        Err(CodecError::Truncated {
            buffered: pending.len(),
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
        // A map holding arrays of one element nested ever deeper, decoded as a dynamic value.
        let nested = |depth: usize| {
            let mut bytes = vec![0x81, 0xa1, b'k'];
            bytes.extend(vec![0x91; depth - 1]);
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

    /// A coordinator keeps one decoder per node: a whole-directory frame at the join must not
    /// stay allocated once it has been decoded.
    #[test]
    fn a_large_frame_does_not_stay_allocated_once_decoded() {
        let big = Msg {
            a: 1,
            b: "d".repeat(400 * 1024),
        };
        let small = Msg {
            a: 2,
            b: "s".into(),
        };
        let mut bytes = encode_frame(&big, 1 << 20).unwrap();
        let big_len = bytes.len();
        bytes.extend(encode_frame(&small, 1 << 20).unwrap());
        let mut d = FrameDecoder::new(1 << 20);
        // The large frame and the start of the next arrive in one read.
        let split = bytes.len() - 3;
        d.push(&bytes[..split]);
        assert_eq!(d.next_message::<Msg>().unwrap(), Some(big));
        assert_eq!(d.next_message::<Msg>().unwrap(), None);
        assert_eq!(d.buffered(), &bytes[big_len..split]);
        d.push(&bytes[split..]);
        assert_eq!(d.next_message::<Msg>().unwrap(), Some(small));
        d.finish().unwrap();
        assert!(
            d.capacity() <= DECODER_RETAINED_CAPACITY,
            "{} bytes kept after the frames were decoded",
            d.capacity()
        );
    }

    #[test]
    fn frames_encoded_in_place_equal_encoded_frames_and_errors_leave_the_buffer() {
        let msg = Msg {
            a: 3,
            b: "z".repeat(40),
        };
        let mut out = b"kept".to_vec();
        encode_frame_into(&msg, 1024, &mut out).unwrap();
        let mut expected = b"kept".to_vec();
        expected.extend(encode_frame(&msg, 1024).unwrap());
        assert_eq!(out, expected);
        assert!(matches!(
            encode_frame_into(&msg, 16, &mut out),
            Err(CodecError::Oversized { limit: 16, .. })
        ));
        assert_eq!(out, expected);
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

    /// Found by `testbed fuzz --target app-decoder --seed 1` (case 21298): rmp-serde takes an
    /// integer map key as a struct's field *index*, so a map with a key `1` set the second field
    /// of whatever type decoded it. The app endpoint decodes each frame twice (its envelope, then
    /// the request) and the two disagreed on which field such a key was.
    #[test]
    fn integer_map_keys_are_malformed_not_positional_fields() {
        use crate::protocol::app::AppRequest;
        // {"type": "release", "request_id": 5, 1: 42}
        let mut payload = vec![0x83, 0xa4];
        payload.extend_from_slice(b"type");
        payload.push(0xa7);
        payload.extend_from_slice(b"release");
        payload.push(0xaa);
        payload.extend_from_slice(b"request_id");
        payload.extend_from_slice(&[0x05, 0x01, 0x2a]);
        let err = from_payload::<AppRequest>(&payload).unwrap_err();
        assert!(
            matches!(&err, CodecError::Malformed(m) if m.contains("not a string")),
            "{err:?}"
        );
        // The same map with the key spelled out is a release of container 42.
        let mut named = payload[..payload.len() - 2].to_vec();
        named[0] = 0x83;
        named.push(0xac);
        named.extend_from_slice(b"container_id");
        named.push(0x2a);
        assert!(matches!(
            from_payload::<AppRequest>(&named),
            Ok(AppRequest::Release(r)) if r.container_id.0 == 42
        ));
    }

    /// A payload is one msgpack *map* (docs/protocol.md §2): serde's internally tagged enums
    /// also took an array, its first element as the `type` (`["release", 5, 42]` was a release).
    #[test]
    fn a_payload_that_is_not_a_map_is_malformed() {
        use crate::protocol::app::AppRequest;
        let mut payload = vec![0x93, 0xa7];
        payload.extend_from_slice(b"release");
        payload.extend_from_slice(&[0x05, 0x2a]);
        let err = from_payload::<AppRequest>(&payload).unwrap_err();
        assert!(
            matches!(&err, CodecError::Malformed(m) if m.contains("map")),
            "{err:?}"
        );
    }
}
