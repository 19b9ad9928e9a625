//! A restored checkpoint blamed for the failure that followed it. Pure:
//! attempts' outcomes in, the suspect checkpoint out.
//!
//! After a restart the trainer loads a checkpoint. When the attempt then
//! fails within [`WITHIN_STEPS`] steps of it (or before its first step),
//! the checkpoint may be the cause: a torn or corrupt save loads into NaN
//! losses or an exception (Megatron-LM #5281 restarted 44 times from one).
//! The rule:
//! - a failure of the trainer's own soon after a restore (NaN/Inf within
//!   [`WITHIN_STEPS`]; an exception or a bare crash in the load or the
//!   first step) blames the restored checkpoint at once, unless
//!   the attempt before failed the same way soon after restoring another
//!   checkpoint (two checkpoints failing alike: the code, not the saves);
//! - any failure (a hang, a node's) soon after restoring the same
//!   checkpoint a second time blames it too;
//! - a checkpoint blamed is not loaded again: the next attempt is told the
//!   one before it (`RESILIO_ROLLBACK_STEP`), and if a trainer that was
//!   told loads it anyway and fails soon after once more, the job stops
//!   rather than load it again.
//!
//! Which checkpoint an attempt restored is the job level's inference (the
//! rollback it was told, else the newest whole checkpoint before its first
//! step): [`AttemptOutcome::restored`].

use super::failure::Class;
use super::outcome::AttemptOutcome;

/// How many steps after its restore a failure is blamed on the checkpoint.
pub const WITHIN_STEPS: u64 = 10;

/// The restored checkpoint blamed for an attempt's failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    /// The checkpoint's step.
    pub step: u64,
    /// The earlier attempts that failed soon after restoring it.
    pub before: Vec<u32>,
    /// This attempt was told to load a checkpoint before the one of this
    /// step (blamed already) and restored it, or one saved from it, anyway:
    /// it is not loaded again.
    pub told_before: Option<u64>,
}

impl Suspect {
    /// Why, in words: for the decision's reason.
    pub fn why(&self, current: &AttemptOutcome) -> String {
        let when = match current.failed_from.or(current.last_step) {
            Some(s) if s > self.step => format!("{} step(s) after", s - self.step),
            _ => "before a step after".to_string(),
        };
        let again = if self.before.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = self.before.iter().map(u32::to_string).collect();
            format!(
                " (attempt {} also failed soon after restoring it)",
                list.join(", ")
            )
        };
        // A long exception (PyTorch's run to 400 characters) cut short.
        let mut shown = current.shown();
        if shown.chars().count() > 200 {
            shown = format!("{}...", shown.chars().take(200).collect::<String>());
        }
        format!(
            "{shown} {when} restoring the checkpoint of step {}{again}: that checkpoint is suspect",
            self.step
        )
    }
}

/// A failure that counts against a restored checkpoint: not a clean end,
/// a stop from outside or a step that started no rank.
fn counts(a: &AttemptOutcome) -> bool {
    !a.launch_trouble && !matches!(a.class, Class::Clean | Class::Preempted)
}

/// The attempt failed within [`WITHIN_STEPS`] of its restore (or before any
/// step), counting failures only: the checkpoint it restored, if so.
pub(super) fn failed_soon(a: &AttemptOutcome) -> Option<u64> {
    let c = a.restored.filter(|c| *c > 0)?;
    let soon = a
        .failed_from
        .or(a.last_step)
        .is_none_or(|s| s <= c.saturating_add(WITHIN_STEPS));
    (counts(a) && soon).then_some(c)
}

/// The same save restored by both: the same step, saved by the same
/// attempt (where the journal says which).
fn same_save(a: &AttemptOutcome, b: &AttemptOutcome) -> bool {
    a.restored == b.restored && a.restored_saved_in == b.restored_saved_in
}

/// Whether the checkpoint `current` restored was saved before the blame
/// `b` was laid (the blamed save, or one saved from it by the attempt
/// blamed): a later attempt's save of the same step is another one.
fn saved_by_then(current: &AttemptOutcome, b: &Blamed) -> bool {
    current.restored_saved_in.is_none_or(|s| s <= b.by_attempt)
}

/// The trainer's own failures: the ones a bad checkpoint causes on its own.
fn trainers_own(class: Class) -> bool {
    matches!(class, Class::Numerical | Class::Unknown | Class::UserError)
}

/// The checkpoint `current`'s failure is blamed on, given the attempts
/// before it (oldest first), if any.
pub fn suspect(current: &AttemptOutcome, earlier: &[AttemptOutcome]) -> Option<Suspect> {
    failed_soon(current)?;
    suspect_given(current, earlier, &suspects(earlier))
}

/// [`suspect`], given the checkpoints blamed by the attempts before.
fn suspect_given(
    current: &AttemptOutcome,
    earlier: &[AttemptOutcome],
    blamed: &[Blamed],
) -> Option<Suspect> {
    let c = failed_soon(current)?;
    let before: Vec<u32> = earlier
        .iter()
        .filter(|a| failed_soon(a) == Some(c) && same_save(a, current))
        .map(|a| a.attempt)
        .collect();
    // Told to go back before a blamed checkpoint, the attempt restored it
    // or a later one (saved from it by the attempt it failed): not obeyed.
    // A save of that step by a later attempt is another checkpoint.
    let told_before = earlier
        .last()
        .and_then(|p| blamed.iter().find(|b| b.by_attempt == p.attempt))
        .filter(|b| c >= b.step && saved_by_then(current, b))
        .map(|b| b.step)
        .or_else(|| {
            blamed
                .iter()
                .find(|b| b.step == c && saved_by_then(current, b))
                .map(|b| b.step)
        });
    if !before.is_empty() || told_before.is_some() {
        return Some(Suspect {
            step: c,
            before,
            told_before,
        });
    }
    if !trainers_own(current.class) {
        return None;
    }
    // An exception or a crash counts only in the load or the step right
    // after it (a torn save fails there); later, with steps trained from
    // the checkpoint, it is weak evidence against it (trial 18: a one-off
    // error three steps on blamed a healthy checkpoint). NaN or Inf counts
    // within the window.
    if current.class != Class::Numerical && current.last_step.is_some_and(|s| s > c + 1) {
        return None;
    }
    // Failing before any step: blamed only when the trainer's start is
    // known to work (an earlier attempt reached a step).
    if current.last_step.is_none() && !earlier.iter().any(|a| a.last_step.is_some()) {
        return None;
    }
    // The attempt before failed the same way soon after restoring another
    // checkpoint: two saves failing alike point at the code.
    let prev = earlier.iter().rev().find(|a| counts(a));
    if prev.is_some_and(|p| p.signature == current.signature && failed_soon(p).is_some()) {
        return None;
    }
    Some(Suspect {
        step: c,
        before,
        told_before: None,
    })
}

/// A checkpoint blamed, and the attempt whose failure blamed it (a save
/// of the same step confirmed after that attempt began is another one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blamed {
    pub step: u64,
    pub by_attempt: u32,
}

/// Every checkpoint blamed so far: each outcome's suspect given those
/// before it (oldest first).
pub fn suspects(outcomes: &[AttemptOutcome]) -> Vec<Blamed> {
    let mut blamed = Vec::new();
    for (i, o) in outcomes.iter().enumerate() {
        if let Some(s) = suspect_given(o, &outcomes[..i], &blamed) {
            blamed.push(Blamed {
                step: s.step,
                by_attempt: o.attempt,
            });
        }
    }
    blamed
}

/// Whether the checkpoint of `step`, confirmed in attempt `confirmed_in`,
/// is one of those blamed, or was saved by an attempt that restored one
/// (made from it before the failure showed: NaN weights saved as new).
pub fn is_blamed(blamed: &[Blamed], step: u64, confirmed_in: u32) -> bool {
    blamed
        .iter()
        .any(|b| (b.step == step && confirmed_in < b.by_attempt) || confirmed_in == b.by_attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(
        attempt: u32,
        class: Class,
        what: &str,
        restored: Option<u64>,
        last: Option<u64>,
    ) -> AttemptOutcome {
        let mut o = AttemptOutcome::new(attempt, class, what, last, Vec::new());
        o.restored = restored;
        o
    }

    #[test]
    fn a_nan_or_crash_soon_after_a_restore_blames_the_checkpoint() {
        let first = out(0, Class::Infrastructure, "Xid 79", None, Some(130));
        let nan = out(
            1,
            Class::Numerical,
            "loss nan at step 101",
            Some(100),
            Some(101),
        );
        let s = suspect(&nan, std::slice::from_ref(&first)).unwrap();
        assert_eq!(s.step, 100);
        assert!(s.before.is_empty() && s.told_before.is_none());
        assert!(s
            .why(&nan)
            .contains("1 step(s) after restoring the checkpoint of step 100"));
        // A torn save fails in its load, before any step.
        let torn = out(
            1,
            Class::Unknown,
            "RuntimeError: PytorchStreamReader failed",
            Some(100),
            None,
        );
        assert_eq!(
            suspect(&torn, std::slice::from_ref(&first)).unwrap().step,
            100
        );
        assert!(suspect(&torn, std::slice::from_ref(&first))
            .unwrap()
            .why(&torn)
            .contains("before a step after restoring"));
        // ...but not when no attempt ever got past its start.
        let never = out(0, Class::Unknown, "exit code 1", None, None);
        assert_eq!(suspect(&torn, &[never]), None);
    }

    #[test]
    fn an_exception_counts_in_the_load_or_the_first_step_only() {
        let first = out(0, Class::Infrastructure, "Xid 79", None, Some(130));
        let e = std::slice::from_ref(&first);
        for last in [None, Some(100), Some(101)] {
            let crash = out(1, Class::Unknown, "RuntimeError: x", Some(100), last);
            assert!(suspect(&crash, e).is_some(), "{last:?}");
        }
        let later = out(1, Class::Unknown, "RuntimeError: x", Some(100), Some(103));
        assert_eq!(suspect(&later, e), None);
        // ...unless the same checkpoint failed soon after before.
        let again = out(2, Class::Unknown, "RuntimeError: x", Some(100), Some(103));
        assert!(suspect(&again, &[first, later]).is_some());
    }

    #[test]
    fn late_failures_nodes_hangs_and_fresh_starts_blame_no_checkpoint() {
        let first = out(0, Class::Infrastructure, "Xid 79", None, Some(130));
        let e = std::slice::from_ref(&first);
        // Past the window.
        assert_eq!(
            suspect(&out(1, Class::Numerical, "nan", Some(100), Some(111)), e),
            None
        );
        assert!(suspect(&out(1, Class::Numerical, "nan", Some(100), Some(110)), e).is_some());
        // A NaN found some steps after it began counts from where it began.
        let mut late = out(1, Class::Numerical, "nan", Some(100), Some(121));
        late.failed_from = Some(101);
        assert!(suspect(&late, e).is_some());
        // A node's failure or a hang once is not the checkpoint's.
        assert_eq!(
            suspect(
                &out(1, Class::Infrastructure, "Xid 79", Some(100), Some(101)),
                e
            ),
            None
        );
        assert_eq!(
            suspect(&out(1, Class::Hang, "stalled", Some(100), Some(101)), e),
            None
        );
        // Nothing restored (or the start from scratch a rollback asked for).
        assert_eq!(
            suspect(&out(1, Class::Numerical, "nan", None, Some(3)), e),
            None
        );
        assert_eq!(
            suspect(&out(1, Class::Numerical, "nan", Some(0), Some(3)), e),
            None
        );
        // Preempted or launch trouble count for nothing.
        let mut lt = out(1, Class::Infrastructure, "no rank", Some(100), None);
        lt.launch_trouble = true;
        assert_eq!(suspect(&lt, e), None);
    }

    #[test]
    fn the_same_checkpoint_failing_twice_is_blamed_whatever_the_failures() {
        let first = out(0, Class::Infrastructure, "Xid 79", None, Some(130));
        let hang1 = out(1, Class::Hang, "stalled", Some(100), Some(104));
        let hang2 = out(2, Class::Hang, "stalled", Some(100), Some(103));
        let earlier = [first.clone(), hang1.clone()];
        let s = suspect(&hang2, &earlier).unwrap();
        assert_eq!(
            (s.step, s.before.clone(), s.told_before),
            (100, vec![1], None)
        );
        assert!(s
            .why(&hang2)
            .contains("(attempt 1 also failed soon after restoring it)"));
        // Told to load the one before after that, the trainer loaded it a
        // third time: it is not loaded again.
        let third = out(3, Class::Numerical, "nan", Some(100), Some(101));
        let s = suspect(&third, &[first.clone(), hang1, hang2]).unwrap();
        assert_eq!(s.told_before, Some(100), "{s:?}");
        assert_eq!(s.before, vec![1, 2]);
        // Or one saved from it (step 110, by the attempt that failed).
        let mut nan1 = out(1, Class::Numerical, "nan", Some(100), Some(112));
        nan1.failed_from = Some(101);
        let mut nan2 = out(2, Class::Numerical, "nan", Some(110), Some(114));
        nan2.failed_from = Some(111);
        let s = suspect(&nan2, &[first, nan1]).unwrap();
        assert_eq!((s.step, s.told_before), (110, Some(100)), "{s:?}");
    }

    #[test]
    fn a_blamed_step_saved_again_by_a_later_attempt_is_another_checkpoint() {
        let first = out(0, Class::Infrastructure, "Xid 79", None, Some(130));
        let mut nan1 = out(1, Class::Numerical, "nan", Some(100), Some(104));
        nan1.restored_saved_in = Some(0);
        // Told 90, attempt 2 trained past 100 (saving it again), then a node
        // failed at 115.
        let mut kill2 = out(2, Class::Infrastructure, "Xid 79", Some(90), Some(115));
        kill2.restored_saved_in = Some(0);
        // Attempt 3 restores attempt 2's save of step 100 and NaNs at once:
        // blamed afresh (told the one before), not taken for a trainer that
        // loaded the blamed save although told.
        let mut nan3 = out(3, Class::Numerical, "nan", Some(100), Some(103));
        nan3.restored_saved_in = Some(2);
        let s = suspect(&nan3, &[first.clone(), nan1.clone(), kill2.clone()]).unwrap();
        assert_eq!(
            (s.step, s.told_before, s.before.clone()),
            (100, None, vec![])
        );
        // The old save of step 100 loaded again: not obeyed.
        nan3.restored_saved_in = Some(0);
        let s = suspect(&nan3, &[first, nan1, kill2]).unwrap();
        assert_eq!((s.told_before, s.before.clone()), (Some(100), vec![1]));
    }

    #[test]
    fn two_checkpoints_failing_alike_point_at_the_code() {
        let first = out(0, Class::Unknown, "KeyError: 'step'", None, Some(130));
        let a1 = out(1, Class::Unknown, "KeyError: 'opt'", Some(100), Some(100));
        let a2 = out(2, Class::Unknown, "KeyError: 'opt'", Some(50), Some(51));
        assert_eq!(
            suspect(&a1, std::slice::from_ref(&first)).unwrap().step,
            100
        );
        assert_eq!(suspect(&a2, &[first.clone(), a1.clone()]), None);
        let blamed = suspects(&[first, a1, a2]);
        assert_eq!(
            blamed,
            vec![Blamed {
                step: 100,
                by_attempt: 1
            }]
        );
        assert!(is_blamed(&blamed, 100, 0));
        // Saved again at the same step after the blame: another checkpoint.
        assert!(!is_blamed(&blamed, 100, 2) && !is_blamed(&blamed, 50, 0));
        // What the blamed attempt saved came from the suspect checkpoint.
        assert!(is_blamed(&blamed, 105, 1));
    }
}
