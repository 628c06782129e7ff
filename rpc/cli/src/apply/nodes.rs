//! The target node section of `apply`: `iscsi_create_target_node` (LUNs, portal/initiator
//! group maps, CHAP policy), `iscsi_target_node_set_alua` and
//! `iscsi_target_node_set_redirect`, diffed node by node into live calls. What no call
//! changes live (alias, queue depth, digests) deletes and creates the node again: refused
//! without `--force` while it has sessions.

use std::collections::{BTreeMap, BTreeSet};

use riser_config::node::{IscsiCreateTargetNode, LunParam, PgIgMap};
use serde_json::{json, Value};

use super::plan::{keyed, redact, Call, Ctx, Kind, Phase, Plan, Section, Step};

pub const TARGET_NODES: Section = Section { name: "target nodes", methods: METHODS, diff: target_nodes };

const CREATE: &str = "iscsi_create_target_node";
const ALUA: &str = "iscsi_target_node_set_alua";
const REDIRECT: &str = "iscsi_target_node_set_redirect";
const METHODS: &[&str] = &[CREATE, ALUA, REDIRECT];
const S: &str = "target nodes";

/// One side's nodes: create params, ALUA call, redirects by portal group; keyed by full name.
#[derive(Default)]
struct Node<'a> {
    create: Option<IscsiCreateTargetNode>,
    alua: Option<&'a Value>,
    redirects: BTreeMap<u64, &'a Value>,
}

fn nodes_of<'a>(ctx: &Ctx, cfg: &'a super::plan::Config, wanted: bool, plan: &mut Plan) -> BTreeMap<String, Node<'a>> {
    let name = |c: &Call| c.params.get("name").and_then(Value::as_str).map(|n| ctx.node_key(n, wanted));
    let mut out: BTreeMap<String, Node<'a>> = BTreeMap::new();
    for (key, c) in keyed(cfg, &[CREATE], S, plan, name) {
        match serde_json::from_value::<IscsiCreateTargetNode>(c.params.clone()) {
            Ok(p) => out.entry(key).or_default().create = Some(p),
            Err(e) => plan.refuse(format!("target node {key}: {e}: {}", redact(&c.params))),
        }
    }
    for (key, c) in keyed(cfg, &[ALUA], S, plan, name) {
        out.entry(key).or_default().alua = Some(&c.params);
    }
    let redirect_key = |c: &Call| Some(format!("{}/{}", name(c)?, c.params.get("pg_tag")?.as_u64()?));
    for (_, c) in keyed(cfg, &[REDIRECT], "redirects", plan, redirect_key) {
        let (Some(key), Some(pg)) = (name(c), c.params.get("pg_tag").and_then(Value::as_u64)) else { continue };
        out.entry(key).or_default().redirects.insert(pg, &c.params);
    }
    out
}

fn target_nodes(ctx: &Ctx, plan: &mut Plan) {
    let cur = nodes_of(ctx, ctx.current, false, plan);
    let want = nodes_of(ctx, ctx.wanted, true, plan);
    check_luns_have_bdevs(ctx, &want, plan);
    for (key, w) in &want {
        let Some(wc) = &w.create else {
            plan.refuse(format!("target node {key}: {ALUA} or {REDIRECT} without its {CREATE}"));
            continue;
        };
        let empty = Node::default();
        let c = match cur.get(key) {
            Some(c) if c.create.is_some() => c,
            _ => {
                plan.push(Step::new(Phase::NodeCreate, Kind::Create, S, format!("target node {key}"), CREATE, to_value(wc)));
                extras(key, &empty, w, plan, ctx);
                continue;
            }
        };
        let Some(cc) = &c.create else { continue };
        let sessions = ctx.sessions_on(key, None);
        let mut fields = Vec::new();
        if cc.alias_name != wc.alias_name {
            fields.push("alias_name");
        }
        if wc.queue_depth.is_some() && cc.queue_depth != wc.queue_depth {
            fields.push("queue_depth");
        }
        if cc.header_digest != wc.header_digest {
            fields.push("header_digest");
        }
        if cc.data_digest != wc.data_digest {
            fields.push("data_digest");
        }
        if !fields.is_empty() {
            // No live call changes these: delete the node (closing its sessions) and create it.
            let fields = fields.join(", ");
            let del = Step::new(
                Phase::NodeDelete,
                Kind::Remove,
                S,
                format!("target node {key} (to create it again: {fields})"),
                "iscsi_delete_target_node",
                json!({"name": wc.name, "force": !sessions.is_empty()}),
            );
            plan.push(
                del.sessions(sessions)
                    .forced_if_sessions(&format!("{fields} cannot change live; the node is deleted and created again, closing its sessions")),
            );
            plan.push(Step::new(Phase::NodeCreate, Kind::Create, S, format!("target node {key}"), CREATE, to_value(wc)));
            extras(key, &empty, w, plan, ctx);
            continue;
        }
        luns(key, cc, wc, &sessions, plan);
        maps(key, cc, wc, ctx, plan);
        if chap(cc) != chap(wc) {
            let (disable_chap, require_chap, mutual_chap, chap_group) = chap(wc);
            let p = json!({"name": wc.name, "disable_chap": disable_chap, "require_chap": require_chap, "mutual_chap": mutual_chap, "chap_group": chap_group});
            plan.push(
                Step::new(Phase::NodeAuth, Kind::Change, S, format!("CHAP of target node {key}"), "iscsi_target_node_set_auth", p)
                    .sessions(sessions.clone()),
            );
        }
        extras(key, c, w, plan, ctx);
    }
    for (key, c) in &cur {
        if want.get(key).is_some_and(|w| w.create.is_some()) {
            continue;
        }
        let Some(cc) = &c.create else { continue };
        let sessions = ctx.sessions_on(key, None);
        let del = Step::new(
            Phase::NodeDelete,
            Kind::Remove,
            S,
            format!("target node {key}"),
            "iscsi_delete_target_node",
            json!({"name": cc.name, "force": !sessions.is_empty()}),
        );
        plan.push(del.sessions(sessions).forced_if_sessions("the target node has sessions"));
    }
}

fn to_value(p: &IscsiCreateTargetNode) -> Value {
    serde_json::to_value(p).unwrap_or(Value::Null)
}

fn chap(p: &IscsiCreateTargetNode) -> (bool, bool, bool, u32) {
    (p.disable_chap, p.require_chap, p.mutual_chap, p.chap_group.unwrap_or(0))
}

/// LUNs by id: gone or changed ones removed (refused without --force while the node has
/// sessions: they may have I/O on it), new or changed ones added.
fn luns(key: &str, cur: &IscsiCreateTargetNode, want: &IscsiCreateTargetNode, sessions: &[String], plan: &mut Plan) {
    let by_id = |l: &[LunParam]| l.iter().map(|l| (l.lun_id, l.clone())).collect::<BTreeMap<u32, LunParam>>();
    let (c, w) = (by_id(&cur.luns), by_id(&want.luns));
    for (id, cl) in &c {
        if w.get(id) == Some(cl) {
            continue;
        }
        let what = format!("LUN {id} of {key} (bdev {})", cl.bdev_name);
        let step = Step::new(Phase::NodeRemoveLun, Kind::Remove, S, what, "iscsi_target_node_remove_lun", json!({"name": want.name, "lun_id": id}));
        plan.push(step.sessions(sessions.to_vec()).forced_if_sessions("sessions on the target may have I/O on this LUN"));
    }
    for (id, wl) in &w {
        if c.get(id) == Some(wl) {
            continue;
        }
        let mut p = json!({"name": want.name, "bdev_name": wl.bdev_name, "lun_id": id});
        if wl.removable {
            p["removable"] = json!(true);
        }
        if wl.read_only {
            p["read_only"] = json!(true);
        }
        let what = format!("LUN {id} of {key} (bdev {})", wl.bdev_name);
        plan.push(Step::new(Phase::NodeAddLun, Kind::Create, S, what, "iscsi_target_node_add_lun", p).sessions(sessions.to_vec()));
    }
}

/// Portal group / initiator group maps, as sets: removed ones first, added ones later.
fn maps(key: &str, cur: &IscsiCreateTargetNode, want: &IscsiCreateTargetNode, ctx: &Ctx, plan: &mut Plan) {
    let set = |m: &[PgIgMap]| m.iter().map(|m| (m.pg_tag, m.ig_tag)).collect::<BTreeSet<(u32, u32)>>();
    let (c, w) = (set(&cur.pg_ig_maps), set(&want.pg_ig_maps));
    let list = |v: Vec<&(u32, u32)>| v.iter().map(|(p, i)| json!({"pg_tag": p, "ig_tag": i})).collect::<Vec<_>>();
    let text = |v: &[&(u32, u32)]| v.iter().map(|(p, i)| format!("{p}:{i}")).collect::<Vec<_>>().join(" ");
    let gone: Vec<&(u32, u32)> = c.difference(&w).collect();
    if !gone.is_empty() {
        let mut sessions = Vec::new();
        for (pg, _) in &gone {
            sessions.extend(ctx.sessions_on(key, Some(u64::from(*pg))));
        }
        sessions.dedup();
        let what = format!("maps {} of {key}", text(&gone));
        plan.push(
            Step::new(
                Phase::NodeUnmap,
                Kind::Remove,
                S,
                what,
                "iscsi_target_node_remove_pg_ig_maps",
                json!({"name": want.name, "pg_ig_maps": list(gone)}),
            )
            .sessions(sessions),
        );
    }
    let new: Vec<&(u32, u32)> = w.difference(&c).collect();
    if !new.is_empty() {
        let what = format!("maps {} of {key}", text(&new));
        plan.push(Step::new(
            Phase::NodeMap,
            Kind::Create,
            S,
            what,
            "iscsi_target_node_add_pg_ig_maps",
            json!({"name": want.name, "pg_ig_maps": list(new)}),
        ));
    }
}

/// ALUA description and redirects (`cur` empty: the node is new or created again).
fn extras(key: &str, cur: &Node, want: &Node, plan: &mut Plan, ctx: &Ctx) {
    let name = want.create.as_ref().map(|c| c.name.clone()).unwrap_or_default();
    match (cur.alua, want.alua) {
        (c, Some(w)) if c != Some(w) => {
            plan.push(Step::new(Phase::NodeAlua, Kind::Change, S, format!("ALUA of {key}"), ALUA, w.clone()).sessions(ctx.sessions_on(key, None)));
        }
        (Some(_), None) => {
            let p = json!({"name": name, "groups": []});
            plan.push(Step::new(Phase::NodeAlua, Kind::Remove, S, format!("ALUA of {key}"), ALUA, p).sessions(ctx.sessions_on(key, None)));
        }
        _ => {}
    }
    for (pg, w) in &want.redirects {
        if cur.redirects.get(pg) != Some(w) {
            plan.push(Step::new(
                Phase::NodeRedirect,
                Kind::Change,
                S,
                format!("redirect of {key} through portal group {pg}"),
                REDIRECT,
                (*w).clone(),
            ));
        }
    }
    for pg in cur.redirects.keys().filter(|pg| !want.redirects.contains_key(pg)) {
        let p = json!({"name": name, "pg_tag": pg});
        plan.push(Step::new(Phase::NodeUnmap, Kind::Remove, S, format!("redirect of {key} through portal group {pg}"), REDIRECT, p));
    }
}

/// Every wanted LUN names a device of the wanted configuration.
fn check_luns_have_bdevs(ctx: &Ctx, want: &BTreeMap<String, Node>, plan: &mut Plan) {
    let names: BTreeSet<&str> =
        ctx.wanted.calls.iter().filter(|c| c.method.starts_with("bdev_")).filter_map(|c| c.params.get("name").and_then(Value::as_str)).collect();
    for (key, n) in want {
        for l in n.create.iter().flat_map(|c| &c.luns) {
            let nvme = l.bdev_name.rsplit_once('n').is_some_and(|(ctrl, ns)| names.contains(ctrl) && ns.parse::<u32>().is_ok());
            if !names.contains(l.bdev_name.as_str()) && !nvme {
                plan.refuse(format!("target node {key}: LUN {} names bdev {}, which the file does not create", l.lun_id, l.bdev_name));
            }
        }
    }
}
