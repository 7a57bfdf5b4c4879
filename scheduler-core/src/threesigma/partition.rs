//! Job descriptions and equivalence sets (§4.3.3): nodes that no job's constraint tells apart
//! form one partition, so the MILP's size depends on the number of partitions, not nodes.

use super::{PartitionChoice, ThreeSigmaError, Utility};
use crate::Resources;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A constraint on a node attribute (`worker run --attribute k=v`): the node's value for `key`
/// must be one of `values`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeConstraint {
    pub key: String,
    pub values: Vec<String>,
}

impl NodeConstraint {
    pub fn holds(&self, attributes: &BTreeMap<String, String>) -> bool {
        attributes
            .get(&self.key)
            .is_some_and(|v| self.values.iter().any(|allowed| allowed == v))
    }
}

/// What a GUARANTEED ask says about its job so 3σSched can plan it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDescription {
    pub utility: Utility,
    /// The features 3σPredict keys its histories on (user, job name, logical name, …).
    pub features: Vec<(String, String)>,
    /// Containers started together.
    pub gang: u32,
    /// Size of each container.
    pub container: Resources,
    /// Nodes the job may run on (all of them must hold).
    #[serde(default)]
    pub required: Vec<NodeConstraint>,
    /// Nodes the job prefers (soft, §5); elsewhere it runs `non_preferred_slowdown` × longer.
    #[serde(default)]
    pub preferred: Vec<NodeConstraint>,
    #[serde(default = "default_slowdown")]
    pub non_preferred_slowdown: f64,
}

/// §5: "SLO jobs run 1.5x longer if scheduled on non-preferred resources".
fn default_slowdown() -> f64 {
    1.5
}

/// Bounds on a description (bad input gets a clear error, not a huge model).
pub const MAX_GANG: u32 = 100_000;
pub const MAX_FEATURES: usize = 32;
pub const MAX_CONSTRAINTS: usize = 16;

impl JobDescription {
    pub fn validate(&self) -> Result<(), ThreeSigmaError> {
        let bad = |m: String| Err(ThreeSigmaError::BadDescription(m));
        if self.gang == 0 || self.gang > MAX_GANG {
            return bad(format!("gang must be in 1..={MAX_GANG}, got {}", self.gang));
        }
        if self.features.len() > MAX_FEATURES {
            return bad(format!("at most {MAX_FEATURES} features"));
        }
        if self.required.len() + self.preferred.len() > MAX_CONSTRAINTS {
            return bad(format!("at most {MAX_CONSTRAINTS} node constraints"));
        }
        if !(self.non_preferred_slowdown.is_finite() && self.non_preferred_slowdown >= 1.0) {
            return bad(format!(
                "non_preferred_slowdown must be ≥ 1, got {}",
                self.non_preferred_slowdown
            ));
        }
        let finite = match self.utility {
            Utility::Slo { deadline, value } => deadline.is_finite() && value.is_finite(),
            Utility::SloDecaying {
                deadline,
                value,
                after_deadline,
                zero_at,
            } => {
                deadline.is_finite()
                    && value.is_finite()
                    && after_deadline.is_finite()
                    && zero_at > deadline
            }
            Utility::BestEffort {
                submit,
                value,
                zero_at,
            } => submit.is_finite() && value.is_finite() && zero_at > submit,
        };
        if !finite || self.utility.peak() < 0.0 {
            return bad(format!("utility is not well formed: {:?}", self.utility));
        }
        Ok(())
    }

    /// The partitions this job may use, with its runtime factor in each.
    pub fn choices(&self, partitioning: &Partitioning) -> Vec<PartitionChoice> {
        partitioning
            .representatives
            .iter()
            .enumerate()
            .filter(|(_, attributes)| self.required.iter().all(|c| c.holds(attributes)))
            .map(|(partition, attributes)| PartitionChoice {
                partition,
                runtime_factor: if self.preferred.iter().all(|c| c.holds(attributes)) {
                    1.0
                } else {
                    self.non_preferred_slowdown
                },
            })
            .collect()
    }
}

/// Nodes grouped by which constraints they satisfy.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Partitioning {
    /// Partition of each node (same order as the input).
    pub node_partition: Vec<usize>,
    /// Nodes of each partition.
    pub members: Vec<Vec<usize>>,
    /// Attributes of one node of each partition (all members agree on every constraint).
    pub representatives: Vec<BTreeMap<String, String>>,
}

/// The coarsest partition of nodes such that every constraint holds on all or none of the nodes
/// of a partition: a job's equivalence set is then a union of partitions (§4.3.3, after
/// TetriSched's partitions). Partitions are numbered in order of their first node.
pub fn equivalence_partitions(
    nodes: &[BTreeMap<String, String>],
    constraints: &[NodeConstraint],
) -> Partitioning {
    let mut distinct: Vec<&NodeConstraint> = Vec::new();
    for c in constraints {
        if !distinct.contains(&c) {
            distinct.push(c);
        }
    }
    let mut by_signature: HashMap<Vec<bool>, usize> = HashMap::new();
    let mut partitioning = Partitioning::default();
    for (node, attributes) in nodes.iter().enumerate() {
        let signature: Vec<bool> = distinct.iter().map(|c| c.holds(attributes)).collect();
        let next = partitioning.members.len();
        let partition = *by_signature.entry(signature).or_insert(next);
        if partition == next {
            partitioning.members.push(Vec::new());
            partitioning.representatives.push(attributes.clone());
        }
        partitioning.members[partition].push(node);
        partitioning.node_partition.push(partition);
    }
    partitioning
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(rack: &str, gpu: bool) -> BTreeMap<String, String> {
        let mut a = BTreeMap::new();
        a.insert("rack".to_string(), rack.to_string());
        if gpu {
            a.insert("gpu".to_string(), "yes".to_string());
        }
        a
    }

    #[test]
    fn partitions_follow_the_constraints_only() {
        let nodes = vec![
            node("r0", false),
            node("r0", true),
            node("r1", false),
            node("r1", false),
            node("r2", true),
        ];
        let gpu = NodeConstraint {
            key: "gpu".into(),
            values: vec!["yes".into()],
        };
        let racks01 = NodeConstraint {
            key: "rack".into(),
            values: vec!["r0".into(), "r1".into()],
        };
        let p = equivalence_partitions(&nodes, &[gpu.clone(), racks01.clone(), gpu.clone()]);
        // Signatures: (no gpu, r0/1) = {0, 2, 3}; (gpu, r0/1) = {1}; (gpu, r2) = {4}.
        assert_eq!(p.members, vec![vec![0, 2, 3], vec![1], vec![4]]);
        assert_eq!(p.node_partition, vec![0, 1, 0, 0, 2]);
        let job = JobDescription {
            utility: Utility::Slo {
                deadline: 10.0,
                value: 1.0,
            },
            features: vec![],
            gang: 1,
            container: Resources::ZERO,
            required: vec![gpu],
            preferred: vec![racks01],
            non_preferred_slowdown: 1.5,
        };
        job.validate().unwrap();
        let choices = job.choices(&p);
        assert_eq!(choices.len(), 2);
        assert_eq!((choices[0].partition, choices[0].runtime_factor), (1, 1.0));
        assert_eq!((choices[1].partition, choices[1].runtime_factor), (2, 1.5));
        // No constraints at all: one partition.
        assert_eq!(equivalence_partitions(&nodes, &[]).members.len(), 1);
    }

    #[test]
    fn bad_descriptions_name_what_is_wrong() {
        let mut job = JobDescription {
            utility: Utility::BestEffort {
                submit: 0.0,
                value: 1.0,
                zero_at: 0.0,
            },
            features: vec![],
            gang: 1,
            container: Resources::ZERO,
            required: vec![],
            preferred: vec![],
            non_preferred_slowdown: 1.5,
        };
        let e = job.validate().unwrap_err().to_string();
        assert!(e.contains("utility"), "{e}");
        job.utility = Utility::BestEffort {
            submit: 0.0,
            value: 1.0,
            zero_at: 5.0,
        };
        job.gang = 0;
        assert!(job.validate().unwrap_err().to_string().contains("gang"));
    }
}
