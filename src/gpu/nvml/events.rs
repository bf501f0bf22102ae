//! XID events from NVML, turned into device health.
//!
//! A thread waits on an NVML event set registered for XidCriticalError on every GPU and writes
//! what it hears into a [`HealthBook`]; the backend reads the book in `gpus()` and
//! `gpu_instances()`, which the kubelet health stream already polls. A critical XID
//! ([`xid::is_critical`]) that names a GPU instance marks only that instance; one that names
//! none marks the whole GPU. An XID means someone should look, so health comes back only on
//! evidence: a GPU that was lost answering NVML again (it was reset), or the operator's
//! `migdra health clear`.

use super::ffi::{self, EventSet};
use crate::gpu::xid;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long one wait blocks: bounds how late the thread notices that it should stop.
const WAIT_MS: u32 = 500;

/// `NVML_ERROR_GPU_IS_LOST`: a wait that returns it means some GPU fell off the bus.
const GPU_IS_LOST: u32 = 15;

/// Which devices an XID made unhealthy, and why.
#[derive(Debug, Default)]
pub struct HealthBook {
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    /// GPU UUID → reason.
    gpus: HashMap<String, String>,
    /// (GPU UUID, GI ID) → reason.
    instances: HashMap<(String, u32), String>,
    /// GPUs seen lost (GPU_IS_LOST) and not yet seen answering again.
    lost: std::collections::HashSet<String>,
}

impl HealthBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn gpu_healthy(&self, uuid: &str) -> bool {
        !self.lock().gpus.contains_key(uuid)
    }

    pub fn instance_healthy(&self, uuid: &str, gi: u32) -> bool {
        !self.lock().instances.contains_key(&(uuid.to_string(), gi))
    }

    /// Apply one XID; returns whether it changed a device's health.
    pub fn record(&self, uuid: &str, gi: Option<u32>, xid: u64) -> bool {
        if !xid::is_critical(xid) {
            return false;
        }
        let mut book = self.lock();
        match gi {
            Some(gi) => book.instances.insert((uuid.to_string(), gi), xid::reason(xid)).is_none(),
            None => book.gpus.insert(uuid.to_string(), xid::reason(xid)).is_none(),
        }
    }

    /// What made a GPU (or one of its GPU instances) unhealthy.
    pub fn reason(&self, uuid: &str, gi: Option<u32>) -> Option<String> {
        let book = self.lock();
        match gi {
            Some(gi) => book.instances.get(&(uuid.to_string(), gi)).cloned(),
            None => book.gpus.get(uuid).cloned(),
        }
    }

    /// Mark a GPU unhealthy for a reason other than an XID.
    pub fn lost(&self, uuid: &str, why: &str) {
        self.lock().gpus.entry(uuid.to_string()).or_insert_with(|| why.to_string());
    }

    /// Follow whether NVML reaches the GPU. A GPU that was lost and answers again has been reset
    /// (only a reset brings one back onto the bus), which clears its errors and its instances':
    /// its health, and its taint, come back without restarting migdra. Returns whether it did.
    pub fn reachable(&self, uuid: &str, reachable: bool) -> bool {
        let mut book = self.lock();
        if !reachable {
            book.lost.insert(uuid.to_string());
            return false;
        }
        if !book.lost.remove(uuid) {
            return false;
        }
        drop(book);
        self.clear(uuid);
        true
    }

    /// Forget a GPU's errors and its instances' (the operator's `migdra health clear`).
    pub fn clear(&self, uuid: &str) {
        let mut book = self.lock();
        book.gpus.remove(uuid);
        book.instances.retain(|(gpu, _), _| gpu != uuid);
    }

    /// A destroyed GPU instance takes its errors with it: a new one may reuse its ID.
    pub fn forget_instance(&self, uuid: &str, gi: u32) {
        self.lock().instances.remove(&(uuid.to_string(), gi));
    }
}

/// The event thread; it stops (within [`WAIT_MS`]) when this is dropped.
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Start watching `gpus` (NVML index, UUID). Returns once every GPU is registered, so no XID
/// after this call is missed. GPUs that cannot deliver XID events are logged and skipped; an
/// NVML without event sets is an error (the caller runs without health events then).
pub fn watch(nvml: Arc<Nvml>, gpus: Vec<(u32, String)>, book: Arc<HealthBook>) -> Result<Watcher, ffi::RawError> {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || {
            // The set borrows `nvml` and holds a raw pointer, so it lives on this thread only.
            let set = match EventSet::new(&nvml) {
                Ok(set) => set,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let mut keys = Vec::new();
            for (index, uuid) in &gpus {
                let registered = nvml
                    .device_by_index(*index)
                    .map_err(|e| e.to_string())
                    .and_then(|d| set.register(&d, ffi::EVENT_XID).map(|()| ffi::device_key(&d)).map_err(fmt));
                match registered {
                    Ok(key) => keys.push((key, uuid.clone())),
                    Err(e) => tracing::warn!(gpu = %uuid, error = %e, "no XID events from this GPU"),
                }
            }
            // One wait that does not block before saying ready: the caller then knows the set
            // answers, and what it returned is handled like any other wait's.
            let first = set.wait(0);
            let _ = ready_tx.send(Ok(()));
            handle(first, &keys, &book);
            run(&set, &keys, &book, &flag);
        })
        .map_err(|_| ffi::RawError { call: "spawn the NVML event thread", ret: 999 })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Watcher { stop }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ffi::RawError { call: "nvmlEventSetCreate", ret: 999 }),
    }
}

fn fmt(e: ffi::RawError) -> String {
    format!("{} returned {}", e.call, crate::gpu::NvmlCode::from_value(e.ret))
}

fn run(set: &EventSet<'_>, keys: &[(usize, String)], book: &HealthBook, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        handle(set.wait(WAIT_MS), keys, book);
    }
}

fn handle(waited: ffi::RawResult<Option<ffi::Event>>, keys: &[(usize, String)], book: &HealthBook) {
    match waited {
        Ok(None) => {}
        Ok(Some(ev)) if ev.event_type & ffi::EVENT_XID != 0 => {
            let Some((_, uuid)) = keys.iter().find(|(k, _)| *k == ev.device) else { return };
            let changed = book.record(uuid, ev.gi, ev.data);
            if xid::is_critical(ev.data) {
                tracing::warn!(gpu = %uuid, gi = ?ev.gi, ci = ?ev.ci, xid = ev.data, changed, "XID: device unhealthy");
            } else {
                tracing::info!(
                    gpu = %uuid,
                    gi = ?ev.gi,
                    xid = ev.data,
                    "XID caused by an application; device stays healthy"
                );
            }
        }
        Ok(Some(_)) => {}
        Err(e) if e.ret == GPU_IS_LOST => {
            for (_, uuid) in keys {
                book.lost(uuid, "NVML: GPU is lost");
            }
            tracing::error!("NVML event wait: GPU is lost; every GPU is marked unhealthy");
            std::thread::sleep(Duration::from_secs(1));
        }
        Err(e) => {
            tracing::warn!(error = %fmt(e), "NVML event wait failed");
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn critical_xids_mark_the_gpu_or_only_the_instance() {
        let b = HealthBook::default();
        assert!(!b.record("GPU-a", None, 13), "an application's XID");
        assert!(b.gpu_healthy("GPU-a"));
        assert!(b.record("GPU-a", Some(3), 94));
        assert!(!b.record("GPU-a", Some(3), 94), "already unhealthy");
        assert!(b.gpu_healthy("GPU-a") && !b.instance_healthy("GPU-a", 3) && b.instance_healthy("GPU-a", 4));
        assert_eq!(b.reason("GPU-a", Some(3)).as_deref(), Some("XID 94"));
        assert_eq!(b.reason("GPU-a", None), None);
        b.forget_instance("GPU-a", 3);
        assert!(b.instance_healthy("GPU-a", 3));
        assert!(b.record("GPU-b", None, 79));
        assert!(!b.gpu_healthy("GPU-b") && b.gpu_healthy("GPU-a"));
        b.lost("GPU-c", "lost");
        assert!(!b.gpu_healthy("GPU-c"));
    }

    #[test]
    fn a_lost_gpu_that_answers_again_was_reset_and_is_healthy_again() {
        let b = HealthBook::default();
        assert!(b.record("GPU-a", None, 48) && b.record("GPU-a", Some(2), 94) && b.record("GPU-b", None, 79));
        assert!(!b.reachable("GPU-a", true), "never lost: an XID alone stays until someone looks");
        assert!(!b.gpu_healthy("GPU-a"));
        assert!(!b.reachable("GPU-a", false) && !b.reachable("GPU-a", false));
        assert!(b.reachable("GPU-a", true), "back on the bus");
        assert!(b.gpu_healthy("GPU-a") && b.instance_healthy("GPU-a", 2));
        assert!(!b.reachable("GPU-a", true), "once");
        assert!(!b.gpu_healthy("GPU-b"), "another GPU keeps its XID");
    }
}
