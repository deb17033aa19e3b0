//! The typed notation of an operation parameter record, `TYPE:VALUE[,TYPE:VALUE...]`, as
//! `guild check --params`, `guild resolve --params` and a manifest's `check_params` write it.
//!
//! Fields are packed in order with C's rules for a struct of them: each at the next offset that
//! is a multiple of its size, the record padded to a multiple of its largest field's size; in
//! this machine's byte order (the provider runs on it). Reading a record from a file (`@FILE` on
//! the command line) is the caller's business: this module touches nothing outside its input.

use std::fmt;

/// The most bytes a record may have: what the operation service accepts.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// How many characters of a rejected field an error keeps.
const ERROR_TEXT_CHARS: usize = 40;

/// The field types of the notation, in the order the errors list them.
pub const FIELD_TYPES: &[&str] = &[
    "u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f32", "f64",
];

/// An operation parameter record, in the bytes the provider receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamRecord(pub Vec<u8>);

/// Why a parameter record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// A field without the `:` between its type and value.
    #[error("{field:?} is not TYPE:VALUE (for example f32:2.0 or u32:8)")]
    NotTypeValue {
        /// The field as written.
        field: String,
    },
    /// A type outside [`FIELD_TYPES`].
    #[error("{ty:?} is not a field type (u8 i8 u16 i16 u32 i32 u64 i64 f32 f64)")]
    UnknownType {
        /// The type as written.
        ty: String,
    },
    /// A value its type cannot hold.
    #[error("{ty}:{value}: {reason}")]
    BadValue {
        /// The field's type.
        ty: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
    /// No bytes at all.
    #[error("the parameter record is empty")]
    Empty,
    /// More bytes than [`MAX_RECORD_BYTES`].
    #[error(
        "the parameter record has {size} bytes, above the {MAX_RECORD_BYTES} the service accepts"
    )]
    TooLarge {
        /// The record's size.
        size: usize,
    },
}

/// A record written in the typed notation, kept with the text it was written in: what a
/// manifest's `check_params` holds, so that the payload is written back byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    text: String,
    record: ParamRecord,
}

impl ParamSpec {
    /// Parses `text` with [`ParamRecord::parse_fields`].
    pub fn parse(text: &str) -> Result<Self, ParamsError> {
        Ok(ParamSpec {
            record: ParamRecord::parse_fields(text)?,
            text: text.to_owned(),
        })
    }

    /// The notation as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The record it packs to.
    pub fn record(&self) -> &ParamRecord {
        &self.record
    }
}

impl fmt::Display for ParamSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl ParamRecord {
    /// Parses `TYPE:VALUE[,TYPE:VALUE...]` (TYPE one of [`FIELD_TYPES`]), packed as the module
    /// documentation says.
    pub fn parse_fields(s: &str) -> Result<Self, ParamsError> {
        let mut out = Vec::new();
        let mut largest = 1;
        for field in s.split(',') {
            let (ty, value) = field
                .split_once(':')
                .ok_or_else(|| ParamsError::NotTypeValue { field: clip(field) })?;
            let bytes = encode(ty.trim(), value.trim())?;
            let align = bytes.len();
            largest = largest.max(align);
            out.resize(out.len().next_multiple_of(align), 0);
            out.extend_from_slice(&bytes);
            if out.len() > MAX_RECORD_BYTES {
                return Err(ParamsError::TooLarge { size: out.len() });
            }
        }
        out.resize(out.len().next_multiple_of(largest), 0);
        Self::from_bytes(out)
    }

    /// Takes raw bytes as a record, refusing an empty or oversized one.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, ParamsError> {
        if bytes.is_empty() {
            return Err(ParamsError::Empty);
        }
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(ParamsError::TooLarge { size: bytes.len() });
        }
        Ok(ParamRecord(bytes))
    }
}

fn clip(text: &str) -> String {
    text.chars().take(ERROR_TEXT_CHARS).collect()
}

/// One field's bytes in native byte order.
fn encode(ty: &str, value: &str) -> Result<Vec<u8>, ParamsError> {
    macro_rules! native {
        ($t:ty) => {
            value
                .parse::<$t>()
                .map(|v| v.to_ne_bytes().to_vec())
                .map_err(|e| ParamsError::BadValue {
                    ty: ty.to_owned(),
                    value: clip(value),
                    reason: e.to_string(),
                })
        };
    }
    match ty {
        "u8" => native!(u8),
        "i8" => native!(i8),
        "u16" => native!(u16),
        "i16" => native!(i16),
        "u32" => native!(u32),
        "i32" => native!(i32),
        "u64" => native!(u64),
        "i64" => native!(i64),
        "f32" => native!(f32),
        "f64" => native!(f64),
        _ => Err(ParamsError::UnknownType { ty: clip(ty) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each field at a multiple of its size, the record padded to its largest field, as
    /// `struct { uint8_t; float; uint16_t; double; uint8_t; }` is laid out by C.
    #[test]
    fn fields_are_packed_with_c_alignment() {
        let r = ParamRecord::parse_fields("u8:1,f32:2.0,u16:3,f64:4,u8:5")
            .unwrap()
            .0;
        let mut want = vec![1u8, 0, 0, 0];
        want.extend(2.0f32.to_ne_bytes());
        want.extend(3u16.to_ne_bytes());
        want.extend([0; 6]);
        want.extend(4.0f64.to_ne_bytes());
        want.extend([5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(r, want);
        let r = ParamRecord::parse_fields("u32:8, f32:2.5").unwrap().0;
        assert_eq!(r.len(), 8);
        assert_eq!(&r[4..], &2.5f32.to_ne_bytes());
    }

    #[test]
    fn bad_notation_is_refused_with_the_field() {
        for (bad, says) in [
            ("f32", "not TYPE:VALUE"),
            ("q32:1", "not a field type"),
            ("u8:300", "u8:300"),
            ("f32:x", "f32:x"),
            ("", "not TYPE:VALUE"),
        ] {
            let e = ParamRecord::parse_fields(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(ParamRecord::from_bytes(Vec::new()), Err(ParamsError::Empty));
        let huge = "u64:1,".repeat(MAX_RECORD_BYTES / 8) + "u64:1";
        assert!(matches!(
            ParamRecord::parse_fields(&huge),
            Err(ParamsError::TooLarge { .. })
        ));
    }
}
