//! Cost of signing and checking container tokens: HMAC-SHA256 under per-(issuer, node) keys
//! (QUEUEABLE tokens, signed by every worker's distributed scheduler; the node derives the
//! issuer's key from its session secret) against Ed25519 (GUARANTEED tokens, signed by the
//! coordinator alone and verified by nodes with its public key), and the coordinator's cost of
//! deriving one scheduler's keys for a directory. `cargo bench -p scheduler-core --bench
//! tokens`; prints the median of 15 rounds of ns per operation for each.

use scheduler_core::token::{
    ContainerToken, GuaranteedSigner, IssuerNodeKey, KeyRing, NodeSessionSecret, QueueableSigner,
    TokenBody, TokenKey, TokenVerifier,
};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 15;
const OPS: u32 = 2_000;

fn body(t: ContainerType, seq: u64) -> TokenBody {
    TokenBody {
        container_id: ContainerId::new(3, seq),
        node_id: NodeId::from("worker-17"),
        app_id: AppId::from("analytics"),
        resources: Resources::new(1000, 2048),
        container_type: t,
        version: 0,
        job_id: JobId::from("job-2026-11-25-0042"),
        job_submit_time_ms: 1_795_000_000_000,
        priority: 0,
        runtime_estimate_ms: Some(30_000),
        expires_at_ms: u64::MAX / 2,
        key_id: 0,
        node_epoch: 27, // worker-17's session in the directory below,
        booking: None,
        times_returned: 0,
    }
}

/// Median ns per call of `f` over `ROUNDS` rounds of `OPS` calls.
fn median_ns(mut f: impl FnMut(u32)) -> f64 {
    let mut per_op: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for i in 0..OPS {
                f(i);
            }
            start.elapsed().as_nanos() as f64 / OPS as f64
        })
        .collect();
    per_op.sort_by(f64::total_cmp);
    per_op[ROUNDS / 2]
}

fn main() {
    let master = TokenKey::from_bytes(1, [7; 32]);
    // The scheduler holds keys for a 1,000-node directory, as on a large cluster.
    let directory: Vec<(NodeId, NodeSessionSecret)> = (0..1000)
        .map(|i| {
            let n = NodeId::from(format!("worker-{i}").as_str());
            let s = NodeSessionSecret::derive(&master, &n, 10 + i).unwrap();
            (n, s)
        })
        .collect();
    let issuer_keys = |issuer: u32| -> Vec<IssuerNodeKey> {
        directory
            .iter()
            .map(|(n, s)| s.issuer_key(n, issuer).unwrap())
            .collect()
    };
    let (node, secret) = directory[17].clone();
    let keys_of_3 = issuer_keys(3);
    let hmac = QueueableSigner::new(3, &keys_of_3);
    let ed = GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [8; 32]))).unwrap();
    let app = AppId::from("analytics");
    let mut verifier = TokenVerifier::new(node.clone());
    verifier.set_node_session(&secret).unwrap();
    verifier.set_guaranteed_keys(ed.public_ring());
    let q: ContainerToken = hmac.sign(body(ContainerType::Queueable, 1)).unwrap();
    let g: ContainerToken = ed.sign(body(ContainerType::Guaranteed, 1)).unwrap();

    let rows = [
        (
            "sign QUEUEABLE (HMAC-SHA256, the issuer's key for the node)",
            median_ns(|i| {
                black_box(hmac.sign(body(ContainerType::Queueable, i as u64)).unwrap());
            }),
        ),
        (
            "sign GUARANTEED (Ed25519)",
            median_ns(|i| {
                black_box(ed.sign(body(ContainerType::Guaranteed, i as u64)).unwrap());
            }),
        ),
        (
            "node check QUEUEABLE token (derive issuer key + HMAC verify + rules)",
            median_ns(|_| {
                verifier.check(black_box(&q), &app, 1).unwrap();
            }),
        ),
        (
            "node check GUARANTEED token (Ed25519 verify + rules)",
            median_ns(|_| {
                verifier.check(black_box(&g), &app, 1).unwrap();
            }),
        ),
        (
            "coordinator: one scheduler's keys for a 1,000-node directory",
            median_ns(|i| {
                black_box(issuer_keys(i));
            }),
        ),
        (
            "scheduler: install keys for a 1,000-node directory",
            median_ns(|_| {
                let mut s = hmac.clone();
                s.replace_keys(black_box(&keys_of_3));
                black_box(s);
            }),
        ),
    ];
    for (what, ns) in rows {
        println!("{what:<72} {:>11.0} ns", ns);
    }
}
