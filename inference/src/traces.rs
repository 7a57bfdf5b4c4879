//! Readers for the trace formats the inference tools consume. Every reader works on any
//! `BufRead` (with a source name for messages) and has a `*_file` helper that opens a path,
//! transparently gunzipping `.gz` files. Malformed input is reported as a [`TraceError`] naming
//! the file and the 1-based line; nothing panics on bad data.
//!
//! Formats (see each trace's `PROVENANCE.md` under `../shared/data/traces/`):
//! - SWF (Parallel Workloads Archive), 18 whitespace-separated fields, `;` comments.
//! - Google clusterdata-2011 `job_events` and `task_events` CSV shards (no header).
//! - Alibaba cluster-trace-v2017 `batch_task.csv` (optional header line).
//! - Bitbrains GWA-T-12 per-VM CSV (`;\t` separated, one header line).
//! - PlanetLab CoMon per-VM files: one CPU percentage per line, 300 s apart.
//! - Hadoop resource-estimator "native" one-line-per-run skylines.
//! - JSON lines: our own skylines ([`SkylineRecord`]) and provenance events
//!   ([`crate::slo::ProvenanceEvent`]).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::skyline::RunSkyline;

/// A trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The message already includes the I/O error, so it is not repeated as a source.
    #[error("{file}: {error}")]
    Io { file: String, error: std::io::Error },
    #[error("{file}:{line}: {message}")]
    Malformed {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
}

impl TraceError {
    fn malformed(file: &str, line: usize, message: impl Into<String>) -> Self {
        TraceError::Malformed {
            file: file.to_string(),
            line,
            message: message.into(),
        }
    }
}

/// Opens `path` for line reading, gunzipping when the name ends in `.gz` or the content starts
/// with the gzip magic bytes.
pub fn open_lines(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let name = path.display().to_string();
    let io_error = |error| TraceError::Io {
        file: name.clone(),
        error,
    };
    let mut file = BufReader::new(File::open(path).map_err(io_error)?);
    let magic = file.fill_buf().map_err(io_error)?;
    let gzipped = magic.starts_with(&[0x1f, 0x8b])
        || path.extension().is_some_and(|extension| extension == "gz");
    if gzipped {
        let decoder: Box<dyn Read> = Box::new(flate2::read::MultiGzDecoder::new(file));
        Ok(Box::new(BufReader::new(decoder)))
    } else {
        Ok(Box::new(file))
    }
}

/// Files of a directory (sorted by name), or the path itself if it is a file.
pub fn files_in(path: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let name = path.display().to_string();
    let metadata = std::fs::metadata(path).map_err(|error| TraceError::Io {
        file: name.clone(),
        error,
    })?;
    if metadata.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let entries = std::fs::read_dir(path).map_err(|error| TraceError::Io {
        file: name.clone(),
        error,
    })?;
    for entry in entries {
        let entry = entry.map_err(|error| TraceError::Io {
            file: name.clone(),
            error,
        })?;
        let entry_path = entry.path();
        let hidden = entry_path
            .file_name()
            .is_some_and(|file| file.to_string_lossy().starts_with('.'));
        let is_documentation = entry_path
            .extension()
            .is_some_and(|extension| extension == "md");
        if entry_path.is_file() && !hidden && !is_documentation {
            files.push(entry_path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(TraceError::Invalid {
            file: name,
            message: "directory holds no trace files".into(),
        });
    }
    Ok(files)
}

/// Calls `handle(line_number, line)` for every line; I/O errors name the file.
fn for_each_line(
    reader: impl BufRead,
    file: &str,
    mut handle: impl FnMut(usize, &str) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(|error| TraceError::Io {
            file: format!("{file}:{}", index + 1),
            error,
        })?;
        handle(index + 1, line.trim_end_matches('\r'))?;
    }
    Ok(())
}

fn parse_number<T: std::str::FromStr>(
    text: &str,
    what: &str,
    file: &str,
    line: usize,
) -> Result<T, TraceError> {
    text.trim().parse().map_err(|_| {
        TraceError::malformed(
            file,
            line,
            format!("{what}: cannot parse {text:?} as a number"),
        )
    })
}

fn parse_optional<T: std::str::FromStr>(
    text: &str,
    what: &str,
    file: &str,
    line: usize,
) -> Result<Option<T>, TraceError> {
    if text.trim().is_empty() {
        Ok(None)
    } else {
        parse_number(text, what, file, line).map(Some)
    }
}

// ---------------------------------------------------------------------------------------------
// SWF

/// One job of a Standard Workload Format log. `-1` in the log (unknown) becomes `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwfJob {
    pub job: u64,
    pub submit: f64,
    pub wait: Option<f64>,
    pub run_time: Option<f64>,
    pub allocated_processors: Option<f64>,
    pub requested_processors: Option<f64>,
    pub requested_time: Option<f64>,
    pub requested_memory: Option<f64>,
    pub status: Option<i64>,
    pub user: Option<i64>,
    pub group: Option<i64>,
    pub executable: Option<i64>,
    pub queue: Option<i64>,
    pub partition: Option<i64>,
}

pub fn read_swf(reader: impl BufRead, file: &str) -> Result<Vec<SwfJob>, TraceError> {
    let mut jobs = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with(';') {
            return Ok(());
        }
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        if fields.len() != 18 {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!("SWF needs 18 fields, found {}", fields.len()),
            ));
        }
        let number = |index: usize, what: &str| -> Result<f64, TraceError> {
            parse_number::<f64>(fields[index], what, file, line_number)
        };
        let known = |value: f64| (value >= 0.0).then_some(value);
        let known_int = |value: f64| (value >= 0.0).then_some(value as i64);
        let job = number(0, "job number")?;
        jobs.push(SwfJob {
            job: job.max(0.0) as u64,
            submit: number(1, "submit time")?,
            wait: known(number(2, "wait time")?),
            run_time: known(number(3, "run time")?),
            allocated_processors: known(number(4, "allocated processors")?),
            requested_processors: known(number(7, "requested processors")?),
            requested_time: known(number(8, "requested time")?),
            requested_memory: known(number(9, "requested memory")?),
            status: Some(number(10, "status")? as i64),
            user: known_int(number(11, "user id")?),
            group: known_int(number(12, "group id")?),
            executable: known_int(number(13, "executable id")?),
            queue: known_int(number(14, "queue id")?),
            partition: known_int(number(15, "partition id")?),
        });
        Ok(())
    })?;
    Ok(jobs)
}

pub fn read_swf_file(path: &Path) -> Result<Vec<SwfJob>, TraceError> {
    read_swf(open_lines(path)?, &path.display().to_string())
}

// ---------------------------------------------------------------------------------------------
// Google clusterdata-2011

/// Event types of the 2011 trace's job and task event tables.
pub mod google_event {
    pub const SUBMIT: u8 = 0;
    pub const SCHEDULE: u8 = 1;
    pub const EVICT: u8 = 2;
    pub const FAIL: u8 = 3;
    pub const FINISH: u8 = 4;
    pub const KILL: u8 = 5;
    pub const LOST: u8 = 6;
}

/// A row of `job_events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoogleJobEvent {
    /// Microseconds since trace start.
    pub time_us: u64,
    pub job_id: u64,
    pub event_type: u8,
    pub user: String,
    pub scheduling_class: Option<u8>,
    pub job_name: String,
    pub logical_job_name: String,
}

pub fn read_google_job_events(
    reader: impl BufRead,
    file: &str,
) -> Result<Vec<GoogleJobEvent>, TraceError> {
    let mut events = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != 8 {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!("job_events needs 8 fields, found {}", fields.len()),
            ));
        }
        events.push(GoogleJobEvent {
            time_us: parse_number(fields[0], "timestamp", file, line_number)?,
            job_id: parse_number(fields[2], "job ID", file, line_number)?,
            event_type: parse_number(fields[3], "event type", file, line_number)?,
            user: fields[4].to_string(),
            scheduling_class: parse_optional(fields[5], "scheduling class", file, line_number)?,
            job_name: fields[6].to_string(),
            logical_job_name: fields[7].to_string(),
        });
        Ok(())
    })?;
    Ok(events)
}

/// Reads a `job_events` shard or a directory of shards (in file-name order).
pub fn read_google_job_events_path(path: &Path) -> Result<Vec<GoogleJobEvent>, TraceError> {
    let mut events = Vec::new();
    for file in files_in(path)? {
        events.extend(read_google_job_events(
            open_lines(&file)?,
            &file.display().to_string(),
        )?);
    }
    Ok(events)
}

/// A row of `task_events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoogleTaskEvent {
    pub time_us: u64,
    pub job_id: u64,
    pub task_index: u64,
    pub machine_id: Option<u64>,
    pub event_type: u8,
    pub user: String,
    pub scheduling_class: Option<u8>,
    pub priority: Option<u8>,
    pub cpu_request: Option<f64>,
    pub memory_request: Option<f64>,
    pub disk_request: Option<f64>,
}

pub fn read_google_task_events(
    reader: impl BufRead,
    file: &str,
) -> Result<Vec<GoogleTaskEvent>, TraceError> {
    let mut events = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != 13 {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!("task_events needs 13 fields, found {}", fields.len()),
            ));
        }
        events.push(GoogleTaskEvent {
            time_us: parse_number(fields[0], "timestamp", file, line_number)?,
            job_id: parse_number(fields[2], "job ID", file, line_number)?,
            task_index: parse_number(fields[3], "task index", file, line_number)?,
            machine_id: parse_optional(fields[4], "machine ID", file, line_number)?,
            event_type: parse_number(fields[5], "event type", file, line_number)?,
            user: fields[6].to_string(),
            scheduling_class: parse_optional(fields[7], "scheduling class", file, line_number)?,
            priority: parse_optional(fields[8], "priority", file, line_number)?,
            cpu_request: parse_optional(fields[9], "CPU request", file, line_number)?,
            memory_request: parse_optional(fields[10], "memory request", file, line_number)?,
            disk_request: parse_optional(fields[11], "disk request", file, line_number)?,
        });
        Ok(())
    })?;
    Ok(events)
}

pub fn read_google_task_events_path(path: &Path) -> Result<Vec<GoogleTaskEvent>, TraceError> {
    let mut events = Vec::new();
    for file in files_in(path)? {
        events.extend(read_google_task_events(
            open_lines(&file)?,
            &file.display().to_string(),
        )?);
    }
    Ok(events)
}

/// One job reconstructed from `job_events`: submitted, scheduled and ended in the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoogleJob {
    pub job_id: u64,
    pub user: String,
    pub scheduling_class: Option<u8>,
    pub job_name: String,
    pub logical_job_name: String,
    /// Seconds since trace start.
    pub submit: f64,
    pub schedule: f64,
    pub end: f64,
    /// The terminal event type (FINISH, KILL, FAIL, …).
    pub end_event: u8,
}

impl GoogleJob {
    /// Runtime as the trace's documentation defines it: end − schedule.
    pub fn runtime(&self) -> f64 {
        self.end - self.schedule
    }
}

/// Joins job events into jobs with SUBMIT, first SCHEDULE and a terminal event after it.
/// Jobs already running at trace start (submitted at t = 0) are dropped: their submit time is
/// not real. `finished_only` keeps only jobs whose terminal event is FINISH.
pub fn google_jobs(events: &[GoogleJobEvent], finished_only: bool) -> Vec<GoogleJob> {
    use std::collections::HashMap;
    struct Partial {
        submit: Option<u64>,
        schedule: Option<u64>,
        end: Option<(u64, u8)>,
        first: usize,
    }
    let mut partials: HashMap<u64, Partial> = HashMap::new();
    for (index, event) in events.iter().enumerate() {
        let partial = partials.entry(event.job_id).or_insert(Partial {
            submit: None,
            schedule: None,
            end: None,
            first: index,
        });
        match event.event_type {
            google_event::SUBMIT => {
                partial.submit.get_or_insert(event.time_us);
            }
            google_event::SCHEDULE => {
                partial.schedule.get_or_insert(event.time_us);
            }
            // EVICT is not terminal: an evicted job is rescheduled.
            google_event::FAIL..=google_event::LOST => {
                partial.end = Some((event.time_us, event.event_type));
            }
            _ => {}
        }
    }
    let mut jobs: Vec<GoogleJob> = partials
        .into_iter()
        .filter_map(|(job_id, partial)| {
            let submit = partial.submit.filter(|time| *time > 0)?;
            let schedule = partial.schedule?;
            let (end, end_event) = partial.end?;
            if end < schedule || (finished_only && end_event != google_event::FINISH) {
                return None;
            }
            let first = &events[partial.first];
            Some(GoogleJob {
                job_id,
                user: first.user.clone(),
                scheduling_class: first.scheduling_class,
                job_name: first.job_name.clone(),
                logical_job_name: first.logical_job_name.clone(),
                submit: submit as f64 / 1e6,
                schedule: schedule as f64 / 1e6,
                end: end as f64 / 1e6,
                end_event,
            })
        })
        .collect();
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit).then(a.job_id.cmp(&b.job_id)));
    jobs
}

// ---------------------------------------------------------------------------------------------
// Alibaba 2017 batch_task

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlibabaTask {
    pub create_time: f64,
    pub end_time: f64,
    pub job_id: u64,
    pub task_id: u64,
    pub instances: u64,
    pub status: String,
    pub cpus_per_instance: Option<f64>,
    pub memory_per_instance: Option<f64>,
}

pub fn read_alibaba_tasks(
    reader: impl BufRead,
    file: &str,
) -> Result<Vec<AlibabaTask>, TraceError> {
    let mut tasks = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        let trimmed = line.trim();
        if trimmed.is_empty() || (line_number == 1 && trimmed.starts_with("task_create_time")) {
            return Ok(());
        }
        let fields: Vec<&str> = trimmed.split(',').map(str::trim).collect();
        if fields.len() != 8 {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!("batch_task needs 8 fields, found {}", fields.len()),
            ));
        }
        tasks.push(AlibabaTask {
            create_time: parse_number(fields[0], "task_create_time", file, line_number)?,
            end_time: parse_number(fields[1], "task_end_time", file, line_number)?,
            job_id: parse_number(fields[2], "job_id", file, line_number)?,
            task_id: parse_number(fields[3], "task_id", file, line_number)?,
            instances: parse_number(fields[4], "number_of_instances", file, line_number)?,
            status: fields[5].to_string(),
            cpus_per_instance: parse_optional(fields[6], "cpus requested", file, line_number)?,
            memory_per_instance: parse_optional(fields[7], "memory requested", file, line_number)?,
        });
        Ok(())
    })?;
    Ok(tasks)
}

pub fn read_alibaba_tasks_file(path: &Path) -> Result<Vec<AlibabaTask>, TraceError> {
    read_alibaba_tasks(open_lines(path)?, &path.display().to_string())
}

// ---------------------------------------------------------------------------------------------
// Bitbrains and PlanetLab usage series

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BitbrainsSample {
    /// Unix epoch seconds (the header says ms; the values are seconds).
    pub timestamp: f64,
    pub cpu_cores: f64,
    pub cpu_capacity_mhz: f64,
    pub cpu_usage_mhz: f64,
    pub cpu_usage_percent: f64,
    pub memory_capacity_kb: f64,
    pub memory_usage_kb: f64,
}

/// Reads one Bitbrains VM file. Rows repeating the previous timestamp are dropped (PROVENANCE:
/// VM 14 in September repeats about 2,000 timestamps).
pub fn read_bitbrains(
    reader: impl BufRead,
    file: &str,
) -> Result<Vec<BitbrainsSample>, TraceError> {
    let mut samples: Vec<BitbrainsSample> = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("Timestamp") {
            return Ok(());
        }
        let fields: Vec<&str> = trimmed.split(';').map(str::trim).collect();
        if fields.len() < 7 {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!(
                    "Bitbrains rows need 11 ';'-separated fields, found {}",
                    fields.len()
                ),
            ));
        }
        let value =
            |index: usize, what: &str| parse_number::<f64>(fields[index], what, file, line_number);
        let sample = BitbrainsSample {
            timestamp: value(0, "timestamp")?,
            cpu_cores: value(1, "CPU cores")?,
            cpu_capacity_mhz: value(2, "CPU capacity")?,
            cpu_usage_mhz: value(3, "CPU usage [MHZ]")?,
            cpu_usage_percent: value(4, "CPU usage [%]")?,
            memory_capacity_kb: value(5, "memory capacity")?,
            memory_usage_kb: value(6, "memory usage")?,
        };
        if samples
            .last()
            .is_none_or(|previous| previous.timestamp != sample.timestamp)
        {
            samples.push(sample);
        }
        Ok(())
    })?;
    Ok(samples)
}

pub fn read_bitbrains_file(path: &Path) -> Result<Vec<BitbrainsSample>, TraceError> {
    read_bitbrains(open_lines(path)?, &path.display().to_string())
}

/// Reads one PlanetLab file: one CPU utilisation percentage per line.
pub fn read_planetlab(reader: impl BufRead, file: &str) -> Result<Vec<f64>, TraceError> {
    let mut values = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return Ok(());
        }
        let value: f64 = parse_number(trimmed, "CPU utilisation", file, line_number)?;
        if !(0.0..=100.0).contains(&value) {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!("CPU utilisation {value} outside 0–100"),
            ));
        }
        values.push(value);
        Ok(())
    })?;
    Ok(values)
}

pub fn read_planetlab_file(path: &Path) -> Result<Vec<f64>, TraceError> {
    read_planetlab(open_lines(path)?, &path.display().to_string())
}

// ---------------------------------------------------------------------------------------------
// Skylines: Hadoop resource estimator native format and JSON lines

/// One run in the Hadoop resource estimator's native format:
/// `NormalizedJobName NumInstances SubmitTime StartTime EndTime JobInstanceName memUsage coreUsage`
/// where the usages are `value:offsetSeconds|…` skylines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct YarnNativeRun {
    pub pipeline: String,
    pub instances: u64,
    pub submit_ms: u64,
    pub start_ms: u64,
    pub end_ms: u64,
    pub run: String,
    /// (value, offset seconds) pairs of the 7th field.
    pub memory: Vec<(f64, u64)>,
    /// (value, offset seconds) pairs of the 8th field: the container counts the Hadoop estimator
    /// reads.
    pub containers: Vec<(f64, u64)>,
}

fn parse_usage(
    text: &str,
    what: &str,
    file: &str,
    line: usize,
) -> Result<Vec<(f64, u64)>, TraceError> {
    text.split('|')
        .filter(|unit| !unit.is_empty())
        .map(|unit| {
            let (value, offset) = unit.split_once(':').ok_or_else(|| {
                TraceError::malformed(file, line, format!("{what}: {unit:?} is not value:offset"))
            })?;
            Ok((
                parse_number(value, what, file, line)?,
                parse_number(offset, what, file, line)?,
            ))
        })
        .collect()
}

pub fn read_yarn_native(
    reader: impl BufRead,
    file: &str,
) -> Result<Vec<YarnNativeRun>, TraceError> {
    let mut runs = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 8 {
            return Err(TraceError::malformed(
                file,
                line_number,
                format!("native skyline lines need 8 fields, found {}", fields.len()),
            ));
        }
        runs.push(YarnNativeRun {
            pipeline: fields[0].to_string(),
            instances: parse_number(fields[1], "NumInstances", file, line_number)?,
            submit_ms: parse_number(fields[2], "SubmitTime", file, line_number)?,
            start_ms: parse_number(fields[3], "StartTime", file, line_number)?,
            end_ms: parse_number(fields[4], "EndTime", file, line_number)?,
            run: fields[5].to_string(),
            memory: parse_usage(fields[6], "memUsage", file, line_number)?,
            containers: parse_usage(fields[7], "coreUsage", file, line_number)?,
        });
        Ok(())
    })?;
    Ok(runs)
}

pub fn read_yarn_native_file(path: &Path) -> Result<Vec<YarnNativeRun>, TraceError> {
    read_yarn_native(open_lines(path)?, &path.display().to_string())
}

/// Which field of a native run becomes the skyline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum YarnSkylineSource {
    /// The 8th field, as the Hadoop estimator's `NativeSingleLineParser` reads it.
    Containers,
    /// The 7th field divided by a container size (MB): the full-length skyline.
    MemoryAsContainers { container_mb: f64 },
}

impl YarnNativeRun {
    /// The skyline at `step_seconds` resolution: each value holds from its offset until the next
    /// offset (the estimator's interval semantics); steps with no entry are zero.
    pub fn skyline(&self, source: YarnSkylineSource, step_seconds: u64) -> RunSkyline {
        let step = step_seconds.max(1);
        let (points, scale) = match source {
            YarnSkylineSource::Containers => (&self.containers, 1.0),
            YarnSkylineSource::MemoryAsContainers { container_mb } => {
                (&self.memory, 1.0 / container_mb.max(f64::MIN_POSITIVE))
            }
        };
        let steps = points
            .iter()
            .map(|(_, offset)| offset / step + 1)
            .max()
            .unwrap_or(0) as usize;
        let mut values = vec![0.0; steps];
        for (value, offset) in points {
            values[(offset / step) as usize] = value * scale;
        }
        RunSkyline {
            run: self.run.clone(),
            values,
        }
    }
}

/// One run of our JSON-lines skyline format:
/// `{"run": "etl_2024-05-01", "skyline": [3, 10, 12, 4]}` plus optional `"job"` and
/// `"step_seconds"` (informational).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkylineRecord {
    #[serde(default)]
    pub job: Option<String>,
    pub run: String,
    #[serde(default)]
    pub step_seconds: Option<f64>,
    pub skyline: Vec<f64>,
}

/// Parses JSON lines of `T`, skipping blank lines and `#` comments.
pub fn read_json_lines<T: serde::de::DeserializeOwned>(
    reader: impl BufRead,
    file: &str,
) -> Result<Vec<T>, TraceError> {
    let mut records = Vec::new();
    for_each_line(reader, file, |line_number, line| {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            return Ok(());
        }
        let record = serde_json::from_str(trimmed)
            .map_err(|error| TraceError::malformed(file, line_number, error.to_string()))?;
        records.push(record);
        Ok(())
    })?;
    Ok(records)
}

pub fn read_json_lines_file<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<Vec<T>, TraceError> {
    read_json_lines(open_lines(path)?, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::io::Write;

    fn expect_line(error: TraceError, line: usize, file: &str) {
        match error {
            TraceError::Malformed {
                file: f, line: l, ..
            } => {
                assert_eq!((f.as_str(), l), (file, line));
            }
            other => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn swf_reads_jobs_and_skips_comments() {
        let text = "; header\n;\n1 0 10 100 4 -1 -1 4 3600 -1 1 7 2 13 1 1 -1 -1\n\n2 5 -1 50.5 8 -1 -1 8 -1 -1 0 8 2 -1 1 1 -1 -1\n";
        let jobs = read_swf(Cursor::new(text), "t.swf").unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].run_time, Some(100.0));
        assert_eq!(jobs[0].requested_time, Some(3600.0));
        assert_eq!(jobs[0].executable, Some(13));
        assert_eq!(jobs[1].wait, None);
        assert_eq!(jobs[1].executable, None);
        assert_eq!(jobs[1].run_time, Some(50.5));
    }

    #[test]
    fn swf_malformed_line_names_file_and_line() {
        let text = "; c\n1 0 10 100 4 -1 -1 4 3600 -1 1 7 2 13 1 1 -1 -1\n1 0 ten\n";
        expect_line(
            read_swf(Cursor::new(text), "x.swf").unwrap_err(),
            3,
            "x.swf",
        );
        let text = "1 0 10 1OO 4 -1 -1 4 3600 -1 1 7 2 13 1 1 -1 -1\n";
        let error = read_swf(Cursor::new(text), "x.swf").unwrap_err();
        assert!(error.to_string().contains("run time"), "{error}");
        expect_line(error, 1, "x.swf");
    }

    #[test]
    fn google_jobs_join_events() {
        let text = "\
0,,1,0,u,3,n,l\n\
10000000,,2,0,u,2,n2,l2\n\
12000000,,2,1,u,2,n2,l2\n\
72000000,,2,4,u,2,n2,l2\n\
20000000,,3,0,v,,n3,l3\n\
21000000,,3,1,v,,n3,l3\n\
25000000,,3,5,v,,n3,l3\n";
        let events = read_google_job_events(Cursor::new(text), "job_events").unwrap();
        assert_eq!(events.len(), 7);
        assert_eq!(events[4].scheduling_class, None);
        let all = google_jobs(&events, false);
        assert_eq!(all.len(), 2); // job 1 has no real submit
        assert_eq!(all[0].job_id, 2);
        assert_eq!(all[0].runtime(), 60.0);
        assert_eq!(all[1].end_event, google_event::KILL);
        assert_eq!(google_jobs(&events, true).len(), 1);
        let bad = "0,,1,0,u,3,n\n";
        expect_line(
            read_google_job_events(Cursor::new(bad), "j").unwrap_err(),
            1,
            "j",
        );
        let bad = "0,,1,0,u,3,n,l\nabc,,1,0,u,3,n,l\n";
        expect_line(
            read_google_job_events(Cursor::new(bad), "j").unwrap_err(),
            2,
            "j",
        );
    }

    #[test]
    fn google_task_events_parse_optional_fields() {
        let text = "5,,7,0,,0,u,1,9,0.0625,0.03,0.0001,0\n6,,7,0,42,1,u,1,9,,,,0\n";
        let events = read_google_task_events(Cursor::new(text), "task_events").unwrap();
        assert_eq!(events[0].machine_id, None);
        assert_eq!(events[0].cpu_request, Some(0.0625));
        assert_eq!(events[1].machine_id, Some(42));
        assert_eq!(events[1].memory_request, None);
        expect_line(
            read_google_task_events(Cursor::new("1,2,3\n"), "t").unwrap_err(),
            1,
            "t",
        );
    }

    #[test]
    fn alibaba_tasks_with_header_and_empty_requests() {
        let text = "task_create_time, task_end_time, job_id, task_id,number_of_instances, status, cpus,mem\n6459,6524,3,4,15740,Terminated,50,0.007956928\n6036,6046,4,7,393,Waiting,,\n";
        let tasks = read_alibaba_tasks(Cursor::new(text), "batch_task.csv").unwrap();
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[0].cpus_per_instance, Some(50.0));
        assert_eq!(tasks[1].memory_per_instance, None);
        let bad = "6459,6524,3,4,x,Terminated,50,0.1\n";
        expect_line(
            read_alibaba_tasks(Cursor::new(bad), "b.csv").unwrap_err(),
            1,
            "b.csv",
        );
    }

    #[test]
    fn bitbrains_parses_and_deduplicates() {
        let text = "Timestamp [ms];\tCPU cores;\tCPU capacity provisioned [MHZ];\tCPU usage [MHZ];\tCPU usage [%];\tMemory capacity provisioned [KB];\tMemory usage [KB];\tDisk read throughput [KB/s];\tDisk write throughput [KB/s];\tNetwork received throughput [KB/s];\tNetwork transmitted throughput [KB/s]\n\
1372629804;\t2;\t5851.9989;\t87.78;\t1.5;\t8218624.0;\t1034592.8;\t160.8;\t21.7;\t0.26;\t1.46\n\
1372629804;\t2;\t5851.9989;\t87.78;\t1.5;\t8218624.0;\t1034592.8;\t160.8;\t21.7;\t0.26;\t1.46\n\
1372630104;\t2;\t5851.9989;\t29.26;\t0.5;\t8218624.0;\t458575.5;\t0.0;\t2.3;\t0.2;\t1.0\n";
        let samples = read_bitbrains(Cursor::new(text), "1.csv").unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1].memory_usage_kb, 458575.5);
        let bad = "1372629804;\t2;\t5851.9989;\tNaNx;\t1.5;\t8218624.0;\t1.0\n";
        expect_line(
            read_bitbrains(Cursor::new(bad), "1.csv").unwrap_err(),
            1,
            "1.csv",
        );
    }

    #[test]
    fn planetlab_reads_percentages() {
        let values = read_planetlab(Cursor::new("3\n17\n\n0\n"), "vm").unwrap();
        assert_eq!(values, vec![3.0, 17.0, 0.0]);
        expect_line(
            read_planetlab(Cursor::new("3\n170\n"), "vm").unwrap_err(),
            2,
            "vm",
        );
        expect_line(
            read_planetlab(Cursor::new("3\nx\n"), "vm").unwrap_err(),
            2,
            "vm",
        );
    }

    #[test]
    fn yarn_native_skylines() {
        let text = "tpch_q12 50 1462148517000 1462148527345 1462148952345 tpch_q12_0 8192:0|8192:5|16384:15| 1:0|1:5|2:10|\n";
        let runs = read_yarn_native(Cursor::new(text), "tpch_q12.txt").unwrap();
        assert_eq!(runs[0].run, "tpch_q12_0");
        let containers = runs[0].skyline(YarnSkylineSource::Containers, 5);
        assert_eq!(containers.values, vec![1.0, 1.0, 2.0]);
        let memory = runs[0].skyline(
            YarnSkylineSource::MemoryAsContainers {
                container_mb: 8192.0,
            },
            5,
        );
        assert_eq!(memory.values, vec![1.0, 1.0, 0.0, 2.0]);
        let bad = "p 1 2 3 4 r 1:0|x 1:0|\n";
        expect_line(read_yarn_native(Cursor::new(bad), "n").unwrap_err(), 1, "n");
    }

    #[test]
    fn json_lines_skylines_and_errors() {
        let text = "# comment\n{\"run\":\"a\",\"skyline\":[1,2,3]}\n\n{\"job\":\"j\",\"run\":\"b\",\"skyline\":[2]}\n";
        let records: Vec<SkylineRecord> = read_json_lines(Cursor::new(text), "s.jsonl").unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].job.as_deref(), Some("j"));
        let bad = "{\"run\":\"a\",\"skyline\":[1,2,3]}\n{\"run\":\"b\"}\n";
        expect_line(
            read_json_lines::<SkylineRecord>(Cursor::new(bad), "s.jsonl").unwrap_err(),
            2,
            "s.jsonl",
        );
    }

    #[test]
    fn gz_files_and_directories_are_read() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("part-00000.csv.gz");
        let mut encoder = flate2::write::GzEncoder::new(
            File::create(&path).unwrap(),
            flate2::Compression::default(),
        );
        encoder
            .write_all(b"10000000,,2,0,u,2,n2,l2\n12000000,,2,1,u,2,n2,l2\n")
            .unwrap();
        encoder.finish().unwrap();
        std::fs::write(directory.path().join("PROVENANCE.md"), "# doc").unwrap();
        let events = read_google_job_events_path(directory.path()).unwrap();
        assert_eq!(events.len(), 2);
        let missing = read_swf_file(&directory.path().join("absent.swf")).unwrap_err();
        assert!(missing.to_string().contains("absent.swf"));
    }
}
