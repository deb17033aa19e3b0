//! Value types shared by operation descriptors and queries, numbered exactly as the C headers
//! number them: dtypes, backends, layouts, memory spaces, sync modes, bit sets and budgets.

use std::fmt;
use std::ops::BitOr;

/// The most axes a tensor may have (`GUILD_MAX_TENSOR_RANK`).
pub const MAX_TENSOR_RANK: usize = 8;

/// How a dtype is stored: the number of elements in one block and the bytes that block takes.
/// Plain types are blocks of one element; quantized types pack 32 or 256 elements per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DTypeBlock {
    /// Elements per block.
    pub elements: u32,
    /// Bytes per block.
    pub bytes: u32,
}

/// An element type id with GGML's numbering, so that a GGUF tensor type maps to it unchanged.
///
/// Any `u32` can be wrapped: a descriptor built for a newer host may name an id this host does
/// not know, and such a descriptor must still be comparable. [`DType::block`] answers `None` for
/// unknown ids and for [`DType::ANY`], which is why a tensor with either is refused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DType(u32);

impl DType {
    /// 32-bit IEEE float.
    pub const F32: DType = DType(0);
    /// 16-bit IEEE float.
    pub const F16: DType = DType(1);
    /// GGML Q4_0 (32 elements in 18 bytes).
    pub const Q4_0: DType = DType(2);
    /// GGML Q4_1 (32 elements in 20 bytes).
    pub const Q4_1: DType = DType(3);
    /// GGML Q5_0 (32 elements in 22 bytes).
    pub const Q5_0: DType = DType(6);
    /// GGML Q5_1 (32 elements in 24 bytes).
    pub const Q5_1: DType = DType(7);
    /// GGML Q8_0 (32 elements in 34 bytes).
    pub const Q8_0: DType = DType(8);
    /// GGML Q8_1 (32 elements in 36 bytes).
    pub const Q8_1: DType = DType(9);
    /// GGML Q2_K (256 elements in 84 bytes).
    pub const Q2_K: DType = DType(10);
    /// GGML Q3_K (256 elements in 110 bytes).
    pub const Q3_K: DType = DType(11);
    /// GGML Q4_K (256 elements in 144 bytes).
    pub const Q4_K: DType = DType(12);
    /// GGML Q5_K (256 elements in 176 bytes).
    pub const Q5_K: DType = DType(13);
    /// GGML Q6_K (256 elements in 210 bytes).
    pub const Q6_K: DType = DType(14);
    /// GGML Q8_K (256 elements in 292 bytes).
    pub const Q8_K: DType = DType(15);
    /// 8-bit signed integer.
    pub const I8: DType = DType(24);
    /// 16-bit signed integer.
    pub const I16: DType = DType(25);
    /// 32-bit signed integer.
    pub const I32: DType = DType(26);
    /// 64-bit signed integer.
    pub const I64: DType = DType(27);
    /// 64-bit IEEE float.
    pub const F64: DType = DType(28);
    /// bfloat16.
    pub const BF16: DType = DType(30);
    /// `GUILD_DTYPE_ANY`: in a descriptor, "any dtype; my validate callback decides". Never a
    /// tensor's own dtype.
    pub const ANY: DType = DType(u32::MAX);

    /// Wraps a raw id as a C struct stores it.
    pub const fn from_raw(raw: u32) -> Self {
        DType(raw)
    }

    /// The raw id, as the C headers store it.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// Whether this is the descriptor wildcard [`DType::ANY`].
    #[inline]
    pub const fn is_any(self) -> bool {
        self.0 == u32::MAX
    }

    /// The lowercase name, block elements and block bytes of a known id.
    const fn table(self) -> Option<(&'static str, u32, u32)> {
        Some(match self.0 {
            0 => ("f32", 1, 4),
            1 => ("f16", 1, 2),
            2 => ("q4_0", 32, 18),
            3 => ("q4_1", 32, 20),
            6 => ("q5_0", 32, 22),
            7 => ("q5_1", 32, 24),
            8 => ("q8_0", 32, 34),
            9 => ("q8_1", 32, 36),
            10 => ("q2_k", 256, 84),
            11 => ("q3_k", 256, 110),
            12 => ("q4_k", 256, 144),
            13 => ("q5_k", 256, 176),
            14 => ("q6_k", 256, 210),
            15 => ("q8_k", 256, 292),
            24 => ("i8", 1, 1),
            25 => ("i16", 1, 2),
            26 => ("i32", 1, 4),
            27 => ("i64", 1, 8),
            28 => ("f64", 1, 8),
            30 => ("bf16", 1, 2),
            _ => return None,
        })
    }

    /// Block geometry of a known id; `None` for unknown ids and for [`DType::ANY`].
    #[inline]
    pub const fn block(self) -> Option<DTypeBlock> {
        match self.table() {
            Some((_, elements, bytes)) => Some(DTypeBlock { elements, bytes }),
            None => None,
        }
    }

    /// The lowercase name of a known id (`"q4_k"`); `None` otherwise.
    pub const fn name(self) -> Option<&'static str> {
        match self.table() {
            Some((name, _, _)) => Some(name),
            None => None,
        }
    }

    /// Whether the id is known to this host (which excludes [`DType::ANY`]).
    pub const fn is_known(self) -> bool {
        self.table().is_some()
    }

    /// Whether elements are stored in blocks of more than one, so that the innermost axis must
    /// be a whole number of blocks.
    pub const fn is_quantized(self) -> bool {
        matches!(self.table(), Some((_, elements, _)) if elements > 1)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None if self.is_any() => f.write_str("any"),
            None => write!(f, "dtype #{}", self.0),
        }
    }
}

impl fmt::Debug for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DType({self})")
    }
}

/// Declares a bit-set newtype over an integer, with named bits, set algebra and a `Display` that
/// spells known bits by name and any others in hex.
macro_rules! bit_set {
    (
        $(#[$doc:meta])*
        $name:ident($int:ty) {
            $( $(#[$cdoc:meta])* $konst:ident = $bit:literal => $label:literal, )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name($int);

        impl $name {
            $( $(#[$cdoc])* pub const $konst: $name = $name($bit); )*

            /// The empty set.
            pub const EMPTY: $name = $name(0);

            const LABELS: &'static [($int, &'static str)] = &[$(($bit, $label),)*];

            /// Every bit this host gives a meaning to.
            pub const KNOWN: $name = {
                let mut known = 0;
                let mut i = 0;
                while i < Self::LABELS.len() {
                    known |= Self::LABELS[i].0;
                    i += 1;
                }
                $name(known)
            };

            /// Wraps raw bits as a C struct stores them. Unknown bits are kept, so that a set
            /// written for a newer host survives the round trip unchanged.
            pub const fn from_bits(bits: $int) -> Self {
                $name(bits)
            }

            /// The raw bits.
            pub const fn bits(self) -> $int {
                self.0
            }

            /// Whether no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// Whether every bit of `other` is also in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// The bits in either set.
            pub const fn union(self, other: Self) -> Self {
                $name(self.0 | other.0)
            }

            /// The bits of `self` that `other` lacks: what is still missing when `self` is
            /// required and `other` is offered.
            pub const fn difference(self, other: Self) -> Self {
                $name(self.0 & !other.0)
            }

            /// The bits this host gives no meaning to.
            pub const fn unknown(self) -> Self {
                $name(self.0 & !Self::KNOWN.0)
            }
        }

        impl BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                self.union(rhs)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                if self.0 == 0 {
                    return f.write_str("none");
                }
                let mut rest = self.0;
                let mut sep = "";
                for &(bit, label) in Self::LABELS {
                    if self.0 & bit != 0 {
                        write!(f, "{sep}{label}")?;
                        sep = "|";
                        rest &= !bit;
                    }
                }
                if rest != 0 {
                    write!(f, "{sep}{rest:#x}")?;
                }
                Ok(())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self)
            }
        }
    };
}

bit_set!(
    /// A set of backends (`GUILD_BACKEND_*` bits). A query permits a set; a descriptor names
    /// exactly one, which is a [`Backend`].
    BackendSet(u32) {
        /// `GUILD_BACKEND_CPU`.
        CPU = 0x1 => "cpu",
        /// `GUILD_BACKEND_CUDA`.
        CUDA = 0x2 => "cuda",
        /// `GUILD_BACKEND_HIP`.
        HIP = 0x4 => "hip",
    }
);

bit_set!(
    /// The tensor layouts a provider accepts (`GUILD_LAYOUT_*` bits).
    LayoutSet(u32) {
        /// `GUILD_LAYOUT_CONTIGUOUS`: every outer axis packed.
        CONTIGUOUS = 0x1 => "contiguous",
        /// `GUILD_LAYOUT_OUTER_STRIDED`: outer axes may carry explicit strides.
        OUTER_STRIDED = 0x2 => "outer-strided",
    }
);

bit_set!(
    /// The memory spaces a provider accepts tensors in (`GUILD_MEMORY_*` bits).
    MemorySpaceSet(u32) {
        /// `GUILD_MEMORY_HOST`.
        HOST = 0x1 => "host",
        /// `GUILD_MEMORY_HOST_PINNED`.
        HOST_PINNED = 0x2 => "host-pinned",
        /// `GUILD_MEMORY_DEVICE`.
        DEVICE = 0x4 => "device",
        /// `GUILD_MEMORY_MANAGED`.
        MANAGED = 0x8 => "managed",
    }
);

bit_set!(
    /// The sync modes a provider supports, as `GUILD_SYNC_BIT(mode)` bits (not the legacy enum
    /// mask of the kernel descriptor).
    SyncModeSet(u32) {
        /// `GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING)`.
        HOST_BLOCKING = 0x1 => "host-blocking",
        /// `GUILD_SYNC_BIT(GUILD_SYNC_STREAM_ORDERED)`.
        STREAM_ORDERED = 0x2 => "stream-ordered",
        /// `GUILD_SYNC_BIT(GUILD_SYNC_GRAPH_CAPTURABLE)`.
        GRAPH_CAPTURABLE = 0x4 => "graph-capturable",
    }
);

bit_set!(
    /// Operation-specific capability bits. Their meaning belongs to the operation's contract (its
    /// versioned header), not to the host, which only checks that required bits are offered.
    Capabilities(u64) {}
);

bit_set!(
    /// Numerical guarantees. Bits 0-3 are common to every operation (`GUILD_NUMERICS_*`); bits
    /// 32-63 are defined per operation. As with [`Capabilities`], the host only checks that
    /// required bits are offered.
    Numerics(u64) {
        /// `GUILD_NUMERICS_DETERMINISTIC`: bit-identical results run to run on one device.
        DETERMINISTIC = 0x1 => "deterministic",
        /// `GUILD_NUMERICS_F32_ACCUMULATION`: accumulation in at least binary32.
        F32_ACCUMULATION = 0x2 => "f32-accumulation",
        /// `GUILD_NUMERICS_ORDERED_REDUCTION`: reductions in index order.
        ORDERED_REDUCTION = 0x4 => "ordered-reduction",
        /// `GUILD_NUMERICS_EXACT_INTEGER`: integer results are exact.
        EXACT_INTEGER = 0x8 => "exact-integer",
    }
);

bit_set!(
    /// CPU instruction-set feature bits (`GUILD_CPU_ISA_*`), as the kernel descriptor requires
    /// them and the device capabilities object reports them.
    CpuIsa(u64) {
        /// `GUILD_CPU_ISA_SSE4_2`.
        SSE4_2 = 0x1 => "sse4.2",
        /// `GUILD_CPU_ISA_AVX`.
        AVX = 0x2 => "avx",
        /// `GUILD_CPU_ISA_AVX2`.
        AVX2 = 0x4 => "avx2",
        /// `GUILD_CPU_ISA_FMA`.
        FMA = 0x8 => "fma",
        /// `GUILD_CPU_ISA_F16C`.
        F16C = 0x10 => "f16c",
        /// `GUILD_CPU_ISA_AVX512F`.
        AVX512F = 0x20 => "avx512f",
        /// `GUILD_CPU_ISA_AVX512BW`.
        AVX512BW = 0x40 => "avx512bw",
        /// `GUILD_CPU_ISA_AVX512_VNNI`.
        AVX512_VNNI = 0x80 => "avx512-vnni",
        /// `GUILD_CPU_ISA_AVX512_BF16`.
        AVX512_BF16 = 0x100 => "avx512-bf16",
        /// `GUILD_CPU_ISA_AVX_VNNI`.
        AVX_VNNI = 0x200 => "avx-vnni",
        /// `GUILD_CPU_ISA_NEON`.
        NEON = 0x100000000 => "neon",
        /// `GUILD_CPU_ISA_ARM_DOTPROD`.
        ARM_DOTPROD = 0x200000000 => "arm-dotprod",
        /// `GUILD_CPU_ISA_ARM_I8MM`.
        ARM_I8MM = 0x400000000 => "arm-i8mm",
        /// `GUILD_CPU_ISA_SVE`.
        SVE = 0x800000000 => "sve",
        /// `GUILD_CPU_ISA_SVE2`.
        SVE2 = 0x1000000000 => "sve2",
    }
);

/// One backend, as a descriptor names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// Host CPU.
    Cpu,
    /// NVIDIA CUDA.
    Cuda,
    /// AMD HIP.
    Hip,
}

impl Backend {
    /// The `GUILD_BACKEND_*` bit.
    pub const fn bit(self) -> u32 {
        match self {
            Backend::Cpu => 0x1,
            Backend::Cuda => 0x2,
            Backend::Hip => 0x4,
        }
    }

    /// The backend a single `GUILD_BACKEND_*` bit names; `None` for zero, several or unknown bits.
    pub const fn from_bit(bit: u32) -> Option<Self> {
        match bit {
            0x1 => Some(Backend::Cpu),
            0x2 => Some(Backend::Cuda),
            0x4 => Some(Backend::Hip),
            _ => None,
        }
    }

    /// The lowercase name, as manifests spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Hip => "hip",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Backend> for BackendSet {
    fn from(b: Backend) -> Self {
        BackendSet(b.bit())
    }
}

impl BackendSet {
    /// Whether `backend` is in the set.
    pub const fn has(self, backend: Backend) -> bool {
        self.0 & backend.bit() != 0
    }
}

/// The layout class of one tensor, derived from its strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Every outer axis is packed directly after the axes inside it.
    Contiguous,
    /// At least one outer axis has a stride larger than its packed extent.
    OuterStrided,
}

impl Layout {
    /// The `GUILD_LAYOUT_*` bit.
    pub const fn bit(self) -> u32 {
        match self {
            Layout::Contiguous => 0x1,
            Layout::OuterStrided => 0x2,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Contiguous => "contiguous",
            Layout::OuterStrided => "outer-strided",
        })
    }
}

impl LayoutSet {
    /// Whether a provider declaring this set accepts a tensor of `layout`.
    ///
    /// A contiguous tensor is the special case of an outer-strided one whose strides all equal
    /// their packed extents, so a provider that walks explicit strides handles it too: contiguous
    /// tensors are admitted by either bit, outer-strided ones only by `OUTER_STRIDED`.
    pub const fn admits(self, layout: Layout) -> bool {
        match layout {
            Layout::Contiguous => self.0 & (0x1 | 0x2) != 0,
            Layout::OuterStrided => self.0 & 0x2 != 0,
        }
    }
}

/// The one memory space a tensor lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// Pageable host memory.
    Host,
    /// Page-locked host memory.
    HostPinned,
    /// Device memory of the tensor's `device_id`.
    Device,
    /// Managed (unified) memory.
    Managed,
}

impl MemorySpace {
    /// The `GUILD_MEMORY_*` bit.
    pub const fn bit(self) -> u32 {
        match self {
            MemorySpace::Host => 0x1,
            MemorySpace::HostPinned => 0x2,
            MemorySpace::Device => 0x4,
            MemorySpace::Managed => 0x8,
        }
    }

    /// The space a single `GUILD_MEMORY_*` bit names; `None` for zero, several or unknown bits.
    pub const fn from_bit(bit: u32) -> Option<Self> {
        match bit {
            0x1 => Some(MemorySpace::Host),
            0x2 => Some(MemorySpace::HostPinned),
            0x4 => Some(MemorySpace::Device),
            0x8 => Some(MemorySpace::Managed),
            _ => None,
        }
    }
}

impl fmt::Display for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemorySpace::Host => "host",
            MemorySpace::HostPinned => "host-pinned",
            MemorySpace::Device => "device",
            MemorySpace::Managed => "managed",
        })
    }
}

impl MemorySpaceSet {
    /// Whether `space` is in the set.
    pub const fn has(self, space: MemorySpace) -> bool {
        self.0 & space.bit() != 0
    }
}

/// The one sync mode a query asks for (`GUILD_SYNC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// `GUILD_SYNC_HOST_BLOCKING` (0): the call returns when the work is done.
    HostBlocking,
    /// `GUILD_SYNC_STREAM_ORDERED` (1): work is queued on the supplied stream.
    StreamOrdered,
    /// `GUILD_SYNC_GRAPH_CAPTURABLE` (2): stream-ordered and safe inside graph capture.
    GraphCapturable,
}

impl SyncMode {
    /// The `GUILD_SYNC_*` value.
    pub const fn raw(self) -> u32 {
        match self {
            SyncMode::HostBlocking => 0,
            SyncMode::StreamOrdered => 1,
            SyncMode::GraphCapturable => 2,
        }
    }

    /// The mode a `GUILD_SYNC_*` value names; `None` for unknown values.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(SyncMode::HostBlocking),
            1 => Some(SyncMode::StreamOrdered),
            2 => Some(SyncMode::GraphCapturable),
            _ => None,
        }
    }

    /// `GUILD_SYNC_BIT(mode)`.
    pub const fn bit(self) -> u32 {
        1 << self.raw()
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncMode::HostBlocking => "host-blocking",
            SyncMode::StreamOrdered => "stream-ordered",
            SyncMode::GraphCapturable => "graph-capturable",
        })
    }
}

impl SyncModeSet {
    /// Whether `mode` is in the set.
    pub const fn has(self, mode: SyncMode) -> bool {
        self.0 & mode.bit() != 0
    }
}

/// A memory budget in bytes; [`Budget::UNLIMITED`] (`GUILD_BUDGET_UNLIMITED`, `u64::MAX`) bounds
/// nothing.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Budget(u64);

impl Budget {
    /// No bound.
    pub const UNLIMITED: Budget = Budget(u64::MAX);

    /// A bound of `bytes`; `u64::MAX` is [`Budget::UNLIMITED`].
    pub const fn bytes(bytes: u64) -> Self {
        Budget(bytes)
    }

    /// The bound in bytes, `u64::MAX` when unlimited.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whether this is [`Budget::UNLIMITED`].
    pub const fn is_unlimited(self) -> bool {
        self.0 == u64::MAX
    }

    /// Whether a request of `needed` bytes fits.
    pub const fn allows(self, needed: u64) -> bool {
        needed <= self.0
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unlimited() {
            f.write_str("unlimited")
        } else {
            write!(f, "{} bytes", self.0)
        }
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Budget({self})")
    }
}

/// Which of a query's two budgets a scratch request was measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetKind {
    /// The RAM budget, which bounds host scratch.
    Ram,
    /// The VRAM budget, which bounds device scratch.
    Vram,
}

impl fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BudgetKind::Ram => "ram",
            BudgetKind::Vram => "vram",
        })
    }
}

impl BudgetKind {
    /// The kind of scratch this budget bounds: `"host"` or `"device"`.
    pub const fn scratch(self) -> &'static str {
        match self {
            BudgetKind::Ram => "host",
            BudgetKind::Vram => "device",
        }
    }
}
