//! The temporary registration host: the `guild_host_api_v1_t` a plugin's `init` receives, and
//! the callbacks behind it.
//!
//! Three rules shape it:
//! - **The table outlives init, the session does not.** `host_context` is not a pointer but an
//!   opaque session number, looked up in a process-wide table of live sessions. Closing the
//!   session removes it, so a plugin that kept the table and calls through it later gets
//!   `GUILD_STATUS_ERR_STATE` instead of reaching freed memory. The table struct itself is never
//!   freed (it is small and loads are rare) so that even a plugin that kept the *pointer* to the
//!   table, not a copy, reads valid memory whose context is a dead session number.
//! - **Registration happens on the init thread.** A session remembers the thread that opened it;
//!   a call from any other thread is answered with `GUILD_STATUS_ERR_STATE` and recorded as a
//!   refusal, which fails the load.
//! - **Copy before returning.** `register_kernel` and `register_runner` check and copy the
//!   descriptor and its chain ([`OwnedKernel`], [`OwnedRunner`]) before they return, so the
//!   plugin may build everything on init's stack.
//!
//! No panic crosses the boundary: every callback body runs inside `catch_unwind` and a panic
//! becomes `GUILD_STATUS_ERR_INTERNAL` (and a refusal, so the load fails).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use guild_abi::{
    guild_error_info_t, guild_host_api_v1_t, guild_kernel_op_desc_v1_t,
    guild_operation_service_v1_t, guild_runner_desc_v1_t, guild_status_t,
    GUILD_HOST_API_V1_BASE_SIZE, GUILD_STATUS_ERR_ALREADY_EXISTS, GUILD_STATUS_ERR_INTERNAL,
    GUILD_STATUS_ERR_PERMISSION, GUILD_STATUS_ERR_STATE, GUILD_STATUS_OK,
};
use guild_domain::ids::{ImplId, RunnerId};
use guild_domain::version::PackedVersion;
use guild_ports::loader::ExtensionRefusal;

use crate::owned::{OwnedKernel, OwnedRunner, Refusal};
use guild_abi::text::{fixed_buffer_text, write_error_record};

/// The component name the host writes into error records it fills.
const HOST_COMPONENT: &str = "guild.host";

/// Where a plugin's log records go: called synchronously, on the init thread, for each record.
pub type LogSink = Arc<dyn Fn(&PluginLog) + Send + Sync>;

/// One record a plugin wrote through the host table's `log` callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginLog {
    /// `GUILD_LOG_LEVEL_*`.
    pub level: u32,
    /// The record's status; `GUILD_STATUS_OK` for plain messages.
    pub status: guild_status_t,
    pub component: String,
    pub message: String,
}

/// What a staging session accepts.
#[derive(Clone)]
pub struct StagingConfig {
    /// The manifest's `provided_ops`: other impl ids are answered `GUILD_STATUS_ERR_PERMISSION`.
    pub provided_ops: Vec<ImplId>,
    /// The manifest's `provided_runners`, likewise.
    pub provided_runners: Vec<RunnerId>,
    /// The Kernel ABI written into the table's `abi_version`.
    pub host_abi: PackedVersion,
    /// The address of the operation service table for the host table's optional tail (its
    /// owner is kept by the loaded library, not by the session). With `None` the table is an
    /// old-style one: `struct_size` stops before the tail.
    pub operations: Option<usize>,
    /// Where log records go; `None` drops them.
    pub log: Option<LogSink>,
}

impl StagingConfig {
    /// A session for a host of `host_abi` that accepts nothing and offers no operation service.
    pub fn new(host_abi: PackedVersion) -> Self {
        StagingConfig {
            provided_ops: Vec::new(),
            provided_runners: Vec::new(),
            host_abi,
            operations: None,
            log: None,
        }
    }
}

impl fmt::Debug for StagingConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingConfig")
            .field("provided_ops", &self.provided_ops)
            .field("provided_runners", &self.provided_runners)
            .field("host_abi", &self.host_abi)
            .field("operations", &self.operations)
            .field("log", &self.log.is_some())
            .finish()
    }
}

/// What a closed session collected.
#[derive(Debug, Default)]
pub struct Staged {
    /// Accepted kernels, in registration order.
    pub kernels: Vec<OwnedKernel>,
    /// Accepted runners, in registration order.
    pub runners: Vec<OwnedRunner>,
    /// Every refused registration (malformed, duplicate, wrong thread), in order. Any one of
    /// them fails the load.
    pub refusals: Vec<String>,
    /// The typed form of each refusal, index for index with `refusals`: `Some` for those caused
    /// by an extension (which kernel or runner, where, which tag, what was wrong).
    pub extension_refusals: Vec<Option<ExtensionRefusal>>,
    /// Well-formed kernels whose impl id the manifest does not declare; each was answered
    /// `GUILD_STATUS_ERR_PERMISSION`.
    pub undeclared_kernels: Vec<String>,
    /// Well-formed runners whose id the manifest does not declare.
    pub undeclared_runners: Vec<String>,
}

/// A live staging session and the host table that leads to it.
///
/// It belongs to the thread that opened it (it is neither `Send` nor `Sync`): that thread is the
/// one registration callbacks must come from, so it is also the one that must call `init`.
/// Dropping it without [`close`](Self::close) ends the session too.
pub struct StagingHost {
    id: usize,
    table: &'static HostTable,
    session: Arc<Session>,
    _thread_bound: PhantomData<*const ()>,
}

impl StagingHost {
    /// Opens a session for the current thread.
    pub fn open(config: StagingConfig) -> StagingHost {
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(Session {
            thread: thread::current().id(),
            provided_ops: config
                .provided_ops
                .iter()
                .map(|id| id.as_str().to_owned())
                .collect(),
            provided_runners: config
                .provided_runners
                .iter()
                .map(|id| id.as_str().to_owned())
                .collect(),
            log: config.log,
            collected: Mutex::new(Collected::default()),
        });
        let (struct_size, operations) = match config.operations {
            Some(address) => (
                size_of::<guild_host_api_v1_t>(),
                ptr::with_exposed_provenance::<guild_operation_service_v1_t>(address),
            ),
            None => (GUILD_HOST_API_V1_BASE_SIZE, ptr::null()),
        };
        let table: &'static HostTable = Box::leak(Box::new(HostTable(guild_host_api_v1_t {
            struct_size: u32::try_from(struct_size).unwrap_or(u32::MAX),
            abi_version: config.host_abi.raw(),
            host_context: ptr::without_provenance_mut(id),
            register_kernel: Some(register_kernel),
            register_runner: Some(register_runner),
            log: Some(log),
            operations,
        })));
        // Kept reachable so that leak checkers see the tables as deliberately retained.
        lock(&TABLES).push(table);
        lock(&SESSIONS).insert(id, Arc::clone(&session));
        StagingHost {
            id,
            table,
            session,
            _thread_bound: PhantomData,
        }
    }

    /// The table to pass to `init`. It stays readable for the life of the process; its
    /// callbacks answer `GUILD_STATUS_ERR_STATE` once the session is closed.
    pub fn table(&self) -> *const guild_host_api_v1_t {
        &self.table.0
    }

    /// Ends the session and returns what it collected. Calls through the table from now on are
    /// answered `GUILD_STATUS_ERR_STATE`.
    pub fn close(self) -> Staged {
        lock(&SESSIONS).remove(&self.id);
        let mut collected = lock(&self.session.collected);
        collected.closed = true;
        let (refusals, extension_refusals) = std::mem::take(&mut collected.refusals)
            .into_iter()
            .map(|r| (r.reason, r.extension.map(|e| *e)))
            .unzip();
        Staged {
            kernels: std::mem::take(&mut collected.kernels),
            runners: std::mem::take(&mut collected.runners),
            refusals,
            extension_refusals,
            undeclared_kernels: std::mem::take(&mut collected.undeclared_kernels),
            undeclared_runners: std::mem::take(&mut collected.undeclared_runners),
        }
    }
}

impl Drop for StagingHost {
    fn drop(&mut self) {
        lock(&SESSIONS).remove(&self.id);
        lock(&self.session.collected).closed = true;
    }
}

impl fmt::Debug for StagingHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingHost")
            .field("session", &self.id)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------------
// Process-wide state
// ---------------------------------------------------------------------------------------------

/// A host table. It is immutable once built; `host_context` holds a session number, not an
/// address, and `operations` is an address the app guarantees for as long as its plugins live.
struct HostTable(guild_host_api_v1_t);

// SAFETY: the table is never mutated after construction and Rust never dereferences its
// pointers (the context is a number; the service address is only handed to C), so sharing
// references between threads cannot race.
unsafe impl Sync for HostTable {}

/// Session numbers start at 1 and are never reused, so a stale context can never name a newer
/// session.
static NEXT_SESSION: AtomicUsize = AtomicUsize::new(1);
static SESSIONS: Mutex<BTreeMap<usize, Arc<Session>>> = Mutex::new(BTreeMap::new());
static TABLES: Mutex<Vec<&'static HostTable>> = Mutex::new(Vec::new());

struct Session {
    thread: ThreadId,
    provided_ops: BTreeSet<String>,
    provided_runners: BTreeSet<String>,
    log: Option<LogSink>,
    collected: Mutex<Collected>,
}

#[derive(Default)]
struct Collected {
    /// Set under this lock when the session closes, so that a late call from a stray thread
    /// that found the session just before it closed cannot add to what was already taken.
    closed: bool,
    kernels: Vec<OwnedKernel>,
    runners: Vec<OwnedRunner>,
    refusals: Vec<Refusal>,
    undeclared_kernels: Vec<String>,
    undeclared_runners: Vec<String>,
}

impl Session {
    /// Records a refusal that fails the load, unless the session has closed meanwhile.
    fn refuse(&self, refusal: Refusal) -> Refusal {
        let mut collected = lock(&self.collected);
        if !collected.closed {
            collected.refusals.push(refusal.clone());
        }
        refusal
    }
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data consistent
/// (they push or take whole values), so a panic elsewhere cannot leave it half-written.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The live session a `host_context` names, if any.
fn lookup(context: *mut c_void) -> Option<Arc<Session>> {
    lock(&SESSIONS).get(&context.addr()).cloned()
}

fn closed(callback: &str) -> Refusal {
    Refusal::new(
        GUILD_STATUS_ERR_STATE,
        format!(
            "{callback} was called through a staging host whose init has returned; the host \
             table is only valid during init"
        ),
    )
}

/// The live session for a registration callback, refusing a closed one and a call from another
/// thread (which is recorded, so the load fails).
fn session_for(context: *mut c_void, callback: &str) -> Result<Arc<Session>, Refusal> {
    let session = lookup(context).ok_or_else(|| closed(callback))?;
    if thread::current().id() != session.thread {
        return Err(session.refuse(Refusal::new(
            GUILD_STATUS_ERR_STATE,
            format!(
                "{callback} was called from a thread other than the one running init; \
                 registration must happen synchronously on the init thread"
            ),
        )));
    }
    Ok(session)
}

/// Turns a callback's outcome into its status, filling the caller's error record on failure.
/// A panic (already caught) becomes `GUILD_STATUS_ERR_INTERNAL` and, when the session is still
/// live, a refusal.
fn finish(
    outcome: thread::Result<Result<(), Refusal>>,
    context: *mut c_void,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    let refusal = match outcome {
        Ok(Ok(())) => return GUILD_STATUS_OK,
        Ok(Err(refusal)) => refusal,
        Err(_) => {
            let refusal = Refusal::new(
                GUILD_STATUS_ERR_INTERNAL,
                "the host failed internally while registering",
            );
            // Recording may itself fail in a broken process; the status still goes back.
            let _ = panic::catch_unwind(AssertUnwindSafe(|| {
                if let Some(session) = lookup(context) {
                    session.refuse(refusal.clone());
                }
            }));
            refusal
        }
    };
    // SAFETY: per the host table's contract, `error` is NULL or the caller's record, valid for
    // this call; write_error_record checks its struct_size before writing.
    unsafe { write_error_record(error, refusal.status, HOST_COMPONENT, &refusal.reason) };
    refusal.status
}

// ---------------------------------------------------------------------------------------------
// The callbacks
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn register_kernel(
    context: *mut c_void,
    desc: *const guild_kernel_op_desc_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let session = session_for(context, "register_kernel")?;
        // SAFETY: the plugin passes a descriptor per the header's contract (NULL is handled);
        // the call is on the init thread, during init, so its stack storage is live.
        let kernel = unsafe { OwnedKernel::copy(desc) }.map_err(|r| session.refuse(r))?;
        let id = kernel.impl_id().as_str().to_owned();
        let mut collected = lock(&session.collected);
        if collected.closed {
            return Err(closed("register_kernel"));
        }
        let seen = collected.kernels.iter().any(|k| k.impl_id().as_str() == id)
            || collected.undeclared_kernels.contains(&id);
        if seen {
            let refusal = Refusal::new(
                GUILD_STATUS_ERR_ALREADY_EXISTS,
                format!("impl id {id} is registered twice"),
            );
            collected.refusals.push(refusal.clone());
            return Err(refusal);
        }
        if !session.provided_ops.contains(&id) {
            // Not a refusal: the load reports it as a mismatch with the manifest.
            collected.undeclared_kernels.push(id.clone());
            return Err(Refusal::new(
                GUILD_STATUS_ERR_PERMISSION,
                format!("impl id {id} is not in the manifest's provided_ops"),
            ));
        }
        collected.kernels.push(kernel);
        Ok(())
    }));
    finish(outcome, context, error)
}

unsafe extern "C" fn register_runner(
    context: *mut c_void,
    desc: *const guild_runner_desc_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let session = session_for(context, "register_runner")?;
        // SAFETY: as in register_kernel, for a runner descriptor.
        let runner = unsafe { OwnedRunner::copy(desc) }.map_err(|r| session.refuse(r))?;
        let id = runner.runner_id().as_str().to_owned();
        let mut collected = lock(&session.collected);
        if collected.closed {
            return Err(closed("register_runner"));
        }
        let seen = collected
            .runners
            .iter()
            .any(|r| r.runner_id().as_str() == id)
            || collected.undeclared_runners.contains(&id);
        if seen {
            let refusal = Refusal::new(
                GUILD_STATUS_ERR_ALREADY_EXISTS,
                format!("runner id {id} is registered twice"),
            );
            collected.refusals.push(refusal.clone());
            return Err(refusal);
        }
        if !session.provided_runners.contains(&id) {
            collected.undeclared_runners.push(id.clone());
            return Err(Refusal::new(
                GUILD_STATUS_ERR_PERMISSION,
                format!("runner id {id} is not in the manifest's provided_runners"),
            ));
        }
        collected.runners.push(runner);
        Ok(())
    }));
    finish(outcome, context, error)
}

unsafe extern "C" fn log(context: *mut c_void, level: u32, record: *const guild_error_info_t) {
    // A log call cannot fail, so misuse (a closed session, another thread, a NULL or short
    // record) is dropped silently rather than reported.
    let _ = panic::catch_unwind(AssertUnwindSafe(|| {
        let Some(session) = lookup(context) else {
            return;
        };
        if thread::current().id() != session.thread || record.is_null() {
            return;
        }
        let Some(sink) = &session.log else {
            return;
        };
        // SAFETY: `record` is non-NULL and lent for this call; struct_size is its first field.
        let size = unsafe { ptr::addr_of!((*record).struct_size).read_unaligned() };
        if usize::try_from(size).map_or(true, |s| s < size_of::<guild_error_info_t>()) {
            return;
        }
        // SAFETY: the record is non-NULL, lent for this call and at least as large as the struct
        // this host knows.
        let record = unsafe { record.read_unaligned() };
        sink(&PluginLog {
            level,
            status: record.status,
            component: fixed_buffer_text(&record.component),
            message: fixed_buffer_text(&record.message),
        });
    }));
}
