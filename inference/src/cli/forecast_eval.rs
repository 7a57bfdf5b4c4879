//! `inference forecast-eval`: rolling-origin evaluation of the GP and ARIMA forecasters on
//! per-VM usage series.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use inference::forecast::{
    ArimaConfig, ArimaForecaster, Forecaster, GpConfig, GpForecaster, Kernel,
};
use inference::traces;
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct ForecastOptions {
    pub format: String,
    pub model: String,
    pub metric: String,
    pub kernel: Kernel,
    pub window: usize,
    pub patterns: usize,
    pub horizon: usize,
    /// Observations given to each forecast call (default patterns + window + horizon).
    pub history: Option<usize>,
    pub stride: usize,
    pub max_series: Option<usize>,
    pub max_origins: Option<usize>,
    pub refit_every: usize,
    /// GP evidence maximisation warm-started from the previous fit (`GpConfig::warm_start`).
    pub warm_start: bool,
}

/// Pace's best Eq. 9 buffer with the GP (§4.2, §5): β = K1 + K2 · V in units of the request.
const EQ9_K1: f64 = 0.05;
const EQ9_K2: f64 = 3.0;

fn collect_files(path: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    if path.is_file() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading directory {}", path.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    entries.sort();
    for entry in entries {
        let name = entry
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if name.starts_with('.') || name.ends_with(".md") {
            continue;
        }
        collect_files(&entry, files)?;
    }
    Ok(())
}

fn load_series(path: &Path, format: &str, metric: &str) -> Result<Vec<(String, Vec<f64>)>> {
    let mut files = Vec::new();
    collect_files(path, &mut files)?;
    if files.is_empty() {
        bail!("{}: no series files found", path.display());
    }
    let mut series = Vec::new();
    for file in files {
        let values = match (format, metric) {
            ("bitbrains", "memory") => traces::read_bitbrains_file(&file)?
                .iter()
                .map(|s| s.memory_usage_kb)
                .collect(),
            ("bitbrains", "cpu") => traces::read_bitbrains_file(&file)?
                .iter()
                .map(|s| s.cpu_usage_mhz)
                .collect(),
            // Use as a fraction of what the VM was provisioned (the shaper's unit: its request).
            ("bitbrains", "memory-share") => traces::read_bitbrains_file(&file)?
                .iter()
                .filter(|s| s.memory_capacity_kb > 0.0)
                .map(|s| s.memory_usage_kb / s.memory_capacity_kb)
                .collect(),
            ("bitbrains", "cpu-share") => traces::read_bitbrains_file(&file)?
                .iter()
                .filter(|s| s.cpu_capacity_mhz > 0.0)
                .map(|s| s.cpu_usage_mhz / s.cpu_capacity_mhz)
                .collect(),
            ("planetlab", "cpu") => traces::read_planetlab_file(&file)?,
            ("planetlab", "cpu-share") => traces::read_planetlab_file(&file)?
                .iter()
                .map(|percent| percent / 100.0)
                .collect(),
            ("planetlab", _) => {
                bail!("planetlab traces only have CPU utilisation: use --metric cpu or cpu-share")
            }
            (other, _) if other != "bitbrains" => {
                bail!("unknown format {other:?} (expected bitbrains or planetlab)")
            }
            (_, other) => {
                bail!("unknown metric {other:?} (expected memory, cpu, memory-share or cpu-share)")
            }
        };
        series.push((file.display().to_string(), values));
    }
    Ok(series)
}

#[derive(Debug, Clone, Serialize)]
pub struct ForecastReport {
    pub input: String,
    pub format: String,
    pub model: String,
    pub metric: String,
    pub series: usize,
    pub forecasts: u64,
    pub horizon: usize,
    pub history: usize,
    pub window: usize,
    pub patterns: usize,
    /// Mean absolute error of the one-step forecast (series units).
    pub mae_1: f64,
    /// Mean absolute error of the `horizon`-step forecast.
    pub mae_k: f64,
    /// MAE divided by the mean absolute actual value (comparable across traces).
    pub nmae_1: f64,
    pub nmae_k: f64,
    /// Fraction of actuals within mean ± 2σ, all steps 1..=horizon.
    pub coverage_2sigma: f64,
    pub coverage_2sigma_1: f64,
    pub coverage_2sigma_k: f64,
    /// Share metrics (use as a fraction of the request): fraction of one-step actuals at or below
    /// the Eq. 9 allocation `mean + K1 + K2 · variance` (K1 = 0.05, K2 = 3, Pace's best with the
    /// GP), i.e. intervals the shaped allocation would have covered.
    pub eq9_coverage_1: f64,
    /// Mean of the Eq. 9 allocation capped at the request (1), one step ahead: what shaping
    /// would have kept allocated, as a fraction of the request.
    pub eq9_mean_allocation_1: f64,
    /// Forecast calls per second (each call yields `horizon` steps), single thread.
    pub forecasts_per_second: f64,
    pub skipped_errors: u64,
}

pub fn run(path: &Path, options: &ForecastOptions) -> Result<ForecastReport> {
    let mut all = load_series(path, &options.format, &options.metric)?;
    if let Some(limit) = options.max_series {
        all.truncate(limit);
    }
    let horizon = options.horizon.max(1);
    let history = options
        .history
        .unwrap_or(options.patterns + options.window + horizon);
    let stride = options.stride.max(1);
    let make = || -> Result<Box<dyn Forecaster>> {
        Ok(match options.model.as_str() {
            "gp" => Box::new(GpForecaster::new(GpConfig {
                window: options.window,
                patterns: options.patterns,
                kernel: options.kernel,
                refit_every: options.refit_every,
                warm_start: options.warm_start,
            })),
            "arima" => Box::new(ArimaForecaster::new(ArimaConfig {
                refit_every: options.refit_every,
                ..ArimaConfig::default()
            })),
            other => bail!("unknown model {other:?} (expected gp or arima)"),
        })
    };
    let (mut error_1, mut error_k, mut actual_1, mut actual_k) = (0.0, 0.0, 0.0, 0.0);
    let (mut count, mut covered_all, mut steps_all, mut covered_1, mut covered_k) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut eq9_covered, mut eq9_allocation) = (0u64, 0.0);
    let mut skipped = 0u64;
    let mut elapsed = 0.0;
    for (_, values) in &all {
        let mut forecaster = make()?;
        let needed = history.max(forecaster.min_history());
        if values.len() < needed + horizon {
            continue;
        }
        let origins = (needed..=values.len() - horizon)
            .step_by(stride)
            .take(options.max_origins.unwrap_or(usize::MAX));
        for origin in origins {
            let window = &values[origin - needed..origin];
            let clock = Instant::now();
            let result = forecaster.forecast(window, horizon);
            elapsed += clock.elapsed().as_secs_f64();
            let forecasts = match result {
                Ok(forecasts) => forecasts,
                Err(_) => {
                    skipped += 1;
                    continue;
                }
            };
            count += 1;
            for (step, forecast) in forecasts.iter().enumerate() {
                let actual = values[origin + step];
                let hit = forecast.covers(actual, 2.0);
                covered_all += u64::from(hit);
                steps_all += 1;
                if step == 0 {
                    let allocation = forecast.mean + EQ9_K1 + EQ9_K2 * forecast.variance.max(0.0);
                    eq9_covered += u64::from(actual <= allocation);
                    eq9_allocation += allocation.min(1.0);
                    error_1 += (forecast.mean - actual).abs();
                    actual_1 += actual.abs();
                    covered_1 += u64::from(hit);
                }
                if step + 1 == horizon {
                    error_k += (forecast.mean - actual).abs();
                    actual_k += actual.abs();
                    covered_k += u64::from(hit);
                }
            }
        }
    }
    anyhow::ensure!(
        count > 0,
        "{}: no series is long enough for history {history} + horizon {horizon}",
        path.display()
    );
    let per = |value: f64| value / count as f64;
    Ok(ForecastReport {
        input: path.display().to_string(),
        format: options.format.clone(),
        model: options.model.clone(),
        metric: options.metric.clone(),
        series: all.len(),
        forecasts: count,
        horizon,
        history,
        window: options.window,
        patterns: options.patterns,
        mae_1: per(error_1),
        mae_k: per(error_k),
        nmae_1: error_1 / actual_1.max(f64::MIN_POSITIVE),
        nmae_k: error_k / actual_k.max(f64::MIN_POSITIVE),
        coverage_2sigma: covered_all as f64 / steps_all.max(1) as f64,
        coverage_2sigma_1: per(covered_1 as f64),
        coverage_2sigma_k: per(covered_k as f64),
        eq9_coverage_1: per(eq9_covered as f64),
        eq9_mean_allocation_1: per(eq9_allocation),
        forecasts_per_second: count as f64 / elapsed.max(1e-9),
        skipped_errors: skipped,
    })
}

pub fn print_table(report: &ForecastReport) {
    println!(
        "input              {} ({}, {})",
        report.input, report.format, report.metric
    );
    println!(
        "model              {} (h = {}, N = {}, history {}, horizon {})",
        report.model, report.window, report.patterns, report.history, report.horizon
    );
    println!(
        "series / forecasts {} / {}",
        report.series, report.forecasts
    );
    println!(
        "MAE 1-step         {:.4}  (NMAE {:.4})",
        report.mae_1, report.nmae_1
    );
    println!(
        "MAE {}-step         {:.4}  (NMAE {:.4})",
        report.horizon, report.mae_k, report.nmae_k
    );
    println!(
        "coverage ±2σ       {:.4}  (1-step {:.4}, {}-step {:.4})",
        report.coverage_2sigma, report.coverage_2sigma_1, report.horizon, report.coverage_2sigma_k
    );
    if report.metric.ends_with("-share") {
        println!(
            "Eq. 9 (K1 0.05, K2 3) covers {:.4} of 1-step actuals, mean allocation {:.4} of request",
            report.eq9_coverage_1, report.eq9_mean_allocation_1
        );
    }
    println!("forecasts/s        {:.0}", report.forecasts_per_second);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GP on a PlanetLab directory, exponential kernel, window = patterns, full search.
    fn planetlab_gp(metric: &str, window: usize, horizon: usize) -> ForecastOptions {
        ForecastOptions {
            format: "planetlab".into(),
            model: "gp".into(),
            metric: metric.into(),
            kernel: Kernel::Exponential,
            window,
            patterns: window,
            horizon,
            history: None,
            stride: 1,
            max_series: None,
            max_origins: None,
            refit_every: 1,
            warm_start: false,
        }
    }

    #[test]
    fn evaluates_planetlab_directory_and_rejects_memory_metric() {
        let directory = tempfile::tempdir().unwrap();
        let series: Vec<String> = (0..80).map(|i| ((i * 7) % 23 + 10).to_string()).collect();
        std::fs::write(directory.path().join("vm_a"), series.join("\n")).unwrap();
        let mut options = planetlab_gp("cpu", 5, 2);
        let report = run(directory.path(), &options).unwrap();
        assert_eq!(report.series, 1);
        assert_eq!(report.forecasts, 80 - 12 - 2 + 1);
        assert!(report.coverage_2sigma >= 0.0 && report.coverage_2sigma <= 1.0);
        options.model = "arima".into();
        assert!(run(directory.path(), &options).is_ok());
        options.metric = "memory".into();
        let error = run(directory.path(), &options).unwrap_err();
        assert!(error.to_string().contains("--metric cpu"), "{error}");
    }

    #[test]
    fn share_metric_reports_eq9_coverage_and_warm_start_runs() {
        // Percent CPU in [10, 32]: as shares of the request in [0.10, 0.32], so the Eq. 9
        // allocation (mean + 0.05 + 3 · variance) stays between the values and the request.
        let directory = tempfile::tempdir().unwrap();
        let series: Vec<String> = (0..120).map(|i| ((i * 7) % 23 + 10).to_string()).collect();
        std::fs::write(directory.path().join("vm_a"), series.join("\n")).unwrap();
        let mut options = planetlab_gp("cpu-share", 10, 1);
        let full = run(directory.path(), &options).unwrap();
        assert_eq!(full.forecasts, 120 - 21 - 1 + 1);
        assert!(full.mae_1 < 0.2, "{full:?}");
        assert!((0.0..=1.0).contains(&full.eq9_coverage_1));
        assert!(full.eq9_mean_allocation_1 > 0.0 && full.eq9_mean_allocation_1 <= 1.0);
        options.warm_start = true;
        let warm = run(directory.path(), &options).unwrap();
        assert_eq!(warm.forecasts, full.forecasts);
        assert!(
            (warm.mae_1 - full.mae_1).abs() < 0.05,
            "{warm:?} vs {full:?}"
        );
    }
}
