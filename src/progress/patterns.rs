//! The default patterns the progress sources read output and files with,
//! and how a progress file is watched. Configuration may replace each
//! (`[progress]` and `[checkpoint]` in `conf/resilio.toml`); these are the
//! built-in values, tested against recorded trainer lines in
//! `tests/fixtures/progress`.

use serde::Deserialize;

/// The default progress regex: the first capture group that took part in a
/// match is the step (see `tests/fixtures/progress/trainer_lines.tsv` for the
/// real lines it is tested against).
///
/// It recognises `step 120`, `Step 120/10000`, `step: 120`, `step=120,`,
/// `global_step=120`, `global step 120`, `"step": 120` (torchtitan, nanoGPT,
/// DeepSpeed, Lightning, HF), Megatron-LM/NeMo `iteration      120/  10000`,
/// nanoGPT `iter 120:`, DeepSpeed pipeline `steps: 120`, fairseq
/// `num_updates=120`, Composer `[batch=120/1000]`, the unlabelled tqdm bar
/// of the HF Trainer (`  5%|▌   | 120/2400 [`), and PyTorch Lightning's
/// training bar (`Epoch 2:  14%|█▍  | 100/704 [`, read as epoch × batches per
/// epoch + batch, so it keeps growing across epochs; its Rich bar, drawn
/// only where Rich sees a terminal, e.g. with `TTY_COMPATIBLE=1`: `Epoch
/// 0/9 ━━━━╸━━━━ 5/12 0:00:00 • 0:00:01 18.73it/s`; Lightning 1.x counts
/// validation batches in that bar only in validation epochs, so the count
/// may step back after one; after a resume inside an epoch Lightning 2
/// draws `Training: |   | 26/? [` with no epoch and no total: life, that
/// names no step: `resilio_client.lightning` reports exact steps,
/// and socket steps take precedence). Words glued to other
/// identifiers (`warmup_steps=`, `max_steps:`, `micro_step=`), plurals in
/// prose and totals (`Total optimization steps = 1000`), and labelled bars
/// (dataset preprocessing, checkpoint shard loading) do not match. A
/// colour code just before the word counts as a boundary: torchtitan
/// colours its step lines (`\x1b[31mstep: 10`) unless told not to.
pub const DEFAULT_PROGRESS_REGEX: &str = concat!(
    r#"(?im-u)(?:^|[^a-z0-9_]|\x1b\[[0-9;]*m)(?:global[_ ])?step["']?\s*[:=]?\s*(\d+)"#,
    r#"|(?:^|[^a-z0-9_]|\x1b\[[0-9;]*m)iteration\s+(\d+)\s*/\s*\d+"#,
    r#"|(?:^|[^a-z0-9_]|\x1b\[[0-9;]*m)iter\s+(\d+):"#,
    r#"|^steps:\s+(\d+)"#,
    r#"|num_updates["']?[=\s:"']+(\d+)"#,
    r#"|\[batch=(\d+)/\d+\]"#,
    r#"|^\s*\d+%\|[^|\n]*\|\s*(\d+)/(?P<bar_total>\d+)\s*\["#,
    r#"|^training: +\|[^|\n]*\|\s*(?P<open_count>\d+)/\?\s*\["#,
    r#"|^(?:\x1b\[[0-9;]*[a-z])*epoch +(?P<epoch>\d+)(?::\s+\d+%\|[^|\n]*\||/-?\d+\s+(?:\x1b\[[0-9;]*m|\xE2\x94\x81|\xE2\x95[\xB8\xBA])+)\s*(?P<batch>\d+)/(?P<per_epoch>\d+)(?:\s*\[|\s+(?:\x1b\[[0-9;]*m)?\d+:\d\d)"#,
);

/// Default regex marking the start of a checkpoint save in plain output.
pub const DEFAULT_CHECKPOINT_REGEX: &str =
    r"(?i-u)saving (?:model )?checkpoint|save_checkpoint|checkpoint saving|saving state to";
/// Default regex marking the start of an evaluation in plain output.
pub const DEFAULT_EVAL_REGEX: &str = r"(?i-u)running evaluation|\bevaluating\b|validation dataloader|validation sanity check|\brunning validation\b";

/// Default regex over paths in the watched checkpoint directory that mark a
/// complete checkpoint (the first group that took part: the step): the
/// file a save writes last (`COMPLETE`/`DONE` markers, HF's
/// `trainer_state.json`, torch DCP's `.metadata`) inside `checkpoint-N`,
/// `iter_N`, `step_N`, `global_stepN`; or Lightning's checkpoint file
/// (`epoch=2-step=150.ckpt`, `-v1` for a second one of a name), which its
/// `ModelCheckpoint` writes whole under a temporary name, then renames.
pub const DEFAULT_CHECKPOINT_WATCH_REGEX: &str = r"^(?:.*/)?(?:(?:checkpoint[-_]?|iter_|step[-_]?|global_step)0*(\d+)/(?:COMPLETE|\.complete|DONE|\.done|trainer_state\.json|\.metadata)|[^/]*\bstep=0*(\d+)(?:-v\d+)?\.ckpt)$";

/// How the progress file is watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// inotify, except on network filesystems (NFS, Lustre, GPFS, ...) where it polls.
    Auto,
    /// Always poll (stat every `file_poll_interval`).
    Always,
    /// Never poll: inotify only.
    Never,
}
