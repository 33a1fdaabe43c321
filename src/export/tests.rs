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
    let grid = gpus::Grid::cover(100.0, 101.5, 0.5).unwrap();
    gpus::table::<()>(&[0, 1], &grid, |gpu, m, from, to, n| {
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
        Cells::Time(vec![100.0, 100.0, 100.5, 101.0, 101.0]),
        "each row at the start of its step"
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
    let grid = gpus::Grid::cover(0.0, steps as f64, 1.0).unwrap();
    gpus::table::<()>(&[0], &grid, |_, m, from, to, n| {
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
    assert!(gpus::Grid::cover(0.0, 8.0 * 86400.0, 1.0).is_err());
    assert_eq!(gpus::Grid::cover(0.0, 10.0, 3.0).unwrap().steps, 4);
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
    assert_eq!(lines[1], "1970-01-01T00:01:40.000Z,0,,,,61.5,200,,,,,,,");
    assert_eq!(lines[2], "1970-01-01T00:01:40.000Z,1,,,,,201,,,,,,,");

    let jsonl = String::from_utf8(jsonl::write(&t)).unwrap();
    assert!(
        jsonl
            .starts_with("{\"time\":\"1970-01-01T00:01:40.000Z\",\"gpu\":0,\"util_gpu_pct\":null,"),
        "keys in the columns' order: {jsonl}"
    );
    let first: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(first["time"], "1970-01-01T00:01:40.000Z");
    assert_eq!(first["temperature_c"], 61.5);
    assert!(first["util_gpu_pct"].is_null());
    assert!(first["fan_pct"].is_null());
    assert_eq!(jsonl.lines().count(), 5);
}

#[test]
fn windows_that_differ_by_less_than_a_step_share_one_grid_on_the_wall_clock() {
    // The same window asked for 27 ms apart (`--since 2h` run twice): the same steps.
    let a = gpus::Grid::cover(1_796_008_500.300, 1_796_008_510.300, 0.5).unwrap();
    let b = gpus::Grid::cover(1_796_008_500.327, 1_796_008_510.327, 0.5).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a.steps, 21,
        "from the step holding .300 to the one holding 510.299"
    );
    assert_eq!(a.start(0), 1_796_008_500.0);
    assert_eq!(a.start(20), 1_796_008_510.0);
    // Every start a whole multiple of the step since the epoch, at steps that are not a
    // binary fraction too.
    let g = gpus::Grid::cover(1_796_008_500.123, 1_796_008_560.0, 0.1).unwrap();
    assert_eq!(g.step_ms, 100);
    for i in 0..g.steps {
        assert_eq!(time_ms(g.start(i)) % 100, 0, "step {i} at {}", g.start(i));
    }
    assert_eq!(time_text(g.start(0)), "2026-11-30T03:15:00.100Z");
    let g = gpus::Grid::cover(7_250.0, 7_260.0, 15.0).unwrap();
    assert_eq!((g.first, g.steps, g.start(0)), (483, 1, 7_245.0));
    let g = gpus::Grid::cover(7_250.0, 7_260.001, 15.0).unwrap();
    assert_eq!((g.first, g.steps), (483, 2));

    // Points at the centres of the steps of either window land in the same rows.
    let rows = |grid: &gpus::Grid| {
        gpus::table::<()>(&[0], grid, |_, m, from, _, n| {
            Ok(if m == Metric::Power {
                (0..n)
                    .map(|i| point(from + 0.25 + 0.5 * f64::from(i), 300.0))
                    .collect()
            } else {
                Vec::new()
            })
        })
        .unwrap()
        .column("time")
        .unwrap()
        .cells
        .clone()
    };
    assert_eq!(rows(&a), rows(&b));
    let Cells::Time(t) = rows(&a) else {
        panic!("time is a time column")
    };
    assert_eq!(t.len(), 21);
    assert!(t.iter().all(|t| time_ms(*t) % 500 == 0), "{t:?}");
}

#[test]
fn readings_are_written_at_the_precision_they_were_measured_and_never_as_minus_zero() {
    // 624.4 W read as an f32 and widened: the history's answer.
    let widened = f64::from(624.4f32);
    assert_eq!(widened, 624.4000244140625);
    assert_eq!(measured_f32(widened), Some(624.4));
    assert_eq!(measured_f32(f64::from(80.0e9f32)), Some(80.0e9));
    assert_eq!(measured_f32(f64::NAN), None);
    assert!(measured_f32(-0.0).unwrap().is_sign_positive());

    let grid = gpus::Grid::cover(100.0, 101.0, 1.0).unwrap();
    let t = gpus::table::<()>(&[0], &grid, |_, m, _, _, _| {
        Ok(match m {
            Metric::Power => vec![point(100.5, widened)],
            Metric::Temperature => vec![point(100.5, f64::from(61.3f32))],
            Metric::PowerLimited => vec![point(100.5, -0.0)],
            _ => Vec::new(),
        })
    })
    .unwrap();
    let csv = String::from_utf8(csv::write(&t)).unwrap();
    assert_eq!(
        csv.lines().nth(1).unwrap(),
        "1970-01-01T00:01:40.000Z,0,,,,61.3,624.4,,,,,,0,"
    );
    let jsonl = String::from_utf8(jsonl::write(&t)).unwrap();
    assert!(
        jsonl.contains("\"temperature_c\":61.3,\"power_w\":624.4,"),
        "{jsonl}"
    );
    assert!(jsonl.contains("\"power_limited_share\":0.0,"), "{jsonl}");

    // A figure that is -0 in the table itself (a trainer's `-0.0`) is written as 0 too.
    let m = metrics::build("r", vec![report(0, 10.0, None, Some(-0.0))]);
    let csv = String::from_utf8(csv::write(&m)).unwrap();
    let loss = csv.lines().nth(1).unwrap().split(',').nth(7).unwrap();
    assert_eq!(loss, "0", "{csv}");
    let jsonl = String::from_utf8(jsonl::write(&m)).unwrap();
    assert!(jsonl.contains("\"loss\":0.0,"), "{jsonl}");
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
    assert_eq!(first[0], ("time".into(), Field::TimestampMillis(100_000)));
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
    // pandas' note: every integer column a nullable Int64, so a gap keeps `rank` integers.
    let kv = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap();
    let note = kv.iter().find(|k| k.key == "pandas").unwrap();
    let note: serde_json::Value = serde_json::from_str(note.value.as_deref().unwrap()).unwrap();
    let types: Vec<(&str, &str)> = note["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["numpy_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        &types[..5],
        [
            ("time", "datetime64[ns]"),
            ("run", "object"),
            ("rank", "Int64"),
            ("n", "Int64"),
            ("source", "object")
        ]
    );
    assert_eq!(types[7], ("loss", "float64"));
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
