//! Arbitrary bytes, in arbitrary chunks and through a decoder of arbitrary
//! buffer size and limit, into the streaming frame decoder. It must never
//! panic, never hand out a message above the limit, hand out large messages
//! in consistent parts, and decode exactly what a decoder given the whole
//! input at once decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netio_tcp::wire::{CloseCode, Frame, FrameDecoder, WireError, MIN_DECODER_BUFFER};

#[derive(Debug, PartialEq)]
enum Event {
    Handshake(u32),
    Message(Vec<u8>),
    Close(CloseCode, Vec<u8>),
    Error(WireError),
    /// A wrong magic value; the bytes it reports depend on how many had
    /// arrived, so only the kind is compared.
    BadMagic,
}

fn error_event(e: WireError) -> Event {
    match e {
        WireError::BadMagic(_) => Event::BadMagic,
        e => Event::Error(e),
    }
}

fn run(input: &[u8], chunks: &[usize], buffer: usize, limit: Option<u32>, hs: bool) -> Vec<Event> {
    let mut dec = FrameDecoder::new(buffer, limit);
    let mut events = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    let mut handshake_done = !hs;
    let mut armed = false;
    let mut rest = input;
    let mut i = 0;
    'outer: while !rest.is_empty() {
        let want = chunks[i % chunks.len()].min(rest.len());
        i += 1;
        let mut chunk = &rest[..want];
        rest = &rest[want..];
        while !chunk.is_empty() {
            let n = dec.feed(chunk);
            assert!(n > 0, "no room although every frame was taken");
            chunk = &chunk[n..];
            if !handshake_done {
                match dec.decode_handshake() {
                    Ok(None) => continue,
                    Ok(Some(h)) => {
                        handshake_done = true;
                        events.push(Event::Handshake(h.max_message));
                    }
                    Err(e) => {
                        events.push(error_event(e));
                        break 'outer;
                    }
                }
            }
            loop {
                // The prediction the backend relies on to get its assembly
                // buffer before the first part comes out.
                // Once predicted, the first part may come out in a later
                // call (when no body byte is buffered yet).
                let starts = dec.starts_large_message();
                armed |= starts;
                let result = dec.next_frame();
                match &result {
                    Ok(Some(Frame::DataPart { offset: 0, .. })) => {
                        assert!(armed);
                        armed = false;
                    }
                    Ok(Some(Frame::Data(_) | Frame::Close { .. })) => assert!(!starts),
                    Err(_) => assert!(!starts),
                    Ok(_) => {}
                }
                match result {
                    Ok(None) => break,
                    Ok(Some(f)) => {
                        let completes = f.completes_message();
                        match f {
                            Frame::Data(m) => {
                                assert!(partial.is_empty());
                                assert!(limit.is_some_and(|l| m.len() as u64 <= u64::from(l)));
                                events.push(Event::Message(m.to_vec()));
                            }
                            Frame::DataPart {
                                total_len,
                                offset,
                                bytes,
                            } => {
                                assert!(limit.is_some_and(|l| total_len <= l));
                                assert!(!bytes.is_empty());
                                assert_eq!(offset as usize, partial.len());
                                assert!(
                                    u64::from(offset) + bytes.len() as u64 <= u64::from(total_len)
                                );
                                partial.extend_from_slice(bytes);
                                if completes {
                                    events.push(Event::Message(std::mem::take(&mut partial)));
                                }
                            }
                            Frame::Close { code, reason } => {
                                assert!(reason.len() <= 254);
                                events.push(Event::Close(code, reason.to_vec()));
                            }
                        }
                    }
                    Err(e) => {
                        // Sticky.
                        assert_eq!(dec.next_frame().unwrap_err(), e);
                        assert!(!e.to_string().is_empty());
                        events.push(error_event(e));
                        break 'outer;
                    }
                }
            }
        }
    }
    events
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (cfg, input) = data.split_at(4);
    let buffer = MIN_DECODER_BUFFER + usize::from(cfg[0]) * 8;
    let limit = match cfg[1] % 5 {
        0 => None,
        1 => Some(0),
        2 => Some(u32::from(cfg[2]) * 16),
        3 => Some(u32::from(cfg[2]) * 1024),
        _ => Some(u32::MAX),
    };
    let hs = cfg[1] & 0x80 != 0;
    let chunk = usize::from(cfg[3] % 64) + 1;
    let chunks = [chunk, 1, chunk * 7 + 3];

    let streamed = run(input, &chunks, buffer, limit, hs);
    // Reference: one decoder large enough for the whole input, fed at once.
    let whole = run(
        input,
        &[input.len().max(1)],
        input.len() + MIN_DECODER_BUFFER,
        limit,
        hs,
    );
    assert_eq!(streamed, whole);
});
