//! `multispin plan` for paper-A scenarios: validate the file field by field, run the chosen scheme, print the
//! plan as JSON or as a table.

use crate::failure::Failure;
use crate::plan_args::{OutputFormat, PlanArgs};
use crate::plan_output::OptimalityOutput;
use crate::scenario::PaperA;
use serde_json::{Value, json};
use spin_optimize::OptimizeError;
use spin_optimize::paper_a::baselines::FIXED_DRAFT_LEN;
use spin_optimize::paper_a::{Optimality, Plan, Scenario};
use spin_optimize::round::plan_paper_a;

/// The draft length of `fixed`: the command line, else the scenario's `fixed_draft_len`, else
/// [`FIXED_DRAFT_LEN`] (8) lowered to `max_draft_len` when that is smaller; an explicit value must lie in
/// [min_draft_len, max_draft_len] and is named by where it came from.
fn fixed_draft_len(s: &Scenario, flag: Option<u32>, file: Option<u32>) -> Result<u32, Failure> {
    let (value, field) = match (flag, file) {
        (Some(l), _) => (l, "--fixed-draft-len"),
        (None, Some(l)) => (l, "fixed_draft_len"),
        (None, None) => return Ok(FIXED_DRAFT_LEN.clamp(s.min_draft_len, s.max_draft_len)),
    };
    if !(s.min_draft_len..=s.max_draft_len).contains(&value) {
        return Err(Failure::Input(format!(
            "{field}: {value} is outside [min_draft_len, max_draft_len] = [{}, {}]",
            s.min_draft_len, s.max_draft_len
        )));
    }
    Ok(value)
}

/// Plans one round for a paper-A scenario.
pub fn run(file: PaperA, args: &PlanArgs) -> Result<(), Failure> {
    // Only `fixed` drafts a fixed length: the flag would change nothing under another scheme (the file's
    // field may stay, a scenario serves every scheme).
    if args.fixed_draft_len.is_some() && args.scheme.0 != spin_optimize::round::Scheme::Fixed {
        return Err(Failure::Input(
            "--fixed-draft-len: only --scheme fixed takes it".into(),
        ));
    }
    let alg1 = file.alg1;
    let scenario = Scenario::new(&file.spec).map_err(Failure::input)?;
    let fixed_len = fixed_draft_len(&scenario, args.fixed_draft_len, file.fixed_draft_len)?;
    let plan = plan_paper_a(args.scheme.0, &scenario, fixed_len, &alg1).map_err(|e| match e {
        // A scheme of another paper: name the flag, as every usage error does.
        OptimizeError::Invalid { field, reason } if field == "scheme" => {
            Failure::Input(format!("--scheme: {reason}"))
        }
        e => Failure::input(e),
    })?;
    let name = args.scheme.0.name();
    match args.format {
        OutputFormat::Json => println!("{}", to_json(name, &plan)),
        OutputFormat::Table => print!("{}", to_table(name, &scenario, &plan)),
    }
    Ok(())
}

/// The JSON contract: scheme, draft_lengths, uplink_share_hz (each device's share B_k), goodput_tokens_per_s,
/// round_latency_s, optimality.
fn to_json(scheme: &str, plan: &Plan) -> Value {
    json!({
        "scheme": scheme,
        "draft_lengths": plan.draft_lengths,
        "uplink_share_hz": plan.uplink_share_hz,
        "goodput_tokens_per_s": plan.goodput_tokens_per_s,
        "round_latency_s": plan.round_latency_s,
        "optimality": OptimalityOutput::from(plan.optimality),
    })
}

/// One line saying what the planner proved about its plan (docs/paper-a.md "Certificate or gap").
fn optimality_line(o: &Optimality) -> String {
    match o {
        Optimality::Optimal => "optimality: proven optimal".into(),
        Optimality::Bounded {
            upper_bound_tokens_per_s,
            relative_gap,
        } => format!(
            "optimality: work budget reached; optimum at most {upper_bound_tokens_per_s:.3} tokens/s (relative gap {relative_gap:.2e})"
        ),
        Optimality::NoClaim => "optimality: no claim (heuristic or baseline)".into(),
    }
}

fn to_table(scheme: &str, s: &Scenario, plan: &Plan) -> String {
    let mut out = format!(
        "scheme: {scheme}\ngoodput: {:.3} tokens/s\nround latency: {:.3} ms\n{}\n\n{:>6} {:>9} {:>9} {:>10} {:>12} {:>12}\n",
        plan.goodput_tokens_per_s,
        plan.round_latency_s * 1e3,
        optimality_line(&plan.optimality),
        "device",
        "alpha",
        "L",
        "T_S (ms)",
        "r (b/s/Hz)",
        "B_k (kHz)"
    );
    for (k, (d, (&l, &b))) in s
        .devices
        .iter()
        .zip(plan.draft_lengths.iter().zip(&plan.uplink_share_hz))
        .enumerate()
    {
        out.push_str(&format!(
            "{k:>6} {:>9.4} {l:>9} {:>10.3} {:>12.3} {:>12.3}\n",
            d.acceptance,
            d.draft_token_s * 1e3,
            d.spectral_efficiency,
            b / 1e3
        ));
    }
    out
}
