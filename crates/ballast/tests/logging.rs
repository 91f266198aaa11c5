//! Issue 8 §4 — logs for pipelines: no ANSI escape codes when the output is
//! not a terminal, and `--log-format json` writes one JSON object per line.
//! Runs the real binary with piped stdout and stderr, then stops it with SIGTERM.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Runs `ballast serve` (quickstart config) until it listens, stops it with
/// SIGTERM, and returns everything it wrote (stdout, stderr).
fn run_and_stop(extra: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(extra)
        .args([
            "serve",
            "--xds-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        stderr.read_to_end(&mut buf).unwrap();
        buf
    });
    let mut out = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    while seen < 2 {
        let line = lines.next().expect("ballast exited early").unwrap();
        seen += line.contains("listening on") as usize;
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    signal(child.id(), "TERM");
    let status = wait_exit(&mut child, Duration::from_secs(30));
    if status.is_none() {
        let _ = child.kill();
    }
    for line in lines {
        out.extend_from_slice(line.unwrap().as_bytes());
        out.push(b'\n');
    }
    let err = err_reader.join().unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        String::from_utf8_lossy(&err)
    );
    (out, err)
}

#[test]
fn text_logs_have_no_colour_codes_when_piped() {
    let (out, err) = run_and_stop(&[]);
    let text = String::from_utf8_lossy(&err);
    assert!(text.contains("INFO"), "{text}");
    assert!(text.contains("shutting down"), "{text}");
    assert!(!out.contains(&0x1b), "ESC in stdout: {out:?}");
    assert!(!err.contains(&0x1b), "ESC in stderr: {text:?}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let (_, err) = run_and_stop(&["--log-format", "json"]);
    let text = String::from_utf8(err).unwrap();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(lines.len() >= 2, "{text}");
    for v in &lines {
        assert!(v["level"].is_string(), "{v}");
        assert!(v["timestamp"].is_string(), "{v}");
        assert!(v["target"].is_string(), "{v}");
    }
    assert!(
        lines.iter().any(|v| v["level"] == "INFO"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("shutting down"))),
        "{text}"
    );
}

#[test]
fn unknown_log_format_is_rejected() {
    let out = Command::new(env!("CARGO_BIN_EXE_ballast"))
        .args(["--log-format", "xml", "validate", "x.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--log-format") && err.contains("json"),
        "{err}"
    );
}
