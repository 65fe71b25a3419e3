"""An HTTP answer on the AMQP port, for clients of the management REST API.

`ServiceBusAdministrationClient` (every SDK's; create, get, list or delete
queues, topics, subscriptions and rules; runtime properties) speaks ATOM over
HTTPS to the namespace's host and port, the emulator's AMQP port. The emulator
does not serve that API (entities come from Config.json), so a connection
whose first bytes are a TLS ClientHello or an HTTP request line gets, instead
of AMQP, an HTTP 501 whose body names what is not supported; over TLS with a
certificate made for the occasion (self-signed: an SDK that verifies
certificates, the default, fails the handshake instead, and the emulator's log
names the feature). Nothing else is served here.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import ssl
import tempfile
import threading
from pathlib import Path

_LOG = logging.getLogger("devstack.servicebus")

_HTTP_METHODS = (b"GET ", b"PUT ", b"POST", b"DELE", b"HEAD", b"OPTI", b"PATC")
_TLS_HANDSHAKE = 0x16
_MAX_REQUEST = 1 << 20

FEATURE = (
    "ServiceBusAdministrationClient (the ATOM management API: create, get, list or delete "
    "queues, topics, subscriptions and rules; runtime properties)"
)
MESSAGE = (
    f"{FEATURE} is not supported by the local Service Bus emulator (devstack.servicebus): "
    "its entities come from its Config.json. See docs/servicebus-emulator.md."
)


def is_http(first: bytes) -> bool:
    """Whether the first bytes of a connection are TLS or HTTP rather than AMQP."""
    return bool(first) and (first[0] == _TLS_HANDSHAKE or first[:4] in _HTTP_METHODS)


def _response() -> bytes:
    body = (
        '<?xml version="1.0" encoding="utf-8"?>'
        f"<Error><Code>501</Code><Detail>{MESSAGE}</Detail></Error>"
    ).encode()
    head = (
        "HTTP/1.1 501 Not Implemented\r\n"
        "Content-Type: application/xml; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


_context: ssl.SSLContext | None = None
_context_lock = threading.Lock()


def _tls_context() -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate for 127.0.0.1 and localhost."""
    global _context
    with _context_lock:
        if _context is None:
            _context = _new_tls_context()
        return _context


def _new_tls_context() -> ssl.SSLContext:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "devstack.servicebus")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="devstack-servicebus-tls-"))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


class _Plain:
    """The connection as it is: HTTP without TLS (`first`: the bytes already read)."""

    def __init__(
        self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.reader, self.writer = reader, writer
        self._first = first

    async def read(self) -> bytes:
        if self._first:
            first, self._first = self._first, b""
            return first
        return await self.reader.read(65536)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()


class _Tls(_Plain):
    """TLS over the connection through memory BIOs (the first bytes are already read)."""

    def __init__(
        self,
        context: ssl.SSLContext,
        first: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(b"", reader, writer)
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.incoming.write(first)

    async def _exchange(self) -> None:
        pending = self.outgoing.read()
        if pending:
            await super().write(pending)
        data = await super().read()
        if not data:
            raise ConnectionError("the client closed the connection")
        self.incoming.write(data)

    async def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._exchange()
        pending = self.outgoing.read()
        if pending:
            await super().write(pending)

    async def read(self) -> bytes:
        while True:
            try:
                return self.tls.read(65536)
            except ssl.SSLWantReadError:
                await self._exchange()

    async def write(self, data: bytes) -> None:
        self.tls.write(data)
        await super().write(self.outgoing.read())


async def _request_line(channel: _Plain) -> str:
    request = b""
    while b"\r\n\r\n" not in request and len(request) < _MAX_REQUEST:
        chunk = await channel.read()
        if not chunk:
            break
        request += chunk
    return request.split(b"\r\n", 1)[0].decode("latin-1")[:200]


async def answer(first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer one HTTP(S) request with the 501 naming the feature, then close."""
    channel: _Plain
    try:
        if first[0] == _TLS_HANDSHAKE:
            # Key generation and file writes, once: off the event loop.
            context = await asyncio.to_thread(_tls_context)
            tls = _Tls(context, first, reader, writer)
            await tls.handshake()
            channel = tls
        else:
            channel = _Plain(first, reader, writer)
        line = await _request_line(channel)
        await channel.write(_response())
        _LOG.warning("refused HTTP request %r: %s", line, MESSAGE)
    except (ssl.SSLError, ConnectionError, OSError) as exc:
        _LOG.warning(
            "an HTTPS client left during the TLS handshake (%s); if it was %s: it is not "
            "supported by this emulator, whose entities come from its Config.json",
            exc,
            FEATURE,
        )
    finally:
        writer.close()
