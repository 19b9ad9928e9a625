//! Slurm hostlist expressions, both ways: `gpu[001-004,010],login1` expands
//! to `gpu001 gpu002 gpu003 gpu004 gpu010 login1` and back. Zero padding is
//! kept (`n[01-10]` is `n01`..`n10`); several bracket groups in one name
//! (`rack[1-2]-n[1-2]`) expand to their product.

/// Longest expansion accepted (a typo like `n[1-99999999]` is an error, not an OOM).
pub const MAX_HOSTS: usize = 1_000_000;

/// Whether `name` is a plausible node name (letters, digits, `-`, `_`, `.`).
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Split at commas that are outside brackets.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' => {
                depth += 1;
                if depth > 1 {
                    return Err(format!("nested '[' in hostlist '{expr}'"));
                }
            }
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unbalanced ']' in hostlist '{expr}'"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unclosed '[' in hostlist '{expr}'"));
    }
    parts.push(&expr[start..]);
    Ok(parts)
}

/// The numbers of one bracket body (`001-004,010`), as zero-padded strings.
fn expand_ranges(body: &str, expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in body.split(',') {
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => (a, b),
            None => (item, item),
        };
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!("bad range '{item}' in hostlist '{expr}'"));
        }
        let (a, b): (u64, u64) = (lo.parse().unwrap_or(0), hi.parse().unwrap_or(0));
        if b < a {
            return Err(format!("descending range '{item}' in hostlist '{expr}'"));
        }
        if (b - a) as usize >= MAX_HOSTS {
            return Err(format!("range '{item}' in hostlist '{expr}' is too large"));
        }
        let width = lo.len();
        for n in a..=b {
            out.push(format!("{n:0width$}"));
        }
    }
    Ok(out)
}

/// Expand a hostlist expression into node names, in order (duplicates kept).
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let expr_t = expr.trim();
    if expr_t.is_empty() || expr_t == "(null)" {
        return Ok(Vec::new());
    }
    let mut hosts = Vec::new();
    for part in split_top(expr_t)? {
        if part.is_empty() {
            return Err(format!("empty name in hostlist '{expr_t}'"));
        }
        // Cartesian product over the bracket groups of this part.
        let mut names = vec![String::new()];
        let mut rest = part;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let close = rest[open..]
                        .find(']')
                        .map(|c| open + c)
                        .ok_or_else(|| format!("unclosed '[' in hostlist '{expr_t}'"))?;
                    let prefix = &rest[..open];
                    let nums = expand_ranges(&rest[open + 1..close], expr_t)?;
                    if names.len().saturating_mul(nums.len()) > MAX_HOSTS {
                        return Err(format!("hostlist '{expr_t}' expands to too many names"));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| nums.iter().map(move |x| format!("{n}{prefix}{x}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
            }
        }
        for n in &names {
            if !valid_node_name(n) {
                return Err(format!("invalid node name '{n}' in hostlist '{expr_t}'"));
            }
        }
        hosts.extend(names);
        if hosts.len() > MAX_HOSTS {
            return Err(format!("hostlist '{expr_t}' expands to too many names"));
        }
    }
    Ok(hosts)
}

/// A name split into prefix and trailing number (`gpu010` -> `gpu`, `010`).
fn split_number(name: &str) -> Option<(&str, &str)> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 18 {
        return None;
    }
    Some(name.split_at(name.len() - digits))
}

/// Compress node names into a hostlist expression. Duplicates are dropped;
/// names are grouped by prefix and numbers sorted, keeping their zero
/// padding, and groups are sorted by prefix (as Slurm does), so the result is
/// canonical: `n07 n01 n02 n03 login` -> `login,n[01-03,07]`.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    use std::collections::{HashMap, HashSet};
    // Group key: prefix and padded width (0 for numbers without leading zero).
    // Looked up by hash: a large expansion (`kac[1-2888]-[0-228]`, 660,000
    // names in 2,888 groups) compresses in linear time, not quadratic.
    let mut groups: Vec<((String, usize), Vec<u64>)> = Vec::new();
    let mut group_of: HashMap<(&str, usize), usize> = HashMap::new();
    let mut plain: Vec<(usize, String)> = Vec::new();
    let mut plain_seen: HashSet<&str> = HashSet::new();
    // Padded groups by prefix, for the merge below.
    let mut padded: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut order: Vec<(usize, bool, usize)> = Vec::new(); // (first index, is_plain, slot)
    for (i, name) in names.iter().enumerate() {
        let name = name.as_ref();
        match split_number(name) {
            Some((prefix, num)) => {
                let width = if num.len() > 1 && num.starts_with('0') {
                    num.len()
                } else {
                    0
                };
                let n: u64 = num.parse().unwrap_or(0);
                match group_of.get(&(prefix, width)) {
                    Some(&g) => groups[g].1.push(n),
                    None => {
                        group_of.insert((prefix, width), groups.len());
                        if width != 0 {
                            padded.entry(prefix).or_default().push(groups.len());
                        }
                        groups.push(((prefix.to_string(), width), vec![n]));
                        order.push((i, false, groups.len() - 1));
                    }
                }
            }
            None => {
                if plain_seen.insert(name) {
                    plain.push((i, name.to_string()));
                    order.push((i, true, plain.len() - 1));
                }
            }
        }
    }
    // Numbers without a leading zero but as long as a padded group's width
    // render the same in that group (`n09,n10` -> `n[09-10]`).
    let mut merged: Vec<bool> = vec![false; groups.len()];
    for g in 0..groups.len() {
        if groups[g].0 .1 != 0 {
            continue;
        }
        let Some(hs) = padded.get(groups[g].0 .0.as_str()) else {
            continue;
        };
        for &h in hs {
            let w2 = groups[h].0 .1;
            let (fits, rest): (Vec<u64>, Vec<u64>) =
                groups[g].1.iter().partition(|n| n.to_string().len() == w2);
            groups[h].1.extend(fits);
            groups[g].1 = rest;
        }
        merged[g] = groups[g].1.is_empty();
    }
    let mut out: Vec<((String, usize, u64), String)> = Vec::new();
    for (_, is_plain, slot) in order {
        if is_plain {
            let name = plain[slot].1.clone();
            out.push(((name.clone(), 0, 0), name));
            continue;
        }
        if merged[slot] || groups[slot].1.is_empty() {
            continue;
        }
        let ((prefix, width), nums) = &mut groups[slot];
        nums.sort_unstable();
        nums.dedup();
        let key = (prefix.clone(), *width, nums[0]);
        if nums.len() == 1 {
            out.push((key, format!("{prefix}{:0width$}", nums[0], width = *width)));
            continue;
        }
        out.push((key, format!("{prefix}[{}]", ranges(nums, *width))));
    }
    out.sort();
    out.into_iter()
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join(",")
}

/// Sorted, distinct numbers as ranges: `1-3,5`, each `width` digits at least.
fn ranges(nums: &[u64], width: usize) -> String {
    let fmt = |n: u64| format!("{n:0width$}");
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nums.len() {
        let start = nums[i];
        let mut end = start;
        while i + 1 < nums.len() && nums[i + 1] == end + 1 {
            i += 1;
            end = nums[i];
        }
        out.push(if start == end {
            fmt(start)
        } else {
            format!("{}-{}", fmt(start), fmt(end))
        });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_the_documented_forms() {
        assert_eq!(
            expand("gpu[001-004,010],login1").unwrap(),
            ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "login1"]
        );
        assert_eq!(expand("n[1-3]").unwrap(), ["n1", "n2", "n3"]);
        assert_eq!(expand("n[08-11]").unwrap(), ["n08", "n09", "n10", "n11"]);
        assert_eq!(
            expand("rack[1-2]-n[1-2]").unwrap(),
            ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
        );
        assert_eq!(expand("n1").unwrap(), ["n1"]);
        assert!(expand("").unwrap().is_empty());
        assert!(expand("(null)").unwrap().is_empty());
    }

    #[test]
    fn malformed_input_is_a_clear_error() {
        for (bad, why) in [
            ("n[1-3", "unclosed"),
            ("n1-3]", "unbalanced"),
            ("n[3-1]", "descending"),
            ("n[a-b]", "bad range"),
            ("n[1-2[3]]", "nested"),
            ("n1,,n2", "empty name"),
            ("n[1-99999999]", "too large"),
            ("bad name", "invalid node name"),
            ("n[]", "bad range"),
        ] {
            let err = expand(bad).unwrap_err();
            assert!(
                err.contains(why) && err.contains("hostlist"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn large_expansions_compress_in_linear_time() {
        // Found by fuzzing (fuzz/corpus/hostlist/regress-many-groups): 2,888
        // groups of 229 names took 10 s to compress (a linear search per
        // name); names with no number were compared with every other.
        for expr in ["kac[1-2888]-[0-228]", "a[1-400]b[1-400]x"] {
            let names = expand(expr).unwrap();
            let t = std::time::Instant::now();
            let c = compress(&names);
            assert!(t.elapsed().as_secs() < 5, "{expr}: {:?}", t.elapsed());
            assert_eq!(expand(&c).unwrap().len(), names.len(), "{expr}");
        }
    }

    #[test]
    fn compresses_keeping_padding() {
        assert_eq!(
            compress(&["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "login1"]),
            "gpu[001-004,010],login1"
        );
        assert_eq!(compress(&["n3", "n1", "n2", "n2"]), "n[1-3]");
        assert_eq!(compress(&["n09", "n10", "n11"]), "n[09-11]");
        assert_eq!(compress(&["n1", "n01"]), "n1,n01");
        assert_eq!(compress(&["n7", "login"]), "login,n7");
        assert_eq!(
            compress(&["n07", "n01", "n02", "n03", "login"]),
            "login,n[01-03,07]"
        );
        assert_eq!(compress::<&str>(&[]), "");
    }
}
