//! The `multispin` command: plan a round, choose correction modes, generate text and measure real models.
//!
//! Exit status: 0 on success, 2 on invalid input (one line on stderr naming the field and the reason, as clap
//! does for usage errors), 1 when the work itself fails (e.g. a file cannot be written).

mod chart;
mod correct;
mod device;
mod draft_format;
mod failure;
mod gen_cert;
mod generate;
mod logging;
mod lookup;
mod make_scenario;
mod measure;
mod number;
mod pairing;
mod plan;
mod plan_a;
mod plan_args;
mod plan_b;
mod plan_output;
mod plan_unified;
mod prompt_file;
mod scenario;
mod serve;
mod simulate;
mod study;
mod temperature;
mod threads;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use failure::Failure;
use std::process::ExitCode;

/// Multi-SPIN: speculative LLM inference shared by many wireless edge devices and one edge server.
///
/// All quantities are SI inside: seconds, hertz, bits, watts, watts per hertz. Scenario files are JSON (or TOML);
/// their power, noise, gain and bandwidth fields may also be given in dBm, dBm/Hz, dB and MHz.
#[derive(Debug, Parser)]
#[command(name = "multispin", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Choose per-device draft lengths (and bandwidth, for paper-A scenarios) for one round.
    Plan(plan_args::PlanArgs),
    /// Choose the uplink/downlink correction mode and downlink power for a set of rejected devices (paper B).
    Correct(correct::CorrectArgs),
    /// Generate text with real models by speculative decoding (drafter plus batched verifier).
    Generate(generate::GenerateArgs),
    /// Write a paper-A or paper-B scenario (JSON) from a seeded device drop given in dB, dBm, MHz and metres.
    Scenario(make_scenario::ScenarioArgs),
    /// Measure acceptance rates, verification latency and goodput of real models (CSV + SVG).
    Measure(measure::MeasureArgs),
    /// Run the server and K devices in one process over loopback sockets with an emulated wireless link.
    Simulate(simulate::SimulateArgs),
    /// Run the edge server; devices connect with `multispin device`.
    Serve(serve::ServeArgs),
    /// Run one edge device against a `multispin serve` server.
    Device(device::DeviceArgs),
    /// Write a self-signed TLS certificate and key for a demo of `serve` and `device` over TLS.
    GenCert(gen_cert::GenCertArgs),
}

/// The first line of an error message: libraries that capture a backtrace (candle does when `RUST_BACKTRACE` is
/// set) append it after a newline, and the contract is one line on stderr.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("").trim_end()
}

/// Whether `arg` takes a number: its values parse into an integer or a float type.
fn takes_number(arg: &clap::Arg) -> bool {
    use std::any::TypeId;
    let t = arg.get_value_parser().type_id();
    arg.get_action().takes_values()
        && [
            TypeId::of::<f64>(),
            TypeId::of::<f32>(),
            TypeId::of::<u8>(),
            TypeId::of::<u16>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<usize>(),
            TypeId::of::<i8>(),
            TypeId::of::<i16>(),
            TypeId::of::<i32>(),
            TypeId::of::<i64>(),
            TypeId::of::<isize>(),
        ]
        .into_iter()
        .any(|n| t == n)
}

/// `cmd` with every option that takes a number also taking a value that starts with `-` (`--temperature -1`,
/// `--ul-power-dbm -10`, `--rounds -inf`), in every subcommand: a negative dBm is a valid value, and an invalid one
/// reaches the value's parser or the command's own check, which name the flag and its range, instead of clap
/// reporting an unexpected argument `-1`.
fn numbers_take_a_minus(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if takes_number(&a) {
            a.allow_hyphen_values(true)
        } else {
            a
        }
    })
    .mut_subcommands(numbers_take_a_minus)
}

/// The command line parsed by [`numbers_take_a_minus`]'s rules.
fn parse(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Cli, clap::Error> {
    let mut cmd = numbers_take_a_minus(Cli::command());
    let matches = cmd.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
}

fn main() -> ExitCode {
    let cli = match parse(std::env::args_os()) {
        Ok(cli) => cli,
        // `--help` and `--version` print in full and exit 0; a usage error is one line and exit 2, like any other
        // invalid input.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // clap's first paragraph (the error and, for a bad value, the possible values) joined on one line,
            // then its suggestions ("tip: a similar argument exists: '--devices'") on the same line.
            let text = e.render().to_string();
            let mut lines: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            lines.extend(text.lines().map(str::trim).filter(|l| l.starts_with("tip:")));
            eprintln!("{}", lines.join(" "));
            return ExitCode::from(2);
        }
    };
    // Libraries' warnings (the listener's accept errors) reach stderr; `RUST_LOG` chooses more or less.
    let result = logging::install().and_then(|()| match cli.command {
        Command::Plan(args) => plan::run(&args),
        Command::Correct(args) => correct::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Measure(args) => measure::run(&args),
        Command::Scenario(args) => make_scenario::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Device(args) => device::run(&args),
        Command::GenCert(args) => gen_cert::run(&args),
    });
    // The lines said through the stderr printer come before the error, if any.
    logging::flush(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Numbers in messages as a person reads them: a library's f64 of 1e308 is not printed as 309 digits.
        Err(Failure::Input(msg)) => {
            eprintln!("error: {}", number::shorten_numbers(first_line(&msg)));
            ExitCode::from(2)
        }
        Err(Failure::Runtime(err)) => {
            let text = failure::chain_text(err.chain().map(|c| first_line(&c.to_string()).to_string()));
            eprintln!("error: {}", number::shorten_numbers(&text));
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The subcommand paths under `cmd` (`["simulate"]`, `["measure", "goodput"]`, …), each with its numeric
    /// options' long names.
    fn numeric_options(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, Vec<String>)>) {
        let longs = cmd
            .get_arguments()
            .filter(|a| takes_number(a))
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        out.push((path.clone(), longs));
        for sub in cmd.get_subcommands() {
            let mut p = path.clone();
            p.push(sub.get_name().to_owned());
            numeric_options(sub, p, out);
        }
    }

    /// Every numeric option of every subcommand takes `-1` as its value: clap then either accepts it (a negative
    /// dBm) or rejects it as a value of that option, never as an unknown argument `-1`.
    #[test]
    fn every_numeric_option_takes_a_negative_value() {
        let mut all = Vec::new();
        numeric_options(&Cli::command(), Vec::new(), &mut all);
        let mut checked = 0;
        for (path, longs) in all {
            for long in longs {
                let mut args: Vec<String> = vec!["multispin".into()];
                args.extend(path.iter().cloned());
                args.extend([format!("--{long}"), "-1".into()]);
                if let Err(e) = parse(args.iter().map(Into::into)) {
                    assert!(
                        !matches!(e.kind(), clap::error::ErrorKind::UnknownArgument),
                        "{args:?}: {e}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 50, "only {checked} numeric options found");
    }
}
