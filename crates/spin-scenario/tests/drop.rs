//! Drop files: the examples resolve to SI units, unit pairs convert, the command line's model and seed win, and
//! every error names its field (with the position in the text where the field has one).

use spin_channel::units::{dbm_per_hz_to_w_per_hz, dbm_to_w};
use spin_scenario::drop::{DropModel, Fading, MAX_DROP_DEVICES, parse};

const A: &str = include_str!("../../../scenarios/examples/drop-paper-a.toml");
const B: &str = include_str!("../../../scenarios/examples/drop-paper-b.toml");

fn err(text: &str, model: Option<DropModel>) -> String {
    match parse(text, model, None) {
        Err(e) => e.to_string(),
        Ok(d) => panic!("accepted: {d:?}"),
    }
}

#[test]
fn the_examples_resolve_to_si_units() {
    let b = parse(B, None, None).unwrap();
    assert_eq!(b.model, DropModel::PaperB);
    assert_eq!((b.seed, b.devices), (7, 6));
    assert_eq!(b.fading, Fading::Rayleigh);
    assert_eq!(b.bandwidth_hz, 0.3e6);
    assert_eq!(b.ul_power_w, dbm_to_w(15.0));
    assert_eq!(b.noise_psd_server_w_per_hz, dbm_per_hz_to_w_per_hz(-169.0));
    let radio = b.paper_b.unwrap();
    assert_eq!(radio.dl_power_w, dbm_to_w(30.0));
    assert_eq!(radio.noise_psd_device_w_per_hz, dbm_per_hz_to_w_per_hz(-167.0));
    assert_eq!(radio.saa_samples, 300);
    assert_eq!(b.drop.path_loss.exponent, 3.5);
    let a = parse(A, None, Some(11)).unwrap();
    assert_eq!((a.model, a.seed, a.paper_b), (DropModel::PaperA, 11, None));
    assert_eq!(a.acceptance, vec![0.95, 0.9, 0.74, 0.6, 0.5]);
    let same = A.replace("acceptance = [0.95, 0.9, 0.74, 0.6, 0.5]", "acceptance = 0.8");
    assert_eq!(parse(&same, None, None).unwrap().acceptance, vec![0.8; 5]);
    let si = A.replace("bandwidth_mhz = 5.0", "bandwidth_hz = 5.0e6");
    assert_eq!(parse(&si, None, None).unwrap().bandwidth_hz, 5e6);
    let linear = A.replace("reference_gain_db = -30.0", "reference_gain = 1.0e-3");
    let gain = parse(&linear, None, None)
        .unwrap()
        .drop
        .path_loss
        .gain_at_reference_db;
    assert!((gain + 30.0).abs() < 1e-12, "{gain}");
}

#[test]
fn errors_name_the_field() {
    let e = err(&B.replace("devices = 6", "devices = 6\ndevicez = 1"), None);
    assert!(e.starts_with("devicez: unknown field `devicez`"), "{e}");
    assert!(e.contains("(line "), "{e}");
    let e = err(&B.replace("fading = \"rayleigh\"", "fading = \"rician\""), None);
    assert!(e.starts_with("fading: unknown variant `rician`"), "{e}");
    let e = err(
        &B.replace("ul_power_dbm = 15.0", "ul_power_dbm = 15.0\nul_power_w = 0.03"),
        None,
    );
    assert_eq!(
        e,
        "ul_power_w, ul_power_dbm: give exactly one of the pair, not both"
    );
    let e = err(&B.replace("bandwidth_mhz = 0.3", "bandwidth_hz = -1"), None);
    assert_eq!(e, "bandwidth_hz: -1 is not a finite positive number");
    let e = err(&B.replace("seed = 7\n", ""), None);
    assert!(e.starts_with("seed: missing"), "{e}");
    let e = err(&B.replace("model = \"paper-b\"\n", ""), None);
    assert!(e.starts_with("model: missing"), "{e}");
    let e = err(B, Some(DropModel::PaperA));
    assert_eq!(e, "dl_power: not used by a paper-a scenario");
    let e = err(&B.replace("saa_samples = 300", ""), None);
    assert_eq!(e, "saa_samples: missing (a paper-b scenario needs it)");
    let e = err(&B.replace("dl_power_dbm = 30.0", ""), None);
    assert_eq!(
        e,
        "dl_power_w, dl_power_dbm: missing (give exactly one of the pair)"
    );
    let e = err(
        &B.replace("devices = 6", &format!("devices = {}", MAX_DROP_DEVICES + 1)),
        None,
    );
    assert!(e.starts_with("devices: 100001 is outside"), "{e}");
    let e = err(
        &B.replace(
            "acceptance = [0.95, 0.9, 0.8, 0.6, 0.5, 0.4]",
            "acceptance = [0.9]",
        ),
        None,
    );
    assert_eq!(e, "acceptance: 1 values for 6 devices");
    let e = err(
        &B.replace("path_loss_exponent = 3.5", "path_loss_exponent = -1.0"),
        None,
    );
    assert!(e.starts_with("path_loss_exponent: -1 is not"), "{e}");
    let e = err(
        &B.replace(
            "reference_gain_db = -30.0",
            "reference_gain_db = -30.0\nreference_gain = 1e-3",
        ),
        None,
    );
    assert_eq!(
        e,
        "reference_gain_db, reference_gain: give exactly one of the pair, not both"
    );
    let e = err(
        &B.replace("reference_gain_db = -30.0", "reference_gain = 0.0"),
        None,
    );
    assert!(e.starts_with("reference_gain: 0 converts to -inf dB"), "{e}");
    let e = err("model = \n", None);
    assert!(e.starts_with("drop: malformed TOML at line 1"), "{e}");
}
