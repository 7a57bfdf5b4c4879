//! Log events carry the ids they concern through spans: an app connection's events name the
//! node, the connection and (after hello) the app; a container's process task names the node,
//! the container, its app and its job (issue 18).

mod common;

use common::*;
use scheduler_core::ContainerType;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything the subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[actix_rt::test]
async fn connection_and_container_spans_name_node_app_container_and_job() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("worker=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // Container process tasks run on the worker's node thread, so the subscriber must be the
    // global default (this test binary holds this one test).
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let c = Cluster::start(&["demo"], &[node("node-a", 1000, 1024)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let token = app.grant(ask(ContainerType::Guaranteed, 500, 256)).await;
    let id = token.body.container_id;
    app.start(&token, sh("exit 0")).await.expect("started");
    app.event("its end", |e| {
        e.container_id == id
            && matches!(
                e.event,
                scheduler_core::protocol::app::ContainerEventKind::Completed { .. }
            )
    })
    .await;
    c.stop().await;

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let connected = log
        .lines()
        .find(|l| l.contains("app connected"))
        .unwrap_or_else(|| panic!("no `app connected` event in:\n{log}"));
    assert!(
        connected.contains("app_connection{node=node-a conn=") && connected.contains("app=demo"),
        "{connected}"
    );
    let started = log
        .lines()
        .find(|l| l.contains("container process started"))
        .unwrap_or_else(|| panic!("no `container process started` event in:\n{log}"));
    assert!(
        started.contains(&format!(
            "container{{node=node-a container={id} app=demo job="
        )),
        "{started}"
    );
}
