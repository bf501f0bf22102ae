//! A fake Kubernetes API server for tests: plain HTTP on 127.0.0.1, real REST paths, JSON only.
//!
//! Production code talks to it through an ordinary `kube::Client`, and the scenarios that matter
//! also run against a real kube-apiserver (`tests/controlplane.rs`). It keeps what the DRA driver
//! depends on: resourceVersion conflicts, the status subresource, merge/JSON/apply patches,
//! selectors, watches that resume from a resourceVersion, `Status` error bodies, and the
//! version-dependent ResourceSlice rules. On top it injects faults (error codes, slow answers,
//! dropped connections, outages).
//!
//! Not modelled: auth and RBAC, other admission, finalizers and garbage collection, dryRun, field
//! ownership conflicts of server-side apply, protobuf, and discovery (`kube::Api<K>` with
//! k8s-openapi types needs none). Core and events.k8s.io events are stored apart.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::{JoinHandle, JoinSet};

/// One kind of object the server stores and serves, all at version v1.
struct Res {
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    /// Has a `/status` subresource: writes to the main resource keep the stored status.
    status: bool,
    /// Field selector keys besides `metadata.name` and `metadata.namespace`; others are refused.
    fields: &'static [&'static str],
}

impl Res {
    fn api_version(&self) -> String {
        if self.group.is_empty() { "v1".into() } else { format!("{}/v1", self.group) }
    }
    /// How error messages name the resource: `resourceclaims.resource.k8s.io`, `nodes`.
    fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.into() } else { format!("{}.{}", self.plural, self.group) }
    }
}

/// `scope` is (namespaced, has a status subresource).
const fn res(group: &'static str, plural: &'static str, kind: &'static str, scope: (bool, bool)) -> Res {
    Res { group, plural, kind, namespaced: scope.0, status: scope.1, fields: &[] }
}

const DRA: &str = "resource.k8s.io";
const RESOURCES: &[Res] = &[
    Res { fields: &["spec.unschedulable"], ..res("", "nodes", "Node", (false, true)) },
    Res {
        fields: &[
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.namespace",
            "involvedObject.uid",
            "reason",
            "type",
        ],
        ..res("", "events", "Event", (true, false))
    },
    Res {
        fields: &["regarding.kind", "regarding.name", "regarding.namespace", "regarding.uid", "reason", "type"],
        ..res("events.k8s.io", "events", "Event", (true, false))
    },
    Res {
        fields: &["spec.nodeName", "spec.driver", "spec.pool.name"],
        ..res(DRA, "resourceslices", "ResourceSlice", (false, false))
    },
    res(DRA, "resourceclaims", "ResourceClaim", (true, true)),
    res(DRA, "deviceclasses", "DeviceClass", (false, false)),
];

/// Store key: (index into `RESOURCES`, namespace or "", name).
type Key = (usize, String, String);

/// How the server starts: the version it reports and the feature gate that changes slices.
#[derive(Clone, Debug)]
pub struct Options {
    pub major: u32,
    pub minor: u32,
    /// Gate DRAPartitionableDevices. Off, the server silently drops `sharedCounters`,
    /// `consumesCounters` and per-device node selection, as a real one does.
    pub partitionable_devices: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { major: 1, minor: 35, partitionable_devices: true }
    }
}

/// A fault injected by a test; the first matching fault applies to a request.
#[derive(Clone, Debug)]
pub struct Fault {
    /// Only this method, or every method.
    pub method: Option<Method>,
    /// Substring of `path?query`; "" matches everything.
    pub path_contains: String,
    pub kind: FaultKind,
    /// How many requests it hits; `None` until `clear_faults`.
    pub times: Option<u32>,
}

#[derive(Clone, Debug)]
pub enum FaultKind {
    /// Answer with this code and a `Status` body, without touching the store.
    Status(u16),
    /// Wait, then serve the request normally.
    Delay(Duration),
    /// Close the connection without an answer.
    Drop,
}

/// One stored change, kept for watches that resume from an older resourceVersion.
struct Change {
    rv: u64,
    res: usize,
    ty: &'static str,
    obj: Value,
    /// The object before a MODIFIED change, to tell watches with selectors that it left them.
    prev: Option<Value>,
}

/// What watches hear: a change, or `None` to end every open watch (outage, `close_watches`).
type Msg = Option<Arc<Change>>;

/// How many changes a watch can resume across before it gets 410 Expired.
const HISTORY: usize = 10_000;

struct State {
    opts: Options,
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// resourceVersion of the newest change dropped from `history`.
    compacted: u64,
    events: broadcast::Sender<Msg>,
    /// Last configuration applied per (object, field manager, status subresource).
    applied: HashMap<(Key, String, bool), Value>,
    faults: Vec<Fault>,
    down: bool,
    requests: Vec<(Method, String, u16)>,
}

type Shared = Arc<Mutex<State>>;
type Frames = mpsc::Receiver<Result<Frame<Bytes>, Infallible>>;

/// The running server. Dropping it stops accepting and closes open connections.
pub struct ApiServer {
    state: Shared,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiServer {
    /// Starts a server that reports v1.35 with DRAPartitionableDevices on.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// Starts on the caller's tokio runtime, on a free port of 127.0.0.1.
    pub async fn start_with(opts: Options) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake API server");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(State {
            opts,
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            compacted: 0,
            events: broadcast::channel(4096).0,
            applied: HashMap::new(),
            faults: vec![],
            down: false,
            requests: vec![],
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // Connections live in this set, so aborting the task closes them (and their watches).
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                while conns.try_join_next().is_some() {}
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(shared.clone(), req));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        ApiServer { state, addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client configuration without auth; tests may shorten its timeouts or turn off retries.
    pub fn config(&self) -> kube::Config {
        kube::Config::new(self.url().parse().expect("server URL"))
    }

    /// A client as production builds one. Note that kube retries 429, 503 and 504 by itself.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("kube client")
    }

    /// Writes `dir/kubeconfig` pointing at this server (for `migdra serve --kubeconfig`).
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    pub fn fault(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// An outage: while down, every request answers 500 and open watches are closed.
    pub fn set_down(&self, down: bool) {
        let mut st = self.lock();
        st.down = down;
        if down {
            let _ = st.events.send(None);
        }
    }

    /// Ends every open watch cleanly, as an apiserver restart would.
    pub fn close_watches(&self) {
        let _ = self.lock().events.send(None);
    }

    /// An object by REST path (`/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c`) or by
    /// `plural/name` / `plural/namespace/name` (`nodes/n1`, `resourceclaims/default/c`).
    pub fn get(&self, path_like: &str) -> Option<Value> {
        let key = resolve(path_like)?;
        self.lock().objects.get(&key).cloned()
    }

    /// All objects of a resource, by plural (`resourceslices`) or REST collection path, in key order.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        let target = match resource.starts_with("/api") {
            true => parse_target(&segments(resource)),
            false => RESOURCES.iter().position(|r| r.plural == resource).map(|res| Target::all(res, None)),
        };
        let Some(t) = target else { return vec![] };
        let st = self.lock();
        let mine = |(r, ns, _): &&Key| *r == t.res && t.ns.as_ref().is_none_or(|n| n == ns);
        st.objects.iter().filter(|(k, _)| mine(k)).map(|(_, v)| v.clone()).collect()
    }

    /// Seeds or overwrites an object as stored, status included (e.g. a claim's allocation), and
    /// notifies watches. The resource comes from `apiVersion` and `kind`; returns the stored object.
    pub fn insert(&self, mut obj: Value) -> Value {
        let (api_version, kind) = (obj["apiVersion"].as_str().unwrap_or(""), obj["kind"].as_str().unwrap_or(""));
        let res = RESOURCES.iter().position(|r| r.api_version() == api_version && r.kind == kind);
        let res = res.unwrap_or_else(|| panic!("the fake API server does not serve {api_version} {kind}"));
        let meta = meta_mut(&mut obj);
        if RESOURCES[res].namespaced && str_at(meta, "namespace").is_empty() {
            meta.insert("namespace".into(), json!("default"));
        }
        meta.entry("uid").or_insert_with(|| json!(uid()));
        meta.entry("creationTimestamp").or_insert_with(|| json!(now()));
        let key = (res, str_at(meta, "namespace").to_string(), str_at(meta, "name").to_string());
        assert!(!key.2.is_empty(), "insert needs metadata.name");
        let mut st = self.lock();
        let prev = st.objects.get(&key).cloned();
        let ty = if prev.is_some() { "MODIFIED" } else { "ADDED" };
        st.commit(key, obj, ty, prev)
    }

    /// Deletes an object behind the clients' backs; watches see DELETED.
    pub fn remove(&self, path_like: &str) -> Option<Value> {
        let key = resolve(path_like)?;
        self.lock().delete(key).ok()
    }

    /// Every request so far: method, `path?query`, status code (0 = connection dropped).
    pub fn requests(&self) -> Vec<(Method, String, u16)> {
        self.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// A panicking test must not poison the server for the other requests of the same test.
fn lock(state: &Shared) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a request resolved to: a resource, maybe a namespace, a name and the status subresource.
struct Target {
    res: usize,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
}

impl Target {
    fn all(res: usize, ns: Option<String>) -> Self {
        Target { res, ns, name: None, status: false }
    }
    fn res(&self) -> &'static Res {
        &RESOURCES[self.res]
    }
    fn key(&self) -> Key {
        (self.res, self.ns.clone().unwrap_or_default(), self.name.clone().unwrap_or_default())
    }
}

fn segments(path: &str) -> Vec<&str> {
    path.split('?').next().unwrap_or("").split('/').filter(|s| !s.is_empty()).collect()
}

/// Parses `/api/v1/...` and `/apis/GROUP/v1/...` paths of served resources.
fn parse_target(segs: &[&str]) -> Option<Target> {
    let (group, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", g, "v1", rest @ ..] => (*g, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(*s)),
        _ => return None,
    };
    let res = RESOURCES.iter().position(|r| r.group == group && r.plural == plural)?;
    let r = &RESOURCES[res];
    let status = sub == Some("status") && r.status;
    let bad_scope = (ns.is_some() && !r.namespaced) || (name.is_some() && r.namespaced && ns.is_none());
    if bad_scope || (sub.is_some() && !status) {
        return None;
    }
    Some(Target { name, status, ..Target::all(res, ns) })
}

/// Key of an inspection helper's `path_like`; see `ApiServer::get`.
fn resolve(path_like: &str) -> Option<Key> {
    if path_like.starts_with("/api") {
        return parse_target(&segments(path_like)).filter(|t| t.name.is_some()).map(|t| t.key());
    }
    let (plural, ns, name) = match segments(path_like).as_slice() {
        [p, n] => (p.to_string(), String::new(), n.to_string()),
        [p, ns, n] => (p.to_string(), ns.to_string(), n.to_string()),
        _ => return None,
    };
    let res = RESOURCES.iter().position(|r| r.plural == plural && r.namespaced != ns.is_empty())?;
    Some((res, ns, name))
}

/// An error answer, sent as a `Status` object so that `kube::Error::Api` carries it.
struct ApiErr {
    code: u16,
    reason: &'static str,
    message: String,
    /// (name, resource) for `Status.details`.
    details: Option<(String, &'static Res)>,
}

const REASONS: &[(u16, &str)] = &[
    (400, "BadRequest"),
    (401, "Unauthorized"),
    (403, "Forbidden"),
    (404, "NotFound"),
    (405, "MethodNotAllowed"),
    (409, "Conflict"),
    (410, "Expired"),
    (415, "UnsupportedMediaType"),
    (422, "Invalid"),
    (429, "TooManyRequests"),
    (500, "InternalError"),
    (503, "ServiceUnavailable"),
    (504, "Timeout"),
];

impl ApiErr {
    fn new(code: u16, message: impl Into<String>) -> Self {
        let reason = REASONS.iter().find(|(c, _)| *c == code).map_or("", |(_, r)| r);
        ApiErr { code, reason, message: message.into(), details: None }
    }
    fn about(code: u16, res: &'static Res, name: &str, message: String) -> Self {
        ApiErr { details: Some((name.to_string(), res)), ..Self::new(code, message) }
    }
    fn not_found(res: &'static Res, name: &str) -> Self {
        Self::about(404, res, name, format!("{} \"{name}\" not found", res.qualified()))
    }
    fn already_exists(res: &'static Res, name: &str) -> Self {
        let e = Self::about(409, res, name, format!("{} \"{name}\" already exists", res.qualified()));
        ApiErr { reason: "AlreadyExists", ..e }
    }
    fn conflict(res: &'static Res, name: &str) -> Self {
        let what = format!("Operation cannot be fulfilled on {} \"{name}\"", res.qualified());
        Self::about(
            409,
            res,
            name,
            format!(
                "{what}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
    }
    fn invalid(res: &'static Res, name: &str, why: &str) -> Self {
        let kind = if res.group.is_empty() { res.kind.to_string() } else { format!("{}.{}", res.kind, res.group) };
        Self::about(422, res, name, format!("{kind} \"{name}\" is invalid: {why}"))
    }
    fn body(&self) -> Value {
        let mut v = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some((name, res)) = &self.details {
            v["details"] = json!({"name": name, "group": res.group, "kind": res.plural});
        }
        v
    }
}

enum Reply {
    Json(u16, Value),
    Stream(Frames),
}

impl From<ApiErr> for Reply {
    fn from(e: ApiErr) -> Self {
        Reply::Json(e.code, e.body())
    }
}

/// Query parameters, percent-decoded; the last value of a repeated key wins.
struct Query(HashMap<String, String>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        let pairs = q.unwrap_or("").split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")));
        Query(pairs.map(|(k, v)| (decode(k), decode(v))).collect())
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// Form decoding, as kube encodes selectors (`=` is `%3D`, a space `+`).
fn decode(s: &str) -> String {
    let (b, mut out, mut i) = (s.as_bytes(), Vec::new(), 0);
    while i < b.len() {
        let hex = b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (b[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Serves one HTTP request: outage and faults first, then the API.
async fn handle(state: Shared, req: Request<Incoming>) -> Result<Response<BoxBody<Bytes, Infallible>>, std::io::Error> {
    let (method, target) = (req.method().clone(), req.uri().path_and_query().map_or(String::new(), |p| p.to_string()));
    let fault = {
        let mut st = lock(&state);
        if st.down { Some(FaultKind::Status(500)) } else { st.take_fault(&method, &target) }
    };
    let reply = match fault {
        Some(FaultKind::Drop) => {
            lock(&state).requests.push((method, target, 0));
            return Err(std::io::Error::other("injected fault: connection dropped"));
        }
        Some(FaultKind::Status(code)) => Reply::from(ApiErr::new(code, format!("injected fault: {code}"))),
        delay => {
            if let Some(FaultKind::Delay(d)) = delay {
                tokio::time::sleep(d).await;
            }
            let (query, path) = (Query::parse(req.uri().query()), req.uri().path().to_string());
            let ctype = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            route(&state, &method, &path, &query, &ctype, &body).unwrap_or_else(Reply::from)
        }
    };
    let (code, body) = match reply {
        Reply::Json(code, v) => (code, Full::new(Bytes::from(v.to_string())).boxed()),
        Reply::Stream(rx) => (200, StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed()),
    };
    lock(&state).requests.push((method, target, code));
    Ok(Response::builder().status(code).header("content-type", "application/json").body(body).expect("a response"))
}

fn route(state: &Shared, method: &Method, path: &str, q: &Query, ctype: &str, body: &[u8]) -> Result<Reply, ApiErr> {
    let segs = segments(path);
    let mut st = lock(state);
    if let (&Method::GET, ["version"]) = (method, segs.as_slice()) {
        let o = &st.opts;
        return Ok(Reply::Json(
            200,
            json!({
                "major": o.major.to_string(), "minor": o.minor.to_string(),
                "gitVersion": format!("v{}.{}.0", o.major, o.minor),
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0",
                "compiler": "gc", "platform": "linux/amd64",
            }),
        ));
    }
    let t = parse_target(&segs).ok_or_else(|| ApiErr::new(404, "the server could not find the requested resource"))?;
    let reply = match (method, &t.name) {
        (&Method::GET, None) if q.flag("watch") => return st.watch(&t, q).map(Reply::Stream),
        (&Method::GET, None) => st.list(&t, q)?,
        (&Method::GET, Some(name)) => {
            st.objects.get(&t.key()).cloned().ok_or_else(|| ApiErr::not_found(t.res(), name))?
        }
        (&Method::POST, None) => return Ok(Reply::Json(201, st.create(&t, parse_json(body)?)?)),
        (&Method::PUT, Some(_)) => st.update(&t, parse_json(body)?)?,
        (&Method::PATCH, Some(_)) => st.patch(&t, ctype, body, q)?,
        (&Method::DELETE, Some(_)) if !t.status => st.delete(t.key())?,
        (&Method::DELETE, None) => st.delete_collection(&t, q)?,
        _ => return Err(ApiErr::new(405, format!("the server does not allow this method on {path}"))),
    };
    Ok(Reply::Json(200, reply))
}

fn parse_json(body: &[u8]) -> Result<Value, ApiErr> {
    serde_json::from_slice(body).map_err(|e| ApiErr::new(400, format!("invalid JSON body: {e}")))
}

impl State {
    fn take_fault(&mut self, method: &Method, target: &str) -> Option<FaultKind> {
        let hit = |f: &Fault| {
            f.method.as_ref().is_none_or(|m| m == method) && target.contains(&f.path_contains) && f.times != Some(0)
        };
        let i = self.faults.iter().position(hit)?;
        let kind = self.faults[i].kind.clone();
        if let Some(n) = &mut self.faults[i].times {
            *n -= 1;
            if *n == 0 {
                self.faults.remove(i);
            }
        }
        Some(kind)
    }

    /// Stores (or deletes) an object under a new resourceVersion and tells the watches.
    fn commit(&mut self, key: Key, mut obj: Value, ty: &'static str, prev: Option<Value>) -> Value {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        if ty == "DELETED" {
            self.objects.remove(&key);
            self.applied.retain(|(k, _, _), _| *k != key);
        } else {
            self.objects.insert(key.clone(), obj.clone());
        }
        let change = Arc::new(Change { rv: self.rv, res: key.0, ty, obj: obj.clone(), prev });
        self.history.push_back(change.clone());
        if self.history.len() > HISTORY {
            self.compacted = self.history.pop_front().map_or(0, |c| c.rv);
        }
        let _ = self.events.send(Some(change));
        obj
    }

    fn select<'a>(&'a self, f: &'a Filter) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        self.objects.iter().filter(move |(k, v)| k.0 == f.res && f.matches(v))
    }

    /// A list in key order, paged by `limit` and `continue` (the last `namespace/name` returned).
    fn list(&self, t: &Target, q: &Query) -> Result<Value, ApiErr> {
        let filter = Filter::new(t, q)?;
        let after = q.get("continue").map(|c| c.split_once('/').unwrap_or(("", c)));
        let limit = q.get("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = self.select(&filter).filter(|(k, _)| after.is_none_or(|a| (k.1.as_str(), k.2.as_str()) > a));
        let mut page: Vec<_> =
            items.by_ref().take(limit).map(|(k, v)| (format!("{}/{}", k.1, k.2), v.clone())).collect();
        let mut meta = json!({"resourceVersion": self.rv.to_string()});
        if items.next().is_some() {
            meta["continue"] = json!(page.last().map(|(pos, _)| pos.clone()));
        }
        // A real server leaves apiVersion and kind out of list items.
        page.iter_mut()
            .filter_map(|(_, v)| v.as_object_mut())
            .for_each(|o| drop((o.remove("apiVersion"), o.remove("kind"))));
        Ok(list_of(t.res(), page.into_iter().map(|(_, v)| v).collect(), meta))
    }

    fn create(&mut self, t: &Target, mut obj: Value) -> Result<Value, ApiErr> {
        let res = t.res();
        check_type(res, &mut obj)?;
        let meta = meta_mut(&mut obj);
        if res.namespaced {
            let ns = t.ns.clone().unwrap_or_default();
            if ![ns.as_str(), ""].contains(&str_at(meta, "namespace")) {
                return Err(ApiErr::new(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(ns));
        }
        let ns = str_at(meta, "namespace").to_string();
        let mut name = str_at(meta, "name").to_string();
        if name.is_empty() {
            let prefix = str_at(meta, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiErr::invalid(
                    res,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            name = std::iter::repeat_with(|| format!("{prefix}{}", suffix()))
                .find(|n| !self.objects.contains_key(&(t.res, ns.clone(), n.clone())))
                .expect("a free name");
            meta.insert("name".into(), json!(name));
        }
        let key = (t.res, ns, name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiErr::already_exists(res, &name));
        }
        meta.remove("resourceVersion");
        meta.insert("uid".into(), json!(uid()));
        meta.insert("creationTimestamp".into(), json!(now()));
        if obj.get("spec").is_some() {
            obj["metadata"]["generation"] = json!(1);
        }
        if res.plural == "resourceclaims" {
            obj.as_object_mut().map(|o| o.remove("status")); // only /status writes set it
        }
        self.admit(res, &name, &mut obj)?;
        Ok(self.commit(key, obj, "ADDED", None))
    }

    /// PUT semantics, also the end of every PATCH: precondition, subresource rules, no-op detection.
    fn update(&mut self, t: &Target, mut new: Value) -> Result<Value, ApiErr> {
        let (res, key) = (t.res(), t.key());
        let old = self.objects.get(&key).cloned().ok_or_else(|| ApiErr::not_found(res, &key.2))?;
        check_type(res, &mut new)?;
        let meta = meta_mut(&mut new);
        if ![key.2.as_str(), ""].contains(&str_at(meta, "name")) {
            return Err(ApiErr::new(
                400,
                format!("the name of the object does not match the name on the URL ({})", key.2),
            ));
        }
        let old_rv = old["metadata"]["resourceVersion"].clone();
        if !str_at(meta, "resourceVersion").is_empty() && meta["resourceVersion"] != old_rv {
            return Err(ApiErr::conflict(res, &key.2));
        }
        if t.status {
            let status = new.get("status").cloned();
            new = old.clone();
            set_or_remove(&mut new, "status", status);
        } else {
            for field in ["name", "namespace", "uid", "creationTimestamp", "generation"] {
                set_or_remove(&mut new["metadata"], field, old["metadata"].get(field).cloned());
            }
            if res.status {
                set_or_remove(&mut new, "status", old.get("status").cloned());
            }
            if new.get("spec") != old.get("spec") && old["metadata"].get("generation").is_some() {
                new["metadata"]["generation"] = json!(old["metadata"]["generation"].as_i64().unwrap_or(0) + 1);
            }
        }
        self.admit(res, &key.2, &mut new)?;
        new["metadata"]["resourceVersion"] = old_rv;
        if new == old {
            return Ok(new); // A no-op write keeps the resourceVersion, as on a real server.
        }
        Ok(self.commit(key, new, "MODIFIED", Some(old)))
    }

    fn patch(&mut self, t: &Target, ctype: &str, body: &[u8], q: &Query) -> Result<Value, ApiErr> {
        let (res, key) = (t.res(), t.key());
        let ctype = ctype.split(';').next().unwrap_or("").trim();
        let old = self.objects.get(&key).cloned();
        let mut doc = match &old {
            Some(o) => o.clone(),
            // Server-side apply creates what does not exist yet.
            None if ctype == "application/apply-patch+yaml" && !t.status => json!({"metadata": {"name": key.2}}),
            None => return Err(ApiErr::not_found(res, &key.2)),
        };
        match ctype {
            "application/merge-patch+json" => merge(&mut doc, &parse_json(body)?, "", false),
            "application/strategic-merge-patch+json" => merge(&mut doc, &parse_json(body)?, "", true),
            "application/json-patch+json" => {
                json_patch(&mut doc, &parse_json(body)?).map_err(|e| ApiErr::invalid(res, &key.2, &e))?
            }
            "application/apply-patch+yaml" => {
                let manager = q.get("fieldManager").filter(|m| !m.is_empty());
                let manager = manager.ok_or_else(|| ApiErr::new(400, "fieldManager is required for apply patch"))?;
                let config: Value = serde_json::from_slice(body)
                    .or_else(|_| serde_norway::from_slice(body))
                    .map_err(|e| ApiErr::new(400, format!("invalid apply configuration: {e}")))?;
                let owner = (key.clone(), manager.to_string(), t.status);
                if let Some(prev) = self.applied.get(&owner) {
                    prune(&mut doc, prev, &config, "");
                }
                merge(&mut doc, &config, "", true);
                self.applied.insert(owner, config);
            }
            _ => return Err(ApiErr::new(415, format!("unsupported patch type {ctype:?}"))),
        }
        if old.is_some() { self.update(t, doc) } else { self.create(t, doc) }
    }

    fn delete(&mut self, key: Key) -> Result<Value, ApiErr> {
        let obj = self.objects.get(&key).cloned().ok_or_else(|| ApiErr::not_found(&RESOURCES[key.0], &key.2))?;
        Ok(self.commit(key, obj, "DELETED", None))
    }

    fn delete_collection(&mut self, t: &Target, q: &Query) -> Result<Value, ApiErr> {
        let filter = Filter::new(t, q)?;
        let keys: Vec<Key> = self.select(&filter).map(|(k, _)| k.clone()).collect();
        let items = keys.into_iter().map(|k| self.delete(k)).collect::<Result<_, _>>()?;
        Ok(list_of(t.res(), items, json!({"resourceVersion": self.rv.to_string()})))
    }

    /// Version- and gate-dependent ResourceSlice rules (docs/facts/k8s-dra-api.md §3): without the
    /// gate the counter fields vanish; from 1.35 counters and devices need separate slices; before,
    /// devices consume only counter sets of their own slice.
    fn admit(&self, res: &'static Res, name: &str, obj: &mut Value) -> Result<(), ApiErr> {
        let Some(spec) = obj.get_mut("spec").filter(|_| res.plural == "resourceslices") else { return Ok(()) };
        let devices = |spec: &Value| spec["devices"].as_array().cloned().unwrap_or_default();
        if !self.opts.partitionable_devices {
            set_or_remove(spec, "sharedCounters", None);
            set_or_remove(spec, "perDeviceNodeSelection", None);
            for dev in spec.get_mut("devices").and_then(Value::as_array_mut).into_iter().flatten() {
                for field in ["consumesCounters", "nodeName", "nodeSelector", "allNodes"] {
                    set_or_remove(dev, field, None);
                }
            }
            return Ok(());
        }
        let has = |k: &str| !spec[k].is_null();
        if (self.opts.major, self.opts.minor) >= (1, 35) {
            if has("sharedCounters") && has("devices") {
                return Err(ApiErr::invalid(res, name, "spec: only one of `sharedCounters` or `devices` is allowed"));
            }
            return Ok(());
        }
        let sets = spec["sharedCounters"].as_array().cloned().unwrap_or_default();
        let known = |set: &Value| sets.iter().any(|s| s["name"] == *set);
        for used in devices(spec).iter().filter_map(|d| d["consumesCounters"].as_array()).flatten() {
            if !known(&used["counterSet"]) {
                let why =
                    format!("spec.devices.consumesCounters.counterSet: {} is not in this slice", used["counterSet"]);
                return Err(ApiErr::invalid(res, name, &why));
            }
        }
        Ok(())
    }

    /// Opens a watch. From resourceVersion "" or "0" (or with sendInitialEvents) it first sends
    /// every matching object as ADDED; from a number, the stored changes after it, or 410 Expired.
    fn watch(&mut self, t: &Target, q: &Query) -> Result<Frames, ApiErr> {
        let filter = Filter::new(t, q)?;
        let rv = q.get("resourceVersion").unwrap_or("");
        let (mut lines, mut expired) = (Vec::new(), false);
        if q.flag("sendInitialEvents") || rv.is_empty() || rv == "0" {
            lines.extend(self.select(&filter).map(|(_, v)| event("ADDED", v.clone())));
            if q.flag("sendInitialEvents") && q.flag("allowWatchBookmarks") {
                // kube-runtime's streaming-list watcher waits for this marker.
                let end = json!({"k8s.io/initial-events-end": "true"});
                let meta = json!({"resourceVersion": self.rv.to_string(), "annotations": end});
                let res = t.res();
                lines.push(event(
                    "BOOKMARK",
                    json!({"apiVersion": res.api_version(), "kind": res.kind, "metadata": meta}),
                ));
            }
        } else {
            let from: u64 = rv.parse().map_err(|_| ApiErr::new(400, format!("invalid resourceVersion {rv:?}")))?;
            expired = from < self.compacted;
            if expired {
                let msg = format!("too old resource version: {from} ({})", self.compacted + 1);
                lines.push(event("ERROR", ApiErr::new(410, msg).body()));
            } else {
                lines.extend(self.history.iter().filter(|c| c.rv > from).filter_map(|c| filter.view(c)));
            }
        }
        let timeout = Duration::from_secs(q.get("timeoutSeconds").and_then(|s| s.parse().ok()).unwrap_or(1800));
        let (tx, rx) = mpsc::channel(256);
        let (events, after) = (self.events.subscribe(), self.rv);
        tokio::spawn(async move {
            for line in lines {
                if tx.send(Ok(Frame::data(line))).await.is_err() {
                    return;
                }
            }
            if !expired {
                pump(tx, events, after, filter, timeout).await;
            }
        });
        Ok(rx)
    }
}

/// Streams live changes to one watch until it times out, the client goes away, or a close.
async fn pump(
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    mut events: broadcast::Receiver<Msg>,
    mut after: u64,
    filter: Filter,
    timeout: Duration,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        let line = tokio::select! {
            _ = &mut deadline => return,
            _ = tx.closed() => return,
            msg = events.recv() => match msg {
                Ok(Some(c)) if c.rv > after => {
                    after = c.rv;
                    filter.view(&c)
                }
                Ok(Some(_)) => None,
                Ok(None) | Err(broadcast::error::RecvError::Closed) => return,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    Some(event("ERROR", ApiErr::new(410, "watch fell behind").body()))
                }
            },
        };
        if let Some(line) = line
            && tx.send(Ok(Frame::data(line))).await.is_err()
        {
            return;
        }
    }
}

/// One line of a watch stream.
fn event(ty: &str, obj: Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": ty, "object": obj})))
}

fn list_of(res: &Res, items: Vec<Value>, meta: Value) -> Value {
    json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(), "metadata": meta, "items": items})
}

/// Namespace, label and field selectors of a list, watch or delete-collection. Selector terms are
/// `k=v`, `k==v`, `k!=v`, and for labels also `k` and `!k` (no set-based `in`/`notin`).
struct Filter {
    res: usize,
    ns: Option<String>,
    /// (key, operator: "=", "!=", "exists" or "!exists", value)
    labels: Vec<(String, &'static str, String)>,
    fields: Vec<(String, &'static str, String)>,
}

fn parse_selector(s: &str) -> Vec<(String, &'static str, String)> {
    let term = |t: &str| {
        let (k, op, v) = if let Some((k, v)) = t.split_once("!=") {
            (k, "!=", v)
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            (k, "=", v)
        } else if let Some(k) = t.strip_prefix('!') {
            (k, "!exists", "")
        } else {
            (t, "exists", "")
        };
        (k.trim().to_string(), op, v.trim().to_string())
    };
    s.split(',').map(str::trim).filter(|t| !t.is_empty()).map(term).collect()
}

impl Filter {
    fn new(t: &Target, q: &Query) -> Result<Self, ApiErr> {
        let fields = parse_selector(q.get("fieldSelector").unwrap_or(""));
        for (k, op, _) in &fields {
            let known =
                ["metadata.name", "metadata.namespace"].contains(&k.as_str()) || t.res().fields.contains(&k.as_str());
            if !known || op.ends_with("exists") {
                return Err(ApiErr::new(400, format!("field label not supported: {k}")));
            }
        }
        let labels = parse_selector(q.get("labelSelector").unwrap_or(""));
        Ok(Filter { res: t.res, ns: t.ns.clone(), labels, fields })
    }

    fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        let test = |(_, op, want): &(String, &str, String), got: Option<String>| match *op {
            "=" => got.as_ref() == Some(want),
            "!=" => got.as_ref() != Some(want),
            "exists" => got.is_some(),
            _ => got.is_none(),
        };
        self.ns.as_ref().is_none_or(|ns| meta["namespace"].as_str() == Some(ns))
            && self.labels.iter().all(|r| test(r, meta["labels"][&r.0].as_str().map(String::from)))
            && self.fields.iter().all(|r| test(r, Some(field_value(obj, &r.0))))
    }

    /// How a change looks through this filter: an object entering the selection is ADDED, one
    /// leaving it is DELETED, as a real watch cache reports them.
    fn view(&self, c: &Change) -> Option<Bytes> {
        let (before, now) = (c.prev.as_ref().is_some_and(|p| self.matches(p)), self.matches(&c.obj));
        match (c.res == self.res, c.ty, before, now) {
            (false, ..) => None,
            (_, "MODIFIED", true, true) => Some(event("MODIFIED", c.obj.clone())),
            (_, "MODIFIED", false, true) | (_, "ADDED", _, true) => Some(event("ADDED", c.obj.clone())),
            (_, "DELETED", _, true) => Some(event("DELETED", c.obj.clone())),
            (_, "MODIFIED", true, false) => {
                let mut gone = c.prev.clone().unwrap_or_default();
                gone["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                Some(event("DELETED", gone))
            }
            _ => None,
        }
    }
}

/// A field selector's view of a value: strings as is, other scalars printed, absent as "".
fn field_value(obj: &Value, path: &str) -> String {
    match path.split('.').fold(obj, |v, k| &v[k]) {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Lists that Kubernetes declares as maps (`listType=map`): strategic merge and apply merge them
/// item by item by these keys instead of replacing them, so one driver's `status.devices` entry
/// leaves the others alone. Every other list is atomic.
fn list_map_keys(path: &str) -> Option<&'static [&'static str]> {
    match path {
        ".status.devices" => Some(&["driver", "pool", "device", "shareID"]),
        ".metadata.ownerReferences" | ".status.reservedFor" => Some(&["uid"]),
        ".status.addresses" => Some(&["type"]),
        _ if path.ends_with(".conditions") => Some(&["type"]),
        _ => None,
    }
}

fn same_item(a: &Value, b: &Value, keys: &[&str]) -> bool {
    keys.iter().all(|k| a.get(*k) == b.get(*k))
}

/// RFC 7386 merge (null deletes, objects merge, the rest replaces); with `list_maps`, the lists
/// of `list_map_keys` merge by key.
fn merge(target: &mut Value, patch: &Value, path: &str, list_maps: bool) {
    if let Value::Object(p) = patch {
        if !target.is_object() {
            *target = json!({});
        }
        for (k, v) in p {
            match v {
                Value::Null => set_or_remove(target, k, None),
                // Indexing an object inserts a null for a missing key, which the merge then fills.
                v => merge(&mut target[k.as_str()], v, &format!("{path}.{k}"), list_maps),
            }
        }
    } else if list_maps
        && let Some(keys) = list_map_keys(path)
        && let (Value::Array(items), Value::Array(cur)) = (patch, &mut *target)
    {
        for item in items {
            match cur.iter_mut().find(|c| same_item(c, item, keys)) {
                Some(c) => merge(c, item, path, true),
                None => cur.push(item.clone()),
            }
        }
    } else {
        *target = patch.clone();
    }
}

/// Server-side apply's removal rule, loosely: what this manager applied last time and left out
/// now is removed (whole fields, or items of map lists).
fn prune(obj: &mut Value, prev: &Value, next: &Value, path: &str) {
    match (obj, prev) {
        (Value::Object(o), Value::Object(p)) => {
            for (k, pv) in p {
                match (next.get(k), o.get_mut(k)) {
                    (None, _) => drop(o.remove(k)),
                    (Some(nv), Some(ov)) => prune(ov, pv, nv, &format!("{path}.{k}")),
                    (Some(_), None) => {}
                }
            }
        }
        (Value::Array(o), Value::Array(p)) => {
            let Some(keys) = list_map_keys(path) else { return };
            for pi in p {
                match next.as_array().and_then(|n| n.iter().find(|ni| same_item(ni, pi, keys))) {
                    None => o.retain(|oi| !same_item(oi, pi, keys)),
                    Some(ni) => {
                        o.iter_mut().filter(|oi| same_item(oi, pi, keys)).for_each(|oi| prune(oi, pi, ni, path))
                    }
                }
            }
        }
        _ => {}
    }
}

/// RFC 6902 JSON patch: add, remove, replace and test (not move and copy).
fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    for op in ops.as_array().ok_or("a JSON patch must be an array")? {
        let path = op["path"].as_str().ok_or("a JSON patch operation needs a path")?;
        match op["op"].as_str().unwrap_or("") {
            "add" => pointer_add(doc, path, op["value"].clone())?,
            "remove" => drop(pointer_remove(doc, path)?),
            "replace" => pointer_remove(doc, path).and_then(|_| pointer_add(doc, path, op["value"].clone()))?,
            "test" if doc.pointer(path) == Some(&op["value"]) => {}
            "test" => return Err(format!("test operation failed at {path}")),
            other => return Err(format!("unsupported JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

/// Parent pointer and unescaped last token of a JSON pointer.
fn split_pointer(path: &str) -> Result<(&str, String), String> {
    let (parent, last) = path.rsplit_once('/').ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn pointer_add(doc: &mut Value, path: &str, v: Value) -> Result<(), String> {
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(parent) {
        Some(Value::Object(o)) => drop(o.insert(last, v)),
        Some(Value::Array(a)) if last == "-" => a.push(v),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i <= a.len() => a.insert(i, v),
            _ => return Err(format!("add: index out of range at {path}")),
        },
        _ => return Err(format!("add: no parent for {path}")),
    }
    Ok(())
}

fn pointer_remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let removed = match doc.pointer_mut(parent) {
        Some(Value::Object(o)) => o.remove(&last),
        Some(Value::Array(a)) => last.parse::<usize>().ok().filter(|i| *i < a.len()).map(|i| a.remove(i)),
        _ => None,
    };
    removed.ok_or_else(|| format!("no value at {path}"))
}

/// Fills in apiVersion and kind, and refuses an object of another type.
fn check_type(res: &Res, obj: &mut Value) -> Result<(), ApiErr> {
    if !obj.is_object() {
        return Err(ApiErr::new(400, "the request body must be a JSON object"));
    }
    for (field, want) in [("apiVersion", res.api_version()), ("kind", res.kind.to_string())] {
        match obj[field].as_str() {
            None | Some("") => obj[field] = json!(want),
            Some(got) if got != want => return Err(ApiErr::new(400, format!("{field} {got:?} does not match {want}"))),
            Some(_) => {}
        }
    }
    Ok(())
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata is an object")
}

fn str_at<'a>(map: &'a Map<String, Value>, k: &str) -> &'a str {
    map.get(k).and_then(Value::as_str).unwrap_or("")
}

fn set_or_remove(obj: &mut Value, k: &str, v: Option<Value>) {
    match (obj.as_object_mut(), v) {
        (Some(o), Some(v)) => drop(o.insert(k.into(), v)),
        (Some(o), None) => drop(o.remove(k)),
        (None, _) => {}
    }
}

/// Distinct pseudo-random numbers without a rand dependency: std's hasher keys are random.
fn random() -> u64 {
    use std::hash::BuildHasher;
    static N: AtomicU64 = AtomicU64::new(0);
    std::hash::RandomState::new().hash_one(N.fetch_add(1, Ordering::Relaxed))
}

fn uid() -> String {
    let h = format!("{:016x}{:016x}", random(), random());
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// generateName's suffix: five characters of the apiserver's alphabet.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let r = random();
    (0..5).map(|i| ALPHABET[((r >> (i * 8)) % ALPHABET.len() as u64) as usize] as char).collect()
}

/// Now as RFC 3339 in UTC, seconds precision (metav1.Time), by Howard Hinnant's civil_from_days.
fn now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let (day, month) = (doy - (153 * mp + 2) / 5 + 1, if mp < 10 { mp + 3 } else { mp - 9 });
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
