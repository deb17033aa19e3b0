//! `guild check`: the conformance check of a build, before it is signed
//! (`guild_conformance`), and its hidden child `__conformance`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use guild_conformance::{self as conformance, Options, StageError, Verdict};

use super::failure::{CliError, Exit};
use super::output::Report;

/// `guild check PATH [--manifest TEMPLATE] [--timeout SECONDS]`.
pub fn run(path: &Path, template: Option<&Path>, timeout: f64) -> anyhow::Result<Report> {
    let program = std::env::current_exe().context("cannot find the guild binary to re-run")?;
    let mut options = Options::new(program);
    options.call_timeout = Duration::from_secs_f64(timeout);
    // This process has no children but the check's, so it can end every process they leave.
    options.contain_descendants = true;
    let report = conformance::check(path, template, &options).map_err(|e| match e {
        StageError::Publish(e) => anyhow::Error::from(e),
        StageError::Source(e) => anyhow::Error::from(e),
        StageError::Usage(message) => CliError::new(Exit::Usage, message).into(),
        e @ StageError::Scratch { .. } => CliError::new(Exit::Failure, e.to_string()).into(),
        other => CliError::new(Exit::Rejected, other.to_string()).into(),
    })?;
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
    if !report.passed() {
        out.exit = Some(Exit::Rejected);
        out.warnings
            .push("the build fails the conformance check; fix it before signing".into());
    }
    Ok(out)
}

/// `guild __conformance DIR --results-fd FD [--resume-after N]`: the child; its output is the
/// lines it writes to the result channel.
pub fn child(
    dir: &Path,
    resume_after: Option<u64>,
    hung: &[String],
    results_fd: i32,
) -> anyhow::Result<Report> {
    let (channel, _) = conformance::ResultChannel::inherited(results_fd, 0)
        .with_context(|| format!("cannot take the result channel (descriptor {results_fd})"))?;
    conformance::child_main(dir, resume_after, hung, channel)?;
    Ok(Report::new("conformance").silent())
}
