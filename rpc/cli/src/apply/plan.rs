//! The plan of `riser-rpc apply`: a pure function from (the running node's save_config, the
//! wanted one, its live sessions) to an ordered list of live RPC calls, with what each one
//! affects and what it needs `--force` for. No daemon here: [`make_plan`] is unit-tested.
//!
//! Each config section is one [`Section`] in [`SECTIONS`]: the save_config methods it owns
//! and a `diff` that pushes [`Step`]s, each tagged with a [`Phase`]. The plan is the steps
//! sorted by phase (stable: a section's own order holds within a phase), which gives the
//! safe order: devices exist before the LUNs that use them, LUNs and maps go before their
//! devices and groups are deleted. A method no section owns must be identical in both files.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{json, Value};

use super::sections;

/// When a step runs. The order of the variants is the order of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// iobuf_set_options, iscsi_set_options.
    Options,
    /// Deleting an unused device or group that is then created again (no live RPC changes it).
    ReplaceDelete,
    /// New Ceph clusters (the RBD devices name them).
    CreateCluster,
    /// New devices, portal, initiator and auth groups.
    Create,
    /// Resizes, initiators and secrets added.
    Grow,
    /// Device rate limits (`bdev_set_qos_limit`): after the devices exist, before the LUNs
    /// that export them are added.
    Qos,
    /// Redirects cleared and portal/initiator group maps removed from nodes.
    NodeUnmap,
    /// LUNs removed (or changed: removed, then added again).
    NodeRemoveLun,
    /// Target nodes deleted (gone, or replaced).
    NodeDelete,
    /// Target nodes created.
    NodeCreate,
    NodeAddLun,
    NodeMap,
    NodeAuth,
    NodeAlua,
    /// One initiator's rate limits on a LUN (`iscsi_target_node_set_qos_limit`): once the LUN is there.
    NodeQos,
    NodeRedirect,
    /// Initiators and secrets removed.
    Shrink,
    DeleteAuthGroup,
    DeleteInitiatorGroup,
    DeletePortalGroup,
    DeleteBdev,
    DeleteCluster,
}

/// What a step does to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Create,
    Change,
    Remove,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Create => "create",
            Kind::Change => "change",
            Kind::Remove => "remove",
        })
    }
}

/// One live RPC call of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub phase: Phase,
    pub kind: Kind,
    /// The section that made it ("bdevs", "target nodes", ...).
    pub section: &'static str,
    /// The object: `bdev Null1`, `LUN 1 of iqn.2016-06.io.riser:t1`.
    pub what: String,
    pub method: &'static str,
    pub params: Value,
    /// The live sessions it affects, described.
    pub sessions: Vec<String>,
    /// Why it is refused without `--force` (it removes a LUN or target with sessions on it).
    pub force: Option<String>,
}

impl Step {
    pub fn new(phase: Phase, kind: Kind, section: &'static str, what: impl Into<String>, method: &'static str, params: Value) -> Step {
        Step { phase, kind, section, what: what.into(), method, params, sessions: Vec::new(), force: None }
    }

    pub fn sessions(mut self, sessions: Vec<String>) -> Step {
        self.sessions = sessions;
        self
    }

    /// Refused without `--force` when `sessions` is not empty.
    pub fn forced_if_sessions(mut self, why: &str) -> Step {
        if !self.sessions.is_empty() {
            self.force = Some(format!("{why}: {}", self.sessions.join("; ")));
        }
        self
    }
}

/// One line: `[bdevs] create bdev Null1: bdev_null_create {"name":..}`, CHAP secrets and keys hidden.
impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} {}: {} {}", self.section, self.kind, self.what, self.method, redact(&self.params))
    }
}

/// `v` on one line with the values of secret-looking keys replaced by `***`.
pub fn redact(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let secret = ["secret", "msecret", "key", "password"].contains(&k.as_str());
                    (k.clone(), if secret { json!("***") } else { redact(v) })
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact).collect()),
        v => v.clone(),
    }
}

/// The ordered steps, and what cannot be done at all (whatever `--force` says).
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub refusals: Vec<String>,
}

impl Plan {
    pub fn push(&mut self, step: Step) {
        self.steps.push(step);
    }

    pub fn refuse(&mut self, why: impl Into<String>) {
        self.refusals.push(why.into());
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.refusals.is_empty()
    }

    /// The steps refused without `--force`.
    pub fn needs_force(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.force.is_some())
    }
}

/// One `{method, params}` of a configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub method: String,
    pub params: Value,
}

/// A configuration in save_config's shape, flattened: every call of every subsystem.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    pub calls: Vec<Call>,
}

impl Config {
    /// `{"subsystems":[{"subsystem":NAME,"config":[{"method":..,"params":..}]}]}`.
    pub fn from_json(v: &Value) -> Result<Config, String> {
        let subsystems = v.get("subsystems").and_then(Value::as_array).ok_or("no \"subsystems\" array at the top level")?;
        let mut calls = Vec::new();
        for s in subsystems {
            let name = s.get("subsystem").and_then(Value::as_str).unwrap_or("?");
            let list = match s.get("config") {
                None | Some(Value::Null) => continue,
                Some(Value::Array(list)) => list,
                Some(_) => return Err(format!("subsystem {name}: \"config\" is not an array")),
            };
            for (i, c) in list.iter().enumerate() {
                let method = c.get("method").and_then(Value::as_str).ok_or_else(|| format!("subsystem {name} entry {i}: no \"method\""))?;
                if riser_rpc::params::IGNORED_SPDK_METHODS.contains(&method) {
                    continue;
                }
                let params = c.get("params").cloned().unwrap_or(Value::Null);
                calls.push(Call { method: method.to_string(), params });
            }
        }
        Ok(Config { calls })
    }

    /// The calls of these methods, in order.
    pub fn of<'a>(&'a self, methods: &'a [&'a str]) -> impl Iterator<Item = &'a Call> + 'a {
        self.calls.iter().filter(move |c| methods.contains(&c.method.as_str()))
    }

    /// The node base names are completed with (iscsi_set_options' node_base).
    pub fn node_base(&self) -> String {
        self.of(&["iscsi_set_options"]).find_map(|c| c.params.get("node_base").and_then(Value::as_str)).unwrap_or("iqn.2016-06.io.riser").to_string()
    }
}

/// A live connection (from iscsi_get_connections).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Session {
    pub target: String,
    pub initiator: String,
    pub addr: String,
    pub tsih: u64,
    pub pg_tag: u64,
    /// Commands in flight.
    pub in_flight: u64,
}

impl Session {
    /// From one entry of iscsi_get_connections (fields missing: empty, 0).
    pub fn from_json(v: &Value) -> Session {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        Session {
            target: s("target_node_name"),
            initiator: s("initiator_name"),
            addr: s("initiator_addr"),
            tsih: n("tsih"),
            pg_tag: n("pg_tag"),
            in_flight: n("queue_depth"),
        }
    }

    pub fn describe(&self) -> String {
        format!("{} from {} (TSIH {}, portal group {}, {} command(s) in flight)", self.initiator, self.addr, self.tsih, self.pg_tag, self.in_flight)
    }
}

/// What the sections see: both configurations and the sessions.
pub struct Ctx<'a> {
    pub current: &'a Config,
    pub wanted: &'a Config,
    pub sessions: &'a [Session],
    node_base_current: String,
    node_base_wanted: String,
}

impl<'a> Ctx<'a> {
    pub fn new(current: &'a Config, wanted: &'a Config, sessions: &'a [Session]) -> Ctx<'a> {
        Ctx { current, wanted, sessions, node_base_current: current.node_base(), node_base_wanted: wanted.node_base() }
    }

    /// A node's full name, lower case (names compare case-insensitively), as the server
    /// completes a short one with node_base.
    pub fn node_key(&self, name: &str, wanted: bool) -> String {
        let lower = name.to_ascii_lowercase();
        if ["iqn.", "eui.", "naa."].iter().any(|p| lower.starts_with(p)) {
            lower
        } else {
            let base = if wanted { &self.node_base_wanted } else { &self.node_base_current };
            format!("{}:{lower}", base.to_ascii_lowercase())
        }
    }

    /// The sessions on node `key` (through portal group `pg` if given), described.
    pub fn sessions_on(&self, key: &str, pg: Option<u64>) -> Vec<String> {
        self.sessions
            .iter()
            .filter(|s| s.target.eq_ignore_ascii_case(key) && pg.is_none_or(|p| p == s.pg_tag))
            .map(|s| format!("{} on {}", s.describe(), s.target))
            .collect()
    }

    /// The running target nodes (iscsi_create_target_node params), by key.
    pub fn current_nodes(&self) -> BTreeMap<String, &'a Value> {
        self.current
            .of(&["iscsi_create_target_node"])
            .map(|c| (self.node_key(c.params.get("name").and_then(Value::as_str).unwrap_or_default(), false), &c.params))
            .collect()
    }

    /// The running nodes for which `pred` holds on their params, with their sessions.
    pub fn nodes_where(&self, pred: impl Fn(&Value) -> bool) -> (Vec<String>, Vec<String>) {
        let mut names = Vec::new();
        let mut sessions = Vec::new();
        for (key, p) in self.current_nodes() {
            if pred(p) {
                sessions.extend(self.sessions_on(&key, None));
                names.push(key);
            }
        }
        (names, sessions)
    }
}

/// One section of the configuration: the save_config methods it owns, and its diff.
pub struct Section {
    pub name: &'static str,
    pub methods: &'static [&'static str],
    pub diff: fn(&Ctx, &mut Plan),
}

/// Every section, in the order their steps are made (ordering across them is by [`Phase`]).
/// Adding one: a `Section` here, its steps in their phase.
pub const SECTIONS: &[Section] = &[
    sections::IOBUF,
    sections::ISCSI_OPTIONS,
    sections::BDEVS,
    sections::PORTAL_GROUPS,
    sections::PORTAL_GROUP_AUTH,
    sections::INITIATOR_GROUPS,
    sections::AUTH_GROUPS,
    super::nodes::TARGET_NODES,
    // Last: it looks at the steps the others made (a device or LUN created again).
    super::qos::QOS,
];

/// The plan that takes the node from `current` to `wanted`.
pub fn make_plan(current: &Config, wanted: &Config, sessions: &[Session]) -> Plan {
    let ctx = Ctx::new(current, wanted, sessions);
    let mut plan = Plan::default();
    for s in SECTIONS {
        let before = plan.steps.len();
        (s.diff)(&ctx, &mut plan);
        for step in &mut plan.steps[before..] {
            step.section = s.name;
        }
    }
    unowned(&ctx, &mut plan);
    plan.steps.sort_by_key(|s| s.phase);
    plan
}

/// Calls no section owns: the same in both files, or refused.
fn unowned(ctx: &Ctx, plan: &mut Plan) {
    let owned = |c: &&Call| !SECTIONS.iter().any(|s| s.methods.contains(&c.method.as_str()));
    let cur: Vec<&Call> = ctx.current.calls.iter().filter(owned).collect();
    let want: Vec<&Call> = ctx.wanted.calls.iter().filter(owned).collect();
    for c in &want {
        if !cur.contains(c) {
            plan.refuse(format!("{} {}: apply has no live change for this method", c.method, redact(&c.params)));
        }
    }
    for c in &cur {
        if !want.contains(c) {
            plan.refuse(format!(
                "{} {}: the node has it and the file does not; apply has no live change for this method",
                c.method,
                redact(&c.params)
            ));
        }
    }
}

/// The keys of `a` and `b` (objects) whose values differ, `ignore` left out.
pub fn changed_fields(a: &Value, b: &Value, ignore: &[&str]) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (a, b) = (a.as_object().unwrap_or(&empty), b.as_object().unwrap_or(&empty));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| !ignore.contains(&k.as_str()) && a.get(*k) != b.get(*k)).cloned().collect()
}

/// Calls of `methods` keyed by `key`; a key given twice is refused.
pub fn keyed<'a>(
    cfg: &'a Config,
    methods: &[&str],
    which: &str,
    plan: &mut Plan,
    key: impl Fn(&Call) -> Option<String>,
) -> BTreeMap<String, &'a Call> {
    let mut out = BTreeMap::new();
    for c in cfg.calls.iter().filter(|c| methods.contains(&c.method.as_str())) {
        match key(c) {
            Some(k) => {
                if out.insert(k.clone(), c).is_some() {
                    plan.refuse(format!("{which}: {k} is configured twice"));
                }
            }
            None => plan.refuse(format!("{which}: {} {} has no name or tag", c.method, redact(&c.params))),
        }
    }
    out
}
