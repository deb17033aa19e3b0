//! The trust file and its binding to the store: reading it, refusing one the registry does not
//! recognise, rebuilding it, and committing every change to it with the registry's record.

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::manifest::Metadata;
use guild_domain::store_state::StoreState;
use guild_domain::trust::{
    authenticate, authenticate_by_key, check_trust_file, Authenticated, SignatureCheck,
    TrustFileMismatch, TrustStore,
};
use guild_domain::version::Version;
use guild_ports::signature::SignatureVerifier;
use guild_ports::store::Transaction;

use super::{PackageManager, TrustOpened, TrustReset};
use crate::error::HostError;

/// Bridges the crypto port to the domain's signature check, for callers of
/// [`guild_domain::trust::authenticate`] that hold a [`SignatureVerifier`].
#[allow(missing_debug_implementations)] // A borrowed trait object with nothing to show.
pub struct PortCheck<'a>(pub &'a dyn SignatureVerifier);

impl SignatureCheck for PortCheck<'_> {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        self.0
            .verify(spki_der, message, signature)
            .map_err(|e| e.to_string())
    }
}

impl PackageManager {
    /// The trust file as committed, its bytes decoded; `None` when there is none.
    fn trust_file(&self) -> Result<Option<(Vec<u8>, TrustStore)>, HostError> {
        match self.store.read_trust()? {
            None => Ok(None),
            Some(bytes) => {
                let trust = TrustStore::from_json(&bytes)?;
                Ok(Some((bytes, trust)))
            }
        }
    }

    /// Refuses a trust file that is not the one the registry recorded, before anything trusts
    /// it. A store that predates trust binding has its readable trust file bound now, so that
    /// from this open on it is guarded like any other.
    pub(super) fn check_trust_binding(&self) -> Result<Option<TrustOpened>, HostError> {
        let registry = self.store.registry()?;
        let file = self.trust_file()?;
        check_trust_file(
            registry.trust_anchor(),
            file.as_ref().map(|(b, t)| (b.as_slice(), t)),
            self.store.records_packages()?,
        )
        .map_err(|problem| self.binding_error(problem))?;
        match (registry.trust_anchor(), file) {
            // A reader leaves the binding to the next writer.
            (None, Some(_)) if self.store.is_reader() => Ok(None),
            (None, Some((_, trust))) => {
                let generation = self.commit_trust(&registry, trust)?;
                Ok(Some(TrustOpened::Bound { generation }))
            }
            _ => Ok(None),
        }
    }

    fn binding_error(&self, problem: TrustFileMismatch) -> HostError {
        HostError::TrustBinding {
            path: self.store.trust_path(),
            problem,
        }
    }

    /// Rebuilds the trust file as `reset` says and commits it with its record.
    pub(super) fn rebuild_trust(&self, reset: TrustReset) -> Result<TrustOpened, HostError> {
        let registry = self.store.registry()?;
        let (found, problem) = match self.store.read_trust()? {
            None => (
                None,
                check_trust_file(
                    registry.trust_anchor(),
                    None,
                    registry.packages().next().is_some(),
                )
                .err()
                .map(|p| p.to_string()),
            ),
            Some(bytes) => match TrustStore::from_json(&bytes) {
                Ok(trust) => {
                    let problem = check_trust_file(
                        registry.trust_anchor(),
                        Some((&bytes, &trust)),
                        registry.packages().next().is_some(),
                    )
                    .err()
                    .map(|p| p.to_string());
                    (Some(trust), problem)
                }
                // Its keys cannot be kept, but the registry's revocations still are.
                Err(e) if !reset.keep_keys => (None, Some(format!("it cannot be read: {e}"))),
                Err(e) => return Err(e.into()),
            },
        };
        if let (Some(fleet), None) = (registry.fleet(), &problem) {
            // The trust file is this store's own, so there is nothing to repair, and the fleet's
            // policy is its trust: a rebuild could only drop the policy's keys (disabling what
            // they sign) until the next sync. A damaged file is still rebuilt, keeping every
            // revocation; the next `guild fleet sync` writes the policy's keys again.
            return Err(HostError::FleetManaged {
                fleet: fleet.fleet().clone(),
            });
        }
        let trust = TrustStore::rebuilt(registry.trust_anchor(), found.as_ref(), reset.keep_keys);
        let (keys, revoked_keys, revoked_payloads) = (
            trust.publishers().map(|(_, k)| k.count()).sum(),
            trust.revoked_keys().count(),
            trust.revoked_digests().count(),
        );
        let generation = self.commit_trust(&registry, trust)?;
        Ok(TrustOpened::Rebuilt {
            found: problem,
            generation,
            keys,
            revoked_keys,
            revoked_payloads,
        })
    }

    /// Binds `trust` to the store at the next generation and commits it with its record in one
    /// transaction from `registry`. Answers the new generation.
    fn commit_trust(&self, registry: &StoreState, trust: TrustStore) -> Result<u64, HostError> {
        let (bytes, anchor) = self.seal_trust(registry, trust);
        let generation = anchor.binding.generation;
        let mut next = registry.successor();
        next.set_trust_anchor(anchor);
        self.store
            .commit(Transaction::new(registry.generation(), next).with_trust(bytes))?;
        Ok(generation)
    }

    /// A fresh store id. It tells this store's trust file from another store's, so it must
    /// differ between stores; it is no secret (whoever can write the trust file can read the
    /// registry), so the time, the process and the store's path suffice.
    fn new_store_id(&self) -> String {
        static MINTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = format!(
            "{nanos}:{}:{}:{}",
            std::process::id(),
            MINTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            self.store.trust_path().display()
        );
        let hex = Sha256Digest::of(seed.as_bytes()).to_hex();
        hex.get(..32).unwrap_or(&hex).to_owned()
    }

    /// The current trust store. A store without a trust file trusts nothing; a trust file that
    /// cannot be decoded is an error.
    pub fn trust(&self) -> Result<TrustStore, HostError> {
        let _life = self.lock();
        self.read_trust()
    }

    pub(super) fn read_trust(&self) -> Result<TrustStore, HostError> {
        let planned = self
            .plan_trust
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(trust) = planned {
            return Ok(trust);
        }
        Ok(self.trust_file()?.map(|(_, t)| t).unwrap_or_default())
    }

    /// Seals `trust` as the trust file of the next generation of `registry`: its bytes, and the
    /// anchor the same transaction records for it.
    pub(super) fn seal_trust(
        &self,
        registry: &StoreState,
        mut trust: TrustStore,
    ) -> (Vec<u8>, guild_domain::trust::TrustAnchor) {
        let (store_id, generation) = match registry.trust_anchor() {
            Some(a) => (
                a.binding.store_id.clone(),
                a.binding.generation.saturating_add(1),
            ),
            None => (self.new_store_id(), 1),
        };
        trust.seal(&store_id, generation)
    }

    /// Applies `change` to the trust store and commits it durably, together with the registry's
    /// record of the new trust file (its generation, digest and revocations), in one transaction.
    /// A change that changes nothing commits nothing. Revocations take effect for enabled
    /// packages the next time the store is opened (or at once through
    /// [`PackageManager::reverify`]).
    pub fn update_trust<T>(
        &self,
        change: impl FnOnce(&mut TrustStore) -> Result<T, HostError>,
    ) -> Result<T, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        if let Some(fleet) = registry.fleet() {
            // The policy is the trust of a fleet-managed store: a local key would outlive the
            // next policy, or contradict it until then.
            return Err(HostError::FleetManaged {
                fleet: fleet.fleet().clone(),
            });
        }
        let mut trust = self.read_trust()?;
        let before = trust.clone();
        let out = change(&mut trust)?;
        if trust != before {
            self.commit_trust(&registry, trust)?;
            life.trust_epoch += 1;
            // The trust file is no part of the graph or of the claims: what is kept still
            // holds at the new generation.
            if let Some(kept) = life
                .kept
                .as_mut()
                .filter(|k| k.generation == registry.generation())
            {
                kept.generation = registry.generation().saturating_add(1);
            }
        }
        Ok(out)
    }

    /// Whether `metadata` carries a valid signature by `key` that today's trust store accepts
    /// ([`authenticate_by_key`]); the error says why not, or that the trust file is unreadable.
    pub(crate) fn authenticated_by(
        &self,
        metadata: &Metadata,
        key: &Sha256Digest,
    ) -> Result<Authenticated, HostError> {
        let trust = self.read_trust()?;
        authenticate_by_key(metadata, &trust, &PortCheck(&*self.verifier), key).map_err(|source| {
            let manifest = metadata.manifest();
            HostError::Unauthenticated {
                location: self
                    .store
                    .package_dir(&manifest.package_id, &manifest.version),
                package: format!("{}@{}", manifest.package_id, manifest.version),
                source,
            }
        })
    }

    /// Refuses to make `id@version` loadable again unless today's trust store still
    /// authenticates it. A version that was installed under a key or payload digest revoked
    /// since must not come back through enable or rollback; without this check it would reach
    /// the load plan until the next open tainted it again.
    pub(super) fn check_still_trusted(
        &self,
        metadata: &Metadata,
        id: &PackageId,
        version: &Version,
    ) -> Result<(), HostError> {
        let trust = self.read_trust()?;
        authenticate(metadata, &trust, &PortCheck(&*self.verifier))
            .map(|_| ())
            .map_err(|source| HostError::Unauthenticated {
                location: self.store.package_dir(id, version),
                package: format!("{id}@{version}"),
                source,
            })
    }
}
