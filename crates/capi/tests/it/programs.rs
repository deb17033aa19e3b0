//! The C and C++ test programs (tests/c/), compiled against the header and linked against the
//! built `libguild_host.so`, run on a store this process changes when they ask: it installs a new
//! version and revokes it from its own writer, so the program follows changes another process
//! commits. With `GUILD_CAPI_VALGRIND=1` (set by `cargo xtask test`'s valgrind step) each
//! program runs under valgrind, and any memory error or definite leak fails the test.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::fixture::ScanStore;
use crate::header::{cc, cxx, include_dir, CXX_FLAGS, C_FLAGS};

/// The directory holding the cdylib cargo built for these tests.
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let lib = dir.join("libguild_host_capi.so");
        if lib.is_file() {
            return lib;
        }
    }
    panic!(
        "libguild_host_capi.so is not beside {}; build it with `cargo build -p guild-host-capi`",
        exe.display()
    );
}

/// A directory holding the library under its installed name, `libguild_host.so` (its soname),
/// copied once per test run (the test binary may have been rebuilt with a new library).
fn library_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi/lib");
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(format!("libguild_host.so.{}", std::process::id()));
        std::fs::copy(built_library(), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("libguild_host.so")).unwrap();
        dir
    })
    .clone()
}

fn build(source: &str, cxx_program: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    let libs = library_dir();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("capi")
        .join(source.replace('.', "_"));
    let (compiler, flags) = if cxx_program {
        (cxx(), CXX_FLAGS)
    } else {
        (cc(), C_FLAGS)
    };
    let run = Command::new(&compiler)
        .args(flags)
        .arg("-g")
        .arg("-I")
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&libs)
        .arg("-lguild_host")
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        run.status.success(),
        "{compiler} {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    out
}

/// Runs `program` on a scan store, answering its requests; returns its stdout lines.
fn run(program: &Path) -> Vec<String> {
    let s = ScanStore::new("1.0.0");
    let not_a_store = s.shop.fresh("not-a-store");
    let valgrind = std::env::var_os("GUILD_CAPI_VALGRIND").is_some_and(|v| v == "1");
    let mut cmd = if valgrind {
        let mut c = Command::new("valgrind");
        c.args([
            "--quiet",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--show-leak-kinds=definite,indirect",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    };
    let mut child = cmd
        .arg(s.path())
        .arg(&not_a_store)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(request) = line.strip_prefix("need ") {
            match request.split_once(' ') {
                Some(("install", version)) => s.install(version),
                Some(("revoke", version)) => s.revoke(version),
                _ => panic!("{} asked for {request:?}", program.display()),
            }
            writeln!(stdin, "done").unwrap();
            stdin.flush().unwrap();
        }
        lines.push(line);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} exited with {} after {lines:?}{}:\n{}",
        program.display(),
        out.status,
        if valgrind { " under valgrind" } else { "" },
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !not_a_store.exists(),
        "the program's open created {}",
        not_a_store.display()
    );
    lines
}

#[test]
fn c_program_opens_executes_reshapes_follows_an_install_and_a_revocation_and_closes() {
    let lines = run(&build("api_test.c", false));
    assert_eq!(
        lines,
        ["need install 1.1.0", "need revoke 1.1.0", "ok"],
        "the C test did not get through its steps"
    );
}

#[test]
fn cxx_program_does_the_same_through_the_raii_wrapper() {
    let lines = run(&build("api_test.cpp", true));
    assert_eq!(
        lines,
        ["need install 1.1.0", "need revoke 1.1.0", "ok"],
        "the C++ test did not get through its steps"
    );
}
