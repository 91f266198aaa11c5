//! Scenario results: a JSON file per run (parameters, machine, one object per
//! result row) and a Markdown table for humans and `docs/benchmarks.md`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

/// One result row; columns keep their order in the Markdown table.
pub type Row = Vec<(String, Value)>;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub params: Value,
    #[serde(serialize_with = "rows_as_objects")]
    pub rows: Vec<Row>,
    pub machine: Value,
    /// Caveats a reader must know (e.g. in-process RSS includes the clients).
    pub notes: Vec<String>,
}

fn rows_as_objects<S: serde::Serializer>(rows: &[Row], s: S) -> Result<S::Ok, S::Error> {
    let objs: Vec<serde_json::Map<String, Value>> =
        rows.iter().map(|r| r.iter().cloned().collect()).collect();
    objs.serialize(s)
}

/// Builds a row from `(column, value)` pairs.
#[macro_export]
macro_rules! row {
    ($($k:expr => $v:expr),* $(,)?) => {
        vec![$(($k.to_string(), serde_json::json!($v))),*]
    };
}

/// What the numbers ran on.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    serde_json::json!({
        "cpu": cpu,
        "cores": cores,
        "kernel": kernel,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => {
                if f.abs() >= 100.0 {
                    format!("{f:.0}")
                } else if f.abs() >= 1.0 {
                    format!("{f:.2}")
                } else {
                    format!("{f:.3}")
                }
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

impl Report {
    pub fn new(scenario: &str, params: impl Serialize) -> Report {
        Report {
            scenario: scenario.to_string(),
            params: serde_json::to_value(params).unwrap_or(Value::Null),
            rows: Vec::new(),
            machine: machine(),
            notes: Vec::new(),
        }
    }

    pub fn markdown(&self) -> String {
        let mut out = format!("### {}\n\n", self.scenario);
        let Some(first) = self.rows.first() else {
            return out + "(no results)\n";
        };
        let cols: Vec<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
        out += &format!("| {} |\n", cols.join(" | "));
        out += &format!("|{}\n", "---|".repeat(cols.len()));
        for row in &self.rows {
            let cells: Vec<String> = cols
                .iter()
                .map(|c| {
                    row.iter()
                        .find(|(k, _)| k == c)
                        .map(|(_, v)| cell(v))
                        .unwrap_or_default()
                })
                .collect();
            out += &format!("| {} |\n", cells.join(" | "));
        }
        for n in &self.notes {
            out += &format!("\n- {n}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        out
    }

    /// Writes `<dir>/<scenario>-<unix seconds>.json`.
    pub fn write_json(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let path = dir.join(format!("{}-{secs}.json", self.scenario));
        std::fs::write(&path, serde_json::to_string_pretty(self)?)?;
        Ok(path)
    }
}

/// Median of a numeric column over the rows whose `key` column equals `value`.
pub fn column_median(report: &Report, key: &str, value: &str, col: &str) -> f64 {
    let mut v: Vec<f64> = report
        .rows
        .iter()
        .filter(|r| r.iter().any(|(k, v)| k == key && v.as_str() == Some(value)))
        .filter_map(|r| {
            r.iter()
                .find(|(k, _)| k == col)
                .and_then(|(_, v)| v.as_f64())
        })
        .collect();
    crate::measure::median(&mut v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_table() {
        let mut r = Report::new("w1", serde_json::json!({"n": 1}));
        r.rows
            .push(row!("protocol" => "sotw", "p99_ms" => 12.345, "n" => 3));
        let md = r.markdown();
        assert!(md.contains("| protocol | p99_ms | n |"), "{md}");
        assert!(md.contains("| sotw | 12.35 | 3 |"), "{md}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["rows"][0]["n"], 3);
    }
}
