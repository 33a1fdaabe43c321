//! Parquet through the `parquet` crate's column writer (no Arrow): `time` a UTC timestamp in
//! milliseconds, numbers as DOUBLE or INT64, text as UTF-8, every column optional (an absent value
//! is a null, never 0) except `time`. A DOUBLE holds the decimal the CSV writes (a GPU reading
//! `624.4`, not its `f32`'s widening). The file carries pandas' own schema note (the `pandas`
//! key pyarrow writes), which names every integer column `Int64`: `read_parquet` gives a
//! nullable integer column, so a rank that some reports lack stays an integer (`<NA>` where
//! absent) instead of turning the column into floats. Row groups of [`ROW_GROUP`] rows; no compression codec is
//! built in (dictionary and run-length encoding still apply, which is most of what these
//! columns gain).

use std::sync::Arc;

use parquet::basic::{LogicalType, Repetition, TimeUnit, Type as Physical};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

use super::{Cells, ExportError, Table, time_ms};

/// Rows per row group.
pub const ROW_GROUP: usize = 1 << 20;

impl From<ParquetError> for ExportError {
    fn from(e: ParquetError) -> ExportError {
        ExportError::Parquet(e.to_string())
    }
}

/// The table as a Parquet file.
pub fn write(table: &Table) -> Result<Vec<u8>, ExportError> {
    let fields = table
        .columns
        .iter()
        .map(|c| field(&c.name, &c.cells).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = Arc::new(
        Type::group_type_builder("gpupilot_export")
            .with_fields(fields)
            .build()?,
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new(
                "pandas".to_string(),
                pandas_note(table),
            )]))
            .build(),
    );
    let mut writer = SerializedFileWriter::new(Vec::new(), schema, props)?;
    let rows = table.rows();
    let mut start = 0;
    // A table without rows still has its schema (one empty row group).
    loop {
        let end = (start + ROW_GROUP).min(rows);
        let mut group = writer.next_row_group()?;
        for c in &table.columns {
            let mut col = group
                .next_column()?
                .ok_or_else(|| ExportError::Parquet(format!("no writer for column {}", c.name)))?;
            match &c.cells {
                Cells::Time(v) => {
                    let vals: Vec<i64> = v[start..end].iter().map(|t| time_ms(*t)).collect();
                    col.typed::<Int64Type>().write_batch(&vals, None, None)?;
                }
                Cells::F64(v) => {
                    let (vals, defs) = split(&v[start..end], |x| {
                        x.filter(|x| x.is_finite())
                            .map(crate::units::no_negative_zero)
                    });
                    col.typed::<DoubleType>()
                        .write_batch(&vals, Some(&defs), None)?;
                }
                Cells::I64(v) => {
                    let (vals, defs) = split(&v[start..end], |x| *x);
                    col.typed::<Int64Type>()
                        .write_batch(&vals, Some(&defs), None)?;
                }
                Cells::Text(v) => {
                    let (vals, defs) = split(&v[start..end], |x| {
                        x.as_deref().map(|s| ByteArray::from(s.as_bytes().to_vec()))
                    });
                    col.typed::<ByteArrayType>()
                        .write_batch(&vals, Some(&defs), None)?;
                }
            }
            col.close()?;
        }
        group.close()?;
        start = end;
        if start >= rows {
            break;
        }
    }
    Ok(writer.into_inner()?)
}

/// pandas' schema note, as pyarrow writes it under the key `pandas`: which pandas type each
/// column becomes. pyarrow's `to_pandas` (and so `read_parquet`) reads it back: an `Int64`
/// column becomes pandas' nullable integer. No index is stored (a plain range index).
fn pandas_note(table: &Table) -> String {
    let columns: Vec<serde_json::Value> = table
        .columns
        .iter()
        .map(|c| {
            let (pandas_type, numpy_type, metadata) = match c.cells {
                Cells::Time(_) => (
                    "datetimetz",
                    "datetime64[ns]",
                    serde_json::json!({"timezone": "UTC"}),
                ),
                Cells::F64(_) => ("float64", "float64", serde_json::Value::Null),
                Cells::I64(_) => ("int64", "Int64", serde_json::Value::Null),
                Cells::Text(_) => ("unicode", "object", serde_json::Value::Null),
            };
            serde_json::json!({
                "name": c.name,
                "field_name": c.name,
                "pandas_type": pandas_type,
                "numpy_type": numpy_type,
                "metadata": metadata,
            })
        })
        .collect();
    serde_json::json!({
        "index_columns": [],
        "column_indexes": [],
        "columns": columns,
        "creator": {"library": "gpupilot", "version": env!("CARGO_PKG_VERSION")},
        "pandas_version": "1.5.3",
    })
    .to_string()
}

/// The present values, and a definition level per row (1 present, 0 null).
fn split<T, V>(cells: &[T], get: impl Fn(&T) -> Option<V>) -> (Vec<V>, Vec<i16>) {
    let mut vals = Vec::with_capacity(cells.len());
    let mut defs = Vec::with_capacity(cells.len());
    for c in cells {
        match get(c) {
            Some(v) => {
                vals.push(v);
                defs.push(1);
            }
            None => defs.push(0),
        }
    }
    (vals, defs)
}

fn field(name: &str, cells: &Cells) -> Result<Type, ParquetError> {
    let (physical, logical, repetition) = match cells {
        Cells::Time(_) => (
            Physical::INT64,
            Some(LogicalType::timestamp(true, TimeUnit::MILLIS)),
            Repetition::REQUIRED,
        ),
        Cells::F64(_) => (Physical::DOUBLE, None, Repetition::OPTIONAL),
        Cells::I64(_) => (Physical::INT64, None, Repetition::OPTIONAL),
        Cells::Text(_) => (
            Physical::BYTE_ARRAY,
            Some(LogicalType::String),
            Repetition::OPTIONAL,
        ),
    };
    Type::primitive_type_builder(name, physical)
        .with_logical_type(logical)
        .with_repetition(repetition)
        .build()
}
