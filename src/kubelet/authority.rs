//! HTTP/2 `:authority` on Unix sockets.
//!
//! A gRPC client that dials a socket by its path puts that path in `:authority`: grpc-go (the
//! kubelet's plugin manager) percent-encodes it, gRPC C-core sends it raw. h2, under tonic, holds
//! both to be malformed and resets the stream with PROTOCOL_ERROR before any service sees the
//! call, so the real kubelet could never register migdra. On a Unix socket the authority names
//! nothing, so the client-to-server half of every connection is re-framed here before h2 reads it:
//! each request header block is decoded, an authority h2 would refuse becomes `localhost`, and the
//! block is encoded again. Every other frame passes through byte for byte.
//!
//! The same re-framing, on the write half, lets the test kubelet send exactly what the kubelet
//! sends ([`Reframed::sending_authority`]).
//!
//! This module goes when h2 accepts an authority on Unix sockets: hyperium/h2#487 ("Do not
//! require authority for UNIX domain sockets", still open) is the upstream thread to watch.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The bytes every HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may have; frames we write never exceed it.
const MAX_FRAME: usize = 16_384;
/// A request header block larger than this is refused (h2's own header list limit is 16 KiB).
const MAX_BLOCK: usize = 64 * 1024;
/// The HPACK table size HTTP/2 starts with; the server advertises no other.
const HPACK_TABLE: usize = 4096;
/// What an authority h2 would refuse becomes.
pub const LOCALHOST: &[u8] = b"localhost";

/// Why a client's byte stream could not be re-framed; the connection is closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReframeError {
    #[error("header block of stream {stream} cannot be decoded: {reason}")]
    Hpack { stream: u32, reason: String },
    #[error("header block of stream {stream} is over {MAX_BLOCK} bytes")]
    TooLarge { stream: u32 },
    #[error("HEADERS frame of stream {stream} has padding longer than its payload")]
    Padding { stream: u32 },
    #[error("expected CONTINUATION of stream {expected}, got frame type {kind} on stream {stream}")]
    Continuation { expected: u32, kind: u8, stream: u32 },
    #[error("CONTINUATION on stream {stream} follows no HEADERS")]
    Orphan { stream: u32 },
}

/// What to do with a request's `:authority` value: `Some(new)` replaces it.
type Policy = Box<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// A header block being collected across HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Phase {
    Preface,
    /// Not HTTP/2 with prior knowledge: bytes pass untouched, so h2 gives its own error.
    Passthrough,
    FrameHeader,
    /// Copy this many more bytes of a frame we do not touch.
    Copy(usize),
    /// Collect a HEADERS or CONTINUATION payload of this length.
    Collect {
        flags: u8,
        stream: u32,
        len: usize,
    },
}

/// The client-to-server byte stream of one connection, with `:authority` rewritten by a policy.
/// Pure: bytes in, bytes out.
pub struct Rewriter {
    policy: Policy,
    phase: Phase,
    pending: Vec<u8>,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    /// The first authority replaced, for one log line per connection.
    pub replaced: Option<Vec<u8>>,
}

impl Rewriter {
    /// Replace an authority only where h2 would refuse it (the server side).
    pub fn server() -> Self {
        Self::with_policy(Box::new(|value| http::uri::Authority::try_from(value).is_err().then(|| LOCALHOST.to_vec())))
    }

    /// Send `authority` on every request, whatever the client library set (the test kubelet).
    pub fn always(authority: Vec<u8>) -> Self {
        Self::with_policy(Box::new(move |_| Some(authority.clone())))
    }

    fn with_policy(policy: Policy) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE);
        Self { policy, phase: Phase::Preface, pending: Vec::new(), block: None, decoder, replaced: None }
    }

    /// Feed the next bytes the client sent; append what the server should read to `out`.
    ///
    /// # Errors
    /// A header block cannot be decoded or is malformed; the connection cannot go on.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), ReframeError> {
        loop {
            match self.phase {
                Phase::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                Phase::Copy(left) => {
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.phase = if n == left { Phase::FrameHeader } else { Phase::Copy(left - n) };
                    if input.is_empty() {
                        return Ok(());
                    }
                }
                Phase::Preface => {
                    if !self.take(&mut input, PREFACE.len()) {
                        if !PREFACE.starts_with(&self.pending) {
                            out.append(&mut self.pending);
                            self.phase = Phase::Passthrough;
                            continue;
                        }
                        return Ok(());
                    }
                    let got = std::mem::take(&mut self.pending);
                    self.phase = if got == PREFACE { Phase::FrameHeader } else { Phase::Passthrough };
                    out.extend_from_slice(&got);
                }
                Phase::FrameHeader => {
                    if !self.take(&mut input, FRAME_HEADER) {
                        return Ok(());
                    }
                    let h = std::mem::take(&mut self.pending);
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let (kind, flags) = (h[3], h[4]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    if let Some(b) = &self.block
                        && (kind != CONTINUATION || stream != b.stream)
                    {
                        return Err(ReframeError::Continuation { expected: b.stream, kind, stream });
                    }
                    if kind == CONTINUATION && self.block.is_none() {
                        return Err(ReframeError::Orphan { stream });
                    }
                    if kind == HEADERS || kind == CONTINUATION {
                        let so_far = self.block.as_ref().map_or(0, |b| b.fragment.len());
                        if so_far + len > MAX_BLOCK {
                            return Err(ReframeError::TooLarge { stream });
                        }
                        self.phase = Phase::Collect { flags, stream, len };
                    } else {
                        out.extend_from_slice(&h);
                        self.phase = if len == 0 { Phase::FrameHeader } else { Phase::Copy(len) };
                    }
                }
                Phase::Collect { flags, stream, len } => {
                    if !self.take(&mut input, len) {
                        return Ok(());
                    }
                    let payload = std::mem::take(&mut self.pending);
                    self.phase = Phase::FrameHeader;
                    self.collect(flags, stream, &payload, out)?;
                }
            }
        }
    }

    /// Move bytes from `input` into `pending` until it holds `want`; true when it does.
    fn take(&mut self, input: &mut &[u8], want: usize) -> bool {
        let n = want.saturating_sub(self.pending.len()).min(input.len());
        self.pending.extend_from_slice(&input[..n]);
        *input = &input[n..];
        self.pending.len() == want
    }

    fn collect(&mut self, flags: u8, stream: u32, payload: &[u8], out: &mut Vec<u8>) -> Result<(), ReframeError> {
        let mut block = match self.block.take() {
            Some(mut b) => {
                b.fragment.extend_from_slice(payload);
                b.flags |= flags & END_HEADERS;
                b
            }
            None => {
                let mut rest = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let Some((&p, r)) = rest.split_first() else { return Err(ReframeError::Padding { stream }) };
                    pad = usize::from(p);
                    rest = r;
                }
                let priority = if flags & PRIORITY != 0 {
                    let Some((p, r)) = rest.split_first_chunk::<5>() else {
                        return Err(ReframeError::Padding { stream });
                    };
                    rest = r;
                    Some(*p)
                } else {
                    None
                };
                let Some(fragment) = rest.len().checked_sub(pad).map(|n| &rest[..n]) else {
                    return Err(ReframeError::Padding { stream });
                };
                Block { stream, flags: flags & (END_STREAM | END_HEADERS), priority, fragment: fragment.to_vec() }
            }
        };
        if block.flags & END_HEADERS == 0 {
            self.block = Some(block);
            return Ok(());
        }
        let fields = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| ReframeError::Hpack { stream, reason: format!("{e:?}") })?;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 32);
        for (name, mut value) in fields {
            if name == b":authority"
                && let Some(new) = (self.policy)(&value)
            {
                if self.replaced.is_none() && new != value {
                    self.replaced = Some(value.clone());
                }
                value = new;
            }
            encode_literal(&name, &value, &mut encoded);
        }
        block.fragment = encoded;
        write_block(&block, out);
        Ok(())
    }
}

/// An HPACK literal field without indexing and without Huffman coding: the server's table is
/// never touched, so nothing we write depends on what the client's encoder did.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    for s in [name, value] {
        encode_int(s.len(), 7, out);
        out.extend_from_slice(s);
    }
}

/// An HPACK integer with an N-bit prefix (RFC 7541 §5.1).
fn encode_int(mut n: usize, prefix: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if n < max {
        out.push(n as u8);
        return;
    }
    out.push(max as u8);
    n -= max;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// HEADERS (with the original END_STREAM and priority), then CONTINUATION frames as needed.
fn write_block(block: &Block, out: &mut Vec<u8>) {
    let mut first = Vec::new();
    if let Some(p) = block.priority {
        first.extend_from_slice(&p);
    }
    let room = MAX_FRAME - first.len();
    let (head, mut rest) = block.fragment.split_at(room.min(block.fragment.len()));
    first.extend_from_slice(head);
    let mut flags = block.flags & END_STREAM;
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    write_frame(HEADERS, flags, block.stream, &first, out);
    while !rest.is_empty() {
        let (chunk, r) = rest.split_at(MAX_FRAME.min(rest.len()));
        rest = r;
        write_frame(CONTINUATION, if rest.is_empty() { END_HEADERS } else { 0 }, block.stream, chunk, out);
    }
}

fn write_frame(kind: u8, flags: u8, stream: u32, payload: &[u8], out: &mut Vec<u8>) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The authority grpc-go sends for a target it cannot parse as host:port, such as a socket path:
/// every byte outside RFC 3986's unreserved, sub-delims and `:[]@` percent-encoded.
pub fn grpc_go_authority(target: &str) -> String {
    let mut out = String::with_capacity(target.len() * 2);
    for b in target.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Which half of the stream is re-framed.
enum Half {
    /// The server reads re-framed requests.
    Read { out: Vec<u8>, at: usize, eof: bool },
    /// The client's requests are re-framed on the way out.
    Write { out: Vec<u8> },
}

/// A stream whose client-to-server half goes through a [`Rewriter`].
pub struct Reframed<S> {
    inner: S,
    rewriter: Rewriter,
    half: Half,
    logged: bool,
}

impl<S> Reframed<S> {
    /// A server's connection: requests arrive with an authority h2 accepts.
    pub fn serving(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::server(),
            half: Half::Read { out: Vec::new(), at: 0, eof: false },
            logged: false,
        }
    }

    /// A client's connection that sends `authority` on every request.
    pub fn sending_authority(inner: S, authority: &str) -> Self {
        Self {
            inner,
            rewriter: Rewriter::always(authority.as_bytes().to_vec()),
            half: Half::Write { out: Vec::new() },
            logged: true,
        }
    }

    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        self.rewriter.feed(input, out).map_err(|e| {
            tracing::debug!(error = %e, "refusing an HTTP/2 connection");
            io::Error::new(io::ErrorKind::InvalidData, e)
        })?;
        if !self.logged
            && let Some(old) = &self.rewriter.replaced
        {
            self.logged = true;
            tracing::debug!(
                authority = %String::from_utf8_lossy(old),
                "a client sent an :authority HTTP/2 forbids (a socket path); serving it as localhost"
            );
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Reframed<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let Half::Read { out, at, eof } = &mut this.half else {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            };
            if *at < out.len() {
                let n = buf.remaining().min(out.len() - *at);
                buf.put_slice(&out[*at..*at + n]);
                *at += n;
                return Poll::Ready(Ok(()));
            }
            if *eof {
                return Poll::Ready(Ok(()));
            }
            let mut raw = [0u8; 8192];
            let mut raw_buf = ReadBuf::new(&mut raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw_buf))?;
            let filled = raw_buf.filled();
            if filled.is_empty() {
                *eof = true;
                continue;
            }
            let mut next = std::mem::take(out);
            next.clear();
            *at = 0;
            this.feed(filled, &mut next)?;
            if let Half::Read { out, .. } = &mut this.half {
                *out = next;
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> Reframed<S> {
    /// Write out what the rewriter has produced.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Half::Write { out } = &mut self.half else { return Poll::Ready(Ok(())) };
        while !out.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            out.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Reframed<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if matches!(this.half, Half::Read { .. }) {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        // Bounded: accept more only once most of what is waiting has gone out.
        if matches!(&this.half, Half::Write { out } if out.len() > 4 * MAX_FRAME) {
            ready!(this.poll_drain(cx))?;
        }
        let mut next = Vec::new();
        this.feed(buf, &mut next)?;
        if let Half::Write { out } = &mut this.half {
            out.append(&mut next);
        }
        // What cannot go out now goes out on the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Reframed<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(kind, flags, stream, payload, &mut out);
        out
    }

    fn request_block(encoder: &mut loona_hpack::Encoder<'_>, authority: &[u8]) -> Vec<u8> {
        encoder.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ])
    }

    /// Split `out` into frames: (kind, flags, stream, payload).
    fn frames(mut out: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            let len = usize::from(out[0]) << 16 | usize::from(out[1]) << 8 | usize::from(out[2]);
            let stream = u32::from_be_bytes([out[5], out[6], out[7], out[8]]);
            v.push((out[3], out[4], stream, out[9..9 + len].to_vec()));
            out = &out[9 + len..];
        }
        v
    }

    fn headers_of(
        frames: &[(u8, u8, u32, Vec<u8>)],
        decoder: &mut loona_hpack::Decoder<'_>,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let block: Vec<u8> =
            frames.iter().filter(|f| f.0 == HEADERS || f.0 == CONTINUATION).flat_map(|f| f.3.clone()).collect();
        decoder.decode(&block).expect("re-encoded block decodes")
    }

    #[test]
    fn grpc_go_encodes_a_socket_path_as_the_kubelet_sends_it() {
        assert_eq!(
            grpc_go_authority("/var/lib/kubelet/plugins_registry/mig.slinky.slurm.net-reg.sock"),
            "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fmig.slinky.slurm.net-reg.sock"
        );
        assert_eq!(grpc_go_authority("localhost:50051"), "localhost:50051");
    }

    #[test]
    fn the_server_policy_replaces_exactly_what_h2_refuses() {
        let r = Rewriter::server();
        for bad in [&b"%2Fvar%2Flib%2Fx.sock"[..], b"/var/lib/x.sock", b"unix:/tmp/a.sock", b"a b"] {
            assert_eq!((r.policy)(bad), Some(LOCALHOST.to_vec()), "{}", String::from_utf8_lossy(bad));
        }
        for good in [&b"localhost"[..], b"kubelet.invalid", b"127.0.0.1:80", b"[::1]:8080"] {
            assert_eq!((r.policy)(good), None, "{}", String::from_utf8_lossy(good));
        }
    }

    #[test]
    fn every_authority_form_comes_out_as_one_h2_accepts_and_other_frames_are_untouched() {
        let settings = frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
        for authority in [&b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock"[..], b"/run/x.sock", b"localhost"]
        {
            let mut encoder = loona_hpack::Encoder::new();
            let mut input = PREFACE.to_vec();
            input.extend(&settings);
            input.extend(frame(HEADERS, END_HEADERS, 1, &request_block(&mut encoder, authority)));
            input.extend(&data);
            // The same fields again: the client's encoder now refers to its dynamic table.
            input.extend(frame(HEADERS, END_HEADERS, 3, &request_block(&mut encoder, authority)));
            // Byte by byte, as a socket may deliver it.
            let mut rewriter = Rewriter::server();
            let mut out = Vec::new();
            for b in &input {
                rewriter.feed(std::slice::from_ref(b), &mut out).unwrap();
            }
            assert!(out.starts_with(PREFACE));
            let fs = frames(&out[PREFACE.len()..]);
            assert_eq!(frame(fs[0].0, fs[0].1, fs[0].2, &fs[0].3), settings);
            assert_eq!(frame(fs[2].0, fs[2].1, fs[2].2, &fs[2].3), data);
            let mut decoder = loona_hpack::Decoder::new();
            for one in [&fs[1..2], &fs[3..4]] {
                let fields = headers_of(one, &mut decoder);
                let got = fields.iter().find(|(n, _)| n == b":authority").map(|(_, v)| v.clone());
                let want = if authority == b"localhost" { authority.to_vec() } else { LOCALHOST.to_vec() };
                assert_eq!(got, Some(want));
                assert!(http::uri::Authority::try_from(got.unwrap().as_slice()).is_ok());
                assert_eq!(fields.len(), 6, "no field lost");
                assert_eq!(fields[2].1, b"/pluginregistration.Registration/GetInfo");
            }
            assert_eq!(rewriter.replaced.is_some(), authority != b"localhost");
        }
    }

    #[test]
    fn padding_priority_and_continuation_are_reassembled() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = request_block(&mut encoder, b"/a/b.sock");
        let (a, b) = block.split_at(block.len() / 2);
        let mut payload = vec![3]; // pad length
        payload.extend([0x80, 0, 0, 7, 42]); // exclusive dependency on 7, weight 42
        payload.extend(a);
        payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 5, b));
        let mut out = Vec::new();
        Rewriter::server().feed(&input, &mut out).unwrap();
        let fs = frames(&out[PREFACE.len()..]);
        assert_eq!(fs.len(), 1);
        let (kind, flags, stream, p) = &fs[0];
        assert_eq!((*kind, *flags, *stream), (HEADERS, END_STREAM | PRIORITY | END_HEADERS, 5));
        assert_eq!(&p[..5], &[0x80, 0, 0, 7, 42]);
        let fields = loona_hpack::Decoder::new().decode(&p[5..]).unwrap();
        assert!(fields.contains(&(b":authority".to_vec(), LOCALHOST.to_vec())));
    }

    #[test]
    fn a_large_block_is_split_into_frames_the_server_accepts() {
        let value = vec![b'x'; 3 * MAX_FRAME];
        let mut encoder = loona_hpack::Encoder::new();
        let block = encoder.encode([(&b":authority"[..], &b"/s.sock"[..]), (b"x-big", &value)]);
        let mut input = PREFACE.to_vec();
        for (i, chunk) in block.chunks(MAX_FRAME).enumerate() {
            let last = (i + 1) * MAX_FRAME >= block.len();
            input.extend(frame(
                if i == 0 { HEADERS } else { CONTINUATION },
                if last { END_HEADERS } else { 0 },
                1,
                chunk,
            ));
        }
        let mut out = Vec::new();
        Rewriter::server().feed(&input, &mut out).unwrap();
        let fs = frames(&out[PREFACE.len()..]);
        assert!(fs.len() >= 4 && fs.iter().all(|f| f.3.len() <= MAX_FRAME));
        assert_eq!(fs.iter().filter(|f| f.1 & END_HEADERS != 0).count(), 1);
        let fields = headers_of(&fs, &mut loona_hpack::Decoder::new());
        assert_eq!(fields[1].1, value);
    }

    #[test]
    fn malformed_input_is_refused_with_the_reason() {
        let mut out = Vec::new();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
        let e = Rewriter::server().feed(&input, &mut out).unwrap_err();
        assert!(matches!(e, ReframeError::Hpack { stream: 1, .. }), "{e}");

        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 1, 2]));
        assert_eq!(Rewriter::server().feed(&input, &mut out), Err(ReframeError::Padding { stream: 1 }));

        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, &[]));
        assert_eq!(
            Rewriter::server().feed(&input, &mut out),
            Err(ReframeError::Continuation { expected: 1, kind: 0, stream: 1 })
        );

        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &vec![0; MAX_BLOCK]));
        input.extend(frame(CONTINUATION, 0, 1, &[0]));
        assert_eq!(Rewriter::server().feed(&input, &mut out), Err(ReframeError::TooLarge { stream: 1 }));

        let mut input = PREFACE.to_vec();
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x82]));
        assert_eq!(Rewriter::server().feed(&input, &mut out), Err(ReframeError::Orphan { stream: 1 }));
    }

    #[test]
    fn bytes_that_are_not_http2_pass_untouched() {
        let mut out = Vec::new();
        let mut r = Rewriter::server();
        r.feed(b"GET / HTTP/1.1\r\n", &mut out).unwrap();
        r.feed(b"Host: x\r\n\r\n", &mut out).unwrap();
        assert_eq!(out, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    #[test]
    fn integers_take_more_bytes_past_the_prefix() {
        let mut out = Vec::new();
        encode_int(1337, 5, &mut out);
        assert_eq!(out, [31, 154, 10]); // RFC 7541 C.1.2
        out.clear();
        encode_int(10, 5, &mut out);
        assert_eq!(out, [10]);
    }
}
