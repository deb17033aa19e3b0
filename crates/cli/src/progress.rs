//! A progress bar on stderr for work that can take seconds (reading and hashing a large
//! package). It draws only on a terminal, only once the work has run for a moment, and at most
//! ten times a second; it leaves no trace once the work ends.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guild_ports::source::Progress;

/// Work shorter than this never shows a bar.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// Redraws at most this often.
const REDRAW: Duration = Duration::from_millis(100);
/// The bar's width in characters.
const WIDTH: usize = 28;

/// The bar for this process's stderr, or `None` when stderr is not a terminal (or output is
/// JSON or quiet), in which case nothing is drawn at all.
pub fn for_stderr(json: bool, quiet: bool) -> Option<Arc<dyn Progress>> {
    (!json && !quiet && std::io::stderr().is_terminal())
        .then(|| Arc::new(Bar::default()) as Arc<dyn Progress>)
}

#[derive(Default)]
struct Bar {
    done: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    label: String,
    total: u64,
    started: Option<Instant>,
    drawn: Option<Instant>,
}

impl fmt::Debug for Bar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bar")
            .field("done", &self.done.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Progress for Bar {
    fn begin(&self, label: &str, total_bytes: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.done.store(0, Ordering::Relaxed);
        *state = State {
            label: label.to_owned(),
            total: total_bytes,
            started: Some(Instant::now()),
            drawn: None,
        };
    }

    fn advance(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let Ok(mut state) = self.state.try_lock() else {
            return; // Another thread is drawing; this update shows in the next frame.
        };
        let now = Instant::now();
        let Some(started) = state.started else {
            return;
        };
        let due = state
            .drawn
            .map_or(now - started >= QUIET_FOR, |d| now - d >= REDRAW);
        if due {
            state.drawn = Some(now);
            let line = render(&state.label, done, state.total, now - started);
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{line}\x1b[K");
            let _ = err.flush();
        }
    }

    fn finish(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.drawn.is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
        *state = State::default();
    }
}

/// One frame: `example.scan@1.0.0 [=========>          ]  45%  120.0/256.0 MiB  80.1 MiB/s`.
pub fn render(label: &str, done: u64, total: u64, elapsed: Duration) -> String {
    let total = total.max(1);
    let done = done.min(total);
    let filled = usize::try_from(done.saturating_mul(WIDTH as u64) / total).unwrap_or(WIDTH);
    let mut bar = "=".repeat(filled);
    if filled < WIDTH {
        bar.push('>');
        bar.push_str(&" ".repeat(WIDTH - filled - 1));
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let rate = mib(done) / elapsed.as_secs_f64().max(1e-3);
    format!(
        "{label} [{bar}] {:>3}%  {:.1}/{:.1} MiB  {rate:.1} MiB/s",
        done * 100 / total,
        mib(done),
        mib(total),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_show_the_fraction_the_sizes_and_the_rate() {
        let mib = 1024 * 1024;
        assert_eq!(
            render("p@1.0.0", 0, 4 * mib, Duration::from_secs(1)),
            format!("p@1.0.0 [>{}]   0%  0.0/4.0 MiB  0.0 MiB/s", " ".repeat(27))
        );
        assert_eq!(
            render("p@1.0.0", mib, 4 * mib, Duration::from_secs(2)),
            format!(
                "p@1.0.0 [{}>{}]  25%  1.0/4.0 MiB  0.5 MiB/s",
                "=".repeat(7),
                " ".repeat(20)
            )
        );
        assert_eq!(
            render("p@1.0.0", 9 * mib, 4 * mib, Duration::from_secs(1)),
            format!("p@1.0.0 [{}] 100%  4.0/4.0 MiB  4.0 MiB/s", "=".repeat(28))
        );
        // An empty package divides by one, not zero.
        assert!(render("p@1.0.0", 0, 0, Duration::ZERO).contains("  0%"));
    }
}
