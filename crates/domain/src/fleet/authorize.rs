//! Whether an authenticated package is the one the policy desires: the same payload, version,
//! kind and publisher as its entry, signed by a key the entry allows that is not revoked, and
//! within its publisher's scope. A fetched package that differs from what the policy names is
//! refused, whatever the registry said.

use crate::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use crate::manifest::Metadata;
use crate::trust::{authenticate, AuthError, Authenticated, SignatureCheck};
use crate::version::Version;

use super::policy::{DesiredPackage, VerifiedPolicy};

/// Why a package is not the one the fleet policy desires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorizeError {
    /// The policy does not desire the package at all.
    #[error("{package} {version}: the fleet policy does not desire this package")]
    NotDesired {
        /// The package.
        package: PackageId,
        /// The version offered.
        version: Version,
    },
    /// Another payload than the one the policy pins.
    #[error(
        "{package} {version}: the fleet policy pins payload {desired}, this package's is {found}"
    )]
    DigestDiffers {
        /// The package.
        package: PackageId,
        /// The version offered.
        version: Version,
        /// The digest the policy pins.
        desired: Sha256Digest,
        /// The package's payload digest.
        found: Sha256Digest,
    },
    /// Another version than the one the policy desires.
    #[error("{package}: the fleet policy desires version {desired}, this package is {found}")]
    VersionDiffers {
        /// The package.
        package: PackageId,
        /// The version desired.
        desired: Version,
        /// The version offered.
        found: Version,
    },
    /// Another kind than the one the policy names.
    #[error("{package} {version}: the fleet policy names a {desired}, this package is a {found}")]
    KindDiffers {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The kind desired.
        desired: PackageKind,
        /// The kind offered.
        found: PackageKind,
    },
    /// Another publisher than the one the policy names (in the manifest, or the one that
    /// authenticated it).
    #[error("{package} {version}: the fleet policy names publisher {desired}, not {found}")]
    PublisherDiffers {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The publisher desired.
        desired: PublisherId,
        /// The publisher found.
        found: PublisherId,
    },
    /// The payload digest is revoked.
    #[error("{package} {version}: payload {digest} is revoked ({reason})")]
    DigestRevoked {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The digest.
        digest: Sha256Digest,
        /// The reason.
        reason: String,
    },
    /// The key that authenticated the package is not one its entry allows.
    #[error(
        "{package} {version}: authenticated by key {key_id}, which the fleet policy does not \
         allow to sign it (allowed: {})",
        allowed.iter().map(|k| k.to_hex()).collect::<Vec<_>>().join(", ")
    )]
    KeyNotAllowed {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The key.
        key_id: Sha256Digest,
        /// The keys the entry allows.
        allowed: Vec<Sha256Digest>,
    },
    /// The key that authenticated the package is revoked.
    #[error("{package} {version}: key {key_id} is revoked ({reason})")]
    KeyRevoked {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The key.
        key_id: Sha256Digest,
        /// The reason.
        reason: String,
    },
    /// The key is not a key the policy lists for the publisher.
    #[error("{package} {version}: key {key_id} is not a key of publisher {publisher} in the fleet policy")]
    KeyNotOfPublisher {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The key.
        key_id: Sha256Digest,
        /// The publisher.
        publisher: PublisherId,
    },
    /// The package id is outside its publisher's scopes.
    #[error("{package} {version}: publisher {publisher} may not publish this package id under the fleet policy")]
    OutOfScope {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// The publisher.
        publisher: PublisherId,
    },
    /// No signature authenticated the package under the keys its entry allows.
    #[error("{package} {version}: not authenticated under the fleet policy: {error}")]
    NotAuthenticated {
        /// The package.
        package: PackageId,
        /// The version.
        version: Version,
        /// Why not.
        error: AuthError,
    },
}

/// Checks an authenticated package against its entry in the policy. `authenticated` is what
/// [`crate::trust::authenticate`] answered for `metadata` (under
/// [`VerifiedPolicy::trust_store`] or [`VerifiedPolicy::trust_store_for`]). Answers the entry.
///
/// `authenticate` answers every key whose signature verified ([`Authenticated::signed_by`]);
/// the package is authorized when one of them is a key the entry allows, unrevoked and of its
/// publisher (a package re-signed during a key rotation carries the old key's signature and the
/// new one's). Authenticating it under [`VerifiedPolicy::trust_store_for`] (or calling
/// [`authenticate_desired`]) keeps the other keys out of the decision altogether.
pub fn authorize<'p>(
    policy: &'p VerifiedPolicy,
    metadata: &Metadata,
    authenticated: &Authenticated,
) -> Result<&'p DesiredPackage, Box<AuthorizeError>> {
    let m = metadata.manifest();
    let (package, version) = (m.package_id.clone(), m.version.clone());
    let p = policy.policy();
    let Some(entry) = p.desired(&m.package_id) else {
        return Err(Box::new(AuthorizeError::NotDesired { package, version }));
    };
    for found in [metadata.payload_digest(), authenticated.payload_digest] {
        if found != entry.payload_sha256 {
            return Err(Box::new(AuthorizeError::DigestDiffers {
                package,
                version,
                desired: entry.payload_sha256,
                found,
            }));
        }
    }
    if m.version != entry.version {
        return Err(Box::new(AuthorizeError::VersionDiffers {
            package,
            desired: entry.version.clone(),
            found: version,
        }));
    }
    if m.kind != entry.kind {
        return Err(Box::new(AuthorizeError::KindDiffers {
            package,
            version,
            desired: entry.kind,
            found: m.kind,
        }));
    }
    for found in [&m.publisher_id, &authenticated.publisher] {
        if found != &entry.publisher {
            return Err(Box::new(AuthorizeError::PublisherDiffers {
                package,
                version,
                desired: entry.publisher.clone(),
                found: found.clone(),
            }));
        }
    }
    if let Some(reason) = p.revoked_digests.get(&entry.payload_sha256) {
        return Err(Box::new(AuthorizeError::DigestRevoked {
            package,
            version,
            digest: entry.payload_sha256,
            reason: reason.clone(),
        }));
    }
    let publisher = p.publishers.get(&entry.publisher);
    // The first verified key that passes every key check below decides; when none does, the
    // first verified key is the one the refusal names.
    let key_id = authenticated
        .signed_by
        .iter()
        .copied()
        .find(|k| {
            entry.key_ids.contains(k)
                && !p.revoked_keys.contains_key(k)
                && publisher.is_some_and(|pb| pb.keys.iter().any(|pk| pk.key_id == *k))
        })
        .unwrap_or(authenticated.key_id);
    if !entry.key_ids.contains(&key_id) {
        return Err(Box::new(AuthorizeError::KeyNotAllowed {
            package,
            version,
            key_id,
            allowed: entry.key_ids.clone(),
        }));
    }
    if let Some(reason) = p.revoked_keys.get(&key_id) {
        return Err(Box::new(AuthorizeError::KeyRevoked {
            package,
            version,
            key_id,
            reason: reason.clone(),
        }));
    }
    if !publisher.is_some_and(|pb| pb.keys.iter().any(|k| k.key_id == key_id)) {
        return Err(Box::new(AuthorizeError::KeyNotOfPublisher {
            package,
            version,
            key_id,
            publisher: entry.publisher.clone(),
        }));
    }
    if !publisher.is_some_and(|pb| pb.covers(&entry.id)) {
        return Err(Box::new(AuthorizeError::OutOfScope {
            package,
            version,
            publisher: entry.publisher.clone(),
        }));
    }
    Ok(entry)
}

/// Authenticates `metadata` under the keys its entry allows ([`VerifiedPolicy::trust_store_for`])
/// and checks it against the entry ([`authorize`]): what a fleet-managed store runs on every
/// package it fetches or loads.
pub fn authenticate_desired<'p>(
    policy: &'p VerifiedPolicy,
    metadata: &Metadata,
    check: &dyn SignatureCheck,
) -> Result<(Authenticated, &'p DesiredPackage), Box<AuthorizeError>> {
    let m = metadata.manifest();
    let Some(trust) = policy.trust_store_for(&m.package_id) else {
        return Err(Box::new(AuthorizeError::NotDesired {
            package: m.package_id.clone(),
            version: m.version.clone(),
        }));
    };
    let authenticated = authenticate(metadata, &trust, check).map_err(|error| {
        AuthorizeError::NotAuthenticated {
            package: m.package_id.clone(),
            version: m.version.clone(),
            error,
        }
    })?;
    let entry = authorize(policy, metadata, &authenticated)?;
    Ok((authenticated, entry))
}
