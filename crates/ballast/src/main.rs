//! The `ballast` binary: CLI, wiring of sources → translate → cache → xDS server, admin HTTP.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("ballast: not wired yet")
}
