//! iSCSI subcommands (rpc.py's `rpc/iscsi.py`): rpc.py-style list arguments and their
//! parsers, portal/initiator/auth groups, target nodes, CHAP, ALUA. The parameters are
//! riser-config's types, each defined beside its handler; the args structs here build them
//! from rpc.py's arguments (list strings, CHAP secret strings, ALUA group strings), and the
//! types whose fields are the arguments are subcommands themselves (`Cmd` names them).

use clap::builder::PossibleValuesParser;
use clap::Args;
use riser_config::node::alua::{AluaGroupParam, IscsiTargetNodeSetAlua as SetAlua};
use riser_config::portal_group::{PortParam, PortalParam};
use riser_config::target_node::{LunParam, PgIgMap};
use riser_config::{auth_group, initiator_group, options, portal_group, target_node};
use riser_scsi::{AccessState, Failback};

use crate::UsageError;

// ---- iSCSI ------------------------------------------------------------------------------

/// Splits an rpc.py-style list argument: items separated by whitespace (rpc.py's form,
/// `'a b'`) and/or commas (`a,b`). Empty items are dropped, so `''` is an empty list.
pub(crate) fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| c.is_whitespace() || c == ',').filter(|t| !t.is_empty())
}

/// A list argument parsed into items: one command-line argument, sent as a JSON array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct List<T>(pub(crate) Vec<T>);

/// A portal group / initiator group tag: a whole number (the server checks its range).
pub(crate) fn parse_tag(s: &str) -> Result<u32, String> {
    s.trim().parse::<u32>().map_err(|_| format!("{s:?} is not a tag (a whole number, 1 or more)"))
}

/// One portal of `iscsi_create_portal_group` as typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PortalArg {
    pub(crate) host: String,
    /// A string, as rpc.py sends it.
    pub(crate) port: String,
    pub(crate) iser: bool,
    /// rpc.py's old `@CPUMASK` suffix, accepted and ignored (with a warning) as rpc.py does.
    pub(crate) ignored_cpumask: Option<String>,
}

impl PortalArg {
    /// What is sent (the CPU mask is not).
    pub(crate) fn param(&self) -> PortalParam {
        PortalParam { host: self.host.clone(), port: PortParam(self.port.clone()), iser: self.iser }
    }
}

/// `HOST:PORT`, `[IPv6]:PORT`, with an optional `@iser` suffix (riser's extension: an iSER
/// portal). The port is after the last colon, as rpc.py splits it; an IPv6 host must be in
/// brackets so that split is not ambiguous.
pub(crate) fn parse_portal(item: &str) -> Result<PortalArg, String> {
    let (addr, suffix) = match item.split_once('@') {
        Some((a, s)) => (a, Some(s)),
        None => (item, None),
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("portal {item:?} is not HOST:PORT (e.g. 127.0.0.1:3260 or [::1]:3260)"))?;
    if host.is_empty() {
        return Err(format!("portal {item:?} has no host (e.g. 127.0.0.1:3260 or [::1]:3260)"));
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!("portal {item:?}: an IPv6 host must be in brackets, e.g. [::1]:3260"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("portal {item:?}: {port:?} is not a port number (1..=65535)")),
    }
    let (iser, ignored_cpumask) = match suffix {
        None => (false, None),
        Some(s) if s.eq_ignore_ascii_case("iser") => (true, None),
        Some("") => return Err(format!("portal {item:?}: nothing after '@' (only @iser is known)")),
        // rpc.py's HOST:PORT@CPUMASK: a mask is a number (0x3, 3) or a list ([0,1]).
        Some(s) if s.starts_with("0x") || s.starts_with('[') || s.bytes().all(|b| b.is_ascii_digit()) => {
            (false, Some(s.to_string()))
        }
        Some(s) => return Err(format!("portal {item:?}: unknown suffix @{s} (only @iser is known)")),
    };
    Ok(PortalArg { host: host.to_string(), port: port.to_string(), iser, ignored_cpumask })
}

/// A list of portals: `'HOST:PORT HOST:PORT'` or `HOST:PORT,HOST:PORT`.
pub(crate) fn parse_portals(s: &str) -> Result<List<PortalArg>, String> {
    split_list(s).map(parse_portal).collect::<Result<_, _>>().map(List)
}

/// `'BDEV:LUN BDEV:LUN'` (rpc.py's form), each optionally followed by riser's LUN options
/// `:removable` and `:read_only`; the LUN id is after the last colon that is not an option.
pub(crate) fn parse_luns(s: &str) -> Result<List<LunParam>, String> {
    split_list(s)
        .map(|item| {
            let (mut rest, mut removable, mut read_only) = (item, false, false);
            loop {
                match rest.rsplit_once(':') {
                    Some((r, "removable")) => (rest, removable) = (r, true),
                    Some((r, "read_only")) => (rest, read_only) = (r, true),
                    _ => break,
                }
            }
            let (bdev, id) =
                rest.rsplit_once(':').ok_or_else(|| format!("LUN {item:?} is not BDEV:LUN_ID (e.g. Malloc0:0)"))?;
            if bdev.is_empty() {
                return Err(format!("LUN {item:?} has no bdev name (BDEV:LUN_ID, e.g. Malloc0:0)"));
            }
            let lun_id = id
                .parse::<u32>()
                .map_err(|_| format!("LUN {item:?}: {id:?} is not a LUN id (a whole number, 0 or more)"))?;
            Ok(LunParam { bdev_name: bdev.to_string(), lun_id, removable, read_only })
        })
        .collect::<Result<_, _>>()
        .map(List)
}

/// `'PG:IG PG:IG'` (rpc.py's form), e.g. `'1:1 2:1'`.
pub(crate) fn parse_pg_ig_maps(s: &str) -> Result<List<PgIgMap>, String> {
    split_list(s)
        .map(|item| {
            let bad = || format!("map {item:?} is not PG_TAG:IG_TAG (two whole numbers, e.g. 1:1)");
            let (pg, ig) = item.split_once(':').ok_or_else(bad)?;
            Ok(PgIgMap { pg_tag: pg.parse().map_err(|_| bad())?, ig_tag: ig.parse().map_err(|_| bad())? })
        })
        .collect::<Result<_, _>>()
        .map(List)
}

/// `'A B'` as a list of words (initiator names, netmasks).
pub(crate) fn parse_words(s: &str) -> Result<List<String>, String> {
    Ok(List(split_list(s).map(str::to_string).collect()))
}

#[derive(Args, Debug)]
pub(crate) struct IscsiSetOptions {
    /// Path of the CHAP secret file
    #[arg(short = 'f', long)]
    pub(crate) auth_file: Option<String>,
    /// Prefix of target node names given without iqn./eui./naa.
    #[arg(short = 'b', long)]
    pub(crate) node_base: Option<String>,
    /// Seconds an initiator has to answer a NOP-In
    #[arg(short = 'o', long)]
    pub(crate) nop_timeout: Option<u32>,
    /// Seconds between NOP-Ins sent by the target
    #[arg(short = 'n', long)]
    pub(crate) nop_in_interval: Option<u32>,
    /// No CHAP for discovery sessions (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    pub(crate) disable_chap: bool,
    /// CHAP required for discovery sessions (exclusive with --disable-chap)
    #[arg(short = 'r', long)]
    pub(crate) require_chap: bool,
    /// Mutual CHAP for discovery sessions
    #[arg(short = 'm', long)]
    pub(crate) mutual_chap: bool,
    /// Authentication group of discovery sessions
    #[arg(short = 'g', long)]
    pub(crate) chap_group: Option<u32>,
    /// Most sessions in the target
    #[arg(short = 'a', long)]
    pub(crate) max_sessions: Option<u32>,
    /// Most outstanding commands per queue
    #[arg(short = 'q', long)]
    pub(crate) max_queue_depth: Option<u32>,
    /// MaxConnections offered
    #[arg(short = 'c', long)]
    pub(crate) max_connections_per_session: Option<u32>,
    /// DefaultTime2Wait offered
    #[arg(short = 'w', long)]
    pub(crate) default_time2wait: Option<u32>,
    /// DefaultTime2Retain offered
    #[arg(short = 'v', long)]
    pub(crate) default_time2retain: Option<u32>,
    /// FirstBurstLength offered
    #[arg(short = 's', long)]
    pub(crate) first_burst_length: Option<u32>,
    /// ImmediateData=Yes offered
    #[arg(short = 'i', long, conflicts_with = "no_immediate_data")]
    pub(crate) immediate_data: bool,
    /// ImmediateData=No offered (riser's addition; rpc.py can only turn it on)
    #[arg(long)]
    pub(crate) no_immediate_data: bool,
    /// ErrorRecoveryLevel offered
    #[arg(short = 'l', long)]
    pub(crate) error_recovery_level: Option<u32>,
    /// Allow an initiator several sessions with the same ISID
    #[arg(short = 'p', long)]
    pub(crate) allow_duplicated_isid: bool,
    /// Most outstanding split reads per connection
    #[arg(short = 'x', long)]
    pub(crate) max_large_datain_per_connection: Option<u32>,
    /// MaxOutstandingR2T offered
    #[arg(short = 'k', long)]
    pub(crate) max_r2t_per_connection: Option<u32>,
    /// PDU pool size (accepted for SPDK compatibility)
    #[arg(short = 'u', long)]
    pub(crate) pdu_pool_size: Option<u32>,
    /// Immediate data buffer pool size (accepted for SPDK compatibility)
    #[arg(short = 'j', long)]
    pub(crate) immediate_data_pool_size: Option<u32>,
    /// Data-Out buffer pool size (accepted for SPDK compatibility)
    #[arg(short = 'z', long)]
    pub(crate) data_out_pool_size: Option<u32>,
    /// Bytes a connection may queue for sending outside the I/O buffers before it stops
    /// reading (riser's extension)
    #[arg(long)]
    pub(crate) max_tx_queue_bytes: Option<u32>,
    /// Seconds a write's data may be overdue before its command fails (riser's extension)
    #[arg(long)]
    pub(crate) data_out_timeout: Option<u32>,
    /// Seconds a login may take (riser)
    #[arg(long)]
    pub(crate) login_timeout: Option<u32>,
    /// Most logins in progress (riser)
    #[arg(long)]
    pub(crate) max_logins: Option<u32>,
    /// Most logins in progress from one source address (riser)
    #[arg(long)]
    pub(crate) max_logins_per_source: Option<u32>,
    /// Most discovery sessions (riser)
    #[arg(long)]
    pub(crate) max_discovery_sessions: Option<u32>,
    /// Most discovery sessions from one source address, an IPv6 /64 counting as one (riser)
    #[arg(long)]
    pub(crate) max_discovery_sessions_per_source: Option<u32>,
    /// Seconds a discovery session may go without a PDU from the initiator before it is
    /// closed; 0: never (riser)
    #[arg(long)]
    pub(crate) discovery_idle_timeout: Option<u32>,
}

impl IscsiSetOptions {
    /// Only what was given is sent: each key present replaces the current value. Unlike
    /// rpc.py, a given 0 is sent too (rpc.py drops it, so it cannot set e.g. an
    /// error_recovery_level of 0).
    pub(crate) fn params(self) -> options::IscsiSetOptions {
        let flag = |b: bool| b.then_some(true);
        options::IscsiSetOptions {
            auth_file: self.auth_file,
            node_base: self.node_base,
            nop_timeout: self.nop_timeout,
            nop_in_interval: self.nop_in_interval,
            disable_chap: flag(self.disable_chap),
            require_chap: flag(self.require_chap),
            mutual_chap: flag(self.mutual_chap),
            chap_group: self.chap_group,
            max_sessions: self.max_sessions,
            max_connections_per_session: self.max_connections_per_session,
            max_queue_depth: self.max_queue_depth,
            default_time2wait: self.default_time2wait,
            default_time2retain: self.default_time2retain,
            first_burst_length: self.first_burst_length,
            immediate_data: if self.no_immediate_data { Some(false) } else { flag(self.immediate_data) },
            error_recovery_level: self.error_recovery_level,
            allow_duplicated_isid: flag(self.allow_duplicated_isid),
            max_large_datain_per_connection: self.max_large_datain_per_connection,
            max_r2t_per_connection: self.max_r2t_per_connection,
            pdu_pool_size: self.pdu_pool_size,
            immediate_data_pool_size: self.immediate_data_pool_size,
            data_out_pool_size: self.data_out_pool_size,
            max_tx_queue_bytes: self.max_tx_queue_bytes,
            data_out_timeout: self.data_out_timeout,
            login_timeout: self.login_timeout,
            max_logins: self.max_logins,
            max_logins_per_source: self.max_logins_per_source,
            max_discovery_sessions: self.max_discovery_sessions,
            max_discovery_sessions_per_source: self.max_discovery_sessions_per_source,
            discovery_idle_timeout: self.discovery_idle_timeout,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiTag {
    /// Group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
}

#[derive(Args, Debug)]
pub(crate) struct IscsiCreatePortalGroup {
    /// Portal group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
    // `help` rather than a doc comment: rustdoc would take [::1] for a link.
    #[arg(
        value_name = "HOST:PORT[@iser]",
        required = true,
        num_args = 1..,
        value_parser = parse_portals,
        help = "Portals, HOST:PORT separated by spaces or commas, IPv6 in brackets; a suffix @iser makes \
                an iSER portal. E.g. '127.0.0.1:3260 [::1]:3260' or 192.0.2.1:3260@iser"
    )]
    pub(crate) portals: Vec<List<PortalArg>>,
    /// Private group: its portals are not returned by discovery (SendTargets)
    #[arg(short = 'p', long)]
    pub(crate) private: bool,
    /// Do not listen until iscsi_start_portal_group
    #[arg(short = 'w', long)]
    pub(crate) wait: bool,
}

impl IscsiCreatePortalGroup {
    /// Several list arguments (`a b` given as two arguments, or `'a b'` as one) are sent as
    /// one list.
    pub(crate) fn params(&self) -> portal_group::IscsiCreatePortalGroup {
        portal_group::IscsiCreatePortalGroup {
            tag: self.tag,
            portals: self.portals.iter().flat_map(|l| &l.0).map(PortalArg::param).collect(),
            private: self.private,
            wait: self.wait,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiCreateInitiatorGroup {
    /// Initiator group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
    /// Initiator names separated by spaces, e.g. 'ANY' or 'iqn.2016-06.io.spdk:host1 !iqn.2016-06.io.spdk:host2'
    #[arg(value_name = "INITIATORS", value_parser = parse_words)]
    pub(crate) initiators: List<String>,
    #[arg(
        value_name = "NETMASKS",
        value_parser = parse_words,
        help = "Netmasks separated by spaces, e.g. 'ANY' or '192.168.1.0/24 [::1]/128'"
    )]
    pub(crate) netmasks: List<String>,
}

impl IscsiCreateInitiatorGroup {
    pub(crate) fn params(self) -> initiator_group::IscsiCreateInitiatorGroup {
        initiator_group::IscsiCreateInitiatorGroup { tag: self.tag, initiators: self.initiators.0, netmasks: self.netmasks.0 }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiChangeInitiatorGroup {
    /// Initiator group tag
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
    /// Initiator names separated by spaces
    #[arg(short = 'n', long, value_name = "INITIATORS", value_parser = parse_words)]
    pub(crate) initiators: Option<List<String>>,
    /// Netmasks separated by spaces
    #[arg(short = 'm', long, value_name = "NETMASKS", value_parser = parse_words)]
    pub(crate) netmasks: Option<List<String>>,
}

impl IscsiChangeInitiatorGroup {
    pub(crate) fn params(self) -> initiator_group::IscsiChangeInitiatorGroup {
        initiator_group::IscsiChangeInitiatorGroup {
            tag: self.tag,
            initiators: self.initiators.map(|l| l.0),
            netmasks: self.netmasks.map(|l| l.0),
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiCreateTargetNode {
    /// Target node name: a full iqn./eui./naa. name, or a short one put after node_base
    pub(crate) name: String,
    /// Target alias
    pub(crate) alias_name: String,
    /// LUNs, BDEV:LUN_ID separated by spaces, e.g. 'Malloc0:0 Malloc1:1'; riser's LUN options
    /// follow as ':removable' (a removable medium) and ':read_only' (write-protected), e.g.
    /// 'Malloc0:0 Malloc1:1:removable'
    #[arg(value_name = "BDEV:LUN ...", value_parser = parse_luns)]
    pub(crate) luns: List<LunParam>,
    /// Portal group to initiator group maps, PG_TAG:IG_TAG separated by spaces, e.g. '1:1 2:1'
    #[arg(value_name = "PG:IG ...", value_parser = parse_pg_ig_maps)]
    pub(crate) pg_ig_maps: List<PgIgMap>,
    /// Most outstanding commands per session
    pub(crate) queue_depth: u32,
    /// CHAP disabled for this node (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    pub(crate) disable_chap: bool,
    /// CHAP required for this node
    #[arg(short = 'r', long)]
    pub(crate) require_chap: bool,
    /// Mutual (bidirectional) CHAP
    #[arg(short = 'm', long)]
    pub(crate) mutual_chap: bool,
    /// Authentication group of this node
    #[arg(short = 'g', long)]
    pub(crate) chap_group: Option<u32>,
    /// Require HeaderDigest=CRC32C
    #[arg(short = 'H', long)]
    pub(crate) header_digest: bool,
    /// Require DataDigest=CRC32C
    #[arg(short = 'D', long)]
    pub(crate) data_digest: bool,
}

impl IscsiCreateTargetNode {
    pub(crate) fn params(self) -> target_node::IscsiCreateTargetNode {
        target_node::IscsiCreateTargetNode {
            name: self.name,
            alias_name: Some(self.alias_name),
            pg_ig_maps: self.pg_ig_maps.0,
            luns: self.luns.0,
            queue_depth: Some(self.queue_depth),
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
            chap_group: self.chap_group,
            header_digest: self.header_digest,
            data_digest: self.data_digest,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiNodeMaps {
    /// Target node name
    pub(crate) name: String,
    /// PG_TAG:IG_TAG pairs separated by spaces, e.g. '1:1 2:1'
    #[arg(value_name = "PG:IG ...", value_parser = parse_pg_ig_maps)]
    pub(crate) pg_ig_maps: List<PgIgMap>,
}

#[derive(Args, Debug)]
pub(crate) struct IscsiNodeName {
    /// Target node name, e.g. iqn.2016-06.io.riser:disk1
    pub(crate) name: String,
}

// ---- CHAP ---------------------------------------------------------------------------------

#[derive(Args, Debug)]
pub(crate) struct IscsiSetDiscoveryAuth {
    /// No CHAP for discovery sessions (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    pub(crate) disable_chap: bool,
    /// CHAP required for discovery sessions (exclusive with --disable-chap)
    #[arg(short = 'r', long)]
    pub(crate) require_chap: bool,
    /// Mutual CHAP for discovery sessions (needs --require-chap)
    #[arg(short = 'm', long)]
    pub(crate) mutual_chap: bool,
    /// Auth group of discovery sessions
    #[arg(short = 'g', long, value_name = "TAG", value_parser = parse_tag)]
    pub(crate) chap_group: Option<u32>,
}

impl IscsiSetDiscoveryAuth {
    pub(crate) fn params(self) -> options::IscsiSetDiscoveryAuth {
        options::IscsiSetDiscoveryAuth {
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
            chap_group: self.chap_group.unwrap_or(0),
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiTargetNodeSetAuth {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub(crate) name: String,
    /// Auth group of this node
    #[arg(short = 'g', long, value_name = "TAG", value_parser = parse_tag)]
    pub(crate) chap_group: Option<u32>,
    /// CHAP disabled for this node (exclusive with --require-chap)
    #[arg(short = 'd', long, conflicts_with = "require_chap")]
    pub(crate) disable_chap: bool,
    /// CHAP required for this node
    #[arg(short = 'r', long)]
    pub(crate) require_chap: bool,
    /// Mutual (bidirectional) CHAP (needs --require-chap)
    #[arg(short = 'm', long)]
    pub(crate) mutual_chap: bool,
}

impl IscsiTargetNodeSetAuth {
    pub(crate) fn params(self) -> target_node::IscsiTargetNodeSetAuth {
        target_node::IscsiTargetNodeSetAuth {
            name: self.name,
            chap_group: self.chap_group.unwrap_or(0),
            disable_chap: self.disable_chap,
            require_chap: self.require_chap,
            mutual_chap: self.mutual_chap,
        }
    }
}

/// Secrets are parsed after clap, by [`parse_secrets`], so that no error message (clap's
/// quote the value) shows them.
#[derive(Args)]
pub(crate) struct IscsiCreateAuthGroup {
    /// Auth group tag (a whole number, 1 or more)
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
    /// CHAP secrets, rpc.py's form: 'user:U1 secret:S1 muser:MU1 msecret:MS1,user:U2 secret:S2'
    /// (comma-separated; muser/msecret for mutual CHAP; riser's initiator_group:IG binds the user
    /// to that initiator group's names). A secret may hold ':', not a space or ','
    #[arg(short = 'c', long, value_name = "SECRETS")]
    pub(crate) secrets: Option<String>,
}

impl std::fmt::Debug for IscsiCreateAuthGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiCreateAuthGroup").field("tag", &self.tag).finish_non_exhaustive()
    }
}

impl IscsiCreateAuthGroup {
    pub(crate) fn params(self) -> Result<auth_group::IscsiCreateAuthGroup, UsageError> {
        let secrets = parse_secrets(self.secrets.as_deref().unwrap_or_default())?;
        Ok(auth_group::IscsiCreateAuthGroup { tag: self.tag, secrets })
    }
}

/// rpc.py's `-c` secrets: items separated by commas, each `KEY:VALUE` words separated by
/// whitespace, keys `user`, `secret` (both required), `muser`, `msecret`, and riser's
/// `initiator_group` (a tag); a value runs from
/// the first ':' (rpc.py refuses a ':' in it). An empty text is no secrets. Errors name the
/// item and word, never a value.
pub(crate) fn parse_secrets(text: &str) -> Result<Vec<auth_group::AuthSecretParam>, UsageError> {
    let items = text.split(',').map(str::trim).filter(|i| !i.is_empty());
    let mut out = Vec::new();
    for (n, item) in items.enumerate() {
        let n = n + 1;
        let (mut user, mut secret, mut muser, mut msecret, mut ig) = (None, None, None, None, None);
        for (w, word) in item.split_whitespace().enumerate() {
            let w = w + 1;
            let bad = |what: &str| UsageError(format!("--secrets item {n}, word {w}: {what}"));
            let (key, value) =
                word.split_once(':').ok_or_else(|| bad("not KEY:VALUE (user:, secret:, muser:, msecret:, initiator_group:)"))?;
            let slot = match key {
                "user" => &mut user,
                "secret" => &mut secret,
                "muser" => &mut muser,
                "msecret" => &mut msecret,
                "initiator_group" => &mut ig,
                _ => return Err(bad("unknown key (user, secret, muser, msecret or initiator_group)")),
            };
            if slot.replace(value.to_string()).is_some() {
                return Err(bad(&format!("{key} given twice")));
            }
        }
        let missing = |key: &str| UsageError(format!("--secrets item {n}: no {key}:"));
        let user = user.ok_or_else(|| missing("user"))?;
        let secret = secret.ok_or_else(|| missing("secret"))?;
        let initiator_group = match ig {
            None => None,
            Some(t) => Some(parse_tag(&t).map_err(|_| UsageError(format!("--secrets item {n}: initiator_group: not a tag")))?),
        };
        out.push(auth_group::AuthSecretParam {
            user,
            secret: secret.into(),
            muser,
            msecret: msecret.map(Into::into),
            initiator_group,
        });
    }
    Ok(out)
}

#[derive(Args)]
pub(crate) struct IscsiAuthGroupAddSecret {
    /// Auth group tag
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
    /// CHAP user name of the initiator (CHAP_N)
    #[arg(short = 'u', long)]
    pub(crate) user: String,
    /// CHAP secret of that user
    #[arg(short = 's', long)]
    pub(crate) secret: String,
    /// User name the target answers mutual CHAP with (needs --msecret)
    #[arg(short = 'm', long)]
    pub(crate) muser: Option<String>,
    /// Secret the target answers mutual CHAP with (needs --muser)
    #[arg(short = 'r', long)]
    pub(crate) msecret: Option<String>,
    /// riser's extension: the user may log in only as an initiator name this initiator group admits
    #[arg(short = 'i', long, value_parser = parse_tag)]
    pub(crate) initiator_group: Option<u32>,
}

impl std::fmt::Debug for IscsiAuthGroupAddSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiAuthGroupAddSecret")
            .field("tag", &self.tag)
            .field("user", &self.user)
            .field("muser", &self.muser)
            .finish_non_exhaustive()
    }
}

impl IscsiAuthGroupAddSecret {
    pub(crate) fn params(self) -> auth_group::IscsiAuthGroupAddSecret {
        auth_group::IscsiAuthGroupAddSecret {
            tag: self.tag,
            user: self.user,
            secret: self.secret.into(),
            muser: self.muser,
            msecret: self.msecret.map(Into::into),
            initiator_group: self.initiator_group,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct IscsiAuthGroupRemoveSecret {
    /// Auth group tag
    #[arg(value_parser = parse_tag)]
    pub(crate) tag: u32,
    /// CHAP user name whose secret goes
    #[arg(short = 'u', long)]
    pub(crate) user: String,
}

// ---- ALUA (riser's extension) ------------------------------------------------------------


#[derive(Args, Debug)]
pub(crate) struct IscsiTargetNodeSetAlua {
    /// Target node name (full, or as given to iscsi_create_target_node)
    pub(crate) name: String,
    /// Target port groups, each TPG:STATE[:pref][:PORT,PORT...] (TPG: the portal group tag;
    /// STATE: active_optimized, active_non_optimized, standby, unavailable, transitioning;
    /// PORTs: relative target port ids, default the TPG)
    pub(crate) groups: Vec<String>,
    /// When a fenced gateway's groups are served again: auto (return to these states) or
    /// manual (stay failed over until iscsi_target_node_alua_failback); omitted: unchanged
    #[arg(long, value_parser = PossibleValuesParser::new(Failback::ALL.map(Failback::name)))]
    pub(crate) failback: Option<String>,
}

impl IscsiTargetNodeSetAlua {
    pub(crate) fn params(self) -> Result<SetAlua, UsageError> {
        let mut groups = Vec::new();
        for g in &self.groups {
            let bad = |why: &str| UsageError(format!("group {g:?}: {why} (TPG:STATE[:pref][:PORT,PORT])"));
            let mut parts = g.split(':');
            let tpg_id: u32 = parts.next().unwrap_or_default().parse().map_err(|_| bad("TPG is not a number"))?;
            let state = parts.next().ok_or_else(|| bad("no STATE"))?;
            if AccessState::from_name(state).is_none() {
                let names: Vec<&str> = AccessState::ALL.iter().map(|a| a.name()).collect();
                return Err(bad(&format!("unknown STATE (one of {})", names.join(", "))));
            }
            let mut group = AluaGroupParam { tpg_id, state: state.to_string(), pref: false, rel_port_ids: Vec::new() };
            for part in parts {
                if part == "pref" {
                    group.pref = true;
                } else {
                    let ports: Result<Vec<u32>, _> = part.split(',').map(str::parse::<u32>).collect();
                    group.rel_port_ids = ports.map_err(|_| bad(&format!("{part:?} is neither pref nor a list of port ids")))?;
                }
            }
            groups.push(group);
        }
        Ok(SetAlua { name: self.name, groups, failback: self.failback })
    }
}

#[cfg(test)]
mod alua_cli_tests {
    use clap::{CommandFactory, FromArgMatches};
    use serde_json::{json, Value};

    use super::*;
    use crate::{Action, Cli};

    fn sent(args: &[&str]) -> Result<Option<Value>, String> {
        let argv = std::iter::once("riser-rpc").chain(args.iter().copied());
        let m = Cli::command().try_get_matches_from(argv).map_err(|e| e.to_string())?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
        match cli.cmd.into_action(args[0].to_string()) {
            Ok(Action::Call(_, p)) => Ok(p),
            Ok(_) => Err("not a call".into()),
            Err(UsageError(m)) => Err(m),
        }
    }

    #[test]
    fn alua_subcommands() {
        assert_eq!(
            sent(&["iscsi_target_node_set_alua", "gw", "1:active_optimized:pref", "2:standby:20,21"]),
            Ok(Some(json!({"name": "gw", "groups": [
                {"tpg_id": 1, "state": "active_optimized", "pref": true},
                {"tpg_id": 2, "state": "standby", "rel_port_ids": [20, 21]}]})))
        );
        assert_eq!(sent(&["iscsi_target_node_set_alua", "gw"]), Ok(Some(json!({"name": "gw", "groups": []}))));
        assert_eq!(
            sent(&["iscsi_target_node_set_alua", "gw", "--failback", "manual", "1:standby"]),
            Ok(Some(json!({"name": "gw", "groups": [{"tpg_id": 1, "state": "standby"}], "failback": "manual"})))
        );
        assert!(sent(&["iscsi_target_node_set_alua", "gw", "--failback", "never"]).is_err());
        assert_eq!(sent(&["iscsi_target_node_alua_failback", "gw"]), Ok(Some(json!({"name": "gw"}))));
        let e = sent(&["iscsi_target_node_set_alua", "gw", "1:offline"]).expect_err("unknown state");
        assert!(e.contains("unknown STATE"), "{e}");
        let e = sent(&["iscsi_target_node_set_alua", "gw", "x:standby"]).expect_err("bad tpg");
        assert!(e.contains("TPG is not a number"), "{e}");
        let e = sent(&["iscsi_target_node_set_alua", "gw", "1:standby:p"]).expect_err("bad part");
        assert!(e.contains("neither pref"), "{e}");
        assert_eq!(
            sent(&["iscsi_target_node_set_alua_state", "gw", "2", "standby"]),
            Ok(Some(json!({"name": "gw", "tpg_id": 2, "state": "standby"})))
        );
    }
}
