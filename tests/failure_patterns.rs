//! The default failure patterns against RECORDED sample lines (no GPU or
//! InfiniBand here: tests/fixtures/failures/failure_lines.tsv holds real
//! lines copied from public bug reports, each group with its source).

use resilio::policy::patterns::{LineClass, Patterns};

#[test]
fn recorded_nccl_xid_ecc_and_python_lines_are_classified() {
    let p = Patterns::defaults();
    let text = include_str!("fixtures/failures/failure_lines.tsv");
    let mut wrong = Vec::new();
    let mut counts = std::collections::BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (want, sample) = line.split_once('\t').expect("CLASS<TAB>LINE");
        *counts.entry(want).or_insert(0) += 1;
        let got = match p.line_class(sample) {
            None => "none",
            Some(LineClass::Infrastructure) => "infra",
            Some(LineClass::Secondary) => "secondary",
            Some(LineClass::Ambiguous) => "ambiguous",
            Some(LineClass::User) | Some(LineClass::Generic) => "user",
        };
        if got != want {
            wrong.push(format!("line {}: want {want}, got {got}: {sample}", n + 1));
        }
    }
    assert!(
        counts.iter().all(|(k, &c)| c >= 10 || *k == "ambiguous"),
        "{counts:?}"
    );
    assert!(
        counts.get("ambiguous").is_some_and(|&c| c >= 4),
        "{counts:?}"
    );
    assert!(
        wrong.is_empty(),
        "{} misclassified:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
