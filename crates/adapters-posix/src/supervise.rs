//! Child processes that run a plugin's code on a parent's behalf (the registration check of
//! `guild install`, the conformance check of `guild check`), held so that nothing the plugin
//! does in the child decides the parent's verdict or outlives it.
//!
//! What this holds against, and what not. The plugin runs inside the child, so it can do anything
//! the child's own code can: a build written to defeat the parent (one that finds the channel's
//! descriptor and reads the run's nonce out of the child's memory) can make it report what it
//! likes. Signing and trust are the boundary against a hostile build; what this module
//! guarantees is that no *ordinary* behaviour of a build decides the verdict:
//! - what the build prints, on stdout, stderr or any descriptor, is never read as a result:
//!   results come only from a pipe on a descriptor of its own ([`RESULTS_FD_OPTION`]), each line
//!   carrying a nonce the parent drew for this child ([`nonce`]) and handed over on stdin, which
//!   the child reads to its end before any plugin code runs ([`ResultChannel::inherited`]); a
//!   line on that pipe a child never writes (over-long, not UTF-8, unterminated, past a total
//!   cap) ends the reading with [`Event::Garbage`];
//! - the child's stdout and stderr are read as they come, keeping a bounded tail ([`Tail`]) for
//!   the report, whatever their size and whether or not they hold a newline;
//! - the child leads a process group of its own, killed whole when the child ends or is killed
//!   ([`end`]), and dies with the thread that started it (`PR_SET_PDEATHSIG`); a process that
//!   leaves the group (`setsid` and a double fork) is out of reach of that, so a caller whose
//!   every child is such a child (the `guild` command) makes itself their subreaper
//!   ([`adopt_orphans`]): such orphans become its children, and [`end`] kills and reaps every
//!   child it has once the supervised child is gone.
//!
//! Time limits are the caller's, on its own clock: nothing here waits for the child longer than
//! the caller asks ([`Supervised::next_event`]).

use std::cell::Cell;
use std::io::{self, PipeReader, PipeWriter, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest line the result channel may carry; a longer one is not the child's.
const MAX_FRAME: usize = 64 << 10;

/// The most the result channel may carry in all; more is not the child's.
const MAX_RESULTS: usize = 64 << 20;

/// How much of the child's stdout and of its stderr the parent keeps (the end of each).
const KEEP_TAIL: usize = 16 << 10;

/// How long [`Supervised::wait_exit`] first waits before it looks at the child again.
const FIRST_LOOK: Duration = Duration::from_micros(50);

/// The longest [`Supervised::wait_exit`] waits between two looks at the child.
const LONGEST_LOOK: Duration = Duration::from_millis(5);

/// The command-line option that names the result channel's descriptor to the child.
pub const RESULTS_FD_OPTION: &str = "--results-fd";

/// What the reader of the result channel saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// One line, without its newline.
    Frame(String),
    /// Something the child's own code never writes: the run is not to be trusted past it.
    Garbage(String),
    /// The channel closed.
    Closed,
}

/// A running supervised child and what the parent reads of it.
#[derive(Debug)]
pub struct Supervised {
    /// The child, left unreaped until [`end`].
    pub child: Child,
    /// The lines of the result channel, as the reader thread sees them.
    pub events: mpsc::Receiver<Event>,
    /// The end of the child's stdout.
    pub stdout: Tail,
    /// The end of the child's stderr.
    pub stderr: Tail,
    /// How long [`Supervised::wait_exit`] waits before its next look at the child: it goes on
    /// doubling from one call to the next, so that a child that closed the channel and runs on
    /// is looked at every [`LONGEST_LOOK`], not every [`FIRST_LOOK`] at the start of each call.
    next_look: Cell<Duration>,
}

impl Supervised {
    /// The next line of the result channel, waiting at most `wait` for it; `None` when none came
    /// in time. Once the channel has ended (after [`Event::Closed`] or [`Event::Garbage`]),
    /// this waits at most `wait` for the child to exit, looking at it at doubling intervals,
    /// and answers `None`, so that a caller's polling loop neither spins nor sleeps past the
    /// exit.
    pub fn next_event(&self, wait: Duration) -> Option<Event> {
        match self.events.recv_timeout(wait) {
            Ok(event) => Some(event),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.wait_exit(wait);
                None
            }
        }
    }

    /// Waits at most `wait` for the child to exit, leaving it unreaped ([`has_exited`]). The
    /// result channel closes as the child's process ends, so the exit is usually microseconds
    /// away: the child is looked at after 50 µs, then at intervals that double up to 5 ms
    /// (across calls), so that the answer comes at most about twice as late as the exit, or
    /// 5 ms late for a child that closed the channel and runs on.
    fn wait_exit(&self, wait: Duration) {
        let start = Instant::now();
        while !has_exited(&self.child) {
            let left = wait.saturating_sub(start.elapsed());
            if left.is_zero() {
                return;
            }
            let pause = self.next_look.get();
            std::thread::sleep(pause.min(left));
            self.next_look.set((pause * 2).min(LONGEST_LOOK));
        }
    }

    /// Hands `take` what is left on the result channel, until it ends or `take` answers
    /// false, for at most `limit`: after the child has ended, its processes are gone and the
    /// channel closes, unless a process out of reach still holds it.
    pub fn drain(&self, limit: Duration, mut take: impl FnMut(Event) -> bool) {
        let until = Instant::now() + limit;
        while let Ok(event) = self
            .events
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            let ended = matches!(event, Event::Closed | Event::Garbage(_));
            if !take(event) || ended {
                return;
            }
        }
    }
}

/// A random nonce for one child, in hex.
pub fn nonce() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Starts `command` as a supervised child: its own process group, the result channel's write end
/// inherited under its own number (passed as [`RESULTS_FD_OPTION`]), and on its stdin the
/// `nonce` on a line of its own followed by `input`, then end of file.
pub fn spawn(mut command: Command, nonce: &str, input: Vec<u8>) -> io::Result<Supervised> {
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
        let mut bytes = format!("{nonce}\n").into_bytes();
        bytes.extend_from_slice(&input);
        // A thread of its own, so that a child that reads slowly, or not at all, never blocks
        // the parent on a full pipe. A child that died already is found by the caller; the
        // write error says nothing more.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let (tx, events) = mpsc::channel();
    std::thread::spawn(move || read_frames(reader, &tx));
    Ok(Supervised {
        stdout: Tail::keep(child.stdout.take()),
        stderr: Tail::keep(child.stderr.take()),
        child,
        events,
        next_look: Cell::new(FIRST_LOOK),
    })
}

/// Reads the result channel to its end, one [`Event`] per line, and stops at the first thing the
/// child's own code does not write.
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
/// 16 KiB is kept.
#[derive(Debug, Clone, Default)]
pub struct Tail(Arc<Mutex<Vec<u8>>>);

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
    pub fn last_lines(&self, n: usize) -> String {
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
pub fn has_exited(child: &Child) -> bool {
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
pub fn end(child: &mut Child, adopted: bool) -> Option<ExitStatus> {
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
pub fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER reads no memory; a failure leaves things as
    // they were, which is the best that can be done then.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
}

/// Kills and reaps every child of this process, again while killing one orphans more. Only this
/// thread reaps them, and a child stays listed (as a zombie) until it is reaped, so a listing
/// taken after the reaping of the last round sees every child left. (A program that embeds this
/// and has the kernel reap its children, SIGCHLD ignored or SA_NOCLDWAIT, races with it either
/// way.)
fn reap_adopted() {
    for _ in 0..64 {
        let children = own_children();
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

/// The children of this process: those of each of its threads, as the kernel lists them
/// ([`task_children`]), or, where it does not, from every process's status in /proc. A
/// subreaper's adopted orphans are children of one of its threads.
fn own_children() -> Vec<libc::pid_t> {
    task_children().unwrap_or_else(|| children_of(std::process::id()))
}

/// The children of each thread of this process, from `/proc/self/task/TID/children`: a few
/// files, where a scan of /proc reads the status of every process on the machine (thousands
/// on a busy server, for every `guild install` that enables a package). `None` where the
/// kernel offers no such files (the main thread's is missing), or the threads kept changing.
///
/// A thread that ends while the files are read (the reader threads of a child that just ended)
/// hands its children to another thread, perhaps one already read: the threads are then listed
/// again, not passed over.
fn task_children() -> Option<Vec<libc::pid_t>> {
    let main = std::process::id().to_string();
    let read = |tid: &str| -> Option<Vec<libc::pid_t>> {
        let list = std::fs::read_to_string(format!("/proc/self/task/{tid}/children")).ok()?;
        list.split_whitespace()
            .map(|pid| pid.parse().ok())
            .collect()
    };
    'listing: for _ in 0..8 {
        let mut children = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            let tid = task.ok()?.file_name();
            let tid = tid.to_str()?;
            let Some(listed) = read(tid) else {
                // The main thread's file is there whenever the kernel offers these files.
                if tid == main {
                    return None;
                }
                continue 'listing;
            };
            children.extend(listed);
        }
        return Some(children);
    }
    None
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

/// The signal that ended a child, with its name.
pub fn signal_of(status: ExitStatus) -> Option<(i32, &'static str)> {
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal()?;
    Some((signal, signal_name(signal)))
}

/// The name of a signal number as Linux numbers them (the platforms packages can name).
fn signal_name(signal: i32) -> &'static str {
    match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 if cfg!(target_os = "linux") => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 if !cfg!(target_os = "linux") => "SIGBUS",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        31 if cfg!(target_os = "linux") => "SIGSYS",
        _ => "an unnamed signal",
    }
}

/// The child's end of its result channel: the pipe its parent passed under
/// [`RESULTS_FD_OPTION`], and the nonce its parent wrote on its stdin.
pub struct ResultChannel {
    out: std::fs::File,
    nonce: String,
}

impl std::fmt::Debug for ResultChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The nonce is the channel's one secret; it is not printed.
        f.debug_struct("ResultChannel").finish_non_exhaustive()
    }
}

/// The longest nonce line a child accepts on its stdin.
const MAX_NONCE_LINE: u64 = 256;

impl ResultChannel {
    /// Takes the inherited descriptor `fd`, and reads stdin to its end: the nonce on the first
    /// line, then at most `max_input` bytes of input from the parent, which it answers. Both are
    /// done before any plugin code runs, so that a plugin finds nothing left to read on stdin.
    pub fn inherited(fd: i32, max_input: u64) -> io::Result<(Self, Vec<u8>)> {
        use std::os::fd::{FromRawFd, OwnedFd};
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_owned());
        if fd <= 2 {
            return Err(invalid(
                "the result channel cannot be stdin, stdout or stderr",
            ));
        }
        // SAFETY: fcntl on any number reads no memory; it tells whether the descriptor is open.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
            return Err(io::Error::last_os_error());
        }
        let mut stdin = Vec::new();
        io::stdin()
            .take(MAX_NONCE_LINE + max_input + 1)
            .read_to_end(&mut stdin)?;
        let (line, input) = match stdin.iter().position(|&b| b == b'\n') {
            Some(end) => (&stdin[..end], stdin[end + 1..].to_vec()),
            None => (&stdin[..], Vec::new()),
        };
        let nonce = String::from_utf8_lossy(line).trim().to_owned();
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("stdin does not carry the result channel's nonce"));
        }
        if input.len() as u64 > max_input {
            return Err(invalid(&format!(
                "the parent's input on stdin is over {max_input} bytes"
            )));
        }
        // SAFETY: the descriptor is open (fcntl above), it was passed to this process for this
        // channel alone, and nothing else in it takes ownership of that number.
        let out = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok((ResultChannel { out, nonce }, input))
    }

    /// The nonce every line must carry.
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// The channel's write end and its nonce. Write each line with one `write_all`, so that a
    /// line stays whole whatever else writes to the pipe.
    pub fn into_parts(self) -> (std::fs::File, String) {
        (self.out, self.nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A supervised `shell -c script`: `$2` is the result channel's descriptor.
    fn supervised(shell: &str, script: &str) -> Supervised {
        let mut command = Command::new(shell);
        // `spawn` appends the channel's option; `-c` takes it as the script's own arguments.
        command.args(["-c", script, shell]);
        spawn(command, &nonce().unwrap(), Vec::new()).unwrap()
    }

    #[test]
    fn signals_have_their_names() {
        assert_eq!(signal_name(6), "SIGABRT");
        assert_eq!(signal_name(11), "SIGSEGV");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(77), "an unnamed signal");
    }

    #[test]
    fn frames_stop_at_the_first_line_no_child_writes() {
        let events = |bytes: &[u8]| {
            let (tx, rx) = mpsc::channel();
            read_frames(bytes, &tx);
            drop(tx);
            rx.into_iter()
                .map(|e| match e {
                    Event::Frame(l) => format!("frame {l}"),
                    Event::Garbage(w) => format!("garbage {w}"),
                    Event::Closed => "closed".to_owned(),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(events(b"a\nb\n"), ["frame a", "frame b", "closed"]);
        assert_eq!(events(b"a\nb"), ["frame a", "garbage an unterminated line"]);
        assert_eq!(
            events(b"\xff\n"),
            ["garbage a line that is not UTF-8".to_owned()]
        );
        let long = vec![b'x'; MAX_FRAME + 10];
        assert_eq!(
            events(&long),
            ["garbage a line longer than 64 KiB".to_owned()]
        );
    }

    /// A child that closed its result channel and runs on is waited for: `next_event` takes
    /// its whole wait each time (a caller's polling loop does not spin), and answers `None`.
    #[test]
    fn next_event_after_the_channel_closed_waits_out_a_child_that_runs_on() {
        // bash: dash closes only descriptors 0 to 9 by number, and the channel's may be above.
        let mut child = supervised("bash", "read nonce; eval \"exec $2>&-\"; sleep 30");
        // The child writes nothing: the first event is the channel's end.
        assert_eq!(
            child.next_event(Duration::from_secs(60)),
            Some(Event::Closed)
        );
        let wait = Duration::from_millis(100);
        for _ in 0..3 {
            let asked = Instant::now();
            assert_eq!(child.next_event(wait), None);
            let took = asked.elapsed();
            assert!(
                took >= wait,
                "next_event answered after {took:?} of its {wait:?}; the child: {:?}",
                child.child.try_wait()
            );
        }
        assert!(!has_exited(&child.child));
        end(&mut child.child, false);
    }

    /// The children the kernel lists per thread are those a scan of every process finds.
    #[test]
    fn the_threads_children_are_the_processes_whose_parent_this_is() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let listed = task_children();
        let scanned = children_of(std::process::id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(scanned.contains(&pid), "{scanned:?} lacks {pid}");
        let offered =
            Path::new(&format!("/proc/self/task/{}/children", std::process::id())).exists();
        match listed {
            Some(listed) => assert!(listed.contains(&pid), "{listed:?} lacks {pid}"),
            None if offered => {
                panic!("the kernel lists children per thread, but they were not read")
            }
            None => eprintln!("this kernel lists no children per thread: the scan is used"),
        }
    }

    /// Once the result channel has closed, `next_event` answers as soon as the child has
    /// exited, not when its `wait` runs out: a caller polling for the exit (the registration
    /// check of every enabling `guild install`) does not sleep past it.
    #[test]
    fn next_event_after_the_channel_closed_returns_when_the_child_exits() {
        // bash: dash redirects to a descriptor only from 0 to 9, and the channel's number is
        // larger when other tests hold descriptors open at the same time.
        let mut child = supervised("bash", "read nonce; printf 'done\\n' >&\"$2\"; exit 0");
        let wait = Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            match child.next_event(wait) {
                Some(Event::Closed) => break,
                Some(event) => seen.push(event),
                None => panic!("the channel neither carried nor closed within {wait:?}"),
            }
        }
        assert_eq!(seen, [Event::Frame("done".to_owned())]);
        let asked = Instant::now();
        assert_eq!(child.next_event(wait), None);
        let took = asked.elapsed();
        assert!(
            has_exited(&child.child),
            "next_event answered before the child exited"
        );
        assert!(
            took < wait,
            "next_event slept out its whole wait ({took:?}) after the child had exited"
        );
        assert!(end(&mut child.child, false).unwrap().success());
    }
}
