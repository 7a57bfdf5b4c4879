//! End to end through the command line, as a user runs it: `testbed local` (which spawns the
//! real `coordinator` and `worker` binaries) and `testbed load` as separate processes.
//!
//! The `coordinator` and `worker` binaries must sit next to the `testbed` binary under test:
//! `cargo test --workspace` (or `cargo build -p coordinator -p worker` first) puts them there.
//! Timeouts only guard against hangs; every wait is for an event (a line, an exit).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const GUARD: Duration = Duration::from_secs(120);

fn testbed() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_testbed"))
}

/// `testbed local`, its first stdout line parsed, and its stderr collected by a thread.
struct Local {
    child: Option<Child>,
    pid: u32,
    summary: serde_json::Value,
    stdout_lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    _data: tempfile::TempDir,
}

impl Local {
    fn start(workers: usize) -> Local {
        let data = tempfile::tempdir().unwrap();
        let mut child = Command::new(testbed())
            .args(["local", "--workers", &workers.to_string()])
            .args(["--cpu-millis", "2000", "--memory-mib", "2048"])
            .args(["--heartbeat-interval-ms", "100"])
            .arg("--data-dir")
            .arg(data.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = collect(child.stderr.take().unwrap());
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let _ = tx.send(line.unwrap_or_default());
            }
        });
        let line = match lines.recv_timeout(GUARD) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "testbed local printed no line (are the coordinator and worker binaries \
                     built next to {}? `cargo build -p coordinator -p worker`); stderr:\n{}",
                    testbed().display(),
                    stderr.recv_timeout(GUARD).unwrap_or_default()
                );
            }
        };
        let summary: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("testbed local printed {line:?}, not JSON: {e}"));
        Local {
            pid: child.id(),
            child: Some(child),
            summary,
            stdout_lines: lines,
            stderr,
            _data: data,
        }
    }

    fn endpoint(&self, i: usize) -> String {
        self.summary["workers"][i]["app_endpoint"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn credentials(&self) -> (String, String) {
        (
            self.summary["app_id"].as_str().unwrap().to_string(),
            self.summary["app_secret"].as_str().unwrap().to_string(),
        )
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(self.pid as i32, sig) }, 0);
    }

    /// Wait for `testbed local` to exit; its status, everything it wrote to stderr, and any
    /// stdout lines after the first (there must be none).
    fn wait(mut self) -> (ExitStatus, String, Vec<String>) {
        let mut child = self.child.take().expect("not waited yet");
        let (tx, exited) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = exited
            .recv_timeout(GUARD)
            .expect("testbed local exits")
            .unwrap();
        let stderr = self.stderr.recv_timeout(GUARD).unwrap_or_default();
        // The stdout reader ends at end of stream, which came with the exit.
        let extra = self.stdout_lines.iter().collect();
        (status, stderr, extra)
    }
}

impl Drop for Local {
    /// SIGTERM first, so `testbed local` stops its coordinator and workers and they their
    /// containers (a SIGKILL would orphan them all); SIGKILL only if it has not exited in time.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let (tx, exited) = mpsc::channel();
            let waiter = std::thread::spawn(move || {
                let status = child.wait();
                let _ = tx.send(());
                (child, status)
            });
            if exited.recv_timeout(Duration::from_secs(30)).is_err() {
                // SAFETY: as above; the waiter then returns.
                unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
            }
            let _ = waiter.join();
        }
    }
}

/// Read a pipe to its end on a thread; the text arrives when the writer closes it.
fn collect(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

/// Pids whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may contain spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid: u32 = rest
            .split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        if ppid == pid {
            let cmdline = std::fs::read_to_string(entry.path().join("cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            out.push((child, cmdline));
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    // A reaped child is gone; a zombie would still be listed, so check its state too.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn load(local: &Local, kind: &str, containers: usize) -> serde_json::Value {
    let (app_id, secret) = local.credentials();
    let out = Command::new(testbed())
        .args(["load", "--endpoint", &local.endpoint(0)])
        .args(["--ca-cert", local.summary["ca_cert"].as_str().unwrap()])
        .args(["--app-id", &app_id, "--app-secret", &secret])
        .args(["--containers", &containers.to_string(), "--type", kind])
        .args(["--policy", "50%-Q", "--concurrency", "4"])
        .args(["--task-duration-ms", "30", "--task-memory-mib", "1"])
        .args(["--task-cpu-fraction", "0.1", "--cpu-millis", "250"])
        .args(["--memory-mib", "32", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "testbed load --type {kind} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("load printed {stdout:?}, not JSON: {e}"))
}

/// The body of `GET /metrics` at `addr` (HTTP/1.1, connection closed after the answer).
fn http_get_metrics(addr: &str) -> String {
    http_get(addr, "/metrics")
}

/// The body of `GET path` at `addr`; the status must be 200.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("metrics port");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("response");
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    raw.split_once("\r\n\r\n").expect("body").1.to_string()
}

fn n(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("{path:?} is not a count in {v}"))
}

#[test]
fn local_prints_one_line_load_runs_every_type_and_sigterm_stops_every_process() {
    let local = Local::start(2);
    let s = &local.summary;
    assert!(s["coordinator"].as_str().unwrap().starts_with("127.0.0.1:"));
    let workers = s["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2);
    // TLS by default, named with its scheme; `testbed load` below verifies it with ca_cert.
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(w["node_id"], format!("worker-{}", i + 1));
        assert!(
            w["app_endpoint"]
                .as_str()
                .unwrap()
                .starts_with("tls://127.0.0.1:"),
            "{w}"
        );
    }
    assert!(Path::new(s["ca_cert"].as_str().unwrap()).is_file(), "{s}");
    // Every process serves GET /metrics; the line says where.
    let coordinator_metrics =
        http_get_metrics(s["coordinator_http"].as_str().expect("coordinator_http"));
    assert!(
        coordinator_metrics.contains("\ncoordinator_nodes_joined_total 2\n"),
        "{coordinator_metrics}"
    );
    for w in workers {
        let text = http_get_metrics(w["http"].as_str().expect("worker http"));
        assert!(text.contains("# TYPE worker_allocations counter"), "{text}");
    }
    assert!(!s["app_id"].as_str().unwrap().is_empty());
    assert!(!s["app_secret"].as_str().unwrap().is_empty());
    let children = children_of(local.pid);
    assert_eq!(
        children.len(),
        3,
        "a coordinator and two workers: {children:?}"
    );

    for kind in ["queueable", "guaranteed", "hybrid"] {
        let r = load(&local, kind, 12);
        assert_eq!(n(&r, &["completed"]), 12, "{kind}: {r}");
        assert_eq!(n(&r, &["failed"]), 0, "{kind}: {r}");
        assert_eq!(n(&r, &["gave_up"]), 0, "{kind}: {r}");
        let granted = n(&r, &["granted"]);
        assert!(granted >= 12, "{kind}: {r}");
        assert_eq!(n(&r, &["started"]), granted, "{kind}: {r}");
        let (g, q) = (
            n(&r, &["allocate_guaranteed", "count"]),
            n(&r, &["allocate_queueable", "count"]),
        );
        assert_eq!(g + q, granted, "{kind}: every grant timed once: {r}");
        match kind {
            "queueable" => assert_eq!(g, 0, "{r}"),
            "guaranteed" => assert_eq!(q, 0, "{r}"),
            _ => {}
        }
        for key in [
            "allocate_p50_us",
            "allocate_p99_us",
            "start_p50_us",
            "start_p99_us",
        ] {
            assert!(n(&r, &[key]) > 0, "{kind}: {key} measured: {r}");
        }
        assert!(n(&r, &["allocate_p50_us"]) <= n(&r, &["allocate_p99_us"]));
        for key in ["killed", "shed", "preempted"] {
            n(&r, &[key]);
        }
    }

    local.signal(libc::SIGTERM);
    let (status, stderr, extra) = local.wait();
    assert!(
        status.success(),
        "testbed local on SIGTERM: {status}\n{stderr}"
    );
    assert!(
        extra.is_empty(),
        "exactly one stdout line; also got {extra:?}"
    );
    for (pid, cmd) in children {
        assert!(!alive(pid), "{cmd} (pid {pid}) outlived testbed local");
    }
}

#[test]
fn a_child_that_dies_is_named_and_the_others_are_stopped() {
    let local = Local::start(2);
    let children = children_of(local.pid);
    let (victim, _) = children
        .iter()
        .find(|(_, cmd)| cmd.contains("--node-id worker-2"))
        .cloned()
        .unwrap_or_else(|| panic!("worker-2 among {children:?}"));
    // SAFETY: signalling a process this test's child started.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    let (status, stderr, _) = local.wait();
    assert!(!status.success());
    assert!(
        stderr.contains("worker-2 exited unexpectedly") && stderr.contains("worker-2.log"),
        "names the child and its log: {stderr}"
    );
    for (pid, cmd) in children {
        assert!(!alive(pid), "{cmd} (pid {pid}) outlived testbed local");
    }
}

#[test]
fn missing_sibling_binaries_give_a_clear_error() {
    // A copy of testbed in a directory without coordinator and worker next to it.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let lonely = dir.path().join("sub").join("testbed");
    std::fs::create_dir_all(lonely.parent().unwrap()).unwrap();
    if std::fs::hard_link(testbed(), &lonely).is_err() {
        std::fs::copy(testbed(), &lonely).unwrap();
    }
    let out = Command::new(&lonely)
        .args(["local", "--workers", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no JSON line on failure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cargo build --release -p coordinator -p worker")
            && stderr.contains(&*lonely.parent().unwrap().to_string_lossy()),
        "{stderr}"
    );
    assert!(Path::new(&lonely).exists());
}

/// Headless Chromium (Debian's `chromium`), if installed: `.ci/run` installs it, so under CI a
/// missing browser fails the test instead of skipping it.
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| Path::new("/usr/bin").join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no chromium under /usr/bin: .ci/run installs Debian's chromium package"
        );
        eprintln!("skipping the browser test: no chromium (apt-get install chromium)");
    }
    found
}

/// Chromium renders `url` headless (its scripts run against the live cluster) and prints the
/// resulting DOM; with `screenshot` it also saves a PNG of the page.
fn render(browser: &Path, url: &str, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(browser);
    // As root (CI, containers) Chromium needs --no-sandbox; the page is our own.
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
    ])
    .args([
        "--no-first-run",
        "--hide-scrollbars",
        "--window-size=1400,900",
    ])
    // Virtual time runs the page's first fetches to completion before the dump.
    .arg("--virtual-time-budget=3000")
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(png) => cmd.arg(format!("--screenshot={}", png.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The dashboard in a real browser, and the `coordinator` operator commands, against a loaded
/// local cluster: the page renders the figures the coordinator's `/api/state` holds at that
/// moment, per node and per container, and the commands report and drain the same nodes;
/// screenshots are saved under the test's target tmp dir (`dashboard-*.png`).
#[test]
fn the_dashboard_and_the_operator_commands_show_the_live_cluster() {
    let Some(browser) = chromium() else {
        return;
    };
    let local = Local::start(2);
    let http = local.summary["coordinator_http"]
        .as_str()
        .expect("coordinator_http")
        .to_string();
    let (app_id, secret) = local.credentials();
    // 12 long containers in flight, half GUARANTEED, on 16 slots: they all run, and stay
    // running for the whole test.
    /// The load generator is stopped however the test ends.
    struct KillOnDrop(Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _load = KillOnDrop(
        Command::new(testbed())
            .args(["load", "--endpoint", &local.endpoint(0)])
            .args(["--ca-cert", local.summary["ca_cert"].as_str().unwrap()])
            .args(["--app-id", &app_id, "--app-secret", &secret])
            .args([
                "--containers",
                "12",
                "--type",
                "hybrid",
                "--policy",
                "50%-Q",
            ])
            .args(["--concurrency", "12", "--task-duration-ms", "120000"])
            .args([
                "--task-memory-mib",
                "1",
                "--cpu-millis",
                "250",
                "--memory-mib",
                "32",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Wait (bounded) until the coordinator has heard of all 12 running: each GET marks the
    // dashboard watched, so the actors publish at their next tick.
    let deadline = std::time::Instant::now() + GUARD;
    let state = loop {
        let state: serde_json::Value =
            serde_json::from_str(&http_get(&http, "/api/state")).unwrap();
        let nodes = state["cluster"]["nodes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let running: u64 = nodes
            .iter()
            .map(|n| {
                n["running_guaranteed"].as_u64().unwrap() + n["running_queueable"].as_u64().unwrap()
            })
            .sum();
        if nodes.len() == 2 && running == 12 {
            break state;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster never showed 12 running containers: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    let dom = render(&browser, &format!("http://{http}/"), None);
    assert!(dom.contains(r#"id="nodes-joined">2<"#), "{dom}");
    assert!(dom.contains(r#"id="containers-running">12<"#), "{dom}");
    for node in state["cluster"]["nodes"].as_array().unwrap() {
        let id = node["node_id"].as_str().unwrap();
        let row = format!(r#"<tr data-node="{id}">"#);
        assert!(dom.contains(&row), "no row for {id}: {dom}");
        let running = format!(
            r#"data-field="running">{} G / {} Q<"#,
            node["running_guaranteed"], node["running_queueable"]
        );
        let at = dom.find(&row).unwrap();
        let end = dom[at..].find("</tr>").unwrap() + at;
        assert!(
            dom[at..end].contains(&running),
            "{id}: {running} in {}",
            &dom[at..end]
        );
    }
    // One node's page lists the containers it runs. The page polls its own snapshot, which
    // may be a tick newer or older than the one read here (under load a container can still be
    // moving between queue and start): read, render and compare again until they agree, bounded.
    let deadline = std::time::Instant::now() + GUARD;
    let id = loop {
        let state: serde_json::Value =
            serde_json::from_str(&http_get(&http, "/api/state")).unwrap();
        let busiest = state["cluster"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .max_by_key(|n| n["containers_total"].as_u64())
            .unwrap()
            .clone();
        let id = busiest["node_id"].as_str().unwrap().to_string();
        let dom = render(&browser, &format!("http://{http}/#node/{id}"), None);
        assert!(dom.contains(&format!(">Node {id}<")), "{dom}");
        let missing: Vec<String> = busiest["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| format!(r#"data-container="{}""#, c["id"].as_str().unwrap()))
            .filter(|row| !dom.contains(row))
            .collect();
        if missing.is_empty() {
            break id;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{missing:?} not on the node page: {dom}"
        );
    };
    let dom = render(&browser, &format!("http://{http}/#reservations"), None);
    assert!(dom.contains(r#"id="agenda""#), "the agenda chart: {dom}");

    // The operator commands of the real `coordinator` binary see the same cluster.
    let data_dir = Path::new(local.summary["ca_cert"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let operator = |args: &[&str]| {
        let out = Command::new(testbed().with_file_name("coordinator"))
            .args(args)
            .arg("--data-dir")
            .arg(&data_dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "coordinator {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let status: serde_json::Value = serde_json::from_str(&operator(&["status", "--json"])).unwrap();
    assert_eq!(status["nodes"], 2, "{status}");
    assert_eq!(status["containers_running"], 12, "{status}");
    let drained = operator(&["node", "drain", "worker-2"]);
    assert!(drained.contains("worker-2 is draining now"), "{drained}");
    let nodes = operator(&["nodes"]);
    let row = nodes.lines().find(|l| l.starts_with("worker-2")).unwrap();
    assert!(row.ends_with("draining"), "{nodes}");
    // The dashboard shows the drain too, once the coordinator's next snapshot has it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let dom = render(&browser, &format!("http://{http}/"), None);
        let at = dom
            .find(r#"<tr data-node="worker-2">"#)
            .expect("a row for worker-2");
        let end = dom[at..].find("</tr>").unwrap() + at;
        if dom[at..end].contains(r#"data-field="state">draining<"#) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dashboard never showed worker-2 draining: {}",
            &dom[at..end]
        );
    }
    let top = operator(&["top", "--iterations", "1"]);
    assert!(top.contains("busiest 2 of 2 nodes by R"), "{top}");

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR"));
    for (name, fragment) in [
        ("cluster", ""),
        ("node", &*format!("#node/{id}")),
        ("apps", "#apps"),
    ] {
        let png = shots.join(format!("dashboard-{name}.png"));
        let _ = std::fs::remove_file(&png);
        render(&browser, &format!("http://{http}/{fragment}"), Some(&png));
        let bytes = std::fs::read(&png).expect("a screenshot");
        assert!(bytes.starts_with(b"\x89PNG"), "{} is a PNG", png.display());
    }
}
