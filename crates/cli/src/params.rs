//! The `--params` notation of `guild check` and `guild resolve`: an operation's parameter record
//! written as typed fields and packed as a C compiler lays out a struct of them, or read raw
//! from a file.

use std::path::Path;

/// The most bytes a record may have: what the operation service accepts.
const MAX_BYTES: usize = 1 << 20;

/// An operation parameter record, in the bytes the provider receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamRecord(pub Vec<u8>);

/// Parses `TYPE:VALUE[,TYPE:VALUE...]` (TYPE one of u8 i8 u16 i16 u32 i32 u64 i64 f32 f64) or
/// `@FILE`.
///
/// Fields are packed in order with C's rules for a struct of them: each at the next offset that
/// is a multiple of its size, the record padded to a multiple of its largest field's size;
/// little or big endian as this machine is (the provider runs on it). `@FILE` is taken byte for
/// byte.
pub fn parse(s: &str) -> Result<ParamRecord, String> {
    if let Some(path) = s.strip_prefix('@') {
        let bytes = std::fs::read(Path::new(path))
            .map_err(|e| format!("cannot read the parameter record {path}: {e}"))?;
        return within_limit(bytes);
    }
    let mut out = Vec::new();
    let mut largest = 1;
    for field in s.split(',') {
        let (ty, value) = field
            .split_once(':')
            .ok_or_else(|| format!("{field:?} is not TYPE:VALUE (for example f32:2.0 or u32:8)"))?;
        let bytes = encode(ty.trim(), value.trim())?;
        let align = bytes.len();
        largest = largest.max(align);
        out.resize(out.len().next_multiple_of(align), 0);
        out.extend_from_slice(&bytes);
    }
    out.resize(out.len().next_multiple_of(largest), 0);
    within_limit(out)
}

fn within_limit(bytes: Vec<u8>) -> Result<ParamRecord, String> {
    if bytes.is_empty() {
        return Err("the parameter record is empty".into());
    }
    if bytes.len() > MAX_BYTES {
        return Err(format!(
            "the parameter record has {} bytes, above the {MAX_BYTES} the service accepts",
            bytes.len()
        ));
    }
    Ok(ParamRecord(bytes))
}

/// One field's bytes in native byte order.
fn encode(ty: &str, value: &str) -> Result<Vec<u8>, String> {
    let bad = |e: &dyn std::fmt::Display| format!("{ty}:{value}: {e}");
    Ok(match ty {
        "u8" => value
            .parse::<u8>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "i8" => value
            .parse::<i8>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "u16" => value
            .parse::<u16>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "i16" => value
            .parse::<i16>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "u32" => value
            .parse::<u32>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "i32" => value
            .parse::<i32>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "u64" => value
            .parse::<u64>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "i64" => value
            .parse::<i64>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "f32" => value
            .parse::<f32>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        "f64" => value
            .parse::<f64>()
            .map_err(|e| bad(&e))?
            .to_ne_bytes()
            .to_vec(),
        _ => {
            return Err(format!(
                "{ty:?} is not a field type (u8 i8 u16 i16 u32 i32 u64 i64 f32 f64)"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each field at a multiple of its size, the record padded to its largest field, as
    /// `struct { uint8_t; float; uint16_t; double; uint8_t; }` is laid out by C.
    #[test]
    fn fields_are_packed_with_c_alignment() {
        let r = parse("u8:1,f32:2.0,u16:3,f64:4,u8:5").unwrap().0;
        let mut want = vec![1u8, 0, 0, 0];
        want.extend(2.0f32.to_ne_bytes());
        want.extend(3u16.to_ne_bytes());
        want.extend([0; 6]);
        want.extend(4.0f64.to_ne_bytes());
        want.extend([5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(r, want);
        let r = parse("u32:8, f32:2.5").unwrap().0;
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
            ("@/nonexistent/params.bin", "cannot read"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
