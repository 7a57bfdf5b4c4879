//! `coordinator issue-app-cert`: a TLS server certificate for a worker's app endpoint, signed by
//! the cluster CA of a data dir. Applications verify the worker with the cluster `ca.pem`
//! (docs/protocol.md §1). Self-contained: it reads `ca.pem` and `ca.key` and writes two files.

use crate::datadir::DataDir;
use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// File names written into the output dir.
pub const APP_CERT_FILE: &str = "app-cert.pem";
pub const APP_KEY_FILE: &str = "app-key.pem";

/// What was issued.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IssuedAppCert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca_cert: PathBuf,
}

/// Issue failures (each names the file or the input at fault).
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("give at least one --dns NAME or --ip ADDR: the names applications connect to")]
    NoNames,
    #[error("invalid node id {0:?}: 1 to 253 bytes")]
    NodeId(String),
    #[error("{path} exists already: remove it to issue a new certificate")]
    Exists { path: PathBuf },
    #[error("reading the cluster CA from {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("certificate generation failed: {0}")]
    Certificate(String),
}

/// Issue a server certificate for node `node_id`'s app endpoint with the given SAN names and
/// addresses, signed by the CA of `data_dir`; writes `out_dir/app-cert.pem` and
/// `out_dir/app-key.pem` (both 0600; `out_dir` is created 0700 if absent). Refuses to
/// overwrite an existing certificate or key.
pub fn issue_app_cert(
    data_dir: &DataDir,
    node_id: &str,
    dns: &[String],
    ips: &[IpAddr],
    out_dir: &Path,
    validity_days: u32,
) -> Result<IssuedAppCert, IssueError> {
    if node_id.is_empty() || node_id.len() > 253 {
        return Err(IssueError::NodeId(node_id.to_string()));
    }
    if dns.is_empty() && ips.is_empty() {
        return Err(IssueError::NoNames);
    }
    let cert_path = out_dir.join(APP_CERT_FILE);
    let key_path = out_dir.join(APP_KEY_FILE);
    for path in [&cert_path, &key_path] {
        if path.exists() {
            return Err(IssueError::Exists { path: path.clone() });
        }
    }
    let ca = |path: &Path| {
        let path = path.to_path_buf();
        move |message: String| IssueError::Ca { path, message }
    };
    let ca_pem = read(&data_dir.ca_cert())?;
    let ca_key_pem = read(&data_dir.ca_key())?;
    let ca_key =
        KeyPair::from_pem(&ca_key_pem).map_err(|e| ca(&data_dir.ca_key())(e.to_string()))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| ca(&data_dir.ca_cert())(e.to_string()))?;

    let cert_err = |e: rcgen::Error| IssueError::Certificate(e.to_string());
    let mut params = CertificateParams::new(dns.to_vec()).map_err(cert_err)?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.distinguished_name.push(DnType::CommonName, node_id);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Strict verifiers (Python 3.13's default context, `openssl verify -x509_strict`) require
    // the authority key identifier.
    params.use_authority_key_identifier_extension = true;
    // A realistic validity, as the coordinator's server certificate: one year by default, never
    // past the CA; renew by issuing again (the worker reads it at start).
    let ca_not_after = crate::datadir::ca_not_after(data_dir, &ca_pem)
        .map_err(|e| ca(&data_dir.ca_cert())(e.to_string()))?;
    (params.not_before, params.not_after) = crate::datadir::validity_under_ca(
        std::time::SystemTime::now(),
        validity_days,
        ca_not_after,
    )
    .map_err(|e| IssueError::Certificate(e.to_string()))?;
    let key = KeyPair::generate().map_err(cert_err)?;
    let cert = params.signed_by(&key, &issuer).map_err(cert_err)?;

    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(out_dir)
            .map_err(io_err(out_dir))?;
    }
    write_secret(&key_path, key.serialize_pem().as_bytes())?;
    write_secret(&cert_path, cert.pem().as_bytes())?;
    Ok(IssuedAppCert {
        cert: cert_path,
        key: key_path,
        ca_cert: data_dir.ca_cert(),
    })
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IssueError + '_ {
    move |source| IssueError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read(path: &Path) -> Result<String, IssueError> {
    std::fs::read_to_string(path).map_err(io_err(path))
}

/// Create `path` (it must not exist) readable by its owner only.
fn write_secret(path: &Path, contents: &[u8]) -> Result<(), IssueError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(contents).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datadir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn issued_cert_chains_to_the_cluster_ca_with_the_given_names_and_owner_only_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("data"));
        datadir::init(&dir, &[], 1).unwrap();
        let out = tmp.path().join("tls");
        let issued = issue_app_cert(
            &dir,
            "node-a",
            &["node-a.example".to_string()],
            &["127.0.0.1".parse().unwrap()],
            &out,
            365,
        )
        .unwrap();
        for path in [&issued.cert, &issued.key] {
            let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
        // A rustls verifier that trusts only the cluster CA accepts it for both names.
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(dir.ca_cert()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let leaf = CertificateDer::from_pem_file(&issued.cert).unwrap();
        for name in ["node-a.example", "127.0.0.1"] {
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &ServerName::try_from(name).unwrap(),
                    &[],
                    UnixTime::now(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &ServerName::try_from("other.example").unwrap(),
                    &[],
                    UnixTime::now(),
                )
                .is_err(),
            "a name not in the SAN is refused"
        );
        // The authority key identifier names the CA's key (strict verifiers need it).
        use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};
        let ca_der = CertificateDer::from_pem_file(dir.ca_cert()).unwrap();
        let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
        let ski = ca
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
                _ => None,
            })
            .expect("the CA has a subject key identifier");
        let (_, cert) = X509Certificate::from_der(&leaf).unwrap();
        // A realistic validity: the 365 days asked for, not "until the CA is replaced".
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let lifetime_days = (cert.validity().not_after.timestamp() - now) / 86_400;
        assert!((364..=365).contains(&lifetime_days), "{lifetime_days} days");
        let aki = cert
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(a) => {
                    a.key_identifier.as_ref().map(|k| k.0.to_vec())
                }
                _ => None,
            })
            .expect("the certificate has an authority key identifier");
        assert_eq!(aki, ski);

        // No silent overwrite; no names at all is refused.
        assert!(matches!(
            issue_app_cert(&dir, "node-a", &["x".into()], &[], &out, 365),
            Err(IssueError::Exists { .. })
        ));
        assert!(matches!(
            issue_app_cert(&dir, "node-a", &[], &[], &tmp.path().join("other"), 365),
            Err(IssueError::NoNames)
        ));
    }
}
