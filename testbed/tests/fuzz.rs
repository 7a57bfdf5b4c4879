//! Bounded fuzzing runs (seconds) of every `testbed fuzz` target with fixed seeds: no panic, no
//! decoder error other than the expected kinds, bounded memory, and a worker that still serves a
//! well-behaved client afterwards. `testbed fuzz --cases N` runs millions (docs/benchmarks.md).

use testbed::fuzz::{FuzzArgs, Report, Target, fuzz};

fn assert_clean(r: &Report) {
    assert!(r.ok, "fuzzing failed: {:#?}", r.failures);
}

#[test]
fn the_app_decoder_survives_thousands_of_hostile_frames() {
    let r = fuzz(&FuzzArgs::new(Target::AppDecoder, 3_000, 11)).unwrap();
    assert_clean(&r);
    // The generator reaches both sides: some frames decode, most are refused.
    assert!(
        r.outcomes.get("app_request: decoded").copied().unwrap_or(0) > 0,
        "{:?}",
        r.outcomes
    );
    assert!(
        r.outcomes
            .get("app_request: malformed")
            .copied()
            .unwrap_or(0)
            > 0
    );
    assert!(r.outcomes.get("oversized").copied().unwrap_or(0) > 0);
}

#[test]
fn the_cluster_decoder_survives_thousands_of_hostile_frames() {
    let r = fuzz(&FuzzArgs::new(Target::ClusterDecoder, 3_000, 12)).unwrap();
    assert_clean(&r);
    assert!(
        r.outcomes
            .get("worker_to_coordinator: decoded")
            .copied()
            .unwrap_or(0)
            > 0
    );
    assert!(
        r.outcomes
            .get("coordinator_to_worker: decoded")
            .copied()
            .unwrap_or(0)
            > 0
    );
}

/// Real `coordinator` and `worker` binaries (built by `cargo test --workspace`).
#[test]
fn a_worker_survives_hostile_app_connections_and_still_serves() {
    let mut args = FuzzArgs::new(Target::AppEndpoint, 600, 13);
    args.max_rss_growth_mib = 64;
    let r = fuzz(&args).expect("a local cluster starts (cargo build -p coordinator -p worker)");
    assert_clean(&r);
    assert_eq!(r.served_after, Some(true));
    // Requests reached the handlers, not only the decoder's error paths.
    assert!(
        r.outcomes.get("welcome").copied().unwrap_or(0) > 0,
        "{:?}",
        r.outcomes
    );
    assert!(
        r.outcomes
            .get("error: malformed_frame")
            .copied()
            .unwrap_or(0)
            > 0
    );
    assert!(r.outcomes.len() > 5, "{:?}", r.outcomes);
}
