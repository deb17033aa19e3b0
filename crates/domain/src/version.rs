//! Versions: the packed 8/12/12 Kernel ABI (and operation) version, semantic package versions, and
//! the inclusive ranges and intervals the host compares them with.

use std::fmt;

pub use semver::{Version, VersionReq};

/// A version packed into 32 bits as the C headers do (`GUILD_KERNEL_ABI_MAKE_VERSION`): major in bits
/// 24–31, minor in bits 12–23, patch in bits 0–11. Kernel ABI 1.0.0 is `0x0100_0000`. GOP1 operation
/// semantic versions use the same packing.
///
/// Ordering of the packed integer equals ordering by (major, minor, patch), which is why the derived
/// `Ord` on the raw value is correct.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackedVersion(u32);

/// Why a version could not be packed or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// A component does not fit its bits in the packing.
    #[error("{part} {value} does not fit in {bits} bits (largest is {max})")]
    ComponentTooLarge {
        /// Which component (major, minor, patch).
        part: &'static str,
        /// The value given.
        value: u64,
        /// The bits it has.
        bits: u32,
        /// The largest value that fits.
        max: u32,
    },
    /// Not three dot-separated decimal numbers.
    #[error("{text:?} is not a MAJOR.MINOR.PATCH version")]
    Malformed {
        /// The text given.
        text: String,
    },
    /// The lower bound is above the upper bound.
    #[error("range {min}..={max} is empty: its lower bound is above its upper bound")]
    EmptyRange {
        /// The lower bound.
        min: String,
        /// The upper bound.
        max: String,
    },
    /// An operation-version interval whose bounds have different majors.
    #[error("interval {min}..={max} crosses a major version; operation intervals must stay within one major")]
    CrossesMajor {
        /// The lower bound.
        min: PackedVersion,
        /// The upper bound.
        max: PackedVersion,
    },
}

impl PackedVersion {
    /// The largest major version (8 bits).
    pub const MAX_MAJOR: u32 = 0xff;
    /// The largest minor version (12 bits).
    pub const MAX_MINOR: u32 = 0xfff;
    /// The largest patch version (12 bits).
    pub const MAX_PATCH: u32 = 0xfff;

    /// Kernel ABI 1.0.0, the only major this host implements.
    pub const KERNEL_ABI_V1: PackedVersion = PackedVersion(0x0100_0000);

    /// Packs the three components, refusing any that does not fit its field.
    pub fn new(major: u32, minor: u32, patch: u32) -> Result<Self, VersionError> {
        fn check(part: &'static str, value: u32, bits: u32, max: u32) -> Result<(), VersionError> {
            if value > max {
                return Err(VersionError::ComponentTooLarge {
                    part,
                    value: value.into(),
                    bits,
                    max,
                });
            }
            Ok(())
        }
        check("major", major, 8, Self::MAX_MAJOR)?;
        check("minor", minor, 12, Self::MAX_MINOR)?;
        check("patch", patch, 12, Self::MAX_PATCH)?;
        Ok(PackedVersion((major << 24) | (minor << 12) | patch))
    }

    /// Wraps a packed value as read from a C struct. Every `u32` is a valid packing.
    pub const fn from_raw(raw: u32) -> Self {
        PackedVersion(raw)
    }

    /// The packed value, as the C headers store it.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The major version (bits 24 to 31).
    pub const fn major(self) -> u32 {
        self.0 >> 24
    }

    /// The minor version (bits 12 to 23).
    pub const fn minor(self) -> u32 {
        (self.0 >> 12) & 0xfff
    }

    /// The patch version (bits 0 to 11).
    pub const fn patch(self) -> u32 {
        self.0 & 0xfff
    }

    /// Parses `MAJOR.MINOR.PATCH` with plain decimal components (no sign, no leading `+`, at most
    /// one leading zero only for the value 0).
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let malformed = || VersionError::Malformed {
            text: text.chars().take(40).collect(),
        };
        let mut parts = text.split('.');
        let mut next = || -> Result<u32, VersionError> {
            let p = parts.next().ok_or_else(malformed)?;
            let valid = !p.is_empty()
                && p.len() <= 5
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p == "0" || !p.starts_with('0'));
            if !valid {
                return Err(malformed());
            }
            p.parse().map_err(|_| malformed())
        };
        let (major, minor, patch) = (next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(malformed());
        }
        Self::new(major, minor, patch)
    }
}

impl fmt::Display for PackedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.patch())
    }
}

impl fmt::Debug for PackedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackedVersion({self} = {:#010x})", self.0)
    }
}

/// An inclusive range of packed versions, as a manifest's or descriptor's Kernel ABI range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AbiRange {
    min: PackedVersion,
    max: PackedVersion,
}

impl AbiRange {
    /// Builds `min..=max`, refusing an empty range.
    pub fn new(min: PackedVersion, max: PackedVersion) -> Result<Self, VersionError> {
        if min > max {
            return Err(VersionError::EmptyRange {
                min: min.to_string(),
                max: max.to_string(),
            });
        }
        Ok(AbiRange { min, max })
    }

    /// The lower bound.
    pub fn min(&self) -> PackedVersion {
        self.min
    }

    /// The upper bound.
    pub fn max(&self) -> PackedVersion {
        self.max
    }

    /// Whether `v` lies within the range, bounds included.
    pub fn contains(&self, v: PackedVersion) -> bool {
        self.min <= v && v <= self.max
    }
}

impl fmt::Display for AbiRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// An inclusive interval of operation versions within one major version, as an operation query
/// asks for (`1.2.0..=1.9.0`). A provider's operation version must fall inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpVersionInterval {
    min: PackedVersion,
    max: PackedVersion,
}

impl OpVersionInterval {
    /// Builds `min..=max`, refusing an empty interval or one that spans two majors.
    #[inline]
    pub fn new(min: PackedVersion, max: PackedVersion) -> Result<Self, VersionError> {
        if min > max {
            return Err(VersionError::EmptyRange {
                min: min.to_string(),
                max: max.to_string(),
            });
        }
        if min.major() != max.major() {
            return Err(VersionError::CrossesMajor { min, max });
        }
        Ok(OpVersionInterval { min, max })
    }

    /// The lower bound.
    pub fn min(&self) -> PackedVersion {
        self.min
    }

    /// The upper bound.
    pub fn max(&self) -> PackedVersion {
        self.max
    }

    /// Whether `v` lies within the interval, bounds included.
    pub fn contains(&self, v: PackedVersion) -> bool {
        self.min <= v && v <= self.max
    }
}

impl fmt::Display for OpVersionInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// An inclusive range of semantic package versions with an optional upper bound, as a dependency
/// declares it (`min_version`, `max_version`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VersionRange {
    min: Version,
    max: Option<Version>,
}

impl VersionRange {
    /// Builds `min..=max` (or `min..` without an upper bound), refusing an empty range.
    pub fn new(min: Version, max: Option<Version>) -> Result<Self, VersionError> {
        if let Some(max) = &max {
            // Precedence, as `contains` uses, so that build metadata never makes a range empty.
            if min.cmp_precedence(max) == std::cmp::Ordering::Greater {
                return Err(VersionError::EmptyRange {
                    min: min.to_string(),
                    max: max.to_string(),
                });
            }
        }
        Ok(VersionRange { min, max })
    }

    /// The lower bound.
    pub fn min(&self) -> &Version {
        &self.min
    }

    /// The upper bound, if there is one.
    pub fn max(&self) -> Option<&Version> {
        self.max.as_ref()
    }

    /// Whether `v` lies within the range, bounds included. Semantic-version precedence applies
    /// (pre-releases sort before their release); build metadata is ignored as semver says.
    pub fn contains(&self, v: &Version) -> bool {
        use std::cmp::Ordering;
        let above_min = v.cmp_precedence(&self.min) != Ordering::Less;
        let below_max = self
            .max
            .as_ref()
            .is_none_or(|m| v.cmp_precedence(m) != Ordering::Greater);
        above_min && below_max
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.max {
            Some(max) => write!(f, "{}..={}", self.min, max),
            None => write!(f, "{}..", self.min),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_v1_packs_as_the_headers_say() {
        assert_eq!(PackedVersion::new(1, 0, 0).unwrap().raw(), 0x0100_0000);
        assert_eq!(PackedVersion::KERNEL_ABI_V1.to_string(), "1.0.0");
        let v = PackedVersion::new(255, 4095, 4095).unwrap();
        assert_eq!(v.raw(), u32::MAX);
        assert_eq!((v.major(), v.minor(), v.patch()), (255, 4095, 4095));
    }

    #[test]
    fn packing_refuses_overflowing_components() {
        assert!(matches!(
            PackedVersion::new(256, 0, 0),
            Err(VersionError::ComponentTooLarge { part: "major", .. })
        ));
        assert!(matches!(
            PackedVersion::new(1, 4096, 0),
            Err(VersionError::ComponentTooLarge { part: "minor", .. })
        ));
        assert!(matches!(
            PackedVersion::new(1, 0, 4096),
            Err(VersionError::ComponentTooLarge { part: "patch", .. })
        ));
    }

    #[test]
    fn parse_accepts_plain_triples_only() {
        assert_eq!(
            PackedVersion::parse("1.2.3").unwrap(),
            PackedVersion::new(1, 2, 3).unwrap()
        );
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "+1.2.3",
            "1.-2.3",
            "1.2.x",
            "1..3",
            "999999.0.0",
        ] {
            assert!(
                PackedVersion::parse(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
        assert!(matches!(
            PackedVersion::parse("256.0.0"),
            Err(VersionError::ComponentTooLarge { .. })
        ));
    }

    #[test]
    fn ranges_are_inclusive_and_never_empty() {
        let v = |s| PackedVersion::parse(s).unwrap();
        let r = AbiRange::new(v("1.0.0"), v("1.2.0")).unwrap();
        assert!(r.contains(v("1.0.0")) && r.contains(v("1.2.0")) && r.contains(v("1.1.7")));
        assert!(!r.contains(v("1.2.1")) && !r.contains(v("0.9.9")));
        assert!(matches!(
            AbiRange::new(v("2.0.0"), v("1.0.0")),
            Err(VersionError::EmptyRange { .. })
        ));
        assert!(matches!(
            OpVersionInterval::new(v("1.0.0"), v("2.0.0")),
            Err(VersionError::CrossesMajor { .. })
        ));
        let i = OpVersionInterval::new(v("1.2.0"), v("1.9.0")).unwrap();
        assert!(i.contains(v("1.5.0")) && !i.contains(v("1.10.0")) && !i.contains(v("1.1.9")));
    }

    #[test]
    fn semver_ranges_are_inclusive_with_optional_upper_bound() {
        let v = |s| Version::parse(s).unwrap();
        let r = VersionRange::new(v("1.0.0"), Some(v("1.9.99"))).unwrap();
        assert!(r.contains(&v("1.0.0")) && r.contains(&v("1.9.99")));
        assert!(!r.contains(&v("2.0.0")) && !r.contains(&v("1.0.0-rc.1")));
        let open = VersionRange::new(v("1.0.0"), None).unwrap();
        assert!(open.contains(&v("7.0.0")));
        assert!(VersionRange::new(v("2.0.0"), Some(v("1.0.0"))).is_err());
        // Build metadata does not take part in precedence, so this range holds exactly 1.0.0.
        let r = VersionRange::new(v("1.0.0+b"), Some(v("1.0.0"))).unwrap();
        assert!(r.contains(&v("1.0.0")));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Packing and unpacking are inverse for every in-range triple, the text form reads back,
        /// and the packed order is the (major, minor, patch) order.
        #[test]
        fn packed_versions_round_trip_and_order(
            a in (0u32..=255, 0u32..=4095, 0u32..=4095),
            b in (0u32..=255, 0u32..=4095, 0u32..=4095),
        ) {
            let va = PackedVersion::new(a.0, a.1, a.2).unwrap();
            let vb = PackedVersion::new(b.0, b.1, b.2).unwrap();
            prop_assert_eq!((va.major(), va.minor(), va.patch()), a);
            prop_assert_eq!(PackedVersion::from_raw(va.raw()), va);
            prop_assert_eq!(PackedVersion::parse(&va.to_string()).unwrap(), va);
            prop_assert_eq!(va.cmp(&vb), a.cmp(&b));
        }

        /// Every raw value unpacks to components that pack back to the same raw value.
        #[test]
        fn every_raw_value_repacks(raw in any::<u32>()) {
            let v = PackedVersion::from_raw(raw);
            prop_assert_eq!(PackedVersion::new(v.major(), v.minor(), v.patch()).unwrap().raw(), raw);
        }
    }
}
