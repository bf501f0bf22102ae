//! The catalog's data: one function per GPU model, transcribed from `docs/facts/mig-nvml.md` §1.
//!
//! Every number here is a fact from that file (section given per model). Rows it marks as
//! inferred or unverified carry `Evidence::Inferred`/`Unverified` and a note saying why.

use super::profile::{Evidence, GpuModel, gi};

/// Every model migdra knows, in the order `migdra profiles` lists them.
pub(super) fn all() -> Vec<GpuModel> {
    vec![
        a100_40gb(),
        a100_80gb(),
        a30_24gb(),
        h100_80gb(),
        h100_94gb(),
        gh200_96gb(),
        gh200_144gb(),
        h200_141gb(),
        b200_180gb(),
        gb200_186gb(),
        b300_269gb(),
        gb300_278gb(),
        rtx_pro_6000(),
    ]
}

/// The lgipp placement lists shared by every 8-slot GPU (A100, H100, H200, GH200, B200 and the later
/// Blackwells).
const ALL7: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN4: &[u32] = &[0, 2, 4, 6];
const EVEN3: &[u32] = &[0, 2, 4];
const HALVES: &[u32] = &[0, 4];
const WHOLE: &[u32] = &[0];

/// H100 80GB SXM (docs/facts/mig-nvml.md §1.4): real lgip from several drivers plus lgipp; newer-driver memory.
fn h100_80gb() -> GpuModel {
    const ALL7: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
    GpuModel {
        key: "h100-80gb".into(),
        product_name: "NVIDIA H100 80GB HBM3".into(),
        // H100 PCIe (0x2331) is left out: it has 114 SMs, so its profiles differ; NVML describes it.
        nvml_names: vec!["NVIDIA H800".into()],
        pci_device_ids: vec![0x2330, 0x2322, 0x2324],
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_mib: 81559,
        multiprocessors: 132,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.10gb", 0, 19, 1, 1, 7, 9856, 16, [1, 1, 0, 1, 0], ALL7),
            gi("1g.10gb+me", 7, 20, 1, 1, 1, 9856, 16, [1, 1, 0, 1, 1], ALL7),
            gi("1g.20gb", 9, 15, 1, 2, 4, 19968, 26, [1, 1, 0, 1, 0], &[0, 2, 4, 6]),
            gi("2g.20gb", 1, 14, 2, 2, 3, 19968, 32, [2, 2, 0, 2, 0], &[0, 2, 4]),
            gi("3g.40gb", 2, 9, 3, 4, 2, 40192, 60, [3, 3, 0, 3, 0], &[0, 4]),
            gi("4g.40gb", 3, 5, 4, 4, 1, 40192, 64, [4, 4, 0, 4, 0], &[0]),
            gi("7g.80gb", 4, 0, 7, 8, 1, 81152, 132, [8, 7, 0, 7, 1], &[0]),
        ],
        evidence: Evidence::Inferred,
        note: "profile memory is the newer drivers' (9.62/19.50/39.25 GiB); whole-GPU memory \
               81559 MiB and 132 SMs are not in the facts"
            .into(),
    }
}

/// A100-SXM4-40GB / A100-PCIE-40GB (docs/facts/mig-nvml.md §1.1): real lgip + lgipp, driver R525+ memory.
fn a100_40gb() -> GpuModel {
    GpuModel {
        key: "a100-40gb".into(),
        product_name: "NVIDIA A100-SXM4-40GB".into(),
        nvml_names: vec!["NVIDIA A100-PCIE-40GB".into()],
        pci_device_ids: vec![0x20B0, 0x20F1, 0x20B1, 0x20F6],
        architecture: "Ampere".into(),
        cuda_compute_capability: (8, 0),
        memory_mib: 40960,
        multiprocessors: 108,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.5gb", 0, 19, 1, 1, 7, 4864, 14, [1, 0, 0, 0, 0], ALL7),
            gi("1g.5gb+me", 7, 20, 1, 1, 1, 4864, 14, [1, 1, 0, 1, 1], ALL7),
            gi("1g.10gb", 9, 15, 1, 2, 4, 9856, 14, [1, 1, 0, 0, 0], EVEN4),
            gi("2g.10gb", 1, 14, 2, 2, 3, 9856, 28, [2, 1, 0, 0, 0], EVEN3),
            gi("3g.20gb", 2, 9, 3, 4, 2, 19968, 42, [3, 2, 0, 0, 0], HALVES),
            gi("4g.20gb", 3, 5, 4, 4, 1, 19968, 56, [4, 2, 0, 0, 0], WHOLE),
            gi("7g.40gb", 4, 0, 7, 8, 1, 40192, 98, [7, 5, 0, 1, 1], WHOLE),
        ],
        evidence: Evidence::Inferred,
        note: "profile rows observed (R525+ memory; R470 reads 2g 9.75, 3g/4g 19.62, 7g 39.50 GiB); \
               whole-GPU memory 40960 MiB (nvidia-smi) and 108 SMs (A100 spec) are not in the facts"
            .into(),
    }
}

/// A100-SXM4-80GB / A100 80GB PCIe (docs/facts/mig-nvml.md §1.2): lgip from two sources, placements as §1.1.
fn a100_80gb() -> GpuModel {
    GpuModel {
        key: "a100-80gb".into(),
        product_name: "NVIDIA A100-SXM4-80GB".into(),
        nvml_names: vec!["NVIDIA A100 80GB PCIe".into()],
        pci_device_ids: vec![0x20B2, 0x20B5],
        architecture: "Ampere".into(),
        cuda_compute_capability: (8, 0),
        memory_mib: 81920,
        multiprocessors: 108,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.10gb", 0, 19, 1, 1, 7, 9728, 14, [1, 0, 0, 0, 0], ALL7),
            gi("1g.10gb+me", 7, 20, 1, 1, 1, 9728, 14, [1, 1, 0, 1, 1], ALL7),
            gi("1g.20gb", 9, 15, 1, 2, 4, 19968, 14, [1, 1, 0, 0, 0], EVEN4).marked(
                Evidence::Unverified,
                "row not seen in real output: ID 15 from GCP/mig-parted, DEC 1 from the guide, \
                 memory ~19.5 GiB (19968 MiB, = 2g.20gb) is a guess",
            ),
            gi("2g.20gb", 1, 14, 2, 2, 3, 19968, 28, [2, 1, 0, 0, 0], EVEN3),
            gi("3g.40gb", 2, 9, 3, 4, 2, 40448, 42, [3, 2, 0, 0, 0], HALVES),
            gi("4g.40gb", 3, 5, 4, 4, 1, 40448, 56, [4, 2, 0, 0, 0], WHOLE),
            gi("7g.80gb", 4, 0, 7, 8, 1, 81152, 98, [7, 5, 0, 1, 1], WHOLE),
        ],
        evidence: Evidence::Inferred,
        note: "3g.40gb and 4g.40gb span the same 4 memory slices: both take 39.50 GiB, the only 4g.40gb \
               reading and one of the two 3g.40gb readings (the other, 39.25, has no 4g.40gb beside it); \
               whole-GPU memory 81920 MiB (nvidia-smi) and 108 SMs (A100 spec) are not in the facts"
            .into(),
    }
}

/// A30 24GB (docs/facts/mig-nvml.md §1.3): real lgip (driver 535.183.01); grid 4, 4 compute slices.
fn a30_24gb() -> GpuModel {
    const INFERRED: &str = "NVML index inferred from profile semantics; placements inferred from observed GIs \
                            and the go-nvml mock (no real -lgipp)";
    GpuModel {
        key: "a30-24gb".into(),
        product_name: "NVIDIA A30".into(),
        nvml_names: vec![],
        pci_device_ids: vec![0x20B7],
        architecture: "Ampere".into(),
        cuda_compute_capability: (8, 0),
        memory_mib: 24576,
        multiprocessors: 56,
        memory_slices: 4,
        compute_slices: 4,
        profiles: vec![
            gi("1g.6gb", 0, 14, 1, 1, 4, 5952, 14, [1, 1, 0, 0, 0], &[0, 1, 2, 3]).marked(
                Evidence::Inferred,
                "NVML index inferred from profile semantics; placements inferred from observed GIs and the \
                 go-nvml mock (no real -lgipp); DEC 1 from real lgip (the guide says 0)",
            ),
            gi("1g.6gb+me", 7, 21, 1, 1, 1, 5952, 14, [1, 1, 0, 1, 1], &[0, 1, 2, 3])
                .marked(Evidence::Inferred, INFERRED),
            gi("2g.12gb", 1, 5, 2, 2, 2, 11968, 28, [2, 2, 0, 0, 0], &[0, 2]).marked(Evidence::Inferred, INFERRED),
            gi("2g.12gb+me", 8, 6, 2, 2, 1, 11968, 28, [2, 2, 0, 1, 1], &[0, 2]).marked(Evidence::Inferred, INFERRED),
            gi("4g.24gb", 3, 0, 4, 4, 1, 24000, 56, [4, 4, 0, 1, 1], WHOLE).marked(Evidence::Inferred, INFERRED),
        ],
        evidence: Evidence::Inferred,
        note: "placements and NVML indexes inferred (no real -lgipp); whole-GPU memory 24576 MiB (24 GiB) and \
               56 SMs (A30 spec, = 4g.24gb) are not in the facts"
            .into(),
    }
}

/// H100 NVL / H100-94GB (docs/facts/mig-nvml.md §1.5): real lgip (driver 560.35.03); everything but memory as §1.4.
fn h100_94gb() -> GpuModel {
    GpuModel {
        key: "h100-94gb".into(),
        product_name: "NVIDIA H100 NVL".into(),
        nvml_names: vec!["NVIDIA H800 NVL".into()],
        pci_device_ids: vec![0x2321, 0x233A],
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_mib: 95830,
        multiprocessors: 132,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.12gb", 0, 19, 1, 1, 7, 11008, 16, [1, 1, 0, 1, 0], ALL7),
            gi("1g.12gb+me", 7, 20, 1, 1, 1, 11008, 16, [1, 1, 0, 1, 1], ALL7),
            gi("1g.24gb", 9, 15, 1, 2, 4, 22144, 26, [1, 1, 0, 1, 0], EVEN4),
            gi("2g.24gb", 1, 14, 2, 2, 3, 22144, 32, [2, 2, 0, 2, 0], EVEN3),
            gi("3g.47gb", 2, 9, 3, 4, 2, 47488, 60, [3, 3, 0, 3, 0], HALVES),
            gi("4g.47gb", 3, 5, 4, 4, 1, 47488, 64, [4, 4, 0, 4, 0], WHOLE),
            gi("7g.94gb", 4, 0, 7, 8, 1, 95360, 132, [8, 7, 0, 7, 1], WHOLE),
        ],
        evidence: Evidence::Inferred,
        note: "whole-GPU memory 95830 MiB (nvidia-smi) is not in the facts".into(),
    }
}

/// GH200 with 96 GB HBM3 (docs/facts/mig-nvml.md §1.6): real lgip memory and SM; same structure as H100 (§1.4).
fn gh200_96gb() -> GpuModel {
    GpuModel {
        key: "gh200-96gb".into(),
        product_name: "NVIDIA GH200 480GB".into(),
        nvml_names: vec!["NVIDIA GH200 120GB".into()],
        // mig-parted's group also holds 0x20B6 (PG506, a GA100 part) and 0x2329 (H20, fewer SMs):
        // left out, NVML describes those GPUs itself.
        pci_device_ids: vec![0x2342, 0x233D],
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_mib: 97871,
        multiprocessors: 132,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.12gb", 0, 19, 1, 1, 7, 11264, 16, [1, 1, 0, 1, 0], ALL7),
            gi("1g.12gb+me", 7, 20, 1, 1, 1, 11264, 16, [1, 1, 0, 1, 1], ALL7),
            gi("1g.24gb", 9, 15, 1, 2, 4, 23552, 26, [1, 1, 0, 1, 0], EVEN4),
            gi("2g.24gb", 1, 14, 2, 2, 3, 23552, 32, [2, 2, 0, 2, 0], EVEN3),
            gi("3g.48gb", 2, 9, 3, 4, 2, 47616, 60, [3, 3, 0, 3, 0], HALVES),
            gi("4g.48gb", 3, 5, 4, 4, 1, 47616, 64, [4, 4, 0, 4, 0], WHOLE),
            gi("7g.96gb", 4, 0, 7, 8, 1, 95232, 132, [8, 7, 0, 7, 1], WHOLE),
        ],
        evidence: Evidence::Inferred,
        note: "engines (except 7g) and placements per the facts' \"same structure as H100\"; whole-GPU memory \
               97871 MiB and 132 SMs are not in the facts (97871 fits go-nvlib's profile names)"
            .into(),
    }
}

/// GH200 144G HBM3e (docs/facts/mig-nvml.md §1.6): 1g/2g rows real (mig-parted PR #139); 3g/4g/7g not seen.
fn gh200_144gb() -> GpuModel {
    GpuModel {
        key: "gh200-144gb".into(),
        product_name: "NVIDIA GH200 144G HBM3e".into(),
        nvml_names: vec![],
        pci_device_ids: vec![0x2348],
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_mib: 146831,
        multiprocessors: 132,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.18gb", 0, 19, 1, 1, 7, 17920, 16, [1, 1, 0, 1, 0], ALL7),
            gi("1g.18gb+me", 7, 20, 1, 1, 1, 17920, 16, [1, 1, 0, 1, 1], ALL7),
            gi("1g.36gb", 9, 15, 1, 2, 4, 36096, 26, [1, 1, 0, 1, 0], EVEN4),
            gi("2g.36gb", 1, 14, 2, 2, 3, 36096, 32, [2, 2, 0, 2, 0], EVEN3),
            gi("3g.72gb", 2, 9, 3, 4, 2, 72192, 60, [3, 3, 0, 3, 0], HALVES).marked(
                Evidence::Unverified,
                "row not seen: memory 70.50 GiB is a placeholder (2 x the observed 35.25 GiB 2/8 profiles); \
                 SM 60 assumed and engines taken from H100",
            ),
            gi("4g.72gb", 3, 5, 4, 4, 1, 72192, 64, [4, 4, 0, 4, 0], WHOLE).marked(
                Evidence::Unverified,
                "row not seen: memory 70.50 GiB is a placeholder (2 x the observed 35.25 GiB 2/8 profiles); \
                 SM 64 assumed and engines taken from H100",
            ),
            gi("7g.144gb", 4, 0, 7, 8, 1, 144384, 132, [8, 7, 0, 7, 1], WHOLE).marked(
                Evidence::Unverified,
                "row not seen: memory 141.00 GiB is a placeholder (4 x the observed 35.25 GiB 2/8 profiles); \
                 SM 132 and engines taken from H100",
            ),
        ],
        evidence: Evidence::Inferred,
        note: "engines of the observed rows and all placements per the facts' \"same structure as H100\"; \
               whole-GPU memory 146831 MiB and 132 SMs are not in the facts (146831 fits go-nvlib's profile names)"
            .into(),
    }
}

/// H200 141GB SXM and H200 NVL (docs/facts/mig-nvml.md §1.7): real lgip (mig-parted #120), no -lgipp.
fn h200_141gb() -> GpuModel {
    const PLACEMENTS: &str = "placements assumed to be H100's (identical IDs and slice sizes; no -lgipp seen)";
    GpuModel {
        key: "h200-141gb".into(),
        product_name: "NVIDIA H200".into(),
        nvml_names: vec!["NVIDIA H200 NVL".into()],
        pci_device_ids: vec![0x2335, 0x233B],
        architecture: "Hopper".into(),
        cuda_compute_capability: (9, 0),
        memory_mib: 143771,
        multiprocessors: 132,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.18gb", 0, 19, 1, 1, 7, 16384, 16, [1, 1, 0, 1, 0], ALL7).marked(Evidence::Inferred, PLACEMENTS),
            gi("1g.18gb+me", 7, 20, 1, 1, 1, 16384, 16, [1, 1, 0, 1, 1], ALL7).marked(Evidence::Inferred, PLACEMENTS),
            gi("1g.35gb", 9, 15, 1, 2, 4, 33024, 26, [1, 1, 0, 1, 0], EVEN4).marked(Evidence::Inferred, PLACEMENTS),
            gi("2g.35gb", 1, 14, 2, 2, 3, 33024, 32, [2, 2, 0, 2, 0], EVEN3).marked(
                Evidence::Inferred,
                "placements assumed to be H100's (no -lgipp seen); memory 32.25 GiB from the real lgip \
                 (a test fixture says 32.50)",
            ),
            gi("3g.71gb", 2, 9, 3, 4, 2, 71168, 60, [3, 3, 0, 3, 0], HALVES).marked(Evidence::Inferred, PLACEMENTS),
            gi("4g.71gb", 3, 5, 4, 4, 1, 71168, 64, [4, 4, 0, 4, 0], WHOLE).marked(Evidence::Inferred, PLACEMENTS),
            gi("7g.141gb", 4, 0, 7, 8, 1, 143104, 132, [8, 7, 0, 7, 1], WHOLE).marked(
                Evidence::Inferred,
                "placements assumed to be H100's (no -lgipp seen); memory 139.75 GiB from the real lgip \
                 (a test fixture says 140.00)",
            ),
        ],
        evidence: Evidence::Inferred,
        note: "placements assumed to be H100's; whole-GPU memory 143771 MiB and 132 SMs are not in the facts \
               (143771 fits go-nvlib's profile names)"
            .into(),
    }
}

/// B200 180GB (docs/facts/mig-nvml.md §1.8): 1g/2g rows real (later driver), 3g/4g/7g never captured.
fn b200_180gb() -> GpuModel {
    const PLACEMENTS: &str = "placements assumed to be H100's (no -lgipp seen)";
    GpuModel {
        key: "b200-180gb".into(),
        product_name: "NVIDIA B200".into(),
        nvml_names: vec![],
        pci_device_ids: vec![0x2901],
        architecture: "Blackwell".into(),
        cuda_compute_capability: (10, 0),
        memory_mib: 183359,
        multiprocessors: 148,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.23gb", 0, 19, 1, 1, 7, 20992, 18, [2, 1, 0, 1, 0], ALL7).marked(
                Evidence::Inferred,
                "placements assumed to be H100's (no -lgipp seen); memory 20.50 GiB from the later driver \
                 (22.00 on the early one)",
            ),
            gi("1g.23gb+me", 7, 20, 1, 1, 1, 20992, 18, [2, 1, 0, 1, 1], ALL7).marked(
                Evidence::Inferred,
                "placements assumed to be H100's (no -lgipp seen); memory 20.50 GiB from the later driver \
                 (22.00 on the early one)",
            ),
            gi("1g.45gb", 9, 15, 1, 2, 4, 45312, 30, [2, 1, 0, 1, 0], EVEN4).marked(Evidence::Inferred, PLACEMENTS),
            gi("2g.45gb", 1, 14, 2, 2, 3, 45312, 36, [4, 2, 0, 2, 0], EVEN3).marked(
                Evidence::Inferred,
                "placements assumed to be H100's (no -lgipp seen); CE 4 and DEC 2 from real lgip (the guide \
                 says CE 3, DEC 1)",
            ),
            gi("3g.90gb", 2, 9, 3, 4, 2, 90624, 68, [6, 3, 0, 3, 0], HALVES).marked(
                Evidence::Unverified,
                "row not captured: memory 88.50 GiB = 4/8 (2 x the observed 2/8 44.25 GiB), SM 68 = H100's 60 \
                 scaled by 18/16, CE 6 from the guide, DEC/JPG 3 like H100; placements assumed to be H100's",
            ),
            gi("4g.90gb", 3, 5, 4, 4, 1, 90624, 72, [8, 4, 0, 4, 0], WHOLE).marked(
                Evidence::Unverified,
                "row not captured: memory 88.50 GiB = 4/8 (2 x the observed 2/8 44.25 GiB), SM 72 = 4 x 18, \
                 CE 8 from the guide, DEC/JPG 4 like H100; placement assumed to be H100's",
            ),
            gi("7g.180gb", 4, 0, 7, 8, 1, 181248, 148, [16, 7, 0, 7, 1], WHOLE).marked(
                Evidence::Unverified,
                "row not captured: memory 177.00 GiB = 8/8 (4 x the observed 2/8 44.25 GiB), SM 148 = the whole \
                 GPU (as on H100), CE 16 from the guide, DEC/JPG 7 like H100, OFA 1 from the facts",
            ),
        ],
        evidence: Evidence::Inferred,
        note: "placements assumed to be H100's; 3g/4g/7g rows are placeholders; whole-GPU memory 183359 MiB \
               (nvidia-smi) and 148 SMs (B200 spec) are not in the facts"
            .into(),
    }
}

/// GB200 (docs/facts/mig-nvml.md §8): the B200's grid; 1g/2g rows real (mig-parted #227, drivers
/// from August 2025), 3g/4g/7g never captured.
fn gb200_186gb() -> GpuModel {
    const PLACEMENTS: &str = "placements assumed to be H100's (no -lgipp seen)";
    GpuModel {
        key: "gb200-186gb".into(),
        product_name: "NVIDIA GB200".into(),
        nvml_names: vec![],
        pci_device_ids: vec![0x2941],
        architecture: "Blackwell".into(),
        cuda_compute_capability: (10, 0),
        memory_mib: 189471,
        multiprocessors: 152,
        memory_slices: 8,
        compute_slices: 7,
        profiles: vec![
            gi("1g.23gb", 0, 19, 1, 1, 7, 22528, 18, [2, 1, 0, 1, 0], ALL7).marked(Evidence::Inferred, PLACEMENTS),
            gi("1g.23gb+me", 7, 20, 1, 1, 1, 22528, 18, [2, 1, 0, 1, 1], ALL7).marked(Evidence::Inferred, PLACEMENTS),
            gi("1g.47gb", 9, 15, 1, 2, 4, 46592, 32, [2, 1, 0, 1, 0], EVEN4).marked(Evidence::Inferred, PLACEMENTS),
            gi("2g.47gb", 1, 14, 2, 2, 3, 46592, 38, [4, 2, 0, 2, 0], EVEN3).marked(Evidence::Inferred, PLACEMENTS),
            gi("3g.93gb", 2, 9, 3, 4, 2, 93184, 68, [6, 3, 0, 3, 0], HALVES).marked(
                Evidence::Unverified,
                "row not captured: memory 91.00 GiB = 4/8 (2 x the observed 2/8 45.50 GiB); SM 68, engines and \
                 placements taken from the B200's placeholder row",
            ),
            gi("4g.93gb", 3, 5, 4, 4, 1, 93184, 72, [8, 4, 0, 4, 0], WHOLE).marked(
                Evidence::Unverified,
                "row not captured: memory 91.00 GiB = 4/8 (2 x the observed 2/8 45.50 GiB); SM 72 = 4 x 18, \
                 engines and placement taken from the B200's placeholder row",
            ),
            gi("7g.186gb", 4, 0, 7, 8, 1, 186368, 152, [16, 7, 0, 7, 1], WHOLE).marked(
                Evidence::Unverified,
                "row not captured: memory 182.00 GiB = 8/8 (4 x the observed 2/8 45.50 GiB), SM 152 = the whole \
                 GPU (as on H100), engines taken from the B200's placeholder row",
            ),
        ],
        evidence: Evidence::Inferred,
        note: "placements assumed to be H100's; 3g/4g/7g rows are placeholders; whole-GPU memory 189471 MiB \
               (nvidia-smi) and 152 SMs are from public runs, not from NVIDIA"
            .into(),
    }
}

/// B300 (docs/facts/mig-nvml.md §8): profile names and counts from mig-parted's default
/// configuration only; every row is a placeholder on the B200's grid.
fn b300_269gb() -> GpuModel {
    blackwell_placeholder(
        "b300-269gb",
        "NVIDIA B300 SXM6 AC",
        0x3182,
        275040,
        148,
        ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"],
        [18, 30, 36, 68, 72],
        "B200's",
    )
}

/// GB300 (docs/facts/mig-nvml.md §8): as B300. Its 1g.35gb shares the name of an H200 profile, so
/// the `mig-1g.35gb` DeviceClass selects both.
fn gb300_278gb() -> GpuModel {
    blackwell_placeholder(
        "gb300-278gb",
        "NVIDIA GB300",
        0x31C2,
        284208,
        152,
        ["1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"],
        [18, 32, 38, 68, 72],
        "GB200's",
    )
}

/// A Blackwell GPU of the 8-slice grid known only by its profile names, every row UNVERIFIED: the
/// rows of `like` (B200 or GB200) with these `names` and the SMs of 1g, 1g (2/8), 2g, 3g and 4g.
/// Memory: 1/8 and 2/8 of the GPU's rounded down to 256 MiB, 4/8 and 8/8 as 2 and 4 x 2/8 (as on
/// B200); these fit go-nvlib's names of the profiles.
#[allow(clippy::too_many_arguments)] // one model's identity, side by side with the call above
fn blackwell_placeholder(
    key: &str,
    product_name: &str,
    pci_device_id: u16,
    memory_mib: u64,
    multiprocessors: u32,
    names: [&str; 7],
    [sm1, sm1q, sm2, sm3, sm4]: [u32; 5],
    like: &str,
) -> GpuModel {
    let (eighth, quarter) = (memory_mib / 8 / 256 * 256, memory_mib / 4 / 256 * 256);
    let note = format!(
        "row not seen in any output: memory a placeholder (1/8 and 2/8 of the GPU rounded down to 256 MiB, \
         4/8 and 8/8 as 2 and 4 x 2/8), SMs and engines the {like}, placements H100's"
    );
    let rows = [
        gi(names[0], 0, 19, 1, 1, 7, eighth, sm1, [2, 1, 0, 1, 0], ALL7),
        gi(names[1], 7, 20, 1, 1, 1, eighth, sm1, [2, 1, 0, 1, 1], ALL7),
        gi(names[2], 9, 15, 1, 2, 4, quarter, sm1q, [2, 1, 0, 1, 0], EVEN4),
        gi(names[3], 1, 14, 2, 2, 3, quarter, sm2, [4, 2, 0, 2, 0], EVEN3),
        gi(names[4], 2, 9, 3, 4, 2, 2 * quarter, sm3, [6, 3, 0, 3, 0], HALVES),
        gi(names[5], 3, 5, 4, 4, 1, 2 * quarter, sm4, [8, 4, 0, 4, 0], WHOLE),
        gi(names[6], 4, 0, 7, 8, 1, 4 * quarter, multiprocessors, [16, 7, 0, 7, 1], WHOLE),
    ];
    GpuModel {
        key: key.into(),
        product_name: product_name.into(),
        nvml_names: vec![],
        pci_device_ids: vec![pci_device_id],
        architecture: "Blackwell".into(),
        cuda_compute_capability: (10, 3),
        memory_mib,
        multiprocessors,
        memory_slices: 8,
        compute_slices: 7,
        profiles: rows.into_iter().map(|p| p.marked(Evidence::Unverified, &note)).collect(),
        evidence: Evidence::Inferred,
        note: format!(
            "only the profile names and counts are NVIDIA's (mig-parted's default configuration); every row is \
             a placeholder; whole-GPU memory {memory_mib} MiB (nvidia-smi), {multiprocessors} SMs and compute \
             capability 10.3 are from public runs, not from NVIDIA"
        ),
    }
}

/// RTX PRO 6000 Blackwell, 96 GB (docs/facts/mig-nvml.md §1.9): real lgip + lgipp; grid 12, 4 compute slices.
fn rtx_pro_6000() -> GpuModel {
    const IDX: &str = "NVML index follows nvml.h comments and go-nvlib suffix rules, not NVML output";
    const IDX_1G: &str = "NVML index follows nvml.h comments and go-nvlib suffix rules, not NVML output; \
                          memory 23.12 GiB taken as the newer driver's (23.62 on another)";
    const IDX_2G: &str = "NVML index follows nvml.h comments and go-nvlib suffix rules, not NVML output; \
                          memory 46.50 GiB taken as the newer driver's (47.38 on another)";
    const Q: &[u32] = &[0, 3, 6, 9];
    const H: &[u32] = &[0, 6];
    GpuModel {
        key: "rtx-pro-6000".into(),
        product_name: "NVIDIA RTX PRO 6000 Blackwell Server Edition".into(),
        nvml_names: vec![
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition".into(),
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition".into(),
        ],
        pci_device_ids: vec![0x2BB5],
        architecture: "Blackwell".into(),
        cuda_compute_capability: (12, 0),
        memory_mib: 97887,
        multiprocessors: 188,
        memory_slices: 12,
        compute_slices: 4,
        profiles: vec![
            gi("1g.24gb", 0, 14, 1, 3, 4, 23680, 46, [1, 1, 1, 1, 0], Q).marked(Evidence::Inferred, IDX_1G),
            gi("1g.24gb+me", 7, 21, 1, 3, 1, 23680, 46, [1, 1, 1, 1, 1], Q).marked(Evidence::Inferred, IDX_1G),
            gi("1g.24gb+gfx", 10, 47, 1, 3, 4, 23680, 46, [1, 1, 1, 1, 0], Q).marked(Evidence::Inferred, IDX_1G),
            gi("1g.24gb+me.all", 15, 65, 1, 3, 1, 23680, 46, [1, 4, 4, 4, 1], Q).marked(Evidence::Inferred, IDX_1G),
            gi("1g.24gb-me", 13, 67, 1, 3, 4, 23680, 46, [1, 0, 0, 0, 0], Q).marked(Evidence::Inferred, IDX_1G),
            gi("2g.48gb", 1, 5, 2, 6, 2, 47616, 94, [2, 2, 2, 2, 0], H).marked(Evidence::Inferred, IDX_2G),
            gi("2g.48gb+gfx", 11, 35, 2, 6, 2, 47616, 94, [2, 2, 2, 2, 0], H).marked(Evidence::Inferred, IDX_2G),
            gi("2g.48gb+me.all", 16, 64, 2, 6, 1, 47616, 94, [2, 4, 4, 4, 1], H).marked(Evidence::Inferred, IDX_2G),
            gi("2g.48gb-me", 14, 66, 2, 6, 2, 47616, 94, [2, 0, 0, 0, 0], H).marked(Evidence::Inferred, IDX_2G),
            gi("4g.96gb", 3, 0, 4, 12, 1, 97408, 188, [4, 4, 4, 4, 1], WHOLE).marked(Evidence::Inferred, IDX),
            gi("4g.96gb+gfx", 12, 32, 4, 12, 1, 97408, 188, [4, 4, 4, 4, 1], WHOLE).marked(Evidence::Inferred, IDX),
        ],
        evidence: Evidence::Inferred,
        note: "NVML indexes inferred from profile names; whole-GPU SM count 188 taken from 4g.96gb (not stated \
               for the GPU); 95.12 GiB read as 97408 MiB (95.125)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::catalog::{self, Evidence, GiProfile, GpuModel, MediaEngines};
    use super::super::rules::{self, Placed};
    use std::collections::HashSet;

    fn model(key: &str) -> &'static GpuModel {
        catalog::model(key).unwrap_or_else(|| panic!("no model {key}"))
    }

    #[test]
    fn models_are_listed_in_order() {
        let keys: Vec<&str> = catalog::models().iter().map(|m| m.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "a100-40gb",
                "a100-80gb",
                "a30-24gb",
                "h100-80gb",
                "h100-94gb",
                "gh200-96gb",
                "gh200-144gb",
                "h200-141gb",
                "b200-180gb",
                "gb200-186gb",
                "b300-269gb",
                "gb300-278gb",
                "rtx-pro-6000"
            ]
        );
    }

    #[test]
    fn profile_ids_names_and_indexes_are_unique() {
        for m in catalog::models() {
            let ids: HashSet<u32> = m.profiles.iter().map(|p| p.id).collect();
            assert_eq!(ids.len(), m.profiles.len(), "{}: duplicate profile ID", m.key);
            let names: HashSet<String> = m.profiles.iter().map(|p| p.name.to_ascii_lowercase()).collect();
            assert_eq!(names.len(), m.profiles.len(), "{}: duplicate profile name", m.key);
            let indexes: HashSet<u32> = m.profiles.iter().map(|p| p.index).collect();
            assert_eq!(indexes.len(), m.profiles.len(), "{}: duplicate NVML index", m.key);
        }
    }

    #[test]
    fn pci_ids_and_names_are_unique_across_models() {
        let mut ids = HashSet::new();
        let mut names = HashSet::new();
        for m in catalog::models() {
            for id in &m.pci_device_ids {
                assert!(ids.insert(*id), "PCI ID {id:#06x} in two models");
            }
            for n in std::iter::once(&m.product_name).chain(&m.nvml_names) {
                assert!(names.insert(n.to_ascii_lowercase()), "NVML name {n:?} in two models");
            }
        }
    }

    #[test]
    fn placements_fit_the_grid() {
        for m in catalog::models() {
            for p in &m.profiles {
                assert!(!p.placements.is_empty(), "{} {}: no placements", m.key, p.name);
                assert!(p.placements.windows(2).all(|w| w[0] < w[1]), "{} {}: unsorted", m.key, p.name);
                for &start in &p.placements {
                    assert!(start + p.memory_slices <= m.memory_slices, "{} {} at {start}", m.key, p.name);
                    assert_eq!(start % p.memory_slices, 0, "{} {} at {start}: unaligned", m.key, p.name);
                }
                assert!(p.compute_slices >= 1 && p.compute_slices <= m.compute_slices, "{} {}", m.key, p.name);
                assert!(p.memory_mib <= m.memory_mib, "{} {}: more memory than the GPU", m.key, p.name);
                assert!(p.multiprocessors <= m.multiprocessors, "{} {}: more SMs than the GPU", m.key, p.name);
            }
        }
    }

    #[test]
    fn max_instances_are_reachable() {
        for m in catalog::models() {
            for p in &m.profiles {
                assert!(p.max_instances >= 1, "{} {}", m.key, p.name);
                assert!(p.max_instances as usize <= p.placements.len(), "{} {}", m.key, p.name);
            }
        }
    }

    #[test]
    fn every_profile_has_a_default_ci_spanning_it() {
        for m in catalog::models() {
            for p in &m.profiles {
                let ci = p.default_ci().unwrap_or_else(|| panic!("{} {}: no default CI", m.key, p.name));
                assert_eq!(ci.compute_slices, p.compute_slices);
                assert_eq!(ci.multiprocessors, p.multiprocessors);
                assert_eq!(ci.name, p.name);
            }
        }
    }

    #[test]
    fn media_and_gfx_follow_the_name() {
        let rtx = model("rtx-pro-6000");
        let media = |n: &str| rtx.profile_by_name(n).unwrap().media;
        assert_eq!(media("1g.24gb"), MediaEngines::Standard);
        assert_eq!(media("1g.24gb+me"), MediaEngines::Me);
        assert_eq!(media("1g.24gb+me.all"), MediaEngines::AllMe);
        assert_eq!(media("2g.48gb-me"), MediaEngines::NoMe);
        assert_eq!(media("4g.96gb+gfx"), MediaEngines::Standard);
        let gfx: Vec<u32> = rtx.profiles.iter().filter(|p| p.gfx).map(|p| p.id).collect();
        assert_eq!(gfx, [47, 35, 32]);
        for m in catalog::models() {
            for p in &m.profiles {
                // The +me profiles hold the GPU's single OFA and exist once.
                if matches!(p.media, MediaEngines::Me | MediaEngines::AllMe) {
                    assert_eq!(p.max_instances, 1, "{} {}", m.key, p.name);
                    assert_eq!(p.engines.ofa, 1, "{} {}", m.key, p.name);
                }
                if p.media == MediaEngines::NoMe {
                    assert_eq!((p.engines.decoders, p.engines.encoders, p.engines.jpeg, p.engines.ofa), (0, 0, 0, 0));
                }
            }
        }
    }

    #[test]
    fn h100_profiles_and_placements() {
        let h = model("h100-80gb");
        let ids: Vec<u32> = h.profiles.iter().map(|p| p.id).collect();
        assert_eq!(ids, [19, 20, 15, 14, 9, 5, 0]);
        let placements: Vec<String> = h.profiles.iter().map(GiProfile::placements_text).collect();
        assert_eq!(
            placements,
            ["{0,1,2,3,4,5,6}:1", "{0,1,2,3,4,5,6}:1", "{0,2,4,6}:2", "{0,2,4}:2", "{0,4}:4", "{0}:4", "{0}:8"]
        );
        assert_eq!((h.memory_slices, h.compute_slices), (8, 7));
    }

    #[test]
    fn a100_40gb_smallest_profile() {
        let p = model("a100-40gb").profile_by_name("1g.5gb").unwrap();
        assert_eq!((p.id, p.memory_mib, p.multiprocessors), (19, 4864, 14));
    }

    #[test]
    fn rtx_pro_6000_grid_of_twelve() {
        let r = model("rtx-pro-6000");
        assert_eq!((r.memory_slices, r.compute_slices, r.profiles.len()), (12, 4, 11));
        let text = |n: &str| r.profile_by_name(n).unwrap().placements_text();
        assert_eq!(text("1g.24gb"), "{0,3,6,9}:3");
        assert_eq!(text("2g.48gb"), "{0,6}:6");
        assert_eq!(text("4g.96gb"), "{0}:12");
    }

    #[test]
    fn recognition_by_pci_id_and_name() {
        let key = |m: Option<&GpuModel>| m.map(|m| m.key.clone());
        assert_eq!(key(catalog::model_by_pci_device_id(0x2330)).as_deref(), Some("h100-80gb"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x20B0)).as_deref(), Some("a100-40gb"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x2BB5)).as_deref(), Some("rtx-pro-6000"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x2901)).as_deref(), Some("b200-180gb"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x2941)).as_deref(), Some("gb200-186gb"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x3182)).as_deref(), Some("b300-269gb"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x31C2)).as_deref(), Some("gb300-278gb"));
        assert_eq!(key(catalog::model_by_nvml_name("NVIDIA B300 SXM6 AC")).as_deref(), Some("b300-269gb"));
        assert_eq!(key(catalog::model_by_pci_device_id(0x1234)), None);
        assert_eq!(key(catalog::model_by_nvml_name("NVIDIA A100-SXM4-40GB")).as_deref(), Some("a100-40gb"));
        assert_eq!(key(catalog::model_by_nvml_name(" nvidia h200 nvl ")).as_deref(), Some("h200-141gb"));
    }

    #[test]
    fn evidence_comes_with_a_note_exactly_when_not_observed() {
        for m in catalog::models() {
            for p in &m.profiles {
                match p.evidence {
                    Evidence::Observed => assert!(p.note.is_empty(), "{} {}: observed with a note", m.key, p.name),
                    _ => assert!(!p.note.is_empty(), "{} {}: {:?} without a note", m.key, p.name, p.evidence),
                }
            }
            if m.evidence != Evidence::Observed {
                assert!(!m.note.is_empty(), "{}: {:?} without a note", m.key, m.evidence);
            }
        }
        // The rows the facts never saw stay marked as guesses.
        for (key, name) in [
            ("b200-180gb", "3g.90gb"),
            ("b200-180gb", "4g.90gb"),
            ("b200-180gb", "7g.180gb"),
            ("gb200-186gb", "3g.93gb"),
            ("gb200-186gb", "4g.93gb"),
            ("gb200-186gb", "7g.186gb"),
            ("gh200-144gb", "7g.144gb"),
            ("a100-80gb", "1g.20gb"),
        ] {
            assert_eq!(model(key).profile_by_name(name).unwrap().evidence, Evidence::Unverified, "{key} {name}");
        }
    }

    /// Nothing of B300 and GB300 was ever read from a GPU: every row stays a placeholder.
    #[test]
    fn b300_and_gb300_rows_are_all_unverified() {
        for key in ["b300-269gb", "gb300-278gb"] {
            for p in &model(key).profiles {
                assert_eq!(p.evidence, Evidence::Unverified, "{key} {}", p.name);
            }
        }
    }

    /// The newest Blackwells have the profile names and the instance counts of mig-parted's
    /// default configuration (docs/facts/mig-nvml.md §8) on the B200's grid.
    #[test]
    fn newest_blackwells_follow_mig_parted() {
        for (key, names) in [
            ("gb200-186gb", ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"]),
            ("b300-269gb", ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"]),
            ("gb300-278gb", ["1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"]),
        ] {
            let m = model(key);
            let got: Vec<(&str, u32)> = m.profiles.iter().map(|p| (p.name.as_str(), p.max_instances)).collect();
            assert_eq!(got, names.into_iter().zip([7, 1, 4, 3, 2, 1, 1]).collect::<Vec<_>>(), "{key}");
            let b200 = model("b200-180gb");
            let shape = |m: &GpuModel| -> Vec<(u32, u32, u32, u32, String)> {
                m.profiles
                    .iter()
                    .map(|p| (p.index, p.id, p.compute_slices, p.memory_slices, p.placements_text()))
                    .collect()
            };
            assert_eq!(shape(m), shape(b200), "{key}: the B200's grid");
            assert_eq!((m.memory_slices, m.compute_slices, m.architecture.as_str()), (8, 7, "Blackwell"));
        }
    }

    /// Profiles spanning the same memory slices hold the same memory: every real reading shows it
    /// (A100-80GB 3g.40gb and 4g.40gb both read 39.50 GiB).
    #[test]
    fn profiles_of_one_size_hold_the_same_memory() {
        for m in catalog::models() {
            for p in &m.profiles {
                for q in m.profiles.iter().filter(|q| q.memory_slices == p.memory_slices) {
                    assert_eq!(p.memory_mib, q.memory_mib, "{}: {} and {}", m.key, p.name, q.name);
                }
            }
        }
        assert_eq!(model("a100-80gb").profile_by_name("3g.40gb").unwrap().memory_mib, 40448);
    }

    /// Sums of what a set of instances holds: memory, SMs, CE, DEC, ENC, JPG, OFA.
    fn holds(p: &GiProfile) -> [u64; 7] {
        let e = &p.engines;
        let counts = [p.multiprocessors, e.copy, e.decoders, e.encoders, e.jpeg, e.ofa].map(u64::from);
        [p.memory_mib, counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]]
    }

    /// Depth-first over candidate subsets in index order, checking every set NVML admits.
    fn walk(
        m: &GpuModel,
        candidates: &[Placed],
        from: usize,
        sums: [u64; 7],
        set: &mut Vec<Placed>,
        limit: [u64; 7],
    ) -> u64 {
        const WHAT: [&str; 7] = ["memory", "SMs", "CE", "DEC", "ENC", "JPG", "OFA"];
        let mut admitted = 0;
        for (i, &c) in candidates.iter().enumerate().skip(from) {
            if rules::admits(m, set, c).is_err() {
                continue;
            }
            let mut next = sums;
            for (s, h) in next.iter_mut().zip(holds(m.profile(c.profile_id).unwrap())) {
                *s += h;
            }
            set.push(c);
            for (k, (s, l)) in next.iter().zip(limit).enumerate() {
                assert!(*s <= l, "{}: {set:?} holds {s} {} > {l}", m.key, WHAT[k]);
            }
            admitted += 1 + walk(m, candidates, i + 1, next, set, limit);
            set.pop();
        }
        admitted
    }

    /// Every set NVML's rules admit holds no more than the profile covering the whole grid.
    #[test]
    fn admitted_sets_never_exceed_the_whole_grid_profile() {
        for m in catalog::models() {
            let whole = m
                .profiles
                .iter()
                .find(|p| p.memory_slices == m.memory_slices && p.media == MediaEngines::Standard && !p.gfx)
                .unwrap_or_else(|| panic!("{}: no whole-grid profile", m.key));
            let candidates: Vec<Placed> = rules::every_placement(m);
            let admitted = walk(m, &candidates, 0, [0; 7], &mut Vec::new(), holds(whole));
            assert!(admitted >= candidates.len() as u64, "{}: only {admitted} sets", m.key);
        }
    }
}
