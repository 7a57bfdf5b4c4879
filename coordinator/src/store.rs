//! The coordinator's durable state in redb (one file `store.redb` in the data dir): the token key
//! ring and when it last rotated, the next worker issuer, the guarantor's reserved container
//! sequence, the SHA-256 of the join token (never the token itself), the app registry, and the
//! nodes declared lost that have not re-joined since. Every write is one committed transaction.
//! The file is created 0600.

//!
//! Every value carries a checksum (format version 2): the value is followed by the first
//! [`CHECKSUM_LEN`] bytes of a SHA-256 over the table name, the key and the value, and every read
//! verifies it, so a damaged record is [`StoreError::Corrupted`] naming its key instead of being
//! loaded. Stores of format version 1 (no checksums) are migrated on open, in one transaction.
//! Opening also runs redb's integrity check (page checksums) on an in-memory copy of the file, so
//! the file itself is never "repaired" behind the operator's back, and a panic inside redb on a
//! damaged file becomes [`StoreError::Damaged`].

use redb::{Database, ReadableTable, ReadableTableMetadata, StorageBackend, TableDefinition};
use scheduler_core::NodeId;
use scheduler_core::protocol::cluster::AppRecord;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::reservation::book::{ReservationBook, StoredReservations};
use scheduler_core::reservation::dra::Dra;
use scheduler_core::token::KeyRing;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Table names; part of every record's checksum.
pub const META_TABLE: &str = "meta";
pub const APPS_TABLE: &str = "apps";
const META: TableDefinition<&str, &[u8]> = TableDefinition::new(META_TABLE);
const APPS: TableDefinition<&str, &[u8]> = TableDefinition::new(APPS_TABLE);

/// Format of the records in this store; bumped on incompatible changes. Version 1 had no
/// checksums; version 2 seals every value ([`seal`]).
const FORMAT_VERSION: u32 = 2;
/// The format without checksums, migrated on open.
const FORMAT_UNSEALED: u32 = 1;

/// Bytes of SHA-256 appended to every value.
pub const CHECKSUM_LEN: usize = 4;

/// What to do about a damaged store at `path`; part of every damage error.
pub fn remedy(path: &Path) -> String {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    format!(
        "run `coordinator check --data-dir {}` (with the coordinator stopped) for a full report, and restore store.redb from a backup (or re-initialise the data dir)",
        dir.display()
    )
}

const K_FORMAT: &str = "format_version";
/// The join token in clear, as stores written before the hash record had it; migrated to
/// [`K_JOIN_TOKEN_SHA256`] and deleted when such a store is opened.
const K_LEGACY_JOIN_TOKEN: &str = "join_token";
/// Lowercase hex SHA-256 of the join token.
const K_JOIN_TOKEN_SHA256: &str = "join_token_sha256";
const K_KEYS: &str = "key_state";
const K_NEXT_ISSUER: &str = "next_issuer";
const K_GUARANTOR_SEQ: &str = "guarantor_reserved_seq";
const K_LOST_NODES: &str = "lost_nodes";
/// Nodes an operator is draining (`coordinator node drain`): they stay drained across a restart.
const K_DRAINING_NODES: &str = "draining_nodes";
/// The guarantor's reservations (Morpheus §6): the plan (each reservation's definition, its
/// recurrence and the allocation of its instance) and the owners.
const K_RESERVATIONS: &str = "reservations";
/// Runtimes of finished 3Sigma jobs with their features (3σPredict's history), newest last,
/// at most [`MAX_JOB_HISTORY`].
const K_JOB_HISTORY: &str = "threesigma_job_history";

/// Finished-job records kept for 3σPredict across restarts (the oldest are dropped).
pub const MAX_JOB_HISTORY: usize = 5000;

/// One finished 3Sigma job as 3σPredict learns from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobHistoryRecord {
    pub features: Vec<(String, String)>,
    pub runtime_s: f64,
    pub finish_ms: u64,
    #[serde(default)]
    pub app_id: String,
    /// SLO jobs: whether it met its deadline.
    #[serde(default)]
    pub slo_met: Option<bool>,
}

/// The token key ring and the wall-clock ms of its last rotation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyState {
    /// HMAC keys for QUEUEABLE tokens (workers have them).
    pub ring: KeyRing,
    /// Ed25519 seeds for GUARANTEED tokens, rotated with `ring` under the same key ids; never
    /// sent to anyone. `None` only in stores written before they existed (filled at start).
    #[serde(default)]
    pub guaranteed: Option<KeyRing>,
    pub rotated_at_ms: u64,
}

/// Store failures; none is retryable without operator action.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path} does not exist (run `coordinator init --data-dir DIR` first)")]
    Missing { path: PathBuf },
    #[error(
        "cannot open store {path}: it is locked by another process (flock on the file; is a coordinator running on this data dir?); stop it first"
    )]
    Locked { path: PathBuf },
    #[error("cannot open store {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("store {path} is damaged: {message}; {}", remedy(path))]
    Damaged { path: PathBuf, message: String },
    #[error("store {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("store {path} is not initialised: record {key:?} is missing")]
    MissingRecord { path: PathBuf, key: String },
    #[error(
        "store {path}: record {key:?} is corrupted: {message}; {}",
        remedy(path)
    )]
    Corrupted {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error(
        "store {path} has format version {found}, this coordinator reads versions {FORMAT_UNSEALED} and {FORMAT_VERSION}"
    )]
    WrongFormat { path: PathBuf, found: u32 },
    #[error("app {0:?} is registered already")]
    AppExists(String),
}

/// The initial records of a new store.
#[derive(Clone, Debug)]
pub struct InitialRecords {
    /// The join token; only its SHA-256 is stored.
    pub join_token: String,
    pub keys: KeyState,
}

/// Handle on the redb database.
pub struct Store {
    db: Database,
    path: PathBuf,
    /// Fault injection ([`Store::refuse_writes`]): while set, every write fails as an I/O error.
    refusing_writes: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// The checksum of a record: the first [`CHECKSUM_LEN`] bytes of SHA-256 over a domain tag, the
/// table name, the key and the value (NUL-separated; table names and keys contain no NUL).
fn checksum(table: &str, key: &str, value: &[u8]) -> [u8; CHECKSUM_LEN] {
    let mut h = Sha256::new();
    h.update(b"hybrid-scheduler store record\0");
    h.update(table.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    h.update([0]);
    h.update(value);
    let digest = h.finalize();
    let mut out = [0; CHECKSUM_LEN];
    out.copy_from_slice(&digest[..CHECKSUM_LEN]);
    out
}

/// The stored form of a value: the value followed by its checksum.
pub fn seal(table: &str, key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + CHECKSUM_LEN);
    out.extend_from_slice(value);
    out.extend_from_slice(&checksum(table, key, value));
    out
}

/// How a record is named in errors and reports: meta keys as they are, apps as `apps/ID`.
fn record_name(table: &str, key: &str) -> String {
    if table == META_TABLE {
        key.to_string()
    } else {
        format!("{table}/{key}")
    }
}

/// The value of a sealed record, or why its checksum does not match.
fn unseal(table: &str, key: &str, stored: &[u8]) -> Result<Vec<u8>, String> {
    if stored.len() < CHECKSUM_LEN {
        return Err(format!(
            "{} bytes, shorter than its {CHECKSUM_LEN}-byte checksum",
            stored.len()
        ));
    }
    let (value, sum) = stored.split_at(stored.len() - CHECKSUM_LEN);
    let expected = checksum(table, key, value);
    if sum != expected {
        return Err(format!(
            "checksum mismatch (stored {}, computed {})",
            hex::encode(sum),
            hex::encode(expected)
        ));
    }
    Ok(value.to_vec())
}

thread_local! {
    /// Set while [`guard`] runs on this thread: a panic then is reported as store damage, and
    /// the panic hook does not print it as a crash.
    static IN_GUARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Wraps the process's panic hook (once) so panics inside [`guard`] are logged at debug level
/// instead of printed as a crash; other panics go to the previous hook unchanged.
fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_GUARD.with(|g| g.get()) {
                tracing::debug!(%info, "panic inside the store library (reported as damage)");
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic inside redb into [`StoreError::Damaged`]. redb 2 reports most
/// damage as errors (which are mapped, see [`open_error`]), but it asserts on some damaged files:
/// a file shorter than the layout its header describes (`page_manager.rs`: `raw_file_len() >=
/// header.layout().len()`), and a B-tree page of unknown type (`btree_iters.rs`:
/// `unreachable!`, e.g. a zeroed page).
fn guard<T>(
    path: &Path,
    what: &str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    install_quiet_panic_hook();
    let outer = IN_GUARD.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    IN_GUARD.with(|g| g.set(outer));
    match result {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(StoreError::Damaged {
                path: path.to_path_buf(),
                message: format!("the database library panicked while {what}: {message}"),
            })
        }
    }
}

/// Maps redb's open errors: a held lock, a file redb does not recognise or finds inconsistent.
fn open_error(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked {
            path: path.to_path_buf(),
        },
        // redb reads the header with `read_exact` and checks its magic number: a file shorter
        // than the header or with a foreign header comes back as these I/O errors.
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
            ) =>
        {
            StoreError::Damaged {
                path: path.to_path_buf(),
                message: format!("it is not a readable redb database ({io})"),
            }
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => StoreError::Open {
            path: path.to_path_buf(),
            message: io.to_string(),
        },
        other => StoreError::Damaged {
            path: path.to_path_buf(),
            message: format!("the database library cannot open it: {other}"),
        },
    }
}

/// A redb database over a private in-memory copy of `bytes` (nothing reaches the file).
fn in_memory_copy(path: &Path, bytes: &[u8]) -> Result<Database, StoreError> {
    let backend = redb::backends::InMemoryBackend::new();
    let io = |e: std::io::Error| StoreError::Io {
        path: path.to_path_buf(),
        message: format!("copying into memory: {e}"),
    };
    backend.set_len(bytes.len() as u64).map_err(io)?;
    backend.write(0, bytes).map_err(io)?;
    if bytes.is_empty() {
        return Err(StoreError::Damaged {
            path: path.to_path_buf(),
            message: "the file is empty".into(),
        });
    }
    guard(path, "opening a copy of it", || {
        redb::Builder::new()
            .create_with_backend(backend)
            .map_err(|e| match open_error(path, e) {
                // The copy is private: no lock or permission can fail, everything is damage.
                StoreError::Open { message, .. } => StoreError::Damaged {
                    path: path.to_path_buf(),
                    message: format!("it is not a readable redb database ({message})"),
                },
                other => other,
            })
    })
}

/// redb's integrity check (page checksums, tree structure) on an in-memory copy of `bytes`:
/// `Err(message)` when it fails, even when redb could repair the copy (its repair rolls back to
/// an earlier commit, which would lose data silently).
fn integrity_of_copy(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut copy = in_memory_copy(path, bytes)?;
    let verdict = guard(path, "checking its integrity", || {
        copy.check_integrity().map_err(|e| StoreError::Damaged {
            path: path.to_path_buf(),
            message: format!("the database failed its integrity check: {e}"),
        })
    })?;
    if verdict {
        Ok(())
    } else {
        Err(StoreError::Damaged {
            path: path.to_path_buf(),
            message: "the database failed its integrity check (page checksums do not match; \
                      redb could only roll it back to an earlier commit)"
                .into(),
        })
    }
}

/// One record as `coordinator check` sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecordReport {
    /// `key` for meta records, `apps/ID` for apps.
    pub key: String,
    /// What is wrong with it (checksum or decoding); `None` when it is fine.
    pub problem: Option<String>,
}

/// What [`Store::inspect`] finds, without modifying the file.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// `None` when the record is missing or unreadable (see `records`).
    pub format_version: Option<u32>,
    /// redb's integrity check on a copy: `None` when it passed.
    pub integrity_problem: Option<String>,
    pub records: Vec<RecordReport>,
    /// Lowercase hex SHA-256 of the join token, when readable.
    #[serde(skip)]
    pub join_token_sha256: Option<String>,
}

impl Store {
    /// The store file inside a data dir.
    pub fn path_in(data_dir: &Path) -> PathBuf {
        data_dir.join("store.redb")
    }

    /// Create a new store with its initial records; refuses to overwrite an existing file.
    pub fn create(path: &Path, init: &InitialRecords) -> Result<Store, StoreError> {
        if path.exists() {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                message: "refusing to create a store over an existing file".into(),
            });
        }
        // Owner-only from the first byte: the store holds the token keys.
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| StoreError::Open {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?
        };
        let db = redb::Builder::new()
            .create_file(file)
            .map_err(|e| open_error(path, e))?;
        let store = Store {
            db,
            path: path.to_path_buf(),
            refusing_writes: std::sync::atomic::AtomicBool::new(false),
        };
        let token_hash = join_token_hash(&init.join_token);
        store.write(|tx| {
            tx.put(META_TABLE, K_FORMAT, &FORMAT_VERSION.to_be_bytes())?;
            tx.put(META_TABLE, K_JOIN_TOKEN_SHA256, token_hash.as_bytes())?;
            tx.put(META_TABLE, K_NEXT_ISSUER, &1u32.to_be_bytes())?;
            tx.put(META_TABLE, K_GUARANTOR_SEQ, &0u64.to_be_bytes())?;
            tx.put(META_TABLE, K_KEYS, &encode(&init.keys))
        })?;
        Ok(store)
    }

    /// Open an existing store (taking its lock), check it, migrate older formats, and read
    /// every record once so a damaged store is reported at start, not mid-run. A damaged store
    /// is [`StoreError::Corrupted`] (naming the record) or [`StoreError::Damaged`], never a
    /// panic, and the file is not modified before it has passed the checks.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        let db = guard(path, "opening it", || {
            redb::Builder::new()
                .set_repair_callback({
                    let path = path.to_path_buf();
                    move |session| {
                        if session.progress() == 0.0 {
                            tracing::warn!(
                                store = %path.display(),
                                "the store was not closed cleanly: recovering its last commit"
                            );
                        }
                    }
                })
                .open(path)
                .map_err(|e| open_error(path, e))
        })?;
        let store = Store {
            db,
            path: path.to_path_buf(),
            refusing_writes: std::sync::atomic::AtomicBool::new(false),
        };
        // Records first, so damage inside a record is reported with its key; then redb's own
        // check of the whole file.
        let checked = guard(path, "reading it", || {
            let format = store.format_version()?;
            store.verify_records(format)?;
            Ok(format)
        });
        let bytes = std::fs::read(path).map_err(|e| store.io(e))?;
        let integrity = integrity_of_copy(path, &bytes);
        let format = match (checked, integrity) {
            // A record whose checksum fails names its key; redb's verdict on the file is the
            // clearer report of anything else (a panic while reading is a symptom of it).
            (Err(e @ StoreError::Corrupted { .. }), _) => return Err(e),
            (_, Err(e)) | (Err(e), Ok(())) => return Err(e),
            (Ok(format), Ok(())) => format,
        };
        if format == FORMAT_UNSEALED {
            let count = guard(path, "migrating it", || store.migrate_to_checksums())?;
            tracing::warn!(
                store = %store.path.display(),
                records = count,
                "migrated the store to format version {FORMAT_VERSION}: every record now carries a checksum"
            );
        }
        if guard(path, "migrating it", || store.migrate_clear_join_token())? {
            tracing::warn!(
                store = %store.path.display(),
                "the store held the join token in clear: replaced it by its SHA-256"
            );
            // Best effort to also drop the freed page that held it from the file.
            let mut store = store;
            if let Err(e) = store.db.compact() {
                tracing::warn!(store = %store.path.display(), error = %e, "compacting the store failed");
            }
            return store.read_all().map(|()| store);
        }
        store.read_all()?;
        Ok(store)
    }

    fn read_all(&self) -> Result<(), StoreError> {
        guard(&self.path, "reading it", || {
            self.join_token_sha256()?;
            self.key_state()?;
            self.next_issuer()?;
            self.guarantor_reserved_seq()?;
            self.lost_nodes()?;
            self.draining_nodes()?;
            self.reservations()?;
            self.apps()?;
            Ok(())
        })
    }

    /// Inspect the store at `path` for `coordinator check` without modifying it: the file is
    /// read under a shared lock (so not while a coordinator has it open) and examined in
    /// memory: redb's integrity check, then every record's checksum and decoding.
    pub fn inspect(path: &Path) -> Result<Inspection, StoreError> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::Missing {
                path: path.to_path_buf(),
            },
            _ => StoreError::Open {
                path: path.to_path_buf(),
                message: e.to_string(),
            },
        })?;
        // SAFETY: flock on a valid descriptor we own; released when `file` is dropped.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Err(StoreError::Locked {
                    path: path.to_path_buf(),
                });
            }
            return Err(StoreError::Open {
                path: path.to_path_buf(),
                message: e.to_string(),
            });
        }
        let bytes = std::fs::read(path).map_err(|e| StoreError::Open {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        drop(file);
        let integrity_problem = integrity_of_copy(path, &bytes).err().map(|e| match e {
            StoreError::Damaged { message, .. } => message,
            other => other.to_string(),
        });
        let store = Store {
            db: in_memory_copy(path, &bytes)?,
            path: path.to_path_buf(),
            refusing_writes: std::sync::atomic::AtomicBool::new(false),
        };
        let format = guard(path, "reading it", || store.format_version());
        let mut records = Vec::new();
        let format_version = match format {
            Ok(v) => Some(v),
            Err(StoreError::MissingRecord { .. }) => None, // reported as missing below
            Err(e) => {
                records.push(RecordReport {
                    key: K_FORMAT.into(),
                    problem: Some(problem_of(e)),
                });
                None
            }
        };
        let rows = guard(path, "reading it", || store.raw_rows());
        let (rows, rows_read) = match rows {
            Ok(rows) => (rows, true),
            Err(e) => {
                records.push(RecordReport {
                    key: "(all records)".into(),
                    problem: Some(problem_of(e)),
                });
                (Vec::new(), false)
            }
        };
        let sealed = format_version != Some(FORMAT_UNSEALED);
        let mut join_token_sha256 = None;
        for (table, key, stored) in rows {
            let name = record_name(table, &key);
            let value = if sealed {
                unseal(table, &key, &stored)
            } else {
                Ok(stored)
            };
            let problem = value
                .and_then(|value| {
                    let decoded = store.decode_check(table, &key, &value);
                    if decoded.is_ok() && table == META_TABLE && key == K_JOIN_TOKEN_SHA256 {
                        join_token_sha256 = String::from_utf8(value).ok();
                    }
                    decoded
                })
                .err();
            records.push(RecordReport { key: name, problem });
        }
        for required in [
            K_FORMAT,
            K_JOIN_TOKEN_SHA256,
            K_KEYS,
            K_NEXT_ISSUER,
            K_GUARANTOR_SEQ,
        ] {
            if rows_read && !records.iter().any(|r| r.key == required) {
                records.push(RecordReport {
                    key: required.into(),
                    problem: Some("missing".into()),
                });
            }
        }
        Ok(Inspection {
            format_version,
            integrity_problem,
            records,
            join_token_sha256,
        })
    }

    /// Whether a record's value decodes as what its key holds.
    fn decode_check(&self, table: &str, key: &str, value: &[u8]) -> Result<(), String> {
        fn len(value: &[u8], n: usize) -> Result<(), String> {
            if value.len() == n {
                Ok(())
            } else {
                Err(format!("expected {n} bytes, found {}", value.len()))
            }
        }
        if table == APPS_TABLE {
            let record: AppRecord = rmp_serde::from_slice(value).map_err(|e| e.to_string())?;
            if record.app_id != key {
                return Err(format!("holds app {:?}", record.app_id));
            }
            return Ok(());
        }
        match key {
            K_FORMAT | K_NEXT_ISSUER => len(value, 4),
            K_GUARANTOR_SEQ => len(value, 8),
            K_JOIN_TOKEN_SHA256 => parse_hash(value),
            K_KEYS => rmp_serde::from_slice::<KeyState>(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            K_LOST_NODES | K_DRAINING_NODES => rmp_serde::from_slice::<BTreeSet<NodeId>>(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            K_RESERVATIONS => decode_reservations(value).map(|_| ()),
            K_JOB_HISTORY => rmp_serde::from_slice::<Vec<JobHistoryRecord>>(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            K_LEGACY_JOIN_TOKEN => Ok(()),
            other => Err(format!("unknown record {other:?}")),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Every record as stored (sealed or not): table, key, bytes.
    fn raw_rows(&self) -> Result<Vec<RawRow>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        let mut out = Vec::new();
        for (name, def) in [(META_TABLE, META), (APPS_TABLE, APPS)] {
            let table = match txn.open_table(def) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(self.io(e)),
            };
            for row in table.iter().map_err(|e| self.io(e))? {
                let (k, v) = row.map_err(|e| self.io(e))?;
                out.push((name, k.value().to_string(), v.value().to_vec()));
            }
        }
        Ok(out)
    }

    /// The store's format version: version 1 wrote it as 4 bare bytes, later versions seal it.
    fn format_version(&self) -> Result<u32, StoreError> {
        let stored = self.get_raw(META_TABLE, K_FORMAT)?;
        let value = if stored.len() == 4 {
            stored
        } else {
            unseal(META_TABLE, K_FORMAT, &stored)
                .map_err(|message| self.corrupted(K_FORMAT, message))?
        };
        let bytes: [u8; 4] = value.try_into().map_err(|b: Vec<u8>| {
            self.corrupted(K_FORMAT, format!("expected 4 bytes, found {}", b.len()))
        })?;
        let format = u32::from_be_bytes(bytes);
        if format != FORMAT_VERSION && format != FORMAT_UNSEALED {
            return Err(StoreError::WrongFormat {
                path: self.path.clone(),
                found: format,
            });
        }
        Ok(format)
    }

    /// Verifies every record's checksum (when `format` has them) and decoding.
    fn verify_records(&self, format: u32) -> Result<(), StoreError> {
        for (table, key, stored) in self.raw_rows()? {
            let name = record_name(table, &key);
            let value = if format == FORMAT_UNSEALED {
                stored
            } else {
                unseal(table, &key, &stored).map_err(|m| self.corrupted(&name, m))?
            };
            self.decode_check(table, &key, &value)
                .map_err(|m| self.corrupted(&name, m))?;
        }
        Ok(())
    }

    /// Seals every record of a version-1 store and writes the new format version, in one
    /// transaction; returns how many records it rewrote.
    fn migrate_to_checksums(&self) -> Result<usize, StoreError> {
        let rows = self.raw_rows()?;
        let count = rows.len();
        self.write(|tx| {
            for (table, key, value) in &rows {
                let value = if *table == META_TABLE && key == K_FORMAT {
                    FORMAT_VERSION.to_be_bytes().to_vec()
                } else {
                    value.clone()
                };
                tx.put(table, key, &value)?;
            }
            Ok(())
        })?;
        Ok(count)
    }

    /// A stored value, checked against its checksum (a mismatch names the record).
    fn unseal_stored(
        &self,
        table: &str,
        key: &str,
        stored: Option<Vec<u8>>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        stored
            .map(|s| {
                unseal(table, key, &s).map_err(|m| self.corrupted(&record_name(table, key), m))
            })
            .transpose()
    }

    fn corrupted(&self, key: &str, message: String) -> StoreError {
        StoreError::Corrupted {
            path: self.path.clone(),
            key: key.to_string(),
            message,
        }
    }

    /// Fault injection for tests of what the coordinator does when its disk fails: while
    /// `refuse` holds, every write fails with an I/O error and changes nothing. Never set in
    /// normal operation.
    #[doc(hidden)]
    pub fn refuse_writes(&self, refuse: bool) {
        self.refusing_writes
            .store(refuse, std::sync::atomic::Ordering::SeqCst);
    }

    fn write(
        &self,
        f: impl FnOnce(&mut Tx<'_, '_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if self
            .refusing_writes
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(StoreError::Io {
                path: self.path.clone(),
                message: "writes refused (fault injection)".to_string(),
            });
        }
        guard(&self.path, "writing to it", || {
            let txn = self.db.begin_write().map_err(|e| self.io(e))?;
            {
                let mut tx = Tx {
                    meta: txn.open_table(META).map_err(|e| self.io(e))?,
                    apps: txn.open_table(APPS).map_err(|e| self.io(e))?,
                    store: self,
                };
                f(&mut tx)?;
            }
            txn.commit().map_err(|e| self.io(e))
        })
    }

    /// A record as stored, checksum included.
    fn get_raw(&self, table: &'static str, key: &str) -> Result<Vec<u8>, StoreError> {
        let missing = || StoreError::MissingRecord {
            path: self.path.clone(),
            key: record_name(table, key),
        };
        let def = if table == META_TABLE { META } else { APPS };
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        let t = txn.open_table(def).map_err(|e| match e {
            redb::TableError::TableDoesNotExist(_) => missing(),
            other => self.io(other),
        })?;
        let value = t.get(key).map_err(|e| self.io(e))?;
        value.map(|v| v.value().to_vec()).ok_or_else(missing)
    }

    /// A meta record's value, checksum verified.
    fn get_meta(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        guard(&self.path, "reading it", || {
            let stored = self.get_raw(META_TABLE, key)?;
            unseal(META_TABLE, key, &stored).map_err(|m| self.corrupted(key, m))
        })
    }

    fn fixed<const N: usize>(&self, key: &str) -> Result<[u8; N], StoreError> {
        let bytes = self.get_meta(key)?;
        bytes.try_into().map_err(|b: Vec<u8>| {
            self.corrupted(key, format!("expected {N} bytes, found {}", b.len()))
        })
    }

    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.write(|tx| tx.put(META_TABLE, key, value))
    }

    /// Lowercase hex SHA-256 of the join token (see [`join_token_hash`]).
    pub fn join_token_sha256(&self) -> Result<String, StoreError> {
        let bytes = self.get_meta(K_JOIN_TOKEN_SHA256)?;
        parse_hash(&bytes).map_err(|m| self.corrupted(K_JOIN_TOKEN_SHA256, m))?;
        Ok(String::from_utf8_lossy(&bytes).to_ascii_lowercase())
    }

    /// Replace the join token's hash (`coordinator rotate-join-token`).
    pub fn set_join_token(&self, token: &str) -> Result<(), StoreError> {
        self.put_meta(K_JOIN_TOKEN_SHA256, join_token_hash(token).as_bytes())
    }

    /// Replaces a clear join-token record (older stores) by its hash, in one transaction;
    /// returns whether there was one.
    fn migrate_clear_join_token(&self) -> Result<bool, StoreError> {
        let mut migrated = false;
        self.write(|tx| {
            if let Some(clear) = tx.remove(META_TABLE, K_LEGACY_JOIN_TOKEN)? {
                migrated = true;
                let hash = hex::encode(Sha256::digest(&clear));
                if tx.get(META_TABLE, K_JOIN_TOKEN_SHA256)?.is_none() {
                    tx.put(META_TABLE, K_JOIN_TOKEN_SHA256, hash.as_bytes())?;
                }
            }
            Ok(())
        })?;
        Ok(migrated)
    }

    pub fn key_state(&self) -> Result<KeyState, StoreError> {
        let bytes = self.get_meta(K_KEYS)?;
        rmp_serde::from_slice(&bytes).map_err(|e| self.corrupted(K_KEYS, e.to_string()))
    }

    pub fn save_key_state(&self, keys: &KeyState) -> Result<(), StoreError> {
        self.put_meta(K_KEYS, &encode(keys))
    }

    /// Where a (re)started coordinator's issuer prefixes start: every issuer handed out before
    /// is below it (the coordinator reserves them in blocks, `ISSUER_RESERVATION_BLOCK`).
    pub fn next_issuer(&self) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(self.fixed::<4>(K_NEXT_ISSUER)?))
    }

    pub fn set_next_issuer(&self, next: u32) -> Result<(), StoreError> {
        self.put_meta(K_NEXT_ISSUER, &next.to_be_bytes())
    }

    /// The guarantor may mint container sequence numbers up to this value; a restarted
    /// guarantor resumes after it (so ids never repeat without a write per grant).
    pub fn guarantor_reserved_seq(&self) -> Result<u64, StoreError> {
        Ok(u64::from_be_bytes(self.fixed::<8>(K_GUARANTOR_SEQ)?))
    }

    pub fn set_guarantor_reserved_seq(&self, seq: u64) -> Result<(), StoreError> {
        self.put_meta(K_GUARANTOR_SEQ, &seq.to_be_bytes())
    }

    /// Nodes declared lost that have not re-joined since (their containers were reported lost;
    /// see `CoordinatorActor::join`). Empty when never written.
    pub fn lost_nodes(&self) -> Result<BTreeSet<NodeId>, StoreError> {
        let bytes = match self.get_meta(K_LOST_NODES) {
            Ok(b) => b,
            Err(StoreError::MissingRecord { .. }) => return Ok(BTreeSet::new()),
            Err(e) => return Err(e),
        };
        rmp_serde::from_slice(&bytes).map_err(|e| self.corrupted(K_LOST_NODES, e.to_string()))
    }

    pub fn set_lost_nodes(&self, nodes: &BTreeSet<NodeId>) -> Result<(), StoreError> {
        self.put_meta(K_LOST_NODES, &encode(nodes))
    }

    /// Nodes an operator is draining. Empty when never written.
    pub fn draining_nodes(&self) -> Result<BTreeSet<NodeId>, StoreError> {
        let bytes = match self.get_meta(K_DRAINING_NODES) {
            Ok(b) => b,
            Err(StoreError::MissingRecord { .. }) => return Ok(BTreeSet::new()),
            Err(e) => return Err(e),
        };
        rmp_serde::from_slice(&bytes).map_err(|e| self.corrupted(K_DRAINING_NODES, e.to_string()))
    }

    pub fn set_draining_nodes(&self, nodes: &BTreeSet<NodeId>) -> Result<(), StoreError> {
        self.put_meta(K_DRAINING_NODES, &encode(nodes))
    }

    /// The guarantor's reservations, checked (the plan's invariants hold, every owner's
    /// reservation is in it); `None` when never written.
    pub fn reservations(&self) -> Result<Option<ReservationBook>, StoreError> {
        let bytes = match self.get_meta(K_RESERVATIONS) {
            Ok(b) => b,
            Err(StoreError::MissingRecord { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        decode_reservations(&bytes)
            .map(Some)
            .map_err(|m| self.corrupted(K_RESERVATIONS, m))
    }

    pub fn set_reservations(&self, reservations: &StoredReservations) -> Result<(), StoreError> {
        self.put_meta(K_RESERVATIONS, &encode(reservations))
    }

    /// 3σPredict's history of finished jobs, oldest first (empty when never written).
    pub fn job_history(&self) -> Result<Vec<JobHistoryRecord>, StoreError> {
        let bytes = match self.get_meta(K_JOB_HISTORY) {
            Ok(b) => b,
            Err(StoreError::MissingRecord { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        rmp_serde::from_slice(&bytes).map_err(|e| self.corrupted(K_JOB_HISTORY, e.to_string()))
    }

    /// Append finished jobs to the history in one transaction, keeping the newest
    /// [`MAX_JOB_HISTORY`].
    pub fn append_job_history(&self, records: &[JobHistoryRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut all = self.job_history()?;
        all.extend_from_slice(records);
        if all.len() > MAX_JOB_HISTORY {
            let drop = all.len() - MAX_JOB_HISTORY;
            all.drain(..drop);
        }
        self.put_meta(K_JOB_HISTORY, &encode(&all))
    }

    pub fn apps(&self) -> Result<Vec<AppRecord>, StoreError> {
        guard(&self.path, "reading it", || {
            let txn = self.db.begin_read().map_err(|e| self.io(e))?;
            let table = match txn.open_table(APPS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(self.io(e)),
            };
            let mut out = Vec::with_capacity(table.len().map_err(|e| self.io(e))? as usize);
            for row in table.iter().map_err(|e| self.io(e))? {
                let (k, v) = row.map_err(|e| self.io(e))?;
                let name = record_name(APPS_TABLE, k.value());
                let value = unseal(APPS_TABLE, k.value(), v.value())
                    .map_err(|m| self.corrupted(&name, m))?;
                let record: AppRecord = rmp_serde::from_slice(&value)
                    .map_err(|e| self.corrupted(&name, e.to_string()))?;
                if record.app_id != k.value() {
                    return Err(self.corrupted(&name, format!("holds app {:?}", record.app_id)));
                }
                out.push(record);
            }
            Ok(out)
        })
    }

    /// Register an app; refuses a duplicate id.
    pub fn add_app(&self, record: &AppRecord) -> Result<(), StoreError> {
        let mut exists = false;
        self.write(|tx| {
            if tx.get(APPS_TABLE, &record.app_id)?.is_some() {
                exists = true;
                return Ok(());
            }
            tx.put(APPS_TABLE, &record.app_id, &encode(record))
        })?;
        if exists {
            return Err(StoreError::AppExists(record.app_id.clone()));
        }
        Ok(())
    }

    /// Unregister an app; `false` if there was none of that id.
    pub fn remove_app(&self, app_id: &str) -> Result<bool, StoreError> {
        let mut removed = false;
        self.write(|tx| {
            removed = tx.remove(APPS_TABLE, app_id)?.is_some();
            Ok(())
        })?;
        Ok(removed)
    }

    /// Replace an app's QUEUEABLE quota; `false` if there is no app of that id.
    pub fn set_app_quota(&self, app_id: &str, quota: QueueableQuota) -> Result<bool, StoreError> {
        let Some(mut record) = self.apps()?.into_iter().find(|a| a.app_id == app_id) else {
            return Ok(false);
        };
        record.quota = quota;
        self.write(|tx| tx.put(APPS_TABLE, app_id, &encode(&record)))?;
        Ok(true)
    }
}

/// A record as stored: table, key, bytes (checksum included when sealed).
type RawRow = (&'static str, String, Vec<u8>);

/// A write transaction's tables; values are sealed on the way in and verified on the way out.
struct Tx<'txn, 's> {
    meta: redb::Table<'txn, &'static str, &'static [u8]>,
    apps: redb::Table<'txn, &'static str, &'static [u8]>,
    store: &'s Store,
}

impl<'txn> Tx<'txn, '_> {
    fn table(&mut self, table: &str) -> &mut redb::Table<'txn, &'static str, &'static [u8]> {
        if table == META_TABLE {
            &mut self.meta
        } else {
            &mut self.apps
        }
    }

    fn put(&mut self, table: &str, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let sealed = seal(table, key, value);
        let store = self.store;
        self.table(table)
            .insert(key, sealed.as_slice())
            .map(|_| ())
            .map_err(|e| store.io(e))
    }

    fn get(&mut self, table: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let store = self.store;
        let stored = self
            .table(table)
            .get(key)
            .map_err(|e| store.io(e))?
            .map(|v| v.value().to_vec());
        store.unseal_stored(table, key, stored)
    }

    fn remove(&mut self, table: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let store = self.store;
        let stored = self
            .table(table)
            .remove(key)
            .map_err(|e| store.io(e))?
            .map(|v| v.value().to_vec());
        store.unseal_stored(table, key, stored)
    }
}

fn parse_hash(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() == 64 && bytes.iter().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(format!(
            "expected 64 hex digits, found {} bytes",
            bytes.len()
        ))
    }
}

fn problem_of(e: StoreError) -> String {
    match e {
        StoreError::Corrupted { message, .. } | StoreError::Damaged { message, .. } => message,
        other => other.to_string(),
    }
}

/// What the store keeps of a join token: its SHA-256, lowercase hex.
pub fn join_token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A stored reservations record, decoded and checked.
fn decode_reservations(value: &[u8]) -> Result<ReservationBook, String> {
    let stored: StoredReservations = rmp_serde::from_slice(value).map_err(|e| e.to_string())?;
    ReservationBook::restore(stored, Dra::default())
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Encoding plain structs of strings and integers into a Vec cannot fail.
    rmp_serde::to_vec_named(value).expect("msgpack encoding of a store record")
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::token::TokenKey;

    fn init() -> InitialRecords {
        InitialRecords {
            join_token: "jt".into(),
            keys: KeyState {
                ring: KeyRing::new(TokenKey::from_bytes(1, [3; 32])),
                guaranteed: None,
                rotated_at_ms: 5,
            },
        }
    }

    #[test]
    fn records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        {
            let s = Store::create(&path, &init()).unwrap();
            s.set_next_issuer(7).unwrap();
            s.set_guarantor_reserved_seq(2048).unwrap();
            let app = AppRecord {
                app_id: "a".into(),
                secret_sha256: "00".into(),
                quota: QueueableQuota::default(),
            };
            s.add_app(&app).unwrap();
            assert!(matches!(s.add_app(&app), Err(StoreError::AppExists(_))));
            assert!(Store::create(&path, &init()).is_err());
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.join_token_sha256().unwrap(), join_token_hash("jt"));
        assert_eq!(s.next_issuer().unwrap(), 7);
        assert_eq!(s.guarantor_reserved_seq().unwrap(), 2048);
        assert_eq!(s.key_state().unwrap(), init().keys);
        assert_eq!(s.apps().unwrap().len(), 1);
    }

    const TOKEN: &str = "3f9c2a7d41e8b6055d0c9e1f7a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b";

    #[test]
    fn the_join_token_is_stored_as_its_sha256_only_in_an_owner_only_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        let mut records = init();
        records.join_token = TOKEN.into();
        drop(Store::create(&path, &records).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
            "the clear join token is in the store file"
        );
        let s = Store::open(&path).unwrap();
        let expected = hex::encode(Sha256::digest(TOKEN.as_bytes()));
        assert_eq!(s.join_token_sha256().unwrap(), expected);
        assert_eq!(join_token_hash(TOKEN), expected);
    }

    #[test]
    fn a_clear_join_token_record_is_migrated_to_its_hash_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        {
            // A store as older coordinators wrote it: the token in clear, no hash record.
            let s = Store::create(&path, &init()).unwrap();
            s.write(|tx| {
                tx.remove(META_TABLE, K_JOIN_TOKEN_SHA256)?;
                tx.put(META_TABLE, K_LEGACY_JOIN_TOKEN, TOKEN.as_bytes())
            })
            .unwrap();
            assert!(s.join_token_sha256().is_err());
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.join_token_sha256().unwrap(), join_token_hash(TOKEN));
        assert!(matches!(
            s.get_meta(K_LEGACY_JOIN_TOKEN),
            Err(StoreError::MissingRecord { .. })
        ));
        drop(s);
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
            "the clear join token is still in the store file after migration"
        );
        // Opening again changes nothing.
        let s = Store::open(&path).unwrap();
        assert_eq!(s.join_token_sha256().unwrap(), join_token_hash(TOKEN));
    }

    #[test]
    fn missing_and_corrupted_stores_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        let err = Store::open(&path).unwrap_err();
        assert!(err.to_string().contains("coordinator init"), "{err}");
        std::fs::write(&path, b"this is not a redb file at all, just some bytes").unwrap();
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::Damaged { .. }), "{err}");
        assert_names_path_and_remedy(&err, &path);
        // A valid database that lacks the records.
        let empty = dir.path().join("empty.redb");
        drop(Database::create(&empty).unwrap());
        let err = Store::open(&empty).unwrap_err();
        assert!(err.to_string().contains("format_version"), "{err}");
    }

    fn assert_names_path_and_remedy(err: &StoreError, path: &Path) {
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("coordinator check --data-dir"), "{text}");
        assert!(text.contains("restore store.redb from a backup"), "{text}");
    }

    fn app(id: &str, secret_sha256: &str) -> AppRecord {
        AppRecord {
            app_id: id.into(),
            secret_sha256: secret_sha256.into(),
            quota: QueueableQuota {
                max_queueable: Some(3),
                max_queueable_per_guaranteed: None,
            },
        }
    }

    /// A store with two apps whose secret hashes are easy to find in the file.
    fn store_with_apps(path: &Path) {
        let s = Store::create(path, &init()).unwrap();
        s.add_app(&app("alpha", &"a".repeat(64))).unwrap();
        s.add_app(&app("beta", &"b".repeat(64))).unwrap();
    }

    fn find(bytes: &[u8], needle: &[u8]) -> usize {
        bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("needle in the store file")
    }

    #[test]
    fn every_record_is_stored_with_a_checksum_of_its_key_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        store_with_apps(&path);
        let s = Store::open(&path).unwrap();
        let rows = s.raw_rows().unwrap();
        assert_eq!(rows.len(), 7, "{rows:?}");
        for (table, key, stored) in rows {
            let value = unseal(table, &key, &stored).unwrap();
            assert_eq!(stored.len(), value.len() + CHECKSUM_LEN);
            // The same value under another key does not verify.
            assert!(unseal(table, "other", &stored).is_err());
        }
    }

    #[test]
    fn flipped_bytes_inside_an_app_record_are_corrupted_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        store_with_apps(&path);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = find(&bytes, "b".repeat(64).as_bytes());
        bytes[at + 10] ^= 0x01; // 'b' -> 'c': still valid msgpack, a different secret hash
        std::fs::write(&path, &bytes).unwrap();
        let err = Store::open(&path).unwrap_err();
        match &err {
            StoreError::Corrupted { key, message, .. } => {
                assert_eq!(key, "apps/beta");
                assert!(message.starts_with("checksum mismatch"), "{message}");
            }
            other => panic!("expected Corrupted, got {other:?}"),
        }
        assert_names_path_and_remedy(&err, &path);
        // The file was not modified by the failed open.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let report = Store::inspect(&path).unwrap();
        assert!(report.integrity_problem.is_some());
        let beta = report
            .records
            .iter()
            .find(|r| r.key == "apps/beta")
            .unwrap();
        assert!(
            beta.problem
                .as_deref()
                .unwrap()
                .starts_with("checksum mismatch")
        );
        let alpha = report
            .records
            .iter()
            .find(|r| r.key == "apps/alpha")
            .unwrap();
        assert_eq!(alpha.problem, None);
    }

    #[test]
    fn a_truncated_store_is_a_clear_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        store_with_apps(&path);
        let len = std::fs::metadata(&path).unwrap().len();
        // redb asserts on a file shorter than its header's layout (caught), and fails to read
        // a header cut short.
        let assertion = "the database library panicked while opening it: assertion failed: \
                         storage.raw_file_len()? >= header.layout().len()";
        for (keep, expected) in [
            (len / 2, assertion),
            (4096, assertion),
            (
                100,
                "it is not a readable redb database (failed to fill whole buffer)",
            ),
            (0, "it is not a readable redb database (invalid data)"),
        ] {
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(keep).unwrap();
            drop(file);
            let err = Store::open(&path).unwrap_err();
            match &err {
                StoreError::Damaged { message, .. } => {
                    assert_eq!(message, expected, "truncated to {keep}")
                }
                other => panic!("truncated to {keep}: {other:?}"),
            }
            assert_names_path_and_remedy(&err, &path);
            assert!(
                matches!(Store::inspect(&path), Err(StoreError::Damaged { .. })),
                "truncated to {keep}"
            );
        }
    }

    #[test]
    fn a_zeroed_page_is_a_clear_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        store_with_apps(&path);
        let clean = std::fs::read(&path).unwrap();
        // The page holding the apps, the one holding the meta records (format version first),
        // then the file's header page.
        let app_page = find(&clean, "b".repeat(64).as_bytes()) / 4096 * 4096;
        let meta_page = find(&clean, b"guarantor_reserved_seq") / 4096 * 4096;
        assert_ne!(app_page, meta_page);
        let failed_check = "the database failed its integrity check: DB corrupted: Primary is \
                            corrupted despite 2-phase commit";
        for (page, expected) in [
            (app_page, failed_check),
            (meta_page, failed_check),
            (0, "it is not a readable redb database (invalid data)"),
        ] {
            let mut bytes = clean.clone();
            bytes[page..page + 4096].fill(0);
            std::fs::write(&path, &bytes).unwrap();
            let err = Store::open(&path).unwrap_err();
            match &err {
                StoreError::Damaged { message, .. } => {
                    assert_eq!(message, expected, "page at {page}")
                }
                other => panic!("page at {page}: {other:?}"),
            }
            assert_names_path_and_remedy(&err, &path);
        }
        // `coordinator check` sees the zeroed app page as a failed integrity check and
        // unreadable records.
        let mut bytes = clean.clone();
        bytes[app_page..app_page + 4096].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let report = Store::inspect(&path).unwrap();
        assert!(report.integrity_problem.is_some());
        assert_eq!(report.records.len(), 1, "{:?}", report.records);
        assert_eq!(report.records[0].key, "(all records)");
    }

    #[test]
    fn a_store_left_open_by_a_crash_opens_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        store_with_apps(&path);
        let s = Store::open(&path).unwrap();
        s.set_next_issuer(9).unwrap();
        // No clean shutdown: redb must recover on the next open, which is not damage.
        std::mem::forget(s);
        // The forgotten handle still holds the file's flock, so open a copy: the file as a
        // crashed process leaves it.
        let copy = dir.path().join("copy.redb");
        std::fs::copy(&path, &copy).unwrap();
        // redb's header marks it as needing recovery (god byte after the 9-byte magic number,
        // RECOVERY_REQUIRED = 2 in redb 2.6's header.rs): this is the unclean case.
        let header = std::fs::read(&copy).unwrap();
        assert_ne!(header[9] & 2, 0, "the copy is not marked for recovery");
        let s = Store::open(&copy).unwrap();
        assert_eq!(s.next_issuer().unwrap(), 9);
        assert_eq!(s.apps().unwrap().len(), 2);
    }

    /// Writes `rows` into a new redb file as a version-1 coordinator did: no checksums.
    fn write_unsealed(path: &Path, meta: &[(&str, Vec<u8>)], apps: &[(&str, Vec<u8>)]) {
        let db = Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut m = txn.open_table(META).unwrap();
            for (k, v) in meta {
                m.insert(*k, v.as_slice()).unwrap();
            }
            let mut a = txn.open_table(APPS).unwrap();
            for (k, v) in apps {
                a.insert(*k, v.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_store_without_checksums_is_migrated_on_open_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        let keys = KeyState {
            guaranteed: Some(KeyRing::new(TokenKey::from_bytes(1, [9; 32]))),
            ..init().keys
        };
        let lost: BTreeSet<NodeId> = [NodeId::from("n1"), NodeId::from("n2")].into();
        let apps = [app("alpha", &"a".repeat(64)), app("beta", &"b".repeat(64))];
        let meta = vec![
            (K_FORMAT, 1u32.to_be_bytes().to_vec()),
            (K_JOIN_TOKEN_SHA256, join_token_hash("jt").into_bytes()),
            (K_KEYS, encode(&keys)),
            (K_NEXT_ISSUER, 12u32.to_be_bytes().to_vec()),
            (K_GUARANTOR_SEQ, 4096u64.to_be_bytes().to_vec()),
            (K_LOST_NODES, encode(&lost)),
        ];
        let app_rows: Vec<_> = apps
            .iter()
            .map(|a| (a.app_id.as_str(), encode(a)))
            .collect();
        write_unsealed(&path, &meta, &app_rows);

        let s = Store::open(&path).unwrap();
        assert_eq!(s.join_token_sha256().unwrap(), join_token_hash("jt"));
        assert_eq!(s.key_state().unwrap(), keys);
        assert_eq!(s.next_issuer().unwrap(), 12);
        assert_eq!(s.guarantor_reserved_seq().unwrap(), 4096);
        assert_eq!(s.lost_nodes().unwrap(), lost);
        assert_eq!(s.apps().unwrap(), apps.to_vec());
        // Every record is there, sealed, with the same value (the format now says 2).
        let rows = s.raw_rows().unwrap();
        assert_eq!(rows.len(), meta.len() + app_rows.len());
        for (table, key, stored) in rows {
            let value = unseal(table, &key, &stored).unwrap();
            let before = if table == META_TABLE {
                meta.iter().find(|(k, _)| *k == key).unwrap().1.clone()
            } else {
                app_rows.iter().find(|(k, _)| *k == key).unwrap().1.clone()
            };
            if key == K_FORMAT {
                assert_eq!(value, FORMAT_VERSION.to_be_bytes());
            } else {
                assert_eq!(value, before, "{key}");
            }
        }
        drop(s);
        // Opening again changes nothing.
        let s = Store::open(&path).unwrap();
        assert_eq!(s.apps().unwrap(), apps.to_vec());
        assert_eq!(s.format_version().unwrap(), FORMAT_VERSION);
    }

    #[test]
    fn a_store_without_checksums_and_with_a_clear_join_token_is_migrated_in_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        let meta = vec![
            (K_FORMAT, 1u32.to_be_bytes().to_vec()),
            (K_LEGACY_JOIN_TOKEN, TOKEN.as_bytes().to_vec()),
            (K_KEYS, encode(&init().keys)),
            (K_NEXT_ISSUER, 3u32.to_be_bytes().to_vec()),
            (K_GUARANTOR_SEQ, 0u64.to_be_bytes().to_vec()),
        ];
        write_unsealed(&path, &meta, &[]);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.join_token_sha256().unwrap(), join_token_hash(TOKEN));
        assert_eq!(s.next_issuer().unwrap(), 3);
        assert!(s.get_meta(K_LEGACY_JOIN_TOKEN).is_err());
    }

    #[test]
    fn a_locked_store_names_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = Store::path_in(dir.path());
        let _held = Store::create(&path, &init()).unwrap();
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
        assert!(err.to_string().contains("locked"), "{err}");
        assert!(matches!(
            Store::inspect(&path).unwrap_err(),
            StoreError::Locked { .. }
        ));
    }
}
