//! Runs: one `resilio run` of a job, with its restarts in place, its
//! relaunches inside the allocation and its requeues. A job id can be used
//! again for a new run (`resilio run --job-id X` twice, a Slurm job id
//! after the controller's state was reset); the runs then share the job's
//! journal directory and the reports tell them apart by a run key that
//! every record carries (`run`).
//!
//! The key a process writes ([`resolve`]):
//! - `RESILIO_RUN_ID` when it is set for this job (`RESILIO_JOB_ID` names
//!   the same job): the local launcher's ranks, the steps of a batch-level
//!   supervisor, a nested `resilio run`;
//! - under Slurm, from the allocation: `slurm-JOB-START[-stepS][+N]`, with
//!   START `SLURM_JOB_START_TIME` (Unix seconds; omitted where Slurm does
//!   not set it), S the step of a rank not under a batch-level supervisor,
//!   N `SLURM_RESTART_COUNT` when it is not 0. Every rank of an allocation
//!   derives the same key without talking; a requeue (`+N`) continues the
//!   latest run of the same Slurm job (see [`split`]);
//! - a multi-rank job started by another launcher (`WORLD_SIZE` > 1, no
//!   Slurm): none, as its ranks could not agree on one (such records read
//!   as one run, as journals written before run keys do);
//! - else a new key: the UTC start time and the process id.

use crate::event::Event;
use crate::journal::Record;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The variable that hands a run key to the processes of the same run.
pub const ENV_RUN: &str = "RESILIO_RUN_ID";

/// The run key a process writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunKey {
    /// `None`: records are written without a key.
    pub key: Option<String>,
    /// This process starts the run (the key was not handed down, and is
    /// not a requeue's): it is the one to warn about a reused job id.
    pub fresh: bool,
}

/// The run key for `job`, from the environment (see the module's doc).
pub fn resolve(job: &str, lookup: &dyn Fn(&str) -> Option<String>) -> RunKey {
    let nonempty = |k: &str| {
        lookup(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(k) = nonempty(ENV_RUN).filter(|k| valid_key(k)) {
        if nonempty("RESILIO_JOB_ID").as_deref() == Some(job) {
            return RunKey {
                key: Some(k),
                fresh: false,
            };
        }
    }
    if let Some(slurm_job) = nonempty("SLURM_JOB_ID").filter(|j| valid_key(j)) {
        let mut key = format!("slurm-{slurm_job}");
        if let Some(start) = nonempty("SLURM_JOB_START_TIME").filter(|s| s.parse::<u64>().is_ok()) {
            key.push_str(&format!("-{start}"));
        }
        // A task of a step (not the batch script, whose step is `batch`
        // or 4294967294): two steps of one allocation are two runs.
        let step = nonempty("SLURM_STEP_ID")
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|s| *s < 0xFFFF_FFF0)
            .filter(|_| nonempty("SLURM_PROCID").is_some());
        if let Some(s) = step {
            key.push_str(&format!("-step{s}"));
        }
        let restarts = nonempty("SLURM_RESTART_COUNT")
            .and_then(|r| r.parse::<u32>().ok())
            .unwrap_or(0);
        if restarts > 0 {
            key.push_str(&format!("+{restarts}"));
        }
        return RunKey {
            key: Some(key),
            fresh: restarts == 0,
        };
    }
    let world = nonempty("WORLD_SIZE")
        .and_then(|w| w.parse::<u32>().ok())
        .unwrap_or(1);
    if world > 1 {
        return RunKey {
            key: None,
            fresh: false,
        };
    }
    RunKey {
        key: Some(generate()),
        fresh: true,
    }
}

/// A new key: `20261122T005100.123Z-4242` (UTC start, process id).
pub fn generate() -> String {
    format!(
        "{}-{}",
        Utc::now().format("%Y%m%dT%H%M%S%.3fZ"),
        std::process::id()
    )
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 200
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+' | b':'))
}

/// The Slurm job a key was derived from (`slurm-JOB-...`).
fn slurm_job_of(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("slurm-")?;
    let end = rest.find(['-', '+']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The Slurm job whose latest run a requeue's key (`...+N`, N > 0) continues.
fn continues(key: &str) -> Option<&str> {
    let (_, n) = key.rsplit_once('+')?;
    n.parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|_| slurm_job_of(key))
}

/// The run key a record was written with.
pub fn key_of(r: &Record) -> Option<&str> {
    r.run()
}

/// One run, as the reports list it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunInfo {
    /// 1-based, in the order the runs started.
    pub index: usize,
    /// The run's key (the first allocation's under Slurm); `None` for
    /// records written without one.
    pub key: Option<String>,
    /// Every key of the run: a Slurm job's requeues add theirs.
    pub keys: Vec<String>,
    /// Its first and last record.
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub records: usize,
    /// The last exit code recorded (the job's, else a rank's).
    pub exit_code: Option<i64>,
}

impl RunInfo {
    /// `1 (started 2026-11-22 00:51:00Z, 12.3s, exit 0)`.
    pub fn describe(&self) -> String {
        format!(
            "{} (started {}, {:.1}s{})",
            self.index,
            self.start.format("%Y-%m-%d %H:%M:%SZ"),
            ((self.end - self.start).num_milliseconds() as f64 / 1e3).max(0.0),
            self.exit_code
                .map_or(String::new(), |c| format!(", exit {c}"))
        )
    }
}

/// One run and its records (in time order).
#[derive(Clone, Debug)]
pub struct Run {
    pub info: RunInfo,
    pub records: Vec<Record>,
}

/// Split a job's records (in time order) into runs, ordered by start.
///
/// Records with the same key are one run; a Slurm requeue's key joins the
/// latest run of the same Slurm job. Records without a key join the run
/// whose span holds them; the others are one run of their own (a journal
/// written before run keys existed reads as one run).
pub fn split(records: Vec<Record>) -> Vec<Run> {
    // Each key's span, keys in the order they appear.
    let mut spans: BTreeMap<&str, (DateTime<Utc>, DateTime<Utc>)> = BTreeMap::new();
    for r in &records {
        if let Some(k) = key_of(r) {
            let e = spans.entry(k).or_insert((r.ts, r.ts));
            e.0 = e.0.min(r.ts);
            e.1 = e.1.max(r.ts);
        }
    }
    let mut ordered: Vec<(&str, DateTime<Utc>, DateTime<Utc>)> =
        spans.iter().map(|(k, (a, b))| (*k, *a, *b)).collect();
    ordered.sort_by_key(|(k, a, _)| (*a, *k));
    struct Group {
        keys: Vec<String>,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        slurm_job: Option<String>,
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: BTreeMap<String, usize> = BTreeMap::new();
    for (k, a, b) in ordered {
        let joins = continues(k).and_then(|job| {
            groups
                .iter()
                .rposition(|g| g.slurm_job.as_deref() == Some(job))
        });
        let i = match joins {
            Some(i) => {
                let g = &mut groups[i];
                g.keys.push(k.to_string());
                g.start = g.start.min(a);
                g.end = g.end.max(b);
                i
            }
            None => {
                groups.push(Group {
                    keys: vec![k.to_string()],
                    start: a,
                    end: b,
                    slurm_job: slurm_job_of(k).map(str::to_string),
                });
                groups.len() - 1
            }
        };
        group_of.insert(k.to_string(), i);
    }
    let unkeyed = groups.len();
    let bucket_of = |r: &Record| match key_of(r) {
        Some(k) => group_of.get(k).copied().unwrap_or(unkeyed),
        None => groups
            .iter()
            .position(|g| g.start <= r.ts && r.ts <= g.end)
            .unwrap_or(unkeyed),
    };
    let buckets = bucketed(records, unkeyed + 1, bucket_of);
    let mut runs: Vec<Run> = buckets
        .into_iter()
        .enumerate()
        .filter(|(_, recs)| !recs.is_empty())
        .map(|(i, recs)| {
            let keys = groups.get(i).map(|g| g.keys.clone()).unwrap_or_default();
            let code = |want: &str| {
                recs.iter()
                    .rev()
                    .filter(|r| r.kind == want)
                    .find_map(|r| match r.event() {
                        Some(Event::JobEnd(e)) => Some(e.exit_code),
                        Some(Event::RankExit(e)) => Some(e.exit_code),
                        _ => None,
                    })
            };
            let exit_code = code("job_end").or_else(|| code("rank_exit")).map(i64::from);
            Run {
                info: RunInfo {
                    index: 0,
                    key: keys.first().cloned(),
                    keys,
                    start: recs.first().map(|r| r.ts).unwrap_or_default(),
                    end: recs.iter().map(|r| r.ts).max().unwrap_or_default(),
                    records: recs.len(),
                    exit_code,
                },
                records: recs,
            }
        })
        .collect();
    runs.sort_by_key(|r| r.info.start);
    for (i, r) in runs.iter_mut().enumerate() {
        r.info.index = i + 1;
    }
    runs
}

/// `records` in `n` buckets, each in `bucket_of` its own. All in one (the
/// usual case): they stay where they are (a million records were moved
/// one by one).
fn bucketed(
    records: Vec<Record>,
    n: usize,
    bucket_of: impl Fn(&Record) -> usize,
) -> Vec<Vec<Record>> {
    let mut buckets: Vec<Vec<Record>> = (0..n).map(|_| Vec::new()).collect();
    match records.first().map(&bucket_of) {
        Some(f) if records.iter().all(|r| bucket_of(r) == f) => buckets[f] = records,
        _ => {
            for r in records {
                buckets[bucket_of(&r)].push(r);
            }
        }
    }
    buckets
}

/// The index in `runs` of the run `key` belongs to, or would join (a
/// requeue that has not written yet).
fn find(runs: &[Run], key: &str) -> Option<usize> {
    runs.iter()
        .position(|r| r.info.keys.iter().any(|k| k == key))
        .or_else(|| {
            let job = continues(key)?;
            runs.iter().rposition(|r| {
                r.info
                    .key
                    .as_deref()
                    .and_then(slurm_job_of)
                    .is_some_and(|j| j == job)
            })
        })
}

/// The records of the run `key` belongs to: what a supervisor of that run
/// decides from. Without a key, every record (runs cannot be told apart).
pub fn of_key(records: Vec<Record>, key: Option<&str>) -> Vec<Record> {
    let Some(key) = key else { return records };
    if records.iter().all(|r| key_of(r) == Some(key)) {
        // Only this run's records (or none yet): the common case.
        return records;
    }
    let mut runs = split(records);
    match find(&runs, key) {
        Some(i) => runs.swap_remove(i).records,
        None => Vec::new(),
    }
}

/// Which run `--run WHICH` names: its 1-based index, or one of its keys.
pub fn select(runs: &[RunInfo], which: &str) -> Result<usize, String> {
    let which = which.trim();
    if let Ok(n) = which.parse::<usize>() {
        if (1..=runs.len()).contains(&n) {
            return Ok(n - 1);
        }
    }
    if let Some(i) = runs.iter().position(|r| r.keys.iter().any(|k| k == which)) {
        return Ok(i);
    }
    Err(match runs.len() {
        1 => format!("--run {which}: the job was run once (--run 1)"),
        n => format!("--run {which}: the job was run {n} times: give 1 to {n}, or a run key"),
    })
}

/// Attempts of one run dated out of their order: an attempt whose first
/// record is dated more than a minute before an earlier attempt's first
/// (attempts follow one another; a journal whose times were reversed or
/// edited does not). By attempt, with why, in words; the reports leave them
/// out of their figures and say so.
pub fn reversed_attempts(records: &[Record]) -> Vec<(u32, String)> {
    let mut first: std::collections::BTreeMap<u32, chrono::DateTime<chrono::Utc>> =
        Default::default();
    for r in records {
        first
            .entry(r.attempt)
            .and_modify(|t| *t = (*t).min(r.ts))
            .or_insert(r.ts);
    }
    let slack = chrono::Duration::seconds(60);
    let mut out = Vec::new();
    let mut latest: Option<(u32, chrono::DateTime<chrono::Utc>)> = None;
    for (attempt, start) in first {
        match latest {
            Some((before, t)) if start + slack < t => out.push((
                attempt,
                format!(
                    "attempt {attempt} is dated {} before attempt {before} began ({}): left out of the figures",
                    start.format("%Y-%m-%d %H:%M:%S"),
                    t.format("%Y-%m-%d %H:%M:%S")
                ),
            )),
            _ => latest = Some((attempt, start)),
        }
    }
    out
}

/// The note reports print when a job was run more than once:
/// `job X was run 2 times; showing run 2 (started ...); earlier runs: 1 (...); pick one with --run N`.
pub fn note(job: &str, runs: &[RunInfo], shown: usize) -> Option<String> {
    if runs.len() < 2 {
        return None;
    }
    let latest = shown + 1 == runs.len();
    let others: Vec<String> = runs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != shown)
        .map(|(_, r)| r.describe())
        .collect();
    let s = &runs[shown];
    Some(format!(
        "job {job} was run {} times (the job id was used again); showing run {} (started {}{}); {} runs: {}; pick one with --run N",
        runs.len(),
        s.index,
        s.start.format("%Y-%m-%d %H:%M:%SZ"),
        if latest { ", the latest" } else { "" },
        if latest { "earlier" } else { "other" },
        others.join(", ")
    ))
}

/// A fresh run of `job` starts in `job_dir`: warn when the job id was
/// used before, and forget the rollback an earlier run left (its attempts
/// count from 0 again).
pub fn starting_fresh(job_dir: &Path, job: &str, key: Option<&str>) {
    warn_if_reused(job_dir, job, key);
    crate::journal::forget_rollback(job_dir);
}

/// At the start of a run: say on stderr when the job id already has a
/// journal from an earlier run (the reports show the runs separately).
/// Returns whether it warned.
pub fn warn_if_reused(job_dir: &Path, job: &str, key: Option<&str>) -> bool {
    let Some(key) = key else { return false };
    let Ok(j) = crate::journal::read_job(job_dir) else {
        return false;
    };
    let runs = split(j.records);
    let mine = find(&runs, key);
    let earlier = runs
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != mine)
        .count();
    if earlier == 0 {
        return false;
    }
    tracing::warn!(
        "job id {job} already has a journal from an earlier run; this run is reported separately (resilio report {job} --run N shows another)"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn rec(t: f64, kind: &str, run: Option<&str>, data: Value) -> Record {
        let base: DateTime<Utc> = "2026-11-22T00:00:00Z".parse().unwrap();
        let mut data = data.as_object().cloned().unwrap_or_default();
        if let Some(k) = run {
            data.insert("run".into(), json!(k));
        }
        Record {
            v: 1,
            ts: base + chrono::Duration::milliseconds((t * 1e3) as i64),
            kind: kind.into(),
            attempt: 0,
            rank: Some(0),
            node: Some("n1".into()),
            data,
            ..Default::default()
        }
    }

    #[test]
    fn keys_come_from_the_environment() {
        // Handed down for the same job: not fresh.
        let k = resolve(
            "j",
            &env(&[
                (ENV_RUN, "abc"),
                ("RESILIO_JOB_ID", "j"),
                ("SLURM_JOB_ID", "7"),
            ]),
        );
        assert_eq!((k.key.as_deref(), k.fresh), (Some("abc"), false));
        // Handed down for another job: ignored.
        let k = resolve("other", &env(&[(ENV_RUN, "abc"), ("RESILIO_JOB_ID", "j")]));
        assert!(k.fresh && k.key.as_deref() != Some("abc"));
        // Slurm: every rank of an allocation derives the same key.
        let slurm = [
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_JOB_START_TIME", "1790000000"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "3"),
        ];
        let k = resolve("4242", &env(&slurm));
        assert_eq!(
            (k.key.as_deref(), k.fresh),
            (Some("slurm-4242-1790000000-step0"), true)
        );
        // The batch script: no step; a requeue continues.
        let k = resolve(
            "4242",
            &env(&[
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_JOB_START_TIME", "1790000900"),
                ("SLURM_STEP_ID", "4294967294"),
                ("SLURM_RESTART_COUNT", "2"),
            ]),
        );
        assert_eq!(
            (k.key.as_deref(), k.fresh),
            (Some("slurm-4242-1790000900+2"), false)
        );
        // Another launcher's ranks cannot agree on a key.
        let k = resolve("j", &env(&[("WORLD_SIZE", "4"), ("RANK", "1")]));
        assert_eq!((k.key, k.fresh), (None, false));
        // A plain run: a new key each time.
        let a = resolve("j", &env(&[]));
        assert!(a.fresh && a.key.is_some());
        assert!(valid_key(a.key.as_deref().unwrap()));
    }

    #[test]
    fn records_split_by_key_and_requeues_stay_one_run() {
        let recs = vec![
            rec(0.0, "job_start", Some("slurm-7-100"), json!({})),
            rec(
                5.0,
                "rank_exit",
                Some("slurm-7-100"),
                json!({"exit_code": 1}),
            ),
            // The requeue: another allocation, the same run.
            rec(60.0, "job_start", Some("slurm-7-160+1"), json!({})),
            rec(
                70.0,
                "job_end",
                Some("slurm-7-160+1"),
                json!({"exit_code": 0}),
            ),
            // The job id used again after the controller's state was reset.
            rec(9000.0, "job_start", Some("slurm-7-9000"), json!({})),
            rec(
                9001.0,
                "job_end",
                Some("slurm-7-9000"),
                json!({"exit_code": 3}),
            ),
        ];
        let runs = split(recs.clone());
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].info.keys, ["slurm-7-100", "slurm-7-160+1"]);
        assert_eq!(runs[0].records.len(), 4);
        assert_eq!(runs[0].info.exit_code, Some(0));
        assert_eq!((runs[1].info.index, runs[1].info.exit_code), (2, Some(3)));
        // What a supervisor of each run decides from.
        assert_eq!(of_key(recs.clone(), Some("slurm-7-9000")).len(), 2);
        assert_eq!(of_key(recs.clone(), Some("slurm-7-160+1")).len(), 4);
        // A second requeue of the latest run, before it wrote anything.
        assert_eq!(of_key(recs.clone(), Some("slurm-7-9500+1")).len(), 2);
        // A new run: nothing of the others.
        assert!(of_key(recs.clone(), Some("new")).is_empty());
        assert_eq!(of_key(recs, None).len(), 6);
    }

    #[test]
    fn records_without_a_key_join_the_run_around_them_or_read_as_one() {
        // A journal written before run keys: one run.
        let old = vec![
            rec(0.0, "rank_start", None, json!({})),
            rec(9.0, "rank_exit", None, json!({})),
            rec(20.0, "rank_start", None, json!({})),
        ];
        let runs = split(old);
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].info.key.clone(), runs[0].records.len()), (None, 3));
        // Old records, then a run with a key; a keyless record inside it joins it.
        let mixed = vec![
            rec(0.0, "rank_start", None, json!({})),
            rec(1.0, "rank_exit", None, json!({})),
            rec(4.0, "rank_start", Some("b"), json!({})),
            rec(5.0, "stall_reported", None, json!({})),
            rec(6.0, "rank_exit", Some("b"), json!({})),
        ];
        let runs = split(mixed);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].info.key, None);
        assert_eq!(runs[1].info.key.as_deref(), Some("b"));
        assert_eq!(runs[1].records.len(), 3);
    }

    #[test]
    fn runs_are_picked_by_index_or_key_and_described() {
        let recs = vec![
            rec(0.0, "rank_start", Some("a"), json!({})),
            rec(2.5, "rank_exit", Some("a"), json!({"exit_code": 0})),
            rec(10.0, "rank_start", Some("b"), json!({})),
        ];
        let infos: Vec<RunInfo> = split(recs).into_iter().map(|r| r.info).collect();
        assert_eq!(select(&infos, "1"), Ok(0));
        assert_eq!(select(&infos, "b"), Ok(1));
        let err = select(&infos, "3").unwrap_err();
        assert_eq!(
            err,
            "--run 3: the job was run 2 times: give 1 to 2, or a run key"
        );
        assert!(select(&infos, "0").is_err());
        let n = note("j", &infos, 1).unwrap();
        assert_eq!(
            n,
            "job j was run 2 times (the job id was used again); showing run 2 (started 2026-11-22 00:00:10Z, the latest); earlier runs: 1 (started 2026-11-22 00:00:00Z, 2.5s, exit 0); pick one with --run N"
        );
        assert!(note("j", &infos[..1], 0).is_none());
    }
}
