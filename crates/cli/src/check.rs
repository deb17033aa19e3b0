//! `guild check`: the conformance check of a build, before it is signed
//! (`guild_conformance`), and its hidden child `__conformance`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use guild_conformance::{self as conformance, Options, StageError, Verdict};

use super::failure::{CliError, Exit};
use super::output::Report;
use super::params::CheckParams;

/// How `guild check` runs and judges the check.
pub struct Settings {
    /// The time limit of one call into the plugin, in seconds.
    pub timeout: f64,
    /// The parameter record of every operation without one of its own (empty: none).
    pub params: Vec<u8>,
    /// Records of single operations, by operation name.
    pub operation_params: BTreeMap<String, Vec<u8>>,
    /// Exit 0 even when every check of a category was skipped.
    pub allow_skipped: bool,
}

impl Settings {
    /// The settings of `--timeout`, every `--params` and `--allow-skipped`: at most one record
    /// for every operation, and one for each operation named.
    pub fn new(
        timeout: f64,
        params: &[CheckParams],
        allow_skipped: bool,
    ) -> Result<Self, CliError> {
        let mut settings = Settings {
            timeout,
            params: Vec::new(),
            operation_params: BTreeMap::new(),
            allow_skipped,
        };
        for p in params {
            let first = match &p.operation {
                None => std::mem::replace(&mut settings.params, p.record.0.clone()).is_empty(),
                Some(op) => settings
                    .operation_params
                    .insert(op.to_string(), p.record.0.clone())
                    .is_none(),
            };
            if !first {
                let whose = p
                    .operation
                    .as_ref()
                    .map_or("every operation".to_owned(), |op| op.to_string());
                return Err(CliError::new(
                    Exit::Usage,
                    format!("--params gives {whose} two records; give one"),
                ));
            }
        }
        Ok(settings)
    }
}

/// The categories of per-operation checks: a check belongs to the one its name starts with.
const CATEGORIES: [&str; 3] = ["validate", "query_scratch", "execute"];

/// The categories of which checks ran on some operation and every one was skipped: the build
/// was not checked there (an operation never executed passes nothing).
fn skipped_categories(report: &conformance::Report) -> Vec<&'static str> {
    CATEGORIES
        .into_iter()
        .filter(|category| {
            let mut of = report.findings.iter().filter(|f| {
                f.operation.is_some()
                    && (f.check == *category || f.check.starts_with(&format!("{category}.")))
            });
            let mut any = false;
            let all_skipped = of.all(|f| {
                any = true;
                f.verdict == Verdict::Skipped
            });
            any && all_skipped
        })
        .collect()
}

/// `guild check PATH [--manifest TEMPLATE] [--timeout SECONDS] [--params [OP=]RECORD]...
/// [--allow-skipped]`.
pub fn run(path: &Path, template: Option<&Path>, settings: &Settings) -> anyhow::Result<Report> {
    let program = std::env::current_exe().context("cannot find the guild binary to re-run")?;
    let mut options = Options::new(program);
    options.call_timeout = Duration::from_secs_f64(settings.timeout);
    options.params = settings.params.clone();
    options.operation_params = settings.operation_params.clone();
    // This process has no children but the check's, so it can end every process they leave.
    options.contain_descendants = true;
    let report = conformance::check(path, template, &options).map_err(|e| match e {
        StageError::Publish(e) => anyhow::Error::from(e),
        StageError::Source(e) => anyhow::Error::from(e),
        StageError::Usage(message) => CliError::new(Exit::Usage, message).into(),
        e @ StageError::Scratch { .. } => CliError::new(Exit::Failure, e.to_string()).into(),
        other => CliError::new(Exit::Rejected, other.to_string()).into(),
    })?;
    if !report.unprovided.is_empty() {
        let registered = report.operations.clone().unwrap_or_default();
        return Err(CliError::new(
            Exit::Usage,
            format!(
                "--params names {} that {} does not provide (its operations: {}); nothing was \
                 checked with it",
                report.unprovided.join(", "),
                path.display(),
                if registered.is_empty() {
                    "none".to_owned()
                } else {
                    registered.join(", ")
                }
            ),
        )
        .into());
    }
    let mut out = Report::new("check");
    out.field("target", path.display().to_string())
        .field("passed", report.count(Verdict::Passed))
        .field("failed", report.count(Verdict::Failed))
        .field("skipped", report.count(Verdict::Skipped))
        .field("processes", report.processes)
        .field(
            "checks",
            report
                .findings
                .iter()
                .map(|f| f.to_json())
                .collect::<Vec<_>>(),
        );
    out.line(format!(
        "checking {}: this runs its code unverified, in a child process; no store is touched",
        path.display()
    ));
    let width = report
        .findings
        .iter()
        .map(|f| f.check.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let op_width = report
        .findings
        .iter()
        .map(|f| f.operation.as_deref().map_or(1, str::len))
        .max()
        .unwrap_or(9)
        .max(9);
    out.line(format!(
        "{:<width$}  {:<op_width$}  {:<7}  DETAIL",
        "CHECK", "OPERATION", "RESULT"
    ));
    for f in &report.findings {
        out.line(format!(
            "{:<width$}  {:<op_width$}  {:<7}  {}",
            f.check,
            f.operation.as_deref().unwrap_or("-"),
            f.verdict.as_str(),
            f.reason
        ));
    }
    out.line(format!(
        "{} passed, {} failed, {} skipped",
        report.count(Verdict::Passed),
        report.count(Verdict::Failed),
        report.count(Verdict::Skipped)
    ));
    let unchecked = skipped_categories(&report);
    out.field("skipped_categories", unchecked.clone());
    if !report.passed() {
        out.exit = Some(Exit::Rejected);
        out.warnings
            .push("the build fails the conformance check; fix it before signing".into());
    } else if !unchecked.is_empty() {
        let names = match unchecked.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => unchecked.join(""),
        };
        let what = format!("every {names} check was skipped: the build was not checked there");
        if settings.allow_skipped {
            out.warnings
                .push(format!("{what} (allowed by --allow-skipped)"));
        } else {
            out.exit = Some(Exit::Unchecked);
            out.warnings.push(format!(
                "{what}; give the operation's parameter record with --params (or in the \
                 manifest's check_params) if it needs one, or accept the gap with \
                 --allow-skipped"
            ));
        }
    }
    Ok(out)
}

/// `guild __conformance DIR --results-fd FD [--resume-after N] [--params-hex HEX]
/// [--operation-params-hex OP=HEX]...`: the child;
/// its output is the lines it writes to the result channel.
pub fn child(
    dir: &Path,
    resume_after: Option<u64>,
    hung: &[String],
    params_hex: Option<&str>,
    operation_params_hex: &[String],
    results_fd: i32,
) -> anyhow::Result<Report> {
    let not_hex = |what: &str| CliError::new(Exit::Usage, format!("{what} is not hexadecimal"));
    let mut params = conformance::ChildParams::default();
    if let Some(hex) = params_hex {
        params.default =
            conformance::params_from_arg(hex).ok_or_else(|| not_hex("--params-hex"))?;
    }
    for arg in operation_params_hex {
        let (op, hex) = arg
            .split_once('=')
            .ok_or_else(|| not_hex("--operation-params-hex"))?;
        let record =
            conformance::params_from_arg(hex).ok_or_else(|| not_hex("--operation-params-hex"))?;
        params.per_operation.insert(op.to_owned(), record);
    }
    let (channel, _) = conformance::ResultChannel::inherited(results_fd, 0)
        .with_context(|| format!("cannot take the result channel (descriptor {results_fd})"))?;
    conformance::child_main(dir, resume_after, hung, &params, channel)?;
    Ok(Report::new("conformance").silent())
}
