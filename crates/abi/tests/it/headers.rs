//! Compiles the public C headers the ways plugin authors will: as C99 and as C++17 with warnings as
//! errors, each header alone and twice, all of them together and in reverse order, with the host
//! compilers and with the MinGW-w64 cross compilers. A header that is not self-contained, not
//! idempotent, order-dependent or not warning-free on any of them fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the SDK's headers live; the `guild/abi/*.h` files under it are discovered, not listed.
fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../abi-headers/include")
}

/// The file names of every `*.h` in `<include>/guild/abi`, sorted.
fn header_names(include: &Path) -> Vec<String> {
    let dir = include.join("guild/abi");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".h"))
        .collect();
    names.sort();
    names
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lang {
    C,
    Cxx,
}

/// A pair of compilers that build the same translation units.
struct Toolchain {
    name: &'static str,
    cc: String,
    cxx: String,
}

impl Toolchain {
    /// The host compilers, `CC`/`CXX` when set.
    fn host() -> Self {
        Toolchain {
            name: "host",
            cc: std::env::var("CC").unwrap_or_else(|_| "cc".into()),
            cxx: std::env::var("CXX").unwrap_or_else(|_| "c++".into()),
        }
    }

    /// Debian's MinGW-w64 cross compilers for 64-bit Windows.
    fn mingw() -> Self {
        Toolchain {
            name: "mingw",
            cc: "x86_64-w64-mingw32-gcc".into(),
            cxx: "x86_64-w64-mingw32-g++".into(),
        }
    }

    /// Why the toolchain cannot run here, or `None` when both compilers answer `--version`.
    fn missing(&self) -> Option<String> {
        for compiler in [&self.cc, &self.cxx] {
            match Command::new(compiler).arg("--version").output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    return Some(format!("`{compiler} --version` exited with {}", out.status))
                }
                Err(e) => return Some(format!("`{compiler}` cannot be run: {e}")),
            }
        }
        None
    }

    fn compiler(&self, lang: Lang) -> &str {
        match lang {
            Lang::C => &self.cc,
            Lang::Cxx => &self.cxx,
        }
    }
}

/// One generated translation unit, compiled once as C and once as C++.
struct Unit {
    /// File stem, also what a failure names.
    name: String,
    source: String,
}

fn includes(headers: &[&String]) -> String {
    headers
        .iter()
        .map(|h| format!("#include \"guild/abi/{h}\"\n"))
        .collect()
}

/// The translation units every toolchain must compile.
fn units(headers: &[String]) -> Vec<Unit> {
    let mut units = Vec::new();
    let all: Vec<&String> = headers.iter().collect();
    // Together. When kernel_abi.h is among them, a few lines also use its error-record helpers so
    // that their expansions are compiled with -Wextra in both languages.
    let mut source = includes(&all);
    if headers.iter().any(|h| h == "kernel_abi.h") {
        source.push_str(
            "\nint guild_headers_smoke(void);\nint guild_headers_smoke(void) {\n    \
             guild_error_info_t err = GUILD_ERROR_INFO_INITIALIZER();\n    \
             guild_error_info_init(&err);\n    \
             return (int)guild_error_info_set(&err, GUILD_STATUS_ERR_UNSUPPORTED, \"smoke\", \"check\");\n}\n",
        );
    }
    units.push(Unit {
        name: "all".into(),
        source,
    });
    let reversed: Vec<&String> = headers.iter().rev().collect();
    units.push(Unit {
        name: "all_reversed".into(),
        source: includes(&reversed),
    });
    for h in headers {
        let stem = h.trim_end_matches(".h");
        // Nothing before it: the header must include what it needs.
        units.push(Unit {
            name: format!("alone_{stem}"),
            source: includes(&[h]),
        });
        // Twice in a row: the include guard must hold.
        units.push(Unit {
            name: format!("twice_{stem}"),
            source: includes(&[h, h]),
        });
    }
    units
}

/// Outcome of compiling every unit with one toolchain.
struct Report {
    compilations: usize,
    /// `(unit, language, compiler output)` of each failed compilation.
    failures: Vec<(String, Lang, String)>,
}

/// Compiles every unit as C99 (`-pedantic`) and as C++17 with `-Wall -Wextra -Werror`.
fn compile_all(toolchain: &Toolchain, include: &Path, units: &[Unit], out_dir: &Path) -> Report {
    std::fs::create_dir_all(out_dir)
        .unwrap_or_else(|e| panic!("creating {}: {e}", out_dir.display()));
    let mut report = Report {
        compilations: 0,
        failures: Vec::new(),
    };
    for unit in units {
        for lang in [Lang::C, Lang::Cxx] {
            let (ext, flags): (&str, &[&str]) = match lang {
                Lang::C => (
                    "c",
                    &["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"],
                ),
                Lang::Cxx => ("cpp", &["-std=c++17", "-Wall", "-Wextra", "-Werror"]),
            };
            let src = out_dir.join(format!("{}.{ext}", unit.name));
            let obj = out_dir.join(format!("{}.{ext}.o", unit.name));
            std::fs::write(&src, &unit.source)
                .unwrap_or_else(|e| panic!("writing {}: {e}", src.display()));
            let compiler = toolchain.compiler(lang);
            let out = Command::new(compiler)
                .args(flags)
                .arg("-I")
                .arg(include)
                .arg("-c")
                .arg(&src)
                .arg("-o")
                .arg(&obj)
                .output()
                .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
            report.compilations += 1;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                report.failures.push((unit.name.clone(), lang, stderr));
            }
        }
    }
    report
}

/// Compiles the real headers with `toolchain` and fails with every compiler message on any error.
fn check_toolchain(toolchain: &Toolchain) {
    let include = include_dir();
    let headers = header_names(&include);
    assert!(
        !headers.is_empty(),
        "no headers found under {}",
        include.display()
    );
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("abi-headers")
        .join(toolchain.name);
    let report = compile_all(toolchain, &include, &units(&headers), &out_dir);
    eprintln!(
        "abi headers ({}: {} / {}): {} compilations of {} headers, {} failed",
        toolchain.name,
        toolchain.cc,
        toolchain.cxx,
        report.compilations,
        headers.len(),
        report.failures.len()
    );
    let failed: Vec<String> = report
        .failures
        .iter()
        .map(|(unit, lang, stderr)| format!("--- {unit} as {lang:?}:\n{stderr}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} header compilations failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn headers_compile_with_the_host_compilers() {
    check_toolchain(&Toolchain::host());
}

#[test]
fn headers_compile_with_mingw() {
    let toolchain = Toolchain::mingw();
    if let Some(reason) = toolchain.missing() {
        let required = std::env::var("GUILD_REQUIRE_MINGW").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "GUILD_REQUIRE_MINGW=1 but the MinGW-w64 toolchain is unusable: {reason}"
        );
        eprintln!("abi headers (mingw): skipped because {reason}; set GUILD_REQUIRE_MINGW=1 to fail instead");
        return;
    }
    check_toolchain(&toolchain);
}

/// The checker itself must be able to fail: a header without an include guard compiles alone but
/// not twice, and one that uses `uint32_t` without including <stdint.h> does not compile alone.
#[test]
fn checker_catches_missing_guards_and_missing_includes() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("abi-headers-selftest");
    let include = root.join("include");
    let abi = include.join("guild/abi");
    std::fs::create_dir_all(&abi).unwrap();
    std::fs::write(
        abi.join("a_unguarded.h"),
        "typedef struct guild_a_t { int x; } guild_a_t;\n",
    )
    .unwrap();
    std::fs::write(
        abi.join("b_needs_stdint.h"),
        "#ifndef B_H\n#define B_H\ntypedef struct guild_b_t { uint32_t x; } guild_b_t;\n#endif\n",
    )
    .unwrap();
    let headers = header_names(&include);
    let report = compile_all(
        &Toolchain::host(),
        &include,
        &units(&headers),
        &root.join("out"),
    );

    let mut failed: Vec<(String, Lang)> = report
        .failures
        .into_iter()
        .map(|(unit, lang, _)| (unit, lang))
        .collect();
    failed.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then((a.1 == Lang::Cxx).cmp(&(b.1 == Lang::Cxx)))
    });
    let expected: Vec<(String, Lang)> = [
        "all",
        "all_reversed",
        "alone_b_needs_stdint",
        "twice_a_unguarded",
        "twice_b_needs_stdint",
    ]
    .iter()
    .flat_map(|unit| [(unit.to_string(), Lang::C), (unit.to_string(), Lang::Cxx)])
    .collect();
    assert_eq!(
        report.compilations, 12,
        "2 combined units and 2 per header, each in C and C++"
    );
    assert_eq!(failed, expected);
}
