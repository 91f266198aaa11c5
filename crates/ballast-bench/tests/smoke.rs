//! Keeps the fleet client and scenarios working: the `--smoke` run, in-process,
//! over SotW, Delta and REST. Asserts correctness only, never timing.

use std::time::Duration;

use ballast_bench::scenarios::smoke::{SmokeOptions, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_in_process() {
    let opts = SmokeOptions {
        churn_duration: Duration::from_secs(1),
        ..Default::default()
    };
    let report = run(&opts).await.unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(report.rows.len(), 3, "{}", report.markdown());
}
