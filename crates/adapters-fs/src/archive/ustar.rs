//! A strict reader for the tar framing of GKPK v1 archives: 512-byte ustar (or GNU) headers,
//! member data, and the end-of-archive marker.
//!
//! It reads headers itself rather than through the `tar` crate's `Archive`, because that reader
//! resolves GNU long names, PAX size overrides and sparse maps before the caller sees an entry,
//! ends the archive at the first zero block without looking further, and lets a member's data end
//! early without an error. Here every header is checked (checksum, magic, octal fields, no bytes
//! hidden after a name's terminating NUL), the only extension honoured is a per-member PAX header
//! carrying a `path` record (plus timestamps and owners, which are ignored like their ustar
//! fields), and an archive must end with two zero blocks followed by nothing but zero padding.
//! Running out of bytes anywhere is reported as truncation.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use guild_domain::path::RESERVED_METADATA_NAME;
use guild_ports::source::{SourceError, SourceErrorKind};

use super::entry::{read_full, Ctx, Member, MemberKind, MemberStream};

/// The tar block size.
pub(crate) const BLOCK: usize = 512;
/// Largest PAX extended header accepted. A path record needs about 270 bytes; the ignored
/// timestamp and owner records a few dozen each.
pub(crate) const MAX_PAX_BYTES: u64 = 16 * 1024;
/// Most zero padding accepted after the end-of-archive marker. Tar writers pad to a record size
/// (GNU tar: 10 KiB); anything beyond this is not padding.
const MAX_TRAILING_ZEROS: u64 = 1 << 20;
/// How much the reader buffers; data reads of at least this size bypass the buffer.
const READ_BUFFER: usize = 64 * 1024;

/// Header field offsets and lengths (POSIX ustar).
const NAME: (usize, usize) = (0, 100);
const SIZE: (usize, usize) = (124, 12);
const CHKSUM: (usize, usize) = (148, 8);
const TYPEFLAG: usize = 156;
const MAGIC: (usize, usize) = (257, 8);
const PREFIX: (usize, usize) = (345, 155);

/// Which header layout a block uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// POSIX ustar: `ustar\0` then version `00`; the name may continue in the prefix field.
    Ustar,
    /// GNU: `ustar ` then ` \0`; the prefix area holds other fields, so the name is the name
    /// field alone.
    Gnu,
}

/// One parsed header.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    name: Vec<u8>,
    size: u64,
    type_flag: u8,
}

/// The data of the current member: reads stop at its declared size, and running out of archive
/// before that is an `UnexpectedEof` error rather than a short read.
#[derive(Debug)]
struct Body {
    reader: BufReader<File>,
    left: u64,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = usize::try_from(self.left).map_or(buf.len(), |left| left.min(buf.len()));
        let n = self.reader.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Members of a tar archive, read from an open file.
#[derive(Debug)]
pub(crate) struct TarStream {
    ctx: Ctx,
    body: Body,
    /// Padding after the current member's data, up to the next block boundary.
    padding: u64,
    /// Whether the end-of-archive marker has been read.
    ended: bool,
}

impl TarStream {
    pub(crate) fn new(file: File, location: &Path) -> Self {
        TarStream {
            ctx: Ctx::new(location),
            body: Body {
                reader: BufReader::with_capacity(READ_BUFFER, file),
                left: 0,
            },
            padding: 0,
            ended: false,
        }
    }

    fn truncated(&self) -> SourceError {
        self.ctx.err(SourceErrorKind::Truncated)
    }

    fn read_error(&self, e: io::Error) -> SourceError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            self.truncated()
        } else {
            self.ctx.io("read the archive", e)
        }
    }

    /// Reads one block; `false` when the archive ends exactly before it.
    fn read_block(&mut self, block: &mut [u8; BLOCK]) -> Result<bool, SourceError> {
        match read_full(&mut self.body.reader, block) {
            Ok(0) => Ok(false),
            Ok(BLOCK) => Ok(true),
            Ok(_) => Err(self.truncated()),
            Err(e) => Err(self.read_error(e)),
        }
    }

    /// Discards whatever is left of the current member's data and its padding.
    fn skip_rest(&mut self) -> Result<(), SourceError> {
        let padding = std::mem::take(&mut self.padding);
        if let Err(e) = io::copy(&mut self.body, &mut io::sink()) {
            return Err(self.read_error(e));
        }
        let skipped = io::copy(&mut (&mut self.body.reader).take(padding), &mut io::sink())
            .map_err(|e| self.read_error(e))?;
        if skipped < padding {
            return Err(self.truncated());
        }
        Ok(())
    }

    /// Reads the data of a member of `size` bytes (already bounded by the caller) and its
    /// padding.
    fn read_data(&mut self, size: u64) -> Result<Vec<u8>, SourceError> {
        let mut data = Vec::new();
        let read = (&mut self.body.reader)
            .take(size)
            .read_to_end(&mut data)
            .map_err(|e| self.read_error(e))?;
        if (read as u64) < size {
            return Err(self.truncated());
        }
        self.padding = padding(size);
        self.skip_rest()?;
        Ok(data)
    }

    /// Having read one zero block, checks that a second follows and that nothing but zero
    /// padding comes after it.
    fn read_end(&mut self) -> Result<(), SourceError> {
        let mut block = [0u8; BLOCK];
        if !self.read_block(&mut block)? {
            return Err(self.truncated());
        }
        if block.iter().any(|&b| b != 0) {
            return Err(self.malformed("a lone zero block inside the archive"));
        }
        let mut tail = (&mut self.body.reader).take(MAX_TRAILING_ZEROS + 1);
        let mut buf = [0u8; 8192];
        let mut seen = 0u64;
        loop {
            let n = match tail.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.ctx.io("read the archive", e)),
            };
            seen += n as u64;
            if buf[..n].iter().any(|&b| b != 0) || seen > MAX_TRAILING_ZEROS {
                return Err(self.malformed("data after the end-of-archive marker"));
            }
        }
        self.ended = true;
        Ok(())
    }

    fn malformed(&self, reason: &str) -> SourceError {
        self.ctx.err(SourceErrorKind::MalformedHeader {
            reason: reason.to_owned(),
        })
    }
}

impl MemberStream for TarStream {
    fn next_member(&mut self) -> Result<Option<Member>, SourceError> {
        if self.ended {
            return Ok(None);
        }
        self.skip_rest()?;
        let mut pax_path: Option<Vec<u8>> = None;
        let mut had_pax = false;
        loop {
            let mut block = [0u8; BLOCK];
            if !self.read_block(&mut block)? {
                // A clean end at a block boundary without the end marker: the archive was cut.
                return Err(self.truncated());
            }
            if block.iter().all(|&b| b == 0) {
                if had_pax {
                    return Err(self.malformed("a PAX header with no member after it"));
                }
                self.read_end()?;
                return Ok(None);
            }
            let header = parse_header(&block).map_err(|kind| self.ctx.err(kind))?;
            let at = |kind| self.ctx.member(kind, &header.name);
            let unsupported = |what: &str| {
                at(SourceErrorKind::UnsupportedExtension {
                    what: what.to_owned(),
                })
            };
            match header.type_flag {
                b'x' => {
                    if had_pax {
                        return Err(at(SourceErrorKind::MalformedHeader {
                            reason: "two PAX headers for one member".to_owned(),
                        }));
                    }
                    if header.size > MAX_PAX_BYTES {
                        return Err(unsupported(&format!(
                            "a PAX header of {} bytes (the limit is {MAX_PAX_BYTES})",
                            header.size
                        )));
                    }
                    let data = self.read_data(header.size)?;
                    pax_path = parse_pax(&data).map_err(|kind| self.ctx.err(kind))?;
                    had_pax = true;
                    continue;
                }
                b'g' => return Err(unsupported("a PAX global header")),
                b'L' => return Err(unsupported("a GNU long name")),
                b'K' => return Err(unsupported("a GNU long link name")),
                _ => {}
            }
            let kind = match header.type_flag {
                b'0' | 0 => MemberKind::File,
                b'5' => MemberKind::Dir,
                b'1' => MemberKind::HardLink,
                b'2' => MemberKind::Symlink,
                b'3' | b'4' => MemberKind::Device,
                b'6' => MemberKind::Fifo,
                b'S' => MemberKind::Sparse,
                other => MemberKind::Other(char::from(other)),
            };
            let mut name = pax_path.unwrap_or(header.name);
            if kind == MemberKind::Dir {
                if header.size != 0 {
                    return Err(self.ctx.member(
                        SourceErrorKind::MalformedHeader {
                            reason: format!("a directory with {} bytes of data", header.size),
                        },
                        &name,
                    ));
                }
                if name.last() == Some(&b'/') {
                    name.pop();
                }
            }
            self.body.left = header.size;
            self.padding = padding(header.size);
            return Ok(Some(Member {
                name,
                kind,
                size: header.size,
            }));
        }
    }

    fn data(&mut self) -> Result<&mut dyn Read, SourceError> {
        Ok(&mut self.body)
    }

    fn short_data(&self) -> SourceErrorKind {
        SourceErrorKind::Truncated
    }

    fn location(&self) -> &Path {
        &self.ctx.location
    }
}

/// Bytes of padding after `size` bytes of data, up to the next block boundary.
fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn field(block: &[u8; BLOCK], (at, len): (usize, usize)) -> &[u8] {
    block.get(at..at + len).unwrap_or_default()
}

fn malformed(reason: impl Into<String>) -> SourceErrorKind {
    SourceErrorKind::MalformedHeader {
        reason: reason.into(),
    }
}

fn parse_header(block: &[u8; BLOCK]) -> Result<Header, SourceErrorKind> {
    let stored = octal(field(block, CHKSUM))
        .ok_or_else(|| malformed("the checksum field is not an octal number"))?;
    // The checksum is the unsigned sum of the header's bytes with the checksum field itself
    // counted as eight spaces.
    let computed: u64 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (CHKSUM.0..CHKSUM.0 + CHKSUM.1).contains(&i) {
                u64::from(b' ')
            } else {
                u64::from(b)
            }
        })
        .sum();
    if stored != computed {
        return Err(SourceErrorKind::HeaderChecksum { stored, computed });
    }
    let format = match field(block, MAGIC) {
        b"ustar\x0000" => Format::Ustar,
        b"ustar  \x00" => Format::Gnu,
        _ => return Err(malformed("not a ustar or GNU tar header")),
    };
    let name = text(field(block, NAME));
    let name = match format {
        Format::Ustar => {
            let prefix = text(field(block, PREFIX));
            if prefix.is_empty() {
                name
            } else {
                [prefix, b"/".to_vec(), name].concat()
            }
        }
        Format::Gnu => name,
    };
    let size_field = field(block, SIZE);
    if size_field.first().is_some_and(|b| b & 0x80 != 0) {
        return Err(malformed("a base-256 size field"));
    }
    let size =
        octal(size_field).ok_or_else(|| malformed("the size field is not an octal number"))?;
    Ok(Header {
        name,
        size,
        type_flag: block[TYPEFLAG],
    })
}

/// A NUL-terminated text field. Everything after the terminator must be NUL too; otherwise the
/// bytes up to the last non-NUL one are returned, embedded NUL included, so that path validation
/// refuses a name that different readers could cut in different places.
fn text(field: &[u8]) -> Vec<u8> {
    let end = field.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    field[..end].to_vec()
}

/// An octal number field: optional leading spaces, at least one octal digit, then only spaces
/// and NULs.
fn octal(field: &[u8]) -> Option<u64> {
    let start = field.iter().position(|&b| b != b' ')?;
    let digits = field[start..]
        .iter()
        .take_while(|b| (b'0'..=b'7').contains(*b))
        .count();
    if digits == 0 {
        return None;
    }
    let (number, rest) = field[start..].split_at(digits);
    if !rest.iter().all(|&b| b == b' ' || b == 0) {
        return None;
    }
    number.iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(8)?.checked_add(u64::from(d - b'0'))
    })
}

/// Parses PAX records (`"<len> <key>=<value>\n"`) and returns the `path` value, if any.
fn parse_pax(mut data: &[u8]) -> Result<Option<Vec<u8>>, SourceErrorKind> {
    let mut path = None;
    while !data.is_empty() {
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| malformed("a PAX record without a length"))?;
        let len_text = &data[..space];
        if len_text.is_empty() || !len_text.iter().all(u8::is_ascii_digit) {
            return Err(malformed("a PAX record length that is not a number"));
        }
        let len = std::str::from_utf8(len_text)
            .ok()
            .and_then(|t| t.parse::<usize>().ok())
            .filter(|&len| len > space + 1 && len <= data.len())
            .ok_or_else(|| malformed("a PAX record length out of range"))?;
        let (record, rest) = data.split_at(len);
        let body = record[space + 1..]
            .strip_suffix(b"\n")
            .ok_or_else(|| malformed("a PAX record not ending in a newline"))?;
        let eq = body
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| malformed("a PAX record without '='"))?;
        let (key, value) = (&body[..eq], &body[eq + 1..]);
        match key {
            b"path" => {
                if path.replace(value.to_vec()).is_some() {
                    return Err(malformed("two PAX path records"));
                }
            }
            // Timestamps and owners are ignored, like the ustar fields they override.
            b"mtime" | b"atime" | b"ctime" | b"uid" | b"gid" | b"uname" | b"gname" => {}
            other => {
                return Err(SourceErrorKind::UnsupportedExtension {
                    what: format!("a PAX {:?} record", String::from_utf8_lossy(other)),
                })
            }
        }
        data = rest;
    }
    Ok(path)
}

/// Reads the first member of the archive behind `stream`, which must be `.gkmetadata`.
///
/// This runs before the package is authenticated, so nothing after that member is looked at:
/// what it reads is bounded by the member's own header (at most one PAX header of
/// [`MAX_PAX_BYTES`], the header block, and at most `max_bytes` of data), never by sizes that
/// other members declare. An archive whose first member is anything else is refused at once,
/// whatever follows it.
pub(crate) fn read_metadata(
    stream: &mut TarStream,
    max_bytes: u64,
) -> Result<Vec<u8>, SourceError> {
    let Some(first) = stream.next_member()? else {
        return Err(stream.ctx.err(SourceErrorKind::MetadataMissing));
    };
    if first.name != RESERVED_METADATA_NAME.as_bytes() {
        return Err(stream
            .ctx
            .member(SourceErrorKind::MetadataNotFirst, &first.name));
    }
    let at = |kind| stream.ctx.member(kind, &first.name);
    match first.kind {
        MemberKind::File => {}
        MemberKind::Dir => return Err(at(SourceErrorKind::MetadataNotAFile)),
        other => {
            return Err(at(other
                .refusal()
                .unwrap_or(SourceErrorKind::MetadataNotAFile)))
        }
    }
    if first.size > max_bytes {
        return Err(at(SourceErrorKind::MetadataTooLarge {
            size: first.size,
            limit: max_bytes,
        }));
    }
    let mut bytes = Vec::new();
    stream
        .body
        .read_to_end(&mut bytes)
        .map_err(|e| stream.read_error(e))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_fields() {
        assert_eq!(octal(b"0000644\0"), Some(0o644));
        assert_eq!(octal(b"  644 \0"), Some(0o644));
        assert_eq!(octal(b"00000001750\0"), Some(0o1750));
        assert_eq!(octal(b"\0\0\0"), None);
        assert_eq!(octal(b"12x\0"), None);
        assert_eq!(octal(b"12\0 3"), None);
        assert_eq!(octal(b"8"), None);
        assert_eq!(octal(b"77777777777777777777777"), None);
    }

    #[test]
    fn text_fields_refuse_hidden_bytes() {
        assert_eq!(text(b"abc\0\0\0"), b"abc");
        assert_eq!(text(b"abc"), b"abc");
        assert_eq!(text(b"a\0b\0"), b"a\0b");
        assert_eq!(text(b"\0\0"), b"");
    }

    #[test]
    fn pax_records() {
        assert_eq!(parse_pax(b"12 path=a/b\n"), Ok(Some(b"a/b".to_vec())));
        assert_eq!(parse_pax(b"20 mtime=1700000000\n"), Ok(None));
        assert!(matches!(
            parse_pax(b"13 size=1234\n"),
            Err(SourceErrorKind::UnsupportedExtension { .. })
        ));
        assert!(matches!(
            parse_pax(b"99 path=a\n"),
            Err(SourceErrorKind::MalformedHeader { .. })
        ));
        assert!(matches!(
            parse_pax(b"10 path=ab"),
            Err(SourceErrorKind::MalformedHeader { .. })
        ));
        assert!(matches!(
            parse_pax(b"10 path=a\n10 path=b\n"),
            Err(SourceErrorKind::MalformedHeader { .. })
        ));
        assert_eq!(padding(0), 0);
        assert_eq!(padding(1), 511);
        assert_eq!(padding(512), 0);
    }
}
