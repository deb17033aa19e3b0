//! The `--params` argument of `guild check` and `guild resolve`: an operation's parameter record
//! written as typed fields (`guild_domain::params`, the notation a manifest's `check_params`
//! uses too) or read raw from a file; for `guild check`, optionally for one operation.

use std::path::Path;

use guild_domain::ids::OpName;
pub use guild_domain::params::ParamRecord;

/// Parses `TYPE:VALUE[,TYPE:VALUE...]` (TYPE one of u8 i8 u16 i16 u32 i32 u64 i64 f32 f64),
/// packed as a C compiler lays out a struct of those fields, or `@FILE`, taken byte for byte.
pub fn parse(s: &str) -> Result<ParamRecord, String> {
    let record = match s.strip_prefix('@') {
        Some(path) => {
            let bytes = std::fs::read(Path::new(path))
                .map_err(|e| format!("cannot read the parameter record {path}: {e}"))?;
            ParamRecord::from_bytes(bytes)
        }
        None => ParamRecord::parse_fields(s),
    };
    record.map_err(|e| e.to_string())
}

/// One `guild check --params`: a record for every operation, or for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckParams {
    /// The operation it is for (`OP=RECORD`); `None` for every operation.
    pub operation: Option<OpName>,
    /// The record.
    pub record: ParamRecord,
}

/// Parses `[OP=]RECORD`, RECORD as [`parse`] takes it. A record never holds `=` before its
/// first field (`@FILE` aside, whose path may), so the first `=` ends the operation name.
pub fn parse_for_check(s: &str) -> Result<CheckParams, String> {
    match s.split_once('=') {
        Some((op, record)) if !s.starts_with('@') => Ok(CheckParams {
            operation: Some(
                OpName::new(op.trim()).map_err(|e| format!("{op:?} before \"=\": {e}"))?,
            ),
            record: parse(record)?,
        }),
        _ => Ok(CheckParams {
            operation: None,
            record: parse(s)?,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_for_every_operation_or_for_the_one_named() {
        let all = parse_for_check("u32:8,f32:2.0").unwrap();
        assert_eq!(all.operation, None);
        assert_eq!(all.record.0.len(), 8);
        let one = parse_for_check("example.vector.axpy=u32:8,f32:2.0").unwrap();
        assert_eq!(one.operation.unwrap().as_str(), "example.vector.axpy");
        assert_eq!(one.record, all.record);
        for (bad, says) in [
            ("Bad Op=u8:1", "before \"=\""),
            ("example.op=float:1", "not a field type"),
            ("@/nonexistent/a=b", "cannot read"),
            ("example.op=@/nonexistent/params.bin", "cannot read"),
        ] {
            let e = parse_for_check(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
