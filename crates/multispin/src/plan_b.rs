//! `multispin plan` for paper-B scenarios: proactive draft lengths scored by SAA with optimal reactive correction.

use crate::failure::Failure;
use crate::plan_args::{OutputFormat, PlanArgs};
use serde::Serialize;
use spin_optimize::paper_b::{ModeScheme, SaaEvaluator, Scenario, ScenarioSpec};
use spin_optimize::round::{Family, plan_paper_b};

#[derive(Debug, Serialize)]
struct Output {
    model: &'static str,
    scheme: &'static str,
    objective: &'static str,
    draft_lengths: Vec<u32>,
    goodput_tokens_per_s: f64,
    mean_draft_len: f64,
    rate_tokens_per_s: f64,
    mean_ratio_tokens_per_s: f64,
    latency_s: f64,
    comm_delay_s: f64,
    frac_accepted: f64,
    frac_ul: f64,
    frac_dl: f64,
    saa_samples: u32,
    seed: u64,
}

/// Plans one round for a paper-B scenario.
pub fn run(spec: ScenarioSpec, args: &PlanArgs) -> Result<(), Failure> {
    let scheme = args.scheme.0;
    if scheme.family() != Family::PaperB {
        return Err(Failure::Input(format!(
            "--scheme: {scheme} is not a paper-b scheme"
        )));
    }
    let objective = args.objective();
    let sc = Scenario::new(spec).map_err(Failure::input)?;
    let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, objective).map_err(Failure::input)?;
    let plan = plan_paper_b(scheme, &ev).map_err(Failure::input)?;
    let st = ev.stats(&plan.draft_lengths);
    let out = Output {
        model: "paper-b",
        scheme: scheme.name(),
        objective: objective.name(),
        mean_draft_len: plan.mean_draft_len(),
        goodput_tokens_per_s: plan.value,
        draft_lengths: plan.draft_lengths,
        rate_tokens_per_s: st.rate_tokens_per_s,
        mean_ratio_tokens_per_s: st.mean_ratio_tokens_per_s,
        latency_s: st.latency_s,
        comm_delay_s: st.comm_delay_s,
        frac_accepted: st.frac_accepted,
        frac_ul: st.frac_ul,
        frac_dl: st.frac_dl,
        saa_samples: sc.saa_samples,
        seed: sc.seed,
    };
    match args.format {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(anyhow::Error::from)?
        ),
        OutputFormat::Table => {
            println!(
                "scheme {} objective {} ({} SAA samples, seed {})",
                out.scheme, out.objective, out.saa_samples, out.seed
            );
            println!("{:>8} {:>12}", "device", "draft_len");
            for (k, g) in out.draft_lengths.iter().enumerate() {
                println!("{k:>8} {g:>12}");
            }
            println!(
                "goodput {:.3} tokens/s, mean draft length {:.3}",
                out.goodput_tokens_per_s, out.mean_draft_len
            );
            println!(
                "rate {:.3} tokens/s, mean ratio {:.3} tokens/s, round {:.4} s (comm {:.4} s)",
                out.rate_tokens_per_s, out.mean_ratio_tokens_per_s, out.latency_s, out.comm_delay_s
            );
            println!(
                "device-rounds: {:.3} all accepted, {:.3} UL, {:.3} DL",
                out.frac_accepted, out.frac_ul, out.frac_dl
            );
        }
    }
    Ok(())
}
