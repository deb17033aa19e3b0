//! Validated relative paths for package artifacts and archive members.
//!
//! A path from a manifest or an archive is attacker-controlled and will be joined to a directory
//! on disk, so it becomes an [`ArtifactPath`] before anything else looks at it. The grammar is
//! deliberately narrow (portable characters, bounded lengths, no `.`/`..`, nothing absolute) so
//! that one rule set is safe on every file system the host supports, and a case-folded key lets
//! callers refuse two paths that a case-insensitive file system would merge.

use std::fmt;

/// Longest accepted path, in bytes.
pub const MAX_PATH_LEN: usize = 255;
/// Most `/`-separated components a path may have.
pub const MAX_COMPONENTS: usize = 16;
/// Longest accepted component, in bytes.
pub const MAX_COMPONENT_LEN: usize = 100;
/// The archive member that holds the manifest; no artifact may take its name.
pub const RESERVED_METADATA_NAME: &str = ".gkmetadata";

/// How much of an offending path an error keeps, in characters, so that a hostile input cannot
/// make error messages arbitrarily large.
const ERROR_PATH_CHARS: usize = 300;

/// The rule an invalid path breaks. Checked in the order listed, and the first broken rule is
/// reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRule {
    /// The path is the empty string.
    #[error("is empty")]
    Empty,
    /// The path contains a NUL byte.
    #[error("contains a NUL byte")]
    Nul,
    /// The path contains a backslash, a separator on Windows.
    #[error("contains a backslash; use '/' as the separator")]
    Backslash,
    /// The path starts with `/`.
    #[error("is absolute; it must be relative to the package root")]
    Absolute,
    /// The path is longer than [`MAX_PATH_LEN`] bytes.
    #[error("is {len} bytes long; the limit is {MAX_PATH_LEN}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The path has more than [`MAX_COMPONENTS`] components.
    #[error("has {count} components; the limit is {MAX_COMPONENTS}")]
    TooManyComponents {
        /// How many components it has.
        count: usize,
    },
    /// Two separators in a row, or a trailing separator.
    #[error("has an empty component")]
    EmptyComponent,
    /// A `.` component.
    #[error("has a '.' component")]
    DotComponent,
    /// A `..` component.
    #[error("has a '..' component")]
    DotDotComponent,
    /// A component longer than [`MAX_COMPONENT_LEN`] bytes.
    #[error("has component {component:?} of {len} bytes; the limit is {MAX_COMPONENT_LEN}")]
    ComponentTooLong {
        /// The component.
        component: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9._+-]` and `/`.
    #[error(
        "contains {found:?} at byte {at}; allowed are A-Z, a-z, 0-9, '.', '_', '+', '-' and '/'"
    )]
    BadCharacter {
        /// The character.
        found: char,
        /// Its byte offset.
        at: usize,
    },
    /// A component is the manifest's own name, [`RESERVED_METADATA_NAME`], in any case and at
    /// any depth.
    #[error("uses the reserved name {RESERVED_METADATA_NAME:?}")]
    Reserved,
}

/// A path that is not a valid [`ArtifactPath`]: the path (cut to 300 characters) and the rule it
/// breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("artifact path {path:?} {rule}")]
pub struct ArtifactPathError {
    /// The offending path, possibly shortened.
    pub path: String,
    /// The first rule it breaks.
    pub rule: PathRule,
}

/// A relative, `/`-separated path of one to [`MAX_COMPONENTS`] components, each made of
/// `[A-Za-z0-9._+-]` and at most [`MAX_COMPONENT_LEN`] bytes, at most [`MAX_PATH_LEN`] bytes in
/// total, with no empty, `.` or `..` component, and no component that is the reserved manifest
/// name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ArtifactPath(String);

impl ArtifactPath {
    /// Validates `path` and wraps it.
    pub fn new(path: impl Into<String>) -> Result<Self, ArtifactPathError> {
        let path = path.into();
        match check(&path) {
            Ok(()) => Ok(ArtifactPath(path)),
            Err(rule) => Err(ArtifactPathError {
                path: path.chars().take(ERROR_PATH_CHARS).collect(),
                rule,
            }),
        }
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `/`-separated components, in order.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The key under which two paths collide on a case-insensitive file system. The grammar is
    /// ASCII-only, so ASCII lowercasing is the whole of case folding here.
    pub fn collision_key(&self) -> String {
        self.0.to_ascii_lowercase()
    }
}

fn check(path: &str) -> Result<(), PathRule> {
    if path.is_empty() {
        return Err(PathRule::Empty);
    }
    if path.contains('\0') {
        return Err(PathRule::Nul);
    }
    if path.contains('\\') {
        return Err(PathRule::Backslash);
    }
    if path.starts_with('/') {
        return Err(PathRule::Absolute);
    }
    if path.len() > MAX_PATH_LEN {
        return Err(PathRule::TooLong { len: path.len() });
    }
    let count = path.split('/').count();
    if count > MAX_COMPONENTS {
        return Err(PathRule::TooManyComponents { count });
    }
    for component in path.split('/') {
        match component {
            "" => return Err(PathRule::EmptyComponent),
            "." => return Err(PathRule::DotComponent),
            ".." => return Err(PathRule::DotDotComponent),
            c if c.len() > MAX_COMPONENT_LEN => {
                return Err(PathRule::ComponentTooLong {
                    component: c.to_owned(),
                    len: c.len(),
                })
            }
            _ => {}
        }
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-' | '/');
    if let Some((at, found)) = path.char_indices().find(|&(_, c)| !allowed(c)) {
        return Err(PathRule::BadCharacter { found, at });
    }
    // Refused in any case spelling, since on a case-insensitive file system `.GKMetadata` would
    // overwrite the manifest, and at any depth, so that no tool that looks for a manifest in a
    // subdirectory of an installed tree (or a tree copied somewhere) finds an unsigned one.
    if path
        .split('/')
        .any(|c| c.eq_ignore_ascii_case(RESERVED_METADATA_NAME))
    {
        return Err(PathRule::Reserved);
    }
    Ok(())
}

impl fmt::Display for ArtifactPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ArtifactPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ArtifactPath {
    type Err = ArtifactPathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for ArtifactPath {
    type Error = ArtifactPathError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(path: &str) -> PathRule {
        ArtifactPath::new(path).unwrap_err().rule
    }

    #[test]
    fn accepts_ordinary_relative_paths() {
        for ok in [
            "lib/libscan.so",
            "a",
            "x86_64/libfoo+cuda-1.2.so",
            "...",
            "a/.hidden",
            "sub/.gkmetadata2",
            "sub/x.gkmetadata",
        ] {
            assert_eq!(ArtifactPath::new(ok).unwrap().as_str(), ok);
        }
        let deepest = vec!["d"; MAX_COMPONENTS].join("/");
        assert!(ArtifactPath::new(deepest).is_ok());
        let longest = format!("{}/{}/{}", "a".repeat(100), "b".repeat(100), "c".repeat(53));
        assert_eq!(longest.len(), MAX_PATH_LEN);
        assert!(ArtifactPath::new(longest).is_ok());
    }

    #[test]
    fn names_each_broken_rule() {
        assert_eq!(rule(""), PathRule::Empty);
        assert_eq!(rule("a\0b"), PathRule::Nul);
        assert_eq!(rule("lib\\a.so"), PathRule::Backslash);
        assert_eq!(rule("/etc/passwd"), PathRule::Absolute);
        assert_eq!(rule(&"a".repeat(256)), PathRule::TooLong { len: 256 });
        assert_eq!(
            rule(&vec!["d"; 17].join("/")),
            PathRule::TooManyComponents { count: 17 }
        );
        assert_eq!(rule("a//b"), PathRule::EmptyComponent);
        assert_eq!(rule("a/"), PathRule::EmptyComponent);
        assert_eq!(rule("./a"), PathRule::DotComponent);
        assert_eq!(rule("a/../../b"), PathRule::DotDotComponent);
        assert_eq!(
            rule(&format!("x/{}", "c".repeat(101))),
            PathRule::ComponentTooLong {
                component: "c".repeat(101),
                len: 101
            }
        );
        assert_eq!(
            rule("lib/a b.so"),
            PathRule::BadCharacter { found: ' ', at: 5 }
        );
        assert_eq!(
            rule("lib/é.so"),
            PathRule::BadCharacter { found: 'é', at: 4 }
        );
        assert_eq!(rule("C:x"), PathRule::BadCharacter { found: ':', at: 1 });
        assert_eq!(rule(".gkmetadata"), PathRule::Reserved);
        assert_eq!(rule(".GKMetadata"), PathRule::Reserved);
        assert_eq!(rule("sub/.gkmetadata"), PathRule::Reserved);
        assert_eq!(rule("lib/.GKMETADATA"), PathRule::Reserved);
        assert_eq!(rule(".gkmetadata/lib.so"), PathRule::Reserved);
    }

    #[test]
    fn error_names_the_path() {
        let e = ArtifactPath::new("a/../b").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"artifact path "a/../b" has a '..' component"#
        );
    }

    #[test]
    fn collision_key_folds_case() {
        let a = ArtifactPath::new("Lib/Scan.so").unwrap();
        let b = ArtifactPath::new("lib/scan.SO").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.collision_key(), b.collision_key());
        assert_eq!(a.components().collect::<Vec<_>>(), ["Lib", "Scan.so"]);
    }
}
