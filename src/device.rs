//! The accelerator a rank runs on, for MFU: its name from `nvidia-smi` and
//! its peak dense TFLOP/s from a small built-in table.
//!
//! The table holds NVIDIA's published dense (no sparsity) BF16 tensor
//! figures (FP16 for V100 and T4, which have no BF16), for the SXM part
//! unless the name says PCIe or NVL. A device not in it has no peak:
//! set `[throughput] peak_tflops`.

use crate::util::cmd::{self, Options, Termination};
use regex::Regex;
use std::sync::OnceLock;
use std::time::Duration;

/// `(name pattern, peak TFLOP/s)`, most specific first.
const PEAKS: &[(&str, f64)] = &[
    (r"\bGB200\b", 2500.0),
    (r"\bB200\b", 2250.0),
    (r"\bB100\b", 1750.0),
    (r"\bGH200\b", 989.0),
    (r"\bH200\b", 989.0),
    (r"\bH100\b.*\bPCIe\b", 756.0),
    (r"\bH100\b.*\bNVL\b", 835.0),
    (r"\bH100\b", 989.0),
    (r"\bH800\b", 989.0),
    (r"\bA100\b", 312.0),
    (r"\bA800\b", 312.0),
    (r"\bA10G\b", 70.0),
    (r"\bA10\b", 125.0),
    (r"\bL40S\b", 362.0),
    (r"\bL40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bV100\b.*\bPCIe\b", 112.0),
    (r"\bV100\b", 125.0),
    (r"\bT4\b", 65.0),
];

/// The peak TFLOP/s of a device by its name (`NVIDIA H100 80GB HBM3`).
pub fn peak_tflops(name: &str) -> Option<f64> {
    static TABLE: OnceLock<Vec<(Regex, f64)>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        PEAKS
            .iter()
            .map(|(p, v)| (Regex::new(&format!("(?i){p}")).expect("peak pattern"), *v))
            .collect()
    });
    table
        .iter()
        .find(|(re, _)| re.is_match(name))
        .map(|(_, v)| *v)
}

/// The first GPU's name from `nvidia-smi --query-gpu=name` (at most 5 s),
/// or `None` without nvidia-smi, without a GPU, or on any error.
pub fn gpu_name() -> Option<String> {
    let argv = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"];
    let out = cmd::run(&argv, &Options::new(Duration::from_secs(5))).ok()?;
    match out.status {
        Termination::Finished(st) if st.success() => {}
        _ => return None,
    }
    let text = out.stdout.text();
    let name = text.lines().next()?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// This node has accelerators (`/dev/nvidia0`..., AMD's `/dev/kfd`,
/// `/dev/accel*`): a rank waiting in a collective there may spin on a CPU
/// (NCCL, RCCL) rather than block, so CPU time alone tells nothing of who
/// works. Looked at once.
pub fn accelerators_here() -> bool {
    static HERE: OnceLock<bool> = OnceLock::new();
    *HERE.get_or_init(|| {
        std::fs::read_dir("/dev").is_ok_and(|d| {
            d.flatten()
                .any(|e| is_accelerator(&e.file_name().to_string_lossy()))
        })
    })
}

/// A device node's name is an accelerator's.
fn is_accelerator(name: &str) -> bool {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    numbered("nvidia") || numbered("accel") || name == "kfd"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accelerators_by_their_device_nodes() {
        for yes in ["nvidia0", "nvidia7", "kfd", "accel0"] {
            assert!(is_accelerator(yes), "{yes}");
        }
        for no in ["nvidiactl", "nvidia-uvm", "nvidia", "null", "accel", "kfd0"] {
            assert!(!is_accelerator(no), "{no}");
        }
    }

    #[test]
    fn names_as_nvidia_smi_prints_them() {
        assert_eq!(peak_tflops("NVIDIA H100 80GB HBM3"), Some(989.0));
        assert_eq!(peak_tflops("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(peak_tflops("NVIDIA A100-SXM4-80GB"), Some(312.0));
        assert_eq!(peak_tflops("NVIDIA A10G"), Some(70.0));
        assert_eq!(peak_tflops("NVIDIA A10"), Some(125.0));
        assert_eq!(peak_tflops("NVIDIA L40S"), Some(362.0));
        assert_eq!(peak_tflops("NVIDIA L4"), Some(121.0));
        assert_eq!(peak_tflops("Tesla V100-SXM2-32GB"), Some(125.0));
        assert_eq!(peak_tflops("NVIDIA GeForce GTX 1080"), None);
    }
}
