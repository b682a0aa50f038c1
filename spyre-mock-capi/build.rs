//! Links the library so that `dlclose` leaves it loaded (`-z nodelete`):
//! it gives each calling thread's read-section slot back from the
//! destructor of a key of the C library's thread-specific data, which an
//! exiting thread calls whenever it exits, also after a `dlclose`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
