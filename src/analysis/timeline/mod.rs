//! `resilio timeline`: one line per event that matters, grouped by attempt,
//! with time relative to the job's start and absolute UTC time, read from
//! the journal alone (plus Slurm's allocation times when known).

mod describe;

use describe::{describe, num};

use super::report::secs;
use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Render the timeline: one line per event that matters, grouped by attempt,
/// with time relative to the job's start and absolute UTC time.
pub fn render(
    job: &str,
    records: &[Record],
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
) -> String {
    render_with_notes(job, records, slurm, &[])
}

/// The same with notes (other runs of the job id, skipped journal lines)
/// printed under the heading.
pub fn render_with_notes(
    job: &str,
    records: &[Record],
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
    notes: &[String],
) -> String {
    let mut s = String::new();
    let Some(t0) = records.iter().map(|r| r.ts).min() else {
        return format!("job {job}: no records\n");
    };
    let queued = queued_of(records, slurm);
    let _ = writeln!(
        s,
        "job {job}, times relative to {}",
        t0.format("%Y-%m-%d %H:%M:%S%.3fZ")
    );
    for n in notes {
        let _ = writeln!(s, "{n}");
    }
    let mut by_attempt: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_attempt.entry(r.attempt).or_default().push(r);
    }
    for (attempt, recs) in by_attempt {
        write_attempt(&mut s, t0, attempt, &recs, queued.get(&attempt));
    }
    s
}

/// Slurm's own view of each allocation's end and the next one's start
/// (the queue wait), by the attempt it is shown before.
fn queued_of(
    records: &[Record],
    slurm: Option<&crate::analysis::accounting::SlurmTimes>,
) -> BTreeMap<u32, Vec<(DateTime<Utc>, String)>> {
    let mut queued: BTreeMap<u32, Vec<(DateTime<Utc>, String)>> = BTreeMap::new();
    if let Some(st) = slurm {
        let alloc_of = |a: u32| {
            records
                .iter()
                .filter(|r| r.attempt == a)
                .find_map(|r| match r.event() {
                    Some(Event::JobStart(j)) => j.allocation,
                    _ => None,
                })
                .unwrap_or(a)
        };
        let attempts: BTreeSet<u32> = records.iter().map(|r| r.attempt).collect();
        let mut seen = BTreeSet::new();
        for a in attempts {
            let k = alloc_of(a);
            if k == 0 || !seen.insert(k) {
                continue;
            }
            if let (Some(prev), Some(next)) = (st.allocations.get(&(k - 1)), st.allocations.get(&k))
            {
                let v = queued.entry(a).or_default();
                if let Some(e) = prev.end {
                    v.push((e, format!("allocation {} ended ({})", k - 1, st.source)));
                    v.push((
                        next.start,
                        format!(
                            "allocation {k} started after {:.1}s in the queue ({})",
                            secs(e, next.start),
                            st.source
                        ),
                    ));
                } else {
                    v.push((
                        next.start,
                        format!("allocation {k} started ({})", st.source),
                    ));
                }
            }
        }
    }
    queued
}

/// A record's line (`None`: not shown); a rank's last progress is its
/// last recorded step.
fn line_of(r: &Record, event: Option<&Event>, is_last: &dyn Fn(&Record) -> bool) -> Option<String> {
    match event {
        Some(Event::Progress(p)) if p.first.is_none() && is_last(r) => {
            Some(format!("last recorded step {}", num(p.step)))
        }
        _ => describe(r, event),
    }
}

/// `131072` as `131,072`.
fn thousands(n: usize) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An attempt of more than [`notable::MAX_NODES`] nodes: the records of
/// the nodes not worth a look (see [`notable::worth_a_look`]) grouped by
/// what they say (their kind; an exit's code and class; a first or last
/// step), each group shown once, at its first record. 131,072 ranks made
/// a timeline of 1.3 million lines.
///
/// [`notable::MAX_NODES`]: crate::analysis::notable::MAX_NODES
/// [`notable::worth_a_look`]: crate::analysis::notable::worth_a_look
struct Folded {
    /// Each record's group (an index into `groups`), if folded.
    group: Vec<Option<u32>>,
    groups: Vec<FoldGroup>,
}

/// One group of folded records.
struct FoldGroup {
    first: usize,
    last: usize,
    records: usize,
    ranks: usize,
    nodes: usize,
}

impl Folded {
    fn of(recs: &[&Record], is_last: &dyn Fn(&Record) -> bool) -> Option<Folded> {
        use crate::analysis::notable;
        use std::collections::HashMap;
        if notable::distinct_nodes(recs.iter().copied()).len() <= notable::MAX_NODES {
            return None;
        }
        let shown = notable::worth_a_look(recs.iter().copied());
        // A group's key: what its records say (no text made per record).
        let mut keys: HashMap<(&str, i64, u8), u32> = HashMap::new();
        let mut groups: Vec<FoldGroup> = Vec::new();
        let mut members: Vec<Vec<&Record>> = Vec::new();
        let mut group = Vec::with_capacity(recs.len());
        for (i, r) in recs.iter().enumerate() {
            let key = match r.node.as_deref() {
                Some(n) if !shown.contains(n) => match r.event() {
                    Some(Event::Progress(p)) if p.first.is_some() => Some(("first step", 0, 0)),
                    Some(Event::Progress(_)) if is_last(r) => Some(("last step", 0, 0)),
                    // Neither: not shown at all.
                    Some(Event::Progress(_)) => None,
                    Some(Event::RankExit(x)) => Some((
                        "rank_exit",
                        i64::from(x.exit_code),
                        x.class.map_or(0, |c| c as u8 + 1),
                    )),
                    _ => Some((r.kind.as_str(), 0, 0)),
                },
                _ => None,
            };
            let Some(key) = key else {
                group.push(None);
                continue;
            };
            let next = groups.len() as u32;
            let g = *keys.entry(key).or_insert(next);
            if g == next {
                groups.push(FoldGroup {
                    first: i,
                    last: i,
                    records: 0,
                    ranks: 0,
                    nodes: 0,
                });
                members.push(Default::default());
            }
            let gr = &mut groups[g as usize];
            gr.last = i;
            gr.records += 1;
            members[g as usize].push(r);
            group.push(Some(g));
        }
        for (g, m) in groups.iter_mut().zip(members) {
            let mut ranks: Vec<u32> = m.iter().filter_map(|r| r.rank).collect();
            ranks.sort_unstable();
            ranks.dedup();
            g.ranks = ranks.len();
            g.nodes = notable::distinct_nodes(m).len();
        }
        Some(Folded { group, groups })
    }

    fn group_of(&self, i: usize) -> Option<&FoldGroup> {
        self.group[i].map(|g| &self.groups[g as usize])
    }
}

/// One attempt's lines: Slurm's queue wait before it, then its records.
fn write_attempt(
    s: &mut String,
    t0: DateTime<Utc>,
    attempt: u32,
    recs: &[&Record],
    queued: Option<&Vec<(DateTime<Utc>, String)>>,
) {
    let _ = writeln!(s, "attempt {attempt}:");
    for (at, text) in queued.into_iter().flatten() {
        let _ = writeln!(
            s,
            "  {:>+10.3}s  {}  {:<10} {}",
            (*at - t0).num_milliseconds() as f64 / 1e3,
            at.format("%H:%M:%S%.3fZ"),
            "slurm",
            text
        );
    }
    // The last progress of each rank, shown once, just before what followed it.
    let mut last_progress: std::collections::HashMap<Option<u32>, &Record> = Default::default();
    for r in recs {
        if r.kind == "progress" {
            last_progress.insert(r.rank, r);
        }
    }
    let is_last = |r: &Record| {
        last_progress
            .get(&r.rank)
            .is_some_and(|l| std::ptr::eq(*l, r))
    };
    let fold = Folded::of(recs, &is_last);
    for (i, r) in recs.iter().enumerate() {
        let event = r.event();
        let (who, text) = match fold.as_ref().and_then(|f| f.group_of(i)) {
            // A node not worth a look, past a few hundred: the first
            // record of its kind stands for all of them.
            Some(g) if g.first != i => continue,
            Some(g) => {
                let Some(text) = line_of(r, event, &is_last) else {
                    continue;
                };
                let last = recs[g.last].ts;
                (
                    format!("{} ranks", thousands(g.ranks)),
                    format!(
                        "{text} [{} records on {} nodes, the first r{}@{}, the last at {:+.3}s]",
                        thousands(g.records),
                        thousands(g.nodes),
                        r.rank.map_or("-".to_string(), |v| v.to_string()),
                        r.node.as_deref().unwrap_or("-"),
                        secs(t0, last)
                    ),
                )
            }
            None => {
                let Some(text) = line_of(r, event, &is_last) else {
                    continue;
                };
                let who = format!(
                    "{}{}",
                    r.rank.map_or(String::new(), |v| format!("r{v}")),
                    r.node.as_ref().map_or(String::new(), |n| format!("@{n}"))
                );
                (who, text)
            }
        };
        let _ = writeln!(
            s,
            "  {:>+10.3}s  {}  {:<10} {}",
            secs(t0, r.ts),
            r.ts.format("%H:%M:%S%.3fZ"),
            who,
            text
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn rec(t: f64, kind: &str, rank: Option<u32>, data: Value) -> Record {
        let base: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        Record {
            v: 1,
            ts: base + chrono::Duration::microseconds((t * 1e6) as i64),
            kind: kind.into(),
            attempt: 0,
            rank,
            node: rank.map(|r| format!("n{}", r + 1)),
            data: data.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    /// `nodes` nodes of one rank; rank 7 fails first and is judged the
    /// cause, the others' exits echo it.
    fn job(nodes: u32) -> Vec<Record> {
        let mut r = Vec::new();
        for rank in 0..nodes {
            let t = f64::from(rank) * 1e-4;
            r.push(rec(
                t,
                "rank_start",
                Some(rank),
                json!({ "pid": 100 + rank }),
            ));
            r.push(rec(
                1.0 + t,
                "progress",
                Some(rank),
                json!({ "step": 1, "first": true }),
            ));
            r.push(rec(2.0 + t, "progress", Some(rank), json!({ "step": 2 })));
            r.push(rec(3.0 + t, "progress", Some(rank), json!({ "step": 3 })));
            let (class, code) = if rank == 7 {
                ("infrastructure", 137)
            } else {
                ("secondary", 1)
            };
            r.push(rec(
                5.0 + t,
                "failure",
                Some(rank),
                json!({ "cause": "x", "class": class }),
            ));
            r.push(rec(
                5.0 + t,
                "rank_exit",
                Some(rank),
                json!({ "exit_code": code, "class": class, "cause": "x" }),
            ));
        }
        r.push(rec(
            5.5,
            "judgment",
            None,
            json!({ "class": "infrastructure", "primary_rank": 7, "primary_node": "n8" }),
        ));
        r.sort_by_key(|r| r.ts);
        r
    }

    /// 600 nodes: the blamed node keeps its lines; every other node's
    /// records are one line per thing they say, with how many said it.
    #[test]
    fn a_job_of_many_nodes_shows_the_others_once_per_thing_they_say() {
        let t = render("9", &job(600), None);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines.len() < 20, "{t}");
        for want in [
            "r7@n8",
            "599 ranks",
            "launched pid 100",
            "[599 records on 599 nodes, the first r0@n1, the last at +0.060s]",
            "first step 1",
            "last recorded step 3",
        ] {
            assert!(t.contains(want), "{want}: {t}");
        }
        // The blamed rank's own exit, and the others' as one line.
        assert_eq!(t.matches("r7@n8").count(), 5, "{t}");
        assert_eq!(t.matches("exit code 1,").count(), 1, "{t}");
        assert!(!t.contains("r9@n10"), "{t}");
        // A step between the first and the last is shown for no rank.
        assert!(!t.contains("step 2"), "{t}");
    }

    #[test]
    fn a_job_of_a_few_hundred_nodes_shows_every_rank() {
        let t = render("9", &job(200), None);
        assert!(t.contains("r199@n200"));
        assert_eq!(t.matches("last recorded step 3").count(), 200);
        assert!(!t.contains(" ranks "), "{t}");
    }
}
