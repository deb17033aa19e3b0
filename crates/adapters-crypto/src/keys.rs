//! P-256 keys: reading and writing them as PEM and DER, their key ids, and signing.
//!
//! Each key has one accepted public encoding (SubjectPublicKeyInfo DER, named curve, uncompressed
//! point), because the key id is a hash of that encoding: if two encodings of one key were both
//! accepted, one key would have two ids, and a trust entry or a revocation made under one id
//! would miss signatures made under the other.

use std::fmt;
use std::hash::{Hash, Hasher};

use guild_ports::signature::KeyId;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{self, Signature};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::elliptic_curve::zeroize::Zeroizing;
use p256::pkcs8::der::pem::{self, LineEnding};
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, PrivateKeyInfo, SubjectPublicKeyInfoRef};
use rand_core::{OsRng, RngCore};

use crate::asn1;
use crate::error::KeyError;

/// The longest DER encoding of a P-256 ECDSA signature: a SEQUENCE header and two INTEGERs of at
/// most 33 bytes (32 plus a sign byte), each with a two-byte header.
pub const MAX_SIGNATURE_DER_BYTES: usize = 2 + 2 * (2 + 33);

const PKCS8_LABEL: &str = "PRIVATE KEY";
const SEC1_LABEL: &str = "EC PRIVATE KEY";
const ENCRYPTED_PKCS8_LABEL: &str = "ENCRYPTED PRIVATE KEY";
const EC_PARAMETERS_LABEL: &str = "EC PARAMETERS";
const PUBLIC_KEY_LABEL: &str = "PUBLIC KEY";

/// How many times [`SigningKey::generate`] draws 32 random bytes looking for a valid scalar. A
/// draw fails with probability about 2^-32, so running out means the generator is broken.
const GENERATE_ATTEMPTS: usize = 8;

/// PEM errors do not implement `std::error::Error` in the build p256 uses, so their text is kept.
fn bad_pem(what: &'static str) -> impl FnOnce(pem::Error) -> KeyError {
    move |e| KeyError::Pem {
        what,
        source: e.to_string().into(),
    }
}

fn malformed<E>(what: &'static str) -> impl FnOnce(E) -> KeyError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| KeyError::Malformed {
        what,
        source: Some(Box::new(e)),
    }
}

/// A P-256 private key that signs with ECDSA over SHA-256.
///
/// Its secret scalar is wiped from memory when the key is dropped (p256's types do that), and
/// `Debug` shows only the key id.
#[derive(Clone)]
pub struct SigningKey {
    inner: ecdsa::SigningKey,
    public: PublicKey,
}

impl SigningKey {
    /// Generates a new key from the operating system's random number generator.
    pub fn generate() -> Result<Self, KeyError> {
        for _ in 0..GENERATE_ATTEMPTS {
            let mut bytes = Zeroizing::new(p256::FieldBytes::default());
            // Indexing, not `as_mut_slice`: generic-array 0.14.9 deprecates that method, and a
            // runner that resolves its own lock file gets that release.
            OsRng
                .try_fill_bytes(&mut bytes[..])
                .map_err(|e| KeyError::Random {
                    source: e.to_string().into(),
                })?;
            // Zero and values at or above the group order are not scalars; draw again.
            if let Ok(secret) = p256::SecretKey::from_bytes(&bytes) {
                return Self::from_secret(&secret);
            }
        }
        Err(KeyError::Random {
            source: format!("no valid scalar in {GENERATE_ATTEMPTS} draws").into(),
        })
    }

    fn from_secret(secret: &p256::SecretKey) -> Result<Self, KeyError> {
        Ok(SigningKey {
            inner: ecdsa::SigningKey::from(secret),
            public: PublicKey::from_point(secret.public_key())?,
        })
    }

    /// Reads a private key from PEM: PKCS#8 (`PRIVATE KEY`, what `openssl genpkey` writes) or
    /// SEC1 (`EC PRIVATE KEY`, what `openssl ecparam -genkey` writes, optionally preceded by
    /// its `EC PARAMETERS` block). Encrypted keys are refused with a hint.
    pub fn from_pem(text: &str) -> Result<Self, KeyError> {
        let text = skip_ec_parameters(text)?;
        let (label, der) = pem::decode_vec(text.as_bytes()).map_err(bad_pem("private key"))?;
        let der = Zeroizing::new(der);
        match label {
            PKCS8_LABEL => Self::from_pkcs8_der(&der),
            SEC1_LABEL => Self::from_sec1_der(&der),
            ENCRYPTED_PKCS8_LABEL => Err(KeyError::EncryptedPrivateKey),
            other => Err(KeyError::UnexpectedPemLabel {
                found: other.to_owned(),
                expected: "PRIVATE KEY (PKCS#8) or EC PRIVATE KEY (SEC1)",
            }),
        }
    }

    /// Reads a PKCS#8 `PrivateKeyInfo` (version 1 or 2) holding a P-256 key.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, KeyError> {
        const WHAT: &str = "PKCS#8 private key";
        let info = PrivateKeyInfo::try_from(der).map_err(malformed(WHAT))?;
        asn1::check_algorithm(info.algorithm.oid)?;
        asn1::check_curve(info.algorithm.parameters, WHAT)?;
        // The SEC1 structure inside may name its curve again; if it does, it must agree.
        let inner = asn1::sec1_parameters(info.private_key).map_err(malformed(WHAT))?;
        if inner.is_some() {
            asn1::check_curve(inner, WHAT)?;
        }
        let secret = p256::SecretKey::try_from(info).map_err(malformed(WHAT))?;
        Self::from_secret(&secret)
    }

    /// Reads a SEC1 `ECPrivateKey` (RFC 5915). It must name its curve: p256 alone would read any
    /// 32-byte scalar, including one meant for secp256k1.
    pub fn from_sec1_der(der: &[u8]) -> Result<Self, KeyError> {
        const WHAT: &str = "SEC1 private key";
        let params = asn1::sec1_parameters(der).map_err(malformed(WHAT))?;
        asn1::check_curve(params, WHAT)?;
        // p256 also checks that the embedded public key, when present, belongs to the scalar.
        let secret = p256::SecretKey::from_sec1_der(der).map_err(malformed(WHAT))?;
        Self::from_secret(&secret)
    }

    /// The key as PKCS#8 PEM (`PRIVATE KEY`), the form this crate always writes. The text is
    /// wiped from memory when dropped.
    pub fn to_pkcs8_pem(&self) -> Result<Zeroizing<String>, KeyError> {
        self.inner
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| KeyError::Encode {
                what: "private key",
                source: Box::new(e),
            })
    }

    /// The public half.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// The key id of the public half.
    pub fn key_id(&self) -> KeyId {
        self.public.key_id
    }

    /// Signs `message` (hashed with SHA-256 here) and returns the DER signature, always in
    /// low-S form so that [`crate::P256Verifier`] and every other low-S verifier accept it.
    ///
    /// Nonces are derived deterministically (RFC 6979), so signing needs no randomness and the
    /// same key and message always give the same signature.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, KeyError> {
        let signature: Signature = self.inner.try_sign(message).map_err(|e| KeyError::Sign {
            source: Box::new(e),
        })?;
        let signature = signature.normalize_s().unwrap_or(signature);
        Ok(signature.to_der().as_bytes().to_vec())
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("key_id", &self.public.key_id)
            .finish_non_exhaustive()
    }
}

/// `openssl ecparam -genkey` without `-noout` writes an `EC PARAMETERS` block before the key.
/// Returns the text from the key onwards, after checking that the parameters name P-256.
fn skip_ec_parameters(text: &str) -> Result<&str, KeyError> {
    let trimmed = text.trim_start();
    // `decode_label` would refuse the text as a whole (it holds two blocks), so the first
    // block's boundary is matched literally.
    if !trimmed.starts_with(&format!("-----BEGIN {EC_PARAMETERS_LABEL}-----")) {
        return Ok(text);
    }
    let begin_key = "-----BEGIN EC PRIVATE KEY-----";
    let Some(at) = trimmed.find(begin_key) else {
        return Err(KeyError::UnexpectedPemLabel {
            found: EC_PARAMETERS_LABEL.to_owned(),
            expected: "PRIVATE KEY (PKCS#8) or EC PRIVATE KEY (SEC1)",
        });
    };
    let (params_block, key_block) = trimmed.split_at(at);
    let (_, der) =
        pem::decode_vec(params_block.as_bytes()).map_err(bad_pem("EC PARAMETERS block"))?;
    asn1::check_ec_parameters_block(&der)?;
    Ok(key_block)
}

/// A P-256 public key in its one accepted encoding, with its key id.
#[derive(Clone)]
pub struct PublicKey {
    pub(crate) inner: ecdsa::VerifyingKey,
    /// The uncompressed SEC1 point (`04 || x || y`), what ring reads.
    pub(crate) point: p256::EncodedPoint,
    spki_der: Vec<u8>,
    key_id: KeyId,
}

impl PublicKey {
    fn from_point(point: p256::PublicKey) -> Result<Self, KeyError> {
        let spki_der = point
            .to_public_key_der()
            .map_err(|e| KeyError::Encode {
                what: "public key",
                source: Box::new(e),
            })?
            .into_vec();
        let key_id = guild_ports::signature::key_id(&spki_der);
        Ok(PublicKey {
            inner: ecdsa::VerifyingKey::from(point),
            point: point.to_encoded_point(false),
            spki_der,
            key_id,
        })
    }

    /// Reads a SubjectPublicKeyInfo in DER. It must be `id-ecPublicKey` on the named curve
    /// `prime256v1` with an uncompressed point, encoded exactly as OpenSSL and this crate write
    /// it; any other encoding of a valid key is refused as
    /// [`KeyError::NonCanonicalPublicKey`] rather than silently given a second key id.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, KeyError> {
        const WHAT: &str = "public key (SubjectPublicKeyInfo)";
        let info = SubjectPublicKeyInfoRef::try_from(der).map_err(malformed(WHAT))?;
        asn1::check_algorithm(info.algorithm.oid)?;
        asn1::check_curve(info.algorithm.parameters, WHAT)?;
        let point = info
            .subject_public_key
            .as_bytes()
            .ok_or(KeyError::Malformed {
                what: "public key bit string (it has unused bits)",
                source: None,
            })?;
        let parsed = p256::PublicKey::from_sec1_bytes(point).map_err(malformed(
            "public key point (it is not a point on P-256 other than infinity)",
        ))?;
        if point.first() != Some(&0x04) {
            return Err(KeyError::NonCanonicalPublicKey {
                reason: "compressed point",
            });
        }
        let key = Self::from_point(parsed)?;
        if key.spki_der != der {
            return Err(KeyError::NonCanonicalPublicKey {
                reason: "its DER differs from the canonical encoding",
            });
        }
        Ok(key)
    }

    /// Reads a `PUBLIC KEY` PEM block (what `openssl pkey -pubout` writes).
    pub fn from_spki_pem(text: &str) -> Result<Self, KeyError> {
        let (label, der) = pem::decode_vec(text.as_bytes()).map_err(bad_pem("public key"))?;
        if label != PUBLIC_KEY_LABEL {
            return Err(KeyError::UnexpectedPemLabel {
                found: label.to_owned(),
                expected: "PUBLIC KEY",
            });
        }
        Self::from_spki_der(&der)
    }

    /// The SubjectPublicKeyInfo DER: what the trust store keeps and what the key id hashes.
    pub fn spki_der(&self) -> &[u8] {
        &self.spki_der
    }

    /// The key as a `PUBLIC KEY` PEM block.
    pub fn to_spki_pem(&self) -> Result<String, KeyError> {
        pem::encode_string(PUBLIC_KEY_LABEL, LineEnding::LF, &self.spki_der).map_err(|e| {
            KeyError::Encode {
                what: "public key",
                source: e.to_string().into(),
            }
        })
    }

    /// SHA-256 of [`PublicKey::spki_der`].
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.spki_der == other.spki_der
    }
}

impl Eq for PublicKey {}

impl Hash for PublicKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spki_der.hash(state);
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}
