//! Reading a rank's last lines as Python and torch print them: torch's
//! `[rank1]: ` prefix, and a traceback's quoted source lines (the code,
//! not what happened).

/// The lines of a tail but a traceback's quoted source: an indented line
/// right after a `File "...", line N, in f` line (torch's `[rank1]: `
/// prefix or not).
pub(super) fn what_happened(tail: &[String]) -> impl Iterator<Item = &String> + '_ {
    let is_file = |l: &str| {
        let l = without_rank_prefix(l).trim_start();
        l.starts_with("File \"") && l.contains("\", line ")
    };
    tail.iter().enumerate().filter_map(move |(i, l)| {
        let indented = after_rank_prefix(l.trim_start())
            .unwrap_or(l)
            .starts_with(char::is_whitespace);
        let quoted = i > 0 && indented && is_file(&tail[i - 1]) && !is_file(l);
        (!quoted).then_some(l)
    })
}

/// What follows torch's `[rank1]: ` prefix, as it is (indent kept).
fn after_rank_prefix(line: &str) -> Option<&str> {
    match line.strip_prefix("[rank").and_then(|r| r.split_once("]: ")) {
        Some((n, rest)) if n.bytes().all(|b| b.is_ascii_digit()) => Some(rest),
        _ => None,
    }
}

/// A line without torch's `[rank1]: ` prefix (every line of a rank's
/// traceback carries it).
pub(super) fn without_rank_prefix(line: &str) -> &str {
    let t = line.trim_start();
    after_rank_prefix(t).unwrap_or(t)
}
