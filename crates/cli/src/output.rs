//! Where a command's result goes: a few lines for people, one JSON document for programs, and
//! errors in the same two forms on stderr. Colour is used only on a terminal.

use std::io::{IsTerminal, Write};

use serde_json::{json, Map, Value};

use super::failure::{Exit, Failure};

/// A JSON field whose value is built only if the document is printed.
pub struct Deferred(String, Box<dyn FnOnce() -> Value>);

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Deferred({:?})", self.0)
    }
}

/// Text for people that a command writes when its report is printed, after its lines
/// ([`Report::text`]).
pub struct Text(Box<WriteText>);

/// What writes a [`Text`].
type WriteText = dyn FnOnce(&mut dyn Write) -> std::io::Result<()>;

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Text(..)")
    }
}

/// What a successful command produced.
#[derive(Debug, Default)]
pub struct Report {
    /// The `--json` document: an object whose keys the command documents.
    pub json: Map<String, Value>,
    /// Fields of the `--json` document still to be built, in the order they were set; each
    /// replaces a field of the same name in `json`.
    pub deferred: Vec<Deferred>,
    /// Lines for people, printed on stdout unless `--quiet`.
    pub lines: Vec<String>,
    /// More for people, written on stdout after `lines` (and like them, unless `--quiet` or
    /// `--json`).
    pub text: Option<Text>,
    /// Things worth knowing that did not stop the command (what the store's recovery did, a
    /// package disabled by re-verification). stderr for people; `"warnings"` in JSON.
    pub warnings: Vec<String>,
    /// A command whose whole report is its answer even when something failed (`doctor`) sets
    /// the exit code here instead of returning an error.
    pub exit: Option<Exit>,
    /// The command wrote its own output (a completion script); print nothing more.
    pub silent: bool,
}

impl Report {
    pub fn new(command: &str) -> Self {
        let mut json = Map::new();
        json.insert("command".into(), command.into());
        Report {
            json,
            ..Report::default()
        }
    }

    /// Sets one JSON field.
    pub fn field(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.json.insert(key.into(), value.into());
        self
    }

    /// Sets one JSON field to what `value` builds, if and when the document is printed: for a
    /// field that costs much to build and that people's output does not show.
    pub fn field_with(&mut self, key: &str, value: impl FnOnce() -> Value + 'static) -> &mut Self {
        self.deferred
            .push(Deferred(key.to_owned(), Box::new(value)));
        self
    }

    /// The `--json` document's fields, the deferred ones built.
    pub fn into_json(mut self) -> Map<String, Value> {
        for Deferred(key, value) in self.deferred {
            self.json.insert(key, value());
        }
        self.json
    }

    pub fn line(&mut self, line: impl Into<String>) -> &mut Self {
        self.lines.push(line.into());
        self
    }

    /// Sets what `write` writes after the lines, when the report is printed for people: for
    /// output too large to hold whole (a listing of 10,000 packages), written as it is made.
    pub fn text(
        &mut self,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + 'static,
    ) -> &mut Self {
        self.text = Some(Text(Box::new(write)));
        self
    }

    /// A report that prints nothing, for a command that wrote its own output.
    pub fn silent(mut self) -> Self {
        self.silent = true;
        self
    }
}

/// How to print, from the global options.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
    pub quiet: bool,
}

impl Output {
    /// Prints the report a command ends with. The process exits right after: freeing a
    /// listing's lines and what its `--json` document would have been built from (10,000
    /// packages' of each) is time spent for nothing, so the report is left to the exit. It owns
    /// no file, lock or child (see `store::leave`).
    ///
    /// A write to stdout that fails is answered, but for a closed pipe (a reader such as `head`
    /// that has what it wanted), which is not an error.
    pub fn last_success(&self, report: Report) -> std::io::Result<()> {
        self.show(report, true)
    }

    /// Prints a report a command makes before it ends (one per round of `guild fleet pull
    /// --follow`), and frees it.
    pub fn success(&self, report: Report) -> std::io::Result<()> {
        self.show(report, false)
    }

    /// Prints `report`; leaves it to the process's exit when `leave` says so.
    fn show(&self, report: Report, leave: bool) -> std::io::Result<()> {
        match self.write(report, leave) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            written => written,
        }
    }

    fn write(&self, mut report: Report, leave: bool) -> std::io::Result<()> {
        if report.silent {
            return Ok(());
        }
        if self.json {
            let warnings = json!(report.warnings);
            let mut document = report.into_json();
            document.insert("warnings".into(), warnings);
            let document = Value::Object(document);
            let written = print_json(&mut std::io::stdout().lock(), &document);
            if leave {
                std::mem::forget(document);
            }
            return written;
        }
        if self.quiet {
            return Ok(());
        }
        let stderr = std::io::stderr();
        let colour = use_colour(stderr.is_terminal());
        let mut err = stderr.lock();
        for w in &report.warnings {
            let _ = writeln!(err, "{} {w}", paint(colour, "1;33", "warning:"));
        }
        // Buffered: stdout's own buffer flushes at every newline, one write per line, which a
        // listing of thousands of packages would pay for in system calls.
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let mut written = report
            .lines
            .iter()
            .try_for_each(|line| writeln!(out, "{line}"));
        if let Some(Text(write)) = report.text.take() {
            written = written.and_then(|()| write(&mut out));
        }
        written = written.and_then(|()| out.flush());
        if leave {
            std::mem::forget(report);
        }
        written
    }

    pub fn failure(&self, failure: &Failure) {
        let stderr = std::io::stderr();
        if self.json {
            // Where the error cannot be written, the exit code still says it.
            let _ = print_json(&mut stderr.lock(), &failure_json(failure));
            return;
        }
        let colour = use_colour(stderr.is_terminal());
        let mut err = stderr.lock();
        let _ = writeln!(
            err,
            "{} {}",
            paint(colour, "1;31", "error:"),
            failure.message
        );
        for (item, why) in &failure.candidates {
            let _ = writeln!(err, "  {item}: {why}");
        }
        for cause in &failure.causes {
            let _ = writeln!(err, "  caused by: {cause}");
        }
        if let Some(hint) = &failure.hint {
            let _ = writeln!(err, "{} {hint}", paint(colour, "1;36", "hint:"));
        }
    }
}

/// The JSON form of an error: the same fields a person sees.
pub fn failure_json(failure: &Failure) -> Value {
    let mut value = json!({
        "category": failure.exit.category(),
        "exit_code": failure.exit.code(),
        "message": failure.message,
        "causes": failure.causes,
        "hint": failure.hint,
    });
    if !failure.candidates.is_empty() {
        value["candidates"] = failure
            .candidates
            .iter()
            .map(|(impl_id, reason)| json!({ "impl_id": impl_id, "reason": reason }))
            .collect();
    }
    value
}

/// A usage error in JSON, for a command line that asked for `--json` but did not parse.
pub fn usage_json(message: &str) -> Value {
    failure_json(&Failure {
        exit: Exit::Usage,
        message: message.to_owned(),
        causes: Vec::new(),
        hint: Some("see `guild --help`".into()),
        candidates: Vec::new(),
    })
}

pub fn print_json(out: &mut dyn Write, value: &Value) -> std::io::Result<()> {
    // Serialising a `Value` cannot fail.
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    writeln!(out, "{text}")?;
    out.flush()
}

/// Colour only on a terminal, and never when `NO_COLOR` is set (<https://no-color.org>).
fn use_colour(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn paint(colour: bool, sgr: &str, text: &str) -> String {
    if colour {
        format!("\x1b[{sgr}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// Counts its drops.
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A report whose unused `--json` field holds a [`Dropped`] counting into `count`.
    fn report(count: &Arc<AtomicUsize>) -> Report {
        let held = Dropped(Arc::clone(count));
        let mut report = Report::new("test");
        report.field_with("held", move || {
            let _ = &held;
            Value::Null
        });
        report
    }

    /// A report printed in a loop (`guild fleet pull --follow` prints one a round) is freed
    /// once printed; only the report a command ends with is left to the process's exit.
    #[test]
    fn a_report_printed_before_the_end_is_freed() {
        let out = Output {
            json: false,
            quiet: true,
        };
        for quiet in [true, false] {
            let out = Output { quiet, ..out };
            let count = Arc::new(AtomicUsize::new(0));
            out.success(report(&count)).unwrap();
            assert_eq!(count.load(Ordering::Relaxed), 1, "quiet {quiet}");
        }
        let out = Output {
            quiet: false,
            ..out
        };
        let count = Arc::new(AtomicUsize::new(0));
        out.last_success(report(&count)).unwrap();
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }
}
