//! Measurements from `/proc`: CPU-seconds and memory of the server process (or,
//! in-process, of the server runtime's threads), and latency percentiles.

use std::sync::LazyLock;

use serde::Serialize;

/// Clock ticks per second for `/proc/*/stat` times (`getconf CLK_TCK`, 100 on Linux).
fn clk_tck() -> f64 {
    static TCK: LazyLock<f64> = LazyLock::new(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    });
    *TCK
}

/// (comm, utime + stime in seconds) from a `/proc/.../stat` line.
fn parse_stat(text: &str) -> Option<(String, f64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // Fields after ")" start at field 3 (state); utime is 14, stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((comm, (utime + stime) / clk_tck()))
}

/// CPU-seconds (user + system) a process has used.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .map(|(_, s)| s)
        .unwrap_or(0.0)
}

/// CPU-seconds used by this process's threads whose name starts with `prefix`
/// (the in-process server runs on its own runtime with named threads, so its
/// CPU is separable from the clients' even though they share the process).
pub fn threads_cpu_seconds(prefix: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|t| parse_stat(&t))
        .filter(|(comm, _)| comm.starts_with(prefix))
        .map(|(_, s)| s)
        .sum()
}

/// Resident memory now and its peak (`VmRSS`, `VmHWM`), in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Memory {
    pub rss: u64,
    pub peak: u64,
}

pub fn process_memory(pid: &str) -> Memory {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            * 1024
    };
    Memory {
        rss: kb("VmRSS:"),
        peak: kb("VmHWM:"),
    }
}

/// Latency distribution in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentiles of samples in microseconds (sorts in place).
pub fn percentiles_us(samples: &mut [u32]) -> Percentiles {
    if samples.is_empty() {
        return Percentiles::default();
    }
    samples.sort_unstable();
    let n = samples.len();
    let at = |q: f64| {
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        samples[rank - 1] as f64 / 1000.0
    };
    let sum: f64 = samples.iter().map(|&s| s as f64).sum();
    Percentiles {
        count: n,
        p50_ms: at(0.50),
        p90_ms: at(0.90),
        p99_ms: at(0.99),
        max_ms: samples[n - 1] as f64 / 1000.0,
        mean_ms: sum / n as f64 / 1000.0,
    }
}

/// Median of a few values (for repeated runs).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_and_percentiles() {
        let line = "123 (xds-srv (1)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        let (comm, s) = parse_stat(line).unwrap();
        assert_eq!(comm, "xds-srv (1)");
        assert!((s - 300.0 / clk_tck()).abs() < 1e-9);
        let mut v: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        let p = percentiles_us(&mut v);
        assert_eq!((p.p50_ms, p.p99_ms, p.max_ms), (50.0, 99.0, 100.0));
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert!(process_cpu_seconds(std::process::id()) >= 0.0);
        assert!(process_memory("self").rss > 0);
    }
}
