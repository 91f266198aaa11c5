//! `ballast-bench`: a fleet of simulated xDS clients and benchmark scenarios.
#![forbid(unsafe_code)]

fn main() {
    eprintln!("ballast-bench: no scenarios yet");
    std::process::exit(2);
}
