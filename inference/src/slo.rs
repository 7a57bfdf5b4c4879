//! Morpheus SLO inference (Morpheus §4): periodic-job detection, deadline inference from
//! provenance events, and the sign-off / override / reject life cycle of the inferred contract
//! (§3.2).
//!
//! # Provenance events (JSON lines)
//! One event per line:
//! `{"job": "daily_etl_2016-05-01", "instance": "run-17", "event": "end", "time": 1462150895.6}`
//! - `job`: the job name as submitted (it is templated, see [`template_name`], unless the caller
//!   already groups by a template such as Google's logical job name);
//! - `instance`: identifies one run;
//! - `event`: `submit`, `input_available` (last write to any input), `start`, `end`,
//!   `output_read` (a read of any output; the first one per instance counts);
//! - `time`: seconds on any fixed clock.
//!
//! # Rules
//! - Periodic: runs grouped by template whose submit inter-arrivals have
//!   CV = MAD / median ≤ `max_interarrival_cv`; the period is the median inter-arrival, snapped
//!   to a natural period (1 min … 1 week) when within `snap_tolerance` of it.
//! - Times are relative to the instance's period start `T_ref + i·P` (`T_ref`: first event of the
//!   periodic job; footnote 4 of §4), with `i` the submit time's period index rounded to the
//!   nearest integer.
//! - Actionable deadline: CV(T_outRead) ≤ `max_output_read_cv` and
//!   median((T_outRead − T_end) / (T_end − T_start)) ≥ `min_slack_ratio`.
//! - `a_j` = `start_percentile` of T_inAvail (default 95th), `d_j` = `deadline_percentile` of
//!   T_outRead (default 50th).
//! - Fallbacks, reported in the output: without `input_available` events, `a_j` uses the submit
//!   times (inputs are available at the latest when the job is submitted) — rule
//!   `submit_percentile`; without `output_read` events, `d_j` is the `fallback_end_percentile`
//!   (default 95th) of T_end — rule `end_percentile_fallback` — and the deadline counts as
//!   actionable when CV(T_end) ≤ `max_output_read_cv` (the job completes at a near-fixed time of
//!   its period); the slack test cannot be applied and is reported as absent.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Replaces the parts of a job name that change from run to run (digit runs such as run
/// numbers and dates, and hexadecimal hashes of 8+ characters) with `#`.
pub fn template_name(name: &str) -> String {
    let mut output = String::with_capacity(name.len());
    let characters: Vec<char> = name.chars().collect();
    let mut index = 0;
    while index < characters.len() {
        let character = characters[index];
        if character.is_ascii_hexdigit() {
            let end = characters[index..]
                .iter()
                .position(|c| !c.is_ascii_hexdigit())
                .map_or(characters.len(), |offset| index + offset);
            let run = &characters[index..end];
            let has_digit = run.iter().any(char::is_ascii_digit);
            let all_digits = run.iter().all(char::is_ascii_digit);
            if all_digits || (run.len() >= 8 && has_digit) {
                output.push('#');
                index = end;
                continue;
            }
            // A word made of hex letters ("face", "bad") stays, but its digits are variable.
            for c in run {
                output.push(if c.is_ascii_digit() { '#' } else { *c });
            }
            index = end;
            continue;
        }
        output.push(character);
        index += 1;
    }
    // Collapse "#-#-#" (dates, versions) into one placeholder.
    let mut collapsed = String::with_capacity(output.len());
    let bytes: Vec<char> = output.chars().collect();
    let mut position = 0;
    while position < bytes.len() {
        collapsed.push(bytes[position]);
        if bytes[position] == '#' {
            let mut next = position + 1;
            while next + 1 < bytes.len()
                && matches!(bytes[next], '-' | '_' | '.' | ':' | '/')
                && bytes[next + 1] == '#'
            {
                next += 2;
            }
            position = next;
        } else {
            position += 1;
        }
    }
    collapsed
}

/// Linear-interpolated percentile (`p` in [0, 100]) of `values` (sorted in place).
pub fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (values.len() - 1) as f64;
    let lower = rank.floor() as usize;
    let upper = rank.ceil() as usize;
    let fraction = rank - lower as f64;
    Some(values[lower] + fraction * (values[upper] - values[lower]))
}

/// Robust coefficient of variation MAD / median (Morpheus §4). `None` for fewer than two values
/// or a zero median.
pub fn robust_cv(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let mut sorted = values.to_vec();
    let median = percentile(&mut sorted, 50.0)?;
    let mut deviations: Vec<f64> = values.iter().map(|v| (v - median).abs()).collect();
    let mad = percentile(&mut deviations, 50.0)?;
    if median.abs() <= f64::EPSILON {
        return None;
    }
    Some(mad / median.abs())
}

/// Natural periods jobs are scheduled at, in seconds.
pub const NATURAL_PERIODS: [(f64, &str); 14] = [
    (60.0, "1m"),
    (300.0, "5m"),
    (600.0, "10m"),
    (900.0, "15m"),
    (1800.0, "30m"),
    (3600.0, "1h"),
    (7200.0, "2h"),
    (10800.0, "3h"),
    (14400.0, "4h"),
    (21600.0, "6h"),
    (28800.0, "8h"),
    (43200.0, "12h"),
    (86400.0, "1d"),
    (604800.0, "1w"),
];

/// Snaps `period` to the nearest natural period within relative `tolerance`.
pub fn snap_period(period: f64, tolerance: f64) -> (f64, Option<&'static str>) {
    NATURAL_PERIODS
        .iter()
        .map(|(natural, name)| ((period - natural).abs() / natural, *natural, *name))
        .filter(|(distance, _, _)| *distance <= tolerance)
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or((period, None), |(_, natural, name)| (natural, Some(name)))
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeriodicConfig {
    /// Runs a template needs before it can be called periodic.
    pub min_runs: usize,
    /// Largest MAD/median of the inter-arrival times.
    pub max_interarrival_cv: f64,
    /// Relative distance within which a period snaps to a natural one.
    pub snap_tolerance: f64,
    /// Template job names (off when names are already templates, e.g. Google logical names).
    pub templatize: bool,
}

impl Default for PeriodicConfig {
    fn default() -> Self {
        Self {
            min_runs: 5,
            max_interarrival_cv: 0.1,
            snap_tolerance: 0.05,
            templatize: true,
        }
    }
}

/// One submission of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRun {
    pub name: String,
    pub instance: String,
    pub submit: f64,
}

/// A recurring job found in the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeriodicJob {
    pub template: String,
    pub runs: usize,
    /// Period used (snapped when close to a natural period), seconds.
    pub period: f64,
    /// Median inter-arrival before snapping.
    pub measured_period: f64,
    pub snapped_to: Option<String>,
    /// MAD / median of the inter-arrival times.
    pub interarrival_cv: f64,
    pub first_submit: f64,
}

/// Groups runs by (templated) name and keeps the groups with near-constant inter-arrivals.
/// Output is sorted by template.
pub fn detect_periodic(runs: &[JobRun], config: &PeriodicConfig) -> Vec<PeriodicJob> {
    let mut groups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in runs {
        if !run.submit.is_finite() {
            continue;
        }
        let key = if config.templatize {
            template_name(&run.name)
        } else {
            run.name.clone()
        };
        groups.entry(key).or_default().push(run.submit);
    }
    let mut periodic = Vec::new();
    for (template, mut submits) in groups {
        if submits.len() < config.min_runs.max(3) {
            continue;
        }
        submits.sort_by(f64::total_cmp);
        let gaps: Vec<f64> = submits.windows(2).map(|pair| pair[1] - pair[0]).collect();
        let Some(cv) = robust_cv(&gaps) else {
            continue;
        };
        if cv > config.max_interarrival_cv {
            continue;
        }
        let mut sorted_gaps = gaps.clone();
        let Some(measured) = percentile(&mut sorted_gaps, 50.0) else {
            continue;
        };
        if measured <= 0.0 {
            continue;
        }
        let (period, snapped) = snap_period(measured, config.snap_tolerance);
        periodic.push(PeriodicJob {
            template,
            runs: submits.len(),
            period,
            measured_period: measured,
            snapped_to: snapped.map(str::to_string),
            interarrival_cv: cv,
            first_submit: submits[0],
        });
    }
    periodic
}

/// Kind of provenance event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProvenanceKind {
    Submit,
    InputAvailable,
    Start,
    End,
    OutputRead,
}

/// One provenance event (JSON-lines record, see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProvenanceEvent {
    pub job: String,
    pub instance: String,
    pub event: ProvenanceKind,
    pub time: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SloConfig {
    pub periodic: PeriodicConfig,
    /// Largest CV(T_outRead) (or CV(T_end) under the fallback) for an actionable deadline.
    pub max_output_read_cv: f64,
    /// Smallest median slack ratio (T_outRead − T_end) / (T_end − T_start).
    pub min_slack_ratio: f64,
    /// Percentile of T_inAvail giving the earliest start a_j (paper example: 95th).
    pub start_percentile: f64,
    /// Percentile of T_outRead giving the deadline d_j (paper example: 50th).
    pub deadline_percentile: f64,
    /// Percentile of T_end used as deadline when no output reads are known.
    pub fallback_end_percentile: f64,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            periodic: PeriodicConfig::default(),
            max_output_read_cv: 0.25,
            min_slack_ratio: 0.1,
            start_percentile: 95.0,
            deadline_percentile: 50.0,
            fallback_end_percentile: 95.0,
        }
    }
}

/// Which evidence a window bound came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SloRule {
    InputAvailablePercentile,
    SubmitPercentile,
    OutputReadPercentile,
    EndPercentileFallback,
}

/// The SLO inferred for one periodic job. Times are seconds relative to the period start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferredSlo {
    pub job: String,
    pub period: f64,
    pub snapped_to: Option<String>,
    pub instances: usize,
    /// Absolute time of period 0's start.
    pub reference_time: f64,
    pub earliest_start: f64,
    pub deadline: f64,
    pub start_rule: SloRule,
    pub deadline_rule: SloRule,
    pub actionable: bool,
    /// CV of the deadline evidence (T_outRead, or T_end under the fallback).
    pub deadline_cv: Option<f64>,
    pub median_slack_ratio: Option<f64>,
    /// Median T_end − T_start of the instances.
    pub median_runtime: Option<f64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct InstanceTimes {
    submit: Option<f64>,
    input_available: Option<f64>,
    start: Option<f64>,
    end: Option<f64>,
    output_read: Option<f64>,
    first: f64,
}

fn keep_min(slot: &mut Option<f64>, value: f64) {
    *slot = Some(slot.map_or(value, |current| current.min(value)));
}

fn keep_max(slot: &mut Option<f64>, value: f64) {
    *slot = Some(slot.map_or(value, |current| current.max(value)));
}

/// Detects periodic jobs among `events` and infers their SLO windows.
pub fn infer_slos(events: &[ProvenanceEvent], config: &SloConfig) -> Vec<InferredSlo> {
    // job template -> instance -> times
    let mut jobs: BTreeMap<String, HashMap<String, InstanceTimes>> = BTreeMap::new();
    for event in events {
        if !event.time.is_finite() {
            continue;
        }
        let template = if config.periodic.templatize {
            template_name(&event.job)
        } else {
            event.job.clone()
        };
        let times = jobs
            .entry(template)
            .or_default()
            .entry(event.instance.clone())
            .or_insert(InstanceTimes {
                first: event.time,
                ..InstanceTimes::default()
            });
        times.first = times.first.min(event.time);
        match event.event {
            ProvenanceKind::Submit => keep_min(&mut times.submit, event.time),
            // T_inAvail is the last write to any input.
            ProvenanceKind::InputAvailable => keep_max(&mut times.input_available, event.time),
            ProvenanceKind::Start => keep_min(&mut times.start, event.time),
            ProvenanceKind::End => keep_max(&mut times.end, event.time),
            ProvenanceKind::OutputRead => keep_min(&mut times.output_read, event.time),
        }
    }
    let periodic_config = PeriodicConfig {
        templatize: false,
        ..config.periodic
    };
    let mut inferred = Vec::new();
    for (template, instances) in jobs {
        let runs: Vec<JobRun> = instances
            .iter()
            .filter_map(|(instance, times)| {
                times.submit.or(times.start).map(|submit| JobRun {
                    name: template.clone(),
                    instance: instance.clone(),
                    submit,
                })
            })
            .collect();
        let Some(periodic) = detect_periodic(&runs, &periodic_config).into_iter().next() else {
            continue;
        };
        let reference = instances
            .values()
            .map(|times| times.first)
            .fold(f64::INFINITY, f64::min);
        let period = periodic.period;
        // Instance i belongs to period round((submit_i − first submit) / P): rounding (rather
        // than flooring from the first event) keeps jitter around the first submission from
        // wrapping an instance into the previous period.
        let first_anchor = periodic.first_submit;
        let relative = |time: f64, anchor: f64| {
            let index = ((anchor - first_anchor) / period).round();
            time - (reference + index * period)
        };
        let mut input_available = Vec::new();
        let mut submits = Vec::new();
        let mut ends = Vec::new();
        let mut output_reads = Vec::new();
        let mut slack_ratios = Vec::new();
        let mut runtimes = Vec::new();
        for times in instances.values() {
            let anchor = times.submit.or(times.start).unwrap_or(times.first);
            if let Some(time) = times.input_available {
                input_available.push(relative(time, anchor));
            }
            if let Some(time) = times.submit.or(times.start) {
                submits.push(relative(time, anchor));
            }
            if let Some(end) = times.end {
                ends.push(relative(end, anchor));
                if let Some(start) = times.start
                    && end > start
                {
                    runtimes.push(end - start);
                    if let Some(read) = times.output_read {
                        slack_ratios.push((read - end) / (end - start));
                    }
                }
            }
            if let Some(read) = times.output_read {
                output_reads.push(relative(read, anchor));
            }
        }
        let (earliest_start, start_rule) = if input_available.len() * 2 >= instances.len() {
            (
                percentile(&mut input_available, config.start_percentile),
                SloRule::InputAvailablePercentile,
            )
        } else {
            (
                percentile(&mut submits, config.start_percentile),
                SloRule::SubmitPercentile,
            )
        };
        let median_slack_ratio = percentile(&mut slack_ratios, 50.0);
        let (deadline, deadline_rule, deadline_cv, actionable) = if !output_reads.is_empty() {
            let cv = robust_cv(&output_reads);
            let actionable = cv.is_some_and(|cv| cv <= config.max_output_read_cv)
                && median_slack_ratio.is_some_and(|ratio| ratio >= config.min_slack_ratio);
            (
                percentile(&mut output_reads, config.deadline_percentile),
                SloRule::OutputReadPercentile,
                cv,
                actionable,
            )
        } else {
            let cv = robust_cv(&ends);
            (
                percentile(&mut ends, config.fallback_end_percentile),
                SloRule::EndPercentileFallback,
                cv,
                cv.is_some_and(|cv| cv <= config.max_output_read_cv),
            )
        };
        let (Some(earliest_start), Some(deadline)) = (earliest_start, deadline) else {
            continue;
        };
        inferred.push(InferredSlo {
            job: template,
            period,
            snapped_to: periodic.snapped_to,
            instances: instances.len(),
            reference_time: reference,
            earliest_start,
            deadline,
            start_rule,
            deadline_rule,
            actionable: actionable && deadline > earliest_start,
            deadline_cv,
            median_slack_ratio,
            median_runtime: percentile(&mut runtimes, 50.0),
        });
    }
    inferred
}

/// Life-cycle state of an SLO contract (Morpheus §3.2: sign-off, override, reject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContractStatus {
    Proposed,
    SignedOff,
    /// The owner declined SLOs: the job runs with standard fair-queueing semantics.
    Rejected,
}

/// The recurring-reservation contract offered to a job owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloContract {
    pub job: String,
    pub period: f64,
    /// Earliest start, seconds after period start.
    pub earliest_start: f64,
    /// Deadline, seconds after period start.
    pub deadline: f64,
    /// Job resource model (containers per step), if fitted.
    pub skyline: Option<Vec<u64>>,
    pub status: ContractStatus,
    pub start_rule: SloRule,
    pub deadline_rule: SloRule,
    /// Names of the fields the owner overrode.
    pub overridden: Vec<String>,
}

/// Fields an owner may override; `None` keeps the inferred value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContractOverride {
    pub period: Option<f64>,
    pub earliest_start: Option<f64>,
    pub deadline: Option<f64>,
    pub skyline: Option<Vec<u64>>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContractError {
    #[error("contract for {job} was rejected; it cannot be {action}")]
    Rejected { job: String, action: &'static str },
    #[error("contract for {job} is already signed off")]
    AlreadySignedOff { job: String },
    #[error("invalid contract for {job}: {message}")]
    Invalid { job: String, message: String },
}

impl SloContract {
    /// The proposal made from an inferred SLO and an optional skyline.
    pub fn propose(slo: &InferredSlo, skyline: Option<Vec<u64>>) -> Self {
        Self {
            job: slo.job.clone(),
            period: slo.period,
            earliest_start: slo.earliest_start,
            deadline: slo.deadline,
            skyline,
            status: ContractStatus::Proposed,
            start_rule: slo.start_rule,
            deadline_rule: slo.deadline_rule,
            overridden: Vec::new(),
        }
    }

    fn validate(&self) -> Result<(), ContractError> {
        let invalid = |message: String| ContractError::Invalid {
            job: self.job.clone(),
            message,
        };
        if !(self.period.is_finite() && self.period > 0.0) {
            return Err(invalid(format!("period {} must be positive", self.period)));
        }
        if !(self.earliest_start.is_finite() && self.deadline.is_finite())
            || self.deadline <= self.earliest_start
        {
            return Err(invalid(format!(
                "deadline {} must come after earliest start {}",
                self.deadline, self.earliest_start
            )));
        }
        Ok(())
    }

    /// The owner approves the proposal as is.
    pub fn sign_off(&mut self) -> Result<(), ContractError> {
        match self.status {
            ContractStatus::Rejected => Err(ContractError::Rejected {
                job: self.job.clone(),
                action: "signed off",
            }),
            ContractStatus::SignedOff => Err(ContractError::AlreadySignedOff {
                job: self.job.clone(),
            }),
            ContractStatus::Proposed => {
                self.validate()?;
                self.status = ContractStatus::SignedOff;
                Ok(())
            }
        }
    }

    /// The owner approves with changes (any field). Allowed on proposed and signed-off
    /// contracts; the result is signed off. Invalid combinations leave the contract unchanged.
    pub fn override_with(&mut self, changes: &ContractOverride) -> Result<(), ContractError> {
        if self.status == ContractStatus::Rejected {
            return Err(ContractError::Rejected {
                job: self.job.clone(),
                action: "overridden",
            });
        }
        let mut updated = self.clone();
        if let Some(period) = changes.period {
            updated.period = period;
            updated.overridden.push("period".into());
        }
        if let Some(start) = changes.earliest_start {
            updated.earliest_start = start;
            updated.overridden.push("earliest_start".into());
        }
        if let Some(deadline) = changes.deadline {
            updated.deadline = deadline;
            updated.overridden.push("deadline".into());
        }
        if let Some(skyline) = &changes.skyline {
            updated.skyline = Some(skyline.clone());
            updated.overridden.push("skyline".into());
        }
        updated.overridden.sort();
        updated.overridden.dedup();
        updated.validate()?;
        updated.status = ContractStatus::SignedOff;
        *self = updated;
        Ok(())
    }

    /// The owner declines SLOs for this job.
    pub fn reject(&mut self) {
        self.status = ContractStatus::Rejected;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_strip_run_numbers_dates_and_hashes() {
        assert_eq!(template_name("etl_2016-05-01_run17"), "etl_#_run#");
        assert_eq!(template_name("etl_2016-05-02_run18"), "etl_#_run#");
        assert_eq!(template_name("job-3fa94c1d2b"), "job-#");
        assert_eq!(template_name("deadbeef-report"), "deadbeef-report");
        assert_eq!(template_name("tpch_q12_7"), "tpch_q#");
    }

    #[test]
    fn robust_cv_and_percentiles() {
        assert_eq!(percentile(&mut [3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&mut [0.0, 10.0], 95.0), Some(9.5));
        // median 10, deviations [0, 1, 1, 0, 30] -> MAD 1.
        let cv = robust_cv(&[10.0, 11.0, 9.0, 10.0, 40.0]).unwrap();
        assert!((cv - 0.1).abs() < 1e-12);
    }

    #[test]
    fn snaps_close_periods_only() {
        assert_eq!(snap_period(86_000.0, 0.05), (86_400.0, Some("1d")));
        assert_eq!(snap_period(3_500.0, 0.05), (3_600.0, Some("1h")));
        assert_eq!(snap_period(5_000.0, 0.05), (5_000.0, None));
    }

    #[test]
    fn detects_hourly_job_and_ignores_irregular_one() {
        let mut runs = Vec::new();
        for i in 0..24 {
            let jitter = f64::from(i % 3) * 20.0;
            runs.push(JobRun {
                name: format!("hourly_report_{i}"),
                instance: i.to_string(),
                submit: 1000.0 + f64::from(i) * 3590.0 + jitter,
            });
        }
        for (i, submit) in [0.0, 50.0, 4000.0, 4100.0, 20_000.0, 90_000.0]
            .iter()
            .enumerate()
        {
            runs.push(JobRun {
                name: format!("adhoc_{i}"),
                instance: i.to_string(),
                submit: *submit,
            });
        }
        let periodic = detect_periodic(&runs, &PeriodicConfig::default());
        assert_eq!(periodic.len(), 1);
        assert_eq!(periodic[0].template, "hourly_report_#");
        assert_eq!(periodic[0].period, 3600.0);
        assert_eq!(periodic[0].snapped_to.as_deref(), Some("1h"));
    }

    fn daily_events(with_reads: bool) -> Vec<ProvenanceEvent> {
        let mut events = Vec::new();
        for day in 0..10 {
            let base = f64::from(day) * 86_400.0;
            let wobble = f64::from(day % 4) * 60.0;
            let instance = format!("run-{day}");
            let mut push = |event, time| {
                events.push(ProvenanceEvent {
                    job: format!("daily_etl_2016-05-{:02}", day + 1),
                    instance: instance.clone(),
                    event,
                    time,
                })
            };
            push(ProvenanceKind::InputAvailable, base + 3_600.0 + wobble);
            push(ProvenanceKind::Submit, base + 3_700.0 + wobble);
            push(ProvenanceKind::Start, base + 3_800.0 + wobble);
            push(ProvenanceKind::End, base + 7_400.0 + wobble);
            if with_reads {
                push(ProvenanceKind::OutputRead, base + 14_400.0 + wobble / 2.0);
            }
        }
        events
    }

    #[test]
    fn infers_actionable_deadline_from_output_reads() {
        let slos = infer_slos(&daily_events(true), &SloConfig::default());
        assert_eq!(slos.len(), 1);
        let slo = &slos[0];
        assert_eq!(slo.period, 86_400.0);
        assert_eq!(slo.deadline_rule, SloRule::OutputReadPercentile);
        assert_eq!(slo.start_rule, SloRule::InputAvailablePercentile);
        assert!(slo.actionable, "{slo:?}");
        // Reference is the first event (day 0 input at 3,600 s), so times are relative to it:
        // input availability 0..180 s, 95th percentile 180; output reads 10,800 + 0..90 s, median 10,830.
        assert!((slo.earliest_start - 180.0).abs() < 1e-9, "{slo:?}");
        assert!((slo.deadline - 10_830.0).abs() < 1e-9, "{slo:?}");
        // Slack: (14,400 − 7,400) / 3,600 ≈ 1.94.
        assert!(slo.median_slack_ratio.unwrap() > 1.5);
    }

    #[test]
    fn falls_back_to_end_times_without_output_reads() {
        let slos = infer_slos(&daily_events(false), &SloConfig::default());
        assert_eq!(slos[0].deadline_rule, SloRule::EndPercentileFallback);
        assert!(slos[0].median_slack_ratio.is_none());
        assert!(slos[0].deadline > 3_700.0);
    }

    #[test]
    fn contract_life_cycle() {
        let slo = &infer_slos(&daily_events(true), &SloConfig::default())[0];
        let mut contract = SloContract::propose(slo, Some(vec![1, 2]));
        let mut copy = contract.clone();
        contract.sign_off().unwrap();
        assert_eq!(contract.status, ContractStatus::SignedOff);
        assert!(matches!(
            contract.sign_off(),
            Err(ContractError::AlreadySignedOff { .. })
        ));
        // Override any field; an impossible window is refused and changes nothing.
        let bad = ContractOverride {
            deadline: Some(-5.0),
            ..ContractOverride::default()
        };
        assert!(contract.override_with(&bad).is_err());
        assert!(contract.overridden.is_empty());
        contract
            .override_with(&ContractOverride {
                deadline: Some(20_000.0),
                skyline: Some(vec![5]),
                ..ContractOverride::default()
            })
            .unwrap();
        assert_eq!(contract.deadline, 20_000.0);
        assert_eq!(contract.overridden, vec!["deadline", "skyline"]);
        copy.reject();
        assert!(matches!(
            copy.sign_off(),
            Err(ContractError::Rejected { .. })
        ));
        assert!(copy.override_with(&ContractOverride::default()).is_err());
    }

    #[test]
    fn provenance_json_lines_round_trip() {
        let line = r#"{"job":"etl","instance":"r1","event":"output_read","time":12.5}"#;
        let event: ProvenanceEvent = serde_json::from_str(line).unwrap();
        assert_eq!(event.event, ProvenanceKind::OutputRead);
        assert!(
            serde_json::from_str::<ProvenanceEvent>(
                r#"{"job":"etl","instance":"r1","event":"finished","time":1}"#
            )
            .is_err()
        );
    }
}
