//! Numbers the step pattern matches that name no step done: a file name
//! or a format spec, Slurm's or resilio's own messages, a line resuming
//! from a checkpoint, an error's lines.

/// Whether the number at `at` is part of a file name (`epoch=3-step=200.ckpt`,
/// `global_step200.pt`): digits followed by `.` and a letter. A path a
/// trainer prints (resuming from a checkpoint) is no step. Nor is a format
/// spec (`{step:05d}`, `{step:>6}`: a traceback quoting the trainer's code).
pub(super) fn in_a_name(text: &[u8], at: usize) -> bool {
    let end = at + text[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let file =
        text.get(end) == Some(&b'.') && text.get(end + 1).is_some_and(u8::is_ascii_alphabetic);
    // `{name:` right before the digits, a `}` (after a type letter) after.
    let opened = at >= 2 && text[at - 1] == b':' && {
        let name = text[..at - 1]
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        name > 0 && at - 1 > name && text[at - 2 - name] == b'{'
    };
    let closed = match text.get(end) {
        Some(b'}') => true,
        Some(b'd' | b'f' | b'x' | b's' | b'e' | b'g') => text.get(end + 1) == Some(&b'}'),
        _ => false,
    };
    file || (opened && closed)
}

/// Whether the text of a line before a number is Slurm's own message
/// (`srun: launch/slurm: _step_signal: Terminating StepId=15.0`,
/// `slurmstepd: error: ...`) or a rank agent's (`resilio: rank 1 on n2
/// stalled: no progress since step 12`, `0: resilio: ...` under srun's
/// labels), at the line's start or glued after a progress bar's frame that
/// had no line end: its numbers are job and step ids, or a step reached
/// earlier, never a training step done now.
pub(super) fn not_the_trainers(before: &[u8]) -> bool {
    before.starts_with(b"srun: ")
        || before.starts_with(b"slurmstepd")
        || before.windows(6).any(|w| w == b"srun: ")
        || before.windows(11).any(|w| w == b"slurmstepd:")
        || before.windows(9).any(|w| w == b"resilio: ")
}

/// Whether the words before a step number say the trainer resumes from it
/// (the HF Trainer's `Resuming training from checkpoint with epoch 0 and
/// global step 20`, `Continuing training from global step 20`, a
/// `restored ... step 20`): the restored checkpoint's step, not one
/// trained (trial 18: read as the attempt's first step, it made the
/// checkpoint before the restored one look restored, and blamed).
pub(super) fn names_a_restore(before: &[u8]) -> bool {
    const WORDS: [&[u8]; 4] = [b"resum", b"restor", b"continuing training", b"skip to"];
    let b = &before[before.len().saturating_sub(160)..];
    WORDS
        .iter()
        .any(|word| b.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word)))
}

/// Whether a line is an error's, not progress: a traceback's lines
/// (`Traceback (most recent call last):`, `  File "train.py", line 9`) or
/// an exception's message (`RuntimeError: data pipeline failed at step
/// 120`, `torch.distributed.DistBackendError: ...`, `UserWarning: ...`),
/// after torchrun's `[rank1]: ` prefix. The step such a line names is where
/// something went wrong, never a step done.
pub(super) fn an_error_line(line: &[u8]) -> bool {
    let mut l = line;
    if l.starts_with(b"[rank") {
        if let Some(p) = l.iter().position(|&b| b == b']') {
            l = l[p + 1..].strip_prefix(b":").unwrap_or(&l[p + 1..]);
        }
    }
    let l = l.trim_ascii_start();
    if l.starts_with(b"Traceback (") || l.starts_with(b"File \"") {
        return true;
    }
    let name = l
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_' || **b == b'.')
        .count();
    let id = &l[..name];
    l.get(name) == Some(&b':')
        && [&b"Error"[..], b"Exception", b"Warning", b"Interrupt"]
            .iter()
            .any(|s| id.ends_with(s))
}
