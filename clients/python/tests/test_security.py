"""API keys and TLS: a server started with a keys file, and one with mutual TLS as well."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from conftest import Server

from ctxd_client import Client, Unauthenticated, Unavailable, pb

KEY = "acme-1b6f0c9e4d2a7f35"
OTHER_KEY = "globex-8e2d5a1c7b3f9046"


def write_keys(directory: Path) -> Path:
    path = directory / "keys.txt"
    path.write_text(f"# tenants\nacme {KEY}\nglobex {OTHER_KEY}\n")
    return path


@pytest.fixture(scope="module")
def keyed_server(ctxd_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("ctxd-keys")
    s = Server(ctxd_bin, directory, "--api-keys-file", str(write_keys(directory)))
    yield s.address
    s.stop()


def test_calls_need_the_key(keyed_server: str) -> None:
    with Client(keyed_server, timeout=30, api_key=KEY) as ctxd:
        session = ctxd.create_session({"who": "acme"})
        ctxd.append_user(session, "hello")
        assert [m["content"] for m in ctxd.render(session).messages] == ["hello"]
        # The generated stub goes through the same channel, key included.
        assert ctxd.stub.ListSessions(pb.ListSessionsRequest(page_size=10)).sessions

    with Client(keyed_server, timeout=30) as anonymous:
        with pytest.raises(Unauthenticated, match="missing API key"):
            anonymous.create_session()
    with Client(keyed_server, timeout=30, api_key="not-" + KEY) as wrong:
        with pytest.raises(Unauthenticated, match="invalid API key") as refused:
            wrong.create_session()
        assert KEY not in str(refused.value)


def test_a_key_must_fit_in_a_header() -> None:
    with pytest.raises(ValueError, match="visible ASCII"):
        Client("127.0.0.1:1", api_key="two words")


@pytest.fixture(scope="module")
def tls_server(
    ctxd_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, trustme.CA]]:
    directory = tmp_path_factory.mktemp("ctxd-tls")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    server_cert.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    server_cert.private_key_pem.write_to_path(str(directory / "server.key"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    s = Server(
        ctxd_bin,
        directory,
        "--api-keys-file",
        str(write_keys(directory)),
        "--tls-cert",
        str(directory / "server.pem"),
        "--tls-key",
        str(directory / "server.key"),
        "--tls-client-ca",
        str(directory / "ca.pem"),
    )
    yield s.address, ca
    s.stop()


def test_mutual_tls_with_a_key(tls_server: tuple[str, trustme.CA]) -> None:
    address, ca = tls_server
    client_cert = ca.issue_cert("agent.example")
    with Client(
        address,
        timeout=30,
        api_key=OTHER_KEY,
        root_certificates=ca.cert_pem.bytes(),
        private_key=client_cert.private_key_pem.bytes(),
        certificate_chain=client_cert.cert_chain_pems[0].bytes(),
    ) as ctxd:
        session = ctxd.create_session()
        assert ctxd.get_session(session).id == session.id

    # Without a client certificate the handshake fails: the server is unreachable.
    with Client(
        address, timeout=30, api_key=OTHER_KEY, root_certificates=ca.cert_pem.bytes()
    ) as no_cert:
        with pytest.raises(Unavailable):
            no_cert.create_session()
    # Plaintext to a TLS port gets no answer either.
    with Client(address, timeout=30, api_key=OTHER_KEY) as plaintext:
        with pytest.raises(Unavailable):
            plaintext.create_session()


def test_tls_options_and_a_channel_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="not both"):
        Client(channel=object(), tls=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="go together"):
        Client("127.0.0.1:1", private_key=b"key")
