//! One-pass decoding of the cluster protocol's two frame enums (issue 17).
//!
//! serde's derive decodes an internally tagged enum (`#[serde(tag = "type")]`) by first buffering
//! the whole map into its private `Content` tree, since the tag may come anywhere, and then
//! decoding the variant from that tree: every field, string and container status of a heartbeat
//! (and every top-k entry and key of its answer) was allocated twice, once per heartbeat per
//! node. Our encoders (the derive, and the hand-written answer writers) always write the tag
//! first, so the cluster protocol requires it there (docs/design.md, "Cluster protocol
//! semantics") and these impls read the tag, pick the variant and decode the rest of the map
//! straight into it. The app protocol keeps the derive: its clients are written in any
//! language and may order a map's keys as they like.

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use std::fmt;

/// The index of a name in a list; the unknown name itself when it is not there (an error path:
/// only then is it copied).
struct NameIn<'a>(&'a [&'a str]);

impl<'de> DeserializeSeed<'de> for NameIn<'_> {
    type Value = Result<usize, String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameIn<'_> {
    type Value = Result<usize, String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self
            .0
            .iter()
            .position(|n| *n == v)
            .ok_or_else(|| v.to_owned()))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        match std::str::from_utf8(v) {
            Ok(s) => self.visit_str(s),
            Err(_) => Err(E::invalid_value(de::Unexpected::Bytes(v), &self)),
        }
    }
}

/// Read a frame's first field, which must be `tag`, and its value, which must be one of
/// `variants`: the index of the variant.
pub(crate) fn read_tag<'de, A: MapAccess<'de>>(
    map: &mut A,
    tag: &'static str,
    variants: &'static [&'static str],
) -> Result<usize, A::Error> {
    match map.next_key_seed(NameIn(std::slice::from_ref(&tag)))? {
        None => Err(de::Error::missing_field(tag)),
        Some(Err(first)) => Err(de::Error::custom(format_args!(
            "the first field of a cluster frame must be `{tag}`, not `{first}` (cluster frames are written tag first)"
        ))),
        Some(Ok(_)) => match map.next_value_seed(NameIn(variants))? {
            Ok(i) => Ok(i),
            Err(name) => Err(de::Error::unknown_variant(&name, variants)),
        },
    }
}

/// `impl Deserialize` for an internally tagged enum whose variants each hold one struct, reading
/// the tag first ([`read_tag`]). The names must be what the enum's `Serialize` derive writes
/// (`rename_all = "snake_case"`); `snake_case_names` lists (identifier, name) pairs for a test
/// to check that.
macro_rules! tag_first_deserialize {
    ($enum:ident, $tag:literal, { $($name:literal => $variant:ident($ty:ty)),+ $(,)? }) => {
        impl $enum {
            /// Each variant's identifier and its name on the wire (tests check the two agree).
            #[cfg(test)]
            pub(crate) fn snake_case_names() -> &'static [(&'static str, &'static str)] {
                &[$((stringify!($variant), $name)),+]
            }
        }

        impl<'de> serde::Deserialize<'de> for $enum {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct TagFirstVisitor;
                impl<'de> serde::de::Visitor<'de> for TagFirstVisitor {
                    type Value = $enum;

                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        write!(f, "a map whose first field is `{}`", $tag)
                    }

                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<$enum, A::Error> {
                        const VARIANTS: &[&str] = &[$($name),+];
                        let index = $crate::protocol::tag_first::read_tag(&mut map, $tag, VARIANTS)?;
                        let rest = serde::de::value::MapAccessDeserializer::new(map);
                        let mut candidate = 0usize;
                        $(
                            if index == candidate {
                                return <$ty as serde::Deserialize>::deserialize(rest)
                                    .map($enum::$variant);
                            }
                            candidate += 1;
                        )+
                        Err(serde::de::Error::custom(format_args!(
                            "variant {index} of {candidate} has no decoder"
                        )))
                    }
                }
                d.deserialize_map(TagFirstVisitor)
            }
        }
    };
}

pub(crate) use tag_first_deserialize;

/// What serde's `rename_all = "snake_case"` makes of a variant identifier.
#[cfg(test)]
pub(crate) fn snake_case(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
