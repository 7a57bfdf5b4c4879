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
    });

    // SAFETY: signalling the child process this test started, by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
}
