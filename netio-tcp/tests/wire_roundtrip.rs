//! Property: any sequence of messages, encoded as a stream and cut into any
//! chunks, decodes to the same messages in order, through a decoder of any
//! buffer size (so large messages come out in parts).

use quickcheck::{Arbitrary, Gen, QuickCheck};

use netio_tcp::wire::{
    CloseCode, CloseFrame, DataPrefix, Frame, FrameDecoder, Handshake, MIN_DECODER_BUFFER,
};

/// One message: application header (≤ 16 bytes) and payload.
#[derive(Debug, Clone)]
struct Message {
    header: Vec<u8>,
    payload: Vec<u8>,
}

impl Arbitrary for Message {
    fn arbitrary(g: &mut Gen) -> Self {
        let hlen = usize::arbitrary(g) % 17;
        // Mostly small, sometimes larger than the smallest decoder buffer.
        let plen = match u8::arbitrary(g) % 8 {
            0 => 0,
            1 => usize::arbitrary(g) % 3000,
            _ => usize::arbitrary(g) % 64,
        };
        Message {
            header: (0..hlen).map(|_| u8::arbitrary(g)).collect(),
            payload: (0..plen).map(|_| u8::arbitrary(g)).collect(),
        }
    }
}

/// A whole test case: the stream's content and how it is received.
#[derive(Debug, Clone)]
struct Case {
    max_message: u32,
    messages: Vec<Message>,
    close: Option<(u16, String)>,
    /// Sizes of the chunks the stream arrives in (cycled), each ≥ 1.
    chunks: Vec<usize>,
    buffer_size: usize,
}

impl Arbitrary for Case {
    fn arbitrary(g: &mut Gen) -> Self {
        let n = usize::arbitrary(g) % 12;
        let nchunks = 1 + usize::arbitrary(g) % 8;
        Case {
            max_message: u32::arbitrary(g),
            messages: (0..n).map(|_| Message::arbitrary(g)).collect(),
            close: Option::<(u16, String)>::arbitrary(g),
            chunks: (0..nchunks)
                .map(|_| match u8::arbitrary(g) % 4 {
                    0 => 1,
                    1 => 1 + usize::arbitrary(g) % 16,
                    _ => 1 + usize::arbitrary(g) % 4096,
                })
                .collect(),
            buffer_size: MIN_DECODER_BUFFER + usize::arbitrary(g) % 4096,
        }
    }
}

fn encode(case: &Case) -> Vec<u8> {
    let mut out = Handshake::new(case.max_message).encode().to_vec();
    for m in &case.messages {
        let p = DataPrefix::new(&m.header, m.payload.len()).unwrap();
        out.extend_from_slice(p.as_bytes());
        out.extend_from_slice(&m.payload);
    }
    if let Some((code, reason)) = &case.close {
        out.extend_from_slice(CloseFrame::new(CloseCode::from_u16(*code), reason).as_bytes());
    }
    out
}

/// Decodes `stream` in the case's chunking; returns the handshake, the
/// messages and the close frame seen.
type Decoded = (Option<Handshake>, Vec<Vec<u8>>, Option<(u16, Vec<u8>)>);

fn decode(case: &Case, stream: &[u8]) -> Decoded {
    let mut dec = FrameDecoder::new(case.buffer_size, Some(u32::MAX));
    let mut handshake = None;
    let mut messages = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    let mut close = None;
    let mut rest = stream;
    let mut i = 0;
    // Every round takes at least one byte: bounded by the stream length.
    while !rest.is_empty() {
        let want = case.chunks[i % case.chunks.len()].min(rest.len());
        i += 1;
        let mut chunk = &rest[..want];
        rest = &rest[want..];
        while !chunk.is_empty() {
            let n = dec.feed(chunk);
            assert!(n > 0, "decoder took no byte while frames were drained");
            chunk = &chunk[n..];
            if handshake.is_none() {
                handshake = dec.decode_handshake().unwrap();
                if handshake.is_none() {
                    continue;
                }
            }
            while let Some(f) = dec.next_frame().unwrap() {
                match f {
                    Frame::Data(m) => {
                        assert!(partial.is_empty());
                        messages.push(m.to_vec());
                    }
                    Frame::DataPart { offset, bytes, .. } => {
                        assert_eq!(offset as usize, partial.len());
                        partial.extend_from_slice(bytes);
                        if f.completes_message() {
                            messages.push(std::mem::take(&mut partial));
                        }
                    }
                    Frame::Close { code, reason } => {
                        close = Some((code.to_u16(), reason.to_vec()));
                    }
                }
            }
        }
    }
    assert!(partial.is_empty());
    assert_eq!(dec.buffered(), 0);
    (handshake, messages, close)
}

fn round_trips(case: Case) -> bool {
    let stream = encode(&case);
    let (handshake, messages, close) = decode(&case, &stream);
    let expected: Vec<Vec<u8>> = case
        .messages
        .iter()
        .map(|m| [m.header.as_slice(), m.payload.as_slice()].concat())
        .collect();
    let expected_close = case.close.as_ref().map(|(c, r)| {
        let mut cut = r.len().min(254);
        while !r.is_char_boundary(cut) {
            cut -= 1;
        }
        (*c, r.as_bytes()[..cut].to_vec())
    });
    handshake == Some(Handshake::new(case.max_message))
        && messages == expected
        && close == expected_close
}

#[test]
fn messages_survive_any_chunking() {
    QuickCheck::new()
        .tests(15000)
        .max_tests(15000)
        .quickcheck(round_trips as fn(Case) -> bool);
}

#[test]
fn one_byte_chunks_of_a_large_message() {
    let case = Case {
        max_message: 7,
        messages: vec![
            Message {
                header: vec![1; 16],
                payload: (0..5000u32).map(|i| (i % 251) as u8).collect(),
            },
            Message {
                header: vec![],
                payload: vec![],
            },
        ],
        close: Some((3, "going".into())),
        chunks: vec![1],
        buffer_size: 0,
    };
    assert!(round_trips(case));
}
