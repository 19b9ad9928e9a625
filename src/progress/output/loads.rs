//! A trainer's word that it loaded a checkpoint, before its first step:
//! where a recovery's `restore` phase ends.

use regex::bytes::Regex;

/// A line that says a checkpoint (or its states) was loaded, restored or
/// resumed from, in either order: Lightning's `Restored all states from the
/// checkpoint at /ck/epoch=0-step=20.ckpt`, Megatron-LM's `successfully
/// loaded checkpoint from /ck at iteration 20`, torchtitan's `Finished
/// loading the checkpoint in 1.2 seconds`, the HF Trainer's `Continuing
/// training from checkpoint` (at log level info), `checkpoint loaded`.
/// ASCII only (`-u`): its word boundaries keep to the fast engines on any
/// output (tqdm's bars are not ASCII).
pub(super) const LOAD_REGEX: &str = r"(?im-u)^[^\r\n]*?(?:\b(?:restor(?:e|ed|ing)|load(?:ed|ing)?|resum(?:e|ed|ing)|continuing training)\b[^\r\n]*?\b(?:checkpoint|ckpt|state_dict|states)|\b(?:checkpoint|ckpt)\b[^\r\n]*?\b(?:restored|loaded|resumed))[^\r\n]*";

/// Words that make such a line no load done: a failure (`Could not load
/// checkpoint`, `no checkpoint found`), a bar (`Loading checkpoint shards:
/// 100%|...`: a pretrained model's weights, at every start), a save, a
/// warning about a load (transformers' `There were missing keys in the
/// checkpoint model loaded`, printed halfway through the HF Trainer's
/// resume; Lightning's `.../training_epoch_loop.py:224: You're resuming from
/// a checkpoint that ended before the epoch ended`: trial 20).
const NOT_A_LOAD: [&[u8]; 14] = [
    b"fail",
    b"error",
    b"could not",
    b"cannot",
    b"unable",
    b"not found",
    b"no checkpoint",
    b"shards",
    b"%|",
    b"saving",
    b"warn",
    b"missing",
    b"unexpected",
    b".py:",
];

/// The longest line kept.
const MAX_LINE: usize = 200;

/// Substrings of which every load line holds one, in the cases trainers
/// print them: a read without any costs one literal search (SIMD), not the
/// whole regex (a case-insensitive literal search is many times slower, see
/// [`super::DEFAULT_LITERALS`]). A line that spells them otherwise
/// (`CheckPoint`) is not read.
const LITERALS: [&str; 10] = [
    "checkpoint",
    "Checkpoint",
    "CHECKPOINT",
    "ckpt",
    "Ckpt",
    "CKPT",
    "state_dict",
    "states",
    "States",
    "STATES",
];

/// The load lines' regex, behind its literal prefilter.
#[derive(Clone, Debug)]
pub(super) struct Loads {
    prefilter: Regex,
    line: Regex,
}

impl Loads {
    pub fn new() -> Loads {
        let alternation: Vec<String> = LITERALS.iter().map(|l| regex::escape(l)).collect();
        Loads {
            prefilter: Regex::new(&alternation.join("|")).expect("load prefilter"),
            line: Regex::new(LOAD_REGEX).expect("load regex"),
        }
    }

    /// The last line of `text` that says a checkpoint was loaded, trimmed
    /// and cut at [`MAX_LINE`] characters.
    pub fn last(&self, text: &[u8]) -> Option<String> {
        if !self.prefilter.is_match(text) {
            return None;
        }
        last_load(&self.line, text)
    }
}

/// Whether a load line (or the socket's `restored`) says the load is over
/// (`Restored all states`, `successfully loaded`, `Finished loading`,
/// `resumed from`, the HF Trainer's `Continuing training from checkpoint`,
/// printed after its load) rather than begun (`Loading the checkpoint`,
/// `Restoring states from`, `resuming after checkpoint 10`).
pub fn says_done(line: &str) -> bool {
    const DONE: [&str; 8] = [
        "loaded",
        "restored",
        "resumed",
        "continuing training",
        "finished",
        "successfully",
        "complete",
        "done",
    ];
    let lower = line.to_ascii_lowercase();
    DONE.iter().any(|w| lower.contains(w))
}

fn last_load(re: &Regex, text: &[u8]) -> Option<String> {
    let line = re
        .find_iter(text)
        .map(|m| m.as_bytes())
        .filter(|line| {
            !NOT_A_LOAD
                .iter()
                .any(|w| line.windows(w.len()).any(|x| x.eq_ignore_ascii_case(w)))
        })
        .last()?;
    let line = String::from_utf8_lossy(line);
    let line = line.trim();
    Some(match line.char_indices().nth(MAX_LINE - 1) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Option<String> {
        Loads::new().last(text.as_bytes())
    }

    #[test]
    fn the_frameworks_load_lines_are_loads() {
        for line in [
            "Restoring states from the checkpoint path at /ck/epoch=0-step=20.ckpt",
            "Restored all states from the checkpoint at /ck/epoch=0-step=20.ckpt",
            " successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration 20",
            "[rank0]:[titan] 2026-11-28 05:00:00,000 - root - INFO - Finished loading the checkpoint in 1.23 seconds.",
            "  Continuing training from checkpoint, will skip to saved global_step",
            "resumed from checkpoint #19",
            "Checkpoint loaded: step 40",
            "loading checkpoint from ./out/checkpoint-40",
            "Resuming from ckpt step_40.pt",
        ] {
            assert_eq!(load(line).as_deref(), Some(line.trim()), "{line}");
        }
    }

    #[test]
    fn failures_bars_saves_and_other_lines_are_not() {
        for line in [
            "Loading checkpoint shards: 100%|██████████| 2/2 [00:01<00:00,  1.5it/s]",
            "Could not load checkpoint /ck/last.ckpt: file is truncated",
            "No checkpoint found in /ck, starting from scratch",
            "Saving checkpoint to /ck/step_40 (loaded 3 shards)",
            "FileNotFoundError: checkpoint not found",
            "step 20 loss 0.31",
            "loading dataset from /data",
            "downloading the tokenizer",
            "Checkpointing every 100 steps",
            "[transformers] There were missing keys in the checkpoint model loaded: ['lm_head.weight'].",
            "/site/lightning/pytorch/loops/training_epoch_loop.py:224: You're resuming from a checkpoint that ended before the epoch ended",
            "UserWarning: loading a checkpoint with weights_only=False",
        ] {
            assert_eq!(load(line), None, "{line}");
        }
    }

    #[test]
    fn a_load_begun_is_told_from_a_load_done() {
        for done in [
            "Restored all states from the checkpoint at /ck/x.ckpt",
            " successfully loaded checkpoint from /ck at iteration 20",
            "Finished loading the checkpoint in 1.23 seconds.",
            "resumed from checkpoint #19",
            "  Continuing training from checkpoint, will skip to saved global_step",
            "restored=40",
        ] {
            assert!(says_done(done), "{done}");
        }
        for begun in [
            "Restoring states from the checkpoint path at /ck/x.ckpt",
            " loading checkpoint from /ck at iteration 20",
            "Loading the checkpoint at step 20.",
            "demo-trainer rank 0: building model, loading data, resuming after checkpoint 10",
        ] {
            assert!(!says_done(begun), "{begun}");
        }
    }

    #[test]
    fn the_last_load_of_a_read_is_kept_whole_and_cut_at_200() {
        let text = "loading checkpoint from /ck/40\nmodel ready\nRestored all states from the checkpoint at /ck/40\nstep 41\n";
        assert_eq!(
            load(text).as_deref(),
            Some("Restored all states from the checkpoint at /ck/40")
        );
        let long = format!("loaded checkpoint {}", "x".repeat(500));
        let cut = load(&long).unwrap();
        assert_eq!(cut.chars().count(), 200);
        assert!(cut.ends_with("x…"), "{cut}");
    }
}
