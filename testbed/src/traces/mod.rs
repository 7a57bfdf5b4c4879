//! Trace readers: turn the shared cluster traces into simulator jobs.
//!
//! | format | file | what becomes a job / task |
//! |---|---|---|
//! | `hawk-eagle` | Hawk/Eagle `.tr` | one line = one job; each listed duration is a task |
//! | `google-2011` | `task_events` shard(s), optionally with `job_events` | tasks with SCHEDULE→FINISH; job arrival = job SUBMIT (job_events) or first task SUBMIT |
//! | `swf` | Standard Workload Format | one job line; N allocated processors = N tasks of the job's run time |
//! | `alibaba-2017` | `batch_task.csv` | rows grouped by job id; each of a row's instances is a task lasting end − create |
//! | `swim` | SWIM Facebook `.tsv` | derived: one map task per 128 MiB of input, one reduce task per GiB of shuffle (see [`swim_tasks`]) |
//!
//! Files ending in `.gz` are decompressed. Arrival times are rebased so the first job arrives at
//! zero. Malformed input is an error naming the file and the line; it never panics.

use crate::workload::{DEFAULT_TASK_RESOURCES, JobSpec, TaskSpec};
use scheduler_core::{Resources, Time};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}: {message}")]
    Malformed {
        file: String,
        line: u64,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
}

/// The supported trace formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    HawkEagle,
    Google2011,
    Swf,
    Alibaba2017,
    Swim,
}

impl std::str::FromStr for TraceFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "hawk-eagle" | "tr" | "eagle" => Ok(TraceFormat::HawkEagle),
            "google-2011" | "google" => Ok(TraceFormat::Google2011),
            "swf" | "pwa" => Ok(TraceFormat::Swf),
            "alibaba-2017" | "alibaba" => Ok(TraceFormat::Alibaba2017),
            "swim" | "swim-facebook" => Ok(TraceFormat::Swim),
            _ => Err(format!(
                "unknown trace format {s:?}: expected hawk-eagle, google-2011, swf, alibaba-2017 or swim"
            )),
        }
    }
}

/// Read a trace. For `google-2011`, `path` may be a `task_events` file, a directory of
/// `task_events` shards, or a directory holding `task_events/` and `job_events/`.
pub fn read_trace(path: &Path, format: TraceFormat) -> Result<Vec<JobSpec>, TraceError> {
    let mut jobs = match format {
        TraceFormat::HawkEagle => parse_hawk_eagle(&name(path), open(path)?)?,
        TraceFormat::Swf => parse_swf(&name(path), open(path)?)?,
        TraceFormat::Alibaba2017 => parse_alibaba(&name(path), open(path)?)?,
        TraceFormat::Swim => parse_swim(&name(path), open(path)?)?,
        TraceFormat::Google2011 => {
            let (task_files, job_files) = google_files(path)?;
            let mut tasks = GoogleTasks::default();
            for f in &task_files {
                tasks.parse(&name(f), open(f)?)?;
            }
            let mut submits = HashMap::new();
            for f in &job_files {
                parse_google_job_events(&name(f), open(f)?, &mut submits)?;
            }
            tasks.into_jobs(&submits)
        }
    };
    rebase(&mut jobs);
    Ok(jobs)
}

fn name(p: &Path) -> String {
    p.display().to_string()
}

fn open(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        file: name(path),
        source,
    })?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    Ok(Box::new(BufReader::with_capacity(1 << 16, reader)))
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| TraceError::Io {
            file: name(dir),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

fn google_files(path: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), TraceError> {
    if path.is_file() {
        return Ok((vec![path.to_path_buf()], Vec::new()));
    }
    let tasks_dir = path.join("task_events");
    if tasks_dir.is_dir() {
        let jobs_dir = path.join("job_events");
        let jobs = if jobs_dir.is_dir() {
            list_dir(&jobs_dir)?
        } else {
            Vec::new()
        };
        return Ok((list_dir(&tasks_dir)?, jobs));
    }
    let files = list_dir(path)?;
    if files.is_empty() {
        return Err(TraceError::Usage(format!(
            "{}: no task_events files found",
            name(path)
        )));
    }
    Ok((files, Vec::new()))
}

fn rebase(jobs: &mut [JobSpec]) {
    jobs.sort_by_key(|j| j.arrival);
    if let Some(first) = jobs.first().map(|j| j.arrival) {
        for j in jobs.iter_mut() {
            j.arrival = Time::from_micros(j.arrival.as_micros() - first.as_micros());
        }
    }
}

fn secs_to_time(s: f64) -> Time {
    Time::from_micros((s.max(0.0) * 1e6).round() as u64)
}

/// Iterate over lines with their 1-based numbers; I/O errors name the file and line.
fn lines(
    file: &str,
    reader: Box<dyn BufRead>,
) -> impl Iterator<Item = Result<(u64, String), TraceError>> + '_ {
    reader.lines().enumerate().map(move |(i, l)| {
        l.map(|l| (i as u64 + 1, l))
            .map_err(|e| TraceError::Malformed {
                file: file.to_string(),
                line: i as u64 + 1,
                message: format!("cannot read line: {e}"),
            })
    })
}

fn malformed(file: &str, line: u64, message: impl Into<String>) -> TraceError {
    TraceError::Malformed {
        file: file.to_string(),
        line,
        message: message.into(),
    }
}

fn field<T: std::str::FromStr>(
    file: &str,
    line: u64,
    fields: &[&str],
    index: usize,
    what: &str,
) -> Result<T, TraceError> {
    let raw = fields
        .get(index)
        .ok_or_else(|| malformed(file, line, format!("missing field {} ({what})", index + 1)))?;
    raw.trim().parse::<T>().map_err(|_| {
        malformed(
            file,
            line,
            format!("field {} ({what}) is not a number: {raw:?}", index + 1),
        )
    })
}

fn class_of(runtimes_ms: &[u64]) -> String {
    let mean = runtimes_ms.iter().sum::<u64>() / runtimes_ms.len().max(1) as u64;
    crate::workload::production_class(mean).to_string()
}

fn job(arrival: Time, tasks: Vec<TaskSpec>, features: Vec<(String, String)>) -> JobSpec {
    let runtimes: Vec<u64> = tasks.iter().map(|t| t.runtime_ms).collect();
    JobSpec {
        arrival,
        class: class_of(&runtimes),
        features,
        tasks,
    }
}

/// (name, value) pairs, skipping unknown values (empty, or SWF's -1).
fn known_features(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty() && *v != "-1")
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn task(runtime_s: f64, resources: Resources) -> TaskSpec {
    TaskSpec {
        runtime_ms: ((runtime_s * 1000.0).round() as u64).max(1),
        resources,
    }
}

/// Hawk/Eagle `.tr`: `arrival num_tasks mean d_1 … d_n` (seconds).
pub fn parse_hawk_eagle(file: &str, reader: Box<dyn BufRead>) -> Result<Vec<JobSpec>, TraceError> {
    let mut jobs = Vec::new();
    for l in lines(file, reader) {
        let (n, text) = l?;
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let arrival: f64 = field(file, n, &f, 0, "arrival time")?;
        let count: usize = field(file, n, &f, 1, "number of tasks")?;
        if f.len() != 3 + count {
            return Err(malformed(
                file,
                n,
                format!(
                    "{count} tasks announced but {} durations given",
                    f.len().saturating_sub(3)
                ),
            ));
        }
        let mut tasks = Vec::with_capacity(count);
        for i in 0..count {
            let d: f64 = field(file, n, &f, 3 + i, "task duration")?;
            if !(d.is_finite() && d >= 0.0) {
                return Err(malformed(
                    file,
                    n,
                    format!("task duration {d} is not a non-negative number"),
                ));
            }
            tasks.push(task(d, DEFAULT_TASK_RESOURCES));
        }
        jobs.push(job(secs_to_time(arrival), tasks, Vec::new()));
    }
    Ok(jobs)
}

/// SWF: job = one line; allocated processors (field 5, else requested, field 8) tasks of the
/// job's run time (field 4). Jobs without a run time or processor count (-1) are skipped.
pub fn parse_swf(file: &str, reader: Box<dyn BufRead>) -> Result<Vec<JobSpec>, TraceError> {
    let mut jobs = Vec::new();
    for l in lines(file, reader) {
        let (n, text) = l?;
        let t = text.trim();
        if t.is_empty() || t.starts_with(';') {
            continue;
        }
        let f: Vec<&str> = t.split_whitespace().collect();
        if f.len() < 18 {
            return Err(malformed(
                file,
                n,
                format!("expected 18 fields, found {}", f.len()),
            ));
        }
        let submit: f64 = field(file, n, &f, 1, "submit time")?;
        let run: f64 = field(file, n, &f, 3, "run time")?;
        let allocated: i64 = field::<f64>(file, n, &f, 4, "allocated processors")? as i64;
        let requested: i64 = field::<f64>(file, n, &f, 7, "requested processors")? as i64;
        let procs = if allocated > 0 { allocated } else { requested };
        if run <= 0.0 || procs <= 0 || submit < 0.0 {
            continue;
        }
        let tasks = (0..procs)
            .map(|_| task(run, DEFAULT_TASK_RESOURCES))
            .collect();
        // What the submitter told the batch system (fields 8, 9, 12–15): the predictor's features.
        let (user, executable) = (f[11], f[13]);
        let mut features = known_features(&[
            ("user", user),
            ("group", f[12]),
            ("executable", executable),
            ("queue", f[14]),
            ("partition", f[15]),
            ("requested_time", f[8]),
        ]);
        if user != "-1" && executable != "-1" {
            features.push(("user+executable".into(), format!("{user}/{executable}")));
        }
        features.push(("processors".into(), procs.to_string()));
        jobs.push(job(secs_to_time(submit), tasks, features));
    }
    Ok(jobs)
}

/// Alibaba 2017 `batch_task`: terminated rows with create > 0 and end > create; every instance
/// of a row is a task lasting end − create (the per-instance table is not available, so this
/// span, which includes the instances' queueing, is the best duration there is). CPU 100 = one
/// core; memory is normalised to the largest machine, mapped onto 128 GiB.
pub fn parse_alibaba(file: &str, reader: Box<dyn BufRead>) -> Result<Vec<JobSpec>, TraceError> {
    // job → (first create time, tasks, features: the first task row's request and the row count)
    type AlibabaJob = (f64, Vec<TaskSpec>, Vec<(String, String)>, u64);
    let mut by_job: BTreeMap<u64, AlibabaJob> = BTreeMap::new();
    for l in lines(file, reader) {
        let (n, text) = l?;
        let t = text.trim();
        if t.is_empty() || (n == 1 && !t.starts_with(|c: char| c.is_ascii_digit() || c == '-')) {
            continue;
        }
        let f: Vec<&str> = t.split(',').collect();
        if f.len() < 8 {
            return Err(malformed(
                file,
                n,
                format!("expected 8 comma-separated fields, found {}", f.len()),
            ));
        }
        if f[5].trim() != "Terminated" {
            continue;
        }
        let create: f64 = field(file, n, &f, 0, "task create time")?;
        let end: f64 = field(file, n, &f, 1, "task end time")?;
        let job_id: u64 = field(file, n, &f, 2, "job id")?;
        let instances: u64 = field(file, n, &f, 4, "number of instances")?;
        if create <= 0.0 || end <= create || instances == 0 {
            continue;
        }
        let cpu = f[6].trim();
        let mem = f[7].trim();
        let resources = Resources::new(
            if cpu.is_empty() {
                DEFAULT_TASK_RESOURCES.cpu_millis
            } else {
                (field::<f64>(file, n, &f, 6, "CPU request")? * 10.0)
                    .round()
                    .max(1.0) as u64
            },
            if mem.is_empty() {
                DEFAULT_TASK_RESOURCES.memory_mib
            } else {
                (field::<f64>(file, n, &f, 7, "memory request")? * 131_072.0)
                    .round()
                    .max(1.0) as u64
            },
        );
        let entry = by_job.entry(job_id).or_insert_with(|| {
            let shape = if cpu.is_empty() && mem.is_empty() {
                Vec::new()
            } else {
                known_features(&[("cpu+memory", &format!("{cpu}/{mem}"))])
            };
            (create, Vec::new(), shape, 0)
        });
        entry.0 = entry.0.min(create);
        entry.3 += 1;
        entry
            .1
            .extend((0..instances).map(|_| task(end - create, resources)));
    }
    Ok(by_job
        .into_values()
        .map(|(arrival, tasks, mut features, rows)| {
            features.push(("task_rows".into(), rows.to_string()));
            job(secs_to_time(arrival), tasks, features)
        })
        .collect())
}

/// Tasks derived for one SWIM job: one map task per 128 MiB of input (at least one), each
/// running 1 s plus its input at 50 MB/s; one reduce task per GiB of shuffle, each running 1 s
/// plus its share of the shuffle at 50 MB/s. SWIM gives bytes only; these rates are our
/// assumption, stated in the report.
pub fn swim_tasks(input_bytes: u64, shuffle_bytes: u64) -> Vec<TaskSpec> {
    const BLOCK: u64 = 128 << 20;
    const RATE: f64 = 50e6;
    let maps = input_bytes.div_ceil(BLOCK).max(1);
    let per_map = input_bytes as f64 / maps as f64;
    let mut tasks: Vec<TaskSpec> = (0..maps)
        .map(|_| task(1.0 + per_map / RATE, DEFAULT_TASK_RESOURCES))
        .collect();
    let reduces = shuffle_bytes.div_ceil(1 << 30);
    if reduces > 0 {
        let per_reduce = shuffle_bytes as f64 / reduces as f64;
        tasks.extend((0..reduces).map(|_| task(1.0 + per_reduce / RATE, DEFAULT_TASK_RESOURCES)));
    }
    tasks
}

/// SWIM Facebook `.tsv`: name, submit time (s), gap, map input, shuffle, reduce output bytes.
pub fn parse_swim(file: &str, reader: Box<dyn BufRead>) -> Result<Vec<JobSpec>, TraceError> {
    let mut jobs = Vec::new();
    for l in lines(file, reader) {
        let (n, text) = l?;
        if text.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = text.split('\t').collect();
        if f.len() < 6 {
            return Err(malformed(
                file,
                n,
                format!(
                    "expected at least 6 tab-separated fields, found {}",
                    f.len()
                ),
            ));
        }
        let submit: f64 = field(file, n, &f, 1, "submit time")?;
        let input: u64 = field(file, n, &f, 3, "map input bytes")?;
        let shuffle: u64 = field(file, n, &f, 4, "shuffle bytes")?;
        jobs.push(job(
            secs_to_time(submit),
            swim_tasks(input, shuffle),
            Vec::new(),
        ));
    }
    Ok(jobs)
}

#[derive(Default)]
struct GoogleTasks {
    /// (job, task index) → (first submit µs, last schedule µs)
    open: HashMap<(u64, u64), (Option<u64>, Option<u64>)>,
    /// job → (first submit µs, finished task durations µs)
    jobs: BTreeMap<u64, (u64, Vec<u64>)>,
}

/// Timestamps at or beyond this mean "after the trace window" in the Google trace.
const GOOGLE_END_OF_TIME: u64 = i64::MAX as u64;

impl GoogleTasks {
    /// Google 2011 `task_events`: task durations are SCHEDULE → FINISH; attempts that end any
    /// other way are dropped; tasks scheduled at time 0 (running before the trace) are skipped.
    fn parse(&mut self, file: &str, reader: Box<dyn BufRead>) -> Result<(), TraceError> {
        for l in lines(file, reader) {
            let (n, text) = l?;
            if text.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = text.split(',').collect();
            if f.len() < 13 {
                return Err(malformed(
                    file,
                    n,
                    format!("expected 13 comma-separated fields, found {}", f.len()),
                ));
            }
            let t: u64 = field(file, n, &f, 0, "timestamp")?;
            let job: u64 = field(file, n, &f, 2, "job id")?;
            let index: u64 = field(file, n, &f, 3, "task index")?;
            let kind: u8 = field(file, n, &f, 5, "event type")?;
            if t >= GOOGLE_END_OF_TIME {
                continue;
            }
            let entry = self.open.entry((job, index)).or_insert((None, None));
            match kind {
                0 => {
                    entry.0.get_or_insert(t);
                }
                1 => entry.1 = Some(t),
                4 => {
                    if let Some(start) = entry.1.take().filter(|&s| s > 0 && t >= s) {
                        let submit = entry.0.unwrap_or(start);
                        let j = self.jobs.entry(job).or_insert((submit, Vec::new()));
                        j.0 = j.0.min(submit);
                        j.1.push(t - start);
                    }
                }
                2 | 3 | 5 | 6 => entry.1 = None,
                7 | 8 => {}
                other => return Err(malformed(file, n, format!("unknown event type {other}"))),
            }
        }
        Ok(())
    }

    fn into_jobs(self, submits: &HashMap<u64, GoogleJob>) -> Vec<JobSpec> {
        self.jobs
            .into_iter()
            .map(|(id, (first_submit, durations))| {
                let known = submits.get(&id);
                let arrival = known.map_or(first_submit, |j| j.submit_us);
                let features = known.map_or_else(Vec::new, |j| j.features.clone());
                let tasks = durations
                    .into_iter()
                    .map(|us| TaskSpec {
                        runtime_ms: (us / 1000).max(1),
                        resources: DEFAULT_TASK_RESOURCES,
                    })
                    .collect();
                job(Time::from_micros(arrival), tasks, features)
            })
            .collect()
    }
}

/// What `job_events` says of a job at submission.
#[derive(Clone, Debug, Default)]
struct GoogleJob {
    submit_us: u64,
    /// user, scheduling class, job name, logical job name (obfuscated strings in the trace).
    features: Vec<(String, String)>,
}

/// Google 2011 `job_events`: SUBMIT (type 0) time per job id (the first one), with the job's user,
/// scheduling class, job name and logical job name (fields 4–7) as predictor features.
fn parse_google_job_events(
    file: &str,
    reader: Box<dyn BufRead>,
    submits: &mut HashMap<u64, GoogleJob>,
) -> Result<(), TraceError> {
    for l in lines(file, reader) {
        let (n, text) = l?;
        if text.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = text.split(',').collect();
        if f.len() < 8 {
            return Err(malformed(
                file,
                n,
                format!("expected 8 comma-separated fields, found {}", f.len()),
            ));
        }
        let t: u64 = field(file, n, &f, 0, "timestamp")?;
        let job: u64 = field(file, n, &f, 2, "job id")?;
        let kind: u8 = field(file, n, &f, 3, "event type")?;
        if kind == 0 && t < GOOGLE_END_OF_TIME {
            submits.entry(job).or_insert_with(|| {
                let (user, logical) = (f[4].trim(), f[7].trim());
                let mut features = known_features(&[
                    ("user", user),
                    ("scheduling_class", f[5].trim()),
                    ("job_name", f[6].trim()),
                    ("logical_name", logical),
                ]);
                if !user.is_empty() && !logical.is_empty() {
                    features.push(("user+logical_name".into(), format!("{user}/{logical}")));
                }
                GoogleJob {
                    submit_us: t,
                    features,
                }
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(s: &'static str) -> Box<dyn BufRead> {
        Box::new(BufReader::new(s.as_bytes()))
    }

    #[test]
    fn hawk_eagle_fixture_and_errors() {
        let jobs = parse_hawk_eagle("f.tr", reader("10.5 2 1.5 1.0 2.0\n12 1 3 3\n")).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].arrival, Time::from_millis(10_500));
        assert_eq!(
            jobs[0]
                .tasks
                .iter()
                .map(|t| t.runtime_ms)
                .collect::<Vec<_>>(),
            vec![1000, 2000]
        );
        let e = parse_hawk_eagle("f.tr", reader("1 2 1 1 1\n1 3 1 1 1\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f.tr:2: 3 tasks announced but 2 durations given"
        );
        let e = parse_hawk_eagle("f.tr", reader("1 1 1 x\n")).unwrap_err();
        assert!(
            e.to_string().starts_with("f.tr:1: field 4 (task duration)"),
            "{e}"
        );
    }

    #[test]
    fn swf_fixture_and_errors() {
        let text = "; header\n1 100 5 60 4 -1 -1 4 100 -1 1 1 1 -1 1 -1 -1 -1\n2 200 5 -1 4 -1 -1 4 100 -1 5 1 1 -1 1 -1 -1 -1\n3 300 0 10 -1 -1 -1 2 100 -1 1 1 1 -1 1 -1 -1 -1\n";
        let jobs = parse_swf("x.swf", reader(text)).unwrap();
        assert_eq!(jobs.len(), 2, "the job without a run time is skipped");
        assert_eq!(
            (jobs[0].tasks.len(), jobs[0].tasks[0].runtime_ms),
            (4, 60_000)
        );
        assert_eq!(
            jobs[1].tasks.len(),
            2,
            "requested processors when allocated is unknown"
        );
        let pairs = |j: &JobSpec| {
            j.features
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(&jobs[0]),
            [
                "user=1",
                "group=1",
                "queue=1",
                "requested_time=100",
                "processors=4"
            ],
            "unknown (-1) executable and partition are not features"
        );
        let e = parse_swf("x.swf", reader("1 2 3\n")).unwrap_err();
        assert_eq!(e.to_string(), "x.swf:1: expected 18 fields, found 3");
    }

    #[test]
    fn alibaba_fixture_and_errors() {
        let text = "task_create_time, task_end_time, job_id, task_id,number_of_instances, status, cpu, mem\n100,160,7,1,2,Terminated,50,0.0078125\n90,95,7,2,1,Terminated,,\n100,200,8,3,1,Failed,100,0.1\n-5,10,9,4,1,Terminated,100,0.1\n";
        let jobs = parse_alibaba("b.csv", reader(text)).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].arrival, Time::from_secs(90));
        assert_eq!(
            jobs[0].features,
            [
                ("cpu+memory".to_string(), "50/0.0078125".to_string()),
                ("task_rows".to_string(), "2".to_string())
            ]
        );
        assert_eq!(jobs[0].tasks.len(), 3);
        assert_eq!(jobs[0].tasks[0].resources, Resources::new(500, 1024));
        assert_eq!(jobs[0].tasks[2].resources, DEFAULT_TASK_RESOURCES);
        let e = parse_alibaba("b.csv", reader("1,2,3\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "b.csv:1: expected 8 comma-separated fields, found 3"
        );
        let e = parse_alibaba("b.csv", reader("h\n1,x,3,4,5,Terminated,1,1\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("b.csv:2: field 2 (task end time)"),
            "{e}"
        );
    }

    #[test]
    fn swim_fixture_and_errors() {
        let jobs = parse_swim(
            "fb.tsv",
            reader("job0\t49\t49\t268435456\t0\t5\njob1\t101\t52\t10\t2147483648\t7\n"),
        )
        .unwrap();
        assert_eq!(jobs[0].tasks.len(), 2, "two 128 MiB blocks");
        assert_eq!(jobs[1].tasks.len(), 1 + 2, "one map, two reduces");
        assert_eq!(jobs[1].arrival, Time::from_secs(101));
        let e = parse_swim("fb.tsv", reader("job0\t1\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fb.tsv:1: expected at least 6 tab-separated fields, found 2"
        );
    }

    #[test]
    fn google_fixture_and_errors() {
        // Job 1: task 0 submitted at 5 s, scheduled 6 s, finished 9 s; task 1 evicted then
        // rescheduled and finished; job 2's only task was running before the trace (t = 0).
        let text = "5000000,,1,0,,0,u,0,0,,,,\n6000000,,1,0,m,1,u,0,0,,,,\n9000000,,1,0,m,4,u,0,0,,,,\n\
5000000,,1,1,,0,u,0,0,,,,\n6000000,,1,1,m,1,u,0,0,,,,\n7000000,,1,1,m,2,u,0,0,,,,\n8000000,,1,1,m,1,u,0,0,,,,\n18000000,,1,1,m,4,u,0,0,,,,\n\
0,,2,0,m,1,u,0,0,,,,\n4000000,,2,0,m,4,u,0,0,,,,\n";
        let mut g = GoogleTasks::default();
        g.parse("t.csv", reader(text)).unwrap();
        let mut submits = HashMap::new();
        parse_google_job_events("j.csv", reader("3000000,,1,0,u,0,n,l\n"), &mut submits).unwrap();
        let jobs = g.into_jobs(&submits);
        assert_eq!(jobs.len(), 1);
        assert_eq!(
            jobs[0].arrival,
            Time::from_secs(3),
            "job_events SUBMIT wins"
        );
        let mut d: Vec<u64> = jobs[0].tasks.iter().map(|t| t.runtime_ms).collect();
        d.sort();
        assert_eq!(d, vec![3000, 10_000]);
        let features: Vec<String> = jobs[0]
            .features
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        assert_eq!(
            features,
            [
                "user=u",
                "scheduling_class=0",
                "job_name=n",
                "logical_name=l",
                "user+logical_name=u/l"
            ]
        );
        let e = GoogleTasks::default()
            .parse("t.csv", reader("1,,1,0,m,9,u,0,0,,,,\n"))
            .unwrap_err();
        assert_eq!(e.to_string(), "t.csv:1: unknown event type 9");
        let e = GoogleTasks::default()
            .parse("t.csv", reader("1,2\n"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.csv:1: expected 13 comma-separated fields, found 2"
        );
    }

    #[test]
    fn gzip_files_are_read_and_missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.tr.gz");
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        std::io::Write::write_all(&mut enc, b"100 1 2 2\n50 1 1 1\n").unwrap();
        enc.finish().unwrap();
        let jobs = read_trace(&path, TraceFormat::HawkEagle).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].arrival, Time::ZERO, "rebased and sorted");
        assert_eq!(jobs[1].arrival, Time::from_secs(50));
        let missing = dir.path().join("nope.tr");
        let e = read_trace(&missing, TraceFormat::HawkEagle).unwrap_err();
        assert!(e.to_string().contains("nope.tr"), "{e}");
        assert!("google-2011".parse::<TraceFormat>().is_ok());
        assert!("csv".parse::<TraceFormat>().is_err());
    }
}
