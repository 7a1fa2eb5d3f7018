//! Unified scenario files: every quantity in either unit of its pair (the SI spelling and the radio engineers'
//! one give the same round), both spellings at once refused naming the pair, and errors named by their field path.

use spin_channel::units::{db_to_linear, dbm_per_hz_to_w_per_hz, dbm_to_w};
use spin_optimize::round::PayloadPolicy;
use spin_scenario::{Format, Loaded, UnifiedScenario, parse};

const U: &str = include_str!("../../../scenarios/examples/unified.json");

fn unified(text: &str, format: Format) -> UnifiedScenario {
    match parse(text, format) {
        Ok(Loaded::Unified(u)) => u,
        Ok(other) => panic!("not unified: {other:?}"),
        Err(e) => panic!("refused: {e}"),
    }
}

fn err(text: &str) -> String {
    match parse(text, Format::Json) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted: {text}"),
    }
}

/// The example with the radio and the first two gains written in logarithmic units.
fn in_db() -> String {
    U.replacen("\"bandwidth_hz\": 1.0e7", "\"bandwidth_mhz\": 10", 1)
        .replacen("\"ul_power_w\": 0.0316", "\"ul_power_dbm\": 15", 1)
        .replacen("\"dl_power_w\": 1.0", "\"dl_power_dbm\": 30", 1)
        .replacen(
            "\"noise_psd_server_w_per_hz\": 1.26e-20",
            "\"noise_psd_server_dbm_per_hz\": -169",
            1,
        )
        .replacen(
            "\"noise_psd_device_w_per_hz\": 2.0e-20",
            "\"noise_psd_device_dbm_per_hz\": -167",
            1,
        )
        .replacen("\"uplink_gain\": 2.1e-10", "\"uplink_gain_db\": -96.8", 1)
        .replacen("\"downlink_gain\": 2.0e-11", "\"downlink_gain_db\": -107", 1)
}

/// The same file in SI units: the converted values written out exactly (`{:?}` prints the shortest round trip).
fn in_si() -> String {
    U.replacen(
        "\"ul_power_w\": 0.0316",
        &format!("\"ul_power_w\": {:?}", dbm_to_w(15.0)),
        1,
    )
    .replacen(
        "\"dl_power_w\": 1.0",
        &format!("\"dl_power_w\": {:?}", dbm_to_w(30.0)),
        1,
    )
    .replacen(
        "\"noise_psd_server_w_per_hz\": 1.26e-20",
        &format!(
            "\"noise_psd_server_w_per_hz\": {:?}",
            dbm_per_hz_to_w_per_hz(-169.0)
        ),
        1,
    )
    .replacen(
        "\"noise_psd_device_w_per_hz\": 2.0e-20",
        &format!(
            "\"noise_psd_device_w_per_hz\": {:?}",
            dbm_per_hz_to_w_per_hz(-167.0)
        ),
        1,
    )
    .replacen(
        "\"uplink_gain\": 2.1e-10",
        &format!("\"uplink_gain\": {:?}", db_to_linear(-96.8)),
        1,
    )
    .replacen(
        "\"downlink_gain\": 2.0e-11",
        &format!("\"downlink_gain\": {:?}", db_to_linear(-107.0)),
        1,
    )
}

#[test]
fn the_example_parses_and_builds_its_round() {
    let u = unified(U, Format::Json);
    assert_eq!(u.bandwidth_hz, 1e7);
    assert_eq!(u.payload, PayloadPolicy::Choose);
    assert_eq!(u.devices.len(), 6);
    assert_eq!(u.devices[2].downlink_gain, Some(2.0e-11));
    assert_eq!(u.devices[0].downlink_gain, None);
    let round = u.into_round().unwrap();
    assert_eq!(round.devices[0].downlink_gain, round.devices[0].uplink_gain);
    assert_eq!(round.devices[4].spectral_efficiency, 0.4);
}

/// Equal up to the last bit or two (a JSON parser's float reading need not be correctly rounded).
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 4.0 * f64::EPSILON * a.abs().max(b.abs())
}

fn assert_same(db: &UnifiedScenario, si: &UnifiedScenario) {
    assert_eq!(db.bandwidth_hz, si.bandwidth_hz);
    let (r, s) = (db.radio, si.radio);
    for (name, a, b) in [
        ("ul_power_w", r.ul_power_w, s.ul_power_w),
        ("dl_power_w", r.dl_power_w, s.dl_power_w),
        (
            "noise_psd_server_w_per_hz",
            r.noise_psd_server_w_per_hz,
            s.noise_psd_server_w_per_hz,
        ),
        (
            "noise_psd_device_w_per_hz",
            r.noise_psd_device_w_per_hz,
            s.noise_psd_device_w_per_hz,
        ),
    ] {
        assert!(same(a, b), "{name}: {a:e} vs {b:e}");
    }
    assert_eq!(db.devices.len(), si.devices.len());
    for (k, (a, b)) in db.devices.iter().zip(&si.devices).enumerate() {
        assert!(same(a.uplink_gain, b.uplink_gain), "devices[{k}].uplink_gain");
        match (a.downlink_gain, b.downlink_gain) {
            (Some(x), Some(y)) => assert!(same(x, y), "devices[{k}].downlink_gain"),
            (x, y) => assert_eq!(x, y, "devices[{k}].downlink_gain"),
        }
        assert_eq!((a.acceptance, a.draft_token_s), (b.acceptance, b.draft_token_s));
        assert_eq!(a.spectral_efficiency, b.spectral_efficiency);
    }
    let rest = |u: &UnifiedScenario| {
        (
            u.verify_fixed_s,
            u.verify_per_device_s,
            u.min_draft_len,
            u.max_draft_len,
            u.payload,
            u.format,
            u.charge_pairs,
            u.correction_split,
            u.saa_samples,
            u.seed,
        )
    };
    assert_eq!(rest(db), rest(si));
}

#[test]
fn unit_pairs_give_the_same_scenario_as_the_si_spelling() {
    let db = unified(&in_db(), Format::Json);
    let si = unified(&in_si(), Format::Json);
    assert_same(&db, &si);
    // Exact where the conversion is: MHz, and 30 dBm = 1 W.
    assert_eq!(db.bandwidth_hz, 1e7);
    assert_eq!(db.radio.dl_power_w, 1.0);
    assert!(same(db.radio.ul_power_w, dbm_to_w(15.0)));
    assert!(same(db.devices[0].uplink_gain, db_to_linear(-96.8)));
    assert!(same(db.devices[2].downlink_gain.unwrap(), db_to_linear(-107.0)));
    let (a, b) = (db.clone().into_round().unwrap(), si.into_round().unwrap());
    for (x, y) in a.devices.iter().zip(&b.devices) {
        assert!(same(x.spectral_efficiency, y.spectral_efficiency));
    }
    // TOML by the same rules.
    let value: toml::Value = serde_json::from_str(&in_db()).unwrap();
    let toml_text = toml::to_string(&value).unwrap();
    assert!(toml_text.contains("bandwidth_mhz") && toml_text.contains("uplink_gain_db"));
    assert_same(&unified(&toml_text, Format::Toml), &db);
}

#[test]
fn both_spellings_at_once_are_refused_naming_the_pair() {
    let both = U.replacen(
        "\"bandwidth_hz\": 1.0e7",
        "\"bandwidth_hz\": 1.0e7, \"bandwidth_mhz\": 10",
        1,
    );
    assert_eq!(
        err(&both),
        "bandwidth_hz, bandwidth_mhz: give exactly one of the pair, not both"
    );
    let both = U.replacen(
        "\"dl_power_w\": 1.0",
        "\"dl_power_w\": 1.0, \"dl_power_dbm\": 30",
        1,
    );
    assert_eq!(
        err(&both),
        "dl_power_w, dl_power_dbm: give exactly one of the pair, not both"
    );
    let both = U.replacen(
        "\"noise_psd_device_w_per_hz\": 2.0e-20",
        "\"noise_psd_device_w_per_hz\": 2.0e-20, \"noise_psd_device_dbm_per_hz\": -167",
        1,
    );
    assert_eq!(
        err(&both),
        "noise_psd_device_w_per_hz, noise_psd_device_dbm_per_hz: give exactly one of the pair, not both"
    );
    let both = U.replacen(
        "\"uplink_gain\": 4.0e-11",
        "\"uplink_gain\": 4.0e-11, \"uplink_gain_db\": -104",
        1,
    );
    assert_eq!(
        err(&both),
        "devices[1].uplink_gain, devices[1].uplink_gain_db: give exactly one of the pair, not both"
    );
    let both = U.replacen(
        "\"downlink_gain\": 2.0e-11",
        "\"downlink_gain\": 2.0e-11, \"downlink_gain_db\": -107",
        1,
    );
    assert_eq!(
        err(&both),
        "devices[2].downlink_gain, devices[2].downlink_gain_db: give exactly one of the pair, not both"
    );
    let neither = U.replacen("\"ul_power_w\": 0.0316,", "", 1);
    assert_eq!(
        err(&neither),
        "ul_power_w, ul_power_dbm: missing (give exactly one of the pair)"
    );
    let neither = U.replacen("\"uplink_gain\": 3.3e-12", "\"downlink_gain\": 3.3e-12", 1);
    assert_eq!(
        err(&neither),
        "devices[3].uplink_gain, devices[3].uplink_gain_db: missing (give exactly one of the pair)"
    );
}

#[test]
fn errors_name_the_field_path() {
    let e = err(&U.replacen("\"payload\": \"choose\"", "\"payload\": \"dists\"", 1));
    assert!(e.starts_with("payload: unknown variant `dists`"), "{e}");
    let e = err(&U.replacen("\"uplink_gain\": 9.5e-12", "\"uplink_gian\": 9.5e-12", 1));
    assert!(
        e.starts_with("devices[2].uplink_gian: unknown field `uplink_gian`"),
        "{e}"
    );
    let e = err(&U.replacen("\"seed\": 7,", "", 1));
    assert!(e.contains("missing field `seed`"), "{e}");
    let e = err(&U.replacen(
        "\"saa_samples\": 1000,",
        "\"saa_samples\": 1000, \"saa_samples\": 10,",
        1,
    ));
    assert!(e.starts_with("saa_samples: duplicate field `saa_samples`"), "{e}");
    let e = err(&U.replacen("\"uplink_gain\": 6.0e-13", "\"uplink_gain_db\": 9999", 1));
    assert!(
        e.starts_with("devices[5].uplink_gain_db: 9999 converts to inf"),
        "{e}"
    );
    let e = err(&U.replacen(
        "\"correction_split\": \"equal\"",
        "\"correction_split\": \"greedy\"",
        1,
    ));
    assert!(e.starts_with("correction_split: unknown variant `greedy`"), "{e}");
    // Values are checked when the round is built, by the field's name.
    let u = unified(
        &U.replacen("\"uplink_gain\": 4.0e-11", "\"uplink_gain\": -1", 1),
        Format::Json,
    );
    let e = u.into_round().unwrap_err().to_string();
    assert!(e.starts_with("devices[1].uplink_gain: -1 is outside"), "{e}");
    let u = unified(
        &U.replacen("\"quant_bits\": 16", "\"quant_bits\": 99", 1),
        Format::Json,
    );
    assert!(
        u.into_round()
            .unwrap_err()
            .to_string()
            .starts_with("quant_bits: 99 is outside")
    );
    let u = unified(
        &U.replacen(
            "\"max_draft_len\"",
            "\"verify_per_draft_token_s\": -0.001,\n  \"max_draft_len\"",
            1,
        ),
        Format::Json,
    );
    let e = u.into_round().unwrap_err().to_string();
    assert!(e.starts_with("verify_per_draft_token_s: -0.001"), "{e}");
}

#[test]
fn a_price_per_drafted_token_reaches_the_round() {
    let u = unified(
        &U.replacen(
            "\"max_draft_len\"",
            "\"verify_per_draft_token_s\": 0.0006,\n  \"max_draft_len\"",
            1,
        ),
        Format::Json,
    );
    assert_eq!(u.verify_per_draft_token_s, 0.0006);
    let round = u.into_round().unwrap();
    assert_eq!(round.verify_per_draft_token_s, 0.0006);
    assert!((round.verify_s_at(&[2, 0, 1, 0, 0, 1]) - round.verify_s() - 4.0 * 0.0006).abs() < 1e-15);
    assert_eq!(unified(U, Format::Json).verify_per_draft_token_s, 0.0);
}

#[test]
fn optional_fields_take_their_documented_defaults() {
    let bare = U
        .replacen("\"min_draft_len\": 0,", "", 1)
        .replacen("\"payload\": \"choose\",", "", 1)
        .replacen("\"charge_pairs\": true,", "", 1)
        .replacen("\"correction_split\": \"equal\",", "", 1);
    assert_eq!(unified(&bare, Format::Json), unified(U, Format::Json));
    let pairs_free = unified(
        &U.replacen("\"charge_pairs\": true", "\"charge_pairs\": false", 1),
        Format::Json,
    );
    assert_eq!(pairs_free.into_round().unwrap().payload.pair_bits, 0.0);
}
