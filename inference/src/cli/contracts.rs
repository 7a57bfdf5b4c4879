//! `inference contracts`: the offline half of the Morpheus loop (§3.1) with the operator in it.
//! Job history becomes SLO contracts. Periodic jobs and their windows are inferred from
//! provenance (§4). Each job's skyline is the §5 LP fitted to its past runs. The operator's review
//! (sign-off, override or reject, per job) is applied. The contracts are written as a JSON array
//! that `testbed reservations submit` turns into recurring reservations.

use anyhow::{Context, Result, bail};
use inference::skyline::{RunSkyline, SkylineLpConfig, fit_skyline};
use inference::slo::{
    ContractOverride, ContractStatus, InferredSlo, ProvenanceEvent, SloConfig, SloContract,
    infer_slos, template_name,
};
use inference::traces::SkylineRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The operator's decision on one job's proposal (review file: `{"job": "sign_off"}`,
/// `{"job": "reject"}` or `{"job": {"override": {"deadline": 5400}}}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    SignOff,
    Reject,
    Override(ContractOverride),
}

/// A periodic job that got no contract, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    pub job: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContractsOutput {
    pub contracts: Vec<SloContract>,
    pub skipped: Vec<Skipped>,
}

/// Build the contracts of `events` with skylines fitted to `runs` (grouped by job template),
/// then apply `review`. A review entry naming no proposed contract is an error, so a typo cannot
/// silently leave a job unreviewed.
pub fn build(
    events: &[ProvenanceEvent],
    runs: &[SkylineRecord],
    review: &BTreeMap<String, Decision>,
    slo_config: &SloConfig,
    lp: &SkylineLpConfig,
) -> Result<ContractsOutput> {
    let slos: Vec<InferredSlo> = infer_slos(events, slo_config);
    let mut by_job: BTreeMap<String, Vec<RunSkyline>> = BTreeMap::new();
    for r in runs {
        let Some(job) = &r.job else {
            bail!(
                "skyline run {:?} has no \"job\": it cannot be matched to a periodic job",
                r.run
            );
        };
        by_job
            .entry(template_name(job))
            .or_default()
            .push(RunSkyline {
                run: r.run.clone(),
                values: r.skyline.clone(),
            });
    }
    let mut contracts = Vec::new();
    let mut skipped = Vec::new();
    for slo in &slos {
        if !slo.actionable {
            skipped.push(Skipped {
                job: slo.job.clone(),
                reason: "deadline evidence too variable (not actionable)".into(),
            });
            continue;
        }
        let key = template_name(&slo.job);
        let skyline = match by_job.get(&key) {
            Some(runs) => Some(
                fit_skyline(runs, lp)
                    .with_context(|| format!("fitting the skyline of {}", slo.job))?
                    .skyline,
            ),
            None => None,
        };
        let mut contract = SloContract::propose(slo, skyline);
        if let Some(decision) = review.get(&slo.job) {
            match decision {
                Decision::SignOff => contract.sign_off()?,
                Decision::Reject => contract.reject(),
                Decision::Override(changes) => contract.override_with(changes)?,
            }
        }
        if contract.status == ContractStatus::SignedOff && contract.skyline.is_none() {
            bail!(
                "{}: signed off without a skyline (no past runs in the skyline file and no override)",
                contract.job
            );
        }
        contracts.push(contract);
    }
    for job in review.keys() {
        if !contracts.iter().any(|c| &c.job == job) {
            bail!(
                "review names {job:?}, which has no proposed contract (periodic jobs: {})",
                contracts
                    .iter()
                    .map(|c| c.job.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(ContractsOutput { contracts, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference::slo::ProvenanceKind;

    /// An hourly job `etl_<n>` submitted at :10, starting at :12, ending at :30, read at :50.
    fn history(runs: usize) -> Vec<ProvenanceEvent> {
        let mut events = Vec::new();
        for n in 0..runs {
            let base = n as f64 * 3600.0;
            for (event, at) in [
                (ProvenanceKind::Submit, 600.0),
                (ProvenanceKind::Start, 720.0),
                (ProvenanceKind::End, 1800.0),
                (ProvenanceKind::OutputRead, 3000.0),
            ] {
                events.push(ProvenanceEvent {
                    job: format!("etl_{n}"),
                    instance: format!("etl_{n}"),
                    event,
                    time: base + at,
                });
            }
        }
        events
    }

    fn runs() -> Vec<SkylineRecord> {
        (0..6)
            .map(|n| SkylineRecord {
                job: Some(format!("etl_{n}")),
                run: format!("etl_{n}"),
                step_seconds: Some(60.0),
                skyline: vec![4.0, 8.0, 8.0, 2.0],
            })
            .collect()
    }

    #[test]
    fn review_signs_off_overrides_and_rejects() {
        let events = history(12);
        let slos = infer_slos(&events, &SloConfig::default());
        assert_eq!(slos.len(), 1, "{slos:?}");
        let job = slos[0].job.clone();
        let lp = SkylineLpConfig::default();

        let none = build(
            &events,
            &runs(),
            &BTreeMap::new(),
            &SloConfig::default(),
            &lp,
        )
        .unwrap();
        assert_eq!(none.contracts[0].status, ContractStatus::Proposed);
        let skyline = none.contracts[0].skyline.clone().expect("fitted");
        assert_eq!(skyline, vec![4, 8, 8, 2]);

        let review = BTreeMap::from([(job.clone(), Decision::SignOff)]);
        let out = build(&events, &runs(), &review, &SloConfig::default(), &lp).unwrap();
        assert_eq!(out.contracts[0].status, ContractStatus::SignedOff);

        let review = BTreeMap::from([(
            job.clone(),
            Decision::Override(ContractOverride {
                deadline: Some(3300.0),
                ..ContractOverride::default()
            }),
        )]);
        let out = build(&events, &runs(), &review, &SloConfig::default(), &lp).unwrap();
        assert_eq!(out.contracts[0].deadline, 3300.0);
        assert_eq!(out.contracts[0].overridden, vec!["deadline".to_string()]);

        let review = BTreeMap::from([(job.clone(), Decision::Reject)]);
        let out = build(&events, &runs(), &review, &SloConfig::default(), &lp).unwrap();
        assert_eq!(out.contracts[0].status, ContractStatus::Rejected);

        let review = BTreeMap::from([("nightly".to_string(), Decision::SignOff)]);
        let err = build(&events, &runs(), &review, &SloConfig::default(), &lp).unwrap_err();
        assert!(err.to_string().contains("nightly"), "{err}");
    }

    #[test]
    fn review_file_format() {
        let text = r#"{"a": "sign_off", "b": "reject", "c": {"override": {"deadline": 5400}}}"#;
        let review: BTreeMap<String, Decision> = serde_json::from_str(text).unwrap();
        assert_eq!(review["a"], Decision::SignOff);
        assert_eq!(review["b"], Decision::Reject);
        assert!(matches!(&review["c"], Decision::Override(o) if o.deadline == Some(5400.0)));
    }
}
