//! Helpers shared by the runtime's integration tests.

use candle_core::Device;
use spin_runtime::Model;
use spin_runtime::model;

/// A random-weight model small enough for exact enumeration: vocabulary 24, width 32, 4 query and 2 key/value
/// heads, at most 96 positions; weights drawn with standard deviation `std` from `seed`.
pub fn tiny(seed: u64, std: f64, n_layers: usize) -> Model {
    model::tiny_random_model(seed, std, n_layers, &Device::Cpu).unwrap()
}
