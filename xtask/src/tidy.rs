//! `cargo xtask tidy`: the dependency direction of the hexagon as a test, plus source hygiene.
//!
//! The rules (see ARCHITECTURE.md):
//! - `guild-domain` depends only on an allowlist of pure crates, and its sources never name IO,
//!   threads, processes or `unsafe`.
//! - `guild-ports` depends only on the domain and the ABI mirror (and small helpers): the
//!   provider interface that loaders hand the app speaks the Kernel ABI's `#[repr(C)]` structs,
//!   so that an execute crosses it without a conversion.
//! - `guild-abi` depends on nothing.
//! - Adapters never depend on one another, and only the application crates (`guild-host`, the
//!   composition; `guild-runtime`, the plugin runtime, and `guild-packages`, the package
//!   service, which it composes; `guild-conformance`, the publisher's check, which stands on
//!   `guild-host`) depend on adapters.
//! - The plugin runtime depends on no other application crate, and never on the crypto or OCI
//!   adapters: it runs what the package service decided to load and never authenticates or
//!   fetches anything itself.
//! - The package service depends on no other application crate, and never on the CUDA adapter:
//!   it decides what may be loaded and never loads or runs plugin code itself. The two meet only
//!   in `guild-host`.
//! - Nothing inside the hexagon depends on `guild-host`; the publisher's check
//!   (`guild-conformance`) and the command line (`guild-cli`) stand on top of it, and nothing
//!   under `guild-host` reaches the check but its own tests. The command line reaches the
//!   adapters through `guild-host`'s re-exports. The CLI's own crates (clap, clap_complete,
//!   anyhow) belong to `guild-cli` alone, so that the library a runner embeds carries none of
//!   them.
//! - The crates that touch the outside world are confined to the adapter that owns that world:
//!   libloading to the POSIX adapter, cudarc to the CUDA adapter, tar to the file-system adapter,
//!   p256 and ring to the crypto adapter.
//! - The example crates under `examples/` stand where a runner stands, outside the hexagon: they
//!   may embed `guild-host` (and use the domain's plain types), like any runner, but never an
//!   adapter, and nothing depends on them.
//! - The shared test fixtures (`guild-test-support`) stand where the composition stands: they
//!   build packages, open stores and run the `guild` binary, so they may depend on `guild-host`
//!   and the adapters. Nothing depends on them except as a dev-dependency, so that no library or
//!   binary ever carries them.
//!
//! Manifests are read with a tiny line parser (xtask keeps no dependencies); it understands the
//! table headers and `name = ...` / `name.workspace = true` keys that this workspace uses.

use std::fmt;
use std::path::Path;

use crate::modules;
use crate::util::root;

/// A dependency table kind, as in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DepKind {
    Normal,
    Dev,
    Build,
}

/// One crate's manifest, reduced to what the rules need.
#[derive(Debug, Clone)]
pub struct CrateDeps {
    pub package: String,
    /// Where it was read from, for messages.
    pub manifest: String,
    pub deps: Vec<(DepKind, String)>,
    /// The keys of its `[package]` table (`version` for `version.workspace = true` too).
    pub package_keys: Vec<String>,
    /// Whether it says `publish = false`.
    pub unpublished: bool,
}

/// A broken rule, naming the crate, the dependency and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub package: String,
    pub dependency: String,
    pub rule: &'static str,
    pub manifest: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}: {} ({})",
            self.package, self.dependency, self.rule, self.manifest
        )
    }
}

const ADAPTERS: &[&str] = &[
    "guild-adapters-posix",
    "guild-adapters-fs",
    "guild-adapters-crypto",
    "guild-adapters-cuda",
    "guild-adapters-oci",
];

/// The application layer: the crates that compose ports and adapters. `guild-host` composes the
/// others and is the one a runner names.
const APP: &[&str] = &[
    "guild-host",
    "guild-runtime",
    "guild-packages",
    "guild-conformance",
];

/// What the plugin runtime must never depend on: the composition above it, the package service,
/// and the adapters of trust and distribution (the package service's business).
const RUNTIME_FORBIDDEN: &[&str] = &[
    "guild-host",
    "guild-packages",
    "guild-adapters-crypto",
    "guild-adapters-oci",
];

/// What the package service must never depend on: the composition above it, the plugin runtime,
/// and the devices plugin code runs on.
const PACKAGES_FORBIDDEN: &[&str] = &["guild-host", "guild-runtime", "guild-adapters-cuda"];

/// What `guild-domain` may use. thiserror is a derive macro that generates `Display` and `Error`
/// impls and nothing else, so it keeps the domain pure.
const DOMAIN_ALLOWED: &[&str] = &["serde", "serde_json", "semver", "sha2", "thiserror"];
const DOMAIN_DEV_ALLOWED: &[&str] = &["proptest", "criterion"];
/// What `guild-ports` may use. `guild-abi` is layouts, constants and the shared C text helpers,
/// with no dependency of its own: the provider interface passes its structs through unchanged.
const PORTS_ALLOWED: &[&str] = &["guild-domain", "guild-abi", "thiserror", "mockall"];

/// Crates that reach the outside world, each confined to the one adapter that owns it.
const CONFINED: &[(&str, &str)] = &[
    ("libloading", "guild-adapters-posix"),
    ("cudarc", "guild-adapters-cuda"),
    ("tar", "guild-adapters-fs"),
    ("notify", "guild-adapters-fs"),
    ("p256", "guild-adapters-crypto"),
    ("ring", "guild-adapters-crypto"),
    ("reqwest", "guild-adapters-oci"),
    ("tokio", "guild-adapters-oci"),
];

/// The fixtures the integration tests share: a dev-only helper that may stand on the composition
/// and the adapters, and that nothing may depend on but as a dev-dependency.
const TEST_SUPPORT: &str = "guild-test-support";

/// The command line's crates: argument parsing, completions and error chains. Only `guild-cli`,
/// xtask and the examples (applications that embed the host) may name them.
const CLI_ONLY: &[&str] = &["clap", "clap_complete", "anyhow"];

/// Checks the dependency rules over a set of crates.
pub fn check_deps(crates: &[CrateDeps]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut flag = |c: &CrateDeps, dep: &str, rule: &'static str| {
        out.push(Violation {
            package: c.package.clone(),
            dependency: dep.to_owned(),
            rule,
            manifest: c.manifest.clone(),
        })
    };
    let examples: Vec<&str> = crates
        .iter()
        .filter(|c| is_example(&c.manifest))
        .map(|c| c.package.as_str())
        .collect();
    for c in crates {
        let is_adapter = ADAPTERS.contains(&c.package.as_str());
        let is_test_support = c.package == TEST_SUPPORT;
        for (kind, dep) in &c.deps {
            let dep = dep.as_str();
            // A dev-dependency on the crate itself turns on its test-only features (the CUDA
            // adapter's `testing`); it is no edge.
            if dep == c.package {
                continue;
            }
            match c.package.as_str() {
                "guild-domain" => {
                    let allowed = DOMAIN_ALLOWED.contains(&dep)
                        || (*kind == DepKind::Dev && DOMAIN_DEV_ALLOWED.contains(&dep));
                    if !allowed {
                        flag(c, dep, "the domain may depend only on its pure allowlist");
                    }
                }
                "guild-ports" if *kind != DepKind::Dev && !PORTS_ALLOWED.contains(&dep) => {
                    flag(
                        c,
                        dep,
                        "ports may depend only on the domain and the ABI mirror",
                    );
                }
                "guild-abi" if *kind != DepKind::Dev => {
                    flag(c, dep, "the ABI mirror depends on nothing");
                }
                _ => {}
            }
            if ADAPTERS.contains(&dep) {
                if is_adapter {
                    flag(c, dep, "adapters never depend on one another");
                } else if !APP.contains(&c.package.as_str())
                    && c.package != "xtask"
                    && !is_test_support
                {
                    flag(
                        c,
                        dep,
                        "only the application crates (guild-host, guild-runtime, guild-packages, guild-conformance) may depend on an adapter",
                    );
                }
            }
            if c.package == "guild-runtime"
                && *kind != DepKind::Dev
                && RUNTIME_FORBIDDEN.contains(&dep)
            {
                flag(
                    c,
                    dep,
                    "the plugin runtime never depends on the composition, trust or distribution",
                );
            }
            if c.package == "guild-packages"
                && *kind != DepKind::Dev
                && PACKAGES_FORBIDDEN.contains(&dep)
            {
                flag(
                    c,
                    dep,
                    "the package service never depends on the composition, the runtime or devices",
                );
            }
            // Examples are applications outside the hexagon: a runner parses its own arguments.
            if CLI_ONLY.contains(&dep)
                && c.package != "guild-cli"
                && c.package != "xtask"
                && !is_example(&c.manifest)
            {
                flag(c, dep, "the command line's crates belong to guild-cli");
            }
            // The C embedding API stands on the composition root as the command line does.
            if dep == "guild-host"
                && c.package != "xtask"
                && c.package != "guild-cli"
                && c.package != "guild-host-capi"
                && c.package != "guild-conformance"
                && !is_test_support
                && !is_example(&c.manifest)
            {
                flag(
                    c,
                    dep,
                    "nothing inside the hexagon depends on the composition root",
                );
            }
            if examples.contains(&dep) {
                flag(c, dep, "nothing depends on an example crate");
            }
            if dep == TEST_SUPPORT && *kind != DepKind::Dev {
                flag(c, dep, "the test fixtures are a dev-dependency only");
            }
            if let Some((_, owner)) = CONFINED.iter().find(|(name, _)| *name == dep) {
                if c.package != *owner {
                    flag(
                        c,
                        dep,
                        "this crate reaches the outside world and belongs to one adapter",
                    );
                }
            }
        }
    }
    out
}

/// The crates a user installs or depends on: the library runners name and the command line.
const PUBLISHED_ROOTS: &[&str] = &["guild-host", "guild-cli", "guild-host-capi"];

/// What crates.io shows and needs of every published crate (the repository waits for the
/// project's public address).
const PUBLISHED_KEYS: &[&str] = &["version", "description", "license", "readme", "keywords"];

/// Every workspace crate that a published crate depends on (normally or to build it), and the
/// published crates themselves, can be published with them: not `publish = false`, the
/// workspace's version, and the metadata crates.io shows. The test fixtures, the examples and
/// xtask stay unpublished.
pub fn check_publishable(crates: &[CrateDeps]) -> Vec<String> {
    let by_name = |name: &str| crates.iter().find(|c| c.package == name);
    let mut reached: Vec<&CrateDeps> = Vec::new();
    let mut queue: Vec<&str> = PUBLISHED_ROOTS.to_vec();
    while let Some(name) = queue.pop() {
        let Some(c) = by_name(name) else { continue };
        if reached.iter().any(|r| r.package == c.package) {
            continue;
        }
        reached.push(c);
        for (kind, dep) in &c.deps {
            if *kind != DepKind::Dev && by_name(dep).is_some() {
                queue.push(dep);
            }
        }
    }
    let mut problems = Vec::new();
    for c in &reached {
        if c.unpublished {
            problems.push(format!(
                "{} is published with guild-host and guild-cli but says publish = false ({})",
                c.package, c.manifest
            ));
        }
        for key in PUBLISHED_KEYS {
            if !c.package_keys.iter().any(|k| k == key) {
                problems.push(format!(
                    "{} is published but its [package] has no {key} ({})",
                    c.package, c.manifest
                ));
            }
        }
    }
    for c in crates {
        let stays_home =
            c.package == TEST_SUPPORT || c.package == "xtask" || is_example(&c.manifest);
        if stays_home && !c.unpublished {
            problems.push(format!(
                "{} is never published but lacks publish = false ({})",
                c.package, c.manifest
            ));
        }
    }
    problems
}

/// Whether the manifest at this path is one of the example crates (`examples/<name>/Cargo.toml`).
fn is_example(manifest: &str) -> bool {
    let parts: Vec<&str> = manifest.split(['/', '\\']).collect();
    parts.len() >= 3
        && parts[parts.len() - 3] == "examples"
        && parts[parts.len() - 1] == "Cargo.toml"
}

/// Words that must not appear in the domain's sources: IO, threads, processes, locks and
/// atomics (under whichever of `std`, `core` or `alloc` names them), and unsafe code.
const DOMAIN_FORBIDDEN_WORDS: &[&str] = &[
    "std::fs",
    "std::net",
    "std::thread",
    "std::process",
    "std::env",
    "std::io",
    "std::sync",
    "core::sync",
    "alloc::sync",
    "unsafe",
];

/// The one item of `std::sync` the domain may name, written out in full: `Arc`, shared ownership
/// of immutable records, which synchronises nothing the domain does.
const DOMAIN_ALLOWED_PATHS: &[&str] = &["std::sync::Arc"];

/// Checks the domain's sources for forbidden words; returns one message per hit.
pub fn check_domain_sources(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        for (n, line) in text.lines().enumerate() {
            let mut code = line.split("//").next().unwrap_or("").to_owned();
            for allowed in DOMAIN_ALLOWED_PATHS {
                code = blank_word(&code, allowed);
            }
            for word in DOMAIN_FORBIDDEN_WORDS {
                if contains_word(&code, word) {
                    out.push(format!(
                        "{path}:{}: the domain must not use `{word}`",
                        n + 1
                    ));
                }
            }
        }
    }
    out
}

/// `code` with every whole-word occurrence of `path` (as [`contains_word`] finds them) blanked.
fn blank_word(code: &str, path: &str) -> String {
    let mut out = code.to_owned();
    for (at, _) in code.match_indices(path) {
        let before = code[..at].chars().next_back();
        let after = code[at + path.len()..].chars().next();
        if !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char) {
            out.replace_range(at..at + path.len(), &" ".repeat(path.len()));
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `word` occurs in `code` with no identifier character on either side, so that
/// `#![forbid(unsafe_code)]` is not mistaken for `unsafe`.
fn contains_word(code: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// Reads `[dependencies]`-style tables from a manifest.
pub fn parse_manifest(manifest: &str, text: &str) -> Result<CrateDeps, String> {
    let mut package = None;
    let mut section = String::new();
    let mut deps = Vec::new();
    let mut package_keys = Vec::new();
    let mut unpublished = false;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_owned();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if section == "package" {
            let field = key.split('.').next().unwrap_or(key).trim();
            package_keys.push(field.to_owned());
            if key == "name" {
                package = Some(value.trim().trim_matches('"').to_owned());
            }
            if key == "publish" && value.trim() == "false" {
                unpublished = true;
            }
            continue;
        }
        let kind = if section == "dependencies" || section.ends_with(".dependencies") {
            DepKind::Normal
        } else if section == "dev-dependencies" || section.ends_with(".dev-dependencies") {
            DepKind::Dev
        } else if section == "build-dependencies" || section.ends_with(".build-dependencies") {
            DepKind::Build
        } else {
            continue;
        };
        let name = key
            .split('.')
            .next()
            .unwrap_or(key)
            .trim()
            .trim_matches('"');
        // A renamed dependency names its real package in `package = "..."`.
        let real = value
            .split("package")
            .nth(1)
            .and_then(|rest| rest.split('"').nth(1))
            .unwrap_or(name);
        deps.push((kind, real.to_owned()));
    }
    let package = package.ok_or_else(|| format!("{manifest}: no [package] name"))?;
    Ok(CrateDeps {
        package,
        manifest: manifest.to_owned(),
        deps,
        package_keys,
        unpublished,
    })
}

/// Reads every member manifest under `root` (crates/*, examples/* and xtask).
pub fn read_workspace(root: &Path) -> Result<Vec<CrateDeps>, String> {
    let mut manifests = Vec::new();
    for dir in ["crates", "examples"] {
        let parent = root.join(dir);
        if dir == "examples" && !parent.exists() {
            continue;
        }
        let entries =
            std::fs::read_dir(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path().join("Cargo.toml");
            if path.exists() {
                manifests.push(path);
            }
        }
    }
    manifests.push(root.join("xtask/Cargo.toml"));
    manifests.sort();
    manifests
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            parse_manifest(&p.display().to_string(), &text)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<(String, String)>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            out.push((path.display().to_string(), text));
        }
    }
    Ok(())
}

/// The `src/` directory of every crate in the workspace (crates, xtask, examples).
fn crate_sources(root: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let mut out: Vec<std::path::PathBuf> = [root.join("xtask/src")]
        .into_iter()
        .filter(|p| p.is_dir())
        .collect();
    for group in ["crates", "examples"] {
        let dir = root.join(group);
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let src = entry.map_err(|e| e.to_string())?.path().join("src");
            if src.is_dir() {
                out.push(src);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Runs every tidy rule over the workspace at `root`.
pub fn check_workspace(root: &Path) -> Result<(), String> {
    let crates = read_workspace(root)?;
    let mut problems: Vec<String> = check_deps(&crates).iter().map(|v| v.to_string()).collect();
    problems.extend(check_publishable(&crates));
    let mut files = Vec::new();
    rust_files(&root.join("crates/domain/src"), &mut files)?;
    problems.extend(check_domain_sources(&files));
    let mut module_files = 0;
    for src in crate_sources(root)? {
        let mut sources = Vec::new();
        rust_files(&src, &mut sources)?;
        let prefix = format!("{}/", src.display());
        let relative: Vec<(String, String)> = sources
            .into_iter()
            .map(|(path, text)| (path.strip_prefix(&prefix).unwrap_or(&path).to_owned(), text))
            .collect();
        module_files += relative.len();
        let shown = src.strip_prefix(root).unwrap_or(&src);
        problems.extend(modules::check_crate(shown, &relative));
    }
    if problems.is_empty() {
        let edges: usize = crates.iter().map(|c| c.deps.len()).sum();
        eprintln!(
            "tidy: {} crates, {edges} dependency edges, {} domain files, {module_files} files \
             with no module circle: ok",
            crates.len(),
            files.len(),
        );
        Ok(())
    } else {
        Err(format!(
            "{} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        ))
    }
}

/// Crates whose whole normal dependency tree (direct and indirect, as `cargo tree` resolves it)
/// must not reach these packages: the pure core never reaches native code, archives, crypto or
/// the command line, and the embeddable library never reaches the command line's crates, the
/// publisher's conformance check nor the test fixtures (its tests use both, as dev-dependencies).
const TRANSITIVE_FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "guild-domain",
        &[
            "libloading",
            "cudarc",
            "tar",
            "p256",
            "ring",
            "clap",
            "anyhow",
            "libc",
            "arc-swap",
            "crossbeam",
        ],
    ),
    (
        "guild-ports",
        &[
            "libloading",
            "cudarc",
            "tar",
            "p256",
            "ring",
            "clap",
            "anyhow",
            "libc",
        ],
    ),
    // The plugin runtime runs what the package service loaded: no signature checks, no
    // registry client, no command line.
    (
        "guild-runtime",
        &["p256", "ring", "tokio", "reqwest", "clap", "anyhow"],
    ),
    // The package service decides what may load and never loads it: no runtime, no CUDA, no
    // command line, and (with its default features) no registry client. (It does reach the
    // POSIX adapter, for the signal notes in the crash ledger's records.)
    (
        "guild-packages",
        &[
            "guild-runtime",
            "cudarc",
            "tokio",
            "reqwest",
            "clap",
            "anyhow",
        ],
    ),
    // With its default features: the registry client (feature `oci`) and its async runtime
    // are opt-in.
    (
        "guild-host",
        &[
            "guild-conformance",
            "guild-test-support",
            "clap",
            "clap_complete",
            "anyhow",
            "tokio",
            "reqwest",
        ],
    ),
];

/// The packages in `tree` (the `{p}` lines `cargo tree --prefix none` prints) that `forbidden`
/// names, each once.
pub fn forbidden_in_tree(tree: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found: Vec<String> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| forbidden.contains(name))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Checks [`TRANSITIVE_FORBIDDEN`] with `cargo tree`, so that an edge through a third crate is
/// seen as well as a direct one. `--locked` without `--offline`: on a fresh machine tidy runs
/// before anything has built, so the crates whose manifests `cargo tree` reads may not have been
/// downloaded yet.
pub fn check_transitive(root: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut problems = Vec::new();
    for (krate, forbidden) in TRANSITIVE_FORBIDDEN {
        let output = std::process::Command::new(&cargo)
            .current_dir(root)
            .args([
                "tree", "--locked", "-e", "normal", "--prefix", "none", "-p", krate, "--format",
                "{p}",
            ])
            .output()
            .map_err(|e| format!("cannot run cargo tree: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "cargo tree -p {krate} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let tree = String::from_utf8_lossy(&output.stdout);
        for name in forbidden_in_tree(&tree, forbidden) {
            problems.push(format!(
                "{krate} reaches {name} through its dependencies (see `cargo tree -p {krate} -e \
                 normal -i {name}`)"
            ));
        }
    }
    if problems.is_empty() {
        eprintln!(
            "tidy: the dependency trees of {} crates reach nothing they must not",
            TRANSITIVE_FORBIDDEN.len()
        );
        Ok(())
    } else {
        Err(format!(
            "{} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        ))
    }
}

pub fn run() -> Result<(), String> {
    check_workspace(&root())?;
    check_transitive(&root())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(package: &str, deps: &[(DepKind, &str)]) -> CrateDeps {
        CrateDeps {
            package: package.into(),
            manifest: format!("{package}/Cargo.toml"),
            deps: deps.iter().map(|(k, d)| (*k, d.to_string())).collect(),
            package_keys: Vec::new(),
            unpublished: false,
        }
    }

    #[test]
    fn what_the_published_crates_stand_on_is_publishable_with_its_metadata() {
        let manifest = |name: &str, extra: &str, deps: &str| {
            format!(
                "[package]\nname = \"{name}\"\nversion.workspace = true\ndescription = \"d\"\n\
                 license.workspace = true\n{extra}\n[dependencies]\n{deps}\n"
            )
        };
        let parse = |path: &str, text: String| parse_manifest(path, &text).unwrap();
        let host = parse(
            "crates/app/Cargo.toml",
            manifest(
                "guild-host",
                "readme.workspace = true\nkeywords = [\"x\"]",
                "guild-domain.workspace = true",
            ),
        );
        let domain_ok = parse(
            "crates/domain/Cargo.toml",
            manifest(
                "guild-domain",
                "readme.workspace = true\nkeywords = [\"x\"]",
                "",
            ),
        );
        let fixtures = parse(
            "crates/test-support/Cargo.toml",
            manifest("guild-test-support", "publish = false", ""),
        );
        assert_eq!(
            check_publishable(&[host.clone(), domain_ok, fixtures.clone()]),
            Vec::<String>::new()
        );

        // A dependency of guild-host kept unpublished, and one without keywords or readme.
        let domain_hidden = parse(
            "crates/domain/Cargo.toml",
            manifest(
                "guild-domain",
                "publish = false\nreadme.workspace = true\nkeywords = []",
                "",
            ),
        );
        let problems = check_publishable(&[host.clone(), domain_hidden, fixtures.clone()]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("guild-domain") && problems[0].contains("publish = false"));
        let domain_bare = parse("crates/domain/Cargo.toml", manifest("guild-domain", "", ""));
        let problems = check_publishable(&[host, domain_bare, fixtures]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("no readme")));
        assert!(problems.iter().any(|p| p.contains("no keywords")));

        // The fixtures must say they stay home.
        let fixtures_open = parse(
            "crates/test-support/Cargo.toml",
            manifest("guild-test-support", "", ""),
        );
        let problems = check_publishable(&[fixtures_open]);
        assert!(
            problems[0].contains("lacks publish = false"),
            "{problems:?}"
        );
    }

    fn rules(c: CrateDeps) -> Vec<&'static str> {
        check_deps(&[c]).into_iter().map(|v| v.rule).collect()
    }

    #[test]
    fn this_workspace_is_tidy() {
        check_workspace(&root()).unwrap();
    }

    #[test]
    fn forbidden_packages_are_found_anywhere_in_a_tree() {
        let tree = "guild-host v0.1.0 (/w/crates/app)\nguild-domain v0.0.0 (/w/crates/domain)\n\
                    semver v1.0.0\nclap v4.5.0\nclap_builder v4.5.0\nclap v4.5.0\n";
        assert_eq!(
            forbidden_in_tree(tree, &["clap", "anyhow"]),
            vec!["clap".to_string()],
            "an indirect clap is found once; clap_builder is not clap"
        );
        assert!(forbidden_in_tree(tree, &["anyhow"]).is_empty());
    }

    #[test]
    fn each_forbidden_edge_is_named() {
        use DepKind::*;
        let cases: &[(&str, DepKind, &str, &str)] = &[
            (
                "guild-domain",
                Normal,
                "libloading",
                "the domain may depend only on its pure allowlist",
            ),
            (
                "guild-domain",
                Normal,
                "tar",
                "the domain may depend only on its pure allowlist",
            ),
            (
                "guild-domain",
                Normal,
                "guild-adapters-fs",
                "the domain may depend only on its pure allowlist",
            ),
            (
                "guild-domain",
                Dev,
                "tempfile",
                "the domain may depend only on its pure allowlist",
            ),
            (
                "guild-ports",
                Normal,
                "tokio",
                "ports may depend only on the domain and the ABI mirror",
            ),
            (
                "guild-abi",
                Normal,
                "libc",
                "the ABI mirror depends on nothing",
            ),
            (
                "guild-adapters-fs",
                Normal,
                "guild-adapters-crypto",
                "adapters never depend on one another",
            ),
            (
                "guild-adapters-fs",
                Dev,
                "guild-adapters-crypto",
                "adapters never depend on one another",
            ),
            (
                "guild-ports",
                Dev,
                "guild-adapters-posix",
                "only the application crates (guild-host, guild-runtime, guild-packages, guild-conformance) may depend on an adapter",
            ),
            (
                "guild-adapters-fs",
                Normal,
                "libloading",
                "this crate reaches the outside world and belongs to one adapter",
            ),
            (
                "guild-host",
                Normal,
                "cudarc",
                "this crate reaches the outside world and belongs to one adapter",
            ),
            (
                "guild-host",
                Normal,
                "clap",
                "the command line's crates belong to guild-cli",
            ),
            (
                "guild-host",
                Normal,
                "anyhow",
                "the command line's crates belong to guild-cli",
            ),
            (
                "guild-cli",
                Normal,
                "guild-adapters-crypto",
                "only the application crates (guild-host, guild-runtime, guild-packages, guild-conformance) may depend on an adapter",
            ),
            (
                "guild-ports",
                Normal,
                "guild-host",
                "nothing inside the hexagon depends on the composition root",
            ),
            (
                "guild-runtime",
                Normal,
                "guild-host",
                "the plugin runtime never depends on the composition, trust or distribution",
            ),
            (
                "guild-runtime",
                Normal,
                "guild-adapters-crypto",
                "the plugin runtime never depends on the composition, trust or distribution",
            ),
            (
                "guild-runtime",
                Normal,
                "guild-adapters-oci",
                "the plugin runtime never depends on the composition, trust or distribution",
            ),
            (
                "guild-runtime",
                Normal,
                "guild-packages",
                "the plugin runtime never depends on the composition, trust or distribution",
            ),
            (
                "guild-packages",
                Normal,
                "guild-runtime",
                "the package service never depends on the composition, the runtime or devices",
            ),
            (
                "guild-packages",
                Normal,
                "guild-adapters-cuda",
                "the package service never depends on the composition, the runtime or devices",
            ),
            (
                "guild-packages",
                Normal,
                "guild-host",
                "nothing inside the hexagon depends on the composition root",
            ),
        ];
        for (package, kind, dep, rule) in cases {
            let got = rules(krate(package, &[(*kind, dep)]));
            assert!(
                got.contains(rule),
                "{package} -> {dep}: expected {rule:?}, got {got:?}"
            );
        }
        // And the allowed shapes stay allowed.
        assert!(rules(krate(
            "guild-domain",
            &[(Normal, "sha2"), (Dev, "proptest")]
        ))
        .is_empty());
        assert!(rules(krate(
            "guild-adapters-posix",
            &[(Normal, "libloading"), (Normal, "guild-ports")]
        ))
        .is_empty());
        assert!(rules(krate("guild-host", &[(Normal, "guild-adapters-fs")])).is_empty());
        assert!(rules(krate(
            "guild-runtime",
            &[
                (Normal, "guild-adapters-posix"),
                (Normal, "guild-adapters-cuda")
            ]
        ))
        .is_empty());
        assert!(rules(krate("guild-host", &[(Normal, "guild-runtime")])).is_empty());
        // The C embedding API stands on the composition root, and on nothing below it.
        assert!(rules(krate("guild-host-capi", &[(Normal, "guild-host")])).is_empty());
        assert_eq!(
            rules(krate("guild-host-capi", &[(Normal, "guild-adapters-fs")])),
            ["only the application crates (guild-host, guild-runtime, guild-packages, guild-conformance) may depend on an adapter"]
        );
        assert!(rules(krate(
            "guild-cli",
            &[(Normal, "guild-host"), (Normal, "clap"), (Normal, "anyhow")]
        ))
        .is_empty());
        assert!(rules(krate(
            "guild-ports",
            &[(Normal, "guild-domain"), (Normal, "guild-abi")]
        ))
        .is_empty());
    }

    #[test]
    fn examples_embed_the_host_but_no_adapter_and_nothing_depends_on_them() {
        use DepKind::*;
        let example = |deps: &[(DepKind, &str)]| CrateDeps {
            manifest: "/w/examples/rust-runner/Cargo.toml".into(),
            ..krate("guild-example-runner", deps)
        };
        assert!(
            check_deps(&[example(&[(Normal, "guild-host"), (Normal, "guild-domain")])]).is_empty()
        );
        assert!(check_deps(&[example(&[(Normal, "guild-host"), (Normal, "clap")])]).is_empty());
        assert_eq!(
            rules(krate("guild-example-runner", &[(Normal, "clap")])),
            ["the command line's crates belong to guild-cli"]
        );
        let rules_of = |crates: &[CrateDeps]| -> Vec<&'static str> {
            check_deps(crates).into_iter().map(|v| v.rule).collect()
        };
        assert_eq!(
            rules_of(&[example(&[(Normal, "guild-adapters-posix")])]),
            ["only the application crates (guild-host, guild-runtime, guild-packages, guild-conformance) may depend on an adapter"]
        );
        assert_eq!(
            rules_of(&[example(&[(Normal, "libloading")])]),
            ["this crate reaches the outside world and belongs to one adapter"]
        );
        assert_eq!(
            rules_of(&[
                example(&[]),
                krate("guild-host", &[(Dev, "guild-example-runner")])
            ]),
            ["nothing depends on an example crate"]
        );
        // The exception follows the manifest's place, not the crate's name.
        assert_eq!(
            rules(krate("guild-example-runner", &[(Normal, "guild-host")])),
            ["nothing inside the hexagon depends on the composition root"]
        );
    }

    #[test]
    fn the_test_fixtures_are_a_dev_dependency_only_and_may_stand_on_the_composition() {
        use DepKind::*;
        let rule = "the test fixtures are a dev-dependency only";
        for (package, kind) in [
            ("guild-host", Normal),
            ("guild-cli", Normal),
            ("guild-domain", Build),
            ("guild-conformance", Normal),
        ] {
            assert!(
                rules(krate(package, &[(kind, "guild-test-support")])).contains(&rule),
                "{package} -> guild-test-support ({kind:?}) must be refused"
            );
        }
        // As a dev-dependency it is no edge the rules mind.
        assert!(rules(krate("guild-host", &[(Dev, "guild-test-support")])).is_empty());
        assert!(rules(krate("guild-cli", &[(Dev, "guild-test-support")])).is_empty());
        // The fixtures stand where the composition stands.
        assert!(rules(krate(
            "guild-test-support",
            &[
                (Normal, "guild-host"),
                (Normal, "guild-adapters-fs"),
                (Normal, "guild-adapters-crypto"),
                (Normal, "guild-domain"),
            ]
        ))
        .is_empty());
        // But they get no exception from the other rules: the outside world stays in its adapter.
        assert_eq!(
            rules(krate("guild-test-support", &[(Normal, "libloading")])),
            ["this crate reaches the outside world and belongs to one adapter"]
        );
    }

    #[test]
    fn domain_sources_may_not_do_io_or_unsafe() {
        let files = vec![(
            "lib.rs".to_string(),
            "#![forbid(unsafe_code)]\nuse std::fs::File;\n// std::fs in a comment is fine\nfn f() { unsafe { } }\n"
                .to_string(),
        )];
        let hits = check_domain_sources(&files);
        assert_eq!(hits.len(), 2, "{hits:?}");
        assert!(hits[0].starts_with("lib.rs:2:") && hits[0].contains("std::fs"));
        assert!(hits[1].starts_with("lib.rs:4:") && hits[1].contains("unsafe"));
    }

    #[test]
    fn domain_sources_may_name_arc_but_no_lock_or_atomic_under_any_crate() {
        let text = "use std::sync::Arc;\nuse std::sync::{Arc, Mutex};\nuse alloc::sync::Arc;\n\
                    use core::sync::atomic::AtomicU64;\nuse std::sync::ArcSwap;\n\
                    let a = std::sync::Arc::new(1);\n";
        let hits = check_domain_sources(&[("lib.rs".to_string(), text.to_string())]);
        let lines: Vec<&str> = hits
            .iter()
            .map(|h| h.split(": the").next().unwrap())
            .collect();
        assert_eq!(
            lines,
            ["lib.rs:2", "lib.rs:3", "lib.rs:4", "lib.rs:5"],
            "{hits:?}"
        );
    }

    #[test]
    fn manifest_parser_reads_workspace_and_renamed_deps() {
        let text = "[package]\nname = \"guild-x\"\n\n[dependencies]\nserde.workspace = true\n\
                    io = { package = \"tokio\", version = \"1\" }\n\n[dev-dependencies]\nproptest = \"1\"\n\
                    [target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n[features]\nmocks = []\n";
        let c = parse_manifest("x", text).unwrap();
        assert_eq!(c.package, "guild-x");
        assert_eq!(
            c.deps,
            vec![
                (DepKind::Normal, "serde".to_string()),
                (DepKind::Normal, "tokio".to_string()),
                (DepKind::Dev, "proptest".to_string()),
                (DepKind::Normal, "libc".to_string()),
            ]
        );
    }

    /// The end-to-end proof: a copy of this workspace's manifests with one forbidden edge added
    /// fails `check_workspace`, naming the edge.
    #[test]
    fn adding_a_forbidden_edge_to_a_copy_of_the_workspace_fails() {
        let src = root();
        let tmp = std::env::temp_dir().join(format!("guild-tidy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        for c in read_workspace(&src).unwrap() {
            let rel = Path::new(&c.manifest)
                .strip_prefix(&src)
                .unwrap()
                .to_path_buf();
            let dst = tmp.join(&rel);
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            std::fs::copy(&c.manifest, &dst).unwrap();
        }
        std::fs::create_dir_all(tmp.join("crates/domain/src")).unwrap();
        std::fs::write(tmp.join("crates/domain/src/lib.rs"), "//! clean\n").unwrap();
        check_workspace(&tmp).unwrap();

        let domain = tmp.join("crates/domain/Cargo.toml");
        let text = std::fs::read_to_string(&domain).unwrap();
        let text = text.replacen(
            "[dependencies]\n",
            "[dependencies]\nlibloading.workspace = true\n",
            1,
        );
        std::fs::write(&domain, text).unwrap();
        let err = check_workspace(&tmp).unwrap_err();
        assert!(err.contains("guild-domain -> libloading"), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
