//! Cost of signing and checking container tokens: HMAC-SHA256 (QUEUEABLE tokens, signed by every
//! worker's distributed scheduler) against Ed25519 (GUARANTEED tokens, signed by the coordinator
//! alone and verified by nodes with its public key). `cargo bench -p scheduler-core --bench
//! tokens`; prints the median of 15 rounds of ns per operation for each.

use scheduler_core::token::{
    ContainerToken, GuaranteedSigner, KeyRing, TokenBody, TokenKey, TokenVerifier,
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
        node_epoch: 9,
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
    let hmac = KeyRing::new(TokenKey::from_bytes(1, [7; 32]));
    let ed = GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [8; 32]))).unwrap();
    let app = AppId::from("analytics");
    let mut verifier = TokenVerifier::new(NodeId::from("worker-17"));
    verifier.set_keys(hmac.clone());
    verifier.set_guaranteed_keys(ed.public_ring());
    verifier.set_node_epoch(9);
    let q: ContainerToken = hmac.sign(body(ContainerType::Queueable, 1)).unwrap();
    let g: ContainerToken = ed.sign(body(ContainerType::Guaranteed, 1)).unwrap();

    let rows = [
        (
            "sign QUEUEABLE (HMAC-SHA256)",
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
            "node check QUEUEABLE token (HMAC verify + rules)",
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
    ];
    for (what, ns) in rows {
        println!("{what:<55} {:>9.0} ns", ns);
    }
}
