//! The `multispin` command: plan a round, choose correction modes, generate text and measure real models.
//!
//! Exit status: 0 on success, 2 on invalid input (one line on stderr naming the field and the reason, as clap
//! does for usage errors), 1 when the work itself fails (e.g. a file cannot be written).

mod correct;
mod device;
mod failure;
mod generate;
mod measure;
mod plan;
mod plan_a;
mod plan_b;
mod plan_unified;
mod scenario;
mod serve;
mod simulate;

use clap::{Parser, Subcommand};
use failure::Failure;
use std::process::ExitCode;

/// Multi-SPIN: speculative LLM inference shared by many wireless edge devices and one edge server.
///
/// All quantities are SI: seconds, hertz, bits, watts, watts per hertz. Scenario files are JSON.
#[derive(Debug, Parser)]
#[command(name = "multispin", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Choose per-device draft lengths (and bandwidth, for paper-A scenarios) for one round.
    Plan(plan::PlanArgs),
    /// Choose the uplink/downlink correction mode and downlink power for a set of rejected devices (paper B).
    Correct(correct::CorrectArgs),
    /// Generate text with real models by speculative decoding (drafter plus batched verifier).
    Generate(generate::GenerateArgs),
    /// Measure acceptance rates, verification latency and goodput of real models (CSV + SVG).
    Measure(measure::MeasureArgs),
    /// Run the server and K devices in one process over loopback sockets with an emulated wireless link.
    Simulate(simulate::SimulateArgs),
    /// Run the edge server; devices connect with `multispin device`.
    Serve(serve::ServeArgs),
    /// Run one edge device against a `multispin serve` server.
    Device(device::DeviceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => plan::run(&args),
        Command::Correct(args) => correct::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Measure(args) => measure::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Device(args) => device::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(msg)) => {
            eprintln!("error: {}", msg.replace('\n', " "));
            ExitCode::from(2)
        }
        Err(Failure::Runtime(err)) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
