//! Tensor descriptors as an operation query carries them, and the checks a tensor must pass on
//! its own before any provider is asked about it.
//!
//! Decisions taken here, for callers converting from the C `guild_tensor_desc_t`:
//! - Rank is 1 to 8. There is no rank-0 scalar: a scalar is rank 1 with one element, which keeps
//!   "the first axis is contiguous" true of every tensor.
//! - A zero extent is refused. A GOP1 contract has no way to say whether a provider copes with an
//!   empty tensor, and a device launch over zero elements is an error on CUDA; a caller with no
//!   work skips the call instead.
//! - `dims` and `strides` entries at or beyond `rank` are ignored.

use std::fmt;

use super::values::{DType, Layout, MemorySpace, MAX_TENSOR_RANK};

/// One tensor of a query: its element type, shape, strides and where its data lives.
///
/// Axis 0 is the innermost and is always contiguous (walked block by block for quantized
/// dtypes). For an outer axis `i >= 1`, `strides[i]` is the distance in elements (blocks for
/// quantized dtypes) between consecutive indices of that axis, and 0 means packed: directly after
/// the extent of the axes inside it. Build one with [`TensorDesc::new`] and the `with_*` methods,
/// or fill the fields from the C struct; either way [`TensorDesc::check`] decides whether it is
/// valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorDesc {
    /// Element type; must be a known id, never [`DType::ANY`].
    pub dtype: DType,
    /// Number of axes in use, 1 to [`MAX_TENSOR_RANK`].
    pub rank: u32,
    /// Extent of each axis, innermost first.
    pub dims: [u64; MAX_TENSOR_RANK],
    /// Outer strides in elements (blocks when quantized); `strides[0]` must be 0, and 0 elsewhere
    /// means packed.
    pub strides: [u64; MAX_TENSOR_RANK],
    /// The one memory space the data lives in.
    pub memory_space: MemorySpace,
    /// The device that owns the data; only meaningful for [`MemorySpace::Device`].
    pub device_id: i32,
    /// The data address when known, for the provider's alignment requirement. `None` (the C
    /// caller passed NULL, or the address is not yet allocated) skips that check, which the
    /// caller must then repeat when the address is known.
    pub data_addr: Option<u64>,
}

/// A descriptor in the words an error message uses: dtype, extents (innermost first), strides
/// unless packed, and where the data lives, e.g. `f32 [16, 4] packed in host memory`. A rank
/// outside 1 to [`MAX_TENSOR_RANK`] is named as such, since its extents mean nothing.
impl fmt::Display for TensorDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rank_ok = usize::try_from(self.rank).is_ok_and(|r| (1..=MAX_TENSOR_RANK).contains(&r));
        if !rank_ok {
            write!(
                f,
                "{} rank {} (outside 1 to {MAX_TENSOR_RANK})",
                self.dtype, self.rank
            )?;
        } else {
            write!(f, "{} {:?}", self.dtype, self.shape())?;
            let strides = self
                .strides
                .get(..self.shape().len())
                .unwrap_or(&self.strides);
            if strides.iter().all(|&s| s == 0) {
                f.write_str(" packed")?;
            } else {
                write!(f, " with strides {strides:?}")?;
            }
        }
        write!(f, " in {} memory", self.memory_space)?;
        if matches!(
            self.memory_space,
            MemorySpace::Device | MemorySpace::Managed
        ) {
            write!(f, " of device {}", self.device_id)?;
        }
        Ok(())
    }
}

impl TensorDesc {
    /// A packed tensor of `shape` (innermost axis first) in `memory_space`, on device 0, with no
    /// known address. A `shape` longer than [`MAX_TENSOR_RANK`] keeps its length as the rank, so
    /// that [`TensorDesc::check`] refuses it rather than silently dropping axes.
    pub fn new(dtype: DType, shape: &[u64], memory_space: MemorySpace) -> Self {
        let mut dims = [0; MAX_TENSOR_RANK];
        for (slot, &d) in dims.iter_mut().zip(shape) {
            *slot = d;
        }
        TensorDesc {
            dtype,
            rank: u32::try_from(shape.len()).unwrap_or(u32::MAX),
            dims,
            strides: [0; MAX_TENSOR_RANK],
            memory_space,
            device_id: 0,
            data_addr: None,
        }
    }

    /// Replaces the strides (index 0 first; missing entries are 0, extra ones dropped).
    pub fn with_strides(mut self, strides: &[u64]) -> Self {
        self.strides = [0; MAX_TENSOR_RANK];
        for (slot, &s) in self.strides.iter_mut().zip(strides) {
            *slot = s;
        }
        self
    }

    /// Sets the owning device.
    pub fn with_device(mut self, device_id: i32) -> Self {
        self.device_id = device_id;
        self
    }

    /// Sets the data address.
    pub fn with_data_addr(mut self, addr: u64) -> Self {
        self.data_addr = Some(addr);
        self
    }

    /// The extents of the axes in use (at most [`MAX_TENSOR_RANK`] of them, even when `rank` is
    /// larger).
    #[inline]
    pub fn shape(&self) -> &[u64] {
        let rank = usize::try_from(self.rank).map_or(MAX_TENSOR_RANK, |r| r.min(MAX_TENSOR_RANK));
        self.dims.get(..rank).unwrap_or(&self.dims)
    }

    /// Checks the tensor on its own and computes its size and layout.
    ///
    /// All arithmetic is checked, so extents too large for 64 bits give
    /// [`TensorError::TooLarge`] rather than wrapping.
    ///
    /// Inlined into its callers, so that the facts stay in registers: returned through memory,
    /// they were copied back at offsets that straddled the stores that wrote them, which the
    /// processor cannot forward (a stall of its own on every tensor a query checks).
    #[inline]
    pub fn check(&self) -> Result<TensorInfo, TensorError> {
        let rank = self.rank;
        if rank == 0 || usize::try_from(rank).map_or(true, |r| r > MAX_TENSOR_RANK) {
            return Err(TensorError::BadRank { rank });
        }
        if self.dtype.is_any() {
            return Err(TensorError::AnyDtype);
        }
        let block = self.dtype.block().ok_or(TensorError::UnknownDtype {
            dtype: self.dtype.raw(),
        })?;
        let dims = self.shape();
        if let Some(axis) = dims.iter().position(|&d| d == 0) {
            return Err(TensorError::ZeroExtent { axis });
        }
        let (Some(&inner_dim), Some(&inner_stride)) = (dims.first(), self.strides.first()) else {
            return Err(TensorError::BadRank { rank });
        };
        if inner_stride != 0 {
            return Err(TensorError::InnerStride {
                stride: inner_stride,
            });
        }
        let block_elems = u64::from(block.elements);
        // Most dtypes hold one element per block, and need no division (a 64-bit one is tens
        // of cycles, and a reshape checks every tensor it is given).
        let (inner_units, inner_rest) = if block_elems == 1 {
            (inner_dim, 0)
        } else {
            (inner_dim / block_elems, inner_dim % block_elems)
        };
        if inner_rest != 0 {
            return Err(TensorError::NotBlockMultiple {
                dtype: self.dtype,
                dim: inner_dim,
                block: block.elements,
            });
        }

        let too_large = |what| TensorError::TooLarge { what };
        // Offsets are counted in storage units: elements, or blocks for quantized dtypes.
        // `prev` is the stride and extent (in units) of the axis just inside the current one;
        // axis 0 has stride 1 and spans `inner_dim / block` units.
        let mut prev = (1u64, inner_units);
        let mut last_unit = prev.1 - 1;
        let mut elements = inner_dim;
        let mut batch = 1u64;
        let mut contiguous = true;
        // The axes outside the innermost, sliced rather than skipped (`Skip` costs a call per
        // tensor, and a reshape checks every tensor it is given).
        let outer = dims.get(1..).unwrap_or_default();
        for (i, (&dim, &explicit)) in outer.iter().zip(&self.strides[1..]).enumerate() {
            let axis = i + 1;
            let packed = prev
                .0
                .checked_mul(prev.1)
                .ok_or(too_large("stride extent"))?;
            let stride = if explicit == 0 {
                packed
            } else if explicit < packed {
                return Err(TensorError::StrideOverlap {
                    axis,
                    stride: explicit,
                    packed,
                });
            } else {
                contiguous &= explicit == packed;
                explicit
            };
            last_unit = (dim - 1)
                .checked_mul(stride)
                .and_then(|o| o.checked_add(last_unit))
                .ok_or(too_large("byte extent"))?;
            elements = elements
                .checked_mul(dim)
                .ok_or(too_large("element count"))?;
            batch = batch.checked_mul(dim).ok_or(too_large("batch"))?;
            prev = (stride, dim);
        }
        let byte_extent = last_unit
            .checked_add(1)
            .and_then(|units| units.checked_mul(u64::from(block.bytes)))
            .ok_or(too_large("byte extent"))?;
        Ok(TensorInfo {
            layout: if contiguous {
                Layout::Contiguous
            } else {
                Layout::OuterStrided
            },
            elements,
            batch,
            byte_extent,
        })
    }
}

/// What [`TensorDesc::check`] learned about a valid tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    /// Contiguous when every outer stride is 0 or equal to its packed extent.
    pub layout: Layout,
    /// Number of elements (product of all extents).
    pub elements: u64,
    /// Product of the outer extents (1 for rank 1), which a descriptor's batch bound limits.
    pub batch: u64,
    /// Bytes from the first byte of the tensor to one past its last, padding between rows
    /// included: the smallest buffer that holds it.
    pub byte_extent: u64,
}

/// Why a tensor descriptor is invalid on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// Rank 0 or above 8.
    #[error("rank {rank} is outside 1..=8 (a scalar is rank 1 with one element)")]
    BadRank {
        /// The rank given.
        rank: u32,
    },
    /// The tensor names [`DType::ANY`].
    #[error("dtype any belongs in a provider's descriptor; a tensor must name its dtype")]
    AnyDtype,
    /// The dtype id is not known to this host, so its size is unknown.
    #[error("dtype id {dtype} is not known to this host")]
    UnknownDtype {
        /// The raw dtype id.
        dtype: u32,
    },
    /// An axis has extent 0.
    #[error("axis {axis} has extent 0; empty tensors are refused")]
    ZeroExtent {
        /// The empty axis.
        axis: usize,
    },
    /// `strides[0]` is not 0.
    #[error("strides[0] is {stride}; the innermost axis is contiguous and its stride must be 0")]
    InnerStride {
        /// The stride given.
        stride: u64,
    },
    /// The innermost extent of a quantized tensor is not a whole number of blocks.
    #[error("innermost extent {dim} is not a multiple of the {dtype} block of {block} elements")]
    NotBlockMultiple {
        /// The quantized dtype.
        dtype: DType,
        /// The innermost extent.
        dim: u64,
        /// Its block size in elements.
        block: u32,
    },
    /// An explicit outer stride is smaller than the extent of the axes inside it.
    #[error("stride {stride} of axis {axis} overlaps the {packed} units of the axes inside it")]
    StrideOverlap {
        /// The axis.
        axis: usize,
        /// Its explicit stride.
        stride: u64,
        /// The extent of the axes inside it, in the same units.
        packed: u64,
    },
    /// A size does not fit in 64 bits.
    #[error("the tensor's {what} does not fit in 64 bits")]
    TooLarge {
        /// Which size.
        what: &'static str,
    },
}

/// Whether a tensor is one of a query's inputs or one of its outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TensorRole {
    /// An input tensor.
    Input,
    /// An output tensor.
    Output,
}

impl fmt::Display for TensorRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TensorRole::Input => "input",
            TensorRole::Output => "output",
        })
    }
}

/// Names one tensor of a query, as diagnostics print it: `input 1`, `output 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorRef {
    /// Input or output.
    pub role: TensorRole,
    /// Position among the query's inputs or outputs, from 0.
    pub index: usize,
}

impl TensorRef {
    /// Input number `index`.
    pub const fn input(index: usize) -> Self {
        TensorRef {
            role: TensorRole::Input,
            index,
        }
    }

    /// Output number `index`.
    pub const fn output(index: usize) -> Self {
        TensorRef {
            role: TensorRole::Output,
            index,
        }
    }
}

impl fmt::Display for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.role, self.index)
    }
}
