use std::collections::BTreeMap;

use super::*;
use crate::history::{Metric, Point};
use crate::training::{MetricsPoint, MetricsReport};

fn point(t: f64, v: f64) -> Point {
    Point {
        t,
        min: v,
        mean: v,
        max: v,
    }
}

/// Two GPUs: power on both, temperature on GPU 0 only, and GPU 1's power missing a step.
fn gpu_table() -> Table {
    gpus::table::<()>(&[0, 1], 100.0, 0.5, 3, |gpu, m, from, to, n| {
        assert_eq!((from, to, n), (100.0, 101.5, 3));
        Ok(match (gpu, m) {
            (_, Metric::Power) => (0..3)
                .filter(|i| gpu == 0 || *i != 1)
                .map(|i| point(100.25 + 0.5 * i as f64, 200.0 + f64::from(gpu) + i as f64))
                .collect(),
            (0, Metric::Temperature) => vec![point(100.25, 61.5)],
            _ => Vec::new(),
        })
    })
    .unwrap()
}

#[test]
fn gpu_rows_line_up_by_time_and_gpu_with_units_in_the_names() {
    let t = gpu_table();
    let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "time",
            "gpu",
            "util_gpu_pct",
            "util_mem_pct",
            "memory_used_bytes",
            "temperature_c",
            "power_w",
            "power_limit_w",
            "sm_clock_mhz",
            "fan_pct",
            "pcie_rx_kbps",
            "pcie_tx_kbps",
            "power_limited_share",
            "thermal_limited_share"
        ]
    );
    assert_eq!(t.rows(), 5, "GPU 1 has no row where it has no sample");
    assert_eq!(
        t.column("time").unwrap().cells,
        Cells::Time(vec![100.25, 100.25, 100.75, 101.25, 101.25])
    );
    assert_eq!(
        t.column("gpu").unwrap().cells,
        Cells::I64(vec![Some(0), Some(1), Some(0), Some(0), Some(1)])
    );
    assert_eq!(
        t.column("power_w").unwrap().cells,
        Cells::F64(vec![
            Some(200.0),
            Some(201.0),
            Some(201.0),
            Some(202.0),
            Some(203.0)
        ])
    );
    assert_eq!(
        t.column("temperature_c").unwrap().cells,
        Cells::F64(vec![Some(61.5), None, None, None, None])
    );
}

#[test]
fn a_long_window_is_asked_for_in_chunks_on_one_grid() {
    let steps = u64::from(gpus::CHUNK) * 2 + 10;
    let mut asked = Vec::new();
    gpus::table::<()>(&[0], 0.0, 1.0, steps, |_, m, from, to, n| {
        if m == Metric::Power {
            asked.push((from, to, n));
        }
        Ok(Vec::new())
    })
    .unwrap();
    let c = f64::from(gpus::CHUNK);
    assert_eq!(
        asked,
        [
            (0.0, c, gpus::CHUNK),
            (c, 2.0 * c, gpus::CHUNK),
            (2.0 * c, 2.0 * c + 10.0, 10)
        ]
    );
    assert!(gpus::steps(0.0, 8.0 * 86400.0, 1.0).is_err());
    assert_eq!(gpus::steps(0.0, 10.0, 3.0).unwrap(), 4);
}

#[test]
fn absent_is_an_empty_cell_and_a_null_never_zero() {
    let t = gpu_table();
    let csv = String::from_utf8(csv::write(&t)).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(
        lines[0].starts_with("time,gpu,util_gpu_pct,"),
        "{}",
        lines[0]
    );
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[1], "1970-01-01T00:01:40.250Z,0,,,,61.5,200,,,,,,,");
    assert_eq!(lines[2], "1970-01-01T00:01:40.250Z,1,,,,,201,,,,,,,");

    let jsonl = String::from_utf8(jsonl::write(&t)).unwrap();
    assert!(
        jsonl
            .starts_with("{\"time\":\"1970-01-01T00:01:40.250Z\",\"gpu\":0,\"util_gpu_pct\":null,"),
        "keys in the columns' order: {jsonl}"
    );
    let first: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(first["time"], "1970-01-01T00:01:40.250Z");
    assert_eq!(first["temperature_c"], 61.5);
    assert!(first["util_gpu_pct"].is_null());
    assert!(first["fan_pct"].is_null());
    assert_eq!(jsonl.lines().count(), 5);
}

#[test]
fn times_round_to_the_millisecond() {
    assert_eq!(time_text(100.0495), "1970-01-01T00:01:40.050Z");
    assert_eq!(time_text(1_796_008_500.123), "2026-11-30T03:15:00.123Z");
    assert_eq!(time_ms(1.0005), 1001);
}

fn report(n: u64, t: f64, rank: Option<u32>, loss: Option<f64>) -> MetricsPoint {
    let mut extra = BTreeMap::new();
    if n == 1 {
        extra.insert("lr".to_string(), 0.001);
        extra.insert("step".to_string(), 7.0);
    }
    MetricsPoint {
        n,
        t,
        from: "trainer".into(),
        rank,
        report: MetricsReport {
            step: Some(n * 10),
            loss,
            samples_per_s: Some(1000.0 + n as f64),
            extra,
            ..MetricsReport::default()
        },
    }
}

#[test]
fn metrics_keep_their_rank_and_extras_get_columns() {
    let t = metrics::build(
        "r1",
        vec![
            report(0, 10.0, Some(0), Some(2.5)),
            report(1, 11.0, Some(1), None),
        ],
    );
    let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(&names[..13], metrics::COLUMNS);
    assert_eq!(&names[13..], ["lr", "extra_step"]);
    let csv = String::from_utf8(csv::write(&t)).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[1],
        "1970-01-01T00:00:10.000Z,r1,0,0,trainer,0,,2.5,1000,,,,,,"
    );
    assert_eq!(
        lines[2],
        "1970-01-01T00:00:11.000Z,r1,1,1,trainer,10,,,1001,,,,,0.001,7"
    );
}

#[test]
fn metrics_files_skip_what_they_cannot_read_and_keep_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let mut text = String::new();
    for (n, t) in [(0, 10.0), (1, 20.0), (2, 30.0)] {
        text.push_str(&serde_json::to_string(&report(n, t, None, Some(1.0))).unwrap());
        text.push('\n');
    }
    text.push_str(&"x".repeat(metrics::MAX_LINE + 10));
    text.push('\n');
    text.push_str("{\"n\":3,\"t\":4");
    std::fs::write(&path, text).unwrap();
    let read = metrics::table(&path, "r", 15.0, 30.0).unwrap();
    assert_eq!(read.unreadable, 2);
    assert_eq!(read.table.rows(), 1);
    assert_eq!(
        read.table.column("n").unwrap().cells,
        Cells::I64(vec![Some(1)])
    );
    let none = metrics::table(&dir.path().join("absent"), "r", 0.0, 1.0).unwrap();
    assert_eq!((none.table.rows(), none.unreadable), (0, 0));
}

#[test]
fn parquet_reads_back_with_its_nulls_and_types() {
    use ::parquet::file::reader::{FileReader, SerializedFileReader};
    use ::parquet::record::Field;

    let t = gpu_table();
    let bytes = parquet::write(&t).unwrap();
    assert_eq!(&bytes[..4], b"PAR1");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    std::fs::write(&path, &bytes).unwrap();
    let reader = SerializedFileReader::try_from(std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(reader.metadata().file_metadata().num_rows(), 5);
    let rows: Vec<_> = reader
        .get_row_iter(None)
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let first: Vec<(String, Field)> = rows[0]
        .get_column_iter()
        .map(|(n, f)| (n.clone(), f.clone()))
        .collect();
    assert_eq!(first[0], ("time".into(), Field::TimestampMillis(100_250)));
    assert_eq!(first[1], ("gpu".into(), Field::Long(0)));
    assert_eq!(first[2], ("util_gpu_pct".into(), Field::Null));
    assert_eq!(first[5], ("temperature_c".into(), Field::Double(61.5)));
    assert_eq!(first[6], ("power_w".into(), Field::Double(200.0)));

    let m = metrics::build("r1", vec![report(0, 10.0, None, Some(2.5))]);
    let bytes = parquet::write(&m).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let reader = SerializedFileReader::try_from(std::fs::File::open(&path).unwrap()).unwrap();
    let row = reader.get_row_iter(None).unwrap().next().unwrap().unwrap();
    let fields: Vec<Field> = row.get_column_iter().map(|(_, f)| f.clone()).collect();
    assert_eq!(fields[1], Field::Str("r1".into()));
    assert_eq!(fields[2], Field::Null, "no rank: null, not 0");
    assert_eq!(fields[7], Field::Double(2.5));

    // No rows: still a file with its columns.
    let empty = metrics::build("r1", Vec::new());
    let bytes = parquet::write(&empty).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let reader = SerializedFileReader::try_from(std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(reader.metadata().file_metadata().num_rows(), 0);
    assert_eq!(
        reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .num_columns(),
        13
    );
}
