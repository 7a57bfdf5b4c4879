//! Container tokens: signed grants bound to container, node, app, resources, type, version and
//! expiry (Mercury §6.2: "the authenticity of the allocations made by a distributed scheduler are
//! validated at the target NM using the same token checking algorithm"). Nodes remember
//! (container, version) pairs until their expiry to refuse replays.
//!
//! No worker holds a key that lets it mint a grant in another worker's name (issue 11):
//!
//! - **QUEUEABLE tokens** are HMAC-SHA256 under a key per (issuer, node) pair. At a node's join
//!   the coordinator derives the node session's secret `K_N` from its master key
//!   ([`NodeSessionSecret::derive`]) and gives it to that node alone; the key of issuer `I` for
//!   node `N` is `HMAC(K_N, I)` ([`NodeSessionSecret::issuer_key`]), sent to issuer `I` only, for
//!   every node in its directory. A node derives the key of the issuer a token names (the
//!   container id's prefix) from its own `K_N`, so it needs nothing else. A worker's secrets thus
//!   let a thief mint QUEUEABLE grants in that worker's own name (any node) or for that worker's
//!   own node (any issuer), never in another worker's name for another node. The keys live as
//!   long as the sessions they bind: a node's re-join gives it a new `K_N` (and its issuers new
//!   keys with the new directory), so QUEUEABLE grants made for its previous session are refused
//!   as stale, like GUARANTEED ones. Signing stays one HMAC on the microsecond allocation path.
//! - **GUARANTEED tokens** are minted by the coordinator alone: Ed25519 keys whose seeds only the
//!   coordinator holds ([`GuaranteedSigner`]); nodes verify them with the public keys
//!   ([`PublicKeyRing`]), rotated on the coordinator's schedule ([`RotationSchedule`]) with the
//!   previous key still accepted so grants in flight survive a rotation.

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
    /// that had not started (the guarantor no longer books them). QUEUEABLE grants carry it too:
    /// their key is the node session's ([`NodeSessionSecret`]), so they die with the session.
    #[serde(default)]
    pub node_epoch: u32,
    /// For GUARANTEED grants booked other than as plain, unshaped core work: how the guarantor
    /// booked it (its reservation, its Pace role and shaping permission, its request). Signed
    /// with the rest, so a worker or an application cannot change how a re-adopted container is
    /// booked after a coordinator restart. Left out of the encoding when absent (a trailing field,
    /// as `times_returned` after it), so the signed bytes of every other token are those of a
    /// body without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booking: Option<GrantBooking>,
    /// For QUEUEABLE grants: how many times a node has shed or returned the container this
    /// grant re-places (the application named it in `allocate.replaces_shed`; the granting
    /// scheduler counts from its own record of that container). A node returns a queued
    /// container held back by GUARANTEED work only while the count is below
    /// [`crate::node::MAX_RETURNS`] and only past a bound doubled per return
    /// ([`crate::node::NodeRuntime::shed_held_by_guaranteed`]), so returned work cannot bounce
    /// between nodes for ever. Left out of the encoding when zero, so the signed bytes of every
    /// other token are those of a body without it.
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub times_returned: u8,
}

fn is_zero_u8(value: &u8) -> bool {
    *value == 0
}

/// How the guarantor booked a GUARANTEED grant, carried in its signed token so that it can be
/// booked again exactly as it was when its node reports it running after a coordinator restart
/// (issues 12 and 14).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantBooking {
    /// The reservation whose allocation the container counts against (Morpheus §4, §6).
    #[serde(default)]
    pub reservation_id: Option<String>,
    /// Pace §2: core or elastic.
    #[serde(default)]
    pub role: crate::shaper::ComponentRole,
    /// The application let the shaper resize the container (Pace §3.2).
    #[serde(default)]
    pub allow_shaping: bool,
    /// What the application asked for; the token's `resources`, the node's booking and the
    /// status a node reports may be a shaped size at or below it.
    pub requested: Resources,
}

/// A signed grant. Opaque to applications: they pass it back unchanged in `start_container`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerToken {
    pub body: TokenBody,
    /// Of the positional msgpack encoding of `body`, hex-encoded: HMAC-SHA256 under the
    /// issuer's key for the node (QUEUEABLE), or the coordinator's Ed25519 signature
    /// (GUARANTEED).
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
        Ok(hmac_of(&decode_secret(&self.secret_hex, self.key_id)?))
    }
}

/// A current key and the previous one: the coordinator's master key for QUEUEABLE node session
/// secrets, and the seeds of its GUARANTEED signing keys. Never leaves the coordinator.
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
}

/// How long after a failed rotation (its key could not be saved) the next attempt waits, at most.
pub const ROTATION_RETRY_MS: u64 = 60_000;

/// When the coordinator rotates its keys: every `period` since the last rotation, which is stored
/// with the keys so a restart keeps the rhythm. Decided here, not in the actor, so the rule is
/// tested without actix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RotationSchedule {
    period_ms: u64,
    rotated_at_ms: u64,
    /// After a failure: no attempt before this (one error line a minute, not one a tick).
    retry_at_ms: Option<u64>,
}

impl RotationSchedule {
    pub fn new(period_ms: u64, rotated_at_ms: u64) -> RotationSchedule {
        RotationSchedule {
            period_ms: period_ms.max(1),
            rotated_at_ms,
            retry_at_ms: None,
        }
    }

    /// Whether the keys should rotate at `now_ms`. A last rotation stamped more than a period in
    /// the future (the clock was set back, or the data dir came from another machine) is not
    /// believed: waiting for the clock to catch up could keep one key for years.
    pub fn due(&self, now_ms: u64) -> bool {
        if self.retry_at_ms.is_some_and(|r| now_ms < r) {
            return false;
        }
        self.rotated_at_ms > now_ms.saturating_add(self.period_ms)
            || now_ms.saturating_sub(self.rotated_at_ms) >= self.period_ms
    }

    /// The keys rotated at `now_ms`.
    pub fn rotated(&mut self, now_ms: u64) {
        self.rotated_at_ms = now_ms;
        self.retry_at_ms = None;
    }

    /// A rotation failed at `now_ms`: the old keys stay, and the next try waits.
    pub fn failed(&mut self, now_ms: u64) {
        self.retry_at_ms = Some(now_ms.saturating_add(ROTATION_RETRY_MS.min(self.period_ms)));
    }

    /// The id of the key after `current` (ids are never 0; they wrap after u32::MAX).
    pub fn next_key_id(current: u32) -> u32 {
        current.wrapping_add(1).max(1)
    }
}

/// Domain-separation labels of the QUEUEABLE key derivations.
const NODE_SESSION_LABEL: &[u8] = b"mercury-node-session-v1\0";
const ISSUER_KEY_LABEL: &[u8] = b"mercury-queueable-issuer-v1\0";

/// HMAC-SHA256 keyed with 32 bytes: zero-padded to the 64-byte block, as HMAC pads any key
/// shorter than its block (RFC 2104 §2), so no length error is possible.
fn hmac_of(key: &[u8; 32]) -> HmacSha256 {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    <HmacSha256 as hmac::digest::KeyInit>::new(&block.into())
}

fn decode_secret(hex_str: &str, key_id: u32) -> Result<[u8; 32], TokenError> {
    let bytes = hex::decode(hex_str).map_err(|_| TokenError::BadKeyMaterial(key_id))?;
    bytes
        .try_into()
        .map_err(|_| TokenError::BadKeyMaterial(key_id))
}

/// A node session's secret `K_N` for QUEUEABLE tokens: given to that node alone at its join.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSessionSecret {
    /// The session it belongs to (the node's issuer number at the join).
    pub node_epoch: u32,
    /// 32 bytes, hex-encoded.
    pub secret_hex: String,
}

impl std::fmt::Debug for NodeSessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSessionSecret")
            .field("node_epoch", &self.node_epoch)
            .finish_non_exhaustive()
    }
}

impl NodeSessionSecret {
    /// `K_N = HMAC(master, label ‖ node ‖ 0 ‖ epoch)`: unpredictable without the coordinator's
    /// master key, and distinct for every session since epochs are never reused.
    pub fn derive(
        master: &TokenKey,
        node: &NodeId,
        node_epoch: u32,
    ) -> Result<NodeSessionSecret, TokenError> {
        let mut mac = master.mac()?;
        mac.update(NODE_SESSION_LABEL);
        mac.update(node.as_str().as_bytes());
        mac.update(&[0]);
        mac.update(&node_epoch.to_be_bytes());
        Ok(NodeSessionSecret {
            node_epoch,
            secret_hex: hex::encode(mac.finalize().into_bytes()),
        })
    }

    fn bytes(&self) -> Result<[u8; 32], TokenError> {
        decode_secret(&self.secret_hex, self.node_epoch)
    }

    /// A secret from 32 bytes (tests and tools; the coordinator derives them).
    pub fn from_bytes(node_epoch: u32, bytes: [u8; 32]) -> NodeSessionSecret {
        NodeSessionSecret {
            node_epoch,
            secret_hex: hex::encode(bytes),
        }
    }

    /// The key issuer `issuer` signs QUEUEABLE tokens for `node` (this secret's node) with.
    pub fn issuer_key(&self, node: &NodeId, issuer: u32) -> Result<IssuerNodeKey, TokenError> {
        Ok(IssuerNodeKey {
            node_id: node.clone(),
            node_epoch: self.node_epoch,
            secret: issuer_key_bytes(&self.bytes()?, issuer),
        })
    }

    /// This secret keyed once for `node`, to derive many issuers' keys: the coordinator sends
    /// one per (issuer, node session), O(nodes) per joining node, so the secret is not decoded
    /// and the HMAC not re-keyed for each.
    pub fn issuer_keys_for(&self, node: &NodeId) -> Result<IssuerKeyDeriver, TokenError> {
        let mut keyed = hmac_of(&self.bytes()?);
        keyed.update(ISSUER_KEY_LABEL);
        Ok(IssuerKeyDeriver {
            node_id: node.clone(),
            node_epoch: self.node_epoch,
            keyed,
        })
    }
}

/// A node session's secret prepared to derive issuers' keys ([`NodeSessionSecret::issuer_keys_for`]);
/// gives the same keys as [`NodeSessionSecret::issuer_key`].
#[derive(Clone)]
pub struct IssuerKeyDeriver {
    node_id: NodeId,
    node_epoch: u32,
    /// HMAC keyed with `K_N`, the label already absorbed.
    keyed: HmacSha256,
}

impl std::fmt::Debug for IssuerKeyDeriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKeyDeriver")
            .field("node_id", &self.node_id)
            .field("node_epoch", &self.node_epoch)
            .finish_non_exhaustive()
    }
}

impl IssuerKeyDeriver {
    /// The node session it derives keys for: the node and its session's epoch.
    pub fn session(&self) -> (&NodeId, u32) {
        (&self.node_id, self.node_epoch)
    }

    /// Issuer `issuer`'s key for this node session: `HMAC(K_N, label ‖ issuer)`.
    pub fn issuer_key(&self, issuer: u32) -> IssuerNodeKey {
        let mut mac = self.keyed.clone();
        mac.update(&issuer.to_be_bytes());
        IssuerNodeKey {
            node_id: self.node_id.clone(),
            node_epoch: self.node_epoch,
            secret: mac.finalize().into_bytes().into(),
        }
    }
}

/// `HMAC(K_N, label ‖ issuer)`.
fn issuer_key_bytes(node_secret: &[u8; 32], issuer: u32) -> [u8; 32] {
    let mut mac = hmac_of(node_secret);
    mac.update(ISSUER_KEY_LABEL);
    mac.update(&issuer.to_be_bytes());
    mac.finalize().into_bytes().into()
}

/// An issuer's key for QUEUEABLE tokens to one node session (sent to that issuer only). On the
/// wire only as part of a list, in columns with the secrets as raw bytes
/// (`protocol::cluster::issuer_key_columns`, cluster protocol 7).
#[derive(Clone, PartialEq, Eq)]
pub struct IssuerNodeKey {
    pub node_id: NodeId,
    /// The node session the key is for; tokens signed with it carry it as their `node_epoch`.
    pub node_epoch: u32,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for IssuerNodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerNodeKey")
            .field("node_id", &self.node_id)
            .field("node_epoch", &self.node_epoch)
            .finish_non_exhaustive()
    }
}

/// A distributed scheduler's QUEUEABLE signer: its keys for every node of its directory, with the
/// HMAC state keyed once per node so a signature costs one MAC of the body.
#[derive(Clone)]
pub struct QueueableSigner {
    issuer: u32,
    keys: HashMap<NodeId, (u32, HmacSha256), crate::ids::NameBuildHasher>,
}

impl std::fmt::Debug for QueueableSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueableSigner")
            .field("issuer", &self.issuer)
            .field("nodes", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl QueueableSigner {
    /// The signer of issuer `issuer` with its keys for the nodes of its directory.
    pub fn new(issuer: u32, keys: &[IssuerNodeKey]) -> QueueableSigner {
        let mut signer = QueueableSigner {
            issuer,
            keys: HashMap::default(),
        };
        signer.replace_keys(keys);
        signer
    }

    /// A new directory's keys replace the old ones (a node that left, or re-joined under a new
    /// session, loses its old key).
    pub fn replace_keys(&mut self, keys: &[IssuerNodeKey]) {
        self.keys = HashMap::with_capacity_and_hasher(keys.len(), Default::default());
        self.patch_keys(keys, &[]);
    }

    /// A directory delta's keys: those of its joined nodes replace or extend the old ones (a
    /// re-joined node's new session voids the old key), and the nodes that `left` lose theirs.
    pub fn patch_keys(&mut self, joined: &[IssuerNodeKey], left: &[NodeId]) {
        for node in left {
            self.keys.remove(node);
        }
        self.keys.extend(
            joined
                .iter()
                .map(|k| (k.node_id.clone(), (k.node_epoch, hmac_of(&k.secret)))),
        );
    }

    /// The node session this signer holds a key for at `node` (its `node_epoch`), if any.
    pub fn node_epoch(&self, node: &NodeId) -> Option<u32> {
        self.keys.get(node).map(|(epoch, _)| *epoch)
    }

    pub fn issuer(&self) -> u32 {
        self.issuer
    }

    /// Nodes it holds a key for.
    pub fn nodes(&self) -> usize {
        self.keys.len()
    }

    /// Sign a QUEUEABLE body for its node (sets `node_epoch` to the node's session, `key_id`
    /// to 0). Refuses GUARANTEED bodies and container ids of another issuer.
    pub fn sign(&self, mut body: TokenBody) -> Result<ContainerToken, TokenError> {
        if body.container_type != ContainerType::Queueable {
            return Err(TokenError::Encoding(
                "a worker signs QUEUEABLE tokens only".into(),
            ));
        }
        if body.container_id.issuer() != self.issuer {
            return Err(TokenError::Encoding(format!(
                "container {} is not of this scheduler's issuer {}",
                body.container_id, self.issuer
            )));
        }
        let (epoch, keyed) = self
            .keys
            .get(&body.node_id)
            .ok_or_else(|| TokenError::NoKeyForNode(body.node_id.to_string()))?;
        body.node_epoch = *epoch;
        body.key_id = 0;
        let mut mac = keyed.clone();
        mac.update(&body_bytes(&body)?);
        let signature = hex::encode(mac.finalize().into_bytes());
        Ok(ContainerToken { body, signature })
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
        "container token for {container} was made for another session of this node (grant \
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
    #[error(
        "this scheduler holds no token key for node {0} (not in its directory yet, or it left)"
    )]
    NoKeyForNode(String),
    #[error("key {0} has malformed secret material")]
    BadKeyMaterial(u32),
    #[error("could not encode token body: {0}")]
    Encoding(String),
}

/// A node's token checker: signature, node binding, app binding, expiry, replay.
#[derive(Debug, Clone)]
pub struct TokenVerifier {
    node_id: NodeId,
    /// This node session's secret `K_N` (QUEUEABLE tokens), from its last join.
    node_secret: Option<[u8; 32]>,
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
            node_secret: None,
            guaranteed_keys: None,
            used: HashMap::new(),
            by_expiry: BTreeMap::new(),
            node_epoch: None,
            revoked: HashMap::new(),
            revoked_by_expiry: BTreeMap::new(),
        }
    }

    /// The node joined: its session (grants of other sessions are void) and the session's
    /// secret for QUEUEABLE tokens. On malformed material nothing changes.
    pub fn set_node_session(&mut self, secret: &NodeSessionSecret) -> Result<(), TokenError> {
        self.node_secret = Some(secret.bytes()?);
        self.node_epoch = Some(secret.node_epoch);
        Ok(())
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

    /// The coordinator's public keys for GUARANTEED tokens.
    pub fn set_guaranteed_keys(&mut self, keys: PublicKeyRing) {
        self.guaranteed_keys = Some(keys);
    }

    /// Check a token's signature: GUARANTEED tokens against the coordinator's public keys (no
    /// worker can mint one), QUEUEABLE ones against the key of the issuer the container id names
    /// for this node's session (derived from `K_N`; a token of another session is stale).
    pub fn verify_signature(&self, token: &ContainerToken) -> Result<(), TokenError> {
        match token.body.container_type {
            ContainerType::Guaranteed => self
                .guaranteed_keys
                .as_ref()
                .ok_or(TokenError::UnknownKey(token.body.key_id))?
                .verify_signature(token),
            ContainerType::Queueable => {
                let body = &token.body;
                let (Some(secret), Some(epoch)) = (self.node_secret.as_ref(), self.node_epoch)
                else {
                    return Err(self.stale(body));
                };
                if body.node_epoch != epoch {
                    return Err(self.stale(body));
                }
                let given = hex::decode(&token.signature).map_err(|_| TokenError::Forged)?;
                let mut mac = hmac_of(&issuer_key_bytes(secret, body.container_id.issuer()));
                mac.update(&body_bytes(body)?);
                mac.verify_slice(&given).map_err(|_| TokenError::Forged)
            }
        }
    }

    fn stale(&self, body: &TokenBody) -> TokenError {
        TokenError::StaleGrant {
            container: body.container_id,
            grant_epoch: body.node_epoch,
            node_epoch: self.node_epoch.unwrap_or(0),
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
        let body = &token.body;
        // The node first: a grant for another node is named as such, not as a bad signature.
        if body.node_id != self.node_id {
            return Err(TokenError::WrongNode {
                token_node: body.node_id.to_string(),
                this_node: self.node_id.to_string(),
            });
        }
        self.verify_signature(token)?;
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
        if self.node_epoch != Some(body.node_epoch) {
            return Err(self.stale(body));
        }
        if self.used.contains_key(&(body.container_id, body.version)) {
            return Err(TokenError::Replayed {
                container: body.container_id,
                version: body.version,
            });
        }
        Ok(())
    }

    /// Marks a token that [`TokenVerifier::check`] accepted as used: a replay is refused until
    /// it expires. For a caller that consumes only once it has acted on the token (a node that
    /// refuses a start leaves the token usable), in the same turn as the check: checking again
    /// would verify the signature twice (an Ed25519 verification per GUARANTEED start).
    pub fn consume(&mut self, token: &ContainerToken) {
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

    const ISSUER: u32 = 1;
    const EPOCH: u32 = 5;

    fn body(node: &str) -> TokenBody {
        TokenBody {
            container_id: ContainerId::new(ISSUER, 1),
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
            booking: None,
            times_returned: 0,
        }
    }

    fn master() -> TokenKey {
        TokenKey::from_bytes(1, [7; 32])
    }

    /// What the coordinator hands out at `node`'s join (session `epoch`).
    fn session(node: &str, epoch: u32) -> NodeSessionSecret {
        NodeSessionSecret::derive(&master(), &NodeId::from(node), epoch).unwrap()
    }

    /// Issuer `issuer`'s signer with keys for the given (node, session) pairs.
    fn signer(issuer: u32, nodes: &[(&str, u32)]) -> QueueableSigner {
        let keys: Vec<IssuerNodeKey> = nodes
            .iter()
            .map(|(n, e)| {
                session(n, *e)
                    .issuer_key(&NodeId::from(*n), issuer)
                    .unwrap()
            })
            .collect();
        QueueableSigner::new(issuer, &keys)
    }

    fn verifier(node: &str, epoch: u32) -> TokenVerifier {
        let mut v = TokenVerifier::new(NodeId::from(node));
        v.set_node_session(&session(node, epoch)).unwrap();
        v
    }

    #[test]
    fn keys_rotate_every_period_and_retry_a_minute_after_a_failure() {
        let hour = 3_600_000;
        let mut r = RotationSchedule::new(hour, 1_000);
        assert!(!r.due(1_000 + hour - 1));
        assert!(r.due(1_000 + hour));
        r.failed(1_000 + hour);
        assert!(!r.due(1_000 + hour + ROTATION_RETRY_MS - 1));
        assert!(r.due(1_000 + hour + ROTATION_RETRY_MS));
        r.rotated(2 * hour);
        assert!(!r.due(2 * hour + 1));
        // A stamp from the future within a period is waited out; beyond it, rotated at once.
        assert!(!RotationSchedule::new(hour, 10 * hour).due(9 * hour));
        assert!(RotationSchedule::new(hour, 10 * hour).due(8 * hour));
        assert_eq!(RotationSchedule::next_key_id(7), 8);
        assert_eq!(RotationSchedule::next_key_id(u32::MAX), 1);
    }

    #[test]
    fn the_padded_hmac_key_is_hmacs_own_key_handling() {
        let key = [0x5a; 32];
        let mut ours = hmac_of(&key);
        let mut reference = HmacSha256::new_from_slice(&key).unwrap();
        ours.update(b"body");
        reference.update(b"body");
        assert_eq!(
            ours.finalize().into_bytes(),
            reference.finalize().into_bytes()
        );
    }

    #[test]
    fn valid_token_is_accepted_once() {
        let token = signer(ISSUER, &[("n1", EPOCH)]).sign(body("n1")).unwrap();
        assert_eq!(token.body.node_epoch, EPOCH);
        let mut v = verifier("n1", EPOCH);
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
    fn a_checked_token_consumed_afterwards_is_refused_as_a_replay() {
        // The node's order: check, act on it (submit), then consume without verifying again.
        let token = signer(ISSUER, &[("n1", EPOCH)]).sign(body("n1")).unwrap();
        let mut v = verifier("n1", EPOCH);
        let app = AppId::from("app");
        v.check(&token, &app, 5_000).unwrap();
        // Checking does not use it up: a start the node refused can be retried.
        v.check(&token, &app, 5_000).unwrap();
        v.consume(&token);
        assert!(matches!(
            v.check(&token, &app, 5_001),
            Err(TokenError::Replayed { .. })
        ));
    }

    /// A re-placement's count of returns is signed: an application cannot raise it (to keep its
    /// work queued where it lands) or clear it; a token without it encodes as before the field
    /// existed, and it survives the app protocol's named encoding.
    #[test]
    fn the_count_of_returns_is_signed_and_absent_when_zero() {
        let s = signer(ISSUER, &[("n1", EPOCH)]);
        let app = AppId::from("app");
        let mut v = verifier("n1", EPOCH);
        assert_eq!(body_bytes(&body("n1")).unwrap()[0], 0x90 | 13);
        let mut returned = body("n1");
        returned.times_returned = 2;
        assert_eq!(body_bytes(&returned).unwrap()[0], 0x90 | 14);
        let token = s.sign(returned).unwrap();
        v.check(&token, &app, 1).unwrap();
        let named = rmp_serde::to_vec_named(&token).unwrap();
        let back: ContainerToken = rmp_serde::from_slice(&named).unwrap();
        assert_eq!(back.body.times_returned, 2);
        v.check(&back, &app, 1).unwrap();
        for forged_count in [0, 3, MAX_RETURNS_FOR_TEST] {
            let mut tampered = token.clone();
            tampered.body.times_returned = forged_count;
            assert_eq!(v.check(&tampered, &app, 1), Err(TokenError::Forged));
        }
    }

    const MAX_RETURNS_FOR_TEST: u8 = crate::node::MAX_RETURNS;

    #[test]
    fn forged_wrong_node_and_wrong_app_are_refused() {
        let s = signer(ISSUER, &[("n1", EPOCH), ("n2", EPOCH + 1)]);
        let token = s.sign(body("n1")).unwrap();
        let mut v = verifier("n1", EPOCH);
        let app = AppId::from("app");
        let mut tampered = token.clone();
        tampered.body.resources.memory_mib = 1 << 20;
        assert_eq!(v.check(&tampered, &app, 1), Err(TokenError::Forged));
        let mut garbage = token.clone();
        garbage.signature = "zz".into();
        assert_eq!(v.check(&garbage, &app, 1), Err(TokenError::Forged));
        // Signed under another master key (an impostor coordinator).
        let impostor = NodeSessionSecret::derive(
            &TokenKey::from_bytes(1, [9; 32]),
            &NodeId::from("n1"),
            EPOCH,
        )
        .unwrap()
        .issuer_key(&NodeId::from("n1"), ISSUER)
        .unwrap();
        let forged = QueueableSigner::new(ISSUER, &[impostor])
            .sign(body("n1"))
            .unwrap();
        assert_eq!(v.check(&forged, &app, 1), Err(TokenError::Forged));
        // A token for n2, even re-addressed to n1, does not verify at n1.
        let for_n2 = s.sign(body("n2")).unwrap();
        assert!(matches!(
            v.check(&for_n2, &app, 1),
            Err(TokenError::WrongNode { .. })
        ));
        let mut readdressed = for_n2.clone();
        readdressed.body.node_id = NodeId::from("n1");
        readdressed.body.node_epoch = EPOCH;
        assert_eq!(v.check(&readdressed, &app, 1), Err(TokenError::Forged));
        let mut v2 = verifier("n2", EPOCH + 1);
        v2.check(&for_n2, &app, 1).unwrap();
        assert!(matches!(
            v2.check(&token, &app, 1),
            Err(TokenError::WrongNode { .. })
        ));
        assert!(matches!(
            v.check(&token, &AppId::from("mallory"), 1),
            Err(TokenError::WrongApp { .. })
        ));
        // No key for a node outside the directory.
        assert_eq!(
            s.sign(body("n3")),
            Err(TokenError::NoKeyForNode("n3".into()))
        );
    }

    #[test]
    fn an_issuers_keys_cannot_mint_in_another_issuers_name() {
        // Issuer 1 stole its own keys: it signs for issuer 2's container ids.
        let thief = signer(1, &[("n1", EPOCH)]);
        let mut b = body("n1");
        b.container_id = ContainerId::new(2, 1);
        assert!(matches!(
            thief.sign(b.clone()),
            Err(TokenError::Encoding(_))
        ));
        // Bypassing the signer's check (a hand-built signer claiming issuer 2 with issuer 1's
        // keys) gives a signature the node refuses: it derives issuer 2's key itself.
        let key_of_1 = session("n1", EPOCH)
            .issuer_key(&NodeId::from("n1"), 1)
            .unwrap();
        let posing = QueueableSigner::new(2, &[key_of_1]);
        let forged = posing.sign(b.clone()).unwrap();
        let v = verifier("n1", EPOCH);
        assert_eq!(v.verify_signature(&forged), Err(TokenError::Forged));
        // Issuer 2's genuine key works.
        v.verify_signature(&signer(2, &[("n1", EPOCH)]).sign(b).unwrap())
            .unwrap();
        // Keys differ per issuer, per node and per session.
        let k = |n: &str, e: u32, i: u32| {
            session(n, e)
                .issuer_key(&NodeId::from(n), i)
                .unwrap()
                .secret
        };
        assert_ne!(k("n1", EPOCH, 1), k("n1", EPOCH, 2));
        assert_ne!(k("n1", EPOCH, 1), k("n2", EPOCH, 1));
        assert_ne!(k("n1", EPOCH, 1), k("n1", EPOCH + 1, 1));
        assert_ne!(
            session("n1", EPOCH).secret_hex,
            session("n2", EPOCH).secret_hex
        );
    }

    #[test]
    fn queueable_grants_of_another_node_session_are_void() {
        let token = signer(ISSUER, &[("n1", EPOCH)]).sign(body("n1")).unwrap();
        let app = AppId::from("app");
        // Before any join there is no session.
        let unjoined = TokenVerifier::new(NodeId::from("n1"));
        assert!(matches!(
            unjoined.verify_signature(&token),
            Err(TokenError::StaleGrant { node_epoch: 0, .. })
        ));
        // After a re-join (new session, new secret) the old grant is stale.
        let mut v = verifier("n1", EPOCH + 3);
        assert_eq!(
            v.check(&token, &app, 1),
            Err(TokenError::StaleGrant {
                container: token.body.container_id,
                grant_epoch: EPOCH,
                node_epoch: EPOCH + 3
            })
        );
        // Claiming the new session with the old key does not verify either.
        let mut relabelled = token.clone();
        relabelled.body.node_epoch = EPOCH + 3;
        assert_eq!(v.check(&relabelled, &app, 1), Err(TokenError::Forged));
    }

    #[test]
    fn a_new_directory_replaces_the_signers_keys() {
        let mut s = signer(ISSUER, &[("n1", EPOCH), ("n2", EPOCH)]);
        assert_eq!(s.nodes(), 2);
        let rejoined = session("n2", EPOCH + 1)
            .issuer_key(&NodeId::from("n2"), ISSUER)
            .unwrap();
        s.replace_keys(std::slice::from_ref(&rejoined));
        assert_eq!(s.nodes(), 1);
        assert!(s.sign(body("n1")).is_err());
        assert_eq!(s.sign(body("n2")).unwrap().body.node_epoch, EPOCH + 1);
    }

    #[test]
    fn a_delta_patches_the_signers_keys_and_the_prepared_deriver_gives_the_same_keys() {
        let mut s = signer(ISSUER, &[("n1", EPOCH), ("n2", EPOCH)]);
        let n2 = NodeId::from("n2");
        let rejoined = session("n2", EPOCH + 1).issuer_key(&n2, ISSUER).unwrap();
        let prepared = session("n2", EPOCH + 1)
            .issuer_keys_for(&n2)
            .unwrap()
            .issuer_key(ISSUER);
        assert_eq!(prepared, rejoined);
        let joined = session("n3", EPOCH)
            .issuer_key(&NodeId::from("n3"), ISSUER)
            .unwrap();
        // n2 re-joined (its new key replaces the old), n3 joined, n1 left.
        s.patch_keys(&[rejoined, joined], &[NodeId::from("n1")]);
        assert_eq!(s.nodes(), 2);
        assert!(s.sign(body("n1")).is_err());
        assert_eq!(s.sign(body("n2")).unwrap().body.node_epoch, EPOCH + 1);
        assert_eq!(s.node_epoch(&NodeId::from("n3")), Some(EPOCH));
    }

    fn guaranteed_signer() -> GuaranteedSigner {
        GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [5; 32]))).unwrap()
    }

    fn guaranteed(mut b: TokenBody) -> TokenBody {
        b.container_type = ContainerType::Guaranteed;
        b.container_id = ContainerId::new(0, 1);
        b.node_epoch = EPOCH;
        b
    }

    #[test]
    fn only_the_coordinators_ed25519_key_signs_guaranteed_tokens() {
        let signer = guaranteed_signer();
        let b = guaranteed(body("n1"));
        let app = AppId::from("app");
        let mut v = verifier("n1", EPOCH);
        // What a worker (or a thief of its secrets) could do: sign with an HMAC key it holds.
        let mut minted_by_worker = signer_for_test_forgery(&b);
        assert_eq!(
            v.check(&minted_by_worker, &app, 1),
            Err(TokenError::UnknownKey(0)),
            "no GUARANTEED public keys yet"
        );
        v.set_guaranteed_keys(signer.public_ring());
        minted_by_worker.body.key_id = 1;
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
        v.check(&rotated.sign(b.clone()).unwrap(), &app, 1).unwrap();
        seeds.rotate(TokenKey::from_bytes(3, [4; 32]));
        v.set_guaranteed_keys(GuaranteedSigner::new(&seeds).unwrap().public_ring());
        assert_eq!(v.check(&genuine, &app, 1), Err(TokenError::UnknownKey(1)));
    }

    /// A GUARANTEED body MACed with a node's QUEUEABLE key (what a worker could forge).
    fn signer_for_test_forgery(b: &TokenBody) -> ContainerToken {
        let key = session("n1", EPOCH)
            .issuer_key(&NodeId::from("n1"), 0)
            .unwrap();
        let mut mac = hmac_of(&key.secret);
        mac.update(&body_bytes(b).unwrap());
        ContainerToken {
            body: b.clone(),
            signature: hex::encode(mac.finalize().into_bytes()),
        }
    }

    #[test]
    fn guaranteed_grants_of_another_node_session_are_void() {
        let signer = guaranteed_signer();
        let token = signer.sign(guaranteed(body("n1"))).unwrap();
        let app = AppId::from("app");
        let mut v = TokenVerifier::new(NodeId::from("n1"));
        v.set_guaranteed_keys(signer.public_ring());
        // Before any join there is no session: refused.
        assert!(matches!(
            v.check(&token, &app, 1),
            Err(TokenError::StaleGrant {
                grant_epoch: EPOCH,
                node_epoch: 0,
                ..
            })
        ));
        v.set_node_session(&session("n1", EPOCH + 1)).unwrap();
        assert!(matches!(
            v.check(&token, &app, 1),
            Err(TokenError::StaleGrant {
                grant_epoch: EPOCH,
                node_epoch: 6,
                ..
            })
        ));
        v.set_node_session(&session("n1", EPOCH)).unwrap();
        v.check(&token, &app, 1).unwrap();
    }

    #[test]
    fn a_revoked_grant_is_refused_until_its_expiry_then_forgotten() {
        let token = signer(ISSUER, &[("n1", EPOCH)]).sign(body("n1")).unwrap();
        let app = AppId::from("app");
        let mut v = verifier("n1", EPOCH);
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

    /// A token without booking terms is encoded (and signed) exactly as before the field
    /// existed: thirteen positional fields. One with terms has a fourteenth, covered by the
    /// signature.
    #[test]
    fn booking_terms_are_signed_and_absent_terms_leave_the_encoding_unchanged() {
        let mut body = guaranteed_body_for_booking_test();
        let bytes = body_bytes(&body).unwrap();
        assert_eq!(bytes[0], 0x90 | 13, "a fixarray of the 13 original fields");
        let signer =
            GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [5; 32]))).unwrap();
        body.booking = Some(GrantBooking {
            reservation_id: Some("nightly".into()),
            role: crate::shaper::ComponentRole::Elastic,
            allow_shaping: true,
            requested: Resources::new(2000, 2048),
        });
        assert_eq!(body_bytes(&body).unwrap()[0], 0x90 | 14);
        let token = signer.sign(body).unwrap();
        let ring = signer.public_ring();
        ring.verify_signature(&token).unwrap();
        // Through the app protocol's named encoding and back: still verifies.
        let named = rmp_serde::to_vec_named(&token).unwrap();
        let back: ContainerToken = rmp_serde::from_slice(&named).unwrap();
        ring.verify_signature(&back).unwrap();
        let mut moved = token.clone();
        moved.body.booking.as_mut().unwrap().reservation_id = Some("other".into());
        assert_eq!(ring.verify_signature(&moved), Err(TokenError::Forged));
        let mut dropped = token;
        dropped.body.booking = None;
        assert_eq!(ring.verify_signature(&dropped), Err(TokenError::Forged));
    }

    fn guaranteed_body_for_booking_test() -> TokenBody {
        TokenBody {
            container_id: ContainerId::new(0, 7),
            node_id: NodeId::from("n1"),
            app_id: AppId::from("a"),
            resources: Resources::new(2000, 2048),
            container_type: ContainerType::Guaranteed,
            version: 0,
            job_id: crate::JobId::from("j"),
            job_submit_time_ms: 1,
            priority: 0,
            runtime_estimate_ms: None,
            expires_at_ms: 10,
            key_id: 0,
            node_epoch: 1,
            booking: None,
            times_returned: 0,
        }
    }
}
