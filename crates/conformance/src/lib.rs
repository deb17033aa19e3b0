//! The conformance check a publisher runs on a build before signing it (`guild check`), and that
//! the project's tests hold its own test plugins to.
//!
//! [`check`] stages the build (a package archive, an unpacked package, or a directory of built
//! files with a manifest template, packed unsigned on the way) into a temporary directory and
//! runs the checks in a child process (`guild __conformance DIR`, [`child_main`]). Nothing is
//! authenticated and no store is touched: this runs the code it is pointed at, which is what a
//! publisher wants of their own build and why an operator installs instead.
//!
//! The child loads the library with the same dlopen loader and registration check a host uses,
//! then checks every GOP1 operation (its `gop1` module). It writes one JSON line when a check
//! starts, one before every call into the plugin, and one when the check ends, on a result
//! channel of its own (a pipe, never its stdout, which the plugin shares), each line carrying a
//! nonce drawn for the child; the parent waits at most the time limit of one call for the next
//! line while a check runs. What that holds against a hostile build, and what it does not, is in
//! `guild_adapters_posix::supervise`, which holds the child: in short, nothing a build prints or how long it prints decides a
//! verdict, and the processes it starts end with the check, but a build written to defeat the
//! check from inside the child can. A check that crashes
//! the child (a guard page hit, an abort) or whose call outlives the limit becomes a failed
//! finding of that check, and the parent starts a new child that resumes after
//! it, so that one fault does not hide the rest of the report. A crash or hang while loading
//! ends the report there.

mod gop1;
mod guarded;
mod stage;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex};

use guild_adapters_posix::supervise;
use std::time::{Duration, Instant};

use guild_ports::loader::{LoadErrorKind, LoadRequest, PluginLoader};
use serde_json::{json, Value};

use guild_host::HostError;
pub use stage::StageError;

/// The hidden `guild` subcommand that runs [`child_main`].
pub const SUBCOMMAND: &str = "__conformance";

/// The key of the child's nonce in each line of its result channel.
pub const LINE_TAG: &str = "guild_conformance";

/// The time limit of one callback call by default.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a crashed or hung child is replaced before the rest is given up.
const MAX_RESTARTS: usize = 32;

/// What became of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The check held.
    Passed,
    /// The check found a violation; the reason says which.
    Failed,
    /// The check did not apply or could not run; the reason says why.
    Skipped,
}

impl Verdict {
    /// `passed`, `failed` or `skipped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::Skipped => "skipped",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "passed" => Verdict::Passed,
            "failed" => Verdict::Failed,
            "skipped" => Verdict::Skipped,
            _ => return None,
        })
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The check, such as `init` or `execute.guard_back`.
    pub check: String,
    /// The operation it concerns (`impl_id (op_name)`), for the per-operation checks.
    pub operation: Option<String>,
    /// What became of it.
    pub verdict: Verdict,
    /// What was found, why it failed, or why it was skipped.
    pub reason: String,
}

impl Finding {
    /// The finding as a JSON object (`check`, `operation`, `result`, `reason`).
    pub fn to_json(&self) -> Value {
        json!({
            "check": self.check,
            "operation": self.operation,
            "result": self.verdict.as_str(),
            "reason": self.reason,
        })
    }
}

/// Everything a check found, in the order the checks ran.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The findings.
    pub findings: Vec<Finding>,
    /// How many child processes ran (one, plus one per crash or hang it resumed after).
    pub processes: usize,
    /// The names of the GOP1 operations the build registered, once it loaded.
    pub operations: Option<Vec<String>>,
    /// The operations of [`Options::operation_params`] the build does not register (then no
    /// operation was checked).
    pub unprovided: Vec<String>,
}

impl Report {
    /// How many findings have `verdict`.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.findings
            .iter()
            .filter(|f| f.verdict == verdict)
            .count()
    }

    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.count(Verdict::Failed) == 0
    }

    /// The finding of `check` on `operation` (`None` for the package-wide checks), if it ran.
    pub fn find(&self, check: &str, operation: Option<&str>) -> Option<&Finding> {
        self.findings.iter().find(|f| {
            f.check == check
                && match operation {
                    None => f.operation.is_none(),
                    Some(op) => f.operation.as_deref().is_some_and(|o| o.contains(op)),
                }
        })
    }
}

/// How [`check`] runs the child.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `guild` binary to run with [`SUBCOMMAND`].
    pub program: PathBuf,
    /// The time limit of one call into the plugin (`init`, a callback, `shutdown`).
    pub call_timeout: Duration,
    /// Make this process the subreaper of its descendants, and kill and reap every child it has
    /// once a check child is gone, so that a process the build started in a session of its own
    /// (`setsid` and a double fork) ends with the check too. Only for a process whose every
    /// child is a check child, such as the `guild` command: it would end any other child.
    pub contain_descendants: bool,
    /// The operation parameter record passed with every query and execution the check
    /// generates, for every operation not in `operation_params` (empty: none; the manifest's
    /// `check_params` record of the operation, if any, then). The child receives it in
    /// hexadecimal and holds it 8-byte aligned, as module_abi.h promises providers.
    pub params: Vec<u8>,
    /// Records for single operations, by operation name, ahead of `params`. A name the build
    /// does not register stops the check before any operation is checked, and is reported in
    /// [`Report::unprovided`].
    pub operation_params: BTreeMap<String, Vec<u8>>,
}

impl Options {
    /// Runs `program` with the default time limit.
    pub fn new(program: PathBuf) -> Self {
        Options {
            program,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            contain_descendants: false,
            params: Vec::new(),
            operation_params: BTreeMap::new(),
        }
    }
}

/// Checks the build at `target` (with the manifest `template` for a directory of built files)
/// in child processes; see the module documentation. An error means the build could not be
/// staged or the child could not be started; everything the plugin does is a finding.
pub fn check(
    target: &Path,
    template: Option<&Path>,
    options: &Options,
) -> Result<Report, StageError> {
    let staged = stage::stage(target, template)?;
    if options.contain_descendants {
        supervise::adopt_orphans();
    }
    let mut report = Report::default();
    let mut resume: Option<u64> = None;
    // Operations a resumed child leaves alone: one whose call did not return (rather than wait
    // out the limit again for each later check), and one whose validate crashed (every later
    // check starts from validate's answer, which a resumed child would have to ask again).
    let mut hung: Vec<String> = Vec::new();
    loop {
        report.processes += 1;
        let run = run_child(options, &staged.dir, resume, &hung)?;
        report.findings.extend(run.findings);
        if run.operations.is_some() {
            report.operations = run.operations;
        }
        let Some(why) = run.died else { break };
        match run.in_progress {
            Some(started) => {
                report.findings.push(Finding {
                    check: started.check.clone(),
                    operation: started.operation.clone(),
                    verdict: Verdict::Failed,
                    reason: why,
                });
                if started.resumable && report.processes <= MAX_RESTARTS {
                    resume = Some(started.index);
                    if run.timed_out || started.check == "validate" {
                        hung.extend(started.operation.clone());
                    }
                    continue;
                }
                report.findings.push(Finding {
                    check: "remaining checks".into(),
                    operation: None,
                    verdict: Verdict::Skipped,
                    reason: format!(
                        "they need the library loaded, and {} did not finish",
                        started.check
                    ),
                });
            }
            None => report.findings.push(Finding {
                check: "check process".into(),
                operation: None,
                verdict: Verdict::Failed,
                reason: why,
            }),
        }
        break;
    }
    if let Some(registered) = &report.operations {
        report.unprovided = options
            .operation_params
            .keys()
            .filter(|op| !registered.contains(op))
            .cloned()
            .collect();
    }
    Ok(report)
}

/// A check the child said it started.
#[derive(Debug, Clone)]
struct Started {
    index: u64,
    check: String,
    operation: Option<String>,
    resumable: bool,
    at: Instant,
}

struct ChildRun {
    findings: Vec<Finding>,
    /// The GOP1 operation names the child said the build registered.
    operations: Option<Vec<String>>,
    in_progress: Option<Started>,
    /// Why the child ended before it finished, if it did.
    died: Option<String>,
    /// It was killed at the time limit.
    timed_out: bool,
}

/// Runs one child over the staged tree `dir` (resuming after check `resume`, leaving the
/// operations in `hung` alone) and reads its result channel until it ends, is killed at the
/// time limit, or writes what the check never writes.
fn run_child(
    options: &Options,
    dir: &Path,
    resume: Option<u64>,
    hung: &[String],
) -> Result<ChildRun, StageError> {
    let (nonce, mut child) = start_child(options, dir, resume, hung)?;
    let mut run = ChildRun {
        findings: Vec::new(),
        operations: None,
        in_progress: None,
        died: None,
        timed_out: false,
    };
    let mut reader = Frames {
        nonce: &nonce,
        last: Instant::now(),
        done: false,
        garbage: None,
    };
    let exited = reader.wait_for_exit(&child, &mut run, options.call_timeout);
    let status = supervise::end(&mut child.child, options.contain_descendants);
    if !exited {
        run.died = Some(timeout_reason(&run, &options.call_timeout));
        run.timed_out = true;
        return Ok(run);
    }
    reader.drain(&child, &mut run);
    if let Some(what) = reader.garbage {
        run.died = Some(format!(
            "the check's result channel carried {what}, which the check never writes: the \
             build wrote there, and nothing after it is trusted"
        ));
        return Ok(run);
    }
    if reader.done && status.as_ref().is_some_and(|s| s.success()) {
        return Ok(run);
    }
    run.died = Some(exit_reason(status, reader.done, &child));
    Ok(run)
}

/// Starts `guild __conformance` over `dir` with the options that resume it, under a fresh
/// nonce; returns the nonce and the running child.
fn start_child(
    options: &Options,
    dir: &Path,
    resume: Option<u64>,
    hung: &[String],
) -> Result<(String, supervise::Supervised), StageError> {
    let spawn_error = |e: std::io::Error| StageError::Spawn {
        program: options.program.clone(),
        reason: e.to_string(),
    };
    let mut command = Command::new(&options.program);
    command.arg(SUBCOMMAND).arg(dir);
    if let Some(n) = resume {
        command.arg("--resume-after").arg(n.to_string());
    }
    for op in hung {
        command.arg("--skip-operation").arg(op);
    }
    if !options.params.is_empty() {
        command
            .arg("--params-hex")
            .arg(params_to_arg(&options.params));
    }
    for (op, record) in &options.operation_params {
        command
            .arg("--operation-params-hex")
            .arg(format!("{op}={}", params_to_arg(record)));
    }
    let nonce = supervise::nonce().map_err(spawn_error)?;
    let child = supervise::spawn(command, &nonce, Vec::new()).map_err(spawn_error)?;
    Ok((nonce, child))
}

/// A parameter record as the child's `--params-hex` argument: lowercase hex.
pub fn params_to_arg(params: &[u8]) -> String {
    params.iter().map(|b| format!("{b:02x}")).collect()
}

/// The parameter record of a `--params-hex` argument; `None` unless it is even-length hex.
pub fn params_from_arg(arg: &str) -> Option<Vec<u8>> {
    if !arg.len().is_multiple_of(2) || !arg.is_ascii() {
        return None;
    }
    (0..arg.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&arg[i..i + 2], 16).ok())
        .collect()
}

/// Why a child killed at the time limit was killed: a call into the plugin that did not return,
/// or no line at all while no check ran.
fn timeout_reason(run: &ChildRun, call_timeout: &Duration) -> String {
    match &run.in_progress {
        Some(_) => format!(
            "a call into the plugin did not return within {}; the check process was killed",
            guild_host::registration::seconds(call_timeout)
        ),
        None => format!(
            "the check process reported nothing for {} and was killed",
            guild_host::registration::seconds(call_timeout)
        ),
    }
}

/// Why a child that ended by itself did not finish: the signal that killed it or its exit
/// status, and, when it did not write its last line, the end of its stderr and stdout.
fn exit_reason(status: Option<ExitStatus>, done: bool, child: &supervise::Supervised) -> String {
    let mut why = match status {
        Some(s) => match supervise::signal_of(s) {
            Some((n, name)) => format!(
                "the plugin killed the check process with signal {n} ({name}){}",
                if name == "SIGSEGV" || name == "SIGBUS" {
                    ": a read or write outside the memory it was lent (a guard page or unmapped \
                     address)"
                } else {
                    ""
                }
            ),
            None => format!("the check process exited with {s} before finishing"),
        },
        None => "the check process could not be waited for".into(),
    };
    if !done {
        for (name, tail) in [("stderr", &child.stderr), ("stdout", &child.stdout)] {
            let lines = tail.last_lines(3);
            if !lines.is_empty() {
                why.push_str(&format!(" ({name}: {lines})"));
            }
        }
    }
    why
}

/// How often the parent looks whether the child has ended while it waits for a line.
const POLL: Duration = Duration::from_millis(20);

/// How long the parent reads on after the child has ended, when the channel stays open.
const DRAIN: Duration = Duration::from_secs(2);

/// The parent's reading of one child's result channel.
struct Frames<'n> {
    nonce: &'n str,
    /// When the last line came.
    last: Instant,
    done: bool,
    /// What the channel carried that the harness never writes.
    garbage: Option<String>,
}

impl Frames<'_> {
    /// Reads the channel until the child has exited or written what the check never writes
    /// (true), or until the time limit passes without a line (false). The limit runs from the
    /// last line of the result channel, on this clock: nothing the child prints elsewhere moves
    /// it; while a check runs, from the check's start or the start of its latest call.
    fn wait_for_exit(
        &mut self,
        child: &supervise::Supervised,
        run: &mut ChildRun,
        call_timeout: Duration,
    ) -> bool {
        loop {
            let deadline = match &run.in_progress {
                Some(s) => s.at + call_timeout,
                None => self.last + call_timeout,
            };
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if let Some(event) = child.next_event(deadline.saturating_duration_since(now).min(POLL))
            {
                self.take(event, run);
            }
            if self.garbage.is_some() || supervise::has_exited(&child.child) {
                return true;
            }
        }
    }

    /// Reads what the child wrote before it ended, still in the pipe, for at most [`DRAIN`].
    /// Its processes are gone, so the channel closes, unless a process this one could not end
    /// holds it.
    fn drain(&mut self, child: &supervise::Supervised, run: &mut ChildRun) {
        child.drain(DRAIN, |event| {
            self.take(event, run);
            self.garbage.is_none()
        });
    }

    fn take(&mut self, event: supervise::Event, run: &mut ChildRun) {
        let line = match event {
            supervise::Event::Frame(line) => line,
            supervise::Event::Garbage(what) => {
                self.garbage = Some(what);
                return;
            }
            supervise::Event::Closed => return,
        };
        let Some(v) = tagged(&line, self.nonce) else {
            let shown: String = line.chars().take(80).collect();
            self.garbage = Some(format!("a line that is not its own ({shown:?})"));
            return;
        };
        self.last = Instant::now();
        if v.get("call").is_some() {
            // A callback call starts: the time limit runs from here.
            if let Some(s) = &mut run.in_progress {
                s.at = self.last;
            }
        } else if v.get("done").is_some() {
            self.done = true;
        } else if let Some(ops) = v.get("operations").and_then(Value::as_array) {
            run.operations = Some(
                ops.iter()
                    .filter_map(|o| o.as_str().map(str::to_owned))
                    .collect(),
            );
        } else if let Some(index) = v["start"].as_u64() {
            run.in_progress = Some(Started {
                index,
                check: v["check"].as_str().unwrap_or("?").to_owned(),
                operation: v["operation"].as_str().map(str::to_owned),
                resumable: v["resumable"] == true,
                at: self.last,
            });
        } else if let Some(f) = finding(&v) {
            if run
                .in_progress
                .as_ref()
                .is_some_and(|s| Some(s.index) == v["result"].as_u64())
            {
                run.in_progress = None;
            }
            run.findings.push(f);
        } else {
            self.garbage = Some("a line of no kind it writes".into());
        }
    }
}

/// The line as JSON, if it is an object that carries this child's nonce under [`LINE_TAG`].
fn tagged(line: &str, nonce: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(line).ok()?;
    (v.get(LINE_TAG)?.as_str()? == nonce).then_some(v)
}

fn finding(v: &Value) -> Option<Finding> {
    v["result"].as_u64()?;
    Some(Finding {
        check: v["check"].as_str()?.to_owned(),
        operation: v["operation"].as_str().map(str::to_owned),
        verdict: Verdict::parse(v["verdict"].as_str()?)?,
        reason: v["reason"].as_str().unwrap_or("").to_owned(),
    })
}

// ---------------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------------

/// The child's end of its result channel (the child reads nothing else from its parent).
pub use guild_adapters_posix::supervise::ResultChannel;

/// Where the child's lines go, shared by the threads of a check.
#[derive(Clone)]
pub(crate) struct Lines {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    nonce: Arc<str>,
}

impl Lines {
    fn emit(&self, v: &Value) {
        let mut v = v.clone();
        v[LINE_TAG] = Value::from(&*self.nonce);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // One write per line, so that a line is whole whatever else is written to the pipe.
        let _ = out.write_all(format!("{v}\n").as_bytes());
        let _ = out.flush();
    }

    /// Says that a call into the plugin starts, so that the parent's time limit, which is per
    /// call, starts again.
    pub(crate) fn call(&self) {
        self.emit(&json!({ "call": true }));
    }
}

/// Numbers the checks and prints their start and result lines, leaving out those a resumed child
/// has already reported.
pub(crate) struct Recorder<'w> {
    lines: Lines,
    next: u64,
    resume_after: Option<u64>,
    /// Operations to leave alone: a call into them hung, or their validate crashed, earlier.
    hung: &'w [String],
}

impl Recorder<'_> {
    fn quiet(&self, index: u64) -> bool {
        self.resume_after.is_some_and(|r| index <= r)
    }

    fn emit(&mut self, v: Value) {
        self.lines.emit(&v);
    }

    fn start(&mut self, check: &str, op: Option<&str>, resumable: bool) -> u64 {
        let index = self.next;
        self.next += 1;
        if !self.quiet(index) {
            self.emit(json!({
                "start": index, "check": check, "operation": op,
                "resumable": resumable,
            }));
        }
        index
    }

    fn finish(&mut self, index: u64, check: &str, op: Option<&str>, v: Verdict, reason: &str) {
        if !self.quiet(index) {
            self.emit(json!({
                "result": index, "check": check, "operation": op,
                "verdict": v.as_str(), "reason": reason,
            }));
        }
    }

    /// Records a finding that needed no call of its own.
    fn record(&mut self, check: &str, op: Option<&str>, v: Verdict, reason: &str) {
        let index = self.next;
        self.next += 1;
        self.finish(index, check, op, v, reason);
    }

    /// Runs one resumable check: `f` is not run at all when a resumed child has passed it.
    pub(crate) fn check(
        &mut self,
        check: &str,
        op: Option<&str>,
        f: impl FnOnce() -> (Verdict, String),
    ) {
        if self.quiet(self.next) {
            self.next += 1;
            return;
        }
        self.check_always(check, op, f);
    }

    /// Runs one resumable check whose work later checks build on: a resumed child that has
    /// passed it runs `f` again without reporting it.
    pub(crate) fn check_always(
        &mut self,
        check: &str,
        op: Option<&str>,
        f: impl FnOnce() -> (Verdict, String),
    ) {
        if op.is_some_and(|o| self.hung.iter().any(|h| h == o)) {
            self.record(
                check,
                op,
                Verdict::Skipped,
                "an earlier call into this operation did not return within the time limit, or \
                 its validate crashed the check process",
            );
            return;
        }
        let index = self.start(check, op, true);
        let (v, reason) = f();
        self.finish(index, check, op, v, &reason);
    }
}

/// The package-wide checks, in the order the loader makes them.
const LOAD_CHECKS: [&str; 9] = [
    "library",
    "entry point",
    "descriptor",
    "abi range",
    "init",
    "shutdown after failed init",
    "extensions",
    "registration",
    "duplicate ids",
];

/// The parameter records the child passes, in the order it looks for an operation's:
/// `per_operation` (by operation name), then `default` (unless empty), then the manifest's
/// `check_params`; none when none of them has one.
#[derive(Debug, Clone, Default)]
pub struct ChildParams {
    /// The record of every operation not in `per_operation` (empty: none).
    pub default: Vec<u8>,
    /// Records of single operations, by operation name.
    pub per_operation: BTreeMap<String, Vec<u8>>,
}

impl ChildParams {
    /// The record the operation `op_name` of the build with manifest `m` is checked with.
    fn for_operation<'a>(
        &'a self,
        op_name: &str,
        m: &'a guild_domain::manifest::Manifest,
    ) -> &'a [u8] {
        if let Some(record) = self.per_operation.get(op_name) {
            return record;
        }
        if !self.default.is_empty() {
            return &self.default;
        }
        guild_domain::ids::OpName::new(op_name)
            .ok()
            .and_then(|op| m.check_params.get(&op))
            .map_or(&[][..], |spec| &spec.record().0)
    }
}

/// The child's side: loads the staged tree `dir` and runs every check, writing the lines the
/// parent reads to `channel`; after `resume_after`, only the checks numbered above it, and none
/// that calls into an operation named in `hung`. Every query and execution of an operation
/// carries its record of `params`. When `params` names an operation the build does not
/// register, no operation is checked.
pub fn child_main(
    dir: &Path,
    resume_after: Option<u64>,
    hung: &[String],
    params: &ChildParams,
    channel: ResultChannel,
) -> Result<(), HostError> {
    let metadata = guild_host::registration::read_tree_metadata(dir)?;
    let m = metadata.manifest();
    let platform =
        guild_host::platform::HostPlatform::current().ok_or(HostError::UnsupportedPlatform {
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
        })?;
    let (out, nonce) = channel.into_parts();
    let lines = Lines {
        out: Arc::new(Mutex::new(Box::new(out))),
        nonce: nonce.into(),
    };
    let mut rec = Recorder {
        lines: lines.clone(),
        next: 0,
        resume_after,
        hung,
    };
    let loading = rec.start("init", None, false);
    let registry = guild_host::registry::OwnedRegistry::new();
    let loader = guild_adapters_posix::DlopenLoader::new();
    let request = load_request(dir, m, platform.kernel_abi, &registry);
    let loaded = loader.load(&request);
    let failure = loaded.as_ref().err().map(load_failure);
    let plugin = loaded.ok();
    // What the loader accepted is held to the manifest as a host holds it.
    let failure = match &plugin {
        Some(p) if failure.is_none() => registration_failure(m, p),
        _ => failure,
    };
    let outcome = LoadOutcome::new(failure);
    outcome.record(&mut rec, loading, &plugin, m);
    let Some(plugin) = plugin else {
        rec.emit(json!({ "done": true }));
        return Ok(());
    };
    if outcome.failed_index.is_none() {
        let registered: Vec<&str> = plugin
            .kernels
            .iter()
            .filter(|k| k.provider.operation().is_some())
            .filter_map(|k| k.op_name.as_ref().map(|n| n.as_str()))
            .collect();
        rec.emit(json!({ "operations": registered }));
        if params
            .per_operation
            .keys()
            .all(|op| registered.contains(&op.as_str()))
        {
            check_operations(&plugin, m, &lines, params, &mut rec);
        }
    }
    let closing = rec.start("shutdown", None, false);
    drop(plugin);
    drop(registry);
    rec.finish(
        closing,
        "shutdown",
        None,
        Verdict::Passed,
        "shutdown returned and the library was closed",
    );
    rec.emit(json!({ "done": true }));
    Ok(())
}

/// The request that loads the staged tree `dir` as a host loads an installed one, offering the
/// plugin `registry`'s operation service.
fn load_request(
    dir: &Path,
    m: &guild_domain::manifest::Manifest,
    host_abi: guild_domain::version::PackedVersion,
    registry: &guild_host::registry::OwnedRegistry,
) -> LoadRequest {
    LoadRequest {
        package: m.package_id.clone(),
        version: m.version.clone(),
        library: dir.join(m.entry.as_str()),
        provided_ops: m.provided_ops.clone(),
        provided_runners: m.provided_runners.clone(),
        host_abi,
        operations: Some(registry.plugin_service()),
    }
}

/// The check of [`LOAD_CHECKS`] a loader error fails, and the error's text.
fn load_failure(e: &guild_ports::loader::LoadError) -> (&'static str, String) {
    let at = match &*e.kind {
        LoadErrorKind::Open { .. } => "library",
        LoadErrorKind::MissingEntry { .. } => "entry point",
        LoadErrorKind::BadDescriptor { .. } => "descriptor",
        LoadErrorKind::AbiMismatch { .. } => "abi range",
        LoadErrorKind::InitFailed { .. } => "init",
        LoadErrorKind::ExtensionRefused { .. } => "extensions",
        LoadErrorKind::RegistrationRefused { reason } if reason.contains("duplicate") => {
            "duplicate ids"
        }
        _ => "registration",
    };
    (at, e.kind.to_string())
}

/// The check of [`LOAD_CHECKS`] that a plugin the loader accepted fails against the manifest
/// `m`, and why: an id registered twice, or registrations the manifest does not declare.
fn registration_failure(
    m: &guild_domain::manifest::Manifest,
    p: &guild_ports::loader::LoadedPlugin,
) -> Option<(&'static str, String)> {
    let package = format!("{}@{}", m.package_id, m.version);
    let mut ids: Vec<&str> = p.kernels.iter().map(|k| k.impl_id.as_str()).collect();
    ids.extend(p.runners.iter().map(|r| r.runner_id.as_str()));
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    let duplicate = sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
    match (
        duplicate,
        guild_host::registration::check_registration(&package, m, p),
    ) {
        (Some(id), _) => Some(("duplicate ids", format!("{id} is registered twice"))),
        (None, Err(e)) => Some(("registration", e.to_string())),
        (None, Ok(())) => None,
    }
}

/// Where loading stopped, if it did, as the findings of [`LOAD_CHECKS`] report it.
struct LoadOutcome {
    /// The check that failed.
    failed_at: Option<&'static str>,
    /// Its place in [`LOAD_CHECKS`].
    failed_index: Option<usize>,
    /// Why it failed.
    reason: String,
}

impl LoadOutcome {
    fn new(failure: Option<(&'static str, String)>) -> Self {
        let (failed_at, reason) = match failure {
            Some((at, reason)) => (Some(at), reason),
            None => (None, String::new()),
        };
        LoadOutcome {
            failed_at,
            failed_index: failed_at.and_then(|f| LOAD_CHECKS.iter().position(|c| *c == f)),
            reason,
        }
    }

    /// Records one finding for each of [`LOAD_CHECKS`], in order; `init`'s closes the check
    /// `loading` started.
    fn record(
        &self,
        rec: &mut Recorder<'_>,
        loading: u64,
        plugin: &Option<guild_ports::loader::LoadedPlugin>,
        m: &guild_domain::manifest::Manifest,
    ) {
        for (i, name) in LOAD_CHECKS.iter().enumerate() {
            let (v, why) = self.verdict(i, name, plugin, m);
            if *name == "init" {
                rec.finish(loading, name, None, v, &why);
            } else {
                rec.record(name, None, v, &why);
            }
        }
    }

    /// The finding of `name`, number `i` of [`LOAD_CHECKS`].
    fn verdict(
        &self,
        i: usize,
        name: &str,
        plugin: &Option<guild_ports::loader::LoadedPlugin>,
        m: &guild_domain::manifest::Manifest,
    ) -> (Verdict, String) {
        match self.failed_index {
            _ if name == "shutdown after failed init" => self.shutdown_after_failed_init(i),
            Some(f) if i == f => (Verdict::Failed, self.reason.clone()),
            Some(f) if i > f => (
                Verdict::Skipped,
                format!("an earlier check failed ({})", LOAD_CHECKS[f]),
            ),
            _ => (Verdict::Passed, load_detail(name, plugin, m)),
        }
    }

    /// The finding of `shutdown after failed init`, number `i` of [`LOAD_CHECKS`]: the process
    /// survived the shutdown the host runs after a failed init, when init failed.
    fn shutdown_after_failed_init(&self, i: usize) -> (Verdict, String) {
        match self.failed_at {
            Some("init") => (
                Verdict::Passed,
                "the host ran shutdown after the failed init and the process survived".into(),
            ),
            Some(f)
                if self.failed_index.is_some_and(|at| at < i) && LOAD_CHECKS[..i].contains(&f) =>
            {
                (
                    Verdict::Skipped,
                    format!("init never ran: an earlier check failed ({f})"),
                )
            }
            _ => (
                Verdict::Skipped,
                "init did not fail, and the host calls shutdown after a failed init only"
                    .to_owned(),
            ),
        }
    }
}

/// Runs the checks of every GOP1 operation the plugin registered, in registration order, then
/// records how many kernels carry no GOP1 contract, if any.
fn check_operations(
    plugin: &guild_ports::loader::LoadedPlugin,
    m: &guild_domain::manifest::Manifest,
    lines: &Lines,
    params: &ChildParams,
    rec: &mut Recorder<'_>,
) {
    for kernel in &plugin.kernels {
        let provider = &kernel.provider;
        let Some(gop) = provider.operation().copied() else {
            continue;
        };
        let (max_dim, max_batch) = provider
            .descriptor()
            .map_or(([0; 8], 0), |d| (d.max_dim, d.max_batch));
        let op_name = kernel.op_name.as_ref().map_or("", |n| n.as_str());
        let params = gop1::ParamRecord::new(params.for_operation(op_name, m));
        let op = gop1::Operation {
            label: format!("{} ({op_name})", kernel.impl_id),
            op_name: CString::new(op_name).unwrap_or_default(),
            provider,
            gop,
            backend: kernel.backend.bit(),
            lacks_isa: guild_host::platform::lacking(kernel.required_cpu_isa),
            max_dim,
            max_batch,
            has_dependencies: !m.module_dependencies.is_empty(),
            lines: lines.clone(),
            params: &params,
        };
        gop1::check(&op, rec);
    }
    let gop1 = plugin
        .kernels
        .iter()
        .filter(|k| k.provider.operation().is_some())
        .count();
    if gop1 < plugin.kernels.len() {
        rec.record(
            "operations",
            None,
            Verdict::Skipped,
            &format!(
                "{} of {} kernels carry no GOP1 contract; the per-operation checks cover \
                 GOP1 operations only",
                plugin.kernels.len() - gop1,
                plugin.kernels.len()
            ),
        );
    }
}

fn load_detail(
    name: &str,
    plugin: &Option<guild_ports::loader::LoadedPlugin>,
    m: &guild_domain::manifest::Manifest,
) -> String {
    match name {
        "library" => format!("{} opened", m.entry.as_str()),
        "entry point" => "guild_plugin_entry_v1 found".into(),
        "descriptor" => "the plugin descriptor is readable".into(),
        "abi range" => "the plugin's Kernel ABI range contains this host's".into(),
        "init" => match plugin {
            Some(p) => format!(
                "init returned OK having registered {} kernel{} and {} runner{}",
                p.kernels.len(),
                if p.kernels.len() == 1 { "" } else { "s" },
                p.runners.len(),
                if p.runners.len() == 1 { "" } else { "s" }
            ),
            None => "init returned OK".into(),
        },
        "extensions" => {
            "every extension passed the host's size, tag and version negotiation".into()
        }
        "registration" => {
            "exactly the manifest's provided_ops and provided_runners, on declared backends".into()
        }
        "duplicate ids" => "no id is registered twice".into(),
        _ => String::new(),
    }
}
