//! The coordinator's durable state in redb (one file `store.redb` in the data dir): the token key
//! ring and when it last rotated, the next worker issuer, the guarantor's reserved container
//! sequence, the SHA-256 of the join token (never the token itself), the app registry, and the
//! nodes declared lost that have not re-joined since. Every write is one committed transaction.
//! The file is created 0600.

use redb::{Database, ReadableTable, TableDefinition};
use scheduler_core::NodeId;
use scheduler_core::protocol::cluster::AppRecord;
use scheduler_core::token::KeyRing;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const APPS: TableDefinition<&str, &[u8]> = TableDefinition::new("apps");

/// Format of the records in this store; bumped on incompatible changes.
const FORMAT_VERSION: u32 = 1;

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
        "cannot open store {path}: {message} (is another coordinator using this data dir, or is the file corrupted?)"
    )]
    Open { path: PathBuf, message: String },
    #[error("store {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("store {path} is not initialised: record {key:?} is missing")]
    MissingRecord { path: PathBuf, key: String },
    #[error("store {path}: record {key:?} is corrupted: {message}")]
    Corrupted {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error(
        "store {path} has format version {found}, this coordinator reads version {FORMAT_VERSION}"
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
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
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
            .map_err(|e| StoreError::Open {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let store = Store {
            db,
            path: path.to_path_buf(),
        };
        let token_hash = join_token_hash(&init.join_token);
        store.write(|meta, _apps| {
            meta.insert(K_FORMAT, FORMAT_VERSION.to_be_bytes().as_slice())?;
            meta.insert(K_JOIN_TOKEN_SHA256, token_hash.as_bytes())?;
            meta.insert(K_NEXT_ISSUER, 1u32.to_be_bytes().as_slice())?;
            meta.insert(K_GUARANTOR_SEQ, 0u64.to_be_bytes().as_slice())?;
            let keys = encode(&init.keys);
            meta.insert(K_KEYS, keys.as_slice())?;
            Ok(())
        })?;
        Ok(store)
    }

    /// Open an existing store and check it is complete.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        let db = Database::open(path).map_err(|e| StoreError::Open {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut store = Store {
            db,
            path: path.to_path_buf(),
        };
        let format = u32::from_be_bytes(store.fixed::<4>(K_FORMAT)?);
        if format != FORMAT_VERSION {
            return Err(StoreError::WrongFormat {
                path: store.path.clone(),
                found: format,
            });
        }
        if store.migrate_clear_join_token()? {
            tracing::warn!(
                store = %store.path.display(),
                "the store held the join token in clear: replaced it by its SHA-256"
            );
            // Best effort to also drop the freed page that held it from the file.
            if let Err(e) = store.db.compact() {
                tracing::warn!(store = %store.path.display(), error = %e, "compacting the store failed");
            }
        }
        // Read every record once so a damaged store is reported at start, not mid-run.
        store.join_token_sha256()?;
        store.key_state()?;
        store.next_issuer()?;
        store.guarantor_reserved_seq()?;
        store.apps()?;
        Ok(store)
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

    fn write(
        &self,
        f: impl FnOnce(
            &mut redb::Table<&str, &[u8]>,
            &mut redb::Table<&str, &[u8]>,
        ) -> Result<(), redb::StorageError>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.io(e))?;
            let mut apps = txn.open_table(APPS).map_err(|e| self.io(e))?;
            f(&mut meta, &mut apps).map_err(|e| self.io(e))?;
        }
        txn.commit().map_err(|e| self.io(e))
    }

    fn get_meta(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        let table = txn.open_table(META).map_err(|e| match e {
            redb::TableError::TableDoesNotExist(_) => StoreError::MissingRecord {
                path: self.path.clone(),
                key: key.to_string(),
            },
            other => self.io(other),
        })?;
        let value = table.get(key).map_err(|e| self.io(e))?;
        value
            .map(|v| v.value().to_vec())
            .ok_or_else(|| StoreError::MissingRecord {
                path: self.path.clone(),
                key: key.to_string(),
            })
    }

    fn fixed<const N: usize>(&self, key: &str) -> Result<[u8; N], StoreError> {
        let bytes = self.get_meta(key)?;
        bytes
            .try_into()
            .map_err(|b: Vec<u8>| StoreError::Corrupted {
                path: self.path.clone(),
                key: key.to_string(),
                message: format!("expected {N} bytes, found {}", b.len()),
            })
    }

    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.write(|meta, _| meta.insert(key, value).map(|_| ()))
    }

    /// Lowercase hex SHA-256 of the join token (see [`join_token_hash`]).
    pub fn join_token_sha256(&self) -> Result<String, StoreError> {
        let bytes = self.get_meta(K_JOIN_TOKEN_SHA256)?;
        match String::from_utf8(bytes) {
            Ok(hash) if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(hash.to_ascii_lowercase())
            }
            Ok(other) => Err(StoreError::Corrupted {
                path: self.path.clone(),
                key: K_JOIN_TOKEN_SHA256.into(),
                message: format!("expected 64 hex digits, found {} bytes", other.len()),
            }),
            Err(e) => Err(StoreError::Corrupted {
                path: self.path.clone(),
                key: K_JOIN_TOKEN_SHA256.into(),
                message: e.to_string(),
            }),
        }
    }

    /// Replaces a clear join-token record (older stores) by its hash, in one transaction;
    /// returns whether there was one.
    fn migrate_clear_join_token(&self) -> Result<bool, StoreError> {
        let mut migrated = false;
        self.write(|meta, _| {
            let clear = meta
                .remove(K_LEGACY_JOIN_TOKEN)?
                .map(|v| v.value().to_vec());
            if let Some(clear) = clear {
                migrated = true;
                let hash = hex::encode(Sha256::digest(&clear));
                if meta.get(K_JOIN_TOKEN_SHA256)?.is_none() {
                    meta.insert(K_JOIN_TOKEN_SHA256, hash.as_bytes())?;
                }
            }
            Ok(())
        })?;
        Ok(migrated)
    }

    pub fn key_state(&self) -> Result<KeyState, StoreError> {
        let bytes = self.get_meta(K_KEYS)?;
        rmp_serde::from_slice(&bytes).map_err(|e| StoreError::Corrupted {
            path: self.path.clone(),
            key: K_KEYS.into(),
            message: e.to_string(),
        })
    }

    pub fn save_key_state(&self, keys: &KeyState) -> Result<(), StoreError> {
        self.put_meta(K_KEYS, &encode(keys))
    }

    /// The issuer prefix the next worker join gets.
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
        rmp_serde::from_slice(&bytes).map_err(|e| StoreError::Corrupted {
            path: self.path.clone(),
            key: K_LOST_NODES.into(),
            message: e.to_string(),
        })
    }

    pub fn set_lost_nodes(&self, nodes: &BTreeSet<NodeId>) -> Result<(), StoreError> {
        self.put_meta(K_LOST_NODES, &encode(nodes))
    }

    pub fn apps(&self) -> Result<Vec<AppRecord>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        let table = match txn.open_table(APPS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.io(e)),
        };
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| self.io(e))? {
            let (k, v) = row.map_err(|e| self.io(e))?;
            let record: AppRecord =
                rmp_serde::from_slice(v.value()).map_err(|e| StoreError::Corrupted {
                    path: self.path.clone(),
                    key: format!("apps/{}", k.value()),
                    message: e.to_string(),
                })?;
            out.push(record);
        }
        Ok(out)
    }

    /// Register an app; refuses a duplicate id.
    pub fn add_app(&self, record: &AppRecord) -> Result<(), StoreError> {
        let mut exists = false;
        self.write(|_, apps| {
            if apps.get(record.app_id.as_str())?.is_some() {
                exists = true;
                return Ok(());
            }
            apps.insert(record.app_id.as_str(), encode(record).as_slice())
                .map(|_| ())
        })?;
        if exists {
            return Err(StoreError::AppExists(record.app_id.clone()));
        }
        Ok(())
    }
}

/// What the store keeps of a join token: its SHA-256, lowercase hex.
pub fn join_token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Encoding plain structs of strings and integers into a Vec cannot fail.
    rmp_serde::to_vec_named(value).expect("msgpack encoding of a store record")
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::quota::QueueableQuota;
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
            s.write(|meta, _| {
                meta.remove(K_JOIN_TOKEN_SHA256)?;
                meta.insert(K_LEGACY_JOIN_TOKEN, TOKEN.as_bytes())?;
                Ok(())
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
        assert!(matches!(err, StoreError::Open { .. }), "{err}");
        // A valid database that lacks the records.
        let empty = dir.path().join("empty.redb");
        drop(Database::create(&empty).unwrap());
        let err = Store::open(&empty).unwrap_err();
        assert!(err.to_string().contains("format_version"), "{err}");
    }
}
