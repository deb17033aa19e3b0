//! `guild resolve`: what a runner asking for an operation would get from this store, and why
//! every other implementation would not be chosen. Nothing is executed. The operation's
//! parameter record (`--params`) goes to each candidate's `validate` and `query_scratch`.

use std::path::Path;

use guild_domain::ids::{ImplId, OpName};
use guild_domain::operation::{Budget, ResolveFailure, TensorDesc};
use guild_host::operations::{PassReason, ResolveError};
use guild_host::{
    Host, LoadReport, OpHandle, OpenReport, OpenedHost, OperationRequest, OperationService,
};
use serde_json::json;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::render::open_report_lines;

pub fn run(
    store: &Path,
    op: &OpName,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    exact: Option<&ImplId>,
    ram_budget: Option<u64>,
    params: &[u8],
) -> anyhow::Result<Report> {
    // Like every store command, a path that is not a store yet is made one (empty).
    let OpenedHost {
        host,
        report: opened,
    } = Host::builder(store).create_store(true).open()?;
    let (opened, loaded) = (opened.store, opened.loaded);
    let mut report = Report::new("resolve");
    report.warnings = open_warnings(&opened, &loaded);
    let request = request(op, inputs, outputs, exact, ram_budget);
    let service = OperationService::new(host.kernels()).reporting();
    let handle = match service.resolve_with_params(&request, params) {
        Ok(handle) => handle,
        Err(ResolveError::Unresolved(failure)) => return Err(unresolved(&failure).into()),
        Err(e) => return Err(CliError::new(Exit::Usage, e.to_string()).into()),
    };
    describe_choice(&mut report, op, &handle);
    Ok(report)
}

/// What opening the store did, then each package that did not load or was not loaded.
fn open_warnings(opened: &OpenReport, loaded: &LoadReport) -> Vec<String> {
    let mut warnings = open_report_lines(opened);
    for (id, version, error) in &loaded.failed {
        warnings.push(format!("{id} {version} did not load: {error}"));
    }
    for skipped in &loaded.skipped {
        warnings.push(format!(
            "{} {} was not loaded: {}",
            skipped.id, skipped.version, skipped.reason
        ));
    }
    warnings
}

/// The CPU request for `op` over these tensors, pinned to `exact` and within `ram_budget`
/// when given.
fn request(
    op: &OpName,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    exact: Option<&ImplId>,
    ram_budget: Option<u64>,
) -> OperationRequest {
    let mut request = OperationRequest::cpu(op.clone(), inputs.to_vec(), outputs.to_vec());
    if let Some(id) = exact {
        request = request.exact(id.clone());
    }
    if let Some(bytes) = ram_budget {
        request = request.ram_budget(Budget::bytes(bytes));
    }
    request
}

/// No implementation was chosen (exit 6): the failure's first line as the message, and each
/// candidate with its reason.
fn unresolved(failure: &ResolveFailure) -> CliError {
    // The header alone; each candidate and its reason follow as items, so that JSON gives
    // them one by one.
    let text = failure.to_string();
    let mut header = text.lines().next().unwrap_or_default().to_owned();
    if failure.rejections.is_empty() {
        header.push_str(" (no enabled package provides it)");
    }
    let candidates = failure
        .rejections
        .iter()
        .map(|r| (r.impl_id.to_string(), r.reason.to_string()))
        .collect();
    CliError::new(Exit::NotFound, header)
        .with_candidates(candidates)
        .with_hint("`guild list` shows what is installed and enabled")
}

/// The chosen implementation and every one passed over, as JSON fields and as lines.
fn describe_choice(report: &mut Report, op: &OpName, handle: &OpHandle<'_>) {
    let d = handle.describe();
    report
        .field("operation", op.as_str())
        .field("impl_id", d.impl_id.as_str())
        .field("package_id", d.package.as_str())
        .field("package_version", d.package_version.to_string())
        .field("op_version", d.op_version.to_string())
        .field("backend", d.backend.name())
        .field("priority", d.priority)
        .field(
            "scratch",
            json!({
                "host_bytes": d.scratch.host_bytes,
                "device_bytes": d.scratch.device_bytes,
                "alignment": d.scratch.alignment,
            }),
        )
        .field(
            "passed_over",
            handle
                .passed_over()
                .unwrap_or_default()
                .iter()
                .map(|p| {
                    json!({
                        "impl_id": p.impl_id.as_str(),
                        "reason": match &p.reason {
                            PassReason::Outranked => "outranked".to_owned(),
                            PassReason::Rejected(r) => r.to_string(),
                        },
                    })
                })
                .collect::<Vec<_>>(),
        );
    report.line(format!(
        "{op} -> {} from {} {} (op version {}, {}, priority {}; scratch: {} host bytes)",
        d.impl_id,
        d.package,
        d.package_version,
        d.op_version,
        d.backend,
        d.priority,
        d.scratch.host_bytes
    ));
    for p in handle.passed_over().unwrap_or_default() {
        report.line(format!("  not chosen: {p}"));
    }
}
