//! Property tests: hostlist expressions round-trip.

use proptest::prelude::*;
use resilio::slurm::hostlist::{compress, expand};
use std::collections::BTreeSet;

fn name() -> impl Strategy<Value = String> {
    let numbered = (
        prop::sample::select(vec!["n", "gpu", "rack1-n", "node-a", "", "x.y"]),
        0u64..300,
        0usize..5,
    )
        .prop_map(|(prefix, n, width)| format!("{prefix}{n:0width$}"));
    let plain = prop::sample::select(vec!["login".to_string(), "head-node".to_string()]);
    prop_oneof![4 => numbered, 1 => plain]
}

proptest! {
    #[test]
    fn expand_of_compress_is_the_same_set(names in prop::collection::vec(name(), 0..60)) {
        let expr = compress(&names);
        let back = expand(&expr).unwrap();
        let a: BTreeSet<&String> = names.iter().collect();
        let b: BTreeSet<&String> = back.iter().collect();
        prop_assert_eq!(back.len(), b.len(), "no duplicates after compress: {}", expr);
        prop_assert_eq!(a, b, "via {}", expr);
    }

    #[test]
    fn compress_is_canonical(names in prop::collection::vec(name(), 0..60)) {
        let once = compress(&names);
        let twice = compress(&expand(&once).unwrap());
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn expand_never_panics(s in "[a-z0-9,\\[\\]\\-]{0,40}") {
        let _ = expand(&s);
    }
}
