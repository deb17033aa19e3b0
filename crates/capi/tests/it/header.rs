//! `guild/guild_host.h` and `guild/guild_host.hpp` compile the ways engines include them (C99
//! `-pedantic` and C++17, warnings as errors, alone and twice), and the C compiler's sizes and
//! offsets of every struct in the header, and of the API table's entries, are the Rust
//! mirror's: the layout of version 1 is frozen here.

use std::path::{Path, PathBuf};
use std::process::Command;

use guild_host_capi::ffi::*;

pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../abi-headers/include")
}

fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("capi")
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

pub fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

pub const C_FLAGS: &[&str] = &["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"];
pub const CXX_FLAGS: &[&str] = &["-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"];

fn compile(compiler: &str, flags: &[&str], source: &Path, output: &Path, link: bool) -> String {
    let mut cmd = Command::new(compiler);
    cmd.args(flags).arg("-I").arg(include_dir());
    if !link {
        cmd.arg("-c");
    }
    let out = cmd
        .arg(source)
        .arg("-o")
        .arg(output)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_headers_compile_alone_and_twice_as_c99_and_cxx17_without_warnings() {
    let dir = out_dir("headers");
    let h = "#include \"guild/guild_host.h\"\n";
    let hpp = "#include \"guild/guild_host.hpp\"\n";
    let abi = "#include \"guild/abi/module_abi.h\"\n";
    // (name, source, also as C): the C header in both languages, the wrapper in C++ only.
    let units = [
        ("alone", h.to_owned(), true),
        ("twice", format!("{h}{h}"), true),
        ("with_abi_first", format!("{abi}{h}"), true),
        ("hpp_alone", hpp.to_owned(), false),
        ("hpp_twice", format!("{hpp}{hpp}"), false),
    ];
    let mut compiled = 0;
    for (name, body, as_c) in &units {
        let mut languages = vec![("cpp", cxx(), CXX_FLAGS)];
        if *as_c {
            languages.push(("c", cc(), C_FLAGS));
        }
        for (ext, compiler, flags) in languages {
            let source = dir.join(format!("{name}.{ext}"));
            std::fs::write(&source, body).unwrap();
            compile(
                &compiler,
                flags,
                &source,
                &dir.join(format!("{name}.{ext}.o")),
                false,
            );
            compiled += 1;
        }
    }
    eprintln!("guild_host.h / .hpp: {compiled} compilations, none failed");
}

/// Each struct's size and every field's offset, as C sees them and as the mirror has them.
macro_rules! layouts {
    ($($ty:ident { $($field:ident),* $(,)? }),* $(,)?) => {{
        let mut c = String::new();
        let mut rust = String::new();
        $(
            c.push_str(&format!(
                "    printf(\"{} %zu\\n\", sizeof({}));\n",
                stringify!($ty),
                stringify!($ty)
            ));
            rust.push_str(&format!("{} {}\n", stringify!($ty), size_of::<$ty>()));
            $(
                c.push_str(&format!(
                    "    printf(\"{}.{} %zu\\n\", offsetof({}, {}));\n",
                    stringify!($ty),
                    stringify!($field),
                    stringify!($ty),
                    stringify!($field)
                ));
                rust.push_str(&format!(
                    "{}.{} {}\n",
                    stringify!($ty),
                    stringify!($field),
                    std::mem::offset_of!($ty, $field)
                ));
            )*
        )*
        (c, rust)
    }};
}

#[test]
fn the_layout_of_version_1_is_the_c_compilers() {
    let (body, rust) = layouts!(
        guild_host_open_options_v1_t {
            struct_size,
            flags,
            store_dir,
            lock_file,
            log,
            log_user
        },
        guild_host_open_report_v1_t {
            struct_size,
            loaded,
            failed,
            skipped,
            refused_by_lock,
            quarantined,
            generation
        },
        guild_host_refresh_v1_t {
            struct_size,
            loaded,
            from_generation,
            generation,
            taken_out,
            deferred,
            revoked_live,
            failed,
            pending,
            reserved
        },
        guild_host_state_v1_t {
            struct_size,
            pending,
            generation,
            changes,
            live_handles
        },
        guild_host_handle_info_v1_t {
            struct_size,
            is_current,
            package_id,
            package_version
        },
        guild_host_capi_v1_t {
            struct_size,
            version,
            open,
            close,
            operation_service,
            handle_info,
            refresh,
            watch,
            unwatch,
            state,
            error_code,
            error_message,
            error_free
        },
    );
    let constants =
        "    printf(\"constants %d %d %d %d %d %d %d %d %d %u %u %u %u\\n\", GUILD_HOST_OK, \
         GUILD_HOST_ERR_INVALID_ARGUMENT, GUILD_HOST_ERR_NOT_A_STORE, GUILD_HOST_ERR_STORE, \
         GUILD_HOST_ERR_LOCK_FILE, GUILD_HOST_ERR_BUSY, GUILD_HOST_ERR_NOT_FOUND, \
         GUILD_HOST_ERR_HOST, GUILD_HOST_ERR_INTERNAL, GUILD_HOST_CAPI_VERSION, \
         GUILD_HOST_OPEN_CPU_ONLY, GUILD_HOST_ID_CAPACITY, GUILD_HOST_VERSION_CAPACITY);\n"
            .to_owned();
    let rust_constants = format!(
        "constants {GUILD_HOST_OK} {GUILD_HOST_ERR_INVALID_ARGUMENT} {GUILD_HOST_ERR_NOT_A_STORE} \
         {GUILD_HOST_ERR_STORE} {GUILD_HOST_ERR_LOCK_FILE} {GUILD_HOST_ERR_BUSY} \
         {GUILD_HOST_ERR_NOT_FOUND} {GUILD_HOST_ERR_HOST} {GUILD_HOST_ERR_INTERNAL} \
         {GUILD_HOST_CAPI_VERSION} {GUILD_HOST_OPEN_CPU_ONLY} {GUILD_HOST_ID_CAPACITY} \
         {GUILD_HOST_VERSION_CAPACITY}\n"
    );
    let init = "    { guild_host_open_options_v1_t o = GUILD_HOST_OPEN_OPTIONS_V1_INIT; \
                printf(\"init %u %u\\n\", o.struct_size, o.flags); }\n";
    let rust_init = format!("init {} 0\n", size_of::<guild_host_open_options_v1_t>());
    let dir = out_dir("layout");
    let source = dir.join("layout.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n#include \"guild/guild_host.h\"\nint main(void) {{\n{body}{constants}{init}    return 0;\n}}\n"
        ),
    )
    .unwrap();
    let exe = dir.join("layout");
    compile(&cc(), C_FLAGS, &source, &exe, true);
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let c = String::from_utf8(out.stdout).unwrap();
    assert_eq!(c, format!("{rust}{rust_constants}{rust_init}"));
    eprintln!("guild_host.h layout: {} lines agree", c.lines().count());
}
