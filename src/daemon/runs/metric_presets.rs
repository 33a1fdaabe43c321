//! Training frameworks' own log lines read as metrics, without a profile pattern: Hugging Face
//! `transformers.Trainer`'s log dicts, PyTorch Lightning's progress bar, torchtitan's step
//! lines (`[metrics] preset` in docs/profiles.md). A run's output is tried against every
//! preset until one matches (`auto`), or against the one its profile names.
//!
//! Pure functions of one line: no state, no I/O. What a line leaves out stays absent (a
//! Trainer's log dict has no step; a Lightning bar has no batch size, so no samples/s).

use std::sync::LazyLock;

use regex::Regex;

use crate::profile::MetricsPreset;
use crate::protocol::MetricsReport;
use crate::training::ReportScope;

/// The presets `auto` tries, in this order.
pub const DETECTABLE: [MetricsPreset; 3] = [
    MetricsPreset::Transformers,
    MetricsPreset::Lightning,
    MetricsPreset::Torchtitan,
];

/// One line read by `preset` (the newest redraw of a line that a progress bar rewrote with
/// `\r`); None when it is not that framework's metrics line.
pub fn parse(preset: MetricsPreset, line: &str) -> Option<MetricsReport> {
    let line = line.rsplit('\r').next().unwrap_or(line).trim();
    match preset {
        MetricsPreset::Transformers => transformers(line),
        MetricsPreset::Lightning => lightning(line),
        MetricsPreset::Torchtitan => torchtitan(line),
        MetricsPreset::Auto | MetricsPreset::None => None,
    }
}

/// The first detectable preset that reads `line`, with its report.
pub fn detect(line: &str) -> Option<(MetricsPreset, MetricsReport)> {
    DETECTABLE
        .into_iter()
        .find_map(|p| parse(p, line).map(|r| (p, r)))
}

/// A number as Python prints one (`0.6931`, `4.5e-05`, `nan`, `inf`).
fn py_number(text: &str) -> Option<f64> {
    text.trim().parse::<f64>().ok()
}

/// `Trainer.log`'s dict as `PrinterCallback`/`ProgressCallback` print it, the repr of a dict of
/// numbers: `{'loss': 0.6931, 'grad_norm': 1.52, 'learning_rate': 4.5e-05, 'epoch': 0.5}`, and
/// the run's last, `{'train_runtime': 3.2, 'train_samples_per_second': 40.1, …}`. It is
/// printed by the main process only; its throughput is the whole job's.
fn transformers(line: &str) -> Option<MetricsReport> {
    static PAIR: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^'([A-Za-z_][A-Za-z0-9_]*)': ([-+0-9.eE]+|nan|inf|-inf)$").expect("valid")
    });
    let body = line.strip_prefix('{')?.strip_suffix('}')?;
    let mut r = MetricsReport::default();
    let mut known = false;
    for pair in body.split(", ") {
        let caps = PAIR.captures(pair.trim())?;
        let (key, value) = (&caps[1], py_number(&caps[2])?);
        if !value.is_finite() {
            continue;
        }
        match key {
            "loss" => {
                r.loss = Some(value);
                known = true;
            }
            "learning_rate" => {
                r.extra.insert("lr".into(), value);
                known = true;
            }
            // Fractional: the Trainer counts epochs by steps. The whole epoch it is in.
            "epoch" => r.epoch = (value >= 0.0).then(|| value.floor() as u64),
            "train_samples_per_second" => {
                r.samples_per_s = Some(value);
                r.scope = Some(ReportScope::Job);
                known = true;
            }
            "train_loss" | "train_runtime" | "eval_loss" => {
                r.extra.insert(key.into(), value);
                known = true;
            }
            other => {
                r.extra.insert(other.into(), value);
            }
        }
    }
    // A dict of numbers only, and one the Trainer logs: not any dict a script prints.
    (known && !r.is_empty()).then_some(r)
}

/// Lightning's `TQDMProgressBar` training bar, on stdout:
/// `Epoch 0:  45%|████▌     | 45/100 [00:02<00:02, 19.85it/s, v_num=0, train_loss=0.693]`.
/// The step is the batches of earlier epochs plus this one's; `it/s` is steps per second.
fn lightning(line: &str) -> Option<MetricsReport> {
    static BAR: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"^Epoch (?P<epoch>\d+):\s+\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+|\?)\s*\[[^,\]]*(?:,\s*(?P<rate>[0-9.]+)(?P<unit>it/s|s/it))?(?P<post>[^\]]*)\]",
        )
        .expect("valid")
    });
    let caps = BAR.captures(line)?;
    let epoch: u64 = caps["epoch"].parse().ok()?;
    let n: u64 = caps["n"].parse().ok()?;
    if n == 0 {
        // No batch of this epoch yet; and Lightning resets its bar at an epoch's end under
        // the old epoch's label: such a line says nothing new.
        return None;
    }
    let mut r = MetricsReport {
        epoch: Some(epoch),
        ..MetricsReport::default()
    };
    // The step before the first batch of the run is none at all.
    if let Ok(total) = caps["total"].parse::<u64>() {
        let done = epoch.checked_mul(total)?.checked_add(n)?;
        r.step = done.checked_sub(1);
    }
    if let Some(rate) = caps.name("rate").and_then(|m| py_number(m.as_str())) {
        if rate > 0.0 {
            r.step_time_s = Some(if &caps["unit"] == "it/s" {
                1.0 / rate
            } else {
                rate
            });
        }
    }
    for item in caps["post"].split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            continue;
        };
        let Some(value) = py_number(value).filter(|v| v.is_finite()) else {
            continue;
        };
        match key.trim() {
            "v_num" => {}
            "loss" | "train_loss" | "train_loss_step" => r.loss = Some(value),
            other => {
                r.extra.insert(other.to_string(), value);
            }
        }
    }
    Some(r)
}

/// torchtitan's step line (colours and all, under torchrun's `[rankN]:` prefix):
/// `step: 10  loss:  7.8263  memory: 12.41GiB(15.66%)  tps: 1,234  tflops: 52.3  mfu: 5.29%`
/// (older releases say `wps` for tokens per second). Its throughput is the rank's own.
fn torchtitan(line: &str) -> Option<MetricsReport> {
    static ANSI: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\x1b\[[0-9;]*m").expect("valid"));
    static STEP: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+0-9.eE]+|nan)(?:\s+memory:\s*(?P<mem>[0-9.]+)GiB(?:\((?P<mem_pct>[0-9.]+)%\))?)?(?:\s+(?:tps|wps):\s*(?P<tps>[0-9,]+))?(?:\s+tflops:\s*(?P<tflops>[0-9.]+))?(?:\s+mfu:\s*(?P<mfu>[0-9.]+)%)?",
        )
        .expect("valid")
    });
    let plain = ANSI.replace_all(line, "");
    let caps = STEP.captures(&plain)?;
    let mut r = MetricsReport {
        step: caps["step"].parse().ok(),
        loss: py_number(&caps["loss"]).filter(|v| v.is_finite()),
        ..MetricsReport::default()
    };
    let mut extra = |key: &str, group: &str| {
        if let Some(v) = caps
            .name(group)
            .and_then(|m| py_number(&m.as_str().replace(',', "")))
        {
            r.extra.insert(key.into(), v);
        }
    };
    extra("memory_gib", "mem");
    extra("memory_pct", "mem_pct");
    extra("tokens_per_s", "tps");
    extra("tflops", "tflops");
    extra("mfu_pct", "mfu");
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printed by transformers 4.40.2's `PrinterCallback` (`print(logs)`) for a tiny BERT
    /// (examples/train_transformers.py).
    #[test]
    fn transformers_log_dicts() {
        let r = parse(
            MetricsPreset::Transformers,
            "{'loss': 0.6955, 'grad_norm': 0.5779461860656738, 'learning_rate': 4.375e-05, 'epoch': 1.25}",
        )
        .unwrap();
        assert_eq!(r.loss, Some(0.6955));
        assert_eq!(r.epoch, Some(1));
        assert_eq!(r.extra.get("lr"), Some(&4.375e-05));
        assert_eq!(r.extra.get("grad_norm"), Some(&0.5779461860656738));
        assert_eq!(r.step, None, "the printed dict has no step");
        let end = parse(
            MetricsPreset::Transformers,
            "{'train_runtime': 0.0959, 'train_samples_per_second': 667.388, 'train_steps_per_second': 83.423, 'train_loss': 0.6922338604927063, 'epoch': 2.0}",
        )
        .unwrap();
        assert_eq!(end.samples_per_s, Some(667.388));
        assert_eq!(end.scope, Some(ReportScope::Job));
        assert_eq!(end.loss, None, "the run's mean loss is not a step's");
        assert_eq!(end.extra.get("train_loss"), Some(&0.6922338604927063));
        // Under tqdm the dict is written between redraws of the bar.
        let r = parse(
            MetricsPreset::Transformers,
            " 10%|█         | 2/20 [00:01<00:09,  1.9it/s]\r{'loss': 0.7, 'learning_rate': 1e-05, 'epoch': 0.1}",
        )
        .unwrap();
        assert_eq!(r.loss, Some(0.7));
        // A NaN loss is left out, the rest kept.
        let r = parse(
            MetricsPreset::Transformers,
            "{'loss': nan, 'learning_rate': 1e-05, 'epoch': 0.1}",
        )
        .unwrap();
        assert_eq!((r.loss, r.extra.get("lr")), (None, Some(&1e-05)));
        for not_it in [
            "{'name': 'bert', 'loss': 0.5}",
            "{'accuracy': 0.5}",
            "{'loss': 0.5",
            r#"{"loss": 0.5}"#,
            "{}",
        ] {
            assert!(
                parse(MetricsPreset::Transformers, not_it).is_none(),
                "{not_it}"
            );
        }
    }

    /// Lightning 2.x's `TQDMProgressBar` (`BAR_FORMAT` with `rate_noinv_fmt` and the postfix of
    /// `prog_bar` metrics), redrawn with `\r` until the epoch ends.
    #[test]
    fn lightning_progress_bars() {
        let line = "Epoch 0:  45%|████▌     | 45/100 [00:02<00:02, 19.85it/s, v_num=0, train_loss=0.693]\rEpoch 0:  46%|████▌     | 46/100 [00:02<00:02, 19.90it/s, v_num=0, train_loss=0.690]";
        let r = parse(MetricsPreset::Lightning, line).unwrap();
        assert_eq!((r.epoch, r.step, r.loss), (Some(0), Some(45), Some(0.690)));
        assert!((r.step_time_s.unwrap() - 1.0 / 19.90).abs() < 1e-12);
        assert!(r.extra.is_empty(), "v_num is no metric: {:?}", r.extra);
        let r = parse(
            MetricsPreset::Lightning,
            "Epoch 2: 100%|██████████| 100/100 [01:40<00:00,  1.52s/it, v_num=3, train_loss_step=0.41, val_acc=0.8, train_loss_epoch=0.45]",
        )
        .unwrap();
        assert_eq!((r.epoch, r.step, r.loss), (Some(2), Some(299), Some(0.41)));
        assert_eq!(r.step_time_s, Some(1.52));
        assert_eq!(r.extra.get("val_acc"), Some(&0.8));
        assert_eq!(r.extra.get("train_loss_epoch"), Some(&0.45));
        // An iterable of unknown length.
        let r = parse(
            MetricsPreset::Lightning,
            "Epoch 1: |          | 7/? [00:00<00:00, 30.01it/s, v_num=1]",
        );
        assert!(r.is_none(), "no percentage, not the bar format: {r:?}");
        let r = parse(
            MetricsPreset::Lightning,
            "Epoch 1:   0%|          | 7/? [00:00<00:00, 30.01it/s, v_num=1]",
        )
        .unwrap();
        assert_eq!((r.epoch, r.step), (Some(1), None));
        assert!(
            parse(
                MetricsPreset::Lightning,
                "Validation DataLoader 0:  50%|█| 1/2 [00:00<00:00]"
            )
            .is_none()
        );
        assert!(parse(MetricsPreset::Lightning, "Epoch 0 done").is_none());
        // Printed by Lightning 2.5.6 (examples/train_lightning.py, no logger: no v_num), the
        // bar at an epoch's end, reset under the old label, then the next epoch's.
        assert!(
            parse(
                MetricsPreset::Lightning,
                "Epoch 0:   0%|          | 0/32 [00:00<?, ?it/s, train_loss=5.070]          "
            )
            .is_none()
        );
        let r = parse(
            MetricsPreset::Lightning,
            "Epoch 1: 100%|██████████| 8/8 [00:00<00:00, 548.53it/s, train_loss=8.110]",
        )
        .unwrap();
        assert_eq!((r.epoch, r.step, r.loss), (Some(1), Some(15), Some(8.11)));
    }

    /// torchtitan's `train.py` log line through its colour codes and torchrun's rank prefix
    /// (taken off before, by `split_rank`), in the newer `tps`/`tflops` and older `wps` forms.
    #[test]
    fn torchtitan_step_lines() {
        let line = "[titan] 2025-01-20 10:00:00,123 - root - INFO - \x1b[36mstep: 10  \x1b[32mloss:  7.8263  \x1b[33mmemory: 12.41GiB(15.66%)  \x1b[34mtps: 1,234  \x1b[36mtflops: 52.30  \x1b[35mmfu: 5.29%\x1b[39m";
        let r = parse(MetricsPreset::Torchtitan, line).unwrap();
        assert_eq!((r.step, r.loss), (Some(10), Some(7.8263)));
        assert_eq!(r.extra.get("tokens_per_s"), Some(&1234.0));
        assert_eq!(r.extra.get("memory_gib"), Some(&12.41));
        assert_eq!(r.extra.get("memory_pct"), Some(&15.66));
        assert_eq!(r.extra.get("tflops"), Some(&52.3));
        assert_eq!(r.extra.get("mfu_pct"), Some(&5.29));
        let r = parse(
            MetricsPreset::Torchtitan,
            "2024-05-01 12:00:00,123 - root - INFO - step:  1  loss: 12.2345  memory: 35.12GiB(44.33%)  wps: 812  mfu: 12.34%",
        )
        .unwrap();
        assert_eq!((r.step, r.loss), (Some(1), Some(12.2345)));
        assert_eq!(r.extra.get("tokens_per_s"), Some(&812.0));
        assert!(parse(MetricsPreset::Torchtitan, "step 10 loss 1.0").is_none());
    }

    #[test]
    fn detection_names_the_framework() {
        let (p, _) = detect("{'loss': 0.5, 'learning_rate': 5e-05, 'epoch': 0.2}").unwrap();
        assert_eq!(p, MetricsPreset::Transformers);
        let (p, _) =
            detect("Epoch 0:  10%|█         | 1/10 [00:00<00:01,  8.00it/s, v_num=0]").unwrap();
        assert_eq!(p, MetricsPreset::Lightning);
        let (p, _) =
            detect("step:  5  loss:  9.1000  memory: 1.00GiB(2.00%)  tps: 100  mfu: 0.10%")
                .unwrap();
        assert_eq!(p, MetricsPreset::Torchtitan);
        assert!(detect("loading the model").is_none());
        assert!(parse(MetricsPreset::None, "{'loss': 0.5, 'epoch': 0.2}").is_none());
    }
}
