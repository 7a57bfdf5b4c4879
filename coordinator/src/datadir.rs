//! The coordinator's data dir: the cluster CA and the server certificate it issues (DNS name
//! [`SERVER_NAME`]), the join token, `cluster.json` (what `init` printed) and the store.
//! `coordinator init` creates it; `coordinator run` creates it if the directory is empty.

use crate::store::{InitialRecords, KeyState, Store, StoreError};
use rand::TryRng;
use rand::rngs::SysRng;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use scheduler_core::protocol::cluster::AppRecord;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::token::{KeyRing, TokenKey};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The DNS name in the server certificate; workers always connect with this server name.
pub const SERVER_NAME: &str = "hybrid-coordinator";

/// Files of a data dir.
#[derive(Clone, Debug)]
pub struct DataDir {
    pub root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }
    pub fn ca_cert(&self) -> PathBuf {
        self.root.join("ca.pem")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.root.join("ca.key")
    }
    pub fn server_cert(&self) -> PathBuf {
        self.root.join("server.pem")
    }
    pub fn server_key(&self) -> PathBuf {
        self.root.join("server.key")
    }
    pub fn join_token(&self) -> PathBuf {
        self.root.join("join-token")
    }
    pub fn cluster_json(&self) -> PathBuf {
        self.root.join("cluster.json")
    }
    pub fn store(&self) -> PathBuf {
        Store::path_in(&self.root)
    }

    /// Files only the coordinator's user may read (0600): the private keys, the join token,
    /// `cluster.json` (app secrets) and the store (token keys).
    pub fn secret_files(&self) -> [PathBuf; 5] {
        [
            self.ca_key(),
            self.server_key(),
            self.join_token(),
            self.cluster_json(),
            self.store(),
        ]
    }

    fn our_files(&self) -> [PathBuf; 7] {
        [
            self.ca_cert(),
            self.ca_key(),
            self.server_cert(),
            self.server_key(),
            self.join_token(),
            self.cluster_json(),
            self.store(),
        ]
    }
}

/// Data-dir failures.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "data dir {0} is initialised already (use `coordinator app add` to register more apps)"
    )]
    AlreadyInitialised(PathBuf),
    #[error(
        "data dir {dir} is incomplete: {missing} is missing but other coordinator files exist; restore it or start from an empty directory"
    )]
    Incomplete { dir: PathBuf, missing: PathBuf },
    #[error("certificate generation failed: {0}")]
    Certificate(String),
    #[error("TLS setup from {path}: {message}")]
    Tls { path: PathBuf, message: String },
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
    #[error("invalid app id {id:?}: {reason}")]
    InvalidAppId { id: String, reason: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One registered app with its secret (shown once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct NewApp {
    pub app_id: String,
    pub app_secret: String,
}

/// What `coordinator init` prints (and writes to `cluster.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct InitReport {
    pub ca_cert: PathBuf,
    pub join_token: String,
    pub apps: Vec<NewApp>,
}

/// `N` bytes from the operating system's RNG.
pub fn os_random<const N: usize>() -> Result<[u8; N], InitError> {
    let mut out = [0u8; N];
    SysRng
        .try_fill_bytes(&mut out)
        .map_err(|e| InitError::Random(e.to_string()))?;
    Ok(out)
}

/// A fresh token key from the OS RNG.
pub fn new_token_key(key_id: u32) -> Result<TokenKey, InitError> {
    Ok(TokenKey::from_bytes(key_id, os_random::<32>()?))
}

/// The key state, with GUARANTEED signing seeds created (and saved) if the store predates them.
pub fn key_state_with_guaranteed_keys(store: &Store) -> Result<(KeyState, KeyRing), InitError> {
    let mut keys = store.key_state()?;
    if let Some(seeds) = &keys.guaranteed {
        return Ok((keys.clone(), seeds.clone()));
    }
    let seeds = KeyRing::new(new_token_key(keys.ring.current.key_id)?);
    keys.guaranteed = Some(seeds.clone());
    store.save_key_state(&keys)?;
    Ok((keys, seeds))
}

pub fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> InitError + '_ {
    move |source| InitError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write a file readable by its owner only when `secret`.
fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), InitError> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let _ = secret;
    let mut f = opts.open(path).map_err(io_err(path))?;
    f.write_all(contents).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

fn validate_app_id(id: &str) -> Result<(), InitError> {
    let bad = |reason| {
        Err(InitError::InvalidAppId {
            id: id.to_string(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("empty");
    }
    if id.len() > 128 {
        return bad("longer than 128 bytes");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return bad("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// Register an app in an open store; returns its secret.
pub fn add_app(store: &Store, app_id: &str, quota: QueueableQuota) -> Result<NewApp, InitError> {
    validate_app_id(app_id)?;
    let secret = hex::encode(os_random::<32>()?);
    store.add_app(&AppRecord {
        app_id: app_id.to_string(),
        secret_sha256: sha256_hex(&secret),
        quota,
    })?;
    Ok(NewApp {
        app_id: app_id.to_string(),
        app_secret: secret,
    })
}

/// Whether the data dir holds a store.
pub fn is_initialised(dir: &DataDir) -> bool {
    dir.store().exists()
}

/// How long new certificates are valid, from their issue on the system clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CertValidity {
    /// The cluster CA (workers pin it: renewing it means redistributing `ca.pem`).
    pub ca_days: u32,
    /// The server certificate (`coordinator rotate-server-cert` renews it under the same CA).
    pub server_days: u32,
}

/// 10 years for the CA, 1 year for the server certificate.
impl Default for CertValidity {
    fn default() -> Self {
        CertValidity {
            ca_days: 3650,
            server_days: 365,
        }
    }
}

/// Certificates start one hour before their issue, so hosts whose clocks lag a little accept
/// them at once.
const CERT_BACKDATE: std::time::Duration = std::time::Duration::from_secs(3600);

fn unix_secs(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// When the data dir's CA (`ca_pem`, read from `dir`) expires.
pub(crate) fn ca_not_after(dir: &DataDir, ca_pem: &str) -> Result<time::OffsetDateTime, InitError> {
    x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
        .map_err(|e| e.to_string())
        .and_then(|(_, pem)| {
            let cert = pem.parse_x509().map_err(|e| e.to_string())?;
            time::OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp())
                .map_err(|e| e.to_string())
        })
        .map_err(|message| InitError::Tls {
            path: dir.ca_cert(),
            message,
        })
}

/// `[issued - 1 h, issued + days]`, never past `ca_not_after` (a certificate cannot outlive
/// the CA that vouches for it); an error once the CA has expired.
pub(crate) fn validity_under_ca(
    issued: std::time::SystemTime,
    days: u32,
    ca_not_after: time::OffsetDateTime,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), InitError> {
    let (from, until) = validity_window(issued, days)?;
    let until = until.min(ca_not_after);
    if until <= from {
        return Err(InitError::Certificate(format!(
            "the CA expired at {ca_not_after}: a new CA needs a new data dir (and ca.pem on every worker)"
        )));
    }
    Ok((from, until))
}

/// `[issued - 1 h, issued + days]`.
fn validity_window(
    issued: std::time::SystemTime,
    days: u32,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), InitError> {
    let bad = |e: time::error::ComponentRange| InitError::Certificate(e.to_string());
    let from = time::OffsetDateTime::from_unix_timestamp(unix_secs(issued - CERT_BACKDATE))
        .map_err(bad)?;
    let until =
        time::OffsetDateTime::from_unix_timestamp(unix_secs(issued) + i64::from(days) * 86_400)
            .map_err(bad)?;
    Ok((from, until))
}

/// A new server certificate (DNS name [`SERVER_NAME`]) and its key, signed by `ca`, valid for
/// `days` but never past the CA (`ca_not_after`: workers would reject it then anyway); returns
/// its expiry too.
fn issue_server_cert(
    ca: &rcgen::Issuer<'_, KeyPair>,
    ca_not_after: time::OffsetDateTime,
    days: u32,
    issued: std::time::SystemTime,
) -> Result<(rcgen::Certificate, KeyPair, time::OffsetDateTime), InitError> {
    let cert_err = |e: rcgen::Error| InitError::Certificate(e.to_string());
    let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(cert_err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, SERVER_NAME);
    (params.not_before, params.not_after) = validity_window(issued, days)?;
    if params.not_after > ca_not_after {
        tracing::warn!(
            ca_not_after = %ca_not_after,
            "the server certificate would outlive the CA: it expires with the CA"
        );
        params.not_after = ca_not_after;
    }
    if params.not_after <= params.not_before {
        return Err(InitError::Certificate(format!(
            "the CA expired at {ca_not_after}: a new CA needs a new data dir (and ca.pem on every worker)"
        )));
    }
    let key = KeyPair::generate().map_err(cert_err)?;
    let cert = params.signed_by(&key, ca).map_err(cert_err)?;
    Ok((cert, key, params.not_after))
}

/// Write `contents` to `path` through a temporary file in the same directory and a rename, so
/// a reader sees the old file or the new one, never half of one. `secret`: mode 0600, else 0644.
pub fn replace_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), InitError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.new"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(contents).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// What `coordinator rotate-server-cert` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RotatedServerCert {
    pub server_cert: PathBuf,
    /// RFC 3339.
    pub not_after: String,
}

/// Issue a new server certificate and key under the data dir's CA (`ca.pem`, `ca.key`) and
/// replace `server.pem`/`server.key` (each atomically, key first). Workers pin the CA, so they
/// accept the new certificate; a running coordinator keeps serving the old one until its next
/// start. Does not touch the store, so it also works while the coordinator runs.
pub fn rotate_server_cert(
    dir: &DataDir,
    days: u32,
    issued: std::time::SystemTime,
) -> Result<RotatedServerCert, InitError> {
    let read = |path: PathBuf| std::fs::read_to_string(&path).map_err(io_err(&path));
    let ca_pem = read(dir.ca_cert())?;
    let ca_key_pem = read(dir.ca_key())?;
    let tls = |path: PathBuf| {
        move |e: rcgen::Error| InitError::Tls {
            path,
            message: e.to_string(),
        }
    };
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(tls(dir.ca_key()))?;
    let ca = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(tls(dir.ca_cert()))?;
    let ca_not_after = ca_not_after(dir, &ca_pem)?;
    let (cert, key, not_after) = issue_server_cert(&ca, ca_not_after, days, issued)?;
    replace_file(&dir.server_key(), key.serialize_pem().as_bytes(), true)?;
    replace_file(&dir.server_cert(), cert.pem().as_bytes(), false)?;
    Ok(RotatedServerCert {
        server_cert: dir.server_cert(),
        not_after: not_after
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
    })
}

/// What `coordinator rotate-join-token` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RotatedJoinToken {
    pub join_token_file: PathBuf,
    pub join_token: String,
}

/// Replace the join token: a new random token in `join-token` (0600), its hash in the store and
/// in `cluster.json`'s `join_token` when that file exists. Needs the store, so not while the
/// coordinator runs ([`StoreError::Locked`] names the lock). The store is written first: if the
/// file write then fails, rerunning the command makes them agree again.
pub fn rotate_join_token(dir: &DataDir) -> Result<RotatedJoinToken, InitError> {
    let store = Store::open(&dir.store())?;
    let token = hex::encode(os_random::<32>()?);
    store.set_join_token(&token)?;
    drop(store);
    replace_file(&dir.join_token(), token.as_bytes(), true)?;
    let cluster = dir.cluster_json();
    if let Ok(bytes) = std::fs::read(&cluster)
        && let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(&bytes)
        && let Some(field) = json.get_mut("join_token")
    {
        *field = serde_json::Value::String(token.clone());
        let text = serde_json::to_vec_pretty(&json).expect("JSON value");
        replace_file(&cluster, &text, true)?;
    }
    Ok(RotatedJoinToken {
        join_token_file: dir.join_token(),
        join_token: token,
    })
}

/// Create CA, server certificate, join token, store and apps in `dir` (created if absent),
/// with the default [`CertValidity`].
pub fn init(
    dir: &DataDir,
    apps: &[(String, QueueableQuota)],
    now_ms: u64,
) -> Result<InitReport, InitError> {
    init_with(dir, apps, CertValidity::default(), now_ms)
}

/// [`init`] with chosen certificate validities. Certificates are dated by the system clock;
/// `now_ms` (the coordinator's clock) dates the token keys.
pub fn init_with(
    dir: &DataDir,
    apps: &[(String, QueueableQuota)],
    validity: CertValidity,
    now_ms: u64,
) -> Result<InitReport, InitError> {
    if is_initialised(dir) {
        return Err(InitError::AlreadyInitialised(dir.root.clone()));
    }
    for path in dir.our_files() {
        if path.exists() {
            return Err(InitError::Incomplete {
                dir: dir.root.clone(),
                missing: dir.store(),
            });
        }
    }
    for (id, _) in apps {
        validate_app_id(id)?;
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir.root)
            .map_err(io_err(&dir.root))?;
    }
    // An existing empty dir the operator made may be looser.
    secure(dir)?;
    let cert_err = |e: rcgen::Error| InitError::Certificate(e.to_string());

    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hybrid-scheduler cluster CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let issued = std::time::SystemTime::now();
    (ca_params.not_before, ca_params.not_after) = validity_window(issued, validity.ca_days)?;
    let ca_key = KeyPair::generate().map_err(cert_err)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(cert_err)?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca_not_after = ca_params.not_after;
    let ca_issuer = rcgen::Issuer::new(ca_params, ca_key);
    let (server_cert, server_key, _) =
        issue_server_cert(&ca_issuer, ca_not_after, validity.server_days, issued)?;

    let join_token = hex::encode(os_random::<32>()?);
    write_file(&dir.ca_cert(), ca_cert.pem().as_bytes(), false)?;
    write_file(&dir.ca_key(), ca_key_pem.as_bytes(), true)?;
    write_file(&dir.server_cert(), server_cert.pem().as_bytes(), false)?;
    write_file(
        &dir.server_key(),
        server_key.serialize_pem().as_bytes(),
        true,
    )?;
    write_file(&dir.join_token(), join_token.as_bytes(), true)?;

    let store = Store::create(
        &dir.store(),
        &InitialRecords {
            join_token: join_token.clone(),
            keys: KeyState {
                ring: KeyRing::new(new_token_key(1)?),
                guaranteed: Some(KeyRing::new(new_token_key(1)?)),
                rotated_at_ms: now_ms,
            },
        },
    )?;
    let mut new_apps = Vec::new();
    for (id, quota) in apps {
        new_apps.push(add_app(&store, id, *quota)?);
    }
    let report = InitReport {
        ca_cert: dir.ca_cert(),
        join_token,
        apps: new_apps,
    };
    let json = serde_json::to_vec_pretty(&report).expect("JSON of plain strings");
    write_file(&dir.cluster_json(), &json, true)?;
    Ok(report)
}

/// Makes the data dir 0700 and its secret files ([`DataDir::secret_files`]) 0600 where they
/// are looser (group or others have any access), logging each change; returns what changed.
/// Called by `init`, at every start and by `app add`.
pub fn secure(dir: &DataDir) -> Result<Vec<String>, InitError> {
    use std::os::unix::fs::PermissionsExt;
    let mut changed = Vec::new();
    let targets = std::iter::once((dir.root.clone(), 0o700))
        .chain(dir.secret_files().into_iter().map(|path| (path, 0o600)));
    for (path, wanted) in targets {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(&path)(e)),
        };
        if meta.file_type().is_symlink() {
            continue; // the target is someone else's file; not followed
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 == 0 {
            continue;
        }
        let tightened = mode & !0o077 & 0o7777 | wanted & 0o700;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(tightened))
            .map_err(io_err(&path))?;
        tracing::warn!(
            path = %path.display(),
            was = format!("{mode:o}"),
            now = format!("{tightened:o}"),
            "tightened the permissions of a coordinator secret: only its owner may read it"
        );
        changed.push(format!("{}: {mode:o} -> {tightened:o}", path.display()));
    }
    Ok(changed)
}

/// Ack-eliciting packets a worker may receive before it must acknowledge at once (see
/// [`quic_server_config`]): more than one heartbeat answer's packets.
pub const ACK_ELICITING_THRESHOLD: u32 = 16;

/// The coordinator's QUIC endpoint configuration, the same after a restart on the same data
/// dir: its stateless reset key (RFC 9000 §10.3) is derived (SHA-256, domain-separated) from
/// the server's TLS key, which is as secret and as lasting, and its connection ids are random
/// and not checked against a per-process key. A worker whose connection belongs to the
/// coordinator's previous life then gets a reset it can verify at its next packet and re-joins
/// at once, instead of waiting out the link's give-up limit (10 s at 1-s heartbeats) while its
/// asks are refused. quinn's defaults are random keys per process: a restarted endpoint drops
/// such a packet as one with an invalid connection id, and a reset from it would not verify.
/// Changing the TLS key changes the reset key (workers then wait for the give-up limit once).
pub fn quic_endpoint_config(dir: &DataDir) -> Result<quinn::EndpointConfig, InitError> {
    let key_path = dir.server_key();
    let pem = std::fs::read(&key_path).map_err(|e| InitError::Tls {
        path: key_path.clone(),
        message: e.to_string(),
    })?;
    let derive = |purpose: &[u8]| {
        let mut digest = Sha256::new();
        digest.update(b"hybrid-scheduler coordinator QUIC endpoint v1\0");
        digest.update(purpose);
        digest.update(b"\0");
        digest.update(&pem);
        digest.finalize()
    };
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &derive(b"stateless reset"));
    let mut config = quinn::EndpointConfig::new(Arc::new(reset_key));
    config.cid_generator(|| Box::new(RandomConnectionIds));
    Ok(config)
}

/// Random 8-byte connection ids that any later life of the endpoint accepts as its own (quinn's
/// default hashes them with a key random per process, so a restarted endpoint would drop a
/// packet of its previous life instead of resetting the connection). Without the hash check an
/// endpoint answers stray short-header packets with resets too, which quinn bounds (at most one
/// per 20 ms, each smaller than the packet that caused it).
struct RandomConnectionIds;

impl quinn::ConnectionIdGenerator for RandomConnectionIds {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        use rand::Rng as _;
        let mut id = [0u8; 8];
        rand::rng().fill_bytes(&mut id);
        quinn::ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The rustls/quinn server configuration from the data dir's server certificate (ring only).
pub fn quic_server_config(dir: &DataDir) -> Result<quinn::ServerConfig, InitError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls = |path: PathBuf| {
        move |e: &dyn std::fmt::Display| InitError::Tls {
            path: path.clone(),
            message: e.to_string(),
        }
    };
    let cert_path = dir.server_cert();
    let key_path = dir.server_key();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .map_err(|e| tls(cert_path.clone())(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls(cert_path.clone())(&e))?;
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| tls(key_path.clone())(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let crypto = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls(cert_path.clone())(&e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls(cert_path.clone())(&e))?;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)
        .map_err(|e| tls(cert_path.clone())(&e))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    // Workers keep one long-lived stream; a worker that vanishes is detected by the node
    // timeout, the QUIC idle timeout only reclaims the connection.
    let mut transport = quinn::TransportConfig::default();
    // One stream per worker: a peer cannot make quinn buffer data on streams nobody reads.
    transport.max_concurrent_bidi_streams(1u32.into());
    transport.max_concurrent_uni_streams(0u32.into());
    // What a peer may send ahead of the coordinator's reading, per stream and in all (quinn's
    // connection-wide default is unlimited).
    transport.stream_receive_window((1u32 << 20).into());
    transport.receive_window((2u32 << 20).into());
    // A heartbeat answer is several packets (the round's top-k list is most of it); by default
    // a worker acknowledges every second packet at once, so every answer brought back a few
    // ACK-only packets for the coordinator to receive, decrypt and process (issue 17: per-packet
    // work is most of the coordinator's cost per heartbeat). Workers are asked (QUIC ACK
    // frequency extension, which quinn peers support) to acknowledge after
    // `ACK_ELICITING_THRESHOLD` + 1 packets or their max ACK delay (25 ms), whichever first.
    let mut ack_frequency = quinn::AckFrequencyConfig::default();
    ack_frequency.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD.into());
    transport.ack_frequency_config(Some(ack_frequency));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// Install ring as the process-wide rustls provider (once; later calls are no-ops).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn init_creates_owner_only_secrets_and_secure_tightens_loose_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("data"));
        init(&dir, &[("demo".to_string(), QueueableQuota::default())], 1).unwrap();
        assert_eq!(mode(&dir.root), 0o700);
        for path in dir.secret_files() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
        assert_eq!(mode(&dir.ca_cert()) & 0o600, 0o600);

        // As an older coordinator (or a careless copy) left them.
        std::fs::set_permissions(&dir.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        for path in dir.secret_files() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let changed = secure(&dir).unwrap();
        assert_eq!(changed.len(), 6, "{changed:?}");
        assert_eq!(mode(&dir.root), 0o700);
        for path in dir.secret_files() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
        assert!(
            secure(&dir).unwrap().is_empty(),
            "a second pass changes nothing"
        );
    }

    #[test]
    fn init_into_an_existing_loose_empty_dir_tightens_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("data");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        init(&DataDir::new(&root), &[], 1).unwrap();
        assert_eq!(mode(&root), 0o700);
    }
}
