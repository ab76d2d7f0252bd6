//! The connection protocol of the libfabric reliable-datagram (`FI_EP_RDM`)
//! backend, without I/O: byte formats and per-connection state only. The
//! backend reads and writes the sockets and the fabric endpoint, reads the
//! clock, and feeds what happened into this module.
//!
//! # Two channels
//!
//! Every connection has:
//!
//! - a TCP *control channel* between the two processes (the initiator
//!   connects to the listener's ip:port). It carries the set-up
//!   ([`Frame::Hello`], [`Frame::Accept`], [`Frame::Refuse`]), credits
//!   ([`Frame::Credit`]), the close ([`Frame::Close`]) and heartbeats
//!   ([`Frame::Ping`]), framed as described under [Wire format](#wire-format);
//! - *data messages*, sent over the shared RDM fabric endpoint as tagged
//!   sends (`fi_tsend`) to the peer's fabric address.
//!
//! # Data tags
//!
//! The 64-bit libfabric tag of a data message is:
//!
//! | bits   | content                                                        |
//! |--------|----------------------------------------------------------------|
//! | 0..16  | credits the sender grants back to the receiver (0..=65535)     |
//! | 16..48 | the receiver's connection tag (announced in its HELLO/ACCEPT)  |
//! | 48..64 | 0                                                              |
//!
//! The backend keeps connection tags below 2^31 and uses bit 47 for its
//! set-up probe, which it handles before this module sees a tag.
//!
//! The receiver posts its receive buffers with [`recv_tag`] and the ignore
//! mask [`RECV_IGNORE`], so that any grant matches; the completion's tag
//! carries the grant ([`split_tag`]). The sender builds the tag with
//! [`data_tag`] (in practice [`Session::on_send`] does).
//!
//! # Flow control
//!
//! Each side announces in its HELLO/ACCEPT how many receive buffers it has
//! (`credits`) and how large they are (`buf_size`). A side may send one data
//! message per credit. When the receiver posts a buffer again
//! ([`Session::on_buffer_freed`]) it owes the sender one credit, which it
//! grants back either in the tag of its own next data message or, once half
//! of its buffers are owed, in a CREDIT frame ([`Session::poll_frame`]). A
//! data message sent while a received one is being delivered may grant the
//! credit of that message's buffer before the buffer is posted again
//! ([`Session::on_send_freeing`]); the receiver then posts it as soon as
//! the delivery ends. A sender never holds more credits than the peer
//! announced.
//!
//! # Wire format
//!
//! All integers are little-endian and unsigned. Every frame is a `u32`
//! length (the number of bytes that follow, the type byte included, at most
//! [`MAX_FRAME_LEN`]), a `u8` type and the body:
//!
//! | type | frame  | body                                                                                   |
//! |------|--------|----------------------------------------------------------------------------------------|
//! | 1    | HELLO  | `b"NRDM"`, `u16` version = 1, `u32` tag, `u64` buf_size, `u32` credits, `u16` len + UTF-8 fabric name, `u16` len + fabric address |
//! | 2    | ACCEPT | as HELLO                                                                               |
//! | 3    | REFUSE | `u8` reason ([`RefuseCode`]), `u16` len + UTF-8 text                                    |
//! | 4    | CREDIT | `u32` n                                                                                |
//! | 5    | CLOSE  | `u8` reason ([`CloseCode`]), `u64` deliver, `u64` size, `u64` limit                     |
//! | 6    | PING   | empty                                                                                  |
//!
//! Examples (each is one whole frame):
//!
//! - `PING`: `01 00 00 00 06`
//! - `CREDIT 32`: `05 00 00 00 04 20 00 00 00`
//! - `REFUSE` (fabric mismatch, text `"fabric mismatch"`):
//!   `13 00 00 00 03 02 0f 00 66 61 62 72 69 63 20 6d 69 73 6d 61 74 63 68`
//! - `CLOSE` (message too large: deliver 10, size 1048576, limit 65536):
//!   `1a 00 00 00 05 03 0a 00 00 00 00 00 00 00 00 00 10 00 00 00 00 00 00 00 01 00 00 00 00 00`
//! - `HELLO` (tag 0x01020304, buf_size 65536, credits 64, fabric
//!   `"tcp;ofi_rxm"`, address `02 00 1f 90 7f 00 00 01`):
//!   `2e 00 00 00 01 4e 52 44 4d 01 00 04 03 02 01 00 00 01 00 00 00 00 00 40 00 00 00 0b 00 74 63 70 3b 6f 66 69 5f 72 78 6d 08 00 02 00 1f 90 7f 00 00 01`
//! - `ACCEPT` (tag 7, buf_size 4096, credits 16, fabric `"tcp;ofi_rxm"`,
//!   address `c0 a8 00 02`):
//!   `2a 00 00 00 02 4e 52 44 4d 01 00 07 00 00 00 00 10 00 00 00 00 00 00 10 00 00 00 0b 00 74 63 70 3b 6f 66 69 5f 72 78 6d 04 00 c0 a8 00 02`
//!
//! # Sessions
//!
//! A [`Session`] is the state of one connection: the initiator's
//! ([`Session::initiator`]) or the listener's ([`Session::accept`]). Its
//! per-message methods ([`Session::on_send`], [`Session::on_received`],
//! [`Session::on_buffer_freed`]) do not allocate.

// The backend does not use every item of this module yet.
#![allow(dead_code)]

use std::fmt;
use std::time::Duration;

// ---------------------------------------------------------------------------
// Data tags
// ---------------------------------------------------------------------------

/// The ignore mask of a posted receive buffer: the grant bits (0..16) of an
/// incoming tag may hold any value.
pub const RECV_IGNORE: u64 = 0xFFFF;

/// The tag of a data message sent to a peer whose connection tag is
/// `peer_tag`, granting `grant` credits back to that peer.
pub fn data_tag(peer_tag: u32, grant: u16) -> u64 {
    (u64::from(peer_tag) << 16) | u64::from(grant)
}

/// Splits the tag of a received data message into the connection tag (bits
/// 16..48) and the grant (bits 0..16). Bits 48..64 are not looked at; see
/// [`Session::on_received`] for the full check.
pub fn split_tag(tag: u64) -> (u32, u16) {
    ((tag >> 16) as u32, tag as u16)
}

/// The tag to post receive buffers with (together with [`RECV_IGNORE`]) for
/// the connection whose local tag is `local_tag`.
pub fn recv_tag(local_tag: u32) -> u64 {
    u64::from(local_tag) << 16
}

// ---------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------

/// The magic bytes that open the body of a HELLO or ACCEPT.
pub const MAGIC: [u8; 4] = *b"NRDM";

/// The protocol version this module speaks.
pub const VERSION: u16 = 1;

/// The largest value of a frame's length field (the bytes after the length
/// field, type byte included) that a [`Decoder`] accepts: 64 KiB.
pub const MAX_FRAME_LEN: u32 = 64 * 1024;

/// The size of the fixed fields of a HELLO/ACCEPT body: magic, version, tag,
/// buf_size, credits and the two length fields.
const HELLO_FIXED: usize = 4 + 2 + 4 + 8 + 4 + 2 + 2;

/// The largest fabric name plus address a HELLO/ACCEPT can carry within
/// [`MAX_FRAME_LEN`].
const HELLO_VARIABLE_MAX: usize = MAX_FRAME_LEN as usize - 1 - HELLO_FIXED;

/// The largest REFUSE text within [`MAX_FRAME_LEN`] (reason byte and length
/// field subtracted).
const REFUSE_TEXT_MAX: usize = MAX_FRAME_LEN as usize - 1 - 1 - 2;

/// The type of a control frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Type 1: the initiator's set-up request.
    Hello,
    /// Type 2: the listener's acceptance.
    Accept,
    /// Type 3: the listener's refusal.
    Refuse,
    /// Type 4: a credit grant.
    Credit,
    /// Type 5: a close.
    Close,
    /// Type 6: a heartbeat.
    Ping,
}

impl FrameKind {
    /// The type byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            FrameKind::Hello => 1,
            FrameKind::Accept => 2,
            FrameKind::Refuse => 3,
            FrameKind::Credit => 4,
            FrameKind::Close => 5,
            FrameKind::Ping => 6,
        }
    }

    /// The kind with type byte `code`, if any.
    pub fn from_code(code: u8) -> Option<FrameKind> {
        Some(match code {
            1 => FrameKind::Hello,
            2 => FrameKind::Accept,
            3 => FrameKind::Refuse,
            4 => FrameKind::Credit,
            5 => FrameKind::Close,
            6 => FrameKind::Ping,
            _ => return None,
        })
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Hello => "HELLO",
            FrameKind::Accept => "ACCEPT",
            FrameKind::Refuse => "REFUSE",
            FrameKind::Credit => "CREDIT",
            FrameKind::Close => "CLOSE",
            FrameKind::Ping => "PING",
        })
    }
}

/// Why a listener refused a connection (the reason byte of a REFUSE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseCode {
    /// 1: the listener's connection limit is reached.
    Limit,
    /// 2: the HELLO names another fabric than the listener's.
    FabricMismatch,
    /// 3: the HELLO's protocol version is not supported.
    Version,
    /// 4: any other error.
    Error,
}

impl RefuseCode {
    /// The reason byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            RefuseCode::Limit => 1,
            RefuseCode::FabricMismatch => 2,
            RefuseCode::Version => 3,
            RefuseCode::Error => 4,
        }
    }

    /// The reason with byte `code`, if any.
    pub fn from_code(code: u8) -> Option<RefuseCode> {
        Some(match code {
            1 => RefuseCode::Limit,
            2 => RefuseCode::FabricMismatch,
            3 => RefuseCode::Version,
            4 => RefuseCode::Error,
            _ => return None,
        })
    }
}

impl fmt::Display for RefuseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefuseCode::Limit => "connection limit reached",
            RefuseCode::FabricMismatch => "fabric mismatch",
            RefuseCode::Version => "unsupported protocol version",
            RefuseCode::Error => "error",
        })
    }
}

/// Why a side closes a connection (the reason byte of a CLOSE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// 1: the application closed the connection.
    Orderly,
    /// 2: the sender's listener closed.
    ListenerClosed,
    /// 3: the sender of the CLOSE received a message larger than its
    /// receive buffers; the CLOSE's `size` and `limit` say how large.
    TooLarge,
    /// 4: the sender of the CLOSE saw a protocol error.
    Protocol,
}

impl CloseCode {
    /// The reason byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            CloseCode::Orderly => 1,
            CloseCode::ListenerClosed => 2,
            CloseCode::TooLarge => 3,
            CloseCode::Protocol => 4,
        }
    }

    /// The reason with byte `code`, if any.
    pub fn from_code(code: u8) -> Option<CloseCode> {
        Some(match code {
            1 => CloseCode::Orderly,
            2 => CloseCode::ListenerClosed,
            3 => CloseCode::TooLarge,
            4 => CloseCode::Protocol,
            _ => return None,
        })
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CloseCode::Orderly => "closed by the application",
            CloseCode::ListenerClosed => "listener closed",
            CloseCode::TooLarge => "message too large",
            CloseCode::Protocol => "protocol error",
        })
    }
}

/// The body of a HELLO or ACCEPT: what one side tells the other about
/// itself. The magic and version are not stored: [`Frame::encode`] writes
/// [`MAGIC`] and [`VERSION`], and the [`Decoder`] rejects anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The sender's connection tag: the tag the other side sends data with.
    pub tag: u32,
    /// The sender's receive buffer size: the largest message it takes
    /// (0 = no receive capability).
    pub buf_size: u64,
    /// The sender's receive buffer count: how many messages the other side
    /// may send before the first grant (0 = no receive capability).
    pub credits: u32,
    /// The libfabric provider name, e.g. `tcp;ofi_rxm`.
    pub fabric: String,
    /// The raw fabric address (from `fi_getname`).
    pub addr: Vec<u8>,
}

/// A refusal: the body of a REFUSE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefuseCode,
    /// A human-readable explanation.
    pub text: String,
}

impl Refusal {
    /// A refusal for `reason` with the explanation `text`.
    pub fn new(reason: RefuseCode, text: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            text: text.into(),
        }
    }

    /// The REFUSE frame that carries this refusal.
    pub fn frame(self) -> Frame {
        Frame::Refuse {
            reason: self.reason,
            text: self.text,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.text.is_empty() {
            write!(f, "refused: {}", self.reason)
        } else {
            write!(f, "refused ({}): {}", self.reason, self.text)
        }
    }
}

impl std::error::Error for Refusal {}

/// The body of a CLOSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Close {
    /// Why.
    pub reason: CloseCode,
    /// The number of data messages, counted from the first, that the
    /// receiver of the CLOSE delivers before it reports the close; it drops
    /// the messages beyond.
    pub deliver: u64,
    /// For [`CloseCode::TooLarge`]: the size of the oversized message; for
    /// the other reasons 0 (written as 0 whatever its value).
    pub size: u64,
    /// For [`CloseCode::TooLarge`]: the receive buffer size; for the other
    /// reasons 0 (written as 0 whatever its value).
    pub limit: u64,
}

/// A control-channel frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Type 1: initiator to listener, the set-up request.
    Hello(Hello),
    /// Type 2: listener to initiator, the acceptance.
    Accept(Hello),
    /// Type 3: listener to initiator, the refusal.
    Refuse {
        /// Why.
        reason: RefuseCode,
        /// A human-readable explanation.
        text: String,
    },
    /// Type 4: `n` more messages granted.
    Credit(u32),
    /// Type 5: the sender closes the connection.
    Close(Close),
    /// Type 6: a heartbeat.
    Ping,
}

impl Frame {
    /// The frame's type.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Hello(_) => FrameKind::Hello,
            Frame::Accept(_) => FrameKind::Accept,
            Frame::Refuse { .. } => FrameKind::Refuse,
            Frame::Credit(_) => FrameKind::Credit,
            Frame::Close(_) => FrameKind::Close,
            Frame::Ping => FrameKind::Ping,
        }
    }

    /// Appends the frame, length field included, to `out`.
    ///
    /// Every encoded frame decodes: a field that does not fit is cut short.
    /// The fabric name and address of a HELLO/ACCEPT together keep at most
    /// 65,509 bytes (the name first, at a character boundary; then the
    /// address), and a REFUSE text at most 65,532 bytes (at a character
    /// boundary). Fabric names and addresses are far shorter in practice.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.push(self.kind().code());
        match self {
            Frame::Hello(hello) | Frame::Accept(hello) => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&VERSION.to_le_bytes());
                out.extend_from_slice(&hello.tag.to_le_bytes());
                out.extend_from_slice(&hello.buf_size.to_le_bytes());
                out.extend_from_slice(&hello.credits.to_le_bytes());
                let fabric = truncate_str(&hello.fabric, HELLO_VARIABLE_MAX);
                put_field(out, fabric.as_bytes());
                let room = HELLO_VARIABLE_MAX - fabric.len();
                let addr = &hello.addr[..hello.addr.len().min(room)];
                put_field(out, addr);
            }
            Frame::Refuse { reason, text } => {
                out.push(reason.code());
                put_field(out, truncate_str(text, REFUSE_TEXT_MAX).as_bytes());
            }
            Frame::Credit(n) => out.extend_from_slice(&n.to_le_bytes()),
            Frame::Close(close) => {
                let (size, limit) = match close.reason {
                    CloseCode::TooLarge => (close.size, close.limit),
                    _ => (0, 0),
                };
                out.push(close.reason.code());
                out.extend_from_slice(&close.deliver.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(&limit.to_le_bytes());
            }
            Frame::Ping => {}
        }
        // At most MAX_FRAME_LEN by the truncations above.
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// Appends a `u16` length and `bytes` (at most `u16::MAX` long: the callers
/// have truncated them).
fn put_field(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes[..usize::from(len)]);
}

/// The longest prefix of `s` that has at most `max` bytes and ends at a
/// character boundary.
fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What is wrong with bytes read from the control channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The length field is 0: a frame holds at least its type byte.
    EmptyFrame,
    /// The length field exceeds [`MAX_FRAME_LEN`].
    TooLong(u32),
    /// The type byte is not one of the known types.
    UnknownType(u8),
    /// The body ends before the frame's last field.
    Truncated(FrameKind),
    /// The body has bytes after the frame's last field.
    Trailing {
        /// The frame's type.
        frame: FrameKind,
        /// How many bytes are left over.
        extra: usize,
    },
    /// The HELLO/ACCEPT body does not start with [`MAGIC`].
    BadMagic([u8; 4]),
    /// The HELLO/ACCEPT names a version other than [`VERSION`]. A listener
    /// answers it with the REFUSE of [`WireError::refusal`].
    Version(u16),
    /// A text field is not UTF-8.
    BadUtf8 {
        /// The frame's type.
        frame: FrameKind,
        /// The field's name.
        field: &'static str,
    },
    /// The reason byte of a REFUSE or CLOSE is not a known reason.
    BadReason {
        /// The frame's type.
        frame: FrameKind,
        /// The reason byte.
        code: u8,
    },
    /// A CLOSE whose reason is not 3 (message too large) has a nonzero size
    /// or limit.
    CloseFields {
        /// The reason byte.
        code: u8,
    },
}

impl WireError {
    /// The refusal a listener answers a HELLO with that failed to decode
    /// with this error, if the error calls for one: a
    /// [`RefuseCode::Version`] refusal for [`WireError::Version`], `None`
    /// for the other errors (the listener then drops the connection).
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            WireError::Version(version) => Some(Refusal::new(
                RefuseCode::Version,
                format!(
                    "protocol version {version} is not supported; this listener speaks version {VERSION}"
                ),
            )),
            _ => None,
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::EmptyFrame => {
                f.write_str("frame length is 0; a frame holds at least its type byte")
            }
            WireError::TooLong(len) => write!(
                f,
                "frame length {len} exceeds the limit of {MAX_FRAME_LEN} bytes"
            ),
            WireError::UnknownType(code) => write!(f, "unknown frame type {code}"),
            WireError::Truncated(frame) => {
                write!(f, "{frame} frame ends before its last field")
            }
            WireError::Trailing { frame, extra } => {
                write!(f, "{frame} frame has {extra} bytes after its last field")
            }
            WireError::BadMagic(magic) => write!(
                f,
                "bad magic {:02x} {:02x} {:02x} {:02x} (expected \"NRDM\")",
                magic[0], magic[1], magic[2], magic[3]
            ),
            WireError::Version(version) => write!(
                f,
                "protocol version {version} is not supported (this side speaks version {VERSION})"
            ),
            WireError::BadUtf8 { frame, field } => {
                write!(f, "{field} of a {frame} frame is not UTF-8")
            }
            WireError::BadReason { frame, code } => {
                write!(f, "unknown {frame} reason {code}")
            }
            WireError::CloseFields { code } => write!(
                f,
                "CLOSE with reason {code} has a nonzero size or limit (only reason 3 has them)"
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// A streaming decoder of control-channel frames.
///
/// Bytes go in with [`Decoder::push`] in pieces of any size; frames come
/// out with [`Decoder::next`]. After an error the decoder keeps returning
/// that error and ignores further bytes: the connection is then to be
/// closed.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Received bytes; those before `pos` are consumed.
    buf: Vec<u8>,
    /// The start of the first frame not yet decoded.
    pos: usize,
    /// The error met, if any.
    error: Option<WireError>,
}

impl Decoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Adds bytes read from the control channel.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if self.pos > 0 && self.pos >= self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The number of bytes pushed and not yet decoded into frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next frame: `Ok(None)` when the buffered bytes do not hold a
    /// whole frame yet. An error is reported as soon as the bytes show it
    /// (a bad length or type before the rest of the frame arrives) and
    /// again on every later call.
    // Not `Iterator::next`: the decoder also reports errors, and `Ok(None)`
    // means "more bytes needed", not the end.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Frame>, WireError> {
        if let Some(error) = &self.error {
            return Err(error.clone());
        }
        match decode_frame(&self.buf[self.pos..]) {
            Ok(None) => Ok(None),
            Ok(Some((frame, used))) => {
                self.pos += used;
                if self.pos == self.buf.len() {
                    self.buf.clear();
                    self.pos = 0;
                }
                Ok(Some(frame))
            }
            Err(error) => {
                self.error = Some(error.clone());
                self.buf = Vec::new();
                self.pos = 0;
                Err(error)
            }
        }
    }
}

/// Decodes the frame at the start of `bytes`: the frame and the number of
/// bytes it took, or `Ok(None)` when `bytes` does not hold the whole frame
/// yet and shows no error so far.
pub fn decode_frame(bytes: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
    let Some((len, rest)) = bytes.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*len);
    if len == 0 {
        return Err(WireError::EmptyFrame);
    }
    if len > MAX_FRAME_LEN {
        return Err(WireError::TooLong(len));
    }
    let Some((&code, _)) = rest.split_first() else {
        return Ok(None);
    };
    let kind = FrameKind::from_code(code).ok_or(WireError::UnknownType(code))?;
    let len = len as usize;
    let Some(frame) = rest.get(1..len) else {
        return Ok(None);
    };
    let mut body = Reader { bytes: frame, kind };
    let frame = match kind {
        FrameKind::Hello => Frame::Hello(body.hello()?),
        FrameKind::Accept => Frame::Accept(body.hello()?),
        FrameKind::Refuse => {
            let code = body.u8()?;
            let reason =
                RefuseCode::from_code(code).ok_or(WireError::BadReason { frame: kind, code })?;
            let text = body.text("text")?;
            Frame::Refuse { reason, text }
        }
        FrameKind::Credit => Frame::Credit(body.u32()?),
        FrameKind::Close => {
            let code = body.u8()?;
            let deliver = body.u64()?;
            let size = body.u64()?;
            let limit = body.u64()?;
            let reason =
                CloseCode::from_code(code).ok_or(WireError::BadReason { frame: kind, code })?;
            if reason != CloseCode::TooLarge && (size != 0 || limit != 0) {
                return Err(WireError::CloseFields { code });
            }
            Frame::Close(Close {
                reason,
                deliver,
                size,
                limit,
            })
        }
        FrameKind::Ping => Frame::Ping,
    };
    body.finish()?;
    Ok(Some((frame, 4 + len)))
}

/// Reads the fields of one frame body.
struct Reader<'a> {
    /// The bytes not read yet.
    bytes: &'a [u8],
    /// The frame's type, for errors.
    kind: FrameKind,
}

impl<'a> Reader<'a> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(WireError::Truncated(self.kind))?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A `u16` length and that many bytes.
    fn field(&mut self) -> Result<&'a [u8], WireError> {
        let len = usize::from(self.u16()?);
        if self.bytes.len() < len {
            return Err(WireError::Truncated(self.kind));
        }
        let (field, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(field)
    }

    /// A `u16` length and that many bytes of UTF-8.
    fn text(&mut self, name: &'static str) -> Result<String, WireError> {
        let bytes = self.field()?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| WireError::BadUtf8 {
                frame: self.kind,
                field: name,
            })
    }

    fn hello(&mut self) -> Result<Hello, WireError> {
        let magic = self.array::<4>()?;
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = self.u16()?;
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        let tag = self.u32()?;
        let buf_size = self.u64()?;
        let credits = self.u32()?;
        let fabric = self.text("fabric name")?;
        let addr = self.field()?.to_vec();
        Ok(Hello {
            tag,
            buf_size,
            credits,
            fabric,
            addr,
        })
    }

    fn finish(self) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::Trailing {
                frame: self.kind,
                extra: self.bytes.len(),
            })
        }
    }
}

// ---------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------

/// What the local side of a connection brings to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// The local connection tag: the peer sends data with it (bits 16..48 of
    /// the data tag). Unique among the local endpoint's connections.
    pub tag: u32,
    /// The size of each local receive buffer (0 = no receive capability).
    pub buf_size: u64,
    /// The number of local receive buffers, all posted before the HELLO or
    /// ACCEPT is written (0 = no receive capability).
    pub credits: u32,
    /// The libfabric provider name, e.g. `tcp;ofi_rxm`; both sides must use
    /// the same.
    pub fabric: String,
    /// The local fabric address (from `fi_getname`).
    pub addr: Vec<u8>,
    /// How long the peer may stay silent (no frame, no data) before the
    /// connection times out; `None` = never.
    pub peer_timeout: Option<Duration>,
    /// How long the local side may stay silent before it writes a PING;
    /// `Duration::ZERO` = no heartbeats.
    pub heartbeat: Duration,
}

impl Local {
    /// The HELLO/ACCEPT body announcing this side. A side with a buffer size
    /// of 0 or no buffers announces no receive capability (0 and 0).
    fn hello(&self) -> Hello {
        let (buf_size, credits) = self.capability();
        Hello {
            tag: self.tag,
            buf_size,
            credits,
            fabric: self.fabric.clone(),
            addr: self.addr.clone(),
        }
    }

    /// The announced buffer size and count.
    fn capability(&self) -> (u64, u32) {
        if self.buf_size == 0 || self.credits == 0 {
            (0, 0)
        } else {
            (self.buf_size, self.credits)
        }
    }
}

/// The state of a [`Session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// The initiator wrote its HELLO and waits for ACCEPT or REFUSE.
    Opening,
    /// Set up: data and control frames flow.
    Open,
    /// The local side wrote a CLOSE; only its own cleanup remains. Frames
    /// from the peer are ignored.
    Closing,
    /// Over: refused, or finished ([`Session::finish`]).
    Closed,
}

/// A protocol error of the peer, found by [`Session::on_frame`] or
/// [`Session::on_received`], which report it as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Violation {
    /// A frame that has no place in the session's state.
    UnexpectedFrame {
        /// The frame's type.
        frame: FrameKind,
        /// When it came, e.g. "before ACCEPT".
        when: &'static str,
    },
    /// The ACCEPT names another fabric than the local one.
    FabricMismatch,
    /// The ACCEPT announces a buffer size of 0 with buffers, or buffers of
    /// size 0.
    ReceiveCapability {
        /// The announced buffer size.
        buf_size: u64,
        /// The announced buffer count.
        credits: u32,
    },
    /// A grant (CREDIT or data tag) would raise the send credits above the
    /// peer's announced buffer count.
    TooManyCredits {
        /// The granted credits.
        grant: u32,
        /// The send credits held before the grant.
        held: u32,
        /// The peer's announced buffer count.
        announced: u32,
    },
    /// A data message's tag does not name the local connection tag, or has
    /// bits 48..64 set.
    WrongTag {
        /// The message's tag.
        tag: u64,
        /// The local connection tag.
        expected: u32,
    },
    /// A data message arrived although the local side announced no receive
    /// buffers.
    NoReceiveBuffers,
    /// The peer sent more data messages than it had credits for.
    Overrun {
        /// The number of messages received, this one included.
        received: u64,
        /// The number of messages the peer had credits for.
        allowed: u64,
    },
    /// A CLOSE asks to deliver more messages than the peer had credits for.
    DeliverBeyondCredits {
        /// The CLOSE's deliver count.
        deliver: u64,
        /// The number of messages the peer had credits for.
        allowed: u64,
    },
    /// Data for a session that is [`State::Closed`].
    Closed,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::UnexpectedFrame { frame, when } => {
                write!(f, "unexpected {frame} frame {when}")
            }
            Violation::FabricMismatch => f.write_str("the ACCEPT names another fabric"),
            Violation::ReceiveCapability { buf_size, credits } => write!(
                f,
                "inconsistent receive capability: {credits} buffers of {buf_size} bytes"
            ),
            Violation::TooManyCredits {
                grant,
                held,
                announced,
            } => write!(
                f,
                "a grant of {grant} credits on top of {held} exceeds the peer's {announced} buffers"
            ),
            Violation::WrongTag { tag, expected } => write!(
                f,
                "data tag {tag:#018x} does not carry the connection tag {expected:#010x}"
            ),
            Violation::NoReceiveBuffers => {
                f.write_str("data received on a connection without receive buffers")
            }
            Violation::Overrun { received, allowed } => write!(
                f,
                "the peer sent message {received} with credits for {allowed} messages"
            ),
            Violation::DeliverBeyondCredits { deliver, allowed } => write!(
                f,
                "CLOSE asks to deliver {deliver} messages; the peer had credits for {allowed}"
            ),
            Violation::Closed => f.write_str("data for a closed session"),
        }
    }
}

impl Violation {
    fn event(self) -> Event {
        Event::ProtocolError(self.to_string())
    }
}

/// What a [`Session`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The ACCEPT arrived: the connection is set up (initiator only; the
    /// listener's session is open from [`Session::accept`] on).
    Established {
        /// The peer's connection tag.
        peer_tag: u32,
        /// The peer's receive buffer size: the largest message to send it
        /// (0 = it takes none).
        peer_buf_size: u64,
        /// The peer's fabric address, for `fi_av_insert`.
        peer_addr: Vec<u8>,
    },
    /// The listener refused; the session is [`State::Closed`].
    Refused {
        /// Why.
        reason: RefuseCode,
        /// The listener's explanation.
        text: String,
    },
    /// The peer closes. The caller delivers the data messages for which
    /// [`Session::should_deliver`] holds, waits for [`Session::peer_done`],
    /// then reports the close.
    PeerClosing {
        /// Why.
        reason: CloseCode,
        /// How many data messages, counted from the first, to deliver.
        deliver: u64,
        /// For [`CloseCode::TooLarge`]: the size of the oversized message;
        /// else 0.
        size: u64,
        /// For [`CloseCode::TooLarge`]: the peer's receive buffer size; else
        /// 0.
        limit: u64,
    },
    /// The peer broke the protocol (the text says how); the caller closes
    /// with [`CloseCode::Protocol`].
    ProtocolError(String),
    /// Nothing was heard from the peer for the peer timeout.
    TimedOut,
}

/// The protocol state of one connection.
///
/// The caller owns the control channel and the fabric endpoint. It writes
/// the frames the session returns, feeds decoded frames to
/// [`Session::on_frame`], asks [`Session::on_send`] for the tag of each data
/// message, reports received messages to [`Session::on_received`] and
/// reposted buffers to [`Session::on_buffer_freed`], writes what
/// [`Session::poll_frame`] returns, and calls [`Session::on_tick`] at
/// [`Session::next_deadline`].
#[derive(Debug, Clone)]
pub struct Session {
    state: State,
    local_tag: u32,
    /// The local announced buffer count.
    local_credits: u32,
    fabric: String,
    peer_timeout: Option<Duration>,
    heartbeat: Duration,
    peer_tag: u32,
    peer_buf_size: u64,
    /// The peer's announced buffer count: the most send credits there are.
    peer_credits: u32,
    send_credits: u32,
    /// Credits owed to the peer, not written yet.
    pending_grant: u32,
    /// Credits granted to the peer so far (CREDIT frames and data tags).
    granted: u64,
    sent: u64,
    received: u64,
    /// The peer's CLOSE, once received.
    peer_close: Option<Close>,
    last_heard: Duration,
    last_written: Duration,
    /// Data was sent since the heartbeat clock was last reset.
    wrote_data: bool,
    timed_out: bool,
}

impl Session {
    fn new(local: &Local, state: State, now: Duration) -> Session {
        Session {
            state,
            local_tag: local.tag,
            local_credits: local.capability().1,
            fabric: local.fabric.clone(),
            peer_timeout: local.peer_timeout,
            heartbeat: local.heartbeat,
            peer_tag: 0,
            peer_buf_size: 0,
            peer_credits: 0,
            send_credits: 0,
            pending_grant: 0,
            granted: 0,
            sent: 0,
            received: 0,
            peer_close: None,
            last_heard: now,
            last_written: now,
            wrote_data: false,
            timed_out: false,
        }
    }

    /// The initiator's session, in [`State::Opening`], and the HELLO to
    /// write first on the control channel. The local receive buffers are to
    /// be posted before the HELLO is written: the peer may send as soon as
    /// it accepts, and its data may arrive before its ACCEPT.
    pub fn initiator(local: Local, now: Duration) -> (Session, Frame) {
        let hello = local.hello();
        (
            Session::new(&local, State::Opening, now),
            Frame::Hello(hello),
        )
    }

    /// The listener's session for a received HELLO, in [`State::Open`], and
    /// the ACCEPT to write; or the refusal to write as a REFUSE when the
    /// HELLO names another fabric ([`RefuseCode::FabricMismatch`]) or an
    /// inconsistent receive capability ([`RefuseCode::Error`]). A HELLO of
    /// another protocol version does not decode: see
    /// [`WireError::refusal`].
    pub fn accept(hello: &Hello, local: Local, now: Duration) -> Result<(Session, Frame), Refusal> {
        if hello.fabric != local.fabric {
            return Err(Refusal::new(
                RefuseCode::FabricMismatch,
                format!(
                    "this listener uses fabric {:?}, the HELLO names {:?}",
                    local.fabric, hello.fabric
                ),
            ));
        }
        if (hello.buf_size == 0) != (hello.credits == 0) {
            return Err(Refusal::new(
                RefuseCode::Error,
                Violation::ReceiveCapability {
                    buf_size: hello.buf_size,
                    credits: hello.credits,
                }
                .to_string(),
            ));
        }
        let accept = local.hello();
        let mut session = Session::new(&local, State::Open, now);
        session.set_peer(hello);
        Ok((session, Frame::Accept(accept)))
    }

    fn set_peer(&mut self, peer: &Hello) {
        self.peer_tag = peer.tag;
        self.peer_buf_size = peer.buf_size;
        self.peer_credits = peer.credits;
        self.send_credits = peer.credits;
    }

    /// Handles a frame decoded from the control channel. Every frame counts
    /// as a sign of life of the peer.
    ///
    /// - [`State::Opening`]: ACCEPT opens the session
    ///   ([`Event::Established`]); REFUSE closes it ([`Event::Refused`]);
    ///   anything else is a protocol error.
    /// - [`State::Open`]: CREDIT adds send credits; CLOSE reports
    ///   [`Event::PeerClosing`]; PING does nothing. HELLO, ACCEPT, REFUSE,
    ///   any frame after the peer's CLOSE, and grants beyond the peer's
    ///   announced buffer count are protocol errors.
    /// - [`State::Closing`], [`State::Closed`]: frames are ignored (a CLOSE
    ///   is recorded, see [`Session::peer_close`]).
    pub fn on_frame(&mut self, frame: Frame, now: Duration) -> Option<Event> {
        self.heard(now);
        match self.state {
            State::Opening => match frame {
                Frame::Accept(accept) => Some(self.on_accept(accept)),
                Frame::Refuse { reason, text } => {
                    self.state = State::Closed;
                    Some(Event::Refused { reason, text })
                }
                other => Some(unexpected(&other, "before ACCEPT")),
            },
            State::Open => {
                if self.peer_close.is_some() {
                    return Some(unexpected(&frame, "after the peer's CLOSE"));
                }
                match frame {
                    Frame::Credit(n) => self.add_credits(n).err().map(Violation::event),
                    Frame::Close(close) => {
                        let allowed = self.allowed();
                        if close.deliver > allowed {
                            return Some(
                                Violation::DeliverBeyondCredits {
                                    deliver: close.deliver,
                                    allowed,
                                }
                                .event(),
                            );
                        }
                        self.peer_close = Some(close);
                        Some(Event::PeerClosing {
                            reason: close.reason,
                            deliver: close.deliver,
                            size: close.size,
                            limit: close.limit,
                        })
                    }
                    Frame::Ping => None,
                    other => Some(unexpected(&other, "on an open connection")),
                }
            }
            State::Closing | State::Closed => {
                if let Frame::Close(close) = frame {
                    self.peer_close.get_or_insert(close);
                }
                None
            }
        }
    }

    fn on_accept(&mut self, accept: Hello) -> Event {
        if accept.fabric != self.fabric {
            return Violation::FabricMismatch.event();
        }
        if (accept.buf_size == 0) != (accept.credits == 0) {
            return Violation::ReceiveCapability {
                buf_size: accept.buf_size,
                credits: accept.credits,
            }
            .event();
        }
        self.set_peer(&accept);
        self.state = State::Open;
        Event::Established {
            peer_tag: accept.tag,
            peer_buf_size: accept.buf_size,
            peer_addr: accept.addr,
        }
    }

    fn heard(&mut self, now: Duration) {
        self.last_heard = self.last_heard.max(now);
    }

    /// The number of data messages the peer has had credits for so far.
    fn allowed(&self) -> u64 {
        u64::from(self.local_credits) + self.granted
    }

    /// Adds a grant of the peer to the send credits, if the peer's announced
    /// buffer count allows it.
    fn add_credits(&mut self, grant: u32) -> Result<(), Violation> {
        let total = u64::from(self.send_credits) + u64::from(grant);
        if total > u64::from(self.peer_credits) {
            return Err(Violation::TooManyCredits {
                grant,
                held: self.send_credits,
                announced: self.peer_credits,
            });
        }
        self.send_credits = self
            .peer_credits
            .min(self.send_credits.saturating_add(grant));
        Ok(())
    }

    /// Takes a send credit for one data message: the tag to send it with
    /// (`fi_tsend` to the peer's address), carrying up to 65,535 of the
    /// credits owed to the peer. `None` when there is no credit, the session
    /// is not [`State::Open`], or the peer is closing: the caller answers
    /// that the send cannot proceed now. Does not allocate.
    ///
    /// If the send then fails, [`Session::unsend`] takes the credit
    /// back.
    pub fn on_send(&mut self) -> Option<u64> {
        if self.state != State::Open || self.peer_close.is_some() || self.send_credits == 0 {
            return None;
        }
        self.send_credits -= 1;
        self.sent += 1;
        let grant = u16::try_from(self.pending_grant).unwrap_or(u16::MAX);
        self.pending_grant -= u32::from(grant);
        self.granted += u64::from(grant);
        self.wrote_data = true;
        Some(data_tag(self.peer_tag, grant))
    }

    /// [`Session::on_send`], granting in the same tag one credit more: that
    /// of a receive buffer still in use (its message being delivered) that
    /// the caller posts again as soon as it is free, whatever happens to
    /// the send. `None`, with nothing changed, where [`Session::on_send`]
    /// answers `None`. Lets a reply sent while a message is delivered
    /// carry that message's credit, so that a side with one buffer needs no
    /// CREDIT frame per round trip. Does not allocate.
    pub fn on_send_freeing(&mut self) -> Option<u64> {
        if self.state != State::Open || self.peer_close.is_some() || self.send_credits == 0 {
            return None;
        }
        self.on_buffer_freed();
        self.on_send()
    }

    /// Undoes the last [`Session::on_send`], which returned `tag`, after the
    /// send failed (e.g. `-FI_EAGAIN`): the credit and the grant are given
    /// back and the message is not counted. Does not allocate.
    pub fn unsend(&mut self, tag: u64) {
        let (_, grant) = split_tag(tag);
        self.send_credits = self.send_credits.saturating_add(1);
        self.sent = self.sent.saturating_sub(1);
        self.pending_grant = self.pending_grant.saturating_add(u32::from(grant));
        self.granted = self.granted.saturating_sub(u64::from(grant));
    }

    /// The number of data messages that may be sent now.
    pub fn send_credits(&self) -> u32 {
        self.send_credits
    }

    /// Handles the completion of a received data message with tag `tag`:
    /// checks that the tag names this connection, that the peer had a
    /// credit for the message, and adds the grant the tag carries to the
    /// send credits. Returns the message's sequence number, counted from 0,
    /// or what the peer did wrong. Data counts as a sign of life of the
    /// peer. Does not allocate unless it returns an error.
    ///
    /// Data may arrive in [`State::Opening`] (the peer's data can overtake
    /// its ACCEPT); the caller holds it until [`Event::Established`].
    #[inline]
    pub fn on_received(&mut self, tag: u64, now: Duration) -> Result<u64, String> {
        self.check_received(tag, now).map_err(violation_text)
    }

    #[inline]
    fn check_received(&mut self, tag: u64, now: Duration) -> Result<u64, Violation> {
        if self.state == State::Closed {
            return Err(Violation::Closed);
        }
        let (conn, grant) = split_tag(tag);
        if conn != self.local_tag || tag >> 48 != 0 {
            return Err(Violation::WrongTag {
                tag,
                expected: self.local_tag,
            });
        }
        if self.local_credits == 0 {
            return Err(Violation::NoReceiveBuffers);
        }
        let allowed = self.allowed();
        if self.received >= allowed {
            return Err(Violation::Overrun {
                received: self.received.saturating_add(1),
                allowed,
            });
        }
        self.add_credits(u32::from(grant))?;
        let seq = self.received;
        self.received += 1;
        self.heard(now);
        Ok(seq)
    }

    /// Reports that a receive buffer was posted again: one more credit is
    /// owed to the peer. Does not allocate.
    pub fn on_buffer_freed(&mut self) {
        self.pending_grant = self.pending_grant.saturating_add(1);
    }

    /// The number of credits owed to the peer and not yet granted.
    pub fn pending_grant(&self) -> u32 {
        self.pending_grant
    }

    /// Whether the data message with sequence number `seq` is to be
    /// delivered: false when the peer's CLOSE said to deliver fewer.
    pub fn should_deliver(&self, seq: u64) -> bool {
        self.peer_close.is_none_or(|close| seq < close.deliver)
    }

    /// Whether the peer's CLOSE was received and every message it promised
    /// has arrived.
    pub fn peer_done(&self) -> bool {
        self.peer_close
            .is_some_and(|close| self.received >= close.deliver)
    }

    /// The peer's CLOSE, once received.
    pub fn peer_close(&self) -> Option<Close> {
        self.peer_close
    }

    /// The next control frame to write, if any. Only in [`State::Open`] and
    /// before the peer's CLOSE:
    ///
    /// - a CREDIT granting everything owed, once at least half the local
    ///   buffers (and at least one) are owed;
    /// - else a PING once the heartbeat interval has passed since the local
    ///   side last wrote anything.
    ///
    /// A data message sent with [`Session::on_send`] counts as written at
    /// the next call of this method, so a PING can come up to twice the
    /// heartbeat interval after the last data when this method is called
    /// only at [`Session::next_deadline`].
    pub fn poll_frame(&mut self, now: Duration) -> Option<Frame> {
        if !self.frame_due(now) {
            return None;
        }
        if self.pending_grant >= self.grant_threshold() {
            let n = self.pending_grant;
            self.pending_grant = 0;
            self.granted += u64::from(n);
            // Data sent since the last call counts as written now, as the
            // CREDIT is.
            self.wrote_data = false;
            self.last_written = self.last_written.max(now);
            return Some(Frame::Credit(n));
        }
        self.last_written = now;
        Some(Frame::Ping)
    }

    /// Whether [`Session::poll_frame`] has a frame to write at `now`,
    /// without taking it (a data message sent since the last call counts
    /// as written from here on, as there). A cheap check for the path of
    /// each message, which rarely has a frame to write. Does not allocate.
    #[inline(always)]
    pub fn frame_due(&mut self, now: Duration) -> bool {
        if self.state != State::Open || self.peer_close.is_some() {
            return false;
        }
        if self.pending_grant >= self.grant_threshold() {
            return true;
        }
        if self.wrote_data {
            // Written at `now`: no PING is due (none at all with a zero
            // heartbeat).
            self.wrote_data = false;
            self.last_written = self.last_written.max(now);
            return false;
        }
        !self.heartbeat.is_zero() && now.saturating_sub(self.last_written) >= self.heartbeat
    }

    #[inline]
    fn grant_threshold(&self) -> u32 {
        (self.local_credits / 2).max(1)
    }

    /// The CLOSE frame to write, telling the peer to deliver the first
    /// `deliver` data messages (usually [`Session::sent`]); `size` and
    /// `limit` describe the oversized message for [`CloseCode::TooLarge`]
    /// and are 0 for the other reasons. The session goes to
    /// [`State::Closing`] (unless [`State::Closed`]). To be called once.
    pub fn close(
        &mut self,
        reason: CloseCode,
        deliver: u64,
        size: u64,
        limit: u64,
        now: Duration,
    ) -> Frame {
        if self.state != State::Closed {
            self.state = State::Closing;
        }
        self.last_written = self.last_written.max(now);
        let (size, limit) = if reason == CloseCode::TooLarge {
            (size, limit)
        } else {
            (0, 0)
        };
        Frame::Close(Close {
            reason,
            deliver,
            size,
            limit,
        })
    }

    /// Marks the session [`State::Closed`] once the caller's cleanup is
    /// done.
    pub fn finish(&mut self) {
        self.state = State::Closed;
    }

    /// When to call [`Session::poll_frame`] and [`Session::on_tick`] next:
    /// the earliest of the next heartbeat and, with a peer timeout, the time
    /// the peer times out; `Duration::ZERO` when a CREDIT is due. `None`
    /// outside [`State::Open`] or when nothing is scheduled.
    pub fn next_deadline(&self) -> Option<Duration> {
        if self.state != State::Open {
            return None;
        }
        let mut deadline = None;
        if self.peer_close.is_none() {
            if self.pending_grant >= self.grant_threshold() {
                return Some(Duration::ZERO);
            }
            if !self.heartbeat.is_zero() {
                deadline = self.last_written.checked_add(self.heartbeat);
            }
        }
        if let (Some(timeout), false) = (self.peer_timeout, self.timed_out) {
            if let Some(at) = self.last_heard.checked_add(timeout) {
                deadline = Some(deadline.map_or(at, |d: Duration| d.min(at)));
            }
        }
        deadline
    }

    /// Checks the peer timeout: [`Event::TimedOut`] (once) when the session
    /// is [`State::Open`], a peer timeout is set, and nothing was heard from
    /// the peer for that long.
    pub fn on_tick(&mut self, now: Duration) -> Option<Event> {
        if self.state != State::Open || self.timed_out {
            return None;
        }
        let timeout = self.peer_timeout?;
        if now.saturating_sub(self.last_heard) >= timeout {
            self.timed_out = true;
            Some(Event::TimedOut)
        } else {
            None
        }
    }

    /// The number of data messages sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The number of data messages received.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The peer's connection tag (0 before [`Event::Established`]).
    pub fn peer_tag(&self) -> u32 {
        self.peer_tag
    }

    /// The local connection tag.
    pub fn local_tag(&self) -> u32 {
        self.local_tag
    }

    /// The peer's receive buffer size: the largest message to send it (0
    /// before [`Event::Established`] or when it takes none).
    pub fn peer_buf_size(&self) -> u64 {
        self.peer_buf_size
    }

    /// The session's state.
    pub fn state(&self) -> State {
        self.state
    }
}

/// The text of a violation, out of the per-message path (a violation ends
/// the connection).
#[cold]
#[inline(never)]
fn violation_text(v: Violation) -> String {
    v.to_string()
}

fn unexpected(frame: &Frame, when: &'static str) -> Event {
    Violation::UnexpectedFrame {
        frame: frame.kind(),
        when,
    }
    .event()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FABRIC: &str = "tcp;ofi_rxm";

    // The example frames, as quoted in the module documentation.
    const HELLO_BYTES: &str = "2e 00 00 00 01 4e 52 44 4d 01 00 04 03 02 01 00 00 01 00 00 00 00 00 40 00 00 00 0b 00 74 63 70 3b 6f 66 69 5f 72 78 6d 08 00 02 00 1f 90 7f 00 00 01";
    const ACCEPT_BYTES: &str = "2a 00 00 00 02 4e 52 44 4d 01 00 07 00 00 00 00 10 00 00 00 00 00 00 10 00 00 00 0b 00 74 63 70 3b 6f 66 69 5f 72 78 6d 04 00 c0 a8 00 02";
    const REFUSE_BYTES: &str =
        "13 00 00 00 03 02 0f 00 66 61 62 72 69 63 20 6d 69 73 6d 61 74 63 68";
    const CREDIT_BYTES: &str = "05 00 00 00 04 20 00 00 00";
    const CLOSE_BYTES: &str =
        "1a 00 00 00 05 03 0a 00 00 00 00 00 00 00 00 00 10 00 00 00 00 00 00 00 01 00 00 00 00 00";
    const PING_BYTES: &str = "01 00 00 00 06";

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn hello_example() -> Frame {
        Frame::Hello(Hello {
            tag: 0x0102_0304,
            buf_size: 65536,
            credits: 64,
            fabric: FABRIC.to_string(),
            addr: vec![0x02, 0x00, 0x1f, 0x90, 0x7f, 0x00, 0x00, 0x01],
        })
    }

    fn accept_example() -> Frame {
        Frame::Accept(Hello {
            tag: 7,
            buf_size: 4096,
            credits: 16,
            fabric: FABRIC.to_string(),
            addr: vec![0xc0, 0xa8, 0x00, 0x02],
        })
    }

    fn refuse_example() -> Frame {
        Refusal::new(RefuseCode::FabricMismatch, "fabric mismatch").frame()
    }

    fn close_example() -> Frame {
        Frame::Close(Close {
            reason: CloseCode::TooLarge,
            deliver: 10,
            size: 1_048_576,
            limit: 65536,
        })
    }

    fn examples() -> Vec<(Frame, Vec<u8>)> {
        vec![
            (hello_example(), hex(HELLO_BYTES)),
            (accept_example(), hex(ACCEPT_BYTES)),
            (refuse_example(), hex(REFUSE_BYTES)),
            (Frame::Credit(32), hex(CREDIT_BYTES)),
            (close_example(), hex(CLOSE_BYTES)),
            (Frame::Ping, hex(PING_BYTES)),
        ]
    }

    fn encode(frame: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        frame.encode(&mut out);
        out
    }

    /// The frame after encoding and decoding.
    fn wire(frame: &Frame) -> Frame {
        let mut decoder = Decoder::new();
        decoder.push(&encode(frame));
        let decoded = decoder.next().unwrap().unwrap();
        assert_eq!(decoder.next(), Ok(None));
        assert_eq!(decoder.buffered(), 0);
        decoded
    }

    fn check_example(frame: Frame, bytes: &str) {
        let bytes = hex(bytes);
        assert_eq!(encode(&frame), bytes);
        assert_eq!(decode_frame(&bytes), Ok(Some((frame.clone(), bytes.len()))));
        let mut decoder = Decoder::new();
        decoder.push(&bytes);
        assert_eq!(decoder.next(), Ok(Some(frame)));
        assert_eq!(decoder.next(), Ok(None));
    }

    /// The error the decoder reports for `bytes`, which must not be `Ok`.
    fn decode_err(bytes: &[u8]) -> WireError {
        let mut decoder = Decoder::new();
        decoder.push(bytes);
        let error = decoder.next().unwrap_err();
        // The error sticks, also after more (valid) bytes.
        decoder.push(&hex(PING_BYTES));
        assert_eq!(decoder.next(), Err(error.clone()));
        assert_eq!(decoder.next(), Err(error.clone()));
        assert!(!error.to_string().is_empty());
        error
    }

    fn local(tag: u32, credits: u32) -> Local {
        Local {
            tag,
            buf_size: 4096,
            credits,
            fabric: FABRIC.to_string(),
            addr: vec![10, 0, 0, tag as u8],
            peer_timeout: Some(secs(10)),
            heartbeat: secs(1),
        }
    }

    fn hello_of(frame: Frame) -> Hello {
        match frame {
            Frame::Hello(hello) => hello,
            other => panic!("not a HELLO: {other:?}"),
        }
    }

    /// An initiator (tag 1) and an acceptor (tag 2), set up at time 0
    /// through encoded frames.
    fn establish(initiator_credits: u32, acceptor_credits: u32) -> (Session, Session) {
        let (mut a, hello) = Session::initiator(local(1, initiator_credits), secs(0));
        assert_eq!(a.state(), State::Opening);
        let hello = hello_of(wire(&hello));
        assert_eq!(hello.tag, 1);
        assert_eq!(hello.credits, initiator_credits);
        let (b, accept) = Session::accept(&hello, local(2, acceptor_credits), secs(0)).unwrap();
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.peer_tag(), 1);
        assert_eq!(b.send_credits(), initiator_credits);
        let event = a.on_frame(wire(&accept), secs(0));
        assert_eq!(
            event,
            Some(Event::Established {
                peer_tag: 2,
                peer_buf_size: 4096,
                peer_addr: vec![10, 0, 0, 2],
            })
        );
        assert_eq!(a.state(), State::Open);
        assert_eq!(a.peer_tag(), 2);
        assert_eq!(a.peer_buf_size(), 4096);
        assert_eq!(a.send_credits(), acceptor_credits);
        (a, b)
    }

    // --- tags ---

    #[test]
    fn tag_layout() {
        let tag = data_tag(0x0102_0304, 0x0506);
        assert_eq!(tag, 0x0000_0102_0304_0506);
        assert_eq!(split_tag(tag), (0x0102_0304, 0x0506));
        assert_eq!(recv_tag(0x0102_0304), 0x0000_0102_0304_0000);
        assert_eq!(data_tag(u32::MAX, u16::MAX), 0x0000_FFFF_FFFF_FFFF);
        // A posted buffer matches every grant of its connection and no other
        // connection.
        for grant in [0, 1, 0x8000, u16::MAX] {
            assert_eq!(data_tag(9, grant) & !RECV_IGNORE, recv_tag(9));
            assert_ne!(data_tag(8, grant) & !RECV_IGNORE, recv_tag(9));
        }
    }

    // --- wire format ---

    #[test]
    fn example_hello() {
        check_example(hello_example(), HELLO_BYTES);
    }

    #[test]
    fn example_accept() {
        check_example(accept_example(), ACCEPT_BYTES);
    }

    #[test]
    fn example_refuse() {
        check_example(refuse_example(), REFUSE_BYTES);
    }

    #[test]
    fn example_credit() {
        check_example(Frame::Credit(32), CREDIT_BYTES);
    }

    #[test]
    fn example_close() {
        check_example(close_example(), CLOSE_BYTES);
    }

    #[test]
    fn example_ping() {
        check_example(Frame::Ping, PING_BYTES);
    }

    #[test]
    fn close_reasons_round_trip() {
        for reason in [
            CloseCode::Orderly,
            CloseCode::ListenerClosed,
            CloseCode::TooLarge,
            CloseCode::Protocol,
        ] {
            assert_eq!(CloseCode::from_code(reason.code()), Some(reason));
            let (size, limit) = if reason == CloseCode::TooLarge {
                (u64::MAX, 1)
            } else {
                (0, 0)
            };
            let frame = Frame::Close(Close {
                reason,
                deliver: u64::MAX,
                size,
                limit,
            });
            assert_eq!(encode(&frame).len(), 30);
            assert_eq!(wire(&frame), frame);
            // A size and limit are written for TooLarge only.
            let sized = Frame::Close(Close {
                reason,
                deliver: 5,
                size: 7,
                limit: 8,
            });
            let Frame::Close(decoded) = wire(&sized) else {
                panic!("not a CLOSE")
            };
            assert_eq!(decoded.size != 0, reason == CloseCode::TooLarge);
            assert_eq!(decoded.limit != 0, reason == CloseCode::TooLarge);
        }
        for reason in [
            RefuseCode::Limit,
            RefuseCode::FabricMismatch,
            RefuseCode::Version,
            RefuseCode::Error,
        ] {
            let frame = Refusal::new(reason, "ünïcode text").frame();
            assert_eq!(wire(&frame), frame);
        }
    }

    #[test]
    fn split_at_every_boundary() {
        let frames: Vec<Frame> = examples().into_iter().map(|(f, _)| f).collect();
        let all: Vec<u8> = examples().into_iter().flat_map(|(_, b)| b).collect();
        for split in 0..=all.len() {
            let mut decoder = Decoder::new();
            let mut got = Vec::new();
            for part in [&all[..split], &all[split..]] {
                decoder.push(part);
                while let Some(frame) = decoder.next().unwrap() {
                    got.push(frame);
                }
            }
            assert_eq!(got, frames, "split at {split}");
            assert_eq!(decoder.buffered(), 0);
        }
    }

    #[test]
    fn byte_by_byte() {
        let frames: Vec<Frame> = examples().into_iter().map(|(f, _)| f).collect();
        let all: Vec<u8> = examples().into_iter().flat_map(|(_, b)| b).collect();
        let mut decoder = Decoder::new();
        let mut got = Vec::new();
        for byte in &all {
            decoder.push(std::slice::from_ref(byte));
            while let Some(frame) = decoder.next().unwrap() {
                got.push(frame);
            }
        }
        assert_eq!(got, frames);
    }

    #[test]
    fn truncated_frame_waits() {
        for (frame, bytes) in examples() {
            for cut in 0..bytes.len() {
                let mut decoder = Decoder::new();
                decoder.push(&bytes[..cut]);
                assert_eq!(decoder.next(), Ok(None), "{frame:?} cut at {cut}");
                assert_eq!(decoder.buffered(), cut);
                assert_eq!(decode_frame(&bytes[..cut]), Ok(None));
                decoder.push(&bytes[cut..]);
                assert_eq!(decoder.next(), Ok(Some(frame.clone())));
            }
        }
    }

    #[test]
    fn body_shorter_than_fields() {
        // CREDIT whose length leaves 3 bytes for its u32.
        assert_eq!(
            decode_err(&hex("04 00 00 00 04 20 00 00")),
            WireError::Truncated(FrameKind::Credit)
        );
        // CLOSE without its limit.
        assert_eq!(
            decode_err(&hex(
                "12 00 00 00 05 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
            )),
            WireError::Truncated(FrameKind::Close)
        );
        // HELLO cut after its fabric name, the length adjusted.
        let mut hello = hex(HELLO_BYTES);
        hello.truncate(4 + 1 + 26 + 11 - 2);
        let len = (hello.len() - 4) as u32;
        hello[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode_err(&hello), WireError::Truncated(FrameKind::Hello));
        // HELLO whose address length exceeds what the frame holds.
        let mut hello = hex(HELLO_BYTES);
        hello[40] = 0x09;
        assert_eq!(decode_err(&hello), WireError::Truncated(FrameKind::Hello));
        // REFUSE with only its reason.
        assert_eq!(
            decode_err(&hex("02 00 00 00 03 01")),
            WireError::Truncated(FrameKind::Refuse)
        );
    }

    #[test]
    fn bad_magic_and_version() {
        let mut bytes = hex(HELLO_BYTES);
        bytes[5] = b'X';
        assert_eq!(decode_err(&bytes), WireError::BadMagic(*b"XRDM"));
        let mut bytes = hex(ACCEPT_BYTES);
        bytes[8] = b'm';
        assert_eq!(decode_err(&bytes), WireError::BadMagic(*b"NRDm"));

        let mut bytes = hex(HELLO_BYTES);
        bytes[9] = 2;
        let error = decode_err(&bytes);
        assert_eq!(error, WireError::Version(2));
        let refusal = error.refusal().unwrap();
        assert_eq!(refusal.reason, RefuseCode::Version);
        assert_eq!(wire(&refusal.clone().frame()), refusal.frame());
        assert_eq!(WireError::BadMagic(*b"XRDM").refusal(), None);
    }

    #[test]
    fn length_limits() {
        // One byte over 64 KiB: an error as soon as the length is read.
        assert_eq!(decode_err(&hex("01 00 01 00")), WireError::TooLong(65537));
        assert_eq!(
            decode_err(&hex("ff ff ff ff 06")),
            WireError::TooLong(u32::MAX)
        );
        // Exactly 64 KiB is accepted as a length (this PING then has
        // trailing bytes).
        let mut decoder = Decoder::new();
        decoder.push(&hex("00 00 01 00 06"));
        assert_eq!(decoder.next(), Ok(None));
        decoder.push(&vec![0; 65535]);
        assert_eq!(
            decoder.next(),
            Err(WireError::Trailing {
                frame: FrameKind::Ping,
                extra: 65535
            })
        );
        // Length 0 has no type byte.
        assert_eq!(decode_err(&hex("00 00 00 00")), WireError::EmptyFrame);
    }

    #[test]
    fn unknown_type() {
        // Reported as soon as the type byte is in, before the body.
        assert_eq!(
            decode_err(&hex("05 00 00 00 07")),
            WireError::UnknownType(7)
        );
        assert_eq!(
            decode_err(&hex("01 00 00 00 00")),
            WireError::UnknownType(0)
        );
        assert_eq!(
            decode_err(&hex("01 00 00 00 ff")),
            WireError::UnknownType(255)
        );
    }

    #[test]
    fn trailing_bytes() {
        assert_eq!(
            decode_err(&hex("02 00 00 00 06 00")),
            WireError::Trailing {
                frame: FrameKind::Ping,
                extra: 1
            }
        );
        assert_eq!(
            decode_err(&hex("06 00 00 00 04 01 00 00 00 00")),
            WireError::Trailing {
                frame: FrameKind::Credit,
                extra: 1
            }
        );
        for bytes in [HELLO_BYTES, ACCEPT_BYTES, REFUSE_BYTES, CLOSE_BYTES] {
            let mut bytes = hex(bytes);
            bytes.extend_from_slice(&[0xaa, 0xbb]);
            let len = (bytes.len() - 4) as u32;
            bytes[..4].copy_from_slice(&len.to_le_bytes());
            assert!(matches!(
                decode_err(&bytes),
                WireError::Trailing { extra: 2, .. }
            ));
        }
    }

    #[test]
    fn bad_fields() {
        // REFUSE text that is not UTF-8.
        assert_eq!(
            decode_err(&hex("06 00 00 00 03 01 02 00 ff fe")),
            WireError::BadUtf8 {
                frame: FrameKind::Refuse,
                field: "text"
            }
        );
        // HELLO fabric name that is not UTF-8.
        let mut bytes = hex(HELLO_BYTES);
        bytes[29] = 0xc3;
        assert!(matches!(
            decode_err(&bytes),
            WireError::BadUtf8 {
                frame: FrameKind::Hello,
                ..
            }
        ));
        // Unknown reasons.
        for code in [0u8, 5, 255] {
            assert_eq!(
                decode_err(&[4, 0, 0, 0, 3, code, 0, 0]),
                WireError::BadReason {
                    frame: FrameKind::Refuse,
                    code
                }
            );
            let mut close = hex(CLOSE_BYTES);
            close[5] = code;
            assert_eq!(
                decode_err(&close),
                WireError::BadReason {
                    frame: FrameKind::Close,
                    code
                }
            );
        }
        // A size and limit on a CLOSE that is not "message too large".
        let mut close = hex(CLOSE_BYTES);
        close[5] = 1;
        assert_eq!(decode_err(&close), WireError::CloseFields { code: 1 });
    }

    #[test]
    fn several_frames_and_errors_in_one_push() {
        let mut bytes = hex(PING_BYTES);
        bytes.extend(hex(CREDIT_BYTES));
        bytes.extend(hex("01 00 00 00 09"));
        bytes.extend(hex(PING_BYTES));
        let mut decoder = Decoder::new();
        decoder.push(&bytes);
        assert_eq!(decoder.next(), Ok(Some(Frame::Ping)));
        assert_eq!(decoder.next(), Ok(Some(Frame::Credit(32))));
        assert_eq!(decoder.next(), Err(WireError::UnknownType(9)));
        assert_eq!(decoder.next(), Err(WireError::UnknownType(9)));
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn oversized_fields_are_cut_to_fit() {
        let hello = Frame::Hello(Hello {
            tag: 1,
            buf_size: 1,
            credits: 1,
            fabric: "é".repeat(40_000),
            addr: vec![7; 70_000],
        });
        let bytes = encode(&hello);
        assert_eq!(bytes.len(), 4 + MAX_FRAME_LEN as usize);
        let Frame::Hello(decoded) = wire(&hello) else {
            panic!("not a HELLO")
        };
        assert_eq!(decoded.fabric.len(), HELLO_VARIABLE_MAX - 1);
        assert!(decoded.fabric.chars().all(|c| c == 'é'));
        assert_eq!(decoded.addr, vec![7; 1]);

        let refuse = Refusal::new(RefuseCode::Error, "x".repeat(70_000)).frame();
        let Frame::Refuse { text, .. } = wire(&refuse) else {
            panic!("not a REFUSE")
        };
        assert_eq!(text.len(), REFUSE_TEXT_MAX);
    }

    // --- sessions ---

    #[test]
    fn establish_through_the_wire() {
        let (a, b) = establish(8, 4);
        assert_eq!(a.local_tag(), 1);
        assert_eq!(b.local_tag(), 2);
        assert_eq!(b.peer_buf_size(), 4096);
        assert_eq!(
            (a.sent(), a.received(), b.sent(), b.received()),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn credits_run_out_and_come_back_by_credit_frame() {
        let (mut a, mut b) = establish(8, 4);
        for seq in 0..4 {
            let tag = a.on_send().unwrap();
            assert_eq!(split_tag(tag), (2, 0));
            assert_eq!(b.on_received(tag, secs(0)), Ok(seq));
        }
        assert_eq!(a.on_send(), None);
        assert_eq!(a.send_credits(), 0);
        assert_eq!(a.sent(), 4);
        assert_eq!(b.received(), 4);

        // A CREDIT is written once half the buffers (2 of 4) are owed.
        b.on_buffer_freed();
        assert_eq!(b.poll_frame(secs(0)), None);
        b.on_buffer_freed();
        assert_eq!(b.next_deadline(), Some(Duration::ZERO));
        let credit = b.poll_frame(secs(0)).unwrap();
        assert_eq!(credit, Frame::Credit(2));
        assert_eq!(b.pending_grant(), 0);
        assert_eq!(b.poll_frame(secs(0)), None);

        assert_eq!(a.on_frame(wire(&credit), secs(0)), None);
        assert_eq!(a.send_credits(), 2);
        for seq in 4..6 {
            let tag = a.on_send().unwrap();
            assert_eq!(b.on_received(tag, secs(0)), Ok(seq));
        }
        assert_eq!(a.on_send(), None);
    }

    #[test]
    fn one_buffer_grants_each_message() {
        let (mut a, mut b) = establish(1, 1);
        for seq in 0..3 {
            let tag = a.on_send().unwrap();
            assert_eq!(a.on_send(), None);
            assert_eq!(b.on_received(tag, secs(0)), Ok(seq));
            b.on_buffer_freed();
            let credit = b.poll_frame(secs(0)).unwrap();
            assert_eq!(credit, Frame::Credit(1));
            assert_eq!(a.on_frame(credit, secs(0)), None);
        }
    }

    #[test]
    fn a_reply_sent_during_delivery_grants_the_delivered_buffer_with_one_buffer_each() {
        let (mut a, mut b) = establish(1, 1);
        // a's first message goes on its initial credit; every later one
        // rides on the credit b's reply carried.
        let mut tag = a.on_send().unwrap();
        for seq in 0..3 {
            assert_eq!(a.on_send(), None);
            assert_eq!(b.on_received(tag, secs(0)), Ok(seq));
            // b replies while a's message is delivered: the reply grants
            // the buffer that message holds, and b owes nothing more.
            let reply = b.on_send_freeing().unwrap();
            assert_eq!(split_tag(reply), (1, 1));
            assert_eq!(b.pending_grant(), 0);
            assert_eq!(b.poll_frame(secs(0)), None, "no CREDIT frame");
            assert_eq!(a.on_received(reply, secs(0)), Ok(seq));
            assert_eq!(a.send_credits(), 1);
            tag = a.on_send_freeing().unwrap();
            assert_eq!(split_tag(tag), (2, 1));
            assert_eq!(b.send_credits(), 0);
        }
        // Without a credit nothing is sent and nothing is granted.
        assert_eq!(a.on_send_freeing(), None);
        assert_eq!(a.pending_grant(), 0);
        // A failed send keeps the grant owed.
        assert_eq!(b.on_received(tag, secs(0)), Ok(3));
        let reply = b.on_send_freeing().unwrap();
        b.unsend(reply);
        assert_eq!((b.send_credits(), b.pending_grant()), (1, 1));
        assert_eq!(b.poll_frame(secs(0)), Some(Frame::Credit(1)));
    }

    #[test]
    fn grants_piggyback_on_data() {
        let (mut a, mut b) = establish(8, 4);
        for _ in 0..3 {
            let tag = a.on_send().unwrap();
            b.on_received(tag, secs(0)).unwrap();
        }
        assert_eq!(a.send_credits(), 1);
        b.on_buffer_freed();
        let tag = b.on_send().unwrap();
        assert_eq!(split_tag(tag), (1, 1));
        assert_eq!(b.pending_grant(), 0);
        assert_eq!(a.on_received(tag, secs(0)), Ok(0));
        assert_eq!(a.send_credits(), 2);
        // The next message of b carries no grant.
        assert_eq!(split_tag(b.on_send().unwrap()), (1, 0));
    }

    #[test]
    fn grants_beyond_u16_span_several_messages() {
        let (_, mut b) = establish(8, 200_000);
        for _ in 0..70_000 {
            b.on_buffer_freed();
        }
        // Below the CREDIT threshold of 100,000.
        assert_eq!(b.poll_frame(secs(0)), None);
        assert_eq!(split_tag(b.on_send().unwrap()), (1, u16::MAX));
        assert_eq!(split_tag(b.on_send().unwrap()), (1, 4465));
        assert_eq!(split_tag(b.on_send().unwrap()), (1, 0));
    }

    #[test]
    fn failed_send_gives_back_credit_and_grant() {
        let (mut a, mut b) = establish(8, 4);
        let tag = b.on_send().unwrap();
        a.on_received(tag, secs(0)).unwrap();
        a.on_buffer_freed();
        let tag = a.on_send().unwrap();
        assert_eq!(split_tag(tag), (2, 1));
        assert_eq!((a.send_credits(), a.sent(), a.pending_grant()), (3, 1, 0));
        a.unsend(tag);
        assert_eq!((a.send_credits(), a.sent(), a.pending_grant()), (4, 0, 1));
        let tag = a.on_send().unwrap();
        assert_eq!(split_tag(tag), (2, 1));
        assert_eq!(b.on_received(tag, secs(0)), Ok(0));
        assert_eq!(b.send_credits(), 8);
    }

    #[test]
    fn grants_beyond_the_announced_buffers_are_errors() {
        let (mut a, mut b) = establish(8, 4);
        assert_eq!(
            a.on_frame(Frame::Credit(1), secs(0)),
            Some(
                Violation::TooManyCredits {
                    grant: 1,
                    held: 4,
                    announced: 4
                }
                .event()
            )
        );
        assert_eq!(a.send_credits(), 4);
        // The same in a data tag: the message is not counted.
        assert_eq!(
            a.on_received(data_tag(1, 1), secs(0)),
            Err(Violation::TooManyCredits {
                grant: 1,
                held: 4,
                announced: 4
            }
            .to_string())
        );
        assert_eq!(a.received(), 0);
        // After one send, one credit may come back, not two.
        let tag = a.on_send().unwrap();
        b.on_received(tag, secs(0)).unwrap();
        assert!(a.on_frame(Frame::Credit(2), secs(0)).is_some());
        assert_eq!(a.on_frame(Frame::Credit(1), secs(0)), None);
        assert_eq!(a.send_credits(), 4);
    }

    #[test]
    fn data_checks() {
        let (mut a, mut b) = establish(8, 4);
        assert_eq!(
            a.on_received(data_tag(99, 0), secs(0)),
            Err(Violation::WrongTag {
                tag: data_tag(99, 0),
                expected: 1
            }
            .to_string())
        );
        let high = data_tag(1, 0) | 1 << 48;
        assert_eq!(
            a.on_received(high, secs(0)),
            Err(Violation::WrongTag {
                tag: high,
                expected: 1
            }
            .to_string())
        );
        // b has 4 buffers and granted nothing: a fifth message is an overrun.
        for seq in 0..4 {
            assert_eq!(b.on_received(data_tag(2, 0), secs(0)), Ok(seq));
        }
        assert_eq!(
            b.on_received(data_tag(2, 0), secs(0)),
            Err(Violation::Overrun {
                received: 5,
                allowed: 4
            }
            .to_string())
        );
        // Once granted, one more fits.
        b.on_buffer_freed();
        b.on_buffer_freed();
        assert_eq!(b.poll_frame(secs(0)), Some(Frame::Credit(2)));
        assert_eq!(b.on_received(data_tag(2, 0), secs(0)), Ok(4));
        for error in [
            Violation::Closed,
            Violation::NoReceiveBuffers,
            Violation::FabricMismatch,
        ] {
            assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn no_receive_capability() {
        let mut no_recv = local(1, 5);
        no_recv.buf_size = 0;
        let (mut a, hello) = Session::initiator(no_recv, secs(0));
        let hello = hello_of(wire(&hello));
        assert_eq!((hello.buf_size, hello.credits), (0, 0));
        let (mut b, accept) = Session::accept(&hello, local(2, 4), secs(0)).unwrap();
        assert_eq!(b.send_credits(), 0);
        assert_eq!(b.on_send(), None);
        assert!(matches!(
            a.on_frame(accept, secs(0)),
            Some(Event::Established { .. })
        ));
        assert_eq!(
            a.on_received(data_tag(1, 0), secs(0)),
            Err(Violation::NoReceiveBuffers.to_string())
        );
        assert!(a.on_send().is_some());
    }

    #[test]
    fn inconsistent_receive_capability() {
        let hello = Hello {
            tag: 1,
            buf_size: 0,
            credits: 5,
            fabric: FABRIC.to_string(),
            addr: vec![],
        };
        let refusal = Session::accept(&hello, local(2, 4), secs(0)).unwrap_err();
        assert_eq!(refusal.reason, RefuseCode::Error);

        let (mut a, _) = Session::initiator(local(1, 4), secs(0));
        let accept = Frame::Accept(Hello {
            buf_size: 4096,
            credits: 0,
            ..hello
        });
        assert_eq!(
            a.on_frame(accept, secs(0)),
            Some(
                Violation::ReceiveCapability {
                    buf_size: 4096,
                    credits: 0
                }
                .event()
            )
        );
        assert_eq!(a.state(), State::Opening);
    }

    #[test]
    fn fabric_mismatch_is_refused() {
        let mut verbs = local(1, 4);
        verbs.fabric = "verbs;ofi_rxm".to_string();
        let (mut a, hello) = Session::initiator(verbs, secs(0));
        let hello = hello_of(wire(&hello));
        let refusal = Session::accept(&hello, local(2, 4), secs(0)).unwrap_err();
        assert_eq!(refusal.reason, RefuseCode::FabricMismatch);
        assert!(refusal.text.contains("verbs;ofi_rxm"));
        assert!(refusal.to_string().contains("fabric mismatch"));
        let event = a.on_frame(wire(&refusal.clone().frame()), secs(0));
        assert_eq!(
            event,
            Some(Event::Refused {
                reason: RefuseCode::FabricMismatch,
                text: refusal.text
            })
        );
        assert_eq!(a.state(), State::Closed);
        assert_eq!(a.on_send(), None);
        assert_eq!(a.poll_frame(secs(5)), None);
        assert_eq!(a.on_tick(secs(100)), None);
        assert_eq!(a.next_deadline(), None);
    }

    #[test]
    fn accept_of_another_fabric_is_an_error() {
        let (mut a, _) = Session::initiator(local(1, 4), secs(0));
        let mut other = local(2, 4);
        other.fabric = "sockets".to_string();
        let accept = Frame::Accept(other.hello());
        assert_eq!(
            a.on_frame(accept, secs(0)),
            Some(Violation::FabricMismatch.event())
        );
        assert_eq!(a.state(), State::Opening);
    }

    #[test]
    fn unexpected_frames() {
        for frame in [
            Frame::Credit(1),
            Frame::Ping,
            hello_example(),
            close_example(),
        ] {
            let (mut a, _) = Session::initiator(local(1, 4), secs(0));
            let kind = frame.kind();
            assert_eq!(
                a.on_frame(frame, secs(0)),
                Some(
                    Violation::UnexpectedFrame {
                        frame: kind,
                        when: "before ACCEPT"
                    }
                    .event()
                )
            );
        }
        for frame in [hello_example(), accept_example(), refuse_example()] {
            let (mut a, mut b) = establish(4, 4);
            let kind = frame.kind();
            let expected = Some(
                Violation::UnexpectedFrame {
                    frame: kind,
                    when: "on an open connection",
                }
                .event(),
            );
            assert_eq!(a.on_frame(frame.clone(), secs(0)), expected);
            assert_eq!(b.on_frame(frame, secs(0)), expected);
        }
    }

    #[test]
    fn data_may_overtake_the_accept() {
        let (mut a, hello) = Session::initiator(local(1, 4), secs(0));
        let (mut b, accept) = Session::accept(&hello_of(hello), local(2, 4), secs(0)).unwrap();
        let tag = b.on_send().unwrap();
        assert_eq!(a.on_received(tag, secs(0)), Ok(0));
        assert_eq!(a.state(), State::Opening);
        assert_eq!(a.on_send(), None);
        assert!(matches!(
            a.on_frame(accept, secs(0)),
            Some(Event::Established { .. })
        ));
        assert_eq!(a.received(), 1);
        assert!(a.on_send().is_some());
    }

    #[test]
    fn close_with_deliver_count() {
        let (mut a, mut b) = establish(8, 8);
        let tags: Vec<u64> = (0..5).map(|_| a.on_send().unwrap()).collect();
        let close = a.close(CloseCode::Orderly, 3, 0, 0, secs(1));
        assert_eq!(a.state(), State::Closing);
        assert_eq!(a.on_send(), None);
        assert_eq!(a.poll_frame(secs(9)), None);
        assert_eq!(a.next_deadline(), None);

        // The CLOSE overtakes the data (another channel).
        assert_eq!(
            b.on_frame(wire(&close), secs(1)),
            Some(Event::PeerClosing {
                reason: CloseCode::Orderly,
                deliver: 3,
                size: 0,
                limit: 0,
            })
        );
        assert!(!b.peer_done());
        assert_eq!(b.on_send(), None);
        for (i, tag) in tags.into_iter().enumerate() {
            let seq = b.on_received(tag, secs(1)).unwrap();
            assert_eq!(seq, i as u64);
            assert_eq!(b.should_deliver(seq), seq < 3);
            assert_eq!(b.peer_done(), seq >= 2);
        }
        // Nothing more is written to a closing peer; further frames are
        // errors.
        b.on_buffer_freed();
        b.on_buffer_freed();
        b.on_buffer_freed();
        b.on_buffer_freed();
        assert_eq!(b.poll_frame(secs(5)), None);
        assert_eq!(
            b.on_frame(Frame::Ping, secs(1)),
            Some(
                Violation::UnexpectedFrame {
                    frame: FrameKind::Ping,
                    when: "after the peer's CLOSE"
                }
                .event()
            )
        );
        assert!(b.on_frame(close.clone(), secs(1)).is_some());

        // The closing side ignores what the peer still writes, and records
        // its CLOSE.
        let answer = b.close(CloseCode::Orderly, 0, 0, 0, secs(2));
        assert_eq!(a.on_frame(Frame::Credit(3), secs(2)), None);
        assert_eq!(a.on_frame(wire(&answer), secs(2)), None);
        assert_eq!(
            a.peer_close(),
            Some(Close {
                reason: CloseCode::Orderly,
                deliver: 0,
                size: 0,
                limit: 0,
            })
        );
        a.finish();
        assert_eq!(a.state(), State::Closed);
        assert_eq!(
            a.on_received(data_tag(1, 0), secs(3)),
            Err(Violation::Closed.to_string())
        );
    }

    #[test]
    fn deliver_everything_before_any_close() {
        let (a, _) = establish(4, 4);
        assert!(a.should_deliver(0));
        assert!(a.should_deliver(u64::MAX));
        assert!(!a.peer_done());
    }

    #[test]
    fn close_promising_more_than_credits_is_an_error() {
        let (_, mut b) = establish(8, 8);
        let close = Frame::Close(Close {
            reason: CloseCode::ListenerClosed,
            deliver: 9,
            size: 0,
            limit: 0,
        });
        assert_eq!(
            b.on_frame(close, secs(0)),
            Some(
                Violation::DeliverBeyondCredits {
                    deliver: 9,
                    allowed: 8
                }
                .event()
            )
        );
        assert_eq!(b.peer_close(), None);
    }

    #[test]
    fn close_message_too_large() {
        let (mut a, mut b) = establish(4, 4);
        let close = b.close(CloseCode::TooLarge, 0, 10_000, 4096, secs(0));
        assert_eq!(
            a.on_frame(wire(&close), secs(0)),
            Some(Event::PeerClosing {
                reason: CloseCode::TooLarge,
                deliver: 0,
                size: 10_000,
                limit: 4096,
            })
        );
        assert!(a.peer_done());
        assert!(!a.should_deliver(0));
        // Other reasons carry no size or limit.
        let (mut a, mut b) = establish(4, 4);
        let close = b.close(CloseCode::Protocol, 0, 10_000, 4096, secs(0));
        assert_eq!(
            a.on_frame(wire(&close), secs(0)),
            Some(Event::PeerClosing {
                reason: CloseCode::Protocol,
                deliver: 0,
                size: 0,
                limit: 0,
            })
        );
    }

    #[test]
    fn heartbeat_ping_after_the_interval() {
        let (mut a, _) = establish(4, 4);
        assert_eq!(a.next_deadline(), Some(secs(1)));
        assert_eq!(a.poll_frame(ms(999)), None);
        assert_eq!(a.poll_frame(ms(1000)), Some(Frame::Ping));
        assert_eq!(a.poll_frame(ms(1000)), None);
        assert_eq!(a.poll_frame(ms(1999)), None);
        assert_eq!(a.next_deadline(), Some(ms(2000)));
        assert_eq!(a.poll_frame(ms(2500)), Some(Frame::Ping));
        assert_eq!(a.next_deadline(), Some(ms(3500)));
    }

    #[test]
    fn no_ping_while_data_flows() {
        let (mut a, mut b) = establish(4, 4);
        let mut now = ms(0);
        for _ in 0..20 {
            now += ms(400);
            let tag = a.on_send().unwrap();
            assert_eq!(a.poll_frame(now), None, "at {now:?}");
            b.on_received(tag, now).unwrap();
            b.on_buffer_freed();
            // b's CREDITs keep b from pinging too.
            if let Some(frame) = b.poll_frame(now) {
                assert_eq!(frame, Frame::Credit(2));
                assert_eq!(a.on_frame(frame, now), None);
            }
        }
        // Data stops: a PING one interval later.
        assert_eq!(a.poll_frame(now + ms(999)), None);
        assert_eq!(a.poll_frame(now + ms(1000)), Some(Frame::Ping));
    }

    #[test]
    fn control_frames_reset_the_heartbeat() {
        let (mut a, _) = establish(4, 2);
        a.on_buffer_freed();
        assert_eq!(a.poll_frame(ms(900)), None);
        a.on_buffer_freed();
        assert_eq!(a.poll_frame(ms(900)), Some(Frame::Credit(2)));
        assert_eq!(a.poll_frame(ms(1000)), None);
        assert_eq!(a.poll_frame(ms(1900)), Some(Frame::Ping));
    }

    #[test]
    fn frame_due_answers_as_poll_frame_would_and_takes_nothing() {
        let (mut a, mut b) = establish(4, 4);
        let mut now = ms(0);
        let (mut credits, mut pings) = (0, 0);
        for step in 0..200u64 {
            now += ms(37 * (step % 7));
            // From step 80 to 159 `a` sends nothing: its grants pile up
            // (CREDIT frames) and, once `b` stops too, its heartbeat runs
            // out (PING frames).
            let a_sends = !(80..160).contains(&step);
            let b_sends = !(120..160).contains(&step);
            match step % 5 {
                0 if a_sends => {
                    if let Some(tag) = a.on_send() {
                        b.on_received(tag, now).unwrap();
                        b.on_buffer_freed();
                    }
                }
                1 if b_sends => {
                    if let Some(tag) = b.on_send() {
                        a.on_received(tag, now).unwrap();
                        a.on_buffer_freed();
                    }
                }
                2 => {
                    if let Some(frame) = b.poll_frame(now) {
                        a.on_frame(frame, now);
                    }
                }
                _ => {}
            }
            let due = a.frame_due(now);
            // Asked twice, the same answer: nothing was taken.
            assert_eq!(a.frame_due(now), due, "step {step}");
            let frame = a.poll_frame(now);
            assert_eq!(due, frame.is_some(), "step {step}: {frame:?}");
            if let Some(frame) = frame {
                match frame {
                    Frame::Credit(_) => credits += 1,
                    Frame::Ping => pings += 1,
                    _ => {}
                }
                b.on_frame(frame, now);
            }
            assert!(
                !a.frame_due(now),
                "step {step}: a frame left after poll_frame"
            );
        }
        assert!(
            credits > 0 && pings > 0,
            "the script made {credits} CREDIT and {pings} PING frames"
        );
        a.close(CloseCode::Orderly, 0, 0, 0, now);
        assert!(!a.frame_due(now + secs(100)));
        assert_eq!(a.poll_frame(now + secs(100)), None);
    }

    #[test]
    fn zero_heartbeat_never_pings() {
        let mut quiet = local(1, 4);
        quiet.heartbeat = Duration::ZERO;
        quiet.peer_timeout = None;
        let (mut a, hello) = Session::initiator(quiet, secs(0));
        let (_, accept) = Session::accept(&hello_of(hello), local(2, 4), secs(0)).unwrap();
        a.on_frame(accept, secs(0));
        assert_eq!(a.poll_frame(secs(0)), None);
        assert_eq!(a.poll_frame(secs(1000)), None);
        assert_eq!(a.next_deadline(), None);
        assert_eq!(a.on_tick(secs(1000)), None);
    }

    #[test]
    fn timed_out_after_peer_timeout() {
        let (mut a, mut b) = establish(4, 4);
        assert_eq!(a.on_tick(ms(9999)), None);
        assert_eq!(a.on_frame(Frame::Ping, secs(5)), None);
        assert_eq!(a.on_tick(ms(14_999)), None);
        assert_eq!(a.on_tick(secs(15)), Some(Event::TimedOut));
        assert_eq!(a.on_tick(secs(16)), None);
        assert_eq!(a.on_tick(secs(100)), None);

        // Data counts as a sign of life.
        let mut quiet = b.clone();
        quiet.heartbeat = Duration::ZERO;
        assert_eq!(quiet.next_deadline(), Some(secs(10)));
        let tag = a.on_send().unwrap();
        assert_eq!(b.on_received(tag, secs(8)), Ok(0));
        assert_eq!(b.on_tick(ms(17_999)), None);
        assert_eq!(b.on_tick(secs(18)), Some(Event::TimedOut));
        // After the timeout only the heartbeat is scheduled.
        assert_eq!(b.next_deadline(), Some(secs(1)));
    }

    #[test]
    fn no_timeout_outside_open() {
        let (mut a, _) = Session::initiator(local(1, 4), secs(0));
        assert_eq!(a.next_deadline(), None);
        assert_eq!(a.on_tick(secs(100)), None);
        let (mut b, _) = establish(4, 4);
        b.close(CloseCode::Orderly, 0, 0, 0, secs(0));
        assert_eq!(b.on_tick(secs(100)), None);
    }

    #[test]
    fn deadline_is_the_earliest() {
        let mut l = local(1, 4);
        l.heartbeat = secs(30);
        l.peer_timeout = Some(secs(10));
        let (mut a, hello) = Session::initiator(l, secs(0));
        let (_, accept) = Session::accept(&hello_of(hello), local(2, 4), secs(0)).unwrap();
        a.on_frame(accept, secs(2));
        assert_eq!(a.next_deadline(), Some(secs(12)));
        a.on_frame(Frame::Ping, secs(25));
        assert_eq!(a.next_deadline(), Some(secs(30)));
        // Far-away times do not overflow.
        let mut far = local(1, 4);
        far.heartbeat = Duration::MAX;
        far.peer_timeout = Some(Duration::MAX);
        let (_, hello) = Session::initiator(local(2, 4), secs(0));
        let (b, _) = Session::accept(&hello_of(hello), far, secs(1)).unwrap();
        assert_eq!(b.next_deadline(), None);
    }

    // --- fuzzing ---

    /// xorshift64: a deterministic pseudo-random sequence.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Pushes `bytes` in random pieces and decodes everything; checks that
    /// an error sticks and that decoded frames re-encode to their bytes.
    fn feed(rng: &mut Rng, bytes: &[u8]) -> Vec<Frame> {
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        let mut rest = bytes;
        loop {
            let take = (rng.below(8) as usize).min(rest.len());
            decoder.push(&rest[..take]);
            rest = &rest[take..];
            match decoder.next() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) if rest.is_empty() => break,
                Ok(None) => {}
                Err(error) => {
                    assert!(!error.to_string().is_empty());
                    decoder.push(rest);
                    assert_eq!(decoder.next(), Err(error));
                    break;
                }
            }
        }
        let mut encoded = Vec::new();
        for frame in &frames {
            frame.encode(&mut encoded);
        }
        assert_eq!(&bytes[..encoded.len()], &encoded[..]);
        frames
    }

    #[test]
    fn fuzz_random_bytes() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut decoded = 0;
        for _ in 0..10_000 {
            let len = rng.below(64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Half the time, a plausible header: a small length and a known
            // type, so that the body parsers are reached.
            if rng.below(2) == 0 && bytes.len() >= 5 {
                let body = rng.below(bytes.len() as u64 - 3) as u32;
                bytes[..4].copy_from_slice(&body.to_le_bytes());
                bytes[4] = 1 + rng.below(6) as u8;
            }
            decoded += feed(&mut rng, &bytes).len();
        }
        assert!(decoded > 0);
    }

    #[test]
    fn fuzz_mutated_frames_into_sessions() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let examples = examples();
        let mut decoded = 0;
        for round in 0..10_000u64 {
            let (_, bytes) = &examples[rng.below(examples.len() as u64) as usize];
            let mut bytes = bytes.clone();
            for _ in 0..1 + rng.below(3) {
                match rng.below(3) {
                    0 if !bytes.is_empty() => {
                        let i = rng.below(bytes.len() as u64) as usize;
                        bytes[i] = rng.next() as u8;
                    }
                    1 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
                    _ => bytes.push(rng.next() as u8),
                }
            }
            let frames = feed(&mut rng, &bytes);
            decoded += frames.len();
            // Whatever decodes goes into sessions in every state.
            let (mut opening, _) = Session::initiator(local(1, 4), secs(0));
            let (mut open, mut peer) = establish(4, 4);
            let mut closing = peer.clone();
            closing.close(CloseCode::Protocol, 0, 0, 0, secs(0));
            let now = ms(round);
            for frame in frames {
                for session in [&mut opening, &mut open, &mut peer, &mut closing] {
                    let _ = session.on_frame(frame.clone(), now);
                    let _ = session.on_received(rng.next() >> rng.below(64), now);
                    let _ = session.on_send();
                    let _ = session.poll_frame(now);
                    let _ = session.on_tick(now);
                    assert!(session.send_credits() <= session.peer_credits);
                }
            }
        }
        assert!(decoded > 1000);
    }

    /// The example frames of `docs/libfabric.md` ("The RDM control channel
    /// wire format") decode whole, as the frame each line names, and
    /// encode back to the same bytes.
    #[test]
    fn the_documented_example_frames_decode_as_documented() {
        let doc = include_str!("../../../docs/libfabric.md");
        let start = doc
            .find("### The RDM control channel wire format")
            .expect("the wire format section");
        let block = doc[start..]
            .split("```text")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the example block");
        let mut seen = Vec::new();
        for line in block.lines().filter(|l| !l.trim().is_empty()) {
            let (name, hex) = line.split_once(':').expect("NAME: bytes");
            let bytes: Vec<u8> = hex
                .split_whitespace()
                .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
                .collect();
            let (frame, used) = decode_frame(&bytes)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .unwrap_or_else(|| panic!("{name}: incomplete"));
            assert_eq!(used, bytes.len(), "{name}: one whole frame");
            assert_eq!(frame.kind().to_string().to_uppercase(), name, "{name}");
            let mut again = Vec::new();
            frame.encode(&mut again);
            assert_eq!(again, bytes, "{name}: encodes back to the documented bytes");
            seen.push(name.to_string());
        }
        assert_eq!(
            seen,
            ["PING", "CREDIT", "REFUSE", "CLOSE", "HELLO", "ACCEPT"],
            "one example of each frame"
        );
    }
}
