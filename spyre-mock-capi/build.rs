//! Links the library so that `dlclose` leaves it loaded (`-z nodelete`,
//! on every ELF system): every thread that has called it runs a function
//! of it as it exits (the destructor of the key that gives the thread's
//! read-section slot back), also after a `dlclose`. Apple's linker has no
//! such flag; there the library is not pinned.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let unix =
        std::env::var("CARGO_CFG_TARGET_FAMILY").is_ok_and(|f| f.split(',').any(|f| f == "unix"));
    let apple = std::env::var("CARGO_CFG_TARGET_VENDOR").is_ok_and(|v| v == "apple");
    if unix && !apple {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
