//! The system tools `cargo xtask demo` and `cargo xtask test` need, checked before either does
//! anything else.
//!
//! [`TOOLS`] is the one table: how each tool is looked for, the Debian package that provides it
//! and why it is needed. When something is missing and the process runs as root on Debian (a CI
//! machine or a fresh container), [`require`] installs it with `apt-get` (and `pip` for the
//! Python packages), saying so in one line; otherwise it prints the exact commands to run and
//! stops. Deciding what to do ([`plan`]) is separate from looking ([`probe`]) and from doing
//! ([`install`]), so that the decision is unit-tested without touching the machine.

use std::path::Path;
use std::process::{Command, Stdio};

/// The task whose tools are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// `cargo xtask demo`: the SDK, the C plugins and the demo itself.
    Demo,
    /// `cargo xtask test`: everything the demo needs and what the tests use.
    Test,
}

impl Task {
    fn command(self) -> &'static str {
        match self {
            Task::Demo => "cargo xtask demo",
            Task::Test => "cargo xtask test",
        }
    }
}

/// How a tool is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Present when any of these command lines runs and succeeds.
    Runs(&'static [&'static [&'static str]]),
    /// `cmake --version` runs and reports at least this (major, minor).
    CmakeAtLeast(u32, u32),
}

/// Where a missing tool comes from on Debian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Debian packages, installed with `apt-get install`.
    Apt(&'static [&'static str]),
    /// Python packages from PyPI, installed with `python3 -m pip install`.
    Pip(&'static [&'static str]),
}

/// One row of [`TOOLS`].
#[derive(Debug)]
pub struct Tool {
    /// What the tool is called in messages.
    pub name: &'static str,
    pub probe: Probe,
    pub source: Source,
    /// Why it is needed, for the messages.
    pub why: &'static str,
    /// Which task needs it, and how much.
    pub used_by: UsedBy,
}

/// Which tasks need a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsedBy {
    /// Both tasks need it and stop without it.
    Both,
    /// Only `cargo xtask test` needs it.
    Tests,
    /// The tests need it; the demo uses it for one step. Root on Debian installs it for the demo
    /// too, so that a fresh machine sees every step; elsewhere the demo runs without it and that
    /// step says why it skipped.
    TestsAndOneDemoStep,
}

/// Every tool either task needs. The demo needs the rows used by both and, where it may install
/// them, the rows of its one optional step; the tests need every row. `.ci/run` installs nothing itself any more: this table is the list.
pub const TOOLS: &[Tool] = &[
    Tool {
        name: "cmake 3.20+",
        probe: Probe::CmakeAtLeast(3, 20),
        source: Source::Apt(&["cmake"]),
        why: "builds the SDK and the C plugins",
        used_by: UsedBy::Both,
    },
    Tool {
        name: "make (or ninja)",
        probe: Probe::Runs(&[&["ninja", "--version"], &["make", "--version"]]),
        source: Source::Apt(&["make"]),
        why: "CMake's build tool",
        used_by: UsedBy::Both,
    },
    Tool {
        name: "cc",
        probe: Probe::Runs(&[&["cc", "--version"]]),
        source: Source::Apt(&["gcc"]),
        why: "compiles the C plugins",
        used_by: UsedBy::Both,
    },
    Tool {
        name: "nm",
        probe: Probe::Runs(&[&["nm", "--version"]]),
        source: Source::Apt(&["binutils"]),
        why: "checks that each plugin exports only its entry point (and, with binutils' objdump, \
              that the AVX2 build keeps AVX in its kernels)",
        used_by: UsedBy::Both,
    },
    Tool {
        name: "c++",
        probe: Probe::Runs(&[&["c++", "--version"]]),
        source: Source::Apt(&["g++"]),
        why: "the header checks compile every header as C++17; builds the C++ example engine",
        used_by: UsedBy::Both,
    },
    Tool {
        name: "pkg-config",
        probe: Probe::Runs(&[&["pkg-config", "--version"]]),
        source: Source::Apt(&["pkg-config"]),
        why: "builds the C++ example engine from guild-host.pc",
        used_by: UsedBy::Both,
    },
    Tool {
        name: "x86_64-w64-mingw32-gcc",
        probe: Probe::Runs(&[&["x86_64-w64-mingw32-gcc", "--version"]]),
        source: Source::Apt(&["gcc-mingw-w64-x86-64"]),
        why: "the header checks cross-compile for Windows",
        used_by: UsedBy::Tests,
    },
    Tool {
        name: "x86_64-w64-mingw32-g++",
        probe: Probe::Runs(&[&["x86_64-w64-mingw32-g++", "--version"]]),
        source: Source::Apt(&["g++-mingw-w64-x86-64"]),
        why: "the header checks cross-compile for Windows",
        used_by: UsedBy::Tests,
    },
    Tool {
        name: "valgrind",
        probe: Probe::Runs(&[&["valgrind", "--version"]]),
        source: Source::Apt(&["valgrind"]),
        why: "runs the tests that cross the C boundary",
        used_by: UsedBy::Tests,
    },
    Tool {
        name: "openssl",
        probe: Probe::Runs(&[&["openssl", "version"]]),
        source: Source::Apt(&["openssl"]),
        why: "the key interoperability tests",
        used_by: UsedBy::Tests,
    },
    Tool {
        name: "docker-registry",
        probe: Probe::Runs(&[&["docker-registry", "--version"]]),
        source: Source::Apt(&["docker-registry"]),
        why: "the push, pull, lock and sync tests run against a real OCI registry",
        used_by: UsedBy::Tests,
    },
    Tool {
        name: "htpasswd",
        probe: Probe::Runs(&[&["htpasswd", "-nbB", "u", "p"]]),
        source: Source::Apt(&["apache2-utils"]),
        why: "writes the registry's bcrypt password file for the basic-auth tests",
        used_by: UsedBy::Tests,
    },
    Tool {
        name: "python3",
        probe: Probe::Runs(&[&["python3", "--version"]]),
        source: Source::Apt(&["python3"]),
        why: "runs the GGUF writer of the tests and of the demo's tiny Llama",
        used_by: UsedBy::TestsAndOneDemoStep,
    },
    Tool {
        name: "pip",
        probe: Probe::Runs(&[&["python3", "-m", "pip", "--version"]]),
        source: Source::Apt(&["python3-pip"]),
        why: "installs the gguf package",
        used_by: UsedBy::TestsAndOneDemoStep,
    },
    Tool {
        name: "the gguf and numpy Python packages",
        probe: Probe::Runs(&[&["python3", "-c", "import gguf, numpy"]]),
        source: Source::Pip(&["gguf", "numpy"]),
        why: "the GGUF reader's tests and the demo's tiny Llama write their models with it",
        used_by: UsedBy::TestsAndOneDemoStep,
    },
];

/// What looking for one tool found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Yes,
    No,
    /// Present, but older than needed; the string is the version found.
    TooOld(String),
}

/// The machine the tools would be installed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// `/etc/debian_version` exists (Debian and its derivatives, which have apt-get).
    pub debian: bool,
    /// The effective user is root.
    pub root: bool,
}

/// What to do about the task's tools.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Everything is there.
    Ready,
    /// Install these (root on Debian), announcing it with `line`, then look again.
    Install {
        apt: Vec<&'static str>,
        pip: Vec<&'static str>,
        line: String,
    },
    /// Stop with this message: what is missing and the exact commands to run.
    Stop(String),
}

/// Decides what to do for `task` on `machine`, given what `found` says about each tool.
pub fn plan(task: Task, machine: Machine, found: impl Fn(&Tool) -> Found) -> Plan {
    let may_install = machine.debian && machine.root;
    let mut missing = Vec::new();
    let mut too_old = Vec::new();
    for tool in needed(task) {
        match found(tool) {
            Found::Yes => {}
            Found::No => missing.push(tool),
            Found::TooOld(version) => too_old.push((tool, version)),
        }
    }
    // The demo's optional step: installed along with the rest where installing is allowed, and
    // otherwise left to the step, which says why it skipped.
    let optional: Vec<&Tool> = match task {
        Task::Demo => TOOLS
            .iter()
            .filter(|t| t.used_by == UsedBy::TestsAndOneDemoStep && found(t) != Found::Yes)
            .collect(),
        Task::Test => Vec::new(),
    };
    if too_old.is_empty() && may_install {
        missing.extend(optional);
    }
    if missing.is_empty() && too_old.is_empty() {
        return Plan::Ready;
    }
    let (apt, pip) = packages(&missing);
    if too_old.is_empty() && may_install {
        let line = format!(
            "{}: installing what it needs and this machine lacks (running as root on Debian): {}",
            task.command(),
            missing
                .iter()
                .map(|t| format!("{} ({})", source_text(t.source), t.why))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Plan::Install { apt, pip, line };
    }

    let mut message = "this machine lacks tools it needs:\n".to_string();
    for (tool, version) in &too_old {
        message.push_str(&format!(
            "  {} ({}): found {version}, which is too old; install a newer CMake, for example \
             with `python3 -m pip install --user cmake` or from https://cmake.org/download/\n",
            tool.name, tool.why
        ));
    }
    for tool in &missing {
        message.push_str(&format!("  {} ({})\n", tool.name, tool.why));
    }
    if !missing.is_empty() {
        let sudo = if machine.root { "" } else { "sudo " };
        let apt_line = format!("{sudo}apt-get install -y {}", apt.join(" "));
        // Debian's own python3 refuses pip installs outside a virtual environment unless told.
        let pip_line = format!(
            "PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install{} {}",
            if machine.root { "" } else { " --user" },
            pip.join(" ")
        );
        let mut commands = Vec::new();
        if !apt.is_empty() {
            commands.push(apt_line);
        }
        if !pip.is_empty() {
            commands.push(pip_line);
        }
        if machine.debian {
            message.push_str("install them with:\n");
        } else {
            message.push_str(
                "install them with your system's package manager; the Debian commands are:\n",
            );
        }
        for command in &commands {
            message.push_str(&format!("  {command}\n"));
        }
        message.push_str(&format!(
            "({} installs them itself when it runs as root on Debian)",
            task.command()
        ));
    }
    Plan::Stop(message.trim_end().to_string())
}

/// The Debian and Python packages that provide `tools`, each once, in table order.
fn packages(tools: &[&Tool]) -> (Vec<&'static str>, Vec<&'static str>) {
    let mut apt = Vec::new();
    let mut pip = Vec::new();
    for tool in tools {
        let (list, names) = match tool.source {
            Source::Apt(names) => (&mut apt, names),
            Source::Pip(names) => (&mut pip, names),
        };
        for name in names {
            if !list.contains(name) {
                list.push(*name);
            }
        }
    }
    (apt, pip)
}

fn source_text(source: Source) -> String {
    match source {
        Source::Apt(names) => names.join(" "),
        Source::Pip(names) => format!("{} with pip", names.join(" ")),
    }
}

/// Checks `task`'s tools, installs the missing ones when that is allowed (root on Debian), and
/// fails with the commands to run otherwise. Prints nothing when everything is there.
pub fn require(task: Task) -> Result<(), String> {
    match plan(task, this_machine(), probe) {
        Plan::Ready => Ok(()),
        Plan::Stop(message) => Err(message),
        Plan::Install { apt, pip, line } => {
            println!("{line}");
            install(&apt, &pip)?;
            let still: Vec<&str> = needed(task)
                .filter(|tool| probe(tool) != Found::Yes)
                .map(|tool| tool.name)
                .collect();
            if still.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "installed {} but still cannot find {}; is it on PATH?",
                    apt.iter()
                        .chain(&pip)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(" "),
                    still.join(", ")
                ))
            }
        }
    }
}

/// The tools `task` needs.
fn needed(task: Task) -> impl Iterator<Item = &'static Tool> {
    TOOLS
        .iter()
        .filter(move |tool| task == Task::Test || tool.used_by == UsedBy::Both)
}

fn this_machine() -> Machine {
    Machine {
        debian: Path::new("/etc/debian_version").exists(),
        root: is_root(),
    }
}

/// Whether the effective user is root, as `id -u` says (xtask keeps no libc dependency).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Looks for one tool on this machine.
pub fn probe(tool: &Tool) -> Found {
    match tool.probe {
        Probe::Runs(commands) => {
            if commands.iter().any(|argv| succeeds(argv)) {
                Found::Yes
            } else {
                Found::No
            }
        }
        Probe::CmakeAtLeast(major, minor) => {
            let Ok(out) = Command::new("cmake").arg("--version").output() else {
                return Found::No;
            };
            if !out.status.success() {
                return Found::No;
            }
            let text = String::from_utf8_lossy(&out.stdout);
            match cmake_version(&text) {
                Some(found) if found >= (major, minor) => Found::Yes,
                Some((a, b)) => Found::TooOld(format!("cmake {a}.{b}")),
                None => Found::TooOld(format!("a cmake whose version reads {:?}", text.trim())),
            }
        }
    }
}

fn succeeds(argv: &[&str]) -> bool {
    let Some((program, args)) = argv.split_first() else {
        return false;
    };
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// (major, minor) from `cmake --version` output ("cmake version 3.25.1", "cmake3 version 3.20.0-rc1").
fn cmake_version(text: &str) -> Option<(u32, u32)> {
    let line = text.lines().next()?;
    let version = line.split_once(" version ")?.1.trim();
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// `apt-get update` once, `apt-get install` the Debian packages, then `pip install` the Python
/// ones. Their output is shown only when they fail.
fn install(apt: &[&str], pip: &[&str]) -> Result<(), String> {
    if !apt.is_empty() {
        quiet(
            Command::new("apt-get")
                .args(["update", "-qq"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        quiet(
            Command::new("apt-get")
                .args(["install", "-y", "-qq"])
                .args(apt)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if !pip.is_empty() {
        quiet(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(pip)
                .env("PIP_BREAK_SYSTEM_PACKAGES", "1")
                .env("PIP_ROOT_USER_ACTION", "ignore"),
        )?;
    }
    Ok(())
}

fn quiet(cmd: &mut Command) -> Result<(), String> {
    let shown = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{shown}` failed with {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_DEBIAN: Machine = Machine {
        debian: true,
        root: true,
    };
    const USER_DEBIAN: Machine = Machine {
        debian: true,
        root: false,
    };
    const ROOT_ELSEWHERE: Machine = Machine {
        debian: false,
        root: true,
    };

    /// A machine on which the named tools are missing and everything else is present.
    fn lacking(names: &'static [&'static str]) -> impl Fn(&Tool) -> Found {
        move |tool| {
            if names.contains(&tool.name) {
                Found::No
            } else {
                Found::Yes
            }
        }
    }

    #[test]
    fn nothing_to_do_when_everything_is_there() {
        for task in [Task::Demo, Task::Test] {
            for machine in [ROOT_DEBIAN, USER_DEBIAN, ROOT_ELSEWHERE] {
                assert_eq!(plan(task, machine, lacking(&[])), Plan::Ready);
            }
        }
    }

    #[test]
    fn the_demo_does_not_ask_for_what_only_the_tests_use() {
        let found = lacking(&[
            "valgrind",
            "openssl",
            "x86_64-w64-mingw32-gcc",
            "python3",
            "the gguf and numpy Python packages",
        ]);
        assert_eq!(plan(Task::Demo, USER_DEBIAN, &found), Plan::Ready);
        assert!(matches!(
            plan(Task::Test, USER_DEBIAN, &found),
            Plan::Stop(_)
        ));
    }

    #[test]
    fn root_on_debian_installs_the_missing_packages_in_one_announced_step() {
        let found = lacking(&[
            "cmake 3.20+",
            "valgrind",
            "the gguf and numpy Python packages",
        ]);
        let Plan::Install { apt, pip, line } = plan(Task::Test, ROOT_DEBIAN, found) else {
            panic!("root on Debian installs");
        };
        assert_eq!(apt, ["cmake", "valgrind"]);
        assert_eq!(pip, ["gguf", "numpy"]);
        assert_eq!(
            line,
            "cargo xtask test: installing what it needs and this machine lacks (running as root \
             on Debian): cmake (builds the SDK and the C plugins), valgrind (runs the tests that \
             cross the C boundary), gguf numpy with pip (the GGUF reader's tests and the demo's \
             tiny Llama write their models with it)"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_fresh_debian_gets_python_and_pip_before_the_python_packages() {
        // Without python3 neither pip nor the packages can be found either.
        let found = lacking(&[
            "cmake 3.20+",
            "cc",
            "python3",
            "pip",
            "the gguf and numpy Python packages",
        ]);
        let Plan::Install { apt, pip, .. } = plan(Task::Test, ROOT_DEBIAN, &found) else {
            panic!("root on Debian installs");
        };
        assert_eq!(apt, ["cmake", "gcc", "python3", "python3-pip"]);
        assert_eq!(pip, ["gguf", "numpy"]);
        let Plan::Install { apt, pip, .. } = plan(Task::Demo, ROOT_DEBIAN, &found) else {
            panic!("root on Debian installs");
        };
        // The demo's tiny Llama step needs Python too: root on Debian gets the whole demo.
        assert_eq!(apt, ["cmake", "gcc", "python3", "python3-pip"]);
        assert_eq!(pip, ["gguf", "numpy"]);
    }

    #[test]
    fn the_demo_runs_without_its_optional_step_where_it_may_not_install() {
        let found = lacking(&["python3", "pip", "the gguf and numpy Python packages"]);
        assert_eq!(plan(Task::Demo, USER_DEBIAN, &found), Plan::Ready);
        assert_eq!(plan(Task::Demo, ROOT_ELSEWHERE, &found), Plan::Ready);
        let Plan::Install { apt, pip, line } = plan(Task::Demo, ROOT_DEBIAN, &found) else {
            panic!("root on Debian installs the optional step's tools");
        };
        assert_eq!(apt, ["python3", "python3-pip"]);
        assert_eq!(pip, ["gguf", "numpy"]);
        assert!(line.starts_with("cargo xtask demo: installing"), "{line}");
        // A user missing cmake as well is told only what the demo cannot do without.
        let found = lacking(&["cmake 3.20+", "the gguf and numpy Python packages"]);
        let Plan::Stop(message) = plan(Task::Demo, USER_DEBIAN, &found) else {
            panic!("cmake is required");
        };
        assert!(!message.contains("gguf"), "{message}");
    }

    #[test]
    fn a_user_on_debian_is_told_the_exact_commands() {
        let found = lacking(&[
            "cmake 3.20+",
            "x86_64-w64-mingw32-gcc",
            "x86_64-w64-mingw32-g++",
            "the gguf and numpy Python packages",
        ]);
        assert_eq!(
            plan(Task::Test, USER_DEBIAN, found),
            Plan::Stop(
                "this machine lacks tools it needs:\n\
                 \x20 cmake 3.20+ (builds the SDK and the C plugins)\n\
                 \x20 x86_64-w64-mingw32-gcc (the header checks cross-compile for Windows)\n\
                 \x20 x86_64-w64-mingw32-g++ (the header checks cross-compile for Windows)\n\
                 \x20 the gguf and numpy Python packages (the GGUF reader's tests and the demo's tiny Llama write their models with it)\n\
                 install them with:\n\
                 \x20 sudo apt-get install -y cmake gcc-mingw-w64-x86-64 g++-mingw-w64-x86-64\n\
                 \x20 PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --user gguf numpy\n\
                 (cargo xtask test installs them itself when it runs as root on Debian)"
                    .to_string()
            )
        );
    }

    #[test]
    fn root_elsewhere_is_told_the_debian_commands_and_nothing_is_run() {
        let Plan::Stop(message) = plan(Task::Demo, ROOT_ELSEWHERE, lacking(&["cmake 3.20+"]))
        else {
            panic!("without apt-get nothing is installed");
        };
        assert!(message.starts_with("this machine lacks tools it needs:\n"));
        assert!(message.contains("your system's package manager; the Debian commands are:\n"));
        assert!(
            message.contains("\n  apt-get install -y cmake\n"),
            "{message}"
        );
        assert!(!message.contains("pip"), "{message}");
    }

    #[test]
    fn a_cmake_too_old_stops_even_as_root_on_debian() {
        let found = |tool: &Tool| match tool.probe {
            Probe::CmakeAtLeast(..) => Found::TooOld("cmake 3.18".to_string()),
            _ => Found::Yes,
        };
        let Plan::Stop(message) = plan(Task::Demo, ROOT_DEBIAN, found) else {
            panic!("apt-get cannot be trusted to bring a newer cmake");
        };
        assert!(
            message.contains("cmake 3.20+ (builds the SDK and the C plugins): found cmake 3.18, which is too old"),
            "{message}"
        );
        assert!(!message.contains("apt-get"), "{message}");
    }

    #[test]
    fn every_tool_has_a_package_and_the_demo_needs_cmake_and_a_compiler() {
        for tool in TOOLS {
            let (Source::Apt(names) | Source::Pip(names)) = tool.source;
            assert!(!names.is_empty(), "{}", tool.name);
        }
        let demo: Vec<&str> = TOOLS
            .iter()
            .filter(|t| t.used_by == UsedBy::Both)
            .map(|t| t.name)
            .collect();
        // The demo builds the C++ example engine against libguild_host with CMake and pkg-config.
        assert_eq!(
            demo,
            [
                "cmake 3.20+",
                "make (or ninja)",
                "cc",
                "nm",
                "c++",
                "pkg-config"
            ]
        );
    }

    #[test]
    fn cmake_versions_are_read_from_the_first_line() {
        let out = "cmake version 3.25.1\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).\n";
        assert_eq!(cmake_version(out), Some((3, 25)));
        assert_eq!(cmake_version("cmake3 version 3.20.0-rc1\n"), Some((3, 20)));
        assert_eq!(cmake_version("cmake version 4.0\n"), Some((4, 0)));
        assert_eq!(cmake_version("cmake version 3.9.6\n"), Some((3, 9)));
        assert!((3, 9) < (3, 20));
        assert_eq!(cmake_version("not cmake at all\n"), None);
        assert_eq!(cmake_version(""), None);
    }
}
