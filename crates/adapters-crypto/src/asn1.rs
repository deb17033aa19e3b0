//! The few ASN.1 facts this crate checks itself before handing DER to p256: which algorithm and
//! which curve a key names.
//!
//! p256 checks the curve of a PKCS#8 key and of a SubjectPublicKeyInfo, but it does not look at
//! the curve a SEC1 `EC PRIVATE KEY` names, and it reports every mismatch as one opaque error.
//! Reading the identifiers here first lets a secp256k1 key (same size, same encoding) be refused
//! rather than silently read as a P-256 scalar, and lets the error say which curve was found.

use p256::pkcs8::der::asn1::{AnyRef, BitStringRef, ContextSpecific, OctetStringRef};
use p256::pkcs8::der::{self, Decode, Reader, SliceReader, Tag, TagNumber, Tagged};
use p256::pkcs8::{AssociatedOid, ObjectIdentifier};

use crate::error::KeyError;

/// `id-ecPublicKey` (RFC 5480), the algorithm of every elliptic-curve key.
pub(crate) const ID_EC_PUBLIC_KEY: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");

/// `prime256v1` (also `secp256r1`, NIST P-256).
pub(crate) const PRIME256V1: ObjectIdentifier = p256::NistP256::OID;

/// Key algorithms that are worth naming in an error; anything else is shown as its OID.
const ALGORITHM_NAMES: &[(&str, &str)] = &[
    ("1.2.840.113549.1.1.1", "rsaEncryption"),
    ("1.2.840.113549.1.1.10", "RSASSA-PSS"),
    ("1.2.840.10040.4.1", "DSA"),
    ("1.3.101.110", "X25519"),
    ("1.3.101.111", "X448"),
    ("1.3.101.112", "Ed25519"),
    ("1.3.101.113", "Ed448"),
    ("1.3.132.1.12", "id-ecDH"),
    ("1.3.132.1.13", "id-ecMQV"),
];

/// Named curves that are worth naming in an error.
const CURVE_NAMES: &[(&str, &str)] = &[
    ("1.3.132.0.10", "secp256k1"),
    ("1.3.132.0.34", "secp384r1"),
    ("1.3.132.0.35", "secp521r1"),
    ("1.2.840.10045.3.1.1", "prime192v1"),
    ("1.3.132.0.33", "secp224r1"),
    ("1.3.36.3.3.2.8.1.1.7", "brainpoolP256r1"),
    ("1.2.156.10197.1.301", "SM2"),
];

fn named(oid: ObjectIdentifier, table: &[(&str, &str)]) -> String {
    let dotted = oid.to_string();
    match table.iter().find(|(o, _)| *o == dotted) {
        Some((_, name)) => format!("{name} ({dotted})"),
        None => dotted,
    }
}

/// Checks that an algorithm identifier is `id-ecPublicKey`.
pub(crate) fn check_algorithm(oid: ObjectIdentifier) -> Result<(), KeyError> {
    if oid == ID_EC_PUBLIC_KEY {
        Ok(())
    } else {
        Err(KeyError::UnsupportedAlgorithm {
            algorithm: named(oid, ALGORITHM_NAMES),
        })
    }
}

/// Checks that elliptic-curve domain parameters (RFC 5480 `ECParameters`) name prime256v1.
///
/// Explicit parameters are refused even when they happen to describe P-256: comparing them is
/// a source of bugs, OpenSSL writes named curves by default, and a key with one accepted
/// encoding has one key id.
pub(crate) fn check_curve(params: Option<AnyRef<'_>>, what: &'static str) -> Result<(), KeyError> {
    let Some(params) = params else {
        return Err(KeyError::MissingCurve { what });
    };
    match params.tag() {
        Tag::ObjectIdentifier => {}
        Tag::Null => {
            return Err(KeyError::WrongCurve {
                curve: "implicitCA (NULL parameters)".to_owned(),
            })
        }
        _ => {
            return Err(KeyError::WrongCurve {
                curve: "given by explicit parameters".to_owned(),
            })
        }
    }
    let oid = ObjectIdentifier::try_from(params).map_err(|e| KeyError::Malformed {
        what,
        source: Some(Box::new(e)),
    })?;
    if oid == PRIME256V1 {
        Ok(())
    } else {
        Err(KeyError::WrongCurve {
            curve: named(oid, CURVE_NAMES),
        })
    }
}

/// The `parameters [0]` field of a SEC1 `ECPrivateKey` (RFC 5915), read without interpreting
/// the rest of the structure, which p256 checks when it reads the key.
pub(crate) fn sec1_parameters(der_bytes: &[u8]) -> der::Result<Option<AnyRef<'_>>> {
    let mut reader = SliceReader::new(der_bytes)?;
    let params = reader.sequence(|r| {
        let _version = u8::decode(r)?;
        let _private_key = OctetStringRef::decode(r)?;
        let params = ContextSpecific::<AnyRef<'_>>::decode_explicit(r, TagNumber::N0)?;
        let _public_key = ContextSpecific::<BitStringRef<'_>>::decode_explicit(r, TagNumber::N1)?;
        Ok(params.map(|p| p.value))
    })?;
    reader.finish(params)
}

/// The curve an `EC PARAMETERS` PEM block (what `openssl ecparam -genkey` writes before the key
/// unless told `-noout`) names.
pub(crate) fn check_ec_parameters_block(der_bytes: &[u8]) -> Result<(), KeyError> {
    let params = AnyRef::from_der(der_bytes).map_err(|e| KeyError::Malformed {
        what: "EC PARAMETERS block",
        source: Some(Box::new(e)),
    })?;
    check_curve(Some(params), "EC PARAMETERS block")
}
