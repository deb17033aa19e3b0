//! The canonical byte form of a JSON value: what signatures and digest pins are computed over.
//!
//! Two documents that mean the same thing must give the same bytes, whatever their key order or
//! whitespace, and the bytes must read back to the same value. The form is: UTF-8, object keys
//! sorted by their bytes, no whitespace, integers in plain decimal, and strings with only `"`,
//! `\` and control characters escaped (the five short escapes where they exist, `\u00xx` in
//! lowercase hex otherwise). Since [`Value`] has no `null` and no fractions, neither can appear.

use std::fmt::Write as _;

use crate::ids::Sha256Digest;
use crate::json::{write_escaped, Value};

/// The canonical bytes of `value`.
///
/// Values from [`crate::json::parse`] never hold duplicate keys. A value built by hand with
/// duplicates still gets deterministic bytes (members with equal keys keep their relative
/// order), but those bytes will not parse back.
pub fn canonicalize(value: &Value) -> Vec<u8> {
    let mut out = String::new();
    write(&mut out, value);
    out.into_bytes()
}

/// The SHA-256 of the canonical bytes of `value`: the digest a dependency's `sha256` pin names
/// when `value` is a manifest payload.
pub fn canonical_digest(value: &Value) -> Sha256Digest {
    Sha256Digest::of(&canonicalize(value))
}

fn write(out: &mut String, value: &Value) {
    match value {
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Integer(i) => {
            // Writing to a String cannot fail.
            let _ = write!(out, "{i}");
        }
        Value::String(s) => write_escaped(out, s),
        Value::Array(elements) => {
            out.push('[');
            for (i, v) in elements.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(out, v);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<&(String, Value)> = members.iter().collect();
            // `str` orders by bytes, which is the order the format fixes. The sort is stable, so
            // even duplicate keys in a hand-built value come out deterministically.
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_escaped(out, k);
                out.push(':');
                write(out, v);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    fn canon(text: &str) -> String {
        String::from_utf8(canonicalize(&parse(text.as_bytes()).unwrap())).unwrap()
    }

    #[test]
    fn sorts_keys_by_bytes_and_drops_whitespace() {
        assert_eq!(
            canon(r#" { "b" : [ 1 , 2 ] , "a" : { "z": true, "B": false, "é": -3 } } "#),
            r#"{"a":{"B":false,"z":true,"é":-3},"b":[1,2]}"#
        );
    }

    #[test]
    fn escapes_minimally_with_lowercase_hex() {
        assert_eq!(
            canon(r#""\"\\\/\b\f\n\r\t\u0001\u001F\u007f\u00E9\uD83D\uDE00""#),
            "\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}\u{e9}\u{1f600}\""
        );
    }

    #[test]
    fn digest_is_of_the_canonical_bytes() {
        let v = parse(br#"{"b": 1, "a": 2}"#).unwrap();
        assert_eq!(canonical_digest(&v), Sha256Digest::of(br#"{"a":2,"b":1}"#));
    }
}
