//! Proves that the Rust mirror and the C headers describe the same ABI.
//!
//! Three checks, each of which fails on any drift:
//! 1. Coverage: every struct declared in `abi-headers/include/guild/abi/*.h` has a Rust entry with
//!    the same fields in the same order, and every value constant (`#define GUILD_...`) has a Rust
//!    counterpart. The header side is read by a small parser, so a struct or field added to a
//!    header without a mirror fails here.
//! 2. Layout: a generated C program prints `sizeof`, `_Alignof` and `offsetof` of every struct and
//!    field as the C compiler lays them out; each is compared with `size_of`, `align_of` and
//!    `offset_of!` on the Rust side.
//! 3. Values: the same program prints every constant, compared with the Rust value.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One struct as Rust lays it out.
pub struct StructLayout {
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: Vec<(&'static str, usize)>,
}

/// A constant's value, integer or string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstVal {
    Int(i128),
    Str(String),
}

/// Converts a Rust constant into a comparable value.
pub trait IntoConstVal {
    fn into_const_val(self) -> ConstVal;
}

macro_rules! int_const_val {
    ($($t:ty),*) => {$(
        impl IntoConstVal for $t {
            fn into_const_val(self) -> ConstVal {
                ConstVal::Int(self as i128)
            }
        }
    )*};
}
int_const_val!(u8, u16, u32, u64, i8, i16, i32, i64, usize);

impl IntoConstVal for &std::ffi::CStr {
    fn into_const_val(self) -> ConstVal {
        ConstVal::Str(
            self.to_str()
                .expect("constant strings are ASCII")
                .to_owned(),
        )
    }
}

impl IntoConstVal for &str {
    fn into_const_val(self) -> ConstVal {
        ConstVal::Str(self.to_owned())
    }
}

/// `layout!(guild_x_t { a, b, c })` records the Rust layout of a mirrored struct.
#[macro_export]
macro_rules! layout {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        $crate::layout::StructLayout {
            name: stringify!($ty),
            size: ::std::mem::size_of::<$ty>(),
            align: ::std::mem::align_of::<$ty>(),
            fields: vec![$((stringify!($field), ::std::mem::offset_of!($ty, $field))),*],
        }
    };
}

/// `consts![GUILD_A, GUILD_B]` records Rust constants by name.
#[macro_export]
macro_rules! consts {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $crate::layout::IntoConstVal::into_const_val($name))),*]
    };
}

fn headers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../abi-headers/include")
}

fn header_files() -> Vec<PathBuf> {
    let dir = headers_dir().join("guild/abi");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    files.sort();
    files
}

/// What the header parser found.
#[derive(Default, Debug)]
pub struct HeaderFacts {
    /// Struct name -> field names in declaration order.
    pub structs: BTreeMap<String, Vec<String>>,
    /// Value constants: name -> is it a string literal.
    pub constants: BTreeMap<String, bool>,
}

/// Removes comments and joins continued lines, keeping string literals intact.
fn strip_comments(src: &str) -> String {
    let src = src.replace("\\\n", " ");
    let bytes = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str(&src[start..i.min(bytes.len())]);
        } else if bytes[i..].starts_with(b"/*") {
            let end = src[i + 2..].find("*/").expect("unterminated comment") + i + 4;
            out.push(' ');
            i = end;
        } else if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else {
            let ch = src[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn tokenize(src: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = src.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else {
            tokens.push(c.to_string());
            i += 1;
        }
    }
    tokens
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// Names of object-like macros that are not values: include guards and attribute helpers.
fn is_value_constant(name: &str) -> bool {
    name.starts_with("GUILD_") && !name.ends_with("_H") && !name.starts_with("GUILD_ATTR_")
}

/// Parses the declarations the layout test needs out of one header.
///
/// The headers keep to a plain style that this parser enforces: every struct is
/// `typedef struct NAME { ... } NAME;`, one declarator per field, no nested struct or union bodies
/// and no bit-fields. Anything else is reported as a parse failure rather than silently skipped.
pub fn parse_header(src: &str, facts: &mut HeaderFacts) -> Result<(), String> {
    let src = strip_comments(src);
    let mut code = String::new();
    for line in src.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix('#') {
            let rest = rest.trim_start();
            if let Some(def) = rest.strip_prefix("define") {
                let def = def.trim_start();
                let name_len = def
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(def.len());
                let name = &def[..name_len];
                let function_like = def[name_len..].starts_with('(');
                let body = def[name_len..].trim();
                if !function_like && !body.is_empty() && is_value_constant(name) {
                    facts
                        .constants
                        .insert(name.to_owned(), body.starts_with('"'));
                }
            }
            continue;
        }
        code.push_str(line);
        code.push('\n');
    }
    let tokens = tokenize(&code);
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "union" && tokens.get(i + 2).is_some_and(|t| t == "{") {
            return Err(format!(
                "union {} is not supported by the layout check",
                tokens[i + 1]
            ));
        }
        if tokens[i] == "typedef" && tokens.get(i + 1).is_some_and(|t| t == "struct") {
            let tag = tokens.get(i + 2).cloned().unwrap_or_default();
            if tokens.get(i + 3).map(String::as_str) != Some("{") {
                i += 3; // An opaque forward declaration: nothing to lay out.
                continue;
            }
            let mut j = i + 4;
            let mut depth = 0usize;
            let mut decl: Vec<String> = Vec::new();
            let mut fields = Vec::new();
            loop {
                let t = tokens
                    .get(j)
                    .ok_or_else(|| format!("struct {tag}: unterminated body"))?;
                match t.as_str() {
                    "{" => {
                        return Err(format!(
                            "struct {tag}: nested struct/union bodies are not allowed"
                        ))
                    }
                    "}" if depth == 0 => break,
                    "(" | "[" => depth += 1,
                    ")" | "]" => depth -= 1,
                    ";" if depth == 0 => {
                        fields.push(field_name(&tag, &decl)?);
                        decl.clear();
                        j += 1;
                        continue;
                    }
                    _ => {}
                }
                decl.push(t.clone());
                j += 1;
            }
            let name = tokens.get(j + 1).cloned().unwrap_or_default();
            if name != tag {
                return Err(format!("struct tag {tag} and typedef name {name} differ"));
            }
            if facts.structs.insert(name.clone(), fields).is_some() {
                return Err(format!("struct {name} is declared twice"));
            }
            i = j + 2;
            continue;
        }
        i += 1;
    }
    Ok(())
}

/// The declared name of one field declaration (tokens up to its `;`).
fn field_name(tag: &str, decl: &[String]) -> Result<String, String> {
    let text = decl.join(" ");
    if decl.iter().any(|t| t == ",") && !decl.iter().any(|t| t == "(") {
        return Err(format!(
            "struct {tag}: one declarator per field please: {text}"
        ));
    }
    if decl.iter().any(|t| t == ":") {
        return Err(format!("struct {tag}: bit-fields are not allowed: {text}"));
    }
    // Function pointer: `ret ( * name ) ( args )`.
    if let Some(p) = decl
        .windows(3)
        .position(|w| w[0] == "(" && w[1] == "*" && is_ident(&w[2]))
    {
        return Ok(decl[p + 2].clone());
    }
    // Otherwise the last identifier outside brackets.
    let mut depth = 0;
    let mut last = None;
    for t in decl {
        match t.as_str() {
            "[" => depth += 1,
            "]" => depth -= 1,
            _ if depth == 0 && is_ident(t) => last = Some(t.clone()),
            _ => {}
        }
    }
    last.ok_or_else(|| format!("struct {tag}: cannot find the field name in: {text}"))
}

fn parse_all_headers() -> HeaderFacts {
    let mut facts = HeaderFacts::default();
    for file in header_files() {
        let src = std::fs::read_to_string(&file).unwrap();
        parse_header(&src, &mut facts).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
    facts
}

fn rust_structs() -> Vec<StructLayout> {
    let mut all = crate::layout_core::structs();
    all.extend(crate::layout_ext::structs());
    all
}

fn rust_constants() -> Vec<(&'static str, ConstVal)> {
    let mut all = crate::layout_core::constants();
    all.extend(crate::layout_ext::constants());
    all
}

/// Generates, compiles and runs the C program; returns its output lines.
fn c_layout_report(facts: &HeaderFacts) -> String {
    let mut c = String::from("#include <stddef.h>\n#include <stdio.h>\n#include <stdint.h>\n");
    for file in header_files() {
        c.push_str(&format!(
            "#include \"guild/abi/{}\"\n",
            file.file_name().unwrap().to_string_lossy()
        ));
    }
    c.push_str("int main(void) {\n");
    for (name, fields) in &facts.structs {
        c.push_str(&format!(
            "  printf(\"S {name} %zu %zu\\n\", sizeof({name}), (size_t)_Alignof({name}));\n"
        ));
        for f in fields {
            c.push_str(&format!(
                "  printf(\"F {name}.{f} %zu\\n\", offsetof({name}, {f}));\n"
            ));
        }
    }
    for (name, is_str) in &facts.constants {
        if *is_str {
            c.push_str(&format!("  printf(\"T {name} %s\\n\", {name});\n"));
        } else {
            c.push_str(&format!(
                "  {{ long double v = (long double)({name}); if (v < 0) printf(\"C {name} -%llu\\n\", (unsigned long long)(-(long long)({name}))); else printf(\"C {name} %llu\\n\", (unsigned long long)({name})); }}\n"
            ));
        }
    }
    c.push_str("  return 0;\n}\n");

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("abi-layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-O0", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(headers_dir())
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        out.status.success(),
        "compiling the layout probe failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout).unwrap()
}

#[test]
fn rust_mirror_matches_the_c_headers() {
    let facts = parse_all_headers();
    assert!(!facts.structs.is_empty(), "no structs found in the headers");
    let rust = rust_structs();
    let consts = rust_constants();
    let mut problems = Vec::new();

    // Coverage, both directions.
    let rust_names: BTreeSet<&str> = rust.iter().map(|s| s.name).collect();
    for name in facts.structs.keys() {
        if !rust_names.contains(name.as_str()) {
            problems.push(format!(
                "struct {name} is in the headers but has no Rust layout entry"
            ));
        }
    }
    for s in &rust {
        match facts.structs.get(s.name) {
            None => problems.push(format!(
                "struct {} has a Rust entry but is not in the headers",
                s.name
            )),
            Some(fields) => {
                let rf: Vec<&str> = s.fields.iter().map(|f| f.0).collect();
                if rf != fields.iter().map(String::as_str).collect::<Vec<_>>() {
                    problems.push(format!(
                        "struct {}: fields differ\n  C:    {fields:?}\n  Rust: {rf:?}",
                        s.name
                    ));
                }
            }
        }
    }
    let rust_consts: BTreeMap<&str, &ConstVal> = consts.iter().map(|(n, v)| (*n, v)).collect();
    for name in facts.constants.keys() {
        if !rust_consts.contains_key(name.as_str()) {
            problems.push(format!(
                "constant {name} is in the headers but not checked against Rust"
            ));
        }
    }
    for name in rust_consts.keys() {
        if !facts.constants.contains_key(*name) {
            problems.push(format!(
                "constant {name} is checked in Rust but not defined in the headers"
            ));
        }
    }

    // Layout and values as the C compiler sees them.
    let report = c_layout_report(&facts);
    let mut c_structs: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut c_fields: BTreeMap<&str, usize> = BTreeMap::new();
    let mut c_consts: BTreeMap<&str, ConstVal> = BTreeMap::new();
    for line in report.lines() {
        let mut parts = line.splitn(3, ' ');
        let (kind, name, rest) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap_or(""),
        );
        match kind {
            "S" => {
                let (size, align) = rest.split_once(' ').unwrap();
                c_structs.insert(name, (size.parse().unwrap(), align.parse().unwrap()));
            }
            "F" => {
                c_fields.insert(name, rest.parse().unwrap());
            }
            "C" => {
                let v: i128 = match rest.strip_prefix('-') {
                    Some(mag) => -mag.parse::<i128>().unwrap(),
                    None => rest.parse().unwrap(),
                };
                c_consts.insert(name, ConstVal::Int(v));
            }
            "T" => {
                c_consts.insert(name, ConstVal::Str(rest.to_owned()));
            }
            _ => panic!("unexpected probe line {line:?}"),
        }
    }
    let mut field_count = 0;
    for s in &rust {
        let Some(&(size, align)) = c_structs.get(s.name) else {
            continue;
        };
        if (size, align) != (s.size, s.align) {
            problems.push(format!(
                "struct {}: C size/align {size}/{align}, Rust {}/{}",
                s.name, s.size, s.align
            ));
        }
        for (f, off) in &s.fields {
            field_count += 1;
            let key = format!("{}.{f}", s.name);
            if let Some(&c_off) = c_fields.get(key.as_str()) {
                if c_off != *off {
                    problems.push(format!("field {key}: C offset {c_off}, Rust {off}"));
                }
            }
        }
    }
    for (name, v) in &consts {
        if let Some(c) = c_consts.get(name) {
            if c != v {
                problems.push(format!("constant {name}: C {c:?}, Rust {v:?}"));
            }
        }
    }

    eprintln!(
        "abi layout: {} structs, {} fields, {} constants checked against the C compiler",
        rust.len(),
        field_count,
        consts.len()
    );
    assert!(
        problems.is_empty(),
        "{} ABI mismatches:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn parser_refuses_what_it_cannot_check() {
    let mut f = HeaderFacts::default();
    let err = parse_header("typedef struct a { int x : 3; } a;", &mut f).unwrap_err();
    assert!(err.contains("bit-fields"), "{err}");
    let err = parse_header("typedef struct b { int x, y; } b;", &mut f).unwrap_err();
    assert!(err.contains("one declarator"), "{err}");
    let err = parse_header("typedef struct c { struct { int x; } in; } c;", &mut f).unwrap_err();
    assert!(err.contains("nested"), "{err}");
    let err = parse_header("typedef struct d { int x; } e;", &mut f).unwrap_err();
    assert!(err.contains("differ"), "{err}");
}

#[test]
fn parser_reads_fields_and_constants() {
    let mut f = HeaderFacts::default();
    parse_header(
        "#ifndef X_H\n#define X_H\n#define GUILD_A 3u /* c */\n#define GUILD_S \"sym\"\n\
         #define GUILD_F(x) (x)\n#define GUILD_ATTR_HIDDEN\n\
         typedef struct guild_opaque_s guild_opaque_t;\n\
         typedef struct t { uint32_t a; char msg[256]; int (*cb)(void* u, int n); const char* const* names; } t;\n#endif\n",
        &mut f,
    )
    .unwrap();
    assert_eq!(f.structs["t"], ["a", "msg", "cb", "names"]);
    assert_eq!(f.constants.len(), 2);
    assert!(f.constants["GUILD_S"]);
    assert!(!f.constants["GUILD_A"]);
}
