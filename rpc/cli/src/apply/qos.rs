//! The rate limits of `apply`: a device's (`bdev_set_qos_limit`, SPDK's) and one initiator's
//! on a target's LUN (`iscsi_target_node_set_qos_limit`, riser's). Each is set to the file's
//! four values (a 0 removes that limit) when they differ from the node's, or when its device,
//! node or LUN is created (again) by this plan. A limit whose device or LUN goes away goes
//! with it. Runs after the other sections: it reads the steps they made.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::plan::{Config, Ctx, Kind, Phase, Plan, Section, Step};

pub const QOS: Section = Section { name: "qos", methods: &[DEVICE, INITIATOR], diff: qos };

const DEVICE: &str = "bdev_set_qos_limit";
const INITIATOR: &str = "iscsi_target_node_set_qos_limit";
const LIMITS: [&str; 4] = ["rw_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec"];

/// The four limits of a call's params, absent ones 0.
fn limits(p: &Value) -> Map<String, Value> {
    LIMITS.iter().map(|k| (k.to_string(), json!(p.get(*k).and_then(Value::as_u64).unwrap_or(0)))).collect()
}

fn no_limits() -> Map<String, Value> {
    limits(&Value::Null)
}

fn str_of<'a>(p: &'a Value, k: &str) -> Option<&'a str> {
    p.get(k).and_then(Value::as_str)
}

/// Device limits by device name.
fn device_limits(cfg: &Config, plan: &mut Plan) -> BTreeMap<String, Map<String, Value>> {
    let mut out = BTreeMap::new();
    for c in cfg.calls.iter().filter(|c| c.method == DEVICE) {
        match str_of(&c.params, "name") {
            Some(n) => {
                out.insert(n.to_string(), limits(&c.params));
            }
            None => plan.refuse(format!("{DEVICE} {}: no device name", c.params)),
        }
    }
    out
}

/// (node key, initiator name lower case, LUN) -> (initiator name as written, limits).
type InitiatorKey = (String, String, u64);

fn initiator_limits(ctx: &Ctx, cfg: &Config, wanted: bool, plan: &mut Plan) -> BTreeMap<InitiatorKey, (String, Map<String, Value>)> {
    let mut out = BTreeMap::new();
    for c in cfg.calls.iter().filter(|c| c.method == INITIATOR) {
        let (Some(node), Some(init), Some(lun)) =
            (str_of(&c.params, "name"), str_of(&c.params, "initiator_name"), c.params.get("lun_id").and_then(Value::as_u64))
        else {
            plan.refuse(format!("{INITIATOR} {}: name, initiator_name and lun_id are needed", c.params));
            continue;
        };
        out.insert((ctx.node_key(node, wanted), init.to_lowercase(), lun), (init.to_string(), limits(&c.params)));
    }
    out
}

/// Whether a step of the plan so far creates device `name` (again).
fn device_created(plan: &Plan, name: &str) -> bool {
    plan.steps.iter().any(|s| s.kind == Kind::Create && s.section == "bdevs" && str_of(&s.params, "name") == Some(name))
}

/// Whether a step of the plan so far creates node `key` or adds its LUN `lun` (again).
fn lun_created(ctx: &Ctx, plan: &Plan, key: &str, lun: u64) -> bool {
    plan.steps.iter().any(|s| {
        let node = str_of(&s.params, "name").map(|n| ctx.node_key(n, true));
        node.as_deref() == Some(key)
            && (s.method == "iscsi_create_target_node"
                || (s.method == "iscsi_target_node_add_lun" && s.params.get("lun_id").and_then(Value::as_u64) == Some(lun)))
    })
}

/// Whether the wanted file has device `name`, and node `key` with LUN `lun`.
fn wanted_device(ctx: &Ctx, name: &str) -> bool {
    ctx.wanted.calls.iter().any(|c| c.method.starts_with("bdev_") && c.method.ends_with("_create") && str_of(&c.params, "name") == Some(name))
}

fn wanted_lun(ctx: &Ctx, key: &str, lun: u64) -> bool {
    ctx.wanted.calls.iter().any(|c| {
        c.method == "iscsi_create_target_node"
            && str_of(&c.params, "name").map(|n| ctx.node_key(n, true)).as_deref() == Some(key)
            && c.params.get("luns").and_then(Value::as_array).is_some_and(|l| {
                l.iter().any(|x| x.get("lun_id").and_then(Value::as_u64).unwrap_or(0) == lun)
            })
    })
}

fn qos(ctx: &Ctx, plan: &mut Plan) {
    let cur = device_limits(ctx.current, plan);
    let want = device_limits(ctx.wanted, plan);
    let mut names: Vec<&String> = cur.keys().chain(want.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        if !wanted_device(ctx, name) {
            if want.contains_key(name) {
                plan.refuse(format!("{DEVICE}: device {name} is not in the file"));
            }
            continue;
        }
        let w = want.get(name).cloned().unwrap_or_else(no_limits);
        let c = if device_created(plan, name) { no_limits() } else { cur.get(name).cloned().unwrap_or_else(no_limits) };
        if w != c {
            let mut p = w;
            p.insert("name".into(), json!(name));
            plan.push(Step::new(Phase::Qos, Kind::Change, "qos", format!("rate limits of bdev {name}"), DEVICE, Value::Object(p)));
        }
    }
    let cur = initiator_limits(ctx, ctx.current, false, plan);
    let want = initiator_limits(ctx, ctx.wanted, true, plan);
    let mut keys: Vec<&InitiatorKey> = cur.keys().chain(want.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let (node, _, lun) = key;
        if !wanted_lun(ctx, node, *lun) {
            if want.contains_key(key) {
                plan.refuse(format!("{INITIATOR}: LUN {lun} of {node} is not in the file"));
            }
            continue;
        }
        let created = lun_created(ctx, plan, node, *lun);
        let (init, w) = match want.get(key) {
            Some((i, l)) => (i.clone(), l.clone()),
            None if created => continue,
            None => (cur.get(key).map(|x| x.0.clone()).unwrap_or_default(), no_limits()),
        };
        let c = if created { no_limits() } else { cur.get(key).map(|x| x.1.clone()).unwrap_or_else(no_limits) };
        if w != c {
            let mut p = w;
            p.insert("name".into(), json!(node));
            p.insert("initiator_name".into(), json!(init));
            p.insert("lun_id".into(), json!(lun));
            plan.push(Step::new(
                Phase::NodeQos,
                Kind::Change,
                "qos",
                format!("rate limits of {init} on LUN {lun} of {node}"),
                INITIATOR,
                Value::Object(p),
            ));
        }
    }
}
