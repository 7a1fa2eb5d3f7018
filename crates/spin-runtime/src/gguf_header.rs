//! One pass over a GGUF file's header (magic, version, metadata, tensor infos) and its tensors' byte ranges,
//! before candle's parser reads it: candle reports a file cut short as "failed to fill whole buffer", names neither
//! the key of an unknown value type nor the tensor of an unknown block type, lets a duplicate key or tensor name
//! replace the first, ignores a `general.alignment` of another integer type than its own and checks no tensor's
//! offset. This scan refuses each of these naming the key or tensor (and, for a file cut short, what was being
//! read, the file's length and the bytes needed), so that a header it passes is one candle reads the same way.

use candle_core::quantized::GgmlDType;
use std::collections::HashSet;

/// The caps of candle's parser (strings, arrays, nesting, dimensions), checked here so that it never fails on a
/// header this scan passes.
const MAX_STRING: u64 = 1 << 30;
const MAX_ARRAY: u64 = 1 << 30;
const MAX_DEPTH: usize = 64;
const MAX_DIMS: u32 = 4;
/// The alignment of the tensor data when `general.alignment` is absent (the format's default).
const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key of the tensor data's alignment.
const ALIGNMENT_KEY: &str = "general.alignment";

/// What [`scan`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Scanned {
    /// The header is sound, and every tensor's data lies aligned inside the file, overlapping no other.
    Sound,
    /// The header runs past the bytes given while the file holds more: scan again with more of it.
    More,
}

/// Why a scan stopped early: more bytes are needed, or the reason the file is refused.
enum Stop {
    More,
    Bad(String),
}

type Step<T> = std::result::Result<T, Stop>;

fn bad<T>(reason: String) -> Step<T> {
    Err(Stop::Bad(reason))
}

/// A key or tensor name as candle's parser stores it (trailing NULs dropped, invalid UTF-8 replaced).
fn name_of(bytes: &[u8]) -> String {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A name from the file as an error shows it: on one line, and cut after 100 characters.
fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(100).flat_map(char::escape_debug).collect();
    if name.chars().nth(100).is_some() {
        s.push('…');
    }
    s
}

/// The name GGUF gives a metadata value type.
fn type_name(t: u32) -> &'static str {
    const NAMES: [&str; 13] = [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    ];
    NAMES.get(t as usize).copied().unwrap_or("unknown")
}

/// The bytes of one value of a fixed-width metadata type (0 for strings and arrays, None for unknown types).
fn fixed_width(t: u32) -> Option<u64> {
    [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8].get(t as usize).copied()
}

/// The block type of a ggml type code, as candle reads it.
fn ggml_type(code: u32) -> Option<GgmlDType> {
    use GgmlDType as G;
    Some(match code {
        0 => G::F32,
        1 => G::F16,
        2 => G::Q4_0,
        3 => G::Q4_1,
        6 => G::Q5_0,
        7 => G::Q5_1,
        8 => G::Q8_0,
        9 => G::Q8_1,
        10 => G::Q2K,
        11 => G::Q3K,
        12 => G::Q4K,
        13 => G::Q5K,
        14 => G::Q6K,
        15 => G::Q8K,
        30 => G::BF16,
        _ => return None,
    })
}

/// ggml's name of a type code candle does not read, where it has one.
fn other_ggml_type(code: u32) -> Option<&'static str> {
    Some(match code {
        4 => "Q4_2",
        5 => "Q4_3",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return None,
    })
}

/// The bytes of the header read so far and the file's length.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    file_len: u64,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes; `what` says what they hold, for the error of a file that ends before them.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Step<&'a [u8]> {
        let end = (self.at as u64).saturating_add(n);
        if end > self.file_len {
            return bad(format!(
                "{}: the file is truncated: it ends at byte {}, reading this needs bytes {}..{end}",
                what(),
                self.file_len,
                self.at
            ));
        }
        if end > self.bytes.len() as u64 {
            return Err(Stop::More);
        }
        let b = &self.bytes[self.at..end as usize];
        self.at = end as usize;
        Ok(b)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Step<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Step<u64> {
        let b = self.take(8, what)?;
        let mut x = [0u8; 8];
        x.copy_from_slice(b);
        Ok(u64::from_le_bytes(x))
    }

    /// A length-prefixed string's bytes.
    fn string(&mut self, what: &dyn Fn() -> String) -> Step<&'a [u8]> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return bad(format!(
                "{}: a string of {n} bytes (at most {MAX_STRING})",
                what()
            ));
        }
        self.take(n, what)
    }

    /// Skips one metadata value of type `t` of `key`, checking its type codes, lengths and booleans.
    fn value(&mut self, t: u32, key: &str, depth: usize) -> Step<()> {
        let what = || format!("metadata {}", shown(key));
        match (t, fixed_width(t)) {
            (7, _) => self.bools(1, key),
            (8, _) => self.string(&what).map(|_| ()),
            (9, _) => {
                if depth >= MAX_DEPTH {
                    return bad(format!("{}: arrays nested deeper than {MAX_DEPTH}", what()));
                }
                let et = self.u32(&what)?;
                let n = self.u64(&what)?;
                if n > MAX_ARRAY {
                    return bad(format!(
                        "{}: an array of {n} values (at most {MAX_ARRAY})",
                        what()
                    ));
                }
                match (et, fixed_width(et)) {
                    (7, _) => self.bools(n, key),
                    (_, Some(w)) if w > 0 => self.take(n.saturating_mul(w), &what).map(|_| ()),
                    (_, Some(_)) => (0..n).try_for_each(|_| self.value(et, key, depth + 1)),
                    (_, None) => bad(format!("{}: array of unknown value type {et}", what())),
                }
            }
            (_, Some(w)) => self.take(w, &what).map(|_| ()),
            (_, None) => bad(format!("{}: unknown value type {t}", what())),
        }
    }

    /// Skips `n` booleans of `key`, each 0 or 1.
    fn bools(&mut self, n: u64, key: &str) -> Step<()> {
        let b = self.take(n, &|| format!("metadata {}", shown(key)))?;
        match b.iter().find(|&&x| x > 1) {
            Some(x) => bad(format!("metadata {}: boolean value {x} (0 or 1)", shown(key))),
            None => Ok(()),
        }
    }
}

/// One tensor's info: its name, its shape in GGUF order (innermost first), block type and data offset.
struct Info {
    name: String,
    dims: Vec<u64>,
    dtype: GgmlDType,
    offset: u64,
}

/// Scans the GGUF header at the start of `head` (the first bytes of a file of `file_len` bytes): [`Scanned::More`]
/// when the header runs past `head`, Err with the reason (naming the key, tensor or what was being read) when the
/// file is refused.
pub(crate) fn scan(head: &[u8], file_len: u64) -> Result<Scanned, String> {
    let mut r = Reader {
        bytes: head,
        at: 0,
        file_len,
    };
    match scan_with(&mut r) {
        Ok(()) => Ok(Scanned::Sound),
        Err(Stop::More) => Ok(Scanned::More),
        Err(Stop::Bad(reason)) => Err(reason),
    }
}

fn scan_with(r: &mut Reader<'_>) -> Step<()> {
    let header = || "header".to_string();
    let magic = r.take(4, &header)?;
    if magic != b"GGUF" {
        return bad(format!(
            "header: not a GGUF file (magic {:?}, expected \"GGUF\")",
            String::from_utf8_lossy(magic)
        ));
    }
    let version = r.u32(&header)?;
    if !matches!(version, 2 | 3) {
        let big_endian = if matches!(version.swap_bytes(), 2 | 3) {
            ", and this file is big-endian"
        } else {
            ""
        };
        return bad(format!(
            "header: GGUF version {version} is not supported (versions 2 and 3 are read{big_endian})"
        ));
    }
    let n_tensors = r.u64(&header)?;
    let n_kvs = r.u64(&header)?;
    // Each entry takes some bytes at least (a metadata entry 13, a tensor info 24): counts the file cannot hold
    // are refused before any is read.
    let least = n_kvs
        .saturating_mul(13)
        .saturating_add(n_tensors.saturating_mul(24))
        .saturating_add(r.at as u64);
    if n_tensors > MAX_ARRAY || n_kvs > MAX_ARRAY || least > r.file_len {
        return bad(format!(
            "header: {n_tensors} tensors and {n_kvs} metadata entries need at least {least} bytes, the file has {} \
             (truncated, or corrupt counts)",
            r.file_len
        ));
    }
    let mut keys = HashSet::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kvs {
        let key = name_of(r.string(&|| format!("metadata entry {i}: key"))?);
        let what = || format!("metadata {}", shown(&key));
        let t = r.u32(&what)?;
        if key == ALIGNMENT_KEY {
            if t != 4 {
                return bad(format!(
                    "{ALIGNMENT_KEY}: stored as {} (type {t}), must be a u32",
                    type_name(t)
                ));
            }
            let a = r.u32(&what)?;
            if !a.is_power_of_two() {
                return bad(format!("{ALIGNMENT_KEY}: {a} is not a power of two"));
            }
            alignment = u64::from(a);
        } else {
            r.value(t, &key, 0)?;
        }
        if !keys.insert(key.clone()) {
            return bad(format!("metadata {}: the key appears twice", shown(&key)));
        }
    }
    let mut names = HashSet::new();
    let mut infos = Vec::new();
    for i in 0..n_tensors {
        let name = name_of(r.string(&|| format!("tensor info {i}: name"))?);
        let what = || format!("tensor info {i} ({})", shown(&name));
        let n_dims = r.u32(&what)?;
        if n_dims > MAX_DIMS {
            return bad(format!("{}: {n_dims} dimensions (at most {MAX_DIMS})", what()));
        }
        let dims = (0..n_dims).map(|_| r.u64(&what)).collect::<Step<Vec<u64>>>()?;
        let code = r.u32(&what)?;
        let offset = r.u64(&what)?;
        let Some(dtype) = ggml_type(code) else {
            let known = other_ggml_type(code)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            return bad(format!(
                "tensor {}: ggml type {code}{known} is not a block type this build reads",
                shown(&name)
            ));
        };
        if !names.insert(name.clone()) {
            return bad(format!("tensor {}: the name appears twice", shown(&name)));
        }
        infos.push(Info {
            name,
            dims,
            dtype,
            offset,
        });
    }
    check_data(&infos, r.at as u64, alignment, r.file_len)
}

/// Checks every tensor's data against the file: whole blocks per row, an offset that is a multiple of the
/// alignment, bytes inside the file and overlapping no other tensor's. `end_of_infos` is where the tensor infos end.
fn check_data(infos: &[Info], end_of_infos: u64, alignment: u64, file_len: u64) -> Step<()> {
    let data = end_of_infos.div_ceil(alignment).saturating_mul(alignment);
    let mut ranges = Vec::with_capacity(infos.len());
    for t in infos {
        let name = shown(&t.name);
        let block = t.dtype.block_size() as u64;
        let row = t.dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(block) {
            return bad(format!(
                "tensor {name}: rows of {row} elements are not whole {:?} blocks of {block}",
                t.dtype
            ));
        }
        let bytes = t
            .dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| (n / block).checked_mul(t.dtype.type_size() as u64))
            .filter(|&b| usize::try_from(b).is_ok());
        let Some(bytes) = bytes else {
            return bad(format!("tensor {name}: shape {:?} is too large", t.dims));
        };
        if !t.offset.is_multiple_of(alignment) {
            return bad(format!(
                "tensor {name}: data offset {} is not a multiple of the alignment {alignment}",
                t.offset
            ));
        }
        let start = data.checked_add(t.offset);
        match start.and_then(|s| Some((s, s.checked_add(bytes)?))) {
            Some((start, end)) if end <= file_len => ranges.push((start, end, name)),
            _ => {
                return bad(format!(
                    "tensor {name}: data of {bytes} bytes at byte {} extends past the end of the file ({file_len} \
                     bytes): the file is truncated",
                    data.saturating_add(t.offset)
                ));
            }
        }
    }
    ranges.retain(|r| r.0 < r.1);
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let ((a0, a1, a), (b0, b1, b)) = (&pair[0], &pair[1]);
        if b0 < a1 {
            return bad(format!(
                "tensor {b}: data at bytes {b0}..{b1} overlaps tensor {a}'s ({a0}..{a1})"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Scanned, scan};

    /// A GGUF v3 header with no tensors and the given metadata (key, type, value bytes).
    pub(crate) fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
        for (k, t, v) in kvs {
            b.extend_from_slice(&(k.len() as u64).to_le_bytes());
            b.extend_from_slice(k.as_bytes());
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(v);
        }
        b
    }

    fn string(s: &str) -> Vec<u8> {
        [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat()
    }

    /// An alignment of 0 (or any other that is not a power of two) is refused naming the key, where the parser
    /// would divide by it; the scan skips strings, arrays of strings and numbers to reach it.
    #[test]
    fn a_bad_alignment_is_named_not_divided_by() {
        let mut strings = 8u32.to_le_bytes().to_vec(); // array of 8 (strings), two of them
        strings.extend_from_slice(&2u64.to_le_bytes());
        strings.extend(string("ab"));
        strings.extend(string("c"));
        let before = [
            ("general.name", 8u32, string("tiny")),
            ("tokens", 9, strings),
            ("x", 12, 1.5f64.to_le_bytes().to_vec()),
        ];
        for (a, ok) in [(0u32, false), (3, false), (32, true), (1, true)] {
            let mut kvs = before.to_vec();
            kvs.push(("general.alignment", 4, a.to_le_bytes().to_vec()));
            let bytes = header(&kvs);
            match scan(&bytes, bytes.len() as u64) {
                Ok(s) => {
                    assert!(ok, "alignment {a} accepted");
                    assert_eq!(s, Scanned::Sound);
                }
                Err(e) => {
                    assert!(!ok, "alignment {a}: {e}");
                    assert_eq!(e, format!("general.alignment: {a} is not a power of two"));
                }
            }
            // Cut short of a longer file, the header asks for more; cut short of its own end, it is truncated.
            assert_eq!(scan(&bytes[..30], bytes.len() as u64), Ok(Scanned::More));
            let e = scan(&bytes[..30], 30).unwrap_err();
            assert!(e.starts_with("header: ") && e.contains("truncated"), "{e}");
            let cut = bytes.len() - 2;
            let e = scan(&bytes[..cut], cut as u64).unwrap_err();
            let needed = format!(
                "ends at byte {cut}, reading this needs bytes {}..{}",
                cut - 2,
                cut + 2
            );
            assert!(
                e.starts_with("metadata general.alignment: the file is truncated"),
                "{e}"
            );
            assert!(e.contains(&needed), "{e}");
        }
    }
}
