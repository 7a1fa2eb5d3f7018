//! The wire protocol between a device and the server (docs/protocol.md is its reference): message types, the
//! postcard encoding inside length-delimited frames, the bit-packed distribution payload and the typed decode errors.

pub use crate::error::ErrorCode;
use crate::error::NetError;
use serde::{Deserialize, Serialize};
use spin_core::SparseDist;
use spin_core::dist::index_bits;

/// The protocol version; a peer speaking another version is refused at the handshake.
pub const PROTOCOL_VERSION: u16 = 4;
/// Bytes of a session's resume secret (128 bits from the operating system's CSPRNG).
pub const SECRET_BYTES: usize = 16;
/// The first four bytes of every `Hello`, so that a stray client is told apart from a wrong version.
pub const MAGIC: [u8; 4] = *b"MSPN";
/// The default largest frame body in bytes (a γ = 32 paper-A draft at V = 151,665, V_eff = 1024, Q = 16 needs
/// about 140 kB; a frame above the limit is refused before it is read).
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// What a model pair must agree on: the vocabulary and the tokenizer (a fingerprint of its file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Vocabulary size V.
    pub vocab: u32,
    /// 64-bit FNV-1a hash of the tokenizer file (0 when unknown: then only the vocabulary is checked).
    pub tokenizer: u64,
    /// 64-bit FNV-1a hash of the model's configuration (informative: drafter and target differ by design).
    pub model: u64,
}

/// How drafts and corrections are sent in a session (chosen by the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exchange {
    /// Paper A: every drafted token goes up with its truncated, quantised draft distribution; the server completes
    /// the round (correction included) on its own.
    DistsWithDraft,
    /// Paper B: only (token, probability) pairs go up; a rejected device exchanges one distribution, UL or DL.
    ProbsOnly,
    /// The unified planner: every `Plan` says which of the two this device sends in that round.
    Planned,
}

/// The sampling and payload settings a device must use (sent in `Welcome`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionParams {
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    /// Paper A or paper B exchange.
    pub exchange: Exchange,
    /// Entries kept per distribution (V_eff).
    pub v_eff: u32,
    /// Bits per value (Q).
    pub q_bits: u8,
    /// The run's seed; device k drafts with stream k + 1 of it.
    pub seed: u64,
    /// Tokens the device may generate in total.
    pub max_new_tokens: u32,
}

/// A distribution on the air: `count` (index, code) pairs, indices at ⌈log₂V⌉ bits and codes at `q_bits` bits,
/// packed most significant bit first into `bits` (docs/protocol.md §"packed distribution").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedDist {
    /// Vocabulary size V.
    pub vocab: u32,
    /// Q, bits per code (1..=24).
    pub q_bits: u8,
    /// V_eff, entries on the air.
    pub count: u32,
    /// ⌈count·(⌈log₂V⌉ + Q) / 8⌉ bytes.
    #[serde(with = "serde_bytes_compat")]
    pub bits: Vec<u8>,
}

/// `Vec<u8>` as one length-prefixed byte string (postcard encodes `&[u8]` that way already; this keeps it explicit).
mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let b: &[u8] = <&[u8]>::deserialize(d)?;
        Ok(b.to_vec())
    }
}

/// What a device that lost its connection quotes to take its session back: the id and the secret of its `Welcome`.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// The session id.
    pub session: u64,
    /// The session's resume secret.
    pub secret: [u8; SECRET_BYTES],
}

/// The secret is never printed (a log line must not hand a session to whoever reads it).
impl std::fmt::Debug for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resume")
            .field("session", &self.session)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Whether two secrets are equal, in time independent of where they differ (no early exit: every byte is folded in,
/// and the fold passes through `black_box` so that the compiler cannot turn it back into a short-circuit compare).
pub fn secrets_equal(a: &[u8; SECRET_BYTES], b: &[u8; SECRET_BYTES]) -> bool {
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| std::hint::black_box(acc | (x ^ y)));
    std::hint::black_box(diff) == 0
}

/// Whether `given` is one of `tokens`: every token is compared, each in time independent of where it differs (only
/// the lengths are compared directly).
pub fn token_admitted(tokens: &[Vec<u8>], given: &[u8]) -> bool {
    tokens.iter().fold(false, |ok, t| {
        let same = t.len() == given.len()
            && std::hint::black_box(
                t.iter()
                    .zip(given)
                    .fold(0u8, |acc, (x, y)| std::hint::black_box(acc | (x ^ y))),
            ) == 0;
        ok | same
    })
}

/// The check both sides make at the handshake (the server on `Hello`, the device on `Welcome`): the peer's
/// vocabulary must equal ours, and so must its tokenizer fingerprint when both are known (non-zero). The names
/// (`"target"`, `"drafter"`) are those of the two models, for the message.
pub fn check_identity(
    ours: &Identity,
    our_name: &str,
    peer: &Identity,
    peer_name: &str,
) -> Result<(), NetError> {
    if peer.vocab != ours.vocab {
        return Err(NetError::Mismatch {
            field: "vocab",
            reason: format!(
                "the {peer_name} has {} tokens, the {our_name} {}",
                peer.vocab, ours.vocab
            ),
        });
    }
    if peer.tokenizer != 0 && ours.tokenizer != 0 && peer.tokenizer != ours.tokenizer {
        return Err(NetError::Mismatch {
            field: "tokenizer",
            reason: format!(
                "the {peer_name}'s tokenizer {:016x} differs from the {our_name}'s {:016x}",
                peer.tokenizer, ours.tokenizer
            ),
        });
    }
    Ok(())
}

/// Messages from a device to the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DeviceMsg {
    /// Opens a session (`resume` = None) or resumes one after a disconnect.
    Hello {
        /// Must be [`MAGIC`].
        magic: [u8; 4],
        /// Must be [`PROTOCOL_VERSION`].
        version: u16,
        /// The draft model's identity.
        identity: Identity,
        /// The session id and secret of an earlier `Welcome` to resume, or none.
        resume: Option<Resume>,
        /// The prompt's token ids (ignored on resume).
        prompt: Vec<u32>,
        /// Distance to the server in metres, when the device knows it (else the server's drop draws one).
        distance_m: Option<f64>,
        /// The device's admission token (pre-shared; empty where the server admits any device).
        token: Vec<u8>,
    },
    /// The round's draft.
    Draft {
        /// The round it answers.
        round: u64,
        /// y_1..y_γ.
        tokens: Vec<u32>,
        /// q_j(y_j) per token.
        probs: Vec<f32>,
        /// q_1..q_γ (paper-A exchange only; empty otherwise).
        dists: Vec<PackedDist>,
        /// The device's own drafting time in seconds (measured on its processor).
        draft_s: f64,
    },
    /// UL correction: q_r of the rejected position.
    Upload {
        /// The round.
        round: u64,
        /// q_r.
        q: PackedDist,
    },
    /// DL correction: the token the device drew from the downloaded p_r.
    Corrected {
        /// The round.
        round: u64,
        /// The token.
        token: u32,
    },
    /// The device leaves (its session ends).
    Bye,
}

/// What the device does after a verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Next {
    /// The round is complete: commit the accepted prefix and `token`.
    Commit {
        /// The residual or bonus token.
        token: u32,
        /// Whether the device has finished (budget or EOS).
        done: bool,
    },
    /// UL mode: upload q_r of the rejected position.
    SendQ,
    /// DL mode: draw the correction from this p_r and the local q_r, and report it.
    Residual {
        /// p_r as downloaded.
        p: PackedDist,
    },
}

/// Messages from the server to a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// Accepts a `Hello`.
    Welcome {
        /// [`PROTOCOL_VERSION`].
        version: u16,
        /// The session id (quote it with `secret` in `Hello.resume` to reconnect).
        session: u64,
        /// The session's resume secret (from the OS CSPRNG; only this device and the server know it).
        secret: [u8; SECRET_BYTES],
        /// The device's index in the run.
        device: u32,
        /// The target model's identity.
        identity: Identity,
        /// The committed sequence (prompt and generated tokens so far).
        committed: Vec<u32>,
        /// Length of the prompt within `committed`.
        prompt_len: u32,
        /// Sampling and payload settings.
        params: SessionParams,
    },
    /// Draft `draft_len` tokens for `round`.
    Plan {
        /// The round number.
        round: u64,
        /// L_k, the draft length.
        draft_len: u32,
        /// The device's draft-uplink share B_k in Hz (informative; protocol v2 called it `bandwidth_hz`: postcard
        /// encodes fields by position, so the frame is the same).
        uplink_share_hz: f64,
        /// Whether the draft goes up with its distributions (`DistsWithDraft`: always; `ProbsOnly`: never;
        /// `Planned`: the planner's choice for this device and round; `send_dists` in protocol v2, the same bytes).
        sends_distributions: bool,
    },
    /// The verification result.
    Verdict {
        /// The round.
        round: u64,
        /// Drafted tokens accepted.
        accepted: u32,
        /// What to do next.
        next: Next,
    },
    /// The draft missed the round deadline: discard it, nothing is committed this round.
    Dropped {
        /// The round.
        round: u64,
    },
    /// A refusal; the connection is closed after it.
    Error {
        /// What went wrong.
        code: ErrorCode,
        /// A one-line explanation naming the field.
        message: String,
    },
    /// The server shuts down; the connection is closed after it.
    Shutdown {
        /// Why.
        reason: String,
    },
    /// Nothing for the device to do yet (the server waits for devices to join, or for the others' drafts): the
    /// server is alive. Sent to every connected device at least every `ServerConfig::keepalive_every` while the
    /// server waits; a device ignores it, and gives up on a server it hears nothing from, not even this, for its
    /// `DeviceConfig::silence_timeout` (protocol v4).
    KeepAlive,
}

/// A message type of the protocol, named in decode errors: its name and its variants' names in wire order (the
/// variant index postcard writes first).
pub trait Message {
    /// `DeviceMsg` or `ServerMsg`.
    const NAME: &'static str;
    /// The variants' names; index i is variant i on the wire.
    const VARIANTS: &'static [&'static str];
    /// Each variant's fields in wire order.
    const FIELDS: &'static [&'static [&'static str]];

    /// This message's variant name.
    fn kind(&self) -> &'static str;
}

impl Message for DeviceMsg {
    const NAME: &'static str = "DeviceMsg";
    const VARIANTS: &'static [&'static str] = &["Hello", "Draft", "Upload", "Corrected", "Bye"];
    const FIELDS: &'static [&'static [&'static str]] = &[
        &[
            "magic",
            "version",
            "identity",
            "resume",
            "prompt",
            "distance_m",
            "token",
        ],
        &["round", "tokens", "probs", "dists", "draft_s"],
        &["round", "q"],
        &["round", "token"],
        &[],
    ];

    fn kind(&self) -> &'static str {
        Self::VARIANTS[match self {
            DeviceMsg::Hello { .. } => 0,
            DeviceMsg::Draft { .. } => 1,
            DeviceMsg::Upload { .. } => 2,
            DeviceMsg::Corrected { .. } => 3,
            DeviceMsg::Bye => 4,
        }]
    }
}

impl Message for ServerMsg {
    const NAME: &'static str = "ServerMsg";
    const VARIANTS: &'static [&'static str] = &[
        "Welcome",
        "Plan",
        "Verdict",
        "Dropped",
        "Error",
        "Shutdown",
        "KeepAlive",
    ];
    const FIELDS: &'static [&'static [&'static str]] = &[
        &[
            "version",
            "session",
            "secret",
            "device",
            "identity",
            "committed",
            "prompt_len",
            "params",
        ],
        &["round", "draft_len", "uplink_share_hz", "sends_distributions"],
        &["round", "accepted", "next"],
        &["round"],
        &["code", "message"],
        &["reason"],
        &[],
    ];

    fn kind(&self) -> &'static str {
        Self::VARIANTS[match self {
            ServerMsg::Welcome { .. } => 0,
            ServerMsg::Plan { .. } => 1,
            ServerMsg::Verdict { .. } => 2,
            ServerMsg::Dropped { .. } => 3,
            ServerMsg::Error { .. } => 4,
            ServerMsg::Shutdown { .. } => 5,
            ServerMsg::KeepAlive => 6,
        }]
    }
}

/// The most characters of a peer's free text (an `Error` message, a `Shutdown` reason) kept by [`printable`].
pub const MAX_PEER_TEXT_CHARS: usize = 512;

/// A peer's free text made safe to print on a terminal or in a log line: control characters (escape sequences,
/// newlines, carriage returns) and the invisible characters that reorder or hide text (bidirectional overrides and
/// isolates, zero-width characters, the byte order mark) are escaped as Rust writes them (`\u{1b}`, `\n`);
/// ordinary Unicode is kept. Past [`MAX_PEER_TEXT_CHARS`] characters the text is cut, saying how many bytes were
/// left out.
pub fn printable(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    let mut out = String::new();
    let mut chars = 0usize;
    for (at, c) in text.char_indices() {
        let piece: String = if hidden(c) {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        let n = piece.chars().count();
        if chars + n > MAX_PEER_TEXT_CHARS {
            out.push_str(&format!("… ({} more bytes)", text.len() - at));
            break;
        }
        out.push_str(&piece);
        chars += n;
    }
    out
}

/// Encodes a message body (postcard).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, NetError> {
    postcard::to_stdvec(msg).map_err(|e| NetError::Encode(e.to_string()))
}

/// Decodes a message body; the whole body must be consumed. A body that does not decode is a
/// [`NetError::Decode`] naming the message, as far as the body named it, and the body's length:
/// `frame: DeviceMsg::Draft.probs[2]: Hit the end of buffer, expected more data (a 14-byte body)` (inside a
/// field, `[i]` is an element of a list or the i-th field of a nested struct, counting from 0).
pub fn decode<'a, T: Deserialize<'a> + Message>(body: &'a [u8]) -> Result<T, NetError> {
    let mut de = postcard::Deserializer::from_bytes(body);
    let msg: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // postcard says "Serde Deserialization Error" for an unknown variant: named here instead.
        let tag = postcard::take_from_bytes::<u32>(body)
            .ok()
            .map(|(t, _)| t as usize);
        if let Some(tag) = tag.filter(|&t| t >= T::VARIANTS.len()) {
            return NetError::Decode(format!(
                "{}: variant {tag} does not exist (known: 0..={}) (a {}-byte body)",
                T::NAME,
                T::VARIANTS.len() - 1,
                body.len()
            ));
        }
        NetError::Decode(format!(
            "{}: {} (a {}-byte body)",
            message_path::<T>(e.path()),
            e.inner(),
            body.len()
        ))
    })?;
    let rest = de
        .finalize()
        .map_err(|e| NetError::Decode(format!("{}: {e}", T::NAME)))?;
    if !rest.is_empty() {
        return Err(NetError::Decode(format!(
            "{}::{}: {} trailing bytes after the message (a {}-byte body)",
            T::NAME,
            msg.kind(),
            rest.len(),
            body.len()
        )));
    }
    Ok(msg)
}

/// Where in a `T` a decode error struck, from the path postcard's reading got to: the variant by name, its field
/// by name, then list elements and nested fields by position (postcard writes both as sequences).
fn message_path<T: Message>(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut segments = path.iter();
    let mut out = T::NAME.to_string();
    let Some(Segment::Enum { variant }) = segments.next() else {
        return out;
    };
    let Some(i) = variant.parse::<usize>().ok().filter(|&i| i < T::VARIANTS.len()) else {
        out.push_str(&format!(" variant {variant}"));
        return out;
    };
    out.push_str("::");
    out.push_str(T::VARIANTS[i]);
    if let Some(Segment::Seq { index }) = segments.next() {
        match T::FIELDS[i].get(*index) {
            Some(f) => out.push_str(&format!(".{f}")),
            None => out.push_str(&format!("[{index}]")),
        }
    }
    for s in segments {
        match s {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            // `Next`, the one enum inside a message: its variant by index.
            Segment::Enum { variant } => out.push_str(&format!(".variant {variant}")),
            other => out.push_str(&format!(".{other}")),
        }
    }
    out
}

/// Bits on the air of a packed distribution, V_eff(⌈log₂V⌉ + Q), as spin-core counts it.
pub fn packed_bits(vocab: u32, q_bits: u8, count: u32) -> u64 {
    spin_core::dist::payload_bits(count as usize, vocab as usize, u32::from(q_bits))
}

/// Packs a quantised sparse distribution (its values must be integer codes below 2^Q).
pub fn pack(s: &SparseDist) -> Result<PackedDist, NetError> {
    let q = s.value_bits();
    if !(1..=24).contains(&q) {
        return Err(NetError::invalid(
            "q_bits",
            format!("{q} is outside [1, 24] (quantise before packing)"),
        ));
    }
    let ib = index_bits(s.vocab());
    let mut w = BitWriter::default();
    for (&i, &v) in s.indices().iter().zip(s.values()) {
        w.put(u64::from(i), ib);
        w.put(v as u64, q);
    }
    Ok(PackedDist {
        vocab: s.vocab() as u32,
        q_bits: q as u8,
        count: s.kept() as u32,
        bits: w.finish(),
    })
}

/// The checks of a packed distribution's header against the session's vocabulary: vocabulary, value width, entry
/// count, and the byte length those imply.
fn check_header(p: &PackedDist, vocab: u32) -> Result<(), NetError> {
    if p.vocab != vocab {
        return Err(NetError::invalid(
            "dist.vocab",
            format!("{} differs from the session's vocabulary {vocab}", p.vocab),
        ));
    }
    if !(1..=24).contains(&p.q_bits) {
        return Err(NetError::invalid(
            "dist.q_bits",
            format!("{} is outside [1, 24]", p.q_bits),
        ));
    }
    if p.count == 0 || p.count > vocab {
        return Err(NetError::invalid(
            "dist.count",
            format!("{} is outside [1, {vocab}]", p.count),
        ));
    }
    let bits = packed_bits(vocab, p.q_bits, p.count);
    if p.bits.len() as u64 != bits.div_ceil(8) {
        return Err(NetError::invalid(
            "dist.bits",
            format!(
                "{} bytes for {} entries of {} bits",
                p.bits.len(),
                p.count,
                bits / u64::from(p.count)
            ),
        ));
    }
    Ok(())
}

/// Unpacks and validates a packed distribution against the session's vocabulary; the result carries the same
/// distribution and the same bits on the air as what was packed.
pub fn unpack(p: &PackedDist, vocab: u32) -> Result<SparseDist, NetError> {
    check_header(p, vocab)?;
    let ib = index_bits(vocab as usize);
    let q = u32::from(p.q_bits);
    let n = p.count as usize;
    let code_mask = (1u64 << q) - 1;
    // One pass over the bits, no per-entry branch and no zero-filled buffers: split every group of eight entries
    // into indices and codes (the vectors are filled by `extend` into their exact capacity; the zero-filled
    // `vec![0; n]` this replaced cost a calloc and a memset per distribution). spin-core checks the indices.
    let mut indices = Vec::with_capacity(n);
    let mut codes = Vec::with_capacity(n);
    for_each_group(&p.bits, n, ib + q, |entries| {
        indices.extend(entries.iter().map(|&e| (e >> q) as u32));
        // Codes are below 2^Q ≤ 2^24, so exact in f32, and they fit an i32, whose conversion is one instruction (the
        // u64 one is not).
        codes.extend(entries.iter().map(|&e| (e & code_mask) as i32 as f32));
    });
    // The order in a branch-free pass over the codes (tracked inside the loop above it was a serial chain per
    // entry); in order, the largest code is the first.
    let ordered = codes.windows(2).fold(true, |ok, w| ok & (w[0] >= w[1]));
    let max = if ordered {
        codes.first().copied().unwrap_or(0.0)
    } else {
        codes.iter().fold(0.0f32, |m, &c| if c > m { c } else { m })
    };
    finish_unpack(vocab, q, indices, codes, max, ordered)
}

/// The checks and the result of an unpack once the entries are read: the largest code `max` must be 2^Q − 1, entries
/// not `ordered` largest first are put in that order, and spin-core builds (and checks again) the distribution.
fn finish_unpack(
    vocab: u32,
    q: u32,
    mut indices: Vec<u32>,
    mut codes: Vec<f32>,
    max: f32,
    ordered: bool,
) -> Result<SparseDist, NetError> {
    if max == 0.0 {
        return Err(NetError::invalid("dist.codes", "every code is zero"));
    }
    let full = ((1u64 << q) - 1) as f32;
    if max != full {
        return Err(NetError::invalid(
            "dist.codes",
            format!("the largest code is {max}, not 2^Q − 1 = {full}"),
        ));
    }
    if !ordered {
        // A sender may list the entries in any order; spin-core keeps them largest first (ties: smaller token id).
        // Quantisers send them in that order already, so this sort is the exception, not the per-round cost.
        let mut pairs: Vec<(u32, f32)> = indices.iter().copied().zip(codes.iter().copied()).collect();
        pairs.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        (indices, codes) = pairs.into_iter().unzip();
    }
    // Codes are integers below 2^Q ≤ 2^24, so they are exact in f32; the distribution is code_i / Σ codes and its
    // bits on the air V_eff(⌈log₂V⌉ + Q) are what was sent. spin-core checks distinct indices (and the rest again).
    SparseDist::from_codes(vocab as usize, indices, codes, q).map_err(|e| {
        let field = match &e {
            spin_core::CoreError::InvalidAt { field: "indices", .. } => "dist.index",
            _ => "dist",
        };
        NetError::invalid(field, e.to_string())
    })
}

/// MSB-first bit packing through a 64-bit accumulator (hand-written: a dozen lines, where a bit-vector crate would
/// bring far more than needed). Fields are at most 32 bits wide.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl BitWriter {
    fn put(&mut self, value: u64, bits: u32) {
        debug_assert!(bits <= 32);
        self.acc = (self.acc << bits) | (value & ((1u64 << bits) - 1));
        self.n += bits;
        while self.n >= 8 {
            self.n -= 8;
            self.out.push((self.acc >> self.n) as u8);
        }
    }
    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push((self.acc << (8 - self.n)) as u8);
        }
        self.out
    }
}

/// Calls `f` on the `n` entries of `width` ≤ 56 bits packed most significant bit first in `data` (which holds at
/// least ⌈n·width/8⌉ bytes: the caller checked the length), in order, eight at a time (fewer at the end).
///
/// Eight entries fill exactly `width` bytes, so every group of eight starts on a byte boundary and entry j of a
/// group sits at the same byte offset ⌊j·width/8⌋ and bit shift j·width mod 8 in every group: both are computed
/// once, and each entry is one unaligned big-endian 8-byte load, a shift and a mask (at most 56 + 7 bits, so it
/// fits in 64). The last groups, whose loads would run past the end, are read from a zero-padded copy. Handing
/// the entries over by groups lets the caller's per-entry work run as straight-line loops over eight values. This
/// replaced a reader that recomputed the offset and checked for the end at every entry (hand-written: the layout
/// is the protocol's own, docs/protocol.md §"packed distribution").
fn for_each_group(data: &[u8], n: usize, width: u32, mut f: impl FnMut(&[u64])) {
    debug_assert!((1..=56).contains(&width));
    let group = width as usize;
    let at: [(usize, u32); 8] = std::array::from_fn(|j| (j * group / 8, (j * group % 8) as u32));
    let drop = 64 - width;
    let read = |bytes: &[u8], (byte, shift): (usize, u32)| {
        let word = bytes
            .get(byte..)
            .and_then(|b| b.first_chunk::<8>())
            .map_or(0, |w| u64::from_be_bytes(*w));
        (word << shift) >> drop
    };
    // A group's loads end at byte ⌊7·width/8⌋ + 8 ≤ width + 7 of the group: these groups stay inside `data`.
    let span = group + 7;
    let fast = if data.len() >= span {
        ((data.len() - span) / group + 1).min(n / 8)
    } else {
        0
    };
    let mut entries = [0u64; 8];
    for g in 0..fast {
        // In range: g < fast, so the group's span ends inside `data`, and every load ends inside the span.
        let bytes = &data[g * group..g * group + span];
        for (e, &(byte, shift)) in entries.iter_mut().zip(&at) {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[byte..byte + 8]);
            *e = (u64::from_be_bytes(word) << shift) >> drop;
        }
        f(&entries);
    }
    // The rest: fewer than width + 7 ≤ 63 bytes, whose loads end before byte 63 + 8 of the padded copy.
    let mut tail = [0u8; 80];
    let rest = data.get(fast * group..).unwrap_or(&[]);
    let len = rest.len().min(tail.len());
    tail[..len].copy_from_slice(&rest[..len]);
    let mut j = 0;
    while fast * 8 + j < n {
        let m = (n - fast * 8 - j).min(8);
        for (i, e) in entries[..m].iter_mut().enumerate() {
            let bit = (j + i) * group;
            *e = read(&tail, (bit / 8, (bit % 8) as u32));
        }
        f(&entries[..m]);
        j += m;
    }
}

/// 64-bit FNV-1a of `bytes` (identity fingerprints only, not security; hand-written as it is four lines).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spin_core::Dist;

    #[test]
    fn a_plan_frame_has_the_bytes_of_protocol_v3_before_its_fields_were_renamed() {
        // `Plan`'s share and payload fields were `bandwidth_hz` and `send_dists`; postcard writes fields by position,
        // so a peer built before the rename reads the same frame: variant 1, round and draft length as varints, the
        // share as 8 little-endian bytes, the flag as one byte.
        let plan = ServerMsg::Plan {
            round: 7,
            draft_len: 4,
            uplink_share_hz: 1e5,
            sends_distributions: true,
        };
        let mut want = vec![1, 7, 4];
        want.extend_from_slice(&1e5f64.to_le_bytes());
        want.push(1);
        assert_eq!(encode(&plan).unwrap(), want);
        assert_eq!(decode::<ServerMsg>(&want).unwrap(), plan);
    }

    #[test]
    fn packed_distributions_round_trip_with_spin_core_sizes() {
        let w: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 + 0.5).collect();
        let s = SparseDist::truncate(Dist::new(&w).unwrap(), 17)
            .unwrap()
            .quantise(11)
            .unwrap();
        let p = pack(&s).unwrap();
        assert_eq!(p.bits.len() as u64, s.bits_on_air().div_ceil(8));
        assert_eq!(packed_bits(300, 11, 17), s.bits_on_air());
        let back = unpack(&p, 300).unwrap();
        assert_eq!(back.bits_on_air(), s.bits_on_air());
        for t in 0..300 {
            assert_eq!(back.prob(t), s.prob(t), "token {t}");
        }
        let body = encode(&DeviceMsg::Upload {
            round: 3,
            q: p.clone(),
        })
        .unwrap();
        assert_eq!(
            decode::<DeviceMsg>(&body).unwrap(),
            DeviceMsg::Upload {
                round: 3,
                q: p.clone()
            }
        );
        assert!(unpack(&p, 301).unwrap_err().to_string().starts_with("dist.vocab"));
        let mut bad = p.clone();
        bad.bits.pop();
        assert!(
            unpack(&bad, 300)
                .unwrap_err()
                .to_string()
                .starts_with("dist.bits")
        );
        // Entries in another order are accepted and put largest first; duplicates and a wrong maximum are refused.
        let entries = |pairs: &[(u64, u64)]| {
            let mut w = BitWriter::default();
            for &(i, c) in pairs {
                w.put(i, 9);
                w.put(c, 11);
            }
            PackedDist {
                vocab: 300,
                q_bits: 11,
                count: pairs.len() as u32,
                bits: w.finish(),
            }
        };
        let u = unpack(&entries(&[(5, 3), (9, 2047), (2, 3)]), 300).unwrap();
        assert_eq!(u.indices(), &[9, 2, 5]);
        assert_eq!(u.values(), &[2047.0, 3.0, 3.0]);
        let e = unpack(&entries(&[(5, 2047), (5, 3)]), 300)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("dist.index") && e.contains("twice"), "{e}");
        let e = unpack(&entries(&[(5, 2046)]), 300).unwrap_err().to_string();
        assert!(e.starts_with("dist.codes"), "{e}");
        let e = unpack(&entries(&[(300, 2047)]), 300).unwrap_err().to_string();
        assert!(e.starts_with("dist.index"), "{e}");
        assert!(decode::<DeviceMsg>(&body[..body.len() - 1]).is_err());
        let mut long = body.clone();
        long.push(0);
        assert!(
            decode::<DeviceMsg>(&long)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
    }

    /// One message of every variant (the fields' values matter only for their encoding's length).
    fn every_message() -> (Vec<DeviceMsg>, Vec<ServerMsg>) {
        let identity = Identity {
            vocab: 512,
            tokenizer: 7,
            model: 9,
        };
        let q = PackedDist {
            vocab: 512,
            q_bits: 8,
            count: 1,
            bits: vec![1, 2, 3],
        };
        let device = vec![
            DeviceMsg::Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
                identity,
                resume: Some(Resume {
                    session: 3,
                    secret: [5; SECRET_BYTES],
                }),
                prompt: vec![1, 2, 300],
                distance_m: Some(20.0),
                token: b"abc".to_vec(),
            },
            DeviceMsg::Draft {
                round: 4,
                tokens: vec![1, 2],
                probs: vec![0.5, 0.25],
                dists: vec![q.clone()],
                draft_s: 0.01,
            },
            DeviceMsg::Upload {
                round: 4,
                q: q.clone(),
            },
            DeviceMsg::Corrected { round: 4, token: 9 },
            DeviceMsg::Bye,
        ];
        let server = vec![
            ServerMsg::Welcome {
                version: PROTOCOL_VERSION,
                session: 3,
                secret: [5; SECRET_BYTES],
                device: 0,
                identity,
                committed: vec![1, 2, 3],
                prompt_len: 2,
                params: SessionParams {
                    temperature: 0.0,
                    exchange: Exchange::Planned,
                    v_eff: 64,
                    q_bits: 8,
                    seed: 1,
                    max_new_tokens: 8,
                },
            },
            ServerMsg::Plan {
                round: 1,
                draft_len: 4,
                uplink_share_hz: 1e5,
                sends_distributions: true,
            },
            ServerMsg::Verdict {
                round: 1,
                accepted: 2,
                next: Next::Residual { p: q },
            },
            ServerMsg::Dropped { round: 1 },
            ServerMsg::Error {
                code: ErrorCode::Full,
                message: "full".into(),
            },
            ServerMsg::Shutdown { reason: "bye".into() },
            ServerMsg::KeepAlive,
        ];
        (device, server)
    }

    /// The names a decode error gives are those of the types: every variant's index and fields, read from the
    /// self-describing JSON encoding of one message of each (fields in declaration order, which is wire order).
    #[test]
    fn the_names_in_decode_errors_are_the_messages_own() {
        fn check<T: Serialize + Message>(msgs: &[T]) {
            assert_eq!(msgs.len(), T::VARIANTS.len());
            for (i, m) in msgs.iter().enumerate() {
                assert_eq!(m.kind(), T::VARIANTS[i]);
                assert_eq!(encode(m).unwrap()[0] as usize, i, "{}", T::VARIANTS[i]);
                let json = serde_json::to_string(m).unwrap();
                let fields: Vec<String> = match serde_json::from_str::<serde_json::Value>(&json).unwrap() {
                    serde_json::Value::String(unit) => {
                        assert_eq!(unit, T::VARIANTS[i]);
                        Vec::new()
                    }
                    v => {
                        let (name, body) = v.as_object().unwrap().iter().next().unwrap();
                        assert_eq!(name, T::VARIANTS[i]);
                        let mut keys: Vec<(usize, String)> = body
                            .as_object()
                            .unwrap()
                            .keys()
                            .map(|k| (json.find(&format!("\"{k}\":")).unwrap(), k.clone()))
                            .collect();
                        keys.sort();
                        keys.into_iter().map(|(_, k)| k).collect()
                    }
                };
                assert_eq!(fields, T::FIELDS[i], "{}", T::VARIANTS[i]);
            }
        }
        let (device, server) = every_message();
        check(&device);
        check(&server);
    }

    /// A body cut anywhere never decodes and its error names the message type, the variant, the field it stopped in
    /// and the body's length; an unknown variant is named by number.
    #[test]
    fn decode_errors_name_the_message_the_field_and_the_length() {
        let (device, server) = every_message();
        for m in &device {
            let body = encode(m).unwrap();
            for cut in 1..body.len() {
                let e = decode::<DeviceMsg>(&body[..cut]).unwrap_err().to_string();
                let at = format!("frame: DeviceMsg::{}.", m.kind());
                assert!(e.starts_with(&at), "{e}");
                assert!(e.ends_with(&format!("(a {cut}-byte body)")), "{e}");
            }
        }
        // A message with fields cut by one byte (a unit variant is its tag alone: cut, it is an empty body).
        for m in server.iter().filter(|m| encode(*m).unwrap().len() > 1) {
            let body = encode(m).unwrap();
            let e = decode::<ServerMsg>(&body[..body.len() - 1])
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("frame: ServerMsg::{}", m.kind())), "{e}");
        }
        let draft = encode(&device[1]).unwrap();
        // Variant, round, two tokens, two probabilities of 4 bytes: cut inside the second probability.
        let e = decode::<DeviceMsg>(&draft[..1 + 1 + 3 + 1 + 6])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("frame: DeviceMsg::Draft.probs[1]: "), "{e}");
        let e = decode::<DeviceMsg>(&[9, 0]).unwrap_err().to_string();
        assert_eq!(
            e,
            "frame: DeviceMsg: variant 9 does not exist (known: 0..=4) (a 2-byte body)"
        );
        assert!(
            decode::<DeviceMsg>(&[])
                .unwrap_err()
                .to_string()
                .starts_with("frame: DeviceMsg: ")
        );
        let mut long = encode(&DeviceMsg::Bye).unwrap();
        long.push(0);
        assert_eq!(
            decode::<DeviceMsg>(&long).unwrap_err().to_string(),
            "frame: DeviceMsg::Bye: 1 trailing bytes after the message (a 2-byte body)"
        );
    }

    #[test]
    fn peer_text_is_escaped_and_bounded() {
        assert_eq!(printable("plain text, é ü 漢字 ✓"), "plain text, é ü 漢字 ✓");
        assert_eq!(
            printable("\u{1b}[31mred\nnext\r\u{7}\u{202e}txt.exe\u{200b}"),
            "\\u{1b}[31mred\\nnext\\r\\u{7}\\u{202e}txt.exe\\u{200b}"
        );
        let long = "é".repeat(MAX_PEER_TEXT_CHARS + 10);
        let p = printable(&long);
        assert!(p.starts_with(&"é".repeat(MAX_PEER_TEXT_CHARS)), "{p}");
        assert!(p.ends_with("… (20 more bytes)"), "{p}");
        // An escape is not cut in the middle: it goes whole or not at all.
        let p = printable(&format!("{}\u{1b}", "x".repeat(MAX_PEER_TEXT_CHARS - 2)));
        assert!(p.ends_with("x… (1 more bytes)"), "{p}");
        assert_eq!(
            printable(&"x".repeat(MAX_PEER_TEXT_CHARS)).len(),
            MAX_PEER_TEXT_CHARS
        );
    }

    /// The entries of a packed bit string read one bit at a time (the reference for `for_each_group`).
    fn entries_bit_by_bit(data: &[u8], n: usize, width: u32) -> Vec<u64> {
        let bit = |at: usize| u64::from(data.get(at / 8).map_or(0, |b| (b >> (7 - at % 8)) & 1));
        (0..n)
            .map(|j| (0..width as usize).fold(0u64, |e, i| (e << 1) | bit(j * width as usize + i)))
            .collect()
    }

    #[test]
    fn grouped_reads_equal_bit_by_bit_reads_at_every_width_and_length() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for width in 1..=56u32 {
            // Lengths around every multiple of eight (full groups, partial tails, the slow tail path).
            for n in (0..40).chain([63, 64, 65, 511, 512, 513]) {
                let bytes = (n * width as usize).div_ceil(8);
                let data: Vec<u8> = (0..bytes).map(|_| rng.random::<u8>()).collect();
                let mut got = Vec::new();
                for_each_group(&data, n, width, |g| {
                    assert!(!g.is_empty() && g.len() <= 8);
                    got.extend_from_slice(g);
                });
                assert_eq!(got, entries_bit_by_bit(&data, n, width), "width {width}, n {n}");
            }
        }
    }

    /// `unpack`'s reading as it was before the grouped reader (one field read per entry, order and maximum tracked in
    /// the loop), with the same checks after it: the reference for the fast path.
    fn unpack_reference(p: &PackedDist, vocab: u32) -> Result<SparseDist, NetError> {
        check_header(p, vocab)?;
        let q = u32::from(p.q_bits);
        let w = index_bits(vocab as usize) + q;
        let entries = entries_bit_by_bit(&p.bits, p.count as usize, w);
        let code_mask = (1u64 << q) - 1;
        let (mut ordered, mut prev, mut largest) = (true, u64::MAX, 0u64);
        let (mut indices, mut codes) = (Vec::new(), Vec::new());
        for e in entries {
            let c = e & code_mask;
            ordered &= c <= prev;
            prev = c;
            largest = largest.max(c);
            indices.push((e >> q) as u32);
            codes.push(c as f32);
        }
        finish_unpack(vocab, q, indices, codes, largest as f32, ordered)
    }

    #[test]
    fn unpack_equals_the_reference_on_valid_and_malformed_distributions() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (mut accepted, mut refused) = (0, 0);
        for case in 0..3000 {
            let vocab = [2u32, 3, 17, 300, 512, 513, 4096, 151_665][case % 8];
            let q_bits = rng.random_range(1..=24u8);
            let count = rng.random_range(1..=vocab.min(600));
            let ib = index_bits(vocab as usize);
            let full = (1u64 << q_bits) - 1;
            // Mostly distinct indices with codes largest first and the maximum at 2^Q − 1 (a quantiser's output),
            // then one kind of damage: none, shuffled order, a duplicate index, an index ≥ V (when it fits in the
            // index bits), a wrong maximum, all zero, or a byte cut off or added.
            let mut idx: Vec<u64> = (0..u64::from(vocab)).collect();
            for i in 0..count as usize {
                let j = rng.random_range(i..idx.len());
                idx.swap(i, j);
            }
            idx.truncate(count as usize);
            let mut codes: Vec<u64> = (0..count).map(|_| rng.random_range(0..=full)).collect();
            codes.sort_unstable_by(|a, b| b.cmp(a));
            codes[0] = full;
            let damage = rng.random_range(0..8);
            match damage {
                1 if count > 1 => {
                    let (a, b) = (
                        rng.random_range(0..count as usize),
                        rng.random_range(0..count as usize),
                    );
                    codes.swap(a, b);
                    idx.swap(a, (b + 1) % count as usize);
                }
                2 if count > 1 => idx[count as usize - 1] = idx[0],
                3 if (1u64 << ib) > u64::from(vocab) => {
                    idx[rng.random_range(0..count as usize)] = u64::from(vocab)
                }
                4 if full > 1 => codes[0] = full - 1,
                5 => codes.iter_mut().for_each(|c| *c = 0),
                _ => {}
            }
            let mut w = BitWriter::default();
            for (&i, &c) in idx.iter().zip(&codes) {
                w.put(i, ib);
                w.put(c, u32::from(q_bits));
            }
            let mut p = PackedDist {
                vocab,
                q_bits,
                count,
                bits: w.finish(),
            };
            match damage {
                6 => {
                    p.bits.pop();
                }
                7 if case % 3 == 0 => p.bits.push(0),
                _ => {}
            }
            let (got, want) = (unpack(&p, vocab), unpack_reference(&p, vocab));
            match (&got, &want) {
                (Ok(g), Ok(r)) => {
                    assert_eq!(
                        (g.indices(), g.values(), g.bits_on_air()),
                        (r.indices(), r.values(), r.bits_on_air())
                    );
                    accepted += 1;
                }
                (Err(g), Err(r)) => {
                    assert_eq!(g.to_string(), r.to_string(), "case {case}");
                    refused += 1;
                }
                _ => panic!("case {case}: {got:?} vs {want:?}"),
            }
        }
        // Both outcomes are exercised in quantity.
        assert!(
            accepted > 500 && refused > 500,
            "{accepted} accepted, {refused} refused"
        );
    }
}
