//! `kubectl migdra usage`: every migdra GPU's memory slices with one letter per claim holding
//! them, and per profile how many placements are in use and how many the scheduler could give
//! out now.

use super::model::{Cluster, Gpu};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Serialize)]
pub struct Usage {
    pub nodes: Vec<NodeUsage>,
    pub profiles: Vec<ProfileUsage>,
    /// Nodes opted in to migdra that publish no devices (migdra down there, or its slices gone):
    /// filled by the caller, which reads the Node objects.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub silent: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct NodeUsage {
    pub node: String,
    pub gpus: Vec<GpuUsage>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUsage {
    pub uuid: String,
    pub index: Option<i64>,
    pub minor: Option<i64>,
    pub slurm_gpu_index: Option<i64>,
    pub product: String,
    pub mig: bool,
    pub memory_slices: u32,
    /// One character per memory slice: the holder's letter, `.` free.
    pub slices: String,
    pub taints: Vec<String>,
    pub lost: bool,
    pub holders: Vec<HolderUsage>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderUsage {
    pub letter: char,
    pub namespace: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub claim: String,
    pub request: String,
    pub device: String,
    /// The MIG profile, or `whole GPU`.
    pub profile: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement_start: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement_size: Option<u32>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileUsage {
    /// The MIG profile, or `whole GPU`.
    pub profile: String,
    pub in_use: usize,
    /// Placements the scheduler could allocate now, each on its own (they may overlap).
    pub free: usize,
    /// Nodes with at least one of them.
    pub free_nodes: usize,
}

/// The whole-GPU row's name in the profile table.
pub const WHOLE: &str = "whole GPU";

pub fn usage(cluster: &Cluster) -> Usage {
    let nodes = cluster
        .nodes
        .iter()
        .map(|n| NodeUsage { node: n.name.clone(), gpus: n.gpus.iter().map(|g| gpu(cluster, g)).collect() })
        .collect();
    Usage { nodes, profiles: profiles(cluster), silent: Vec::new() }
}

fn gpu(cluster: &Cluster, g: &Gpu) -> GpuUsage {
    let mut holders = Vec::new();
    let mut letters: BTreeMap<(&str, &str), char> = BTreeMap::new();
    let mut held: Vec<_> = g.devices.iter().filter(|d| d.holder.is_some()).collect();
    held.sort_by_key(|d| d.placement.map_or(0, |p| p.0));
    for d in held {
        let Some(h) = &d.holder else { continue };
        let next = letter(letters.len());
        let letter = *letters.entry((&h.namespace, &h.claim)).or_insert(next);
        holders.push(HolderUsage {
            letter,
            namespace: h.namespace.clone(),
            pod: h.pod.clone(),
            claim: h.claim.clone(),
            request: h.request.clone(),
            device: d.name().to_string(),
            profile: d.profile.clone().unwrap_or_else(|| WHOLE.to_string()),
            placement_start: d.placement.map(|p| p.0),
            placement_size: d.placement.map(|p| p.1),
        });
    }
    let slices = g
        .slice_holders()
        .iter()
        .map(|h| h.map_or('.', |h| letters.get(&(h.namespace.as_str(), h.claim.as_str())).copied().unwrap_or('?')))
        .collect();
    GpuUsage {
        uuid: g.uuid.clone(),
        index: g.index,
        minor: g.minor,
        slurm_gpu_index: g.slurm_index,
        product: g.product.clone(),
        mig: g.mig,
        memory_slices: g.memory_slices,
        slices,
        taints: g.taints(),
        lost: g.lost(&cluster.driver),
        holders,
    }
}

/// A, B, … Z, a, … z, then digits: one per claim on a GPU (a GPU has at most 8 memory slices).
fn letter(i: usize) -> char {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char::from(ALPHABET[i % ALPHABET.len()])
}

fn profiles(cluster: &Cluster) -> Vec<ProfileUsage> {
    let mut rows: BTreeMap<String, (usize, usize, BTreeSet<&str>)> = BTreeMap::new();
    for node in &cluster.nodes {
        for d in node.gpus.iter().flat_map(|g| &g.devices) {
            let name = d.profile.clone().unwrap_or_else(|| WHOLE.to_string());
            let row = rows.entry(name).or_default();
            if d.holder.is_some() {
                row.0 += 1;
            } else if node.fits(d) && d.taints().next().is_none() {
                row.1 += 1;
                row.2.insert(&node.name);
            }
        }
    }
    rows.into_iter()
        .map(|(profile, (in_use, free, nodes))| ProfileUsage { profile, in_use, free, free_nodes: nodes.len() })
        .collect()
}
