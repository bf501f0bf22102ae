//! `migdra usage` and `migdra why`, also `kubectl migdra …` (the binary linked as
//! `kubectl-migdra` on the PATH): the whole cluster's migdra GPUs, and why a pod is pending,
//! read from the API server through the user's kubeconfig. Read only.

use super::{CliError, CliResult, Format, Global, output, serve};
use crate::cluster::model::Cluster;
use crate::cluster::nodes::{self, NodeView};
use crate::cluster::wire;
use crate::cluster::{usage, why};
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, ListParams};
use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

/// How long the reads may take together before the command gives up.
const BUDGET: Duration = Duration::from_secs(20);

#[derive(Debug, clap::Args)]
pub struct WhyArgs {
    /// The pending pod (NAME or pod/NAME), or a claim (claim/NAME or resourceclaim/NAME)
    target: String,
    /// Its namespace [default: the kubeconfig context's, else default]
    #[arg(short = 'n', long)]
    namespace: Option<String>,
}

/// Which nodes `usage` draws, and how.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct UsageArgs {
    /// Only these nodes (comma-separated, or the flag repeated)
    #[arg(long = "node", value_name = "NAME", value_delimiter = ',')]
    nodes: Vec<String>,
    /// Only the nodes whose labels match this selector (kubectl's -l syntax; reads the Nodes)
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    selector: Option<String>,
    /// One line per node instead of its GPUs' slices (the table output; -o json is always whole)
    #[arg(long)]
    summary: bool,
}

/// `kubectl migdra`: the plugin's own command line, with only what its two commands read (the
/// binary is the node daemon too, whose flags mean nothing here).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl migdra",
    bin_name = "kubectl migdra",
    version,
    about = "The cluster's migdra GPUs, and why a pod is pending (read only)",
    disable_help_subcommand = true
)]
pub struct PluginCli {
    #[command(subcommand)]
    command: PluginCommand,
    #[command(flatten)]
    flags: Flags,
}

#[derive(Debug, clap::Subcommand)]
enum PluginCommand {
    /// Every migdra node's GPUs: memory slices with a letter per claim, taints, and per profile
    /// the placements in use and free now
    Usage(UsageArgs),
    /// Why a pod (or claim/NAME) is pending: per request, the matching devices and, per GPU, what
    /// keeps them from it
    Why(WhyArgs),
}

/// What `usage` and `why` read besides their arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct Flags {
    /// Output format
    #[arg(short = 'o', long, global = true, env = "MIGDRA_OUTPUT", value_enum, default_value_t)]
    pub output: Format,
    /// DRA driver name
    #[arg(long, global = true, env = "MIGDRA_DRIVER_NAME", default_value = "mig.slinky.slurm.net")]
    pub driver_name: String,
    /// kubeconfig for the API server [default: in-cluster, then ~/.kube/config]
    #[arg(long, global = true, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl Flags {
    /// The same flags of `migdra usage` and `migdra why`.
    pub fn of(global: &Global) -> Self {
        Self {
            output: global.output,
            driver_name: global.node.driver_name.clone(),
            kubeconfig: global.node.kubeconfig.clone(),
        }
    }
}

/// Run `kubectl migdra` with these arguments, writing to `out`.
pub fn plugin(cli: PluginCli, out: &mut dyn Write) -> CliResult {
    match cli.command {
        PluginCommand::Usage(args) => usage(&args, &cli.flags, out),
        PluginCommand::Why(args) => why(&args, &cli.flags, out),
    }
}

/// What the commands read, once.
struct Snapshot {
    server: String,
    namespace: String,
    slices: Vec<wire::Slice>,
    claims: Vec<ResourceClaim>,
    classes: Vec<DeviceClass>,
    /// What the user's rights left out (empty slices or classes, claims of one namespace).
    sight: why::Sight,
    /// The Node objects; `None` when they could not be read (an operator without `list nodes`).
    nodes: Option<Vec<NodeView>>,
    /// The nodes a `-l` selector matches, when one was given.
    selected: Option<Vec<String>>,
}

/// What the caller reads besides the slices, claims and classes.
#[derive(Default)]
struct Reads<'a> {
    namespace: Option<&'a str>,
    pod: Option<&'a str>,
    /// A label selector: the names of the Nodes it matches, in [`Snapshot::selected`].
    node_selector: Option<&'a str>,
}

pub fn usage(args: &UsageArgs, global: &Flags, out: &mut dyn Write) -> CliResult {
    let (snap, _) = read(global, Reads { node_selector: args.selector.as_deref(), ..Reads::default() })?;
    let mut missing = snap.sight.unread.clone();
    if snap.sight.claims_only_in.is_some() {
        missing.push("ResourceClaims across namespaces".into());
    }
    if !missing.is_empty() {
        return Err(CliError::Failed(format!(
            "usage reads the whole cluster, and {} could not be read at {} (forbidden); `kubectl migdra why POD` \
             answers with what your rights allow",
            missing.join(", "),
            snap.server
        )));
    }
    let mut cluster = Cluster::build(&global.driver_name, snap.slices, &snap.claims);
    let publishing: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut silent: Vec<String> =
        nodes::silent(&global.driver_name, snap.nodes.as_deref().unwrap_or_default(), &publishing)
            .into_iter()
            .map(str::to_string)
            .collect();
    if cluster.nodes.is_empty() {
        return Err(no_nodes(&global.driver_name, &snap.server, &silent));
    }
    if let Some(keep) = chosen(args, global, snap.selected.as_deref(), &publishing, &silent)? {
        cluster.nodes.retain(|n| keep.contains(&n.name));
        silent.retain(|n| keep.contains(n));
    }
    let mut u = usage::usage(&cluster);
    u.silent = silent;
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &u)?,
        Format::Table if args.summary => summary(&u, out)?,
        Format::Table => picture(&u, out)?,
    }
    exit_without_freeing(cluster);
    Ok(())
}

pub fn why(args: &WhyArgs, global: &Flags, out: &mut dyn Write) -> CliResult {
    let (kind, name) = match args.target.split_once('/') {
        Some(("pod" | "pods" | "po", n)) => (Kind::Pod, n),
        Some(("claim" | "resourceclaim" | "resourceclaims", n)) => (Kind::Claim, n),
        Some((k, _)) => {
            return Err(CliError::Usage(format!(
                "{:?}: unknown kind {k:?}; give a pod (NAME or pod/NAME) or a claim (claim/NAME)",
                args.target
            )));
        }
        None => (Kind::Pod, args.target.as_str()),
    };
    if name.is_empty() {
        return Err(CliError::Usage(format!("{:?}: the name is empty", args.target)));
    }
    let want = (kind == Kind::Pod).then_some(name);
    let (snap, pod) = read(global, Reads { namespace: args.namespace.as_deref(), pod: want, node_selector: None })?;
    let driver = &global.driver_name;
    let ns = &snap.namespace;
    if snap.sight.lacks(why::Sight::CLAIMS) {
        return Err(CliError::Failed(format!(
            "the ResourceClaims of namespace {ns} could not be read at {} (forbidden): why needs get and list on \
             resourceclaims there at least",
            snap.server
        )));
    }
    let find = |claim: &str| {
        snap.claims
            .iter()
            .find(|c| c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(claim))
    };
    let slots: Vec<why::ClaimSlot<'_>> = match &pod {
        Some(pod) => {
            let mut slots = pod_claims(pod, &find);
            slots.extend(why::extended_claim(pod, &snap.classes).map(|c| why::ClaimSlot::Extended(Box::new(c))));
            slots
        }
        None => vec![why::ClaimSlot::Found(
            find(name).ok_or_else(|| CliError::Usage(format!("claim {ns}/{name} not found")))?,
        )],
    };
    let target = match &pod {
        Some(_) => format!("pod {ns}/{name}"),
        None => format!("claim {ns}/{name}"),
    };
    if slots.is_empty() {
        return Err(CliError::Usage(format!("{target} has no resource claims")));
    }
    // Without the classes, which claims are for the driver is not known: all of them are shown.
    let unknown_classes = snap.sight.lacks(why::Sight::CLASSES);
    let mine: Vec<why::ClaimSlot<'_>> = slots
        .into_iter()
        .filter(|s| match s {
            _ if unknown_classes => true,
            why::ClaimSlot::Found(c) => why::is_for_driver(driver, c, &snap.classes),
            why::ClaimSlot::Extended(c) => why::is_for_driver(driver, c, &snap.classes),
            why::ClaimSlot::Missing { .. } => true,
        })
        .collect();
    if mine.is_empty() {
        return Err(CliError::Usage(format!("{target} has no claim for {driver} devices")));
    }
    let cluster = Cluster::build(driver, snap.slices, &snap.claims);
    if cluster.nodes.is_empty() && !snap.sight.blind() {
        return Err(no_nodes(driver, &snap.server, &[]));
    }
    let w = why::why(&cluster, pod.as_ref(), &mine, &snap.classes, snap.nodes.as_deref(), &snap.sight);
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &w)?,
        Format::Table => {
            for line in why::text(&w) {
                writeln!(out, "{line}")?;
            }
        }
    }
    exit_without_freeing(cluster);
    Ok(())
}

/// The command ends next: freeing a big cluster's devices one by one took a fifth of a
/// second at 200 nodes, for memory the process hands back whole when it exits.
fn exit_without_freeing(cluster: Cluster) {
    std::mem::forget(cluster);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pod,
    Claim,
}

/// The pod's claims in its spec's order: the claim named directly, or the one its template made
/// (from the pod's status; missing until the controller has made it); then the claim the scheduler
/// made for its extended resources, once made.
fn pod_claims<'a>(pod: &Pod, find: &dyn Fn(&str) -> Option<&'a ResourceClaim>) -> Vec<why::ClaimSlot<'a>> {
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    let extended = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|e| e.resource_claim_name.as_str());
    let spec = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    spec.into_iter()
        .flatten()
        .map(|rc| {
            let made =
                statuses.and_then(|s| s.iter().find(|s| s.name == rc.name)).and_then(|s| s.resource_claim_name.clone());
            let name = rc.resource_claim_name.clone().or(made);
            match name.as_deref().and_then(find) {
                Some(c) => why::ClaimSlot::Found(c),
                None => why::ClaimSlot::Missing {
                    name: name.unwrap_or_else(|| format!("(pod claim {})", rc.name)),
                    template: rc.resource_claim_template_name.clone(),
                },
            }
        })
        .chain(extended.and_then(find).map(why::ClaimSlot::Found))
        .collect()
}

/// The nodes `--node` and `-l` leave (publishing or silent); `None`: no filter. A name that is
/// neither, or a selector that leaves none, is the user's mistake, said in one line.
fn chosen(
    args: &UsageArgs,
    global: &Flags,
    selected: Option<&[String]>,
    publishing: &[&str],
    silent: &[String],
) -> Result<Option<BTreeSet<String>>, CliError> {
    let known = |n: &str| publishing.contains(&n) || silent.iter().any(|s| s == n);
    let mut keep: Option<BTreeSet<String>> = None;
    if !args.nodes.is_empty() {
        if let Some(bad) = args.nodes.iter().find(|n| !known(n)) {
            return Err(CliError::Usage(format!(
                "--node {bad:?}: no such node publishes {} devices; nodes that do: {}",
                global.driver_name,
                publishing.join(", ")
            )));
        }
        keep = Some(args.nodes.iter().cloned().collect());
    }
    if let Some(selector) = &args.selector {
        let matching = selected.unwrap_or_default();
        let by_label: BTreeSet<String> = matching.iter().filter(|n| known(n)).cloned().collect();
        if by_label.is_empty() {
            return Err(CliError::Usage(format!(
                "-l {selector:?}: {} node(s) match, none of them publishing {} devices",
                matching.len(),
                global.driver_name
            )));
        }
        keep = Some(match keep {
            Some(k) => k.intersection(&by_label).cloned().collect(),
            None => by_label,
        });
    }
    Ok(keep)
}

fn no_nodes(driver: &str, server: &str, silent: &[String]) -> CliError {
    let opted =
        if silent.is_empty() { String::new() } else { format!(" ({} opted in: {})", silent.len(), silent.join(", ")) };
    CliError::Failed(format!(
        "no node publishes {driver} devices at {server}{opted}: is migdra installed, and are its DaemonSet's \
         pods Ready?"
    ))
}

/// Slices, claims and classes (and the pod, when asked) from the API server, read concurrently.
fn read(global: &Flags, reads: Reads<'_>) -> Result<(Snapshot, Option<Pod>), CliError> {
    let Reads { namespace, pod, node_selector } = reads;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("failed to start the runtime: {e}")))?;
    runtime.block_on(async {
        let kubeconfig = match &global.kubeconfig {
            Some(path) => Some((path.as_path(), serve::read_kubeconfig(path)?)),
            None => None,
        };
        let (client, server) = serve::kube_client(kubeconfig).await?;
        let namespace = namespace.map_or_else(|| client.default_namespace().to_string(), str::to_string);
        let failed = |what: &str, e: kube::Error| {
            CliError::Failed(format!("failed to read {what} from {server}: {}", crate::kube::error_text(&e)))
        };
        let all = ListParams::default();
        let claims_api = Api::<ResourceClaim>::all(client.clone());
        let classes_api = Api::<DeviceClass>::all(client.clone());
        let nodes_api = Api::<Node>::all(client.clone());
        let reads = async {
            tokio::join!(
                slices(&client),
                claims_api.list(&all),
                classes_api.list(&all),
                async {
                    match pod {
                        Some(name) => Api::<Pod>::namespaced(client.clone(), &namespace).get_opt(name).await.map(Some),
                        None => Ok(None),
                    }
                },
                nodes_api.list(&all),
                async {
                    match node_selector {
                        Some(l) => nodes_api.list_metadata(&ListParams::default().labels(l)).await.map(Some),
                        None => Ok(None),
                    }
                },
            )
        };
        let (slices, claims, classes, found, nodes, selected) =
            tokio::time::timeout(BUDGET, reads).await.map_err(|_| {
                CliError::Failed(format!("the API server at {server} did not answer in {}s", BUDGET.as_secs()))
            })?;
        // A tenant's rights end at their namespace: what they may not read is left out and said
        // (why::Sight), and `usage`, which needs all of it, refuses with what is missing.
        let mut sight = why::Sight::default();
        let slices = match slices {
            Err(e) if forbidden(&e) => {
                sight.unread.push(why::Sight::SLICES.into());
                Vec::new()
            }
            s => s.map_err(|e| failed("ResourceSlices", e))?,
        };
        let classes = match classes {
            Err(e) if forbidden(&e) => {
                sight.unread.push(why::Sight::CLASSES.into());
                Vec::new()
            }
            c => c.map_err(|e| failed("DeviceClasses", e))?.items,
        };
        let claims = match claims {
            Err(e) if forbidden(&e) => {
                let mine = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
                let claims = tokio::time::timeout(BUDGET, mine.list(&all)).await.map_err(|_| {
                    CliError::Failed(format!("the API server at {server} did not answer in {}s", BUDGET.as_secs()))
                })?;
                match claims {
                    Err(e) if forbidden(&e) => {
                        sight.unread.push(why::Sight::CLAIMS.into());
                        Vec::new()
                    }
                    c => {
                        sight.claims_only_in = Some(namespace.clone());
                        c.map_err(|e| failed("ResourceClaims", e))?.items
                    }
                }
            }
            c => c.map_err(|e| failed("ResourceClaims", e))?.items,
        };
        // Not fatal: without them the answer leaves the Node side out and says so.
        let nodes = nodes.ok().map(|l| l.items.iter().map(NodeView::of).collect());
        let selected = selected
            .map_err(|e| match &e {
                // The API server's own words name what it could not parse.
                kube::Error::Api(a) if a.code == 400 => CliError::Usage(format!(
                    "-l {:?}: {}",
                    node_selector.unwrap_or_default(),
                    crate::kube::error_text(&e)
                )),
                _ => failed("Nodes", e),
            })?
            .map(|l| l.items.into_iter().filter_map(|n| n.metadata.name).collect());
        let pod = match (pod, found.map_err(|e| failed("the pod", e))?) {
            (Some(name), Some(None)) => return Err(CliError::Usage(format!("pod {namespace}/{name} not found"))),
            (_, found) => found.flatten(),
        };
        Ok((Snapshot { server, namespace, slices, claims, classes, sight, nodes, selected }, pod))
    })
}

/// The API server refused the read for the user's rights (403).
fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(a) if a.code == 403)
}

/// Slices per page: a big cluster's slices come in pages, each parsed on another thread while
/// the next is fetched (200 nodes of 8 H100s publish about 40 MB of JSON).
const PAGE: u32 = 100;

/// A page as the API server sent it: protobuf, or JSON from a server or proxy that does not
/// speak it.
enum Page {
    Protobuf(prost::bytes::Bytes),
    Json(String),
}

/// Every ResourceSlice, page by page, in the API server's protobuf encoding: it writes that in
/// about half the time of JSON, and writing 42 MB of JSON was most of `why`'s second at 200 nodes.
async fn slices(client: &kube::Client) -> Result<Vec<wire::Slice>, kube::Error> {
    let request = kube::core::Request::new("/apis/resource.k8s.io/v1/resourceslices");
    let mut parsing = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        lp.continue_token = token.take();
        let page = page(client, || request.list(&lp).map_err(kube::Error::BuildRequest)).await?;
        // The token first: skipping the items is a tenth of parsing them.
        let next = match &page {
            Page::Protobuf(body) => wire::protobuf::continue_token(body).map_err(|e| kube::Error::Service(e.into()))?,
            Page::Json(text) => {
                serde_json::from_str::<wire::List<serde::de::IgnoredAny>>(text)
                    .map_err(kube::Error::SerdeError)?
                    .metadata
                    .continue_
            }
        };
        parsing.push(tokio::task::spawn_blocking(move || match page {
            Page::Protobuf(body) => wire::protobuf::items(&body).map_err(|e| kube::Error::Service(e.into())),
            Page::Json(text) => {
                serde_json::from_str::<wire::List<wire::Slice>>(&text).map(|l| l.items).map_err(kube::Error::SerdeError)
            }
        }));
        match next {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => break,
        }
    }
    let mut all = Vec::new();
    for page in parsing {
        all.extend(page.await.map_err(|e| kube::Error::Service(e.into()))??);
    }
    Ok(all)
}

/// One page, asked for in protobuf. A refusal is asked again in JSON, so that kube reads the
/// API server's own error (its Status would come in protobuf too).
async fn page(
    client: &kube::Client,
    request: impl Fn() -> Result<http::Request<Vec<u8>>, kube::Error>,
) -> Result<Page, kube::Error> {
    let mut protobuf = request()?;
    let accept = format!("{}, application/json", wire::protobuf::MEDIA_TYPE);
    protobuf.headers_mut().insert(http::header::ACCEPT, accept.parse().expect("a valid header value"));
    let response = client.send(protobuf.map(kube::client::Body::from)).await?;
    if !response.status().is_success() {
        return client.request_text(request()?).await.map(Page::Json);
    }
    let is_protobuf = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(wire::protobuf::MEDIA_TYPE));
    let body = response.into_body().collect_bytes().await?;
    if is_protobuf {
        Ok(Page::Protobuf(body))
    } else {
        String::from_utf8(body.to_vec()).map(Page::Json).map_err(kube::Error::FromUtf8)
    }
}

/// One line per node: its GPUs, memory slices held, claims and tainted GPUs; then the profiles.
fn summary(u: &usage::Usage, out: &mut dyn Write) -> std::io::Result<()> {
    let mut rows: Vec<Vec<String>> = u
        .nodes
        .iter()
        .map(|n| {
            let slices: usize = n.gpus.iter().map(|g| g.slices.len()).sum();
            let held: usize = n.gpus.iter().map(|g| g.slices.chars().filter(|c| *c != '.').count()).sum();
            let claims: BTreeSet<&str> =
                n.gpus.iter().flat_map(|g| g.holders.iter().map(|h| h.claim.as_str())).collect();
            let tainted = n.gpus.iter().filter(|g| !g.taints.is_empty() || g.lost).count();
            vec![
                n.node.clone(),
                n.gpus.len().to_string(),
                format!("{held}/{slices}"),
                claims.len().to_string(),
                tainted.to_string(),
            ]
        })
        .collect();
    rows.extend(
        u.silent.iter().map(|n| vec![n.clone(), "-".into(), "publishes nothing".into(), "-".into(), "-".into()]),
    );
    output::table(out, &["NODE", "GPUS", "SLICES HELD", "CLAIMS", "TAINTED GPUS"], &rows)?;
    writeln!(out)?;
    profiles(u, out)
}

/// Per node, per GPU: a header, the slice numbers, one letter per slice (`.` free) and a legend
/// line per claim; then per profile what is in use and what could be allocated now.
fn picture(u: &usage::Usage, out: &mut dyn Write) -> std::io::Result<()> {
    let num = |v: Option<i64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
    for node in &u.silent {
        writeln!(out, "NODE {node}  opted in to migdra, publishes nothing: is migdra's pod Running there?")?;
    }
    for n in &u.nodes {
        writeln!(out, "NODE {}", n.node)?;
        for g in &n.gpus {
            let mut marks = String::new();
            if g.lost {
                marks.push_str("  LOST");
            }
            if !g.taints.is_empty() {
                marks.push_str(&format!("  TAINTED {}", g.taints.join(", ")));
            }
            let mig = if g.mig { "" } else { "  MIG off (one whole GPU)" };
            writeln!(
                out,
                "  gpu-{}  GPU {}  slurm {}  {}  {}{mig}{marks}",
                num(g.minor),
                num(g.index),
                num(g.slurm_gpu_index),
                g.product,
                g.uuid
            )?;
            let numbers: String = (0..g.memory_slices).map(|s| format!("{s:>2}")).collect();
            let cells: String = g.slices.chars().map(|c| format!("{c:>2}")).collect();
            writeln!(out, "    slice{numbers}")?;
            writeln!(out, "         {cells}")?;
            for h in &g.holders {
                let at = match (h.placement_start, h.placement_size) {
                    (Some(s), Some(n)) => format!(" at {s}:{n}"),
                    _ => String::new(),
                };
                let pod = h.pod.as_deref().map_or_else(|| "(no pod)".to_string(), |p| format!("{}/{p}", h.namespace));
                writeln!(out, "    {}  {pod}  claim {}  {}{at}  {}", h.letter, h.claim, h.profile, h.device)?;
            }
        }
    }
    writeln!(out)?;
    profiles(u, out)
}

/// Per profile: placements in use, free now, and on how many nodes.
fn profiles(u: &usage::Usage, out: &mut dyn Write) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = u
        .profiles
        .iter()
        .map(|p| vec![p.profile.clone(), p.in_use.to_string(), p.free.to_string(), p.free_nodes.to_string()])
        .collect();
    output::table(out, &["PROFILE", "IN USE", "FREE NOW", "ON NODES"], &rows)
}
