//! `cargo xtask capi`: builds `libguild_host` (crate guild-host-capi) and installs it into its
//! own prefix, `target/guild-host` by default, apart from the SDK (which stays free of compiled
//! code): the shared and static library under their installed names, the headers it needs
//! (`guild/guild_host.h`, `guild/guild_host.hpp` and the ABI headers they include), a CMake
//! package (`find_package(GuildHost CONFIG)` → `GuildHost::guild_host`, and
//! `GuildHost::guild_host_static`) and `lib/pkgconfig/guild-host.pc`. Both are relocatable: they
//! find the prefix from their own location. Then it builds the C++ example engine
//! (examples/cpp-engine) against that prefix alone, once with CMake and once with pkg-config.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, root};

/// The package version installed; guild-host-capi's.
const VERSION: &str = "0.1.0";

/// Where `cargo xtask capi` installs, and where the example engine is built.
pub struct Installed {
    pub prefix: PathBuf,
    /// The example engine built with CMake.
    pub engine_cmake: PathBuf,
    /// The example engine built with pkg-config alone.
    pub engine_pkg_config: PathBuf,
}

/// Installs into `prefix` (default `target/guild-host`) and builds the example engine both ways.
pub fn run(args: &[String]) -> Result<(), String> {
    let prefix = match args {
        [] => root().join("target/guild-host"),
        [flag, dir] if flag == "--prefix" => PathBuf::from(dir),
        _ => return Err("usage: cargo xtask capi [--prefix DIR]".into()),
    };
    let installed = install_and_build(&prefix)?;
    println!(
        "capi: installed libguild_host into {}; the example engine built from it with CMake ({}) \
         and with pkg-config ({})",
        installed.prefix.display(),
        installed.engine_cmake.display(),
        installed.engine_pkg_config.display()
    );
    Ok(())
}

pub fn install_and_build(prefix: &Path) -> Result<Installed, String> {
    install(prefix)?;
    let build = root().join("target/cpp-engine");
    let engine_cmake = build_with_cmake(prefix, &build.join("cmake"))?;
    let engine_pkg_config = build_with_pkg_config(prefix, &build.join("pkg-config"))?;
    Ok(Installed {
        prefix: prefix.to_path_buf(),
        engine_cmake,
        engine_pkg_config,
    })
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    // Through a temporary name, so that a program running the old library keeps its mapping.
    let tmp = to.with_extension("installing");
    std::fs::copy(from, &tmp)
        .and_then(|_| std::fs::rename(&tmp, to))
        .map(drop)
        .map_err(|e| format!("installing {} as {}: {e}", from.display(), to.display()))
}

fn write(to: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    std::fs::write(to, text).map_err(|e| format!("writing {}: {e}", to.display()))
}

/// Builds the library (the dev profile, like the rest of `cargo xtask test`) and installs it.
pub fn install(prefix: &Path) -> Result<(), String> {
    install_profile(prefix, false)
}

/// Builds the library with the release profile (`release`) or the dev one and installs it.
pub fn install_profile(prefix: &Path, release: bool) -> Result<(), String> {
    let mut build = vec!["build", "-p", "guild-host-capi", "--lib"];
    if release {
        build.push("--release");
    }
    util::cargo(&build)?;
    let built = util::target_dir().join(if release { "release" } else { "debug" });
    let lib = prefix.join("lib");
    copy(
        &built.join("libguild_host_capi.so"),
        &lib.join("libguild_host.so"),
    )?;
    copy(
        &built.join("libguild_host_capi.a"),
        &lib.join("libguild_host.a"),
    )?;
    let include = root().join("abi-headers/include/guild");
    for header in ["guild_host.h", "guild_host.hpp"] {
        copy(
            &include.join(header),
            &prefix.join("include/guild").join(header),
        )?;
    }
    let abi = include.join("abi");
    for entry in std::fs::read_dir(&abi).map_err(|e| format!("{}: {e}", abi.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|e| e == "h") {
            copy(
                &path,
                &prefix
                    .join("include/guild/abi")
                    .join(path.file_name().unwrap()),
            )?;
        }
    }
    write(
        &lib.join("cmake/GuildHost/GuildHostConfig.cmake"),
        CMAKE_CONFIG,
    )?;
    write(
        &lib.join("cmake/GuildHost/GuildHostConfigVersion.cmake"),
        &CMAKE_VERSION.replace("@VERSION@", VERSION),
    )?;
    write(
        &lib.join("pkgconfig/guild-host.pc"),
        &PKG_CONFIG.replace("@VERSION@", VERSION),
    )?;
    Ok(())
}

const CMAKE_CONFIG: &str = r#"# GuildHost: libguild_host, the Guild host for C and C++ engines (installed by `cargo xtask capi`).
#
#   find_package(GuildHost 0.1 CONFIG REQUIRED)
#   target_link_libraries(my_engine PRIVATE GuildHost::guild_host)         # libguild_host.so
#   target_link_libraries(my_engine PRIVATE GuildHost::guild_host_static)  # libguild_host.a
#
# Headers: #include "guild/guild_host.h" (C) or "guild/guild_host.hpp" (C++17).
include(CMakeFindDependencyMacro)
find_dependency(Threads)
get_filename_component(_guild_host_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET GuildHost::guild_host)
  add_library(GuildHost::guild_host SHARED IMPORTED)
  set_target_properties(GuildHost::guild_host PROPERTIES
    IMPORTED_LOCATION "${_guild_host_prefix}/lib/libguild_host.so"
    IMPORTED_SONAME "libguild_host.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_guild_host_prefix}/include")
  add_library(GuildHost::guild_host_static STATIC IMPORTED)
  set_target_properties(GuildHost::guild_host_static PROPERTIES
    IMPORTED_LOCATION "${_guild_host_prefix}/lib/libguild_host.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_guild_host_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};m")
endif()
unset(_guild_host_prefix)
"#;

const CMAKE_VERSION: &str = r#"# Any 0.1.x request is met by 0.1.y with y >= x; other minor or major versions are not (0.x
# versions make no promise across minors).
set(PACKAGE_VERSION "@VERSION@")
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(PACKAGE_FIND_VERSION_MAJOR EQUAL 0 AND PACKAGE_FIND_VERSION_MINOR EQUAL 1
   AND NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
"#;

const PKG_CONFIG: &str = r#"prefix=${pcfiledir}/../..
libdir=${prefix}/lib
includedir=${prefix}/include

Name: guild-host
Description: The Guild host for C and C++ engines (libguild_host)
Version: @VERSION@
Libs: -L${libdir} -lguild_host
Libs.private: -lpthread -ldl -lm
Cflags: -I${includedir}
"#;

fn engine_source() -> PathBuf {
    root().join("examples/cpp-engine")
}

/// Configures and builds examples/cpp-engine with CMake, finding the package at `prefix` only.
fn build_with_cmake(prefix: &Path, build: &Path) -> Result<PathBuf, String> {
    util::run(
        Command::new("cmake")
            .arg("-S")
            .arg(engine_source())
            .arg("-B")
            .arg(build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .arg("-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF")
            .arg("-DCMAKE_BUILD_TYPE=Release"),
    )?;
    util::run(Command::new("cmake").arg("--build").arg(build))?;
    Ok(build.join("guild_engine"))
}

/// Builds the same engine with the compiler and `pkg-config guild-host` alone.
fn build_with_pkg_config(prefix: &Path, build: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(build).map_err(|e| format!("{}: {e}", build.display()))?;
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", "guild-host"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .map_err(|e| format!("cannot run pkg-config: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pkg-config guild-host: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let flags = String::from_utf8_lossy(&out.stdout).into_owned();
    let exe = build.join("guild_engine");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    util::run(
        Command::new(&cxx)
            .args(["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror"])
            .arg(engine_source().join("engine.cpp"))
            .args(flags.split_whitespace())
            .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
            .arg("-pthread")
            .arg("-o")
            .arg(&exe),
    )?;
    Ok(exe)
}
