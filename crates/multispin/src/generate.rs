//! `multispin generate`: text from real models by speculative decoding (a drafter plus the batched verifier), or by
//! plain decoding when no drafter is given.

use crate::failure::Failure;
use crate::number::plain;
use crate::pairing;
use crate::simulate::{Embedded, carries_own_tokenizer, load, load_tokenizer};
use anyhow::Context;
use clap::Args;
use spin_core::SamplingParams;
use spin_runtime::Tokenizer;
use spin_runtime::speculative::{self, SpecConfig, Speculator};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `multispin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub threads: crate::threads::ThreadArgs,
    /// Target model: llama2.c `.bin`, GGUF `.gguf`, or a Hugging Face folder (default: the embedded stories260K
    /// checkpoint, models/stories260K.bin).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Tokenizer (llama2.c `.bin` or `tokenizer.json`); GGUF files and HF folders carry their own (default for a
    /// llama2.c model of 512 tokens: the embedded tok512, models/tok512.bin).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Draft model (same vocabulary as the target): llama2.c `.bin`, GGUF `.gguf` or a Hugging Face folder (a
    /// draft folder written as GGUF by the spin-runtime `to_gguf` example starts in milliseconds); without it and
    /// without --self-draft-layers, plain decoding.
    #[arg(long, conflicts_with = "self_draft_layers")]
    pub draft: Option<PathBuf>,
    /// How the draft's dense matrices are held: `as-stored` (the file's f32/f16, or its quantised blocks), or
    /// `q8_0` / `q4_0` / `q4_1`: a model folder's or llama2.c file's dense matrices quantised at load into host
    /// matrices, so a draft step reads a quarter (Q8_0) of its f32 bytes; `auto`: `q8_0` for a dense draft of more
    /// than a million weights whose widths are whole blocks of 32 (a step there waits for its bytes), as stored
    /// otherwise (a small draft's f32 weights stay in cache). Speculative sampling stays exact for any draft; only
    /// how often it agrees changes.
    #[arg(long, value_enum, default_value_t = crate::draft_format::DraftFormat::Auto, requires = "draft")]
    pub draft_format: crate::draft_format::DraftFormat,
    /// Draft with the target's first N layers and its own head (self-speculation).
    #[arg(allow_hyphen_values = true, long)]
    pub self_draft_layers: Option<usize>,
    /// Draft length γ per round (default 4). This flag, --lookup, --lookup-stop and --draft-stop-below need a
    /// drafter (--draft or --self-draft-layers); without one, decoding is plain and they exit 2.
    #[arg(allow_hyphen_values = true, long, value_name = "N")]
    pub draft_len: Option<usize>,
    #[command(flatten)]
    pub lookup: crate::lookup::LookupArgs,
    /// With --lookup: a round's draft goes past its first token only while the text ends in a repeat of at least
    /// M tokens, so --draft-len becomes the longest draft and easy stretches get long ones (default: 3, or N of
    /// --lookup N when that is smaller; 0 drafts --draft-len tokens every round).
    #[arg(allow_hyphen_values = true, long, value_name = "M")]
    pub lookup_stop: Option<usize>,
    /// End a round's draft before a token whose estimated chance of acceptance is below P, in [0, 1): the
    /// chance is this run's running acceptance of a round's first token times that of a later token (given the
    /// one before it was accepted) per token after the first, so --draft-len becomes the longest draft. A drafted
    /// token pays off when its chance exceeds what a verification position costs in target steps (about 0.3 for
    /// SmolLM2-135M on two cores, docs/runtime.md); a round whose first token's chance is below P drafts nothing.
    /// 0 turns the rule off (default 0.3). The output distribution stays exact.
    #[arg(allow_hyphen_values = true, long, value_name = "P")]
    pub draft_stop_below: Option<f64>,
    /// Prompt text; at most 1 MiB, and it must fit the context. BOS is prepended as the model's file says (GGUF
    /// `tokenizer.ggml.add_bos_token`, else llama.cpp's default for the vocabulary; always for llama2.c
    /// tokenizers).
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Prompts, one per line (at most 1 MiB in all, no blank line): decoded plainly together, one pass per step over every
    /// unfinished prompt, each printed with its continuation in order once all are done (the same tokens as each
    /// prompt alone with the same flags and seed).
    #[arg(long, conflicts_with_all = ["prompt", "draft", "self_draft_layers"])]
    pub prompts: Option<PathBuf>,
    /// Render the prompt as one user message through the file's chat template (GGUF `tokenizer.chat_template`,
    /// with the generation prompt added) before tokenising it; an error when the file has no template.
    #[arg(long)]
    pub chat: bool,
    /// Print the prompt's tokens (id and text) on stderr before generating.
    #[arg(long)]
    pub verbose_prompt: bool,
    /// Tokens to generate (≥ 1). Generation stops early at the end-of-sequence token or when prompt plus output
    /// fill the model's context; the latter is reported on stderr and still exits 0.
    #[arg(allow_hyphen_values = true, long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Keep generating past the end-of-sequence token, which stays in the text like any other, so that every run
    /// makes --max-tokens tokens (or fills the context): fixed-length runs for timing, as llama.cpp's
    /// `--ignore-eos` gives (which forbids the token instead; here the model's distribution is left as it is).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature: 0 is greedy decoding, otherwise a finite number ≥ 1e-6.
    #[arg(allow_hyphen_values = true, long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Keep only the K most likely tokens when sampling (≥ 1; off by default). Applies at temperature > 0.
    #[arg(allow_hyphen_values = true, long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches P, in (0, 1] (off by default).
    #[arg(allow_hyphen_values = true, long)]
    pub top_p: Option<f64>,
    /// Drop tokens less likely than P times the most likely one (llama.cpp's rule, on the logits before the
    /// temperature), in [0, 1] (0, the default, keeps every token).
    #[arg(allow_hyphen_values = true, long, default_value_t = 0.0)]
    pub min_p: f64,
    /// Seed of every random draw.
    #[arg(allow_hyphen_values = true, long, default_value_t = 0)]
    pub seed: u64,
    /// Print timing on stderr: the whole generation (load excluded), then the prompt's pass with the first
    /// committed token(s) (time to first token) apart from the decoding after it (tokens/s), and for speculative
    /// decoding the rounds, acceptance, draft step (ms/token) and verification pass (ms/round).
    #[arg(long)]
    pub stats: bool,
}

/// The longest prompt accepted, in bytes, checked before tokenising (docs/cli.md lists the limits).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

/// The draft length without `--draft-len`.
const DEFAULT_DRAFT_LEN: usize = 4;

/// The acceptance gate without `--draft-stop-below`.
const DEFAULT_DRAFT_STOP_BELOW: f64 = 0.3;

/// What the drafting flags ask of a drafter, checked before anything loads.
struct Drafting {
    /// Draft length γ (the longest, under a gate).
    len: usize,
    /// Prompt lookup and its gate (`--lookup-stop`; 0: off).
    lookup: Option<spin_runtime::drafter::Lookup>,
    lookup_stop: usize,
    /// The acceptance gate (`--draft-stop-below`; 0: off).
    stop_below: f32,
}

/// The drafting flags checked against each other: each needs a drafter (`--draft` or `--self-draft-layers`),
/// `--lookup-stop` needs `--lookup N` and is at most N; every failure names its flag.
fn drafting(args: &GenerateArgs) -> Result<Drafting, Failure> {
    let lookup = args.lookup.lookup()?;
    if args.draft.is_none() && args.self_draft_layers.is_none() {
        let given = [
            (args.draft_len.is_some(), "--draft-len"),
            (lookup.is_some(), "--lookup"),
            (args.lookup_stop.is_some(), "--lookup-stop"),
            (args.draft_stop_below.is_some(), "--draft-stop-below"),
        ];
        if let Some((_, flag)) = given.into_iter().find(|g| g.0) {
            return Err(Failure::Input(format!(
                "{flag}: needs a drafter, --draft or --self-draft-layers (without one, decoding is plain)"
            )));
        }
    }
    let len = args.draft_len.unwrap_or(DEFAULT_DRAFT_LEN);
    if len == 0 {
        return Err(Failure::Input("--draft-len: must be at least 1".into()));
    }
    let lookup_stop = match (lookup, args.lookup_stop) {
        (None, Some(m)) if m > 0 => {
            return Err(Failure::Input("--lookup-stop: needs --lookup N".into()));
        }
        (None, _) => 0,
        (Some(l), None) => l.ngram.min(3),
        (Some(l), Some(m)) if m > l.ngram => {
            return Err(Failure::Input(format!(
                "--lookup-stop: {m} exceeds --lookup {}",
                l.ngram
            )));
        }
        (Some(_), Some(m)) => m,
    };
    // Read as f64 and checked before the gate's f32: 0.99999999 is below 1 as written but 1 in f32.
    let p = args.draft_stop_below.unwrap_or(DEFAULT_DRAFT_STOP_BELOW);
    if !(0.0..1.0).contains(&p) {
        return Err(Failure::Input(format!(
            "--draft-stop-below: {} is outside [0, 1)",
            plain(p)
        )));
    }
    let stop_below = p as f32;
    if stop_below >= 1.0 {
        return Err(Failure::Input(format!(
            "--draft-stop-below: {} is 1 in single precision, outside [0, 1)",
            plain(p)
        )));
    }
    Ok(Drafting {
        len,
        lookup,
        lookup_stop,
        stop_below,
    })
}

/// A message on one line.
fn flat(text: &str) -> String {
    text.lines().next().unwrap_or("").to_string()
}

/// Checks the numeric arguments before anything is loaded: each failure names its flag.
fn check_counts(args: &GenerateArgs) -> Result<(), Failure> {
    crate::temperature::check(args.temperature)?;
    if args.max_tokens == 0 {
        return Err(Failure::Input("--max-tokens: must be at least 1".into()));
    }
    if args.self_draft_layers == Some(0) {
        return Err(Failure::Input("--self-draft-layers: must be at least 1".into()));
    }
    if args.top_k == Some(0) {
        return Err(Failure::Input("--top-k: must be at least 1".into()));
    }
    if let Some(p) = args.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(Failure::Input(format!("--top-p: {} is outside (0, 1]", plain(p))));
    }
    if !(0.0..=1.0).contains(&args.min_p) {
        return Err(Failure::Input(format!(
            "--min-p: {} is outside [0, 1]",
            plain(args.min_p)
        )));
    }
    Ok(())
}

/// The sampling controls of the flags: greedy (top-1) at temperature 0, where the cuts change nothing.
fn sampling(args: &GenerateArgs) -> Result<SamplingParams, Failure> {
    if args.temperature == 0.0 {
        return speculative::sampling(0.0).map_err(Failure::input);
    }
    SamplingParams::new(args.temperature, args.top_k, args.top_p)
        .and_then(|p| p.with_min_p(args.min_p))
        .map_err(|e| Failure::Input(format!("sampling: {e}")))
}

/// The chat template of the file rendered for one user message, with the generation prompt, as llama.cpp and
/// Hugging Face render it (trimmed blocks, `bos_token` and `eos_token` defined, `raise_exception` an error).
pub fn render_chat(template: &str, user: &str, bos: &str, eos: &str) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| e.to_string())?;
    env.set_syntax(syntax);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_template("chat", template).map_err(|e| e.to_string())?;
    let t = env.get_template("chat").map_err(|e| e.to_string())?;
    t.render(minijinja::context! {
        messages => vec![minijinja::context! { role => "user", content => user }],
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    })
    .map_err(|e| e.to_string())
}

/// Writes the text of a growing token sequence as it grows, flushing after each commit: each call prints what
/// the decoded text gained. A suffix that ends inside a UTF-8 character (decoded as U+FFFD) waits for the next
/// tokens. Should a later decoding change text already printed (a tokenizer that joins pieces across a commit),
/// printing goes on after as many bytes as were printed.
struct Stream<W: std::io::Write> {
    out: W,
    /// What the printed bytes stand for in the decoded text.
    printed: String,
}

impl<W: std::io::Write> Stream<W> {
    fn new(out: W) -> Self {
        Stream {
            out,
            printed: String::new(),
        }
    }

    /// Prints what `text` (the whole decoded sequence so far) adds to what was printed; holds back an unfinished
    /// character unless `last`.
    fn show(&mut self, text: &str, last: bool) -> std::io::Result<()> {
        let from = if text.starts_with(self.printed.as_str()) {
            self.printed.len()
        } else {
            let mut at = self.printed.len().min(text.len());
            while !text.is_char_boundary(at) {
                at += 1;
            }
            at
        };
        let mut new = &text[from..];
        if !last {
            new = new.trim_end_matches('\u{FFFD}');
        }
        if new.is_empty() {
            return Ok(());
        }
        self.out.write_all(new.as_bytes())?;
        self.out.flush()?;
        self.printed = format!("{}{new}", &text[..from]);
        Ok(())
    }
}

/// The text of a growing token sequence, decoding only its end: the text of `tokens[..settled]` is kept, and each
/// call decodes the tokens from one before `settled` to the end and drops what that first token alone decodes to
/// (so a tokenizer that treats the start of a text specially sees the same start in both). Streaming a long
/// generation so costs a window per token, not the whole sequence. Where the window's text does not extend the
/// first token's (a character split across the boundary), the whole sequence is decoded instead.
#[derive(Default)]
struct Detok {
    settled: usize,
    text: String,
}

/// Tokens decoded again on every call before the window moves on.
const DETOK_WINDOW: usize = 16;

impl Detok {
    fn text<E>(&mut self, all: &[u32], decode: impl Fn(&[u32]) -> Result<String, E>) -> Result<String, E> {
        if all.len() < self.settled {
            *self = Detok::default();
        }
        let text = match self.settled.checked_sub(1) {
            None => decode(all)?,
            Some(a) => {
                let head = decode(&all[a..self.settled])?;
                let window = decode(&all[a..])?;
                match window.strip_prefix(head.as_str()) {
                    Some(tail) if !head.ends_with('\u{FFFD}') => format!("{}{tail}", self.text),
                    _ => decode(all)?,
                }
            }
        };
        if all.len() >= self.settled + DETOK_WINDOW && !text.ends_with('\u{FFFD}') {
            self.settled = all.len();
            self.text.clone_from(&text);
        }
        Ok(text)
    }
}

/// The tokens of one prompt under the flags: through the chat template with `--chat`, BOS as the file says (not
/// twice when a rendered template starts with it), refused when it cannot fit `context`; `what` names the prompt in
/// messages (`--prompt`, or `--prompts FILE line N`).
fn encode_prompt(
    args: &GenerateArgs,
    tok: &Tokenizer,
    prompt: &str,
    context: usize,
    what: &str,
) -> Result<Vec<u32>, Failure> {
    let text = if args.chat {
        let Some(template) = tok.chat_template() else {
            return Err(Failure::Input(
                "--chat: the model file has no chat template (tokenizer.chat_template)".into(),
            ));
        };
        let name = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default();
        render_chat(template, prompt, &name(tok.bos()), &name(tok.eos())).map_err(|e| {
            Failure::Input(format!(
                "--chat: the chat template cannot be rendered: {}",
                flat(&e)
            ))
        })?
    } else {
        prompt.to_string()
    };
    let bos_text = tok.bos().and_then(|i| tok.token_text(i));
    let add_bos = tok.add_bos() && !(args.chat && bos_text.is_some_and(|b| text.starts_with(&b)));
    // Refuse a prompt that cannot fit before tokenising it (tokenising is linear-time but not free).
    let lower = tok.min_tokens(&text, add_bos);
    if prompt.len() > MAX_PROMPT_BYTES || lower > context {
        return Err(Failure::Input(format!(
            "{what}: {} bytes need at least {lower} tokens, more than the context of {context} tokens \
             (and the prompt limit is {MAX_PROMPT_BYTES} bytes)",
            prompt.len()
        )));
    }
    let mut ids = tok.encode(&text, add_bos).map_err(Failure::input)?;
    if ids.is_empty() {
        ids = vec![0];
    }
    if ids.len() > context {
        return Err(Failure::Input(format!(
            "{what}: {} tokens do not fit the context of {context} tokens",
            ids.len()
        )));
    }
    if args.verbose_prompt {
        eprintln!(
            "prompt: {} tokens (BOS {})",
            ids.len(),
            if add_bos { "added" } else { "not added" }
        );
        for &id in &ids {
            eprintln!("{id:>8} -> {:?}", tok.token_text(id).unwrap_or_default());
        }
    }
    Ok(ids)
}

/// The token that ends a generation: the tokenizer's end-of-sequence token, none with `--ignore-eos`.
fn eos(args: &GenerateArgs, tok: &Tokenizer) -> Option<u32> {
    if args.ignore_eos { None } else { tok.eos() }
}

/// `generate --prompts FILE`: every line (`lines`, read from `file`) decoded plainly in one batch, each printed
/// (prompt text, unless `--chat`, then its continuation) on its own line, in order.
fn run_batch(
    args: &GenerateArgs,
    file: &std::path::Path,
    lines: &[String],
    target: &spin_runtime::Model,
    tok: &Tokenizer,
    params: &SamplingParams,
) -> Result<(), Failure> {
    let context = target.config().max_seq_len;
    let prompts: Vec<Vec<u32>> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| encode_prompt(args, tok, l, context, &crate::prompt_file::line_label(file, i)))
        .collect::<Result<_, _>>()?;
    // Every sequence stops at the context: the longest prompt's room bounds them all.
    let room = prompts.iter().map(|p| context - p.len()).min().unwrap_or(0);
    let max_tokens = args.max_tokens.min(room);
    let sampled = (args.temperature != 0.0).then_some(params);
    let start = Instant::now();
    let outs =
        spin_runtime::decode::plain_batch(target, &prompts, sampled, max_tokens, eos(args, tok), args.seed)
            .context("batched decoding")?;
    let elapsed = start.elapsed().as_secs_f64();
    let mut stdout = std::io::stdout().lock();
    for (p, g) in prompts.iter().zip(&outs) {
        let mut all = if args.chat { Vec::new() } else { p.clone() };
        all.extend_from_slice(g);
        let line = tok.decode(&all).map_err(Failure::input)?;
        writeln!(stdout, "{line}").context("writing the text to stdout")?;
    }
    stdout.flush().context("writing the text to stdout")?;
    if max_tokens < args.max_tokens {
        eprintln!(
            "note: --max-tokens capped at {max_tokens}: the longest prompt leaves that much of the context of \
             {context} tokens"
        );
    }
    if args.stats {
        let n: usize = outs.iter().map(Vec::len).sum();
        eprintln!(
            "generated {n} tokens for {} prompts in {elapsed:.3} s ({:.1} tokens/s)",
            outs.len(),
            n as f64 / elapsed.max(1e-9)
        );
    }
    Ok(())
}

/// Runs `multispin generate`: the prompt's text, then each token's text as it is committed (flushed per commit:
/// per token when decoding plainly, per round of the speculative loop).
pub fn run(args: &GenerateArgs) -> Result<(), Failure> {
    // SAFETY: `run` is called only by `main`, after argument parsing and before any thread is started.
    #[allow(unsafe_code)]
    unsafe {
        args.threads.set_up()?;
    }
    check_counts(args)?;
    let drafting = drafting(args)?;
    let batch = args
        .prompts
        .as_deref()
        .map(crate::prompt_file::read)
        .transpose()?;
    let params = sampling(args)?;
    // The target, its tokenizer and the draft load side by side where they do not depend on each other: a
    // tokenizer that a GGUF file or model folder carries is read without the model's vocabulary (only a llama2.c
    // tokenizer file needs it), and the draft needs nothing of the target. On a SmolLM2 start-up the tokenizer
    // alone takes about a fifth. Failures are reported in the order of the sequential load: target first.
    let own_tokenizer = args.tokenizer.is_none() && carries_own_tokenizer(args.target.as_deref());
    let load_draft = || -> Result<Option<spin_runtime::Model>, Failure> {
        let Some(p) = &args.draft else {
            return Ok(None);
        };
        let d = load(Some(p), Embedded::Draft)?;
        Ok(Some(match args.draft_format.for_draft(&d) {
            None => d,
            Some(f) => d
                .quantize_host(f)
                .map_err(|e| Failure::Input(format!("--draft-format: {}", flat(&e.to_string()))))?,
        }))
    };
    let (target, early_tok, loaded_draft) = std::thread::scope(|s| {
        let side = s.spawn(|| {
            let tok = own_tokenizer.then(|| load_tokenizer(None, args.target.as_deref(), 0));
            (tok, load_draft())
        });
        let target = load(args.target.as_deref(), Embedded::Target);
        let (tok, draft) = side.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        (target, tok, draft)
    });
    let target = target?;
    let tok = match early_tok {
        Some(tok) => tok?,
        None => load_tokenizer(
            args.tokenizer.as_deref(),
            args.target.as_deref(),
            target.config().vocab_size,
        )?,
    };
    // The tokenizer was read without the model's vocabulary: whether they fit is checked now that both are here.
    pairing::check_tokenizer(
        &tok,
        args.tokenizer.as_deref(),
        &target,
        "--target",
        args.target.as_deref(),
    )?;
    let drafter = match (loaded_draft?, args.self_draft_layers) {
        (Some(d), _) => Some(d),
        (None, Some(n)) => Some(
            target
                .first_layers(n)
                .map_err(|e| Failure::Input(format!("--self-draft-layers: {}", flat(&e.to_string()))))?,
        ),
        (None, None) => None,
    };
    // Speculating needs one vocabulary; refused here, before anything is printed.
    if let Some(d) = &drafter {
        pairing::check_draft(d, &target, "--draft")?;
    }
    // The context: every token of the sequence (prompt and generated) must fit both models.
    let context = drafter.as_ref().map_or(target.config().max_seq_len, |d| {
        d.config().max_seq_len.min(target.config().max_seq_len)
    });
    if let (Some(file), Some(lines)) = (&args.prompts, &batch) {
        return run_batch(args, file, lines, &target, &tok, &params);
    }
    let prompt = encode_prompt(args, &tok, &args.prompt, context, "--prompt")?;
    // Past the context the models cannot run: generate what fits, print it, say why on stderr and exit 0 (as
    // llama.cpp does). A speculative round drafts at most `remaining − 1` tokens and adds one (the bonus or
    // resampled token), so a round never feeds more than prompt + max_tokens − 1 positions: capping max_tokens
    // at the room left keeps both modes inside the context.
    let room = context - prompt.len();
    let max_tokens = args.max_tokens.min(room);
    // The prompt's own text first (not a rendered chat template's), then the generated text as it comes.
    let mut stream = Stream::new(std::io::stdout().lock());
    let shown: &[u32] = if args.chat { &[] } else { &prompt };
    let mut all = shown.to_vec();
    let write_err = std::cell::RefCell::new(None);
    let mut detok = Detok::default();
    // When the first generated tokens were committed, and how many: the prompt's pass and the first step (or
    // round) lie before it, decoding after it (`--stats`).
    let mut first_commit: Option<(Instant, usize)> = None;
    let mut commit = |generated: &[u32]| -> bool {
        if first_commit.is_none() && !generated.is_empty() {
            first_commit = Some((Instant::now(), generated.len()));
        }
        all.truncate(shown.len());
        all.extend_from_slice(generated);
        let shown_text = detok.text(&all, |t| tok.decode(t)).unwrap_or_default();
        match stream.show(&shown_text, false) {
            Ok(()) => true,
            Err(e) => {
                *write_err.borrow_mut() = Some(e);
                false
            }
        }
    };
    commit(&[]);
    let start = Instant::now();
    let (generated, stats) = match &drafter {
        // Greedy: the same tokens as the sampling path at temperature 0, without a distribution per token.
        None if args.temperature == 0.0 => (
            spin_runtime::decode::greedy_with(&target, &prompt, max_tokens, eos(args, &tok), &mut commit)
                .context("greedy decoding")?,
            None,
        ),
        None => {
            let out = speculative::generate_plain_with(
                &target,
                &prompt,
                &params,
                max_tokens,
                eos(args, &tok),
                args.seed,
                &mut commit,
            )
            .context("plain decoding")?;
            (out, None)
        }
        Some(d) => {
            let cfg = SpecConfig {
                params,
                max_new_tokens: max_tokens,
                eos: eos(args, &tok),
                seed: args.seed,
            };
            let mut s = Speculator::new(&target, d, std::slice::from_ref(&prompt), &[drafting.len], cfg)
                .map_err(Failure::input)?;
            let lookup = drafting.lookup;
            s.set_lookup(lookup, drafting.lookup_stop)
                .map_err(Failure::input)?;
            s.set_stop_below(drafting.stop_below).map_err(Failure::input)?;
            while s.step().context("speculative decoding")? {
                if !commit(s.devices[0].generated()) {
                    break;
                }
            }
            let dev = &s.devices[0];
            let verify_s: f64 = s.rounds.iter().map(|r| r.verify_s).sum();
            let alpha = dev.alpha.ratio_estimate(1.96).ok().flatten();
            let looked_up = if lookup.is_some() {
                format!(" (looked up {})", s.looked_up()[0])
            } else {
                String::new()
            };
            let line = format!(
                "rounds {} | drafted {}{looked_up} | acceptance {} | draft {:.3} ms/token | verify {:.3} ms/round",
                dev.rounds,
                dev.drafted,
                alpha.map_or("n/a".into(), |a| format!(
                    "{:.4} ± {:.4}",
                    a.value,
                    a.high - a.value
                )),
                1e3 * dev.draft_time.as_secs_f64() / dev.drafted.max(1) as f64,
                1e3 * verify_s / s.rounds.len().max(1) as f64,
            );
            (dev.generated().to_vec(), Some(line))
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(e) = write_err.into_inner() {
        return Err(Failure::Runtime(
            anyhow::Error::new(e).context("writing the text to stdout"),
        ));
    }
    let mut all = shown.to_vec();
    all.extend_from_slice(&generated);
    let text = tok.decode(&all).map_err(Failure::input)?;
    stream
        .show(&format!("{text}\n"), true)
        .context("writing the text to stdout")?;
    if max_tokens < args.max_tokens
        && generated.len() == max_tokens
        && (args.ignore_eos || tok.eos() != generated.last().copied())
    {
        eprintln!(
            "note: stopped at the context limit: {} prompt + {} generated = {context} tokens (--max-tokens asked \
             for {})",
            prompt.len(),
            generated.len(),
            args.max_tokens
        );
    }
    if args.stats {
        eprintln!(
            "generated {} tokens in {:.3} s ({:.1} tokens/s)",
            generated.len(),
            elapsed,
            generated.len() as f64 / elapsed.max(1e-9)
        );
        if let Some((at, n)) = first_commit {
            let first = at.duration_since(start).as_secs_f64();
            let rest = generated.len().saturating_sub(n);
            let after = (elapsed - first).max(1e-9);
            eprintln!(
                "prompt of {} tokens and first {n} token(s) in {first:.3} s; then {rest} tokens in {after:.3} s \
                 ({:.1} tokens/s)",
                prompt.len(),
                rest as f64 / after
            );
        }
        if let Some(line) = stats {
            eprintln!("{line}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that records what each flush has seen.
    #[derive(Default)]
    struct Flushes {
        buf: Vec<u8>,
        at_flush: Vec<String>,
    }

    impl std::io::Write for Flushes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.buf.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.at_flush
                .push(String::from_utf8_lossy(&self.buf).into_owned());
            Ok(())
        }
    }

    /// Each commit's new text is written and flushed at once; an unfinished character waits; the end prints the
    /// rest; a rewritten earlier text does not repeat what was printed.
    #[test]
    fn stream_prints_and_flushes_each_commit() {
        let mut s = Stream::new(Flushes::default());
        s.show("Once", false).unwrap();
        s.show("Once upon", false).unwrap();
        s.show("Once upon", false).unwrap(); // nothing new: no write, no flush
        s.show("Once upon a \u{FFFD}", false).unwrap(); // half of a character: held back
        s.show("Once upon a é", false).unwrap();
        s.show("Once upon a é.\n", true).unwrap();
        assert_eq!(
            s.out.at_flush,
            [
                "Once",
                "Once upon",
                "Once upon a ",
                "Once upon a é",
                "Once upon a é.\n"
            ]
        );
        let mut s = Stream::new(Flushes::default());
        s.show("ab", false).unwrap();
        s.show("xbc", false).unwrap();
        assert_eq!(String::from_utf8(s.out.buf).unwrap(), "abc");
    }

    /// The windowed text equals the whole sequence's text after every token: on the stories260K tokenizer (whose
    /// decoding drops a leading space at the start) and on a byte-level one whose characters span tokens.
    #[test]
    fn windowed_decoding_equals_decoding_everything() {
        use rand::{RngExt, SeedableRng};
        let sp = spin_runtime::embedded::tokenizer().unwrap();
        let bytes = |t: &[u32]| -> Result<String, ()> {
            let b: Vec<u8> = t.iter().map(|&v| v as u8).collect();
            Ok(String::from_utf8_lossy(&b).into_owned())
        };
        let utf8: Vec<u32> = "Once upon a time, é ünïcödé → ∑ 🦀 and more text to pass the window twice over"
            .bytes()
            .map(u32::from)
            .collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let random: Vec<u32> = (0..200).map(|_| rng.random_range(3..512)).collect();
        for seq in [&utf8, &random] {
            let (mut a, mut b) = (Detok::default(), Detok::default());
            for k in 0..=seq.len() {
                let s = &seq[..k];
                assert_eq!(a.text(s, bytes).unwrap(), bytes(s).unwrap(), "bytes, {k} tokens");
                if seq == &random {
                    assert_eq!(
                        b.text(s, |t| Ok::<_, ()>(sp.decode(t))).unwrap(),
                        sp.decode(s),
                        "{k} tokens"
                    );
                }
            }
        }
    }

    /// The chat template gets the user message, the generation prompt and BOS/EOS; Python-style methods work
    /// (pycompat); `raise_exception` is an error, as is a broken template.
    #[test]
    fn chat_templates_render_like_hugging_face() {
        let t = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}\
                 <|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let out = render_chat(t, "  Hi!  ", "<s>", "</s>").unwrap();
        assert_eq!(out, "<s><|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
        let e = render_chat("{{ raise_exception('no system role') }}", "x", "", "").unwrap_err();
        assert!(e.contains("no system role"), "{e}");
        assert!(render_chat("{% for %}", "x", "", "").is_err());
    }
}
