//! Model runners: choosing the runner for an opened model through the runners' RMD1
//! extensions, and binding it once.
//!
//! [`ModelRunners`] is a view over the runners the [`KernelRegistry`] holds (there is
//! one store of runners, so enable, disable and leases work on them exactly as on kernels).
//! [`ModelRunners::select`] asks the enabled runners that carry RMD1, in descending RMD1
//! priority with ties going to the smaller runner id, to `recognize` the model through a
//! [`ModelReader`]. The host never looks at the model's name itself: recognition is the
//! runners' job. The first runner that recognises the model
//!
//! 1. `describe`s it into a record the host zeroed (the host sets `struct_size` and `version`),
//! 2. which the host copies at once, strings and role records included, before it calls the
//!    runner again,
//! 3. then checks against the execution contract it supports (canonical tensor roles and the
//!    periodic hybrid topology, see [`description`]); a description outside it is rejected with
//!    a typed [`DescriptionError`],
//! 4. then the runner's `validate_numerics` checks the host's copy,
//! 5. and the runner's `create` builds an instance.
//!
//! A runner that fails any of these steps is passed over with its reason and the next one is
//! asked, so that a broken high-priority runner cannot hide a working one; the reasons are kept
//! in [`BoundModel::passed_over`], and when no runner is left [`SelectError::NoRunner`] lists
//! every runner and why it did not take the model.
//!
//! The result is a [`BoundModel`]: the runner binding (so the runner's package stays loaded and
//! counts as a lease: it can be neither disabled, replaced, rolled back nor removed while the
//! bound model lives), the checked description, its C copy in host memory, the model, and the
//! runner's instance, which is destroyed exactly once when the bound model is dropped, before
//! the binding is released. Everything a runner needs per token is in the bound model; nothing
//! looks the registry up again.
//!
//! Selection takes no lock. The bindings it holds while it asks the runners refuse lifecycle
//! changes of their packages meanwhile, as any binding does (see `guild_host::Host::disable_waiting`).
//!
//! Unsafe code here calls the runners' C callbacks and implements the reader's C entry points.
//!
//! # Examples
//!
//! Open a GGUF file with the host's reader and bind its runner:
//!
//! ```no_run
//! use std::path::Path;
//!
//! use guild_host::{Host, OpenedHost};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let OpenedHost { host, .. } = Host::builder("/var/lib/guild").open()?;
//! let bound = host.open_model(Path::new("/models/llama.gguf"))?;
//! let d = bound.description();
//! println!("{} runs {} ({} layers)", bound.runner_id(), d.architecture, d.n_layers);
//! # Ok(())
//! # }
//! ```
//!
//! A model read some other way (any [`ModelSource`]) is selected with
//! [`ModelRunners::select`].

pub mod description;
pub mod reader;

use std::ffi::c_void;
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;

use guild_abi::{
    guild_error_info_t, guild_runner_desc_v1_t, guild_runner_model_ext_v1_t,
    guild_runner_model_v1_t, guild_status_t, GUILD_RUNNER_MODEL_VERSION,
    GUILD_STATUS_ERR_UNSUPPORTED, GUILD_STATUS_OK,
};
use guild_domain::ids::{PackageId, RunnerId};
use guild_ports::provider::RunnerProvider;

pub use crate::error::PluginReason;
use crate::registry::{KernelRegistry, RunnerBinding};

pub use description::{DescriptionError, LayerKind, ModelDescription, TensorRole, TensorRoleKind};
pub use guild_ports::model::{
    MetaArray, MetaValue, ModelError, ModelErrorKind, ModelFile, ModelSource, ModelTensor,
};
pub use reader::ModelReader;

use description::{CDescription, CopiedRecord};

/// Model runner selection (what the spec calls the runner registry): a view over the runners of
/// a [`KernelRegistry`] that selects and binds the runner for a model.
#[derive(Debug, Clone, Copy)]
pub struct ModelRunners<'r> {
    kernels: &'r KernelRegistry,
}

impl<'r> ModelRunners<'r> {
    /// The view over `kernels`' runners.
    pub fn new(kernels: &'r KernelRegistry) -> Self {
        ModelRunners { kernels }
    }

    /// Opens the GGUF file at `path` with the host's reader (GGUF v2 and v3, every count and
    /// offset bounded before anything is allocated) and [`select`](Self::select)s its runner.
    pub fn select_file(&self, path: &Path) -> Result<BoundModel, SelectFileError> {
        Ok(self.select(self.read_file(path)?)?)
    }

    /// Opens the GGUF file at `path` with the host's reader, as [`select_file`](Self::select_file)
    /// does, without selecting a runner: for a runner that is the embedding program itself and
    /// reads the model's metadata and tensors through [`ModelFile`].
    pub fn read_file(&self, path: &Path) -> Result<Arc<dyn ModelFile>, ModelError> {
        guild_adapters_fs::GgufSource::default().open(path)
    }

    /// Selects, describes, checks, validates and creates the runner for `model`; see the module
    /// documentation for the steps and the order runners are asked in.
    pub fn select(&self, model: Arc<dyn ModelFile>) -> Result<BoundModel, SelectError> {
        let reader = ModelReader::new(Arc::clone(&model));
        let mut runners = self.kernels.runners();
        // The registry keeps them in this order already; sorting again makes the rule local.
        runners.sort_by(|a, b| {
            let (a, b) = (a.runner(), b.runner());
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.runner_id.cmp(&b.runner_id))
        });
        let mut verdicts = Vec::new();
        for binding in runners {
            let verdict = |refusal| RunnerVerdict {
                runner_id: binding.runner().runner_id.clone(),
                package: binding.package().clone(),
                priority: binding.runner().priority,
                refusal,
            };
            let provider = binding.runner().provider.as_ref();
            let (Some(descriptor), Some(ext)) = (provider.descriptor(), provider.model()) else {
                verdicts.push(verdict(RunnerRefusal::NoDescriptionExtension));
                continue;
            };
            let (descriptor, ext) = (*descriptor, *ext.table);
            // SAFETY: the descriptor and extension are the provider's, which the port keeps
            // callable while its library is loaded (the loader's checked copies, every callback
            // present, for the dlopen loader), and `binding` keeps that library loaded for the
            // whole attempt; `attempt` checks each callback for NULL before it calls one.
            match unsafe { attempt(&descriptor, &ext, &reader) } {
                Ok(bound) => {
                    return Ok(BoundModel {
                        destroy: descriptor.destroy,
                        user_data: descriptor.user_data,
                        instance: bound.instance,
                        description: bound.description,
                        c_description: bound.c_description,
                        model,
                        passed_over: verdicts,
                        expert_tables: Vec::new(),
                        binding,
                    });
                }
                Err(refusal) => verdicts.push(verdict(refusal)),
            }
        }
        Err(SelectError::NoRunner {
            model: model.location().to_path_buf(),
            verdicts,
        })
    }
}

/// What a successful attempt produced, before it is wrapped with its binding.
struct Attempted {
    instance: *mut c_void,
    description: ModelDescription,
    c_description: CDescription,
}

/// Asks one runner to take the model: recognize, describe, copy, check, validate, create.
///
/// # Safety
/// `descriptor` and `ext` must be a loader's checked copies whose callbacks are present and
/// whose library stays loaded for the call.
unsafe fn attempt(
    descriptor: &guild_runner_desc_v1_t,
    ext: &guild_runner_model_ext_v1_t,
    reader: &ModelReader,
) -> Result<Attempted, RunnerRefusal> {
    // The loader refuses a runner whose RMD1 or descriptor lacks one of these; the check keeps
    // a copy made under other rules from calling through NULL.
    let missing = RunnerRefusal::MissingCallback;
    let recognize = ext.recognize.ok_or(missing(Stage::Recognize))?;
    let describe = ext.describe.ok_or(missing(Stage::Describe))?;
    let validate = ext
        .validate_numerics
        .ok_or(missing(Stage::ValidateNumerics))?;
    let create = descriptor.create.ok_or(missing(Stage::Create))?;

    let mut error = guild_error_info_t::new();
    let table = reader.table();
    // SAFETY: the runner's own user_data, a reader table valid for the call, and a fresh error
    // record; the library is loaded per this function's contract.
    let status = unsafe { recognize(ext.user_data, &table, &mut error) };
    match status {
        GUILD_STATUS_OK => {}
        GUILD_STATUS_ERR_UNSUPPORTED => {
            return Err(RunnerRefusal::NotRecognised(PluginReason::read(
                status, &error,
            )));
        }
        _ => return Err(failed(Stage::Recognize, status, &error)),
    }

    let mut record = zeroed_record();
    let mut error = guild_error_info_t::new();
    let table = reader.table();
    // SAFETY: as for recognize; `record` is a zeroed record of this host's size with
    // struct_size and version set, live for the call.
    let status = unsafe { describe(ext.user_data, &table, &mut record, &mut error) };
    if status != GUILD_STATUS_OK {
        return Err(failed(Stage::Describe, status, &error));
    }
    // Copy everything the record points at before the runner is called again, which may free
    // its role records.
    // SAFETY: the runner filled the record and, per RMD1, its role records and names stay
    // valid until its extension is called again; nothing has been called since.
    let copied = unsafe { CopiedRecord::copy(&record) };
    let description = copied
        .check(reader.model().as_ref())
        .map_err(RunnerRefusal::Unsupported)?;
    let c_description = CDescription::new(&copied, &description);

    let mut error = guild_error_info_t::new();
    let table = reader.table();
    // SAFETY: as for recognize; the description is the host's copy, valid for the call.
    let status = unsafe { validate(ext.user_data, &table, c_description.record(), &mut error) };
    match status {
        GUILD_STATUS_OK => {}
        GUILD_STATUS_ERR_UNSUPPORTED => {
            return Err(RunnerRefusal::NumericsRefused(PluginReason::read(
                status, &error,
            )));
        }
        _ => return Err(failed(Stage::ValidateNumerics, status, &error)),
    }

    let mut instance: *mut c_void = ptr::null_mut();
    let mut error = guild_error_info_t::new();
    let table = reader.table();
    // SAFETY: as for recognize, with the descriptor's user_data; `instance` is a live slot.
    let status = unsafe { create(descriptor.user_data, &table, &mut instance, &mut error) };
    if status != GUILD_STATUS_OK {
        return Err(failed(Stage::Create, status, &error));
    }
    Ok(Attempted {
        instance,
        description,
        c_description,
    })
}

/// A description record as the host hands it to `describe`: zeroed, with its size and version.
fn zeroed_record() -> guild_runner_model_v1_t {
    // SAFETY: every field of the record is an integer, a float, a char array, a raw pointer or
    // a usize, for all of which all-zero bytes are a valid value (NULL for the pointer).
    let mut record: guild_runner_model_v1_t = unsafe { std::mem::zeroed() };
    record.struct_size = size_of::<guild_runner_model_v1_t>() as u32;
    record.version = GUILD_RUNNER_MODEL_VERSION;
    record
}

fn failed(stage: Stage, status: guild_status_t, error: &guild_error_info_t) -> RunnerRefusal {
    RunnerRefusal::CallbackFailed {
        stage,
        reason: PluginReason::read(status, error),
    }
}

/// A runner chosen for a model and bound to it: what a runner needs to run the model, held
/// once. See the module documentation.
pub struct BoundModel {
    destroy: Option<unsafe extern "C" fn(user_data: *mut c_void, instance: *mut c_void)>,
    user_data: *mut c_void,
    instance: *mut c_void,
    description: ModelDescription,
    c_description: CDescription,
    model: Arc<dyn ModelFile>,
    passed_over: Vec<RunnerVerdict>,
    /// Extension tables bound for this model: dropped after the instance is destroyed (it may
    /// have been using them), before the runner's binding.
    expert_tables: Vec<crate::experts::BoundExpertTable>,
    /// Declared last, so that it is dropped after `Drop::drop` has destroyed the instance: the
    /// runner's library stays loaded until then.
    binding: RunnerBinding,
}

// SAFETY: `instance` and `user_data` are only carried and handed to the runner's `destroy`
// once, from `Drop`; the ABI leaves thread safety of a runner's instance to the runner, as it
// does for kernels. The C description points only into its own immutable buffers.
unsafe impl Send for BoundModel {}
// SAFETY: shared access only reads; nothing here has interior mutability.
unsafe impl Sync for BoundModel {}

impl BoundModel {
    /// Binds the expert table of kernel `impl_id` for this model, once: the table (and the
    /// lease on its package) lives as long as the model, so its package can be neither
    /// unloaded nor replaced while the model is bound, and is released when the model is
    /// dropped, after the runner's instance is destroyed.
    pub fn bind_expert_table(
        &mut self,
        registry: &crate::registry::KernelRegistry,
        impl_id: &guild_domain::ids::ImplId,
    ) -> Result<&crate::experts::BoundExpertTable, crate::experts::BindError> {
        let table = crate::experts::BoundExpertTable::bind_id(registry, impl_id)?;
        self.expert_tables.push(table);
        Ok(self
            .expert_tables
            .last()
            .expect("the table was pushed just above"))
    }

    /// The expert tables bound for this model, in binding order.
    pub fn expert_tables(&self) -> &[crate::experts::BoundExpertTable] {
        &self.expert_tables
    }

    /// The chosen runner's id.
    pub fn runner_id(&self) -> &RunnerId {
        &self.binding.runner().runner_id
    }

    /// The package that provides the runner.
    pub fn package(&self) -> &PackageId {
        self.binding.package()
    }

    /// The binding that keeps the runner's package loaded (and leased) while this lives.
    pub fn binding(&self) -> &RunnerBinding {
        &self.binding
    }

    /// What the runner provides (its descriptor and RMD1 table: callbacks, `user_data`),
    /// valid while this lives.
    pub fn runner(&self) -> &dyn RunnerProvider {
        self.binding.runner().provider.as_ref()
    }

    /// The description, as the host copied and checked it.
    pub fn description(&self) -> &ModelDescription {
        &self.description
    }

    /// The same description as the C record, with its role records and names in host memory,
    /// valid while this lives: what the runner's `validate_numerics` was given.
    pub fn c_description(&self) -> &guild_runner_model_v1_t {
        self.c_description.record()
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn ModelFile> {
        &self.model
    }

    /// The instance the runner's `create` returned (opaque to the host).
    pub fn instance(&self) -> *mut c_void {
        self.instance
    }

    /// The runners asked before this one that did not take the model, best first, with their
    /// reasons.
    pub fn passed_over(&self) -> &[RunnerVerdict] {
        &self.passed_over
    }
}

impl fmt::Debug for BoundModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundModel")
            .field("runner_id", self.runner_id())
            .field("package", self.package())
            .field("architecture", &self.description.architecture)
            .field("model", &self.model.location())
            .finish_non_exhaustive()
    }
}

impl Drop for BoundModel {
    fn drop(&mut self) {
        if let Some(destroy) = self.destroy {
            // SAFETY: the instance came from this runner's `create` and is destroyed exactly
            // once, here; `self.binding` (dropped after this body) keeps the library loaded.
            unsafe { destroy(self.user_data, self.instance) };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Verdicts and errors
// ---------------------------------------------------------------------------------------------

/// The step of selection a runner failed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `recognize`.
    Recognize,
    /// `describe`.
    Describe,
    /// `validate_numerics`.
    ValidateNumerics,
    /// The descriptor's `create`.
    Create,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Recognize => "recognize",
            Stage::Describe => "describe",
            Stage::ValidateNumerics => "validate_numerics",
            Stage::Create => "create",
        })
    }
}

/// Why a runner did not take a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerRefusal {
    /// The runner has no RMD1 extension, so it cannot be asked about models.
    #[error("it has no RMD1 model-description extension")]
    NoDescriptionExtension,
    /// A callback selection needs is NULL in the runner's copied descriptor or extension.
    #[error("its {0} callback is missing")]
    MissingCallback(Stage),
    /// `recognize` answered `GUILD_STATUS_ERR_UNSUPPORTED`.
    #[error("it does not recognise the model: {0}")]
    NotRecognised(PluginReason),
    /// A callback failed (any status but OK from `describe` and `create`, and any but OK and
    /// `GUILD_STATUS_ERR_UNSUPPORTED` from `recognize` and `validate_numerics`).
    #[error("its {stage} failed: {reason}")]
    CallbackFailed {
        /// Which callback.
        stage: Stage,
        /// What it reported.
        reason: PluginReason,
    },
    /// Its description is outside the contract the host supports.
    #[error("its description is not supported: {0}")]
    Unsupported(DescriptionError),
    /// `validate_numerics` answered `GUILD_STATUS_ERR_UNSUPPORTED`.
    #[error("its numerical validation refused the model: {0}")]
    NumericsRefused(PluginReason),
}

/// One runner asked during selection and why it did not take the model.
#[derive(Debug, Clone, PartialEq)]
pub struct RunnerVerdict {
    /// The runner.
    pub runner_id: RunnerId,
    /// Its package.
    pub package: PackageId,
    /// The priority it was asked at (RMD1's when present).
    pub priority: i32,
    /// Why it did not take the model.
    pub refusal: RunnerRefusal,
}

impl fmt::Display for RunnerVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (package {}, priority {}): {}",
            self.runner_id, self.package, self.priority, self.refusal
        )
    }
}

/// Why no runner was bound to a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// No enabled runner took the model; every runner asked is listed with its reason, best
    /// first.
    #[error("no enabled runner takes the model {}: {}", model.display(), verdict_list(verdicts))]
    NoRunner {
        /// The model's location.
        model: PathBuf,
        /// Every runner, in the order it was asked.
        verdicts: Vec<RunnerVerdict>,
    },
}

/// Why [`ModelRunners::select_file`] bound no runner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelectFileError {
    /// The file is not a GGUF model the reader accepts (or cannot be read); no runner was asked.
    #[error(transparent)]
    Read(#[from] ModelError),
    /// The file was read, and no runner took it.
    #[error(transparent)]
    Select(#[from] SelectError),
}

impl SelectError {
    /// The runners asked and their reasons.
    pub fn verdicts(&self) -> &[RunnerVerdict] {
        match self {
            SelectError::NoRunner { verdicts, .. } => verdicts,
        }
    }
}

fn verdict_list(verdicts: &[RunnerVerdict]) -> String {
    if verdicts.is_empty() {
        return "no runner is enabled".to_owned();
    }
    verdicts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
