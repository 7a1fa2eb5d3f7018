//! The distill example's route for a real target (GGUF file or model folder): cache the target's top-k
//! distributions once over held-in TinyStories text and its own answers to instructions, choose the restricted
//! head's tokens from them, train the student on the cache alone, save a model folder.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_runtime::head_vocab::{HeadVocab, most_frequent};
use spin_runtime::speculative::{generate_plain_batch, sampling};
use spin_runtime::train::{
    HeadStudent, TopKCache, cache_top_k, continue_and_cache, cosine_learning_rate, layer_tensor_names,
    student_from_layers,
};
use spin_runtime::{Config, RopeStyle, Tokenizer};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The options of this route.
pub struct Opts {
    pub head: usize,
    pub top_k: usize,
    pub story_seqs: usize,
    pub steps: usize,
    pub batch: usize,
    pub seq_len: usize,
    pub dim: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub lr: f64,
    /// Whether the learning rate follows [`cosine_learning_rate`] (warm-up, then a cosine to a tenth) rather
    /// than staying at `lr`.
    pub cosine: bool,
    /// Weight of the cross-entropy at the target's top head token added to the KL (0: the KL alone).
    pub argmax_weight: f64,
    pub seed: u64,
    /// Training stops after this many minutes (0: no limit); the steps done are printed, and `--steps` with that
    /// number gives the same draft.
    pub minutes: f64,
    /// The target's layers the student starts from (its width, heads and norms with them; `dim` … `kv_heads` are
    /// then unused); empty: a random student of the shape above.
    pub init_layers: Vec<usize>,
    /// The first `freeze_layers` of `init_layers`, and the embedding and head, stay the target's (no gradient);
    /// 0: every tensor trains.
    pub freeze_layers: usize,
    /// Held-in story openings (a paragraph's first 12 words) the target continues greedily to `seq_len` tokens:
    /// text like what the draft proposes for when the target decodes greedily from a story opening.
    pub openings: usize,
    /// Instructions whose answers by the target are training text: the 48 written out below first, then
    /// templated ones (`instructions`), at most 48 + 8 × 40.
    pub instructions: usize,
    /// Instructions the target writes itself (sampled at temperature 0.7 from a few requests for one, see
    /// [`self_instructions`]), answered like the others: questions in the target's own words, more varied than
    /// the templated ones.
    pub self_instructions: usize,
    /// A file holding the target's top-k distributions over the training text: read when it exists (it must
    /// have been built from the same target and text options), else built and written there. Training options
    /// (steps, batch, learning rate, layers) can then change without running the target again.
    pub cache_file: Option<PathBuf>,
}

/// The first bytes of TinyStories validation, never trained on (the evaluation prompts come from them).
pub const HELD_OUT_BYTES: usize = 65_536;

/// Instructions whose answers by the target are training text (the evaluation's instruction prompts are others,
/// listed in scripts/bench-speculative-smollm2.sh).
const INSTRUCTIONS: [&str; 48] = [
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a short poem about the sea.",
    "Give me three tips for better sleep.",
    "How do I boil an egg?",
    "What is a prime number?",
    "Summarise the plot of Cinderella.",
    "Why is the sky blue?",
    "List five fruits that are red.",
    "What does a computer's CPU do?",
    "Write a haiku about autumn leaves.",
    "How many legs does a spider have?",
    "Explain what gravity is to a child.",
    "What are the primary colours?",
    "Describe a cat in two sentences.",
    "How can I save money on groceries?",
    "What is the difference between weather and climate?",
    "Tell me a fun fact about octopuses.",
    "Write a thank-you note to a teacher.",
    "What is the boiling point of water?",
    "Explain how a rainbow forms.",
    "Give me a recipe for pancakes.",
    "What is the largest planet in our solar system?",
    "Why do we need to drink water?",
    "Write a short story about a brave mouse.",
    "How does a bicycle work?",
    "What is the meaning of the word 'kind'?",
    "Name three musical instruments.",
    "How do bees make honey?",
    "What should I pack for a beach trip?",
    "Explain what a noun is.",
    "Write a limerick about a dog.",
    "What causes the seasons on Earth?",
    "How do I make a paper airplane?",
    "What is the tallest animal?",
    "Give two reasons to read books.",
    "Describe the water cycle.",
    "What is an ecosystem?",
    "How can I be a good friend?",
    "What is the sun made of?",
    "Write a sentence using the word 'gigantic'.",
    "Why do leaves change colour in autumn?",
    "What is the opposite of 'ancient'?",
    "How do fish breathe under water?",
    "Explain what a volcano is.",
    "Give me a tip for learning a new language.",
    "What do plants need to grow?",
    "Write a birthday message for my grandmother.",
];

/// The file's chat template rendered for one user message with the generation prompt (as `multispin generate
/// --chat` renders it), then encoded (BOS as the file says).
fn chat_prompt(tok: &Tokenizer, template: &str, user: &str) -> Result<Vec<u32>, String> {
    let name = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default();
    let (bos, eos) = (name(tok.bos()), name(tok.eos()));
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| e.to_string())?;
    env.set_syntax(syntax);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_template("chat", template).map_err(|e| e.to_string())?;
    let t = env.get_template("chat").map_err(|e| e.to_string())?;
    let text = t
        .render(minijinja::context! {
            messages => vec![minijinja::context! { role => "user", content => user }],
            add_generation_prompt => true,
            bos_token => bos,
            eos_token => eos,
        })
        .map_err(|e| e.to_string())?;
    tok.encode(&text, tok.add_bos()).map_err(|e| e.to_string())
}

/// A progress line at most every 5 s (and always when `last`).
struct Progress {
    start: Instant,
    last: f64,
}

impl Progress {
    fn line(&mut self, last: bool, text: impl FnOnce() -> String) {
        let t = self.start.elapsed().as_secs_f64();
        if last || t - self.last >= 5.0 {
            self.last = t;
            println!("{t:7.1} s  {}", text());
        }
    }
}

/// The held-in TinyStories validation text: everything after the first [`HELD_OUT_BYTES`] (from the next line).
/// Templates and subjects of the instructions after the first 48: none of the evaluation's ten instructions
/// (scripts/bench-speculative-smollm2.sh) is among them, and no subject of theirs.
const TEMPLATES: [&str; 8] = [
    "Explain {} in simple terms.",
    "Write a short story about {}.",
    "What is {}?",
    "Describe {} in a few sentences.",
    "Give me three facts about {}.",
    "Why is {} important?",
    "Write a short poem about {}.",
    "How would you explain {} to a child?",
];
const SUBJECTS: [&str; 40] = [
    "the moon",
    "a lighthouse",
    "friendship",
    "a thunderstorm",
    "the ocean tides",
    "a library",
    "electricity",
    "a honeybee",
    "the desert",
    "a steam train",
    "recycling",
    "the human brain",
    "a snowflake",
    "a farmer's day",
    "the internet",
    "a dragon",
    "the Roman Empire",
    "a vegetable garden",
    "the stars",
    "a penguin",
    "music",
    "a rainforest",
    "kindness",
    "a bridge",
    "the wind",
    "a birthday party",
    "a museum",
    "the alphabet",
    "a camping trip",
    "clouds",
    "a small village",
    "dinosaurs",
    "a clock",
    "the Arctic",
    "a market",
    "teamwork",
    "a river",
    "the post office",
    "an elephant",
    "a spaceship",
];

/// The first `n` training instructions: the written-out ones, then each template with each subject in turn.
fn instructions(n: usize) -> Vec<String> {
    let templated = SUBJECTS
        .iter()
        .flat_map(|s| TEMPLATES.iter().map(move |t| t.replace("{}", s)));
    INSTRUCTIONS
        .iter()
        .map(|q| (*q).to_owned())
        .chain(templated)
        .take(n)
        .collect()
}

fn held_in_stories() -> Result<String, String> {
    let data = std::env::var("MULTISPIN_SHARED_DATA")
        .map_err(|_| "MULTISPIN_SHARED_DATA: not set (the folder holding corpora/tinystories_val.txt)")?;
    let path = Path::new(&data).join("corpora/tinystories_val.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cut = text[HELD_OUT_BYTES.min(text.len())..]
        .find('\n')
        .map_or(text.len(), |i| HELD_OUT_BYTES + i + 1);
    Ok(text[cut..].to_string())
}

/// `n` story openings of 12 words from the held-in paragraphs longer than 200 characters: first every
/// paragraph's first 12 words (the evaluation's story prompts are made the same way from the held-out bytes), then,
/// while more are asked for, the 12 words from each paragraph's second sentence on, then its third, and so on.
fn story_openings(n: usize) -> Result<Vec<String>, String> {
    let stories = held_in_stories()?;
    let paragraphs: Vec<Vec<&str>> = stories
        .lines()
        .map(str::trim)
        .filter(|p| p.len() > 200)
        .map(|p| p.split_whitespace().collect())
        .collect();
    // Word indices where sentence s (0 = the first) starts, per paragraph.
    let starts: Vec<Vec<usize>> = paragraphs
        .iter()
        .map(|w| {
            std::iter::once(0)
                .chain((1..w.len()).filter(|&i| w[i - 1].ends_with(['.', '!', '?'])))
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    let deepest = starts.iter().map(Vec::len).max().unwrap_or(0);
    for sentence in 0..deepest {
        for (w, st) in paragraphs.iter().zip(&starts) {
            if out.len() == n {
                return Ok(out);
            }
            // An opening needs its 12 words and some story after them.
            if let Some(&at) = st.get(sentence)
                && at + 16 <= w.len()
            {
                out.push(w[at..at + 12].join(" "));
            }
        }
    }
    Ok(out)
}

/// Training sequences of `seq_len` tokens: consecutive windows of the held-in TinyStories text.
fn story_windows(tok: &Tokenizer, seq_len: usize, n: usize) -> Result<Vec<Vec<u32>>, String> {
    let text = held_in_stories()?;
    let mut ids = Vec::new();
    for line in text.split_inclusive('\n') {
        ids.extend(tok.encode(line, false).map_err(|e| e.to_string())?);
        if ids.len() >= n * seq_len {
            break;
        }
    }
    Ok(ids.chunks_exact(seq_len).take(n).map(<[u32]>::to_vec).collect())
}

/// Requests for an instruction, taken in turn by [`self_instructions`].
const ASK_FOR_ONE: [&str; 4] = [
    "Write one question that someone might ask a helpful assistant. Reply with the question only.",
    "Write one short task a user could give an AI assistant. Reply with the task only.",
    "Give one example of a question a curious student might ask. Reply with the question only.",
    "Write one request for advice that someone might send to an assistant. Reply with the request only.",
];

/// `n` requests for an instruction (the chat template around [`ASK_FOR_ONE`] in turn), each sampled by the
/// target at temperature 0.7 for up to 40 tokens with its own seed, 64 at a time; of each answer the first line,
/// without quotes, kept when it is 12 to 200 bytes long and not already kept. Deterministic from `seed`.
fn self_instructions(
    target: &spin_runtime::Model,
    tok: &Tokenizer,
    template: &str,
    n: usize,
    seed: u64,
) -> Result<Vec<String>, String> {
    let prompts = (0..n)
        .map(|i| chat_prompt(tok, template, ASK_FOR_ONE[i % ASK_FOR_ONE.len()]))
        .collect::<Result<Vec<_>, _>>()?;
    let params = sampling(0.7).map_err(|e| e.to_string())?;
    let mut out: Vec<String> = Vec::new();
    for (c, chunk) in prompts.chunks(64).enumerate() {
        let seeds: Vec<u64> = (0..chunk.len())
            .map(|j| seed.wrapping_mul(104_729).wrapping_add((64 * c + j) as u64))
            .collect();
        let written = generate_plain_batch(target, chunk, &params, 40, &seeds).map_err(|e| e.to_string())?;
        for ids in written {
            let end = ids
                .iter()
                .position(|&t| Some(t) == tok.eos())
                .unwrap_or(ids.len());
            let text = tok.decode(&ids[..end]).map_err(|e| e.to_string())?;
            let line = text
                .trim()
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"')
                .trim();
            if (12..=200).contains(&line.len()) && !out.iter().any(|q| q == line) {
                out.push(line.to_owned());
            }
        }
    }
    Ok(out)
}

/// Steps 1 and 2: the training text and the target's top-k distributions over it. Held-in story windows are
/// scored in passes of four; the target's own answers to instructions (greedy, then two sampled at temperature
/// 0.8) and its greedy continuations of held-in story openings are scored by the passes that write them
/// ([`continue_and_cache`]), `seq_len` tokens each, 64 sequences at a time.
fn build_cache(
    target: &spin_runtime::Model,
    tok: &Tokenizer,
    o: &Opts,
    progress: &mut Progress,
) -> Result<TopKCache, String> {
    let mut cache = TopKCache {
        seq_len: o.seq_len,
        k: o.top_k,
        tokens: Vec::new(),
        ids: Vec::new(),
        probs: Vec::new(),
    };
    let stories = story_windows(tok, o.seq_len, o.story_seqs)?;
    if !stories.is_empty() {
        let n = stories.len();
        let c = cache_top_k(target, &stories, o.top_k, 4, |done| {
            progress.line(done == n, || format!("scored {done} / {n} story windows"))
        })
        .map_err(|e| e.to_string())?;
        cache.append(c).map_err(|e| e.to_string())?;
    }
    let template = tok
        .chat_template()
        .ok_or("the target's file has no chat template")?;
    let mut prompts = Vec::new();
    let mut asked = instructions(o.instructions);
    if o.self_instructions > 0 {
        let own = self_instructions(target, tok, template, o.self_instructions, o.seed)?;
        progress.line(true, || {
            format!(
                "the target wrote {} distinct instructions of {} asked for, e.g. {:?}",
                own.len(),
                o.self_instructions,
                &own[..own.len().min(4)]
            )
        });
        asked.extend(own);
    }
    for q in asked {
        let mut p = chat_prompt(tok, template, &q)?;
        p.truncate(o.seq_len / 2);
        prompts.push(p);
    }
    for (round, temperature) in [0.0, 0.8, 0.8].into_iter().enumerate() {
        let params = sampling(temperature).map_err(|e| e.to_string())?;
        let seeds: Vec<u64> = (0..prompts.len() as u64)
            .map(|i| o.seed.wrapping_mul(7919).wrapping_add(1000 * round as u64 + i))
            .collect();
        for (c, chunk) in prompts.chunks(64).enumerate() {
            let seeds = &seeds[64 * c..64 * c + chunk.len()];
            let answers = continue_and_cache(target, chunk, &params, o.seq_len, o.top_k, seeds, |_| ())
                .map_err(|e| e.to_string())?;
            cache.append(answers).map_err(|e| e.to_string())?;
        }
        progress.line(true, || {
            format!(
                "answered {} instructions, round {} of 3",
                prompts.len(),
                round + 1
            )
        });
    }
    // The target's greedy continuations of held-in story openings, 64 at a time.
    let openings = story_openings(o.openings)?;
    let greedy = sampling(0.0).map_err(|e| e.to_string())?;
    let mut continued = 0;
    for chunk in openings.chunks(64) {
        let mut ps = Vec::with_capacity(chunk.len());
        for text in chunk {
            let mut p = tok.encode(text, tok.add_bos()).map_err(|e| e.to_string())?;
            p.truncate(o.seq_len / 2);
            ps.push(p);
        }
        let seeds = vec![o.seed; ps.len()];
        let c = continue_and_cache(target, &ps, &greedy, o.seq_len, o.top_k, &seeds, |_| ())
            .map_err(|e| e.to_string())?;
        cache.append(c).map_err(|e| e.to_string())?;
        continued += chunk.len();
        progress.line(continued == openings.len(), || {
            format!(
                "continued {continued} / {} story openings greedily",
                openings.len()
            )
        });
    }
    println!(
        "{} story windows, {} answers and {} continued openings of {} tokens, with the target's top-{} \
         distributions",
        stories.len(),
        3 * prompts.len(),
        openings.len(),
        o.seq_len,
        o.top_k
    );
    Ok(cache)
}

/// What the cache is built from: the target file's bytes and every option that changes the text or the cache
/// (FNV-1a 64), so that `--cache-file` never trains on another target's distributions.
fn cache_key(target: &Path, o: &Opts) -> Result<u64, String> {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    if target.is_dir() {
        for name in ["config.json", "model.safetensors"] {
            let p = target.join(name);
            h.write(&std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?);
        }
    } else {
        h.write(&std::fs::read(target).map_err(|e| format!("{}: {e}", target.display()))?);
    }
    for v in [o.top_k, o.story_seqs, o.openings, o.instructions, o.seq_len] {
        h.write(&(v as u64).to_le_bytes());
    }
    h.write(&o.seed.to_le_bytes());
    h.write(&HELD_OUT_BYTES.to_le_bytes());
    // Only when asked for, so that the files written before the option existed keep their key.
    if o.self_instructions > 0 {
        h.write(&(o.self_instructions as u64).to_le_bytes());
    }
    Ok(h.0)
}

struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

pub fn run(target_path: &Path, out: &Path, o: &Opts) -> Result<(), String> {
    let device = spin_runtime::select_device().map_err(|e| e.to_string())?;
    let target = spin_runtime::load_model(target_path, &device).map_err(|e| e.to_string())?;
    let tc = target.config().clone();
    let tok = spin_runtime::load_tokenizer(None, target_path, tc.vocab_size).map_err(|e| e.to_string())?;
    let most = INSTRUCTIONS.len() + TEMPLATES.len() * SUBJECTS.len();
    if o.instructions > most {
        return Err(format!(
            "--instructions: {} is more than the {most} there are",
            o.instructions
        ));
    }
    if o.seq_len < 2 || o.seq_len > tc.max_seq_len || o.steps == 0 || o.batch == 0 || o.top_k == 0 {
        return Err("--seq-len, --steps, --batch, --top-k: out of range".into());
    }
    let mut progress = Progress {
        start: Instant::now(),
        last: 0.0,
    };
    // 1–2. The training text and the target's top-k distributions over it, or the cache file they were saved to.
    let key = cache_key(target_path, o)?;
    let cache = match &o.cache_file {
        Some(f) if f.exists() => {
            let b = std::fs::read(f).map_err(|e| format!("--cache-file: {}: {e}", f.display()))?;
            let c =
                TopKCache::from_bytes(&b, key).map_err(|e| format!("--cache-file: {}: {e}", f.display()))?;
            println!(
                "read the target's top-{} distributions of {} sequences from {}",
                c.k,
                c.sequences(),
                f.display()
            );
            c
        }
        _ => {
            let c = build_cache(&target, &tok, o, &mut progress)?;
            if let Some(f) = &o.cache_file {
                std::fs::write(f, c.to_bytes(key))
                    .map_err(|e| format!("--cache-file: {}: {e}", f.display()))?;
                println!("wrote the cache to {} (--cache-file reads it back)", f.display());
            }
            c
        }
    };
    let n = cache.sequences();
    drop(target);
    // 3. The head: the target's most frequent tokens by expected count (kept probability mass).
    let counts: Vec<u64> = cache
        .expected_counts(tc.vocab_size)
        .iter()
        .map(|&c| (c * 1e6).round() as u64)
        .collect();
    let ids = most_frequent(&counts, o.head);
    let kept: u64 = ids.iter().map(|&t| counts[t as usize]).sum();
    let all: u64 = counts.iter().sum();
    println!(
        "head: {} tokens hold {:.1} % of the target's kept probability mass",
        ids.len(),
        100.0 * kept as f64 / all.max(1) as f64
    );
    let hv = HeadVocab::new(ids, tc.vocab_size).map_err(|e| e.to_string())?;
    // 4. The student, trained on the cache alone.
    let cfg = Config {
        vocab_size: hv.compact_vocab(),
        dim: o.dim,
        hidden_dim: o.hidden,
        n_layers: o.layers,
        n_heads: o.heads,
        n_kv_heads: o.kv_heads,
        max_seq_len: tc.max_seq_len,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Halves,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let (cfg, mut student) = if o.init_layers.is_empty() {
        let s = HeadStudent::new(cfg.clone(), hv.clone(), o.lr, o.seed).map_err(|e| e.to_string())?;
        (cfg, s)
    } else {
        if target_path.extension().is_none_or(|e| e != "gguf") {
            return Err("--init-layers: needs a GGUF target".into());
        }
        let names = layer_tensor_names(&tc, &o.init_layers);
        let (_, t) = spin_runtime::gguf::dense_tensors(target_path, &names).map_err(|e| e.to_string())?;
        let (cfg, init) = student_from_layers(&tc, &t, &o.init_layers, &hv).map_err(|e| e.to_string())?;
        println!(
            "student: the target's layers {:?} (width {}, feed-forward {}, {}/{} heads; --dim … --kv-heads unused)",
            o.init_layers, cfg.dim, cfg.hidden_dim, cfg.n_heads, cfg.n_kv_heads
        );
        let s = HeadStudent::from_tensors(cfg.clone(), hv.clone(), o.lr, &init, o.freeze_layers)
            .map_err(|e| e.to_string())?;
        (cfg, s)
    };
    student
        .set_argmax_weight(o.argmax_weight)
        .map_err(|e| format!("--argmax-weight: {e}"))?;
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let mut recent = Vec::new();
    let train_start = Instant::now();
    for step in 0..o.steps {
        if o.minutes > 0.0 && train_start.elapsed().as_secs_f64() > 60.0 * o.minutes {
            println!(
                "time box of {} min reached after {step} steps: --steps {step} rebuilds this draft",
                o.minutes
            );
            break;
        }
        if o.cosine {
            student.set_learning_rate(cosine_learning_rate(o.lr, step, o.steps));
        }
        let rows: Vec<usize> = (0..o.batch).map(|_| rng.random_range(0..n)).collect();
        let b = student.batch(&cache, &rows).map_err(|e| e.to_string())?;
        recent.push(student.step(&b).map_err(|e| e.to_string())?);
        progress.line(step + 1 == o.steps, || {
            let kl = recent.iter().sum::<f64>() / recent.len() as f64;
            recent.clear();
            format!(
                "step {:5} / {}  KL {kl:.4} nats/position (mean since the last line)",
                step + 1,
                o.steps
            )
        });
    }
    spin_runtime::hf::write_draft_dir(out, &cfg, student.tensors(), &hv).map_err(|e| e.to_string())?;
    println!("wrote {}", out.display());
    Ok(())
}
