//! `coordinator check`: verifies a data dir without changing it (files present, modes,
//! certificates parse, chain to the CA and are not about to expire, the store's integrity and
//! every record's checksum and decoding, the join-token file against the store's hash) and
//! reports each finding. Any problem makes the report fail (non-zero exit); warnings do not.

use crate::datadir::{DataDir, SERVER_NAME};
use crate::store::{Store, StoreError};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A certificate expiring within this long is a warning.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 86_400);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Ok,
    Warning,
    Problem,
}

/// One finding about one file or record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The file (relative to the data dir) or `store.redb/RECORD`.
    pub subject: String,
    pub severity: Severity,
    pub detail: String,
}

/// Everything `coordinator check` found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub data_dir: PathBuf,
    pub ok: bool,
    pub problems: usize,
    pub warnings: usize,
    pub findings: Vec<Finding>,
}

impl CheckReport {
    /// Findings of a subject.
    pub fn about(&self, subject: &str) -> Vec<&Finding> {
        self.findings
            .iter()
            .filter(|f| f.subject == subject)
            .collect()
    }

    /// One line per finding, then a summary line.
    pub fn to_text(&self) -> String {
        let mut out = format!("data dir {}\n", self.data_dir.display());
        for f in &self.findings {
            let tag = match f.severity {
                Severity::Ok => "ok     ",
                Severity::Warning => "WARNING",
                Severity::Problem => "PROBLEM",
            };
            out.push_str(&format!("{tag} {}: {}\n", f.subject, f.detail));
        }
        out.push_str(&format!(
            "{}: {} problem(s), {} warning(s)\n",
            if self.ok { "OK" } else { "FAILED" },
            self.problems,
            self.warnings
        ));
        out
    }
}

struct Findings(Vec<Finding>);

impl Findings {
    fn add(&mut self, subject: &str, severity: Severity, detail: impl Into<String>) {
        self.0.push(Finding {
            subject: subject.to_string(),
            severity,
            detail: detail.into(),
        });
    }
    fn ok(&mut self, subject: &str, detail: impl Into<String>) {
        self.add(subject, Severity::Ok, detail)
    }
    fn warn(&mut self, subject: &str, detail: impl Into<String>) {
        self.add(subject, Severity::Warning, detail)
    }
    fn problem(&mut self, subject: &str, detail: impl Into<String>) {
        self.add(subject, Severity::Problem, detail)
    }
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

fn rfc3339(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{secs} (unix seconds)"))
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// Check the data dir at `dir` as of `now` (for certificate validity).
pub fn check(dir: &DataDir, now: SystemTime) -> CheckReport {
    let mut f = Findings(Vec::new());
    check_modes(dir, &mut f);
    let ca = check_cert(&dir.ca_cert(), true, now, &mut f);
    check_key(&dir.ca_key(), ca.as_ref(), &mut f);
    let server = check_cert(&dir.server_cert(), false, now, &mut f);
    check_key(&dir.server_key(), server.as_ref(), &mut f);
    if let (Some(ca), Some(server)) = (&ca, &server) {
        check_chain(ca, server, now, &mut f);
    }
    let token_hash = check_store(dir, &mut f);
    check_join_token(dir, token_hash, &mut f);
    let problems =
        f.0.iter()
            .filter(|x| x.severity == Severity::Problem)
            .count();
    let warnings =
        f.0.iter()
            .filter(|x| x.severity == Severity::Warning)
            .count();
    CheckReport {
        data_dir: dir.root.clone(),
        ok: problems == 0,
        problems,
        warnings,
        findings: f.0,
    }
}

fn check_modes(dir: &DataDir, f: &mut Findings) {
    use std::os::unix::fs::PermissionsExt;
    let subject = ".";
    match std::fs::metadata(&dir.root) {
        Ok(meta) if meta.is_dir() => {
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o077 != 0 {
                f.problem(
                    subject,
                    format!(
                        "mode {mode:o}: group or others have access; expected 700 (`coordinator run` tightens it, or chmod 700)"
                    ),
                );
            } else {
                f.ok(subject, format!("directory, mode {mode:o}"));
            }
        }
        Ok(_) => f.problem(subject, "not a directory"),
        Err(e) => f.problem(subject, format!("cannot read it: {e}")),
    }
    let secrets = dir.secret_files();
    for path in [
        dir.ca_cert(),
        dir.ca_key(),
        dir.server_cert(),
        dir.server_key(),
        dir.join_token(),
        dir.cluster_json(),
        dir.store(),
    ] {
        let subject = name_of(&path);
        let optional = path == dir.cluster_json();
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if optional {
                    f.ok(&subject, "absent (only a summary of `coordinator init`)");
                } else {
                    f.problem(&subject, "missing; restore it from a backup");
                }
                continue;
            }
            Err(e) => {
                f.problem(&subject, format!("cannot read it: {e}"));
                continue;
            }
        };
        let mode = meta.permissions().mode() & 0o7777;
        if secrets.contains(&path) && mode & 0o077 != 0 {
            f.problem(
                &subject,
                format!(
                    "mode {mode:o}: a secret readable by group or others; expected 600 (`coordinator run` tightens it, or chmod 600)"
                ),
            );
        } else {
            f.ok(&subject, format!("present, mode {mode:o}"));
        }
    }
}

/// A parsed certificate: DER, validity and public key.
struct Cert {
    der: Vec<u8>,
    public_key: Vec<u8>,
}

fn check_cert(path: &Path, want_ca: bool, now: SystemTime, f: &mut Findings) -> Option<Cert> {
    let subject = name_of(path);
    let pem = std::fs::read(path).ok()?; // a missing file is reported by check_modes
    let (_, pem) = match x509_parser::pem::parse_x509_pem(&pem) {
        Ok(p) => p,
        Err(e) => {
            f.problem(&subject, format!("not a PEM certificate: {e}"));
            return None;
        }
    };
    let cert = match pem.parse_x509() {
        Ok(c) => c,
        Err(e) => {
            f.problem(&subject, format!("does not parse as X.509: {e}"));
            return None;
        }
    };
    if want_ca && !cert.is_ca() {
        f.problem(&subject, "is not a CA certificate");
    }
    let not_before = cert.validity().not_before.timestamp();
    let not_after = cert.validity().not_after.timestamp();
    let now_s = unix_secs(now);
    let what = if want_ca {
        "cluster CA"
    } else {
        "server certificate"
    };
    let renew = if want_ca {
        "a new CA means a new data dir and ca.pem on every worker"
    } else {
        "run `coordinator rotate-server-cert --data-dir DIR` and restart the coordinator"
    };
    if now_s < not_before {
        f.problem(
            &subject,
            format!("{what} is not valid before {}", rfc3339(not_before)),
        );
    } else if now_s >= not_after {
        f.problem(
            &subject,
            format!("{what} expired at {}; {renew}", rfc3339(not_after)),
        );
    } else if not_after - now_s < EXPIRY_WARNING.as_secs() as i64 {
        f.warn(
            &subject,
            format!(
                "{what} expires in {} day(s), at {}; {renew}",
                (not_after - now_s) / 86_400,
                rfc3339(not_after)
            ),
        );
    } else {
        f.ok(
            &subject,
            format!("{what} valid until {}", rfc3339(not_after)),
        );
    }
    Some(Cert {
        der: pem.contents.clone(),
        public_key: cert.public_key().subject_public_key.data.to_vec(),
    })
}

/// The private key parses and belongs to the certificate.
fn check_key(path: &Path, cert: Option<&Cert>, f: &mut Findings) {
    let subject = name_of(path);
    let Ok(pem) = std::fs::read_to_string(path) else {
        return; // reported by check_modes
    };
    match rcgen::KeyPair::from_pem(&pem) {
        Err(e) => f.problem(&subject, format!("not a usable private key: {e}")),
        Ok(key) => match cert {
            Some(cert) if key.public_key_raw() != cert.public_key.as_slice() => f.problem(
                &subject,
                "does not belong to the certificate next to it (restore the matching pair from a backup)",
            ),
            Some(_) => f.ok(&subject, "private key of the certificate"),
            None => {}
        },
    }
}

/// The server certificate verifies for [`SERVER_NAME`] against the CA, as workers check it.
fn check_chain(ca: &Cert, server: &Cert, now: SystemTime, f: &mut Findings) {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let subject = "server.pem";
    let mut roots = rustls::RootCertStore::empty();
    if let Err(e) = roots.add(CertificateDer::from(ca.der.clone())) {
        f.problem("ca.pem", format!("not usable as a trust anchor: {e}"));
        return;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match rustls::client::WebPkiServerVerifier::builder_with_provider(
        std::sync::Arc::new(roots),
        provider,
    )
    .build()
    {
        Ok(v) => v,
        Err(e) => {
            f.problem(subject, format!("cannot build a verifier: {e}"));
            return;
        }
    };
    let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
    let at = UnixTime::since_unix_epoch(
        now.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    match verifier.verify_server_cert(
        &CertificateDer::from(server.der.clone()),
        &[],
        &name,
        &[],
        at,
    ) {
        Ok(_) => f.ok(
            subject,
            format!("chains to ca.pem for the name {SERVER_NAME} (as workers verify it)"),
        ),
        Err(e) => f.problem(
            subject,
            format!("workers would reject it: {e} (against ca.pem, name {SERVER_NAME})"),
        ),
    }
}

/// The store's integrity and records; returns the join token's hash when readable.
fn check_store(dir: &DataDir, f: &mut Findings) -> Option<String> {
    let subject = "store.redb";
    let inspection = match Store::inspect(&dir.store()) {
        Ok(i) => i,
        Err(StoreError::Missing { .. }) => return None, // reported by check_modes
        Err(e @ StoreError::Locked { .. }) => {
            f.problem(
                subject,
                format!("not checked: {e} (`coordinator check` reads the store only while the coordinator is stopped)"),
            );
            return None;
        }
        Err(StoreError::Damaged { message, .. }) => {
            f.problem(
                subject,
                format!("damaged: {message}; restore store.redb from a backup"),
            );
            return None;
        }
        Err(e) => {
            f.problem(subject, e.to_string());
            return None;
        }
    };
    match &inspection.integrity_problem {
        Some(p) => f.problem(subject, format!("{p}; restore store.redb from a backup")),
        None => f.ok(subject, "passes the database's integrity check"),
    }
    match inspection.format_version {
        Some(1) => f.warn(
            subject,
            "format version 1: records have no checksums yet (the coordinator adds them at its next start)",
        ),
        Some(v) => f.ok(subject, format!("format version {v}, records checksummed")),
        None => {}
    }
    let mut bad = 0;
    for record in &inspection.records {
        if let Some(p) = &record.problem {
            bad += 1;
            f.problem(&format!("store.redb/{}", record.key), p.clone());
        }
    }
    if bad == 0 {
        f.ok(
            subject,
            format!(
                "{} record(s), every checksum and decoding correct",
                inspection.records.len()
            ),
        );
    }
    inspection.join_token_sha256
}

/// The join-token file is what workers send: its hash must be the store's.
fn check_join_token(dir: &DataDir, stored_hash: Option<String>, f: &mut Findings) {
    let subject = "join-token";
    let Ok(token) = std::fs::read_to_string(dir.join_token()) else {
        return; // reported by check_modes
    };
    let token = token.trim();
    if token.is_empty() {
        f.problem(
            subject,
            "empty; run `coordinator rotate-join-token --data-dir DIR`",
        );
        return;
    }
    let Some(stored) = stored_hash else {
        return;
    };
    if crate::store::join_token_hash(token) == stored.to_ascii_lowercase() {
        f.ok(subject, "matches the hash in the store");
    } else {
        f.problem(
            subject,
            "does not match the hash in the store: workers using this file cannot join (`coordinator rotate-join-token --data-dir DIR` writes both)",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datadir::{self, DataDir};
    use crate::store::CHECKSUM_LEN;
    use std::os::unix::fs::PermissionsExt;

    const DAY: Duration = Duration::from_secs(86_400);

    /// A data dir with two apps whose secret hashes are easy to find in the store file.
    fn data_dir() -> (tempfile::TempDir, DataDir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("data"));
        datadir::init(&dir, &[("alpha".into(), Default::default())], 1).unwrap();
        let store = Store::open(&dir.store()).unwrap();
        store
            .add_app(&scheduler_core::protocol::cluster::AppRecord {
                app_id: "beta".into(),
                secret_sha256: "b".repeat(64),
                quota: Default::default(),
            })
            .unwrap();
        (tmp, dir)
    }

    fn problems(report: &CheckReport) -> Vec<(String, String)> {
        report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Problem)
            .map(|f| (f.subject.clone(), f.detail.clone()))
            .collect()
    }

    fn find(bytes: &[u8], needle: &[u8]) -> usize {
        bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    }

    #[test]
    fn a_fresh_data_dir_passes_with_no_warning() {
        let (_tmp, dir) = data_dir();
        let report = check(&dir, SystemTime::now());
        assert!(report.ok, "{}", report.to_text());
        assert_eq!((report.problems, report.warnings), (0, 0));
        let details: Vec<_> = report.findings.iter().map(|f| f.detail.as_str()).collect();
        for expected in [
            "chains to ca.pem for the name hybrid-coordinator (as workers verify it)",
            "passes the database's integrity check",
            "format version 2, records checksummed",
            "7 record(s), every checksum and decoding correct",
            "matches the hash in the store",
        ] {
            assert!(details.contains(&expected), "{expected}: {details:?}");
        }
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["ok"], true);
        assert_eq!(json["findings"][0]["severity"], "ok");
    }

    #[test]
    fn a_bit_flip_in_an_app_record_is_reported_with_its_key() {
        let (_tmp, dir) = data_dir();
        let mut bytes = std::fs::read(dir.store()).unwrap();
        let at = find(&bytes, "b".repeat(64).as_bytes());
        bytes[at + 10] ^= 0x01;
        std::fs::write(dir.store(), &bytes).unwrap();
        let report = check(&dir, SystemTime::now());
        assert!(!report.ok);
        let found = problems(&report);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, "store.redb");
        assert!(
            found[0]
                .1
                .starts_with("the database failed its integrity check"),
            "{found:?}"
        );
        assert_eq!(found[1].0, "store.redb/apps/beta");
        assert!(found[1].1.starts_with("checksum mismatch"), "{found:?}");
    }

    #[test]
    fn a_truncated_store_is_reported_as_damaged() {
        let (_tmp, dir) = data_dir();
        let len = std::fs::metadata(dir.store()).unwrap().len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.store())
            .unwrap();
        file.set_len(len / 2).unwrap();
        drop(file);
        let found = problems(&check(&dir, SystemTime::now()));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "store.redb");
        assert_eq!(
            found[0].1,
            "damaged: the database library panicked while opening a copy of it: assertion \
             failed: storage.raw_file_len()? >= header.layout().len(); restore store.redb from \
             a backup"
        );
    }

    #[test]
    fn a_zeroed_page_is_reported_as_a_failed_integrity_check() {
        let (_tmp, dir) = data_dir();
        let mut bytes = std::fs::read(dir.store()).unwrap();
        let page = find(&bytes, "b".repeat(64).as_bytes()) / 4096 * 4096;
        bytes[page..page + 4096].fill(0);
        std::fs::write(dir.store(), &bytes).unwrap();
        let found = problems(&check(&dir, SystemTime::now()));
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(
            found[0],
            (
                "store.redb".to_string(),
                "the database failed its integrity check: DB corrupted: Primary is corrupted \
                 despite 2-phase commit; restore store.redb from a backup"
                    .to_string()
            )
        );
        assert_eq!(found[1].0, "store.redb/(all records)");
    }

    #[test]
    fn a_store_locked_by_a_running_coordinator_is_a_problem_naming_the_lock() {
        let (_tmp, dir) = data_dir();
        let _running = Store::open(&dir.store()).unwrap();
        let found = problems(&check(&dir, SystemTime::now()));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].1.starts_with("not checked: cannot open store"),
            "{found:?}"
        );
        assert!(found[0].1.contains("locked"), "{found:?}");
    }

    #[test]
    fn files_modes_keys_and_the_join_token_are_checked() {
        let (_tmp, dir) = data_dir();
        std::fs::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The server key replaced by the CA's: it does not belong to server.pem.
        std::fs::copy(dir.ca_key(), dir.server_key()).unwrap();
        std::fs::set_permissions(dir.ca_key(), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::remove_file(dir.cluster_json()).unwrap(); // optional
        std::fs::write(dir.join_token(), "not the token").unwrap();
        let found = problems(&check(&dir, SystemTime::now()));
        let subjects: Vec<_> = found.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            subjects,
            [".", "ca.key", "server.key", "join-token"],
            "{found:?}"
        );
        assert!(found[0].1.starts_with("mode 755"), "{found:?}");
        assert!(found[1].1.starts_with("mode 640"), "{found:?}");
        assert!(
            found[2].1.starts_with("does not belong to the certificate"),
            "{found:?}"
        );
        assert!(
            found[3]
                .1
                .starts_with("does not match the hash in the store"),
            "{found:?}"
        );

        std::fs::remove_file(dir.server_cert()).unwrap();
        let found = problems(&check(&dir, SystemTime::now()));
        assert!(
            found.contains(&(
                "server.pem".to_string(),
                "missing; restore it from a backup".to_string()
            )),
            "{found:?}"
        );
    }

    #[test]
    fn certificates_expiring_within_30_days_warn_and_expired_ones_fail() {
        let (_tmp, dir) = data_dir();
        let now = SystemTime::now();
        // The server certificate is valid for 365 days: 340 days on, it expires within 30.
        let report = check(&dir, now + 340 * DAY);
        assert!(report.ok, "{}", report.to_text());
        let warnings: Vec<_> = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].subject, "server.pem");
        assert!(
            warnings[0].detail.contains("expires in 24 day(s)")
                || warnings[0].detail.contains("expires in 25 day(s)"),
            "{warnings:?}"
        );
        assert!(warnings[0].detail.contains("rotate-server-cert"));
        // Past its expiry it is a problem, and workers would reject it.
        let found = problems(&check(&dir, now + 400 * DAY));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].1.starts_with("server certificate expired at"),
            "{found:?}"
        );
        assert!(
            found[1].1.starts_with("workers would reject it"),
            "{found:?}"
        );
        // The CA lasts 10 years.
        let found = problems(&check(&dir, now + 3651 * DAY));
        assert!(
            found
                .iter()
                .any(|(s, d)| s == "ca.pem" && d.starts_with("cluster CA expired at")),
            "{found:?}"
        );
    }

    #[test]
    fn a_store_without_checksums_is_a_warning_and_its_records_are_still_checked() {
        let (_tmp, dir) = data_dir();
        // Rewrite the store as a version-1 coordinator left it: values without checksums.
        {
            use redb::{ReadableTable, TableDefinition};
            let db = redb::Database::open(dir.store()).unwrap();
            let txn = db.begin_write().unwrap();
            for name in [crate::store::META_TABLE, crate::store::APPS_TABLE] {
                let mut table = txn
                    .open_table(TableDefinition::<&str, &[u8]>::new(name))
                    .unwrap();
                let rows: Vec<(String, Vec<u8>)> = table
                    .iter()
                    .unwrap()
                    .map(|r| {
                        let (k, v) = r.unwrap();
                        let v = v.value();
                        (k.value().to_string(), v[..v.len() - CHECKSUM_LEN].to_vec())
                    })
                    .collect();
                for (k, v) in rows {
                    let v = if k == "format_version" {
                        1u32.to_be_bytes().to_vec()
                    } else {
                        v
                    };
                    table.insert(k.as_str(), v.as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let report = check(&dir, SystemTime::now());
        assert!(report.ok, "{}", report.to_text());
        let store = report.about("store.redb");
        assert!(
            store.iter().any(|f| f.severity == Severity::Warning
                && f.detail
                    .starts_with("format version 1: records have no checksums yet")),
            "{store:?}"
        );
        assert!(
            store
                .iter()
                .any(|f| f.detail == "7 record(s), every checksum and decoding correct"),
            "{store:?}"
        );
        // The next open migrates it, and then it passes without warning.
        drop(Store::open(&dir.store()).unwrap());
        let report = check(&dir, SystemTime::now());
        assert_eq!(
            (report.problems, report.warnings),
            (0, 0),
            "{}",
            report.to_text()
        );
    }

    #[test]
    fn a_rotated_server_certificate_chains_to_the_same_ca() {
        let (_tmp, dir) = data_dir();
        let ca_before = std::fs::read(dir.ca_cert()).unwrap();
        let cert_before = std::fs::read(dir.server_cert()).unwrap();
        let key_before = std::fs::read(dir.server_key()).unwrap();
        let now = SystemTime::now();
        let rotated = datadir::rotate_server_cert(&dir, 730, now).unwrap();
        assert_eq!(rotated.server_cert, dir.server_cert());
        assert_eq!(std::fs::read(dir.ca_cert()).unwrap(), ca_before);
        assert_ne!(std::fs::read(dir.server_cert()).unwrap(), cert_before);
        assert_ne!(std::fs::read(dir.server_key()).unwrap(), key_before);
        let mode = std::fs::metadata(dir.server_key())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        // Still fine when the old one would have expired.
        let report = check(&dir, now + 400 * DAY);
        assert!(report.ok, "{}", report.to_text());
        assert_eq!(report.warnings, 0, "{}", report.to_text());
        assert!(datadir::quic_server_config(&dir).is_ok());
    }

    #[test]
    fn a_server_certificate_never_outlives_its_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("data"));
        let validity = datadir::CertValidity {
            ca_days: 10,
            server_days: 365,
        };
        datadir::init_with(&dir, &[], validity, 1).unwrap();
        let now = SystemTime::now();
        let rotated = datadir::rotate_server_cert(&dir, 365, now).unwrap();
        let expiry = |path: &Path| {
            let pem = std::fs::read(path).unwrap();
            let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
            pem.parse_x509().unwrap().validity().not_after.timestamp()
        };
        assert_eq!(expiry(&dir.server_cert()), expiry(&dir.ca_cert()));
        assert_eq!(
            rfc3339(expiry(&dir.ca_cert())),
            rotated.not_after,
            "the printed expiry is the clamped one"
        );
        // Once the CA has expired, rotation refuses and says what it takes.
        let err = datadir::rotate_server_cert(&dir, 365, now + 11 * DAY)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a new CA needs a new data dir"), "{err}");
    }

    #[test]
    fn a_rotated_join_token_is_in_the_file_the_store_and_cluster_json() {
        let (_tmp, dir) = data_dir();
        let old = std::fs::read_to_string(dir.join_token()).unwrap();
        let rotated = datadir::rotate_join_token(&dir).unwrap();
        assert_ne!(rotated.join_token, old);
        assert_eq!(
            std::fs::read_to_string(dir.join_token()).unwrap(),
            rotated.join_token
        );
        let mode = std::fs::metadata(dir.join_token())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let store = Store::open(&dir.store()).unwrap();
        assert_eq!(
            store.join_token_sha256().unwrap(),
            crate::store::join_token_hash(&rotated.join_token)
        );
        assert_eq!(store.apps().unwrap().len(), 2, "nothing else changed");
        let cluster: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.cluster_json()).unwrap()).unwrap();
        assert_eq!(cluster["join_token"], rotated.join_token.as_str());
        assert_eq!(cluster["apps"][0]["app_id"], "alpha");
        // With the store open (a running coordinator), rotation refuses and changes nothing.
        let err = datadir::rotate_join_token(&dir).unwrap_err().to_string();
        assert!(err.contains("locked"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join_token()).unwrap(),
            rotated.join_token
        );
        drop(store);
        assert!(check(&dir, SystemTime::now()).ok);
    }
}
