//! A fake CUDA driver for tests on machines without a GPU (see `fake_libcuda.c` for what it
//! does and which rules of the real driver it enforces).
//!
//! The driver is opened by name (`libcuda.so.1`), and the dynamic loader reads
//! `LD_LIBRARY_PATH` once, when a process starts; so the fake serves a child process started
//! with [`FakeDriver::command`], never the test process itself. Tests run their GPU tests in
//! such a child to exercise the host's CUDA code paths (the adapter, the CUDA test module, the
//! service's stream bookkeeping) without a device. What it cannot show is that the real driver
//! and a real GPU behave as the fake does; only a run on a GPU shows that.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fake's C source.
pub const SOURCE: &str = include_str!("fake_libcuda.c");

/// The line the fake prints at exit, followed by the count of each kind of object still alive.
pub const EXIT_REPORT: &str = "fake-cuda: alive at exit: ";

/// What the exit report says when nothing leaked.
pub const NOTHING_ALIVE: &str =
    "fake-cuda: alive at exit: 0 events, 0 streams, 0 modules, 0 graphs, \
                                 0 graph execs, 0 allocations, 0 primary context retains";

/// Which fake to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Variant {
    /// Every entry point the host calls.
    #[default]
    Complete,
    /// Without `cuGraphLaunch`: a driver too old for the host.
    WithoutGraphLaunch,
}

/// A fake driver built into a directory.
#[derive(Debug, Clone)]
pub struct FakeDriver {
    dir: PathBuf,
}

impl FakeDriver {
    /// Compiles the fake into `dir` (created if missing) as `libcuda.so.1`, with `libcuda.so`
    /// beside it (cudarc tries the unversioned name first). Uses `$CC`, else `cc`.
    pub fn build(dir: &Path, variant: Variant) -> Result<FakeDriver, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let source = dir.join("fake_libcuda.c");
        std::fs::write(&source, SOURCE)
            .map_err(|e| format!("cannot write {}: {e}", source.display()))?;
        let library = dir.join("libcuda.so.1");
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let mut cmd = Command::new(&compiler);
        cmd.args([
            "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror",
        ])
        .arg("-fvisibility=hidden")
        .arg("-o")
        .arg(&library)
        .arg(&source)
        .arg("-lpthread");
        if variant == Variant::WithoutGraphLaunch {
            cmd.arg("-DFAKE_CUDA_OMIT_GRAPH_LAUNCH");
        }
        let out = cmd.output().map_err(|e| {
            format!("cannot run the C compiler `{compiler}` to build the fake CUDA driver: {e}")
        })?;
        if !out.status.success() {
            return Err(format!(
                "building the fake CUDA driver failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let link = dir.join("libcuda.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libcuda.so.1", &link)
            .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
        Ok(FakeDriver {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory that holds the fake.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `program` set up to find the fake before any real driver: the fake's directory first on
    /// `LD_LIBRARY_PATH`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut path = std::ffi::OsString::from(self.dir.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            path.push(":");
            path.push(old);
        }
        let mut cmd = Command::new(program);
        cmd.env("LD_LIBRARY_PATH", path);
        cmd
    }
}

/// The fake's last exit report in `stderr` (it prints one whenever it is unloaded), if any.
pub fn exit_report(stderr: &str) -> Option<&str> {
    stderr.lines().rfind(|l| l.starts_with(EXIT_REPORT))
}
