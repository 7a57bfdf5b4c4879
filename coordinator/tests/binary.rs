//! The `coordinator` binary's command-line contracts (docs/design.md): `init` prints one JSON
//! object and writes cluster.json; `run` prints one `listening` JSON line, serves the cluster
//! protocol, and stops cleanly on SIGTERM.

mod common;

use common::*;
use scheduler_core::protocol::cluster::CoordinatorToWorker;
use std::io::BufRead;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_coordinator");

#[test]
fn init_then_run_then_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["init", "--data-dir"])
        .arg(&data)
        .args(["--app", "demo", "--app", "batch", "--max-queueable", "5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["ca_cert"], data.join("ca.pem").to_str().unwrap());
    assert_eq!(printed["apps"][1]["app_id"], "batch");
    assert_eq!(printed["apps"][0]["app_secret"].as_str().unwrap().len(), 64);
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    assert_eq!(file, printed);
    let token = std::fs::read_to_string(data.join("join-token")).unwrap();
    assert_eq!(printed["join_token"], token.as_str());

    // A second init is refused, naming the way forward.
    let again = Command::new(BIN)
        .args(["init", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("app add"));

    // app add prints the new secret.
    let added = Command::new(BIN)
        .args(["app", "add", "--data-dir"])
        .arg(&data)
        .args(["--app-id", "third", "--max-queueable-per-guaranteed", "2.5"])
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let added: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(added["app_id"], "third");

    let config = dir.path().join("coordinator.toml");
    std::fs::write(&config, "top_k = 3\nlisten = \"127.0.0.1:1\"\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--data-dir"])
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(listening["event"], "listening");
    let addr: std::net::SocketAddr = listening["quic_addr"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        addr.ip().to_string(),
        "127.0.0.1",
        "flag wins over the file"
    );

    actix_rt::System::new().block_on(async {
        let mut w = TestWorker::connect(addr, &data.join("ca.pem")).await;
        w.send(&join_msg(&token, "node-a", 1000, 1024)).await;
        match w.next().await {
            Ok(CoordinatorToWorker::JoinAccepted(a)) => {
                assert_eq!(a.settings.top_k, 3, "file value over the default");
                assert_eq!(a.apps.len(), 3);
            }
            other => panic!("join not accepted: {other:?}"),
        }
        // A stop closes the worker's connection before the process exits: the worker hears
        // the close at once (before, the process exited with the close only queued, and a
        // worker learnt of the stop at its idle timeout).
        // SAFETY: signalling the child process this test started, by its pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let closed = w.expect_closed().await;
        assert!(
            closed.contains("closed by the coordinator with code 0: coordinator shutting down"),
            "{closed}"
        );
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
}

/// Starts `coordinator run` on `data` and returns it with its QUIC address.
fn run_coordinator(data: &std::path::Path) -> (std::process::Child, std::net::SocketAddr) {
    let mut child = Command::new(BIN)
        .args(["run", "--data-dir"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = listening["quic_addr"].as_str().unwrap().parse().unwrap();
    (child, addr)
}

fn stop(mut child: std::process::Child) {
    // SAFETY: signalling the child process this test started, by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

fn pem_der(path: &std::path::Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

/// `check` reports (text and JSON, exit 0 with warnings, 1 with problems); `rotate-server-cert`
/// works while the coordinator runs and the next start serves the new certificate under the same
/// CA; `rotate-join-token` refuses while the coordinator runs (naming the lock) and, with it
/// stopped, makes the new token join and the old one fail.
#[test]
fn check_and_rotation_commands() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["init", "--data-dir"])
        .arg(&data)
        .args(["--app", "demo", "--server-cert-validity-days", "20"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let old_token = std::fs::read_to_string(data.join("join-token")).unwrap();
    let check = |json: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(["check", "--data-dir"]).arg(&data);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };

    // A 20-day server certificate: a warning, not a failure.
    let out = check(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("WARNING server.pem: server certificate expires in 19 day(s)")
            || text.contains("WARNING server.pem: server certificate expires in 20 day(s)"),
        "{text}"
    );
    assert!(text.ends_with("OK: 0 problem(s), 1 warning(s)\n"), "{text}");

    let (child, addr) = run_coordinator(&data);
    let served_before = actix_rt::System::new().block_on(async {
        TestWorker::connect(addr, &data.join("ca.pem"))
            .await
            .peer_certificate()
    });
    assert_eq!(served_before, pem_der(&data.join("server.pem")));

    // While it runs: the store is locked.
    let out = check(true);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let locked = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["severity"] == "problem")
        .unwrap();
    assert_eq!(locked["subject"], "store.redb");
    assert!(
        locked["detail"].as_str().unwrap().contains("locked"),
        "{locked}"
    );
    let out = Command::new(BIN)
        .args(["rotate-join-token", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("locked by another process"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(data.join("join-token")).unwrap(),
        old_token
    );

    // The server certificate can be rotated while it runs.
    let out = Command::new(BIN)
        .args(["rotate-server-cert", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_cert = pem_der(&data.join("server.pem"));
    assert_ne!(new_cert, served_before);
    stop(child);

    let out = Command::new(BIN)
        .args(["rotate-join-token", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rotated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let new_token = std::fs::read_to_string(data.join("join-token")).unwrap();
    assert_eq!(rotated["join_token"], new_token.as_str());
    assert_ne!(new_token, old_token);

    let out = check(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.ends_with("OK: 0 problem(s), 0 warning(s)\n"), "{text}");

    // The next start serves the new certificate, still under the pinned CA; the new token
    // joins, the old one does not.
    let (child, addr) = run_coordinator(&data);
    actix_rt::System::new().block_on(async {
        let mut w = TestWorker::connect(addr, &data.join("ca.pem")).await;
        assert_eq!(w.peer_certificate(), new_cert);
        w.send(&join_msg(&old_token, "node-a", 1000, 1024)).await;
        match w.next().await {
            Ok(CoordinatorToWorker::JoinRejected(r)) => {
                assert!(r.reason.contains("join token"), "{}", r.reason)
            }
            other => panic!("the old token joined: {other:?}"),
        }
        let mut w = TestWorker::connect(addr, &data.join("ca.pem")).await;
        w.send(&join_msg(&new_token, "node-a", 1000, 1024)).await;
        match w.next().await {
            Ok(CoordinatorToWorker::JoinAccepted(_)) => {}
            other => panic!("the new token did not join: {other:?}"),
        }
    });
    stop(child);

    // A damaged store: check fails and names the record; run refuses with the same remedy.
    let store = data.join("store.redb");
    let mut bytes = std::fs::read(&store).unwrap();
    let hash = coordinator::store::join_token_hash(&new_token);
    let at = bytes
        .windows(64)
        .position(|w| w == hash.as_bytes())
        .unwrap();
    bytes[at] ^= 0x01;
    std::fs::write(&store, &bytes).unwrap();
    let out = check(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("PROBLEM store.redb/join_token_sha256: checksum mismatch"),
        "{text}"
    );
    let out = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("record \"join_token_sha256\" is corrupted: checksum mismatch"),
        "{stderr}"
    );
    assert!(stderr.contains("coordinator check --data-dir"), "{stderr}");
}
