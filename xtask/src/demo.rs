//! `cargo xtask demo`: the whole life of a module, end to end, with the tools a newcomer uses.
//!
//! It builds the SDK and the C modules against it, then the `guild` command line and the
//! example Rust runner, and drives them the way a publisher and an operator would: make a key,
//! pack and sign three modules (the scans, a module that builds on them, and the C runner from
//! examples/c-runner), trust the key, verify, install, run the operations through the service
//! with the example runner, show that the host refuses what it must refuse (an untrusted
//! publisher, a tampered package, disabling a module others depend on), install a second
//! version and roll back while a serving runner (`guild-example-runner --serve`) runs in the
//! background and switches versions without a restart. Last, it installs the Llama operations
//! module and decodes a tiny Llama (written by `examples/llama-decode/make_tiny_llama.py`)
//! through the service, checking the tokens and logits against the script's numpy reference,
//! once with f32 weights and once with q8_0 ones.
//!
//! Every step prints what it does, the command, and the command's output. Each command's exit
//! code and the facts its output must state (ids, versions, results) are checked; anything else
//! (a refusal that does not happen, a wrong result) stops the demo with an error. Everything it
//! writes lives under target/demo, which is wiped at the start, so it can run any number of
//! times.

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use crate::{sdk, tools, util};

/// The publisher the example manifests name.
const PUBLISHER: &str = "org.example";

/// One package of the demo: where its library comes from and its manifest template.
struct Package {
    /// The package id, as its manifest says.
    id: &'static str,
    /// The library, as `cargo xtask plugins` names it in target/test-plugins/lib.
    library: &'static str,
    /// The manifest template, relative to the workspace root.
    manifest: &'static str,
}

const SCAN: Package = Package {
    id: "example.scan",
    library: "libscan_module.so",
    manifest: "examples/modules/scan/manifest.json",
};
const DEPENDENT: Package = Package {
    id: "example.dependent",
    library: "libscan_dependent.so",
    manifest: "examples/modules/scan_dependent/manifest.json",
};
const C_RUNNER: Package = Package {
    id: "example.c_runner",
    library: "libexample_c_runner.so",
    manifest: "examples/c-runner/manifest.json",
};

const INCLUSIVE_OP: &str = "example.sequence.inclusive_scan";
const TOTAL_OP: &str = "example.sequence.scan_then_total";
const PIPELINE_OP: &str = "example.runner.demo_pipeline";

/// What the runner must print for the example input (two rows: 1 2 3 4 and 10 20 30 40).
const INCLUSIVE_RESULT: &str = "output    [[1, 3, 6, 10], [10, 30, 60, 100]]";
const TOTAL_RESULT: &str = "output    [[10], [100]]";
const PIPELINE_RESULTS: [&str; 2] = [
    "output[0] [[1, 3, 6, 10], [10, 30, 60, 100]]",
    "output[1] [[0, 1, 3, 6], [0, 10, 30, 60]]",
];

/// Exit codes of `guild` (docs/cli.md).
const OK: i32 = 0;
const REJECTED: i32 = 3;
const REFUSED: i32 = 4;

pub fn run() -> Result<(), String> {
    tools::require(tools::Task::Demo)?;
    let start = Instant::now();
    println!("Guild demo: build, sign, trust, install, run, refuse, roll back.");
    println!("Everything it writes goes under target/demo; run it again at will.");

    let mut demo = Demo {
        root: util::root(),
        guild: PathBuf::new(),
        runner: PathBuf::new(),
        engine: PathBuf::new(),
        step: 0,
    };
    let plugins = build(&mut demo)?;
    let files = Files::fresh(&demo)?;

    demo.title("Make a publisher key pair");
    demo.guild(
        &["keygen", "--out", &files.key_prefix],
        OK,
        &[&files.private_key],
    )?;

    let archives = pack_modules(&mut demo, &files, &plugins)?;
    trust_the_publisher(&mut demo, &files, &archives.scan)?;
    refuse_a_tampered_package(&mut demo, &files, &archives.scan)?;
    install_modules(&mut demo, &files, &archives)?;
    run_and_resolve(&mut demo, &files)?;
    refuse_disabling_a_dependency(&mut demo, &files)?;
    let serving = upgrade_while_serving(&mut demo, &files)?;
    roll_back(&mut demo, &files, serving)?;
    llama_decode(
        &mut demo,
        &files.dir,
        &files.store,
        &plugins,
        &files.private_key,
    )?;

    let store = &files.store;
    println!();
    println!(
        "demo: all {} steps behaved as expected ({:.1}s). The store is in {store}; try \
         `{} --store {store} status {}`.",
        demo.step,
        start.elapsed().as_secs_f64(),
        demo.show(&demo.guild),
        SCAN.id
    );
    Ok(())
}

/// Where the demo writes, under target/demo, with the paths the printed commands name.
struct Files {
    dir: PathBuf,
    packages: PathBuf,
    manifests: PathBuf,
    store: String,
    key_prefix: String,
    private_key: String,
    public_key: String,
}

impl Files {
    /// Wipes target/demo and makes its directories afresh.
    fn fresh(demo: &Demo) -> Result<Self, String> {
        let dir = demo.root.join("target").join("demo");
        remove_tree(&dir)?;
        let keys = dir.join("keys");
        let packages = dir.join("packages");
        let manifests = dir.join("manifests");
        for d in [&keys, &packages, &manifests] {
            fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let store = demo.show(&dir.join("store"));
        let key_prefix = demo.show(&keys.join(PUBLISHER));
        Ok(Files {
            private_key: format!("{key_prefix}.key"),
            public_key: format!("{key_prefix}.pub"),
            dir,
            packages,
            manifests,
            store,
            key_prefix,
        })
    }

    /// The directory of built files a package is packed from.
    fn source(&self, package: &Package) -> PathBuf {
        self.dir.join("src").join(package.id)
    }
}

/// The three signed 1.0.0 archives, as the printed commands name them.
struct Archives {
    scan: String,
    dependent: String,
    c_runner: String,
}

/// Builds the SDK and the C modules, then the `guild` command line and the example runner
/// (kept in `demo`). Returns the directory of the built libraries.
fn build(demo: &mut Demo) -> Result<PathBuf, String> {
    demo.title("Build the SDK, then the C modules against the installed SDK");
    println!("   (what `cargo xtask plugins` does)");
    let plugins = sdk::plugins()?;

    demo.title("Build the `guild` command line and the example Rust runner");
    let built = Instant::now();
    (demo.guild, demo.runner) = build_binaries(&demo.root)?;
    println!(
        "   built {} and {} ({:.1}s)",
        demo.show(&demo.guild),
        demo.show(&demo.runner),
        built.elapsed().as_secs_f64()
    );

    demo.title("Install libguild_host and build the C++ example engine against it");
    println!(
        "   (what `cargo xtask capi` does: CMake and pkg-config each build it from the prefix)"
    );
    let built = Instant::now();
    let installed = crate::capi::install_and_build(&demo.root.join("target/guild-host"))?;
    demo.engine = installed.engine_cmake;
    println!(
        "   installed {} and built {} ({:.1}s)",
        demo.show(&installed.prefix),
        demo.show(&demo.engine),
        built.elapsed().as_secs_f64()
    );
    Ok(plugins)
}

/// Copies each module's library into its own source directory and packs and signs it at
/// 1.0.0.
fn pack_modules(demo: &mut Demo, files: &Files, plugins: &Path) -> Result<Archives, String> {
    demo.title("Pack and sign three modules: the scans, a module built on them, the C runner");
    println!("   Each directory holds the built library; the manifest template says what it is.");
    let mut archives = Vec::new();
    for package in [&SCAN, &DEPENDENT, &C_RUNNER] {
        let source = files.source(package);
        let lib = source.join("lib");
        fs::create_dir_all(&lib).map_err(|e| format!("cannot create {}: {e}", lib.display()))?;
        let from = plugins.join(package.library);
        fs::copy(&from, lib.join(package.library))
            .map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
        let template = demo.template(package, "1.0.0", &files.manifests)?;
        let archive = demo.show(
            &files
                .packages
                .join(format!("{}-1.0.0.gkmodule", package.id)),
        );
        demo.guild(
            &[
                "pack",
                &demo.show(&source),
                "--manifest",
                &template,
                "--out",
                &archive,
                "--key",
                &files.private_key,
            ],
            OK,
            &[package.id, "1.0.0"],
        )?;
        archives.push(archive);
    }
    let [scan, dependent, c_runner] = <[String; 3]>::try_from(archives)
        .map_err(|_| "three archives were expected".to_string())?;
    Ok(Archives {
        scan,
        dependent,
        c_runner,
    })
}

/// The store refuses the package until its publisher's key is trusted; then it verifies.
fn trust_the_publisher(demo: &mut Demo, files: &Files, scan: &str) -> Result<(), String> {
    let store = files.store.as_str();
    demo.title("Refused: installing before the publisher is trusted");
    demo.guild(
        &["--store", store, "install", scan],
        REJECTED,
        &[PUBLISHER, "trust"],
    )?;

    demo.title("Trust the publisher's key in this store");
    demo.guild(
        &[
            "--store",
            store,
            "trust",
            "add",
            PUBLISHER,
            &files.public_key,
        ],
        OK,
        &[PUBLISHER],
    )?;

    demo.title("Verify a package: signature, trust, every artifact's digest");
    demo.guild(
        &["--store", store, "verify", scan],
        OK,
        &[SCAN.id, "1.0.0", PUBLISHER],
    )?;
    Ok(())
}

/// A copy of the scan package with one bit of its library flipped is refused by `verify` and
/// by `install`, and the store stays empty.
fn refuse_a_tampered_package(demo: &mut Demo, files: &Files, scan: &str) -> Result<(), String> {
    let store = files.store.as_str();
    demo.title("Refused: a package altered after signing");
    let tampered = demo.show(&files.packages.join("example.scan-1.0.0-tampered.gkmodule"));
    let offset = tamper(&demo.root.join(scan), &demo.root.join(&tampered))?;
    println!(
        "   copied {scan} to {tampered} and flipped one bit at byte {offset} (inside \
         lib/{})",
        SCAN.library
    );
    let member = format!("lib/{}", SCAN.library);
    demo.guild(
        &["--store", store, "verify", &tampered],
        REJECTED,
        &[&member],
    )?;
    demo.guild(
        &["--store", store, "install", &tampered],
        REJECTED,
        &[&member],
    )?;
    println!("   Nothing reached the store:");
    demo.guild(&["--store", store, "list"], OK, &[])?;
    demo.expect_listed(store, &[])
}

/// Installs the three modules, dependencies first, and checks that the store lists them.
fn install_modules(demo: &mut Demo, files: &Files, archives: &Archives) -> Result<(), String> {
    let store = files.store.as_str();
    demo.title("Install the three modules (dependencies first) and list the store");
    for (archive, package) in [
        (&archives.scan, &SCAN),
        (&archives.dependent, &DEPENDENT),
        (&archives.c_runner, &C_RUNNER),
    ] {
        demo.guild(
            &["--store", store, "install", archive],
            OK,
            &[package.id, "1.0.0"],
        )?;
    }
    demo.guild(&["--store", store, "list"], OK, &[])?;
    demo.expect_listed(
        store,
        &[
            (SCAN.id, "1.0.0"),
            (DEPENDENT.id, "1.0.0"),
            (C_RUNNER.id, "1.0.0"),
        ],
    )
}

/// Runs the three operations with the example runner, then asks `guild resolve` which
/// implementation a runner gets for one of them.
fn run_and_resolve(demo: &mut Demo, files: &Files) -> Result<(), String> {
    let store = files.store.as_str();
    demo.title("Run the operations through the service with the example Rust runner");
    println!(
        "   It opens the store (re-verifying every package), loads the modules, resolves each \
         operation and executes it."
    );
    demo.run_runner(
        store,
        &[INCLUSIVE_OP, TOTAL_OP, PIPELINE_OP],
        &[
            &format!("loaded {} 1.0.0", SCAN.id),
            &format!("loaded {} 1.0.0", DEPENDENT.id),
            &format!("loaded {} 1.0.0", C_RUNNER.id),
            &format!("{INCLUSIVE_OP} -> example.scan.inclusive.cpu from example.scan 1.0.0"),
            INCLUSIVE_RESULT,
            &format!("{TOTAL_OP} -> example.dependent.total.cpu from example.dependent 1.0.0"),
            TOTAL_RESULT,
            &format!("{PIPELINE_OP} -> example.c_runner.pipeline.cpu from example.c_runner 1.0.0"),
            PIPELINE_RESULTS[0],
            PIPELINE_RESULTS[1],
        ],
    )?;

    demo.title("Run the scan from the C++ engine, which owns its main() and embeds the host");
    let shown = format!("{} {store}", demo.show(&demo.engine));
    demo.command(
        &demo.engine,
        &shown,
        &[store],
        OK,
        &[
            "request 1: n=4 sum=10 from example.scan@1.0.0 ok",
            "request 2: n=8 sum=36 from example.scan@1.0.0 ok",
        ],
    )?;

    demo.title("Ask the store which implementation a runner would get, and why");
    demo.guild(
        &[
            "--store",
            store,
            "resolve",
            INCLUSIVE_OP,
            "--input",
            "i64:4x2",
            "--output",
            "i64:4x2",
        ],
        OK,
        &["example.scan.inclusive.cpu", "example.scan 1.0.0"],
    )?;
    Ok(())
}

/// `disable` of the scan module is refused, naming the enabled modules that depend on it.
fn refuse_disabling_a_dependency(demo: &mut Demo, files: &Files) -> Result<(), String> {
    demo.title("Refused: disabling a module that enabled modules depend on");
    demo.guild(
        &["--store", &files.store, "disable", SCAN.id],
        REFUSED,
        &[SCAN.id, DEPENDENT.id, C_RUNNER.id],
    )?;
    Ok(())
}

/// Starts a serving runner, then packs and installs scan 1.1.0 and checks that the serving
/// runner and a new one both use it. Returns the serving runner, still running.
fn upgrade_while_serving(demo: &mut Demo, files: &Files) -> Result<Servers, String> {
    let store = files.store.as_str();
    demo.title("Start a serving runner in the background; it follows the store by itself");
    let serving = demo.serve(store, INCLUSIVE_OP)?;
    serving.wait_for("example.scan@1.0.0 ok")?;
    println!("   and the C++ engine, serving beside it:");
    let engine = demo.serve_engine(store)?;
    engine.wait_for("example.scan@1.0.0 ok")?;

    demo.title("Install version 1.1.0 of the scan module (the same library, packed anew)");
    let template = demo.template(&SCAN, "1.1.0", &files.manifests)?;
    let scan_11 = demo.show(&files.packages.join("example.scan-1.1.0.gkmodule"));
    demo.guild(
        &[
            "pack",
            &demo.show(&files.source(&SCAN)),
            "--manifest",
            &template,
            "--out",
            &scan_11,
            "--key",
            &files.private_key,
        ],
        OK,
        &[SCAN.id, "1.1.0"],
    )?;
    demo.guild(
        &["--store", store, "install", &scan_11],
        OK,
        &[SCAN.id, "1.1.0", "1.0.0"],
    )?;
    println!("   the serving runner, without a restart:");
    serving.wait_for("example.scan@1.1.0 ok")?;
    println!("   the C++ engine, without a restart:");
    engine.wait_for("example.scan@1.1.0 ok")?;
    demo.run_runner(
        store,
        &[INCLUSIVE_OP],
        &[
            &format!("loaded {} 1.1.0", SCAN.id),
            &format!("{INCLUSIVE_OP} -> example.scan.inclusive.cpu from example.scan 1.1.0"),
            INCLUSIVE_RESULT,
        ],
    )?;
    Ok(Servers { serving, engine })
}

/// The Rust runner and the C++ engine, both serving in the background.
struct Servers {
    serving: Serving,
    engine: Serving,
}

/// Rolls the scan module back to 1.0.0, checks that the serving runner follows (then stops
/// it), and that the store and a new runner are back at 1.0.0.
fn roll_back(demo: &mut Demo, files: &Files, servers: Servers) -> Result<(), String> {
    let Servers { serving, engine } = servers;
    let store = files.store.as_str();
    demo.title("Roll the scan module back to 1.0.0");
    demo.guild(
        &["--store", store, "rollback", SCAN.id],
        OK,
        &[SCAN.id, "1.0.0"],
    )?;
    println!("   the serving runner, without a restart:");
    serving.wait_for("example.scan@1.0.0 ok")?;
    println!("   the C++ engine, without a restart:");
    engine.wait_for("example.scan@1.0.0 ok")?;
    drop(serving);
    drop(engine);
    demo.guild(&["--store", store, "list"], OK, &[])?;
    demo.expect_listed(
        store,
        &[
            (SCAN.id, "1.0.0"),
            (DEPENDENT.id, "1.0.0"),
            (C_RUNNER.id, "1.0.0"),
        ],
    )?;
    demo.run_runner(
        store,
        &[INCLUSIVE_OP, PIPELINE_OP],
        &[
            &format!("{INCLUSIVE_OP} -> example.scan.inclusive.cpu from example.scan 1.0.0"),
            INCLUSIVE_RESULT,
            PIPELINE_RESULTS[0],
            PIPELINE_RESULTS[1],
        ],
    )?;
    Ok(())
}

struct Demo {
    root: PathBuf,
    guild: PathBuf,
    runner: PathBuf,
    /// The C++ example engine (examples/cpp-engine), built against the installed libguild_host.
    engine: PathBuf,
    step: usize,
}

impl Demo {
    fn title(&mut self, what: &str) {
        self.step += 1;
        println!();
        println!("== {}. {what}", self.step);
    }

    /// A path relative to the workspace root, as the printed commands use it.
    fn show(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// The manifest template for `package` at `version` on this machine: the file under
    /// examples/ itself when it fits as written, otherwise a copy under `scratch` with the
    /// version, OS and architecture filled in.
    fn template(&self, package: &Package, version: &str, scratch: &Path) -> Result<String, String> {
        let path = self.root.join(package.manifest);
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut adjusted = text.clone();
        for (field, want) in [
            ("version", version),
            ("os", std::env::consts::OS),
            ("arch", std::env::consts::ARCH),
        ] {
            adjusted = set_field(&adjusted, field, want).ok_or_else(|| {
                format!(
                    "{}: expected one `\"{field}\": \"...\"` line to fill in",
                    package.manifest
                )
            })?;
        }
        if adjusted == text {
            return Ok(package.manifest.to_string());
        }
        let copy = scratch.join(format!("{}-{version}.json", package.id));
        fs::write(&copy, adjusted).map_err(|e| format!("cannot write {}: {e}", copy.display()))?;
        println!(
            "   ({} with version {version} for {}-{}: {})",
            package.manifest,
            std::env::consts::OS,
            std::env::consts::ARCH,
            self.show(&copy)
        );
        Ok(self.show(&copy))
    }

    /// Runs `guild args...`, prints the command and its output, and checks the exit code and
    /// that the output names every fact in `facts`.
    fn guild(&self, args: &[&str], code: i32, facts: &[&str]) -> Result<String, String> {
        let shown = format!("guild {}", args.join(" "));
        self.command(&self.guild, &shown, args, code, facts)
    }

    /// Starts `runner --serve` on `store` for `op` in the background; its lines are shown as
    /// they are awaited.
    fn serve(&self, store: &str, op: &str) -> Result<Serving, String> {
        self.serve_with(
            &self.runner,
            &["--serve", "--interval-ms", "100", store, op],
        )
    }

    /// Starts the C++ engine serving `store` in the background.
    fn serve_engine(&self, store: &str) -> Result<Serving, String> {
        self.serve_with(&self.engine, &["--serve", "--interval-ms", "100", store])
    }

    fn serve_with(&self, program: &Path, args: &[&str]) -> Result<Serving, String> {
        println!("   $ {} {} &", self.show(program), args.join(" "));
        let mut child = Command::new(program)
            .current_dir(&self.root)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let (tx, lines) = channel();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Ok(Serving { child, lines })
    }

    fn run_runner(&self, store: &str, ops: &[&str], facts: &[&str]) -> Result<String, String> {
        let mut args = vec![store];
        args.extend_from_slice(ops);
        let shown = format!("{} {}", self.show(&self.runner), args.join(" "));
        self.command(&self.runner, &shown, &args, OK, facts)
    }

    fn command(
        &self,
        program: &Path,
        shown: &str,
        args: &[&str],
        code: i32,
        facts: &[&str],
    ) -> Result<String, String> {
        println!("   $ {shown}");
        let out = Command::new(program)
            .current_dir(&self.root)
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for line in text.lines() {
            if line.is_empty() {
                println!();
            } else {
                println!("     {line}");
            }
        }
        let got = out.status.code();
        if got != Some(code) {
            return Err(format!(
                "`{shown}` exited with {}, expected {code}{}",
                got.map_or_else(|| out.status.to_string(), |c| c.to_string()),
                if code == OK {
                    ""
                } else {
                    ": a refusal that does not happen is a failure"
                }
            ));
        }
        if let Some(missing) = facts.iter().find(|f| !text.contains(**f)) {
            return Err(format!("`{shown}` did not say {missing:?}"));
        }
        if code != OK {
            println!("   refused, as it must be (exit {code})");
        }
        Ok(text)
    }

    /// Checks the store's packages and current versions with `guild --json list`, which is
    /// not printed (the plain `list` before it shows the same).
    fn expect_listed(&self, store: &str, want: &[(&str, &str)]) -> Result<(), String> {
        let out = Command::new(&self.guild)
            .current_dir(&self.root)
            .args(["--store", store, "--json", "list"])
            .output()
            .map_err(|e| format!("cannot run guild: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("`guild --json list` failed with {}", out.status));
        }
        // xtask keeps no JSON dependency; the entries are flat enough to read by hand.
        let ids = json_values(&text, "id");
        let current = json_values(&text, "current");
        let got: Vec<(String, String)> = ids
            .into_iter()
            .zip(current)
            .map(|(id, v)| (id.unwrap_or_default(), v.unwrap_or_else(|| "-".into())))
            .collect();
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(id, v)| (id.to_string(), v.to_string()))
            .collect();
        let mut sorted = got.clone();
        sorted.sort();
        let mut expected = want.clone();
        expected.sort();
        if sorted != expected {
            return Err(format!(
                "the store holds {got:?} (id, current version), expected {want:?}"
            ));
        }
        Ok(())
    }
}

/// A runner serving in the background, stopped when dropped.
struct Serving {
    child: Child,
    lines: Receiver<String>,
}

impl Serving {
    /// Shows the runner's lines (its repeats folded) until one ends with `want`.
    fn wait_for(&self, want: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last: Option<String> = None;
        let mut repeats = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).map_err(|_| {
                format!("the serving runner did not print `... {want}` within 20 s")
            })?;
            if last.as_deref() == Some(line.as_str()) {
                repeats += 1;
            } else {
                if repeats > 0 {
                    println!("     (the same line {repeats} more time(s))");
                }
                println!("     {line}");
                repeats = 0;
                last = Some(line.clone());
            }
            if line.ends_with(want) {
                return Ok(());
            }
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds `guild` and the example runner with one cargo call and returns their paths, as cargo
/// reports them (so a custom target directory works too).
fn build_binaries(root: &Path) -> Result<(PathBuf, PathBuf), String> {
    let args = [
        "build",
        "--locked",
        "-p",
        "guild-cli",
        "--bin",
        "guild",
        "-p",
        "guild-example-runner",
        "--bin",
        "guild-example-runner",
    ];
    println!("   $ cargo {}", args.join(" "));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo build failed with {}", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let executable = |name: &str| -> Result<PathBuf, String> {
        let target = format!("\"name\":\"{name}\"");
        text.lines()
            .filter(|l| l.contains(&target))
            .find_map(|l| json_values(l, "executable").into_iter().next().flatten())
            .map(PathBuf::from)
            .ok_or_else(|| format!("cargo did not report the executable of {name}"))
    };
    Ok((executable("guild")?, executable("guild-example-runner")?))
}

/// The value of every `"key": ...` member in JSON text, in order: `Some` for a string (no
/// escapes expected), `None` for anything else (`null`, a number, an object).
fn json_values(json: &str, key: &str) -> Vec<Option<String>> {
    let pattern = format!("\"{key}\":");
    json.match_indices(&pattern)
        .map(|(at, _)| {
            let rest = json[at + pattern.len()..].trim_start();
            let value = rest.strip_prefix('"')?;
            Some(value[..value.find('"')?].to_string())
        })
        .collect()
}

/// Replaces the value of the one `"field": "..."` line in a manifest template, or `None` when
/// there is not exactly one such line.
fn set_field(text: &str, field: &str, value: &str) -> Option<String> {
    let key = format!("\"{field}\":");
    let mut hits = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if !trimmed.starts_with(&key) {
                return line.to_string();
            }
            hits += 1;
            let indent = &line[..line.len() - trimmed.len()];
            let comma = if trimmed.trim_end().ends_with(',') {
                ","
            } else {
                ""
            };
            format!("{indent}{key} \"{value}\"{comma}")
        })
        .collect();
    (hits == 1).then(|| lines.join("\n") + "\n")
}

/// Copies `from` to `to` with one bit flipped inside the first ELF library it holds, and
/// returns the byte offset.
fn tamper(from: &Path, to: &Path) -> Result<usize, String> {
    let mut bytes = fs::read(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    let elf = bytes
        .windows(4)
        .position(|w| w == b"\x7fELF")
        .ok_or_else(|| format!("{} holds no ELF library", from.display()))?;
    // The first byte after the 64-byte ELF header: the library stays well-formed enough to be
    // packed data, only its digest changes.
    let offset = elf + 64;
    let byte = bytes
        .get_mut(offset)
        .ok_or_else(|| format!("{} ends inside its library", from.display()))?;
    *byte ^= 0x01;
    fs::write(to, &bytes).map_err(|e| format!("cannot write {}: {e}", to.display()))?;
    Ok(offset)
}

/// Removes a directory tree, first making its directories writable again (the store seals
/// installed trees read-only).
fn remove_tree(dir: &Path) -> Result<(), String> {
    fn unseal(path: &Path) {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return;
        };
        if meta.is_dir() {
            let mut perms = meta.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perms.set_readonly(false);
            let _ = fs::set_permissions(path, perms);
            if let Ok(entries) = fs::read_dir(path) {
                for entry in entries.flatten() {
                    unseal(&entry.path());
                }
            }
        }
    }
    if !dir.exists() {
        return Ok(());
    }
    unseal(dir);
    fs::remove_dir_all(dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))
}

const LLAMA_OPS: Package = Package {
    id: "example.llama_ops",
    library: "libllama_ops.so",
    manifest: "examples/modules/llama_ops/manifest.json",
};

/// The G19 step: install the Llama operations module, write a tiny Llama with the `gguf`
/// package (and its numpy reference), decode it through the service with
/// examples/llama-decode, and check that the tokens and logits match the reference. Without
/// python3 and the gguf and numpy packages (`cargo xtask test` installs them) the step says so
/// and is skipped.
fn llama_decode(
    demo: &mut Demo,
    dir: &Path,
    store: &str,
    plugins: &Path,
    private_key: &str,
) -> Result<(), String> {
    demo.title("Decode a tiny Llama through the service with a signed operations module");
    let python = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !python.is_ok_and(|s| s.success()) {
        println!(
            "   skipped: python3 with the gguf and numpy packages is not installed (`cargo xtask \
             test` installs them)"
        );
        return Ok(());
    }
    let source = dir.join("src").join(LLAMA_OPS.id);
    let lib = source.join("lib");
    fs::create_dir_all(&lib).map_err(|e| format!("cannot create {}: {e}", lib.display()))?;
    let from = plugins.join(LLAMA_OPS.library);
    fs::copy(&from, lib.join(LLAMA_OPS.library))
        .map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    let template = demo.template(&LLAMA_OPS, "1.0.0", &dir.join("manifests"))?;
    let archive = demo.show(
        &dir.join("packages")
            .join("example.llama_ops-1.0.0.gkmodule"),
    );
    demo.guild(
        &[
            "pack",
            &demo.show(&source),
            "--manifest",
            &template,
            "--out",
            &archive,
            "--key",
            private_key,
        ],
        OK,
        &[LLAMA_OPS.id, "1.0.0"],
    )?;
    demo.guild(
        &["--store", store, "install", &archive],
        OK,
        &[LLAMA_OPS.id, "1.0.0"],
    )?;

    let model = dir.join("llama");
    let script = "examples/llama-decode/make_tiny_llama.py";
    println!("   $ python3 {script} {}", demo.show(&model));
    let out = Command::new("python3")
        .current_dir(&demo.root)
        .arg(script)
        .arg(&model)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    print!("     {}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        return Err(format!(
            "{script} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }

    let args = [
        "build",
        "--locked",
        "-p",
        "guild-llama-decode",
        "--bin",
        "guild-llama-decode",
    ];
    println!("   $ cargo {}", args.join(" "));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .current_dir(&demo.root)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !built.status.success() {
        return Err(format!("cargo build failed with {}", built.status));
    }
    let text = String::from_utf8_lossy(&built.stdout);
    let decoder = text
        .lines()
        .filter(|l| l.contains("\"name\":\"guild-llama-decode\""))
        .find_map(|l| json_values(l, "executable").into_iter().next().flatten())
        .map(PathBuf::from)
        .ok_or("cargo did not report the executable of guild-llama-decode")?;
    let (gguf, reference) = (
        demo.show(&model.join("tiny-llama.gguf")),
        demo.show(&model.join("tiny-llama.reference.json")),
    );
    let args = [store, gguf.as_str(), "--reference", reference.as_str()];
    let shown = format!("{} {}", demo.show(&decoder), args.join(" "));
    demo.command(
        &decoder,
        &shown,
        &args,
        OK,
        &["tokens: ", "reference: tokens match"],
    )?;

    // The same model with its weight matrices stored as q8_0: the runner passes them as
    // stored, and the service resolves the module's q8_0 matvec and embedding for them.
    let quantized = dir.join("llama-q8_0");
    println!(
        "   $ python3 {script} --dtype q8_0 {}",
        demo.show(&quantized)
    );
    let out = Command::new("python3")
        .current_dir(&demo.root)
        .arg(script)
        .args(["--dtype", "q8_0"])
        .arg(&quantized)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    print!("     {}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        return Err(format!(
            "{script} --dtype q8_0 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (gguf, reference) = (
        demo.show(&quantized.join("tiny-llama.gguf")),
        demo.show(&quantized.join("tiny-llama.reference.json")),
    );
    let args = [store, gguf.as_str(), "--reference", reference.as_str()];
    let shown = format!("{} {}", demo.show(&decoder), args.join(" "));
    demo.command(
        &decoder,
        &shown,
        &args,
        OK,
        &["weight matrices q8_0", "reference: tokens match"],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_fields_are_replaced_once_keeping_layout() {
        let text = "{\n  \"version\": \"1.0.0\",\n  \"kernel_abi\": { \"min\": \"1.0.0\" },\n  \"os\": \"linux\"\n}\n";
        assert_eq!(
            set_field(text, "version", "1.1.0").unwrap(),
            "{\n  \"version\": \"1.1.0\",\n  \"kernel_abi\": { \"min\": \"1.0.0\" },\n  \"os\": \"linux\"\n}\n"
        );
        assert_eq!(
            set_field(text, "os", "macos").unwrap(),
            "{\n  \"version\": \"1.0.0\",\n  \"kernel_abi\": { \"min\": \"1.0.0\" },\n  \"os\": \"macos\"\n}\n"
        );
        assert_eq!(set_field(text, "arch", "x86_64"), None);
    }

    #[test]
    fn json_values_are_read_in_order() {
        let compact =
            r#"{"packages":[{"id":"a.b","current":"1.0.0"},{"id":"c.d","current":null}]}"#;
        let pretty = "{\n  \"id\": \"a.b\",\n  \"current\": \"1.0.0\",\n  \"n\": 3\n}";
        let some = |s: &str| Some(s.to_string());
        assert_eq!(json_values(compact, "id"), [some("a.b"), some("c.d")]);
        assert_eq!(json_values(compact, "current"), [some("1.0.0"), None]);
        assert_eq!(json_values(pretty, "current"), [some("1.0.0")]);
        assert_eq!(json_values(pretty, "n"), [None]);
    }

    #[test]
    fn tampering_flips_one_bit_inside_the_library() {
        let dir = std::env::temp_dir().join(format!("guild-demo-tamper-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut archive = vec![0u8; 512];
        archive.extend_from_slice(b"\x7fELF");
        archive.extend(std::iter::repeat_n(7u8, 100));
        fs::write(dir.join("a"), &archive).unwrap();
        let offset = tamper(&dir.join("a"), &dir.join("b")).unwrap();
        assert_eq!(offset, 512 + 64);
        let changed = fs::read(dir.join("b")).unwrap();
        let diff: Vec<usize> = (0..archive.len())
            .filter(|&i| archive[i] != changed[i])
            .collect();
        assert_eq!(diff, [offset]);
        assert_eq!(changed[offset], 6);
        fs::remove_dir_all(&dir).unwrap();
    }
}
