//! CSV (RFC 4180): a header of column names, then one line per row; an absent value is an
//! empty cell, never 0. Numbers are written in full (Rust's shortest form that reads back to the
//! same value, never an exponent, never `-0`), text quoted where it holds a comma, a quote or a line break.

use super::{Cells, Table, time_text};

/// The table as CSV.
pub fn write(table: &Table) -> Vec<u8> {
    let mut out = String::new();
    let names: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
    out.push_str(&names.join(","));
    out.push('\n');
    for row in 0..table.rows() {
        for (i, c) in table.columns.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&cell(&c.cells, row));
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// One cell as text (empty when absent).
fn cell(cells: &Cells, row: usize) -> String {
    match cells {
        Cells::Time(v) => v.get(row).map(|t| time_text(*t)).unwrap_or_default(),
        Cells::F64(v) => v
            .get(row)
            .copied()
            .flatten()
            .filter(|x| x.is_finite())
            .map(|x| crate::units::no_negative_zero(x).to_string())
            .unwrap_or_default(),
        Cells::I64(v) => v
            .get(row)
            .copied()
            .flatten()
            .map(|x| x.to_string())
            .unwrap_or_default(),
        Cells::Text(v) => v
            .get(row)
            .and_then(Option::as_deref)
            .map(quote)
            .unwrap_or_default(),
    }
}

/// `s`, quoted (quotes doubled) where it needs it.
fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
