//! Links the `multispin` executable at a fixed address (not position-independent) on Linux, so that the dynamic
//! loader has no relocations to apply at start-up: a PIE build carries about 26,000 of them, and applying them
//! (and copying the pages they touch) was a measurable part of a short `generate` run (docs/runtime.md,
//! "Start-up"). The price is that the executable's own image is not placed at a random address.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-link-arg-bin=multispin=-no-pie");
    }
}
