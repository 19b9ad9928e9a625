//! Slurm hostlist expressions: any text. `expand` never panics; what it
//! expands to is valid node names, and compressing them expands back to
//! the same set. Names split out of the input compress to an expression
//! that expands back to their set too, when they are valid node names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resilio::slurm::hostlist::{compress, expand, valid_node_name};
use std::collections::BTreeSet;

fn roundtrip(names: &[String]) {
    let c = compress(names);
    let back = expand(&c).unwrap_or_else(|e| panic!("compress({names:?}) = {c:?}: {e}"));
    let a: BTreeSet<&String> = names.iter().collect();
    let b: BTreeSet<&String> = back.iter().collect();
    assert_eq!(a, b, "compress gave {c:?}");
    assert_eq!(back.len(), b.len(), "duplicates in {c:?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(names) = expand(text) {
        assert!(names.iter().all(|n| valid_node_name(n)), "{names:?}");
        roundtrip(&names);
    }
    let names: Vec<String> = text
        .split([' ', '\n'])
        .filter(|n| valid_node_name(n))
        .map(str::to_string)
        .collect();
    roundtrip(&names);
});
