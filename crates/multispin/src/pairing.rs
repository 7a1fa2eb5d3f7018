//! Where a command's models and tokenizer meet: each file loads on its own (in `generate`, the tokenizer beside the
//! model, without its vocabulary), so whether they fit each other is checked here, once all are loaded and before
//! any output: a target that can verify (no restricted draft head), a tokenizer whose every id the model accepts,
//! a draft over the target's vocabulary. Every refusal is an input error naming the flag and both sizes.

use crate::failure::Failure;
use spin_runtime::{Model, Tokenizer};
use std::path::Path;

/// How `path` (the file behind `flag`, `None` for the embedded model) is named in a message.
fn named(flag: &str, path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("{flag} {}", p.display()),
        None => format!("{flag} (the embedded model)"),
    }
}

/// Refuses a model with a restricted draft head as the target: its logits are over V_d + 1 compact ids, not over
/// the vocabulary its input tokens are in (it fails at the first prompt token past V_d, or decodes compact ids as
/// tokens). It drafts for a target of the full vocabulary instead.
pub fn check_target(model: &Model, path: Option<&Path>) -> Result<(), Failure> {
    match model.head_vocab() {
        None => Ok(()),
        Some(h) => Err(Failure::Input(format!(
            "--target: {} is a draft with a restricted output head (it scores {} of the {} tokens, \
             multispin.head_vocab / multispin_target_vocab_size): it cannot be the target; pass it as --draft \
             beside a target of that vocabulary",
            path.map_or_else(|| "the model".into(), |p| p.display().to_string()),
            h.ids().len(),
            h.full_vocab()
        ))),
    }
}

/// Refuses a tokenizer with ids the model does not have: every id it produces or names (its tokens, BOS and EOS,
/// `Tokenizer::id_space`) must lie inside the model's vocabulary (`Model::output_vocab`: a restricted draft
/// head's is the target's, not its head's rows). `tokenizer` is the `--tokenizer` file, if one was given (else the
/// tokenizer came with the model at `path`, named by `flag`).
pub fn check_tokenizer(
    tok: &Tokenizer,
    tokenizer: Option<&Path>,
    model: &Model,
    flag: &str,
    path: Option<&Path>,
) -> Result<(), Failure> {
    let (ids, vocab) = (tok.id_space(), model.output_vocab());
    if ids <= vocab {
        return Ok(());
    }
    Err(Failure::Input(match tokenizer {
        Some(t) => format!(
            "--tokenizer: {} has {ids} token ids (0 to {}) but the vocabulary of {} has {vocab} \
             (a tokenizer of another model?)",
            t.display(),
            ids - 1,
            named(flag, path)
        ),
        None => format!(
            "{}: the tokenizer it carries has {ids} token ids (0 to {}) but its vocabulary has {vocab}",
            named(flag, path),
            ids - 1
        ),
    }))
}

/// Refuses a draft over another vocabulary than the target's: speculation needs one id space (`flag` names the
/// draft's flag).
pub fn check_draft(draft: &Model, target: &Model, flag: &str) -> Result<(), Failure> {
    if draft.output_vocab() == target.output_vocab() {
        return Ok(());
    }
    Err(Failure::Input(format!(
        "{flag}: vocabulary of {} differs from the target's {}",
        draft.output_vocab(),
        target.output_vocab()
    )))
}
