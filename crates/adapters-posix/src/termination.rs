//! Telling a routine stop from a crash during a load.
//!
//! The app's crash ledger keeps a locked record under `loading/` while a package's library is
//! opened and its `init` runs; a record whose process is gone is taken for a crash in `init`
//! and quarantines the build. A process stopped on purpose (`systemctl stop` sends SIGTERM, a
//! terminal SIGINT) while a sound library initialises slowly would be taken for one too.
//!
//! This module lets the process say how it ended, from inside the signal handler, with nothing
//! but `write(2)` (async-signal-safe): the ledger registers the open descriptor of each record
//! in flight ([`watch_load_record`]), and [`note_termination`] appends one line to each,
//! `ended by signal N`. The sweeper that later finds the record sees the line and removes the
//! record without quarantining anything. [`install_termination_handlers`] installs handlers for
//! SIGTERM, SIGINT and SIGHUP that do exactly that and then end the process by the same signal
//! (the default action, so its exit status is unchanged); a runner with handlers of its own
//! calls [`note_termination`] from them instead, before it exits.
//!
//! A process that ends its work cleanly on SIGTERM and SIGINT instead (a follower between two
//! polls) takes them as a request to stop through [`stop_requests`]: the signal is recorded and
//! wakes the waiting thread through a pipe; a second one ends the process at once.
//!
//! What cannot be caught (SIGKILL, a crash) leaves the record without the line: a crash, as
//! before. At most [`MAX_WATCHED`] records are watched at once; a load beyond that is not, and
//! a signal during it is taken for a crash (safe: a build is refused, never run by mistake).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How many load records can be watched at once.
pub const MAX_WATCHED: usize = 64;

/// A free slot.
const FREE: i32 = -1;
/// A slot whose descriptor a signal handler is writing to right now.
const BUSY: i32 = -2;

/// The descriptors of the load records in flight ([`FREE`] or [`BUSY`] otherwise).
static WATCHED: [AtomicI32; MAX_WATCHED] = [const { AtomicI32::new(FREE) }; MAX_WATCHED];

/// A load record watched for termination signals: its slot is freed when this is dropped,
/// which must happen before the record's file is closed. The drop waits while a handler on
/// another thread is writing to the descriptor, so the descriptor cannot be closed (and its
/// number reused by another file) under that write.
#[derive(Debug)]
pub struct WatchedRecord {
    slot: usize,
    fd: i32,
}

impl Drop for WatchedRecord {
    fn drop(&mut self) {
        let cell = &WATCHED[self.slot];
        loop {
            match cell.compare_exchange(self.fd, FREE, Ordering::SeqCst, Ordering::SeqCst) {
                // A handler holds it for a write that takes microseconds; the process ends
                // right after, so this wait is short or moot.
                Err(BUSY) => std::hint::spin_loop(),
                _ => return,
            }
        }
    }
}

/// Watches the load record open as `file` (opened for writing): a termination signal noted
/// while the answer lives appends `ended by signal N` to it. The file is switched to append
/// mode, so that the line lands after the record whatever the file's offset. `None` when every
/// slot is taken, or the file's flags cannot be changed: the load goes on unwatched.
pub fn watch_load_record(file: &File) -> Option<WatchedRecord> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open for as long as `file` is borrowed; F_GETFL and F_SETFL change only
    // the file's status flags.
    let appended = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_APPEND) == 0
    };
    if !appended {
        return None;
    }
    WATCHED.iter().enumerate().find_map(|(slot, cell)| {
        cell.compare_exchange(FREE, fd, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| WatchedRecord { slot, fd })
    })
}

/// The line appended to a record: `\nended by signal NNN\n`, built without allocating.
fn ended_line(signal: i32, out: &mut [u8; 32]) -> usize {
    const HEAD: &[u8] = b"\nended by signal ";
    out[..HEAD.len()].copy_from_slice(HEAD);
    let mut n = HEAD.len();
    let mut digits = [0u8; 10];
    let mut d = 0;
    let mut value = signal.unsigned_abs();
    loop {
        digits[d] = b'0' + (value % 10) as u8;
        d += 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        out[n] = digits[d];
        n += 1;
    }
    out[n] = b'\n';
    n + 1
}

/// Appends `ended by signal <signal>` to every load record in flight. Async-signal-safe (it
/// only reads atomics and calls `write(2)`): call it from a signal handler before the process
/// ends.
pub fn note_termination(signal: i32) {
    let mut line = [0u8; 32];
    let len = ended_line(signal, &mut line);
    for cell in &WATCHED {
        let fd = cell.load(Ordering::SeqCst);
        // Claimed for the write: the slot's owner cannot free it (and close the file) until it
        // is given back.
        if fd < 0
            || cell
                .compare_exchange(fd, BUSY, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            continue;
        }
        // SAFETY: the slot held `fd` and now holds BUSY, so its owner has not freed it and
        // waits to (the descriptor is closed only after the slot is freed): `fd` is the
        // record's open file. `line` is a live buffer of `len` bytes. A failed or short write
        // leaves the record as a crash: the build is refused, never run by mistake.
        let _ = unsafe { libc::write(fd, line.as_ptr().cast(), len) };
        cell.store(fd, Ordering::SeqCst);
    }
}

/// The handler [`install_termination_handlers`] installs: notes the signal, then ends the
/// process by it, as the default action would have.
extern "C" fn on_termination(signal: libc::c_int) {
    note_termination(signal);
    // SAFETY: signal() and raise() are async-signal-safe; restoring the default action and
    // raising the signal again ends the process exactly as if no handler had been installed.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// Installs handlers for SIGTERM, SIGINT and SIGHUP that note the signal in every load record
/// in flight ([`note_termination`]) and then end the process by that signal. A signal the
/// process was started with ignored (`nohup`, a shell's background job) stays ignored. A
/// process that has handlers of its own for them should call [`note_termination`] from those
/// instead.
pub fn install_termination_handlers() -> io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        install_handler(signal, on_termination)?;
    }
    Ok(())
}

/// The signal that asked the process to stop (0 while none has), once [`stop_requests`]
/// installed its handlers.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The write end of the pipe through which the stop handler wakes [`StopRequests::wait`]
/// (-1 until it exists). It is never closed, so the handler never writes to a reused number.
static STOP_PIPE: AtomicI32 = AtomicI32::new(-1);
/// The one [`StopRequests`] of the process.
static STOP_REQUESTS: OnceLock<StopRequests> = OnceLock::new();
/// Held while [`stop_requests`] installs.
static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// SIGTERM and SIGINT taken as a request to stop, for a process that ends its work cleanly
/// instead of being ended by them (`guild fleet sync --follow`): the first one is recorded and
/// wakes whoever [`waits`](StopRequests::wait); a second one ends the process by that signal at
/// once, as the default action would (noting it in the load records in flight, like
/// [`install_termination_handlers`]). Made by [`stop_requests`].
#[derive(Debug)]
pub struct StopRequests {
    /// The read end of the pipe the handler writes one byte to.
    read: OwnedFd,
}

impl StopRequests {
    /// The signal that asked the process to stop, if one has.
    pub fn signal(&self) -> Option<i32> {
        match STOP_SIGNAL.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Waits at most `timeout` for a request to stop; answers its signal as soon as one has
    /// come (at once if one came before), `None` when the time passed without one.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(signal) = self.signal() {
                return Some(signal);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            // Rounded up, so that a wait never ends a little early and spins.
            let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
            let mut ready = libc::pollfd {
                fd: self.read.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: `ready` is one valid pollfd for the pipe's open read end, which lives as
            // long as `self`; poll only writes its `revents`. Whatever it answers (readiness, a
            // timeout, EINTR), the loop checks the recorded signal and the clock again.
            let _ = unsafe { libc::poll(&mut ready, 1, ms) };
        }
    }
}

/// Installs (once per process) handlers that take SIGTERM and SIGINT as a request to stop, and
/// answers the [`StopRequests`] that tells of them. A signal the process was started with
/// ignored (`nohup`, a shell's background job) stays ignored.
pub fn stop_requests() -> io::Result<&'static StopRequests> {
    // One installation at a time: two would each make a pipe, and the handler would write to
    // one while the waiter polls the other.
    let _one = INSTALLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(made) = STOP_REQUESTS.get() {
        return Ok(made);
    }
    let mut fds = [-1i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so fds[0] is an open descriptor that nothing else owns. The
    // write end, fds[1], is kept open for the life of the process (see `STOP_PIPE`).
    let read = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    STOP_PIPE.store(fds[1], Ordering::SeqCst);
    for signal in [libc::SIGTERM, libc::SIGINT] {
        install_handler(signal, on_stop)?;
    }
    Ok(STOP_REQUESTS.get_or_init(|| StopRequests { read }))
}

/// The handler [`stop_requests`] installs: records the first signal and wakes the waiter;
/// a second signal ends the process as [`on_termination`] does.
extern "C" fn on_stop(signal: libc::c_int) {
    if STOP_SIGNAL
        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        on_termination(signal);
        return;
    }
    let fd = STOP_PIPE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = 1u8;
        let saved = errno::get();
        // SAFETY: write() is async-signal-safe; `fd` is the pipe's write end, never closed;
        // `byte` is one live byte. The pipe is non-blocking, so a full pipe (a waiter already
        // woken) costs nothing. errno is put back for the code the signal interrupted.
        let _ = unsafe { libc::write(fd, std::ptr::addr_of!(byte).cast(), 1) };
        errno::set(saved);
    }
}

/// errno, read and put back by a signal handler that calls something which may set it.
mod errno {
    #[cfg(target_os = "linux")]
    pub fn get() -> i32 {
        // SAFETY: __errno_location returns the calling thread's errno, always valid to read.
        unsafe { *libc::__errno_location() }
    }

    #[cfg(target_os = "linux")]
    pub fn set(value: i32) {
        // SAFETY: as in `get`; the thread's own errno is valid to write.
        unsafe { *libc::__errno_location() = value }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn get() -> i32 {
        0
    }

    #[cfg(not(target_os = "linux"))]
    pub fn set(_: i32) {}
}

/// Installs `handler` for `signal` (with SA_RESTART, so that interrupted system calls go on),
/// unless the process was started with the signal ignored.
fn install_handler(signal: libc::c_int, handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    // SAFETY: sigaction with a NULL new action only reads the current one into `current`,
    // a zeroed (valid) struct.
    let ignored = unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    };
    if ignored {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction is a valid starting point; every handler given here only
    // calls async-signal-safe functions; SA_RESTART keeps interrupted system calls going.
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut())
    };
    if installed != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Seek as _, Write as _};

    #[test]
    fn the_line_names_the_signal() {
        let mut out = [0u8; 32];
        let n = ended_line(15, &mut out);
        assert_eq!(&out[..n], b"\nended by signal 15\n");
        let n = ended_line(1, &mut out);
        assert_eq!(&out[..n], b"\nended by signal 1\n");
    }

    #[test]
    fn a_noted_termination_is_appended_to_a_watched_record_only_while_watched() {
        let dir = std::env::temp_dir().join(format!("guild-termination-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("record.json");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all(b"{\"record\":1}").unwrap();
        file.rewind().unwrap();
        let watched = watch_load_record(&file).expect("a slot is free");
        note_termination(15);
        drop(watched);
        note_termination(2);
        let mut text = String::new();
        std::fs::File::open(&path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "{\"record\":1}\nended by signal 15\n");
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stop_request_wakes_the_waiter_and_is_kept() {
        let stop = stop_requests().unwrap();
        assert!(
            std::ptr::eq(stop, stop_requests().unwrap()),
            "installed once"
        );
        assert_eq!(stop.signal(), None);
        assert_eq!(stop.wait(Duration::from_millis(20)), None);
        // The signal arrives while the waiter waits an hour.
        let raiser = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: raise() only sends the signal, to this process, whose handler records it.
            unsafe { libc::raise(libc::SIGTERM) };
        });
        assert_eq!(stop.wait(Duration::from_secs(3600)), Some(libc::SIGTERM));
        raiser.join().unwrap();
        assert_eq!(stop.signal(), Some(libc::SIGTERM));
        assert_eq!(stop.wait(Duration::from_secs(3600)), Some(libc::SIGTERM));
    }
}
