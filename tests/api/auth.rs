//! API keys, the loopback default and TLS: in-process through `serve_with`, and through the real
//! `ctxd serve` binary (its flags and refusals) and the `ctxd` client commands. Certificates are
//! generated here, for each test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::server::Options;
use pb::context_store_client::ContextStoreClient;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tonic::Code;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1;

use crate::daemon::{Daemon, Serve, ctxd, run_to_exit};
use crate::helpers::*;

const ACME_KEY: &str = "acme-7f3a9c1e5b2d4f60";
const GLOBEX_KEY: &str = "globex-0d8e6b4a2c9f1e37";
const WRONG_KEY: &str = "wrong-5e1c7a3f9b0d2e48";
const KEYS_FILE: &str = "# tenants of this server\n\
    acme    acme-7f3a9c1e5b2d4f60\n\n\
    globex  globex-0d8e6b4a2c9f1e37\n";

// ---------------------------------------------------------------- certificates and files

/// A temp dir holding a keys file and a small PKI: a CA, a server certificate for 127.0.0.1
/// and `localhost`, a client certificate from the CA, and a stranger's certificate from another
/// CA.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let files = Self {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        files.write("keys.txt", KEYS_FILE);
        let ca = new_ca("ctxd test CA");
        files.write("ca.pem", &ca.pem());
        files.leaf(
            "server",
            &ca,
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        files.leaf("client", &ca, &[], ExtendedKeyUsagePurpose::ClientAuth);
        let other = new_ca("another CA");
        files.write("other-ca.pem", &other.pem());
        files.leaf("stranger", &other, &[], ExtendedKeyUsagePurpose::ClientAuth);
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, contents).expect("write a test file");
        path
    }

    /// `NAME.pem` and `NAME.key`, signed by `issuer`.
    fn leaf(
        &self,
        name: &str,
        issuer: &CertifiedIssuer<'static, KeyPair>,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("valid names");
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages.push(KeyUsagePurpose::DigitalSignature);
        params.extended_key_usages.push(usage);
        let key = KeyPair::generate().expect("key pair");
        let cert = params.signed_by(&key, issuer).expect("sign");
        self.write(&format!("{name}.pem"), &cert.pem());
        self.write(&format!("{name}.key"), &key.serialize_pem());
    }

    fn keys(&self) -> ApiKeys {
        ApiKeys::load(&self.path("keys.txt")).expect("the keys file")
    }

    fn server_tls(&self, mutual: bool) -> tonic::transport::ServerTlsConfig {
        let ca = self.path("ca.pem");
        ctxd::tls::server(
            &self.path("server.pem"),
            &self.path("server.key"),
            mutual.then_some(ca.as_path()),
        )
        .expect("the server's TLS files")
    }

    /// A client's TLS trusting `ca`, presenting `identity` (`NAME.pem` and `NAME.key`).
    fn client_tls(&self, ca: &str, identity: Option<&str>) -> ClientTlsConfig {
        let pair = identity.map(|n| {
            (
                self.path(&format!("{n}.pem")),
                self.path(&format!("{n}.key")),
            )
        });
        ctxd::tls::client(
            Some(&self.path(ca)),
            pair.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
        .expect("the client's TLS files")
    }
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key pair")).expect("CA")
}

// ---------------------------------------------------------------- in-process servers and clients

/// Sends an `authorization` header with every call, if given.
#[derive(Clone)]
struct Header(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Header {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            r.metadata_mut().insert("authorization", value.clone());
        }
        Ok(r)
    }
}

fn header(value: Option<&str>) -> Header {
    Header(value.map(|v| v.parse().expect("an ASCII header value")))
}

fn bearer(key: &str) -> Header {
    header(Some(&format!("Bearer {key}")))
}

type StoreClient = ContextStoreClient<InterceptedService<Channel, Header>>;

fn store_client(channel: Channel, header: Header) -> StoreClient {
    ContextStoreClient::with_interceptor(channel, header)
}

async fn plaintext(addr: SocketAddr) -> Channel {
    channel(addr).await
}

/// A TLS channel to `addr`, or why the connection failed.
async fn tls_channel(addr: SocketAddr, tls: ClientTlsConfig) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("TLS config")
        .connect()
        .await
        .map_err(|e| chain(&e))
}

/// An error and its sources, `a: b: c`: a TLS failure's reason is a few levels down.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    text
}

/// Creates a session, with `key` unless it is empty; a failed handshake may surface at connect
/// or at the first call.
async fn create_session(channel: Result<Channel, String>, key: &str) -> Result<String, String> {
    let credentials = if key.is_empty() {
        header(None)
    } else {
        bearer(key)
    };
    let mut client = store_client(channel?, credentials);
    client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .map(|r| r.into_inner().session_id)
        .map_err(|s| format!("{:?}: {}", s.code(), chain(&s)))
}

/// A TLS connection refused, for `reason` (rustls's name of the alert or the error).
fn assert_refused(result: Result<String, String>, reason: &str) {
    match result {
        Ok(session) => panic!("expected a refusal for {reason}, got session {session}"),
        Err(e) => assert!(e.contains(reason), "expected {reason}, got {e}"),
    }
}

async fn assert_health_serving(channel: Channel) {
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "ctxd.v1.ContextStore".into(),
        })
        .await
        .expect("health needs no key")
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
}

/// Lists services through reflection v1.
async fn reflect(channel: Channel, header: Header) -> Result<Vec<String>, tonic::Status> {
    use v1::server_reflection_request::MessageRequest;
    use v1::server_reflection_response::MessageResponse;
    let mut client =
        v1::server_reflection_client::ServerReflectionClient::with_interceptor(channel, header);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    match answers.message().await?.and_then(|a| a.message_response) {
        Some(MessageResponse::ListServicesResponse(list)) => {
            Ok(list.service.into_iter().map(|s| s.name).collect())
        }
        other => panic!("expected a service list, got {other:?}"),
    }
}

fn assert_unauthenticated<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    says: &str,
) -> tonic::Status {
    let status = match result {
        Ok(value) => panic!("expected UNAUTHENTICATED ({says}), got Ok({value:?})"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains(says), "{says:?} in {status:?}");
    for key in [ACME_KEY, GLOBEX_KEY, WRONG_KEY] {
        assert!(
            !status.message().contains(key),
            "the key echoed: {status:?}"
        );
    }
    status
}

// ---------------------------------------------------------------- API keys in-process

#[tokio::test]
async fn with_keys_every_rpc_but_health_needs_a_valid_bearer_key() {
    let files = Files::new();
    let (_dir, server) = serve_fresh(Options {
        api_keys: Some(files.keys()),
        ..Options::default()
    })
    .await;
    let channel = plaintext(server.addr).await;
    let create = |header: Header| {
        let mut client = store_client(channel.clone(), header);
        async move {
            client
                .create_session(pb::CreateSessionRequest::default())
                .await
        }
    };

    assert_unauthenticated(create(header(None)).await, "missing API key");
    assert_unauthenticated(create(bearer(WRONG_KEY)).await, "invalid API key");
    for malformed in [
        ACME_KEY.to_owned(),
        format!("Basic {ACME_KEY}"),
        "Bearer".to_owned(),
        format!("Bearer {ACME_KEY} {GLOBEX_KEY}"),
    ] {
        assert_unauthenticated(create(header(Some(&malformed))).await, "malformed");
    }
    // A key must match whole: no prefix or extension of a key is one.
    assert_unauthenticated(create(bearer(&ACME_KEY[..10])).await, "invalid");
    assert_unauthenticated(create(bearer(&format!("{ACME_KEY}0"))).await, "invalid");

    // Streaming RPCs too: reflection is not exempt.
    assert_unauthenticated(reflect(channel.clone(), header(None)).await, "missing");
    assert_unauthenticated(reflect(channel.clone(), bearer(WRONG_KEY)).await, "invalid");
    let services = reflect(channel.clone(), bearer(GLOBEX_KEY))
        .await
        .expect("reflection with a key");
    assert!(
        services.iter().any(|s| s == "ctxd.v1.ContextStore"),
        "{services:?}"
    );

    assert_health_serving(channel.clone()).await;

    // Each tenant's key works, for writes and reads of its own session.
    for key in [ACME_KEY, GLOBEX_KEY] {
        let mut client = store_client(channel.clone(), bearer(key));
        let session = client
            .create_session(pb::CreateSessionRequest::default())
            .await
            .expect("CreateSession with a key")
            .into_inner()
            .session_id;
        client
            .append(append_req(&session, vec![user("hi"), assistant("hello")]))
            .await
            .expect("Append with a key");
        let rendered = client
            .render(render_req(&session, Target::Branch("main".into())))
            .await
            .expect("Render with a key")
            .into_inner();
        assert_eq!(
            transcript(&rendered.messages),
            vec!["user: hi", "assistant: hello"]
        );
    }
}

#[tokio::test]
async fn without_keys_no_header_is_needed() {
    let (_dir, server) = serve_fresh(Options::default()).await;
    let channel = plaintext(server.addr).await;
    // Not even a wrong one is refused: without keys there is nothing to check.
    for h in [header(None), bearer(WRONG_KEY)] {
        store_client(channel.clone(), h)
            .create_session(pb::CreateSessionRequest::default())
            .await
            .expect("CreateSession on an open server");
    }
    reflect(channel, header(None))
        .await
        .expect("reflection on an open server");
}

// ---------------------------------------------------------------- TLS in-process

#[tokio::test]
async fn tls_serves_clients_that_trust_its_ca_and_only_them() {
    let files = Files::new();
    let (_dir, server) = serve_fresh(Options {
        tls: Some(files.server_tls(false)),
        ..Options::default()
    })
    .await;

    let trusted = tls_channel(server.addr, files.client_tls("ca.pem", None)).await;
    create_session(trusted, "")
        .await
        .expect("a client trusting the CA");

    let distrusting = tls_channel(server.addr, files.client_tls("other-ca.pem", None)).await;
    let refused = create_session(distrusting, "").await;
    assert_refused(refused, "UnknownIssuer");

    let plain = Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .map_err(|e| chain(&e));
    let refused = create_session(plain, "").await;
    // The server reads no HTTP/2 preface as a TLS hello and hangs up.
    assert!(refused.is_err(), "plaintext to a TLS port: {refused:?}");
}

#[tokio::test]
async fn mutual_tls_needs_a_client_certificate_from_the_ca() {
    let files = Files::new();
    let (_dir, server) = serve_fresh(Options {
        tls: Some(files.server_tls(true)),
        ..Options::default()
    })
    .await;

    let anonymous = tls_channel(server.addr, files.client_tls("ca.pem", None)).await;
    let refused = create_session(anonymous, "").await;
    assert_refused(refused, "CertificateRequired");

    let stranger = tls_channel(server.addr, files.client_tls("ca.pem", Some("stranger"))).await;
    let refused = create_session(stranger, "").await;
    assert_refused(refused, "UnknownCA");

    let client = tls_channel(server.addr, files.client_tls("ca.pem", Some("client"))).await;
    create_session(client, "")
        .await
        .expect("a client certificate from the CA");
}

#[test]
fn bad_tls_files_are_named() {
    let files = Files::new();
    let missing = files.path("absent.pem");
    let garbage = files.write("garbage.pem", "not a certificate\n");
    let server = |cert: &Path, key: &Path, ca: Option<&Path>| {
        ctxd::tls::server(cert, key, ca)
            .map(|_| ())
            .expect_err("refused")
            .to_string()
    };
    let (cert, key) = (files.path("server.pem"), files.path("server.key"));

    let e = server(&missing, &key, None);
    assert!(e.contains("cannot read") && e.contains("absent.pem"), "{e}");
    let e = server(&garbage, &key, None);
    assert!(
        e.contains("garbage.pem") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = server(&cert, &garbage, None);
    assert!(
        e.contains("garbage.pem") && e.contains("no PEM private key"),
        "{e}"
    );
    // Both halves are PEM, but of different pairs.
    let e = server(&cert, &files.path("client.key"), None);
    assert!(e.contains("client.key") && e.contains("server.pem"), "{e}");
    let e = server(&cert, &key, Some(&garbage));
    assert!(e.contains("garbage.pem"), "{e}");
    // A key is no CA.
    let e = server(&cert, &key, Some(&key));
    assert!(e.contains("server.key"), "{e}");
}

// ---------------------------------------------------------------- the binary

/// `ctxd serve ARGS` must refuse to start: non-zero exit, nothing on stdout, one line on
/// stderr, which it returns.
async fn refused(files: &Files, listen: &str, args: &[String]) -> String {
    let serve = Serve::new(&files.path("ctxd.db")).listen(listen).args(args);
    let output = run_to_exit(serve.command()).await;
    let stderr = output.stderr;
    assert!(!output.status.success(), "{args:?} started: {stderr}");
    assert_eq!(output.stdout, "", "{args:?} printed an address");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("ctxd: "), "{stderr}");
    assert!(
        !files.path("ctxd.db").exists(),
        "refused before opening the database"
    );
    stderr
}

#[tokio::test]
async fn the_binary_refuses_bad_keys_files_and_open_public_listeners() {
    let files = Files::new();
    let p = |name: &str| files.path(name).to_string_lossy().into_owned();
    let keys_file = |name: &str| vec!["--api-keys-file".to_owned(), p(name)];
    let tls = |cert: &str, key: &str| {
        vec![
            "--tls-cert".to_owned(),
            p(cert),
            "--tls-key".to_owned(),
            p(key),
        ]
    };

    files.write(
        "bad.txt",
        &format!("# keys\nacme {ACME_KEY}\n\nglobex {GLOBEX_KEY} {WRONG_KEY}\n"),
    );
    files.write("dup.txt", &format!("acme {ACME_KEY}\nglobex {ACME_KEY}\n"));
    files.write("empty.txt", "# nobody yet\n");
    for (file, says) in [
        (
            "bad.txt",
            "line 4: after the key, only `admin` and `retain=DAYS`",
        ),
        ("dup.txt", "line 2: the same key as line 1"),
        ("empty.txt", "holds no keys"),
        ("absent.txt", "cannot read"),
    ] {
        let e = refused(&files, "127.0.0.1:0", &keys_file(file)).await;
        assert!(e.contains(&p(file)) && e.contains(says), "{says:?} in {e}");
        for key in [ACME_KEY, GLOBEX_KEY, WRONG_KEY] {
            assert!(!e.contains(key), "a key echoed: {e}");
        }
    }

    let e = refused(&files, "0.0.0.0:0", &[]).await;
    assert!(
        e.contains("0.0.0.0:0") && e.contains("--insecure-no-auth"),
        "{e}"
    );
    let e = refused(&files, "0.0.0.0:0", &tls("server.pem", "server.key")).await;
    assert!(
        e.contains("--insecure-no-auth"),
        "TLS alone is no authentication: {e}"
    );

    let e = refused(&files, "127.0.0.1:0", &tls("server.pem", "absent.key")).await;
    assert!(e.contains(&p("absent.key")), "{e}");
    let e = refused(&files, "127.0.0.1:0", &tls("server.pem", "client.key")).await;
    assert!(e.contains("client.key") && e.contains("server.pem"), "{e}");
}

#[tokio::test]
async fn the_binary_serves_a_public_address_with_keys_or_insecure_no_auth() {
    let files = Files::new();

    let db = files.path("ctxd.db");
    let daemon = Serve::new(&db)
        .listen("0.0.0.0:0")
        .args(["--insecure-no-auth"])
        .start()
        .await;
    assert!(daemon.addr.ip().is_unspecified(), "{}", daemon.addr);
    create_session(Ok(plaintext(daemon.local()).await), "")
        .await
        .expect("an open server needs no key");
    let log = daemon.stop().await;
    assert!(
        log.contains("without API keys"),
        "the operator is warned: {log}"
    );

    let keys = files.path("keys.txt");
    let daemon = Serve::new(&db)
        .listen("0.0.0.0:0")
        .args([
            "--api-keys-file",
            keys.to_str().expect("UTF-8 path"),
            "--log",
            "debug",
        ])
        .start()
        .await;
    let channel = plaintext(daemon.local()).await;
    let refused = create_session(Ok(channel.clone()), WRONG_KEY).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.starts_with("Unauthenticated")),
        "{refused:?}"
    );
    create_session(Ok(channel.clone()), ACME_KEY)
        .await
        .expect("a valid key");
    assert_health_serving(channel).await;
    let log = daemon.stop().await;
    for key in [ACME_KEY, GLOBEX_KEY, WRONG_KEY] {
        assert!(!log.contains(key), "a key in the log: {log}");
    }
}

/// `ctxd serve` with keys and mutual TLS, and the `ctxd` client commands against it.
#[tokio::test]
async fn the_binary_and_its_client_speak_mutual_tls_with_keys() {
    let files = Files::new();
    let p = |name: &str| files.path(name).to_string_lossy().into_owned();
    let daemon = Daemon::start(
        &files.path("ctxd.db"),
        &[
            "--api-keys-file",
            &p("keys.txt"),
            "--tls-cert",
            &p("server.pem"),
            "--tls-key",
            &p("server.key"),
            "--tls-client-ca",
            &p("ca.pem"),
        ],
    )
    .await;
    let https = format!("https://{}", daemon.addr);
    let client = |url: &str, args: &[&str], key: Option<&str>| {
        let mut command = ctxd();
        command.args(args).args(["--server", url]);
        if let Some(key) = key {
            command.env("CTXD_API_KEY", key);
        }
        run_to_exit(command)
    };
    let identity = [
        "--tls-ca",
        &p("ca.pem"),
        "--tls-cert",
        &p("client.pem"),
        "--tls-key",
        &p("client.key"),
    ];
    let sessions = [&["sessions", "--json"][..], &identity[..]].concat();

    let ok = client(&https, &sessions, Some(ACME_KEY)).await;
    assert!(ok.status.success(), "{}", ok.stderr);
    let listed: serde_json::Value = serde_json::from_str(&ok.stdout).expect("JSON");
    assert!(
        listed["sessions"].as_array().is_some_and(Vec::is_empty),
        "{listed}"
    );

    let no_key = client(&https, &sessions, None).await;
    let stderr = &no_key.stderr;
    assert!(!no_key.status.success());
    assert!(
        stderr.contains("UNAUTHENTICATED") && stderr.contains("missing API key"),
        "{stderr}"
    );

    let no_cert = client(
        &https,
        &["sessions", "--tls-ca", &p("ca.pem")],
        Some(ACME_KEY),
    )
    .await;
    assert!(
        !no_cert.status.success(),
        "no client certificate: {}",
        no_cert.stdout
    );

    let http = format!("http://{}", daemon.addr);
    let plain = client(&http, &["sessions"], Some(ACME_KEY)).await;
    assert!(!plain.status.success(), "plaintext to a TLS port");

    // In-process, the same server: the key and the certificate are both needed.
    let channel = tls_channel(daemon.addr, files.client_tls("ca.pem", Some("client"))).await;
    let session = create_session(channel.clone(), GLOBEX_KEY)
        .await
        .expect("key and certificate");
    assert!(!session.is_empty());
    daemon.stop().await;
}

// ---------------------------------------------------------------- the inspector over HTTPS

impl Files {
    /// An HTTPS client trusting `ca`, presenting `identity` (`NAME.pem` and `NAME.key`).
    fn https_client(&self, ca: &str, identity: Option<&str>) -> reqwest::Client {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |name: &str| {
            CertificateDer::pem_file_iter(self.path(name))
                .expect("a PEM file")
                .collect::<Result<Vec<_>, _>>()
                .expect("certificates")
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs(ca) {
            roots.add(cert).expect("a CA certificate");
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let config = match identity {
            Some(name) => {
                let key =
                    PrivateKeyDer::from_pem_file(self.path(&format!("{name}.key"))).expect("a key");
                builder
                    .with_client_auth_cert(certs(&format!("{name}.pem")), key)
                    .expect("a client identity")
            }
            None => builder.with_no_client_auth(),
        };
        reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .build()
            .expect("an HTTPS client")
    }
}

/// `GET /api/sessions` on the inspector: the status, or why the connection failed.
async fn list_over(client: &reqwest::Client, url: String, key: &str) -> Result<u16, String> {
    client
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| chain(&e))
}

/// `serve --http` with `--tls-cert`: the inspector answers HTTPS only, with the gRPC port's
/// certificate, and its calls are counted in the RPC metrics (`via="http"`).
#[tokio::test]
async fn the_inspector_serves_https_with_the_grpc_certificate_and_is_metered() {
    let files = Files::new();
    let db = files.path("ctxd.db");
    let keys = files.path("keys.txt");
    let (cert, key) = (files.path("server.pem"), files.path("server.key"));
    let daemon = Serve::new(&db)
        .args(["--http", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--api-keys-file".as_ref(), keys.as_os_str()])
        .args(["--tls-cert".as_ref(), cert.as_os_str()])
        .args(["--tls-key".as_ref(), key.as_os_str()])
        .start()
        .await;
    let web = daemon.http.expect("an inspector address");

    let https = files.https_client("ca.pem", None);
    let url = format!("https://127.0.0.1:{}/api/sessions", web.port());
    assert_eq!(list_over(&https, url.clone(), ACME_KEY).await, Ok(200));
    assert_eq!(list_over(&https, url.clone(), WRONG_KEY).await, Ok(401));
    let page = https
        .get(format!("https://127.0.0.1:{}/", web.port()))
        .send()
        .await
        .expect("the page over HTTPS");
    assert_eq!(page.status().as_u16(), 200);

    let distrusting = files.https_client("other-ca.pem", None);
    let refused = list_over(&distrusting, url, ACME_KEY).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("UnknownIssuer")),
        "{refused:?}"
    );
    let plain = list_over(
        &reqwest::Client::new(),
        format!("http://127.0.0.1:{}/api/sessions", web.port()),
        ACME_KEY,
    )
    .await;
    assert!(plain.is_err(), "plain HTTP to the HTTPS port: {plain:?}");

    let scrape = daemon.scrape().await;
    for line in [
        r#"ctxd_rpc_requests_total{method="ctxd.v1.ContextStore/ListSessions",code="OK",via="http"} 1"#,
        r#"ctxd_rpc_requests_total{method="ctxd.v1.ContextStore/ListSessions",code="UNAUTHENTICATED",via="http"} 1"#,
    ] {
        assert!(scrape.contains(line), "{line} in\n{scrape}");
    }
    daemon.stop().await;
}

#[tokio::test]
async fn the_inspector_asks_for_client_certificates_when_grpc_does() {
    let files = Files::new();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let web = http.local_addr().expect("addr");
    let ca = files.path("ca.pem");
    let http_tls = ctxd::tls::http_server(
        &files.path("server.pem"),
        &files.path("server.key"),
        Some(ca.as_path()),
    )
    .expect("the TLS files");
    let (_dir, _server) = serve_fresh(Options {
        api_keys: Some(files.keys()),
        http: Some(http),
        http_tls: Some(http_tls),
        ..Options::default()
    })
    .await;
    let url = format!("https://127.0.0.1:{}/api/sessions", web.port());

    let anonymous = list_over(&files.https_client("ca.pem", None), url.clone(), ACME_KEY).await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let stranger = files.https_client("ca.pem", Some("stranger"));
    let refused = list_over(&stranger, url.clone(), ACME_KEY).await;
    assert!(refused.is_err(), "a stranger's certificate: {refused:?}");
    let client = files.https_client("ca.pem", Some("client"));
    assert_eq!(list_over(&client, url, ACME_KEY).await, Ok(200));
}
