//! How the app endpoint is reached (issue 11, docs/protocol.md §1): TLS under the cluster CA,
//! a Unix socket only, or plaintext TCP as an explicit choice. Real worker and coordinator
//! over loopback; the listener and start-up checks use the real `worker` binary.

mod common;

use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, AppRequest, AppResponse, ErrorCode, Hello,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use worker::config::{AppLimits, AppSocket, AppTcp, RunArgs};

/// Issue node `node`'s app certificate under the cluster CA next to `ca_cert` (the data dir).
fn issue_cert(ca_cert: &Path, node: &str) -> (PathBuf, PathBuf) {
    let data = coordinator::datadir::DataDir::new(ca_cert.parent().expect("data dir"));
    let issued = coordinator::app_cert::issue_app_cert(
        &data,
        node,
        &["localhost".to_string()],
        &["127.0.0.1".parse().expect("literal")],
        &data.root.join(format!("tls-{node}")),
        365,
    )
    .expect("issue the app certificate");
    (issued.cert, issued.key)
}

/// A TLS connector that trusts only the CA in `ca_pem`.
fn connector(ca_pem: &Path) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca_pem).expect("CA PEM"))
        .expect("CA certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Send `hello` over `stream` and return the first answer frame.
async fn hello_over<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    secret: &str,
) -> Result<AppResponse, String> {
    let hello = AppRequest::Hello(Hello {
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo".into(),
        app_secret: secret.into(),
        client_name: None,
    });
    stream
        .write_all(&encode_frame(&hello, APP_MAX_FRAME).expect("encode"))
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut decoder = FrameDecoder::new(APP_MAX_FRAME);
    let mut buf = vec![0u8; 4096];
    loop {
        if let Some(answer) = decoder
            .next_message::<AppResponse>()
            .map_err(|e| e.to_string())?
        {
            return Ok(answer);
        }
        let n = tokio::time::timeout(FAILURE_TIMEOUT, stream.read(&mut buf))
            .await
            .expect("an answer or a close in time")
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed".into());
        }
        decoder.push(&buf[..n]);
    }
}

#[actix_rt::test]
async fn tls_endpoint_serves_clients_trusting_the_cluster_ca_and_refuses_others_cleanly() {
    let c = Cluster::start_with(&["demo"], &[node("node-a", 2000, 2048)], |w| {
        let (cert, key) = issue_cert(&w.ca_cert, "node-a");
        w.app_tcp = Some(AppTcp::tls(
            "127.0.0.1:0".parse().expect("literal"),
            cert,
            key,
        ));
    })
    .await;
    let w = c.worker("node-a");
    let addr = w.app_addr.expect("a TCP listener");
    assert_eq!(w.app_endpoint, format!("tls://{addr}"), "grants name TLS");
    let ca = coordinator::datadir::DataDir::new(c.dir.path()).ca_cert();
    let secret = c.secret("demo").to_string();

    // Trusting the cluster CA, by IP and by DNS name: welcomed.
    for name in ["127.0.0.1", "localhost"] {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let tls = connector(&ca)
            .connect(ServerName::try_from(name).expect("name"), tcp)
            .await
            .unwrap_or_else(|e| panic!("TLS handshake as {name}: {e}"));
        let answer = hello_over(tls, &secret).await;
        assert!(
            matches!(answer, Ok(AppResponse::Welcome(_))),
            "{name}: {answer:?}"
        );
    }

    // Trusting another cluster's CA: the handshake fails on the worker's certificate.
    let other = tempfile::tempdir().expect("tempdir");
    let other_dir = coordinator::datadir::DataDir::new(other.path().join("data"));
    coordinator::datadir::init(&other_dir, &[], 1).expect("other cluster");
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let refused = connector(&other_dir.ca_cert())
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await;
    let e = refused.expect_err("a client trusting another CA must not complete the handshake");
    assert!(
        e.to_string().contains("certificate"),
        "the failure names the certificate: {e}"
    );

    // Plaintext: the hello is not understood, no welcome comes, the connection just ends
    // (at most a TLS alert record, type 0x15, comes back).
    let mut plain = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let hello = AppRequest::Hello(Hello {
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo".into(),
        app_secret: secret.clone(),
        client_name: None,
    });
    plain
        .write_all(&encode_frame(&hello, APP_MAX_FRAME).expect("encode"))
        .await
        .expect("write");
    let mut back = Vec::new();
    let read = tokio::time::timeout(FAILURE_TIMEOUT, plain.read_to_end(&mut back))
        .await
        .expect("the worker closes a plaintext connection to its TLS endpoint");
    match read {
        Ok(_) => assert!(
            back.is_empty() || back[0] == 0x15,
            "only a TLS alert may come back, got {back:?}"
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }

    // The worker keeps serving.
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = connector(&ca)
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("TLS handshake after the refusals");
    let answer = hello_over(tls, &secret).await;
    assert!(matches!(answer, Ok(AppResponse::Welcome(_))), "{answer:?}");
    c.stop().await;
}

/// The first frame the worker sends on `stream`, without sending anything.
async fn first_frame<S: AsyncRead + Unpin>(mut stream: S) -> Option<AppResponse> {
    let mut decoder = FrameDecoder::new(APP_MAX_FRAME);
    let mut buf = vec![0u8; 4096];
    loop {
        if let Some(answer) = decoder.next_message::<AppResponse>().expect("a frame") {
            return Some(answer);
        }
        let n = tokio::time::timeout(FAILURE_TIMEOUT, stream.read(&mut buf))
            .await
            .expect("a frame or a close in time")
            .ok()?;
        if n == 0 {
            return None;
        }
        decoder.push(&buf[..n]);
    }
}

#[actix_rt::test]
async fn tls_handshakes_are_bounded_by_the_hello_timeout_and_the_caps_answer_over_tls() {
    let limits = AppLimits {
        hello_timeout: Duration::from_millis(200),
        max_connections: 1,
        ..AppLimits::default()
    };
    let c = Cluster::start_with(&["demo"], &[node("node-a", 2000, 2048)], move |w| {
        let (cert, key) = issue_cert(&w.ca_cert, "node-a");
        w.app_tcp = Some(AppTcp::tls(
            "127.0.0.1:0".parse().expect("literal"),
            cert,
            key,
        ));
        w.app_limits = limits;
    })
    .await;
    let addr = c.worker("node-a").app_addr.expect("a TCP listener");
    let ca = coordinator::datadir::DataDir::new(c.dir.path()).ca_cert();

    // Connected, never starting a handshake: closed at the deadline, not kept for ever.
    let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut back = Vec::new();
    let read = tokio::time::timeout(FAILURE_TIMEOUT, silent.read_to_end(&mut back))
        .await
        .expect("the worker closes a connection that never handshakes");
    assert!(read.is_ok() && back.is_empty(), "{read:?} {back:?}");

    // One connection allowed: the second completes its handshake and is told why over TLS.
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut first = connector(&ca)
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("handshake");
    let hello = AppRequest::Hello(Hello {
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo".into(),
        app_secret: c.secret("demo").into(),
        client_name: None,
    });
    first
        .write_all(&encode_frame(&hello, APP_MAX_FRAME).expect("encode"))
        .await
        .expect("hello");
    assert!(matches!(
        first_frame(&mut first).await,
        Some(AppResponse::Welcome(_))
    ));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let second = connector(&ca)
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("handshake over the cap");
    match first_frame(second).await {
        Some(AppResponse::Error(e)) => assert_eq!(e.code, ErrorCode::TooManyConnections, "{e:?}"),
        other => panic!("expected too_many_connections, got {other:?}"),
    }
    drop(first);
    c.stop().await;
}

#[actix_rt::test]
async fn unix_socket_endpoint_is_created_0660_advertised_as_unix_url_and_never_taken_over() {
    let sock_dir = tempfile::tempdir().expect("tempdir");
    let path = sock_dir.path().join("app.sock");
    let for_config = path.clone();
    let c = Cluster::start_with(&["demo"], &[node("node-a", 2000, 2048)], move |w| {
        w.app_tcp = None;
        w.app_socket = Some(AppSocket::new(for_config.clone()));
    })
    .await;
    let w = c.worker("node-a");
    assert_eq!(w.app_addr, None, "no TCP listener");
    assert_eq!(w.app_endpoint, format!("unix://{}", path.display()));
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let meta = std::fs::metadata(&path).expect("socket exists");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let stream = tokio::net::UnixStream::connect(&path)
        .await
        .expect("connect");
    let answer = hello_over(stream, c.secret("demo")).await;
    assert!(matches!(answer, Ok(AppResponse::Welcome(_))), "{answer:?}");

    // A second worker on the same path does not take over the live socket, and a path that
    // is not a socket is never deleted.
    let mut second = c.workers[0].app_socket.clone().map(AppSocket::new);
    let second_config = |socket: Option<AppSocket>| {
        let mut a = RunArgs {
            coordinator: Some("127.0.0.1:9".into()),
            ca_cert: Some(coordinator::datadir::DataDir::new(c.dir.path()).ca_cert()),
            join_token: Some("t".into()),
            node_id: Some("node-b".into()),
            state_dir: Some(sock_dir.path().join("state-b")),
            ..Default::default()
        }
        .resolve()
        .expect("config");
        a.app_socket = socket;
        a
    };
    let e = match worker::start(second_config(second.take())).await {
        Ok(_) => panic!("a second worker took over a live socket"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("served by another process"), "{e}");
    assert!(
        std::fs::metadata(&path)
            .expect("still there")
            .file_type()
            .is_socket()
    );
    let file = sock_dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").expect("write");
    let e = match worker::start(second_config(Some(AppSocket::new(file.clone())))).await {
        Ok(_) => panic!("a worker replaced a regular file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("is not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep me");
    c.stop().await;
}

/// Socket inodes of `pid` that are listening TCP sockets (IPv4 or IPv6).
fn tcp_listeners_of(pid: u32) -> usize {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc fds") {
        let Ok(link) = std::fs::read_link(fd.expect("fd").path()) else {
            continue;
        };
        let link = link.to_string_lossy().to_string();
        if let Some(inode) = link
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // st is column 3 (0A = LISTEN), inode column 9.
            if cols.len() > 9 && cols[3] == "0A" && inodes.contains(cols[9]) {
                n += 1;
            }
        }
    }
    n
}

#[actix_rt::test]
async fn a_unix_socket_only_worker_binary_has_no_tcp_listener() {
    use tokio::io::AsyncBufReadExt;
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("w.sock");
    let data = coordinator::datadir::DataDir::new(c.dir.path());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_worker"))
        .arg("run")
        .args(["--coordinator", &c.server.quic_addr.to_string()])
        .arg("--ca-cert")
        .arg(data.ca_cert())
        .arg("--join-token-file")
        .arg(data.join_token())
        .args(["--node-id", "sock-node", "--cpu-millis", "1000"])
        .args(["--memory-mib", "512"])
        .arg("--app-socket")
        .arg(&sock)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the worker binary");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::time::timeout(
        FAILURE_TIMEOUT,
        tokio::io::BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("joined in time")
    .expect("read")
    .expect("a joined line");
    let joined: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(
        joined["app_endpoint"],
        format!("unix://{}", sock.display()),
        "{line}"
    );
    let pid = child.id().expect("running");
    assert_eq!(
        tcp_listeners_of(pid),
        0,
        "a Unix-socket-only worker listens on no TCP port"
    );

    // The same check sees the listener of a worker that has one.
    let (mut tcp_worker, _) = start_worker_binary(
        &c,
        "tcp-node",
        &tmp.path().join("state-tcp"),
        &tmp.path().join("tcp.log"),
        None,
    )
    .await;
    assert_eq!(
        tcp_listeners_of(tcp_worker.id().expect("running")),
        1,
        "the check works"
    );
    let _ = tcp_worker.kill().await;
    let _ = child.kill().await;
    c.stop().await;
}

#[test]
fn plaintext_tcp_without_the_explicit_flag_is_refused_at_start_naming_the_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_worker"))
        .args([
            "run",
            "--coordinator",
            "127.0.0.1:9",
            "--ca-cert",
            "/nonexistent",
        ])
        .args(["--join-token", "t", "--node-id", "n"])
        .args(["--app-listen", "127.0.0.1:0"])
        .output()
        .expect("run the worker binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for flag in ["--app-tls-cert", "--app-tls-key", "--app-plaintext-tcp"] {
        assert!(stderr.contains(flag), "the error names {flag}: {stderr}");
    }
}

fn args() -> RunArgs {
    RunArgs {
        coordinator: Some("127.0.0.1:9".into()),
        ca_cert: Some("/nonexistent/ca.pem".into()),
        join_token: Some("t".into()),
        node_id: Some("n".into()),
        state_dir: Some("/srv/worker-state".into()),
        ..Default::default()
    }
}

fn resolve_err(a: RunArgs) -> String {
    format!("{:#}", a.resolve().expect_err("refused"))
}

#[test]
fn transport_flags_resolve_to_tls_plaintext_or_socket_and_contradictions_are_refused() {
    // Nothing given: the Unix socket in the state dir, no TCP.
    let c = args().resolve().expect("default");
    assert_eq!(c.app_tcp, None);
    assert_eq!(
        c.app_socket,
        Some(AppSocket::new("/srv/worker-state/app.sock"))
    );

    // TLS; with an explicit socket too.
    let c = RunArgs {
        app_listen: Some("0.0.0.0:7500".parse().unwrap()),
        app_tls_cert: Some("c.pem".into()),
        app_tls_key: Some("k.pem".into()),
        app_socket: Some("/run/w.sock".into()),
        app_socket_mode: Some("600".into()),
        app_socket_group: Some("0".into()),
        ..args()
    }
    .resolve()
    .expect("TLS");
    assert_eq!(
        c.app_tcp,
        Some(AppTcp::tls(
            "0.0.0.0:7500".parse().unwrap(),
            "c.pem".into(),
            "k.pem".into()
        ))
    );
    assert_eq!(
        c.app_socket,
        Some(AppSocket {
            path: "/run/w.sock".into(),
            mode: 0o600,
            gid: Some(0)
        })
    );

    // TLS without a socket flag: no socket.
    let c = RunArgs {
        app_listen: Some("0.0.0.0:7500".parse().unwrap()),
        app_tls_cert: Some("c.pem".into()),
        app_tls_key: Some("k.pem".into()),
        ..args()
    }
    .resolve()
    .expect("TLS only");
    assert_eq!(c.app_socket, None);

    // Plaintext only when asked.
    let c = RunArgs {
        app_listen: Some("127.0.0.1:7500".parse().unwrap()),
        app_plaintext_tcp: Some(true),
        ..args()
    }
    .resolve()
    .expect("plaintext");
    assert_eq!(
        c.app_tcp,
        Some(AppTcp::plaintext("127.0.0.1:7500".parse().unwrap()))
    );

    let e = resolve_err(RunArgs {
        app_listen: Some("127.0.0.1:7500".parse().unwrap()),
        ..args()
    });
    assert!(
        e.contains("--app-tls-cert") && e.contains("--app-plaintext-tcp"),
        "{e}"
    );
    let e = resolve_err(RunArgs {
        app_listen: Some("127.0.0.1:7500".parse().unwrap()),
        app_tls_cert: Some("c.pem".into()),
        ..args()
    });
    assert!(e.contains("--app-tls-key"), "{e}");
    let e = resolve_err(RunArgs {
        app_listen: Some("127.0.0.1:7500".parse().unwrap()),
        app_tls_cert: Some("c.pem".into()),
        app_tls_key: Some("k.pem".into()),
        app_plaintext_tcp: Some(true),
        ..args()
    });
    assert!(e.contains("contradicts"), "{e}");
    let e = resolve_err(RunArgs {
        app_tls_cert: Some("c.pem".into()),
        app_tls_key: Some("k.pem".into()),
        ..args()
    });
    assert!(e.contains("need --app-listen"), "{e}");
    let e = resolve_err(RunArgs {
        app_plaintext_tcp: Some(true),
        ..args()
    });
    assert!(e.contains("needs --app-listen"), "{e}");
    let e = resolve_err(RunArgs {
        app_socket_mode: Some("rw".into()),
        ..args()
    });
    assert!(e.contains("octal"), "{e}");
}

#[test]
fn transport_keys_are_read_from_the_toml_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker.toml");
    std::fs::write(
        &file,
        "app_listen = \"127.0.0.1:7500\"\napp_tls_cert = \"c.pem\"\napp_tls_key = \"k.pem\"\n",
    )
    .unwrap();
    let c = RunArgs {
        config: Some(file),
        ..args()
    }
    .resolve()
    .expect("resolves");
    assert_eq!(
        c.app_tcp,
        Some(AppTcp::tls(
            "127.0.0.1:7500".parse().unwrap(),
            "c.pem".into(),
            "k.pem".into()
        ))
    );
}

#[test]
fn the_advertised_endpoint_names_its_transport() {
    let addr: std::net::SocketAddr = "10.0.0.1:7500".parse().unwrap();
    let tls = AppTcp::tls(addr, "c".into(), "k".into());
    let plain = AppTcp::plaintext(addr);
    let sock = AppSocket::new("/run/w.sock");
    let adv = worker::advertised_endpoint;
    assert_eq!(
        adv(None, Some(&tls), Some(addr), None).unwrap(),
        "tls://10.0.0.1:7500"
    );
    assert_eq!(
        adv(None, Some(&plain), Some(addr), None).unwrap(),
        "tcp://10.0.0.1:7500"
    );
    assert_eq!(
        adv(Some("w1:7500"), Some(&tls), Some(addr), Some(&sock)).unwrap(),
        "tls://w1:7500"
    );
    assert_eq!(
        adv(Some("tls://proxy:1"), Some(&plain), Some(addr), None).unwrap(),
        "tls://proxy:1"
    );
    assert_eq!(
        adv(None, None, None, Some(&sock)).unwrap(),
        "unix:///run/w.sock"
    );
    assert!(adv(Some("w1:7500"), None, None, Some(&sock)).is_err());
}
