//! `testbed fleet` at a small scale against the real `coordinator` binary (built by
//! `cargo test --workspace`, or `cargo build -p coordinator`): every lightweight node joins and
//! heartbeats over its own QUIC session, GUARANTEED asks are all answered, and the nodes that
//! stop are declared lost. Assertions are on counts only; timeouts only guard against hangs.

use testbed::fleet::{FleetArgs, measure};

#[test]
fn the_coordinator_sees_every_fleet_node_and_declares_the_stopped_ones_lost() {
    let report = measure(&FleetArgs {
        nodes: 50,
        heartbeat_ms: 200,
        duration_s: 2,
        node_timeout_ms: 1000,
        lose: 5,
        allocate_per_s: 20.0,
        containers_per_node: 3,
        // Several endpoints, so sessions sharing one UDP socket and several sockets are both used.
        sessions_per_endpoint: 20,
        joins_per_s: 500.0,
        threads: 2,
        ready_timeout_s: 120,
        ..FleetArgs::default()
    })
    .expect("the fleet runs");
    assert_eq!(report.joined, 50);
    // Each session's join answer is measured once, whole: it carries at least the node's own
    // directory entry. (A node re-joins only if its link went silent for 6 s, which a very
    // loaded machine can cause; the counts allow for it.)
    assert_eq!(report.join_answers.answered, 50 + report.rejoins);
    assert!(
        report.join_answers.bytes_mean > 20.0,
        "{:?}",
        report.join_answers
    );
    assert_eq!(report.coordinator_nodes_joined, Some(50 + report.rejoins));
    assert_eq!(report.coordinator_nodes_lost, Some(5));
    assert!(
        report.lost.detect_ms.is_some(),
        "live nodes were told the stopped ones left"
    );
    assert!(report.heartbeats_answered > 0);
    assert!(report.allocate.asked > 0);
    assert_eq!(report.allocate.granted, report.allocate.asked);
    assert_eq!(report.allocate.failed, 0);
    // Every node was sent the membership changes at least once after the last join, as a
    // delta (issue 17): a node's join answer is at a version the coordinator keeps the changes
    // since.
    assert!(
        report.delta_answers >= 50,
        "{} delta answers",
        report.delta_answers
    );
}

fn paused_fleet(pause_coordinator_ms: u64) -> testbed::fleet::PauseFigures {
    let report = measure(&FleetArgs {
        nodes: 30,
        heartbeat_ms: 200,
        duration_s: 1,
        lose: 0,
        allocate_per_s: 0.0,
        containers_per_node: 2,
        sessions_per_endpoint: 10,
        joins_per_s: 500.0,
        threads: 2,
        ready_timeout_s: 120,
        pause_coordinator_ms,
        // Long enough that the re-joins after the long pause land within the loss guard's
        // grace (one node timeout) on a loaded machine.
        node_timeout_ms: 3000,
        ..FleetArgs::default()
    })
    .expect("the fleet runs");
    assert_eq!(report.coordinator_nodes_lost, Some(0));
    let pause = report.pause.expect("a pause was asked for");
    assert!(pause.recovered_s.is_some(), "{pause:?}");
    assert_eq!(pause.answered_after_resume, 30, "{pause:?}");
    assert_eq!(pause.nodes_lost, Some(0), "{pause:?}");
    assert!(pause.own_stalls >= Some(1), "{pause:?}");
    pause
}

/// The coordinator stopped (SIGSTOP) for a node timeout but less than the link's give-up
/// limit (6 s): every fleet node keeps its session and is answered on it again when the
/// coordinator resumes, nobody re-joins, and none is declared lost (the loss guard takes the
/// coordinator's own pause off the nodes' silence).
#[test]
fn a_fleet_keeps_its_sessions_through_a_short_coordinator_pause_and_nobody_is_lost() {
    let pause = paused_fleet(3_000);
    assert_eq!(pause.links_ended, 0, "{pause:?}");
    assert_eq!(pause.rejoined, 0, "{pause:?}");
}

/// Stopped for longer than the link's give-up limit (6 s at these heartbeats): every session
/// ends, every node re-joins with the worker's backoff once the coordinator resumes, and none
/// is declared lost.
#[test]
fn a_fleet_rejoins_after_a_long_coordinator_pause_and_nobody_is_lost() {
    let pause = paused_fleet(8_000);
    assert!(pause.links_ended >= 30, "{pause:?}");
    assert!(pause.rejoined >= 30, "{pause:?}");
}

/// `testbed quic-floor`, the fleet's transport floor, run as a user runs it (the binary starts
/// its echo server as a process of its own): every connection is answered in the window, and
/// the server's CPU per answer is reported.
#[test]
fn the_quic_floor_answers_every_connection_and_reports_the_servers_cpu() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args([
            "quic-floor",
            "--nodes",
            "20",
            "--heartbeat-ms",
            "100",
            "--duration-s",
            "1",
            "--sessions-per-endpoint",
            "8",
            "--ready-timeout-s",
            "60",
            "--json",
        ])
        .output()
        .expect("testbed runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["nodes"], 20);
    assert!(report["answered"].as_u64().expect("answered") > 0);
    assert!(report["server_cpu_s"].as_f64().expect("server_cpu_s") >= 0.0);
    assert!(
        report["server_datagrams_sent_per_answer"]
            .as_f64()
            .expect("datagrams")
            > 0.0
    );
    // Bad options are refused by name, before anything starts.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_testbed"))
        .args(["quic-floor", "--nodes", "0"])
        .output()
        .expect("testbed runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nodes"));
}
