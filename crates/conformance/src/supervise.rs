//! The parent's hold on a check child (G27): the private result channel it reads the verdicts
//! from, bounded tails of the child's stdout and stderr, and the end of every process the child
//! started.
//!
//! What this holds against, and what not. The plugin runs inside the child, so it can do anything
//! the child's harness can: a build written to defeat the check (one that finds the channel's
//! descriptor and reads the run's nonce out of the harness's memory, or calls the harness's own
//! functions) can make it report what it likes. The check is a publisher's test of their own
//! build, not a boundary against a hostile one; signing and trust are that boundary. What it does
//! guarantee is that no *ordinary* behaviour of a build decides its verdict:
//! - what the build prints, on stdout, stderr or any descriptor, is never read as a result: results
//!   come only from a pipe on a descriptor of its own, each line carrying a nonce the parent drew
//!   for this child and handed over on stdin, read to its end before the library is opened; any
//!   other line on that pipe (a stray or forged write, an over-long or non-UTF-8 line) fails the
//!   run, it is never skipped;
//! - the time limit runs on the parent's clock from the last of those lines, so nothing the build
//!   prints extends it;
//! - the child's stdout and stderr are read as they come, keeping a bounded tail for the report,
//!   whatever their size and whether or not they hold a newline;
//! - the child leads a process group of its own, killed whole when the child ends or is killed,
//!   and dies with the thread that started it (`PR_SET_PDEATHSIG`); a process that leaves the
//!   group (`setsid` and a double fork) is out of reach of that, so a caller whose every child is
//!   a check child (the `guild` command) makes itself their subreaper
//!   ([`Options::contain_descendants`](super::Options)): such orphans become its children, and
//!   it kills and reaps every child it has once each check child is gone.

use std::io::{self, PipeReader, PipeWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};

/// The longest line the result channel may carry; a longer one is not the harness's.
const MAX_FRAME: usize = 64 << 10;

/// The most the result channel may carry in all; more is not the harness's.
const MAX_RESULTS: usize = 64 << 20;

/// How much of the child's stdout and of its stderr the parent keeps (the end of each).
const KEEP_TAIL: usize = 16 << 10;

/// The command-line option (of `guild __conformance`) naming the result channel's descriptor.
const RESULTS_FD_OPTION: &str = "--results-fd";

/// What the reader of the result channel saw.
pub(super) enum Event {
    /// One line, without its newline.
    Frame(String),
    /// Something no harness writes: the run is not to be trusted past it.
    Garbage(String),
    /// The channel closed.
    Closed,
}

/// A running check child and what the parent reads of it.
pub(super) struct Supervised {
    pub child: Child,
    pub events: mpsc::Receiver<Event>,
    pub stdout: Tail,
    pub stderr: Tail,
}

/// A random nonce for one child, in hex.
pub(super) fn nonce() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Starts `command` as a check child: its own process group, the result channel's write end
/// inherited under its own number (passed as [`RESULTS_FD_OPTION`]), the `nonce` on its stdin.
pub(super) fn spawn(mut command: Command, nonce: &str) -> io::Result<Supervised> {
    let (reader, writer): (PipeReader, PipeWriter) = io::pipe()?;
    let fd = writer.as_raw_fd();
    command
        .arg(RESULTS_FD_OPTION)
        .arg(fd.to_string())
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe calls
    // are allowed: it makes two system calls (fcntl on a descriptor the child inherited open,
    // prctl on itself) and builds an error from errno, allocating nothing and taking no lock.
    unsafe {
        command.pre_exec(move || {
            // The write end is close-on-exec in the parent, so that no other child of this
            // process inherits it; this one keeps it across exec.
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            // A child whose parent died (a `guild check` interrupted) does not run on alone.
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    // Only the child may hold the write end, or the channel never closes.
    drop(writer);
    if let Some(mut stdin) = child.stdin.take() {
        // A child that died already is found by the caller; the write error says nothing more.
        let _ = writeln!(stdin, "{nonce}");
    }
    let (tx, events) = mpsc::channel();
    std::thread::spawn(move || read_frames(reader, &tx));
    Ok(Supervised {
        stdout: Tail::keep(child.stdout.take()),
        stderr: Tail::keep(child.stderr.take()),
        child,
        events,
    })
}

/// Reads the result channel to its end, one [`Event`] per line, and stops at the first thing a
/// harness does not write.
fn read_frames(mut pipe: impl Read, tx: &mpsc::Sender<Event>) {
    let mut pending = Vec::new();
    let mut total = 0usize;
    let mut buf = [0u8; 8192];
    let garbage = |why: String| {
        let _ = tx.send(Event::Garbage(why));
    };
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        total += n;
        if total > MAX_RESULTS {
            return garbage(format!("more than {} MiB", MAX_RESULTS >> 20));
        }
        let mut rest = &buf[..n];
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            pending.extend_from_slice(&rest[..end]);
            rest = &rest[end + 1..];
            match String::from_utf8(std::mem::take(&mut pending)) {
                Ok(line) => {
                    if tx.send(Event::Frame(line)).is_err() {
                        return;
                    }
                }
                Err(_) => return garbage("a line that is not UTF-8".into()),
            }
        }
        pending.extend_from_slice(rest);
        if pending.len() > MAX_FRAME {
            return garbage(format!("a line longer than {} KiB", MAX_FRAME >> 10));
        }
    }
    if !pending.is_empty() {
        return garbage("an unterminated line".into());
    }
    let _ = tx.send(Event::Closed);
}

/// The end of a stream the child writes, read as it comes on a thread of its own; at most
/// [`KEEP_TAIL`] bytes are kept.
#[derive(Clone, Default)]
pub(super) struct Tail(Arc<Mutex<Vec<u8>>>);

impl Tail {
    fn keep(pipe: Option<impl Read + Send + 'static>) -> Self {
        let tail = Tail::default();
        if let Some(mut pipe) = pipe {
            let kept = tail.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => kept.push(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            });
        }
        tail
    }

    fn push(&self, bytes: &[u8]) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.extend_from_slice(bytes);
        // Trimmed in halves, so that the copying stays linear in what is read.
        if kept.len() > 2 * KEEP_TAIL {
            let cut = kept.len() - KEEP_TAIL;
            kept.drain(..cut);
        }
    }

    /// The last `n` non-empty lines of what has been read so far, each cut to 200 characters,
    /// joined by ` | `.
    pub(super) fn last_lines(&self, n: usize) -> String {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&kept);
        let mut lines: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .rev()
            .take(n)
            .map(|l| l.chars().take(200).collect())
            .collect();
        lines.reverse();
        lines.join(" | ")
    }
}

/// Whether the child has ended, leaving it unreaped so that its process group id stays its own.
pub(super) fn has_exited(child: &Child) -> bool {
    // SAFETY: an all-zero siginfo_t is a valid value (plain integers and a union of them).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only into `info`, which outlives the call; WNOWAIT leaves the child
    // to be reaped by `Child::wait`.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            child.id(),
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: waitid filled in `info` (or left it zero, when the child still runs).
    r != 0 || unsafe { info.si_pid() } != 0
}

/// Kills the child's whole process group, reaps the child, and, for a caller that is its own
/// children's subreaper, kills and reaps every child it has left (orphans the child's processes
/// left behind). Returns the child's status.
pub(super) fn end(child: &mut Child, adopted: bool) -> Option<ExitStatus> {
    let group = libc::pid_t::try_from(child.id()).ok();
    if let Some(group) = group {
        // SAFETY: kill has no memory effects. The child, reaped only below, still holds its pid,
        // so the group id is the child's group and no other.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    let status = child.wait().ok();
    if adopted {
        reap_adopted();
    }
    status
}

/// Makes this process the subreaper of its descendants, so that what they orphan becomes its
/// child ([`end`] with `adopted`).
pub(super) fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER reads no memory; a failure leaves things as
    // they were, which is the best that can be done then.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
}

/// Kills and reaps every child of this process, again while killing one orphans more.
fn reap_adopted() {
    for _ in 0..64 {
        let children = children_of(std::process::id());
        if children.is_empty() {
            return;
        }
        for pid in children {
            // SAFETY: kill and waitpid with a null status pointer touch no memory of ours; the
            // pid is our child, and stays ours until reaped here.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// The processes whose parent is `parent`, from /proc.
fn children_of(parent: u32) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: libc::pid_t = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`, where comm may hold anything but ends at the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}
