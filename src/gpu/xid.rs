//! Which XID events make a device unhealthy: one policy for both backends.
//!
//! An XID is the driver's error report for a GPU. Some are caused by the application (a bad
//! kernel, a page fault in user code) and leave the GPU usable; every other one means the GPU, or
//! the MIG instance it names, should take no new work until an operator looks at it.

/// XIDs that an application causes; the GPU stays healthy. The list NVIDIA's Kubernetes device
/// plugin skips by default (`applicationErrorXids` in its health check): 13 graphics engine
/// exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
/// 68 video processor exception.
pub const APPLICATION_XIDS: [u64; 5] = [13, 31, 43, 45, 68];

/// XID 79, "GPU has fallen off the bus": what `migdra sim health --unhealthy` simulates for a GPU.
pub const XID_FALLEN_OFF_BUS: u64 = 79;

/// XID 94, a contained ECC error inside one MIG instance: what the simulator reports for an
/// unhealthy GPU instance.
pub const XID_CONTAINED_ECC: u64 = 94;

/// How both backends word an XID as the reason a device is unhealthy (`XID 79`).
pub fn reason(xid: u64) -> String {
    format!("XID {xid}")
}

/// The XID in a reason [`reason`] wrote; `None` for any other reason (a lost GPU).
pub fn from_reason(reason: &str) -> Option<u64> {
    reason.strip_prefix("XID ")?.parse().ok()
}

/// Whether this XID marks its GPU (or the GPU instance it names) unhealthy.
pub fn is_critical(xid: u64) -> bool {
    !APPLICATION_XIDS.contains(&xid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_are_not_critical_and_the_rest_are() {
        for x in APPLICATION_XIDS {
            assert!(!is_critical(x), "{x}");
        }
        for x in [XID_FALLEN_OFF_BUS, XID_CONTAINED_ECC, 48, 62, 95, 0] {
            assert!(is_critical(x), "{x}");
        }
    }

    #[test]
    fn a_reason_gives_back_its_xid_and_nothing_else_does() {
        assert_eq!(from_reason(&reason(79)), Some(79));
        assert_eq!(from_reason("NVML: GPU is lost"), None);
        assert_eq!(from_reason("XID x"), None);
    }
}
