//! The sections of `apply` other than target nodes: iobuf and iSCSI options, bdevs (and Ceph
//! clusters), portal groups, initiator groups, auth groups. Each is a [`Section`]: the
//! save_config methods it owns and a diff pushing steps in their [`Phase`].

use std::collections::BTreeSet;

use riser_config::auth_group::IscsiCreateAuthGroup;
use riser_config::initiator_group::IscsiCreateInitiatorGroup;
use serde_json::{json, Value};

use super::plan::{changed_fields, keyed, redact, Ctx, Kind, Phase, Plan, Section, Step};

pub const IOBUF: Section = Section { name: "iobuf", methods: &["iobuf_set_options"], diff: iobuf };
pub const ISCSI_OPTIONS: Section = Section { name: "iscsi options", methods: &["iscsi_set_options"], diff: iscsi_options };
pub const BDEVS: Section = Section { name: "bdevs", methods: BDEV_METHODS, diff: bdevs };
pub const PORTAL_GROUPS: Section = Section { name: "portal groups", methods: &["iscsi_create_portal_group"], diff: portal_groups };
pub const PORTAL_GROUP_AUTH: Section =
    Section { name: "portal group auth", methods: &["iscsi_portal_group_set_auth"], diff: portal_group_auth };
pub const INITIATOR_GROUPS: Section = Section { name: "initiator groups", methods: &["iscsi_create_initiator_group"], diff: initiator_groups };
pub const AUTH_GROUPS: Section = Section { name: "auth groups", methods: &["iscsi_create_auth_group"], diff: auth_groups };

/// The single call of `method` in a configuration, if any.
fn single<'a>(cfg: &'a super::plan::Config, method: &'a str) -> Option<&'a Value> {
    cfg.calls.iter().rfind(|c| c.method == method).map(|c| &c.params)
}

fn iobuf(ctx: &Ctx, plan: &mut Plan) {
    let (cur, want) = (single(ctx.current, "iobuf_set_options"), single(ctx.wanted, "iobuf_set_options"));
    match (cur, want) {
        (c, Some(w)) if c != Some(w) => {
            plan.push(Step::new(Phase::Options, Kind::Change, "iobuf", "I/O buffer options", "iobuf_set_options", w.clone()))
        }
        (Some(c), None) => {
            plan.refuse(format!("iobuf_set_options: the node has {c} and the file has none; write the defaults into the file to go back to them"))
        }
        _ => {}
    }
}

fn iscsi_options(ctx: &Ctx, plan: &mut Plan) {
    let Some(want) = single(ctx.wanted, "iscsi_set_options") else { return };
    let cur = single(ctx.current, "iscsi_set_options").cloned().unwrap_or(json!({}));
    let Some(w) = want.as_object() else {
        plan.refuse("iscsi_set_options: params are not an object");
        return;
    };
    // Only what the file gives and differs (iscsi_set_options changes only the options given).
    let changed: serde_json::Map<String, Value> =
        w.iter().filter(|(k, v)| cur.get(k.as_str()) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
    if !changed.is_empty() {
        let fields = changed.keys().cloned().collect::<Vec<_>>().join(", ");
        plan.push(Step::new(
            Phase::Options,
            Kind::Change,
            "iscsi options",
            format!("iSCSI options ({fields})"),
            "iscsi_set_options",
            Value::Object(changed),
        ));
    }
}

/// A device kind: the call that creates it (in save_config), the one that deletes it, the
/// one that resizes it (to `new_size` MiB) if any, and whether that only grows.
struct BdevKind {
    create: &'static str,
    delete: &'static str,
    resize: Option<&'static str>,
    grow_only: bool,
    /// A Ceph cluster, not a device (its own name space; deleted after the devices).
    cluster: bool,
}

const fn kind(create: &'static str, delete: &'static str, resize: Option<&'static str>, grow_only: bool) -> BdevKind {
    BdevKind { create, delete, resize, grow_only, cluster: false }
}

const BDEV_KINDS: &[BdevKind] = &[
    BdevKind { create: "bdev_rbd_register_cluster", delete: "bdev_rbd_unregister_cluster", resize: None, grow_only: false, cluster: true },
    kind("bdev_malloc_create", "bdev_malloc_delete", Some("bdev_malloc_resize"), false),
    kind("bdev_null_create", "bdev_null_delete", Some("bdev_null_resize"), true),
    kind("bdev_uring_create", "bdev_uring_delete", None, false),
    kind("bdev_aio_create", "bdev_aio_delete", None, false),
    kind("bdev_rbd_create", "bdev_rbd_delete", Some("bdev_rbd_resize"), true),
    kind("bdev_nvme_attach_controller", "bdev_nvme_detach_controller", None, false),
];

const BDEV_METHODS: &[&str] = &[
    "bdev_rbd_register_cluster",
    "bdev_malloc_create",
    "bdev_null_create",
    "bdev_uring_create",
    "bdev_aio_create",
    "bdev_rbd_create",
    "bdev_nvme_attach_controller",
];

/// Fields a file may leave out without asking for a change (the server makes them up).
const BDEV_GENERATED: &[&str] = &["uuid"];

fn bdev_kind(method: &str) -> Option<&'static BdevKind> {
    BDEV_KINDS.iter().find(|k| k.create == method)
}

fn name_of(v: &Value) -> Option<String> {
    v.get("name").and_then(Value::as_str).map(str::to_string)
}

/// The key of a device or cluster: clusters have their own names.
fn bdev_key(c: &super::plan::Call) -> Option<String> {
    let k = bdev_kind(&c.method)?;
    let name = name_of(&c.params)?;
    Some(if k.cluster { format!("cluster {name}") } else { format!("bdev {name}") })
}

/// Whether a LUN's bdev is this device (an NVMe controller's namespaces are NAMEn<nsid>).
fn lun_uses(lun_bdev: &str, kind: &BdevKind, name: &str) -> bool {
    lun_bdev == name
        || (kind.create == "bdev_nvme_attach_controller"
            && lun_bdev.strip_prefix(name).and_then(|r| r.strip_prefix('n')).is_some_and(|n| n.parse::<u32>().is_ok()))
}

/// What uses a running device or cluster: node names, and their sessions.
fn bdev_users(ctx: &Ctx, kind: &BdevKind, name: &str) -> (Vec<String>, Vec<String>) {
    if kind.cluster {
        let users: Vec<String> = ctx
            .current
            .of(&["bdev_rbd_create"])
            .filter(|c| c.params.get("cluster_name").and_then(Value::as_str) == Some(name))
            .filter_map(|c| name_of(&c.params).map(|n| format!("bdev {n}")))
            .collect();
        return (users, Vec::new());
    }
    ctx.nodes_where(|p| {
        p.get("luns")
            .and_then(Value::as_array)
            .is_some_and(|luns| luns.iter().any(|l| l.get("bdev_name").and_then(Value::as_str).is_some_and(|b| lun_uses(b, kind, name))))
    })
}

fn bdevs(ctx: &Ctx, plan: &mut Plan) {
    let cur = keyed(ctx.current, BDEV_METHODS, "bdevs", plan, bdev_key);
    let want = keyed(ctx.wanted, BDEV_METHODS, "bdevs", plan, bdev_key);
    for (key, w) in &want {
        let Some(wk) = bdev_kind(&w.method) else { continue };
        let name = name_of(&w.params).unwrap_or_default();
        let phase = if wk.cluster { Phase::CreateCluster } else { Phase::Create };
        let create = Step::new(phase, Kind::Create, "bdevs", key.clone(), wk.create, w.params.clone());
        let Some(c) = cur.get(key) else {
            plan.push(create);
            continue;
        };
        let Some(ck) = bdev_kind(&c.method) else { continue };
        let mut fields = if c.method != w.method { vec!["type".to_string()] } else { Vec::new() };
        let generated: Vec<&str> = BDEV_GENERATED.iter().copied().filter(|f| w.params.get(*f).is_none()).collect();
        fields.extend(changed_fields(&c.params, &w.params, &generated));
        if fields.is_empty() {
            continue;
        }
        let (users, sessions) = bdev_users(ctx, ck, &name);
        if fields == ["num_blocks"] {
            if let Some(resize) = wk.resize {
                match resize_step(key, wk, resize, &c.params, &w.params) {
                    Ok(step) => plan.push(step.sessions(sessions)),
                    Err(why) => plan.refuse(why),
                }
                continue;
            }
        }
        let fields = fields.join(", ");
        if users.is_empty() {
            let delete = json!({"name": name});
            plan.push(Step::new(Phase::ReplaceDelete, Kind::Remove, "bdevs", format!("{key} (to create it again)"), ck.delete, delete));
            plan.push(create);
        } else {
            plan.refuse(format!(
                "{key}: {fields} cannot change while it is in use (no RPC changes it live; deleting and creating it \
                 again needs it unused); used by {}",
                users.join(", ")
            ));
        }
    }
    for (key, c) in &cur {
        if want.contains_key(key) {
            continue;
        }
        let Some(ck) = bdev_kind(&c.method) else { continue };
        let name = name_of(&c.params).unwrap_or_default();
        let phase = if ck.cluster { Phase::DeleteCluster } else { Phase::DeleteBdev };
        plan.push(Step::new(phase, Kind::Remove, "bdevs", key.clone(), ck.delete, json!({"name": name})));
    }
}

/// `resize` to the wanted size, in whole MiB.
fn resize_step(key: &str, kind: &BdevKind, resize: &'static str, cur: &Value, want: &Value) -> Result<Step, String> {
    let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
    let bytes = |v: &Value| n(v, "num_blocks")?.checked_mul(n(v, "block_size").unwrap_or(512));
    let (Some(old), Some(new)) = (bytes(cur), bytes(want)) else {
        return Err(format!("{key}: num_blocks: not a size"));
    };
    const MIB: u64 = 1 << 20;
    if new % MIB != 0 {
        return Err(format!("{key}: num_blocks: {new} bytes is not a whole number of MiB ({resize} takes MiB)"));
    }
    if kind.grow_only && new < old {
        return Err(format!("{key}: num_blocks: {} devices only grow ({old} bytes now, {new} wanted)", kind.create));
    }
    let name = name_of(want).unwrap_or_default();
    Ok(Step::new(
        Phase::Grow,
        Kind::Change,
        "bdevs",
        format!("{key} (size {} MiB to {} MiB)", old / MIB, new / MIB),
        resize,
        json!({"name": name, "new_size": new / MIB}),
    ))
}

fn tag_of(c: &super::plan::Call) -> Option<String> {
    c.params.get("tag").and_then(Value::as_u64).map(|t| t.to_string())
}

/// A portal group's own discovery CHAP policy (`iscsi_portal_group_set_auth`): set when the
/// file's differs, or when its group is created (again). No RPC takes a group back to the
/// global policy (`iscsi_set_discovery_auth`), so dropping it from the file is refused
/// while the group stays.
fn portal_group_auth(ctx: &Ctx, plan: &mut Plan) {
    const M: &[&str] = &["iscsi_portal_group_set_auth"];
    const PG: &[&str] = &["iscsi_create_portal_group"];
    let mut scratch = Plan::default();
    let cur = keyed(ctx.current, M, "portal group auth", plan, tag_of);
    let want = keyed(ctx.wanted, M, "portal group auth", plan, tag_of);
    // The groups' own calls (their refusals are the portal groups section's to make).
    let cur_pg = keyed(ctx.current, PG, "portal groups", &mut scratch, tag_of);
    let want_pg = keyed(ctx.wanted, PG, "portal groups", &mut scratch, tag_of);
    let created = |key: &String| match (cur_pg.get(key), want_pg.get(key)) {
        (None, Some(_)) => true,
        (Some(c), Some(w)) => c.params != w.params,
        _ => false,
    };
    for (key, w) in &want {
        if !want_pg.contains_key(key) {
            plan.refuse(format!("iscsi_portal_group_set_auth: portal group {key} is not in the file"));
            continue;
        }
        if created(key) || cur.get(key).map(|c| &c.params) != Some(&w.params) {
            plan.push(Step::new(
                Phase::Grow,
                Kind::Change,
                "portal group auth",
                format!("discovery CHAP of portal group {key}"),
                M[0],
                w.params.clone(),
            ));
        }
    }
    for key in cur.keys().filter(|k| !want.contains_key(*k) && want_pg.contains_key(*k) && !created(k)) {
        plan.refuse(format!(
            "portal group {key}: the node has a discovery CHAP policy of its own (iscsi_portal_group_set_auth) and the file has none; no RPC takes a group back to the global policy: give the group's policy in the file"
        ));
    }
}

fn portal_groups(ctx: &Ctx, plan: &mut Plan) {
    const M: &[&str] = &["iscsi_create_portal_group"];
    let cur = keyed(ctx.current, M, "portal groups", plan, tag_of);
    let want = keyed(ctx.wanted, M, "portal groups", plan, tag_of);
    let users = |tag: u64| {
        let (nodes, _) = ctx.nodes_where(|p| maps_use(p, "pg_tag", tag));
        let sessions: Vec<String> = ctx.sessions.iter().filter(|s| s.pg_tag == tag).map(|s| format!("{} on {}", s.describe(), s.target)).collect();
        (nodes, sessions)
    };
    for (key, w) in &want {
        let what = format!("portal group {key}");
        let create = Step::new(Phase::Create, Kind::Create, "portal groups", what.clone(), M[0], w.params.clone());
        let Some(c) = cur.get(key) else {
            plan.push(create);
            continue;
        };
        let fields = changed_fields(&c.params, &w.params, &[]);
        if fields.is_empty() {
            continue;
        }
        let tag = key.parse().unwrap_or(0);
        let (nodes, sessions) = users(tag);
        if nodes.is_empty() && sessions.is_empty() {
            let del = json!({"tag": tag});
            plan.push(Step::new(
                Phase::ReplaceDelete,
                Kind::Remove,
                "portal groups",
                format!("{what} (to create it again)"),
                "iscsi_delete_portal_group",
                del,
            ));
            plan.push(create);
        } else {
            let mut users = nodes;
            users.extend(sessions);
            plan.refuse(format!(
                "{what}: {} cannot change while it is in use (no RPC changes it live); used by {}",
                fields.join(", "),
                users.join(", ")
            ));
        }
    }
    for key in cur.keys().filter(|k| !want.contains_key(*k)) {
        let tag: u64 = key.parse().unwrap_or(0);
        let (_, sessions) = users(tag);
        let step = Step::new(
            Phase::DeletePortalGroup,
            Kind::Remove,
            "portal groups",
            format!("portal group {key}"),
            "iscsi_delete_portal_group",
            json!({"tag": tag}),
        );
        plan.push(step.sessions(sessions).forced_if_sessions("deleting it closes the connections through it"));
    }
}

/// Whether a node's `pg_ig_maps` name `tag` as `field` (pg_tag / ig_tag).
pub fn maps_use(node: &Value, field: &str, tag: u64) -> bool {
    node.get("pg_ig_maps").and_then(Value::as_array).is_some_and(|m| m.iter().any(|m| m.get(field).and_then(Value::as_u64) == Some(tag)))
}

fn parse<T: serde::de::DeserializeOwned>(v: &Value, what: &str, plan: &mut Plan) -> Option<T> {
    match serde_json::from_value(v.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            plan.refuse(format!("{what}: {e}: {}", redact(v)));
            None
        }
    }
}

fn initiator_groups(ctx: &Ctx, plan: &mut Plan) {
    const M: &[&str] = &["iscsi_create_initiator_group"];
    let cur = keyed(ctx.current, M, "initiator groups", plan, tag_of);
    let want = keyed(ctx.wanted, M, "initiator groups", plan, tag_of);
    for (key, w) in &want {
        let what = format!("initiator group {key}");
        let Some(wp) = parse::<IscsiCreateInitiatorGroup>(&w.params, &what, plan) else { continue };
        let Some(c) = cur.get(key) else {
            plan.push(Step::new(Phase::Create, Kind::Create, "initiator groups", what, M[0], w.params.clone()));
            continue;
        };
        let Some(cp) = parse::<IscsiCreateInitiatorGroup>(&c.params, &what, plan) else { continue };
        let (_, sessions) = ctx.nodes_where(|p| maps_use(p, "ig_tag", u64::from(wp.tag)));
        let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<String>>();
        let (ci, wi, cn, wn) = (set(&cp.initiators), set(&wp.initiators), set(&cp.netmasks), set(&wp.netmasks));
        let diff = |a: &BTreeSet<String>, b: &BTreeSet<String>| a.difference(b).cloned().collect::<Vec<_>>();
        let (add_i, add_n, rm_i, rm_n) = (diff(&wi, &ci), diff(&wn, &cn), diff(&ci, &wi), diff(&cn, &wn));
        let change = |initiators: Vec<String>, netmasks: Vec<String>| {
            let mut p = json!({"tag": wp.tag});
            if !initiators.is_empty() {
                p["initiators"] = json!(initiators);
            }
            if !netmasks.is_empty() {
                p["netmasks"] = json!(netmasks);
            }
            p
        };
        if !add_i.is_empty() || !add_n.is_empty() {
            let p = change(add_i, add_n);
            plan.push(
                Step::new(Phase::Grow, Kind::Change, "initiator groups", format!("{what} (add)"), "iscsi_initiator_group_add_initiators", p)
                    .sessions(sessions.clone()),
            );
        }
        if !rm_i.is_empty() || !rm_n.is_empty() {
            let p = change(rm_i, rm_n);
            plan.push(
                Step::new(Phase::Shrink, Kind::Change, "initiator groups", format!("{what} (remove)"), "iscsi_initiator_group_remove_initiators", p)
                    .sessions(sessions),
            );
        }
    }
    for key in cur.keys().filter(|k| !want.contains_key(*k)) {
        let tag: u64 = key.parse().unwrap_or(0);
        plan.push(Step::new(
            Phase::DeleteInitiatorGroup,
            Kind::Remove,
            "initiator groups",
            format!("initiator group {key}"),
            "iscsi_delete_initiator_group",
            json!({"tag": tag}),
        ));
    }
}

fn auth_groups(ctx: &Ctx, plan: &mut Plan) {
    const M: &[&str] = &["iscsi_create_auth_group"];
    let cur = keyed(ctx.current, M, "auth groups", plan, tag_of);
    let want = keyed(ctx.wanted, M, "auth groups", plan, tag_of);
    for (key, w) in &want {
        let what = format!("auth group {key}");
        let Some(wp) = parse::<IscsiCreateAuthGroup>(&w.params, &what, plan) else { continue };
        let Some(c) = cur.get(key) else {
            plan.push(Step::new(Phase::Create, Kind::Create, "auth groups", what, M[0], w.params.clone()));
            continue;
        };
        let Some(cp) = parse::<IscsiCreateAuthGroup>(&c.params, &what, plan) else { continue };
        let (_, sessions) = ctx.nodes_where(|p| p.get("chap_group").and_then(Value::as_u64) == Some(u64::from(wp.tag)));
        let secret = |s: &riser_config::auth_group::AuthSecretParam| serde_json::to_value(s).unwrap_or(Value::Null);
        for ws in &wp.secrets {
            let old = cp.secrets.iter().find(|s| s.user == ws.user);
            if old.is_some_and(|o| secret(o) == secret(ws)) {
                continue;
            }
            let user = format!("{what}, user {}", ws.user);
            if old.is_some() {
                let p = json!({"tag": wp.tag, "user": ws.user});
                plan.push(
                    Step::new(Phase::Grow, Kind::Remove, "auth groups", format!("{user} (changed)"), "iscsi_auth_group_remove_secret", p)
                        .sessions(sessions.clone()),
                );
            }
            let mut p = secret(ws);
            p["tag"] = json!(wp.tag);
            plan.push(Step::new(Phase::Grow, Kind::Create, "auth groups", user, "iscsi_auth_group_add_secret", p).sessions(sessions.clone()));
        }
        for cs in cp.secrets.iter().filter(|c| !wp.secrets.iter().any(|w| w.user == c.user)) {
            let p = json!({"tag": wp.tag, "user": cs.user});
            plan.push(
                Step::new(Phase::Shrink, Kind::Remove, "auth groups", format!("{what}, user {}", cs.user), "iscsi_auth_group_remove_secret", p)
                    .sessions(sessions.clone()),
            );
        }
    }
    for key in cur.keys().filter(|k| !want.contains_key(*k)) {
        let tag: u64 = key.parse().unwrap_or(0);
        plan.push(Step::new(
            Phase::DeleteAuthGroup,
            Kind::Remove,
            "auth groups",
            format!("auth group {key}"),
            "iscsi_delete_auth_group",
            json!({"tag": tag}),
        ));
    }
}
