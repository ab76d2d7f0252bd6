//! The TCP wire format, sans IO: handshake, frame encoding and a streaming
//! frame decoder. Specified in `docs/wire-format.md`; this module is its
//! reference implementation and touches no socket.
//!
//! A stream is a [`Handshake`] followed by frames. Each frame is an 8-byte
//! [`FrameHeader`] (type, three reserved zero bytes, body length as a
//! little-endian `u32`) and its body:
//!
//! - DATA: one message (application header then payload). [`DataPrefix`]
//!   builds the frame header and the application header in one small array,
//!   so a message goes out as one gather write `[prefix, payload…]` with no
//!   allocation.
//! - CLOSE: a [`CloseCode`] and a short reason ([`CloseFrame`]).
//!
//! [`FrameDecoder`] owns a fixed read buffer: the caller reads from the
//! socket into [`FrameDecoder::read_buf`], then takes whole frames out as
//! borrowed slices with [`FrameDecoder::next_frame`]. DATA bodies too large
//! for the buffer come out in parts ([`Frame::DataPart`]) for the caller to
//! assemble in a buffer of its own. Lengths are checked against the
//! receiver's limit as soon as a frame header is complete, before any body
//! byte is buffered. No input makes the decoder panic or allocate.
//!
//! ```
//! use netio_tcp::wire::{DataPrefix, Frame, FrameDecoder, Handshake};
//!
//! // Sender: a handshake, then one message with header "hdr" and payload "hello".
//! let mut stream = Handshake::new(65536).encode().to_vec();
//! let prefix = DataPrefix::new(b"hdr", 5).unwrap();
//! stream.extend_from_slice(prefix.as_bytes());
//! stream.extend_from_slice(b"hello");
//!
//! // Receiver, accepting messages up to 1 KiB.
//! let mut dec = FrameDecoder::new(64 * 1024, Some(1024));
//! assert_eq!(dec.feed(&stream), stream.len());
//! assert_eq!(dec.decode_handshake().unwrap(), Some(Handshake::new(65536)));
//! match dec.next_frame().unwrap() {
//!     Some(Frame::Data(msg)) => assert_eq!(msg, b"hdrhello"),
//!     other => panic!("unexpected {other:?}"),
//! }
//! assert!(dec.next_frame().unwrap().is_none());
//! ```

use std::fmt;

use netio_core::MAX_HEADER_LEN;

/// The 4 bytes every handshake starts with: ASCII `NTIO`.
pub const MAGIC: [u8; 4] = *b"NTIO";

/// The protocol version this implementation speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// Length of a handshake as this implementation sends it.
pub const HANDSHAKE_LEN: usize = 16;

/// The largest handshake length a receiver accepts (longer handshakes of
/// later revisions carry fields that are skipped).
pub const MAX_HANDSHAKE_LEN: usize = 256;

/// Length of a frame header.
pub const FRAME_HEADER_LEN: usize = 8;

/// The largest CLOSE frame body: a 2-byte code and at most
/// [`MAX_CLOSE_REASON_LEN`] bytes of reason.
pub const MAX_CLOSE_BODY_LEN: usize = 256;

/// The longest reason text of a CLOSE frame, in bytes.
pub const MAX_CLOSE_REASON_LEN: usize = MAX_CLOSE_BODY_LEN - 2;

/// The largest message a DATA frame can carry (its length field is a `u32`).
pub const MAX_MESSAGE_LEN: usize = u32::MAX as usize;

/// The smallest read buffer a [`FrameDecoder`] uses: room for the longest
/// handshake or CLOSE frame with margin.
pub const MIN_DECODER_BUFFER: usize = 512;

/// Length of a [`DataPrefix`] at most: frame header plus the longest
/// application header.
pub const MAX_DATA_PREFIX_LEN: usize = FRAME_HEADER_LEN + MAX_HEADER_LEN;

/// Length of a CLOSE frame at most.
pub const MAX_CLOSE_FRAME_LEN: usize = FRAME_HEADER_LEN + MAX_CLOSE_BODY_LEN;

/// Up to 4 received bytes, for error messages about a wrong magic value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ReceivedBytes {
    bytes: [u8; 4],
    len: u8,
}

impl ReceivedBytes {
    fn new(src: &[u8]) -> Self {
        let n = src.len().min(4);
        let mut bytes = [0u8; 4];
        bytes[..n].copy_from_slice(&src[..n]);
        Self {
            bytes,
            len: n as u8,
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Display for ReceivedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.as_bytes().iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ReceivedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{self}]")
    }
}

/// What is wrong with bytes received or a message to be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The stream does not start with `NTIO`: the peer is not a netio peer.
    #[error("not a netio peer: expected the magic bytes 4e 54 49 4f (`NTIO`), received {0}")]
    BadMagic(ReceivedBytes),
    /// The peer speaks another protocol version.
    #[error("peer speaks protocol version {peer}, this side speaks {ours}")]
    UnsupportedVersion {
        /// The peer's version.
        peer: u16,
        /// This side's version.
        ours: u16,
    },
    /// The handshake's length field is below 16 or above 256.
    #[error(
        "handshake length {length} is outside the allowed range {HANDSHAKE_LEN}..={MAX_HANDSHAKE_LEN}"
    )]
    BadHandshakeLength {
        /// The length announced.
        length: u16,
    },
    /// The handshake sets feature flags this side does not know.
    #[error("handshake sets unknown feature flags {flags:#010x}")]
    UnknownHandshakeFlags {
        /// The flags announced.
        flags: u32,
    },
    /// A frame header has a type other than DATA (1) or CLOSE (2).
    #[error("unknown frame type {frame_type:#04x}")]
    UnknownFrameType {
        /// The type byte.
        frame_type: u8,
    },
    /// A frame header's reserved bytes are not zero.
    #[error("frame header reserved bytes are {:02x} {:02x} {:02x}, not zero", .reserved[0], .reserved[1], .reserved[2])]
    ReservedNotZero {
        /// The reserved bytes.
        reserved: [u8; 3],
    },
    /// A DATA frame is longer than this side's receive limit.
    #[error("message of {len} bytes exceeds the receive limit of {limit} bytes")]
    DataTooLarge {
        /// The length announced.
        len: u32,
        /// This side's limit.
        limit: u32,
    },
    /// A DATA frame arrived on a connection that receives no messages.
    #[error("message of {len} bytes arrived on a connection opened without receive capability")]
    DataNotAccepted {
        /// The length announced.
        len: u32,
    },
    /// A CLOSE frame's body is shorter than its 2-byte code or longer than
    /// 256 bytes.
    #[error("CLOSE frame body of {len} bytes; it must be 2 to {MAX_CLOSE_BODY_LEN} bytes")]
    BadCloseLength {
        /// The length announced.
        len: u32,
    },
    /// A message to send is longer than a DATA frame can carry.
    #[error("message of {len} bytes exceeds the frame limit of {MAX_MESSAGE_LEN} bytes")]
    MessageTooLong {
        /// The message length (application header included).
        len: usize,
    },
    /// An application header to send is longer than 16 bytes.
    #[error("application header of {len} bytes is longer than the maximum of {MAX_HEADER_LEN}")]
    HeaderTooLong {
        /// The header length.
        len: usize,
    },
}

impl WireError {
    /// `true` for errors found while decoding a handshake: the connection
    /// is refused without frames.
    pub fn is_handshake_error(&self) -> bool {
        matches!(
            self,
            Self::BadMagic(_)
                | Self::UnsupportedVersion { .. }
                | Self::BadHandshakeLength { .. }
                | Self::UnknownHandshakeFlags { .. }
        )
    }

    /// The code of the CLOSE frame a receiver sends when it finds this error
    /// in a frame: [`CloseCode::MessageTooLarge`] for an oversized DATA
    /// frame, [`CloseCode::ProtocolError`] otherwise.
    pub fn close_code(&self) -> CloseCode {
        match self {
            Self::DataTooLarge { .. } => CloseCode::MessageTooLarge,
            _ => CloseCode::ProtocolError,
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The handshake each side sends first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handshake {
    /// The largest DATA body the sender of the handshake accepts; 0 if it
    /// receives no messages. Informational for the peer.
    pub max_message: u32,
}

impl Handshake {
    /// A handshake announcing `max_message`.
    pub const fn new(max_message: u32) -> Self {
        Self { max_message }
    }

    /// A handshake for a side whose receive limit is `limit` bytes (`None`:
    /// it receives no messages), capped at `u32::MAX`.
    pub fn for_limit(limit: Option<usize>) -> Self {
        Self::new(limit.map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)))
    }

    /// The 16 bytes of this handshake.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(HANDSHAKE_LEN as u16).to_le_bytes());
        b[8..12].copy_from_slice(&0u32.to_le_bytes());
        b[12..16].copy_from_slice(&self.max_message.to_le_bytes());
        b
    }

    /// Decodes a handshake at the start of `input`.
    ///
    /// Returns `Ok(None)` while more bytes are needed, and
    /// `Ok(Some((handshake, consumed)))` once complete; the bytes after
    /// `consumed` are the first frames. Each check fails as soon as the
    /// bytes it needs are there: a wrong first byte is rejected at once.
    pub fn decode(input: &[u8]) -> Result<Option<(Handshake, usize)>, WireError> {
        let n = input.len().min(MAGIC.len());
        if input[..n] != MAGIC[..n] {
            return Err(WireError::BadMagic(ReceivedBytes::new(input)));
        }
        if input.len() < 6 {
            return Ok(None);
        }
        let version = u16_at(input, 4);
        if version != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion {
                peer: version,
                ours: PROTOCOL_VERSION,
            });
        }
        if input.len() < 8 {
            return Ok(None);
        }
        let length = u16_at(input, 6);
        if !(HANDSHAKE_LEN..=MAX_HANDSHAKE_LEN).contains(&usize::from(length)) {
            return Err(WireError::BadHandshakeLength { length });
        }
        let length = usize::from(length);
        if input.len() < length {
            return Ok(None);
        }
        let flags = u32_at(input, 8);
        if flags != 0 {
            return Err(WireError::UnknownHandshakeFlags { flags });
        }
        let max_message = u32_at(input, 12);
        Ok(Some((Handshake { max_message }, length)))
    }

    /// `true` if the sender of this handshake receives messages.
    pub fn receives(&self) -> bool {
        self.max_message > 0
    }
}

/// The type of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// One message.
    Data = 1,
    /// The orderly end of the stream.
    Close = 2,
}

/// A frame header: type and body length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// The frame type.
    pub frame_type: FrameType,
    /// Number of body bytes that follow the header.
    pub len: u32,
}

impl FrameHeader {
    /// The 8 bytes of this header.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0] = self.frame_type as u8;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a frame header, checking its type and reserved bytes (not its
    /// length, which depends on the receiver's limits).
    pub fn decode(b: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, WireError> {
        let frame_type = match b[0] {
            1 => FrameType::Data,
            2 => FrameType::Close,
            t => return Err(WireError::UnknownFrameType { frame_type: t }),
        };
        if b[1..4] != [0, 0, 0] {
            return Err(WireError::ReservedNotZero {
                reserved: [b[1], b[2], b[3]],
            });
        }
        Ok(FrameHeader {
            frame_type,
            len: u32_at(b, 4),
        })
    }
}

/// The bytes that precede a message's payload on the wire: the DATA frame
/// header and the application header, in one fixed array. A message is sent
/// as the gather write `[prefix.as_bytes(), payload slices…]`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DataPrefix {
    bytes: [u8; MAX_DATA_PREFIX_LEN],
    len: u8,
}

impl DataPrefix {
    /// The prefix of a message with application header `header` (at most 16
    /// bytes) and `payload_len` bytes of payload.
    pub fn new(header: &[u8], payload_len: usize) -> Result<Self, WireError> {
        if header.len() > MAX_HEADER_LEN {
            return Err(WireError::HeaderTooLong { len: header.len() });
        }
        let total = header
            .len()
            .checked_add(payload_len)
            .ok_or(WireError::MessageTooLong { len: usize::MAX })?;
        let len = u32::try_from(total).map_err(|_| WireError::MessageTooLong { len: total })?;
        let mut bytes = [0u8; MAX_DATA_PREFIX_LEN];
        bytes[..FRAME_HEADER_LEN].copy_from_slice(
            &FrameHeader {
                frame_type: FrameType::Data,
                len,
            }
            .encode(),
        );
        bytes[FRAME_HEADER_LEN..FRAME_HEADER_LEN + header.len()].copy_from_slice(header);
        Ok(Self {
            bytes,
            len: (FRAME_HEADER_LEN + header.len()) as u8,
        })
    }

    /// The frame header followed by the application header.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Length of the whole message (application header and payload).
    pub fn message_len(&self) -> u32 {
        u32_at(&self.bytes, 4)
    }

    /// Length of the whole frame on the wire.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_LEN as u64 + u64::from(self.message_len())
    }
}

impl fmt::Debug for DataPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataPrefix")
            .field("message_len", &self.message_len())
            .field("header", &&self.as_bytes()[FRAME_HEADER_LEN..])
            .finish()
    }
}

/// Why a connection is closed, carried by a CLOSE frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// 0: the application closed the connection.
    Normal,
    /// 1: the peer sent a DATA frame above this side's limit.
    MessageTooLarge,
    /// 2: the peer broke the wire format.
    ProtocolError,
    /// 3: the endpoint or the process is shutting down.
    GoingAway,
    /// Any other code; receivers treat it like [`CloseCode::Normal`].
    Other(u16),
}

impl CloseCode {
    /// The code's number on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            Self::Normal => 0,
            Self::MessageTooLarge => 1,
            Self::ProtocolError => 2,
            Self::GoingAway => 3,
            Self::Other(c) => c,
        }
    }

    /// The code for a number on the wire.
    pub fn from_u16(code: u16) -> Self {
        match code {
            0 => Self::Normal,
            1 => Self::MessageTooLarge,
            2 => Self::ProtocolError,
            3 => Self::GoingAway,
            c => Self::Other(c),
        }
    }
}

/// An encoded CLOSE frame, in a fixed array.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CloseFrame {
    bytes: [u8; MAX_CLOSE_FRAME_LEN],
    len: u16,
}

impl CloseFrame {
    /// A CLOSE frame with `code` and `reason`, the reason cut to at most
    /// [`MAX_CLOSE_REASON_LEN`] bytes at a character boundary.
    pub fn new(code: CloseCode, reason: &str) -> Self {
        let mut cut = reason.len().min(MAX_CLOSE_REASON_LEN);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let reason = &reason.as_bytes()[..cut];
        let body_len = 2 + reason.len();
        let mut bytes = [0u8; MAX_CLOSE_FRAME_LEN];
        bytes[..FRAME_HEADER_LEN].copy_from_slice(
            &FrameHeader {
                frame_type: FrameType::Close,
                len: body_len as u32,
            }
            .encode(),
        );
        bytes[8..10].copy_from_slice(&code.to_u16().to_le_bytes());
        bytes[10..10 + reason.len()].copy_from_slice(reason);
        Self {
            bytes,
            len: (FRAME_HEADER_LEN + body_len) as u16,
        }
    }

    /// The frame's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for CloseFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloseFrame")
            .field("code", &CloseCode::from_u16(u16_at(&self.bytes, 8)))
            .field(
                "reason",
                &String::from_utf8_lossy(&self.as_bytes()[FRAME_HEADER_LEN + 2..]),
            )
            .finish()
    }
}

/// A frame taken out of a [`FrameDecoder`], borrowing its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A whole message.
    Data(&'a [u8]),
    /// A part of a message too large for the decoder's buffer. Parts come
    /// in order, each non-empty; the message is complete when
    /// `offset + bytes.len() == total_len`.
    DataPart {
        /// Length of the whole message.
        total_len: u32,
        /// Position of `bytes` in the message.
        offset: u32,
        /// The bytes of this part.
        bytes: &'a [u8],
    },
    /// The peer closes the connection. The decoder ignores every byte
    /// after it.
    Close {
        /// Why.
        code: CloseCode,
        /// The reason text as sent (not necessarily UTF-8).
        reason: &'a [u8],
    },
}

impl Frame<'_> {
    /// `true` for the last part of a message, and for a whole message.
    pub fn completes_message(&self) -> bool {
        match *self {
            Frame::Data(_) => true,
            Frame::DataPart {
                total_len,
                offset,
                bytes,
            } => u64::from(offset) + bytes.len() as u64 == u64::from(total_len),
            Frame::Close { .. } => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DecodeState {
    /// Expecting a frame header (or a handshake, if the caller asks for
    /// one).
    Idle,
    /// Inside a DATA frame larger than the buffer: `got` of `total` body
    /// bytes handed out.
    LargeData { total: u32, got: u32 },
    /// A CLOSE frame was decoded; every further byte is discarded.
    Closed,
    /// A decoding error; every further call returns it.
    Failed(WireError),
}

/// A streaming decoder that parses frames straight out of its fixed read
/// buffer.
///
/// Use: read from the socket into [`read_buf`](Self::read_buf), report the
/// count with [`advance`](Self::advance), then call
/// [`next_frame`](Self::next_frame) until it returns `Ok(None)` (more bytes
/// needed) before reading again. A stream starts with a handshake: take it
/// with [`decode_handshake`](Self::decode_handshake) first.
///
/// The buffer is allocated once, in [`new`](Self::new). Partial trailing
/// bytes are kept (moved to the front when room is needed). A DATA frame
/// whose header and body fit in the buffer comes out whole
/// ([`Frame::Data`]); a larger one comes out in parts ([`Frame::DataPart`]).
/// A DATA length above the limit is an error as soon as its header is
/// complete. After an error the decoder returns the same error forever;
/// after a CLOSE frame it discards all input.
pub struct FrameDecoder {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    max_data: Option<u32>,
    state: DecodeState,
}

impl fmt::Debug for FrameDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameDecoder")
            .field("capacity", &self.buf.len())
            .field("buffered", &self.buffered())
            .field("max_data", &self.max_data)
            .field("state", &self.state)
            .finish()
    }
}

impl FrameDecoder {
    /// A decoder with a read buffer of `buffer_size` bytes (at least
    /// [`MIN_DECODER_BUFFER`]) accepting DATA bodies of at most `max_data`
    /// bytes; `None` accepts no DATA frame at all.
    pub fn new(buffer_size: usize, max_data: Option<u32>) -> Self {
        let cap = buffer_size.max(MIN_DECODER_BUFFER);
        Self {
            buf: vec![0u8; cap].into_boxed_slice(),
            start: 0,
            end: 0,
            max_data,
            state: DecodeState::Idle,
        }
    }

    /// Size of the read buffer.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes read but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The DATA limit.
    pub fn max_data(&self) -> Option<u32> {
        self.max_data
    }

    /// `true` once a CLOSE frame has been decoded.
    pub fn is_closed(&self) -> bool {
        self.state == DecodeState::Closed
    }

    /// `true` while inside a DATA frame that comes out in parts.
    pub fn in_large_message(&self) -> bool {
        matches!(self.state, DecodeState::LargeData { .. })
    }

    /// The error the decoder stopped at, if any.
    pub fn error(&self) -> Option<&WireError> {
        match &self.state {
            DecodeState::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The bytes read but not yet decoded.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// `true` when the buffered bytes begin a valid DATA frame within the
    /// limit that is too large for the buffer, so the next
    /// [`next_frame`](Self::next_frame) starts handing it out in parts: a
    /// caller that assembles parts gets its assembly buffer ready first.
    pub fn starts_large_message(&self) -> bool {
        if !matches!(self.state, DecodeState::Idle) || self.buffered() < FRAME_HEADER_LEN {
            return false;
        }
        let mut hb = [0u8; FRAME_HEADER_LEN];
        hb.copy_from_slice(&self.buf[self.start..self.start + FRAME_HEADER_LEN]);
        match (FrameHeader::decode(&hb), self.max_data) {
            (
                Ok(FrameHeader {
                    frame_type: FrameType::Data,
                    len,
                }),
                Some(limit),
            ) => len <= limit && FRAME_HEADER_LEN as u64 + u64::from(len) > self.buf.len() as u64,
            _ => false,
        }
    }

    /// Free space to read into, after the buffered bytes. It is empty only
    /// when whole frames are waiting in the buffer: take them with
    /// [`next_frame`](Self::next_frame) first.
    pub fn read_buf(&mut self) -> &mut [u8] {
        self.make_room();
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were written at the start of
    /// [`read_buf`](Self::read_buf) (clamped to its length).
    pub fn advance(&mut self, n: usize) {
        self.end = self.end.saturating_add(n).min(self.buf.len());
    }

    /// Copies as much of `bytes` as fits into the read buffer and returns
    /// how many bytes were taken. For callers that have bytes in memory
    /// (tests, fuzzing) rather than a socket.
    pub fn feed(&mut self, bytes: &[u8]) -> usize {
        let dst = self.read_buf();
        let n = dst.len().min(bytes.len());
        dst[..n].copy_from_slice(&bytes[..n]);
        self.advance(n);
        n
    }

    /// Bytes the item at the front of the buffer needs contiguously.
    fn needed(&self) -> usize {
        let avail = self.buffered();
        if !matches!(self.state, DecodeState::Idle) || avail < FRAME_HEADER_LEN {
            return MIN_DECODER_BUFFER;
        }
        let len = u32_at(&self.buf[self.start..], 4);
        let total = FRAME_HEADER_LEN as u64 + u64::from(len);
        usize::try_from(total)
            .unwrap_or(usize::MAX)
            .min(self.buf.len())
    }

    /// Moves the buffered bytes to the front when the item they begin needs
    /// more room than is left, or when few bytes are buffered (cheap to
    /// move, and frees the most room for the next read). A full buffer
    /// whose first frame is whole stays put: its frames are taken first
    /// (a receiver paused with its buffer full would otherwise move it all
    /// at each resume).
    fn make_room(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            return;
        }
        if self.start == 0 {
            return;
        }
        let pending = self.buffered();
        let cap = self.buf.len();
        if pending < MIN_DECODER_BUFFER || self.start + self.needed() > cap {
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = pending;
        }
    }

    fn fail(&mut self, e: WireError) -> WireError {
        self.state = DecodeState::Failed(e.clone());
        e
    }

    /// Takes the peer's handshake from the front of the buffer: `Ok(None)`
    /// while incomplete. Call it once, before [`next_frame`](Self::next_frame).
    pub fn decode_handshake(&mut self) -> Result<Option<Handshake>, WireError> {
        if let DecodeState::Failed(e) = &self.state {
            return Err(e.clone());
        }
        match Handshake::decode(&self.buf[self.start..self.end]) {
            Ok(Some((h, n))) => {
                self.start += n;
                Ok(Some(h))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Takes the next frame when it is a DATA frame held whole in the
    /// buffer (the common case of small messages), with fewer steps than
    /// [`next_frame`](Self::next_frame): the message's place in the buffer,
    /// for [`frame_bytes`](Self::frame_bytes). `None`, with nothing changed,
    /// for anything else (another frame type, a header to reject, a frame
    /// not all here, a large message), which `next_frame` then handles.
    #[inline]
    pub(crate) fn take_whole_data(&mut self) -> Option<std::ops::Range<usize>> {
        if !matches!(self.state, DecodeState::Idle) {
            return None;
        }
        let avail = self.end - self.start;
        if avail < FRAME_HEADER_LEN {
            return None;
        }
        let h = &self.buf[self.start..self.start + FRAME_HEADER_LEN];
        // Type DATA (1) and the three reserved bytes zero, as one word.
        if u32_at(h, 0) != 1 {
            return None;
        }
        let len = u32_at(h, 4);
        if len > self.max_data? {
            return None;
        }
        let frame_len = FRAME_HEADER_LEN + len as usize;
        if frame_len > avail {
            return None;
        }
        let at = self.start + FRAME_HEADER_LEN;
        self.start += frame_len;
        Some(at..self.start)
    }

    /// The bytes of a message [`take_whole_data`](Self::take_whole_data)
    /// took.
    #[inline]
    pub(crate) fn frame_bytes(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// The next frame in the buffer, or `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, WireError> {
        // Matched by reference: only a failure's error is cloned.
        match &self.state {
            DecodeState::Idle => self.idle_frame(),
            &DecodeState::LargeData { total, got } => Ok(self.large_part(total, got)),
            DecodeState::Failed(e) => Err(e.clone()),
            DecodeState::Closed => {
                self.start = 0;
                self.end = 0;
                Ok(None)
            }
        }
    }

    fn large_part(&mut self, total: u32, got: u32) -> Option<Frame<'_>> {
        let avail = self.buffered();
        if avail == 0 {
            return None;
        }
        let remaining = total - got;
        let take = usize::try_from(remaining).map_or(avail, |r| r.min(avail));
        let at = self.start;
        self.start += take;
        // `take` is at most `remaining`, so this neither overflows nor
        // passes `total`.
        let now = got + take as u32;
        self.state = if now == total {
            DecodeState::Idle
        } else {
            DecodeState::LargeData { total, got: now }
        };
        Some(Frame::DataPart {
            total_len: total,
            offset: got,
            bytes: &self.buf[at..at + take],
        })
    }

    fn idle_frame(&mut self) -> Result<Option<Frame<'_>>, WireError> {
        let avail = self.buffered();
        if avail < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let mut hb = [0u8; FRAME_HEADER_LEN];
        hb.copy_from_slice(&self.buf[self.start..self.start + FRAME_HEADER_LEN]);
        let header = match FrameHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => return Err(self.fail(e)),
        };
        let len = header.len;
        let frame_len = FRAME_HEADER_LEN as u64 + u64::from(len);
        match header.frame_type {
            FrameType::Data => {
                match self.max_data {
                    None => return Err(self.fail(WireError::DataNotAccepted { len })),
                    Some(limit) if len > limit => {
                        return Err(self.fail(WireError::DataTooLarge { len, limit }))
                    }
                    Some(_) => {}
                }
                if frame_len > self.buf.len() as u64 {
                    self.start += FRAME_HEADER_LEN;
                    self.state = DecodeState::LargeData { total: len, got: 0 };
                    return Ok(self.large_part(len, 0));
                }
                // The frame fits in the buffer, so its length fits a usize.
                let frame_len = frame_len as usize;
                if avail < frame_len {
                    return Ok(None);
                }
                let at = self.start + FRAME_HEADER_LEN;
                self.start += frame_len;
                Ok(Some(Frame::Data(&self.buf[at..self.start])))
            }
            FrameType::Close => {
                if !(2..=MAX_CLOSE_BODY_LEN as u64).contains(&u64::from(len)) {
                    return Err(self.fail(WireError::BadCloseLength { len }));
                }
                let frame_len = frame_len as usize;
                if avail < frame_len {
                    return Ok(None);
                }
                let at = self.start + FRAME_HEADER_LEN;
                self.start += frame_len;
                self.state = DecodeState::Closed;
                let code = CloseCode::from_u16(u16_at(&self.buf, at));
                Ok(Some(Frame::Close {
                    code,
                    reason: &self.buf[at + 2..self.start],
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_frame(msg: &[u8]) -> Vec<u8> {
        let mut v = DataPrefix::new(&[], msg.len()).unwrap().as_bytes().to_vec();
        v.extend_from_slice(msg);
        v
    }

    fn frames_of(dec: &mut FrameDecoder) -> Result<Vec<Vec<u8>>, WireError> {
        let mut out = Vec::new();
        while let Some(f) = dec.next_frame()? {
            match f {
                Frame::Data(d) => out.push(d.to_vec()),
                other => panic!("unexpected frame {other:?}"),
            }
        }
        Ok(out)
    }

    #[test]
    fn a_whole_small_data_frame_is_taken_by_the_short_path_and_nothing_else_is() {
        let mut dec = FrameDecoder::new(64, Some(32));
        let mut bytes = data_frame(b"hello");
        bytes.extend(data_frame(b""));
        dec.feed(&bytes);
        let r = dec.take_whole_data().expect("whole DATA frame");
        assert_eq!(dec.frame_bytes(r), b"hello");
        let r = dec.take_whole_data().expect("an empty message too");
        assert!(dec.frame_bytes(r).is_empty());
        assert_eq!(dec.take_whole_data(), None, "buffer empty");
        // Part of a frame: nothing taken, the general path waits too.
        let f = data_frame(b"0123456789");
        dec.feed(&f[..9]);
        assert_eq!(dec.take_whole_data(), None);
        assert_eq!(dec.buffered(), 9, "nothing consumed");
        dec.feed(&f[9..]);
        let r = dec.take_whole_data().unwrap();
        assert_eq!(dec.frame_bytes(r), b"0123456789");
        // A CLOSE frame goes to next_frame.
        dec.feed(CloseFrame::new(CloseCode::Normal, "bye").as_bytes());
        assert_eq!(dec.take_whole_data(), None);
        assert!(matches!(dec.next_frame(), Ok(Some(Frame::Close { .. }))));
        // Reserved bytes set, or a message over the limit: left for
        // next_frame to reject.
        for bad in [
            {
                let mut f = data_frame(b"x");
                f[2] = 1;
                f
            },
            data_frame(&[7u8; 33]),
        ] {
            let mut dec = FrameDecoder::new(64, Some(32));
            dec.feed(&bad);
            assert_eq!(dec.take_whole_data(), None);
            assert_eq!(dec.buffered(), bad.len());
            assert!(dec.next_frame().is_err());
        }
        // A message larger than the buffer is assembled by next_frame.
        let mut dec = FrameDecoder::new(MIN_DECODER_BUFFER, Some(4096));
        dec.feed(&data_frame(&[1u8; 1000])[..MIN_DECODER_BUFFER]);
        assert_eq!(dec.take_whole_data(), None);
        assert!(dec.starts_large_message());
        // No DATA accepted at all.
        let mut dec = FrameDecoder::new(64, None);
        dec.feed(&data_frame(b"x"));
        assert_eq!(dec.take_whole_data(), None);
        assert!(dec.next_frame().is_err());
    }

    #[test]
    fn handshake_round_trips_and_reports_consumed_length() {
        let mut bytes = Handshake::new(1234).encode().to_vec();
        bytes.extend_from_slice(b"rest");
        assert_eq!(
            Handshake::decode(&bytes),
            Ok(Some((Handshake::new(1234), HANDSHAKE_LEN)))
        );
        for n in 0..HANDSHAKE_LEN {
            assert_eq!(Handshake::decode(&bytes[..n]), Ok(None), "prefix of {n}");
        }
    }

    #[test]
    fn handshake_for_limit_caps_and_maps_none_to_zero() {
        assert_eq!(Handshake::for_limit(None).max_message, 0);
        assert!(!Handshake::for_limit(None).receives());
        assert_eq!(Handshake::for_limit(Some(10)).max_message, 10);
        assert_eq!(Handshake::for_limit(Some(usize::MAX)).max_message, u32::MAX);
    }

    #[test]
    fn handshake_bad_magic_is_rejected_at_the_first_wrong_byte() {
        let e = Handshake::decode(b"G").unwrap_err();
        assert_eq!(e, WireError::BadMagic(ReceivedBytes::new(b"G")));
        assert!(e.is_handshake_error());
        assert!(e.to_string().contains("received 47"), "{e}");
        let e = Handshake::decode(b"NTIX\x01\x00").unwrap_err();
        assert!(e.to_string().contains("4e 54 49 58"), "{e}");
    }

    #[test]
    fn handshake_other_version_is_rejected_after_six_bytes() {
        let e = Handshake::decode(b"NTIO\x02\x00").unwrap_err();
        assert_eq!(e, WireError::UnsupportedVersion { peer: 2, ours: 1 });
        assert_eq!(
            e.to_string(),
            "peer speaks protocol version 2, this side speaks 1"
        );
    }

    #[test]
    fn handshake_length_outside_range_is_rejected() {
        for length in [0u16, 15, 257, u16::MAX] {
            let mut b = Handshake::new(1).encode();
            b[6..8].copy_from_slice(&length.to_le_bytes());
            assert_eq!(
                Handshake::decode(&b[..8]),
                Err(WireError::BadHandshakeLength { length })
            );
        }
    }

    #[test]
    fn handshake_longer_revision_skips_unknown_fields() {
        let mut b = Handshake::new(77).encode().to_vec();
        b[6..8].copy_from_slice(&20u16.to_le_bytes());
        b.extend_from_slice(&[9, 9, 9, 9]);
        assert_eq!(Handshake::decode(&b[..19]), Ok(None));
        assert_eq!(Handshake::decode(&b), Ok(Some((Handshake::new(77), 20))));
    }

    #[test]
    fn handshake_unknown_flags_are_rejected() {
        let mut b = Handshake::new(1).encode();
        b[8] = 0x04;
        assert_eq!(
            Handshake::decode(&b),
            Err(WireError::UnknownHandshakeFlags { flags: 4 })
        );
    }

    #[test]
    fn handshake_flags_are_checked_once_all_length_bytes_are_in() {
        // A 20-byte handshake with an unknown flag: its first 16 bytes hold
        // the flags, but the rule applies once the whole handshake is in
        // (rules 1-3 as their bytes arrive, rules 4-5 after `length`).
        let mut b = Handshake::new(1).encode().to_vec();
        b[6..8].copy_from_slice(&20u16.to_le_bytes());
        b[8] = 0x01;
        b.extend_from_slice(&[0; 4]);
        assert_eq!(Handshake::decode(&b[..16]), Ok(None));
        assert_eq!(Handshake::decode(&b[..19]), Ok(None));
        assert_eq!(
            Handshake::decode(&b),
            Err(WireError::UnknownHandshakeFlags { flags: 1 })
        );
        // A bad version is rejected at once, before `length` bytes.
        b[4] = 2;
        assert!(matches!(
            Handshake::decode(&b[..6]),
            Err(WireError::UnsupportedVersion { peer: 2, .. })
        ));
    }

    #[test]
    fn frame_header_rejects_unknown_type_and_reserved_bytes() {
        let mut dec = FrameDecoder::new(0, Some(100));
        dec.feed(&[3, 0, 0, 0, 0, 0, 0, 0]);
        let e = dec.next_frame().unwrap_err();
        assert_eq!(e, WireError::UnknownFrameType { frame_type: 3 });
        assert_eq!(e.close_code(), CloseCode::ProtocolError);
        assert!(!e.is_handshake_error());
        // Poisoned: the same error again.
        assert_eq!(dec.next_frame().unwrap_err(), e);
        assert_eq!(dec.error(), Some(&e));

        let mut dec = FrameDecoder::new(0, Some(100));
        dec.feed(&[1, 0, 7, 0, 0, 0, 0, 0]);
        let e = dec.next_frame().unwrap_err();
        assert_eq!(
            e,
            WireError::ReservedNotZero {
                reserved: [0, 7, 0]
            }
        );
        assert!(e.to_string().contains("00 07 00"), "{e}");
    }

    #[test]
    fn data_above_limit_is_rejected_from_the_header_alone() {
        let mut dec = FrameDecoder::new(0, Some(100));
        dec.feed(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        let e = dec.next_frame().unwrap_err();
        assert_eq!(
            e,
            WireError::DataTooLarge {
                len: u32::MAX,
                limit: 100
            }
        );
        assert_eq!(e.close_code(), CloseCode::MessageTooLarge);
        // Exactly at the limit is fine.
        let mut dec = FrameDecoder::new(0, Some(3));
        dec.feed(&data_frame(b"abc"));
        assert_eq!(frames_of(&mut dec).unwrap(), vec![b"abc".to_vec()]);
    }

    #[test]
    fn data_on_a_connection_without_receive_is_rejected() {
        let mut dec = FrameDecoder::new(0, None);
        dec.feed(&data_frame(b""));
        assert_eq!(
            dec.next_frame().unwrap_err(),
            WireError::DataNotAccepted { len: 0 }
        );
    }

    #[test]
    fn close_frame_of_bad_length_is_rejected() {
        for len in [0u32, 1, 257, u32::MAX] {
            let mut dec = FrameDecoder::new(0, None);
            let mut b = [2, 0, 0, 0, 0, 0, 0, 0];
            b[4..].copy_from_slice(&len.to_le_bytes());
            dec.feed(&b);
            assert_eq!(
                dec.next_frame().unwrap_err(),
                WireError::BadCloseLength { len }
            );
        }
    }

    #[test]
    fn close_frame_round_trips_and_ends_the_stream() {
        let mut dec = FrameDecoder::new(0, None);
        let mut bytes = CloseFrame::new(CloseCode::GoingAway, "shutting down")
            .as_bytes()
            .to_vec();
        bytes.extend_from_slice(&data_frame(b"ignored"));
        dec.feed(&bytes);
        assert_eq!(
            dec.next_frame().unwrap(),
            Some(Frame::Close {
                code: CloseCode::GoingAway,
                reason: b"shutting down"
            })
        );
        assert!(dec.is_closed());
        assert_eq!(dec.next_frame().unwrap(), None);
        assert_eq!(dec.buffered(), 0);
        dec.feed(&[0xff; 100]);
        assert_eq!(dec.next_frame().unwrap(), None);
    }

    #[test]
    fn close_reason_is_cut_at_a_char_boundary() {
        let long = "é".repeat(200); // 400 bytes
        let f = CloseFrame::new(CloseCode::Normal, &long);
        let reason = &f.as_bytes()[10..];
        assert_eq!(reason.len(), MAX_CLOSE_REASON_LEN);
        assert!(std::str::from_utf8(reason).is_ok());
        let odd = format!("x{long}");
        let f = CloseFrame::new(CloseCode::Other(9), &odd);
        let reason = &f.as_bytes()[10..];
        assert_eq!(reason.len(), MAX_CLOSE_REASON_LEN - 1);
        assert!(std::str::from_utf8(reason).is_ok());
        assert!(format!("{f:?}").contains("Other(9)"));
    }

    #[test]
    fn close_codes_round_trip() {
        for c in 0..10u16 {
            assert_eq!(CloseCode::from_u16(c).to_u16(), c);
        }
    }

    #[test]
    fn data_prefix_checks_header_and_total_length() {
        assert_eq!(
            DataPrefix::new(&[0; 17], 0),
            Err(WireError::HeaderTooLong { len: 17 })
        );
        let p = DataPrefix::new(&[0; 16], MAX_MESSAGE_LEN - 16).unwrap();
        assert_eq!(p.message_len(), u32::MAX);
        assert_eq!(p.frame_len(), 8 + u64::from(u32::MAX));
        assert_eq!(p.as_bytes().len(), 24);
        assert!(format!("{p:?}").contains("message_len"));
        let e = DataPrefix::new(&[0; 1], MAX_MESSAGE_LEN).unwrap_err();
        assert_eq!(
            e,
            WireError::MessageTooLong {
                len: MAX_MESSAGE_LEN + 1
            }
        );
        assert_eq!(
            DataPrefix::new(&[0; 1], usize::MAX),
            Err(WireError::MessageTooLong { len: usize::MAX })
        );
    }

    #[test]
    fn large_messages_come_out_in_parts() {
        let msg: Vec<u8> = (0..2000u32).map(|i| i as u8).collect();
        let mut dec = FrameDecoder::new(MIN_DECODER_BUFFER, Some(5000));
        let mut stream = data_frame(&msg);
        stream.extend_from_slice(&data_frame(b"small"));
        let mut got = Vec::new();
        let mut whole = Vec::new();
        let mut rest = &stream[..];
        let mut rounds = 0;
        while !rest.is_empty() {
            rounds += 1;
            assert!(rounds < 100);
            let n = dec.feed(rest);
            rest = &rest[n..];
            while let Some(f) = dec.next_frame().unwrap() {
                match f {
                    Frame::DataPart {
                        total_len,
                        offset,
                        bytes,
                    } => {
                        assert_eq!(total_len, 2000);
                        assert_eq!(offset as usize, got.len());
                        assert!(!bytes.is_empty());
                        got.extend_from_slice(bytes);
                        assert!(dec.in_large_message() || got.len() == 2000);
                    }
                    Frame::Data(d) => whole.push(d.to_vec()),
                    Frame::Close { .. } => panic!("no close sent"),
                }
            }
        }
        assert_eq!(got, msg);
        assert_eq!(whole, vec![b"small".to_vec()]);
    }

    #[test]
    fn starts_large_message_predicts_parts() {
        let mut dec = FrameDecoder::new(0, Some(100_000));
        assert!(!dec.starts_large_message());
        dec.feed(&[1, 0, 0, 0]);
        assert!(!dec.starts_large_message());
        dec.feed(&10_000u32.to_le_bytes());
        assert!(dec.starts_large_message());
        assert_eq!(dec.pending().len(), 8);
        assert!(matches!(
            dec.next_frame().unwrap(),
            None | Some(Frame::DataPart { .. })
        ));
        assert!(!dec.starts_large_message());
        // Over the limit, or small enough to come out whole: no.
        let mut dec = FrameDecoder::new(0, Some(100));
        dec.feed(&[1, 0, 0, 0, 0xff, 0, 0, 0]);
        assert!(!dec.starts_large_message());
        let mut dec = FrameDecoder::new(0, Some(100));
        dec.feed(&[1, 0, 0, 0, 50, 0, 0, 0]);
        assert!(!dec.starts_large_message());
    }

    #[test]
    fn largest_length_streams_without_overflow() {
        let mut dec = FrameDecoder::new(0, Some(u32::MAX));
        dec.feed(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
        assert_eq!(
            dec.next_frame().unwrap(),
            Some(Frame::DataPart {
                total_len: u32::MAX,
                offset: 0,
                bytes: &[1, 2, 3]
            })
        );
        assert_eq!(dec.next_frame().unwrap(), None);
    }

    #[test]
    fn advance_is_clamped_and_read_buf_never_empty_while_incomplete() {
        let mut dec = FrameDecoder::new(0, Some(10_000));
        let cap = dec.capacity();
        dec.advance(usize::MAX);
        assert_eq!(dec.buffered(), cap);
        // The buffer holds garbage: zero bytes are an unknown frame type.
        assert!(dec.next_frame().is_err());

        // A frame that fits exactly is always readable in full.
        let mut dec = FrameDecoder::new(0, Some(10_000));
        let msg = vec![7u8; cap - FRAME_HEADER_LEN];
        let mut stream = data_frame(b"x");
        stream.extend_from_slice(&data_frame(&msg));
        let mut rest = &stream[..];
        let mut seen = 0;
        for _ in 0..100 {
            if rest.is_empty() {
                break;
            }
            assert!(!dec.read_buf().is_empty() || dec.buffered() > 0);
            let n = dec.feed(rest);
            rest = &rest[n..];
            while let Some(f) = dec.next_frame().unwrap() {
                assert!(matches!(f, Frame::Data(_)));
                seen += 1;
            }
        }
        assert_eq!(seen, 2);
    }

    /// A full buffer whose first frame is whole (a paused receiver's) is
    /// not moved when read room is asked for: the room is empty until its
    /// frames were taken, and then the whole buffer is free.
    #[test]
    fn a_full_buffer_of_whole_frames_is_taken_before_it_is_moved() {
        let mut dec = FrameDecoder::new(4096, Some(100));
        let cap = dec.capacity();
        let frame = data_frame(&[5u8; 64]);
        let mut stream = Vec::new();
        while stream.len() < 2 * cap {
            stream.extend_from_slice(&frame);
        }
        let mut rest = &stream[..];
        let n = dec.feed(rest);
        rest = &rest[n..];
        assert_eq!(dec.buffered(), cap, "full");
        // Take one frame, as a receiver does before it pauses.
        assert!(dec.next_frame().unwrap().is_some());
        let pending = dec.buffered();
        assert!(pending > MIN_DECODER_BUFFER);
        assert!(dec.read_buf().is_empty(), "no room and nothing moved");
        assert_eq!(dec.buffered(), pending);
        // Take every whole frame: the rest is less than a frame, cheap to
        // move, and the room is the whole buffer but it.
        let mut taken = 1;
        while dec.next_frame().unwrap().is_some() {
            taken += 1;
        }
        let left = dec.buffered();
        assert!(left < frame.len());
        assert_eq!(dec.read_buf().len(), cap - left);
        let n = dec.feed(rest);
        assert!(n > 0);
        while dec.next_frame().unwrap().is_some() {
            taken += 1;
        }
        assert_eq!(taken, (cap + n) / frame.len());
    }

    #[test]
    fn handshake_then_frames_in_one_read() {
        let mut bytes = Handshake::new(9).encode().to_vec();
        bytes.extend_from_slice(&data_frame(b"one"));
        bytes.extend_from_slice(&data_frame(b"two"));
        let mut dec = FrameDecoder::new(0, Some(9));
        dec.feed(&bytes);
        assert_eq!(dec.decode_handshake().unwrap(), Some(Handshake::new(9)));
        assert_eq!(
            frames_of(&mut dec).unwrap(),
            vec![b"one".to_vec(), b"two".to_vec()]
        );
        let mut bad = FrameDecoder::new(0, Some(9));
        bad.feed(b"HTTP/1.1");
        assert!(bad.decode_handshake().is_err());
        assert!(bad.decode_handshake().is_err());
        assert!(bad.next_frame().is_err());
    }
}
