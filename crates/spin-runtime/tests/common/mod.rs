//! Helpers shared by the runtime's integration tests.

use candle_core::Device;
use spin_runtime::Model;
use spin_runtime::model;

/// A random-weight model small enough for exact enumeration: vocabulary 24, width 32, 4 query and 2 key/value
/// heads, at most 96 positions; weights drawn with standard deviation `std` from `seed`.
pub fn tiny(seed: u64, std: f64, n_layers: usize) -> Model {
    model::tiny_random_model(seed, std, n_layers, &Device::Cpu).unwrap()
}

/// Says on the uncaptured stderr whether this real-model test runs or skips, so a plain `cargo test` shows it
/// (`.ci/run` counts these lines). Not every test binary that includes this module has a real-model test.
#[allow(dead_code)]
pub fn real_model_marker(ran: bool) {
    use std::io::Write as _;
    let name = std::thread::current().name().unwrap_or("?").to_owned();
    let what = if ran {
        "ran"
    } else {
        "skipped (MULTISPIN_SHARED_DATA unset)"
    };
    // One write of the whole line: a line written in pieces interleaves with the harness's own lines.
    let _ = std::io::stderr().write_all(format!("real-model test {name}: {what}\n").as_bytes());
}
