//! CHAP in the login's security stage (RFC 7143 §12.1.3 over RFC 1994), sans IO.
//!
//! The exchange, keys as RFC 7143 names them:
//!
//! ```text
//! I-> AuthMethod=CHAP,...            T-> AuthMethod=CHAP
//! I-> CHAP_A=<A1,A2,...>             T-> CHAP_A=<A> CHAP_I=<I> CHAP_C=<C>
//! I-> CHAP_N=<N> CHAP_R=<R>          (one-way: the target checks R = H(I || secret || C))
//!     [CHAP_I=<I'> CHAP_C=<C'>]      T-> [CHAP_N=<N'> CHAP_R=<H(I' || msecret || C')>] (mutual)
//! ```
//!
//! [`ChapTarget`] is the target side, an [`Authenticator`] for [`crate::login::Login`];
//! [`ChapInitiator`] is the initiator side (riser-perf). Both take their randomness (CHAP_I and
//! the challenges) from a [`RandomSource`]: the OS CSPRNG ([`OsRandom`]) in production, a
//! closure in tests.
//!
//! Algorithms ([`ChapAlgorithm`]): MD5 (5, the one RFC 1994 requires), SHA-1 (6), SHA-256 (7)
//! and SHA3-256 (8), the values the Linux target and initiator use. The target picks the
//! first algorithm of the initiator's CHAP_A list that it allows (the initiator's order of
//! preference, RFC 7143 §12.1.3).
//!
//! Binary values (CHAP_C, CHAP_R) are `0x` hex or `0b` base64 (RFC 7143 §6.1); both are
//! accepted, a response goes in the encoding of the challenge it answers. They are at most
//! 1024 bytes decoded (§12.1.3), and the encoded text is bounded before anything is decoded.
//! Odd-length hex is refused: RFC 7143 leaves the place of the missing nibble implicit, and
//! no CHAP implementation sends it.
//!
//! Secrets never appear in `Debug` output or in the errors ([`ChapError`]), which are what
//! the login's log line says; responses are compared in constant time (`subtle`).

use std::fmt;
use std::str::FromStr;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use sha3::Sha3_256;
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::login::{AuthStep, Authenticator};
use crate::pdu::LoginStatus;
use crate::text::{parse_number, Pairs};

/// Longest CHAP_C or CHAP_R, decoded (RFC 7143 §12.1.3).
pub const MAX_BINARY_LEN: usize = 1024;
/// Longest encoded CHAP_C or CHAP_R accepted: `0x` and two hex digits per byte (base64 is
/// shorter). Longer text is refused before any decoding.
pub const MAX_ENCODED_LEN: usize = 2 + 2 * MAX_BINARY_LEN;
/// Longest CHAP_N (a name; RFC 7143 §6.1 text values are at most 255 bytes).
pub const MAX_NAME_LEN: usize = 255;
/// Shortest challenge riser sends (RFC 7143 §12.1.3 asks for unpredictable challenges;
/// the issue: at least 16 random bytes).
pub const MIN_CHALLENGE_LEN: usize = 16;
/// Longest CHAP_A list or CHAP_I text looked at.
const MAX_SHORT_VALUE_LEN: usize = 255;

/// A CHAP algorithm (the CHAP_A value: RFC 1994 and the IANA PPP registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChapAlgorithm {
    /// 5: the one every implementation has.
    Md5,
    /// 6
    Sha1,
    /// 7
    Sha256,
    /// 8
    Sha3_256,
}

impl ChapAlgorithm {
    /// Every algorithm, strongest first: the default offer and the default allowed set.
    pub const ALL: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Md5,
    ];

    /// The CHAP_A value.
    pub fn id(self) -> u8 {
        match self {
            ChapAlgorithm::Md5 => 5,
            ChapAlgorithm::Sha1 => 6,
            ChapAlgorithm::Sha256 => 7,
            ChapAlgorithm::Sha3_256 => 8,
        }
    }

    pub fn from_id(id: u64) -> Option<ChapAlgorithm> {
        match id {
            5 => Some(ChapAlgorithm::Md5),
            6 => Some(ChapAlgorithm::Sha1),
            7 => Some(ChapAlgorithm::Sha256),
            8 => Some(ChapAlgorithm::Sha3_256),
            _ => None,
        }
    }

    /// The name riser-perf's `--chap-digest` and the Linux initiator's `chap_algs` use.
    pub fn name(self) -> &'static str {
        match self {
            ChapAlgorithm::Md5 => "md5",
            ChapAlgorithm::Sha1 => "sha1",
            ChapAlgorithm::Sha256 => "sha256",
            ChapAlgorithm::Sha3_256 => "sha3-256",
        }
    }

    /// Bytes of a response.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha1 => 20,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// Bytes of the challenges riser makes: the digest size, at least [`MIN_CHALLENGE_LEN`].
    pub fn challenge_len(self) -> usize {
        self.digest_len().max(MIN_CHALLENGE_LEN)
    }

    /// The CHAP response: H(identifier || secret || challenge) (RFC 1994 §4.1).
    pub fn response(self, identifier: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        fn h<D: Digest>(identifier: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
            let mut d = D::new();
            d.update([identifier]);
            d.update(secret);
            d.update(challenge);
            d.finalize().to_vec()
        }
        match self {
            ChapAlgorithm::Md5 => h::<Md5>(identifier, secret, challenge),
            ChapAlgorithm::Sha1 => h::<Sha1>(identifier, secret, challenge),
            ChapAlgorithm::Sha256 => h::<Sha256>(identifier, secret, challenge),
            ChapAlgorithm::Sha3_256 => h::<Sha3_256>(identifier, secret, challenge),
        }
    }
}

impl fmt::Display for ChapAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChapAlgorithm {
    type Err = String;

    /// `md5`, `sha1`, `sha256`, `sha3-256` (any case; `sha-1`, `sha-256`, `sha3_256` too), or
    /// the CHAP_A number.
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.trim().to_ascii_lowercase();
        let alg = match lower.as_str() {
            "md5" | "5" => ChapAlgorithm::Md5,
            "sha1" | "sha-1" | "6" => ChapAlgorithm::Sha1,
            "sha256" | "sha-256" | "7" => ChapAlgorithm::Sha256,
            "sha3-256" | "sha3_256" | "sha3256" | "8" => ChapAlgorithm::Sha3_256,
            _ => {
                return Err(format!(
                    "unknown CHAP digest \"{}\": use md5, sha1, sha256 or sha3-256",
                    printable(s)
                ))
            }
        };
        Ok(alg)
    }
}

/// How a binary value was written (RFC 7143 §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// `0x` followed by hex digits.
    #[default]
    Hex,
    /// `0b` followed by base64 (RFC 4648).
    Base64,
}

/// Base64 as RFC 7143 writes it (RFC 4648 alphabet); the `=` padding is not insisted on.
const B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Encode `bytes` as a binary value.
pub fn encode_binary(bytes: &[u8], encoding: Encoding) -> String {
    match encoding {
        Encoding::Hex => crate::text::encode_hex(bytes),
        Encoding::Base64 => {
            let mut s = String::from("0b");
            B64.encode_string(bytes, &mut s);
            s
        }
    }
}

/// Decode a CHAP binary value of 1 to `max` bytes (at most [`MAX_BINARY_LEN`]); `key` names
/// it in the error. Text longer than any such value could be is refused before decoding.
pub fn decode_binary(key: &'static str, value: &str, max: usize) -> Result<(Vec<u8>, Encoding), ChapError> {
    let max = max.min(MAX_BINARY_LEN);
    let bad = |why: &'static str| ChapError::BadValue { key, why };
    if value.len() > 2 + 2 * max {
        return Err(bad("too long"));
    }
    let (prefix, body) = value.split_at_checked(2).ok_or(bad("not a 0x or 0b binary value"))?;
    let (bytes, encoding) = match prefix {
        "0x" | "0X" => {
            if body.len() % 2 != 0 {
                return Err(bad("odd number of hex digits"));
            }
            let mut out = Vec::with_capacity(body.len() / 2);
            for pair in body.as_bytes().chunks_exact(2) {
                match (hex_val(pair[0]), hex_val(pair[1])) {
                    (Some(hi), Some(lo)) => out.push((hi << 4) | lo),
                    _ => return Err(bad("not hex")),
                }
            }
            (out, Encoding::Hex)
        }
        "0b" | "0B" => (B64.decode(body).map_err(|_| bad("bad base64"))?, Encoding::Base64),
        _ => return Err(bad("not a 0x or 0b binary value")),
    };
    if bytes.is_empty() {
        return Err(bad("empty"));
    }
    if bytes.len() > max {
        return Err(bad("too long"));
    }
    Ok((bytes, encoding))
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// CHAP_I: a number from 0 to 255 (decimal, or any RFC 7143 numerical form).
fn parse_identifier(value: &str) -> Result<u8, ChapError> {
    if value.len() > MAX_SHORT_VALUE_LEN {
        return Err(ChapError::BadIdentifier);
    }
    parse_number(value)
        .ok()
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(ChapError::BadIdentifier)
}

/// At most 64 characters of peer text, escaped, for messages.
fn printable(s: &str) -> String {
    let short: String = s.chars().take(64).collect();
    let escaped = short.escape_debug().to_string();
    if s.chars().nth(64).is_some() {
        format!("{escaped}...")
    } else {
        escaped
    }
}

/// Why CHAP failed. The messages name keys and users, never a secret, a challenge or a
/// response.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChapError {
    #[error("no CHAP algorithm in common (offered: {0})")]
    NoCommonAlgorithm(String),
    #[error("{0} missing")]
    MissingKey(&'static str),
    #[error("{0} sent twice")]
    DuplicateKey(String),
    #[error("{0} not expected now")]
    UnexpectedKey(String),
    #[error("{key}: {why}")]
    BadValue { key: &'static str, why: &'static str },
    #[error("CHAP_I is not a number from 0 to 255")]
    BadIdentifier,
    #[error("unknown CHAP user \"{0}\"")]
    UnknownUser(String),
    #[error("wrong CHAP response for user \"{0}\"")]
    WrongResponse(String),
    #[error("CHAP response computed with the other direction's secret (RFC 7143 §12.1.3)")]
    SecretReuse,
    #[error("reflected challenge: the peer sent back our own CHAP_C")]
    ReflectedChallenge,
    /// The response was right but this user may not log in from here (its authorizer said
    /// why): Authorization Failure (0x0202), not Authentication Failure.
    #[error("authenticated but not authorized: {0}")]
    NotAuthorized(String),
    #[error("mutual CHAP required but the initiator sent no CHAP_I and CHAP_C")]
    MutualRequired,
    #[error("mutual CHAP asked for but user \"{0}\" has no mutual secret")]
    NoMutualSecret(String),
    #[error("the target answered as \"{got}\", not as \"{expected}\"")]
    WrongTargetName { expected: String, got: String },
    #[error("the target's mutual CHAP response is wrong")]
    WrongTargetResponse,
    #[error("the random source failed: {0}")]
    Random(String),
    #[error("the CHAP exchange already failed")]
    Failed,
}

/// Where challenges and identifiers come from.
pub trait RandomSource: Send {
    /// Fill `buf` with unpredictable bytes.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), ChapError>;
}

/// The operating system's CSPRNG (`getrandom`).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), ChapError> {
        getrandom::fill(buf).map_err(|e| ChapError::Random(e.to_string()))
    }
}

/// A closure filling buffers: deterministic sources for tests.
impl<F: FnMut(&mut [u8]) + Send> RandomSource for F {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), ChapError> {
        self(buf);
        Ok(())
    }
}

/// One secret of an auth group (SPDK's `iscsi_create_auth_group` secrets): the initiator
/// `user` proves it knows `secret`; for mutual CHAP the target answers as `muser` with
/// `msecret`. `Debug` shows the names only.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapSecret {
    pub user: String,
    pub secret: String,
    pub muser: Option<String>,
    pub msecret: Option<String>,
}

/// Each login clones its group's secrets; the clone is overwritten when the login drops it.
impl Drop for ChapSecret {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.secret.zeroize();
        self.msecret.zeroize();
    }
}

/// The `Drop` above: its secrets are zeroized when it drops.
impl zeroize::ZeroizeOnDrop for ChapSecret {}

/// Stands for a secret in `Debug` output.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapSecret")
            .field("user", &self.user)
            .field("secret", &Redacted)
            .field("muser", &self.muser)
            .field("msecret", &self.msecret.as_ref().map(|_| Redacted))
            .finish()
    }
}

/// The CHAP_* keys of one step, each at most once.
#[derive(Default)]
struct Keys<'a> {
    a: Option<&'a str>,
    i: Option<&'a str>,
    c: Option<&'a str>,
    n: Option<&'a str>,
    r: Option<&'a str>,
}

impl<'a> Keys<'a> {
    /// `allowed`: the keys this step may carry; any other CHAP key is an error.
    fn collect(keys: &'a [(String, String)], allowed: &[&str]) -> Result<Keys<'a>, ChapError> {
        let mut k = Keys::default();
        for (name, value) in keys {
            let slot = match name.as_str() {
                n if !allowed.contains(&n) => return Err(ChapError::UnexpectedKey(printable(n))),
                "CHAP_A" => &mut k.a,
                "CHAP_I" => &mut k.i,
                "CHAP_C" => &mut k.c,
                "CHAP_N" => &mut k.n,
                "CHAP_R" => &mut k.r,
                n => return Err(ChapError::UnexpectedKey(printable(n))),
            };
            if slot.is_some() {
                return Err(ChapError::DuplicateKey(name.clone()));
            }
            *slot = Some(value.as_str());
        }
        Ok(k)
    }
}

fn required<'a>(v: Option<&'a str>, key: &'static str) -> Result<&'a str, ChapError> {
    v.ok_or(ChapError::MissingKey(key))
}

fn random_vec(random: &mut dyn RandomSource, len: usize) -> Result<Vec<u8>, ChapError> {
    let mut v = vec![0u8; len];
    random.fill(&mut v)?;
    Ok(v)
}

fn random_byte(random: &mut dyn RandomSource) -> Result<u8, ChapError> {
    let mut b = [0u8; 1];
    random.fill(&mut b)?;
    Ok(b[0])
}

// ---- target ------------------------------------------------------------------------------

enum TargetState {
    /// Waiting for CHAP_A.
    Algorithm,
    /// CHAP_A, CHAP_I and CHAP_C sent; waiting for CHAP_N and CHAP_R.
    Response {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
    Failed,
}

/// The target side of CHAP: an [`Authenticator`] for [`crate::login::AuthPolicy`].
///
/// ```
/// use riser_iscsi::chap::{ChapSecret, ChapTarget};
/// use riser_iscsi::login::AuthPolicy;
///
/// let secrets = vec![ChapSecret {
///     user: "alice".into(),
///     secret: "alice-secret-123".into(),
///     muser: Some("riser".into()),
///     msecret: Some("riser-secret-456".into()),
/// }];
/// // One per login: the OS CSPRNG, every algorithm allowed; mutual CHAP not insisted on.
/// let auth = AuthPolicy::Required(Box::new(ChapTarget::new(secrets, false)));
/// ```
pub struct ChapTarget {
    secrets: Vec<ChapSecret>,
    mutual_required: bool,
    /// Asked once a user proved its secret: may it log in here? (see [`Self::with_authorizer`])
    authorize: Option<Authorizer>,
    algorithms: Vec<ChapAlgorithm>,
    random: Box<dyn RandomSource>,
    state: TargetState,
    /// The algorithm chosen from the initiator's CHAP_A, kept after the exchange.
    chosen: Option<ChapAlgorithm>,
    user: Option<String>,
    failure: Option<ChapError>,
}

impl fmt::Debug for ChapTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            TargetState::Algorithm => "Algorithm",
            TargetState::Response { .. } => "Response",
            TargetState::Done => "Done",
            TargetState::Failed => "Failed",
        };
        f.debug_struct("ChapTarget")
            .field(
                "users",
                &self.secrets.iter().map(|s| s.user.as_str()).collect::<Vec<_>>(),
            )
            .field("mutual_required", &self.mutual_required)
            .field("algorithms", &self.algorithms)
            .field("state", &state)
            .field("user", &self.user)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

/// Decides whether an authenticated CHAP user (its CHAP_N) may log in; Err says why.
pub type Authorizer = Box<dyn Fn(&str) -> Result<(), String> + Send>;

impl ChapTarget {
    /// CHAP for one login with these secrets (the first secret whose `user` is the
    /// initiator's CHAP_N is used), every algorithm allowed, challenges from the OS CSPRNG.
    /// `mutual_required`: the initiator must ask the target to authenticate itself too.
    pub fn new(secrets: Vec<ChapSecret>, mutual_required: bool) -> ChapTarget {
        ChapTarget::with_random(secrets, mutual_required, Box::new(OsRandom))
    }

    /// [`Self::new`] with another random source (tests).
    pub fn with_random(secrets: Vec<ChapSecret>, mutual_required: bool, random: Box<dyn RandomSource>) -> ChapTarget {
        ChapTarget {
            secrets,
            mutual_required,
            authorize: None,
            algorithms: ChapAlgorithm::ALL.to_vec(),
            random,
            state: TargetState::Algorithm,
            chosen: None,
            user: None,
            failure: None,
        }
    }

    /// Allow only these algorithms. The choice follows the initiator's order of preference,
    /// so only the set matters.
    pub fn with_algorithms(mut self, algorithms: Vec<ChapAlgorithm>) -> ChapTarget {
        self.algorithms = algorithms;
        self
    }

    /// Once a user's response is right (and before the target answers mutual CHAP), ask
    /// `authorize` whether that user may log in: e.g. whether it is bound to initiator names
    /// this login's InitiatorName is not among. A refusal fails the exchange with
    /// [`ChapError::NotAuthorized`], an Authorization Failure (0x0202).
    pub fn with_authorizer(mut self, authorize: Authorizer) -> ChapTarget {
        self.authorize = Some(authorize);
        self
    }

    /// Why the exchange failed, once it has.
    pub fn failure(&self) -> Option<&ChapError> {
        self.failure.as_ref()
    }

    /// The CHAP_N of an initiator that authenticated.
    pub fn authenticated_user(&self) -> Option<&str> {
        match self.state {
            TargetState::Done => self.user.as_deref(),
            _ => None,
        }
    }

    /// The algorithm chosen, once CHAP_A has been answered (also after the exchange).
    pub fn algorithm(&self) -> Option<ChapAlgorithm> {
        self.chosen
    }

    fn pick(&self, offered: &str) -> Result<ChapAlgorithm, ChapError> {
        if offered.len() > MAX_SHORT_VALUE_LEN {
            return Err(ChapError::BadValue {
                key: "CHAP_A",
                why: "too long",
            });
        }
        offered
            .split(',')
            .filter_map(|a| parse_number(a).ok())
            .filter_map(ChapAlgorithm::from_id)
            .find(|a| self.algorithms.contains(a))
            .ok_or_else(|| ChapError::NoCommonAlgorithm(printable(offered)))
    }

    /// One step; Ok(true) when the initiator (and for mutual CHAP the target) is
    /// authenticated.
    fn advance(&mut self, keys: &[(String, String)], out: &mut Pairs) -> Result<bool, ChapError> {
        match std::mem::replace(&mut self.state, TargetState::Failed) {
            TargetState::Algorithm => {
                if keys.is_empty() {
                    // The step that selected AuthMethod=CHAP.
                    self.state = TargetState::Algorithm;
                    return Ok(false);
                }
                let k = Keys::collect(keys, &["CHAP_A"])?;
                let alg = self.pick(required(k.a, "CHAP_A")?)?;
                let id = random_byte(self.random.as_mut())?;
                let challenge = random_vec(self.random.as_mut(), alg.challenge_len())?;
                out.push(("CHAP_A".into(), alg.id().to_string()));
                out.push(("CHAP_I".into(), id.to_string()));
                out.push(("CHAP_C".into(), encode_binary(&challenge, Encoding::Hex)));
                self.state = TargetState::Response { alg, id, challenge };
                self.chosen = Some(alg);
                Ok(false)
            }
            TargetState::Response { alg, id, challenge } => {
                if keys.is_empty() {
                    self.state = TargetState::Response { alg, id, challenge };
                    return Ok(false);
                }
                self.check_response(alg, id, &challenge, keys, out)?;
                self.state = TargetState::Done;
                Ok(true)
            }
            TargetState::Done => {
                self.state = TargetState::Done;
                match keys.first() {
                    None => Ok(true),
                    Some((k, _)) => Err(ChapError::UnexpectedKey(printable(k))),
                }
            }
            TargetState::Failed => Err(ChapError::Failed),
        }
    }

    fn check_response(
        &mut self,
        alg: ChapAlgorithm,
        id: u8,
        challenge: &[u8],
        keys: &[(String, String)],
        out: &mut Pairs,
    ) -> Result<(), ChapError> {
        let k = Keys::collect(keys, &["CHAP_N", "CHAP_R", "CHAP_I", "CHAP_C"])?;
        let name = required(k.n, "CHAP_N")?;
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(ChapError::BadValue {
                key: "CHAP_N",
                why: "empty or longer than 255 bytes",
            });
        }
        let (response, _) = decode_binary("CHAP_R", required(k.r, "CHAP_R")?, alg.digest_len())?;
        if response.len() != alg.digest_len() {
            return Err(ChapError::BadValue {
                key: "CHAP_R",
                why: "not the size of the digest",
            });
        }
        // Mutual CHAP: the initiator's identifier and challenge, checked before any secret is
        // looked at.
        let mutual = match (k.i, k.c) {
            (None, None) if self.mutual_required => return Err(ChapError::MutualRequired),
            (None, None) => None,
            (Some(_), None) => return Err(ChapError::MissingKey("CHAP_C")),
            (None, Some(_)) => return Err(ChapError::MissingKey("CHAP_I")),
            (Some(i), Some(c)) => {
                let their_id = parse_identifier(i)?;
                let (their_challenge, encoding) = decode_binary("CHAP_C", c, MAX_BINARY_LEN)?;
                if bool::from(their_challenge.as_slice().ct_eq(challenge)) {
                    return Err(ChapError::ReflectedChallenge);
                }
                Some((their_id, their_challenge, encoding))
            }
        };
        let user = printable(name);
        let entry = self.secrets.iter().find(|s| s.user == name);
        // An unknown user costs the same digest as a known one.
        let secret = entry.map_or(&[][..], |e| e.secret.as_bytes());
        let expected = alg.response(id, secret, challenge);
        let matches = bool::from(response.as_slice().ct_eq(&expected));
        let Some(entry) = entry else {
            return Err(ChapError::UnknownUser(user));
        };
        if !matches {
            return Err(ChapError::WrongResponse(user));
        }
        // RFC 7143 §12.1.3: a response the target would itself have made for this challenge
        // (the same secret configured both ways) is a failure.
        if let Some(msecret) = &entry.msecret {
            let own = alg.response(id, msecret.as_bytes(), challenge);
            if bool::from(response.as_slice().ct_eq(&own)) {
                return Err(ChapError::SecretReuse);
            }
        }
        if let Some(authorize) = &self.authorize {
            authorize(&entry.user).map_err(ChapError::NotAuthorized)?;
        }
        if let Some((their_id, their_challenge, encoding)) = mutual {
            let (Some(muser), Some(msecret)) = (&entry.muser, &entry.msecret) else {
                return Err(ChapError::NoMutualSecret(user));
            };
            let answer = alg.response(their_id, msecret.as_bytes(), &their_challenge);
            out.push(("CHAP_N".into(), muser.clone()));
            out.push(("CHAP_R".into(), encode_binary(&answer, encoding)));
        }
        self.user = Some(entry.user.clone());
        Ok(())
    }
}

impl Authenticator for ChapTarget {
    fn method(&self) -> &'static str {
        "CHAP"
    }

    fn step(&mut self, keys: &[(String, String)], out: &mut Pairs) -> AuthStep {
        let mut answer = Pairs::new();
        match self.advance(keys, &mut answer) {
            Ok(true) => {
                out.extend(answer);
                log::debug!(
                    "CHAP: user {:?} authenticated with {}",
                    self.authenticated_user().unwrap_or_default(),
                    self.algorithm().map_or("?", ChapAlgorithm::name)
                );
                AuthStep::Success
            }
            Ok(false) => {
                out.extend(answer);
                AuthStep::Continue
            }
            Err(e) => {
                if self.failure.is_none() {
                    self.failure = Some(e);
                }
                self.state = TargetState::Failed;
                AuthStep::Failure
            }
        }
    }

    fn failure_reason(&self) -> Option<String> {
        self.failure.as_ref().map(ToString::to_string)
    }

    fn failure_status(&self) -> LoginStatus {
        match self.failure {
            Some(ChapError::NotAuthorized(_)) => LoginStatus::AUTHORIZATION_FAILURE,
            _ => LoginStatus::AUTHENTICATION_FAILURE,
        }
    }
}

// ---- initiator ---------------------------------------------------------------------------

/// A CHAP name and secret. `Debug` shows the name only.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: String,
    pub secret: String,
}

impl ChapCredentials {
    pub fn new(user: impl Into<String>, secret: impl Into<String>) -> ChapCredentials {
        ChapCredentials {
            user: user.into(),
            secret: secret.into(),
        }
    }

    /// `USER:SECRET`, split at the last ':' (a user name may be an IQN, which has ':'s; the
    /// secret then may not); neither may be empty.
    pub fn parse(s: &str) -> Result<ChapCredentials, String> {
        match s.rsplit_once(':') {
            Some((u, p)) if !u.is_empty() && !p.is_empty() => {
                if u.len() > MAX_NAME_LEN {
                    return Err("the CHAP user name is longer than 255 bytes".into());
                }
                Ok(ChapCredentials::new(u, p))
            }
            _ => Err("expected USER:SECRET, both non-empty".into()),
        }
    }
}

impl fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .field("secret", &Redacted)
            .finish()
    }
}

/// What an initiator logs in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapInitiatorConfig {
    /// Our CHAP_N and secret.
    pub credentials: ChapCredentials,
    /// Mutual CHAP: the name the target must answer with and its secret.
    pub mutual: Option<ChapCredentials>,
    /// The CHAP_A offer, in order of preference.
    pub algorithms: Vec<ChapAlgorithm>,
}

impl ChapInitiatorConfig {
    /// One-way CHAP offering every algorithm, strongest first.
    pub fn new(credentials: ChapCredentials) -> ChapInitiatorConfig {
        ChapInitiatorConfig {
            credentials,
            mutual: None,
            algorithms: ChapAlgorithm::ALL.to_vec(),
        }
    }
}

enum InitiatorState {
    Start,
    /// CHAP_A sent.
    Challenge,
    /// CHAP_N and CHAP_R sent; for mutual CHAP also our identifier and challenge.
    Answer {
        mutual: Option<(ChapAlgorithm, u8, Vec<u8>)>,
    },
    Done,
    Failed,
}

/// The initiator side of CHAP, free of I/O: [`Self::offer`] the CHAP_A list once the target
/// chose AuthMethod=CHAP, [`Self::respond`] to its CHAP_A / CHAP_I / CHAP_C, and
/// [`Self::verify`] its last keys (its mutual answer). Any error ends the exchange.
pub struct ChapInitiator {
    config: ChapInitiatorConfig,
    random: Box<dyn RandomSource>,
    state: InitiatorState,
    algorithm: Option<ChapAlgorithm>,
}

impl fmt::Debug for ChapInitiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            InitiatorState::Start => "Start",
            InitiatorState::Challenge => "Challenge",
            InitiatorState::Answer { .. } => "Answer",
            InitiatorState::Done => "Done",
            InitiatorState::Failed => "Failed",
        };
        f.debug_struct("ChapInitiator")
            .field("config", &self.config)
            .field("state", &state)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl ChapInitiator {
    /// Challenges (mutual CHAP) from the OS CSPRNG.
    pub fn new(config: ChapInitiatorConfig) -> ChapInitiator {
        ChapInitiator::with_random(config, Box::new(OsRandom))
    }

    pub fn with_random(config: ChapInitiatorConfig, random: Box<dyn RandomSource>) -> ChapInitiator {
        ChapInitiator {
            config,
            random,
            state: InitiatorState::Start,
            algorithm: None,
        }
    }

    pub fn config(&self) -> &ChapInitiatorConfig {
        &self.config
    }

    /// The algorithm the target chose.
    pub fn algorithm(&self) -> Option<ChapAlgorithm> {
        self.algorithm
    }

    /// Whether the exchange completed (the target authenticated too, for mutual CHAP).
    pub fn is_done(&self) -> bool {
        matches!(self.state, InitiatorState::Done)
    }

    /// Whether [`Self::offer`] has been called.
    pub fn offered(&self) -> bool {
        !matches!(self.state, InitiatorState::Start)
    }

    /// Whether our response has been sent (only [`Self::verify`] is left).
    pub fn answered(&self) -> bool {
        matches!(self.state, InitiatorState::Answer { .. } | InitiatorState::Done)
    }

    /// The first CHAP keys: `CHAP_A=<our algorithms>`.
    pub fn offer(&mut self) -> Result<Pairs, ChapError> {
        if !matches!(self.state, InitiatorState::Start) {
            return self.fail(ChapError::UnexpectedKey("CHAP_A".into()));
        }
        if self.config.algorithms.is_empty() {
            return self.fail(ChapError::NoCommonAlgorithm(String::new()));
        }
        let list: Vec<String> = self.config.algorithms.iter().map(|a| a.id().to_string()).collect();
        self.state = InitiatorState::Challenge;
        Ok(vec![("CHAP_A".into(), list.join(","))])
    }

    /// The target's CHAP_A, CHAP_I and CHAP_C: our CHAP_N and CHAP_R, and for mutual CHAP our
    /// CHAP_I and CHAP_C.
    pub fn respond(&mut self, target_keys: &[(String, String)]) -> Result<Pairs, ChapError> {
        if !matches!(self.state, InitiatorState::Challenge) {
            return self.fail(ChapError::UnexpectedKey("CHAP_C".into()));
        }
        match self.answer(target_keys) {
            Ok(p) => Ok(p),
            Err(e) => self.fail(e),
        }
    }

    fn answer(&mut self, target_keys: &[(String, String)]) -> Result<Pairs, ChapError> {
        let k = Keys::collect(target_keys, &["CHAP_A", "CHAP_I", "CHAP_C"])?;
        let a = required(k.a, "CHAP_A")?;
        let alg = parse_number(a)
            .ok()
            .and_then(ChapAlgorithm::from_id)
            .filter(|alg| self.config.algorithms.contains(alg))
            .ok_or_else(|| ChapError::NoCommonAlgorithm(printable(a)))?;
        let id = parse_identifier(required(k.i, "CHAP_I")?)?;
        let (challenge, encoding) = decode_binary("CHAP_C", required(k.c, "CHAP_C")?, MAX_BINARY_LEN)?;
        let creds = &self.config.credentials;
        let response = alg.response(id, creds.secret.as_bytes(), &challenge);
        let mut out: Pairs = vec![
            ("CHAP_N".into(), creds.user.clone()),
            ("CHAP_R".into(), encode_binary(&response, encoding)),
        ];
        let mutual = match &self.config.mutual {
            None => None,
            Some(_) => {
                let our_id = random_byte(self.random.as_mut())?;
                let our_challenge = random_vec(self.random.as_mut(), alg.challenge_len())?;
                if our_challenge == challenge {
                    // Only a broken random source gets here; the target would refuse it.
                    return Err(ChapError::ReflectedChallenge);
                }
                out.push(("CHAP_I".into(), our_id.to_string()));
                out.push(("CHAP_C".into(), encode_binary(&our_challenge, Encoding::Hex)));
                Some((alg, our_id, our_challenge))
            }
        };
        self.algorithm = Some(alg);
        self.state = InitiatorState::Answer { mutual };
        Ok(out)
    }

    /// The target's keys after our response: for mutual CHAP its CHAP_N and CHAP_R, checked;
    /// otherwise none may come.
    pub fn verify(&mut self, target_keys: &[(String, String)]) -> Result<(), ChapError> {
        let mutual = match std::mem::replace(&mut self.state, InitiatorState::Failed) {
            InitiatorState::Answer { mutual } => mutual,
            InitiatorState::Done if target_keys.is_empty() => {
                self.state = InitiatorState::Done;
                return Ok(());
            }
            _ => return Err(ChapError::Failed),
        };
        let result = match (mutual, &self.config.mutual) {
            (Some((alg, id, challenge)), Some(expected)) => {
                Self::check_target(&self.config.credentials, expected, alg, id, &challenge, target_keys)
            }
            _ => match target_keys.first() {
                None => Ok(()),
                Some((k, _)) => Err(ChapError::UnexpectedKey(printable(k))),
            },
        };
        if result.is_ok() {
            self.state = InitiatorState::Done;
        }
        result
    }

    fn check_target(
        ours: &ChapCredentials,
        expected: &ChapCredentials,
        alg: ChapAlgorithm,
        id: u8,
        challenge: &[u8],
        target_keys: &[(String, String)],
    ) -> Result<(), ChapError> {
        let k = Keys::collect(target_keys, &["CHAP_N", "CHAP_R"])?;
        let name = required(k.n, "CHAP_N")?;
        let (response, _) = decode_binary("CHAP_R", required(k.r, "CHAP_R")?, alg.digest_len())?;
        if name != expected.user {
            return Err(ChapError::WrongTargetName {
                expected: printable(&expected.user),
                got: printable(name),
            });
        }
        let want = alg.response(id, expected.secret.as_bytes(), challenge);
        if !bool::from(response.as_slice().ct_eq(&want)) {
            return Err(ChapError::WrongTargetResponse);
        }
        // The same secret both ways: refused as the target side does (RFC 7143 §12.1.3).
        let own = alg.response(id, ours.secret.as_bytes(), challenge);
        if bool::from(response.as_slice().ct_eq(&own)) {
            return Err(ChapError::SecretReuse);
        }
        Ok(())
    }

    fn fail<T>(&mut self, e: ChapError) -> Result<T, ChapError> {
        self.state = InitiatorState::Failed;
        Err(e)
    }
}

#[cfg(test)]
mod tests;
