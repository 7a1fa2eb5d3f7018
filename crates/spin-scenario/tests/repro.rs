//! The reproduction configs: the committed files parse, unit pairs convert, and every error names its field path
//! (old keys by the name that replaced them).

use spin_scenario::repro::{paper_a, paper_b};

const A: &str = include_str!("../../../scenarios/paper-a.toml");
const B: &str = include_str!("../../../scenarios/paper-b.toml");

fn err_a(text: &str) -> String {
    paper_a::Config::parse(text).unwrap_err().to_string()
}

fn err_b(text: &str) -> String {
    paper_b::Config::parse(text).unwrap_err().to_string()
}

#[test]
fn the_committed_configs_parse() {
    let a = paper_a::Config::parse(A).unwrap();
    assert_eq!(a.system.bandwidth_hz, 1e7);
    assert_eq!(a.fig7_bandwidth_hz[0], 5e6);
    assert_eq!(a.pairs.len(), 2);
    assert_eq!(a.realisations_for(false), a.sampling.realisations);
    assert_eq!(a.prompts_for(true), a.quick.prompts_per_device);
    assert_eq!(a.alg1_for(true).phi_points, a.quick.alg1_phi_points);
    let b = paper_b::Config::parse(B).unwrap();
    assert_eq!(b.bandwidth_hz, 1e7);
    assert_eq!(b.dl_power_dbm, 30.0);
    assert_eq!(b.distribution_format().distribution_bits(), 34_816.0);
    assert_eq!(b.size(true).saa_samples, 100);
}

#[test]
fn paper_a_values_are_checked_by_their_path() {
    let dbm = paper_a::Config::parse(&A.replacen("noise_w = 1.0e-10", "noise_dbm = -70.0", 1)).unwrap();
    assert!((dbm.channel.noise_w / 1e-10 - 1.0).abs() < 1e-12);
    let db = paper_a::Config::parse(&A.replacen("mean_gain_hi = 0.5", "mean_gain_hi_db = -3.0", 1)).unwrap();
    assert!((db.channel.mean_gain_hi - 0.501_187_233_627_272_3).abs() < 1e-12);
    let e = err_a(&A.replacen(
        "mean_gain_lo = 0.2",
        "mean_gain_lo = 0.2\nmean_gain_lo_db = -7",
        1,
    ));
    assert_eq!(
        e,
        "channel.mean_gain_lo, channel.mean_gain_lo_db: give exactly one of the pair, not both"
    );
    let e = err_a(&A.replacen("mean_gain_lo = 0.2", "mean_gain_lo = 0.9", 1));
    assert!(e.starts_with("channel.mean_gain_hi: "), "{e}");
    let e = err_a(&A.replacen("bandwidth_mhz = [5.0, 7.5,", "bandwidth_mhz = [5.0, -7.5,", 1));
    assert!(e.starts_with("fig7.bandwidth_mhz[1]: "), "{e}");
    let e = err_a("[system\n");
    assert!(e.starts_with("malformed TOML at line 1"), "{e}");
}

#[test]
fn paper_b_errors_name_the_field_path() {
    let e = err_b(&B.replacen("dl_power_dbm = 30.0", "reference_dl_dbm = 30.0", 1));
    assert!(e.starts_with("reference_dl_dbm: renamed to dl_power_dbm"), "{e}");
    let e = err_b(&B.replacen("quant_bits = 16", "quant_bits = 99", 1));
    assert!(e.starts_with("quant_bits: 99 is outside"), "{e}");
    let e = err_b(&B.replacen("acceptance = [0.85,", "acceptance = [1.5,", 1));
    assert_eq!(e, "pairs[0].acceptance: 1.5 is outside (0, 1)");
    let e = err_b(&B.replacen("saa_samples = 100\n", "saa_samples = 100\nsamples = 3\n", 1));
    assert!(e.starts_with("quick.samples: unknown field `samples`"), "{e}");
    let e = err_b(&B.replacen(
        "quick_dl_power_dbm = [20.0, 30.0, 40.0]",
        "quick_dl_power_dbm = [20.0, 30.0, 40.0]\ndl_power_w = [1.0]",
        1,
    ));
    assert!(
        e.starts_with("fig7.dl_power_dbm, fig7.dl_power_w: give exactly one"),
        "{e}"
    );
    let text = B.replacen(
        "ratios = [4.0, 16.0]",
        "ratios_db = [6.020599913279624, 12.041199826559248]",
        1,
    );
    assert_ne!(text, B);
    let ratios = paper_b::Config::parse(&text).unwrap().fig9.ratios;
    assert!(
        (ratios[0] - 4.0).abs() < 1e-12 && (ratios[1] - 16.0).abs() < 1e-12,
        "{ratios:?}"
    );
    let e = err_b(&B.replacen("[fig11]\n", "[fig11]\nquick_ratios_db = [0.0]\n", 1));
    assert!(
        e.starts_with("fig11.quick_ratios, fig11.quick_ratios_db: give exactly one"),
        "{e}"
    );
    let e = err_b(&B.replacen(
        "noise_psd_device_dbm_per_hz = -167.0",
        "noise_psd_device_dbm_per_hz = 9999.0",
        1,
    ));
    assert!(
        e.starts_with("noise_psd_device_dbm_per_hz: 9999 converts to inf"),
        "{e}"
    );
}

#[test]
fn misspelt_config_keys_are_refused_by_name() {
    let text = A;
    assert!(paper_a::Config::parse(text).is_ok());
    let bad = text.replacen("bandwidth_hz =", "bandwith_hz =", 1);
    let err = format!("{:#}", paper_a::Config::parse(&bad).unwrap_err());
    assert!(
        err.starts_with("system.bandwith_hz: unknown field `bandwith_hz`"),
        "{err}"
    );
    let bad = text.replacen("fig3_rounds = 4000", "fig3_rounds = \"many\"", 1);
    let err = format!("{:#}", paper_a::Config::parse(&bad).unwrap_err());
    assert!(err.starts_with("sampling.fig3_rounds: invalid type"), "{err}");
    let b = B;
    assert!(paper_b::Config::parse(b).is_ok());
    let bad_b = format!("unknown_key = 1\n{b}");
    let err = paper_b::Config::parse(&bad_b).unwrap_err().to_string();
    assert!(err.contains("unknown_key"), "{err}");
}

/// The unit pairs of the scenario files: the engineering unit gives the same SI config; both or neither is an
/// error naming the pair; keys of the older layout name their replacement.
#[test]
fn config_units_follow_the_scenario_rules() {
    let text = A;
    let si = paper_a::Config::parse(text).unwrap();
    let eng = text
        .replacen("bandwidth_hz = 1.0e7", "bandwidth_mhz = 10", 1)
        .replacen("noise_w = 1.0e-10", "noise_dbm = -70", 1)
        .replacen(
            "bandwidth_mhz = [5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0]",
            "bandwidth_hz = [5e6, 7.5e6, 10e6, 12.5e6, 15e6, 17.5e6, 20e6]",
            1,
        );
    let eng = paper_a::Config::parse(&eng).unwrap();
    assert_eq!(eng.system.bandwidth_hz, si.system.bandwidth_hz);
    assert!((eng.channel.noise_w / si.channel.noise_w - 1.0).abs() < 1e-12);
    assert_eq!(eng.fig7_bandwidth_hz, si.fig7_bandwidth_hz);
    let both = text.replacen(
        "bandwidth_hz = 1.0e7",
        "bandwidth_hz = 1.0e7\nbandwidth_mhz = 10",
        1,
    );
    let err = format!("{:#}", paper_a::Config::parse(&both).unwrap_err());
    assert!(
        err.starts_with("system.bandwidth_hz, system.bandwidth_mhz: give exactly one of the pair"),
        "{err}"
    );
    let neither = text.replacen("ul_power_w = 2.0e-8", "", 1);
    let err = format!("{:#}", paper_a::Config::parse(&neither).unwrap_err());
    assert!(
        err.starts_with("channel.ul_power_w, channel.ul_power_dbm: missing"),
        "{err}"
    );
    let old = text.replacen("ul_power_w = 2.0e-8", "power_w = 2.0e-8", 1);
    let err = format!("{:#}", paper_a::Config::parse(&old).unwrap_err());
    assert!(
        err.starts_with("channel.power_w: renamed to channel.ul_power_w"),
        "{err}"
    );
    // A key inside the array of pairs: the second pair carries the old name.
    let at = text
        .rfind("verify_per_device_s")
        .expect("the config names verify_per_device_s");
    let old = format!(
        "{}verify_per_draft_s{}",
        &text[..at],
        &text[at + "verify_per_device_s".len()..]
    );
    let err = format!("{:#}", paper_a::Config::parse(&old).unwrap_err());
    assert!(
        err.starts_with("pairs[].verify_per_draft_s: renamed to pairs[].verify_per_device_s"),
        "{err}"
    );
    let bad = text.replacen("bandwidth_mhz = [5.0,", "bandwidth_mhz = [1e308,", 1);
    let err = format!("{:#}", paper_a::Config::parse(&bad).unwrap_err());
    assert!(
        err.starts_with("fig7.bandwidth_mhz[0]: 1e308 converts to inf"),
        "{err}"
    );
}
