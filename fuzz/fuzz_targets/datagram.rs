//! The progress socket's datagram parser: any bytes a process on the node
//! sends. Never panics; never yields a step above `MAX_STEP`; a fault comes
//! back alone, as one `Malformed`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resilio::progress::socket::parse;
use resilio::progress::{Kind, MAX_STEP};

fuzz_target!(|data: &[u8]| {
    let kinds = parse(data);
    let malformed = kinds
        .iter()
        .filter(|k| matches!(k, Kind::Malformed { .. }))
        .count();
    assert!(malformed == 0 || kinds.len() == 1, "{kinds:?}");
    for k in &kinds {
        let step = match k {
            Kind::Step { step, .. } => *step,
            Kind::Phase { step, .. } => *step,
            Kind::CheckpointDone { step } => *step,
            Kind::CheckpointLoaded { step, .. } => *step,
            _ => None,
        };
        assert!(step.is_none_or(|s| s <= MAX_STEP), "{k:?}");
        if let Kind::Step { metrics, .. } = k {
            assert!(metrics.iter().all(|(_, x)| x.is_finite()), "{k:?}");
        }
    }
});
