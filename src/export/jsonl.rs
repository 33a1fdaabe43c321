//! JSON lines: one object per row, keys the column names in order; an absent value is `null`,
//! never 0; a number is serde_json's shortest form of the value, never `-0.0`.
//! `pandas.read_json(f, lines=True)` reads it.

use serde_json::{Number, Value};

use super::{Cells, Table, time_text};

/// The table as JSON lines.
pub fn write(table: &Table) -> Vec<u8> {
    // Keys in the columns' order (serde_json's map would sort them), each written by serde_json.
    let keys: Vec<String> = table
        .columns
        .iter()
        .map(|c| Value::String(c.name.clone()).to_string())
        .collect();
    let mut out = String::new();
    for row in 0..table.rows() {
        out.push('{');
        for (i, (key, c)) in keys.iter().zip(&table.columns).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(key);
            out.push(':');
            out.push_str(&value(&c.cells, row).to_string());
        }
        out.push_str("}\n");
    }
    out.into_bytes()
}

fn value(cells: &Cells, row: usize) -> Value {
    match cells {
        Cells::Time(v) => v
            .get(row)
            .map_or(Value::Null, |t| Value::String(time_text(*t))),
        Cells::F64(v) => v
            .get(row)
            .copied()
            .flatten()
            .and_then(|x| Number::from_f64(crate::units::no_negative_zero(x)))
            .map_or(Value::Null, Value::Number),
        Cells::I64(v) => v
            .get(row)
            .copied()
            .flatten()
            .map_or(Value::Null, |x| Value::Number(x.into())),
        Cells::Text(v) => v
            .get(row)
            .cloned()
            .flatten()
            .map_or(Value::Null, Value::String),
    }
}
