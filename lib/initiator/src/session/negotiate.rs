//! Login key negotiation (RFC 7143 §6.2, §13; iSER: RFC 7145 §6), initiator side: what
//! riser-perf (or a caller's [`Proposal`]) proposes, how it answers the target's offers, and
//! the operational parameters that result ([`Negotiated`], [`IserKeys`]).

use riser_iscsi::text::parse_number;

/// The operational parameters that matter to the data path, as negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub header_digest: bool,
    pub data_digest: bool,
    /// The target's MaxRecvDataSegmentLength: the largest data segment we may send.
    pub max_send_dsl: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst: u32,
    pub max_burst: u32,
}

impl Default for Negotiated {
    /// RFC 7143 §13 defaults: what holds for a key nobody mentioned.
    fn default() -> Self {
        Negotiated {
            header_digest: false,
            data_digest: false,
            max_send_dsl: 8192,
            immediate_data: true,
            initial_r2t: true,
            first_burst: 65_536,
            max_burst: 262_144,
        }
    }
}

impl Negotiated {
    /// How a write of `len` bytes goes out under these keys: (the unsolicited bytes, of
    /// which immediate data in the command PDU; the rest of the unsolicited part follows in
    /// Data-Out PDUs). Whatever is left waits for R2Ts.
    pub fn unsolicited(&self, len: u32) -> (u32, u32) {
        let u = len.min(self.first_burst);
        let i = if self.immediate_data {
            u.min(self.max_send_dsl)
        } else {
            0
        };
        // InitialR2T=Yes: no unsolicited Data-Out, immediate data only (RFC 7143 §13.10).
        if self.initial_r2t {
            (i, i)
        } else {
            (u, i)
        }
    }
}

/// What we declare as MaxRecvDataSegmentLength by default: the largest Data-In the target
/// may send.
pub const OUR_MAX_RECV_DSL: u32 = 262_144;

/// The operational keys the initiator proposes (RFC 7143 §13; on iSER the iSER keys of
/// RFC 7145 §6 replace MaxRecvDataSegmentLength and the digests are off). The defaults,
/// [`Proposal::tcp`] and [`Proposal::iser`], are what riser-perf proposes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// HeaderDigest=CRC32C wanted (a refusal ends the login), else None.
    pub header_digest: bool,
    /// DataDigest=CRC32C wanted (a refusal ends the login), else None.
    pub data_digest: bool,
    /// The MaxRecvDataSegmentLength we declare (TCP only): the largest data segment the
    /// target may send us.
    pub max_recv_dsl: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst: u32,
    pub max_burst: u32,
    /// Further keys for the operational stage: one named like a standard key replaces that
    /// key's value in its place, any other is proposed after the standard ones, as written.
    pub extra: Vec<(String, String)>,
}

impl Proposal {
    /// What riser-perf proposes over TCP: ImmediateData=Yes and InitialR2T=No (as much
    /// unsolicited data as the target allows), large bursts and data segments.
    pub fn tcp(header_digest: bool, data_digest: bool) -> Proposal {
        Proposal {
            header_digest,
            data_digest,
            max_recv_dsl: OUR_MAX_RECV_DSL,
            immediate_data: true,
            // OR-negotiated: the target's Yes wins; No saves a round trip per write.
            initial_r2t: false,
            first_burst: 262_144,
            max_burst: 16_776_192,
            extra: Vec::new(),
        }
    }

    /// What riser-perf proposes over iSER: no digests, InitialR2T=Yes (OR-negotiated: Yes
    /// wins, so no unsolicited Data-Out PDUs on iSER; unsolicited data only as immediate
    /// data in the command's SEND).
    pub fn iser() -> Proposal {
        Proposal {
            initial_r2t: true,
            ..Proposal::tcp(false, false)
        }
    }
}

/// The initiator side of login negotiation, kept free of I/O so it can be tested: the keys
/// to propose, the answers owed to the target's offers, and what they add up to.
#[derive(Clone, Debug)]
pub struct KeyNegotiation {
    proposal: Proposal,
    /// Keys sent so far (a target's copy of one of these is an answer, not an offer).
    pub(crate) proposed: Vec<String>,
    pub result: Negotiated,
    /// iSER (RFC 7145 §6): RDMAExtensions=Yes and the iSER keys instead of
    /// MaxRecvDataSegmentLength.
    iser: bool,
    /// A discovery session: only the keys that apply to one are proposed.
    pub(crate) discovery: bool,
    /// AuthMethod=CHAP was proposed (the login has CHAP credentials).
    pub(crate) chap: bool,
    pub iser_result: IserKeys,
}

/// What we declare as InitiatorRecvDataSegmentLength on iSER: the largest control-type data
/// segment the target may send us (our receive buffers are sized for it). Linux's value.
pub const OUR_INITIATOR_RECV_DSL: u32 = 8192;
/// What we propose as TargetRecvDataSegmentLength (Minimum): the largest immediate data.
/// The RFC 7145 default: LIO/isert answers a larger proposal with Yes-sir (262144) but its
/// receive buffers hold 8 KiB, and a larger SEND fails with a remote operation error.
pub const OUR_TARGET_RECV_DSL: u32 = 8192;

/// The iSER keys as negotiated (RFC 7145 §6.3-6.5; defaults when a key was not mentioned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IserKeys {
    pub rdma_extensions: bool,
    /// Largest data segment we may send (immediate data, Text, NOP-Out).
    pub target_recv_dsl: u32,
    /// Largest data segment the target may send us.
    pub initiator_recv_dsl: u32,
    /// 0: no limit.
    pub max_outstanding_unexpected_pdus: u32,
    /// iSERHelloRequired=Yes was the outcome (our Yes answered Yes).
    pub hello_required: bool,
}

impl Default for IserKeys {
    fn default() -> Self {
        IserKeys {
            rdma_extensions: false,
            target_recv_dsl: 8192,
            initiator_recv_dsl: 8192,
            max_outstanding_unexpected_pdus: 0,
            hello_required: false,
        }
    }
}

impl KeyNegotiation {
    /// Over TCP, proposing [`Proposal::tcp`]: CRC32C digests if asked for.
    pub fn new(header_digest: bool, data_digest: bool) -> Self {
        Self::with_proposal(Proposal::tcp(header_digest, data_digest))
    }

    /// Over TCP, proposing `proposal`.
    pub fn with_proposal(proposal: Proposal) -> Self {
        KeyNegotiation {
            proposal,
            proposed: Vec::new(),
            result: Negotiated::default(),
            iser: false,
            discovery: false,
            chap: false,
            iser_result: IserKeys::default(),
        }
    }

    /// For an iSER connection: no digests, RDMAExtensions=Yes, the iSER keys, InitialR2T=Yes
    /// ([`Proposal::iser`]).
    pub fn new_iser() -> Self {
        KeyNegotiation {
            iser: true,
            ..Self::with_proposal(Proposal::iser())
        }
    }

    /// [`Self::new_iser`] with further operational keys ([`Proposal::extra`]), such as
    /// iSERHelloRequired=Yes.
    pub fn new_iser_with(extra: Vec<(String, String)>) -> Self {
        let mut n = Self::new_iser();
        n.proposal.extra = extra;
        n
    }

    /// What is proposed.
    pub fn proposal(&self) -> &Proposal {
        &self.proposal
    }

    /// Keys of the first Login Operational Negotiation request.
    pub fn operational_proposal(&mut self) -> Vec<(String, String)> {
        let p = &self.proposal;
        let digest = |on: bool| if on { "CRC32C" } else { "None" };
        let yes_no = |on: bool| if on { "Yes" } else { "No" };
        let mut v: Vec<(&str, String)> = vec![
            ("HeaderDigest", digest(p.header_digest && !self.iser).into()),
            ("DataDigest", digest(p.data_digest && !self.iser).into()),
        ];
        if self.iser {
            v.extend([
                ("RDMAExtensions", "Yes".into()),
                (
                    "InitiatorRecvDataSegmentLength",
                    OUR_INITIATOR_RECV_DSL.to_string(),
                ),
                (
                    "TargetRecvDataSegmentLength",
                    OUR_TARGET_RECV_DSL.to_string(),
                ),
                ("MaxOutstandingUnexpectedPDUs", "0".into()),
            ]);
        } else {
            v.push(("MaxRecvDataSegmentLength", p.max_recv_dsl.to_string()));
        }
        if !self.discovery {
            v.extend([
                ("ImmediateData", yes_no(p.immediate_data).into()),
                ("InitialR2T", yes_no(p.initial_r2t).into()),
                ("FirstBurstLength", p.first_burst.to_string()),
                ("MaxBurstLength", p.max_burst.to_string()),
                ("MaxOutstandingR2T", "1".into()),
                ("MaxConnections", "1".into()),
                ("DataPDUInOrder", "Yes".into()),
                ("DataSequenceInOrder", "Yes".into()),
                ("ErrorRecoveryLevel", "0".into()),
                ("DefaultTime2Wait", "0".into()),
                ("DefaultTime2Retain", "0".into()),
            ]);
        }
        let mut v: Vec<(String, String)> = v.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        for (k, val) in &p.extra {
            match v.iter_mut().find(|(a, _)| a == k) {
                Some(kv) => kv.1 = val.clone(),
                None => v.push((k.clone(), val.clone())),
            }
        }
        self.proposed.extend(v.iter().map(|(k, _)| k.clone()));
        v
    }

    /// Takes the keys of one Login Response; returns the answers owed to the target's offers
    /// (empty when it offered nothing), or why the login cannot go on.
    pub fn take_response(
        &mut self,
        pairs: &[(String, String)],
    ) -> Result<Vec<(String, String)>, String> {
        let mut answers = Vec::new();
        for (k, v) in pairs {
            let answer_to_ours = self.proposed.iter().any(|p| p == k);
            // An iSER key the target does not know (LIO: MaxOutstandingUnexpectedPDUs) keeps
            // its default; RDMAExtensions then stays No, which the iSER login refuses.
            if self.iser
                && answer_to_ours
                && matches!(v.as_str(), "NotUnderstood" | "Irrelevant" | "Reject")
            {
                continue;
            }
            match k.as_str() {
                "HeaderDigest" | "DataDigest" => {
                    let want = if k == "HeaderDigest" {
                        self.proposal.header_digest
                    } else {
                        self.proposal.data_digest
                    };
                    let chosen = if answer_to_ours {
                        v.clone()
                    } else {
                        // An offer: pick from its list what we want, else None.
                        let offered: Vec<&str> = v.split(',').collect();
                        let pick = if want && offered.contains(&"CRC32C") {
                            "CRC32C"
                        } else if offered.contains(&"None") {
                            "None"
                        } else if offered.contains(&"CRC32C") {
                            "CRC32C"
                        } else {
                            "Reject"
                        };
                        answers.push((k.clone(), pick.to_string()));
                        pick.to_string()
                    };
                    let on = match chosen.as_str() {
                        "CRC32C" => true,
                        "None" => false,
                        other => {
                            if want {
                                return Err(format!(
                                    "the target refused {k}=CRC32C (answered {other})"
                                ));
                            }
                            false
                        }
                    };
                    if want && !on {
                        return Err(format!("the target refused {k}=CRC32C (answered {chosen})"));
                    }
                    if k == "HeaderDigest" {
                        self.result.header_digest = on;
                    } else {
                        self.result.data_digest = on;
                    }
                }
                // Declarative: the target's own receive limit.
                "MaxRecvDataSegmentLength" => {
                    let n = number(k, v)?;
                    if !(512..=16_777_215).contains(&n) {
                        return Err(format!("the target declared MaxRecvDataSegmentLength={n}, outside 512..16777215"));
                    }
                    self.result.max_send_dsl = n as u32;
                }
                "TargetAlias" | "TargetPortalGroupTag" | "TargetAddress" => {}
                "ImmediateData" | "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => {
                    let b = match v.as_str() {
                        "Yes" => Some(true),
                        "No" => Some(false),
                        _ => None,
                    };
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                    if let Some(b) = b {
                        match k.as_str() {
                            "ImmediateData" => self.result.immediate_data = b,
                            "InitialR2T" => self.result.initial_r2t = b,
                            _ => {}
                        }
                    }
                }
                "FirstBurstLength" | "MaxBurstLength" => {
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                    // "Irrelevant" (no unsolicited data at all) keeps the default.
                    if let Ok(n) = parse_number(v) {
                        let n = n.clamp(512, 16_777_215) as u32;
                        if k == "FirstBurstLength" {
                            self.result.first_burst = n;
                        } else {
                            self.result.max_burst = n;
                        }
                    }
                }
                "MaxOutstandingR2T" | "MaxConnections" | "ErrorRecoveryLevel"
                | "DefaultTime2Wait" | "DefaultTime2Retain" | "OFMarker" | "IFMarker" => {
                    if !answer_to_ours {
                        // Accepting the offered value is a valid answer for each of these
                        // (min, max or boolean functions).
                        answers.push((k.clone(), v.clone()));
                    }
                }
                "AuthMethod" if self.chap && answer_to_ours => {
                    if v != "CHAP" {
                        return Err(format!("the target refused AuthMethod=CHAP (answered {v})"));
                    }
                }
                "AuthMethod" => {
                    if !answer_to_ours {
                        let none = v.split(',').any(|m| m == "None");
                        answers.push((k.clone(), if none { "None" } else { "Reject" }.into()));
                    }
                    if v != "None" && !v.split(',').any(|m| m == "None") {
                        return Err(format!(
                            "the target requires authentication (AuthMethod={v}): give --chap USER:SECRET"
                        ));
                    }
                }
                "RDMAExtensions" if self.iser => {
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                    self.iser_result.rdma_extensions = v == "Yes";
                }
                "TargetRecvDataSegmentLength" | "InitiatorRecvDataSegmentLength" if self.iser => {
                    let n = number(k, v)?;
                    if !(512..=16_777_215).contains(&n) {
                        return Err(format!("the target sent {k}={n}, outside 512..16777215"));
                    }
                    let ours = if k == "TargetRecvDataSegmentLength" {
                        OUR_TARGET_RECV_DSL
                    } else {
                        OUR_INITIATOR_RECV_DSL
                    };
                    // Minimum: an answer above our proposal is the target's error; use ours.
                    let n = (n as u32).min(ours);
                    if !answer_to_ours {
                        answers.push((k.clone(), n.to_string()));
                    }
                    if k == "TargetRecvDataSegmentLength" {
                        self.iser_result.target_recv_dsl = n;
                    } else {
                        self.iser_result.initiator_recv_dsl = n;
                    }
                }
                "MaxOutstandingUnexpectedPDUs" if self.iser => {
                    let n = number(k, v)?;
                    if n == 1 || n > u32::MAX as u64 {
                        return Err(format!("the target sent {k}={n}, not 0 or 2..2^32-1"));
                    }
                    if !answer_to_ours {
                        // MinOrZero with our 0 (no limit): the target's value.
                        answers.push((k.clone(), v.clone()));
                    }
                    self.iser_result.max_outstanding_unexpected_pdus = n as u32;
                }
                "MaxAHSLength" if self.iser => {
                    if !answer_to_ours {
                        answers.push((k.clone(), v.clone()));
                    }
                }
                "iSERHelloRequired" | "TaggedBufferForSolicitedDataOnly" if self.iser => {
                    if k == "iSERHelloRequired" && answer_to_ours {
                        // OR (RFC 7145 §6.4): our Yes stands whatever the answer; the target
                        // says Yes, or something a Hello would confuse.
                        self.iser_result.hello_required = v == "Yes";
                    }
                    if !answer_to_ours {
                        answers.push((k.clone(), "No".into()));
                    }
                }
                "RDMAExtensions" | "iSERHelloRequired" => {
                    if !answer_to_ours {
                        answers.push((k.clone(), "No".into()));
                    }
                }
                _ => {
                    if !answer_to_ours
                        && !matches!(v.as_str(), "NotUnderstood" | "Irrelevant" | "Reject")
                    {
                        answers.push((k.clone(), "NotUnderstood".into()));
                    }
                }
            }
        }
        self.proposed.extend(answers.iter().map(|(k, _)| k.clone()));
        Ok(answers)
    }
}

fn number(k: &str, v: &str) -> Result<u64, String> {
    parse_number(v).map_err(|_| format!("the target sent {k}={v}, not a number"))
}

/// What a Login Response status other than success means, for messages.
pub fn login_status_text(class: u8, detail: u8) -> String {
    let what = match (class, detail) {
        (1, 1) | (1, 2) => "the target moved (redirection is not supported by riser-perf)",
        (2, 1) => "authentication failed",
        (2, 2) => "authorization failure: this initiator may not access the target (ACL?)",
        (2, 3) => "target not found: check the IQN in the URL",
        (2, 4) => "the target was removed",
        (2, 5) => "unsupported iSCSI version",
        (2, 6) => "too many connections",
        (2, 7) => "missing parameter",
        (2, 8) => "cannot include in session",
        (2, 9) => "session type not supported",
        (2, 10) => "session does not exist",
        (2, 11) => "invalid request during login",
        (2, _) => "initiator error",
        (3, 1) => "service unavailable",
        (3, 2) => "the target is out of resources",
        (3, _) => "target error",
        _ => "unknown status",
    };
    format!("login refused: {what} (status class {class:#04x}, detail {detail:#04x})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn answers_to_our_proposals_set_the_result() {
        let mut n = KeyNegotiation::new(false, false);
        let prop = n.operational_proposal();
        assert!(prop.iter().any(|(k, v)| k == "InitialR2T" && v == "No"));
        let ans = n
            .take_response(&pairs(&[
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("MaxRecvDataSegmentLength", "65536"),
                ("ImmediateData", "Yes"),
                ("InitialR2T", "Yes"),
                ("FirstBurstLength", "65536"),
                ("MaxBurstLength", "262144"),
                ("TargetPortalGroupTag", "1"),
            ]))
            .unwrap();
        assert!(ans.is_empty(), "{ans:?}");
        let r = n.result;
        assert_eq!(r.max_send_dsl, 65536);
        assert!(r.immediate_data && r.initial_r2t);
        assert_eq!((r.first_burst, r.max_burst), (65536, 262144));
    }

    #[test]
    fn offers_are_answered() {
        let mut n = KeyNegotiation::new(true, false);
        let ans = n
            .take_response(&pairs(&[
                ("HeaderDigest", "None,CRC32C"),
                ("DataDigest", "CRC32C,None"),
                ("ImmediateData", "No"),
                ("MaxOutstandingR2T", "4"),
                ("X-com.example.Thing", "1"),
                ("RDMAExtensions", "Yes"),
                ("AuthMethod", "CHAP,None"),
            ]))
            .unwrap();
        assert_eq!(
            ans,
            pairs(&[
                ("HeaderDigest", "CRC32C"),
                ("DataDigest", "None"),
                ("ImmediateData", "No"),
                ("MaxOutstandingR2T", "4"),
                ("X-com.example.Thing", "NotUnderstood"),
                ("RDMAExtensions", "No"),
                ("AuthMethod", "None"),
            ])
        );
        assert!(n.result.header_digest && !n.result.data_digest && !n.result.immediate_data);
    }

    #[test]
    fn unsolicited_data_follows_the_keys() {
        let n = |immediate_data, initial_r2t| Negotiated {
            immediate_data,
            initial_r2t,
            max_send_dsl: 8192,
            first_burst: 65536,
            ..Negotiated::default()
        };
        // (unsolicited in all, of which immediate) for a 64 KiB and a 4 KiB write.
        assert_eq!(n(true, false).unsolicited(65536), (65536, 8192));
        assert_eq!(n(false, false).unsolicited(65536), (65536, 0));
        assert_eq!(n(true, true).unsolicited(65536), (8192, 8192));
        assert_eq!(n(false, true).unsolicited(65536), (0, 0));
        assert_eq!(n(true, true).unsolicited(4096), (4096, 4096));
        assert_eq!(n(true, false).unsolicited(1 << 20), (65536, 8192));
    }

    #[test]
    fn refusals_are_errors() {
        let mut n = KeyNegotiation::new(true, false);
        n.operational_proposal();
        let e = n
            .take_response(&pairs(&[("HeaderDigest", "None")]))
            .unwrap_err();
        assert!(e.contains("HeaderDigest=CRC32C"), "{e}");
        let mut n = KeyNegotiation::new(false, false);
        let e = n
            .take_response(&pairs(&[("AuthMethod", "CHAP")]))
            .unwrap_err();
        assert!(e.contains("CHAP"), "{e}");
        let e = n
            .take_response(&pairs(&[("MaxRecvDataSegmentLength", "12")]))
            .unwrap_err();
        assert!(e.contains("MaxRecvDataSegmentLength"), "{e}");
        assert!(login_status_text(2, 3).contains("target not found"));
    }

    #[test]
    fn iser_key_negotiation() {
        let mut n = KeyNegotiation::new_iser();
        let prop = n.operational_proposal();
        let get = |k: &str| prop.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RDMAExtensions"), Some("Yes"));
        assert_eq!(get("HeaderDigest"), Some("None"));
        assert_eq!(get("DataDigest"), Some("None"));
        assert_eq!(get("InitiatorRecvDataSegmentLength"), Some("8192"));
        assert_eq!(get("TargetRecvDataSegmentLength"), Some("8192"));
        assert_eq!(get("MaxOutstandingUnexpectedPDUs"), Some("0"));
        assert_eq!(get("InitialR2T"), Some("Yes"));
        assert_eq!(
            get("MaxRecvDataSegmentLength"),
            None,
            "replaced by the iSER keys"
        );
        // riser's answers (lib/iscsi negotiate.rs) and a declared MaxRecvDataSegmentLength.
        let ans = n
            .take_response(&pairs(&[
                ("HeaderDigest", "None"),
                ("DataDigest", "None"),
                ("RDMAExtensions", "Yes"),
                ("InitiatorRecvDataSegmentLength", "8192"),
                ("TargetRecvDataSegmentLength", "4096"),
                ("MaxOutstandingUnexpectedPDUs", "NotUnderstood"),
                ("ImmediateData", "Yes"),
                ("InitialR2T", "Yes"),
                ("FirstBurstLength", "65536"),
                ("MaxRecvDataSegmentLength", "262144"),
            ]))
            .unwrap();
        assert!(ans.is_empty(), "{ans:?}");
        assert_eq!(
            n.iser_result,
            IserKeys {
                rdma_extensions: true,
                target_recv_dsl: 4096,
                initiator_recv_dsl: 8192,
                max_outstanding_unexpected_pdus: 0,
                hello_required: false,
            }
        );

        // Our iSERHelloRequired=Yes (--iser-hello), answered Yes: the Hello is due.
        let mut n = KeyNegotiation::new_iser_with(vec![("iSERHelloRequired".into(), "Yes".into())]);
        assert!(n.operational_proposal().contains(&("iSERHelloRequired".into(), "Yes".into())));
        n.take_response(&pairs(&[("RDMAExtensions", "Yes"), ("iSERHelloRequired", "Yes")])).unwrap();
        assert!(n.iser_result.hello_required);
        assert!(n.result.immediate_data && n.result.initial_r2t);
        assert_eq!(n.result.first_burst, 65536);

        // Offers from the target are answered (Minimum keys at most our value).
        let mut n = KeyNegotiation::new_iser();
        let ans = n
            .take_response(&pairs(&[
                ("RDMAExtensions", "Yes"),
                ("TargetRecvDataSegmentLength", "1048576"),
                ("InitiatorRecvDataSegmentLength", "262144"),
                ("MaxOutstandingUnexpectedPDUs", "32"),
                ("iSERHelloRequired", "Yes"),
                ("MaxAHSLength", "256"),
            ]))
            .unwrap();
        assert_eq!(
            ans,
            pairs(&[
                ("RDMAExtensions", "Yes"),
                ("TargetRecvDataSegmentLength", "8192"),
                ("InitiatorRecvDataSegmentLength", "8192"),
                ("MaxOutstandingUnexpectedPDUs", "32"),
                ("iSERHelloRequired", "No"),
                ("MaxAHSLength", "256"),
            ])
        );
        assert_eq!(n.iser_result.target_recv_dsl, 8192);
        assert_eq!(n.iser_result.initiator_recv_dsl, 8192);
        assert_eq!(n.iser_result.max_outstanding_unexpected_pdus, 32);

        // A refusal and bad values.
        let mut n = KeyNegotiation::new_iser();
        n.operational_proposal();
        n.take_response(&pairs(&[("RDMAExtensions", "No")]))
            .unwrap();
        assert!(!n.iser_result.rdma_extensions);
        n.take_response(&pairs(&[("RDMAExtensions", "NotUnderstood")]))
            .unwrap();
        assert!(!n.iser_result.rdma_extensions);
        assert!(n
            .take_response(&pairs(&[("TargetRecvDataSegmentLength", "100")]))
            .unwrap_err()
            .contains("outside"));
        assert!(n
            .take_response(&pairs(&[("MaxOutstandingUnexpectedPDUs", "1")]))
            .unwrap_err()
            .contains("MaxOutstandingUnexpectedPDUs"));
        // On TCP the iSER keys stay refused.
        let mut t = KeyNegotiation::new(false, false);
        let ans = t
            .take_response(&pairs(&[
                ("RDMAExtensions", "Yes"),
                ("TargetRecvDataSegmentLength", "8192"),
            ]))
            .unwrap();
        assert_eq!(
            ans,
            pairs(&[
                ("RDMAExtensions", "No"),
                ("TargetRecvDataSegmentLength", "NotUnderstood")
            ])
        );
    }
}
