//! Turns the vendor conformance suite on when `FLEX_RUNTIME_LIB` names a
//! library at build time (`cfg(flex_vendor_library)`); without it those tests
//! are reported as ignored, with the reason. Compiles the C++ baseline of the
//! pool benchmark (`benches/cpp/torch_spyre_pool.cpp`, torch-spyre's locking
//! discipline) with `-O2`.

fn main() {
    println!("cargo::rerun-if-changed=benches/cpp/torch_spyre_pool.cpp");
    cc::Build::new()
        .cpp(true)
        .file("benches/cpp/torch_spyre_pool.cpp")
        .opt_level(2)
        .flag_if_supported("-std=c++17")
        .compile("torch_spyre_pool");
    println!("cargo::rerun-if-env-changed=FLEX_RUNTIME_LIB");
    println!("cargo::rustc-check-cfg=cfg(flex_vendor_library)");
    if std::env::var_os("FLEX_RUNTIME_LIB").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=flex_vendor_library");
    }
}
