use super::*;

fn err(text: &str) -> ScenarioError {
    Scenario::parse(text, "s.toml").expect_err("should be rejected")
}

#[test]
fn count_and_model() {
    let s = Scenario::parse("count = 8\nmodel = \"h100\"\n", "s.toml").unwrap();
    assert_eq!(s.node.gpus.len(), 8);
    assert!(s.node.gpus.iter().all(|g| g == "h100-sxm"));
    assert_eq!(s.driver_version, DEFAULT_DRIVER_VERSION);
    assert_eq!(s.cuda_driver_version, DEFAULT_CUDA_DRIVER_VERSION);
    assert!(
        s.training.iter().all(Option::is_none),
        "no [training] table means idle GPUs"
    );
}

#[test]
fn training_and_overrides() {
    let s = Scenario::parse(
        r#"
gpus = ["h100-sxm", "h100-sxm", "h100-sxm"]
seed = 7
step_s = 0.05
[training]
model = "resnet50"
batch_size = 128
[[per_gpu]]
gpu = 1
idle = true
[[per_gpu]]
gpu = 2
power_limit_w = 400.0
persistence = true
"#,
        "s.toml",
    )
    .unwrap();
    assert_eq!(s.node.seed, 7);
    assert_eq!(s.node.step_s, 0.05);
    assert_eq!(s.training[0].as_ref().unwrap().batch_size, 128);
    assert_eq!(s.training[0].as_ref().unwrap().prefetch_depth, 2);
    assert!(s.training[1].is_none());
    assert_eq!(s.power_limit_w[2], Some(400.0));
    assert_eq!(s.persistence[2], Some(true));
}

#[test]
fn unknown_key_is_located() {
    let e = err("count = 2\nmodle = \"h100\"\n");
    assert_eq!((e.line, e.column), (2, 1), "{e}");
    assert!(e.message.contains("modle"), "{e}");
    assert!(e.to_string().starts_with("s.toml:2:1: "), "{e}");
}

#[test]
fn unknown_gpu_and_model_are_located() {
    let e = err("gpus = [\"h100-sxm\", \"b999\"]\n");
    assert_eq!((e.line, e.column), (1, 21), "{e}");
    assert!(e.message.contains("unknown GPU `b999`"), "{e}");
    let e = err("count = 1\n[training]\nmodel = \"llama-9000\"\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("llama-9000"), "{e}");
}

#[test]
fn faults_resolve_and_validate() {
    let s = Scenario::parse(
        r#"
count = 4
[[faults]]
kind = "gpu_lost"
gpu = 2
at_s = 5.0
[[faults]]
kind = "not_supported"
functions = ["nvmlDeviceGetFanSpeed"]
[[faults]]
kind = "slow"
functions = ["nvmlDeviceGetPowerUsage"]
delay_ms = 200
gpu = 1
[[faults]]
kind = "no_permission"
[[faults]]
kind = "power_limit_zero"
gpu = 1
"#,
        "s.toml",
    )
    .unwrap();
    assert_eq!(s.faults.len(), 5);

    let e = err("count = 2\n[[faults]]\nkind = \"gpu_lost\"\ngpu = 5\n");
    assert_eq!(e.line, 4, "{e}");
    let e = err(
        "count = 2\n[[faults]]\nkind = \"slow\"\nfunctions = [\"nvmlDeviceGetFoo\"]\ndelay_ms = 1\n",
    );
    assert!(e.message.contains("nvmlDeviceGetFoo"), "{e}");
    assert_eq!(e.line, 4, "{e}");
    let e =
        err("count = 2\n[[faults]]\nkind = \"slow\"\nfunctions = [\"nvmlDeviceGetPowerUsage\"]\n");
    assert!(e.message.contains("delay_ms"), "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"exploded\"\n");
    assert!(e.message.contains("unknown fault kind"), "{e}");
    assert!(e.message.contains("wild_readings"), "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"wild_readings\"\n");
    assert!(
        e.message
            .contains("needs `energy_offset_mj or power_limit_mw`"),
        "{e}"
    );
    let e = err("count = 2\n[[faults]]\nkind = \"wild_readings\"\npower_limit_mw = -1\n");
    assert!(e.message.contains("unsigned 32 bits"), "{e}");
    assert_eq!(e.line, 4, "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"gpu_lost\"\ngpu = 0\npower_limit_mw = 5\n");
    assert!(e.message.contains("takes no `power_limit_mw`"), "{e}");
    let s = Scenario::parse(
        "count = 2\n[[faults]]\nkind = \"wild_readings\"\ngpu = 1\nat_s = 3.0\nenergy_offset_mj = -5\n",
        "s.toml",
    )
    .unwrap();
    assert_eq!(s.faults.energy_offset_mj(1, 2.9), 0);
    assert_eq!(s.faults.energy_offset_mj(1, 3.0), -5);
    assert_eq!(s.faults.energy_offset_mj(0, 3.0), 0);
    assert_eq!(s.faults.wild_power_limit_mw(1, 3.0), None);
    let e = err(
        "count = 2\n[[faults]]\nkind = \"no_permission\"\nfunctions = [\"nvmlDeviceGetPowerUsage\"]\n",
    );
    assert!(e.message.contains("not a setter"), "{e}");
}

#[test]
fn a_cooling_fault_is_physics_for_gpusim() {
    let s = Scenario::parse(
        "count = 4\n[[faults]]\nkind = \"cooling\"\ngpu = 2\nat_s = 30.0\nthermal_resistance_scale = 3.0\n",
        "s.toml",
    )
    .unwrap();
    assert!(s.faults.is_empty(), "no NVML fault");
    assert_eq!(
        s.cooling,
        [gpusim::CoolingFault {
            gpu: 2,
            at_s: 30.0,
            thermal_resistance_scale: 3.0
        }]
    );
    let e = err("count = 2\n[[faults]]\nkind = \"cooling\"\ngpu = 1\n");
    assert!(
        e.message.contains("needs `thermal_resistance_scale`"),
        "{e}"
    );
    let e = err(
        "count = 2\n[[faults]]\nkind = \"cooling\"\ngpu = 1\nthermal_resistance_scale = 99.0\n",
    );
    assert!(e.message.contains("within 0.5..=10"), "{e}");
    assert_eq!(e.line, 5, "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"cooling\"\nthermal_resistance_scale = 2.0\n");
    assert!(e.message.contains("needs `gpu`"), "{e}");
    let e = err(
        "count = 2\n[[faults]]\nkind = \"gpu_lost\"\ngpu = 1\nthermal_resistance_scale = 2.0\n",
    );
    assert!(
        e.message.contains("takes no `thermal_resistance_scale`"),
        "{e}"
    );
}

#[test]
fn out_of_range_values() {
    assert!(err("count = 0\n").message.contains("1 to 64"));
    assert!(err("count = 65\n").message.contains("1 to 64"));
    assert!(err("step_s = 0.0\n").message.contains("step_s"));
    let e = err("count = 1\n[[per_gpu]]\ngpu = 0\npower_limit_w = 5000.0\n");
    assert!(e.message.contains("outside"), "{e}");
    assert_eq!(e.line, 4, "{e}");
}

#[test]
fn shipped_scenarios_parse() {
    let default = Scenario::parse(
        include_str!("../../scenarios/default-4xh100.toml"),
        "default-4xh100.toml",
    )
    .unwrap();
    let builtin = Scenario::builtin();
    assert_eq!(
        default.node, builtin.node,
        "the file spells out the built-in node"
    );
    assert_eq!(default.training, builtin.training);
    let eight =
        Scenario::parse(include_str!("../../scenarios/8xh100.toml"), "8xh100.toml").unwrap();
    assert_eq!(eight.node.gpus.len(), 8);
    assert!(eight.training[7].is_none() && eight.training[6].is_some());
    assert_eq!(eight.activity, Some(gpusim::Activity::default()));
    assert_eq!(default.activity, None, "the built-in node is steady");
    let faults =
        Scenario::parse(include_str!("../../scenarios/faults.toml"), "faults.toml").unwrap();
    assert_eq!(faults.faults.len(), 6);
    let straggler = Scenario::parse(
        include_str!("../../scenarios/straggler-4xh100.toml"),
        "straggler-4xh100.toml",
    )
    .unwrap();
    assert_eq!(straggler.cooling.len(), 1);
    assert!(straggler.faults.is_empty());
}

#[test]
fn builtin_is_gpusims_default() {
    let s = Scenario::builtin();
    assert_eq!(s.node, NodeConfig::default());
    assert_eq!(s.training.len(), s.node.gpus.len());
}

#[test]
fn ecc_errors_per_gpu() {
    let s = Scenario::parse(
        "count = 2\n[[per_gpu]]\ngpu = 1\necc_corrected = 12\necc_uncorrected = 3\n",
        "s.toml",
    )
    .unwrap();
    assert_eq!(s.ecc_errors[0], EccErrors::default());
    assert_eq!(
        s.ecc_errors[1],
        EccErrors {
            corrected: 12,
            uncorrected: 3
        }
    );
    assert!(
        err("count = 1\n[[per_gpu]]\ngpu = 0\necc_uncorrected = -1\n")
            .message
            .contains("invalid value")
    );
}

#[test]
fn doctor_scenarios_parse() {
    let ok = Scenario::parse(
        include_str!("../../scenarios/doctor-compatible.toml"),
        "doctor-compatible.toml",
    )
    .unwrap();
    assert_eq!(
        (ok.driver_version.as_str(), ok.cuda_driver_version),
        ("550.54.15", 12040)
    );
    assert!(ok.persistence.iter().all(|p| *p == Some(true)));
    let old = Scenario::parse(
        include_str!("../../scenarios/doctor-old-driver.toml"),
        "doctor-old-driver.toml",
    )
    .unwrap();
    assert_eq!(
        (old.driver_version.as_str(), old.cuda_driver_version),
        ("470.57.02", 11040)
    );
    assert_eq!(old.power_limit_w[1], Some(250.0));
    assert_eq!(old.ecc_errors[1].uncorrected, 2);
    let v100 = Scenario::parse(
        include_str!("../../scenarios/v100-retired-pages.toml"),
        "v100-retired-pages.toml",
    )
    .unwrap();
    assert_eq!(v100.health[0], Health::default());
    assert_eq!(
        (
            v100.health[1].retired_pages_sbe,
            v100.health[1].retired_pages_dbe,
            v100.health[1].retired_pages_pending
        ),
        (3, 2, true)
    );
}

#[test]
fn health_per_gpu() {
    let s = Scenario::parse(
        "count = 2\n[[per_gpu]]\ngpu = 1\nremapped_correctable = 3\nremap_failure = true\n\
         pcie_link_gen = 3\npcie_link_width = 4\npcie_replays_per_min = 2.5\n",
        "s.toml",
    )
    .unwrap();
    assert_eq!(s.health[0], Health::default());
    assert_eq!(
        s.health[1],
        Health {
            remapped_correctable: 3,
            remap_failure: true,
            pcie_link_gen: Some(3),
            pcie_link_width: Some(4),
            pcie_replays_per_min: 2.5,
            ..Health::default()
        }
    );
    for (bad, says) in [
        ("pcie_link_gen = 6", "outside h100-sxm's 1..=5"),
        ("pcie_link_gen = 0", "outside"),
        ("pcie_link_width = 12", "not a PCIe width"),
        (
            "pcie_link_width = 32",
            "not a PCIe width up to h100-sxm's x16",
        ),
        ("pcie_replays_per_min = -1.0", "0 or more"),
    ] {
        let e = err(&format!("count = 1\n[[per_gpu]]\ngpu = 0\n{bad}\n"));
        assert!(e.message.contains(says), "{bad}: {}", e.message);
    }
}

#[test]
fn activity_keys_default_to_the_busy_node_and_bad_ones_are_located() {
    let s = Scenario::parse("count = 1\n[activity]\nstalls_per_min = 6\n", "t.toml").unwrap();
    let a = s.activity.unwrap();
    assert_eq!(a.stalls_per_min, 6.0);
    assert_eq!(
        a.intensity_sigma,
        gpusim::Activity::default().intensity_sigma
    );

    let e = Scenario::parse("count = 1\n[activity]\neval_busy = 2.0\n", "t.toml").unwrap_err();
    assert_eq!((e.line, e.file.as_str()), (2, "t.toml"));
    assert!(e.message.contains("eval_busy"), "{}", e.message);
    let e = Scenario::parse("count = 1\n[activity]\nsigma = 0.1\n", "t.toml").unwrap_err();
    assert!(e.message.contains("unknown field"), "{}", e.message);
}

#[test]
fn xid_faults_once_and_repeating_and_their_mistakes_located() {
    let s = Scenario::parse(
        r#"
count = 2
[[faults]]
kind = "xid"
gpu = 1
xid = 79
at_s = 30
[[faults]]
kind = "xid"
xid = 13
every_s = 5
"#,
        "s.toml",
    )
    .unwrap();
    // Strictly after the start: (0, 30].
    assert_eq!(
        s.faults.xids_between(1, 0.0, 30.0),
        vec![
            (5.0, 13),
            (10.0, 13),
            (15.0, 13),
            (20.0, 13),
            (25.0, 13),
            (30.0, 79),
            (30.0, 13)
        ]
    );
    assert_eq!(s.faults.xids_between(0, 29.0, 31.0), vec![(30.0, 13)]);

    let e = err("count = 2\n[[faults]]\nkind = \"xid\"\ngpu = 0\n");
    assert!(e.message.contains("needs `xid`"), "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"xid\"\nxid = 79\nevery_s = 0\n");
    assert!(e.message.contains("every_s"), "{e}");
    assert_eq!(e.line, 5, "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"gpu_lost\"\ngpu = 0\nxid = 79\n");
    assert!(e.message.contains("takes no `xid`"), "{e}");
    let e = err("count = 2\n[[faults]]\nkind = \"xid\"\nxid = 79\ndelay_ms = 3\n");
    assert!(e.message.contains("takes no `delay_ms`"), "{e}");
}

#[test]
fn a_measured_curve_covers_the_gpus_range_and_its_power_is_drawn() {
    let text = r#"
model = "rtx-6000"
count = 1
[training]
model = "resnet50"
[[per_gpu]]
gpu = 0
measured_curve = [[100.0, 20.0, 99.0], [260.0, 10.0, 250.0]]
"#;
    let s = Scenario::parse(text, "s.toml").unwrap();
    let (curve, noise) = s.measured[0].clone().unwrap();
    assert_eq!(
        (curve.range_w(), noise),
        ((100.0, 260.0), DEFAULT_MEASURED_NOISE)
    );
    // On a node: the curve's power at the limit, within the noise, while it trains.
    let (mut node, _) = crate::context::fresh_node_for_tests(&s).unwrap();
    node.gpu_mut(0).unwrap().set_power_limit_w(180.0).unwrap();
    node.advance_to(5.0);
    let p = node.gpus()[0].reading().power_w;
    let want = curve.at(180.0).1;
    assert!((p / want - 1.0).abs() <= 0.02 + 1e-9, "{p} vs {want}");
    for (bad, says) in [
        (
            "measured_curve = [[150.0, 20.0, 99.0], [260.0, 10.0, 250.0]]",
            "not rtx-6000's whole range 100..=260 W",
        ),
        (
            "measured_curve = [[100.0, 20.0, 99.0], [260.0, 10.0, 250.0]]\nmeasured_noise = 0.9",
            "measured_noise must be in 0..0.5",
        ),
        ("measured_noise = 0.01", "needs a measured_curve"),
        (
            "measured_curve = [[100.0, 20.0, 99.0]]",
            "at least two limits",
        ),
    ] {
        let text = format!("model = \"rtx-6000\"\ncount = 1\n[[per_gpu]]\ngpu = 0\n{bad}\n");
        let e = err(&text);
        assert!(e.message.contains(says), "{bad}: {e}");
    }
}
