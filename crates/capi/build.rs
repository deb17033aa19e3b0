//! Names the shared library as it is installed (`libguild_host.so`), so that programs linked
//! against the installed file record that name whatever cargo called the build.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" || os == "android" || os.ends_with("bsd") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libguild_host.so");
    }
}
