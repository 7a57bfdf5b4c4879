//! Container tokens: HMAC-SHA256-signed grants bound to container, node, app, resources, type,
//! version and expiry (Mercury §6.2: "the authenticity of the allocations made by a distributed
//! scheduler are validated at the target NM using the same token checking algorithm").
//!
//! The coordinator owns the key material and distributes a [`KeyRing`] (current + previous key)
//! to workers; every scheduler signs with the current key, every node accepts either key so a
//! rotation never invalidates grants in flight. Nodes remember (container, version) pairs until
//! their expiry to refuse replays.
//!
//! GUARANTEED tokens are different: only the coordinator may mint them (a worker, or anything
//! that steals a worker's secrets, must not be able to grant GUARANTEED capacity). They are
//! signed with Ed25519 keys whose seeds only the coordinator holds ([`GuaranteedSigner`]);
//! nodes verify them with the public keys ([`PublicKeyRing`]), rotated with the HMAC keys.

use crate::{AppId, ContainerId, ContainerType, NodeId, Resources};
use hmac::{Hmac, Mac};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::{BTreeMap, HashMap};

type HmacSha256 = Hmac<Sha256>;

/// What a token grants. Serialised positionally (msgpack array) for the signature, so the
/// signed bytes do not depend on field names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBody {
    pub container_id: ContainerId,
    pub node_id: NodeId,
    pub app_id: AppId,
    pub resources: Resources,
    pub container_type: ContainerType,
    /// Bumped on promotion; a node accepts only a version above the one it has.
    pub version: u32,
    /// The job the container belongs to. Signed so an application cannot jump the node queue
    /// (ordered by job submit time, Mercury §4.3) by lying after the grant.
    pub job_id: crate::JobId,
    /// Job submit time in ms since the Unix epoch (clamped by the issuer to its own clock).
    pub job_submit_time_ms: u64,
    /// Priority among the app's containers (higher first at equal job submit time).
    pub priority: u32,
    /// The application's runtime estimate, feeding the node's queue-delay estimate (§4.2).
    pub runtime_estimate_ms: Option<u64>,
    /// Expiry in milliseconds since the Unix epoch (the issuer's clock).
    pub expires_at_ms: u64,
    /// Which key signed it.
    pub key_id: u32,
    /// For GUARANTEED grants: the session of the node the grant was made for (its issuer
    /// number, fresh at every join). A node accepts a GUARANTEED grant only from its current
    /// session, so a coordinator restart or a node's re-join voids every grant made before it
    /// that had not started (the guarantor no longer books them). 0 for QUEUEABLE tokens.
    #[serde(default)]
    pub node_epoch: u32,
}

/// A signed grant. Opaque to applications: they pass it back unchanged in `start_container`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerToken {
    pub body: TokenBody,
    /// HMAC-SHA256 of the positional msgpack encoding of `body`, hex-encoded.
    pub signature: String,
}

/// One signing key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenKey {
    pub key_id: u32,
    /// 32 random bytes, hex-encoded.
    pub secret_hex: String,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets into logs.
        f.debug_struct("TokenKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl TokenKey {
    /// A fresh key from 32 bytes of the caller's (cryptographically seeded) randomness.
    pub fn from_bytes(key_id: u32, bytes: [u8; 32]) -> TokenKey {
        TokenKey {
            key_id,
            secret_hex: hex::encode(bytes),
        }
    }

    fn mac(&self) -> Result<HmacSha256, TokenError> {
        let secret =
            hex::decode(&self.secret_hex).map_err(|_| TokenError::BadKeyMaterial(self.key_id))?;
        HmacSha256::new_from_slice(&secret).map_err(|_| TokenError::BadKeyMaterial(self.key_id))
    }
}

/// The current signing key and the previous one (still accepted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRing {
    pub current: TokenKey,
    pub previous: Option<TokenKey>,
}

impl KeyRing {
    pub fn new(current: TokenKey) -> KeyRing {
        KeyRing {
            current,
            previous: None,
        }
    }

    /// Install a new current key; the old current becomes the previous one.
    pub fn rotate(&mut self, next: TokenKey) {
        let old = std::mem::replace(&mut self.current, next);
        self.previous = Some(old);
    }

    fn key(&self, key_id: u32) -> Option<&TokenKey> {
        if self.current.key_id == key_id {
            Some(&self.current)
        } else {
            self.previous.as_ref().filter(|k| k.key_id == key_id)
        }
    }

    /// Sign a body with the current key (the body's `key_id` is set accordingly).
    pub fn sign(&self, mut body: TokenBody) -> Result<ContainerToken, TokenError> {
        body.key_id = self.current.key_id;
        let signature = hex::encode(signature_bytes(&self.current, &body)?);
        Ok(ContainerToken { body, signature })
    }

    /// Check the signature only (no expiry, node or replay check).
    pub fn verify_signature(&self, token: &ContainerToken) -> Result<(), TokenError> {
        let key = self
            .key(token.body.key_id)
            .ok_or(TokenError::UnknownKey(token.body.key_id))?;
        let given = hex::decode(&token.signature).map_err(|_| TokenError::Forged)?;
        let mut mac = key.mac()?;
        mac.update(&body_bytes(&token.body)?);
        mac.verify_slice(&given).map_err(|_| TokenError::Forged)
    }
}

/// One Ed25519 public key for GUARANTEED tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicTokenKey {
    pub key_id: u32,
    /// The 32-byte Ed25519 public key, hex-encoded.
    pub public_hex: String,
}

/// The public half of the coordinator's GUARANTEED signing keys (current + previous): what
/// nodes need to verify GUARANTEED tokens, and nothing that lets them mint one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicKeyRing {
    pub current: PublicTokenKey,
    pub previous: Option<PublicTokenKey>,
}

impl PublicKeyRing {
    fn key(&self, key_id: u32) -> Option<&PublicTokenKey> {
        if self.current.key_id == key_id {
            Some(&self.current)
        } else {
            self.previous.as_ref().filter(|k| k.key_id == key_id)
        }
    }

    pub fn verify_signature(&self, token: &ContainerToken) -> Result<(), TokenError> {
        let key = self
            .key(token.body.key_id)
            .ok_or(TokenError::UnknownKey(token.body.key_id))?;
        let public =
            hex::decode(&key.public_hex).map_err(|_| TokenError::BadKeyMaterial(key.key_id))?;
        let given = hex::decode(&token.signature).map_err(|_| TokenError::Forged)?;
        UnparsedPublicKey::new(&ED25519, public)
            .verify(&body_bytes(&token.body)?, &given)
            .map_err(|_| TokenError::Forged)
    }
}

/// The coordinator's GUARANTEED token signer: an Ed25519 key pair per generation, from the
/// 32-byte seeds of a [`KeyRing`] that never leaves the coordinator.
pub struct GuaranteedSigner {
    current: (u32, Ed25519KeyPair),
    previous: Option<(u32, Ed25519KeyPair)>,
}

impl std::fmt::Debug for GuaranteedSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuaranteedSigner")
            .field("key_id", &self.current.0)
            .finish_non_exhaustive()
    }
}

impl GuaranteedSigner {
    pub fn new(seeds: &KeyRing) -> Result<GuaranteedSigner, TokenError> {
        let pair = |k: &TokenKey| -> Result<(u32, Ed25519KeyPair), TokenError> {
            let seed =
                hex::decode(&k.secret_hex).map_err(|_| TokenError::BadKeyMaterial(k.key_id))?;
            Ed25519KeyPair::from_seed_unchecked(&seed)
                .map(|p| (k.key_id, p))
                .map_err(|_| TokenError::BadKeyMaterial(k.key_id))
        };
        Ok(GuaranteedSigner {
            current: pair(&seeds.current)?,
            previous: seeds.previous.as_ref().map(pair).transpose()?,
        })
    }

    /// The public keys nodes verify GUARANTEED tokens with.
    pub fn public_ring(&self) -> PublicKeyRing {
        let public = |(key_id, pair): &(u32, Ed25519KeyPair)| PublicTokenKey {
            key_id: *key_id,
            public_hex: hex::encode(pair.public_key().as_ref()),
        };
        PublicKeyRing {
            current: public(&self.current),
            previous: self.previous.as_ref().map(public),
        }
    }

    /// Sign a GUARANTEED token body with the current key.
    pub fn sign(&self, mut body: TokenBody) -> Result<ContainerToken, TokenError> {
        if body.container_type != ContainerType::Guaranteed {
            return Err(TokenError::Encoding(
                "the GUARANTEED signer signs GUARANTEED tokens only".into(),
            ));
        }
        body.key_id = self.current.0;
        let signature = hex::encode(self.current.1.sign(&body_bytes(&body)?).as_ref());
        Ok(ContainerToken { body, signature })
    }
}

fn body_bytes(body: &TokenBody) -> Result<Vec<u8>, TokenError> {
    rmp_serde::to_vec(body).map_err(|e| TokenError::Encoding(e.to_string()))
}

fn signature_bytes(key: &TokenKey, body: &TokenBody) -> Result<Vec<u8>, TokenError> {
    let mut mac = key.mac()?;
    mac.update(&body_bytes(body)?);
    Ok(mac.finalize().into_bytes().to_vec())
}

/// Why a node refused a token. None of these is retryable with the same token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("container token signature does not verify (forged or corrupted)")]
    Forged,
    #[error("container token was signed with unknown key {0} (older than the previous rotation?)")]
    UnknownKey(u32),
    #[error("container token expired at {expired_at_ms} ms, now is {now_ms} ms")]
    Expired { expired_at_ms: u64, now_ms: u64 },
    #[error("container token is for node {token_node}, this is node {this_node}")]
    WrongNode {
        token_node: String,
        this_node: String,
    },
    #[error("container token for {container} version {version} was already used")]
    Replayed {
        container: ContainerId,
        version: u32,
    },
    #[error("container token belongs to app {token_app}, not to the requesting app {requester}")]
    WrongApp {
        token_app: String,
        requester: String,
    },
    #[error(
        "GUARANTEED grant for {container} was made for an earlier session of this node (grant \
         session {grant_epoch}, current session {node_epoch}): it was voided by a coordinator \
         restart or this node's re-join; ask again"
    )]
    StaleGrant {
        container: ContainerId,
        grant_epoch: u32,
        node_epoch: u32,
    },
    #[error("grant for {0} was revoked (released, or its node was lost); ask again")]
    Revoked(ContainerId),
    #[error("key {0} has malformed secret material")]
    BadKeyMaterial(u32),
    #[error("could not encode token body: {0}")]
    Encoding(String),
}

/// A node's token checker: signature, node binding, app binding, expiry, replay.
#[derive(Debug, Clone)]
pub struct TokenVerifier {
    node_id: NodeId,
    keys: Option<KeyRing>,
    /// Public keys for GUARANTEED tokens (only the coordinator can sign those).
    guaranteed_keys: Option<PublicKeyRing>,
    /// (container, version) -> expiry ms; purged once expired (an expired token fails anyway).
    used: HashMap<(ContainerId, u32), u64>,
    by_expiry: BTreeMap<u64, Vec<(ContainerId, u32)>>,
    /// The node's current session (issuer number from its last join); `None` before a join.
    node_epoch: Option<u32>,
    /// Grants revoked before they started, until their token expires (then the expiry refuses
    /// them anyway), so the set is bounded by the grants of one token lifetime.
    revoked: HashMap<ContainerId, u64>,
    revoked_by_expiry: BTreeMap<u64, Vec<ContainerId>>,
}

impl TokenVerifier {
    pub fn new(node_id: NodeId) -> TokenVerifier {
        TokenVerifier {
            node_id,
            keys: None,
            guaranteed_keys: None,
            used: HashMap::new(),
            by_expiry: BTreeMap::new(),
            node_epoch: None,
            revoked: HashMap::new(),
            revoked_by_expiry: BTreeMap::new(),
        }
    }

    /// The node joined under session `epoch`: GUARANTEED grants of other sessions are void.
    pub fn set_node_epoch(&mut self, epoch: u32) {
        self.node_epoch = Some(epoch);
    }

    /// The node's current session, if it has joined.
    pub fn node_epoch(&self) -> Option<u32> {
        self.node_epoch
    }

    /// Refuse the grant for `id` from now until `until_ms` (its token's expiry).
    pub fn revoke(&mut self, id: ContainerId, until_ms: u64, now_ms: u64) {
        self.purge(now_ms);
        if until_ms <= now_ms {
            return; // expired already: the expiry check refuses it
        }
        if self.revoked.insert(id, until_ms).is_none() {
            self.revoked_by_expiry.entry(until_ms).or_default().push(id);
        }
    }

    /// Grants currently revoked (bounded by one token lifetime of grants).
    pub fn revoked_count(&self) -> usize {
        self.revoked.len()
    }

    pub fn set_keys(&mut self, keys: KeyRing) {
        self.keys = Some(keys);
    }

    pub fn keys(&self) -> Option<&KeyRing> {
        self.keys.as_ref()
    }

    /// The coordinator's public keys for GUARANTEED tokens.
    pub fn set_guaranteed_keys(&mut self, keys: PublicKeyRing) {
        self.guaranteed_keys = Some(keys);
    }

    /// Check a token's signature: GUARANTEED tokens against the coordinator's public keys (no
    /// worker can mint one), QUEUEABLE ones against the cluster's HMAC keys.
    pub fn verify_signature(&self, token: &ContainerToken) -> Result<(), TokenError> {
        match token.body.container_type {
            ContainerType::Guaranteed => self
                .guaranteed_keys
                .as_ref()
                .ok_or(TokenError::UnknownKey(token.body.key_id))?
                .verify_signature(token),
            ContainerType::Queueable => self
                .keys
                .as_ref()
                .ok_or(TokenError::UnknownKey(token.body.key_id))?
                .verify_signature(token),
        }
    }

    /// Verify and consume a token presented by `app` at wall-clock `now_ms`.
    pub fn check_and_consume(
        &mut self,
        token: &ContainerToken,
        app: &AppId,
        now_ms: u64,
    ) -> Result<(), TokenError> {
        self.check(token, app, now_ms)?;
        self.consume(token);
        Ok(())
    }

    /// Verify without consuming.
    pub fn check(
        &mut self,
        token: &ContainerToken,
        app: &AppId,
        now_ms: u64,
    ) -> Result<(), TokenError> {
        self.purge(now_ms);
        self.verify_signature(token)?;
        let body = &token.body;
        if body.node_id != self.node_id {
            return Err(TokenError::WrongNode {
                token_node: body.node_id.to_string(),
                this_node: self.node_id.to_string(),
            });
        }
        if &body.app_id != app {
            return Err(TokenError::WrongApp {
                token_app: body.app_id.to_string(),
                requester: app.to_string(),
            });
        }
        if body.expires_at_ms <= now_ms {
            return Err(TokenError::Expired {
                expired_at_ms: body.expires_at_ms,
                now_ms,
            });
        }
        if self.revoked.contains_key(&body.container_id) {
            return Err(TokenError::Revoked(body.container_id));
        }
        if body.container_type == ContainerType::Guaranteed
            && self.node_epoch != Some(body.node_epoch)
        {
            return Err(TokenError::StaleGrant {
                container: body.container_id,
                grant_epoch: body.node_epoch,
                node_epoch: self.node_epoch.unwrap_or(0),
            });
        }
        if self.used.contains_key(&(body.container_id, body.version)) {
            return Err(TokenError::Replayed {
                container: body.container_id,
                version: body.version,
            });
        }
        Ok(())
    }

    fn consume(&mut self, token: &ContainerToken) {
        let key = (token.body.container_id, token.body.version);
        self.used.insert(key, token.body.expires_at_ms);
        self.by_expiry
            .entry(token.body.expires_at_ms)
            .or_default()
            .push(key);
    }

    fn purge(&mut self, now_ms: u64) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if *entry.key() > now_ms {
                break;
            }
            for k in entry.remove() {
                self.used.remove(&k);
            }
        }
        while let Some(entry) = self.revoked_by_expiry.first_entry() {
            if *entry.key() > now_ms {
                break;
            }
            for id in entry.remove() {
                self.revoked.remove(&id);
            }
        }
    }

    /// How many used tokens are remembered (bounded by tokens issued within one expiry window).
    pub fn remembered(&self) -> usize {
        self.used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(node: &str) -> TokenBody {
        TokenBody {
            container_id: ContainerId::new(1, 1),
            node_id: NodeId::from(node),
            app_id: AppId::from("app"),
            resources: Resources::new(1000, 512),
            container_type: ContainerType::Queueable,
            version: 0,
            job_id: crate::JobId::from("job"),
            job_submit_time_ms: 1,
            priority: 0,
            runtime_estimate_ms: Some(1000),
            expires_at_ms: 10_000,
            key_id: 0,
            node_epoch: 0,
        }
    }

    fn ring() -> KeyRing {
        KeyRing::new(TokenKey::from_bytes(1, [7; 32]))
    }

    #[test]
    fn valid_token_is_accepted_once() {
        let ring = ring();
        let token = ring.sign(body("n1")).unwrap();
        let mut v = TokenVerifier::new(NodeId::from("n1"));
        v.set_keys(ring);
        v.check_and_consume(&token, &AppId::from("app"), 5_000)
            .unwrap();
        assert!(matches!(
            v.check_and_consume(&token, &AppId::from("app"), 5_001),
            Err(TokenError::Replayed { .. })
        ));
        // After expiry the replay entry is purged, and the token fails as expired instead.
        assert!(matches!(
            v.check_and_consume(&token, &AppId::from("app"), 10_000),
            Err(TokenError::Expired { .. })
        ));
        assert_eq!(v.remembered(), 0);
    }

    #[test]
    fn forged_wrong_node_wrong_app_and_unknown_key_are_refused() {
        let ring = ring();
        let mut token = ring.sign(body("n1")).unwrap();
        let mut v = TokenVerifier::new(NodeId::from("n1"));
        v.set_keys(ring.clone());
        let app = AppId::from("app");
        let mut tampered = token.clone();
        tampered.body.resources.memory_mib = 1 << 20;
        assert_eq!(v.check(&tampered, &app, 1), Err(TokenError::Forged));
        let other_key = KeyRing::new(TokenKey::from_bytes(1, [9; 32]))
            .sign(body("n1"))
            .unwrap();
        assert_eq!(v.check(&other_key, &app, 1), Err(TokenError::Forged));
        let wrong_node = ring.sign(body("n2")).unwrap();
        assert!(matches!(
            v.check(&wrong_node, &app, 1),
            Err(TokenError::WrongNode { .. })
        ));
        assert!(matches!(
            v.check(&token, &AppId::from("mallory"), 1),
            Err(TokenError::WrongApp { .. })
        ));
        token.body.key_id = 42;
        assert_eq!(v.check(&token, &app, 1), Err(TokenError::UnknownKey(42)));
    }

    #[test]
    fn rotation_keeps_previous_key_valid_for_one_generation() {
        let mut ring = ring();
        let old = ring.sign(body("n1")).unwrap();
        ring.rotate(TokenKey::from_bytes(2, [8; 32]));
        let new = ring.sign(body("n1")).unwrap();
        assert_eq!(new.body.key_id, 2);
        ring.verify_signature(&old).unwrap();
        ring.verify_signature(&new).unwrap();
        ring.rotate(TokenKey::from_bytes(3, [6; 32]));
        assert_eq!(ring.verify_signature(&old), Err(TokenError::UnknownKey(1)));
    }

    fn guaranteed_signer() -> GuaranteedSigner {
        GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [5; 32]))).unwrap()
    }

    #[test]
    fn only_the_coordinators_ed25519_key_signs_guaranteed_tokens() {
        let ring = ring();
        let signer = guaranteed_signer();
        let mut b = body("n1");
        b.container_type = ContainerType::Guaranteed;
        let app = AppId::from("app");
        let mut v = TokenVerifier::new(NodeId::from("n1"));
        v.set_keys(ring.clone());
        v.set_node_epoch(0);
        // What a worker (or a thief of its secrets) could do: sign with the HMAC keys.
        let minted_by_worker = ring.sign(b.clone()).unwrap();
        assert_eq!(
            v.check(&minted_by_worker, &app, 1),
            Err(TokenError::UnknownKey(1)),
            "no GUARANTEED public keys yet"
        );
        v.set_guaranteed_keys(signer.public_ring());
        assert_eq!(v.check(&minted_by_worker, &app, 1), Err(TokenError::Forged));
        let genuine = signer.sign(b.clone()).unwrap();
        v.check(&genuine, &app, 1).unwrap();
        let mut tampered = genuine.clone();
        tampered.body.resources = Resources::new(4000, 4096);
        assert_eq!(v.check(&tampered, &app, 1), Err(TokenError::Forged));
        // The signer refuses QUEUEABLE bodies (they are the workers' to sign).
        assert!(signer.sign(body("n1")).is_err());
        // Rotation: the previous public key keeps verifying, an older one does not.
        let mut seeds = KeyRing::new(TokenKey::from_bytes(1, [5; 32]));
        seeds.rotate(TokenKey::from_bytes(2, [6; 32]));
        let rotated = GuaranteedSigner::new(&seeds).unwrap();
        assert_eq!(
            rotated.public_ring().previous,
            Some(signer.public_ring().current)
        );
        v.set_guaranteed_keys(rotated.public_ring());
        v.check(&genuine, &app, 1).unwrap();
        v.check(&rotated.sign(b).unwrap(), &app, 1).unwrap();
    }

    #[test]
    fn guaranteed_grants_of_another_node_session_are_void() {
        let ring = ring();
        let signer = guaranteed_signer();
        let mut b = body("n1");
        b.container_type = ContainerType::Guaranteed;
        b.node_epoch = 7;
        let token = signer.sign(b.clone()).unwrap();
        let app = AppId::from("app");
        let mut v = TokenVerifier::new(NodeId::from("n1"));
        v.set_keys(ring.clone());
        v.set_guaranteed_keys(signer.public_ring());
        // Before any join there is no session: refused.
        assert!(matches!(
            v.check(&token, &app, 1),
            Err(TokenError::StaleGrant {
                grant_epoch: 7,
                node_epoch: 0,
                ..
            })
        ));
        v.set_node_epoch(8);
        assert!(matches!(
            v.check(&token, &app, 1),
            Err(TokenError::StaleGrant {
                grant_epoch: 7,
                node_epoch: 8,
                ..
            })
        ));
        v.set_node_epoch(7);
        v.check(&token, &app, 1).unwrap();
        // QUEUEABLE tokens are not bound to the session (they promise no capacity).
        let q = ring.sign(body("n1")).unwrap();
        v.set_node_epoch(9);
        v.check(&q, &app, 1).unwrap();
    }

    #[test]
    fn a_revoked_grant_is_refused_until_its_expiry_then_forgotten() {
        let ring = ring();
        let token = ring.sign(body("n1")).unwrap();
        let app = AppId::from("app");
        let mut v = TokenVerifier::new(NodeId::from("n1"));
        v.set_keys(ring);
        v.revoke(token.body.container_id, token.body.expires_at_ms, 1_000);
        assert_eq!(
            v.check(&token, &app, 2_000),
            Err(TokenError::Revoked(token.body.container_id))
        );
        // A revocation for an expired grant is not even stored.
        v.revoke(ContainerId::new(1, 99), 500, 1_000);
        assert_eq!(v.revoked_count(), 1);
        // At the expiry the token is refused as expired and the revocation is dropped.
        assert!(matches!(
            v.check(&token, &app, 10_000),
            Err(TokenError::Expired { .. })
        ));
        assert_eq!(v.revoked_count(), 0);
    }
}
