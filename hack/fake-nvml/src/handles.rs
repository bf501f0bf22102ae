//! Opaque NVML handles as numbers: what a handle names is encoded in its value, so the fake keeps
//! no table and a handle to a destroyed instance is simply stale. NVML's callers never
//! dereference handles, so these need not point anywhere.

/// What a handle names. GPUs by NVML index, instances by their IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    Gpu(u32),
    Gi {
        gpu: u32,
        gi: u32,
    },
    Ci {
        gpu: u32,
        gi: u32,
        ci: u32,
    },
    /// The MIG device handle of a CI (`nvmlComputeInstanceInfo_t.device`).
    Mig {
        gpu: u32,
        gi: u32,
        ci: u32,
    },
    EventSet(u32),
}

const TAG_SHIFT: u32 = 44;

impl Handle {
    pub fn encode(self) -> usize {
        let (tag, gpu, gi, ci) = match self {
            Handle::Gpu(g) => (1, g, 0, 0),
            Handle::Gi { gpu, gi } => (2, gpu, gi, 0),
            Handle::Ci { gpu, gi, ci } => (3, gpu, gi, ci),
            Handle::Mig { gpu, gi, ci } => (4, gpu, gi, ci),
            Handle::EventSet(n) => (5, n, 0, 0),
        };
        (tag << TAG_SHIFT) | ((gpu as usize) << 20) | ((gi as usize & 0xFF) << 8) | (ci as usize & 0xFF) | 0x1_0000
    }

    pub fn decode(v: usize) -> Option<Handle> {
        if v & 0x1_0000 == 0 {
            return None;
        }
        let gpu = ((v >> 20) & 0xFF_FFFF) as u32;
        let (gi, ci) = (((v >> 8) & 0xFF) as u32, (v & 0xFF) as u32);
        match v >> TAG_SHIFT {
            1 => Some(Handle::Gpu(gpu)),
            2 => Some(Handle::Gi { gpu, gi }),
            3 => Some(Handle::Ci { gpu, gi, ci }),
            4 => Some(Handle::Mig { gpu, gi, ci }),
            5 => Some(Handle::EventSet(gpu)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_junk_is_rejected() {
        for h in [
            Handle::Gpu(0),
            Handle::Gpu(63),
            Handle::Gi { gpu: 3, gi: 14 },
            Handle::Ci { gpu: 7, gi: 0, ci: 7 },
            Handle::Mig { gpu: 1, gi: 2, ci: 3 },
            Handle::EventSet(9),
        ] {
            assert_ne!(h.encode(), 0);
            assert_eq!(Handle::decode(h.encode()), Some(h));
        }
        assert_eq!(Handle::decode(0), None);
        assert_eq!(Handle::decode(0x1234), None);
        assert_ne!(Handle::Gi { gpu: 1, gi: 2 }.encode(), Handle::Mig { gpu: 1, gi: 2, ci: 0 }.encode());
    }
}
