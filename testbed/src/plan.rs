//! `testbed plan`: build a reservation plan (Morpheus §6, `scheduler_core::reservation`) and
//! place, update and delete requests in the given order, printing what each got.
//!
//! Input (JSON, unknown fields refused):
//! `{"capacity": {"cpu_millis", "memory_mib"}, "step_ms", "horizon_ms"?, "algorithm": "lowcost" |
//! "greedy", "allocate_left", "existing": [{"start_ms", "end_ms", "cpu_millis", "memory_mib"}],
//! "operations": [{"op": "reserve" | "update", "id", "arrival_ms", "deadline_ms", "interpreter",
//! "recurrence_ms", "alignment_penalty"?, "stages": [{"containers", "gang", "duration_ms",
//! "size"}]}, {"op": "delete", "id"}]}`.

use anyhow::{Context, bail};
use scheduler_core::Resources;
use scheduler_core::reservation::{
    Algorithm, AllocationInterval, Interpreter, Plan, PlanConfig, Rejection, ReservationDefinition,
    Stage,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// The plan and operations, as JSON.
    #[arg(long)]
    pub input: PathBuf,
    /// Print one JSON object (otherwise one line per operation).
    #[arg(long)]
    pub json: bool,
}

/// The input; `Op` is the operations' raw JSON while parsing (see [`Operation::from_fields`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInput<Op = Operation> {
    pub capacity: Resources,
    pub step_ms: u64,
    /// Length of the agenda (the LCM of the periods); one day unless given.
    #[serde(default)]
    pub horizon_ms: Option<u64>,
    pub algorithm: Algorithm,
    #[serde(default)]
    pub allocate_left: bool,
    #[serde(default)]
    pub existing: Vec<Existing>,
    pub operations: Vec<Op>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Existing {
    pub start_ms: u64,
    pub end_ms: u64,
    pub cpu_millis: u64,
    pub memory_mib: u64,
}

#[derive(Debug)]
pub enum Operation {
    Reserve(Request),
    Update(Request),
    Delete(DeleteRequest),
}

impl Operation {
    /// Read `operations[index]` from its JSON fields. By hand rather than `#[serde(tag = "op")]`:
    /// serde buffers an internally tagged enum before reading its fields, which loses the path to
    /// a bad field; here errors read `operations[0].stages[1].gang: ...`.
    fn from_fields(
        index: usize,
        mut fields: serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<Operation> {
        fn read<T: serde::de::DeserializeOwned>(
            index: usize,
            fields: serde_json::Map<String, serde_json::Value>,
        ) -> anyhow::Result<T> {
            serde_path_to_error::deserialize(serde_json::Value::Object(fields)).map_err(|e| {
                let path = e.path().to_string();
                if path == "." {
                    anyhow::anyhow!("operations[{index}]: {}", e.inner())
                } else {
                    anyhow::anyhow!("operations[{index}].{path}: {}", e.inner())
                }
            })
        }
        match fields.remove("op") {
            Some(serde_json::Value::String(op)) => match op.as_str() {
                "reserve" => read(index, fields).map(Operation::Reserve),
                "update" => read(index, fields).map(Operation::Update),
                "delete" => read(index, fields).map(Operation::Delete),
                other => bail!(
                    "operations[{index}].op: unknown operation `{other}`, expected `reserve`, `update` or `delete`"
                ),
            },
            Some(other) => bail!(
                "operations[{index}].op: expected `reserve`, `update` or `delete`, got {other}"
            ),
            None => bail!("operations[{index}]: missing field `op`"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    pub id: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub id: String,
    pub arrival_ms: u64,
    pub deadline_ms: u64,
    pub interpreter: Interpreter,
    #[serde(default)]
    pub recurrence_ms: Option<u64>,
    #[serde(default)]
    pub alignment_penalty: f64,
    pub stages: Vec<StageInput>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageInput {
    pub containers: u32,
    pub gang: u32,
    pub duration_ms: u64,
    pub size: Resources,
}

impl Request {
    fn definition(&self) -> ReservationDefinition {
        ReservationDefinition {
            arrival_ms: self.arrival_ms,
            deadline_ms: self.deadline_ms,
            interpreter: self.interpreter,
            recurrence_ms: self.recurrence_ms,
            alignment_penalty: self.alignment_penalty,
            stages: self
                .stages
                .iter()
                .map(|s| Stage {
                    containers: s.containers,
                    gang: s.gang,
                    duration_ms: s.duration_ms,
                    size: s.size,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct OpResult {
    pub id: String,
    pub op: &'static str,
    pub accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation: Option<Vec<AllocationInterval>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PlanOutput {
    pub results: Vec<OpResult>,
    pub placement_us: Vec<u64>,
}

/// Parse and check the input; errors name the offending field.
pub fn parse(text: &str) -> anyhow::Result<(Plan, PlanInput)> {
    let raw: PlanInput<serde_json::Map<String, serde_json::Value>> =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text)).map_err(
            |e| {
                let path = e.path().to_string();
                if path == "." {
                    anyhow::anyhow!("bad plan input: {}", e.inner())
                } else {
                    anyhow::anyhow!("bad plan input: {path}: {}", e.inner())
                }
            },
        )?;
    let input = PlanInput {
        operations: raw
            .operations
            .into_iter()
            .enumerate()
            .map(|(i, fields)| Operation::from_fields(i, fields))
            .collect::<anyhow::Result<_>>()
            .context("bad plan input")?,
        capacity: raw.capacity,
        step_ms: raw.step_ms,
        horizon_ms: raw.horizon_ms,
        algorithm: raw.algorithm,
        allocate_left: raw.allocate_left,
        existing: raw.existing,
    };
    if input.step_ms == 0 {
        bail!("step_ms: must be positive");
    }
    if input.capacity.is_zero() {
        bail!("capacity: must not be zero");
    }
    let config = PlanConfig {
        step_ms: input.step_ms,
        horizon_ms: input.horizon_ms.unwrap_or(PlanConfig::default().horizon_ms),
        algorithm: input.algorithm,
        allocate_left: input.allocate_left,
        ..PlanConfig::default()
    };
    let mut plan = Plan::new(config, input.capacity).map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, op) in input.operations.iter().enumerate() {
        match op {
            Operation::Reserve(r) | Operation::Update(r) => {
                if r.id.is_empty() {
                    bail!("operations[{i}].id: must not be empty");
                }
                if let Err(Rejection::Invalid(m)) = plan.to_steps(&r.definition()) {
                    bail!("operations[{i}].{m}");
                }
            }
            Operation::Delete(d) if d.id.is_empty() => {
                bail!("operations[{i}].id: must not be empty")
            }
            Operation::Delete(_) => {}
        }
    }
    for (i, e) in input.existing.iter().enumerate() {
        let res = Resources::new(e.cpu_millis, e.memory_mib);
        plan.add_fixed(&format!("existing-{i}"), e.start_ms, e.end_ms, res)
            .map_err(|err| anyhow::anyhow!("existing[{i}]: {err}"))?;
    }
    Ok((plan, input))
}

/// Run the operations in order.
pub fn execute(plan: &mut Plan, input: &PlanInput) -> PlanOutput {
    let mut out = PlanOutput {
        results: Vec::new(),
        placement_us: Vec::new(),
    };
    for op in &input.operations {
        let start = Instant::now();
        let (id, name, result) = match op {
            Operation::Reserve(r) => (
                &r.id,
                "reserve",
                plan.reserve(&r.id, r.definition()).map(Some),
            ),
            Operation::Update(r) => (
                &r.id,
                "update",
                plan.update(&r.id, r.definition()).map(Some),
            ),
            Operation::Delete(d) => (
                &d.id,
                "delete",
                if plan.delete(&d.id) {
                    Ok(None)
                } else {
                    Err(Rejection::Unknown(d.id.clone()))
                },
            ),
        };
        out.placement_us.push(start.elapsed().as_micros() as u64);
        out.results.push(match result {
            Ok(allocation) => OpResult {
                id: id.clone(),
                op: name,
                accepted: true,
                allocation: Some(allocation.unwrap_or_default()),
                reason: None,
            },
            Err(e) => OpResult {
                id: id.clone(),
                op: name,
                accepted: false,
                allocation: None,
                reason: Some(e.to_string()),
            },
        });
    }
    out
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let (mut plan, input) = parse(&text)?;
    let out = execute(&mut plan, &input);
    if let Err(e) = plan.check_invariants() {
        bail!("internal error: plan invariant broken: {e}");
    }
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        for (r, us) in out.results.iter().zip(&out.placement_us) {
            match (&r.allocation, &r.reason) {
                (Some(a), _) => println!(
                    "{} {}: accepted, {} intervals ({us} us)",
                    r.op,
                    r.id,
                    a.len()
                ),
                (_, Some(why)) => println!("{} {}: rejected: {why} ({us} us)", r.op, r.id),
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Greedy favouring early: the request starts at its arrival and spills over the capacity
    /// left by the existing load.
    #[test]
    fn greedy_left() {
        let text = r#"{"capacity": {"cpu_millis": 10000, "memory_mib": 10240}, "step_ms": 60000,
          "horizon_ms": 3600000, "algorithm": "greedy", "allocate_left": true,
          "existing": [{"start_ms": 60000, "end_ms": 120000, "cpu_millis": 6000, "memory_mib": 0}],
          "operations": [{"op": "reserve", "id": "g", "arrival_ms": 0, "deadline_ms": 600000,
            "interpreter": "all", "recurrence_ms": null,
            "stages": [{"containers": 6, "gang": 1, "duration_ms": 120000,
                        "size": {"cpu_millis": 1000, "memory_mib": 1024}}]}]}"#;
        let (mut plan, input) = parse(text).unwrap();
        let out = execute(&mut plan, &input);
        plan.check_invariants().unwrap();
        // [0,2) has 4 free at step 1 → 4 there; the constraining step is 1, so the next range
        // is [2,4) → 2 there.
        let iv = |s: u64, e: u64, n: u64| AllocationInterval {
            start_ms: s * 60_000,
            end_ms: e * 60_000,
            cpu_millis: n * 1000,
            memory_mib: n * 1024,
        };
        assert_eq!(
            out.results[0].allocation.as_deref(),
            Some(&[iv(0, 2, 4), iv(2, 4, 2)][..])
        );
    }

    #[test]
    fn existing_over_capacity_is_an_input_error() {
        let text = r#"{"capacity": {"cpu_millis": 1000, "memory_mib": 1024}, "step_ms": 60000,
          "algorithm": "lowcost", "existing": [{"start_ms": 0, "end_ms": 60000,
          "cpu_millis": 2000, "memory_mib": 0}], "operations": []}"#;
        let err = parse(text).unwrap_err().to_string();
        assert!(err.starts_with("existing[0]"), "{err}");
    }
}
